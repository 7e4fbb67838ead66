//! The thin layer over cudarc's `driver::sys` that the safe types are built on.
//!
//! Like cudarc's own `sys` / `result` / `safe` split, everything that talks to the driver
//! directly lives here or in a small `unsafe` block next to the call, with a
//! `// SAFETY:` comment; the public types above never see a raw `CUresult`.
//!
//! * [`init`] loads `libcuda` (dynamically: a machine without CUDA gets
//!   [`Error::NoDriver`], not a panic), refuses drivers older than CUDA 12.2
//!   ([`Error::DriverTooOld`]) and calls `cuInit(0)` until it has succeeded once (a
//!   failure is not cached: the next call retries).
//! * `result` is the result layer: one thin, named wrapper per driver call, returning a
//!   [`Result`] whose error names the call (see its module documentation).
//! * `Check` turns a `CUresult` into [`Result`], naming the call.
//! * `ContextGuard` pushes a context for the length of a scope and pops it after, so
//!   code that must run in a given context (freeing a slice from `Drop`) leaves the
//!   thread's current context exactly as it found it.
//! * `make_current` checks the thread's current context (`cuCtxGetCurrent`) and sets
//!   it only when it differs: what `bind` and every bound operation use.
//! * `PrimaryCtxOps` is the seam the loom tests use to model retain/release.
//!
//! Only [`init`] and [`driver_available`] are public. The seam — `PrimaryCtxOps`, its
//! driver implementation `CudaPrimary` (whose `release` drops a primary-context retain)
//! and the `RawContext` handle — is crate-private, so safe code outside gpubind cannot
//! release or destroy a context that live slices depend on:
//!
//! ```compile_fail,E0603
//! use gpubind::driver::CudaPrimary; // error[E0603]: module `driver` is private
//! ```
//!
//! ```compile_fail,E0603
//! use gpubind::driver::PrimaryCtxOps; // error[E0603]: module `driver` is private
//! ```
//!
//! ```compile_fail,E0603
//! use gpubind::driver::RawContext; // error[E0603]: module `driver` is private
//! ```

pub mod libraries;
pub mod version;
// Builds without the optional features (ipc, collective, nccl) leave the wrappers
// only those features call unused.
#[allow(dead_code)]
pub(crate) mod result;

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// Whether `libcuda` can be loaded on this machine. Never panics, creates nothing.
pub fn driver_available() -> bool {
    crate::loader::loadable(&["cuda", "nvcuda"])
}

/// Loads the driver and runs `cuInit(0)`, once it has succeeded never again.
///
/// Only success is cached: after a failure (no driver yet, a transient `cuInit` error)
/// the next call tries again, so one early failure does not poison the process. (The
/// driver itself may keep answering a failed `cuInit` with the same error.) Concurrent
/// first calls are serialised; once one succeeded, later calls cost one atomic load.
/// `cuInit` creates no context.
///
/// Drivers older than CUDA 12.2 ([`DriverVersion::MINIMUM`](crate::DriverVersion::MINIMUM),
/// or a version capped below it with `GPUBIND_ASSUME_DRIVER_VERSION`, see
/// [`driver_version`](crate::driver_version)) are [`Error::DriverTooOld`], naming both
/// versions; a cap that does not parse is [`Error::InvalidArgument`].
///
/// ```no_run
/// match gpubind::init() {
///     Ok(()) => println!("CUDA {} driver", gpubind::driver_version()?),
///     Err(gpubind::Error::DriverTooOld { found, needed }) => {
///         eprintln!("driver supports CUDA {found}, gpubind needs {needed}")
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), gpubind::Error>(())
/// ```
pub fn init() -> Result<()> {
    static INIT: InitOnce = InitOnce::new();
    INIT.run(|| {
        if !driver_available() {
            return Err(Error::NoDriver);
        }
        crate::driver::version::require_minimum(crate::driver::version::driver_version()?)?;
        result::init::init(0)
    })
}

/// Runs a fallible initialisation until it first succeeds; remembers only success.
///
/// Callers racing a first run wait on one mutex, so at most one attempt runs at a time
/// and, after a success, none runs again.
pub(crate) struct InitOnce {
    done: AtomicBool,
    attempt: Mutex<()>,
}

impl InitOnce {
    pub(crate) const fn new() -> Self {
        InitOnce {
            done: AtomicBool::new(false),
            attempt: Mutex::new(()),
        }
    }

    /// `Ok(())` if an earlier `run` succeeded; else runs `f` (under the lock), and
    /// remembers its success. A failure is returned and not remembered.
    pub(crate) fn run(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        // A panic in `f` poisons nothing we rely on: `done` is only set after success.
        let _attempt = self.attempt.lock().unwrap_or_else(PoisonError::into_inner);
        if self.done.load(Ordering::Acquire) {
            return Ok(()); // another caller succeeded while we waited
        }
        f()?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }
}

/// Makes `ctx` current on this thread unless it already is.
///
/// Always asks the driver (`cuCtxGetCurrent`, a thread-local read inside the driver) and
/// calls `cuCtxSetCurrent` only when the answer differs, so code outside gpubind that
/// changed the thread's context (cudarc's `CudaContext::new`, `new_non_primary`,
/// `bind_to_thread`, a dropped `CudaContext`, another library) is always noticed.
/// `cuCtxSetCurrent` replaces the top of the thread's context stack, as a bind does.
pub(crate) fn make_current(ctx: sys::CUcontext) -> Result<()> {
    if result::context::get_current()? != ctx {
        // SAFETY: callers pass a retained primary context and hold the `Arc<Device>` that
        // keeps it retained for the call; setting it current affects only this thread.
        unsafe { result::context::set_current(ctx) }?;
    }
    Ok(())
}

/// Runs `f` with this thread's stream capture mode set to relaxed, then restores the
/// previous mode (`cuThreadExchangeStreamCaptureMode`, push-pop as the driver's docs
/// advise; restored on unwind too). A relaxed thread may make calls that the default
/// mode forbids during its own or another thread's capture ("potentially unsafe" ones:
/// a host wait, an allocation), never one that conflicts with a capture itself (a query
/// of an event last recorded inside one).
pub(crate) fn with_relaxed_capture_mode<R>(f: impl FnOnce() -> R) -> Result<R> {
    let mode = result::context::exchange_capture_mode(
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    )?;
    struct Restore(sys::CUstreamCaptureMode);
    impl Drop for Restore {
        fn drop(&mut self) {
            // Puts back the mode saved before `f`.
            let _ = result::context::exchange_capture_mode(self.0);
        }
    }
    let _restore = Restore(mode);
    Ok(f())
}

/// Pushes `ctx` on this thread's context stack for the guard's lifetime.
///
/// Used where a call must run in a context that may not be the bound one (frees in
/// `Drop`, module unloads, event queries). Skips the push/pop pair when `ctx` is already
/// current, which is the common case of dropping a slice of the bound device.
pub(crate) struct ContextGuard {
    pushed: bool,
    /// A push must be popped on the same thread: keep the guard `!Send`.
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl ContextGuard {
    /// Makes `ctx` current until the guard drops.
    #[inline]
    pub(crate) fn push(ctx: sys::CUcontext) -> Result<Self> {
        if result::context::get_current()? == ctx {
            return Ok(ContextGuard {
                pushed: false,
                _same_thread: std::marker::PhantomData,
            });
        }
        // SAFETY: `ctx` is a retained primary context (callers hold the `Arc<Device>`
        // that keeps it retained for at least the guard's life).
        unsafe { result::context::push_current(ctx) }?;
        Ok(ContextGuard {
            pushed: true,
            _same_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            // SAFETY: pops exactly the context `push` pushed; the guard is `!Send`, so this
            // runs on the thread that pushed, and guards nest like the scopes holding them.
            if let Err(e) = unsafe { result::context::pop_current() } {
                crate::error::report_drop(
                    format_args!("a context guard"),
                    None,
                    "popping the context it pushed",
                    &e,
                    "the thread's current context may not be restored",
                );
            }
        }
    }
}

/// The two driver calls behind lazy primary-context handling.
///
/// Production code uses `CudaPrimary`; the loom tests (`src/loom_tests.rs`) substitute a
/// model that counts calls, to check that concurrent first binds retain exactly once and
/// that the last `Arc<Device>` releases exactly once.
///
/// Crate-private on purpose: `release` drops a retain that live slices, streams and
/// modules depend on, so only `LazyPrimary`'s `Drop` may call it.
pub(crate) trait PrimaryCtxOps: Send + Sync {
    /// The context handle type.
    type Ctx: Copy + Send + Sync;
    /// `cuDevicePrimaryCtxRetain`.
    fn retain(&self, device: i32) -> Result<Self::Ctx>;
    /// `cuDevicePrimaryCtxRelease`.
    fn release(&self, device: i32);
}

/// A `CUcontext` that may cross threads.
///
/// The handle is only an identifier; what may be done with it on which thread is what
/// the safe types govern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawContext(pub(crate) sys::CUcontext);
// SAFETY: a CUcontext handle is a plain identifier the driver accepts from any thread.
unsafe impl Send for RawContext {}
// SAFETY: as above; it is never dereferenced on the Rust side.
unsafe impl Sync for RawContext {}

/// The real driver. Crate-private: its `release` is only sound as the one release that
/// matches `LazyPrimary`'s one retain.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CudaPrimary;

impl PrimaryCtxOps for CudaPrimary {
    type Ctx = RawContext;
    fn retain(&self, device: i32) -> Result<RawContext> {
        result::context::primary_retain(device).map(RawContext)
    }
    fn release(&self, device: i32) {
        // SAFETY: called once for each successful retain (enforced by LazyPrimary), by
        // the last `Arc<Device>`, after everything that used the context.
        if let Err(e) = unsafe { result::context::primary_release(device) } {
            crate::error::report_drop(
                format_args!("the last Arc<Device> (CUdevice {device})"),
                None,
                "releasing the primary context",
                &e,
                "the context may stay retained (leaked)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    fn transient() -> Error {
        Error::InvalidArgument("transient".into())
    }

    #[test]
    fn init_once_retries_after_failure_and_caches_success() {
        let once = InitOnce::new();
        let calls = AtomicUsize::new(0);
        let attempt = || {
            // Fails twice, then succeeds.
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(transient()),
                _ => Ok(()),
            }
        };
        assert_eq!(once.run(attempt), Err(transient()));
        assert_eq!(once.run(attempt), Err(transient()));
        assert_eq!(once.run(attempt), Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Success is cached: `f` never runs again.
        assert_eq!(once.run(|| panic!("must not run after success")), Ok(()));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn init_once_recovers_from_a_panicking_attempt() {
        let once = InitOnce::new();
        let panicked = std::panic::catch_unwind(|| once.run(|| panic!("boom")));
        assert!(panicked.is_err());
        assert_eq!(once.run(|| Err(Error::NoDriver)), Err(Error::NoDriver));
        assert_eq!(once.run(|| Ok(())), Ok(()));
    }

    #[test]
    fn init_once_runs_one_success_under_contention() {
        let once = Arc::new(InitOnce::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (once, calls) = (once.clone(), calls.clone());
                std::thread::spawn(move || {
                    once.run(|| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn init_without_a_driver_is_rechecked_not_cached() {
        // Without libcuda every call checks again (and says NoDriver); with one, init
        // succeeds or reports the driver's error. Either way no panic.
        for _ in 0..3 {
            match init() {
                Ok(())
                | Err(Error::NoDriver)
                | Err(Error::Driver { .. })
                | Err(Error::DriverTooOld { .. }) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
    }
}
