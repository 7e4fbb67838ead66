//! NCCL-style collectives over a set of ranks: one thread driving N GPUs, or one
//! thread per GPU.
//!
//! A [`Communicator`] is a list of ranks, each on a device. The same device may appear
//! for several ranks ("ranks on one GPU"), which the own-kernel backend supports, so
//! every collective can be exercised on a single GPU. Two backends sit behind the same
//! API ([`Backend`]):
//!
//! * [`Backend::Kernels`] — NVRTC-compiled reduce/copy kernels (one module per device,
//!   cached in the communicator). Ranks of one device are reduced in one pass by a
//!   kernel reading all their buffers; across devices each device reduces its chunk of
//!   the data directly from its peers' memory (`cuCtxEnablePeerAccess`), or, where
//!   peers cannot reach each other, through mapped pinned host memory ([`Transport`]).
//! * [`Backend::Nccl`] — `libnccl.so.2`, loaded at run time ([`Error::NoNccl`] names
//!   `LD_LIBRARY_PATH` when it is missing). NCCL needs a distinct device per rank in one
//!   process ([`Error::DuplicateDevice`]). Built with the `nccl` feature (default);
//!   without it this backend is [`Error::FeatureDisabled`] and [`nccl_available`] is
//!   `false`.
//!
//! # One thread, N GPUs: groups
//!
//! [`ThreadContext::group`] collects the calls of every rank (like NCCL's
//! `ncclGroupStart`/`ncclGroupEnd`) and, when the closure returns, enqueues them, each
//! with its rank's device bound and on its rank's stream ([`Communicator::stream`]).
//! The group binds the devices itself, through the `&mut ThreadContext`, so no call can
//! run in the wrong context:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{CommOptions, Communicator, Device, Op, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let devices = vec![dev.clone(), dev.clone()]; // two ranks on one GPU
//! let comm = Communicator::new(&mut ctx, &devices, CommOptions::kernels())?;
//! let (send, mut out) = {
//!     let gpu = ctx.bind(&dev)?;
//!     let send = vec![gpu.clone_htod(&[1.0f32; 1024])?, gpu.clone_htod(&[2.0f32; 1024])?];
//!     let out = vec![gpu.alloc_zeros::<f32>(1024)?, gpu.alloc_zeros::<f32>(1024)?];
//!     (send, out)
//! };
//! ctx.group(&comm, |g| {
//!     for (r, (s, o)) in send.iter().zip(out.iter_mut()).enumerate() {
//!         g.all_reduce(r, s, o, Op::Sum)?;
//!     }
//!     Ok(())
//! })?;
//! comm.synchronize(&mut ctx)?;
//! assert_eq!(ctx.bind(&dev)?.dtoh(&out[1])?, vec![3.0f32; 1024]);
//! # Ok(()) }
//! ```
//!
//! The group borrows every buffer handed to it until it has enqueued the work, so a
//! buffer cannot be given twice as an output, nor touched inside the group:
//!
//! ```compile_fail,E0499
//! # fn f(ctx: &mut gpubind::ThreadContext, comm: &gpubind::Communicator,
//! #      a: &gpubind::DeviceSlice<f32>, b: &gpubind::DeviceSlice<f32>,
//! #      out: &mut gpubind::DeviceSlice<f32>) -> gpubind::Result<()> {
//! use gpubind::Op;
//! ctx.group(comm, |g| {
//!     g.all_reduce(0, a, out, Op::Sum)?;
//!     g.all_reduce(1, b, out, Op::Sum)?; // error[E0499]: `*out` is already borrowed
//!     Ok(())
//! })
//! # }
//! ```
//!
//! Give each rank its own output (`iter_mut`, `split_at_mut`).
//!
//! A [`Communicator`] is `Send` but not `Sync`: NCCL communicators must not be used from
//! two threads at once.
//!
//! ```compile_fail,E0277
//! fn needs_sync<T: Sync>() {}
//! needs_sync::<gpubind::Communicator>(); // error[E0277]
//! ```
//!
//! # One thread per GPU
//!
//! [`Communicator::init_all`] returns one [`RankComm`] per rank, each `Send`, for a
//! thread that binds its own device and passes the stream to enqueue on:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{CommOptions, Communicator, Device, Op, ThreadContext};
//! let devices = Device::all()?;
//! let comms = Communicator::init_all(&devices, CommOptions::nccl())?;
//! std::thread::scope(|s| {
//!     for (dev, mut comm) in devices.iter().zip(comms) {
//!         s.spawn(move || -> gpubind::Result<Vec<f32>> {
//!             let mut ctx = ThreadContext::acquire()?;
//!             let gpu = ctx.bind(dev)?;
//!             let stream = gpu.new_stream()?;
//!             let send = gpu.clone_htod(&[comm.rank() as f32; 256])?;
//!             let mut recv = gpu.alloc_zeros::<f32>(256)?;
//!             let s = gpu.on(&stream)?;
//!             comm.all_reduce(&s, &send, &mut recv, Op::Sum)?;
//!             s.synchronize()?;
//!             gpu.dtoh(&recv)
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```
//!
//! With the own-kernel backend a `RankComm` call blocks its thread until every rank has
//! made the matching call (the last to arrive enqueues the collective on all streams);
//! `send`/`recv` block until the partner arrives. Never for ever: past
//! [`CommOptions::timeout`] the call returns [`Error::PeerTimeout`] naming the ranks that
//! did not come (and the communicator is unusable after); a rank whose `RankComm` is
//! dropped (its thread returned early, or panicked) makes every call that waits for it
//! return [`Error::PeerFailed`] naming it, at once. Ranks that disagree on the op, the
//! data type or the length all get the same typed error, and nothing is enqueued.
//!
//! # One rank per process, many machines
//!
//! [`RankComm::from_launch`] reads the launcher's variables ([`LaunchEnv`]: torchrun,
//! mpirun, srun), exchanges NCCL's unique id over TCP ([`LaunchEnv::exchange_id`]) and
//! makes this process's rank with NCCL ([`RankComm::init_process`]); the same calls
//! follow, and the ranks agree on every collective through rank 0 before NCCL enqueues
//! it ([`CallCheck`], [`LaunchEnv::check_calls`]). See docs/collective.md, "Deployment".
//!
//! On one machine, `RankComm::init_process_kernels` (or `from_launch_kernels`; feature
//! `ipc`) makes a rank of the own-kernel backend instead:
//! any number of processes per GPU (NCCL refuses that), staging buffers shared through IPC
//! memory pools, a Unix-socket `ProcessGroup` on which the ranks agree on every call
//! before anything is enqueued, and every wait bounded. See docs/collective.md, "One
//! node, one rank per process, own kernels".
//!
//! # Semantics
//!
//! As in NCCL: `count` is per rank for all_reduce, reduce and broadcast; all_gather's
//! output is `nranks × send`, reduce_scatter's input is `nranks × recv`. [`Op::Avg`]
//! divides the sum by `nranks` (truncating for integers). Integer sums and products
//! wrap. Calls of one group act as if concurrent: no call may read another call's
//! output. Work is enqueued, not finished, when a call returns.
//!
//! # CUDA graphs
//!
//! An all-reduce over a [`Communicator`] of the own-kernel backend whose ranks all live
//! on one device is a single kernel on a single stream, and can be captured into a graph
//! of that device ([`Capture::all_reduce`](crate::Capture::all_reduce)). Every other
//! collective — ranks on several devices, the host-staged transport, NCCL — is
//! [`Error::NotCapturable`].

mod bootstrap;
mod callcheck;
mod capture;
#[cfg(feature = "ipc")]
mod control;
mod engine;
mod kernels;
// Without the `nccl` feature a stand-in with the same crate-internal API: nothing NCCL
// is compiled or linked, and `Backend::Nccl` is a typed error (`Error::FeatureDisabled`).
#[cfg_attr(not(feature = "nccl"), path = "nccl_off.rs")]
mod nccl;
#[cfg(feature = "ipc")]
mod procs;
mod rendezvous;

pub use bootstrap::{
    CHECK_VAR, DEFAULT_PORT, DEFAULT_TIMEOUT, LaunchEnv, Launcher, NCCL_UNIQUE_ID_BYTES,
    NcclUniqueId, PORT_VAR, PROTOCOL_VERSION, TIMEOUT_VAR,
};
pub use callcheck::CallCheck;
#[cfg(feature = "ipc")]
pub use control::ProcessGroup;
pub use nccl::{nccl_available, nccl_version};
#[cfg(feature = "ipc")]
pub use procs::PROCESS_STAGING_BYTES;

use crate::access::{Access, AccessTracker, StreamRef, claim_lanes};
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr};
use crate::stream::{BoundStream, Event, Stream};
use engine::{Enter, Lane};
use rendezvous::{Key, Meeting};
use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// Locks a mutex, recovering from poisoning (the state is consistent at every unlock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `timeout` from now, saturating: `Instant::now() + Duration::MAX` (the natural way to
/// say "wait for ever") would panic; a deadline 136 years out does not, and is never met.
pub(crate) fn deadline_after(timeout: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(u64::from(u32::MAX)))
}

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (truncating division for integers).
    Avg,
}

mod sealed {
    pub trait Sealed {}
}

/// An element type the collectives support: `f32`, `f64`, `f16`, `bf16`, `i32`, `i64`,
/// `u8`. Sealed.
///
/// ```compile_fail,E0277
/// fn takes<T: gpubind::CollectiveType>() {}
/// takes::<u16>(); // error[E0277]: `u16: CollectiveType` is not satisfied
/// ```
pub trait CollectiveType: DeviceRepr + sealed::Sealed {
    /// Short name, used in kernel names (`f32`, `bf16`, …).
    const NAME: &'static str;
    /// The C type the kernels use for it.
    const C_TYPE: &'static str;
    #[doc(hidden)]
    const INDEX: usize;
}

macro_rules! collective_type {
    ($($t:ty => $idx:literal;)*) => { $(
        impl sealed::Sealed for $t {}
        impl CollectiveType for $t {
            const NAME: &'static str = kernels::DTYPES[$idx].0;
            const C_TYPE: &'static str = kernels::DTYPES[$idx].1;
            const INDEX: usize = $idx;
        }
    )* };
}
collective_type! {
    f32 => 0;
    f64 => 1;
    half::f16 => 2;
    half::bf16 => 3;
    i32 => 4;
    i64 => 5;
    u8 => 6;
}

/// A data type at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DType {
    pub(crate) name: &'static str,
    pub(crate) size: usize,
    pub(crate) index: usize,
}

impl DType {
    fn of<T: CollectiveType>() -> DType {
        DType {
            name: T::NAME,
            size: std::mem::size_of::<T>(),
            index: T::INDEX,
        }
    }
}

/// Which implementation runs the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// gpubind's own NVRTC kernels (any ranks, including several on one GPU).
    Kernels,
    /// NCCL (`libnccl.so.2`), one distinct device per rank. Needs the `nccl` feature
    /// (default): without it, creating a communicator with it is
    /// [`Error::FeatureDisabled`].
    Nccl,
}

/// How the own-kernel backend moves data between devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Direct where every pair of devices has peer access, else host-staged.
    Auto,
    /// Kernels read and write peers' memory directly (error if some pair lacks peer
    /// access). Ranks of one device always work this way.
    Direct,
    /// Through mapped pinned host memory (`cuMemHostAlloc`), even on one device (slow;
    /// for machines without peer access, and for testing that path).
    HostStaged,
}

/// Options for creating communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// The backend.
    pub backend: Backend,
    /// The own-kernel backend's transport (ignored by NCCL).
    pub transport: Transport,
    /// How long a [`RankComm`] of the own-kernel backend waits for the other ranks to
    /// join a call ([`DEFAULT_COLLECTIVE_TIMEOUT`] unless set): past it the call returns
    /// [`Error::PeerTimeout`] naming the ranks that did not come, and the communicator
    /// is unusable (every later call returns that error). `Duration::MAX` waits for ever.
    ///
    /// A [`RankComm`] of the NCCL backend ([`Communicator::init_all`] with NCCL) waits
    /// at most this long for NCCL's initialisation at its first call (non-blocking
    /// `ncclCommInitRankConfig`, polled; past it the communicator is aborted and the call
    /// returns [`Error::PeerTimeout`]) and for NCCL to enqueue each call. (With an NCCL
    /// older than 2.14 the initialisation is the blocking `ncclCommInitRank`.)
    pub timeout: std::time::Duration,
}

/// The default [`CommOptions::timeout`]: 300 s.
pub const DEFAULT_COLLECTIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl CommOptions {
    /// Own kernels, [`Transport::Auto`].
    pub fn kernels() -> Self {
        CommOptions {
            backend: Backend::Kernels,
            transport: Transport::Auto,
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// NCCL (see [`Backend::Nccl`] for the `nccl` feature).
    pub fn nccl() -> Self {
        CommOptions {
            backend: Backend::Nccl,
            transport: Transport::Auto,
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// The same options with another transport.
    pub fn with_transport(self, transport: Transport) -> Self {
        CommOptions { transport, ..self }
    }

    /// The same options with another [`timeout`](Self::timeout).
    pub fn with_timeout(self, timeout: std::time::Duration) -> Self {
        CommOptions { timeout, ..self }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions::kernels()
    }
}

// Handles move between threads; a Communicator (NCCL handles inside) and a RankComm are
// never shared between threads.
static_assertions::assert_impl_all!(Communicator: Send);
static_assertions::assert_not_impl_any!(Communicator: Sync);
static_assertions::assert_impl_all!(RankComm: Send);
static_assertions::assert_not_impl_any!(RankComm: Sync);

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

impl Kind {
    fn name(&self) -> &'static str {
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
struct Buf<'x> {
    device: &'x Device,
    len: usize,
    ptr: u64,
    /// The allocation's pending uses: the collective is ordered after them.
    tracker: &'x AccessTracker,
}

fn buf<T, M: DeviceMemory<T>>(m: &M) -> Buf<'_> {
    Buf {
        device: m.device(),
        len: m.len(),
        ptr: m.device_ptr(),
        tracker: m.tracker(),
    }
}

/// How a collective uses its buffers: `send` is read, `recv` written (one write when
/// they are the same buffer, as in broadcast).
fn uses<'x>(send: Option<Buf<'x>>, recv: Option<Buf<'x>>) -> Vec<(&'x AccessTracker, Access)> {
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

fn rank_error(what: &str, rank: usize, nranks: usize) -> Error {
    Error::InvalidArgument(format!(
        "{what} {rank} is out of range for a communicator of {nranks} rank(s)"
    ))
}

/// Checks one rank's call against its device, the sizes NCCL implies and the rank
/// range, and builds the [`Call`].
fn make_call(
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
fn check_matched(calls: &[Call]) -> Result<()> {
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
struct Plan {
    /// Each entry has one call per rank, in rank order.
    colls: Vec<Vec<Call>>,
    /// `(send, recv)`.
    p2p: Vec<(Call, Call)>,
}

fn plan(nranks: usize, calls: &[Call]) -> Result<Plan> {
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
    Ok(Plan { colls, p2p })
}

fn check_pair(send: &Call, recv: &Call) -> Result<()> {
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

fn check_distinct(devices: &[Arc<Device>]) -> Result<()> {
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

enum Engine {
    Kernels(engine::Shared),
    Nccl(Vec<nccl::NcclComm>),
}

/// A set of ranks driven by one thread (see the [module docs](self)).
pub struct Communicator {
    engine: Engine,
    /// Device of each rank.
    devices: Vec<Arc<Device>>,
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
                                check: None,
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

    fn run(
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
        let limit = crate::drop_wait::drop_timeout();
        let deadline = std::time::Instant::now().checked_add(limit);
        let mut work_may_run = false;
        for (stream, _) in &self.lanes {
            let ordinal = Some(stream.device().ordinal());
            if let Err(e) = stream.to_ref().synchronize_within(deadline, limit) {
                let runs = !crate::faults::nothing_runs_after(&e);
                work_may_run |= runs;
                crate::faults::report_drop(
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

/// The calls of one rank set, recorded by [`ThreadContext::group`] and enqueued when
/// its closure returns. `'b` is how long the group borrows the buffers given to it.
pub struct Group<'c, 'b> {
    comm: &'c Communicator,
    calls: Vec<Call>,
    /// Each call's buffers: `(rank, tracker, how the collective uses it)`.
    tracked: Vec<(usize, &'b AccessTracker, Access)>,
    _buffers: PhantomData<&'b mut ()>,
}

impl std::fmt::Debug for Group<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("communicator", self.comm)
            .field("calls", &self.calls.len())
            .field("buffers", &self.tracked.len())
            .finish()
    }
}

impl ThreadContext {
    /// Records the collective calls `f` makes on `g` for any of `comm`'s ranks and
    /// enqueues them when `f` returns `Ok` (nothing is enqueued if it fails), binding
    /// each rank's device for its calls. Returns once everything is enqueued; use
    /// [`Communicator::synchronize`] (or events on [`Communicator::stream`]) to wait.
    ///
    /// Every rank must make the same collective calls in the same order (NCCL's rule);
    /// a mismatch is an error before anything is enqueued.
    pub fn group<'c, 'b, F>(&mut self, comm: &'c Communicator, f: F) -> Result<()>
    where
        F: FnOnce(&mut Group<'c, 'b>) -> Result<()>,
    {
        let mut g = Group {
            comm,
            calls: Vec::new(),
            tracked: Vec::new(),
            _buffers: PhantomData,
        };
        f(&mut g)?;
        comm.run(self, &g.calls, &g.tracked)
    }
}

impl<'c, 'b> Group<'c, 'b> {
    fn push<T: CollectiveType>(
        &mut self,
        rank: usize,
        kind: Kind,
        send: Option<Buf<'b>>,
        recv: Option<Buf<'b>>,
    ) -> Result<()> {
        let dtype = DType::of::<T>();
        let n = self.comm.len();
        let device = self
            .comm
            .device(rank)
            .ok_or_else(|| rank_error("rank", rank, n))?;
        let call = make_call(n, rank, device, kind, dtype, send, recv)?;
        self.calls.push(call);
        self.tracked
            .extend(uses(send, recv).into_iter().map(|(t, a)| (rank, t, a)));
        Ok(())
    }

    /// Rank `rank`'s part of an all-reduce: `recv = op(send of every rank)`.
    pub fn all_reduce<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::AllReduce(op), Some(buf(send)), Some(buf(recv)))
    }

    /// Rank `rank`'s part of a reduce to `root`: only the root's `recv` is written
    /// (every rank passes one of the same length, as in NCCL).
    pub fn reduce<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
        root: usize,
    ) -> Result<()> {
        self.push::<T>(
            rank,
            Kind::Reduce(op, root),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// Rank `rank`'s part of an in-place broadcast: `root`'s `buf` is copied into every
    /// other rank's `buf`.
    pub fn broadcast<T: CollectiveType>(
        &mut self,
        rank: usize,
        buf_: &'b mut impl DeviceMemoryMut<T>,
        root: usize,
    ) -> Result<()> {
        let b = buf(buf_);
        self.push::<T>(rank, Kind::Broadcast(root), Some(b), Some(b))
    }

    /// Rank `rank`'s part of an all-gather: `recv[r*n..(r+1)*n] = send of rank r`,
    /// `recv.len() == nranks * send.len()`.
    pub fn all_gather<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::AllGather, Some(buf(send)), Some(buf(recv)))
    }

    /// Rank `rank`'s part of a reduce-scatter: `recv = op(block rank of every send)`,
    /// `send.len() == nranks * recv.len()`.
    pub fn reduce_scatter<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.push::<T>(
            rank,
            Kind::ReduceScatter(op),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// Rank `rank` sends `data` to `peer`, which must post a matching
    /// [`recv`](Self::recv) in the same group.
    pub fn send<T: CollectiveType>(
        &mut self,
        rank: usize,
        data: &'b impl DeviceMemory<T>,
        peer: usize,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::Send(peer), Some(buf(data)), None)
    }

    /// Rank `rank` receives into `data` from `peer`.
    pub fn recv<T: CollectiveType>(
        &mut self,
        rank: usize,
        data: &'b mut impl DeviceMemoryMut<T>,
        peer: usize,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::Recv(peer), None, Some(buf(data)))
    }
}

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
struct RankPost {
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

/// A collective that failed part-way may have left work on one lane touching buffers
/// recorded on another (its closing barrier was never enqueued): wait for every lane on
/// the host before the claim is released, so the trackers are true again. Best effort:
/// the first error (the enqueue's) is returned.
fn settle_on_error(lanes: &[StreamRef], out: Result<()>) -> Result<()> {
    if out.is_err() {
        for l in lanes {
            let _ = l.synchronize();
        }
    }
    out
}

/// What the threads of one own-kernel 1:1 communicator share.
struct World {
    shared: engine::Shared,
    meet: Meeting<Result<RankPost>>,
    /// `0..nranks`: the parties of a collective.
    ranks: Vec<usize>,
    /// How long a rank waits for the others.
    timeout: std::time::Duration,
}

enum RankInner {
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
        /// One rank per process from `from_launch`: the agreement on every collective
        /// through rank 0 (`None`: not checked).
        check: Option<Box<CallCheck>>,
    },
    /// Own kernels, one rank per process on one machine.
    #[cfg(feature = "ipc")]
    Procs(Box<procs::ProcsRank>),
}

/// One rank of a communicator, for the thread that drives that rank's device (see
/// [`Communicator::init_all`]). `Send`, not `Sync`.
pub struct RankComm {
    rank: usize,
    nranks: usize,
    device: Arc<Device>,
    inner: RankInner,
}

impl Drop for RankComm {
    fn drop(&mut self) {
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
            nccl::NcclComm::init_rank_process(nranks, id.as_bytes(), rank, timeout)?
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
                check: None,
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
        if let RankInner::Nccl { check: c, .. } = &mut comm.inner {
            *c = check.map(Box::new);
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
                check,
            } => {
                // One rank per process: the ranks agree on the collective through rank 0
                // before anything is enqueued; a call this rank cannot make is told to
                // the others at the same collective (send/recv are not checked).
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
                        nranks, &bytes, rank, *timeout,
                    )?);
                }
                let Some(comm) = comm.as_mut() else {
                    return Err(Error::InvalidArgument(
                        "this rank's NCCL initialisation failed earlier: make a new communicator"
                            .into(),
                    ));
                };
                let _claim = stream.claim([used.first().copied(), used.get(1).copied()])?;
                // SAFETY: validated against this rank's device; the stream is bound; the
                // buffers are claimed (ordered after their other uses) until enqueued.
                unsafe { comm.issue(&call, stream.raw()) }?;
                // What the communicator's drop waits for (bounded).
                comm.note_issued(stream)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rank: usize, kind: Kind, count: usize) -> Call {
        Call {
            rank,
            kind,
            dtype: DType::of::<f32>(),
            count,
            send: 0x1000,
            recv: 0x2000,
        }
    }

    #[test]
    fn dtype_table_agrees_with_the_trait() {
        fn check<T: CollectiveType>(c: &str) {
            assert_eq!(kernels::DTYPES[T::INDEX], (T::NAME, T::C_TYPE));
            assert_eq!(T::C_TYPE, c);
        }
        check::<f32>("float");
        check::<f64>("double");
        check::<half::f16>("h16");
        check::<half::bf16>("b16");
        check::<i32>("int");
        check::<i64>("long long");
        check::<u8>("unsigned char");
        assert_eq!(DType::of::<half::bf16>().size, 2);
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
    fn nccl_needs_distinct_devices_error_names_the_ranks() {
        let e = Error::DuplicateDevice {
            ordinal: 0,
            first: 0,
            second: 1,
        };
        assert!(e.to_string().contains("ranks 0 and 1"));
    }
}
