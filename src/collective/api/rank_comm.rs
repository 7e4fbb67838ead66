//! [`RankComm`]: one rank of a communicator, for the thread (or process) that drives
//! that rank's device.

use super::call::{Buf, Kind, buf, make_call, rank_error, uses};
use super::types::{CollectiveType, DType, Op};
use crate::collective::backend::interface::{RankBackend, RankCall, RankSeat};
use crate::collective::backend::nccl::{self, NcclRank};
#[cfg(feature = "ipc")]
use crate::collective::backend::procs;
#[cfg(all(doc, feature = "ipc"))]
use crate::collective::backend::{PROCESS_STAGING_BYTES, ProcessGroup};
use crate::collective::bootstrap::{LaunchEnv, NcclUniqueId};
use crate::collective::callcheck::CallCheck;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use crate::stream::BoundStream;
use std::sync::Arc;

/// One rank of a communicator, for the thread that drives that rank's device (see
/// [`Communicator::init_all`](crate::collective::Communicator::init_all)). `Send`, not `Sync`.
pub struct RankComm {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: Arc<Device>,
    /// The backend that runs this rank's calls.
    pub(crate) inner: Box<dyn RankBackend>,
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
        Self::init_nccl_process(ctx, device, (rank, nranks), id, timeout, None)
    }

    /// [`init_process`](Self::init_process), with the job's call check (`None`: calls
    /// are not checked).
    fn init_nccl_process(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        (rank, nranks): (usize, usize),
        id: &NcclUniqueId,
        timeout: std::time::Duration,
        check: Option<CallCheck>,
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
        let inner =
            NcclRank::init_process(ctx, device, (rank, nranks), id.as_bytes(), timeout, check)?;
        Ok(RankComm {
            rank,
            nranks,
            device: Arc::clone(device),
            inner: Box::new(inner),
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
    /// use gpubind::{Device, ThreadContext, collective::{Op, RankComm}};
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
        let ranks = (env.rank, env.world_size);
        Self::init_nccl_process(ctx, device, ranks, &id, env.timeout, check)
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
            inner: Box::new(p),
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
    /// [`Communicator::init_all`](crate::collective::Communicator::init_all)) a watchdog thread watches the rank's calls while they
    /// run on the GPU: if NCCL reports an error (a peer died: [`Error::Nccl`] from
    /// `ncclCommGetAsyncError`, e.g. `ncclRemoteError` or `ncclSystemError`) or a call
    /// stays unfinished longer than the communicator's timeout (the `timeout` given to
    /// [`init_process`](Self::init_process), `env.timeout` for
    /// [`from_launch`](Self::from_launch), [`CommOptions::timeout`](crate::collective::CommOptions::timeout) for
    /// [`Communicator::init_all`](crate::collective::Communicator::init_all): [`Error::PeerTimeout`] naming the op and how long it
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
    /// # use gpubind::{Device, ThreadContext, collective::{Op, RankComm}};
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
        self.inner.check()
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
        self.inner.wait(stream)
    }

    /// Validates one call of this rank and hands it to the backend, with its buffers
    /// to claim on `stream` (the engine's barriers and NCCL order everything else after
    /// it). A call that cannot be made still reaches a backend whose ranks wait for each
    /// other, which tells them.
    fn call<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        kind: Kind,
        send: Option<Buf<'_>>,
        recv: Option<Buf<'_>>,
    ) -> Result<()> {
        let me = RankSeat {
            rank: self.rank,
            nranks: self.nranks,
            device: &self.device,
        };
        let call = stream
            .bound()
            .expect_device("stream", me.device)
            .and_then(|()| {
                make_call(
                    me.nranks,
                    me.rank,
                    me.device,
                    kind,
                    DType::of::<T>(),
                    send,
                    recv,
                )
            });
        let call = RankCall {
            kind,
            call,
            uses: uses(send, recv),
        };
        match call.peer() {
            Some(p) if p == me.rank => {
                return Err(Error::InvalidArgument(
                    "a RankComm cannot send to itself (use a Communicator group)".into(),
                ));
            }
            // No partner would ever join that meeting: fail here instead of waiting.
            Some(p) if p >= me.nranks => return Err(rank_error("peer", p, me.nranks)),
            _ => {}
        }
        self.inner.call(me, stream, call)
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

    /// This rank's part of an in-place all-reduce: `data = op(data of every rank)`,
    /// enqueued on `stream` (of this rank's device). `data` is claimed as one write (it
    /// is read and written by the collective). NCCL takes the same buffer as send and
    /// receive buffer; the own-kernel backends read every input element before they
    /// write the output element at the same index (or read staged copies), so the
    /// result is the one [`all_reduce`](Self::all_reduce) into a separate buffer gives.
    pub fn all_reduce_in_place<T: CollectiveType>(
        &mut self,
        stream: &BoundStream<'_>,
        data: &mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        let b = buf(data);
        self.call::<T>(stream, Kind::AllReduce(op), Some(b), Some(b))
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
