//! Devices: enumeration and attributes without a context, and the lazily retained primary
//! context (documented on [`Device`]).

mod kept;
pub mod poison;
mod usage;

pub use crate::uuid::Uuid;
pub use usage::MemoryUsage;
pub(crate) use usage::UsageCounter;

use crate::device::poison::PoisonState;
use crate::driver::{self, ContextGuard, CudaPrimary, PrimaryCtxOps, RawContext, result};
use crate::error::{Error, Result};
use crate::sync;
use cudarc::driver::sys;
use std::fmt;
use std::sync::{Arc, Weak};

macro_rules! device_attributes {
    ($($(#[$doc:meta])* $name:ident = $raw:ident,)*) => {
        /// A device attribute for [`Device::attribute`]: gpubind's names for the common
        /// `CU_DEVICE_ATTRIBUTE_*` values (not cudarc's enum, so a cudarc update does not
        /// change this type). `#[non_exhaustive]`: more may be added. Any other attribute
        /// can be read through the raw escape hatch [`Device::attribute_raw`].
        ///
        /// ```
        /// use gpubind::DeviceAttribute;
        /// let a = DeviceAttribute::MaxThreadsPerBlock;
        /// assert_eq!(a.name(), "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK");
        /// assert_eq!(a.to_string(), a.name());
        /// assert!(DeviceAttribute::ALL.contains(&a));
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DeviceAttribute {
            $($(#[$doc])* $name,)*
        }

        impl DeviceAttribute {
            /// Every attribute of this enum, in declaration order.
            pub const ALL: &'static [DeviceAttribute] = &[$(DeviceAttribute::$name,)*];

            /// The driver's name, e.g. `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
            pub fn name(self) -> &'static str {
                match self {
                    $(DeviceAttribute::$name => stringify!($raw),)*
                }
            }

            /// The driver's value of this attribute.
            pub(crate) fn to_sys(self) -> sys::CUdevice_attribute {
                match self {
                    $(DeviceAttribute::$name => sys::CUdevice_attribute::$raw,)*
                }
            }
        }
    };
}

device_attributes! {
    /// Maximum threads per block.
    MaxThreadsPerBlock = CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    /// Maximum block dimension x.
    MaxBlockDimX = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
    /// Maximum block dimension y.
    MaxBlockDimY = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
    /// Maximum block dimension z.
    MaxBlockDimZ = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
    /// Maximum grid dimension x.
    MaxGridDimX = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
    /// Maximum grid dimension y.
    MaxGridDimY = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
    /// Maximum grid dimension z.
    MaxGridDimZ = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
    /// Shared memory a block may use without opting in, in bytes.
    MaxSharedMemoryPerBlock = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
    /// Shared memory a block may use after opting in (`cuFuncSetAttribute`), in bytes.
    MaxSharedMemoryPerBlockOptin = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    /// Constant memory, in bytes.
    TotalConstantMemory = CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY,
    /// Threads per warp.
    WarpSize = CU_DEVICE_ATTRIBUTE_WARP_SIZE,
    /// Largest pitch of a pitched copy, in bytes.
    MaxPitch = CU_DEVICE_ATTRIBUTE_MAX_PITCH,
    /// 32-bit registers available to a block.
    MaxRegistersPerBlock = CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
    /// Typical clock rate, in kHz.
    ClockRate = CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
    /// Streaming multiprocessors.
    MultiprocessorCount = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    /// 1 when kernels have a run-time limit (a display watchdog).
    KernelExecTimeout = CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT,
    /// 1 for a GPU integrated with the host's memory.
    Integrated = CU_DEVICE_ATTRIBUTE_INTEGRATED,
    /// 1 when host memory can be mapped into the device's address space.
    CanMapHostMemory = CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
    /// The compute mode (0 default, 2 prohibited, 3 exclusive process).
    ComputeMode = CU_DEVICE_ATTRIBUTE_COMPUTE_MODE,
    /// 1 when kernels of one context may run concurrently.
    ConcurrentKernels = CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS,
    /// 1 when ECC is on.
    EccEnabled = CU_DEVICE_ATTRIBUTE_ECC_ENABLED,
    /// PCI bus id.
    PciBusId = CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
    /// PCI device (slot) id.
    PciDeviceId = CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
    /// PCI domain id.
    PciDomainId = CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
    /// Peak memory clock, in kHz.
    MemoryClockRate = CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
    /// Global memory bus width, in bits.
    GlobalMemoryBusWidth = CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
    /// L2 cache size, in bytes.
    L2CacheSize = CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
    /// Maximum resident threads per multiprocessor.
    MaxThreadsPerMultiprocessor = CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
    /// Copy engines that can run concurrently with kernels.
    AsyncEngineCount = CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
    /// 1 when the device shares a unified address space with the host.
    UnifiedAddressing = CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
    /// Compute capability, major number.
    ComputeCapabilityMajor = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    /// Compute capability, minor number.
    ComputeCapabilityMinor = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    /// 1 when streams may have priorities.
    StreamPrioritiesSupported = CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED,
    /// Shared memory per multiprocessor, in bytes.
    MaxSharedMemoryPerMultiprocessor = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    /// 32-bit registers per multiprocessor.
    MaxRegistersPerMultiprocessor = CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
    /// 1 when the device can allocate managed memory.
    ManagedMemory = CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
    /// 1 when the device is on a multi-GPU board.
    MultiGpuBoard = CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD,
    /// 1 when device-host atomics are native.
    HostNativeAtomicSupported = CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED,
    /// 1 when kernels can access pageable host memory coherently.
    PageableMemoryAccess = CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
    /// 1 when host and device may access managed memory concurrently.
    ConcurrentManagedAccess = CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
    /// 1 when compute preemption is supported.
    ComputePreemptionSupported = CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED,
    /// 1 when cooperative kernels can be launched.
    CooperativeLaunch = CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
    /// 1 when pageable access goes through the host's page tables.
    PageableMemoryAccessUsesHostPageTables = CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
    /// 1 when the host can access managed memory directly, without migration.
    DirectManagedMemAccessFromHost = CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
    /// Maximum resident blocks per multiprocessor.
    MaxBlocksPerMultiprocessor = CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
    /// Largest persisting L2 cache set-aside, in bytes.
    MaxPersistingL2CacheSize = CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
    /// Largest access-policy window, in bytes.
    MaxAccessPolicyWindowSize = CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
    /// Shared memory the driver reserves per block, in bytes.
    ReservedSharedMemoryPerBlock = CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
    /// 1 when the virtual memory management APIs (`cuMemMap`, …) are supported.
    VirtualAddressManagementSupported = CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
    /// 1 when `cuMemHostRegister` is supported.
    HostRegisterSupported = CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
    /// 1 when host memory can be registered read-only.
    ReadOnlyHostRegisterSupported = CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
    /// 1 when stream-ordered memory pools (`cuMemAllocAsync`) are supported.
    MemoryPoolsSupported = CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    /// Bit mask of the handle types memory pools can export for IPC.
    MempoolSupportedHandleTypes = CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
    /// 1 when allocations can be exported as POSIX file descriptors.
    HandleTypePosixFileDescriptorSupported = CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    /// 1 when GPUDirect RDMA is supported.
    GpuDirectRdmaSupported = CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
}

impl fmt::Display for DeviceAttribute {
    /// The driver's name ([`DeviceAttribute::name`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The raw value, for calling cudarc or the driver directly.
impl From<DeviceAttribute> for sys::CUdevice_attribute {
    fn from(a: DeviceAttribute) -> Self {
        a.to_sys()
    }
}

/// One CUDA device, shared by `Arc`.
///
/// `Device::get(n)` returns the same `Arc` while one is alive, so every holder shares one
/// lazily retained primary context.
///
/// Everything on [`Device`] uses `cuDevice*` calls only, which need `cuInit` but no
/// context, so listing devices and reading their attributes costs no GPU memory. The
/// device's primary context is retained the first time a [`ThreadContext`] binds it, by
/// exactly one thread even when many bind at once, and released when the last
/// `Arc<Device>` (held by the caller, slices, streams, modules…) drops.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::Device;
/// for dev in Device::all()? {
///     let (major, minor) = dev.compute_capability()?;
///     println!("{}: {} (sm_{major}{minor}, {} MiB)", dev.ordinal(), dev.name(),
///              dev.total_memory()? >> 20);
///     assert!(!dev.has_retained_context()); // no context was created
/// }
/// # Ok(()) }
/// ```
///
/// [`ThreadContext`]: crate::ThreadContext
pub struct Device {
    ordinal: usize,
    raw: sys::CUdevice,
    name: String,
    uuid: Uuid,
    primary: LazyPrimary<CudaPrimary>,
    /// Events for stream hand-offs (`crate::access`), created on demand and reused.
    events: std::sync::Mutex<Vec<PooledEvent>>,
    /// Whether a sticky error poisoned the context, and the last kernel launched.
    poison: PoisonState,
    /// The launch limits, read on first launch (`cuDeviceGetAttribute`, no context).
    limits: std::sync::OnceLock<DeviceLimits>,
    /// The gate of the primary context's legacy default stream (`crate::access`'s fast
    /// path).
    legacy_gate: crate::sync::Gate,
    /// The default memory pool's handle (as an integer), or `None` on a device without
    /// memory pools: decided once, by `crate::memory::pool`.
    default_pool: std::sync::OnceLock<Option<usize>>,
    /// Bytes held by this device's `DeviceSlice`s and `ManagedSlice`s, and their peak.
    usage: UsageCounter,
    /// Values kept for the device's lifetime and the modules they loaded (unloaded by
    /// the drop): see [`Device::kept`].
    kept: kept::Kept,
}

/// A pooled `CUevent` (timing disabled) of one device's primary context.
pub(crate) struct PooledEvent(pub(crate) sys::CUevent);

// SAFETY: an event handle is a thread-agnostic identifier; it is used only with its
// device's context current.
unsafe impl Send for PooledEvent {}

/// The device attributes a launch configuration must respect, read once per [`Device`]
/// (see [`Device::launch_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    /// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
    pub(crate) max_threads_per_block: u32,
    /// `CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X/Y/Z`.
    pub(crate) max_block_dim: [u32; 3],
    /// `CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X/Y/Z`.
    pub(crate) max_grid_dim: [u32; 3],
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK`: static plus dynamic shared
    /// memory a block gets without opting in (48 KiB).
    pub(crate) shared_per_block: u32,
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`: the most a kernel can opt
    /// in to (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`); 0 where the device has
    /// no opt-in.
    pub(crate) shared_per_block_optin: u32,
}

pub(crate) fn registry() -> &'static std::sync::Mutex<Vec<Weak<Device>>> {
    static REGISTRY: std::sync::OnceLock<std::sync::Mutex<Vec<Weak<Device>>>> =
        std::sync::OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Device {
    /// How many CUDA devices are visible. Creates no context.
    pub fn count() -> Result<usize> {
        driver::init()?;
        Ok(result::device::count()?.max(0) as usize)
    }

    /// The device with this ordinal, or [`Error::BadOrdinal`]. Creates no context.
    pub fn get(ordinal: usize) -> Result<Arc<Device>> {
        let count = Device::count()?;
        if ordinal >= count {
            return Err(Error::BadOrdinal { ordinal, count });
        }
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if reg.len() < count {
            reg.resize_with(count, Weak::new);
        }
        if let Some(dev) = reg[ordinal].upgrade() {
            return Ok(dev);
        }
        let dev = Arc::new(Device::open(ordinal)?);
        reg[ordinal] = Arc::downgrade(&dev);
        Ok(dev)
    }

    /// Every visible device, in ordinal order. Creates no context.
    pub fn all() -> Result<Vec<Arc<Device>>> {
        (0..Device::count()?).map(Device::get).collect()
    }

    fn open(ordinal: usize) -> Result<Device> {
        let raw = result::device::get(ordinal as i32)?;
        let name = result::device::name(raw)?;
        let uuid = result::device::uuid(raw)?;
        Ok(Device::with_state(
            ordinal,
            raw,
            name,
            Uuid(uuid.bytes.map(|b| b as u8)),
        ))
    }

    /// A `Device` of these identifiers, with no context retained and no state yet.
    fn with_state(ordinal: usize, raw: sys::CUdevice, name: String, uuid: Uuid) -> Device {
        Device {
            ordinal,
            raw,
            name,
            uuid,
            primary: LazyPrimary::new(CudaPrimary, raw),
            events: std::sync::Mutex::new(Vec::new()),
            poison: PoisonState::default(),
            limits: std::sync::OnceLock::new(),
            legacy_gate: crate::sync::Gate::default(),
            default_pool: std::sync::OnceLock::new(),
            usage: UsageCounter::default(),
            kept: kept::Kept::default(),
        }
    }

    /// A `Device` that names no driver device and retains no context, for unit tests of
    /// state kept on the device (poisoning): nothing on it may call the driver.
    #[cfg(test)]
    pub(crate) fn unopened_for_test(ordinal: usize) -> Device {
        Device::with_state(
            ordinal,
            0,
            format!("unopened test device {ordinal}"),
            Uuid([0; 16]),
        )
    }

    /// The first visible device whose UUID is `uuid`, if any.
    pub fn by_uuid(uuid: Uuid) -> Result<Option<Arc<Device>>> {
        Ok(Device::all()?.into_iter().find(|d| d.uuid == uuid))
    }

    /// The ordinal in this process (depends on `CUDA_VISIBLE_DEVICES`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device memory gpubind's allocations of this device hold: bytes in use now and
    /// the most in use at once ([`MemoryUsage`]). Counted are the
    /// [`DeviceSlice`](crate::DeviceSlice)s (every `alloc*`, `clone_htod`, `from_raw`
    /// slice, and the library's own buffers: cuBLAS workspaces, collective staging) and
    /// [`ManagedSlice`](crate::ManagedSlice)s, from allocation until drop (or `into_raw`);
    /// not IPC pool or imported memory, host memory, nor what the driver, cuBLAS or NCCL
    /// allocate themselves. Unlike [`memory_info`](crate::BoundDevice::memory_info), it
    /// sees only this process's gpubind allocations, needs no binding and calls no
    /// driver function.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let dev = Device::get(0)?;
    /// let gpu = ctx.bind(&dev)?;
    /// dev.reset_peak_memory_usage();
    /// let before = dev.memory_usage().in_use;
    /// let a = gpu.alloc_zeros::<f32>(1 << 20)?;
    /// drop(a);
    /// let u = dev.memory_usage();
    /// assert_eq!(u.in_use, before);
    /// assert!(u.peak >= before + (4 << 20));
    /// # Ok(()) }
    /// ```
    pub fn memory_usage(&self) -> MemoryUsage {
        self.usage.get()
    }

    /// Sets the peak of [`memory_usage`](Self::memory_usage) to the bytes in use now
    /// (for example at the start of each training step).
    pub fn reset_peak_memory_usage(&self) {
        self.usage.reset_peak()
    }

    /// The counter of [`memory_usage`](Self::memory_usage).
    pub(crate) fn usage(&self) -> &UsageCounter {
        &self.usage
    }

    /// The marketing name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device UUID.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        Ok((
            self.attribute(DeviceAttribute::ComputeCapabilityMajor)? as u32,
            self.attribute(DeviceAttribute::ComputeCapabilityMinor)? as u32,
        ))
    }

    /// Total device memory in bytes (`cuDeviceTotalMem`).
    pub fn total_memory(&self) -> Result<usize> {
        result::device::total_mem(self.raw)
    }

    /// A device attribute (`cuDeviceGetAttribute`). Creates no context.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, DeviceAttribute};
    /// let dev = Device::get(0)?;
    /// let warp = dev.attribute(DeviceAttribute::WarpSize)?;
    /// assert_eq!(warp, 32);
    /// # Ok(()) }
    /// ```
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32> {
        self.attribute_raw(attr.to_sys())
    }

    /// Raw escape hatch: any `CU_DEVICE_ATTRIBUTE_*` of the driver, as cudarc names it
    /// (for attributes [`DeviceAttribute`] does not list). Takes a cudarc type: see the
    /// crate docs on `gpubind::cudarc` and semver.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::cudarc::driver::sys::CUdevice_attribute as A;
    /// let dev = gpubind::Device::get(0)?;
    /// let numa = dev.attribute_raw(A::CU_DEVICE_ATTRIBUTE_NUMA_CONFIG)?;
    /// # let _ = numa; Ok(()) }
    /// ```
    pub fn attribute_raw(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        // An attribute value this driver does not know is refused with
        // CUDA_ERROR_INVALID_VALUE (a typed error).
        result::device::attribute(self.raw, attr)
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> Result<u32> {
        Ok(self.attribute(DeviceAttribute::MultiprocessorCount)? as u32)
    }

    /// Whether kernels on `self` can access memory of `peer` directly
    /// (`cuDeviceCanAccessPeer`; needs no context; `true` for the device itself). Access
    /// is then enabled with [`BoundDevice::enable_peer_access`](crate::BoundDevice::enable_peer_access).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// let (d0, d1) = (gpubind::Device::get(0)?, gpubind::Device::get(1)?);
    /// println!("0 -> 1 peer access: {}", d0.can_access_peer(&d1)?);
    /// # Ok(()) }
    /// ```
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if peer.ordinal == self.ordinal {
            return Ok(true);
        }
        result::device::can_access_peer(self.raw, peer.raw)
    }

    /// The launch limits if they have been read ([`launch_limits`](Self::launch_limits)):
    /// the launch's inlined quick check.
    #[inline(always)]
    pub(crate) fn known_launch_limits(&self) -> Option<&DeviceLimits> {
        self.limits.get()
    }

    /// The launch limits, read from the driver on first use and kept (attributes need no
    /// context). A failed read is returned and not cached.
    pub(crate) fn launch_limits(&self) -> Result<&DeviceLimits> {
        if let Some(l) = self.limits.get() {
            return Ok(l);
        }
        use DeviceAttribute as A;
        let attr = |a| -> Result<u32> { Ok(self.attribute(a)?.max(0) as u32) };
        let read = DeviceLimits {
            max_threads_per_block: attr(A::MaxThreadsPerBlock)?,
            max_block_dim: [
                attr(A::MaxBlockDimX)?,
                attr(A::MaxBlockDimY)?,
                attr(A::MaxBlockDimZ)?,
            ],
            max_grid_dim: [
                attr(A::MaxGridDimX)?,
                attr(A::MaxGridDimY)?,
                attr(A::MaxGridDimZ)?,
            ],
            shared_per_block: attr(A::MaxSharedMemoryPerBlock)?,
            shared_per_block_optin: attr(A::MaxSharedMemoryPerBlockOptin)?,
        };
        // A concurrent first launch may have filled it meanwhile: same values either way.
        Ok(self.limits.get_or_init(|| read))
    }

    /// The `T` this device keeps for its lifetime (the collective backends' kernels),
    /// made by `make` on first use; `make` returns it with the modules it loaded, which
    /// the device unloads in its drop, its context current (`device::kept`). `T` must
    /// not hold an `Arc<Device>` (the device would never drop), and whoever launches
    /// from those modules holds the device (so they stay loaded while it runs).
    #[cfg_attr(not(feature = "collective"), allow(dead_code))]
    pub(crate) fn kept<T: std::any::Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> Result<(T, Vec<sys::CUmodule>)>,
    ) -> Result<Arc<T>> {
        self.kept.get_or_make(make)
    }

    /// Where `crate::memory::pool` keeps this device's default memory pool, once known.
    pub(crate) fn default_pool_slot(&self) -> &std::sync::OnceLock<Option<usize>> {
        &self.default_pool
    }

    /// Whether *this process's* `Arc<Device>` holds a retain on the primary context,
    /// i.e. whether some thread has bound it. No driver call.
    pub fn has_retained_context(&self) -> bool {
        self.primary.is_retained()
    }

    /// Whether the driver reports the primary context active in this process
    /// (`cuDevicePrimaryCtxGetState`), whoever retained it. Creates no context.
    pub fn is_primary_context_active(&self) -> Result<bool> {
        Ok(result::context::primary_state(self.raw)?.1)
    }

    /// The raw `CUdevice` handle, for calling cudarc or the driver directly.
    pub fn raw_device(&self) -> sys::CUdevice {
        self.raw
    }

    /// The primary context, retained on first call; plus the retain's unique id (each
    /// successful retain gets a fresh one).
    pub(crate) fn primary_context(&self) -> Result<(RawContext, u64)> {
        self.primary.get().map_err(|e| match e {
            // The driver reports a sticky error of the process at the retain: poison.
            Error::Driver { call, code, .. }
                if crate::device::poison::is_sticky(code.as_cudarc()) =>
            {
                self.poison_with(call, code.as_cudarc())
            }
            e => e,
        })
    }

    /// Pushes this device's primary context until the guard drops (no-op if current).
    ///
    /// For calls that must run in this device's context whatever is bound — frees and
    /// destroys in `Drop`, event queries, function lookups.
    #[inline]
    pub(crate) fn enter(&self) -> Result<ContextGuard> {
        self.check_poison()?;
        // Once retained, the context is one load away (no `Result` through memory).
        let ctx = match self.primary.retained() {
            Some((ctx, _)) => ctx,
            None => self.primary_context()?.0,
        };
        ContextGuard::push(ctx.0)
    }

    /// Whether a sticky error (an illegal address, a device-side assert, …) poisoned this
    /// device's context; see [`Error::ContextPoisoned`] for what that means and how to
    /// recover.
    pub fn is_poisoned(&self) -> bool {
        self.poison.get().is_some()
    }

    /// [`Error::ContextPoisoned`] if the context is poisoned: called before any driver
    /// call into it.
    #[inline]
    pub(crate) fn check_poison(&self) -> Result<()> {
        match self.poison.get() {
            None => Ok(()),
            Some(p) => Err(crate::device::poison::error(self, p)),
        }
    }

    /// Passes on the result of a driver call made in this device's context or on one of
    /// its streams, deciding what an error means for the device: a sticky error
    /// (`poison::is_sticky`: an illegal address, a device-side assert, …) poisons the
    /// device and is [`Error::ContextPoisoned`]; other errors pass unchanged.
    ///
    /// Every driver call into the device that can report a sticky error goes through
    /// this (the driver layer itself decides nothing about devices).
    #[inline]
    pub(crate) fn check<T>(&self, result: Result<T>) -> Result<T> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(self.on_error(e)),
        }
    }

    /// What an error of a driver call into this device becomes: see
    /// [`check`](Self::check). Out of line: the success path stays a compare.
    #[cold]
    #[inline(never)]
    pub(crate) fn on_error(&self, error: Error) -> Error {
        match error {
            Error::Driver { call, code, .. }
                if crate::device::poison::is_sticky(code.as_cudarc()) =>
            {
                self.poison_with(call, code.as_cudarc())
            }
            other => other,
        }
    }

    /// Poisons the device (the first poisoning wins) and returns its
    /// [`Error::ContextPoisoned`]. For a sticky error a driver call reported, and for
    /// work that may still be appended to one of its streams that nothing can order later
    /// uses or frees after (an `ncclCommAbort` that did not return; cudarc's work on a
    /// lent buffer that neither a device-side wait nor `cuCtxSynchronize` could order).
    /// From then on every call into the device is [`Error::ContextPoisoned`] naming
    /// `call` and `code`, and every buffer of it is leaked rather than freed, so late work
    /// cannot write freed memory.
    pub(crate) fn poison_with(&self, call: &'static str, code: sys::CUresult) -> Error {
        let p = self.poison.poison(call, code).clone();
        crate::device::poison::error(self, &p)
    }

    /// The gate of the primary context's legacy default stream (`crate::access`).
    pub(crate) fn legacy_gate(&self) -> &crate::sync::Gate {
        &self.legacy_gate
    }

    /// The poison state (records the last kernel launched, and the first sticky error).
    pub(crate) fn poison_state(&self) -> &PoisonState {
        &self.poison
    }

    /// An event of this device's primary context for a stream hand-off: from the pool, or
    /// new. Give it back with [`return_event`](Self::return_event).
    pub(crate) fn take_event(&self) -> Result<PooledEvent> {
        if let Some(e) = self.events.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(e);
        }
        self.new_handoff_event().map(PooledEvent)
    }

    /// A new `CU_EVENT_DISABLE_TIMING` event of this device's primary context, for
    /// hand-offs (the pool's, and each gpubind stream's own). The caller destroys it.
    pub(crate) fn new_handoff_event(&self) -> Result<sys::CUevent> {
        let _guard = self.enter()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: this device's context is current; the caller destroys the event.
        self.check(unsafe { result::event::create(flags) })
    }

    /// Returns a hand-off event to the pool (once nothing will wait on a later record of
    /// it through this use: `cuStreamWaitEvent` captures the event's state at the call).
    pub(crate) fn return_event(&self, event: PooledEvent) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// Fails with [`Error::WrongDevice`] unless `other` is this device.
    pub(crate) fn expect_same(&self, what: &'static str, other: &Device) -> Result<()> {
        if self.ordinal == other.ordinal {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what,
                bound: self.ordinal,
                found: other.ordinal,
            })
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let events = std::mem::take(self.events.get_mut().unwrap_or_else(|p| p.into_inner()));
        let modules = self.kept.take_modules();
        if (events.is_empty() && modules.is_empty()) || !self.has_retained_context() {
            return;
        }
        let ordinal = Some(self.ordinal);
        let n = events.len();
        match self.enter() {
            // A poisoned context runs nothing more; its reset unloads the modules.
            Err(e) => crate::error::report_drop(
                format_args!(
                    "the Device's {n} pooled hand-off events and {} kept modules",
                    modules.len()
                ),
                ordinal,
                crate::error::ENTER,
                &e,
                crate::error::LEAKED,
            ),
            // Relaxed: the Device's last reference may go while a stream is captured
            // elsewhere (another library, global mode), and these events and modules
            // are never part of a capture.
            Ok(_guard) => {
                let relaxed = crate::driver::with_relaxed_capture_mode(|| {
                    for ev in events {
                        // SAFETY: created by cuEventCreate in this (still retained, current)
                        // context and destroyed once, here; no wait refers to it any more
                        // (waits capture the event's state when enqueued).
                        if let Err(e) = unsafe { result::event::destroy(ev.0) } {
                            crate::error::report_drop(
                                format_args!("a pooled hand-off event of the Device"),
                                ordinal,
                                crate::error::RELEASE,
                                &e,
                                crate::error::MAYBE_LEAKED,
                            );
                        }
                    }
                    for m in modules {
                        // SAFETY: loaded in this (still retained, current) context and handed
                        // to the device by `Device::kept`, unloaded once, here. No launch from
                        // it can be pending: whoever launched held this device, and every
                        // gpubind resource's drop waited for its own uses or leaked an
                        // `Arc<Device>` (so this drop would not run).
                        if let Err(e) = unsafe { result::module::unload(m) } {
                            crate::error::report_drop(
                                format_args!("a module kept by the Device"),
                                ordinal,
                                crate::error::RELEASE,
                                &e,
                                crate::error::MAYBE_LEAKED,
                            );
                        }
                    }
                });
                if let Err(e) = relaxed {
                    crate::error::report_drop(
                        format_args!("the Device's pooled hand-off events and kept modules"),
                        ordinal,
                        crate::error::ENTER,
                        &e,
                        crate::error::LEAKED,
                    );
                }
            }
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("uuid", &self.uuid)
            .field("context_retained", &self.has_retained_context())
            .finish()
    }
}

/// A primary context retained at most once, on first use, and released on drop.
///
/// Generic over the driver calls (`PrimaryCtxOps`) so the loom tests (`src/loom_tests.rs`)
/// can model them; gpubind itself only uses `LazyPrimary<CudaPrimary>` inside [`Device`].
/// Crate-private: a public `LazyPrimary<CudaPrimary>` could be built and dropped by safe
/// code, releasing a retain that it never took.
///
/// ```compile_fail,E0603
/// use gpubind::device::LazyPrimary; // error[E0603]: module `device` is private
/// ```
pub(crate) struct LazyPrimary<O: PrimaryCtxOps> {
    ops: O,
    device: i32,
    state: sync::Mutex<Option<(O::Ctx, u64)>>,
    /// `state`'s value once a retain succeeded, read without the lock: it is only ever
    /// set once, and cleared only by the drop (`&mut`), so every `enter` after the first
    /// bind costs one load.
    retained: std::sync::OnceLock<(O::Ctx, u64)>,
}

/// Each successful retain gets a new id, so a context released and retained again can be
/// told apart from the earlier retain. (`ThreadContext::bind` no longer caches it: it
/// asks the driver which context is current.)
static NEXT_RETAIN_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl<O: PrimaryCtxOps> LazyPrimary<O> {
    /// Nothing retained yet.
    pub(crate) fn new(ops: O, device: i32) -> Self {
        LazyPrimary {
            ops,
            device,
            state: sync::Mutex::new(None),
            retained: std::sync::OnceLock::new(),
        }
    }

    /// The context and its retain id, retaining it first if no caller has yet. Concurrent
    /// first callers serialise on the lock: exactly one retains, the rest see its result.
    /// A failed retain is not cached; the next call tries again.
    pub(crate) fn get(&self) -> Result<(O::Ctx, u64)> {
        if let Some(&v) = self.retained.get() {
            return Ok(v);
        }
        let mut state = sync::lock(&self.state);
        if let Some(v) = *state {
            return Ok(v);
        }
        let ctx = self.ops.retain(self.device)?;
        let id = NEXT_RETAIN_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *state = Some((ctx, id));
        // Under the lock, after `state`: the only set, so it cannot fail.
        let _ = self.retained.set((ctx, id));
        Ok((ctx, id))
    }

    /// The context and its retain id if a retain succeeded ([`get`](Self::get) without
    /// retaining): one load.
    #[inline(always)]
    pub(crate) fn retained(&self) -> Option<(O::Ctx, u64)> {
        self.retained.get().copied()
    }

    /// Whether a retain is held.
    pub(crate) fn is_retained(&self) -> bool {
        sync::lock(&self.state).is_some()
    }

    /// The driver ops (for the loom tests, which inspect a mock).
    #[cfg(all(test, loom))]
    pub(crate) fn ops(&self) -> &O {
        &self.ops
    }
}

impl<O: PrimaryCtxOps> Drop for LazyPrimary<O> {
    fn drop(&mut self) {
        if sync::lock(&self.state).take().is_some() {
            self.ops.release(self.device);
        }
    }
}
