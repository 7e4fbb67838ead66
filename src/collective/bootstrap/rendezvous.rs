//! The TCP rendezvous that hands rank 0's id to every other rank
//! ([`LaunchEnv::exchange_id`]): rank 0 serves, the others join; every wait bounded, every
//! failure a typed error on every rank that reached rank 0.

use super::launch_env::{CHECK_VAR, LaunchEnv, PORT_VAR};
use super::unique_id::{NCCL_UNIQUE_ID_BYTES, NcclUniqueId};
use super::wire::{
    Frame, Kind, ReadFail, decode_error, encode_error, peek_state, read_frame, write_frame,
};
use crate::error::{Error, Result};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

impl LaunchEnv {
    /// Gets the job's NCCL unique id: rank 0 makes it ([`NcclUniqueId::new`]) and serves
    /// it over TCP on `port`; every other rank connects to `master_addr:port` and
    /// receives it. See [`exchange_id_with`](Self::exchange_id_with).
    pub fn exchange_id(&self) -> Result<NcclUniqueId> {
        self.exchange_id_with(NcclUniqueId::new)
    }

    /// [`exchange_id`](Self::exchange_id) with rank 0's id made by `make_id` (called on
    /// rank 0 only, once every rank has checked in): any 128 bytes, for tests or for an
    /// id made elsewhere.
    ///
    /// Returns once every rank has the id and acknowledged it, so no rank starts NCCL
    /// with a wrong world. Every wait is bounded by `timeout` (peers wait a quarter
    /// longer, at least 2 s, for rank 0's verdict). Errors, the same on every rank that reached rank 0:
    /// [`Error::Rendezvous`] (garbage, wrong version, duplicate rank, different world
    /// sizes, a port in use), [`Error::PeerFailed`] (a rank closed its connection
    /// part-way), [`Error::PeerTimeout`] naming the ranks that never came. A rank that
    /// never reached rank 0 gets [`Error::PeerTimeout`] naming rank 0. A world of one
    /// rank opens no socket.
    pub fn exchange_id_with(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
    ) -> Result<NcclUniqueId> {
        self.exchange(make_id, 0).map(|(id, _)| id)
    }

    /// [`exchange_id_with`](Self::exchange_id_with), keeping the rendezvous connections
    /// as the job's [`CallCheck`](crate::collective::CallCheck), through which the ranks agree on
    /// every collective before NCCL enqueues it (`None` for a world of one, which has
    /// nobody to disagree with). Every rank of the job must call this one (rank 0
    /// refuses a mix with a `Rendezvous` error naming [`CHECK_VAR`]).
    /// [`RankComm::from_launch`](crate::collective::RankComm::from_launch) uses it when
    /// [`check_calls`](Self::check_calls) is on.
    pub fn exchange_id_checked_with(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
    ) -> Result<(NcclUniqueId, Option<crate::collective::CallCheck>)> {
        let (id, links) = self.exchange(make_id, HELLO_CHECKS_CALLS)?;
        let check = match links {
            Links::None => None,
            Links::Rank0(streams) => {
                Some(crate::collective::CallCheck::rank0(streams, self.timeout))
            }
            Links::Peer(stream) => Some(crate::collective::CallCheck::peer(
                stream,
                self.rank,
                self.world_size,
                self.timeout,
            )),
        };
        Ok((id, check))
    }

    fn exchange(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
        flags: u8,
    ) -> Result<(NcclUniqueId, Links)> {
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is out of range for a world of {}",
                self.rank, self.world_size
            )));
        }
        let deadline = crate::collective::support::deadline_after(self.timeout);
        if self.world_size == 1 {
            return Ok((make_id()?, Links::None));
        }
        crate::collective::support::check_process_world(self.world_size)?;
        if self.rank == 0 {
            let (id, streams) = serve(self, deadline, make_id, flags)?;
            Ok((id, Links::Rank0(streams)))
        } else {
            let (id, stream) = join(self, deadline, flags)?;
            Ok((id, Links::Peer(stream)))
        }
    }
}

/// The connections a rendezvous leaves: none (a world of one), rank 0's one per rank
/// (`None` at its own index), or a rank's one to rank 0.
enum Links {
    None,
    Rank0(Vec<Option<TcpStream>>),
    Peer(TcpStream),
}

/// Hello flag: the rank keeps the connection for the per-collective agreement.
const HELLO_CHECKS_CALLS: u8 = 1;

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

// ---------------------------------------------------------------------------------------
// Rank 0

/// One connection that checked in (or tried to).
struct Peer {
    stream: TcpStream,
    addr: SocketAddr,
}

/// The listening address for rank 0: the wildcard of `MASTER_ADDR`'s family, or the
/// loopback address itself when `MASTER_ADDR` is one (a one-machine job is not exposed).
fn listen_addr(env: &LaunchEnv) -> SocketAddr {
    let resolved = (env.master_addr.as_str(), env.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next());
    match resolved {
        Some(a) if a.ip().is_loopback() => a,
        Some(SocketAddr::V6(_)) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), env.port),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), env.port),
    }
}

/// An I/O error of the rendezvous, naming what failed.
fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e: std::io::Error| Error::Io {
        what,
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// Rank 0's listener, non-blocking (the check-in polls it against the deadline).
fn listen(env: &LaunchEnv) -> Result<TcpListener> {
    let addr = listen_addr(env);
    let listener = TcpListener::bind(addr).map_err(|e| Error::Rendezvous {
        reason: format!(
            "rank 0 cannot listen on {addr}: {e}{}",
            if e.kind() == ErrorKind::AddrInUse {
                format!(
                    " (is another job, or torchrun's store on MASTER_PORT, using port {}? set {PORT_VAR} to a free port, the same on every rank)",
                    env.port
                )
            } else {
                String::new()
            }
        ),
    })?;
    listener
        .set_nonblocking(true)
        .map_err(io("setting the rendezvous listener non-blocking"))?;
    Ok(listener)
}

/// What rank 0 holds while the ranks check in.
struct CheckIn {
    world: usize,
    /// The hello flags every rank must send (rank 0's).
    flags: u8,
    started: Instant,
    deadline: Instant,
    /// One connection per rank that checked in (`None` at 0 and for those missing).
    peers: Vec<Option<Peer>>,
    /// Connections that broke a rule: they are told why, then dropped.
    offenders: Vec<TcpStream>,
}

impl CheckIn {
    /// Accepts connections until every rank has sent a valid hello.
    fn wait_for_all(&mut self, listener: &TcpListener, port: u16) -> Result<()> {
        loop {
            let missing: Vec<usize> = (1..self.world)
                .filter(|&r| self.peers[r].is_none())
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            // A rank that checked in and then died is seen now, not at the deadline.
            if let Some(r) = (1..self.world).find(|&r| {
                self.peers[r]
                    .as_ref()
                    .is_some_and(|p| peek_state(&p.stream) == Some(true))
            }) {
                return Err(Error::PeerFailed {
                    rank: r,
                    reason: "it closed its connection while the other ranks checked in (it exited or crashed)".into(),
                });
            }
            if Instant::now() >= self.deadline {
                return Err(Error::PeerTimeout {
                    what: format!("every rank to check in at rank 0 (port {port})"),
                    ranks: missing,
                    after_ms: ms(self.started.elapsed()),
                });
            }
            let Some((stream, from)) = self.accept(listener)? else {
                continue;
            };
            self.take_hello(stream, from)?;
        }
    }

    /// One new connection, or `None` when none is waiting yet.
    fn accept(&self, listener: &TcpListener) -> Result<Option<(TcpStream, SocketAddr)>> {
        let (stream, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                std::thread::sleep(Duration::from_millis(10));
                return Ok(None);
            }
            // EMFILE: rank 0 holds one connection per rank until the end.
            Err(e) if e.raw_os_error() == Some(24) => {
                return Err(Error::Rendezvous {
                    reason: format!(
                        "rank 0 ran out of file descriptors ({e}) holding one connection per rank for a world of {}: raise its limit (ulimit -n) above the world size",
                        self.world
                    ),
                });
            }
            Err(e) => return Err(io("accepting a rendezvous connection")(e)),
        };
        stream
            .set_nonblocking(false)
            .map_err(io("setting a rendezvous connection blocking"))?;
        let _ = stream.set_nodelay(true);
        Ok(Some((stream, from)))
    }

    /// Reads the hello of a new connection and records its rank; a silent or broken
    /// connection is ignored, one that breaks a rule is an error.
    fn take_hello(&mut self, mut stream: TcpStream, from: SocketAddr) -> Result<()> {
        // A silent connection may hold the loop up for a while, not until the end.
        let hello_by = self.deadline.min(Instant::now() + Duration::from_secs(10));
        let hello = match read_frame(&mut stream, hello_by) {
            Ok(f) => f,
            Err(ReadFail::Garbage(why)) => {
                self.offenders.push(stream);
                return Err(Error::Rendezvous {
                    reason: format!(
                        "a connection from {from} sent bytes that are not a gpubind rendezvous hello: {why}"
                    ),
                });
            }
            Err(ReadFail::Closed { got: 0 }) | Err(ReadFail::TimedOut) => {
                log::warn!("gpubind rendezvous: a connection from {from} sent nothing; ignored");
                return Ok(());
            }
            Err(ReadFail::Closed { got }) => {
                return Err(Error::Rendezvous {
                    reason: format!(
                        "a connection from {from} closed after {got} bytes of its hello (a rank that exited or crashed while checking in)"
                    ),
                });
            }
            Err(ReadFail::Io(e)) => {
                log::warn!("gpubind rendezvous: reading a hello from {from}: {e}; ignored");
                return Ok(());
            }
        };
        if let Some(reason) = self.rejection(&hello, from) {
            self.offenders.push(stream);
            return Err(Error::Rendezvous { reason });
        }
        self.peers[hello.rank as usize] = Some(Peer { stream, addr: from });
        Ok(())
    }

    /// Why `hello` (from `from`) is refused, if it is.
    fn rejection(&self, hello: &Frame, from: SocketAddr) -> Option<String> {
        let (r, w, world, flags) = (
            hello.rank as usize,
            hello.world as usize,
            self.world,
            self.flags,
        );
        if hello.kind != Kind::Hello {
            Some(format!(
                "a connection from {from} sent a {:?} frame where a hello was due",
                hello.kind
            ))
        } else if w != world {
            Some(format!(
                "rank {r} (at {from}) was launched with a world size of {w}, rank 0 with {world}: all ranks must come from one launch"
            ))
        } else if r == 0 || r >= world {
            Some(format!(
                "a process at {from} claims rank {r}, which is not in 1..{world} (rank 0 is this process)"
            ))
        } else if hello.payload.first().copied().unwrap_or(0) != flags {
            let on = |f: u8| {
                if f & HELLO_CHECKS_CALLS != 0 {
                    "on"
                } else {
                    "off"
                }
            };
            Some(format!(
                "rank {r} (at {from}) has the agreement on every collective {}, rank 0 has it {} ({CHECK_VAR}, or RankComm::from_launch on one rank and exchange_id on another): set it alike on every rank",
                on(hello.payload.first().copied().unwrap_or(0)),
                on(flags)
            ))
        } else {
            self.peers[r].as_ref().map(|first| {
                format!(
                    "rank {r} checked in twice (from {} and from {from}): two processes have the same rank",
                    first.addr
                )
            })
        }
    }

    /// Sends every rank a frame of `kind` with `payload`; `what` names it in the error.
    fn send_all(&mut self, kind: Kind, payload: &[u8], what: &str) -> Result<()> {
        let w = self.world as u32;
        for (r, p) in self.peers.iter_mut().enumerate() {
            if let Some(p) = p {
                let f = Frame {
                    kind,
                    world: w,
                    rank: r as u32,
                    payload: payload.to_vec(),
                };
                write_frame(&mut p.stream, &f, self.deadline).map_err(|e| Error::PeerFailed {
                    rank: r,
                    reason: format!("sending it {what} failed: {e} (it exited or crashed)"),
                })?;
            }
        }
        Ok(())
    }

    /// Waits for every rank's acknowledgement of the id, taking them in the order they
    /// come: a rank that dies is seen at once, whoever else is slow.
    fn collect_acks(&mut self) -> Result<()> {
        let mut pending: Vec<usize> = (1..self.world)
            .filter(|&r| self.peers[r].is_some())
            .collect();
        while !pending.is_empty() {
            let ready = pending.iter().position(|&r| {
                self.peers[r]
                    .as_ref()
                    .is_some_and(|p| peek_state(&p.stream).is_some())
            });
            let Some(i) = ready else {
                if Instant::now() >= self.deadline {
                    return Err(Error::PeerTimeout {
                        what: "the ranks to acknowledge the id".into(),
                        ranks: pending,
                        after_ms: ms(self.started.elapsed()),
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            let r = pending.remove(i);
            self.take_ack(r)?;
        }
        Ok(())
    }

    /// Reads rank `r`'s acknowledgement of the id (bytes or a hang-up wait on its
    /// connection).
    fn take_ack(&mut self, r: usize) -> Result<()> {
        let Some(p) = self.peers[r].as_mut() else {
            return Ok(());
        };
        match read_frame(&mut p.stream, self.deadline) {
            Ok(f) if f.kind == Kind::Ack && f.rank as usize == r => {}
            Ok(f) => {
                return Err(Error::Rendezvous {
                    reason: format!(
                        "rank {r} answered the id with a {:?} frame for rank {}, not its ack",
                        f.kind, f.rank
                    ),
                });
            }
            Err(ReadFail::Closed { .. }) => {
                return Err(Error::PeerFailed {
                    rank: r,
                    reason: "it closed its connection before acknowledging the id (it exited or crashed)".into(),
                });
            }
            Err(ReadFail::TimedOut) => {
                return Err(Error::PeerTimeout {
                    what: "the ranks to acknowledge the id".into(),
                    ranks: vec![r],
                    after_ms: ms(self.started.elapsed()),
                });
            }
            Err(ReadFail::Garbage(why)) => {
                return Err(Error::Rendezvous {
                    reason: format!("rank {r} answered the id with garbage: {why}"),
                });
            }
            Err(ReadFail::Io(e)) => {
                return Err(Error::PeerFailed {
                    rank: r,
                    reason: format!("reading its ack failed: {e}"),
                });
            }
        }
        Ok(())
    }

    /// Tells everyone connected that the rendezvous failed with `e` (best effort,
    /// briefly): they return the same error.
    fn tell_abort(&mut self, e: &Error) {
        let payload = encode_error(e);
        let tell_by = Instant::now() + Duration::from_millis(500);
        let world = self.world as u32;
        let streams = self
            .peers
            .iter_mut()
            .enumerate()
            .filter_map(|(r, p)| p.as_mut().map(|p| (r as u32, &mut p.stream)))
            .chain(self.offenders.iter_mut().map(|s| (u32::MAX, s)));
        for (r, s) in streams {
            let f = Frame {
                kind: Kind::Abort,
                world,
                rank: r,
                payload: payload.clone(),
            };
            let _ = write_frame(s, &f, tell_by);
        }
    }
}

/// Rank 0's side: waits for every rank's hello, makes the id, sends it to every rank,
/// waits for their acks, then sends the go-ahead. Any failure is told to every rank
/// connected so far.
fn serve(
    env: &LaunchEnv,
    deadline: Instant,
    make_id: impl FnOnce() -> Result<NcclUniqueId>,
    flags: u8,
) -> Result<(NcclUniqueId, Vec<Option<TcpStream>>)> {
    let listener = listen(env)?;
    let world = env.world_size;
    let mut check_in = CheckIn {
        world,
        flags,
        started: Instant::now(),
        deadline,
        peers: (0..world).map(|_| None).collect(),
        offenders: Vec::new(),
    };
    let outcome = (|| -> Result<NcclUniqueId> {
        check_in.wait_for_all(&listener, env.port)?;
        let id = make_id()?;
        check_in.send_all(Kind::Id, id.as_bytes(), "the id")?;
        check_in.collect_acks()?;
        check_in.send_all(Kind::Go, &[], "the go-ahead")?;
        Ok(id)
    })();
    if let Err(e) = &outcome {
        check_in.tell_abort(e);
    }
    let id = outcome?;
    // The connections stay open for the per-collective agreement (dropped, i.e. closed,
    // by a plain `exchange_id`).
    Ok((
        id,
        check_in
            .peers
            .into_iter()
            .map(|p| p.map(|p| p.stream))
            .collect(),
    ))
}

// ---------------------------------------------------------------------------------------
// Other ranks

/// Connects to rank 0, retrying while it is not listening yet (resolving again each
/// time: rank 0's name may not resolve before its machine is up), until `deadline`.
fn connect(
    env: &LaunchEnv,
    deadline: Instant,
    target: &str,
    never_came: &dyn Fn(String) -> Error,
) -> Result<TcpStream> {
    let mut last_error = String::from("no attempt");
    loop {
        if Instant::now() >= deadline {
            return Err(never_came(format!(
                "rank 0 to accept a connection at {target} (last error: {last_error})"
            )));
        }
        let addrs: Vec<SocketAddr> = match (env.master_addr.as_str(), env.port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last_error = format!("cannot resolve MASTER_ADDR={}: {e}", env.master_addr);
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let mut connected = None;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last_error = format!("{a}: {e}"),
            }
        }
        match connected {
            Some(s) => return Ok(s),
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Another rank's side: checks in at rank 0 with its hello, receives the id, acks it
/// and waits for the go-ahead; an abort from rank 0 is its typed error.
fn join(env: &LaunchEnv, deadline: Instant, flags: u8) -> Result<(NcclUniqueId, TcpStream)> {
    let started = Instant::now();
    let target = format!("{}:{}", env.master_addr, env.port);
    let never_came = |what: String| Error::PeerTimeout {
        what,
        ranks: vec![0],
        after_ms: ms(started.elapsed()),
    };
    let mut stream = connect(env, deadline, &target, &never_came)?;
    let _ = stream.set_nodelay(true);
    let (w, me) = (env.world_size as u32, env.rank as u32);
    let frame = |kind| Frame {
        kind,
        world: w,
        rank: me,
        payload: Vec::new(),
    };
    let lost = |e: std::io::Error| Error::PeerFailed {
        rank: 0,
        reason: format!(
            "the connection to rank 0 at {target} broke: {e} (rank 0 exited or crashed)"
        ),
    };
    let hello = Frame {
        payload: vec![flags],
        ..frame(Kind::Hello)
    };
    write_frame(&mut stream, &hello, deadline).map_err(lost)?;
    // Rank 0 decides at its own deadline, which may be a little after ours (it may have
    // started later): wait a quarter longer, at least 2 s, for its verdict (which names
    // the missing ranks).
    let verdict_by = deadline
        .checked_add((env.timeout / 4).max(Duration::from_secs(2)))
        .unwrap_or(deadline);
    let expect = |stream: &mut TcpStream, want: Kind, stage: &str| -> Result<Frame> {
        let f = read_frame(stream, verdict_by).map_err(|fail| match fail {
            ReadFail::Closed { .. } => Error::PeerFailed {
                rank: 0,
                reason: format!(
                    "rank 0 closed the connection before {stage} (it exited or crashed)"
                ),
            },
            ReadFail::TimedOut => never_came(format!("rank 0 to send {stage}")),
            ReadFail::Garbage(why) => Error::Rendezvous {
                reason: format!(
                    "{target} answered with bytes that are not a gpubind rendezvous frame ({why}): is {PORT_VAR} (default MASTER_PORT + 1) another service's port? all ranks must run the same gpubind"
                ),
            },
            ReadFail::Io(e) => lost(e),
        })?;
        if f.kind == Kind::Abort {
            return Err(decode_error(&f.payload));
        }
        if f.kind != want || f.rank != me || f.world != w {
            return Err(Error::Rendezvous {
                reason: format!(
                    "rank 0 sent a {:?} frame for rank {} of {} where {stage} for rank {me} of {w} was due",
                    f.kind, f.rank, f.world
                ),
            });
        }
        Ok(f)
    };
    let id_frame = expect(&mut stream, Kind::Id, "the id")?;
    let id = NcclUniqueId::from_bytes(&id_frame.payload).map_err(|_| Error::Rendezvous {
        reason: format!(
            "rank 0 sent an id of {} bytes, not {NCCL_UNIQUE_ID_BYTES}",
            id_frame.payload.len()
        ),
    })?;
    write_frame(&mut stream, &frame(Kind::Ack), verdict_by).map_err(lost)?;
    expect(&mut stream, Kind::Go, "the go-ahead")?;
    Ok((id, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Launcher;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn local(rank: usize, world: usize, port: u16, timeout_ms: u64) -> LaunchEnv {
        LaunchEnv {
            launcher: Launcher::Torch,
            rank,
            world_size: world,
            local_rank: rank,
            local_world_size: Some(world),
            master_addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_millis(timeout_ms),
            check_calls: true,
        }
    }

    #[test]
    fn threads_rendezvous_on_loopback() {
        let port = free_port();
        let id = NcclUniqueId::from_bytes(&[42; 128]).unwrap();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| s.spawn(move || local(r, 4, port, 5000).exchange_id_with(|| Ok(id))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            assert_eq!(g.unwrap(), id);
        }
    }

    #[test]
    fn a_world_larger_than_a_process_can_connect_is_refused_before_allocating() {
        // Rank 0 keeps one slot and one connection per rank: a world of u32::MAX ranks
        // (a garbage WORLD_SIZE) would ask for some 150 GiB and abort the process.
        let id = NcclUniqueId::from_bytes(&[7; 128]).unwrap();
        for rank in [0, 1] {
            let e = local(rank, u32::MAX as usize, free_port(), 100)
                .exchange_id_with(|| Ok(id))
                .unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument(m) if m.contains("world size 4294967295")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn world_of_one_opens_no_socket() {
        let id = NcclUniqueId::from_bytes(&[1; 128]).unwrap();
        // Port 1 would need privileges: nothing is bound.
        assert_eq!(local(0, 1, 1, 100).exchange_id_with(|| Ok(id)).unwrap(), id);
    }

    #[test]
    fn missing_rank_times_out_on_every_rank_naming_it() {
        let port = free_port();
        let id = NcclUniqueId::from_bytes(&[3; 128]).unwrap();
        let t0 = Instant::now();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || local(r, 3, port, 800).exchange_id_with(|| Ok(id))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t0.elapsed() < Duration::from_secs(3));
        for g in got {
            match g {
                Err(Error::PeerTimeout { ranks, .. }) => assert_eq!(ranks, vec![2]),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn rank0_failing_to_make_the_id_fails_every_rank() {
        let port = free_port();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    s.spawn(move || local(r, 2, port, 3000).exchange_id_with(|| Err(Error::NoNccl)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got[0], Err(Error::NoNccl));
        assert!(
            matches!(&got[1], Err(Error::Rendezvous { reason }) if reason.contains("NCCL not found")),
            "{:?}",
            got[1]
        );
    }
}
