//! Host<->device copy bandwidth: pageable vs pinned vs registered host memory, gpubind's
//! stream-ordered copy (`BoundStream::copy_async`, the enqueue under the safe
//! `copy_scope`) against cudarc's own path (`CudaStream::memcpy_htod` / `memcpy_dtoh`) on
//! the same host memory, in the same run.
//!
//! `cargo run --release --example bench_copy [-- --max-mib 1024 --reps 0]`
//!
//! Each measurement is bracketed by CUDA events on the copy's stream, with only the
//! enqueue between them on both sides and the host wait after the end event, so the
//! events time the transfer itself. (An earlier version timed `copy_scope`, whose wait
//! sits *inside* the bracket: at 64 KiB that added the ~4 µs host round trip to gpubind's
//! side only, and made pinned copies look half as fast as cudarc's.) Warm-ups first; gpubind and cudarc alternate, rep by rep; the
//! table shows medians. `--reps 0` picks 30/10/5 reps by size.

use cudarc::driver::{CudaContext, sys as csys};
use gpubind::{
    CopyDest, CopySource, Device, PinnedHostBuffer, PinnedOptions, RegisterOptions, RegisteredHost,
    ThreadContext,
};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Pageable,
    Pinned,
    Registered,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pageable => "pageable",
            Kind::Pinned => "pinned",
            Kind::Registered => "registered",
        }
    }
}

enum Host {
    Pageable(Vec<u8>),
    Pinned(PinnedHostBuffer<u8>),
    Registered(RegisteredHost<'static, u8>),
}

impl Host {
    fn bytes(&self) -> &[u8] {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
    fn src(&self) -> &dyn CopySource<u8> {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
    fn dst(&mut self) -> &mut dyn CopyDest<u8> {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn gbps(bytes: usize, ms: f32) -> f64 {
    bytes as f64 / (ms as f64 * 1e-3) / 1e9
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    if !gpubind::driver_available() {
        println!("SKIPPED bench_copy: no CUDA driver found");
        return Ok(());
    }
    let max = arg("--max-mib", 1024) << 20;
    let fixed_reps = arg("--reps", 0);
    let mut ctx = ThreadContext::acquire()?;
    let dev = Device::get(0)?;
    let gpu = ctx.bind(&dev)?;
    let stream = gpu.new_stream()?;
    let s = gpu.on(&stream)?;
    let (g0, g1) = (gpu.new_event(true)?, gpu.new_event(true)?);

    // cudarc on the same device (the same primary context), with its own stream.
    let cu = CudaContext::new(0)?;
    let cs = cu.new_stream()?;
    let timing = Some(csys::CUevent_flags::CU_EVENT_DEFAULT);
    let (c0, c1) = (cu.new_event(timing)?, cu.new_event(timing)?);

    println!("# bench_copy on {} (device 0)", dev.name());
    println!("| size | host memory | direction | gpubind GB/s | cudarc GB/s | gpubind/cudarc |");
    println!("| ---: | --- | --- | ---: | ---: | ---: |");
    let mut size = 64 << 10;
    while size <= max {
        let reps = if fixed_reps > 0 {
            fixed_reps
        } else if size <= 16 << 20 {
            30
        } else if size <= 256 << 20 {
            10
        } else {
            5
        };
        let mut gdev = gpu.alloc_zeros::<u8>(size)?;
        let mut cdev = cs.alloc_zeros::<u8>(size)?;
        for kind in [Kind::Pageable, Kind::Pinned, Kind::Registered] {
            let pattern: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
            let mut host = match kind {
                Kind::Pageable => Host::Pageable(pattern.clone()),
                Kind::Pinned => {
                    Host::Pinned(gpu.pinned_from_slice(&pattern, PinnedOptions::default())?)
                }
                Kind::Registered => {
                    Host::Registered(gpu.register_vec(pattern.clone(), RegisterOptions::default())?)
                }
            };
            for h2d in [true, false] {
                let (mut tg, mut tc) = (Vec::new(), Vec::new());
                for rep in 0..reps + 3 {
                    // gpubind
                    s.record(&g0)?;
                    // SAFETY: `host` and `gdev` stay alive and untouched until
                    // `g1.synchronize()` below, after the copy has run.
                    unsafe {
                        if h2d {
                            s.copy_async(host.src(), &mut gdev)?;
                        } else {
                            s.copy_async(&gdev, host.dst())?;
                        }
                    }
                    s.record(&g1)?;
                    g1.synchronize()?;
                    let ms_g = g0.elapsed_ms(&g1)?;
                    // cudarc, same host memory
                    c0.record(&cs)?;
                    if h2d {
                        cs.memcpy_htod(host.bytes(), &mut cdev)?;
                    } else {
                        cs.memcpy_dtoh(&cdev, host.bytes_mut())?;
                    }
                    c1.record(&cs)?;
                    c1.synchronize()?;
                    let ms_c = c0.elapsed_ms(&c1)?;
                    if rep >= 3 {
                        tg.push(ms_g);
                        tc.push(ms_c);
                    }
                }
                // Both paths really moved the bytes.
                if h2d {
                    let back = gpu.dtoh(&gdev)?;
                    let back_c = cs.clone_dtoh(&cdev)?;
                    if back != pattern || back_c != pattern {
                        return Err(format!("{} H2D copy corrupted data", kind.name()).into());
                    }
                } else if host.bytes() != &pattern[..] {
                    return Err(format!("{} D2H copy corrupted data", kind.name()).into());
                }
                let (mg, mc) = (median(tg), median(tc));
                let (bg, bc) = (gbps(size, mg), gbps(size, mc));
                println!(
                    "| {} | {} | {} | {:.2} | {:.2} | {:.3} |",
                    human(size),
                    kind.name(),
                    if h2d { "H2D" } else { "D2H" },
                    bg,
                    bc,
                    bg / bc
                );
            }
        }
        size *= 4;
    }
    Ok(())
}
