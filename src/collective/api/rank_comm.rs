//! [`RankComm`]: one rank of a communicator, for the thread (or process) that drives
//! that rank's device.

use super::call::{Buf, Call, Kind, buf, check_matched, check_pair, make_call, rank_error, uses};
use super::rank_capture::Gate;
use super::types::{CollectiveType, DType, Op};
#[cfg(doc)]
use super::{CommOptions, Communicator};
use crate::access::{Access, AccessTracker, StreamRef, claim_lanes};
use crate::collective::backend::kernels::engine::{self, Enter, Lane};
use crate::collective::backend::kernels::meeting::{Key, Meeting};
use crate::collective::backend::nccl;
#[cfg(feature = "ipc")]
use crate::collective::backend::procs;
#[cfg(all(doc, feature = "ipc"))]
use crate::collective::backend::{PROCESS_STAGING_BYTES, ProcessGroup};
use crate::collective::bootstrap::{LaunchEnv, NcclUniqueId};
#[cfg(doc)]
use crate::collective::callcheck::CallCheck;
use crate::collective::support::settle_on_error;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use crate::stream::{BoundStream, Event};
use std::sync::Arc;

/// A tracker of a buffer posted to a 1:1 meeting by a rank thread.
#[derive(Clone, Copy)]
struct TrackerPtr(*const AccessTracker);

// SAFETY: the pointer is dereferenced only by the thread that runs the meeting, while the
// posting thread is blocked in `Meeting::meet` with the buffer borrowed: it returns only
// after the meeting's closure has finished, or (timeout, a departed peer) after taking its
// post back under the meeting's lock, which the run holds from taking the posts to its
// end, so a withdrawn post is never run.
unsafe impl Send for TrackerPtr {}

/// One rank's part of a 1:1 collective: its lane, its validated call and its buffers.
pub(crate) struct RankPost {
    lane: Lane,
    call: Call,
    uses: Vec<(TrackerPtr, Access)>,
}

/// Claims every rank's buffers on that rank's lane, then runs `enqueue` with the lanes
/// and calls, holding the claim until it returns. The first rank's error, if any, wins.
fn enqueue_posts(
    posts: Vec<Result<RankPost>>,
    enqueue: impl FnOnce(&[Lane], &[Call]) -> Result<()>,
) -> Result<()> {
    let posts = posts.into_iter().collect::<Result<Vec<_>>>()?;
    let mut claims = Vec::new();
    for p in &posts {
        for &(TrackerPtr(t), access) in &p.uses {
            // SAFETY: see `TrackerPtr`: the posting thread keeps the buffer borrowed until
            // this meeting has run.
            let tracker = unsafe { &*t };
            claims.push((tracker, access, p.lane.stream_ref.clone()));
        }
    }
    let _claim = claim_lanes(claims)?;
    let (lanes, calls): (Vec<Lane>, Vec<Call>) =
        posts.into_iter().map(|p| (p.lane, p.call)).unzip();
    let refs: Vec<StreamRef> = lanes.iter().map(|l| l.stream_ref.clone()).collect();
    settle_on_error(&refs, enqueue(&lanes, &calls))
}

/// What the threads of one own-kernel 1:1 communicator share.
pub(crate) struct World {
    pub(crate) shared: engine::Shared,
    pub(crate) meet: Meeting<Result<RankPost>>,
    /// `0..nranks`: the parties of a collective.
    pub(crate) ranks: Vec<usize>,
    /// How long a rank waits for the others.
    pub(crate) timeout: std::time::Duration,
}

pub(crate) enum RankInner {
    Kernels {
        world: Arc<World>,
        event: Option<Event>,
    },
    Nccl {
        /// The id of a lazily made communicator (`None`: made already, or tried and
        /// failed).
        id: Option<nccl::UniqueId>,
        /// How long the lazy initialisation and each call wait for NCCL.
        timeout: std::time::Duration,
        comm: Option<nccl::NcclComm>,
        /// What the launches of graphs holding this rank's captured collectives go
        /// through, with the agreement on every collective through rank 0 (one rank per
        /// process from `from_launch`; `None`: not checked), which eager calls
        /// (`&mut self`) reach without locking.
        gate: Box<Gate>,
    },
    /// Own kernels, one rank per process on one machine.
    #[cfg(feature = "ipc")]
    Procs(Box<procs::ProcsRank>),
}

/// One rank of a communicator, for the thread that drives that rank's device (see
/// [`Communicator::init_all`]). `Send`, not `Sync`.
pub struct RankComm {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: Arc<Device>,
    pub(crate) inner: RankInner,
}

impl Drop for RankComm {
    fn drop(&mut self) {
        // NCCL: a graph that captured this rank's collectives and was forgotten
        // (`mem::forget`: its borrow of this RankComm ended, it was never destroyed) keeps
        // NCCL's finalize, destroy and abort waiting for ever for its destruction, and its
        // launches may still run: the communicator is leaked (valid for them), not hung on.
        if let RankInner::Nccl { comm, gate, .. } = &mut self.inner {
            let forgotten = gate.forgotten_graphs();
            if forgotten > 0
                && let Some(c) = comm.take()
            {
                // Without NCCL the stand-in has nothing to drop (clippy's
                // forget_non_drop there).
                #[allow(clippy::forget_non_drop)]
                std::mem::forget(c);
                crate::teardown::faults::report_drop(
                    format_args!("an NCCL communicator of {} ranks", self.nranks),
                    Some(self.device.ordinal()),
                    crate::teardown::faults::RELEASE,
                    &Error::InvalidArgument(format!(
                        "{forgotten} CUDA graph(s) holding its captured collectives were \
                         forgotten (never dropped), and NCCL destroys a communicator only \
                         after every graph that captured it"
                    )),
                    crate::teardown::faults::LEAKED,
                );
            }
        }
        // Own kernels: the other ranks must not wait for this one any more.
        if let RankInner::Kernels { world, .. } = &self.inner {
            let why = if std::thread::panicking() {
                "its thread panicked (its RankComm was dropped while unwinding)"
            } else {
                "its RankComm was dropped"
            };
            world.meet.depart(self.rank, why);
        }
    }
}

impl std::fmt::Debug for RankComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankComm")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl RankComm {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// This rank's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// One rank of an NCCL communicator whose ranks are separate processes (on this
    /// machine or others): rank `rank` of `nranks`, on `device`, meeting the others by
    /// `id` (rank 0's [`NcclUniqueId::new`], handed to every rank, e.g. by
    /// [`LaunchEnv::exchange_id`]). The same calls as any `RankComm` follow.
    ///
    /// NCCL's initialisation is non-blocking (`ncclCommInitRankConfig`, `blocking = 0`)
    /// and polled: if the other ranks have not all joined within `timeout` the
    /// communicator is aborted (`ncclCommAbort`) and [`Error::PeerTimeout`] returned;
    /// an error NCCL reports is [`Error::Nccl`]. Every later call first polls
    /// `ncclCommGetAsyncError` and waits at most `timeout` for NCCL to enqueue it. (With
    /// NCCL older than 2.14 initialisation is the blocking `ncclCommInitRank`, not
    /// bounded.) NCCL needs a distinct GPU per rank, across processes too.
    ///
    /// While its calls run on the GPU, NCCL's watchdog thread watches them: on an error
    /// NCCL reports (a peer died) or a call unfinished after `timeout`, the communicator
    /// is aborted (`ncclCommAbort`, on a thread of its own); [`check`](Self::check),
    /// [`wait`](Self::wait) and every later call then return that error. That a plain
    /// stream wait also returns after the abort is confirmed for a call queued behind
    /// other work (one rank, one GPU: it returned `Ok(())` once that work ended) and
    /// assumed, not yet confirmed, for a kernel already waiting for a dead peer
    /// (docs/collective.md, "The NCCL watchdog").
    ///
    /// Dropping it is bounded by `GPUBIND_DROP_TIMEOUT`: it waits for the rank's last
    /// call while polling `ncclCommGetAsyncError`, finalizes the communicator
    /// (`ncclCommFinalize`, polled), then destroys it; a timeout or an error NCCL reports
    /// (a dead peer) aborts it (`ncclCommAbort`) instead, with a warning logged.
    ///
    /// Without the `nccl` feature: [`Error::FeatureDisabled`].
    pub fn init_process(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        rank: usize,
        nranks: usize,
        id: &NcclUniqueId,
        timeout: std::time::Duration,
    ) -> Result<RankComm> {
        if rank >= nranks {
            return Err(rank_error("rank", rank, nranks));
        }
        if i32::try_from(nranks).is_err() {
            return Err(Error::InvalidArgument(format!(
                "{nranks} ranks is more than NCCL takes"
            )));
        }
        nccl::api()?;
        let comm = {
            // NCCL takes the device from the thread's current context.
            let _gpu = ctx.bind(device)?;
            nccl::NcclComm::init_rank_process(device, nranks, id.as_bytes(), rank, timeout)?
        };
        ctx.forget_binding();
        Ok(RankComm {
            rank,
            nranks,
            device: Arc::clone(device),
            inner: RankInner::Nccl {
                id: None,
                timeout,
                comm: Some(comm),
                gate: Box::default(),
            },
        })
    }

    /// This process's rank of the job `env` describes, on NCCL: the id is exchanged
    /// ([`LaunchEnv::exchange_id`]), then [`init_process`](Self::init_process) with
    /// `env.rank`, `env.world_size` and `env.timeout`. `device` is usually
    /// `Device::get(env.local_rank)` (or 0 where the launcher gives each process one
    /// GPU through `CUDA_VISIBLE_DEVICES`).
    ///
    /// With [`LaunchEnv::check_calls`] (`GPUBIND_CHECK_CALLS`, on by default) the
    /// rendezvous connections are kept as a [`CallCheck`]: before each collective the
    /// ranks agree on the op, type, length and root through rank 0, so ranks that
    /// disagree all get the same [`Error::InvalidArgument`] ("collective mismatch …")
    /// with nothing enqueued, and a rank that failed its own call, exited or stays away
    /// is [`Error::PeerFailed`] / [`Error::PeerTimeout`] naming it on every other rank.
    /// One round trip to rank 0 per collective; `send`/`recv` are not checked. See
    /// docs/collective.md, "Ranks agree before NCCL enqueues".
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::collective::LaunchEnv;
    /// use gpubind::{Device, Op, RankComm, ThreadContext};
    /// let env = LaunchEnv::from_env()?; // torchrun, mpirun, srun
    /// let mut ctx = ThreadContext::acquire()?;
    /// let dev = Device::get(env.local_rank)?;
    /// let mut comm = RankComm::from_launch(&mut ctx, &dev, &env)?;
    /// let gpu = ctx.bind(&dev)?;
    /// let stream = gpu.new_stream()?;
    /// let send = gpu.clone_htod(&[env.rank as f32; 1024])?;
    /// let mut sum = gpu.alloc_zeros::<f32>(1024)?;
    /// let s = gpu.on(&stream)?;
    /// comm.all_reduce(&s, &send, &mut sum, Op::Sum)?;
    /// s.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn from_launch(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        env: &LaunchEnv,
    ) -> Result<RankComm> {
        let (id, check) = if env.check_calls {
            env.exchange_id_checked_with(NcclUniqueId::new)?
        } else {
            (env.exchange_id()?, None)
        };
        let mut comm = Self::init_process(ctx, device, env.rank, env.world_size, &id, env.timeout)?;
        if let RankInner::Nccl { gate, .. } = &mut comm.inner {
            *gate.check_mut() = check;
        }
        Ok(comm)
    }

    /// One rank of an own-kernel communicator whose ranks are separate processes on
    /// this machine (any number of them per GPU: NCCL refuses that): rank `rank` of
    /// `nranks`, on `device`, in the job named `key` (any string the ranks share). The
    /// same calls as any `RankComm` follow, for every op and type.
    ///
    /// Each rank's staging buffer ([`PROCESS_STAGING_BYTES`]) comes from an IPC memory
    /// pool and is imported by every peer, with two interprocess events; a host-side
    /// [`ProcessGroup`] (Unix sockets) carries one header per call, so ranks that
    /// disagree on the op, the type, the length or the root all get the same typed
    /// error before anything is enqueued. Every wait is bounded by `timeout` (one
    /// deadline for the start, for each call and for the drop, not one per wait): a peer
    /// that exits or is killed is [`Error::PeerFailed`] naming it, one that stays away
    /// [`Error::PeerTimeout`]; after an error the communicator is unusable. Each call
    /// returns once its reads are enqueued, which is after the peers' inputs have been
    /// staged (host-side waits, never a stream waiting on another process). Dropping
    /// waits (at most `timeout`) for the peers to release this rank's staging; past
    /// it the staging is leaked, not freed under them. See docs/collective.md,
    /// "One node, one rank per process".
    #[cfg(feature = "ipc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ipc")))]
    pub fn init_process_kernels(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        rank: usize,
        nranks: usize,
        key: &str,
        timeout: std::time::Duration,
    ) -> Result<RankComm> {
        let p = procs::ProcsRank::new(ctx, device, rank, nranks, key, timeout)?;
        Ok(RankComm {
            rank,
            nranks,
            device: Arc::clone(device),
            inner: RankInner::Procs(Box::new(p)),
        })
    }

    /// [`init_process_kernels`](Self::init_process_kernels) for the job `env` describes
    /// (every rank on this machine): key `MASTER_ADDR:port`, `env.rank`,
    /// `env.world_size`, `env.timeout`.
    #[cfg(feature = "ipc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "ipc")))]
    pub fn from_launch_kernels(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        env: &LaunchEnv,
    ) -> Result<RankComm> {
        let key = format!("{}:{}", env.master_addr, env.port);
        Self::init_process_kernels(ctx, device, env.rank, env.world_size, &key, env.timeout)
    }

    /// Whether this rank's communicator is still usable: `Err` with the error that
    /// broke it, the same one every later call returns at once.
    ///
    /// With NCCL (one rank per process, or one thread per rank from
    /// [`Communicator::init_all`]) a watchdog thread watches the rank's calls while they
    /// run on the GPU: if NCCL reports an error (a peer died: [`Error::Nccl`] from
    /// `ncclCommGetAsyncError`, e.g. `ncclRemoteError` or `ncclSystemError`) or a call
    /// stays unfinished longer than the communicator's timeout (the `timeout` given to
    /// [`init_process`](Self::init_process), `env.timeout` for
    /// [`from_launch`](Self::from_launch), [`CommOptions::timeout`] for
    /// [`Communicator::init_all`]: [`Error::PeerTimeout`] naming the op and how long it
    /// ran), the communicator is aborted (`ncclCommAbort`), which is to end its kernels.
    /// Confirmed (one rank, one GPU): a stream synchronize returns `Ok(())` after the
    /// abort, once the work queued ahead of the aborted calls ended. Assumed, to be
    /// confirmed on two GPUs: that a kernel already waiting for a dead peer ends too, so
    /// the synchronize returns. A training loop calls `check` after its stream
    /// synchronize, whatever that returned, to tell a normal step from one whose
    /// collectives were aborted (or uses [`wait`](Self::wait), which returns the verdict
    /// as soon as it is set): after an abort the outputs of the aborted collectives are
    /// unspecified (but initialized values of `T`). `check` also polls
    /// `ncclCommGetAsyncError` itself.
    ///
    /// The own-kernel backends report failures from their calls (each bounded): `Ok`.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// # use gpubind::collective::LaunchEnv;
    /// # use gpubind::{Device, Op, RankComm, ThreadContext};
    /// # let env = LaunchEnv::from_env()?;
    /// # let mut ctx = ThreadContext::acquire()?;
    /// # let dev = Device::get(env.local_rank)?;
    /// let mut comm = RankComm::from_launch(&mut ctx, &dev, &env)?;
    /// let gpu = ctx.bind(&dev)?;
    /// let stream = gpu.new_stream()?;
    /// let s = gpu.on(&stream)?;
    /// let grads = gpu.alloc_zeros::<f32>(1024)?;
    /// let mut sum = gpu.alloc_zeros::<f32>(1024)?;
    /// comm.all_reduce(&s, &grads, &mut sum, Op::Sum)?;
    /// let synced = s.synchronize();
    /// // Err(PeerTimeout / Nccl) if this step's collectives were aborted: asked whatever
    /// // the synchronize returned, so that an aborted step is reported as such.
    /// comm.check()?;
    /// synced?;
    /// # Ok(()) }
    /// ```
    pub fn check(&self) -> Result<()> {
        match &self.inner {
            RankInner::Nccl { comm: Some(c), .. } => c.check(),
            RankInner::Nccl {
                comm: None,
                id: None,
                ..
            } => Err(Error::InvalidArgument(
                "this rank's NCCL initialisation failed earlier: make a new communicator".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Waits on the host until the work enqueued on `stream` so far has finished, or
    /// this rank's communicator fails: then its error (see [`check`](Self::check)) is
    /// returned at once, even while the stream still runs. `Ok` means the stream's work
    /// finished and the communicator is sound. On an NCCL communicator the watchdog
    /// does not watch (NCCL older than 2.14, or once the watchdog stopped at process
    /// exit) the wait is bounded by the communicator's timeout, else
    /// `GPUBIND_DROP_TIMEOUT`: past it, [`Error::Timeout`] (the communicator is not
    /// failed; the work may still finish). Other backends: waits for the stream, then
    /// `Ok`. `stream` must be of this rank's device.
    pub fn wait(&mut self, stream: &BoundStream<'_>) -> Result<()> {
        stream.bound().expect_device("stream", &self.device)?;
        match &mut self.inner {
            RankInner::Nccl { comm: Some(c), .. } => c.wait(stream),
            _ => {
                self.check()?;
                stream.synchronize()
            }
        }
    }

    fn call<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        kind: Kind,
        send: Option<Buf<'_>>,
        recv: Option<Buf<'_>>,
    ) -> Result<()> {
        let dtype = DType::of::<T>();
        let RankComm {
            rank,
            nranks,
            device,
            inner,
        } = self;
        let (rank, nranks) = (*rank, *nranks);
        let call = stream
            .bound()
            .expect_device("stream", device)
            .and_then(|()| make_call(nranks, rank, device, kind, dtype, send, recv));
        let p2p_peer = match kind {
            Kind::Send(p) | Kind::Recv(p) => Some(p),
            _ => None,
        };
        match p2p_peer {
            Some(p) if p == rank => {
                return Err(Error::InvalidArgument(
                    "a RankComm cannot send to itself (use a Communicator group)".into(),
                ));
            }
            // No partner would ever join that meeting: fail here instead of waiting.
            Some(p) if p >= nranks => return Err(rank_error("peer", p, nranks)),
            _ => {}
        }
        // This rank's buffers are used on its stream (the engine's barriers and NCCL order
        // everything else after it): they are claimed on it from before the enqueue until
        // after it.
        let used = uses(send, recv);
        match inner {
            #[cfg(feature = "ipc")]
            RankInner::Procs(p) => {
                // A call this rank cannot make would leave the others waiting for its
                // header: they are told (the communicator is broken for all).
                let call = call.map_err(|e| p.fail(e))?;
                let _claim = stream
                    .claim([used.first().copied(), used.get(1).copied()])
                    .map_err(|e| p.fail(e))?;
                // SAFETY: the stream is bound (its device current) and borrowed for this
                // call; the buffers are validated against this rank's device and
                // claimed (ordered after their other uses) until the call returns.
                p.run(unsafe { stream.raw() }, &call)
            }
            RankInner::Nccl {
                id,
                timeout,
                comm,
                gate,
            } => {
                // A communicator that failed (NCCL's error, the watchdog's timeout):
                // its verdict at once, nothing enqueued; the others of a checked job
                // are told at this collective.
                if let Some(v) = comm.as_ref().and_then(|c| c.verdict()) {
                    return Err(match gate.check_mut().as_mut() {
                        Some(check) if p2p_peer.is_none() => check.fail(v),
                        _ => v,
                    });
                }
                // One rank per process: the ranks agree on the collective through rank 0
                // before anything is enqueued; a call this rank cannot make is told to
                // the others at the same collective (send/recv are not checked).
                let check = gate.check_mut();
                let call = match (call, check.as_mut()) {
                    (Ok(call), Some(check)) => {
                        check.agree_call(&call)?;
                        call
                    }
                    (Err(e), Some(check)) if p2p_peer.is_none() => return Err(check.fail(e)),
                    (call, _) => call?,
                };
                if comm.is_none()
                    && let Some(id) = id.take()
                {
                    // Non-blocking and polled (bounded by the communicator's timeout),
                    // as one rank per process; NCCL older than 2.14: the blocking call.
                    // Taken: a failed (aborted) initialisation is not retried.
                    let bytes = nccl::id_bytes(&id);
                    *comm = Some(nccl::NcclComm::init_rank_process(
                        device, nranks, &bytes, rank, *timeout,
                    )?);
                }
                let Some(comm) = comm.as_mut() else {
                    return Err(Error::InvalidArgument(
                        "this rank's NCCL initialisation failed earlier: make a new communicator"
                            .into(),
                    ));
                };
                let issued = (|| {
                    // What the watchdog times and the communicator's drop waits for: taken
                    // before the enqueue, so that nothing but its record can fail after.
                    let ev = comm.spare_event(stream)?;
                    let enqueued = {
                        // The rank's order too: after its graph launches on other streams.
                        stream
                            .claim([
                                used.first().copied(),
                                used.get(1).copied(),
                                Some((comm.order(), Access::Write)),
                            ])
                            .and_then(|_claim| {
                                // SAFETY: validated against this rank's device; the stream
                                // is bound; the buffers are claimed (ordered after their
                                // other uses) until enqueued.
                                unsafe { comm.issue(&call, stream.raw()) }
                            })
                    };
                    match enqueued {
                        Ok(()) => comm.note_issued(stream, ev, kind.name()),
                        Err(e) => {
                            comm.give_back(ev);
                            Err(e)
                        }
                    }
                })();
                // Agreed with the others (a checked collective): a failure after the
                // agreement (a verdict set since, NCCL's error) is told to them, as
                // the failures before it are, instead of leaving them to their timeout.
                issued.map_err(|e| match check.as_mut() {
                    Some(check) if p2p_peer.is_none() => check.fail(e),
                    _ => e,
                })
            }
            RankInner::Kernels { world, event } => {
                let post = call.and_then(|call| {
                    let gpu = stream.bound();
                    world.shared.ensure_kernels(gpu)?;
                    if event.is_none() {
                        *event = Some(gpu.new_event(false)?);
                    }
                    let ev = event.as_ref().map(|e| {
                        // SAFETY: the event lives in this RankComm, which the calling
                        // thread borrows mutably until the meeting ends.
                        unsafe { e.raw() }
                    });
                    Ok(RankPost {
                        lane: Lane {
                            device: Arc::clone(device),
                            stream_ref: stream.to_ref(),
                            // SAFETY: the stream is borrowed for this call, which does
                            // not return before the collective is enqueued.
                            stream: unsafe { stream.raw() },
                            event: ev.unwrap_or(std::ptr::null_mut()),
                        },
                        call,
                        uses: used
                            .iter()
                            .map(|&(t, a)| (TrackerPtr(t as *const AccessTracker), a))
                            .collect(),
                    })
                });
                let shared = &world.shared;
                match p2p_peer {
                    None => world.meet.meet(
                        Key::Coll,
                        &world.ranks,
                        rank,
                        post,
                        world.timeout,
                        |posts| {
                            enqueue_posts(posts, |lanes, calls| {
                                check_matched(calls)?;
                                let rank_lane: Vec<usize> = (0..calls.len()).collect();
                                engine::collective(&mut Enter, shared, lanes, &rank_lane, calls)
                            })
                        },
                    ),
                    Some(peer) => {
                        let (key, slot, pair) = match kind {
                            Kind::Send(_) => (Key::Pair(rank, peer), 0, [rank, peer]),
                            _ => (Key::Pair(peer, rank), 1, [peer, rank]),
                        };
                        world
                            .meet
                            .meet(key, &pair, slot, post, world.timeout, |posts| {
                                enqueue_posts(posts, |lanes, calls| {
                                    check_pair(&calls[0], &calls[1])?;
                                    engine::p2p(
                                        &mut Enter,
                                        shared,
                                        lanes,
                                        (0, 1),
                                        &calls[0],
                                        &calls[1],
                                    )
                                })
                            })
                    }
                }
            }
        }
    }

    /// This rank's part of an all-reduce, enqueued on `stream` (of this rank's device).
    pub fn all_reduce<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        send: &impl DeviceMemory<T>,
        recv: &mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.call::<T>(
            stream,
            Kind::AllReduce(op),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// This rank's part of a reduce to `root` (only the root's `recv` is written).
    pub fn reduce<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        send: &impl DeviceMemory<T>,
        recv: &mut impl DeviceMemoryMut<T>,
        op: Op,
        root: usize,
    ) -> Result<()> {
        self.call::<T>(
            stream,
            Kind::Reduce(op, root),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// This rank's part of an in-place broadcast from `root`.
    pub fn broadcast<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        data: &mut impl DeviceMemoryMut<T>,
        root: usize,
    ) -> Result<()> {
        let b = buf(data);
        self.call::<T>(stream, Kind::Broadcast(root), Some(b), Some(b))
    }

    /// This rank's part of an all-gather (`recv.len() == nranks * send.len()`).
    pub fn all_gather<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        send: &impl DeviceMemory<T>,
        recv: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.call::<T>(stream, Kind::AllGather, Some(buf(send)), Some(buf(recv)))
    }

    /// This rank's part of a reduce-scatter (`send.len() == nranks * recv.len()`).
    pub fn reduce_scatter<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        send: &impl DeviceMemory<T>,
        recv: &mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.call::<T>(
            stream,
            Kind::ReduceScatter(op),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// Sends `data` to `peer` (own kernels: blocks until `peer` posts the recv).
    pub fn send<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        data: &impl DeviceMemory<T>,
        peer: usize,
    ) -> Result<()> {
        self.call::<T>(stream, Kind::Send(peer), Some(buf(data)), None)
    }

    /// Receives into `data` from `peer` (own kernels: blocks until `peer` sends).
    pub fn recv<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        data: &mut impl DeviceMemoryMut<T>,
        peer: usize,
    ) -> Result<()> {
        self.call::<T>(stream, Kind::Recv(peer), None, Some(buf(data)))
    }
}
