//! Legacy CUDA IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`) for plain
//! [`DeviceSlice`] allocations.
//!
//! No pool and no file descriptor: the 64-byte handle is plain data and may travel by
//! any channel (e.g. [`send_message`](super::send_message) with
//! [`LegacyIpcHandle::to_bytes`]). A handle cannot be opened in the process that made it.

use super::handle::LegacyIpcHandle;
use super::{check_allocation_size, device_by_uuid, disown, free_in_context};
use crate::driver::Check;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice};
use cudarc::driver::sys;
use std::mem::ManuallyDrop;

impl LegacyIpcHandle {
    /// Exports the whole allocation of `slice` (`cuIpcGetMemHandle`). Needs no binding.
    ///
    /// The exporter must keep `slice` alive until every importer has dropped its
    /// [`LegacySlice`].
    pub fn export<T: DeviceRepr>(slice: &DeviceSlice<T>) -> Result<LegacyIpcHandle> {
        if slice.is_empty() {
            return Err(Error::InvalidArgument(
                "an empty slice has no allocation to export".into(),
            ));
        }
        let _guard = slice.device().enter()?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is the base of a live cuMemAlloc allocation (DeviceSlice owns
        // whole allocations); its context is current; writes 64 bytes.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, slice.ptr) }.check("cuIpcGetMemHandle")?;
        Ok(LegacyIpcHandle::new::<T>(
            slice.device().uuid(),
            handle.reserved.map(|b| b as u8),
            slice.len(),
        ))
    }

    /// Opens the allocation in this process (`cuIpcOpenMemHandle`, lazy peer access) on
    /// the device with the handle's UUID, with that device's context pushed and popped.
    ///
    /// Errors: [`Error::TypeMismatch`], [`Error::UnknownDevice`], a driver error for
    /// handles that name nothing (or were made by this same process).
    pub fn open<T: DeviceRepr>(&self) -> Result<LegacySlice<T>> {
        let len = self.layout().expect_type::<T>()?;
        crate::driver::init()?;
        let device = device_by_uuid(self.device_uuid())?;
        let _guard = device.enter()?;
        let handle = sys::CUipcMemHandle {
            reserved: self.data().map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the device's context is current; the handle is passed by value (the
        // driver validates its content); writes one address.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .check("cuIpcOpenMemHandle_v2")?;
        let close = |p| {
            // SAFETY: `p` was just opened by cuIpcOpenMemHandle and is closed once.
            unsafe { sys::cuIpcCloseMemHandle(p) }
        };
        if let Err(e) = check_allocation_size(ptr, len * std::mem::size_of::<T>()) {
            free_in_context(&device, ptr, close);
            return Err(e);
        }
        Ok(LegacySlice {
            // SAFETY: `ptr` maps at least `len` elements (checked where the driver
            // reports the size); LegacySlice's Drop closes it, never DeviceSlice's.
            slice: ManuallyDrop::new(unsafe { DeviceSlice::from_raw(device, ptr, len) }),
        })
    }
}

/// Another process's allocation opened from a [`LegacyIpcHandle`]: a typed slice like
/// [`DeviceSlice`] (copies, views, kernel argument), closed with `cuIpcCloseMemHandle`
/// (after the context's pending work) on drop.
pub struct LegacySlice<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
}

super::foreign_slice!(LegacySlice);

impl<T: DeviceRepr> Drop for LegacySlice<T> {
    fn drop(&mut self) {
        let Some((device, ptr)) = disown(&mut self.slice) else {
            return;
        };
        free_in_context(&device, ptr, |p| {
            // SAFETY: opened by cuIpcOpenMemHandle, closed once, after its own pending
            // uses in this process (`disown` waited for them).
            unsafe { sys::cuIpcCloseMemHandle(p) }
        });
    }
}
