//! The order of [`run_group`] with made-up NCCL steps: a failure after a part was handed
//! over cancels the group (no part is left waiting for a missing peer), a failure
//! before is refused before `ncclGroupStart`, and a group end that launches anyway is
//! aborted within its limit. No GPU and no NCCL needed.

use super::super::comm::wait_for_abort;
use super::super::watchdog::Watched;
use super::{GroupSteps, run_group, seam};
use crate::device::Device;
use crate::error::{Error, Result};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long the made-up abort is waited for (the real path: `GPUBIND_DROP_TIMEOUT`).
const ABORT_LIMIT: Duration = Duration::from_millis(50);

/// Made-up steps over one rank per device: a step checks its rank's device as a bind
/// does (a poisoned device is refused); NCCL is a log of what was asked of it.
struct Fake {
    devices: Vec<Arc<Device>>,
    /// The device poisoned at `ncclGroupStart`, as another thread's fault would.
    poison_at_start: Option<usize>,
    /// Whether the made-up `ncclGroupEnd` honours a cancel (NCCL does).
    honours_cancel: bool,
    cancelled: bool,
    /// Whether the made-up `ncclGroupEnd` fails by itself (after launching some parts).
    end_fails: bool,
    /// What was asked, in order.
    log: Vec<String>,
    /// The communicator the made-up abort waits for (its abort never returns).
    watch: Watched,
}

impl Fake {
    fn new(ranks: usize) -> Fake {
        let devices: Vec<Arc<Device>> = (0..ranks)
            .map(|i| Arc::new(Device::unopened_for_test(i)))
            .collect();
        let watch = Watched {
            raw: 0,
            nranks: ranks,
            timeout: None,
            gate: crate::sync::Mutex::new(Default::default()),
            device: OnceLock::new(),
            abort_returned: Default::default(),
        };
        let _ = watch.device.set(Arc::clone(&devices[0]));
        Fake {
            devices,
            poison_at_start: None,
            honours_cancel: true,
            cancelled: false,
            end_fails: false,
            log: Vec::new(),
            watch,
        }
    }

    fn poison(&self, rank: usize) {
        self.devices[rank].poison_with(
            "cuLaunchKernel",
            cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        );
    }
}

impl GroupSteps for Fake {
    fn preflight(&mut self, i: usize) -> Result<()> {
        self.log.push(format!("preflight {i}"));
        self.devices[i].check_poison()
    }
    fn start(&mut self) -> Result<()> {
        self.log.push("start".into());
        if let Some(r) = self.poison_at_start {
            self.poison(r);
        }
        Ok(())
    }
    fn step(&mut self, i: usize) -> Result<()> {
        self.log.push(format!("step {i}"));
        seam::check(i)?;
        self.devices[i].check_poison()
    }
    fn hand(&mut self, i: usize) -> Result<()> {
        self.log.push(format!("hand {i}"));
        Ok(())
    }
    fn cancel(&mut self, handed: usize) {
        self.log.push(format!("cancel {handed}"));
        self.cancelled = true;
    }
    fn end(&mut self) -> Result<()> {
        self.log.push("end".into());
        if self.end_fails || (self.cancelled && self.honours_cancel) {
            return Err(Error::InvalidArgument("ncclInvalidArgument".into()));
        }
        Ok(())
    }
    fn abort_launched(&mut self) {
        self.log.push("abort".into());
        // The real path's bounded wait for an abort that never returns.
        wait_for_abort(&self.watch, self.watch.nranks, ABORT_LIMIT);
    }
}

fn poisoned(r: &Result<()>) -> bool {
    matches!(r, Err(Error::ContextPoisoned { .. }))
}

/// A rank whose device is poisoned before the group is refused before `ncclGroupStart`:
/// nothing is handed to NCCL.
#[test]
fn a_poisoned_device_is_refused_before_the_group_starts() {
    let mut f = Fake::new(3);
    f.poison(1);
    let out = run_group(&mut f, 3);
    assert!(poisoned(&out), "{out:?}");
    assert_eq!(f.log, ["preflight 0", "preflight 1"]);
}

/// Rank 1's device poisoned after the preflight, with rank 0's part handed to NCCL: the
/// group is cancelled before `ncclGroupEnd`, which then launches nothing; the poison is
/// returned, typed, and nothing waits.
#[test]
fn a_step_failing_after_a_handover_cancels_the_group() {
    let mut f = Fake::new(3);
    f.poison_at_start = Some(1);
    let t = Instant::now();
    let out = run_group(&mut f, 3);
    let took = t.elapsed();
    println!("a failed step after a handover returned in {took:?}");
    assert!(poisoned(&out), "{out:?}");
    assert_eq!(
        f.log,
        [
            "preflight 0",
            "preflight 1",
            "preflight 2",
            "start",
            "step 0",
            "hand 0",
            "step 1",
            "cancel 1",
            "end"
        ]
    );
    // Nothing waits at all; the margin is for a busy machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// A failure at the first step (nothing handed) needs no cancel; the group is still
/// closed.
#[test]
fn a_failure_before_any_handover_closes_the_group_uncancelled() {
    let mut f = Fake::new(2);
    f.poison_at_start = Some(0);
    let out = run_group(&mut f, 2);
    assert!(poisoned(&out), "{out:?}");
    assert_eq!(
        f.log,
        ["preflight 0", "preflight 1", "start", "step 0", "end"]
    );
}

/// Should `ncclGroupEnd` report success after the cancel (the parts may have been
/// launched), the communicators are aborted: the wait for an abort that never returns
/// ends at its limit and poisons the device (its buffers leak instead of being freed
/// under the launched part); the step's error is returned.
#[test]
fn a_group_end_that_launches_anyway_is_aborted_bounded() {
    let mut f = Fake::new(2);
    f.honours_cancel = false;
    seam::fail_step_at(Some(1));
    let t = Instant::now();
    let out = run_group(&mut f, 2);
    seam::fail_step_at(None);
    let took = t.elapsed();
    println!("abort path returned in {took:?} (abort limit {ABORT_LIMIT:?})");
    match &out {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("call #1"), "{m}"),
        other => panic!("expected the seam's error, got {other:?}"),
    }
    assert_eq!(f.log.last().map(String::as_str), Some("abort"));
    assert!(f.log.contains(&"cancel 1".to_string()));
    assert!(
        f.devices[0].is_poisoned(),
        "the abort's device is not poisoned"
    );
    // Nothing waits at all; the margin is for a busy machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// `ncclGroupEnd` failing by itself (it may have launched some ranks' parts first)
/// aborts the communicators, bounded, and returns NCCL's error.
#[test]
fn a_failing_group_end_is_aborted_bounded() {
    let mut f = Fake::new(2);
    f.end_fails = true;
    let t = Instant::now();
    let out = run_group(&mut f, 2);
    let took = t.elapsed();
    println!("a failed ncclGroupEnd returned in {took:?} (abort limit {ABORT_LIMIT:?})");
    assert!(matches!(out, Err(Error::InvalidArgument(_))), "{out:?}");
    assert_eq!(f.log.last().map(String::as_str), Some("abort"));
    assert!(!f.log.contains(&"cancel 2".to_string()));
    assert!(
        f.devices[0].is_poisoned(),
        "the abort's device is not poisoned"
    );
    assert!(took < ABORT_LIMIT * 100, "took {took:?}");
}

/// The seam fails one call's step, on this thread only.
#[test]
fn the_seam_fails_one_call_on_its_thread() {
    seam::fail_step_at(Some(2));
    assert!(seam::check(1).is_ok());
    assert!(seam::check(2).is_err());
    std::thread::spawn(|| assert!(seam::check(2).is_ok()))
        .join()
        .unwrap();
    seam::fail_step_at(None);
    assert!(seam::check(2).is_ok());
}

/// A healthy group hands every call and ends once, uncancelled.
#[test]
fn a_healthy_group_hands_every_call() {
    let mut f = Fake::new(2);
    assert!(run_group(&mut f, 2).is_ok());
    assert_eq!(
        f.log,
        [
            "preflight 0",
            "preflight 1",
            "start",
            "step 0",
            "hand 0",
            "step 1",
            "hand 1",
            "end"
        ]
    );
}
