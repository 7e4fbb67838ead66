//! One rank's NCCL collectives captured into a CUDA graph of its device:
//! [`Capture::rank_all_reduce`] and its siblings, all through one code path
//! (`rank_collective`), and what every launch of such a graph does first (the
//! [`LaunchAgreement`](crate::graph::LaunchAgreement) of the rank's [`CallCheck`]).
//!
//! NCCL (2.9 and later) records a collective enqueued on a capturing stream into the
//! graph instead of running it; whether a collective is captured is a collective
//! property (every rank captures it), and every launch of the graph is a collective of
//! the ranks of that capture, each launching the graph of the same capture. So:
//!
//! * only a [`RankComm`] of the NCCL backend (one rank per thread or per process, one
//!   device per rank) is capturable; its communicator must exist already (NCCL's
//!   initialisation allocates, which a capture forbids): make one eager call first when
//!   it is made lazily ([`Communicator::init_all`](super::Communicator::init_all));
//! * the buffers are recorded like every captured operation's (inputs read, outputs
//!   written, borrowed for the graph's lifetime; an output overlapping an input is
//!   refused, and broadcast is in place by its signature), and so is the rank's order
//!   tracker (`NcclComm::order`), claimed as written by every launch like
//!   by every eager call: the rank's collectives, eager or graphed, reach the device in
//!   issue order, and the communicator's drop waits for the graph launches too;
//! * the `RankComm` is borrowed (shared) for the graph's lifetime, so it outlives every
//!   launch, and its eager calls (`&mut self`) do not compile while a graph of it lives;
//!   every graph counts itself in the rank's `Gate`, so a drop that finds graphs left
//!   (forgotten ones: NCCL would wait for their destruction for ever) leaks the
//!   communicator instead;
//! * with a [`CallCheck`], each captured collective agrees with the peers at capture
//!   time under its own "captured" kind (a peer calling it eagerly is a mismatch), and
//!   each launch agrees on one header naming the capture (a digest of the agreed
//!   headers, sequence numbers included), inside the check's lock, which it holds until
//!   the launch is enqueued.
//!
//! Not capturable, with [`Error::NotCapturable`]: a `RankComm` of own kernels (its
//! ranks meet on the host at every call) and send/recv (no method).

use super::call::{Buf, Kind, buf};
use super::rank_comm::RankComm;
use super::types::{CollectiveType, DType, Op};
use crate::collective::backend::interface::{RankBackend, RankCapture, RankSeat};
#[cfg(doc)]
use crate::collective::callcheck::CallCheck;
use crate::copy::DeviceOnlyMemory;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::graph::Capture;
use crate::memory::DeviceMemory;

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Captures this rank's part of an all-reduce over `comm`, a [`RankComm`] of the
    /// NCCL backend on the capturing device: at each launch of the graph, `recv` gets
    /// `op` over every rank's `send`, as
    /// [`RankComm::all_reduce`](super::RankComm::all_reduce) would.
    ///
    /// Every rank must capture the same collectives in the same order (NCCL's rule for
    /// graphs), and launch the graph of that capture each time its peers launch theirs
    /// (one graph per rank, launched as a collective). With a [`CallCheck`]
    /// ([`RankComm::from_launch`], `GPUBIND_CHECK_CALLS`) both are checked: at capture,
    /// each collective agrees with the peers as an eager call does, as a *captured*
    /// collective (a peer calling it eagerly is the same [`Error::InvalidArgument`]
    /// "collective mismatch" on every rank); at each
    /// [`GraphExec::launch`](crate::GraphExec::launch), the ranks agree that they launch the graphs of the
    /// same capture (one round trip to rank 0 per launch).
    ///
    /// `send` is claimed as read and `recv` as written at each launch, both borrowed for
    /// the graph's lifetime; they must not overlap ([`Error::InvalidArgument`]). `comm`
    /// is borrowed for the graph's lifetime too (its eager calls, which take `&mut`, do
    /// not compile while the graph lives), and its drop waits (bounded) for the graph's
    /// launches. Its NCCL
    /// communicator must exist already ([`Error::NotCapturable`] for one made at its
    /// first call, as [`Communicator::init_all`](super::Communicator::init_all)'s are);
    /// a `RankComm` of own kernels is [`Error::NotCapturable`]. An NCCL call that fails
    /// during the capture discards the graph
    /// ([`BoundDevice::capture`](crate::BoundDevice::capture) returns that error).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::collective::LaunchEnv;
    /// use gpubind::{Device, ThreadContext, collective::{Op, RankComm}};
    /// let env = LaunchEnv::from_env()?; // torchrun, mpirun, srun
    /// let mut ctx = ThreadContext::acquire()?;
    /// let dev = Device::get(env.local_rank)?;
    /// let comm = RankComm::from_launch(&mut ctx, &dev, &env)?;
    /// let gpu = ctx.bind(&dev)?;
    /// let grads = gpu.clone_htod(&[env.rank as f32; 1024])?;
    /// let sum = gpu.alloc_zeros::<f32>(1024)?;
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &grads, &sum, Op::Sum))?;
    /// let exec = graph.instantiate()?;
    /// let stream = gpu.new_stream()?;
    /// for _ in 0..10 {
    ///     exec.launch(&gpu.on(&stream)?)?; // every rank launches its graph
    /// }
    /// let total = gpu.dtoh(&sum)?; // waits for the last launch
    /// # Ok(()) }
    /// ```
    ///
    /// The communicator cannot be dropped while the graph lives:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, comm: gpubind::collective::RankComm) -> gpubind::Result<()> {
    /// let (a, b) = (gpu.alloc_zeros::<f32>(8)?, gpu.alloc_zeros::<f32>(8)?);
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &a, &b, gpubind::collective::Op::Sum))?;
    /// drop(comm); // error[E0505]: the graph borrows it
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    ///
    /// nor called eagerly (a second communicator serves eager collectives between
    /// launches):
    ///
    /// ```compile_fail,E0502
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, mut comm: gpubind::collective::RankComm) -> gpubind::Result<()> {
    /// let (a, b) = (gpu.alloc_zeros::<f32>(8)?, gpu.alloc_zeros::<f32>(8)?);
    /// let mut other = gpu.alloc_zeros::<f32>(8)?;
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &a, &b, gpubind::collective::Op::Sum))?;
    /// comm.all_reduce(&gpu.default_stream(), &a, &mut other, gpubind::collective::Op::Sum)?; // error[E0502]
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn rank_all_reduce<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::AllReduce(op), buf(send), buf(recv))
    }

    /// Captures this rank's part of a reduce to `root` (only the root's `recv` is
    /// written); see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_reduce<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
        root: usize,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::Reduce(op, root), buf(send), buf(recv))
    }

    /// Captures this rank's part of an in-place broadcast from `root` (`data` is read on
    /// the root, written on the others: claimed as written); see
    /// [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_broadcast<T, D>(
        &mut self,
        comm: &'buf RankComm,
        data: &'buf D,
        root: usize,
    ) -> Result<()>
    where
        T: CollectiveType,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let b = buf(data);
        self.rank_collective::<T>(comm, Kind::Broadcast(root), b, b)
    }

    /// Captures this rank's part of an all-gather (`recv.len() == nranks * send.len()`);
    /// see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_all_gather<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::AllGather, buf(send), buf(recv))
    }

    /// Captures this rank's part of a reduce-scatter (`send.len() == nranks *
    /// recv.len()`); see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_reduce_scatter<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::ReduceScatter(op), buf(send), buf(recv))
    }

    /// The one code path of the captured rank collectives: the rank's backend
    /// validates the call (as an eager call, plus no overlap of output and input unless
    /// they are the one buffer of a broadcast), agrees with the peers, records the
    /// buffers, the rank's order and the launch agreement, then lets NCCL record the
    /// collective on the capturing stream; a backend that cannot capture says why.
    fn rank_collective<T: CollectiveType>(
        &mut self,
        comm: &'buf RankComm,
        kind: Kind,
        send: Buf<'buf>,
        recv: Buf<'buf>,
    ) -> Result<()> {
        let backend: &'buf dyn RankBackend = &*comm.inner;
        let me = RankSeat {
            rank: comm.rank,
            nranks: comm.nranks,
            device: &comm.device,
        };
        let call = RankCapture {
            kind,
            dtype: DType::of::<T>(),
            send,
            recv,
        };
        backend.capture(self, me, call)
    }
}
