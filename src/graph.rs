//! CUDA graphs: stream capture as a typestate, and executable graphs that launch on a
//! bound stream.
//!
//! [`BoundDevice::capture`] records stream-ordered work into a [`Graph`] instead of
//! running it. The closure receives a [`Capture`] handle whose methods are the only
//! operations that can enter the graph — kernel launches, memsets, device-to-device copies
//! and [`fork`](Capture::fork)s — so nothing that would invalidate a capture (a
//! synchronisation, a host copy, an allocation) can be enqueued into it:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, LaunchConfig, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let gpu = ctx.bind(&Device::get(0)?)?;
//! let module = gpu.compile_and_load(
//!     r#"extern "C" __global__ void add_one(float* x, unsigned n) {
//!            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
//!            if (i < n) x[i] += 1.0f;
//!        }"#,
//!     "add_one.cu",
//! )?;
//! let add_one = module.function("add_one")?;
//! let x = gpu.alloc_zeros::<f32>(1024)?;
//! let n = 1024u32;
//! let graph = gpu.capture(|c| {
//!     c.memset_zeros(&x)?;
//!     for _ in 0..10 {
//!         // SAFETY: (float*, unsigned) matches the kernel, which stays in bounds.
//!         unsafe { c.launch(&add_one, LaunchConfig::for_num_elems(n)).arg(&x).arg(&n).launch()? };
//!     }
//!     Ok(())
//! })?;
//! let exec = graph.instantiate()?;
//! let stream = gpu.new_stream()?;
//! exec.launch(&gpu.on(&stream)?)?;
//! assert!(gpu.dtoh(&x)?.iter().all(|&v| v == 10.0)); // dtoh waits for the graph
//! # Ok(()) }
//! ```
//!
//! The handle has no synchronous operations:
//!
//! ```compile_fail,E0599
//! # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
//! gpu.capture(|c| c.synchronize())?; // error[E0599]: no method named `synchronize`
//! # Ok(()) }
//! ```
//!
//! # How it stays sound
//!
//! * **A private stream.** The capture runs on a non-blocking stream gpubind creates for
//!   it (and on one more per [`fork`](Capture::fork)), in
//!   `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`. No other handle to those streams exists and
//!   no buffer's tracker ever names them, so no other code — another thread, or gpubind's
//!   own hand-off events — can enqueue on them or fork them into another capture while
//!   they capture. (Capturing on a user's [`Stream`](crate::Stream) would not give that:
//!   a `&mut BoundStream` does not stop a second `gpu.on(&stream)`, and a buffer last used
//!   on the stream makes the next use elsewhere record an event on it.)
//! * **Nothing runs at capture time**, so the capture tells no tracker anything. The graph
//!   records which allocations it reads and writes; each [`GraphExec::launch`] *claims*
//!   them on its stream like a kernel launch does: it waits for their conflicting pending
//!   uses on other streams, enqueues the graph, and records the launch as their latest
//!   use. Host reads, synchronous copies, other streams and drops after a launch wait for
//!   it; a launch after work elsewhere waits for that work.
//! * **Borrows.** A `Graph<'buf>` and its `GraphExec<'buf>` borrow every buffer and module
//!   they use for `'buf` (shared borrows: a graph may write a buffer that other code reads
//!   between launches, the claims order them). So they cannot outlive what they use, and
//!   nothing can be freed while a launch is pending (the tracker's drop waits for it).
//!   Shared borrows are enough for the graph's writes only because every other access to
//!   device-only memory goes through the same tracker: memsets and copies therefore
//!   accept only writable device-only memory ([`DeviceOnlyMemory`]), never
//!   [`ManagedSlice`](crate::ManagedSlice) (whose host slices are not claimed while held)
//!   nor a read-only [`DeviceView`](crate::DeviceView).
//! * **Joins.** A fork is joined back when its closure returns — even on an error or a
//!   panic — so an un-joined capture cannot be built.
//! * **Ending.** The capture is ended when the closure returns, errs or panics; an
//!   invalidated capture (e.g. by an illegal call through a raw handle) is the driver's
//!   error (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, …) and yields no graph.
//!
//! # Not capturable (yet)
//!
//! Collectives (neither backend: the handle has no collective operation, and nothing
//! else can enqueue onto the capture's streams), host-device copies (a captured copy
//! reads or writes its host memory at every launch; it would need page-locked buffers
//! borrowed for the graph's lifetime), stream-ordered allocation, child graphs and
//! events of the caller's own.

use crate::access::{self, Access, AccessTracker, Use};
use crate::context::BoundDevice;
use crate::copy::DeviceOnlyMemory;
use crate::device::Device;
use crate::driver::Check;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr, MemsetValue};
use crate::module::{Function, KernelArg, LaunchConfig};
use crate::poison::KernelName;
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::cell::RefCell;
use std::ffi::c_void;
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
#[derive(Clone, Default)]
struct Uses<'buf> {
    trackers: Vec<(&'buf AccessTracker, Access)>,
    last_kernel: Option<&'static KernelName>,
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
}

// SAFETY: a CUgraph is a thread-agnostic identifier; gpubind calls the driver on it only
// with its device's context pushed, and `&mut`/owned access (no `Sync`) serialises the
// calls, as the driver requires. The borrowed trackers are `Sync`.
unsafe impl Send for Graph<'_> {}
// SAFETY: as for Graph; `launch` takes `&self` but the type is not `Sync`, so calls on one
// executable graph never run concurrently.
unsafe impl Send for GraphExec<'_> {}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.trackers.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GraphExec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.uses.trackers.len())
            .finish_non_exhaustive()
    }
}

/// What one capture owns: the streams it created, the events of its forks, and what the
/// captured work uses. Shared (through a `RefCell`) by the handles of one capture.
struct Session<'buf> {
    device: Arc<Device>,
    uses: Uses<'buf>,
    /// Every stream this capture created (the origin first): destroyed after it ends.
    streams: Vec<sys::CUstream>,
    /// Fork and join events (created for this capture, not pooled: their last records
    /// are in the capture), destroyed after it ends.
    events: Vec<sys::CUevent>,
}

impl Session<'_> {
    /// A new private non-blocking stream of the (current) context, destroyed with the
    /// session.
    fn new_stream(&mut self) -> Result<sys::CUstream> {
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the bound context is current (checked by `capture`, and the binding is
        // borrowed by the closure for the whole capture); writes one handle.
        unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        }
        .check_on(&self.device, "cuStreamCreate")?;
        self.streams.push(raw);
        Ok(raw)
    }

    /// A new timing-disabled event of the device, destroyed with the session.
    fn event(&mut self) -> Result<sys::CUevent> {
        let e = self.device.new_handoff_event()?;
        self.events.push(e);
        Ok(e)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // The capture has ended (`Active` drops first): nothing refers to these streams.
        for &s in &self.streams {
            crate::faults::release(
                format_args!("a capture stream"),
                &self.device,
                Ok(()),
                "cuStreamDestroy_v2",
                // SAFETY: created by `new_stream` in this context, destroyed once, here.
                || unsafe { sys::cuStreamDestroy_v2(s) },
            );
        }
        for &e in &self.events {
            crate::faults::release(
                format_args!("a capture's fork event"),
                &self.device,
                Ok(()),
                "cuEventDestroy_v2",
                // SAFETY: created by `event` in this context, destroyed once, here.
                || unsafe { sys::cuEventDestroy_v2(e) },
            );
        }
    }
}

/// An ongoing capture on the origin stream: ended exactly once, by [`Active::end`] or
/// (on an early return or a panic) by the drop, which discards the graph.
struct Active<'d> {
    device: &'d Device,
    origin: sys::CUstream,
    ended: bool,
}

impl Active<'_> {
    fn end(&mut self) -> Result<sys::CUgraph> {
        self.ended = true;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `origin` is capturing (begun by `capture`, on this thread: the handles
        // are !Send); writes one handle.
        let r = unsafe { sys::cuStreamEndCapture(self.origin, &mut graph) }
            .check_on(self.device, "cuStreamEndCapture");
        match r {
            Ok(()) if !graph.is_null() => Ok(graph),
            Ok(()) => Err(Error::InvalidArgument(
                "cuStreamEndCapture returned no graph".into(),
            )),
            Err(e) => {
                destroy_graph(graph);
                Err(e)
            }
        }
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        if !self.ended {
            // An early return or a panic: end the capture so the thread and the stream
            // leave capture mode, and discard whatever was captured.
            let _ = self.end().map(destroy_graph);
        }
    }
}

/// Destroys a graph (null: nothing). The context needs not be current for it.
fn destroy_graph(graph: sys::CUgraph) {
    if !graph.is_null() {
        // SAFETY: a graph returned by cuStreamEndCapture, owned here, destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(graph) };
    }
}

/// The handle of an ongoing capture ([`BoundDevice::capture`]): its methods enqueue into
/// the graph being recorded, and are the only way to. Each use of a buffer borrows it for
/// the graph's lifetime `'buf`.
///
/// Not `Send`: a capture is ended on the thread that began it.
pub struct Capture<'c, 'buf> {
    session: &'c RefCell<Session<'buf>>,
    device: &'c Arc<Device>,
    stream: CaptureStream,
}

/// A capturing stream's handle. `Send`/`Sync` as an identifier: what keeps a [`Capture`]
/// on its thread is its session (a `RefCell`).
#[derive(Clone, Copy)]
struct CaptureStream(sys::CUstream);

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
    /// the [module docs](crate::graph)). Nothing runs until the graph is instantiated and
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
        });
        let origin = session.borrow_mut().new_stream()?;
        // SAFETY: a stream of the current context, created above and known to no one
        // else; thread-local mode leaves other threads' calls alone.
        unsafe {
            sys::cuStreamBeginCapture_v2(
                origin,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .check_on(device, "cuStreamBeginCapture_v2")?;
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
        let uses = std::mem::take(&mut session.borrow_mut().uses);
        Ok(Graph {
            device: Arc::clone(device),
            raw,
            uses,
        })
    }
}

impl<'c, 'buf> Capture<'c, 'buf> {
    fn record(&self, t: &'buf AccessTracker, access: Access) {
        self.session.borrow_mut().uses.add(t, access);
    }

    /// Starts a kernel launch into the graph: the same builder as
    /// [`BoundStream::launch`], except that its arguments are borrowed for the graph's
    /// lifetime, and the buffers among them are claimed at each launch of the graph
    /// (as written).
    pub fn launch<'l>(
        &'l mut self,
        func: &'l Function<'buf>,
        cfg: LaunchConfig,
    ) -> CaptureLaunch<'l, 'c, 'buf> {
        let error = self
            .device
            .expect_same("kernel module", func.module().device())
            .err();
        CaptureLaunch {
            capture: self,
            func,
            cfg,
            args: Vec::new(),
            values: Vec::new(),
            buffers: Vec::new(),
            error,
        }
    }

    /// Zeroes `dst` at each launch of the graph. `dst` is borrowed for the graph's
    /// lifetime; only writable device-only memory is accepted (see the module docs).
    pub fn memset_zeros<T, D>(&mut self, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        D: DeviceMemoryMut<T> + DeviceOnlyMemory + ?Sized,
    {
        self.device.expect_same("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.record(dst.tracker(), Access::Write);
        // SAFETY: a capturing stream of the bound context: recorded, not run. The range
        // is in bounds of a live allocation that the graph borrows for 'buf and claims at
        // each launch.
        unsafe { sys::cuMemsetD8Async(dst.device_ptr(), 0, dst.num_bytes(), self.stream.0) }
            .check_on(self.device, "cuMemsetD8Async")
    }

    /// Fills `dst` with `value` at each launch of the graph (1-, 2- and 4-byte types, as
    /// [`BoundStream::memset_async`]).
    pub fn memset<T, D>(&mut self, dst: &'buf D, value: T) -> Result<()>
    where
        T: MemsetValue,
        D: DeviceMemoryMut<T> + DeviceOnlyMemory + ?Sized,
    {
        self.device.expect_same("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.record(dst.tracker(), Access::Write);
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
    }

    /// Copies `src` into `dst` at each launch of the graph; lengths must match. Both may
    /// be parts of one allocation if they do not overlap
    /// ([`Error::InvalidArgument`] otherwise).
    pub fn dtod<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemoryMut<T> + DeviceOnlyMemory + ?Sized,
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
        self.record(src.tracker(), Access::Read);
        self.record(dst.tracker(), Access::Write);
        // SAFETY: a capturing stream of the bound context: recorded, not run. Both ranges
        // are in bounds of live allocations the graph borrows for 'buf and claims at each
        // launch; they do not overlap (checked above, or different allocations).
        unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, src.num_bytes(), self.stream.0) }
            .check_on(self.device, "cuMemcpyDtoDAsync_v2")
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
        unsafe { sys::cuEventRecord(forked, main) }.check_on(self.device, "cuEventRecord")?;
        // SAFETY: as above.
        unsafe { sys::cuStreamWaitEvent(branch, forked, 0) }
            .check_on(self.device, "cuStreamWaitEvent")?;
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
        let out = f(self, &mut other);
        // The closure may have swapped the two handles: this one is `main` again.
        self.stream = CaptureStream(main);
        let joined = join.join();
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
/// previous mode (`cuThreadExchangeStreamCaptureMode`, push-pop as the driver's docs
/// advise).
fn relaxed<R>(f: impl FnOnce() -> R) -> Result<R> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: swaps one enum value of this thread's state.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
        .check("cuThreadExchangeStreamCaptureMode")?;
    struct Restore(sys::CUstreamCaptureMode);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: as above; puts back the mode saved before `f`.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.0) };
        }
    }
    let _restore = Restore(mode);
    Ok(f())
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
        unsafe { sys::cuEventRecord(self.event, self.branch) }
            .check_on(self.device, "cuEventRecord")?;
        // SAFETY: as above.
        unsafe { sys::cuStreamWaitEvent(self.main, self.event, 0) }
            .check_on(self.device, "cuStreamWaitEvent")
    }
}

impl Drop for Join<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.join();
        }
    }
}

/// A kernel launch being captured; see [`Capture::launch`].
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct CaptureLaunch<'l, 'c, 'buf> {
    capture: &'l mut Capture<'c, 'buf>,
    func: &'l Function<'buf>,
    cfg: LaunchConfig,
    args: Vec<*mut c_void>,
    /// Arguments given by value ([`value`](CaptureLaunch::value)), boxed so their
    /// addresses in `args` stay put.
    values: Vec<Box<dyn std::any::Any>>,
    buffers: Vec<&'buf AccessTracker>,
    error: Option<Error>,
}

impl std::fmt::Debug for CaptureLaunch<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureLaunch")
            .field("function", &self.func.name())
            .field("config", &self.cfg)
            .field("args", &self.args.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<'buf> CaptureLaunch<'_, '_, 'buf> {
    /// Appends an argument, borrowed for the graph's lifetime. A gpubind buffer passed
    /// here is claimed as written at every launch of the graph (see
    /// [`LaunchBuilder::arg`](crate::LaunchBuilder::arg)). Errors (another device's
    /// memory, a size mismatch) are reported by [`launch`](Self::launch). Plain data
    /// that does not live as long as the graph goes by [`value`](Self::value).
    pub fn arg<A: KernelArg + ?Sized>(&mut self, arg: &'buf A) -> &mut Self {
        if self.error.is_none()
            && let Some(dev) = arg.arg_device()
        {
            self.error = self
                .capture
                .device
                .expect_same("kernel argument", dev)
                .err();
        }
        if self.error.is_none() {
            self.error = self
                .func
                .check_arg_size(self.args.len(), arg.param_size(), || arg.describe())
                .err();
        }
        if let Some(t) = arg.access_tracker() {
            self.buffers.push(t);
        }
        self.args.push(arg.param_ptr());
        self
    }

    /// Appends a plain-data argument by value: the kernel node keeps a copy of its bytes
    /// (taken at capture), so unlike [`arg`](Self::arg) nothing stays borrowed. For
    /// scalars computed inside the capture:
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, scale: &gpubind::Function<'_>) -> gpubind::Result<()> {
    /// use gpubind::LaunchConfig;
    /// let x = gpu.alloc_zeros::<f32>(1024)?;
    /// let graph = gpu.capture(|c| {
    ///     for k in 0..4u32 {
    ///         // SAFETY: (float*, unsigned, float) matches `scale`, which stays in bounds.
    ///         unsafe {
    ///             c.launch(scale, LaunchConfig::for_num_elems(1024))
    ///                 .arg(&x).value(1024u32).value(k as f32 + 0.5)
    ///                 .launch()?
    ///         };
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn value<T: DeviceRepr>(&mut self, v: T) -> &mut Self {
        if self.error.is_none() {
            self.error = self
                .func
                .check_arg_size(self.args.len(), std::mem::size_of::<T>(), || {
                    std::any::type_name::<T>().to_owned()
                })
                .err();
        }
        let boxed = Box::new(v);
        // The heap copy does not move when the box does: the pointer stays valid while
        // `self.values` holds it.
        self.args.push(&*boxed as *const T as *mut c_void);
        self.values.push(boxed);
        self
    }

    /// Captures the kernel launch (it runs at each launch of the graph). The same checks
    /// as [`LaunchBuilder::launch`](crate::LaunchBuilder::launch), before the driver is
    /// called. May be called again (another node).
    ///
    /// # Safety
    ///
    /// The contract of [`LaunchBuilder::launch`](crate::LaunchBuilder::launch), for every
    /// launch of the graph: argument types match the kernel, the kernel stays inside the
    /// buffers passed, and any other memory it reaches (raw addresses, page-locked host
    /// buffers) stays alive and unused by the host and other streams while any launch of
    /// the graph may run. A [`ManagedSlice`](crate::ManagedSlice) the kernel writes must
    /// not be read through [`as_slice`](crate::ManagedSlice::as_slice) while a launch may
    /// run (the graph borrows it shared).
    pub unsafe fn launch(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        self.func.check_launch(&self.cfg, self.args.len())?;
        for &t in &self.buffers {
            self.capture.record(t, Access::Write);
        }
        // The module's unload waits for the graph's launches.
        self.capture
            .record(self.func.module_launches(), Access::Read);
        self.capture.session.borrow_mut().uses.last_kernel = Some(self.func.interned());
        let LaunchConfig {
            grid_dim: g,
            block_dim: b,
            shared_mem_bytes,
        } = self.cfg;
        // SAFETY: the function belongs to the bound (current) context and the stream is
        // capturing: the driver records a kernel node, copying the parameter bytes, which
        // point at values borrowed for 'buf. The kernel's memory safety at each launch of
        // the graph is the caller's contract.
        unsafe {
            sys::cuLaunchKernel(
                self.func.raw(),
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                shared_mem_bytes,
                self.capture.stream.0,
                self.args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .check_on(self.capture.device, "cuLaunchKernel")
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
        crate::faults::release(
            format_args!("a Graph"),
            &self.device,
            Ok(()),
            "cuGraphDestroy",
            // SAFETY: created by cuStreamEndCapture, destroyed once, here; executable
            // graphs instantiated from it are independent of it.
            || unsafe { sys::cuGraphDestroy(raw) },
        );
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
    pub fn launch(&self, stream: &BoundStream<'_>) -> Result<()> {
        stream.bound().expect_device("graph", &self.device)?;
        stream.ensure_stream_context()?;
        // The graph's buffers and modules, and this executable graph's own launches (so
        // its drop waits for them), claimed from before the enqueue until after it.
        let n = self.uses.trackers.len() + 1;
        let all = self
            .uses
            .trackers
            .iter()
            .map(|&(t, a)| Some((t, a)))
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
    /// [`Error::GraphUpdate`] when the driver refuses (the executable graph is unchanged),
    /// [`Error::WrongDevice`] for a graph of another device.
    pub fn update(&mut self, graph: &Graph<'buf>) -> Result<()> {
        self.device.expect_same("graph", &graph.device)?;
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
        let raw = self.raw;
        crate::faults::release(
            format_args!("a GraphExec"),
            &self.device,
            waited,
            "cuGraphExecDestroy",
            // SAFETY: instantiated by cuGraphInstantiateWithFlags, destroyed once, here,
            // after its launches finished (waited above).
            || unsafe { sys::cuGraphExecDestroy(raw) },
        );
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
