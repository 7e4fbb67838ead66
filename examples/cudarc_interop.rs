//! cudarc's safe API on gpubind buffers, and back (`gpubind::interop`).
//!
//! 1. gpubind allocates A and B, and a gpubind kernel scales A on a gpubind stream.
//! 2. The buffers are *lent* to cudarc on a stream cudarc owns; cudarc's `CudaBlas` runs
//!    an sgemm C = A·B on them (ordered after the kernel by gpubind's tracker).
//! 3. gpubind reads C back (ordered after the sgemm) and checks it against a CPU matmul.
//! 4. cudarc computes A·B again into a `CudaSlice` *it* allocated; gpubind adopts that
//!    slice, scales it with its kernel and checks it too.
//!
//! `cargo run --example cudarc_interop`. Without a GPU (or without cuBLAS) it prints one
//! `SKIPPED` line and exits 0; a wrong result or any error exits 1.

use gpubind::cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use gpubind::cudarc::driver::CudaSlice;
use gpubind::{Device, Error, LaunchConfig, ThreadContext};

const SCALE: &str = r#"
extern "C" __global__ void scale(float* x, float s, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}"#;

fn main() {
    if let Some(why) = skip_reason() {
        println!("SKIPPED cudarc_interop: {why}");
        return;
    }
    match run() {
        Ok(()) => println!("cudarc_interop: ok"),
        Err(e) => {
            eprintln!("cudarc_interop: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// Why this example cannot run here, if it cannot (a broken driver is not a reason).
fn skip_reason() -> Option<String> {
    if !gpubind::driver_available() {
        return Some("no CUDA driver found (libcuda not loadable)".into());
    }
    match Device::count() {
        Ok(0) => return Some("the CUDA driver reports no device".into()),
        Err(Error::NoDriver) => return Some("no CUDA driver found".into()),
        Err(Error::Driver {
            code: gpubind::DriverErrorCode::NO_DEVICE,
            ..
        }) => return Some("cuInit: no CUDA-capable device".into()),
        _ => {}
    }
    // SAFETY: only tries dlopen on cudarc's candidate names for libcublas.
    if !unsafe { gpubind::cudarc::cublas::sys::is_culib_present() } {
        return Some("libcublas not found (cudarc's CudaBlas needs it)".into());
    }
    None
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Row-major C (m×n) = A (m×k) · B (k×n) on the CPU, in f64.
fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            c[i * n + j] = s as f32;
        }
    }
    c
}

/// cuBLAS is column-major: row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, so the call
/// passes B first, with the dimensions swapped.
fn row_major_gemm(m: usize, k: usize, n: usize) -> GemmConfig<f32> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: 1.0,
        lda: n as i32,
        ldb: k as i32,
        beta: 0.0,
        ldc: n as i32,
    }
}

fn check(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (g - w).abs() > 1e-4 * w.abs().max(1.0) {
            return Err(format!("{what}[{i}] = {g}, CPU reference {w}"));
        }
    }
    println!("{what}: {} elements match the CPU reference", got.len());
    Ok(())
}

fn run() -> Result<(), String> {
    let (m, k, n) = (96usize, 64usize, 80usize);
    let a_host = values(m * k, 1);
    let b_host = values(k * n, 2);
    let g = |e: Error| e.to_string();

    let mut ctx = ThreadContext::acquire().map_err(g)?;
    let dev = Device::get(0).map_err(g)?;
    let gpu = ctx.bind(&dev).map_err(g)?;
    let module = gpu.compile_and_load(SCALE, "scale.cu").map_err(g)?;
    let scale = module.function("scale").map_err(g)?;

    // 1. gpubind: A doubled by a kernel on a gpubind stream (still running, perhaps,
    //    when cudarc is handed A: the lend waits for it on the device).
    let mut a = gpubind_scaled(&gpu, &scale, &a_host, 2.0)?;
    let mut b = gpu.clone_htod(&b_host).map_err(g)?;
    let mut c = gpu.alloc_zeros::<f32>(m * n).map_err(g)?;

    // 2. cudarc: sgemm on the lent buffers, on a stream cudarc owns.
    let shared = gpu.new_cudarc_stream().map_err(g)?;
    let cstream = shared
        .cudarc_stream()
        .ok_or("new_cudarc_stream gave a stream cudarc does not own")?
        .clone();
    let blas = CudaBlas::new(cstream.clone()).map_err(|e| format!("CudaBlas::new: {e:?}"))?;
    let s = gpu.on(&shared).map_err(g)?;
    let cfg = row_major_gemm(m, k, n);
    s.lend_to_cudarc(&mut a, |a| {
        s.lend_to_cudarc(&mut b, |b| {
            s.lend_mut_to_cudarc(&mut c, |mut c| {
                // SAFETY: B is k×n (lda n), A is m×k (ldb k), C is m×n (ldc n), row-major,
                // each buffer exactly that long.
                unsafe { blas.gemm(cfg, &b, &a, &mut c) }
            })
        })
    })
    .and_then(|r| r)
    .and_then(|r| r)
    .map_err(g)?
    .map_err(|e| format!("sgemm: {e:?}"))?;

    // 3. Back in gpubind: the read waits for the sgemm (the lend was recorded as a write
    //    of C on the cudarc stream).
    let a2: Vec<f32> = a_host.iter().map(|x| x * 2.0).collect();
    let want = matmul(&a2, &b_host, m, k, n);
    check(
        "C = (2A)·B, cudarc sgemm on gpubind buffers",
        &gpu.dtoh(&c).map_err(g)?,
        &want,
    )?;

    // 4. A cudarc-owned result, adopted by gpubind.
    let mut d: CudaSlice<f32> = cstream
        .alloc_zeros(m * n)
        .map_err(|e| format!("cudarc alloc_zeros: {e:?}"))?;
    s.lend_to_cudarc(&mut a, |a| {
        s.lend_to_cudarc(&mut b, |b| {
            // SAFETY: as above; D is m×n.
            unsafe { blas.gemm(cfg, &b, &a, &mut d) }
        })
    })
    .and_then(|r| r)
    .map_err(g)?
    .map_err(|e| format!("sgemm into a cudarc slice: {e:?}"))?;
    let mut d = gpu.adopt_cudarc_slice(d).map_err(|e| g(e.error))?;
    // Halve it with gpubind's kernel on a gpubind stream: ordered after cudarc's sgemm.
    let work = gpu.new_stream().map_err(g)?;
    launch_scale(&gpu.on(&work).map_err(g)?, &scale, &mut d, 0.5)?;
    let half: Vec<f32> = want.iter().map(|x| x * 0.5).collect();
    check(
        "D/2, cudarc sgemm into a cudarc slice adopted by gpubind",
        &gpu.dtoh(&d).map_err(g)?,
        &half,
    )?;
    Ok(())
}

/// `host` uploaded and multiplied by `factor` on a new gpubind stream.
fn gpubind_scaled(
    gpu: &gpubind::BoundDevice<'_>,
    scale: &gpubind::Function<'_>,
    host: &[f32],
    factor: f32,
) -> Result<gpubind::DeviceSlice<f32>, String> {
    let mut x = gpu.clone_htod(host).map_err(|e| e.to_string())?;
    let stream = gpu.new_stream().map_err(|e| e.to_string())?;
    launch_scale(
        &gpu.on(&stream).map_err(|e| e.to_string())?,
        scale,
        &mut x,
        factor,
    )?;
    Ok(x)
}

fn launch_scale(
    s: &gpubind::BoundStream<'_>,
    scale: &gpubind::Function<'_>,
    x: &mut gpubind::DeviceSlice<f32>,
    factor: f32,
) -> Result<(), String> {
    let n = x.len() as u32;
    // SAFETY: (float*, float, unsigned) matches `scale`, which checks i < n.
    unsafe {
        s.launch(scale, LaunchConfig::for_num_elems(n))
            .arg(x)
            .arg(&factor)
            .arg(&n)
            .launch()
    }
    .map_err(|e| format!("scale kernel: {e}"))
}
