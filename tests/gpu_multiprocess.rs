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
//! Children are this binary re-run with `GPUBIND_CHILD=<role>` and the launcher's
//! variables set.

mod common;

use common::{Ctx, child_role, run_suite};
use gpubind::collective::{LaunchEnv, NcclUniqueId, nccl_available};
use gpubind::{CollectiveType, Device, DeviceSlice, Error, Op, RankComm, ThreadContext};
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

/// `Ok` when NCCL can be used; else checks the typed error and returns the skip.
fn nccl_present() -> R {
    if nccl_available() {
        return Ok(());
    }
    let e = NcclUniqueId::new().unwrap_err();
    if cfg!(not(feature = "nccl")) {
        ensure!(
            matches!(
                e,
                Error::FeatureDisabled {
                    feature: "nccl",
                    ..
                }
            ),
            "want FeatureDisabled, got {e}"
        );
        return Err(common::skip("built without the `nccl` feature"));
    }
    ensure!(e == Error::NoNccl, "want NoNccl, got {e}");
    Err(common::skip(
        "NCCL is not installed (Error::NoNccl checked)",
    ))
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
    for v in [
        "GPUBIND_RDZV_PORT",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ] {
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

/// Waits for a child (killing it past `limit`); its exit status and stdout.
fn finish(mut child: Child, limit: Duration) -> Result<(bool, String), String> {
    let start = Instant::now();
    while child.try_wait().ctx("try_wait")?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("a rank process hung past {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().ctx("wait")?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).ctx("read")?;
    Ok((status.success(), out))
}

fn free_port() -> u16 {
    // MASTER_PORT is this minus one: keep both in range.
    loop {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p > 1 {
            return p;
        }
    }
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

fn two_gpus() -> R {
    let n = Device::count().ctx("count")?;
    if n < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs (NCCL refuses two ranks on one GPU), {n} visible"
        )));
    }
    Ok(())
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
            ("nccl_two_processes", nccl_two_processes),
            (
                "nccl_rank_exiting_before_init",
                nccl_rank_exiting_before_init,
            ),
        ],
    );
}
