//! Bounded waits for a drop: how long (`GPUBIND_DROP_TIMEOUT`), the polling of a stream
//! up to a deadline, and the per-stream memo of waits that gave up (one limit per stream,
//! not per buffer). Used by `StreamRef::synchronize_within` (`crate::access`); the
//! contract is docs/safety.md, "Drops".

use crate::access::LEGACY_ID;
use crate::config::DEFAULT_DROP_TIMEOUT;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::time::{Duration, Instant};

/// Why [`poll_until_idle`] stopped.
#[derive(Debug, PartialEq)]
pub(crate) enum Polled {
    /// The query failed with this error (not `CUDA_ERROR_NOT_READY`).
    Failed(Error),
    /// Still busy at the deadline, after this many milliseconds.
    TimedOut(u64),
}

/// A stream query's answer: `result::stream::query`'s (`Ok(true)` idle, `Ok(false)`
/// busy), or a raw `cuStreamQuery` code.
pub(crate) trait QueryAnswer {
    /// `Ok(true)` when idle, `Ok(false)` while busy, else the query's error.
    fn idle(self) -> Result<bool>;
}

impl QueryAnswer for Result<bool> {
    #[inline]
    fn idle(self) -> Result<bool> {
        self
    }
}

impl QueryAnswer for sys::CUresult {
    #[inline]
    fn idle(self) -> Result<bool> {
        result::check_ready(self, "cuStreamQuery")
    }
}

/// Calls `query` (a `cuStreamQuery`) until it answers idle, a failure, or the deadline
/// passes: spinning (with `yield_now`) for the first 200 µs, which keeps short waits as
/// prompt as a blocking synchronize, then sleeping 50 µs doubling to 1 ms.
pub(crate) fn poll_until_idle<A: QueryAnswer>(
    mut query: impl FnMut() -> A,
    deadline: Option<Instant>,
    limit: Duration,
) -> std::result::Result<(), Polled> {
    let started = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        match query().idle() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(Polled::Failed(e)),
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let ms = limit.as_millis().min(u128::from(u64::MAX)) as u64;
            return Err(Polled::TimedOut(ms));
        }
        if now.duration_since(started) < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

/// How long a drop (a buffer's, a module's, a communicator's; also `into_raw`, a DLPack
/// export) waits for its pending stream-ordered uses before giving up and leaking what the
/// device may still use: `GPUBIND_DROP_TIMEOUT` in seconds (`0` = do not wait: leak
/// whatever is still busy; `none` = wait without a limit, as `cuStreamSynchronize`
/// would), default 300 s; read once. A value that does not parse is logged and the
/// default used.
pub(crate) fn drop_timeout() -> Duration {
    static LIMIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        crate::config::drop_timeout(&crate::config::env).unwrap_or_else(|e| {
            log::warn!("{e}; using {} s", DEFAULT_DROP_TIMEOUT.as_secs());
            DEFAULT_DROP_TIMEOUT
        })
    })
}

/// The streams (by id) on which a bounded wait has given up, each with an event recorded
/// on it at that moment: see `StreamRef::synchronize_within`. A later wait gives up at
/// once only while that event has not completed, i.e. while the work that made the first
/// wait give up still runs; once it has, the entry goes and waits get the full limit
/// again, whatever else synchronised the stream meanwhile. Entries go with their stream
/// (`StreamInner`'s drop) and, for a legacy stream, with a reset of its context. Rarely
/// more than a few.
pub(crate) struct GaveUp;

/// An event handle, kept as an integer so the list is `Send`.
type EventHandle = usize;

static GAVE_UP: std::sync::Mutex<Vec<(u64, EventHandle)>> = std::sync::Mutex::new(Vec::new());

impl GaveUp {
    fn list() -> std::sync::MutexGuard<'static, Vec<(u64, EventHandle)>> {
        GAVE_UP.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the work a wait on stream `id` gave up on still runs. Its context must be
    /// current. An entry whose event has completed (or cannot be queried) is removed.
    pub(crate) fn still_busy(id: u64) -> bool {
        let mut v = Self::list();
        let Some(k) = v.iter().position(|&(x, _)| x == id) else {
            return false;
        };
        let event = v[k].1 as sys::CUevent;
        // SAFETY: the event was created in this stream's context, which is current, and
        // is destroyed only under this lock, after leaving the list.
        if unsafe { result::event::query(event) } == Ok(false) {
            return true;
        }
        v.swap_remove(k);
        // SAFETY: as above; removed from the list first, so destroyed once. Best effort:
        // a failure leaves the event to its context.
        let _ = unsafe { result::event::destroy(event) };
        false
    }

    /// Remembers that a wait on `raw` (id `id`) gave up: records an event on it. Its
    /// context must be current. Best effort: without an event, later waits simply get
    /// the full limit.
    pub(crate) fn remember(id: u64, raw: sys::CUstream) {
        let mut v = Self::list();
        if v.iter().any(|&(x, _)| x == id) {
            return;
        }
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint;
        // SAFETY: the context is current; the list's owner destroys the event.
        let Ok(event) = (unsafe { result::event::create(flags) }) else {
            return;
        };
        // SAFETY: a live event and a live stream of the current context.
        if unsafe { result::event::record(event, raw) }.is_err() {
            // SAFETY: created above, never recorded, destroyed once (best effort).
            let _ = unsafe { result::event::destroy(event) };
            return;
        }
        v.push((id, event as EventHandle));
    }

    /// Forgets stream `id` (being destroyed, or its context reset); destroys its event
    /// when `destroy` (its context is current), else lets it go with its context.
    pub(crate) fn forget_stream(id: u64, destroy: bool) {
        let mut v = Self::list();
        if let Some(k) = v.iter().position(|&(x, _)| x == id) {
            let (_, event) = v.swap_remove(k);
            if destroy {
                // Relaxed, as every release call of a drop (`faults::enter_and_call`):
                // an event of gpubind's own, never recorded in a capture.
                let _ = crate::driver::with_relaxed_capture_mode(|| {
                    // SAFETY: created in the current context, removed from the list
                    // first, so destroyed once.
                    unsafe { result::event::destroy(event as sys::CUevent) }
                });
            }
        }
    }
}

/// Forgets what bounded waits remembered about device `ordinal`'s legacy stream: its
/// primary context is being reset, and the next context's legacy stream has the same id.
pub(crate) fn forget_legacy_gave_up(ordinal: usize) {
    GaveUp::forget_stream(LEGACY_ID | ordinal as u64, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_ends_on_success_failure_or_the_deadline() {
        use sys::CUresult::*;
        let long = Duration::from_secs(60);
        // Busy three times, then idle.
        let mut n = 0;
        let r = poll_until_idle(
            || {
                n += 1;
                if n < 4 {
                    CUDA_ERROR_NOT_READY
                } else {
                    CUDA_SUCCESS
                }
            },
            Instant::now().checked_add(long),
            long,
        );
        assert_eq!((r, n), (Ok(()), 4));
        // A failure is returned as it is.
        let r = poll_until_idle(|| CUDA_ERROR_ILLEGAL_ADDRESS, None, long);
        assert!(
            matches!(&r, Err(Polled::Failed(e))
                if e.driver_code() == Some(crate::DriverErrorCode::ILLEGAL_ADDRESS)),
            "{r:?}"
        );
        // Never idle: gives up at the deadline, not before, and not long after.
        let limit = Duration::from_millis(30);
        let t = Instant::now();
        let r = poll_until_idle(
            || CUDA_ERROR_NOT_READY,
            Instant::now().checked_add(limit),
            limit,
        );
        let took = t.elapsed();
        assert_eq!(r, Err(Polled::TimedOut(30)));
        assert!(took >= limit && took < Duration::from_secs(2), "{took:?}");
        // A zero limit: one query, then leak.
        let mut calls = 0;
        let r = poll_until_idle(
            || {
                calls += 1;
                CUDA_ERROR_NOT_READY
            },
            Some(Instant::now()),
            Duration::ZERO,
        );
        assert_eq!((r, calls), (Err(Polled::TimedOut(0)), 1));
    }
}
