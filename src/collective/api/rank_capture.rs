//! One rank's NCCL collectives captured into a CUDA graph of its device:
//! [`Capture::rank_all_reduce`] and its siblings, all through one code path
//! (`rank_collective`), and what every launch of such a graph does first (the
//! [`LaunchAgreement`] of the rank's [`CallCheck`]).
//!
//! NCCL (2.9 and later) records a collective enqueued on a capturing stream into the
//! graph instead of running it; whether a collective is captured is a collective
//! property (every rank captures it), and every launch of the graph is a collective of
//! the ranks of that capture, each launching the graph of the same capture. So:
//!
//! * only a [`RankComm`] of the NCCL backend (one rank per thread or per process, one
//!   device per rank) is capturable; its communicator must exist already (NCCL's
//!   initialisation allocates, which a capture forbids): make one eager call first when
//!   it is made lazily ([`Communicator::init_all`](super::Communicator::init_all));
//! * the buffers are recorded like every captured operation's (inputs read, outputs
//!   written, borrowed for the graph's lifetime; an output overlapping an input is
//!   refused, and broadcast is in place by its signature), and so is the rank's order
//!   tracker ([`NcclComm::order`](super::nccl)), claimed as written by every launch like
//!   by every eager call: the rank's collectives, eager or graphed, reach the device in
//!   issue order, and the communicator's drop waits for the graph launches too;
//! * the `RankComm` is borrowed (shared) for the graph's lifetime, so it outlives every
//!   launch, and its eager calls (`&mut self`) do not compile while a graph of it lives;
//!   every graph counts itself in the rank's [`Gate`], so a drop that finds graphs left
//!   (forgotten ones: NCCL would wait for their destruction for ever) leaks the
//!   communicator instead;
//! * with a [`CallCheck`], each captured collective agrees with the peers at capture
//!   time under its own "captured" kind (a peer calling it eagerly is a mismatch), and
//!   each launch agrees on one header naming the capture (a digest of the agreed
//!   headers, sequence numbers included), inside the check's lock, which it holds until
//!   the launch is enqueued.
//!
//! Not capturable, with [`Error::NotCapturable`]: a `RankComm` of own kernels (its
//! ranks meet on the host at every call) and send/recv (no method).

use super::call::{Buf, Kind, buf, make_call};
use super::rank_comm::RankComm;
use super::rank_comm::RankInner;
use super::types::{CollectiveType, DType, Op};
use crate::access::Access;
use crate::collective::backend::nccl;
use crate::collective::callcheck::CallCheck;
use crate::copy::DeviceOnlyMemory;
use crate::error::{Error, Result};
use crate::graph::{Capture, LaunchAgreement, LaunchTurn};
use crate::memory::DeviceMemory;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What every launch of a graph holding an NCCL rank's captured collectives goes
/// through (one per NCCL `RankComm`; the graph borrows it with the `RankComm`).
#[derive(Default)]
pub(crate) struct Gate {
    /// The rank's call check (`None`: not checked). Eager calls reach it through
    /// `&mut` (no lock); captures and graph launches, through a shared borrow, lock it.
    check: Mutex<Option<CallCheck>>,
    /// Set once an NCCL call made through a shared borrow (a capture) failed: the
    /// communicator may have been aborted (`ncclCommAbort` frees it), so no graph of it
    /// may launch again.
    failed: AtomicBool,
    /// How many graphs and executable graphs holding the rank's captured collectives
    /// live. Once the `RankComm` is no longer borrowed, any left were forgotten
    /// (`mem::forget`): NCCL destroys, finalizes or aborts a communicator only after
    /// every graph that captured it is destroyed, so the drop leaks it instead of
    /// waiting for ever (see [`Gate::forgotten_graphs`]).
    graphs: AtomicUsize,
    /// The communicator's watchdog state, set at the first capture (the communicator
    /// may be made lazily, after this gate): a launch is refused once the watchdog (or
    /// a failed call) aborted the communicator, and each launch is handed to the
    /// watchdog as work in flight, like an eager call.
    #[cfg(feature = "nccl")]
    watch: std::sync::OnceLock<std::sync::Arc<crate::collective::backend::nccl::watchdog::Watched>>,
}

impl Gate {
    /// The check, for an eager call (which holds the `RankComm` mutably: no lock).
    pub(crate) fn check_mut(&mut self) -> &mut Option<CallCheck> {
        self.check.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many graphs of the rank's collectives still live. Called with the `RankComm`
    /// held mutably (its drop): no graph borrows it any more, so these were forgotten.
    pub(crate) fn forgotten_graphs(&mut self) -> usize {
        *self.graphs.get_mut()
    }
}

impl LaunchAgreement for Gate {
    fn turn(&self) -> Box<dyn LaunchTurn + '_> {
        Box::new(GateTurn {
            gate: self,
            check: self.check.lock().unwrap_or_else(PoisonError::into_inner),
        })
    }

    fn launched(&self, stream: &crate::stream::BoundStream<'_>) {
        #[cfg(feature = "nccl")]
        if let Some(w) = self.watch.get() {
            w.note_launch(stream, "collectives of a graph launch");
        }
        #[cfg(not(feature = "nccl"))]
        let _ = stream;
    }

    fn retain(&self) {
        self.graphs.fetch_add(1, Ordering::Relaxed);
    }

    fn release(&self) {
        self.graphs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One launch's turn through a rank's [`Gate`]: its call check, locked until the launch
/// is enqueued (or refused).
struct GateTurn<'a> {
    gate: &'a Gate,
    check: MutexGuard<'a, Option<CallCheck>>,
}

impl GateTurn<'_> {
    /// `e`, told to the peers first when the rank checks its calls.
    fn tell(&mut self, e: Error) -> Error {
        match self.check.as_mut() {
            Some(c) => c.fail(e),
            None => e,
        }
    }
}

impl LaunchTurn for GateTurn<'_> {
    fn agree(&mut self, record: &[u8]) -> Result<()> {
        if self.gate.failed.load(Ordering::Acquire) {
            // The peers learn it at this launch instead of waiting for this rank.
            return Err(self.tell(Error::InvalidArgument(
                "an NCCL call of this rank failed during a later capture, and its \
                 communicator may have been aborted: graphs of it no longer launch (make a \
                 new communicator and capture again)"
                    .into(),
            )));
        }
        // Aborted by the watchdog (a peer failed, a call outlived its timeout): the
        // communicator's verdict, as its eager calls return it; nothing is enqueued.
        #[cfg(feature = "nccl")]
        if let Some(v) = self.gate.watch.get().and_then(|w| w.verdict()) {
            return Err(self.tell(v));
        }
        match self.check.as_mut() {
            Some(c) => c.agree_launch(record),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        // The peers were told to go ahead: their next collective learns it through the
        // check, and those already waiting in this launch on the GPU are helped by this
        // rank's communicator going away (aborted on a thread of its own: NCCL's remote
        // error reaches peers over network transports; otherwise their watchdogs end
        // the wait at their timeout).
        #[cfg(feature = "nccl")]
        if let Some(w) = self.gate.watch.get() {
            let _ = w.fail(e.clone(), false);
        }
        self.tell(e)
    }
}

/// The NCCL communicator of `comm` and its gate, if `comm`'s collectives can be
/// captured (see the module docs).
fn capturable(comm: &RankComm) -> Result<(&nccl::NcclComm, &Gate)> {
    match &comm.inner {
        RankInner::Nccl {
            comm: Some(nccl),
            gate,
            ..
        } => Ok((nccl, gate)),
        RankInner::Nccl { id: Some(_), .. } => Err(Error::NotCapturable {
            what: "an NCCL collective of a RankComm not yet initialised",
            reason: "this rank's NCCL communicator is created at its first collective \
                     (Communicator::init_all), and NCCL's initialisation allocates, which a \
                     capture forbids: make one eager call on every rank before capturing"
                .into(),
        }),
        RankInner::Nccl { .. } => Err(Error::InvalidArgument(
            "this rank's NCCL initialisation failed earlier: make a new communicator".into(),
        )),
        RankInner::Kernels { .. } => Err(Error::NotCapturable {
            what: "a collective of an own-kernel RankComm",
            reason: "its ranks' threads meet on the host at every call (one of them \
                     enqueues the collective for all), which a graph launch cannot do; \
                     capture Capture::all_reduce on a Communicator whose ranks all live on \
                     the capturing device, or use the NCCL backend"
                .into(),
        }),
        #[cfg(feature = "ipc")]
        RankInner::Procs(_) => Err(Error::NotCapturable {
            what: "a collective of a process-rank own-kernel RankComm",
            reason: "each call exchanges a header with the peers over a Unix socket and \
                     waits on the host for their staging copies, which a graph launch cannot \
                     do; use an NCCL RankComm (RankComm::init_process / from_launch)"
                .into(),
        }),
    }
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Captures this rank's part of an all-reduce over `comm`, a [`RankComm`] of the
    /// NCCL backend on the capturing device: at each launch of the graph, `recv` gets
    /// `op` over every rank's `send`, as
    /// [`RankComm::all_reduce`](super::RankComm::all_reduce) would.
    ///
    /// Every rank must capture the same collectives in the same order (NCCL's rule for
    /// graphs), and launch the graph of that capture each time its peers launch theirs
    /// (one graph per rank, launched as a collective). With a [`CallCheck`]
    /// ([`RankComm::from_launch`], `GPUBIND_CHECK_CALLS`) both are checked: at capture,
    /// each collective agrees with the peers as an eager call does, as a *captured*
    /// collective (a peer calling it eagerly is the same [`Error::InvalidArgument`]
    /// "collective mismatch" on every rank); at each
    /// [`GraphExec::launch`](crate::GraphExec::launch), the ranks agree that they launch the graphs of the
    /// same capture (one round trip to rank 0 per launch).
    ///
    /// `send` is claimed as read and `recv` as written at each launch, both borrowed for
    /// the graph's lifetime; they must not overlap ([`Error::InvalidArgument`]). `comm`
    /// is borrowed for the graph's lifetime too (its eager calls, which take `&mut`, do
    /// not compile while the graph lives), and its drop waits (bounded) for the graph's
    /// launches. Its NCCL
    /// communicator must exist already ([`Error::NotCapturable`] for one made at its
    /// first call, as [`Communicator::init_all`](super::Communicator::init_all)'s are);
    /// a `RankComm` of own kernels is [`Error::NotCapturable`]. An NCCL call that fails
    /// during the capture discards the graph
    /// ([`BoundDevice::capture`](crate::BoundDevice::capture) returns that error).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::collective::LaunchEnv;
    /// use gpubind::{Device, Op, RankComm, ThreadContext};
    /// let env = LaunchEnv::from_env()?; // torchrun, mpirun, srun
    /// let mut ctx = ThreadContext::acquire()?;
    /// let dev = Device::get(env.local_rank)?;
    /// let comm = RankComm::from_launch(&mut ctx, &dev, &env)?;
    /// let gpu = ctx.bind(&dev)?;
    /// let grads = gpu.clone_htod(&[env.rank as f32; 1024])?;
    /// let sum = gpu.alloc_zeros::<f32>(1024)?;
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &grads, &sum, Op::Sum))?;
    /// let exec = graph.instantiate()?;
    /// let stream = gpu.new_stream()?;
    /// for _ in 0..10 {
    ///     exec.launch(&gpu.on(&stream)?)?; // every rank launches its graph
    /// }
    /// let total = gpu.dtoh(&sum)?; // waits for the last launch
    /// # Ok(()) }
    /// ```
    ///
    /// The communicator cannot be dropped while the graph lives:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, comm: gpubind::RankComm) -> gpubind::Result<()> {
    /// let (a, b) = (gpu.alloc_zeros::<f32>(8)?, gpu.alloc_zeros::<f32>(8)?);
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &a, &b, gpubind::Op::Sum))?;
    /// drop(comm); // error[E0505]: the graph borrows it
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    ///
    /// nor called eagerly (a second communicator serves eager collectives between
    /// launches):
    ///
    /// ```compile_fail,E0502
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, mut comm: gpubind::RankComm) -> gpubind::Result<()> {
    /// let (a, b) = (gpu.alloc_zeros::<f32>(8)?, gpu.alloc_zeros::<f32>(8)?);
    /// let mut other = gpu.alloc_zeros::<f32>(8)?;
    /// let graph = gpu.capture(|c| c.rank_all_reduce(&comm, &a, &b, gpubind::Op::Sum))?;
    /// comm.all_reduce(&gpu.default_stream(), &a, &mut other, gpubind::Op::Sum)?; // error[E0502]
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn rank_all_reduce<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::AllReduce(op), buf(send), buf(recv))
    }

    /// Captures this rank's part of a reduce to `root` (only the root's `recv` is
    /// written); see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_reduce<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
        root: usize,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::Reduce(op, root), buf(send), buf(recv))
    }

    /// Captures this rank's part of an in-place broadcast from `root` (`data` is read on
    /// the root, written on the others: claimed as written); see
    /// [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_broadcast<T, D>(
        &mut self,
        comm: &'buf RankComm,
        data: &'buf D,
        root: usize,
    ) -> Result<()>
    where
        T: CollectiveType,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let b = buf(data);
        self.rank_collective::<T>(comm, Kind::Broadcast(root), b, b)
    }

    /// Captures this rank's part of an all-gather (`recv.len() == nranks * send.len()`);
    /// see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_all_gather<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::AllGather, buf(send), buf(recv))
    }

    /// Captures this rank's part of a reduce-scatter (`send.len() == nranks *
    /// recv.len()`); see [`rank_all_reduce`](Self::rank_all_reduce).
    pub fn rank_reduce_scatter<T, S, D>(
        &mut self,
        comm: &'buf RankComm,
        send: &'buf S,
        recv: &'buf D,
        op: Op,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.rank_collective::<T>(comm, Kind::ReduceScatter(op), buf(send), buf(recv))
    }

    /// The one code path of the captured rank collectives: validate (as an eager call,
    /// plus no overlap of output and input unless they are the one buffer of a
    /// broadcast), agree with the peers, record the buffers, the rank's order and the
    /// launch agreement, then let NCCL record the collective on the capturing stream.
    fn rank_collective<T: CollectiveType>(
        &mut self,
        comm: &'buf RankComm,
        kind: Kind,
        send: Buf<'buf>,
        recv: Buf<'buf>,
    ) -> Result<()> {
        let (nccl, gate) = capturable(comm)?;
        let device = self.device();
        let call = device
            .expect_same("communicator", &comm.device)
            .and_then(|()| {
                make_call(
                    comm.nranks,
                    comm.rank,
                    &comm.device,
                    kind,
                    DType::of::<T>(),
                    Some(send),
                    Some(recv),
                )
            })
            .and_then(|call| {
                let in_place = matches!(kind, Kind::Broadcast(_));
                if !in_place && send.byte_span().overlaps(&recv.byte_span()) {
                    return Err(Error::InvalidArgument(format!(
                        "{}: the receive buffer overlaps the send buffer (a captured \
                         collective borrows both shared; use separate buffers)",
                        kind.name()
                    )));
                }
                Ok(call)
            });
        // As an eager call: the ranks agree before anything is recorded, and a call this
        // rank cannot make is told to the others at the same collective.
        let record = {
            let mut guard = gate.check.lock().unwrap_or_else(PoisonError::into_inner);
            match (call, guard.as_mut()) {
                (Ok(call), Some(c)) => Some((call, Some(c.agree_captured(&call)?))),
                (Err(e), Some(c)) => return Err(c.fail(e)),
                (Ok(call), None) => Some((call, None)),
                (Err(e), None) => return Err(e),
            }
        };
        let Some((call, header)) = record else {
            return Ok(());
        };
        // Every launch goes through the gate (the failure flag, the watchdog's verdict),
        // agrees on the header when the rank checks its calls, and is watched.
        #[cfg(feature = "nccl")]
        gate.watch
            .get_or_init(|| std::sync::Arc::clone(&nccl.watch));
        self.record_agreement(gate, header.as_ref().map_or(&[][..], |h| &h[..]));
        if call.count == 0 {
            // Nothing to move (NCCL is not called, as eagerly).
            return Ok(());
        }
        // From here a failure leaves this rank's graph without a collective its peers
        // agreed on: the graph is discarded (a launch of it would agree on the capture
        // and then not take part), and the peers are told at their next collective.
        let recorded = (|| {
            let (t, lo, bytes) = recv.span();
            self.record_span(t, Access::Write, lo, bytes)?;
            if !matches!(kind, Kind::Broadcast(_)) {
                let (t, lo, bytes) = send.span();
                self.record_span(t, Access::Read, lo, bytes)?;
            }
            self.record(nccl.order(), Access::Write)
        })();
        let issued = recorded.and_then(|()| {
            // Code outside gpubind may have changed the thread's context since the
            // capture began: make the capture's device current for NCCL.
            let _current = device.enter()?;
            let stream = self.stream_handle();
            self.marked(|| {
                // SAFETY: the call is validated against this rank's device, which is the
                // capture's (checked above) and current; the stream is the capturing
                // stream, so NCCL records the collective into the graph instead of
                // running it. Its buffers are live allocations of the sizes the call
                // implies, borrowed for 'buf and claimed at each launch, and do not
                // overlap unless they are one buffer (broadcast, which NCCL does in
                // place); the communicator is borrowed for 'buf, and its drop waits for
                // the launches (the order tracker).
                unsafe { nccl.issue(&call, stream) }
            })
            .inspect_err(|_| {
                // The communicator may be aborted now (`issue` aborts it on a timeout or
                // an error NCCL reports): graphs captured from it earlier stay borrowed,
                // and must not launch its kernels again.
                gate.failed.store(true, Ordering::Release);
            })
        });
        issued.map_err(|e| {
            let e = self.discard_graph(e);
            match gate
                .check
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            {
                Some(c) => c.fail(e),
                None => e,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate that refuses every launch: nothing is enqueued, and the error says why.
    #[test]
    fn a_failed_gate_launches_nothing() {
        let gate = Gate::default();
        assert!(gate.turn().agree(&[]).is_ok());
        gate.failed.store(true, Ordering::Release);
        let e = gate.turn().agree(&[]).unwrap_err();
        assert!(e.to_string().contains("no longer launch"), "{e}");
    }
}
