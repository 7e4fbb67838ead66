//! The state machine a communicator shares with the watchdog ([`Gate`]): who is inside
//! NCCL, the verdict, the single abort, and the queue of calls in flight ([`scan`]),
//! generic over the event type so that the loom models run it without a GPU.

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Which party is inside NCCL on a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    /// The thread that owns the communicator (its calls, `check`, its drop). (The
    /// watchdog records its failures after leaving NCCL: it passes `None`.)
    Owner,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AbortStep {
    /// No verdict.
    No,
    /// A verdict, but someone is still inside NCCL: the last to leave takes the abort.
    Asked,
    /// Taken by one party, which calls `ncclCommAbort` (once).
    Taken,
}

/// The owner's answer from [`Gate::owner_enter`].
#[derive(Debug, PartialEq)]
pub(crate) enum Enter {
    /// Inside: call NCCL, then [`Gate::owner_leave`].
    Go,
    /// The watchdog's round is running (non-blocking calls only): try again shortly.
    Busy,
    /// The communicator failed (and is aborted, or about to be): this error.
    Refused(Error),
}

/// The owner's answer from [`Gate::close`] (its drop).
#[derive(Debug, PartialEq)]
pub(crate) enum Close {
    /// The watchdog's round is running: try again shortly.
    Busy,
    /// No verdict: the owner alone may use the handle from now on (the watchdog lets go),
    /// to finish and destroy it.
    Live,
    /// Aborted (or being aborted by the party that took it): nothing more to do.
    Aborted,
}

/// One call (or graph launch) of a communicator whose work may still run: the event
/// recorded after it, what it was, and since when it may have been running.
pub(crate) struct InFlight<E> {
    pub(crate) event: E,
    /// The op, for the timeout's message ("all_reduce").
    pub(crate) op: &'static str,
    /// The rank's call number (1 = its first).
    pub(crate) seq: u64,
    /// When it was enqueued, or when the call before it was seen finished, if later: a
    /// collective queued behind another of the communicator is not timed while the
    /// earlier one runs.
    pub(crate) since: Instant,
}

/// What a communicator and the watchdog share (under one mutex).
pub(crate) struct Gate<E> {
    verdict: Option<Error>,
    abort: AbortStep,
    owner_in: bool,
    watch_in: bool,
    closed: bool,
    /// In the watchdog's list.
    registered: bool,
    seq: u64,
    /// Work in flight, oldest first.
    pub(crate) queue: VecDeque<InFlight<E>>,
    /// Events whose work finished, for the next calls.
    pub(crate) spare: Vec<E>,
}

impl<E> Default for Gate<E> {
    fn default() -> Self {
        Gate {
            verdict: None,
            abort: AbortStep::No,
            owner_in: false,
            watch_in: false,
            closed: false,
            registered: false,
            seq: 0,
            queue: VecDeque::new(),
            spare: Vec::new(),
        }
    }
}

/// What the watchdog does with a communicator this round.
pub(crate) enum Round<E> {
    /// The owner is inside NCCL: skip it this round.
    Skip,
    /// Closed or aborted: take it off the list.
    Leave,
    /// Inside: the work in flight, taken out to be looked at without the lock; hand it
    /// back with [`Gate::watch_end`].
    Go(VecDeque<InFlight<E>>),
}

impl<E> Gate<E> {
    /// The verdict, if the communicator failed.
    pub(crate) fn verdict(&self) -> Option<&Error> {
        self.verdict.as_ref()
    }

    /// Owner: before a call into NCCL on the handle.
    pub(crate) fn owner_enter(&mut self) -> Enter {
        if let Some(v) = &self.verdict {
            return Enter::Refused(v.clone());
        }
        if self.watch_in {
            return Enter::Busy;
        }
        // One owner: a `RankComm` is not `Sync`, and its calls and captures run on the
        // thread that holds it, one at a time.
        debug_assert!(!self.owner_in, "two owners inside one NCCL communicator");
        self.owner_in = true;
        Enter::Go
    }

    /// Owner: after its call. `true`: the owner takes the abort (a verdict came while it
    /// was inside).
    pub(crate) fn owner_leave(&mut self) -> bool {
        self.owner_in = false;
        self.take_abort(None)
    }

    /// Records a failure (the first one wins: it is what every later call returns).
    /// `who`: the caller's part if it is inside NCCL now. `true`: the caller takes the
    /// abort and must make it now (nobody else is inside).
    pub(crate) fn fail(&mut self, why: Error, who: Option<Who>) -> bool {
        if self.verdict.is_none() {
            self.verdict = Some(why);
        }
        if self.abort == AbortStep::No {
            self.abort = AbortStep::Asked;
        }
        self.take_abort(who)
    }

    fn take_abort(&mut self, who: Option<Who>) -> bool {
        let others_in = match who {
            Some(Who::Owner) => self.watch_in,
            None => self.owner_in || self.watch_in,
        };
        if self.abort == AbortStep::Asked && !others_in {
            self.abort = AbortStep::Taken;
            return true;
        }
        false
    }

    /// Owner's drop: from now on the watchdog lets go of the communicator.
    pub(crate) fn close(&mut self) -> Close {
        self.closed = true;
        if self.watch_in {
            return Close::Busy;
        }
        if self.verdict.is_some() {
            // Nobody is inside (the owner is dropping, the watchdog is out): any abort
            // asked was taken by the last to leave.
            debug_assert_eq!(self.abort, AbortStep::Taken);
            return Close::Aborted;
        }
        Close::Live
    }

    /// Owner: work in flight, recorded by `event` (already recorded on the stream after
    /// it). `true`: the communicator must be put on the watchdog's list. Once the
    /// communicator failed the event is only kept (not watched): it is destroyed with
    /// the communicator's state, never on the owner's thread while an abort may run
    /// (destroying an event could wait for the abort inside the driver).
    pub(crate) fn note_in_flight(&mut self, event: E, op: &'static str, now: Instant) -> bool {
        if self.verdict.is_some() || self.closed {
            self.spare.push(event);
            return false;
        }
        self.seq += 1;
        self.queue.push_back(InFlight {
            event,
            op,
            seq: self.seq,
            since: now,
        });
        !std::mem::replace(&mut self.registered, true)
    }

    /// Watchdog: the start of its round on this communicator.
    pub(crate) fn watch_begin(&mut self) -> Round<E> {
        if self.closed || self.verdict.is_some() {
            self.registered = false;
            return Round::Leave;
        }
        if self.owner_in {
            return Round::Skip;
        }
        self.watch_in = true;
        Round::Go(std::mem::take(&mut self.queue))
    }

    /// Watchdog: the end of its round. `rest`: the entries still running, oldest first;
    /// `done`: the events of finished ones; `verdict`: a failure it found. Returns
    /// `(take_abort, keep_watching)`.
    pub(crate) fn watch_end(
        &mut self,
        rest: VecDeque<InFlight<E>>,
        done: Vec<E>,
        verdict: Option<Error>,
        now: Instant,
    ) -> (bool, bool) {
        let finished_some = !done.is_empty();
        self.spare.extend(done);
        // Entries noted during the round go after the older ones.
        let newer = std::mem::replace(&mut self.queue, rest);
        self.queue.extend(newer);
        if finished_some && let Some(front) = self.queue.front_mut() {
            front.since = front.since.max(now);
        }
        self.watch_in = false;
        let take = match verdict {
            Some(v) => self.fail(v, None),
            None => self.take_abort(None),
        };
        let keep = self.verdict.is_none() && !self.closed && !self.queue.is_empty();
        if !keep {
            self.registered = false;
        }
        (take, keep)
    }
}

/// The watchdog's look at the work in flight: pops every finished entry (oldest first),
/// and returns, with their events, a [`Error::PeerTimeout`] if the oldest unfinished one
/// has run longer than `timeout`, or the error of a failed query.
pub(crate) fn scan<E>(
    queue: &mut VecDeque<InFlight<E>>,
    timeout: Duration,
    now: Instant,
    mut complete: impl FnMut(&E) -> Result<bool>,
) -> (Vec<E>, Option<Error>) {
    let mut done = Vec::new();
    while let Some(front) = queue.front_mut() {
        if !done.is_empty() {
            front.since = front.since.max(now);
        }
        match complete(&front.event) {
            Ok(true) => {
                if let Some(e) = queue.pop_front() {
                    done.push(e.event);
                }
            }
            Ok(false) => {
                let ran = now.saturating_duration_since(front.since);
                if ran > timeout {
                    return (
                        done,
                        Some(Error::PeerTimeout {
                            what: format!(
                                "NCCL {} (call #{} of this rank) to finish; gpubind's NCCL \
                                 watchdog aborted the communicator (ncclCommAbort): a peer \
                                 died, hangs, or never made the call",
                                front.op, front.seq
                            ),
                            ranks: Vec::new(),
                            after_ms: ran.as_millis().min(u128::from(u64::MAX)) as u64,
                        }),
                    );
                }
                return (done, None);
            }
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}
