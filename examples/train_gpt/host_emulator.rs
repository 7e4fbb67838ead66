//! Runs train_gpt's CUDA kernels on the CPU: the check programs of `emu/` compile a kernel
//! source unchanged with the host C++ compiler (`$CXX`, else `c++`) against `emu/cuda_emu.h`
//! (every CUDA thread a fiber, warp collectives exchanged lane by lane, cp.async deferred
//! or immediate, two warp orders) and compare every output with a double-precision
//! reference. Without a C++ compiler the tests print one `SKIPPED` line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The directory of the emulator and its check programs.
fn emu_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/train_gpt/emu")
}

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("train_gpt_{what}_{}_{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `emu/<program>.cpp`, runs it and asserts that it exits with success, printing
/// its output; prints `SKIPPED` instead when no C++ compiler runs.
fn compile_and_run(program: &str) {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: no C++ compiler ({cxx}) to build the kernel emulator's {program}");
        return;
    }
    let dir = TempDir::new(program);
    let exe = dir.0.join(program);
    let source = emu_dir().join(format!("{program}.cpp"));
    let start = Instant::now();
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-fno-strict-aliasing", "-I"])
        .arg(emu_dir())
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("running the C++ compiler");
    assert!(
        built.status.success(),
        "{cxx} failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let compiled = start.elapsed();
    let ran = Command::new(&exe)
        .output()
        .expect("running the check program");
    let out = String::from_utf8_lossy(&ran.stdout);
    let err = String::from_utf8_lossy(&ran.stderr);
    println!("{out}{err}");
    println!(
        "{program}: compiled in {:.1} s, ran in {:.1} s",
        compiled.as_secs_f64(),
        (start.elapsed() - compiled).as_secs_f64()
    );
    assert!(
        ran.status.success(),
        "{program} failed ({}):\n{out}{err}",
        ran.status
    );
}

#[test]
fn attention_mma_kernels_match_the_reference_on_the_host_emulator() {
    compile_and_run("attention_check");
}

#[test]
fn layernorm_kernels_match_the_reference_on_the_host_emulator() {
    compile_and_run("layernorm_check");
}
