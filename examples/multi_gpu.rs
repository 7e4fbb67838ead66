//! Multi-GPU first steps: the same all-reduce driven two ways, each result checked.
//!
//! 1. **One thread, N GPUs**: a [`Communicator`] and `ctx.group`: the thread records every
//!    rank's call, and the group binds each rank's device to enqueue it.
//! 2. **A thread per GPU**: [`Communicator::init_all`] gives one `RankComm` per rank; each
//!    thread binds its own device and calls the collective on its own stream.
//!
//! Rank `r` contributes `r + 1` (scaled on the GPU by a kernel the rank's thread keeps
//! in a struct, a [`gpubind::Kernel`]), so every rank must end with `N (N + 1) / 2`.
//!
//! ```text
//! cargo run --release --example multi_gpu                  # every GPU, one rank each
//! cargo run --release --example multi_gpu -- --devices 0,0 # two ranks on GPU 0
//! cargo run --release --example multi_gpu -- --devices 0,1 --nccl
//! ```
//!
//! The own-kernel backend (the default) takes any device list, the same GPU several
//! times included; `--nccl` needs distinct devices and `libnccl.so.2`. Exits 1 with the
//! typed error on any failure.

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

use gpubind::collective::{CommOptions, Communicator, Op};
use gpubind::{BoundDevice, Device, DeviceSlice, Kernel, LaunchConfig, ThreadContext};
use std::sync::Arc;

/// Elements per rank.
const N: usize = 1 << 20;

/// A rank's kernels, held without their module.
struct Prepare {
    fill: Kernel,
}

impl Prepare {
    fn new(gpu: &BoundDevice<'_>) -> gpubind::Result<Self> {
        let module = gpu.compile_and_load(
            r#"extern "C" __global__ void fill(float* x, float v, unsigned n) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) x[i] = v;
            }"#,
            "fill.cu",
        )?;
        Ok(Prepare {
            fill: module.into_shared().kernel("fill")?,
        })
    }

    /// A buffer of `N` copies of `value`, written on the device.
    fn filled(&self, gpu: &BoundDevice<'_>, value: f32) -> gpubind::Result<DeviceSlice<f32>> {
        let mut x = gpu.alloc_zeros::<f32>(N)?;
        let n = N as u32;
        // SAFETY: (float*, float, unsigned) matches `fill`, which stays inside the n
        // elements of `x`.
        unsafe {
            gpu.default_stream()
                .launch(&self.fill, LaunchConfig::for_num_elems(n))
                .arg(&mut x)
                .arg(&value)
                .arg(&n)
                .launch()?;
        }
        Ok(x)
    }
}

/// `Err` naming the rank unless every element of `got` is `want`.
fn check(how: &str, rank: usize, got: &[f32], want: f32) -> gpubind::Result<()> {
    match got.iter().position(|&v| v != want) {
        None => Ok(()),
        Some(i) => Err(gpubind::Error::InvalidArgument(format!(
            "{how}: rank {rank} element {i} is {}, want {want}",
            got[i]
        ))),
    }
}

/// One thread drives every rank through `ctx.group`.
fn one_thread(devices: &[Arc<Device>], options: CommOptions) -> gpubind::Result<()> {
    let mut ctx = ThreadContext::acquire()?;
    let comm = Communicator::new(&mut ctx, devices, options)?;
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for (rank, dev) in devices.iter().enumerate() {
        let gpu = ctx.bind(dev)?;
        send.push(Prepare::new(&gpu)?.filled(&gpu, (rank + 1) as f32)?);
        recv.push(gpu.alloc_zeros::<f32>(N)?);
    }
    ctx.group(&comm, |g| {
        for (rank, (s, r)) in send.iter().zip(recv.iter_mut()).enumerate() {
            g.all_reduce(rank, s, r, Op::Sum)?;
        }
        Ok(())
    })?;
    comm.synchronize(&mut ctx)?;
    let n = devices.len();
    let want = (n * (n + 1) / 2) as f32;
    for (rank, (dev, r)) in devices.iter().zip(&recv).enumerate() {
        check("one thread", rank, &ctx.bind(dev)?.dtoh(r)?, want)?;
    }
    Ok(())
}

/// A thread per rank, each with its own `ThreadContext` and `RankComm`.
fn thread_per_gpu(devices: &[Arc<Device>], options: CommOptions) -> gpubind::Result<()> {
    let comms = Communicator::init_all(devices, options)?;
    let n = devices.len();
    let want = (n * (n + 1) / 2) as f32;
    std::thread::scope(|s| {
        let workers: Vec<_> = devices
            .iter()
            .zip(comms)
            .map(|(dev, mut comm)| {
                s.spawn(move || -> gpubind::Result<()> {
                    let mut ctx = ThreadContext::acquire()?;
                    let gpu = ctx.bind(dev)?;
                    let rank = comm.rank();
                    let send = Prepare::new(&gpu)?.filled(&gpu, (rank + 1) as f32)?;
                    let mut recv = gpu.alloc_zeros::<f32>(N)?;
                    let stream = gpu.new_stream()?;
                    let on = gpu.on(&stream)?;
                    comm.all_reduce(&on, &send, &mut recv, Op::Sum)?;
                    on.synchronize()?;
                    check("a thread per GPU", rank, &gpu.dtoh(&recv)?, want)
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join().unwrap_or_else(|_| {
                Err(gpubind::Error::InvalidArgument(
                    "a rank's thread panicked".into(),
                ))
            })
        })
    })
}

/// `--devices 0,0,1` (default: every GPU once) and `--nccl`.
fn parse_args() -> gpubind::Result<(Vec<Arc<Device>>, bool)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut devices = None;
    let mut nccl = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--devices" => {
                let list = args
                    .get(i + 1)
                    .ok_or_else(|| usage("--devices needs a list"))?;
                let ordinals = list
                    .split(',')
                    .map(|o| o.trim().parse::<usize>().map_err(|_| usage(list)))
                    .collect::<gpubind::Result<Vec<_>>>()?;
                devices = Some(
                    ordinals
                        .into_iter()
                        .map(Device::get)
                        .collect::<gpubind::Result<Vec<_>>>()?,
                );
                i += 2;
            }
            "--nccl" => {
                nccl = true;
                i += 1;
            }
            other => return Err(usage(other)),
        }
    }
    let devices = match devices {
        Some(d) => d,
        None => Device::all()?,
    };
    if devices.is_empty() {
        return Err(usage("no device"));
    }
    Ok((devices, nccl))
}

fn usage(what: &str) -> gpubind::Error {
    gpubind::Error::InvalidArgument(format!(
        "multi_gpu: unexpected {what:?}; usage: multi_gpu [--devices 0,0,1] [--nccl]"
    ))
}

fn run() -> gpubind::Result<()> {
    let (devices, nccl) = parse_args()?;
    let options = || {
        if nccl {
            CommOptions::nccl()
        } else {
            CommOptions::kernels()
        }
    };
    let ordinals: Vec<usize> = devices.iter().map(|d| d.ordinal()).collect();
    let backend = if nccl { "NCCL" } else { "own kernels" };
    println!("{} ranks on GPUs {ordinals:?} ({backend})", devices.len());
    one_thread(&devices, options())?;
    println!("one thread, {} ranks: all_reduce ok", devices.len());
    thread_per_gpu(&devices, options())?;
    println!("a thread per rank: all_reduce ok");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("multi_gpu: {e}");
        std::process::exit(1);
    }
}
