//! CPU tests of `train_mlp`'s launching (examples/train_mlp/launch.rs), no GPU needed:
//! where each local rank runs and which backend it picks, the arguments a rank gets, and
//! the `--spawn` launcher itself, run on this test binary as its "program": every rank
//! gets torchrun's variables and rank 0's output alone is forwarded; a rank that fails
//! makes the spawner fail at once naming it, killing the rank that would have waited 60 s.
//!
//! Roles: the test re-executes itself as the spawner (`GPUBIND_CHILD=spawner`, its
//! output captured), which starts the ranks (this binary again, `RANK` set) whose
//! behaviour `TRAIN_LAUNCH_ROLE` picks.

#[path = "../examples/train_mlp/launch.rs"]
mod launch;

use gpubind::Error;
use gpubind::collective::LaunchEnv;
use std::process::Command;
use std::time::{Duration, Instant};

fn env_of(vars: &[(&str, &str)]) -> LaunchEnv {
    LaunchEnv::from_vars(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

fn torch(rank: usize, world: usize, local: usize) -> LaunchEnv {
    let (r, w, l) = (rank.to_string(), world.to_string(), local.to_string());
    env_of(&[
        ("RANK", &r),
        ("WORLD_SIZE", &w),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", &l),
        ("MASTER_ADDR", "node0"),
    ])
}

fn placement() {
    use launch::{choose_nccl, device_of};
    // --devices: one entry per local rank; else local rank modulo the visible devices.
    assert_eq!(device_of(Some(&[3, 1]), 1, 8).unwrap(), 1);
    assert!(matches!(
        device_of(Some(&[0]), 1, 8),
        Err(Error::InvalidArgument(m)) if m.contains("local rank 1")
    ));
    assert_eq!(device_of(None, 5, 8).unwrap(), 5);
    assert_eq!(
        device_of(None, 3, 1).unwrap(),
        0,
        "one visible GPU per process"
    );
    assert_eq!(device_of(None, 3, 2).unwrap(), 1);
    assert!(matches!(
        device_of(None, 0, 0),
        Err(Error::InvalidArgument(_))
    ));
    // --backend wins.
    let one_node = torch(0, 2, 2);
    assert!(!choose_nccl(Some(false), &one_node, None, 8).unwrap());
    assert!(choose_nccl(Some(true), &one_node, Some(&[0, 0]), 1).unwrap());
    // Distinct GPUs: NCCL; shared: own kernels, on one machine only.
    assert!(choose_nccl(None, &one_node, None, 8).unwrap());
    assert!(!choose_nccl(None, &one_node, None, 1).unwrap());
    assert!(!choose_nccl(None, &one_node, Some(&[0, 0]), 8).unwrap());
    assert!(choose_nccl(None, &torch(3, 4, 2), None, 2).unwrap());
    assert!(matches!(
        choose_nccl(None, &torch(3, 4, 2), None, 1),
        Err(Error::InvalidArgument(m)) if m.contains("spans machines")
    ));
    // No local world size (a Slurm "2(x3)"): the flag is needed.
    let slurm = env_of(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NTASKS_PER_NODE", "2(x3)"),
        ("MASTER_ADDR", "node0"),
    ]);
    assert!(matches!(
        choose_nccl(None, &slurm, None, 8),
        Err(Error::InvalidArgument(m)) if m.contains("--backend")
    ));
    assert!(choose_nccl(Some(true), &slurm, None, 8).unwrap());
    println!("placement ... ok");
}

fn rank_arguments() {
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        launch::rank_args(args(&["--spawn", "4", "--epochs", "3", "--devices", "0,0"])),
        args(&["--epochs", "3", "--devices", "0,0", "--launcher", "env"])
    );
    assert_eq!(
        launch::rank_args(args(&["--lr", "0.5", "--spawn", "2"])),
        args(&["--lr", "0.5", "--launcher", "env"])
    );
    println!("rank_arguments ... ok");
}

/// Starts the spawner (this binary, `GPUBIND_CHILD=spawner`) for `world` ranks of `role`.
fn spawner(role: &str, world: usize) -> (std::process::Output, f64) {
    let start = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--spawn", &world.to_string(), "--epochs", "3"])
        .env("GPUBIND_CHILD", "spawner")
        .env("TRAIN_LAUNCH_ROLE", role)
        .env_remove("RANK")
        .output()
        .unwrap();
    (out, start.elapsed().as_secs_f64())
}

fn spawn_gives_every_rank_torchruns_variables() {
    let (out, secs) = spawner("report", 3);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Only rank 0's standard output comes through.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let f: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(
        &f[..6],
        ["rank", "0", "3", "0", "3", "127.0.0.1"],
        "{stdout}"
    );
    let (master, rdzv): (u16, u16) = (f[6].parse().unwrap(), f[7].parse().unwrap());
    assert!(master > 0 && rdzv > 0 && master != rdzv, "{stdout}");
    assert_eq!(&f[8..], ["--epochs", "3", "--launcher", "env"], "{stdout}");
    // The ranks read it as torchrun's, on one machine.
    let err = String::from_utf8_lossy(&out.stderr);
    for r in 0..3 {
        assert!(
            err.contains(&format!("env {r} of 3 local {r} Torch port {rdzv}")),
            "rank {r}: {err}"
        );
    }
    println!("spawn_gives_every_rank_torchruns_variables ... ok ({secs:.1} s)");
}

fn a_failing_rank_fails_the_spawn_at_once() {
    let (out, secs) = spawner("rank1-fails", 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 1 giving up")
            && err.contains("--spawn: rank 1 of 2 failed (exit status: 3)")
            && err.contains("killed ranks [0]"),
        "{err}"
    );
    // Rank 0 would have slept 60 s: it was killed after the grace. Bound: the grace
    // plus max(2 s, the grace), plus a generous allowance for starting the spawner and
    // its ranks on a loaded machine (measured here, so start-up counts).
    let grace = launch::GRACE.as_secs_f64();
    let limit = grace + grace.max(2.0) + 10.0;
    println!(
        "a_failing_rank_fails_the_spawn_at_once: took {secs:.1} s (grace {grace} s, limit \
         {limit} s, the other rank would sleep 60 s)"
    );
    assert!(secs < limit, "took {secs:.1} s (limit {limit} s)");
    println!("a_failing_rank_fails_the_spawn_at_once ... ok ({secs:.1} s)");
}

fn ranks_that_fail_together_are_all_named() {
    let (out, secs) = spawner("all-fail", 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Both exit 4 at once: the first seen is named, the other listed after it.
    assert!(
        err.contains("of 2 failed (exit status: 4); ranks that failed after it: ")
            && err.contains("(exit status: 4)"),
        "{err}"
    );
    assert!(!err.contains("killed ranks"), "{err}");
    println!("ranks_that_fail_together_are_all_named ... ok ({secs:.1} s)");
}

/// A rank: behaves as `TRAIN_LAUNCH_ROLE` says.
fn rank_main(role: &str) -> ! {
    let env = LaunchEnv::from_env().unwrap();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    // One write of the whole line: stderr is unbuffered, and `eprintln!` writes its pieces
    // one by one, so three ranks' lines interleaved mid-line (seen in CI).
    let line = format!(
        "env {} of {} local {} {:?} port {}\n",
        env.rank, env.world_size, env.local_rank, env.launcher, env.port
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    match role {
        "report" => {
            println!(
                "rank {} {} {} {} {} {} {} {}",
                var("RANK"),
                var("WORLD_SIZE"),
                var("LOCAL_RANK"),
                var("LOCAL_WORLD_SIZE"),
                var("MASTER_ADDR"),
                var("MASTER_PORT"),
                var("GPUBIND_RDZV_PORT"),
                args.join(" ")
            );
            std::process::exit(0)
        }
        "rank1-fails" if env.rank == 1 => {
            std::thread::sleep(Duration::from_millis(200));
            eprintln!("rank 1 giving up");
            std::process::exit(3)
        }
        "rank1-fails" => {
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(0)
        }
        _ => std::process::exit(4),
    }
}

fn main() {
    if let Ok(role) = std::env::var("TRAIN_LAUNCH_ROLE") {
        if std::env::var("RANK").is_ok() {
            rank_main(&role);
        }
        if std::env::var("GPUBIND_CHILD").as_deref() == Ok("spawner") {
            let args = std::env::args().skip(1).collect::<Vec<_>>();
            let world: usize = args[1].parse().unwrap();
            match launch::spawn(world, args) {
                Ok(()) => std::process::exit(0),
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1)
                }
            }
        }
    }
    placement();
    rank_arguments();
    spawn_gives_every_rank_torchruns_variables();
    a_failing_rank_fails_the_spawn_at_once();
    ranks_that_fail_together_are_all_named();
}
