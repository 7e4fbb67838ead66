//! GPU tests of the launch's fast path (`docs/safety.md`, "The fast path"): a launch on
//! the stream that already orders every buffer it passes takes no tracker lock, and the
//! ordering promises still hold — for the host, for other streams, for a buffer handed
//! back, for a module's unload (also of a module published on two streams), and with
//! other threads at work on the same buffer or module.
//! Without a driver: one SKIPPED line.

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{
    BoundDevice, BoundStream, DeviceSlice, Function, LaunchConfig, Module, ThreadContext,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

type R = Result<(), String>;

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
// Adds 1 to every element.
extern "C" __global__ void inc(unsigned* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}
// Spins for `cycles` clock ticks, then adds 1 to every element.
extern "C" __global__ void slow_inc(unsigned* x, unsigned n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}
"#
);

/// About 20 ms at the H200's ~1.8 GHz: far longer than any enqueue.
const SLOW: i64 = 40_000_000;
const N: u32 = 1 << 16;
/// Elements of the buffers the threaded tests share: 16 MiB, so that a host read or a
/// copy takes long enough for a racing kernel to land in the middle of it.
const BIG: u32 = 1 << 22;

fn kernels(gpu: &BoundDevice<'_>) -> Result<Module, String> {
    gpu.compile_and_load(KERNELS, "fast_path.cu").ctx("compile")
}

/// Enqueues `inc(x)` on `s` (`slow`: after ~20 ms of spinning).
fn inc(s: &BoundStream<'_>, f: &Function<'_>, x: &DeviceSlice<u32>, slow: bool) -> R {
    let n = x.len() as u32;
    let mut l = s.launch(f, LaunchConfig::for_num_elems(n));
    l.arg_written(x).arg(&n);
    if slow {
        l.arg(&SLOW);
    }
    // SAFETY: (unsigned*, unsigned[, long long]) matches `inc`/`slow_inc`; the kernel
    // touches the `n` elements of `x`.
    unsafe { l.launch() }.ctx("launch inc")
}

/// Every element of `v` is `want`.
fn all_eq(v: &[u32], want: u32, what: &str) -> R {
    let bad = v.iter().filter(|&&x| x != want).count();
    ensure!(
        bad == 0,
        "{what}: {bad} of {} elements are not {want} (first: {:?})",
        v.len(),
        v.first()
    );
    Ok(())
}

/// Every element of `v` is the same (a whole number of kernels landed), returned.
fn uniform(v: &[u32], what: &str) -> Result<u32, String> {
    let first = v[0];
    all_eq(v, first, what)?;
    Ok(first)
}

/// Three slow increments on one stream (the second and third take the fast path), then
/// a synchronous `dtoh`: the host waits for all three.
fn host_read_waits_for_fast_path_launches() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let f = m.function("slow_inc").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    for _ in 0..3 {
        inc(&s, &f, &x, true)?;
    }
    all_eq(
        &gpu.dtoh(&x).ctx("dtoh")?,
        3,
        "dtoh after fast-path launches",
    )
}

/// Slow increments on stream A (fast path after the first), then a copy on stream B:
/// B waits for every one of them.
fn other_stream_waits_for_fast_path_launches() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let f = m.function("slow_inc").ctx("function")?;
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let mut y = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let a = gpu.on(&sa).ctx("on a")?;
    for _ in 0..3 {
        inc(&a, &f, &x, true)?;
    }
    let b = gpu.on(&sb).ctx("on b")?;
    b.dtod_async(&x, &mut y).ctx("dtod_async on B")?;
    b.synchronize().ctx("sync B")?;
    all_eq(&gpu.dtoh(&y).ctx("dtoh")?, 3, "copy on stream B")
}

/// A buffer used on stream A (its id published), written on stream B behind a slow
/// kernel, then incremented on A again: the last launch may not take the fast path (B
/// took A's id back), so it waits for B's write: 1 + 1 = 2, then + 1.
fn handed_back_buffer_waits_for_the_other_stream() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let (quick, slow) = (
        m.function("inc").ctx("function")?,
        m.function("slow_inc").ctx("function")?,
    );
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on a")?, gpu.on(&sb).ctx("on b")?);
    let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    inc(&a, &quick, &x, false)?; // 1, publishes A
    inc(&a, &quick, &x, false)?; // 2, fast path
    inc(&b, &slow, &x, true)?; // 3 after ~20 ms, on B
    inc(&a, &quick, &x, false)?; // 4 only if it waited for B
    all_eq(
        &gpu.dtoh(&x).ctx("dtoh")?,
        4,
        "A's launch after B's slow write",
    )
}

/// A module whose kernels ran through the fast path is dropped while its last kernel
/// still runs: the unload waits for it (the module's published stream id promises it is
/// recorded), and the kernel's result lands.
fn module_unload_waits_for_fast_path_launch() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let x = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let m = kernels(&gpu)?;
    let (quick, slow) = (
        m.function("inc").ctx("function")?,
        m.function("slow_inc").ctx("function")?,
    );
    inc(&s, &quick, &x, false)?; // records the stream in the module (and publishes it)
    s.synchronize().ctx("sync")?;
    inc(&s, &slow, &x, true)?; // fast path: the module's tracker is not locked
    let t = Instant::now();
    drop((quick, slow));
    drop(m);
    let unload = t.elapsed();
    ensure!(
        unload >= Duration::from_millis(5),
        "the module was unloaded after {unload:?}, while its ~20 ms kernel still ran"
    );
    s.synchronize().ctx("sync after unload")?;
    all_eq(&gpu.dtoh(&x).ctx("dtoh")?, 2, "the kernel's increment")
}

/// One module launched on two streams (its tracker publishes both for reads, so both
/// take the fast path), then dropped while stream B's two slow kernels (~40 ms) still
/// run after stream A's quick one finished: the unload waits for B's, the second
/// published stream, and both results land. (B is recorded whichever path its
/// launches take; this guards the unload's wait, not the choice of path.)
fn module_on_two_streams_unload_waits_for_both() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on a")?, gpu.on(&sb).ctx("on b")?);
    let xa = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let xb = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let m = kernels(&gpu)?;
    let (quick, slow) = (
        m.function("inc").ctx("function")?,
        m.function("slow_inc").ctx("function")?,
    );
    // Record (and publish) both streams in the module, and each buffer on its stream.
    inc(&a, &quick, &xa, false)?;
    inc(&b, &quick, &xb, false)?;
    gpu.synchronize().ctx("sync")?;
    inc(&b, &slow, &xb, true)?; // fast path on B
    inc(&b, &slow, &xb, true)?;
    inc(&a, &quick, &xa, false)?; // fast path on A
    a.synchronize().ctx("sync A")?;
    let t = Instant::now();
    drop((quick, slow));
    drop(m);
    let unload = t.elapsed();
    ensure!(
        unload >= Duration::from_millis(25),
        "the module was unloaded after {unload:?}, while stream B's ~40 ms of kernels ran"
    );
    all_eq(&gpu.dtoh(&xa).ctx("dtoh a")?, 2, "stream A's increments")?;
    all_eq(&gpu.dtoh(&xb).ctx("dtoh b")?, 3, "stream B's increments")
}

/// Two threads launch one module on their own streams and buffers 10 000 times each,
/// both on the fast path (the module publishes both streams for reads) and at once:
/// every increment lands. A smoke test of two gates in use at once on one tracker: the
/// launches share no buffer, so no ordering is at stake; it fails on an error, a hang
/// or a lost launch.
fn one_module_on_two_threads_streams_launches_exactly() -> R {
    const K: u32 = 10_000;
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let xs = [
        gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?,
        gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?,
    ];
    std::thread::scope(|scope| {
        let threads: Vec<_> = xs
            .iter()
            .map(|x| {
                let (dev, m) = (&dev, &m);
                scope.spawn(move || -> R {
                    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                    let gpu = ctx.bind(dev).ctx("bind")?;
                    let f = m.function("inc").ctx("function")?;
                    let stream = gpu.new_stream().ctx("stream")?;
                    let s = gpu.on(&stream).ctx("on")?;
                    (0..K).try_for_each(|_| inc(&s, &f, x, false))
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().unwrap_or_else(|_| Err("launcher panicked".into())))
    })?;
    drop(m);
    for (i, x) in xs.iter().enumerate() {
        all_eq(
            &gpu.dtoh(x).ctx("dtoh")?,
            K,
            &format!("thread {i}'s buffer"),
        )?;
    }
    Ok(())
}

/// A module with a `__device__` variable, for the pruning test.
const FLAG_KERNELS: &str = r#"
__device__ unsigned flag;
extern "C" __global__ void nop() { }
// Spins for `cycles` clock ticks, then sets `flag` to `v`.
extern "C" __global__ void slow_set(unsigned v, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    flag = v;
}
"#;

/// A module read by eight streams that have all finished (stream B, published, among
/// them), then launched on a ninth, whose first launch prunes the idle readers and B
/// with them: B's id must be taken back first, so that B's next launch — a slow kernel
/// setting a `__device__` variable — takes the slow path and is recorded again. The
/// module then gets a view of the variable (its recorded launches become writes) and
/// a host read of it waits for B's kernel: 7, not 0. Were B left published after the
/// prune, its launch would take the fast path unrecorded and the read would not wait.
fn pruned_reader_is_recorded_again_at_its_next_launch() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let streams = (0..9)
        .map(|_| gpu.new_stream())
        .collect::<Result<Vec<_>, _>>()
        .ctx("stream")?;
    let mut m = gpu
        .compile_and_load(FLAG_KERNELS, "flag.cu")
        .ctx("compile")?;
    {
        let (nop, slow_set) = (
            m.function("nop").ctx("function")?,
            m.function("slow_set").ctx("function")?,
        );
        let one = LaunchConfig::for_num_elems(1);
        for (i, stream) in streams.iter().enumerate() {
            if i == 8 {
                // Every reader so far is idle: this launch prunes them all.
                gpu.synchronize().ctx("sync")?;
            }
            let s = gpu.on(stream).ctx("on")?;
            // SAFETY: `nop` takes no parameters.
            unsafe { s.launch(&nop, one).launch() }.ctx("launch nop")?;
        }
        let b = gpu.on(&streams[0]).ctx("on B")?;
        let mut l = b.launch(&slow_set, one);
        l.arg(&7u32).arg(&SLOW);
        // SAFETY: (unsigned, long long) matches `slow_set`.
        unsafe { l.launch() }.ctx("launch slow_set")?;
    }
    let flag = m.global::<u32>("flag").ctx("global")?;
    let v = gpu.dtoh(&flag).ctx("dtoh flag")?;
    ensure!(
        v == [7],
        "read {v:?} while stream B's ~20 ms kernel was setting 7: its launch after the \
         prune was not recorded"
    );
    Ok(())
}

/// One thread increments a 16 MiB buffer on its stream 10 000 times (the fast path),
/// while another reads it with synchronous `dtoh`s: every read sees a whole number of
/// kernels (a host read takes the published id back under the stream's gate before it
/// synchronises, so no launch slips in during its copy), and the end result is exact.
fn host_reads_during_fast_path_launches_see_whole_kernels() -> R {
    const K: u32 = 10_000;
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let x = gpu.alloc_zeros::<u32>(BIG as usize).ctx("alloc")?;
    let done = AtomicBool::new(false);
    let (launched, reads) = std::thread::scope(|scope| {
        let launcher = scope.spawn(|| -> R {
            let mut ctx = ThreadContext::acquire().ctx("acquire")?;
            let gpu = ctx.bind(&dev).ctx("bind")?;
            let f = m.function("inc").ctx("function")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let out = (0..K).try_for_each(|_| inc(&s, &f, &x, false));
            done.store(true, Ordering::SeqCst);
            out
        });
        let mut reads = Vec::new();
        let read = (|| -> R {
            while !done.load(Ordering::SeqCst) {
                let v = gpu.dtoh(&x).ctx("dtoh")?;
                reads.push(uniform(&v, &format!("host read {}", reads.len()))?);
            }
            Ok(())
        })();
        let launched = launcher
            .join()
            .unwrap_or_else(|_| Err("launcher panicked".into()));
        (launched.and(read), reads)
    });
    launched?;
    let mid = reads.iter().filter(|&&v| v > 0 && v < K).count();
    println!("FAST_PATH_HOST_READS {} (mid-run: {mid})", reads.len());
    ensure!(
        reads.windows(2).all(|w| w[0] <= w[1]),
        "reads went backwards: {reads:?}"
    );
    all_eq(&gpu.dtoh(&x).ctx("final dtoh")?, K, "after every launch")
}

/// One thread increments a 16 MiB buffer on stream A 10 000 times (the fast path), while
/// another copies it on stream B: every copy holds a whole number of kernels (the copy
/// takes A's id back under A's gate before it records its event on A).
fn copies_on_another_stream_during_fast_path_launches_see_whole_kernels() -> R {
    const K: u32 = 10_000;
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let x = gpu.alloc_zeros::<u32>(BIG as usize).ctx("alloc")?;
    let mut y = gpu.alloc_zeros::<u32>(BIG as usize).ctx("alloc")?;
    let sb = gpu.new_stream().ctx("stream")?;
    let b = gpu.on(&sb).ctx("on b")?;
    let done = AtomicBool::new(false);
    let (launched, copies) = std::thread::scope(|scope| {
        let launcher = scope.spawn(|| -> R {
            let mut ctx = ThreadContext::acquire().ctx("acquire")?;
            let gpu = ctx.bind(&dev).ctx("bind")?;
            let f = m.function("inc").ctx("function")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let out = (0..K).try_for_each(|_| inc(&s, &f, &x, false));
            done.store(true, Ordering::SeqCst);
            out
        });
        let mut copies = Vec::new();
        let copy = (|| -> R {
            while !done.load(Ordering::SeqCst) {
                b.dtod_async(&x, &mut y).ctx("dtod_async on B")?;
                let v = gpu.dtoh(&y).ctx("dtoh copy")?;
                copies.push(uniform(&v, &format!("copy {}", copies.len()))?);
            }
            Ok(())
        })();
        let launched = launcher
            .join()
            .unwrap_or_else(|_| Err("launcher panicked".into()));
        (launched.and(copy), copies)
    });
    launched?;
    let mid = copies.iter().filter(|&&v| v > 0 && v < K).count();
    println!("FAST_PATH_COPIES {} (mid-run: {mid})", copies.len());
    all_eq(&gpu.dtoh(&x).ctx("final dtoh")?, K, "after every launch")
}

fn main() {
    run_suite(
        "gpu_fast_path",
        &[
            (
                "host_read_waits_for_fast_path_launches",
                host_read_waits_for_fast_path_launches,
            ),
            (
                "other_stream_waits_for_fast_path_launches",
                other_stream_waits_for_fast_path_launches,
            ),
            (
                "handed_back_buffer_waits_for_the_other_stream",
                handed_back_buffer_waits_for_the_other_stream,
            ),
            (
                "module_unload_waits_for_fast_path_launch",
                module_unload_waits_for_fast_path_launch,
            ),
            (
                "module_on_two_streams_unload_waits_for_both",
                module_on_two_streams_unload_waits_for_both,
            ),
            (
                "one_module_on_two_threads_streams_launches_exactly",
                one_module_on_two_threads_streams_launches_exactly,
            ),
            (
                "pruned_reader_is_recorded_again_at_its_next_launch",
                pruned_reader_is_recorded_again_at_its_next_launch,
            ),
            (
                "host_reads_during_fast_path_launches_see_whole_kernels",
                host_reads_during_fast_path_launches_see_whole_kernels,
            ),
            (
                "copies_on_another_stream_during_fast_path_launches_see_whole_kernels",
                copies_on_another_stream_during_fast_path_launches_see_whole_kernels,
            ),
        ],
    )
}
