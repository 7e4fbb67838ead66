//! The host-side control channel of the own-kernel backend across processes on one
//! machine ([`ProcessGroup`]): a full mesh of Unix-domain sockets between the ranks,
//! carrying a hello at start, one header per rank and call (ranks agree on the op, the
//! data type and the length before anything is enqueued), "done" notices (a peer has
//! finished reading a rank's staging buffer) and aborts (a rank failed: every other
//! rank learns which, and why).
//!
//! # Wire format (version 2)
//!
//! Each message is one frame of [`crate::ipc::send_message`] (magic `GBIM`, length,
//! descriptor count; the peer must run as the same user, `SO_PEERCRED`). Its payload,
//! integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `GBPC` |
//! | 2 | protocol version (2) |
//! | 1 | type: 1 hello, 2 welcome, 3 reject, 4 call, 5 abort, 6 done, 7 bye |
//! | … | hello: world u32, rank u32, key hash u64, staging bytes u64 |
//! | … | call: sequence u64, kind u8, op u8, dtype u8, 0 u8, root/peer u32, count u64 |
//! | … | reject, abort: failed rank u32, code u8, UTF-8 reason |
//! | … | done: sequence u64 of the step read (checked: the oldest one owed) |
//!
//! Rank `r` listens on the abstract socket `gpubind-pc-<euid>-<hash of the key>-<r>` (Linux's
//! abstract namespace: no file to clean up, gone with the process); it connects to every
//! lower rank and accepts every higher one.

use crate::error::{Error, Result};
use crate::ipc::{self, TransportOptions};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

mod connect;
mod wire;

use crate::collective::callcheck::region;
use wire::*;
pub(crate) use wire::{Header, KIND_RECV, KIND_SEND, Region};

/// How many unread messages of a closed peer are searched for its abort: more than any
/// rank sends in one call (its header, its done notices, then the abort).
const UNREAD_MESSAGES: usize = 64;

fn after_ms(started: Instant) -> u64 {
    started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
}

/// One operation's time limit: every wait of the operation (a call of the own-kernel
/// backend across processes, its start, its drop) ends by the same deadline, so the
/// worst case is the timeout once, not once per wait.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// When the operation began (for the `after_ms` of its errors).
    pub(crate) started: Instant,
    /// When its waits give up.
    pub(crate) deadline: Instant,
}

impl Budget {
    /// A budget of `timeout` from now (`Duration::MAX`: practically without limit).
    pub(crate) fn new(timeout: Duration) -> Budget {
        Budget {
            started: Instant::now(),
            deadline: crate::collective::support::deadline_after(timeout),
        }
    }

    /// What is left of it (zero once spent).
    pub(crate) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Milliseconds since the operation began.
    pub(crate) fn after_ms(&self) -> u64 {
        after_ms(self.started)
    }
}

/// The host-side channel between the ranks of a one-machine job, one process per rank:
/// the control part of the own-kernel backend across processes
/// ([`RankComm::init_process_kernels`](crate::collective::RankComm::init_process_kernels)), usable
/// alone as a bounded barrier.
///
/// Every wait is bounded by the timeout given to [`connect`](Self::connect); a rank
/// that exits, is killed or fails makes the others' calls return [`Error::PeerFailed`]
/// naming it (a closed socket is seen at once), one that stays silent
/// [`Error::PeerTimeout`]. Once a call failed, every later call returns the same error
/// (the ranks are out of step).
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::collective::ProcessGroup;
/// use std::time::Duration;
/// // In each of the 4 processes of job "train-42", with its own rank:
/// let rank = 0;
/// let mut group = ProcessGroup::connect(rank, 4, "train-42", Duration::from_secs(60))?;
/// group.barrier()?;
/// # Ok(()) }
/// ```
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    /// `peers[q]`: the connection to rank `q` (`None` for this rank).
    peers: Vec<Option<UnixStream>>,
    timeout: Duration,
    /// Calls so far (the sequence number of the next header).
    seq: u64,
    /// The done notices still owed by each peer, by the sequence number of the step in
    /// which it read this rank's staging (oldest first). A notice is checked against
    /// the front: a peer's notices come in order on its socket, and one for any other
    /// step is a protocol error naming that peer.
    owed: Vec<std::collections::VecDeque<u64>>,
    /// Peers that read this rank's staging since it was last written.
    readers: Vec<bool>,
    /// The first error: every later call returns it.
    broken: Option<Error>,
    /// Peers that said bye or closed their socket.
    gone: Vec<bool>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("broken", &self.broken)
            .finish()
    }
}

impl ProcessGroup {
    /// The transport options of one message, bounded by `deadline`.
    fn transport(&self, deadline: Instant) -> TransportOptions {
        TransportOptions::default().timeout(deadline.saturating_duration_since(Instant::now()))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The error that broke the group, if a call failed.
    pub fn error(&self) -> Option<&Error> {
        self.broken.as_ref()
    }

    /// The timeout every wait is bounded by.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn stream(&self, q: usize) -> Option<&UnixStream> {
        self.peers.get(q).and_then(Option::as_ref)
    }

    /// The typed error for a failed send or receive with rank `q`.
    fn wire_error(&self, q: usize, e: Error, started: Instant, what: &str) -> Error {
        match e {
            Error::PeerGone => Error::PeerFailed {
                rank: q,
                reason: "its process exited, was killed or closed its connection".into(),
            },
            Error::Timeout { .. } => Error::PeerTimeout {
                what: format!("rank {q}: {what}"),
                ranks: vec![q],
                after_ms: after_ms(started),
            },
            Error::CorruptHandle { reason } => garbage(reason),
            other => other,
        }
    }

    /// Marks the group failed with `e` and tells every peer (best effort, briefly).
    pub(crate) fn fail(&mut self, e: Error) -> Error {
        if self.broken.is_none() {
            let msg = encode_error(ABORT, self.rank, &e);
            let opts = TransportOptions::default().timeout(Duration::from_millis(200));
            for s in self.peers.iter().flatten() {
                let _ = ipc::send_message_with(s, &msg, &[], &opts);
            }
            self.broken = Some(e.clone());
        }
        e
    }

    /// Fails fast once broken.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Runs `f`; an error from it breaks the group (and is sent to the peers).
    pub(crate) fn guarded<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        self.check()?;
        match f(self) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn send_to(&self, q: usize, bytes: &[u8], started: Instant, deadline: Instant) -> Result<()> {
        let s = self.stream(q).ok_or_else(|| Error::PeerFailed {
            rank: q,
            reason: "no connection".into(),
        })?;
        ipc::send_message_with(s, bytes, &[], &self.transport(deadline)).map_err(|e| {
            let closed = matches!(e, Error::PeerGone);
            let e = self.wire_error(q, e, started, "it to read a control message");
            if closed {
                self.closed_peer_error(q, e)
            } else {
                e
            }
        })
    }

    /// The error for rank `q`'s closed connection: the abort `q` sent before it closed,
    /// if one is still unread on its socket, else `closed` (which names `q`).
    ///
    /// A rank that learns of a failure first tells every other rank, naming the rank
    /// that failed, and may exit at once. A survivor that then finds that rank's
    /// connection closed (a send refused, a poll that sees the hang-up) before reading
    /// its abort must relay the abort, not blame the messenger. Reads only what is
    /// already queued on the closed socket (its messages precede the end of stream).
    pub(crate) fn closed_peer_error(&self, q: usize, closed: Error) -> Error {
        self.unread_abort(q).unwrap_or(closed)
    }

    /// The first abort among the messages still unread from rank `q`, whose socket is
    /// closed (so reading ends at once, at its end of stream); other messages are
    /// skipped (the group is failing anyway).
    fn unread_abort(&self, q: usize) -> Option<Error> {
        let s = self.stream(q)?;
        // Only a bound in case the peer is not closed after all: queued bytes, then the
        // end of stream, are read without waiting.
        let opts = TransportOptions::default().timeout(Duration::from_millis(100));
        for _ in 0..UNREAD_MESSAGES {
            let m = ipc::recv_message_with(s, &opts).ok()?;
            match decode(q, &m.bytes) {
                Ok(Msg::Abort(e)) => return Some(e),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// The next message from one of `from` (whichever comes first): which rank sent
    /// it, and the message or the typed error for that connection (closed, garbage).
    /// The outer error is a timeout (naming every rank of `from`).
    fn recv_raw(
        &self,
        from: &[usize],
        started: Instant,
        deadline: Instant,
        what: &str,
    ) -> Result<(usize, Result<Msg>)> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::PeerTimeout {
                    what: what.to_owned(),
                    ranks: from.to_vec(),
                    after_ms: after_ms(started),
                });
            }
            let slice = left.min(Duration::from_secs(3600));
            let ts = Timespec {
                tv_sec: slice.as_secs() as i64,
                tv_nsec: i64::from(slice.subsec_nanos()),
            };
            let streams: Vec<(usize, &UnixStream)> = from
                .iter()
                .filter_map(|&q| self.stream(q).map(|s| (q, s)))
                .collect();
            let mut fds: Vec<PollFd<'_>> = streams
                .iter()
                .map(|(_, s)| PollFd::new(*s, PollFlags::IN))
                .collect();
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    return Err(Error::Io {
                        what: "poll",
                        kind: std::io::Error::from(e).kind(),
                        message: e.to_string(),
                    });
                }
            }
            let ready = fds.iter().position(|f| !f.revents().is_empty());
            drop(fds);
            let Some(i) = ready else { continue };
            let (q, stream) = streams[i];
            let opts = self.transport(deadline);
            let got = ipc::recv_message_with(stream, &opts)
                .map_err(|e| self.wire_error(q, e, started, what))
                .and_then(|m| decode(q, &m.bytes));
            return Ok((q, got));
        }
    }

    /// The next message other than a done notice from one of `from` (done notices are
    /// counted off on the way). Aborts become the error they carry; a bye is
    /// [`Error::PeerFailed`].
    fn recv_any(
        &mut self,
        from: &[usize],
        started: Instant,
        deadline: Instant,
        what: &str,
    ) -> Result<(usize, Msg)> {
        loop {
            let (q, got) = self.recv_raw(from, started, deadline, what)?;
            match got? {
                // Owed for an earlier step (a peer's notice precedes its next header).
                Msg::Done(seq) => self.count_done(q, seq)?,
                Msg::Abort(e) => return Err(e),
                Msg::Bye => {
                    self.gone[q] = true;
                    return Err(Error::PeerFailed {
                        rank: q,
                        reason: "its communicator was dropped".into(),
                    });
                }
                m => return Ok((q, m)),
            }
        }
    }

    /// Exchanges this rank's header with `peers` (all other ranks for a collective, the
    /// partner for send/recv) and checks they agree: every rank of a collective sees the
    /// same headers, so a mismatch is the same typed error on each.
    pub(crate) fn agree(&mut self, own: Header, peers: &[usize], budget: &Budget) -> Result<()> {
        self.agree_with(own, &[], peers, budget)
    }

    /// [`agree`](Self::agree), also exchanging the identities of this rank's buffers
    /// that other processes can map (`regions`): after the headers agree, two ranks
    /// whose buffers share memory are the same typed error on every rank
    /// (`InvalidArgument("collective aliasing: …")`).
    pub(crate) fn agree_with(
        &mut self,
        mut own: Header,
        regions: &[Region],
        peers: &[usize],
        budget: &Budget,
    ) -> Result<()> {
        own.seq = self.seq;
        self.seq += 1;
        let (started, deadline) = (budget.started, budget.deadline);
        let msg = encode_call(&own, regions);
        for &q in peers {
            self.send_to(q, &msg, started, deadline)?;
        }
        let mut theirs: Vec<Option<Header>> = vec![None; self.world];
        let mut shared: Vec<Vec<Region>> = vec![Vec::new(); self.world];
        theirs[self.rank] = Some(own);
        shared[self.rank] = regions.to_vec();
        let mut pending: Vec<usize> = peers.to_vec();
        while !pending.is_empty() {
            let what = format!("the other ranks' headers of {}", own.describe());
            let (q, m) = self.recv_any(&pending, started, deadline, &what)?;
            let Msg::Call(h, r) = m else {
                return Err(garbage(format_args!(
                    "{m:?} from rank {q} instead of a call header"
                )));
            };
            theirs[q] = Some(h);
            shared[q] = r;
            pending.retain(|&p| p != q);
        }
        if matches!(own.kind, KIND_SEND | KIND_RECV) {
            let q = peers[0];
            let h = theirs[q].unwrap_or(own);
            let want = if own.kind == KIND_SEND {
                KIND_RECV
            } else {
                KIND_SEND
            };
            let ok = h.kind == want
                && h.arg as usize == self.rank
                && h.dtype == own.dtype
                && h.count == own.count;
            if !ok {
                let (s, r) = if own.kind == KIND_SEND {
                    ((self.rank, own), (q, h))
                } else {
                    ((q, h), (self.rank, own))
                };
                return Err(Error::InvalidArgument(format!(
                    "collective mismatch: rank {} called {}, rank {} called {}",
                    s.0,
                    s.1.describe(),
                    r.0,
                    r.1.describe()
                )));
            }
            return region::check(&shared, &own.describe());
        }
        // In rank order, against the lowest rank taking part: the same verdict on all.
        let all: Vec<(usize, Header)> = theirs
            .iter()
            .enumerate()
            .filter_map(|(r, h)| h.map(|h| (r, h)))
            .collect();
        let (r0, h0) = all[0];
        for &(r, h) in &all[1..] {
            if !h.same_call(&h0) {
                return Err(Error::InvalidArgument(format!(
                    "collective mismatch: rank {r0} called {}, rank {r} called {}",
                    h0.describe(),
                    h.describe()
                )));
            }
        }
        region::check(&shared, &own.describe())
    }

    /// The sequence number of the step last agreed (the one a done notice sent now is
    /// for).
    fn last_step(&self) -> u64 {
        self.seq.saturating_sub(1)
    }

    /// Tells rank `q` that this rank has finished reading its staging in the step last
    /// agreed (the done event is recorded); the notice carries that step's sequence
    /// number.
    pub(crate) fn send_done(&mut self, q: usize, budget: &Budget) -> Result<()> {
        let seq = self.last_step();
        self.send_to(
            q,
            &encode(DONE, &seq.to_le_bytes()),
            budget.started,
            budget.deadline,
        )
    }

    /// Counts one done notice owed by each of `readers` for the step last agreed.
    pub(crate) fn expect_done(&mut self, readers: &[usize]) {
        let seq = self.last_step();
        for &q in readers {
            self.owed[q].push_back(seq);
            self.readers[q] = true;
        }
    }

    /// Counts off a done notice for step `seq` from rank `q`: it must be the oldest one
    /// `q` owes, else the peer does not follow the protocol (typed, naming it).
    fn count_done(&mut self, q: usize, seq: u64) -> Result<()> {
        match self.owed[q].front() {
            Some(&want) if want == seq => {
                self.owed[q].pop_front();
                Ok(())
            }
            want => Err(Error::PeerFailed {
                rank: q,
                reason: format!(
                    "it broke the control protocol: a done notice for step {seq}, while rank {} {}",
                    self.rank,
                    match want {
                        Some(w) => format!("expected one for step {w}"),
                        None => "expected none".to_owned(),
                    }
                ),
            }),
        }
    }

    /// Waits for every owed done notice; returns the ranks that read this rank's
    /// staging since the last call (their done events are recorded now, so polling them
    /// is meaningful), and forgets them.
    pub(crate) fn collect_done(&mut self, budget: &Budget) -> Result<Vec<usize>> {
        let (started, deadline) = (budget.started, budget.deadline);
        let owing: Vec<usize> = (0..self.world).filter(|&q| self.readers[q]).collect();
        loop {
            let pending: Vec<usize> = (0..self.world)
                .filter(|&q| !self.owed[q].is_empty())
                .collect();
            if pending.is_empty() {
                self.readers.fill(false);
                return Ok(owing);
            }
            let what = "the other ranks to finish reading this rank's staging buffer";
            let (q, got) = self.recv_raw(&pending, started, deadline, what)?;
            match got? {
                Msg::Done(seq) => self.count_done(q, seq)?,
                Msg::Abort(e) => return Err(e),
                Msg::Bye => {
                    self.gone[q] = true;
                    return Err(Error::PeerFailed {
                        rank: q,
                        reason:
                            "its communicator was dropped while reading this rank's staging buffer"
                                .into(),
                    });
                }
                m => {
                    return Err(garbage(format_args!(
                        "{m:?} from rank {q} instead of a done notice"
                    )));
                }
            }
        }
    }

    /// Whether rank `q`'s socket is closed (it exited or was killed). Never blocks.
    pub(crate) fn peer_closed(&self, q: usize) -> bool {
        let Some(s) = self.stream(q) else {
            return false;
        };
        // A peer that closed its end is seen even with messages of its still unread
        // (a peek returns data then): poll reports the hang-up regardless.
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(s, PollFlags::RDHUP)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if let Ok(n) = rustix::event::poll(&mut fds, Some(&zero))
            && n > 0
            && fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
        {
            return true;
        }
        let mut b = [0u8; 1];
        matches!(
            rustix::net::recv(
                s.as_fd(),
                &mut b,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
            ),
            Ok((0, _))
        )
    }

    /// Waits until every rank has reached this point (or fails, typed, within the
    /// timeout).
    pub fn barrier(&mut self) -> Result<()> {
        let peers: Vec<usize> = (0..self.world).filter(|&q| q != self.rank).collect();
        let h = Header {
            seq: 0,
            kind: KIND_BARRIER,
            op: 0,
            dtype: 0xff,
            arg: 0,
            count: 0,
        };
        let budget = Budget::new(self.timeout);
        self.guarded(|g| g.agree(h, &peers, &budget))
    }

    /// Agreement on a made-up call, for tests of the control channel without a GPU:
    /// `kind` 9.., `dtype` and `count` as the ranks please.
    #[cfg(any(test, feature = "test-seams"))]
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-seams"))]
    pub fn agree_for_test(&mut self, kind: u8, dtype: u8, count: u64) -> Result<()> {
        let peers: Vec<usize> = (0..self.world).filter(|&q| q != self.rank).collect();
        let h = Header {
            seq: 0,
            kind: kind.max(9),
            op: 0,
            dtype,
            arg: 0,
            count,
        };
        let budget = Budget::new(self.timeout);
        self.guarded(|g| g.agree(h, &peers, &budget))
    }

    /// [`agree_for_test`](Self::agree_for_test) with this rank's buffer claimed to be
    /// bytes `[lo, hi)` of a shared allocation named by `key` (every byte of its key),
    /// for tests of the aliasing check without a GPU.
    #[cfg(any(test, feature = "test-seams"))]
    #[doc(hidden)]
    pub fn agree_shared_for_test(&mut self, count: u64, key: u8, lo: u64, hi: u64) -> Result<()> {
        let peers: Vec<usize> = (0..self.world).filter(|&q| q != self.rank).collect();
        let h = Header {
            seq: 0,
            kind: 9,
            op: 0,
            dtype: 0,
            arg: 0,
            count,
        };
        let region = Region {
            role: 1,
            key: [key; 81],
            lo,
            hi,
        };
        let budget = Budget::new(self.timeout);
        self.guarded(|g| g.agree_with(h, &[region], &peers, &budget))
    }

    /// Says bye to every peer, then waits (at most the timeout) until each has said bye
    /// or closed its socket. `true` when all did: no peer uses this rank's exports any
    /// more.
    /// Leaves without a bye while this rank may still read a peer's staging (its own
    /// work did not settle in time): the sockets are leaked, not closed, so no peer takes
    /// a closed connection for "done with my exports" — each peer's own leave then times
    /// out and leaks its staging instead of freeing it under this rank's reads.
    pub(crate) fn leave_still_mapped(&mut self) {
        for s in self.peers.iter_mut() {
            if let Some(stream) = s.take() {
                std::mem::forget(stream);
            }
        }
    }

    pub(crate) fn leave(&mut self, budget: &Budget) -> bool {
        let (started, deadline) = (budget.started, budget.deadline);
        let bye = encode(BYE, &[]);
        for q in 0..self.world {
            if q != self.rank && !self.gone[q] {
                let _ = self.send_to(q, &bye, started, deadline);
            }
        }
        let mut clean = true;
        loop {
            let pending: Vec<usize> = (0..self.world)
                .filter(|&q| q != self.rank && !self.gone[q])
                .collect();
            if pending.is_empty() {
                return clean;
            }
            match self.recv_raw(&pending, started, deadline, "the other ranks' byes") {
                // A bye, or a closed connection: that peer is done with this rank.
                Ok((q, Ok(Msg::Bye))) | Ok((q, Err(Error::PeerFailed { .. }))) => {
                    self.gone[q] = true
                }
                // Garbage ends that connection; whatever sent it may still map this
                // rank's exports, so they are not freed.
                Ok((q, Err(_))) => {
                    self.gone[q] = true;
                    self.peers[q] = None;
                    clean = false;
                }
                // Anything else (a late header, a done notice, an abort): skipped.
                Ok((_, Ok(_))) => {}
                Err(_) => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests;
