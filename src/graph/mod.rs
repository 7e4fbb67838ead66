//! CUDA graphs: capture, captured graphs and their instantiation (the capture rules are on
//! [`Capture`]).

mod capture;

pub use capture::{Capture, CaptureLaunch};

use crate::access::{self, Access, AccessTracker, Use};
use crate::device::CheckOn;
use crate::device::Device;
use crate::device::poison::KernelName;
use crate::error::{Error, Result};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::sync::Arc;

/// A captured CUDA graph: the recorded work, and the buffers and modules it uses,
/// borrowed for `'buf`. Not runnable itself: [`instantiate`](Self::instantiate) it.
///
/// `Send` (not `Sync`: the driver does not synchronise calls on one graph).
pub struct Graph<'buf> {
    device: Arc<Device>,
    raw: sys::CUgraph,
    uses: Uses<'buf>,
}

/// Up to this many trackers (buffers, modules and the executable graph's own), a graph
/// launch claims them with inline arrays.
const INLINE_USES: usize = 8;

/// An executable graph: launched on a bound stream with [`launch`](Self::launch), any
/// number of times; [`update`](Self::update)d from a graph of the same shape.
///
/// Borrows what its graph borrows (`'buf`). `Send`, not `Sync` (the driver does not
/// synchronise calls on one executable graph). Dropping it waits for its pending launches.
pub struct GraphExec<'buf> {
    device: Arc<Device>,
    raw: sys::CUgraphExec,
    uses: Uses<'buf>,
    /// The streams of this graph's pending launches: the drop waits for them.
    launches: AccessTracker,
}

/// The allocations (and module launch trackers) a graph uses, one entry per tracker with
/// the strongest access, plus the last kernel captured (for the poison message).
///
/// Each value counts once, for as long as it lives, in every gate it holds
/// ([`LaunchAgreement::retain`]/[`release`](LaunchAgreement::release)): a graph and its
/// executable graphs each hold one.
#[derive(Default)]
struct Uses<'buf> {
    trackers: Vec<(&'buf AccessTracker, Access)>,
    /// What the graph keeps alive itself rather than borrows (a
    /// [`Blas`](crate::blas::Blas)'s handles and workspace: the `Blas` may be dropped
    /// before the graph), its memory claimed at each launch like the borrowed buffers.
    owned: Vec<(Arc<dyn Owned>, Access)>,
    /// The ranks whose captured NCCL collectives are in the graph (one entry per rank,
    /// in capture order; launches take their locks in address order), each with the
    /// headers its collectives agreed at capture: every launch agrees on them with the
    /// rank's peers first (see [`LaunchAgreement`]).
    agreements: Vec<(&'buf dyn LaunchAgreement, Vec<u8>)>,
    last_kernel: Option<&'static KernelName>,
}

/// What a launch of a graph holding a rank's captured NCCL collectives does first
/// (feature `nccl`): agree with the rank's peers that they launch the graph of the same
/// collective capture, then enqueue — under a lock of the rank's, so the rank's launches
/// reach the device in the order they agreed. `Err` enqueues nothing.
///
/// A graph may hold the collectives of several ranks (communicators). A launch takes
/// their locks in address order (one order for every thread of the process), then agrees
/// through each in *capture* order (the order in which the graph first used each, the
/// same on every rank: collectives of several communicators on one stream must be issued
/// in one order by all ranks anyway); addresses differ between processes, so agreeing in
/// address order could have two processes wait on each other's rank 0 until the
/// timeout. See [`agreed`].
pub(crate) trait LaunchAgreement: Sync {
    /// This rank's turn to launch: holds the rank's launch lock until it drops (no other
    /// launch through the rank agrees meanwhile).
    fn turn(&self) -> Box<dyn LaunchTurn + '_>;

    /// The graph was just enqueued on `stream` (with every turn held): the rank records
    /// it as its work in flight (its NCCL watchdog times it). Infallible: the launch is
    /// enqueued already.
    fn launched(&self, stream: &BoundStream<'_>);

    /// One more graph or executable graph holds this gate (NCCL does not destroy a
    /// communicator while a graph that captured it lives: the rank's drop needs to know
    /// whether one was forgotten).
    fn retain(&self);

    /// [`retain`](Self::retain)'s graph is gone.
    fn release(&self);
}

/// One rank's part in one launch (see [`LaunchAgreement::turn`]).
pub(crate) trait LaunchTurn {
    /// Refuses the launch (the rank cannot launch: its error, which its peers are told
    /// too), or agrees on it with the peers: `record` is what the rank's collectives in
    /// the graph agreed at capture.
    fn agree(&mut self, record: &[u8]) -> Result<()>;

    /// A failure after this rank agreed (another rank's refusal, the claim, the enqueue):
    /// the peers were told to go ahead and may be waiting in the launch; tell them, and
    /// return the launch's error.
    fn fail(&mut self, e: Error) -> Error;
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

/// Runs `launch` once every gate of `gates` agreed: takes their turns (locks) in
/// address order, agrees through them in the order given (capture order), then launches.
/// A refusal, or a launch that fails, is told to the ranks that had agreed (all of them,
/// for a failed launch).
fn agreed(
    gates: &[(&dyn LaunchAgreement, Vec<u8>)],
    launch: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let key = |g: &dyn LaunchAgreement| g as *const dyn LaunchAgreement as *const () as usize;
    let mut by_address: Vec<usize> = (0..gates.len()).collect();
    by_address.sort_by_key(|&i| key(gates[i].0));
    let mut turns: Vec<Option<Box<dyn LaunchTurn + '_>>> = gates.iter().map(|_| None).collect();
    for i in by_address {
        turns[i] = Some(gates[i].0.turn());
    }
    let mut turns: Vec<Box<dyn LaunchTurn + '_>> = turns.into_iter().flatten().collect();
    for (i, (_, record)) in gates.iter().enumerate() {
        if let Err(e) = turns[i].agree(record) {
            return Err(turns[..i].iter_mut().fold(e, |e, t| t.fail(e)));
        }
    }
    launch().map_err(|e| turns.iter_mut().fold(e, |e, t| t.fail(e)))
}

/// Device memory a graph holds by `Arc` (see `Uses::owned`): its tracker orders the
/// graph's launches against its other uses, and its drop waits for them.
pub(crate) trait Owned: Send + Sync {
    /// The allocation's tracker.
    fn tracker(&self) -> &AccessTracker;
}

impl<'buf> Uses<'buf> {
    fn add(&mut self, t: &'buf AccessTracker, access: Access) {
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
    fn add_owned(&mut self, o: Arc<dyn Owned>, access: Access) {
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
    fn add_agreement(&mut self, gate: &'buf dyn LaunchAgreement, record: &[u8]) {
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
    fn keep_counted(&mut self) {
        self.agreements.clear();
    }

    /// How many trackers a launch claims (without the executable graph's own).
    fn len(&self) -> usize {
        self.trackers.len() + self.owned.len()
    }

    /// Every tracker a launch claims, with its access.
    fn all(&self) -> impl Iterator<Item = (&AccessTracker, Access)> {
        self.trackers
            .iter()
            .copied()
            .chain(self.owned.iter().map(|(o, a)| (o.tracker(), *a)))
    }
}

// SAFETY: a CUgraph is a thread-agnostic identifier; gpubind calls the driver on it only
// with its device's context pushed, and `&mut`/owned access (no `Sync`) serialises the
// calls, as the driver requires. The borrowed trackers are `Sync`, and the memory held by
// `Arc` (`Uses::owned`) is `Send + Sync` (the `Owned` bound).
unsafe impl Send for Graph<'_> {}
// SAFETY: as for Graph; `launch` takes `&self` but the type is not `Sync`, so calls on one
// executable graph never run concurrently.
unsafe impl Send for GraphExec<'_> {}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GraphExec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.len())
            .finish_non_exhaustive()
    }
}

impl<'buf> Graph<'buf> {
    /// The graph's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// How many nodes the graph has (`cuGraphGetNodes`).
    pub fn node_count(&self) -> Result<usize> {
        let _guard = self.device.enter()?;
        let mut n = 0usize;
        // SAFETY: a live graph; a null array asks for the count only.
        unsafe { sys::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut n) }
            .check_on(&self.device, "cuGraphGetNodes")?;
        Ok(n)
    }

    /// Instantiates the graph (`cuGraphInstantiateWithFlags`): an executable graph that
    /// borrows what this one borrows. The graph may be dropped, changed or instantiated
    /// again afterwards.
    pub fn instantiate(&self) -> Result<GraphExec<'buf>> {
        let _guard = self.device.enter()?;
        let mut raw: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph of this context (current for the call); writes one handle.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0) }
            .check_on(&self.device, "cuGraphInstantiateWithFlags")?;
        Ok(GraphExec {
            device: Arc::clone(&self.device),
            raw,
            uses: self.uses.clone(),
            launches: AccessTracker::default(),
        })
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not destroy it. Nodes added through it are not
    /// tracked (their memory is the caller's to keep alive and ordered).
    pub unsafe fn raw(&self) -> sys::CUgraph {
        self.raw
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        let raw = self.raw;
        let destroyed = crate::teardown::faults::release(
            format_args!("a Graph"),
            &self.device,
            Ok(()),
            "cuGraphDestroy",
            // SAFETY: created by cuStreamEndCapture, destroyed once, here; executable
            // graphs instantiated from it are independent of it.
            || unsafe { sys::cuGraphDestroy(raw) },
        );
        if !destroyed {
            self.uses.keep_counted();
        }
    }
}

/// What [`GraphExec::update`] reports when the driver cannot update in place
/// (`CUgraphExecUpdateResult`).
fn update_result_name(r: sys::CUgraphExecUpdateResult) -> &'static str {
    use sys::CUgraphExecUpdateResult as R;
    match r {
        R::CU_GRAPH_EXEC_UPDATE_SUCCESS => "success",
        R::CU_GRAPH_EXEC_UPDATE_ERROR => "the update failed for an unexpected reason",
        R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => {
            "the topology changed (nodes or dependencies added or removed)"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => "a node's type changed",
        R::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED => {
            "a kernel node's function changed in a way that cannot be updated"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => {
            "a node's parameters changed in a way that cannot be updated"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => {
            "something about the node is not supported by updates"
        }
        R::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE => {
            "a kernel node's function changed in an unsupported way"
        }
        #[allow(unreachable_patterns)]
        _ => "an unknown update result",
    }
}

impl<'buf> GraphExec<'buf> {
    /// The graph's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Launches the graph on `stream` (`cuGraphLaunch`), a stream of the graph's device.
    /// The launch is ordered after the pending uses, on other streams, of the buffers the
    /// graph uses (writes after everything, reads after writes), and their later uses,
    /// host accesses and drops wait for it — as for a kernel launch. Launches of one
    /// executable graph are also ordered among themselves by the driver.
    ///
    /// A graph holding a rank's captured NCCL collectives (`Capture::rank_all_reduce`
    /// and its siblings, feature `collective`) first agrees with the rank's peers, when
    /// the rank checks its calls (`RankComm::from_launch`, `GPUBIND_CHECK_CALLS`), that
    /// they launch the graph of the same collective capture:
    /// one round trip to rank 0 per launch; a peer that calls something else instead gets
    /// the same typed error as this rank, and nothing is enqueued.
    pub fn launch(&self, stream: &BoundStream<'_>) -> Result<()> {
        stream.bound().expect_device("graph", &self.device)?;
        stream.ensure_stream_context()?;
        if self.uses.agreements.is_empty() {
            self.claim_and_enqueue(stream)
        } else {
            agreed(&self.uses.agreements, &mut || {
                self.claim_and_enqueue(stream)?;
                for (gate, _) in &self.uses.agreements {
                    gate.launched(stream);
                }
                Ok(())
            })
        }
    }

    /// Claims the graph's buffers on `stream`, enqueues it and records the launch.
    fn claim_and_enqueue(&self, stream: &BoundStream<'_>) -> Result<()> {
        // The graph's buffers and modules, and this executable graph's own launches (so
        // its drop waits for them), claimed from before the enqueue until after it.
        let n = self.uses.len() + 1;
        let all = self
            .uses
            .all()
            .map(Some)
            .chain(std::iter::once(Some((&self.launches, Access::Write))));
        if n <= INLINE_USES {
            // The usual graph: no allocation.
            let mut uses: [Use<'_>; INLINE_USES] = [None; INLINE_USES];
            for (slot, u) in uses.iter_mut().zip(all) {
                *slot = u;
            }
            let mut locks = access::locks::<INLINE_USES>();
            let _claim = access::claim(stream.slot(), &mut uses[..n], &mut locks[..n])?;
            self.enqueue(stream)
        } else {
            let mut uses: Vec<Use<'_>> = all.collect();
            let locks: Vec<Option<access::Held<'_>>> = uses.iter().map(|_| None).collect();
            let _claim = access::claim(stream.slot(), &mut uses, locks)?;
            self.enqueue(stream)
        }
    }

    /// `cuGraphLaunch` on `stream`, under the caller's claim.
    fn enqueue(&self, stream: &BoundStream<'_>) -> Result<()> {
        if let Some(k) = self.uses.last_kernel {
            self.device.poison_state().launching(k);
        }
        // SAFETY: a live executable graph of this device, launched on a stream of it
        // (context checked above); everything it uses is borrowed for 'buf and ordered by
        // the claim held across the enqueue.
        unsafe { sys::cuGraphLaunch(self.raw, stream.raw()) }
            .check_on(&self.device, "cuGraphLaunch")
    }

    /// Updates this executable graph in place from `graph` (`cuGraphExecUpdate_v2`):
    /// `graph` must have the same topology (the same nodes, of the same types, with the
    /// same dependencies); kernel parameters, memset values and copy addresses may
    /// differ. Launches already enqueued are not affected. From now on the launches claim
    /// what `graph` uses.
    ///
    /// [`Error::GraphUpdate`] when the driver refuses (the executable graph is unchanged)
    /// or either graph holds captured NCCL collectives (NCCL's state for them belongs to
    /// the graph they were captured into), [`Error::WrongDevice`] for a graph of another
    /// device.
    pub fn update(&mut self, graph: &Graph<'buf>) -> Result<()> {
        self.device.expect_same("graph", &graph.device)?;
        if !self.uses.agreements.is_empty() || !graph.uses.agreements.is_empty() {
            // NCCL keeps what a captured collective needs at run time with the graph it
            // was captured into (CUDA user objects): an executable graph updated to run
            // another capture's collectives would use state that capture's graph frees.
            // And each launch is a collective of one capture's ranks.
            return Err(Error::GraphUpdate {
                reason: "a graph holding captured NCCL collectives cannot be updated (nor \
                         updated to): instantiate the new graph instead"
                    .into(),
            });
        }
        let _guard = self.device.enter()?;
        let mut info = sys::CUgraphExecUpdateResultInfo {
            result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
            errorNode: std::ptr::null_mut(),
            errorFromNode: std::ptr::null_mut(),
        };
        // SAFETY: a live executable graph and a live graph of this context (current for
        // the call); writes the result info. `&mut self` (and !Sync) excludes a
        // concurrent launch.
        let r = unsafe { sys::cuGraphExecUpdate_v2(self.raw, graph.raw, &mut info) };
        match r {
            sys::CUresult::CUDA_SUCCESS => {
                self.uses = graph.uses.clone();
                Ok(())
            }
            sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Err(Error::GraphUpdate {
                reason: update_result_name(info.result).to_owned(),
            }),
            code => code.check_on(&self.device, "cuGraphExecUpdate_v2"),
        }
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not destroy it. Launches and changes made through it
    /// are not seen by gpubind's ordering of the graph's buffers.
    pub unsafe fn raw(&self) -> sys::CUgraphExec {
        self.raw
    }
}

impl Drop for GraphExec<'_> {
    fn drop(&mut self) {
        let waited = self.launches.wait_all();
        let raw = self.raw as usize;
        // On the release thread, bounded like the other releases that may wait for the
        // whole device (crate::teardown::release): unmeasured for cuGraphExecDestroy.
        let released = crate::teardown::faults::release_bounded(
            format_args!("a GraphExec"),
            &self.device,
            waited,
            "cuGraphExecDestroy",
            // SAFETY: instantiated by cuGraphInstantiateWithFlags in this context (current
            // while this runs), destroyed once, here, after its launches finished (waited
            // above).
            Box::new(move || unsafe { sys::cuGraphExecDestroy(raw as sys::CUgraphExec) }),
        );
        if matches!(released, crate::teardown::release::Released::Failed) {
            self.uses.keep_counted();
        }
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

    /// What the test gates saw, in order, across all of them: `(gate, event)`.
    type Journal = std::sync::Mutex<Vec<(u8, String)>>;

    /// A launch agreement that logs what it was asked and may refuse.
    struct Gate<'j> {
        name: u8,
        refuse: bool,
        journal: &'j Journal,
        held: std::sync::atomic::AtomicUsize,
    }

    struct Turn<'a, 'j>(&'a Gate<'j>);

    impl Drop for Turn<'_, '_> {
        fn drop(&mut self) {
            self.0.note("unlock".into());
        }
    }

    impl LaunchTurn for Turn<'_, '_> {
        fn agree(&mut self, record: &[u8]) -> Result<()> {
            self.0.note(format!("agree {record:?}"));
            if self.0.refuse {
                return Err(Error::InvalidArgument(format!(
                    "gate {} refused",
                    self.0.name
                )));
            }
            Ok(())
        }

        fn fail(&mut self, e: Error) -> Error {
            self.0.note("told".into());
            e
        }
    }

    impl Gate<'_> {
        fn note(&self, what: String) {
            self.journal.lock().unwrap().push((self.name, what));
        }
    }

    impl LaunchAgreement for Gate<'_> {
        fn turn(&self) -> Box<dyn LaunchTurn + '_> {
            self.note("lock".into());
            Box::new(Turn(self))
        }

        fn launched(&self, _: &BoundStream<'_>) {}

        fn retain(&self) {
            self.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }

        fn release(&self) {
            self.held.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn gate(name: u8, refuse: bool, journal: &Journal) -> Gate<'_> {
        Gate {
            name,
            refuse,
            journal,
            held: Default::default(),
        }
    }

    /// The events of `journal` (taken), as `"gate:event"` strings.
    fn events(journal: &Journal) -> Vec<String> {
        std::mem::take(&mut *journal.lock().unwrap())
            .into_iter()
            .map(|(g, e)| format!("{g}:{e}"))
            .collect()
    }

    #[test]
    fn agreements_lock_in_address_order_and_agree_in_capture_order() {
        let journal = Journal::default();
        let (a, b) = (gate(1, false, &journal), gate(2, false, &journal));
        let addr = |g: &dyn LaunchAgreement| g as *const dyn LaunchAgreement as *const () as usize;
        // `low` has the lower address; the graph uses `high` first.
        let (low, high) = if addr(&a) < addr(&b) {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let mut u = Uses::default();
        u.add_agreement(high, &[10]);
        u.add_agreement(low, &[20]);
        u.add_agreement(high, &[30, 31]);
        assert_eq!(u.agreements.len(), 2, "one entry per gate");
        let mut launched = 0;
        agreed(&u.agreements, &mut || {
            launched += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(launched, 1);
        let (l, h) = (low.name, high.name);
        assert_eq!(
            events(&journal)[..4],
            [
                format!("{l}:lock"),
                format!("{h}:lock"),
                format!("{h}:agree [10, 30, 31]"),
                format!("{l}:agree [20]"),
            ]
        );
        // Every live `Uses` holding a gate counts once in it (a graph and each
        // executable graph instantiated from it); a leaked graph handle keeps its count.
        let held = |g: &Gate| g.held.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((held(&a), held(&b)), (1, 1));
        let exec = u.clone();
        assert_eq!((held(&a), held(&b)), (2, 2));
        drop(u);
        assert_eq!((held(&a), held(&b)), (1, 1));
        let mut leaked = exec;
        leaked.keep_counted();
        drop(leaked);
        assert_eq!((held(&a), held(&b)), (1, 1));
    }

    #[test]
    fn a_refusal_or_a_failed_launch_is_told_to_the_ranks_that_agreed() {
        let journal = Journal::default();
        let (c, d, e) = (
            gate(3, false, &journal),
            gate(4, true, &journal),
            gate(5, false, &journal),
        );
        // Capture order c, d, e: d refuses, so c (agreed) is told, e never agrees.
        let mut u = Uses::default();
        for g in [&c, &d, &e] {
            u.add_agreement(g, &[]);
        }
        let mut launched = 0;
        let err = agreed(&u.agreements, &mut || {
            launched += 1;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(launched, 0);
        assert!(err.to_string().contains("gate 4 refused"), "{err}");
        let ev = events(&journal);
        assert!(ev.contains(&"3:told".to_string()), "{ev:?}");
        assert!(!ev.contains(&"5:agree []".to_string()), "{ev:?}");
        assert!(!ev.contains(&"4:told".to_string()), "{ev:?}");
        assert_eq!(ev.iter().filter(|x| x.ends_with(":unlock")).count(), 3);
        // Every rank agrees, then the launch fails: all are told.
        let (f, g) = (gate(6, false, &journal), gate(7, false, &journal));
        let mut u = Uses::default();
        u.add_agreement(&f, &[]);
        u.add_agreement(&g, &[]);
        let err = agreed(&u.agreements, &mut || {
            Err(Error::InvalidArgument("claim failed".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("claim failed"));
        let ev = events(&journal);
        assert!(ev.contains(&"6:told".to_string()) && ev.contains(&"7:told".to_string()));
    }

    #[test]
    fn update_results_are_named() {
        use sys::CUgraphExecUpdateResult as R;
        assert!(
            update_result_name(R::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED).contains("topology")
        );
        assert!(
            update_result_name(R::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED).contains("type")
        );
    }
}
