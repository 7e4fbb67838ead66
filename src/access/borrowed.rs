//! Streams gpubind borrows ([`BorrowedStream`](crate::BorrowedStream)): a foreign
//! `CUstream` that gpubind uses, tracks, and never destroys.
//!
//! A tracker may remember a use on such a stream after its borrow has ended (the memory
//! outlives the view), and the owner may then destroy the stream. So the end of the
//! borrow *retires* the stream: it records an event at its end, and from then on every
//! question the trackers ask of the stream (is it idle, wait for it, order another stream
//! after it) is asked of that event instead — which covers exactly the work gpubind
//! enqueued on it. The retirement takes a write lock that every such question holds for
//! reading while it touches the raw stream, so none touches it after the borrow ended.

use super::stream::StreamInner;
use crate::device::Device;
use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::{PoisonError, RwLock};

/// What is left of a borrowed stream for the trackers to ask.
#[derive(Default)]
pub(crate) struct Retirement {
    state: RwLock<Retired>,
}

#[derive(Default)]
enum Retired {
    /// The borrow lives: the stream may be used.
    #[default]
    Not,
    /// The borrow ended; this event (owned here) was recorded on the stream at its end.
    At(sys::CUevent),
    /// The borrow ended while its owner captured the stream; this event, the stream's
    /// end mark (owned by the stream, [`super::foreign`]), was recorded after gpubind's
    /// last operation there, before the capture.
    Marked(sys::CUevent),
    /// The borrow ended and no event could be recorded: the stream was synchronised
    /// instead, with this outcome (the error of a faulted context, repeated to every
    /// later wait).
    Waited(Result<()>),
}

// SAFETY: an event handle is a thread-agnostic identifier; the driver serialises calls on
// it, and it is destroyed only with `&mut` (the stream's drop).
unsafe impl Send for Retired {}
// SAFETY: as above.
unsafe impl Sync for Retired {}

/// Where a tracker's question about a stream is answered.
pub(crate) enum Target<'a> {
    /// The stream itself (owned, or borrowed and still lent).
    Stream(sys::CUstream),
    /// The event recorded at the end of the borrow.
    Event(sys::CUevent),
    /// The stream was waited for at the end of the borrow, with this outcome.
    Waited(&'a Result<()>),
}

impl StreamInner {
    /// Runs `f` with what answers for this stream: the stream, unless it is a borrowed
    /// stream whose borrow has ended. The stream is not retired while `f` runs.
    pub(crate) fn with_target<R>(&self, f: impl FnOnce(Target<'_>) -> R) -> R {
        let Some(retirement) = &self.borrowed else {
            return f(Target::Stream(self.raw));
        };
        let state = retirement
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match &*state {
            Retired::Not => f(Target::Stream(self.raw)),
            Retired::At(event) | Retired::Marked(event) => f(Target::Event(*event)),
            Retired::Waited(outcome) => f(Target::Waited(outcome)),
        }
    }

    /// Whether the work gpubind enqueued on the stream has finished (`cuStreamQuery`; on
    /// a foreign stream whose end is marked, or once retired, `cuEventQuery` of that
    /// event, with the capture mode relaxed: [`super::foreign`]).
    pub(crate) fn query(&self) -> Result<bool> {
        self.with_target(|t| match t {
            Target::Stream(raw) => {
                if let Some(end) = self.end_event() {
                    return super::foreign::query_event(end);
                }
                self.refuse_foreign_capture(raw)?;
                // SAFETY: the stream lives (owned, or lent: the borrow's contract).
                unsafe { result::stream::query(raw) }
            }
            // The event lives until the stream's drop.
            Target::Event(event) => super::foreign::query_event(event),
            Target::Waited(outcome) => outcome.clone().map(|()| true),
        })
    }

    /// Blocks until the work enqueued on the stream so far has finished (on a foreign
    /// stream whose end is marked, or once retired, the work gpubind enqueued there).
    /// Its one caller, `StreamRef::synchronize`, runs it with the thread's capture mode
    /// relaxed (the waits are on streams and events outside any capture: see
    /// [`super::foreign`]).
    pub(super) fn synchronize_raw(&self) -> Result<()> {
        self.with_target(|t| match t {
            Target::Stream(raw) => {
                if let Some(end) = self.end_event() {
                    // SAFETY: the event lives until the stream's drop (held by `self`).
                    return unsafe { result::event::synchronize(end) };
                }
                self.refuse_foreign_capture(raw)?;
                // SAFETY: as in `query`; the caller made the stream's context current.
                unsafe { result::stream::synchronize(raw) }
            }
            // SAFETY: as in `query`: the event lives until the stream's drop.
            Target::Event(event) => unsafe { result::event::synchronize(event) },
            Target::Waited(outcome) => outcome.clone(),
        })
    }

    /// [`Error::NotCapturable`](crate::Error::NotCapturable) if `raw`, this stream's
    /// handle, is another library's stream that its owner captures (the query's error if
    /// the driver cannot say). Querying or synchronising it then would be illegal in the
    /// capture and invalidate the owner's graph: such questions fail instead, leaving the
    /// owner's capture as it was.
    fn refuse_foreign_capture(&self, raw: sys::CUstream) -> Result<()> {
        // SAFETY: the caller holds the stream alive (owned, or lent while not retired).
        if self.foreign && unsafe { result::stream::is_capturing(raw) }? {
            return Err(super::stream::capturing_error(
                "a wait for gpubind's work on a stream shared with cudarc or borrowed",
            ));
        }
        Ok(())
    }

    /// Ends the borrow of a borrowed stream (a no-op for others): records an event on it
    /// for the trackers that still remember uses on it, or, if that fails, waits for it.
    /// After this returns gpubind never touches the raw stream again.
    pub(crate) fn retire(&self) {
        let Some(retirement) = &self.borrowed else {
            return;
        };
        let mut state = retirement
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if !matches!(*state, Retired::Not) {
            return;
        }
        // SAFETY: the stream is still lent (the borrow ends with this call).
        match unsafe { result::stream::is_capturing(self.raw) } {
            Ok(false) => {}
            Err(e) => {
                // Nothing is recorded on a stream that may be captured: later waits get
                // the query's error (a sticky one poisons the device).
                *state = Retired::Waited(Err(self.device.on_error(e)));
                return;
            }
            Ok(true) => {
                // Its owner captures it: an event recorded now would be a node of that
                // graph, marking no point of the work gpubind enqueued before the capture,
                // and a stream waiting for it would join the capture; a synchronisation
                // is illegal there. The end mark, recorded after gpubind's last operation
                // there (before the capture), answers instead: no operation follows
                // once the loan ends, so it is recorded no more.
                if let Some(end) = self.end_event() {
                    *state = Retired::Marked(end);
                    return;
                }
                // Unmarked (a failed record): nothing can tell when that work ends once
                // the raw stream is the owner's again, so every later question about it
                // fails: the buffers with uses on it refuse operations that must wait
                // for them, and leak when dropped.
                *state = Retired::Waited(Err(super::stream::capturing_error(
                    "an operation ordered after work on a borrowed stream whose loan ended \
                     while its owner captured it",
                )));
                return;
            }
        }
        *state = match record_end(&self.device, self.raw) {
            Ok(event) => Retired::At(event),
            Err(_) => {
                let _guard = self.device.enter();
                // SAFETY: the stream is still lent (the borrow ends with this call).
                let waited = unsafe { result::stream::synchronize(self.raw) };
                Retired::Waited(waited.map_err(|e| self.device.on_error(e)))
            }
        };
    }

    /// The event recorded at the end of the borrow, handed to the stream's drop (which
    /// destroys it).
    pub(crate) fn take_retired_event(&mut self) -> Option<sys::CUevent> {
        let state = self.borrowed.as_mut()?.state.get_mut();
        match std::mem::take(state.unwrap_or_else(PoisonError::into_inner)) {
            Retired::At(event) => Some(event),
            _ => None,
        }
    }
}

/// A new event of `device`'s context, recorded at the current end of `raw`.
fn record_end(device: &Device, raw: sys::CUstream) -> Result<sys::CUevent> {
    let event = device.new_handoff_event()?;
    // SAFETY: the event is of the stream's context; the stream is still lent.
    let recorded = unsafe { result::event::record(event, raw) };
    if let Err(e) = recorded {
        let _guard = device.enter();
        // SAFETY: created above, never waited on, destroyed once.
        let _ = unsafe { result::event::destroy(event) };
        return Err(device.on_error(e));
    }
    Ok(event)
}
