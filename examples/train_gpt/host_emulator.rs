//! Runs train_gpt's CUDA kernels on the CPU: the check programs of `emu/` compile a kernel
//! source unchanged with the host C++ compiler (`$CXX`, else `c++`) against `emu/cuda_emu.h`
//! (every CUDA thread a fiber, warp collectives exchanged lane by lane, cp.async deferred
//! or immediate, two warp orders) and compare every output with a double-precision
//! reference: `attention_check` the bf16 kernels of `attention_mma.cu`,
//! `attention_tiled_check` the fp32 kernels of `attention.cu`; built once with fp32 and
//! once with bf16 activations, `layernorm_check` the layer norms of `kernels.cu` and
//! `kernels_check` the rest of it (embedding, bias, layout, softmax, GELU, cross-entropy,
//! gradient norm and optimizer kernels); `runtime_check` checks the emulator itself and
//! its deadlock reports. Without a C++ compiler the tests print one `SKIPPED` line.

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

/// A check program compiled into a temporary directory of its own.
struct Program {
    name: String,
    exe: PathBuf,
    _dir: TempDir,
}

/// Compiles `emu/<program>.cpp` with `$CXX` (or `c++`), printing how long it took; `None`
/// (after printing `SKIPPED`) when no C++ compiler runs.
fn compile(program: &str) -> Option<Program> {
    compile_as(program, program, &[])
}

/// Compiles `emu/<program>.cpp` with the extra compiler arguments `defines` into an
/// executable called `name`, as [`compile`] does.
fn compile_as(program: &str, name: &str, defines: &[&str]) -> Option<Program> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: no C++ compiler ({cxx}) to build the kernel emulator's {name}");
        return None;
    }
    let dir = TempDir::new(name);
    let exe = dir.0.join(name);
    let source = emu_dir().join(format!("{program}.cpp"));
    let start = Instant::now();
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-fno-strict-aliasing"])
        .args(defines)
        .arg("-I")
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
    println!("{name}: compiled in {:.1} s", start.elapsed().as_secs_f64());
    Some(Program {
        name: name.to_string(),
        exe,
        _dir: dir,
    })
}

impl Program {
    /// Runs the program with `args`, printing its output and how long it ran: its exit
    /// code (`None` if a signal ended it) and its output (stdout, then stderr).
    fn run(&self, args: &[&str]) -> (Option<i32>, String) {
        let start = Instant::now();
        let ran = Command::new(&self.exe)
            .args(args)
            .output()
            .expect("running the check program");
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr)
        );
        println!("{out}");
        println!(
            "{} {args:?}: ran in {:.1} s, {}",
            self.name,
            start.elapsed().as_secs_f64(),
            ran.status
        );
        (ran.status.code(), out)
    }
}

/// Compiles and runs `emu/<program>.cpp`, asserting that it exits with success.
fn compile_and_run(program: &str) {
    run_to_success(compile(program));
}

/// Runs a compiled check program, asserting that it exits with success.
fn run_to_success(program: Option<Program>) {
    if let Some(p) = program {
        let (code, out) = p.run(&[]);
        assert_eq!(code, Some(0), "{} failed:\n{out}", p.name);
    }
}

#[test]
fn attention_mma_kernels_match_the_reference_on_the_host_emulator() {
    compile_and_run("attention_check");
}

#[test]
fn attention_mma_kernels_with_64_key_dkdv_blocks_match_the_reference_on_the_host_emulator() {
    run_to_success(compile_as(
        "attention_check",
        "attention_check_dkm1",
        &["-DDKM=1"],
    ));
}

#[test]
fn tiled_fp32_attention_kernels_match_the_reference_on_the_host_emulator() {
    compile_and_run("attention_tiled_check");
}

#[test]
fn fp32_layernorm_kernels_match_the_reference_on_the_host_emulator() {
    run_to_success(compile_as("layernorm_check", "layernorm_check_fp32", &[]));
}

#[test]
fn bf16_layernorm_kernels_match_the_reference_on_the_host_emulator() {
    run_to_success(compile_as(
        "layernorm_check",
        "layernorm_check_bf16",
        &["-DACT_BF16=1"],
    ));
}

#[test]
fn fp32_kernels_match_the_reference_on_the_host_emulator() {
    run_to_success(compile_as("kernels_check", "kernels_check_fp32", &[]));
}

#[test]
fn bf16_kernels_match_the_reference_on_the_host_emulator() {
    run_to_success(compile_as(
        "kernels_check",
        "kernels_check_bf16",
        &["-DACT_BF16=1"],
    ));
}

#[test]
fn host_emulator_models_collectives_orders_and_copies_and_reports_deadlocks() {
    let Some(p) = compile("runtime_check") else {
        return;
    };
    let (code, out) = p.run(&[]);
    assert_eq!(code, Some(0), "runtime_check failed:\n{out}");
    for faulty in [
        "divergent-shuffle",
        "different-collectives",
        "mixed-collectives",
        "barrier-after-exit",
    ] {
        let (code, out) = p.run(&[faulty]);
        assert_eq!(code, Some(3), "{faulty}: no deadlock reported:\n{out}");
        assert!(
            out.contains("cuda_emu: ") && out.contains("deadlock"),
            "{faulty}:\n{out}"
        );
    }
}
