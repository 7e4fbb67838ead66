//! GPU host-memory soak: 16 threads, each with its own `ThreadContext`, bound device and
//! streams, run a mixed workload (stream-ordered and synchronous allocations of varying
//! sizes, pageable and pinned copies both ways, launches of one shared NVRTC kernel, graph
//! capture + instantiate + launch + drop, events, short-lived streams, `memory_info`),
//! checking every result, through a warm-up and two windows (`GPUBIND_SOAK_SECONDS`
//! each, default 20). The process's resident set (`VmRSS`) must grow by less than
//! 16 MiB over the second window; device memory must stay flat. Without a driver: one
//! SKIPPED line.
//!
//! At the end of the warm-up and of each window every thread stops with all its
//! per-iteration resources dropped and its streams synchronised, and the main thread
//! reads `VmRSS`, glibc's heap counters (`mallinfo2`: bytes in use, bytes free but kept
//! in the arenas) and the device's memory. Nothing is trimmed before these readings:
//! they are the process as it runs. Only after the last one does the test call
//! `malloc_trim(0)` and read `VmRSS` once more ("after trim").
//!
//! # What fails
//!
//! * Bytes in use on the heap (`mallinfo2`'s `uordblks + hblkhd`) growing by 16 MiB or
//!   more over the second window: memory allocated and never freed, a leak whatever
//!   `VmRSS` says.
//! * `VmRSS` growing by 16 MiB or more over the second window, unless that growth is the
//!   allocator's: glibc keeps freed memory in its arenas (one per thread that allocated
//!   concurrently, up to 8 per core, each keeping what fragmentation and its dynamic
//!   trim threshold leave it) and gives it back on `malloc_trim(0)`. The growth counts
//!   as the allocator's only when the heap in use grew by less than 16 MiB AND `VmRSS`
//!   after `malloc_trim(0)` at the end is less than 16 MiB above `VmRSS` at the end of
//!   window 1 (untrimmed): all the second window added was memory glibc held free, not
//!   memory anyone still held, nor memory outside the heap (the driver's own mappings,
//!   thread stacks). The test then prints the figures, glibc's free bytes at each
//!   checkpoint and `malloc_stats()`'s per-arena lines (on stderr), and passes;
//!   otherwise it fails with the figures.
//! * Device memory in use (`cuMemGetInfo`: total − free) growing by 64 MiB or more over
//!   the second window, or gpubind's own count of its allocations
//!   (`Device::memory_usage().in_use`) differing between the checkpoints (every
//!   per-iteration buffer is dropped by then).
//! * A wrong result, an error, or a panic in any thread (the first one, with its thread
//!   number and message).
//!
//! Run: `cargo test --test gpu_soak` (on a GPU machine, or the built binary);
//! `GPUBIND_SOAK_SECONDS=60 GPUBIND_TEST_TIMEOUT=300` for longer windows.

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{
    BoundDevice, BoundStream, Device, Kernel, LaunchConfig, PinnedOptions, ThreadContext,
};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

type R = Result<(), String>;

const THREADS: usize = 16;
const WARM_UP: Duration = Duration::from_secs(8);
const DEFAULT_WINDOW_SECS: f64 = 20.0;
const MIB: f64 = 1024.0 * 1024.0;
/// Second-window growth of the resident set (or of the heap in use) that fails.
const HOST_LIMIT: f64 = 16.0 * MIB;
/// Second-window growth of the device memory in use that fails.
const DEVICE_LIMIT: f64 = 64.0 * MIB;

const KERNEL: &str = r#"
extern "C" __global__ void soak_add(unsigned* out, const unsigned* in, unsigned n, unsigned v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + v;
}
"#;

fn main() {
    run_suite(
        "gpu_soak",
        &[("host_memory_stays_flat_under_a_16_thread_soak", soak)],
    );
}

/// Seconds per window: `GPUBIND_SOAK_SECONDS` (at least 1), default 20.
fn window() -> Result<Duration, String> {
    match std::env::var("GPUBIND_SOAK_SECONDS") {
        Err(_) => Ok(Duration::from_secs_f64(DEFAULT_WINDOW_SECS)),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 1.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(format!(
                "GPUBIND_SOAK_SECONDS={v:?}: want a number of seconds, at least 1"
            )),
        },
    }
}

fn soak() -> R {
    let window = window()?;
    let budget = std::env::var("GPUBIND_TEST_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(120.0);
    let needed = WARM_UP.as_secs_f64() + 2.0 * window.as_secs_f64() + 30.0;
    ensure!(
        needed <= budget,
        "windows of {:.0} s need about {needed:.0} s; raise GPUBIND_TEST_TIMEOUT (now {budget:.0})",
        window.as_secs_f64()
    );
    let dev = dev0()?;
    // Compiled once; every thread launches the same kernel (it holds the module).
    let kernel = {
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let module = gpu.compile_and_load(KERNEL, "soak.cu").ctx("compile")?;
        module.into_shared().kernel("soak_add").ctx("kernel")?
    };
    let gate = Gate::new(THREADS + 1);
    let iterations = AtomicU64::new(0);
    let phases = [WARM_UP, window, window];
    let shared = Shared {
        dev: &dev,
        kernel: &kernel,
        gate: &gate,
        iterations: &iterations,
        phases: &phases,
    };
    println!(
        "soak: {THREADS} threads, warm-up {:.0} s, 2 windows of {:.0} s",
        WARM_UP.as_secs_f64(),
        window.as_secs_f64()
    );
    let (measured, failures) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|id| {
                let shared = &shared;
                scope.spawn(move || {
                    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| worker(id, shared)))
                        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
                    if let Err(e) = &outcome {
                        shared.gate.fail(format!("thread {id}: {e}"));
                    }
                    outcome
                })
            })
            .collect();
        let measured = std::panic::catch_unwind(AssertUnwindSafe(|| measure(&shared)))
            .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
        if let Err(e) = &measured {
            shared.gate.fail(format!("main thread: {e}"));
        }
        let failures: Vec<String> = handles
            .into_iter()
            .enumerate()
            .filter_map(|(id, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("thread {id}: {e}")),
                Err(p) => Some(format!("thread {id}: panicked: {}", panic_text(&*p))),
            })
            .collect();
        (measured, failures)
    });
    // A thread's own failure first, then the main thread's, not the others' "another
    // thread failed".
    let own = failures.iter().find(|f| !f.contains(Gate::ABANDONED));
    if let Some(first) = own {
        return Err(format!(
            "{} of {THREADS} threads failed; first: {first}",
            failures.len()
        ));
    }
    let measured = measured?;
    if let Some(first) = failures.first() {
        return Err(first.clone());
    }
    judge(&measured.0, measured.1)
}

/// What the worker threads share.
struct Shared<'a> {
    dev: &'a std::sync::Arc<Device>,
    kernel: &'a Kernel,
    gate: &'a Gate,
    iterations: &'a AtomicU64,
    /// Warm-up, window 1, window 2.
    phases: &'a [Duration; 3],
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A barrier that any party can break: after [`fail`](Gate::fail), every wait (also
/// the ones already blocked) returns an error instead of blocking forever.
struct Gate {
    parties: usize,
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    arrived: usize,
    generation: u64,
    failed: Option<String>,
}

impl Gate {
    const ABANDONED: &'static str = "stopped: another thread failed";

    fn new(parties: usize) -> Gate {
        Gate {
            parties,
            state: Mutex::new(GateState {
                arrived: 0,
                generation: 0,
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) -> R {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = s.generation;
        s.arrived += 1;
        if s.failed.is_none() && s.arrived == self.parties {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.generation == generation && s.failed.is_none() {
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        match &s.failed {
            None => Ok(()),
            Some(why) => Err(format!("{} ({why})", Gate::ABANDONED)),
        }
    }

    fn fail(&self, why: String) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.failed.get_or_insert(why);
        self.cv.notify_all();
    }
}

/// One worker: its own context, binding and streams; per phase, iterations until the
/// phase's time is up, then its streams synchronised and a stop at the gate while the
/// main thread measures.
fn worker(id: usize, sh: &Shared<'_>) -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(sh.dev).ctx("bind")?;
    let (main_stream, side_stream) = (
        gpu.new_stream().ctx("new_stream")?,
        gpu.new_stream().ctx("new_stream")?,
    );
    let s = gpu.on(&main_stream).ctx("on")?;
    let side = gpu.on(&side_stream).ctx("on")?;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut it = 0u64;
    for phase in sh.phases {
        sh.gate.wait()?; // start together
        let end = Instant::now() + *phase;
        while Instant::now() < end {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            iteration(&gpu, &s, &side, sh.kernel, rng, it)
                .map_err(|e| format!("iteration {it}: {e}"))?;
            it += 1;
            sh.iterations.fetch_add(1, Ordering::Relaxed);
        }
        s.synchronize().ctx("synchronize")?;
        side.synchronize().ctx("synchronize")?;
        sh.gate.wait()?; // quiet: the main thread measures
    }
    sh.gate.wait() // kept until the last reading is taken
}

/// One round of everything, every result checked; all it allocates is dropped on return.
fn iteration(
    gpu: &BoundDevice<'_>,
    s: &BoundStream<'_>,
    side: &BoundStream<'_>,
    kernel: &Kernel,
    rng: u64,
    it: u64,
) -> R {
    // 1 KiB to 1 MiB, spread over the sizes glibc serves from arenas and from mmap.
    let n = 256u32 << (rng % 11);
    let n = n - (rng >> 32) as u32 % (n / 2);
    let v = (rng >> 16) as u32;
    let host: Vec<u32> = (0..n).map(|i| i ^ v).collect();
    let cfg = LaunchConfig::for_num_elems(n);

    // Synchronous allocation + pageable upload; stream-ordered allocation; a launch.
    let input = gpu.clone_htod(&host).ctx("clone_htod")?;
    let mut out = s.alloc_zeros::<u32>(n as usize).ctx("stream alloc")?;
    // SAFETY: (unsigned*, const unsigned*, unsigned, unsigned) matches `soak_add`, which
    // stays within the n elements both buffers hold.
    unsafe {
        s.launch(kernel, cfg)
            .arg(&mut out)
            .arg(&input)
            .arg(&n)
            .arg(&v)
            .launch()
    }
    .ctx("launch")?;

    // Pinned download (tracked, asynchronous) and pageable download.
    let mut pinned = gpu
        .alloc_pinned::<u32>(n as usize, PinnedOptions::default())
        .ctx("alloc_pinned")?;
    s.copy_tracked_async(&out, &mut pinned)
        .ctx("copy to pinned")?;
    check(&pinned, &host, v, "pinned download")?;
    check(&gpu.dtoh(&out).ctx("dtoh")?, &host, v, "pageable download")?;

    // Pinned upload into a second stream-ordered buffer, on the side stream after an
    // event on the main stream.
    let ready = gpu.new_event(false).ctx("new_event")?;
    s.record(&ready).ctx("record")?;
    side.wait(&ready).ctx("wait")?;
    let mut back = side.alloc_zeros::<u32>(n as usize).ctx("side alloc")?;
    side.copy_tracked_async(&pinned, &mut back)
        .ctx("copy from pinned")?;
    let done = gpu.new_event(false).ctx("new_event")?;
    side.record(&done).ctx("record")?;
    done.synchronize().ctx("event synchronize")?;
    ensure!(
        done.is_complete().ctx("query")?,
        "event not complete after its synchronize"
    );

    // A graph: captured, instantiated, launched, dropped (out = back + 1).
    let one = 1u32;
    {
        let graph = gpu
            .capture(|c| {
                // SAFETY: as for the launch above.
                unsafe {
                    c.launch(kernel, cfg)
                        .arg_written(&out)
                        .arg(&back)
                        .arg(&n)
                        .arg(&one)
                        .launch()
                }
            })
            .ctx("capture")?;
        let exec = graph.instantiate().ctx("instantiate")?;
        exec.launch(s).ctx("graph launch")?;
    }
    check(
        &gpu.dtoh(&out).ctx("dtoh after graph")?,
        &host,
        v.wrapping_add(1),
        "graph result",
    )?;

    // A stream that lives for one allocation, and the device's memory counters.
    {
        let brief = gpu.new_stream().ctx("new_stream")?;
        let b = gpu.on(&brief).ctx("on")?;
        let mut tmp = b.alloc_zeros::<u32>((n / 4) as usize).ctx("brief alloc")?;
        b.memset_async(&mut tmp, (it as u32) | 1).ctx("memset")?;
        let got = gpu.dtoh(&tmp).ctx("dtoh brief")?;
        ensure!(
            got.iter().all(|&x| x == (it as u32) | 1),
            "memset on a brief stream: wrong contents"
        );
    }
    let (free, total) = gpu.memory_info().ctx("memory_info")?;
    ensure!(free <= total, "memory_info: free {free} > total {total}");
    Ok(())
}

/// `got[i] == host[i] + v` for every i.
fn check(got: &[u32], host: &[u32], v: u32, what: &str) -> R {
    ensure!(
        got.len() == host.len(),
        "{what}: {} elements, want {}",
        got.len(),
        host.len()
    );
    if let Some(i) = (0..got.len()).find(|&i| got[i] != host[i].wrapping_add(v)) {
        return Err(format!(
            "{what}: element {i} is {}, want {}",
            got[i],
            host[i].wrapping_add(v)
        ));
    }
    Ok(())
}

/// The figures read at one checkpoint.
#[derive(Clone, Copy, Debug)]
struct Reading {
    rss: f64,
    heap_in_use: f64,
    heap_free: f64,
    device_used: f64,
    gpubind_in_use: u64,
    iterations: u64,
}

/// The main thread's side of the gates: releases each phase, and reads the figures while
/// the workers stand still after it; last, `VmRSS` after `malloc_trim(0)`.
fn measure(sh: &Shared<'_>) -> Result<([Reading; 3], f64), String> {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(sh.dev).ctx("bind")?;
    let mut readings = Vec::with_capacity(3);
    for (i, name) in ["warm-up", "window 1", "window 2"].iter().enumerate() {
        sh.gate.wait()?;
        let t = Instant::now();
        sh.gate.wait()?;
        let r = read(&gpu, sh)?;
        println!(
            "soak: end of {name} ({:.1} s, {} iterations in all): VmRSS {:.1} MiB; heap in use {:.1} MiB, free in arenas {:.1} MiB; device used {:.1} MiB, gpubind-held {:.1} MiB",
            t.elapsed().as_secs_f64(),
            r.iterations,
            r.rss / MIB,
            r.heap_in_use / MIB,
            r.heap_free / MIB,
            r.device_used / MIB,
            r.gpubind_in_use as f64 / MIB,
        );
        if i > 0 && r.iterations == readings.last().map_or(0, |p: &Reading| p.iterations) {
            return Err(format!("no iteration ran in {name}"));
        }
        readings.push(r);
    }
    // Still quiet: the resident set once glibc has given back what it holds free.
    heap::trim();
    let trimmed = vm_rss()?;
    sh.gate.wait()?; // the workers may tear down now
    Ok(([readings[0], readings[1], readings[2]], trimmed))
}

fn read(gpu: &BoundDevice<'_>, sh: &Shared<'_>) -> Result<Reading, String> {
    let (free, total) = gpu.memory_info().ctx("memory_info")?;
    let rss = vm_rss()?;
    let (heap_in_use, heap_free) = heap::counters();
    Ok(Reading {
        rss,
        heap_in_use,
        heap_free,
        device_used: (total - free) as f64,
        gpubind_in_use: sh.dev.memory_usage().in_use,
        iterations: sh.iterations.load(Ordering::Relaxed),
    })
}

/// `VmRSS` of this process in bytes, from `/proc/self/status`.
fn vm_rss() -> Result<f64, String> {
    let status = std::fs::read_to_string("/proc/self/status").ctx("read /proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("/proc/self/status has no VmRSS line")?;
    let kib: f64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .map_err(|e| format!("{line:?}: {e}"))?;
    Ok(kib * 1024.0)
}

/// glibc's heap counters and trim; elsewhere, zeros and nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod heap {
    /// (bytes in use, bytes free but kept) over all arenas and mmapped chunks.
    pub fn counters() -> (f64, f64) {
        // SAFETY: mallinfo2 only reads the allocator's statistics (glibc 2.33+).
        let m = unsafe { libc::mallinfo2() };
        ((m.uordblks + m.hblkhd) as f64, m.fordblks as f64)
    }
    /// Returns the arenas' free memory to the system.
    pub fn trim() {
        // SAFETY: malloc_trim(0) is always safe to call.
        unsafe { libc::malloc_trim(0) };
    }
    /// Prints glibc's per-arena statistics (on stderr).
    pub fn print_stats() {
        // SAFETY: malloc_stats only prints the allocator's statistics.
        unsafe { libc::malloc_stats() };
    }
    pub const AVAILABLE: bool = true;
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod heap {
    pub fn counters() -> (f64, f64) {
        (0.0, 0.0)
    }
    pub fn trim() {}
    pub fn print_stats() {}
    pub const AVAILABLE: bool = false;
}

/// The verdict on the three readings and the resident set after the final trim (see the
/// module's docs, "What fails").
fn judge(r: &[Reading; 3], trimmed: f64) -> R {
    let [w0, w1, w2] = r;
    let growth = |f: fn(&Reading) -> f64| (f(w1) - f(w0), f(w2) - f(w1));
    let (rss1, rss2) = growth(|x| x.rss);
    let (use1, use2) = growth(|x| x.heap_in_use);
    let (dev1, dev2) = growth(|x| x.device_used);
    let per_iteration = use2 / (w2.iterations - w1.iterations).max(1) as f64;
    println!(
        "soak: growth in window 1 / window 2: VmRSS {:+.1} / {:+.1} MiB; heap in use {:+.1} / {:+.1} MiB ({per_iteration:+.0} bytes per iteration in window 2); device used {:+.1} / {:+.1} MiB (limits, window 2: host {:.0} MiB, device {:.0} MiB)",
        rss1 / MIB,
        rss2 / MIB,
        use1 / MIB,
        use2 / MIB,
        dev1 / MIB,
        dev2 / MIB,
        HOST_LIMIT / MIB,
        DEVICE_LIMIT / MIB,
    );
    println!(
        "soak: VmRSS after malloc_trim(0) at the end: {:.1} MiB ({:+.1} MiB against the end of window 1, {:.1} MiB given back)",
        trimmed / MIB,
        (trimmed - w1.rss) / MIB,
        (w2.rss - trimmed) / MIB
    );
    ensure!(
        r.iter().all(|x| x.gpubind_in_use == w0.gpubind_in_use),
        "gpubind's count of its device allocations changed between checkpoints: {:?} bytes",
        r.map(|x| x.gpubind_in_use)
    );
    ensure!(
        dev2 < DEVICE_LIMIT,
        "device memory in use grew by {:.1} MiB in window 2",
        dev2 / MIB
    );
    ensure!(
        use2 < HOST_LIMIT,
        "the heap in use grew by {:.1} MiB in window 2: memory allocated and not freed",
        use2 / MIB
    );
    if rss2 < HOST_LIMIT {
        println!(
            "soak: VmRSS grew by {:.1} MiB in window 2 (< {:.0} MiB)",
            rss2 / MIB,
            HOST_LIMIT / MIB
        );
        return Ok(());
    }
    heap::print_stats();
    let after_trim = trimmed - w1.rss;
    ensure!(
        heap::AVAILABLE && after_trim < HOST_LIMIT,
        "VmRSS grew by {:.1} MiB in window 2 (limit {:.0} MiB), and after malloc_trim(0) it is still {:.1} MiB above the end of window 1: not only glibc's free memory (heap in use {:+.1} MiB; free in arenas {:.1} -> {:.1} MiB)",
        rss2 / MIB,
        HOST_LIMIT / MIB,
        after_trim / MIB,
        use2 / MIB,
        w1.heap_free / MIB,
        w2.heap_free / MIB
    );
    println!(
        "soak: VmRSS grew by {:.1} MiB in window 2, all of it the allocator's: the heap in use grew by {:+.1} MiB, glibc's free memory in its arenas went {:.1} -> {:.1} MiB, and after malloc_trim(0) VmRSS is {:+.1} MiB against the end of window 1 (< {:.0} MiB; per-arena figures: malloc_stats on stderr)",
        rss2 / MIB,
        use2 / MIB,
        w1.heap_free / MIB,
        w2.heap_free / MIB,
        after_trim / MIB,
        HOST_LIMIT / MIB
    );
    Ok(())
}
