//! GPU checks of the `gpubench` example program: a short run measures every row, and its memory
//! rows can tell a process with a context from one without.
//!
//! Runs `gpubench --iters 2000 --rounds 1 --markdown` once and inspects the table. The
//! numbers are not judged here (a debug build on a shared machine), only that each
//! measurement happened and that the footprint probe is sensitive.

mod common;

use std::sync::OnceLock;

/// The gpubench binary (the `gpubench` example): `$GPUBENCH` if set, else
/// `../examples/gpubench` from this test binary's folder (`target/<profile>/deps/` ->
/// `target/<profile>/examples/`, and `.gpu-bin/tests/` -> `.gpu-bin/examples/` for
/// binaries copied by `scripts/build-gpu-bins.sh`), else one next to this test binary.
///
/// `cargo test` builds examples, but `cargo test --test gpu_perf` alone does not: then
/// `cargo build --example gpubench` (with `--release` for a release test) first.
fn gpubench_path() -> Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("GPUBENCH") {
        return Ok(p.into());
    }
    let name = format!("gpubench{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(std::path::Path::to_path_buf))
    {
        candidates.push(dir.join("..").join("examples").join(&name));
        candidates.push(dir.join(&name));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "gpubench not found: build it with `cargo build --example gpubench` (add \
                 --release for a release test) or set GPUBENCH; tried {candidates:?}"
            )
        })
}

/// The markdown table rows of one short gpubench run, split into cells.
fn table() -> Result<&'static Vec<Vec<String>>, String> {
    static RUN: OnceLock<Result<Vec<Vec<String>>, String>> = OnceLock::new();
    RUN.get_or_init(|| {
        let out = std::process::Command::new(gpubench_path()?)
            .args(["--iters", "2000", "--rounds", "1", "--markdown"])
            .output()
            .map_err(|e| format!("cannot run gpubench: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "gpubench exited with {}\nstdout:\n{stdout}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let rows: Vec<Vec<String>> = stdout
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| measurement"))
            .map(|l| {
                l.trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().to_owned())
                    .collect()
            })
            .collect();
        if rows.len() < 10 {
            return Err(format!("only {} table rows in:\n{stdout}", rows.len()));
        }
        Ok(rows)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn row(label_start: &str) -> Result<&'static Vec<String>, String> {
    table()?
        .iter()
        .find(|r| r[0].starts_with(label_start))
        .ok_or_else(|| format!("no row starting with {label_start:?}"))
}

fn ns(cell: &str) -> Result<f64, String> {
    cell.strip_suffix(" ns")
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("{cell:?} is not a time"))
}

fn mib(cell: &str) -> Result<f64, String> {
    cell.strip_suffix(" MiB")
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("{cell:?} is not a memory size"))
}

fn every_per_op_row_is_measured() -> Result<(), String> {
    for label in [
        "memset 256 B async, stream (wall)",
        "memset 256 B async, stream (submit)",
        "htod 4 B, landed per op (wall)",
        "htod 4 B async, stream (wall)",
        "empty kernel launch (wall)",
        "empty kernel launch (submit)",
        "launch, 3 args",
        "1 GPU: re-bind same ctx",
    ] {
        let r = row(label)?;
        // measurement, gpubind, cudarc, raw, gpubind/raw, paired /raw (min–max),
        // gpubind/cudarc, goal.
        ensure!(r.len() == 8, "{label}: {r:?}");
        let paired: f64 = r[5]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{label}: paired ratio {:?}", r[5]))?;
        ensure!(
            paired.is_finite() && paired > 0.0,
            "{label}: paired ratio {paired}"
        );
        for cell in &r[1..4] {
            let v = ns(cell).map_err(|e| format!("{label}: {e}"))?;
            ensure!(v > 0.0 && v < 1e7, "{label}: implausible {v} ns");
        }
        let ratio: f64 = r[4]
            .parse()
            .map_err(|_| format!("{label}: ratio {:?}", r[4]))?;
        ensure!(ratio.is_finite() && ratio > 0.0, "{label}: ratio {ratio}");
    }
    // gpubind cannot switch to a non-primary context; cudarc and raw must have numbers.
    let sw = row("1 GPU: switch primary")?;
    ensure!(sw[1] == "n/a", "switch row gpubind cell: {:?}", sw[1]);
    ns(&sw[2])?;
    ns(&sw[3])?;
    Ok(())
}

fn listing_devices_activates_no_context() -> Result<(), String> {
    let r = row("primary context active after listing")?;
    ensure!(
        r[1] == "no",
        "gpubind child: primary context active = {:?}",
        r[1]
    );
    // The probe can see an active context: cudarc's CudaContext::new creates one.
    ensure!(
        r[2] == "yes",
        "cudarc child: primary context active = {:?}",
        r[2]
    );
    ensure!(
        r[3] == "no",
        "raw child: primary context active = {:?}",
        r[3]
    );
    Ok(())
}

fn footprint_is_zero_until_bind() -> Result<(), String> {
    let listing = row("GPU memory after listing")?;
    let g = mib(&listing[1])?;
    ensure!(
        g.is_finite() && g.abs() < 1.0,
        "gpubind child used {g} MiB just listing devices"
    );
    // The probe is sensitive: a context costs memory (cudarc had to create one).
    let c = mib(&listing[2])?;
    ensure!(
        c.is_finite() && c > 1.0,
        "cudarc child with a context used only {c} MiB"
    );
    let bound = row("GPU memory after first bind")?;
    let g = mib(&bound[1])?;
    ensure!(
        g.is_finite() && g > 1.0,
        "gpubind child used only {g} MiB after binding"
    );
    Ok(())
}

fn main() {
    common::run_suite(
        "gpu_perf",
        &[
            ("every_per_op_row_is_measured", every_per_op_row_is_measured),
            (
                "listing_devices_activates_no_context",
                listing_devices_activates_no_context,
            ),
            ("footprint_is_zero_until_bind", footprint_is_zero_until_bind),
        ],
    )
}
