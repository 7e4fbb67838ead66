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
//! use gpubind::{Device, ThreadContext, collective::{CommOptions, Communicator, Op}};
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
//! # fn f(ctx: &mut gpubind::ThreadContext, comm: &gpubind::collective::Communicator,
//! #      a: &gpubind::DeviceSlice<f32>, b: &gpubind::DeviceSlice<f32>,
//! #      out: &mut gpubind::DeviceSlice<f32>) -> gpubind::Result<()> {
//! use gpubind::collective::Op;
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
//! needs_sync::<gpubind::collective::Communicator>(); // error[E0277]
//! ```
//!
//! # One thread per GPU
//!
//! [`Communicator::init_all`] returns one [`RankComm`] per rank, each `Send`, for a
//! thread that binds its own device and passes the stream to enqueue on:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, ThreadContext, collective::{CommOptions, Communicator, Op}};
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
//! of that device ([`Capture::all_reduce`](crate::Capture::all_reduce)). One rank of an
//! NCCL [`RankComm`] (one rank per thread or process, any number of nodes) captures its
//! collectives into a graph of its device
//! ([`Capture::rank_all_reduce`](crate::Capture::rank_all_reduce), `rank_reduce`,
//! `rank_broadcast`, `rank_all_gather`, `rank_reduce_scatter`): every rank captures the
//! same ones and launches its graph with the others, agreed with them at capture and at
//! each launch when the rank checks its calls (docs/collective.md, "CUDA graphs"). Every
//! other collective — a `Communicator` with ranks on several devices, the host-staged
//! transport, NCCL driven by one thread for several devices, own-kernel `RankComm`s — is
//! [`Error::NotCapturable`].

// Layout: `api/` holds the public types, which validate each call and hand it to a
// backend through one trait call (`backend/interface.rs`); `backend/` holds the
// backends (`kernels/`: own kernels in one process, `procs/`: own kernels across the
// processes of one machine, `nccl/`, or its stand-in `nccl_off/` without the feature);
// `bootstrap/` is the launcher side of one rank per process (environment, unique id,
// TCP rendezvous); `callcheck/` is the per-collective agreement through rank 0.
mod api;
mod backend;
mod bootstrap;
mod callcheck;
mod support;

pub use api::{
    Backend, CollectiveType, CommOptions, Communicator, DEFAULT_COLLECTIVE_TIMEOUT, Group, Op,
    RankComm, Transport,
};
#[cfg(feature = "ipc")]
pub use backend::{PROCESS_STAGING_BYTES, ProcessGroup};
pub use backend::{nccl_available, nccl_version};
pub use bootstrap::{
    CHECK_VAR, DEFAULT_PORT, DEFAULT_TIMEOUT, LaunchEnv, Launcher, NCCL_UNIQUE_ID_BYTES,
    NcclUniqueId, PORT_VAR, PROTOCOL_VERSION, TIMEOUT_VAR,
};
pub use callcheck::CallCheck;

#[cfg(doc)]
use crate::context::ThreadContext;
#[cfg(doc)]
use crate::error::Error;

// Handles move between threads; a Communicator (NCCL handles inside) and a RankComm are
// never shared between threads.
static_assertions::assert_impl_all!(Communicator: Send);
static_assertions::assert_not_impl_any!(Communicator: Sync);
static_assertions::assert_impl_all!(RankComm: Send);
static_assertions::assert_not_impl_any!(RankComm: Sync);
