//! Host-side instructions per operation, gpubind against the bare driver call, for
//! `scripts/profile-overhead.sh` (callgrind). Not a timing benchmark: it runs one case for
//! a given number of iterations and exits; the script runs each case twice with different
//! counts under `valgrind --tool=callgrind` and divides the difference of the instruction
//! totals by the difference of the counts, so set-up and tear-down cancel out.
//!
//! It works against any `libcuda.so.1`: the H200's driver, or the stand-in the script
//! builds (scripts/stub-cuda/stub_cuda.c) so that only gpubind's own host work (and
//! cudarc's lazy symbol lookup, which the raw column pays too) is counted on a machine
//! without a GPU. With no case named (`cargo bench` runs it so) it prints a SKIPPED line.
//!
//! `host_ops <case> <iterations>`; cases: memset-{gpubind,raw}, handoff-{gpubind,raw},
//! launch0-{gpubind,raw}, launch3-{gpubind,raw}, temporary-{gpubind,raw} (a 4 KiB
//! stream-ordered allocation, zeroed, written by one launch and dropped: gpubench's
//! "temporary … alloc + launch + drop" row).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

use gpubind::cudarc::driver::sys;
use gpubind::{Device, LaunchConfig, ThreadContext};
use std::error::Error;

type R<T> = Result<T, Box<dyn Error>>;

/// Two kernels; the stand-in driver only looks at their names.
const PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry empty() { ret; }
.visible .entry touch(.param .u64 a, .param .u64 b, .param .u32 n) { ret; }
";

fn ck(r: sys::CUresult, call: &str) -> R<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {r:?}").into())
    }
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (case, n) = match args.as_slice() {
        [case, n] => (case.as_str(), n.parse::<usize>()?),
        _ => {
            println!(
                "host_ops: SKIPPED (run by scripts/profile-overhead.sh with a case and a count)"
            );
            return Ok(());
        }
    };
    let dev = Device::get(0)?;
    let mut tc = ThreadContext::acquire()?;
    let gpu = tc.bind(&dev)?;
    let (s1, s2) = (gpu.new_stream()?, gpu.new_stream()?);
    let (a, b) = (gpu.on(&s1)?, gpu.on(&s2)?);
    let mut buf = gpu.alloc_zeros::<u8>(256)?;
    let mut fa = gpu.alloc_zeros::<f32>(32)?;
    let fb = gpu.alloc_zeros::<f32>(32)?;
    let module = gpu.load_ptx(PTX)?;
    let (empty, touch) = (module.function("empty")?, module.function("touch")?);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let len = 32u32;
    // The raw column: the same driver calls on the same streams, nothing else.
    // SAFETY: used only while the streams live and the device is bound.
    let (raw1, raw2) = unsafe { (s1.raw(), s2.raw()) };
    let mut event: sys::CUevent = std::ptr::null_mut();
    // SAFETY: the device's context is current (bound above); writes one handle.
    ck(
        unsafe { sys::cuEventCreate(&mut event, 2) },
        "cuEventCreate",
    )?;
    // SAFETY: used only while the buffers live.
    let (dbuf, da, db) = unsafe { (buf.raw_ptr(), fa.raw_ptr(), fb.raw_ptr()) };
    // SAFETY: used only while the module lives.
    let (fempty, ftouch) = unsafe { (empty.raw(), touch.raw()) };
    let raw_launch = |f: sys::CUfunction, params: *mut *mut std::ffi::c_void| {
        // SAFETY: a function of the current context, launched with its parameters.
        ck(
            unsafe {
                sys::cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, raw1, params, std::ptr::null_mut())
            },
            "cuLaunchKernel",
        )
    };
    for i in 0..n {
        match case {
            "memset-gpubind" => a.memset_zeros_async(&mut buf)?,
            // SAFETY: a live 256-byte allocation and a stream of the current context.
            "memset-raw" => ck(
                unsafe { sys::cuMemsetD8Async(dbuf, 0, 256, raw1) },
                "memset",
            )?,
            "handoff-gpubind" => {
                let s = if i % 2 == 0 { &a } else { &b };
                s.memset_zeros_async(&mut buf)?
            }
            "handoff-raw" => {
                let (from, to) = if i % 2 == 0 {
                    (raw2, raw1)
                } else {
                    (raw1, raw2)
                };
                // SAFETY: our event and streams, all of the current context.
                unsafe {
                    ck(sys::cuEventRecord(event, from), "cuEventRecord")?;
                    ck(sys::cuStreamWaitEvent(to, event, 0), "cuStreamWaitEvent")?;
                    ck(sys::cuMemsetD8Async(dbuf, 0, 256, to), "memset")?;
                }
            }
            // SAFETY: `empty` takes no parameters.
            "launch0-gpubind" => unsafe { a.launch(&empty, cfg).launch()? },
            "launch0-raw" => raw_launch(fempty, std::ptr::null_mut())?,
            // SAFETY: (float*, const float*, unsigned) as `touch` declares.
            "launch3-gpubind" => unsafe {
                a.launch(&touch, cfg)
                    .arg(&mut fa)
                    .arg(&fb)
                    .arg(&len)
                    .launch()?
            },
            "launch3-raw" => {
                let (mut pa, mut pb, mut pn) = (da, db, len);
                let mut params: [*mut std::ffi::c_void; 3] = [
                    (&mut pa as *mut sys::CUdeviceptr).cast(),
                    (&mut pb as *mut sys::CUdeviceptr).cast(),
                    (&mut pn as *mut u32).cast(),
                ];
                raw_launch(ftouch, params.as_mut_ptr())?
            }
            "temporary-gpubind" => {
                let mut tmp = a.alloc_zeros::<f32>(1024)?;
                // SAFETY: (float*, const float*, unsigned) as `touch` declares.
                unsafe {
                    a.launch(&touch, cfg)
                        .arg(&mut tmp)
                        .arg(&fb)
                        .arg(&len)
                        .launch()?
                };
                drop(tmp);
            }
            "temporary-raw" => {
                let mut pt: sys::CUdeviceptr = 0;
                // SAFETY: the device's context is current; `pt` is freed below, on the
                // same stream, after the memset and the kernel.
                unsafe {
                    ck(sys::cuMemAllocAsync(&mut pt, 4096, raw1), "cuMemAllocAsync")?;
                    ck(sys::cuMemsetD8Async(pt, 0, 4096, raw1), "memset")?;
                }
                let (mut pb, mut pn) = (db, len);
                let mut params: [*mut std::ffi::c_void; 3] = [
                    (&mut pt as *mut sys::CUdeviceptr).cast(),
                    (&mut pb as *mut sys::CUdeviceptr).cast(),
                    (&mut pn as *mut u32).cast(),
                ];
                raw_launch(ftouch, params.as_mut_ptr())?;
                // SAFETY: allocated above on this stream; every use is ordered before.
                ck(unsafe { sys::cuMemFreeAsync(pt, raw1) }, "cuMemFreeAsync")?
            }
            other => return Err(format!("unknown case {other}").into()),
        }
    }
    a.synchronize()?;
    b.synchronize()?;
    // SAFETY: our event; nothing waits on it any more (both streams synchronised).
    ck(
        unsafe { sys::cuEventDestroy_v2(event) },
        "cuEventDestroy_v2",
    )?;
    Ok(())
}
