//! The state machine of one allocation's pending uses ([`AccessState`]), generic over
//! the stream type so that unit tests and loom models drive it with mock streams.

use crate::error::Result;

use super::Access;
use super::streams::{StreamList, Streams};

/// A stream as the state machine sees it.
pub(crate) trait TrackedStream: Clone {
    /// Equal ids name the same stream (stream order holds between their uses).
    fn id(&self) -> u64;
    /// Whether everything enqueued on the stream so far has finished (`cuStreamQuery`);
    /// `false` when unknown. Used only to prune long reader lists.
    fn is_idle(&self) -> bool;
    /// Runs `f` holding the stream's gate, which every fast-path operation on the
    /// stream holds across its enqueue ([`super::fast`]).
    fn under_gate(&self, f: impl FnOnce());
}

/// Above this many reader streams, a new reader first drops the idle ones.
pub(super) const PRUNE_READERS_AT: usize = 8;

/// The pending uses of one allocation.
///
/// Invariant: every stream-ordered use of the allocation that is not known complete was
/// enqueued on one of the `writers` or `readers` streams (or on a stream that was made to
/// wait for it before it was forgotten), before the tracker's lock was released; every
/// read recorded in `readers` is ordered after every use recorded in `writers`.
///
/// `sole` caches the one case every hot path asks about: it is the id of the only pending
/// use when that is a write (`writers == [s]`, no readers), else [`NO_SOLE`]. A stream
/// reusing a buffer it alone holds then compares one word of the tracker, instead of
/// reading the writer list's heap block and the writer stream's id behind it (two
/// dependent loads that a driver call in between tends to evict from the cache). Every
/// method that changes `writers` or `readers` ends with [`refresh`](Self::refresh).
#[derive(Debug)]
pub(crate) struct AccessState<S> {
    sole: u64,
    pub(super) writers: Streams<S>,
    pub(super) readers: Vec<S>,
    /// Open reads ([`super::lend`]): reads recorded at their start whose work outside
    /// gpubind's streams is ordered only at their end. While any is open, writes are
    /// refused and none is admitted without the lock.
    pub(super) lends: u32,
}

/// [`AccessState::sole`] when the pending uses are not one write: no stream id (gpubind
/// stream ids count up from 1; the legacy streams' are `LEGACY_ID | ordinal`).
const NO_SOLE: u64 = u64::MAX;

impl<S> Default for AccessState<S> {
    fn default() -> Self {
        AccessState {
            sole: NO_SOLE,
            writers: Streams::default(),
            readers: Vec::new(),
            lends: 0,
        }
    }
}

impl<S: TrackedStream> AccessState<S> {
    /// A state whose one pending use is a write on `on` (what a commit of that write into
    /// an idle state makes, built directly: a stream-ordered allocation's tracker).
    pub(crate) fn written_by(on: S) -> Self {
        let id = on.id();
        Self::written_by_id(on, id)
    }

    /// [`written_by`](Self::written_by) with `on`'s id (`id == on.id()`) at hand.
    #[inline(always)]
    pub(crate) fn written_by_id(on: S, id: u64) -> Self {
        debug_assert_eq!(id, on.id());
        AccessState {
            sole: id,
            writers: Streams::one(on),
            readers: Vec::new(),
            lends: 0,
        }
    }

    /// A state with these pending uses (tests and models build states directly).
    #[cfg(test)]
    pub(super) fn with_uses(writers: impl Into<Streams<S>>, readers: Vec<S>) -> Self {
        let mut st = AccessState {
            sole: NO_SOLE,
            writers: writers.into(),
            readers,
            lends: 0,
        };
        st.refresh();
        st
    }

    /// What `sole` must be, from the lists.
    #[inline]
    fn sole_from_lists(&self) -> u64 {
        match &self.writers[..] {
            [w] if self.readers.is_empty() => w.id(),
            _ => NO_SOLE,
        }
    }

    /// Recomputes `sole` after `writers` or `readers` changed.
    #[inline]
    pub(super) fn refresh(&mut self) {
        self.sole = self.sole_from_lists();
    }

    /// Whether `on` holds the only pending use, a write (the cached fast path).
    #[inline(always)]
    fn is_sole_writer(&self, on: u64) -> bool {
        debug_assert_eq!(
            self.sole,
            self.sole_from_lists(),
            "AccessState::sole is stale"
        );
        self.sole == on
    }

    /// Whether a use of kind `access` on stream `on` conflicts with nothing on another
    /// stream: the fast path, where no wait is needed.
    #[inline]
    pub(crate) fn is_ordered_on(&self, on: u64, access: Access) -> bool {
        if self.is_sole_writer(on) {
            return true;
        }
        if self.sole != NO_SOLE {
            // One write pending, on another stream (a hand-off): answered by the cache.
            return false;
        }
        self.writers.iter().all(|w| w.id() == on)
            && (access == Access::Read || self.readers.iter().all(|r| r.id() == on))
    }

    /// Whether a write on `on` needs no wait and records nothing (what the fast path's
    /// published `write` id promises); never while a read is open ([`super::lend`]).
    #[inline]
    pub(crate) fn write_is_free(&self, on: u64) -> bool {
        self.lends == 0 && self.is_sole_writer(on)
    }

    /// Whether a read on `on` needs no wait and records nothing (what the fast path's
    /// published `read` id promises).
    #[inline]
    pub(crate) fn read_is_free(&self, on: u64) -> bool {
        self.is_ordered_on(on, Access::Read) && self.commit_is_noop(on, Access::Read)
    }

    /// Whether recording a read of a stream not yet recorded may drop idle readers
    /// (which [`commit`](Self::commit) does when the reader list is long).
    #[inline]
    pub(crate) fn read_may_prune(&self) -> bool {
        self.readers.len() >= PRUNE_READERS_AT
    }

    /// The recorded stream of id `id`, if any.
    pub(crate) fn find(&self, id: u64) -> Option<&S> {
        self.writers
            .iter()
            .chain(&self.readers)
            .find(|s| s.id() == id)
    }

    /// Whether recording one use of kind `access` on `on` would change nothing: the
    /// stream is already the only writer (a write), or already recorded (a read). The
    /// fast path of every commit: a stream reusing a buffer touches no reference count.
    #[inline]
    pub(crate) fn commit_is_noop(&self, on: u64, access: Access) -> bool {
        if self.is_sole_writer(on) {
            return true;
        }
        if self.sole != NO_SOLE {
            // One write pending, on another stream: either use changes the lists.
            return false;
        }
        match access {
            Access::Write => {
                self.readers.is_empty() && self.writers.len() == 1 && self.writers[0].id() == on
            }
            Access::Read => {
                self.writers.iter().any(|w| w.id() == on)
                    || self.readers.iter().any(|r| r.id() == on)
            }
        }
    }

    /// Calls `wait(from)` for every stream whose pending use conflicts with a use of kind
    /// `access` on `on` (the write streams; for a write, the read streams too).
    #[inline]
    pub(crate) fn wait_conflicts(
        &self,
        on: u64,
        access: Access,
        mut wait: impl FnMut(&S) -> Result<()>,
    ) -> Result<()> {
        if self.sole != NO_SOLE {
            // One write pending and no reads (the cache): the writer is the only stream
            // that can conflict (a hand-off's one wait, without walking the lists).
            return match self.writers.first() {
                Some(w) if w.id() != on => wait(w),
                _ => Ok(()),
            };
        }
        for w in self.writers.iter().filter(|w| w.id() != on) {
            wait(w)?;
        }
        if access == Access::Write {
            for r in self.readers.iter().filter(|r| r.id() != on) {
                wait(r)?;
            }
        }
        Ok(())
    }

    /// Records the uses of one claim (all enqueued, after their conflicts), moving what
    /// they replace into `grave` (dropped by the caller after unlocking: dropping a
    /// stream may destroy it). Writes replace every earlier use; reads are added.
    pub(crate) fn commit(
        &mut self,
        uses: &[(u64, Access)],
        make: impl Fn(u64) -> S,
        grave: &mut Grave<S>,
    ) {
        if let [(id, Access::Write)] = uses
            && let Some(old) = self.hand_off(*id, || make(*id))
        {
            grave.push(old);
            return;
        }
        self.commit_general(uses, make, grave);
    }

    /// [`commit`](Self::commit) of one write on `on` when that is a hand-off: one write
    /// pending, on another stream, and no reads. The same outcome as the general commit
    /// (the write replaces the old writer), swapped in place; returns the old writer's
    /// stream, to drop after unlocking. `None`, changing nothing, in every other case.
    #[inline]
    pub(crate) fn hand_off(&mut self, on: u64, make: impl FnOnce() -> S) -> Option<S> {
        if self.readers.is_empty()
            && let [w] = &mut self.writers[..]
            && w.id() != on
        {
            let old = std::mem::replace(w, make());
            self.sole = on;
            return Some(old);
        }
        None
    }

    /// [`commit`](Self::commit) without its hand-off fast path.
    pub(super) fn commit_general(
        &mut self,
        uses: &[(u64, Access)],
        make: impl Fn(u64) -> S,
        grave: &mut Grave<S>,
    ) {
        self.commit_lists(uses, make, grave);
        self.refresh();
    }

    /// The list changes of [`commit_general`](Self::commit_general).
    fn commit_lists(
        &mut self,
        uses: &[(u64, Access)],
        make: impl Fn(u64) -> S,
        grave: &mut Grave<S>,
    ) {
        let writes = uses.iter().filter(|(_, a)| *a == Access::Write);
        if writes.clone().next().is_some() {
            let unchanged = self.readers.is_empty()
                && self.writers.len() == writes.clone().count()
                && writes
                    .clone()
                    .all(|(id, _)| self.writers.iter().any(|w| w.id() == *id))
                && uses.iter().all(|(_, a)| *a == Access::Write);
            if !unchanged {
                grave.take_all(&mut self.writers);
                grave.take_all(&mut self.readers);
                for (id, _) in writes {
                    if !self.writers.iter().any(|w| w.id() == *id) {
                        self.writers.push(make(*id));
                    }
                }
                for (id, _) in uses.iter().filter(|(_, a)| *a == Access::Read) {
                    if !self.writers.iter().any(|w| w.id() == *id)
                        && !self.readers.iter().any(|r| r.id() == *id)
                    {
                        self.readers.push(make(*id));
                    }
                }
            }
            return;
        }
        for (id, _) in uses {
            let ordered = self.writers.iter().any(|w| w.id() == *id)
                || self.readers.iter().any(|r| r.id() == *id);
            if ordered {
                continue;
            }
            if self.read_may_prune() {
                let (idle, busy): (Vec<S>, Vec<S>) = std::mem::take(&mut self.readers)
                    .into_iter()
                    .partition(S::is_idle);
                self.readers = busy;
                for s in idle {
                    grave.push(s);
                }
            }
            self.readers.push(make(*id));
        }
    }

    /// Synchronises (on the host) every stream whose pending use conflicts with a host
    /// access of kind `access`, then forgets those uses. On the first failure nothing is
    /// forgotten. Runs under the tracker's lock.
    pub(crate) fn host_wait(
        &mut self,
        access: Access,
        mut synchronize: impl FnMut(&S) -> Result<()>,
        grave: &mut Grave<S>,
    ) -> Result<()> {
        for w in &self.writers {
            synchronize(w)?;
        }
        if access == Access::Write {
            for r in &self.readers {
                synchronize(r)?;
            }
            grave.take_all(&mut self.readers);
        }
        grave.take_all(&mut self.writers);
        self.refresh();
        Ok(())
    }

    /// Synchronises every pending use, all of them even if one fails; forgets them only if
    /// every one succeeded, and returns the first error — but a failure that does not
    /// mean "poisoned" ([`crate::teardown::faults::nothing_runs_after`]) wins over one that does.
    pub(crate) fn wait_all(&mut self, mut synchronize: impl FnMut(&S) -> Result<()>) -> Result<()> {
        let mut first: Result<()> = Ok(());
        for s in self.writers.iter().chain(&self.readers) {
            if let Err(e) = synchronize(s) {
                // Keep the first error, unless it says "poisoned" and this one does not:
                // callers release after a poisoned context's failure (it runs nothing
                // more), so any other failure must win.
                let replace = match &first {
                    Ok(()) => true,
                    Err(f) => {
                        crate::teardown::faults::nothing_runs_after(f)
                            && !crate::teardown::faults::nothing_runs_after(&e)
                    }
                };
                if replace {
                    first = Err(e);
                }
            }
        }
        if first.is_ok() {
            self.writers.clear();
            self.readers.clear();
            self.refresh();
        }
        first
    }

    /// Every pending read becomes a pending write (see
    /// [`AccessTracker::reads_become_writes`]).
    pub(crate) fn reads_become_writes(&mut self) {
        for r in self.readers.drain(..) {
            if !self.writers.iter().any(|w| w.id() == r.id()) {
                self.writers.push(r);
            }
        }
        self.refresh();
    }

    /// Whether no use is pending.
    pub(crate) fn is_idle(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }

    #[cfg(test)]
    pub(super) fn ids(v: &[S]) -> Vec<u64> {
        v.iter().map(TrackedStream::id).collect()
    }
}

/// What a commit or a host wait replaces: streams to let go of once the tracker is
/// unlocked (dropping the last reference to a stream destroys it, a driver call that
/// should not run under the lock). Inline for the usual one or two (a hand-off replaces
/// one writer), so the hot path allocates nothing.
pub(crate) struct Grave<S> {
    inline: [Option<S>; 2],
    spill: Vec<S>,
}

impl<S> Grave<S> {
    pub(crate) fn new() -> Self {
        Grave {
            inline: [None, None],
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, s: S) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(s),
            None => self.spill.push(s),
        }
    }

    /// Moves every element of `v` here, keeping `v`'s capacity for what replaces them.
    pub(crate) fn take_all(&mut self, v: &mut impl StreamList<S>) {
        v.take_each(|s| self.push(s));
    }
}
