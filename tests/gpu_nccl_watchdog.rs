//! GPU tests of the NCCL watchdog (`harness = false`): while an NCCL `RankComm`'s calls
//! run on the GPU, a background thread polls `ncclCommGetAsyncError` and aborts the
//! communicator (`ncclCommAbort`) when NCCL reports an error or a call stays unfinished
//! longer than the communicator's timeout, so that the caller's own waits return.
//!
//! On one GPU (NCCL world 1, in child processes so that each has its own logger and
//! `GPUBIND_DROP_TIMEOUT`):
//! * `nccl_watchdog_aborts_a_stuck_collective`: an all-reduce queued behind a 5 s kernel
//!   with a timeout of 1 s: `RankComm::wait` returns `PeerTimeout` naming `all_reduce`
//!   after about 1 s while the kernel still runs; `check` and the next call return the
//!   same error at once (nothing enqueued); the stream's own synchronize then returns; the
//!   drop is immediate and destroys nothing twice (no warning); a new communicator works
//!   after, and the process exits cleanly.
//! * `nccl_watchdog_aborts_a_stuck_graph_launch`: the same for a graph launch of a
//!   captured all-reduce (after one healthy, exact launch): `check` returns `PeerTimeout`
//!   naming the graph launch at about 1 s, and the next launch is refused with it.
//! * `nccl_watchdog_leaves_healthy_work_alone`: idle longer than the timeout, a call
//!   queued behind another of 0.7 s + 0.7 s of kernels with a timeout of 1 s (each call
//!   is timed from when the one before finished), and 200 calls queued at once: no abort,
//!   exact results, a quiet drop.
//!
//! * `nccl_group_step_failure_never_hangs`: a `Communicator` group (one thread, every
//!   rank) whose gpubind step for call #1 fails (the test seam) after call #0 was handed
//!   to NCCL returns that typed error at once (NCCL cancels the group), and the
//!   communicator works after. With two GPUs this is the case that hung: rank 1's step
//!   failing after rank 0's all-reduce was handed over; rank 0's output stays untouched
//!   (nothing of the group ran). On one GPU (world 1: two calls of rank 0) the two-rank
//!   case prints `SKIPPED`.
//!
//! With two GPUs: `nccl_watchdog_killed_peer_mid_collective` (rank 1 is killed with its
//! all-reduce queued behind a 30 s kernel while rank 0 waits in its own all-reduce:
//! rank 0's `wait` returns a typed error — NCCL's, or `PeerTimeout` at its 5 s timeout —
//! instead of hanging). Reports `SKIPPED` on one GPU (NCCL refuses two ranks on one GPU).

mod common;

use common::{
    Ctx, PrintWarnings, SPIN, child_role, finish, free_port, nccl_present, run_suite, two_gpus,
};
#[cfg(feature = "nccl")]
use gpubind::collective::{CommOptions, Communicator};
use gpubind::collective::{LaunchEnv, NcclUniqueId};
use gpubind::collective::{Op, RankComm};
use gpubind::{Device, ThreadContext};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

type R = Result<(), String>;

fn dev(i: usize) -> Result<Arc<Device>, String> {
    Device::get(i).ctx("Device::get")
}

/// A world-1 child's start: gpubind's warnings printed for the parent, and an NCCL rank
/// of its own on `d` whose communicator times out after 1 s.
fn world_one_child(ctx: &mut ThreadContext, d: &Arc<Device>) -> Result<RankComm, String> {
    let _ = log::set_logger(&PrintWarnings);
    log::set_max_level(log::LevelFilter::Warn);
    let id = NcclUniqueId::new().ctx("unique id")?;
    RankComm::init_process(ctx, d, 0, 1, &id, Duration::from_secs(1)).ctx("init")
}

/// Enqueues `spin_then_write` on `s`: it spins for `ns` nanoseconds, then writes `flag`.
fn spin(
    s: &gpubind::BoundStream<'_>,
    f: &gpubind::Function<'_>,
    flag: &gpubind::DeviceSlice<u32>,
    ns: u64,
) -> R {
    // SAFETY: (unsigned*, unsigned long long) as the kernel declares; it writes one u32
    // into `flag`, which holds one.
    unsafe {
        s.launch(f, gpubind::LaunchConfig::for_num_elems(1))
            .arg_written(flag)
            .arg(&ns)
            .launch()
    }
    .ctx("launch spin")
}

/// Spawns this binary as `role` (world 1, `GPUBIND_DROP_TIMEOUT=2`).
fn spawn_child(role: &str) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for v in LaunchEnv::VARIABLES {
        cmd.env_remove(v);
    }
    cmd.env("GPUBIND_CHILD", role)
        .env("GPUBIND_DROP_TIMEOUT", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

/// The number after `key ` on a line of `out`.
fn value(out: &str, key: &str) -> Result<u64, String> {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no `{key}` line:\n{out}"))
}

fn nccl_watchdog_aborts_a_stuck_collective() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_child("stuck"), Duration::from_secs(120))?;
    for l in out.lines() {
        println!("    {l}");
    }
    ensure!(ok, "child failed:\n{out}");
    let wait_ms = value(&out, "WAIT_MS ")?;
    ensure!(
        (900..2500).contains(&wait_ms),
        "wait returned after {wait_ms} ms, want about 1 s (the timeout)"
    );
    ensure!(
        out.contains("WAIT_ERR PeerTimeout") && out.contains("all_reduce"),
        "wait did not return PeerTimeout naming all_reduce:\n{out}"
    );
    ensure!(
        value(&out, "KERNEL_RUNNING_AT_WAIT ")? == 1,
        "the spin kernel had already ended when wait returned: the abort was not \
         the watchdog's:\n{out}"
    );
    ensure!(out.contains("CHECK_SAME 1"), "check() differs:\n{out}");
    ensure!(out.contains("NEXT_SAME 1"), "the next call differs:\n{out}");
    ensure!(
        value(&out, "NEXT_MS ")? < 100,
        "the next call was not refused at once"
    );
    ensure!(
        value(&out, "DROP_MS ")? < 500,
        "the drop of an aborted communicator waited"
    );
    ensure!(
        !out.contains("WARN:"),
        "a warning was logged (a second abort or a destroy of an aborted one?):\n{out}"
    );
    ensure!(
        out.contains("AFTER ok"),
        "NCCL unusable after the abort:\n{out}"
    );
    Ok(())
}

/// Child of [`nccl_watchdog_aborts_a_stuck_collective`].
fn child_stuck() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let mut comm = world_one_child(&mut ctx, &d)?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 1 << 20;
    let send = gpu.clone_htod(&vec![3.0f32; n]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let ns: u64 = 5_000_000_000;
    spin(&s, &f, &flag, ns)?;
    let done = gpu.new_event(false).ctx("event")?;
    s.record(&done).ctx("record")?;
    let t = Instant::now();
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("all_reduce")?;
    let waited = comm.wait(&s);
    println!("WAIT_MS {}", t.elapsed().as_millis());
    println!(
        "KERNEL_RUNNING_AT_WAIT {}",
        u8::from(!done.is_complete().ctx("query")?)
    );
    let Err(e) = waited else {
        return Err("wait returned Ok for an all-reduce stuck past its timeout".into());
    };
    println!("WAIT_ERR {e:?}");
    println!("CHECK_SAME {}", u8::from(comm.check() == Err(e.clone())));
    let t = Instant::now();
    let next = comm.all_reduce(&s, &send, &mut out, Op::Sum);
    println!("NEXT_MS {}", t.elapsed().as_millis());
    println!("NEXT_SAME {}", u8::from(next == Err(e.clone())));
    // The stream's own wait returns (the kernel ends at 5 s; the aborted collective's
    // work exits); its result is not asserted beyond returning.
    let t = Instant::now();
    let synced = s.synchronize();
    println!("SYNC_MS {} {synced:?}", t.elapsed().as_millis());
    let t = Instant::now();
    drop(comm);
    println!("DROP_MS {}", t.elapsed().as_millis());
    // NCCL still works in this process (on a thread of its own: this one's binding is
    // borrowed above).
    std::thread::spawn(fresh_all_reduce)
        .join()
        .map_err(|_| "the fresh thread panicked".to_string())??;
    println!("AFTER ok");
    Ok(())
}

/// A new world-1 communicator all-reduces correctly.
fn fresh_all_reduce() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let id = NcclUniqueId::new().ctx("unique id")?;
    let mut comm = RankComm::init_process(&mut ctx, &d, 0, 1, &id, Duration::from_secs(60))
        .ctx("init after abort")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let send = gpu.clone_htod(&[3.0f32; 1000]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(1000).ctx("alloc")?;
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("all_reduce after abort")?;
    comm.wait(&s).ctx("wait after abort")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(got.iter().all(|&x| x == 3.0), "wrong sum {}", got[0]);
    Ok(())
}

fn nccl_watchdog_aborts_a_stuck_graph_launch() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_child("graph"), Duration::from_secs(120))?;
    for l in out.lines() {
        println!("    {l}");
    }
    ensure!(ok, "child failed:\n{out}");
    ensure!(
        out.contains("HEALTHY_LAUNCH ok"),
        "the graph's first launch was not exact:\n{out}"
    );
    let abort_ms = value(&out, "ABORT_MS ")?;
    ensure!(
        (900..2500).contains(&abort_ms),
        "the watchdog's verdict came after {abort_ms} ms, want about 1 s (the timeout)"
    );
    ensure!(
        out.contains("CHECK_ERR PeerTimeout") && out.contains("graph launch"),
        "check() did not return PeerTimeout naming the graph launch:\n{out}"
    );
    ensure!(
        value(&out, "KERNEL_RUNNING_AT_ABORT ")? == 1,
        "the spin kernel had already ended at the verdict: the abort was not the \
         watchdog's:\n{out}"
    );
    ensure!(
        out.contains("RELAUNCH_SAME 1"),
        "a launch after the abort was not refused with the verdict:\n{out}"
    );
    ensure!(
        value(&out, "RELAUNCH_MS ")? < 100,
        "the refused launch waited"
    );
    ensure!(out.contains("GRAPH ok"), "{out}");
    Ok(())
}

/// Child of [`nccl_watchdog_aborts_a_stuck_graph_launch`]: a captured all-reduce's
/// graph launch queued behind a 5 s kernel, the communicator's timeout 1 s.
fn child_graph() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let comm = world_one_child(&mut ctx, &d)?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 1 << 20;
    let send = gpu.clone_htod(&vec![3.0f32; n]).ctx("htod")?;
    let out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let graph = gpu
        .capture(|c| c.rank_all_reduce(&comm, &send, &out, Op::Sum))
        .ctx("capture")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    // A healthy launch first: watched, finished, exact.
    exec.launch(&s).ctx("first launch")?;
    s.synchronize().ctx("sync")?;
    comm.check().ctx("check after a healthy launch")?;
    ensure!(
        gpu.dtoh(&out).ctx("dtoh")?.iter().all(|&x| x == 3.0),
        "world-1 all-reduce of 3.0 is not 3.0"
    );
    println!("HEALTHY_LAUNCH ok");
    let ns: u64 = 5_000_000_000;
    spin(&s, &f, &flag, ns)?;
    let done = gpu.new_event(false).ctx("event")?;
    s.record(&done).ctx("record")?;
    let t = Instant::now();
    exec.launch(&s).ctx("launch behind the kernel")?;
    // The graph borrows the communicator (shared), so `wait` (&mut) is out: poll check.
    let e = loop {
        if let Err(e) = comm.check() {
            break e;
        }
        if t.elapsed() > Duration::from_secs(4) {
            return Err("no verdict 4 s after a launch stuck past its 1 s timeout".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("ABORT_MS {}", t.elapsed().as_millis());
    println!(
        "KERNEL_RUNNING_AT_ABORT {}",
        u8::from(!done.is_complete().ctx("query")?)
    );
    println!("CHECK_ERR {e:?}");
    let t = Instant::now();
    let again = exec.launch(&s);
    println!("RELAUNCH_MS {}", t.elapsed().as_millis());
    println!("RELAUNCH_SAME {}", u8::from(again == Err(e.clone())));
    let t = Instant::now();
    let synced = s.synchronize();
    println!("SYNC_MS {} {synced:?}", t.elapsed().as_millis());
    drop(exec);
    drop(graph);
    drop(comm);
    println!("GRAPH ok");
    Ok(())
}

fn nccl_watchdog_leaves_healthy_work_alone() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_child("healthy"), Duration::from_secs(120))?;
    for l in out.lines() {
        println!("    {l}");
    }
    ensure!(ok, "child failed:\n{out}");
    ensure!(!out.contains("WARN:"), "a warning was logged:\n{out}");
    ensure!(out.contains("HEALTHY ok"), "{out}");
    Ok(())
}

/// Child of [`nccl_watchdog_leaves_healthy_work_alone`].
fn child_healthy() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(0)?;
    let mut comm = world_one_child(&mut ctx, &d)?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 4096;
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let send = gpu.clone_htod(&data).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("all_reduce")?;
    comm.wait(&s).ctx("wait")?;
    // Idle for longer than the timeout: nothing is in flight, nothing is timed.
    std::thread::sleep(Duration::from_millis(1500));
    comm.check().ctx("check after idle")?;
    // Two calls, each behind 0.7 s of kernel: 1.4 s from the second's enqueue, but only
    // 0.7 s from when the first finished.
    let ns: u64 = 700_000_000;
    for _ in 0..2 {
        spin(&s, &f, &flag, ns)?;
        comm.all_reduce(&s, &send, &mut out, Op::Sum)
            .ctx("all_reduce behind a kernel")?;
    }
    comm.wait(&s).ctx("wait for two calls behind kernels")?;
    // Many calls in flight at once.
    for _ in 0..200 {
        comm.all_reduce(&s, &send, &mut out, Op::Sum)
            .ctx("all_reduce x200")?;
    }
    s.synchronize().ctx("sync")?;
    comm.check().ctx("check after 200")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(got == data, "world 1 all-reduce is a copy");
    let t = Instant::now();
    drop(comm);
    ensure!(
        t.elapsed() < Duration::from_millis(900),
        "drop took {:?}",
        t.elapsed()
    );
    println!("HEALTHY ok");
    Ok(())
}

fn spawn_rank(rank: usize, port: u16) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    for v in LaunchEnv::VARIABLES {
        cmd.env_remove(v);
    }
    cmd.env("GPUBIND_CHILD", "peer")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", (port - 1).to_string())
        .env("GPUBIND_RDZV_TIMEOUT", "5")
        // If the abort did not end the NCCL kernel, the buffers' drops would wait this
        // long at exit (then leak), rather than the default 300 s.
        .env("GPUBIND_DROP_TIMEOUT", "5")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn().expect("spawn")
}

/// Two processes on two GPUs: both all-reduce once, then rank 1 queues its second
/// all-reduce behind a 30 s kernel and is killed while rank 0 waits in the second one.
/// Rank 0's `wait` must return a typed error (NCCL's own, or `PeerTimeout` at its 5 s
/// timeout) well before the kernel's 30 s.
fn nccl_watchdog_killed_peer_mid_collective() -> R {
    nccl_present()?;
    two_gpus()?;
    let port = free_port();
    let mut r0 = spawn_rank(0, port);
    let mut r1 = spawn_rank(1, port);
    // Kill rank 1 once its second all-reduce is queued.
    let mut lines = std::io::BufReader::new(r1.stdout.take().unwrap()).lines();
    let queued = lines.any(|l| l.is_ok_and(|l| l.contains("QUEUED")));
    std::thread::sleep(Duration::from_millis(500));
    let _ = r1.kill();
    let _ = r1.wait();
    if !queued {
        let _ = r0.kill();
        let _ = r0.wait();
        return Err("rank 1 never queued its second all-reduce".into());
    }
    let t = Instant::now();
    let (ok, out) = finish(r0, Duration::from_secs(60))?;
    println!(
        "    rank 0 ended {:?} after rank 1 was killed:",
        t.elapsed()
    );
    for l in out.lines() {
        println!("    {l}");
    }
    ensure!(!ok, "rank 0 succeeded without rank 1:\n{out}");
    ensure!(
        out.contains("WAIT_ERR PeerTimeout") || out.contains("WAIT_ERR Nccl"),
        "rank 0's wait did not return a typed error:\n{out}"
    );
    ensure!(
        t.elapsed() < Duration::from_secs(25),
        "rank 0 took {:?}: not bounded by its 5 s timeout",
        t.elapsed()
    );
    Ok(())
}

/// A rank of [`nccl_watchdog_killed_peer_mid_collective`].
fn child_peer() -> R {
    let env = LaunchEnv::from_env().ctx("from_env")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev(env.local_rank)?;
    let mut comm = RankComm::from_launch(&mut ctx, &d, &env).ctx("from_launch")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 1 << 20;
    let send = gpu.clone_htod(&vec![1.0f32; n]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("first all_reduce")?;
    comm.wait(&s).ctx("first wait")?;
    if env.rank == 1 {
        let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
        let f = module.function("spin_then_write").ctx("function")?;
        let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
        let ns: u64 = 30_000_000_000;
        spin(&s, &f, &flag, ns)?;
    }
    comm.all_reduce(&s, &send, &mut out, Op::Sum)
        .ctx("second all_reduce")?;
    println!("QUEUED");
    let t = Instant::now();
    let waited = comm.wait(&s);
    println!("WAIT_MS {}", t.elapsed().as_millis());
    match waited {
        Ok(()) => Ok(()),
        Err(e) => {
            println!("WAIT_ERR {e:?}");
            Err(format!("rank {}: {e}", env.rank))
        }
    }
}

/// A group whose step for call #1 fails after call #0 was handed to NCCL returns the
/// step's error within the child's `GPUBIND_DROP_TIMEOUT` (2 s, which bounds even the
/// abort path; NCCL's cancel makes it immediate), and nothing of it runs.
fn nccl_group_step_failure_never_hangs() -> R {
    nccl_present()?;
    let (ok, out) = finish(spawn_child("group_cancel"), Duration::from_secs(120))?;
    for l in out.lines() {
        println!("    {l}");
    }
    ensure!(ok, "child failed:\n{out}");
    ensure!(
        out.contains("GROUP_ERR InvalidArgument") && out.contains("call #1"),
        "the group did not return the step's typed error:\n{out}"
    );
    let group_ms = value(&out, "GROUP_MS ")?;
    ensure!(
        group_ms < 2 * 2000,
        "the failed group took {group_ms} ms: not bounded by GPUBIND_DROP_TIMEOUT (2 s)"
    );
    ensure!(
        !out.contains("ncclGroupEnd reported success"),
        "NCCL launched the cancelled group (the abort path ran):\n{out}"
    );
    ensure!(
        value(&out, "SYNC_MS ")? < 2 * 2000,
        "the lanes did not settle after the failed group"
    );
    ensure!(
        out.contains("AFTER ok"),
        "the communicator failed after:\n{out}"
    );
    if value(&out, "RANKS ")? >= 2 {
        ensure!(
            out.contains("RANK0_UNTOUCHED 1"),
            "rank 0's part ran although the group failed:\n{out}"
        );
    } else {
        println!(
            "    SKIPPED: the two-rank case (rank 1's step failing after rank 0's part was \
             handed to NCCL) needs 2 GPUs; ran world 1 (two calls of rank 0)"
        );
    }
    Ok(())
}

/// Child of [`nccl_group_step_failure_never_hangs`].
#[cfg(feature = "nccl")]
fn child_group_cancel() -> R {
    let _ = log::set_logger(&PrintWarnings);
    log::set_max_level(log::LevelFilter::Warn);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let ranks = Device::count().ctx("count")?.min(2);
    println!("RANKS {ranks}");
    let devices = (0..ranks).map(dev).collect::<Result<Vec<_>, _>>()?;
    let comm = Communicator::new(&mut ctx, &devices, CommOptions::nccl()).ctx("new")?;
    let n = 1 << 20;
    let (mut send, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
    for (r, d) in devices.iter().enumerate() {
        let gpu = ctx.bind(d).ctx("bind")?;
        send.push(gpu.clone_htod(&vec![(r + 1) as f32; n]).ctx("htod")?);
        first.push(gpu.alloc_zeros::<f32>(n).ctx("alloc")?);
        second.push(gpu.alloc_zeros::<f32>(n).ctx("alloc")?);
    }
    Communicator::fail_nccl_group_call_for_test(Some(1));
    let t = Instant::now();
    let failed = ctx.group(&comm, |g| {
        if ranks >= 2 {
            // Call #0: rank 0's part; call #1 (failing): rank 1's.
            for (r, (s, o)) in send.iter().zip(first.iter_mut()).enumerate() {
                g.all_reduce(r, s, o, Op::Sum)?;
            }
        } else {
            g.all_reduce(0, &send[0], &mut first[0], Op::Sum)?;
            g.all_reduce(0, &send[0], &mut second[0], Op::Sum)?;
        }
        Ok(())
    });
    println!("GROUP_MS {}", t.elapsed().as_millis());
    Communicator::fail_nccl_group_call_for_test(None);
    let Err(e) = failed else {
        return Err("the group succeeded although the seam failed call #1".into());
    };
    println!("GROUP_ERR {e:?}");
    // Were rank 0's part left waiting for rank 1's, this would never return (the
    // parent's limit ends the child).
    let t = Instant::now();
    comm.synchronize(&mut ctx)
        .ctx("synchronize after the failed group")?;
    println!("SYNC_MS {}", t.elapsed().as_millis());
    let untouched = ctx
        .bind(&devices[0])
        .ctx("bind")?
        .dtoh(&first[0])
        .ctx("dtoh")?
        .iter()
        .all(|&x| x == 0.0);
    println!("RANK0_UNTOUCHED {}", u8::from(untouched));
    ctx.group(&comm, |g| {
        for (r, (s, o)) in send.iter().zip(second.iter_mut()).enumerate() {
            g.all_reduce(r, s, o, Op::Sum)?;
        }
        Ok(())
    })
    .ctx("the group after")?;
    comm.synchronize(&mut ctx).ctx("synchronize")?;
    let want = (ranks * (ranks + 1) / 2) as f32;
    for (r, d) in devices.iter().enumerate() {
        let got = ctx.bind(d).ctx("bind")?.dtoh(&second[r]).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&x| x == want),
            "rank {r}: sum {} after the failed group, want {want}",
            got[0]
        );
    }
    println!("AFTER ok");
    Ok(())
}

fn main() {
    // SAFETY: single-threaded here (before any test or thread starts). NVLS stays off,
    // as in gpu_collective.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let child: Option<fn() -> R> = match child_role().as_deref() {
        Some("stuck") => Some(child_stuck),
        Some("healthy") => Some(child_healthy),
        Some("graph") => Some(child_graph),
        Some("peer") => Some(child_peer),
        #[cfg(feature = "nccl")]
        Some("group_cancel") => Some(child_group_cancel),
        _ => None,
    };
    if let Some(f) = child {
        match f() {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                println!("child error: {e}");
                std::process::exit(1)
            }
        }
    }
    run_suite(
        "gpu_nccl_watchdog",
        &[
            (
                "nccl_watchdog_aborts_a_stuck_collective",
                nccl_watchdog_aborts_a_stuck_collective,
            ),
            (
                "nccl_watchdog_aborts_a_stuck_graph_launch",
                nccl_watchdog_aborts_a_stuck_graph_launch,
            ),
            (
                "nccl_watchdog_leaves_healthy_work_alone",
                nccl_watchdog_leaves_healthy_work_alone,
            ),
            (
                "nccl_group_step_failure_never_hangs",
                nccl_group_step_failure_never_hangs,
            ),
            (
                "nccl_watchdog_killed_peer_mid_collective",
                nccl_watchdog_killed_peer_mid_collective,
            ),
        ],
    );
}
