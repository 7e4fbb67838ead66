//! Model checks (loom) of the two pieces of shared state gpubind keeps:
//! the per-thread `ThreadContext` slot and the lazy, once-only primary-context retain.
//!
//! In the crate (not under `tests/`) because the retain/release seam they model,
//! `PrimaryCtxOps` and `LazyPrimary`, is crate-private: public, it let safe code release
//! a primary context under live slices.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_tests`
//! (`.ci/run` does). Compiled only under `cfg(all(test, loom))`.

use crate::device::LazyPrimary;
use crate::driver::PrimaryCtxOps;
use crate::{Error, ThreadContext};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;

/// A model of the driver: counts retains and releases; can fail the first retains.
struct MockDriver {
    retains: AtomicUsize,
    releases: AtomicUsize,
    fail_first: usize,
    attempts: AtomicUsize,
    /// Shared with the test so it can read the counts after the cell is dropped.
    released_total: Arc<AtomicUsize>,
}

impl MockDriver {
    fn new(fail_first: usize, released_total: Arc<AtomicUsize>) -> Self {
        MockDriver {
            retains: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
            fail_first,
            attempts: AtomicUsize::new(0),
            released_total,
        }
    }
}

impl PrimaryCtxOps for MockDriver {
    type Ctx = u64;
    fn retain(&self, device: i32) -> crate::Result<u64> {
        if self.attempts.fetch_add(1, SeqCst) < self.fail_first {
            return Err(Error::InvalidArgument("mock retain failure".into()));
        }
        self.retains.fetch_add(1, SeqCst);
        Ok(0xC0DE_0000 + device as u64)
    }
    fn release(&self, _device: i32) {
        self.releases.fetch_add(1, SeqCst);
        self.released_total.fetch_add(1, SeqCst);
    }
}

#[test]
fn concurrent_first_binds_retain_exactly_once() {
    loom::model(|| {
        let released = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(LazyPrimary::new(MockDriver::new(0, released.clone()), 3));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let cell = cell.clone();
                thread::spawn(move || cell.get().unwrap())
            })
            .collect();
        let main_view = cell.get().unwrap();
        for t in threads {
            // Every thread sees the same context and the same retain id.
            assert_eq!(t.join().unwrap(), main_view);
        }
        assert_eq!(main_view.0, 0xC0DE_0003);
        assert_eq!(cell.ops().retains.load(SeqCst), 1);
        assert_eq!(cell.ops().releases.load(SeqCst), 0);
        drop(cell);
        assert_eq!(
            released.load(SeqCst),
            1,
            "the last owner releases exactly once"
        );
    });
}

#[test]
fn last_owner_releases_once_whichever_thread_it_is() {
    loom::model(|| {
        let released = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(LazyPrimary::new(MockDriver::new(0, released.clone()), 0));
        cell.get().unwrap();
        let other = cell.clone();
        let t = thread::spawn(move || drop(other));
        drop(cell);
        t.join().unwrap();
        assert_eq!(released.load(SeqCst), 1);
    });
}

#[test]
fn failed_retain_is_retried_and_never_released() {
    loom::model(|| {
        let released = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(LazyPrimary::new(MockDriver::new(1, released.clone()), 0));
        let c2 = cell.clone();
        let t = thread::spawn(move || c2.get().is_ok());
        let here = cell.get().is_ok();
        let there = t.join().unwrap();
        // Exactly one of the two first attempts failed; the other retained.
        assert!(here ^ there, "one call fails, the other retains");
        assert!(cell.is_retained());
        assert_eq!(cell.ops().retains.load(SeqCst), 1);
        drop(cell);
        assert_eq!(
            released.load(SeqCst),
            1,
            "one successful retain, one release"
        );
    });
}

#[test]
fn never_bound_is_never_released() {
    loom::model(|| {
        let released = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(LazyPrimary::new(MockDriver::new(0, released.clone()), 0));
        let c2 = cell.clone();
        thread::spawn(move || assert!(!c2.is_retained()))
            .join()
            .unwrap();
        drop(cell);
        assert_eq!(released.load(SeqCst), 0);
    });
}

#[test]
fn one_token_per_thread() {
    loom::model(|| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                thread::spawn(|| {
                    let first = ThreadContext::acquire().expect("each thread gets one token");
                    assert_eq!(
                        ThreadContext::acquire().unwrap_err(),
                        Error::ThreadContextTaken
                    );
                    drop(first);
                    let again = ThreadContext::acquire().expect("drop frees the slot");
                    drop(again);
                })
            })
            .collect();
        let mine = ThreadContext::acquire().expect("main thread's token");
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            ThreadContext::acquire().unwrap_err(),
            Error::ThreadContextTaken
        );
        drop(mine);
    });
}
