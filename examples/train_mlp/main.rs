//! Data-parallel training of a small MLP on N devices, driven from one thread.
//!
//! ```text
//! cargo run --release --example train_mlp -- [--devices 0,1 | --devices 0,0] [--epochs 20]
//!     [--batch 4096] [--hidden 256] [--lr 0.1] [--backend kernels|nccl] [--seed 1]
//!     [--steps 16] [--graph] [--dump-data DIR] [--save-run DIR]
//! # one process per rank (process.rs): under a launcher, or started by train_mlp itself
//! torchrun --standalone --nproc-per-node N --no-python train_mlp --launcher env [--backend kernels|nccl] …
//! cargo run --release --example train_mlp -- --spawn N [--backend kernels|nccl] [--devices 0,0] …
//! ```
//!
//! Each rank (an entry of `--devices`; default: every visible device, once) holds a full
//! replica of the model and one shard of every batch. A step is: bind each rank's device
//! and enqueue, on its communicator stream, the upload of its shard from page-locked
//! memory, forward + backward (cuBLAS products and NVRTC kernels), then one `ctx.group`
//! all-reduce of the flat gradients over all ranks, then one fused SGD launch on every
//! replica; the step's loss is written by a kernel straight into page-locked host memory.
//! The host enqueues all steps of an epoch (`--steps`) and waits once per epoch. The types
//! make sure each rank's work runs in its own context. The same device may be listed
//! twice (`--devices 0,0`) to exercise two ranks on one GPU.
//!
//! `--graph` captures each step whole — upload, forward, backward, all-reduce, SGD of
//! every rank — into one CUDA graph per batch, and launches one graph per step
//! (`graph.rs`). The results are bit-identical to the eager run's. The all-reduce can be
//! captured only when every rank is on one device (`--devices 0` or `0,0`, own kernels).
//!
//! `--launcher env` runs one rank per process ([`process`]): rank, world size and local
//! rank come from the launcher's variables (torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, or mpirun's and Slurm's, as `gpubind::collective::LaunchEnv` maps them);
//! `--devices` then lists one device per local rank (default: the local rank modulo the
//! visible devices). The backend is `--backend`'s, else NCCL unless two local ranks share
//! a GPU, then the own kernels (one machine only). Each process trains its shard of every
//! batch, the all-reduce goes through a `RankComm`, and rank 0 prints the lines below.
//! `--spawn N` ([`launch`]) starts N such processes itself, with torchrun's variables on
//! 127.0.0.1, forwards rank 0's output, and fails (killing the rest) if one rank fails.
//! With the own kernels, `--spawn 2 --devices 0,0` and the in-process `--devices 0,0` give
//! the same losses and parameters bit for bit (see [`process`]). `--save-run DIR` writes
//! every step's loss and the final parameters ([`process::save_run`]) for comparing runs.
//!
//! The task is synthetic and seeded: labels are the argmax of a fixed random teacher MLP.
//!
//! `--dump-data DIR` writes the run's training data and initial parameters (little-endian
//! raw files: `x.f32` rows×input, `y.u32`, `params.f32` with W1 b1 W2 b2 W3 b3 back to
//! back, each W row-major input×output, and `meta.txt`) and exits without touching a GPU:
//! `scripts/torch_mlp.py --data DIR` trains PyTorch on exactly the same data and weights.
//!
//! The last line is machine-readable (`scripts/compare-train.sh` reads it):
//! `RESULT impl=gpubind mode=eager|graph batch=B ranks=R samples_per_s=S tflops=T frac_fp32=F`,
//! with `tflops` counted as `2·M·N·K` per matrix product of the step
//! ([`mlp::Shape::flops_per_sample`]) over epochs 1.. and `frac_fp32` its fraction of
//! [`H200_FP32_TFLOPS`] times the number of distinct devices.

#[path = "launch.rs"]
mod launch;
#[path = "mlp.rs"]
mod mlp;
#[path = "process.rs"]
mod process;

use gpubind::collective::{CommOptions, Communicator};
use gpubind::{Device, Error, ThreadContext};
use mlp::{Kernels, PinnedBatch, Replica, Shape};
use std::sync::Arc;
use std::time::Instant;

/// Dense FP32 peak of one H200 SXM without tensor cores, TFLOP/s: 16,896 FP32 lanes × 2
/// FLOP (FMA) × 1.98 GHz boost = 66.9 (docs/performance.md cites the sources).
const H200_FP32_TFLOPS: f64 = 67.0;

struct Args {
    devices: Option<Vec<usize>>,
    epochs: usize,
    batch: usize,
    hidden: usize,
    lr: f32,
    /// `--backend`: `Some(true)` NCCL, `Some(false)` own kernels, `None` not given.
    nccl: Option<bool>,
    seed: u64,
    steps_per_epoch: usize,
    dump_data: Option<std::path::PathBuf>,
    graph: bool,
    /// `--launcher env`: one rank per process, from the launcher's variables.
    launcher_env: bool,
    /// `--spawn N`: start N ranks of this program.
    spawn: Option<usize>,
    save_run: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        devices: None,
        epochs: 20,
        batch: 4096,
        hidden: 256,
        lr: 0.1,
        nccl: None,
        seed: 1,
        steps_per_epoch: 16,
        dump_data: None,
        graph: false,
        launcher_env: false,
        spawn: None,
        save_run: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--devices" => {
                a.devices = Some(
                    val()?
                        .split(',')
                        .map(|s| {
                            s.trim()
                                .parse()
                                .map_err(|_| format!("bad device ordinal {s:?}"))
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
            "--epochs" => a.epochs = val()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--batch" => a.batch = val()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--hidden" => a.hidden = val()?.parse().map_err(|e| format!("--hidden: {e}"))?,
            "--lr" => a.lr = val()?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--seed" => a.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--steps" => a.steps_per_epoch = val()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--dump-data" => a.dump_data = Some(val()?.into()),
            "--graph" => a.graph = true,
            "--save-run" => a.save_run = Some(val()?.into()),
            "--launcher" => match val()?.as_str() {
                "env" => a.launcher_env = true,
                other => return Err(format!("--launcher: {other:?} is not env")),
            },
            "--spawn" => a.spawn = Some(val()?.parse().map_err(|e| format!("--spawn: {e}"))?),
            "--backend" => {
                a.nccl = match val()?.as_str() {
                    "nccl" => Some(true),
                    "kernels" => Some(false),
                    other => {
                        return Err(format!("--backend: {other:?} is neither nccl nor kernels"));
                    }
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.batch == 0 || a.epochs == 0 || a.steps_per_epoch == 0 {
        return Err("--batch, --epochs and --steps must be positive".into());
    }
    if a.spawn == Some(0) {
        return Err("--spawn needs at least 1 rank".into());
    }
    if a.spawn.is_some() && a.launcher_env {
        return Err("--spawn starts its ranks with --launcher env itself: give one of them".into());
    }
    if (a.spawn.is_some() || a.launcher_env) && a.dump_data.is_some() {
        return Err("--dump-data runs in one process: drop --spawn and --launcher".into());
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train_mlp: {e}");
            std::process::exit(2);
        }
    };
    let outcome = if let Some(ranks) = args.spawn {
        launch::spawn(ranks, std::env::args().skip(1))
    } else if args.launcher_env {
        process::run(&args)
    } else {
        run(&args).map_err(|e| e.to_string())
    };
    if let Err(e) = outcome {
        eprintln!("train_mlp: {e}");
        std::process::exit(1);
    }
}

/// Writes the training data and the initial parameters for `scripts/torch_mlp.py`.
fn dump_data(
    dir: &std::path::Path,
    args: &Args,
    shape: Shape,
    x: &[f32],
    y: &[u32],
    params: &[Vec<f32>],
) -> gpubind::Result<()> {
    let io = |what: &str, e: std::io::Error| {
        Error::InvalidArgument(format!("--dump-data {}: {what}: {e}", dir.display()))
    };
    fn bytes<T: Copy>(v: &[T], to_le: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
        v.iter().flat_map(|&e| to_le(e)).collect()
    }
    std::fs::create_dir_all(dir).map_err(|e| io("create", e))?;
    let flat: Vec<f32> = params.iter().flatten().copied().collect();
    for (name, data) in [
        ("x.f32", bytes(x, f32::to_le_bytes)),
        ("y.u32", bytes(y, u32::to_le_bytes)),
        ("params.f32", bytes(&flat, f32::to_le_bytes)),
    ] {
        std::fs::write(dir.join(name), data).map_err(|e| io(name, e))?;
    }
    let meta = format!(
        "input {}\nhidden {}\nclasses {}\nbatch {}\nsteps {}\nseed {}\nrows {}\n",
        shape.input,
        shape.hidden,
        shape.classes,
        args.batch,
        args.steps_per_epoch,
        args.seed,
        y.len()
    );
    std::fs::write(dir.join("meta.txt"), meta).map_err(|e| io("meta.txt", e))?;
    println!(
        "train_mlp: wrote {} rows and {} parameters to {}",
        y.len(),
        flat.len(),
        dir.display()
    );
    Ok(())
}

fn run(args: &Args) -> gpubind::Result<()> {
    if let Some(dir) = &args.dump_data {
        // No GPU needed: the data and the initial weights are made on the CPU.
        let shape = Shape {
            input: 32,
            hidden: args.hidden,
            classes: 8,
        };
        let (x, y) = mlp::teacher_data(shape, args.batch * args.steps_per_epoch, args.seed);
        let params = mlp::init_params(shape, args.seed.wrapping_add(17));
        return dump_data(dir, args, shape, &x, &y, &params);
    }
    let devices: Vec<Arc<Device>> = match &args.devices {
        Some(list) => list
            .iter()
            .map(|&o| Device::get(o))
            .collect::<gpubind::Result<_>>()?,
        None => Device::all()?,
    };
    let ranks = devices.len();
    if !args.batch.is_multiple_of(ranks) {
        return Err(Error::InvalidArgument(format!(
            "--batch {} is not divisible by {ranks} ranks",
            args.batch
        )));
    }
    let shard = args.batch / ranks;
    let shape = Shape {
        input: 32,
        hidden: args.hidden,
        classes: 8,
    };
    let train_rows = args.batch * args.steps_per_epoch;
    let (x, y) = mlp::teacher_data(shape, train_rows, args.seed);
    let (test_x, test_y) = mlp::teacher_data(shape, shard, args.seed ^ 0x7E57);
    let params = mlp::init_params(shape, args.seed.wrapping_add(17));

    let mut ctx = ThreadContext::acquire()?;
    let steps = args.steps_per_epoch;
    let options = if args.nccl == Some(true) {
        CommOptions::nccl()
    } else {
        CommOptions::kernels()
    };
    let comm = Communicator::new(&mut ctx, &devices, options)?;
    let mut replicas = Vec::with_capacity(ranks);
    let mut kernels = Vec::with_capacity(ranks);
    // batches[step][rank]: each rank's shard of each step, page-locked once, up front.
    let mut batches: Vec<Vec<PinnedBatch>> = (0..steps).map(|_| Vec::new()).collect();
    for (r, dev) in devices.iter().enumerate() {
        let gpu = ctx.bind(dev)?;
        replicas.push(Replica::with_loss_slots(
            &gpu, shape, &params, shard, steps,
        )?);
        kernels.push(Kernels::load(&gpu)?);
        for (step, shards) in batches.iter_mut().enumerate() {
            let rows = step * args.batch + r * shard;
            shards.push(PinnedBatch::new(
                &gpu,
                &x[rows * shape.input..(rows + shard) * shape.input],
                &y[rows..rows + shard],
            )?);
        }
    }
    let fns = kernels
        .iter()
        .map(Kernels::fns)
        .collect::<gpubind::Result<Vec<_>>>()?;
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{}:{}", d.ordinal(), d.name()))
        .collect();
    println!(
        "train_mlp: {ranks} rank(s) [{}], backend {:?}, MLP {}-{}-{}-{}, batch {} ({shard} per rank), {} steps/epoch",
        names.join(", "),
        comm.backend(),
        shape.input,
        shape.hidden,
        shape.hidden,
        shape.classes,
        args.batch,
        args.steps_per_epoch
    );

    let mu = 0.9f32;
    let samples = args.batch * args.steps_per_epoch;
    let trained = if args.graph {
        let dev = one_device(&devices)?;
        let gpu = ctx.bind(&dev)?;
        let views = replicas
            .iter()
            .map(mlp::StepViews::new)
            .collect::<gpubind::Result<Vec<_>>>()?;
        let plan = mlp::StepPlan {
            comm: &comm,
            views: &views,
            fns: &fns,
            global_batch: args.batch,
            lr: args.lr,
            mu,
        };
        let blas = gpu.new_blas()?;
        let graphs = mlp::capture_steps(&gpu, &blas, &plan, &batches)?;
        let stream = gpu.new_stream()?;
        train_epochs(args.epochs, samples, true, || {
            mlp::launch_steps(&gpu, &stream, &graphs, &views)
        })?
    } else {
        train_epochs(args.epochs, samples, true, || {
            mlp::train_steps(
                &mut ctx,
                &comm,
                &devices,
                &mut replicas,
                &fns,
                &batches,
                args.batch,
                args.lr,
                mu,
            )
        })?
    };
    let Trained {
        first_loss,
        last_loss,
        throughput,
        step_losses,
    } = trained;

    // Accuracy of rank 0's replica on held-out data (all replicas hold the same weights).
    let gpu = ctx.bind(&devices[0])?;
    let rep = &mut replicas[0];
    rep.load_batch(&gpu, &test_x, &test_y)?;
    rep.forward(&gpu.default_stream(), &fns[0])?;
    gpu.synchronize()?;
    let logits = rep.logits(&gpu)?;
    let correct = (0..shard)
        .filter(|&i| {
            mlp::argmax(&logits[i * shape.classes..(i + 1) * shape.classes]) as u32 == test_y[i]
        })
        .count();
    println!(
        "final: loss {last_loss:.4} (from {:.4}), held-out accuracy {:.1}% ({correct}/{shard}), {throughput:.0} samples/s over epochs 1..{} on {ranks} rank(s)",
        first_loss,
        100.0 * correct as f64 / shard as f64,
        args.epochs
    );
    let tflops = throughput * shape.flops_per_sample() / 1e12;
    let mut distinct: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    println!(
        "RESULT impl=gpubind mode={} batch={} ranks={ranks} samples_per_s={throughput:.0} tflops={tflops:.3} frac_fp32={:.4}",
        if args.graph { "graph" } else { "eager" },
        args.batch,
        tflops / (H200_FP32_TFLOPS * distinct.len() as f64)
    );
    if let Some(dir) = &args.save_run {
        process::save_run(dir, &step_losses, &replicas[0].params(&gpu)?)?;
    }
    Ok(())
}

/// What a run's epochs measured.
struct Trained {
    first_loss: f64,
    last_loss: f64,
    /// Samples per second over epochs 1.. (the first includes warm-up: cuBLAS
    /// heuristics, first launches).
    throughput: f64,
    /// Every step's summed loss, epoch by epoch.
    step_losses: Vec<f64>,
}

/// Runs `epochs` epochs of `samples` samples each (`epoch` returns each step's summed
/// loss) and, if `print`, prints one line per epoch.
fn train_epochs(
    epochs: usize,
    samples: usize,
    print: bool,
    mut epoch: impl FnMut() -> gpubind::Result<Vec<f64>>,
) -> gpubind::Result<Trained> {
    let mut step_losses = Vec::new();
    let (mut first_loss, mut last_loss) = (None, 0.0);
    let (mut total_samples, mut total_time) = (0usize, 0.0f64);
    for e in 0..epochs {
        let start = Instant::now();
        let losses = epoch()?;
        let secs = start.elapsed().as_secs_f64();
        step_losses.extend_from_slice(&losses);
        if e > 0 {
            total_samples += samples;
            total_time += secs;
        }
        let loss = losses.iter().sum::<f64>() / samples as f64;
        first_loss.get_or_insert(loss);
        last_loss = loss;
        if print {
            println!(
                "epoch {e:>3}: loss {loss:.4}  {:.0} samples/s",
                samples as f64 / secs
            );
        }
    }
    Ok(Trained {
        first_loss: first_loss.unwrap_or(0.0),
        last_loss,
        throughput: if total_time > 0.0 {
            total_samples as f64 / total_time
        } else {
            0.0
        },
        step_losses,
    })
}

/// The one device every rank is on, for `--graph` (gpubind captures an all-reduce only
/// within one device).
fn one_device(devices: &[Arc<Device>]) -> gpubind::Result<Arc<Device>> {
    match devices {
        [first, rest @ ..] if rest.iter().all(|d| d.ordinal() == first.ordinal()) => {
            Ok(Arc::clone(first))
        }
        _ => Err(Error::NotCapturable {
            what: "train_mlp --graph's all-reduce",
            reason: format!(
                "the ranks are on devices {:?}; gpubind captures an all-reduce only when \
                 every rank is on one device (--devices 0, or 0,0)",
                devices.iter().map(|d| d.ordinal()).collect::<Vec<_>>()
            ),
        }),
    }
}
