//! Views of managed memory: [`ManagedView`] and [`ManagedViewMut`], and the host
//! references every managed kind hands out.
//!
//! A view addresses a range of a [`ManagedSlice`] and shares its tracker, like
//! [`DeviceView`](crate::DeviceView) does for a device slice: it is a copy endpoint and a
//! kernel argument, and its host references wait as the slice's do.

use super::ManagedSlice;
use super::attach::HostRule;
use crate::access::{Access, AccessTracker};
use crate::copy::{Endpoint, MemoryKind, copy_endpoints};
use crate::device::Device;
use crate::error::Result;
use crate::memory::reinterpret::fit;
use crate::memory::{
    DeviceMemory, DeviceMemoryMut, DeviceRepr, ViewTracker, check_disjoint, impl_device_memory,
    private, resolve,
};
use crate::module::{KernelArg, memory_arg};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::ptr::NonNull;
use std::sync::Arc;

/// A shared view of part of a [`ManagedSlice`]: device memory for every gpubind API, and
/// readable by the host through [`as_slice`](Self::as_slice).
///
/// Made from `&ManagedSlice`, beside which host slices may be held, so it is only ever
/// read: it is no [`WritableArg`](crate::WritableArg), and a launch or capture that
/// passes it by `&mut` or to `arg_written` does not compile. Write through a
/// [`ManagedViewMut`] ([`slice_mut`](ManagedSlice::slice_mut),
/// [`split_at_mut`](ManagedSlice::split_at_mut)).
pub struct ManagedView<'a, T: DeviceRepr> {
    device: &'a Arc<Device>,
    tracker: &'a AccessTracker,
    host: &'a HostRule,
    ptr: sys::CUdeviceptr,
    len: usize,
    _t: PhantomData<&'a T>,
}

/// A writable view of part of a [`ManagedSlice`]: from
/// [`slice_mut`](ManagedSlice::slice_mut) (holding the slice's tracker alone) or
/// [`split_at_mut`](ManagedSlice::split_at_mut) (two views sharing it: their uses are
/// ordered per slice, as for [`DeviceSlice::get_disjoint_mut`](crate::DeviceSlice::get_disjoint_mut)).
pub struct ManagedViewMut<'a, T: DeviceRepr> {
    device: &'a Arc<Device>,
    tracker: ViewTracker<'a>,
    host: &'a HostRule,
    ptr: sys::CUdeviceptr,
    len: usize,
    _t: PhantomData<&'a mut T>,
}

impl_device_memory!(ManagedView<'a>, const);
impl_device_memory!(ManagedViewMut<'a>, view);
memory_arg!(ManagedViewMut<'a>);

// SAFETY: as `memory_arg!`: passes the address field, 8 bytes that live as long as the
// borrow.
//
// Deliberately not a `WritableArg`: a shared view is made from `&ManagedSlice`, which
// also hands out host slices (`as_slice`) that must not change while held, so a launch
// may pass it by `&` only. Writes go through `ManagedSlice::slice_mut` / `split_at_mut`
// (`ManagedViewMut`) or the slice itself.
unsafe impl<T: DeviceRepr> KernelArg for ManagedView<'_, T> {
    fn param_ptr(&self) -> *mut c_void {
        &self.ptr as *const sys::CUdeviceptr as *mut c_void
    }
    fn param_size(&self) -> usize {
        std::mem::size_of::<sys::CUdeviceptr>()
    }
    fn arg_device(&self) -> Option<&Device> {
        Some(self.device)
    }
    fn describe(&self) -> String {
        format!("ManagedView<{}>", std::any::type_name::<T>())
    }
    fn access_tracker(&self) -> Option<&AccessTracker> {
        Some(self.tracker)
    }
    fn arg_span(&self) -> Option<(u64, u64)> {
        Some((self.ptr, DeviceMemory::<T>::num_bytes(self) as u64))
    }
}

fn managed_endpoint<T: DeviceRepr>(m: &impl DeviceMemory<T>) -> Endpoint<'_> {
    Endpoint::new(
        m.device_ptr(),
        m.len(),
        MemoryKind::Managed,
        Some(m.device()),
    )
    .tracked(private::Sealed::tracker(m))
}
copy_endpoints!(ManagedView<'a>, const, managed_endpoint);
copy_endpoints!(ManagedViewMut<'a>, mut, managed_endpoint);

/// A host reference to `len` elements at `ptr`, after the checks and waits of
/// [`HostRule::ready`] and a host read claim on `tracker`.
///
/// # Safety
///
/// `ptr..ptr + len` is managed memory tracked by `tracker` (zeroed or written since
/// allocation) that lives and is not written by the host elsewhere for the returned
/// lifetime.
pub(super) unsafe fn host_slice<'r, T>(
    host: &HostRule,
    tracker: &AccessTracker,
    device: &Device,
    ptr: sys::CUdeviceptr,
    len: usize,
) -> Result<&'r [T]> {
    host.ready(device, len)?;
    if len == 0 {
        return Ok(&[]);
    }
    tracker.host_access(Access::Read)?;
    if std::mem::size_of::<T>() == 0 {
        // No allocation stands behind zero-sized elements (`ptr` is 0).
        // SAFETY: `len` elements of a zero-sized type at a non-null, aligned address.
        return Ok(unsafe { std::slice::from_raw_parts(NonNull::<T>::dangling().as_ptr(), len) });
    }
    // SAFETY: initialised elements at a host-accessible managed address (the caller);
    // no stream-ordered write is pending (waited for above) and none can start while
    // the reference lives (writes need the memory borrowed mutably).
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, len) })
}

/// [`host_slice`] for writing: waits for every pending use (reads too).
///
/// # Safety
///
/// As [`host_slice`], and nothing else reaches the range for the returned lifetime.
pub(super) unsafe fn host_slice_mut<'r, T>(
    host: &HostRule,
    tracker: &AccessTracker,
    device: &Device,
    ptr: sys::CUdeviceptr,
    len: usize,
) -> Result<&'r mut [T]> {
    host.ready(device, len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    tracker.host_access(Access::Write)?;
    if std::mem::size_of::<T>() == 0 {
        // SAFETY: as in `host_slice`.
        return Ok(unsafe {
            std::slice::from_raw_parts_mut(NonNull::<T>::dangling().as_ptr(), len)
        });
    }
    // SAFETY: as in `host_slice`, with exclusive access (the caller).
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) })
}

impl<T: DeviceRepr> ManagedSlice<T> {
    /// A shared view of `range`, or [`Error::OutOfBounds`](crate::Error::OutOfBounds).
    /// Needs no binding.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<ManagedView<'_, T>> {
        let (start, len) = resolve(range, self.len)?;
        Ok(ManagedView {
            device: &self.device,
            tracker: &self.tracker,
            host: &self.host,
            ptr: self.offset(start),
            len,
            _t: PhantomData,
        })
    }

    /// A writable view of `range`, or [`Error::OutOfBounds`](crate::Error::OutOfBounds).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<ManagedViewMut<'_, T>> {
        let (start, len) = resolve(range, self.len)?;
        let ptr = self.offset(start);
        Ok(ManagedViewMut {
            device: &self.device,
            tracker: ViewTracker::Alone(&mut self.tracker),
            host: &self.host,
            ptr,
            len,
            _t: PhantomData,
        })
    }

    /// Two shared views, of `..mid` and `mid..`
    /// ([`Error::OutOfBounds`](crate::Error::OutOfBounds) when `mid` is past the end).
    pub fn split_at(&self, mid: usize) -> Result<(ManagedView<'_, T>, ManagedView<'_, T>)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    /// Two writable views, of `..mid` and `mid..`, sharing the slice's tracker: each may
    /// be written by its own stream (ordered one after the other by the tracker) or by
    /// the host ([`ManagedViewMut::as_mut_slice`]) while the other is in use.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let mut m = gpu.alloc_managed::<u32>(8)?;
    /// let (mut head, mut tail) = m.split_at_mut(4)?;
    /// let s = gpu.default_stream();
    /// s.memset_async(&mut head, 1)?;
    /// tail.as_mut_slice()?.fill(2);                  // the host writes the other half
    /// assert_eq!(head.as_slice()?, [1, 1, 1, 1]);     // waits for the memset
    /// # Ok(()) }
    /// ```
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(ManagedViewMut<'_, T>, ManagedViewMut<'_, T>)> {
        let len = self.len;
        check_disjoint(&[0..mid, mid..len.max(mid)], len)?;
        let (head, tail) = (self.offset(0), self.offset(mid));
        let tracker: &AccessTracker = &self.tracker;
        let view = |ptr, len| ManagedViewMut {
            device: &self.device,
            tracker: ViewTracker::Shared(tracker),
            host: &self.host,
            ptr,
            len,
            _t: PhantomData,
        };
        Ok((view(head, mid), view(tail, len - mid)))
    }

    /// The whole slice seen as elements of `U` (see
    /// [`DeviceSlice::transmute`](crate::DeviceSlice::transmute)):
    /// [`Error::Transmute`](crate::Error::Transmute) when the byte length is not a
    /// multiple of `size_of::<U>()` or the address is not aligned for `U`.
    pub fn transmute<U: DeviceRepr>(&self) -> Result<ManagedView<'_, U>> {
        let len = fit::<U>(self.ptr, self.len * std::mem::size_of::<T>())?;
        Ok(ManagedView {
            device: &self.device,
            tracker: &self.tracker,
            host: &self.host,
            ptr: self.ptr,
            len,
            _t: PhantomData,
        })
    }

    /// The whole slice seen as elements of `U`, writable; see [`transmute`](Self::transmute).
    pub fn transmute_mut<U: DeviceRepr>(&mut self) -> Result<ManagedViewMut<'_, U>> {
        let len = fit::<U>(self.ptr, self.len * std::mem::size_of::<T>())?;
        Ok(ManagedViewMut {
            device: &self.device,
            tracker: ViewTracker::Alone(&mut self.tracker),
            host: &self.host,
            ptr: self.ptr,
            len,
            _t: PhantomData,
        })
    }

    fn offset(&self, start: usize) -> sys::CUdeviceptr {
        self.ptr + (start * std::mem::size_of::<T>()) as u64
    }
}

impl<T: DeviceRepr> ManagedView<'_, T> {
    /// The range, read by the host: waits like [`ManagedSlice::as_slice`].
    pub fn as_slice(&self) -> Result<&[T]> {
        // SAFETY: a range of the slice this view borrows, tracked by its tracker.
        unsafe { host_slice(self.host, self.tracker, self.device, self.ptr, self.len) }
    }
}

impl<T: DeviceRepr> ManagedViewMut<'_, T> {
    /// The range, read by the host: waits like [`ManagedSlice::as_slice`].
    pub fn as_slice(&self) -> Result<&[T]> {
        // SAFETY: a range of the slice this view borrows, tracked by its tracker.
        unsafe { host_slice(self.host, &self.tracker, self.device, self.ptr, self.len) }
    }

    /// The range, written by the host: waits like [`ManagedSlice::as_mut_slice`] (for
    /// the pending uses of the whole slice, the other view's too).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        // SAFETY: a range this view holds exclusively (views of one slice are disjoint).
        unsafe { host_slice_mut(self.host, &self.tracker, self.device, self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared view over `len` elements at `ptr` of an unopened device (no driver call
    /// may follow).
    fn shared_view<'a, T: DeviceRepr>(
        device: &'a Arc<Device>,
        tracker: &'a AccessTracker,
        host: &'a HostRule,
        ptr: sys::CUdeviceptr,
        len: usize,
    ) -> ManagedView<'a, T> {
        ManagedView {
            device,
            tracker,
            host,
            ptr,
            len,
            _t: PhantomData,
        }
    }

    // A shared view is never a written kernel argument (`.arg(&mut view)`,
    // `arg_written(&view)` do not compile): `as_slice` of the slice or of another shared
    // view may be held meanwhile. The exclusive view is written as any buffer.
    static_assertions::assert_not_impl_any!(ManagedView<'static, f32>: crate::WritableArg);
    static_assertions::assert_impl_all!(ManagedViewMut<'static, f32>: crate::WritableArg);

    #[test]
    fn a_shared_view_passes_its_span() {
        let device = Arc::new(Device::unopened_for_test(0));
        let (tracker, host) = (AccessTracker::default(), HostRule::new(true));
        let view = shared_view::<f32>(&device, &tracker, &host, 0x1000, 4);
        assert_eq!(view.arg_span(), Some((0x1000, 16)));
        assert_eq!(view.param_size(), 8);
        assert_eq!(view.describe(), "ManagedView<f32>");
    }

    #[test]
    fn host_slices_of_zero_sized_elements_need_no_allocation() {
        // Managed memory of a zero-sized element type allocates nothing (address 0): the
        // host slices must not be built from that null address.
        let device = Device::unopened_for_test(0);
        let (tracker, host) = (AccessTracker::default(), HostRule::new(true));
        // SAFETY: zero-sized elements: no byte is read or written.
        let s = unsafe { host_slice::<[u32; 0]>(&host, &tracker, &device, 0, 5) }.unwrap();
        assert_eq!(s.len(), 5);
        // SAFETY: as above.
        let m = unsafe { host_slice_mut::<[u32; 0]>(&host, &tracker, &device, 0, 7) }.unwrap();
        assert_eq!(m.len(), 7);
    }
}
