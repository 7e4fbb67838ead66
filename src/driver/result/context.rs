//! Contexts: the thread's current context, primary contexts, peer access.

use super::{check, check_value};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_int;

/// `cuCtxGetCurrent`: the thread's current context (null when none).
#[inline]
pub(crate) fn get_current() -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle; needs no current context.
    check_value(
        unsafe { sys::cuCtxGetCurrent(&mut ctx) },
        "cuCtxGetCurrent",
        (),
    )?;
    Ok(ctx)
}

/// `cuCtxSetCurrent`: replaces the top of this thread's context stack with `ctx`.
///
/// # Safety
///
/// `ctx` is null or a context that stays alive (retained) while it is current.
#[inline]
pub(crate) unsafe fn set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller keeps `ctx` alive; this affects only this thread.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// `cuCtxPushCurrent_v2`: pushes `ctx` on this thread's context stack.
///
/// # Safety
///
/// `ctx` is a live (retained) context that stays alive until it is popped again.
#[inline]
pub(crate) unsafe fn push_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller keeps `ctx` alive while pushed.
    check(
        unsafe { sys::cuCtxPushCurrent_v2(ctx) },
        "cuCtxPushCurrent_v2",
    )
}

/// `cuCtxPopCurrent_v2`: pops this thread's current context and returns it.
///
/// # Safety
///
/// The caller pushed the context being popped (pops pair with pushes on this thread).
#[inline]
pub(crate) unsafe fn pop_current() -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle; the caller pairs this pop with its push.
    check(
        unsafe { sys::cuCtxPopCurrent_v2(&mut ctx) },
        "cuCtxPopCurrent_v2",
    )?;
    Ok(ctx)
}

/// `cuCtxSynchronize`: waits for all work of the current context.
#[inline]
pub(crate) fn synchronize() -> Result<()> {
    // SAFETY: no arguments; without a current context the driver reports an error.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// `cuCtxGetStreamPriorityRange`: `(least, greatest)` stream priority of the current
/// context.
#[inline]
pub(crate) fn stream_priority_range() -> Result<(c_int, c_int)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: writes two ints; without a current context the driver reports an error.
    check(
        unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) },
        "cuCtxGetStreamPriorityRange",
    )?;
    Ok((least, greatest))
}

/// `cuCtxEnablePeerAccess(peer, 0)` from the current context: `Ok(true)` when enabled
/// now, `Ok(false)` when it already was (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`).
///
/// # Safety
///
/// `peer` is a live (retained) context for the call.
#[inline]
pub(crate) unsafe fn enable_peer_access(peer: sys::CUcontext) -> Result<bool> {
    // SAFETY: the caller keeps `peer` alive; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(false),
        code => check_value(code, "cuCtxEnablePeerAccess", true),
    }
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode to `mode` and
/// returns the one it replaces.
#[inline]
pub(crate) fn exchange_capture_mode(
    mode: sys::CUstreamCaptureMode,
) -> Result<sys::CUstreamCaptureMode> {
    let mut mode = mode;
    // SAFETY: swaps one enum value of this thread's state.
    check(
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) },
        "cuThreadExchangeStreamCaptureMode",
    )?;
    Ok(mode)
}

/// `cuDevicePrimaryCtxRetain`: retains `device`'s primary context (one retain that a
/// [`primary_release`] must match).
#[inline]
pub(crate) fn primary_retain(device: sys::CUdevice) -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle; the driver validates the ordinal.
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) },
        "cuDevicePrimaryCtxRetain",
    )?;
    Ok(ctx)
}

/// `cuDevicePrimaryCtxRelease_v2`: drops one retain of `device`'s primary context.
///
/// # Safety
///
/// Matches one successful [`primary_retain`] of the caller's, and nothing that still
/// uses the context (memory, streams, modules) depends on that retain.
#[inline]
pub(crate) unsafe fn primary_release(device: sys::CUdevice) -> Result<()> {
    // SAFETY: the caller releases only its own retain, after its last use.
    check(
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) },
        "cuDevicePrimaryCtxRelease_v2",
    )
}

/// `cuDevicePrimaryCtxReset_v2`: destroys every resource of `device`'s primary context.
///
/// # Safety
///
/// No live object of the caller's (memory, stream, event, module) belongs to the
/// context: they would dangle.
#[inline]
pub(crate) unsafe fn primary_reset(device: sys::CUdevice) -> Result<()> {
    // SAFETY: the caller guarantees nothing of the context is still in use.
    check(
        unsafe { sys::cuDevicePrimaryCtxReset_v2(device) },
        "cuDevicePrimaryCtxReset_v2",
    )
}

/// `cuDevicePrimaryCtxGetState`: `(flags, active)` of `device`'s primary context.
#[inline]
pub(crate) fn primary_state(device: sys::CUdevice) -> Result<(u32, bool)> {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: writes one unsigned int and one int; the driver validates the ordinal.
    check(
        unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) },
        "cuDevicePrimaryCtxGetState",
    )?;
    Ok((flags, active != 0))
}
