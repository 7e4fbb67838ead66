//! GPU tests of fault handling: a kernel that faults poisons its context (a sticky
//! error); gpubind reports it as `Error::ContextPoisoned` naming the kernel, refuses later
//! calls into the context, leaks instead of touching it in drops, and recovers once every
//! value of the device is gone. Each case runs in a child process: a poisoned context is
//! per process. Without a driver: one SKIPPED line.

#[macro_use]
mod common;

use common::{Ctx, child_role, run_suite};
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
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
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

fn main() {
    if let Some("poison") = child_role().as_deref() {
        std::process::exit(child_poison().map(|_| 0).unwrap_or_else(|e| {
            println!("child error: {e}");
            1
        }));
    }
    run_suite(
        "gpu_faults",
        &[(
            "poisoned_context_is_typed_and_recovers",
            poisoned_context_is_typed_and_recovers,
        )],
    )
}
