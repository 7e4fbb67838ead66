//! The streams a tracker remembers: [`StreamInner`] (a gpubind stream and its hand-off
//! event), [`StreamRef`] (a held reference to a stream, or the legacy default stream)
//! and [`StreamSlot`] (the borrowed form a claim names its stream by).

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::sync::Gate;
use crate::teardown::drop_wait::{GaveUp, Polled, poll_until_idle};
use crate::teardown::{self, Runs, Teardown};
use cudarc::driver::sys;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::TrackedStream;

/// The stream behind a [`Stream`](crate::Stream): destroyed when the last holder (the
/// `Stream`, or a tracker that still orders work after it) lets go.
pub(crate) struct StreamInner {
    pub(crate) device: Arc<Device>,
    pub(crate) raw: sys::CUstream,
    /// The id trackers record this stream's uses under.
    pub(crate) id: u64,
    /// The id an operation on this stream claims under ([`StreamSlot::id`]): `id` for
    /// gpubind's own streams; `id | FOREIGN_CLAIM` for a foreign one, which equals no
    /// recorded id, so every operation there takes the slow path (a claim that commits,
    /// never the launch fast path nor a no-op commit), where its end mark is recorded
    /// ([`super::foreign`]) — at no cost to gpubind's own streams.
    claim_id: u64,
    /// The event this stream's hand-offs record (created at the first one): see
    /// [`StreamInner::enqueue_wait`].
    handoff: std::sync::OnceLock<HandoffEvent>,
    /// Set for a stream shared with cudarc ([`crate::interop`]): cudarc owns the handle
    /// and destroys it when the last `Arc<CudaStream>` goes; this keeps it alive while
    /// gpubind (a `Stream`, or a tracker ordering work after it) still needs it.
    pub(crate) cudarc: Option<Arc<cudarc::driver::CudaStream>>,
    /// Held by every fast-path enqueue on this stream ([`super::fast`]).
    gate: Gate,
    /// Set for a stream gpubind borrows ([`crate::BorrowedStream`]): never destroyed
    /// here, and retired when the borrow ends ([`super::borrowed`]).
    pub(crate) borrowed: Option<super::borrowed::Retirement>,
    /// Whether the stream's owner is not gpubind (`cudarc` or `borrowed` is set): its
    /// owner may begin a capture on it, so every operation on it first asks the driver
    /// ([`StreamInner::refuse_capture`]). One flag, so gpubind's own streams pay one
    /// compare.
    pub(crate) foreign: bool,
    /// For a foreign stream: whether its hand-off event marks the end of every gpubind
    /// operation on it ([`super::foreign`]).
    pub(super) end_mark: std::sync::atomic::AtomicU8,
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

/// Set in a foreign stream's claim id ([`StreamInner::claim_id`]): never in a recorded id
/// (counter ids stay far below it, legacy ids have only bit 63 above the ordinal).
pub(crate) const FOREIGN_CLAIM: u64 = 1 << 62;

impl StreamInner {
    pub(crate) fn new(device: Arc<Device>, raw: sys::CUstream) -> StreamInner {
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        StreamInner {
            device,
            raw,
            id,
            claim_id: id,
            handoff: std::sync::OnceLock::new(),
            cudarc: None,
            gate: Gate::default(),
            borrowed: None,
            foreign: false,
            end_mark: std::sync::atomic::AtomicU8::new(super::foreign::UNMARKED),
        }
    }

    /// A foreign stream gpubind uses but does not own: never destroyed here.
    pub(crate) fn borrowed(device: Arc<Device>, raw: sys::CUstream) -> StreamInner {
        let mut inner = StreamInner::new(device, raw);
        inner.borrowed = Some(super::borrowed::Retirement::default());
        inner.foreign = true;
        inner.claim_id = inner.id | FOREIGN_CLAIM;
        inner
    }

    /// A stream created and owned by cudarc, shared with gpubind: never destroyed here.
    pub(crate) fn shared(device: Arc<Device>, stream: Arc<cudarc::driver::CudaStream>) -> Self {
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        StreamInner {
            device,
            raw: stream.cu_stream(),
            id,
            claim_id: id | FOREIGN_CLAIM,
            handoff: std::sync::OnceLock::new(),
            cudarc: Some(stream),
            gate: Gate::default(),
            borrowed: None,
            foreign: true,
            end_mark: std::sync::atomic::AtomicU8::new(super::foreign::UNMARKED),
        }
    }

    /// [`Error::NotCapturable`] for a stream another library owns (shared with cudarc,
    /// or borrowed) while its owner captures it (or when the driver cannot say): an
    /// operation enqueued there would not run but become a node of the owner's graph,
    /// which runs at each of its launches, ordered with none of gpubind's later uses or
    /// frees of the memory it touches. Called before every operation on such a stream
    /// (`BoundStream::ensure_stream_context`); out of line, so gpubind's own streams pay
    /// only the [`foreign`](Self::foreign) compare.
    #[cold]
    #[inline(never)]
    pub(crate) fn refuse_capture(&self) -> Result<()> {
        if !self.may_be_capturing() {
            return Ok(());
        }
        Err(capturing_error(
            "a gpubind operation on a stream shared with cudarc or borrowed",
        ))
    }

    /// [`StreamRef::may_be_capturing`] of this stream. Inlined: gpubind's own streams
    /// answer with the [`foreign`](Self::foreign) compare.
    #[inline]
    fn may_be_capturing(&self) -> bool {
        self.foreign && self.foreign_may_be_capturing()
    }

    /// [`may_be_capturing`](Self::may_be_capturing) of a foreign stream: asks the driver.
    #[inline(never)]
    fn foreign_may_be_capturing(&self) -> bool {
        self.with_target(|t| match t {
            // SAFETY: the stream is alive (held by the caller, or lent while not retired).
            super::borrowed::Target::Stream(raw) => {
                unsafe { result::stream::is_capturing(raw) }.unwrap_or(true)
            }
            _ => false,
        })
    }

    /// This stream's hand-off event, created in its context at the first use; on a
    /// foreign stream also recorded after each gpubind operation ([`super::foreign`]).
    #[inline]
    pub(super) fn handoff_event(&self) -> Result<sys::CUevent> {
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

    /// The hand-off event, if one was created.
    pub(super) fn handoff_event_if_created(&self) -> Option<sys::CUevent> {
        self.handoff.get().map(|e| e.0)
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
        if self.foreign {
            // A stream another library owns: out of line (`super::foreign`).
            return self.foreign_enqueue_wait(to);
        }
        let event = self.handoff_event()?;
        let recorded = self.with_target(|target| match target {
            super::borrowed::Target::Stream(raw) => {
                // SAFETY: `event` belongs to this stream's context; the stream lives
                // (held, or lent while not retired).
                unsafe { result::event::record(event, raw) }.map(|()| event)
            }
            // A retired borrowed stream: its end is already recorded.
            super::borrowed::Target::Event(end) => Ok(end),
            super::borrowed::Target::Waited(outcome) => outcome.clone().map(|()| event),
        });
        let event = recorded.map_err(|e| self.device.on_error(e))?;
        // SAFETY: `to` is a live stream of the current context (or a gpubind stream); the
        // event may belong to another context, which CUDA allows. `to` is usually a stream
        // of this stream's device, so a sticky error poisons this device; after a copy
        // between devices it may be the other device's, whose context then refuses every
        // later call by itself (its frees fail and leak).
        self.device
            .check(unsafe { result::stream::wait_event(to, event) })
    }
}

/// [`Error::NotCapturable`] for `what`, whose stream (or a stream it would be ordered
/// after) another library's owner is capturing.
#[cold]
pub(super) fn capturing_error(what: &'static str) -> Error {
    Error::NotCapturable {
        what,
        reason: "the stream's owner is capturing it (or cuStreamIsCapturing failed): \
                 the operation would become a node of that graph, unordered with \
                 gpubind's later uses and frees of its memory; enqueue it before the \
                 capture begins or after it ends"
            .into(),
    }
}

/// Destroys an event of `device`'s context (a drop: failures are logged).
fn destroy_event(device: &Arc<Device>, event: sys::CUevent) {
    let event = event as usize; // a handle, `Send`
    teardown::release(
        Teardown {
            what: format_args!("a stream's hand-off event"),
            device,
            waited: Ok(()),
            call: "cuEventDestroy_v2",
            runs: Runs::Inline,
        },
        // SAFETY: created by cuEventCreate in this context (current while this runs),
        // destroyed once, here; the driver releases it once pending records complete.
        move || unsafe { result::event::destroy(event as sys::CUevent) },
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
            teardown::drop_in_context(
                format_args!("a Stream shared with cudarc"),
                &self.device,
                stream,
            );
            return;
        }
        let raw = self.raw as usize; // a handle, `Send`
        match self.device.enter() {
            Ok(_guard) => GaveUp::forget_stream(self.id, true),
            Err(_) => GaveUp::forget_stream(self.id, false),
        }
        if self.borrowed.is_some() {
            // Lent, not ours: only the events are.
            for event in [self.take_retired_event(), self.handoff.take().map(|e| e.0)] {
                event
                    .into_iter()
                    .for_each(|e| destroy_event(&self.device, e));
            }
            return;
        }
        teardown::release(
            Teardown {
                what: format_args!("a Stream"),
                device: &self.device,
                waited: Ok(()),
                call: "cuStreamDestroy_v2",
                runs: Runs::Inline,
            },
            // SAFETY: created by cuStreamCreate in this context (current while this runs),
            // destroyed once, here. Pending work completes before the driver releases
            // the stream.
            move || unsafe { result::stream::destroy(raw as sys::CUstream) },
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
        self.slot().record_id()
    }

    fn is_idle(&self) -> bool {
        let Ok(_guard) = self.device().enter() else {
            return false;
        };
        self.query() == Ok(true)
    }

    fn under_gate(&self, f: impl FnOnce()) {
        let _gate = self.slot().lock_gate();
        f();
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

    pub(super) fn device(&self) -> &Arc<Device> {
        self.slot().device()
    }

    /// The raw handle, for a stream that is known live (the claiming stream of a claim,
    /// or the legacy stream).
    pub(super) fn raw(&self) -> sys::CUstream {
        self.slot().raw()
    }

    /// Whether the work enqueued so far has finished; the stream's context is current.
    fn query(&self) -> Result<bool> {
        match self {
            // SAFETY: the null stream resolves to the current context's legacy stream.
            StreamRef::Legacy(_) => unsafe { result::stream::query(std::ptr::null_mut()) },
            StreamRef::Owned(s) => s.query(),
        }
    }

    /// Whether this is a stream gpubind borrows ([`crate::BorrowedStream`]): once its
    /// borrow ends its owner may destroy it, so nothing may be enqueued on it from a
    /// tracker (which answers for it with the event recorded at the end of the borrow).
    pub(crate) fn is_borrowed(&self) -> bool {
        matches!(self, StreamRef::Owned(s) if s.borrowed.is_some())
    }

    /// Whether this is a stream gpubind does not own (shared with cudarc, or borrowed)
    /// that is being captured (its owner can begin a capture on it; gpubind's own streams
    /// are never captured: captures use private streams). `true` when the driver cannot
    /// say; `false` for a borrowed stream whose loan has ended (gpubind enqueues nothing
    /// more on it).
    pub(crate) fn may_be_capturing(&self) -> bool {
        match self {
            StreamRef::Owned(s) => s.may_be_capturing(),
            StreamRef::Legacy(_) => false,
        }
    }

    /// [`StreamSlot::after_enqueue`] of this stream.
    #[cfg_attr(not(feature = "collective"), allow(dead_code))]
    #[inline]
    pub(crate) fn after_enqueue(&self) {
        self.slot().after_enqueue();
    }

    /// Blocks until the work enqueued on this stream so far has finished.
    ///
    /// A host wait of a tracker: the stream is never one being captured (gpubind's
    /// captures run on private streams; a foreign stream is waited for through its end
    /// mark, or refused), so the wait runs with this thread's capture mode relaxed
    /// ([`with_relaxed_capture_mode`](crate::driver::with_relaxed_capture_mode)): a read
    /// of page-locked memory inside a capture closure, or while another thread captures
    /// in `CU_STREAM_CAPTURE_MODE_GLOBAL`, waits instead of failing and invalidating the
    /// capture.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let _guard = self.device().enter()?;
        let synced = crate::driver::with_relaxed_capture_mode(|| match self {
            // SAFETY: its context is current for the call (the null stream resolves to
            // that context's legacy stream).
            StreamRef::Legacy(_) => unsafe { result::stream::synchronize(std::ptr::null_mut()) },
            StreamRef::Owned(s) => s.synchronize_raw(),
        })
        .and_then(|synced| synced);
        self.device().check(synced)
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
        // Relaxed, as in `synchronize`: the queries, and the event that remembers a
        // timeout, act on this stream's own work, never on a capture's.
        crate::driver::with_relaxed_capture_mode(|| {
            if GaveUp::still_busy(id) {
                return Err(Error::Timeout {
                    what: "a buffer's pending GPU work to finish before freeing it \
                           (GPUBIND_DROP_TIMEOUT; an earlier wait on the same stream gave \
                           up on work that still runs, so this one did not wait again)",
                    after_ms: 0,
                });
            }
            match poll_until_idle(|| self.query(), deadline, limit) {
                Ok(()) => Ok(()),
                Err(Polled::Failed(e)) => Err(self.device().on_error(e)),
                Err(Polled::TimedOut(after_ms)) => {
                    self.remember_gave_up(id);
                    Err(Error::Timeout {
                        what: "a buffer's pending GPU work to finish before freeing it \
                               (GPUBIND_DROP_TIMEOUT)",
                        after_ms,
                    })
                }
            }
        })
        .map_err(|e| self.device().on_error(e))?
    }

    /// Remembers that a wait on this stream gave up ([`GaveUp::remember`]), if it can
    /// still be recorded on (a retired borrowed stream cannot: waits on it wait for its
    /// event, one limit each).
    fn remember_gave_up(&self, id: u64) {
        match self {
            StreamRef::Legacy(_) => GaveUp::remember(id, std::ptr::null_mut()),
            // Nothing is recorded on a foreign stream here: its owner may capture it.
            StreamRef::Owned(s) if s.foreign => {}
            StreamRef::Owned(s) => s.with_target(|t| {
                if let super::borrowed::Target::Stream(raw) = t {
                    GaveUp::remember(id, raw);
                }
            }),
        }
    }

    /// Makes `to` wait on the device for the work enqueued on `self` so far. `to`'s
    /// context must be current (or `to` must be a non-null stream).
    pub(super) fn enqueue_wait(&self, to: sys::CUstream) -> Result<()> {
        let device = match self {
            StreamRef::Owned(s) => return s.enqueue_wait(to),
            StreamRef::Legacy(device) => device,
        };
        let event = device.take_event()?;
        let recorded = {
            let _guard = device.enter()?;
            // SAFETY: `event` and the stream belong to `device`'s context, current here.
            device.check(unsafe { result::event::record(event.0, self.raw()) })
        };
        let waited = recorded.and_then(|()| {
            // SAFETY: `to` is a live stream of the current context; the event may belong
            // to another context, which CUDA allows.
            // A sticky error is ascribed to `device` (see `StreamInner::enqueue_wait`).
            device.check(unsafe { result::stream::wait_event(to, event.0) })
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
    /// The id an operation on this stream claims under: its [`record_id`](Self::record_id),
    /// with [`FOREIGN_CLAIM`] set on a foreign stream (see [`StreamInner::claim_id`]).
    #[inline(always)]
    pub(crate) fn id(self) -> u64 {
        match self {
            StreamSlot::Legacy(d) => LEGACY_ID | d.ordinal() as u64,
            StreamSlot::Owned(s) => s.claim_id,
        }
    }

    /// The id trackers record this stream's uses under.
    #[inline(always)]
    pub(crate) fn record_id(self) -> u64 {
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

    /// Locks the stream's gate ([`super::fast`]): the legacy stream's is its device's.
    #[inline(always)]
    pub(crate) fn lock_gate(self) -> std::sync::MutexGuard<'a, ()> {
        match self {
            StreamSlot::Legacy(d) => d.legacy_gate().lock(),
            StreamSlot::Owned(s) => s.gate.lock(),
        }
    }

    /// Called after an operation was enqueued on this stream and before any tracker
    /// records it: on a foreign stream, records the stream's end mark
    /// ([`StreamInner::mark_end`], out of line). Only on paths every foreign operation
    /// takes and gpubind's own streams' fast paths do not (commits).
    #[inline(always)]
    pub(crate) fn after_enqueue(self) {
        if self.id() & FOREIGN_CLAIM != 0
            && let StreamSlot::Owned(s) = self
        {
            s.mark_end();
        }
    }

    pub(crate) fn to_ref(self) -> StreamRef {
        match self {
            StreamSlot::Legacy(d) => StreamRef::Legacy(Arc::clone(d)),
            StreamSlot::Owned(s) => StreamRef::Owned(Arc::clone(s)),
        }
    }
}
