//! Loom model of the gate (declared in `mod.rs`, `cfg(all(test, loom))`): the owner's
//! calls, a failure and its drop racing the watchdog's rounds.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom`.

use super::*;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;

/// Who is inside NCCL on the mock communicator, and how often it was aborted or
/// destroyed.
#[derive(Default)]
struct Handle {
    inside: AtomicUsize,
    aborts: AtomicUsize,
    destroys: AtomicUsize,
}

impl Handle {
    /// A call into NCCL: nobody else may be inside, and the handle must be live.
    fn call(&self) {
        assert_eq!(
            self.inside.fetch_add(1, SeqCst),
            0,
            "two parties inside NCCL"
        );
        assert_eq!(
            self.aborts.load(SeqCst),
            0,
            "a call on an aborted communicator"
        );
        assert_eq!(self.destroys.load(SeqCst), 0, "a call on a destroyed one");
        self.inside.fetch_sub(1, SeqCst);
    }
    fn abort(&self) {
        assert_eq!(self.inside.load(SeqCst), 0, "abort while someone is inside");
        assert_eq!(self.aborts.fetch_add(1, SeqCst), 0, "aborted twice");
    }
}

fn err() -> Error {
    Error::NoNccl
}

/// How the owner fails in the model.
#[derive(Clone, Copy, PartialEq)]
enum OwnerFails {
    /// Its call succeeds.
    No,
    /// Inside its call (NCCL's error, an enqueue's timeout).
    Inside,
    /// From outside the gate (a `Communicator` aborting, the drop's wait failing).
    Outside,
}

/// The owner: one call (which may fail inside), or a failure from outside, then its drop.
/// The watchdog: two rounds, the second of which finds a failure. Every interleaving:
/// nobody is ever inside NCCL with another party or after the abort, the abort happens
/// exactly once when a failure was seen, and a communicator aborted is never destroyed.
#[test]
fn loom_watchdog_gate_aborts_once_and_never_under_a_call() {
    for owner_fails in [OwnerFails::No, OwnerFails::Inside, OwnerFails::Outside] {
        loom::model(move || {
            let gate = Arc::new(sync::Mutex::new(Gate::<u32>::default()));
            let h = Arc::new(Handle::default());
            let _ = sync::lock(&gate).note_in_flight(1, "all_reduce", Instant::now());
            let watch = {
                let (gate, h) = (Arc::clone(&gate), Arc::clone(&h));
                thread::spawn(move || {
                    for round in 0..2 {
                        let q = match sync::lock(&gate).watch_begin() {
                            Round::Go(q) => q,
                            Round::Skip => continue,
                            Round::Leave => return,
                        };
                        h.call();
                        let verdict = (round == 1).then(err);
                        let (take, _) =
                            sync::lock(&gate).watch_end(q, Vec::new(), verdict, Instant::now());
                        if take {
                            h.abort();
                        }
                    }
                })
            };
            if owner_fails == OwnerFails::Outside && sync::lock(&gate).fail(err(), None) {
                h.abort();
            }
            // The owner's call.
            let entered = loop {
                match sync::lock(&gate).owner_enter() {
                    Enter::Go => break true,
                    Enter::Refused(_) => break false,
                    Enter::Busy => thread::yield_now(),
                }
            };
            if entered {
                h.call();
                let take = if owner_fails == OwnerFails::Inside {
                    sync::lock(&gate).fail(err(), Some(Who::Owner))
                } else {
                    false
                };
                let take = sync::lock(&gate).owner_leave() || take;
                if take {
                    h.abort();
                }
            }
            // The drop.
            let closed = loop {
                match sync::lock(&gate).close() {
                    Close::Busy => thread::yield_now(),
                    other => break other,
                }
            };
            if closed == Close::Live {
                h.call(); // finalize
                h.destroys.fetch_add(1, SeqCst);
            }
            watch.join().unwrap();
            let aborts = h.aborts.load(SeqCst);
            let destroys = h.destroys.load(SeqCst);
            assert_eq!(
                aborts + destroys,
                1,
                "aborted {aborts}, destroyed {destroys}"
            );
            if owner_fails == OwnerFails::Outside || (owner_fails == OwnerFails::Inside && entered)
            {
                assert_eq!(aborts, 1);
            }
        });
    }
}
