//! Data parallelism in one process: `--devices 0,1` (or `0,0`, two ranks on one GPU),
//! one thread driving every rank through `ctx.group`.
//!
//! Each rank holds a full replica and trains `batch / ranks` sequences of every step
//! (rank r the r-th slice of the step's sequences); its loss gradient is scaled by
//! 1/ranks, so the all-reduced (summed) gradients are those of the whole batch. The
//! gradients are all-reduced with the own-kernel backend in one group call after the
//! backward pass of every rank, then each replica clips and applies AdamW to identical
//! gradients, so the replicas stay identical. The reported loss is the ranks' mean.
//!
//! The all-reduce is neither bucketed nor overlapped with the backward pass: views of one
//! allocation share one access tracker, so an all-reduce of one layer's gradient view on
//! a communicator stream would hold back the backward pass writing the next layer's view
//! of the same flat gradient buffer.

use crate::GptError;
use crate::args::Args;
use crate::data::{self, Dataset};
use crate::gpt::{Act, Gpt};
use crate::model::Config;
use crate::optim::{AdamW, Schedule};
use gpubind::collective::{CommOptions, Communicator, Op};
use gpubind::{Device, DeviceSlice, ThreadContext};
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
    let mut reduced: Vec<DeviceSlice<T>> = Vec::with_capacity(ranks);
    for dev in devices {
        let gpu = ctx.bind(dev)?;
        let mut rep = Gpt::<T>::new(&gpu, cfg, shard, init)?;
        rep.grad_scale = 1.0 / ranks as f32;
        reduced.push(gpu.alloc_zeros(rep.layout.total)?);
        reps.push(rep);
    }
    let stream = |r: usize| {
        comm.stream(r)
            .ok_or_else(|| GptError::Usage(format!("no stream for rank {r}")))
    };
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
            let mut s = gpu.on(stream(r)?)?;
            let (x, y) = data::make_batch(&data.train, &starts[r * shard..(r + 1) * shard], t);
            rep.upload(&gpu, &x, &y)?;
            gpu.htod_copy(&sched.device_values(step, &hp), &mut rep.sched)?;
            rep.forward(&mut s, true)?;
            rep.backward(&mut s)?;
        }
        ctx.group(&comm, |g| {
            for (r, (rep, red)) in reps.iter().zip(reduced.iter_mut()).enumerate() {
                g.all_reduce(r, &rep.grads, red, Op::Sum)?;
            }
            Ok(())
        })?;
        let mut sum = 0.0f64;
        for (r, (rep, red)) in reps.iter_mut().zip(reduced.iter_mut()).enumerate() {
            // The summed gradients become the replica's; its own go to the next reduce.
            std::mem::swap(&mut rep.grads, red);
            let gpu = ctx.bind(&devices[r])?;
            rep.update(&mut gpu.on(stream(r)?)?, &hp)?;
            sum += f64::from(gpu.dtoh(&rep.loss)?[0]);
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
