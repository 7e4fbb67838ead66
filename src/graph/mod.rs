//! CUDA graphs: capture, captured graphs and their instantiation (the capture rules are on
//! [`Capture`]), and [`Issue`], the one way to issue work that a stream and a capture
//! share.

mod agreement;
mod capture;
mod capture_event;
mod capture_launch;
mod instantiate;
mod issue;
mod issue_stream;
mod session;
mod uses;

pub(crate) use agreement::LaunchAgreement;
#[cfg(feature = "nccl")]
pub(crate) use agreement::LaunchTurn;
use agreement::agreed;
pub use capture::Capture;
pub use capture_launch::CaptureLaunch;
pub use instantiate::InstantiateFlags;
pub use issue::{Issue, KernelLaunch, StreamLaunch};
pub(crate) use uses::Owned;
use uses::Uses;

use crate::access::{self, Access, AccessTracker, Use};
use crate::device::Device;
use crate::driver::result;
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

// SAFETY: a CUgraph is a thread-agnostic identifier; gpubind calls the driver on it only
// with its device's context pushed, and `&mut`/owned access (no `Sync`) serialises the
// calls, as the driver requires. The borrowed trackers and events are `Sync`, and the
// memory held by `Arc` (`Uses::owned`) is `Send + Sync` (the `Owned` bound).
unsafe impl Send for Graph<'_> {}
// SAFETY: as for Graph; `launch` takes `&self` but the type is not `Sync`, so calls on one
// executable graph never run concurrently.
unsafe impl Send for GraphExec<'_> {}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.len())
            .field("events", &self.uses.event_count())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GraphExec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.len())
            .field("events", &self.uses.event_count())
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
        // SAFETY: a live graph of this context (current for the call).
        self.device
            .check(unsafe { result::graph::node_count(self.raw) })
    }

    /// Instantiates the graph (`cuGraphInstantiateWithFlags`, no flags: see
    /// [`instantiate_with`](Self::instantiate_with)): an executable graph that borrows
    /// what this one borrows. The graph may be dropped, changed or instantiated again
    /// afterwards.
    pub fn instantiate(&self) -> Result<GraphExec<'buf>> {
        self.instantiate_with(InstantiateFlags::new())
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
        let raw = self.raw as usize;
        let released = crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a Graph"),
                device: &self.device,
                waited: Ok(()),
                call: "cuGraphDestroy",
                runs: crate::teardown::Runs::Inline,
            },
            // SAFETY: created by cuStreamEndCapture, destroyed once, here; executable
            // graphs instantiated from it are independent of it.
            move || unsafe { result::graph::destroy(raw as sys::CUgraph) },
        );
        if released != crate::teardown::Released::Done {
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
        self.device
            .check(unsafe { result::graph::launch(self.raw, stream.raw()) })
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
        // SAFETY: a live executable graph and a live graph of this context (current for
        // the call). `&mut self` (and !Sync) excludes a concurrent launch.
        let updated = unsafe { result::graph::exec_update(self.raw, graph.raw) };
        match self.device.check(updated)? {
            Ok(()) => {
                self.uses = graph.uses.clone();
                Ok(())
            }
            Err(info) => Err(Error::GraphUpdate {
                reason: update_result_name(info.result).to_owned(),
            }),
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
        let released = crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a GraphExec"),
                device: &self.device,
                waited,
                call: "cuGraphExecDestroy",
                runs: crate::teardown::Runs::OnReleaseThread,
            },
            // SAFETY: instantiated by cuGraphInstantiateWithFlags in this context (current
            // while this runs), destroyed once, here, after its launches finished (waited
            // above).
            move || unsafe { result::graph::exec_destroy(raw as sys::CUgraphExec) },
        );
        if matches!(released, crate::teardown::Released::Failed) {
            self.uses.keep_counted();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
