//! GPU tests of the own-kernel backend with one rank per process on one machine
//! (`RankComm::init_process_kernels`), `harness = false`: 2–4 processes share GPU 0.
//!
//! * every op × dtype, bit-exact against a host computation (worlds 2 and 4; world 1 in
//!   this process), including calls larger than the staging buffer (several steps);
//! * ranks that disagree on the length or the type: the same typed error on every rank;
//!   a rank whose call is invalid (its own `SizeMismatch`): the others `PeerFailed`;
//! * a rank killed mid-collective: the others fail with the dead-peer error, naming it,
//!   well before the timeout; a stopped rank: the survivor fails at its timeout and its
//!   drop returns within 1 s after;
//! * a peer that calls late does not block another thread of a rank reading that rank's
//!   send buffer (no claim is held across the host wait);
//! * a call refused while the caller's stream is busy returns at once, and neither it
//!   nor the communicator's drop waits for the caller's kernel;
//! * dropping the communicators at the end is bounded (the bye handshake).
//!
//! Children are this binary re-run with `GPUBIND_CHILD=pk` and `GPUBIND_PK` set to
//! `scenario,rank,world,key,timeout_ms`; each prints one `PK-RESULT` line.

mod common;

use common::{Ctx, SPIN, child_role, run_suite};
use gpubind::collective::{CollectiveType, Op, RankComm};
use gpubind::{Device, DeviceSlice, Error, ThreadContext};
use half::{bf16, f16};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type R = Result<(), String>;
const RESULT: &str = "PK-RESULT ";

/// Rank `r`'s element `i`: small integers, exact in every dtype, sums and averages of
/// up to 4 ranks exact too; products stay ≤ 16.
fn value(r: usize, i: usize, prod: bool) -> f64 {
    if prod {
        (1 + (r + i) % 2) as f64
    } else {
        (1 + (r * 7 + i * 3) % 11) as f64
    }
}

fn host_reduce(op: Op, world: usize, i: usize) -> f64 {
    let prod = op == Op::Prod;
    let xs: Vec<f64> = (0..world).map(|r| value(r, i, prod)).collect();
    match op {
        Op::Sum => xs.iter().sum(),
        Op::Prod => xs.iter().product(),
        Op::Min => xs.iter().cloned().fold(f64::MAX, f64::min),
        Op::Max => xs.iter().cloned().fold(f64::MIN, f64::max),
        // Integers truncate; with these values and worlds of 1, 2, 4 floats are exact.
        Op::Avg => xs.iter().sum::<f64>() / world as f64,
    }
}

fn mine<T>(rank: usize, n: usize, prod: bool, from: fn(f64) -> T) -> Vec<T> {
    (0..n).map(|i| from(value(rank, i, prod))).collect()
}

/// Every op of this rank against the host, for one dtype and length.
fn ops<T>(ctx: &mut ThreadContext, comm: &mut RankComm, n: usize, from: fn(f64) -> T) -> R
where
    T: CollectiveType + Copy + PartialEq + std::fmt::Debug,
{
    let (rank, world) = (comm.rank(), comm.nranks());
    let d = Arc::clone(comm.device());
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let name = T::NAME;
    let trunc = |x: f64| -> f64 {
        if name.starts_with('f') || name == "bf16" {
            x
        } else {
            x.trunc()
        }
    };
    for op in [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg] {
        let send: DeviceSlice<T> = gpu
            .clone_htod(&mine(rank, n, op == Op::Prod, from))
            .ctx("htod")?;
        let mut out: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        comm.all_reduce(&s, &send, &mut out, op)
            .map_err(|e| format!("all_reduce: {e:?}"))?;
        s.synchronize().ctx("sync")?;
        let want: Vec<T> = (0..n)
            .map(|i| from(trunc(host_reduce(op, world, i))))
            .collect();
        let got = gpu.dtoh(&out).ctx("dtoh")?;
        if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
            return Err(format!(
                "all_reduce {op:?} {name} n={n}: [{i}] {:?} != {:?}",
                got[i], want[i]
            ));
        }
    }
    let send: DeviceSlice<T> = gpu.clone_htod(&mine(rank, n, false, from)).ctx("htod")?;
    // reduce(Sum) to the last rank.
    let root = world - 1;
    let mut red: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
    comm.reduce(&s, &send, &mut red, Op::Sum, root)
        .map_err(|e| format!("reduce: {e:?}"))?;
    // broadcast from rank 1 % world.
    let broot = 1 % world;
    let mut bc: DeviceSlice<T> = gpu.clone_htod(&mine(rank, n, false, from)).ctx("htod")?;
    comm.broadcast(&s, &mut bc, broot)
        .map_err(|e| format!("broadcast: {e:?}"))?;
    let mut gat: DeviceSlice<T> = gpu.alloc_zeros(n * world).ctx("alloc")?;
    comm.all_gather(&s, &send, &mut gat)
        .map_err(|e| format!("all_gather: {e:?}"))?;
    // reduce_scatter(Max) over n * world inputs: element j of block b is value(r, b*n+j).
    let big: DeviceSlice<T> = gpu
        .clone_htod(&mine(rank, n * world, false, from))
        .ctx("htod")?;
    let mut sca: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
    comm.reduce_scatter(&s, &big, &mut sca, Op::Max)
        .map_err(|e| format!("reduce_scatter: {e:?}"))?;
    s.synchronize().ctx("sync")?;
    let red_want: Vec<T> = if rank == root {
        (0..n)
            .map(|i| from(host_reduce(Op::Sum, world, i)))
            .collect()
    } else {
        vec![from(0.0); n]
    };
    ensure!(
        gpu.dtoh(&red).ctx("dtoh")? == red_want,
        "reduce {name} n={n}"
    );
    ensure!(
        gpu.dtoh(&bc).ctx("dtoh")? == mine(broot, n, false, from),
        "broadcast {name} n={n}"
    );
    let gat_want: Vec<T> = (0..world).flat_map(|q| mine(q, n, false, from)).collect();
    ensure!(
        gpu.dtoh(&gat).ctx("dtoh")? == gat_want,
        "all_gather {name} n={n}"
    );
    let sca_want: Vec<T> = (0..n)
        .map(|j| from(host_reduce(Op::Max, world, rank * n + j)))
        .collect();
    ensure!(
        gpu.dtoh(&sca).ctx("dtoh")? == sca_want,
        "reduce_scatter {name} n={n}"
    );
    // send/recv in pairs (2k, 2k+1): even sends then receives, odd the reverse.
    if world >= 2 && !(world % 2 == 1 && rank == world - 1) {
        let peer = rank ^ 1;
        let mut got: DeviceSlice<T> = gpu.alloc_zeros(n).ctx("alloc")?;
        if rank % 2 == 0 {
            comm.send(&s, &send, peer)
                .map_err(|e| format!("send: {e:?}"))?;
            comm.recv(&s, &mut got, peer)
                .map_err(|e| format!("recv: {e:?}"))?;
        } else {
            comm.recv(&s, &mut got, peer)
                .map_err(|e| format!("recv: {e:?}"))?;
            comm.send(&s, &send, peer)
                .map_err(|e| format!("send: {e:?}"))?;
        }
        s.synchronize().ctx("sync")?;
        ensure!(
            gpu.dtoh(&got).ctx("dtoh")? == mine(peer, n, false, from),
            "send/recv {name} n={n}"
        );
    }
    Ok(())
}

fn all_dtypes(ctx: &mut ThreadContext, comm: &mut RankComm, n: usize) -> R {
    ops::<f32>(ctx, comm, n, |x| x as f32)?;
    ops::<f64>(ctx, comm, n, |x| x)?;
    ops::<f16>(ctx, comm, n, f16::from_f64)?;
    ops::<bf16>(ctx, comm, n, bf16::from_f64)?;
    ops::<i32>(ctx, comm, n, |x| x as i32)?;
    ops::<i64>(ctx, comm, n, |x| x as i64)?;
    ops::<u8>(ctx, comm, n, |x| x as u8)
}

/// One all_reduce(Sum) of f32 larger than the staging buffer (several steps).
fn big_all_reduce(ctx: &mut ThreadContext, comm: &mut RankComm) -> R {
    let (rank, world) = (comm.rank(), comm.nranks());
    let n = gpubind::collective::PROCESS_STAGING_BYTES / 4 * 2 + 12_345;
    let d = Arc::clone(comm.device());
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let send = gpu
        .clone_htod(&mine(rank, n, false, |x| x as f32))
        .ctx("htod")?;
    let mut out: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
    for _ in 0..3 {
        comm.all_reduce(&s, &send, &mut out, Op::Sum)
            .map_err(|e| format!("big all_reduce: {e:?}"))?;
    }
    s.synchronize().ctx("sync")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    let bad = (0..n).find(|&i| got[i] != host_reduce(Op::Sum, world, i) as f32);
    ensure!(bad.is_none(), "big all_reduce differs at {bad:?}");
    Ok(())
}

fn spec() -> (String, usize, usize, String, Duration) {
    let v = std::env::var("GPUBIND_PK").expect("GPUBIND_PK");
    let f: Vec<&str> = v.split(',').collect();
    (
        f[0].to_owned(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].to_owned(),
        Duration::from_millis(f[4].parse().unwrap()),
    )
}

/// A child rank: runs its scenario and prints the result line.
fn child() -> Result<String, String> {
    let (scenario, rank, world, key, timeout) = spec();
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = Device::get(0).ctx("Device::get")?;
    let mut comm = RankComm::init_process_kernels(&mut ctx, &d, rank, world, &key, timeout)
        .map_err(|e| format!("init: {e:?}"))?;
    match scenario.as_str() {
        "all" => {
            all_dtypes(&mut ctx, &mut comm, 1003)?;
            all_dtypes(&mut ctx, &mut comm, 1)?;
            big_all_reduce(&mut ctx, &mut comm)?;
            let t = Instant::now();
            drop(comm);
            // Every rank drops at about the same time: the byes take far less than
            // the timeout.
            ensure!(
                t.elapsed() < timeout / 4,
                "drop took {:?} (timeout {timeout:?})",
                t.elapsed()
            );
            Ok("ok".into())
        }
        "length" | "dtype" => {
            let gpu = ctx.bind(&d).ctx("bind")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let n = if scenario == "length" && rank == 1 {
                999
            } else {
                1000
            };
            let t = Instant::now();
            let r = if scenario == "dtype" && rank == 2 {
                let a: DeviceSlice<i32> = gpu.alloc_zeros(n).ctx("alloc")?;
                let mut b: DeviceSlice<i32> = gpu.alloc_zeros(n).ctx("alloc")?;
                comm.all_reduce(&s, &a, &mut b, Op::Sum)
            } else {
                let a: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
                let mut b: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
                comm.all_reduce(&s, &a, &mut b, Op::Sum)
            };
            let call_ms = t.elapsed().as_millis();
            Ok(format!("{:?} call_ms={call_ms}", r.err()))
        }
        // Equal byte sizes (rank 1: 512 f64, the others 1024 f32), or the same two
        // calls in another order (rank 2): the mismatch comes within a second, before
        // anything is staged (the receive buffers keep their fill).
        "bytes" | "order" => {
            let gpu = ctx.bind(&d).ctx("bind")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let a = gpu.clone_htod(&vec![1.0f32; 1024]).ctx("htod")?;
            let mut b = gpu.clone_htod(&vec![7.0f32; 1024]).ctx("htod")?;
            let t = Instant::now();
            let r = match (scenario.as_str(), rank) {
                ("bytes", 1) => {
                    let a = gpu.clone_htod(&vec![1.0f64; 512]).ctx("htod")?;
                    let mut b = gpu.clone_htod(&vec![7.0f64; 512]).ctx("htod")?;
                    comm.all_reduce(&s, &a, &mut b, Op::Sum)
                }
                ("order", 2) => comm
                    .broadcast(&s, &mut b, 0)
                    .and_then(|()| comm.all_reduce(&s, &a, &mut b, Op::Sum)),
                ("order", _) => comm
                    .all_reduce(&s, &a, &mut b, Op::Sum)
                    .and_then(|()| comm.broadcast(&s, &mut b, 0)),
                _ => comm.all_reduce(&s, &a, &mut b, Op::Sum),
            };
            let took = t.elapsed();
            ensure!(took < Duration::from_secs(1), "took {took:?}: {r:?}");
            let host = gpu.dtoh(&b).ctx("dtoh")?;
            ensure!(host.iter().all(|&x| x == 7.0), "receive buffer written");
            Ok(format!("{:?} call_ms={}", r.err(), took.as_millis()))
        }
        // Rank 1 imports rank 0's receive buffer (a pool buffer sent over a socket of the
        // test's own) and passes it as its receive buffer: every rank refuses the call.
        "alias" => {
            use gpubind::ipc::{self, ImportedPool, MemoryPool, PoolConfig};
            use std::os::unix::net::{UnixListener, UnixStream};
            let gpu = ctx.bind(&d).ctx("bind")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let path = std::env::temp_dir().join(format!("gpubind-pk-alias-{key}.sock"));
            let a = gpu.clone_htod(&vec![1.0f32; 1024]).ctx("htod")?;
            let r = match rank {
                0 => {
                    let _ = std::fs::remove_file(&path);
                    let listener = UnixListener::bind(&path).ctx("bind socket")?;
                    let pool =
                        MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
                    let mut b = pool.alloc_zeros::<f32>(&s, 1024).ctx("alloc")?;
                    let (conn, _) = listener.accept().ctx("accept")?;
                    let _ = std::fs::remove_file(&path);
                    ipc::send_handles(
                        &conn,
                        &[pool.export().ctx("export")?],
                        &[b.export().ctx("export")?],
                    )
                    .ctx("send_handles")?;
                    let r = comm.all_reduce(&s, &a, &mut b, Op::Sum);
                    // Keep the buffer until rank 1 dropped its import.
                    let _ = ipc::recv_message_timeout(&conn, Duration::from_secs(60));
                    r
                }
                1 => {
                    let t = Instant::now();
                    let conn = loop {
                        match UnixStream::connect(&path) {
                            Ok(c) => break c,
                            Err(_) if t.elapsed() < Duration::from_secs(60) => {
                                std::thread::sleep(Duration::from_millis(10))
                            }
                            Err(e) => return Err(format!("connect: {e}")),
                        }
                    };
                    let (mut pools, buffers) = ipc::recv_handles(&conn).ctx("recv_handles")?;
                    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
                    let mut b = pool.import_buffer::<f32>(&buffers[0]).ctx("import")?;
                    let r = comm.all_reduce(&s, &a, &mut b, Op::Sum);
                    drop((b, pool));
                    ipc::send_message(&conn, b"dropped", &[]).ctx("send")?;
                    r
                }
                _ => {
                    let mut b: DeviceSlice<f32> = gpu.alloc_zeros(1024).ctx("alloc")?;
                    comm.all_reduce(&s, &a, &mut b, Op::Sum)
                }
            };
            Ok(format!("{:?}", r.err()))
        }
        // Rank 1 makes a call it cannot make (recv shorter than send): its own
        // SizeMismatch; the others learn of it.
        "local" => {
            let gpu = ctx.bind(&d).ctx("bind")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let a: DeviceSlice<f32> = gpu.alloc_zeros(1000).ctx("alloc")?;
            let mut b: DeviceSlice<f32> = gpu
                .alloc_zeros(if rank == 1 { 10 } else { 1000 })
                .ctx("alloc")?;
            let t = Instant::now();
            let r = comm.all_reduce(&s, &a, &mut b, Op::Sum);
            let call_ms = t.elapsed().as_millis();
            Ok(format!("{:?} call_ms={call_ms}", r.err()))
        }
        "killed" => {
            let gpu = ctx.bind(&d).ctx("bind")?;
            let stream = gpu.new_stream().ctx("stream")?;
            let s = gpu.on(&stream).ctx("on")?;
            let n = 1 << 20;
            let a = gpu.clone_htod(&vec![1.0f32; n]).ctx("htod")?;
            let mut b: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
            for i in 0..1_000_000 {
                if let Err(e) = comm.all_reduce(&s, &a, &mut b, Op::Sum) {
                    return Ok(format!("{:?}", Some(e)));
                }
                if i == 10 {
                    println!("{RESULT}looping");
                    use std::io::Write;
                    std::io::stdout().flush().unwrap();
                }
            }
            Ok("never failed".into())
        }
        "late" => late_peer(&mut ctx, &d, &mut comm, rank),
        "stopped" => stopped_peer(&mut ctx, &d, comm, rank),
        "busy" => busy_stream(&mut ctx, &d, comm, rank, timeout.as_millis() as u64),
        other => Err(format!("unknown scenario {other}")),
    }
}

/// Rank 1 calls `LATE_MS` late. Meanwhile another thread of rank 0 reads rank 0's send
/// buffer: it must not wait for the late peer (the call holds no claim of its buffers
/// across its host wait).
fn late_peer(
    ctx: &mut ThreadContext,
    d: &Arc<Device>,
    comm: &mut RankComm,
    rank: usize,
) -> Result<String, String> {
    let gpu = ctx.bind(d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let n = 1 << 16;
    let a = gpu.clone_htod(&vec![1.0f32; n]).ctx("htod")?;
    let mut b: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
    if rank == 1 {
        std::thread::sleep(Duration::from_millis(LATE_MS));
        comm.all_reduce(&s, &a, &mut b, Op::Sum).ctx("all_reduce")?;
        return Ok("ok".into());
    }
    let (call, read) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| -> Result<(u128, usize), String> {
            // Let the call begin its wait for rank 1 first.
            std::thread::sleep(Duration::from_millis(LATE_MS / 5));
            let mut ctx = ThreadContext::acquire().ctx("acquire")?;
            let gpu = ctx.bind(d).ctx("bind")?;
            let t = Instant::now();
            let host = gpu.dtoh(&a).ctx("dtoh")?;
            let ones = host.iter().filter(|&&x| x == 1.0).count();
            Ok((t.elapsed().as_millis(), ones))
        });
        let t = Instant::now();
        let r = comm.all_reduce(&s, &a, &mut b, Op::Sum);
        (r.map(|()| t.elapsed().as_millis()), reader.join())
    });
    let call_ms = call.ctx("all_reduce")?;
    let (read_ms, ones) = read.map_err(|_| "the reader panicked".to_string())??;
    ensure!(ones == n, "the reader saw {ones} of {n} ones");
    let out = gpu.dtoh(&b).ctx("dtoh")?;
    ensure!(out.iter().all(|&x| x == 2.0), "wrong sums");
    Ok(format!("ok call_ms={call_ms} read_ms={read_ms}"))
}

/// Rank 1 loops until the parent stops it (SIGSTOP); rank 0's call then fails by its
/// timeout, and its drop waits for nothing the verdict condemned.
fn stopped_peer(
    ctx: &mut ThreadContext,
    d: &Arc<Device>,
    mut comm: RankComm,
    rank: usize,
) -> Result<String, String> {
    let gpu = ctx.bind(d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let a = gpu.clone_htod(&vec![1.0f32; 1024]).ctx("htod")?;
    let mut b: DeviceSlice<f32> = gpu.alloc_zeros(1024).ctx("alloc")?;
    for i in 0..u64::MAX {
        let t = Instant::now();
        if let Err(e) = comm.all_reduce(&s, &a, &mut b, Op::Sum) {
            let call_ms = t.elapsed().as_millis();
            let t = Instant::now();
            drop(comm);
            let drop_ms = t.elapsed().as_millis();
            return Ok(format!("{:?} call_ms={call_ms} drop_ms={drop_ms}", Some(e)));
        }
        if i == 10 && rank == 1 {
            println!("{RESULT}looping");
            use std::io::Write;
            std::io::stdout().flush().unwrap();
        }
    }
    Ok("never failed".into())
}

/// Rank 0's stream is busy with a kernel spinning for [`BUSY_SPINS`] timeouts when its
/// call is refused (rank 1 calls another length): the call returns at once, not after
/// the kernel; the drop does not wait for the kernel either. Rank 0 reports whether the
/// kernel was still running when its drop returned (else the timing proves nothing).
fn busy_stream(
    ctx: &mut ThreadContext,
    d: &Arc<Device>,
    mut comm: RankComm,
    rank: usize,
    timeout_ms: u64,
) -> Result<String, String> {
    let gpu = ctx.bind(d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let flag = gpu.alloc_zeros::<u32>(1).ctx("alloc")?;
    let after_spin = gpu.new_event(false).ctx("event")?;
    if rank == 0 {
        let ns: u64 = BUSY_SPINS * timeout_ms * 1_000_000;
        // SAFETY: (unsigned*, unsigned long long) as the kernel declares; it
        // writes one u32 into `flag`, which holds one.
        unsafe {
            s.launch(&f, gpubind::LaunchConfig::for_num_elems(1))
                .arg_written(&flag)
                .arg(&ns)
                .launch()
        }
        .ctx("launch spin")?;
    }
    s.record(&after_spin).ctx("record")?;
    let n = if rank == 1 { 999 } else { 1000 };
    let a: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
    let mut b: DeviceSlice<f32> = gpu.alloc_zeros(n).ctx("alloc")?;
    let t = Instant::now();
    let r = comm.all_reduce(&s, &a, &mut b, Op::Sum);
    let call_ms = t.elapsed().as_millis();
    let t = Instant::now();
    drop(comm);
    let drop_ms = t.elapsed().as_millis();
    let spinning = !after_spin.is_complete().ctx("query")?;
    Ok(format!(
        "{:?} call_ms={call_ms} drop_ms={drop_ms} spinning_after_drop={spinning}",
        r.err()
    ))
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn spawn(scenario: &str, rank: usize, world: usize, key: &str, timeout_ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("GPUBIND_CHILD", "pk")
        .env(
            "GPUBIND_PK",
            format!("{scenario},{rank},{world},{key},{timeout_ms}"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn")
}

fn result(mut child: Child, limit: Duration) -> Result<String, String> {
    let t = Instant::now();
    while child.try_wait().ctx("try_wait")?.is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("a rank process hung past {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().ctx("wait")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(text
        .lines()
        .filter_map(|l| l.find(RESULT).map(|i| l[i + RESULT.len()..].to_owned()))
        .next_back()
        .unwrap_or_else(|| format!("no result: {text}")))
}

fn job(scenario: &str, world: usize, timeout_ms: u64) -> Result<Vec<String>, String> {
    let key = format!(
        "gpu-pk-{scenario}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let children: Vec<Child> = (0..world)
        .map(|r| spawn(scenario, r, world, &key, timeout_ms))
        .collect();
    children
        .into_iter()
        .map(|c| result(c, Duration::from_secs(170)))
        .collect()
}

fn every_op_and_dtype_world_1() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = Device::get(0).ctx("Device::get")?;
    let key = format!("gpu-pk-one-{}", std::process::id());
    let mut comm =
        RankComm::init_process_kernels(&mut ctx, &d, 0, 1, &key, Duration::from_secs(30))
            .map_err(|e| format!("{e:?}"))?;
    all_dtypes(&mut ctx, &mut comm, 1003)
}

fn every_op_and_dtype_2_processes() -> R {
    let out = job("all", 2, 60_000)?;
    ensure!(out.iter().all(|o| o == "ok"), "{out:?}");
    Ok(())
}

fn every_op_and_dtype_4_processes() -> R {
    let out = job("all", 4, 60_000)?;
    ensure!(out.iter().all(|o| o == "ok"), "{out:?}");
    Ok(())
}

/// Splits the ` call_ms=N` a rank appends to its result off: the result, and the
/// longest call of all ranks (measured in the ranks, so process start-up does not
/// count).
fn split_call_ms(out: Vec<String>) -> Result<(Vec<String>, u128), String> {
    let mut longest = 0;
    let mut results = Vec::new();
    for o in out {
        longest = longest.max(ms_of(&o, "call_ms")?);
        results.push(o.split(" call_ms=").next().unwrap_or_default().to_owned());
    }
    Ok((results, longest))
}

fn mismatch_is_typed_on_every_rank(scenario: &str, needle: &str) -> R {
    const TIMEOUT_MS: u64 = 30_000;
    let (out, call) = split_call_ms(job(scenario, 3, TIMEOUT_MS)?)?;
    println!("    the longest failing call took {call} ms (timeout {TIMEOUT_MS} ms)");
    for o in &out {
        ensure!(
            o.starts_with("Some(InvalidArgument(\"collective mismatch") && o.contains(needle),
            "{out:?}"
        );
    }
    ensure!(
        out.iter().all(|o| o == &out[0]),
        "not the same error everywhere: {out:?}"
    );
    ensure!(
        call < u128::from(TIMEOUT_MS / 4),
        "a call took {call} ms: a mismatch is seen long before the timeout"
    );
    Ok(())
}

fn length_mismatch_is_typed_on_every_rank() -> R {
    mismatch_is_typed_on_every_rank("length", "rank 1 called all_reduce(Sum) of 999 f32")
}

fn dtype_mismatch_is_typed_on_every_rank() -> R {
    mismatch_is_typed_on_every_rank("dtype", "i32")
}

fn equal_byte_size_mismatch_is_typed_at_once() -> R {
    mismatch_is_typed_on_every_rank("bytes", "rank 1 called all_reduce(Sum) of 512 f64")
}

fn another_call_order_is_typed_at_once() -> R {
    mismatch_is_typed_on_every_rank("order", "rank 2 called broadcast(root 0)")
}

fn a_buffer_shared_by_two_ranks_is_refused_on_every_rank() -> R {
    let out = job("alias", 3, 30_000)?;
    for o in &out {
        ensure!(
            o.starts_with(
                "Some(InvalidArgument(\"collective aliasing: rank 0's receive buffer and rank 1's receive buffer"
            ),
            "{out:?}"
        );
    }
    ensure!(out.iter().all(|o| o == &out[0]), "{out:?}");
    Ok(())
}

fn a_rank_with_a_bad_call_fails_the_others_at_once() -> R {
    const TIMEOUT_MS: u64 = 30_000;
    let (out, call) = split_call_ms(job("local", 3, TIMEOUT_MS)?)?;
    println!("    the longest failing call took {call} ms (timeout {TIMEOUT_MS} ms)");
    ensure!(out[1].starts_with("Some(SizeMismatch"), "{out:?}");
    for o in [&out[0], &out[2]] {
        ensure!(o.starts_with("Some(PeerFailed { rank: 1"), "{out:?}");
    }
    ensure!(
        call < u128::from(TIMEOUT_MS / 4),
        "a call took {call} ms: the others learn of rank 1's failure at once"
    );
    Ok(())
}

/// The `ms` after `name=` in a result line.
fn ms_of(line: &str, name: &str) -> Result<u128, String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {name} in {line:?}"))
}

/// How long rank 0's kernel spins in the "busy" scenario, in timeouts.
const BUSY_SPINS: u64 = 3;

/// A call refused while the caller's stream is busy (rank 0 queued a kernel spinning
/// for three timeouts before it; rank 1 calls another length): both ranks get the
/// mismatch at once — the call is refused at its agreement, before anything is staged,
/// so there is nothing of it to wait for — and neither drop waits for the kernel (the
/// verdict leaves the drops a 250 ms grace each for own work and byes; the reduce
/// kernels' module is the device's, not unloaded by the drop).
fn a_refused_call_on_a_busy_stream_returns_at_once() -> R {
    const TIMEOUT_MS: u64 = 5_000;
    let out = job("busy", 2, TIMEOUT_MS)?;
    for o in &out {
        ensure!(
            o.starts_with("Some(InvalidArgument(\"collective mismatch"),
            "{out:?}"
        );
    }
    let (call0, drop0) = (ms_of(&out[0], "call_ms")?, ms_of(&out[0], "drop_ms")?);
    let (call1, drop1) = (ms_of(&out[1], "call_ms")?, ms_of(&out[1], "drop_ms")?);
    let spinning = out[0].contains("spinning_after_drop=true");
    let spin_ms = BUSY_SPINS * TIMEOUT_MS;
    println!(
        "    rank 0: call {call0} ms, drop {drop0} ms (its {spin_ms} ms kernel still running \
         after the drop: {spinning}); rank 1: call {call1} ms, drop {drop1} ms (timeout \
         {TIMEOUT_MS} ms)"
    );
    let at_once = u128::from(TIMEOUT_MS / 4);
    ensure!(
        call0 < at_once && call1 < at_once,
        "the refused calls took {call0} / {call1} ms: expected at once (under {at_once} ms, \
         not at the {TIMEOUT_MS} ms deadline, not after the {spin_ms} ms kernel)"
    );
    // Well under the kernel's end: a drop that waited for it would take over 2 timeouts.
    ensure!(
        drop0 < u128::from(TIMEOUT_MS) && drop1 < u128::from(TIMEOUT_MS),
        "drops took {drop0} / {drop1} ms: a drop after a verdict waits for no user kernel \
         (timeout {TIMEOUT_MS} ms, kernel {spin_ms} ms)"
    );
    ensure!(
        spinning,
        "rank 0's kernel had ended when its drop returned ({out:?}): the test measured nothing"
    );
    Ok(())
}

fn killed_rank_fails_the_others_typed() -> R {
    use std::io::{BufRead, BufReader};
    let key = format!("gpu-pk-killed-{}", std::process::id());
    let timeout_ms = 20_000;
    let mut kids: Vec<Child> = (0..3)
        .map(|r| spawn("killed", r, 3, &key, timeout_ms))
        .collect();
    let mut lines = BufReader::new(kids[2].stdout.take().unwrap()).lines();
    loop {
        let l = lines
            .next()
            .ok_or("rank 2 ended before looping")?
            .ctx("read")?;
        if l.contains("PK-RESULT looping") {
            break;
        }
    }
    let t = Instant::now();
    kids[2].kill().ctx("kill")?;
    let _ = kids[2].wait();
    let out: Vec<String> = kids
        .drain(..2)
        .map(|c| result(c, Duration::from_secs(60)))
        .collect::<Result<_, _>>()?;
    let took = t.elapsed();
    println!("    the survivors returned {took:?} after the kill (timeout {timeout_ms} ms)");
    for o in &out {
        // The closed sockets are seen at once: the dead-peer error, not a timeout.
        ensure!(o.starts_with("Some(PeerFailed { rank: 2"), "{out:?}");
    }
    ensure!(
        took < Duration::from_millis(timeout_ms / 4),
        "the others took {took:?}: a dead rank must be seen well before the timeout"
    );
    Ok(())
}

/// How late rank 1 calls in the "late" scenario.
const LATE_MS: u64 = 2_000;

/// Rank 1 calls 2 s late; a second thread of rank 0 reads rank 0's send buffer while
/// rank 0's call waits for rank 1: the read returns long before rank 1 arrives.
fn a_late_peer_does_not_block_a_reader_of_the_send_buffer() -> R {
    let out = job("late", 2, 30_000)?;
    ensure!(out[1] == "ok", "{out:?}");
    ensure!(out[0].starts_with("ok "), "{out:?}");
    let (call, read) = (ms_of(&out[0], "call_ms")?, ms_of(&out[0], "read_ms")?);
    println!(
        "    rank 0: call {call} ms, the other thread's read {read} ms (peer {LATE_MS} ms late)"
    );
    ensure!(
        call >= u128::from(LATE_MS) / 2,
        "rank 0's call took {call} ms: rank 1 was not late"
    );
    ensure!(
        read < u128::from(LATE_MS) / 4,
        "the read took {read} ms: it waited for the late peer"
    );
    Ok(())
}

/// Rank 1 is stopped (SIGSTOP) mid-loop: rank 0's call fails at about its timeout
/// (5 s), and its drop returns within 1 s after (it does not wait a second timeout for
/// the stopped rank's bye; its staging is leaked instead).
fn a_stopped_rank_costs_the_survivor_one_timeout() -> R {
    use std::io::{BufRead, BufReader};
    let key = format!("gpu-pk-stopped-{}", std::process::id());
    let timeout_ms: u64 = 5_000;
    let mut kids: Vec<Child> = (0..2)
        .map(|r| spawn("stopped", r, 2, &key, timeout_ms))
        .collect();
    let mut lines = BufReader::new(kids[1].stdout.take().unwrap()).lines();
    loop {
        let l = lines
            .next()
            .ok_or("rank 1 ended before looping")?
            .ctx("read")?;
        if l.contains("PK-RESULT looping") {
            break;
        }
    }
    let pid = kids[1].id() as i32;
    // SAFETY: plain kill(2) on our own child, which has not been waited for.
    ensure!(
        unsafe { libc::kill(pid, libc::SIGSTOP) } == 0,
        "SIGSTOP failed"
    );
    let out0 = result(kids.remove(0), Duration::from_secs(60));
    let _ = kids[0].kill(); // SIGKILL ends a stopped process too
    let _ = kids[0].wait();
    let out0 = out0?;
    let (call, dropped) = (ms_of(&out0, "call_ms")?, ms_of(&out0, "drop_ms")?);
    println!("    rank 0: call failed after {call} ms, drop took {dropped} ms");
    ensure!(
        out0.starts_with("Some(PeerTimeout") && out0.contains("ranks: [1"),
        "{out0}"
    );
    ensure!(
        u128::from(timeout_ms) * 9 / 10 <= call && call < u128::from(timeout_ms) * 3,
        "the call failed after {call} ms (timeout {timeout_ms} ms)"
    );
    ensure!(
        dropped < 1_000,
        "the drop took {dropped} ms after the verdict"
    );
    Ok(())
}

fn main() {
    if child_role().as_deref() == Some("pk") {
        match child() {
            Ok(line) => {
                println!("{RESULT}{line}");
                std::process::exit(0)
            }
            Err(e) => {
                println!("{RESULT}child error: {e}");
                std::process::exit(1)
            }
        }
    }
    let _ = Error::PeerGone; // the error type is part of the assertions' text
    run_suite(
        "gpu_multiprocess_kernels",
        &[
            ("every_op_and_dtype_world_1", every_op_and_dtype_world_1),
            (
                "every_op_and_dtype_2_processes",
                every_op_and_dtype_2_processes,
            ),
            (
                "every_op_and_dtype_4_processes",
                every_op_and_dtype_4_processes,
            ),
            (
                "length_mismatch_is_typed_on_every_rank",
                length_mismatch_is_typed_on_every_rank,
            ),
            (
                "dtype_mismatch_is_typed_on_every_rank",
                dtype_mismatch_is_typed_on_every_rank,
            ),
            (
                "equal_byte_size_mismatch_is_typed_at_once",
                equal_byte_size_mismatch_is_typed_at_once,
            ),
            (
                "another_call_order_is_typed_at_once",
                another_call_order_is_typed_at_once,
            ),
            (
                "a_buffer_shared_by_two_ranks_is_refused_on_every_rank",
                a_buffer_shared_by_two_ranks_is_refused_on_every_rank,
            ),
            (
                "a_rank_with_a_bad_call_fails_the_others_at_once",
                a_rank_with_a_bad_call_fails_the_others_at_once,
            ),
            (
                "killed_rank_fails_the_others_typed",
                killed_rank_fails_the_others_typed,
            ),
            (
                "a_refused_call_on_a_busy_stream_returns_at_once",
                a_refused_call_on_a_busy_stream_returns_at_once,
            ),
            (
                "a_late_peer_does_not_block_a_reader_of_the_send_buffer",
                a_late_peer_does_not_block_a_reader_of_the_send_buffer,
            ),
            (
                "a_stopped_rank_costs_the_survivor_one_timeout",
                a_stopped_rank_costs_the_survivor_one_timeout,
            ),
        ],
    );
}
