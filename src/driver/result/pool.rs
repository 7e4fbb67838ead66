//! Memory pools (`cuMemPool*`): creation, attributes, access, export and import.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_int;

/// `cuMemPoolCreate`: a pool with `props` (the caller destroys it with [`destroy`]).
///
/// # Safety
///
/// `props` is fully initialised; the context the pool is for is current.
#[inline]
pub(crate) unsafe fn create(props: &sys::CUmemPoolProps) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `props` lives for the call; writes one handle.
    check(
        unsafe { sys::cuMemPoolCreate(&mut pool, props) },
        "cuMemPoolCreate",
    )?;
    Ok(pool)
}

/// `cuMemPoolDestroy`.
///
/// # Safety
///
/// `pool` is live, destroyed once, and none of its allocations is still in use.
#[inline]
pub(crate) unsafe fn destroy(pool: sys::CUmemoryPool) -> Result<()> {
    // SAFETY: the caller owns the handle and nothing uses the pool any more.
    check(unsafe { sys::cuMemPoolDestroy(pool) }, "cuMemPoolDestroy")
}

/// `cuMemPoolTrimTo`: releases unused memory down to `keep` bytes.
///
/// # Safety
///
/// `pool` is live.
#[inline]
pub(crate) unsafe fn trim_to(pool: sys::CUmemoryPool, keep: usize) -> Result<()> {
    // SAFETY: the caller guarantees the handle.
    check(
        unsafe { sys::cuMemPoolTrimTo(pool, keep) },
        "cuMemPoolTrimTo",
    )
}

/// `cuMemPoolGetAttribute` for an attribute whose value is at most 8 bytes, returned
/// zero-extended in a `u64`.
///
/// # Safety
///
/// `pool` is live; `attr`'s value is an int or a 64-bit integer.
#[inline]
pub(crate) unsafe fn attribute(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: the caller's attribute writes at most 8 bytes into `value`.
    check(
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) },
        "cuMemPoolGetAttribute",
    )?;
    Ok(value)
}

/// `cuMemPoolSetAttribute` for an attribute whose value is a 64-bit integer.
///
/// # Safety
///
/// `pool` is live; `attr`'s value is a 64-bit integer.
#[inline]
pub(crate) unsafe fn set_attribute(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    let mut value = value;
    // SAFETY: the caller's attribute reads 8 bytes from `value`.
    check(
        unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut value as *mut u64).cast()) },
        "cuMemPoolSetAttribute",
    )
}

/// `cuMemPoolSetAttribute` for an attribute whose value is an `int` (the reuse switches).
///
/// # Safety
///
/// `pool` is live; `attr`'s value is an `int`.
#[inline]
pub(crate) unsafe fn set_attribute_int(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    value: std::ffi::c_int,
) -> Result<()> {
    let mut value = value;
    // SAFETY: the caller's attribute reads one int from `value`.
    check(
        unsafe {
            sys::cuMemPoolSetAttribute(pool, attr, (&mut value as *mut std::ffi::c_int).cast())
        },
        "cuMemPoolSetAttribute",
    )
}

/// `cuMemPoolSetAccess` with the descriptors in `map`.
///
/// # Safety
///
/// `pool` is live.
#[inline]
pub(crate) unsafe fn set_access(
    pool: sys::CUmemoryPool,
    map: &[sys::CUmemAccessDesc],
) -> Result<()> {
    // SAFETY: the caller guarantees the pool; `map` lives for the call.
    check(
        unsafe { sys::cuMemPoolSetAccess(pool, map.as_ptr(), map.len()) },
        "cuMemPoolSetAccess",
    )
}

/// `cuMemPoolExportPointer`: the 64-byte export data of an allocation of an IPC pool.
///
/// # Safety
///
/// `ptr` is a live allocation of an exportable pool of the current context.
#[inline]
pub(crate) unsafe fn export_pointer(ptr: sys::CUdeviceptr) -> Result<sys::CUmemPoolPtrExportData> {
    let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: the caller guarantees the allocation; writes 64 bytes.
    check(
        unsafe { sys::cuMemPoolExportPointer(&mut data, ptr) },
        "cuMemPoolExportPointer",
    )?;
    Ok(data)
}

/// `cuMemPoolImportPointer`: maps an exported allocation of an imported pool (the
/// caller unmaps it with `memory::free`).
///
/// # Safety
///
/// `pool` is a live imported pool of the current context. The export data is plain data
/// the driver validates.
#[inline]
pub(crate) unsafe fn import_pointer(
    pool: sys::CUmemoryPool,
    data: &mut sys::CUmemPoolPtrExportData,
) -> Result<sys::CUdeviceptr> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: the caller guarantees the pool; `data` is 64 readable bytes; writes one
    // address.
    check(
        unsafe { sys::cuMemPoolImportPointer(&mut ptr, pool, data) },
        "cuMemPoolImportPointer",
    )?;
    Ok(ptr)
}

/// `cuMemPoolExportToShareableHandle` as a POSIX file descriptor (which the caller
/// owns and closes).
///
/// # Safety
///
/// `pool` is a live pool of the current context created with the POSIX file
/// descriptor handle type.
#[inline]
pub(crate) unsafe fn export_to_fd(pool: sys::CUmemoryPool) -> Result<c_int> {
    let mut fd: c_int = -1;
    // SAFETY: for POSIX_FILE_DESCRIPTOR the driver writes one int through the pointer.
    check(
        unsafe {
            sys::cuMemPoolExportToShareableHandle(
                (&mut fd as *mut c_int).cast(),
                pool,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemPoolExportToShareableHandle",
    )?;
    Ok(fd)
}

/// `cuMemPoolImportFromShareableHandle` from a POSIX file descriptor (the driver takes
/// the descriptor's value in the pointer argument and does not take ownership). The
/// caller destroys the pool with [`destroy`].
///
/// # Safety
///
/// A context is current; `fd` is an open descriptor for the call.
#[inline]
pub(crate) unsafe fn import_from_fd(fd: c_int) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the descriptor travels by value in the pointer argument; writes one handle.
    check(
        unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                &mut pool,
                std::ptr::without_provenance_mut(fd as usize),
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemPoolImportFromShareableHandle",
    )?;
    Ok(pool)
}
