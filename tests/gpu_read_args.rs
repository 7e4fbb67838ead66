//! GPU tests of read launch arguments: a buffer passed by `&` is claimed as a read, so
//! kernels on two streams that only read it run at once, and a write (passed by `&mut`)
//! on a third stream waits for both; a read after a write on another stream sees the
//! written data. For plain launches, launches with attributes (`cuLaunchKernelEx`) and
//! graph launches.
//! Without a driver: one SKIPPED line.

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{BoundDevice, BoundStream, DeviceSlice, Function, LaunchConfig, Module};
use gpubind::{Stream, ThreadContext};
use std::time::{Duration, Instant};

type R = Result<(), String>;

const KERNELS: &str = r#"
__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// Spins for `ns` nanoseconds of GPU time, then copies x[0] to out[0].
extern "C" __global__ void spin_read(const unsigned* x, unsigned* out, unsigned long long ns) {
    unsigned long long start = now_ns();
    while (now_ns() - start < ns) { }
    out[0] = x[0];
}
// Spins for `ns` nanoseconds, then writes `value` to x[0..n].
extern "C" __global__ void spin_fill(unsigned* x, unsigned n, unsigned value, unsigned long long ns) {
    unsigned long long start = now_ns();
    while (now_ns() - start < ns) { }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
// out[0..n] = x[0..n].
extern "C" __global__ void copy(const unsigned* x, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}
"#;

/// How long each reader spins: two in a row take 200 ms, two at once about 100.
const READ_NS: u64 = 100_000_000;
/// Two readers together must finish within this (well under the 200 ms of two in a
/// row, with room for launch and synchronisation overhead).
const OVERLAP_LIMIT: Duration = Duration::from_millis(170);
const N: u32 = 1 << 16;
const OLD: u32 = 11;
const NEW: u32 = 22;
const NEWER: u32 = 33;

fn kernels(gpu: &BoundDevice<'_>) -> Result<Module, String> {
    gpu.compile_and_load(KERNELS, "read_args.cu").ctx("compile")
}

/// How the two readers are launched.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// `cuLaunchKernel`.
    Plain,
    /// `cuLaunchKernelEx`, with this priority attribute.
    Attributes(i32),
}

/// Enqueues `spin_read(x, out, ns)` on `s`, `x` passed by `&` (a read).
fn spin_read(
    s: &BoundStream<'_>,
    f: &Function<'_>,
    x: &DeviceSlice<u32>,
    out: &mut DeviceSlice<u32>,
    ns: u64,
    via: Via,
) -> R {
    let cfg = LaunchConfig::for_num_elems(1);
    // SAFETY: (const unsigned*, unsigned*, unsigned long long) matches `spin_read`, which
    // reads x[0] and writes out[0] (both hold at least one element) and nothing else.
    unsafe {
        match via {
            Via::Plain => s.launch(f, cfg).arg(x).arg(out).arg(&ns).launch(),
            Via::Attributes(priority) => s
                .launch(f, cfg)
                .priority(priority)
                .arg(x)
                .arg(out)
                .arg(&ns)
                .launch(),
        }
    }
    .ctx("launch spin_read")
}

/// Enqueues `spin_fill(x, value, ns)` on `s`, `x` passed by `&mut` (a write).
fn spin_fill(
    s: &BoundStream<'_>,
    f: &Function<'_>,
    x: &mut DeviceSlice<u32>,
    value: u32,
    ns: u64,
) -> R {
    let n = x.len() as u32;
    // SAFETY: (unsigned*, unsigned, unsigned, unsigned long long) matches `spin_fill`,
    // which writes x[0..n] and nothing else.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(x)
            .arg(&n)
            .arg(&value)
            .arg(&ns)
            .launch()
    }
    .ctx("launch spin_fill")
}

fn three_streams(gpu: &BoundDevice<'_>) -> Result<[Stream; 3], String> {
    Ok([
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    ])
}

/// Checks the readers' outputs, the writer's result, and the readers' overlap.
fn check_readers_then_writer(
    gpu: &BoundDevice<'_>,
    outs: [&DeviceSlice<u32>; 2],
    x: &DeviceSlice<u32>,
    readers: Duration,
    what: &str,
) -> R {
    println!("    {what}: two {READ_NS} ns readers took {readers:?}");
    for (i, out) in outs.into_iter().enumerate() {
        let got = gpu.dtoh(out).ctx("dtoh out")?[0];
        ensure!(
            got == OLD,
            "{what}: reader {i} saw {got}, not {OLD}: the write did not wait for it"
        );
    }
    let after = gpu.dtoh(x).ctx("dtoh x")?;
    ensure!(
        after.iter().all(|&v| v == NEW),
        "{what}: the write did not land ({} elements are not {NEW})",
        after.iter().filter(|&&v| v != NEW).count()
    );
    ensure!(
        readers < OVERLAP_LIMIT,
        "{what}: two readers of one buffer took {readers:?} (limit {OVERLAP_LIMIT:?}): \
         they ran one after the other"
    );
    ensure!(
        readers >= Duration::from_nanos(READ_NS),
        "{what}: the readers took {readers:?}, less than one spin of {READ_NS} ns"
    );
    Ok(())
}

/// Two kernels on two streams that read one buffer run at once (well under twice their
/// duration); a kernel that writes it on a third stream, enqueued right after them,
/// waits for both (each reader copies the buffer after spinning and still sees the old
/// value). The warm-up reads publish both streams for reads, so the timed reads take the
/// fast path: the write's waits must cover launches that took no tracker lock.
fn readers_overlap_and_the_writer_waits(attributes: bool) -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let via = if attributes {
        Via::Attributes(gpu.stream_priority_range().ctx("priorities")?.least)
    } else {
        Via::Plain
    };
    let m = kernels(&gpu)?;
    let (read_f, fill_f) = (
        m.function("spin_read").ctx("function")?,
        m.function("spin_fill").ctx("function")?,
    );
    let [s1, s2, s3] = three_streams(&gpu)?;
    let (a, b, c) = (
        gpu.on(&s1).ctx("on s1")?,
        gpu.on(&s2).ctx("on s2")?,
        gpu.on(&s3).ctx("on s3")?,
    );
    let mut x = gpu.clone_htod(&vec![OLD; N as usize]).ctx("htod")?;
    let mut out1 = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let mut out2 = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    // Warm up (module load, first launch on each stream), then start idle.
    spin_read(&a, &read_f, &x, &mut out1, 0, via)?;
    spin_read(&b, &read_f, &x, &mut out2, 0, via)?;
    gpu.synchronize().ctx("synchronize")?;
    a.synchronize().ctx("sync s1")?;
    b.synchronize().ctx("sync s2")?;

    let start = Instant::now();
    spin_read(&a, &read_f, &x, &mut out1, READ_NS, via)?;
    spin_read(&b, &read_f, &x, &mut out2, READ_NS, via)?;
    spin_fill(&c, &fill_f, &mut x, NEW, 0)?;
    a.synchronize().ctx("sync s1")?;
    b.synchronize().ctx("sync s2")?;
    let readers = start.elapsed();
    c.synchronize().ctx("sync s3")?;
    check_readers_then_writer(&gpu, [&out1, &out2], &x, readers, &format!("{via:?}"))
}

fn plain_readers_overlap_and_the_writer_waits() -> R {
    readers_overlap_and_the_writer_waits(false)
}

fn attribute_readers_overlap_and_the_writer_waits() -> R {
    readers_overlap_and_the_writer_waits(true)
}

/// The same with graphs: two graphs that read one buffer, launched on two streams, run
/// at once; a write on a third stream waits for both.
fn graph_readers_overlap_and_the_writer_waits() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let (read_f, fill_f) = (
        m.function("spin_read").ctx("function")?,
        m.function("spin_fill").ctx("function")?,
    );
    let [s1, s2, s3] = three_streams(&gpu)?;
    let x = gpu.clone_htod(&vec![OLD; N as usize]).ctx("htod")?;
    let out1 = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let out2 = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let reader = |out| {
        gpu.capture(|c| {
            // SAFETY: as in `spin_read`: the kernel reads x[0] and writes out[0].
            unsafe {
                c.launch(&read_f, LaunchConfig::for_num_elems(1))
                    .arg(&x)
                    .arg_written(out)
                    .value(READ_NS)
                    .launch()
            }
        })
        .ctx("capture")?
        .instantiate()
        .ctx("instantiate")
    };
    let (g1, g2) = (reader(&out1)?, reader(&out2)?);
    let (a, b, c) = (
        gpu.on(&s1).ctx("on s1")?,
        gpu.on(&s2).ctx("on s2")?,
        gpu.on(&s3).ctx("on s3")?,
    );
    let start = Instant::now();
    g1.launch(&a).ctx("launch graph 1")?;
    g2.launch(&b).ctx("launch graph 2")?;
    // The graphs borrow `x` shared: the write goes through `arg_written`.
    // SAFETY: as in `spin_fill`: the kernel writes x[0..N] and nothing else.
    unsafe {
        c.launch(&fill_f, LaunchConfig::for_num_elems(N))
            .arg_written(&x)
            .arg(&N)
            .arg(&NEW)
            .arg(&0u64)
            .launch()
    }
    .ctx("launch spin_fill")?;
    a.synchronize().ctx("sync s1")?;
    b.synchronize().ctx("sync s2")?;
    let readers = start.elapsed();
    c.synchronize().ctx("sync s3")?;
    drop((g1, g2));
    check_readers_then_writer(&gpu, [&out1, &out2], &x, readers, "graphs")
}

/// A read on stream B after a write on stream A (slow, so it is still running when the
/// read is enqueued) sees the written data, through a plain launch and through a graph.
fn read_after_write_on_another_stream_sees_the_data() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let (copy_f, fill_f) = (
        m.function("copy").ctx("function")?,
        m.function("spin_fill").ctx("function")?,
    );
    let [s1, s2, _] = three_streams(&gpu)?;
    let (a, b) = (gpu.on(&s1).ctx("on s1")?, gpu.on(&s2).ctx("on s2")?);
    let mut x = gpu.clone_htod(&vec![OLD; N as usize]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let copy = |s: &BoundStream<'_>, x: &DeviceSlice<u32>, out: &mut DeviceSlice<u32>| {
        // SAFETY: (const unsigned*, unsigned*, unsigned) matches `copy`; both hold N.
        unsafe {
            s.launch(&copy_f, LaunchConfig::for_num_elems(N))
                .arg(x)
                .arg(out)
                .arg(&N)
                .launch()
        }
        .ctx("launch copy")
    };
    spin_fill(&a, &fill_f, &mut x, NEW, READ_NS / 2)?;
    copy(&b, &x, &mut out)?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == NEW),
        "a read on another stream did not wait for the write: {} of {N} elements are \
         not {NEW} (first {})",
        got.iter().filter(|&&v| v != NEW).count(),
        got[0]
    );
    // And a graph's read, of a write enqueued after the capture.
    let mut out2 = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    spin_fill(&a, &fill_f, &mut x, NEWER, READ_NS / 2)?;
    let graph = gpu
        .capture(|c| {
            // SAFETY: as in `copy` above.
            unsafe {
                c.launch(&copy_f, LaunchConfig::for_num_elems(N))
                    .arg(&x)
                    .arg(&mut out2)
                    .arg(&N)
                    .launch()
            }
        })
        .ctx("capture")?
        .instantiate()
        .ctx("instantiate")?;
    graph.launch(&b).ctx("graph launch")?;
    drop(graph);
    let got = gpu.dtoh(&out2).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == NEWER),
        "a graph's read on another stream did not wait for the write: {} of {N} \
         elements are not {NEWER}",
        got.iter().filter(|&&v| v != NEWER).count()
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_read_args",
        &[
            (
                "plain_readers_overlap_and_the_writer_waits",
                plain_readers_overlap_and_the_writer_waits,
            ),
            (
                "attribute_readers_overlap_and_the_writer_waits",
                attribute_readers_overlap_and_the_writer_waits,
            ),
            (
                "graph_readers_overlap_and_the_writer_waits",
                graph_readers_overlap_and_the_writer_waits,
            ),
            (
                "read_after_write_on_another_stream_sees_the_data",
                read_after_write_on_another_stream_sees_the_data,
            ),
        ],
    );
}
