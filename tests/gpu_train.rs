//! GPU tests of the training example's model (examples/train_mlp/mlp.rs): one step matches
//! the CPU reference, and a tiny training run's loss falls.

#[macro_use]
mod common;
#[path = "../examples/train_mlp/mlp.rs"]
mod mlp;

use common::{Ctx, run_suite};
use gpubind::{Device, ThreadContext};
use mlp::{Gradients, Replica, Shape};

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
    rep.load_batch(&gpu, &x, &y).ctx("batch")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    rep.forward_backward(&s, rows).ctx("forward_backward")?;
    s.synchronize().ctx("sync")?;
    let gpu_loss = rep.loss_sum(&gpu).ctx("loss")?;
    ensure!(
        ((gpu_loss - cpu_loss) / cpu_loss).abs() < 1e-4,
        "loss {gpu_loss} vs cpu {cpu_loss}"
    );
    let gpu_grads = rep.download(&gpu, &rep.grads).ctx("grads")?;
    for (t, (g, c)) in gpu_grads.iter().zip(&cpu_grads).enumerate() {
        let scale = max_abs(c).max(1e-12);
        for (i, (a, b)) in g.iter().zip(c).enumerate() {
            ensure!(
                (a - b).abs() <= 1e-4 * scale,
                "grad tensor {t}[{i}]: gpu {a} cpu {b} (max |g| {scale})"
            );
        }
    }
    rep.sgd(&s, lr, mu, Gradients::Local).ctx("sgd")?;
    s.synchronize().ctx("sync")?;
    let gpu_params = rep.download(&gpu, &rep.params).ctx("params")?;
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
    let mut blas = gpu.new_blas().ctx("blas")?;
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
            s.matmul(&mut blas, &shape, &da, &db, &mut dc)
                .ctx("matmul")?;
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
        .matmul(&mut blas, &Matmul::new(2, 2, 3), &a, &b, &mut c)
        .unwrap_err();
    ensure!(
        matches!(
            e,
            gpubind::Error::SizeMismatch {
                expected: 4,
                found: 5,
                ..
            }
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
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let (mut first, mut last) = (None, 0.0);
    for epoch in 0..40 {
        let mut total = 0.0;
        for b in 0..8 {
            let xs = &x[b * rows * SHAPE.input..(b + 1) * rows * SHAPE.input];
            let ys = &y[b * rows..(b + 1) * rows];
            rep.load_batch(&gpu, xs, ys).ctx("batch")?;
            rep.forward_backward(&s, rows).ctx("fb")?;
            rep.sgd(&s, 0.1, 0.9, Gradients::Local).ctx("sgd")?;
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
        rep.load_batch(&gpu, &x, &y).ctx("batch")?;
        let s = gpu.default_stream();
        rep.forward_backward(&s, batch).ctx("fb")?;
        rep.sgd(&s, lr, mu, Gradients::Local).ctx("sgd")?;
        gpu.synchronize().ctx("sync")?;
        rep.download(&gpu, &rep.params).ctx("params")?
    };
    let mut cases = vec![(
        "own kernels, 2 ranks on GPU 0",
        vec![dev.clone(), dev.clone()],
        CommOptions::kernels(),
    )];
    if gpubind::nccl_available() {
        cases.push(("NCCL, 1 rank", vec![dev.clone()], CommOptions::nccl()));
    } else {
        println!("    SKIPPED: the NCCL case (libnccl not found)");
    }
    for (label, devices, options) in cases {
        let comm = Communicator::new(&mut ctx, &devices, options).ctx("communicator")?;
        let shard = batch / devices.len();
        let mut replicas = Vec::new();
        for d in &devices {
            let gpu = ctx.bind(d).ctx("bind")?;
            replicas.push(Replica::new(&gpu, SHAPE, &params, shard).ctx("replica")?);
        }
        let loss =
            mlp::data_parallel_step(&mut ctx, &comm, &devices, &mut replicas, &x, &y, lr, mu)
                .ctx("data_parallel_step")?;
        let got: Vec<Vec<Vec<f32>>> = devices
            .iter()
            .zip(&replicas)
            .map(|(d, rep)| {
                let gpu = ctx.bind(d).map_err(|e| e.to_string())?;
                rep.download(&gpu, &rep.params).map_err(|e| e.to_string())
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
        ],
    );
}
