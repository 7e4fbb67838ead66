//! A cdylib that lets PyTorch and gpubind exchange GPU tensors through DLPack, driven by
//! `scripts/dlpack_torch.py` (ctypes + `torch.utils.dlpack`):
//!
//! * `gpubind_export_arange(n, versioned)` allocates `n` f32 on device 0, fills them with
//!   0, 1, 2, … and returns a `DLManagedTensor*` (or `DLManagedTensorVersioned*`) for
//!   torch to take; torch calls our deleter when its tensor dies, which frees the slice in
//!   its own context.
//! * `gpubind_import_sum(ptr)` takes a legacy `DLManagedTensor*` that torch exported,
//!   copies it to the host through gpubind and returns the sum of its f32 elements.
//! * `gpubind_free_bytes()` is device 0's free memory, to see the deleter free.
//!
//! Build: `cargo build --release --example dlpack_torch` (gives
//! `target/release/examples/libdlpack_torch.so`).

use gpubind::dlpack::{DLManagedTensor, export, export_legacy};
use gpubind::{Device, ThreadContext};
use std::ffi::c_void;

fn fail(what: &str, e: gpubind::Error) -> *mut c_void {
    eprintln!("dlpack_torch: {what}: {e}");
    std::ptr::null_mut()
}

/// Exports an arange of `n` f32 on device 0; null on error (printed).
#[unsafe(no_mangle)]
pub extern "C" fn gpubind_export_arange(n: u64, versioned: i32) -> *mut c_void {
    let run = || -> gpubind::Result<*mut c_void> {
        let dev = Device::get(0)?;
        let mut ctx = ThreadContext::acquire()?;
        let gpu = ctx.bind(&dev)?;
        let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let buf = gpu.clone_htod(&host)?;
        let shape = [n as i64];
        Ok(if versioned != 0 {
            export(buf, &shape)?.into_raw().cast()
        } else {
            export_legacy(buf, &shape)?.into_raw().cast()
        })
    };
    run().unwrap_or_else(|e| fail("export", e))
}

/// Imports a legacy DLPack tensor of f32 on device 0 and returns the sum of its elements
/// (NaN on error, printed). Takes ownership: the producer's deleter is called once.
///
/// # Safety
///
/// `ptr` must be a live `DLManagedTensor*` that the caller hands over.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpubind_import_sum(ptr: *mut c_void) -> f64 {
    let run = || -> gpubind::Result<f64> {
        let dev = Device::get(0)?;
        let mut ctx = ThreadContext::acquire()?;
        let gpu = ctx.bind(&dev)?;
        // SAFETY: the caller hands over a live legacy managed tensor (see above).
        let tensor = unsafe { gpu.import_dlpack::<f32, DLManagedTensor>(ptr.cast())? };
        let mut host = vec![0f32; tensor.len()];
        gpu.copy(&tensor, &mut host[..])?;
        Ok(host.iter().map(|&v| v as f64).sum())
    };
    run().unwrap_or_else(|e| {
        fail("import", e);
        f64::NAN
    })
}

/// Free bytes on device 0 (`cuMemGetInfo`), or 0 on error.
#[unsafe(no_mangle)]
pub extern "C" fn gpubind_free_bytes() -> u64 {
    let run = || -> gpubind::Result<u64> {
        let dev = Device::get(0)?;
        let mut ctx = ThreadContext::acquire()?;
        Ok(ctx.bind(&dev)?.memory_info()?.0 as u64)
    };
    run().unwrap_or(0)
}
