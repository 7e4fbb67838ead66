//! How a rank joins its [`ProcessGroup`]: it connects to every lower rank and accepts
//! every higher one, each connection opened by a hello that the accepting rank checks
//! (job key, world size, rank, staging size) and answers with a welcome or a reject.

use super::wire::*;
use super::{ProcessGroup, after_ms};
use crate::error::{Error, Result};
use crate::ipc;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Connects to the abstract socket `name` without ever blocking: a non-blocking
/// `connect` fails (`EAGAIN`) instead of sleeping when the listener's backlog is full (a
/// stopped listener, or a squatter that never accepts), so the caller's retry loop keeps
/// its deadline. The stream is returned in blocking mode, as `connect` would give it.
fn connect_without_blocking(name: &str) -> std::io::Result<UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())?;
    rustix::net::connect(&fd, &addr)?;
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

impl ProcessGroup {
    /// Joins the job `key` (any string the ranks share, e.g. the launcher's
    /// `MASTER_ADDR:MASTER_PORT`) as `rank` of `world`, on this machine, waiting at most
    /// `timeout` for every other rank. Each rank must use a distinct rank and the same
    /// world size and key.
    ///
    /// Errors: [`Error::InvalidArgument`] for a rank out of range; [`Error::Rendezvous`]
    /// for a rank another process of the job already holds, a different world size,
    /// garbage on the socket; [`Error::PeerFailed`] for a rank that closed its
    /// connection; [`Error::PeerTimeout`] naming the ranks that never came.
    pub fn connect(rank: usize, world: usize, key: &str, timeout: Duration) -> Result<Self> {
        Self::connect_staging(rank, world, key, timeout, 0)
    }

    /// [`connect`](Self::connect), also agreeing on the staging size (every rank of a
    /// job must use the same, or the chunks of a call would differ).
    pub(crate) fn connect_staging(
        rank: usize,
        world: usize,
        key: &str,
        timeout: Duration,
        staging: u64,
    ) -> Result<Self> {
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range for a job of {world} rank(s)"
            )));
        }
        crate::collective::support::check_process_world(world)?;
        let started = Instant::now();
        let deadline = crate::collective::support::deadline_after(timeout);
        let mut g = ProcessGroup {
            rank,
            world,
            peers: (0..world).map(|_| None).collect(),
            timeout,
            seq: 0,
            owed: vec![std::collections::VecDeque::new(); world],
            readers: vec![false; world],
            broken: None,
            gone: vec![false; world],
        };
        if world == 1 {
            return Ok(g);
        }
        let name = socket_name(key, rank);
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| ipc::io_error("abstract socket name", &e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                Error::Rendezvous {
                    reason: format!(
                        "rank {rank} of job {key:?} is already taken by another process on this machine (two processes were given the same rank, or an earlier job with this key still runs)"
                    ),
                }
            } else {
                ipc::io_error("binding the control socket", &e)
            }
        })?;
        let out = g.connect_all(&listener, key, staging, started, deadline);
        if let Err(e) = out {
            g.fail(e.clone());
            return Err(e);
        }
        Ok(g)
    }

    /// Connects to every lower rank and accepts every higher one, checking each hello.
    fn connect_all(
        &mut self,
        listener: &UnixListener,
        key: &str,
        staging: u64,
        started: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        let hello = {
            let mut b = (world as u32).to_le_bytes().to_vec();
            b.extend_from_slice(&(rank as u32).to_le_bytes());
            b.extend_from_slice(&key_hash(key).to_le_bytes());
            b.extend_from_slice(&staging.to_le_bytes());
            encode(HELLO, &b)
        };
        for q in 0..rank {
            self.connect_lower(q, key, &hello, started, deadline)?;
        }
        self.accept_higher(listener, key, staging, started, deadline)
    }

    /// Connects to lower rank `q` (it may not listen yet: retry until the deadline),
    /// sends `hello` and waits for its welcome.
    fn connect_lower(
        &mut self,
        q: usize,
        key: &str,
        hello: &[u8],
        started: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let name = socket_name(key, q);
        let stream = loop {
            match connect_without_blocking(&name) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => {
                    return Err(Error::PeerTimeout {
                        what: format!("rank {q} of job {key:?} to listen on its control socket"),
                        ranks: vec![q],
                        after_ms: after_ms(started),
                    });
                }
            }
        };
        let opts = self.transport(deadline);
        ipc::send_message_with(&stream, hello, &[], &opts)
            .map_err(|e| self.wire_error(q, e, started, "its welcome"))?;
        let m = ipc::recv_message_with(&stream, &opts)
            .map_err(|e| self.wire_error(q, e, started, "its welcome"))?;
        match decode(q, &m.bytes)? {
            Msg::Welcome => {}
            Msg::Reject(e) | Msg::Abort(e) => return Err(e),
            other => return Err(garbage(format_args!("{other:?} instead of a welcome"))),
        }
        self.peers[q] = Some(stream);
        Ok(())
    }

    /// Accepts every higher rank, checks each hello, and welcomes it (or rejects it,
    /// telling it why).
    fn accept_higher(
        &mut self,
        listener: &UnixListener,
        key: &str,
        staging: u64,
        started: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let (rank, world) = (self.rank, self.world);
        listener
            .set_nonblocking(true)
            .map_err(|e| ipc::io_error("control socket", &e))?;
        while let Some(missing) = {
            let m: Vec<usize> = (rank + 1..world)
                .filter(|&q| self.peers[q].is_none())
                .collect();
            (!m.is_empty()).then_some(m)
        } {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // A rank connected already that died is seen now, not at the
                    // deadline.
                    if let Some(q) = (0..world).find(|&q| self.peer_closed(q)) {
                        let closed = Error::PeerFailed {
                            rank: q,
                            reason: "its process exited or was killed while the ranks connected"
                                .into(),
                        };
                        return Err(self.closed_peer_error(q, closed));
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::PeerTimeout {
                            what: format!(
                                "the other ranks of job {key:?} to connect to rank {rank}"
                            ),
                            ranks: missing,
                            after_ms: after_ms(started),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => return Err(ipc::io_error("accepting a control connection", &e)),
            };
            stream
                .set_nonblocking(false)
                .map_err(|e| ipc::io_error("control socket", &e))?;
            let opts = self.transport(deadline);
            let m = match ipc::recv_message_with(&stream, &opts) {
                Ok(m) => m,
                // A process of another user (the abstract namespace is open to every
                // process of the network namespace): not a rank; ignored.
                Err(e @ Error::PeerNotAllowed { .. }) => {
                    log::warn!("gpubind: rank {rank} of job {key:?} ignored a connection: {e}");
                    continue;
                }
                Err(Error::CorruptHandle { reason }) => return Err(garbage(reason)),
                Err(e) => return Err(e),
            };
            let q = self.check_hello(&m.bytes, key, staging).inspect_err(|e| {
                let _ = ipc::send_message_with(
                    &stream,
                    &encode_error(REJECT, rank, e),
                    &[],
                    &self.transport(deadline),
                );
            })?;
            ipc::send_message_with(&stream, &encode(WELCOME, &[]), &[], &opts)
                .map_err(|e| self.wire_error(q, e, started, "it to take the welcome"))?;
            self.peers[q] = Some(stream);
        }
        Ok(())
    }

    /// The rank of a higher rank's hello, or why it is rejected.
    fn check_hello(&self, bytes: &[u8], key: &str, staging: u64) -> Result<usize> {
        let (rank, world) = (self.rank, self.world);
        let (w, q, k, s) = match decode(usize::MAX, bytes)? {
            Msg::Hello {
                world: w,
                rank: q,
                key: k,
                staging: s,
            } => (w, q as usize, k, s),
            other => return Err(garbage(format_args!("{other:?} instead of a hello"))),
        };
        let refuse = |reason: String| Err(Error::Rendezvous { reason });
        if k != key_hash(key) {
            return refuse(format!(
                "a process of another job (key hash {k:016x}) reached rank {rank} of job {key:?}"
            ));
        }
        if w as usize != world {
            return refuse(format!(
                "rank {q} was started with a world size of {w}, rank {rank} with {world}"
            ));
        }
        if q <= rank || q >= world {
            return refuse(format!(
                "a process claiming rank {q} connected to rank {rank} (only ranks {}..{world} do)",
                rank + 1
            ));
        }
        if self.peers[q].is_some() {
            return refuse(format!("two processes claim rank {q}"));
        }
        if s != staging {
            return refuse(format!(
                "rank {q} uses a staging buffer of {s} bytes, rank {rank} of {staging}: every rank must use the same"
            ));
        }
        Ok(q)
    }
}
