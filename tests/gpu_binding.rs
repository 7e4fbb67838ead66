//! GPU tests of the binding invariant against code outside gpubind that changes the
//! thread's current context: cudarc's safe `CudaContext::new_non_primary` (re-exported as
//! `gpubind::cudarc`) leaves its fresh context current, before a bind (stale binding) or
//! in the middle of one. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_binding` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite, skip};
use gpubind::cudarc::driver::{CudaContext, sys};
use gpubind::{Device, Error, LaunchConfig, Output, ThreadContext};
use std::sync::Arc;

type R = Result<(), String>;

fn current_context() -> Result<sys::CUcontext, String> {
    let mut c = std::ptr::null_mut();
    // SAFETY: writes one handle; needs no current context.
    let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
    ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuCtxGetCurrent: {r:?}");
    Ok(c)
}

/// The device's primary context handle, as the driver reports it
/// (`cuDevicePrimaryCtxRetain`, released again at once). Call it while gpubind holds its
/// own retain (after a bind), so the release cannot deactivate the context.
fn primary_handle(dev: &Device) -> Result<sys::CUcontext, String> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid device handle; writes one handle; the retain is released below.
    let r = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev.raw_device()) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuDevicePrimaryCtxRetain: {r:?}"
    );
    // SAFETY: releases exactly the retain taken above; gpubind's own retain remains.
    let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev.raw_device()) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuDevicePrimaryCtxRelease: {r:?}"
    );
    Ok(ctx)
}

/// The context a device allocation belongs to (`CU_POINTER_ATTRIBUTE_CONTEXT`).
fn context_of(ptr: sys::CUdeviceptr) -> Result<sys::CUcontext, String> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one CUcontext for a pointer the caller allocated; needs no current
    // context (unified addressing).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ctx as *mut sys::CUcontext).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuPointerGetAttribute(CONTEXT): {r:?}"
    );
    Ok(ctx)
}

/// A non-primary context on device 0 made current by cudarc's *safe* API.
fn foreign_context() -> Result<Arc<CudaContext>, String> {
    let foreign = CudaContext::new_non_primary(0, 0).ctx("CudaContext::new_non_primary(0)")?;
    ensure!(
        current_context()? == foreign.cu_ctx(),
        "setup: new_non_primary did not leave its context current"
    );
    Ok(foreign)
}

const FILL: &str = r#"
extern "C" __global__ void fill(unsigned* out, unsigned n, unsigned value) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
"#;

/// The audit's case: bind, unbind, a foreign context becomes current behind the token,
/// bind the same device again. The old token cache skipped `cuCtxSetCurrent` here and the
/// allocation landed in the foreign context (and died with it).
fn rebind_after_foreign_context_switch() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    drop(ctx.bind(&dev).ctx("first bind")?);
    let primary = primary_handle(&dev)?;
    ensure!(
        current_context()? == primary,
        "the first bind did not make the primary context current"
    );

    let foreign = foreign_context()?;
    ensure!(foreign.cu_ctx() != primary, "setup: foreign == primary");
    let data: Vec<u32> = (0..4096).map(|i| i * 3 + 1).collect();
    let buf = {
        let gpu = ctx.bind(&dev).ctx("bind after the foreign switch")?;
        ensure!(
            current_context()? == primary,
            "bind left the foreign context current (stale binding)"
        );
        gpu.clone_htod(&data).ctx("clone_htod")?
    };
    // SAFETY: only read, to ask the driver which context owns it.
    let owner = context_of(unsafe { buf.raw_ptr() })?;
    println!(
        "    primary {primary:?}, foreign {:?}, allocation in {owner:?}",
        foreign.cu_ctx()
    );
    ensure!(
        owner == primary,
        "the allocation belongs to {owner:?}, not the primary context {primary:?} (foreign {:?})",
        foreign.cu_ctx()
    );

    // Destroying the foreign context must not take the allocation with it.
    drop(foreign);
    let gpu = ctx
        .bind(&dev)
        .ctx("bind after dropping the foreign context")?;
    ensure!(
        current_context()? == primary,
        "bind after the drop did not make the primary context current"
    );
    let back = gpu
        .dtoh(&buf)
        .ctx("dtoh after the foreign context was destroyed")?;
    ensure!(back == data, "dtoh after the foreign drop read wrong data");
    Ok(())
}

/// A foreign context becomes current *during* a binding; a module load through the live
/// `BoundDevice` must land in the primary context (checked by using the module after the
/// foreign context is destroyed), and `synchronize`/`memory_info` must act on it too.
fn module_load_during_foreign_switch() -> R {
    if !gpubind::nvrtc_available() {
        return Err(skip("NVRTC (libnvrtc) not found"));
    }
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let primary = primary_handle(&dev)?;

    let foreign = foreign_context()?;
    gpu.synchronize()
        .ctx("synchronize during the foreign switch")?;
    ensure!(
        current_context()? == primary,
        "synchronize ran with the foreign context current"
    );
    // Switch again before each operation: each one checks for itself.
    let switch = |what: &str| -> R {
        foreign.bind_to_thread().ctx("foreign bind_to_thread")?;
        ensure!(
            current_context()? == foreign.cu_ctx(),
            "setup before {what}: the foreign context is not current"
        );
        Ok(())
    };
    switch("memory_info")?;
    gpu.memory_info().ctx("memory_info")?;
    ensure!(
        current_context()? == primary,
        "memory_info ran with the foreign context current"
    );
    switch("compile_and_load")?;
    let module = gpu
        .compile_and_load(FILL, "fill.cu")
        .ctx("compile_and_load during the foreign switch")?;
    ensure!(
        current_context()? == primary,
        "the module load left the foreign context current"
    );
    drop(foreign); // destroys the foreign context; a module loaded there would die too

    let fill = module
        .function("fill")
        .ctx("function lookup after the foreign context was destroyed")?;
    let n = 1000u32;
    let out = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc_zeros")?;
    // SAFETY: (unsigned*, unsigned, unsigned) matches the kernel; it stays below n.
    unsafe {
        gpu.default_stream()
            .launch(&fill, LaunchConfig::for_num_elems(n))
            .arg_written(&out)
            .arg(&n)
            .arg(&7u32)
            .launch()
            .ctx("launch")?;
    }
    let back = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        back.iter().all(|&v| v == 7),
        "the kernel of the module loaded during the switch did not run"
    );
    Ok(())
}

/// A foreign context becomes current during a binding; an allocation through the live
/// `BoundDevice` must land in the primary context. Needs memory.rs's allocations to call
/// `BoundDevice::ensure_current` first.
fn alloc_during_foreign_switch() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let primary = primary_handle(&dev)?;
    let foreign = foreign_context()?;
    let data: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let buf = gpu
        .clone_htod(&data)
        .ctx("clone_htod during the foreign switch")?;
    // SAFETY: only read, to ask the driver which context owns it.
    let owner = context_of(unsafe { buf.raw_ptr() })?;
    let zeros = gpu
        .alloc_zeros::<f32>(1024)
        .ctx("alloc_zeros during the foreign switch")?;
    // SAFETY: as above.
    let owner2 = context_of(unsafe { zeros.raw_ptr() })?;
    println!(
        "    primary {primary:?}, foreign {:?}; clone_htod in {owner:?}, alloc_zeros in {owner2:?}",
        foreign.cu_ctx()
    );
    ensure!(
        owner == primary && owner2 == primary,
        "an allocation made through a live BoundDevice landed in the foreign context \
         (clone_htod in {owner:?}, alloc_zeros in {owner2:?}, primary {primary:?}): the \
         allocation path does not call BoundDevice::ensure_current"
    );
    drop(foreign);
    let back = gpu
        .dtoh(&buf)
        .ctx("dtoh after the foreign context was destroyed")?;
    ensure!(back == data, "dtoh after the foreign drop read wrong data");
    Ok(())
}

/// NVRTC's cubins pass `load_cubin`'s validation; cut or corrupted copies are
/// `InvalidArgument` before the driver sees them.
fn nvrtc_cubin_validates_and_corruption_is_refused() -> R {
    if !gpubind::nvrtc_available() {
        return Err(skip("NVRTC (libnvrtc) not found"));
    }
    let dev = dev0()?;
    let (major, minor) = dev.compute_capability().ctx("compute_capability")?;
    let cubin = gpubind::compile(
        FILL,
        "fill.cu",
        &[format!("--gpu-architecture=sm_{major}{minor}")],
        Output::Cubin,
    )
    .ctx("compile")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.load_cubin(&cubin).ctx("load_cubin of NVRTC's cubin")?;
    module.function("fill").ctx("function")?;
    println!("    NVRTC cubin: {} bytes, accepted", cubin.len());
    let mut refused = 0;
    for len in [0, 15, 63, 64, cubin.len() / 2, cubin.len() - 1] {
        match gpu.load_cubin(&cubin[..len]) {
            Err(Error::InvalidArgument(_)) => refused += 1,
            Err(e) => {
                return Err(format!(
                    "a cubin cut to {len} bytes: {e} (not InvalidArgument)"
                ));
            }
            Ok(_) => return Err(format!("a cubin cut to {len} bytes was loaded")),
        }
    }
    let mut bad = cubin.clone();
    bad[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
    ensure!(
        matches!(gpu.load_cubin(&bad), Err(Error::InvalidArgument(_))),
        "a cubin with e_shoff = u64::MAX was not refused"
    );
    ensure!(
        matches!(
            gpu.load_cubin(b".version 8.0\n.target sm_90\n.address_size 64\n"),
            Err(Error::InvalidArgument(_))
        ),
        "PTX given to load_cubin was not refused"
    );
    println!("    {} truncations and a bad e_shoff refused", refused);
    Ok(())
}

/// What the driver does with stream-ordered calls on a *gpubind* stream while a foreign
/// context is current (the question behind the per-operation context check's cost): each
/// call must either succeed and act on the stream's context — right data, the foreign
/// context left current — or return an error; never act elsewhere. Prints the codes.
fn stream_ops_with_a_foreign_context_current() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let n = 1u32 << 16;
    let bytes = n as usize * 4;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(FILL, "fill.cu").ctx("compile")?;
    let fill = module.function("fill").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let event = gpu.new_event(false).ctx("event")?;
    let a = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let b = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let c = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    // SAFETY: raw handles of live objects, used below only while they live.
    let (raw_s, raw_e, raw_f, pa, pb, pc) = unsafe {
        (
            stream.raw(),
            event.raw(),
            fill.raw(),
            a.raw_ptr(),
            b.raw_ptr(),
            c.raw_ptr(),
        )
    };
    let foreign = foreign_context()?;
    let mut codes = Vec::new();
    let value = 0xABCDu32;
    // SAFETY (all calls): live allocations of `bytes`, a live stream, event and function of
    // the primary context; the kernel writes `n` elements of `c`; `params` point at live
    // locals for the call.
    unsafe {
        codes.push((
            "cuMemsetD32Async",
            sys::cuMemsetD32Async(pa, 7, n as usize, raw_s),
        ));
        codes.push((
            "cuMemcpyDtoDAsync_v2",
            sys::cuMemcpyDtoDAsync_v2(pb, pa, bytes, raw_s),
        ));
        let mut pc_arg = pc;
        let mut n_arg = n;
        let mut v_arg = value;
        let mut params = [
            (&mut pc_arg as *mut u64).cast::<std::ffi::c_void>(),
            (&mut n_arg as *mut u32).cast(),
            (&mut v_arg as *mut u32).cast(),
        ];
        codes.push((
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                raw_f,
                n.div_ceil(256),
                1,
                1,
                256,
                1,
                1,
                0,
                raw_s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        ));
        codes.push(("cuEventRecord", sys::cuEventRecord(raw_e, raw_s)));
        codes.push(("cuStreamWaitEvent", sys::cuStreamWaitEvent(raw_s, raw_e, 0)));
        codes.push(("cuStreamSynchronize", sys::cuStreamSynchronize(raw_s)));
    }
    let still_foreign = current_context()? == foreign.cu_ctx();
    for (call, code) in &codes {
        println!("    foreign context current: {call} -> {code:?}");
    }
    ensure!(
        still_foreign,
        "a stream-ordered call changed the current context"
    );
    drop(gpu);
    let gpu = ctx.bind(&dev).ctx("re-bind")?;
    for (call, code) in &codes {
        ensure!(
            *code == sys::CUresult::CUDA_SUCCESS,
            "{call} on a gpubind stream with a foreign context current: {code:?}"
        );
    }
    ensure!(
        gpu.dtoh(&a).ctx("dtoh a")?.iter().all(|&x| x == 7),
        "memset landed elsewhere"
    );
    ensure!(
        gpu.dtoh(&b).ctx("dtoh b")?.iter().all(|&x| x == 7),
        "copy landed elsewhere"
    );
    ensure!(
        gpu.dtoh(&c).ctx("dtoh c")?.iter().all(|&x| x == value),
        "kernel wrote elsewhere"
    );
    // The same through the safe API, the foreign context switched in during the binding.
    let (mut a, mut b, mut c) = (a, b, c);
    let foreign2 = foreign_context()?;
    let s = gpu.on(&stream).ctx("on")?;
    s.memset_zeros_async(&mut a).ctx("memset_zeros_async")?;
    s.dtod_async(&a, &mut b).ctx("dtod_async")?;
    let v2 = value + 1;
    // SAFETY: (unsigned*, unsigned, unsigned) matches; the kernel writes `n` elements.
    unsafe {
        s.launch(&fill, LaunchConfig::for_num_elems(n))
            .arg(&mut c)
            .arg(&n)
            .arg(&v2)
            .launch()
    }
    .ctx("launch")?;
    s.record(&event).ctx("record")?;
    s.synchronize().ctx("synchronize")?;
    ensure!(
        current_context()? == foreign2.cu_ctx(),
        "a stream-ordered gpubind call changed the current context"
    );
    drop(foreign2);
    drop(foreign);
    ensure!(
        gpu.dtoh(&b).ctx("dtoh b")?.iter().all(|&x| x == 0),
        "safe dtod_async"
    );
    ensure!(
        gpu.dtoh(&c).ctx("dtoh c")?.iter().all(|&x| x == v2),
        "safe launch"
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_binding",
        &[
            (
                "rebind_after_foreign_context_switch",
                rebind_after_foreign_context_switch,
            ),
            (
                "module_load_during_foreign_switch",
                module_load_during_foreign_switch,
            ),
            ("alloc_during_foreign_switch", alloc_during_foreign_switch),
            (
                "nvrtc_cubin_validates_and_corruption_is_refused",
                nvrtc_cubin_validates_and_corruption_is_refused,
            ),
            (
                "stream_ops_with_a_foreign_context_current",
                stream_ops_with_a_foreign_context_current,
            ),
        ],
    );
}
