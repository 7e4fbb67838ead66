//! Synchronisation primitives, swapped for loom's models under `--cfg loom`.
//!
//! Only the state that the loom tests model goes through here: the per-thread
//! [`ThreadContext`](crate::ThreadContext) slot, the lazy primary-context retain, the
//! buffers' access trackers (`crate::access`) and the hand-over of a release to its
//! device's release thread (`crate::teardown::release`).

#[cfg(loom)]
pub(crate) use loom::sync::{
    Condvar, Mutex, MutexGuard,
    atomic::{AtomicU64, AtomicUsize},
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    Condvar, Mutex, MutexGuard,
    atomic::{AtomicU64, AtomicUsize},
};

/// Locks a mutex, recovering from poisoning: our critical sections leave the state
/// consistent even when a panic unwinds through them (they only store a value at the end).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Declares a thread-local with loom's model under `--cfg loom`.
macro_rules! thread_local_slot {
    ($(#[$m:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(loom)]
        loom::thread_local! { $(#[$m])* static $name: $t = $init; }
        #[cfg(not(loom))]
        std::thread_local! { $(#[$m])* static $name: $t = const { $init }; }
    };
}
pub(crate) use thread_local_slot;

/// A stream's gate (`crate::access`'s fast path): held by a fast-path enqueue on the stream, and by
/// whoever takes back a tracker's published id of the stream. A plain `std` mutex, also
/// under loom: the loom models use their own mock streams.
#[derive(Default)]
pub(crate) struct Gate(std::sync::Mutex<()>);

impl Gate {
    /// Locks the gate (poisoning cannot leave anything inconsistent: it guards no data).
    #[inline(always)]
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}
