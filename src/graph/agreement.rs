//! Launch agreements: how a launch of a graph holding NCCL ranks' captured collectives
//! first agrees with every rank's peers.

use crate::error::{Error, Result};
use crate::stream::BoundStream;

/// What a launch of a graph holding a rank's captured NCCL collectives does first
/// (feature `nccl`): agree with the rank's peers that they launch the graph of the same
/// collective capture, then enqueue — under a lock of the rank's, so the rank's launches
/// reach the device in the order they agreed. `Err` enqueues nothing.
///
/// A graph may hold the collectives of several ranks (communicators). A launch takes
/// their locks in address order (one order for every thread of the process), then agrees
/// through each in *capture* order (the order in which the graph first used each, the
/// same on every rank: collectives of several communicators on one stream must be issued
/// in one order by all ranks anyway); addresses differ between processes, so agreeing in
/// address order could have two processes wait on each other's rank 0 until the
/// timeout. See [`agreed`].
pub(crate) trait LaunchAgreement: Sync {
    /// This rank's turn to launch: holds the rank's launch lock until it drops (no other
    /// launch through the rank agrees meanwhile).
    fn turn(&self) -> Box<dyn LaunchTurn + '_>;

    /// The graph was just enqueued on `stream` (with every turn held): the rank records
    /// it as its work in flight (its NCCL watchdog times it). Infallible: the launch is
    /// enqueued already.
    fn launched(&self, stream: &BoundStream<'_>);

    /// One more graph or executable graph holds this gate (NCCL does not destroy a
    /// communicator while a graph that captured it lives: the rank's drop needs to know
    /// whether one was forgotten).
    fn retain(&self);

    /// [`retain`](Self::retain)'s graph is gone.
    fn release(&self);
}

/// One rank's part in one launch (see [`LaunchAgreement::turn`]).
pub(crate) trait LaunchTurn {
    /// Refuses the launch (the rank cannot launch: its error, which its peers are told
    /// too), or agrees on it with the peers: `record` is what the rank's collectives in
    /// the graph agreed at capture.
    fn agree(&mut self, record: &[u8]) -> Result<()>;

    /// A failure after this rank agreed (another rank's refusal, the claim, the enqueue):
    /// the peers were told to go ahead and may be waiting in the launch; tell them, and
    /// return the launch's error.
    fn fail(&mut self, e: Error) -> Error;
}

/// Runs `launch` once every gate of `gates` agreed: takes their turns (locks) in
/// address order, agrees through them in the order given (capture order), then launches.
/// A refusal, or a launch that fails, is told to the ranks that had agreed (all of them,
/// for a failed launch).
pub(super) fn agreed(
    gates: &[(&dyn LaunchAgreement, Vec<u8>)],
    launch: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let key = |g: &dyn LaunchAgreement| g as *const dyn LaunchAgreement as *const () as usize;
    let mut by_address: Vec<usize> = (0..gates.len()).collect();
    by_address.sort_by_key(|&i| key(gates[i].0));
    let mut turns: Vec<Option<Box<dyn LaunchTurn + '_>>> = gates.iter().map(|_| None).collect();
    for i in by_address {
        turns[i] = Some(gates[i].0.turn());
    }
    let mut turns: Vec<Box<dyn LaunchTurn + '_>> = turns.into_iter().flatten().collect();
    for (i, (_, record)) in gates.iter().enumerate() {
        if let Err(e) = turns[i].agree(record) {
            return Err(turns[..i].iter_mut().fold(e, |e, t| t.fail(e)));
        }
    }
    launch().map_err(|e| turns.iter_mut().fold(e, |e, t| t.fail(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::uses::Uses;

    /// What the test gates saw, in order, across all of them: `(gate, event)`.
    type Journal = std::sync::Mutex<Vec<(u8, String)>>;

    /// A launch agreement that logs what it was asked and may refuse.
    struct Gate<'j> {
        name: u8,
        refuse: bool,
        journal: &'j Journal,
        held: std::sync::atomic::AtomicUsize,
    }

    struct Turn<'a, 'j>(&'a Gate<'j>);

    impl Drop for Turn<'_, '_> {
        fn drop(&mut self) {
            self.0.note("unlock".into());
        }
    }

    impl LaunchTurn for Turn<'_, '_> {
        fn agree(&mut self, record: &[u8]) -> Result<()> {
            self.0.note(format!("agree {record:?}"));
            if self.0.refuse {
                return Err(Error::InvalidArgument(format!(
                    "gate {} refused",
                    self.0.name
                )));
            }
            Ok(())
        }

        fn fail(&mut self, e: Error) -> Error {
            self.0.note("told".into());
            e
        }
    }

    impl Gate<'_> {
        fn note(&self, what: String) {
            self.journal.lock().unwrap().push((self.name, what));
        }
    }

    impl LaunchAgreement for Gate<'_> {
        fn turn(&self) -> Box<dyn LaunchTurn + '_> {
            self.note("lock".into());
            Box::new(Turn(self))
        }

        fn launched(&self, _: &BoundStream<'_>) {}

        fn retain(&self) {
            self.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }

        fn release(&self) {
            self.held.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn gate(name: u8, refuse: bool, journal: &Journal) -> Gate<'_> {
        Gate {
            name,
            refuse,
            journal,
            held: Default::default(),
        }
    }

    /// The events of `journal` (taken), as `"gate:event"` strings.
    fn events(journal: &Journal) -> Vec<String> {
        std::mem::take(&mut *journal.lock().unwrap())
            .into_iter()
            .map(|(g, e)| format!("{g}:{e}"))
            .collect()
    }

    #[test]
    fn agreements_lock_in_address_order_and_agree_in_capture_order() {
        let journal = Journal::default();
        let (a, b) = (gate(1, false, &journal), gate(2, false, &journal));
        let addr = |g: &dyn LaunchAgreement| g as *const dyn LaunchAgreement as *const () as usize;
        // `low` has the lower address; the graph uses `high` first.
        let (low, high) = if addr(&a) < addr(&b) {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let mut u = Uses::default();
        u.add_agreement(high, &[10]);
        u.add_agreement(low, &[20]);
        u.add_agreement(high, &[30, 31]);
        assert_eq!(u.agreements.len(), 2, "one entry per gate");
        let mut launched = 0;
        agreed(&u.agreements, &mut || {
            launched += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(launched, 1);
        let (l, h) = (low.name, high.name);
        assert_eq!(
            events(&journal)[..4],
            [
                format!("{l}:lock"),
                format!("{h}:lock"),
                format!("{h}:agree [10, 30, 31]"),
                format!("{l}:agree [20]"),
            ]
        );
        // Every live `Uses` holding a gate counts once in it (a graph and each
        // executable graph instantiated from it); a leaked graph handle keeps its count.
        let held = |g: &Gate| g.held.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((held(&a), held(&b)), (1, 1));
        let exec = u.clone();
        assert_eq!((held(&a), held(&b)), (2, 2));
        drop(u);
        assert_eq!((held(&a), held(&b)), (1, 1));
        let mut leaked = exec;
        leaked.keep_counted();
        drop(leaked);
        assert_eq!((held(&a), held(&b)), (1, 1));
    }

    #[test]
    fn a_refusal_or_a_failed_launch_is_told_to_the_ranks_that_agreed() {
        let journal = Journal::default();
        let (c, d, e) = (
            gate(3, false, &journal),
            gate(4, true, &journal),
            gate(5, false, &journal),
        );
        // Capture order c, d, e: d refuses, so c (agreed) is told, e never agrees.
        let mut u = Uses::default();
        for g in [&c, &d, &e] {
            u.add_agreement(g, &[]);
        }
        let mut launched = 0;
        let err = agreed(&u.agreements, &mut || {
            launched += 1;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(launched, 0);
        assert!(err.to_string().contains("gate 4 refused"), "{err}");
        let ev = events(&journal);
        assert!(ev.contains(&"3:told".to_string()), "{ev:?}");
        assert!(!ev.contains(&"5:agree []".to_string()), "{ev:?}");
        assert!(!ev.contains(&"4:told".to_string()), "{ev:?}");
        assert_eq!(ev.iter().filter(|x| x.ends_with(":unlock")).count(), 3);
        // Every rank agrees, then the launch fails: all are told.
        let (f, g) = (gate(6, false, &journal), gate(7, false, &journal));
        let mut u = Uses::default();
        u.add_agreement(&f, &[]);
        u.add_agreement(&g, &[]);
        let err = agreed(&u.agreements, &mut || {
            Err(Error::InvalidArgument("claim failed".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("claim failed"));
        let ev = events(&journal);
        assert!(ev.contains(&"6:told".to_string()) && ev.contains(&"7:told".to_string()));
    }
}
