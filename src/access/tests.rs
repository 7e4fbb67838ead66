//! Unit tests of the access state machine and the claims.

use super::state::PRUNE_READERS_AT;
use super::*;
use crate::error::Error;

#[derive(Clone, Debug, PartialEq)]
struct S(u64);
impl TrackedStream for S {
    fn id(&self) -> u64 {
        self.0
    }
    fn is_idle(&self) -> bool {
        self.0 >= 100
    }
}

fn commit1(st: &mut AccessState<S>, id: u64, a: Access) {
    let mut grave = Grave::new();
    st.commit(&[(id, a)], S, &mut grave);
}

/// The commit fast path agrees with `commit`: whenever it says "no change", a commit
/// changes nothing, and it says so for a stream reusing a buffer it alone holds. Every
/// state reachable in up to four commits over three streams (plus the idle 100s that
/// pruning drops) is checked against every next use.
#[test]
fn commit_fast_path_agrees_with_commit() {
    let uses: Vec<(u64, Access)> = [1, 2, 3]
        .into_iter()
        .flat_map(|id| [(id, Access::Read), (id, Access::Write)])
        .collect();
    let mut states = vec![AccessState::<S>::default()];
    let mut fast = 0;
    for _ in 0..4 {
        let mut next = Vec::new();
        for st in &states {
            for &(id, a) in &uses {
                let mut after = AccessState::with_uses(st.writers.clone(), st.readers.clone());
                commit1(&mut after, id, a);
                if st.commit_is_noop(id, a) {
                    fast += 1;
                    assert_eq!(
                        (&after.writers, &after.readers),
                        (&st.writers, &st.readers),
                        "fast path for {a:?} on {id} from {st:?}"
                    );
                }
                next.push(after);
            }
        }
        states = next;
    }
    // And the hand-off swap in `commit` gives what the general path gives.
    for st in &states {
        for &(id, a) in &uses {
            let fresh = || AccessState::with_uses(st.writers.clone(), st.readers.clone());
            let (mut fast_path, mut general) = (fresh(), fresh());
            commit1(&mut fast_path, id, a);
            general.commit_general(&[(id, a)], S, &mut Grave::new());
            assert_eq!(
                (&fast_path.writers, &fast_path.readers),
                (&general.writers, &general.readers),
                "{a:?} on {id} from {st:?}"
            );
        }
    }
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Write);
    assert!(st.commit_is_noop(1, Access::Write));
    assert!(st.commit_is_noop(1, Access::Read));
    assert!(!st.commit_is_noop(2, Access::Read));
    assert!(fast > 100, "the fast path was taken {fast} times");
}

fn conflicts(st: &AccessState<S>, on: u64, a: Access) -> Vec<u64> {
    let mut v = Vec::new();
    st.wait_conflicts(on, a, |s| {
        v.push(s.0);
        Ok(())
    })
    .unwrap();
    v
}

#[test]
fn same_stream_uses_need_no_wait() {
    let mut st = AccessState::<S>::default();
    assert!(st.is_ordered_on(1, Access::Write));
    commit1(&mut st, 1, Access::Write);
    assert!(st.is_ordered_on(1, Access::Write));
    assert!(st.is_ordered_on(1, Access::Read));
    commit1(&mut st, 1, Access::Read);
    assert!(
        st.readers.is_empty(),
        "a read on the writer's stream is ordered by it"
    );
}

#[test]
fn reads_wait_for_the_writer_only_and_stay_concurrent() {
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Write);
    assert_eq!(conflicts(&st, 2, Access::Read), [1]);
    commit1(&mut st, 2, Access::Read);
    assert_eq!(conflicts(&st, 3, Access::Read), [1]);
    commit1(&mut st, 3, Access::Read);
    assert_eq!(conflicts(&st, 4, Access::Write), [1, 2, 3]);
    assert_eq!(conflicts(&st, 2, Access::Write), [1, 3]);
    commit1(&mut st, 2, Access::Write);
    assert_eq!(AccessState::ids(&st.writers), [2]);
    assert!(st.readers.is_empty());
}

#[test]
fn a_claim_on_several_streams_keeps_every_write() {
    let mut st = AccessState::<S>::default();
    let mut grave = Grave::new();
    st.commit(
        &[(1, Access::Write), (2, Access::Write), (3, Access::Read)],
        S,
        &mut grave,
    );
    assert_eq!(AccessState::ids(&st.writers), [1, 2]);
    assert_eq!(AccessState::ids(&st.readers), [3]);
    // A host read waits for both writers.
    let mut synced = Vec::new();
    st.host_wait(
        Access::Read,
        |s| {
            synced.push(s.0);
            Ok(())
        },
        &mut grave,
    )
    .unwrap();
    assert_eq!(synced, [1, 2]);
    assert_eq!(AccessState::ids(&st.readers), [3]);
}

#[test]
fn host_waits_forget_what_they_waited_for_and_keep_it_on_failure() {
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Write);
    commit1(&mut st, 2, Access::Read);
    let mut grave = Grave::new();
    let e = st.host_wait(
        Access::Write,
        |_| Err(Error::InvalidArgument("mock".into())),
        &mut grave,
    );
    assert!(e.is_err());
    assert_eq!(
        AccessState::ids(&st.writers),
        [1],
        "nothing forgotten on failure"
    );
    st.host_wait(Access::Read, |_| Ok(()), &mut grave).unwrap();
    assert!(st.writers.is_empty());
    assert_eq!(
        AccessState::ids(&st.readers),
        [2],
        "a host read leaves device reads"
    );
    st.host_wait(Access::Write, |_| Ok(()), &mut grave).unwrap();
    assert!(st.is_idle());
}

#[test]
fn wait_all_tries_every_stream() {
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Write);
    commit1(&mut st, 2, Access::Read);
    commit1(&mut st, 3, Access::Read);
    let mut tried = Vec::new();
    let e = st.wait_all(|s| {
        tried.push(s.0);
        if s.0 == 1 {
            Err(Error::InvalidArgument("mock".into()))
        } else {
            Ok(())
        }
    });
    assert!(e.is_err());
    assert_eq!(tried, [1, 2, 3]);
    assert!(!st.is_idle());
}

#[test]
fn reads_become_writes_and_later_reads_wait_for_them() {
    // A module's launches on streams 1 and 2 (reads), then its first global view.
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Read);
    commit1(&mut st, 2, Access::Read);
    assert!(
        conflicts(&st, 3, Access::Read).is_empty(),
        "reads wait for no read"
    );
    st.reads_become_writes();
    assert_eq!(AccessState::ids(&st.writers), [1, 2]);
    assert!(st.readers.is_empty());
    // A host or stream read of the global now waits for both launches.
    assert_eq!(conflicts(&st, 3, Access::Read), [1, 2]);
    // A stream both wrote and read is kept once.
    let mut st = AccessState::<S>::default();
    commit1(&mut st, 1, Access::Write);
    commit1(&mut st, 2, Access::Read);
    st.reads_become_writes();
    assert_eq!(AccessState::ids(&st.writers), [1, 2]);
    let mut st = AccessState::<S>::default();
    st.commit(
        &[(1, Access::Write), (2, Access::Write)],
        S,
        &mut Grave::new(),
    );
    st.readers.push(S(2));
    st.reads_become_writes();
    assert_eq!(AccessState::ids(&st.writers), [1, 2]);
    assert!(st.readers.is_empty());
}

#[test]
fn idle_readers_are_pruned() {
    let mut st = AccessState::<S>::default();
    for id in 100..100 + PRUNE_READERS_AT as u64 {
        commit1(&mut st, id, Access::Read);
    }
    commit1(&mut st, 7, Access::Read);
    assert_eq!(AccessState::ids(&st.readers), [7]);
}

#[test]
fn sorting_merges_one_tracker_used_many_times() {
    let (a, b) = (AccessTracker::default(), AccessTracker::default());
    let mut uses = [
        Some((&a, Access::Write)),
        Some((&b, Access::Read)),
        Some((&a, Access::Read)),
        Some((&a, Access::Read)),
        None,
        Some((&b, Access::Read)),
        Some((&a, Access::Read)),
    ];
    sort_and_merge(&mut uses);
    let kept: Vec<_> = uses.iter().flatten().collect();
    assert_eq!(kept.len(), 2, "one entry per tracker");
    assert!(
        kept.iter()
            .any(|(t, x)| std::ptr::eq(*t, &a) && *x == Access::Write)
    );
    assert!(
        kept.iter()
            .any(|(t, x)| std::ptr::eq(*t, &b) && *x == Access::Read)
    );
    // And locking them does not deadlock.
    let mut held = locks::<7>();
    lock_all(&mut uses, &mut held);
    assert_eq!(held.iter().flatten().count(), 2);
}

#[test]
fn sorting_merges_one_tracker_used_twice() {
    let (a, b) = (AccessTracker::default(), AccessTracker::default());
    let mut uses = [
        Some((&b, Access::Read)),
        Some((&a, Access::Read)),
        None,
        Some((&b, Access::Write)),
    ];
    sort_and_merge(&mut uses);
    let n = uses.iter().flatten().count();
    assert_eq!(n, 2);
    assert!(
        uses.iter()
            .flatten()
            .any(|(t, x)| std::ptr::eq(*t, &b) && *x == Access::Write)
    );
}
