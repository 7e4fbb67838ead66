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

/// The most ranks a job of processes may have: Linux's default ceiling on one process's
/// file descriptors (`fs.nr_open`, 2^20). Rank 0 of the rendezvous, and every rank of a
/// one-node job's mesh, holds one connection per rank, so no larger world can connect;
/// refusing it up front keeps a garbage world size from sizing the per-rank tables.
pub(crate) const MAX_PROCESS_WORLD: usize = 1 << 20;

/// `world` ranks as a typed error unless it is in `1..=MAX_PROCESS_WORLD`.
pub(crate) fn check_process_world(world: usize) -> Result<()> {
    if world == 0 || world > MAX_PROCESS_WORLD {
        return Err(crate::error::Error::InvalidArgument(format!(
            "world size {world} is not in 1..={MAX_PROCESS_WORLD} (a process cannot hold a connection to each of more ranks)"
        )));
    }
    Ok(())
}
