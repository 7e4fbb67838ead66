//! Where the threads of the 1:1 pattern meet: each rank posts its part of a call, the
//! last to arrive enqueues the whole collective on every rank's stream, and all return
//! its outcome. The others block meanwhile, which keeps their streams and buffers (the
//! borrows their calls hold) alive until everything is enqueued.
//!
//! No wait is unbounded: a party waits at most its timeout, then withdraws its post and
//! returns [`Error::PeerTimeout`] naming the ranks that did not come; the meeting set is
//! then *broken* (the ranks are out of step) and every waiting and later meeting returns
//! that error at once. A rank that leaves ([`Meeting::depart`]: its `RankComm` dropped,
//! its thread panicking) fails every meeting it is a party of with
//! [`Error::PeerFailed`] naming it, at once.
//!
//! Posts are only touched under the lock: the last arrival takes them and runs the
//! collective holding it, and a party withdraws its post (on a timeout or a failure)
//! holding it. So a post is either used by a run that its party waits for, or taken
//! back unused before its party returns.

use crate::collective::support::lock;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Which meeting: the communicator's collectives, or the sends from `.0` to `.1`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Key {
    Coll,
    Pair(usize, usize),
}

impl Key {
    fn describe(&self) -> String {
        match self {
            Key::Coll => "the collective".to_owned(),
            Key::Pair(s, d) => format!("the send from rank {s} to rank {d}"),
        }
    }
}

struct Table<P> {
    generation: u64,
    posts: Vec<Option<P>>,
    arrived: usize,
    outcome: Result<()>,
}

struct State<P> {
    tables: HashMap<Key, Table<P>>,
    /// Ranks that left, with why.
    departed: HashMap<usize, String>,
    /// Set by the first timeout: the ranks are out of step for good.
    broken: Option<Error>,
}

/// A set of meetings with a fixed number of parties each.
pub(crate) struct Meeting<P> {
    state: Mutex<State<P>>,
    wake: Condvar,
}

impl<P> Meeting<P> {
    pub(crate) fn new() -> Self {
        Meeting {
            state: Mutex::new(State {
                tables: HashMap::new(),
                departed: HashMap::new(),
                broken: None,
            }),
            wake: Condvar::new(),
        }
    }

    /// Rank `rank` leaves for good (`why`, e.g. "its RankComm was dropped"): every
    /// meeting it is a party of fails with [`Error::PeerFailed`], now and later.
    pub(crate) fn depart(&self, rank: usize, why: &str) {
        let mut state = lock(&self.state);
        state.departed.entry(rank).or_insert_with(|| why.to_owned());
        drop(state);
        self.wake.notify_all();
    }

    /// Posts `post` as party `slot` of the meeting at `key`, whose parties are the
    /// ranks `ranks` (slot `i` is rank `ranks[i]`), and waits for the others, at most
    /// `timeout`; the last to arrive runs `run` on all posts (in slot order) while the
    /// others wait.
    pub(crate) fn meet(
        &self,
        key: Key,
        ranks: &[usize],
        slot: usize,
        post: P,
        timeout: Duration,
        run: impl FnOnce(Vec<P>) -> Result<()>,
    ) -> Result<()> {
        let parties = ranks.len();
        // Before posting: nothing after the post may panic without withdrawing it (a
        // `Duration::MAX` timeout, "wait for ever", would overflow `Instant + timeout`).
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        let mut state = lock(&self.state);
        if let Some(e) = &state.broken {
            return Err(e.clone());
        }
        if let Some(e) = departed_party(&state, ranks, slot, None) {
            return Err(e);
        }
        let table = state.tables.entry(key).or_insert_with(|| Table {
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
        // Wait for the run. If anything in the wait panics, the post is withdrawn before
        // the panic goes on: the caller's buffers (whose pointers and trackers the post
        // holds) are freed by the unwind, so no later arrival may run it.
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            self.wait_for_run(state, key, ranks, slot, generation, started, deadline)
        }));
        match waited {
            Ok(outcome) => outcome,
            Err(panic) => {
                let mut state = lock(&self.state);
                withdraw(&mut state, key, slot);
                drop(state);
                self.wake.notify_all();
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The waiting part of [`meet`](Self::meet), with the post in place: returns the run's
    /// outcome, or an error after withdrawing the post.
    #[allow(clippy::too_many_arguments)]
    fn wait_for_run(
        &self,
        mut state: std::sync::MutexGuard<'_, State<P>>,
        key: Key,
        ranks: &[usize],
        slot: usize,
        generation: u64,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let parties = ranks.len();
        loop {
            state = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(state, left)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            };
            // Done (even if something failed since: the run used our post).
            if let Some(t) = state.tables.get(&key)
                && t.generation != generation
            {
                return t.outcome.clone();
            }
            let failure = if let Some(e) = &state.broken {
                Some(e.clone())
            } else if let Some(e) = departed_party(&state, ranks, slot, Some(key)) {
                Some(e)
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                let missing = state.tables.get(&key).map_or_else(Vec::new, |t| {
                    (0..parties)
                        .filter(|&i| i != slot && t.posts[i].is_none())
                        .map(|i| ranks[i])
                        .collect()
                });
                let e = Error::PeerTimeout {
                    what: format!(
                        "the other ranks to join {} (the communicator's ranks are out of step now: every later call fails with this error)",
                        key.describe()
                    ),
                    ranks: missing,
                    after_ms: started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64,
                };
                state.broken = Some(e.clone());
                Some(e)
            } else {
                None
            };
            if let Some(e) = failure {
                // Withdraw the post: nobody will run it now.
                withdraw(&mut state, key, slot);
                drop(state);
                self.wake.notify_all();
                return Err(e);
            }
        }
    }
}

/// Takes party `slot`'s post back out of the meeting at `key`, if it is still there (not
/// yet taken by a run).
fn withdraw<P>(state: &mut State<P>, key: Key, slot: usize) {
    if let Some(t) = state.tables.get_mut(&key)
        && let Some(p) = t.posts.get_mut(slot)
        && p.take().is_some()
    {
        t.arrived -= 1;
    }
}

/// The error for a party of `ranks` (other than `slot`) that departed without posting
/// (to the meeting at `key`, when given).
fn departed_party<P>(
    state: &State<P>,
    ranks: &[usize],
    slot: usize,
    key: Option<Key>,
) -> Option<Error> {
    ranks.iter().enumerate().find_map(|(i, r)| {
        if i == slot {
            return None;
        }
        let why = state.departed.get(r)?;
        let posted = key
            .and_then(|k| state.tables.get(&k))
            .is_some_and(|t| t.posts.get(i).is_some_and(Option::is_some));
        (!posted).then(|| Error::PeerFailed {
            rank: *r,
            reason: why.clone(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const LONG: Duration = Duration::from_secs(60);

    /// `Duration::MAX` ("wait for ever") is a timeout like any other: no `Instant`
    /// overflow (which used to panic after the post was in the table, leaving it there
    /// for a later arrival to run on freed buffers), and the meeting completes.
    #[test]
    fn duration_max_waits_without_overflow() {
        let m = Meeting::<usize>::new();
        let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|slot| {
                    let m = &m;
                    s.spawn(move || {
                        if slot == 1 {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        m.meet(Key::Coll, &[0, 1], slot, slot, Duration::MAX, |posts| {
                            assert_eq!(posts, vec![0, 1]);
                            Ok(())
                        })
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    }

    /// A withdrawn post is gone for the next run, and withdrawing twice (or a post a run
    /// already took) changes nothing.
    #[test]
    fn withdraw_takes_back_only_a_post_still_there() {
        let m = Meeting::<&'static str>::new();
        let mut state = lock(&m.state);
        state.tables.insert(
            Key::Coll,
            Table {
                generation: 0,
                posts: vec![Some("stale"), None],
                arrived: 1,
                outcome: Ok(()),
            },
        );
        withdraw(&mut state, Key::Coll, 0);
        withdraw(&mut state, Key::Coll, 0);
        withdraw(&mut state, Key::Coll, 1);
        let t = &state.tables[&Key::Coll];
        assert_eq!((t.posts.clone(), t.arrived), (vec![None, None], 0));
    }

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
                            m.meet(Key::Coll, &[0, 1, 2, 3], slot, slot * 10, LONG, |posts| {
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
            let h = s.spawn(|| m.meet(Key::Pair(0, 1), &[0, 1], 0, 1, LONG, |_| Ok(())));
            // Wait until slot 0 is taken, then try it again from here.
            loop {
                let taken = lock(&m.state)
                    .tables
                    .get(&Key::Pair(0, 1))
                    .is_some_and(|t| t.arrived == 1);
                if taken {
                    break;
                }
                std::thread::yield_now();
            }
            assert!(matches!(
                m.meet(Key::Pair(0, 1), &[0, 1], 0, 2, LONG, |_| Ok(())),
                Err(Error::InvalidArgument(_))
            ));
            m.meet(Key::Pair(0, 1), &[0, 1], 1, 3, LONG, |posts| {
                assert_eq!(posts, vec![1, 3]);
                Ok(())
            })
            .unwrap();
            h.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_missing_rank_times_out_naming_it_and_breaks_the_set() {
        let m = Meeting::<u8>::new();
        let ran = AtomicUsize::new(0);
        let t0 = Instant::now();
        let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = [0usize, 2]
                .into_iter()
                .map(|slot| {
                    let (m, ran) = (&m, &ran);
                    s.spawn(move || {
                        m.meet(
                            Key::Coll,
                            &[0, 1, 2],
                            slot,
                            0,
                            Duration::from_millis(200),
                            |_| {
                                ran.fetch_add(1, Ordering::SeqCst);
                                Ok(())
                            },
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        for o in &outcomes {
            match o {
                Err(Error::PeerTimeout { ranks, .. }) => assert!(ranks.contains(&1), "{o:?}"),
                other => panic!("{other:?}"),
            }
        }
        // Late rank 1 and any later meeting: the same error at once, nothing run.
        let t1 = Instant::now();
        let late = m.meet(Key::Coll, &[0, 1, 2], 1, 0, LONG, |_| Ok(()));
        assert!(matches!(late, Err(Error::PeerTimeout { .. })), "{late:?}");
        let pair = m.meet(Key::Pair(0, 2), &[0, 2], 0, 0, LONG, |_| Ok(()));
        assert!(matches!(pair, Err(Error::PeerTimeout { .. })), "{pair:?}");
        assert!(t1.elapsed() < Duration::from_secs(1));
        // Both withdrew their posts.
        assert_eq!(lock(&m.state).tables[&Key::Coll].arrived, 0);
    }

    #[test]
    fn a_departed_rank_fails_its_meetings_at_once() {
        let m = Meeting::<u8>::new();
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let waiting = s.spawn(|| m.meet(Key::Coll, &[0, 1], 0, 0, LONG, |_| Ok(())));
            // Let it post, then rank 1 leaves.
            while lock(&m.state)
                .tables
                .get(&Key::Coll)
                .is_none_or(|t| t.arrived == 0)
            {
                std::thread::yield_now();
            }
            m.depart(1, "its RankComm was dropped");
            let got = waiting.join().unwrap();
            assert_eq!(
                got,
                Err(Error::PeerFailed {
                    rank: 1,
                    reason: "its RankComm was dropped".into()
                })
            );
        });
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Later meetings with rank 1 fail at once; meetings without it still work.
        assert!(matches!(
            m.meet(Key::Pair(0, 1), &[0, 1], 0, 0, LONG, |_| Ok(())),
            Err(Error::PeerFailed { rank: 1, .. })
        ));
        std::thread::scope(|s| {
            let h = s.spawn(|| m.meet(Key::Pair(0, 2), &[0, 2], 0, 5, LONG, |_| Ok(())));
            m.meet(Key::Pair(0, 2), &[0, 2], 1, 6, LONG, |posts| {
                assert_eq!(posts, vec![5, 6]);
                Ok(())
            })
            .unwrap();
            h.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_panicking_run_fails_every_party() {
        let m = Meeting::<u8>::new();
        let outcomes: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|slot| {
                    let m = &m;
                    s.spawn(move || {
                        m.meet(Key::Coll, &[0, 1], slot, 0, LONG, |_| panic!("enqueue bug"))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for o in outcomes {
            assert!(matches!(o, Err(Error::InvalidArgument(ref m)) if m.contains("panicked")));
        }
    }
}
