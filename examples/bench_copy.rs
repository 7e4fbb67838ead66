//! Host<->device copy bandwidth: pageable vs pinned vs registered host memory, gpubind's
//! stream-ordered copy (`BoundStream::copy_async`, the enqueue under the safe
//! `copy_scope`) against cudarc's own path (`CudaStream::memcpy_htod` / `memcpy_dtoh`) on
//! the same host memory, in the same run.
//!
//! Then the two-stream pipeline (upload, kernel, download of double-buffered chunks with
//! the safe `copy_tracked_async`, against the same work on one stream), and the
//! device-to-device rows at each `--d2d-mib` size: on GPU 0, `dtod_async` against a raw
//! `cuMemcpyDtoDAsync`; GPU 0 -> GPU 1, `copy_peer_async` against a raw
//! `cuMemcpyPeerAsync` and against NCCL's send/recv (a grouped `Communicator`, one thread
//! driving both GPUs; feature `nccl`, NCCL installed, else that column is SKIPPED). With
//! one GPU the GPU 0 -> GPU 1 row prints one SKIPPED line.
//!
//! `cargo run --release --example bench_copy [-- --max-mib 1024 --reps 0 --chunk-mib 64
//! --chunks 16 --trace --d2d-mib 64,256]` (`--trace`: the pipeline's per-chunk stage times)
//!
//! Each measurement is bracketed by CUDA events on the copy's stream, with only the
//! enqueue between them on both sides and the host wait after the end event, so the
//! events time the transfer itself (`copy_scope` would put its host wait inside the
//! bracket: the ~4 µs host round trip on gpubind's side only). NCCL's send/recv is
//! bracketed on both ranks' streams and counts the later. Warm-ups first; the paths
//! alternate, rep by rep; the tables show medians. `--reps 0` picks 30/10/5 reps by size.

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
    drop(gpu);
    pipeline(&mut ctx, &dev)?;
    device_to_device(&mut ctx, &cu, &cs)?;
    Ok(())
}

/// `x[i]` after `iters` steps of a 32-bit LCG: work whose time scales with `iters`, and
/// whose result the host can check exactly.
const WORK: &str = r#"
extern "C" __global__ void work(unsigned* x, unsigned n, unsigned iters) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned v = x[i];
        for (unsigned k = 0; k < iters; ++k) v = v * 1664525u + 1013904223u;
        x[i] = v;
    }
}
"#;

fn lcg(mut v: u32, iters: u32) -> u32 {
    for _ in 0..iters {
        v = v.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    }
    v
}

/// One chunk's stage boundaries on its stream (timing events): before its upload, after
/// the upload, after the kernel, after the download.
type Marks = Vec<[gpubind::Event; 4]>;

/// One buffer set: pinned input, device buffer, pinned output.
type Set = (
    PinnedHostBuffer<u32>,
    gpubind::DeviceSlice<u32>,
    PinnedHostBuffer<u32>,
);

/// Enqueues chunk after chunk of upload (pinned -> device), kernel, download
/// (device -> pinned) with `copy_tracked_async`; chunk `k` goes on stream `k % n` with
/// that stream's own buffer set (`sets[k % n]`), as a user double-buffers over two
/// streams: each stream's chunks follow one another in stream order, and the two streams
/// share no buffer, so nothing orders one stream after the other and the copy engines
/// (one per direction) and the SMs can each work on a different chunk. With `marks`,
/// records each chunk's stage boundaries. Returns the wall time until every stream is
/// idle.
fn run_pipeline(
    gpu: &gpubind::BoundDevice<'_>,
    streams: &[&gpubind::Stream],
    sets: &mut [Set],
    work: &gpubind::Function<'_>,
    chunks: usize,
    iters: u32,
    marks: Option<&Marks>,
) -> Res<f64> {
    for st in streams {
        gpu.on(st)?.synchronize()?;
    }
    let t = std::time::Instant::now();
    for k in 0..chunks {
        let i = k % streams.len();
        let s = gpu.on(streams[i])?;
        let (input, dev, output) = &mut sets[i];
        let n = dev.len() as u32;
        let mark = |j: usize| -> Res<()> {
            if let Some(m) = marks {
                s.record(&m[k][j])?;
            }
            Ok(())
        };
        mark(0)?;
        s.copy_tracked_async(&*input, dev)?;
        mark(1)?;
        // SAFETY: `work` takes (unsigned*, unsigned, unsigned) and stays in bounds.
        unsafe {
            s.launch(work, gpubind::LaunchConfig::for_num_elems(n))
                .arg(&mut *dev)
                .arg(&n)
                .arg(&iters)
                .launch()?;
        }
        mark(2)?;
        s.copy_tracked_async(&*dev, output)?;
        mark(3)?;
    }
    for st in streams {
        gpu.on(st)?.synchronize()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Chunk `k`'s stages from its marks: `(start, [upload, kernel, download])` in ms, the
/// start relative to chunk 0's.
fn stages(marks: &Marks, k: usize) -> Res<(f32, [f32; 3])> {
    let m = &marks[k];
    Ok((
        marks[0][0].elapsed_ms(&m[0])?,
        [
            m[0].elapsed_ms(&m[1])?,
            m[1].elapsed_ms(&m[2])?,
            m[2].elapsed_ms(&m[3])?,
        ],
    ))
}

/// The kernel's LCG steps that make it take about as long as one chunk's copy, from
/// event timings of the kernel alone (a wall-clock estimate of a few microseconds per
/// step drowns in the copies' jitter, and a kernel far longer than the copies leaves
/// nothing to overlap: every stream then waits for the SMs). Returns the steps and the
/// one-stream stage times `[upload, kernel, download]` in ms at those steps.
fn calibrate(
    gpu: &gpubind::BoundDevice<'_>,
    a: &gpubind::Stream,
    set: &mut [Set],
    work: &gpubind::Function<'_>,
    marks: &Marks,
) -> Res<(u32, [f32; 3])> {
    let time = |set: &mut [Set], iters: u32| -> Res<[f32; 3]> {
        let mut best = [f32::MAX; 3];
        for _ in 0..3 {
            run_pipeline(gpu, &[a], set, work, 1, iters, Some(marks))?;
            let (_, t) = stages(marks, 0)?;
            for (b, x) in best.iter_mut().zip(t) {
                *b = b.min(x);
            }
        }
        Ok(best)
    };
    let base = time(set, 0)?;
    let copy_ms = (base[0] + base[2]) / 2.0;
    let mut probe = 256u32;
    let mut kernel = time(set, probe)?[1];
    // Long enough to measure against the empty kernel, short enough to stay cheap.
    while kernel - base[1] < copy_ms / 4.0 && probe < 1 << 20 {
        probe *= 4;
        kernel = time(set, probe)?[1];
    }
    let per_step = ((kernel - base[1]) / probe as f32).max(f32::MIN_POSITIVE);
    let iters = (((copy_ms - base[1]) / per_step) as u32).clamp(1, 1 << 20);
    Ok((iters, time(set, iters)?))
}

/// The best one-stream / two-stream ratio for stages `[upload, kernel, download]`: one
/// stream runs them one after another; two streams need at least half the chain per
/// chunk and at least the longest stage (one copy engine per direction, one kernel at a
/// time when each fills the GPU).
fn best_ratio(t: [f32; 3]) -> f32 {
    let chain: f32 = t.iter().sum();
    chain / (chain / 2.0).max(t[0]).max(t[1]).max(t[2])
}

/// The two-stream pipeline: upload, kernel, download of chunks on two streams, each with
/// its own buffer set (double-buffering), against the same work on one stream. The
/// kernel is calibrated with events to take about as long as one chunk's copy, so the
/// stages can overlap: upload of chunk k+1, kernel of chunk k and download of chunk k-1.
/// Prints the stage times, the best ratio they allow, and the stages' overlap in a traced
/// two-stream run (`--trace`: every chunk's stage timeline).
fn pipeline(ctx: &mut ThreadContext, dev: &std::sync::Arc<Device>) -> Res<()> {
    let gpu = ctx.bind(dev)?;
    let module = gpu.compile_and_load(WORK, "work.cu")?;
    let work = module.function("work")?;
    let n = arg("--chunk-mib", 64) << 18; // u32 elements
    let chunks = arg("--chunks", 16).max(2);
    let trace = std::env::args().any(|a| a == "--trace");
    let mut sets = Vec::new();
    for set in 0..2u32 {
        let input: Vec<u32> = (0..n as u32).map(|i| i ^ (set << 24)).collect();
        sets.push((
            gpu.pinned_from_slice(&input, PinnedOptions::default())?,
            gpu.alloc_zeros::<u32>(n)?,
            gpu.alloc_pinned::<u32>(n, PinnedOptions::default())?,
        ));
    }
    let (a, b) = (gpu.new_stream()?, gpu.new_stream()?);
    let marks: Marks = (0..chunks)
        .map(|_| -> Res<[gpubind::Event; 4]> {
            Ok([
                gpu.new_event(true)?,
                gpu.new_event(true)?,
                gpu.new_event(true)?,
                gpu.new_event(true)?,
            ])
        })
        .collect::<Res<_>>()?;
    let (iters, t) = calibrate(&gpu, &a, &mut sets[..1], &work, &marks)?;
    let (mut t1, mut t2) = (Vec::new(), Vec::new());
    for rep in 0..6 {
        let one_stream = run_pipeline(&gpu, &[&a], &mut sets, &work, chunks, iters, None)?;
        let two_streams = run_pipeline(&gpu, &[&a, &b], &mut sets, &work, chunks, iters, None)?;
        if rep > 0 {
            t1.push(one_stream as f32);
            t2.push(two_streams as f32);
        }
    }
    // A traced two-stream run, which also leaves both sets' last chunks to check.
    run_pipeline(
        &gpu,
        &[&a, &b],
        &mut sets,
        &work,
        chunks,
        iters,
        Some(&marks),
    )?;
    for (set, (input, _, output)) in sets.iter().enumerate() {
        let (inp, out): (&[u32], &[u32]) = (input, output);
        for i in (0..n).step_by(n / 97 + 1) {
            if out[i] != lcg(inp[i], iters) {
                return Err(format!("pipeline set {set}: element {i} wrong").into());
            }
        }
    }
    let (m1, m2) = (median(t1), median(t2));
    println!();
    println!(
        "# pipeline: {chunks} chunks of {} (upload, kernel of {iters} LCG steps, download)",
        human(n * 4)
    );
    println!(
        "stages of one chunk on one stream (events): upload {:.3} ms, kernel {:.3} ms, \
         download {:.3} ms; best 1/2-stream ratio for these: {:.2}",
        t[0],
        t[1],
        t[2],
        best_ratio(t)
    );
    let mut busy = 0f32;
    let mut span = 0f32;
    if trace {
        println!("| chunk | stream | start ms | upload ms | kernel ms | download ms |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    }
    for k in 0..chunks {
        let (start, st) = stages(&marks, k)?;
        busy += st.iter().sum::<f32>();
        span = span.max(start + st.iter().sum::<f32>());
        if trace {
            println!(
                "| {k} | {} | {start:.3} | {:.3} | {:.3} | {:.3} |",
                k % 2,
                st[0],
                st[1],
                st[2]
            );
        }
    }
    println!(
        "traced 2-stream run: {span:.2} ms from the first upload to the last download, \
         {busy:.2} ms of stages: overlap {:.2} (1.00: none; up to 2 with two streams)",
        busy / span
    );
    println!("| row | 1 stream ms | 2 streams ms | 1 stream / 2 streams |");
    println!("| --- | ---: | ---: | ---: |");
    let ratio = m1 / m2;
    println!(
        "| pipeline (copy_tracked_async, double-buffered) | {m1:.2} | {m2:.2} | {ratio:.2}{} |",
        if ratio >= 1.6 {
            ""
        } else {
            " (below 1.6: little overlap)"
        }
    );
    Ok(())
}

/// `--d2d-mib` as sizes in bytes: comma-separated MiB, default 64 and 256.
fn d2d_sizes() -> Res<Vec<usize>> {
    let args: Vec<String> = std::env::args().collect();
    let list = args
        .iter()
        .position(|a| a == "--d2d-mib")
        .and_then(|i| args.get(i + 1))
        .map_or("64,256", |v| v.as_str());
    list.split(',')
        .map(|m| match m.trim().parse::<usize>() {
            Ok(mib) if mib > 0 => Ok(mib << 20),
            _ => Err(format!("--d2d-mib {list:?}: want sizes in MiB, e.g. 64,256").into()),
        })
        .collect()
}

fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 13 + 1) as u8).collect()
}

/// Milliseconds of what `enqueue` puts on a stream, between the events that `record_a`
/// and `record_b` record on it; `elapsed` waits for the second and reads the time.
fn bracket(
    record_a: impl FnOnce() -> Res<()>,
    enqueue: impl FnOnce() -> Res<()>,
    record_b: impl FnOnce() -> Res<()>,
    elapsed: impl FnOnce() -> Res<f32>,
) -> Res<f32> {
    record_a()?;
    enqueue()?;
    record_b()?;
    elapsed()
}

/// The device-to-device rows: on GPU 0 (`dtod_async` against a raw `cuMemcpyDtoDAsync`),
/// then GPU 0 -> GPU 1 (`copy_peer_async`, a raw `cuMemcpyPeerAsync`, and NCCL's
/// send/recv), at each `--d2d-mib` size.
fn device_to_device(
    ctx: &mut ThreadContext,
    cu0: &std::sync::Arc<CudaContext>,
    cs: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> Res<()> {
    let sizes = d2d_sizes()?;
    same_device(ctx, cu0, cs, &sizes)?;
    between_devices(ctx, cu0, cs, &sizes)
}

/// GPU 0 to GPU 0: `BoundStream::dtod_async` against a raw `cuMemcpyDtoDAsync` on the
/// same buffers, alternating rep by rep. GB/s counts the bytes copied once (each is read
/// and written).
fn same_device(
    ctx: &mut ThreadContext,
    cu0: &std::sync::Arc<CudaContext>,
    cs: &std::sync::Arc<cudarc::driver::CudaStream>,
    sizes: &[usize],
) -> Res<()> {
    println!();
    println!("# device to device on GPU 0");
    println!("| size | gpubind dtod_async GB/s | raw cuMemcpyDtoDAsync GB/s | gpubind/raw |");
    println!("| ---: | ---: | ---: | ---: |");
    let dev = Device::get(0)?;
    let gpu = ctx.bind(&dev)?;
    let stream = gpu.new_stream()?;
    let s = gpu.on(&stream)?;
    let (g0, g1) = (gpu.new_event(true)?, gpu.new_event(true)?);
    let timing = Some(csys::CUevent_flags::CU_EVENT_DEFAULT);
    let (c0, c1) = (cu0.new_event(timing)?, cu0.new_event(timing)?);
    for &size in sizes {
        let pattern = pattern(size);
        let src = gpu.clone_htod(&pattern)?;
        let mut dst = gpu.alloc_zeros::<u8>(size)?;
        let (mut tg, mut tr) = (Vec::new(), Vec::new());
        for rep in 0..13 {
            let ms_g = bracket(
                || Ok(s.record(&g0)?),
                || Ok(s.dtod_async(&src, &mut dst)?),
                || Ok(s.record(&g1)?),
                || Ok(g1.synchronize().and_then(|()| g0.elapsed_ms(&g1))?),
            )?;
            let ms_r = bracket(
                || Ok(c0.record(cs)?),
                || {
                    // SAFETY: both buffers live, of `size` bytes, on GPU 0; gpubind's
                    // copy has finished (g1 synchronised) and the raw copy is waited for
                    // (c1) before gpubind uses them again.
                    let r = unsafe {
                        csys::cuMemcpyDtoDAsync_v2(
                            dst.raw_ptr(),
                            src.raw_ptr(),
                            size,
                            cs.cu_stream(),
                        )
                    };
                    if r != csys::CUresult::CUDA_SUCCESS {
                        return Err(format!("cuMemcpyDtoDAsync: {r:?}").into());
                    }
                    Ok(())
                },
                || Ok(c1.record(cs)?),
                || Ok(c1.synchronize().and_then(|()| c0.elapsed_ms(&c1))?),
            )?;
            if rep >= 3 {
                tg.push(ms_g);
                tr.push(ms_r);
            }
        }
        if gpu.dtoh(&dst)? != pattern {
            return Err("device-to-device copy on GPU 0 corrupted data".into());
        }
        let (bg, br) = (gbps(size, median(tg)), gbps(size, median(tr)));
        println!("| {} | {bg:.1} | {br:.1} | {:.3} |", human(size), bg / br);
    }
    Ok(())
}

/// Milliseconds of one NCCL send of `src` (rank 0, GPU 0) into `dst` (rank 1, GPU 1):
/// events around the group on both ranks' streams, the later of the two.
#[cfg(feature = "nccl")]
fn nccl_send_recv(
    ctx: &mut ThreadContext,
    comm: &gpubind::collective::Communicator,
    events: &[(gpubind::Event, gpubind::Event); 2],
    src: &gpubind::DeviceSlice<u8>,
    dst: &mut gpubind::DeviceSlice<u8>,
) -> Res<f32> {
    let lanes = |r: usize| -> Res<(std::sync::Arc<Device>, &gpubind::Stream)> {
        Ok((
            std::sync::Arc::clone(comm.device(r).ok_or("rank")?),
            comm.stream(r).ok_or("rank")?,
        ))
    };
    let ranks = [lanes(0)?, lanes(1)?];
    for ((dev, st), (a, _)) in ranks.iter().zip(events) {
        ctx.bind(dev)?.on(st)?.record(a)?;
    }
    ctx.group(comm, |g| {
        g.send(0, src, 1)?;
        g.recv(1, dst, 0)
    })?;
    for ((dev, st), (_, b)) in ranks.iter().zip(events) {
        ctx.bind(dev)?.on(st)?.record(b)?;
    }
    let mut worst = 0f32;
    for (a, b) in events {
        b.synchronize()?;
        worst = worst.max(a.elapsed_ms(b)?);
    }
    Ok(worst)
}

/// What the GPU 0 -> GPU 1 rows use at every size: both devices, both sides' streams and
/// timing events, and NCCL's communicator with an event pair per rank, or why there is
/// none.
struct Peer {
    d0: std::sync::Arc<Device>,
    d1: std::sync::Arc<Device>,
    cu0: std::sync::Arc<CudaContext>,
    cu1: std::sync::Arc<CudaContext>,
    cs: std::sync::Arc<cudarc::driver::CudaStream>,
    stream: gpubind::Stream,
    g: (gpubind::Event, gpubind::Event),
    c: (cudarc::driver::CudaEvent, cudarc::driver::CudaEvent),
    #[cfg(feature = "nccl")]
    nccl: Result<NcclPair, String>,
}

/// GPU 0 -> GPU 1: gpubind's `copy_peer_async` (ordered by the buffers' trackers), a raw
/// `cuMemcpyPeerAsync` on the same buffers, and NCCL's send/recv (feature `nccl`, NCCL
/// installed) between the same buffers, alternating rep by rep; each path's result is
/// checked. One SKIPPED line with fewer than 2 GPUs.
fn between_devices(
    ctx: &mut ThreadContext,
    cu0: &std::sync::Arc<CudaContext>,
    cs: &std::sync::Arc<cudarc::driver::CudaStream>,
    sizes: &[usize],
) -> Res<()> {
    println!();
    println!("# device to device (GPU 0 -> GPU 1)");
    let visible = Device::count()?;
    if visible < 2 {
        println!("SKIPPED: needs 2 GPUs (GPU 0 -> GPU 1 row), {visible} visible");
        return Ok(());
    }
    let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    let (stream, g) = {
        let gpu = ctx.bind(&d0)?;
        (
            gpu.new_stream()?,
            (gpu.new_event(true)?, gpu.new_event(true)?),
        )
    };
    let timing = Some(csys::CUevent_flags::CU_EVENT_DEFAULT);
    let peer = Peer {
        #[cfg(feature = "nccl")]
        nccl: nccl_pair(ctx, &[d0.clone(), d1.clone()])?,
        d0,
        d1,
        cu0: cu0.clone(),
        cu1: CudaContext::new(1)?,
        cs: cs.clone(),
        stream,
        g,
        c: (cu0.new_event(timing)?, cu0.new_event(timing)?),
    };
    #[cfg(feature = "nccl")]
    let no_nccl = peer.nccl.as_ref().err();
    #[cfg(not(feature = "nccl"))]
    let no_nccl = Some("built without the `nccl` feature");
    if let Some(why) = no_nccl {
        println!("NCCL send/recv column: SKIPPED ({why})");
    }
    println!(
        "| size | gpubind copy_peer_async GB/s | raw cuMemcpyPeerAsync GB/s | NCCL send/recv GB/s | gpubind/raw | gpubind/NCCL |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for &size in sizes {
        peer_row(ctx, &peer, size)?;
    }
    Ok(())
}

/// NCCL's communicator over GPUs 0 and 1, and a timing event pair per rank.
#[cfg(feature = "nccl")]
type NcclPair = (
    gpubind::collective::Communicator,
    [(gpubind::Event, gpubind::Event); 2],
);

/// [`NcclPair`], or why NCCL cannot be measured here.
#[cfg(feature = "nccl")]
fn nccl_pair(
    ctx: &mut ThreadContext,
    devices: &[std::sync::Arc<Device>; 2],
) -> Res<Result<NcclPair, String>> {
    use gpubind::collective::{CommOptions, Communicator, nccl_available};
    if !nccl_available() {
        return Ok(Err("NCCL is not installed".into()));
    }
    let comm = Communicator::new(ctx, devices, CommOptions::nccl())?;
    let mut events = Vec::new();
    for d in devices {
        let gpu = ctx.bind(d)?;
        events.push((gpu.new_event(true)?, gpu.new_event(true)?));
    }
    let [a, b]: [_; 2] = events.try_into().map_err(|_| "two event pairs")?;
    Ok(Ok((comm, [a, b])))
}

/// Rep 0 of a path: `dst` must hold `pattern`; then it is zeroed for the next path.
fn check_peer(
    ctx: &mut ThreadContext,
    d1: &std::sync::Arc<Device>,
    dst: &mut gpubind::DeviceSlice<u8>,
    pattern: &[u8],
    what: &str,
) -> Res<()> {
    let gpu = ctx.bind(d1)?;
    if gpu.dtoh(&*dst)? != pattern {
        return Err(format!("{what} GPU 0 -> GPU 1 corrupted data").into());
    }
    gpu.memset_zeros(dst)?;
    Ok(())
}

/// One GPU 0 -> GPU 1 row: 3 warm-up and 10 timed reps of each path, alternating; rep 0
/// of each is checked from a zeroed destination.
fn peer_row(ctx: &mut ThreadContext, p: &Peer, size: usize) -> Res<()> {
    let pattern = pattern(size);
    let mut dst = ctx.bind(&p.d1)?.alloc_zeros::<u8>(size)?;
    let src = ctx.bind(&p.d0)?.clone_htod(&pattern)?;
    #[cfg_attr(not(feature = "nccl"), allow(unused_mut))]
    let (mut tg, mut tr, mut tn) = (Vec::<f32>::new(), Vec::new(), Vec::<f32>::new());
    for rep in 0..13 {
        let ms_g = {
            let gpu = ctx.bind(&p.d0)?;
            let s = gpu.on(&p.stream)?;
            let (g0, g1) = &p.g;
            bracket(
                || Ok(s.record(g0)?),
                || Ok(s.copy_peer_async(&src, &mut dst)?),
                || Ok(s.record(g1)?),
                || Ok(g1.synchronize().and_then(|()| g0.elapsed_ms(g1))?),
            )?
        };
        if rep == 0 {
            check_peer(ctx, &p.d1, &mut dst, &pattern, "copy_peer_async")?;
        }
        let (c0, c1) = &p.c;
        let ms_r = bracket(
            || Ok(c0.record(&p.cs)?),
            || {
                // SAFETY: both buffers live, of `size` bytes; gpubind's uses of them have
                // finished (g1 synchronised, the check's copies are synchronous) and the
                // raw copy is waited for (c1) before gpubind uses them again.
                let r = unsafe {
                    csys::cuMemcpyPeerAsync(
                        dst.raw_ptr(),
                        p.cu1.cu_ctx(),
                        src.raw_ptr(),
                        p.cu0.cu_ctx(),
                        size,
                        p.cs.cu_stream(),
                    )
                };
                if r != csys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuMemcpyPeerAsync: {r:?}").into());
                }
                Ok(())
            },
            || Ok(c1.record(&p.cs)?),
            || Ok(c1.synchronize().and_then(|()| c0.elapsed_ms(c1))?),
        )?;
        if rep == 0 {
            check_peer(ctx, &p.d1, &mut dst, &pattern, "cuMemcpyPeerAsync")?;
        }
        #[cfg(feature = "nccl")]
        if let Ok((comm, events)) = &p.nccl {
            let ms = nccl_send_recv(ctx, comm, events, &src, &mut dst)?;
            if rep == 0 {
                check_peer(ctx, &p.d1, &mut dst, &pattern, "NCCL send/recv")?;
            }
            if rep >= 3 {
                tn.push(ms);
            }
        }
        if rep >= 3 {
            tg.push(ms_g);
            tr.push(ms_r);
        }
    }
    let (bg, br) = (gbps(size, median(tg)), gbps(size, median(tr)));
    let (nccl_col, vs_nccl) = if tn.is_empty() {
        ("—".to_string(), "—".to_string())
    } else {
        let bn = gbps(size, median(tn));
        (format!("{bn:.1}"), format!("{:.3}", bg / bn))
    };
    println!(
        "| {} | {bg:.1} | {br:.1} | {nccl_col} | {:.3} | {vs_nccl} |",
        human(size),
        bg / br
    );
    Ok(())
}
