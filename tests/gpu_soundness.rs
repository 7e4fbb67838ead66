//! GPU tests of the soundness promises of `docs/safety.md`: safe code cannot race the GPU.
//! Each test makes the race likely (a slow kernel keeps the first stream busy) and checks
//! that the safe API still gives the ordered result. Without a driver: one SKIPPED line.
//!
//! Before stream-ordered access tracking every one of these failed on an H200: the host
//! or the second stream saw the data from before the slow kernel.

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::collective::{CommOptions, Communicator, Op, Transport, nccl_available};
use gpubind::{
    BoundDevice, BoundStream, Function, LaunchConfig, Module, PinnedOptions, ThreadContext,
};
use std::time::Duration;

type R = Result<(), String>;
/// Two reductions' results, per rank.
type Pair = Result<(Vec<i32>, Vec<i32>), String>;

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
// Spins, touching nothing: keeps a stream busy.
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"#
);

/// About 20 ms at the H200's ~1.8 GHz: far longer than any enqueue.
const SLOW: i64 = 40_000_000;
const N: u32 = 1 << 16;
const VALUE: u32 = 0xC0FFEE;

fn kernels(gpu: &BoundDevice<'_>) -> Result<Module, String> {
    gpu.compile_and_load(KERNELS, "soundness.cu").ctx("compile")
}

/// Runs `test` with device 0 bound and [`KERNELS`] loaded.
fn with_kernels(test: fn(&BoundDevice<'_>, &Module) -> R) -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    test(&gpu, &kernels(&gpu)?)
}

/// Enqueues `slow_fill(buf, VALUE)` on `s`.
fn slow_fill(
    s: &BoundStream<'_>,
    f: &Function<'_>,
    buf: &mut impl gpubind::WritableArg,
    n: u32,
) -> R {
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; the kernel writes
    // `n` elements of `buf`, which holds at least `n`.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(buf)
            .arg(&n)
            .arg(&VALUE)
            .arg(&SLOW)
            .launch()
    }
    .ctx("launch slow_fill")
}

/// Enqueues `spin` on `s`: the stream stays busy for ~20 ms.
fn spin(s: &BoundStream<'_>, f: &Function<'_>) -> R {
    // SAFETY: (long long) matches; the kernel touches no memory.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(1))
            .arg(&SLOW)
            .launch()
    }
    .ctx("launch spin")
}

/// The rank threads' results; a thread that panicked is an error.
fn join_ranks<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T, String>>>,
) -> Vec<Result<T, String>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("rank thread panicked".into()))
        })
        .collect()
}

fn all_eq<T: PartialEq + Copy + std::fmt::Debug>(v: &[T], want: T, what: &str) -> R {
    let bad = v.iter().filter(|&&x| x != want).count();
    ensure!(
        bad == 0,
        "{what}: {bad} of {} elements are not {want:?} (first: {:?})",
        v.len(),
        v.first()
    );
    Ok(())
}

/// A kernel on stream A, then a synchronous `dtoh`: the host sees the kernel's data.
fn host_read_waits_for_kernel(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let f = m.function("slow_fill").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let mut buf = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    slow_fill(&gpu.on(&stream).ctx("on")?, &f, &mut buf, N)?;
    all_eq(
        &gpu.dtoh(&buf).ctx("dtoh")?,
        VALUE,
        "dtoh after a kernel on another stream",
    )
}

/// An async memset on a busy stream, then `dtoh`: zeros, not the old values.
fn host_read_waits_for_memset_async(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let spin_f = m.function("spin").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let mut buf = gpu.clone_htod(&vec![7u32; N as usize]).ctx("htod")?;
    spin(&s, &spin_f)?;
    s.memset_zeros_async(&mut buf).ctx("memset_zeros_async")?;
    all_eq(
        &gpu.dtoh(&buf).ctx("dtoh")?,
        0,
        "dtoh after memset_zeros_async",
    )
}

/// A kernel on stream A writes `src`; `dtod_async` on stream B (no event from the user)
/// copies it: B waits for A.
fn other_stream_waits_for_writer(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let f = m.function("slow_fill").ctx("function")?;
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let mut src = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let mut dst = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    slow_fill(&gpu.on(&sa).ctx("on")?, &f, &mut src, N)?;
    let b = gpu.on(&sb).ctx("on")?;
    b.dtod_async(&src, &mut dst).ctx("dtod_async")?;
    b.synchronize().ctx("sync b")?;
    // Read `dst` through stream B's completion only: a host read of `dst` would wait for
    // B anyway, so check the copy itself landed the kernel's values.
    all_eq(&gpu.dtoh(&dst).ctx("dtoh")?, VALUE, "copy on stream B")
}

/// `dtod_async` on a busy stream, then a synchronous overwrite of its source: the copy
/// takes the data as of its enqueue, not the new data.
fn writer_waits_for_pending_reader(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let spin_f = m.function("spin").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let mut src = gpu.clone_htod(&vec![1u32; N as usize]).ctx("htod")?;
    let mut dst = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    spin(&s, &spin_f)?;
    s.dtod_async(&src, &mut dst).ctx("dtod_async")?;
    gpu.htod_copy(&vec![2u32; N as usize], &mut src)
        .ctx("htod_copy")?;
    all_eq(
        &gpu.dtoh(&dst).ctx("dtoh dst")?,
        1,
        "dtod_async source overwritten early",
    )?;
    all_eq(&gpu.dtoh(&src).ctx("dtoh src")?, 2, "the overwrite")
}

/// Two streams read one buffer concurrently; a write on a third waits for both.
fn concurrent_readers_then_writer(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let spin_f = m.function("spin").ctx("function")?;
    let streams: Vec<_> = (0..3)
        .map(|_| gpu.new_stream())
        .collect::<gpubind::Result<_>>()
        .ctx("streams")?;
    let mut src = gpu.clone_htod(&vec![5u32; N as usize]).ctx("htod")?;
    let mut outs = [
        gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?,
        gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?,
    ];
    for (s, out) in streams.iter().zip(outs.iter_mut()) {
        let s = gpu.on(s).ctx("on")?;
        spin(&s, &spin_f)?;
        s.dtod_async(&src, out).ctx("dtod_async")?;
    }
    let w = gpu.on(&streams[2]).ctx("on")?;
    w.memset_zeros_async(&mut src)
        .ctx("memset on a third stream")?;
    for (i, out) in outs.iter().enumerate() {
        all_eq(&gpu.dtoh(out).ctx("dtoh")?, 5, &format!("reader {i}"))?;
    }
    all_eq(
        &gpu.dtoh(&src).ctx("dtoh")?,
        0,
        "the write after the readers",
    )
}

/// `dtoh` inside a `copy_scope`, after the scope's upload: sees the upload.
fn copy_scope_device_side_is_ordered(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let spin_f = m.function("spin").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let pinned = gpu
        .pinned_from_slice(&vec![9u32; N as usize], PinnedOptions::default())
        .ctx("pinned")?;
    let mut d = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let inside = s
        .copy_scope(|scope| {
            spin(scope.stream(), &spin_f).map_err(gpubind::Error::InvalidArgument)?;
            scope.copy_to_device(&pinned, &mut d)?;
            gpu.dtoh(&d)
        })
        .ctx("copy_scope")?;
    all_eq(&inside, 9, "dtoh inside copy_scope")
}

/// A buffer dropped while a kernel still writes it: the free waits, so a new allocation
/// (often at the same address) is not overwritten by the old kernel.
fn drop_waits_for_last_use(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let f = m.function("slow_fill").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let mut old = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    // SAFETY: reading the address only, to compare.
    let old_addr = unsafe { old.raw_ptr() };
    slow_fill(&gpu.on(&stream).ctx("on")?, &f, &mut old, N)?;
    drop(old);
    let fresh = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    // SAFETY: reading the address only, to compare.
    let same = unsafe { fresh.raw_ptr() } == old_addr;
    gpu.on(&stream).ctx("on")?.synchronize().ctx("sync")?;
    println!("    new allocation at the freed address: {same}");
    all_eq(
        &gpu.dtoh(&fresh).ctx("dtoh")?,
        0,
        "allocation after a dropped busy buffer",
    )
}

/// Managed memory written by a kernel, read by the host right away: the reference sees
/// the final values and does not change while held.
fn managed_host_view_waits_for_writes(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let f = m.function("slow_fill").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let mut managed = gpu.alloc_managed::<u32>(N as usize).ctx("alloc_managed")?;
    slow_fill(&gpu.on(&stream).ctx("on")?, &f, &mut managed, N)?;
    let view = managed.as_slice().ctx("as_slice")?;
    let first: Vec<u32> = view.to_vec();
    std::thread::sleep(Duration::from_millis(50));
    ensure!(view == first.as_slice(), "the host view changed while held");
    all_eq(&first, VALUE, "managed view after a kernel")?;
    // And a host write after a device read on another stream waits for the read.
    let spin_f = m.function("spin").ctx("function")?;
    let mut copy = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let s = gpu.on(&stream).ctx("on")?;
    spin(&s, &spin_f)?;
    s.dtod_async(&managed, &mut copy).ctx("dtod_async")?;
    managed.as_mut_slice().ctx("as_mut_slice")?.fill(3);
    all_eq(
        &gpu.dtoh(&copy).ctx("dtoh")?,
        VALUE,
        "device read before a host write",
    )
}

/// After `ctx.group` returns, rewriting a rank's input does not change the reduction.
fn group_inputs_rewritten_after_return() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = Communicator::new(
        &mut ctx,
        &[dev.clone(), dev.clone()],
        CommOptions::kernels(),
    )
    .ctx("communicator")?;
    let (module, mut ins, mut outs) = {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let ins = [
            gpu.clone_htod(&vec![1i32; N as usize]).ctx("htod")?,
            gpu.clone_htod(&vec![2i32; N as usize]).ctx("htod")?,
        ];
        let outs = [
            gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?,
            gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?,
        ];
        (kernels(&gpu)?, ins, outs)
    };
    {
        // Keep the communicator's stream busy so the reduction runs late.
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let lane = comm.stream(0).ok_or("no stream for rank 0")?;
        spin(
            &gpu.on(lane).ctx("on")?,
            &module.function("spin").ctx("function")?,
        )?;
    }
    {
        let [i0, i1] = &ins;
        let [o0, o1] = &mut outs;
        ctx.group(&comm, |g| {
            g.all_reduce(0, i0, o0, Op::Sum)?;
            g.all_reduce(1, i1, o1, Op::Sum)
        })
        .ctx("group")?;
    }
    let gpu = ctx.bind(&dev).ctx("bind")?;
    for input in ins.iter_mut() {
        gpu.htod_copy(&vec![100i32; N as usize], input)
            .ctx("rewrite input")?;
    }
    for (r, out) in outs.iter().enumerate() {
        all_eq(&gpu.dtoh(out).ctx("dtoh")?, 3, &format!("rank {r}'s sum"))?;
    }
    Ok(())
}

/// 1:1 host-staged all-reduce where each rank switches streams between calls: exact sums.
fn rank_comm_stream_switch_host_staged() -> R {
    let dev = dev0()?;
    for round in 0..3 {
        let opts = CommOptions::kernels().with_transport(Transport::HostStaged);
        let comms = Communicator::init_all(&[dev.clone(), dev.clone()], opts).ctx("init_all")?;
        let results: Vec<Pair> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    let dev = dev.clone();
                    s.spawn(move || -> Pair {
                        let rank = comm.rank() as i32;
                        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                        let gpu = ctx.bind(&dev).ctx("bind")?;
                        let m = kernels(&gpu)?;
                        let spin_f = m.function("spin").ctx("function")?;
                        let (sa, sb) = (
                            gpu.new_stream().ctx("stream")?,
                            gpu.new_stream().ctx("stream")?,
                        );
                        let a_in = gpu.clone_htod(&vec![rank + 1; N as usize]).ctx("htod")?;
                        let b_in = gpu
                            .clone_htod(&vec![10 * (rank + 1); N as usize])
                            .ctx("htod")?;
                        let mut a_out = gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?;
                        let mut b_out = gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?;
                        let a = gpu.on(&sa).ctx("on")?;
                        // Stream A runs late: the first reduction reads staging late.
                        spin(&a, &spin_f)?;
                        comm.all_reduce(&a, &a_in, &mut a_out, Op::Sum)
                            .ctx("all_reduce on A")?;
                        let b = gpu.on(&sb).ctx("on")?;
                        comm.all_reduce(&b, &b_in, &mut b_out, Op::Sum)
                            .ctx("all_reduce on B")?;
                        Ok((gpu.dtoh(&a_out).ctx("dtoh")?, gpu.dtoh(&b_out).ctx("dtoh")?))
                    })
                })
                .collect();
            join_ranks(handles)
        });
        for (r, res) in results.into_iter().enumerate() {
            let (a, b) = res?;
            all_eq(&a, 3, &format!("round {round}, rank {r}, first call"))?;
            all_eq(&b, 30, &format!("round {round}, rank {r}, second call"))?;
        }
    }
    Ok(())
}

/// The same as `group_inputs_rewritten_after_return`, on NCCL (one rank).
fn nccl_group_inputs_rewritten_after_return() -> R {
    if !nccl_available() {
        return Err(common::skip("NCCL is not installed"));
    }
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = Communicator::new(&mut ctx, std::slice::from_ref(&dev), CommOptions::nccl())
        .ctx("communicator")?;
    let (module, mut input, mut out) = {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        (
            kernels(&gpu)?,
            gpu.clone_htod(&vec![4i32; N as usize]).ctx("htod")?,
            gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?,
        )
    };
    {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let lane = comm.stream(0).ok_or("no stream for rank 0")?;
        spin(
            &gpu.on(lane).ctx("on")?,
            &module.function("spin").ctx("function")?,
        )?;
    }
    ctx.group(&comm, |g| g.all_reduce(0, &input, &mut out, Op::Sum))
        .ctx("group")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    gpu.htod_copy(&vec![100i32; N as usize], &mut input)
        .ctx("rewrite input")?;
    all_eq(&gpu.dtoh(&out).ctx("dtoh")?, 4, "NCCL sum")
}

/// A launch built on stream A but enqueued only after a read of the same buffer on
/// stream B: the kernel is ordered after the read (claims are taken at `launch()`, not at
/// `arg()`), so the read sees the data from before the kernel.
fn launch_is_ordered_when_enqueued_not_when_built(gpu: &BoundDevice<'_>, m: &Module) -> R {
    let (fill, spin_f) = (
        m.function("slow_fill").ctx("function")?,
        m.function("spin").ctx("function")?,
    );
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on")?, gpu.on(&sb).ctx("on")?);
    let buf = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    let mut out = gpu.clone_htod(&vec![7u32; N as usize]).ctx("htod")?;
    let fast = 0i64;
    let mut pending = a.launch(&fill, LaunchConfig::for_num_elems(N));
    pending.arg_written(&buf).arg(&N).arg(&VALUE);
    spin(&b, &spin_f)?; // B's read runs late
    b.dtod_async(&buf, &mut out).ctx("dtod_async on B")?;
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; in bounds.
    unsafe { pending.arg(&fast).launch() }.ctx("launch")?;
    all_eq(
        &gpu.dtoh(&out).ctx("dtoh out")?,
        0,
        "read enqueued before the launch",
    )?;
    all_eq(
        &gpu.dtoh(&buf).ctx("dtoh buf")?,
        VALUE,
        "the kernel's write",
    )
}

/// 1:1 ranks drop their `RankComm` right after enqueueing a collective behind a busy
/// stream: the kernels' module is unloaded only after they ran, so the sums are exact.
fn rank_comm_dropped_while_collective_queued() -> R {
    let dev = dev0()?;
    for round in 0..3 {
        let comms = Communicator::init_all(&[dev.clone(), dev.clone()], CommOptions::kernels())
            .ctx("init_all")?;
        let results: Vec<Result<Vec<i32>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    let dev = dev.clone();
                    s.spawn(move || -> Result<Vec<i32>, String> {
                        let rank = comm.rank() as i32;
                        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                        let gpu = ctx.bind(&dev).ctx("bind")?;
                        let m = kernels(&gpu)?;
                        let spin_f = m.function("spin").ctx("function")?;
                        let stream = gpu.new_stream().ctx("stream")?;
                        let input = gpu.clone_htod(&vec![rank + 1; N as usize]).ctx("htod")?;
                        let mut out = gpu.alloc_zeros::<i32>(N as usize).ctx("alloc")?;
                        let s = gpu.on(&stream).ctx("on")?;
                        spin(&s, &spin_f)?;
                        comm.all_reduce(&s, &input, &mut out, Op::Sum)
                            .ctx("all_reduce")?;
                        drop(comm);
                        gpu.dtoh(&out).ctx("dtoh")
                    })
                })
                .collect();
            join_ranks(handles)
        });
        for (r, res) in results.into_iter().enumerate() {
            all_eq(&res?, 3, &format!("round {round}, rank {r}"))?;
        }
    }
    Ok(())
}

fn main() {
    run_suite(
        "gpu_soundness",
        &[
            ("host_read_waits_for_kernel", || {
                with_kernels(host_read_waits_for_kernel)
            }),
            ("host_read_waits_for_memset_async", || {
                with_kernels(host_read_waits_for_memset_async)
            }),
            ("other_stream_waits_for_writer", || {
                with_kernels(other_stream_waits_for_writer)
            }),
            ("writer_waits_for_pending_reader", || {
                with_kernels(writer_waits_for_pending_reader)
            }),
            ("concurrent_readers_then_writer", || {
                with_kernels(concurrent_readers_then_writer)
            }),
            ("copy_scope_device_side_is_ordered", || {
                with_kernels(copy_scope_device_side_is_ordered)
            }),
            ("drop_waits_for_last_use", || {
                with_kernels(drop_waits_for_last_use)
            }),
            ("managed_host_view_waits_for_writes", || {
                with_kernels(managed_host_view_waits_for_writes)
            }),
            (
                "group_inputs_rewritten_after_return",
                group_inputs_rewritten_after_return,
            ),
            (
                "rank_comm_stream_switch_host_staged",
                rank_comm_stream_switch_host_staged,
            ),
            (
                "nccl_group_inputs_rewritten_after_return",
                nccl_group_inputs_rewritten_after_return,
            ),
            ("launch_is_ordered_when_enqueued_not_when_built", || {
                with_kernels(launch_is_ordered_when_enqueued_not_when_built)
            }),
            (
                "rank_comm_dropped_while_collective_queued",
                rank_comm_dropped_while_collective_queued,
            ),
        ],
    )
}
