//! The claim's fast path: a launch on the stream that already orders every buffer it
//! passes takes no tracker lock.
//!
//! Every tracker *publishes* stream ids, outside its lock ([`Published`]):
//!
//! * one `write` id: a write on this stream needs no wait and records nothing (the
//!   stream is the buffer's one pending writer and there are no readers);
//! * up to [`READ_SLOTS`] `read` ids: a read on one of these streams needs no wait and
//!   records nothing (every pending write is on it, and it is recorded).
//!
//! An operation on stream `X` whose every buffer publishes `X` for its access takes the
//! fast path: it locks `X`'s **gate** (one mutex per stream), checks the published ids,
//! enqueues itself and unlocks. No tracker is locked, sorted or written.
//!
//! What keeps it sound, for a published id `X`:
//!
//! 1. **Published only when true.** An id is stored under the tracker's lock (or with
//!    the tracker held `&mut`), after the use that makes it true was enqueued.
//! 2. **Taken back only under `X`'s gate** (or with the tracker held `&mut`, when no
//!    fast path can be using it): every take-back ([`Published::close_others`], and the
//!    eviction in [`Published::publish`]) stores "none" while holding the gate, so
//!    every fast path that read `X` before has finished its enqueue, and every one
//!    after sees "none" and takes the slow path (the tracker's lock).
//! 3. **Taken back before it stops being true.** Every slow path that records an event
//!    on `X` (to make another stream wait for it), synchronises `X` on the host, or
//!    changes the tracker's lists in a way that could make `X`'s id false (another
//!    stream's write, pruning idle readers, forgetting uses) first takes back the
//!    published ids of other streams than its own that it could make false: all of
//!    them, except that a new reader that prunes nothing keeps the other readers' read
//!    ids (they stay true; a write id, which needs a sole writer, was taken back before
//!    the reader's wait or is none) — but for the last slot's, which it takes over when
//!    the slots are full (under that stream's gate, rule 2). The event or
//!    synchronisation then covers every fast-path operation that was admitted.
//!
//! Lock order: a tracker's lock, then a gate. A fast path holds only its gate and takes
//! nothing else, so there is no cycle.
//!
//! # Limits
//!
//! * One stream at a time is published for writes, and [`READ_SLOTS`] for reads; a use
//!   on any other stream takes the slow path, which is what every use cost before the
//!   fast path existed. A new reading stream takes the last read slot (its holder's id
//!   taken back under its gate), so the first reader and the newest take the fast path;
//!   three or more streams taking turns on one module take the slow path at each turn
//!   to a stream that is not published. A launch claims a buffer passed by `&` as a
//!   read (published like a module's) and one passed by `&mut` as a write, so a buffer
//!   written by two streams' launches is handed off (an event) at every change of
//!   stream. A read on another stream than the pending write's is not published (the
//!   write is not on it) and takes the slow path until the write is retired.
//! * A fast-path launch that blocks inside the driver (a full launch queue) holds `X`'s
//!   gate until the driver returns. A slow path taking back `X`'s id on any tracker
//!   waits for it meanwhile, holding that tracker's lock, and so do the threads
//!   waiting for that lock. The driver returns as `X`'s queued work drains, which
//!   needs no gpubind lock, so this delays and never deadlocks — unless `X`'s queued
//!   work itself waits for one of those threads (a collective whose peer is on the
//!   stalled thread), the same coupling a slow-path launch blocked in the driver has
//!   with its trackers' locks.

use super::{Access, AccessState, Grave, TrackedStream};
use crate::error::Result;
use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// No stream: nothing is published (stream ids are never `u64::MAX`: gpubind's count up
/// from 1, the legacy streams' are `LEGACY_ID | ordinal`).
pub(crate) const NONE: u64 = u64::MAX;

/// How many streams a tracker can publish for reads at once: a module launched on a
/// compute stream and a second stream (a copy or communication stream, a second
/// compute stream) takes the fast path on both. A third reading stream takes the
/// second's slot at its first launch (see [`Published::publish`]).
pub(crate) const READ_SLOTS: usize = 2;

/// A tracker's published stream ids; see the [module docs](self).
pub(crate) struct Published {
    write: AtomicU64,
    /// Distinct ids (or [`NONE`]), each true for reads.
    read: [AtomicU64; READ_SLOTS],
}

impl Default for Published {
    fn default() -> Self {
        Published {
            write: AtomicU64::new(NONE),
            read: std::array::from_fn(|_| AtomicU64::new(NONE)),
        }
    }
}

impl Published {
    /// Whether a use of kind `access` on stream `on` may take the fast path. Call it
    /// with `on`'s gate held, and enqueue before unlocking the gate.
    #[inline(always)]
    pub(crate) fn admits(&self, on: u64, access: Access) -> bool {
        // Acquire: pairs with `publish`'s Release, after the use that made it true was
        // enqueued.
        match access {
            Access::Write => self.write.load(Acquire) == on,
            Access::Read => self.read.iter().any(|slot| slot.load(Acquire) == on),
        }
    }

    /// Takes back every published id other than `keep`, each under its stream's gate
    /// (rule 2). Runs under the tracker's lock, before the caller records an event on,
    /// synchronises, or changes the lists (rule 3). Ids equal to `keep` stay: an
    /// operation on `keep` never makes them false (it is ordered after what they admit,
    /// by stream order).
    pub(crate) fn close_others<S: TrackedStream>(&self, st: &AccessState<S>, keep: u64) {
        let mut ids = [NONE; 1 + READ_SLOTS];
        ids[0] = self.write.load(Relaxed);
        for (id, slot) in ids[1..].iter_mut().zip(&self.read) {
            *id = slot.load(Relaxed);
        }
        // Each distinct id once: a stream published for writes is usually published
        // for reads too, and its gate need not be taken twice.
        for (i, &id) in ids.iter().enumerate() {
            if id != NONE && id != keep && !ids[..i].contains(&id) {
                self.close_one(st, id);
            }
        }
    }

    /// Takes back the published write id, if any, under its stream's gate (rule 2): no
    /// write is admitted without the tracker's lock from then on, until one is
    /// published again.
    pub(crate) fn close_write<S: TrackedStream>(&self, st: &AccessState<S>) {
        let w = self.write.load(Relaxed);
        if w != NONE {
            self.close_one(st, w);
        }
    }

    /// Takes back `id` from every slot under its stream's gate.
    fn close_one<S: TrackedStream>(&self, st: &AccessState<S>, id: u64) {
        match st.find(id) {
            Some(s) => s.under_gate(|| self.close_id(id)),
            // Unreachable while rule 3 holds (a published stream stays in the lists
            // until its id is taken back); closing anyway is the safe choice.
            None => {
                debug_assert!(false, "published stream {id} is not recorded");
                self.close_id(id);
            }
        }
    }

    /// Stores "none" in each slot that holds `id`.
    fn close_id(&self, id: u64) {
        for slot in std::iter::once(&self.write).chain(&self.read) {
            if slot.load(Relaxed) == id {
                slot.store(NONE, Relaxed);
            }
        }
    }

    /// Whether another stream than `on` is published for writes.
    fn writes_other_than(&self, on: u64) -> bool {
        let w = self.write.load(Relaxed);
        w != NONE && w != on
    }

    /// Publishes `on` where it is now true (rule 1): as the write id if that slot is
    /// empty, and as a read id unless it is one already — in an empty read slot, or else
    /// in the last one, whose stream's id is first taken back under its gate (rule 2).
    /// So the newest reading stream always gets the fast path, and the first one keeps
    /// it. Runs under the tracker's lock, after the use on `on` was enqueued and
    /// committed.
    pub(crate) fn publish<S: TrackedStream>(&self, st: &AccessState<S>, on: u64) {
        if st.write_is_free(on) && self.write.load(Relaxed) == NONE {
            self.write.store(on, Release);
        }
        if st.read_is_free(on) && !self.read.iter().any(|slot| slot.load(Relaxed) == on) {
            let slot = match self.read.iter().find(|slot| slot.load(Relaxed) == NONE) {
                Some(empty) => empty,
                None => {
                    let last = &self.read[READ_SLOTS - 1];
                    self.close_one(st, last.load(Relaxed));
                    last
                }
            };
            slot.store(on, Release);
        }
    }

    /// What [`reset_mut`](Self::reset_mut) publishes for `on` when the one pending use
    /// is a write on `on` and no read is open ([`AccessState::written_by`]): `on` for
    /// writes and in the first read slot (a write on the sole writer's stream, and a read
    /// there, need no wait and record nothing), built directly for a new allocation's
    /// tracker (checked against `reset_mut` by the unit tests).
    #[inline(always)]
    pub(crate) fn sole_writer(on: u64) -> Self {
        Published {
            write: AtomicU64::new(on),
            read: std::array::from_fn(|i| AtomicU64::new(if i == 0 { on } else { NONE })),
        }
    }

    /// With the tracker held `&mut` (no fast path can be using it): takes back every id
    /// and publishes what is true for `on` (`None`: nothing).
    #[inline]
    pub(crate) fn reset_mut<S: TrackedStream>(&mut self, st: &AccessState<S>, on: Option<u64>) {
        let w = on.filter(|&on| st.write_is_free(on)).unwrap_or(NONE);
        let r = on.filter(|&on| st.read_is_free(on)).unwrap_or(NONE);
        // Plain stores (Relaxed): `&mut` already excludes every reader.
        self.write.store(w, Relaxed);
        for (i, slot) in self.read.iter().enumerate() {
            slot.store(if i == 0 { r } else { NONE }, Relaxed);
        }
    }

    /// A tracker's published ids `(write, reads)` as given, for tests.
    #[cfg(test)]
    pub(crate) fn with_ids((write, read): (u64, [u64; READ_SLOTS])) -> Self {
        Published {
            write: AtomicU64::new(write),
            read: read.map(AtomicU64::new),
        }
    }

    /// The published ids `(write, reads)`, for tests.
    #[cfg(test)]
    pub(crate) fn ids(&self) -> (u64, [u64; READ_SLOTS]) {
        (
            self.write.load(Relaxed),
            std::array::from_fn(|i| self.read[i].load(Relaxed)),
        )
    }
}

/// A slow-path claim's step on one locked tracker before its operation is enqueued on
/// `on`: refuses a write while a read is open ([`super::lend`]); unless the use is
/// already ordered there, takes back what other streams publish
/// (rule 3) and calls `wait(from)` for every conflicting stream.
#[inline]
pub(crate) fn order_before_enqueue<S: TrackedStream>(
    st: &AccessState<S>,
    published: &Published,
    on: u64,
    access: Access,
    wait: impl FnMut(&S) -> Result<()>,
) -> Result<()> {
    if access == Access::Write && st.lends > 0 {
        // An open read's outside work is not ordered yet ([`super::lend`]).
        return Err(super::lend::lent_error());
    }
    if st.is_ordered_on(on, access) {
        return Ok(());
    }
    // Before the events: they must cover every fast-path use admitted so far.
    published.close_others(st, on);
    st.wait_conflicts(on, access, wait)
}

/// A slow-path claim's step on one locked tracker after its operation was enqueued on
/// `on`: records the use (taking back first what other streams publish and the commit
/// makes false) and publishes `on` where that is now true. `grave` is made only if the
/// commit replaces something.
#[inline]
pub(crate) fn record_after_enqueue<S: TrackedStream>(
    st: &mut AccessState<S>,
    published: &Published,
    on: u64,
    access: Access,
    make: impl Fn(u64) -> S,
    grave: &mut Option<Grave<S>>,
) {
    if !st.commit_is_noop(on, access) {
        // A write replaces every use, and a read that prunes may drop readers: take back
        // what other streams publish. A read that prunes nothing only adds a reader, so
        // the other readers' read ids stay true; another stream's write id would not,
        // but there is none (the order step took it back before waiting for the writer,
        // or there is no writer), and if there were, taking everything back is safe.
        let keeps_readers =
            access == Access::Read && !st.read_may_prune() && !published.writes_other_than(on);
        if !keeps_readers {
            published.close_others(st, on);
        }
        st.commit(&[(on, access)], make, grave.get_or_insert_with(Grave::new));
    }
    published.publish(st, on);
}

/// A host access's step on one locked tracker: refuses a write while a read is open
/// ([`super::lend`]); takes back everything published (every
/// admitted fast-path use is then enqueued before the synchronisation), then waits on
/// the host for the conflicting streams and forgets them ([`AccessState::host_wait`]).
pub(crate) fn host_wait_published<S: TrackedStream>(
    st: &mut AccessState<S>,
    published: &Published,
    access: Access,
    synchronize: impl FnMut(&S) -> Result<()>,
    grave: &mut Grave<S>,
) -> Result<()> {
    if access == Access::Write && st.lends > 0 {
        // An open read's outside work is not ordered yet ([`super::lend`]).
        return Err(super::lend::lent_error());
    }
    published.close_others(st, NONE);
    st.host_wait(access, synchronize, grave)
}
