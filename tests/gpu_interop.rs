//! GPU tests of by-value struct arguments, the cudarc interop (`gpubind::interop`) and
//! NVRTC's target choice. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_interop` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, run_suite};
use gpubind::{Device, DeviceRepr, LaunchConfig, ThreadContext};
use std::sync::Arc;

type R = Result<(), String>;

fn dev0() -> Result<Arc<Device>, String> {
    Device::get(0).ctx("Device::get(0)")
}

/// A kernel parameter struct, passed by value. Its C twin below has the same layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Affine {
    scale: f32,
    shift: f32,
    n: u32,
    stride: u32,
    bias: [f64; 2],
}
// SAFETY: repr(C), 4 × 4 bytes then 2 × 8 (offset 16): no padding; every bit pattern is
// a valid value; no owned resources.
unsafe impl DeviceRepr for Affine {}

const AFFINE: &str = r#"
struct Affine { float scale; float shift; unsigned n; unsigned stride; double bias[2]; };
extern "C" __global__ void affine(Affine p, const float* x, float* y) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] = p.scale * x[i * p.stride] + p.shift + (float)(p.bias[0] - p.bias[1]);
}
"#;

/// Item 7 of issue 11: `unsafe impl DeviceRepr` is enough to pass a struct by value.
fn struct_by_value_reaches_the_kernel() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(AFFINE, "affine.cu")
        .ctx("compile_and_load")?;
    let affine = module.function("affine").ctx("function")?;
    ensure!(
        affine.param_sizes().is_none_or(|p| p == [32, 8, 8]),
        "param sizes {:?}",
        affine.param_sizes()
    );
    let p = Affine {
        scale: 3.0,
        shift: -0.5,
        n: 1000,
        stride: 2,
        bias: [10.0, 2.5],
    };
    let x: Vec<f32> = (0..2 * p.n).map(|i| i as f32 * 0.25).collect();
    let dx = gpu.clone_htod(&x).ctx("htod")?;
    let mut dy = gpu.alloc_zeros::<f32>(p.n as usize).ctx("alloc")?;
    // SAFETY: (Affine, const float*, float*) matches the kernel; it reads x[i * 2] for
    // i < 1000 (inside 2000 elements) and writes y[i] for i < 1000.
    unsafe {
        gpu.default_stream()
            .launch(&affine, LaunchConfig::for_num_elems(p.n))
            .arg(&p)
            .arg(&dx)
            .arg(&mut dy)
            .launch()
    }
    .ctx("launch")?;
    let got = gpu.dtoh(&dy).ctx("dtoh")?;
    for i in 0..p.n as usize {
        let want = p.scale * x[i * 2] + p.shift + (p.bias[0] - p.bias[1]) as f32;
        ensure!(got[i] == want, "y[{i}] = {} != {want}", got[i]);
    }
    // A struct of the wrong size is refused where the driver reports parameter sizes.
    if affine.param_sizes().is_some() {
        let small = [0u32; 4];
        // SAFETY: refused before the driver is called (16 bytes for a 32-byte parameter).
        let r = unsafe {
            gpu.default_stream()
                .launch(&affine, LaunchConfig::for_num_elems(1))
                .arg(&small)
                .arg(&dx)
                .arg(&mut dy)
                .launch()
        };
        ensure!(
            matches!(r, Err(gpubind::Error::LaunchArgs { .. })),
            "16-byte struct for a 32-byte parameter: {r:?}"
        );
    }
    Ok(())
}

fn main() {
    run_suite(
        "gpu_interop",
        &[(
            "struct_by_value_reaches_the_kernel",
            struct_by_value_reaches_the_kernel,
        )],
    );
}
