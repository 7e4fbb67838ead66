//! The capture: [`BoundDevice::capture`], the [`Capture`] handle whose methods enqueue
//! into the graph (its kernel launches go through [`CaptureLaunch`]), and the guard that
//! joins a fork on every exit (the capture rules are on [`Capture`]).

use super::capture_launch::CaptureLaunch;
use super::session::{Active, Session, Span, destroy_graph};
use super::{Graph, Owned, Uses};
use crate::access::{Access, AccessTracker};
use crate::context::BoundDevice;
use crate::copy::DeviceOnlyMemory;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::launch::LaunchConfig;
use crate::memory::host::CaptureSource;
use crate::memory::{ByteSpan, DeviceMemory, DeviceRepr, MemsetValue};
use crate::module::Function;
use cudarc::driver::sys;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// The handle of an ongoing capture ([`BoundDevice::capture`]): its methods enqueue into
/// the graph being recorded, and are the only way to. Each use of a buffer borrows it for
/// the graph's lifetime `'buf`.
///
/// Not `Send`: a capture is ended on the thread that began it.
///
/// [`BoundDevice::capture`](crate::BoundDevice::capture) records stream-ordered work into a
/// [`Graph`] instead of running it. The closure receives a [`Capture`] handle whose methods
/// are the only operations that can enter the graph — kernel launches, memsets,
/// device-to-device copies, copies from page-locked host memory, [`fork`](Capture::fork)s,
/// records of and waits on the caller's events ([`record_event`](Capture::record_event),
/// [`wait_event`](Capture::wait_event)),
/// cuBLAS and cuBLASLt products (`blas::Enqueue`'s `matmul`, `matmul_batched`, `matmul_lt`
/// and the others, feature `cublas`), the one-device all-reduce (`Capture::all_reduce`, feature `collective`) and
/// one NCCL rank's collectives (`Capture::rank_all_reduce`, `rank_reduce`,
/// `rank_broadcast`, `rank_all_gather`, `rank_reduce_scatter` on a `RankComm`) — so nothing
/// that would invalidate a capture (a synchronisation, a synchronous copy, an allocation)
/// can be enqueued into it. (Code that issues the same memsets, copies and kernels on a
/// stream or into a capture is written once over [`Issue`](crate::Issue).)
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, LaunchConfig, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let module = gpu.compile_and_load(
///     r#"extern "C" __global__ void add_one(float* x, unsigned n) {
///            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///            if (i < n) x[i] += 1.0f;
///        }"#,
///     "add_one.cu",
/// )?;
/// let add_one = module.function("add_one")?;
/// let x = gpu.alloc_zeros::<f32>(1024)?;
/// let n = 1024u32;
/// let graph = gpu.capture(|c| {
///     c.memset_zeros(&x)?;
///     for _ in 0..10 {
///         // SAFETY: (float*, unsigned) matches the kernel, which stays in bounds.
///         unsafe { c.launch(&add_one, LaunchConfig::for_num_elems(n)).arg_written(&x).arg(&n).launch()? };
///     }
///     Ok(())
/// })?;
/// let exec = graph.instantiate()?;
/// let stream = gpu.new_stream()?;
/// exec.launch(&gpu.on(&stream)?)?;
/// assert!(gpu.dtoh(&x)?.iter().all(|&v| v == 10.0)); // dtoh waits for the graph
/// # Ok(()) }
/// ```
///
/// The handle has no synchronous operations:
///
/// ```compile_fail,E0599
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// gpu.capture(|c| c.synchronize())?; // error[E0599]: no method named `synchronize`
/// # Ok(()) }
/// ```
///
/// # How it stays sound
///
/// * **A private stream.** The capture runs on a non-blocking stream gpubind creates for
///   it (and on one more per [`fork`](Capture::fork)), in
///   `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`. No other handle to those streams exists and
///   no buffer's tracker ever names them, so no other code — another thread, or gpubind's
///   own hand-off events — can enqueue on them or fork them into another capture while
///   they capture. (Capturing on a user's [`Stream`](crate::Stream) would not give that:
///   a `&mut BoundStream` does not stop a second `gpu.on(&stream)`, and a buffer last used
///   on the stream makes the next use elsewhere record an event on it.)
/// * **Nothing runs at capture time**, so the capture tells no tracker anything. The graph
///   records which allocations it reads and writes; each
///   [`GraphExec::launch`](crate::GraphExec::launch) *claims* them on its stream like a
///   kernel launch does: it waits for their conflicting pending uses on other streams,
///   enqueues the graph, and records the launch as their latest use. Host reads,
///   synchronous copies, other streams and drops after a launch wait for it; a launch after
///   work elsewhere waits for that work.
/// * **Borrows.** A `Graph<'buf>` and its `GraphExec<'buf>` borrow every buffer and module
///   they use for `'buf` (shared borrows: a graph may write a buffer that other code reads
///   between launches, the claims order them). So they cannot outlive what they use, and
///   nothing can be freed while a launch is pending (the tracker's drop waits for it).
///   Shared borrows are enough for the graph's writes only because every other access to
///   device-only memory goes through the same tracker: the captured operations therefore
///   write only device-only memory ([`DeviceOnlyMemory`](crate::DeviceOnlyMemory)), never
///   [`ManagedSlice`](crate::ManagedSlice) (whose host slices are not claimed while held).
///   Within that, a shared [`DeviceView`](crate::DeviceView) is as writable in a graph as
///   the `&DeviceSlice` it comes from (a kernel writes either through
///   [`CaptureLaunch::arg_written`]; `arg(&x)` is a read): a graph
///   can write part of a buffer (a `grads.slice(range)?` view made before the capture,
///   so that it lives as long as the graph) while it reads another part or the whole,
///   and every one of those uses is claimed at each launch.
/// * **Forks.** The branches of a [`fork`](Capture::fork) run concurrently within a
///   launch, so uses captured on two branches that touch the same bytes (one of them a
///   write) are ordered inside the graph, in the order they were captured; uses of
///   disjoint bytes stay concurrent.
/// * **Page-locked input** ([`Capture::copy_from_host`]) is claimed as read at each
///   launch, and the host's writes to page-locked memory wait for its pending uses, so a
///   graph whose borrow ended early (a forgotten `GraphExec`) still has its input to
///   itself until it has read it.
/// * **Joins.** A fork is joined back when its closure returns — even on an error or a
///   panic — so an un-joined capture cannot be built.
/// * **Memory the graph owns.** A captured cuBLAS product's kernels use the handle's
///   workspace at every launch; the graph holds that workspace (an `Arc` shared with the
///   `Blas`) and claims it as written at each launch, so the handle itself may be reused
///   or dropped once the product is captured.
/// * **User events** ([`record_event`](Capture::record_event),
///   [`wait_event`](Capture::wait_event)) become event record and wait nodes: they order
///   a launch against other streams' work (another graph's, eager work) beyond what the
///   claims order, never less — each launch still claims every buffer, so no event can
///   let safe code see a buffer before the graph's writes to it, nor let the graph run
///   before another stream's pending writes to its buffers. Each event must belong to the
///   capture's device and is borrowed for `'buf`.
/// * **Ending.** The capture is ended when the closure returns, errs or panics; an
///   invalidated capture (e.g. by an illegal call through a raw handle) is the driver's
///   error (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, …) and yields no graph.
/// * **NCCL collectives** (`Capture::rank_all_reduce` and its siblings). One rank's part,
///   on its device, as NCCL captures it; every rank captures the same collectives and
///   launches the graph of that capture together (NCCL's rules). The graph borrows the
///   `RankComm`; its buffers are recorded like a kernel's, and so is the rank's order
///   tracker, which eager calls claim too, so the rank's collectives reach the device in
///   issue order and the communicator's drop waits (bounded) for graph launches. With
///   the rank's call check, each launch first agrees with the peers on the capture it
///   replays (one round trip to rank 0). A graph holding NCCL collectives is not
///   [`update`](crate::GraphExec::update)d. See docs/collective.md, "CUDA graphs".
///
/// # Not capturable (yet)
///
/// Collectives other than the one-device own-kernel all-reduce (`Capture::all_reduce`)
/// and an NCCL `RankComm`'s collectives (`Capture::rank_*`): a `Communicator` with ranks
/// on several devices, the host-staged transport, NCCL driven by one thread for several
/// devices, and `RankComm`s of own kernels are [`Error::NotCapturable`]; send/recv have
/// no capture method; nothing else can enqueue onto the capture's streams),
/// device-to-host copies (a captured copy writes its host memory at every launch, and the
/// host reads page-locked memory through `&`: host-to-device copies from page-locked
/// memory are capturable, [`Capture::copy_from_host`]), stream-ordered allocation and
/// child graphs.
pub struct Capture<'c, 'buf> {
    pub(super) session: &'c RefCell<Session<'buf>>,
    pub(super) device: &'c Arc<Device>,
    pub(super) stream: CaptureStream,
}

/// A capturing stream's handle. `Send`/`Sync` as an identifier: what keeps a [`Capture`]
/// on its thread is its session (a `RefCell`).
#[derive(Clone, Copy)]
pub(super) struct CaptureStream(pub(super) sys::CUstream);

// SAFETY: a CUstream handle is a thread-agnostic identifier; nothing is reached through it
// without a `Capture`, which is `!Send` and `!Sync`.
unsafe impl Send for CaptureStream {}
// SAFETY: as above.
unsafe impl Sync for CaptureStream {}

impl std::fmt::Debug for Capture<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

impl<'a> BoundDevice<'a> {
    /// Records the work `f` enqueues through its [`Capture`] handle into a [`Graph`]
    /// (stream capture, `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, on a private stream; see
    /// [`Capture`](crate::Capture)). Nothing runs until the graph is instantiated and
    /// launched.
    ///
    /// The capture is ended when `f` returns, fails or panics. `f`'s error is returned
    /// (the partial graph is discarded); a capture the driver invalidated is its error,
    /// e.g. [`Error::Driver`] with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    ///
    /// While `f` runs, this thread may still use gpubind normally (that work runs at
    /// once); the driver refuses calls on this thread that could synchronise with the
    /// capture (e.g. a synchronous copy may fail with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), which also invalidates it.
    pub fn capture<'buf, F>(&self, f: F) -> Result<Graph<'buf>>
    where
        F: for<'c> FnOnce(&mut Capture<'c, 'buf>) -> Result<()>,
    {
        self.ensure_current()?;
        let device = self.device();
        let session = RefCell::new(Session {
            device: Arc::clone(device),
            uses: Uses::default(),
            streams: Vec::new(),
            events: Vec::new(),
            scratch: Vec::new(),
            open_forks: 0,
            hazards: Vec::new(),
            pending: Vec::new(),
            fatal: None,
        });
        let origin = session.borrow_mut().new_stream()?;
        // SAFETY: a stream of the current context, created above and known to no one
        // else; thread-local mode leaves other threads' calls alone.
        device.check(unsafe {
            result::stream::begin_capture(
                origin,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        // Declared after `session`: dropped (capture ended) before its streams are.
        let mut active = Active {
            device,
            origin,
            ended: false,
        };
        let out = f(&mut Capture {
            session: &session,
            device,
            stream: CaptureStream(origin),
        });
        let ended = active.end();
        let raw = match (out, ended) {
            (Ok(()), Ok(raw)) => raw,
            (Err(e), ended) => {
                let _ = ended.map(destroy_graph);
                return Err(e);
            }
            (Ok(()), Err(e)) => return Err(e),
        };
        if let Some(e) = session.borrow_mut().fatal.take() {
            destroy_graph(raw);
            return Err(e);
        }
        let uses = std::mem::take(&mut session.borrow_mut().uses);
        Ok(Graph {
            device: Arc::clone(device),
            raw,
            uses,
        })
    }
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Records that the captured work uses `t`'s allocation (all of it, as far as this
    /// capture's ordering is concerned): each launch of the graph claims it with
    /// `access`. Call before enqueueing the use, and [`mark`](Self::mark) after.
    pub(crate) fn record(&self, t: &'buf AccessTracker, access: Access) -> Result<()> {
        self.record_span(t, access, 0, u64::MAX)
    }

    /// [`record_span`](Self::record_span) of all of `m` (its allocation, address and
    /// size).
    pub(crate) fn record_memory<T, M>(&self, m: &'buf M, access: Access) -> Result<()>
    where
        M: DeviceMemory<T> + ?Sized,
    {
        self.record_span(m.tracker(), access, m.device_ptr(), m.num_bytes() as u64)
    }

    /// [`record`](Self::record) of `bytes` bytes at device address `lo` of `t`'s
    /// allocation. While a fork is open, the capturing stream first waits for every
    /// conflicting use captured on another stream of this capture (the same allocation,
    /// overlapping bytes, one of them a write), so no launch of the graph runs two of
    /// them at once.
    pub(crate) fn record_span(
        &self,
        t: &'buf AccessTracker,
        access: Access,
        lo: u64,
        bytes: u64,
    ) -> Result<()> {
        let span = Span {
            bytes: ByteSpan::new(t, lo, bytes),
            write: access == Access::Write,
        };
        self.session.borrow_mut().uses.add(t, access);
        self.order_span(span)
    }

    /// [`record`](Self::record) of memory the graph keeps alive itself (a
    /// [`Kernel`](crate::Kernel)'s module): each launch of the graph claims it with
    /// `access`, and while a fork is open it is ordered like a borrowed allocation.
    pub(crate) fn record_owned_use(&self, o: Arc<dyn Owned>, access: Access) -> Result<()> {
        let span = Span {
            bytes: ByteSpan::new(o.tracker(), 0, u64::MAX),
            write: access == Access::Write,
        };
        self.session.borrow_mut().uses.add_owned(o, access);
        self.order_span(span)
    }

    /// While a fork is open, makes the capturing stream wait for every use captured on
    /// another of this capture's streams that conflicts with `span`, and notes `span`
    /// for [`mark`](Self::mark).
    fn order_span(&self, span: Span) -> Result<()> {
        let here = self.stream.0;
        let mut s = self.session.borrow_mut();
        if s.open_forks == 0 {
            return Ok(());
        }
        s.pending.push(span);
        let mut waited: Vec<sys::CUevent> = Vec::new();
        for &(h, stream, event) in &s.hazards {
            if stream != here && h.conflicts(&span) && !waited.contains(&event) {
                // SAFETY: `event` was recorded on `stream`, a capturing stream of this
                // capture, right after the earlier use; waiting on it from `here`
                // (capturing, same capture) adds that dependency to the graph.
                self.device
                    .check(unsafe { result::stream::wait_event(here, event) })?;
                waited.push(event);
            }
        }
        Ok(())
    }

    /// Ends the capture of one operation (call it after enqueueing, also when that
    /// failed: part of it may be in the graph): while a fork is open, the uses it
    /// recorded become hazards that later uses on other streams are ordered after.
    pub(crate) fn mark(&self) -> Result<()> {
        let here = self.stream.0;
        if self.session.borrow().pending.is_empty() {
            return Ok(());
        }
        // Created with the capture mode relaxed, as in `fork`.
        let event = relaxed(|| self.session.borrow_mut().event())??;
        // SAFETY: an event of this context created for this capture; recorded on the
        // capturing stream, it marks the point after the operation.
        self.device
            .check(unsafe { result::event::record(event, here) })?;
        let mut s = self.session.borrow_mut();
        let spans = std::mem::take(&mut s.pending);
        s.hazards
            .extend(spans.into_iter().map(|span| (span, here, event)));
        Ok(())
    }

    /// Runs `op` (which enqueues one operation whose uses were recorded), then
    /// [`mark`](Self::mark)s it: `op`'s error first, else the mark's.
    pub(crate) fn marked<R>(&self, op: impl FnOnce() -> Result<R>) -> Result<R> {
        let out = op();
        let marked = self.mark();
        let r = out?;
        marked?;
        Ok(r)
    }

    /// Makes every launch of the graph agree through `gate` first, on `record` among
    /// what it already holds (see [`LaunchAgreement`](super::LaunchAgreement)).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn record_agreement(&self, gate: &'buf dyn super::LaunchAgreement, record: &[u8]) {
        self.session.borrow_mut().uses.add_agreement(gate, record);
    }

    /// Discards the graph when the capture ends, with `e`, whatever the closure
    /// returns (the first such error is kept). Returns `e`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn discard_graph(&self, e: Error) -> Error {
        self.session.borrow_mut().fatal.get_or_insert(e.clone());
        e
    }

    /// Records memory the graph keeps alive itself (see `Uses::owned`), claimed with
    /// `access` at each launch.
    #[cfg_attr(not(feature = "cublas"), allow(dead_code))]
    pub(crate) fn record_owned(&self, o: Arc<dyn Owned>, access: Access) {
        self.session.borrow_mut().uses.add_owned(o, access);
    }

    /// Runs `op`, which enqueues work that uses the scratch memory tracked by `t` on this
    /// handle's stream, ordered after the previous use of that memory in this capture if
    /// it was on another of the capture's streams (a fork's branch), so one launch of the
    /// graph never runs two such uses concurrently. The graph's claim orders launches
    /// against other uses; this orders the graph's own nodes. For memory whose users do
    /// not see each other's use (a cuBLAS workspace, set on the handle, not passed).
    #[cfg_attr(not(feature = "cublas"), allow(dead_code))]
    pub(crate) fn exclusive_use(
        &self,
        t: &AccessTracker,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let here = self.stream.0;
        let last = {
            let s = self.session.borrow();
            s.scratch
                .iter()
                .find(|(x, _, _)| std::ptr::eq(*x, t))
                .map(|&(_, stream, event)| (stream, event))
        };
        let event = match last {
            Some((stream, event)) => {
                if stream != here {
                    // SAFETY: `event` was last recorded on `stream`, a capturing stream of
                    // this capture, right after the previous use; waiting on it from
                    // `here` (capturing, same capture) adds that dependency to the graph.
                    self.device
                        .check(unsafe { result::stream::wait_event(here, event) })?;
                }
                event
            }
            // Created with the capture mode relaxed, as in `fork`.
            None => relaxed(|| self.session.borrow_mut().event())??,
        };
        // Recorded after the use even when it failed: a failed product may have recorded
        // some of its kernels already, and a caller that ignores the error must still
        // find the next use of `t` ordered after them.
        let out = op();
        // SAFETY: `event` is an event of this context created for this capture; recording
        // it on the capturing stream marks the point after this use.
        self.device
            .check(unsafe { result::event::record(event, here) })?;
        let mut s = self.session.borrow_mut();
        match s.scratch.iter_mut().find(|(x, _, _)| std::ptr::eq(*x, t)) {
            Some(entry) => *entry = (t, here, event),
            None => s.scratch.push((t, here, event)),
        }
        out
    }

    /// The capture's device.
    #[cfg_attr(not(any(feature = "cublas", feature = "collective")), allow(dead_code))]
    pub(crate) fn device(&self) -> &'c Arc<Device> {
        self.device
    }

    /// The capturing stream: work enqueued on it enters the graph. For gpubind's own
    /// capturable operations, which record what they use first.
    #[cfg_attr(not(any(feature = "cublas", feature = "collective")), allow(dead_code))]
    pub(crate) fn stream_handle(&self) -> sys::CUstream {
        self.stream.0
    }

    /// Starts a kernel launch into the graph: the same builder as
    /// [`BoundStream::launch`](crate::BoundStream::launch), except that its arguments are
    /// borrowed for the graph's lifetime, and the buffers among them are claimed at each
    /// launch of the graph (as read or written: see [`CaptureLaunch::arg`]).
    pub fn launch<'l>(
        &'l mut self,
        func: &'l Function<'buf>,
        cfg: LaunchConfig,
    ) -> CaptureLaunch<'l, 'c, 'buf> {
        let error = self
            .device
            .expect_same("kernel module", func.module().device())
            .err();
        CaptureLaunch::new(self, func, cfg, error)
    }

    /// Zeroes `dst` at each launch of the graph. `dst` is borrowed for the graph's
    /// lifetime; only device-only memory is accepted — any shared view of it included (see
    /// [`Capture`], "How it stays sound").
    pub fn memset_zeros<T, D>(&mut self, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.device.expect_same("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.record_memory(dst, Access::Write)?;
        self.marked(|| {
            // SAFETY: a capturing stream of the bound context: recorded, not run. The
            // range is in bounds of a live allocation that the graph borrows for 'buf and
            // claims at each launch.
            self.device.check(unsafe {
                result::copy::memset_d8_async(dst.device_ptr(), 0, dst.num_bytes(), self.stream.0)
            })
        })
    }

    /// Fills `dst` with `value` at each launch of the graph (1-, 2- and 4-byte types, as
    /// [`BoundStream::memset_async`](crate::BoundStream::memset_async)).
    pub fn memset<T, D>(&mut self, dst: &'buf D, value: T) -> Result<()>
    where
        T: MemsetValue,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.device.expect_same("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.record_memory(dst, Access::Write)?;
        self.marked(|| {
            // SAFETY: as in `memset_zeros`.
            unsafe {
                crate::memory::memset_raw(
                    self.device,
                    dst.device_ptr(),
                    dst.len(),
                    value.memset_pattern(),
                    Some(self.stream.0),
                )
            }
        })
    }

    /// Copies `src` into `dst` at each launch of the graph; lengths must match. Both may
    /// be parts of one allocation if they do not overlap
    /// ([`Error::InvalidArgument`] otherwise).
    pub fn dtod<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.device.expect_same("source", src.device())?;
        self.device.expect_same("destination", dst.device())?;
        crate::memory::expect_len("dtod", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let bytes = src.num_bytes() as u64;
        let (s, d) = (src.device_ptr(), dst.device_ptr());
        if std::ptr::eq(src.tracker(), dst.tracker()) && s < d + bytes && d < s + bytes {
            return Err(Error::InvalidArgument(format!(
                "dtod: source {s:#x} and destination {d:#x} overlap ({bytes} bytes each)"
            )));
        }
        self.record_memory(src, Access::Read)?;
        self.record_memory(dst, Access::Write)?;
        self.marked(|| {
            // SAFETY: a capturing stream of the bound context: recorded, not run. Both
            // ranges are in bounds of live allocations the graph borrows for 'buf and
            // claims at each launch; they do not overlap (checked above, or different
            // allocations).
            self.device
                .check(unsafe { result::copy::dtod_async(d, s, src.num_bytes(), self.stream.0) })
        })
    }

    /// Copies page-locked host memory into `dst` at each launch of the graph: the way to
    /// feed a graph input from the host (lengths must match). Both are borrowed for the
    /// graph's lifetime, and `src` is claimed as read at each launch, so the host writes
    /// `src` only between launches: its `&mut` access is borrowed away while the graph
    /// lives, and once it is back, a write waits for the launches still reading (see
    /// [`CaptureSource`]: only memory whose writes wait, and which no forgotten borrow can
    /// hand back early, is accepted). To feed a different batch each launch, capture one
    /// graph per page-locked batch (they may share everything else), or write the input
    /// between launches with a kernel or a copy on a stream. Non-portable page-locked
    /// memory must belong to the capture's device ([`Error::WrongDevice`]); pageable
    /// memory cannot be captured (it is not a [`CaptureSource`]).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, PinnedOptions, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let batch = gpu.pinned_from_slice(&[1.0f32, 2.0, 3.0], PinnedOptions::default())?;
    /// let x = gpu.alloc_zeros::<f32>(3)?;
    /// let graph = gpu.capture(|c| c.copy_from_host(&batch, &x))?;
    /// graph.instantiate()?.launch(&gpu.default_stream())?;
    /// assert_eq!(gpu.dtoh(&x)?, [1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0502
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let mut batch = gpu.pinned_from_slice(&[1.0f32; 3], Default::default())?;
    /// let x = gpu.alloc_zeros::<f32>(3)?;
    /// let graph = gpu.capture(|c| c.copy_from_host(&batch, &x))?;
    /// batch[0] = 5.0; // error[E0502]: the graph may read `batch` at any launch
    /// graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    ///
    /// A registration that borrows its pages is refused (forgetting it would give them
    /// back while a launch may read them); register an owned `Vec`
    /// ([`register_vec`](crate::BoundDevice::register_vec)) instead:
    ///
    /// ```compile_fail,E0597
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let x = gpu.alloc_zeros::<f32>(3)?;
    /// let mut v = vec![1.0f32; 3];
    /// let reg = gpu.register_host(&mut v, Default::default())?; // error[E0597]: needs 'static
    /// let graph = gpu.capture(|c| c.copy_from_host(&reg, &x))?;
    /// # Ok(()) }
    /// ```
    pub fn copy_from_host<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: CaptureSource<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let from = src.source();
        if let Some(owner) = from.device() {
            self.device.expect_same("page-locked source", owner)?;
        }
        self.device.expect_same("destination", dst.device())?;
        crate::memory::expect_len("copy_from_host", dst.len(), from.len())?;
        if from.is_empty() {
            return Ok(());
        }
        let Some(tracker) = from.tracker else {
            return Err(Error::InvalidArgument(
                "copy_from_host: page-locked memory without a tracker".into(),
            ));
        };
        self.record_span(tracker, Access::Read, from.addr, dst.num_bytes() as u64)?;
        self.record_memory(dst, Access::Write)?;
        self.marked(|| {
            // SAFETY: a capturing stream of the bound context: recorded, not run. `from`
            // is page-locked host memory of `len` elements (mapped for this device:
            // portable, or owned by it), `dst` a device range of the same length; the
            // graph borrows both for 'buf and claims both at each launch. The host cannot
            // free or write `src` under a launch even if that borrow ends early (a
            // forgotten GraphExec): its drop and its host writes wait for the claimed
            // read (`CaptureSource`).
            self.device.check(unsafe {
                result::copy::htod_async(
                    dst.device_ptr(),
                    from.addr as *const c_void,
                    dst.num_bytes(),
                    self.stream.0,
                )
            })
        })
    }

    /// Runs `f` with this handle and a second one, on another stream of the capture that
    /// forks from here: work enqueued through the two is independent (concurrent in the
    /// graph), and everything the branch enqueued is joined back before `fork` returns —
    /// also when `f` fails or panics — so a capture cannot end with an un-joined fork.
    /// Forks nest.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let (a, b) = (gpu.alloc_zeros::<u32>(1 << 20)?, gpu.alloc_zeros::<u32>(1 << 20)?);
    /// let graph = gpu.capture(|c| {
    ///     c.fork(|main, branch| {
    ///         main.memset(&a, 1u32)?;   // these two run concurrently
    ///         branch.memset(&b, 2u32)
    ///     })?;
    ///     c.dtod(&a, &b)                // after both
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn fork<R, F>(&mut self, f: F) -> Result<R>
    where
        F: FnOnce(&mut Capture<'c, 'buf>, &mut Capture<'c, 'buf>) -> Result<R>,
    {
        let main = self.stream.0;
        // Created with this thread's capture mode relaxed: a capture in thread-local mode
        // prohibits "potentially unsafe" calls on its thread, and the driver does not
        // list which (creating a stream or an event synchronises with nothing).
        let (branch, forked, joined) = relaxed(|| {
            let mut s = self.session.borrow_mut();
            Ok::<_, Error>((s.new_stream()?, s.event()?, s.event()?))
        })??;
        // SAFETY: `forked` is an event of this context; `main` is capturing: the record
        // marks this point of the capture, and the wait makes `branch` (private, idle)
        // join the capture from here.
        self.device
            .check(unsafe { result::event::record(forked, main) })?;
        // SAFETY: as above.
        self.device
            .check(unsafe { result::stream::wait_event(branch, forked) })?;
        let mut join = Join {
            device: self.device,
            branch,
            main,
            event: joined,
            done: false,
        };
        let mut other = Capture {
            session: self.session,
            device: self.device,
            stream: CaptureStream(branch),
        };
        self.session.borrow_mut().open_forks += 1;
        let out = f(self, &mut other);
        // The closure may have swapped the two handles: this one is `main` again.
        self.stream = CaptureStream(main);
        let joined = join.join();
        {
            let mut s = self.session.borrow_mut();
            s.open_forks -= 1;
            if s.open_forks == 0 {
                // Every branch is joined: what follows on the origin stream is ordered
                // after all of it.
                s.hazards.clear();
            }
        }
        let r = out?;
        joined?;
        Ok(r)
    }

    /// The raw handle of the capturing stream.
    ///
    /// # Safety
    ///
    /// Valid during the closure only. Work enqueued through it enters the graph but is
    /// not tracked: the memory it uses must outlive every launch of the graph and be
    /// ordered around them by the caller. It must leave the capture joined (every stream
    /// it forks joined back). A call the capture forbids (a synchronisation, a query)
    /// invalidates it: [`BoundDevice::capture`] then fails.
    pub unsafe fn raw_stream(&self) -> sys::CUstream {
        self.stream.0
    }
}

/// Runs `f` with this thread's stream capture mode set to relaxed, then restores the
/// previous mode ([`crate::driver::with_relaxed_capture_mode`]).
fn relaxed<R>(f: impl FnOnce() -> R) -> Result<R> {
    crate::driver::with_relaxed_capture_mode(f)
}

/// Joins a fork's branch back into its main stream, once: by [`Join::join`], or by the
/// drop on a panic.
struct Join<'d> {
    device: &'d Device,
    branch: sys::CUstream,
    main: sys::CUstream,
    event: sys::CUevent,
    done: bool,
}

impl Join<'_> {
    fn join(&mut self) -> Result<()> {
        self.done = true;
        // SAFETY: `event` is an event of this context, `branch` a capturing stream of the
        // capture: recording marks the branch's end; `main` waiting on it joins it.
        self.device
            .check(unsafe { result::event::record(self.event, self.branch) })?;
        // SAFETY: as above.
        self.device
            .check(unsafe { result::stream::wait_event(self.main, self.event) })
    }
}

impl Drop for Join<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.join();
        }
    }
}
