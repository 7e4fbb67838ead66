//! GPU tests of `train_mlp`'s one-process-per-rank modes (examples/train_mlp/process.rs,
//! launch.rs), run as programs: `--spawn 2 --backend kernels --devices 0,0` (two
//! processes on GPU 0, own kernels across processes) and a torchrun launch of
//! `--launcher env` give the same per-step losses and final parameters, bit for bit, as
//! the in-process run `--devices 0,0` (two ranks on GPU 0, one own-kernel
//! `Communicator`); the backend chosen without `--backend` for two ranks on one GPU is
//! the own kernels; a rank that fails makes `--spawn` exit non-zero at once, naming it.
//!
//! Each run writes `--save-run DIR` (`step_losses.f64`, `params.f32`), compared byte for
//! byte; the printed epoch and final lines are compared too.

#[macro_use]
mod common;

use common::{Ctx, run_suite, skip};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type R = Result<(), String>;

/// The run's size: small, so each run takes seconds. Hidden 64 gives 6,792 parameters.
const EPOCHS: usize = 3;
const STEPS: usize = 4;
const PARAMS: usize = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8;
const SIZE: [&str; 10] = [
    "--epochs", "3", "--steps", "4", "--batch", "1024", "--hidden", "64", "--seed", "5",
];

/// The train_mlp binary: `$TRAIN_MLP` if set, else `../examples/train_mlp` from this test
/// binary's folder (`target/<profile>/deps/` -> `target/<profile>/examples/`, and
/// `.gpu-bin/tests/` -> `.gpu-bin/examples/`). `cargo test --test gpu_train_launch` alone
/// does not build it: `cargo build --example train_mlp` first (`--release` to match).
fn train_mlp() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TRAIN_MLP") {
        return Ok(p.into());
    }
    let name = format!("train_mlp{}", std::env::consts::EXE_SUFFIX);
    let dir = std::env::current_exe()
        .ctx("current_exe")?
        .parent()
        .map(Path::to_path_buf)
        .ok_or("test binary has no folder")?;
    let candidates = [dir.join("..").join("examples").join(&name), dir.join(&name)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "train_mlp not found: `cargo build --example train_mlp` (add --release for a \
             release test) or set TRAIN_MLP; tried {candidates:?}"
            )
        })
}

/// A fresh scratch folder for one run.
fn scratch(label: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "gpubind-train-launch-{}-{label}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).ctx("scratch folder")?;
    Ok(dir)
}

/// What one run left: its output and its `--save-run` files.
struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    losses: Vec<u8>,
    params: Vec<u8>,
    secs: f64,
}

/// Runs `cmd` (output into files, so no pipe can fill), killing it past `limit`.
fn run(label: &str, mut cmd: Command, limit: Duration) -> Result<Run, String> {
    let dir = scratch(label)?;
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).ctx("stdout file")?)
        .stderr(std::fs::File::create(&err).ctx("stderr file")?)
        .arg("--save-run")
        .arg(dir.join("run"));
    println!("    {label}: {cmd:?}");
    let start = Instant::now();
    let mut child = cmd.spawn().ctx(label)?;
    let status = loop {
        if let Some(st) = child.try_wait().ctx(label)? {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{label}: still running after {} s (killed); stdout:\n{}",
                limit.as_secs(),
                std::fs::read_to_string(&out).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: PathBuf| std::fs::read(p).unwrap_or_default();
    Ok(Run {
        status,
        stdout: String::from_utf8_lossy(&read(out)).into_owned(),
        stderr: String::from_utf8_lossy(&read(err)).into_owned(),
        losses: read(dir.join("run").join("step_losses.f64")),
        params: read(dir.join("run").join("params.f32")),
        secs: start.elapsed().as_secs_f64(),
    })
}

/// Runs and requires success and complete, sane `--save-run` files.
fn run_ok(label: &str, cmd: Command) -> Result<Run, String> {
    let r = run(label, cmd, Duration::from_secs(100))?;
    ensure!(
        r.status.success(),
        "{label}: {}\nstdout:\n{}\nstderr:\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    ensure!(
        r.losses.len() == EPOCHS * STEPS * 8 && r.params.len() == PARAMS * 4,
        "{label}: saved {} loss bytes (want {}) and {} parameter bytes (want {})\nstdout:\n{}",
        r.losses.len(),
        EPOCHS * STEPS * 8,
        r.params.len(),
        PARAMS * 4,
        r.stdout
    );
    let losses: Vec<f64> = r
        .losses
        .chunks(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    ensure!(
        losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{label}: losses {losses:?}"
    );
    let epoch_mean = |e: usize| losses[e * STEPS..(e + 1) * STEPS].iter().sum::<f64>() / 4096.0;
    let fell = epoch_mean(EPOCHS - 1) < epoch_mean(0);
    ensure!(fell, "{label}: the loss did not fall: {losses:?}");
    println!(
        "    {label}: {:.1} s, loss {:.4} -> {:.4}",
        r.secs,
        epoch_mean(0),
        epoch_mean(EPOCHS - 1)
    );
    Ok(r)
}

/// The printed lines that must match between runs: each epoch's loss (without the
/// samples/s) and the final loss and held-out accuracy.
fn result_lines(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| {
            if l.starts_with("epoch ") {
                // "epoch   0: loss 1.2345  678 samples/s": all but the samples/s.
                l.rsplit_once("  ").map(|(head, _)| head.to_owned())
            } else if l.starts_with("final: ") {
                l.split(", ").take(2).collect::<Vec<_>>().join(", ").into()
            } else {
                None
            }
        })
        .collect()
}

/// `b` took exactly `a`'s steps: the same losses and parameters, bit for bit, and the
/// same printed lines (once each: only rank 0 prints).
fn same_run(a: (&str, &Run), b: (&str, &Run)) -> R {
    let ((la, ra), (lb, rb)) = (a, b);
    ensure!(
        ra.losses == rb.losses,
        "{lb}: per-step losses differ from {la}'s: {:?} vs {:?}",
        rb.losses
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>(),
        ra.losses
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    );
    let differ = ra
        .params
        .chunks(4)
        .zip(rb.params.chunks(4))
        .filter(|(x, y)| x != y)
        .count();
    ensure!(
        ra.params == rb.params,
        "{lb}: {differ} of {PARAMS} final parameters differ from {la}'s"
    );
    let (pa, pb) = (result_lines(&ra.stdout), result_lines(&rb.stdout));
    ensure!(
        pa.len() == EPOCHS + 1 && pa == pb,
        "{lb}: printed {pb:?}, {la}: {pa:?}"
    );
    Ok(())
}

/// The reference: the in-process run on two ranks of GPU 0 (run once, shared by the
/// tests).
fn in_process() -> Result<&'static Run, String> {
    static REFERENCE: std::sync::OnceLock<Result<Run, String>> = std::sync::OnceLock::new();
    REFERENCE
        .get_or_init(|| {
            let mut cmd = Command::new(train_mlp()?);
            cmd.args(["--devices", "0,0"]).args(SIZE);
            let r = run_ok("in-process --devices 0,0", cmd)?;
            ensure!(
                r.stdout.contains("backend Kernels"),
                "in-process: not the own kernels:\n{}",
                r.stdout
            );
            Ok(r)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// `--spawn 2 --backend kernels --devices 0,0` = the in-process `--devices 0,0`, bit for
/// bit; and without `--backend` the spawned run picks the own kernels (two local ranks on
/// one GPU) and is the same again.
fn spawned_run_matches_in_process_bit_for_bit() -> R {
    let reference = in_process()?;
    let mut cmd = Command::new(train_mlp()?);
    cmd.args(["--spawn", "2", "--backend", "kernels", "--devices", "0,0"])
        .args(SIZE);
    let spawned = run_ok("--spawn 2 --backend kernels", cmd)?;
    ensure!(
        spawned.stdout.contains("one process per rank")
            && spawned.stdout.matches("epoch   0:").count() == 1,
        "--spawn 2: not rank 0's output alone:\n{}",
        spawned.stdout
    );
    same_run(("in-process", reference), ("--spawn 2", &spawned))?;
    let mut cmd = Command::new(train_mlp()?);
    cmd.args(["--spawn", "2", "--devices", "0,0"]).args(SIZE);
    let auto = run_ok("--spawn 2, no --backend", cmd)?;
    ensure!(
        auto.stdout.contains("backend Kernels"),
        "--spawn 2 on one GPU without --backend did not pick the own kernels:\n{}",
        auto.stdout
    );
    same_run(
        ("in-process", reference),
        ("--spawn 2 (auto backend)", &auto),
    )?;
    println!("    per-step losses, final parameters and printed results identical");
    Ok(())
}

/// `torchrun --standalone --nproc-per-node 2 --no-python train_mlp --launcher env
/// --backend kernels --devices 0,0` = the in-process run, bit for bit.
fn torchrun_launch_matches_in_process() -> R {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("torchrun").is_file()))
        .unwrap_or(false);
    if !found {
        return Err(skip("torchrun is not on PATH"));
    }
    let reference = in_process()?;
    let mut cmd = Command::new("torchrun");
    cmd.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(train_mlp()?)
        .args([
            "--launcher",
            "env",
            "--backend",
            "kernels",
            "--devices",
            "0,0",
        ])
        .args(SIZE);
    let launched = run_ok("torchrun --nproc-per-node 2", cmd)?;
    ensure!(
        launched.stdout.contains("Torch launch"),
        "torchrun: rank 0 did not read torchrun's variables:\n{}",
        launched.stdout
    );
    same_run(("in-process", reference), ("torchrun", &launched))
}

/// A rank that fails (rank 1 on a device that does not exist) makes `--spawn` exit
/// non-zero naming it, long before the rendezvous timeout rank 0 waits under, with rank
/// 1's own error on standard error.
fn spawned_rank_failure_fails_fast() -> R {
    let mut cmd = Command::new(train_mlp()?);
    cmd.args(["--spawn", "2", "--backend", "kernels", "--devices", "0,99"])
        .args(SIZE)
        .env("GPUBIND_RDZV_TIMEOUT", "60");
    let r = run(
        "--spawn 2, rank 1 on device 99",
        cmd,
        Duration::from_secs(50),
    )?;
    println!(
        "    exit {} after {:.1} s; stderr:\n{}",
        r.status,
        r.secs,
        r.stderr.trim_end()
    );
    ensure!(
        !r.status.success(),
        "--spawn succeeded with rank 1 on device 99"
    );
    let fast = r.secs < 30.0;
    ensure!(
        fast,
        "--spawn took {:.1} s to fail (rank 0's rendezvous timeout is 60 s)",
        r.secs
    );
    ensure!(
        r.stderr.contains("rank 1 of 2:") && r.stderr.contains("--spawn: rank 1 of 2 failed"),
        "stderr does not name rank 1's error and failure:\n{}",
        r.stderr
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_train_launch",
        &[
            (
                "spawned_run_matches_in_process_bit_for_bit",
                spawned_run_matches_in_process_bit_for_bit,
            ),
            (
                "torchrun_launch_matches_in_process",
                torchrun_launch_matches_in_process,
            ),
            (
                "spawned_rank_failure_fails_fast",
                spawned_rank_failure_fails_fast,
            ),
        ],
    );
}
