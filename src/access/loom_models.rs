//! Loom models of the claim protocol (declared in `mod.rs`, `cfg(all(test, loom))`).

use super::*;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::thread;

/// A mock stream. `enqueued` is set once the operation claimed on it is enqueued.
#[derive(Clone)]
struct M {
    id: u64,
    enqueued: Arc<AtomicBool>,
}
impl TrackedStream for M {
    fn id(&self) -> u64 {
        self.id
    }
    fn is_idle(&self) -> bool {
        false
    }
}
fn stream(id: u64) -> M {
    M {
        id,
        enqueued: Arc::new(AtomicBool::new(false)),
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
/// never on an event recorded before the first was enqueued (the audit's race).
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
