//! Loading the driver: `cuInit`, `cuDriverGetVersion`, `cuGetProcAddress_v2`.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::{CStr, c_int, c_void};

/// `cuInit(flags)`.
///
/// Needs `libcuda` loadable (cudarc's loader panics without it): callers check
/// `driver_available` first.
#[inline]
pub(crate) fn init(flags: u32) -> Result<()> {
    // SAFETY: cuInit has no preconditions beyond the library being present.
    check(unsafe { sys::cuInit(flags) }, "cuInit")
}

/// `cuDriverGetVersion`: the CUDA version the driver supports, e.g. `12020`.
///
/// Needs `libcuda` loadable but no `cuInit`.
#[inline]
pub(crate) fn driver_get_version() -> Result<c_int> {
    let mut raw = 0;
    // SAFETY: writes one int; needs no cuInit.
    super::check_value(
        unsafe { sys::cuDriverGetVersion(&mut raw) },
        "cuDriverGetVersion",
        (),
    )?;
    Ok(raw)
}

/// `cuGetProcAddress_v2`: the address of `symbol` in the ABI of `cuda_version`, and the
/// driver's query status. A symbol the driver lacks is `Ok((null, status))` when the
/// driver says `CUDA_ERROR_NOT_FOUND` together with a status other than success.
#[inline]
pub(crate) fn get_proc_address(
    symbol: &CStr,
    cuda_version: c_int,
    flags: u64,
) -> Result<(*mut c_void, sys::CUdriverProcAddressQueryResult)> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: `symbol` is NUL-terminated and lives for the call; writes one pointer and
    // one status.
    let code = unsafe {
        sys::cuGetProcAddress_v2(symbol.as_ptr(), &mut pfn, cuda_version, flags, &mut status)
    };
    if code == sys::CUresult::CUDA_ERROR_NOT_FOUND {
        return Ok((std::ptr::null_mut(), status));
    }
    check(code, "cuGetProcAddress_v2")?;
    Ok((pfn, status))
}
