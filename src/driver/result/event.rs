//! Events: creation, recording, queries.

use super::{check, check_ready};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_uint;

/// `cuEventCreate`: an event of the current context with `flags`.
///
/// # Safety
///
/// The context the event should belong to is current; the caller destroys it with
/// [`destroy`].
#[inline]
pub(crate) unsafe fn create(flags: c_uint) -> Result<sys::CUevent> {
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: writes one handle; the caller made the owning context current.
    check(
        unsafe { sys::cuEventCreate(&mut event, flags) },
        "cuEventCreate",
    )?;
    Ok(event)
}

/// `cuEventDestroy_v2`. A recorded event still pending is released once it completes.
///
/// # Safety
///
/// `event` is a live event the caller created, destroyed once and not used after.
#[inline]
pub(crate) unsafe fn destroy(event: sys::CUevent) -> Result<()> {
    // SAFETY: the caller owns the handle and never uses it again.
    check(
        unsafe { sys::cuEventDestroy_v2(event) },
        "cuEventDestroy_v2",
    )
}

/// `cuEventRecord`: captures the work queued on `stream` so far.
///
/// # Safety
///
/// `event` and `stream` are live handles of the same context.
#[inline]
pub(crate) unsafe fn record(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees both handles.
    check(
        unsafe { sys::cuEventRecord(event, stream) },
        "cuEventRecord",
    )
}

/// `cuEventRecordWithFlags(event, stream, CU_EVENT_RECORD_EXTERNAL)`: on a capturing
/// stream, an event record node that records `event` at each launch of the graph (a
/// plain record there only marks a point of the capture).
///
/// # Safety
///
/// `event` and `stream` are live handles of the same context.
#[inline]
pub(crate) unsafe fn record_external(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as std::ffi::c_uint;
    // SAFETY: the caller guarantees both handles.
    check(
        unsafe { sys::cuEventRecordWithFlags(event, stream, flags) },
        "cuEventRecordWithFlags",
    )
}

/// `cuEventQuery`: `Ok(true)` when the recorded work has completed (or nothing was
/// recorded), `Ok(false)` while it runs.
///
/// # Safety
///
/// `event` is live.
#[inline]
pub(crate) unsafe fn query(event: sys::CUevent) -> Result<bool> {
    // SAFETY: the caller guarantees the handle.
    check_ready(unsafe { sys::cuEventQuery(event) }, "cuEventQuery")
}

/// `cuEventSynchronize`: waits for the recorded work.
///
/// # Safety
///
/// `event` is live.
#[inline]
pub(crate) unsafe fn synchronize(event: sys::CUevent) -> Result<()> {
    // SAFETY: the caller guarantees the handle.
    check(
        unsafe { sys::cuEventSynchronize(event) },
        "cuEventSynchronize",
    )
}
