//! Managed (unified) memory: [`ManagedSlice`] (documented on the type).

use crate::access::{Access, AccessTracker};
use crate::context::BoundDevice;
use crate::copy::{Endpoint, MemoryKind, copy_endpoints};
use crate::device::{Device, DeviceAttribute};
use crate::driver::version as compat;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr, impl_device_memory, private};
use crate::module::{KernelArg, memory_arg};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

mod attach;
mod view;

pub use attach::ManagedAttach;
pub use view::{ManagedView, ManagedViewMut};

/// `len` elements of managed memory, attached globally (`CU_MEM_ATTACH_GLOBAL`), to the
/// host ([`ManagedAttach::Host`]) or to one stream ([`BoundStream::attach_managed`]).
///
/// Managed memory has one address valid on the host and on the device; the driver
/// migrates pages on demand. A `ManagedSlice<T>` is device memory for every gpubind API
/// (it implements [`DeviceMemory`] / [`DeviceMemoryMut`], so `dtoh`, `dtod`, memsets and
/// kernel launches take it) and also gives host access through
/// [`as_slice`](ManagedSlice::as_slice) / [`as_mut_slice`](ManagedSlice::as_mut_slice).
/// [`BoundStream::prefetch`] migrates it ahead of use and [`BoundDevice::advise`] sets
/// placement hints.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Advice, Device, Location, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let mut m = gpu.alloc_managed::<f32>(1024)?;   // zeroed
/// m.as_mut_slice()?.fill(2.0);                   // written by the host
/// gpu.advise(&m, Advice::SetPreferredLocation(Location::Device(&dev)))?;
/// let s = gpu.default_stream();
/// s.prefetch(&m, Location::Device(&dev))?;       // migrate before a kernel uses it
/// s.synchronize()?;
/// assert_eq!(gpu.dtoh(&m)?[0], 2.0);
/// # Ok(()) }
/// ```
///
/// Asking for more managed memory than the device has free is refused up front with
/// [`Error::ManagedTooLarge`]: over-subscribed managed memory can stall the whole GPU.
///
/// [`slice`](ManagedSlice::slice), [`slice_mut`](ManagedSlice::slice_mut) and the
/// `split_at` pair give [`ManagedView`] / [`ManagedViewMut`], usable wherever the slice
/// is, with the same host-access waits. Memory may be allocated attached to the host
/// ([`BoundDevice::alloc_managed_attached`]) or attached to one stream later
/// ([`BoundStream::attach_managed`]); host references into memory attached to a stream
/// wait for that stream as well (`docs/safety.md`, "Managed memory").
pub struct ManagedSlice<T: DeviceRepr> {
    device: Arc<Device>,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// What host access needs: the device's concurrent access, the attachment.
    host: attach::HostRule,
    tracker: AccessTracker,
    _t: PhantomData<T>,
}

// SAFETY: plain `T` data and an address; frees push the owning context.
unsafe impl<T: DeviceRepr> Send for ManagedSlice<T> {}
// SAFETY: shared access only reads.
unsafe impl<T: DeviceRepr> Sync for ManagedSlice<T> {}

/// Where managed memory should live, for [`BoundStream::prefetch`] and [`Advice`].
#[derive(Clone, Copy, Debug)]
pub enum Location<'d> {
    /// Host memory (`CU_MEM_LOCATION_TYPE_HOST`).
    Host,
    /// A device's memory (`CU_MEM_LOCATION_TYPE_DEVICE`).
    Device(&'d Device),
}

impl Location<'_> {
    fn raw(self) -> sys::CUmemLocation {
        match self {
            Location::Host => crate::driver::version::mem_location(
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                0,
            ),
            Location::Device(d) => crate::driver::version::mem_location(
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                d.raw_device(),
            ),
        }
    }
}

/// A `cuMemAdvise` hint.
#[derive(Clone, Copy, Debug)]
pub enum Advice<'d> {
    /// Data is mostly read: the driver may keep read-only copies on several processors.
    SetReadMostly,
    /// Undoes [`SetReadMostly`](Self::SetReadMostly).
    UnsetReadMostly,
    /// Prefer to keep the pages at this location.
    SetPreferredLocation(Location<'d>),
    /// Removes the preferred location.
    UnsetPreferredLocation,
    /// This processor will access the data: keep it mapped there.
    SetAccessedBy(Location<'d>),
    /// Undoes [`SetAccessedBy`](Self::SetAccessedBy) for this processor.
    UnsetAccessedBy(Location<'d>),
}

impl Advice<'_> {
    fn raw(self) -> (sys::CUmem_advise, sys::CUmemLocation) {
        use sys::CUmem_advise::*;
        let none = Location::Host.raw();
        match self {
            Advice::SetReadMostly => (CU_MEM_ADVISE_SET_READ_MOSTLY, none),
            Advice::UnsetReadMostly => (CU_MEM_ADVISE_UNSET_READ_MOSTLY, none),
            Advice::SetPreferredLocation(l) => (CU_MEM_ADVISE_SET_PREFERRED_LOCATION, l.raw()),
            Advice::UnsetPreferredLocation => (CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, none),
            Advice::SetAccessedBy(l) => (CU_MEM_ADVISE_SET_ACCESSED_BY, l.raw()),
            Advice::UnsetAccessedBy(l) => (CU_MEM_ADVISE_UNSET_ACCESSED_BY, l.raw()),
        }
    }
}

// DeviceMemory/DeviceMemoryMut and Debug, as for DeviceSlice; KernelArg passes the address.
impl_device_memory!(ManagedSlice, mut);
memory_arg!(ManagedSlice);

impl<T: DeviceRepr> ManagedSlice<T> {
    /// The device it was allocated on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tracker, for callers that hold the slice exclusively.
    #[cfg(feature = "dlpack")]
    pub(crate) fn tracker_mut(&mut self) -> &mut AccessTracker {
        &mut self.tracker
    }

    fn endpoint(&self) -> Endpoint<'_> {
        Endpoint::new(self.ptr, self.len, MemoryKind::Managed, Some(&self.device))
            .tracked(&self.tracker)
    }

    /// The contents, read by the host (pages migrate on demand).
    ///
    /// Waits first for the pending stream-ordered writes of this slice (kernels, copies,
    /// memsets, collectives on any stream), so the returned `&[T]` never changes under
    /// the reference. Device *reads* may continue meanwhile.
    ///
    /// On a device without concurrent managed access (`CONCURRENT_MANAGED_ACCESS` 0:
    /// Windows, some embedded and older GPUs) this is [`Error::DeviceLacks`]: the host may
    /// not touch managed memory there while the device runs any work, which a reference
    /// cannot guarantee; copy the data out with [`BoundDevice::dtoh`](crate::BoundDevice::dtoh).
    ///
    /// Memory attached to one stream ([`BoundStream::attach_managed`]) also waits for
    /// that stream's work so far (see `docs/safety.md`, "Managed memory").
    pub fn as_slice(&self) -> Result<&[T]> {
        // SAFETY: the allocation's own address, length and tracker.
        unsafe { view::host_slice(&self.host, &self.tracker, &self.device, self.ptr, self.len) }
    }

    /// The contents, written by the host. Waits first for every pending stream-ordered
    /// use of this slice (reads too); refused like [`as_slice`](Self::as_slice) on
    /// devices without concurrent managed access.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        // SAFETY: the allocation's own address, length and tracker, held exclusively.
        unsafe { view::host_slice_mut(&self.host, &self.tracker, &self.device, self.ptr, self.len) }
    }
}

impl<T: DeviceRepr> Drop for ManagedSlice<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // If the wait fails the device may still use the memory: it is leaked rather
        // than freed (and the failure logged).
        let waited = self.tracker.wait_all();
        let bytes = self.len * std::mem::size_of::<T>();
        self.device.usage().sub(bytes as u64);
        // SAFETY: from cuMemAllocManaged in this context, freed once, here.
        unsafe {
            crate::memory::free_device_memory(
                format_args!(
                    "ManagedSlice<{}> of {} elements",
                    std::any::type_name::<T>(),
                    self.len
                ),
                &self.device,
                waited,
                self.ptr,
            )
        };
    }
}

copy_endpoints!(ManagedSlice, mut);

impl<'a> BoundDevice<'a> {
    /// Allocates `len` zeroed elements of managed memory, attached globally
    /// ([`ManagedAttach::Global`]: any stream may use it).
    ///
    /// Refused with [`Error::ManagedTooLarge`] (before calling the driver) when the
    /// request exceeds the device's free memory (`cuMemGetInfo`).
    pub fn alloc_managed<T: DeviceRepr>(&self, len: usize) -> Result<ManagedSlice<T>> {
        self.alloc_managed_attached(len, ManagedAttach::Global)
    }

    /// Allocates `len` zeroed elements of managed memory with the attachment `attach`
    /// (`cuMemAllocManaged` with `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`).
    ///
    /// [`ManagedAttach::Host`] needs a device with concurrent managed access (where the
    /// attachment is a placement hint and every stream may still use the memory):
    /// elsewhere the device could not touch the memory until it is attached to a stream,
    /// and it is refused with [`Error::DeviceLacks`]. Refused with
    /// [`Error::ManagedTooLarge`] like [`alloc_managed`](Self::alloc_managed).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ManagedAttach, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let mut m = gpu.alloc_managed_attached::<u32>(256, ManagedAttach::Host)?;
    /// m.as_mut_slice()?.fill(7);
    /// assert_eq!(gpu.dtoh(&m)?[255], 7);
    /// # Ok(()) }
    /// ```
    pub fn alloc_managed_attached<T: DeviceRepr>(
        &self,
        len: usize,
        attach: ManagedAttach,
    ) -> Result<ManagedSlice<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow usize bytes"))
        })?;
        let (free, _total) = self.memory_info()?;
        if bytes > free {
            return Err(Error::ManagedTooLarge {
                device: self.ordinal(),
                requested: bytes,
                free,
            });
        }
        let concurrent = self
            .device()
            .attribute(DeviceAttribute::ConcurrentManagedAccess)?
            != 0;
        attach::check_attachable(self.device(), concurrent, attach)?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            // SAFETY: this context is current (`memory_info` made it so); the slice
            // frees it.
            ptr = self.device().check(unsafe {
                crate::driver::result::memory::alloc_managed(bytes, attach.flags())
            })?;
            self.device().usage().add(bytes as u64);
        }
        let mut m = ManagedSlice {
            device: Arc::clone(self.device()),
            ptr,
            len,
            host: attach::HostRule::new(concurrent),
            tracker: AccessTracker::default(),
            _t: PhantomData,
        };
        self.memset_zeros(&mut m)?;
        Ok(m)
    }

    /// Gives the driver a placement hint for `mem` (`cuMemAdvise_v2`).
    pub fn advise<T: DeviceRepr>(&self, mem: &ManagedSlice<T>, advice: Advice<'_>) -> Result<()> {
        self.ensure_current()?;
        self.expect_device("managed memory", &mem.device)?;
        if mem.ptr == 0 {
            return Ok(());
        }
        let (advice, location) = advice.raw();
        // SAFETY: context current; the range is one live managed allocation.
        unsafe { compat::mem_advise(mem.ptr, mem.num_bytes(), advice, location) }
    }
}

impl<'b> BoundStream<'b> {
    /// Stream-ordered migration of `mem` to `to` (`cuMemPrefetchAsync_v2`). The contents
    /// are unchanged; only where the pages live.
    pub fn prefetch<T: DeviceRepr>(&self, mem: &ManagedSlice<T>, to: Location<'_>) -> Result<()> {
        self.bound().expect_device("managed memory", &mem.device)?;
        if mem.ptr == 0 {
            return Ok(());
        }
        // Migration keeps the contents: ordered like a read.
        let _claim = self.claim([Some((&mem.tracker, Access::Read))])?;
        // SAFETY: context current, stream of it; one live managed allocation, whose free
        // waits for this prefetch (tracked above).
        unsafe { compat::mem_prefetch_async(mem.ptr, mem.num_bytes(), to.raw(), self.raw()) }
    }
}
