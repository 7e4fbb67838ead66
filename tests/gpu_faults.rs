//! GPU tests of fault handling: a kernel that faults poisons its context (a sticky
//! error); gpubind reports it as `Error::ContextPoisoned` naming the kernel, refuses later
//! calls into the context, leaks instead of touching it in drops, and recovers once every
//! value of the device is gone. Each case runs in a child process: a poisoned context is
//! per process. Without a driver: one SKIPPED line.

#[macro_use]
mod common;

use common::{Ctx, SPIN, child_role, run_suite};
use gpubind::{Device, DriverErrorCode, Error, LaunchConfig, ThreadContext};
use std::process::Command;

type R = Result<(), String>;

const NULL_WRITE: &str = r#"
extern "C" __global__ void write_null(unsigned long long p) {
    *(volatile unsigned*)p = 1u;
}
"#;

/// Runs this binary again as `role`, echoing its output line by line (so a hang shows how
/// far it got); returns its stdout, or the failure.
fn run_child(role: &str) -> Result<String, String> {
    run_child_with(role, &[])
}

/// [`run_child`] with extra environment variables.
fn run_child_with(role: &str, env: &[(&str, &str)]) -> Result<String, String> {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ctx("spawn child")?;
    let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut stdout = String::new();
    for line in out.lines() {
        let line = line.ctx("read child")?;
        println!("    child: {line}");
        stdout += &line;
        stdout.push('\n');
    }
    let status = child.wait().ctx("wait child")?;
    ensure!(
        status.success(),
        "child {role} failed ({status}):\n{stdout}"
    );
    Ok(stdout)
}

fn expect_poisoned(e: &Error, what: &str) -> R {
    match e {
        Error::ContextPoisoned {
            device: 0,
            first_call,
            code,
            kernel,
            ..
        } => {
            ensure!(
                *code == DriverErrorCode::ILLEGAL_ADDRESS,
                "{what}: code {code:?}"
            );
            ensure!(
                kernel.as_deref() == Some("write_null"),
                "{what}: kernel {kernel:?}"
            );
            ensure!(
                *first_call == "cuStreamSynchronize",
                "{what}: first call {first_call}"
            );
            Ok(())
        }
        other => Err(format!("{what}: expected ContextPoisoned, got {other}")),
    }
}

/// The child: fault, check every later call is typed, drop everything, recover.
fn child_poison() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let module = gpu.compile_and_load(NULL_WRITE, "null.cu").ctx("compile")?;
        let f = module.function("write_null").ctx("function")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let buf = gpu.clone_htod(&[1u32; 16]).ctx("htod")?;
        let s = gpu.on(&stream).ctx("on")?;
        let null = 0u64;
        // SAFETY: deliberately not: the kernel writes through a null pointer, which the
        // device reports as a sticky error; nothing on the host is touched.
        unsafe {
            s.launch(&f, LaunchConfig::for_num_elems(1))
                .arg(&null)
                .launch()
        }
        .ctx("launch")?;
        println!("launched write_null");
        let e = s.synchronize().err().ok_or("a null write did not fault")?;
        println!("first error: {e}");
        expect_poisoned(&e, "synchronize")?;
        ensure!(dev.is_poisoned(), "the device is not marked poisoned");
        ensure!(e.to_string().contains("write_null"), "message: {e}");
        let e = gpu
            .alloc_zeros::<u32>(4)
            .err()
            .ok_or("alloc on a poisoned context worked")?;
        expect_poisoned(&e, "alloc_zeros")?;
        let e = gpu
            .dtoh(&buf)
            .err()
            .ok_or("dtoh on a poisoned context worked")?;
        expect_poisoned(&e, "dtoh")?;
        let e = gpu
            .new_stream()
            .err()
            .ok_or("new_stream on a poisoned context worked")?;
        expect_poisoned(&e, "new_stream")?;
        println!("later calls: typed ContextPoisoned");
        println!("dropping the device's values");
    } // buffers, stream, module: dropped without touching the context (leaked)
    println!("dropped");
    let e = ctx
        .bind(&dev)
        .err()
        .ok_or("bind of a poisoned device worked")?;
    expect_poisoned(&e, "bind")?;
    drop(dev); // the last Arc<Device>: gpubind's retain is released
    println!("released the device");
    // The driver keeps a faulted primary context: reset it (nothing else in this process
    // uses device 0).
    // SAFETY: no other code in this child process uses device 0's primary context.
    unsafe { Device::reset_primary_context(0) }.ctx("reset_primary_context")?;
    println!("reset the primary context");
    let dev = Device::get(0).ctx("Device::get again")?;
    ensure!(!dev.is_poisoned(), "a fresh Device starts healthy");
    let gpu = match ctx.bind(&dev) {
        Ok(gpu) => gpu,
        // CUDA documents sticky errors as fatal to the process ("the process must be
        // terminated and relaunched"): the retain reports it again. That must be typed,
        // mark the new device poisoned, and leave the process able to exit cleanly.
        Err(e @ Error::ContextPoisoned { .. }) => {
            ensure!(
                dev.is_poisoned(),
                "the retain's sticky error did not poison"
            );
            println!("NEW PROCESS REQUIRED: {e}");
            return Ok(());
        }
        Err(e) => return Err(format!("bind after reset: untyped {e}")),
    };
    println!("bound again");
    let back = gpu
        .dtoh(&gpu.clone_htod(&[5u32; 1024]).ctx("htod")?)
        .ctx("dtoh")?;
    ensure!(back == [5u32; 1024], "round trip after recovery");
    println!("RECOVERED");
    Ok(())
}

fn poisoned_context_is_typed_and_recovers() -> R {
    let out = run_child("poison")?;
    ensure!(
        out.contains("RECOVERED") || out.contains("NEW PROCESS REQUIRED"),
        "the child neither recovered nor reported the process-wide fault"
    );
    // Recovery by a new process: this one (which never faulted) works.
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let back = gpu
        .dtoh(&gpu.clone_htod(&[9u32; 256]).ctx("htod")?)
        .ctx("dtoh")?;
    ensure!(back == [9u32; 256], "a new process after the fault works");
    Ok(())
}

/// Whether `ptr` is still a live device allocation (`cuMemGetAddressRange` finds it): a
/// leaked buffer is, a freed one is not.
fn still_mapped(ptr: u64) -> bool {
    use gpubind::cudarc::driver::sys;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes one address and one size; the caller's context is current.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
    r == sys::CUresult::CUDA_SUCCESS && base <= ptr && ptr < base + size as u64
}

/// Launches `spin_then_write(p, ns)` on `s`.
fn spin<A: gpubind::KernelArg + ?Sized>(
    s: &gpubind::BoundStream<'_>,
    f: &gpubind::Function<'_>,
    p: &A,
    ns: u64,
) -> R {
    // SAFETY: (unsigned*, unsigned long long) as the kernel declares; it writes one u32
    // into `p`, which holds at least one.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(1))
            .arg_written(p)
            .arg(&ns)
            .launch()
    }
    .ctx("launch spin_then_write")
}

/// The child, with `GPUBIND_DROP_TIMEOUT=1`: drops while a kernel spins for 6 s.
/// - 50 device buffers whose last use is queued behind the kernel: the first drop gives
///   up after about 1 s, the 49 others at once (one limit per stream); all 50 stay mapped
///   (leaked, not freed under the kernel).
/// - an owned registered `Vec` the kernel writes: `into_vec` gives `None` (leaked).
/// - a `Communicator` whose lane runs a second spinning kernel: its drop returns after
///   about 1 s more (its own stream's limit).
/// - the module the kernels run from: leaked, not unloaded.
///
/// Then the kernels finish and the process exits cleanly.
fn child_bounded_drop() -> R {
    use std::time::{Duration, Instant};
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    #[cfg(feature = "collective")]
    let comm = gpubind::collective::Communicator::new(
        &mut ctx,
        std::slice::from_ref(&dev),
        gpubind::collective::CommOptions::kernels(),
    )
    .ctx("communicator")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let ns: u64 = 6_000_000_000;
    let mut bufs = Vec::new();
    for _ in 0..50 {
        bufs.push(gpu.alloc_zeros::<u32>(1).ctx("alloc")?);
    }
    spin(&s, &f, &bufs[0], ns)?;
    for b in &mut bufs[1..] {
        s.memset_async(b, 5u32)
            .ctx("memset_async behind the kernel")?;
    }
    let owned = gpu
        .register_vec(vec![0u32; 16], gpubind::RegisterOptions::default())
        .ctx("register_vec")?;
    spin(&s, &f, &owned, 0)?; // queued behind the first kernel
    #[cfg(feature = "collective")]
    let lane_buf = {
        let lane = comm.stream(0).ok_or("no lane 0")?;
        let b = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
        spin(&gpu.on(lane).ctx("on lane")?, &f, &b, ns)?;
        b
    };
    // SAFETY: the addresses are only compared and queried, never dereferenced.
    let ptrs: Vec<u64> = bufs.iter().map(|b| unsafe { b.raw_ptr() }).collect();

    let t = Instant::now();
    drop(bufs);
    let buffers_took = t.elapsed();
    println!("50 buffer drops returned after {buffers_took:?} with the kernel still running");
    ensure!(
        buffers_took >= Duration::from_millis(900) && buffers_took < Duration::from_secs(3),
        "50 drops took {buffers_took:?}, expected about 1 s in all (GPUBIND_DROP_TIMEOUT=1, one \
         limit per stream)"
    );
    let leaked = ptrs.iter().filter(|&&p| still_mapped(p)).count();
    ensure!(
        leaked == 50,
        "only {leaked} of 50 buffers are still mapped: freed under the kernel"
    );
    ensure!(
        owned_into_vec_is_none(owned),
        "into_vec of a registered Vec still written by the device gave it back"
    );
    #[cfg(feature = "collective")]
    {
        let t = Instant::now();
        drop(comm);
        let comm_took = t.elapsed();
        println!("Communicator drop returned after {comm_took:?}");
        // About 1 s for its lane, and at most about 1 s more for a release call that
        // waits for the whole device (crate::teardown::release): bounded either way.
        ensure!(
            comm_took >= Duration::from_millis(900) && comm_took < Duration::from_millis(3500),
            "Communicator drop took {comm_took:?}, expected 1 to 2 s"
        );
        drop(lane_buf);
    }
    s.synchronize().ctx("the kernel finishes")?;
    gpu.synchronize().ctx("every kernel finishes")?;
    // The stream a wait gave up on is waited for normally again once the work it gave up
    // on has ended: a borrowed registration written by a 50 ms kernel on it is waited for
    // (neither given up on at once, which would abort, nor returned early).
    let mut mine = vec![0u32; 16];
    {
        let reg = gpu
            .register_host(&mut mine, gpubind::RegisterOptions::default())
            .ctx("register_host")?;
        spin(&s, &f, &reg, 50_000_000)?;
        drop(reg);
    }
    ensure!(
        mine[0] == 7,
        "the registration came back before the kernel wrote it: {}",
        mine[0]
    );
    drop(f);
    drop(module);
    ensure!(
        ptrs.iter().all(|&p| still_mapped(p)),
        "a leaked buffer was freed later"
    );
    println!("kernel finished; exiting");
    Ok(())
}

fn owned_into_vec_is_none(owned: gpubind::RegisteredHost<'static, u32>) -> bool {
    owned.into_vec().is_none()
}

/// Binds device 0, loads [`SPIN`] and makes a stream, then runs `body` with them.
fn with_spinner(
    body: impl FnOnce(&gpubind::BoundDevice<'_>, &gpubind::Function<'_>, &gpubind::BoundStream<'_>) -> R,
) -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    body(&gpu, &f, &s)
}

/// The child: a kernel spins for 4 s, then writes a *borrowed* registered range, which
/// is dropped at once with `GPUBIND_DROP_TIMEOUT=1`. The pages go back to their owner
/// when the drop returns, so gpubind must abort rather than return.
fn child_borrowed_registration_aborts() -> R {
    with_spinner(|gpu, f, s| {
        let mut mine = vec![0u32; 16];
        let reg = gpu
            .register_host(&mut mine, gpubind::RegisterOptions::default())
            .ctx("register_host")?;
        spin(s, f, &reg, 4_000_000_000)?;
        println!("dropping the registration while the kernel runs");
        drop(reg);
        // Not reached: the drop aborts.
        println!("RETURNED: the pages went back to their owner with the kernel running");
        mine[0] = 1;
        Ok(())
    })
}

/// The child, with `GPUBIND_DROP_TIMEOUT=1`: while a kernel spins for 4 s on one stream,
/// two buffers with no pending use are dropped. `cuMemFree` waits for the whole device
/// (measured: it returns when the kernel ends), so the first drop hands it to the
/// release thread and returns after about 1 s; the second returns at once (the thread is
/// still stuck behind the same kernel). Both are freed once the kernel has ended.
fn child_unrelated_free() -> R {
    use std::time::{Duration, Instant};
    with_spinner(|gpu, f, s| {
        let busy = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
        let first = gpu.alloc_zeros::<u32>(1 << 20).ctx("alloc")?;
        let second = gpu.alloc_zeros::<u32>(1 << 20).ctx("alloc")?;
        // SAFETY: only queried, never dereferenced.
        let ptrs = unsafe { [first.raw_ptr(), second.raw_ptr()] };
        spin(s, f, &busy, 4_000_000_000)?;
        let t = Instant::now();
        drop(first);
        let first_ms = t.elapsed().as_millis();
        let t = Instant::now();
        drop(second);
        let second_ms = t.elapsed().as_millis();
        println!("UNRELATED_FREE_MS {first_ms} {second_ms}");
        s.synchronize().ctx("the kernel finishes")?;
        let t = Instant::now();
        while ptrs.iter().any(|&p| still_mapped(p)) {
            ensure!(
                t.elapsed() < Duration::from_secs(5),
                "the buffers were not freed in the background after the kernel ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        println!("FREED_AFTER_KERNEL_MS {}", t.elapsed().as_millis());
        Ok(())
    })
}

/// A drop of a buffer no pending work uses is bounded even when the driver's free waits
/// for unrelated work (a kernel spinning on another stream), and the memory is freed once
/// that work ends.
fn unrelated_drop_is_bounded_and_frees_later() -> R {
    let out = run_child_with("unrelated_free", &[("GPUBIND_DROP_TIMEOUT", "1")])?;
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("UNRELATED_FREE_MS "))
        .ok_or_else(|| format!("no timing in child output:\n{out}"))?;
    let ms: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().map_err(|e| format!("{x}: {e}")))
        .collect::<Result<_, _>>()?;
    ensure!(ms.len() == 2, "timings: {line}");
    ensure!(
        (900..2500).contains(&ms[0]),
        "first drop took {} ms, expected about 1000 (GPUBIND_DROP_TIMEOUT=1)",
        ms[0]
    );
    ensure!(
        ms[1] < 300,
        "second drop took {} ms: it waited although the release thread was stuck",
        ms[1]
    );
    ensure!(
        out.contains("FREED_AFTER_KERNEL_MS"),
        "child output:\n{out}"
    );
    Ok(())
}

/// A drop never blocks without bound: past `GPUBIND_DROP_TIMEOUT` it leaks instead, one
/// limit per stream.
fn drop_after_a_long_kernel_is_bounded() -> R {
    let out = run_child_with("bounded_drop", &[("GPUBIND_DROP_TIMEOUT", "1")])?;
    ensure!(out.contains("kernel finished"), "child output:\n{out}");
    Ok(())
}

/// What cannot be leaked is not returned to its owner under a running kernel either: the
/// process aborts, with the reason on stderr.
fn borrowed_registration_past_the_limit_aborts() -> R {
    use std::os::unix::process::ExitStatusExt;
    let out = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", "borrowed_abort")
        .env("GPUBIND_DROP_TIMEOUT", "1")
        .output()
        .ctx("run child")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("    child stdout: {stdout}\n    child stderr: {stderr}");
    ensure!(
        out.status.signal() == Some(6),
        "expected SIGABRT, got {:?}",
        out.status
    );
    ensure!(!stdout.contains("RETURNED"), "the drop returned");
    ensure!(
        stderr.contains("RegisteredHost<u32> of 16 elements")
            && stderr.contains("aborts the process"),
        "stderr does not name the registration and the abort:\n{stderr}"
    );
    Ok(())
}

fn main() {
    let exit = |r: R| {
        std::process::exit(r.map(|_| 0).unwrap_or_else(|e| {
            println!("child error: {e}");
            1
        }))
    };
    match child_role().as_deref() {
        Some("poison") => exit(child_poison()),
        Some("bounded_drop") => exit(child_bounded_drop()),
        Some("borrowed_abort") => exit(child_borrowed_registration_aborts()),
        Some("unrelated_free") => exit(child_unrelated_free()),
        _ => {}
    }
    run_suite(
        "gpu_faults",
        &[
            (
                "poisoned_context_is_typed_and_recovers",
                poisoned_context_is_typed_and_recovers,
            ),
            (
                "drop_after_a_long_kernel_is_bounded",
                drop_after_a_long_kernel_is_bounded,
            ),
            (
                "borrowed_registration_past_the_limit_aborts",
                borrowed_registration_past_the_limit_aborts,
            ),
            (
                "unrelated_drop_is_bounded_and_frees_later",
                unrelated_drop_is_bounded_and_frees_later,
            ),
        ],
    )
}
