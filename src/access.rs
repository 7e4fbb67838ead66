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
//! * **host** access and the synchronous calls claim the buffer too: they wait on the host
//!   (`cuStreamSynchronize`) for the conflicting streams, forget those uses, and hold the
//!   lock until their own copy has finished;
//! * **dropping** the allocation waits for every pending use before the memory is freed.
//!
//! The state machine ([`AccessState`]) and the steps taken under the lock are generic over
//! the stream type, so the loom models run the same code with mock streams.

use crate::device::Device;
use crate::driver::Check;
use crate::drop_wait::{GaveUp, Polled, drop_timeout, poll_until_idle};
use crate::error::{Error, Result};
use crate::sync;
use cudarc::driver::sys;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// A stream as the state machine sees it.
pub(crate) trait TrackedStream: Clone {
    /// Equal ids name the same stream (stream order holds between their uses).
    fn id(&self) -> u64;
    /// Whether everything enqueued on the stream so far has finished (`cuStreamQuery`);
    /// `false` when unknown. Used only to prune long reader lists.
    fn is_idle(&self) -> bool;
}

/// Above this many reader streams, a new reader first drops the idle ones.
const PRUNE_READERS_AT: usize = 8;

/// The pending uses of one allocation.
///
/// Invariant: every stream-ordered use of the allocation that is not known complete was
/// enqueued on one of the `writers` or `readers` streams (or on a stream that was made to
/// wait for it before it was forgotten), before the tracker's lock was released; every
/// read recorded in `readers` is ordered after every use recorded in `writers`.
#[derive(Debug)]
pub(crate) struct AccessState<S> {
    writers: Vec<S>,
    readers: Vec<S>,
}

impl<S> Default for AccessState<S> {
    fn default() -> Self {
        AccessState {
            writers: Vec::new(),
            readers: Vec::new(),
        }
    }
}

impl<S: TrackedStream> AccessState<S> {
    /// Whether a use of kind `access` on stream `on` conflicts with nothing on another
    /// stream: the fast path, where no wait is needed.
    pub(crate) fn is_ordered_on(&self, on: u64, access: Access) -> bool {
        self.writers.iter().all(|w| w.id() == on)
            && (access == Access::Read || self.readers.iter().all(|r| r.id() == on))
    }

    /// Whether recording one use of kind `access` on `on` would change nothing: the
    /// stream is already the only writer (a write), or already recorded (a read). The
    /// fast path of every commit: a stream reusing a buffer touches no reference count.
    #[inline]
    pub(crate) fn commit_is_noop(&self, on: u64, access: Access) -> bool {
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
    pub(crate) fn wait_conflicts(
        &self,
        on: u64,
        access: Access,
        mut wait: impl FnMut(&S) -> Result<()>,
    ) -> Result<()> {
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
        // The hand-off: one write on another stream than the one writer, no readers. The
        // same outcome as below (the write replaces the old writer), swapped in place.
        if let [(id, Access::Write)] = uses
            && self.readers.is_empty()
            && let [w] = self.writers.as_mut_slice()
            && w.id() != *id
        {
            grave.push(std::mem::replace(w, make(*id)));
            return;
        }
        self.commit_general(uses, make, grave);
    }

    /// [`commit`](Self::commit) without its hand-off fast path.
    fn commit_general(
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
            if self.readers.len() >= PRUNE_READERS_AT {
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
        Ok(())
    }

    /// Synchronises every pending use, all of them even if one fails; forgets them only if
    /// every one succeeded, and returns the first error — but a failure that does not
    /// mean "poisoned" ([`crate::faults::nothing_runs_after`]) wins over one that does.
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
                        crate::faults::nothing_runs_after(f)
                            && !crate::faults::nothing_runs_after(&e)
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
    }

    /// Whether no use is pending.
    pub(crate) fn is_idle(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }

    #[cfg(test)]
    fn ids(v: &[S]) -> Vec<u64> {
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
    pub(crate) fn take_all(&mut self, v: &mut Vec<S>) {
        for s in v.drain(..) {
            self.push(s);
        }
    }
}

/// The stream behind a [`Stream`](crate::Stream): destroyed when the last holder (the
/// `Stream`, or a tracker that still orders work after it) lets go.
pub(crate) struct StreamInner {
    pub(crate) device: Arc<Device>,
    pub(crate) raw: sys::CUstream,
    pub(crate) id: u64,
    /// The event this stream's hand-offs record (created at the first one): see
    /// [`StreamInner::enqueue_wait`].
    handoff: std::sync::OnceLock<HandoffEvent>,
    /// Set for a stream shared with cudarc ([`crate::interop`]): cudarc owns the handle
    /// and destroys it when the last `Arc<CudaStream>` goes; this keeps it alive while
    /// gpubind (a `Stream`, or a tracker ordering work after it) still needs it.
    pub(crate) cudarc: Option<Arc<cudarc::driver::CudaStream>>,
}

/// A `CU_EVENT_DISABLE_TIMING` event of a stream's context, only ever recorded on that
/// stream.
struct HandoffEvent(sys::CUevent);

// SAFETY: an event handle is a thread-agnostic identifier; the driver serialises calls on
// it.
unsafe impl Send for HandoffEvent {}
// SAFETY: as above; concurrent records on the one stream are harmless (see enqueue_wait).
unsafe impl Sync for HandoffEvent {}

// SAFETY: a CUstream handle is a thread-agnostic identifier; gpubind enqueues on it only
// with its device's context current (through a BoundStream, or a ContextGuard).
unsafe impl Send for StreamInner {}
// SAFETY: the driver serialises concurrent calls on one stream.
unsafe impl Sync for StreamInner {}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Ids of legacy default streams: one per device ordinal, never equal to a counter id.
pub(crate) const LEGACY_ID: u64 = 1 << 63;

impl StreamInner {
    pub(crate) fn new(device: Arc<Device>, raw: sys::CUstream) -> StreamInner {
        StreamInner {
            device,
            raw,
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            handoff: std::sync::OnceLock::new(),
            cudarc: None,
        }
    }

    /// A stream created and owned by cudarc, shared with gpubind: never destroyed here.
    pub(crate) fn shared(device: Arc<Device>, stream: Arc<cudarc::driver::CudaStream>) -> Self {
        StreamInner {
            device,
            raw: stream.cu_stream(),
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            handoff: std::sync::OnceLock::new(),
            cudarc: Some(stream),
        }
    }

    /// This stream's hand-off event, created in its context at the first use.
    fn handoff_event(&self) -> Result<sys::CUevent> {
        if let Some(e) = self.handoff.get() {
            return Ok(e.0);
        }
        let created = self.device.new_handoff_event()?;
        if let Err(lost) = self.handoff.set(HandoffEvent(created)) {
            // Another thread created one first: keep theirs.
            destroy_event(&self.device, lost.0);
        }
        Ok(self.handoff.get().map_or(created, |e| e.0))
    }

    /// Makes `to` wait on the device for the work enqueued on this stream so far, with an
    /// event recorded on this stream (no lock, no context switch: the driver runs work on
    /// a stream in the stream's own context, whatever is current; asserted on the GPU by
    /// `gpu_binding::stream_ops_with_a_foreign_context_current`).
    ///
    /// The one event may be recorded by several threads at once. `cuStreamWaitEvent`
    /// captures the event's most recent record at the call, which on this thread is at or
    /// after its own record (records are calls on this stream, in the order they are
    /// made): `to` may wait for *more* of this stream than it needed, never less. And it
    /// cannot wait for work that waits on `to` later: whatever this stream had enqueued
    /// before that record was enqueued before the wait was.
    fn enqueue_wait(&self, to: sys::CUstream) -> Result<()> {
        self.device.check_poison()?;
        let event = self.handoff_event()?;
        // SAFETY: `event` belongs to this stream's context; the stream lives (borrowed).
        unsafe { sys::cuEventRecord(event, self.raw) }.check_on(&self.device, "cuEventRecord")?;
        // SAFETY: `to` is a live stream of the current context (or a gpubind stream); the
        // event may belong to another context, which CUDA allows.
        unsafe { sys::cuStreamWaitEvent(to, event, 0) }.check("cuStreamWaitEvent")
    }
}

/// Destroys an event of `device`'s context (a drop: failures are logged).
fn destroy_event(device: &Arc<Device>, event: sys::CUevent) {
    crate::faults::release(
        format_args!("a stream's hand-off event"),
        device,
        Ok(()),
        "cuEventDestroy_v2",
        // SAFETY: created by cuEventCreate in this context (current while this runs),
        // destroyed once, here; the driver releases it once pending records complete.
        || unsafe { sys::cuEventDestroy_v2(event) },
    );
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if let Some(stream) = self.cudarc.take() {
            // Its hand-off event is ours; the stream is cudarc's: let go of our reference
            // (cudarc destroys the stream with its last one), leaving the thread's
            // current context as it was.
            if let Some(event) = self.handoff.take() {
                destroy_event(&self.device, event.0);
            }
            crate::interop::drop_in_context(
                format_args!("a Stream shared with cudarc"),
                &self.device,
                stream,
            );
            return;
        }
        let raw = self.raw;
        match self.device.enter() {
            Ok(_guard) => GaveUp::forget_stream(self.id, true),
            Err(_) => GaveUp::forget_stream(self.id, false),
        }
        crate::faults::release(
            format_args!("a Stream"),
            &self.device,
            Ok(()),
            "cuStreamDestroy_v2",
            || {
                // SAFETY: created by cuStreamCreate in this context (current while this
                // runs), destroyed once, here. Pending work completes before the driver
                // releases the stream.
                unsafe { sys::cuStreamDestroy_v2(raw) }
            },
        );
        if let Some(event) = self.handoff.take() {
            destroy_event(&self.device, event.0);
        }
    }
}

/// A stream a tracker remembers: keeps it (and its context) alive until the use is known
/// complete.
#[derive(Clone)]
pub(crate) enum StreamRef {
    /// The legacy default stream of this device's primary context.
    Legacy(Arc<Device>),
    /// A stream gpubind created.
    Owned(Arc<StreamInner>),
}

impl TrackedStream for StreamRef {
    fn id(&self) -> u64 {
        self.slot().id()
    }

    fn is_idle(&self) -> bool {
        let Ok(_guard) = self.device().enter() else {
            return false;
        };
        // SAFETY: the stream is alive (held by self); its context is current.
        (unsafe { sys::cuStreamQuery(self.raw()) }) == sys::CUresult::CUDA_SUCCESS
    }
}

impl StreamRef {
    /// The borrowed form.
    pub(crate) fn slot(&self) -> StreamSlot<'_> {
        match self {
            StreamRef::Legacy(d) => StreamSlot::Legacy(d),
            StreamRef::Owned(s) => StreamSlot::Owned(s),
        }
    }

    fn device(&self) -> &Arc<Device> {
        self.slot().device()
    }

    fn raw(&self) -> sys::CUstream {
        self.slot().raw()
    }

    /// Blocks until the work enqueued on this stream so far has finished.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let _guard = self.device().enter()?;
        // SAFETY: the stream is alive (held by self) and its context is current for the
        // call (the null stream resolves to that context's legacy stream).
        unsafe { sys::cuStreamSynchronize(self.raw()) }
            .check_on(self.device(), "cuStreamSynchronize")
    }

    /// [`synchronize`](Self::synchronize), giving up at `deadline` (`None`: never) with
    /// [`Error::Timeout`].
    ///
    /// One limit per stream, not per buffer: once a wait on this stream has given up, later
    /// waits on it give up at once for as long as the work it gave up on still runs (an
    /// event recorded at that moment says; so a hundred buffers last used by one kernel
    /// that never ends cost one timeout, not a hundred), and get the full limit again
    /// once that work has finished.
    pub(crate) fn synchronize_within(
        &self,
        deadline: Option<Instant>,
        limit: Duration,
    ) -> Result<()> {
        let id = self.id();
        let _guard = self.device().enter()?;
        if GaveUp::still_busy(id) {
            return Err(Error::Timeout {
                what: "a buffer's pending GPU work to finish before freeing it \
                       (GPUBIND_DROP_TIMEOUT; an earlier wait on the same stream gave up on \
                       work that still runs, so this one did not wait again)",
                after_ms: 0,
            });
        }
        let polled = poll_until_idle(
            || {
                // SAFETY: the stream is alive (held by self) and its context is current.
                unsafe { sys::cuStreamQuery(self.raw()) }
            },
            deadline,
            limit,
        );
        match polled {
            Ok(()) => Ok(()),
            Err(Polled::Failed(code)) => Err(code
                .check_on(self.device(), "cuStreamQuery")
                .err()
                .unwrap_or_else(|| Error::driver("cuStreamQuery", code))),
            Err(Polled::TimedOut(after_ms)) => {
                GaveUp::remember(id, self.raw());
                Err(Error::Timeout {
                    what: "a buffer's pending GPU work to finish before freeing it \
                           (GPUBIND_DROP_TIMEOUT)",
                    after_ms,
                })
            }
        }
    }

    /// Makes `to` wait on the device for the work enqueued on `self` so far. `to`'s
    /// context must be current (or `to` must be a non-null stream).
    fn enqueue_wait(&self, to: sys::CUstream) -> Result<()> {
        let device = match self {
            StreamRef::Owned(s) => return s.enqueue_wait(to),
            StreamRef::Legacy(device) => device,
        };
        let event = device.take_event()?;
        let recorded = {
            let _guard = device.enter()?;
            // SAFETY: `event` and the stream belong to `device`'s context, current here.
            unsafe { sys::cuEventRecord(event.0, self.raw()) }.check_on(device, "cuEventRecord")
        };
        let waited = recorded.and_then(|()| {
            // SAFETY: `to` is a live stream of the current context; the event may belong
            // to another context, which CUDA allows.
            unsafe { sys::cuStreamWaitEvent(to, event.0, 0) }.check("cuStreamWaitEvent")
        });
        // The wait captured the event's state: it may be recorded again at once.
        device.return_event(event);
        waited
    }
}

/// A stream borrowed for one operation (no reference count touched on the fast path).
#[derive(Clone, Copy)]
pub(crate) enum StreamSlot<'a> {
    /// The legacy default stream of this device.
    Legacy(&'a Arc<Device>),
    /// A gpubind stream.
    Owned(&'a Arc<StreamInner>),
}

impl<'a> StreamSlot<'a> {
    pub(crate) fn id(self) -> u64 {
        match self {
            StreamSlot::Legacy(d) => LEGACY_ID | d.ordinal() as u64,
            StreamSlot::Owned(s) => s.id,
        }
    }

    pub(crate) fn raw(self) -> sys::CUstream {
        match self {
            StreamSlot::Legacy(_) => std::ptr::null_mut(),
            StreamSlot::Owned(s) => s.raw,
        }
    }

    fn device(self) -> &'a Arc<Device> {
        match self {
            StreamSlot::Legacy(d) => d,
            StreamSlot::Owned(s) => &s.device,
        }
    }

    pub(crate) fn to_ref(self) -> StreamRef {
        match self {
            StreamSlot::Legacy(d) => StreamRef::Legacy(Arc::clone(d)),
            StreamSlot::Owned(s) => StreamRef::Owned(Arc::clone(s)),
        }
    }
}

/// The pending stream-ordered uses of one allocation; see the [module docs](self).
///
/// Public only as an unnameable type of hidden trait methods; nothing outside gpubind
/// can construct a meaningful one or inspect it.
pub struct AccessTracker {
    state: sync::Mutex<AccessState<StreamRef>>,
}

impl Default for AccessTracker {
    fn default() -> Self {
        AccessTracker {
            state: sync::Mutex::new(AccessState::default()),
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
        let mut state = AccessState::default();
        let mut grave = Grave::new();
        state.commit(&[(on.id(), Access::Write)], |_| on.clone(), &mut grave);
        AccessTracker {
            state: sync::Mutex::new(state),
        }
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
            return Ok(());
        }
        let limit = drop_timeout();
        let deadline = Instant::now().checked_add(limit);
        st.wait_all(|s| s.synchronize_within(deadline, limit))
    }

    /// Records a read on `on` that needs no ordering before it (the tracker has no
    /// writes: the launches of a module without global views) and no claim across its
    /// enqueue (what it guards — the module's unload — cannot happen while the launch
    /// borrows the module). Inlined: the usual case is a lock, a compare and an unlock.
    #[inline]
    pub(crate) fn note_read(&self, on: StreamSlot<'_>) {
        let id = on.id();
        let st = sync::lock(&self.state);
        // The usual case, a launch on a stream already recorded: nothing changes.
        if st.commit_is_noop(id, Access::Read) {
            return;
        }
        Self::note_new_read(st, on);
    }

    /// [`note_read`](Self::note_read) for a stream not recorded yet.
    #[cold]
    #[inline(never)]
    fn note_new_read(mut st: sync::MutexGuard<'_, AccessState<StreamRef>>, on: StreamSlot<'_>) {
        let id = on.id();
        let mut grave = Grave::new();
        st.commit(&[(id, Access::Read)], |_| on.to_ref(), &mut grave);
        drop(st);
        drop(grave);
    }

    /// Turns every pending read into a pending write (a module's launches, once it has
    /// global views: what they wrote must be waited for by later reads too). The
    /// invariant holds: writes have no ordering among themselves to keep, and the reads
    /// were ordered after the old writes, which stay.
    pub(crate) fn reads_become_writes(&self) {
        sync::lock(&self.state).reads_become_writes();
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
        let mut grave = Grave::new();
        let out = st.host_wait(access, StreamRef::synchronize, &mut grave);
        drop(grave);
        out
    }

    pub(crate) fn host_access(&self, access: Access) -> Result<()> {
        let mut grave = Grave::new();
        let out = {
            let mut st = sync::lock(&self.state);
            st.host_wait(access, StreamRef::synchronize, &mut grave)
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
        if !h.guard.is_ordered_on(id, h.access) {
            h.guard
                .wait_conflicts(id, h.access, |from| from.enqueue_wait(on.raw()))?;
        }
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
        let id = on.id();
        for slot in self.held.as_mut().iter_mut() {
            if let Some(mut h) = slot.take()
                && !h.guard.commit_is_noop(id, h.access)
            {
                let grave = grave.get_or_insert_with(Grave::new);
                h.guard.commit(&[(id, h.access)], |_| on.to_ref(), grave);
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
    access: Access,
    on: StreamSlot<'s>,
}

/// Claims `tracker` (held exclusively) for a use of kind `access` on `on`, whose context
/// is current or which is a gpubind stream.
pub(crate) fn claim_exclusive<'t, 's>(
    on: StreamSlot<'s>,
    tracker: &'t mut AccessTracker,
    access: Access,
) -> Result<ExclusiveClaim<'t, 's>> {
    let state = match tracker.state.get_mut() {
        Ok(st) => st,
        Err(poisoned) => poisoned.into_inner(),
    };
    let id = on.id();
    if !state.is_ordered_on(id, access) {
        state.wait_conflicts(id, access, |from| from.enqueue_wait(on.raw()))?;
    }
    Ok(ExclusiveClaim { state, access, on })
}

impl Drop for ExclusiveClaim<'_, '_> {
    fn drop(&mut self) {
        let on = self.on;
        if self.state.commit_is_noop(on.id(), self.access) {
            return;
        }
        let mut grave = Grave::new();
        self.state
            .commit(&[(on.id(), self.access)], |_| on.to_ref(), &mut grave);
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
        let access = h.access;
        h.guard
            .host_wait(access, StreamRef::synchronize, &mut grave)?;
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
            held.push((sync::lock(&t.state), Vec::new()));
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

/// A pooled `CUevent` (timing disabled) of one device's primary context.
pub(crate) struct PooledEvent(pub(crate) sys::CUevent);

// SAFETY: an event handle is a thread-agnostic identifier; it is used only with its
// device's context current.
unsafe impl Send for PooledEvent {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct S(u64);
    impl TrackedStream for S {
        fn id(&self) -> u64 {
            self.0
        }
        fn is_idle(&self) -> bool {
            self.0 >= 100
        }
    }

    fn commit1(st: &mut AccessState<S>, id: u64, a: Access) {
        let mut grave = Grave::new();
        st.commit(&[(id, a)], S, &mut grave);
    }

    /// The commit fast path agrees with `commit`: whenever it says "no change", a commit
    /// changes nothing, and it says so for a stream reusing a buffer it alone holds. Every
    /// state reachable in up to four commits over three streams (plus the idle 100s that
    /// pruning drops) is checked against every next use.
    #[test]
    fn commit_fast_path_agrees_with_commit() {
        let uses: Vec<(u64, Access)> = [1, 2, 3]
            .into_iter()
            .flat_map(|id| [(id, Access::Read), (id, Access::Write)])
            .collect();
        let mut states = vec![AccessState::<S>::default()];
        let mut fast = 0;
        for _ in 0..4 {
            let mut next = Vec::new();
            for st in &states {
                for &(id, a) in &uses {
                    let mut after = AccessState {
                        writers: st.writers.clone(),
                        readers: st.readers.clone(),
                    };
                    commit1(&mut after, id, a);
                    if st.commit_is_noop(id, a) {
                        fast += 1;
                        assert_eq!(
                            (&after.writers, &after.readers),
                            (&st.writers, &st.readers),
                            "fast path for {a:?} on {id} from {st:?}"
                        );
                    }
                    next.push(after);
                }
            }
            states = next;
        }
        // And the hand-off swap in `commit` gives what the general path gives.
        for st in &states {
            for &(id, a) in &uses {
                let fresh = || AccessState {
                    writers: st.writers.clone(),
                    readers: st.readers.clone(),
                };
                let (mut fast_path, mut general) = (fresh(), fresh());
                commit1(&mut fast_path, id, a);
                general.commit_general(&[(id, a)], S, &mut Grave::new());
                assert_eq!(
                    (&fast_path.writers, &fast_path.readers),
                    (&general.writers, &general.readers),
                    "{a:?} on {id} from {st:?}"
                );
            }
        }
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Write);
        assert!(st.commit_is_noop(1, Access::Write));
        assert!(st.commit_is_noop(1, Access::Read));
        assert!(!st.commit_is_noop(2, Access::Read));
        assert!(fast > 100, "the fast path was taken {fast} times");
    }

    fn conflicts(st: &AccessState<S>, on: u64, a: Access) -> Vec<u64> {
        let mut v = Vec::new();
        st.wait_conflicts(on, a, |s| {
            v.push(s.0);
            Ok(())
        })
        .unwrap();
        v
    }

    #[test]
    fn same_stream_uses_need_no_wait() {
        let mut st = AccessState::<S>::default();
        assert!(st.is_ordered_on(1, Access::Write));
        commit1(&mut st, 1, Access::Write);
        assert!(st.is_ordered_on(1, Access::Write));
        assert!(st.is_ordered_on(1, Access::Read));
        commit1(&mut st, 1, Access::Read);
        assert!(
            st.readers.is_empty(),
            "a read on the writer's stream is ordered by it"
        );
    }

    #[test]
    fn reads_wait_for_the_writer_only_and_stay_concurrent() {
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Write);
        assert_eq!(conflicts(&st, 2, Access::Read), [1]);
        commit1(&mut st, 2, Access::Read);
        assert_eq!(conflicts(&st, 3, Access::Read), [1]);
        commit1(&mut st, 3, Access::Read);
        assert_eq!(conflicts(&st, 4, Access::Write), [1, 2, 3]);
        assert_eq!(conflicts(&st, 2, Access::Write), [1, 3]);
        commit1(&mut st, 2, Access::Write);
        assert_eq!(AccessState::ids(&st.writers), [2]);
        assert!(st.readers.is_empty());
    }

    #[test]
    fn a_claim_on_several_streams_keeps_every_write() {
        let mut st = AccessState::<S>::default();
        let mut grave = Grave::new();
        st.commit(
            &[(1, Access::Write), (2, Access::Write), (3, Access::Read)],
            S,
            &mut grave,
        );
        assert_eq!(AccessState::ids(&st.writers), [1, 2]);
        assert_eq!(AccessState::ids(&st.readers), [3]);
        // A host read waits for both writers.
        let mut synced = Vec::new();
        st.host_wait(
            Access::Read,
            |s| {
                synced.push(s.0);
                Ok(())
            },
            &mut grave,
        )
        .unwrap();
        assert_eq!(synced, [1, 2]);
        assert_eq!(AccessState::ids(&st.readers), [3]);
    }

    #[test]
    fn host_waits_forget_what_they_waited_for_and_keep_it_on_failure() {
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Write);
        commit1(&mut st, 2, Access::Read);
        let mut grave = Grave::new();
        let e = st.host_wait(
            Access::Write,
            |_| Err(Error::InvalidArgument("mock".into())),
            &mut grave,
        );
        assert!(e.is_err());
        assert_eq!(
            AccessState::ids(&st.writers),
            [1],
            "nothing forgotten on failure"
        );
        st.host_wait(Access::Read, |_| Ok(()), &mut grave).unwrap();
        assert!(st.writers.is_empty());
        assert_eq!(
            AccessState::ids(&st.readers),
            [2],
            "a host read leaves device reads"
        );
        st.host_wait(Access::Write, |_| Ok(()), &mut grave).unwrap();
        assert!(st.is_idle());
    }

    #[test]
    fn wait_all_tries_every_stream() {
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Write);
        commit1(&mut st, 2, Access::Read);
        commit1(&mut st, 3, Access::Read);
        let mut tried = Vec::new();
        let e = st.wait_all(|s| {
            tried.push(s.0);
            if s.0 == 1 {
                Err(Error::InvalidArgument("mock".into()))
            } else {
                Ok(())
            }
        });
        assert!(e.is_err());
        assert_eq!(tried, [1, 2, 3]);
        assert!(!st.is_idle());
    }

    #[test]
    fn reads_become_writes_and_later_reads_wait_for_them() {
        // A module's launches on streams 1 and 2 (reads), then its first global view.
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Read);
        commit1(&mut st, 2, Access::Read);
        assert!(
            conflicts(&st, 3, Access::Read).is_empty(),
            "reads wait for no read"
        );
        st.reads_become_writes();
        assert_eq!(AccessState::ids(&st.writers), [1, 2]);
        assert!(st.readers.is_empty());
        // A host or stream read of the global now waits for both launches.
        assert_eq!(conflicts(&st, 3, Access::Read), [1, 2]);
        // A stream both wrote and read is kept once.
        let mut st = AccessState::<S>::default();
        commit1(&mut st, 1, Access::Write);
        commit1(&mut st, 2, Access::Read);
        st.reads_become_writes();
        assert_eq!(AccessState::ids(&st.writers), [1, 2]);
        let mut st = AccessState::<S>::default();
        st.commit(
            &[(1, Access::Write), (2, Access::Write)],
            S,
            &mut Grave::new(),
        );
        st.readers.push(S(2));
        st.reads_become_writes();
        assert_eq!(AccessState::ids(&st.writers), [1, 2]);
        assert!(st.readers.is_empty());
    }

    #[test]
    fn idle_readers_are_pruned() {
        let mut st = AccessState::<S>::default();
        for id in 100..100 + PRUNE_READERS_AT as u64 {
            commit1(&mut st, id, Access::Read);
        }
        commit1(&mut st, 7, Access::Read);
        assert_eq!(AccessState::ids(&st.readers), [7]);
    }

    #[test]
    fn sorting_merges_one_tracker_used_many_times() {
        let (a, b) = (AccessTracker::default(), AccessTracker::default());
        let mut uses = [
            Some((&a, Access::Write)),
            Some((&b, Access::Read)),
            Some((&a, Access::Read)),
            Some((&a, Access::Read)),
            None,
            Some((&b, Access::Read)),
            Some((&a, Access::Read)),
        ];
        sort_and_merge(&mut uses);
        let kept: Vec<_> = uses.iter().flatten().collect();
        assert_eq!(kept.len(), 2, "one entry per tracker");
        assert!(
            kept.iter()
                .any(|(t, x)| std::ptr::eq(*t, &a) && *x == Access::Write)
        );
        assert!(
            kept.iter()
                .any(|(t, x)| std::ptr::eq(*t, &b) && *x == Access::Read)
        );
        // And locking them does not deadlock.
        let mut held = locks::<7>();
        lock_all(&mut uses, &mut held);
        assert_eq!(held.iter().flatten().count(), 2);
    }

    #[test]
    fn sorting_merges_one_tracker_used_twice() {
        let (a, b) = (AccessTracker::default(), AccessTracker::default());
        let mut uses = [
            Some((&b, Access::Read)),
            Some((&a, Access::Read)),
            None,
            Some((&b, Access::Write)),
        ];
        sort_and_merge(&mut uses);
        let n = uses.iter().flatten().count();
        assert_eq!(n, 2);
        assert!(
            uses.iter()
                .flatten()
                .any(|(t, x)| std::ptr::eq(*t, &b) && *x == Access::Write)
        );
    }
}

/// Model checks of the claim protocol with loom (`.ci/run` runs them with
/// `RUSTFLAGS="--cfg loom"`): the production steps (`is_ordered_on`, `wait_conflicts`,
/// `commit`, `host_wait`) under the same lock, over mock streams that record what
/// happened on them.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use loom::thread;

    /// A mock stream. `enqueued` is set once the operation claimed on it is enqueued.
    #[derive(Clone)]
    struct M {
        id: u64,
        enqueued: Arc<AtomicBool>,
    }
    impl TrackedStream for M {
        fn id(&self) -> u64 {
            self.id
        }
        fn is_idle(&self) -> bool {
            false
        }
    }
    fn stream(id: u64) -> M {
        M {
            id,
            enqueued: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The stream-claim protocol: lock; wait for conflicts (the event recorded on `from`
    /// must come after `from`'s operation was enqueued); enqueue; commit; unlock.
    fn stream_op(state: &sync::Mutex<AccessState<M>>, on: &M, access: Access) -> Vec<u64> {
        let mut st = sync::lock(state);
        let mut waited = Vec::new();
        if !st.is_ordered_on(on.id, access) {
            st.wait_conflicts(on.id, access, |from| {
                assert!(
                    from.enqueued.load(SeqCst),
                    "an event was recorded on stream {} before its operation was enqueued",
                    from.id
                );
                waited.push(from.id);
                Ok(())
            })
            .unwrap();
        }
        on.enqueued.store(true, SeqCst);
        let mut grave = Grave::new();
        let on2 = on.clone();
        st.commit(&[(on.id, access)], move |_| on2.clone(), &mut grave);
        waited
    }

    /// Two writes on different streams: whichever comes second waits for the first, and
    /// never on an event recorded before the first was enqueued (the audit's race).
    #[test]
    fn cross_stream_writes_are_ordered_one_way() {
        loom::model(|| {
            let state = Arc::new(sync::Mutex::new(AccessState::<M>::default()));
            let (s1, s2) = (stream(1), stream(2));
            let t = {
                let (state, s1) = (state.clone(), s1.clone());
                thread::spawn(move || stream_op(&state, &s1, Access::Write))
            };
            let w2 = stream_op(&state, &s2, Access::Write);
            let w1 = t.join().unwrap();
            assert!(
                (w1 == [2]) ^ (w2 == [1]),
                "exactly one write waits for the other: {w1:?} {w2:?}"
            );
        });
    }

    /// A synchronous copy (host claim, lock held while it runs) and a kernel on a stream
    /// never overlap, and the kernel is ordered after any write the copy waited for.
    #[test]
    fn sync_copy_excludes_device_use() {
        loom::model(|| {
            let w = stream(1);
            w.enqueued.store(true, SeqCst);
            let mut st = AccessState::<M>::default();
            let w2 = w.clone();
            st.commit(
                &[(1, Access::Write)],
                move |_| w2.clone(),
                &mut Grave::new(),
            );
            let state = Arc::new(sync::Mutex::new(st));
            let copying = Arc::new(AtomicBool::new(false));
            let host = {
                let (state, copying) = (state.clone(), copying.clone());
                thread::spawn(move || {
                    let mut st = sync::lock(&state);
                    st.host_wait(Access::Read, |_| Ok(()), &mut Grave::new())
                        .unwrap();
                    copying.store(true, SeqCst);
                    thread::yield_now();
                    copying.store(false, SeqCst);
                })
            };
            let k = stream(2);
            {
                let mut st = sync::lock(&state);
                assert!(
                    !copying.load(SeqCst),
                    "a kernel started during a synchronous copy"
                );
                st.wait_conflicts(2, Access::Write, |_| Ok(())).unwrap();
                k.enqueued.store(true, SeqCst);
                let k2 = k.clone();
                st.commit(
                    &[(2, Access::Write)],
                    move |_| k2.clone(),
                    &mut Grave::new(),
                );
            }
            host.join().unwrap();
        });
    }

    /// Two readers on different streams both wait for the write and both stay recorded,
    /// so a later write waits for each.
    #[test]
    fn concurrent_readers_both_wait_and_are_kept() {
        loom::model(|| {
            let w = stream(1);
            w.enqueued.store(true, SeqCst);
            let mut st = AccessState::<M>::default();
            let w2 = w.clone();
            st.commit(
                &[(1, Access::Write)],
                move |_| w2.clone(),
                &mut Grave::new(),
            );
            let state = Arc::new(sync::Mutex::new(st));
            let t = {
                let state = state.clone();
                thread::spawn(move || stream_op(&state, &stream(2), Access::Read))
            };
            let a = stream_op(&state, &stream(3), Access::Read);
            let b = t.join().unwrap();
            assert_eq!((a, b), (vec![1], vec![1]));
            let st = sync::lock(&state);
            let mut waits = Vec::new();
            st.wait_conflicts(4, Access::Write, |s| {
                waits.push(s.id);
                Ok(())
            })
            .unwrap();
            waits.sort();
            assert_eq!(waits, [1, 2, 3]);
        });
    }
}
