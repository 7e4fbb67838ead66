//! [`Communicator`]: a set of ranks driven by one thread, on either backend.

use super::call::{Call, Plan, check_distinct, plan};
use super::options::{Backend, CommOptions};
use super::rank_comm::{RankComm, RankInner, World};
use crate::access::{Access, AccessTracker, StreamRef, claim_lanes};
use crate::collective::backend::kernels::engine::{self, Lane};
use crate::collective::backend::kernels::meeting::Meeting;
use crate::collective::backend::nccl;
use crate::collective::support::settle_on_error;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Event, Stream};
use std::marker::PhantomData;
use std::sync::Arc;

pub(crate) enum Engine {
    Kernels(engine::Shared),
    Nccl(Vec<nccl::NcclComm>),
}

/// A set of ranks driven by one thread (see the [module docs](crate::collective)).
pub struct Communicator {
    pub(crate) engine: Engine,
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
        let engine = match options.backend {
            Backend::Kernels => {
                let shared = engine::Shared::new(devices, options.transport)?;
                for (s, _) in &lanes {
                    shared.ensure_kernels(&ctx.bind(s.device())?)?;
                }
                Engine::Kernels(shared)
            }
            Backend::Nccl => {
                let ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
                let comms = nccl::NcclComm::init_all(&ordinals);
                ctx.forget_binding();
                Engine::Nccl(comms?)
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
        let make = |rank: usize, inner: RankInner| RankComm {
            rank,
            nranks,
            device: Arc::clone(&devices[rank]),
            inner,
        };
        match options.backend {
            Backend::Kernels => {
                let world = Arc::new(World {
                    shared: engine::Shared::new(devices, options.transport)?,
                    meet: Meeting::new(),
                    ranks: (0..nranks).collect(),
                    timeout: options.timeout,
                });
                Ok((0..nranks)
                    .map(|r| {
                        make(
                            r,
                            RankInner::Kernels {
                                world: Arc::clone(&world),
                                event: None,
                            },
                        )
                    })
                    .collect())
            }
            Backend::Nccl => {
                check_distinct(devices)?;
                let id = nccl::unique_id()?;
                Ok((0..nranks)
                    .map(|r| {
                        make(
                            r,
                            RankInner::Nccl {
                                id: Some(id),
                                timeout: options.timeout,
                                comm: None,
                                gate: Default::default(),
                            },
                        )
                    })
                    .collect())
            }
        }
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
        matches!(&self.engine, Engine::Kernels(s) if s.is_staged())
    }

    /// Waits until all work enqueued on the communicator's streams has finished.
    pub fn synchronize(&self, ctx: &mut ThreadContext) -> Result<()> {
        for (stream, _) in &self.lanes {
            let gpu = ctx.bind(stream.device())?;
            gpu.on(stream)?.synchronize()?;
        }
        Ok(())
    }

    fn engine_lanes(&self) -> Vec<Lane> {
        self.lanes
            .iter()
            .map(|(s, e)| Lane {
                device: Arc::clone(s.device()),
                stream_ref: s.to_ref(),
                // SAFETY: both live in `self.lanes` for the whole group, which borrows
                // `self`; they are only used with their device bound.
                stream: unsafe { s.raw() },
                // SAFETY: as above.
                event: unsafe { e.raw() },
            })
            .collect()
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
        let lane_refs: Vec<StreamRef> = self.lanes.iter().map(|(s, _)| s.to_ref()).collect();
        let out = self.enqueue(ctx, calls, &plan);
        settle_on_error(&lane_refs, out)
    }

    fn enqueue(&self, ctx: &mut ThreadContext, calls: &[Call], plan: &Plan) -> Result<()> {
        match &self.engine {
            Engine::Kernels(shared) => {
                let lanes = self.engine_lanes();
                for coll in &plan.colls {
                    engine::collective(ctx, shared, &lanes, &self.rank_lane, coll)?;
                }
                for (s, r) in &plan.p2p {
                    let pair = (self.rank_lane[s.rank], self.rank_lane[r.rank]);
                    engine::p2p(ctx, shared, &lanes, pair, s, r)?;
                }
                Ok(())
            }
            Engine::Nccl(comms) => {
                let out = nccl::group(|| {
                    for c in calls {
                        // NCCL may have moved the thread's context: bind for real.
                        ctx.forget_binding();
                        let gpu = ctx.bind(&self.devices[c.rank])?;
                        let stream = &self.lanes[self.rank_lane[c.rank]].0;
                        let s = gpu.on(stream)?;
                        // SAFETY: `c` was validated against this rank's device; its
                        // buffers are borrowed by the group until it returns and the
                        // stream is the rank's, bound now.
                        unsafe { comms[c.rank].issue(c, s.raw())? };
                    }
                    Ok(())
                });
                ctx.forget_binding();
                out
            }
        }
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
        if work_may_run && let Engine::Nccl(comms) = &mut self.engine {
            // On each device's release thread, bounded like the waits above.
            for (c, d) in comms.iter_mut().zip(&self.devices) {
                c.abort_bounded(Some(d));
            }
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
