//! One rank's call, validated ([`make_call`]), and the matching of the ranks' calls into
//! collectives and send/recv pairs ([`plan`]).

use super::types::{DType, Op};
use crate::access::{Access, AccessTracker};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::DeviceMemory;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// What one rank's call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(Op),
    /// `(op, root)`
    Reduce(Op, usize),
    /// root; in place
    Broadcast(usize),
    AllGather,
    ReduceScatter(Op),
    /// to peer
    Send(usize),
    /// from peer
    Recv(usize),
}

/// [`Kind::code`] of a send.
#[cfg_attr(not(any(feature = "nccl", feature = "ipc")), allow(dead_code))]
pub(crate) const KIND_SEND: u8 = 6;
/// [`Kind::code`] of a receive.
#[cfg_attr(not(any(feature = "nccl", feature = "ipc")), allow(dead_code))]
pub(crate) const KIND_RECV: u8 = 7;

impl Kind {
    /// The call's code in the headers ranks agree on: `(kind, op, root or peer)`, kinds
    /// 1-5 for the collectives and [`KIND_SEND`]/[`KIND_RECV`], ops as [`Op::code`].
    #[cfg_attr(not(any(feature = "nccl", feature = "ipc")), allow(dead_code))]
    pub(crate) fn code(&self) -> (u8, u8, usize) {
        match *self {
            Kind::AllReduce(op) => (1, op.code(), 0),
            Kind::Reduce(op, root) => (2, op.code(), root),
            Kind::Broadcast(root) => (3, 0, root),
            Kind::AllGather => (4, 0, 0),
            Kind::ReduceScatter(op) => (5, op.code(), 0),
            Kind::Send(peer) => (KIND_SEND, 0, peer),
            Kind::Recv(peer) => (KIND_RECV, 0, peer),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::Reduce(..) => "reduce",
            Kind::Broadcast(_) => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::Send(_) => "send",
            Kind::Recv(_) => "recv",
        }
    }
}

/// One rank's part of a collective, validated, with raw addresses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) kind: Kind,
    pub(crate) dtype: DType,
    /// NCCL's count: per-rank elements (all_gather: send; reduce_scatter: recv).
    pub(crate) count: usize,
    pub(crate) send: u64,
    pub(crate) recv: u64,
}

/// A buffer as the validation sees it.
#[derive(Clone, Copy)]
pub(crate) struct Buf<'x> {
    device: &'x Device,
    len: usize,
    ptr: u64,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    bytes: u64,
    /// The allocation's pending uses: the collective is ordered after them.
    tracker: &'x AccessTracker,
}

pub(crate) fn buf<T, M: DeviceMemory<T> + ?Sized>(m: &M) -> Buf<'_> {
    Buf {
        device: m.device(),
        len: m.len(),
        ptr: m.device_ptr(),
        bytes: m.num_bytes() as u64,
        tracker: m.tracker(),
    }
}

#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
impl<'x> Buf<'x> {
    /// The allocation's tracker, and the buffer's address and size in bytes.
    pub(crate) fn span(&self) -> (&'x AccessTracker, u64, u64) {
        (self.tracker, self.ptr, self.bytes)
    }

    /// Its bytes, for overlap checks.
    pub(crate) fn byte_span(&self) -> crate::memory::ByteSpan {
        crate::memory::ByteSpan::new(self.tracker, self.ptr, self.bytes)
    }
}

/// How a collective uses its buffers: `send` is read, `recv` written (one write when
/// they are the same buffer, as in broadcast).
pub(crate) fn uses<'x>(
    send: Option<Buf<'x>>,
    recv: Option<Buf<'x>>,
) -> Vec<(&'x AccessTracker, Access)> {
    let mut v = Vec::with_capacity(2);
    if let Some(r) = recv {
        v.push((r.tracker, Access::Write));
    }
    if let Some(s) = send
        && !recv.is_some_and(|r| std::ptr::eq(r.tracker, s.tracker))
    {
        v.push((s.tracker, Access::Read));
    }
    v
}

pub(crate) fn rank_error(what: &str, rank: usize, nranks: usize) -> Error {
    Error::InvalidArgument(format!(
        "{what} {rank} is out of range for a communicator of {nranks} rank(s)"
    ))
}

/// Checks one rank's call against its device, the sizes NCCL implies and the rank
/// range, and builds the [`Call`].
pub(crate) fn make_call(
    nranks: usize,
    rank: usize,
    rank_device: &Device,
    kind: Kind,
    dtype: DType,
    send: Option<Buf<'_>>,
    recv: Option<Buf<'_>>,
) -> Result<Call> {
    if rank >= nranks {
        return Err(rank_error("rank", rank, nranks));
    }
    match kind {
        Kind::Reduce(_, r) | Kind::Broadcast(r) if r >= nranks => {
            return Err(rank_error("root", r, nranks));
        }
        Kind::Send(p) | Kind::Recv(p) if p >= nranks => {
            return Err(rank_error("peer", p, nranks));
        }
        _ => {}
    }
    for (what, b) in [("send buffer", send), ("receive buffer", recv)] {
        if let Some(b) = b {
            rank_device.expect_same(what, b.device)?;
        }
    }
    let len = |b: Option<Buf<'_>>| b.map_or(0, |b| b.len);
    let ptr = |b: Option<Buf<'_>>| b.map_or(0, |b| b.ptr);
    let (s, r) = (len(send), len(recv));
    let mismatch = |expected: usize, found: usize| Error::SizeMismatch {
        what: kind.name(),
        expected,
        found,
    };
    let count = match kind {
        Kind::AllReduce(_) | Kind::Reduce(..) if r != s => return Err(mismatch(s, r)),
        Kind::AllGather if Some(r) != s.checked_mul(nranks) => {
            return Err(mismatch(s.saturating_mul(nranks), r));
        }
        Kind::ReduceScatter(_) if Some(s) != r.checked_mul(nranks) => {
            return Err(mismatch(r.saturating_mul(nranks), s));
        }
        Kind::ReduceScatter(_) | Kind::Recv(_) => r,
        Kind::AllReduce(_)
        | Kind::Reduce(..)
        | Kind::Broadcast(_)
        | Kind::AllGather
        | Kind::Send(_) => s,
    };
    Ok(Call {
        rank,
        kind,
        dtype,
        count,
        send: ptr(send),
        recv: ptr(recv),
    })
}

/// Checks that the parts of one collective (one per rank, in rank order) agree.
pub(crate) fn check_matched(calls: &[Call]) -> Result<()> {
    let Some(first) = calls.first() else {
        return Ok(());
    };
    for c in &calls[1..] {
        if c.kind != first.kind || c.dtype != first.dtype {
            return Err(Error::InvalidArgument(format!(
                "collective mismatch: rank {} called {:?} on {}, rank {} called {:?} on {}",
                first.rank, first.kind, first.dtype.name, c.rank, c.kind, c.dtype.name
            )));
        }
        if c.count != first.count {
            return Err(Error::SizeMismatch {
                what: first.kind.name(),
                expected: first.count,
                found: c.count,
            });
        }
    }
    Ok(())
}

/// A group's calls sorted into matched collectives and send/recv pairs.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Each entry has one call per rank, in rank order.
    pub(crate) colls: Vec<Vec<Call>>,
    /// `(send, recv)`.
    pub(crate) p2p: Vec<(Call, Call)>,
}

pub(crate) fn plan(nranks: usize, calls: &[Call]) -> Result<Plan> {
    let mut per_rank: Vec<Vec<Call>> = vec![Vec::new(); nranks];
    let mut sends: BTreeMap<(usize, usize), VecDeque<Call>> = BTreeMap::new();
    let mut recvs: BTreeMap<(usize, usize), VecDeque<Call>> = BTreeMap::new();
    for c in calls {
        match c.kind {
            Kind::Send(p) => sends.entry((c.rank, p)).or_default().push_back(*c),
            Kind::Recv(p) => recvs.entry((p, c.rank)).or_default().push_back(*c),
            _ => per_rank[c.rank].push(*c),
        }
    }
    let k = per_rank[0].len();
    if let Some((r, v)) = per_rank.iter().enumerate().find(|(_, v)| v.len() != k) {
        return Err(Error::InvalidArgument(format!(
            "rank {r} made {} collective call(s) in this group, rank 0 made {k}: every rank must join every collective",
            v.len()
        )));
    }
    let mut colls = Vec::with_capacity(k);
    for i in 0..k {
        let v: Vec<Call> = per_rank.iter().map(|calls| calls[i]).collect();
        check_matched(&v)?;
        colls.push(v);
    }
    let mut p2p = Vec::new();
    for (&(s, d), sq) in &sends {
        let rq = recvs.remove(&(s, d)).unwrap_or_default();
        if rq.len() != sq.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {s} posted {} send(s) to rank {d}, which posted {} recv(s) from {s}",
                sq.len(),
                rq.len()
            )));
        }
        for (a, b) in sq.iter().zip(rq) {
            check_pair(a, &b)?;
            p2p.push((*a, b));
        }
    }
    if let Some((&(s, d), rq)) = recvs.iter().next() {
        return Err(Error::InvalidArgument(format!(
            "rank {d} posted {} recv(s) from rank {s}, which posted no send to {d}",
            rq.len()
        )));
    }
    check_no_aliasing(nranks, calls)?;
    Ok(Plan { colls, p2p })
}

/// Refuses calls enqueued together (a group, or the ranks' parts of one collective or
/// send/recv pair) whose buffers share device memory where one of them is written.
/// Borrows keep gpubind's buffers apart, but two views of one module variable
/// (`Module::global` called twice) are one memory: two ranks writing it, or one writing
/// what another reads, would return wrong results as `Ok`. Addresses are compared as
/// they are: in one process every allocation, of any device, has its own range. A
/// call's send and receive buffer may be the same one (in place).
pub(crate) fn check_no_aliasing(nranks: usize, calls: &[Call]) -> Result<()> {
    // (first byte, one past the last, written, index of the call)
    let mut spans: Vec<(u64, u64, bool, usize)> = Vec::with_capacity(2 * calls.len());
    for (i, c) in calls.iter().enumerate() {
        let (es, n, all) = (c.dtype.size as u64, c.count as u64, nranks as u64);
        let (send, recv) = match c.kind {
            Kind::AllGather => (n, n.saturating_mul(all)),
            Kind::ReduceScatter(_) => (n.saturating_mul(all), n),
            _ => (n, n),
        };
        for (ptr, elems, written) in [(c.send, send, false), (c.recv, recv, true)] {
            let bytes = elems.saturating_mul(es);
            if ptr != 0 && bytes > 0 {
                spans.push((ptr, ptr.saturating_add(bytes), written, i));
            }
        }
    }
    spans.sort_unstable_by_key(|s| s.0);
    for (k, a) in spans.iter().enumerate() {
        for b in spans[k + 1..].iter().take_while(|b| b.0 < a.1) {
            let in_place = a.3 == b.3 && (a.0, a.1) == (b.0, b.1);
            if (a.2 || b.2) && !in_place {
                let role = |w: bool| if w { "receive" } else { "send" };
                let (ca, cb) = (&calls[a.3], &calls[b.3]);
                return Err(Error::InvalidArgument(format!(
                    "collective aliasing: rank {}'s {} buffer of {} ({:#x}, {} bytes) and rank \
                     {}'s {} buffer of {} ({:#x}, {} bytes) share device memory (two views of \
                     one module global?); a buffer a collective writes must be memory no \
                     other buffer of the call uses",
                    ca.rank,
                    role(a.2),
                    ca.kind.name(),
                    a.0,
                    a.1 - a.0,
                    cb.rank,
                    role(b.2),
                    cb.kind.name(),
                    b.0,
                    b.1 - b.0,
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_pair(send: &Call, recv: &Call) -> Result<()> {
    if send.dtype != recv.dtype {
        return Err(Error::InvalidArgument(format!(
            "rank {} sends {} but rank {} receives {}",
            send.rank, send.dtype.name, recv.rank, recv.dtype.name
        )));
    }
    if send.count != recv.count {
        return Err(Error::SizeMismatch {
            what: "send/recv",
            expected: send.count,
            found: recv.count,
        });
    }
    Ok(())
}

pub(crate) fn check_distinct(devices: &[Arc<Device>]) -> Result<()> {
    for (second, d) in devices.iter().enumerate() {
        if let Some(first) = devices[..second]
            .iter()
            .position(|x| x.ordinal() == d.ordinal())
        {
            return Err(Error::DuplicateDevice {
                ordinal: d.ordinal(),
                first,
                second,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call with buffers of its own (addresses no other call of the test has).
    fn call(rank: usize, kind: Kind, count: usize) -> Call {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let at = NEXT.fetch_add(2, std::sync::atomic::Ordering::Relaxed) << 32;
        Call {
            rank,
            kind,
            dtype: DType::of::<f32>(),
            count,
            send: at,
            recv: at + (1 << 32),
        }
    }

    #[test]
    fn plan_matches_collectives_and_pairs() {
        let calls = [
            call(0, Kind::AllReduce(Op::Sum), 5),
            call(1, Kind::AllReduce(Op::Sum), 5),
            call(0, Kind::Send(1), 3),
            call(1, Kind::Recv(0), 3),
            call(1, Kind::Broadcast(0), 2),
            call(0, Kind::Broadcast(0), 2),
        ];
        let p = plan(2, &calls).unwrap();
        assert_eq!(p.colls.len(), 2);
        assert_eq!(p.colls[1][0].rank, 0);
        assert_eq!(p.colls[1][1].kind, Kind::Broadcast(0));
        assert_eq!(p.p2p.len(), 1);
        assert_eq!((p.p2p[0].0.rank, p.p2p[0].1.rank), (0, 1));
    }

    #[test]
    fn plan_rejects_mismatches() {
        let count = [
            call(0, Kind::AllReduce(Op::Sum), 5),
            call(1, Kind::AllReduce(Op::Sum), 6),
        ];
        assert_eq!(
            plan(2, &count).unwrap_err(),
            Error::SizeMismatch {
                what: "all_reduce",
                expected: 5,
                found: 6
            }
        );
        let op = [
            call(0, Kind::AllReduce(Op::Sum), 5),
            call(1, Kind::AllReduce(Op::Max), 5),
        ];
        assert!(matches!(plan(2, &op), Err(Error::InvalidArgument(_))));
        let missing = [call(0, Kind::AllGather, 5)];
        assert!(matches!(plan(2, &missing), Err(Error::InvalidArgument(_))));
        let unmatched = [call(0, Kind::Send(1), 5)];
        assert!(matches!(
            plan(2, &unmatched),
            Err(Error::InvalidArgument(_))
        ));
        let lonely = [call(1, Kind::Recv(0), 5)];
        assert!(matches!(plan(2, &lonely), Err(Error::InvalidArgument(_))));
        let sizes = [call(0, Kind::Send(1), 5), call(1, Kind::Recv(0), 4)];
        assert!(matches!(
            plan(2, &sizes),
            Err(Error::SizeMismatch {
                what: "send/recv",
                ..
            })
        ));
    }

    #[test]
    fn calls_sharing_written_memory_are_refused() {
        let at = |rank: usize, kind: Kind, count: usize, send: u64, recv: u64| Call {
            send,
            recv,
            ..call(rank, kind, count)
        };
        let sum = Kind::AllReduce(Op::Sum);
        // Separate buffers, a shared read, in place: accepted.
        let fine = [
            at(0, sum, 4, 0x1000, 0x2000),
            at(1, sum, 4, 0x1000, 0x3000),
            at(0, Kind::Broadcast(0), 4, 0x4000, 0x4000),
            at(1, Kind::Broadcast(0), 4, 0x5000, 0x5000),
        ];
        assert_eq!(plan(2, &fine).map(|p| p.colls.len()), Ok(2));
        // Two ranks' outputs at one address (two views of one module global).
        let outputs = [
            at(0, Kind::ReduceScatter(Op::Sum), 4, 0x1000, 0x9000),
            at(1, Kind::ReduceScatter(Op::Sum), 4, 0x2000, 0x9000),
        ];
        match plan(2, &outputs) {
            Err(Error::InvalidArgument(m)) => assert!(
                m.starts_with("collective aliasing: rank 0's receive buffer of reduce_scatter (0x9000, 16 bytes) and rank 1's receive buffer"),
                "{m}"
            ),
            other => panic!("expected aliasing, got {other:?}"),
        }
        // One rank's output inside another rank's input (all_gather's 2 × 4 elements).
        let into_input = [
            at(0, Kind::AllGather, 4, 0x1000, 0x8000),
            at(1, Kind::AllGather, 4, 0x8010, 0x2000),
        ];
        assert!(
            matches!(plan(2, &into_input), Err(Error::InvalidArgument(m)) if m.contains("aliasing")),
        );
        // A send buffer that is the same rank's receive buffer of another call.
        let across_calls = [
            at(0, Kind::Send(1), 4, 0x1000, 0),
            at(1, Kind::Recv(0), 4, 0, 0x2000),
            at(1, Kind::Send(0), 4, 0x2008, 0),
            at(0, Kind::Recv(1), 4, 0, 0x3000),
        ];
        assert!(matches!(
            check_no_aliasing(2, &across_calls),
            Err(Error::InvalidArgument(m)) if m.contains("aliasing")
        ));
        // Adjacent, not overlapping; empty buffers never alias.
        assert!(
            check_no_aliasing(
                2,
                &[at(0, sum, 4, 0x1000, 0x1010), at(1, sum, 0, 0x1010, 0x1010)]
            )
            .is_ok()
        );
    }

    #[test]
    fn nccl_needs_distinct_devices_error_names_the_ranks() {
        let e = Error::DuplicateDevice {
            ordinal: 0,
            first: 0,
            second: 1,
        };
        assert!(e.to_string().contains("ranks 0 and 1"));
    }
}
