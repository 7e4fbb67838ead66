//! Legacy interprocess handles: `cuIpc*` for memory and events.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_uint;

/// `cuIpcGetMemHandle`: the 64-byte handle of the allocation whose base is `ptr`.
///
/// # Safety
///
/// `ptr` is the base of a live device allocation of the current context.
#[inline]
pub(crate) unsafe fn get_mem_handle(ptr: sys::CUdeviceptr) -> Result<sys::CUipcMemHandle> {
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: the caller guarantees the allocation; writes 64 bytes.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) },
        "cuIpcGetMemHandle",
    )?;
    Ok(handle)
}

/// `cuIpcOpenMemHandle_v2`: maps another process's allocation into the current context
/// (the caller closes it with [`close_mem_handle`]).
///
/// # Safety
///
/// A context is current. The handle is plain data the driver validates.
#[inline]
pub(crate) unsafe fn open_mem_handle(
    handle: sys::CUipcMemHandle,
    flags: c_uint,
) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: a context is current (caller); writes one address.
    check(
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) },
        "cuIpcOpenMemHandle_v2",
    )?;
    Ok(ptr)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
///
/// `ptr` was returned by [`open_mem_handle`] in the current context, is closed once,
/// and no queued work uses it.
#[inline]
pub(crate) unsafe fn close_mem_handle(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller guarantees the mapping and that nothing uses it.
    check(
        unsafe { sys::cuIpcCloseMemHandle(ptr) },
        "cuIpcCloseMemHandle",
    )
}

/// `cuIpcGetEventHandle`: the 64-byte handle of an interprocess event.
///
/// # Safety
///
/// `event` is a live event created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`
/// in the current context.
#[inline]
pub(crate) unsafe fn get_event_handle(event: sys::CUevent) -> Result<sys::CUipcEventHandle> {
    let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: the caller guarantees the event; writes 64 bytes.
    check(
        unsafe { sys::cuIpcGetEventHandle(&mut handle, event) },
        "cuIpcGetEventHandle",
    )?;
    Ok(handle)
}

/// `cuIpcOpenEventHandle`: opens another process's event in the current context (the
/// caller destroys it with `event::destroy`).
///
/// # Safety
///
/// A context is current. The handle is plain data the driver validates.
#[inline]
pub(crate) unsafe fn open_event_handle(handle: sys::CUipcEventHandle) -> Result<sys::CUevent> {
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: a context is current (caller); writes one handle.
    check(
        unsafe { sys::cuIpcOpenEventHandle(&mut event, handle) },
        "cuIpcOpenEventHandle",
    )?;
    Ok(event)
}
