//! Stream-ordered access tracking: what makes gpubind's stream-ordered operations free of
//! data races without a driver call per operation.
//!
//! gpubind's streams are non-blocking, and the synchronous calls of [`BoundDevice`] run on
//! the legacy default stream, so nothing in CUDA orders work on one stream after work on
//! another. Borrowing a buffer only while an operation is *enqueued* therefore does not
//! stop a later operation — on another stream, or from the host — from touching it while
//! the first still runs. Every allocation ([`DeviceSlice`](crate::DeviceSlice), the IPC
//! slices built on it, [`ManagedSlice`](crate::ManagedSlice), page-locked host buffers)
//! carries an [`AccessTracker`] that remembers its *pending* stream-ordered uses:
//!
//! * the last **write** (a stream), and the **reads** since it (a set of streams);
//! * a use on the stream that already holds it costs one compare under an uncontended
//!   lock and no driver call;
//! * a use on **another stream** makes that stream wait, on the device, for an event
//!   recorded on each conflicting stream at that moment (`cuEventRecord` +
//!   `cuStreamWaitEvent`, with events from a per-device pool): a write waits for the last
//!   write and every read since; a read waits only for the last write, so concurrent
//!   readers stay concurrent;
//! * **host** access and the synchronous calls wait on the host (`cuStreamSynchronize`)
//!   for the conflicting streams, after which those uses are known complete and forgotten;
//! * **dropping** the allocation waits for every pending use before the memory is freed.
//!
//! The state machine ([`AccessState`]) is generic over the stream type so the loom models
//! check it with a mock; [`AccessTracker`] runs it over real streams.

use crate::device::Device;
use crate::driver::Check;
use crate::error::Result;
use crate::sync;
use cudarc::driver::sys;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether an operation reads or writes a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The operation only reads: concurrent reads on other streams need not wait for it.
    Read,
    /// The operation may write: every other use is ordered before or after it.
    Write,
}

/// A stream as the state machine sees it: cloneable, with an identity.
pub(crate) trait TrackedStream: Clone {
    /// Equal ids name the same stream (stream order holds between their uses).
    fn id(&self) -> u64;
}

/// The pending uses of one allocation.
///
/// Invariant: every stream-ordered use of the allocation that has not been observed
/// complete is ordered (by stream order or by an event wait) before the end of the
/// `writer` stream's or of one of the `readers` streams' work as enqueued so far; and every
/// read since the last write is ordered after that write.
#[derive(Debug)]
pub(crate) struct AccessState<S> {
    writer: Option<S>,
    readers: Vec<S>,
    /// Bumped by every stream-ordered use, so a host wait forgets only what it waited for.
    epoch: u64,
}

impl<S> Default for AccessState<S> {
    fn default() -> Self {
        AccessState {
            writer: None,
            readers: Vec::new(),
            epoch: 0,
        }
    }
}

/// What a host-side wait needs: the streams to synchronise and the epoch it saw.
pub(crate) struct HostWait<S> {
    pub(crate) streams: Vec<S>,
    epoch: u64,
    access: Access,
    /// A use was recorded but possibly not yet enqueued when the snapshot was taken: the
    /// synchronisation may not cover it, so nothing may be forgotten.
    keep: bool,
}

impl<S: TrackedStream> AccessState<S> {
    /// The streams `on` must wait for before a use of kind `access` (none when the use
    /// is on the stream that already orders everything).
    pub(crate) fn stream_waits(&self, on: u64, access: Access) -> Vec<S> {
        let mut waits = Vec::new();
        if let Some(w) = &self.writer
            && w.id() != on
        {
            waits.push(w.clone());
        }
        if access == Access::Write {
            waits.extend(self.readers.iter().filter(|r| r.id() != on).cloned());
        }
        waits
    }

    /// Records a use on `on` whose waits (from [`stream_waits`](Self::stream_waits)) have
    /// been enqueued.
    pub(crate) fn commit_stream(&mut self, on: &S, access: Access) {
        self.epoch = self.epoch.wrapping_add(1);
        match access {
            Access::Write => {
                if self.writer.as_ref().map(|w| w.id()) != Some(on.id()) {
                    self.writer = Some(on.clone());
                }
                self.readers.clear();
            }
            Access::Read => {
                let orders_it = self.writer.as_ref().is_some_and(|w| w.id() == on.id())
                    || self.readers.iter().any(|r| r.id() == on.id());
                if !orders_it {
                    self.readers.push(on.clone());
                }
            }
        }
    }

    /// Whether a use of kind `access` on `on` needs nothing but a commit: the fast path.
    pub(crate) fn is_ordered_on(&self, on: u64, access: Access) -> bool {
        let writer_ok = self.writer.as_ref().is_none_or(|w| w.id() == on);
        writer_ok && (access == Access::Read || self.readers.iter().all(|r| r.id() == on))
    }

    /// The streams the host must synchronise before an access of kind `access`.
    pub(crate) fn host_waits(&self, access: Access) -> HostWait<S> {
        let mut streams: Vec<S> = self.writer.iter().cloned().collect();
        if access == Access::Write {
            streams.extend(self.readers.iter().cloned());
        }
        HostWait {
            streams,
            epoch: self.epoch,
            access,
            keep: false,
        }
    }

    /// Forgets the uses `wait` synchronised, unless a stream-ordered use was added since
    /// (then the state is left as it is: still correct, only more conservative).
    pub(crate) fn host_waited(&mut self, wait: &HostWait<S>) {
        if wait.keep || self.epoch != wait.epoch {
            return;
        }
        self.writer = None;
        if wait.access == Access::Write {
            self.readers.clear();
        }
    }

    /// Every stream with a pending use.
    #[cfg(test)]
    pub(crate) fn all_pending(&self) -> Vec<S> {
        self.writer.iter().chain(&self.readers).cloned().collect()
    }

    /// Whether no use is pending.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }
}

/// The stream behind a [`Stream`](crate::Stream): destroyed when the last holder (the
/// `Stream`, or a tracker that still orders work on it) lets go.
pub(crate) struct StreamInner {
    pub(crate) device: Arc<Device>,
    pub(crate) raw: sys::CUstream,
    pub(crate) id: u64,
}

// SAFETY: a CUstream handle is a thread-agnostic identifier; gpubind enqueues on it only
// with its device's context current (through a BoundStream, or a ContextGuard).
unsafe impl Send for StreamInner {}
// SAFETY: the driver serialises concurrent calls on one stream.
unsafe impl Sync for StreamInner {}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Ids of legacy default streams: one per device ordinal, never equal to a counter id.
const LEGACY_ID: u64 = 1 << 63;

impl StreamInner {
    pub(crate) fn new(device: Arc<Device>, raw: sys::CUstream) -> StreamInner {
        StreamInner {
            device,
            raw,
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: created by cuStreamCreate in this context, destroyed once, here.
            // Pending work completes before the driver releases the stream.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
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
        match self {
            StreamRef::Legacy(d) => LEGACY_ID | d.ordinal() as u64,
            StreamRef::Owned(s) => s.id,
        }
    }
}

impl StreamRef {
    fn device(&self) -> &Arc<Device> {
        match self {
            StreamRef::Legacy(d) => d,
            StreamRef::Owned(s) => &s.device,
        }
    }

    fn raw(&self) -> sys::CUstream {
        match self {
            StreamRef::Legacy(_) => std::ptr::null_mut(),
            StreamRef::Owned(s) => s.raw,
        }
    }

    /// Blocks until the work enqueued on this stream so far has finished.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let _guard = self.device().enter()?;
        // SAFETY: the stream is alive (held by self) and its context is current for the
        // call (the null stream resolves to that context's legacy stream).
        unsafe { sys::cuStreamSynchronize(self.raw()) }.check("cuStreamSynchronize")
    }

    /// Makes `to` (a stream of the current context) wait on the device for the work
    /// enqueued on `self` so far.
    fn enqueue_wait(&self, to: sys::CUstream) -> Result<()> {
        let device = self.device();
        let event = device.take_event()?;
        let recorded = {
            let _guard = device.enter()?;
            // SAFETY: `event` and the stream belong to `device`'s context, current here.
            unsafe { sys::cuEventRecord(event.0, self.raw()) }.check("cuEventRecord")
        };
        let waited = recorded.and_then(|()| {
            // SAFETY: `to` is a live stream of the current context (the caller's
            // BoundStream); the event may belong to another context, which CUDA allows.
            unsafe { sys::cuStreamWaitEvent(to, event.0, 0) }.check("cuStreamWaitEvent")
        });
        // The wait captured the event's state: it may be recorded again at once.
        device.return_event(event);
        waited
    }
}

/// The pending stream-ordered uses of one allocation; see the [module docs](self).
///
/// Public only as an unnameable type of hidden trait methods; nothing outside gpubind
/// can construct or inspect it.
pub struct AccessTracker {
    state: sync::Mutex<AccessState<StreamRef>>,
    /// Uses recorded but not yet known to be enqueued (their [`UseGuard`] is alive).
    in_flight: sync::AtomicUsize,
}

impl Default for AccessTracker {
    fn default() -> Self {
        AccessTracker {
            state: sync::Mutex::new(AccessState::default()),
            in_flight: sync::AtomicUsize::new(0),
        }
    }
}

/// Held from recording a use until the operation is enqueued: while one is alive, a host
/// wait does not forget anything (its synchronisation may precede the enqueue).
#[must_use = "hold the guard until the operation is enqueued"]
pub(crate) struct UseGuard<'t> {
    in_flight: Option<&'t sync::AtomicUsize>,
}

impl UseGuard<'_> {
    /// A guard that guards nothing (for operations that track no buffer).
    pub(crate) fn none() -> UseGuard<'static> {
        UseGuard { in_flight: None }
    }
}

impl Drop for UseGuard<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.in_flight {
            // Release: a host wait that reads the count (Acquire) and sees this
            // decrement also sees everything enqueued before it.
            n.fetch_sub(1, std::sync::atomic::Ordering::Release);
        }
    }
}

impl std::fmt::Debug for AccessTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = sync::lock(&self.state);
        f.debug_struct("AccessTracker")
            .field("writer", &st.writer.as_ref().map(TrackedStream::id))
            .field("readers", &st.readers.len())
            .finish()
    }
}

/// The stream an operation is enqueued on, borrowed from a [`BoundStream`](crate::BoundStream).
#[derive(Clone, Copy)]
pub(crate) enum StreamSlot<'a> {
    /// The legacy default stream of this (bound) device.
    Legacy(&'a Arc<Device>),
    /// A gpubind stream.
    Owned(&'a Arc<StreamInner>),
}

impl StreamSlot<'_> {
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

    pub(crate) fn to_ref(self) -> StreamRef {
        match self {
            StreamSlot::Legacy(d) => StreamRef::Legacy(Arc::clone(d)),
            StreamSlot::Owned(s) => StreamRef::Owned(Arc::clone(s)),
        }
    }
}

impl AccessTracker {
    /// Orders a use of kind `access` on `on` (a stream of the current context) after the
    /// conflicting pending uses, and records it. Call before enqueueing the operation and
    /// hold the guard until it is enqueued.
    ///
    /// Runs under the tracker's lock, so two threads sharing the allocation are ordered
    /// one way or the other. Nothing is recorded if a wait cannot be enqueued.
    pub(crate) fn stream_use(&self, on: StreamSlot<'_>, access: Access) -> Result<UseGuard<'_>> {
        let mut st = sync::lock(&self.state);
        let id = on.id();
        if st.is_ordered_on(id, access) {
            // The fast path: one compare, no driver call, nothing cloned.
            st.commit_stream_slot(on, access);
            return Ok(begin(&self.in_flight));
        }
        drop(st);
        stream_use_with(
            &self.state,
            &self.in_flight,
            &on.to_ref(),
            access,
            |from, to| from.enqueue_wait(to.raw()),
        )
    }

    /// Orders a write on every stream of `on` (the lanes of a collective, any devices)
    /// after the pending uses, and records the lanes as the users: the next use anywhere
    /// waits for all of them. (They are recorded as readers, which a later write waits
    /// for; every use of a staging buffer is such a write.)
    pub(crate) fn lanes_use(&self, on: &[StreamRef]) -> Result<UseGuard<'_>> {
        let mut st = sync::lock(&self.state);
        for s in on {
            let waits = st.stream_waits(s.id(), Access::Write);
            if waits.is_empty() {
                continue;
            }
            let _guard = s.device().enter()?;
            for from in waits {
                from.enqueue_wait(s.raw())?;
            }
        }
        st.writer = None;
        st.readers.clear();
        st.readers.extend(on.iter().cloned());
        st.epoch = st.epoch.wrapping_add(1);
        Ok(begin(&self.in_flight))
    }

    /// Blocks until the pending uses that conflict with a host access of kind `access`
    /// have finished, then forgets them. The synchronous calls of `BoundDevice` and the
    /// host views of managed memory call this first.
    pub(crate) fn host_use(&self, access: Access) -> Result<()> {
        host_use_with(&self.state, &self.in_flight, access, StreamRef::synchronize)
    }

    /// Waits for every pending use (before the memory is freed), and forgets them.
    /// Returns the first error; the uses are forgotten only if every wait succeeded.
    pub(crate) fn wait_all(&mut self) -> Result<()> {
        host_use_with(
            &self.state,
            &self.in_flight,
            Access::Write,
            StreamRef::synchronize,
        )
    }
}

/// Counts a recorded use as in flight until the returned guard drops. Called under the
/// tracker's lock, so a host wait that takes the lock afterwards sees the count.
fn begin(in_flight: &sync::AtomicUsize) -> UseGuard<'_> {
    in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    UseGuard {
        in_flight: Some(in_flight),
    }
}

/// The locking protocol of a stream-ordered use, over any stream type (the loom models
/// run it with mock streams): under the lock, enqueue `wait(from, on)` for every
/// conflicting stream, then record the use as in flight. Holding the lock while
/// enqueueing waits (which never blocks) orders two threads that share the allocation.
pub(crate) fn stream_use_with<'t, S: TrackedStream>(
    state: &sync::Mutex<AccessState<S>>,
    in_flight: &'t sync::AtomicUsize,
    on: &S,
    access: Access,
    mut wait: impl FnMut(&S, &S) -> Result<()>,
) -> Result<UseGuard<'t>> {
    let mut st = sync::lock(state);
    for from in st.stream_waits(on.id(), access) {
        wait(&from, on)?;
    }
    st.commit_stream(on, access);
    Ok(begin(in_flight))
}

/// The locking protocol of a host access: snapshot the conflicting streams under the
/// lock, synchronise them without it (a host wait may be long), then forget what was
/// waited for — unless a stream-ordered use arrived meanwhile (the epoch moved) or was
/// recorded but maybe not yet enqueued when the snapshot was taken (in flight).
pub(crate) fn host_use_with<S: TrackedStream>(
    state: &sync::Mutex<AccessState<S>>,
    in_flight: &sync::AtomicUsize,
    access: Access,
    mut synchronize: impl FnMut(&S) -> Result<()>,
) -> Result<()> {
    let wait = {
        let st = sync::lock(state);
        if st.writer.is_none() && (access == Access::Read || st.readers.is_empty()) {
            return Ok(());
        }
        let mut wait = st.host_waits(access);
        wait.keep = in_flight.load(std::sync::atomic::Ordering::Acquire) != 0;
        wait
    };
    for s in &wait.streams {
        synchronize(s)?;
    }
    sync::lock(state).host_waited(&wait);
    Ok(())
}

impl AccessState<StreamRef> {
    fn commit_stream_slot(&mut self, on: StreamSlot<'_>, access: Access) {
        let id = on.id();
        let unchanged = match access {
            Access::Write => {
                self.writer.as_ref().map(TrackedStream::id) == Some(id) && self.readers.is_empty()
            }
            Access::Read => {
                self.writer.as_ref().map(TrackedStream::id) == Some(id)
                    || self.readers.iter().any(|r| r.id() == id)
            }
        };
        if unchanged {
            self.epoch = self.epoch.wrapping_add(1);
        } else {
            self.commit_stream(&on.to_ref(), access);
        }
    }
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
    }

    fn ids(v: &[S]) -> Vec<u64> {
        v.iter().map(|s| s.0).collect()
    }

    #[test]
    fn same_stream_uses_need_no_wait() {
        let mut st = AccessState::<S>::default();
        assert!(st.is_ordered_on(1, Access::Write));
        st.commit_stream(&S(1), Access::Write);
        assert!(st.is_ordered_on(1, Access::Write));
        assert!(st.is_ordered_on(1, Access::Read));
        st.commit_stream(&S(1), Access::Read);
        assert!(
            st.readers.is_empty(),
            "a read on the writer's stream is ordered by it"
        );
    }

    #[test]
    fn reads_wait_for_the_writer_only_and_stay_concurrent() {
        let mut st = AccessState::<S>::default();
        st.commit_stream(&S(1), Access::Write);
        assert_eq!(ids(&st.stream_waits(2, Access::Read)), [1]);
        st.commit_stream(&S(2), Access::Read);
        assert_eq!(ids(&st.stream_waits(3, Access::Read)), [1]);
        st.commit_stream(&S(3), Access::Read);
        // A write waits for the writer and both readers.
        assert_eq!(ids(&st.stream_waits(4, Access::Write)), [1, 2, 3]);
        // A write on a reader's stream skips that reader.
        assert_eq!(ids(&st.stream_waits(2, Access::Write)), [1, 3]);
        st.commit_stream(&S(2), Access::Write);
        assert_eq!(ids(&st.all_pending()), [2]);
    }

    #[test]
    fn host_waits_forget_only_what_they_waited_for() {
        let mut st = AccessState::<S>::default();
        st.commit_stream(&S(1), Access::Write);
        st.commit_stream(&S(2), Access::Read);
        let w = st.host_waits(Access::Read);
        assert_eq!(ids(&w.streams), [1]);
        st.host_waited(&w);
        assert!(st.writer.is_none());
        assert_eq!(
            ids(&st.readers),
            [2],
            "a host read leaves device reads pending"
        );
        let w = st.host_waits(Access::Write);
        assert_eq!(ids(&w.streams), [2]);
        // A use that arrives between the snapshot and the end of the wait is kept.
        st.commit_stream(&S(3), Access::Read);
        st.host_waited(&w);
        assert_eq!(ids(&st.readers), [2, 3]);
        let w = st.host_waits(Access::Write);
        st.host_waited(&w);
        assert!(st.is_idle());
    }
}

/// Model checks of the tracker's locking protocol with loom (`.ci/run` runs them with
/// `RUSTFLAGS="--cfg loom"`): the production functions `stream_use_with` and
/// `host_use_with`, over mock streams whose "completion" is an atomic flag.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use loom::thread;

    /// A mock stream: `done` is set when the host synchronises it.
    #[derive(Clone)]
    struct M {
        id: u64,
        done: Arc<AtomicBool>,
    }
    impl TrackedStream for M {
        fn id(&self) -> u64 {
            self.id
        }
    }
    fn stream(id: u64) -> M {
        M {
            id,
            done: Arc::new(AtomicBool::new(false)),
        }
    }
    fn with_writer(w: &M) -> (Arc<sync::Mutex<AccessState<M>>>, Arc<sync::AtomicUsize>) {
        let mut st = AccessState::default();
        st.commit_stream(w, Access::Write);
        (
            Arc::new(sync::Mutex::new(st)),
            Arc::new(sync::AtomicUsize::new(0)),
        )
    }

    /// A host read and a device read on another stream race: the device read either
    /// waits for the pending write or runs after the host saw it complete.
    #[test]
    fn device_read_never_skips_an_unfinished_write() {
        loom::model(|| {
            let w = stream(1);
            let (state, in_flight) = with_writer(&w);
            let host = {
                let (state, in_flight) = (state.clone(), in_flight.clone());
                thread::spawn(move || {
                    host_use_with(&state, &in_flight, Access::Read, |s| {
                        s.done.store(true, SeqCst);
                        Ok(())
                    })
                    .unwrap();
                })
            };
            let reader = stream(2);
            let mut waited_for_writer = false;
            let guard = stream_use_with(&state, &in_flight, &reader, Access::Read, |from, _| {
                waited_for_writer |= from.id == 1;
                Ok(())
            })
            .unwrap();
            assert!(
                waited_for_writer || w.done.load(SeqCst),
                "a read skipped a write that had not finished"
            );
            drop(guard);
            host.join().unwrap();
        });
    }

    /// Two device reads on different streams both wait for the write, and both stay
    /// recorded (a later write waits for each).
    #[test]
    fn concurrent_readers_both_wait_and_are_kept() {
        loom::model(|| {
            let w = stream(1);
            let (state, in_flight) = with_writer(&w);
            let spawn_reader = |id: u64| {
                let (state, in_flight) = (state.clone(), in_flight.clone());
                thread::spawn(move || {
                    let mut waited = false;
                    let g = stream_use_with(
                        &state,
                        &in_flight,
                        &stream(id),
                        Access::Read,
                        |from, _| {
                            waited |= from.id == 1;
                            Ok(())
                        },
                    )
                    .unwrap();
                    drop(g);
                    waited
                })
            };
            let (a, b) = (spawn_reader(2), spawn_reader(3));
            assert!(a.join().unwrap() && b.join().unwrap());
            let st = sync::lock(&state);
            let mut waits: Vec<u64> = st
                .stream_waits(4, Access::Write)
                .iter()
                .map(|s| s.id)
                .collect();
            waits.sort();
            assert_eq!(waits, [1, 2, 3]);
        });
    }

    /// A host wait racing a new use on the *same* stream it synchronises must not forget
    /// that use unless its synchronisation came after the use was enqueued.
    #[test]
    fn host_wait_forgets_only_enqueued_uses() {
        loom::model(|| {
            let w = stream(1);
            let (state, in_flight) = with_writer(&w);
            let enqueued = Arc::new(AtomicBool::new(false));
            let host = {
                let (state, in_flight, enqueued) =
                    (state.clone(), in_flight.clone(), enqueued.clone());
                thread::spawn(move || {
                    let mut synced_after_enqueue = false;
                    host_use_with(&state, &in_flight, Access::Read, |_| {
                        synced_after_enqueue = enqueued.load(SeqCst);
                        Ok(())
                    })
                    .unwrap();
                    synced_after_enqueue
                })
            };
            // A kernel writing through a shared reference, on the same stream: record,
            // enqueue, release the guard.
            let guard =
                stream_use_with(&state, &in_flight, &w, Access::Write, |_, _| Ok(())).unwrap();
            enqueued.store(true, SeqCst);
            drop(guard);
            let synced_after_enqueue = host.join().unwrap();
            let st = sync::lock(&state);
            let kept = st.writer.as_ref().is_some_and(|s| s.id == 1);
            assert!(
                kept || synced_after_enqueue,
                "a use was forgotten by a host wait that did not cover it"
            );
        });
    }
}
