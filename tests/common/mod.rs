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

/// A test: returns `Err(message)` on failure (panics are caught and count as failures).
pub type TestFn = fn() -> Result<(), String>;

/// Why GPU tests cannot run here, or `None` if they can.
pub fn gpu_unavailable() -> Option<String> {
    if !gpubind::driver_available() {
        return Some("no CUDA driver found (libcuda not loadable)".into());
    }
    match gpubind::Device::count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("CUDA init failed: {e}")),
    }
}

/// Runs `tests` (or prints one skip line) and exits the process with the outcome.
pub fn run_suite(suite: &str, tests: &[(&str, TestFn)]) -> ! {
    if let Some(why) = gpu_unavailable() {
        println!(
            "SKIPPED {suite}: all {} GPU tests skipped: {why}",
            tests.len()
        );
        std::process::exit(0);
    }
    let filter = std::env::var("GPUBIND_TEST_FILTER").ok();
    let start = Instant::now();
    let (mut passed, mut failed, mut filtered) = (0, 0, 0);
    println!("\nrunning {} tests ({suite})", tests.len());
    for (name, f) in tests {
        if filter.as_deref().is_some_and(|flt| !name.contains(flt)) {
            filtered += 1;
            continue;
        }
        let t = Instant::now();
        let outcome = std::panic::catch_unwind(*f).unwrap_or_else(|p| {
            Err(p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()))
        });
        match outcome {
            Ok(()) => {
                passed += 1;
                println!(
                    "test {name} ... ok ({:.1} ms)",
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            Err(msg) => {
                failed += 1;
                println!("test {name} ... FAILED\n    {msg}");
            }
        }
    }
    let status = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {status}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered} filtered out; finished in {:.2}s\n",
        start.elapsed().as_secs_f64()
    );
    std::process::exit(if failed == 0 { 0 } else { 1 });
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

/// `Err` unless `cond`.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}
