//! Small helpers every part of the collectives uses: a mutex lock that survives
//! poisoning, a saturating deadline, and the settling of lanes after a failed enqueue.

use crate::access::StreamRef;
use crate::error::Result;
use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering from poisoning (the state is consistent at every unlock).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `timeout` from now, saturating: `Instant::now() + Duration::MAX` (the natural way to
/// say "wait for ever") would panic; a deadline 136 years out does not, and is never met.
pub(crate) fn deadline_after(timeout: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(u64::from(u32::MAX)))
}

/// A collective that failed part-way may have left work on one lane touching buffers
/// recorded on another (its closing barrier was never enqueued): wait for every lane on
/// the host before the claim is released, so the trackers are true again. Best effort:
/// the first error (the enqueue's) is returned.
pub(crate) fn settle_on_error(lanes: &[StreamRef], out: Result<()>) -> Result<()> {
    if out.is_err() {
        for l in lanes {
            let _ = l.synchronize();
        }
    }
    out
}
