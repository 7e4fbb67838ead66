//! The end mark of a foreign stream (shared with cudarc, or borrowed): an event recorded
//! there after each gpubind operation, which every later wait for that work asks instead
//! of the stream.
//!
//! The stream's owner may begin a capture on it at any time after a gpubind operation
//! returns. Querying or synchronising a capturing stream is illegal (it invalidates the
//! owner's capture), and so is recording an event there for another stream to wait on
//! (the waiting stream would join the capture). An event recorded *before* the capture is
//! not part of it: CUDA forbids `cuEventQuery` only on an event "last recorded inside a
//! capture sequence" (`CU_STREAM_CAPTURE_MODE_RELAXED`, `cuThreadExchangeStreamCaptureMode`
//! in the driver API reference), and `cuStreamWaitEvent` of a stream that is not
//! capturing on such an event is an ordinary wait. So each gpubind operation on a
//! foreign stream — which already asked `cuStreamIsCapturing` just before it was
//! enqueued (`StreamInner::refuse_capture`) — is followed, before any tracker records it,
//! by a record of the stream's hand-off event there; a host wait (a host read, a drop, a
//! reader prune) synchronises or queries that event, and a cross-stream wait waits for
//! it, whatever the owner does with the stream afterwards.
//!
//! Re-recording one event is sound: a wait uses the event's latest record at the call,
//! and every record is made on this one stream, after the operation it follows, before
//! that operation's use is published; so the record a waiter sees is at or after the one
//! that followed the use it waits for — it may wait for *more* of gpubind's work on the
//! stream (later operations), never less.
//!
//! A host wait on the event is a call the default capture mode forbids ("potentially
//! unsafe") to a thread that captures itself, or to any thread while another captures
//! in `CU_STREAM_CAPTURE_MODE_GLOBAL` — the call fails and the owner's capture is
//! invalidated (PyTorch's NCCL watchdog querying events of work enqueued before another
//! thread's capture: pytorch/pytorch#104555, #148594). So it runs with this thread's
//! capture mode relaxed (push-pop), which lifts that restriction and no other.

use super::borrowed::Target;
use super::stream::StreamInner;
use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// No record made yet: waits ask the stream.
pub(super) const UNMARKED: u8 = 0;
/// Every gpubind operation on the stream is followed by a record of its hand-off event.
pub(super) const MARKED: u8 = 1;
/// A record failed: the event no longer marks the end; waits ask the stream, for good.
pub(super) const BROKEN: u8 = 2;

impl StreamInner {
    /// Records the end mark of this foreign stream after an operation enqueued on it
    /// (whose capture check just ran), before any tracker records that operation.
    ///
    /// On failure the mark is broken for good (later waits ask the stream, as without
    /// a mark: `NotCapturable` while the owner captures it); a sticky error poisons the
    /// device. Never un-broken: a later successful record cannot tell whether it
    /// follows every operation whose record failed.
    #[cold]
    #[inline(never)]
    pub(crate) fn mark_end(&self) {
        let recorded = self.handoff_event().and_then(|event| {
            self.with_target(|t| match t {
                // SAFETY: the event belongs to this stream's context; the stream lives
                // (held, or lent: the operation just enqueued on it).
                Target::Stream(raw) => unsafe { result::event::record(event, raw) },
                // A retired borrowed stream takes no operations: nothing to mark.
                _ => Ok(()),
            })
        });
        match recorded {
            Ok(()) => {
                // A broken mark stays broken.
                let _ = self
                    .end_mark
                    .compare_exchange(UNMARKED, MARKED, Release, Relaxed);
            }
            Err(e) => {
                let _ = self.device.on_error(e);
                self.end_mark.store(BROKEN, Release);
            }
        }
    }

    /// [`enqueue_wait`](StreamInner::enqueue_wait) on this foreign stream: makes `to`
    /// wait on the device for gpubind's work here. Nothing when `to` is this stream
    /// (stream order suffices: a foreign stream's operations claim under an id no use
    /// is recorded under, so they are ordered after its own uses too); the end mark,
    /// recording nothing, when the stream is marked; the event recorded at the end of a
    /// retired loan; else the hand-off event recorded now, unless the stream's owner
    /// captures it: [`Error::NotCapturable`](crate::Error) then (the event would be a
    /// node of that graph, and `to` would join the capture).
    #[cold]
    #[inline(never)]
    pub(super) fn foreign_enqueue_wait(&self, to: sys::CUstream) -> Result<()> {
        let waited_for = self.with_target(|t| match t {
            Target::Stream(raw) if raw == to => Ok(None),
            Target::Stream(raw) => self.foreign_wait_event(raw).map(Some),
            Target::Event(end) => Ok(Some(end)),
            Target::Waited(outcome) => outcome.clone().map(|()| None),
        });
        let Some(event) = waited_for.map_err(|e| self.device.on_error(e))? else {
            return Ok(());
        };
        // SAFETY: as in `enqueue_wait`: `to` is a live stream; the event lives until this
        // stream's drop (held by the caller's reference).
        self.device
            .check(unsafe { result::stream::wait_event(to, event) })
    }

    /// The event `to` must wait for on this foreign stream, still lent (`raw` its
    /// handle): see [`foreign_enqueue_wait`](Self::foreign_enqueue_wait).
    fn foreign_wait_event(&self, raw: sys::CUstream) -> Result<sys::CUevent> {
        if let Some(end) = self.end_event() {
            return Ok(end);
        }
        // SAFETY: the stream lives (held, or lent while not retired).
        if unsafe { result::stream::is_capturing(raw) }? {
            return Err(super::stream::capturing_error(
                "an operation ordered after a pending use on a stream shared with cudarc \
                 or borrowed, which no event marks",
            ));
        }
        let event = self.handoff_event()?;
        // SAFETY: the event belongs to this stream's context; the stream lives.
        unsafe { result::event::record(event, raw) }.map(|()| event)
    }

    /// The event whose latest record follows every gpubind operation on this stream, if
    /// it is a foreign stream whose end is marked.
    #[inline]
    pub(super) fn end_event(&self) -> Option<sys::CUevent> {
        if self.foreign && self.end_mark.load(Acquire) == MARKED {
            self.handoff_event_if_created()
        } else {
            None
        }
    }
}

/// Runs `f`, a host wait for an event recorded outside any capture, with this thread's
/// stream capture mode relaxed, then restores the previous mode (see the module docs).
pub(super) fn relaxed<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    crate::driver::with_relaxed_capture_mode(f)?
}

/// Whether the work before `event`'s latest record (outside any capture) has finished,
/// relaxed.
pub(super) fn query_event(event: sys::CUevent) -> Result<bool> {
    // SAFETY: the caller holds the event alive (its stream's, destroyed with it).
    relaxed(|| unsafe { result::event::query(event) })
}
