//! A GPT-2 trained on byte-level text with gpubind's public API: NVRTC kernels of its own
//! ([`kernels`]), cuBLAS products, preallocated buffers ([`gpt`]), AdamW with gradient
//! clipping and a warm-up + cosine schedule ([`optim`]), safetensors checkpoints
//! ([`ckpt`]) — and side by side with the same model in PyTorch (`scripts/torch_gpt.py`,
//! `scripts/compare-gpt.sh`).
//!
//! ```text
//! cargo run --release --example train_gpt --features cublas -- [--model small|gpt2]
//!     [--batch 8] [--steps 100] [--lr 6e-4] [--seed 1] [--data PATH…] [--eval-every N]
//!     [--eval-batches 8] [--sample N] [--dump-init DIR] [--precision fp32] [--log-every 10]
//!     [--ckpt-every N] [--ckpt-dir DIR] [--resume FILE] [--devices 0] [--graph]
//!     [--attention auto|fused|tiled|unfused] [--epilogues on|off] [--gemm-algos timed|timed:N|heuristic]
//!     [--check-graph] [--check-resume]
//!     [--check-dp]
//!     [--check-attention] [--check-attention-quick] [--max-batch]
//! ```
//!
//! `--model small`: 6 layers, 6 heads, width 384, context 256; `--model gpt2`: 12, 12, 768,
//! 1024. The vocabulary is the 256 byte values. Without `--data` the text is the `.py`
//! files of Python's standard library; the last 5 % is held out and its loss printed
//! every `--eval-every` steps.
//!
//! `--precision fp32` computes in f32 throughout (cuBLAS with TF32 off); `--precision bf16`
//! keeps activations, gradients and the products' operands in bf16 (cuBLAS bf16 products
//! with f32 accumulation; the kernels compiled with `ACT_BF16`, arithmetic in f32) and
//! the master weights, AdamW moments, layer-norm statistics, losses and reductions in
//! f32; AdamW writes the bf16 copy of the weights the products read.
//!
//! `--attention fused` runs each block's attention as fused kernels, flash-
//! attention style (online softmax, the backward pass recomputing the probabilities from
//! each row's log-sum-exp, no `B·NH·T·T` matrix; head size 64 only): in bf16 with each
//! warp's tiles in registers and `mma.sync` tensor-core products (`attention_mma.cu`), in
//! fp32 with tiles in shared memory (`attention.cu`). `--attention tiled` uses
//! `attention.cu` in bf16 too (wmma products); `--attention unfused` runs llm.c's batched
//! products through the `T×T` matrix and a softmax kernel; `auto`, the default, is `fused`
//! in bf16 and `unfused` in fp32 (cuBLAS's f32 products outrun the fused kernels' f32 FMA
//! loops there). `--check-attention` compares
//! each fused implementation with the unfused one on random inputs at the `gpt2` and
//! `small` shapes and at lengths that are not multiples of the tiles, in fp32 and bf16:
//! the output and dq, dk, dv within a tolerance relative to the largest magnitude (1e-4
//! fp32, 5e-2 bf16) and each head's row of the output, dk and dv within a tolerance
//! relative to its own norm (1e-3 fp32, 0.25 bf16: the last keys' gradients are too small
//! for the first test to see),
//! printing each error and the milliseconds per call of each pass, and exits non-zero
//! unless all pass. `--check-attention-quick` checks the small shapes only (T = 77, 200
//! and 1) and times nothing, short enough to run under compute-sanitizer.
//!
//! `--max-batch` prints the largest `--batch` of the model, precision and attention given
//! whose buffers fit in the device's free memory with 1 GiB to spare (the rule a run checks
//! before it allocates: a larger batch is a typed error), and exits.
//!
//! `--epilogues on` (the default) computes the biases, the MLP's GELU and its gradient
//! in the products, as cuBLASLt epilogues (`BIAS`, `GELU_AUX_BIAS` storing the
//! pre-activation, `DGELU`, `linear.rs`), adds each residual connection's input in its
//! projection (the block input as the product's addend), and runs the plain products
//! through cuBLASLt too; `off` runs the biases, GELU and residual adds as kernels after
//! cuBLAS products. The bias gradients are column-sum kernels either way.
//!
//! `--gemm-algos timed` (the default) has each cuBLASLt product shape run the fastest of
//! cuBLASLt's first 8 candidate algorithms (`timed:N`: its first N, up to 16), timed once
//! on scratch memory when the shape is first issued
//! ([`AlgoSelection`](gpubind::blas::AlgoSelection)); on an H100 at gpt2
//! batch 128 the heuristic's own first choices take up to 25 % longer for some products.
//! `heuristic` takes cuBLASLt's first choice: the same algorithms, so the same bits, in
//! every process. `TRAIN_GPT_LOG=debug` prints each timed product's candidates. The first step (and a graph's capture) takes the timing's few tenths of
//! a second once; the timed steps come after it.
//!
//! Every step prints `step S loss L` (what
//! `scripts/compare-gpt.sh` compares); every `--log-every` steps a progress line with
//! tokens/s, MFU (against the H200's dense peak of the precision: 67 TFLOP/s FP32 for
//! fp32, whose products run without tensor cores, 989 TFLOP/s BF16 for bf16) and the
//! device memory gpubind's allocations hold, now and at their peak
//! ([`Device::memory_usage`](gpubind::Device::memory_usage): the model, its activations,
//! cuBLAS workspaces and collective staging; not the CUDA context or library handles),
//! and the step's submit time: how long `train_step` takes to enqueue the whole step (the
//! batch's upload included). A step that waited for its own GPU work on the host would
//! take as long to submit as to run; a step without host synchronisation submits in a
//! fraction of its run time, the GPU working meanwhile.
//! The last line is machine-readable, over the timed steps (all but the first 5, or the
//! first half of a run of fewer than 10):
//! `RESULT impl=gpubind mode=eager|graph precision=fp32|bf16 model=M batch=B tokens_per_s=X mfu=F peak_mem_gib=G step_ms=S submit_ms=U`.
//!
//! `--dump-init DIR` writes, without touching a GPU, `init.safetensors` (the initial
//! weights under `scripts/torch_gpt.py`'s `state_dict` names), `batches.u64` (every
//! step's sequence start offsets, little-endian u64, steps × batch), `train.u8` (the
//! training tokens) and `meta.json`, from which the torch script trains the same model on
//! the same batches.
//!
//! The step — forward, backward, the gradient buckets' all-reduce hook, clipping, AdamW —
//! is written once (`step.rs`: the parts in order; `pass.rs`: each part's products and
//! kernels, generic over a stream or a graph capture) and issued eagerly, into a graph, or
//! on every data-parallel rank.
//!
//! `--graph` captures the whole step — forward, backward, clipping, AdamW — into one CUDA
//! graph and launches it every step (`graph.rs`); the schedule's lr reaches the graph
//! through a device buffer written before each launch. `--check-graph` trains eagerly,
//! then through the graph from the same start, and exits non-zero unless the losses are
//! equal bit for bit. `--ckpt-every N` writes `<model>_stepNNNNNN.safetensors` (weights,
//! AdamW moments, step) into `--ckpt-dir`; `--resume FILE` continues from one;
//! `--check-resume` trains with a checkpoint halfway, resumes from it and exits non-zero
//! unless the resumed losses repeat the uninterrupted run's bit for bit.
//!
//! `--devices 0,1` (or `0,0`) trains data-parallel ranks from one thread (`dp.rs`), each
//! on `batch / ranks` sequences of every step, with the gradients all-reduced by
//! `ctx.group` in buckets (the head, each block, the embeddings) as the backward pass
//! finishes them, overlapped with the rest of it; `--check-dp` first trains one rank on the whole batch and exits non-zero
//! unless the ranks' losses agree within 1e-3 relative.
//!
//! `--launcher env` runs one rank per process under torchrun, mpirun or srun (`ranks.rs`):
//! `torchrun --standalone --nproc-per-node 2 --no-python train_gpt --launcher env
//! --devices 0,0` trains the same shards as `--devices 0,0` in one process.
//!
//! Weight decay (0.1) applies to the 2-D tensors: both embeddings (the token embedding
//! is also the output head) and the linear weights; not to biases and layer norms.

#[path = "args.rs"]
mod args;
#[path = "attend.rs"]
mod attend;
#[path = "attention.rs"]
mod attention;
#[path = "check_attn.rs"]
mod check_attn;
#[path = "ckpt.rs"]
mod ckpt;
#[path = "data.rs"]
mod data;
#[path = "dp.rs"]
mod dp;
#[path = "gpt.rs"]
mod gpt;
#[cfg(test)]
#[path = "host_emulator.rs"]
mod host_emulator;
#[path = "kernels.rs"]
mod kernels;
#[path = "launch.rs"]
mod launch;
#[path = "linear.rs"]
mod linear;
#[path = "model.rs"]
mod model;
#[path = "optim.rs"]
mod optim;
#[path = "precision.rs"]
mod precision;
#[path = "ranks.rs"]
mod ranks;

use args::{Args, Precision};
use gpt::graph::{Staging, Views};
use gpt::step;
use gpt::{Act, Gpt};
use gpubind::{BoundDevice, BoundStream, Device, GraphExec, ThreadContext};
use model::{Config, ParamLayout};
use optim::{AdamW, Schedule};
use std::path::PathBuf;
use std::time::Instant;

/// What goes wrong in `train_gpt`, each with the thing that is wrong.
#[derive(Debug, thiserror::Error)]
pub enum GptError {
    #[error("{0} (see the usage in examples/train_gpt/main.rs)")]
    Usage(String),
    #[error("unknown model {0:?}: small or gpt2")]
    UnknownModel(String),
    #[error("no --data given and no Python standard library found through python3")]
    NoData,
    #[error("cannot read {}: {why}", path.display())]
    Data { path: PathBuf, why: String },
    #[error("the text has {have} tokens; training and validation need at least {need}")]
    TooLittleData { have: usize, need: usize },
    #[error("--batch {batch} needs {:.2} GiB of device memory (+{:.0} GiB headroom), {:.2} GiB are free", *need as f64 / GIB, model::HEADROOM as f64 / GIB, *free as f64 / GIB)]
    BatchTooLarge {
        batch: usize,
        need: usize,
        free: usize,
    },
    #[error("checkpoint {}{}: {why}", path.display(), tensor.as_ref().map(|t| format!(", tensor {t}")).unwrap_or_default())]
    Checkpoint {
        path: PathBuf,
        tensor: Option<String>,
        why: String,
    },
    #[error("check failed: {0}")]
    CheckFailed(String),
    #[error("{0} is not implemented by train_gpt")]
    Unsupported(&'static str),
    #[error("{0}")]
    Gpu(#[from] gpubind::Error),
}

const GIB: f64 = (1u64 << 30) as f64;

/// gpubind's log records at `TRAIN_GPT_LOG`'s level and above (`debug` shows each timed
/// product's candidates), on stderr.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("[{}] {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    if let Some(level) = std::env::var("TRAIN_GPT_LOG")
        .ok()
        .and_then(|v| v.parse::<log::LevelFilter>().ok())
        && log::set_logger(&StderrLog).is_ok()
    {
        log::set_max_level(level);
    }
    let outcome = args::parse(std::env::args().skip(1)).and_then(|a| run(&a));
    if let Err(e) = outcome {
        eprintln!("train_gpt: {e}");
        std::process::exit(if matches!(e, GptError::Usage(_)) {
            2
        } else {
            1
        });
    }
}

fn io_err(path: &std::path::Path, e: std::io::Error) -> GptError {
    GptError::Data {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// Writes what `scripts/torch_gpt.py` needs to train the same model on the same batches.
fn dump_init(
    dir: &std::path::Path,
    a: &Args,
    cfg: &Config,
    layout: &ParamLayout,
    init: &[f32],
    train: &[u8],
    order: &[u64],
) -> Result<(), GptError> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let meta = std::collections::HashMap::from([("model".to_string(), a.model.clone())]);
    let bytes = ckpt::to_bytes(layout, &[("", init)], meta)?;
    ckpt::write_atomic(&dir.join("init.safetensors"), &bytes)?;
    let sched = Schedule::new(a.lr, a.steps);
    let hp = AdamW::default();
    let json = format!(
        "{{\"model\": \"{}\", \"layers\": {}, \"heads\": {}, \"width\": {}, \"context\": {}, \"vocab\": {}, \
         \"batch\": {}, \"steps\": {}, \"lr\": {}, \"warmup\": {}, \"min_frac\": {}, \"beta1\": {}, \
         \"beta2\": {}, \"eps\": {}, \"weight_decay\": {}, \"max_norm\": {}}}\n",
        a.model,
        cfg.layers,
        cfg.heads,
        cfg.width,
        cfg.context,
        cfg.vocab,
        a.batch,
        a.steps,
        a.lr,
        sched.warmup,
        sched.min_frac,
        hp.beta1,
        hp.beta2,
        hp.eps,
        hp.weight_decay,
        hp.max_norm
    );
    for (name, data) in [
        ("batches.u64", data::order_bytes(order)),
        ("train.u8", train.to_vec()),
        ("meta.json", json.into_bytes()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| io_err(&path, e))?;
    }
    println!(
        "train_gpt: wrote {} parameters and {} steps × {} sequences to {}",
        layout.total,
        a.steps,
        a.batch,
        dir.display()
    );
    Ok(())
}

fn run(a: &Args) -> Result<(), GptError> {
    if a.check_attention {
        let mut ctx = ThreadContext::acquire()?;
        let dev = Device::get(a.devices[0])?;
        return check_attn::run(&ctx.bind(&dev)?, a.check_quick);
    }
    if a.launcher_env
        && (a.graph || a.resume.is_some() || a.check_graph || a.check_resume || a.check_dp)
    {
        return Err(GptError::Unsupported(
            "--graph, --resume and the checks with --launcher env",
        ));
    }
    if a.devices.len() > 1 && (a.graph || a.resume.is_some() || a.check_graph || a.check_resume) {
        return Err(GptError::Unsupported(
            "--graph, --resume and the checks with more than one rank",
        ));
    }
    let cfg = Config::named(&a.model)?;
    if a.max_batch {
        return match a.precision {
            Precision::Fp32 => max_batch::<f32>(a, &cfg),
            Precision::Bf16 => max_batch::<half::bf16>(a, &cfg),
        };
    }
    let data = data::load(&a.data, cfg.context, 0.05)?;
    let layout = ParamLayout::new(&cfg);
    let init = model::init_params(&cfg, &layout, a.seed);
    let order = data::batch_order(data.train.len(), cfg.context, a.batch, a.steps, a.seed);
    println!(
        "train_gpt: model {} ({} parameters), {} training + {} validation tokens from {}",
        a.model,
        layout.total,
        data.train.len(),
        data.val.len(),
        data.source
    );
    if let Some(dir) = &a.dump_init {
        return dump_init(dir, a, &cfg, &layout, &init, &data.train, &order);
    }
    match a.precision {
        Precision::Fp32 => run_on::<f32>(a, cfg, &data, &order, &init),
        Precision::Bf16 => run_on::<half::bf16>(a, cfg, &data, &order, &init),
    }
}

/// `--max-batch`: prints the largest batch of `cfg` with activations of type `T` and `a`'s
/// attention whose buffers fit in the first device's free memory (`model::largest_batch`,
/// the rule `Gpt::new` applies), as `max-batch B`.
fn max_batch<T: Act>(a: &Args, cfg: &Config) -> Result<(), GptError> {
    let act = std::mem::size_of::<T>();
    let unfused = a.fusion.attention.resolve(T::BF16) == args::AttnMode::Unfused;
    let mut ctx = ThreadContext::acquire()?;
    let dev = Device::get(a.devices[0])?;
    let (free, total) = ctx.bind(&dev)?.memory_info()?;
    let b = model::largest_batch(cfg, unfused, act, free);
    println!(
        "max-batch {b} (model {}: {:.2} GiB of buffers and {:.0} GiB of headroom; {:.2} of {:.2} GiB free)",
        a.model,
        model::device_bytes(cfg, b, unfused, act) as f64 / GIB,
        model::HEADROOM as f64 / GIB,
        free as f64 / GIB,
        total as f64 / GIB,
    );
    Ok(())
}

/// The GPU part of [`run`], with activations of type `T`.
fn run_on<T: Act>(
    a: &Args,
    cfg: Config,
    data: &data::Dataset,
    order: &[u64],
    init: &[f32],
) -> Result<(), GptError> {
    if a.launcher_env {
        return ranks::train::<T>(a, cfg, data, order, init);
    }
    let mut ctx = ThreadContext::acquire()?;
    if a.devices.len() > 1 {
        let devices = a
            .devices
            .iter()
            .map(|&o| Device::get(o))
            .collect::<gpubind::Result<Vec<_>>>()?;
        let single = if a.check_dp {
            let gpu = ctx.bind(&devices[0])?;
            let mut one = Gpt::<T>::new(&gpu, cfg, a.batch, init, a.fusion)?;
            Some(train(&gpu, &mut one, a, data, order, 0)?)
        } else {
            None
        };
        let ranked = dp::train::<T>(&mut ctx, &devices, cfg, a, data, order, init)?;
        if let Some(single) = single {
            check_dp(&single, &ranked)?;
        }
        return Ok(());
    }
    let dev = Device::get(a.devices[0])?;
    let gpu = ctx.bind(&dev)?;
    let mut model = Gpt::<T>::new(&gpu, cfg, a.batch, init, a.fusion)?;
    let mut start = 0;
    if let Some(path) = &a.resume {
        start = resume(&gpu, &mut model, path, &a.model)?;
    }
    if a.check_resume {
        return check_resume(&gpu, &mut model, a, data, order);
    }
    if a.check_graph {
        return check_graph(&gpu, &mut model, init, a, data, order);
    }
    train(&gpu, &mut model, a, data, order, start)?;
    if a.sample > 0 {
        let text = sample(&gpu, &mut model, a.sample)?;
        println!(
            "--- sample ---\n{}\n--- end ---",
            String::from_utf8_lossy(&text)
        );
    }
    Ok(())
}

/// `--check-graph`: trains `--steps` steps eagerly, then again from the same initial
/// state through the captured graphs, and fails unless the losses agree bit for bit.
fn check_graph<T: Act>(
    gpu: &BoundDevice<'_>,
    model: &mut Gpt<T>,
    init: &[f32],
    a: &Args,
    data: &data::Dataset,
    order: &[u64],
) -> Result<(), GptError> {
    let mut run = a.clone();
    run.graph = false;
    let eager = train(gpu, model, &run, data, order, 0)?;
    gpu.htod_copy(init, &mut model.params)?;
    gpu.memset_zeros(&mut model.m)?;
    gpu.memset_zeros(&mut model.v)?;
    model.sync_weights(&mut gpu.default_stream())?;
    run.graph = true;
    let graphed = train(gpu, model, &run, data, order, 0)?;
    if eager != graphed {
        return Err(GptError::CheckFailed(format!(
            "graph losses differ from eager: eager {eager:?}, graph {graphed:?}"
        )));
    }
    println!(
        "check-graph: PASS ({} steps, graph losses equal eager bit for bit)",
        eager.len()
    );
    Ok(())
}

/// Relative tolerance of `--check-dp`: the ranks sum their shards' gradients in another
/// order than one rank does, and AdamW carries the rounding on from step to step.
const DP_TOLERANCE: f32 = 1e-3;

/// `--check-dp`: the ranks' losses must match the one-rank run's within [`DP_TOLERANCE`].
fn check_dp(single: &[f32], ranked: &[f32]) -> Result<(), GptError> {
    let worst = single
        .iter()
        .zip(ranked)
        .map(|(a, b)| ((a - b) / a).abs())
        .map(|r| if r.is_nan() { f32::INFINITY } else { r })
        .fold(0.0f32, f32::max);
    if single.len() != ranked.len() || worst > DP_TOLERANCE {
        return Err(GptError::CheckFailed(format!(
            "ranks' losses differ from one rank's by up to {worst:.2e} (tolerance {DP_TOLERANCE:.0e}): one rank {single:?}, ranks {ranked:?}"
        )));
    }
    println!(
        "check-dp: PASS ({} steps, worst relative difference {worst:.2e}, tolerance {DP_TOLERANCE:.0e})",
        single.len()
    );
    Ok(())
}

/// Loads the training state of a checkpoint into `model`; returns its step.
fn resume<T: Act>(
    gpu: &BoundDevice<'_>,
    model: &mut Gpt<T>,
    path: &std::path::Path,
    name: &str,
) -> Result<usize, GptError> {
    let st = ckpt::load(path, &model.layout, name)?;
    gpu.htod_copy(&st.params, &mut model.params)?;
    gpu.htod_copy(&st.m, &mut model.m)?;
    gpu.htod_copy(&st.v, &mut model.v)?;
    model.sync_weights(&mut gpu.default_stream())?;
    println!("train_gpt: resumed {} at step {}", path.display(), st.step);
    Ok(st.step)
}

/// `--check-resume`: trains `--steps` steps with a checkpoint halfway, resumes from it
/// and fails unless the resumed steps repeat the uninterrupted run's losses bit for bit.
fn check_resume<T: Act>(
    gpu: &BoundDevice<'_>,
    model: &mut Gpt<T>,
    a: &Args,
    data: &data::Dataset,
    order: &[u64],
) -> Result<(), GptError> {
    let half = (a.steps / 2).max(1);
    let mut run = a.clone();
    run.ckpt_every = half;
    run.ckpt_dir = std::env::temp_dir().join(format!("train_gpt_check_{}", std::process::id()));
    let full = train(gpu, model, &run, data, order, 0)?;
    let path = run
        .ckpt_dir
        .join(format!("{}_step{half:06}.safetensors", a.model));
    let start = resume(gpu, model, &path, &a.model)?;
    run.ckpt_every = 0;
    let resumed = train(gpu, model, &run, data, order, start)?;
    let _ = std::fs::remove_dir_all(&run.ckpt_dir);
    if resumed.is_empty() || resumed[..] != full[start..] {
        return Err(GptError::CheckFailed(format!(
            "resumed at step {start}, the losses differ: uninterrupted {:?}, resumed {:?}",
            &full[start..],
            resumed
        )));
    }
    println!(
        "check-resume: PASS ({} resumed steps repeat the losses bit for bit)",
        resumed.len()
    );
    Ok(())
}

/// Trains steps `start..a.steps`, returning their losses.
/// How a step runs: eager calls ([`Eager`]) or the captured graphs ([`Graphed`]).
trait Stepper<T: Act> {
    fn model(&self) -> &Gpt<T>;
    fn mode(&self) -> &'static str;
    /// A training step on batch `(x, y)` with the schedule values `sched`.
    fn train_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        batch: (&[u32], &[u32]),
        sched: &[f32; optim::SCHED_LEN],
    ) -> gpubind::Result<()>;
    /// The loss of batch `(x, y)` into the model's `loss`, without training.
    fn eval_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        batch: (&[u32], &[u32]),
    ) -> gpubind::Result<()>;
}

/// Every step enqueued call by call.
struct Eager<'m, T: Act>(&'m mut Gpt<T>, AdamW);

impl<T: Act> Stepper<T> for Eager<'_, T> {
    fn model(&self) -> &Gpt<T> {
        self.0
    }
    fn mode(&self) -> &'static str {
        "eager"
    }
    fn train_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        (x, y): (&[u32], &[u32]),
        sched: &[f32; optim::SCHED_LEN],
    ) -> gpubind::Result<()> {
        let m = &mut *self.0;
        m.upload(gpu, x, y)?;
        gpu.htod_copy(sched, &mut m.sched)?;
        step::train_step(&mut m.eager(s)?, self.1, step::no_hook)
    }
    fn eval_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        (x, y): (&[u32], &[u32]),
    ) -> gpubind::Result<()> {
        self.0.upload(gpu, x, y)?;
        step::eval_step(&mut self.0.eager(s)?)
    }
}

/// Every step one launch of a captured graph (`--graph`, `graph.rs`).
struct Graphed<'a, T: Act> {
    model: &'a Gpt<T>,
    staging: Staging,
    step: GraphExec<'a>,
    eval: GraphExec<'a>,
}

impl<'a, T: Act> Graphed<'a, T> {
    fn new(
        gpu: &BoundDevice<'_>,
        model: &'a Gpt<T>,
        views: &'a Views<'a, T>,
        hp: AdamW,
    ) -> gpubind::Result<Self> {
        Ok(Graphed {
            model,
            staging: Staging::new(gpu, model)?,
            step: model.capture(gpu, views, hp, true)?.instantiate()?,
            eval: model.capture(gpu, views, hp, false)?.instantiate()?,
        })
    }
}

impl<T: Act> Stepper<T> for Graphed<'_, T> {
    fn model(&self) -> &Gpt<T> {
        self.model
    }
    fn mode(&self) -> &'static str {
        "graph"
    }
    fn train_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        batch: (&[u32], &[u32]),
        sched: &[f32; optim::SCHED_LEN],
    ) -> gpubind::Result<()> {
        self.model
            .feed(gpu, s, &mut self.staging, batch, Some(sched))?;
        self.step.launch(s)
    }
    fn eval_step(
        &mut self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        batch: (&[u32], &[u32]),
    ) -> gpubind::Result<()> {
        self.model.feed(gpu, s, &mut self.staging, batch, None)?;
        self.eval.launch(s)
    }
}

/// Trains steps `start..a.steps` eagerly or, with `a.graph`, through captured graphs.
fn train<T: Act>(
    gpu: &BoundDevice<'_>,
    model: &mut Gpt<T>,
    a: &Args,
    data: &data::Dataset,
    order: &[u64],
    start: usize,
) -> Result<Vec<f32>, GptError> {
    let hp = AdamW::default();
    if a.graph {
        let views = model.views()?;
        let mut g = Graphed::new(gpu, model, &views, hp)?;
        train_with(gpu, &mut g, a, data, order, start)
    } else {
        train_with(gpu, &mut Eager(model, hp), a, data, order, start)
    }
}

/// Trains steps `start..a.steps` with `st`, returning their losses.
fn train_with<T: Act>(
    gpu: &BoundDevice<'_>,
    st: &mut impl Stepper<T>,
    a: &Args,
    data: &data::Dataset,
    order: &[u64],
    start: usize,
) -> Result<Vec<f32>, GptError> {
    let mut s = gpu.default_stream();
    let cfg = st.model().cfg;
    let (t, b) = (cfg.context, a.batch);
    let sched = Schedule::new(a.lr, a.steps);
    let hp = AdamW::default();
    let val = data::val_starts(data.val.len(), t, b, a.eval_batches);
    let flops_per_step = cfg.flops_per_token() * (b * t) as f64;
    let (mut timed_steps, mut timed_s, mut timed_submit_s) = (0usize, 0f64, 0f64);
    gpu.device().reset_peak_memory_usage();
    let mut losses = Vec::new();
    for step in start..a.steps {
        let t0 = Instant::now();
        let (x, y) = data::make_batch(&data.train, &order[step * b..(step + 1) * b], t);
        let submit_start = Instant::now();
        st.train_step(gpu, &mut s, (&x, &y), &sched.device_values(step, &hp))?;
        let submit = submit_start.elapsed().as_secs_f64();
        let loss = gpu.dtoh(&st.model().loss)?[0];
        let dt = t0.elapsed().as_secs_f64();
        let mem = gpu.device().memory_usage();
        if step >= start + 5.min((a.steps - start) / 2) {
            timed_steps += 1;
            timed_s += dt;
            timed_submit_s += submit;
        }
        println!("step {} loss {loss:.6}", step + 1);
        losses.push(loss);
        if !loss.is_finite() {
            return Err(GptError::Gpu(gpubind::Error::InvalidArgument(format!(
                "the loss of step {} is {loss}",
                step + 1
            ))));
        }
        let done = step + 1;
        if done % a.log_every == 0 || done == a.steps {
            let tps = (b * t) as f64 / dt;
            println!(
                "progress step {done}/{} loss {loss:.4} lr {:.3e} {:.0} tokens/s mfu {:.1}% mem {:.2} GiB (peak {:.2} GiB) step {:.2} ms (submit {:.2} ms)",
                a.steps,
                sched.lr_at(step),
                tps,
                100.0 * flops_per_step / dt / (T::PEAK_TFLOPS * 1e12),
                mem.in_use as f64 / GIB,
                mem.peak as f64 / GIB,
                dt * 1e3,
                submit * 1e3
            );
        }
        if a.eval_every > 0 && (done % a.eval_every == 0 || done == a.steps) {
            let mut sum = 0.0;
            for starts in &val {
                let (x, y) = data::make_batch(&data.val, starts, t);
                st.eval_step(gpu, &mut s, (&x, &y))?;
                sum += f64::from(gpu.dtoh(&st.model().loss)?[0]);
            }
            println!("val step {done} loss {:.6}", sum / val.len() as f64);
        }
        if a.ckpt_every > 0 && done % a.ckpt_every == 0 {
            std::fs::create_dir_all(&a.ckpt_dir).map_err(|e| io_err(&a.ckpt_dir, e))?;
            let path = a
                .ckpt_dir
                .join(format!("{}_step{done:06}.safetensors", a.model));
            let model = st.model();
            let state = ckpt::State {
                step: done,
                params: gpu.dtoh(&model.params)?,
                m: gpu.dtoh(&model.m)?,
                v: gpu.dtoh(&model.v)?,
            };
            ckpt::save(&path, &model.layout, &a.model, &state)?;
            println!("checkpoint {}", path.display());
        }
    }
    let tps = if timed_s > 0.0 {
        (timed_steps * b * t) as f64 / timed_s
    } else {
        0.0
    };
    let per_step = |total_s: f64| 1e3 * total_s / timed_steps.max(1) as f64;
    println!(
        "RESULT impl=gpubind mode={} precision={} model={} batch={b} tokens_per_s={tps:.0} mfu={:.4} peak_mem_gib={:.2} step_ms={:.3} submit_ms={:.3}",
        st.mode(),
        T::PRECISION,
        a.model,
        tps * cfg.flops_per_token() / (T::PEAK_TFLOPS * 1e12),
        gpu.device().memory_usage().peak as f64 / GIB,
        per_step(timed_s),
        per_step(timed_submit_s)
    );
    Ok(losses)
}

/// `n` greedily generated bytes after a newline, row 0 of the batch, re-running the
/// forward pass over the last `context` tokens for each.
fn sample<T: Act>(
    gpu: &BoundDevice<'_>,
    model: &mut Gpt<T>,
    n: usize,
) -> Result<Vec<u8>, GptError> {
    let (t, v, bt) = (
        model.cfg.context,
        model.cfg.vocab,
        model.dims.b * model.cfg.context,
    );
    let mut s = gpu.default_stream();
    let mut text = vec![b'\n'];
    for _ in 0..n {
        let window = &text[text.len().saturating_sub(t)..];
        let mut x = vec![0u32; bt];
        for (d, &c) in x.iter_mut().zip(window) {
            *d = u32::from(c);
        }
        model.upload(gpu, &x, &vec![0u32; bt])?;
        model.forward(&mut s, false)?;
        let pos = window.len() - 1;
        let row: Vec<f32> = gpu
            .dtoh(&model.logits.slice(pos * v..(pos + 1) * v)?)?
            .into_iter()
            .map(T::to_f32)
            .collect();
        let best = (0..v)
            .max_by(|&i, &j| row[i].total_cmp(&row[j]))
            .unwrap_or(0);
        text.push(best as u8);
    }
    Ok(text.split_off(1))
}
