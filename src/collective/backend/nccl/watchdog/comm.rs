//! The watched side of an NCCL communicator: [`NcclComm`]'s calls that go through its
//! gate (the owner leaving it, a failure, `check`, `wait`) and the in-flight record the
//! watchdog times (`note_issued`; the events are `Watched`'s: `spare_event`,
//! `record_in_flight`).

use super::super::comm::NcclComm;
use super::super::library::{RestoreCurrent, poll_raw};
use super::{Who, spawn_abort};
use crate::error::{Error, Result};
use crate::stream::{BoundStream, Event};
use crate::sync;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`NcclComm::wait`]'s error past its limit on a communicator the watchdog does not
/// watch.
pub(crate) fn unwatched_wait_timeout(limit: Duration) -> Error {
    Error::Timeout {
        what: "the stream's work to finish in RankComm::wait (this NCCL communicator is \
               not watched by gpubind's NCCL watchdog, so a dead peer would hang the wait; \
               the communicator's timeout, else GPUBIND_DROP_TIMEOUT, bounds it)",
        after_ms: limit.as_millis().min(u128::from(u64::MAX)) as u64,
    }
}

impl NcclComm {
    /// The owner leaves the gate (after `watch.owner_enter()`); in the (theoretical)
    /// case that the abort fell to it on the way out, it is made on a thread of its own
    /// ([`spawn_abort`]).
    pub(in crate::collective) fn owner_leave(&self) {
        self.watch.owner_leave();
    }

    /// Records `e` as the communicator's verdict (the first one stays: later calls
    /// return it); if the abort falls to the owner (`inside`: the owner is inside the
    /// gate now), it is made on a thread of its own ([`spawn_abort`]),
    /// never inline (it may wait for the device's work). The owner makes no NCCL call on
    /// the communicator after. Returns `e`.
    pub(in crate::collective) fn fail_owner(&self, e: Error, inside: bool) -> Error {
        self.watch.fail(e, inside)
    }

    /// After the rank's call `op` was enqueued on `stream`: records `ev` (taken with
    /// [`spare_event`](Self::spare_event) *before* the enqueue, so that making it cannot
    /// fail after) on `stream` and hands it to the watchdog as work in flight: it is
    /// timed against the communicator's timeout, and the drop waits for it, with a
    /// limit, before it destroys the communicator. Should the record fail, the call
    /// cannot be watched: the communicator fails with that error (aborted, its verdict)
    /// rather than leaving work unwatched that a dead peer could hang.
    pub(crate) fn note_issued(
        &mut self,
        stream: &BoundStream<'_>,
        ev: Event,
        op: &'static str,
    ) -> Result<()> {
        self.watch.record_in_flight(stream, ev, op)
    }

    /// An event of the communicator's spares, or a new one; give it back with
    /// [`give_back`](Self::give_back) if unused.
    pub(crate) fn spare_event(&self, stream: &BoundStream<'_>) -> Result<Event> {
        self.watch.spare_event(stream)
    }

    /// Keeps `ev` for later calls (see [`Watched::give_back`](super::Watched::give_back)).
    pub(crate) fn give_back(&self, ev: Event) {
        self.watch.give_back(ev)
    }

    /// The communicator's verdict, if it failed (no NCCL call).
    pub(crate) fn verdict(&self) -> Option<Error> {
        sync::lock(&self.watch.gate).verdict().cloned()
    }

    /// The communicator's verdict if it failed (an error NCCL reported, a timeout of the
    /// watchdog or of a call: the same error every later call returns); else polls
    /// `ncclCommGetAsyncError` (non-blocking communicators) and, on an error, aborts the
    /// communicator (on a thread of its own) and returns it.
    pub(crate) fn check(&self) -> Result<()> {
        if self.watch.timeout.is_none() {
            let g = sync::lock(&self.watch.gate);
            return g.verdict().map_or(Ok(()), |v| Err(v.clone()));
        }
        // NCCL (the CUDA runtime) may change the thread's current context: put it back.
        let _restore = RestoreCurrent::new()?;
        self.watch.owner_enter()?;
        // SAFETY: the owner is inside the gate: the communicator is live and nobody else
        // is inside NCCL on it.
        let polled = unsafe { poll_raw(self.raw as usize) };
        let mut gate = sync::lock(&self.watch.gate);
        let take = match &polled {
            Err(e) => gate.fail(e.clone(), Some(Who::Owner)),
            Ok(()) => false,
        };
        let take = gate.owner_leave() || take;
        drop(gate);
        if take {
            spawn_abort(Arc::clone(&self.watch), self.watch.take_events());
        }
        polled
    }

    /// Waits on the host until `stream`'s work so far has finished, or the communicator
    /// fails (its verdict is returned at once, even while the stream still runs). On a
    /// communicator the watchdog does not watch (NCCL older than 2.14, a blocking one,
    /// the watchdog stopped at exit) nothing would end a wait behind a dead peer: it is
    /// bounded by the communicator's timeout, else `GPUBIND_DROP_TIMEOUT`, and past it
    /// returns [`Error::Timeout`] (the communicator is not failed: the work may still
    /// finish).
    pub(crate) fn wait(&mut self, stream: &BoundStream<'_>) -> Result<()> {
        self.check()?;
        let ev = self.spare_event(stream)?;
        let limit = match self.watch.timeout {
            Some(_) if !super::EXITING.load(std::sync::atomic::Ordering::Acquire) => None,
            _ => Some(
                self.bound
                    .unwrap_or_else(crate::teardown::drop_wait::drop_timeout),
            ),
        };
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        let mut pause = Duration::from_micros(20);
        let out = stream.record(&ev).and_then(|()| {
            loop {
                if ev.is_complete()? {
                    break self.check();
                }
                self.check()?;
                if let (Some(d), Some(l)) = (deadline, limit)
                    && Instant::now() >= d
                {
                    break Err(unwatched_wait_timeout(l));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        });
        self.give_back(ev);
        out
    }
}
