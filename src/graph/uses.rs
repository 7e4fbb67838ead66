//! What a graph uses: the buffers and modules it borrows, the memory it keeps alive, and
//! the launch agreements of the NCCL ranks it captured.

use super::agreement::LaunchAgreement;
use crate::access::{Access, AccessTracker};
use crate::device::poison::KernelName;
use std::sync::Arc;

/// The allocations (and module launch trackers) a graph uses, one entry per tracker with
/// the strongest access, plus the last kernel captured (for the poison message).
///
/// Each value counts once, for as long as it lives, in every gate it holds
/// ([`LaunchAgreement::retain`]/[`release`](LaunchAgreement::release)): a graph and its
/// executable graphs each hold one.
#[derive(Default)]
pub(super) struct Uses<'buf> {
    trackers: Vec<(&'buf AccessTracker, Access)>,
    /// What the graph keeps alive itself rather than borrows (a kernel's module, or an
    /// integration's handles and scratch memory such as a cuBLAS workspace, whose owner
    /// may be dropped before the graph), its memory claimed at each launch like the
    /// borrowed buffers.
    owned: Vec<(Arc<dyn Owned>, Access)>,
    /// The ranks whose captured NCCL collectives are in the graph (one entry per rank,
    /// in capture order; launches take their locks in address order), each with the
    /// headers its collectives agreed at capture: every launch agrees on them with the
    /// rank's peers first (see [`LaunchAgreement`]).
    pub(super) agreements: Vec<(&'buf dyn LaunchAgreement, Vec<u8>)>,
    pub(super) last_kernel: Option<&'static KernelName>,
}

impl Clone for Uses<'_> {
    fn clone(&self) -> Self {
        for (gate, _) in &self.agreements {
            gate.retain();
        }
        Uses {
            trackers: self.trackers.clone(),
            owned: self.owned.clone(),
            agreements: self.agreements.clone(),
            last_kernel: self.last_kernel,
        }
    }
}

impl Drop for Uses<'_> {
    fn drop(&mut self) {
        for (gate, _) in &self.agreements {
            gate.release();
        }
    }
}

/// Device memory a graph holds by `Arc` (see `Uses::owned`): its tracker orders the
/// graph's launches against its other uses, and its drop waits for them.
pub(crate) trait Owned: Send + Sync {
    /// The allocation's tracker.
    fn tracker(&self) -> &AccessTracker;
}

impl<'buf> Uses<'buf> {
    pub(super) fn add(&mut self, t: &'buf AccessTracker, access: Access) {
        match self.trackers.iter_mut().find(|(x, _)| std::ptr::eq(*x, t)) {
            Some((_, a)) => {
                if access == Access::Write {
                    *a = Access::Write;
                }
            }
            None => self.trackers.push((t, access)),
        }
    }

    /// Keeps `o` alive with the graph and claims it with `access` at each launch.
    #[cfg_attr(not(feature = "cublas"), allow(dead_code))]
    pub(super) fn add_owned(&mut self, o: Arc<dyn Owned>, access: Access) {
        match self
            .owned
            .iter_mut()
            .find(|(x, _)| std::ptr::eq(x.tracker(), o.tracker()))
        {
            Some((_, a)) => {
                if access == Access::Write {
                    *a = Access::Write;
                }
            }
            None => self.owned.push((o, access)),
        }
    }

    /// Appends `record` to what the launches agree on through `gate` (see
    /// [`LaunchAgreement`]); a new gate goes last (the agreements stay in capture order).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(super) fn add_agreement(&mut self, gate: &'buf dyn LaunchAgreement, record: &[u8]) {
        let key = |g: &dyn LaunchAgreement| g as *const dyn LaunchAgreement as *const () as usize;
        match self
            .agreements
            .iter()
            .position(|(g, _)| key(*g) == key(gate))
        {
            Some(i) => self.agreements[i].1.extend_from_slice(record),
            None => {
                gate.retain();
                self.agreements.push((gate, record.to_vec()));
            }
        }
    }

    /// For a graph whose driver handle was not destroyed (leaked after a failed wait or
    /// call): it stays counted in every gate it holds, as a forgotten one does. NCCL
    /// keeps a reference to a communicator from each graph that captured it, and waits
    /// for it in the communicator's finalize, destroy and abort; the rank's drop must
    /// see this graph as alive and leak the communicator instead of waiting for ever.
    pub(super) fn keep_counted(&mut self) {
        self.agreements.clear();
    }

    /// How many trackers a launch claims (without the executable graph's own).
    pub(super) fn len(&self) -> usize {
        self.trackers.len() + self.owned.len()
    }

    /// Every tracker a launch claims, with its access.
    pub(super) fn all(&self) -> impl Iterator<Item = (&AccessTracker, Access)> {
        self.trackers
            .iter()
            .copied()
            .chain(self.owned.iter().map(|(o, a)| (o.tracker(), *a)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_keep_one_entry_per_tracker_with_the_strongest_access() {
        let (a, b) = (AccessTracker::default(), AccessTracker::default());
        let mut u = Uses::default();
        u.add(&a, Access::Read);
        u.add(&b, Access::Write);
        u.add(&a, Access::Write);
        u.add(&b, Access::Read);
        u.add(&a, Access::Read);
        assert_eq!(u.trackers.len(), 2);
        assert!(u.trackers.iter().all(|(_, acc)| *acc == Access::Write));
    }
}
