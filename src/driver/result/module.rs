//! Modules, their functions and globals, function attributes, occupancy, launches.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::{CStr, c_int, c_uint, c_void};

/// `cuModuleLoadData`: loads a PTX, cubin or fatbin image into the current context.
///
/// # Safety
///
/// `image` points to a complete image (PTX NUL-terminated) that stays readable for the
/// call; the owning context is current; the caller unloads the module with [`unload`].
#[inline]
pub(crate) unsafe fn load_data(image: *const c_void) -> Result<sys::CUmodule> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the caller guarantees the image; writes one handle.
    check(
        unsafe { sys::cuModuleLoadData(&mut module, image) },
        "cuModuleLoadData",
    )?;
    Ok(module)
}

/// `cuModuleUnload`.
///
/// # Safety
///
/// `module` is live, unloaded once, and no queued or running work uses its functions
/// or globals.
#[inline]
pub(crate) unsafe fn unload(module: sys::CUmodule) -> Result<()> {
    // SAFETY: the caller owns the handle and nothing uses the module any more.
    check(unsafe { sys::cuModuleUnload(module) }, "cuModuleUnload")
}

/// `cuModuleGetFunction`: the kernel `name` of `module` (valid while it is loaded).
///
/// # Safety
///
/// `module` is live.
#[inline]
pub(crate) unsafe fn get_function(module: sys::CUmodule, name: &CStr) -> Result<sys::CUfunction> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: the caller guarantees the module; `name` is NUL-terminated.
    check(
        unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    Ok(f)
}

/// `cuModuleGetGlobal_v2`: `(address, bytes)` of the global `name` of `module`.
///
/// # Safety
///
/// `module` is live.
#[inline]
pub(crate) unsafe fn get_global(
    module: sys::CUmodule,
    name: &CStr,
) -> Result<(sys::CUdeviceptr, usize)> {
    let (mut ptr, mut bytes) = (0, 0);
    // SAFETY: the caller guarantees the module; `name` is NUL-terminated.
    check(
        unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, module, name.as_ptr()) },
        "cuModuleGetGlobal_v2",
    )?;
    Ok((ptr, bytes))
}

/// `cuFuncGetAttribute`: one integer attribute of `f`.
///
/// # Safety
///
/// `f` is a function of a live module.
#[inline]
pub(crate) unsafe fn func_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> Result<c_int> {
    let mut v = 0;
    // SAFETY: the caller guarantees the function; writes one int.
    check(
        unsafe { sys::cuFuncGetAttribute(&mut v, attr, f) },
        "cuFuncGetAttribute",
    )?;
    Ok(v)
}

/// `cuFuncSetAttribute`: sets one integer attribute of `f`.
///
/// # Safety
///
/// `f` is a function of a live module.
#[inline]
pub(crate) unsafe fn func_set_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: c_int,
) -> Result<()> {
    // SAFETY: the caller guarantees the function.
    check(
        unsafe { sys::cuFuncSetAttribute(f, attr, value) },
        "cuFuncSetAttribute",
    )
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
///
/// # Safety
///
/// `f` is a function of a live module whose context is current.
#[inline]
pub(crate) unsafe fn max_active_blocks_per_multiprocessor(
    f: sys::CUfunction,
    block_size: c_int,
    dynamic_smem: usize,
) -> Result<c_int> {
    let mut n = 0;
    // SAFETY: the caller guarantees the function; writes one int.
    check(
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block_size, dynamic_smem)
        },
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    )?;
    Ok(n)
}

/// `cuOccupancyMaxPotentialBlockSize` with a fixed dynamic shared memory size:
/// `(min_grid_size, block_size)`.
///
/// # Safety
///
/// `f` is a function of a live module whose context is current.
#[inline]
pub(crate) unsafe fn max_potential_block_size(
    f: sys::CUfunction,
    dynamic_smem: usize,
    block_size_limit: c_int,
) -> Result<(c_int, c_int)> {
    let (mut grid, mut block) = (0, 0);
    // SAFETY: the caller guarantees the function; no size callback; writes two ints.
    check(
        unsafe {
            sys::cuOccupancyMaxPotentialBlockSize(
                &mut grid,
                &mut block,
                f,
                None,
                dynamic_smem,
                block_size_limit,
            )
        },
        "cuOccupancyMaxPotentialBlockSize",
    )?;
    Ok((grid, block))
}

/// `cuLaunchKernel`: enqueues `f` on `stream`.
///
/// # Safety
///
/// `f` is a function of a live module of `stream`'s context (current); `params` points
/// to one pointer per kernel parameter, each to a value of the parameter's type and
/// size, and every memory the kernel touches stays valid, unaliased as the kernel
/// needs, until the kernel has run. `extra` is null or a valid `CU_LAUNCH_PARAM` list.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn launch_kernel(
    f: sys::CUfunction,
    grid: (c_uint, c_uint, c_uint),
    block: (c_uint, c_uint, c_uint),
    shared_mem_bytes: c_uint,
    stream: sys::CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract is this call's.
    check(
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                stream,
                params,
                extra,
            )
        },
        "cuLaunchKernel",
    )
}
