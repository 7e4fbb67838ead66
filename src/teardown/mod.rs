//! Teardown: how resources are released in their own context.
//!
//! Every `Drop` that gives a driver resource back calls one entry point, [`release`],
//! with a [`Teardown`] describing the resource: what it is (for reports), its device,
//! the outcome of waiting for its pending stream-ordered uses, and the release call
//! with its name and whether it may wait for the whole device. [`release`] then
//!
//! 1. leaks the resource if the wait failed (reporting it, and keeping the context
//!    alive unless it is poisoned: `faults::leak_unwaited`);
//! 2. makes the call in the resource's context (pushed and popped, so the dropping
//!    thread's binding is untouched) — inline, or for calls that may wait for all work
//!    on the device (`cuMemFree`, `cuMemFreeHost`, `cuMemHostUnregister`,
//!    `cuModuleUnload`) on the device's release thread with a time limit
//!    ([`release`](mod@release));
//! 3. reports a failure at warn level ([`faults`]).
//!
//! The modules behind it: [`drop_wait`] (how long a drop waits, polling a stream up to
//! a deadline), [`faults`] (the reports and the leak policy), [`release`](mod@release)
//! (the release threads), [`ordered_free`] (the stream-ordered free of pool memory,
//! which joins the pending uses onto one stream instead of waiting on the host).

pub(crate) mod drop_wait;
pub(crate) mod faults;
pub(crate) mod ordered_free;
pub(crate) mod release;

use crate::device::Device;
use crate::error::{Error, Result};
use std::fmt;
use std::sync::Arc;

pub(crate) use release::Released;

/// A release call's outcome: a driver wrapper's `Result`, or (for call sites that call
/// `sys` directly) a raw `CUresult`, named by the call.
pub(crate) trait CallResult {
    /// `Ok(())` on success, else the error naming `call`.
    fn into_result(self, call: &'static str) -> Result<()>;
}

impl CallResult for Result<()> {
    #[inline]
    fn into_result(self, _call: &'static str) -> Result<()> {
        self
    }
}

impl CallResult for cudarc::driver::sys::CUresult {
    #[inline]
    fn into_result(self, call: &'static str) -> Result<()> {
        crate::driver::result::check(self, call)
    }
}

/// Where a release call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runs {
    /// On the dropping thread: calls that return at once (`cuStreamDestroy`,
    /// `cuEventDestroy`, `cuMemFreeAsync`).
    Inline,
    /// On the device's release thread, waited for up to `GPUBIND_DROP_TIMEOUT`: calls
    /// that may wait for every piece of work on the device.
    OnReleaseThread,
}

/// One resource a drop gives back: see [`release`].
pub(crate) struct Teardown<'a> {
    /// What is dropped, for reports (`DeviceSlice<f32> of 1024 elements`).
    pub(crate) what: fmt::Arguments<'a>,
    /// The resource's device; its context is entered for the call.
    pub(crate) device: &'a Arc<Device>,
    /// The outcome of waiting for the resource's pending uses (`Ok(())` when it has
    /// none): an error leaks the resource instead of releasing it.
    pub(crate) waited: Result<()>,
    /// The release call's name, for reports (`cuMemFree_v2`).
    pub(crate) call: &'static str,
    /// Where the call runs.
    pub(crate) runs: Runs,
}

/// The one way a `Drop` releases a driver resource: see the [module docs](self).
///
/// `call` makes the release call (through the result layer); it runs in the resource's
/// context, once, and only if the wait succeeded. Returns how it ended
/// ([`Released::Done`] when the resource is gone; otherwise leaked, maybe leaked, or
/// still being released on the release thread). Inlined: a `Teardown` passed on by value
/// is copied at each call, its `waited` (an `Error`'s size) included.
#[inline]
pub(crate) fn release(
    t: Teardown<'_>,
    call: impl FnOnce() -> Result<()> + Send + 'static,
) -> Released {
    match t.runs {
        Runs::Inline => {
            if faults::release(t.what, t.device, t.waited, t.call, call) {
                Released::Done
            } else {
                Released::Failed
            }
        }
        Runs::OnReleaseThread => {
            faults::release_bounded(t.what, t.device, t.waited, t.call, Box::new(call))
        }
    }
}

/// Drops `value` (a cudarc object, whose drop makes its context current) inside
/// `device`'s context through [`release`], so the thread's current context is left as
/// it was; on a poisoned or unreachable context the value is leaked (and the failure
/// logged), like every gpubind resource.
pub(crate) fn drop_in_context<V: Send + 'static>(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    value: V,
) {
    // Not dropped unless the call runs: a context that cannot be entered leaks it.
    let value = std::mem::ManuallyDrop::new(value);
    release(
        Teardown {
            what,
            device,
            waited: Ok(()),
            call: "drop",
            runs: Runs::Inline,
        },
        move || {
            drop(std::mem::ManuallyDrop::into_inner(value));
            Ok(())
        },
    );
}

/// Resetting a primary context belongs to teardown: it must know that no release of the
/// device is still running on its release thread.
impl Device {
    /// Resets device `ordinal`'s primary context (`cuDevicePrimaryCtxReset`): destroys it
    /// with everything in it, so the next bind starts with a fresh one. The way back from a
    /// poisoned context ([`Error::ContextPoisoned`]) when releasing gpubind's retain does not
    /// reset it (the driver keeps a context that faulted).
    ///
    /// Refused with [`Error::InvalidArgument`] while any gpubind value of the device is
    /// alive (an `Arc<Device>`, and so any buffer, stream, event or module): drop them
    /// first.
    ///
    /// # Safety
    ///
    /// No other code in this process may still use the device's primary context: other
    /// libraries sharing it (cudarc's `CudaContext::new`, PyTorch, cuBLAS handles you
    /// created yourself) lose every allocation and handle in it. And no other thread may
    /// be dropping the device's last gpubind values concurrently: a `Device` whose last
    /// `Arc` is gone but whose drop has not yet released its retain is not seen by the
    /// check.
    pub unsafe fn reset_primary_context(ordinal: usize) -> Result<()> {
        let count = Device::count()?;
        if ordinal >= count {
            return Err(Error::BadOrdinal { ordinal, count });
        }
        let reg = crate::device::registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if reg.get(ordinal).is_some_and(|w| w.strong_count() > 0) {
            return Err(Error::InvalidArgument(format!(
                "device {ordinal} still has live gpubind values (an Arc<Device>, buffers, streams, events or modules); drop them before resetting its primary context"
            )));
        }
        // A release a drop gave up waiting for (GPUBIND_DROP_TIMEOUT) may still hold the
        // device, or be dropping its last `Arc` on the release thread.
        let releasing = crate::teardown::release::in_flight(ordinal);
        if releasing > 0 {
            return Err(Error::InvalidArgument(format!(
                "device {ordinal} still has {releasing} release(s) running on gpubind's release thread (a drop gave up waiting for GPU work, GPUBIND_DROP_TIMEOUT); wait for the device's work to finish, or restart the process"
            )));
        }
        crate::teardown::drop_wait::forget_legacy_gave_up(ordinal);
        let raw = crate::driver::result::device::get(ordinal as i32)?;
        // SAFETY: no gpubind value uses the context (checked above, under the registry lock,
        // so no Device can be created meanwhile); other users are the caller's contract.
        unsafe { crate::driver::result::context::primary_reset(raw) }
    }
}
