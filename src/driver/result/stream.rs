//! Streams: creation, ordering, queries, capture.

use super::{check, check_ready};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::{c_int, c_uint};

/// `cuStreamCreate`: a stream of the current context with `flags`.
///
/// # Safety
///
/// The context the stream should belong to is current; the caller destroys the stream
/// with [`destroy`] in that context.
#[inline]
pub(crate) unsafe fn create(flags: c_uint) -> Result<sys::CUstream> {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: writes one handle; the caller made the owning context current.
    check(
        unsafe { sys::cuStreamCreate(&mut stream, flags) },
        "cuStreamCreate",
    )?;
    Ok(stream)
}

/// `cuStreamCreateWithPriority`.
///
/// # Safety
///
/// As [`create`].
#[inline]
pub(crate) unsafe fn create_with_priority(flags: c_uint, priority: c_int) -> Result<sys::CUstream> {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: writes one handle; the caller made the owning context current.
    check(
        unsafe { sys::cuStreamCreateWithPriority(&mut stream, flags, priority) },
        "cuStreamCreateWithPriority",
    )?;
    Ok(stream)
}

/// `cuStreamDestroy_v2`. Work already queued still runs.
///
/// # Safety
///
/// `stream` is a live stream the caller created, destroyed once, and not used after.
#[inline]
pub(crate) unsafe fn destroy(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller owns the handle and never uses it again.
    check(
        unsafe { sys::cuStreamDestroy_v2(stream) },
        "cuStreamDestroy_v2",
    )
}

/// `cuStreamQuery`: `Ok(true)` when all work queued on `stream` has completed,
/// `Ok(false)` while some still runs.
///
/// # Safety
///
/// `stream` is live (or null, the current context's legacy stream).
#[inline]
pub(crate) unsafe fn query(stream: sys::CUstream) -> Result<bool> {
    // SAFETY: the caller guarantees the handle.
    check_ready(unsafe { sys::cuStreamQuery(stream) }, "cuStreamQuery")
}

/// `cuStreamSynchronize`: waits until all work queued on `stream` has completed.
///
/// # Safety
///
/// `stream` is live (or null).
#[inline]
pub(crate) unsafe fn synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees the handle.
    check(
        unsafe { sys::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// `cuStreamWaitEvent(stream, event, 0)`: later work on `stream` waits for the work
/// `event` last recorded.
///
/// # Safety
///
/// `stream` and `event` are live.
#[inline]
pub(crate) unsafe fn wait_event(stream: sys::CUstream, event: sys::CUevent) -> Result<()> {
    // SAFETY: the caller guarantees both handles; flags must be 0.
    check(
        unsafe { sys::cuStreamWaitEvent(stream, event, 0) },
        "cuStreamWaitEvent",
    )
}

/// `cuStreamWaitEvent(stream, event, CU_EVENT_WAIT_EXTERNAL)`: on a capturing stream,
/// an event wait node that waits, at each launch of the graph, for the work `event`
/// last recorded (a plain wait there only joins captures).
///
/// # Safety
///
/// `stream` and `event` are live.
#[inline]
pub(crate) unsafe fn wait_event_external(stream: sys::CUstream, event: sys::CUevent) -> Result<()> {
    let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as std::ffi::c_uint;
    // SAFETY: the caller guarantees both handles.
    check(
        unsafe { sys::cuStreamWaitEvent(stream, event, flags) },
        "cuStreamWaitEvent",
    )
}

/// `cuStreamGetPriority`.
///
/// # Safety
///
/// `stream` is live.
#[inline]
pub(crate) unsafe fn priority(stream: sys::CUstream) -> Result<c_int> {
    let mut p = 0;
    // SAFETY: the caller guarantees the handle; writes one int.
    check(
        unsafe { sys::cuStreamGetPriority(stream, &mut p) },
        "cuStreamGetPriority",
    )?;
    Ok(p)
}

/// `cuStreamBeginCapture_v2`: starts capturing `stream`'s work into a graph.
///
/// # Safety
///
/// `stream` is live and not the legacy (null) stream.
#[inline]
pub(crate) unsafe fn begin_capture(
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> Result<()> {
    // SAFETY: the caller guarantees the handle.
    check(
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) },
        "cuStreamBeginCapture_v2",
    )
}

/// `cuStreamEndCapture`: ends the capture and returns the captured graph (which the
/// caller owns and destroys with `graph::destroy`).
///
/// # Safety
///
/// `stream` is live and capturing (begun on this thread in the global or thread-local
/// mode).
#[inline]
pub(crate) unsafe fn end_capture(stream: sys::CUstream) -> Result<sys::CUgraph> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the caller guarantees the handle; writes one graph handle.
    check(
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
        "cuStreamEndCapture",
    )?;
    Ok(graph)
}

/// `cuStreamAttachMemAsync`: attaches the whole managed allocation at `ptr` with `flags`
/// (`CU_MEM_ATTACH_GLOBAL`, `_HOST` or `_SINGLE`: to `stream`), in stream order.
///
/// # Safety
///
/// `stream` is a live stream of the current context (not the legacy stream for
/// `CU_MEM_ATTACH_SINGLE`); `ptr` is the start of a live managed allocation of that
/// context.
#[inline]
pub(crate) unsafe fn attach_mem_async(
    stream: sys::CUstream,
    ptr: sys::CUdeviceptr,
    flags: c_uint,
) -> Result<()> {
    // SAFETY: the caller guarantees the handles; length 0 names the whole allocation.
    check(
        unsafe { sys::cuStreamAttachMemAsync(stream, ptr, 0, flags) },
        "cuStreamAttachMemAsync",
    )
}

/// `cuStreamGetCtx`: the context `stream` belongs to.
///
/// # Safety
///
/// `stream` is a live stream handle (not a special handle's meaning for another
/// thread: any handle the driver accepts).
#[inline]
pub(crate) unsafe fn context(stream: sys::CUstream) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the caller guarantees the handle; writes one context handle.
    check(
        unsafe { sys::cuStreamGetCtx(stream, &mut ctx) },
        "cuStreamGetCtx",
    )?;
    Ok(ctx)
}

/// `cuStreamIsCapturing`: whether `stream` is being captured into a graph.
///
/// # Safety
///
/// `stream` is live.
#[inline]
pub(crate) unsafe fn is_capturing(stream: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the caller guarantees the handle; writes one status.
    check(
        unsafe { sys::cuStreamIsCapturing(stream, &mut status) },
        "cuStreamIsCapturing",
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
