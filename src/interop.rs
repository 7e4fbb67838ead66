//! Crossing over to cudarc's safe API (re-exported as [`crate::cudarc`]) and back.
//!
//! gpubind and cudarc's `CudaContext::new` use the same thing: a device's **primary
//! context**. Memory, streams and events of one are valid in the other; what differs is
//! who frees them and how each library orders work on a buffer (gpubind: the buffer's
//! access tracker; cudarc: a read and a write event per `CudaSlice`). The conversions
//! here keep both bookkeepings true.
//!
//! | from | to | how | ownership |
//! | --- | --- | --- | --- |
//! | [`BoundDevice`] | `Arc<CudaContext>` | [`BoundDevice::cudarc_context`] | cudarc retains the primary context itself; both retains are released independently |
//! | `CudaContext` | `Arc<Device>` | [`device_of`] | refuses a non-primary context |
//! | `Arc<CudaStream>` | [`Stream`] | [`BoundDevice::stream_from_cudarc`], [`BoundDevice::new_cudarc_stream`] | cudarc owns the CUDA stream; the `Stream` (and any buffer still ordered after it) keeps an `Arc` to it |
//! | [`Stream`] | `Arc<CudaStream>` | [`Stream::cudarc_stream`] | only for streams cudarc owns (above) |
//! | `CudaSlice<T>` | [`DeviceSlice<T>`] | [`BoundDevice::adopt_cudarc_slice`] | moves: gpubind frees it; pending cudarc work is ordered first; refused: the slice comes back |
//! | a gpubind buffer | `CudaView<T>` / `CudaViewMut<T>` | [`BoundStream::lend_to_cudarc`] / [`BoundStream::lend_mut_to_cudarc`] ([`BoundStream::lend_ref_to_cudarc`]: a view from `&buf`) | lent for a closure; stays gpubind's |
//!
//! # The rules, and why
//!
//! * **A gpubind buffer is only ever *lent* to cudarc, for the length of a closure, on a
//!   stream both libraries know** (one made by [`BoundDevice::new_cudarc_stream`]). The
//!   closure gets a `CudaView`/`CudaViewMut`, which borrows a `CudaSlice` gpubind keeps,
//!   so the closure cannot keep the memory, swap it out, or free it: no second owner
//!   exists at any point. The lend borrows the buffer mutably, so no gpubind operation can
//!   touch it meanwhile (no lock is held while your code runs).
//!   Before the closure: the stream waits for the buffer's pending gpubind uses, and the
//!   lent slice's cudarc write event is recorded there, so cudarc work on *any* stream
//!   (cudarc makes every stream wait for that event) comes after them. After the closure
//!   (also when it panics): the stream waits for cudarc's read and write events of the
//!   slice (the uses cudarc recorded; the read event keeps only the latest reading
//!   stream's, as for cudarc's own slices) and for the legacy default stream,
//!   and the lend is recorded in the buffer's tracker as a read
//!   ([`lend_to_cudarc`](BoundStream::lend_to_cudarc)) or a write
//!   ([`lend_mut_to_cudarc`](BoundStream::lend_mut_to_cudarc)) on that stream: later
//!   gpubind uses, and the free, wait for it. The slice is then given up with
//!   `CudaSlice::leak`, so cudarc never frees gpubind's memory.
//! * **No owning hand-over from gpubind to cudarc.** A `CudaSlice` frees with
//!   `cuMemFreeAsync` where the device has memory pools, and CUDA documents that call only
//!   for stream-ordered allocations, not for `cuMemAlloc` memory. Lend instead, or
//!   allocate with cudarc and [adopt](BoundDevice::adopt_cudarc_slice). (The `unsafe`
//!   road stays open: [`DeviceSlice::into_raw`] and cudarc's `upgrade_device_ptr`.)
//! * **A cudarc slice moves into gpubind whole.** `adopt_cudarc_slice` takes the
//!   `CudaSlice` by value, makes its stream wait for cudarc's events, only then gives up
//!   cudarc's ownership (`leak`), and gives
//!   the [`DeviceSlice`] a pending write on that stream: the allocation itself (cudarc
//!   allocates in stream order) and every use cudarc recorded come before any gpubind use.
//!   A refused adoption gives the slice back untouched ([`GivenBack`]).
//!   gpubind frees it with `cuMemFree`, which CUDA documents for both `cuMemAlloc` and
//!   `cuMemAllocAsync` memory (for the latter with no implicit synchronisation: gpubind
//!   waits for the pending uses first, as for every buffer). Where cudarc did not record
//!   the slice's uses (its context never created a stream, or tracking is off), or the
//!   slice lives on the per-thread stream, the adoption waits for the whole context on
//!   the host instead (`cuCtxSynchronize`).
//! * **A stream stays owned by the library that created it.** cudarc destroys a
//!   `CudaStream` it created when its last `Arc` goes, and gives out `Arc` clones freely,
//!   so a stream gpubind created cannot be handed to cudarc safely (a clone could outlive
//!   the `Stream`). The other way works: gpubind holds an `Arc<CudaStream>` for as long
//!   as it needs the stream. [`Stream::cudarc_stream`] is `None` for gpubind's own streams.
//! * **One context.** Every conversion checks that the cudarc object belongs to this
//!   device's primary context (a non-primary `CudaContext` is refused), since gpubind's
//!   resources live only there.
//!
//! # What gpubind trusts of cudarc
//!
//! Ordering inside a lend is cudarc's: work on the lent view is ordered by cudarc's
//! events exactly as work on a `CudaSlice` that cudarc owns. A lend is refused on a
//! stream whose `CudaContext` object does not order slices with events (it never created
//! a stream, or the `unsafe` `disable_event_tracking` was called). cudarc records a use
//! of the view only on streams of a `CudaContext` object that orders with events;
//! gpubind adds waits for the legacy default stream and this thread's per-thread default
//! stream, where cudarc's other work goes. A use cudarc leaves unrecorded elsewhere — the
//! view sent to another thread and used there on a per-thread stream of a context object
//! without streams, or on a stream of a *non-primary* context (cudarc cannot record the
//! primary context's event there) — is as unordered as it would be on a slice cudarc
//! owns: that is cudarc's contract, which gpubind cannot strengthen. `docs/safety.md`,
//! "cudarc interop", has the full argument.
//!
//! # Example
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let stream = gpu.new_cudarc_stream()?;             // created and owned by cudarc
//! let cs = stream.cudarc_stream().unwrap().clone();   // cudarc's Arc<CudaStream>
//! let s = gpu.on(&stream)?;
//! let mut a = gpu.clone_htod(&[1.0f32, 2.0, 3.0])?;
//! // cudarc reads gpubind memory (into a slice cudarc allocates) ...
//! let copy = s.lend_to_cudarc(&mut a, |a| cs.clone_dtod(&a))?.unwrap();
//! // ... and writes it.
//! s.lend_mut_to_cudarc(&mut a, |mut a| cs.memset_zeros(&mut a))?.unwrap();
//! assert_eq!(gpu.dtoh(&a)?, [0.0; 3]);                // ordered after cudarc's memset
//! // The cudarc slice moves into gpubind, ordered after cudarc's copy.
//! let copy = gpu.adopt_cudarc_slice(copy)?;
//! assert_eq!(gpu.dtoh(&copy)?, [1.0, 2.0, 3.0]);
//! # Ok(()) }
//! ```
//!
//! `examples/cudarc_interop.rs` runs cudarc's `CudaBlas` sgemm on lent gpubind buffers.
//!
//! The lent view cannot leave the closure:
//!
//! ```compile_fail
//! # fn f(s: &gpubind::BoundStream<'_>, buf: &mut gpubind::DeviceSlice<f32>) {
//! let escaped = s.lend_to_cudarc(buf, |view| view); // error: lifetime may not live long enough
//! # }
//! ```

use crate::access::{Access, AccessTracker, StreamInner, StreamRef, StreamSlot};
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, GivenBack, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr, DeviceSlice, Tracked};
use crate::stream::{BoundStream, Stream};
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut, DriverError, sys,
};
use std::sync::{Arc, Mutex, Weak};

/// cudarc's per-thread default stream handle (`CU_STREAM_PER_THREAD`).
const PER_THREAD: sys::CUstream = 0x2 as sys::CUstream;

/// How an adopted cudarc slice's queued uses were ordered before gpubind's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handover {
    /// On the device: the slice's stream follows them; the slice starts with a pending
    /// write there.
    OnStream,
    /// On the host: the whole context was waited for; nothing is pending.
    Synchronized,
}

/// A cudarc error as gpubind's, naming the cudarc call; sticky codes poison `device`.
fn cudarc_error(device: &Device, call: &'static str, e: DriverError) -> Error {
    device.on_error(Error::driver(call, e.0))
}

/// The live `CudaContext` handed out per device ordinal: one cudarc context object per
/// device while any is alive (cudarc keeps its stream count, and so whether it orders a
/// slice's uses with events, per object; and its first stream synchronises the context).
/// Weak, so gpubind never keeps a primary-context retain of its own here.
static CONTEXTS: Mutex<Vec<(usize, Weak<CudaContext>)>> = Mutex::new(Vec::new());

impl BoundDevice<'_> {
    /// cudarc's handle on this device's primary context: the context every gpubind
    /// resource of the device lives in, so cudarc objects made from it work on gpubind
    /// memory and streams through the conversions of this module.
    ///
    /// The same `Arc` is returned while one is alive. It holds its own retain of the
    /// primary context (`cuDevicePrimaryCtxRetain`), released when the last clone
    /// drops; gpubind's retain is unaffected.
    pub fn cudarc_context(&self) -> Result<Arc<CudaContext>> {
        self.ensure_current()?;
        let ordinal = self.ordinal();
        let mut live = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|(_, w)| w.strong_count() > 0);
        let cached = live
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, w)| w.upgrade());
        let ctx = match cached {
            Some(ctx) => ctx,
            None => {
                let ctx = CudaContext::new(ordinal)
                    .map_err(|e| cudarc_error(self.device(), "CudaContext::new", e))?;
                live.push((ordinal, Arc::downgrade(&ctx)));
                ctx
            }
        };
        drop(live);
        self.expect_primary("cudarc context", &ctx)?;
        Ok(ctx)
    }

    /// A new stream created (and owned) by cudarc in this device's primary context,
    /// shared with gpubind: usable with [`on`](Self::on) like any [`Stream`], and as
    /// cudarc's `Arc<CudaStream>` through [`Stream::cudarc_stream`]. The stream to lend
    /// buffers on ([`BoundStream::lend_to_cudarc`]).
    ///
    /// cudarc synchronises the context when its context object creates its first stream.
    pub fn new_cudarc_stream(&self) -> Result<Stream> {
        let ctx = self.cudarc_context()?;
        let stream = ctx
            .new_stream()
            .map_err(|e| cudarc_error(self.device(), "CudaContext::new_stream", e))?;
        self.stream_from_cudarc(stream)
    }

    /// Shares a cudarc stream of this device's primary context with gpubind. cudarc keeps
    /// owning it; the returned [`Stream`] (and every buffer still ordered after work on
    /// it) holds an `Arc` to it.
    ///
    /// [`Error::WrongDevice`] for a stream of another device; [`Error::InvalidArgument`]
    /// for a stream of a non-primary context, and for cudarc's default and per-thread
    /// streams (not streams of their own: use [`default_stream`](Self::default_stream)
    /// for the legacy one).
    pub fn stream_from_cudarc(&self, stream: Arc<CudaStream>) -> Result<Stream> {
        self.expect_primary("cudarc stream", stream.context())?;
        let raw = stream.cu_stream();
        if raw.is_null() || raw == PER_THREAD {
            return Err(Error::InvalidArgument(format!(
                "cudarc's {} stream is not a stream of its own; gpubind shares only streams \
                 cudarc created (CudaContext::new_stream, CudaStream::fork)",
                if raw.is_null() {
                    "default (legacy)"
                } else {
                    "per-thread default"
                }
            )));
        }
        Ok(Stream::from_inner(StreamInner::shared(
            Arc::clone(self.device()),
            stream,
        )))
    }

    /// Takes ownership of a cudarc slice of this device: the memory is gpubind's from now
    /// on (freed by the returned [`DeviceSlice`]), and every use cudarc had queued on it
    /// — its allocation, and the reads and writes cudarc recorded with its events — is
    /// ordered before any gpubind use.
    ///
    /// Everything that can fail is done while cudarc still owns the slice; only then is
    /// it taken from cudarc (`CudaSlice::leak`), and from there nothing fails: an
    /// adoption either returns the memory as gpubind's or leaves the slice untouched.
    ///
    /// # Errors
    ///
    /// [`GivenBack`] with the slice, still cudarc's and usable (or freed
    /// by cudarc as usual when dropped): [`Error::WrongDevice`] for a slice of another
    /// device, [`Error::InvalidArgument`] for one of a non-primary context,
    /// [`Error::ContextPoisoned`] on a poisoned device, and the driver's error when
    /// cudarc's uses of the slice could be ordered neither on the device nor by waiting
    /// for the context (`cuCtxSynchronize`).
    pub fn adopt_cudarc_slice<T: DeviceRepr>(
        &self,
        mut slice: CudaSlice<T>,
    ) -> std::result::Result<DeviceSlice<T>, Box<GivenBack<CudaSlice<T>>>> {
        let ordered = self
            .expect_primary("cudarc slice", slice.context())
            .and_then(|()| self.ensure_current())
            .and_then(|()| self.order_cudarc_uses(&mut slice));
        let handover = match ordered {
            Ok(handover) => handover,
            Err(e) => return Err(GivenBack::boxed(slice, e)),
        };
        let len = slice.len();
        let stream = Arc::clone(slice.stream());
        let ctx = Arc::clone(slice.context());
        let earlier = ctx.check_err();
        // `leak` gives up cudarc's ownership: from here the allocation is ours alone. Its
        // own waits for the slice's events repeat those `order_cudarc_uses` enqueued
        // (nothing can use the slice in between: it is owned here), so their outcome
        // orders nothing more; it is left in cudarc's error channel for cudarc's user.
        let ptr = slice.leak();
        let repeated = ctx.check_err();
        ctx.record_err(earlier);
        ctx.record_err(repeated);
        let tracker = match handover {
            Handover::Synchronized => AccessTracker::default(),
            Handover::OnStream if stream.cu_stream().is_null() => {
                AccessTracker::written_on(StreamRef::Legacy(Arc::clone(self.device())))
            }
            Handover::OnStream => AccessTracker::written_on(StreamRef::Owned(Arc::new(
                StreamInner::shared(Arc::clone(self.device()), stream),
            ))),
        };
        // SAFETY: `ptr` is a cudarc allocation (cuMemAlloc or cuMemAllocAsync) of this
        // device's primary context (checked above) holding `len` elements of `T`; `leak`
        // gave up cudarc's ownership, so no one else frees it; cuMemFree (what the slice
        // calls on drop) is valid for both kinds of allocation, and the slice frees only
        // after waiting for its pending uses, which `tracker` (set below) orders after
        // everything cudarc queued on the memory.
        let mut adopted = unsafe { DeviceSlice::from_raw(Arc::clone(self.device()), ptr, len) };
        *adopted.tracker_mut() = tracker;
        Ok(adopted)
    }

    /// Orders every use cudarc queued on `slice` before what [`Handover`] says, while
    /// cudarc still owns it: on the device, the slice's stream waits for the slice's
    /// read and write events (the uses cudarc recorded) and for the legacy and this
    /// thread's per-thread default streams (where cudarc's untracked work goes; the
    /// legacy stream already waits for the per-thread ones); where cudarc did not record
    /// the uses (its context never created a stream, or tracking is off), the slice lives
    /// on the per-thread stream (a different stream on every thread), or a wait failed,
    /// the whole context is waited for on the host instead (`cuCtxSynchronize`).
    fn order_cudarc_uses<T>(&self, slice: &mut CudaSlice<T>) -> Result<Handover> {
        let stream = Arc::clone(slice.stream());
        let ctx = Arc::clone(slice.context());
        let raw = stream.cu_stream();
        if ctx.is_managing_stream_synchronization() && raw != PER_THREAD {
            // Stale errors of cudarc's own calls are not ours to judge: keep them for
            // cudarc (the newer error wins, as in cudarc).
            let earlier = ctx.check_err();
            // A write access on the slice's own stream: it waits for the slice's read and
            // write events, and records the write event after them.
            drop(DevicePtrMut::device_ptr_mut(slice, &stream));
            let waited = ctx.check_err();
            ctx.record_err(earlier);
            ctx.record_err(waited);
            let on_device = waited.is_ok()
                && (raw.is_null()
                    || (wait_on(self.device(), raw, std::ptr::null_mut()).is_ok()
                        && wait_on(self.device(), raw, PER_THREAD).is_ok()));
            if on_device {
                return Ok(Handover::OnStream);
            }
        }
        self.synchronize()?;
        Ok(Handover::Synchronized)
    }

    /// [`Error::WrongDevice`] unless `ctx` is this device's primary context.
    fn expect_primary(&self, what: &'static str, ctx: &CudaContext) -> Result<()> {
        if ctx.ordinal() != self.ordinal() {
            return Err(Error::WrongDevice {
                what,
                bound: self.ordinal(),
                found: ctx.ordinal(),
            });
        }
        // SAFETY: the handle is only compared, never used.
        let primary = unsafe { self.raw_context() };
        if !ctx.is_primary() || ctx.cu_ctx() != primary {
            return Err(Error::InvalidArgument(format!(
                "a {what} of a non-primary context of device {}: gpubind's resources live in \
                 the primary context (use CudaContext::new or BoundDevice::cudarc_context)",
                self.ordinal()
            )));
        }
        Ok(())
    }
}

/// The device whose primary context `ctx` is, to bind with gpubind; [`Error::InvalidArgument`]
/// for a non-primary context (gpubind works only in primary contexts).
pub fn device_of(ctx: &CudaContext) -> Result<Arc<Device>> {
    if !ctx.is_primary() {
        return Err(Error::InvalidArgument(format!(
            "a non-primary cudarc context of device {}: gpubind binds only primary contexts",
            ctx.ordinal()
        )));
    }
    Device::get(ctx.ordinal())
}

impl Stream {
    /// cudarc's handle on this stream, for a stream cudarc owns
    /// ([`BoundDevice::new_cudarc_stream`], [`BoundDevice::stream_from_cudarc`]); `None`
    /// for a stream gpubind created (cudarc would be free to keep clones of it past the
    /// `Stream`, so gpubind never gives its own streams to cudarc).
    pub fn cudarc_stream(&self) -> Option<&Arc<CudaStream>> {
        self.inner().cudarc.as_ref()
    }
}

impl<'b> BoundStream<'b> {
    /// Lends `buf` to cudarc as a read-only `CudaView` for the length of `f`, on this
    /// stream (one cudarc owns: [`BoundDevice::new_cudarc_stream`]). See the
    /// [module docs](self) for the ordering on both sides; to gpubind the lend is a read
    /// on this stream. Returns what `f` returns.
    ///
    /// [`Error::InvalidArgument`] on a stream cudarc does not own, [`Error::WrongDevice`]
    /// for a buffer of another device.
    pub fn lend_to_cudarc<T: DeviceRepr, R>(
        &self,
        buf: &mut impl DeviceMemoryMut<T>,
        f: impl FnOnce(CudaView<'_, T>) -> R,
    ) -> Result<R> {
        self.lend(buf, Access::Read, |slice| f(slice.as_view()))
    }

    /// Lends `buf` to cudarc as a writable `CudaViewMut` for the length of `f`, on this
    /// stream; to gpubind the lend is a write. Otherwise as
    /// [`lend_to_cudarc`](Self::lend_to_cudarc).
    pub fn lend_mut_to_cudarc<T: DeviceRepr, R>(
        &self,
        buf: &mut impl DeviceMemoryMut<T>,
        f: impl FnOnce(CudaViewMut<'_, T>) -> R,
    ) -> Result<R> {
        self.lend(buf, Access::Write, |slice| f(slice.as_view_mut()))
    }

    /// Lends `buf` to cudarc as a read-only `CudaView` for the length of `f`, like
    /// [`lend_to_cudarc`](Self::lend_to_cudarc), but from a shared borrow: other
    /// readers may hold `buf` meanwhile. The lend is a read of the buffer on this stream,
    /// open until cudarc's work in `f` is ordered before the stream. No lock is held while
    /// `f` runs: `f` may use gpubind, on `buf` too, for reads (a copy from it, a launch
    /// that reads it, `dtoh`). A gpubind **write** of `buf` while the lend is open (from
    /// `f`, or from another thread: a launch writing it through `arg_written`, a write
    /// through another view of the same allocation) is refused with
    /// [`Error::InvalidArgument`], since cudarc's reads on its other streams are ordered
    /// only when `f` returns.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let stream = gpu.new_cudarc_stream()?;
    /// let cs = stream.cudarc_stream().unwrap().clone();
    /// let s = gpu.on(&stream)?;
    /// let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0])?; // not `mut`
    /// let mut b = gpu.alloc_zeros::<f32>(3)?;
    /// let copy = s.lend_ref_to_cudarc(&a, |view| {
    ///     s.copy_tracked_async(&a, &mut b)?; // gpubind reads `a` during the lend
    ///     Ok::<_, gpubind::Error>(cs.clone_dtod(&view)?)
    /// })??;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::InvalidArgument`] on a stream cudarc does not own, [`Error::WrongDevice`]
    /// for a buffer of another device.
    pub fn lend_ref_to_cudarc<T: DeviceRepr, R>(
        &self,
        buf: &impl DeviceMemory<T>,
        f: impl FnOnce(CudaView<'_, T>) -> R,
    ) -> Result<R> {
        let cstream = self.lend_stream()?;
        // Refuses a stream cudarc captures (the lend's events would join that graph), as
        // every claim does.
        self.ensure_stream_context()?;
        self.bound().expect_device("lent buffer", buf.device())?;
        let (ptr, len) = (buf.device_ptr(), buf.len());
        // The read is recorded when it opens, after this stream waited for the pending
        // writes and the lent slice's cudarc write event was recorded (`lend_start`);
        // closed (recorded again, writes let in) as `open` drops, after `lent` settled.
        let (open, lent) =
            crate::access::lend::open_read(self.slot(), Tracked::tracker(buf), || {
                self.lend_start(cstream, ptr, len)
            })?;
        let mut lent = lent; // declared after `open`: settles (on unwind too) before it closes
        let out = f(lent.slice.as_view());
        lent.settle()?;
        drop(open);
        Ok(out)
    }

    fn lend<T: DeviceRepr, R>(
        &self,
        buf: &mut impl DeviceMemoryMut<T>,
        access: Access,
        f: impl FnOnce(&mut CudaSlice<T>) -> R,
    ) -> Result<R> {
        let cstream = self.lend_stream()?;
        self.bound().expect_device("lent buffer", buf.device())?;
        let (ptr, len) = (buf.device_ptr(), buf.len());
        // This stream waits for the buffer's conflicting pending uses; the lend is
        // recorded as the buffer's latest use when `_claim` drops, after `lent` (in
        // `lend_claimed`) has ordered cudarc's work before it.
        let tracker = buf.tracker_mut().ok_or_else(|| {
            Error::InvalidArgument(
                "memory whose tracker is shared (a module global, or a view from \
                 get_disjoint_mut/split_at_mut) cannot be lent to cudarc: the lend holds its \
                 claim while cudarc runs; lend the whole DeviceSlice, or copy into one"
                    .into(),
            )
        })?;
        let _claim = self.claim_mut(tracker, access)?;
        self.lend_claimed(cstream, ptr, len, f)
    }

    /// The cudarc stream a lend goes on: this stream, if cudarc owns it and orders
    /// slices with events.
    fn lend_stream(&self) -> Result<&Arc<CudaStream>> {
        let StreamSlot::Owned(inner) = self.slot() else {
            return Err(not_shared());
        };
        let Some(cstream) = inner.cudarc.as_ref() else {
            return Err(not_shared());
        };
        if !cstream.context().is_managing_stream_synchronization() {
            return Err(Error::InvalidArgument(
                "the cudarc context of this stream does not order slices with events (it has \
                 no stream of its own, or event tracking was disabled), so cudarc's work on a \
                 lent buffer could not be ordered; lend on a stream from \
                 BoundDevice::new_cudarc_stream"
                    .into(),
            ));
        }
        Ok(cstream)
    }

    /// The lend itself, with the buffer (`len` elements of `T` at `ptr`) claimed by the
    /// caller: [`lend_start`](Self::lend_start), runs `f`, then orders this stream after
    /// cudarc's work.
    fn lend_claimed<T: DeviceRepr, R>(
        &self,
        cstream: &Arc<CudaStream>,
        ptr: sys::CUdeviceptr,
        len: usize,
        f: impl FnOnce(&mut CudaSlice<T>) -> R,
    ) -> Result<R> {
        let mut lent = self.lend_start(cstream, ptr, len)?;
        let out = f(&mut lent.slice);
        lent.settle()?;
        Ok(out)
    }

    /// A lend's start, with the buffer claimed: wraps it as a cudarc slice and orders
    /// cudarc's work after this stream's position (the slice's write event, recorded
    /// here). The returned [`Lent`] settles as it drops if [`Lent::settle`] was not
    /// called (an unwinding closure).
    fn lend_start<'s, T: DeviceRepr>(
        &'s self,
        cstream: &'s Arc<CudaStream>,
        ptr: sys::CUdeviceptr,
        len: usize,
    ) -> Result<Lent<'s, T>> {
        let device = self.bound().device();
        let slice = std::panic::catch_unwind(|| {
            // SAFETY: `ptr` holds `len` elements of `T` of this device's primary context
            // (cstream's context, checked when the stream was shared), initialised as a
            // DeviceRepr buffer always is. The CudaSlice never frees it: `Lent` leaks it
            // on every path, and only views of it reach the caller's closure.
            unsafe { cstream.upgrade_device_ptr::<T>(ptr, len) }
        })
        .map_err(|_| {
            Error::InvalidArgument(
                "cudarc could not create the events of a lent slice (cuEventCreate failed)".into(),
            )
        })?;
        let mut lent = Lent {
            slice: std::mem::ManuallyDrop::new(slice),
            stream: cstream,
            device,
            settled: false,
        };
        // Record the slice's write event here, after the waits: cudarc makes every stream
        // that uses the view wait for it, so cudarc work anywhere follows gpubind's.
        // cudarc notes a failed record only in its context's error state: look there (and
        // leave what was there before for cudarc's user).
        let ctx = cstream.context();
        let earlier = ctx.check_err();
        drop(DevicePtrMut::device_ptr_mut(&mut *lent.slice, cstream));
        let recorded = ctx.check_err();
        ctx.record_err(earlier);
        ctx.record_err(recorded);
        // On failure `lent` settles as it drops, and the claim records the (empty) lend.
        recorded.map_err(|e| cudarc_error(device, "CudaEvent::record", e))?;
        Ok(lent)
    }
}

fn not_shared() -> Error {
    Error::InvalidArgument(
        "buffers are lent to cudarc on a stream cudarc owns (BoundDevice::new_cudarc_stream \
         or stream_from_cudarc), not on a gpubind stream or the legacy default stream"
            .into(),
    )
}

/// A gpubind buffer wrapped as a `CudaSlice` for a lend: never dropped as one.
struct Lent<'s, T> {
    slice: std::mem::ManuallyDrop<CudaSlice<T>>,
    stream: &'s Arc<CudaStream>,
    device: &'s Arc<Device>,
    settled: bool,
}

impl<T> Lent<'_, T> {
    /// Orders every cudarc use of the lent memory before the lend stream's position (the
    /// tracker then records the lend there) and gives the slice up without freeing it.
    fn settle(&mut self) -> Result<()> {
        self.settled = true;
        let ctx = Arc::clone(self.stream.context());
        let earlier = ctx.check_err();
        // SAFETY: taken once (`settled` guards the Drop); the slice is not used again.
        let slice = unsafe { std::mem::ManuallyDrop::take(&mut self.slice) };
        // `leak` makes the lend stream wait for the slice's read and write events (every
        // use cudarc recorded, on any stream) and frees nothing.
        let _ = slice.leak();
        let events = ctx.check_err();
        // Leave cudarc's error channel as it was (the newer error wins, as in cudarc).
        ctx.record_err(earlier);
        ctx.record_err(events);
        let raw = self.stream.cu_stream();
        let waited = events
            .map_err(|e| cudarc_error(self.device, "CudaSlice::leak", e))
            .and_then(|()| wait_on(self.device, raw, std::ptr::null_mut()))
            .and_then(|()| wait_on(self.device, raw, PER_THREAD));
        if waited.is_err() {
            // Nothing ordered the lend stream after cudarc's work: wait for all of it.
            let synced = self.device.enter().and_then(|_guard| {
                // The device's context is current (entered).
                self.device.check(result::context::synchronize())
            });
            if let Err(e) = synced {
                // cudarc's work on the lent memory, on streams gpubind does not know, is
                // ordered before nothing: a later gpubind write or the free could overtake
                // it. Poison the device, so that nothing more runs on it through gpubind
                // and every buffer of it is leaked rather than freed.
                let code = e
                    .driver_code()
                    .map_or(sys::CUresult::CUDA_ERROR_UNKNOWN, |c| c.cu());
                return Err(self.device.poison_with("cuCtxSynchronize", code));
            }
        }
        Ok(())
    }
}

impl<T> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        // Only on unwinding out of the closure (or a failure before `settle`).
        if !self.settled
            && let Err(e) = self.settle()
        {
            crate::teardown::faults::report_drop(
                format_args!("a buffer lent to cudarc"),
                Some(self.device.ordinal()),
                crate::teardown::faults::WAIT,
                &e,
                "the device is poisoned: cudarc's work on the buffer could not be ordered",
            );
        }
    }
}

/// Makes `to` wait on the device for the work enqueued on `from` so far (a pooled event).
fn wait_on(device: &Device, to: sys::CUstream, from: sys::CUstream) -> Result<()> {
    let _guard = device.enter()?;
    let event = device.take_event()?;
    // SAFETY: the event and `from` belong to this device's primary context, current here
    // (the null and per-thread handles resolve to its legacy and this thread's per-thread
    // stream).
    let mut r = device.check(unsafe { result::event::record(event.0, from) });
    if r.is_ok() {
        // SAFETY: `to` is a live stream of the current context and the event was just
        // recorded; the wait captures the event's state when enqueued.
        r = device.check(unsafe { result::stream::wait_event(to, event.0) });
    }
    // The wait captured the event's state: it may be recorded again at once.
    device.return_event(event);
    r
}

/// A cudarc driver error as [`Error::Driver`], for code that mixes cudarc's safe API
/// with gpubind's (`?` on a cudarc call in a function returning [`Result`]). cudarc's
/// error carries no call name, so `call` is `"a cudarc driver call"`.
///
/// ```
/// use gpubind::cudarc::driver::{DriverError, sys::CUresult};
/// let e: gpubind::Error = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY).into();
/// assert_eq!(e.driver_code(), Some(gpubind::DriverErrorCode::OUT_OF_MEMORY));
/// ```
impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        Error::driver("a cudarc driver call", e.0)
    }
}
