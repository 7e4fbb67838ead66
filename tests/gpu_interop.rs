//! GPU tests of by-value struct arguments, the cudarc interop (`gpubind::interop`) and
//! NVRTC's target choice. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_interop` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, default_pool_used, dev0, run_suite};
use gpubind::cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream, sys};
use gpubind::{BoundDevice, BoundStream, DeviceRepr, Error, LaunchConfig, ThreadContext};
use std::sync::Arc;

type R = Result<(), String>;

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

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
extern "C" __global__ void copy(const unsigned* in, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
"#
);

/// ~20 ms at ~2 GHz: long enough that unordered work would overtake it.
const SLOW: i64 = 40_000_000;

fn slow_fill(
    s: &BoundStream<'_>,
    f: &gpubind::Function<'_>,
    buf: &mut gpubind::DeviceSlice<u32>,
    value: u32,
) -> R {
    let n = buf.len() as u32;
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; the kernel checks i < n.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(buf)
            .arg(&n)
            .arg(&value)
            .arg(&SLOW)
            .launch()
    }
    .ctx("launch slow_fill")
}

fn copy(
    s: &BoundStream<'_>,
    f: &gpubind::Function<'_>,
    src: &gpubind::DeviceSlice<u32>,
    dst: &mut gpubind::DeviceSlice<u32>,
) -> R {
    let n = src.len() as u32;
    // SAFETY: (const unsigned*, unsigned*, unsigned) matches; both hold n elements.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(src)
            .arg(dst)
            .arg(&n)
            .launch()
    }
    .ctx("launch copy")
}

fn all_equal(what: &str, got: &[u32], want: u32) -> R {
    if let Some(i) = got.iter().position(|&x| x != want) {
        return Err(format!(
            "{what}: element {i} is {:#x}, want {want:#x}",
            got[i]
        ));
    }
    Ok(())
}

fn primary_handle(gpu: &BoundDevice<'_>) -> sys::CUcontext {
    // SAFETY: only compared.
    unsafe { gpu.raw_context() }
}

/// The cudarc context is the primary one; other contexts and non-streams are refused.
fn cudarc_context_is_the_primary_context() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let c = gpu.cudarc_context().ctx("cudarc_context")?;
    ensure!(c.is_primary(), "not primary");
    ensure!(c.cu_ctx() == primary_handle(&gpu), "another context");
    let again = gpu.cudarc_context().ctx("cudarc_context again")?;
    ensure!(
        Arc::ptr_eq(&c, &again),
        "a second cudarc object while one lives"
    );
    ensure!(
        gpubind::interop::device_of(&c).ctx("device_of")?.ordinal() == 0,
        "device_of"
    );
    // Refusals.
    let foreign = CudaContext::new_non_primary(0, 0).map_err(|e| format!("{e:?}"))?;
    let r = gpubind::interop::device_of(&foreign);
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "device_of(non-primary): {r:?}"
    );
    let fs = foreign.new_stream().map_err(|e| format!("{e:?}"))?;
    let r = gpu.stream_from_cudarc(fs);
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "non-primary stream: {r:?}"
    );
    drop(foreign);
    let r = gpu.stream_from_cudarc(c.default_stream());
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "null stream: {r:?}"
    );
    let r = gpu.stream_from_cudarc(c.per_thread_stream());
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "per-thread stream: {r:?}"
    );
    // Lending needs a stream cudarc owns.
    let mut buf = gpu.alloc_zeros::<u32>(4).ctx("alloc")?;
    let own = gpu.new_stream().ctx("new_stream")?;
    ensure!(
        own.cudarc_stream().is_none(),
        "gpubind's stream given to cudarc"
    );
    let r = gpu.on(&own).ctx("on")?.lend_to_cudarc(&mut buf, |_| ());
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "lend on own stream: {r:?}"
    );
    let r = gpu.default_stream().lend_mut_to_cudarc(&mut buf, |_| ());
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "lend on legacy: {r:?}"
    );
    Ok(())
}

/// A lent buffer: cudarc's work (on the lend stream and on another cudarc stream) comes
/// after gpubind's pending write, and gpubind's later uses come after cudarc's.
fn lend_is_ordered_both_ways() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let (fill, copy_k) = (
        module.function("slow_fill").ctx("slow_fill")?,
        module.function("copy").ctx("copy")?,
    );
    let n = 1 << 16;
    let mut buf = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
    let mut dummy = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    let other = cs.context().new_stream().map_err(|e| format!("{e:?}"))?;
    let sh = gpu.on(&shared).ctx("on shared")?;

    // Before: a slow gpubind write on s1, then cudarc reads on two streams.
    slow_fill(&gpu.on(&s1).ctx("on")?, &fill, &mut buf, 5)?;
    let (here, there): (CudaSlice<u32>, CudaSlice<u32>) = sh
        .lend_to_cudarc(&mut buf, |v| {
            let a = cs.clone_dtod(&v).map_err(|e| format!("{e:?}"))?;
            let b = other.clone_dtod(&v).map_err(|e| format!("{e:?}"))?;
            Ok::<_, String>((a, b))
        })
        .ctx("lend")??;
    let here = cs.clone_dtoh(&here).map_err(|e| format!("{e:?}"))?;
    let there = other.clone_dtoh(&there).map_err(|e| format!("{e:?}"))?;
    all_equal("cudarc read on the lend stream", &here, 5)?;
    all_equal("cudarc read on another cudarc stream", &there, 5)?;

    // After: cudarc writes behind slow work, on the lend stream and on another stream;
    // gpubind then reads on its own stream.
    for (name, on_other) in [("lend stream", false), ("another cudarc stream", true)] {
        let value = if on_other { 9 } else { 7 };
        slow_fill(&gpu.on(&s1).ctx("on")?, &fill, &mut buf, value)?;
        gpu.on(&s1).ctx("on")?.synchronize().ctx("sync")?;
        // Delay the cudarc stream used below with a slow kernel of gpubind's.
        if on_other {
            let os = gpu.stream_from_cudarc(other.clone()).ctx("share other")?;
            slow_fill(&gpu.on(&os).ctx("on other")?, &fill, &mut dummy, 1)?;
        } else {
            slow_fill(&sh, &fill, &mut dummy, 1)?;
        }
        sh.lend_mut_to_cudarc(&mut buf, |mut v| {
            let s = if on_other { &other } else { &cs };
            s.memset_zeros(&mut v).map_err(|e| format!("{e:?}"))
        })
        .ctx("lend_mut")??;
        let mut out = gpu.alloc_zeros::<u32>(n).ctx("alloc out")?;
        gpu.memset_zeros(&mut out).ctx("memset")?;
        copy(&gpu.on(&s2).ctx("on")?, &copy_k, &buf, &mut out)?;
        all_equal(
            &format!("gpubind read after a cudarc write on the {name}"),
            &gpu.dtoh(&out).ctx("dtoh")?,
            0,
        )?;
    }
    // A panic in the closure still leaves the buffer gpubind's, ordered, and unfreed.
    slow_fill(&gpu.on(&s1).ctx("on")?, &fill, &mut buf, 3)?;
    gpu.on(&s1).ctx("on")?.synchronize().ctx("sync")?;
    slow_fill(&sh, &fill, &mut dummy, 1)?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = sh.lend_mut_to_cudarc(&mut buf, |mut v| {
            let _ = cs.memset_zeros(&mut v);
            panic!("inside a lend");
        });
    }));
    ensure!(r.is_err(), "the panic was lost");
    all_equal("after a panicking lend", &gpu.dtoh(&buf).ctx("dtoh")?, 0)?;
    Ok(())
}

/// A read lend from `&buf` (`lend_ref_to_cudarc`): cudarc's reads come after a pending
/// gpubind write, and a gpubind write after the lend comes after cudarc's reads, also on
/// a delayed cudarc stream other than the lend stream.
fn lend_ref_is_a_read_claim() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let fill = module.function("slow_fill").ctx("slow_fill")?;
    let n = 1 << 16;
    let mut buf = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
    let mut dummy = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    let other = cs.context().new_stream().map_err(|e| format!("{e:?}"))?;
    let sh = gpu.on(&shared).ctx("on shared")?;

    slow_fill(&gpu.on(&s1).ctx("on")?, &fill, &mut buf, 5)?;
    let buf_ref = &buf;
    let copy = sh
        .lend_ref_to_cudarc(buf_ref, |v| cs.clone_dtod(&v).map_err(|e| format!("{e:?}")))
        .ctx("lend_ref")??;
    all_equal(
        "cudarc read after a gpubind write",
        &cs.clone_dtoh(&copy).map_err(|e| format!("{e:?}"))?,
        5,
    )?;

    // cudarc reads on `other`, held back by a slow kernel; then gpubind overwrites.
    let os = gpu.stream_from_cudarc(other.clone()).ctx("share other")?;
    slow_fill(&gpu.on(&os).ctx("on other")?, &fill, &mut dummy, 1)?;
    let late = sh
        .lend_ref_to_cudarc(&buf, |v| other.clone_dtod(&v).map_err(|e| format!("{e:?}")))
        .ctx("lend_ref")??;
    gpu.on(&s2)
        .ctx("on s2")?
        .memset_zeros_async(&mut buf)
        .ctx("memset")?;
    all_equal(
        "cudarc read on a delayed stream, before gpubind's later write",
        &other.clone_dtoh(&late).map_err(|e| format!("{e:?}"))?,
        5,
    )?;
    all_equal("gpubind's write", &gpu.dtoh(&buf).ctx("dtoh")?, 0)?;
    // A gpubind stream is refused.
    match gpu.on(&s1).ctx("on")?.lend_ref_to_cudarc(&buf, |_| ()) {
        Err(Error::InvalidArgument(_)) => Ok(()),
        other => Err(format!("a gpubind stream: {other:?}")),
    }
}

/// Inside a `lend_ref_to_cudarc` closure the lent buffer stays usable for reads through
/// gpubind — a copy from it on the lend stream and on another stream, a host read — and
/// a gpubind write of it is a typed error, not a hang (the suite's timeout would report
/// one); after the lend, writes work again and everything holds the right values.
fn lend_ref_allows_reads_of_the_lent_buffer_inside_the_closure() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let fill = module.function("slow_fill").ctx("slow_fill")?;
    let n = 1 << 16;
    let s2 = gpu.new_stream().ctx("stream")?;
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    let sh = gpu.on(&shared).ctx("on shared")?;
    let b2 = gpu.on(&s2).ctx("on s2")?;
    let mut buf = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
    // A pending slow write on s2: the lend and every read below come after it.
    slow_fill(&b2, &fill, &mut buf, 5)?;
    let (mut on_lend, mut on_s2) = (
        gpu.alloc_zeros::<u32>(n).ctx("alloc")?,
        gpu.alloc_zeros::<u32>(n).ctx("alloc")?,
    );
    let buf = buf; // shared from here on, as a reader holds it
    let t = std::time::Instant::now();
    let (copy, host, refused) = sh
        .lend_ref_to_cudarc(&buf, |view| -> Result<_, String> {
            sh.copy_tracked_async(&buf, &mut on_lend)
                .ctx("copy on the lend stream")?;
            b2.copy_tracked_async(&buf, &mut on_s2)
                .ctx("copy on another stream")?;
            let host = gpu.dtoh(&buf).ctx("host read")?;
            let nn = n as u32;
            // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; in bounds.
            let refused = unsafe {
                b2.launch(&fill, LaunchConfig::for_num_elems(nn))
                    .arg_written(&buf)
                    .arg(&nn)
                    .arg(&9u32)
                    .arg(&0i64)
                    .launch()
            };
            let copy = cs.clone_dtod(&view).map_err(|e| format!("{e:?}"))?;
            Ok((copy, host, refused))
        })
        .ctx("lend_ref")??;
    println!(
        "    lend with three reads and a refused write inside returned in {:?}; the write: \
         {refused:?}",
        t.elapsed()
    );
    match refused {
        Err(Error::InvalidArgument(m)) if m.contains("lent to cudarc") => {}
        other => {
            return Err(format!(
                "a write of the lent buffer inside the lend: {other:?}"
            ));
        }
    }
    all_equal("host read inside the lend", &host, 5)?;
    all_equal(
        "cudarc's copy",
        &cs.clone_dtoh(&copy).map_err(|e| format!("{e:?}"))?,
        5,
    )?;
    all_equal(
        "copy on the lend stream",
        &gpu.dtoh(&on_lend).ctx("dtoh")?,
        5,
    )?;
    all_equal("copy on another stream", &gpu.dtoh(&on_s2).ctx("dtoh")?, 5)?;
    // The lend is over: writes are let in again, after cudarc's reads.
    let mut buf = buf;
    b2.memset_async(&mut buf, 7).ctx("memset after the lend")?;
    all_equal("write after the lend", &gpu.dtoh(&buf).ctx("dtoh")?, 7)
}

/// A cudarc slice adopted by gpubind: cudarc's queued work comes first; gpubind frees it.
fn adopted_slice_is_ordered_and_owned() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let (fill, copy_k) = (
        module.function("slow_fill").ctx("slow_fill")?,
        module.function("copy").ctx("copy")?,
    );
    let n = 1 << 16;
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    let mut dummy = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let (free_before, _) = gpu.memory_info().ctx("memory_info")?;
    for round in 0..3u32 {
        let mut c: CudaSlice<u32> = cs.alloc_zeros(n).map_err(|e| format!("{e:?}"))?;
        // Slow work ahead of cudarc's write on its stream.
        slow_fill(&gpu.on(&shared).ctx("on")?, &fill, &mut dummy, 1)?;
        let pattern: Vec<u32> = (0..n as u32).map(|i| i ^ round).collect();
        cs.memcpy_htod(&pattern, &mut c)
            .map_err(|e| format!("{e:?}"))?;
        let adopted = gpu.adopt_cudarc_slice(c).ctx("adopt")?;
        ensure!(adopted.len() == n, "len {}", adopted.len());
        let s2 = gpu.new_stream().ctx("stream")?;
        let mut out = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        copy(&gpu.on(&s2).ctx("on")?, &copy_k, &adopted, &mut out)?;
        let got = gpu.dtoh(&out).ctx("dtoh")?;
        ensure!(
            got == pattern,
            "round {round}: gpubind read before cudarc's write landed"
        );
        drop(adopted); // gpubind frees cudarc's allocation
    }
    gpu.synchronize().ctx("synchronize")?;
    let (free_after, _) = gpu.memory_info().ctx("memory_info")?;
    // Pool memory may stay reserved; freed allocations must not pile up (3 × 256 KiB).
    ensure!(
        free_after + (8 << 20) >= free_before,
        "free memory {free_before} -> {free_after}"
    );
    Ok(())
}

/// A cudarc slice of a non-primary context is refused and comes back untouched: cudarc
/// still owns it, reads it and frees it.
fn adopting_a_non_primary_slice_gives_it_back() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let foreign = CudaContext::new_non_primary(0, 0).map_err(|e| format!("{e:?}"))?;
    let fs = foreign.new_stream().map_err(|e| format!("{e:?}"))?;
    let pattern: Vec<u32> = (0..4096).map(|i| i * 3 + 1).collect();
    let slice = fs.clone_htod(&pattern).map_err(|e| format!("{e:?}"))?;
    let failed = match gpu.adopt_cudarc_slice(slice) {
        Err(failed) => failed,
        Ok(_) => return Err("a non-primary context's slice was adopted".into()),
    };
    ensure!(
        matches!(failed.error, Error::InvalidArgument(_)),
        "error {:?}",
        failed.error
    );
    let back = failed.input;
    let got = fs.clone_dtoh(&back).map_err(|e| format!("{e:?}"))?;
    ensure!(got == pattern, "the slice given back lost its contents");
    drop(back); // cudarc frees it
    fs.synchronize().map_err(|e| format!("{e:?}"))?;
    drop(fs);
    drop(foreign);
    // gpubind's binding is unaffected by cudarc's context switches.
    let b = gpu.clone_htod(&pattern).ctx("clone_htod")?;
    ensure!(gpu.dtoh(&b).ctx("dtoh")? == pattern, "gpubind after cudarc");
    println!("non-primary cudarc slice: refused, given back, read by cudarc");
    Ok(())
}

/// A cudarc slice of another device is refused with `WrongDevice` and comes back
/// untouched, still cudarc's. Needs 2 GPUs.
fn adopting_another_devices_slice_gives_it_back() -> R {
    let n = gpubind::Device::count().ctx("count")?;
    if n < 2 {
        return Err(common::skip(&format!("needs 2 GPUs, {n} visible")));
    }
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let other = CudaContext::new(1).map_err(|e| format!("{e:?}"))?;
    let os = other.new_stream().map_err(|e| format!("{e:?}"))?;
    let pattern: Vec<u32> = (0..4096).map(|i| i ^ 0x5a5a).collect();
    let slice = os.clone_htod(&pattern).map_err(|e| format!("{e:?}"))?;
    let failed = match gpu.adopt_cudarc_slice(slice) {
        Err(failed) => failed,
        Ok(_) => return Err("another device's slice was adopted".into()),
    };
    ensure!(
        matches!(
            failed.error,
            Error::WrongDevice {
                bound: 0,
                found: 1,
                ..
            }
        ),
        "error {:?}",
        failed.error
    );
    let back = failed.input;
    let got = os.clone_dtoh(&back).map_err(|e| format!("{e:?}"))?;
    ensure!(got == pattern, "the slice given back lost its contents");
    println!("device 1's cudarc slice: WrongDevice, given back, read by cudarc");
    Ok(())
}

/// A stream cudarc owns outlives whichever side lets go first; dropping gpubind's handle
/// leaves the thread's current context alone.
fn shared_stream_lifetimes() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let current = || {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle.
        unsafe { sys::cuCtxGetCurrent(&mut cur) };
        cur
    };
    // cudarc lets go first: gpubind keeps the stream usable, and the last holder (the
    // buffer's record of its use) destroys it through cudarc, leaving no context current.
    let shared = {
        let c = gpu.cudarc_context().ctx("cudarc_context")?;
        let s = c.new_stream().map_err(|e| format!("{e:?}"))?;
        gpu.stream_from_cudarc(s).ctx("stream_from_cudarc")?
    };
    let s = gpu.on(&shared).ctx("on")?;
    s.memset_zeros_async(&mut buf).ctx("memset on shared")?;
    s.synchronize().ctx("sync shared")?;
    s.memset_zeros_async(&mut buf).ctx("memset on shared")?;
    drop(shared);
    // SAFETY: unbinds this thread; the next gpubind operation binds again.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    drop(buf); // waits, frees, then lets go of the last Arc<CudaStream>
    ensure!(
        current().is_null(),
        "dropping cudarc's stream left a context current"
    );
    // gpubind lets go first: cudarc's Arc still works.
    let gpu = ctx.bind(&dev).ctx("bind again")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    gpu.on(&shared)
        .ctx("on")?
        .memset_zeros_async(&mut buf)
        .ctx("memset")?;
    drop(shared);
    drop(buf);
    cs.synchronize()
        .map_err(|e| format!("cudarc stream after gpubind let go: {e:?}"))?;
    Ok(())
}

/// Item 2 of issue 11: NVRTC (and cuBLAS) match the driver, and the PTX fallback for a
/// GPU the NVRTC does not know runs (the driver JIT-compiles PTX of an older arch).
fn libraries_match_the_driver_and_ptx_fallback_runs() -> R {
    let nvrtc = gpubind::nvrtc_info().ctx("nvrtc_info")?;
    println!("    NVRTC {nvrtc:?}");
    let overridden = |var: &str| std::env::var(var).is_ok_and(|v| !v.is_empty());
    if let Some(d) = nvrtc.driver_major
        && !overridden("GPUBIND_NVRTC_PATH")
    {
        ensure!(
            nvrtc.version.0 <= d,
            "NVRTC {:?} newer than driver {d}",
            nvrtc.version
        );
    }
    ensure!(
        nvrtc.driver_major.is_some(),
        "no driver version read on a GPU machine"
    );
    #[cfg(feature = "cublas")]
    match gpubind::cublas_info() {
        Ok(c) => {
            println!("    cuBLAS {c:?}");
            if !overridden("GPUBIND_CUBLAS_PATH") {
                ensure!(
                    c.version.0 <= nvrtc.driver_major.unwrap_or(u32::MAX),
                    "cuBLAS {c:?} newer than the driver"
                );
            }
        }
        Err(e) => println!("    cuBLAS: {e}"),
    }
    let dev = dev0()?;
    let (major, minor) = dev.compute_capability().ctx("compute_capability")?;
    let cc = (major * 10 + minor) as i32;
    let archs = gpubind::nvrtc_supported_archs().ctx("archs")?;
    println!("    sm_{cc}; NVRTC supports {archs:?}");
    // The fallback's mechanism: PTX for the newest supported arch *below* the device's
    // (what an NVRTC older than the GPU gets), JIT-compiled by the driver at load.
    let older = archs
        .as_deref()
        .and_then(|a| a.iter().copied().filter(|&x| x < cc).max())
        .unwrap_or(75.min(cc));
    let ptx = gpubind::compile(
        AFFINE,
        "affine.cu",
        &[format!("--gpu-architecture=compute_{older}")],
        gpubind::Output::Ptx,
    )
    .ctx("compile PTX")?;
    let ptx = String::from_utf8(ptx).map_err(|e| e.to_string())?;
    ensure!(ptx.contains(&format!(".target sm_{older}")), "PTX target");
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.load_ptx(&ptx).ctx("load_ptx (driver JIT)")?;
    let affine = module.function("affine").ctx("function")?;
    let p = Affine {
        scale: 2.0,
        shift: 1.0,
        n: 256,
        stride: 1,
        bias: [0.5, 0.5],
    };
    let dx = gpu.clone_htod(&vec![3.0f32; 256]).ctx("htod")?;
    let mut dy = gpu.alloc_zeros::<f32>(256).ctx("alloc")?;
    // SAFETY: (Affine, const float*, float*) matches; 256 elements, stride 1.
    unsafe {
        gpu.default_stream()
            .launch(&affine, LaunchConfig::for_num_elems(256))
            .arg(&p)
            .arg(&dx)
            .arg(&mut dy)
            .launch()
    }
    .ctx("launch")?;
    let got = gpu.dtoh(&dy).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&y| y == 7.0),
        "JIT-compiled kernel: {:?}",
        &got[..4]
    );
    Ok(())
}

/// A raw driver stream, destroyed on drop.
struct RawStream(sys::CUstream);

impl RawStream {
    /// A non-blocking stream of the current context.
    fn new() -> Result<RawStream, String> {
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a context is current (bound by the caller); writes one handle.
        let r = unsafe { sys::cuStreamCreate(&mut raw, flags) };
        ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuStreamCreate: {r:?}");
        Ok(RawStream(raw))
    }

    fn synchronize(&self) -> R {
        // SAFETY: a live stream.
        let r = unsafe { sys::cuStreamSynchronize(self.0) };
        ensure!(
            r == sys::CUresult::CUDA_SUCCESS,
            "cuStreamSynchronize: {r:?}"
        );
        Ok(())
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamCreate, destroyed once.
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// A raw driver stream lent to gpubind carries a launch and a copy, ordered with a
/// gpubind stream through the trackers; after the loan ends the trackers still order
/// later work after what ran on it (even once the raw stream is destroyed), and the raw
/// stream stays usable.
fn borrowed_raw_stream_is_ordered_and_left_usable() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let (fill, cp) = (
        module.function("slow_fill").ctx("slow_fill")?,
        module.function("copy").ctx("copy")?,
    );
    let n = 1 << 16;
    let (mut a, mut b, mut c) = (
        gpu.alloc_zeros::<u32>(n).ctx("alloc a")?,
        gpu.alloc_zeros::<u32>(n).ctx("alloc b")?,
        gpu.alloc_zeros::<u32>(n).ctx("alloc c")?,
    );
    let mine = gpu.new_stream().ctx("new_stream")?;
    let mine = gpu.on(&mine).ctx("on mine")?;
    let raw = RawStream::new()?;
    {
        // SAFETY: a stream of the bound (primary) context, destroyed after the loan.
        let lent = unsafe { gpu.borrow_stream(raw.0) }.ctx("borrow_stream")?;
        let s = gpu.on(&lent).ctx("on lent")?;
        slow_fill(&s, &fill, &mut a, 7)?;
        copy(&mine, &cp, &a, &mut b)?; // must wait for the slow fill on the lent stream
        s.dtod_async(&b, &mut c).ctx("dtod on lent")?; // must wait for the copy on mine
        all_equal(
            "copy on mine after a launch on the lent stream",
            &gpu.dtoh(&b).ctx("dtoh b")?,
            7,
        )?;
        all_equal("dtod on the lent stream", &gpu.dtoh(&c).ctx("dtoh c")?, 7)?;
        slow_fill(&s, &fill, &mut a, 9)?;
    } // the loan ends with the slow fill still running
    copy(&mine, &cp, &a, &mut b)?; // ordered after it through the retired stream's event
    all_equal("copy after the loan ended", &gpu.dtoh(&b).ctx("dtoh b")?, 9)?;
    raw.synchronize().ctx("raw stream after the loan")?;
    // The raw stream is lent again, and destroyed while `a` still remembers a use on it.
    {
        // SAFETY: as above.
        let lent = unsafe { gpu.borrow_stream(raw.0) }.ctx("borrow again")?;
        slow_fill(&gpu.on(&lent).ctx("on")?, &fill, &mut a, 11)?;
    }
    drop(raw);
    copy(&mine, &cp, &a, &mut c)?;
    all_equal(
        "copy after the raw stream was destroyed",
        &gpu.dtoh(&c).ctx("dtoh c")?,
        11,
    )?;
    drop(a); // waits for the event, not the destroyed stream
    Ok(())
}

/// Pool memory allocated and written on a borrowed raw stream, dropped after the loan
/// ended and the raw stream was destroyed: the free must not go on the dead handle (it
/// goes on the legacy stream, after the event recorded at the end of the loan), and the
/// memory returns to the pool.
fn pool_drop_after_the_borrowed_stream_was_destroyed() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let fill = module.function("slow_fill").ctx("slow_fill")?;
    gpu.synchronize().ctx("sync")?;
    let before = pool.used_bytes().ctx("used")?;
    let raw = RawStream::new()?;
    let buf = {
        // SAFETY: a stream of the bound (primary) context, destroyed after the loan.
        let lent = unsafe { gpu.borrow_stream(raw.0) }.ctx("borrow_stream")?;
        let s = gpu.on(&lent).ctx("on lent")?;
        let mut buf = s.alloc_zeros::<u32>(1 << 16).ctx("alloc on lent")?;
        slow_fill(&s, &fill, &mut buf, 3)?;
        buf
    }; // the loan ends with the slow fill still running
    raw.synchronize().ctx("raw stream")?;
    drop(raw);
    drop(buf);
    gpu.synchronize().ctx("sync")?;
    let after = pool.used_bytes().ctx("used")?;
    println!("    pool used bytes {before} -> {after}");
    ensure!(
        after <= before,
        "the memory did not go back to the pool: {before} -> {after} (the free went on \
         the destroyed stream?)"
    );
    Ok(())
}

/// A cudarc stream lent to gpubind: usable for a launch; cudarc's handle works after.
fn borrowed_cudarc_stream_launches() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "k.cu").ctx("compile")?;
    let fill = module.function("slow_fill").ctx("slow_fill")?;
    let cs = gpu
        .cudarc_context()
        .ctx("cudarc_context")?
        .new_stream()
        .map_err(|e| format!("{e:?}"))?;
    let mut buf = gpu.alloc_zeros::<u32>(4096).ctx("alloc")?;
    {
        // SAFETY: cudarc's stream of the primary context; `cs` outlives the loan.
        let lent = unsafe { gpu.borrow_stream(cs.cu_stream()) }.ctx("borrow")?;
        slow_fill(&gpu.on(&lent).ctx("on")?, &fill, &mut buf, 5)?;
    }
    all_equal("launch on cudarc's stream", &gpu.dtoh(&buf).ctx("dtoh")?, 5)?;
    cs.synchronize()
        .map_err(|e| format!("cudarc stream after the loan: {e:?}"))?;
    Ok(())
}

/// Special handles and streams of other contexts are refused with typed errors.
fn borrow_stream_refuses_special_and_foreign_handles() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    for special in [0usize, 1, 2] {
        // SAFETY: refused before the handle is used.
        match unsafe { gpu.borrow_stream(special as sys::CUstream) } {
            Err(Error::InvalidArgument(m)) if m.contains("special") => {}
            other => return Err(format!("handle {special}: {other:?}")),
        }
    }
    let mut raw_dev: sys::CUdevice = 0;
    // SAFETY: writes one handle.
    let r = unsafe { sys::cuDeviceGet(&mut raw_dev, dev.ordinal() as i32) };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuDeviceGet: {r:?}");
    let other = common::create_context(raw_dev)?; // pushed current
    let foreign = RawStream::new()?;
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    let gpu = ctx.bind(&dev).ctx("bind again")?;
    // SAFETY: a live stream (of another context: refused).
    let refused = match unsafe { gpu.borrow_stream(foreign.0) } {
        Err(Error::InvalidArgument(m)) if m.contains("belongs to context") => Ok(()),
        other => Err(format!("stream of another context: {other:?}")),
    };
    drop(foreign);
    // SAFETY: created above; nothing uses it any more.
    unsafe { sys::cuCtxDestroy_v2(other) };
    refused
}

/// A stream another library owns (shared with cudarc, or borrowed) that its owner is
/// capturing: gpubind refuses every operation on it with `NotCapturable` (it would be a
/// node of that graph, run at each launch, unordered with gpubind's later uses and the
/// buffer's free), and the capture stays valid; after the capture the same operations
/// run.
fn foreign_stream_under_capture_is_refused() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let src = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let shared = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = shared.cudarc_stream().ok_or("not cudarc's")?.clone();
    // SAFETY: cudarc's stream of the primary context; `cs` outlives the loan.
    let lent = unsafe { gpu.borrow_stream(cs.cu_stream()) }.ctx("borrow_stream")?;
    // A pool allocation before the capture (and its stream-ordered free on the shared
    // stream, its sole writer): the pool is known before the capture begins.
    drop(
        gpu.on(&shared)
            .ctx("on")?
            .alloc_zeros::<u32>(64)
            .ctx("pool alloc")?,
    );
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let refused = |what: &str, r: gpubind::Result<()>| match r {
        Err(Error::NotCapturable { .. }) => Ok(()),
        other => Err(format!(
            "{what} while cudarc captures its stream: {other:?}"
        )),
    };
    let (outcome, ended) = under_cudarc_capture(&cs, mode, "the refusals", || {
        for (name, stream) in [("shared", &shared), ("borrowed", &*lent)] {
            let s = gpu.on(stream).ctx("on")?;
            refused(name, s.memset_async(&mut buf, 7u32))?;
            refused(name, s.alloc_zeros::<u32>(64).map(drop))?;
            refused(name, s.copy_tracked_async(&src, &mut buf))?;
        }
        let s = gpu.on(&shared).ctx("on")?;
        refused("lend_ref", s.lend_ref_to_cudarc(&buf, |_| ()))?;
        Ok(())
    });
    outcome?;
    ended?;
    let s = gpu.on(&lent).ctx("on after the capture")?;
    s.memset_async(&mut buf, 7u32)
        .ctx("memset after the capture")?;
    drop(lent);
    all_equal("after the capture", &gpu.dtoh(&buf).ctx("dtoh")?, 7)?;
    Ok(())
}

/// Runs `body` while cudarc captures `cs` (begun in `mode`), checks that `body` (`what`)
/// left the capture active, and ends it: the body's outcome, and the graph unless the
/// capture did not stay valid.
fn under_cudarc_capture<V>(
    cs: &Arc<CudaStream>,
    mode: sys::CUstreamCaptureMode,
    what: &str,
    body: impl FnOnce() -> Result<V, String>,
) -> (Result<V, String>, Result<Option<CudaGraph>, String>) {
    if let Err(e) = cs.begin_capture(mode) {
        return (Err(format!("begin_capture: {e:?}")), Ok(None));
    }
    let outcome = body().and_then(|v| {
        let status = cs
            .capture_status()
            .map_err(|e| format!("capture_status: {e:?}"))?;
        ensure!(
            status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
            "{what} touched the capture: {status:?}"
        );
        Ok(v)
    });
    let ended = cs
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(|e| format!("the capture did not stay valid: {e:?}"));
    (outcome, ended)
}

/// Whether `stream` is being captured (`cuStreamIsCapturing`).
fn is_capturing(stream: &gpubind::Stream) -> Result<bool, String> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of the bound context; the call writes one status.
    let r = unsafe { sys::cuStreamIsCapturing(stream.raw(), &mut status) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuStreamIsCapturing: {r:?}"
    );
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A gpubind operation on a stream nobody captures, ordered after a pending use on a
/// foreign stream whose owner then captures it, runs: it waits for the event recorded
/// after gpubind's work there (before the capture), not for the captured stream, so
/// neither gpubind's stream nor a second cudarc stream joins the capture, which stays
/// valid; the graph launches after it, and the operations' results are right.
fn an_operation_after_a_captured_foreign_stream_waits_for_its_end_mark() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let mut dst = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let captured = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let other = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let own = gpu.new_stream().ctx("new_stream")?;
    let cs = captured.cudarc_stream().ok_or("not cudarc's")?.clone();
    let marker = cs
        .clone_htod(&[7u32; 16])
        .map_err(|e| format!("clone_htod: {e:?}"))?;
    // The buffer's pending write is on the stream cudarc is about to capture.
    gpu.on(&captured)
        .ctx("on")?
        .memset_async(&mut buf, 1u32)
        .ctx("memset")?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let marker_ptr = raw_ptr(&cs, &marker);
    let (outcome, ended) = under_cudarc_capture(&cs, mode, "the operations", || {
        captured_zero(&cs, marker_ptr)?;
        for (i, (name, stream)) in [
            ("gpubind's stream", &own),
            ("another cudarc stream", &other),
        ]
        .into_iter()
        .enumerate()
        {
            let s = gpu.on(stream).ctx("on")?;
            s.memset_async(&mut buf, 7 + i as u32)
                .ctx(&format!("memset on {name} during the capture"))?;
            s.copy_tracked_async(&buf, &mut dst)
                .ctx(&format!("copy on {name} during the capture"))?;
            ensure!(!is_capturing(stream)?, "{name} joined cudarc's capture");
        }
        Ok(())
    });
    outcome?;
    ended.and_then(|g| launch_captured(&cs, g, &marker))?;
    all_equal(
        "the copies ordered after the marked use",
        &gpu.dtoh(&dst).ctx("dtoh")?,
        8,
    )?;
    println!("operations ordered after a captured foreign stream: run, the capture intact");
    Ok(())
}

/// The device address of `marker`, taken before a capture: cudarc's own accessors make
/// the stream wait for the slice's events, and a capturing stream that waits for an event
/// recorded outside its capture invalidates it.
fn raw_ptr(cs: &Arc<CudaStream>, marker: &CudaSlice<u32>) -> sys::CUdeviceptr {
    let (ptr, _record) = gpubind::cudarc::driver::DevicePtr::device_ptr(marker, cs);
    ptr
}

/// Zeroes the 16 `u32`s of the marker at `ptr` on `cs`, which cudarc captures: the
/// graph's one node.
fn captured_zero(cs: &Arc<CudaStream>, ptr: sys::CUdeviceptr) -> R {
    // SAFETY: `ptr` is a live 16-element allocation of the stream's context (the caller's
    // marker, alive until after the graph's launch); the memset is captured on `cs`.
    let r = unsafe { sys::cuMemsetD32Async(ptr, 0, 16, cs.cu_stream()) };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "captured memset: {r:?}");
    Ok(())
}

/// Launches the graph cudarc captured (a memset of `marker`, which holds 7s until then)
/// and checks that it ran.
fn launch_captured(
    cs: &Arc<gpubind::cudarc::driver::CudaStream>,
    graph: Option<gpubind::cudarc::driver::CudaGraph>,
    marker: &CudaSlice<u32>,
) -> R {
    let graph = graph.ok_or("the capture made no graph")?;
    let before = cs
        .clone_dtoh(marker)
        .map_err(|e| format!("clone_dtoh: {e:?}"))?;
    all_equal("the marker before the graph's launch", &before, 7)?;
    graph.launch().map_err(|e| format!("graph launch: {e:?}"))?;
    let after = cs
        .clone_dtoh(marker)
        .map_err(|e| format!("clone_dtoh: {e:?}"))?;
    all_equal("the marker after the graph's launch", &after, 0)
}

/// A borrowed stream whose loan ends while its owner captures it: the end of the loan is
/// the end mark recorded after gpubind's last operation there (before the capture), so a
/// later operation that must wait for that work runs, on gpubind's own stream, which
/// does not join the capture; the capture stays valid, and the buffer reads the later
/// write and frees when dropped.
fn a_loan_ended_under_capture_orders_later_work_after_its_end_mark() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    let own = gpu.new_stream().ctx("new_stream")?;
    let theirs = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = theirs.cudarc_stream().ok_or("not cudarc's")?.clone();
    // SAFETY: cudarc's stream of the primary context; `cs` outlives the loan.
    let lent = unsafe { gpu.borrow_stream(cs.cu_stream()) }.ctx("borrow_stream")?;
    gpu.on(&lent)
        .ctx("on lent")?
        .memset_async(&mut buf, 3u32)
        .ctx("memset on lent")?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let (outcome, ended) = under_cudarc_capture(&cs, mode, "the write", || {
        drop(lent); // the loan ends during the capture
        let s = gpu.on(&own).ctx("on")?;
        s.memset_async(&mut buf, 7u32)
            .ctx("a write after a loan that ended under capture")?;
        ensure!(!is_capturing(&own)?, "gpubind's stream joined the capture");
        Ok(())
    });
    outcome?;
    ended?;
    all_equal("after the capture", &gpu.dtoh(&buf).ctx("dtoh")?, 7)?;
    drop(buf);
    println!("a loan ended under capture: later work ordered after its end mark");
    Ok(())
}

/// A pool buffer whose last use is on a stream cudarc then captures, dropped during the
/// capture: the drop waits for the use's end mark (an event recorded before the
/// capture), not for the stream, and frees the memory (the pool's used memory falls by
/// the buffer's size once the free has run) instead of leaking it; the capture stays
/// valid.
fn a_drop_after_a_captured_foreign_stream_frees() -> R {
    const BYTES: usize = 64 << 20;
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let theirs = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = theirs.cudarc_stream().ok_or("not cudarc's")?.clone();
    let s = gpu.on(&theirs).ctx("on")?;
    let mut buf = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    s.memset_async(&mut buf, 3u32).ctx("memset")?;
    let pooled = s.alloc_zeros::<u8>(BYTES).ctx("pool alloc")?;
    s.synchronize().ctx("synchronize")?;
    let used_before = default_pool_used()?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let (outcome, ended) = under_cudarc_capture(&cs, mode, "the drop", || {
        drop(pooled); // waits for the end mark, then frees on the legacy stream
        Ok(())
    });
    outcome?;
    ended?;
    gpu.synchronize().ctx("synchronize")?;
    let used_after = default_pool_used()?;
    println!("pool used memory: {used_before} before the drop, {used_after} after");
    ensure!(
        used_before.saturating_sub(used_after) >= BYTES as u64,
        "the pool buffer dropped under the capture was not freed: {used_before} -> {used_after}"
    );
    all_equal(
        "the buffer written before the capture",
        &gpu.dtoh(&buf).ctx("dtoh")?,
        3,
    )?;
    println!("a drop after a captured foreign stream: freed, the capture intact");
    Ok(())
}

/// A pinned buffer whose tracked copy is still pending on a stream cudarc then captures
/// (in each capture mode, on this thread): the host read waits for the end mark recorded
/// after the copy (before the capture), with the reading thread's capture mode relaxed,
/// so `try_as_slice` on another thread, then `try_as_slice`, `Deref`, `try_as_mut_slice`
/// and a view's read on the capturing thread see the copied data during the capture, and
/// `DeviceSlice::into_raw` with a pending write there succeeds; the capture stays valid,
/// and its graph launches.
fn host_reads_under_a_foreign_capture_see_the_copy() -> R {
    for mode in [
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    ] {
        host_reads_under_a_capture(mode).map_err(|e| format!("{mode:?}: {e}"))?;
    }
    Ok(())
}

/// [`host_reads_under_a_foreign_capture_see_the_copy`] in one capture mode.
fn host_reads_under_a_capture(mode: sys::CUstreamCaptureMode) -> R {
    const N: usize = 1 << 20;
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let theirs = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = theirs.cudarc_stream().ok_or("not cudarc's")?.clone();
    let marker = cs
        .clone_htod(&[7u32; 16])
        .map_err(|e| format!("clone_htod: {e:?}"))?;
    let s = gpu.on(&theirs).ctx("on")?;
    let mut src = gpu.alloc_zeros::<u32>(N).ctx("alloc")?;
    s.memset_async(&mut src, 5u32).ctx("memset")?;
    let mut pinned = gpu
        .alloc_pinned::<u32>(N, Default::default())
        .ctx("alloc_pinned")?;
    s.copy_tracked_async(&src, &mut pinned)
        .ctx("copy_tracked_async")?;
    let mut raw = gpu.alloc_zeros::<u32>(16).ctx("alloc")?;
    s.memset_async(&mut raw, 9u32).ctx("memset raw")?;
    let marker_ptr = raw_ptr(&cs, &marker);
    let (outcome, ended) = under_cudarc_capture(&cs, mode, "the reads", || {
        captured_zero(&cs, marker_ptr)?;
        // First from another thread (no binding there: the wait enters the context).
        let elsewhere = std::thread::scope(|sc| {
            sc.spawn(|| pinned.try_as_slice().map(|d| (d[0], d[N - 1])))
                .join()
        })
        .map_err(|_| "the other thread's read panicked".to_string())?
        .ctx("try_as_slice on another thread")?;
        ensure!(elsewhere == (5, 5), "another thread read {elsewhere:?}");
        all_equal(
            "try_as_slice during the capture",
            pinned.try_as_slice().ctx("try_as_slice")?,
            5,
        )?;
        all_equal("Deref during the capture", &pinned[N - 16..], 5)?;
        pinned.try_as_mut_slice().ctx("try_as_mut_slice")?[0] = 6;
        let view = pinned.slice(N / 2..).ctx("slice")?;
        all_equal(
            "a view's try_as_slice during the capture",
            view.try_as_slice().ctx("a view's try_as_slice")?,
            5,
        )?;
        let raw = raw.into_raw().map_err(|g| format!("into_raw: {g}"))?;
        Ok(raw)
    });
    let (ptr, len) = outcome?;
    // SAFETY: the allocation `into_raw` gave up, of `len` u32 on this device; this slice
    // frees it.
    let back = unsafe { gpubind::DeviceSlice::<u32>::from_raw(Arc::clone(&dev), ptr, len) };
    ended.and_then(|g| launch_captured(&cs, g, &marker))?;
    ensure!(pinned[0] == 6, "the host write during the capture was lost");
    all_equal("into_raw's memory", &gpu.dtoh(&back).ctx("dtoh")?, 9)?;
    println!("host reads under a {mode:?} foreign capture: {N} elements read during it");
    Ok(())
}

fn main() {
    run_suite(
        "gpu_interop",
        &[
            (
                "struct_by_value_reaches_the_kernel",
                struct_by_value_reaches_the_kernel,
            ),
            (
                "cudarc_context_is_the_primary_context",
                cudarc_context_is_the_primary_context,
            ),
            ("lend_is_ordered_both_ways", lend_is_ordered_both_ways),
            ("lend_ref_is_a_read_claim", lend_ref_is_a_read_claim),
            (
                "pool_drop_after_the_borrowed_stream_was_destroyed",
                pool_drop_after_the_borrowed_stream_was_destroyed,
            ),
            (
                "lend_ref_allows_reads_of_the_lent_buffer_inside_the_closure",
                lend_ref_allows_reads_of_the_lent_buffer_inside_the_closure,
            ),
            (
                "adopted_slice_is_ordered_and_owned",
                adopted_slice_is_ordered_and_owned,
            ),
            (
                "adopting_a_non_primary_slice_gives_it_back",
                adopting_a_non_primary_slice_gives_it_back,
            ),
            (
                "adopting_another_devices_slice_gives_it_back",
                adopting_another_devices_slice_gives_it_back,
            ),
            ("shared_stream_lifetimes", shared_stream_lifetimes),
            (
                "foreign_stream_under_capture_is_refused",
                foreign_stream_under_capture_is_refused,
            ),
            (
                "an_operation_after_a_captured_foreign_stream_waits_for_its_end_mark",
                an_operation_after_a_captured_foreign_stream_waits_for_its_end_mark,
            ),
            (
                "a_loan_ended_under_capture_orders_later_work_after_its_end_mark",
                a_loan_ended_under_capture_orders_later_work_after_its_end_mark,
            ),
            (
                "a_drop_after_a_captured_foreign_stream_frees",
                a_drop_after_a_captured_foreign_stream_frees,
            ),
            (
                "host_reads_under_a_foreign_capture_see_the_copy",
                host_reads_under_a_foreign_capture_see_the_copy,
            ),
            (
                "libraries_match_the_driver_and_ptx_fallback_runs",
                libraries_match_the_driver_and_ptx_fallback_runs,
            ),
            (
                "borrowed_raw_stream_is_ordered_and_left_usable",
                borrowed_raw_stream_is_ordered_and_left_usable,
            ),
            (
                "borrowed_cudarc_stream_launches",
                borrowed_cudarc_stream_launches,
            ),
            (
                "borrow_stream_refuses_special_and_foreign_handles",
                borrow_stream_refuses_special_and_foreign_handles,
            ),
        ],
    );
}
