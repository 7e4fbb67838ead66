//! Loom models of the claim protocol (declared in `mod.rs`, `cfg(all(test, loom))`).

use super::state::PRUNE_READERS_AT;
use super::*;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::thread;

/// A mock stream. `enqueued` is set once the operation claimed on it is enqueued;
/// `ops` counts the operations enqueued on it (an event recorded on it captures the
/// count); `gate` is its fast-path gate; `queue` is its queue as plain memory, so that
/// two enqueues on it that no lock or Acquire load orders are a race loom reports;
/// `idle` is what `cuStreamQuery` would say (set by a model, cleared by an enqueue).
#[derive(Clone)]
struct M {
    id: u64,
    enqueued: Arc<AtomicBool>,
    ops: Arc<AtomicUsize>,
    gate: Arc<sync::Mutex<()>>,
    queue: Arc<UnsafeCell<Vec<&'static str>>>,
    idle: Arc<AtomicBool>,
}

impl M {
    /// Appends `op` to the stream's queue, returning the queue as it is then.
    fn enqueue_plain(&self, op: &'static str) -> Vec<&'static str> {
        self.queue.with_mut(|q| {
            // SAFETY: `q` points into the live cell; loom checks that no other access to
            // the cell is concurrent with this one (the model fails if one is).
            let q = unsafe { &mut *q };
            q.push(op);
            q.clone()
        })
    }
}
impl TrackedStream for M {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_idle(&self) -> bool {
        self.idle.load(SeqCst)
    }
    fn under_gate(&self, f: impl FnOnce()) {
        let _gate = sync::lock(&self.gate);
        f();
    }
}
fn stream(id: u64) -> M {
    M {
        id,
        enqueued: Arc::new(AtomicBool::new(false)),
        ops: Arc::new(AtomicUsize::new(0)),
        gate: Arc::new(sync::Mutex::new(())),
        queue: Arc::new(UnsafeCell::new(Vec::new())),
        idle: Arc::new(AtomicBool::new(false)),
    }
}

/// The stream-claim protocol: lock; wait for conflicts (the event recorded on `from`
/// must come after `from`'s operation was enqueued); enqueue; commit; unlock.
fn stream_op(state: &sync::Mutex<AccessState<M>>, on: &M, access: Access) -> Vec<u64> {
    let mut st = sync::lock(state);
    let mut waited = Vec::new();
    if !st.is_ordered_on(on.id, access) {
        st.wait_conflicts(on.id, access, |from| {
            assert!(
                from.enqueued.load(SeqCst),
                "an event was recorded on stream {} before its operation was enqueued",
                from.id
            );
            waited.push(from.id);
            Ok(())
        })
        .unwrap();
    }
    on.enqueued.store(true, SeqCst);
    let mut grave = Grave::new();
    let on2 = on.clone();
    st.commit(&[(on.id, access)], move |_| on2.clone(), &mut grave);
    waited
}

/// Two writes on different streams: whichever comes second waits for the first, and
/// never on an event recorded before the first was enqueued (the race this model guards).
#[test]
fn cross_stream_writes_are_ordered_one_way() {
    loom::model(|| {
        let state = Arc::new(sync::Mutex::new(AccessState::<M>::default()));
        let (s1, s2) = (stream(1), stream(2));
        let t = {
            let (state, s1) = (state.clone(), s1.clone());
            thread::spawn(move || stream_op(&state, &s1, Access::Write))
        };
        let w2 = stream_op(&state, &s2, Access::Write);
        let w1 = t.join().unwrap();
        assert!(
            (w1 == [2]) ^ (w2 == [1]),
            "exactly one write waits for the other: {w1:?} {w2:?}"
        );
    });
}

/// A synchronous copy (host claim, lock held while it runs) and a kernel on a stream
/// never overlap, and the kernel is ordered after any write the copy waited for.
#[test]
fn sync_copy_excludes_device_use() {
    loom::model(|| {
        let w = stream(1);
        w.enqueued.store(true, SeqCst);
        let mut st = AccessState::<M>::default();
        let w2 = w.clone();
        st.commit(
            &[(1, Access::Write)],
            move |_| w2.clone(),
            &mut Grave::new(),
        );
        let state = Arc::new(sync::Mutex::new(st));
        let copying = Arc::new(AtomicBool::new(false));
        let host = {
            let (state, copying) = (state.clone(), copying.clone());
            thread::spawn(move || {
                let mut st = sync::lock(&state);
                st.host_wait(Access::Read, |_| Ok(()), &mut Grave::new())
                    .unwrap();
                copying.store(true, SeqCst);
                thread::yield_now();
                copying.store(false, SeqCst);
            })
        };
        let k = stream(2);
        {
            let mut st = sync::lock(&state);
            assert!(
                !copying.load(SeqCst),
                "a kernel started during a synchronous copy"
            );
            st.wait_conflicts(2, Access::Write, |_| Ok(())).unwrap();
            k.enqueued.store(true, SeqCst);
            let k2 = k.clone();
            st.commit(
                &[(2, Access::Write)],
                move |_| k2.clone(),
                &mut Grave::new(),
            );
        }
        host.join().unwrap();
    });
}

/// Two readers on different streams both wait for the write and both stay recorded,
/// so a later write waits for each.
#[test]
fn concurrent_readers_both_wait_and_are_kept() {
    loom::model(|| {
        let w = stream(1);
        w.enqueued.store(true, SeqCst);
        let mut st = AccessState::<M>::default();
        let w2 = w.clone();
        st.commit(
            &[(1, Access::Write)],
            move |_| w2.clone(),
            &mut Grave::new(),
        );
        let state = Arc::new(sync::Mutex::new(st));
        let t = {
            let state = state.clone();
            thread::spawn(move || stream_op(&state, &stream(2), Access::Read))
        };
        let a = stream_op(&state, &stream(3), Access::Read);
        let b = t.join().unwrap();
        assert_eq!((a, b), (vec![1], vec![1]));
        let st = sync::lock(&state);
        let mut waits = Vec::new();
        st.wait_conflicts(4, Access::Write, |s| {
            waits.push(s.id);
            Ok(())
        })
        .unwrap();
        waits.sort();
        assert_eq!(waits, [1, 2, 3]);
    });
}

/// A mock tracker: the state under its lock, and what it publishes for the fast path.
struct T {
    state: sync::Mutex<AccessState<M>>,
    published: Published,
}

/// A tracker whose pending uses are one use of kind `access` on each of `streams`, in
/// order, each enqueued, recorded and published as the slow path does it (what first
/// launches leave behind).
fn used_by(streams: &[&M], access: Access) -> Arc<T> {
    let mut st = AccessState::<M>::default();
    let published = Published::default();
    for s in streams {
        s.ops.fetch_add(1, SeqCst);
        let s2 = (*s).clone();
        fast::record_after_enqueue(
            &mut st,
            &published,
            s.id,
            access,
            move |_| s2.clone(),
            &mut None,
        );
    }
    Arc::new(T {
        state: sync::Mutex::new(st),
        published,
    })
}

/// A tracker whose one pending use is a write on `w`, enqueued and published (what a
/// first launch on `w` leaves behind).
fn written_and_published(w: &M) -> Arc<T> {
    let t = used_by(&[w], Access::Write);
    assert!(t.published.admits(w.id, Access::Write));
    t
}

/// A launch on `on` using `t` as `access` (a buffer: a write; a module: a read), as
/// `LaunchBuilder::enqueue` does it: the fast path under the stream's gate if `t`
/// publishes `on`, else the slow-path claim. Its enqueue makes the stream busy.
/// Returns `Some(k)` (its operation was the k-th on `on`) for the fast path, `None`
/// for the slow.
fn launch_as(t: &T, on: &M, access: Access) -> Option<usize> {
    let enqueue = || {
        on.idle.store(false, SeqCst);
        on.ops.fetch_add(1, SeqCst) + 1
    };
    {
        let _gate = sync::lock(&on.gate);
        if t.published.admits(on.id, access) {
            return Some(enqueue());
        }
    }
    slow_claim(t, on, access, enqueue);
    None
}

/// A launch on `on` writing `t` (a buffer argument).
fn launch(t: &T, on: &M) -> Option<usize> {
    launch_as(t, on, Access::Write)
}

/// The slow-path claim of `t` for a use of kind `access` on `on`: lock the tracker,
/// order, `enqueue`, record (and publish); returns what `enqueue` returns.
fn slow_claim<R>(t: &T, on: &M, access: Access, enqueue: impl FnOnce() -> R) -> R {
    let mut st = sync::lock(&t.state);
    fast::order_before_enqueue(&st, &t.published, on.id, access, |_| Ok(())).unwrap();
    let out = enqueue();
    let on2 = on.clone();
    fast::record_after_enqueue(
        &mut st,
        &t.published,
        on.id,
        access,
        move |_| on2.clone(),
        &mut None,
    );
    out
}

/// A fast-path launch on stream 1 and a write handed off to stream 2 (slow path) never
/// race: if the launch took the fast path, the event the hand-off recorded on stream 1
/// came after it (rule 3 takes the id back under the gate before recording it).
#[test]
fn fast_path_launch_is_covered_by_a_handoff_event() {
    loom::model(|| {
        let (s1, s2) = (stream(1), stream(2));
        let t = written_and_published(&s1);
        let launcher = {
            let (t, s1) = (t.clone(), s1.clone());
            thread::spawn(move || launch(&t, &s1))
        };
        // The hand-off: a write on stream 2.
        let mut event_on_1 = None;
        {
            let mut st = sync::lock(&t.state);
            fast::order_before_enqueue(&st, &t.published, 2, Access::Write, |from| {
                assert_eq!(from.id, 1);
                event_on_1 = Some(from.ops.load(SeqCst));
                Ok(())
            })
            .unwrap();
            s2.ops.fetch_add(1, SeqCst);
            let s2b = s2.clone();
            fast::record_after_enqueue(
                &mut st,
                &t.published,
                2,
                Access::Write,
                move |_| s2b.clone(),
                &mut None,
            );
        }
        let event_on_1 = event_on_1.expect("the hand-off waits for stream 1");
        if let Some(k) = launcher.join().unwrap() {
            assert!(
                k <= event_on_1,
                "a fast-path launch (op {k} on stream 1) was enqueued after the \
                 hand-off's event (which captured {event_on_1} ops)"
            );
        }
        // Either way, stream 2 is the writer now and publishes nothing else.
        assert!(!t.published.admits(1, Access::Write) || sync::lock(&t.state).write_is_free(1));
    });
}

/// A fast-path launch on stream 1 and a host read (a synchronous copy out) never race:
/// the launch was enqueued before the host synchronised stream 1, or it took the slow
/// path (and waited for the copy's lock).
#[test]
fn fast_path_launch_is_covered_by_a_host_wait() {
    loom::model(|| {
        let s1 = stream(1);
        let t = written_and_published(&s1);
        let launcher = {
            let (t, s1) = (t.clone(), s1.clone());
            thread::spawn(move || launch(&t, &s1))
        };
        let mut synced = None;
        {
            let mut st = sync::lock(&t.state);
            fast::host_wait_published(
                &mut st,
                &t.published,
                Access::Read,
                |from| {
                    synced = Some(from.ops.load(SeqCst));
                    Ok(())
                },
                &mut Grave::new(),
            )
            .unwrap();
            // The copy runs here, under the lock.
        }
        let synced = synced.expect("the host read waits for stream 1");
        if let Some(k) = launcher.join().unwrap() {
            assert!(
                k <= synced,
                "a fast-path launch (op {k}) was enqueued after the host synchronised \
                 stream 1 (which had {synced} ops)"
            );
        }
    });
}

/// A write of `t` on `on` through the slow path (the claim's lock, no gate), enqueued
/// as `op` on the stream's plain-memory queue; returns the queue then.
fn slow_write_plain(t: &T, on: &M, op: &'static str) -> Vec<&'static str> {
    slow_claim(t, on, Access::Write, || on.enqueue_plain(op))
}

/// A slow-path write on stream 1 (a `memset_zeros_async`: the claim's lock, no gate)
/// that publishes stream 1, racing a launch on stream 1 that may take the fast path on
/// what it publishes. The queue is plain memory: the launch's enqueue is ordered after
/// the memset's either by the tracker's lock (slow path) or by `publish`'s Release and
/// `admits`' Acquire (fast path). With Relaxed there, loom reports the race.
#[test]
fn fast_path_launch_sees_the_publishing_enqueue() {
    loom::model(|| {
        let s1 = stream(1);
        let t = used_by(&[], Access::Write);
        let launcher = {
            let (t, s1) = (t.clone(), s1.clone());
            thread::spawn(move || {
                {
                    let _gate = sync::lock(&s1.gate);
                    if t.published.admits(1, Access::Write) {
                        return (true, s1.enqueue_plain("launch"));
                    }
                }
                (false, slow_write_plain(&t, &s1, "launch"))
            })
        };
        slow_write_plain(&t, &s1, "memset");
        let (fast_path, queue) = launcher.join().unwrap();
        if fast_path {
            assert_eq!(
                queue,
                ["memset", "launch"],
                "the fast path ran before the publish"
            );
        }
        assert_eq!(s1.enqueue_plain("end").len(), 3);
    });
}

/// A launch on `on` reading `t` (its module's tracker).
fn launch_read(t: &T, on: &M) -> Option<usize> {
    launch_as(t, on, Access::Read)
}

/// A write on stream `writer` (a copy into a global) claims `t` as the slow path does:
/// returns the count of operations on stream `watched` that the event it waits for
/// covers.
fn writer_waits(t: &T, writer: u64, watched: u64) -> usize {
    let mut event = None;
    let st = sync::lock(&t.state);
    fast::order_before_enqueue(&st, &t.published, writer, Access::Write, |from| {
        if from.id == watched {
            event = Some(from.ops.load(SeqCst));
        }
        Ok(())
    })
    .unwrap();
    event.unwrap_or_else(|| panic!("the write waits for stream {watched}"))
}

/// A launch that took the fast path (`Some(k)`: the k-th operation on its stream) was
/// enqueued before an event that covers `event` operations of its stream.
fn assert_covered(launched: Option<usize>, event: usize) {
    if let Some(k) = launched {
        assert!(
            k <= event,
            "a fast-path read (op {k}) was enqueued after the writer's event (which \
             captured {event} ops)"
        );
    }
}

/// A module read on streams 1 and 2 (both published for reads: the second read slot),
/// a fast-path launch on stream 2 racing a write on stream 3 (a copy into a global):
/// the write's event on stream 2 comes after the launch, or the launch took the slow
/// path.
#[test]
fn fast_path_read_in_the_second_slot_is_covered_by_a_writer_event() {
    loom::model(|| {
        let (s1, s2) = (stream(1), stream(2));
        let t = used_by(&[&s1, &s2], Access::Read);
        assert!(t.published.admits(2, Access::Read), "stream 2 is published");
        let launcher = {
            let (t, s2) = (t.clone(), s2.clone());
            thread::spawn(move || launch_read(&t, &s2))
        };
        let event_on_2 = writer_waits(&t, 3, 2);
        assert_covered(launcher.join().unwrap(), event_on_2);
    });
}

/// A module read by eight idle streams, stream 1 among them and published, and a
/// fast-path launch on stream 1 racing a ninth reader, whose commit prunes the idle
/// readers: the launch is never lost from the lists (it either made stream 1 busy
/// before the prune looked, or found its id taken back and took the slow path, which
/// records it). Without the take-back before a pruning commit, loom finds a launch
/// that nothing records (an unload would not wait for it).
#[test]
fn fast_path_read_is_not_lost_to_pruning() {
    loom::model(|| {
        let s1 = stream(1);
        let others: Vec<M> = (101..101 + PRUNE_READERS_AT as u64 - 1)
            .map(stream)
            .collect();
        let mut readers = vec![&s1];
        readers.extend(others.iter());
        let t = used_by(&readers, Access::Read);
        assert!(t.published.admits(1, Access::Read), "stream 1 is published");
        for r in &readers {
            r.idle.store(true, SeqCst);
        }
        let launcher = {
            let (t, s1) = (t.clone(), s1.clone());
            thread::spawn(move || launch_read(&t, &s1))
        };
        launch_read(&t, &stream(9));
        launcher.join().unwrap();
        let st = sync::lock(&t.state);
        assert!(
            st.find(1).is_some(),
            "stream 1's launch was enqueued but is not recorded"
        );
        let (w, r) = t.published.ids();
        assert!(w == fast::NONE || st.write_is_free(w));
        assert!(r.iter().all(|&r| r == fast::NONE || st.read_is_free(r)));
    });
}

/// A module read on streams 1 and 2 (both read slots full), a fast-path launch on
/// stream 2 racing a third reader, whose publish takes stream 2's slot, followed by a
/// writer on stream 4: the writer's event on stream 2 comes after the launch, or the
/// launch took the slow path. (The eviction takes stream 2's id back under its gate;
/// without the gate, the writer no longer sees stream 2 published and its event can
/// come before a launch admitted just before the eviction.)
#[test]
fn fast_path_read_racing_its_eviction_is_covered_by_a_writer_event() {
    loom::model(|| {
        let (s1, s2, s3) = (stream(1), stream(2), stream(3));
        let t = used_by(&[&s1, &s2], Access::Read);
        assert_eq!(t.published.ids().1, [1, 2], "both read slots are full");
        let launcher = {
            let (t, s2) = (t.clone(), s2.clone());
            thread::spawn(move || launch_read(&t, &s2))
        };
        assert_eq!(
            launch_read(&t, &s3),
            None,
            "a new reader takes the slow path"
        );
        let event_on_2 = writer_waits(&t, 4, 2);
        assert_covered(launcher.join().unwrap(), event_on_2);
    });
}

/// An open read's start (`lend::open_locked`, the step `lend::open_read` runs under the
/// lock: count the lend and take back the write id, order, record the start's event on
/// stream 1, record the read) racing
/// a launch writing the buffer on stream 1, the stream the buffer was written on: the
/// launch either took the fast path and was enqueued before the start's event (so the
/// outside reads, which wait for that event, come after it), or took the slow path and
/// is refused while the read is open (or ran before it opened). The close
/// (`lend::close_locked`) publishes the write id again.
#[test]
fn fast_path_write_is_covered_by_an_open_read_or_refused() {
    loom::model(|| {
        let s1 = stream(1);
        let t = written_and_published(&s1);
        let writer = {
            let (t, s1) = (t.clone(), s1.clone());
            thread::spawn(move || {
                {
                    let _gate = sync::lock(&s1.gate);
                    if t.published.admits(1, Access::Write) {
                        return Ok(Some(s1.ops.fetch_add(1, SeqCst) + 1));
                    }
                }
                // The slow path: the claim's order step refuses it while the read is open.
                let mut st = sync::lock(&t.state);
                if fast::order_before_enqueue(&st, &t.published, 1, Access::Write, |_| Ok(()))
                    .is_err()
                {
                    assert!(st.lends > 0, "refused with no read open");
                    return Err("refused");
                }
                s1.ops.fetch_add(1, SeqCst);
                let s1b = s1.clone();
                fast::record_after_enqueue(
                    &mut st,
                    &t.published,
                    1,
                    Access::Write,
                    move |_| s1b.clone(),
                    &mut None,
                );
                Ok(None)
            })
        };
        let start_event;
        {
            // `lend::open_read`'s own step under the lock.
            let mut st = sync::lock(&t.state);
            let s1b = s1.clone();
            start_event = lend::open_locked(
                &mut st,
                &t.published,
                1,
                |_| Ok(()),
                // The start: cudarc's event recorded on stream 1 captures its ops so far.
                || Ok(s1.ops.load(SeqCst)),
                move |_| s1b.clone(),
                &mut None,
            )
            .unwrap();
            assert!(
                !t.published.admits(1, Access::Write),
                "a write id while lent"
            );
        }
        match writer.join().unwrap() {
            Ok(Some(k)) => assert!(
                k <= start_event,
                "a fast-path write (op {k} on stream 1) was enqueued after the open read's \
                 start (which captured {start_event} ops)"
            ),
            // Slow path before the read opened (ordered by the lock), or refused.
            Ok(None) | Err(_) => {}
        }
        // The close (`OpenRead`'s drop) lets writes back onto the fast path: stream 1 is
        // still the one writer, and no read is open.
        let mut st = sync::lock(&t.state);
        let s1b = s1.clone();
        lend::close_locked(&mut st, &t.published, 1, move |_| s1b.clone(), &mut None);
        assert_eq!(st.lends, 0);
        assert!(
            t.published.admits(1, Access::Write),
            "no write id after the close"
        );
    });
}
