//! A host read of page-locked memory inside a capture closure, where the read must wait
//! for a download still in flight on another stream; part of `gpu_memory_kinds`.
//!
//! `Deref` of a `PinnedHostBuffer` cannot return an error: a wait the driver refuses
//! aborts the process (handing out the slice would race the DMA). So the read runs in a
//! child process, and the test checks that the child neither aborted nor saw stale data.

use super::{TestResult, with_gpu};
use crate::common::Ctx;
use crate::ensure;
use gpubind::{LaunchConfig, PinnedOptions};

/// The child role of [`pinned_read_inside_a_capture_waits`].
pub const ROLE: &str = "pinned_read_in_capture";

/// Elements downloaded, and the value the slow kernel writes.
const N: usize = 1 << 20;
const VALUE: u32 = 7;

/// Runs in the child: a slow kernel writes a device buffer, a tracked download copies it
/// into pinned memory on the same stream, and a capture closure reads the pinned memory
/// on the host (a wait for that stream while this thread captures).
pub fn child() -> ! {
    let out = with_gpu(|gpu| {
        let module = gpu
            .compile_and_load(crate::common::slow_fill_cuda!(), "slow.cu")
            .ctx("compile slow_fill")?;
        let slow = module.function("slow_fill").ctx("slow_fill")?;
        let mut d = gpu.alloc_zeros::<u32>(N).ctx("alloc")?;
        let mut pinned = gpu
            .alloc_pinned::<u32>(N, PinnedOptions::default())
            .ctx("alloc_pinned")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let (n, cycles) = (N as u32, 500_000_000i64);
        // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; stays below n.
        unsafe {
            s.launch(&slow, LaunchConfig::for_num_elems(n))
                .arg(&mut d)
                .arg(&n)
                .arg(&VALUE)
                .arg(&cycles)
                .launch()
        }
        .ctx("slow_fill")?;
        s.copy_tracked_async(&d, &mut pinned).ctx("download")?;
        let x = gpu.alloc_zeros::<u32>(16).ctx("alloc x")?;
        let mut seen = 0;
        let captured = gpu.capture(|c| {
            seen = pinned[N - 1]; // waits for the download, inside the capture
            c.memset(&x, 1u32)
        });
        println!(
            "child: a pinned read inside a capture saw {seen} (want {VALUE}); the capture: {}",
            match &captured {
                Ok(_) => "a graph".to_string(),
                Err(e) => format!("typed error {e}"),
            }
        );
        ensure!(seen == VALUE, "the read did not wait for the download");
        Ok(())
    });
    match out {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("child: {e}");
            std::process::exit(1)
        }
    }
}

/// A host read of page-locked memory inside a capture closure waits for the pending
/// download and returns its data; neither the wait nor the capture aborts the process
/// (the capture may end in a typed error if the driver counts the wait as unsafe).
pub fn pinned_read_inside_a_capture_waits() -> TestResult {
    let out = std::process::Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", ROLE)
        .output()
        .ctx("spawn child")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    ensure!(
        out.status.success(),
        "the child failed ({}): {stderr}",
        out.status
    );
    ensure!(
        stdout.contains(&format!("saw {VALUE} ")),
        "the child printed no read: {stdout}"
    );
    Ok(())
}
