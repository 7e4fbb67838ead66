//! Kernel launches: a configuration, a builder that collects the arguments, and the
//! checked driver call.
//!
//! A launch takes three steps, one type each:
//!
//! 1. **Configuration** — [`LaunchConfig`]: grid, block and dynamic shared memory
//!    ([`LaunchConfig::for_num_elems`]: one thread per element).
//! 2. **Builder** — [`BoundStream::launch`](crate::BoundStream::launch) starts a
//!    [`LaunchBuilder`] for one [`Function`](crate::Function) on one stream;
//!    [`arg`](LaunchBuilder::arg) appends the kernel's arguments in order (gpubind
//!    buffers, module globals, plain values).
//! 3. **Launch** — [`LaunchBuilder::launch`] (`unsafe`: the arguments must match what
//!    the kernel declares) checks, before the driver is called, the arguments' devices
//!    ([`Error::WrongDevice`](crate::Error::WrongDevice)), the configuration against the
//!    device's and the kernel's limits ([`Error::LaunchLimit`](crate::Error::LaunchLimit)),
//!    and the argument count and sizes ([`Error::LaunchArgs`](crate::Error::LaunchArgs));
//!    claims the buffer arguments and the module (the kernel runs after their pending
//!    uses on other streams, and their later uses and frees wait for it); then calls
//!    `cuLaunchKernel`.
//!
//! Naming an **attribute** before the arguments —
//! [`cooperative`](LaunchBuilder::cooperative), [`cluster`](LaunchBuilder::cluster),
//! [`priority`](LaunchBuilder::priority) — turns the builder into a [`LaunchExBuilder`].
//! Its `launch()` takes the same path with the same `unsafe` contract, adds the
//! attributes' own checks (below) before anything is claimed, and calls
//! `cuLaunchKernelEx` (CUDA 12.0+, looked up by version: see
//! [`crate::driver::version`]) instead. The ordinary `launch()` does not change.
//!
//! ```no_run
//! # fn f(gpu: &gpubind::BoundDevice<'_>, module: &gpubind::Module) -> gpubind::Result<()> {
//! use gpubind::LaunchConfig;
//! let k = module.function("grid_sum")?;
//! let per_sm = k.max_active_blocks_per_sm(256, 0)?;
//! let sms = gpu.device().multiprocessor_count()?;
//! let cfg = LaunchConfig { grid_dim: (per_sm * sms, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
//! let mut out = gpu.alloc_zeros::<u32>(1)?;
//! // SAFETY: `grid_sum` takes (unsigned*) and stays in bounds.
//! unsafe {
//!     gpu.default_stream().launch(&k, cfg).cooperative().arg(&mut out).launch()?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Launch attributes
//!
//! Checked before the driver is called:
//!
//! * **cooperative** (every block resident at once, so the kernel may synchronise the
//!   whole grid): the device's `CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`
//!   ([`Error::DeviceLacks`](crate::Error::DeviceLacks)), and the grid against the
//!   co-resident blocks,
//!   [`Function::max_active_blocks_per_sm`](crate::Function::max_active_blocks_per_sm)
//!   × `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`
//!   ([`Error::LaunchLimit`](crate::Error::LaunchLimit) naming both).
//! * **cluster** `(x, y, z)` blocks (compute capability 9.0+): the device's
//!   `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`
//!   ([`Error::DeviceLacks`](crate::Error::DeviceLacks)); no zero dimension and a
//!   dimension that matches the kernel's compile-time `__cluster_dims__` if it has one
//!   ([`Error::InvalidArgument`](crate::Error::InvalidArgument)); each grid dimension a
//!   multiple of the cluster's ([`Error::ClusterGrid`](crate::Error::ClusterGrid)); at
//!   most 8 blocks per cluster (the portable size) unless the kernel allows more
//!   (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`, set with
//!   [`Function::allow_non_portable_cluster_size`](crate::Function::allow_non_portable_cluster_size);
//!   [`Error::LaunchLimit`](crate::Error::LaunchLimit)); and at least one such cluster
//!   fitting on the device at once
//!   ([`Function::max_active_clusters`](crate::Function::max_active_clusters);
//!   [`Error::LaunchLimit`](crate::Error::LaunchLimit) with limit 0).
//! * **priority**: within the device's stream priority range
//!   ([`Error::StreamPriority`](crate::Error::StreamPriority)).
//!
//! Cooperative and cluster launches together are
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument) (the co-residency check
//! would have to count clusters; gpubind does not offer it).
//!
//! # Kernel source
//!
//! NVRTC has no built-in `cooperative_groups.h`: `#include <cooperative_groups.h>` fails
//! ("could not open source file") unless the toolkit's include directory is passed, so
//! compile such kernels with [`compile`](crate::compile) and
//! `-I/usr/local/cuda/include` (then [`load_cubin`](crate::BoundDevice::load_cubin)).
//! `this_grid().sync()` needs no `-rdc` since CUDA 11. Without the headers, a grid
//! barrier can use the cooperative launch's workspace directly, as cooperative groups
//! does: its address is `{%envreg2, %envreg1}` (low, high), null for other launches, and
//! its second 32-bit word is the barrier (`tests/gpu_launch_features.rs` has one). The
//! cluster registers (`%cluster_ctarank`, `%cluster_nctarank`, `%clusterid`) and
//! distributed shared memory (`mapa.shared::cluster`, `ld.shared::cluster`,
//! `barrier.cluster.arrive` / `wait`) are plain PTX, usable through inline `asm` (sm_90).

mod attributes;
mod builder;
mod config;

pub use attributes::{ClusterScheduling, LaunchExBuilder};
pub use builder::LaunchBuilder;
pub use config::LaunchConfig;
