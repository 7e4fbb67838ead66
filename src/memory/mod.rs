//! Device memory: [`DeviceSlice`], its views and the memory traits (documented on [`DeviceSlice`]).

pub mod host;
pub mod managed;
pub mod pool;
mod reinterpret;
mod sync_ops;

use crate::access::AccessTracker;
use crate::device::Device;
use crate::driver::result::{copy, memory};
use crate::error::{Error, Result};
use crate::teardown::{self, Runs, Teardown};
use cudarc::driver::sys;
use std::marker::PhantomData;
use std::ops::{Bound, Range, RangeBounds};
use std::sync::Arc;

/// Plain data that may be copied to and from device memory byte for byte.
///
/// # Safety
///
/// Implementors must have no padding and no invalid bit patterns (any bytes a kernel
/// writes must be a valid value), and must not own resources. `bool` and `char` are
/// deliberately not implemented:
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>) {
/// let flags = gpu.alloc_zeros::<bool>(8); // error[E0277]: `bool: DeviceRepr` is not satisfied
/// # }
/// ```
///
/// Use `u8` for flags.
///
/// Every `DeviceRepr` type is also a [`KernelArg`](crate::KernelArg) passed by value, so
/// one `unsafe impl DeviceRepr for MyParams {}` lets a `#[repr(C)]` struct be both a
/// buffer element and a kernel parameter.
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

/// Calls `$m!(u8, i8, …, bf16)` with every scalar type gpubind moves to and from the
/// device (each is `DeviceRepr`, and so a by-value `KernelArg`).
macro_rules! with_scalar_types {
    ($m:ident) => {
        $m!(
            u8,
            i8,
            u16,
            i16,
            u32,
            i32,
            u64,
            i64,
            usize,
            isize,
            f32,
            f64,
            half::f16,
            half::bf16
        );
    };
}

macro_rules! device_repr {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl DeviceRepr for $t {}
    )* };
}
with_scalar_types!(device_repr);
// SAFETY: arrays of such types have no padding between elements and no invalid values.
unsafe impl<T: DeviceRepr, const N: usize> DeviceRepr for [T; N] {}

/// An element type that [`BoundDevice::memset`](crate::BoundDevice::memset) and
/// [`BoundStream::memset_async`](crate::BoundStream::memset_async) can fill a buffer
/// with: a type 1, 2 or 4 bytes wide (`cuMemsetD8` / `D16` / `D32` write one such value
/// per element). Sealed; implemented for `u8`, `i8`, `u16`, `i16`, `u32`, `i32`, `f32`,
/// `f16` and `bf16`.
///
/// Other widths have no driver memset and do not compile:
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// let mut buf = gpu.alloc_zeros::<u64>(8)?;
/// gpu.memset(&mut buf, 7u64)?; // error[E0277]: `u64: MemsetValue` is not satisfied
/// # Ok(()) }
/// ```
///
/// Fill those with a kernel, or with a copy from the host.
pub trait MemsetValue: DeviceRepr + private::MemsetSealed {}

macro_rules! memset_value {
    ($($t:ty => $variant:ident($conv:expr)),* $(,)?) => { $(
        impl private::MemsetSealed for $t {
            fn memset_pattern(self) -> private::MemsetPattern {
                let conv: fn($t) -> _ = $conv;
                private::MemsetPattern::$variant(conv(self))
            }
        }
        impl MemsetValue for $t {}
    )* };
}
memset_value!(
    u8 => D8(|v| v),
    i8 => D8(|v| v as u8),
    u16 => D16(|v| v),
    i16 => D16(|v| v as u16),
    u32 => D32(|v| v),
    i32 => D32(|v| v as u32),
    f32 => D32(f32::to_bits),
    half::f16 => D16(half::f16::to_bits),
    half::bf16 => D16(half::bf16::to_bits),
);

/// Fills `len` elements at `ptr` with `pattern`: synchronous with respect to the host
/// (ordered on the legacy default stream) when `stream` is `None`, else enqueued on it.
/// A misaligned `ptr` (possible only for memory adopted from raw pointers) is refused
/// before the driver is called.
///
/// # Safety
///
/// `ptr..ptr + len * width` must be device memory of the current context (or of
/// `stream`'s) that nothing else uses until the fill is ordered after (the caller's
/// claim), and `stream`, if given, a valid stream.
pub(crate) unsafe fn memset_raw(
    device: &Device,
    ptr: sys::CUdeviceptr,
    len: usize,
    pattern: private::MemsetPattern,
    stream: Option<sys::CUstream>,
) -> Result<()> {
    use private::MemsetPattern as P;
    let width = pattern.width();
    if !ptr.is_multiple_of(width as u64) {
        return Err(Error::InvalidArgument(format!(
            "memset of {width}-byte values needs a {width}-byte aligned address, got {ptr:#x}"
        )));
    }
    // SAFETY (all arms): the caller guarantees the range and the stream; `len` counts
    // elements of `width` bytes, as each entry point expects.
    let filled = unsafe {
        match (pattern, stream) {
            (P::D8(v), None) => copy::memset_d8(ptr, v, len),
            (P::D16(v), None) => copy::memset_d16(ptr, v, len),
            (P::D32(v), None) => copy::memset_d32(ptr, v, len),
            (P::D8(v), Some(s)) => copy::memset_d8_async(ptr, v, len, s),
            (P::D16(v), Some(s)) => copy::memset_d16_async(ptr, v, len, s),
            (P::D32(v), Some(s)) => copy::memset_d32_async(ptr, v, len, s),
        }
    };
    device.check(filled)
}

/// Anything that names a typed range of device memory: [`DeviceSlice`], [`DeviceView`],
/// [`DeviceViewMut`]. Sealed.
pub trait DeviceMemory<T>: private::Sealed {
    /// The device the memory lives on.
    fn device(&self) -> &Arc<Device>;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The raw device address (0 for an empty slice).
    fn device_ptr(&self) -> sys::CUdeviceptr;
    /// Size in bytes.
    fn num_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
}

/// Device memory that may be written: [`DeviceSlice`], [`DeviceViewMut`], and the
/// other writable kinds (managed, pool and imported slices, module globals).
pub trait DeviceMemoryMut<T>: DeviceMemory<T> {
    /// The allocation's tracker, held exclusively: a claim through it needs no lock.
    /// `None` for memory whose tracker is shared ([`ModuleGlobal`](crate::ModuleGlobal),
    /// the views of [`DeviceSlice::get_disjoint_mut`]).
    #[doc(hidden)]
    fn tracker_mut(&mut self) -> Option<&mut AccessTracker>;
    /// Whether the tracker is shared (`tracker_mut` is `None`): claims go through its lock.
    #[doc(hidden)]
    fn shares_tracker(&self) -> bool {
        false
    }
}

/// [`Error::InvalidArgument`] when a copy's source and destination overlap. Only memory
/// that shares its tracker can (views of module globals: two views of one variable, a
/// clone; views from one `get_disjoint_mut` never overlap); everything else is kept apart
/// by the borrow of the destination, so this is one compare for it.
pub(crate) fn refuse_overlap<T, S, D>(what: &str, src: &S, dst: &D) -> Result<()>
where
    S: DeviceMemory<T> + ?Sized,
    D: DeviceMemoryMut<T> + ?Sized,
{
    let (s, d) = (ByteSpan::of(src), ByteSpan::of(dst));
    if s.overlaps(&d) {
        return Err(Error::InvalidArgument(format!(
            "{what}: the source ({:#x}, {} bytes) and the destination ({:#x}, {} \
             bytes) overlap (two views of one allocation)",
            s.addr, s.bytes, d.addr, d.bytes
        )));
    }
    Ok(())
}

/// Bytes of one allocation: its tracker (which names the allocation: every view of it
/// shares it), the first address and the length. What every overlap check compares —
/// copies, products, collectives, a capture's fork hazards.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ByteSpan {
    pub(crate) tracker: *const AccessTracker,
    pub(crate) addr: u64,
    pub(crate) bytes: u64,
}

impl ByteSpan {
    pub(crate) fn new(tracker: &AccessTracker, addr: u64, bytes: u64) -> Self {
        ByteSpan {
            tracker,
            addr,
            bytes,
        }
    }

    /// The bytes of `m`.
    pub(crate) fn of<T, M: DeviceMemory<T> + ?Sized>(m: &M) -> Self {
        ByteSpan::new(m.tracker(), m.device_ptr(), m.num_bytes() as u64)
    }

    /// Whether the two share a byte of one allocation (an empty span shares none; one
    /// compare when the allocations differ).
    #[inline]
    pub(crate) fn overlaps(&self, other: &ByteSpan) -> bool {
        std::ptr::eq(self.tracker, other.tracker)
            && self.addr < other.addr.saturating_add(other.bytes)
            && other.addr < self.addr.saturating_add(self.bytes)
    }
}

pub(crate) use private::Sealed as Tracked;

pub(crate) mod private {
    /// Seals the memory traits and gives gpubind the allocation's access tracker.
    pub trait Sealed {
        /// The pending stream-ordered uses of the allocation this memory belongs to.
        fn tracker(&self) -> &crate::access::AccessTracker;
    }

    /// Seals [`MemsetValue`](super::MemsetValue): the driver memset a value needs.
    pub trait MemsetSealed {
        /// The value as the driver's memset of its width takes it.
        fn memset_pattern(self) -> MemsetPattern;
    }

    /// One value of 1, 2 or 4 bytes, for `cuMemsetD8` / `D16` / `D32`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum MemsetPattern {
        /// `cuMemsetD8*`.
        D8(u8),
        /// `cuMemsetD16*`.
        D16(u16),
        /// `cuMemsetD32*`.
        D32(u32),
    }

    impl MemsetPattern {
        /// Bytes per element.
        pub fn width(self) -> usize {
            match self {
                MemsetPattern::D8(_) => 1,
                MemsetPattern::D16(_) => 2,
                MemsetPattern::D32(_) => 4,
            }
        }
    }
}

/// `len` elements of `T` in one device's memory.
///
/// Stream-ordered work on it is ordered by gpubind: a use on another stream waits for
/// the conflicting pending uses, the synchronous calls wait on the host, and the drop
/// waits on the host (`cuMemAlloc` memory, from
/// [`BoundDevice::alloc_zeros`](crate::BoundDevice::alloc_zeros) and friends) or frees in
/// stream order after every pending use (pool memory, from
/// [`BoundStream::alloc`](crate::BoundStream::alloc)); see `docs/safety.md`, "Drops". So
/// safe code cannot race the GPU on it.
///
/// A `DeviceSlice<T>` owns `len` elements of device memory and an `Arc<Device>`. It needs
/// no binding to move, share, view or drop; it is `Send + Sync`. Dropping it frees the
/// memory in its own device's context and leaves the thread's current context as it was,
/// even when another device is bound at the time; memory from
/// [`BoundStream::alloc`](crate::BoundStream::alloc) goes back to the device's pool in
/// stream order, without a host wait.
///
/// Reading or writing its contents needs a [`BoundDevice`](crate::BoundDevice) of the
/// *same* device. That one check happens at run time (an ordinal compare,
/// [`Error::WrongDevice`]): a slice's device is a run-time value (`Device::get(n)`), so the
/// type system cannot tie it to a particular binding without making every slice generic
/// over a device brand, which would forbid storing slices of several devices in one `Vec`.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let mut a = gpu.clone_htod(&[1u32, 2, 3, 4])?;
/// let b = gpu.clone_htod(&[9u32, 9])?;
/// gpu.dtod(&b, &mut a.slice_mut(1..3)?)?;   // views address a range
/// assert_eq!(gpu.dtoh(&a)?, [1, 9, 9, 4]);
/// # Ok(()) }
/// ```
///
/// Device memory is only reachable through a binding; a `Device` alone has no `alloc`:
///
/// ```compile_fail,E0599
/// # let dev = gpubind::Device::get(0).unwrap();
/// let buf = dev.alloc_zeros::<f32>(16); // error[E0599]: no method `alloc_zeros` on `Arc<Device>`
/// ```
///
/// Bind first: `ctx.bind(&dev)?.alloc_zeros::<f32>(16)`.
pub struct DeviceSlice<T: DeviceRepr> {
    device: Arc<Device>,
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
    tracker: AccessTracker,
    /// Allocated from the device's memory pool in stream order ([`pool`]): freed in
    /// stream order (`cuMemFreeAsync`) rather than with `cuMemFree` after a host wait.
    pooled: bool,
    _t: PhantomData<T>,
}

/// A shared view of part of a [`DeviceSlice`].
pub struct DeviceView<'a, T: DeviceRepr> {
    device: &'a Arc<Device>,
    tracker: &'a AccessTracker,
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
    _t: PhantomData<&'a T>,
}

/// A writable view of part of a [`DeviceSlice`]: from
/// [`slice_mut`](DeviceSlice::slice_mut) (one view, holding the slice's tracker alone) or
/// [`get_disjoint_mut`](DeviceSlice::get_disjoint_mut) /
/// [`split_at_mut`](DeviceSlice::split_at_mut) (several views of disjoint ranges, whose
/// stream-ordered uses are ordered through the tracker they share, like those of one
/// module's globals).
pub struct DeviceViewMut<'a, T: DeviceRepr> {
    device: &'a Arc<Device>,
    tracker: ViewTracker<'a>,
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
    _t: PhantomData<&'a mut T>,
}

macro_rules! impl_device_memory {
    ($ty:ident $(<$lt:lifetime>)?, $mutable:tt) => {
        impl<$($lt,)? T: DeviceRepr> private::Sealed for $ty<$($lt,)? T> {
            fn tracker(&self) -> &$crate::access::AccessTracker {
                &self.tracker
            }
        }
        impl<$($lt,)? T: DeviceRepr> DeviceMemory<T> for $ty<$($lt,)? T> {
            fn device(&self) -> &Arc<Device> {
                &self.device
            }
            fn len(&self) -> usize {
                self.len
            }
            fn device_ptr(&self) -> sys::CUdeviceptr {
                self.ptr
            }
        }
        impl_device_memory!(@mut $mutable $ty $(<$lt>)?);
        impl<$($lt,)? T: DeviceRepr> std::fmt::Debug for $ty<$($lt,)? T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("device", &self.device.ordinal())
                    .field("ptr", &format_args!("{:#x}", self.ptr))
                    .field("len", &self.len)
                    .field("type", &std::any::type_name::<T>())
                    .finish()
            }
        }
    };
    (@mut mut $ty:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? T: DeviceRepr> DeviceMemoryMut<T> for $ty<$($lt,)? T> {
            fn tracker_mut(&mut self) -> Option<&mut $crate::access::AccessTracker> {
                Some(&mut self.tracker)
            }
        }
    };
    (@mut const $ty:ident $(<$lt:lifetime>)?) => {};
    (@mut view $ty:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? T: DeviceRepr> DeviceMemoryMut<T> for $ty<$($lt,)? T> {
            fn tracker_mut(&mut self) -> Option<&mut $crate::access::AccessTracker> {
                match &mut self.tracker {
                    ViewTracker::Alone(t) => Some(t),
                    ViewTracker::Shared(_) => None,
                }
            }
            fn shares_tracker(&self) -> bool {
                matches!(self.tracker, ViewTracker::Shared(_))
            }
        }
    };
}
impl_device_memory!(DeviceSlice, mut);
impl_device_memory!(DeviceView<'a>, const);
impl_device_memory!(DeviceViewMut<'a>, view);

/// The tracker a [`DeviceViewMut`] reaches: its slice's, held alone (claims need no lock)
/// or shared with the other views of one [`DeviceSlice::get_disjoint_mut`] (claims go
/// through its lock, as for module globals).
enum ViewTracker<'a> {
    Alone(&'a mut AccessTracker),
    Shared(&'a AccessTracker),
}

impl std::ops::Deref for ViewTracker<'_> {
    type Target = AccessTracker;
    fn deref(&self) -> &AccessTracker {
        match self {
            ViewTracker::Alone(t) => t,
            ViewTracker::Shared(t) => t,
        }
    }
}
pub(crate) use impl_device_memory;

/// [`Error::OutOfBounds`] for a range past `len` (or reversed), [`Error::InvalidArgument`]
/// for two overlapping ranges (an empty range overlaps nothing).
fn check_disjoint(ranges: &[Range<usize>], len: usize) -> Result<()> {
    for (i, r) in ranges.iter().enumerate() {
        resolve(r.clone(), len)?;
        let overlaps = |o: &&Range<usize>| {
            !r.is_empty() && !o.is_empty() && r.start < o.end && o.start < r.end
        };
        if let Some((j, o)) = ranges[..i].iter().enumerate().find(|(_, o)| overlaps(o)) {
            return Err(Error::InvalidArgument(format!(
                "get_disjoint_mut: range {i} ({r:?}) overlaps range {j} ({o:?})"
            )));
        }
    }
    Ok(())
}

/// Resolves `range` against `len` into `(start, count)`.
pub(crate) fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::OutOfBounds { start, end, len });
    }
    Ok((start, end - start))
}

impl<T: DeviceRepr> DeviceSlice<T> {
    /// The device this memory lives on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A shared view of `range`, or [`Error::OutOfBounds`]. Needs no binding.
    ///
    /// The view borrows the slice, so it cannot outlive it:
    ///
    /// ```compile_fail,E0597
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let view = {
    ///     let buf = gpu.alloc_zeros::<f32>(8)?;
    ///     buf.slice(0..4)? // error[E0597]: `buf` does not live long enough
    /// };
    /// # Ok(()) }
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        let (start, len) = resolve(range, self.len)?;
        Ok(DeviceView {
            device: &self.device,
            tracker: &self.tracker,
            ptr: self.offset(start),
            len,
            _t: PhantomData,
        })
    }

    /// A writable view of `range`, or [`Error::OutOfBounds`]. Needs no binding.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (start, len) = resolve(range, self.len)?;
        let ptr = self.offset(start);
        Ok(DeviceViewMut {
            device: &self.device,
            tracker: ViewTracker::Alone(&mut self.tracker),
            ptr,
            len,
            _t: PhantomData,
        })
    }

    /// Writable views of `N` disjoint ranges at once, like [`slice::get_disjoint_mut`]:
    /// [`Error::OutOfBounds`] for a range past the end, [`Error::InvalidArgument`] when two
    /// ranges overlap (empty ranges overlap nothing). Needs no binding.
    ///
    /// Each view is a destination of its own for stream-ordered work — a kernel, a product,
    /// a collective, a copy between two of them. The views share the slice's access
    /// tracker, so ordering is per slice, not per view: a use of one view on another stream
    /// waits for the pending uses of every view (more waiting than the disjoint ranges
    /// need, never less: writes to two views from two streams run one after the other). In
    /// a [capture](crate::BoundDevice::capture) no `&mut` view is needed: shared
    /// [`slice`](Self::slice) views are writable there.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let mut grads = gpu.alloc_zeros::<f32>(10)?;
    /// let [mut weights, mut bias] = grads.get_disjoint_mut([0..8, 8..10])?;
    /// let s = gpu.default_stream();
    /// s.memset_async(&mut weights, 1.0)?;
    /// s.memset_async(&mut bias, 2.0)?;
    /// assert_eq!(gpu.dtoh(&grads)?[7..9], [1.0, 2.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// The views borrow the slice mutably, so nothing else can reach it while they live:
    ///
    /// ```compile_fail,E0502
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let mut grads = gpu.alloc_zeros::<f32>(10)?;
    /// let [mut w, _b] = grads.get_disjoint_mut([0..8, 8..10])?;
    /// let all = gpu.dtoh(&grads)?; // error[E0502]: `grads` is also borrowed as mutable
    /// gpu.default_stream().memset_async(&mut w, 1.0)?;
    /// # Ok(()) }
    /// ```
    pub fn get_disjoint_mut<const N: usize>(
        &mut self,
        ranges: [Range<usize>; N],
    ) -> Result<[DeviceViewMut<'_, T>; N]> {
        check_disjoint(&ranges, self.len)?;
        let tracker: &AccessTracker = &self.tracker;
        Ok(ranges.map(|r| DeviceViewMut {
            device: &self.device,
            tracker: ViewTracker::Shared(tracker),
            ptr: self.offset(r.start),
            len: r.len(),
            _t: PhantomData,
        }))
    }

    /// Two writable views, of `..mid` and `mid..`: [`get_disjoint_mut`](Self::get_disjoint_mut)
    /// with those ranges ([`Error::OutOfBounds`] when `mid` is past the end).
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceViewMut<'_, T>, DeviceViewMut<'_, T>)> {
        let len = self.len;
        let [head, tail] = self.get_disjoint_mut([0..mid, mid..len.max(mid)])?;
        Ok((head, tail))
    }

    fn offset(&self, start: usize) -> sys::CUdeviceptr {
        self.ptr + (start * std::mem::size_of::<T>()) as u64
    }

    /// The raw device address (0 when empty).
    ///
    /// # Safety
    ///
    /// The address is valid while `self` lives; writes through it must stay in bounds
    /// and must not race with gpubind operations on the same slice. gpubind does not see
    /// work done through the address: order it yourself against gpubind's uses (for
    /// example, synchronise the stream you used before handing the slice back to gpubind
    /// calls, and let gpubind calls finish — `synchronize` — before using the address).
    pub unsafe fn raw_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Takes ownership of `len` elements at `ptr`, allocated with `cuMemAlloc` in
    /// `device`'s primary context; the slice frees them on drop.
    ///
    /// # Safety
    ///
    /// `ptr` must be such an allocation of at least `len * size_of::<T>()` bytes, owned by
    /// no one else.
    pub unsafe fn from_raw(device: Arc<Device>, ptr: sys::CUdeviceptr, len: usize) -> Self {
        Self::owning(device, ptr, len, AccessTracker::default(), false)
    }

    /// A slice that owns `len` elements at `ptr` (0 for an empty one), counted in its
    /// device's [`memory_usage`](Device::memory_usage) until it is freed or handed away
    /// ([`uncount`](Self::uncount)). `pooled`: from the device's memory pool.
    pub(crate) fn owning(
        device: Arc<Device>,
        ptr: sys::CUdeviceptr,
        len: usize,
        tracker: AccessTracker,
        pooled: bool,
    ) -> Self {
        if ptr != 0 {
            device.usage().add(slice_bytes::<T>(len));
        }
        DeviceSlice {
            device,
            ptr,
            len,
            tracker,
            pooled,
            _t: PhantomData,
        }
    }

    /// Gives up ownership without freeing: waits for every pending use of the slice
    /// (stream-ordered work gpubind enqueued on it), then returns the raw address and
    /// length.
    ///
    /// Memory from [`BoundStream::alloc`](crate::BoundStream::alloc) is pool memory: free
    /// it with `cuMemFreeAsync`, or with `cuMemFree` once nothing uses it any more (for
    /// pool memory `cuMemFree` does not synchronise).
    ///
    /// # Errors
    ///
    /// A [`GivenBack`](crate::GivenBack) with the slice, still owned and usable, when
    /// the wait fails: [`Error::NotCapturable`] while a pending use is on a stream
    /// another library owns and its owner captures it (try again after the capture),
    /// [`Error::Timeout`] past `GPUBIND_DROP_TIMEOUT`, [`Error::ContextPoisoned`], or a
    /// driver error naming its call. Nothing is forgotten: a later wait waits again.
    pub fn into_raw(
        mut self,
    ) -> std::result::Result<(sys::CUdeviceptr, usize), Box<crate::GivenBack<Self>>> {
        if let Err(error) = self.tracker.wait_all() {
            return Err(crate::GivenBack::boxed(self, error));
        }
        self.uncount();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the Arc and the tracker are read out (and
        // dropped) exactly once.
        let _parts = unsafe { (std::ptr::read(&me.device), std::ptr::read(&me.tracker)) };
        Ok((me.ptr, me.len))
    }

    /// Takes the slice's bytes off its device's [`memory_usage`](Device::memory_usage)
    /// (when its allocation is freed or handed away).
    fn uncount(&self) {
        if self.ptr != 0 {
            self.device.usage().sub(slice_bytes::<T>(self.len));
        }
    }

    /// The tracker, for callers that hold the slice exclusively.
    pub(crate) fn tracker_mut(&mut self) -> &mut AccessTracker {
        &mut self.tracker
    }

    /// Hands the allocation to a caller that frees it in stream order, without waiting:
    /// the caller has ordered the free after every pending use (a `track` of a write on
    /// the freeing stream).
    #[cfg(feature = "ipc")]
    pub(crate) fn into_raw_ordered_on_stream(self) -> (Arc<Device>, sys::CUdeviceptr) {
        self.uncount();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the Arc and the tracker are read out once.
        let (device, _tracker) =
            unsafe { (std::ptr::read(&me.device), std::ptr::read(&me.tracker)) };
        (device, me.ptr)
    }

    /// Waits for the pending uses and hands the allocation to a caller that frees it
    /// itself: `(device, ptr, waited)`. The caller may free `ptr` only when `waited` is
    /// `Ok`: after a failed wait the memory may still be in use by the device and must be
    /// leaked rather than freed under it (the caller reports the failure).
    #[cfg(feature = "ipc")]
    pub(crate) fn disown_for_free(mut self) -> (Arc<Device>, sys::CUdeviceptr, Result<()>) {
        let waited = self.tracker.wait_all();
        self.uncount();
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the Arc and the tracker are read out once.
        let (device, _tracker) =
            unsafe { (std::ptr::read(&me.device), std::ptr::read(&me.tracker)) };
        (device, me.ptr, waited)
    }
}

/// The end of a device allocation's drop (`cuMemAlloc` or `cuMemAllocManaged`
/// memory): frees `ptr` through [`teardown::release`] on the device's release thread
/// (`cuMemFree` may wait for all of the device's work), or leaks it if `waited` (the
/// wait for its pending uses) failed. The release pushes the allocation's own context
/// for the free and pops it after: the thread's current context is unchanged, whichever
/// device is bound. Failures are logged.
///
/// # Safety
///
/// `ptr` is a live allocation of `device`'s context that nothing else frees; after the
/// call it is not used again.
pub(crate) unsafe fn free_device_memory(
    what: std::fmt::Arguments<'_>,
    device: &Arc<Device>,
    waited: Result<()>,
    ptr: sys::CUdeviceptr,
) {
    teardown::release(
        Teardown {
            what,
            device,
            waited,
            call: "cuMemFree_v2",
            runs: Runs::OnReleaseThread,
        },
        // SAFETY: the caller's allocation of this context (current while this runs); no
        // use of it is pending (`release` runs this only after the wait succeeded); freed
        // once, here.
        move || unsafe { memory::free(ptr) },
    );
}

impl<T: DeviceRepr> Drop for DeviceSlice<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if self.pooled {
            self.uncount();
            // SAFETY: allocated from the device's pool in this context, every use recorded
            // in the tracker; freed once, here.
            unsafe {
                teardown::ordered_free::free_in_stream_order(
                    format_args!(
                        "DeviceSlice<{}> of {} elements",
                        std::any::type_name::<T>(),
                        self.len
                    ),
                    &self.device,
                    &mut self.tracker,
                    self.ptr,
                )
            };
            return;
        }
        // Free only after every stream-ordered use has finished. If that cannot be
        // known (a faulted context), leak rather than free memory the device may use.
        let waited = self.tracker.wait_all();
        self.uncount();
        // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once, here.
        unsafe {
            free_device_memory(
                format_args!(
                    "DeviceSlice<{}> of {} elements",
                    std::any::type_name::<T>(),
                    self.len
                ),
                &self.device,
                waited,
                self.ptr,
            )
        };
    }
}

/// Bytes of `len` elements of `T` (the allocation succeeded, so no overflow).
fn slice_bytes<T>(len: usize) -> u64 {
    len.saturating_mul(std::mem::size_of::<T>()) as u64
}

/// [`Error::SizeMismatch`] unless `found == expected`.
pub(crate) fn expect_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::SizeMismatch {
            what,
            expected,
            found,
        })
    }
}

#[cfg(test)]
mod tests;
