//! The gate of an NCCL rank ([`Gate`]): what every launch of a graph holding the rank's
//! captured collectives goes through (the rank's call check, locked for the launch; the
//! watchdog's verdict; a failed capture), and the count of such graphs alive.

use super::watchdog::Watched;
use crate::collective::callcheck::CallCheck;
use crate::error::{Error, Result};
use crate::graph::{LaunchAgreement, LaunchTurn};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// What every launch of a graph holding an NCCL rank's captured collectives goes
/// through (one per NCCL `RankComm`; the graph borrows it with the `RankComm`).
#[derive(Default)]
pub(super) struct Gate {
    /// The rank's call check (`None`: not checked). Eager calls reach it through
    /// `&mut` (no lock); captures and graph launches, through a shared borrow, lock it.
    pub(super) check: Mutex<Option<CallCheck>>,
    /// Set once an NCCL call made through a shared borrow (a capture) failed: the
    /// communicator may have been aborted (`ncclCommAbort` frees it), so no graph of it
    /// may launch again.
    pub(super) failed: AtomicBool,
    /// How many graphs and executable graphs holding the rank's captured collectives
    /// live. Once the `RankComm` is no longer borrowed, any left were forgotten
    /// (`mem::forget`): NCCL destroys, finalizes or aborts a communicator only after
    /// every graph that captured it is destroyed, so the drop leaks it instead of
    /// waiting for ever (see [`Gate::forgotten_graphs`]).
    pub(super) graphs: AtomicUsize,
    /// The communicator's watchdog state, set at the first capture (the communicator
    /// may be made lazily, after this gate): a launch is refused once the watchdog (or
    /// a failed call) aborted the communicator, and each launch is handed to the
    /// watchdog as work in flight, like an eager call.
    pub(super) watch: OnceLock<Arc<Watched>>,
}

impl Gate {
    /// The check, for an eager call (which holds the `RankComm` mutably: no lock).
    pub(super) fn check_mut(&mut self) -> &mut Option<CallCheck> {
        self.check.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many graphs of the rank's collectives still live. Called with the `RankComm`
    /// held mutably (its drop): no graph borrows it any more, so these were forgotten.
    pub(super) fn forgotten_graphs(&mut self) -> usize {
        *self.graphs.get_mut()
    }
}

impl LaunchAgreement for Gate {
    fn turn(&self) -> Box<dyn LaunchTurn + '_> {
        Box::new(GateTurn {
            gate: self,
            check: self.check.lock().unwrap_or_else(PoisonError::into_inner),
        })
    }

    fn launched(&self, stream: &crate::stream::BoundStream<'_>) {
        if let Some(w) = self.watch.get() {
            w.note_launch(stream, "collectives of a graph launch");
        }
    }

    fn retain(&self) {
        self.graphs.fetch_add(1, Ordering::Relaxed);
    }

    fn release(&self) {
        self.graphs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One launch's turn through a rank's [`Gate`]: its call check, locked until the launch
/// is enqueued (or refused).
struct GateTurn<'a> {
    gate: &'a Gate,
    pub(super) check: MutexGuard<'a, Option<CallCheck>>,
}

impl GateTurn<'_> {
    /// `e`, told to the peers first when the rank checks its calls.
    fn tell(&mut self, e: Error) -> Error {
        match self.check.as_mut() {
            Some(c) => c.fail(e),
            None => e,
        }
    }
}

impl LaunchTurn for GateTurn<'_> {
    fn agree(&mut self, record: &[u8]) -> Result<()> {
        if self.gate.failed.load(Ordering::Acquire) {
            // The peers learn it at this launch instead of waiting for this rank.
            return Err(self.tell(Error::InvalidArgument(
                "an NCCL call of this rank failed during a later capture, and its \
                 communicator may have been aborted: graphs of it no longer launch (make a \
                 new communicator and capture again)"
                    .into(),
            )));
        }
        // Aborted by the watchdog (a peer failed, a call outlived its timeout): the
        // communicator's verdict, as its eager calls return it; nothing is enqueued.
        if let Some(v) = self.gate.watch.get().and_then(|w| w.verdict()) {
            return Err(self.tell(v));
        }
        match self.check.as_mut() {
            Some(c) => c.agree_launch(record),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        // The peers were told to go ahead: their next collective learns it through the
        // check, and those already waiting in this launch on the GPU are helped by this
        // rank's communicator going away (aborted on a thread of its own: NCCL's remote
        // error reaches peers over network transports; otherwise their watchdogs end
        // the wait at their timeout).
        if let Some(w) = self.gate.watch.get() {
            let _ = w.fail(e.clone(), false);
        }
        self.tell(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate that refuses every launch: nothing is enqueued, and the error says why.
    #[test]
    fn a_failed_gate_launches_nothing() {
        let gate = Gate::default();
        assert!(gate.turn().agree(&[]).is_ok());
        gate.failed.store(true, Ordering::Release);
        let e = gate.turn().agree(&[]).unwrap_err();
        assert!(e.to_string().contains("no longer launch"), "{e}");
    }
}
