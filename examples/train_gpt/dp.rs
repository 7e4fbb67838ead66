//! Data parallelism in one process: `--devices 0,1` (or `0,0`, two ranks on one GPU),
//! one thread driving every rank through `ctx.group`.
//!
//! Each rank holds a full replica and trains `batch / ranks` sequences of every step
//! (rank r the r-th slice of the step's sequences); its loss gradient is scaled by
//! 1/ranks, so the all-reduced (summed) gradients are those of the whole batch. Each
//! replica then clips and applies AdamW to identical gradients, so the replicas stay
//! identical. The reported loss is the ranks' mean.
//!
//! **Bucketed, overlapped all-reduce.** The backward pass runs on a compute stream per
//! rank, one part at a time for every rank (the head and final layer norm, each block from
//! the last, the embeddings); as soon as a part's gradients are done on every rank, one
//! `ctx.group` all-reduce of that bucket is enqueued on the communicator's streams (own
//! kernels), and the next part's backward pass proceeds meanwhile. Gradients live in one
//! flat buffer (AdamW, the norm and the graphs use per-tensor views of it), but views of
//! one allocation share one access tracker: an all-reduce reading a view on the
//! communicator stream would make the backward pass's next write to another view wait for
//! it. So each bucket is first copied (on the compute stream) into an allocation of its
//! own, reduced from there into another, and copied back before AdamW: two extra copies of
//! the gradients per step, in exchange for the overlap.

use crate::GptError;
use crate::args::Args;
use crate::data::{self, Dataset};
use crate::gpt::step::{Eager, Issuer, Part, train_step};
use crate::gpt::{Act, Gpt};
use crate::model::{Config, ParamLayout};
use crate::optim::{AdamW, Schedule};
use gpubind::collective::{CommOptions, Communicator, Op};
use gpubind::{BoundStream, Device, DeviceSlice, Issue, Stream, ThreadContext};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// Trains `a.steps` steps on `devices` (one rank each), returning the losses.
pub fn train<T: Act>(
    ctx: &mut ThreadContext,
    devices: &[Arc<Device>],
    cfg: Config,
    a: &Args,
    data: &Dataset,
    order: &[u64],
    init: &[f32],
) -> Result<Vec<f32>, GptError> {
    let ranks = devices.len();
    if !a.batch.is_multiple_of(ranks) {
        return Err(GptError::Usage(format!(
            "--batch {} is not divisible by {ranks} ranks",
            a.batch
        )));
    }
    let shard = a.batch / ranks;
    let comm = Communicator::new(ctx, devices, CommOptions::kernels())?;
    let mut reps = Vec::with_capacity(ranks);
    let mut streams = Vec::with_capacity(ranks);
    for dev in devices {
        let gpu = ctx.bind(dev)?;
        let mut rep = Gpt::<T>::new(&gpu, cfg, shard, init, a.fusion)?;
        rep.grad_scale = 1.0 / ranks as f32;
        streams.push(gpu.new_stream()?);
        reps.push(rep);
    }
    let mut buckets = Buckets::new(ctx, devices, &reps[0])?;
    let (t, b) = (cfg.context, a.batch);
    let sched = Schedule::new(a.lr, a.steps);
    let hp = AdamW::default();
    let mut losses = Vec::with_capacity(a.steps);
    let (mut timed, mut secs) = (0usize, 0f64);
    for step in 0..a.steps {
        let t0 = Instant::now();
        let starts = &order[step * b..(step + 1) * b];
        for (r, rep) in reps.iter_mut().enumerate() {
            let gpu = ctx.bind(&devices[r])?;
            let (x, y) = data::make_batch(&data.train, &starts[r * shard..(r + 1) * shard], t);
            rep.upload(&gpu, &x, &y)?;
            gpu.htod_copy(&sched.device_values(step, &hp), &mut rep.sched)?;
        }
        let mut all = Replicas {
            ctx: &mut *ctx,
            devices,
            streams: &streams,
            reps: &reps,
        };
        train_step(&mut all, hp, |all, k| {
            buckets.reduce(all.ctx, &comm, devices, &streams, all.reps, k)?;
            if k == cfg.layers + 1 {
                // Every bucket reduced: back into each rank's gradients before the update.
                all.each(|r, x| buckets.copy_back(x.s, r, x.model))?;
            }
            Ok(())
        })?;
        let mut sum = 0.0f64;
        for (r, rep) in reps.iter().enumerate() {
            sum += f64::from(ctx.bind(&devices[r])?.dtoh(&rep.loss)?[0]);
        }
        let loss = (sum / ranks as f64) as f32;
        let dt = t0.elapsed().as_secs_f64();
        if step >= 5.min(a.steps / 2) {
            timed += 1;
            secs += dt;
        }
        println!("step {} loss {loss:.6}", step + 1);
        if (step + 1) % a.log_every == 0 || step + 1 == a.steps {
            println!(
                "progress step {}/{} loss {loss:.4} {:.0} tokens/s ({ranks} ranks)",
                step + 1,
                a.steps,
                (b * t) as f64 / dt
            );
        }
        losses.push(loss);
    }
    let tps = if secs > 0.0 {
        (timed * b * t) as f64 / secs
    } else {
        0.0
    };
    let distinct = {
        let mut o: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
        o.sort_unstable();
        o.dedup();
        o.len()
    };
    println!(
        "RESULT impl=gpubind mode=eager precision={} model={} batch={b} ranks={ranks} tokens_per_s={tps:.0} mfu={:.4}",
        T::PRECISION,
        a.model,
        tps * cfg.flops_per_token() / (T::PEAK_TFLOPS * 1e12 * distinct as f64)
    );
    Ok(losses)
}

/// Every rank's replica: a step's parts issued on each in rank order, each on its rank's
/// compute stream.
struct Replicas<'x, T: Act> {
    ctx: &'x mut ThreadContext,
    devices: &'x [Arc<Device>],
    streams: &'x [Stream],
    reps: &'x [Gpt<T>],
}

impl<T: Act> Replicas<'_, T> {
    /// Runs `f` with every rank and its replica's eager issuer.
    fn each(
        &mut self,
        mut f: impl FnMut(usize, &mut Eager<'_, '_, T>) -> gpubind::Result<()>,
    ) -> gpubind::Result<()> {
        for (r, rep) in self.reps.iter().enumerate() {
            let gpu = self.ctx.bind(&self.devices[r])?;
            let mut s = gpu.on(&self.streams[r])?;
            f(r, &mut rep.eager(&mut s)?)?;
        }
        Ok(())
    }
}

impl<T: Act> Issuer for Replicas<'_, T> {
    fn layers(&self) -> usize {
        self.reps[0].dims.l
    }
    fn issue(&mut self, part: Part) -> gpubind::Result<()> {
        self.each(|_, x| x.issue(part))
    }
}

/// The buckets' ranges of the flat gradients, in the order the backward pass finishes
/// them: `ln_f`; block `L - 1`, …, block 0; `wte` and `wpe`.
pub fn bucket_ranges(lay: &ParamLayout, layers: usize) -> Vec<Range<usize>> {
    let ln_f = lay.get("ln_f.weight").offset..lay.get("ln_f.bias").range().end;
    let mut ranges = vec![ln_f];
    for l in (0..layers).rev() {
        ranges.push(lay.block(l, "ln_1.weight").start..lay.block(l, "mlp.c_proj.bias").end);
    }
    ranges.push(0..lay.get("wpe.weight").range().end);
    ranges
}

/// The gradient buckets: per bucket its range of the flat gradients, and per rank the
/// allocation it is copied into and all-reduced in place in (a copy, so that the rest of
/// the backward pass, which writes the same gradient allocation, need not wait for it).
struct Buckets<T: Act> {
    ranges: Vec<Range<usize>>,
    /// `bufs[bucket][rank]`.
    bufs: Vec<Vec<DeviceSlice<T>>>,
}

impl<T: Act> Buckets<T> {
    /// The buckets of [`bucket_ranges`], allocated on every rank.
    fn new(
        ctx: &mut ThreadContext,
        devices: &[Arc<Device>],
        model: &Gpt<T>,
    ) -> Result<Self, GptError> {
        let ranges = bucket_ranges(&model.layout, model.cfg.layers);
        let mut bufs = Vec::new();
        for r in &ranges {
            let mut per_rank = Vec::new();
            for dev in devices {
                per_rank.push(ctx.bind(dev)?.alloc_zeros::<T>(r.len())?);
            }
            bufs.push(per_rank);
        }
        Ok(Buckets { ranges, bufs })
    }

    /// Copies bucket `k` of every rank's gradients out (on its compute stream) and
    /// enqueues their all-reduce (on the communicator's streams).
    fn reduce(
        &mut self,
        ctx: &mut ThreadContext,
        comm: &Communicator,
        devices: &[Arc<Device>],
        streams: &[Stream],
        reps: &[Gpt<T>],
        k: usize,
    ) -> gpubind::Result<()> {
        let range = self.ranges[k].clone();
        for (r, rep) in reps.iter().enumerate() {
            let gpu = ctx.bind(&devices[r])?;
            let s = gpu.on(&streams[r])?;
            s.dtod_async(&rep.grads.slice(range.clone())?, &mut self.bufs[k][r])?;
        }
        let bufs = &mut self.bufs[k];
        ctx.group(comm, |g| {
            for (r, buf) in bufs.iter_mut().enumerate() {
                g.all_reduce_in_place(r, buf, Op::Sum)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Copies every reduced bucket of rank `r` back into its gradients (on `s`, through
    /// the shared borrow of the replica that its step holds).
    fn copy_back(&self, s: &mut BoundStream<'_>, r: usize, rep: &Gpt<T>) -> gpubind::Result<()> {
        for (k, range) in self.ranges.iter().enumerate() {
            s.dtod(&self.bufs[k][r], &rep.grads.slice(range.clone())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_parameter_once_in_backward_order() {
        let cfg = Config::named("small").unwrap();
        let lay = ParamLayout::new(&cfg);
        let mut ranges = bucket_ranges(&lay, cfg.layers);
        assert_eq!(ranges.len(), cfg.layers + 2);
        assert_eq!(ranges[0], lay.get("ln_f.weight").offset..lay.total);
        assert_eq!(ranges[1].start, lay.get("h.5.ln_1.weight").offset);
        assert_eq!(ranges[cfg.layers + 1].start, 0);
        ranges.sort_by_key(|r| r.start);
        assert_eq!(ranges[0].start, 0);
        assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(ranges.last().unwrap().end, lay.total);
    }
}
