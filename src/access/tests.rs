//! Unit tests of the access state machine and the claims.

use super::fast::{self, NONE as NONE_ID, READ_SLOTS};
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
        // The 100s, and stream 3 (a published reader that pruning may drop).
        self.0 >= 100 || self.0 == 3
    }
    fn under_gate(&self, f: impl FnOnce()) {
        // One thread: nothing to exclude; the gates taken are logged for the checks of
        // the fast path's rules.
        GATES.with(|g| g.borrow_mut().push(self.0));
        f();
    }
}

thread_local! {
    /// The streams whose gate `S::under_gate` took, in order.
    static GATES: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A new allocation's tracker publishes what `reset_mut` publishes for its state (it is
/// built directly, without `reset_mut`).
#[test]
fn a_new_allocation_publishes_what_reset_mut_would() {
    for on in [1, 7, fast::NONE - 1] {
        let st = AccessState::written_by_id(S(on), on);
        let mut reset = Published::default();
        reset.reset_mut(&st, Some(on));
        assert_eq!(Published::sole_writer(on).ids(), reset.ids());
        assert!(st.write_is_free(on) && st.read_is_free(on));
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

/// One step of the fast path's checks: a slow-path stream claim, or a host access.
#[derive(Clone, Copy, Debug)]
enum Step {
    Stream(u64, Access),
    Host(Access),
}

/// Runs `step` on `st` through the production steps (`order_before_enqueue`,
/// `record_after_enqueue`, `host_wait_published`), returning the streams it waited for.
/// Checks rule 3's order as it goes: a stream is waited for (an event recorded on it, or
/// a host synchronisation) only once nothing publishes it any more.
fn run_step(st: &mut AccessState<S>, published: &Published, step: Step) -> Vec<u64> {
    let mut waited = Vec::new();
    let mut wait = |s: &S| {
        let (w, r) = published.ids();
        assert!(
            w != s.0 && !r.contains(&s.0),
            "{step:?}: waited for {} while it is published ({w}, {r:?})",
            s.0
        );
        waited.push(s.0);
        Ok(())
    };
    match step {
        Step::Stream(on, access) => {
            fast::order_before_enqueue(st, published, on, access, &mut wait).unwrap();
            let mut grave = None;
            fast::record_after_enqueue(st, published, on, access, S, &mut grave);
        }
        Step::Host(access) => {
            fast::host_wait_published(st, published, access, &mut wait, &mut Grave::new()).unwrap();
        }
    }
    waited
}

/// The stream a step used is published: a write's in the write slot; a reader whose read
/// is free in a read slot (taking the last slot if they are full), and the first reader
/// published stays unless the step waited (for it) or pruned.
fn check_stream_is_published(
    step: Step,
    st: &AccessState<S>,
    ids: (u64, [u64; READ_SLOTS]),
    after: (u64, [u64; READ_SLOTS]),
    waited: &[u64],
    could_prune: bool,
) {
    match step {
        Step::Stream(on, Access::Write) => assert_eq!(
            after.0, on,
            "{step:?}: a write publishes its stream from {ids:?}"
        ),
        Step::Stream(on, Access::Read) if st.read_is_free(on) => {
            assert!(
                after.1.contains(&on),
                "{step:?}: a free read is published from {ids:?}: {after:?}"
            );
            let first = ids.1[0];
            if first != NONE_ID && waited.is_empty() && !could_prune {
                assert_eq!(after.1[0], first, "{step:?}: from {ids:?}");
            }
        }
        _ => {}
    }
}

/// The fast path's rules (`access::fast`) hold in every state reachable in up to five
/// slow-path steps over three streams, plus host accesses and idle readers that
/// pruning drops:
/// 1. a published id is true: a write (read) on it needs no wait and records nothing;
/// 2. a published id is taken back only under its stream's gate;
/// 3. it is taken back before any event is recorded on (or host wait for) its stream
///    (checked in `run_step`, at the wait).
///
/// And a stream reusing a buffer on its own gets its id published, so its next launch
/// takes the fast path; so does every new reading stream (the first keeps its slot).
#[test]
fn published_ids_stay_true_and_are_taken_back_under_their_gate() {
    let mut steps: Vec<Step> = [1, 2, 3]
        .into_iter()
        .flat_map(|id| {
            [
                Step::Stream(id, Access::Read),
                Step::Stream(id, Access::Write),
            ]
        })
        .collect();
    steps.extend([Step::Host(Access::Read), Step::Host(Access::Write)]);
    // Idle readers (ids >= 100) to make pruning run: at once, or after one more reader
    // (which pruning then drops with them if it is stream 3).
    let idle: Vec<S> = (100..100 + PRUNE_READERS_AT as u64).map(S).collect();
    let starts = [
        AccessState::<S>::default(),
        AccessState::with_uses(vec![], idle.clone()),
        AccessState::with_uses(vec![], idle[1..].to_vec()),
        AccessState::with_uses(vec![S(1)], vec![]),
    ];
    let nothing = (NONE_ID, [NONE_ID; READ_SLOTS]);
    let mut frontier: Vec<(AccessState<S>, _)> =
        starts.into_iter().map(|st| (st, nothing)).collect();
    let (mut checked, mut published_seen, mut readers_seen) = (0, 0, 0);
    for _ in 0..5 {
        let mut next = Vec::new();
        for (st, ids) in &frontier {
            for &step in &steps {
                let could_prune = st.read_may_prune();
                let mut st = AccessState::with_uses(st.writers.clone(), st.readers.clone());
                let published = Published::with_ids(*ids);
                GATES.with(|g| g.borrow_mut().clear());
                let waited = run_step(&mut st, &published, step);
                let gates = GATES.with(|g| g.borrow().clone());
                let after = published.ids();
                // Rule 1.
                if after.0 != NONE_ID {
                    assert!(
                        st.write_is_free(after.0),
                        "{step:?}: write id {} false in {st:?}",
                        after.0
                    );
                    published_seen += 1;
                }
                let reads: Vec<u64> = after.1.into_iter().filter(|&r| r != NONE_ID).collect();
                for &r in &reads {
                    assert!(st.read_is_free(r), "{step:?}: read id {r} false in {st:?}");
                }
                let mut distinct = reads.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), reads.len(), "{step:?}: {after:?}");
                if reads.len() > 1 {
                    readers_seen += 1;
                }
                let pairs = std::iter::once((ids.0, after.0)).chain(ids.1.into_iter().zip(after.1));
                for (before, now) in pairs {
                    // Rule 2: a slot that held `before` and holds something else now
                    // was changed under `before`'s gate (even if `before` is still
                    // published in another slot).
                    if before != NONE_ID && now != before {
                        assert!(
                            gates.contains(&before),
                            "{step:?}: id {before} taken back without its gate"
                        );
                    }
                    let kept = after.0 == before || after.1.contains(&before);
                    // Rule 3, end state: a stream waited for publishes nothing any more.
                    if waited.contains(&before) {
                        assert!(!kept, "{step:?}: waited for {before}, still published");
                    }
                }
                check_stream_is_published(step, &st, *ids, after, &waited, could_prune);
                checked += 1;
                next.push((st, after));
            }
        }
        frontier = next;
    }
    assert!(
        checked > 10_000 && published_seen > 1_000 && readers_seen > 1_000,
        "{checked} steps, {published_seen} published, {readers_seen} with several readers"
    );
}

/// A launch's buffer arguments through the production steps: reads on two streams wait
/// for nothing and stay published for both (their next launches take the fast path); a
/// write on a third stream waits for both reads; a read after that write waits for it.
#[test]
fn launch_reads_run_concurrently_and_writes_wait_for_them() {
    let mut st = AccessState::<S>::default();
    let published = Published::default();
    assert!(run_step(&mut st, &published, Step::Stream(1, Access::Read)).is_empty());
    assert!(
        run_step(&mut st, &published, Step::Stream(2, Access::Read)).is_empty(),
        "a read waits for no other read"
    );
    for on in [1, 2] {
        assert!(published.admits(on, Access::Read), "reader {on} published");
        assert!(
            !published.admits(on, Access::Write),
            "reader {on} may not write free"
        );
        assert!(st.read_is_free(on));
    }
    let mut waited = run_step(&mut st, &published, Step::Stream(3, Access::Write));
    waited.sort_unstable();
    assert_eq!(waited, [1, 2], "a write waits for every pending read");
    for on in [1, 2] {
        assert!(
            !published.admits(on, Access::Read),
            "reader {on} taken back"
        );
    }
    assert!(published.admits(3, Access::Write) && published.admits(3, Access::Read));
    assert_eq!(
        run_step(&mut st, &published, Step::Stream(1, Access::Read)),
        [3],
        "a read waits for the pending write"
    );
    assert_eq!(AccessState::ids(&st.writers), [3]);
    assert_eq!(AccessState::ids(&st.readers), [1]);
}

/// A write on one stream, then reads on two others: each read waits for the write only
/// (not for the other read); the write's own stream reads free.
#[test]
fn launch_reads_after_a_write_wait_for_it_only() {
    let mut st = AccessState::<S>::default();
    let published = Published::default();
    assert!(run_step(&mut st, &published, Step::Stream(1, Access::Write)).is_empty());
    assert!(published.admits(1, Access::Read) && published.admits(1, Access::Write));
    assert_eq!(
        run_step(&mut st, &published, Step::Stream(2, Access::Read)),
        [1]
    );
    assert_eq!(
        run_step(&mut st, &published, Step::Stream(3, Access::Read)),
        [1]
    );
    assert!(
        run_step(&mut st, &published, Step::Stream(1, Access::Read)).is_empty(),
        "the writer's stream reads in stream order"
    );
    let mut waited = run_step(&mut st, &published, Step::Stream(1, Access::Write));
    waited.sort_unstable();
    assert_eq!(waited, [2, 3], "the next write waits for both reads");
}

/// One launch that passes a buffer by `&` and by `&mut` (two views of one allocation)
/// claims it once, as a write: it waits for every pending read.
#[test]
fn a_buffer_passed_for_read_and_write_is_claimed_as_written() {
    let t = AccessTracker::default();
    let mut uses = [Some((&t, Access::Read)), Some((&t, Access::Write))];
    sort_and_merge(&mut uses);
    let kept: Vec<_> = uses.iter().flatten().collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].1, Access::Write);
    let mut st = AccessState::with_uses(vec![], vec![S(1), S(2)]);
    let published = Published::default();
    let mut waited = run_step(&mut st, &published, Step::Stream(3, kept[0].1));
    waited.sort_unstable();
    assert_eq!(waited, [1, 2]);
}

/// While a read is open ([`lend`]), a write is refused before anything is enqueued (a
/// read of the same tracker passes), no write id is published or admitted, and closing
/// the read lets writes be published again.
#[test]
fn an_open_read_refuses_writes_and_publishes_no_write_id() {
    let t = AccessTracker::default();
    sync::lock(&t.state).lends = 1;
    assert!(matches!(
        t.host_access(Access::Write),
        Err(Error::InvalidArgument(_))
    ));
    assert!(t.host_access(Access::Read).is_ok(), "a host read goes on");

    let mut st = AccessState::with_uses(vec![S(1)], vec![]);
    st.lends = 1;
    let published = fast::Published::default();
    let mut waited = Vec::new();
    let mut wait = |s: &S| {
        waited.push(s.0);
        Ok(())
    };
    match fast::order_before_enqueue(&st, &published, 2, Access::Write, &mut wait) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("lent to cudarc"), "{m}"),
        other => panic!("a write during an open read: {other:?}"),
    }
    assert!(fast::order_before_enqueue(&st, &published, 2, Access::Read, &mut wait).is_ok());
    assert_eq!(
        waited,
        [1],
        "the read waits for the writer; the write waited for nothing"
    );
    assert!(!st.write_is_free(1), "no write id while a read is open");
    published.publish(&st, 1);
    assert_eq!(published.ids(), (NONE_ID, [1, NONE_ID]), "only the read id");
    assert!(!published.admits(1, Access::Write) && published.admits(1, Access::Read));
    st.lends = 0;
    published.publish(&st, 1);
    assert_eq!(published.ids().0, 1, "the write id once no read is open");
}

/// A foreign stream's operations claim under its id with `FOREIGN_CLAIM` set, which no use
/// is recorded under: whatever the state (its own use the only one, or among others),
/// such a claim is never ordered after a pending write without a wait step (for its own
/// stream's uses the step, `foreign_enqueue_wait`, enqueues nothing: stream order covers
/// them), never commits as a no-op and
/// is never admitted by what a commit of its recorded id publishes. So every operation on
/// a foreign stream reaches a commit, where its end mark is recorded.
#[test]
fn a_foreign_claim_always_commits_and_is_never_admitted() {
    use super::stream::FOREIGN_CLAIM;
    let f = 5;
    let claim = f | FOREIGN_CLAIM;
    for access in [Access::Read, Access::Write] {
        for st in [
            AccessState::written_by_id(S(f), f),
            AccessState::with_uses(vec![S(f)], vec![S(2)]),
            AccessState::with_uses(vec![S(2)], vec![S(f)]),
            AccessState::with_uses(Vec::<S>::new(), vec![S(f)]),
        ] {
            if !st.writers.is_empty() {
                assert!(!st.is_ordered_on(claim, access), "{access:?} {st:?}");
            }
            assert!(!st.commit_is_noop(claim, access), "{access:?} {st:?}");
            assert!(!st.write_is_free(claim) && !st.read_is_free(claim));
            let mut waited = Vec::new();
            st.wait_conflicts(claim, access, |s| {
                waited.push(s.0);
                Ok(())
            })
            .unwrap();
            if st.writers.iter().any(|w| w.0 == f) || access == Access::Write {
                assert!(waited.contains(&f), "{access:?} {st:?}: waited {waited:?}");
            }
            let mut published = Published::default();
            published.reset_mut(&st, Some(f));
            published.publish(&st, f);
            assert!(!published.admits(claim, access), "{access:?} {st:?}");
        }
    }
    // Recorded under its recorded id: a commit replaces nothing twice.
    let mut st = AccessState::written_by_id(S(f), f);
    commit1(&mut st, f, Access::Write);
    assert_eq!(AccessState::ids(&st.writers), vec![f]);
}
