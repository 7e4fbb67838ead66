//! Unit tests of the watchdog's state machine (no GPU, no NCCL).

use super::gate::InFlight;
use super::*;
use std::collections::VecDeque;

fn entry(op: &'static str, seq: u64, since: Instant) -> InFlight<u32> {
    InFlight {
        event: seq as u32,
        op,
        seq,
        since,
    }
}

fn timeout_error() -> Error {
    Error::PeerTimeout {
        what: "x".into(),
        ranks: vec![],
        after_ms: 1000,
    }
}

#[test]
fn owner_and_watchdog_exclude_each_other() {
    let mut g = Gate::<u32>::default();
    assert!(g.note_in_flight(1, "all_reduce", Instant::now()));
    assert!(!g.note_in_flight(2, "all_reduce", Instant::now()));
    assert_eq!(g.owner_enter(), Enter::Go);
    assert!(matches!(g.watch_begin(), Round::Skip), "owner inside: skip");
    assert!(!g.owner_leave());
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters once the owner left")
    };
    assert_eq!(q.len(), 2);
    assert_eq!(
        g.owner_enter(),
        Enter::Busy,
        "a round in progress holds the owner"
    );
    let (take, keep) = g.watch_end(q, Vec::new(), None, Instant::now());
    assert!(!take && keep);
    assert_eq!(g.owner_enter(), Enter::Go);
    assert!(!g.owner_leave());
    // The drop waits for a round in progress, and the watchdog lets go after it.
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters")
    };
    assert_eq!(g.close(), Close::Busy);
    let (take, keep) = g.watch_end(q, Vec::new(), None, Instant::now());
    assert!(!take && !keep, "closed: off the list");
    assert_eq!(g.close(), Close::Live);
    assert_eq!(
        g.queue.len(),
        2,
        "the drop waits for the work still in flight"
    );
}

#[test]
fn a_verdict_of_the_watchdog_aborts_once_and_refuses_every_later_call() {
    let mut g = Gate::<u32>::default();
    let _ = g.note_in_flight(1, "all_reduce", Instant::now());
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters")
    };
    let why = timeout_error();
    let (take, keep) = g.watch_end(q, Vec::new(), Some(why.clone()), Instant::now());
    assert!(take, "nobody inside: the watchdog takes the abort");
    assert!(!keep);
    assert_eq!(g.owner_enter(), Enter::Refused(why.clone()));
    // A second failure keeps the first verdict and never takes a second abort.
    assert!(!g.fail(Error::NoNccl, None));
    assert!(!g.fail(Error::NoNccl, Some(Who::Owner)));
    assert_eq!(g.verdict(), Some(&why));
    assert!(!g.note_in_flight(9, "all_reduce", Instant::now()));
    assert!(g.queue.len() == 1 && g.spare == [9], "kept, not watched");
    assert!(matches!(g.watch_begin(), Round::Leave));
    assert_eq!(
        g.close(),
        Close::Aborted,
        "the drop must not destroy it again"
    );
}

#[test]
fn an_owner_failure_while_the_watchdog_is_inside_is_aborted_by_the_watchdog() {
    let mut g = Gate::<u32>::default();
    let _ = g.note_in_flight(1, "broadcast", Instant::now());
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters")
    };
    // The owner, outside (e.g. its drop's wait failed): the abort waits for the
    // watchdog to leave NCCL, and the watchdog takes it.
    assert!(!g.fail(Error::NoNccl, None));
    let (take, keep) = g.watch_end(q, Vec::new(), None, Instant::now());
    assert!(take && !keep);
    assert_eq!(g.close(), Close::Aborted);
}

#[test]
fn an_owner_failure_inside_is_taken_by_the_owner() {
    let mut g = Gate::<u32>::default();
    assert_eq!(g.owner_enter(), Enter::Go);
    assert!(g.fail(Error::NoNccl, Some(Who::Owner)));
    assert!(!g.owner_leave(), "taken once");
    assert!(matches!(g.watch_begin(), Round::Leave));
    assert_eq!(g.close(), Close::Aborted);
}

#[test]
fn a_closed_gate_is_left_by_the_watchdog() {
    let mut g = Gate::<u32>::default();
    let _ = g.note_in_flight(1, "all_reduce", Instant::now());
    assert_eq!(g.close(), Close::Live);
    assert!(matches!(g.watch_begin(), Round::Leave));
    assert!(!g.note_in_flight(2, "all_reduce", Instant::now()));
    assert_eq!(g.queue.len(), 1, "closed: nothing more is watched");
}

#[test]
fn entries_noted_during_a_round_stay_after_the_older_ones() {
    let t = Instant::now();
    let mut g = Gate::<u32>::default();
    let _ = g.note_in_flight(1, "a", t);
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters")
    };
    let _ = g.note_in_flight(2, "b", t);
    let (_, keep) = g.watch_end(q, Vec::new(), None, t);
    assert!(keep);
    let order: Vec<u32> = g.queue.iter().map(|e| e.event).collect();
    assert_eq!(order, [1, 2]);
    // Once empty, the watchdog lets go, and the next note registers again.
    let Round::Go(q) = g.watch_begin() else {
        panic!("the watchdog enters")
    };
    let done: Vec<u32> = q.into_iter().map(|e| e.event).collect();
    let (take, keep) = g.watch_end(VecDeque::new(), done, None, t);
    assert!(!take && !keep);
    assert_eq!(g.spare, [1, 2], "finished events are kept for reuse");
    assert!(g.note_in_flight(3, "c", t));
}

#[test]
fn scan_times_the_oldest_unfinished_call_from_when_it_could_start() {
    let t0 = Instant::now();
    let timeout = Duration::from_secs(1);
    let mut q: VecDeque<_> = [entry("all_reduce", 1, t0), entry("all_gather", 2, t0)].into();
    // Nothing finished, 0.5 s: fine.
    let (done, v) = scan(&mut q, timeout, t0 + Duration::from_millis(500), |_| {
        Ok(false)
    });
    assert!(done.is_empty() && v.is_none());
    // The first finished at 0.9 s: the second is timed from then, not from t0.
    let t1 = t0 + Duration::from_millis(900);
    let (done, v) = scan(&mut q, timeout, t1, |&e| Ok(e == 1));
    assert_eq!(done, [1]);
    assert!(v.is_none());
    assert_eq!(q.front().map(|e| e.since), Some(t1));
    let (_, v) = scan(&mut q, timeout, t1 + Duration::from_millis(900), |_| {
        Ok(false)
    });
    assert!(v.is_none(), "0.9 s since it could start");
    let (_, v) = scan(&mut q, timeout, t1 + Duration::from_millis(1100), |_| {
        Ok(false)
    });
    match v {
        Some(Error::PeerTimeout { what, after_ms, .. }) => {
            assert!(
                what.contains("all_gather") && what.contains("call #2"),
                "{what}"
            );
            assert!(what.contains("ncclCommAbort"), "{what}");
            assert_eq!(after_ms, 1100);
        }
        other => panic!("want PeerTimeout, got {other:?}"),
    }
}

#[test]
fn scan_passes_a_failed_query_on_and_never_times_out_without_a_limit() {
    let t0 = Instant::now();
    let mut q: VecDeque<_> = [entry("reduce", 1, t0)].into();
    let far = t0 + Duration::from_secs(1 << 30);
    let (_, v) = scan(&mut q, Duration::MAX, far, |_| Ok(false));
    assert!(v.is_none());
    let (_, v) = scan(&mut q, Duration::MAX, t0, |_| Err(Error::NoNccl));
    assert_eq!(v, Some(Error::NoNccl));
    assert_eq!(q.len(), 1);
}

/// The thread starts for a registered communicator and exits once it has nothing to
/// watch (after `LINGER`): no thread, no polling, when idle.
#[test]
fn the_thread_exits_when_no_communicator_needs_it() {
    let w = Arc::new(Watched {
        raw: 0,
        nranks: 1,
        timeout: Some(Duration::from_secs(1)),
        gate: sync::Mutex::new(Gate::default()),
        device: std::sync::OnceLock::new(),
        abort_returned: Default::default(),
    });
    // Closed at once: the watchdog's first round takes it off the list without calling
    // NCCL (the handle is not a communicator).
    assert_eq!(sync::lock(&w.gate).close(), Close::Live);
    register_comm(&w);
    assert!(running());
    let t = Instant::now();
    while running() && t.elapsed() < LINGER * 5 {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!running(), "the watchdog still runs with nothing to watch");
    assert!(registry().comms.iter().all(|c| !Arc::ptr_eq(c, &w)));
}

/// Serialises the tests that look at (or bump) the `ABORTS` count.
static COUNTED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn counted_lock() -> std::sync::MutexGuard<'static, ()> {
    COUNTED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `fork` child of a process whose watchdog runs (and with an abort counted, and the
/// registry's lock held by another thread at the fork) has no watchdog: registering a
/// communicator and the exit hook return at once, without touching the registry's lock
/// (inherited locked) or waiting `GPUBIND_DROP_TIMEOUT` for the parent's threads.
#[test]
fn a_forked_child_has_no_watchdog_and_exits_at_once() {
    let _serial = counted_lock();
    let closed = || {
        let w = Arc::new(Watched {
            raw: 0,
            nranks: 1,
            timeout: Some(Duration::from_secs(1)),
            gate: sync::Mutex::new(Gate::default()),
            device: std::sync::OnceLock::new(),
            abort_returned: Default::default(),
        });
        // Closed: the watchdog takes it off its list without calling NCCL.
        assert_eq!(sync::lock(&w.gate).close(), Close::Live);
        w
    };
    let parents = closed();
    register_comm(&parents);
    assert_eq!(OWNER_PID.load(Ordering::Acquire), std::process::id());
    let childs = closed();
    // An abort "running" in the parent, and the registry locked by a parent's thread at
    // the fork: the child would wait for the first and hang on the second.
    ABORTS.fetch_add(1, Ordering::AcqRel);
    let held = registry();
    // SAFETY: the child only calls the functions under test (no lock they take can be
    // held: that is what is tested, with a bound below) and `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        register_comm(&childs);
        on_exit();
        // SAFETY: ends the child without running the parent's exit hooks again.
        unsafe { libc::_exit(7) };
    }
    drop(held);
    ABORTS.fetch_sub(1, Ordering::AcqRel);
    assert!(pid > 0, "fork failed");
    let start = Instant::now();
    let mut status = 0;
    let done = loop {
        // SAFETY: our own child; writes one status.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break true;
        }
        if start.elapsed() > Duration::from_secs(5) {
            // SAFETY: our own child, not reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        done,
        "the forked child hung in register_comm or the exit hook"
    );
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the child's exit waited {:?}",
        start.elapsed()
    );
    assert!(registry().comms.iter().all(|c| !Arc::ptr_eq(c, &childs)));
}

/// A job that cannot get a thread of its own is handed back (to be run inline:
/// `spawn_abort` aborts on the calling thread), not lost, and the count is put back.
#[test]
fn a_job_whose_thread_cannot_start_is_handed_back() {
    let _serial = counted_lock();
    let ran = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ran);
    let before = ABORTS.load(Ordering::Acquire);
    FAIL_SPAWN.with(|f| f.set(true));
    let out = spawn_counted(
        "gpubind-test",
        Box::new(move || r.store(true, Ordering::Release)),
    );
    FAIL_SPAWN.with(|f| f.set(false));
    let Err((_, job)) = out else {
        panic!("a thread with an impossible stack started")
    };
    assert_eq!(ABORTS.load(Ordering::Acquire), before, "the count is back");
    assert!(!ran.load(Ordering::Acquire));
    job();
    assert!(ran.load(Ordering::Acquire));
}

/// A counted job drops what it captured (the last `Arc<Watched>`, events) before the
/// count goes down, so that exit waits for those drops too; `drop_elsewhere` drops on
/// another thread.
#[test]
fn a_counted_job_drops_its_captures_before_the_count_goes_down() {
    let _serial = counted_lock();
    struct Probe(std::sync::mpsc::Sender<(Option<String>, usize)>);
    impl Drop for Probe {
        fn drop(&mut self) {
            let name = std::thread::current().name().map(str::to_owned);
            let _ = self.0.send((name, ABORTS.load(Ordering::Acquire)));
        }
    }
    let before = ABORTS.load(Ordering::Acquire);
    let (tx, rx) = std::sync::mpsc::channel();
    drop_elsewhere(vec![Probe(tx)]);
    let (name, count) = rx.recv_timeout(Duration::from_secs(10)).expect("dropped");
    assert_eq!(name.as_deref(), Some("gpubind-nccl-abort"));
    assert_eq!(count, before + 1, "still counted while it drops");
    let t = Instant::now();
    while ABORTS.load(Ordering::Acquire) != before && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ABORTS.load(Ordering::Acquire), before);
}

#[test]
fn a_failed_enqueue_waits_for_the_abort_to_return_bounded() {
    let w = Arc::new(Watched {
        raw: 0,
        nranks: 1,
        timeout: Some(Duration::from_secs(1)),
        gate: sync::Mutex::new(Gate::default()),
        device: std::sync::OnceLock::new(),
        abort_returned: Default::default(),
    });
    // No abort returns: the wait gives up at its limit, not before.
    let limit = Duration::from_millis(200);
    let t = Instant::now();
    assert!(!w.wait_abort_returned(limit));
    let took = t.elapsed();
    assert!(took >= limit && took < limit * 20, "{took:?}");
    // An abort that returns on another thread ends the wait then, not at the limit.
    let theirs = Arc::clone(&w);
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        theirs.abort_returned.store(true, Ordering::Release);
    });
    let t = Instant::now();
    assert!(w.wait_abort_returned(Duration::from_secs(30)));
    let took = t.elapsed();
    aborter.join().unwrap();
    println!("the wait ended {took:?} after it began (the abort returned after 100 ms)");
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(7),
        "{took:?}"
    );
}
