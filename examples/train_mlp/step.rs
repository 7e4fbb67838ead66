//! The data-parallel step over all ranks: enqueue-only compute (the graph-capture seam),
//! the step-by-step form from host slices, and whole epochs with one host wait.

use super::kernels::Fns;
use super::replica::{Gradients, PinnedBatch, Replica};
use gpubind::collective::{Communicator, Op};
use gpubind::{Device, Error, Result, ThreadContext};
use std::sync::Arc;

/// Rank `r`'s communicator stream.
fn rank_stream(comm: &Communicator, r: usize) -> Result<&gpubind::Stream> {
    comm.stream(r)
        .ok_or_else(|| Error::InvalidArgument(format!("train_mlp: no stream for rank {r}")))
}

fn expect_ranks(comm: &Communicator, devices: usize, replicas: usize, fns: usize) -> Result<()> {
    let ranks = comm.len();
    if devices == ranks && replicas == ranks && fns == ranks {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "train_mlp: {ranks} ranks but {devices} devices, {replicas} replicas, {fns} kernel sets"
        )))
    }
}

/// Enqueues one data-parallel step's compute: forward + backward of every rank's shard
/// (already on its device, or enqueued before on the same stream), one group all-reduce
/// of the flat gradients (each pre-scaled by 1/`global_batch`, so the sum is the mean),
/// and the SGD step of every replica, all on the ranks' communicator streams. The loss
/// goes to loss slot `slot`. Enqueue-only: no host wait, no synchronous call, the same
/// work with the same buffers on every call — the part a CUDA graph can capture whole
/// (the seam for `train_mlp --graph`).
#[allow(clippy::too_many_arguments)]
pub fn enqueue_step(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    devices: &[Arc<Device>],
    replicas: &mut [Replica],
    fns: &[Fns<'_>],
    global_batch: usize,
    lr: f32,
    mu: f32,
    slot: usize,
) -> Result<()> {
    expect_ranks(comm, devices.len(), replicas.len(), fns.len())?;
    for (r, ((dev, rep), f)) in devices.iter().zip(replicas.iter_mut()).zip(fns).enumerate() {
        let gpu = ctx.bind(dev)?;
        rep.forward_backward_slot(&gpu.on(rank_stream(comm, r)?)?, f, global_batch, slot)?;
    }
    ctx.group(comm, |g| {
        for (r, rep) in replicas.iter_mut().enumerate() {
            g.all_reduce(r, &rep.grads, &mut rep.reduced, Op::Sum)?;
        }
        Ok(())
    })?;
    for (r, ((dev, rep), f)) in devices.iter().zip(replicas.iter_mut()).zip(fns).enumerate() {
        let gpu = ctx.bind(dev)?;
        rep.sgd(
            &gpu.on(rank_stream(comm, r)?)?,
            f,
            lr,
            mu,
            Gradients::Reduced,
        )?;
    }
    Ok(())
}

/// The summed loss of slots `0..slots` over every rank, after `comm` was synchronised.
fn gather_losses(
    ctx: &mut ThreadContext,
    devices: &[Arc<Device>],
    replicas: &[Replica],
    slots: usize,
) -> Result<Vec<f64>> {
    let mut total = vec![0.0f64; slots];
    for (dev, rep) in devices.iter().zip(replicas) {
        let losses = rep.losses(&ctx.bind(dev)?)?;
        for (t, l) in total.iter_mut().zip(&losses) {
            *t += *l as f64;
        }
    }
    Ok(total)
}

/// One data-parallel step over every rank of `comm` from host slices: rank `r` (on
/// `devices[r]`) trains on rows `r·shard .. (r+1)·shard` of the batch `x`/`y` (uploaded
/// synchronously), then [`enqueue_step`], then one host wait. Returns the batch's summed
/// loss.
#[allow(clippy::too_many_arguments)]
pub fn data_parallel_step(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    devices: &[Arc<Device>],
    replicas: &mut [Replica],
    fns: &[Fns<'_>],
    x: &[f32],
    y: &[u32],
    lr: f32,
    mu: f32,
) -> Result<f64> {
    expect_ranks(comm, devices.len(), replicas.len(), fns.len())?;
    let batch = y.len();
    let shard = batch / replicas.len();
    let input = replicas[0].shape().input;
    if shard * replicas.len() != batch || x.len() != batch * input {
        return Err(Error::InvalidArgument(format!(
            "train_mlp: a batch of {batch} rows ({} inputs) does not split into {} shards",
            x.len(),
            replicas.len()
        )));
    }
    for (r, (dev, rep)) in devices.iter().zip(replicas.iter_mut()).enumerate() {
        let gpu = ctx.bind(dev)?;
        let rows = r * shard;
        rep.load_batch(
            &gpu,
            &x[rows * input..(rows + shard) * input],
            &y[rows..rows + shard],
        )?;
    }
    enqueue_step(ctx, comm, devices, replicas, fns, batch, lr, mu, 0)?;
    comm.synchronize(ctx)?;
    Ok(gather_losses(ctx, devices, replicas, 1)?[0])
}

/// Enqueues `batches.len()` steps (`batches[step][rank]`: each rank's shard, page-locked),
/// each an asynchronous upload followed by [`enqueue_step`] with loss slot `step`, then
/// waits once for all of them. Returns each step's summed loss.
#[allow(clippy::too_many_arguments)]
pub fn train_steps(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    devices: &[Arc<Device>],
    replicas: &mut [Replica],
    fns: &[Fns<'_>],
    batches: &[Vec<PinnedBatch>],
    global_batch: usize,
    lr: f32,
    mu: f32,
) -> Result<Vec<f64>> {
    expect_ranks(comm, devices.len(), replicas.len(), fns.len())?;
    let enqueued = (|| {
        for (step, shards) in batches.iter().enumerate() {
            if shards.len() != replicas.len() {
                return Err(Error::InvalidArgument(format!(
                    "train_mlp: step {step} has {} shards for {} ranks",
                    shards.len(),
                    replicas.len()
                )));
            }
            for (r, ((dev, rep), shard)) in devices
                .iter()
                .zip(replicas.iter_mut())
                .zip(shards)
                .enumerate()
            {
                let gpu = ctx.bind(dev)?;
                rep.upload(&gpu.on(rank_stream(comm, r)?)?, shard)?;
            }
            enqueue_step(
                ctx,
                comm,
                devices,
                replicas,
                fns,
                global_batch,
                lr,
                mu,
                step,
            )?;
        }
        Ok(())
    })();
    // Wait also after a failed enqueue, so nothing is left running behind the error.
    let waited = comm.synchronize(ctx);
    enqueued?;
    waited?;
    gather_losses(ctx, devices, replicas, batches.len())
}
