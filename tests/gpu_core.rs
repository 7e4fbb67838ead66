//! GPU integration tests of the core API. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_core` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, child_role, dev0, run_suite};
use gpubind::cudarc::driver::sys;
use gpubind::{Device, Error, LaunchConfig, ThreadContext};
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

type R = Result<(), String>;

fn rng() -> rand::rngs::StdRng {
    let seed: u64 = rand::rng().random();
    println!("    seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn current_context() -> sys::CUcontext {
    let mut c = std::ptr::null_mut();
    // SAFETY: writes one handle.
    unsafe { sys::cuCtxGetCurrent(&mut c) };
    c
}

const SAXPY: &str = concat!(
    r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#,
    common::slow_fill_cuda!()
);

fn roundtrip<T>(gpu: &gpubind::BoundDevice<'_>, data: &[T]) -> R
where
    T: gpubind::DeviceRepr + PartialEq + std::fmt::Debug,
{
    let what = std::any::type_name::<T>();
    let d = gpu.clone_htod(data).ctx("clone_htod")?;
    ensure!(
        d.len() == data.len(),
        "{what}: len {} != {}",
        d.len(),
        data.len()
    );
    let back = gpu.dtoh(&d).ctx("dtoh")?;
    ensure!(back == data, "{what} x{}: dtoh differs", data.len());
    // Copy into an existing buffer, then device-to-device, then into a host slice.
    let mut e = gpu.alloc_zeros::<T>(data.len()).ctx("alloc_zeros")?;
    gpu.htod_copy(data, &mut e).ctx("htod_copy")?;
    let f = gpu.clone_dtod(&e).ctx("clone_dtod")?;
    let mut host = data.to_vec();
    host.reverse(); // make sure the copy overwrites
    gpu.dtoh_into(&f, &mut host).ctx("dtoh_into")?;
    ensure!(
        host == data,
        "{what} x{}: htod_copy/dtod/dtoh_into differs",
        data.len()
    );
    Ok(())
}

fn roundtrip_sizes_and_types() -> R {
    let mut rng = rng();
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    for n in [0usize, 1, 7, 1000, 4099, (1 << 20) + 3] {
        roundtrip(
            &gpu,
            &(0..n).map(|_| rng.random::<u8>()).collect::<Vec<_>>(),
        )?;
        roundtrip(
            &gpu,
            &(0..n).map(|_| rng.random::<i32>()).collect::<Vec<_>>(),
        )?;
        roundtrip(
            &gpu,
            &(0..n).map(|_| rng.random::<u64>()).collect::<Vec<_>>(),
        )?;
        roundtrip(
            &gpu,
            &(0..n).map(|_| rng.random::<f32>()).collect::<Vec<_>>(),
        )?;
        roundtrip(
            &gpu,
            &(0..n).map(|_| rng.random::<f64>()).collect::<Vec<_>>(),
        )?;
        let halves: Vec<half::f16> = (0..n)
            .map(|_| half::f16::from_bits(rng.random::<u16>() & 0x7bff))
            .collect();
        roundtrip(&gpu, &halves)?;
        roundtrip(
            &gpu,
            &(0..n).map(|_| [rng.random::<u16>(); 3]).collect::<Vec<_>>(),
        )?;
    }
    Ok(())
}

fn views_and_memset() -> R {
    let mut rng = rng();
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let data: Vec<u32> = (0..1000).map(|_| rng.random_range(1..u32::MAX)).collect();
    let mut buf = gpu.clone_htod(&data).ctx("clone_htod")?;
    {
        let mut mid = buf.slice_mut(100..200).ctx("slice_mut")?;
        gpu.memset_zeros(&mut mid).ctx("memset view")?;
    }
    let back = gpu.dtoh(&buf).ctx("dtoh")?;
    let mut expect = data.clone();
    expect[100..200].fill(0);
    ensure!(back == expect, "memset of a view touched the wrong range");
    let tail = gpu.dtoh(&buf.slice(990..).ctx("slice")?).ctx("dtoh view")?;
    ensure!(tail == data[990..], "view read the wrong range");
    // Size and range errors.
    let small = gpu.alloc_zeros::<u32>(10).ctx("alloc")?;
    let mut big = gpu.alloc_zeros::<u32>(11).ctx("alloc")?;
    let e = gpu.dtod(&small, &mut big).unwrap_err();
    ensure!(
        e == Error::SizeMismatch {
            what: "dtod",
            expected: 11,
            found: 10
        },
        "dtod sizes: {e:?}"
    );
    let e = gpu.htod_copy(&[1u32; 3], &mut big).unwrap_err();
    ensure!(
        matches!(
            e,
            Error::SizeMismatch {
                expected: 11,
                found: 3,
                ..
            }
        ),
        "htod sizes: {e:?}"
    );
    let mut host = [0u32; 4];
    ensure!(
        matches!(
            gpu.dtoh_into(&small, &mut host),
            Err(Error::SizeMismatch { .. })
        ),
        "dtoh_into size"
    );
    ensure!(
        matches!(
            small.slice(5..11),
            Err(Error::OutOfBounds {
                start: 5,
                end: 11,
                len: 10
            })
        ),
        "range"
    );
    gpu.memset_zeros(&mut buf).ctx("memset all")?;
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")?.iter().all(|&v| v == 0),
        "memset_zeros left non-zeros"
    );
    Ok(())
}

/// A synchronous upload is complete when it returns, also for work on a non-blocking
/// stream (cuMemcpyHtoD alone returns once pageable data is staged).
fn htod_copy_is_visible_to_other_streams() -> R {
    let mut rng = rng();
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 64 << 20; // 256 MiB: the DMA outlasts the staging by far
    let data: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let mut dst = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
    let mut copy = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
    for round in 0..3 {
        gpu.htod_copy(&data, &mut dst).ctx("htod_copy")?;
        s.dtod_async(&dst, &mut copy).ctx("dtod_async")?;
        s.synchronize().ctx("sync")?;
        let got = gpu.dtoh(&copy).ctx("dtoh")?;
        let stale = got.iter().zip(&data).filter(|(a, b)| a != b).count();
        ensure!(
            stale == 0,
            "round {round}: {stale} of {n} elements read before the upload landed"
        );
        gpu.memset_zeros(&mut dst).ctx("memset")?;
    }
    Ok(())
}

fn saxpy_matches_cpu() -> R {
    let mut rng = rng();
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(SAXPY, "saxpy.cu")
        .ctx("compile_and_load")?;
    let saxpy = module.function("saxpy").ctx("function")?;
    // cuFuncGetParamInfo needs CUDA 12.4: before (or capped below, with
    // GPUBIND_ASSUME_DRIVER_VERSION) the driver reports no parameters and nothing is checked.
    let version = gpubind::driver_version().ctx("driver_version")?;
    let checked = version >= gpubind::DriverVersion::new(12, 4);
    ensure!(
        saxpy.param_sizes() == checked.then_some(&[4, 8, 8, 4][..]),
        "param sizes {:?} (driver version {version})",
        saxpy.param_sizes()
    );
    let n: u32 = (1 << 20) + 17;
    let a: f32 = rng.random_range(-4.0..4.0);
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let dx = gpu.clone_htod(&x).ctx("htod x")?;
    let mut dy = gpu.clone_htod(&y).ctx("htod y")?;
    let s = gpu.default_stream();
    // SAFETY: (float, float*, float*, unsigned) matches; the kernel checks i < n.
    unsafe {
        s.launch(&saxpy, LaunchConfig::for_num_elems(n))
            .arg(&a)
            .arg(&dx)
            .arg(&mut dy)
            .arg(&n)
            .launch()
    }
    .ctx("launch")?;
    let got = gpu.dtoh(&dy).ctx("dtoh")?;
    for i in 0..n as usize {
        let want = a * x[i] + y[i];
        ensure!(
            (got[i] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "y[{i}] = {} != {want}",
            got[i]
        );
    }
    // The parameter list is checked (never launched unchecked: they would fault).
    if checked {
        // SAFETY: never launched: the checks fail first.
        let e = unsafe {
            s.launch(&saxpy, LaunchConfig::for_num_elems(n))
                .arg(&a)
                .arg(&dx)
                .arg(&n)
                .launch()
        };
        ensure!(
            matches!(&e, Err(Error::LaunchArgs { reason, .. }) if reason.contains("takes 4 parameter(s), 3 given")),
            "count check: {e:?}"
        );
        // SAFETY: never launched: the size check fails first.
        let e = unsafe {
            s.launch(&saxpy, LaunchConfig::for_num_elems(n))
                .arg(&2.0f64)
                .arg(&dx)
                .arg(&dy)
                .arg(&n)
                .launch()
        };
        ensure!(
            matches!(&e, Err(Error::LaunchArgs { reason, .. }) if reason.contains("parameter 0 is 4 bytes")),
            "size check: {e:?}"
        );
    } else {
        println!("    parameter checks skipped: CUDA {version} driver (cuFuncGetParamInfo: 12.4)");
    }
    let mut zero = LaunchConfig::for_num_elems(n);
    zero.grid_dim.0 = 0;
    // SAFETY: never launched: rejected first.
    let e = unsafe {
        s.launch(&saxpy, zero)
            .arg(&a)
            .arg(&dx)
            .arg(&dy)
            .arg(&n)
            .launch()
    };
    ensure!(
        matches!(e, Err(Error::InvalidArgument(_))),
        "zero grid: {e:?}"
    );
    ensure!(
        module.function("no_such_kernel").is_err(),
        "missing kernel must be an error"
    );
    let e = gpu.compile_and_load("this is not CUDA", "bad.cu").err();
    ensure!(
        matches!(&e, Some(Error::Compile { log, .. }) if !log.is_empty()),
        "compile error: {e:?}"
    );
    Ok(())
}

fn streams_and_events_order_work() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(SAXPY, "saxpy.cu").ctx("compile")?;
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (start, done) = (
        gpu.new_event(true).ctx("event")?,
        gpu.new_event(true).ctx("event")?,
    );
    let n = 1u32 << 16;
    let mut src = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let mut dst = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let (a, b) = (gpu.on(&s1).ctx("on s1")?, gpu.on(&s2).ctx("on s2")?);
    a.record(&start).ctx("record")?;
    let (value, cycles) = (0xC0FFEEu32, 20_000_000i64); // ~10 ms at ~2 GHz
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; bounds checked.
    unsafe {
        a.launch(&slow_fill, LaunchConfig::for_num_elems(n))
            .arg(&mut src)
            .arg(&n)
            .arg(&value)
            .arg(&cycles)
            .launch()
    }
    .ctx("launch")?;
    a.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the slow kernel finished before we could check the order"
    );
    b.wait(&done).ctx("wait")?;
    b.dtod_async(&src, &mut dst).ctx("dtod_async")?;
    b.synchronize().ctx("sync s2")?;
    ensure!(
        done.is_complete().ctx("query")?,
        "s2 finished before the event it waited on"
    );
    let got = gpu.dtoh(&dst).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "s2 copied before s1's kernel finished"
    );
    let ms = start.elapsed_ms(&done).ctx("elapsed")?;
    ensure!(ms > 1.0, "the spinning kernel took only {ms} ms");
    println!("    slow kernel: {ms:.2} ms between events");
    // Async memset ordered on a stream, then an async copy from pageable host memory.
    let host: Vec<u32> = (0..n).collect();
    // SAFETY: `host` is pageable and outlives the synchronize below.
    unsafe { a.htod_async(&host, &mut src) }.ctx("htod_async")?;
    a.memset_zeros_async(&mut dst.slice_mut(..10).ctx("slice")?)
        .ctx("memset_async")?;
    let mut back = vec![0u32; n as usize];
    // SAFETY: pageable destination, alive until the synchronize.
    unsafe { a.dtoh_async(&src, &mut back) }.ctx("dtoh_async")?;
    a.synchronize().ctx("sync")?;
    ensure!(back == host, "async htod/dtoh differ");
    ensure!(
        gpu.dtoh(&dst).ctx("dtoh")?[..10].iter().all(|&v| v == 0),
        "async memset"
    );
    Ok(())
}

fn drop_leaves_current_context_unchanged() -> R {
    let devices = Device::all().ctx("all")?;
    let dev = Arc::clone(&devices[0]);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let (buf, stream, event, module) = {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        (
            gpu.alloc_zeros::<f32>(1 << 20).ctx("alloc")?,
            gpu.new_stream().ctx("stream")?,
            gpu.new_event(false).ctx("event")?,
            gpu.compile_and_load(SAXPY, "saxpy.cu").ctx("compile")?,
        )
    };
    // Make some *other* context current: a second device's if there is one, else a
    // context we create ourselves (a stand-in for "another device is bound").
    let mut own: sys::CUcontext = std::ptr::null_mut();
    let other = if devices.len() >= 2 {
        let gpu1 = ctx.bind(&devices[1]).ctx("bind 1")?;
        // SAFETY: read-only access to the handle.
        unsafe { gpu1.raw_context() }
    } else {
        // A fresh context on device 0 (pushed current); destroyed below.
        own = common::create_context(dev.raw_device())?;
        own
    };
    ensure!(
        current_context() == other,
        "setup: other context not current"
    );
    let (free_before, _) = mem_info();
    drop(buf);
    drop(stream);
    drop(event);
    drop(module);
    ensure!(
        current_context() == other,
        "a drop changed the thread's current context"
    );
    let (free_after, _) = mem_info();
    println!(
        "    {} devices; free in current ctx before/after drop: {free_before}/{free_after}",
        devices.len()
    );
    ensure!(
        free_after >= free_before + (4 << 20) - (2 << 20),
        "the 4 MiB buffer was not freed"
    );
    if !own.is_null() {
        // SAFETY: destroys the context we created; it is current, so it is popped too.
        unsafe { sys::cuCtxDestroy_v2(own) };
        ctx.forget_binding();
    }
    // With no context current at all, a drop also leaves none current.
    let buf = ctx
        .bind(&dev)
        .ctx("bind")?
        .alloc_zeros::<u8>(64)
        .ctx("alloc")?;
    // SAFETY: unbinds this thread; we tell the token below.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    ctx.forget_binding();
    drop(buf);
    ensure!(
        current_context().is_null(),
        "drop with nothing bound left a context current"
    );
    Ok(())
}

fn mem_info() -> (usize, usize) {
    let (mut f, mut t) = (0, 0);
    // SAFETY: writes two size_t; a context is current in the callers.
    unsafe { sys::cuMemGetInfo_v2(&mut f, &mut t) };
    (f, t)
}

fn bind_checks_the_current_context() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let primary = {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        // SAFETY: read-only.
        unsafe { gpu.raw_context() }
    };
    ensure!(
        current_context() == primary,
        "bind did not make the primary context current"
    );
    // Change the binding behind the token's back: bind asks the driver (cuCtxGetCurrent)
    // instead of trusting a cache, so a re-bind makes the primary context current again.
    // SAFETY: unbinds this thread; the re-bind below restores it.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    drop(ctx.bind(&dev).ctx("rebind")?);
    ensure!(
        current_context() == primary,
        "re-bind after the thread was unbound behind the token left it unbound"
    );
    // And the same through a live binding: its operations re-check.
    let gpu = ctx.bind(&dev).ctx("bind")?;
    // SAFETY: unbinds this thread; the next operation through `gpu` restores it.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
    gpu.synchronize().ctx("synchronize")?;
    ensure!(
        current_context() == primary,
        "an operation through a live binding ran with no context current"
    );
    Ok(())
}

fn errors_for_bad_input() -> R {
    let count = Device::count().ctx("count")?;
    let e = Device::get(count).unwrap_err();
    ensure!(
        e == Error::BadOrdinal {
            ordinal: count,
            count
        },
        "bad ordinal: {e:?}"
    );
    ensure!(e.to_string().contains("out of range"), "message: {e}");
    let e = Device::get(usize::MAX).unwrap_err();
    ensure!(matches!(e, Error::BadOrdinal { .. }), "huge ordinal: {e:?}");
    let _first = ThreadContext::acquire().ctx("acquire")?;
    ensure!(
        ThreadContext::acquire().unwrap_err() == Error::ThreadContextTaken,
        "second token"
    );
    let dev = dev0()?;
    let mut ctx = _first;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let (free, _) = gpu.memory_info().ctx("memory_info")?;
    // SAFETY: the allocation must fail; nothing is read.
    let e = unsafe { gpu.alloc::<u8>(free + (1 << 40)) }.unwrap_err();
    ensure!(
        matches!(&e, Error::Driver { name, .. } if name == "CUDA_ERROR_OUT_OF_MEMORY"),
        "oversized alloc: {e:?}"
    );
    println!("    {e}");
    // SAFETY: must fail on overflow before calling the driver.
    let e = unsafe { gpu.alloc::<u64>(usize::MAX / 4) }.unwrap_err();
    ensure!(
        matches!(e, Error::InvalidArgument(_)),
        "overflowing alloc: {e:?}"
    );
    Ok(())
}

fn wrong_device_is_an_error() -> R {
    let devices = Device::all().ctx("all")?;
    if devices.len() < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs, {} visible",
            devices.len()
        )));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let (buf0, stream0) = {
        let g0 = ctx.bind(&devices[0]).ctx("bind 0")?;
        (
            g0.alloc_zeros::<f32>(16).ctx("alloc")?,
            g0.new_stream().ctx("stream")?,
        )
    };
    let g1 = ctx.bind(&devices[1]).ctx("bind 1")?;
    let e = g1.dtoh(&buf0).unwrap_err();
    ensure!(
        e == Error::WrongDevice {
            what: "source",
            bound: 1,
            found: 0
        },
        "dtoh: {e:?}"
    );
    ensure!(
        matches!(g1.on(&stream0), Err(Error::WrongDevice { .. })),
        "stream of device 0 under device 1"
    );
    let module = g1.compile_and_load(SAXPY, "saxpy.cu").ctx("compile")?;
    let f = module.function("saxpy").ctx("function")?;
    let mut y = g1.alloc_zeros::<f32>(16).ctx("alloc")?;
    let n = 16u32;
    // SAFETY: rejected before launch (buf0 is on device 0).
    let e = unsafe {
        g1.default_stream()
            .launch(&f, LaunchConfig::for_num_elems(n))
            .arg(&1f32)
            .arg(&buf0)
            .arg(&mut y)
            .arg(&n)
            .launch()
    };
    ensure!(
        matches!(
            e,
            Err(Error::WrongDevice {
                what: "kernel argument",
                ..
            })
        ),
        "launch: {e:?}"
    );
    Ok(())
}

fn one_thread_many_gpus_and_module_reuse() -> R {
    let devices = Device::all().ctx("all")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let mut state = Vec::new();
    for dev in &devices {
        let gpu = ctx.bind(dev).ctx("bind")?;
        let module = gpu.compile_and_load(SAXPY, "saxpy.cu").ctx("compile")?;
        let y = gpu
            .clone_htod(&vec![dev.ordinal() as f32; 4096])
            .ctx("htod")?;
        state.push((module, y));
    }
    // Second pass: modules and slices outlive their binds and are reused under new ones.
    for round in 0..3 {
        for (dev, (module, y)) in devices.iter().zip(state.iter_mut()) {
            let gpu = ctx.bind(dev).ctx("bind")?;
            let f = module.function("saxpy").ctx("function")?;
            let x = gpu.clone_htod(&vec![1.0f32; 4096]).ctx("htod")?;
            let n = 4096u32;
            // SAFETY: signature matches; bounds checked in the kernel.
            unsafe {
                gpu.default_stream()
                    .launch(&f, LaunchConfig::for_num_elems(n))
                    .arg(&1f32)
                    .arg(&x)
                    .arg(&mut *y)
                    .arg(&n)
                    .launch()
            }
            .ctx("launch")?;
            let got = gpu.dtoh(y).ctx("dtoh")?;
            let want = dev.ordinal() as f32 + round as f32 + 1.0;
            ensure!(
                got.iter().all(|&v| v == want),
                "device {} round {round}: {} != {want}",
                dev.ordinal(),
                got[0]
            );
        }
    }
    Ok(())
}

fn thread_per_gpu_with_scope() -> R {
    let devices = Device::all().ctx("all")?;
    // Several threads per device, each with its own token, binding concurrently.
    let jobs: Vec<Arc<Device>> = devices
        .iter()
        .cycle()
        .take(devices.len().max(4))
        .cloned()
        .collect();
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(i, dev)| {
                s.spawn(move || -> Result<u64, String> {
                    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                    let gpu = ctx.bind(dev).ctx("bind")?;
                    let data: Vec<u64> = (0..10_000u64).map(|k| k * (i as u64 + 1)).collect();
                    let d = gpu.clone_htod(&data).ctx("htod")?;
                    Ok(gpu.dtoh(&d).ctx("dtoh")?.iter().sum())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    for (i, r) in results.into_iter().enumerate() {
        let want: u64 = (0..10_000u64).map(|k| k * (i as u64 + 1)).sum();
        ensure!(r? == want, "thread {i}: wrong sum");
    }
    Ok(())
}

/// Runs `role` in a child process; returns the child and its stdout reader.
fn spawn_child(
    role: &str,
) -> Result<(std::process::Child, BufReader<std::process::ChildStdout>), String> {
    let mut child = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ctx("spawn child")?;
    let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    Ok((child, out))
}

fn expect_line(
    out: &mut BufReader<std::process::ChildStdout>,
    prefix: &str,
) -> Result<String, String> {
    let mut line = String::new();
    out.read_line(&mut line).ctx("read child")?;
    ensure!(
        line.starts_with(prefix),
        "child said {line:?}, expected {prefix:?}"
    );
    Ok(line.trim().to_owned())
}

fn enumeration_creates_no_context() -> R {
    // The parent measures free memory through its own context while a child enumerates
    // (and must not take any memory), then while the child holds a bound context (which
    // must show up: proves the measurement can see a context).
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let (free0, _) = gpu.memory_info().ctx("mem")?;
    let (mut child, mut out) = spawn_child("enumerate")?;
    let report = expect_line(&mut out, "enumerated")?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (free1, _) = gpu.memory_info().ctx("mem")?;
    writeln!(child.stdin.as_mut().ok_or("stdin")?, "bind").ctx("tell child")?;
    expect_line(&mut out, "bound")?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (free2, _) = gpu.memory_info().ctx("mem")?;
    writeln!(child.stdin.as_mut().ok_or("stdin")?, "exit").ctx("tell child")?;
    let status = child.wait().ctx("wait child")?;
    ensure!(status.success(), "child failed: {status}");
    let enum_cost = free0 as i64 - free1 as i64;
    let bind_cost = free1 as i64 - free2 as i64;
    println!(
        "    {report}; device memory used by the child: after enumeration {:.1} MiB, after first bind {:.1} MiB",
        enum_cost as f64 / (1 << 20) as f64,
        mib(bind_cost.max(0) as usize)
    );
    ensure!(
        enum_cost < (2 << 20),
        "enumeration used {enum_cost} bytes of device memory"
    );
    ensure!(
        bind_cost > (16 << 20),
        "a bound context used only {bind_cost} bytes: measurement is blind"
    );
    Ok(())
}

fn child_enumerate() -> R {
    let devices = Device::all().ctx("all")?;
    let mut attrs = 0i64;
    for d in &devices {
        let (maj, min) = d.compute_capability().ctx("cc")?;
        attrs += d.total_memory().ctx("mem")? as i64 + maj as i64 + min as i64;
        attrs += d.multiprocessor_count().ctx("sm")? as i64;
        let _ = d.uuid();
        ensure!(!d.has_retained_context(), "enumeration retained a context");
        ensure!(
            !d.is_primary_context_active().ctx("state")?,
            "enumeration activated a primary context"
        );
    }
    println!(
        "enumerated {} device(s), {} ({attrs})",
        devices.len(),
        devices[0].name()
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).ctx("stdin")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&devices[0]).ctx("bind")?;
    ensure!(
        devices[0].is_primary_context_active().ctx("state")?,
        "bind did not activate the context"
    );
    let _buf = gpu.alloc_zeros::<u8>(1).ctx("alloc")?;
    println!("bound");
    std::io::stdin().read_line(&mut line).ctx("stdin")?;
    Ok(())
}

fn last_arc_releases_primary_context() -> R {
    let (mut child, mut out) = spawn_child("release")?;
    let line = expect_line(&mut out, "released")?;
    ensure!(child.wait().ctx("wait")?.success(), "child failed");
    println!("    {line}");
    Ok(())
}

fn child_release() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    {
        let dev = dev0()?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let buf = gpu.alloc_zeros::<f32>(10).ctx("alloc")?;
        drop(gpu);
        ensure!(
            dev.is_primary_context_active().ctx("state")?,
            "bound context inactive"
        );
        drop(dev);
        // The slice still holds the device: the context must stay.
        ensure!(
            buf.device().is_primary_context_active().ctx("state")?,
            "released while a slice lives"
        );
    }
    let dev = dev0()?;
    ensure!(
        !dev.has_retained_context(),
        "a new Arc<Device> still holds the old retain"
    );
    ensure!(
        !dev.is_primary_context_active().ctx("state")?,
        "the last Arc did not release the primary context"
    );
    // And it can be bound again (the token must not trust its stale cache).
    let gpu = ctx.bind(&dev).ctx("re-bind")?;
    ensure!(
        gpu.dtoh(&gpu.clone_htod(&[7u8]).ctx("htod")?).ctx("dtoh")? == [7],
        "after re-retain"
    );
    println!("released and re-retained");
    Ok(())
}

/// Kernels for the launch-limit tests.
const LIMITS: &str = r#"
// Every thread adds one to its block's counter.
extern "C" __global__ void count_threads(unsigned* out) {
    unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    atomicAdd(&out[block], 1u);
}
// Fills `words` words of dynamic shared memory, reads them back in reverse order (so
// other threads' words), counts mismatches into out[0] and leaves the last word in out[1].
extern "C" __global__ void fill_shared(unsigned* out, unsigned words) {
    extern __shared__ unsigned s[];
    for (unsigned i = threadIdx.x; i < words; i += blockDim.x) s[i] = i * 3u + 1u;
    __syncthreads();
    unsigned bad = 0;
    for (unsigned i = threadIdx.x; i < words; i += blockDim.x) {
        unsigned j = words - 1u - i;
        if (s[j] != j * 3u + 1u) bad++;
    }
    atomicAdd(&out[0], bad);
    if (threadIdx.x == 0) out[1] = s[words - 1u];
}
// At most 128 threads a block: the kernel's own limit is below the device's.
extern "C" __global__ void __launch_bounds__(128) bounded(unsigned* out) {
    out[threadIdx.x] = threadIdx.x + 1u;
}
"#;

fn dev_attr(dev: &Device, a: gpubind::DeviceAttribute) -> Result<u32, String> {
    let v = dev.attribute(a).ctx("cuDeviceGetAttribute")?;
    u32::try_from(v).map_err(|_| format!("{a:?} = {v}"))
}

/// `cuFuncGetAttribute`; the function's context must be current.
fn func_attr(f: &gpubind::Function<'_>, a: sys::CUfunction_attribute) -> Result<u32, String> {
    let mut v = 0;
    // SAFETY: a live function (its module outlives `f`) of the current context; writes
    // one int.
    let r = unsafe { sys::cuFuncGetAttribute(&mut v, a, f.raw()) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuFuncGetAttribute({a:?}): {r:?}"
    );
    u32::try_from(v).map_err(|_| format!("{a:?} = {v}"))
}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: shared,
    }
}

/// `Err` unless `e` is a [`Error::LaunchLimit`] for `kernel` whose `what` contains
/// `name`, with these numbers.
fn expect_limit(e: Result<(), Error>, kernel: &str, name: &str, requested: u64, limit: u64) -> R {
    match &e {
        Err(
            err @ Error::LaunchLimit {
                kernel: k,
                what,
                requested: r,
                limit: l,
            },
        ) if k == kernel && what.contains(name) && *r == requested && *l == limit => {
            let msg = err.to_string();
            ensure!(
                msg.contains(kernel) && msg.contains(&requested.to_string()),
                "message {msg:?} names neither kernel nor request"
            );
            println!("    {msg}");
            Ok(())
        }
        _ => Err(format!(
            "expected LaunchLimit {{ {kernel}, {name}, {requested} > {limit} }}, got {e:?}"
        )),
    }
}

/// Blocks over the device's threads per block, over a block dimension, and over the
/// kernel's own (`__launch_bounds__`) limit are typed errors, the driver never sees
/// them (nothing runs, no sticky error), and launches at the limits work.
fn launch_limit_threads_per_block() -> R {
    use gpubind::DeviceAttribute as A;
    let dev = dev0()?;
    let max_threads = dev_attr(&dev, A::MaxThreadsPerBlock)?;
    let max_z = dev_attr(&dev, A::MaxBlockDimZ)?;
    ensure!(
        max_threads < 2048 && max_z < 2048,
        "device allows {max_threads} threads, z {max_z}: the test assumes fewer than 2048"
    );
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(LIMITS, "limits.cu").ctx("compile")?;
    let count = module.function("count_threads").ctx("function")?;
    let bounded = module.function("bounded").ctx("function")?;
    let s = gpu.default_stream();
    let mut out = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        s.launch(&count, cfg((1, 1, 1), (2048, 1, 1), 0))
            .arg(&mut out)
            .launch()
    };
    expect_limit(
        e,
        "count_threads",
        "device's CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
        2048,
        max_threads.into(),
    )?;
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        s.launch(&count, cfg((1, 1, 1), (1, 1, max_z + 1), 0))
            .arg(&mut out)
            .launch()
    };
    expect_limit(
        e,
        "count_threads",
        "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z",
        (max_z + 1).into(),
        max_z.into(),
    )?;
    // The kernel's own limit, below the device's.
    let fmax = func_attr(
        &bounded,
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    )?;
    ensure!(
        (1..=128).contains(&fmax),
        "__launch_bounds__(128) kernel reports {fmax} threads per block"
    );
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        s.launch(&bounded, cfg((1, 1, 1), (fmax + 1, 1, 1), 0))
            .arg(&mut out)
            .launch()
    };
    expect_limit(
        e,
        "bounded",
        "kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
        (fmax + 1).into(),
        fmax.into(),
    )?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")?.iter().all(|&v| v == 0),
        "a refused launch ran"
    );
    // At the limits: the context is healthy and both kernels run.
    // SAFETY: (unsigned*) matches; thread i writes out[i], i < fmax <= 1024.
    unsafe {
        s.launch(&bounded, cfg((1, 1, 1), (fmax, 1, 1), 0))
            .arg(&mut out)
            .launch()
    }
    .ctx("bounded at its limit")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    for (i, &v) in got.iter().enumerate() {
        let want = if (i as u32) < fmax { i as u32 + 1 } else { 0 };
        ensure!(v == want, "bounded: out[{i}] = {v}, want {want}");
    }
    let mut counts = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    // SAFETY: (unsigned*) matches; one block: every thread adds to counts[0].
    unsafe {
        s.launch(&count, cfg((1, 1, 1), (max_threads, 1, 1), 0))
            .arg(&mut counts)
            .launch()
    }
    .ctx("block of the device's maximum")?;
    let got = gpu.dtoh(&counts).ctx("dtoh")?;
    ensure!(
        got == [max_threads],
        "{got:?} threads ran, want {max_threads}"
    );
    Ok(())
}

/// Grids over the device's y, z (and x, where u32 can exceed it) limits are typed errors.
fn launch_limit_grid_dims() -> R {
    use gpubind::DeviceAttribute as A;
    let dev = dev0()?;
    let gy = dev_attr(&dev, A::MaxGridDimY)?;
    let gz = dev_attr(&dev, A::MaxGridDimZ)?;
    let gx = dev_attr(&dev, A::MaxGridDimX)?;
    ensure!(gy == 65535 && gz == 65535, "grid limits y {gy}, z {gz}");
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(LIMITS, "limits.cu").ctx("compile")?;
    let count = module.function("count_threads").ctx("function")?;
    let s = gpu.default_stream();
    let mut out = gpu.alloc_zeros::<u32>(4).ctx("alloc")?;
    let cases = [
        (
            (1, 65536, 1),
            "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y",
            65536u64,
            u64::from(gy),
        ),
        (
            (1, 1, 65536),
            "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z",
            65536,
            u64::from(gz),
        ),
    ];
    for (grid, name, requested, limit) in cases {
        // SAFETY: refused before the driver is called.
        let e = unsafe {
            s.launch(&count, cfg(grid, (1, 1, 1), 0))
                .arg(&mut out)
                .launch()
        };
        expect_limit(e, "count_threads", name, requested, limit)?;
    }
    if let Some(x) = gx.checked_add(1) {
        // SAFETY: refused before the driver is called.
        let e = unsafe {
            s.launch(&count, cfg((x, 1, 1), (1, 1, 1), 0))
                .arg(&mut out)
                .launch()
        };
        expect_limit(
            e,
            "count_threads",
            "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X",
            x.into(),
            gx.into(),
        )?;
    }
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")?.iter().all(|&v| v == 0),
        "a refused launch ran"
    );
    // SAFETY: (unsigned*) matches; 2x2x1 blocks of one thread write out[0..4].
    unsafe {
        s.launch(&count, cfg((2, 2, 1), (1, 1, 1), 0))
            .arg(&mut out)
            .launch()
    }
    .ctx("small grid after the refusals")?;
    ensure!(gpu.dtoh(&out).ctx("dtoh")? == [1; 4], "small grid");
    Ok(())
}

/// Shared memory over the device's opt-in ceiling, and over the kernel's dynamic limit
/// before it opted in, are typed errors; nothing runs.
fn launch_limit_shared_memory() -> R {
    use gpubind::DeviceAttribute as A;
    use sys::CUfunction_attribute as F;
    let dev = dev0()?;
    let optin = dev_attr(&dev, A::MaxSharedMemoryPerBlockOptin)?;
    let per_block = dev_attr(&dev, A::MaxSharedMemoryPerBlock)?;
    ensure!(
        optin > per_block + 4096,
        "opt-in {optin} bytes, default {per_block}: the test needs an opt-in above the default"
    );
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(LIMITS, "limits.cu").ctx("compile")?;
    let fill = module.function("fill_shared").ctx("function")?;
    let static_shared = func_attr(&fill, F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
    let dyn_default = func_attr(&fill, F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
    println!(
        "    opt-in {optin} B, default {per_block} B, kernel static {static_shared} B, \
         kernel dynamic limit {dyn_default} B"
    );
    let s = gpu.default_stream();
    let mut out = gpu.alloc_zeros::<u32>(2).ctx("alloc")?;
    // Over the opt-in ceiling: nothing can make it fit.
    let over = optin - static_shared + 4;
    let words = over / 4;
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        s.launch(&fill, cfg((1, 1, 1), (128, 1, 1), over))
            .arg(&mut out)
            .arg(&words)
            .launch()
    };
    expect_limit(
        e,
        "fill_shared",
        "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
        u64::from(optin) + 4,
        optin.into(),
    )?;
    // Over the default, within the opt-in, but the kernel has not opted in.
    let mid = per_block + 4096;
    ensure!(
        static_shared + mid <= optin && mid > dyn_default,
        "the kernel's default dynamic limit {dyn_default} already allows {mid} bytes, or \
         {static_shared} static + {mid} is over the opt-in"
    );
    let words = mid / 4;
    // SAFETY: refused before the driver is called.
    let e = unsafe {
        s.launch(&fill, cfg((1, 1, 1), (128, 1, 1), mid))
            .arg(&mut out)
            .arg(&words)
            .launch()
    };
    expect_limit(
        e,
        "fill_shared",
        "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
        mid.into(),
        dyn_default.into(),
    )?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")? == [0, 0],
        "a refused launch ran"
    );
    Ok(())
}

/// The largest valid configurations still launch and compute: a block of the device's
/// maximum threads over the maximal y grid, maximal z blocks and grid, and all of the
/// opt-in shared memory once the kernel opts in (the opt-in is read at launch time).
fn launch_limit_maximal_config_launches() -> R {
    use gpubind::DeviceAttribute as A;
    use sys::CUfunction_attribute as F;
    let dev = dev0()?;
    let max_threads = dev_attr(&dev, A::MaxThreadsPerBlock)?;
    let (by, bz) = (
        dev_attr(&dev, A::MaxBlockDimY)?,
        dev_attr(&dev, A::MaxBlockDimZ)?,
    );
    let (gy, gz) = (
        dev_attr(&dev, A::MaxGridDimY)?,
        dev_attr(&dev, A::MaxGridDimZ)?,
    );
    let optin = dev_attr(&dev, A::MaxSharedMemoryPerBlockOptin)?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(LIMITS, "limits.cu").ctx("compile")?;
    let count = module.function("count_threads").ctx("function")?;
    let fill = module.function("fill_shared").ctx("function")?;
    let s = gpu.default_stream();
    // Maximal block (in x) over the maximal grid in y.
    let kmax = func_attr(&count, F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
    let threads = max_threads.min(kmax);
    let mut per_block = gpu.alloc_zeros::<u32>(gy as usize).ctx("alloc")?;
    // SAFETY: (unsigned*) matches; block b adds to per_block[b], b < gy.
    unsafe {
        s.launch(&count, cfg((1, gy, 1), (threads, 1, 1), 0))
            .arg(&mut per_block)
            .launch()
    }
    .ctx("maximal y grid of maximal blocks")?;
    let got = gpu.dtoh(&per_block).ctx("dtoh")?;
    if let Some((b, v)) = got.iter().enumerate().find(|(_, v)| **v != threads) {
        return Err(format!(
            "block {b} of {gy}: {v} threads ran, want {threads}"
        ));
    }
    // Maximal z block over the maximal z grid; maximal y block.
    let mut per_block = gpu.alloc_zeros::<u32>(gz as usize).ctx("alloc")?;
    // SAFETY: as above; block b < gz.
    unsafe {
        s.launch(&count, cfg((1, 1, gz), (1, 1, bz.min(threads)), 0))
            .arg(&mut per_block)
            .launch()
    }
    .ctx("maximal z grid of maximal z blocks")?;
    let got = gpu.dtoh(&per_block).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == bz.min(threads)),
        "z: some block ran other than {} threads",
        bz.min(threads)
    );
    let mut one = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    // SAFETY: as above; one block.
    unsafe {
        s.launch(&count, cfg((1, 1, 1), (1, by.min(threads), 1), 0))
            .arg(&mut one)
            .launch()
    }
    .ctx("maximal y block")?;
    ensure!(
        gpu.dtoh(&one).ctx("dtoh")? == [by.min(threads)],
        "y block count"
    );
    // All of the opt-in shared memory, after the kernel opts in through the raw handle.
    let static_shared = func_attr(&fill, F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
    let dynamic = optin - static_shared;
    // SAFETY: a live function of the current context; the driver checks the value.
    let r = unsafe {
        sys::cuFuncSetAttribute(
            fill.raw(),
            F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            dynamic as i32,
        )
    };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuFuncSetAttribute: {r:?}"
    );
    let words = dynamic / 4;
    let fthreads = max_threads.min(func_attr(
        &fill,
        F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    )?);
    let mut out = gpu.alloc_zeros::<u32>(2).ctx("alloc")?;
    // SAFETY: (unsigned*, unsigned) matches; the kernel touches s[0..words), inside the
    // `dynamic` bytes given, and out[0..2).
    unsafe {
        s.launch(&fill, cfg((1, 1, 1), (fthreads, 1, 1), dynamic))
            .arg(&mut out)
            .arg(&words)
            .launch()
    }
    .ctx("all of the opt-in shared memory")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got == [0, (words - 1) * 3 + 1],
        "shared memory of {dynamic} bytes: {got:?} (mismatches, last word)"
    );
    println!("    {threads}x{gy} blocks, {dynamic} B dynamic shared memory launched");
    Ok(())
}

fn main() {
    match child_role().as_deref() {
        Some("enumerate") => std::process::exit(child_enumerate().map(|_| 0).unwrap_or_else(|e| {
            eprintln!("child: {e}");
            1
        })),
        Some("release") => std::process::exit(child_release().map(|_| 0).unwrap_or_else(|e| {
            eprintln!("child: {e}");
            1
        })),
        _ => {}
    }
    run_suite(
        "gpu_core",
        &[
            (
                "enumeration_creates_no_context",
                enumeration_creates_no_context,
            ),
            (
                "last_arc_releases_primary_context",
                last_arc_releases_primary_context,
            ),
            ("roundtrip_sizes_and_types", roundtrip_sizes_and_types),
            ("views_and_memset", views_and_memset),
            (
                "htod_copy_is_visible_to_other_streams",
                htod_copy_is_visible_to_other_streams,
            ),
            ("saxpy_matches_cpu", saxpy_matches_cpu),
            (
                "streams_and_events_order_work",
                streams_and_events_order_work,
            ),
            (
                "drop_leaves_current_context_unchanged",
                drop_leaves_current_context_unchanged,
            ),
            (
                "bind_checks_the_current_context",
                bind_checks_the_current_context,
            ),
            ("errors_for_bad_input", errors_for_bad_input),
            ("wrong_device_is_an_error", wrong_device_is_an_error),
            (
                "one_thread_many_gpus_and_module_reuse",
                one_thread_many_gpus_and_module_reuse,
            ),
            ("thread_per_gpu_with_scope", thread_per_gpu_with_scope),
            (
                "launch_limit_threads_per_block",
                launch_limit_threads_per_block,
            ),
            ("launch_limit_grid_dims", launch_limit_grid_dims),
            ("launch_limit_shared_memory", launch_limit_shared_memory),
            (
                "launch_limit_maximal_config_launches",
                launch_limit_maximal_config_launches,
            ),
        ],
    );
}
