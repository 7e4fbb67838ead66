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
fn spin<A: gpubind::WritableArg + ?Sized>(
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
/// - an owned registered `Vec` the kernel writes: `into_vec` gives the registration back
///   with `Timeout`; after the kernel, `into_vec` gives the `Vec` with its write.
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
    // into_vec of a registered Vec the device still writes gives the registration back
    // (its wait gives up at once: the stream's limit is spent), to reclaim later.
    let owned = match owned.into_vec() {
        Err(given) if matches!(given.error, gpubind::Error::Timeout { .. }) => given.input,
        Err(given) => return Err(format!("into_vec behind the kernel: {given}")),
        Ok(v) => {
            return Err(format!(
                "into_vec of a registered Vec still written by the device returned {:?}",
                v.map(|v| v.len())
            ));
        }
    };
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
    let v = owned
        .into_vec()
        .ctx("into_vec after the kernel")?
        .ok_or("into_vec after the kernel gave no Vec")?;
    ensure!(
        v[0] == 7,
        "the registered Vec came back without the kernel's write: {}",
        v[0]
    );
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

/// The operation the fault-without-synchronise child calls first
/// (`GPUBIND_FIRST_OP`), so that every operation is, in one run, the first to meet the
/// driver's sticky error.
const FIRST_OP_ENV: &str = "GPUBIND_FIRST_OP";

/// What an operation of the core must return once a kernel faulted: the device's poison
/// (`Error::ContextPoisoned` with the fault's code and kernel), never the bare
/// `Error::Driver` of the sticky code. Before gpubind has seen the fault, an operation the
/// driver lets through (`Ok`) is allowed; after, none is.
fn expect_poisoned_by_fault(name: &str, r: gpubind::Result<()>, poisoned_before: bool) -> R {
    match r {
        Ok(()) if !poisoned_before => {
            println!("op {name}: Ok (the driver did not report the fault to this call)");
            Ok(())
        }
        Ok(()) => Err(format!("op {name}: Ok on a poisoned device")),
        Err(Error::ContextPoisoned {
            device: 0,
            first_call,
            code,
            kernel,
            ..
        }) => {
            ensure!(
                code == DriverErrorCode::ILLEGAL_ADDRESS,
                "op {name}: poisoned with {code:?}"
            );
            ensure!(
                kernel.as_deref() == Some("write_null"),
                "op {name}: the poison names kernel {kernel:?}"
            );
            println!("op {name}: ContextPoisoned (first reported by {first_call})");
            Ok(())
        }
        Err(other) => Err(format!(
            "op {name}: expected ContextPoisoned, got {other:?}"
        )),
    }
}

/// Waits, without gpubind, until the driver reports `stream`'s fault (a raw
/// `cuStreamQuery`): gpubind has not seen it when this returns.
fn wait_for_fault_unseen(stream: &gpubind::BoundStream<'_>) -> R {
    use gpubind::cudarc::driver::sys;
    let t = std::time::Instant::now();
    loop {
        // SAFETY: a live stream of the current context; the query only reads its state.
        let r = unsafe { sys::cuStreamQuery(stream.raw()) };
        match r {
            sys::CUresult::CUDA_ERROR_NOT_READY => {}
            sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => return Ok(()),
            other => return Err(format!("the faulting kernel ended with {other:?}")),
        }
        ensure!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "the null write did not fault within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The child: faults a kernel without synchronising, then calls every public operation
/// of the core, starting with operation `GPUBIND_FIRST_OP`, twice round; each must be
/// `ContextPoisoned` (the first round may see `Ok` until some call meets the fault).
/// Then drops everything (leaked, not freed: no hang, no panic) and checks a new
/// binding is refused.
fn child_fault_unsynced() -> R {
    use gpubind::{EventFlags, PinnedOptions, RegisterOptions};
    use std::cell::RefCell;
    let first: usize = std::env::var(FIRST_OP_ENV)
        .ctx(FIRST_OP_ENV)?
        .parse()
        .ctx(FIRST_OP_ENV)?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let module = gpu.compile_and_load(NULL_WRITE, "null.cu").ctx("compile")?;
        let f = module.function("write_null").ctx("function")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let event = gpu.new_event(false).ctx("event")?;
        let src = gpu.clone_htod(&[1u32; 16]).ctx("htod")?;
        let dst = RefCell::new(gpu.alloc_zeros::<u32>(16).ctx("alloc")?);
        let host = RefCell::new(vec![0u32; 16]);
        let graph_buf = gpu.alloc_zeros::<u32>(16).ctx("alloc")?;
        let exec = gpu
            .capture(|c| c.memset_zeros(&graph_buf))
            .ctx("capture")?
            .instantiate()
            .ctx("instantiate")?;
        let capture_buf = gpu.alloc_zeros::<u32>(16).ctx("alloc")?;
        let null = 0u64;
        let launch = || {
            // SAFETY: deliberately not: the kernel writes through a null pointer, which
            // the device reports as a sticky error; nothing on the host is touched.
            unsafe {
                s.launch(&f, LaunchConfig::for_num_elems(1))
                    .arg(&null)
                    .launch()
            }
        };
        type Op<'a> = (&'static str, Box<dyn Fn() -> gpubind::Result<()> + 'a>);
        let ops: Vec<Op<'_>> = vec![
            // SAFETY: the uninitialised elements are never read.
            (
                "alloc",
                Box::new(|| unsafe { gpu.alloc::<u32>(16) }.map(drop)),
            ),
            (
                "alloc_zeros",
                Box::new(|| gpu.alloc_zeros::<u32>(16).map(drop)),
            ),
            (
                "clone_htod",
                Box::new(|| gpu.clone_htod(&[2u32; 16]).map(drop)),
            ),
            (
                "htod_copy",
                Box::new(|| gpu.htod_copy(&[3u32; 16], &mut *dst.borrow_mut())),
            ),
            ("dtoh", Box::new(|| gpu.dtoh(&src).map(drop))),
            (
                "dtoh_into",
                Box::new(|| gpu.dtoh_into(&src, &mut host.borrow_mut())),
            ),
            ("dtod", Box::new(|| gpu.dtod(&src, &mut *dst.borrow_mut()))),
            ("clone_dtod", Box::new(|| gpu.clone_dtod(&src).map(drop))),
            (
                "memset",
                Box::new(|| gpu.memset(&mut *dst.borrow_mut(), 7u32)),
            ),
            (
                "memset_zeros",
                Box::new(|| gpu.memset_zeros(&mut *dst.borrow_mut())),
            ),
            ("copy", Box::new(|| gpu.copy(&src, &mut *host.borrow_mut()))),
            ("memory_info", Box::new(|| gpu.memory_info().map(drop))),
            ("synchronize", Box::new(|| gpu.synchronize())),
            ("new_stream", Box::new(|| gpu.new_stream().map(drop))),
            (
                "new_stream_with_priority",
                Box::new(|| gpu.new_stream_with_priority(0).map(drop)),
            ),
            (
                "stream_priority_range",
                Box::new(|| gpu.stream_priority_range().map(drop)),
            ),
            ("new_event", Box::new(|| gpu.new_event(true).map(drop))),
            (
                "new_event_with",
                Box::new(|| gpu.new_event_with(EventFlags::new()).map(drop)),
            ),
            ("record", Box::new(|| s.record(&event))),
            ("wait", Box::new(|| s.wait(&event))),
            ("event_synchronize", Box::new(|| event.synchronize())),
            (
                "event_is_complete",
                Box::new(|| event.is_complete().map(drop)),
            ),
            ("stream_priority", Box::new(|| stream.priority().map(drop))),
            ("stream_synchronize", Box::new(|| s.synchronize())),
            (
                "memset_async",
                Box::new(|| s.memset_async(&mut *dst.borrow_mut(), 9u32)),
            ),
            (
                "memset_zeros_async",
                Box::new(|| s.memset_zeros_async(&mut *dst.borrow_mut())),
            ),
            (
                "dtod_async",
                Box::new(|| s.dtod_async(&src, &mut *dst.borrow_mut())),
            ),
            // SAFETY: pageable host memory: the driver stages the copy before returning.
            (
                "htod_async",
                Box::new(|| unsafe { s.htod_async(&host.borrow(), &mut *dst.borrow_mut()) }),
            ),
            // SAFETY: pageable host memory: the copy completes before returning.
            (
                "dtoh_async",
                Box::new(|| unsafe { s.dtoh_async(&src, &mut host.borrow_mut()) }),
            ),
            (
                "alloc_pinned",
                Box::new(|| {
                    gpu.alloc_pinned::<u32>(16, PinnedOptions::default())
                        .map(drop)
                }),
            ),
            (
                "register_host",
                Box::new(|| {
                    let mut pages = vec![0u32; 1024];
                    gpu.register_host(&mut pages, RegisterOptions::default())
                        .map(drop)
                }),
            ),
            (
                "alloc_managed",
                Box::new(|| gpu.alloc_managed::<u32>(16).map(drop)),
            ),
            (
                "module_load",
                Box::new(|| gpu.compile_and_load(NULL_WRITE, "again.cu").map(drop)),
            ),
            (
                "function",
                Box::new(|| module.function("write_null").map(drop)),
            ),
            ("launch", Box::new(launch)),
            (
                "graph_capture",
                Box::new(|| gpu.capture(|c| c.memset_zeros(&capture_buf)).map(drop)),
            ),
            ("graph_launch", Box::new(|| exec.launch(&s))),
        ];
        ensure!(
            ops.len() == FAULT_OPS,
            "{} operations, FAULT_OPS is {FAULT_OPS}",
            ops.len()
        );
        let first = first % ops.len();
        launch().ctx("launch write_null")?;
        println!("launched write_null; not synchronising");
        wait_for_fault_unseen(&s)?;
        ensure!(!dev.is_poisoned(), "gpubind saw the fault before any call");
        for round in 0..2 {
            for k in 0..ops.len() {
                let (name, op) = &ops[(first + k) % ops.len()];
                let before = round > 0 || dev.is_poisoned();
                expect_poisoned_by_fault(name, op(), before)?;
            }
            ensure!(dev.is_poisoned(), "no operation reported the fault");
        }
        println!("dropping the device's values");
    } // buffers, streams, events, graph, module: dropped without touching the context
    println!("dropped");
    let e = ctx
        .bind(&dev)
        .err()
        .ok_or("bind of a poisoned device worked")?;
    ensure!(matches!(e, Error::ContextPoisoned { .. }), "bind: {e}");
    println!("ALL POISONED");
    Ok(())
}

/// How many operations [`child_fault_unsynced`] calls.
const FAULT_OPS: usize = 37;

/// A kernel faults and nothing synchronises: whichever operation meets the fault first,
/// it and every later one are `ContextPoisoned` (never a bare driver error), in one
/// process; one run per operation as the first, eight processes at a time (a fault
/// poisons only its own process's context).
fn every_operation_after_an_unsynchronised_fault_is_poisoned() -> R {
    let firsts: Vec<usize> = (0..FAULT_OPS).collect();
    for batch in firsts.chunks(8) {
        let runs: Vec<_> = batch
            .iter()
            .map(|&first| {
                std::thread::spawn(move || -> R {
                    let env = [(FIRST_OP_ENV, first.to_string())];
                    let env: Vec<(&str, &str)> =
                        env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let out = run_child_with("fault_unsynced", &env)?;
                    ensure!(
                        out.contains("ALL POISONED"),
                        "first op {first}: child output:\n{out}"
                    );
                    Ok(())
                })
            })
            .collect();
        for run in runs {
            run.join()
                .map_err(|_| "a child runner panicked".to_owned())??;
        }
    }
    Ok(())
}

/// The child: 8 threads each bind device 0 and work (allocations, copies, fills,
/// streams, events, memory queries) until a call fails, while a 9th launches a faulting
/// kernel and does not synchronise. Every worker must end with `ContextPoisoned`.
fn child_fault_threads() -> R {
    use std::sync::{Arc, Barrier};
    let dev = Device::get(0).ctx("Device::get")?;
    let start = Arc::new(Barrier::new(9));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (dev, start) = (Arc::clone(&dev), Arc::clone(&start));
            std::thread::spawn(move || -> R {
                let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                let gpu = ctx.bind(&dev).ctx("bind")?;
                let stream = gpu.new_stream().ctx("stream")?;
                start.wait();
                let t = std::time::Instant::now();
                let mut rounds = 0u64;
                let failed = loop {
                    let s = match gpu.on(&stream) {
                        Ok(s) => s,
                        Err(e) => break e,
                    };
                    let step = (|| -> gpubind::Result<()> {
                        let mut a = gpu.clone_htod(&[w as u32; 256])?;
                        s.memset_async(&mut a, 1u32)?;
                        let b = gpu.clone_dtod(&a)?;
                        gpu.dtoh(&b)?;
                        gpu.memory_info()?;
                        drop(gpu.new_stream()?);
                        drop(gpu.new_event(false)?);
                        s.synchronize()
                    })();
                    if let Err(e) = step {
                        break e;
                    }
                    rounds += 1;
                    if t.elapsed() > std::time::Duration::from_secs(30) {
                        return Err(format!("worker {w}: no error after 30 s"));
                    }
                };
                ensure!(
                    matches!(failed, Error::ContextPoisoned { .. }),
                    "worker {w} after {rounds} rounds: expected ContextPoisoned, got {failed:?}"
                );
                println!("worker {w}: ContextPoisoned after {rounds} rounds");
                Ok(())
            })
        })
        .collect();
    {
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let module = gpu.compile_and_load(NULL_WRITE, "null.cu").ctx("compile")?;
        let f = module.function("write_null").ctx("function")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        start.wait();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let null = 0u64;
        // SAFETY: deliberately not: the kernel writes through a null pointer (a sticky
        // error on the device); nothing on the host is touched.
        unsafe {
            s.launch(&f, LaunchConfig::for_num_elems(1))
                .arg(&null)
                .launch()
        }
        .ctx("launch write_null")?;
        println!("launched write_null; not synchronising");
    }
    for (w, t) in workers.into_iter().enumerate() {
        t.join().map_err(|_| format!("worker {w} panicked"))??;
    }
    ensure!(dev.is_poisoned(), "the device is not marked poisoned");
    println!("ALL WORKERS POISONED");
    Ok(())
}

/// Eight threads at work when a ninth faults: each ends with `ContextPoisoned`.
fn threads_at_work_all_see_the_poison() -> R {
    let out = run_child("fault_threads")?;
    ensure!(out.contains("ALL WORKERS POISONED"), "child output:\n{out}");
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
        Some("fault_unsynced") => exit(child_fault_unsynced()),
        Some("fault_threads") => exit(child_fault_threads()),
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
            (
                "every_operation_after_an_unsynchronised_fault_is_poisoned",
                every_operation_after_an_unsynchronised_fault_is_poisoned,
            ),
            (
                "threads_at_work_all_see_the_poison",
                threads_at_work_all_see_the_poison,
            ),
        ],
    )
}
