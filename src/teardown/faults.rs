//! Failures that cannot be returned: a `Drop` that cannot release what it owns (a wait,
//! a context push, a free, unload or destroy that fails) reports it at warn level
//! through the `log` facade, which costs nothing without a logger. Every report names
//! what was dropped, its device, the failed step with the call (in the error) and what
//! became of the resource. Nothing is logged on success.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::teardown::CallResult;
use std::fmt;
use std::sync::Arc;

/// Whether a failed wait for a resource's pending uses means the device will run none of
/// them any more: only [`Error::ContextPoisoned`] by a sticky error (the context executes
/// no more work). After any other failure — above all [`Error::Timeout`], a wait that gave
/// up on work still running — the device may still use the resource, so a drop must leak
/// it (or, where it cannot, not return: see [`abort_unreleasable`]). That includes a
/// device gpubind poisoned itself with a code that is not sticky
/// ([`Device::poison_with`]: an `ncclCommAbort` or an NCCL lane that did not finish in
/// time, cudarc work nothing could order), whose context still runs what was queued.
pub(crate) fn nothing_runs_after(error: &Error) -> bool {
    matches!(
        error,
        Error::ContextPoisoned { code, .. } if crate::device::poison::is_sticky(code.as_cudarc())
    )
}

/// For the one kind of resource a drop can neither free nor leak — memory that goes back
/// to its Rust owner when the drop returns (a [`RegisteredHost`](crate::RegisteredHost)
/// over borrowed pages, the host side of a [`copy_scope`](crate::BoundStream::copy_scope)
/// that is unwinding) — when waiting for the device's uses failed while the device may
/// still run them: returning would let the owner reuse or free pages the GPU still
/// writes (a use after free in safe code), and waiting on would hang without bound. The
/// process is aborted with the reason, after logging it at error level.
#[cold]
pub(crate) fn abort_unreleasable(
    what: fmt::Arguments<'_>,
    device: Option<usize>,
    error: &Error,
) -> ! {
    let dev = device.map(|d| format!(" (device {d})")).unwrap_or_default();
    let msg = format!(
        "gpubind: dropping {what}{dev}: waiting for the GPU's pending uses failed: {error}; \
         the memory goes back to its owner when the drop returns, but the GPU may still \
         use it, so gpubind aborts the process instead of allowing a use after free \
         (raise GPUBIND_DROP_TIMEOUT if the work is only slow; docs/faults.md)"
    );
    log::error!("{msg}");
    eprintln!("{msg}");
    std::process::abort()
}

pub(crate) use crate::error::report_drop;
pub(crate) use crate::error::{ENTER, LEAKED, LEAKED_UNWAITED, MAYBE_LEAKED, RELEASE, WAIT};

/// The end of a resource's `Drop`: given the result of waiting for its pending uses,
/// enters `device`'s context and runs `release` (the driver call `call`). A failed wait
/// leaks the resource (`release` is not run); every failure is reported. Returns whether
/// the resource was released (`false`: leaked, or maybe leaked).
#[inline]
pub(super) fn release<R: CallResult>(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    waited: Result<()>,
    call: &'static str,
    release: impl FnOnce() -> R,
) -> bool {
    if let Err(e) = waited {
        leak_unwaited(what, device, &e);
        return false;
    }
    report_failure(
        what,
        Some(device.ordinal()),
        enter_and_call(device, call, release),
    )
}

/// A release's failure, if any: the step that failed ([`ENTER`] or [`RELEASE`]) and the
/// error.
pub(crate) type Failure = Option<(&'static str, Error)>;

/// Makes `device`'s context current (pushed and popped) and makes the release call
/// `call_name` with this thread's stream capture mode relaxed
/// ([`crate::driver::with_relaxed_capture_mode`]; a mode that cannot be set fails the
/// [`ENTER`] step, and the call is not made).
///
/// Relaxed, because a drop may run while a stream is being captured: inside a
/// `BoundDevice::capture` closure (its thread captures in thread-local mode), or on any
/// thread while another library captures in global mode. The default modes then forbid
/// "potentially unsafe" calls (`cuMemFreeAsync` on any stream, measured; the destroys and
/// synchronous frees a drop makes may count too): the driver refuses them and
/// invalidates the capture. Relaxing is sound for every release call: each acts on a
/// resource whose pending uses were ordered before the call on a stream not captured, or
/// waited for, never on work recorded into a capture (a graph borrows its buffers; a
/// wait for a capturing stream fails, and the resource leaks before this point); and
/// relaxed mode lifts only that prohibition, not the driver's refusal of a call that
/// conflicts with a capture (such a call fails, and is reported). One exchange pair per
/// release call (the usual drop of a temporary makes one), restored on unwind.
pub(crate) fn enter_and_call<R: CallResult>(
    device: &Device,
    call_name: &'static str,
    call: impl FnOnce() -> R,
) -> Failure {
    match device.enter() {
        Err(e) => Some((ENTER, e)),
        Ok(_guard) => match crate::driver::with_relaxed_capture_mode(call) {
            Err(e) => Some((ENTER, e)),
            Ok(r) => r.into_result(call_name).err().map(|e| (RELEASE, e)),
        },
    }
}

/// Reports a release's failure, if any (a context that could not be entered leaked the
/// resource; a failed call may have); returns whether it succeeded.
pub(crate) fn report_failure(
    what: fmt::Arguments<'_>,
    device: Option<usize>,
    failure: Failure,
) -> bool {
    match failure {
        None => true,
        Some((step, e)) => {
            let outcome = if step == ENTER { LEAKED } else { MAYBE_LEAKED };
            report_drop(what, device, step, &e, outcome);
            false
        }
    }
}

/// [`release`] for a call that may wait for the whole device (`cuMemFree` of
/// `cuMemAlloc` or managed memory, `cuMemFreeHost`, `cuMemHostUnregister`,
/// `cuModuleUnload`): made on the device's release thread, waited for up to
/// `GPUBIND_DROP_TIMEOUT` ([`crate::teardown::release`]). Returns whether the resource is gone or
/// going (`false`: leaked, or maybe leaked).
pub(super) fn release_bounded<R: CallResult + 'static>(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    waited: Result<()>,
    call: &'static str,
    release: Box<dyn FnOnce() -> R + Send>,
) -> crate::teardown::release::Released {
    if let Err(e) = waited {
        leak_unwaited(what, device, &e);
        return crate::teardown::release::Released::Failed;
    }
    crate::teardown::release::release(what, device, call, release)
}

/// A resource is leaked because waiting for its pending uses failed: reports it, and —
/// unless the context is poisoned (it runs nothing more) — keeps the device's context
/// alive for the rest of the process, so work that may still use the leaked resource is
/// never torn down with the context when the last `Arc<Device>` goes.
pub(crate) fn leak_unwaited(what: fmt::Arguments<'_>, device: &Arc<Device>, error: &Error) {
    report_drop(what, Some(device.ordinal()), WAIT, error, LEAKED_UNWAITED);
    if !nothing_runs_after(error) {
        keep_context_alive(device);
    }
}

/// Keeps `device` (and so its primary-context retain) alive until the process exits: for
/// resources leaked while GPU work may still use them.
pub(crate) fn keep_context_alive(device: &Arc<Device>) {
    std::mem::forget(Arc::clone(device));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Keeps every record logged by this test binary.
    struct Capture(Mutex<Vec<(log::Level, String)>>);

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
            v.push((record.level(), record.args().to_string()));
        }
        fn flush(&self) {}
    }

    static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

    /// A context poisoned by a sticky error runs nothing more; one gpubind poisoned itself
    /// because work may still be queued or running (a timeout) does: memory it may touch
    /// must not go back to its owner.
    #[test]
    fn only_a_sticky_poison_means_nothing_runs() {
        use cudarc::driver::sys::CUresult;
        let sticky = Device::unopened_for_test(0);
        let e = sticky.poison_with("cuStreamSynchronize", CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert!(nothing_runs_after(&e), "{e}");
        let timed_out = Device::unopened_for_test(1);
        let e = timed_out.poison_with("ncclCommAbort", CUresult::CUDA_ERROR_TIMEOUT);
        assert!(matches!(e, Error::ContextPoisoned { .. }), "{e:?}");
        assert!(!nothing_runs_after(&e), "{e}");
        // Later calls into that device report the same poison: still not "nothing runs".
        let again = timed_out.check_poison().unwrap_err();
        assert!(!nothing_runs_after(&again), "{again}");
        assert!(!nothing_runs_after(&Error::Timeout {
            what: "a stream",
            after_ms: 1
        }));
    }

    /// The report names what was dropped, its device, the step, the call and its error,
    /// and the outcome, at warn level. (The drops themselves need a GPU to fail: see
    /// the GPU suites.)
    #[test]
    fn a_drop_failure_is_reported_at_warn_level() {
        let _ = log::set_logger(&CAPTURE);
        log::set_max_level(log::LevelFilter::Trace);
        // Built by hand: `Error::driver` asks libcuda for the names.
        let err = Error::Driver {
            call: "cuStreamSynchronize",
            code: crate::DriverErrorCode::ILLEGAL_ADDRESS,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            description: "an illegal memory access was encountered".into(),
        };
        report_drop(
            format_args!("DeviceSlice<{}> of {} elements", "f32", 1024),
            Some(3),
            WAIT,
            &err,
            LEAKED_UNWAITED,
        );
        report_drop(
            format_args!("an NCCL communicator"),
            None,
            RELEASE,
            &err,
            MAYBE_LEAKED,
        );
        let v = CAPTURE.0.lock().unwrap_or_else(|p| p.into_inner());
        let ours: Vec<_> = v
            .iter()
            .filter(|(_, m)| m.starts_with("gpubind: dropping"))
            .collect();
        assert_eq!(ours.len(), 2, "{v:?}");
        let (level, msg) = ours[0];
        assert_eq!(*level, log::Level::Warn);
        assert!(
            msg.starts_with(
                "gpubind: dropping DeviceSlice<f32> of 1024 elements (device 3): \
                 waiting for its pending uses: cuStreamSynchronize failed: "
            ),
            "{msg}"
        );
        assert!(msg.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{msg}");
        assert!(msg.ends_with("it is leaked, not released, because the device may still use it"));
        assert!(
            ours[1]
                .1
                .starts_with("gpubind: dropping an NCCL communicator: releasing it: "),
            "{}",
            ours[1].1
        );
    }
}
