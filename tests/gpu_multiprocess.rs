//! GPU tests of one NCCL rank per process (`harness = false`): the launcher's variables,
//! the id rendezvous and `RankComm::init_process` / `from_launch`.
//!
//! On one GPU: a world of one rank, in this process and in a child launched with
//! torchrun's variables (every op, several dtypes, bit-exact); NCCL's bounded
//! initialisation (a world of 2 whose rank 1 never comes: `Error::PeerTimeout` within the
//! timeout, the communicator aborted, NCCL usable after). With two GPUs or more: two
//! processes (one GPU each) all-reduce across processes; a rank that exits after the
//! rendezvous makes rank 0's NCCL initialisation fail typed within the timeout. Those
//! report `ignored (SKIPPED: needs 2 GPUs)` on one GPU (NCCL refuses two ranks on one
//! GPU, across processes too).
//!
//! Dropping a rank is bounded (`nccl_rank_drop_is_bounded`, world 1 in a child with
//! `GPUBIND_DROP_TIMEOUT=1`): idle, it is destroyed at once; with its last call queued
//! behind a spinning kernel, it is aborted after the limit and logged.
//!
//! Children are this binary re-run with `GPUBIND_CHILD=<role>` and the launcher's
//! variables set.

mod common;

use common::{Ctx, SPIN, child_role, finish, free_port, nccl_present, run_suite, two_gpus};
use gpubind::collective::{CollectiveType, Op, RankComm};
use gpubind::collective::{LaunchEnv, NcclUniqueId};
use gpubind::{Device, DeviceSlice, Error, ThreadContext};
use half::{bf16, f16};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

type R = Result<(), String>;

fn dev(i: usize) -> Result<Arc<Device>, String> {
    Device::get(i).ctx("Device::get")
}

fn env_of(pairs: &[(&str, String)]) -> Result<LaunchEnv, String> {
    LaunchEnv::from_vars(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .ctx("LaunchEnv::from_vars")
}

/// Values exact in every dtype (small integers), different per element and rank.
fn values<T: CollectiveType + Copy>(n: usize, rank: usize, from: fn(f32) -> T) -> Vec<T> {
    (0..n)
        .map(|i| from(((i * 7 + rank * 3) % 50) as f32))
        .collect()
}

/// All five ops at world 1 (each the identity on the data): bit-exact.
fn world_one_ops<T>(ctx: &mut ThreadContext, comm: &mut RankComm, from: fn(f32) -> T) -> R
where
    T: CollectiveType + Copy + PartialEq + std::fmt::Debug,
{
    let d = Arc::clone(comm.device());
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    for n in [1usize, 1000, 65537] {
        let host = values(n, 0, from);
        let send: DeviceSlice<T> = gpu.clone_htod(&host).ctx("htod")?;
        let mut out: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        let s = gpu.on(&stream).ctx("on")?;
        for op in [Op::Sum, Op::Max, Op::Avg] {
            comm.all_reduce(&s, &send, &mut out, op).ctx("all_reduce")?;
            s.synchronize().ctx("sync")?;
            ensure!(
                gpu.dtoh(&out).ctx("dtoh")? == host,
                "all_reduce {op:?} n={n} {}",
                T::NAME
            );
        }
        let mut red: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        comm.reduce(&s, &send, &mut red, Op::Sum, 0).ctx("reduce")?;
        let mut gat: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        comm.all_gather(&s, &send, &mut gat).ctx("all_gather")?;
        let mut sca: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        comm.reduce_scatter(&s, &send, &mut sca, Op::Sum)
            .ctx("reduce_scatter")?;
        let mut bc: DeviceSlice<T> = gpu.clone_htod(&host).ctx("htod")?;
        comm.broadcast(&s, &mut bc, 0).ctx("broadcast")?;
        s.synchronize().ctx("sync")?;
        for (what, b) in [
            ("reduce", &red),
            ("all_gather", &gat),
            ("reduce_scatter", &sca),
            ("broadcast", &bc),
        ] {
            ensure!(gpu.dtoh(b).ctx("dtoh")? == host, "{what} n={n} {}", T::NAME);
        }
    }
    Ok(())
}

fn world_one_all_dtypes(ctx: &mut ThreadContext, comm: &mut RankComm) -> R {
    world_one_ops::<f32>(ctx, comm, |x| x)?;
    world_one_ops::<f64>(ctx, comm, f64::from)?;
    world_one_ops::<f16>(ctx, comm, f16::from_f32)?;
    world_one_ops::<bf16>(ctx, comm, bf16::from_f32)?;
    world_one_ops::<i32>(ctx, comm, |x| x as i32)?;
    world_one_ops::<i64>(ctx, comm, |x| x as i64)?;
    world_one_ops::<u8>(ctx, comm, |x| x as u8)
}

/// World 1 in this process, through `from_launch` (torchrun's variables for one rank).
fn nccl_world_one_from_launch() -> R {
    nccl_present()?;
    let env = env_of(&[("RANK", "0".into()), ("WORLD_SIZE", "1".into())])?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(env.local_rank)?;
    let mut comm = RankComm::from_launch(&mut ctx, &d, &env).ctx("from_launch")?;
    ensure!((comm.rank(), comm.nranks()) == (0, 1), "{comm:?}");
    world_one_all_dtypes(&mut ctx, &mut comm)
}

fn spawn_rank(role: &str, rank: usize, world: usize, port: u16, timeout_s: u32) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // Every variable `LaunchEnv` reads, then torchrun's for this rank.
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
        .env("GPUBIND_RDZV_TIMEOUT", timeout_s.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn().expect("spawn")
}

/// World 1 in a child process that reads torchrun's variables with `from_env`.
fn nccl_world_one_child_from_env() -> R {
    nccl_present()?;
    let child = spawn_rank("rank", 0, 1, free_port(), 60);
    let (ok, out) = finish(child, Duration::from_secs(120))?;
    ensure!(
        ok && out.contains("rank 0 of 1: ok"),
        "child failed:\n{out}"
    );
    Ok(())
}

/// World 2 with only rank 0 calling NCCL: the non-blocking init is polled and aborted
/// at the timeout, and NCCL still works after.
fn nccl_init_times_out_when_a_rank_never_comes() -> R {
    nccl_present()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let id = NcclUniqueId::new().ctx("unique id")?;
    let t = Instant::now();
    let timeout = Duration::from_secs(3);
    let out = RankComm::init_process(&mut ctx, &d, 0, 2, &id, timeout);
    let took = t.elapsed();
    match out {
        Err(Error::PeerTimeout { what, .. }) => {
            println!("    PeerTimeout after {took:?}: {what}");
            ensure!(took >= timeout, "timed out early, after {took:?}");
        }
        // NCCL giving up first is typed too.
        Err(e @ Error::Nccl { .. }) => println!("    NCCL failed first, after {took:?}: {e}"),
        Err(e) => return Err(format!("want PeerTimeout, got {e:?}")),
        Ok(c) => {
            return Err(format!(
                "init of a world of 2 with one rank succeeded: {c:?}"
            ));
        }
    }
    ensure!(
        took < timeout + Duration::from_secs(10),
        "returned after {took:?} for a timeout of {timeout:?}"
    );
    // The abort left NCCL usable.
    let id = NcclUniqueId::new().ctx("unique id")?;
    let mut comm = RankComm::init_process(&mut ctx, &d, 0, 1, &id, Duration::from_secs(60))
        .ctx("init after abort")?;
    world_one_ops::<f32>(&mut ctx, &mut comm, |x| x)
}

/// Two processes, one GPU each, all-reduce across them.
fn nccl_two_processes() -> R {
    nccl_present()?;
    two_gpus()?;
    let port = free_port();
    let children: Vec<Child> = (0..2).map(|r| spawn_rank("rank", r, 2, port, 60)).collect();
    for (r, c) in children.into_iter().enumerate() {
        let (ok, out) = finish(c, Duration::from_secs(120))?;
        ensure!(
            ok && out.contains(&format!("rank {r} of 2: ok")),
            "rank {r}:\n{out}"
        );
    }
    Ok(())
}

/// Rank 1 exits right after the rendezvous: rank 0's NCCL init fails typed within the
/// timeout instead of waiting forever.
fn nccl_rank_exiting_before_init() -> R {
    nccl_present()?;
    two_gpus()?;
    let port = free_port();
    let r0 = spawn_rank("rank", 0, 2, port, 5);
    let r1 = spawn_rank("exit_after_rendezvous", 1, 2, port, 5);
    let one = finish(r1, Duration::from_secs(60));
    let zero = finish(r0, Duration::from_secs(60));
    let (_, out1) = one?;
    ensure!(out1.contains("rendezvous ok"), "rank 1:\n{out1}");
    let (ok, out0) = zero?;
    ensure!(!ok, "rank 0 succeeded without rank 1:\n{out0}");
    ensure!(
        out0.contains("PeerTimeout") || out0.contains("Nccl {") || out0.contains("PeerFailed"),
        "rank 0 failed untyped:\n{out0}"
    );
    Ok(())
}

/// Prints gpubind's warnings on stdout (`WARN: +<ms since DROP_START> …`), for the
/// parent to read.
struct PrintWarnings;

/// When the child began the drop.
static DROP_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

impl log::Log for PrintWarnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let ms = DROP_START.get().map_or(0, |t| t.elapsed().as_millis());
            println!("WARN: +{ms} {}", r.args());
        }
    }
    fn flush(&self) {}
}

/// Spawns this binary as `role` with `GPUBIND_DROP_TIMEOUT=1` (world 1, no launcher
/// variables needed).
fn spawn_drop_child(role: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("GPUBIND_CHILD", role)
        .env("GPUBIND_DROP_TIMEOUT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

/// The drop of an NCCL `RankComm` (world 1, non-blocking) whose work has finished
/// destroys it at once (no timeout, no abort logged); the drop of one whose last call is
/// queued behind a kernel spinning for 6 s gives up after `GPUBIND_DROP_TIMEOUT` (1 s),
/// aborts the communicator (logged; `ncclCommAbort` on the release thread, waited for
/// at most the limit again) and returns within about 2 s; the stream then finishes
/// without a hang.
fn nccl_rank_drop_is_bounded() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_drop_child("drop_idle"), Duration::from_secs(120))?;
    ensure!(ok, "idle child failed:\n{out}");
    let ms: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("NCCL_DROP_MS "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no NCCL_DROP_MS line:\n{out}"))?;
    println!("    idle RankComm drop: {ms} ms");
    ensure!(
        ms < 900 && !out.contains("WARN:"),
        "the drop of an idle communicator waited {ms} ms or warned:\n{out}"
    );
    let (ok, out) = finish(spawn_drop_child("drop_pending"), Duration::from_secs(120))?;
    ensure!(ok, "pending child failed:\n{out}");
    let ms: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("NCCL_DROP_MS "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no NCCL_DROP_MS line:\n{out}"))?;
    println!("    pending RankComm drop: {ms} ms");
    for l in out
        .lines()
        .filter(|l| l.starts_with("WARN:") || l.starts_with("AFTER"))
    {
        println!("    {l}");
    }
    // The wait gives up at the limit (the warning is logged just before
    // ncclCommAbort); the abort runs on the release thread, waited for at most the
    // limit again (if NCCL's abort waits for the spinning kernel, it finishes in the
    // background): about 2 s in all, never the kernel's 6 s.
    let warned: u64 = out
        .lines()
        .find(|l| l.contains("ncclCommAbort"))
        .and_then(|l| l.strip_prefix("WARN: +"))
        .and_then(|l| l.split(' ').next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no warning that the communicator was aborted:\n{out}"))?;
    ensure!(
        (900..2500).contains(&warned) && out.contains("GPUBIND_DROP_TIMEOUT"),
        "the drop gave up after {warned} ms, expected about 1 s (GPUBIND_DROP_TIMEOUT=1):\n{out}"
    );
    ensure!(
        ms < 4_000,
        "the drop returned only after {ms} ms: expected at most about 2 s (the wait's 1 s, \
         then at most 1 s for ncclCommAbort on the release thread)"
    );
    Ok(())
}

/// Child of [`nccl_rank_drop_is_bounded`]: `pending` queues the all-reduce behind a
/// 6 s kernel before dropping the communicator; prints `NCCL_DROP_MS <ms>`.
fn child_drop(pending: bool) -> R {
    let _ = log::set_logger(&PrintWarnings);
    log::set_max_level(log::LevelFilter::Warn);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let id = NcclUniqueId::new().ctx("unique id")?;
    let mut comm =
        RankComm::init_process(&mut ctx, &d, 0, 1, &id, Duration::from_secs(60)).ctx("init")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 1 << 20;
    let send = gpu.clone_htod(&vec![3.0f32; n]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    if pending {
        let ns: u64 = 6_000_000_000;
        // SAFETY: (unsigned*, unsigned long long) as the kernel declares; it writes one
        // u32 into `flag`, which holds one.
        unsafe {
            s.launch(&f, gpubind::LaunchConfig::for_num_elems(1))
                .arg_written(&flag)
                .arg(&ns)
                .launch()
        }
        .ctx("launch spin")?;
    }
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("all_reduce")?;
    if !pending {
        s.synchronize().ctx("sync")?;
    }
    let t = *DROP_START.get_or_init(Instant::now);
    drop(comm);
    println!("NCCL_DROP_MS {}", t.elapsed().as_millis());
    // Bounded by the test's child limit: after an abort the queued work must still end
    // (or fail typed), never hang.
    let synced = s.synchronize();
    println!("AFTER stream synchronize: {synced:?}");
    if synced.is_ok() {
        let got = gpu.dtoh(&out).ctx("dtoh")?;
        println!("AFTER result[0] = {}", got[0]);
    }
    Ok(())
}

/// Two processes (one GPU each) through `from_launch`, whose call check is on by
/// default: rank 1 all-reduces 999 elements where rank 0 has 1000. Both get the same
/// `InvalidArgument("collective mismatch …")` before NCCL enqueues anything (instead of
/// a hang or a short read), and the next call fails at once with it.
fn nccl_mismatch_is_typed_on_every_process() -> R {
    nccl_present()?;
    two_gpus()?;
    let port = free_port();
    let kids: Vec<Child> = (0..2)
        .map(|r| spawn_rank("mismatch", r, 2, port, 20))
        .collect();
    let mut outs = Vec::new();
    for c in kids {
        let (_, out) = finish(c, Duration::from_secs(120))?;
        outs.push(out);
    }
    for (r, out) in outs.iter().enumerate() {
        ensure!(
            out.contains("MISMATCH InvalidArgument(\"collective mismatch: rank 0 called all_reduce(Sum) of 1000 f32")
                && out.contains("rank 1 called all_reduce(Sum) of 999 f32")
                && out.contains("AGAIN same"),
            "rank {r}:\n{out}"
        );
    }
    Ok(())
}

/// Two processes (one GPU each): rank 1 exits after one all-reduce; rank 0's next one
/// fails typed, naming rank 1, within the timeout (the call check sees the closed
/// connection before NCCL is asked).
fn nccl_rank_exiting_between_calls_is_named() -> R {
    nccl_present()?;
    two_gpus()?;
    let port = free_port();
    let t = Instant::now();
    let kids: Vec<Child> = (0..2)
        .map(|r| spawn_rank("exit_after_one", r, 2, port, 20))
        .collect();
    let mut outs = Vec::new();
    for c in kids {
        let (_, out) = finish(c, Duration::from_secs(120))?;
        outs.push(out);
    }
    ensure!(outs[1].contains("EXITING"), "rank 1:\n{}", outs[1]);
    ensure!(
        outs[0].contains("SECOND Some(PeerFailed { rank: 1"),
        "rank 0:\n{}",
        outs[0]
    );
    ensure!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    Ok(())
}

/// Children of the two tests above (`role` "mismatch" or "exit_after_one").
fn child_checked(role: &str) -> R {
    let env = LaunchEnv::from_env().ctx("from_env")?;
    ensure!(env.check_calls, "the call check is on by default");
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(env.local_rank)?;
    let mut comm = RankComm::from_launch(&mut ctx, &d, &env).map_err(|e| format!("{e:?}"))?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = if role == "mismatch" && env.rank == 1 {
        999
    } else {
        1000
    };
    let send = gpu.clone_htod(&vec![1.0f32; n]).ctx("htod")?;
    let mut sum = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let first = comm.all_reduce(&s, &send, &mut sum, Op::Sum);
    if role == "mismatch" {
        let e = first.err().ok_or("the mismatched all_reduce succeeded")?;
        println!("MISMATCH {e:?}");
        let again = comm.all_reduce(&s, &send, &mut sum, Op::Sum);
        let same = again.as_ref().err() == Some(&e);
        println!("AGAIN {}", if same { "same" } else { "different" });
        return Ok(());
    }
    first.map_err(|e| format!("first all_reduce: {e:?}"))?;
    s.synchronize().ctx("sync")?;
    if env.rank == 1 {
        println!("EXITING");
        std::process::exit(0);
    }
    let second = comm.all_reduce(&s, &send, &mut sum, Op::Sum);
    println!("SECOND {:?}", second.err());
    Ok(())
}

/// Child: one rank from the launcher's variables; all-reduces `rank + 1` and checks the
/// sum; prints `rank R of W: ok` or the error.
fn child_rank() -> Result<String, String> {
    let env = LaunchEnv::from_env().ctx("from_env")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(env.local_rank)?;
    let mut comm = RankComm::from_launch(&mut ctx, &d, &env).map_err(|e| format!("{e:?}"))?;
    if env.world_size == 1 {
        world_one_all_dtypes(&mut ctx, &mut comm)?;
    }
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let n = 1 << 20;
    let send = gpu
        .clone_htod(&vec![(env.rank + 1) as f32; n])
        .ctx("htod")?;
    let mut sum = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let s = gpu.on(&stream).ctx("on")?;
    comm.all_reduce(&s, &send, &mut sum, Op::Sum)
        .map_err(|e| format!("{e:?}"))?;
    s.synchronize().ctx("sync")?;
    let w = env.world_size;
    let want = (w * (w + 1) / 2) as f32;
    let got = gpu.dtoh(&sum).ctx("dtoh")?;
    ensure!(got.iter().all(|&x| x == want), "sum {} != {want}", got[0]);
    Ok(format!("rank {} of {w}: ok", env.rank))
}

fn main() {
    // SAFETY: single-threaded here (before any test or thread starts): no concurrent
    // reader of the environment. NVLS (multicast) stays off, as in gpu_collective.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    match child_role().as_deref() {
        Some("rank") => {
            let out = child_rank();
            match out {
                Ok(line) => {
                    println!("{line}");
                    std::process::exit(0)
                }
                Err(e) => {
                    println!("child error: {e}");
                    std::process::exit(1)
                }
            }
        }
        Some(role @ ("mismatch" | "exit_after_one")) => match child_checked(role) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                println!("child error: {e}");
                std::process::exit(1)
            }
        },
        Some(role @ ("drop_idle" | "drop_pending")) => match child_drop(role == "drop_pending") {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                println!("child error: {e}");
                std::process::exit(1)
            }
        },
        Some("exit_after_rendezvous") => {
            let env = LaunchEnv::from_env().expect("from_env");
            match env.exchange_id() {
                Ok(_) => println!("rendezvous ok"),
                Err(e) => println!("rendezvous failed: {e:?}"),
            }
            std::process::exit(0)
        }
        _ => {}
    }
    run_suite(
        "gpu_multiprocess",
        &[
            ("nccl_world_one_from_launch", nccl_world_one_from_launch),
            (
                "nccl_world_one_child_from_env",
                nccl_world_one_child_from_env,
            ),
            (
                "nccl_init_times_out_when_a_rank_never_comes",
                nccl_init_times_out_when_a_rank_never_comes,
            ),
            ("nccl_rank_drop_is_bounded", nccl_rank_drop_is_bounded),
            ("nccl_two_processes", nccl_two_processes),
            (
                "nccl_mismatch_is_typed_on_every_process",
                nccl_mismatch_is_typed_on_every_process,
            ),
            (
                "nccl_rank_exiting_between_calls_is_named",
                nccl_rank_exiting_between_calls_is_named,
            ),
            (
                "nccl_rank_exiting_before_init",
                nccl_rank_exiting_before_init,
            ),
        ],
    );
}
