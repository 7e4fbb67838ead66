//! The own-kernel backend of a `RankComm` made by `Communicator::init_all`
//! ([`KernelsRank`]): the ranks' threads meet in one process ([`Meeting`]) and the last
//! to arrive enqueues the collective on every rank's stream.

use super::engine::{self, Enter, Lane, Shared};
use super::meeting::{Key, Meeting};
use crate::access::{Access, AccessTracker, StreamRef, claim_lanes};
use crate::collective::api::call::{Call, Kind, check_matched, check_no_aliasing, check_pair};
use crate::collective::api::options::Transport;
use crate::collective::backend::interface::{RankBackend, RankCall, RankCapture, RankSeat};
use crate::collective::support::settle_on_error;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::graph::Capture;
use crate::stream::{BoundStream, Event};
use std::sync::Arc;
use std::time::Duration;

/// A tracker of a buffer posted to a 1:1 meeting by a rank thread.
#[derive(Clone, Copy)]
struct TrackerPtr(*const AccessTracker);

// SAFETY: the pointer is dereferenced only by the thread that runs the meeting, while the
// posting thread is blocked in `Meeting::meet` with the buffer borrowed: it returns only
// after the meeting's closure has finished, or (timeout, a departed peer) after taking its
// post back under the meeting's lock, which the run holds from taking the posts to its
// end, so a withdrawn post is never run.
unsafe impl Send for TrackerPtr {}

/// One rank's part of a 1:1 collective: its lane, its validated call and its buffers.
pub(crate) struct RankPost {
    lane: Lane,
    call: Call,
    uses: Vec<(TrackerPtr, Access)>,
}

/// Claims every rank's buffers on that rank's lane, then runs `enqueue` with the lanes
/// and calls, holding the claim until it returns. The first rank's error, if any, wins.
fn enqueue_posts(
    posts: Vec<Result<RankPost>>,
    enqueue: impl FnOnce(&[Lane], &[Call]) -> Result<()>,
) -> Result<()> {
    let posts = posts.into_iter().collect::<Result<Vec<_>>>()?;
    let mut claims = Vec::new();
    for p in &posts {
        for &(TrackerPtr(t), access) in &p.uses {
            // SAFETY: see `TrackerPtr`: the posting thread keeps the buffer borrowed until
            // this meeting has run.
            let tracker = unsafe { &*t };
            claims.push((tracker, access, p.lane.stream_ref.clone()));
        }
    }
    let _claim = claim_lanes(claims)?;
    let (lanes, calls): (Vec<Lane>, Vec<Call>) =
        posts.into_iter().map(|p| (p.lane, p.call)).unzip();
    let refs: Vec<StreamRef> = lanes.iter().map(|l| l.stream_ref.clone()).collect();
    settle_on_error(&refs, enqueue(&lanes, &calls))
}

/// What the threads of one own-kernel 1:1 communicator share.
struct World {
    shared: Shared,
    meet: Meeting<Result<RankPost>>,
    /// `0..nranks`: the parties of a collective.
    ranks: Vec<usize>,
    /// How long a rank waits for the others.
    timeout: Duration,
}

/// One rank of an own-kernel communicator whose ranks are threads of one process.
pub(crate) struct KernelsRank {
    world: Arc<World>,
    /// The rank's barrier event, made at its first call.
    event: Option<Event>,
    /// For the drop: the others must not wait for this rank any more.
    rank: usize,
}

impl KernelsRank {
    /// One rank per device of `devices` (a device may appear for several ranks).
    pub(crate) fn all(
        devices: &[Arc<Device>],
        transport: Transport,
        timeout: Duration,
    ) -> Result<Vec<KernelsRank>> {
        let nranks = devices.len();
        let world = Arc::new(World {
            shared: Shared::new(devices, transport)?,
            meet: Meeting::new(),
            ranks: (0..nranks).collect(),
            timeout,
        });
        Ok((0..nranks)
            .map(|rank| KernelsRank {
                world: Arc::clone(&world),
                event: None,
                rank,
            })
            .collect())
    }

    /// This rank's post: its lane (the caller's stream, its barrier event) and the
    /// validated call with its buffers.
    fn post(
        &mut self,
        me: RankSeat<'_>,
        stream: &BoundStream<'_>,
        rc: RankCall<'_>,
    ) -> Result<RankPost> {
        let call = rc.call?;
        // The caller's stream may be one another library captures: refused, as every
        // operation on it is (the lanes' claims below do not check streams).
        stream.ensure_stream_context()?;
        let gpu = stream.bound();
        self.world.shared.ensure_kernels(gpu)?;
        if self.event.is_none() {
            self.event = Some(gpu.new_event(false)?);
        }
        let ev = self.event.as_ref().map(|e| {
            // SAFETY: the event lives in this rank, which the calling thread borrows
            // mutably until the meeting ends.
            unsafe { e.raw() }
        });
        Ok(RankPost {
            lane: Lane {
                device: Arc::clone(me.device),
                stream_ref: stream.to_ref(),
                // SAFETY: the stream is borrowed for this call, which does not return
                // before the collective is enqueued.
                stream: unsafe { stream.raw() },
                event: ev.unwrap_or(std::ptr::null_mut()),
            },
            call,
            uses: rc
                .uses
                .iter()
                .map(|&(t, a)| (TrackerPtr(t as *const AccessTracker), a))
                .collect(),
        })
    }
}

impl RankBackend for KernelsRank {
    fn call(&mut self, me: RankSeat<'_>, stream: &BoundStream<'_>, rc: RankCall<'_>) -> Result<()> {
        let (kind, peer) = (rc.kind, rc.peer());
        let post = self.post(me, stream, rc);
        let world = &*self.world;
        let shared = &world.shared;
        let Some(peer) = peer else {
            return world.meet.meet(
                Key::Coll,
                &world.ranks,
                me.rank,
                post,
                world.timeout,
                |posts| {
                    enqueue_posts(posts, |lanes, calls| {
                        check_matched(calls)?;
                        check_no_aliasing(calls.len(), calls)?;
                        let rank_lane: Vec<usize> = (0..calls.len()).collect();
                        engine::collective(&mut Enter, shared, lanes, &rank_lane, calls)
                    })
                },
            );
        };
        let rank = me.rank;
        let (key, slot, pair) = match kind {
            Kind::Send(_) => (Key::Pair(rank, peer), 0, [rank, peer]),
            _ => (Key::Pair(peer, rank), 1, [peer, rank]),
        };
        world
            .meet
            .meet(key, &pair, slot, post, world.timeout, |posts| {
                enqueue_posts(posts, |lanes, calls| {
                    check_pair(&calls[0], &calls[1])?;
                    check_no_aliasing(2, calls)?;
                    engine::p2p(&mut Enter, shared, lanes, (0, 1), &calls[0], &calls[1])
                })
            })
    }

    fn capture<'c, 'buf>(
        &'buf self,
        _capture: &mut Capture<'c, 'buf>,
        _me: RankSeat<'buf>,
        _call: RankCapture<'buf>,
    ) -> Result<()> {
        Err(Error::NotCapturable {
            what: "a collective of an own-kernel RankComm",
            reason: "its ranks' threads meet on the host at every call (one of them \
                     enqueues the collective for all), which a graph launch cannot do; \
                     capture Capture::all_reduce on a Communicator whose ranks all live on \
                     the capturing device, or use the NCCL backend"
                .into(),
        })
    }
}

impl Drop for KernelsRank {
    fn drop(&mut self) {
        // The other ranks must not wait for this one any more.
        let why = if std::thread::panicking() {
            "its thread panicked (its RankComm was dropped while unwinding)"
        } else {
            "its RankComm was dropped"
        };
        self.world.meet.depart(self.rank, why);
    }
}
