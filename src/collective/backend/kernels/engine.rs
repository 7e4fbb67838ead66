//! The own backend's algorithms: what to enqueue on which stream for one collective.
//!
//! A collective runs over *lanes*: one stream (and one barrier event) per distinct
//! stream taking part. In a [`Communicator`](crate::collective::Communicator) the ranks of one
//! device share a lane; with [`RankComm`](crate::collective::RankComm) every rank is a lane (its
//! thread's stream). A lane's kernel may read and write every rank's buffers when the
//! transport is *direct*: all lanes on one device, or on devices with peer access
//! enabled. Otherwise (*host-staged*) data goes through mapped pinned host memory.
//!
//! Every collective is `barrier; work; barrier`, where a barrier makes each lane's
//! stream wait for every other lane's event recorded at that point (nothing when there
//! is one lane). The first barrier orders the work after each rank's earlier work on
//! its stream (its inputs are ready); the second orders each rank's later work after
//! every lane's reads and writes of its buffers, so the caller may reuse or free them
//! (a buffer's tracker records the rank's lane as its last use, so later uses and frees
//! wait for that lane, which waits for the others).
//!
//! Direct algorithms (`L` lanes, `N` ranks, `c` elements):
//! * all_reduce: lane `l` reduces chunk `l` of `[0, c)` over all `N` inputs and writes
//!   it to all `N` outputs (one pass: every element is read once per input and written
//!   once per output; on one device this is a single kernel over `[0, c)`).
//! * reduce: the same with the root's output only.
//! * broadcast: lane `l` copies chunk `l` of the root's buffer to all other ranks.
//! * all_gather: each lane copies its ranks' inputs to their slots in every output.
//! * reduce_scatter: each lane reduces, for each of its ranks `q`, block `q` of all
//!   inputs into `q`'s output.
//!
//! Host-staged: each rank copies its input (device to pinned host) on its own stream,
//! barrier, then each lane reduces from the mapped host copies into its own ranks'
//! outputs (or copies host to device), barrier.

use super::nvrtc::KernelSet;
use crate::access::{Access, AccessTracker, LaneClaim, StreamRef, claim_lanes};
use crate::collective::api::call::{Call, Kind};
use crate::collective::api::options::Transport;
use crate::collective::api::types::{DType, Op};
use crate::collective::support::lock;
use crate::context::{BoundDevice, ThreadContext};
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Makes a device's context current for a few driver calls.
pub(crate) trait Exec {
    /// Runs `f` with `device`'s context current.
    fn run_in(&mut self, device: &Arc<Device>, f: &mut dyn FnMut() -> Result<()>) -> Result<()>;
}

/// The 1:N group: binds through the thread's token (cached: rebinding is free).
impl Exec for ThreadContext {
    fn run_in(&mut self, device: &Arc<Device>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _bound = self.bind(device)?;
        f()
    }
}

/// For a thread whose token is borrowed by a binding: pushes the context and pops it
/// after, leaving the binding as it was.
pub(crate) struct Enter;

impl Exec for Enter {
    fn run_in(&mut self, device: &Arc<Device>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _guard = device.enter()?;
        f()
    }
}

/// One stream taking part in a collective, with its barrier event.
pub(crate) struct Lane {
    pub(crate) device: Arc<Device>,
    /// The stream as buffer trackers remember it (keeps it alive while they do).
    pub(crate) stream_ref: StreamRef,
    pub(crate) stream: sys::CUstream,
    pub(crate) event: sys::CUevent,
}

// SAFETY: stream and event handles are thread-agnostic identifiers. Whoever builds a
// Lane keeps the Stream and Event it names alive until the collective is enqueued
// (a RankComm's thread blocks in the meeting meanwhile), and only enqueues on them
// with their device's context current (`Exec::run_in`).
unsafe impl Send for Lane {}

/// A device's kernels, with the device that keeps them loaded.
type DeviceKernels = (Arc<Device>, Arc<KernelSet>);

/// What a communicator's own-kernel backend keeps between calls.
pub(crate) struct Shared {
    /// Each device's kernels (kept by the device: `KernelSet::of`), with the device, so
    /// that a drop that cannot wait for the launches can keep it (and its module) alive.
    kernels: Mutex<HashMap<usize, DeviceKernels>>,
    staging: Mutex<HashMap<StageKey, Arc<Staging>>>,
    staged: bool,
    /// The lanes the kernels were launched on (their launches bypass `Module`'s own
    /// tracking): dropping `Shared` waits for them, or keeps the devices (whose drop
    /// unloads the kernels) alive.
    work: AccessTracker,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The kernels' module is the device's (unloaded only when the device goes). If
        // the wait fails because a context is poisoned, nothing more runs on it. Any
        // other failure (a wait that gave up after GPUBIND_DROP_TIMEOUT: a kernel may
        // still run) keeps the devices alive for the rest of the process, so their
        // modules are never unloaded under it.
        if let Err(e) = self.work.wait_all() {
            if crate::teardown::faults::nothing_runs_after(&e) {
                crate::teardown::faults::report_drop(
                    format_args!("a communicator's own-kernel backend"),
                    None,
                    crate::teardown::faults::WAIT,
                    &e,
                    "nothing more runs on a poisoned context",
                );
            } else {
                crate::teardown::faults::report_drop(
                    format_args!("a communicator's own-kernel backend"),
                    None,
                    crate::teardown::faults::WAIT,
                    &e,
                    "its devices are kept alive, with their kernel modules, because a kernel \
                     may still run",
                );
                let kernels = match self.kernels.get_mut() {
                    Ok(k) => k,
                    Err(p) => p.into_inner(),
                };
                for (device, _) in kernels.values() {
                    crate::teardown::faults::keep_context_alive(device);
                }
            }
        }
    }
}

/// Claims `sh`'s kernels' use of `lanes` for one collective (held until it is enqueued).
fn claim_work<'t>(sh: &'t Shared, lanes: impl Iterator<Item = &'t Lane>) -> Result<LaneClaim<'t>> {
    claim_lanes(
        lanes
            .map(|l| (&sh.work, Access::Read, l.stream_ref.clone()))
            .collect(),
    )
}

/// Which staging buffer: one for collectives, one per pair of ranks for send/recv
/// (pairs run concurrently in the 1:1 pattern).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum StageKey {
    Coll,
    Pair(usize, usize),
}

impl Shared {
    /// Decides the transport for ranks on `devices`, enabling peer access where the
    /// direct transport needs it.
    pub(crate) fn new(devices: &[Arc<Device>], transport: Transport) -> Result<Shared> {
        let mut distinct: Vec<&Arc<Device>> = Vec::new();
        for d in devices {
            if !distinct.iter().any(|x| x.ordinal() == d.ordinal()) {
                distinct.push(d);
            }
        }
        let mut all_peer = true;
        for a in &distinct {
            for b in &distinct {
                if a.ordinal() != b.ordinal() && !a.can_access_peer(b)? {
                    all_peer = false;
                }
            }
        }
        let staged = match transport {
            Transport::HostStaged => true,
            Transport::Auto => !all_peer,
            Transport::Direct if all_peer => false,
            Transport::Direct => {
                return Err(Error::InvalidArgument(
                    "Transport::Direct needs peer access between every pair of devices (cuDeviceCanAccessPeer said no); use Transport::Auto".into(),
                ));
            }
        };
        if !staged {
            for a in &distinct {
                for b in &distinct {
                    if a.ordinal() != b.ordinal() {
                        enable_peer_access(a, b)?;
                    }
                }
            }
        }
        Ok(Shared {
            kernels: Mutex::new(HashMap::new()),
            staging: Mutex::new(HashMap::new()),
            staged,
            work: AccessTracker::default(),
        })
    }

    /// Whether data goes through pinned host memory.
    pub(crate) fn is_staged(&self) -> bool {
        self.staged
    }

    /// Takes the bound device's kernels (compiled and loaded once per device and
    /// process: [`KernelSet::of`]) unless already held.
    pub(crate) fn ensure_kernels(&self, gpu: &BoundDevice<'_>) -> Result<()> {
        let ordinal = gpu.ordinal();
        if lock(&self.kernels).contains_key(&ordinal) {
            return Ok(());
        }
        let set = KernelSet::of(gpu)?;
        lock(&self.kernels)
            .entry(ordinal)
            .or_insert_with(|| (Arc::clone(gpu.device()), set));
        Ok(())
    }

    /// The tracker of this backend's kernel launches: its drop waits for them (a
    /// captured collective records it in its graph).
    pub(crate) fn work(&self) -> &AccessTracker {
        &self.work
    }

    /// The device's kernels (loaded by [`ensure_kernels`](Self::ensure_kernels)).
    pub(crate) fn kernels(&self, device: &Device) -> Result<Arc<KernelSet>> {
        lock(&self.kernels)
            .get(&device.ordinal())
            .map(|(_, set)| Arc::clone(set))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "collective kernels for device {} were not loaded",
                    device.ordinal()
                ))
            })
    }

    /// A staging buffer of at least `bytes` mapped into every lane's device.
    fn staging(&self, key: StageKey, bytes: usize, lanes: &[Lane]) -> Result<Arc<Staging>> {
        let mut map = lock(&self.staging);
        if let Some(s) = map.get(&key)
            && s.bytes >= bytes
            && lanes.iter().all(|l| s.dptr(&l.device).is_ok())
        {
            return Ok(Arc::clone(s));
        }
        // Dropping the old buffer first synchronises its users (see Staging::drop).
        map.remove(&key);
        let devices: Vec<&Arc<Device>> = lanes.iter().map(|l| &l.device).collect();
        let s = Arc::new(Staging::new(&devices, bytes.next_power_of_two())?);
        map.insert(key, Arc::clone(&s));
        Ok(s)
    }
}

/// `cuCtxEnablePeerAccess` in `a`'s context for `b` (already enabled is fine).
pub(crate) fn enable_peer_access(a: &Arc<Device>, b: &Arc<Device>) -> Result<()> {
    let (peer, _) = b.primary_context()?;
    let _guard = a.enter()?;
    // SAFETY: `a`'s context is current; `peer` is a retained primary context.
    a.check(unsafe { result::context::enable_peer_access(peer.0) })?;
    Ok(())
}

/// Mapped, portable pinned host memory (`cuMemHostAlloc`).
struct Staging {
    host: *mut c_void,
    bytes: usize,
    /// `(device ordinal, device address of the buffer)` for each user device.
    dptrs: Vec<(usize, u64)>,
    users: Vec<Arc<Device>>,
    /// The context it was allocated in (and is freed in).
    owner: Arc<Device>,
    /// The lanes of the last collective that used it: the next one waits for them, so a
    /// rank that switches streams between calls cannot overwrite data still being read.
    tracker: AccessTracker,
}

impl Staging {
    /// Orders `lanes` (each with its device's context pushed) after every pending use of
    /// the buffer, and records them as its users.
    fn use_on(&self, lanes: &[&Lane]) -> Result<LaneClaim<'_>> {
        claim_lanes(
            lanes
                .iter()
                .map(|l| (&self.tracker, Access::Write, l.stream_ref.clone()))
                .collect(),
        )
    }
}

// SAFETY: the pointer is only handed to the driver and to kernels; the buffer is
// touched by streams ordered through the lanes' barriers, never by Rust code.
unsafe impl Send for Staging {}
// SAFETY: as above: shared references only read the addresses.
unsafe impl Sync for Staging {}

impl Staging {
    fn new(devices: &[&Arc<Device>], bytes: usize) -> Result<Staging> {
        let mut users: Vec<Arc<Device>> = Vec::new();
        for d in devices {
            if !users.iter().any(|u| u.ordinal() == d.ordinal()) {
                users.push(Arc::clone(d));
            }
        }
        let owner = Arc::clone(
            users
                .first()
                .ok_or_else(|| Error::InvalidArgument("no device to stage for".into()))?,
        );
        let host = {
            let _guard = owner.enter()?;
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: the owner's context is current.
            owner.check(unsafe { result::memory::host_alloc(bytes.max(1), flags) })?
        };
        let mut s = Staging {
            host,
            bytes,
            dptrs: Vec::new(),
            users: Vec::new(),
            owner,
            tracker: AccessTracker::default(),
        };
        for d in users {
            let _guard = d.enter()?;
            // SAFETY: `host` is a portable mapped allocation; `d`'s context is current.
            let dptr = d.check(unsafe { result::memory::host_get_device_pointer(host) })?;
            s.dptrs.push((d.ordinal(), dptr));
            s.users.push(Arc::clone(&d));
        }
        Ok(s)
    }

    fn dptr(&self, device: &Device) -> Result<u64> {
        self.dptrs
            .iter()
            .find(|(o, _)| *o == device.ordinal())
            .map(|&(_, p)| p)
            .ok_or_else(|| Error::InvalidArgument("staging buffer not mapped".into()))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Wait for the streams that may still read or write the buffer; if that cannot be
        // established (a faulted context), leak it rather than free it under the device.
        let waited = self.tracker.wait_all();
        let host = self.host as usize;
        crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a collective staging buffer of {} bytes", self.bytes),
                device: &self.owner,
                waited,
                call: "cuMemFreeHost",
                runs: crate::teardown::Runs::OnReleaseThread,
            },
            move || {
                // SAFETY: allocated by cuMemHostAlloc in the owner's context (current
                // while this runs), freed once, with no work pending on it (run only after
                // the wait succeeded).
                unsafe { crate::driver::result::memory::free_host(host as *mut std::ffi::c_void) }
            },
        );
    }
}

/// `[lo, hi)` of part `i` of `count` elements split into `parts`, boundaries on 64-byte
/// multiples so every part keeps 16-byte alignment.
pub(crate) fn chunk(count: usize, parts: usize, i: usize, esize: usize) -> (usize, usize) {
    let unit = (64 / esize.max(1)).max(1);
    let units = count.div_ceil(unit);
    let per = units.div_ceil(parts.max(1));
    let lo = (i * per * unit).min(count);
    let hi = ((i + 1) * per * unit).min(count);
    (lo, hi)
}

/// One collective's enqueueing: the executor, the lanes and the element type.
struct Run<'r> {
    exec: &'r mut dyn Exec,
    sh: &'r Shared,
    lanes: &'r [Lane],
    dtype: DType,
    /// Ranks taking part (the divisor of [`Op::Avg`]).
    nranks: usize,
}

impl Run<'_> {
    /// Runs `f` on lane `l`'s stream with its device current; a driver error of `f`
    /// goes through the device's check (a sticky error poisons the device).
    fn on(&mut self, l: usize, f: &mut dyn FnMut(sys::CUstream) -> Result<()>) -> Result<()> {
        let lane = &self.lanes[l];
        self.exec
            .run_in(&lane.device, &mut || lane.device.check(f(lane.stream)))
    }

    /// Makes every listed lane wait for every other listed lane's work so far.
    fn barrier(&mut self, which: &[usize]) -> Result<()> {
        if which.len() <= 1 {
            return Ok(());
        }
        let lanes = self.lanes;
        for &l in which {
            self.on(l, &mut |stream| {
                // SAFETY: event and stream belong to the current context.
                unsafe { result::event::record(lanes[l].event, stream) }
            })?;
        }
        for &p in which {
            self.on(p, &mut |stream| {
                for &q in which.iter().filter(|&&q| q != p) {
                    // SAFETY: the stream is the current context's; waiting on another
                    // context's event is allowed.
                    unsafe { result::stream::wait_event(stream, lanes[q].event) }?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// A stream-ordered copy on lane `l` from `src` (on `src_dev`) to `dst` (on
    /// `dst_dev`); either may be mapped pinned host memory of the lane's device.
    fn copy(
        &mut self,
        l: usize,
        dst: (u64, &Device),
        src: (u64, &Device),
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let peer = if dst.1.ordinal() != src.1.ordinal() {
            Some((dst.1.primary_context()?.0, src.1.primary_context()?.0))
        } else {
            None
        };
        self.on(l, &mut |stream| match peer {
            // SAFETY: live device allocations of `bytes` (callers' contract), ordered by
            // the surrounding barriers; the stream is the current context's.
            Some((dctx, sctx)) => unsafe {
                result::copy::peer_async(dst.0, dctx.0, src.0, sctx.0, bytes, stream)
            },
            // SAFETY: as above, within one context (either side may be mapped pinned
            // host memory: cuMemcpyAsync infers the direction from unified addresses).
            None => unsafe { result::copy::copy_async(dst.0, src.0, bytes, stream) },
        })
    }

    /// `outs[*][i] = op(ins[*][i])` for `i < n` on lane `l`; a plain copy when there is
    /// one input and one output.
    fn reduce(&mut self, l: usize, op: Op, ins: &[u64], outs: &[u64], n: usize) -> Result<()> {
        if n == 0 || outs.is_empty() {
            return Ok(());
        }
        let dev = Arc::clone(&self.lanes[l].device);
        if ins.len() == 1 && outs.len() == 1 && (op != Op::Avg || self.nranks == 1) {
            return self.copy(l, (outs[0], &dev), (ins[0], &dev), n * self.dtype.size);
        }
        let ks = self.sh.kernels(&dev)?;
        let (dtype, nranks) = (self.dtype, self.nranks);
        self.on(l, &mut |stream| {
            // SAFETY: the lane's device is current and the stream is its; the pointers
            // are accessible from it (local, peer-enabled or mapped host: the
            // transport) and address `n` elements each, kept alive and ordered by the
            // callers' barriers.
            unsafe { ks.reduce(stream, dtype, op, ins, outs, n, nranks) }
        })
    }

    /// Device to pinned host on lane `l`.
    fn dtoh(&mut self, l: usize, host: *mut c_void, src: u64, bytes: usize) -> Result<()> {
        self.on(l, &mut |stream| {
            // SAFETY: `host` is `bytes` inside a pinned staging buffer, `src` a live
            // allocation of `bytes`; ordered by the barriers.
            unsafe { result::copy::dtoh_async(host, src, bytes, stream) }
        })
    }

    /// Pinned host to device on lane `l`.
    fn htod(&mut self, l: usize, dst: u64, host: *mut c_void, bytes: usize) -> Result<()> {
        self.on(l, &mut |stream| {
            // SAFETY: `dst` is a live allocation of `bytes`; the pinned source was
            // filled before the preceding barrier.
            unsafe { result::copy::htod_async(dst, host, bytes, stream) }
        })
    }
}

/// Runs one matched collective: `calls[r]` is rank `r`'s part (same kind, type and
/// count on every rank, checked by the caller); rank `r` runs on `lanes[rank_lane[r]]`.
pub(crate) fn collective(
    exec: &mut dyn Exec,
    sh: &Shared,
    lanes: &[Lane],
    rank_lane: &[usize],
    calls: &[Call],
) -> Result<()> {
    let n = calls.len();
    let Some(first) = calls.first() else {
        return Ok(());
    };
    if first.count == 0 {
        return Ok(());
    }
    let _work = claim_work(sh, lanes.iter())?;
    let mut run = Run {
        exec,
        sh,
        lanes,
        dtype: first.dtype,
        nranks: n,
    };
    if sh.staged {
        staged_collective(&mut run, rank_lane, calls)
    } else {
        refuse_pool_memory_across_devices(&mut run, rank_lane, calls)?;
        direct_collective(&mut run, rank_lane, calls)
    }
}

/// [`Error::InvalidArgument`] for a rank's buffer of memory-pool memory when the direct
/// transport spans several devices: every lane's kernel reads and writes every rank's
/// buffers, and peer access (`cuCtxEnablePeerAccess`) does not reach pool allocations
/// (a pool grants access itself), so a kernel on another device would fault on it,
/// poisoning that device. Asked of the driver (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`),
/// which knows every kind: `BoundStream::alloc*`, IPC `MemoryPool`s, adopted cudarc
/// stream-ordered allocations. An answer the driver cannot give counts as no pool, as
/// for the legacy IPC export's check.
fn refuse_pool_memory_across_devices(
    run: &mut Run<'_>,
    rank_lane: &[usize],
    calls: &[Call],
) -> Result<()> {
    let lanes = run.lanes;
    if lanes
        .iter()
        .all(|l| l.device.ordinal() == lanes[0].device.ordinal())
    {
        return Ok(());
    }
    for (r, call) in calls.iter().enumerate() {
        for (which, ptr) in [("send", call.send), ("receive", call.recv)] {
            if ptr == 0 {
                continue;
            }
            let mut pooled = false;
            run.on(rank_lane[r], &mut |_| {
                // SAFETY: a live allocation of the rank's device (the caller's claim holds
                // it), whose context is current; the attribute writes one handle.
                let pool = unsafe {
                    result::memory::pointer_attribute(
                        ptr,
                        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                    )
                };
                pooled = matches!(pool, Ok(p) if p != 0);
                Ok(())
            })?;
            if pooled {
                return Err(Error::InvalidArgument(format!(
                    "rank {r}'s {which} buffer is memory-pool memory (BoundStream::alloc*, an \
                     ipc::MemoryPool), which other devices' kernels cannot reach through peer \
                     access, and this direct-transport collective spans several devices: \
                     allocate it with BoundDevice::alloc_zeros, or use Transport::HostStaged"
                )));
            }
        }
    }
    Ok(())
}

/// A collective through the host-staged transport: every input (the root's, for a
/// broadcast) is copied to mapped pinned host memory on its rank's lane, barrier, then
/// each lane reduces from (or copies) the host copies into its own ranks' outputs,
/// barrier.
fn staged_collective(run: &mut Run<'_>, rank_lane: &[usize], calls: &[Call]) -> Result<()> {
    let (n, first) = (calls.len(), &calls[0]);
    let (c, es) = (first.count, first.dtype.size);
    let (sh, lanes) = (run.sh, run.lanes);
    let all: Vec<usize> = (0..lanes.len()).collect();
    let ranks_of = |l: usize| (0..n).filter(move |&r| rank_lane[r] == l);
    let send: Vec<u64> = calls.iter().map(|x| x.send).collect();
    let recv: Vec<u64> = calls.iter().map(|x| x.recv).collect();
    let nl = lanes.len();
    let (elems, stagers): (usize, Vec<usize>) = match first.kind {
        Kind::Broadcast(root) => (c, vec![root]),
        Kind::ReduceScatter(_) => (n * c, (0..n).collect()),
        _ => (c, (0..n).collect()),
    };
    let slot_bytes = elems * es;
    let st = sh.staging(StageKey::Coll, slot_bytes * stagers.len(), lanes)?;
    let _staging_use = st.use_on(&lanes.iter().collect::<Vec<_>>())?;
    for (i, &r) in stagers.iter().enumerate() {
        let host = st.host.wrapping_byte_add(i * slot_bytes);
        run.dtoh(rank_lane[r], host, send[r], slot_bytes)?;
    }
    run.barrier(&all)?;
    // The mapped slots as lane `l`'s device sees them, `extra` elements in.
    let slots = |l: usize, extra: usize| -> Result<Vec<u64>> {
        let base = st.dptr(&lanes[l].device)?;
        Ok((0..stagers.len())
            .map(|i| base + (i * slot_bytes + extra * es) as u64)
            .collect())
    };
    match first.kind {
        Kind::AllReduce(op) => {
            for l in 0..nl {
                let outs: Vec<u64> = ranks_of(l).map(|q| recv[q]).collect();
                run.reduce(l, op, &slots(l, 0)?, &outs, c)?;
            }
        }
        Kind::Reduce(op, root) => {
            let l = rank_lane[root];
            run.reduce(l, op, &slots(l, 0)?, &[recv[root]], c)?;
        }
        Kind::Broadcast(root) => {
            for q in (0..n).filter(|&q| q != root) {
                run.htod(rank_lane[q], recv[q], st.host, c * es)?;
            }
        }
        Kind::AllGather => {
            for q in 0..n {
                run.htod(rank_lane[q], recv[q], st.host, n * c * es)?;
            }
        }
        Kind::ReduceScatter(op) => {
            for q in 0..n {
                let l = rank_lane[q];
                run.reduce(l, op, &slots(l, q * c)?, &[recv[q]], c)?;
            }
        }
        Kind::Send(_) | Kind::Recv(_) => return Err(not_collective()),
    }
    run.barrier(&all)
}

/// A collective through the direct transport (see the module docs): barrier, each
/// lane's share of the work reading and writing every rank's buffers, barrier.
fn direct_collective(run: &mut Run<'_>, rank_lane: &[usize], calls: &[Call]) -> Result<()> {
    let (n, first) = (calls.len(), &calls[0]);
    let (c, es) = (first.count, first.dtype.size);
    let all: Vec<usize> = (0..run.lanes.len()).collect();
    let ranks_of = |l: usize| (0..n).filter(move |&r| rank_lane[r] == l);
    let at = |p: u64, elems: usize| p + (elems * es) as u64;
    let send: Vec<u64> = calls.iter().map(|x| x.send).collect();
    let recv: Vec<u64> = calls.iter().map(|x| x.recv).collect();
    let nl = run.lanes.len();
    run.barrier(&all)?;
    match first.kind {
        Kind::AllReduce(op) | Kind::Reduce(op, _) => {
            for l in 0..nl {
                let (lo, hi) = chunk(c, nl, l, es);
                let ins: Vec<u64> = send.iter().map(|&p| at(p, lo)).collect();
                let outs: Vec<u64> = match first.kind {
                    Kind::Reduce(_, root) => vec![at(recv[root], lo)],
                    _ => recv.iter().map(|&p| at(p, lo)).collect(),
                };
                run.reduce(l, op, &ins, &outs, hi - lo)?;
            }
        }
        Kind::Broadcast(root) => {
            for l in 0..nl {
                let (lo, hi) = chunk(c, nl, l, es);
                let outs: Vec<u64> = (0..n)
                    .filter(|&q| q != root)
                    .map(|q| at(recv[q], lo))
                    .collect();
                run.reduce(l, Op::Sum, &[at(send[root], lo)], &outs, hi - lo)?;
            }
        }
        Kind::AllGather => {
            for l in 0..nl {
                for r in ranks_of(l) {
                    let outs: Vec<u64> = recv.iter().map(|&p| at(p, r * c)).collect();
                    run.reduce(l, Op::Sum, &[send[r]], &outs, c)?;
                }
            }
        }
        Kind::ReduceScatter(op) => {
            for l in 0..nl {
                for q in ranks_of(l) {
                    let ins: Vec<u64> = send.iter().map(|&p| at(p, q * c)).collect();
                    run.reduce(l, op, &ins, &[recv[q]], c)?;
                }
            }
        }
        Kind::Send(_) | Kind::Recv(_) => return Err(not_collective()),
    }
    run.barrier(&all)
}

fn not_collective() -> Error {
    Error::InvalidArgument("send/recv is not a collective".into())
}

/// Runs one matched send/recv: `send` on `lanes[sl]`, `recv` on `lanes[rl]`.
pub(crate) fn p2p(
    exec: &mut dyn Exec,
    sh: &Shared,
    lanes: &[Lane],
    (sl, rl): (usize, usize),
    send: &Call,
    recv: &Call,
) -> Result<()> {
    let bytes = send.count * send.dtype.size;
    if bytes == 0 {
        return Ok(());
    }
    let _work = claim_work(sh, lanes.iter())?;
    let mut run = Run {
        exec,
        sh,
        lanes,
        dtype: send.dtype,
        nranks: 2,
    };
    let which: Vec<usize> = if sl == rl { vec![sl] } else { vec![sl, rl] };
    if !sh.staged {
        run.barrier(&which)?;
        let (sdev, rdev) = (&lanes[sl].device, &lanes[rl].device);
        run.copy(rl, (recv.recv, rdev), (send.send, sdev), bytes)?;
        return run.barrier(&which);
    }
    let key = StageKey::Pair(send.rank.min(recv.rank), send.rank.max(recv.rank));
    let st = sh.staging(key, bytes, lanes)?;
    let _staging_use = st.use_on(&which.iter().map(|&l| &lanes[l]).collect::<Vec<_>>())?;
    run.dtoh(sl, st.host, send.send, bytes)?;
    run.barrier(&which)?;
    run.htod(rl, recv.recv, st.host, bytes)?;
    run.barrier(&which)
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn chunks_tile_the_range_in_aligned_parts() {
        for count in [0usize, 1, 7, 16, 17, 1000, 4099] {
            for parts in 1..=5 {
                for esize in [1usize, 2, 4, 8] {
                    let mut next = 0;
                    for i in 0..parts {
                        let (lo, hi) = chunk(count, parts, i, esize);
                        assert_eq!(lo, next, "count {count} parts {parts} part {i}");
                        assert!(hi >= lo);
                        if hi < count {
                            assert_eq!((hi * esize) % 64, 0);
                        }
                        next = hi;
                    }
                    assert_eq!(next, count);
                }
            }
        }
    }
}
