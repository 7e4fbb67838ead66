//! A tiny harness for GPU test binaries (`harness = false` in Cargo.toml).
//!
//! Each `tests/gpu_*.rs` calls [`run_suite`] from `main`. Without a CUDA driver (or with
//! no device) the whole suite prints ONE line saying it was skipped and why, and exits
//! 0, so `cargo test` passes on a machine without a GPU but never silently: the line is
//! always printed. With a GPU every test runs and the summary line has the same shape as
//! libtest's (`test result: ok. N passed; M failed; …`).
//!
//! `GPUBIND_TEST_FILTER=substr` runs only matching tests. Tests that need a child process
//! re-execute the binary with `GPUBIND_CHILD=<role>`; [`child_role`] reads it.
#![allow(dead_code)]

use std::time::Instant;

pub mod socket_child;

/// CUDA C source of `slow_fill(out, n, value, cycles)`: spins for `cycles` clock ticks,
/// then writes `value` to `out[0..n]` — the slow writer the ordering tests race against.
/// A literal, for `concat!` into a suite's kernel source. (Not every suite uses it: the
/// file's `dead_code` allowance does not cover macros and imports.)
#[allow(unused_macros)]
macro_rules! slow_fill_cuda {
    () => {
        r#"
// Spins for `cycles` clock ticks, then writes `value` to every element.
extern "C" __global__ void slow_fill(unsigned* out, unsigned n, unsigned value, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
"#
    };
}
#[allow(unused_imports)]
pub(crate) use slow_fill_cuda;

/// A test: returns `Err(message)` on failure (panics are caught and count as failures).
/// A test that cannot run on this machine (say it needs 2 GPUs) returns [`skip`]'s
/// error: it is reported as `ignored` with the reason, never as passed.
pub type TestFn = fn() -> Result<(), String>;

/// Whether the GPU tests can run here.
pub enum Availability {
    /// A driver and at least one device: run.
    Ready,
    /// No driver, or a driver that reports no device: print one SKIPPED line.
    Absent(String),
    /// A driver is there but failed: the suite FAILS (a broken driver is not "no GPU").
    Broken(String),
}

/// Decides whether GPU tests run, skip (no driver or no device) or fail (any other error).
pub fn gpu_availability() -> Availability {
    if !gpubind::driver_available() {
        return Availability::Absent("no CUDA driver found (libcuda not loadable)".into());
    }
    match gpubind::Device::count() {
        Ok(0) => Availability::Absent("the CUDA driver reports no device".into()),
        Ok(_) => Availability::Ready,
        Err(gpubind::Error::NoDriver) => {
            Availability::Absent("no CUDA driver found (libcuda not loadable)".into())
        }
        Err(gpubind::Error::Driver {
            code: gpubind::DriverErrorCode::NO_DEVICE,
            ..
        }) => Availability::Absent("cuInit: no CUDA-capable device".into()),
        Err(e) => Availability::Broken(format!("CUDA init failed: {e}")),
    }
}

/// Why GPU tests cannot run here, or `None` if they can (a broken driver counts as
/// "can": the suite then runs and its tests fail with the driver's error).
pub fn gpu_unavailable() -> Option<String> {
    match gpu_availability() {
        Availability::Absent(why) => Some(why),
        Availability::Ready | Availability::Broken(_) => None,
    }
}

/// Seconds one test may run before the suite fails (`GPUBIND_TEST_TIMEOUT`, default 120).
fn test_timeout() -> std::time::Duration {
    let secs = std::env::var("GPUBIND_TEST_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(120);
    std::time::Duration::from_secs(secs)
}

/// The error for a `GPUBIND_TEST_FILTER` that matches none of `tests` (checked before
/// anything else, GPU or not: a typo must fail, not look green).
pub fn filter_error(suite: &str, tests: &[(&str, TestFn)], filter: Option<&str>) -> Option<String> {
    let flt = filter?;
    (!tests.iter().any(|(name, _)| name.contains(flt))).then(|| {
        format!(
            "{suite}: FAILED: GPUBIND_TEST_FILTER={flt:?} matches none of its {} tests",
            tests.len()
        )
    })
}

/// Runs `f` on its own thread; `Err` if it panics or runs past `limit` (then the whole
/// process is about to exit: a hung test cannot be stopped, only reported).
pub fn run_with_timeout(f: TestFn, limit: std::time::Duration) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpu-test".into())
        .spawn(move || {
            let outcome = std::panic::catch_unwind(f).unwrap_or_else(|p| {
                Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()))
            });
            let _ = tx.send(outcome);
        })
        .map_err(|e| format!("could not start the test thread: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(outcome) => outcome,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "{TIMEOUT}{} s (GPUBIND_TEST_TIMEOUT)",
            limit.as_secs()
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err("the test thread ended without a result".into())
        }
    }
}

const TIMEOUT: &str = "timed out after ";

/// Runs `tests` (or prints one skip line) and exits the process with the outcome.
///
/// * No driver or no device: one `SKIPPED` line, exit 0. Any other driver failure: the
///   suite fails.
/// * `GPUBIND_TEST_FILTER=substr` runs only matching tests; a filter that matches none
///   fails the suite (a typo must not look green).
/// * Each test runs under a timeout (`GPUBIND_TEST_TIMEOUT` seconds, default 120); a
///   test past it fails the suite at once.
/// * A test that cannot run here (needs 2 GPUs, needs NCCL) returns [`skip`]'s error and
///   is reported `ignored (SKIPPED: why)`, never as passed.
pub fn run_suite(suite: &str, tests: &[(&str, TestFn)]) -> ! {
    let filter = std::env::var("GPUBIND_TEST_FILTER").ok();
    if let Some(why) = filter_error(suite, tests, filter.as_deref()) {
        println!("{why}");
        println!(
            "\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; {} filtered out; finished in 0.00s\n",
            tests.len()
        );
        std::process::exit(1);
    }
    match gpu_availability() {
        Availability::Absent(why) => {
            println!(
                "SKIPPED {suite}: all {} GPU tests skipped: {why}",
                tests.len()
            );
            std::process::exit(0);
        }
        Availability::Broken(why) => {
            println!("{suite}: FAILED before any test: {why}");
            println!(
                "\ntest result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n"
            );
            std::process::exit(1);
        }
        Availability::Ready => {}
    }
    let limit = test_timeout();
    let start = Instant::now();
    let (mut passed, mut failed, mut filtered, mut ignored) = (0, 0, 0, 0);
    println!("\nrunning {} tests ({suite})", tests.len());
    for (name, f) in tests {
        if filter.as_deref().is_some_and(|flt| !name.contains(flt)) {
            filtered += 1;
            continue;
        }
        let t = Instant::now();
        let outcome = run_with_timeout(*f, limit);
        match outcome {
            Ok(()) => {
                passed += 1;
                println!(
                    "test {name} ... ok ({:.1} ms)",
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            Err(msg) if msg.starts_with(SKIP) => {
                ignored += 1;
                println!("test {name} ... ignored (SKIPPED: {})", &msg[SKIP.len()..]);
            }
            Err(msg) => {
                failed += 1;
                println!("test {name} ... FAILED\n    {msg}");
                if msg.starts_with(TIMEOUT) {
                    // The hung test's thread cannot be stopped: report and stop here.
                    println!(
                        "\ntest result: FAILED. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out; finished in {:.2}s\n",
                        start.elapsed().as_secs_f64()
                    );
                    std::process::exit(1);
                }
            }
        }
    }
    let status = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {status}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out; finished in {:.2}s\n",
        start.elapsed().as_secs_f64()
    );
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

const SKIP: &str = "skip: ";

/// The error a test returns when this machine cannot run it, e.g.
/// `return Err(skip("needs 2 GPUs, 1 visible"))`.
pub fn skip(why: &str) -> String {
    format!("{SKIP}{why}")
}

/// The role this process was re-executed for, if any.
pub fn child_role() -> Option<String> {
    std::env::var("GPUBIND_CHILD").ok()
}

/// Converts any error into the harness's `String`.
pub trait Ctx<T> {
    /// Adds `what` to the error message.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Device 0, or the error as a test failure.
pub fn dev0() -> Result<std::sync::Arc<gpubind::Device>, String> {
    gpubind::Device::get(0).ctx("Device::get(0)")
}

/// Runs `test` with device 0 bound on this thread.
pub fn on_device0(test: fn(&gpubind::BoundDevice<'_>) -> Result<(), String>) -> Result<(), String> {
    let dev = dev0()?;
    let mut ctx = gpubind::ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    test(&gpu)
}

/// `Err` unless `cond`.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        // Bound first: `!` on a comparison of floats would read as `!(a < b)`.
        {
            let holds: bool = $cond;
            if !holds {
                return Err(format!($($msg)+));
            }
        }
    };
}

/// CUDA C source of `spin_then_write(p, ns)`: spins for `ns` nanoseconds of GPU time
/// (`%globaltimer`), then writes 7 to `*p` — the long kernel the drop, fault and
/// watchdog tests queue work behind.
pub const SPIN: &str = r#"
extern "C" __global__ void spin_then_write(unsigned* p, unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    *p = 7u;
}
"#;

// --- Child processes, ports, NCCL: what the multi-process GPU suites share -----------

/// Waits for a child (killing it past `limit`): whether it succeeded, and its stdout (with
/// a line naming its exit status when it failed).
pub fn finish(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> Result<(bool, String), String> {
    let start = Instant::now();
    while child.try_wait().ctx("try_wait")?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("a child process hung past {limit:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = child.wait().ctx("wait")?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).ctx("read")?;
    if !status.success() {
        out.push_str(&format!("(the process ended with {status})\n"));
    }
    Ok((status.success(), out))
}

/// A free TCP port on loopback, above 1 (a launcher's `MASTER_PORT` is this minus one:
/// both stay in range).
pub fn free_port() -> u16 {
    loop {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p > 1 {
            return p;
        }
    }
}

/// [`skip`] unless two GPUs are visible (NCCL refuses two ranks on one GPU).
pub fn two_gpus() -> Result<(), String> {
    let n = gpubind::Device::count().ctx("count")?;
    if n < 2 {
        return Err(skip(&format!(
            "needs 2 GPUs (NCCL refuses two ranks on one GPU), {n} visible"
        )));
    }
    Ok(())
}

/// Prints gpubind's warnings on stdout (`WARN: …`), for a child's parent to read.
pub struct PrintWarnings;

impl log::Log for PrintWarnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            println!("WARN: {}", r.args());
        }
    }
    fn flush(&self) {}
}

/// `Ok` when NCCL can be used; else [`skip`], after checking that its absence is the
/// typed error it should be (`FeatureDisabled` without the feature, else `NoNccl`).
#[cfg(feature = "collective")]
pub fn nccl_present() -> Result<(), String> {
    use gpubind::Error;
    use gpubind::collective::{NcclUniqueId, nccl_available};
    if nccl_available() {
        return Ok(());
    }
    let e = NcclUniqueId::new().unwrap_err();
    if cfg!(not(feature = "nccl")) {
        ensure!(
            matches!(
                e,
                Error::FeatureDisabled {
                    feature: "nccl",
                    ..
                }
            ),
            "want FeatureDisabled, got {e}"
        );
        return Err(skip("built without the `nccl` feature"));
    }
    ensure!(e == Error::NoNccl, "want NoNccl, got {e}");
    Err(skip("NCCL is not installed (Error::NoNccl checked)"))
}

/// Creates a non-primary context on `dev` (pushed current), on every driver and with
/// every binding version: `cuCtxCreate` looked up for CUDA 11.0, which is
/// `cuCtxCreate_v2(CUcontext*, unsigned, CUdevice)`. (`cuGetProcAddress` returns the
/// newest variant at or below the version asked for: at 12.2 that is `cuCtxCreate_v3`,
/// CUDA 11.4's, which takes execution-affinity parameters first — called with v2's
/// arguments it fails with `CUDA_ERROR_INVALID_DEVICE`, as seen on the H200.) The caller
/// destroys it (`cuCtxDestroy_v2`).
pub fn create_context(
    dev: gpubind::cudarc::driver::sys::CUdevice,
) -> Result<gpubind::cudarc::driver::sys::CUcontext, String> {
    use gpubind::cudarc::driver::sys;
    type CtxCreateV2 =
        unsafe extern "C" fn(*mut sys::CUcontext, std::ffi::c_uint, sys::CUdevice) -> sys::CUresult;
    let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: NUL-terminated name; writes one pointer and one status.
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            c"cuCtxCreate".as_ptr(),
            &mut pfn,
            11000,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut status,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || pfn.is_null() {
        return Err(format!(
            "cuGetProcAddress_v2(cuCtxCreate, 11000): {r:?} {status:?}"
        ));
    }
    // SAFETY: the CUDA 11.0 variant of cuCtxCreate is cuCtxCreate_v2, whose prototype is
    // `CtxCreateV2`; the pointer stays valid while libcuda is loaded.
    let create = unsafe { std::mem::transmute::<*mut std::ffi::c_void, CtxCreateV2>(pfn) };
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid device, no flags; writes one handle.
    let r = unsafe { create(&mut ctx, 0, dev) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxCreate_v2: {r:?}"));
    }
    Ok(ctx)
}

/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` of device 0's default memory pool.
pub fn default_pool_used() -> Result<u64, String> {
    use gpubind::cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the caller has device 0 (dev0 succeeded); the call writes one handle.
    let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, 0) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuDeviceGetDefaultMemPool: {r:?}"
    );
    let mut used: u64 = 0;
    // SAFETY: the default pool (never destroyed); USED_MEM_CURRENT writes a u64.
    let r = unsafe {
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&mut used as *mut u64).cast(),
        )
    };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuMemPoolGetAttribute: {r:?}"
    );
    Ok(used)
}
