//! `train_mlp --launcher env`: one rank per process, started by a launcher (torchrun,
//! mpirun, srun, or `train_mlp --spawn N`, see `launch.rs`).
//!
//! Rank, world size and local rank come from the launcher's variables
//! ([`LaunchEnv::from_env`]). Each process holds one full replica and trains on its shard
//! of every batch — rows `r·shard .. (r+1)·shard` of each step's batch, exactly the shard
//! rank `r` gets in the in-process run — and the gradient all-reduce goes through a
//! [`RankComm`]: NCCL ([`RankComm::from_launch`]) or gpubind's own kernels across the
//! processes of one machine ([`RankComm::from_launch_kernels`], several ranks per GPU).
//! Rank 0 prints the same lines as the in-process run.
//!
//! **Bit-for-bit the in-process run.** With the own kernels, a process run and the
//! in-process run (`--devices` listing the same GPUs) take the same steps bit for bit:
//! each rank's forward and backward are the same kernels and cuBLAS calls on the same
//! shard (one cuBLAS handle per replica, used on one stream: cuBLAS's reproducibility
//! condition); both all-reduces are the same reduce kernel summing the ranks' gradients
//! in rank order (in-process over the ranks' buffers, across processes over the ranks'
//! staging copies, which hold the same bits); and the loss of a step is the sum, in f64
//! and in rank order, of every rank's f32 shard loss (here gathered to every rank with an
//! all-gather, then summed on the host in the same order as `step.rs`'s
//! `gather_losses`). NCCL's all-reduce has its own order: with more than two ranks its
//! sums may differ in the last bits from the own kernels' (with two, `a + b == b + a`).

use super::launch::{choose_nccl, device_of};
use super::mlp::{self, Gradients, Kernels, PinnedBatch, Replica, Shape};
use super::{Args, H200_FP32_TFLOPS, Trained, train_epochs};
use gpubind::collective::LaunchEnv;
use gpubind::collective::{Op, RankComm};
use gpubind::{Device, Error, ThreadContext};
use std::path::Path;

/// FNV-1a 64 of this machine's host name: which ranks share a machine, for the count of
/// distinct GPUs in the `RESULT` line.
fn host_hash() -> u64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    name.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `--save-run DIR`: `step_losses.f64` (every step's summed loss over all ranks,
/// epoch by epoch, little-endian f64) and `params.f32` (rank 0's final parameters, the
/// six tensors W1 b1 W2 b2 W3 b3 back to back, little-endian f32, as `--dump-data`'s
/// `params.f32`). Byte-compared by `tests/gpu_train_launch.rs`.
pub fn save_run(dir: &Path, step_losses: &[f64], params: &[Vec<f32>]) -> gpubind::Result<()> {
    let io = |what: &str, e: std::io::Error| {
        Error::InvalidArgument(format!("--save-run {}: {what}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("create", e))?;
    let losses: Vec<u8> = step_losses.iter().flat_map(|l| l.to_le_bytes()).collect();
    let flat: Vec<u8> = params
        .iter()
        .flatten()
        .flat_map(|p| p.to_le_bytes())
        .collect();
    std::fs::write(dir.join("step_losses.f64"), losses).map_err(|e| io("step_losses.f64", e))?;
    std::fs::write(dir.join("params.f32"), flat).map_err(|e| io("params.f32", e))
}

/// Runs this process's rank; errors name the rank.
pub fn run(args: &Args) -> Result<(), String> {
    let env = LaunchEnv::from_env().map_err(|e| e.to_string())?;
    let rank = env.rank;
    run_rank(args, &env).map_err(|e| format!("rank {rank} of {}: {e}", env.world_size))
}

fn run_rank(args: &Args, env: &LaunchEnv) -> gpubind::Result<()> {
    let (rank, world) = (env.rank, env.world_size);
    if let (Some(list), Some(local)) = (&args.devices, env.local_world_size)
        && list.len() != local
    {
        return Err(Error::InvalidArgument(format!(
            "--devices lists {} device(s) for {local} processes on this machine: list one per local rank",
            list.len()
        )));
    }
    if !args.batch.is_multiple_of(world) {
        return Err(Error::InvalidArgument(format!(
            "--batch {} is not divisible by {world} ranks",
            args.batch
        )));
    }
    let count = Device::count()?;
    let ordinal = device_of(args.devices.as_deref(), env.local_rank, count)?;
    let nccl = choose_nccl(args.nccl, env, args.devices.as_deref(), count)?;
    let dev = Device::get(ordinal)?;
    let mut ctx = ThreadContext::acquire()?;
    let mut comm = if nccl {
        RankComm::from_launch(&mut ctx, &dev, env)?
    } else {
        RankComm::from_launch_kernels(&mut ctx, &dev, env)?
    };
    // The same data, weights and shards as the in-process run (`main.rs`'s `run`).
    let shard = args.batch / world;
    let steps = args.steps_per_epoch;
    let shape = Shape {
        input: 32,
        hidden: args.hidden,
        classes: 8,
    };
    let (x, y) = mlp::teacher_data(shape, args.batch * steps, args.seed);
    let params = mlp::init_params(shape, args.seed.wrapping_add(17));
    let gpu = ctx.bind(&dev)?;
    let mut rep = Replica::with_loss_slots(&gpu, shape, &params, shard, steps)?;
    let kernels = Kernels::load(&gpu)?;
    let f = kernels.fns()?;
    let batches = (0..steps)
        .map(|step| {
            let rows = step * args.batch + rank * shard;
            PinnedBatch::new(
                &gpu,
                &x[rows * shape.input..(rows + shard) * shape.input],
                &y[rows..rows + shard],
            )
        })
        .collect::<gpubind::Result<Vec<_>>>()?;
    let stream = gpu.new_stream()?;
    let s = gpu.on(&stream)?;

    // Every rank's (host, GPU), for the header and the count of distinct GPUs.
    let me = gpu.clone_htod(&[host_hash() as i64, ordinal as i64])?;
    let mut where_all = gpu.alloc_zeros::<i64>(2 * world)?;
    comm.all_gather(&s, &me, &mut where_all)?;
    s.synchronize()?;
    let places: Vec<(i64, i64)> = gpu
        .dtoh(&where_all)?
        .chunks(2)
        .map(|p| (p[0], p[1]))
        .collect();
    if rank == 0 {
        let names: Vec<String> = places
            .iter()
            .map(|&(_, o)| format!("{o}:{}", dev.name()))
            .collect();
        println!(
            "train_mlp: {world} rank(s) [{}], backend {}, one process per rank ({:?} launch), MLP {}-{}-{}-{}, batch {} ({shard} per rank), {steps} steps/epoch",
            names.join(", "),
            if nccl { "Nccl" } else { "Kernels" },
            env.launcher,
            shape.input,
            shape.hidden,
            shape.hidden,
            shape.classes,
            args.batch,
        );
    }

    let mu = 0.9f32;
    let mut loss_send = gpu.alloc_zeros::<f32>(steps)?;
    let mut loss_all = gpu.alloc_zeros::<f32>(world * steps)?;
    let samples = args.batch * steps;
    let Trained {
        first_loss,
        last_loss,
        throughput,
        step_losses,
    } = train_epochs(args.epochs, samples, rank == 0, || {
        for (step, batch) in batches.iter().enumerate() {
            rep.upload(&s, batch)?;
            rep.forward_backward_slot(&s, &f, args.batch, step)?;
            comm.all_reduce(&s, &rep.grads, &mut rep.reduced, Op::Sum)?;
            rep.sgd(&s, &f, args.lr, mu, Gradients::Reduced)?;
        }
        s.synchronize()?;
        // Every rank's loss slots, summed as `step.rs`'s gather_losses sums them.
        gpu.htod_copy(&rep.losses(&gpu)?, &mut loss_send)?;
        comm.all_gather(&s, &loss_send, &mut loss_all)?;
        s.synchronize()?;
        let gathered = gpu.dtoh(&loss_all)?;
        let mut losses = vec![0.0f64; steps];
        for per_rank in gathered.chunks(steps) {
            for (t, l) in losses.iter_mut().zip(per_rank) {
                *t += *l as f64;
            }
        }
        Ok(losses)
    })?;
    if rank != 0 {
        return Ok(());
    }
    // Held-out accuracy of rank 0's replica, as in-process.
    let (test_x, test_y) = mlp::teacher_data(shape, shard, args.seed ^ 0x7E57);
    rep.load_batch(&gpu, &test_x, &test_y)?;
    rep.forward(&gpu.default_stream(), &f)?;
    gpu.synchronize()?;
    let logits = rep.logits(&gpu)?;
    let correct = (0..shard)
        .filter(|&i| {
            mlp::argmax(&logits[i * shape.classes..(i + 1) * shape.classes]) as u32 == test_y[i]
        })
        .count();
    println!(
        "final: loss {last_loss:.4} (from {:.4}), held-out accuracy {:.1}% ({correct}/{shard}), {throughput:.0} samples/s over epochs 1..{} on {world} rank(s)",
        first_loss,
        100.0 * correct as f64 / shard as f64,
        args.epochs
    );
    let tflops = throughput * shape.flops_per_sample() / 1e12;
    let mut distinct = places.clone();
    distinct.sort_unstable();
    distinct.dedup();
    println!(
        "RESULT impl=gpubind mode=eager batch={} ranks={world} samples_per_s={throughput:.0} tflops={tflops:.3} frac_fp32={:.4}",
        args.batch,
        tflops / (H200_FP32_TFLOPS * distinct.len() as f64)
    );
    if let Some(dir) = &args.save_run {
        save_run(dir, &step_losses, &rep.params(&gpu)?)?;
    }
    Ok(())
}
