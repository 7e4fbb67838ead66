//! Release calls that may wait for the whole device, run with a time limit.
//!
//! Some driver release calls synchronise with *every* piece of work on the device, not
//! only with the resource's own: measured on an H200 (driver 580), `cuMemFree` of
//! `cuMemAlloc` memory, `cuMemFree` of managed memory, `cuMemFreeHost`,
//! `cuMemHostUnregister` and `cuModuleUnload` each returned only when a kernel spinning
//! on an unrelated stream ended (3 s), while `cuStreamDestroy`, `cuEventDestroy` and
//! `cuMemFree` of stream-ordered (pool) memory returned at once. CUDA documents this only
//! as "may perform implicit synchronization". A drop that made such a call inline would
//! block for as long as any kernel anywhere on the device runs: without bound, if one
//! never ends.
//!
//! So a drop hands such a call to its device's **release thread** (one per device,
//! started on first use) and waits for it up to `GPUBIND_DROP_TIMEOUT`
//! ([`crate::teardown::drop_wait::drop_timeout`]). Normally the call finishes long before, and the
//! drop returns after the resource is gone, as if the call had been made inline. If the
//! limit passes, the drop logs that the release goes on in the background and returns;
//! the resource is unreachable by then (its owner is being dropped), and its own uses
//! were waited for before, so finishing later is sound. While a release the drop gave up
//! on is still running, later drops of the device do not wait at all (the thread is busy
//! behind the same unrelated work): one limit per device, not one per drop.
//!
//! The release thread makes the resource's context current itself (push/pop), as the
//! inline release did, so the dropping thread's binding is never touched.

use crate::device::Device;
use crate::error::Error;
use crate::sync::{self, AtomicUsize, Condvar};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A release call: the driver call's name and the call itself, made with the resource's
/// context current. `Send + 'static`: it runs on the release thread.
pub(crate) type ReleaseCall = Box<dyn FnOnce() -> crate::error::Result<()> + Send>;

/// How a [`release`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// The call returned success before the drop returned.
    Done,
    /// The call failed, or the context could not be entered (logged): the resource may
    /// be leaked.
    Failed,
    /// The limit passed first: the call goes on on the release thread (logged), which
    /// logs its failure, if any, when it ends.
    InBackground,
}

use crate::teardown::faults::{Failure, enter_and_call};

/// What the dropping thread and the release thread share about one job.
enum JobState {
    /// The release thread has not finished; the dropping thread still waits.
    Waiting,
    /// The dropping thread stopped waiting; the release thread reports a failure itself,
    /// naming this (what was dropped, and its device).
    Abandoned(String, Option<usize>),
    /// Finished while the dropping thread waited, with its failure, if any.
    Finished(Failure),
}

/// The hand-over of one job between the caller (a drop) and the release thread.
struct Handshake {
    state: sync::Mutex<JobState>,
    ready: Condvar,
}

/// What the release thread must report itself: the caller gave up on the job.
type LateReport = (String, Option<usize>, Failure);

impl Handshake {
    fn new() -> Handshake {
        Handshake {
            state: sync::Mutex::new(JobState::Waiting),
            ready: Condvar::new(),
        }
    }

    /// Release thread: the job ended with `failure`. If the caller still waits it is
    /// woken and given the failure; if it gave up, the counter is decremented and the
    /// report is returned, for the release thread to log.
    fn finish(&self, failure: Failure, abandoned: &AtomicUsize) -> Option<LateReport> {
        let mut st = sync::lock(&self.state);
        match std::mem::replace(&mut *st, JobState::Finished(None)) {
            JobState::Abandoned(what, ordinal) => {
                abandoned.fetch_sub(1, Ordering::AcqRel);
                Some((what, ordinal, failure))
            }
            _ => {
                *st = JobState::Finished(failure);
                self.ready.notify_all();
                None
            }
        }
    }

    /// Caller: waits until the job ends (`Some(failure)`) or `deadline` passes (`None`:
    /// no deadline). At the deadline, under the same lock, the job is marked abandoned
    /// (named by `what`) and the counter incremented: exactly one side reports.
    fn wait(
        &self,
        deadline: Option<Instant>,
        abandoned: &AtomicUsize,
        what: impl FnOnce() -> (String, Option<usize>),
    ) -> Option<Failure> {
        let mut st = sync::lock(&self.state);
        loop {
            if let JobState::Finished(failure) = &mut *st {
                return Some(failure.take());
            }
            let now = Instant::now();
            match deadline {
                Some(d) if now >= d => break,
                Some(d) => {
                    st = self
                        .ready
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner()),
            }
        }
        let (name, ordinal) = what();
        *st = JobState::Abandoned(name, ordinal);
        abandoned.fetch_add(1, Ordering::AcqRel);
        None
    }
}

/// One job: the work (which drops everything it captured before it returns) and where to
/// say it ended.
struct Job {
    work: Box<dyn FnOnce() -> Failure + Send>,
    slot: Arc<Handshake>,
}

/// A release thread.
struct Worker {
    queue: Mutex<mpsc::Sender<Job>>,
    /// Jobs a caller gave up waiting for that have not ended: while any is pending,
    /// callers hand their job over without waiting.
    abandoned: Arc<AtomicUsize>,
    /// Jobs handed over and not yet ended (their work, and what it captured — perhaps
    /// the device's last `Arc` — dropped): `Device::reset_primary_context` refuses while
    /// any is.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How [`Worker::run`] ended.
enum Outcome {
    Finished(Failure),
    /// Still running at the deadline: the worker reports a failure itself.
    Abandoned,
    /// The worker thread is gone: the job is given back, not run.
    NoWorker(Box<dyn FnOnce() -> Failure + Send>),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Finished(failure) => write!(f, "Finished({failure:?})"),
            Outcome::Abandoned => f.write_str("Abandoned"),
            Outcome::NoWorker(_) => f.write_str("NoWorker"),
        }
    }
}

impl Worker {
    fn spawn(name: String) -> std::io::Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let abandoned = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (counter, running) = (Arc::clone(&abandoned), Arc::clone(&in_flight));
        std::thread::Builder::new().name(name).spawn(move || {
            for job in rx {
                run_job(job, &counter);
                running.fetch_sub(1, Ordering::AcqRel);
            }
        })?;
        Ok(Worker {
            queue: Mutex::new(tx),
            abandoned,
            in_flight,
        })
    }

    /// Hands `work` to the thread and waits for it until `limit` has passed (`None`: no
    /// limit), or not at all while an earlier abandoned job is still running. `what`
    /// names the resource if the job is abandoned.
    fn run(
        &self,
        work: Box<dyn FnOnce() -> Failure + Send>,
        limit: Option<Duration>,
        what: impl FnOnce() -> (String, Option<usize>),
    ) -> Outcome {
        let slot = Arc::new(Handshake::new());
        let job = Job {
            work,
            slot: Arc::clone(&slot),
        };
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::SendError(job)) = lock(&self.queue).send(job) {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Outcome::NoWorker(job.work);
        }
        let deadline = if self.abandoned.load(Ordering::Acquire) > 0 {
            Some(Instant::now())
        } else {
            limit.and_then(|l| Instant::now().checked_add(l))
        };
        match slot.wait(deadline, &self.abandoned, what) {
            Some(failure) => Outcome::Finished(failure),
            None => Outcome::Abandoned,
        }
    }
}

/// The release thread of device `ordinal` (started on first use), or `None` if the
/// thread cannot be spawned (then calls run inline).
static WORKERS: OnceLock<Mutex<Vec<Option<&'static Worker>>>> = OnceLock::new();

/// The release thread of device `ordinal` if it was started.
fn worker_if_started(ordinal: usize) -> Option<&'static Worker> {
    let all = lock(WORKERS.get()?);
    all.get(ordinal).copied().flatten()
}

fn worker(ordinal: usize) -> Option<&'static Worker> {
    let mut all = lock(WORKERS.get_or_init(|| Mutex::new(Vec::new())));
    if all.len() <= ordinal {
        all.resize(ordinal + 1, None);
    }
    if let Some(w) = all[ordinal] {
        return Some(w);
    }
    match Worker::spawn(format!("gpubind-release-{ordinal}")) {
        Ok(w) => {
            // Leaked on purpose: one per device for the life of the process.
            let w: &'static Worker = Box::leak(Box::new(w));
            all[ordinal] = Some(w);
            wait_at_exit();
            Some(w)
        }
        Err(e) => {
            log::warn!(
                "gpubind: cannot start the release thread of device {ordinal} ({e}); \
                 releases run inline (without a time limit)"
            );
            None
        }
    }
}

/// Registers, once, a process-exit hook that gives the releases still running on the
/// release threads (handed over by drops whose limit passed) up to `GPUBIND_DROP_TIMEOUT`
/// to finish before the process exits. Without it, `exit` runs the CUDA and NCCL
/// libraries' own teardown while a release thread is inside one of their calls (seen on
/// the H200: a process whose NCCL communicator's abort was still running when `main`
/// returned exited unsuccessfully). Registered after those libraries were loaded (a
/// release thread starts only for a device in use), so it runs before their teardown
/// (`atexit` handlers run in reverse order).
fn wait_at_exit() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    extern "C" fn on_exit() {
        let limit = crate::teardown::drop_wait::drop_timeout();
        let deadline = std::time::Instant::now().checked_add(limit);
        let running = || {
            WORKERS.get().map_or(0, |all| {
                lock(all)
                    .iter()
                    .flatten()
                    .map(|w| w.in_flight.load(Ordering::Acquire))
                    .sum::<usize>()
            })
        };
        while running() > 0 && deadline.is_none_or(|d| std::time::Instant::now() < d) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let left = running();
        if left > 0 {
            log::warn!(
                "gpubind: the process exits while {left} release call(s) still run on the \
                 release threads (GPUBIND_DROP_TIMEOUT passed at exit too)"
            );
        }
    }
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    REGISTERED.call_once(|| {
        // SAFETY: the C library's `atexit` with a function that lives as long as the
        // program (a plain fn); it only reads atomics behind a lock and sleeps.
        let r = unsafe { atexit(on_exit) };
        if r != 0 {
            log::warn!("gpubind: atexit failed: releases still running at exit are not awaited");
        }
    });
}

/// How many releases of device `ordinal` are still running on its release thread (handed
/// over by drops whose limit passed, or in progress).
pub(crate) fn in_flight(ordinal: usize) -> usize {
    worker_if_started(ordinal).map_or(0, |w| w.in_flight.load(Ordering::Acquire))
}

/// Runs one job on the release thread. A panic in the release call (or in a logger it
/// reaches) is caught: the job fails, its caller is told, and the thread goes on.
fn run_job(job: Job, abandoned: &AtomicUsize) {
    let Job { work, slot } = job;
    // `work` drops what it captured (an Arc<Device>) before it returns (or unwinds), so a
    // caller that is told the job finished holds the last references again.
    let failure =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
            Some((
                crate::teardown::faults::RELEASE,
                Error::InvalidArgument(
                    "the release call panicked on gpubind's release thread".into(),
                ),
            ))
        });
    let late = slot.finish(failure, abandoned);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report_late(late)));
}

/// The release thread's own report of a job its caller gave up on.
fn report_late(late: Option<LateReport>) {
    if let Some((what, ordinal, failure)) = late
        && crate::teardown::faults::report_failure(format_args!("{what}"), ordinal, failure)
    {
        log::info!("gpubind: dropping {what}: the release finished in the background")
    }
}

/// The least a drop waits for a release call: see [`release`].
const RELEASE_FLOOR: Duration = Duration::from_millis(100);

/// Runs `call` (the driver call `call_name`) in `device`'s context on the device's
/// release thread and waits for it up to [`crate::teardown::drop_wait::drop_timeout`]; reports a
/// failure naming `what`. See the [module docs](self).
pub(super) fn release<R: crate::teardown::CallResult + 'static>(
    what: fmt::Arguments<'_>,
    device: &Arc<Device>,
    call_name: &'static str,
    call: Box<dyn FnOnce() -> R + Send>,
) -> Released {
    let call: ReleaseCall = Box::new(move || call().into_result(call_name));
    // At least RELEASE_FLOOR even with GPUBIND_DROP_TIMEOUT=0 ("do not wait for pending
    // uses"): these calls normally take microseconds, and a release that always went to
    // the background would make every free asynchronous.
    let limit = crate::teardown::drop_wait::drop_timeout().max(RELEASE_FLOOR);
    let ordinal = device.ordinal();
    let finished = |failure: Failure| {
        if crate::teardown::faults::report_failure(what, Some(ordinal), failure) {
            Released::Done
        } else {
            Released::Failed
        }
    };
    // Unbounded by request, or a poisoned context (entering fails at once): no thread.
    if limit == Duration::MAX || device.is_poisoned() {
        return finished(enter_and_call(device, call_name, call));
    }
    let Some(worker) = worker(ordinal) else {
        return finished(enter_and_call(device, call_name, call));
    };
    let dev = Arc::clone(device);
    let work = Box::new(move || enter_and_call(&dev, call_name, call));
    match worker.run(work, Some(limit), || (what.to_string(), Some(ordinal))) {
        Outcome::Finished(failure) => finished(failure),
        Outcome::NoWorker(work) => finished(work()),
        Outcome::Abandoned => {
            log::warn!(
                "gpubind: dropping {what} (device {ordinal}): {call_name} did not return \
                 within GPUBIND_DROP_TIMEOUT ({} ms): it waits for unrelated work on the \
                 device (CUDA may synchronise the whole device in this call); the release \
                 goes on in the background",
                limit.as_millis()
            );
            Released::InBackground
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn gate() -> (mpsc::Sender<()>, Box<dyn FnOnce() -> Failure + Send>) {
        let (open, wait) = channel::<()>();
        let work: Box<dyn FnOnce() -> Failure + Send> = Box::new(move || {
            let _ = wait.recv();
            None
        });
        (open, work)
    }

    fn what() -> (String, Option<usize>) {
        ("a test resource".into(), Some(0))
    }

    /// A job that ends in time is waited for and its failure handed back; one that does
    /// not is abandoned at the limit; while it is stuck, later jobs are not waited for at
    /// all; once it ends, waiting resumes.
    #[test]
    fn waits_up_to_the_limit_then_once_per_stuck_worker() {
        let w = Worker::spawn("release-test".into()).expect("spawn");
        let limit = Some(Duration::from_millis(1500));
        // Ends at once, with a failure: handed back.
        let failing: Box<dyn FnOnce() -> Failure + Send> = Box::new(|| {
            Some((
                crate::teardown::faults::RELEASE,
                Error::InvalidArgument("x".into()),
            ))
        });
        match w.run(failing, limit, what) {
            Outcome::Finished(Some((step, _))) => {
                assert_eq!(step, crate::teardown::faults::RELEASE)
            }
            other => panic!("{other:?}"),
        }
        // Stuck: abandoned after about the limit.
        let (open, stuck) = gate();
        let t = Instant::now();
        assert!(matches!(w.run(stuck, limit, what), Outcome::Abandoned));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
            "{took:?}"
        );
        assert_eq!(w.abandoned.load(Ordering::Acquire), 1);
        // Queued behind the stuck one: not waited for.
        let t = Instant::now();
        assert!(matches!(
            w.run(Box::new(|| None), limit, what),
            Outcome::Abandoned
        ));
        assert!(
            t.elapsed() < Duration::from_millis(750),
            "{:?}",
            t.elapsed()
        );
        // Both are still in flight (the first is stuck, the second queued behind it).
        assert_eq!(w.in_flight.load(Ordering::Acquire), 2);
        // Unstuck: both end, the counters return to 0, and waiting resumes.
        open.send(()).expect("open");
        let t = Instant::now();
        while w.abandoned.load(Ordering::Acquire) != 0 || w.in_flight.load(Ordering::Acquire) != 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "abandoned jobs never ended"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        match w.run(Box::new(|| None), limit, what) {
            Outcome::Finished(None) => {}
            other => panic!("{other:?}"),
        }
        // A release call that panics fails its job; the thread goes on. (A longer limit:
        // the panic message, perhaps with a backtrace, is printed on the way.)
        let long = Some(Duration::from_secs(30));
        match w.run(Box::new(|| panic!("in a release call")), long, what) {
            Outcome::Finished(Some((step, _))) => {
                assert_eq!(step, crate::teardown::faults::RELEASE)
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            w.run(Box::new(|| None), limit, what),
            Outcome::Finished(None)
        ));
    }

    /// No limit: the caller waits for as long as the job takes.
    #[test]
    fn no_limit_waits_for_the_job() {
        let w = Worker::spawn("release-test-2".into()).expect("spawn");
        let (open, slow) = gate();
        // The clock starts before the opener's sleep can, so a busy machine that runs the
        // opener first cannot make the wait look shorter than it was.
        let t = Instant::now();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            open.send(()).expect("open");
        });
        assert!(matches!(w.run(slow, None, what), Outcome::Finished(None)));
        assert!(t.elapsed() >= Duration::from_millis(150));
        opener.join().expect("opener");
    }
}

/// Model checks of the hand-over (`.ci/run` runs them with `RUSTFLAGS="--cfg loom"`):
/// whatever the interleaving, exactly one side ends a job's story — the caller gets the
/// failure, or the release thread reports it — and the abandoned-job counter returns to
/// zero; a caller without a deadline is always woken.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn failure() -> Failure {
        Some((
            crate::teardown::faults::RELEASE,
            Error::InvalidArgument("x".into()),
        ))
    }

    /// The caller gives up at once (its deadline has passed) while the release thread
    /// finishes: either may win the lock.
    #[test]
    fn loom_release_give_up_races_finish() {
        loom::model(|| {
            let hs = Arc::new(Handshake::new());
            let abandoned = Arc::new(AtomicUsize::new(0));
            let (h2, a2) = (Arc::clone(&hs), Arc::clone(&abandoned));
            let worker = thread::spawn(move || h2.finish(failure(), &a2));
            let got = hs.wait(Some(Instant::now()), &abandoned, || ("r".into(), Some(0)));
            let late = worker.join().unwrap();
            match (got, late) {
                (Some(f), None) => assert!(f.is_some()),
                (None, Some((what, _, f))) => {
                    assert_eq!(what, "r");
                    assert!(f.is_some());
                }
                (g, l) => panic!("both or neither reported: {g:?} / {l:?}"),
            }
            assert_eq!(abandoned.load(Ordering::Acquire), 0);
        });
    }

    /// Without a deadline the caller always gets the result: no lost wake-up.
    #[test]
    fn loom_release_waiter_is_always_woken() {
        loom::model(|| {
            let hs = Arc::new(Handshake::new());
            let abandoned = Arc::new(AtomicUsize::new(0));
            let (h2, a2) = (Arc::clone(&hs), Arc::clone(&abandoned));
            let worker = thread::spawn(move || h2.finish(None, &a2));
            let got = hs.wait(None, &abandoned, || ("r".into(), None));
            assert!(matches!(got, Some(None)));
            assert!(worker.join().unwrap().is_none());
            assert_eq!(abandoned.load(Ordering::Acquire), 0);
        });
    }
}
