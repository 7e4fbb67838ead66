//! GPU tests of the training example's model (examples/train_mlp/mlp.rs): one step matches
//! the CPU reference (also at sizes that exercise the reduction kernels' edges), a tiny
//! training run's loss falls, the asynchronous epoch path gives the same bits as the
//! step-by-step one and as itself on a second run, and bad shapes are typed errors.

#[macro_use]
mod common;
#[path = "../examples/train_mlp/mlp.rs"]
mod mlp;

use common::{Ctx, run_suite};
use gpubind::{Device, ThreadContext};
use mlp::{Gradients, Kernels, PinnedBatch, Replica, Shape};

type R = Result<(), String>;

const SHAPE: Shape = Shape {
    input: 16,
    hidden: 64,
    classes: 4,
};

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

fn one_step_matches_cpu_reference() -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let rows = 256;
    let params = mlp::init_params(SHAPE, seed);
    let (x, y) = mlp::teacher_data(SHAPE, rows, seed ^ 1);
    let (lr, mu) = (0.05f32, 0.9f32);
    // CPU: gradients and one SGD step.
    let (cpu_loss, cpu_grads) = mlp::cpu_gradients(SHAPE, &params, &x, &y, rows);
    let mut cpu_params = params.clone();
    let mut vel: Vec<Vec<f32>> = cpu_params.iter().map(|p| vec![0.0; p.len()]).collect();
    mlp::cpu_sgd(&mut cpu_params, &mut vel, &cpu_grads, lr, mu);
    // GPU: the same.
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut rep = Replica::new(&gpu, SHAPE, &params, rows).ctx("replica")?;
    let kernels = Kernels::load(&gpu).ctx("kernels")?;
    let f = kernels.fns().ctx("fns")?;
    rep.load_batch(&gpu, &x, &y).ctx("batch")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    rep.forward_backward(&s, &f, rows).ctx("forward_backward")?;
    s.synchronize().ctx("sync")?;
    let gpu_loss = rep.loss_sum(&gpu).ctx("loss")?;
    ensure!(
        ((gpu_loss - cpu_loss) / cpu_loss).abs() < 1e-4,
        "loss {gpu_loss} vs cpu {cpu_loss}"
    );
    let gpu_grads = rep.grads(&gpu).ctx("grads")?;
    for (t, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        let scale = max_abs(c).max(1e-12);
        for (i, (a, b)) in g.iter().zip(c).enumerate() {
            ensure!(
                (a - b).abs() <= 1e-4 * scale,
                "grad tensor {t}[{i}]: gpu {a} cpu {b} (max |g| {scale})"
            );
        }
    }
    rep.sgd(&s, &f, lr, mu, Gradients::Local).ctx("sgd")?;
    s.synchronize().ctx("sync")?;
    let gpu_params = rep.params(&gpu).ctx("params")?;
    for (t, (g, c)) in gpu_params.iter().zip(&cpu_params).enumerate() {
        for (i, (a, b)) in g.iter().zip(c).enumerate() {
            ensure!(
                (a - b).abs() <= 1e-4 * b.abs().max(1e-3),
                "param {t}[{i}]: gpu {a} cpu {b}"
            );
        }
    }
    println!(
        "    loss {gpu_loss:.4} (cpu {cpu_loss:.4}); gradients and step match to 1e-4 relative"
    );
    Ok(())
}

fn matmul_matches_cpu() -> R {
    use gpubind::blas::Matmul;
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let blas = gpu.new_blas().ctx("blas")?;
    let s = gpu.default_stream();
    for (m, n, k) in [(1, 1, 1), (3, 5, 7), (64, 33, 17), (2, 300, 129)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut shape = Matmul::new(m, n, k).scaled(0.5, 2.0);
            shape.transpose_a = ta;
            shape.transpose_b = tb;
            let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
            let mut dc = gpu.clone_htod(&c0).ctx("c")?;
            s.matmul(&blas, &shape, &da, &db, &mut dc).ctx("matmul")?;
            let got = gpu.dtoh(&dc).ctx("dtoh")?;
            let prod = mlp::cpu_matmul(&a, &b, m, n, k, ta, tb);
            for i in 0..m * n {
                let want = 0.5 * prod[i] + 2.0 * c0[i];
                ensure!(
                    (got[i] - want).abs() <= 1e-4 * (k as f32).sqrt().max(1.0),
                    "{m}x{n}x{k} ta={ta} tb={tb} [{i}]: {} vs {want}",
                    got[i]
                );
            }
        }
    }
    let (a, b) = (
        gpu.alloc_zeros::<f32>(6).ctx("a")?,
        gpu.alloc_zeros::<f32>(6).ctx("b")?,
    );
    let mut c = gpu.alloc_zeros::<f32>(5).ctx("c")?;
    let e = s
        .matmul(&blas, &Matmul::new(2, 2, 3), &a, &b, &mut c)
        .unwrap_err();
    ensure!(
        matches!(
            e,
            gpubind::Error::Matmul(gpubind::blas::MatmulError::BufferSize {
                operand: "C",
                expected: 4,
                found: 5,
                exact: true,
                ..
            })
        ),
        "C size: {e:?}"
    );
    Ok(())
}

fn tiny_training_run_loss_falls() -> R {
    let rows = 512;
    let params = mlp::init_params(SHAPE, 42);
    let (x, y) = mlp::teacher_data(SHAPE, rows * 8, 7);
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let mut rep = Replica::new(&gpu, SHAPE, &params, rows).ctx("replica")?;
    let kernels = Kernels::load(&gpu).ctx("kernels")?;
    let f = kernels.fns().ctx("fns")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let (mut first, mut last) = (None, 0.0);
    for epoch in 0..40 {
        let mut total = 0.0;
        for b in 0..8 {
            let xs = &x[b * rows * SHAPE.input..(b + 1) * rows * SHAPE.input];
            let ys = &y[b * rows..(b + 1) * rows];
            rep.load_batch(&gpu, xs, ys).ctx("batch")?;
            rep.forward_backward(&s, &f, rows).ctx("fb")?;
            rep.sgd(&s, &f, 0.1, 0.9, Gradients::Local).ctx("sgd")?;
            s.synchronize().ctx("sync")?;
            total += rep.loss_sum(&gpu).ctx("loss")? / rows as f64;
        }
        let mean = total / 8.0;
        first.get_or_insert(mean);
        last = mean;
        if epoch % 10 == 0 {
            println!("    epoch {epoch}: loss {mean:.4}");
        }
    }
    let first = first.unwrap_or(0.0);
    println!("    loss {first:.4} -> {last:.4}");
    ensure!(last < 0.5 * first, "loss fell only from {first} to {last}");
    Ok(())
}

/// Data parallelism through the group all-reduce: 2 ranks on one GPU (own kernels) and 1
/// rank through NCCL must take the same step as one replica on the whole batch, and the
/// two replicas must stay identical.
fn data_parallel_step_matches_single_replica() -> R {
    use gpubind::collective::{CommOptions, Communicator};
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let batch = 512;
    let (lr, mu) = (0.05f32, 0.9f32);
    let params = mlp::init_params(SHAPE, seed);
    let (x, y) = mlp::teacher_data(SHAPE, batch, seed ^ 3);
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    // Reference: one replica, whole batch.
    let reference = {
        let gpu = ctx.bind(&dev).ctx("bind")?;
        let mut rep = Replica::new(&gpu, SHAPE, &params, batch).ctx("replica")?;
        let kernels = Kernels::load(&gpu).ctx("kernels")?;
        let f = kernels.fns().ctx("fns")?;
        rep.load_batch(&gpu, &x, &y).ctx("batch")?;
        let s = gpu.default_stream();
        rep.forward_backward(&s, &f, batch).ctx("fb")?;
        rep.sgd(&s, &f, lr, mu, Gradients::Local).ctx("sgd")?;
        gpu.synchronize().ctx("sync")?;
        rep.params(&gpu).ctx("params")?
    };
    let mut cases = vec![(
        "own kernels, 2 ranks on GPU 0",
        vec![dev.clone(), dev.clone()],
        CommOptions::kernels(),
    )];
    if gpubind::collective::nccl_available() {
        cases.push(("NCCL, 1 rank", vec![dev.clone()], CommOptions::nccl()));
    } else {
        println!("    SKIPPED: the NCCL case (libnccl not found)");
    }
    for (label, devices, options) in cases {
        let comm = Communicator::new(&mut ctx, &devices, options).ctx("communicator")?;
        let shard = batch / devices.len();
        let mut replicas = Vec::new();
        let mut kernels = Vec::new();
        for d in &devices {
            let gpu = ctx.bind(d).ctx("bind")?;
            replicas.push(Replica::new(&gpu, SHAPE, &params, shard).ctx("replica")?);
            kernels.push(Kernels::load(&gpu).ctx("kernels")?);
        }
        let fns = kernels
            .iter()
            .map(Kernels::fns)
            .collect::<gpubind::Result<Vec<_>>>()
            .ctx("fns")?;
        let loss = mlp::data_parallel_step(
            &mut ctx,
            &comm,
            &devices,
            &mut replicas,
            &fns,
            &x,
            &y,
            lr,
            mu,
        )
        .ctx("data_parallel_step")?;
        let got: Vec<Vec<Vec<f32>>> = devices
            .iter()
            .zip(&replicas)
            .map(|(d, rep)| {
                let gpu = ctx.bind(d).map_err(|e| e.to_string())?;
                rep.params(&gpu).map_err(|e| e.to_string())
            })
            .collect::<Result<_, String>>()?;
        for (r, p) in got.iter().enumerate() {
            ensure!(p == &got[0], "{label}: replica {r} diverged from replica 0");
            for (t, (a, b)) in p.iter().zip(&reference).enumerate() {
                for (i, (u, v)) in a.iter().zip(b).enumerate() {
                    ensure!(
                        (u - v).abs() <= 1e-5 * v.abs().max(1e-2),
                        "{label}: param {t}[{i}] {u} vs single-replica {v}"
                    );
                }
            }
        }
        println!(
            "    {label}: loss {:.4}; replicas identical and equal to the single-replica step",
            loss / batch as f64
        );
    }
    Ok(())
}

/// Checks GPU tensors against the CPU's (f64 sums), each to `tol` of its largest magnitude.
fn close_to(label: &str, gpu: &[Vec<f32>], cpu: &[Vec<f32>], tol: f32) -> R {
    ensure!(
        gpu.len() == cpu.len(),
        "{label}: {} tensors vs {}",
        gpu.len(),
        cpu.len()
    );
    for (t, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        ensure!(
            g.len() == c.len(),
            "{label}: tensor {t} has {} elements vs {}",
            g.len(),
            c.len()
        );
        let scale = max_abs(c).max(1e-6);
        for (i, (a, b)) in g.iter().zip(c).enumerate() {
            ensure!(
                (a - b).abs() <= tol * scale,
                "{label}: tensor {t}[{i}]: gpu {a} cpu {b} (max |cpu| {scale}, tolerance {tol})"
            );
        }
    }
    Ok(())
}

/// One step's loss and gradients match the CPU at shapes that exercise the reduction
/// kernels' edges: row counts that are not multiples of the 64-row chunks or of a block's
/// rows, more rows than 1024 chunks (several rows per chunk, empty last chunks), hidden
/// widths that are not multiples of 32, and 1, 3, 5 and 32 classes (1, 4, 8 and 32 lanes
/// per softmax row).
fn reductions_match_cpu_at_odd_sizes() -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let kernels = Kernels::load(&gpu).ctx("kernels")?;
    let f = kernels.fns().ctx("fns")?;
    let s = gpu.default_stream();
    for (input, hidden, classes, rows) in [
        (16, 40, 5, 1000),
        (16, 64, 4, 8229),
        (8, 33, 32, 70),
        (8, 16, 1, 3),
        (4, 8, 3, 70_001),
    ] {
        let shape = Shape {
            input,
            hidden,
            classes,
        };
        let label = format!("{input}-{hidden}-{hidden}-{classes}, {rows} rows");
        let params = mlp::init_params(shape, seed);
        let (x, y) = mlp::teacher_data(shape, rows, seed ^ 11);
        // Scale by a global batch twice the shard, as a 2-rank step would.
        let (cpu_loss, cpu_grads) = mlp::cpu_gradients(shape, &params, &x, &y, 2 * rows);
        let mut rep = Replica::new(&gpu, shape, &params, rows).ctx("replica")?;
        rep.load_batch(&gpu, &x, &y).ctx("batch")?;
        rep.forward_backward(&s, &f, 2 * rows)
            .ctx("forward_backward")?;
        let gpu_loss = rep.loss_sum(&gpu).ctx("loss")?;
        ensure!(
            (gpu_loss - cpu_loss).abs() <= 1e-4 * cpu_loss.abs().max(1.0),
            "{label}: loss {gpu_loss} vs cpu {cpu_loss}"
        );
        // FP32 sums over `rows` terms (cuBLAS's and ours) drift from the f64 reference
        // like sqrt(rows); a wrong index or a lost chunk is off by O(1).
        let tol = 1e-4 * (rows as f32 / 256.0).sqrt().max(1.0);
        close_to(&label, &rep.grads(&gpu).ctx("grads")?, &cpu_grads, tol)?;
        println!("    {label}: loss and gradients match");
    }
    Ok(())
}

/// One replica's parameters: the six tensors.
type ReplicaParams = Vec<Vec<f32>>;

/// How [`train_run`] drives the steps.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    /// `data_parallel_step`: synchronous upload, one host wait per step.
    StepByStep,
    /// `train_steps`: page-locked uploads, loss slots, one host wait per epoch.
    Epoch,
    /// `capture_steps` once, then `launch_steps` per epoch: one CUDA graph per step.
    Graph,
}

/// Trains `epochs` × `steps` steps of `batch` rows from `params` on `devices` (one
/// communicator) along `path`. Returns the per-step losses and every replica's
/// parameters.
#[allow(clippy::too_many_arguments)]
fn train_run(
    ctx: &mut ThreadContext,
    devices: &[std::sync::Arc<Device>],
    params: &[Vec<f32>],
    x: &[f32],
    y: &[u32],
    batch: usize,
    (epochs, steps): (usize, usize),
    path: Path,
) -> Result<(Vec<f64>, Vec<ReplicaParams>), String> {
    use gpubind::collective::{CommOptions, Communicator};
    let (lr, mu) = (0.05f32, 0.9f32);
    let comm = Communicator::new(ctx, devices, CommOptions::kernels()).ctx("communicator")?;
    let shard = batch / devices.len();
    let input = SHAPE.input;
    let mut replicas = Vec::new();
    let mut kernels = Vec::new();
    let mut batches: Vec<Vec<PinnedBatch>> = (0..steps).map(|_| Vec::new()).collect();
    for (r, d) in devices.iter().enumerate() {
        let gpu = ctx.bind(d).ctx("bind")?;
        replicas.push(Replica::with_loss_slots(&gpu, SHAPE, params, shard, steps).ctx("replica")?);
        kernels.push(Kernels::load(&gpu).ctx("kernels")?);
        for (step, shards) in batches.iter_mut().enumerate() {
            let rows = step * batch + r * shard;
            shards.push(
                PinnedBatch::new(
                    &gpu,
                    &x[rows * input..(rows + shard) * input],
                    &y[rows..rows + shard],
                )
                .ctx("pinned batch")?,
            );
        }
    }
    let fns = kernels
        .iter()
        .map(Kernels::fns)
        .collect::<gpubind::Result<Vec<_>>>()
        .ctx("fns")?;
    let mut losses = Vec::new();
    match path {
        Path::Epoch => {
            for _ in 0..epochs {
                losses.extend(
                    mlp::train_steps(
                        ctx,
                        &comm,
                        devices,
                        &mut replicas,
                        &fns,
                        &batches,
                        batch,
                        lr,
                        mu,
                    )
                    .ctx("train_steps")?,
                );
            }
        }
        Path::StepByStep => {
            for step in (0..epochs).flat_map(|_| 0..steps) {
                let rows = step * batch;
                losses.push(
                    mlp::data_parallel_step(
                        ctx,
                        &comm,
                        devices,
                        &mut replicas,
                        &fns,
                        &x[rows * input..(rows + batch) * input],
                        &y[rows..rows + batch],
                        lr,
                        mu,
                    )
                    .ctx("data_parallel_step")?,
                );
            }
        }
        Path::Graph => {
            let gpu = ctx.bind(&devices[0]).ctx("bind")?;
            let views = replicas
                .iter()
                .map(mlp::StepViews::new)
                .collect::<gpubind::Result<Vec<_>>>()
                .ctx("views")?;
            let plan = mlp::StepPlan {
                comm: &comm,
                views: &views,
                fns: &fns,
                global_batch: batch,
                lr,
                mu,
            };
            let blas = gpu.new_blas().ctx("blas")?;
            let graphs = mlp::capture_steps(&gpu, &blas, &plan, &batches).ctx("capture")?;
            drop(blas); // the graphs keep its workspace
            let stream = gpu.new_stream().ctx("stream")?;
            for _ in 0..epochs {
                losses
                    .extend(mlp::launch_steps(&gpu, &stream, &graphs, &views).ctx("launch_steps")?);
            }
        }
    }
    let mut out = Vec::new();
    for (d, rep) in devices.iter().zip(&replicas) {
        let gpu = ctx.bind(d).ctx("bind")?;
        out.push(rep.params(&gpu).ctx("params")?);
    }
    Ok((losses, out))
}

/// The epoch path (asynchronous uploads from page-locked memory, losses written by a
/// kernel into page-locked slots, one host wait for all steps) takes exactly the steps of
/// the step-by-step path, bit for bit; a second run from the same seed repeats the bits
/// (every reduction has a fixed order); replicas stay identical; and every step's loss is
/// finite and positive. For 1 rank and for 2 ranks on GPU 0.
fn epoch_path_matches_step_by_step_and_repeats() -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let (batch, steps) = (512, 6);
    let params = mlp::init_params(SHAPE, seed);
    let (x, y) = mlp::teacher_data(SHAPE, batch * steps, seed ^ 5);
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    for ranks in [1, 2] {
        let devices = vec![dev.clone(); ranks];
        let run = |ctx: &mut ThreadContext, path| {
            train_run(ctx, &devices, &params, &x, &y, batch, (1, steps), path)
        };
        let (l_step, p_step) = run(&mut ctx, Path::StepByStep)?;
        let (l_epoch, p_epoch) = run(&mut ctx, Path::Epoch)?;
        let (l_again, p_again) = run(&mut ctx, Path::Epoch)?;
        ensure!(
            l_epoch.len() == steps && l_epoch.iter().all(|l| l.is_finite() && *l > 0.0),
            "{ranks} rank(s): losses {l_epoch:?}"
        );
        ensure!(
            l_epoch == l_step,
            "{ranks} rank(s): epoch losses {l_epoch:?} vs step-by-step {l_step:?}"
        );
        ensure!(
            p_epoch == p_step,
            "{ranks} rank(s): epoch-path parameters differ from step-by-step"
        );
        ensure!(
            l_again == l_epoch,
            "{ranks} rank(s): second run's losses {l_again:?} vs {l_epoch:?}"
        );
        ensure!(
            p_again == p_epoch,
            "{ranks} rank(s): second run's parameters differ"
        );
        for (r, p) in p_epoch.iter().enumerate() {
            ensure!(
                p == &p_epoch[0],
                "{ranks} rank(s): replica {r} diverged from replica 0"
            );
        }
        println!(
            "    {ranks} rank(s): loss {:.4} -> {:.4}; epoch path = step-by-step = second run, bit for bit",
            l_epoch[0] / batch as f64,
            l_epoch[steps - 1] / batch as f64
        );
    }
    Ok(())
}

/// `--graph`: one CUDA graph per step (upload, forward, backward, all-reduce, SGD of
/// every rank) takes exactly the eager epoch path's steps, bit for bit, over three epochs
/// (each graph launched three times: it reads its inputs and the evolving parameters at
/// each launch, and writes its loss slot again); for 1 rank and 2 ranks on GPU 0. (Ranks
/// on two devices: `Capture::all_reduce` refuses them with `NotCapturable`, tested in
/// gpu_graphs where 2 GPUs are visible.)
fn graph_steps_match_eager_bit_for_bit() -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let (batch, steps, epochs) = (512, 4, 3);
    let params = mlp::init_params(SHAPE, seed);
    let (x, y) = mlp::teacher_data(SHAPE, batch * steps, seed ^ 9);
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    for ranks in [1, 2] {
        let devices = vec![dev.clone(); ranks];
        let run = |ctx: &mut ThreadContext, path| {
            train_run(ctx, &devices, &params, &x, &y, batch, (epochs, steps), path)
        };
        let (l_eager, p_eager) = run(&mut ctx, Path::Epoch)?;
        let (l_graph, p_graph) = run(&mut ctx, Path::Graph)?;
        ensure!(
            l_graph.len() == epochs * steps && l_graph.iter().all(|l| l.is_finite() && *l > 0.0),
            "{ranks} rank(s): graph losses {l_graph:?}"
        );
        ensure!(
            l_graph == l_eager,
            "{ranks} rank(s): graph losses {l_graph:?} vs eager {l_eager:?}"
        );
        ensure!(
            p_graph == p_eager,
            "{ranks} rank(s): graph parameters differ from eager"
        );
        ensure!(
            l_graph[epochs * steps - 1] < l_graph[0],
            "{ranks} rank(s): the loss did not fall: {l_graph:?}"
        );
        println!(
            "    {ranks} rank(s): loss {:.4} -> {:.4} over {} graph launches = eager, bit for bit",
            l_graph[0] / batch as f64,
            l_graph[epochs * steps - 1] / batch as f64,
            epochs * steps
        );
    }
    Ok(())
}

/// Bad shapes and arguments are typed errors, not launches that go out of bounds.
fn bad_arguments_are_typed_errors() -> R {
    use gpubind::Error;
    let dev = Device::get(0).ctx("device")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let kernels = Kernels::load(&gpu).ctx("kernels")?;
    let f = kernels.fns().ctx("fns")?;
    let wide = Shape {
        input: 4,
        hidden: 8,
        classes: 33,
    };
    let e = Replica::new(&gpu, wide, &mlp::init_params(wide, 1), 16).err();
    ensure!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "33 classes: {e:?}"
    );
    let params = mlp::init_params(SHAPE, 1);
    let e = Replica::new(&gpu, SHAPE, &params[..5], 16).err();
    ensure!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "5 tensors: {e:?}"
    );
    let e = Replica::with_loss_slots(&gpu, SHAPE, &params, 16, 0).err();
    ensure!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "0 slots: {e:?}"
    );
    let e = Replica::new(&gpu, SHAPE, &params, 1 << 28).err();
    ensure!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "2^28 rows × 64: {e:?}"
    );
    let mut rep = Replica::with_loss_slots(&gpu, SHAPE, &params, 16, 2).ctx("replica")?;
    let s = gpu.default_stream();
    let e = rep.forward_backward_slot(&s, &f, 16, 2).unwrap_err();
    ensure!(matches!(e, Error::InvalidArgument(_)), "slot 2 of 2: {e:?}");
    let e = rep.forward_backward_slot(&s, &f, 0, 0).unwrap_err();
    ensure!(
        matches!(e, Error::InvalidArgument(_)),
        "global batch 0: {e:?}"
    );
    let (x, y) = mlp::teacher_data(SHAPE, 8, 3);
    let short = PinnedBatch::new(&gpu, &x, &y).ctx("pinned")?;
    let e = rep.upload(&s, &short).unwrap_err();
    ensure!(
        matches!(e, Error::SizeMismatch { .. }),
        "8-row batch into 16 rows: {e:?}"
    );
    Ok(())
}

fn main() {
    // SAFETY: single-threaded here (before any test or thread starts). NVLS stays off.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    run_suite(
        "gpu_train",
        &[
            (
                "one_step_matches_cpu_reference",
                one_step_matches_cpu_reference,
            ),
            ("matmul_matches_cpu", matmul_matches_cpu),
            ("tiny_training_run_loss_falls", tiny_training_run_loss_falls),
            (
                "data_parallel_step_matches_single_replica",
                data_parallel_step_matches_single_replica,
            ),
            (
                "reductions_match_cpu_at_odd_sizes",
                reductions_match_cpu_at_odd_sizes,
            ),
            (
                "epoch_path_matches_step_by_step_and_repeats",
                epoch_path_matches_step_by_step_and_repeats,
            ),
            (
                "graph_steps_match_eager_bit_for_bit",
                graph_steps_match_eager_bit_for_bit,
            ),
            (
                "bad_arguments_are_typed_errors",
                bad_arguments_are_typed_errors,
            ),
        ],
    );
}
