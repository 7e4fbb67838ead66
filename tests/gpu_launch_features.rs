//! GPU tests of the rest of issue 14 item 2: module globals (`Module::global`), cooperative
//! launches, thread-block clusters (Hopper) and per-launch priorities, through
//! `cuLaunchKernelEx`. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_launch_features` (on a GPU machine, or the built binary).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{ClusterScheduling, Device, Error, LaunchConfig, PinnedOptions, ThreadContext};

type R = Result<(), String>;

const GLOBALS: &str = r#"
__constant__ float coeffs[4];
__device__ unsigned counter;
__device__ unsigned long long wide[2];
// out[i] = coeffs[i % 4] * i; counts its threads in `counter` (by name, not passed).
extern "C" __global__ void apply(float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = coeffs[i % 4] * (float)i; atomicAdd(&counter, 1u); }
}
// Spins for `cycles` clock ticks, then adds `by` through the pointer it is given.
extern "C" __global__ void slow_bump(unsigned* p, unsigned by, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    if (blockIdx.x == 0 && threadIdx.x == 0) *p += by;
}
// Copies `counter` (read by name) to out[0].
extern "C" __global__ void read_counter(unsigned* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = counter;
}
"#;

/// What `apply` writes for `coeffs`.
fn applied(coeffs: [f32; 4], n: usize) -> Vec<f32> {
    (0..n).map(|i| coeffs[i % 4] * i as f32).collect()
}

/// Every lookup error is typed; a view works with the synchronous copies, memset, dtod and
/// a `copy_scope` on a stream, and a kernel reading the `__constant__` and counting in the
/// `__device__` variable sees and leaves exactly what the host expects.
fn globals_work_with_every_copy() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut module = gpu.compile_and_load(GLOBALS, "globals.cu").ctx("compile")?;

    // Lookups and their errors.
    let mut coeffs = module.global::<f32>("coeffs").ctx("coeffs")?;
    ensure!(coeffs.len() == 4, "coeffs has {} f32", coeffs.len());
    let as_array = module.global::<[f32; 4]>("coeffs").ctx("coeffs as array")?;
    ensure!(as_array.len() == 1, "as [f32; 4]: {}", as_array.len());
    let mut counter = module.global::<u32>("counter").ctx("counter")?;
    ensure!(counter.len() == 1, "counter: {}", counter.len());
    let wide = module.global::<u64>("wide").ctx("wide")?;
    ensure!(wide.len() == 2, "wide: {}", wide.len());
    match module.global::<u32>("no_such_variable") {
        Err(Error::GlobalNotFound { name }) => ensure!(name == "no_such_variable", "{name}"),
        other => return Err(format!("missing name: {other:?}")),
    }
    match module.global::<[u8; 3]>("coeffs") {
        Err(Error::GlobalType { name, reason, .. }) => {
            ensure!(name == "coeffs" && reason.contains("16 bytes"), "{reason}")
        }
        other => return Err(format!("3-byte elements of 16 bytes: {other:?}")),
    }
    match module.global::<u64>("counter") {
        Err(Error::GlobalType { reason, .. }) => ensure!(reason.contains("4 bytes"), "{reason}"),
        other => return Err(format!("u64 view of a 4-byte variable: {other:?}")),
    }
    ensure!(
        matches!(module.global::<u32>("a\0b"), Err(Error::InvalidArgument(_))),
        "a NUL in the name"
    );

    // Host → constant (generic copy) and → device variable (htod_copy); read back.
    let c1 = [1.0f32, 2.0, 3.0, 4.0];
    gpu.copy(&c1[..], &mut coeffs).ctx("copy → coeffs")?;
    gpu.htod_copy(&[0u32], &mut counter).ctx("htod → counter")?;
    ensure!(
        gpu.dtoh(&coeffs).ctx("dtoh coeffs")? == c1,
        "coeffs read back"
    );
    ensure!(
        gpu.dtoh(&as_array).ctx("dtoh as array")? == [c1],
        "the second view sees the same memory"
    );

    let apply = module.function("apply").ctx("apply")?;
    let n = 1000u32;
    let mut out = gpu.alloc_zeros::<f32>(n as usize).ctx("alloc")?;
    // SAFETY: (float*, unsigned) matches `apply`, which stays in bounds.
    unsafe {
        gpu.default_stream()
            .launch(&apply, LaunchConfig::for_num_elems(n))
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("launch apply")?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh out")? == applied(c1, n as usize),
        "apply with coeffs {c1:?}"
    );
    ensure!(
        gpu.dtoh(&counter).ctx("dtoh counter")? == [n],
        "counter after one launch"
    );

    // memset, dtod both ways, the generic copy out.
    gpu.memset(&mut counter, 5u32).ctx("memset counter")?;
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [5], "memset");
    let mut host = [0u32; 1];
    gpu.copy(&counter, &mut host[..])
        .ctx("copy counter → host")?;
    ensure!(host == [5], "copy out: {host:?}");
    let mut saved = gpu.alloc_zeros::<f32>(4).ctx("alloc")?;
    gpu.dtod(&coeffs, &mut saved).ctx("dtod coeffs → slice")?;
    ensure!(gpu.dtoh(&saved).ctx("dtoh")? == c1, "dtod out of a global");
    let doubled = gpu.clone_htod(&[2.0f32, 4.0, 6.0, 8.0]).ctx("htod")?;
    gpu.dtod(&doubled, &mut coeffs).ctx("dtod slice → coeffs")?;
    ensure!(
        gpu.dtoh(&coeffs).ctx("dtoh")? == [2.0, 4.0, 6.0, 8.0],
        "dtod into a global"
    );
    let wide_val = [u64::MAX, 0x0123_4567_89AB_CDEF];
    let mut wide = wide;
    gpu.copy(&wide_val[..], &mut wide).ctx("copy wide")?;
    ensure!(gpu.dtoh(&wide).ctx("dtoh wide")? == wide_val, "wide");

    // The stream-ordered writes lock the shared tracker (no exclusive claim): memsets,
    // dtod and htod on a stream, each seen by the host read that follows.
    let s0 = gpu.new_stream().ctx("stream")?;
    let on = gpu.on(&s0).ctx("on")?;
    on.memset_async(&mut counter, 77u32).ctx("memset_async")?;
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [77], "memset_async");
    on.memset_zeros_async(&mut counter)
        .ctx("memset_zeros_async")?;
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [0], "memset_zeros_async");
    on.dtod_async(&saved, &mut coeffs).ctx("dtod_async")?;
    ensure!(
        gpu.dtoh(&coeffs).ctx("dtoh")? == c1,
        "dtod_async into a global"
    );
    // SAFETY: pageable source: the driver stages it before returning.
    unsafe { on.htod_async(&[9u32], &mut counter) }.ctx("htod_async")?;
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [9], "htod_async");

    // A view cannot be lent to cudarc (its tracker is the module's): a typed refusal.
    let cs = gpu.new_cudarc_stream().ctx("cudarc stream")?;
    let lent = gpu
        .on(&cs)
        .ctx("on cudarc stream")?
        .lend_to_cudarc(&mut counter, |_| ());
    ensure!(
        matches!(lent, Err(Error::InvalidArgument(ref m)) if m.contains("module global")),
        "lending a global: {lent:?}"
    );

    // Stream-ordered: a pinned upload into the constant on one stream, then `apply` on
    // another stream must see it (the launch is claimed after the copy).
    let (s1, s2) = (gpu.new_stream().ctx("s1")?, gpu.new_stream().ctx("s2")?);
    let c2 = [-1.0f32, 0.5, 10.0, 0.25];
    let pinned = gpu
        .pinned_from_slice(&c2, PinnedOptions::default())
        .ctx("pinned")?;
    gpu.htod_copy(&[0u32], &mut counter).ctx("reset counter")?;
    let a = gpu.on(&s1).ctx("on s1")?;
    a.copy_scope(|scope| scope.copy_to_device(&pinned, &mut coeffs))
        .ctx("copy_scope → coeffs")?;
    let b = gpu.on(&s2).ctx("on s2")?;
    // SAFETY: as above.
    unsafe {
        b.launch(&apply, LaunchConfig::for_num_elems(n))
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("launch apply on s2")?;
    // The host reads wait for s2's kernel (out is its argument; counter is written by
    // name and ordered through the module).
    ensure!(
        gpu.dtoh(&out).ctx("dtoh out")? == applied(c2, n as usize),
        "apply on s2 after the upload on s1"
    );
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [n], "counter on s2");
    Ok(())
}

/// A global passed as a kernel argument is written by a slow kernel on one stream; a
/// kernel on another stream that reads the same variable *by name* must wait for it (the
/// module's launches are claimed as writes once it has views), and so must the host.
fn globals_order_kernels_that_use_them_by_name() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut module = gpu.compile_and_load(GLOBALS, "globals.cu").ctx("compile")?;
    let mut counter = module.global::<u32>("counter").ctx("counter")?;
    let slow_bump = module.function("slow_bump").ctx("slow_bump")?;
    let read_counter = module.function("read_counter").ctx("read_counter")?;
    gpu.htod_copy(&[10u32], &mut counter).ctx("htod")?;
    let (s1, s2) = (gpu.new_stream().ctx("s1")?, gpu.new_stream().ctx("s2")?);
    let (by, cycles) = (5u32, 50_000_000i64); // ~25 ms
    let a = gpu.on(&s1).ctx("on s1")?;
    // SAFETY: (unsigned*, unsigned, long long) matches `slow_bump`; one element written.
    unsafe {
        a.launch(&slow_bump, LaunchConfig::for_num_elems(1))
            .arg(&mut counter)
            .arg(&by)
            .arg(&cycles)
            .launch()
    }
    .ctx("launch slow_bump")?;
    let done = gpu.new_event(false).ctx("event")?;
    a.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the slow kernel finished before the reader was enqueued: nothing to order"
    );
    let mut seen = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let b = gpu.on(&s2).ctx("on s2")?;
    // SAFETY: (unsigned*) matches `read_counter`; one element written.
    unsafe {
        b.launch(&read_counter, LaunchConfig::for_num_elems(1))
            .arg(&mut seen)
            .launch()
    }
    .ctx("launch read_counter")?;
    ensure!(
        gpu.dtoh(&seen).ctx("dtoh seen")? == [15],
        "the kernel on s2 read `counter` before s1's kernel bumped it"
    );
    ensure!(gpu.dtoh(&counter).ctx("dtoh")? == [15], "host read");
    Ok(())
}

const TWO_GLOBALS: &str = r#"
__device__ unsigned ga[4];
__device__ unsigned gb[4];
extern "C" __global__ void touch_globals() { ga[0] += 0u; gb[0] += 0u; }
"#;

/// Copies between two globals of one module (which share one tracker) neither deadlock
/// nor race: stream-ordered copies take one merged claim, also when two threads copy in
/// opposite directions at once; a copy whose source and destination overlap (a view and
/// its clone) is refused.
fn copies_between_globals_of_one_module() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut module = gpu.compile_and_load(TWO_GLOBALS, "two.cu").ctx("compile")?;
    let mut a = module.global::<u32>("ga").ctx("ga")?;
    let mut b = module.global::<u32>("gb").ctx("gb")?;
    gpu.htod_copy(&[1u32, 2, 3, 4], &mut a).ctx("htod")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    s.dtod_async(&a, &mut b)
        .ctx("dtod_async between two globals")?;
    s.synchronize().ctx("sync")?;
    ensure!(
        gpu.dtoh(&b).ctx("dtoh")? == [1, 2, 3, 4],
        "gb after the copy"
    );
    for (what, r) in [
        ("dtod_async", s.dtod_async(&a, &mut a.clone())),
        ("dtod", gpu.dtod(&a, &mut a.clone())),
    ] {
        ensure!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{what} of a global onto its own clone: {r:?}"
        );
    }
    drop(gpu);
    // Opposite directions on two threads, many times: no lock-order deadlock.
    let (a2, b2) = (a.clone(), b.clone());
    let worker = std::thread::spawn(move || -> R {
        let (mut a2, b2) = (a2, b2);
        let mut ctx = ThreadContext::acquire().ctx("acquire (thread)")?;
        let gpu = ctx.bind(&dev0()?).ctx("bind (thread)")?;
        let stream = gpu.new_stream().ctx("stream (thread)")?;
        let s = gpu.on(&stream).ctx("on (thread)")?;
        for _ in 0..200 {
            s.dtod_async(&b2, &mut a2).ctx("b -> a")?;
        }
        s.synchronize().ctx("sync (thread)")
    });
    {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let s = gpu.on(&stream).ctx("on")?;
        for _ in 0..200 {
            s.dtod_async(&a, &mut b).ctx("a -> b")?;
        }
        s.synchronize().ctx("sync")?;
    }
    worker.join().map_err(|_| "the copying thread panicked")??;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    ensure!(
        gpu.dtoh(&a).ctx("dtoh a")? == [1, 2, 3, 4] && gpu.dtoh(&b).ctx("dtoh b")? == [1, 2, 3, 4],
        "the globals changed"
    );
    drop(module);
    Ok(())
}

/// A view keeps the loaded module alive: usable after the `Module` is dropped.
fn a_global_outlives_its_module_handle() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut module = gpu.compile_and_load(GLOBALS, "globals.cu").ctx("compile")?;
    let mut counter = module.global::<u32>("counter").ctx("counter")?;
    gpu.htod_copy(&[41u32], &mut counter).ctx("htod")?;
    let copy = counter.clone();
    drop(module);
    gpu.memset(&mut counter, 42u32)
        .ctx("memset after the module's drop")?;
    ensure!(
        gpu.dtoh(&copy).ctx("dtoh after the module's drop")? == [42],
        "the clone does not see the write"
    );
    drop(counter);
    ensure!(gpu.dtoh(&copy).ctx("dtoh")? == [42], "the last view");
    Ok(())
}

const COOPERATIVE: &str = r#"
// The cooperative launch's grid workspace (null for other launches): the driver passes its
// address in %envreg1 (high half) and %envreg2 (low half); its second word is the barrier.
__device__ unsigned* grid_workspace() {
    unsigned long long ws;
    asm volatile("mov.b64 %0, {%%envreg2, %%envreg1};" : "=l"(ws));
    return (unsigned*)ws;
}
// A grid-wide barrier on the workspace (the scheme of cooperative_groups' grid.sync()):
// block 0 adds 0x80000000 - (blocks - 1), every other block 1, so the top bit flips once
// all have arrived.
__device__ void grid_barrier(unsigned* ws) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        unsigned add = blockIdx.x == 0 ? 0x80000000u - (blocks - 1u) : 1u;
        volatile unsigned* bar = ws + 1;
        __threadfence();
        unsigned old = atomicAdd(ws + 1, add);
        while (((old ^ *bar) & 0x80000000u) == 0u) { }
        __threadfence();
    }
    __syncthreads();
}
// Each thread sums a strided part of `in` into partial[thread]; after the grid barrier
// thread 0 adds the partials: out = {sum, threads, 1}. Without a workspace (not a
// cooperative launch): out = {0, threads, 0}, and no barrier.
extern "C" __global__ void grid_sum(const unsigned* in, unsigned* partial, unsigned* out, unsigned n) {
    unsigned* ws = grid_workspace();
    unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned nthreads = gridDim.x * blockDim.x;
    if (ws == 0) {
        if (tid == 0) { out[0] = 0; out[1] = nthreads; out[2] = 0; }
        return;
    }
    unsigned s = 0;
    for (unsigned i = tid; i < n; i += nthreads) s += in[i];
    partial[tid] = s;
    grid_barrier(ws);
    if (tid == 0) {
        unsigned total = 0;
        for (unsigned i = 0; i < nthreads; ++i) total += partial[i];
        out[0] = total;
        out[1] = nthreads;
        out[2] = 1;
    }
}
"#;

/// A cooperative launch of the largest co-resident grid synchronises the whole grid and
/// sums exactly; one block more is `LaunchLimit` naming the co-residency limit, before the
/// driver; a plain launch gets no grid workspace.
fn cooperative_launch_syncs_the_grid() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(COOPERATIVE, "coop.cu")
        .ctx("compile")?;
    let k = module.function("grid_sum").ctx("grid_sum")?;
    let block = 256u32;
    let per_sm = k.max_active_blocks_per_sm(block, 0).ctx("occupancy")?;
    let sms = dev.multiprocessor_count().ctx("SMs")?;
    ensure!(per_sm > 0, "grid_sum does not fit an SM");
    let blocks = per_sm * sms;
    let n = 1u32 << 20;
    let input: Vec<u32> = (0..n).map(|i| i % 1000).collect();
    let want: u32 = input.iter().sum();
    let input = gpu.clone_htod(&input).ctx("htod")?;
    let mut partial = gpu
        .alloc_zeros::<u32>((blocks * block) as usize)
        .ctx("alloc")?;
    let mut out = gpu.alloc_zeros::<u32>(3).ctx("alloc")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let stream = gpu.default_stream();
    // SAFETY: (const unsigned*, unsigned*, unsigned*, unsigned) matches `grid_sum`;
    // `partial` has one element per thread, `out` three.
    unsafe {
        stream
            .launch(&k, cfg)
            .cooperative()
            .arg(&input)
            .arg(&mut partial)
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("cooperative launch")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got == [want, blocks * block, 1],
        "cooperative grid_sum of {blocks} blocks: {got:?}, want [{want}, {}, 1]",
        blocks * block
    );

    // One block more than can be co-resident: refused before the driver.
    let over = LaunchConfig {
        grid_dim: (blocks + 1, 1, 1),
        ..cfg
    };
    gpu.memset(&mut out, 0u32).ctx("memset")?;
    // SAFETY: as above (never enqueued).
    let e = unsafe {
        stream
            .launch(&k, over)
            .cooperative()
            .arg(&input)
            .arg(&mut partial)
            .arg(&mut out)
            .arg(&n)
            .launch()
    };
    match e {
        Err(Error::LaunchLimit {
            requested,
            limit,
            what,
            ..
        }) => ensure!(
            requested == u64::from(blocks) + 1
                && limit == u64::from(blocks)
                && what.contains("cuOccupancyMaxActiveBlocksPerMultiprocessor"),
            "{requested} / {limit}: {what}"
        ),
        other => return Err(format!("an over-large cooperative grid: {other:?}")),
    }
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")? == [0, 0, 0],
        "the refused launch ran"
    );

    // A plain launch of the same kernel runs too. (Whether the driver hands a plain
    // launch a grid workspace is its own business: on the H200, driver 580, it does, so
    // only the thread count is checked.)
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        ..cfg
    };
    // SAFETY: as above; 256 threads need 256 partials (there are more).
    unsafe {
        stream
            .launch(&k, one)
            .arg(&input)
            .arg(&mut partial)
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("plain launch")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got[1] == block,
        "a plain launch ran with {} threads: {got:?}",
        got[1]
    );
    Ok(())
}

const CG_GRID_SUM: &str = r#"
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cg_grid_sum(const unsigned* in, unsigned* partial, unsigned* out, unsigned n) {
    cg::grid_group grid = cg::this_grid();
    unsigned tid = (unsigned)grid.thread_rank();
    unsigned nthreads = (unsigned)grid.size();
    unsigned s = 0;
    for (unsigned i = tid; i < n; i += nthreads) s += in[i];
    partial[tid] = s;
    grid.sync();
    if (tid == 0) {
        unsigned total = 0;
        for (unsigned i = 0; i < nthreads; ++i) total += partial[i];
        out[0] = total;
        out[1] = nthreads;
        out[2] = grid.is_valid() ? 1u : 0u;
    }
}
"#;

/// The CUDA toolkit's include directory, if it has `cooperative_groups.h` (NVRTC has no
/// built-in copy of the header).
fn toolkit_include() -> Option<String> {
    let mut dirs: Vec<String> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|d| format!("{d}/include"))
        .collect();
    dirs.push("/usr/local/cuda/include".into());
    dirs.into_iter().find(|d| {
        std::path::Path::new(d)
            .join("cooperative_groups.h")
            .exists()
    })
}

/// cooperative_groups' own `this_grid().sync()`, compiled by NVRTC with the toolkit's
/// headers (`-I`; the header is not built into NVRTC), works with gpubind's cooperative
/// launch: exact sum, `is_valid()`. Skipped where no toolkit headers are installed or
/// NVRTC cannot compile them.
fn cooperative_groups_grid_sync_with_the_toolkit_headers() -> R {
    let Some(include) = toolkit_include() else {
        return Err(common::skip(
            "no cooperative_groups.h (set CUDA_HOME, or install the toolkit in /usr/local/cuda)",
        ));
    };
    let dev = dev0()?;
    let (major, minor) = dev.compute_capability().ctx("cc")?;
    let mut opts = vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        format!("-I{include}"),
    ];
    // CUDA 13 keeps CCCL (`cuda/std/...`, which cooperative_groups includes) in its own
    // directory under include/.
    let cccl = format!("{include}/cccl");
    if std::path::Path::new(&cccl).is_dir() {
        opts.push(format!("-I{cccl}"));
    }
    let cubin = match gpubind::compile(CG_GRID_SUM, "cg_grid_sum.cu", &opts, gpubind::Output::Cubin)
    {
        Ok(c) => c,
        Err(Error::Compile { status, log, .. }) => {
            let first = log.lines().next().unwrap_or("").to_owned();
            return Err(common::skip(&format!(
                "NVRTC cannot compile cooperative_groups.h from {include}: {status}: {first}"
            )));
        }
        Err(e) => return Err(format!("compile: {e}")),
    };
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.load_cubin(&cubin).ctx("load")?;
    let k = module.function("cg_grid_sum").ctx("function")?;
    let block = 128u32;
    let per_sm = k.max_active_blocks_per_sm(block, 0).ctx("occupancy")?;
    let blocks = per_sm * dev.multiprocessor_count().ctx("SMs")?;
    let n = 1u32 << 18;
    let input: Vec<u32> = (0..n).map(|i| (i * 7) % 31).collect();
    let want: u32 = input.iter().sum();
    let input = gpu.clone_htod(&input).ctx("htod")?;
    let mut partial = gpu
        .alloc_zeros::<u32>((blocks * block) as usize)
        .ctx("alloc")?;
    let mut out = gpu.alloc_zeros::<u32>(3).ctx("alloc")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: (const unsigned*, unsigned*, unsigned*, unsigned) matches; one partial per
    // thread, three outputs.
    unsafe {
        gpu.default_stream()
            .launch(&k, cfg)
            .cooperative()
            .arg(&input)
            .arg(&mut partial)
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("cooperative launch")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got == [want, blocks * block, 1],
        "cg grid sum: {got:?}, want [{want}, {}, 1]",
        blocks * block
    );
    Ok(())
}

const CLUSTERS: &str = r#"
__device__ unsigned sreg_cluster_ctarank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ unsigned sreg_cluster_nctarank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r)); return r; }
__device__ unsigned sreg_clusterid_x() { unsigned r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r; }
__device__ void cluster_barrier() { asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory"); }
// out[3b .. 3b+3] = {rank in the cluster, blocks in the cluster, cluster id x} of block b.
extern "C" __global__ void cluster_ids(unsigned* out) {
    if (threadIdx.x == 0) {
        unsigned b = blockIdx.x;
        out[3 * b] = sreg_cluster_ctarank();
        out[3 * b + 1] = sreg_cluster_nctarank();
        out[3 * b + 2] = sreg_clusterid_x();
    }
}
// Each block reads the shared memory of the next block of its cluster (distributed shared
// memory): out[b] = 1000 * (that block's blockIdx.x) + 7.
extern "C" __global__ void cluster_dsmem(unsigned* out) {
    __shared__ unsigned mine;
    unsigned rank = sreg_cluster_ctarank();
    unsigned next = (rank + 1u) % sreg_cluster_nctarank();
    if (threadIdx.x == 0) mine = 1000u * blockIdx.x + 7u;
    cluster_barrier();
    if (threadIdx.x == 0) {
        unsigned local = (unsigned)__cvta_generic_to_shared(&mine);
        unsigned remote, v;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(next));
        asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
        out[blockIdx.x] = v;
    }
    // No block may leave (freeing its shared memory) while a neighbour still reads it.
    cluster_barrier();
}
"#;

/// Whether the device runs clusters; if not, checks that asking is `DeviceLacks`.
fn has_clusters(dev: &Device) -> Result<bool, String> {
    let (major, _) = dev.compute_capability().ctx("cc")?;
    Ok(major >= 9)
}

fn ids_want(blocks: u32, cluster: u32) -> Vec<u32> {
    (0..blocks)
        .flat_map(|b| [b % cluster, cluster, b / cluster])
        .collect()
}

/// Cluster launches of 2 and 4 blocks: every block reads its exact rank, cluster size and
/// cluster id; a grid that is not a whole number of clusters, a cluster over the portable
/// 8 and a cooperative cluster launch are typed errors before the driver.
fn cluster_launch_ranks_are_exact() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(CLUSTERS, "clusters.cu")
        .ctx("compile")?;
    let k = module.function("cluster_ids").ctx("cluster_ids")?;
    let blocks = 16u32;
    let mut out = gpu.alloc_zeros::<u32>(3 * blocks as usize).ctx("alloc")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    let stream = gpu.default_stream();
    if !has_clusters(&dev)? {
        // SAFETY: (unsigned*) matches; never enqueued.
        let e = unsafe {
            stream
                .launch(&k, cfg)
                .cluster((2, 1, 1))
                .arg(&mut out)
                .launch()
        };
        ensure!(
            matches!(e, Err(Error::DeviceLacks { capability, .. }) if capability == "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH"),
            "a cluster launch before Hopper: {e:?}"
        );
        return Ok(());
    }
    for cluster in [2u32, 4] {
        let fit = k
            .max_active_clusters(cfg, (cluster, 1, 1))
            .ctx("max_active_clusters")?;
        ensure!(fit > 0, "no cluster of {cluster} fits");
        gpu.memset(&mut out, 0xFFFF_FFFFu32).ctx("memset")?;
        // SAFETY: (unsigned*) matches `cluster_ids`; 3 elements per block.
        unsafe {
            stream
                .launch(&k, cfg)
                .cluster((cluster, 1, 1))
                .cluster_scheduling(ClusterScheduling::Spread)
                .arg(&mut out)
                .launch()
        }
        .ctx("cluster launch")?;
        let got = gpu.dtoh(&out).ctx("dtoh")?;
        ensure!(
            got == ids_want(blocks, cluster),
            "clusters of {cluster}: {got:?}"
        );
    }

    // Refusals, before the driver (`out` keeps the last launch's values).
    let last = gpu.dtoh(&out).ctx("dtoh")?;
    let odd = LaunchConfig {
        grid_dim: (15, 1, 1),
        ..cfg
    };
    // SAFETY: never enqueued.
    let e = unsafe {
        stream
            .launch(&k, odd)
            .cluster((2, 1, 1))
            .arg(&mut out)
            .launch()
    };
    ensure!(
        matches!(
            e,
            Err(Error::ClusterGrid {
                grid: (15, 1, 1),
                cluster: (2, 1, 1),
                ..
            })
        ),
        "15 blocks in clusters of 2: {e:?}"
    );
    // SAFETY: never enqueued.
    let e = unsafe {
        stream
            .launch(&k, cfg)
            .cluster((16, 1, 1))
            .arg(&mut out)
            .launch()
    };
    ensure!(
        matches!(
            e,
            Err(Error::LaunchLimit {
                requested: 16,
                limit: 8,
                ..
            })
        ),
        "a non-portable cluster without the opt-in: {e:?}"
    );
    // SAFETY: never enqueued.
    let e = unsafe {
        stream
            .launch(&k, cfg)
            .cooperative()
            .cluster((2, 1, 1))
            .arg(&mut out)
            .launch()
    };
    ensure!(
        matches!(e, Err(Error::InvalidArgument(_))),
        "cooperative and clusters: {e:?}"
    );
    // SAFETY: never enqueued.
    let e = unsafe {
        stream
            .launch(&k, cfg)
            .priority(0)
            .cluster_scheduling(ClusterScheduling::Spread)
            .arg(&mut out)
            .launch()
    };
    ensure!(
        matches!(e, Err(Error::InvalidArgument(ref m)) if m.contains("scheduling")),
        "a scheduling policy without clusters: {e:?}"
    );
    ensure!(
        matches!(
            k.max_active_clusters(cfg, (0, 1, 1)),
            Err(Error::InvalidArgument(_))
        ),
        "a zero cluster dimension"
    );
    ensure!(gpu.dtoh(&out).ctx("dtoh")? == last, "a refused launch ran");
    Ok(())
}

/// Distributed shared memory: each block of a cluster reads its neighbour's shared
/// variable through `mapa` / `ld.shared::cluster`, exactly.
fn cluster_blocks_read_each_others_shared_memory() -> R {
    let dev = dev0()?;
    if !has_clusters(&dev)? {
        return Err(common::skip("clusters need compute capability 9.0"));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(CLUSTERS, "clusters.cu")
        .ctx("compile")?;
    let k = module.function("cluster_dsmem").ctx("cluster_dsmem")?;
    let blocks = 16u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    for cluster in [2u32, 4, 8] {
        let mut out = gpu.alloc_zeros::<u32>(blocks as usize).ctx("alloc")?;
        // SAFETY: (unsigned*) matches `cluster_dsmem`; one element per block.
        unsafe {
            gpu.default_stream()
                .launch(&k, cfg)
                .cluster((cluster, 1, 1))
                .arg(&mut out)
                .launch()
        }
        .ctx("cluster launch")?;
        let want: Vec<u32> = (0..blocks)
            .map(|b| {
                let next = (b / cluster) * cluster + (b % cluster + 1) % cluster;
                1000 * next + 7
            })
            .collect();
        let got = gpu.dtoh(&out).ctx("dtoh")?;
        ensure!(got == want, "clusters of {cluster}: {got:?}, want {want:?}");
    }
    Ok(())
}

/// With the kernel's opt-in, a cluster of 16 blocks (Hopper's non-portable maximum) runs
/// with exact ranks.
fn non_portable_cluster_size_with_the_opt_in() -> R {
    let dev = dev0()?;
    if !has_clusters(&dev)? {
        return Err(common::skip("clusters need compute capability 9.0"));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu
        .compile_and_load(CLUSTERS, "clusters.cu")
        .ctx("compile")?;
    let k = module.function("cluster_ids").ctx("cluster_ids")?;
    k.allow_non_portable_cluster_size(true).ctx("opt in")?;
    let blocks = 32u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let fit = k.max_active_clusters(cfg, (16, 1, 1)).ctx("occupancy")?;
    ensure!(fit > 0, "no cluster of 16 fits with the opt-in");
    let mut out = gpu.alloc_zeros::<u32>(3 * blocks as usize).ctx("alloc")?;
    // SAFETY: (unsigned*) matches `cluster_ids`; 3 elements per block.
    unsafe {
        gpu.default_stream()
            .launch(&k, cfg)
            .cluster((16, 1, 1))
            .arg(&mut out)
            .launch()
    }
    .ctx("cluster of 16")?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")? == ids_want(blocks, 16),
        "clusters of 16"
    );
    Ok(())
}

/// A launch with a priority in the device's range runs (exact result); one outside it is
/// `Error::StreamPriority`, before the driver.
fn launch_priority_is_checked_and_runs() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut module = gpu.compile_and_load(GLOBALS, "globals.cu").ctx("compile")?;
    let mut coeffs = module.global::<f32>("coeffs").ctx("coeffs")?;
    let c = [3.0f32, 1.0, 0.0, -2.0];
    gpu.copy(&c[..], &mut coeffs).ctx("copy")?;
    let apply = module.function("apply").ctx("apply")?;
    let range = gpu.stream_priority_range().ctx("range")?;
    let n = 256u32;
    let mut out = gpu.alloc_zeros::<f32>(n as usize).ctx("alloc")?;
    let s = gpu.new_stream().ctx("stream")?;
    let on = gpu.on(&s).ctx("on")?;
    // SAFETY: (float*, unsigned) matches `apply`.
    unsafe {
        on.launch(&apply, LaunchConfig::for_num_elems(n))
            .priority(range.greatest)
            .arg(&mut out)
            .arg(&n)
            .launch()
    }
    .ctx("launch with priority")?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")? == applied(c, n as usize),
        "prioritised launch"
    );
    // SAFETY: never enqueued.
    let e = unsafe {
        on.launch(&apply, LaunchConfig::for_num_elems(n))
            .priority(range.greatest - 1)
            .arg(&mut out)
            .arg(&n)
            .launch()
    };
    ensure!(
        matches!(e, Err(Error::StreamPriority { requested, .. }) if requested == range.greatest - 1),
        "a priority outside the range: {e:?}"
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_launch_features",
        &[
            ("globals_work_with_every_copy", globals_work_with_every_copy),
            (
                "copies_between_globals_of_one_module",
                copies_between_globals_of_one_module,
            ),
            (
                "globals_order_kernels_that_use_them_by_name",
                globals_order_kernels_that_use_them_by_name,
            ),
            (
                "a_global_outlives_its_module_handle",
                a_global_outlives_its_module_handle,
            ),
            (
                "cooperative_launch_syncs_the_grid",
                cooperative_launch_syncs_the_grid,
            ),
            (
                "cooperative_groups_grid_sync_with_the_toolkit_headers",
                cooperative_groups_grid_sync_with_the_toolkit_headers,
            ),
            (
                "cluster_launch_ranks_are_exact",
                cluster_launch_ranks_are_exact,
            ),
            (
                "cluster_blocks_read_each_others_shared_memory",
                cluster_blocks_read_each_others_shared_memory,
            ),
            (
                "non_portable_cluster_size_with_the_opt_in",
                non_portable_cluster_size_with_the_opt_in,
            ),
            (
                "launch_priority_is_checked_and_runs",
                launch_priority_is_checked_and_runs,
            ),
        ],
    )
}
