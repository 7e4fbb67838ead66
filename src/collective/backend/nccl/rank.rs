//! One rank of an NCCL communicator ([`NcclRank`]): the backend of a `RankComm` made by
//! `Communicator::init_all` (one thread per rank, the communicator made at the first
//! call) or by `RankComm::init_process` / `from_launch` (one rank per process, checked
//! through rank 0 when the job checks its calls).

use super::comm::NcclComm;
use super::gate::Gate;
use super::library::{UniqueId, id_bytes, unique_id};
use crate::access::Access;
use crate::collective::api::call::Call;
use crate::collective::backend::interface::{RankBackend, RankCall, RankCapture, RankSeat};
use crate::collective::callcheck::CallCheck;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::graph::Capture;
use crate::stream::BoundStream;
use std::sync::Arc;
use std::time::Duration;

/// One rank of an NCCL communicator.
pub(crate) struct NcclRank {
    /// The id of a lazily made communicator (`None`: made already, or tried and
    /// failed).
    id: Option<UniqueId>,
    /// How long the lazy initialisation and each call wait for NCCL.
    timeout: Duration,
    pub(super) comm: Option<NcclComm>,
    /// What the launches of graphs holding this rank's captured collectives go
    /// through, with the agreement on every collective through rank 0 (one rank per
    /// process from `from_launch`; `None`: not checked), which eager calls
    /// (`&mut self`) reach without locking.
    pub(super) gate: Box<Gate>,
    /// For the drop's report.
    nranks: usize,
    ordinal: usize,
}

fn failed_earlier() -> Error {
    Error::InvalidArgument(
        "this rank's NCCL initialisation failed earlier: make a new communicator".into(),
    )
}

impl NcclRank {
    /// One rank per device of `devices` (distinct, checked by the caller), each making
    /// its communicator at its first call, all from one fresh unique id.
    pub(crate) fn lazy_all(devices: &[Arc<Device>], timeout: Duration) -> Result<Vec<NcclRank>> {
        let id = unique_id()?;
        Ok(devices
            .iter()
            .map(|d| NcclRank {
                id: Some(id),
                timeout,
                comm: None,
                gate: Box::default(),
                nranks: devices.len(),
                ordinal: d.ordinal(),
            })
            .collect())
    }

    /// Rank `rank` of `nranks` separate processes meeting by `id`, made now (see
    /// `RankComm::init_process`); `check` is the job's call check, if it checks calls.
    pub(crate) fn init_process(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        (rank, nranks): (usize, usize),
        id: &[u8; 128],
        timeout: Duration,
        check: Option<CallCheck>,
    ) -> Result<NcclRank> {
        let comm = {
            // NCCL takes the device from the thread's current context.
            let _gpu = ctx.bind(device)?;
            NcclComm::init_rank_process(device, nranks, id, rank, timeout)?
        };
        ctx.forget_binding();
        let mut gate = Box::<Gate>::default();
        *gate.check_mut() = check;
        Ok(NcclRank {
            id: None,
            timeout,
            comm: Some(comm),
            gate,
            nranks,
            ordinal: device.ordinal(),
        })
    }

    /// The communicator, made now if it is made lazily (non-blocking and polled,
    /// bounded by the timeout; NCCL older than 2.14: the blocking call). The id is
    /// taken: a failed (aborted) initialisation is not retried.
    fn comm_made(&mut self, me: RankSeat<'_>) -> Result<&mut NcclComm> {
        if self.comm.is_none()
            && let Some(id) = self.id.take()
        {
            let bytes = id_bytes(&id);
            self.comm = Some(NcclComm::init_rank_process(
                me.device,
                me.nranks,
                &bytes,
                me.rank,
                self.timeout,
            )?);
        }
        self.comm.as_mut().ok_or_else(failed_earlier)
    }

    /// `e`, told first to the peers of a checked collective (send/recv are not
    /// checked).
    fn tell(&mut self, call: &RankCall<'_>, e: Error) -> Error {
        match self.gate.check_mut().as_mut() {
            Some(check) if call.peer().is_none() => check.fail(e),
            _ => e,
        }
    }

    /// One rank per process: the ranks agree on the collective through rank 0 before
    /// anything is enqueued; a call this rank cannot make is told to the others at the
    /// same collective (send/recv are not checked).
    fn agree(&mut self, call: &mut RankCall<'_>) -> Result<Call> {
        let p2p = call.peer().is_some();
        let made = std::mem::replace(&mut call.call, Err(failed_earlier()));
        match (made, self.gate.check_mut().as_mut()) {
            (Ok(made), Some(check)) => {
                check.agree_call(&made)?;
                Ok(made)
            }
            (Err(e), Some(check)) if !p2p => Err(check.fail(e)),
            (made, _) => made,
        }
    }
}

/// Enqueues the agreed `call` on `stream` and hands its event to the watchdog.
fn issue(
    comm: &mut NcclComm,
    stream: &BoundStream<'_>,
    rc: &RankCall<'_>,
    call: &Call,
) -> Result<()> {
    // What the watchdog times and the communicator's drop waits for: taken before the
    // enqueue, so that nothing but its record can fail after.
    let ev = comm.spare_event(stream)?;
    let [a, b] = rc.claims();
    // The rank's order too: after its graph launches on other streams.
    let enqueued = stream
        .claim([a, b, Some((comm.order(), Access::Write))])
        .and_then(|_claim| {
            // SAFETY: validated against this rank's device; the stream is bound; the
            // buffers are claimed (ordered after their other uses) until enqueued.
            unsafe { comm.issue(call, stream.raw()) }
        });
    match enqueued {
        Ok(()) => comm.note_issued(stream, ev, rc.kind.name()),
        Err(e) => {
            comm.give_back(ev);
            Err(e)
        }
    }
}

impl RankBackend for NcclRank {
    fn call(
        &mut self,
        me: RankSeat<'_>,
        stream: &BoundStream<'_>,
        mut rc: RankCall<'_>,
    ) -> Result<()> {
        // A communicator that failed (NCCL's error, the watchdog's timeout): its verdict
        // at once, nothing enqueued; the others of a checked job are told at this
        // collective.
        if let Some(v) = self.comm.as_ref().and_then(|c| c.verdict()) {
            return Err(self.tell(&rc, v));
        }
        let call = self.agree(&mut rc)?;
        let comm = self.comm_made(me)?;
        let issued = issue(comm, stream, &rc, &call);
        // Agreed with the others (a checked collective): a failure after the agreement
        // (a verdict set since, NCCL's error) is told to them, as the failures before it
        // are, instead of leaving them to their timeout.
        issued.map_err(|e| self.tell(&rc, e))
    }

    fn check(&self) -> Result<()> {
        match (&self.comm, &self.id) {
            (Some(c), _) => c.check(),
            (None, None) => Err(failed_earlier()),
            (None, Some(_)) => Ok(()),
        }
    }

    fn wait(&mut self, stream: &BoundStream<'_>) -> Result<()> {
        match &mut self.comm {
            Some(c) => c.wait(stream),
            None => {
                self.check()?;
                stream.synchronize()
            }
        }
    }

    fn capture<'c, 'buf>(
        &'buf self,
        capture: &mut Capture<'c, 'buf>,
        me: RankSeat<'buf>,
        call: RankCapture<'buf>,
    ) -> Result<()> {
        let comm = match (&self.comm, &self.id) {
            (Some(comm), _) => comm,
            (None, Some(_)) => {
                return Err(Error::NotCapturable {
                    what: "an NCCL collective of a RankComm not yet initialised",
                    reason: "this rank's NCCL communicator is created at its first collective \
                             (Communicator::init_all), and NCCL's initialisation allocates, \
                             which a capture forbids: make one eager call on every rank before \
                             capturing"
                        .into(),
                });
            }
            (None, None) => return Err(failed_earlier()),
        };
        super::capture::rank_collective(capture, comm, &self.gate, me, call)
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        // A graph that captured this rank's collectives and was forgotten (`mem::forget`:
        // its borrow of the RankComm ended, it was never destroyed) keeps NCCL's
        // finalize, destroy and abort waiting for ever for its destruction, and its
        // launches may still run: the communicator is leaked (valid for them), not hung
        // on.
        let forgotten = self.gate.forgotten_graphs();
        if forgotten > 0
            && let Some(c) = self.comm.take()
        {
            std::mem::forget(c);
            crate::teardown::faults::report_drop(
                format_args!("an NCCL communicator of {} ranks", self.nranks),
                Some(self.ordinal),
                crate::teardown::faults::RELEASE,
                &Error::InvalidArgument(format!(
                    "{forgotten} CUDA graph(s) holding its captured collectives were \
                     forgotten (never dropped), and NCCL destroys a communicator only \
                     after every graph that captured it"
                )),
                crate::teardown::faults::LEAKED,
            );
        }
    }
}
