//! One NCCL rank per process, started by a launcher: every rank all-reduces `rank + 1`
//! and checks the sum `W(W+1)/2`.
//!
//! ```text
//! cargo build --release --example nccl_launch
//! # one machine, one process per GPU (torchrun's store takes MASTER_PORT, gpubind
//! # serves the NCCL id on MASTER_PORT + 1):
//! torchrun --standalone --nproc-per-node 2 --no-python target/release/examples/nccl_launch
//! # Open MPI, Slurm:
//! mpirun -np 2 target/release/examples/nccl_launch
//! srun --ntasks-per-node 2 --gpus-per-task 1 target/release/examples/nccl_launch
//! ```
//!
//! (Across machines set `MASTER_ADDR` to rank 0's host for mpirun/srun; torchrun sets
//! it.) `GPUBIND_RDZV_TIMEOUT=<seconds>` bounds the rendezvous and NCCL's
//! initialisation (default 300). Exits 1 with the typed error on any failure.
//!
//! `--kernels` uses gpubind's own kernels instead of NCCL (`RankComm::from_launch_kernels`:
//! every rank on one machine, any number per GPU), e.g. 4 processes on one GPU:
//!
//! ```text
//! torchrun --standalone --nproc-per-node 4 --no-python target/release/examples/nccl_launch --kernels
//! ```

use gpubind::collective::LaunchEnv;
use gpubind::collective::{Op, RankComm};
use gpubind::{Device, ThreadContext};

fn run() -> gpubind::Result<String> {
    let env = LaunchEnv::from_env()?;
    // One GPU per process: the local rank, or device 0 where the launcher shows each
    // process only its own GPU (CUDA_VISIBLE_DEVICES, srun --gpus-per-task).
    let ordinal = if Device::count()? > env.local_rank {
        env.local_rank
    } else {
        0
    };
    let dev = Device::get(ordinal)?;
    let mut ctx = ThreadContext::acquire()?;
    let kernels = std::env::args().any(|a| a == "--kernels");
    let mut comm = if kernels {
        RankComm::from_launch_kernels(&mut ctx, &dev, &env)?
    } else {
        RankComm::from_launch(&mut ctx, &dev, &env)?
    };
    let gpu = ctx.bind(&dev)?;
    let stream = gpu.new_stream()?;
    let n = 1 << 20;
    let send = gpu.clone_htod(&vec![(env.rank + 1) as f32; n])?;
    let mut sum = gpu.alloc_zeros::<f32>(n)?;
    let s = gpu.on(&stream)?;
    comm.all_reduce(&s, &send, &mut sum, Op::Sum)?;
    s.synchronize()?;
    let got = gpu.dtoh(&sum)?;
    let w = env.world_size;
    let want = (w * (w + 1) / 2) as f32;
    if got.iter().any(|&x| x != want) {
        return Err(gpubind::Error::InvalidArgument(format!(
            "rank {}: all_reduce gave {}, want {want}",
            env.rank, got[0]
        )));
    }
    Ok(format!(
        "rank {} of {w} ({:?}, local rank {}, GPU {ordinal}, {}): all_reduce ok ({want})",
        env.rank,
        env.launcher,
        env.local_rank,
        if kernels { "own kernels" } else { "NCCL" }
    ))
}

fn main() {
    match run() {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("nccl_launch: {e}");
            std::process::exit(1);
        }
    }
}
