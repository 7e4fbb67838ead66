//! `--launcher env`: one rank per process, started by torchrun, mpirun or srun
//! (`gpubind::collective::LaunchEnv` reads their variables).
//!
//! Rank r trains sequences `r·shard .. (r+1)·shard` of every step (shard = batch / world
//! size), the slice the in-process run (`dp.rs`) gives rank r, with its loss gradient
//! scaled by 1/world; the gradients are summed by [`RankComm`] all-reduces: NCCL, or
//! gpubind's own kernels across the processes of one machine when two local ranks share
//! a GPU (NCCL refuses that) or NCCL is not available. As in `dp.rs`, the backward pass
//! runs part by part on a compute stream and each part's bucket is all-reduced on a
//! communicator stream as soon as it is done, through allocations of its own. The step's loss is the all-reduced
//! mean of the ranks' losses; rank 0 prints the lines.
//!
//! The device of local rank l is `--devices`'s l-th entry when the list has one per
//! local rank, else l modulo the visible devices.

use crate::GptError;
use crate::args::Args;
use crate::data::{self, Dataset};
use crate::dp::bucket_ranges;
use crate::gpt::step::train_step;
use crate::gpt::{Act, Gpt};
use crate::model::Config;
use crate::optim::{AdamW, Schedule};
use gpubind::collective::{LaunchEnv, Op, RankComm, nccl_available};
use gpubind::{Device, Issue, ThreadContext};
use std::time::Instant;

/// The device of local rank `local` (see the module docs).
fn device_of(devices: &[usize], local: usize, local_world: usize, count: usize) -> usize {
    if devices.len() == local_world {
        devices[local]
    } else {
        local % count.max(1)
    }
}

/// Trains this process's rank for `a.steps` steps.
pub fn train<T: Act>(
    a: &Args,
    cfg: Config,
    data: &Dataset,
    order: &[u64],
    init: &[f32],
) -> Result<(), GptError> {
    let env = LaunchEnv::from_env()?;
    let (rank, world) = (env.rank, env.world_size);
    if !a.batch.is_multiple_of(world) {
        return Err(GptError::Usage(format!(
            "--batch {} is not divisible by {world} ranks",
            a.batch
        )));
    }
    let count = Device::count()?;
    let local_world = env.local_world_size.unwrap_or(1);
    let mine = device_of(&a.devices, env.local_rank, local_world, count);
    let mut local: Vec<usize> = (0..local_world)
        .map(|l| device_of(&a.devices, l, local_world, count))
        .collect();
    local.sort_unstable();
    local.dedup();
    let shared_gpu = local.len() < local_world;
    let dev = Device::get(mine)?;
    let mut ctx = ThreadContext::acquire()?;
    let mut comm = if shared_gpu || !nccl_available() {
        RankComm::from_launch_kernels(&mut ctx, &dev, &env)?
    } else {
        RankComm::from_launch(&mut ctx, &dev, &env)?
    };
    let shard = a.batch / world;
    let gpu = ctx.bind(&dev)?;
    let mut model = Gpt::<T>::new(&gpu, cfg, shard, init, a.fusion)?;
    model.grad_scale = 1.0 / world as f32;
    let ranges = bucket_ranges(&model.layout, cfg.layers);
    // Each bucket is copied out of the gradients and all-reduced in place in its copy,
    // so that the rest of the backward pass need not wait for the collective.
    let mut bufs = Vec::with_capacity(ranges.len());
    for r in &ranges {
        bufs.push(gpu.alloc_zeros::<T>(r.len())?);
    }
    let mut loss_sum = gpu.alloc_zeros::<f32>(1)?;
    let (stream, comm_stream) = (gpu.new_stream()?, gpu.new_stream()?);
    let mut s = gpu.on(&stream)?;
    let cs = gpu.on(&comm_stream)?;
    let (t, b) = (cfg.context, a.batch);
    let sched = Schedule::new(a.lr, a.steps);
    let hp = AdamW::default();
    for step in 0..a.steps {
        let t0 = Instant::now();
        let mine = &order[step * b + rank * shard..step * b + (rank + 1) * shard];
        let (x, y) = data::make_batch(&data.train, mine, t);
        model.upload(&gpu, &x, &y)?;
        gpu.htod_copy(&sched.device_values(step, &hp), &mut model.sched)?;
        let last = ranges.len() - 1;
        train_step(&mut model.eager(&mut s)?, hp, |x, k| {
            // Bucket k, done: copied out and all-reduced on the communicator stream.
            x.s.dtod_async(&x.model.grads.slice(ranges[k].clone())?, &mut bufs[k])?;
            comm.all_reduce_in_place(&cs, &mut bufs[k], Op::Sum)?;
            if k == last {
                // Every bucket reduced: back into the gradients (which the step borrows
                // shared) before the update.
                for (k, r) in ranges.iter().enumerate() {
                    x.s.dtod(&bufs[k], &x.model.grads.slice(r.clone())?)?;
                }
            }
            Ok(())
        })?;
        comm.all_reduce(&cs, &model.loss, &mut loss_sum, Op::Sum)?;
        let loss = gpu.dtoh(&loss_sum)?[0] / world as f32;
        if rank == 0 {
            println!("step {} loss {loss:.6}", step + 1);
            if (step + 1) % a.log_every == 0 || step + 1 == a.steps {
                println!(
                    "progress step {}/{} loss {loss:.4} {:.0} tokens/s ({world} processes)",
                    step + 1,
                    a.steps,
                    (b * t) as f64 / t0.elapsed().as_secs_f64()
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_follow_the_list_or_the_local_rank() {
        assert_eq!(device_of(&[0, 0], 1, 2, 8), 0);
        assert_eq!(device_of(&[3, 5], 1, 2, 8), 5);
        // A list that does not name every local rank: local rank modulo the devices.
        assert_eq!(device_of(&[0], 3, 4, 2), 1);
    }
}
