//! Stream-ordered access tracking: what makes gpubind's stream-ordered operations free of
//! data races without a driver call per operation.
//!
//! gpubind's streams are non-blocking, and the synchronous calls of `BoundDevice` run on
//! the legacy default stream, so nothing in CUDA orders work on one stream after work on
//! another. Borrowing a buffer only while an operation is *enqueued* therefore does not
//! stop a later operation — on another stream, or from the host — from touching it while
//! the first still runs. Every allocation ([`DeviceSlice`](crate::DeviceSlice), the IPC
//! slices built on it, [`ManagedSlice`](crate::ManagedSlice), page-locked host buffers,
//! modules, the collectives' staging) carries an [`AccessTracker`] that remembers its
//! *pending* stream-ordered uses:
//!
//! * the streams of the last **write** (usually one), and the streams of the **reads**
//!   since;
//! * an operation **claims** every buffer it touches: it locks their trackers (in address
//!   order, so two operations never deadlock), makes its stream wait on the device for
//!   each conflicting use on *another* stream (an event recorded on that stream, from a
//!   per-device pool, and `cuStreamWaitEvent`), enqueues itself, records its own use and
//!   only then unlocks. Waits, enqueue and record are one step: no other use of the buffer
//!   can slip between them;
//! * a use on the stream that already orders everything costs one compare under an
//!   uncontended lock and no driver call; a read waits only for the last write, so
//!   concurrent readers stay concurrent;
//! * a **launch** on the stream that already orders every buffer it passes (and its
//!   module) locks no tracker at all: it holds the stream's gate across its enqueue and
//!   reads the ids each tracker publishes ([`fast`], the rules that keep it sound);
//! * **host** access and the synchronous calls claim the buffer too: they wait on the host
//!   (`cuStreamSynchronize`) for the conflicting streams, forget those uses, and hold the
//!   lock until their own copy has finished;
//! * **dropping** the allocation waits for every pending use before the memory is freed.
//!
//! The state machine ([`AccessState`]) and the steps taken under the lock are generic over
//! the stream type, so the loom models run the same code with mock streams.

use crate::error::Result;
use crate::sync;
use crate::teardown::drop_wait::drop_timeout;
use std::time::Instant;

/// Whether an operation reads or writes a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The operation only reads: concurrent reads on other streams need not wait for it.
    Read,
    /// The operation may write: every other use is ordered before or after it.
    Write,
}

impl Access {
    /// The stronger of two accesses (a buffer read and written by one operation is written).
    fn max(self, other: Access) -> Access {
        if self == Access::Write || other == Access::Write {
            Access::Write
        } else {
            Access::Read
        }
    }
}

mod borrowed;
mod fast;
mod foreign;
mod join;
pub(crate) mod lend;
mod state;
mod stream;
mod streams;

pub(crate) use fast::Published;
pub(crate) use join::FreeOn;
pub(crate) use state::{AccessState, Grave, TrackedStream};
use stream::FOREIGN_CLAIM;
pub(crate) use stream::{LEGACY_ID, StreamInner, StreamRef, StreamSlot};

/// The pending stream-ordered uses of one allocation; see the [module docs](self).
///
/// Public only as an unnameable type of hidden trait methods; nothing outside gpubind
/// can construct a meaningful one or inspect it.
pub struct AccessTracker {
    state: sync::Mutex<AccessState<StreamRef>>,
    /// The streams a use may take the fast path on, without this lock ([`fast`]).
    published: Published,
}

impl Default for AccessTracker {
    fn default() -> Self {
        AccessTracker {
            state: sync::Mutex::new(AccessState::default()),
            published: Published::default(),
        }
    }
}

impl std::fmt::Debug for AccessTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = sync::lock(&self.state);
        f.debug_struct("AccessTracker")
            .field("writers", &st.writers.len())
            .field("readers", &st.readers.len())
            .finish()
    }
}

impl AccessTracker {
    /// A tracker whose allocation has one pending write, on `on` (memory adopted with
    /// work still queued on it).
    pub(crate) fn written_on(on: StreamRef) -> Self {
        AccessTracker {
            state: sync::Mutex::new(AccessState::written_by(on)),
            // Nothing published: the first use takes the slow path (and publishes).
            published: Published::default(),
        }
    }

    /// An idle tracker that publishes `(write, reads)` (only for tests of what the fast
    /// path admits: nothing is pending, so the ids are not true).
    #[cfg(test)]
    pub(crate) fn with_published(ids: (u64, [u64; fast::READ_SLOTS])) -> Self {
        AccessTracker {
            state: sync::Mutex::new(AccessState::default()),
            published: Published::with_ids(ids),
        }
    }

    /// Whether a use of kind `access` on stream `on` may take the fast path (see
    /// [`fast`]): call with `on`'s gate held ([`StreamSlot::lock_gate`]) and enqueue
    /// before unlocking it.
    #[inline(always)]
    pub(crate) fn admits(&self, on: u64, access: Access) -> bool {
        self.published.admits(on, access)
    }

    /// Waits for every pending use (before the memory is freed or handed away) and
    /// forgets them: all streams are synchronised even if one fails; the first error is
    /// returned and then nothing is forgotten.
    ///
    /// Bounded: past [`drop_timeout`] (`GPUBIND_DROP_TIMEOUT`, default 300 s) the wait
    /// gives up with [`Error::Timeout`], so a drop after a kernel that never ends (a
    /// collective waiting for a dead peer, a spinning kernel) leaks the memory and logs
    /// it instead of blocking for ever.
    pub(crate) fn wait_all(&mut self) -> Result<()> {
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if st.is_idle() {
            // Nothing pending, so nothing published (a published stream is recorded).
            return Ok(());
        }
        // Held `&mut`: no fast path can be using what is published.
        self.published.reset_mut(st, None);
        let limit = drop_timeout();
        let deadline = Instant::now().checked_add(limit);
        st.wait_all(|s| s.synchronize_within(deadline, limit))
    }

    /// Whether every pending use has finished (`cuStreamQuery` of each stream, which
    /// reports the stream's later work too; a stream that cannot be queried counts as
    /// busy). Forgets nothing: for a drop that polls, with a limit, alongside other
    /// conditions (an NCCL communicator's drop waits so for its graph launches).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn pending_finished(&self) -> bool {
        let st = sync::lock(&self.state);
        st.writers
            .iter()
            .chain(&st.readers)
            .all(TrackedStream::is_idle)
    }

    /// Turns every pending read into a pending write (a module's launches, once it has
    /// global views: what they wrote must be waited for by later reads too). The
    /// invariant holds: writes have no ordering among themselves to keep, and the reads
    /// were ordered after the old writes, which stay.
    pub(crate) fn reads_become_writes(&self) {
        let mut st = sync::lock(&self.state);
        self.published.close_others(&st, fast::NONE);
        st.reads_become_writes();
    }

    /// A host access of kind `access` that needs nothing held afterwards (the borrow of
    /// the memory excludes conflicting uses from then on): waits and forgets.
    /// [`host_access`](Self::host_access) for a caller that holds the tracker
    /// exclusively: no lock, and nothing at all when no use is pending.
    pub(crate) fn host_access_mut(&mut self, access: Access) -> Result<()> {
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if st.is_idle() {
            return Ok(());
        }
        // Held `&mut`: no fast path can be using what is published.
        self.published.reset_mut(st, None);
        let mut grave = Grave::new();
        let out = st.host_wait(access, StreamRef::synchronize, &mut grave);
        drop(grave);
        out
    }

    pub(crate) fn host_access(&self, access: Access) -> Result<()> {
        let mut grave = Grave::new();
        let out = {
            let mut st = sync::lock(&self.state);
            fast::host_wait_published(
                &mut st,
                &self.published,
                access,
                StreamRef::synchronize,
                &mut grave,
            )
        };
        drop(grave);
        out
    }
}

/// One buffer an operation touches, and how.
pub(crate) type Use<'t> = Option<(&'t AccessTracker, Access)>;

/// A locked tracker within a claim.
pub(crate) struct Held<'t> {
    guard: sync::MutexGuard<'t, AccessState<StreamRef>>,
    published: &'t Published,
    access: Access,
}

/// Sorts `uses` by tracker address (so every thread locks in the same order) and merges
/// uses of one tracker; `None`s go last.
fn sort_and_merge(uses: &mut [Use<'_>]) {
    let key = |u: &Use<'_>| u.map_or(usize::MAX, |(t, _)| t as *const _ as usize);
    if uses.len() <= 8 {
        // Insertion sort: a launch claims a handful of buffers, and for so few the
        // standard sort's set-up costs more than the sorting (measured with callgrind:
        // scripts/profile-overhead.sh).
        for i in 1..uses.len() {
            let mut j = i;
            while j > 0 && key(&uses[j - 1]) > key(&uses[j]) {
                uses.swap(j - 1, j);
                j -= 1;
            }
        }
    } else {
        uses.sort_unstable_by_key(key);
    }
    // Merge every run of one tracker into its first entry (a buffer passed three times
    // must be locked once, not twice: std's Mutex is not reentrant).
    let mut kept: Option<usize> = None;
    for i in 0..uses.len() {
        let Some((t, a)) = uses[i] else { continue };
        match kept {
            Some(k) if uses[k].is_some_and(|(kt, _)| std::ptr::eq(kt, t)) => {
                if let Some((kt, ka)) = uses[k] {
                    uses[k] = Some((kt, ka.max(a)));
                }
                uses[i] = None;
            }
            _ => kept = Some(i),
        }
    }
}

/// Locks the trackers of `uses` (sorted and merged) into `held`.
fn lock_all<'t>(uses: &mut [Use<'t>], held: &mut [Option<Held<'t>>]) {
    sort_and_merge(uses);
    for (u, h) in uses.iter().zip(held.iter_mut()) {
        if let Some((t, access)) = *u {
            *h = Some(Held {
                guard: sync::lock(&t.state),
                published: &t.published,
                access,
            });
        }
    }
}

/// An operation's claim on the buffers it touches, on one stream: taken before the
/// operation is enqueued, recorded and released (in `Drop`) after. See the module docs.
#[must_use = "hold the claim until the operation is enqueued"]
pub(crate) struct Claim<'t, 's, H: AsMut<[Option<Held<'t>>]>> {
    held: H,
    on: StreamSlot<'s>,
    _t: std::marker::PhantomData<&'t ()>,
}

/// Storage for the locks of a claim of at most `N` buffers.
pub(crate) type Locks<'t, const N: usize> = [Option<Held<'t>>; N];

/// Empty lock storage.
pub(crate) fn locks<'t, const N: usize>() -> Locks<'t, N> {
    std::array::from_fn(|_| None)
}

/// Claims `uses` (at most as many as `held` has room for) for an operation on `on`, whose
/// context is current: locks the trackers and makes `on` wait for every conflicting use.
pub(crate) fn claim<'t, 's, H: AsMut<[Option<Held<'t>>]>>(
    on: StreamSlot<'s>,
    uses: &mut [Use<'t>],
    mut held: H,
) -> Result<Claim<'t, 's, H>> {
    lock_all(uses, held.as_mut());
    let id = on.id();
    for h in held.as_mut().iter().flatten() {
        fast::order_before_enqueue(&h.guard, h.published, id, h.access, |from| {
            from.enqueue_wait(on.raw())
        })?;
    }
    Ok(Claim {
        held,
        on,
        _t: std::marker::PhantomData,
    })
}

impl<'t, H: AsMut<[Option<Held<'t>>]>> Drop for Claim<'t, '_, H> {
    fn drop(&mut self) {
        // Record the operation's uses, unlock, then drop what they replaced.
        // Made only if a commit replaces something (the usual launch replaces nothing).
        let mut grave: Option<Grave<StreamRef>> = None;
        let on = self.on;
        // A foreign stream's end mark follows the operation before it is recorded.
        on.after_enqueue();
        let id = on.record_id();
        for slot in self.held.as_mut().iter_mut() {
            if let Some(mut h) = slot.take() {
                fast::record_after_enqueue(
                    &mut h.guard,
                    h.published,
                    id,
                    h.access,
                    |_| on.to_ref(),
                    &mut grave,
                );
            }
        }
        drop(grave);
    }
}

/// A claim on one buffer held exclusively (`&mut`): no other reference to its tracker
/// exists, so no lock is needed; otherwise the same as [`claim`].
#[must_use = "hold the claim until the operation is enqueued"]
pub(crate) struct ExclusiveClaim<'t, 's> {
    state: &'t mut AccessState<StreamRef>,
    published: &'t mut Published,
    access: Access,
    on: StreamSlot<'s>,
}

/// Claims `tracker` (held exclusively) for a use of kind `access` on `on`, whose context
/// is current or which is a gpubind stream.
///
/// Always inlined, like its callers down to the operation: on the usual path (a stream
/// reusing a buffer it alone holds) it is two compares, and a call returning the claim
/// through memory would cost more than the claim itself. The waits are out of line.
#[inline(always)]
pub(crate) fn claim_exclusive<'t, 's>(
    on: StreamSlot<'s>,
    tracker: &'t mut AccessTracker,
    access: Access,
) -> Result<ExclusiveClaim<'t, 's>> {
    let AccessTracker { state, published } = tracker;
    let state = match state.get_mut() {
        Ok(st) => st,
        Err(poisoned) => poisoned.into_inner(),
    };
    if !state.is_ordered_on(on.id(), access) {
        // What is published stays true until the commit (the waits change no list),
        // which publishes anew; held `&mut`, no fast path can be using it meanwhile.
        wait_exclusive(state, on, access)?;
    }
    Ok(ExclusiveClaim {
        state,
        published,
        access,
        on,
    })
}

/// Orders `on` after the uses of an exclusively held tracker that conflict with a use of
/// kind `access` (a hand-off): out of line, so [`claim_exclusive`] stays small.
#[inline(never)]
fn wait_exclusive(
    state: &AccessState<StreamRef>,
    on: StreamSlot<'_>,
    access: Access,
) -> Result<()> {
    state.wait_conflicts(on.id(), access, |from| from.enqueue_wait(on.raw()))
}

impl Drop for ExclusiveClaim<'_, '_> {
    /// Inlined: the usual drop (a stream reusing a buffer it alone holds) is one compare.
    #[inline]
    fn drop(&mut self) {
        // A foreign stream's claim id equals no recorded id, so it always commits (and
        // records its end mark there).
        let claimed = self.on.id();
        if !self.state.commit_is_noop(claimed, self.access) {
            if claimed & FOREIGN_CLAIM != 0 {
                self.commit_foreign();
            } else {
                self.commit(claimed);
            }
        }
    }
}

impl ExclusiveClaim<'_, '_> {
    /// Records the use, when that changes the state (out of the inlined drop).
    #[cold]
    #[inline(never)]
    fn commit(&mut self, id: u64) {
        let on = self.on;
        // The usual change, a hand-off, replaces one stream: no grave to build and drop.
        if self.access == Access::Write
            && let Some(old) = self.state.hand_off(id, || on.to_ref())
        {
            // Held `&mut`: publishes what is true now, replacing anything.
            self.published.reset_mut(self.state, Some(id));
            // Only now, the state consistent, may the replaced stream go (dropping the
            // last reference destroys a stream).
            drop(old);
            return;
        }
        self.commit_with_grave();
    }

    /// [`commit`](Self::commit) of a use on a foreign stream (every one: its claim id
    /// equals no recorded id), after recording the stream's end mark there — before the
    /// use is recorded, and the tracker is held `&mut` until this returns.
    #[cold]
    #[inline(never)]
    fn commit_foreign(&mut self) {
        self.on.after_enqueue();
        self.commit(self.on.record_id());
    }

    /// [`commit`](Self::commit) of any other change, which may replace several streams.
    #[inline(never)]
    fn commit_with_grave(&mut self) {
        let on = self.on;
        let mut grave = Grave::new();
        self.state.commit(
            &[(on.record_id(), self.access)],
            |_| on.to_ref(),
            &mut grave,
        );
        // Held `&mut`: publishes what is true now, replacing anything.
        self.published.reset_mut(self.state, Some(on.record_id()));
        // Only now, the state consistent, may the replaced streams go.
        drop(grave);
    }
}

/// Claims `uses` for a host access or a synchronous call: locks the trackers, waits on the
/// host for every conflicting use and forgets it. The locks are held until the returned
/// value drops, so no stream-ordered use can start while the synchronous copy runs.
pub(crate) fn host_claim<'t, H: AsMut<[Option<Held<'t>>]>>(
    uses: &mut [Use<'t>],
    mut held: H,
) -> Result<H> {
    lock_all(uses, held.as_mut());
    let mut grave = Grave::new();
    for h in held.as_mut().iter_mut().flatten() {
        fast::host_wait_published(
            &mut h.guard,
            h.published,
            h.access,
            StreamRef::synchronize,
            &mut grave,
        )?;
    }
    Ok(held)
}

/// One locked tracker of a lane claim, with its uses.
#[cfg(feature = "collective")]
type LaneHeld<'t> = (
    sync::MutexGuard<'t, AccessState<StreamRef>>,
    Vec<(StreamRef, Access)>,
);

/// A claim on buffers used on several streams (a collective's lanes, of any devices):
/// every use names its stream; each stream waits for the conflicts of its own uses.
#[cfg(feature = "collective")]
#[must_use = "hold the claim until the operation is enqueued"]
pub(crate) struct LaneClaim<'t> {
    /// `(tracker, its uses)`, locked, sorted by tracker address.
    held: Vec<LaneHeld<'t>>,
}

/// Claims each `(tracker, access, stream)`; the streams' contexts are pushed as needed.
#[cfg(feature = "collective")]
pub(crate) fn claim_lanes<'t>(
    mut uses: Vec<(&'t AccessTracker, Access, StreamRef)>,
) -> Result<LaneClaim<'t>> {
    uses.sort_by_key(|(t, _, _)| *t as *const AccessTracker as usize);
    let mut held: Vec<LaneHeld<'t>> = Vec::new();
    let mut last: Option<*const AccessTracker> = None;
    for (t, access, s) in uses {
        if last != Some(t as *const _) {
            let st = sync::lock(&t.state);
            // Before any event or commit; a lane claim publishes nothing (the next
            // single-stream use does).
            t.published.close_others(&st, fast::NONE);
            held.push((st, Vec::new()));
            last = Some(t as *const _);
        }
        if let Some((_, v)) = held.last_mut() {
            match v.iter_mut().find(|(x, _)| x.id() == s.id()) {
                Some((_, a)) => *a = a.max(access),
                None => v.push((s, access)),
            }
        }
    }
    for (st, v) in &held {
        if st.lends > 0 && v.iter().any(|(_, a)| *a == Access::Write) {
            return Err(lend::lent_error());
        }
    }
    for (st, v) in &held {
        for (s, access) in v {
            if st.is_ordered_on(s.id(), *access) {
                continue;
            }
            let _guard = s.device().enter()?;
            st.wait_conflicts(s.id(), *access, |from| from.enqueue_wait(s.raw()))?;
        }
    }
    Ok(LaneClaim { held })
}

#[cfg(feature = "collective")]
impl Drop for LaneClaim<'_> {
    fn drop(&mut self) {
        let mut grave = Grave::new();
        // Foreign streams' end marks follow the operation before it is recorded.
        for (_, v) in &self.held {
            v.iter().for_each(|(s, _)| s.after_enqueue());
        }
        for (mut st, v) in self.held.drain(..) {
            let ids: Vec<(u64, Access)> = v.iter().map(|(s, a)| (s.id(), *a)).collect();
            let make = |id: u64| {
                v.iter()
                    .find(|(s, _)| s.id() == id)
                    .map(|(s, _)| s.clone())
                    .unwrap_or_else(|| unreachable_stream(&v))
            };
            st.commit(&ids, make, &mut grave);
            drop(st);
        }
        drop(grave);
    }
}

/// `commit` only asks for ids it was given; this is never reached, and returns the first
/// stream rather than panicking in a `Drop`.
#[cfg(feature = "collective")]
fn unreachable_stream(v: &[(StreamRef, Access)]) -> StreamRef {
    v[0].0.clone()
}

#[cfg(test)]
mod tests;

/// Model checks of the claim protocol with loom (`.ci/run` runs them with
/// `RUSTFLAGS="--cfg loom"`): the production steps (`is_ordered_on`, `wait_conflicts`,
/// `commit`, `host_wait`) under the same lock, over mock streams that record what
/// happened on them.
#[cfg(all(test, loom))]
mod loom_models;
