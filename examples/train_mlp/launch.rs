//! Where `train_mlp`'s ranks run ([`device_of`], [`choose_nccl`]: one process per rank,
//! see `process.rs`) and `train_mlp --spawn N` ([`spawn`]), a small built-in launcher.
//!
//! `--spawn N` Starts N copies of this executable
//! with the variables torchrun gives its workers (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT`) plus `GPUBIND_RDZV_PORT`,
//! the same arguments without `--spawn N` and with `--launcher env`, and waits for all.
//!
//! * Rank 0's standard output is this process's (its lines are the run's output); the
//!   other ranks' is discarded. Every rank's standard error is this process's.
//! * The ports: `MASTER_PORT` and `GPUBIND_RDZV_PORT` are two ports that were free on
//!   the loopback interface a moment before the start (the OS picks them; another
//!   program may take one in between, as with torchrun's `--standalone`). NCCL's id is
//!   served on `GPUBIND_RDZV_PORT`; the own-kernel backend names its job
//!   `127.0.0.1:<that port>`, so two spawned jobs on one machine never meet.
//! * If a rank fails (exits non-zero or is killed), the others get 2 s to end on their
//!   own (a rank that loses a peer mid-run returns a typed error at once), then are
//!   killed; the spawner exits non-zero naming the rank. Without a failure nothing is
//!   bounded here: each rank's waits are bounded by the library's timeouts
//!   (`GPUBIND_RDZV_TIMEOUT`, the collective timeout).
//! * On Linux each rank is killed if the spawner dies (`PR_SET_PDEATHSIG`), so a killed
//!   spawner leaves no ranks behind. (The signal follows the thread that started the
//!   rank: `spawn` is meant for the main thread, which lives as long as the spawner.)

use gpubind::Error;
use gpubind::collective::LaunchEnv;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The device of local rank `local_rank`: `--devices`' entry for it (one per local rank),
/// else the local rank modulo the visible devices (so where the launcher shows each
/// process one GPU, `CUDA_VISIBLE_DEVICES` or `srun --gpus-per-task 1`, it is device 0).
pub fn device_of(
    devices: Option<&[usize]>,
    local_rank: usize,
    count: usize,
) -> Result<usize, Error> {
    match devices {
        Some(list) => list.get(local_rank).copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "--devices lists {} device(s), but this process is local rank {local_rank}: list one device per process on this machine",
                list.len()
            ))
        }),
        None if count == 0 => Err(Error::InvalidArgument(
            "no CUDA device is visible to this process".into(),
        )),
        None => Ok(local_rank % count),
    }
}

/// Whether to use NCCL: `--backend` when given; else NCCL unless two ranks of this
/// machine map to one GPU (NCCL refuses that), then the own kernels — which work on one
/// machine only, so a job over several machines with shared GPUs is an error. Every rank
/// of a machine computes the same answer from the same inputs (the launcher's local
/// world size, `--devices`, the visible device count).
pub fn choose_nccl(
    backend: Option<bool>,
    env: &LaunchEnv,
    devices: Option<&[usize]>,
    count: usize,
) -> Result<bool, Error> {
    if let Some(nccl) = backend {
        return Ok(nccl);
    }
    let Some(local) = env.local_world_size else {
        return Err(Error::InvalidArgument(
            "the launcher does not say how many ranks run on this machine: choose the backend with --backend nccl|kernels".into(),
        ));
    };
    let mut seen = Vec::with_capacity(local);
    for l in 0..local {
        let d = device_of(devices, l, count)?;
        if seen.contains(&d) {
            if env.world_size > local {
                return Err(Error::InvalidArgument(format!(
                    "local ranks share GPU {d}: NCCL refuses that, and the own-kernel backend (--backend kernels) works on one machine only, but this job spans machines ({} ranks, {local} here)",
                    env.world_size
                )));
            }
            return Ok(false);
        }
        seen.push(d);
    }
    Ok(true)
}

/// How long the other ranks get to end on their own after one failed.
pub(crate) const GRACE: Duration = Duration::from_secs(2);

/// This process's arguments for a rank: `--spawn N` removed, `--launcher env` added.
pub fn rank_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--spawn" {
            it.next();
        } else {
            out.push(a);
        }
    }
    out.extend(["--launcher".to_owned(), "env".to_owned()]);
    out
}

/// Two distinct TCP ports free on the loopback interface right now.
fn free_ports() -> std::io::Result<(u16, u16)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// Starts rank `rank` of `world`.
fn start(
    exe: &std::path::Path,
    args: &[String],
    rank: usize,
    world: usize,
    ports: (u16, u16),
) -> std::io::Result<Child> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("GROUP_RANK", "0")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", ports.0.to_string())
        .env("GPUBIND_RDZV_PORT", ports.1.to_string())
        .stdin(Stdio::null())
        .stdout(if rank == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: runs in the child between fork and exec, where only async-signal-safe
        // calls are allowed: prctl and getppid are, and nothing allocates. If the
        // spawner died before prctl took effect the child is already reparented, which
        // getppid shows, and it stops at once.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// Kills (SIGKILL) and reaps every rank still running; returns their ranks.
fn kill_rest(ranks: &mut [(usize, Child, Option<ExitStatus>)]) -> Vec<usize> {
    let mut killed = Vec::new();
    for (rank, child, status) in ranks.iter_mut().filter(|r| r.2.is_none()) {
        // Our own child, by its id: kill then reap (so no zombie is left).
        let _ = child.kill();
        *status = child.wait().ok();
        killed.push(*rank);
    }
    killed
}

/// Runs `world` ranks of this program (`std::env::current_exe`), each with `args` (this
/// process's arguments) through [`rank_args`]; `Err` names the first rank that failed.
pub fn spawn(world: usize, args: impl IntoIterator<Item = String>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("--spawn: this executable: {e}"))?;
    let args = rank_args(args);
    let ports = free_ports().map_err(|e| format!("--spawn: no free port on 127.0.0.1: {e}"))?;
    let mut ranks: Vec<(usize, Child, Option<ExitStatus>)> = Vec::with_capacity(world);
    for rank in 0..world {
        match start(&exe, &args, rank, world, ports) {
            Ok(child) => ranks.push((rank, child, None)),
            Err(e) => {
                kill_rest(&mut ranks);
                return Err(format!("--spawn: cannot start rank {rank}: {e}"));
            }
        }
    }
    let mut failed: Option<(usize, ExitStatus, Instant)> = None;
    loop {
        for (rank, child, status) in ranks.iter_mut().filter(|r| r.2.is_none()) {
            match child.try_wait() {
                Ok(Some(st)) => {
                    *status = Some(st);
                    if !st.success() && failed.is_none() {
                        failed = Some((*rank, st, Instant::now()));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let r = *rank;
                    kill_rest(&mut ranks);
                    return Err(format!("--spawn: cannot wait for rank {r}: {e}"));
                }
            }
        }
        let running = ranks.iter().filter(|r| r.2.is_none()).count();
        match failed {
            None if running == 0 => return Ok(()),
            Some((rank, st, at)) if running == 0 || at.elapsed() >= GRACE => {
                let killed = kill_rest(&mut ranks);
                let also: Vec<String> = ranks
                    .iter()
                    .filter(|r| r.0 != rank && !killed.contains(&r.0))
                    .filter_map(|r| {
                        r.2.filter(|s| !s.success())
                            .map(|s| format!("{} ({s})", r.0))
                    })
                    .collect();
                return Err(format!(
                    "--spawn: rank {rank} of {world} failed ({st}){}{}",
                    if also.is_empty() {
                        String::new()
                    } else {
                        format!("; ranks that failed after it: {}", also.join(", "))
                    },
                    if killed.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; killed ranks {killed:?}, still running {} s after it",
                            GRACE.as_secs()
                        )
                    }
                ));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
