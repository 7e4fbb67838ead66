//! Device, pinned-host and managed allocations, and what the driver knows of a pointer.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::{c_uint, c_void};

/// `cuMemAlloc_v2`: `bytes` of device memory in the current context.
///
/// # Safety
///
/// The context the memory should belong to is current (the memory belongs to whichever
/// is), and the caller frees it with [`free`] in that context.
#[inline]
pub(crate) unsafe fn alloc(bytes: usize) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; the caller made the owning context current.
    check(
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) },
        "cuMemAlloc_v2",
    )?;
    Ok(ptr)
}

/// `cuMemFree_v2`.
///
/// # Safety
///
/// `ptr` came from [`alloc`] (or [`alloc_managed`]) in the current context, is freed
/// once, and no queued or running work uses it.
#[inline]
pub(crate) unsafe fn free(ptr: sys::CUdeviceptr) -> Result<()> {
    // SAFETY: the caller owns `ptr` and nothing uses it any more.
    check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree_v2")
}

/// `cuMemAllocAsync`: `bytes` from the device's current memory pool, ordered on
/// `stream`.
///
/// # Safety
///
/// `stream` is a live stream of the current context; the memory is used only after this
/// point of `stream` (or after waiting for it) and freed once.
#[inline]
pub(crate) unsafe fn alloc_async(bytes: usize, stream: sys::CUstream) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; the caller guarantees the stream.
    check(
        unsafe { sys::cuMemAllocAsync(&mut ptr, bytes, stream) },
        "cuMemAllocAsync",
    )?;
    Ok(ptr)
}

/// `cuMemAllocFromPoolAsync`: `bytes` from `pool`, ordered on `stream`.
///
/// # Safety
///
/// `pool` and `stream` are live handles of the current context; the memory is used
/// only after this point of `stream` (or after waiting for it) and freed once.
#[inline]
pub(crate) unsafe fn alloc_from_pool_async(
    bytes: usize,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; the caller guarantees the handles.
    check(
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream) },
        "cuMemAllocFromPoolAsync",
    )?;
    Ok(ptr)
}

/// `cuMemFreeAsync`: frees `ptr` once `stream` reaches this point.
///
/// # Safety
///
/// `ptr` is a live allocation of the current context freed once; `stream` is live; no
/// work that is not ordered before this point of `stream` uses `ptr`.
#[inline]
pub(crate) unsafe fn free_async(ptr: sys::CUdeviceptr, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller guarantees ownership and ordering.
    check(
        unsafe { sys::cuMemFreeAsync(ptr, stream) },
        "cuMemFreeAsync",
    )
}

/// `cuMemAllocManaged`: `bytes` of managed memory with `flags`
/// (`CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`).
///
/// # Safety
///
/// As [`alloc`]: the owning context is current and the caller frees the memory with
/// [`free`].
#[inline]
pub(crate) unsafe fn alloc_managed(bytes: usize, flags: c_uint) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; the caller made the owning context current.
    check(
        unsafe { sys::cuMemAllocManaged(&mut ptr, bytes, flags) },
        "cuMemAllocManaged",
    )?;
    Ok(ptr)
}

/// `cuMemHostAlloc`: `bytes` of page-locked host memory with `flags`.
///
/// # Safety
///
/// The context the allocation is for is current; the caller frees it with
/// [`free_host`].
#[inline]
pub(crate) unsafe fn host_alloc(bytes: usize, flags: c_uint) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes one pointer; the caller made the context current.
    check(
        unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, flags) },
        "cuMemHostAlloc",
    )?;
    Ok(ptr)
}

/// `cuMemFreeHost`.
///
/// # Safety
///
/// `ptr` came from [`host_alloc`], is freed once, and nothing (host code or queued
/// work) uses it any more.
#[inline]
pub(crate) unsafe fn free_host(ptr: *mut c_void) -> Result<()> {
    // SAFETY: the caller owns `ptr` and nothing uses it any more.
    check(unsafe { sys::cuMemFreeHost(ptr) }, "cuMemFreeHost")
}

/// `cuMemHostRegister_v2`: page-locks `bytes` of host memory at `ptr`.
///
/// # Safety
///
/// `ptr..ptr + bytes` is host memory that stays allocated until [`host_unregister`].
#[inline]
pub(crate) unsafe fn host_register(ptr: *mut c_void, bytes: usize, flags: c_uint) -> Result<()> {
    // SAFETY: the caller keeps the range allocated while registered.
    check(
        unsafe { sys::cuMemHostRegister_v2(ptr, bytes, flags) },
        "cuMemHostRegister_v2",
    )
}

/// `cuMemHostUnregister`.
///
/// # Safety
///
/// `ptr` was registered with [`host_register`] and no queued work still uses it.
#[inline]
pub(crate) unsafe fn host_unregister(ptr: *mut c_void) -> Result<()> {
    // SAFETY: the caller guarantees the registration and that nothing uses it.
    check(
        unsafe { sys::cuMemHostUnregister(ptr) },
        "cuMemHostUnregister",
    )
}

/// `cuMemHostGetDevicePointer_v2`: the device address of pinned or registered host
/// memory.
///
/// # Safety
///
/// `ptr` points into a live pinned allocation or registration of the current context.
#[inline]
pub(crate) unsafe fn host_get_device_pointer(ptr: *mut c_void) -> Result<sys::CUdeviceptr> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; the caller guarantees `ptr`; flags must be 0.
    check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr, 0) },
        "cuMemHostGetDevicePointer_v2",
    )?;
    Ok(dptr)
}

/// `cuMemGetAddressRange_v2`: `(base, size)` of the allocation containing `ptr`.
///
/// # Safety
///
/// A context in which `ptr` is meaningful is current; the driver validates `ptr`.
#[inline]
pub(crate) unsafe fn address_range(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize)> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: writes one pointer and one size; the driver validates `ptr`.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange_v2",
    )?;
    Ok((base, size))
}

/// `cuMemGetInfo_v2`: `(free, total)` bytes of the current context's device.
#[inline]
pub(crate) fn get_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: writes two size_t; without a current context the driver reports an error.
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo_v2",
    )?;
    Ok((free, total))
}

/// `cuPointerGetAttribute` for an attribute whose value is at most 8 bytes, returned
/// zero-extended in a `u64`.
///
/// # Safety
///
/// `attr`'s value is at most 8 bytes (an unsigned int, a bool, a pointer or a handle;
/// not `CU_POINTER_ATTRIBUTE_P2P_TOKENS`). The driver validates `ptr`.
#[inline]
pub(crate) unsafe fn pointer_attribute(
    ptr: sys::CUdeviceptr,
    attr: sys::CUpointer_attribute,
) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: the caller's attribute writes at most 8 bytes into `value`.
    check(
        unsafe { sys::cuPointerGetAttribute((&mut value as *mut u64).cast(), attr, ptr) },
        "cuPointerGetAttribute",
    )?;
    Ok(value)
}
