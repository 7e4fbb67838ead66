//! The NCCL backend of a `Communicator` ([`NcclGroup`]): one NCCL communicator per rank,
//! all made by `ncclCommInitAll` and driven by one thread, a group's calls enqueued
//! between `ncclGroupStart` and `ncclGroupEnd`.
//!
//! A part handed to NCCL inside a group waits on the GPU for its peers' parts, so a group
//! must never end with some ranks' parts handed over and another's missing. The order of
//! [`run_group`] keeps it so: every step of gpubind's that can fail (binding each rank's
//! device, which refuses a poisoned one; the stream's device; the communicator's state)
//! runs for every call before `ncclGroupStart`. Should a step still fail inside the group
//! (a device poisoned by another thread in between), the group is cancelled: one call NCCL
//! refuses records an error in the group, and NCCL then launches none of its parts
//! (NCCL makes a group atomic: `ncclGroupEnd` after a failed call cancels every
//! operation of the group). Should `ncclGroupEnd` report success all the same, or fail
//! itself (NCCL may have launched some ranks' parts before it failed), every rank's
//! communicator is aborted and its lane waited for, both bounded by
//! `GPUBIND_DROP_TIMEOUT`, and a device whose abort or lane does not finish in time is
//! poisoned (its buffers then leak instead of being freed under the work). No path waits
//! without a limit.

use super::comm::{NcclComm, wait_for_abort};
use super::library::{Api, api, cancel_group};
use crate::collective::api::call::{Call, Plan};
use crate::collective::backend::interface::{GroupBackend, GroupLanes};
use crate::collective::backend::kernels::engine::Shared;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::Arc;
use std::time::Instant;

/// The NCCL communicators of a `Communicator`, one per rank, in rank order.
pub(crate) struct NcclGroup(Vec<NcclComm>);

impl NcclGroup {
    /// `ncclCommInitAll` over `ordinals` (distinct devices), from one thread.
    pub(crate) fn init_all(ordinals: &[usize]) -> Result<NcclGroup> {
        NcclComm::init_all(ordinals).map(NcclGroup)
    }
}

/// The steps of one group's enqueue, in the order [`run_group`] makes them: NCCL's for
/// the real group, made up for the tests of the order.
pub(super) trait GroupSteps {
    /// gpubind's checks for call `i`, before `ncclGroupStart`: everything that can
    /// refuse the call (a poisoned device, a stream of another device, a failed
    /// communicator).
    fn preflight(&mut self, i: usize) -> Result<()>;
    /// `ncclGroupStart`.
    fn start(&mut self) -> Result<()>;
    /// gpubind's step for call `i` inside the group, just before it is handed over
    /// (binding its rank's device): checked in [`preflight`](Self::preflight), so it
    /// fails only if something changed since.
    fn step(&mut self, i: usize) -> Result<()>;
    /// Hands call `i` to NCCL (an error is NCCL's, recorded in the group by NCCL).
    fn hand(&mut self, i: usize) -> Result<()>;
    /// Makes NCCL record an error in the open group, whose first `handed` calls were
    /// handed over, so that `ncclGroupEnd` launches none of its parts.
    fn cancel(&mut self, handed: usize);
    /// `ncclGroupEnd`.
    fn end(&mut self) -> Result<()>;
    /// After a group whose parts may have been launched although it failed (a cancel
    /// that `ncclGroupEnd` did not honour, or `ncclGroupEnd`'s own failure): aborts the
    /// communicators and waits for their lanes, bounded; poisons what does not finish.
    fn abort_launched(&mut self);
}

/// One group of `n` calls through `s`; see the [module docs](self) for why no path
/// can leave a part waiting for a missing peer, or wait without a limit.
pub(super) fn run_group(s: &mut impl GroupSteps, n: usize) -> Result<()> {
    for i in 0..n {
        s.preflight(i)?;
    }
    s.start()?;
    let mut handed = 0;
    let mut failed = None;
    for i in 0..n {
        if let Err(e) = s.step(i).and_then(|()| s.hand(i)) {
            failed = Some(e);
            break;
        }
        handed += 1;
    }
    let Some(e) = failed else {
        let end = s.end();
        if let Err(nccl) = &end
            && handed > 0
        {
            // NCCL failed inside `ncclGroupEnd`, which may have launched some ranks'
            // parts first: they would wait for the others' for ever.
            log::error!(
                "gpubind: ncclGroupEnd failed ({nccl}) with {handed} call(s) of the group \
                 handed over: its communicators are aborted"
            );
            s.abort_launched();
        }
        return end;
    };
    if handed > 0 {
        // NCCL records its own failures in the group; a step of gpubind's that failed
        // is recorded by a call NCCL refuses.
        s.cancel(handed);
    }
    match s.end() {
        // Cancelled: NCCL launched nothing of the group.
        Err(end) => log::debug!("gpubind: ncclGroupEnd after a failed call: {end}"),
        Ok(()) if handed > 0 => {
            log::error!(
                "gpubind: ncclGroupEnd reported success for an NCCL group that failed \
                 after {handed} call(s) were handed over ({e}): its communicators are \
                 aborted"
            );
            s.abort_launched();
        }
        Ok(()) => {}
    }
    Err(e)
}

/// The real steps: NCCL's calls on a `Communicator`'s NCCL communicators.
struct NcclSteps<'a, 'l> {
    api: &'static Api,
    ctx: &'a mut ThreadContext,
    lanes: &'a GroupLanes<'l>,
    calls: &'a [Call],
    comms: &'a [NcclComm],
    /// Each call's stream, found by the preflight.
    streams: Vec<sys::CUstream>,
}

impl GroupSteps for NcclSteps<'_, '_> {
    fn preflight(&mut self, i: usize) -> Result<()> {
        let (rank, lanes) = (self.calls[i].rank, self.lanes);
        if let Some(v) = self.comms[rank].verdict() {
            return Err(v);
        }
        let stream = &lanes.lanes[lanes.rank_lane[rank]].0;
        let gpu = self.ctx.bind(&lanes.devices[rank])?;
        gpu.on(stream)?;
        // SAFETY: only kept for the group's calls, which bind this device first; the
        // stream is the communicator's and outlives the group.
        self.streams.push(unsafe { stream.raw() });
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        // SAFETY: no arguments; `run_group` pairs it with `end`.
        self.api
            .check("ncclGroupStart", unsafe { (self.api.group_start)() })
    }

    fn step(&mut self, i: usize) -> Result<()> {
        #[cfg(any(test, feature = "test-seams"))]
        seam::check(i)?;
        let (c, lanes) = (&self.calls[i], self.lanes);
        let gpu = self.ctx.bind(&lanes.devices[c.rank])?;
        gpu.on(&lanes.lanes[lanes.rank_lane[c.rank]].0)?;
        if c.count > 0 {
            self.comms[c.rank].watch.owner_enter()?;
        }
        Ok(())
    }

    fn hand(&mut self, i: usize) -> Result<()> {
        let c = &self.calls[i];
        if c.count == 0 {
            // Nothing to move; empty buffers have null addresses, which NCCL may reject.
            return Ok(());
        }
        let comm = &self.comms[c.rank];
        // SAFETY: `c` was validated against this rank's device; its buffers are
        // borrowed by the group until it returns; the stream is the rank's, whose device
        // `step` bound; the owner is inside the communicator's gate.
        let handed = unsafe { comm.issue_inside(self.api, c, self.streams[i]) };
        comm.owner_leave();
        handed
    }

    fn cancel(&mut self, handed: usize) {
        // On the communicator of a call NCCL has (not the failed call's: its device may
        // be the poisoned one).
        let Some((i, c)) = self.calls[..handed]
            .iter()
            .enumerate()
            .find(|(_, c)| c.count > 0)
        else {
            // Every call handed over was empty: NCCL has none of them.
            return;
        };
        let comm = &self.comms[c.rank];
        if comm.watch.owner_enter().is_err() {
            // Not reached (only the drop fails a group's communicator); `ncclGroupEnd`
            // then reports success and `abort_launched` follows.
            return;
        }
        // SAFETY: a live communicator of this group; the owner is inside its gate.
        let refused = unsafe { cancel_group(self.api, comm.raw, self.streams[i]) };
        comm.owner_leave();
        if !refused {
            log::error!("gpubind: NCCL accepted the call meant to cancel a failed group");
        }
    }

    fn end(&mut self) -> Result<()> {
        // SAFETY: closes the group `start` opened.
        self.api
            .check("ncclGroupEnd", unsafe { (self.api.group_end)() })
    }

    fn abort_launched(&mut self) {
        abort_and_settle(self.api, self.comms, self.lanes);
    }
}

/// Aborts every communicator of the group, then waits for every lane, all within one
/// `GPUBIND_DROP_TIMEOUT`; a device whose abort does not return, or whose lane does not
/// finish, by then is poisoned, so its buffers leak instead of being freed under a
/// launched part. With an NCCL that has no `ncclCommAbort` (older than 2.14) the lanes
/// are waited for alone.
fn abort_and_settle(api: &Api, comms: &[NcclComm], lanes: &GroupLanes<'_>) {
    let limit = crate::teardown::drop_wait::drop_timeout();
    let deadline = Instant::now().checked_add(limit);
    let left = || deadline.map_or(limit, |d| d.saturating_duration_since(Instant::now()));
    if api.nonblocking.is_some() {
        for (comm, d) in comms.iter().zip(lanes.devices) {
            let _ = comm.watch.device.set(Arc::clone(d));
            // The verdict every later call returns; the abort runs on a thread of its
            // own.
            comm.watch.fail(group_aborted(), false);
        }
        for comm in comms {
            wait_for_abort(&comm.watch, comm.nranks, left());
        }
    }
    for (stream, _) in lanes.lanes {
        if let Err(e) = stream.to_ref().synchronize_within(deadline, limit)
            && !crate::teardown::faults::nothing_runs_after(&e)
        {
            stream
                .device()
                .poison_with("ncclGroupEnd", sys::CUresult::CUDA_ERROR_TIMEOUT);
        }
    }
}

/// The verdict of a group's communicators after [`abort_and_settle`].
fn group_aborted() -> Error {
    Error::InvalidArgument(
        "this NCCL communicator was aborted: a group failed after calls of its ranks were \
         handed to NCCL, which may have launched some of them: make a new one"
            .into(),
    )
}

impl GroupBackend for NcclGroup {
    fn enqueue(
        &self,
        ctx: &mut ThreadContext,
        lanes: &GroupLanes<'_>,
        calls: &[Call],
        _plan: &Plan,
    ) -> Result<()> {
        let api = api()?;
        // NCCL (the CUDA runtime) may change the thread's current context: put it back.
        let _restore = super::library::RestoreCurrent::new()?;
        let mut steps = NcclSteps {
            api,
            ctx,
            lanes,
            calls,
            comms: &self.0,
            streams: Vec::with_capacity(calls.len()),
        };
        run_group(&mut steps, calls.len())
    }

    fn abort_pending(&mut self, devices: &[Arc<Device>]) {
        // On each device's release thread, bounded like the drop's waits.
        for (c, d) in self.0.iter_mut().zip(devices) {
            c.abort_bounded(Some(d));
        }
    }

    fn capturable_engine(&self) -> Result<&Shared> {
        Err(Error::NotCapturable {
            what: "an NCCL collective of a Communicator",
            reason: "one thread drives every rank's device here, and NCCL documents that \
                     several GPUs per process with graph capture may deadlock \
                     (cudaGraphLaunch may block, preventing the launch on the other \
                     GPUs); capture each rank's part from its own thread or process with \
                     Capture::rank_all_reduce on an NCCL RankComm \
                     (Communicator::init_all, RankComm::init_process), or use a \
                     communicator of the own-kernel backend (CommOptions::kernels()) with \
                     every rank on the capturing device"
                .into(),
        })
    }
}

/// The test seam that fails gpubind's step for one call inside a group, after the calls
/// before it were handed to NCCL (on the calling thread only).
#[cfg(any(test, feature = "test-seams"))]
pub(crate) mod seam {
    use crate::error::{Error, Result};
    use std::cell::Cell;

    thread_local! {
        static FAIL_AT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// From now on, on this thread, the step of call `call` of every NCCL group fails.
    pub(crate) fn fail_step_at(call: Option<usize>) {
        FAIL_AT.with(|f| f.set(call));
    }

    pub(super) fn check(i: usize) -> Result<()> {
        if FAIL_AT.with(Cell::get) == Some(i) {
            return Err(Error::InvalidArgument(format!(
                "test seam: gpubind's step for call #{i} of the NCCL group failed"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
