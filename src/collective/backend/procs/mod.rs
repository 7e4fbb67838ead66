//! The own-kernel backend with one rank per process on one machine: each rank's
//! staging buffer comes from an IPC [`MemoryPool`] and is imported by every peer at
//! start; two interprocess events per rank (`ready`: its staging holds this step's
//! data; `done`: it has finished reading the peers' staging) are imported too. The
//! host-side [`ProcessGroup`] carries the per-call headers (agreement before anything
//! is enqueued) and the done notices.
//!
//! One step of a call (a chunk of at most the staging size), on rank `r`'s stream `s`:
//!
//! 0. Once per call, before anything is staged: `r` sends its header (kind, op, type,
//!    element count, root/peer, sequence) and receives the partners'; if they disagree,
//!    every rank returns the same typed mismatch and nothing is enqueued.
//! 1. `s` waits for `r`'s own `done` event (local: chains `r`'s steps, whichever
//!    streams they were on).
//! 2. If `r` stages this step: it waits on the host for every done notice owed for its
//!    previous staging, then polls (host, bounded) those peers' `done` events; only then
//!    enqueues the copy of its input into its staging on `s`. So no peer can still be
//!    reading what this overwrites.
//! 3. `r` records `ready` on `s`, then sends its header and receives the peers'
//!    (after the record: a peer that sees the header knows the record happened).
//! 4. The step headers must agree (as in 0, so they do unless a peer breaks the
//!    protocol), else the same typed error on every rank.
//! 5. `r` polls (host, bounded) the `ready` event of each rank whose staging it reads,
//!    then enqueues its reads (reduce kernel or copies) into its own output on `s`.
//! 6. `r` records `done` on `s` and sends a done notice to each rank it read from.
//!
//! The caller's buffers are claimed (their trackers locked, `s` ordered after their
//! other uses) only around the enqueues that touch them, in 2 and 5, and released
//! before every host wait for the peers: a late peer never blocks another thread of
//! this process that uses the same buffers. Each claim orders `s` afresh, and the
//! tracker remembers the stream, not a point in it, so a later user waits for all of
//! this call's work enqueued before it.
//!
//! No stream ever waits on another process's event: every cross-process dependency is
//! a host-side poll with a deadline, so a peer that dies (its events never complete) is
//! a typed error, not a stream stuck for ever. The price: a step's reads are enqueued
//! only once the peers' staging copies have completed.

use crate::collective::api::call::{Call, Kind};
use crate::collective::api::types::Op;
use crate::collective::backend::interface::{RankBackend, RankCall, RankCapture, RankSeat};
use crate::collective::backend::kernels::nvrtc::KernelSet;
use crate::collective::callcheck::region;
use crate::graph::Capture;
use crate::stream::BoundStream;
use control::{Budget, Header, ProcessGroup};

pub(crate) mod control;
use crate::context::ThreadContext;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::ipc::{
    self, ImportedPool, ImportedSlice, MemoryPool, PoolConfig, PoolSlice, TransportOptions,
};
use crate::memory::DeviceMemory;
use cudarc::driver::sys;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of each rank's staging buffer: a call larger than this runs in several steps.
pub const PROCESS_STAGING_BYTES: usize = 16 << 20;

// A reduce-scatter step stages at least one element of each rank's block: one element of
// the widest type (8 bytes) per rank of the largest world must fit the staging, or a
// step would copy past it.
const _: () = assert!(crate::collective::support::MAX_PROCESS_WORLD * 8 <= PROCESS_STAGING_BYTES);

/// An interprocess event (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`), this
/// process's or opened from a peer's handle.
struct IpcEvent {
    raw: sys::CUevent,
    device: Arc<Device>,
}

impl IpcEvent {
    fn new(device: &Arc<Device>) -> Result<IpcEvent> {
        let _guard = device.enter()?;
        let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the device's context is current.
        let raw = device.check(unsafe { result::event::create(flags) })?;
        Ok(IpcEvent {
            raw,
            device: Arc::clone(device),
        })
    }

    fn handle(&self) -> Result<[u8; 64]> {
        let _guard = self.device.enter()?;
        // SAFETY: an interprocess event of the current context.
        let h = self
            .device
            .check(unsafe { result::ipc::get_event_handle(self.raw) })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    fn open(device: &Arc<Device>, bytes: &[u8]) -> Result<IpcEvent> {
        let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
        if bytes.len() != 64 {
            return Err(Error::CorruptHandle {
                reason: format!("an IPC event handle of {} bytes (expected 64)", bytes.len()),
            });
        }
        for (d, s) in h.reserved.iter_mut().zip(bytes) {
            *d = *s as _;
        }
        let _guard = device.enter()?;
        // SAFETY: a context is current; the handle is plain data (a bad one is an error
        // from the driver).
        let raw = device.check(unsafe { result::ipc::open_event_handle(h) })?;
        Ok(IpcEvent {
            raw,
            device: Arc::clone(device),
        })
    }

    /// `Ok(true)` once the last record has completed.
    fn is_complete(&self) -> Result<bool> {
        let _guard = self.device.enter()?;
        // SAFETY: a live event handle; its context is current.
        self.device.check(unsafe { result::event::query(self.raw) })
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // Relaxed: an event of this process's own hand-offs, never recorded in a
            // capture, whose destroy the default capture mode forbids during one.
            let _ = crate::driver::with_relaxed_capture_mode(|| {
                // SAFETY: created or opened here, destroyed once; the driver defers the
                // release of an event with pending records.
                unsafe { result::event::destroy(self.raw) }
            });
        }
    }
}

/// A peer's exports, imported.
struct Peer {
    staging: ManuallyDrop<ImportedSlice<u8>>,
    _pool: ImportedPool,
    ready: IpcEvent,
    done: IpcEvent,
}

/// One rank of the own-kernel backend across processes.
pub(crate) struct ProcsRank {
    group: ProcessGroup,
    device: Arc<Device>,
    bytes: usize,
    staging: ManuallyDrop<PoolSlice<u8>>,
    pool: ManuallyDrop<MemoryPool>,
    /// Destroyed only once every peer has said bye (an operation on an imported event
    /// after its exporter destroyed it is undefined behaviour).
    ready: ManuallyDrop<IpcEvent>,
    done: ManuallyDrop<IpcEvent>,
    peers: Vec<Option<Peer>>,
    /// The device's kernels, kept by the device (`KernelSet::of`): this rank's drop
    /// never unloads them (`cuModuleUnload` waits for every kernel on the device).
    kernels: Arc<KernelSet>,
    /// A failed step left work on a stream that neither finished by its deadline nor
    /// could be followed by a `done` record: the drop treats this rank's own reads as
    /// unsettled (no bye; the peers keep their staging).
    unsettled: bool,
    /// The current call got past its agreement (it may have enqueued work).
    stepping: bool,
}

// SAFETY: the raw event handles are thread-agnostic identifiers used only with their
// device's context pushed; the rest is Send.
unsafe impl Send for ProcsRank {}

/// The header of `call` (sequence filled in by the group).
fn header(call: &Call) -> Header {
    let (kind, op, arg) = call.kind.code();
    Header {
        seq: 0,
        kind,
        op,
        dtype: call.dtype.index as u8,
        arg: arg as u32,
        count: call.count as u64,
    }
}

impl ProcsRank {
    pub(crate) fn new(
        ctx: &mut ThreadContext,
        device: &Arc<Device>,
        rank: usize,
        world: usize,
        key: &str,
        timeout: Duration,
    ) -> Result<ProcsRank> {
        let bytes = PROCESS_STAGING_BYTES;
        // One deadline for the whole start: the mesh, then the export exchange.
        let budget = Budget::new(timeout);
        let mut group = ProcessGroup::connect_staging(rank, world, key, timeout, bytes as u64)?;
        let made = (|| {
            let gpu = ctx.bind(device)?;
            let kernels = KernelSet::of(&gpu)?;
            let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true))?;
            let stream = gpu.new_stream()?;
            let staging = pool.alloc_zeros::<u8>(&gpu.on(&stream)?, bytes)?;
            let ready = IpcEvent::new(device)?;
            let done = IpcEvent::new(device)?;
            Ok::<_, Error>((kernels, pool, staging, ready, done))
        })();
        let (kernels, pool, staging, ready, done) = match made {
            Ok(m) => m,
            Err(e) => return Err(group.fail(e)),
        };
        let mut me = ProcsRank {
            group,
            device: Arc::clone(device),
            bytes,
            staging: ManuallyDrop::new(staging),
            pool: ManuallyDrop::new(pool),
            ready: ManuallyDrop::new(ready),
            done: ManuallyDrop::new(done),
            peers: (0..world).map(|_| None).collect(),
            kernels,
            unsettled: false,
            stepping: false,
        };
        let exchanged = me.exchange_exports(&budget);
        if let Err(e) = exchanged {
            return Err(me.group.fail(e));
        }
        Ok(me)
    }

    /// Sends this rank's pool, staging and event handles to every peer and imports
    /// theirs.
    fn exchange_exports(&mut self, budget: &Budget) -> Result<()> {
        let (rank, world) = (self.group.rank(), self.group.world_size());
        // Each message gets what is left of the start's budget, not a timeout of its own.
        let opts = || TransportOptions::default().timeout(budget.left());
        let buffer = self.staging.export()?;
        let mut events = self.ready.handle()?.to_vec();
        events.extend_from_slice(&self.done.handle()?);
        let fail = |q: usize, e: Error| match e {
            Error::PeerGone => Error::PeerFailed {
                rank: q,
                reason: "its process exited or closed its connection during the start".into(),
            },
            Error::Timeout { .. } => Error::PeerTimeout {
                what: format!("rank {q}'s staging exports"),
                ranks: vec![q],
                after_ms: budget.after_ms(),
            },
            other => other,
        };
        for q in (0..world).filter(|&q| q != rank) {
            let s = self.stream_to(q)?;
            ipc::send_handles_with(
                s,
                &[self.pool.export()?],
                std::slice::from_ref(&buffer),
                &opts(),
            )
            .map_err(|e| fail(q, e))?;
            ipc::send_message_with(s, &events, &[], &opts()).map_err(|e| fail(q, e))?;
        }
        for q in (0..world).filter(|&q| q != rank) {
            let s = self.stream_to(q)?;
            let (mut pools, buffers) =
                ipc::recv_handles_with(s, &opts()).map_err(|e| fail(q, e))?;
            let m = ipc::recv_message_with(s, &opts()).map_err(|e| fail(q, e))?;
            let (Some(ph), Some(bh), 1, 1, 128) = (
                pools.pop(),
                buffers.first(),
                pools.len() + 1,
                buffers.len(),
                m.bytes.len(),
            ) else {
                return Err(Error::Rendezvous {
                    reason: format!("rank {q} sent exports of the wrong shape"),
                });
            };
            let pool = ImportedPool::import(ph)?;
            if pool.device().ordinal() != self.device.ordinal() {
                // Kernels on this device read the peer's staging directly.
                crate::collective::backend::kernels::engine::enable_peer_access(
                    &self.device,
                    pool.device(),
                )?;
                pool.grant_access(&self.device)?;
            }
            let staging = pool.import_buffer::<u8>(bh)?;
            if staging.len() < self.bytes {
                return Err(Error::Rendezvous {
                    reason: format!(
                        "rank {q}'s staging buffer holds {} bytes, less than {}",
                        staging.len(),
                        self.bytes
                    ),
                });
            }
            let ready = IpcEvent::open(pool.device(), &m.bytes[..64])?;
            let done = IpcEvent::open(pool.device(), &m.bytes[64..])?;
            self.peers[q] = Some(Peer {
                staging: ManuallyDrop::new(staging),
                _pool: pool,
                ready,
                done,
            });
        }
        Ok(())
    }

    fn stream_to(&self, q: usize) -> Result<&std::os::unix::net::UnixStream> {
        self.group.stream(q).ok_or_else(|| Error::PeerFailed {
            rank: q,
            reason: "no connection".into(),
        })
    }

    /// Rank `q`'s staging address (this rank's own for `q == rank`).
    fn staging_of(&self, q: usize) -> Result<u64> {
        if q == self.group.rank() {
            return Ok(self.staging.device_ptr());
        }
        self.peers[q]
            .as_ref()
            .map(|p| p.staging.device_ptr())
            .ok_or_else(|| Error::PeerFailed {
                rank: q,
                reason: "its staging buffer was not imported".into(),
            })
    }

    /// Polls the `ready` (or `done`) events of `ranks` until all have completed, at most
    /// until the operation's deadline; a rank whose socket closed meanwhile is
    /// [`Error::PeerFailed`].
    fn poll(&self, ranks: &[usize], done: bool, budget: &Budget) -> Result<()> {
        let deadline = budget.deadline;
        let mut pending: Vec<usize> = ranks.to_vec();
        let mut spins = 0u32;
        while !pending.is_empty() {
            let mut still = Vec::new();
            for &q in &pending {
                let p = self.peers[q].as_ref().ok_or_else(|| Error::PeerFailed {
                    rank: q,
                    reason: "its events were not imported".into(),
                })?;
                // A closed socket first: the event of a process that is gone may be
                // destroyed, and must not be queried then.
                if self.group.peer_closed(q) {
                    let closed = Error::PeerFailed {
                        rank: q,
                        reason: "its process exited or was killed while this rank waited for its GPU work".into(),
                    };
                    // A rank that relayed a verdict before it left is not the culprit.
                    return Err(self.group.closed_peer_error(q, closed));
                }
                let ev = if done { &p.done } else { &p.ready };
                if !ev.is_complete()? {
                    still.push(q);
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::PeerTimeout {
                    what: format!(
                        "the GPU work of the other ranks ({} event)",
                        if done { "done" } else { "ready" }
                    ),
                    ranks: pending,
                    after_ms: budget.after_ms(),
                });
            }
            spins += 1;
            if spins < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// Breaks the communicator with `e` (told to every peer); returns `e`.
    pub(crate) fn fail(&mut self, e: Error) -> Error {
        if let Some(first) = self.group.error() {
            return first.clone();
        }
        self.group.fail(e)
    }

    /// Runs one validated call on `stream` (this rank's device bound and current);
    /// `claim` claims the call's buffers on it, and is held only around the enqueues
    /// that touch them (never across a host wait for the peers).
    pub(crate) fn run<C>(
        &mut self,
        stream: sys::CUstream,
        claim: &impl Fn() -> Result<C>,
        call: &Call,
    ) -> Result<()> {
        self.group.check()?;
        // One deadline for the whole call, however many steps and waits it takes.
        let budget = Budget::new(self.group.timeout());
        // A driver error on this rank's context goes through its device's check (a
        // sticky error poisons the device) before the peers are told.
        self.stepping = false;
        let out = self.run_inner(stream, claim, call, &budget);
        let out = self.device.check(out);
        match out {
            Ok(()) => Ok(()),
            Err(e) => {
                // Tell the peers first: they must not wait on this rank.
                let e = self.group.fail(e);
                // A call refused at its agreement enqueued nothing: nothing to settle.
                if self.stepping {
                    self.settle_failed_step(stream);
                }
                Err(e)
            }
        }
    }

    /// After a step failed part-way: it may have left copies or reads of the peers'
    /// staging on `s` without the closing `done` record. Records `done` on `s` at once
    /// (no host wait: `s` may be busy with the caller's own earlier work, which the
    /// failed call must not wait for), so the drop's wait for this rank's own work
    /// covers those reads, and keeps the peers' staging mapped while they may run. If
    /// the record fails, the rank is marked unsettled: its drop then leaves without a
    /// bye, as for reads that did not settle. The caller's buffers need nothing more:
    /// their claim records the use on `s`, so their next user or free waits for it.
    fn settle_failed_step(&mut self, s: sys::CUstream) {
        // SAFETY: the caller's bound stream (its context current) and this rank's own
        // event.
        let recorded = unsafe { result::event::record(self.done.raw, s) };
        if self.device.check(recorded).is_err() {
            self.unsettled = true;
        }
    }

    fn run_inner<C>(
        &mut self,
        s: sys::CUstream,
        claim: &impl Fn() -> Result<C>,
        call: &Call,
        budget: &Budget,
    ) -> Result<()> {
        let (rank, n) = (self.group.rank(), self.group.world_size());
        let es = call.dtype.size;
        let c = call.count;
        let unit = (64 / es).max(1);
        let per = match call.kind {
            Kind::ReduceScatter(_) => self.bytes / (n * es),
            _ => self.bytes / es,
        };
        let per = (per / unit * unit).max(1);
        let all: Vec<usize> = (0..n).collect();
        let others: Vec<usize> = (0..n).filter(|&q| q != rank).collect();
        // Which ranks stage, whose staging this rank reads, who reads this rank's.
        let (stagers, reads, readers): (Vec<usize>, Vec<usize>, Vec<usize>) = match call.kind {
            Kind::AllReduce(_) | Kind::AllGather | Kind::ReduceScatter(_) => {
                (all.clone(), others.clone(), others.clone())
            }
            Kind::Reduce(_, root) if root == rank => (all.clone(), others.clone(), vec![]),
            Kind::Reduce(_, root) => (all.clone(), vec![], vec![root]),
            Kind::Broadcast(root) if root == rank => (vec![root], vec![], others.clone()),
            Kind::Broadcast(root) => (vec![root], vec![root], vec![]),
            Kind::Send(p) => (vec![rank], vec![], vec![p]),
            Kind::Recv(p) => (vec![p], vec![p], vec![]),
        };
        let partners: Vec<usize> = match call.kind {
            Kind::Send(p) | Kind::Recv(p) => vec![p],
            _ => others.clone(),
        };
        let h = header(call);
        // The whole call (kind, op, type, element count, root/peer, in call order) is
        // agreed before anything is staged: ranks that disagree, even on calls of equal
        // byte size, all return the same typed mismatch with nothing enqueued; so are
        // ranks whose buffers are one memory shared by IPC.
        self.group
            .agree_with(h, &region::of_call(call, n), &partners, budget)?;
        self.stepping = true;
        let mut lo = 0;
        // A zero-length call still agrees (one step with nothing to move).
        loop {
            let hi = (lo + per).min(c);
            let len = hi - lo;
            self.step(
                (s, claim),
                call,
                &h,
                (lo, len),
                (&stagers, &reads, &readers, &partners),
                budget,
            )?;
            lo = hi;
            if lo >= c {
                return Ok(());
            }
        }
    }

    /// Copies elements `[lo, lo + len)` of the caller's send buffer (every block of it,
    /// for a reduce-scatter) into this rank's staging, on `s`; the caller holds the claim.
    fn stage(&self, s: sys::CUstream, call: &Call, (lo, len): (usize, usize)) -> Result<()> {
        let (n, es, c) = (self.group.world_size(), call.dtype.size, call.count);
        let bytes = len * es;
        let at = |p: u64, elems: usize| p + (elems * es) as u64;
        let stg = self.staging.device_ptr();
        match call.kind {
            Kind::ReduceScatter(_) => {
                for b in 0..n {
                    // SAFETY: `b * len + len <= per * n` elements fit the staging
                    // (chunking); the source is the caller's send buffer of `n * c`
                    // elements, claimed and ordered on `s`.
                    unsafe {
                        result::copy::copy_async(
                            at(stg, b * len),
                            at(call.send, b * c + lo),
                            bytes,
                            s,
                        )
                    }?;
                }
            }
            _ => {
                // SAFETY: `len` elements fit the staging; the send buffer holds
                // `c >= lo + len` elements, claimed and ordered on `s`.
                unsafe { result::copy::copy_async(stg, at(call.send, lo), bytes, s) }?;
            }
        }
        Ok(())
    }

    /// One step (see the module docs) over elements `[lo, lo + len)`.
    fn step<C>(
        &mut self,
        (s, claim): (sys::CUstream, &impl Fn() -> Result<C>),
        call: &Call,
        h: &Header,
        (lo, len): (usize, usize),
        (stagers, reads, readers, partners): (&[usize], &[usize], &[usize], &[usize]),
        budget: &Budget,
    ) -> Result<()> {
        let (rank, n) = (self.group.rank(), self.group.world_size());
        let es = call.dtype.size;
        let c = call.count;
        let bytes = len * es;
        let at = |p: u64, elems: usize| p + (elems * es) as u64;
        // 1. Chain after this rank's previous step.
        // SAFETY: the stream is the bound (current) device's; the event is ours.
        unsafe { result::stream::wait_event(s, self.done.raw) }?;
        // 2. Stage, once nobody reads the previous contents any more.
        if stagers.contains(&rank) {
            let owing = self.group.collect_done(budget)?;
            self.poll(&owing, true, budget)?;
            if bytes > 0 {
                // Held for the copies only: released before the headers' host wait.
                let _held = claim()?;
                self.stage(s, call, (lo, len))?;
            }
        }
        // 3. Ready is recorded before the header goes out.
        // SAFETY: as in 1.
        unsafe { result::event::record(self.ready.raw, s) }?;
        self.group.agree(*h, partners, budget)?;
        // From here on the peers follow the same plan: count the done notices owed.
        self.group.expect_done(readers);
        // 5. Read the peers' staging once it is filled.
        self.poll(reads, false, budget)?;
        let reading = !reads.is_empty()
            || matches!(
                call.kind,
                Kind::AllReduce(_) | Kind::AllGather | Kind::ReduceScatter(_)
            )
            || matches!(call.kind, Kind::Reduce(_, root) if root == rank);
        if reading && bytes > 0 {
            let stg: Vec<u64> = (0..n).map(|q| self.staging_of(q)).collect::<Result<_>>()?;
            // Held for these enqueues only (the peers' staging is already filled).
            let _held = claim()?;
            let reduce = |op: Op, ins: &[u64], out: u64| {
                // SAFETY: the device is current and `s` its stream; every input is a
                // staging buffer (this rank's, or a peer's imported and accessible
                // here) holding `len` elements whose writes have completed (polled),
                // the output `len` elements of the caller's claimed receive buffer.
                unsafe { self.kernels.reduce(s, call.dtype, op, ins, &[out], len, n) }
            };
            let copy = |dst: u64, src: u64| {
                // SAFETY: as for `reduce`: `bytes` inside a filled staging buffer to
                // `bytes` inside the caller's claimed receive buffer.
                unsafe { result::copy::copy_async(dst, src, bytes, s) }
            };
            match call.kind {
                Kind::AllReduce(op) | Kind::Reduce(op, _) => reduce(op, &stg, at(call.recv, lo))?,
                Kind::ReduceScatter(op) => {
                    let ins: Vec<u64> = stg.iter().map(|&p| at(p, rank * len)).collect();
                    reduce(op, &ins, at(call.recv, lo))?
                }
                Kind::AllGather => {
                    for (q, &p) in stg.iter().enumerate() {
                        copy(at(call.recv, q * c + lo), p)?;
                    }
                }
                Kind::Broadcast(root) | Kind::Recv(root) => copy(at(call.recv, lo), stg[root])?,
                Kind::Send(_) => {}
            }
        }
        // 6. Done, and tell the ranks read from.
        // SAFETY: as in 1.
        unsafe { result::event::record(self.done.raw, s) }?;
        for &q in reads {
            self.group.send_done(q, budget)?;
        }
        Ok(())
    }

    /// Waits (until the drop's deadline) for this rank's own GPU work on the exchanged
    /// buffers. `false` if it did not finish, or a failed step could not be covered.
    fn settle_own(&self, budget: &Budget) -> bool {
        if self.unsettled {
            return false;
        }
        let deadline = budget.deadline;
        loop {
            // `done` closes each step; `ready` follows a staging copy (the last record
            // when a step failed between the two).
            let both = self
                .done
                .is_complete()
                .and_then(|d| Ok(d && self.ready.is_complete()?));
            match both {
                Ok(true) => return true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                _ => return false,
            }
        }
    }
}

/// How long a broken communicator's drop waits for its own last GPU work and then for
/// its peers' byes: a live peer answers within it, one that a verdict condemned does
/// not cost a second timeout.
const VERDICT_GRACE: Duration = Duration::from_millis(250);

impl Drop for ProcsRank {
    fn drop(&mut self) {
        // This rank's reads of the peers' staging, then its imports, then the byes; only
        // when every peer has said bye (or is gone) is its own staging freed. One
        // deadline for the whole drop. Nothing here waits for the device as a whole:
        // the kernels' module is the device's (unloaded with it, not here), the events
        // are destroyed and the pools' memory freed without a device-wide wait.
        //
        // After an error broke the communicator (a timeout, a dead or failed peer, a
        // mismatch) the drop waits for nothing the verdict condemned: this rank's own
        // last work and the byes each get a short grace. Own work still queued behind
        // the caller's earlier work on its stream, or a peer that stays silent through
        // the grace (stopped, hung), keeps this rank's staging (and the imports) leaked
        // instead of costing a second timeout or a wait for unrelated user kernels.
        let timeout = self.group.timeout();
        let budget = match self.group.error() {
            Some(_) => Budget::new(timeout.min(VERDICT_GRACE)),
            None => Budget::new(timeout),
        };
        let own_done = self.settle_own(&budget);
        let byes = match self.group.error() {
            Some(_) => Budget::new(timeout.min(VERDICT_GRACE)),
            None => budget,
        };
        for p in self.peers.iter_mut().flatten() {
            if own_done {
                // SAFETY: dropped once, here; this rank's reads of it have completed.
                unsafe { ManuallyDrop::drop(&mut p.staging) };
            }
            // Otherwise leaked (it holds its pool): a read may still be running.
        }
        // The imported events go before the byes: a peer destroys its own events once
        // every rank has said bye. (No stream of this process waits on them.)
        self.peers.clear();
        if !own_done {
            // The kernels are the device's and unloaded with it: a read that may still
            // run keeps the device (and so them) alive for the rest of the process.
            crate::teardown::faults::keep_context_alive(&self.device);
        }
        let all_left = if own_done {
            self.group.leave(&byes)
        } else {
            // This rank's reads of peers' staging may still run: no bye, and the
            // connections stay open (leaked), so every peer keeps its staging.
            self.group.leave_still_mapped();
            false
        };
        if all_left {
            // SAFETY: dropped once, here; every peer has closed its imports of them (it
            // said bye after dropping them, or its process is gone).
            unsafe {
                ManuallyDrop::drop(&mut self.ready);
                ManuallyDrop::drop(&mut self.done);
            }
        }
        if own_done && all_left {
            // SAFETY: dropped once, here; no peer maps it any more (each said bye after
            // dropping its import, or its process is gone).
            unsafe {
                ManuallyDrop::drop(&mut self.staging);
                ManuallyDrop::drop(&mut self.pool);
            }
        } else {
            crate::teardown::faults::report_drop(
                format_args!(
                    "rank {}'s collective staging buffer ({} bytes)",
                    self.group.rank(),
                    self.bytes
                ),
                None,
                "waiting for the other processes to release it",
                &Error::PeerTimeout {
                    what: "the other ranks' byes (or this rank's own GPU work)".into(),
                    ranks: vec![],
                    after_ms: byes.after_ms(),
                },
                crate::teardown::faults::LEAKED,
            );
        }
    }
}

impl RankBackend for ProcsRank {
    fn call(
        &mut self,
        _me: RankSeat<'_>,
        stream: &BoundStream<'_>,
        rc: RankCall<'_>,
    ) -> Result<()> {
        // A call this rank cannot make would leave the others waiting for its header:
        // they are told (the communicator is broken for all).
        let claims = rc.claims();
        let call = rc.call.map_err(|e| self.fail(e))?;
        // The device check a claim makes, before the peers are waited for.
        stream.ensure_stream_context().map_err(|e| self.fail(e))?;
        let claim = || stream.claim(claims);
        // SAFETY: the stream is bound (its device current) and borrowed for this call;
        // the buffers are validated against this rank's device, and `run` claims them
        // (ordered after their other uses) around every enqueue that touches them.
        self.run(unsafe { stream.raw() }, &claim, &call)
    }

    fn capture<'c, 'buf>(
        &'buf self,
        _capture: &mut Capture<'c, 'buf>,
        _me: RankSeat<'buf>,
        _call: RankCapture<'buf>,
    ) -> Result<()> {
        Err(Error::NotCapturable {
            what: "a collective of a process-rank own-kernel RankComm",
            reason: "each call exchanges a header with the peers over a Unix socket and \
                     waits on the host for their staging copies, which a graph launch cannot \
                     do; use an NCCL RankComm (RankComm::init_process / from_launch)"
                .into(),
        })
    }
}
