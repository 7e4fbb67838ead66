//! Unit tests of the control channel: done-notice sequencing and one deadline per
//! operation, between two ranks on two threads of this process.

use super::*;

/// Two ranks of a fresh job, connected from two threads of this process.
fn pair(tag: &str) -> (ProcessGroup, ProcessGroup) {
    let key = format!("unit-{tag}-{}-{:?}", std::process::id(), Instant::now());
    let t = Duration::from_secs(10);
    let k = key.clone();
    let one = std::thread::spawn(move || ProcessGroup::connect(1, 2, &k, t));
    let zero = ProcessGroup::connect(0, 2, &key, t).expect("rank 0");
    (zero, one.join().unwrap().expect("rank 1"))
}

/// Both agree on one made-up call, on two threads.
fn agree_both(a: &mut ProcessGroup, b: &mut ProcessGroup) {
    std::thread::scope(|s| {
        let h = s.spawn(|| b.agree_for_test(9, 0, 4));
        a.agree_for_test(9, 0, 4).expect("rank 0 agrees");
        h.join().unwrap().expect("rank 1 agrees");
    });
}

fn short() -> Budget {
    Budget::new(Duration::from_secs(5))
}

#[test]
fn done_notices_carry_the_step_they_are_for() {
    let (mut zero, mut one) = pair("ok");
    for _ in 0..3 {
        agree_both(&mut zero, &mut one);
        zero.expect_done(&[1]);
        one.send_done(0, &short()).expect("send done");
        assert_eq!(zero.collect_done(&short()).expect("collect"), vec![1]);
    }
    // A notice owed for an earlier step may arrive while the next header is awaited.
    agree_both(&mut zero, &mut one);
    zero.expect_done(&[1]);
    one.send_done(0, &short()).expect("send done");
    agree_both(&mut zero, &mut one);
    assert!(
        zero.owed[1].is_empty(),
        "the notice was counted off on the way"
    );
    assert_eq!(zero.collect_done(&short()).expect("collect"), vec![1]);
}

#[test]
fn a_done_notice_for_another_step_is_a_typed_error_naming_the_peer() {
    let (mut zero, mut one) = pair("wrong");
    agree_both(&mut zero, &mut one);
    zero.expect_done(&[1]);
    // Rank 1 claims to be done with step 7; step 0 is owed.
    let bad = encode(DONE, &7u64.to_le_bytes());
    one.send_to(0, &bad, Instant::now(), short().deadline)
        .expect("send");
    match zero.collect_done(&short()) {
        Err(Error::PeerFailed { rank: 1, reason }) => {
            assert!(reason.contains("step 7"), "{reason}");
            assert!(reason.contains("expected one for step 0"), "{reason}");
        }
        other => panic!("want PeerFailed naming rank 1, got {other:?}"),
    }
}

#[test]
fn an_unowed_done_notice_is_a_typed_error_naming_the_peer() {
    let (mut zero, mut one) = pair("unowed");
    agree_both(&mut zero, &mut one);
    // Rank 0 expects no notice (rank 1 read nothing of it), yet one comes before
    // rank 1's next header.
    one.send_done(0, &short()).expect("send done");
    let mine = std::thread::scope(|s| {
        // Rank 1's agreement ends either way (rank 0's header was sent first).
        let h = s.spawn(|| one.agree_for_test(9, 0, 4));
        let mine = zero.agree_for_test(9, 0, 4);
        let _ = h.join().unwrap();
        mine
    });
    match mine {
        Err(Error::PeerFailed { rank: 1, reason }) => {
            assert!(reason.contains("expected none"), "{reason}")
        }
        other => panic!("want PeerFailed naming rank 1, got {other:?}"),
    }
    // The group is broken: every later call returns that error at once.
    assert!(matches!(
        zero.error(),
        Some(Error::PeerFailed { rank: 1, .. })
    ));
    assert!(matches!(
        zero.barrier(),
        Err(Error::PeerFailed { rank: 1, .. })
    ));
}

#[test]
fn a_budget_is_one_deadline_for_every_wait() {
    let (mut zero, _one) = pair("budget");
    // Rank 1 never answers: the wait ends at the budget's deadline, which the
    // budget's own start (not the call's) fixed.
    let budget = Budget::new(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let h = Header {
        seq: 0,
        kind: 9,
        op: 0,
        dtype: 0,
        arg: 0,
        count: 1,
    };
    match zero.agree(h, &[1], &budget) {
        Err(Error::PeerTimeout {
            ranks, after_ms, ..
        }) => {
            assert_eq!(ranks, vec![1]);
            assert!(after_ms >= 300, "{after_ms}");
        }
        other => panic!("want PeerTimeout, got {other:?}"),
    }
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "waited {:?}: more than what was left of the budget",
        t.elapsed()
    );
}

/// Three ranks of a fresh job, connected from three threads of this process.
fn trio(tag: &str) -> [ProcessGroup; 3] {
    let key = format!("unit-{tag}-{}-{:?}", std::process::id(), Instant::now());
    let t = Duration::from_secs(10);
    let spawn = |r: usize| {
        let k = key.clone();
        std::thread::spawn(move || ProcessGroup::connect(r, 3, &k, t))
    };
    let (one, two) = (spawn(1), spawn(2));
    let zero = ProcessGroup::connect(0, 3, &key, t).expect("rank 0");
    [
        zero,
        one.join().unwrap().expect("rank 1"),
        two.join().unwrap().expect("rank 2"),
    ]
}

/// What rank 0 does when it sees rank 2 die first: breaks its group, which tells
/// ranks 1 and 2 that rank 2 failed; then its process exits (its sockets close).
fn zero_relays_that_two_died_and_exits(mut zero: ProcessGroup) {
    zero.fail(Error::PeerFailed {
        rank: 2,
        reason: "its process exited, was killed or closed its connection".into(),
    });
    drop(zero);
}

#[test]
fn a_survivor_that_relayed_a_verdict_and_left_is_not_blamed_by_a_send() {
    let [zero, mut one, _two] = trio("relay-send");
    zero_relays_that_two_died_and_exits(zero);
    // Rank 1 reaches its next call only now: its header to rank 0 is refused (the
    // socket is closed), yet rank 0's abort is still unread on it.
    match one.agree_for_test(9, 0, 4) {
        Err(Error::PeerFailed { rank: 2, reason }) => {
            assert!(reason.contains("reported by rank 0"), "{reason}")
        }
        other => panic!("want PeerFailed naming rank 2 (relayed by rank 0), got {other:?}"),
    }
    // And it relays the same culprit in turn.
    assert!(matches!(
        one.error(),
        Some(Error::PeerFailed { rank: 2, .. })
    ));
}

#[test]
fn a_survivor_that_relayed_a_verdict_and_left_is_not_blamed_by_a_poll() {
    let [zero, one, _two] = trio("relay-poll");
    zero_relays_that_two_died_and_exits(zero);
    // The GPU path's host poll sees rank 0's socket hang up first.
    assert!(one.peer_closed(0));
    let closed = Error::PeerFailed {
        rank: 0,
        reason: "its process exited".into(),
    };
    match one.closed_peer_error(0, closed) {
        Error::PeerFailed { rank: 2, reason } => {
            assert!(reason.contains("reported by rank 0"), "{reason}")
        }
        other => panic!("want PeerFailed naming rank 2 (relayed by rank 0), got {other:?}"),
    }
}

#[test]
fn a_rank_that_left_without_a_verdict_is_named_itself() {
    let [zero, one, _two] = trio("no-relay");
    // Rank 0 leaves with a header unread by rank 1, but no abort.
    let h = Header {
        seq: 0,
        kind: 9,
        op: 0,
        dtype: 0,
        arg: 0,
        count: 1,
    };
    zero.send_to(1, &encode_call(&h, &[]), Instant::now(), short().deadline)
        .expect("send");
    drop(zero);
    let closed = Error::PeerFailed {
        rank: 0,
        reason: "its process exited".into(),
    };
    assert_eq!(one.closed_peer_error(0, closed.clone()), closed);
}

#[test]
fn a_world_larger_than_a_process_can_connect_is_refused_before_allocating() {
    // Each rank keeps per-rank tables and one socket per peer: u32::MAX ranks (a garbage
    // world size) would ask for over 100 GiB and abort the process.
    for rank in [0, 7] {
        match ProcessGroup::connect(
            rank,
            u32::MAX as usize,
            "unit-huge",
            Duration::from_millis(100),
        ) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("world size 4294967295"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
