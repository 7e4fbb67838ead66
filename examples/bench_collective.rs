//! Collective bandwidth, gpubind's own kernels against NCCL, like nccl-tests.
//!
//! ```text
//! cargo run --release --example bench_collective -- [--max-bytes B] [--reps N] [--warmup N]
//! ```
//!
//! For every size (8 B to 1 GiB in powers of 8) it reports the median time of `--reps`
//! events-timed repetitions after `--warmup` untimed ones, the algorithm bandwidth
//! `algbw = bytes / time` and the bus bandwidth `busbw = algbw × factor` (all_reduce
//! `2(n-1)/n`, all_gather and reduce_scatter `(n-1)/n`, broadcast and reduce 1; `bytes` is
//! the per-rank buffer for all_reduce/broadcast/reduce and the large, `n`-block buffer for
//! all_gather/reduce_scatter, as nccl-tests counts them). See docs/collective.md.
//!
//! Tables:
//! 1. One GPU: a `cuMemcpyDtoDAsync` of the same bytes (the copy ceiling), the N=1
//!    all_reduce of both backends, and the own in-device reduction of 2 ranks on one GPU
//!    (reads 2 buffers and writes 2: 4 × bytes of memory traffic, against the copy's
//!    2 × bytes) as a percentage of the copy's memory bandwidth (goal: ≥ 80 %).
//! 2. N = 1, every op, own vs NCCL (ratio of algbw).
//! 3. N = all devices (when more than one), every op, own vs NCCL (ratio of busbw).
//! 4. Own kernels, N = 2 and 4 ranks on GPU 0: in one process (a `Communicator` of N
//!    ranks on one device, events-timed) against N processes
//!    (`RankComm::init_process_kernels`, this binary re-run N times; rank 0's host time
//!    of call + synchronize, median). `--max-bytes` and `--reps` apply; sizes up to
//!    64 MiB at most.
//! 5. The agreement of NCCL ranks on every collective across processes, on loopback
//!    (no GPU needed; `--call-check-only` runs only this table). It drives gpubind's
//!    `test-seams` feature: `cargo run --release --features test-seams --example
//!    bench_collective`; without it the table is skipped.

use gpubind::collective::{CommOptions, Communicator, Op, RankComm, nccl_available};
use gpubind::{Device, DeviceSlice, Stream, ThreadContext};
use std::sync::Arc;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchOp {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
}

const OPS: [BenchOp; 5] = [
    BenchOp::AllReduce,
    BenchOp::Broadcast,
    BenchOp::Reduce,
    BenchOp::AllGather,
    BenchOp::ReduceScatter,
];

impl BenchOp {
    fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce => 1.0,
        }
    }

    /// `(send, recv)` f32 elements per rank for `bytes`, or None if it rounds to 0.
    fn counts(self, bytes: usize, n: usize) -> Option<(usize, usize)> {
        let elems = bytes / 4;
        let c = match self {
            BenchOp::AllGather | BenchOp::ReduceScatter => elems / n,
            _ => elems,
        };
        if c == 0 {
            return None;
        }
        Some(match self {
            BenchOp::AllGather => (c, c * n),
            BenchOp::ReduceScatter => (c * n, c),
            _ => (c, c),
        })
    }

    /// The bytes algbw counts.
    fn bytes(self, send: usize, recv: usize) -> usize {
        4 * send.max(recv)
    }
}

struct Args {
    max_bytes: usize,
    reps: usize,
    warmup: usize,
    /// Only table 5 (needs no GPU).
    call_check_only: bool,
}

fn args() -> Res<Args> {
    let mut a = Args {
        max_bytes: 1 << 30,
        reps: 20,
        warmup: 3,
        call_check_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> Res<usize> {
            Ok(it
                .next()
                .ok_or_else(|| format!("{flag} needs a value"))?
                .parse()?)
        };
        match flag.as_str() {
            "--max-bytes" => a.max_bytes = value()?,
            "--reps" => a.reps = value()?.max(1),
            "--warmup" => a.warmup = value()?,
            "--call-check-only" => a.call_check_only = true,
            "-h" | "--help" => {
                println!(
                    "bench_collective [--max-bytes B] [--reps N] [--warmup N] [--call-check-only]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(a)
}

fn sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 8usize;
    while b <= max {
        v.push(b);
        b *= 8;
    }
    v
}

/// Median seconds of one call of `f`, timed by events recorded on every stream in
/// `streams` (the slowest stream counts).
fn time(
    ctx: &mut ThreadContext,
    streams: &[(Arc<Device>, &Stream)],
    reps: usize,
    warmup: usize,
    f: &mut dyn FnMut(&mut ThreadContext) -> gpubind::Result<()>,
) -> Res<f64> {
    let mut events = Vec::new();
    for (dev, _) in streams {
        let gpu = ctx.bind(dev)?;
        let mut per = Vec::new();
        for _ in 0..reps {
            per.push((gpu.new_event(true)?, gpu.new_event(true)?));
        }
        events.push(per);
    }
    let sync = |ctx: &mut ThreadContext| -> gpubind::Result<()> {
        for (dev, s) in streams {
            ctx.bind(dev)?.on(s)?.synchronize()?;
        }
        Ok(())
    };
    for _ in 0..warmup {
        f(ctx)?;
    }
    sync(ctx)?;
    for i in 0..reps {
        for ((dev, s), ev) in streams.iter().zip(&events) {
            ctx.bind(dev)?.on(s)?.record(&ev[i].0)?;
        }
        f(ctx)?;
        for ((dev, s), ev) in streams.iter().zip(&events) {
            ctx.bind(dev)?.on(s)?.record(&ev[i].1)?;
        }
    }
    sync(ctx)?;
    let mut ms = Vec::with_capacity(reps);
    for i in 0..reps {
        let mut worst = 0f32;
        for ev in &events {
            worst = worst.max(ev[i].0.elapsed_ms(&ev[i].1)?);
        }
        ms.push(worst as f64);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[reps / 2] * 1e-3)
}

fn comm_streams(comm: &Communicator) -> Vec<(Arc<Device>, &Stream)> {
    (0..comm.len())
        .filter_map(|r| Some((Arc::clone(comm.device(r)?), comm.stream(r)?)))
        .collect()
}

/// Median seconds of one `op` of `bytes` on `comm`, or None if the size rounds to 0.
fn time_op(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    op: BenchOp,
    bytes: usize,
    a: &Args,
    reps: usize,
) -> Res<Option<(usize, f64)>> {
    let n = comm.len();
    let Some((sc, rc)) = op.counts(bytes, n) else {
        return Ok(None);
    };
    let mut sends: Vec<DeviceSlice<f32>> = Vec::new();
    let mut recvs: Vec<DeviceSlice<f32>> = Vec::new();
    for r in 0..n {
        let gpu = ctx.bind(comm.device(r).ok_or("rank")?)?;
        sends.push(gpu.alloc_zeros(sc)?);
        recvs.push(gpu.alloc_zeros(rc)?);
    }
    let streams = comm_streams(comm);
    let t = time(ctx, &streams, reps, a.warmup, &mut |ctx| {
        ctx.group(comm, |g| {
            for (r, (s, o)) in sends.iter().zip(recvs.iter_mut()).enumerate() {
                match op {
                    BenchOp::AllReduce => g.all_reduce(r, s, o, Op::Sum)?,
                    BenchOp::Broadcast => g.broadcast(r, o, 0)?,
                    BenchOp::Reduce => g.reduce(r, s, o, Op::Sum, 0)?,
                    BenchOp::AllGather => g.all_gather(r, s, o)?,
                    BenchOp::ReduceScatter => g.reduce_scatter(r, s, o, Op::Sum)?,
                }
            }
            Ok(())
        })
    })?;
    Ok(Some((op.bytes(sc, rc), t)))
}

fn fmt_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn gbps(bytes: usize, t: f64) -> f64 {
    bytes as f64 / t / 1e9
}

fn reps_for(bytes: usize, reps: usize) -> usize {
    if bytes <= 1 << 20 { reps * 5 } else { reps }
}

fn one_gpu_table(ctx: &mut ThreadContext, dev: &Arc<Device>, a: &Args) -> Res<()> {
    let own1 = Communicator::new(ctx, std::slice::from_ref(dev), CommOptions::kernels())?;
    let own2 = Communicator::new(ctx, &[dev.clone(), dev.clone()], CommOptions::kernels())?;
    let nccl1 = if nccl_available() {
        Some(Communicator::new(
            ctx,
            std::slice::from_ref(dev),
            CommOptions::nccl(),
        )?)
    } else {
        None
    };
    let stream = ctx.bind(dev)?.new_stream()?;
    println!(
        "\n## 1. One GPU (device {}): copy ceiling, N=1 all_reduce, 2 ranks on one GPU",
        dev.ordinal()
    );
    println!(
        "copy = cuMemcpyDtoDAsync of the same bytes; own2 = 2-rank in-device sum (traffic 4×bytes vs the copy's 2×bytes)"
    );
    println!(
        "{:>9} | {:>9} {:>9} | {:>9} {:>9} {:>8} {:>8} | {:>9} {:>10} {:>8}",
        "bytes",
        "copy us",
        "copy GB/s",
        "own1 GB/s",
        "nccl1GB/s",
        "own/nccl",
        "own1%cp",
        "own2 us",
        "own2 traf",
        "own2%cp"
    );
    for bytes in sizes(a.max_bytes) {
        let reps = reps_for(bytes, a.reps);
        let count = bytes / 4;
        let (src, mut dst) = {
            let gpu = ctx.bind(dev)?;
            (
                gpu.alloc_zeros::<f32>(count)?,
                gpu.alloc_zeros::<f32>(count)?,
            )
        };
        let streams = [(dev.clone(), &stream)];
        let t_copy = time(ctx, &streams, reps, a.warmup, &mut |ctx| {
            let gpu = ctx.bind(dev)?;
            gpu.on(&stream)?.dtod_async(&src, &mut dst)
        })?;
        drop((src, dst));
        let own = time_op(ctx, &own1, BenchOp::AllReduce, bytes, a, reps)?;
        let nccl = match &nccl1 {
            Some(c) => time_op(ctx, c, BenchOp::AllReduce, bytes, a, reps)?,
            None => None,
        };
        let two = time_op(ctx, &own2, BenchOp::AllReduce, bytes, a, reps)?;
        let copy_bw = gbps(bytes, t_copy);
        let (own_bw, own_pct) = own.map_or((f64::NAN, f64::NAN), |(b, t)| {
            (gbps(b, t), 100.0 * t_copy / t)
        });
        let nccl_bw = nccl.map_or(f64::NAN, |(b, t)| gbps(b, t));
        let (two_t, two_traffic, two_pct) = two.map_or((f64::NAN, f64::NAN, f64::NAN), |(b, t)| {
            let traffic = gbps(4 * b, t);
            (t * 1e6, traffic, 100.0 * traffic / gbps(2 * bytes, t_copy))
        });
        println!(
            "{:>9} | {:>9.2} {:>9.1} | {:>9.1} {:>9.1} {:>8.2} {:>7.0}% | {:>9.2} {:>10.1} {:>7.0}%",
            fmt_bytes(bytes),
            t_copy * 1e6,
            copy_bw,
            own_bw,
            nccl_bw,
            own_bw / nccl_bw,
            own_pct,
            two_t,
            two_traffic,
            two_pct
        );
    }
    if nccl1.is_none() {
        println!("(NCCL not available: NCCL columns are NaN)");
    }
    Ok(())
}

fn ops_table(ctx: &mut ThreadContext, devices: &[Arc<Device>], a: &Args, title: &str) -> Res<()> {
    let n = devices.len();
    let own = Communicator::new(ctx, devices, CommOptions::kernels())?;
    let nccl = if nccl_available() {
        Some(Communicator::new(ctx, devices, CommOptions::nccl())?)
    } else {
        None
    };
    println!(
        "\n## {title} (N={n}, own kernels host-staged: {})",
        own.is_host_staged()
    );
    println!(
        "{:>14} {:>9} | {:>10} {:>9} {:>9} | {:>10} {:>9} {:>9} | {:>8}",
        "op", "bytes", "own us", "algbw", "busbw", "nccl us", "algbw", "busbw", "own/nccl"
    );
    for op in OPS {
        for bytes in sizes(a.max_bytes) {
            let reps = reps_for(bytes, a.reps);
            let Some((b, t_own)) = time_op(ctx, &own, op, bytes, a, reps)? else {
                continue;
            };
            let t_nccl = match &nccl {
                Some(c) => time_op(ctx, c, op, bytes, a, reps)?.map(|x| x.1),
                None => None,
            }
            .unwrap_or(f64::NAN);
            let f = op.bus_factor(n);
            let (alg_o, alg_n) = (gbps(b, t_own), gbps(b, t_nccl));
            println!(
                "{:>14} {:>9} | {:>10.2} {:>9.1} {:>9.1} | {:>10.2} {:>9.1} {:>9.1} | {:>8.2}",
                op.name(),
                fmt_bytes(b),
                t_own * 1e6,
                alg_o,
                alg_o * f,
                t_nccl * 1e6,
                alg_n,
                alg_n * f,
                t_nccl / t_own
            );
        }
    }
    Ok(())
}

/// The environment variable that makes this binary a rank of table 4:
/// `rank,world,key,max_bytes,reps,warmup`.
const PROC_VAR: &str = "GPUBIND_BENCH_PROC";

/// A rank of table 4: all_reduce(Sum) of f32 for every size; rank 0 prints
/// `PROC <bytes> <median seconds>` lines.
fn proc_rank(spec: &str) -> Res<()> {
    let f: Vec<&str> = spec.split(',').collect();
    let [rank, world, key, max, reps, warmup] = f[..] else {
        return Err(format!("bad {PROC_VAR}: {spec}").into());
    };
    let (rank, world): (usize, usize) = (rank.parse()?, world.parse()?);
    let (max, reps, warmup): (usize, usize, usize) = (max.parse()?, reps.parse()?, warmup.parse()?);
    let mut ctx = ThreadContext::acquire()?;
    let dev = Device::get(0)?;
    let timeout = std::time::Duration::from_secs(120);
    let mut comm = RankComm::init_process_kernels(&mut ctx, &dev, rank, world, key, timeout)?;
    let gpu = ctx.bind(&dev)?;
    let stream = gpu.new_stream()?;
    let s = gpu.on(&stream)?;
    for bytes in sizes(max) {
        let count = bytes / 4;
        let send = gpu.alloc_zeros::<f32>(count)?;
        let mut recv = gpu.alloc_zeros::<f32>(count)?;
        for _ in 0..warmup {
            comm.all_reduce(&s, &send, &mut recv, Op::Sum)?;
        }
        s.synchronize()?;
        let mut ts = Vec::new();
        for _ in 0..reps_for(bytes, reps) {
            let t = std::time::Instant::now();
            comm.all_reduce(&s, &send, &mut recv, Op::Sum)?;
            s.synchronize()?;
            ts.push(t.elapsed().as_secs_f64());
        }
        ts.sort_by(f64::total_cmp);
        if rank == 0 {
            println!("PROC {bytes} {}", ts[ts.len() / 2]);
        }
    }
    Ok(())
}

/// Table 4 for `world` ranks on `dev`.
fn procs_table(ctx: &mut ThreadContext, dev: &Arc<Device>, a: &Args, world: usize) -> Res<()> {
    let max = a.max_bytes.min(64 << 20);
    let key = format!("bench-collective-{}-{world}", std::process::id());
    let kids: Vec<std::process::Child> = (0..world)
        .map(|r| {
            std::process::Command::new(std::env::current_exe()?)
                .env(
                    PROC_VAR,
                    format!("{r},{world},{key},{max},{},{}", a.reps, a.warmup),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut rows = std::collections::BTreeMap::new();
    let mut failed = Vec::new();
    for (r, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output()?;
        if !out.status.success() {
            failed.push(r);
        }
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if let ["PROC", b, t] = w[..] {
                rows.insert(b.parse::<usize>()?, t.parse::<f64>()?);
            }
        }
    }
    let inproc = Communicator::new(ctx, &vec![dev.clone(); world], CommOptions::kernels())?;
    println!(
        "\n## 4. Own kernels, {world} ranks on GPU {}: one process vs {world} processes (all_reduce f32)",
        dev.ordinal()
    );
    println!("in-process: events-timed; processes: rank 0's host time of call + synchronize");
    println!(
        "{:>9} | {:>10} {:>9} | {:>10} {:>9} | {:>8}",
        "bytes", "1proc us", "algbw", "Nproc us", "algbw", "N/1"
    );
    for bytes in sizes(max) {
        let one = time_op(
            ctx,
            &inproc,
            BenchOp::AllReduce,
            bytes,
            a,
            reps_for(bytes, a.reps),
        )?;
        let (t1, b1) = one.map_or((f64::NAN, f64::NAN), |(b, t)| (t, gbps(b, t)));
        let tn = rows.get(&bytes).copied().unwrap_or(f64::NAN);
        let bn = gbps(bytes, tn);
        println!(
            "{:>9} | {:>10.2} {:>9.2} | {:>10.2} {:>9.2} | {:>8.2}",
            fmt_bytes(bytes),
            t1 * 1e6,
            b1,
            tn * 1e6,
            bn,
            bn / b1
        );
    }
    if !failed.is_empty() {
        println!("(rank process(es) {failed:?} failed: their rows are NaN)");
    }
    Ok(())
}

/// The environment variable that makes this binary a rank of table 5:
/// `rank,world,port,ops`.
const CHECK_PROC_VAR: &str = "GPUBIND_BENCH_CHECK";

/// A rank of table 5: the rendezvous on loopback, then `ops` agreements on a made-up
/// collective (what `RankComm::from_launch` adds to each NCCL collective); rank 0 prints
/// `CHECK <median us> <p99 us>`. The agreement alone is a test seam of gpubind (its
/// `test-seams` feature).
#[cfg(feature = "test-seams")]
fn check_rank(spec: &str) -> Res<()> {
    let f: Vec<&str> = spec.split(',').collect();
    let [rank, world, port, ops] = f[..] else {
        return Err(format!("bad {CHECK_PROC_VAR}: {spec}").into());
    };
    let ops: usize = ops.parse()?;
    let vars = [
        ("RANK", rank.to_owned()),
        ("WORLD_SIZE", world.to_owned()),
        ("LOCAL_RANK", rank.to_owned()),
        ("LOCAL_WORLD_SIZE", world.to_owned()),
        ("GPUBIND_RDZV_PORT", port.to_owned()),
        ("GPUBIND_RDZV_TIMEOUT", "60".to_owned()),
    ];
    let env = gpubind::collective::LaunchEnv::from_vars(|k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })?;
    let id = gpubind::collective::NcclUniqueId::from_bytes(&[1; 128])?;
    let (_, check) = env.exchange_id_checked_with(|| Ok(id))?;
    let mut check = check.ok_or("a world of one has no check")?;
    for _ in 0..ops / 10 {
        check.agree_for_test(9, 0, 1 << 20)?;
    }
    let mut ts = Vec::with_capacity(ops);
    for _ in 0..ops {
        let t = std::time::Instant::now();
        check.agree_for_test(9, 0, 1 << 20)?;
        ts.push(t.elapsed().as_secs_f64());
    }
    ts.sort_by(f64::total_cmp);
    if env.rank == 0 {
        println!(
            "CHECK {} {}",
            ts[ts.len() / 2] * 1e6,
            ts[ts.len() * 99 / 100] * 1e6
        );
    }
    Ok(())
}

/// Table 5: the cost per collective of the agreement NCCL ranks across processes make
/// through rank 0 before enqueueing (`GPUBIND_CHECK_CALLS`, on by default), on loopback
/// TCP between `world` processes. Needs no GPU, and gpubind's `test-seams` feature.
fn call_check_table() -> Res<()> {
    if !cfg!(feature = "test-seams") {
        println!("\n## 5. Agreement on every collective: SKIPPED (needs --features test-seams)");
        return Ok(());
    }
    println!(
        "\n## 5. NCCL across processes: cost of the agreement on every collective ({}, loopback TCP)",
        gpubind::collective::CHECK_VAR
    );
    println!("rank 0's time per agreement (all ranks calling in a loop); off: 0");
    println!("{:>6} | {:>10} {:>10}", "ranks", "median us", "p99 us");
    for world in [2usize, 4, 8] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let kids: Vec<std::process::Child> = (0..world)
            .map(|r| {
                std::process::Command::new(std::env::current_exe()?)
                    .env(CHECK_PROC_VAR, format!("{r},{world},{port},5000"))
                    .stdout(std::process::Stdio::piped())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        let mut row = None;
        for k in kids {
            let out = k.wait_with_output()?;
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                if let ["CHECK", m, p] = l.split_whitespace().collect::<Vec<_>>()[..] {
                    row = Some((m.parse::<f64>()?, p.parse::<f64>()?));
                }
            }
        }
        match row {
            Some((m, p)) => println!("{world:>6} | {m:>10.1} {p:>10.1}"),
            None => println!("{world:>6} | (a rank failed)"),
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    if let Ok(spec) = std::env::var(PROC_VAR) {
        return proc_rank(&spec);
    }
    #[cfg(feature = "test-seams")]
    if let Ok(spec) = std::env::var(CHECK_PROC_VAR) {
        return check_rank(&spec);
    }
    // SAFETY: single-threaded at this point; nothing reads the environment concurrently.
    // NVLS (NVLink multicast) stays off.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let a = args()?;
    if a.call_check_only {
        return call_check_table();
    }
    if !gpubind::driver_available() {
        println!("bench_collective: no CUDA driver; only table 5 (no GPU needed)");
        return call_check_table();
    }
    let devices = Device::all()?;
    println!("# bench_collective: {} device(s)", devices.len());
    for d in &devices {
        println!("#   {}: {}", d.ordinal(), d.name());
    }
    match gpubind::collective::nccl_version() {
        Ok(v) => println!("# NCCL {}.{}.{}", v.0, v.1, v.2),
        Err(e) => println!("# {e}"),
    }
    println!(
        "# median of {} reps ({}x below 1 MiB), {} warm-ups; GB/s = 1e9 B/s; own/nccl > 1 means own is faster",
        a.reps, 5, a.warmup
    );
    let mut ctx = ThreadContext::acquire()?;
    let d0 = devices.first().ok_or("no device")?.clone();
    one_gpu_table(&mut ctx, &d0, &a)?;
    ops_table(&mut ctx, std::slice::from_ref(&d0), &a, "2. Every op, N=1")?;
    if devices.len() > 1 {
        ops_table(&mut ctx, &devices, &a, "3. Every op, N = all devices")?;
    } else {
        println!("\n## 3. N = all devices: skipped (only 1 device)");
    }
    for world in [2, 4] {
        procs_table(&mut ctx, &d0, &a, world)?;
    }
    call_check_table()
}
