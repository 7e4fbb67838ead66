//! GPU tests of drops during a stream capture: the frees and destroys a drop makes run
//! with the thread's capture mode relaxed, so a drop inside a `BoundDevice::capture`
//! closure, or while another thread holds a global-mode capture open, neither fails nor
//! invalidates the capture, and the memory is freed. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_capture_drops` (on a GPU machine, or the built binary).

#[macro_use]
mod common;

use common::{Ctx, TestFn, child_role, default_pool_used, dev0, finish, run_suite};
use gpubind::cudarc::driver::sys;
use gpubind::{BoundDevice, ThreadContext};
use std::sync::Mutex;
use std::sync::mpsc::channel;

type R = Result<(), String>;

/// Bytes of each pool temporary: a multiple of the pool's 2 MiB granularity, so its free
/// shows in the pool's used bytes exactly.
const BYTES: usize = 4 << 20;
/// Elements of the captured memset.
const N: usize = 4096;

/// Every warning gpubind logs (a drop's failed wait or release call is one), kept for the
/// tests to inspect.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct KeepWarnings;

impl log::Log for KeepWarnings {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = r.args().to_string();
            println!("WARN: {line}");
            WARNINGS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(line);
        }
    }
    fn flush(&self) {}
}

/// How many warnings were logged so far.
fn warnings_so_far() -> usize {
    WARNINGS.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// Fails if a warning was logged since `since` (a drop's wait or release call failed, or
/// what it released leaked).
fn no_warnings_since(what: &str, since: usize) -> R {
    let w = WARNINGS.lock().unwrap_or_else(|p| p.into_inner());
    ensure!(
        w.len() == since,
        "{what}: a drop failed (its warnings): {:?}",
        &w[since..]
    );
    Ok(())
}

fn all_equal(what: &str, got: &[u32], want: u32) -> R {
    if let Some(i) = got.iter().position(|&x| x != want) {
        return Err(format!(
            "{what}: element {i} is {:#x}, want {want:#x}",
            got[i]
        ));
    }
    Ok(())
}

/// Checks that the pool's used bytes fell by at least one temporary between `before` and
/// now (after a device synchronize).
fn pool_freed(gpu: &BoundDevice<'_>, what: &str, before: u64) -> R {
    gpu.synchronize().ctx("synchronize")?;
    let after = default_pool_used()?;
    println!("{what}: pool used memory {before} before the drop, {after} after");
    ensure!(
        before.saturating_sub(after) >= BYTES as u64,
        "{what}: the pool temporary was not freed: {before} -> {after}"
    );
    Ok(())
}

/// A pool temporary with a pending write on a gpubind stream, an event, a stream (its
/// last reference; the event was recorded on it), and a `cuMemAlloc` buffer with a
/// pending write, each dropped inside a capture closure (thread-local mode) that also
/// captures a memset: the capture returns a graph, whose launch performs the memset, the
/// pool temporary is freed, and no drop logs a failure (each wait and release call
/// succeeded: `cuMemFreeAsync`, `cuEventDestroy`, `cuStreamDestroy`, the host wait and
/// `cuMemFree`).
fn drops_inside_a_capture_closure_leave_the_capture_intact() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let target = gpu.alloc_zeros::<u32>(N).ctx("alloc the memset's target")?;
    let own = gpu.new_stream().ctx("new_stream")?;
    let doomed_stream = gpu.new_stream().ctx("new_stream")?;
    let event = gpu.new_event(false).ctx("new_event")?;
    let mut plain = gpu.alloc_zeros::<u32>(N).ctx("cuMemAlloc buffer")?;
    let s = gpu.on(&own).ctx("on")?;
    let mut temporary = s.alloc_zeros::<u8>(BYTES).ctx("pool alloc")?;
    s.memset_async(&mut plain, 1u32)
        .ctx("memset the cuMemAlloc buffer")?;
    // Untracked work, so nothing but `doomed_stream` keeps the stream: its drop
    // destroys it.
    gpu.on(&doomed_stream)
        .ctx("on")?
        .record(&event)
        .ctx("record")?;
    // The temporary's pending uses: writes on `own` only.
    s.memset_async(&mut temporary, 3u8)
        .ctx("memset the temporary")?;
    let used_before = default_pool_used()?;
    let warned = warnings_so_far();
    let graph = gpu
        .capture(|c| {
            c.memset(&target, 9u32)?;
            drop(temporary); // cuMemFreeAsync on `own`
            drop(event); // cuEventDestroy
            drop(doomed_stream); // cuStreamDestroy
            drop(plain); // a host wait for `own`, then cuMemFree (release thread)
            Ok(())
        })
        .ctx("the capture with drops inside")?;
    let exec = graph.instantiate().ctx("instantiate")?;
    exec.launch(&gpu.default_stream()).ctx("launch")?;
    gpu.synchronize().ctx("synchronize after the launch")?;
    all_equal(
        "the memset the graph captured",
        &gpu.dtoh(&target).ctx("dtoh")?,
        9,
    )?;
    pool_freed(
        &gpu,
        "a temporary dropped in a capture closure",
        used_before,
    )?;
    no_warnings_since("the drops in a capture closure", warned)?;
    println!("drops inside a capture closure: the capture intact, the temporary freed");
    Ok(())
}

/// A pool temporary with a pending write, an event, a stream (its last reference) and a
/// `cuMemAlloc` buffer with a pending write, dropped on this thread while another thread
/// holds a cudarc capture open in global mode (which forbids every thread's unrelaxed
/// "potentially unsafe" calls, the release thread's included): cudarc's capture stays
/// active and ends in a graph whose launch performs its memset, the temporary is freed,
/// and no drop logs a failure (each wait and release call succeeded, `cuMemFree` on the
/// release thread too).
fn drops_during_another_threads_global_capture_leave_it_intact() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let own = gpu.new_stream().ctx("new_stream")?;
    let theirs = gpu.new_cudarc_stream().ctx("new_cudarc_stream")?;
    let cs = theirs.cudarc_stream().ok_or("not cudarc's")?.clone();
    let marker = cs
        .clone_htod(&[7u32; 16])
        .map_err(|e| format!("clone_htod: {e:?}"))?;
    cs.synchronize()
        .map_err(|e| format!("synchronize: {e:?}"))?;
    let doomed_stream = gpu.new_stream().ctx("new_stream")?;
    let event = gpu.new_event(false).ctx("new_event")?;
    let mut plain = gpu.alloc_zeros::<u32>(N).ctx("cuMemAlloc buffer")?;
    let s = gpu.on(&own).ctx("on")?;
    let mut temporary = s.alloc_zeros::<u8>(BYTES).ctx("pool alloc")?;
    s.memset_async(&mut temporary, 3u8)
        .ctx("memset the temporary")?;
    s.memset_async(&mut plain, 1u32)
        .ctx("memset the cuMemAlloc buffer")?;
    gpu.on(&doomed_stream)
        .ctx("on")?
        .record(&event)
        .ctx("record")?;
    let used_before = default_pool_used()?;
    let warned = warnings_so_far();

    let (began_tx, began_rx) = channel::<Result<(), String>>();
    let (dropped_tx, dropped_rx) = channel::<()>();
    let capturer = {
        let cs = cs.clone();
        let marker_ptr = {
            let (ptr, _record) = gpubind::cudarc::driver::DevicePtr::device_ptr(&marker, &cs);
            ptr
        };
        std::thread::spawn(move || -> R {
            if let Err(e) = cs.context().bind_to_thread() {
                let _ = began_tx.send(Err(format!("bind_to_thread: {e:?}")));
                return Ok(());
            }
            let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
            if let Err(e) = cs.begin_capture(mode) {
                let _ = began_tx.send(Err(format!("begin_capture: {e:?}")));
                return Ok(());
            }
            // SAFETY: `marker_ptr` is the 16-element allocation `marker`, alive until
            // after the graph's launch; the memset is captured on `cs`.
            let r = unsafe { sys::cuMemsetD32Async(marker_ptr, 0, 16, cs.cu_stream()) };
            let _ = began_tx.send(if r == sys::CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(format!("captured memset: {r:?}"))
            });
            // The other thread drops its temporary now.
            let _ = dropped_rx.recv();
            let status = cs.capture_status();
            let ended = cs.end_capture(sys::CUgraphInstantiate_flags(0));
            let status = status.map_err(|e| format!("capture_status: {e:?}"))?;
            ensure!(
                status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
                "the drop on another thread touched the global capture: {status:?}"
            );
            let graph = ended
                .map_err(|e| format!("the capture did not stay valid: {e:?}"))?
                .ok_or("the capture made no graph")?;
            graph.launch().map_err(|e| format!("graph launch: {e:?}"))?;
            cs.synchronize()
                .map_err(|e| format!("synchronize: {e:?}"))?;
            Ok(())
        })
    };
    let began = began_rx
        .recv()
        .unwrap_or_else(|_| Err("the capturing thread ended early".into()));
    if began.is_ok() {
        // While the global capture is open:
        drop(temporary); // cuMemFreeAsync on `own`
        drop(event); // cuEventDestroy
        drop(doomed_stream); // cuStreamDestroy
        drop(plain); // a host wait for `own`, then cuMemFree on the release thread
    }
    let _ = dropped_tx.send(());
    let captured = capturer
        .join()
        .map_err(|_| "the capturing thread panicked".to_string())?;
    began?;
    captured?;
    let after = cs
        .clone_dtoh(&marker)
        .map_err(|e| format!("clone_dtoh: {e:?}"))?;
    all_equal("the marker after the graph's launch", &after, 0)?;
    pool_freed(
        &gpu,
        "a temporary dropped during a global capture",
        used_before,
    )?;
    no_warnings_since("the drops during a global capture", warned)?;
    println!("drops during another thread's global capture: the capture intact, all released");
    Ok(())
}

/// The two tests above in a child process with `GPUBIND_DROP_TIMEOUT=none`, where every
/// release call runs on the dropping thread (no release thread): the `cuMemFree` of the
/// `cuMemAlloc` buffer is made on the capturing thread itself, relaxed, inside its
/// thread-local capture, and on the thread beside another's global capture. Both must
/// pass there as they do here.
fn drops_released_inline_leave_captures_intact() -> R {
    let child = std::process::Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", "inline")
        .env("GPUBIND_DROP_TIMEOUT", "none")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .ctx("spawn the child")?;
    let (ok, out) = finish(child, std::time::Duration::from_secs(120))?;
    for line in out.lines() {
        println!("    child: {line}");
    }
    ensure!(
        ok && out.lines().any(|l| l == "CHILD OK 2"),
        "the drops released inline failed:\n{out}"
    );
    Ok(())
}

/// The child of [`drops_released_inline_leave_captures_intact`]: runs both tests, prints
/// `CHILD OK 2` when both pass.
fn inline_child() -> ! {
    let tests: [(&str, TestFn); 2] = [
        (
            "drops_inside_a_capture_closure_leave_the_capture_intact",
            drops_inside_a_capture_closure_leave_the_capture_intact,
        ),
        (
            "drops_during_another_threads_global_capture_leave_it_intact",
            drops_during_another_threads_global_capture_leave_it_intact,
        ),
    ];
    for (name, test) in tests {
        if let Err(e) = test() {
            println!("child error: {name}: {e}");
            std::process::exit(1);
        }
    }
    println!("CHILD OK 2");
    std::process::exit(0)
}

fn main() {
    if log::set_logger(&KeepWarnings).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    if child_role().as_deref() == Some("inline") {
        inline_child();
    }
    run_suite(
        "gpu_capture_drops",
        &[
            (
                "drops_inside_a_capture_closure_leave_the_capture_intact",
                drops_inside_a_capture_closure_leave_the_capture_intact,
            ),
            (
                "drops_during_another_threads_global_capture_leave_it_intact",
                drops_during_another_threads_global_capture_leave_it_intact,
            ),
            (
                "drops_released_inline_leave_captures_intact",
                drops_released_inline_leave_captures_intact,
            ),
        ],
    );
}
