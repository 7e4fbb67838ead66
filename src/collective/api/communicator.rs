//! [`Communicator`]: a set of ranks driven by one thread, on either backend.

use super::call::{Call, Plan, check_distinct, plan};
use super::options::{Backend, CommOptions};
use super::rank_comm::RankComm;
use crate::access::{Access, AccessTracker, StreamRef, claim_lanes};
use crate::collective::backend::interface::{GroupBackend, GroupLanes, RankBackend};
use crate::collective::backend::kernels::KernelsRank;
use crate::collective::backend::kernels::engine::Shared;
use crate::collective::backend::nccl::{self, NcclGroup, NcclRank};
use crate::collective::support::settle_on_error;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Event, Stream};
use std::marker::PhantomData;
use std::sync::Arc;

/// A set of ranks driven by one thread (see the [module docs](crate::collective)).
pub struct Communicator {
    /// The backend that runs the groups' calls.
    pub(crate) engine: Box<dyn GroupBackend>,
    /// Device of each rank.
    pub(crate) devices: Vec<Arc<Device>>,
    /// Lane (stream + barrier event) of each rank.
    rank_lane: Vec<usize>,
    lanes: Vec<(Stream, Event)>,
    backend: Backend,
    /// NCCL communicators must not be used by two threads at once.
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl Communicator {
    /// Creates a communicator whose rank `r` lives on `devices[r]`.
    ///
    /// Own kernels: ranks of one device share one stream; the kernels are compiled
    /// here, once per device. NCCL: `ncclCommInitAll`, a stream per rank; devices must
    /// be distinct ([`Error::DuplicateDevice`]).
    pub fn new(
        ctx: &mut ThreadContext,
        devices: &[Arc<Device>],
        options: CommOptions,
    ) -> Result<Communicator> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "a communicator needs at least one rank".into(),
            ));
        }
        let mut rank_lane = Vec::with_capacity(devices.len());
        let mut lanes: Vec<(Stream, Event)> = Vec::new();
        if options.backend == Backend::Nccl {
            nccl::api()?;
            check_distinct(devices)?;
        }
        for d in devices {
            let shared = options.backend == Backend::Kernels;
            match lanes
                .iter()
                .position(|(s, _)| shared && s.device().ordinal() == d.ordinal())
            {
                Some(l) => rank_lane.push(l),
                None => {
                    let gpu = ctx.bind(d)?;
                    lanes.push((gpu.new_stream()?, gpu.new_event(false)?));
                    rank_lane.push(lanes.len() - 1);
                }
            }
        }
        let engine: Box<dyn GroupBackend> = match options.backend {
            Backend::Kernels => {
                let shared = Shared::new(devices, options.transport)?;
                for (s, _) in &lanes {
                    shared.ensure_kernels(&ctx.bind(s.device())?)?;
                }
                Box::new(shared)
            }
            Backend::Nccl => {
                let ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
                let group = NcclGroup::init_all(&ordinals);
                ctx.forget_binding();
                Box::new(group?)
            }
        };
        Ok(Communicator {
            engine,
            devices: devices.to_vec(),
            rank_lane,
            lanes,
            backend: options.backend,
            _not_sync: PhantomData,
        })
    }

    /// One [`RankComm`] per rank, for the one-thread-per-GPU pattern. Each thread binds
    /// its rank's device and passes a stream of it to every call.
    ///
    /// Own kernels: ranks may share a device (each thread's stream is its own lane).
    /// NCCL: gets an `ncclUniqueId` here; each rank initialises its NCCL communicator
    /// on its first call (which therefore waits for all ranks' first calls, at most
    /// [`CommOptions::timeout`]). Dropping an NCCL `RankComm` waits for its last call
    /// at most `GPUBIND_DROP_TIMEOUT`, then aborts the communicator instead of
    /// destroying it (docs/collective.md, "Dropping an NCCL `RankComm`").
    pub fn init_all(devices: &[Arc<Device>], options: CommOptions) -> Result<Vec<RankComm>> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "a communicator needs at least one rank".into(),
            ));
        }
        let nranks = devices.len();
        let backends: Vec<Box<dyn RankBackend>> = match options.backend {
            Backend::Kernels => KernelsRank::all(devices, options.transport, options.timeout)?
                .into_iter()
                .map(|r| Box::new(r) as Box<dyn RankBackend>)
                .collect(),
            Backend::Nccl => {
                check_distinct(devices)?;
                NcclRank::lazy_all(devices, options.timeout)?
                    .into_iter()
                    .map(|r| Box::new(r) as Box<dyn RankBackend>)
                    .collect()
            }
        };
        Ok(backends
            .into_iter()
            .enumerate()
            .map(|(rank, inner)| RankComm {
                rank,
                nranks,
                device: Arc::clone(&devices[rank]),
                inner,
            })
            .collect())
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false: a communicator has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device of rank `rank`.
    pub fn device(&self, rank: usize) -> Option<&Arc<Device>> {
        self.devices.get(rank)
    }

    /// The stream rank `rank`'s work is enqueued on (shared by the ranks of one device
    /// with the own kernels). Make it wait for your events before a group, or record
    /// events on it after one.
    pub fn stream(&self, rank: usize) -> Option<&Stream> {
        self.rank_lane.get(rank).map(|&l| &self.lanes[l].0)
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether the own kernels stage data through pinned host memory.
    pub fn is_host_staged(&self) -> bool {
        self.engine.is_host_staged()
    }

    /// Waits until all work enqueued on the communicator's streams has finished.
    pub fn synchronize(&self, ctx: &mut ThreadContext) -> Result<()> {
        for (stream, _) in &self.lanes {
            let gpu = ctx.bind(stream.device())?;
            gpu.on(stream)?.synchronize()?;
        }
        Ok(())
    }

    pub(crate) fn run(
        &self,
        ctx: &mut ThreadContext,
        calls: &[Call],
        tracked: &[(usize, &AccessTracker, Access)],
    ) -> Result<()> {
        let plan = plan(self.len(), calls)?;
        // Each rank's buffers are used on its lane's stream (the engine's barriers order
        // the other lanes after it): order that stream after their pending uses.
        // Claimed from before the enqueue until after it, so nothing slips in between.
        let _claim = claim_lanes(
            tracked
                .iter()
                .map(|&(rank, tracker, access)| {
                    (tracker, access, self.lanes[self.rank_lane[rank]].0.to_ref())
                })
                .collect(),
        )?;
        let out = self.enqueue(ctx, calls, &plan);
        match self.backend {
            Backend::Kernels => {
                let lane_refs: Vec<StreamRef> =
                    self.lanes.iter().map(|(s, _)| s.to_ref()).collect();
                settle_on_error(&lane_refs, out)
            }
            // A failed NCCL group launched nothing of its own (NCCL cancelled it), or its
            // communicators were aborted and its lanes waited for with a limit
            // (`backend::nccl::group`); each rank's buffers are used on its own lane
            // only, which the claim records: no wait here.
            Backend::Nccl => out,
        }
    }

    fn enqueue(&self, ctx: &mut ThreadContext, calls: &[Call], plan: &Plan) -> Result<()> {
        let lanes = GroupLanes {
            devices: &self.devices,
            rank_lane: &self.rank_lane,
            lanes: &self.lanes,
        };
        self.engine.enqueue(ctx, &lanes, calls, plan)
    }
}

#[cfg(all(feature = "nccl", any(test, feature = "test-seams")))]
impl Communicator {
    /// Test seam: from now on, on this thread, gpubind's own step for call `call` of
    /// every NCCL group (0-based, in the order the group's closure made the calls) fails
    /// with `Error::InvalidArgument` naming it, after the calls before it were handed to
    /// NCCL, as a device poisoned by another thread in between would; `None` turns it
    /// off. Not part of the API.
    #[doc(hidden)]
    pub fn fail_nccl_group_call_for_test(call: Option<usize>) {
        crate::collective::backend::nccl::group_seam::fail_step_at(call);
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Let pending collectives finish before the streams, NCCL communicators and
        // staging buffers go away, for at most GPUBIND_DROP_TIMEOUT in all.
        // If a lane's wait fails because its context is poisoned (it runs no more work),
        // they go anyway. If it gives up on work still running (a collective waiting for
        // a peer that died), the NCCL communicators are aborted (`ncclCommAbort` is
        // NCCL's way to end pending operations without waiting), the own-kernel modules
        // are leaked and staging buffers, which wait for their own uses, are leaked too:
        // nothing is freed under running work, and the drop returns.
        let limit = crate::teardown::drop_wait::drop_timeout();
        let deadline = std::time::Instant::now().checked_add(limit);
        let mut work_may_run = false;
        for (stream, _) in &self.lanes {
            let ordinal = Some(stream.device().ordinal());
            if let Err(e) = stream.to_ref().synchronize_within(deadline, limit) {
                let runs = !crate::teardown::faults::nothing_runs_after(&e);
                work_may_run |= runs;
                crate::teardown::faults::report_drop(
                    format_args!("a Communicator"),
                    ordinal,
                    "waiting for its lane's pending collectives",
                    &e,
                    if runs {
                        "its NCCL communicators are aborted; kernel modules and staging \
                         buffers still in use are leaked"
                    } else {
                        "its streams, communicators and staging are released anyway: a \
                         poisoned context runs no more work"
                    },
                );
            }
        }
        if work_may_run {
            // On each device's release thread, bounded like the waits above.
            self.engine.abort_pending(&self.devices);
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("backend", &self.backend)
            .field(
                "devices",
                &self.devices.iter().map(|d| d.ordinal()).collect::<Vec<_>>(),
            )
            .field("lanes", &self.lanes.len())
            .finish()
    }
}
