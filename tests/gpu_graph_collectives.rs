//! GPU tests of NCCL collectives captured into CUDA graphs (issue 14 item 1):
//! `Capture::rank_all_reduce` and its siblings on a `RankComm` of the NCCL backend.
//! Without a driver: one SKIPPED line; without libnccl: each NCCL test reports
//! `ignored (SKIPPED: …)` after checking the typed error.
//!
//! On one GPU: an NCCL world of one rank (`RankComm::init_process`, and `from_launch`
//! with the call check on) captures a kernel that changes its input and every
//! collective, f32 and i32, and replays it 5 times with exact results; a launched graph
//! whose exec and then communicator are dropped (bounded, no error); a forgotten exec:
//! the communicator's drop leaks it at once, with a warning, and the pending launch
//! still finishes right (a child); the refusals (own kernels, a communicator not yet made,
//! overlapping buffers, updates). With two GPUs: two processes capture an all-reduce and
//! replay it; a rank launching its graph while its peer calls eagerly, and a rank
//! capturing while its peer calls eagerly, are the same typed mismatch on both
//! (`ignored (SKIPPED: needs 2 GPUs)` on one).
//!
//! Run: `cargo test --test gpu_graph_collectives` (on a GPU machine, or the built binary).

#[macro_use]
mod common;

use common::{
    Ctx, PrintWarnings, child_role, dev0, finish, free_port, nccl_present, run_suite, two_gpus,
};
use gpubind::collective::{CommOptions, Communicator, Op, RankComm};
use gpubind::collective::{LaunchEnv, NcclUniqueId};
use gpubind::{Device, Error, LaunchConfig, ThreadContext};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

type R = Result<(), String>;

const KERNELS: &str = r#"
extern "C" __global__ void addf(float* x, unsigned n, float v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void addi(int* x, unsigned n, int v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}
extern "C" __global__ void spin(unsigned* p, unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    *p = 7u;
}
"#;

/// A world of one NCCL rank on `d` (no call check).
fn world_one(ctx: &mut ThreadContext, d: &Arc<Device>) -> Result<RankComm, String> {
    let id = NcclUniqueId::new().ctx("unique id")?;
    RankComm::init_process(ctx, d, 0, 1, &id, Duration::from_secs(60)).ctx("init_process")
}

/// Values exact in f32 and i32, different per element.
fn start_values(n: usize) -> Vec<i32> {
    (0..n).map(|i| ((i * 7) % 50) as i32 - 20).collect()
}

/// One graph on a world of one rank: `addf`/`addi` add 1 to the inputs (so every launch
/// reduces new data), then all_reduce (Sum), reduce (Max, root 0), all_gather,
/// reduce_scatter (Sum) of each input, and an in-place broadcast; for f32 and i32.
/// Nothing runs at capture; each of 5 launches gives exactly `start + k` in every
/// output; the broadcast buffer keeps its values (world 1).
fn replay(comm: &RankComm, ctx: &mut ThreadContext, d: &Arc<Device>) -> R {
    let gpu = ctx.bind(d).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "gc.cu").ctx("compile")?;
    let (addf, addi) = (
        module.function("addf").ctx("addf")?,
        module.function("addi").ctx("addi")?,
    );
    let n = 65_537usize;
    let n32 = n as u32;
    let start = start_values(n);
    let startf: Vec<f32> = start.iter().map(|&v| v as f32).collect();
    let xf = gpu.clone_htod(&startf).ctx("htod xf")?;
    let xi = gpu.clone_htod(&start).ctx("htod xi")?;
    let outs_f: Vec<_> = (0..4)
        .map(|_| gpu.alloc_zeros::<f32>(n))
        .collect::<Result<_, _>>()
        .ctx("alloc f")?;
    let outs_i: Vec<_> = (0..4)
        .map(|_| gpu.alloc_zeros::<i32>(n))
        .collect::<Result<_, _>>()
        .ctx("alloc i")?;
    let bcast = gpu.clone_htod(&start).ctx("htod bcast")?;
    let graph = gpu
        .capture(|c| {
            // SAFETY: (float*, unsigned, float) / (int*, unsigned, int) match the
            // kernels, which stay within the n elements of the buffers.
            unsafe {
                c.launch(&addf, LaunchConfig::for_num_elems(n32))
                    .arg_written(&xf)
                    .value(n32)
                    .value(1.0f32)
                    .launch()?;
                c.launch(&addi, LaunchConfig::for_num_elems(n32))
                    .arg_written(&xi)
                    .value(n32)
                    .value(1i32)
                    .launch()?;
            }
            c.rank_all_reduce(comm, &xf, &outs_f[0], Op::Sum)?;
            c.rank_reduce(comm, &xf, &outs_f[1], Op::Max, 0)?;
            c.rank_all_gather(comm, &xf, &outs_f[2])?;
            c.rank_reduce_scatter(comm, &xf, &outs_f[3], Op::Sum)?;
            c.rank_all_reduce(comm, &xi, &outs_i[0], Op::Sum)?;
            c.rank_reduce(comm, &xi, &outs_i[1], Op::Max, 0)?;
            c.rank_all_gather(comm, &xi, &outs_i[2])?;
            c.rank_reduce_scatter(comm, &xi, &outs_i[3], Op::Sum)?;
            c.rank_broadcast(comm, &bcast, 0)
        })
        .ctx("capture")?;
    ensure!(
        gpu.dtoh(&xf).ctx("dtoh")? == startf && gpu.dtoh(&outs_i[0]).ctx("dtoh")?[0] == 0,
        "the capture ran work instead of recording it"
    );
    let exec = graph.instantiate().ctx("instantiate")?;
    let stream = gpu.new_stream().ctx("stream")?;
    for k in 1..=5i32 {
        exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
        let wantf: Vec<f32> = start.iter().map(|&v| (v + k) as f32).collect();
        let wanti: Vec<i32> = start.iter().map(|&v| v + k).collect();
        for (j, o) in outs_f.iter().enumerate() {
            let got = gpu.dtoh(o).ctx("dtoh f")?; // waits for the launch (claimed)
            ensure!(got == wantf, "launch {k}: f32 output {j}: [0] = {}", got[0]);
        }
        for (j, o) in outs_i.iter().enumerate() {
            let got = gpu.dtoh(o).ctx("dtoh i")?;
            ensure!(got == wanti, "launch {k}: i32 output {j}: [0] = {}", got[0]);
        }
        ensure!(
            gpu.dtoh(&bcast).ctx("dtoh bcast")? == start,
            "launch {k}: broadcast changed its buffer"
        );
    }
    Ok(())
}

/// The host time of one launch of a graph holding one all-reduce of 1024 f32 (1000
/// launches, then a synchronize), printed.
fn launch_cost(comm: &RankComm, ctx: &mut ThreadContext, d: &Arc<Device>, what: &str) -> R {
    let gpu = ctx.bind(d).ctx("bind")?;
    let x = gpu.alloc_zeros::<f32>(1024).ctx("alloc")?;
    let y = gpu.alloc_zeros::<f32>(1024).ctx("alloc")?;
    let graph = gpu
        .capture(|c| c.rank_all_reduce(comm, &x, &y, Op::Sum))
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    exec.launch(&s).ctx("warm-up launch")?;
    s.synchronize().ctx("sync")?;
    let t = Instant::now();
    for _ in 0..1000 {
        exec.launch(&s).ctx("launch")?;
    }
    let per = t.elapsed() / 1000;
    s.synchronize().ctx("sync")?;
    println!("    {what}: {per:?} per graph launch (host time; 1024 f32 all-reduce, world 1)");
    Ok(())
}

/// Replay on a world of one without the call check, and through `from_launch` (check
/// on: every launch agrees with rank 0, itself); prints the host cost of a launch both
/// ways (world 1: rank 0 decides alone, so the difference is the check's local cost;
/// across processes add one round trip to rank 0).
fn nccl_rank_graph_replays_exactly() -> R {
    nccl_present()?;
    let d = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = world_one(&mut ctx, &d)?;
    replay(&comm, &mut ctx, &d)?;
    launch_cost(&comm, &mut ctx, &d, "unchecked (init_process)")?;
    drop(comm);
    let env = LaunchEnv::from_vars(|k| match k {
        "RANK" => Some("0".into()),
        "WORLD_SIZE" => Some("1".into()),
        _ => None,
    })
    .ctx("from_vars")?;
    ensure!(env.check_calls, "the call check is on by default");
    let checked = RankComm::from_launch(&mut ctx, &d, &env).ctx("from_launch")?;
    replay(&checked, &mut ctx, &d)?;
    launch_cost(&checked, &mut ctx, &d, "checked (from_launch)")
}

/// A launched graph (a 200 ms kernel, then the all-reduce), its exec dropped (waits for
/// the launch), then the communicator dropped: no error, bounded; the result is right.
fn nccl_graph_exec_then_comm_dropped() -> R {
    nccl_present()?;
    let d = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = world_one(&mut ctx, &d)?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "gc.cu").ctx("compile")?;
    let spin = module.function("spin").ctx("spin")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let ns: u64 = 200_000_000;
    let x = gpu.clone_htod(&vec![3.0f32; 1 << 20]).ctx("htod")?;
    let y = gpu.alloc_zeros::<f32>(1 << 20).ctx("alloc")?;
    let graph = gpu
        .capture(|c| {
            // SAFETY: (unsigned*, unsigned long long) as declared; writes flag[0].
            unsafe {
                c.launch(&spin, LaunchConfig::for_num_elems(1))
                    .arg_written(&flag)
                    .value(ns)
                    .launch()?
            };
            c.rank_all_reduce(&comm, &x, &y, Op::Sum)
        })
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    drop(graph);
    let stream = gpu.new_stream().ctx("stream")?;
    exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
    let t = Instant::now();
    drop(exec);
    let exec_ms = t.elapsed().as_millis();
    let t = Instant::now();
    drop(comm);
    let comm_ms = t.elapsed().as_millis();
    println!("    exec drop {exec_ms} ms, communicator drop {comm_ms} ms");
    ensure!(
        (100..5_000).contains(&exec_ms),
        "the exec's drop took {exec_ms} ms: it should wait for its 200 ms launch"
    );
    ensure!(comm_ms < 5_000, "the communicator's drop took {comm_ms} ms");
    ensure!(
        gpu.dtoh(&y).ctx("dtoh")?.iter().all(|&v| v == 3.0),
        "wrong all-reduce result"
    );
    Ok(())
}

/// Spawns this binary as `role` with `GPUBIND_DROP_TIMEOUT=5`.
fn spawn_child(role: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("GPUBIND_CHILD", role)
        .env("GPUBIND_DROP_TIMEOUT", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

/// A forgotten `GraphExec` (`mem::forget`: its borrow of the `RankComm` ends, it is never
/// destroyed, its launch still runs): NCCL finalizes, destroys or aborts a communicator
/// only after every graph that captured it is destroyed, so the `RankComm`'s drop leaks
/// the communicator with a warning instead of waiting for ever — at once, and the launch
/// (a 1 s kernel, then the all-reduce) still finishes right on the leaked communicator.
/// In a child (`GPUBIND_DROP_TIMEOUT=5`, warnings printed).
fn nccl_comm_drop_with_a_forgotten_graph_leaks_it() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_child("forgotten_exec"), Duration::from_secs(120))?;
    ensure!(ok, "child failed:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("DROP_MS "))
        .ok_or_else(|| format!("no DROP_MS line:\n{out}"))?;
    println!("    {line}");
    let ms: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    ensure!(
        ms < 900,
        "the communicator's drop took {ms} ms: with a forgotten graph it must leak at once \
         (NCCL would wait for the graph for ever):\n{out}"
    );
    ensure!(
        out.lines()
            .any(|l| l.starts_with("WARN:") && l.contains("forgotten") && l.contains("leaked")),
        "no warning that the communicator was leaked:\n{out}"
    );
    ensure!(
        out.contains("AFTER launch_done=false") && out.contains("AFTER result 3"),
        "the launch should still run when the drop returns, and finish right:\n{out}"
    );
    Ok(())
}

/// Child of [`nccl_comm_drop_with_a_forgotten_graph_leaks_it`].
fn child_forgotten_exec() -> R {
    let _ = log::set_logger(&PrintWarnings);
    log::set_max_level(log::LevelFilter::Warn);
    let d = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm = world_one(&mut ctx, &d)?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "gc.cu").ctx("compile")?;
    let spin = module.function("spin").ctx("spin")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let ns: u64 = 1_000_000_000;
    let x = gpu.clone_htod(&vec![3.0f32; 1 << 20]).ctx("htod")?;
    let y = gpu.alloc_zeros::<f32>(1 << 20).ctx("alloc")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let after = gpu.new_event(false).ctx("event")?;
    {
        let graph = gpu
            .capture(|c| {
                // SAFETY: (unsigned*, unsigned long long) as declared; writes flag[0].
                unsafe {
                    c.launch(&spin, LaunchConfig::for_num_elems(1))
                        .arg_written(&flag)
                        .value(ns)
                        .launch()?
                };
                c.rank_all_reduce(&comm, &x, &y, Op::Sum)
            })
            .ctx("capture")?;
        let exec = graph.instantiate().ctx("instantiate")?;
        exec.launch(&s).ctx("launch")?;
        s.record(&after).ctx("record")?;
        std::mem::forget(exec);
    }
    let t = Instant::now();
    drop(comm);
    println!("DROP_MS {}", t.elapsed().as_millis());
    println!("AFTER launch_done={}", after.is_complete().ctx("query")?);
    // The host read waits for the launch (claimed), which runs on the leaked communicator.
    let got = gpu.dtoh(&y).ctx("dtoh")?;
    ensure!(got.iter().all(|&v| v == 3.0), "result {}", got[0]);
    println!("AFTER result 3");
    Ok(())
}

/// What cannot be captured, typed: an own-kernel `RankComm`; an NCCL `RankComm` whose
/// communicator is made at its first call (then, after one eager call, it captures);
/// an output overlapping the input; an update of or to a graph holding NCCL
/// collectives; another device's communicator (with 2 GPUs).
fn rank_capture_refusals_are_typed() -> R {
    let d = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let kernels =
        Communicator::init_all(std::slice::from_ref(&d), CommOptions::kernels()).ctx("init_all")?;
    {
        let gpu = ctx.bind(&d).ctx("bind")?;
        let (x, y) = (
            gpu.alloc_zeros::<f32>(64).ctx("alloc")?,
            gpu.alloc_zeros::<f32>(64).ctx("alloc")?,
        );
        let e = gpu
            .capture(|c| c.rank_all_reduce(&kernels[0], &x, &y, Op::Sum))
            .unwrap_err();
        ensure!(
            matches!(
                e,
                Error::NotCapturable {
                    what: "a collective of an own-kernel RankComm",
                    ..
                }
            ),
            "own kernels: {e:?}"
        );
    }
    nccl_present()?;
    let mut lazy =
        Communicator::init_all(std::slice::from_ref(&d), CommOptions::nccl()).ctx("init_all")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let x = gpu.clone_htod(&[2.0f32; 64]).ctx("htod")?;
    let mut y = gpu.alloc_zeros::<f32>(64).ctx("alloc")?;
    let e = gpu
        .capture(|c| c.rank_all_reduce(&lazy[0], &x, &y, Op::Sum))
        .unwrap_err();
    ensure!(
        matches!(
            e,
            Error::NotCapturable {
                what: "an NCCL collective of a RankComm not yet initialised",
                ..
            }
        ),
        "lazy NCCL: {e:?}"
    );
    let stream = gpu.new_stream().ctx("stream")?;
    lazy[0]
        .all_reduce(&gpu.on(&stream).ctx("on")?, &x, &mut y, Op::Sum)
        .ctx("eager all_reduce")?;
    let z = gpu.alloc_zeros::<f32>(64).ctx("alloc")?;
    let graph = gpu
        .capture(|c| c.rank_all_reduce(&lazy[0], &x, &z, Op::Sum))
        .ctx("capture after the first call")?;
    let mut exec = graph.instantiate().ctx("instantiate")?;
    exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
    ensure!(
        gpu.dtoh(&z).ctx("dtoh")? == vec![2.0f32; 64],
        "graph after eager"
    );
    // Updates: of a graph holding NCCL collectives, and to one.
    let e = exec.update(&graph).unwrap_err();
    ensure!(
        matches!(&e, Error::GraphUpdate { reason } if reason.contains("NCCL")),
        "update: {e:?}"
    );
    let plain = gpu.capture(|c| c.memset_zeros(&z)).ctx("capture plain")?;
    let mut plain_exec = plain.instantiate().ctx("instantiate plain")?;
    let e = plain_exec.update(&graph).unwrap_err();
    ensure!(
        matches!(&e, Error::GraphUpdate { reason } if reason.contains("NCCL")),
        "update to: {e:?}"
    );
    // Overlap: two views of one allocation sharing bytes.
    let big = gpu.alloc_zeros::<f32>(128).ctx("alloc")?;
    let (a, b) = (
        big.slice(0..64).ctx("slice")?,
        big.slice(32..96).ctx("slice")?,
    );
    let e = gpu
        .capture(|c| c.rank_all_reduce(&lazy[0], &a, &b, Op::Sum))
        .unwrap_err();
    ensure!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("overlaps")),
        "overlap: {e:?}"
    );
    // Disjoint views of one allocation are fine.
    let c2 = big.slice(64..128).ctx("slice")?;
    gpu.capture(|c| c.rank_all_reduce(&lazy[0], &a, &c2, Op::Sum))
        .ctx("disjoint views")?;
    if Device::count().ctx("count")? >= 2 {
        let other = Device::get(1).ctx("device 1")?;
        let comm1 = world_one(&mut ctx, &other)?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        let e = gpu
            .capture(|c| c.rank_all_reduce(&comm1, &x, &z, Op::Sum))
            .unwrap_err();
        ensure!(
            matches!(e, Error::WrongDevice { .. }),
            "another device's communicator: {e:?}"
        );
    }
    Ok(())
}

fn spawn_rank(role: &str, rank: usize, world: usize, port: u16) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for v in LaunchEnv::VARIABLES {
        cmd.env_remove(v);
    }
    cmd.env("GPUBIND_CHILD", role)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", (port - 1).to_string())
        .env("GPUBIND_RDZV_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn().expect("spawn")
}

/// Two processes (one GPU each, `from_launch`, call check on) capture an all-reduce of
/// `rank + 1` into a zeroed buffer (nothing runs at capture) and launch it 3 times (sum
/// 3, exact); then rank 0 launches its
/// graph again while rank 1 calls the same all-reduce eagerly: both get the same
/// "collective mismatch" naming the graph launch. In a second pair, rank 0 captures
/// while rank 1 calls eagerly: the same mismatch on both, naming the captured call.
fn nccl_two_ranks_graph_replay_and_mismatch() -> R {
    nccl_present()?;
    two_gpus()?;
    for (role, want) in [
        (
            "graph_launch_mismatch",
            "rank 0 called a launch of a CUDA graph of 1 captured collective(s)",
        ),
        (
            "capture_mismatch",
            "rank 0 called captured all_reduce(Sum) of 4096 f32",
        ),
    ] {
        let port = free_port();
        let kids: Vec<Child> = (0..2).map(|r| spawn_rank(role, r, 2, port)).collect();
        let mut outs = Vec::new();
        for c in kids {
            let (_, out) = finish(c, Duration::from_secs(120))?;
            outs.push(out);
        }
        for (r, out) in outs.iter().enumerate() {
            ensure!(
                out.contains("MISMATCH InvalidArgument(\"collective mismatch: ")
                    && out.contains(want)
                    && out.contains("rank 1 called all_reduce(Sum) of 4096 f32"),
                "{role}, rank {r}:\n{out}"
            );
            if role == "graph_launch_mismatch" {
                ensure!(out.contains("REPLAYED 3"), "{role}, rank {r}:\n{out}");
            }
        }
    }
    Ok(())
}

/// Children of [`nccl_two_ranks_graph_replay_and_mismatch`].
fn child_two_ranks(role: &str) -> R {
    let env = LaunchEnv::from_env().ctx("from_env")?;
    ensure!(env.check_calls, "the call check is on by default");
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = Device::get(env.local_rank).ctx("device")?;
    let mut comm = RankComm::from_launch(&mut ctx, &d, &env).map_err(|e| format!("{e:?}"))?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let n = 4096;
    let send = gpu
        .clone_htod(&vec![(env.rank + 1) as f32; n])
        .ctx("htod")?;
    let mut sum = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let eager_rank1 = |comm: &mut RankComm, sum: &mut gpubind::DeviceSlice<f32>| {
        let e = comm
            .all_reduce(&gpu.on(&stream).ctx("on")?, &send, sum, Op::Sum)
            .err()
            .ok_or("the mismatched eager all_reduce succeeded")?;
        println!("MISMATCH {e:?}");
        Ok::<(), String>(())
    };
    if role == "capture_mismatch" {
        if env.rank == 1 {
            return eager_rank1(&mut comm, &mut sum);
        }
        let e = gpu
            .capture(|c| c.rank_all_reduce(&comm, &send, &sum, Op::Sum))
            .err()
            .ok_or("the mismatched capture succeeded")?;
        println!("MISMATCH {e:?}");
        return Ok(());
    }
    {
        let graph = gpu
            .capture(|c| c.rank_all_reduce(&comm, &send, &sum, Op::Sum))
            .map_err(|e| format!("capture: {e:?}"))?;
        ensure!(
            gpu.dtoh(&sum).ctx("dtoh")?.iter().all(|&v| v == 0.0),
            "the capture ran the all-reduce"
        );
        let exec = graph.instantiate().ctx("instantiate")?;
        for k in 0..3 {
            exec.launch(&gpu.on(&stream).ctx("on")?)
                .map_err(|e| format!("launch {k}: {e:?}"))?;
            let got = gpu.dtoh(&sum).ctx("dtoh")?;
            ensure!(got.iter().all(|&v| v == 3.0), "launch {k}: {}", got[0]);
        }
        println!("REPLAYED 3");
        if env.rank == 0 {
            let e = exec
                .launch(&gpu.on(&stream).ctx("on")?)
                .err()
                .ok_or("the mismatched graph launch succeeded")?;
            println!("MISMATCH {e:?}");
            return Ok(());
        }
    }
    eager_rank1(&mut comm, &mut sum)
}

fn main() {
    // SAFETY: single-threaded here (before any test or thread starts): no concurrent
    // reader of the environment. NVLS (multicast) stays off, as in gpu_collective.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let child = match child_role().as_deref() {
        Some("forgotten_exec") => Some(child_forgotten_exec()),
        Some(role @ ("graph_launch_mismatch" | "capture_mismatch")) => Some(child_two_ranks(role)),
        _ => None,
    };
    if let Some(out) = child {
        match out {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                println!("child error: {e}");
                std::process::exit(1)
            }
        }
    }
    run_suite(
        "gpu_graph_collectives",
        &[
            (
                "nccl_rank_graph_replays_exactly",
                nccl_rank_graph_replays_exactly,
            ),
            (
                "nccl_graph_exec_then_comm_dropped",
                nccl_graph_exec_then_comm_dropped,
            ),
            (
                "nccl_comm_drop_with_a_forgotten_graph_leaks_it",
                nccl_comm_drop_with_a_forgotten_graph_leaks_it,
            ),
            (
                "rank_capture_refusals_are_typed",
                rank_capture_refusals_are_typed,
            ),
            (
                "nccl_two_ranks_graph_replay_and_mismatch",
                nccl_two_ranks_graph_replay_and_mismatch,
            ),
        ],
    )
}
