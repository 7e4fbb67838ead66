//! The NCCL watchdog: one background thread per process that watches every non-blocking
//! NCCL communicator (a [`RankComm`](crate::collective::RankComm) of NCCL) with work in flight, polls
//! `ncclCommGetAsyncError`, and aborts (`ncclCommAbort`) a communicator whose peer failed
//! or whose work outlived its timeout, so that the caller's own waits (a stream
//! synchronize, a `dtoh`, an event) return instead of spinning for ever behind an NCCL
//! kernel waiting for a dead peer.
//!
//! **One thread for the process**, not one per communicator: a process has few
//! communicators, and one thread costs one wake-up per period instead of one per
//! communicator; what could make one communicator hold up the others — an
//! `ncclCommAbort` that waits for the device — runs on a thread of its own
//! ([`spawn_abort`]), never on the watchdog — nor on the owner's thread, for the
//! aborts the owner takes — and events are never destroyed on the watchdog thread
//! (`Watched`'s drop). The thread starts when a communicator first
//! records work in flight, sleeps on a condition variable while no communicator has any
//! (no polling when idle) and exits after [`LINGER`] without work; a later call starts it
//! again.
//!
//! **The gate** ([`Gate`]) is the state each communicator shares with the watchdog. NCCL
//! forbids two threads calling into one communicator at once (its "Thread Safety" page),
//! so the owner's calls and the watchdog's polls exclude each other through it: the
//! watchdog starts a round only while the owner is outside NCCL (else it skips the
//! communicator this round: the owner's own call polls the same error), and the owner
//! waits for a round already started, which is only non-blocking calls
//! (`cuEventQuery`, `ncclCommGetAsyncError`). No lock is held while anyone calls NCCL or
//! the driver. A failure (the watchdog's, or the owner's own) sets the communicator's
//! verdict once; the abort is taken exactly once, by whichever party is the last to leave
//! NCCL after the verdict, so `ncclCommAbort` never runs while anyone else is inside the
//! communicator, and after it nobody enters (every later call returns the verdict).

mod gate;

use crate::error::{Error, Result};
use crate::stream::{BoundStream, Event, EventFlags};
use crate::sync;
pub(crate) use gate::{Close, Enter, Gate, Round, Who, scan};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often the watchdog looks at communicators with work in flight.
pub(crate) const POLL: Duration = Duration::from_millis(2);
/// How long the watchdog thread stays without work before it exits.
pub(crate) const LINGER: Duration = Duration::from_secs(1);
/// The longest the owner waits for a watchdog round on its communicator (normally
/// microseconds: a `cuEventQuery` or two and `ncclCommGetAsyncError`).
pub(crate) const ROUND_LIMIT: Duration = Duration::from_secs(10);

/// How often the owner yields before sleeping while a watchdog round holds its
/// communicator.
const YIELDS: u32 = 8;
/// `ncclInternalError`, the code of a panic inside a watchdog round.
const NCCL_INTERNAL_ERROR: i32 = 3;

/// The owner's error when a watchdog round did not end within [`ROUND_LIMIT`].
fn round_stuck() -> Error {
    Error::Timeout {
        what: "gpubind's NCCL watchdog to finish polling this communicator (a driver or \
               NCCL call that does not return)",
        after_ms: ROUND_LIMIT.as_millis() as u64,
    }
}

/// One watched communicator: its handle and what it shares with the watchdog.
pub(crate) struct Watched {
    /// The `ncclComm_t`, as an address.
    pub(crate) raw: usize,
    pub(crate) nranks: usize,
    /// How long a call may stay in flight: the communicator's timeout (`None`: not
    /// watched — a blocking communicator, or an NCCL without `ncclCommAbort`).
    pub(crate) timeout: Option<Duration>,
    pub(crate) gate: sync::Mutex<Gate<Event>>,
    /// The communicator's device, once known (set at its creation by `RankComm`, else
    /// from its first call's event): the abort thread pushes its context.
    pub(crate) device: std::sync::OnceLock<Arc<crate::device::Device>>,
    /// Set once `ncclCommAbort` of the communicator (taken through the gate) has
    /// returned: NCCL's abort joins the background job of a non-blocking enqueue, so
    /// from then on NCCL appends nothing more to any stream.
    pub(crate) abort_returned: AtomicBool,
}

impl Drop for Watched {
    /// Events still here (noted after the verdict, given back by a wait) are destroyed
    /// with the state, except on the watchdog thread, which hands them to a thread of
    /// their own ([`drop_elsewhere`]): destroying an event can wait inside the driver for
    /// an abort running on another thread, and the watchdog must never wait for one.
    fn drop(&mut self) {
        if !ON_WATCHDOG.with(|f| f.get()) {
            return;
        }
        let mut g = sync::lock(&self.gate);
        let mut events: Vec<Event> = std::mem::take(&mut g.queue)
            .into_iter()
            .map(|e| e.event)
            .collect();
        events.append(&mut g.spare);
        drop(g);
        drop_elsewhere(events);
    }
}

impl Watched {
    /// The owner enters the gate, waiting out a watchdog round in progress (it makes
    /// only non-blocking calls). Should a round not end within [`ROUND_LIMIT`] (a driver
    /// call that hangs), the owner's call fails instead of waiting for ever.
    pub(crate) fn owner_enter(&self) -> Result<()> {
        // Read only once a round holds the gate: the common call reads no clock here.
        let mut start = None;
        let mut pause = Duration::from_micros(5);
        for tries in 0u32.. {
            match sync::lock(&self.gate).owner_enter() {
                Enter::Go => return Ok(()),
                Enter::Refused(e) => return Err(e),
                Enter::Busy => {}
            }
            if start.get_or_insert_with(Instant::now).elapsed() > ROUND_LIMIT {
                return Err(round_stuck());
            }
            // A round is a few microseconds, and the shortest sleep on Linux is ~50 µs:
            // yield a few times first.
            if tries < YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_micros(200));
            }
        }
        Err(round_stuck())
    }

    /// Records `e` as the verdict (the first one stays) and, if the abort falls to the
    /// caller (`inside`: the owner, inside the gate now; else nobody's part), makes it
    /// on a thread of its own ([`spawn_abort`]) with the events of the communicator's
    /// work. The caller makes no NCCL call on the communicator after. Returns `e`.
    pub(crate) fn fail(self: &Arc<Self>, e: Error, inside: bool) -> Error {
        let take = sync::lock(&self.gate).fail(e.clone(), inside.then_some(Who::Owner));
        if take {
            spawn_abort(Arc::clone(self), self.take_events());
        }
        e
    }

    /// The owner leaves the gate (after [`owner_enter`](Self::owner_enter)); should the
    /// abort fall to it (a verdict came while it was inside), it is made on a thread of
    /// its own ([`spawn_abort`]).
    pub(crate) fn owner_leave(self: &Arc<Self>) {
        if sync::lock(&self.gate).owner_leave() {
            spawn_abort(Arc::clone(self), self.take_events());
        }
    }

    /// Closes the gate for the owner's drop (see [`Gate::close`]). Past [`ROUND_LIMIT`]
    /// with a round still in progress: `Close::Busy`, and the drop leaks the
    /// communicator (it can neither destroy nor abort it under the watchdog).
    pub(crate) fn close(&self) -> Close {
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            match sync::lock(&self.gate).close() {
                Close::Busy if start.elapsed() > ROUND_LIMIT => return Close::Busy,
                Close::Busy => {}
                other => return other,
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }

    /// Owner: `event` was recorded after `op`; the watchdog watches it.
    pub(crate) fn note_in_flight(self: &Arc<Self>, event: Event, op: &'static str) {
        if self.device.get().is_none() {
            let _ = self.device.set(Arc::clone(event.device()));
        }
        let register = sync::lock(&self.gate).note_in_flight(event, op, Instant::now());
        if register && self.timeout.is_some() {
            register_comm(self);
        }
    }

    /// Waits, at most `limit`, until the communicator's abort (taken through the gate
    /// after a verdict) has returned; `false` if it has not by then.
    pub(crate) fn wait_abort_returned(&self, limit: Duration) -> bool {
        let deadline = Instant::now().checked_add(limit);
        let mut pause = Duration::from_micros(20);
        loop {
            if self.abort_returned.load(Ordering::Acquire) {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// The verdict, if the communicator failed.
    pub(crate) fn verdict(&self) -> Option<Error> {
        sync::lock(&self.gate).verdict().cloned()
    }

    /// An event of the communicator's spares, or a new one; give it back with
    /// [`give_back`](Self::give_back) if unused.
    pub(crate) fn spare_event(&self, stream: &BoundStream<'_>) -> Result<Event> {
        let spare = sync::lock(&self.gate).spare.pop();
        match spare {
            Some(ev) => Ok(ev),
            None => stream
                .bound()
                .new_event_with(EventFlags::new().timing(false)),
        }
    }

    /// Keeps `ev` for later calls. Events are never destroyed on the owner's thread
    /// after use: an abort may be running (on another thread), and destroying an event
    /// could wait for it inside the driver (seen on the H200 with a drop). They go with
    /// the communicator's state.
    pub(crate) fn give_back(&self, ev: Event) {
        sync::lock(&self.gate).spare.push(ev);
    }

    /// After work `op` of the communicator was enqueued on `stream`: records `ev` there
    /// and hands it to the watchdog ([`note_in_flight`](Self::note_in_flight)). Should
    /// the record fail, the work cannot be watched: the communicator fails with that
    /// error (aborted, its verdict, returned) rather than leaving work unwatched that a
    /// dead peer could hang.
    pub(crate) fn record_in_flight(
        self: &Arc<Self>,
        stream: &BoundStream<'_>,
        ev: Event,
        op: &'static str,
    ) -> Result<()> {
        if let Err(e) = stream.record(&ev) {
            self.give_back(ev);
            return Err(self.fail(e, false));
        }
        self.note_in_flight(ev, op);
        Ok(())
    }

    /// Work just enqueued on `stream` outside the owner's calls (a graph launch holding
    /// the communicator's captured collectives): as [`record_in_flight`] with a spare
    /// event. Infallible, since the work is enqueued already: an event that cannot be
    /// made or recorded (a failing context) fails the communicator (aborted, that error
    /// its verdict) rather than leaving the launch unwatched, logged.
    ///
    /// [`record_in_flight`]: Self::record_in_flight
    pub(crate) fn note_launch(self: &Arc<Self>, stream: &BoundStream<'_>, op: &'static str) {
        let watched = match self.spare_event(stream) {
            Ok(ev) => self.record_in_flight(stream, ev, op),
            Err(e) => Err(self.fail(e, false)),
        };
        if let Err(e) = watched {
            log::warn!(
                "gpubind: {op} cannot be watched by the NCCL watchdog (its event failed: \
                 {e}): the communicator is aborted"
            );
        }
    }

    /// The events of the communicator's work, taken out (for its drop or abort).
    pub(crate) fn take_events(&self) -> Vec<Event> {
        let mut g = sync::lock(&self.gate);
        let mut all: Vec<Event> = std::mem::take(&mut g.queue)
            .into_iter()
            .map(|e| e.event)
            .collect();
        all.append(&mut g.spare);
        all
    }

    /// One watchdog round. `false`: take it off the list.
    fn round(self: &Arc<Self>) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        let mut queue = match sync::lock(&self.gate).watch_begin() {
            Round::Skip => return true,
            Round::Leave => return false,
            Round::Go(q) => q,
        };
        let now = Instant::now();
        // Inside the gate, a panic (a logger's, say) must still end the round, or the
        // owner would wait for it for ever: it becomes the verdict.
        let looked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (done, verdict) = scan(&mut queue, timeout, now, |e| e.is_complete());
            if verdict.is_some() {
                return (done, verdict);
            }
            // SAFETY: the watchdog is inside the gate: the owner is not in NCCL, and the
            // communicator is neither aborted nor destroyed (an abort is taken only by
            // the last party to leave, the drop destroys only after the gate closed with
            // nobody inside, and neither happens before this round ends).
            (done, unsafe { super::library::poll_raw(self.raw) }.err())
        }));
        let (done, verdict) = looked.unwrap_or_else(|_| {
            (
                Vec::new(),
                Some(Error::Nccl {
                    call: "gpubind's NCCL watchdog",
                    code: NCCL_INTERNAL_ERROR,
                    name: "ncclInternalError".into(),
                    description: "gpubind's NCCL watchdog panicked while watching this \
                                  communicator (a fault of gpubind or of a logger): it was \
                                  aborted"
                        .into(),
                }),
            )
        });
        let (take, keep) = sync::lock(&self.gate).watch_end(queue, done, verdict, now);
        if take {
            spawn_abort(Arc::clone(self), self.take_events());
        }
        keep
    }
}

/// The communicators with work in flight, and whether the thread runs.
struct Registry {
    comms: Vec<Arc<Watched>>,
    running: bool,
}

static REGISTRY: std::sync::Mutex<Registry> = std::sync::Mutex::new(Registry {
    comms: Vec::new(),
    running: false,
});
static WAKE: std::sync::Condvar = std::sync::Condvar::new();
/// Set at process exit: the watchdog stops.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Aborts (and event drops) running on their own threads.
static ABORTS: AtomicUsize = AtomicUsize::new(0);
/// The process that owns the watchdog's state (its thread, its aborts, its exit hook):
/// set before the first of them starts, 0 before. A child made by `fork` inherits the
/// statics and the exit hook but no thread: in it, `REGISTRY` and `ABORTS` describe the
/// parent (and `REGISTRY`'s lock may have been held by a parent's thread at the fork,
/// for ever locked in the child), so a process whose id differs has no watchdog, and
/// nothing here touches the registry there.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Set on the watchdog thread (see [`Watched`]'s drop).
    static ON_WATCHDOG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// Tests: [`spawn_counted`] on this thread asks for a thread that cannot start.
    static FAIL_SPAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this process is a `fork` child of the process that started the watchdog.
fn forked_child() -> bool {
    let owner = OWNER_PID.load(Ordering::Acquire);
    owner != 0 && owner != std::process::id()
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts `w` on the watchdog's list, starting the thread if it is not running. In a
/// `fork` child of the process that started the watchdog: nothing (no watchdog there;
/// the registry is the parent's, its lock possibly held for ever), logged.
fn register_comm(w: &Arc<Watched>) {
    if forked_child() {
        log::warn!(
            "gpubind: an NCCL communicator used in a forked child of the process that \
             started the NCCL watchdog is not watched"
        );
        return;
    }
    let mut reg = registry();
    reg.comms.push(Arc::clone(w));
    if !reg.running && !EXITING.load(Ordering::Acquire) {
        wait_at_exit();
        match std::thread::Builder::new()
            .name("gpubind-nccl-watchdog".into())
            .spawn(run)
        {
            Ok(_) => reg.running = true,
            Err(e) => log::warn!(
                "gpubind: cannot start the NCCL watchdog thread ({e}): NCCL collectives \
                 are not watched (a dead peer can leave this process's stream waits \
                 hanging)"
            ),
        }
    }
    WAKE.notify_all();
}

/// Whether the watchdog thread is running (for tests).
#[cfg(all(test, not(loom)))]
fn running() -> bool {
    registry().running
}

/// The watchdog thread.
fn run() {
    ON_WATCHDOG.with(|f| f.set(true));
    loop {
        let comms = {
            let mut reg = registry();
            let idle_since = Instant::now();
            loop {
                if EXITING.load(Ordering::Acquire) {
                    reg.running = false;
                    WAKE.notify_all();
                    return;
                }
                if !reg.comms.is_empty() {
                    break;
                }
                let left = LINGER.saturating_sub(idle_since.elapsed());
                if left.is_zero() {
                    reg.running = false;
                    return;
                }
                reg = WAKE
                    .wait_timeout(reg, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            reg.comms.clone()
        };
        for w in &comms {
            // A panic (a logger's) must not kill the watchdog of every communicator.
            let keep = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.round()))
                .unwrap_or(false);
            if !keep {
                let mut reg = registry();
                if let Some(i) = reg.comms.iter().position(|c| Arc::ptr_eq(c, w)) {
                    reg.comms.swap_remove(i);
                }
            }
        }
        // Possibly the last references (the owner dropped its communicator): `Watched`'s
        // drop hands any events left to another thread.
        drop(comms);
        std::thread::sleep(POLL);
    }
}

/// A job that runs on a thread of its own, counted in `ABORTS` until it has returned
/// (and dropped what it captured), so that process exit waits for it.
type Job = Box<dyn FnOnce() + Send>;

/// Starts `job` on a thread named `name`, counted (see [`Job`]). On failure the job is
/// handed back with the error, not run.
fn spawn_counted(name: &str, job: Job) -> std::result::Result<(), (std::io::Error, Job)> {
    /// Puts the count back however the job ends (a panic too).
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            ABORTS.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let slot = Arc::new(std::sync::Mutex::new(Some(job)));
    let theirs = Arc::clone(&slot);
    ABORTS.fetch_add(1, Ordering::AcqRel);
    let counted = Counted;
    wait_at_exit();
    let builder = std::thread::Builder::new().name(name.into());
    // Tests: a stack no system gives, so that the spawn fails.
    #[cfg(all(test, not(loom)))]
    let builder = match FAIL_SPAWN.with(|f| f.get()) {
        true => builder.stack_size(1 << 50),
        false => builder,
    };
    let spawned = builder.spawn(move || {
        let _counted = counted;
        let job = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = job {
            // Its captures (the last `Arc<Watched>`, events) are dropped before it
            // returns, so before the count goes down.
            job();
        }
    });
    match spawned {
        Ok(_) => Ok(()),
        Err(e) => {
            // The closure (with `counted` and its `slot`) was dropped by the failed
            // spawn: the count is back, and the job is still in the slot.
            let job = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            match job {
                Some(job) => Err((e, job)),
                None => Ok(()),
            }
        }
    }
}

/// `ncclCommAbort` of `w` on a thread of its own (it may wait for work queued on the
/// device), then the events of its work are dropped there too (destroying one could
/// wait for the abort inside the driver). Counted, so that process exit waits for it.
/// Should no thread start (the system's limit), the abort is made on the calling thread
/// instead (logged): a communicator that failed is always aborted.
pub(crate) fn spawn_abort(w: Arc<Watched>, events: Vec<Event>) {
    let job: Job = Box::new(move || abort_now(&w, events));
    if let Err((e, job)) = spawn_counted("gpubind-nccl-abort", job) {
        log::warn!(
            "gpubind: cannot start a thread for ncclCommAbort ({e}): the NCCL \
             communicator is aborted on this thread (it may wait for the device's work)"
        );
        job();
    }
}

/// The abort itself (see [`spawn_abort`]), then `events` dropped.
fn abort_now(w: &Watched, events: Vec<Event>) {
    let device = w
        .device
        .get()
        .cloned()
        .or_else(|| events.first().map(|e| Arc::clone(e.device())));
    {
        // NCCL's abort works on the communicator's device; push its context so that
        // the CUDA runtime inside NCCL finds it (a fresh thread has none).
        let _guard = device.as_ref().and_then(|d| d.enter().ok());
        // NCCL (the CUDA runtime) may change the thread's current context: put the
        // pushed one back before the guard pops it (as the release thread does).
        let _restore = super::library::RestoreCurrent::new();
        // SAFETY: the abort was taken once through the gate, with nobody inside NCCL
        // on this communicator, and nobody enters it after (the verdict is set); the
        // owner's drop sees it aborted and does not destroy it.
        unsafe { super::library::abort_raw(w.raw, w.nranks) };
    }
    w.abort_returned.store(true, Ordering::Release);
    drop(events);
}

/// Drops `items` on a thread of its own (counted, see [`Job`]): for events left in a
/// communicator's state when the watchdog thread holds its last reference, since
/// destroying an event can wait inside the driver for an abort on another thread, and
/// the watchdog must not stall every communicator's watching for it. Should no thread
/// start, they are leaked (logged).
fn drop_elsewhere<T: Send + 'static>(items: Vec<T>) {
    if items.is_empty() {
        return;
    }
    if let Err((e, job)) = spawn_counted("gpubind-nccl-abort", Box::new(move || drop(items))) {
        log::warn!(
            "gpubind: cannot start a thread to destroy an NCCL communicator's events \
             ({e}): they are leaked"
        );
        std::mem::forget(job);
    }
}

/// The process-exit hook (see [`wait_at_exit`]). In a `fork` child of the process that
/// registered it (which inherits the hook, the counters and a registry whose lock may
/// be held for ever, but no thread): returns at once, touching nothing.
extern "C" fn on_exit() {
    if forked_child() {
        return;
    }
    EXITING.store(true, Ordering::Release);
    WAKE.notify_all();
    let limit = crate::teardown::drop_wait::drop_timeout();
    let deadline = Instant::now().checked_add(limit);
    let busy = || registry().running || ABORTS.load(Ordering::Acquire) > 0;
    while busy() && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(1));
    }
    if busy() {
        log::warn!(
            "gpubind: the process exits while an NCCL abort (or the NCCL watchdog) \
             still runs (GPUBIND_DROP_TIMEOUT passed at exit)"
        );
    }
}

/// Registers, once, a process-exit hook that stops the watchdog and gives aborts still
/// running up to `GPUBIND_DROP_TIMEOUT` to finish, so that `exit` does not tear NCCL and
/// CUDA down under them (as `crate::teardown::release`'s hook does for the release threads).
/// Registered after NCCL was loaded (a communicator exists), so it runs before NCCL's own
/// teardown. Records this process as the owner of the watchdog's state
/// ([`OWNER_PID`]) before anything of it starts.
fn wait_at_exit() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    REGISTERED.call_once(|| {
        OWNER_PID.store(std::process::id(), Ordering::Release);
        // SAFETY: the C library's `atexit` with a plain fn that lives as long as the
        // program; it compares the process id, stores an atomic, notifies, and polls a
        // lock and an atomic.
        if unsafe { atexit(on_exit) } != 0 {
            log::warn!("gpubind: atexit failed: the NCCL watchdog is not stopped at exit");
        }
    });
}

mod comm;

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_models;
