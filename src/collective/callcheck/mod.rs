//! The ranks of one NCCL job across processes agree on every collective before NCCL
//! enqueues it ([`CallCheck`]): NCCL itself does not check that the ranks called the
//! same op with the same type and length, and ranks that disagree hang in the
//! collective or read and write past each other's data.
//!
//! The channel is the TCP connection of the id rendezvous, kept open
//! ([`LaunchEnv::exchange_id_checked_with`](super::LaunchEnv::exchange_id_checked_with)):
//! a star around rank 0, so it works across machines. Per collective, every rank
//! `r > 0` sends rank 0 a `call` frame (the bootstrap's framing: magic, version,
//! checksum) with its header; rank 0 reads them all, compares each with its own in
//! rank order and answers every rank `agreed`, or `abort` carrying the one error all
//! ranks return: a mismatch (`InvalidArgument("collective mismatch: rank 0 called …,
//! rank r called …")`), a rank that failed or left (`PeerFailed` naming it), ranks that
//! did not call in time (`PeerTimeout` naming them). A rank whose own call is invalid
//! sends `abort` in place of its header, so the others learn it at the same call.
//!
//! Cost: one round trip to rank 0 per collective (rank 0: one read and one write per
//! rank); point-to-point calls (`send`/`recv`) are not checked (rank 0 takes no part in
//! them). Every wait is bounded by the job's timeout; after any error the check is
//! broken and every later call returns that error at once (the ranks are out of step).
//!
//! Ranks whose buffers are one memory shared by IPC (an import on one rank of another
//! rank's export) are refused too: after the header, a call frame carries up to two
//! buffer identities ([`region`]: role u8, allocation key 81 bytes, byte range u64
//! u64), and rank 0 answers `abort` with `InvalidArgument("collective aliasing: …")` when
//! two ranks' ranges of one allocation overlap.
//!
//! Header payload (24 bytes, little-endian): sequence u64, kind u8 (1 all_reduce,
//! 2 reduce, 3 broadcast, 4 all_gather, 5 reduce_scatter, 9.. tests; the same plus
//! [`CAPTURED`] for a collective captured into a CUDA graph; [`GRAPH_LAUNCH`] for a
//! launch of such a graph), op u8 (0 sum, 1 prod, 2 min, 3 max, 4 avg), dtype u8
//! (`CollectiveType::INDEX`), 0 u8, root u32 (a graph launch: how many collectives the
//! graph holds), count u64 (a graph launch: the digest of its captured headers).
//!
//! CUDA graphs (NCCL's rules: whether a collective is captured is a collective property,
//! and every rank must launch the graph of the same collective capture): a captured
//! collective agrees at capture time like an eager one but under its own kinds, so a
//! rank that captures while a peer calls eagerly is a mismatch; each launch of the graph
//! agrees on one header, kind [`GRAPH_LAUNCH`], whose count is an FNV-1a digest of the
//! headers (sequence numbers included) its collectives agreed at capture. The sequence
//! numbers make the digest name the capture, not only its shape: two graphs captured
//one after the other with the same collectives have different digests.

pub(crate) mod region;

use crate::collective::api::call::{Call, Kind};
use crate::collective::bootstrap::{
    Frame, Kind as FrameKind, ReadFail, decode_error, encode_error,
};
use crate::collective::bootstrap::{read_frame, write_frame};
use crate::error::{Error, Result};
use crate::fnv::fnv1a64;
use region::Region;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One rank's description of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    seq: u64,
    kind: u8,
    op: u8,
    dtype: u8,
    root: u32,
    count: u64,
}

/// The length of an encoded header.
pub(crate) const HEADER_BYTES: usize = 24;

/// Added to a collective's kind when it is captured into a CUDA graph.
pub(crate) const CAPTURED: u8 = 16;

/// The kind of a graph launch's header.
pub(crate) const GRAPH_LAUNCH: u8 = 6;

impl Header {
    /// The header of a collective (`None` for send/recv, which are not checked).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    fn of(call: &Call) -> Option<Header> {
        if matches!(call.kind, Kind::Send(_) | Kind::Recv(_)) {
            return None;
        }
        let (kind, op, root) = call.kind.code();
        Some(Header {
            seq: 0,
            kind,
            op,
            dtype: call.dtype.index as u8,
            root: root as u32,
            count: call.count as u64,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_BYTES);
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&[self.kind, self.op, self.dtype, 0]);
        v.extend_from_slice(&self.root.to_le_bytes());
        v.extend_from_slice(&self.count.to_le_bytes());
        v
    }

    fn decode(b: &[u8]) -> Option<Header> {
        if b.len() != HEADER_BYTES {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Header {
            seq: u64_at(0),
            kind: b[8],
            op: b[9],
            dtype: b[10],
            root: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            count: u64_at(16),
        })
    }

    fn same_call(&self, o: &Header) -> bool {
        (self.kind, self.op, self.dtype, self.root, self.count)
            == (o.kind, o.op, o.dtype, o.root, o.count)
    }

    fn describe(&self) -> String {
        let op = ["Sum", "Prod", "Min", "Max", "Avg"]
            .get(usize::from(self.op))
            .copied()
            .unwrap_or("?");
        if self.kind == GRAPH_LAUNCH {
            return format!(
                "a launch of a CUDA graph of {} captured collective(s), digest {:#018x} \
                 (collective #{})",
                self.root, self.count, self.seq
            );
        }
        let (base, captured) = match self.kind {
            k if (CAPTURED + 1..CAPTURED + 9).contains(&k) => (k - CAPTURED, "captured "),
            k => (k, ""),
        };
        let what = match base {
            1 => format!("all_reduce({op})"),
            2 => format!("reduce({op}, root {})", self.root),
            3 => format!("broadcast(root {})", self.root),
            4 => "all_gather".to_owned(),
            5 => format!("reduce_scatter({op})"),
            _ => "a test call".to_owned(),
        };
        let dtype = crate::collective::api::types::DTYPES
            .get(usize::from(self.dtype))
            .map_or("?", |t| t.0);
        format!(
            "{captured}{what} of {} {dtype} (collective #{})",
            self.count, self.seq
        )
    }
}

/// Where this rank sits in the star.
enum Links {
    /// Rank 0: one connection per rank (`None` at index 0).
    Rank0(Vec<Option<TcpStream>>),
    /// Another rank: its connection to rank 0.
    Peer(TcpStream),
}

/// The agreement of one NCCL job's ranks (one per process, any machines) on every
/// collective before it is enqueued: see docs/collective.md, "Ranks agree before NCCL
/// enqueues". Made by
/// [`LaunchEnv::exchange_id_checked_with`](super::LaunchEnv::exchange_id_checked_with)
/// and used by [`RankComm::from_launch`](super::RankComm::from_launch); usable alone
/// (e.g. to measure its cost, as `bench_collective --call-check` does).
pub struct CallCheck {
    rank: usize,
    world: usize,
    links: Links,
    timeout: Duration,
    /// Collectives agreed so far (the next header's sequence number).
    seq: u64,
    /// The first error: every later call returns it.
    broken: Option<Error>,
}

impl std::fmt::Debug for CallCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallCheck")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("seq", &self.seq)
            .field("broken", &self.broken)
            .finish()
    }
}

impl CallCheck {
    pub(crate) fn rank0(streams: Vec<Option<TcpStream>>, timeout: Duration) -> CallCheck {
        CallCheck {
            rank: 0,
            world: streams.len(),
            links: Links::Rank0(streams),
            timeout,
            seq: 0,
            broken: None,
        }
    }

    pub(crate) fn peer(
        stream: TcpStream,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> CallCheck {
        CallCheck {
            rank,
            world,
            links: Links::Peer(stream),
            timeout,
            seq: 0,
            broken: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The error that broke the check, if a call failed.
    pub fn error(&self) -> Option<&Error> {
        self.broken.as_ref()
    }

    /// Agrees on `call` with every rank (nothing to do for send/recv).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn agree_call(&mut self, call: &Call) -> Result<()> {
        match Header::of(call) {
            Some(h) => self.agree_on(h, call),
            None => self.check(),
        }
    }

    /// Agrees on `h`, the header of `call`, and on `call`'s buffers that other processes
    /// can map (eager and captured calls alike).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    fn agree_on(&mut self, h: Header, call: &Call) -> Result<()> {
        self.agree_with(h, &region::of_call(call, self.world))
    }

    /// Agrees on `call` captured into a CUDA graph (a collective: send/recv are not
    /// captured): as [`agree_call`](Self::agree_call), under the captured kind, so a
    /// peer calling it eagerly is a mismatch. Returns the agreed header (with its
    /// sequence number), which the graph keeps for [`agree_launch`](Self::agree_launch).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn agree_captured(&mut self, call: &Call) -> Result<[u8; HEADER_BYTES]> {
        let Some(mut h) = Header::of(call) else {
            return Err(Error::InvalidArgument(
                "send/recv are not captured through a RankComm".into(),
            ));
        };
        h.kind += CAPTURED;
        self.agree_on(h, call)?;
        h.seq = self.seq - 1;
        let mut out = [0u8; HEADER_BYTES];
        out.copy_from_slice(&h.encode());
        Ok(out)
    }

    /// Agrees on a launch of a graph whose collectives agreed `record` (their headers
    /// from [`agree_captured`](Self::agree_captured), in capture order) at capture time:
    /// one header naming how many there are and a digest of them, so the peers must be
    /// launching the graph of the same capture, not an eager call or another graph.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn agree_launch(&mut self, record: &[u8]) -> Result<()> {
        let n = record.len() / HEADER_BYTES;
        self.agree(Header {
            seq: 0,
            kind: GRAPH_LAUNCH,
            op: 0,
            dtype: 0,
            root: u32::try_from(n).unwrap_or(u32::MAX),
            count: fnv1a64(record),
        })
    }

    /// Agreement on a made-up collective, for tests and the bench without a GPU:
    /// `kind` 9.., `dtype` and `count` as the ranks please.
    #[cfg(any(test, feature = "test-seams"))]
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-seams"))]
    pub fn agree_for_test(&mut self, kind: u8, dtype: u8, count: u64) -> Result<()> {
        self.agree(Header {
            seq: 0,
            kind: kind.max(9),
            op: 0,
            dtype,
            root: 0,
            count,
        })
    }

    /// [`agree_for_test`](Self::agree_for_test) of kind 9 with this rank's receive
    /// buffer claimed to be bytes `[lo, hi)` of a shared allocation named by `key`
    /// (every byte of its key), for tests of the aliasing check without a GPU.
    #[cfg(any(test, feature = "test-seams"))]
    #[doc(hidden)]
    pub fn agree_shared_for_test(&mut self, count: u64, key: u8, lo: u64, hi: u64) -> Result<()> {
        let h = Header {
            seq: 0,
            kind: 9,
            op: 0,
            dtype: 0,
            root: 0,
            count,
        };
        let region = Region {
            role: 1,
            key: [key; 81],
            lo,
            hi,
        };
        self.agree_with(h, &[region])
    }

    /// [`fail`](Self::fail) with `InvalidArgument(reason)`, for tests without a GPU.
    #[cfg(any(test, feature = "test-seams"))]
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-seams"))]
    pub fn fail_for_test(&mut self, reason: &str) -> Error {
        self.fail(Error::InvalidArgument(reason.to_owned()))
    }

    /// A failure of this rank's own (a call it cannot make): breaks the check and tells
    /// the others at this collective (rank 0 relays it to every rank). Returns `e`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn fail(&mut self, e: Error) -> Error {
        if let Some(first) = &self.broken {
            return first.clone();
        }
        let relayed = Error::PeerFailed {
            rank: self.rank,
            reason: format!("its own call failed: {e}"),
        };
        let tell_by = Instant::now() + Duration::from_millis(500);
        let (world, rank) = (self.world as u32, self.rank as u32);
        let abort = |to: u32| Frame {
            kind: FrameKind::Abort,
            world,
            rank: to,
            payload: encode_error(&relayed),
        };
        match &mut self.links {
            Links::Peer(s) => {
                let _ = write_frame(s, &abort(rank), tell_by);
            }
            Links::Rank0(streams) => {
                for (r, s) in streams.iter_mut().enumerate() {
                    if let Some(s) = s {
                        let _ = write_frame(s, &abort(r as u32), tell_by);
                    }
                }
            }
        }
        self.broken = Some(e.clone());
        e
    }

    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn agree(&mut self, own: Header) -> Result<()> {
        self.agree_with(own, &[])
    }

    /// Agrees on `own` and on this rank's buffers that other processes can map
    /// (`regions`): rank 0 refuses the call on every rank if two ranks' overlap.
    fn agree_with(&mut self, mut own: Header, regions: &[Region]) -> Result<()> {
        self.check()?;
        own.seq = self.seq;
        self.seq += 1;
        let started = Instant::now();
        let deadline = crate::collective::support::deadline_after(self.timeout);
        let out = match &mut self.links {
            Links::Rank0(streams) => decide(streams, (own, regions), started, deadline),
            Links::Peer(stream) => {
                // Rank 0 decides at the same deadline as this rank, give or take the
                // skew of their calls: wait a quarter longer, at least 2 s, for its
                // verdict (which names the missing ranks).
                let extra = (self.timeout / 4).max(Duration::from_secs(2));
                let verdict_by = deadline.checked_add(extra).unwrap_or(deadline);
                ask(
                    stream,
                    (self.rank, self.world),
                    (own, regions),
                    started,
                    (deadline, verdict_by),
                )
            }
        };
        if let Err(e) = &out {
            self.broken = Some(e.clone());
        }
        out
    }
}

fn ms(started: Instant) -> u64 {
    started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
}

/// Rank 0: reads every rank's header, compares them with `own` in rank order, and sends
/// every rank the verdict (which it returns itself too).
fn decide(
    streams: &mut [Option<TcpStream>],
    (own, own_regions): (Header, &[Region]),
    started: Instant,
    deadline: Instant,
) -> Result<()> {
    let mut shared: Vec<Vec<Region>> = vec![Vec::new(); streams.len()];
    shared[0] = own_regions.to_vec();
    let mut failed: Option<Error> = None;
    let mut missing = Vec::new();
    let mut mismatch: Option<Error> = None;
    // Ranks are read in order; once the deadline has passed (a silent rank), the later
    // ones still get a short grace, so that headers already sent are counted and only
    // the ranks that really did not call are named.
    let grace = deadline
        .checked_add(Duration::from_millis(200))
        .unwrap_or(deadline);
    for (r, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let by = if Instant::now() < deadline {
            deadline
        } else {
            grace
        };
        let got = match read_frame(s, by) {
            Err(ReadFail::TimedOut) => {
                missing.push(r);
                continue;
            }
            read => header_of(r, read),
        };
        match got {
            Ok((h, regions)) => {
                shared[r] = regions;
                if mismatch.is_none() && !h.same_call(&own) {
                    mismatch = Some(Error::InvalidArgument(format!(
                        "collective mismatch: rank 0 called {}, rank {r} called {}",
                        own.describe(),
                        h.describe()
                    )));
                }
            }
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    let verdict = match (failed, missing.is_empty(), mismatch) {
        (Some(e), _, _) => Err(e),
        (None, false, _) => Err(Error::PeerTimeout {
            what: format!(
                "the other ranks' headers of {} (a rank that does not call it, or is stuck)",
                own.describe()
            ),
            ranks: missing,
            after_ms: ms(started),
        }),
        (None, true, Some(e)) => Err(e),
        (None, true, None) => region::check(&shared, &own.describe()),
    };
    tell_verdict(streams, verdict, deadline)
}

/// What rank `r`'s answer to the call check says: its header, or why it failed.
fn header_of(
    r: usize,
    read: std::result::Result<Frame, ReadFail>,
) -> Result<(Header, Vec<Region>)> {
    match read {
        Ok(f) if f.kind == FrameKind::Call && f.rank as usize == r => {
            let (head, tail) = f.payload.split_at(f.payload.len().min(HEADER_BYTES));
            Header::decode(head)
                .zip(region::decode_all(tail))
                .ok_or_else(|| Error::Rendezvous {
                    reason: format!(
                        "rank {r} sent a collective header of {} bytes, not {HEADER_BYTES} \
                         plus at most two buffer identities of {} bytes",
                        f.payload.len(),
                        region::REGION_BYTES
                    ),
                })
        }
        Ok(f) if f.kind == FrameKind::Abort => Err(match decode_error(&f.payload) {
            e @ Error::PeerFailed { .. } => e,
            other => Error::PeerFailed {
                rank: r,
                reason: other.to_string(),
            },
        }),
        Ok(f) => Err(Error::Rendezvous {
            reason: format!(
                "rank {r} sent a {:?} frame for rank {} where its collective header was due",
                f.kind, f.rank
            ),
        }),
        // (A timeout names the rank as missing instead: the caller's.)
        Err(ReadFail::TimedOut) | Err(ReadFail::Closed { .. }) | Err(ReadFail::Io(_)) => {
            Err(Error::PeerFailed {
                rank: r,
                reason: "its process exited, was killed or closed its connection to rank 0".into(),
            })
        }
        Err(ReadFail::Garbage(why)) => Err(Error::Rendezvous {
            reason: format!("rank {r} sent bytes that are not a gpubind frame: {why}"),
        }),
    }
}

/// Rank 0 sends every rank the verdict, even after an error (best effort then,
/// briefly), and returns it; a rank it could not tell of an agreement fails this rank.
fn tell_verdict(
    streams: &mut [Option<TcpStream>],
    verdict: Result<()>,
    deadline: Instant,
) -> Result<()> {
    let world = streams.len();
    let tell_by = match verdict {
        Ok(()) => deadline,
        Err(_) => Instant::now() + Duration::from_millis(500),
    };
    let payload = verdict.as_ref().err().map(encode_error).unwrap_or_default();
    let mut lost: Option<Error> = None;
    for (r, s) in streams.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let f = Frame {
            kind: if verdict.is_ok() {
                FrameKind::Agreed
            } else {
                FrameKind::Abort
            },
            world: world as u32,
            rank: r as u32,
            payload: payload.clone(),
        };
        if write_frame(s, &f, tell_by).is_err() && verdict.is_ok() {
            lost.get_or_insert(Error::PeerFailed {
                rank: r,
                reason: "sending it the verdict failed (it exited or was killed)".into(),
            });
        }
    }
    match (verdict, lost) {
        (Ok(()), Some(e)) => {
            // The others were told to go ahead; the lost rank will fail NCCL's call.
            Err(e)
        }
        (v, _) => v,
    }
}

/// A rank other than 0: sends its header, waits for rank 0's verdict.
fn ask(
    stream: &mut TcpStream,
    (rank, world): (usize, usize),
    (own, regions): (Header, &[Region]),
    started: Instant,
    (deadline, verdict_by): (Instant, Instant),
) -> Result<()> {
    let rank0_gone = |why: String| Error::PeerFailed {
        rank: 0,
        reason: format!("{why} (rank 0 exited or was killed)"),
    };
    let f = Frame {
        kind: FrameKind::Call,
        world: world as u32,
        rank: rank as u32,
        payload: {
            let mut p = own.encode();
            region::encode_into(regions, &mut p);
            p
        },
    };
    if let Err(e) = write_frame(stream, &f, deadline) {
        // Rank 0 may have sent its verdict (an abort naming the rank that failed) and
        // left before this header went out: that verdict, still readable on the
        // connection, is the error, not rank 0.
        let brief = Instant::now() + Duration::from_millis(100);
        if let Ok(v) = read_frame(stream, brief.min(verdict_by))
            && v.kind == FrameKind::Abort
        {
            return Err(decode_error(&v.payload));
        }
        return Err(rank0_gone(format!(
            "sending it this rank's collective header failed: {e}"
        )));
    }
    match read_frame(stream, verdict_by) {
        Ok(f) if f.kind == FrameKind::Agreed && f.rank as usize == rank => Ok(()),
        Ok(f) if f.kind == FrameKind::Abort => Err(decode_error(&f.payload)),
        Ok(f) => Err(Error::Rendezvous {
            reason: format!(
                "rank 0 sent a {:?} frame for rank {} where its verdict on {} was due",
                f.kind,
                f.rank,
                own.describe()
            ),
        }),
        Err(ReadFail::TimedOut) => Err(Error::PeerTimeout {
            what: format!("rank 0's verdict on {}", own.describe()),
            ranks: vec![0],
            after_ms: ms(started),
        }),
        Err(ReadFail::Closed { .. }) | Err(ReadFail::Io(_)) => Err(rank0_gone(
            "rank 0 closed the connection before its verdict".into(),
        )),
        Err(ReadFail::Garbage(why)) => Err(Error::Rendezvous {
            reason: format!("rank 0 sent bytes that are not a gpubind frame: {why}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Op;

    /// Rank 0 relays that rank 1 failed, then leaves (its connection reset) before
    /// rank 2 sends its header: rank 2's send fails, and it returns the relayed
    /// verdict, not "rank 0 exited".
    #[test]
    fn a_verdict_sent_before_rank_zero_left_is_returned_not_blamed_on_it() {
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut two = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut zero, _) = listener.accept().unwrap();
        let verdict = Error::PeerFailed {
            rank: 1,
            reason: "its process exited".into(),
        };
        let abort = Frame {
            kind: FrameKind::Abort,
            world: 3,
            rank: 2,
            payload: encode_error(&verdict),
        };
        let soon = Instant::now() + Duration::from_secs(5);
        write_frame(&mut zero, &abort, soon).unwrap();
        // A reset, not an orderly close: the next send of rank 2 fails.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: `zero` is an open socket for the call; `linger` is a valid `struct
        // linger` of the size passed, read only during the call.
        let set = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&zero),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "setsockopt(SO_LINGER)");
        drop(zero);
        std::thread::sleep(Duration::from_millis(50));
        let own = Header {
            seq: 0,
            kind: 9,
            op: 0,
            dtype: 0,
            root: 0,
            count: 1,
        };
        let got = ask(&mut two, (2, 3), (own, &[]), Instant::now(), (soon, soon));
        assert_eq!(got, Err(verdict));
    }

    #[test]
    fn headers_round_trip_and_describe_the_call() {
        let h = Header {
            seq: 7,
            kind: 2,
            op: 4,
            dtype: 3,
            root: 1,
            count: 1000,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert_eq!(h.encode().len(), HEADER_BYTES);
        assert_eq!(Header::decode(&h.encode()[1..]), None);
        assert_eq!(
            h.describe(),
            "reduce(Avg, root 1) of 1000 bf16 (collective #7)"
        );
        assert!(h.same_call(&Header { seq: 9, ..h }));
        assert!(!h.same_call(&Header { count: 999, ..h }));
        assert!(!h.same_call(&Header { dtype: 0, ..h }));
        assert!(!h.same_call(&Header { root: 0, ..h }));
    }

    /// Rank 0 and rank 1 of a two-rank check over a loopback connection.
    fn pair() -> (CallCheck, CallCheck) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (at0, _) = listener.accept().unwrap();
        let t = Duration::from_secs(20);
        (
            CallCheck::rank0(vec![None, Some(at0)], t),
            CallCheck::peer(peer, 1, 2, t),
        )
    }

    fn all_reduce_call(rank: usize, count: usize) -> Call {
        Call {
            rank,
            kind: Kind::AllReduce(Op::Sum),
            dtype: crate::collective::api::types::DType::of::<f32>(),
            count,
            send: 0,
            recv: 0,
        }
    }

    /// A rank capturing a collective while its peer calls it eagerly: the same typed
    /// mismatch on both, naming the captured one.
    #[test]
    fn capturing_rank_and_eager_peer_get_the_same_mismatch() {
        let (mut r0, mut r1) = pair();
        let peer = std::thread::spawn(move || r1.agree_call(&all_reduce_call(1, 64)));
        let own = r0.agree_captured(&all_reduce_call(0, 64));
        let theirs = peer.join().unwrap();
        let e = own.unwrap_err();
        assert_eq!(theirs.unwrap_err(), e);
        let msg = e.to_string();
        assert!(
            msg.contains("rank 0 called captured all_reduce(Sum) of 64 f32")
                && msg.contains("rank 1 called all_reduce(Sum) of 64 f32"),
            "{msg}"
        );
    }

    /// Both ranks capture, then launch: the same graph agrees at every launch; a peer
    /// that calls an eager collective (or launches another capture's graph) where rank 0
    /// launches gets the same mismatch as rank 0.
    #[test]
    fn graph_launches_agree_on_the_capture() {
        let (mut r0, mut r1) = pair();
        let peer = std::thread::spawn(move || {
            let rec = r1.agree_captured(&all_reduce_call(1, 64))?;
            for _ in 0..3 {
                r1.agree_launch(&rec)?;
            }
            // Rank 0 launches its graph once more; this rank calls eagerly instead.
            r1.agree_call(&all_reduce_call(1, 64))
        });
        let rec = r0.agree_captured(&all_reduce_call(0, 64)).unwrap();
        for _ in 0..3 {
            r0.agree_launch(&rec).unwrap();
        }
        let e = r0.agree_launch(&rec).unwrap_err();
        assert_eq!(peer.join().unwrap().unwrap_err(), e);
        let msg = e.to_string();
        assert!(
            msg.contains("rank 0 called a launch of a CUDA graph of 1 captured collective(s)")
                && msg.contains("rank 1 called all_reduce(Sum) of 64 f32"),
            "{msg}"
        );

        // Graphs of two captures of the same shape are different graphs.
        let (mut r0, mut r1) = pair();
        let peer = std::thread::spawn(move || {
            let first = r1.agree_captured(&all_reduce_call(1, 64))?;
            let _second = r1.agree_captured(&all_reduce_call(1, 64))?;
            r1.agree_launch(&first)
        });
        let _first = r0.agree_captured(&all_reduce_call(0, 64)).unwrap();
        let second = r0.agree_captured(&all_reduce_call(0, 64)).unwrap();
        let e = r0.agree_launch(&second).unwrap_err();
        assert_eq!(peer.join().unwrap().unwrap_err(), e);
        assert!(e.to_string().contains("collective mismatch"), "{e}");
    }

    #[test]
    fn captured_and_graph_launch_headers_differ_from_eager_ones() {
        let eager = Header {
            seq: 3,
            kind: 1,
            op: 0,
            dtype: 0,
            root: 0,
            count: 4096,
        };
        let captured = Header {
            kind: 1 + CAPTURED,
            ..eager
        };
        // A rank capturing while a peer calls eagerly: a mismatch, and it says which.
        assert!(!eager.same_call(&captured));
        assert_eq!(
            captured.describe(),
            "captured all_reduce(Sum) of 4096 f32 (collective #3)"
        );
        // Launch digests: the captured headers, sequence numbers included.
        let rec = |hs: &[Header]| hs.iter().flat_map(|h| h.encode()).collect::<Vec<u8>>();
        let launch = |r: &[u8]| Header {
            seq: 9,
            kind: GRAPH_LAUNCH,
            op: 0,
            dtype: 0,
            root: (r.len() / HEADER_BYTES) as u32,
            count: fnv1a64(r),
        };
        let a = rec(&[captured]);
        let same_shape_other_capture = rec(&[Header { seq: 4, ..captured }]);
        let other_len = rec(&[Header {
            count: 4095,
            ..captured
        }]);
        assert!(launch(&a).same_call(&launch(&a)));
        assert!(!launch(&a).same_call(&launch(&same_shape_other_capture)));
        assert!(!launch(&a).same_call(&launch(&other_len)));
        assert!(!launch(&a).same_call(&launch(&rec(&[captured, captured]))));
        assert!(!launch(&a).same_call(&eager));
        assert!(
            launch(&a)
                .describe()
                .starts_with("a launch of a CUDA graph of 1 captured collective(s), digest 0x")
        );
        // FNV-1a's published test vector.
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
