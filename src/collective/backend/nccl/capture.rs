//! One NCCL rank's collective captured into a CUDA graph (the one code path of
//! `Capture::rank_all_reduce` and its siblings): validate as an eager call, agree with
//! the peers, record the buffers, the rank's order and the launch agreement, then let
//! NCCL record the collective on the capturing stream.

use super::comm::NcclComm;
use super::gate::Gate;
use crate::access::Access;
use crate::collective::api::call::{Call, Kind, make_call};
use crate::collective::backend::interface::{RankCapture, RankSeat};
use crate::error::{Error, Result};
use crate::graph::Capture;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

/// The call as an eager call would validate it, plus no overlap of output and input
/// unless they are the one buffer of a broadcast (a captured collective borrows both
/// shared).
fn validate(device: &crate::device::Device, me: RankSeat<'_>, c: &RankCapture<'_>) -> Result<Call> {
    device.expect_same("communicator", me.device)?;
    let call = make_call(
        me.nranks,
        me.rank,
        me.device,
        c.kind,
        c.dtype,
        Some(c.send),
        Some(c.recv),
    )?;
    let in_place = matches!(c.kind, Kind::Broadcast(_));
    if !in_place && c.send.byte_span().overlaps(&c.recv.byte_span()) {
        return Err(Error::InvalidArgument(format!(
            "{}: the receive buffer overlaps the send buffer (a captured collective borrows \
             both shared; use separate buffers)",
            c.kind.name()
        )));
    }
    Ok(call)
}

/// As an eager call: the ranks agree before anything is recorded, and a call this rank
/// cannot make is told to the others at the same collective. Returns the agreed call
/// and, when the rank checks its calls, the header every launch agrees on.
fn agree(gate: &Gate, call: Result<Call>) -> Result<(Call, Option<Vec<u8>>)> {
    let mut guard = gate.check.lock().unwrap_or_else(PoisonError::into_inner);
    match (call, guard.as_mut()) {
        (Ok(call), Some(c)) => Ok((call, Some(c.agree_captured(&call)?.to_vec()))),
        (Err(e), Some(c)) => Err(c.fail(e)),
        (Ok(call), None) => Ok((call, None)),
        (Err(e), None) => Err(e),
    }
}

/// Records the buffers (output written; input read unless in place) and the rank's
/// order, claimed at each launch.
fn record_uses<'buf>(
    capture: &mut Capture<'_, 'buf>,
    nccl: &'buf NcclComm,
    c: &RankCapture<'buf>,
) -> Result<()> {
    let (t, lo, bytes) = c.recv.span();
    capture.record_span(t, Access::Write, lo, bytes)?;
    if !matches!(c.kind, Kind::Broadcast(_)) {
        let (t, lo, bytes) = c.send.span();
        capture.record_span(t, Access::Read, lo, bytes)?;
    }
    capture.record(nccl.order(), Access::Write)
}

/// Lets NCCL record `call` on the capturing stream; a failure marks the gate failed.
fn issue(capture: &mut Capture<'_, '_>, nccl: &NcclComm, gate: &Gate, call: &Call) -> Result<()> {
    // Code outside gpubind may have changed the thread's context since the capture
    // began: make the capture's device current for NCCL.
    let _current = capture.device().enter()?;
    let stream = capture.stream_handle();
    capture
        .marked(|| {
            // SAFETY: the call is validated against this rank's device, which is the
            // capture's (checked by `validate`) and current; the stream is the capturing
            // stream, so NCCL records the collective into the graph instead of running
            // it. Its buffers are live allocations of the sizes the call implies,
            // borrowed for 'buf and claimed at each launch, and do not overlap unless they
            // are one buffer (broadcast, which NCCL does in place); the communicator is
            // borrowed for 'buf, and its drop waits for the launches (the order tracker).
            unsafe { nccl.issue(call, stream) }
        })
        .inspect_err(|_| {
            // The communicator may be aborted now (`issue` aborts it on a timeout or an
            // error NCCL reports): graphs captured from it earlier stay borrowed, and
            // must not launch its kernels again.
            gate.failed.store(true, Ordering::Release);
        })
}

/// Captures one collective of the rank whose communicator is `nccl` and gate `gate`.
pub(super) fn rank_collective<'c, 'buf>(
    capture: &mut Capture<'c, 'buf>,
    nccl: &'buf NcclComm,
    gate: &'buf Gate,
    me: RankSeat<'buf>,
    c: RankCapture<'buf>,
) -> Result<()> {
    let call = validate(capture.device(), me, &c);
    let (call, header) = agree(gate, call)?;
    // Every launch goes through the gate (the failure flag, the watchdog's verdict),
    // agrees on the header when the rank checks its calls, and is watched.
    gate.watch
        .get_or_init(|| std::sync::Arc::clone(&nccl.watch));
    capture.record_agreement(gate, header.as_deref().unwrap_or(&[]));
    if call.count == 0 {
        // Nothing to move (NCCL is not called, as eagerly).
        return Ok(());
    }
    // From here a failure leaves this rank's graph without a collective its peers
    // agreed on: the graph is discarded (a launch of it would agree on the capture and
    // then not take part), and the peers are told at their next collective.
    let issued = record_uses(capture, nccl, &c).and_then(|()| issue(capture, nccl, gate, &call));
    issued.map_err(|e| {
        let e = capture.discard_graph(e);
        match gate
            .check
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            Some(check) => check.fail(e),
            None => e,
        }
    })
}
