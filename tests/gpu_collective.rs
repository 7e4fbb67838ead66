//! GPU tests of the collectives (`harness = false`): every op on every data type against
//! a CPU reference on fresh random data, for the own-kernel backend (N = 1..4 ranks on
//! one GPU, direct and host-staged, one thread driving all ranks and one thread per
//! rank) and for NCCL (one device, one thread per rank), plus N = all devices when the
//! machine has more than one. The seed is printed so a failure can be replayed with
//! `GPUBIND_TEST_SEED=<seed>`.

mod common;

use common::Ctx;
use gpubind::collective::{
    CollectiveType, CommOptions, Communicator, Op, RankComm, Transport, nccl_available,
};
use gpubind::{Device, DeviceSlice, Error, ThreadContext};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

type R = Result<(), String>;

/// An element type with a CPU reference.
trait TestType: CollectiveType + Copy + PartialEq + std::fmt::Debug + Send + Sync {
    /// Relative rounding unit (0 for exact types).
    const EPS: f64;
    fn sample(rng: &mut StdRng, op: Option<Op>) -> Self;
    fn reference(vals: &[Self], op: Op) -> Self;
    /// The magnitude the rounding error of combining `vals` scales with.
    fn mag(vals: &[Self], op: Op) -> f64;
    fn to_f64(self) -> f64;
    fn zero() -> Self;
}

macro_rules! float_type {
    ($t:ty, $eps:expr, $to:expr, $from:expr) => {
        impl TestType for $t {
            const EPS: f64 = $eps;
            fn sample(rng: &mut StdRng, op: Option<Op>) -> Self {
                let v: f64 = match op {
                    Some(Op::Prod) => {
                        let m = rng.random_range(0.5..1.5);
                        if rng.random::<bool>() { m } else { -m }
                    }
                    _ => rng.random_range(-1.0..1.0),
                };
                $from(v)
            }
            fn reference(vals: &[Self], op: Op) -> Self {
                let xs = vals.iter().map(|&v| $to(v));
                $from(match op {
                    Op::Sum => xs.sum(),
                    Op::Prod => xs.product(),
                    Op::Min => xs.fold(f64::INFINITY, f64::min),
                    Op::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                    Op::Avg => xs.sum::<f64>() / vals.len() as f64,
                })
            }
            fn mag(vals: &[Self], op: Op) -> f64 {
                let xs = vals.iter().map(|&v| $to(v).abs());
                match op {
                    Op::Sum | Op::Avg => xs.sum(),
                    Op::Prod => xs.product(),
                    Op::Min | Op::Max => 0.0,
                }
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn zero() -> Self {
                $from(0.0)
            }
        }
    };
}
float_type!(f32, f32::EPSILON as f64, |v: f32| v as f64, |v: f64| v
    as f32);
float_type!(f64, f64::EPSILON, |v: f64| v, |v: f64| v);
float_type!(f16, 9.77e-4, |v: f16| v.to_f64(), f16::from_f64);
float_type!(bf16, 7.82e-3, |v: bf16| v.to_f64(), bf16::from_f64);

macro_rules! int_type {
    ($t:ty, $sum:expr, $prod:expr) => {
        impl TestType for $t {
            const EPS: f64 = 0.0;
            fn sample(rng: &mut StdRng, op: Option<Op>) -> Self {
                match op {
                    Some(Op::Sum | Op::Avg) => rng.random_range($sum),
                    Some(Op::Prod) => rng.random_range($prod),
                    _ => rng.random(),
                }
            }
            fn reference(vals: &[Self], op: Op) -> Self {
                let it = vals.iter().copied();
                match op {
                    Op::Sum => it.fold(0, <$t>::wrapping_add),
                    Op::Prod => it.fold(1, <$t>::wrapping_mul),
                    Op::Min => it.min().unwrap_or(0),
                    Op::Max => it.max().unwrap_or(0),
                    Op::Avg => it.fold(0, <$t>::wrapping_add) / vals.len() as $t,
                }
            }
            fn mag(_: &[Self], _: Op) -> f64 {
                0.0
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn zero() -> Self {
                0
            }
        }
    };
}
int_type!(i32, -1000..1000, -3..4);
int_type!(i64, -1000..1000, -3..4);
int_type!(u8, 0..60, 1..4);

/// One collective, described rank-independently.
#[derive(Debug, Clone, Copy)]
enum Which {
    AllReduce(Op),
    Reduce(Op, usize),
    Broadcast(usize),
    AllGather,
    ReduceScatter(Op),
    /// rank r sends to r+1 and receives from r-1.
    Ring,
}

const OPS: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];
const SIZES: [usize; 5] = [0, 1, 7, 1001, 65537];

fn all_whiches(n: usize) -> Vec<Which> {
    let mut v = Vec::new();
    for op in OPS {
        v.push(Which::AllReduce(op));
        v.push(Which::Reduce(op, n / 2));
        v.push(Which::ReduceScatter(op));
    }
    v.push(Which::Broadcast(n - 1));
    v.push(Which::AllGather);
    v.push(Which::Ring);
    v
}

impl Which {
    fn op(self) -> Option<Op> {
        match self {
            Which::AllReduce(op) | Which::Reduce(op, _) | Which::ReduceScatter(op) => Some(op),
            _ => None,
        }
    }
    fn in_len(self, n: usize, count: usize) -> usize {
        match self {
            Which::ReduceScatter(_) => n * count,
            _ => count,
        }
    }
    fn out_len(self, n: usize, count: usize) -> usize {
        match self {
            Which::AllGather => n * count,
            _ => count,
        }
    }
}

/// Fresh inputs, and the initial contents of the outputs (random, so a missed write
/// shows; zero for reduce, whose non-root outputs must stay untouched).
struct Case<T> {
    inputs: Vec<Vec<T>>,
    outputs: Vec<Vec<T>>,
}

fn make_case<T: TestType>(rng: &mut StdRng, which: Which, n: usize, count: usize) -> Case<T> {
    let inputs = (0..n)
        .map(|_| {
            (0..which.in_len(n, count))
                .map(|_| T::sample(rng, which.op()))
                .collect()
        })
        .collect::<Vec<Vec<T>>>();
    let outputs = (0..n)
        .map(|r| match which {
            Which::Broadcast(_) => inputs[r].clone(),
            Which::Reduce(..) => vec![T::zero(); count],
            _ => (0..which.out_len(n, count))
                .map(|_| T::sample(rng, None))
                .collect(),
        })
        .collect();
    Case { inputs, outputs }
}

/// What rank r's output must be: `(want, magnitudes, exact)`, or `None` if unchecked.
fn expected<T: TestType>(
    which: Which,
    case: &Case<T>,
    count: usize,
    r: usize,
    strict: bool,
) -> Option<(Vec<T>, Vec<f64>, bool)> {
    let n = case.inputs.len();
    let reduce_at = |op: Op, base: usize| -> (Vec<T>, Vec<f64>) {
        (0..count)
            .map(|e| {
                let vals: Vec<T> = case.inputs.iter().map(|v| v[base + e]).collect();
                (T::reference(&vals, op), T::mag(&vals, op))
            })
            .unzip()
    };
    Some(match which {
        Which::AllReduce(op) => {
            let (w, m) = reduce_at(op, 0);
            (w, m, false)
        }
        Which::Reduce(op, root) if r == root => {
            let (w, m) = reduce_at(op, 0);
            (w, m, false)
        }
        Which::Reduce(..) if strict => (vec![T::zero(); count], vec![0.0; count], true),
        Which::Reduce(..) => return None,
        Which::ReduceScatter(op) => {
            let (w, m) = reduce_at(op, r * count);
            (w, m, false)
        }
        Which::Broadcast(root) => (case.inputs[root].clone(), vec![0.0; count], true),
        Which::AllGather => (case.inputs.concat(), vec![0.0; n * count], true),
        Which::Ring => (case.inputs[(r + n - 1) % n].clone(), vec![0.0; count], true),
    })
}

fn compare<T: TestType>(
    what: &str,
    got: &[T],
    want: &[T],
    mag: &[f64],
    exact: bool,
    n: usize,
) -> R {
    ensure!(
        got.len() == want.len(),
        "{what}: {} elements, want {}",
        got.len(),
        want.len()
    );
    for i in 0..got.len() {
        let ok = if exact || T::EPS == 0.0 {
            got[i] == want[i]
        } else {
            let w = want[i].to_f64();
            let tol = T::EPS * ((n as f64 + 2.0) * mag[i] + w.abs()) + 1e-30;
            (got[i].to_f64() - w).abs() <= tol
        };
        ensure!(
            ok,
            "{what}: element {i} of {}: got {:?}, want {:?}",
            got.len(),
            got[i],
            want[i]
        );
    }
    Ok(())
}

fn check_outputs<T: TestType>(
    what: &str,
    which: Which,
    case: &Case<T>,
    count: usize,
    outs: &[Vec<T>],
    strict: bool,
) -> R {
    let n = case.inputs.len();
    for (r, got) in outs.iter().enumerate() {
        if let Some((want, mag, exact)) = expected(which, case, count, r, strict) {
            compare(&format!("{what} rank {r}"), got, &want, &mag, exact, n)?;
        }
    }
    Ok(())
}

fn seed() -> u64 {
    std::env::var("GPUBIND_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Runs `which` through a group on `comm` and checks every rank's output.
fn group_case<T: TestType>(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    which: Which,
    count: usize,
    rng: &mut StdRng,
    strict: bool,
) -> R {
    let n = comm.len();
    let case = make_case::<T>(rng, which, n, count);
    let what = format!("{which:?} {} count {count} N={n}", T::NAME);
    let mut sends: Vec<DeviceSlice<T>> = Vec::new();
    let mut outs: Vec<DeviceSlice<T>> = Vec::new();
    for r in 0..n {
        let gpu = ctx.bind(comm.device(r).ok_or("rank")?).ctx("bind")?;
        sends.push(gpu.clone_htod(&case.inputs[r]).ctx("upload")?);
        outs.push(gpu.clone_htod(&case.outputs[r]).ctx("upload")?);
    }
    ctx.group(comm, |g| {
        for (r, (s, o)) in sends.iter().zip(outs.iter_mut()).enumerate() {
            match which {
                Which::AllReduce(op) => g.all_reduce(r, s, o, op)?,
                Which::Reduce(op, root) => g.reduce(r, s, o, op, root)?,
                Which::Broadcast(root) => g.broadcast(r, o, root)?,
                Which::AllGather => g.all_gather(r, s, o)?,
                Which::ReduceScatter(op) => g.reduce_scatter(r, s, o, op)?,
                Which::Ring => {
                    g.send(r, s, (r + 1) % n)?;
                    g.recv(r, o, (r + n - 1) % n)?;
                }
            }
        }
        Ok(())
    })
    .ctx(&what)?;
    comm.synchronize(ctx).ctx("synchronize")?;
    let mut got = Vec::new();
    for (r, o) in outs.iter().enumerate() {
        let gpu = ctx.bind(comm.device(r).ok_or("rank")?).ctx("bind")?;
        got.push(gpu.dtoh(o).ctx("download")?);
    }
    check_outputs(&what, which, &case, count, &got, strict)
}

/// Runs `which` with one thread per rank, each driving its `RankComm`.
fn thread_case<T: TestType>(
    comms: &mut Vec<RankComm>,
    which: Which,
    count: usize,
    rng: &mut StdRng,
    strict: bool,
) -> R {
    let n = comms.len();
    let case = make_case::<T>(rng, which, n, count);
    let what = format!(
        "{which:?} {} count {count} N={n} (thread per rank)",
        T::NAME
    );
    let taken: Vec<RankComm> = std::mem::take(comms);
    let results: Vec<(RankComm, Result<Vec<T>, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = taken
            .into_iter()
            .map(|mut comm| {
                let case = &case;
                s.spawn(move || {
                    let out = (|| -> Result<Vec<T>, String> {
                        let r = comm.rank();
                        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                        let dev = Arc::clone(comm.device());
                        let gpu = ctx.bind(&dev).ctx("bind")?;
                        let stream = gpu.new_stream().ctx("stream")?;
                        let send = gpu.clone_htod(&case.inputs[r]).ctx("upload")?;
                        let mut out = gpu.clone_htod(&case.outputs[r]).ctx("upload")?;
                        let st = gpu.on(&stream).ctx("on")?;
                        match which {
                            Which::AllReduce(op) => comm.all_reduce(&st, &send, &mut out, op),
                            Which::Reduce(op, root) => comm.reduce(&st, &send, &mut out, op, root),
                            Which::Broadcast(root) => comm.broadcast(&st, &mut out, root),
                            Which::AllGather => comm.all_gather(&st, &send, &mut out),
                            Which::ReduceScatter(op) => {
                                comm.reduce_scatter(&st, &send, &mut out, op)
                            }
                            Which::Ring if n == 1 => gpu.dtod(&send, &mut out),
                            // Even ranks send first, odd ranks receive first, so the
                            // blocking rendezvous cannot deadlock.
                            Which::Ring => {
                                let (to, from) = ((r + 1) % n, (r + n - 1) % n);
                                if r % 2 == 0 {
                                    comm.send(&st, &send, to)
                                        .and_then(|()| comm.recv(&st, &mut out, from))
                                } else {
                                    comm.recv(&st, &mut out, from)
                                        .and_then(|()| comm.send(&st, &send, to))
                                }
                            }
                        }
                        .ctx("collective")?;
                        st.synchronize().ctx("synchronize")?;
                        gpu.dtoh(&out).ctx("download")
                    })();
                    (comm, out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    });
    let mut outs = Vec::new();
    let mut first_err = None;
    for (comm, out) in results {
        comms.push(comm);
        match out {
            Ok(v) => outs.push(v),
            Err(e) => {
                first_err.get_or_insert(format!("{what}: rank {}: {e}", comms.len() - 1));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    check_outputs(&what, which, &case, count, &outs, strict)
}

macro_rules! each_type {
    ($f:ident($($a:expr),*)) => {{
        $f::<f32>($($a),*)?;
        $f::<f64>($($a),*)?;
        $f::<f16>($($a),*)?;
        $f::<bf16>($($a),*)?;
        $f::<i32>($($a),*)?;
        $f::<i64>($($a),*)?;
        $f::<u8>($($a),*)?;
    }};
}

/// Every op, type and size through groups on `comm`.
fn group_matrix(ctx: &mut ThreadContext, comm: &Communicator, strict: bool, sizes: &[usize]) -> R {
    let s = seed();
    println!("    seed {s}, N={} ({:?})", comm.len(), comm.backend());
    let mut rng = StdRng::seed_from_u64(s);
    for which in all_whiches(comm.len()) {
        for &count in sizes {
            each_type!(group_case(ctx, comm, which, count, &mut rng, strict));
        }
    }
    Ok(())
}

fn thread_matrix(comms: &mut Vec<RankComm>, strict: bool, sizes: &[usize]) -> R {
    let s = seed();
    println!("    seed {s}, N={} threads", comms.len());
    let mut rng = StdRng::seed_from_u64(s);
    for which in all_whiches(comms.len()) {
        for &count in sizes {
            each_type!(thread_case(comms, which, count, &mut rng, strict));
        }
    }
    Ok(())
}

fn dev0() -> Result<Arc<Device>, String> {
    Device::get(0).ctx("device 0")
}

fn kernels_group_ranks_on_one_gpu() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    for n in 1..=4 {
        let devices = vec![Arc::clone(&d); n];
        let comm = Communicator::new(&mut ctx, &devices, CommOptions::kernels()).ctx("new")?;
        ensure!(!comm.is_host_staged(), "one device must be direct");
        group_matrix(&mut ctx, &comm, true, &SIZES)?;
    }
    Ok(())
}

/// More ranks than one kernel launch takes pointers (16): folded in several passes.
fn kernels_many_ranks_on_one_gpu() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    let mut rng = StdRng::seed_from_u64(seed());
    for n in [17, 40] {
        let devices = vec![Arc::clone(&d); n];
        let comm = Communicator::new(&mut ctx, &devices, CommOptions::kernels()).ctx("new")?;
        for which in [
            Which::AllReduce(Op::Sum),
            Which::AllReduce(Op::Avg),
            Which::AllReduce(Op::Max),
            Which::Reduce(Op::Sum, n - 1),
            Which::ReduceScatter(Op::Sum),
            Which::Broadcast(3),
            Which::AllGather,
        ] {
            for count in [1, 1001] {
                group_case::<f32>(&mut ctx, &comm, which, count, &mut rng, true)?;
                group_case::<i32>(&mut ctx, &comm, which, count, &mut rng, true)?;
                group_case::<u8>(&mut ctx, &comm, which, count, &mut rng, true)?;
            }
        }
    }
    Ok(())
}

fn kernels_group_host_staged() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    for n in [1, 3] {
        let devices = vec![Arc::clone(&d); n];
        let opts = CommOptions::kernels().with_transport(Transport::HostStaged);
        let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
        ensure!(comm.is_host_staged(), "forced staging");
        group_matrix(&mut ctx, &comm, true, &[0, 1, 1001])?;
    }
    Ok(())
}

fn kernels_thread_per_rank_on_one_gpu() -> R {
    let d = dev0()?;
    for (n, transport) in [
        (1, Transport::Auto),
        (2, Transport::Auto),
        (3, Transport::Auto),
        (2, Transport::HostStaged),
    ] {
        let devices = vec![Arc::clone(&d); n];
        let opts = CommOptions::kernels().with_transport(transport);
        let mut comms = Communicator::init_all(&devices, opts).ctx("init_all")?;
        println!("    {transport:?}");
        thread_matrix(&mut comms, true, &[0, 1, 1001])?;
    }
    Ok(())
}

/// One rank thread of `kernels_rank_comm_never_hangs`: sleeps `delay`, then all-reduces
/// `len` values (or, with `len == None`, drops its `RankComm` without a call; with
/// `panic`, panics first). Returns the call's outcome and how long it took.
fn never_hangs_rank(
    mut comm: RankComm,
    len: Option<usize>,
    delay: std::time::Duration,
    panic: bool,
) -> Result<(gpubind::Result<()>, std::time::Duration), String> {
    let d = Arc::clone(comm.device());
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    std::thread::sleep(delay);
    if panic {
        panic!("rank {} panics on purpose", comm.rank());
    }
    let Some(n) = len else {
        drop(comm);
        return Ok((Ok(()), std::time::Duration::ZERO));
    };
    let send = gpu.clone_htod(&vec![1.0f32; n]).ctx("htod")?;
    let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
    let s = gpu.on(&stream).ctx("on")?;
    let t = std::time::Instant::now();
    let r = comm.all_reduce(&s, &send, &mut out, Op::Sum);
    Ok((r, t.elapsed()))
}

/// The 1:1 own-kernel pattern never hangs: a rank that drops its `RankComm`, panics,
/// comes too late or calls with another length makes every other rank return a typed
/// error (naming it where it is known), well within the timeout.
fn kernels_rank_comm_never_hangs() -> R {
    use std::time::Duration;
    let d = dev0()?;
    let devices = vec![Arc::clone(&d); 3];
    type Plan = [(Option<usize>, u64, bool); 3];
    let run = |timeout_ms: u64,
               plan: Plan|
     -> Result<Vec<(gpubind::Result<()>, Duration)>, String> {
        let opts = CommOptions::kernels().with_timeout(Duration::from_millis(timeout_ms));
        let comms = Communicator::init_all(&devices, opts).ctx("init_all")?;
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .zip(plan)
                .map(|(c, (len, delay, panic))| {
                    s.spawn(move || never_hangs_rank(c, len, Duration::from_millis(delay), panic))
                })
                .collect();
            hs.into_iter()
                .map(|h| match h.join() {
                    Ok(r) => r,
                    Err(_) => Ok((Ok(()), Duration::ZERO)), // the panicking rank
                })
                .collect()
        })
    };
    // Rank 2 drops its RankComm after 300 ms, timeout 60 s: PeerFailed at once.
    let got = run(
        60_000,
        [
            (Some(1000), 0, false),
            (Some(1000), 0, false),
            (None, 300, false),
        ],
    )?;
    for (r, (out, took)) in got[..2].iter().enumerate() {
        ensure!(
            matches!(out, Err(Error::PeerFailed { rank: 2, .. }))
                && *took < Duration::from_secs(10),
            "drop: rank {r} got {out:?} after {took:?}"
        );
    }
    // Rank 1 panics: PeerFailed naming it, saying so.
    let got = run(
        60_000,
        [
            (Some(1000), 0, false),
            (Some(1000), 200, true),
            (Some(1000), 0, false),
        ],
    )?;
    for r in [0, 2] {
        let (out, took) = &got[r];
        ensure!(
            matches!(out, Err(Error::PeerFailed { rank: 1, reason }) if reason.contains("panicked"))
                && *took < Duration::from_secs(10),
            "panic: rank {r} got {out:?} after {took:?}"
        );
    }
    // Rank 2 comes 4 s late (after the 500 ms timeout, even with a slow first NVRTC compile): the others time out naming it, and rank 2
    // gets the same error at once (the communicator is broken).
    let got = run(
        500,
        [
            (Some(1000), 0, false),
            (Some(1000), 0, false),
            (Some(1000), 4000, false),
        ],
    )?;
    for (r, (out, took)) in got.iter().enumerate() {
        ensure!(
            matches!(out, Err(Error::PeerTimeout { ranks, .. }) if ranks.contains(&2))
                && *took < Duration::from_secs(5),
            "late: rank {r} got {out:?} after {took:?}"
        );
    }
    // Different lengths: the same typed error on every rank, nothing enqueued.
    let got = run(
        60_000,
        [
            (Some(1000), 0, false),
            (Some(1001), 0, false),
            (Some(1000), 0, false),
        ],
    )?;
    for (r, (out, _)) in got.iter().enumerate() {
        ensure!(
            matches!(out, Err(Error::SizeMismatch { .. })),
            "lengths: rank {r} got {out:?}"
        );
    }
    Ok(())
}

/// Every device, or the harness's skip when fewer than 2 are visible.
fn multi_gpu_devices() -> Result<Vec<Arc<Device>>, String> {
    let all = Device::all().ctx("devices")?;
    if all.len() < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs, {} visible",
            all.len()
        )));
    }
    Ok(all)
}

fn kernels_all_devices() -> R {
    let devices = multi_gpu_devices()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    for transport in [Transport::Auto, Transport::HostStaged] {
        let opts = CommOptions::kernels().with_transport(transport);
        let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
        println!("    {transport:?}: host staged = {}", comm.is_host_staged());
        group_matrix(&mut ctx, &comm, true, &SIZES)?;
        drop(comm);
        let mut comms = Communicator::init_all(&devices, opts).ctx("init_all")?;
        thread_matrix(&mut comms, true, &[0, 1, 1001])?;
    }
    // Two ranks per device.
    let doubled: Vec<Arc<Device>> = devices.iter().chain(devices.iter()).cloned().collect();
    let comm = Communicator::new(&mut ctx, &doubled, CommOptions::kernels()).ctx("new")?;
    group_matrix(&mut ctx, &comm, true, &[1, 1001])
}

/// A direct-transport collective across devices whose buffers include memory-pool
/// memory (`stream.alloc_zeros`) is refused with `InvalidArgument` before anything is
/// enqueued: peer access does not reach pool allocations, so another device's kernel
/// would fault on them and poison its device. The devices stay usable, and the same
/// call with `cuMemAlloc` buffers runs.
fn pool_memory_in_a_direct_collective_across_devices_is_refused() -> R {
    let devices = multi_gpu_devices()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let opts = CommOptions::kernels().with_transport(Transport::Auto);
    let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
    if comm.is_host_staged() {
        return Err(common::skip(
            "no peer access between the GPUs: the direct transport is not used",
        ));
    }
    let n = comm.len();
    let (mut streams, mut pooled, mut plain, mut outs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..n {
        let gpu = ctx.bind(comm.device(r).ok_or("rank")?).ctx("bind")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        pooled.push(s.alloc_zeros::<f32>(1024).ctx("pool alloc")?);
        plain.push(gpu.clone_htod(&[1.0f32; 1024]).ctx("upload")?);
        outs.push(gpu.alloc_zeros::<f32>(1024).ctx("alloc")?);
        streams.push(stream);
    }
    let refused = ctx.group(&comm, |g| {
        for (r, (send, out)) in pooled.iter().zip(outs.iter_mut()).enumerate() {
            g.all_reduce(r, send, out, Op::Sum)?;
        }
        Ok(())
    });
    match refused {
        Err(Error::InvalidArgument(m)) if m.contains("memory-pool") => {}
        other => return Err(format!("pool memory across devices: {other:?}")),
    }
    ctx.group(&comm, |g| {
        for (r, (send, out)) in plain.iter().zip(outs.iter_mut()).enumerate() {
            g.all_reduce(r, send, out, Op::Sum)?;
        }
        Ok(())
    })
    .ctx("the same call with cuMemAlloc buffers")?;
    comm.synchronize(&mut ctx).ctx("synchronize")?;
    for (r, out) in outs.iter().enumerate() {
        let gpu = ctx.bind(comm.device(r).ok_or("rank")?).ctx("bind")?;
        let got = gpu.dtoh(out).ctx("download")?;
        ensure!(
            got.iter().all(|&x| x == n as f32),
            "rank {r}: {:?}, want {n}",
            &got[..4]
        );
    }
    println!("pool memory in a direct collective across {n} devices: refused");
    Ok(())
}

/// `Ok` when NCCL is installed; otherwise checks the typed error and returns the
/// harness's skip, so the test is reported `ignored (SKIPPED: …)`, never as passed.
fn nccl_present(ctx: &mut ThreadContext) -> R {
    if nccl_available() {
        return Ok(());
    }
    let e = Communicator::new(ctx, &[dev0()?], CommOptions::nccl()).unwrap_err();
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
        return Err(common::skip(
            "gpubind built without its `nccl` feature (Error::FeatureDisabled checked)",
        ));
    }
    ensure!(e == Error::NoNccl, "want NoNccl, got {e}");
    ensure!(e.to_string().contains("LD_LIBRARY_PATH"), "{e}");
    Err(common::skip(
        "NCCL is not installed (Error::NoNccl checked)",
    ))
}

fn nccl_group_one_device() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    nccl_present(&mut ctx)?;
    println!(
        "    NCCL {:?}",
        gpubind::collective::nccl_version().ctx("version")?
    );
    let comm = Communicator::new(&mut ctx, &[dev0()?], CommOptions::nccl()).ctx("new")?;
    group_matrix(&mut ctx, &comm, false, &SIZES)
}

fn nccl_thread_per_rank_one_device() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    nccl_present(&mut ctx)?;
    drop(ctx);
    let mut comms = Communicator::init_all(&[dev0()?], CommOptions::nccl()).ctx("init_all")?;
    thread_matrix(&mut comms, false, &[0, 1, 1001])
}

fn nccl_all_devices() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    nccl_present(&mut ctx)?;
    let devices = multi_gpu_devices()?;
    let comm = Communicator::new(&mut ctx, &devices, CommOptions::nccl()).ctx("new")?;
    group_matrix(&mut ctx, &comm, false, &SIZES)?;
    drop(comm);
    drop(ctx);
    let mut comms = Communicator::init_all(&devices, CommOptions::nccl()).ctx("init_all")?;
    thread_matrix(&mut comms, false, &[0, 1, 1001])
}

fn nccl_rejects_ranks_on_one_gpu() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    nccl_present(&mut ctx)?;
    let d = dev0()?;
    let e = Communicator::new(&mut ctx, &[d.clone(), d.clone()], CommOptions::nccl()).unwrap_err();
    ensure!(
        e == Error::DuplicateDevice {
            ordinal: 0,
            first: 0,
            second: 1
        },
        "got {e}"
    );
    let e = Communicator::init_all(&[d.clone(), d], CommOptions::nccl()).unwrap_err();
    ensure!(matches!(e, Error::DuplicateDevice { .. }), "got {e}");
    Ok(())
}

fn mismatched_lengths_are_typed_errors() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    let mut backends = vec![CommOptions::kernels()];
    if nccl_available() {
        backends.push(CommOptions::nccl());
    } else {
        println!("    SKIPPED: the NCCL part (libnccl not found)");
    }
    for opts in backends {
        let devices = if opts.backend == gpubind::collective::Backend::Nccl {
            vec![Arc::clone(&d)]
        } else {
            vec![Arc::clone(&d); 2]
        };
        let n = devices.len();
        let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        let a = gpu.alloc_zeros::<f32>(10).ctx("alloc")?;
        let mut b = gpu.alloc_zeros::<f32>(11).ctx("alloc")?;
        let mut c = gpu.alloc_zeros::<f32>(10).ctx("alloc")?;
        let e = ctx
            .group(&comm, |g| g.all_reduce(0, &a, &mut b, Op::Sum))
            .unwrap_err();
        ensure!(
            e == Error::SizeMismatch {
                what: "all_reduce",
                expected: 10,
                found: 11
            },
            "all_reduce: {e}"
        );
        let e = ctx
            .group(&comm, |g| g.all_gather(0, &a, &mut b))
            .unwrap_err();
        ensure!(
            e == Error::SizeMismatch {
                what: "all_gather",
                expected: 10 * n,
                found: 11
            },
            "all_gather: {e}"
        );
        let e = ctx
            .group(&comm, |g| g.reduce_scatter(0, &b, &mut c, Op::Max))
            .unwrap_err();
        ensure!(
            matches!(
                e,
                Error::SizeMismatch {
                    what: "reduce_scatter",
                    ..
                }
            ),
            "reduce_scatter: {e}"
        );
        let e = ctx.group(&comm, |g| g.broadcast(0, &mut c, n)).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument(_)),
            "root out of range: {e}"
        );
        if n == 2 {
            // Counts that differ between ranks are caught before anything runs.
            let (gpu_a, mut o1, mut o2) = {
                let gpu = ctx.bind(&d).ctx("bind")?;
                (
                    gpu.alloc_zeros::<f32>(11).ctx("alloc")?,
                    gpu.alloc_zeros::<f32>(10).ctx("alloc")?,
                    gpu.alloc_zeros::<f32>(11).ctx("alloc")?,
                )
            };
            let e = ctx
                .group(&comm, |g| {
                    g.all_reduce(0, &a, &mut o1, Op::Sum)?;
                    g.all_reduce(1, &gpu_a, &mut o2, Op::Sum)
                })
                .unwrap_err();
            ensure!(
                e == Error::SizeMismatch {
                    what: "all_reduce",
                    expected: 10,
                    found: 11
                },
                "cross-rank: {e}"
            );
            let e = ctx.group(&comm, |g| g.send(0, &a, 1)).unwrap_err();
            ensure!(
                matches!(e, Error::InvalidArgument(_)),
                "unmatched send: {e}"
            );
        }
        // The 1:1 pattern reports the same errors.
        let mut comms = Communicator::init_all(&devices[..1], opts).ctx("init_all")?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        let st = gpu.default_stream();
        let e = comms[0].all_reduce(&st, &a, &mut b, Op::Sum).unwrap_err();
        ensure!(
            matches!(
                e,
                Error::SizeMismatch {
                    what: "all_reduce",
                    ..
                }
            ),
            "rank comm: {e}"
        );
    }
    Ok(())
}

/// One 256 MB f32 all-reduce (64 Mi elements per rank): own kernels with N = 1 and
/// N = 2 ranks on one GPU, and NCCL with N = 1. One f32 addition rounds exactly like
/// the CPU's, so the result must match bit for bit.
fn all_reduce_256mb() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    let count = 64 << 20;
    let mut rng = StdRng::seed_from_u64(seed());
    // Bulk random bits (fast even unoptimised), mapped to [-1, 1).
    let host: Vec<Vec<f32>> = (0..2)
        .map(|_| {
            let mut bits = vec![0u32; count];
            rng.fill(&mut bits[..]);
            bits.iter()
                .map(|&b| (b >> 8) as f32 * (2.0 / (1u32 << 24) as f32) - 1.0)
                .collect()
        })
        .collect();
    let mut configs = vec![
        (1usize, CommOptions::kernels()),
        (2, CommOptions::kernels()),
    ];
    if nccl_available() {
        configs.push((1, CommOptions::nccl()));
    } else {
        println!("    SKIPPED: the NCCL part (libnccl not found)");
    }
    for (n, opts) in configs {
        let devices = vec![Arc::clone(&d); n];
        let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        let sends: Vec<DeviceSlice<f32>> = host[..n]
            .iter()
            .map(|h| gpu.clone_htod(h))
            .collect::<gpubind::Result<_>>()
            .ctx("upload")?;
        let mut outs: Vec<DeviceSlice<f32>> = (0..n)
            .map(|_| gpu.alloc_zeros::<f32>(count))
            .collect::<gpubind::Result<_>>()
            .ctx("alloc")?;
        ctx.group(&comm, |g| {
            for (r, (s, o)) in sends.iter().zip(outs.iter_mut()).enumerate() {
                g.all_reduce(r, s, o, Op::Sum)?;
            }
            Ok(())
        })
        .ctx("group")?;
        comm.synchronize(&mut ctx).ctx("sync")?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        for (r, o) in outs.iter().enumerate() {
            let got = gpu.dtoh(o).ctx("download")?;
            let bad = (0..count).find(|&i| {
                let want = if n == 1 {
                    host[0][i]
                } else {
                    host[0][i] + host[1][i]
                };
                got[i] != want
            });
            ensure!(
                bad.is_none(),
                "{:?} N={n} rank {r}: element {bad:?} wrong",
                opts.backend
            );
        }
    }
    Ok(())
}

/// Several collectives in one group, and views (unaligned offsets) as buffers.
fn several_calls_in_one_group_and_views() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    let comm =
        Communicator::new(&mut ctx, &[d.clone(), d.clone()], CommOptions::kernels()).ctx("new")?;
    let mut rng = StdRng::seed_from_u64(seed());
    let host: Vec<Vec<f32>> = (0..2)
        .map(|_| (0..1003).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    let gpu = ctx.bind(&d).ctx("bind")?;
    let s0 = gpu.clone_htod(&host[0]).ctx("up")?;
    let s1 = gpu.clone_htod(&host[1]).ctx("up")?;
    let mut o0 = gpu.alloc_zeros::<f32>(1003).ctx("alloc")?;
    let mut o1 = gpu.alloc_zeros::<f32>(1003).ctx("alloc")?;
    let mut m0 = gpu.alloc_zeros::<f32>(1000).ctx("alloc")?;
    let mut m1 = gpu.alloc_zeros::<f32>(1000).ctx("alloc")?;
    let (v0, v1) = (s0.slice(3..).ctx("view")?, s1.slice(3..).ctx("view")?);
    drop(gpu);
    ctx.group(&comm, |g| {
        g.all_reduce(0, &s0, &mut o0, Op::Sum)?;
        g.all_reduce(1, &s1, &mut o1, Op::Sum)?;
        g.all_reduce(0, &v0, &mut m0, Op::Max)?;
        g.all_reduce(1, &v1, &mut m1, Op::Max)
    })
    .ctx("group")?;
    comm.synchronize(&mut ctx).ctx("sync")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let (go, gm) = (gpu.dtoh(&o1).ctx("down")?, gpu.dtoh(&m0).ctx("down")?);
    for i in 0..1003 {
        let want = host[0][i] + host[1][i];
        ensure!(go[i] == want, "sum {i}: {} vs {want}", go[i]);
    }
    for i in 0..1000 {
        let want = host[0][i + 3].max(host[1][i + 3]);
        ensure!(gm[i] == want, "max {i}: {} vs {want}", gm[i]);
    }
    Ok(())
}

/// Two views of one module variable (`Module::global` twice) are one memory that borrows
/// cannot keep apart: given as two ranks' outputs, or as one rank's output and another's
/// input, the call is `InvalidArgument("collective aliasing …")` on every rank, nothing
/// enqueued (the variable keeps its value), from one thread (a group) and from a thread
/// per rank; the communicator then still works.
fn module_global_views_sharing_memory_are_refused() -> R {
    const SRC: &str =
        "__device__ float x[4];\nextern \"C\" __global__ void touch() { x[0] += 0.0f; }\n";
    let aliasing = |what: &str, r: Result<(), Error>| -> R {
        match r {
            Err(Error::InvalidArgument(m)) if m.starts_with("collective aliasing") => {
                println!("    {what}: {m}");
                Ok(())
            }
            other => Err(format!(
                "{what}: expected collective aliasing, got {other:?}"
            )),
        }
    };
    let d = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let comm =
        Communicator::new(&mut ctx, &[d.clone(), d.clone()], CommOptions::kernels()).ctx("new")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let mut module = gpu.compile_and_load(SRC, "alias.cu").ctx("compile")?;
    let mut a = module.global::<f32>("x").ctx("global")?;
    let mut b = module.global::<f32>("x").ctx("global")?;
    gpu.copy(&[7.0f32; 4][..], &mut a).ctx("fill x")?;
    let s0 = gpu.clone_htod(&[1.0f32; 8]).ctx("up")?;
    let s1 = gpu.clone_htod(&[2.0f32; 8]).ctx("up")?;
    let small = gpu.clone_htod(&[3.0f32; 4]).ctx("up")?;
    let mut o0 = gpu.alloc_zeros::<f32>(4).ctx("alloc")?;
    drop(gpu);
    // Both ranks' outputs are `x`: one of them would get the other's block.
    let both = ctx.group(&comm, |g| {
        g.reduce_scatter(0, &s0, &mut a, Op::Sum)?;
        g.reduce_scatter(1, &s1, &mut b, Op::Sum)
    });
    aliasing("group, two outputs", both)?;
    // Rank 1 writes `x` while rank 0 reads it.
    let read_written = ctx.group(&comm, |g| {
        g.all_reduce(0, &a, &mut o0, Op::Sum)?;
        g.all_reduce(1, &small, &mut b, Op::Sum)
    });
    aliasing("group, an input written by another rank", read_written)?;
    comm.synchronize(&mut ctx).ctx("sync")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let x = gpu.dtoh(&a).ctx("down")?;
    ensure!(x == [7.0; 4], "x changed by a refused call: {x:?}");
    drop(gpu);
    // Separate outputs (one input read by both ranks): the communicator still works.
    ctx.group(&comm, |g| {
        g.all_reduce(0, &small, &mut o0, Op::Sum)?;
        g.all_reduce(1, &small, &mut b, Op::Sum)
    })
    .ctx("group with separate outputs")?;
    comm.synchronize(&mut ctx).ctx("sync")?;
    let gpu = ctx.bind(&d).ctx("bind")?;
    let (x, o) = (gpu.dtoh(&a).ctx("down")?, gpu.dtoh(&o0).ctx("down")?);
    ensure!(
        x == [6.0; 4] && o == [6.0; 4],
        "sums: x {x:?}, rank 0 {o:?}"
    );
    drop(gpu);

    // A thread per rank: both return the error.
    let comms =
        Communicator::init_all(&[d.clone(), d.clone()], CommOptions::kernels()).ctx("init_all")?;
    let views = [a, b];
    let sends = [&s0, &s1];
    let got: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(views)
            .map(|(mut comm, mut view)| {
                let send = sends[comm.rank()];
                let d = d.clone();
                s.spawn(move || -> Result<(), Error> {
                    let mut ctx = ThreadContext::acquire()?;
                    let gpu = ctx.bind(&d)?;
                    let stream = gpu.new_stream()?;
                    let st = gpu.on(&stream)?;
                    let out = comm.reduce_scatter(&st, send, &mut view, Op::Sum);
                    st.synchronize()?;
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, g) in got.into_iter().enumerate() {
        aliasing(&format!("thread per rank, rank {r}"), g)?;
    }
    Ok(())
}

/// Random f32 inputs, one vector of `len` per rank, and their element-wise sum.
fn in_place_case(ranks: usize, len: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed());
    let host: Vec<Vec<f32>> = (0..ranks)
        .map(|_| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    let sum = (0..len)
        .map(|i| host.iter().map(|h| h[i]).sum::<f32>())
        .collect();
    (host, sum)
}

/// `got` within the rounding of summing `ranks` values of magnitude 1 of `want`.
fn check_sum(what: &str, got: &[f32], want: &[f32], ranks: usize) -> R {
    ensure!(got.len() == want.len(), "{what}: length {}", got.len());
    let tol = 4.0 * f32::EPSILON * ranks as f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!((g - w).abs() <= tol, "{what} element {i}: {g} vs {w}");
    }
    Ok(())
}

/// In-place all-reduce in a group (2 and 17 ranks on one GPU: one launch, and inputs
/// folded over several; direct and host-staged) and through thread-per-rank
/// `RankComm`s: every rank's buffer ends as the sum of all ranks' inputs.
fn kernels_all_reduce_in_place() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let d = dev0()?;
    let len = 1003;
    for (n, transport) in [
        (2, Transport::Auto),
        (17, Transport::Auto),
        (2, Transport::HostStaged),
    ] {
        let devices = vec![Arc::clone(&d); n];
        let opts = CommOptions::kernels().with_transport(transport);
        let comm = Communicator::new(&mut ctx, &devices, opts).ctx("new")?;
        let (host, want) = in_place_case(n, len);
        let gpu = ctx.bind(&d).ctx("bind")?;
        let mut bufs: Vec<DeviceSlice<f32>> = host
            .iter()
            .map(|h| gpu.clone_htod(h))
            .collect::<Result<_, _>>()
            .ctx("upload")?;
        drop(gpu);
        ctx.group(&comm, |g| {
            for (r, b) in bufs.iter_mut().enumerate() {
                g.all_reduce_in_place(r, b, Op::Sum)?;
            }
            Ok(())
        })
        .ctx("group")?;
        comm.synchronize(&mut ctx).ctx("sync")?;
        let gpu = ctx.bind(&d).ctx("bind")?;
        for (r, b) in bufs.iter().enumerate() {
            let what = format!("group N={n} {transport:?} rank {r}");
            check_sum(&what, &gpu.dtoh(b).ctx("down")?, &want, n)?;
        }
    }
    let comms =
        Communicator::init_all(&[Arc::clone(&d), d], CommOptions::kernels()).ctx("init_all")?;
    let (host, want) = in_place_case(2, len);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let host = &host;
                s.spawn(move || -> Result<Vec<f32>, String> {
                    let r = comm.rank();
                    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
                    let dev = Arc::clone(comm.device());
                    let gpu = ctx.bind(&dev).ctx("bind")?;
                    let stream = gpu.new_stream().ctx("stream")?;
                    let mut data = gpu.clone_htod(&host[r]).ctx("upload")?;
                    let st = gpu.on(&stream).ctx("on")?;
                    comm.all_reduce_in_place(&st, &mut data, Op::Sum)
                        .ctx("all_reduce_in_place")?;
                    st.synchronize().ctx("sync")?;
                    gpu.dtoh(&data).ctx("down")
                })
            })
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            let got = h.join().map_err(|_| format!("rank {r} panicked"))??;
            check_sum(&format!("RankComm rank {r}"), &got, &want, 2)?;
        }
        Ok(())
    })
}

fn main() {
    // SAFETY: single-threaded here (before run_suite starts any test or thread), so no
    // other thread reads the environment concurrently. NVLS (multicast) stays off.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    common::run_suite(
        "gpu_collective",
        &[
            (
                "mismatched_lengths_are_typed_errors",
                mismatched_lengths_are_typed_errors,
            ),
            (
                "pool_memory_in_a_direct_collective_across_devices_is_refused",
                pool_memory_in_a_direct_collective_across_devices_is_refused,
            ),
            (
                "several_calls_in_one_group_and_views",
                several_calls_in_one_group_and_views,
            ),
            (
                "module_global_views_sharing_memory_are_refused",
                module_global_views_sharing_memory_are_refused,
            ),
            (
                "kernels_group_ranks_on_one_gpu",
                kernels_group_ranks_on_one_gpu,
            ),
            (
                "kernels_many_ranks_on_one_gpu",
                kernels_many_ranks_on_one_gpu,
            ),
            ("kernels_group_host_staged", kernels_group_host_staged),
            (
                "kernels_thread_per_rank_on_one_gpu",
                kernels_thread_per_rank_on_one_gpu,
            ),
            (
                "kernels_rank_comm_never_hangs",
                kernels_rank_comm_never_hangs,
            ),
            ("kernels_all_devices", kernels_all_devices),
            (
                "nccl_rejects_ranks_on_one_gpu",
                nccl_rejects_ranks_on_one_gpu,
            ),
            ("nccl_group_one_device", nccl_group_one_device),
            (
                "nccl_thread_per_rank_one_device",
                nccl_thread_per_rank_one_device,
            ),
            ("nccl_all_devices", nccl_all_devices),
            ("all_reduce_256mb", all_reduce_256mb),
            ("kernels_all_reduce_in_place", kernels_all_reduce_in_place),
        ],
    )
}
