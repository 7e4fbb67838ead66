//! Where the threads of the 1:1 pattern meet: each rank posts its part of a call, the
//! last to arrive enqueues the whole collective on every rank's stream, and all return
//! its outcome. The others block meanwhile, which keeps their streams and buffers (the
//! borrows their calls hold) alive until everything is enqueued.

use super::lock;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

/// Which meeting: the communicator's collectives, or the sends from `.0` to `.1`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Key {
    Coll,
    Pair(usize, usize),
}

struct Table<P> {
    generation: u64,
    posts: Vec<Option<P>>,
    arrived: usize,
    outcome: Result<()>,
}

/// A set of meetings with a fixed number of parties each.
pub(crate) struct Meeting<P> {
    state: Mutex<HashMap<Key, Table<P>>>,
    wake: Condvar,
}

impl<P> Meeting<P> {
    pub(crate) fn new() -> Self {
        Meeting {
            state: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
        }
    }

    /// Posts `post` as party `slot` of `parties` at `key` and waits for the others; the
    /// last to arrive runs `run` on all posts (in slot order) while the others wait.
    pub(crate) fn meet(
        &self,
        key: Key,
        parties: usize,
        slot: usize,
        post: P,
        run: impl FnOnce(Vec<P>) -> Result<()>,
    ) -> Result<()> {
        let mut state = lock(&self.state);
        let table = state.entry(key).or_insert_with(|| Table {
            generation: 0,
            posts: (0..parties).map(|_| None).collect(),
            arrived: 0,
            outcome: Ok(()),
        });
        match table.posts.get_mut(slot) {
            Some(p @ None) => *p = Some(post),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "party {slot} joined meeting {key:?} twice or is out of range"
                )));
            }
        }
        table.arrived += 1;
        let generation = table.generation;
        if table.arrived == parties {
            let posts: Vec<P> = table.posts.iter_mut().filter_map(Option::take).collect();
            table.arrived = 0;
            // A panic in `run` must still wake the other parties (with an error), or they
            // would wait forever.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(posts)))
                .unwrap_or_else(|_| {
                    Err(Error::InvalidArgument(
                        "a collective panicked while being enqueued for all ranks".into(),
                    ))
                });
            table.outcome = outcome.clone();
            table.generation += 1;
            self.wake.notify_all();
            return outcome;
        }
        loop {
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(t) = state.get(&key)
                && t.generation != generation
            {
                return t.outcome.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn last_arrival_runs_once_and_all_see_the_outcome() {
        let m = Meeting::<usize>::new();
        let runs = AtomicUsize::new(0);
        for round in 0..3 {
            let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|slot| {
                        let (m, runs) = (&m, &runs);
                        s.spawn(move || {
                            m.meet(Key::Coll, 4, slot, slot * 10, |posts| {
                                runs.fetch_add(1, Ordering::SeqCst);
                                assert_eq!(posts, vec![0, 10, 20, 30]);
                                if round == 1 {
                                    Err(Error::InvalidArgument("round 1".into()))
                                } else {
                                    Ok(())
                                }
                            })
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for o in outcomes {
                assert_eq!(o.is_err(), round == 1);
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn joining_twice_is_an_error() {
        let m = Meeting::<u8>::new();
        std::thread::scope(|s| {
            let h = s.spawn(|| m.meet(Key::Pair(0, 1), 2, 0, 1, |_| Ok(())));
            // Wait until slot 0 is taken, then try it again from here.
            loop {
                let taken = lock(&m.state)
                    .get(&Key::Pair(0, 1))
                    .is_some_and(|t| t.arrived == 1);
                if taken {
                    break;
                }
                std::thread::yield_now();
            }
            assert!(matches!(
                m.meet(Key::Pair(0, 1), 2, 0, 2, |_| Ok(())),
                Err(Error::InvalidArgument(_))
            ));
            m.meet(Key::Pair(0, 1), 2, 1, 3, |posts| {
                assert_eq!(posts, vec![1, 3]);
                Ok(())
            })
            .unwrap();
            h.join().unwrap().unwrap();
        });
    }
}
