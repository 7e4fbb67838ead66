//! Devices: ordinals, names, attributes, peer capability.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_int;

/// `cuDeviceGetCount`: how many devices the driver sees.
#[inline]
pub(crate) fn count() -> Result<c_int> {
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// `cuDeviceGet`: the device handle of `ordinal`.
#[inline]
pub(crate) fn get(ordinal: c_int) -> Result<sys::CUdevice> {
    let mut device: sys::CUdevice = 0;
    // SAFETY: writes one handle; the driver validates the ordinal.
    check(
        unsafe { sys::cuDeviceGet(&mut device, ordinal) },
        "cuDeviceGet",
    )?;
    Ok(device)
}

/// `cuDeviceGetName`: the device's name (bytes up to the first NUL, lossily UTF-8).
#[inline]
pub(crate) fn name(device: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name
    // of at most that many.
    check(
        unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, device) },
        "cuDeviceGetName",
    )?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `cuDeviceGetUuid_v2`: the device's 16-byte UUID.
#[inline]
pub(crate) fn uuid(device: sys::CUdevice) -> Result<sys::CUuuid> {
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes one CUuuid; the driver validates the handle.
    check(
        unsafe { sys::cuDeviceGetUuid_v2(&mut uuid, device) },
        "cuDeviceGetUuid_v2",
    )?;
    Ok(uuid)
}

/// `cuDeviceGetAttribute`: one integer attribute.
#[inline]
pub(crate) fn attribute(device: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<c_int> {
    let mut v = 0;
    // SAFETY: writes one int; the driver validates the handle and the attribute.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, device) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// `cuDeviceTotalMem_v2`: the device's memory in bytes.
#[inline]
pub(crate) fn total_mem(device: sys::CUdevice) -> Result<usize> {
    let mut bytes = 0;
    // SAFETY: writes one size_t; the driver validates the handle.
    check(
        unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, device) },
        "cuDeviceTotalMem_v2",
    )?;
    Ok(bytes)
}

/// `cuDeviceCanAccessPeer`: whether `device` can access `peer`'s memory.
#[inline]
pub(crate) fn can_access_peer(device: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: writes one int; the driver validates both handles.
    check(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(can != 0)
}

/// `cuDeviceGetDefaultMemPool`: the device's default memory pool (the pool stream-ordered
/// allocations use unless another is named). Needs no context.
#[inline]
pub(crate) fn default_mem_pool(device: sys::CUdevice) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pool handle; the driver validates the device handle.
    check(
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, device) },
        "cuDeviceGetDefaultMemPool",
    )?;
    Ok(pool)
}
