//! The stream-ordered free of pool memory (`cuMemFreeAsync`): a drop that does not wait
//! on the host. The contract is docs/safety.md, "Drops".
//!
//! The free goes on one stream of the allocation's pending uses — the stream of the only
//! pending use when that is a write (`AccessTracker::take_sole_writer`: no wait, no
//! event), else the first of its own device's that is not borrowed — after that stream
//! has been made to wait on the device (an event and `cuStreamWaitEvent`) for every other
//! pending use (`AccessTracker::join_for_free`). The tracker holds a reference to every stream it
//! names, so a stream dropped by its owner still exists when the free is enqueued; the
//! reference goes only after it (`cuStreamDestroy` of a stream with pending work lets
//! that work, the free included, complete). With nothing pending the free goes on the
//! device's legacy default stream. If joining fails (an event that cannot be recorded or
//! waited for, a stream shared with cudarc that cudarc is capturing) the drop waits on
//! the host, as a `cuMemAlloc` buffer's does; if that wait fails too (a poisoned context,
//! a timeout, a capturing stream) the memory is leaked.
//!
//! Every free runs with this thread's stream capture mode relaxed (by
//! [`teardown::release()`], `faults::enter_and_call`), so a drop during a capture (inside
//! a `BoundDevice::capture` closure, or while another library captures in global mode)
//! neither fails nor invalidates that capture.

use crate::access::{AccessTracker, FreeOn, Grave, StreamRef};
use crate::device::Device;
use crate::driver::ContextGuard;
use crate::driver::result::memory;
use crate::teardown::{self, Runs, Teardown};
use cudarc::driver::sys;
use std::fmt;
use std::sync::Arc;

/// Frees `ptr`, an allocation from `device`'s memory pool whose pending uses `tracker`
/// records, in stream order: see the [module docs](self). Failures are logged.
///
/// # Safety
///
/// `ptr` is a live pool allocation of `device`'s context that nothing else frees, and
/// every stream-ordered use of it is recorded in `tracker`; after the call neither is used
/// again.
pub(crate) unsafe fn free_in_stream_order(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    tracker: &mut AccessTracker,
    ptr: sys::CUdeviceptr,
) {
    // The usual drop of a temporary: its only pending use is a write on a stream of
    // its device, where the free goes with no wait and no event, so the context is
    // entered once, by `release`. Its own call, so that nothing of the general case's
    // (a wait's outcome, a grave, a context guard) is built, moved or dropped.
    let sole = if device.check_poison().is_ok() {
        tracker.take_sole_writer(device)
    } else {
        None
    };
    if let Some(on) = sole {
        // SAFETY: the caller's; every use of `ptr` is ordered before this point of `on`
        // (its only pending use, a write there), which `on` keeps alive.
        unsafe { free_on(what, device, Ok(()), on.slot().raw(), ptr) };
        // Only now may the stream go (dropping the last reference destroys a stream).
        drop(on);
        return;
    }
    let (on, waited, forgotten, guard) = join_or_wait(device, tracker);
    match &on {
        // SAFETY: the caller's; every pending use was ordered before this point of the
        // stream (joined onto it), and `on` keeps it alive.
        FreeOn::Stream(s) => unsafe { free_on(what, device, waited, s.slot().raw(), ptr) },
        // Nothing pending, or every use waited for on the host: the legacy default stream
        // (of the context `release` enters). gpubind's and cudarc's streams are
        // non-blocking, so the legacy stream orders nothing of theirs (a capture of a
        // blocking stream would refuse the call in any mode: the free then fails, is
        // logged, and leaks).
        // SAFETY: the caller's; every pending use was waited for on the host (or none
        // was pending).
        FreeOn::Anywhere => unsafe { free_on(what, device, waited, std::ptr::null_mut(), ptr) },
    }
    // Only now may the streams go (dropping the last reference destroys a stream).
    drop(on);
    drop(forgotten);
    drop(guard);
}

/// Frees `ptr` on `stream` (`cuMemFreeAsync`) through [`teardown::release()`], unless
/// `waited` failed.
///
/// # Safety
///
/// As for [`free_in_stream_order`], and every use of `ptr` is ordered before this point
/// of `stream` (the null stream: the legacy default stream of `device`'s context) or
/// waited for, and `stream` stays alive until this returns.
#[inline(always)]
unsafe fn free_on(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    waited: crate::error::Result<()>,
    stream: sys::CUstream,
    ptr: sys::CUdeviceptr,
) {
    let stream = stream as usize; // a handle, `Send`
    teardown::release(
        Teardown {
            what,
            device,
            waited,
            call: "cuMemFreeAsync",
            runs: Runs::Inline,
        },
        // SAFETY: a pool allocation of this context (current while this runs), freed
        // once, here; every pending use was ordered before this point of `stream` (the
        // caller's), and `stream` is alive (the caller's).
        move || unsafe { memory::free_async(ptr, stream as sys::CUstream) },
    );
}

/// The general case of [`free_in_stream_order`]: joins the pending uses onto one stream
/// in the device's context (entered for the hand-off events; the guard is returned, to
/// be dropped after the free), or waits for them on the host if joining fails. Returns
/// where the free goes, the outcome of the wait, and the streams to let go of after it.
#[allow(clippy::type_complexity)]
fn join_or_wait(
    device: &Arc<Device>,
    tracker: &mut AccessTracker,
) -> (
    FreeOn<StreamRef>,
    crate::error::Result<()>,
    Option<Grave<StreamRef>>,
    Option<ContextGuard>,
) {
    // Cheap when the context is current already; `release` reports a context that
    // cannot be entered.
    let guard = device.enter().ok();
    let joined = match guard {
        // A poisoned context runs nothing more: the host wait below says so, and the
        // memory leaks as every buffer of a poisoned context does.
        Some(_) if device.check_poison().is_ok() => tracker.join_for_free(device).ok(),
        _ => None,
    };
    match joined {
        Some((on, forgotten)) => (on, Ok(()), Some(forgotten), guard),
        // Joining failed and forgot nothing: wait on the host instead (a poisoned
        // context fails here too, and the memory leaks).
        None => (FreeOn::Anywhere, tracker.wait_all(), None, guard),
    }
}
