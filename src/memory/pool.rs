//! Stream-ordered allocation from a device's default memory pool: [`BoundStream::alloc`],
//! [`BoundStream::alloc_zeros`], and the pool's settings ([`DevicePool`]).
//!
//! A buffer allocated on a stream is an ordinary [`DeviceSlice`]: the allocation
//! (`cuMemAllocFromPoolAsync` from the device's default pool) is recorded as a write on
//! that stream, so its first use on another stream waits on the device for it, and its
//! drop frees it in stream order (`cuMemFreeAsync`) on a stream of its pending uses,
//! without waiting on the host (`crate::teardown::ordered_free`). A loop that allocates
//! a temporary, launches on it and drops it costs no host synchronisation.
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let stream = gpu.new_stream()?;
//! let s = gpu.on(&stream)?;
//! for _ in 0..1000 {
//!     let mut tmp = s.alloc_zeros::<f32>(1 << 20)?; // ordered on `stream`
//!     s.memset_async(&mut tmp, 1.0)?;
//! } // each drop frees on `stream`: no host wait
//! dev.memory_pool()?.set_release_threshold(256 << 20)?;
//! # Ok(()) }
//! ```
//!
//! Devices without memory pools (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` = 0, or a
//! driver below CUDA 11.2) allocate with `cuMemAlloc` instead, and their buffers' drops
//! wait as every `cuMemAlloc` buffer's does (docs/memory.md, "Stream-ordered
//! allocation"). The fallback exists so that code written with stream-ordered
//! temporaries runs unchanged, and stays correct, on every device gpubind supports: it
//! loses only the speed (a synchronous allocation, a drop that waits on the host), never
//! the ordering.

use super::{DeviceRepr, DeviceSlice};
use crate::access::{AccessTracker, StreamSlot};
use crate::cuda_version::DriverVersion;
use crate::device::Device;
use crate::driver::result::{self, memory, pool};
use crate::error::{Error, Result};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::sync::Arc;

/// The first driver with memory pools (`cuMemAllocAsync`, `cuMemFreeAsync`).
const POOLS_SINCE: DriverVersion = DriverVersion::new(11, 2);

/// Whether gpubind allocates from the device's pool: the device says it has memory pools
/// (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`, `supported`) and the driver gpubind acts
/// on (capped by `GPUBIND_ASSUME_DRIVER_VERSION`) has them.
pub(crate) fn pools_usable(supported: i32, driver: DriverVersion) -> bool {
    supported != 0 && driver >= POOLS_SINCE
}

/// The device's default memory pool, or `None` when gpubind does not allocate from pools
/// on it ([`pools_usable`]); asked once per [`Device`]. A failed query is returned and
/// not cached.
#[inline]
pub(crate) fn default_pool(device: &Device) -> Result<Option<sys::CUmemoryPool>> {
    #[cfg(any(test, feature = "test-seams"))]
    if seam::pools_hidden(device.ordinal()) {
        return Ok(None);
    }
    match device.default_pool_slot().get() {
        Some(known) => Ok(known.map(|p| p as sys::CUmemoryPool)),
        None => find_default_pool(device),
    }
}

/// [`default_pool`]'s first query of a device, out of line.
#[cold]
#[inline(never)]
fn find_default_pool(device: &Device) -> Result<Option<sys::CUmemoryPool>> {
    let slot = device.default_pool_slot();
    let supported = device.attribute(crate::device::DeviceAttribute::MemoryPoolsSupported)?;
    let found = if pools_usable(supported, crate::driver::version::driver_version()?) {
        Some(result::device::default_mem_pool(device.raw_device())? as usize)
    } else {
        None
    };
    Ok(slot.get_or_init(|| found).map(|p| p as sys::CUmemoryPool))
}

/// The test seam that sends a device's allocations down the path of devices without
/// memory pools, so that path runs on a GPU that has them.
#[cfg(any(test, feature = "test-seams"))]
mod seam {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// One bit per device ordinal (below 64) whose pool is hidden.
    static HIDDEN: AtomicU64 = AtomicU64::new(0);

    pub(super) fn pools_hidden(ordinal: usize) -> bool {
        ordinal < 64 && HIDDEN.load(Ordering::Relaxed) & (1 << ordinal) != 0
    }

    pub(super) fn hide_pool(ordinal: usize, hidden: bool) {
        if ordinal < 64 {
            if hidden {
                HIDDEN.fetch_or(1 << ordinal, Ordering::Relaxed);
            } else {
                HIDDEN.fetch_and(!(1 << ordinal), Ordering::Relaxed);
            }
        }
    }
}

#[cfg(any(test, feature = "test-seams"))]
impl Device {
    /// Test seam: while `hidden`, gpubind treats this device as one without memory pools
    /// ([`BoundStream::alloc`] falls back to `cuMemAlloc`, [`Device::memory_pool`] is
    /// [`Error::DeviceLacks`]), process-wide. Buffers already allocated from the pool keep
    /// freeing in stream order. Not part of the API.
    #[doc(hidden)]
    pub fn hide_memory_pool_for_test(&self, hidden: bool) {
        seam::hide_pool(self.ordinal(), hidden);
    }
}

impl<'b> BoundStream<'b> {
    /// Allocates `len` uninitialised elements from the device's default memory pool,
    /// ordered on this stream (`cuMemAllocFromPoolAsync`); returns at once, without
    /// waiting for the stream.
    ///
    /// The memory exists from this point of the stream on: gpubind records the
    /// allocation as a write on this stream, so a use on another stream (or from the
    /// host) waits for it. Dropping the slice frees it in stream order
    /// (`cuMemFreeAsync`) on a stream of its pending uses, after every other one, without
    /// a host wait (docs/safety.md, "Drops"). On a device without memory pools this is a
    /// synchronous `cuMemAlloc` ([`BoundDevice::alloc`](crate::BoundDevice::alloc)).
    ///
    /// Kernels of other devices cannot reach pool memory (peer access does not extend to
    /// the default pool), and it cannot be exported as a legacy IPC handle: use
    /// `BoundDevice::alloc` for such buffers. On a stream shared with cudarc or borrowed
    /// while its owner captures it, [`Error::NotCapturable`] (the allocation would be the
    /// graph's).
    ///
    /// # Safety
    ///
    /// The contents are whatever the pool's memory held. Reading them before writing is
    /// not memory-unsafe for [`DeviceRepr`] types, but almost never what you want; prefer
    /// [`alloc_zeros`](Self::alloc_zeros) unless a kernel or copy overwrites every
    /// element first.
    pub unsafe fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<DeviceSlice<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow usize bytes"))
        })?;
        let device = self.bound().device();
        // The slice is built once, at the end: a `DeviceSlice` moved through the results
        // of helpers costs a copy at each.
        match self.alloc_from_pool(bytes)? {
            Pooled::Nothing => Ok(DeviceSlice::owning(
                Arc::clone(device),
                0,
                len,
                AccessTracker::default(),
                false,
            )),
            Pooled::At(ptr) => Ok(self.pooled_slice(ptr, len)),
            Pooled::Foreign(ptr) => self.foreign_pooled_slice(ptr, len, None),
            // SAFETY: the caller's contract is this function's.
            Pooled::NoPool => unsafe { self.bound().alloc::<T>(len) },
        }
    }

    /// [`alloc`](Self::alloc)'s driver work, the same for every element type: `bytes`
    /// from the device's default pool, ordered on this stream.
    fn alloc_from_pool(&self, bytes: usize) -> Result<Pooled> {
        if bytes == 0 {
            return Ok(Pooled::Nothing);
        }
        let device = self.bound().device();
        let Some(pool) = default_pool(device)? else {
            return Ok(Pooled::NoPool);
        };
        // `ensure_stream_context`, with a foreign stream diverted: the legacy stream is the
        // current context's; a gpubind stream needs no context.
        match self.slot() {
            StreamSlot::Legacy(_) => self.bound().ensure_current()?,
            StreamSlot::Owned(s) => {
                device.check_poison()?;
                if s.foreign {
                    return self.alloc_from_pool_foreign(s, pool, bytes);
                }
            }
        }
        // SAFETY: the default pool of this stream's device (never destroyed) and a live
        // stream of that device (borrowed); the caller's slice owns the memory, uses it
        // only after this point of the stream (its tracker's write) and frees it once.
        let ptr = device
            .check(unsafe { memory::alloc_from_pool_async(bytes, pool, self.slot().raw()) })?;
        Ok(Pooled::At(ptr))
    }

    /// [`alloc_from_pool`](Self::alloc_from_pool) on a stream another library owns (out
    /// of line: gpubind's own streams pay nothing for it). Refused while its owner
    /// captures it (an allocation there would be a graph's allocation node, memory that
    /// exists only while the graph runs); the caller records the stream's end mark after
    /// the allocation (and its zeroing), before the slice's tracker records it
    /// ([`foreign_pooled_slice`](Self::foreign_pooled_slice)).
    #[cold]
    #[inline(never)]
    fn alloc_from_pool_foreign(
        &self,
        stream: &crate::access::StreamInner,
        pool: sys::CUmemoryPool,
        bytes: usize,
    ) -> Result<Pooled> {
        stream.refuse_capture()?;
        // SAFETY: as in `alloc_from_pool`.
        let ptr = self
            .bound()
            .device()
            .check(unsafe { memory::alloc_from_pool_async(bytes, pool, self.slot().raw()) })?;
        Ok(Pooled::Foreign(ptr))
    }

    /// The slice of pool memory allocated on a foreign stream just now: zeroed there
    /// first when `zero` gives its size, then the stream's end mark recorded
    /// (`crate::access`'s `foreign` module), then the slice built (its tracker records
    /// the allocation as its one pending write on this stream).
    #[cold]
    #[inline(never)]
    fn foreign_pooled_slice<T: DeviceRepr>(
        &self,
        ptr: sys::CUdeviceptr,
        len: usize,
        zero: Option<usize>,
    ) -> Result<DeviceSlice<T>> {
        let zeroed = zero.map_or(Ok(()), |bytes| self.zero_pooled(ptr, bytes));
        self.slot().after_enqueue();
        let slice = self.pooled_slice(ptr, len);
        zeroed.map(|()| slice)
    }

    /// Allocates `len` elements from the device's default memory pool, zeroed, both
    /// ordered on this stream (`cuMemAllocFromPoolAsync`, `cuMemsetD8Async`); returns at
    /// once. See [`alloc`](Self::alloc).
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, stream: &gpubind::Stream) -> gpubind::Result<()> {
    /// let s = gpu.on(stream)?;
    /// let tmp = s.alloc_zeros::<u32>(4096)?;
    /// assert_eq!(gpu.dtoh(&tmp)?, vec![0; 4096]); // the host read waits for the stream
    /// # Ok(()) }
    /// ```
    pub fn alloc_zeros<T: DeviceRepr>(&self, len: usize) -> Result<DeviceSlice<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow usize bytes"))
        })?;
        match self.alloc_from_pool(bytes)? {
            // Pool memory allocated on this stream just now, zeroed on it at once: no use
            // can be ordered before the memset, so it needs no claim, and the slice built
            // after it records the allocation (ordered before the memset) as its one
            // pending write on this stream, which covers the memset too. The slice is built
            // once, in the result (a `DeviceSlice` moved through helpers' results costs a
            // copy at each); if the memset fails it is built and dropped (freed in stream
            // order, as any drop frees it).
            Pooled::At(ptr) => match self.zero_pooled(ptr, bytes) {
                Ok(()) => Ok(self.pooled_slice(ptr, len)),
                Err(e) => {
                    drop(self.pooled_slice::<T>(ptr, len));
                    Err(e)
                }
            },
            Pooled::Foreign(ptr) => self.foreign_pooled_slice(ptr, len, Some(bytes)),
            Pooled::Nothing => Ok(DeviceSlice::owning(
                Arc::clone(self.bound().device()),
                0,
                len,
                AccessTracker::default(),
                false,
            )),
            Pooled::NoPool => {
                // `cuMemAlloc` memory: zeroed with a claim, as any write.
                // SAFETY: zeroed below, on this stream, before any other use can be
                // ordered after the allocation.
                let mut buf = unsafe { self.bound().alloc::<T>(len)? };
                self.memset_zeros_async(&mut buf)?;
                Ok(buf)
            }
        }
    }

    /// The slice that owns `len` elements of pool memory at `ptr`, allocated on this
    /// stream ([`alloc_from_pool`](Self::alloc_from_pool)).
    #[inline(always)]
    fn pooled_slice<T: DeviceRepr>(&self, ptr: sys::CUdeviceptr, len: usize) -> DeviceSlice<T> {
        DeviceSlice::owning(
            Arc::clone(self.bound().device()),
            ptr,
            len,
            AccessTracker::allocated_on(self.slot()),
            true,
        )
    }

    /// Zeroes `bytes` of pool memory at `ptr`, just allocated on this stream.
    fn zero_pooled(&self, ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
        // SAFETY: the whole of a live allocation, on a stream of the current context (or a
        // gpubind stream) whose allocation precedes this in stream order.
        let zeroed = unsafe { result::copy::memset_d8_async(ptr, 0, bytes, self.slot().raw()) };
        self.bound().device().check(zeroed)
    }
}

/// What [`BoundStream::alloc_from_pool`] allocated.
enum Pooled {
    /// Nothing: no bytes were asked for.
    Nothing,
    /// Pool memory at this address.
    At(sys::CUdeviceptr),
    /// Pool memory at this address, allocated on a foreign stream: its end mark is not
    /// recorded yet.
    Foreign(sys::CUdeviceptr),
    /// Nothing: the device has no pool gpubind uses ([`default_pool`]); allocate with
    /// `cuMemAlloc`.
    NoPool,
}

/// A device's default memory pool (`cuDeviceGetDefaultMemPool`), the pool
/// [`BoundStream::alloc`] takes from: its settings and usage. From
/// [`Device::memory_pool`]; cheap to clone. The pool itself belongs to the device and
/// lives as long as it.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// let pool = gpubind::Device::get(0)?.memory_pool()?;
/// pool.set_release_threshold(u64::MAX)?; // keep freed memory for reuse
/// println!("{} bytes in use, {} reserved", pool.used_bytes()?, pool.reserved_bytes()?);
/// pool.trim_to(0)?; // give the unused reserve back
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DevicePool {
    device: Arc<Device>,
    raw: usize,
}

impl std::fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePool")
            .field("device", &self.device.ordinal())
            .finish()
    }
}

/// A setting of a [`DevicePool`] (`CUmemPool_attribute`), for [`DevicePool::get`] and
/// [`DevicePool::set`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolSetting {
    /// Bytes the pool keeps reserved when it synchronises instead of returning them to
    /// the system (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; default 0).
    ReleaseThreshold,
    /// Whether a free's event dependencies let another stream reuse its memory
    /// (`CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`; 0 or 1).
    ReuseFollowEventDependencies,
    /// Whether memory whose free has completed may be reused by any stream
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`; 0 or 1).
    ReuseAllowOpportunistic,
    /// Whether the driver may insert dependencies to reuse memory
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`; 0 or 1).
    ReuseAllowInternalDependencies,
    /// The most bytes reserved since the last reset
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`; may only be set to 0).
    ReservedHigh,
    /// The most bytes in use since the last reset (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`; may
    /// only be set to 0).
    UsedHigh,
}

impl PoolSetting {
    /// The driver's name of the attribute, e.g. `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub fn name(self) -> &'static str {
        match self {
            PoolSetting::ReleaseThreshold => "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD",
            PoolSetting::ReuseFollowEventDependencies => {
                "CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES"
            }
            PoolSetting::ReuseAllowOpportunistic => "CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC",
            PoolSetting::ReuseAllowInternalDependencies => {
                "CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES"
            }
            PoolSetting::ReservedHigh => "CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH",
            PoolSetting::UsedHigh => "CU_MEMPOOL_ATTR_USED_MEM_HIGH",
        }
    }

    fn to_sys(self) -> sys::CUmemPool_attribute {
        use sys::CUmemPool_attribute as A;
        match self {
            PoolSetting::ReleaseThreshold => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            PoolSetting::ReuseFollowEventDependencies => {
                A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            }
            PoolSetting::ReuseAllowOpportunistic => A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
            PoolSetting::ReuseAllowInternalDependencies => {
                A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
            }
            PoolSetting::ReservedHigh => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            PoolSetting::UsedHigh => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        }
    }

    /// Whether the driver takes the value as an `int` (the reuse switches) rather than a
    /// 64-bit integer.
    fn is_int(self) -> bool {
        matches!(
            self,
            PoolSetting::ReuseFollowEventDependencies
                | PoolSetting::ReuseAllowOpportunistic
                | PoolSetting::ReuseAllowInternalDependencies
        )
    }
}

impl Device {
    /// This device's default memory pool: the one
    /// [`BoundStream::alloc`] allocates from. [`Error::DeviceLacks`] on a device without
    /// memory pools (`CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` = 0, or a driver below
    /// CUDA 11.2), where `alloc` falls back to `cuMemAlloc`.
    pub fn memory_pool(self: &Arc<Self>) -> Result<DevicePool> {
        match default_pool(self)? {
            Some(raw) => Ok(DevicePool {
                device: Arc::clone(self),
                raw: raw as usize,
            }),
            None => Err(Error::DeviceLacks {
                device: self.ordinal(),
                capability: "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED (on a CUDA 11.2+ driver)",
                what: "a stream-ordered memory pool",
                hint: Some("BoundStream::alloc allocates with cuMemAlloc on this device"),
            }),
        }
    }
}

impl DevicePool {
    /// The device whose pool this is.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    fn raw(&self) -> sys::CUmemoryPool {
        self.raw as sys::CUmemoryPool
    }

    /// The value of `setting` (`cuMemPoolGetAttribute`).
    pub fn get(&self, setting: PoolSetting) -> Result<u64> {
        let _guard = self.device.enter()?;
        // SAFETY: the device's default pool lives as long as the device (held); every
        // `PoolSetting` is an int or a 64-bit integer, which `attribute` widens.
        self.device
            .check(unsafe { pool::attribute(self.raw(), setting.to_sys()) })
    }

    /// Sets `setting` to `value` (`cuMemPoolSetAttribute`). A value the device refuses (a
    /// peak set to anything but 0, a reuse switch other than 0 or 1) is
    /// [`Error::PoolSetting`] naming the setting and the value.
    pub fn set(&self, setting: PoolSetting, value: u64) -> Result<()> {
        let refused = |reason: String, code| Error::PoolSetting {
            device: self.device.ordinal(),
            setting: setting.name(),
            value,
            reason,
            code,
        };
        if setting.is_int() && value > 1 {
            return Err(refused("a switch takes 0 or 1".into(), None));
        }
        let _guard = self.device.enter()?;
        // SAFETY: the pool lives as long as the device (held); the value has the width
        // the attribute takes (`is_int`: an int; else a 64-bit integer).
        let set = unsafe {
            if setting.is_int() {
                pool::set_attribute_int(self.raw(), setting.to_sys(), value as std::ffi::c_int)
            } else {
                pool::set_attribute(self.raw(), setting.to_sys(), value)
            }
        };
        match self.device.check(set) {
            Err(e @ Error::Driver { code, .. }) => Err(refused(e.to_string(), Some(code))),
            other => other,
        }
    }

    /// Bytes the pool keeps reserved when idle (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`).
    pub fn release_threshold(&self) -> Result<u64> {
        self.get(PoolSetting::ReleaseThreshold)
    }

    /// Keeps up to `bytes` reserved when the pool synchronises, instead of returning
    /// freed memory to the system (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; `u64::MAX`
    /// keeps everything). A loop of allocations larger than the threshold otherwise maps
    /// and unmaps memory at each synchronisation.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set(PoolSetting::ReleaseThreshold, bytes)
    }

    /// Returns reserved memory that is not in use to the system until at most `keep`
    /// bytes stay reserved (`cuMemPoolTrimTo`).
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: the pool lives as long as the device (held).
        self.device
            .check(unsafe { pool::trim_to(self.raw(), keep) })
    }

    /// Bytes allocated from the pool and not yet freed
    /// (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`). A stream-ordered free counts once the stream
    /// has reached it.
    pub fn used_bytes(&self) -> Result<u64> {
        self.current(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// Bytes the pool holds from the system (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.current(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    fn current(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let _guard = self.device.enter()?;
        // SAFETY: the pool lives as long as the device (held); both counters are 64-bit.
        self.device
            .check(unsafe { pool::attribute(self.raw(), attr) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_need_the_attribute_and_a_cuda_11_2_driver() {
        assert!(pools_usable(1, DriverVersion::new(12, 2)));
        assert!(pools_usable(1, DriverVersion::new(11, 2)));
        assert!(!pools_usable(0, DriverVersion::new(13, 0)));
        assert!(!pools_usable(1, DriverVersion::new(11, 1)));
    }

    #[test]
    fn a_refused_setting_names_the_attribute_the_value_and_the_code() {
        let code = crate::DriverErrorCode::INVALID_VALUE;
        let e = Error::PoolSetting {
            device: 1,
            setting: PoolSetting::UsedHigh.name(),
            value: 5,
            reason: "cuMemPoolSetAttribute failed: CUDA_ERROR_INVALID_VALUE".into(),
            code: Some(code),
        };
        assert_eq!(
            e.to_string(),
            "device 1's memory pool refused CU_MEMPOOL_ATTR_USED_MEM_HIGH = 5: \
             cuMemPoolSetAttribute failed: CUDA_ERROR_INVALID_VALUE"
        );
        assert_eq!(e.driver_code(), Some(code));
    }

    #[test]
    fn settings_name_their_attribute_and_width() {
        assert_eq!(
            PoolSetting::ReleaseThreshold.name(),
            "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD"
        );
        assert!(PoolSetting::ReuseAllowOpportunistic.is_int());
        assert!(!PoolSetting::UsedHigh.is_int());
    }
}
