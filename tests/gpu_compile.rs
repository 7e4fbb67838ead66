//! GPU tests of NVRTC compile options (`gpubind::options`) and of kernels that
//! hold their module (`gpubind::SharedModule`, `Kernel`): each compiled kernel is
//! run and its result checked. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_compile` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite, skip};
use gpubind::{Arch, CompileOptions, CppStandard, cuda_include_dir};
use gpubind::{
    BoundDevice, BoundStream, DeviceSlice, Error, Kernel, LaunchConfig, SharedModule, ThreadContext,
};
use std::time::{Duration, Instant};

type R = Result<(), String>;

/// Runs `f` with device 0 bound.
fn with_gpu(f: impl FnOnce(&BoundDevice<'_>) -> R) -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    f(&gpu)
}

/// Compiles `src` with `opts`, launches its `k(float* out, float in, unsigned n)` on one
/// block of `n` threads and returns `out`.
fn run_k(
    gpu: &BoundDevice<'_>,
    src: &str,
    opts: &CompileOptions,
    input: f32,
    n: u32,
) -> Result<Vec<f32>, String> {
    let module = gpu
        .compile_and_load_with(src, "k.cu", opts)
        .ctx("compile_and_load_with")?;
    let k = module.function("k").ctx("function")?;
    let mut out = gpu.alloc_zeros::<f32>(n as usize).ctx("alloc")?;
    // SAFETY: (float*, float, unsigned) matches `k`, which writes out[0..n].
    unsafe {
        gpu.default_stream()
            .launch(&k, LaunchConfig::for_num_elems(n))
            .arg(&mut out)
            .arg(&input)
            .arg(&n)
            .launch()
    }
    .ctx("launch")?;
    gpu.dtoh(&out).ctx("dtoh")
}

/// `INFINITY` and `NAN`, which NVRTC lacks, work in kernels and `__device__` initialisers.
fn infinity_and_nan_macros() -> R {
    const SRC: &str = r#"
__device__ float lowest = -INFINITY;
extern "C" __global__ void k(float* out, float in, unsigned n) {
    out[0] = INFINITY; out[1] = lowest; out[2] = NAN; out[3] = in < INFINITY ? 1.0f : 0.0f;
}"#;
    with_gpu(|gpu| {
        let out = run_k(gpu, SRC, &CompileOptions::new(), 5.0, 4)?;
        ensure!(
            out[0] == f32::INFINITY
                && out[1] == f32::NEG_INFINITY
                && out[2].is_nan()
                && out[3] == 1.0,
            "got {out:?}"
        );
        // C++03: the macros without constexpr still give the values in kernels.
        let src03 = r#"extern "C" __global__ void k(float* out, float in, unsigned n) {
            out[0] = INFINITY; out[1] = -INFINITY; out[2] = NAN; out[3] = in; }"#;
        let opts03 = CompileOptions::new().std(CppStandard::Cpp03);
        if let Err(Error::Compile { status, .. }) =
            gpu.compile_and_load_with(src03, "k.cu", &opts03)
            && status == "NVRTC_ERROR_INVALID_OPTION"
        {
            println!("    this NVRTC has no C++03: its fallback macros are not run");
            return Ok(());
        }
        let out = run_k(gpu, src03, &opts03, 5.0, 4)?;
        ensure!(
            out[0] == f32::INFINITY
                && out[1] == f32::NEG_INFINITY
                && out[2].is_nan()
                && out[3] == 5.0,
            "C++03: got {out:?}"
        );
        Ok(())
    })
}

/// `<cuda_fp16.h>` and `<cuda_bf16.h>` from the toolkit: half and bfloat16 arithmetic.
fn fp16_and_bf16_headers() -> R {
    const SRC: &str = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void mix(__half* h, const __half* a, __nv_bfloat16* b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        h[i] = __hfma(h[i], a[i], __float2half(0.25f));
        b[i] = __hmul(b[i], __float2bfloat16(2.0f));
    }
}"#;
    let Some(dir) = cuda_include_dir() else {
        return Err(skip(
            "no CUDA toolkit include directory found (set CUDA_HOME)",
        ));
    };
    println!("    toolkit headers: {}", dir.display());
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(SRC, "mix.cu").ctx("compile")?;
        let mix = module.function("mix").ctx("function")?;
        let n = 1000u32;
        let hs: Vec<half::f16> = (0..n)
            .map(|i| half::f16::from_f32(i as f32 * 0.5))
            .collect();
        let as_: Vec<half::f16> = (0..n)
            .map(|i| half::f16::from_f32(1.0 + (i % 4) as f32))
            .collect();
        let bs: Vec<half::bf16> = (0..n)
            .map(|i| half::bf16::from_f32(i as f32 - 300.0))
            .collect();
        let mut h = gpu.clone_htod(&hs).ctx("htod h")?;
        let a = gpu.clone_htod(&as_).ctx("htod a")?;
        let mut b = gpu.clone_htod(&bs).ctx("htod b")?;
        // SAFETY: (__half*, const __half*, __nv_bfloat16*, unsigned) matches `mix`, which
        // stays inside the n elements.
        unsafe {
            gpu.default_stream()
                .launch(&mix, LaunchConfig::for_num_elems(n))
                .arg(&mut h)
                .arg(&a)
                .arg(&mut b)
                .arg(&n)
                .launch()
        }
        .ctx("launch")?;
        let (h, b) = (gpu.dtoh(&h).ctx("dtoh h")?, gpu.dtoh(&b).ctx("dtoh b")?);
        for i in 0..n as usize {
            // One rounding of the exact fma in f32 (exact for these inputs) to f16.
            let want = half::f16::from_f32(hs[i].to_f32() * as_[i].to_f32() + 0.25);
            ensure!(h[i] == want, "h[{i}] = {}, want {want}", h[i]);
            let want = half::bf16::from_f32(bs[i].to_f32() * 2.0);
            ensure!(b[i] == want, "b[{i}] = {}, want {want}", b[i]);
        }
        Ok(())
    })
}

/// A macro given as an option changes what the kernel computes.
fn define_changes_the_result() -> R {
    const SRC: &str = r#"extern "C" __global__ void k(float* out, float in, unsigned n) {
        unsigned i = threadIdx.x; if (i < n) out[i] = in * FACTOR + OFFSET; }"#;
    with_gpu(|gpu| {
        for (factor, offset) in [(2, "0.5f"), (3, "-1.0f")] {
            let opts = CompileOptions::new()
                .define("FACTOR", factor)
                .define("OFFSET", offset);
            let out = run_k(gpu, SRC, &opts, 4.0, 32)?;
            let want = 4.0 * factor as f32 + offset.trim_end_matches('f').parse::<f32>().unwrap();
            ensure!(
                out.iter().all(|&v| v == want),
                "FACTOR={factor}: {out:?}, want {want}"
            );
        }
        match gpu.compile_and_load_with(SRC, "k.cu", &CompileOptions::new()) {
            Err(Error::Compile { log, .. }) if log.contains("FACTOR") => Ok(()),
            other => Err(format!("without the define: {other:?}")),
        }
    })
}

/// `--use_fast_math` takes effect: it flushes denormals to zero (`ftz`), which the
/// default build keeps; both run.
fn fast_math_flushes_denormals() -> R {
    const SRC: &str = r#"extern "C" __global__ void k(float* out, float in, unsigned n) {
        out[0] = in * 0.5f; out[1] = __expf(1.0f); }"#;
    let denormal = f32::from_bits(0x0000_1000);
    with_gpu(|gpu| {
        let (major, minor) = gpu.device().compute_capability().ctx("cc")?;
        let arch = Arch::Compute(major * 10 + minor);
        // What NVRTC made of each build: fast math asks for flush-to-zero arithmetic.
        let ptx = |opts: CompileOptions| -> Result<String, String> {
            let bytes = gpubind::compile_with(SRC, "k.cu", &opts.arch(arch), gpubind::Output::Ptx)
                .ctx("compile_with")?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        let exact_ptx = ptx(CompileOptions::new())?;
        let fast_ptx = ptx(CompileOptions::new().fast_math(true))?;
        ensure!(
            !exact_ptx.contains(".ftz"),
            "default build has ftz:\n{exact_ptx}"
        );
        ensure!(
            fast_ptx.contains(".ftz"),
            "fast-math build has no ftz:\n{fast_ptx}"
        );
        let exact = run_k(gpu, SRC, &CompileOptions::new(), denormal, 2)?;
        ensure!(exact[0] == denormal * 0.5, "default build: {exact:?}");
        let fast = run_k(
            gpu,
            SRC,
            &CompileOptions::new().fast_math(true),
            denormal,
            2,
        )?;
        // The flush shows in the PTX above; whether a denormal operand is flushed at run
        // time is the hardware's, so report it rather than require it.
        println!("    fast math: {denormal:e} * 0.5 = {:e}", fast[0]);
        ensure!(
            (fast[1] - std::f32::consts::E).abs() < 1e-3,
            "__expf(1) = {}",
            fast[1]
        );
        Ok(())
    })
}

/// The architecture override: PTX for an older virtual architecture (JIT-compiled at
/// load), a cubin for the device's own; a cubin of another major version is the
/// driver's typed error at load.
fn arch_override() -> R {
    const SRC: &str = r#"extern "C" __global__ void k(float* out, float in, unsigned n) {
        unsigned i = threadIdx.x; if (i < n) out[i] = in + i; }"#;
    with_gpu(|gpu| {
        let (major, minor) = gpu.device().compute_capability().ctx("cc")?;
        let cc = major * 10 + minor;
        for arch in [Arch::Compute(75), Arch::Sm(cc)] {
            let opts = CompileOptions::new().arch(arch).line_info(true);
            let module = gpu
                .compile_and_load_with(SRC, "k.cu", &opts)
                .ctx("compile")?;
            let attrs = module
                .function("k")
                .ctx("function")?
                .attributes()
                .ctx("attributes")?;
            let want_ptx = match arch {
                Arch::Compute(a) => a,
                Arch::Sm(_) => attrs.ptx_version, // a cubin reports its own
            };
            ensure!(
                attrs.binary_version == cc && attrs.ptx_version == want_ptx,
                "{arch}: {attrs:?} on sm_{cc}"
            );
            let out = run_k(gpu, SRC, &opts, 1.5, 8)?;
            ensure!(
                out.iter().enumerate().all(|(i, &v)| v == 1.5 + i as f32),
                "{arch}: {out:?}"
            );
        }
        let other = Arch::Sm(if major == 8 { 90 } else { 80 });
        match gpu.compile_and_load_with(SRC, "k.cu", &CompileOptions::new().arch(other)) {
            Err(Error::Driver {
                call: "cuModuleLoadData",
                ..
            }) => {}
            Err(Error::Compile { status, .. }) if status == "NVRTC_ERROR_INVALID_OPTION" => {
                println!("    this NVRTC does not know {other}");
            }
            other_result => return Err(format!("{other} on sm_{cc}: {other_result:?}")),
        }
        // Debug information builds and runs too.
        let out = run_k(gpu, SRC, &CompileOptions::new().debug(true), 2.0, 4)?;
        ensure!(out == [2.0, 3.0, 4.0, 5.0], "-G: {out:?}");
        Ok(())
    })
}

/// Bad options are typed errors at `compile_and_load_with`, never a panic.
fn bad_options_are_typed_errors() -> R {
    const SRC: &str = r#"extern "C" __global__ void k(float* out, float in, unsigned n) {}"#;
    with_gpu(|gpu| {
        let bad = [
            CompileOptions::new().define("A=B", 1),
            CompileOptions::new().define("A\nB", 1),
            CompileOptions::new().include_path("/no/such/gpubind/include"),
            CompileOptions::new().flag("--gpu-architecture=sm_90"),
        ];
        for opts in &bad {
            match gpu.compile_and_load_with(SRC, "k.cu", opts) {
                Err(Error::InvalidArgument(_)) => {}
                other => return Err(format!("{opts:?}: {other:?}")),
            }
        }
        let opts = CompileOptions::new().flag("--not-an-nvrtc-flag");
        match gpu.compile_and_load_with(SRC, "k.cu", &opts) {
            Err(Error::Compile { status, log, .. })
                if status == "NVRTC_ERROR_INVALID_OPTION"
                    && log.contains("--not-an-nvrtc-flag") =>
            {
                Ok(())
            }
            other => Err(format!("unknown flag: {other:?}")),
        }
    })
}

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
extern "C" __global__ void inc(unsigned* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}
extern "C" __global__ void slow_inc(unsigned* x, unsigned n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}
extern "C" __global__ void scale(unsigned* x, unsigned n, unsigned by) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}
__device__ unsigned total;
extern "C" __global__ void count(const unsigned* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&total, x[i]);
}
"#
);

/// About 20 ms at the H200's ~1.8 GHz: far longer than any enqueue.
const SLOW: i64 = 40_000_000;
const N: u32 = 1 << 16;

/// Enqueues `inc(x)` (or `slow_inc`) on `s`.
fn inc(s: &BoundStream<'_>, f: &Kernel, x: &DeviceSlice<u32>, slow: bool) -> R {
    let n = x.len() as u32;
    let mut l = s.launch(f, LaunchConfig::for_num_elems(n));
    l.arg_written(x).arg(&n);
    if slow {
        l.arg(&SLOW);
    }
    // SAFETY: (unsigned*, unsigned[, long long]) matches `inc`/`slow_inc`, which touch
    // the `n` elements of `x`.
    unsafe { l.launch() }.ctx("launch inc")
}

fn all_eq(got: &[u32], want: u32, what: &str) -> R {
    match got.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: x[{i}] = {}, want {want}", got[i])),
    }
}

/// A struct that holds kernels (and no module) across calls.
struct Pipeline {
    inc: Kernel,
    scale: Kernel,
}

impl Pipeline {
    fn new(gpu: &BoundDevice<'_>) -> Result<Self, String> {
        let shared = gpu
            .compile_and_load(KERNELS, "pipeline.cu")
            .ctx("compile")?
            .into_shared();
        Ok(Pipeline {
            inc: shared.kernel("inc").ctx("kernel inc")?,
            scale: shared.kernel("scale").ctx("kernel scale")?,
        })
    }

    /// x = (x + 1) * by.
    fn step(&self, gpu: &BoundDevice<'_>, x: &mut DeviceSlice<u32>, by: u32) -> R {
        let s = gpu.default_stream();
        inc(&s, &self.inc, x, false)?;
        let n = x.len() as u32;
        // SAFETY: (unsigned*, unsigned, unsigned) matches `scale`, in bounds.
        unsafe {
            s.launch(&self.scale, LaunchConfig::for_num_elems(n))
                .arg(x)
                .arg(&n)
                .arg(&by)
                .launch()
        }
        .ctx("launch scale")
    }
}

/// Kernels kept in a struct across calls, and used for occupancy and attributes.
fn struct_holds_kernels_across_calls() -> R {
    with_gpu(|gpu| {
        let p = Pipeline::new(gpu)?;
        let mut x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let mut want = 0u32;
        for by in [2, 3, 1, 5] {
            p.step(gpu, &mut x, by)?;
            want = (want + 1) * by;
        }
        all_eq(&gpu.dtoh(&x).ctx("dtoh")?, want, "after four steps")?;
        let best = p.inc.max_potential_block_size(0).ctx("occupancy")?;
        ensure!(best.block_size > 0, "{best:?}");
        let per_sm = p
            .scale
            .max_active_blocks_per_sm(best.block_size, 0)
            .ctx("blocks/sm")?;
        ensure!(per_sm > 0, "{per_sm}");
        let attrs = p.scale.attributes().ctx("attributes")?;
        ensure!(attrs.max_threads_per_block > 0, "{attrs:?}");
        ensure!(
            p.inc.shared_module().is_some(),
            "a Kernel names its shared module"
        );
        Ok(())
    })
}

/// The module handle is dropped first; its kernels still launch (on another thread
/// too), and the module goes when the last kernel does.
fn kernels_outlive_the_module_handle() -> R {
    let dev = dev0()?;
    let (quick, clone) = {
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let shared: SharedModule = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?.into();
        let quick = shared.kernel("inc").ctx("kernel")?;
        drop(shared);
        (quick.clone(), quick)
    };
    let worker = std::thread::spawn(move || -> R {
        let dev = dev0()?;
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        for _ in 0..3 {
            inc(&gpu.default_stream(), &clone, &x, false)?;
        }
        drop(clone);
        all_eq(&gpu.dtoh(&x).ctx("dtoh")?, 3, "the other thread's launches")
    });
    worker
        .join()
        .map_err(|_| "the worker panicked".to_owned())??;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    inc(&gpu.default_stream(), &quick, &x, false)?;
    drop(quick);
    all_eq(
        &gpu.dtoh(&x).ctx("dtoh")?,
        1,
        "the launch before the last kernel dropped",
    )
}

/// Dropping the shared module and its kernels while a slow kernel runs: the unload
/// waits for it, and its result lands.
fn kernel_unload_waits_for_its_launch() -> R {
    with_gpu(|gpu| {
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let shared = gpu
            .compile_and_load(KERNELS, "k.cu")
            .ctx("compile")?
            .into_shared();
        let (quick, slow) = (
            shared.kernel("inc").ctx("k")?,
            shared.kernel("slow_inc").ctx("k")?,
        );
        inc(&s, &quick, &x, false)?; // records (and publishes) the stream
        s.synchronize().ctx("sync")?;
        inc(&s, &slow, &x, true)?; // fast path
        drop(shared);
        let t = Instant::now();
        drop((quick, slow));
        let unload = t.elapsed();
        ensure!(
            unload >= Duration::from_millis(5),
            "the module was unloaded after {unload:?}, while its ~20 ms kernel still ran"
        );
        s.synchronize().ctx("sync after unload")?;
        all_eq(&gpu.dtoh(&x).ctx("dtoh")?, 2, "the kernel's increment")
    })
}

/// One shared module launched on two streams, dropped while stream B's slow kernels
/// still run after stream A's finished: the unload waits for both streams.
fn kernel_on_two_streams_unload_waits_for_both() -> R {
    with_gpu(|gpu| {
        let (sa, sb) = (
            gpu.new_stream().ctx("stream")?,
            gpu.new_stream().ctx("stream")?,
        );
        let (a, b) = (gpu.on(&sa).ctx("on a")?, gpu.on(&sb).ctx("on b")?);
        let xa = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let xb = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let shared = gpu
            .compile_and_load(KERNELS, "k.cu")
            .ctx("compile")?
            .into_shared();
        let (quick, slow) = (
            shared.kernel("inc").ctx("k")?,
            shared.kernel("slow_inc").ctx("k")?,
        );
        drop(shared);
        inc(&a, &quick, &xa, false)?;
        inc(&b, &quick, &xb, false)?;
        gpu.synchronize().ctx("sync")?;
        inc(&b, &slow, &xb, true)?;
        inc(&b, &slow, &xb, true)?;
        inc(&a, &quick, &xa, false)?;
        a.synchronize().ctx("sync A")?;
        let t = Instant::now();
        drop((quick, slow));
        let unload = t.elapsed();
        ensure!(
            unload >= Duration::from_millis(25),
            "the module was unloaded after {unload:?}, while stream B's ~40 ms of kernels ran"
        );
        all_eq(&gpu.dtoh(&xa).ctx("dtoh a")?, 2, "stream A's increments")?;
        all_eq(&gpu.dtoh(&xb).ctx("dtoh b")?, 3, "stream B's increments")
    })
}

/// A graph captures a kernel's launch and keeps its module: the kernel and the module
/// handle are dropped, and the graph still replays the launch.
fn graph_keeps_a_kernels_module() -> R {
    with_gpu(|gpu| {
        let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let n = N;
        let shared = gpu
            .compile_and_load(KERNELS, "k.cu")
            .ctx("compile")?
            .into_shared();
        let k = shared.kernel("inc").ctx("kernel")?;
        let graph = gpu
            .capture(|c| {
                let mut l = c.launch(&k, LaunchConfig::for_num_elems(n));
                l.arg_written(&x).arg(&n);
                // SAFETY: (unsigned*, unsigned) matches `inc`, in bounds.
                unsafe { l.launch() }
            })
            .ctx("capture")?;
        drop(k);
        drop(shared);
        let exec = graph.instantiate().ctx("instantiate")?;
        for _ in 0..3 {
            exec.launch(&gpu.default_stream()).ctx("graph launch")?;
        }
        drop((exec, graph));
        all_eq(&gpu.dtoh(&x).ctx("dtoh")?, 3, "three graph launches")
    })
}

/// Globals looked up before sharing: a kernel's launch writes a `__device__` variable
/// and a read of the view waits for it (the launches are ordered as writes).
fn globals_then_shared_kernels() -> R {
    with_gpu(|gpu| {
        let mut module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
        let mut total = module.global::<u32>("total").ctx("global")?;
        let shared = module.into_shared();
        let (slow, count) = (
            shared.kernel("slow_fill").ctx("k")?,
            shared.kernel("count").ctx("k")?,
        );
        drop(shared);
        gpu.copy(&[0u32][..], &mut total).ctx("zero total")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let mut x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
        let (n, value) = (N, 3u32);
        // SAFETY: (unsigned*, unsigned, unsigned, long long) matches `slow_fill`, and
        // (const unsigned*, unsigned) `count`; both stay in bounds.
        unsafe {
            s.launch(&slow, LaunchConfig::for_num_elems(n))
                .arg(&mut x)
                .arg(&n)
                .arg(&value)
                .arg(&SLOW)
                .launch()
                .ctx("slow_fill")?;
            s.launch(&count, LaunchConfig::for_num_elems(n))
                .arg(&x)
                .arg(&n)
                .launch()
                .ctx("count")?;
        }
        drop((slow, count));
        let got = gpu.dtoh(&total).ctx("dtoh total")?;
        ensure!(got == [3 * N], "total = {got:?}, want {}", 3 * N);
        Ok(())
    })
}

fn main() {
    run_suite(
        "gpu_compile",
        &[
            ("infinity_and_nan_macros", infinity_and_nan_macros),
            ("fp16_and_bf16_headers", fp16_and_bf16_headers),
            ("define_changes_the_result", define_changes_the_result),
            ("fast_math_flushes_denormals", fast_math_flushes_denormals),
            ("arch_override", arch_override),
            ("bad_options_are_typed_errors", bad_options_are_typed_errors),
            (
                "struct_holds_kernels_across_calls",
                struct_holds_kernels_across_calls,
            ),
            (
                "kernels_outlive_the_module_handle",
                kernels_outlive_the_module_handle,
            ),
            (
                "kernel_unload_waits_for_its_launch",
                kernel_unload_waits_for_its_launch,
            ),
            (
                "kernel_on_two_streams_unload_waits_for_both",
                kernel_on_two_streams_unload_waits_for_both,
            ),
            ("graph_keeps_a_kernels_module", graph_keeps_a_kernels_module),
            ("globals_then_shared_kernels", globals_then_shared_kernels),
        ],
    );
}
