//! GPU tests of tracked asynchronous copies (page-locked memory and its views, in flight
//! across iterations without a synchronisation by the caller) and of copies between
//! devices (`cuMemcpyPeerAsync`, ordered with the buffers' pending uses on every device).
//!
//! Run: `cargo test --test gpu_copies` (prints one SKIPPED line without a GPU; the tests
//! that need two GPUs report SKIPPED on a machine with one).

// Buffers a kernel writes are passed as `&mut`, as gpubind's launch docs recommend.
#![allow(clippy::unnecessary_mut_passed)]

mod common;

use common::Ctx;
use gpubind::{
    BoundDevice, BoundStream, Device, DeviceSlice, Error, Function, LaunchConfig, PinnedOptions,
    ThreadContext,
};

type TestResult = Result<(), String>;

/// About 200 ms of GPU clock at ~2 GHz: long enough that work queued behind it is
/// certainly still pending when the host gets to its next call.
const SPIN_CYCLES: i64 = 400_000_000;

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
extern "C" __global__ void add_one(unsigned* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1u;
}
"#
);

fn with_gpu(f: impl FnOnce(&BoundDevice<'_>) -> TestResult) -> TestResult {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = common::dev0()?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    f(&gpu)
}

/// Enqueues `slow_fill(out, value)` on `s`: spins ~[`SPIN_CYCLES`], then writes `value`
/// to every element of `out`.
fn slow_fill(
    s: &BoundStream<'_>,
    f: &Function<'_>,
    out: &mut DeviceSlice<u32>,
    value: u32,
) -> TestResult {
    let n = out.len() as u32;
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; the kernel checks i < n.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(out)
            .arg(&n)
            .arg(&value)
            .arg(&SPIN_CYCLES)
            .launch()
    }
    .ctx("launch slow_fill")
}

fn dtoh_into_pinned_is_seen_by_a_host_read() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
        let fill = module.function("slow_fill").ctx("function")?;
        let n = 1 << 20;
        let mut dev = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let mut pinned = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let done = gpu.new_event(false).ctx("event")?;
        slow_fill(&s, &fill, &mut dev, 0xC0FFEE)?;
        s.copy_tracked_async(&dev, &mut pinned)
            .ctx("copy_tracked_async dtoh")?;
        s.record(&done).ctx("record")?;
        ensure!(
            !done.is_complete().ctx("query")?,
            "the download finished before the host read: the test proves nothing"
        );
        // No synchronisation: the read itself waits for the pending download.
        let host: &[u32] = &pinned;
        ensure!(
            host.iter().all(|&v| v == 0xC0FFEE),
            "host read of pinned memory did not see the pending download (first: {:#x})",
            host[0]
        );
        ensure!(done.is_complete().ctx("query")?, "read returned early");
        Ok(())
    })
}

fn host_write_waits_for_a_pending_upload() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
        let fill = module.function("slow_fill").ctx("function")?;
        let n = 1 << 20;
        let mut pinned = gpu
            .pinned_from_slice(&vec![1u32; n], PinnedOptions::default())
            .ctx("pin")?;
        let mut dev = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let mut junk = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let done = gpu.new_event(false).ctx("event")?;
        // The spin holds the stream, so the upload is still pending at the host write.
        slow_fill(&s, &fill, &mut junk, 5)?;
        s.copy_tracked_async(&pinned, &mut dev)
            .ctx("copy_tracked_async htod")?;
        s.record(&done).ctx("record")?;
        ensure!(
            !done.is_complete().ctx("query")?,
            "the upload finished before the host write: the test proves nothing"
        );
        pinned.fill(2); // waits until the upload has read the old contents
        ensure!(
            done.is_complete().ctx("query")?,
            "the host write did not wait for the pending upload"
        );
        let got = gpu.dtoh(&dev).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&v| v == 1),
            "the device got data written after the upload was enqueued"
        );
        ensure!(pinned.iter().all(|&v| v == 2), "host write lost");
        Ok(())
    })
}

fn copies_stay_in_flight_across_iterations() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
        let add_one = module.function("add_one").ctx("function")?;
        let n = 1 << 18;
        let mut input = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let mut output = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let mut dev = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let nn = n as u32;
        for step in 0..8u32 {
            input.fill(step * 10);
            s.copy_tracked_async(&input, &mut dev).ctx("upload")?;
            // SAFETY: (unsigned*, unsigned) matches; the kernel checks i < n.
            unsafe {
                s.launch(&add_one, LaunchConfig::for_num_elems(nn))
                    .arg(&mut dev)
                    .arg(&nn)
                    .launch()
            }
            .ctx("launch")?;
            s.copy_tracked_async(&dev, &mut output).ctx("download")?;
            if step % 2 == 1 {
                // Every other step reads back; the others stay in flight into the next.
                ensure!(
                    output.iter().all(|&v| v == step * 10 + 1),
                    "step {step}: got {}",
                    output[0]
                );
            }
        }
        Ok(())
    })
}

fn sub_slice_copies_are_async_and_correct() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
        let fill = module.function("slow_fill").ctx("function")?;
        let n = 1 << 20;
        let data: Vec<u32> = (0..n as u32).collect();
        let pinned = gpu
            .pinned_from_slice(&data, PinnedOptions::default())
            .ctx("pin")?;
        let mut back = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let (a, b) = (1000, 1000 + (n / 2));
        let mut dev = gpu.alloc_zeros::<u32>(b - a).ctx("alloc")?;
        let mut junk = gpu.alloc_zeros::<u32>(1024).ctx("alloc")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let view = pinned.slice(a..b).ctx("slice")?;
        ensure!(
            gpubind::CopySource::source(&view).kind() == gpubind::MemoryKind::Pinned,
            "a view of pinned memory lost its kind"
        );
        let done = gpu.new_event(false).ctx("event")?;
        slow_fill(&s, &fill, &mut junk, 1)?;
        let t = std::time::Instant::now();
        s.copy_tracked_async(&view, &mut dev).ctx("view upload")?;
        let enqueue = t.elapsed();
        s.record(&done).ctx("record")?;
        ensure!(
            !done.is_complete().ctx("query")?,
            "the view's upload did not stay queued behind the spin (took {enqueue:?} to enqueue)"
        );
        ensure!(
            enqueue < std::time::Duration::from_millis(50),
            "enqueueing a view's upload took {enqueue:?}: copied as pageable memory"
        );
        s.copy_tracked_async(&dev, &mut back.slice_mut(a..b).ctx("slice_mut")?)
            .ctx("view download")?;
        ensure!(
            back[a..b] == data[a..b] && back[..a].iter().all(|&v| v == 0),
            "sub-slice round trip wrong"
        );
        // A view of another length is a typed error; a range past the end too.
        let short = pinned.slice(0..10).ctx("slice")?;
        match s.copy_tracked_async(&short, &mut dev) {
            Err(Error::SizeMismatch { .. }) => {}
            other => {
                return Err(format!(
                    "length mismatch: expected SizeMismatch, got {other:?}"
                ));
            }
        }
        match pinned.slice(n - 1..n + 1) {
            Err(Error::OutOfBounds { .. }) => {}
            other => {
                return Err(format!(
                    "range past the end: expected OutOfBounds, got {other:?}"
                ));
            }
        }
        Ok(())
    })
}

fn peer_path_on_one_device() -> TestResult {
    with_gpu(|gpu| {
        let n = 100_003;
        let data: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let src = gpu.clone_htod(&data).ctx("clone_htod")?;
        let mut dst = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        gpu.copy_peer(&src, &mut dst).ctx("copy_peer")?;
        ensure!(gpu.dtoh(&dst).ctx("dtoh")? == data, "copy_peer wrong");
        let mut dst2 = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let stream = gpu.new_stream().ctx("stream")?;
        gpu.on(&stream)
            .ctx("on")?
            .copy_peer_async(&dst, &mut dst2)
            .ctx("copy_peer_async")?;
        ensure!(
            gpu.dtoh(&dst2).ctx("dtoh")? == data,
            "copy_peer_async wrong"
        );
        let mut short = gpu.alloc_zeros::<u32>(n - 1).ctx("alloc")?;
        match gpu.copy_peer(&src, &mut short) {
            Err(Error::SizeMismatch { .. }) => Ok(()),
            other => Err(format!("expected SizeMismatch, got {other:?}")),
        }
    })
}

fn peer_copy_waits_for_a_kernel_writing_the_source() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
        let fill = module.function("slow_fill").ctx("function")?;
        let n = 1 << 16;
        let mut src = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let mut dst = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let (writer, copier) = (
            gpu.new_stream().ctx("stream")?,
            gpu.new_stream().ctx("stream")?,
        );
        // The kernel still writes `src` on one stream while the copy is issued on another.
        slow_fill(&gpu.on(&writer).ctx("on")?, &fill, &mut src, 77)?;
        gpu.on(&copier)
            .ctx("on")?
            .copy_peer_async(&src, &mut dst)
            .ctx("copy_peer_async")?;
        let got = gpu.dtoh(&dst).ctx("dtoh")?;
        ensure!(
            got.iter().all(|&v| v == 77),
            "the peer copy ran before the kernel writing its source finished"
        );
        Ok(())
    })
}

fn copies_between_devices() -> TestResult {
    let devices = Device::all().ctx("Device::all")?;
    if devices.len() < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs for copies between devices, {} visible",
            devices.len()
        )));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let n = 1 << 20;
    let data: Vec<u32> = (0..n as u32).map(|i| i ^ 0x5A5A).collect();
    for (i, j) in (0..devices.len()).flat_map(|i| (0..devices.len()).map(move |j| (i, j))) {
        if i == j {
            continue;
        }
        let (mut src, fill) = {
            let gi = ctx.bind(&devices[i]).ctx("bind i")?;
            let m = gi.compile_and_load(KERNELS, "copies.cu").ctx("compile")?;
            (gi.clone_htod(&data).ctx("clone_htod")?, m)
        };
        let (mut dst, pinned_i) = {
            let gj = ctx.bind(&devices[j]).ctx("bind j")?;
            let d = gj.alloc_zeros::<u32>(n).ctx("alloc")?;
            let gi = devices[i].clone();
            drop(gj);
            let gi = ctx.bind(&gi).ctx("bind i")?;
            (
                d,
                gi.pinned_from_slice(&data, PinnedOptions::default())
                    .ctx("pin")?,
            )
        };
        // Bound to the destination's device, then to the source's: both work.
        for bound in [j, i] {
            let g = ctx.bind(&devices[bound]).ctx("bind")?;
            g.memset_zeros(&mut dst).ctx("memset")?;
            g.dtod(&src, &mut dst).ctx("dtod between devices")?;
            ensure!(
                g.device().ordinal() == bound,
                "the binding changed during a copy"
            );
            let got = {
                let gj_host = ctx.bind(&devices[j]).ctx("bind j")?;
                gj_host.dtoh(&dst).ctx("dtoh")?
            };
            ensure!(got == data, "dtod {i} -> {j} bound to {bound} wrong");
        }
        // Stream-ordered, behind a kernel still writing the source on its own device.
        {
            let gi = ctx.bind(&devices[i]).ctx("bind i")?;
            let f = fill.function("slow_fill").ctx("function")?;
            let si = gi.new_stream().ctx("stream")?;
            slow_fill(&gi.on(&si).ctx("on")?, &f, &mut src, 99)?;
        }
        {
            let gj = ctx.bind(&devices[j]).ctx("bind j")?;
            let sj = gj.new_stream().ctx("stream")?;
            let s = gj.on(&sj).ctx("on")?;
            s.dtod_async(&src, &mut dst)
                .ctx("dtod_async between devices")?;
            let got = gj.dtoh(&dst).ctx("dtoh")?;
            ensure!(
                got.iter().all(|&v| v == 99),
                "the copy {i} -> {j} did not wait for the kernel writing its source"
            );
            // Pinned memory of device i into device j, tracked and asynchronous.
            s.copy_tracked_async(&pinned_i, &mut dst)
                .ctx("pinned of device i -> device j")?;
            ensure!(
                gj.dtoh(&dst).ctx("dtoh")? == data,
                "pinned {i} -> {j} wrong"
            );
        }
    }
    Ok(())
}

fn main() {
    common::run_suite(
        "gpu_copies",
        &[
            (
                "dtoh_into_pinned_is_seen_by_a_host_read",
                dtoh_into_pinned_is_seen_by_a_host_read,
            ),
            (
                "host_write_waits_for_a_pending_upload",
                host_write_waits_for_a_pending_upload,
            ),
            (
                "copies_stay_in_flight_across_iterations",
                copies_stay_in_flight_across_iterations,
            ),
            (
                "sub_slice_copies_are_async_and_correct",
                sub_slice_copies_are_async_and_correct,
            ),
            ("peer_path_on_one_device", peer_path_on_one_device),
            (
                "peer_copy_waits_for_a_kernel_writing_the_source",
                peer_copy_waits_for_a_kernel_writing_the_source,
            ),
            ("copies_between_devices", copies_between_devices),
        ],
    )
}
