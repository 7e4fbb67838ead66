//! The NCCL backend of a `Communicator` ([`NcclGroup`]): one NCCL communicator per rank,
//! all made by `ncclCommInitAll` and driven by one thread, a group's calls enqueued
//! between `ncclGroupStart` and `ncclGroupEnd`.

use super::comm::NcclComm;
use super::library::group;
use crate::collective::api::call::{Call, Plan};
use crate::collective::backend::interface::{GroupBackend, GroupLanes};
use crate::collective::backend::kernels::engine::Shared;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The NCCL communicators of a `Communicator`, one per rank, in rank order.
pub(crate) struct NcclGroup(Vec<NcclComm>);

impl NcclGroup {
    /// `ncclCommInitAll` over `ordinals` (distinct devices), from one thread.
    pub(crate) fn init_all(ordinals: &[usize]) -> Result<NcclGroup> {
        NcclComm::init_all(ordinals).map(NcclGroup)
    }
}

impl GroupBackend for NcclGroup {
    fn enqueue(
        &self,
        ctx: &mut ThreadContext,
        lanes: &GroupLanes<'_>,
        calls: &[Call],
        _plan: &Plan,
    ) -> Result<()> {
        let out = group(|| {
            for c in calls {
                // NCCL may have moved the thread's context: bind for real.
                ctx.forget_binding();
                let gpu = ctx.bind(&lanes.devices[c.rank])?;
                let stream = &lanes.lanes[lanes.rank_lane[c.rank]].0;
                let s = gpu.on(stream)?;
                // SAFETY: `c` was validated against this rank's device; its buffers are
                // borrowed by the group until it returns and the stream is the rank's,
                // bound now.
                unsafe { self.0[c.rank].issue(c, s.raw())? };
            }
            Ok(())
        });
        ctx.forget_binding();
        out
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
