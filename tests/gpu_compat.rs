//! GPU tests of old-driver compatibility (docs/compat.md). The driver version gpubind
//! assumes is capped per process with `GPUBIND_ASSUME_DRIVER_VERSION`, so each capped
//! case runs in a child process (this binary re-executed): a new driver then takes the
//! paths an old one would, for real — `cuEventElapsedTime` instead of `_v2`, no
//! `cuFuncGetParamInfo`, `cuMemAdvise_v2`/`cuMemPrefetchAsync_v2` looked up for 12.2,
//! `init` refusing versions before 12.2. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_compat` (on a GPU machine, or the built binary directly).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, child_role, run_suite};
use gpubind::cudarc::driver::sys;
use gpubind::{ASSUME_DRIVER_VERSION_ENV, entry_points};
use gpubind::{
    Advice, Device, DriverVersion, Error, LaunchConfig, Location, ThreadContext, driver_version,
};
use std::process::Command;

type R = Result<(), String>;

const SPIN: &str = r#"
extern "C" __global__ void spin(unsigned* out, unsigned n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i + 1u;
}
extern "C" __global__ void affine(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}
"#;

/// The driver's own answer, uncapped.
fn reported_version() -> Result<i32, String> {
    let mut v = 0;
    // SAFETY: writes one int; needs no cuInit.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "cuDriverGetVersion: {r:?}"
    );
    Ok(v)
}

/// The cap this process runs under, if any.
fn cap() -> Result<Option<DriverVersion>, String> {
    match std::env::var(ASSUME_DRIVER_VERSION_ENV) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(v.parse().ctx("the cap")?)),
        _ => Ok(None),
    }
}

/// Runs this binary again as `role` with the cap set to `cap`; returns its stdout.
fn run_child(role: &str, cap: &str) -> Result<String, String> {
    let out = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
        .env(ASSUME_DRIVER_VERSION_ENV, cap)
        .output()
        .ctx("run child")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout.lines() {
        println!("    child {role} ({cap}): {line}");
    }
    ensure!(
        out.status.success(),
        "child {role} with {ASSUME_DRIVER_VERSION_ENV}={cap} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        stdout.contains("CHILD OK"),
        "child {role} did not finish:\n{stdout}"
    );
    Ok(stdout)
}

fn the_status_of<'a>(
    eps: &'a [gpubind::EntryPointStatus],
    symbol: &str,
) -> Result<&'a Result<(), Error>, String> {
    eps.iter()
        .find(|e| e.symbol == symbol)
        .map(|e| &e.status)
        .ok_or_else(|| format!("{symbol} is not in compat::entry_points()"))
}

/// Times a kernel that spins ~`cycles` clock cycles between two timing events; returns
/// gpubind's `elapsed_ms` and, for the same two events, what `cuEventElapsedTime` at
/// `raw_version` (looked up directly) says.
fn time_spin(raw_version: i32) -> Result<(f32, f32), String> {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let spin = module.function("spin").ctx("function")?;
    let (start, end) = (
        gpu.new_event(true).ctx("event")?,
        gpu.new_event(true).ctx("event")?,
    );
    let n = 256u32;
    let mut out = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let s = gpu.default_stream();
    s.record(&start).ctx("record start")?;
    let cycles = 20_000_000i64; // ~10 ms at ~2 GHz
    // SAFETY: (unsigned*, unsigned, long long) matches; the kernel checks i < n.
    unsafe {
        s.launch(&spin, LaunchConfig::for_num_elems(n))
            .arg(&mut out)
            .arg(&n)
            .arg(&cycles)
            .launch()
    }
    .ctx("launch")?;
    s.record(&end).ctx("record end")?;
    end.synchronize().ctx("event sync")?;
    let ms = start.elapsed_ms(&end).ctx("elapsed_ms")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got.iter().enumerate().all(|(i, &v)| v == i as u32 + 1),
        "the kernel did not run"
    );
    // The same pair through the driver directly, for a cross-check.
    let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: NUL-terminated name; writes one pointer and one status.
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            c"cuEventElapsedTime".as_ptr(),
            &mut pfn,
            raw_version,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut status,
        )
    };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS && !pfn.is_null(),
        "cuGetProcAddress_v2(cuEventElapsedTime, {raw_version}): {r:?} {status:?}"
    );
    type Elapsed = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
    // SAFETY: both variants of cuEventElapsedTime have this prototype.
    let direct = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Elapsed>(pfn) };
    let mut direct_ms = 0f32;
    // SAFETY: two live, completed timing events of the bound (current) context.
    let r = unsafe { direct(&mut direct_ms, start.raw(), end.raw()) };
    ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "direct cuEventElapsedTime: {r:?}"
    );
    Ok((ms, direct_ms))
}

fn sane_time(ms: f32, direct: f32, path: &str) -> R {
    println!("    {path}: {ms:.3} ms (direct call: {direct:.3} ms)");
    ensure!(
        ms.is_finite() && ms > 1.0 && ms < 10_000.0,
        "{path}: a ~10 ms spin timed at {ms} ms"
    );
    ensure!(
        (ms - direct).abs() <= 1e-3 * direct.abs().max(1.0),
        "{path}: gpubind says {ms} ms, the driver's entry point {direct} ms"
    );
    Ok(())
}

/// Managed memory with advice and prefetches both ways, a kernel in between.
fn managed_round_trip() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let affine = module.function("affine").ctx("function")?;
    let n = 1usize << 16;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let mut m = gpu.alloc_managed::<f32>(n).ctx("alloc_managed")?;
    m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&x);
    gpu.advise(&m, Advice::SetPreferredLocation(Location::Device(&dev)))
        .ctx("advise preferred device")?;
    gpu.advise(&m, Advice::SetAccessedBy(Location::Device(&dev)))
        .ctx("advise accessed by")?;
    let s = gpu.default_stream();
    s.prefetch(&m, Location::Device(&dev))
        .ctx("prefetch to device")?;
    let nn = n as u32;
    // SAFETY: (float*, unsigned) matches; the kernel checks i < n.
    unsafe {
        s.launch(&affine, LaunchConfig::for_num_elems(nn))
            .arg(&mut m)
            .arg(&nn)
            .launch()
    }
    .ctx("launch affine")?;
    s.prefetch(&m, Location::Host).ctx("prefetch to host")?;
    s.synchronize().ctx("sync")?;
    gpu.advise(&m, Advice::UnsetPreferredLocation)
        .ctx("unset preferred")?;
    let got = m.as_slice().ctx("as_slice")?;
    for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
        ensure!(g == 2.0 * v + 1.0, "m[{i}] = {g}, want {}", 2.0 * v + 1.0);
    }
    Ok(())
}

// ---- the parent's tests (no cap, unless the whole suite runs under one) ----

fn driver_version_is_the_drivers() -> R {
    let raw = reported_version()?;
    let real = DriverVersion::from_raw(raw).ctx("from_raw")?;
    let want = cap()?.map_or(real, |c| real.min(c));
    let got = driver_version().ctx("driver_version")?;
    println!("    cuDriverGetVersion {raw}; gpubind::driver_version {got}");
    ensure!(got == want, "driver_version {got}, expected {want}");
    ensure!(
        got.raw() == raw || cap()?.is_some(),
        "raw {} != {raw}",
        got.raw()
    );
    ensure!(
        got >= DriverVersion::MINIMUM,
        "this GPU's driver ({got}) is older than gpubind's minimum; the suite cannot run"
    );
    Ok(())
}

fn entry_points_match_the_version() -> R {
    let v = driver_version().ctx("driver_version")?;
    let eps = entry_points().ctx("entry_points")?;
    for ep in &eps {
        println!("    {} (CUDA {}): {:?}", ep.symbol, ep.since, ep.status);
        if v >= ep.since {
            ensure!(
                ep.status.is_ok(),
                "{} should be found on a CUDA {v} driver: {:?}",
                ep.symbol,
                ep.status
            );
        } else {
            ensure!(
                matches!(&ep.status, Err(Error::Unsupported { what, needs, found })
                    if *what == ep.symbol && *needs == ep.since && *found == v),
                "{}: {:?}",
                ep.symbol,
                ep.status
            );
        }
    }
    Ok(())
}

fn elapsed_ms_on_this_driver() -> R {
    let v = driver_version().ctx("driver_version")?;
    let (ms, direct) = time_spin(v.raw())?;
    let path = if v >= DriverVersion::new(12, 8) {
        "cuEventElapsedTime_v2"
    } else {
        "cuEventElapsedTime"
    };
    sane_time(ms, direct, path)
}

fn managed_advise_and_prefetch() -> R {
    managed_round_trip()
}

/// Capped at 12.2, the floor: every fallback, for real.
fn capped_at_12_2() -> R {
    let out = run_child("capped", "12020")?;
    ensure!(
        out.contains("elapsed via cuEventElapsedTime:"),
        "no fallback timing line"
    );
    Ok(())
}

/// Capped at 12.4: cuFuncGetParamInfo back, cuEventElapsedTime still the original.
fn capped_at_12_4() -> R {
    run_child("capped", "12.4").map(drop)
}

/// Capped below the floor: init refuses, typed, naming both versions.
fn capped_below_12_2_is_refused() -> R {
    run_child("too_old", "12010")?;
    run_child("too_old", "11.8").map(drop)
}

/// A cap that does not parse: a typed error naming the variable, no panic.
fn bad_cap_is_a_typed_error() -> R {
    run_child("bad_cap", "twelve").map(drop)
}

// ---- children ----

fn child_capped() -> R {
    let asked = cap()?.ok_or("no cap set")?;
    let real = DriverVersion::from_raw(reported_version()?).ctx("from_raw")?;
    let v = driver_version().ctx("driver_version")?;
    println!("driver_version {v} (cap {asked}, driver {real})");
    ensure!(
        v == real.min(asked),
        "driver_version {v} under cap {asked} (driver {real})"
    );
    // What the checks below expect: the version gpubind acts on.
    let cap = v;
    let eps = entry_points().ctx("entry_points")?;
    let v2 = the_status_of(&eps, "cuEventElapsedTime_v2")?;
    ensure!(
        cap < DriverVersion::new(12, 8),
        "the caps used (12.2, 12.4) are below 12.8"
    );
    ensure!(
        matches!(v2, Err(Error::Unsupported { needs, found, .. })
            if *needs == DriverVersion::new(12, 8) && *found == cap),
        "cuEventElapsedTime_v2 under cap {cap}: {v2:?}"
    );
    ensure!(
        the_status_of(&eps, "cuEventElapsedTime")?.is_ok(),
        "the fallback is missing"
    );
    let pi = the_status_of(&eps, "cuFuncGetParamInfo")?;
    let has_param_info = cap >= DriverVersion::new(12, 4);
    if has_param_info {
        ensure!(pi.is_ok(), "cuFuncGetParamInfo under cap {cap}: {pi:?}");
    } else {
        ensure!(
            matches!(pi, Err(Error::Unsupported { what: "cuFuncGetParamInfo", needs, found })
                if *needs == DriverVersion::new(12, 4) && *found == cap),
            "cuFuncGetParamInfo under cap {cap}: {pi:?}"
        );
        let msg = pi.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(
            msg.contains("12.4") && msg.contains(&cap.to_string()),
            "message: {msg}"
        );
    }
    for sym in ["cuMemAdvise_v2", "cuMemPrefetchAsync_v2"] {
        let st = the_status_of(&eps, sym)?;
        ensure!(st.is_ok(), "{sym} under cap {cap}: {st:?}");
    }
    // Launch-argument checks follow cuFuncGetParamInfo.
    {
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let dev = Device::get(0).ctx("Device::get")?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
        let spin = module.function("spin").ctx("function")?;
        let want = has_param_info.then_some(&[8usize, 4, 8][..]);
        ensure!(
            spin.param_sizes() == want,
            "param_sizes {:?} under cap {cap}",
            spin.param_sizes()
        );
    }
    let (ms, direct) = time_spin(cap.raw())?;
    sane_time(ms, direct, "capped")?;
    println!("elapsed via cuEventElapsedTime: {ms:.3} ms");
    managed_round_trip()?;
    println!("managed advise/prefetch ok");
    Ok(())
}

fn child_too_old() -> R {
    let cap = cap()?.ok_or("no cap set")?;
    ensure!(cap < DriverVersion::MINIMUM, "cap {cap} is not below 12.2");
    let v = driver_version().ctx("driver_version")?;
    ensure!(v == cap, "driver_version {v} under cap {cap}");
    let want = |e: &Error| {
        matches!(e, Error::DriverTooOld { found, needed }
            if *found == cap && *needed == DriverVersion::MINIMUM)
    };
    let e = gpubind::init()
        .err()
        .ok_or("init accepted a capped-too-old driver")?;
    println!("init: {e}");
    ensure!(want(&e), "init: {e:?}");
    let msg = e.to_string();
    ensure!(
        msg.contains(&cap.to_string()) && msg.contains("12.2"),
        "the message names both versions: {msg}"
    );
    // Every way in is refused the same way, and again (not cached as success).
    let e = Device::count().err().ok_or("Device::count worked")?;
    ensure!(want(&e), "Device::count: {e:?}");
    let e = Device::get(0).err().ok_or("Device::get worked")?;
    ensure!(want(&e), "Device::get: {e:?}");
    let e = entry_points().err().ok_or("entry_points worked")?;
    ensure!(want(&e), "entry_points: {e:?}");
    let e = gpubind::init().err().ok_or("a second init worked")?;
    ensure!(want(&e), "second init: {e:?}");
    Ok(())
}

fn child_bad_cap() -> R {
    let e = gpubind::init().err().ok_or("init accepted a bad cap")?;
    println!("init: {e}");
    ensure!(
        matches!(&e, Error::InvalidArgument(m) if m.contains(ASSUME_DRIVER_VERSION_ENV) && m.contains("twelve")),
        "init: {e:?}"
    );
    let e = driver_version()
        .err()
        .ok_or("driver_version accepted a bad cap")?;
    ensure!(
        matches!(&e, Error::InvalidArgument(_)),
        "driver_version: {e:?}"
    );
    Ok(())
}

fn main() {
    if let Some(role) = child_role() {
        let r = match role.as_str() {
            "capped" => child_capped(),
            "too_old" => child_too_old(),
            "bad_cap" => child_bad_cap(),
            other => Err(format!("unknown child role {other}")),
        };
        match r {
            Ok(()) => {
                println!("CHILD OK");
                std::process::exit(0)
            }
            Err(e) => {
                println!("child error: {e}");
                std::process::exit(1)
            }
        }
    }
    run_suite(
        "gpu_compat",
        &[
            (
                "driver_version_is_the_drivers",
                driver_version_is_the_drivers,
            ),
            (
                "entry_points_match_the_version",
                entry_points_match_the_version,
            ),
            ("elapsed_ms_on_this_driver", elapsed_ms_on_this_driver),
            ("managed_advise_and_prefetch", managed_advise_and_prefetch),
            ("capped_at_12_2", capped_at_12_2),
            ("capped_at_12_4", capped_at_12_4),
            ("capped_below_12_2_is_refused", capped_below_12_2_is_refused),
            ("bad_cap_is_a_typed_error", bad_cap_is_a_typed_error),
        ],
    )
}
