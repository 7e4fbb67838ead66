//! Copies (`cuMemcpy*`) and fills (`cuMemset*`).
//!
//! Every function here is `unsafe`: the driver reads and writes the raw ranges it is
//! given, so the caller guarantees they are live, large enough and not in use by
//! other work in a conflicting way. For the `Async` forms the ranges must stay valid
//! until the stream has run the copy, and host memory must be page-locked for the copy
//! to be asynchronous (pageable memory makes it synchronous with respect to the host).

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_void;

/// `cuMemcpyHtoD_v2`: `bytes` from host `src` to device `dst`.
///
/// # Safety
///
/// `src` is readable for `bytes`; `dst` is device memory of the current context (or
/// reachable from it) writable for `bytes`.
#[inline]
pub(crate) unsafe fn htod(dst: sys::CUdeviceptr, src: *const c_void, bytes: usize) -> Result<()> {
    // SAFETY: the caller guarantees both ranges.
    check(
        unsafe { sys::cuMemcpyHtoD_v2(dst, src, bytes) },
        "cuMemcpyHtoD_v2",
    )
}

/// `cuMemcpyDtoH_v2`: `bytes` from device `src` to host `dst`.
///
/// # Safety
///
/// `dst` is writable for `bytes`; `src` is device memory readable for `bytes`.
#[inline]
pub(crate) unsafe fn dtoh(dst: *mut c_void, src: sys::CUdeviceptr, bytes: usize) -> Result<()> {
    // SAFETY: the caller guarantees both ranges.
    check(
        unsafe { sys::cuMemcpyDtoH_v2(dst, src, bytes) },
        "cuMemcpyDtoH_v2",
    )
}

/// `cuMemcpyDtoD_v2`: `bytes` between device ranges.
///
/// # Safety
///
/// Both ranges are device memory valid for `bytes`.
#[inline]
pub(crate) unsafe fn dtod(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller guarantees both ranges.
    check(
        unsafe { sys::cuMemcpyDtoD_v2(dst, src, bytes) },
        "cuMemcpyDtoD_v2",
    )
}

/// `cuMemcpyHtoDAsync_v2`, ordered on `stream`.
///
/// # Safety
///
/// As [`htod`], for as long as the stream needs them; `stream` is live.
#[inline]
pub(crate) unsafe fn htod_async(
    dst: sys::CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the ranges and the stream.
    check(
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream) },
        "cuMemcpyHtoDAsync_v2",
    )
}

/// `cuMemcpyDtoHAsync_v2`, ordered on `stream`.
///
/// # Safety
///
/// As [`dtoh`], for as long as the stream needs them; `stream` is live.
#[inline]
pub(crate) unsafe fn dtoh_async(
    dst: *mut c_void,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the ranges and the stream.
    check(
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream) },
        "cuMemcpyDtoHAsync_v2",
    )
}

/// `cuMemcpyDtoDAsync_v2`, ordered on `stream`.
///
/// # Safety
///
/// As [`dtod`], for as long as the stream needs them; `stream` is live.
#[inline]
pub(crate) unsafe fn dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the ranges and the stream.
    check(
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) },
        "cuMemcpyDtoDAsync_v2",
    )
}

/// `cuMemcpyAsync`: `bytes` between two unified addresses, ordered on `stream`.
///
/// # Safety
///
/// Both addresses are valid for `bytes` (host addresses page-locked or pageable, as the
/// driver allows) for as long as the stream needs them; `stream` is live.
#[inline]
pub(crate) unsafe fn copy_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the ranges and the stream.
    check(
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) },
        "cuMemcpyAsync",
    )
}

/// `cuMemcpyPeerAsync`: `bytes` from `src` in `src_ctx` to `dst` in `dst_ctx`.
///
/// # Safety
///
/// Both contexts are live; both ranges are device memory of their context valid for
/// `bytes` for as long as the stream needs them; `stream` is live.
#[inline]
pub(crate) unsafe fn peer_async(
    dst: sys::CUdeviceptr,
    dst_ctx: sys::CUcontext,
    src: sys::CUdeviceptr,
    src_ctx: sys::CUcontext,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the contexts, ranges and stream.
    check(
        unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, stream) },
        "cuMemcpyPeerAsync",
    )
}

/// `cuMemsetD8_v2`: sets `n` bytes at `dst` to `value`.
///
/// # Safety
///
/// `dst` is device memory writable for `n` bytes.
#[inline]
pub(crate) unsafe fn memset_d8(dst: sys::CUdeviceptr, value: u8, n: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range.
    check(
        unsafe { sys::cuMemsetD8_v2(dst, value, n) },
        "cuMemsetD8_v2",
    )
}

/// `cuMemsetD16_v2`: sets `n` 16-bit words at `dst` to `value`.
///
/// # Safety
///
/// `dst` is 2-byte aligned device memory writable for `2 * n` bytes.
#[inline]
pub(crate) unsafe fn memset_d16(dst: sys::CUdeviceptr, value: u16, n: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range.
    check(
        unsafe { sys::cuMemsetD16_v2(dst, value, n) },
        "cuMemsetD16_v2",
    )
}

/// `cuMemsetD32_v2`: sets `n` 32-bit words at `dst` to `value`.
///
/// # Safety
///
/// `dst` is 4-byte aligned device memory writable for `4 * n` bytes.
#[inline]
pub(crate) unsafe fn memset_d32(dst: sys::CUdeviceptr, value: u32, n: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range.
    check(
        unsafe { sys::cuMemsetD32_v2(dst, value, n) },
        "cuMemsetD32_v2",
    )
}

/// `cuMemsetD8Async`, ordered on `stream`.
///
/// # Safety
///
/// As [`memset_d8`], for as long as the stream needs it; `stream` is live.
#[inline]
pub(crate) unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the range and the stream.
    check(
        unsafe { sys::cuMemsetD8Async(dst, value, n, stream) },
        "cuMemsetD8Async",
    )
}

/// `cuMemsetD16Async`, ordered on `stream`.
///
/// # Safety
///
/// As [`memset_d16`], for as long as the stream needs it; `stream` is live.
#[inline]
pub(crate) unsafe fn memset_d16_async(
    dst: sys::CUdeviceptr,
    value: u16,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the range and the stream.
    check(
        unsafe { sys::cuMemsetD16Async(dst, value, n, stream) },
        "cuMemsetD16Async",
    )
}

/// `cuMemsetD32Async`, ordered on `stream`.
///
/// # Safety
///
/// As [`memset_d32`], for as long as the stream needs it; `stream` is live.
#[inline]
pub(crate) unsafe fn memset_d32_async(
    dst: sys::CUdeviceptr,
    value: u32,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the range and the stream.
    check(
        unsafe { sys::cuMemsetD32Async(dst, value, n, stream) },
        "cuMemsetD32Async",
    )
}
