//! # gpubind: CUDA context binding as a compile-time guarantee
//!
//! CUDA binds a context to the calling **thread**. Code that drives several GPUs from one
//! thread must re-bind before every call (a cost on every operation) or risk running work
//! in the wrong context. gpubind makes the binding a value the borrow checker tracks:
//!
//! * [`ThreadContext`] — one token per thread (`!Send`, `!Sync`).
//! * [`ThreadContext::bind`] borrows the token mutably and returns a [`BoundDevice`]: at
//!   most one device is bound per thread at a time, and every operation that needs a
//!   current context is a method of `BoundDevice` (or of a [`BoundStream`] borrowed from
//!   it). Binding the same device again costs one `cuCtxGetCurrent` (a thread-local
//!   read in the driver) and no `cuCtxSetCurrent`.
//! * [`Device`] — `Arc`-shared, `Send + Sync`; enumeration and attributes create no
//!   context. The primary context is retained lazily on first bind.
//! * Resources — [`DeviceSlice`], [`Stream`], [`Event`], [`Module`] — hold an
//!   `Arc<Device>`, need no binding to move, share or drop, and free themselves in their
//!   own context without disturbing the thread's current binding.
//!
//! ```no_run
//! use gpubind::{Device, LaunchConfig, ThreadContext};
//!
//! fn main() -> gpubind::Result<()> {
//!     let mut ctx = ThreadContext::acquire()?;
//!     let dev = Device::get(0)?;
//!     let gpu = ctx.bind(&dev)?;
//!     let module = gpu.compile_and_load(
//!         r#"extern "C" __global__ void twice(float* x, unsigned n) {
//!                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
//!                if (i < n) x[i] *= 2.0f;
//!            }"#,
//!         "twice.cu",
//!     )?;
//!     let twice = module.function("twice")?;
//!     let mut x = gpu.clone_htod(&[1.0f32, 2.0, 3.0])?;
//!     let n = 3u32;
//!     // SAFETY: (float*, unsigned) matches the kernel, which stays in bounds.
//!     unsafe {
//!         gpu.default_stream()
//!             .launch(&twice, LaunchConfig::for_num_elems(n))
//!             .arg(&mut x).arg(&n)
//!             .launch()?;
//!     }
//!     assert_eq!(gpu.dtoh(&x)?, [2.0, 4.0, 6.0]);
//!     Ok(())
//! }
//! ```
//!
//! # Where each concept is explained
//!
//! * **Binding** — the token, one thread driving many GPUs or one thread per GPU, and
//!   what the types forbid: [`ThreadContext`].
//! * **Devices** — enumeration and attributes without a context, the lazily retained
//!   primary context: [`Device`].
//! * **Memory** — device memory and its views: [`DeviceSlice`]; page-locked host memory
//!   (pinned and registered): [`PinnedHostBuffer`]; managed memory: [`ManagedSlice`].
//! * **Copies** — every memory kind to every other, synchronous or stream-ordered, and
//!   why a copy scope rather than a guard: [`CopyScope`].
//! * **Streams and events** — [`Stream`], [`Event`], [`BoundStream`].
//! * **Kernels** — compiling, loading, the argument and limit checks: [`Module`];
//!   [`CompileOptions`] (what is checked, CUDA headers); kernels that own their module:
//!   [`SharedModule`] and [`Kernel`]; `__device__` / `__constant__` variables:
//!   [`ModuleGlobal`].
//! * **Launches** — [`LaunchConfig`] and [`LaunchBuilder`]; arguments read or written:
//!   [`LaunchArg`], [`WritableArg`]; cooperative, cluster and prioritised launches and
//!   what is checked for them: [`LaunchExBuilder`].
//! * **CUDA graphs** — what can be captured and how a capture stays sound: [`Capture`];
//!   then [`Graph`] and [`GraphExec`]; one step written once for a stream and a capture:
//!   [`Issue`].
//! * **Errors** — [`Error`]; calls that consume their input give it back on failure:
//!   [`GivenBack`].
//! * **Faults** — sticky errors that poison a device's context, and recovery:
//!   [`Error::ContextPoisoned`].
//! * **Drivers and libraries** — supported driver versions, entry points looked up by
//!   version, `GPUBIND_ASSUME_DRIVER_VERSION`: [`DriverVersion`], [`entry_points`]; which
//!   NVRTC (and cuBLAS) is loaded: [`nvrtc_info`].
//!
//! # Features
//!
//! The core above (devices, binding, memory of every kind, streams, events, NVRTC modules
//! and launches, copies) is always built. All on by default:
//!
//! * `collective` — `gpubind::collective`: communicators and groups, with gpubind's own
//!   kernels.
//! * `nccl` — the NCCL backend of the collectives (implies `collective`). Without it,
//!   `Backend::Nccl` is [`Error::FeatureDisabled`].
//! * `cublas` — `gpubind::blas`: cuBLAS matrix products.
//! * `ipc` — `gpubind::ipc`: device memory shared between processes.
//! * `dlpack` — `gpubind::dlpack`: DLPack export and import.
//!
//! [`Error`] is the same enum in every build.
//!
//! # One path per item
//!
//! The core's items are at the crate root (`gpubind::Device`, `gpubind::LaunchConfig`),
//! and its modules are private; [`interop`] (crossing over to cudarc) is the one public
//! core module. The optional parts are public modules whose items are reached only
//! through them (`gpubind::collective::Communicator`, `gpubind::ipc::MemoryPool`).
//!
//! ```compile_fail,E0603
//! use gpubind::device::Device; // error[E0603]: module `device` is private: gpubind::Device
//! ```
//!
//! ```compile_fail,E0432
//! use gpubind::Communicator; // error[E0432]: no root re-export: gpubind::collective::Communicator
//! ```
//!
//! # gpubind's types and `gpubind::cudarc` (semver)
//!
//! Public signatures use gpubind's types ([`Error`], [`DriverErrorCode`],
//! [`DeviceAttribute`], …), not cudarc's. cudarc types appear only in the raw escape
//! hatches, which exist to hand them out or take them: the `raw()` handles of
//! [`Stream`], [`BoundStream`], [`Event`], [`Module`], [`Function`] (and of `MemoryPool`),
//! [`BoundDevice::raw_context`], [`Device::raw_device`], [`Device::attribute_raw`],
//! [`DeviceSlice::raw_ptr`] / [`from_raw`](DeviceSlice::from_raw) /
//! [`into_raw`](DeviceSlice::into_raw), and the conversions
//! [`DriverErrorCode::as_cudarc`], `From<CUresult> for DriverErrorCode` and
//! `From<DeviceAttribute> for CUdevice_attribute`. The [`cudarc`] re-export is part of
//! gpubind's semver contract: moving to a cudarc release that is breaking by Cargo's
//! rules (0.19 → 0.20) is a breaking gpubind release.
//!
//! See `docs/design.md` in the repository for the type diagram and the invariants.

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub mod blas;
#[cfg(feature = "collective")]
#[cfg_attr(docsrs, doc(cfg(feature = "collective")))]
pub mod collective;
mod config;
mod context;
mod copy;
mod cuda_version;
mod device;
#[cfg(feature = "dlpack")]
#[cfg_attr(docsrs, doc(cfg(feature = "dlpack")))]
pub mod dlpack;
mod driver;
mod error;
#[cfg_attr(not(any(feature = "collective", feature = "ipc")), allow(dead_code))]
mod fnv;
mod graph;
pub mod interop;
#[cfg(feature = "ipc")]
#[cfg_attr(docsrs, doc(cfg(feature = "ipc")))]
pub mod ipc;
mod launch;
mod loader;
mod memory;
mod module;
mod stream;
mod sync;
mod teardown;
mod uuid;

/// Loom model checks of the crate-private primary-context seam and the token slot; run
/// with `RUSTFLAGS="--cfg loom" cargo test --release --lib loom_tests` (`.ci/run` does).
#[cfg(all(test, loom))]
mod loom_tests;

// The core's items, each at the root only (docs/design.md, "Public paths").
pub use context::{BoundDevice, ThreadContext};
pub use copy::{
    CopyDest, CopyScope, CopySource, DeviceOnlyMemory, Endpoint, MemoryKind, TrackedMemory,
};
pub use device::{Device, DeviceAttribute, MemoryUsage, Uuid};
#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub use driver::libraries::cublas_info;
pub use driver::libraries::{LibraryInfo, nvrtc_info, nvrtc_supported_archs};
pub use driver::version::{
    ASSUME_DRIVER_VERSION_ENV, DriverVersion, EntryPointStatus, driver_version, entry_points,
};
pub use driver::{driver_available, init};
pub use error::{DriverErrorCode, Error, GivenBack, Result, TransmuteRefusal};
pub use graph::{
    Capture, CaptureLaunch, Graph, GraphExec, InstantiateFlags, Issue, KernelLaunch, StreamLaunch,
};
pub use launch::{ClusterScheduling, LaunchBuilder, LaunchConfig, LaunchExBuilder};
pub use memory::host::{
    CaptureSource, HostMemory, PageLockedView, PageLockedViewMut, PinnedHostBuffer, PinnedOptions,
    RegisterOptions, RegisteredHost,
};
pub use memory::managed::{
    Advice, Location, ManagedAttach, ManagedSlice, ManagedView, ManagedViewMut,
};
pub use memory::pool::{DevicePool, PoolSetting};
pub use memory::{
    DeviceMemory, DeviceMemoryMut, DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut, MemsetValue,
};
pub use module::global::ModuleGlobal;
pub use module::{
    Arch, CompileOptions, CppStandard, Function, FunctionAttributes, Kernel, KernelArg, LaunchArg,
    Module, Output, PotentialBlockSize, SharedModule, WritableArg, compile, compile_with,
    cuda_include_dir, nvrtc_available,
};
pub use stream::{BorrowedStream, BoundStream, Event, EventFlags, Stream, StreamPriorityRange};

/// Raw cudarc bindings, re-exported for the escape hatches (`raw*` methods and the
/// conversions listed in the [crate docs](crate#gpubinds-types-and-gpubindcudarc-semver)).
/// Part of gpubind's semver contract: a breaking cudarc upgrade is a breaking gpubind
/// release.
pub use cudarc;
