//! Streams and events (documented on [`Stream`]).

use crate::access::{self, Access, AccessTracker, Claim, Locks, StreamInner, StreamSlot, Use};
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr, MemsetValue, Tracked, expect_len};
use cudarc::driver::sys;
use std::sync::Arc;

mod borrowed;
mod event;

pub use borrowed::BorrowedStream;
pub use event::{Event, EventFlags};

/// A CUDA stream of one device (non-blocking: it does not synchronise with the legacy
/// default stream).
///
/// Dropping it is always fine: buffers that still have work pending on it keep the
/// underlying CUDA stream alive until they no longer need to order anything after it.
///
/// A [`Stream`] and an [`Event`] are resources like slices: they hold an `Arc<Device>`,
/// are `Send + Sync`, outlive the binding that created them, and are destroyed in their
/// own context on drop. Work is enqueued through a [`BoundStream`], which borrows a
/// [`BoundDevice`] of the stream's device, so enqueueing is only possible while that
/// context is current:
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let stream = gpu.new_stream()?;
/// let (start, end) = (gpu.new_event(true)?, gpu.new_event(true)?);
/// let s = gpu.on(&stream)?;                 // borrows `gpu`
/// let mut buf = gpu.alloc_zeros::<u8>(1 << 20)?;
/// s.record(&start)?;
/// s.memset_zeros_async(&mut buf)?;
/// s.record(&end)?;
/// s.synchronize()?;
/// println!("memset took {} ms", start.elapsed_ms(&end)?);
/// # Ok(()) }
/// ```
///
/// A `BoundStream` cannot outlive the binding it borrows:
///
/// ```compile_fail,E0597
/// # use gpubind::{Device, ThreadContext};
/// # let dev = Device::get(0).unwrap();
/// let mut ctx = ThreadContext::acquire().unwrap();
/// let stream = ctx.bind(&dev).unwrap().new_stream().unwrap();
/// let s = {
///     let gpu = ctx.bind(&dev).unwrap();
///     gpu.on(&stream).unwrap() // error[E0597]: `gpu` does not live long enough
/// };
/// ```
///
/// Keep the `Stream` (it outlives binds) and call `gpu.on(&stream)` again under the next
/// binding.
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl Stream {
    /// The stream's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.inner.device
    }

    /// The stream's priority (`cuStreamGetPriority`): 0 for [`BoundDevice::new_stream`],
    /// the value given to [`BoundDevice::new_stream_with_priority`]. Needs no binding.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// # let mut ctx = gpubind::ThreadContext::acquire()?;
    /// # let gpu = ctx.bind(&gpubind::Device::get(0)?)?;
    /// assert_eq!(gpu.new_stream()?.priority()?, 0);
    /// # Ok(()) }
    /// ```
    pub fn priority(&self) -> Result<i32> {
        let device = &self.inner.device;
        let _guard = device.enter()?;
        // SAFETY: a live stream of `device`, whose context is current for the call.
        device.check(unsafe { result::stream::priority(self.inner.raw) })
    }

    /// The raw handle, for cudarc or driver calls.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; enqueue on it only while its device is bound on the
    /// calling thread; do not destroy it.
    pub unsafe fn raw(&self) -> sys::CUstream {
        self.inner.raw
    }

    #[cfg(feature = "collective")]
    pub(crate) fn to_ref(&self) -> access::StreamRef {
        access::StreamRef::Owned(Arc::clone(&self.inner))
    }

    /// A `Stream` around `inner` (a stream shared with cudarc: [`crate::interop`]).
    pub(crate) fn from_inner(inner: StreamInner) -> Stream {
        Stream {
            inner: Arc::new(inner),
        }
    }

    /// The stream behind this one.
    pub(crate) fn inner(&self) -> &Arc<StreamInner> {
        &self.inner
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.device.ordinal())
            .field("id", &self.inner.id)
            .finish()
    }
}

/// Enqueues work on one stream while its device is bound.
///
/// Borrowed from a [`BoundDevice`] by [`BoundDevice::on`] or
/// [`BoundDevice::default_stream`]; cannot outlive it.
pub struct BoundStream<'b> {
    bound: &'b BoundDevice<'b>,
    slot: StreamSlot<'b>,
}

impl std::fmt::Debug for BoundStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("BoundStream");
        d.field("device", &self.bound.device().ordinal());
        match self.slot {
            StreamSlot::Legacy(_) => d.field("stream", &"legacy default"),
            StreamSlot::Owned(s) => d.field("stream", &s.id),
        };
        d.finish()
    }
}

/// The stream priorities a device supports, from
/// [`BoundDevice::stream_priority_range`]. Lower numbers are higher priorities: `greatest`
/// is numerically the smallest (e.g. -5 on recent GPUs) and `least` the largest (0, the
/// priority of [`BoundDevice::new_stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamPriorityRange {
    /// The lowest priority, numerically the largest (the default, 0).
    pub least: i32,
    /// The highest priority, numerically the smallest.
    pub greatest: i32,
}

impl StreamPriorityRange {
    /// Whether `priority` is one the device supports (`greatest..=least`).
    ///
    /// ```
    /// let r = gpubind::StreamPriorityRange { least: 0, greatest: -5 };
    /// assert!(r.contains(-5) && r.contains(0) && !r.contains(1) && !r.contains(-6));
    /// ```
    pub fn contains(self, priority: i32) -> bool {
        (self.greatest..=self.least).contains(&priority)
    }
}

impl<'a> BoundDevice<'a> {
    /// Creates a non-blocking stream on the bound device, of the default (lowest)
    /// priority.
    pub fn new_stream(&self) -> Result<Stream> {
        self.ensure_current()?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: context current; the stream's `StreamInner` destroys it.
        let raw = self
            .device()
            .check(unsafe { result::stream::create(flags) })?;
        Ok(Stream {
            inner: Arc::new(StreamInner::new(Arc::clone(self.device()), raw)),
        })
    }

    /// The stream priorities the bound device supports (`cuCtxGetStreamPriorityRange`).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let range = gpu.stream_priority_range()?;
    /// let urgent = gpu.new_stream_with_priority(range.greatest)?;
    /// assert_eq!(urgent.priority()?, range.greatest);
    /// # Ok(()) }
    /// ```
    pub fn stream_priority_range(&self) -> Result<StreamPriorityRange> {
        self.ensure_current()?;
        // The context is current (just checked).
        let (least, greatest) = self
            .device()
            .check(result::context::stream_priority_range())?;
        Ok(StreamPriorityRange { least, greatest })
    }

    /// Creates a non-blocking stream of `priority` (lower numbers are higher priorities;
    /// see [`stream_priority_range`](Self::stream_priority_range)). Work of a higher
    /// priority stream is scheduled first where both are pending; it does not preempt
    /// running blocks.
    ///
    /// A priority outside the device's range is [`Error::StreamPriority`]
    /// (the driver would clamp it silently).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, Error, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let range = gpu.stream_priority_range()?;
    /// let e = gpu.new_stream_with_priority(range.greatest - 1).unwrap_err();
    /// assert!(matches!(e, Error::StreamPriority { .. }));
    /// # Ok(()) }
    /// ```
    pub fn new_stream_with_priority(&self, priority: i32) -> Result<Stream> {
        let range = self.stream_priority_range()?;
        if !range.contains(priority) {
            return Err(crate::Error::StreamPriority {
                device: self.ordinal(),
                requested: priority,
                greatest: range.greatest,
                least: range.least,
            });
        }
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: context current (checked by stream_priority_range); the stream's
        // `StreamInner` destroys it.
        let raw = self
            .device()
            .check(unsafe { result::stream::create_with_priority(flags, priority) })?;
        Ok(Stream {
            inner: Arc::new(StreamInner::new(Arc::clone(self.device()), raw)),
        })
    }

    /// Creates an event; `timing` enables [`Event::elapsed_ms`] (slightly slower records).
    /// The same as [`new_event_with`](Self::new_event_with)`(EventFlags::new().timing(timing))`.
    pub fn new_event(&self, timing: bool) -> Result<Event> {
        self.new_event_with(EventFlags::new().timing(timing))
    }

    /// Creates an event with `flags` (`cuEventCreate`).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, EventFlags, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// // A marker for ordering only, whose `synchronize` sleeps instead of spinning.
    /// let done = gpu.new_event_with(EventFlags::new().timing(false).blocking_sync(true))?;
    /// gpu.default_stream().record(&done)?;
    /// done.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn new_event_with(&self, flags: EventFlags) -> Result<Event> {
        self.ensure_current()?;
        // SAFETY: context current; `flags.raw()` combines only CU_EVENT_BLOCKING_SYNC,
        // CU_EVENT_DISABLE_TIMING and CU_EVENT_INTERPROCESS (an invalid combination is
        // an error from the driver); the `Event` destroys it.
        let raw = self
            .device()
            .check(unsafe { result::event::create(flags.raw()) })?;
        Ok(Event {
            device: Arc::clone(self.device()),
            raw,
            flags,
        })
    }

    /// The context's legacy default stream (the one the synchronous copies use).
    pub fn default_stream(&self) -> BoundStream<'_> {
        BoundStream {
            bound: self,
            slot: StreamSlot::Legacy(self.device()),
        }
    }

    /// `stream`, ready to take work; [`Error::WrongDevice`] if it belongs to another device.
    pub fn on<'s>(&'s self, stream: &'s Stream) -> Result<BoundStream<'s>> {
        self.expect_device("stream", stream.device())?;
        Ok(BoundStream {
            bound: self,
            slot: StreamSlot::Owned(&stream.inner),
        })
    }

    /// Waits for the legacy default stream.
    pub(crate) fn sync_default_stream(&self) -> Result<()> {
        self.ensure_current()?;
        // SAFETY: context current; the null stream is always valid.
        self.device()
            .check(unsafe { result::stream::synchronize(std::ptr::null_mut()) })
    }
}

/// The claim of a written destination: see [`BoundStream::claim_write`]. Held until the
/// write is enqueued; records it when dropped.
pub(crate) enum WriteClaim<'t, 'b> {
    Exclusive(#[allow(dead_code)] access::ExclusiveClaim<'t, 'b>),
    Shared(#[allow(dead_code)] Claim<'t, 'b, Locks<'t, 1>>),
}

impl<'b> BoundStream<'b> {
    /// The binding this stream borrows.
    pub fn bound(&self) -> &'b BoundDevice<'b> {
        self.bound
    }

    /// Claims the buffers an operation on this stream touches: orders the stream after
    /// their conflicting pending uses and, when the claim drops, records the operation as
    /// their latest use; see `crate::access`. Every stream-ordered operation on gpubind
    /// buffers holds one from before its enqueue until after it.
    pub(crate) fn claim<'t, const N: usize>(
        &self,
        mut uses: [Use<'t>; N],
    ) -> Result<Claim<'t, 'b, Locks<'t, N>>> {
        self.ensure_stream_context()?;
        access::claim(self.slot, &mut uses, access::locks::<N>())
    }

    /// Claims one buffer held exclusively (no lock needed); see [`claim`](Self::claim).
    /// Always inlined into the operation, with [`claim_write`](Self::claim_write): a
    /// call here (returning the claim through memory) costs more than the claim.
    #[inline(always)]
    pub(crate) fn claim_mut<'t>(
        &self,
        tracker: &'t mut AccessTracker,
        access: Access,
    ) -> Result<access::ExclusiveClaim<'t, 'b>> {
        self.ensure_stream_context()?;
        access::claim_exclusive(self.slot, tracker, access)
    }

    /// Claims the destination of a write: exclusively (no lock) where `dst` holds its
    /// tracker alone, through the tracker's lock where it shares it (a module global).
    #[inline(always)]
    pub(crate) fn claim_write<'t, T>(
        &self,
        dst: &'t mut (impl DeviceMemoryMut<T> + ?Sized),
    ) -> Result<WriteClaim<'t, 'b>> {
        if dst.shares_tracker() {
            let dst: &'t _ = dst;
            return Ok(WriteClaim::Shared(
                self.claim([Some((Tracked::tracker(dst), Access::Write))])?,
            ));
        }
        match dst.tracker_mut() {
            Some(tracker) => Ok(WriteClaim::Exclusive(
                self.claim_mut(tracker, Access::Write)?,
            )),
            None => Err(Error::InvalidArgument(
                "memory without a tracker of its own must report shares_tracker".into(),
            )),
        }
    }

    /// The context check a stream-ordered operation needs. None on a gpubind [`Stream`]:
    /// the driver runs work enqueued on a stream in the stream's own context, whatever is
    /// current (asserted on the GPU by `gpu_binding::stream_ops_with_a_foreign_context_current`).
    /// The bound context on the legacy default stream, which is the *current* context's.
    ///
    /// On a stream another library owns (shared with cudarc, borrowed), also
    /// [`Error::NotCapturable`] while its owner captures it (docs/safety.md, "cudarc
    /// interop"): one `cuStreamIsCapturing` per operation on such streams only.
    #[inline(always)]
    pub(crate) fn ensure_stream_context(&self) -> Result<()> {
        match self.slot {
            StreamSlot::Legacy(_) => self.bound.ensure_current(),
            StreamSlot::Owned(s) => {
                self.bound.device().check_poison()?;
                if s.foreign {
                    s.refuse_capture()?;
                }
                Ok(())
            }
        }
    }

    /// The stream, borrowed for a claim with room for more buffers.
    pub(crate) fn slot(&self) -> StreamSlot<'b> {
        self.slot
    }

    /// This stream as a tracker remembers it.
    pub(crate) fn to_ref(&self) -> access::StreamRef {
        self.slot.to_ref()
    }

    /// Blocks until all work enqueued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.ensure_stream_context()?;
        // SAFETY: valid stream of the current context.
        self.bound
            .device()
            .check(unsafe { result::stream::synchronize(self.slot.raw()) })
    }

    /// Records `event` at this point of the stream.
    pub fn record(&self, event: &Event) -> Result<()> {
        self.ensure_stream_context()?;
        self.bound.expect_device("event", event.device())?;
        // SAFETY: event and stream belong to the current context.
        self.bound
            .device()
            .check(unsafe { result::event::record(event.raw, self.slot.raw()) })
    }

    /// Makes later work on this stream wait for `event`. The event may belong to
    /// another device: that is how streams of different GPUs are ordered.
    ///
    /// gpubind orders its own buffers between streams by itself; events are for timing
    /// and for ordering work gpubind does not see (raw handles, other libraries).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.ensure_stream_context()?;
        // SAFETY: valid stream of the current context; CUDA allows events of other contexts.
        self.bound
            .device()
            .check(unsafe { result::stream::wait_event(self.slot.raw(), event.raw) })
    }

    /// Stream-ordered zeroing of `dst`.
    pub fn memset_zeros_async<T: DeviceRepr>(
        &self,
        dst: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.bound.expect_device("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        let (ptr, bytes) = (dst.device_ptr(), dst.num_bytes());
        let _claim = self.claim_write(dst)?;
        // SAFETY: current context; in-bounds range of a live allocation, whose other uses
        // are ordered before this one (tracked above) and whose free waits for it.
        let zeroed = unsafe { result::copy::memset_d8_async(ptr, 0, bytes, self.slot.raw()) };
        self.bound.device().check(zeroed)
    }

    /// Stream-ordered fill: sets every element of `dst` to `value` (1-, 2- and 4-byte
    /// element types: [`MemsetValue`]; `cuMemsetD8Async` /
    /// `D16Async` / `D32Async`). Ordered with the other uses of `dst` like any
    /// stream-ordered write.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let stream = gpu.new_stream()?;
    /// let mut buf = gpu.alloc_zeros::<f32>(1024)?;
    /// gpu.on(&stream)?.memset_async(&mut buf, 1.5)?;
    /// assert!(gpu.dtoh(&buf)?.iter().all(|&x| x == 1.5)); // dtoh waits for the fill
    /// # Ok(()) }
    /// ```
    pub fn memset_async<T: MemsetValue>(
        &self,
        dst: &mut impl DeviceMemoryMut<T>,
        value: T,
    ) -> Result<()> {
        self.bound.expect_device("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        let (ptr, len) = (dst.device_ptr(), dst.len());
        let _claim = self.claim_write(dst)?;
        // SAFETY: stream of the bound device (context checked by the claim); in-bounds
        // range of a live allocation, whose other uses are ordered before this one
        // (tracked above) and whose free waits for it.
        unsafe {
            crate::memory::memset_raw(
                self.bound.device(),
                ptr,
                len,
                value.memset_pattern(),
                Some(self.slot.raw()),
            )
        }
    }

    /// Stream-ordered device-to-device copy; lengths must match. The buffers may belong
    /// to any devices (see [`copy_peer_async`](Self::copy_peer_async)); the binding is
    /// unchanged.
    pub fn dtod_async<T: DeviceRepr>(
        &self,
        src: &impl DeviceMemory<T>,
        dst: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let here = self.bound.device().ordinal();
        if src.device().ordinal() != here || dst.device().ordinal() != here {
            // Between devices: `cuMemcpyPeerAsync`, ordered on both devices.
            return crate::copy::device_to_device(self, false, src, dst, false);
        }
        expect_len("dtod_async", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        crate::memory::refuse_overlap("dtod_async", src, dst)?;
        let dst_ptr = dst.device_ptr();
        let copy = || {
            // SAFETY: current context; live allocations that do not overlap (checked
            // above), whose other uses are ordered around this one (claimed by the
            // caller) and whose frees wait for it.
            let copied = unsafe {
                result::copy::dtod_async(
                    dst_ptr,
                    src.device_ptr(),
                    src.num_bytes(),
                    self.slot.raw(),
                )
            };
            self.bound.device().check(copied)
        };
        if dst.shares_tracker() {
            // A module global's tracker may also be the source's (two views of one
            // module's globals), and two such copies in opposite directions on two threads
            // must not lock the trackers in opposite orders: one claim, sorted and merged.
            let dst: &_ = dst;
            let _claim = self.claim([
                Some((src.tracker(), Access::Read)),
                Some((Tracked::tracker(dst), Access::Write)),
            ])?;
            return copy();
        }
        // `src` and `dst` are different allocations: `dst` holds its tracker alone and is
        // borrowed mutably.
        let _read = self.claim([Some((src.tracker(), Access::Read))])?;
        let _write = self.claim_write(dst)?;
        copy()
    }

    /// Stream-ordered host-to-device copy.
    ///
    /// # Safety
    ///
    /// If `src` is page-locked (pinned or registered) memory the copy is truly
    /// asynchronous: `src` must then stay alive and unmodified until the stream has
    /// passed this point ([`synchronize`](Self::synchronize) or an event). For ordinary
    /// pageable memory the driver stages the data before returning. (`dst` needs no care:
    /// its other uses are ordered around this copy by gpubind.)
    pub unsafe fn htod_async<T: DeviceRepr>(
        &self,
        src: &[T],
        dst: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.bound.expect_device("destination", dst.device())?;
        expect_len("htod_async", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let dst_ptr = dst.device_ptr();
        let _claim = self.claim_write(dst)?;
        // SAFETY: current context; sizes match; `dst` is tracked; the caller keeps `src`
        // alive as documented.
        let copied = unsafe {
            result::copy::htod_async(
                dst_ptr,
                src.as_ptr().cast(),
                std::mem::size_of_val(src),
                self.slot.raw(),
            )
        };
        self.bound.device().check(copied)
    }

    /// Stream-ordered device-to-host copy.
    ///
    /// # Safety
    ///
    /// If `dst` is page-locked memory the copy is truly asynchronous: `dst` must stay
    /// alive and untouched until the stream has passed this point. For pageable memory
    /// the driver completes the copy before returning.
    pub unsafe fn dtoh_async<T: DeviceRepr>(
        &self,
        src: &impl DeviceMemory<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.bound.expect_device("source", src.device())?;
        expect_len("dtoh_async", dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _claim = self.claim([Some((src.tracker(), Access::Read))])?;
        // SAFETY: current context; sizes match; `src` is tracked; the caller keeps `dst`
        // alive as documented.
        let copied = unsafe {
            result::copy::dtoh_async(
                dst.as_mut_ptr().cast(),
                src.device_ptr(),
                src.num_bytes(),
                self.slot.raw(),
            )
        };
        self.bound.device().check(copied)
    }

    /// The raw stream handle (null for the default stream).
    ///
    /// # Safety
    ///
    /// Valid while `self` lives. Work enqueued on it through the handle is not seen by
    /// gpubind's ordering of its buffers: order it yourself (events, synchronize).
    pub unsafe fn raw(&self) -> sys::CUstream {
        self.slot.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::{EventFlags, StreamPriorityRange};

    #[test]
    fn event_flags_map_to_the_driver_bits() {
        assert_eq!(EventFlags::new().raw(), 0); // CU_EVENT_DEFAULT
        assert_eq!(EventFlags::new().timing(false).raw(), 2); // DISABLE_TIMING
        assert_eq!(EventFlags::new().blocking_sync(true).raw(), 1); // BLOCKING_SYNC
        assert_eq!(EventFlags::new().timing(false).blocking_sync(true).raw(), 3);
        let f = EventFlags::default().timing(false);
        assert!(!f.has_timing() && !f.has_blocking_sync());
    }

    #[test]
    fn priority_range_is_inclusive_both_ends() {
        let r = StreamPriorityRange {
            least: 0,
            greatest: -5,
        };
        assert!((-5..=0).all(|p| r.contains(p)));
        assert!(![-6, 1, i32::MIN, i32::MAX].iter().any(|&p| r.contains(p)));
        let single = StreamPriorityRange {
            least: 0,
            greatest: 0,
        };
        assert!(single.contains(0) && !single.contains(-1));
    }
}
