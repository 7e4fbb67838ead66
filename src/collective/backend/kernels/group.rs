//! The own-kernel backend of a `Communicator`: the engine ([`Shared`]) runs a group's
//! matched collectives and send/recv pairs over the communicator's lanes.

use super::engine::{self, Lane, Shared};
use crate::collective::api::call::{Call, Plan};
use crate::collective::backend::interface::{GroupBackend, GroupLanes};
use crate::context::ThreadContext;
use crate::error::Result;
use std::sync::Arc;

/// The engine's view of the communicator's lanes.
fn engine_lanes(lanes: &GroupLanes<'_>) -> Vec<Lane> {
    lanes
        .lanes
        .iter()
        .map(|(s, e)| Lane {
            device: Arc::clone(s.device()),
            stream_ref: s.to_ref(),
            // SAFETY: both live in the communicator's lanes for the whole group, which
            // borrows the communicator; they are only used with their device bound.
            stream: unsafe { s.raw() },
            // SAFETY: as above.
            event: unsafe { e.raw() },
        })
        .collect()
}

impl GroupBackend for Shared {
    fn enqueue(
        &self,
        ctx: &mut ThreadContext,
        lanes: &GroupLanes<'_>,
        _calls: &[Call],
        plan: &Plan,
    ) -> Result<()> {
        let engine_lanes = engine_lanes(lanes);
        for coll in &plan.colls {
            engine::collective(ctx, self, &engine_lanes, lanes.rank_lane, coll)?;
        }
        for (s, r) in &plan.p2p {
            let pair = (lanes.rank_lane[s.rank], lanes.rank_lane[r.rank]);
            engine::p2p(ctx, self, &engine_lanes, pair, s, r)?;
        }
        Ok(())
    }

    fn is_host_staged(&self) -> bool {
        self.is_staged()
    }

    fn capturable_engine(&self) -> Result<&Shared> {
        Ok(self)
    }
}
