//! [`LaunchExBuilder`]: launches with attributes (cooperative, clusters, priority) through
//! `cuLaunchKernelEx` (documented on [`LaunchExBuilder`]), their checks, and the cluster
//! queries of [`Function`].

use super::builder::DriverLaunch;
use super::{LaunchBuilder, LaunchConfig};
use crate::device::Device;
use crate::driver::result;
use crate::driver::version::{self, LAUNCH_KERNEL_EX, OCCUPANCY_MAX_ACTIVE_CLUSTERS};
use crate::error::{Error, Result};
use crate::module::{Function, LaunchArg, WritableArg};
use cudarc::driver::sys;
use std::ffi::c_void;

/// How the hardware places a launch's clusters on the GPU's processing clusters
/// (`CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE`); a preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ClusterScheduling {
    /// The driver's choice (`CU_CLUSTER_SCHEDULING_POLICY_DEFAULT`).
    #[default]
    Default,
    /// Spread clusters over the processing clusters (`..._SPREAD`).
    Spread,
    /// Fill processing clusters evenly by load (`..._LOAD_BALANCING`).
    LoadBalancing,
}

impl ClusterScheduling {
    fn to_sys(self) -> sys::CUclusterSchedulingPolicy {
        use sys::CUclusterSchedulingPolicy as P;
        match self {
            ClusterScheduling::Default => P::CU_CLUSTER_SCHEDULING_POLICY_DEFAULT,
            ClusterScheduling::Spread => P::CU_CLUSTER_SCHEDULING_POLICY_SPREAD,
            ClusterScheduling::LoadBalancing => P::CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING,
        }
    }
}

/// The attributes of one launch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LaunchAttributes {
    cooperative: bool,
    cluster: Option<(u32, u32, u32)>,
    scheduling: Option<ClusterScheduling>,
    priority: Option<i32>,
}

/// At most this many attributes are passed (one of each kind).
const MAX_ATTRIBUTES: usize = 4;

impl LaunchAttributes {
    /// The driver's attribute list: `(array, count)`.
    fn to_sys(self) -> ([sys::CUlaunchAttribute; MAX_ATTRIBUTES], u32) {
        use sys::CUlaunchAttributeID as Id;
        let empty = || {
            // SAFETY: a C union of plain integers and structs of them: all-zero bytes
            // are a valid value of every member.
            let value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            sys::CUlaunchAttribute {
                id: Id::CU_LAUNCH_ATTRIBUTE_IGNORE,
                pad: [0; 4],
                value,
            }
        };
        let mut list = [empty(), empty(), empty(), empty()];
        let mut n = 0;
        if self.cooperative {
            list[n].id = Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            list[n].value.cooperative = 1;
            n += 1;
        }
        if let Some((x, y, z)) = self.cluster {
            list[n].id = Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            list[n].value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
            n += 1;
        }
        if let Some(policy) = self.scheduling {
            list[n].id = Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
            list[n].value.clusterSchedulingPolicyPreference = policy.to_sys();
            n += 1;
        }
        if let Some(p) = self.priority {
            list[n].id = Id::CU_LAUNCH_ATTRIBUTE_PRIORITY;
            list[n].value.priority = p;
            n += 1;
        }
        (list, n as u32)
    }
}

/// The driver's launch configuration for `cfg` on `stream` with `attrs` (`attrs` must
/// outlive every use of the result).
fn driver_launch_config(
    cfg: &LaunchConfig,
    stream: sys::CUstream,
    attrs: &mut [sys::CUlaunchAttribute],
    n: u32,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: n,
    }
}

/// A kernel launch with attributes. Built from a
/// [`LaunchBuilder`] by [`cooperative`](LaunchBuilder::cooperative),
/// [`cluster`](LaunchBuilder::cluster) or [`priority`](LaunchBuilder::priority).
///
/// A [`LaunchBuilder`] becomes a [`LaunchExBuilder`] by naming an attribute —
/// [`cooperative`](LaunchBuilder::cooperative), [`cluster`](LaunchBuilder::cluster),
/// [`priority`](LaunchBuilder::priority) — before its arguments; everything else is the
/// ordinary launch's: the same configuration and argument checks, the same claims of
/// buffer arguments and module globals, the same `unsafe` contract. The ordinary
/// `launch()` does not change (it still calls `cuLaunchKernel`).
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, module: &gpubind::Module) -> gpubind::Result<()> {
/// use gpubind::LaunchConfig;
/// let k = module.function("grid_sum")?;
/// let per_sm = k.max_active_blocks_per_sm(256, 0)?;
/// let sms = gpu.device().multiprocessor_count()?;
/// let cfg = LaunchConfig { grid_dim: (per_sm * sms, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
/// let mut out = gpu.alloc_zeros::<u32>(1)?;
/// // SAFETY: `grid_sum` takes (unsigned*) and stays in bounds.
/// unsafe {
///     gpu.default_stream().launch(&k, cfg).cooperative().arg(&mut out).launch()?;
/// }
/// # Ok(()) }
/// ```
///
/// Checked before the driver is called:
///
/// * **cooperative** (every block resident at once, so the kernel may synchronise the
///   whole grid): the device's `CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`
///   ([`Error::DeviceLacks`]), and the grid against the co-resident blocks,
///   [`Function::max_active_blocks_per_sm`] × `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`
///   ([`Error::LaunchLimit`] naming both).
/// * **cluster** `(x, y, z)` blocks (compute capability 9.0+): the device's
///   `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH` ([`Error::DeviceLacks`]); no zero dimension and
///   a dimension that matches the kernel's compile-time `__cluster_dims__` if it has one
///   ([`Error::InvalidArgument`]); each grid dimension a multiple of the cluster's
///   ([`Error::ClusterGrid`]); at most 8 blocks per cluster (the portable size) unless
///   the kernel allows more (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`, set with
///   [`Function::allow_non_portable_cluster_size`]; [`Error::LaunchLimit`]); and at
///   least one such cluster fitting on the device at once
///   ([`Function::max_active_clusters`]; [`Error::LaunchLimit`] with limit 0).
/// * **priority**: within the device's stream priority range
///   ([`Error::StreamPriority`]).
///
/// Cooperative and cluster launches together are [`Error::InvalidArgument`] (the
/// co-residency check would have to count clusters; gpubind does not offer it).
///
/// # Kernel source
///
/// NVRTC has no built-in `cooperative_groups.h`: `#include <cooperative_groups.h>` fails
/// ("could not open source file") unless the toolkit's include directory is passed, so
/// compile such kernels with [`compile`](crate::compile) and
/// `-I/usr/local/cuda/include` (then [`load_cubin`](crate::BoundDevice::load_cubin)).
/// `this_grid().sync()` needs no `-rdc` since CUDA 11. Without the headers, a grid
/// barrier can use the cooperative launch's workspace directly, as cooperative groups
/// does: its address is `{%envreg2, %envreg1}` (low, high), null for other launches, and
/// its second 32-bit word is the barrier (`tests/gpu_launch_features.rs` has one). The
/// cluster registers (`%cluster_ctarank`, `%cluster_nctarank`, `%clusterid`) and
/// distributed shared memory (`mapa.shared::cluster`, `ld.shared::cluster`,
/// `barrier.cluster.arrive` / `wait`) are plain PTX, usable through inline `asm` (sm_90).
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct LaunchExBuilder<'s, 'a> {
    inner: LaunchBuilder<'s, 'a>,
    attrs: LaunchAttributes,
}

impl std::fmt::Debug for LaunchExBuilder<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchExBuilder")
            .field("launch", &self.inner)
            .field("attributes", &self.attrs)
            .finish()
    }
}

impl<'s, 'a> LaunchBuilder<'s, 'a> {
    /// A cooperative launch (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`): every block of the grid
    /// is resident at once, so the kernel may synchronise the whole grid
    /// (cooperative groups' `this_grid().sync()`). See [`LaunchExBuilder::launch`]
    /// for what is checked. Name attributes before the arguments.
    pub fn cooperative(self) -> LaunchExBuilder<'s, 'a> {
        let mut ex = self.with_attributes();
        ex.cooperative();
        ex
    }

    /// A launch in thread-block clusters of `dims` blocks
    /// (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`, compute capability 9.0+). See
    /// [`LaunchExBuilder::cluster`].
    pub fn cluster(self, dims: (u32, u32, u32)) -> LaunchExBuilder<'s, 'a> {
        let mut ex = self.with_attributes();
        ex.cluster(dims);
        ex
    }

    /// A launch of priority `priority` (`CU_LAUNCH_ATTRIBUTE_PRIORITY`), whatever its
    /// stream's. See [`LaunchExBuilder::priority`].
    pub fn priority(self, priority: i32) -> LaunchExBuilder<'s, 'a> {
        let mut ex = self.with_attributes();
        ex.priority(priority);
        ex
    }

    /// The launch as a [`LaunchExBuilder`] with no attribute yet.
    fn with_attributes(self) -> LaunchExBuilder<'s, 'a> {
        LaunchExBuilder {
            inner: self,
            attrs: LaunchAttributes::default(),
        }
    }
}

impl<'s, 'a> LaunchExBuilder<'s, 'a> {
    /// Makes the launch cooperative; see [`LaunchBuilder::cooperative`].
    pub fn cooperative(&mut self) -> &mut Self {
        self.attrs.cooperative = true;
        self
    }

    /// Launches in clusters of `dims` blocks (x, y, z): the blocks of a cluster run at
    /// once on one GPU processing cluster and can synchronise and read each other's
    /// shared memory (CUDA's cluster API, or PTX `%cluster_ctarank`, `mapa`,
    /// `barrier.cluster`). Each grid dimension must be a multiple of the cluster's.
    pub fn cluster(&mut self, dims: (u32, u32, u32)) -> &mut Self {
        self.attrs.cluster = Some(dims);
        self
    }

    /// How the clusters are placed (a preference; only with [`cluster`](Self::cluster)).
    pub fn cluster_scheduling(&mut self, policy: ClusterScheduling) -> &mut Self {
        self.attrs.scheduling = Some(policy);
        self
    }

    /// The launch's scheduling priority (lower numbers are higher priorities), within
    /// the device's [`stream_priority_range`](crate::BoundDevice::stream_priority_range).
    pub fn priority(&mut self, priority: i32) -> &mut Self {
        self.attrs.priority = Some(priority);
        self
    }

    /// Appends an argument; see [`LaunchBuilder::arg`].
    #[inline]
    pub fn arg<L: LaunchArg<'a>>(&mut self, arg: L) -> &mut Self {
        self.inner.arg(arg);
        self
    }

    /// Appends a buffer argument that the kernel writes, borrowed shared; see
    /// [`LaunchBuilder::arg_written`].
    #[inline]
    pub fn arg_written<A: WritableArg + ?Sized>(&mut self, arg: &'a A) -> &mut Self {
        self.inner.arg_written(arg);
        self
    }

    /// Enqueues the kernel with `cuLaunchKernelEx`. Fails before the driver is called for
    /// everything [`LaunchBuilder::launch`] checks, and for the attributes' checks (listed on
    /// [`LaunchExBuilder`]); [`Error::Unsupported`] on a driver without
    /// `cuLaunchKernelEx`.
    ///
    /// # Safety
    ///
    /// As for [`LaunchBuilder::launch`] (the kernel writes only the buffers passed by
    /// `&mut` or to [`arg_written`](Self::arg_written); those passed by `&` are claimed
    /// as reads). A cooperative kernel that synchronises the grid, and a cluster kernel
    /// that uses the cluster's barrier or shared memory, must be launched with those
    /// attributes (else the sync is undefined).
    pub unsafe fn launch(&mut self) -> Result<()> {
        // A driver without the entry point fails here, before any check or claim.
        LAUNCH_KERNEL_EX.address()?;
        let driver = LaunchKernelEx { attrs: self.attrs };
        // SAFETY: the caller's contract is this function's; `LaunchKernelEx` enqueues the
        // kernel with exactly the configuration, stream and parameters it is given.
        unsafe { self.inner.enqueue(driver) }
    }
}

/// The end of a launch with attributes: their checks, then `cuLaunchKernelEx`.
struct LaunchKernelEx {
    attrs: LaunchAttributes,
}

impl DriverLaunch for LaunchKernelEx {
    fn check(&self, launch: &LaunchBuilder<'_, '_>) -> Result<()> {
        check_attributes(launch, &self.attrs)
    }

    unsafe fn call(
        self,
        func: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        params: *mut *mut c_void,
    ) -> Result<()> {
        let (mut list, n) = self.attrs.to_sys();
        let config = driver_launch_config(cfg, stream, &mut list, n);
        // SAFETY: the trait's contract (the function, stream and parameters the shared
        // path checked); `config` and the attribute list it points to live for the call.
        unsafe { version::launch_kernel_ex(&config, func, params, std::ptr::null_mut()) }
    }
}

/// The attributes' checks, after the ordinary launch's (so the block size is within the
/// kernel's limit and the dimensions are non-zero).
fn check_attributes(b: &LaunchBuilder<'_, '_>, attrs: &LaunchAttributes) -> Result<()> {
    let func = b.func;
    let device = func.module().device();
    let cfg = b.cfg;
    if attrs.cooperative && attrs.cluster.is_some() {
        return Err(Error::InvalidArgument(format!(
            "kernel `{}`: a launch both cooperative and in clusters (gpubind does not check \
             the co-residency of clusters; launch one or the other)",
            func.name()
        )));
    }
    if attrs.scheduling.is_some() && attrs.cluster.is_none() {
        return Err(Error::InvalidArgument(format!(
            "kernel `{}`: a cluster scheduling policy without a cluster dimension",
            func.name()
        )));
    }
    if let Some(p) = attrs.priority {
        let range = b.stream.bound().stream_priority_range()?;
        if !range.contains(p) {
            return Err(Error::StreamPriority {
                device: device.ordinal(),
                requested: p,
                greatest: range.greatest,
                least: range.least,
            });
        }
    }
    if attrs.cooperative {
        require_capability(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            "CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH",
            "a cooperative launch",
            None,
        )?;
        let (x, y, z) = cfg.block_dim;
        let per_sm = func.max_active_blocks_per_sm(x * y * z, cfg.shared_mem_bytes as usize)?;
        check_cooperative(
            func.name(),
            grid_blocks(&cfg),
            per_sm,
            device.multiprocessor_count()?,
        )?;
    }
    if let Some(cluster) = attrs.cluster {
        require_cluster_launch(device, "a launch in thread-block clusters", CLUSTER_HINT)?;
        let shape = func.cluster_shape()?;
        check_cluster(func.name(), cfg.grid_dim, cluster, &shape)?;
        let fit = func.max_active_clusters(cfg, cluster)?;
        if fit == 0 {
            return Err(Error::LaunchLimit {
                kernel: func.name().to_owned(),
                what: "clusters of this shape that fit on the device at once \
                       (cuOccupancyMaxActiveClusters: its blocks' threads, registers or \
                       shared memory do not fit one GPU processing cluster)",
                requested: 1,
                limit: 0,
            });
        }
    }
    Ok(())
}

/// [`Error::DeviceLacks`] unless `device` reports device attribute `attr` (named
/// `capability`), which `what` needs.
fn require_capability(
    device: &Device,
    attr: sys::CUdevice_attribute,
    capability: &'static str,
    what: &'static str,
    hint: Option<&'static str>,
) -> Result<()> {
    if device.attribute_raw(attr)? == 0 {
        return Err(Error::DeviceLacks {
            device: device.ordinal(),
            capability,
            what,
            hint,
        });
    }
    Ok(())
}

/// Why a device may lack cluster launches.
const CLUSTER_HINT: Option<&str> = Some("clusters need compute capability 9.0 or newer");

/// [`require_capability`] of `CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`, for `what`.
fn require_cluster_launch(
    device: &Device,
    what: &'static str,
    hint: Option<&'static str>,
) -> Result<()> {
    require_capability(
        device,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
        "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH",
        what,
        hint,
    )
}

/// [`Error::InvalidArgument`] for a cluster with a zero dimension.
fn check_cluster_dims(kernel: &str, cluster: (u32, u32, u32)) -> Result<()> {
    if [cluster.0, cluster.1, cluster.2].contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "kernel `{kernel}`: cluster dimensions must be non-zero (cluster {cluster:?})"
        )));
    }
    Ok(())
}

/// Blocks in the grid.
fn grid_blocks(cfg: &LaunchConfig) -> u64 {
    let (x, y, z) = cfg.grid_dim;
    u64::from(x) * u64::from(y) * u64::from(z)
}

/// [`Error::LaunchLimit`] unless `blocks` fit co-resident: `per_sm` on each of `sms`.
pub(crate) fn check_cooperative(kernel: &str, blocks: u64, per_sm: u32, sms: u32) -> Result<()> {
    let limit = u64::from(per_sm) * u64::from(sms);
    if blocks > limit {
        return Err(Error::LaunchLimit {
            kernel: kernel.to_owned(),
            what: "blocks of a cooperative launch exceed the blocks that can be resident at \
                   once (cuOccupancyMaxActiveBlocksPerMultiprocessor for this block size and \
                   shared memory × CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)",
            requested: blocks,
            limit,
        });
    }
    Ok(())
}

/// A kernel's cluster attributes, read at a cluster launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ClusterShape {
    /// `CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{WIDTH,HEIGHT,DEPTH}`: the compile-time
    /// `__cluster_dims__`, or zeros.
    pub(crate) required: (u32, u32, u32),
    /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
    pub(crate) non_portable: bool,
}

/// The portable cluster size: what every cluster-capable GPU runs.
pub const PORTABLE_CLUSTER_SIZE: u32 = 8;

/// The shape checks of a cluster launch (see the module docs).
pub(crate) fn check_cluster(
    kernel: &str,
    grid: (u32, u32, u32),
    cluster: (u32, u32, u32),
    shape: &ClusterShape,
) -> Result<()> {
    check_cluster_dims(kernel, cluster)?;
    let (cx, cy, cz) = cluster;
    if shape.required != (0, 0, 0) && shape.required != cluster {
        return Err(Error::InvalidArgument(format!(
            "kernel `{kernel}`: compiled with __cluster_dims__{:?} \
             (CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH), launched with cluster \
             {cluster:?}",
            shape.required
        )));
    }
    if !grid.0.is_multiple_of(cx) || !grid.1.is_multiple_of(cy) || !grid.2.is_multiple_of(cz) {
        return Err(Error::ClusterGrid {
            kernel: kernel.to_owned(),
            grid,
            cluster,
        });
    }
    let size = u64::from(cx) * u64::from(cy) * u64::from(cz);
    if !shape.non_portable && size > u64::from(PORTABLE_CLUSTER_SIZE) {
        return Err(Error::LaunchLimit {
            kernel: kernel.to_owned(),
            what: "blocks per cluster exceed the portable cluster size (allow more with \
                   Function::allow_non_portable_cluster_size, \
                   CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
            requested: size,
            limit: PORTABLE_CLUSTER_SIZE.into(),
        });
    }
    Ok(())
}

impl Function<'_> {
    /// The kernel's cluster attributes (`cuFuncGetAttribute`).
    fn cluster_shape(&self) -> Result<ClusterShape> {
        use sys::CUfunction_attribute as F;
        let _guard = self.module().device().enter()?;
        let get = |a| crate::module::func_attribute(self.raw_handle(), a);
        Ok(ClusterShape {
            required: (
                get(F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)?,
                get(F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT)?,
                get(F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH)?,
            ),
            non_portable: get(F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)? != 0,
        })
    }

    /// Lets launches of this kernel use clusters larger than the portable 8 blocks
    /// (`cuFuncSetAttribute` with `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`;
    /// up to 16 on Hopper). A device without clusters is [`Error::DeviceLacks`].
    pub fn allow_non_portable_cluster_size(&self, allow: bool) -> Result<()> {
        let device = self.module().device();
        require_cluster_launch(device, "a non-portable cluster size", None)?;
        let _guard = device.enter()?;
        // SAFETY: a valid function of the module's context, current for the call.
        device.check(unsafe {
            result::module::func_set_attribute(
                self.raw_handle(),
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                i32::from(allow),
            )
        })
    }

    /// How many clusters of `cluster` blocks, each block as `cfg` describes (block size
    /// and dynamic shared memory; the grid is not used), can be resident on the device
    /// at once (`cuOccupancyMaxActiveClusters`). 0: such a cluster does not fit. Needs no
    /// binding.
    ///
    /// A zero dimension is [`Error::InvalidArgument`]; a block over the kernel's limit
    /// [`Error::LaunchLimit`]; a driver without the entry point [`Error::Unsupported`].
    ///
    /// ```no_run
    /// # fn f(module: &gpubind::Module) -> gpubind::Result<()> {
    /// use gpubind::LaunchConfig;
    /// let k = module.function("cluster_kernel")?;
    /// let cfg = LaunchConfig { grid_dim: (2, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    /// println!("{} clusters of 2 at once", k.max_active_clusters(cfg, (2, 1, 1))?);
    /// # Ok(()) }
    /// ```
    pub fn max_active_clusters(&self, cfg: LaunchConfig, cluster: (u32, u32, u32)) -> Result<u32> {
        check_cluster_dims(self.name(), cluster)?;
        // The grid is not used, but the driver checks it against the cluster: one cluster.
        let cfg = LaunchConfig {
            grid_dim: cluster,
            ..cfg
        };
        cfg.validate()?;
        let (x, y, z) = cfg.block_dim;
        crate::module::check_block_size(
            self.name(),
            x.saturating_mul(y).saturating_mul(z),
            self.limits(),
        )?;
        // A driver without the entry point fails here, before the context is entered.
        OCCUPANCY_MAX_ACTIVE_CLUSTERS.address()?;
        let attrs = LaunchAttributes {
            cluster: Some(cluster),
            ..LaunchAttributes::default()
        };
        let (mut list, n) = attrs.to_sys();
        let config = driver_launch_config(&cfg, std::ptr::null_mut(), &mut list, n);
        let device = self.module().device();
        let _guard = device.enter()?;
        // SAFETY: a valid function of the module's context, current for the call;
        // `config` and its attribute list live for the call.
        let clusters = device
            .check(unsafe { version::occupancy_max_active_clusters(self.raw_handle(), &config) })?;
        Ok(clusters.max(0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooperative_grids_must_fit_co_resident() {
        // 132 SMs × 8 blocks each.
        assert!(check_cooperative("k", 1056, 8, 132).is_ok());
        assert!(check_cooperative("k", 1, 1, 1).is_ok());
        let e = check_cooperative("grid_sum", 1057, 8, 132).unwrap_err();
        assert!(matches!(
            &e,
            Error::LaunchLimit { kernel, what, requested: 1057, limit: 1056 }
                if kernel == "grid_sum"
                    && what.contains("cuOccupancyMaxActiveBlocksPerMultiprocessor")
                    && what.contains("MULTIPROCESSOR_COUNT")
        ));
        // A kernel that does not fit at all (0 blocks per SM).
        assert!(matches!(
            check_cooperative("k", 1, 0, 132),
            Err(Error::LaunchLimit { limit: 0, .. })
        ));
        // Grids larger than u32 blocks still compare exactly.
        assert!(check_cooperative("k", u64::from(u32::MAX) * 4, u32::MAX, 4).is_ok());
    }

    #[test]
    fn cluster_shapes_are_checked() {
        let plain = ClusterShape::default();
        assert!(check_cluster("k", (8, 1, 1), (2, 1, 1), &plain).is_ok());
        assert!(check_cluster("k", (4, 4, 2), (2, 2, 2), &plain).is_ok());
        // Each grid dimension must be a multiple.
        assert_eq!(
            check_cluster("k", (7, 1, 1), (2, 1, 1), &plain),
            Err(Error::ClusterGrid {
                kernel: "k".into(),
                grid: (7, 1, 1),
                cluster: (2, 1, 1)
            })
        );
        assert!(matches!(
            check_cluster("k", (4, 3, 1), (2, 2, 1), &plain),
            Err(Error::ClusterGrid { .. })
        ));
        assert!(matches!(
            check_cluster("k", (2, 2, 3), (1, 1, 2), &plain),
            Err(Error::ClusterGrid { .. })
        ));
        // Zero dimensions.
        assert!(matches!(
            check_cluster("k", (8, 1, 1), (0, 1, 1), &plain),
            Err(Error::InvalidArgument(m)) if m.contains("non-zero")
        ));
        // Over the portable size, unless the kernel allows more.
        let e = check_cluster("k", (16, 1, 1), (16, 1, 1), &plain).unwrap_err();
        assert!(matches!(
            &e,
            Error::LaunchLimit { requested: 16, limit: 8, what, .. }
                if what.contains("NON_PORTABLE_CLUSTER_SIZE_ALLOWED")
        ));
        assert!(matches!(
            check_cluster("k", (4, 4, 1), (3, 3, 1), &plain),
            Err(Error::ClusterGrid { .. })
        ));
        assert!(matches!(
            check_cluster("k", (9, 9, 1), (3, 3, 1), &plain),
            Err(Error::LaunchLimit { requested: 9, .. })
        ));
        let wide = ClusterShape {
            non_portable: true,
            ..plain
        };
        assert!(check_cluster("k", (16, 1, 1), (16, 1, 1), &wide).is_ok());
        // A kernel compiled with __cluster_dims__ takes only that shape.
        let fixed = ClusterShape {
            required: (2, 1, 1),
            non_portable: false,
        };
        assert!(check_cluster("k", (8, 1, 1), (2, 1, 1), &fixed).is_ok());
        assert!(matches!(
            check_cluster("k", (8, 1, 1), (4, 1, 1), &fixed),
            Err(Error::InvalidArgument(m)) if m.contains("__cluster_dims__")
        ));
        // The message names the grid and the cluster.
        assert_eq!(
            check_cluster("k", (3, 1, 1), (2, 1, 1), &plain)
                .unwrap_err()
                .to_string(),
            "kernel `k`: grid (3, 1, 1) is not a whole number of clusters of (2, 1, 1) blocks \
             (each grid dimension must be a multiple of the cluster's)"
        );
    }

    #[test]
    fn attributes_become_the_drivers_list() {
        use sys::CUlaunchAttributeID as Id;
        let (_, n) = LaunchAttributes::default().to_sys();
        assert_eq!(n, 0);
        let all = LaunchAttributes {
            cooperative: true,
            cluster: Some((2, 3, 4)),
            scheduling: Some(ClusterScheduling::Spread),
            priority: Some(-3),
        };
        let (list, n) = all.to_sys();
        assert_eq!(n, 4);
        assert_eq!(list[0].id, Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
        assert_eq!(list[1].id, Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
        assert_eq!(
            list[2].id,
            Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
        );
        assert_eq!(list[3].id, Id::CU_LAUNCH_ATTRIBUTE_PRIORITY);
        // SAFETY: reading the members just written.
        unsafe {
            assert_eq!(list[0].value.cooperative, 1);
            let d = list[1].value.clusterDim;
            assert_eq!((d.x, d.y, d.z), (2, 3, 4));
            assert_eq!(
                list[2].value.clusterSchedulingPolicyPreference,
                sys::CUclusterSchedulingPolicy::CU_CLUSTER_SCHEDULING_POLICY_SPREAD
            );
            assert_eq!(list[3].value.priority, -3);
        }
        let only_cluster = LaunchAttributes {
            cluster: Some((2, 1, 1)),
            ..LaunchAttributes::default()
        };
        let (list, n) = only_cluster.to_sys();
        assert_eq!(n, 1);
        assert_eq!(list[0].id, Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    }
}
