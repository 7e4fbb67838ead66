//! GPU tests of CUDA graphs (issue 14 item 1): capture through the typestate handle,
//! instantiate, launch, update; the ordering of graph launches with the buffers' other
//! uses; forks; failing and panicking captures. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_graphs` (on a GPU machine, or the built binary).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, dev0, on_device0, run_suite, skip};
use gpubind::{
    BoundDevice, BoundStream, Device, DeviceMemory, DeviceSlice, DriverErrorCode, Error, Function,
    InstantiateFlags, Issue, KernelLaunch, LaunchConfig, Module, ThreadContext,
};

type R = Result<(), String>;

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
extern "C" __global__ void add(unsigned* x, unsigned n, unsigned v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void addf(float* x, unsigned n, float v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void addi(int* x, unsigned n, int v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void sum(const unsigned* a, const unsigned* b, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"#
);

/// About 50 ms of spinning on an H200 (1.98 GHz).
const SLOW: i64 = 100_000_000;

/// Captures `slow_fill(x, n, value, cycles)` into `c`: `x` claimed as written.
fn capture_slow_fill<'buf>(
    c: &mut gpubind::Capture<'_, 'buf>,
    slow_fill: &'buf gpubind::Function<'buf>,
    x: &'buf gpubind::DeviceSlice<u32>,
    n: u32,
    (value, cycles): (u32, i64),
) -> gpubind::Result<()> {
    assert!(
        x.len() >= n as usize,
        "slow_fill of {n} elements into {}",
        x.len()
    );
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; the kernel writes the
    // elements of `x` below `n`, which `x` holds (asserted above).
    unsafe {
        c.launch(slow_fill, LaunchConfig::for_num_elems(n))
            .arg_written(x)
            .value(n)
            .value(value)
            .value(cycles)
            .launch()
    }
}

/// Enqueues `slow_fill(x, n, value, cycles)` on `s`: returns at once, and the write lands
/// after the kernel's spin.
fn launch_slow_fill(
    s: &BoundStream<'_>,
    slow_fill: &gpubind::Function<'_>,
    x: &mut gpubind::DeviceSlice<u32>,
    n: u32,
    (value, cycles): (u32, i64),
) -> R {
    assert!(
        x.len() >= n as usize,
        "slow_fill of {n} elements into {}",
        x.len()
    );
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; the kernel writes the
    // elements of `x` below `n`, which `x` holds (asserted above).
    unsafe {
        s.launch(slow_fill, LaunchConfig::for_num_elems(n))
            .arg(x)
            .arg(&n)
            .arg(&value)
            .arg(&cycles)
            .launch()
    }
    .ctx("slow fill")
}

/// A memset, K kernels (scalar arguments by reference and by value) and a copy: nothing
/// runs at capture time; every launch (on a gpubind stream and on the legacy default
/// stream) replays all of it exactly; the node count is what was captured.
fn capture_replays_kernels_memsets_and_copies(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let add = module.function("add").ctx("function")?;
    let n = 10_000u32;
    let x = gpu.clone_htod(&vec![5u32; n as usize]).ctx("htod x")?;
    let y = gpu.clone_htod(&vec![99u32; n as usize]).ctx("htod y")?;
    const K: u32 = 6;
    let increments: Vec<u32> = (1..=K).collect(); // arguments live as long as the graph
    let graph = gpu
        .capture(|c| {
            c.memset_zeros(&x)?;
            for v in &increments {
                let mut l = c.launch(&add, LaunchConfig::for_num_elems(n));
                l.arg_written(&x).arg(&n);
                // Half by reference, half by value (copied at capture).
                if v % 2 == 0 {
                    l.arg(v);
                } else {
                    l.value(*v);
                }
                // SAFETY: (unsigned*, unsigned, unsigned) matches; bounds checked.
                unsafe { l.launch()? };
            }
            c.dtod(&x, &y)
        })
        .ctx("capture")?;
    ensure!(
        gpu.dtoh(&x).ctx("dtoh x")?.iter().all(|&v| v == 5)
            && gpu.dtoh(&y).ctx("dtoh y")?.iter().all(|&v| v == 99),
        "the capture ran work instead of recording it"
    );
    let nodes = graph.node_count().ctx("node_count")?;
    ensure!(nodes == K as usize + 2, "{nodes} nodes, want {}", K + 2);
    let exec = graph.instantiate().ctx("instantiate")?;
    let want = K * (K + 1) / 2;
    let stream = gpu.new_stream().ctx("stream")?;
    for round in 0..3 {
        exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
        let got = gpu.dtoh(&y).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&v| v == want),
            "round {round}: y[0] = {}, want {want} everywhere",
            got[0]
        );
    }
    // The legacy default stream.
    exec.launch(&gpu.default_stream()).ctx("launch on legacy")?;
    ensure!(
        gpu.dtoh(&y).ctx("dtoh")?.iter().all(|&v| v == want),
        "legacy-stream launch"
    );
    Ok(())
}

/// The step of [`one_step_runs_eagerly_and_captured_alike`], written once over
/// [`Issue`]: `x = v` (after a ~50 ms spin), `y = 0`, `y = 3`, `y += k`, `out = x + y`,
/// `copy = out`. Every buffer is borrowed shared; the written ones are claimed as such.
fn generic_step<'buf>(
    e: &mut impl Issue<'buf>,
    (slow_fill, add, sum): (
        &'buf Function<'buf>,
        &'buf Function<'buf>,
        &'buf Function<'buf>,
    ),
    (x, y, out, copy): (
        &'buf DeviceSlice<u32>,
        &'buf DeviceSlice<u32>,
        &'buf DeviceSlice<u32>,
        &'buf DeviceSlice<u32>,
    ),
    n: &'buf u32,
    (v, k): (u32, u32),
) -> gpubind::Result<()> {
    assert!(
        [x, y, out, copy].iter().all(|b| b.len() == *n as usize),
        "buffers of {n} elements"
    );
    let cfg = LaunchConfig::for_num_elems(*n);
    // SAFETY (the launches): the argument types match `slow_fill`, `add` and `sum`
    // (KERNELS), which stay below `n`, the length of every buffer (asserted above), and
    // write only the buffers passed to `arg_written`.
    unsafe {
        e.launch(slow_fill, cfg)
            .arg_written(x)
            .arg(n)
            .value(v)
            .value(SLOW)
            .launch()?
    };
    e.memset_zeros(y)?;
    e.memset(y, 3u32)?;
    // SAFETY: as above.
    unsafe { e.launch(add, cfg).arg_written(y).arg(n).value(k).launch()? };
    // SAFETY: as above.
    unsafe {
        e.launch(sum, cfg)
            .arg(x)
            .arg(y)
            .arg_written(out)
            .arg(n)
            .launch()?
    };
    e.dtod(out, copy)
}

/// One step written over [`Issue`] runs on a stream and, captured, at each launch of
/// its graph, with the same results: the writes through shared borrows are claimed on
/// the stream (the host reads wait for the slow kernel), nothing runs at capture time,
/// and both issuers refuse a copy between overlapping views alike.
fn one_step_runs_eagerly_and_captured_alike(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let f = (
        module.function("slow_fill").ctx("slow_fill")?,
        module.function("add").ctx("add")?,
        module.function("sum").ctx("sum")?,
    );
    let kernels = (&f.0, &f.1, &f.2);
    let n = 4096u32;
    let garbage = vec![77u32; n as usize];
    let fresh = || -> Result<Vec<DeviceSlice<u32>>, String> {
        (0..4)
            .map(|_| gpu.clone_htod(&garbage).ctx("htod"))
            .collect()
    };
    // Each host read waits for the claimed writes of the buffer it reads.
    let read = |bufs: &[DeviceSlice<u32>], what: &str| -> Result<Vec<Vec<u32>>, String> {
        bufs.iter().map(|b| gpu.dtoh(b).ctx(what)).collect()
    };
    let s = gpu.new_stream().ctx("stream")?;
    let eager = {
        let bufs = fresh()?;
        let (x, y, out, copy) = (&bufs[0], &bufs[1], &bufs[2], &bufs[3]);
        let mut on = gpu.on(&s).ctx("on")?;
        generic_step(&mut on, kernels, (x, y, out, copy), &n, (10, 5)).ctx("eager step")?;
        read(&bufs, "dtoh after the eager step")?
    };
    let want = [10u32, 8, 18, 18];
    for (i, (got, want)) in eager.iter().zip(want).enumerate() {
        ensure!(
            got.iter().all(|&v| v == want),
            "eager step: buffer {i}[0] = {}, want {want} everywhere",
            got[0]
        );
    }
    let bufs = fresh()?;
    let (x, y, out, copy) = (&bufs[0], &bufs[1], &bufs[2], &bufs[3]);
    let graph = gpu
        .capture(|c| generic_step(c, kernels, (x, y, out, copy), &n, (10, 5)))
        .ctx("capture")?;
    ensure!(
        read(&bufs, "dtoh after the capture")?
            .iter()
            .all(|b| *b == garbage),
        "the capture ran work instead of recording it"
    );
    let nodes = graph.node_count().ctx("node_count")?;
    ensure!(nodes == 6, "{nodes} nodes, want 6");
    let exec = graph.instantiate().ctx("instantiate")?;
    let s2 = gpu.new_stream().ctx("stream")?;
    for round in 0..2 {
        exec.launch(&gpu.on(&s2).ctx("on")?).ctx("graph launch")?;
        ensure!(
            read(&bufs, "dtoh after a launch")? == eager,
            "launch {round}: the graph's results differ from the eager step's"
        );
    }
    // Overlapping views of one allocation: refused by both, before anything is issued.
    let (a, b) = (
        x.slice(0..100).ctx("slice")?,
        x.slice(50..150).ctx("slice")?,
    );
    let eager_overlap = Issue::dtod(&mut gpu.on(&s).ctx("on")?, &a, &b);
    ensure!(
        matches!(eager_overlap, Err(Error::InvalidArgument(_))),
        "eager dtod between overlapping views: {eager_overlap:?}"
    );
    let captured_overlap = gpu.capture(|c| Issue::dtod(c, &a, &b));
    ensure!(
        matches!(captured_overlap, Err(Error::InvalidArgument(_))),
        "captured dtod between overlapping views: {:?}",
        captured_overlap.map(|_| ())
    );
    Ok(())
}

/// A graph launch is a pending write of its buffers: a host read right after it, and a
/// copy from them on another stream, wait for it (the graph was still running when both were
/// issued).
fn graph_launch_is_ordered_before_host_reads_and_other_streams(
    gpu: &BoundDevice<'_>,
    module: &Module,
) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let (value, cycles) = (7u32, SLOW);
    let graph = gpu
        .capture(|c| capture_slow_fill(c, &slow_fill, &x, n, (value, cycles)))
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let a = gpu.on(&s1).ctx("on s1")?;
    let done = gpu.new_event(false).ctx("event")?;

    // A host read.
    exec.launch(&a).ctx("launch")?;
    a.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the graph finished before the host read was issued: nothing to order"
    );
    let got = gpu.dtoh(&x).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "host read did not wait for the graph: x[0] = {}",
        got[0]
    );

    // Another stream: a copy of x there must read the graph's fill.
    exec.launch(&a).ctx("launch 2")?;
    a.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the graph finished before the copy was enqueued: nothing to order"
    );
    let b = gpu.on(&s2).ctx("on s2")?;
    // A read of x on s2 (x is borrowed shared by the graph): a copy into y.
    let mut y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    b.dtod_async(&x, &mut y).ctx("dtod on s2")?;
    b.synchronize().ctx("sync s2")?;
    let got = gpu.dtoh(&y).ctx("dtoh y")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "s2's copy did not wait for the graph on s1: y[0] = {}",
        got[0]
    );
    Ok(())
}

/// A graph launch waits for a write of its buffer on another stream outside the graph
/// (the capture itself cannot: it ran before that write was enqueued).
fn graph_launch_waits_for_writes_on_other_streams(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let add = module.function("add").ctx("function")?;
    let n = 1u32 << 16;
    let mut x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    // The slow write on s1 first (x is not yet borrowed by a graph).
    let a = gpu.on(&s1).ctx("on s1")?;
    let (value, cycles) = (40u32, SLOW);
    launch_slow_fill(&a, &slow_fill, &mut x, n, (value, cycles))?;
    let done = gpu.new_event(false).ctx("event")?;
    a.record(&done).ctx("record")?;
    let two = 2u32;
    let graph = gpu
        .capture(|c| {
            // SAFETY: (unsigned*, unsigned, unsigned) matches; bounds checked.
            unsafe {
                c.launch(&add, LaunchConfig::for_num_elems(n))
                    .arg_written(&x)
                    .arg(&n)
                    .arg(&two)
                    .launch()
            }
        })
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the slow fill finished before the graph launch: nothing to order"
    );
    exec.launch(&gpu.on(&s2).ctx("on s2")?).ctx("launch")?;
    let got = gpu.dtoh(&x).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == value + 2),
        "the graph did not wait for s1's fill: x[0] = {}, want {}",
        got[0],
        value + 2
    );
    Ok(())
}

/// A graph reads its inputs when it runs, not when it was captured: between launches
/// the input is rewritten by a slow kernel on another stream (a kernel may take a buffer
/// the graph borrows, by `&`), and each launch sees the new contents.
fn graph_reads_inputs_at_each_launch(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc x")?;
    let y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    let graph = gpu.capture(|c| c.dtod(&x, &y)).ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let cycles = SLOW;
    for value in [11u32, 12, 13] {
        let w = gpu.on(&s2).ctx("on s2")?;
        // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; bounds checked.
        unsafe {
            w.launch(&slow_fill, LaunchConfig::for_num_elems(n))
                .arg_written(&x)
                .arg(&n)
                .arg(&value)
                .arg(&cycles)
                .launch()
        }
        .ctx("slow fill")?;
        exec.launch(&gpu.on(&s1).ctx("on s1")?).ctx("launch")?;
        let got = gpu.dtoh(&y).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&v| v == value),
            "launch after fill {value}: y[0] = {} (the graph did not wait for the write, or read a stale input)",
            got[0]
        );
    }
    Ok(())
}

/// Fork/join: both branches run, the work after the fork sees both, forks nest; the
/// graph has the nodes captured on every branch.
fn fork_join_runs_branches_and_joins(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let sum = module.function("sum").ctx("function")?;
    let n = 4096u32;
    let a = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let b = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let c3 = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let out = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let graph = gpu
        .capture(|c| {
            c.fork(|main, branch| {
                main.memset(&a, 1u32)?;
                branch.fork(|b1, b2| {
                    b1.memset(&b, 20u32)?;
                    b2.memset(&c3, 300u32)
                })?;
                // After the nested join: b and c3 are written.
                branch.dtod(&c3, &out)
            })?;
            // After the outer join: a, b, out (= c3) are written.
            // SAFETY: (const unsigned*, const unsigned*, unsigned*, unsigned) matches.
            unsafe {
                c.launch(&sum, LaunchConfig::for_num_elems(n))
                    .arg(&a)
                    .arg(&b)
                    .arg_written(&out)
                    .arg(&n)
                    .launch()?
            };
            Ok(())
        })
        .ctx("capture")?;
    let nodes = graph.node_count().ctx("node_count")?;
    ensure!(
        nodes >= 5,
        "{nodes} nodes: fewer than the 5 captured operations"
    );
    let exec = graph.instantiate().ctx("instantiate")?;
    let s = gpu.new_stream().ctx("stream")?;
    exec.launch(&gpu.on(&s).ctx("on")?).ctx("launch")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got.iter().all(|&v| v == 21),
        "out[0] = {}, want 1 + 20 = 21 (branches not joined before the sum?)",
        got[0]
    );
    ensure!(
        gpu.dtoh(&c3).ctx("dtoh c3")?.iter().all(|&v| v == 300),
        "nested branch did not run"
    );
    Ok(())
}

/// `update` with changed kernel parameters (value and buffer) takes effect at the next
/// launch, and the launches then claim the new buffer; a graph of another shape is
/// `Error::GraphUpdate` and leaves the executable graph as it was.
fn update_changes_kernel_parameters(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc x")?;
    let y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    let (five, nine, quick, slow) = (5u32, 9u32, 0i64, SLOW);
    let fill = |buf, value, cycles| {
        gpu.capture(|c| {
            // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; bounds checked.
            unsafe {
                c.launch(&slow_fill, LaunchConfig::for_num_elems(n))
                    .arg_written(buf)
                    .arg(&n)
                    .arg(value)
                    .arg(cycles)
                    .launch()
            }
        })
    };
    let g1 = fill(&x, &five, &quick).ctx("capture 1")?;
    let mut exec = g1.instantiate().ctx("instantiate")?;
    let s = gpu.new_stream().ctx("stream")?;
    exec.launch(&gpu.on(&s).ctx("on")?).ctx("launch 1")?;
    ensure!(
        gpu.dtoh(&x).ctx("dtoh")?.iter().all(|&v| v == 5),
        "first graph"
    );

    // Same shape, other buffer, other value, slow: y's host read must wait for it.
    let g2 = fill(&y, &nine, &slow).ctx("capture 2")?;
    exec.update(&g2).ctx("update")?;
    let st = gpu.on(&s).ctx("on")?;
    exec.launch(&st).ctx("launch 2")?;
    let done = gpu.new_event(false).ctx("event")?;
    st.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the updated graph finished before the host read: nothing to order"
    );
    ensure!(
        gpu.dtoh(&y).ctx("dtoh y")?.iter().all(|&v| v == 9),
        "the update's buffer and value were not used, or y's read did not wait"
    );
    ensure!(
        gpu.dtoh(&x).ctx("dtoh x")?.iter().all(|&v| v == 5),
        "the updated graph still wrote x"
    );

    // Another topology: two kernels.
    let g3 = gpu
        .capture(|c| {
            for _ in 0..2 {
                // SAFETY: as above.
                unsafe {
                    c.launch(&slow_fill, LaunchConfig::for_num_elems(n))
                        .arg_written(&x)
                        .arg(&n)
                        .arg(&five)
                        .arg(&quick)
                        .launch()?
                };
            }
            Ok(())
        })
        .ctx("capture 3")?;
    match exec.update(&g3) {
        Err(Error::GraphUpdate { reason }) => ensure!(!reason.is_empty(), "empty reason"),
        other => return Err(format!("update to another topology: {other:?}")),
    }
    exec.launch(&gpu.on(&s).ctx("on")?).ctx("launch 3")?;
    ensure!(
        gpu.dtoh(&y).ctx("dtoh y")?.iter().all(|&v| v == 9),
        "a refused update changed the executable graph"
    );
    Ok(())
}

/// A closure that swaps a nested fork's branch handle with the enclosing fork's branch
/// (`std::mem::swap`) and keeps using it leaves work on a branch already joined: the
/// capture either ends in the driver's typed error (no graph, nothing ran) or gives a
/// graph whose launch does what was captured. Never a crash or a graph that does less.
fn swapped_fork_handles_are_typed_or_complete(gpu: &BoundDevice<'_>) -> R {
    let a = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let r = gpu.capture(|c| {
        c.fork(|main, branch| {
            main.fork(|_inner_main, inner_branch| {
                std::mem::swap(&mut *branch, &mut *inner_branch);
                Ok(())
            })?;
            branch.memset(&a, 5u32) // on the inner branch, joined before this
        })
    });
    match r {
        Err(Error::Driver { code, call, .. })
            if code == DriverErrorCode::STREAM_CAPTURE_UNJOINED
                || code == DriverErrorCode::STREAM_CAPTURE_INVALIDATED =>
        {
            println!("swapped fork handles: {call} refused the capture ({code:?})");
            ensure!(
                gpu.dtoh(&a).ctx("dtoh")?.iter().all(|&v| v == 0),
                "the refused capture's memset ran"
            );
        }
        Ok(graph) => {
            graph
                .instantiate()
                .ctx("instantiate")?
                .launch(&gpu.default_stream())
                .ctx("launch")?;
            ensure!(
                gpu.dtoh(&a).ctx("dtoh")?.iter().all(|&v| v == 5),
                "the graph of a capture with swapped fork handles lost its memset"
            );
            println!(
                "swapped fork handles: the driver accepted the capture; its launch is complete"
            );
        }
        Err(other) => return Err(format!("swapped fork handles: unexpected {other:?}")),
    }
    let g = gpu.capture(|c| c.memset(&a, 6u32)).ctx("capture again")?;
    g.instantiate()
        .ctx("instantiate again")?
        .launch(&gpu.default_stream())
        .ctx("launch again")?;
    ensure!(
        gpu.dtoh(&a).ctx("dtoh again")?.iter().all(|&v| v == 6),
        "a capture after the swapped one"
    );
    Ok(())
}

/// An illegal call through the raw escape (synchronising the capturing stream) fails and
/// invalidates the capture: `capture` returns the driver's typed error, no graph, and the
/// thread is out of capture mode afterwards (a new capture and a synchronous copy work,
/// and the first capture's memset never ran).
fn invalidated_capture_is_a_typed_error(gpu: &BoundDevice<'_>) -> R {
    use gpubind::cudarc::driver::sys;
    let x = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let mut sync_result = sys::CUresult::CUDA_SUCCESS;
    let r = gpu.capture(|c| {
        c.memset(&x, 3u32)?;
        // SAFETY: a live stream; the call is illegal during capture on purpose.
        sync_result = unsafe { sys::cuStreamSynchronize(c.raw_stream()) };
        Ok(())
    });
    ensure!(
        sync_result != sys::CUresult::CUDA_SUCCESS,
        "synchronising a capturing stream succeeded"
    );
    match r {
        Err(Error::Driver { code, call, .. })
            if code == DriverErrorCode::STREAM_CAPTURE_INVALIDATED
                || code == DriverErrorCode::STREAM_CAPTURE_UNSUPPORTED =>
        {
            ensure!(call == "cuStreamEndCapture", "failed in {call}");
        }
        other => {
            return Err(format!(
                "want a capture error from cuStreamEndCapture, got {other:?} (sync gave {sync_result:?})"
            ));
        }
    }
    ensure!(
        gpu.dtoh(&x)
            .ctx("dtoh after failed capture")?
            .iter()
            .all(|&v| v == 0),
        "the failed capture's memset ran"
    );
    let g = gpu.capture(|c| c.memset(&x, 4u32)).ctx("capture again")?;
    g.instantiate()
        .ctx("instantiate")?
        .launch(&gpu.default_stream())
        .ctx("launch")?;
    ensure!(
        gpu.dtoh(&x).ctx("dtoh")?.iter().all(|&v| v == 4),
        "second capture"
    );
    Ok(())
}

/// The closure's error is returned as is; a panic (inside a fork) ends the capture and
/// joins the fork: afterwards the thread captures and copies normally, and nothing of the
/// abandoned captures ran. A copy onto an overlapping range is refused.
fn closure_errors_and_panics_end_the_capture(gpu: &BoundDevice<'_>) -> R {
    let x = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let y = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
    let r = gpu.capture(|c| {
        c.memset(&x, 1u32)?;
        Err(Error::InvalidArgument("mine".into()))
    });
    ensure!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m == "mine"),
        "closure error not returned as is: {r:?}"
    );
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = gpu.capture(|c| {
            c.fork(|main, branch| {
                main.memset(&x, 2u32)?;
                branch.memset(&y, 2u32)?;
                panic!("inside a fork");
            })
        });
    }));
    ensure!(panicked.is_err(), "the panic did not propagate");
    ensure!(
        gpu.dtoh(&x).ctx("dtoh x")?.iter().all(|&v| v == 0)
            && gpu.dtoh(&y).ctx("dtoh y")?.iter().all(|&v| v == 0),
        "an abandoned capture ran"
    );
    let mut overlap = None;
    let g = gpu
        .capture(|c| {
            overlap = Some(c.dtod(&x, &x));
            c.memset(&y, 5u32)
        })
        .ctx("capture after panic")?;
    ensure!(
        matches!(overlap, Some(Err(Error::InvalidArgument(_)))),
        "overlapping dtod: {overlap:?}"
    );
    g.instantiate()
        .ctx("instantiate")?
        .launch(&gpu.default_stream())
        .ctx("launch")?;
    ensure!(
        gpu.dtoh(&y).ctx("dtoh")?.iter().all(|&v| v == 5),
        "capture after a panic"
    );
    Ok(())
}

/// Dropping an executable graph waits for its pending launch (the slow kernel is
/// running when the drop starts, finished when it returns); the buffer is then free to
/// drop.
fn dropping_an_exec_waits_for_its_launches(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let (value, cycles) = (3u32, SLOW);
    let s = gpu.new_stream().ctx("stream")?;
    let done = gpu.new_event(false).ctx("event")?;
    {
        let graph = gpu
            .capture(|c| capture_slow_fill(c, &slow_fill, &x, n, (value, cycles)))
            .ctx("capture")?;
        let exec = graph.instantiate().ctx("instantiate")?;
        drop(graph); // the executable graph does not need it
        let st = gpu.on(&s).ctx("on")?;
        exec.launch(&st).ctx("launch")?;
        st.record(&done).ctx("record")?;
        ensure!(
            !done.is_complete().ctx("query")?,
            "the graph finished before the drop: nothing to wait for"
        );
        drop(exec);
        ensure!(
            done.is_complete().ctx("query")?,
            "GraphExec's drop returned before its launch finished"
        );
    }
    drop(x);
    Ok(())
}

/// An empty capture is a graph of no nodes that instantiates and launches.
fn empty_capture_instantiates_and_launches(gpu: &BoundDevice<'_>) -> R {
    let g = gpu.capture(|_| Ok(())).ctx("capture")?;
    ensure!(g.node_count().ctx("nodes")? == 0, "nodes in an empty graph");
    let exec = g.instantiate().ctx("instantiate")?;
    let s = gpu.new_stream().ctx("stream")?;
    let st = gpu.on(&s).ctx("on")?;
    exec.launch(&st).ctx("launch")?;
    st.synchronize().ctx("sync")?;
    Ok(())
}

/// A graph of device 0 launched on a stream of device 1 is `Error::WrongDevice`.
fn launch_on_another_device_is_refused() -> R {
    if Device::count().ctx("count")? < 2 {
        return Err(skip("needs 2 GPUs"));
    }
    let (d0, d1) = (dev0()?, Device::get(1).ctx("get 1")?);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let x;
    let exec = {
        let gpu = ctx.bind(&d0).ctx("bind 0")?;
        x = gpu.alloc_zeros::<u32>(16).ctx("alloc")?;
        let g = gpu.capture(|c| c.memset(&x, 1u32)).ctx("capture")?;
        g.instantiate().ctx("instantiate")?
    };
    let gpu1 = ctx.bind(&d1).ctx("bind 1")?;
    match exec.launch(&gpu1.default_stream()) {
        Err(Error::WrongDevice { .. }) => Ok(()),
        other => Err(format!("launch on device 1: {other:?}")),
    }
}

/// Kernels of the event and flag tests: the slow writer, and a copy that reads its source
/// through a raw address, which no claim covers: only an event orders it.
const EVENT_KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
extern "C" __global__ void copy_from_addr(unsigned long long src, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ((const unsigned*)src)[i];
}
extern "C" __global__ void bump(unsigned* x, unsigned n, unsigned v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
"#
);

/// Captures `copy_from_addr(src, out, n)` into `c`: `out` claimed as written, `src` read
/// through its raw address (not claimed).
fn capture_raw_copy<'buf>(
    c: &mut gpubind::Capture<'_, 'buf>,
    copy: &'buf gpubind::Function<'buf>,
    src: u64,
    out: &'buf gpubind::DeviceSlice<u32>,
    n: u32,
) -> gpubind::Result<()> {
    // SAFETY: (unsigned long long, unsigned*, unsigned) matches; `src` points at `n`
    // u32s that outlive every launch (the callers keep the source alive), and the
    // callers order the raw read with an event.
    unsafe {
        c.launch(copy, LaunchConfig::for_num_elems(n))
            .value(src)
            .arg_written(out)
            .value(n)
            .launch()
    }
}

/// Graph A (slow fill of `x`, then a record of `done`) on one stream, graph B (a wait on
/// `done`, then a copy that reads `x` through its raw address, unclaimed) on another:
/// B sees A's writes. Without the wait B would copy the zeros A has not yet overwritten.
fn graph_event_orders_another_graph(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let copy = module.function("copy_from_addr").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc x")?;
    let y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    let done = gpu.new_event(false).ctx("event")?;
    let (value, cycles) = (7u32, SLOW);
    let a = gpu
        .capture(|c| {
            capture_slow_fill(c, &slow_fill, &x, n, (value, cycles))?;
            c.record_event(&done)
        })
        .ctx("capture A")?;
    let b = gpu
        .capture(|c| {
            c.wait_event(&done)?;
            capture_raw_copy(c, &copy, x.device_ptr(), &y, n)
        })
        .ctx("capture B")?;
    ensure!(
        a.node_count().ctx("nodes A")? == 2 && b.node_count().ctx("nodes B")? == 2,
        "want a record node and a wait node besides the kernels"
    );
    let (ea, eb) = (
        a.instantiate().ctx("instantiate A")?,
        b.instantiate().ctx("instantiate B")?,
    );
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    ea.launch(&gpu.on(&s1).ctx("on s1")?).ctx("launch A")?;
    eb.launch(&gpu.on(&s2).ctx("on s2")?).ctx("launch B")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "graph A finished before B was launched: nothing to order"
    );
    let got = gpu.dtoh(&y).ctx("dtoh y")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "graph B did not wait for A's event: y[0] = {}, want {value}",
        got[0]
    );
    Ok(())
}

/// Eager work records an event after a slow write of `x`; a graph launched on another
/// stream waits on it and then reads `x` through its raw address (unclaimed): it sees
/// the eager write. A graph waiting on an event never recorded runs at once.
fn graph_waits_on_an_eager_event(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let copy = module.function("copy_from_addr").ctx("function")?;
    let n = 1u32 << 16;
    let mut x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc x")?;
    let y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    let (ready, never) = (
        gpu.new_event(false).ctx("event")?,
        gpu.new_event(false).ctx("event")?,
    );
    let x_addr = x.device_ptr();
    let graph = gpu
        .capture(|c| {
            c.wait_event(&never)?;
            c.wait_event(&ready)?;
            capture_raw_copy(c, &copy, x_addr, &y, n)
        })
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let a = gpu.on(&s1).ctx("on s1")?;
    let (value, cycles) = (9u32, SLOW);
    launch_slow_fill(&a, &slow_fill, &mut x, n, (value, cycles))?;
    a.record(&ready).ctx("record")?;
    exec.launch(&gpu.on(&s2).ctx("on s2")?).ctx("launch")?;
    ensure!(
        !ready.is_complete().ctx("query")?,
        "the eager fill finished before the graph was launched: nothing to order"
    );
    let got = gpu.dtoh(&y).ctx("dtoh y")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "the graph did not wait for the eager event: y[0] = {}, want {value}",
        got[0]
    );
    drop(exec);
    drop(x); // after the graph: its launches read x through the raw address
    Ok(())
}

/// An event recorded by a graph orders eager work on another stream that waits on it:
/// the eager copy, reading `x` through its raw address, sees the graph's slow write.
fn eager_work_waits_on_a_graph_event(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let copy = module.function("copy_from_addr").ctx("function")?;
    let n = 1u32 << 16;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc x")?;
    let mut y = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc y")?;
    let done = gpu.new_event(false).ctx("event")?;
    let (value, cycles) = (5u32, SLOW);
    let exec = gpu
        .capture(|c| {
            capture_slow_fill(c, &slow_fill, &x, n, (value, cycles))?;
            c.record_event(&done)
        })
        .ctx("capture")?
        .instantiate()
        .ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    exec.launch(&gpu.on(&s1).ctx("on s1")?).ctx("launch")?;
    let b = gpu.on(&s2).ctx("on s2")?;
    b.wait(&done).ctx("wait")?;
    let x_addr = x.device_ptr();
    // SAFETY: (unsigned long long, unsigned*, unsigned) matches; `x_addr` points at `n`
    // u32s alive until the end of the test; the read is ordered by the event.
    unsafe {
        b.launch(&copy, LaunchConfig::for_num_elems(n))
            .arg(&x_addr)
            .arg(&mut y)
            .arg(&n)
            .launch()
    }
    .ctx("copy")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the graph finished before the eager copy was issued: nothing to order"
    );
    let got = gpu.dtoh(&y).ctx("dtoh y")?;
    ensure!(
        got.iter().all(|&v| v == value),
        "the eager copy did not wait for the graph's event: y[0] = {}, want {value}",
        got[0]
    );
    Ok(())
}

/// An event of device 1 is `Error::WrongDevice` for a capture on device 0, recorded or
/// waited on.
fn capture_event_of_another_device_is_refused() -> R {
    if Device::count().ctx("count")? < 2 {
        return Err(skip("needs 2 GPUs"));
    }
    let (d0, d1) = (dev0()?, Device::get(1).ctx("get 1")?);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let other = ctx
        .bind(&d1)
        .ctx("bind 1")?
        .new_event(false)
        .ctx("event on 1")?;
    let gpu = ctx.bind(&d0).ctx("bind 0")?;
    for record in [true, false] {
        let got = gpu.capture(|c| {
            if record {
                c.record_event(&other)
            } else {
                c.wait_event(&other)
            }
        });
        match got {
            Err(Error::WrongDevice { what, .. }) => {
                ensure!(what.contains("event"), "names {what:?}, not the event")
            }
            other => return Err(format!("record {record}: {other:?}")),
        }
    }
    Ok(())
}

/// Captures `bump(x, n, v)` (x += v) into `c`.
fn capture_bump<'buf>(
    c: &mut gpubind::Capture<'_, 'buf>,
    bump: &'buf gpubind::Function<'buf>,
    x: &'buf gpubind::DeviceSlice<u32>,
    n: u32,
    v: u32,
) -> gpubind::Result<()> {
    // SAFETY: (unsigned*, unsigned, unsigned) matches; bounds checked.
    unsafe {
        c.launch(bump, LaunchConfig::for_num_elems(n))
            .arg_written(x)
            .value(n)
            .value(v)
            .launch()
    }
}

/// `instantiate_with` round-trips the flags gpubind accepts (read back with
/// `GraphExec::flags`) and the graph runs once per launch under each; device launch is
/// `Error::GraphInstantiate` naming the flag, before the driver sees it.
fn instantiate_flags_round_trip_and_device_launch_is_refused(
    gpu: &BoundDevice<'_>,
    module: &Module,
) -> R {
    let bump = module.function("bump").ctx("function")?;
    let n = 4096u32;
    let x = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let graph = gpu
        .capture(|c| capture_bump(c, &bump, &x, n, 1))
        .ctx("capture")?;
    let mut launches = 0u32;
    for i in 0..4u32 {
        let flags = InstantiateFlags::new()
            .auto_free_on_launch(i & 1 != 0)
            .use_node_priority(i & 2 != 0);
        let exec = graph.instantiate_with(flags).ctx("instantiate_with")?;
        let back = exec.flags().ctx("flags")?;
        // The driver reports auto-free and device launch; node priority is applied but
        // not reported back by cuGraphExecGetFlags (driver 580), so it is printed.
        ensure!(
            back.has_auto_free_on_launch() == flags.has_auto_free_on_launch()
                && !back.has_device_launch(),
            "instantiated with {flags:?}, read back {back:?}"
        );
        println!("    instantiated with {flags:?}, the driver reports {back:?}");
        exec.launch(&gpu.default_stream()).ctx("launch")?;
        launches += 1;
        let got = gpu.dtoh(&x).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&v| v == launches),
            "under {flags:?}: x[0] = {}, want {launches}",
            got[0]
        );
    }
    let plain = graph.instantiate().ctx("instantiate")?;
    ensure!(
        plain.flags().ctx("flags")? == InstantiateFlags::new(),
        "plain instantiate has flags"
    );
    match graph.instantiate_with(InstantiateFlags::new().device_launch(true)) {
        Err(Error::GraphInstantiate { flags, reason }) => {
            ensure!(
                flags == "CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH",
                "names {flags:?}"
            );
            ensure!(reason.contains("cannot order"), "reason: {reason}");
            Ok(())
        }
        other => Err(format!("device launch: {other:?}")),
    }
}

/// An executable graph uploaded on one stream and launched on another computes what
/// the same capture launched without an upload computes (each writes its own output);
/// uploads repeat, also after a launch.
fn upload_then_launch_equals_launch(gpu: &BoundDevice<'_>, module: &Module) -> R {
    let bump = module.function("bump").ctx("function")?;
    let n = 10_000u32;
    let bufs = (0..4)
        .map(|_| gpu.alloc_zeros::<u32>(n as usize))
        .collect::<gpubind::Result<Vec<_>>>()
        .ctx("alloc")?;
    let capture = |x, y| {
        gpu.capture(|c| {
            c.memset(x, 1u32)?;
            for v in 1..=3 {
                capture_bump(c, &bump, x, n, v)?;
            }
            c.dtod(x, y)
        })
    };
    let uploaded = capture(&bufs[0], &bufs[1])
        .ctx("capture")?
        .instantiate()
        .ctx("instantiate")?;
    let plain = capture(&bufs[2], &bufs[3])
        .ctx("capture")?
        .instantiate()
        .ctx("instantiate")?;
    let want = 1 + 1 + 2 + 3;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    uploaded.upload(&gpu.on(&s1).ctx("on s1")?).ctx("upload")?;
    uploaded
        .upload(&gpu.on(&s1).ctx("on s1")?)
        .ctx("upload again")?;
    uploaded
        .launch(&gpu.on(&s2).ctx("on s2")?)
        .ctx("launch uploaded")?;
    plain
        .launch(&gpu.on(&s2).ctx("on s2")?)
        .ctx("launch plain")?;
    let (u, p) = (
        gpu.dtoh(&bufs[1]).ctx("dtoh")?,
        gpu.dtoh(&bufs[3]).ctx("dtoh")?,
    );
    ensure!(
        u == p && p.iter().all(|&v| v == want),
        "uploaded: y[0] = {}, plain: y[0] = {}, want {want}",
        u[0],
        p[0]
    );
    // An upload after a launch, then a launch on the upload's stream.
    uploaded
        .upload(&gpu.on(&s2).ctx("on s2")?)
        .ctx("upload after launch")?;
    uploaded.launch(&gpu.on(&s2).ctx("on s2")?).ctx("launch")?;
    ensure!(
        gpu.dtoh(&bufs[1]).ctx("dtoh")?.iter().all(|&v| v == want),
        "launch after a second upload"
    );
    Ok(())
}

/// Row-major `A[m×k] · B[k×n]` on the host, in f64 (exact for the small integers used).
#[cfg(feature = "cublas")]
fn host_matmul(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
            c[i * n + j] = s as f32;
        }
    }
    c
}

/// Row-major transpose of a `rows×cols` matrix.
#[cfg(feature = "cublas")]
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// Captured cuBLAS products (issue 14 item 3): `C = A·B` and `D = 2·(Aᵀ)ᵀ·(Bᵀ)ᵀ` on
/// integer-valued f32 matrices are bit-exact against the host at every launch, with `A`
/// changed between launches by a kernel on another stream (the graph holds the buffers
/// shared and reads them at each launch); the Blas is dropped before the first launch
/// (the graph keeps its workspace); eager products of the same handle on two streams
/// before and after stay exact; a C that overlaps A is refused.
#[cfg(feature = "cublas")]
fn captured_matmul_is_exact_at_every_launch(gpu: &BoundDevice<'_>) -> R {
    use gpubind::blas::{Enqueue, Matmul};
    let module = gpu.compile_and_load(KERNELS, "graphs.cu").ctx("compile")?;
    let addf = module.function("addf").ctx("function addf")?;
    let (m, n, k) = (37usize, 19usize, 23usize);
    let a_host: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let b_host: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
    let a = gpu.clone_htod(&a_host).ctx("htod a")?;
    let at = gpu.clone_htod(&transpose(&a_host, m, k)).ctx("htod at")?;
    let b = gpu.clone_htod(&b_host).ctx("htod b")?;
    let bt = gpu.clone_htod(&transpose(&b_host, k, n)).ctx("htod bt")?;
    let c = gpu.alloc_zeros::<f32>(m * n).ctx("alloc c")?;
    let d = gpu.alloc_zeros::<f32>(m * n).ctx("alloc d")?;
    let mut blas = gpu.new_blas().ctx("new_blas")?;
    let plain = Matmul::new(m, n, k);
    let transposed = Matmul::new(m, n, k)
        .transpose_a()
        .transpose_b()
        .scaled(2.0, 0.0);
    // Eager first (the handle's workspace is then in use on the default stream).
    let mut e = gpu.alloc_zeros::<f32>(m * n).ctx("alloc e")?;
    gpu.default_stream()
        .matmul(&blas, &plain, &a, &b, &mut e)
        .ctx("eager matmul")?;
    let graph = gpu
        .capture(|cap| {
            cap.matmul(&blas, &plain, &a, &b, &c)?;
            cap.matmul(&blas, &transposed, &at, &bt, &d)
        })
        .ctx("capture")?;
    ensure!(
        gpu.dtoh(&c).ctx("dtoh c")?.iter().all(|&v| v == 0.0),
        "the capture ran the product instead of recording it"
    );
    ensure!(
        graph.node_count().ctx("node_count")? >= 2,
        "the graph has {} nodes, expected at least one per product",
        graph.node_count().ctx("node_count")?
    );
    // An overlapping C is refused before cuBLAS is called.
    let tiny = gpu.alloc_zeros::<f32>(1).ctx("alloc tiny")?;
    let tiny_view = tiny.slice(..).ctx("view")?;
    let one = Matmul::new(1, 1, 1);
    let refused = gpu.capture(|cap| cap.matmul(&blas, &one, &tiny_view, &tiny_view, &tiny));
    ensure!(
        matches!(
            refused,
            Err(Error::Matmul(gpubind::blas::MatmulError::Aliasing { .. }))
        ),
        "C overlapping A: {refused:?}"
    );
    // Eager products of the handle on another stream, concurrently with the graph.
    let other = gpu.new_stream().ctx("stream")?;
    let mut f = gpu.alloc_zeros::<f32>(m * n).ctx("alloc f")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let mut a_now = a_host.clone();
    for step in 0..4u32 {
        if step == 2 {
            drop(blas);
            blas = gpu.new_blas().ctx("new_blas again")?;
        }
        let delta = step as f32 + 1.0;
        let count = (m * k) as u32;
        let w = gpu.on(&s2).ctx("on s2")?;
        for x in [&a, &at] {
            // SAFETY: (float*, unsigned, float) matches `addf`, which stays in bounds.
            unsafe {
                w.launch(&addf, LaunchConfig::for_num_elems(count))
                    .arg_written(x)
                    .arg(&count)
                    .arg(&delta)
                    .launch()
            }
            .ctx("addf")?;
        }
        a_now.iter_mut().for_each(|v| *v += delta);
        exec.launch(&gpu.on(&s1).ctx("on s1")?).ctx("launch")?;
        gpu.on(&other)
            .ctx("on other")?
            .matmul(&blas, &plain, &a, &b, &mut f)
            .ctx("eager matmul on another stream")?;
        let want = host_matmul(&a_now, &b_host, m, n, k);
        let want2: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
        let (got_c, got_d, got_f) = (
            gpu.dtoh(&c).ctx("dtoh c")?,
            gpu.dtoh(&d).ctx("dtoh d")?,
            gpu.dtoh(&f).ctx("dtoh f")?,
        );
        ensure!(
            got_c == want,
            "launch {step}: C differs from the host product"
        );
        ensure!(
            got_d == want2,
            "launch {step}: D (transposed, alpha 2) differs"
        );
        ensure!(
            got_f == want,
            "launch {step}: the eager product on another stream differs"
        );
    }
    ensure!(
        gpu.dtoh(&e).ctx("dtoh e")? == host_matmul(&a_host, &b_host, m, n, k),
        "the first eager product differs"
    );
    Ok(())
}

/// Two products of one Blas captured on the two branches of a fork (which run
/// concurrently in the graph) are ordered one after the other, since they share the
/// handle's workspace: with a long shared dimension (cuBLAS may split it and use the
/// workspace for partial sums), both results are exact at every launch; a third product
/// after the join sees both.
#[cfg(feature = "cublas")]
fn captured_matmuls_on_forked_branches_take_turns_with_the_workspace(gpu: &BoundDevice<'_>) -> R {
    use gpubind::blas::{Enqueue, Matmul};
    let (m, n, k) = (16usize, 16usize, 1usize << 16);
    // 0/1 entries: every partial and full sum is an exact small integer in f32.
    let a1_host: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 + i / 5) % 3 == 0) as u32 as f32)
        .collect();
    let a2_host: Vec<f32> = (0..m * k)
        .map(|i| ((i * 5 + i / 3) % 4 == 0) as u32 as f32)
        .collect();
    let b_host: Vec<f32> = (0..k * n)
        .map(|i| ((i * 3 + i / 7) % 2 == 0) as u32 as f32)
        .collect();
    let a1 = gpu.clone_htod(&a1_host).ctx("htod a1")?;
    let a2 = gpu.clone_htod(&a2_host).ctx("htod a2")?;
    let b = gpu.clone_htod(&b_host).ctx("htod b")?;
    let c1 = gpu.alloc_zeros::<f32>(m * n).ctx("alloc c1")?;
    let c2 = gpu.alloc_zeros::<f32>(m * n).ctx("alloc c2")?;
    let ident: Vec<f32> = (0..n * n)
        .map(|i| (i % (n + 1) == 0) as u32 as f32)
        .collect();
    let eye = gpu.clone_htod(&ident).ctx("htod eye")?;
    let c3 = gpu.alloc_zeros::<f32>(m * n).ctx("alloc c3")?;
    let blas = gpu.new_blas().ctx("new_blas")?;
    let shape = Matmul::new(m, n, k);
    let graph = gpu
        .capture(|c| {
            c.fork(|main, branch| {
                main.matmul(&blas, &shape, &a1, &b, &c1)?;
                branch.matmul(&blas, &shape, &a2, &b, &c2)
            })?;
            // After the join: c3 = c1 · I.
            c.matmul(&blas, &Matmul::new(m, n, n), &c1, &eye, &c3)
        })
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let want1 = host_matmul(&a1_host, &b_host, m, n, k);
    let want2 = host_matmul(&a2_host, &b_host, m, n, k);
    let stream = gpu.new_stream().ctx("stream")?;
    for launch in 0..5 {
        exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
        ensure!(
            gpu.dtoh(&c1).ctx("dtoh c1")? == want1,
            "launch {launch}: C1 differs"
        );
        ensure!(
            gpu.dtoh(&c2).ctx("dtoh c2")? == want2,
            "launch {launch}: C2 differs"
        );
        ensure!(
            gpu.dtoh(&c3).ctx("dtoh c3")? == want1,
            "launch {launch}: C3 = C1·I differs"
        );
    }
    Ok(())
}

/// The host's all-reduce of one element, as the collective kernels compute it: a left
/// fold over the ranks in order (integers wrap), then the division for `Avg`.
#[cfg(feature = "collective")]
trait HostReduce: gpubind::collective::CollectiveType + Copy + std::fmt::Debug {
    fn combine(op: gpubind::collective::Op, a: Self, b: Self) -> Self;
    fn div(a: Self, n: usize) -> Self;
    /// A small value (exact in every op for a few ranks), varying with rank and index.
    fn input(rank: usize, i: usize) -> Self;
    /// The bits, for a bit-exact comparison.
    fn bits(self) -> u64;
    /// The kernel that adds a constant, and the constant.
    const ADD: (&'static str, Self);
}

#[cfg(feature = "collective")]
impl HostReduce for f32 {
    fn combine(op: gpubind::collective::Op, a: f32, b: f32) -> f32 {
        use gpubind::collective::Op;
        match op {
            Op::Sum | Op::Avg => a + b,
            Op::Prod => a * b,
            Op::Min => {
                if b < a {
                    b
                } else {
                    a
                }
            }
            _ => {
                if a < b {
                    b
                } else {
                    a
                }
            }
        }
    }
    fn div(a: f32, n: usize) -> f32 {
        a / n as f32
    }
    fn input(rank: usize, i: usize) -> f32 {
        ((i * 7 + rank * 5) % 9) as f32 - 4.0
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    const ADD: (&'static str, f32) = ("addf", 1.0);
}

#[cfg(feature = "collective")]
impl HostReduce for i32 {
    fn combine(op: gpubind::collective::Op, a: i32, b: i32) -> i32 {
        use gpubind::collective::Op;
        match op {
            Op::Sum | Op::Avg => a.wrapping_add(b),
            Op::Prod => a.wrapping_mul(b),
            Op::Min => a.min(b),
            _ => a.max(b),
        }
    }
    fn div(a: i32, n: usize) -> i32 {
        a / n as i32
    }
    fn input(rank: usize, i: usize) -> i32 {
        // Large magnitudes too, so Sum and Prod wrap.
        if i.is_multiple_of(97) {
            i32::MAX - rank as i32 * 3
        } else {
            ((i * 11 + rank * 3) % 13) as i32 - 6
        }
    }
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
    const ADD: (&'static str, i32) = ("addi", 1);
}

/// Captures every op's all-reduce over `ranks` ranks on device 0 into one graph and
/// checks each output bit-exactly against the host, at two launches with the inputs
/// changed in between (by a kernel on another stream).
#[cfg(feature = "collective")]
fn check_captured_all_reduce<T: HostReduce>(ranks: usize) -> R {
    use gpubind::collective::{CommOptions, Communicator, Op};
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = Communicator::new(&mut ctx, &vec![dev.clone(); ranks], CommOptions::kernels())
        .ctx("communicator")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "graphs.cu").ctx("compile")?;
    let add = module.function(T::ADD.0).ctx("function")?;
    let count = 4099usize; // the vector body and the scalar tail
    let mut host: Vec<Vec<T>> = (0..ranks)
        .map(|r| (0..count).map(|i| T::input(r, i)).collect())
        .collect();
    let sends = host
        .iter()
        .map(|h| gpu.clone_htod(h))
        .collect::<Result<Vec<_>, _>>()
        .ctx("htod sends")?;
    const OPS: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];
    let outs = OPS
        .iter()
        .map(|_| (0..ranks).map(|_| gpu.alloc_zeros::<T>(count)).collect())
        .collect::<Result<Vec<Vec<_>>, _>>()
        .ctx("alloc outs")?;
    let send_refs: Vec<_> = sends.iter().collect();
    let graph = gpu
        .capture(|c| {
            for (op, out) in OPS.iter().zip(&outs) {
                let out_refs: Vec<_> = out.iter().collect();
                c.all_reduce(&comm, &send_refs, &out_refs, *op)?;
            }
            Ok(())
        })
        .ctx("capture")?;
    ensure!(
        gpu.dtoh(&outs[0][0])
            .ctx("dtoh")?
            .iter()
            .all(|v| v.bits() == 0),
        "the capture ran the all-reduce instead of recording it"
    );
    let exec = graph.instantiate().ctx("instantiate")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    for launch in 0..2 {
        if launch == 1 {
            let n = count as u32;
            let w = gpu.on(&s2).ctx("on s2")?;
            for (s, h) in sends.iter().zip(&mut host) {
                // SAFETY: (T*, unsigned, T) matches the kernel, which stays in bounds.
                unsafe {
                    w.launch(&add, LaunchConfig::for_num_elems(n))
                        .arg_written(s)
                        .arg(&n)
                        .arg(&T::ADD.1)
                        .launch()
                }
                .ctx("add")?;
                h.iter_mut()
                    .for_each(|v| *v = T::combine(Op::Sum, *v, T::ADD.1));
            }
        }
        exec.launch(&gpu.on(&s1).ctx("on s1")?).ctx("launch")?;
        for (op, out) in OPS.iter().zip(&outs) {
            let want: Vec<T> = (0..count)
                .map(|i| {
                    let acc = (1..ranks).fold(host[0][i], |a, r| T::combine(*op, a, host[r][i]));
                    if *op == Op::Avg {
                        T::div(acc, ranks)
                    } else {
                        acc
                    }
                })
                .collect();
            for (r, o) in out.iter().enumerate() {
                let got = gpu.dtoh(o).ctx("dtoh")?;
                if let Some(i) = (0..count).find(|&i| got[i].bits() != want[i].bits()) {
                    return Err(format!(
                        "{ranks} ranks, {}, {op:?}, launch {launch}, rank {r}: element {i} is \
                         {:?}, the host says {:?}",
                        T::NAME,
                        got[i],
                        want[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A captured all-reduce of 2 and 3 ranks on GPU 0 (one kernel on one stream), every op,
/// f32 and i32: bit-exact against the host at every launch.
#[cfg(feature = "collective")]
fn captured_all_reduce_is_bit_exact() -> R {
    for ranks in [2, 3] {
        check_captured_all_reduce::<f32>(ranks)?;
        check_captured_all_reduce::<i32>(ranks)?;
    }
    Ok(())
}

/// What a captured all-reduce refuses, before anything is captured: a host-staged
/// communicator and an NCCL one (`Error::NotCapturable`, if NCCL loads), the wrong
/// number of buffers and overlapping outputs (`Error::InvalidArgument`); the capture is
/// still usable after a refusal (the closure carries on, and the graph's one all-reduce,
/// over two overlapping views of one buffer, gives the right result).
#[cfg(feature = "collective")]
fn captured_all_reduce_refusals() -> R {
    use gpubind::collective::{CommOptions, Communicator, Op, Transport};
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let two = vec![dev.clone(), dev.clone()];
    let comm = Communicator::new(&mut ctx, &two, CommOptions::kernels()).ctx("communicator")?;
    let staged = Communicator::new(
        &mut ctx,
        &two,
        CommOptions::kernels().with_transport(Transport::HostStaged),
    )
    .ctx("staged communicator")?;
    let nccl = match Communicator::new(&mut ctx, std::slice::from_ref(&dev), CommOptions::nccl()) {
        Ok(c) => Some(c),
        Err(Error::NoNccl) | Err(Error::FeatureDisabled { .. }) => None,
        Err(e) => {
            // Not what this test is about: the NCCL case is then not exercised.
            eprintln!(
                "captured_all_reduce_refusals: no NCCL communicator ({e}); NCCL case not run"
            );
            None
        }
    };
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let a = gpu.clone_htod(&[1.0f32; 64]).ctx("htod")?;
    let b = gpu.clone_htod(&[2.0f32; 64]).ctx("htod")?;
    let ramp: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let big = gpu.clone_htod(&ramp).ctx("htod")?;
    let (lo, hi) = (
        big.slice(0..64).ctx("view")?,
        big.slice(32..96).ctx("view")?,
    );
    let out = [
        gpu.alloc_zeros::<f32>(64).ctx("alloc")?,
        gpu.alloc_zeros::<f32>(64).ctx("alloc")?,
    ];
    let mut seen = Vec::new();
    let graph = gpu
        .capture(|c| {
            let r = c.all_reduce(&staged, &[&a, &b], &[&out[0], &out[1]], Op::Sum);
            seen.push((
                "host-staged",
                matches!(r, Err(Error::NotCapturable { .. })),
                format!("{r:?}"),
            ));
            if let Some(nccl) = &nccl {
                let r = c.all_reduce(nccl, &[&a], &[&out[0]], Op::Sum);
                seen.push((
                    "NCCL",
                    matches!(r, Err(Error::NotCapturable { .. })),
                    format!("{r:?}"),
                ));
            }
            let r = c.all_reduce(&comm, &[&a], &[&out[0]], Op::Sum);
            seen.push((
                "one buffer for two ranks",
                matches!(r, Err(Error::InvalidArgument(_))),
                format!("{r:?}"),
            ));
            // Read-only views are not outputs; overlapping outputs need writable memory
            // of one allocation: the same buffer twice.
            let r = c.all_reduce(&comm, &[&a, &b], &[&out[0], &out[0]], Op::Sum);
            seen.push((
                "one output twice",
                matches!(r, Err(Error::InvalidArgument(_))),
                format!("{r:?}"),
            ));
            let r = c.all_reduce(&comm, &[&a, &out[1]], &[&out[0], &out[1]], Op::Sum);
            seen.push((
                "an output that is an input",
                matches!(r, Err(Error::InvalidArgument(_))),
                format!("{r:?}"),
            ));
            // Overlapping inputs are fine (only read).
            c.all_reduce(&comm, &[&lo, &hi], &[&out[0], &out[1]], Op::Max)
        })
        .ctx("capture")?;
    for (what, ok, got) in &seen {
        ensure!(*ok, "{what}: {got}");
    }
    graph
        .instantiate()
        .ctx("instantiate")?
        .launch(&gpu.default_stream())
        .ctx("launch")?;
    // max(big[i], big[32 + i]) = 32 + i, in both outputs.
    for (r, o) in out.iter().enumerate() {
        let got = gpu.dtoh(o).ctx("dtoh")?;
        ensure!(
            got.iter().enumerate().all(|(i, &v)| v == (32 + i) as f32),
            "rank {r}: max over overlapping inputs gave {:?}…",
            &got[..4]
        );
    }
    Ok(())
}

/// A communicator with ranks on devices 0 and 1 is `Error::NotCapturable` (a graph runs
/// on one device). SKIPPED with one GPU.
#[cfg(feature = "collective")]
fn captured_all_reduce_over_two_devices_is_refused() -> R {
    use gpubind::collective::{CommOptions, Communicator, Op};
    if Device::count().ctx("count")? < 2 {
        return Err(skip("needs 2 GPUs"));
    }
    let (d0, d1) = (dev0()?, Device::get(1).ctx("get 1")?);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = Communicator::new(&mut ctx, &[d0.clone(), d1], CommOptions::kernels())
        .ctx("communicator")?;
    let gpu = ctx.bind(&d0).ctx("bind")?;
    let a = gpu.clone_htod(&[1i32; 64]).ctx("htod")?;
    let out = gpu.alloc_zeros::<i32>(64).ctx("alloc")?;
    let out2 = gpu.alloc_zeros::<i32>(64).ctx("alloc")?;
    let r = gpu.capture(|c| c.all_reduce(&comm, &[&a, &a], &[&out, &out2], Op::Sum));
    match r {
        Err(Error::NotCapturable { reason, .. }) => {
            ensure!(reason.contains("one device"), "reason: {reason}");
            Ok(())
        }
        other => Err(format!("a two-device all-reduce: {other:?}")),
    }
}

/// Runs `test` with device 0 bound and [`KERNELS`] loaded.
fn with_graph_kernels(test: fn(&BoundDevice<'_>, &Module) -> R) -> R {
    with_module(KERNELS, "graphs.cu", test)
}

/// Runs `test` with device 0 bound and [`EVENT_KERNELS`] loaded.
fn with_event_kernels(test: fn(&BoundDevice<'_>, &Module) -> R) -> R {
    with_module(EVENT_KERNELS, "events.cu", test)
}

/// Runs `test` with device 0 bound and `source` compiled (as `name`) and loaded.
fn with_module(source: &str, name: &str, test: fn(&BoundDevice<'_>, &Module) -> R) -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(source, name).ctx("compile")?;
    test(&gpu, &module)
}

fn main() {
    run_suite(
        "gpu_graphs",
        &[
            ("capture_replays_kernels_memsets_and_copies", || {
                with_graph_kernels(capture_replays_kernels_memsets_and_copies)
            }),
            ("one_step_runs_eagerly_and_captured_alike", || {
                with_graph_kernels(one_step_runs_eagerly_and_captured_alike)
            }),
            (
                "graph_launch_is_ordered_before_host_reads_and_other_streams",
                || with_graph_kernels(graph_launch_is_ordered_before_host_reads_and_other_streams),
            ),
            ("graph_launch_waits_for_writes_on_other_streams", || {
                with_graph_kernels(graph_launch_waits_for_writes_on_other_streams)
            }),
            ("graph_reads_inputs_at_each_launch", || {
                with_graph_kernels(graph_reads_inputs_at_each_launch)
            }),
            ("fork_join_runs_branches_and_joins", || {
                with_graph_kernels(fork_join_runs_branches_and_joins)
            }),
            ("update_changes_kernel_parameters", || {
                with_graph_kernels(update_changes_kernel_parameters)
            }),
            ("invalidated_capture_is_a_typed_error", || {
                on_device0(invalidated_capture_is_a_typed_error)
            }),
            ("swapped_fork_handles_are_typed_or_complete", || {
                on_device0(swapped_fork_handles_are_typed_or_complete)
            }),
            ("closure_errors_and_panics_end_the_capture", || {
                on_device0(closure_errors_and_panics_end_the_capture)
            }),
            ("dropping_an_exec_waits_for_its_launches", || {
                with_graph_kernels(dropping_an_exec_waits_for_its_launches)
            }),
            ("empty_capture_instantiates_and_launches", || {
                on_device0(empty_capture_instantiates_and_launches)
            }),
            (
                "launch_on_another_device_is_refused",
                launch_on_another_device_is_refused,
            ),
            ("graph_event_orders_another_graph", || {
                with_event_kernels(graph_event_orders_another_graph)
            }),
            ("graph_waits_on_an_eager_event", || {
                with_event_kernels(graph_waits_on_an_eager_event)
            }),
            ("eager_work_waits_on_a_graph_event", || {
                with_event_kernels(eager_work_waits_on_a_graph_event)
            }),
            (
                "capture_event_of_another_device_is_refused",
                capture_event_of_another_device_is_refused,
            ),
            (
                "instantiate_flags_round_trip_and_device_launch_is_refused",
                || with_event_kernels(instantiate_flags_round_trip_and_device_launch_is_refused),
            ),
            ("upload_then_launch_equals_launch", || {
                with_event_kernels(upload_then_launch_equals_launch)
            }),
            #[cfg(feature = "cublas")]
            ("captured_matmul_is_exact_at_every_launch", || {
                on_device0(captured_matmul_is_exact_at_every_launch)
            }),
            #[cfg(feature = "cublas")]
            (
                "captured_matmuls_on_forked_branches_take_turns_with_the_workspace",
                || on_device0(captured_matmuls_on_forked_branches_take_turns_with_the_workspace),
            ),
            #[cfg(feature = "collective")]
            (
                "captured_all_reduce_is_bit_exact",
                captured_all_reduce_is_bit_exact,
            ),
            #[cfg(feature = "collective")]
            ("captured_all_reduce_refusals", captured_all_reduce_refusals),
            #[cfg(feature = "collective")]
            (
                "captured_all_reduce_over_two_devices_is_refused",
                captured_all_reduce_over_two_devices_is_refused,
            ),
        ],
    )
}
