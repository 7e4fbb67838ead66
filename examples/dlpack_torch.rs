//! A cdylib that lets PyTorch and gpubind exchange GPU tensors through DLPack, driven by
//! `scripts/dlpack_torch.py` (ctypes + `torch.utils.dlpack`):
//!
//! * `gpubind_export_arange(n, versioned)` allocates `n` f32 on device 0, fills them with
//!   0, 1, 2, … and returns a `DLManagedTensor*` (or `DLManagedTensorVersioned*`) for
//!   torch to take; torch calls our deleter when its tensor dies, which frees the slice in
//!   its own context.
//! * `gpubind_import_sum(ptr)` takes a legacy `DLManagedTensor*` that torch exported,
//!   copies it to the host through gpubind and returns the sum of its f32 elements.
//! * `gpubind_scale_on_stream(ptr, stream, factor)` takes a legacy `DLManagedTensor*` of
//!   f32 and torch's current stream (`torch.cuda.current_stream().cuda_stream`, an
//!   integer), lends that stream to gpubind ([`BoundDevice::borrow_stream`]) and multiplies
//!   the tensor by `factor` there with a gpubind kernel: in torch's stream order, so
//!   torch's next work on the stream sees the result.
//! * `gpubind_free_bytes()` is device 0's free memory, to see the deleter free.
//!
//! Build: `cargo build --release --example dlpack_torch` (gives
//! `target/release/examples/libdlpack_torch.so`).

use gpubind::dlpack::{DLManagedTensor, export, export_legacy};
use gpubind::{BoundDevice, Device, LaunchConfig, ThreadContext};
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

const SCALE: &str = r#"
extern "C" __global__ void scale(float* x, float f, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}
"#;

/// Multiplies a legacy DLPack tensor of f32 on device 0 by `factor`, on the CUDA stream
/// `stream` (torch's current stream): 0 on success, -1 on error (printed). Takes
/// ownership of the tensor like `gpubind_import_sum`.
///
/// # Safety
///
/// `ptr` as for `gpubind_import_sum`; `stream` a live stream of device 0's primary
/// context (not 0: torch's default stream is the legacy stream) that outlives the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpubind_scale_on_stream(
    ptr: *mut c_void,
    stream: u64,
    factor: f32,
) -> i32 {
    let run = || -> gpubind::Result<()> {
        let dev = Device::get(0)?;
        let mut ctx = ThreadContext::acquire()?;
        let gpu = ctx.bind(&dev)?;
        // SAFETY: the caller hands over a live legacy managed tensor (see above).
        let mut tensor = unsafe { gpu.import_dlpack::<f32, DLManagedTensor>(ptr.cast())? };
        // SAFETY: torch's stream of this context, alive for the whole call (see above).
        let lent = unsafe { gpu.borrow_stream(stream as usize as _)? };
        scale_on(&gpu, &lent, &mut tensor, factor)
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            fail("scale_on_stream", e);
            -1
        }
    }
}

/// The tensor is copied into a gpubind buffer, scaled there and copied back, all on
/// `lent`; the function returns once that stream has passed the last copy.
fn scale_on(
    gpu: &BoundDevice<'_>,
    lent: &gpubind::Stream,
    tensor: &mut gpubind::dlpack::ImportedTensor<f32, DLManagedTensor>,
    factor: f32,
) -> gpubind::Result<()> {
    let module = gpu.compile_and_load(SCALE, "scale.cu")?;
    let scale = module.function("scale")?;
    let s = gpu.on(lent)?;
    let n = tensor.len() as u32;
    let mut buf = gpu.alloc_zeros::<f32>(tensor.len())?;
    // SAFETY: the tensor is device memory that lives (owned) until after the
    // synchronize below; the host touches neither side meanwhile.
    unsafe { s.copy_async(&*tensor, &mut buf)? };
    // SAFETY: (float*, float, unsigned) matches; the kernel stays below n.
    unsafe {
        s.launch(&scale, LaunchConfig::for_num_elems(n))
            .arg(&mut buf)
            .arg(&factor)
            .arg(&n)
            .launch()?;
    }
    // SAFETY: as above.
    unsafe { s.copy_async(&buf, tensor)? };
    s.synchronize()
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
