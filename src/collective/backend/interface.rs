//! What every backend implements: [`RankBackend`] runs one rank's calls for a
//! [`RankComm`](crate::collective::RankComm), [`GroupBackend`] runs a group's calls for
//! every rank of a [`Communicator`](crate::collective::Communicator). The public types
//! validate each call (`api::call`) and hand it to their backend through these traits;
//! they never look at which backend it is.

use crate::access::{Access, AccessTracker};
use crate::collective::api::call::{Buf, Call, Kind, Plan};
use crate::collective::api::types::DType;
use crate::collective::backend::kernels::engine::Shared;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::Result;
use crate::graph::Capture;
use crate::stream::{BoundStream, Event, Stream};
use std::sync::Arc;

/// Who a [`RankComm`](crate::collective::RankComm) is: its rank, the number of ranks
/// and its device.
#[derive(Clone, Copy)]
pub(crate) struct RankSeat<'a> {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: &'a Arc<Device>,
}

/// One call of a rank, as its backend gets it: validated (`call`), or the reason it
/// cannot be made, which a backend whose ranks wait for each other tells them.
pub(crate) struct RankCall<'a> {
    pub(crate) kind: Kind,
    pub(crate) call: Result<Call>,
    /// The call's buffers and how it uses them, to claim on the rank's stream.
    pub(crate) uses: Vec<(&'a AccessTracker, Access)>,
}

impl<'a> RankCall<'a> {
    /// The partner of a send or receive; `None` for a collective.
    pub(crate) fn peer(&self) -> Option<usize> {
        match self.kind {
            Kind::Send(p) | Kind::Recv(p) => Some(p),
            _ => None,
        }
    }

    /// The uses as the two slots a stream claim takes.
    #[cfg_attr(not(any(feature = "nccl", feature = "ipc")), allow(dead_code))]
    pub(crate) fn claims(&self) -> [Option<(&'a AccessTracker, Access)>; 2] {
        [self.uses.first().copied(), self.uses.get(1).copied()]
    }
}

/// A collective captured into a graph by one rank: its validated parts, handed to the
/// backend after the public method checked nothing (the backend decides first whether
/// it can be captured at all).
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
#[derive(Clone, Copy)]
pub(crate) struct RankCapture<'buf> {
    pub(crate) kind: Kind,
    pub(crate) dtype: DType,
    pub(crate) send: Buf<'buf>,
    pub(crate) recv: Buf<'buf>,
}

/// One rank's backend: the calls of the thread (or process) that drives the rank.
pub(crate) trait RankBackend: Send {
    /// Enqueues `call` on `stream` (bound, of the rank's device), with its buffers
    /// claimed on it until the backend has enqueued the work.
    fn call(
        &mut self,
        me: RankSeat<'_>,
        stream: &BoundStream<'_>,
        call: RankCall<'_>,
    ) -> Result<()>;

    /// Whether the rank's communicator is still usable (see
    /// [`RankComm::check`](crate::collective::RankComm::check)).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Waits for `stream`'s work, or until the communicator fails (see
    /// [`RankComm::wait`](crate::collective::RankComm::wait)).
    fn wait(&mut self, stream: &BoundStream<'_>) -> Result<()> {
        self.check()?;
        stream.synchronize()
    }

    /// Captures one collective of the rank into `capture`'s graph, or says why this
    /// backend cannot ([`Error::NotCapturable`](crate::error::Error::NotCapturable)).
    fn capture<'c, 'buf>(
        &'buf self,
        capture: &mut Capture<'c, 'buf>,
        me: RankSeat<'buf>,
        call: RankCapture<'buf>,
    ) -> Result<()>;
}

/// The lanes of a [`Communicator`](crate::collective::Communicator): rank `r` runs on
/// `lanes[rank_lane[r]]`, on device `devices[r]`.
pub(crate) struct GroupLanes<'a> {
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) devices: &'a [Arc<Device>],
    pub(crate) rank_lane: &'a [usize],
    pub(crate) lanes: &'a [(Stream, Event)],
}

/// The backend of a [`Communicator`](crate::collective::Communicator): one thread's
/// calls for every rank.
pub(crate) trait GroupBackend: Send {
    /// Enqueues a group's calls (`calls`, sorted into `plan`) on the lanes; the buffers
    /// are claimed by the caller until this returns.
    fn enqueue(
        &self,
        ctx: &mut ThreadContext,
        lanes: &GroupLanes<'_>,
        calls: &[Call],
        plan: &Plan,
    ) -> Result<()>;

    /// Whether the own kernels stage data through pinned host memory.
    fn is_host_staged(&self) -> bool {
        false
    }

    /// Ends work that may still run (the drop gave up waiting for it): NCCL aborts its
    /// communicators; the own kernels have nothing to end.
    fn abort_pending(&mut self, _devices: &[Arc<Device>]) {}

    /// The own-kernel engine, if a collective of this communicator is one kernel a
    /// graph can capture (see [`Capture::all_reduce`]), else why not.
    fn capturable_engine(&self) -> Result<&Shared>;
}
