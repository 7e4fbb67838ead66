//! Allocations, and synchronous copies and fills, on a [`BoundDevice`]: each returns
//! once the driver has done it (and, for copies and fills, once it has landed).

use super::{DeviceMemory, DeviceMemoryMut, DeviceRepr, DeviceSlice, MemsetValue};
use super::{expect_len, memset_raw, refuse_overlap};
use crate::access::{Access, AccessTracker, host_claim, locks};
use crate::context::BoundDevice;
use crate::driver::result::{copy, memory};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::Arc;

impl<'a> BoundDevice<'a> {
    /// Allocates `len` uninitialised elements.
    ///
    /// # Safety
    ///
    /// The contents are whatever the memory held. Reading them before writing is not
    /// memory-unsafe for [`DeviceRepr`] types (every bit pattern is valid), but it is
    /// almost never what you want; prefer [`alloc_zeros`](Self::alloc_zeros) unless a
    /// kernel or copy overwrites every element first.
    pub unsafe fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<DeviceSlice<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow usize bytes"))
        })?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            self.ensure_current()?;
            // SAFETY: this device's context is current (checked just above); the slice
            // frees it.
            ptr = self.device().check(unsafe { memory::alloc(bytes) })?;
        }
        Ok(DeviceSlice::owning(
            Arc::clone(self.device()),
            ptr,
            len,
            AccessTracker::default(),
            false,
        ))
    }

    /// Allocates `len` elements set to zero.
    pub fn alloc_zeros<T: DeviceRepr>(&self, len: usize) -> Result<DeviceSlice<T>> {
        // SAFETY: every byte is zeroed before the slice is returned.
        let mut buf = unsafe { self.alloc::<T>(len)? };
        self.memset_zeros(&mut buf)?;
        Ok(buf)
    }

    /// Allocates a device copy of `src`.
    pub fn clone_htod<T: DeviceRepr>(&self, src: &[T]) -> Result<DeviceSlice<T>> {
        // SAFETY: the copy below overwrites every element.
        let mut buf = unsafe { self.alloc::<T>(src.len())? };
        self.htod_copy(src, &mut buf)?;
        Ok(buf)
    }

    /// Copies `src` from the host into `dst`; lengths must match. When it returns the
    /// data is on the device, visible to work on any stream.
    ///
    /// (`cuMemcpyHtoD` alone is not enough for that: from pageable memory it returns once
    /// the data is *staged*, and the DMA into `dst` completes later, ordered only with the
    /// legacy default stream. A kernel on a non-blocking stream could read `dst` too early,
    /// so this call also waits for the legacy stream.)
    pub fn htod_copy<T: DeviceRepr>(
        &self,
        src: &[T],
        dst: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.expect_device("destination", dst.device())?;
        expect_len("htod_copy", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.ensure_current()?;
        // Held until the copy has landed: no stream-ordered use can start meanwhile.
        let _held = host_claim(&mut [Some((dst.tracker(), Access::Write))], locks::<1>())?;
        // SAFETY: context current; `dst` holds exactly size_of_val(src) bytes; `src` is a
        // live host slice until the copy has completed (waited for below).
        let copied = unsafe {
            copy::htod(
                dst.device_ptr(),
                src.as_ptr().cast(),
                std::mem::size_of_val(src),
            )
        };
        self.device().check(copied)?;
        self.sync_default_stream()
    }

    /// Copies `src` to a new `Vec`.
    pub fn dtoh<T: DeviceRepr>(&self, src: &impl DeviceMemory<T>) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(src.len());
        self.dtoh_uninit(src, out.spare_capacity_mut())?;
        // SAFETY: the copy initialised all `src.len()` elements.
        unsafe { out.set_len(src.len()) };
        Ok(out)
    }

    /// Copies `src` into the host slice `dst`; lengths must match.
    pub fn dtoh_into<T: DeviceRepr>(
        &self,
        src: &impl DeviceMemory<T>,
        dst: &mut [T],
    ) -> Result<()> {
        // SAFETY: `[T]` and `[MaybeUninit<T>]` have the same layout, and we only write
        // valid `T` values (DeviceRepr: every bit pattern is valid).
        let dst = unsafe { &mut *(dst as *mut [T] as *mut [std::mem::MaybeUninit<T>]) };
        self.dtoh_uninit(src, dst)
    }

    fn dtoh_uninit<T: DeviceRepr>(
        &self,
        src: &impl DeviceMemory<T>,
        dst: &mut [std::mem::MaybeUninit<T>],
    ) -> Result<()> {
        self.expect_device("source", src.device())?;
        expect_len("dtoh", dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ensure_current()?;
        let _held = host_claim(&mut [Some((src.tracker(), Access::Read))], locks::<1>())?;
        // SAFETY: context current; `dst` has room for exactly `src.num_bytes()` bytes and
        // is exclusively borrowed for the synchronous copy.
        let copied =
            unsafe { copy::dtoh(dst.as_mut_ptr().cast(), src.device_ptr(), src.num_bytes()) };
        self.device().check(copied)
    }

    /// Copies device memory `src` into `dst` and returns when it is done; lengths must
    /// match. The buffers may belong to any devices (see
    /// [`copy_peer`](Self::copy_peer)); the binding is unchanged.
    pub fn dtod<T: DeviceRepr>(
        &self,
        src: &impl DeviceMemory<T>,
        dst: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let here = self.device().ordinal();
        if src.device().ordinal() != here || dst.device().ordinal() != here {
            // Between devices: `cuMemcpyPeerAsync`, ordered on both devices, then waited for.
            return crate::copy::device_to_device(&self.default_stream(), true, src, dst, false);
        }
        expect_len("dtod", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        refuse_overlap("dtod", src, dst)?;
        self.ensure_current()?;
        let _held = host_claim(
            &mut [
                Some((src.tracker(), Access::Read)),
                Some((dst.tracker(), Access::Write)),
            ],
            locks::<2>(),
        )?;
        // SAFETY: context current; both ranges are live allocations of `num_bytes`.
        let copied = unsafe { copy::dtod(dst.device_ptr(), src.device_ptr(), src.num_bytes()) };
        self.device().check(copied)?;
        // cuMemcpyDtoD may return before the copy finishes; make this call synchronous
        // like its host-side siblings.
        self.sync_default_stream()
    }

    /// Allocates a device copy of device memory `src`.
    pub fn clone_dtod<T: DeviceRepr>(&self, src: &impl DeviceMemory<T>) -> Result<DeviceSlice<T>> {
        // SAFETY: overwritten in full by the copy below.
        let mut buf = unsafe { self.alloc::<T>(src.len())? };
        self.dtod(src, &mut buf)?;
        Ok(buf)
    }

    /// Sets every element of `dst` to `value` (1-, 2- and 4-byte element types:
    /// [`MemsetValue`]). Synchronous like [`memset_zeros`](Self::memset_zeros): it waits
    /// for the pending uses of `dst` first and returns once the fill has landed.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let mut buf = gpu.alloc_zeros::<u16>(4)?;
    /// gpu.memset(&mut buf.slice_mut(1..3)?, 0xABCD)?;
    /// assert_eq!(gpu.dtoh(&buf)?, [0, 0xABCD, 0xABCD, 0]);
    /// # Ok(()) }
    /// ```
    pub fn memset<T: MemsetValue>(
        &self,
        dst: &mut impl DeviceMemoryMut<T>,
        value: T,
    ) -> Result<()> {
        self.expect_device("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ensure_current()?;
        let _held = host_claim(&mut [Some((dst.tracker(), Access::Write))], locks::<1>())?;
        // SAFETY: context current; `len` elements inside the allocation, whose pending
        // uses have finished (waited for above) and which no new use can start on while
        // `_held` lives.
        unsafe {
            memset_raw(
                self.device(),
                dst.device_ptr(),
                dst.len(),
                value.memset_pattern(),
                None,
            )
        }?;
        self.sync_default_stream()
    }

    /// Sets every byte of `dst` to zero.
    pub fn memset_zeros<T: DeviceRepr>(&self, dst: &mut impl DeviceMemoryMut<T>) -> Result<()> {
        self.expect_device("destination", dst.device())?;
        // No bytes (also zero-sized elements, which have no allocation): nothing to zero.
        if dst.num_bytes() == 0 {
            return Ok(());
        }
        self.ensure_current()?;
        let _held = host_claim(&mut [Some((dst.tracker(), Access::Write))], locks::<1>())?;
        // SAFETY: context current; writes `num_bytes` inside the allocation, whose
        // pending uses have finished (waited for above).
        let zeroed = unsafe { copy::memset_d8(dst.device_ptr(), 0, dst.num_bytes()) };
        self.device().check(zeroed)?;
        self.sync_default_stream()
    }
}
