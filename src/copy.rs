//! Copies between every pair of memory kinds, synchronous and stream-ordered (documented on
//! [`CopyScope`]).

use crate::access::{Access, AccessTracker, Claim, Locks, host_claim, locks};
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::result;
use crate::error::Result;
use crate::memory::{ByteSpan, DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut, expect_len};
use crate::module::global::ModuleGlobal;
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

/// What memory a copy endpoint is: decides which driver copy runs and whether the copy can
/// overlap with the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Ordinary pageable host memory (`[T]`, `Vec<T>`, DLPack `kDLCPU`).
    Pageable,
    /// Page-locked host memory from `cuMemHostAlloc` (DLPack `kDLCUDAHost`).
    Pinned,
    /// Existing host memory page-locked by `cuMemHostRegister`.
    Registered,
    /// Device memory from `cuMemAlloc` (DLPack `kDLCUDA`).
    Device,
    /// Managed (unified) memory from `cuMemAllocManaged` (DLPack `kDLCUDAManaged`).
    Managed,
}

impl MemoryKind {
    /// Whether the endpoint is a host address (copied with the host-side driver calls).
    pub fn is_host(self) -> bool {
        matches!(
            self,
            MemoryKind::Pageable | MemoryKind::Pinned | MemoryKind::Registered
        )
    }

    /// Whether the memory is page-locked host memory (copies from/to it are truly async).
    pub fn is_page_locked(self) -> bool {
        matches!(self, MemoryKind::Pinned | MemoryKind::Registered)
    }
}

/// One side of a copy: an address range, its kind, and the device (if any) that must be
/// bound to use it. Produced by [`CopySource::source`] / [`CopyDest::dest`].
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) kind: MemoryKind,
    pub(crate) device: Option<&'a Arc<Device>>,
    /// The allocation's pending GPU uses (`None` for memory gpubind does not own:
    /// pageable host memory, imported DLPack tensors).
    pub(crate) tracker: Option<&'a AccessTracker>,
}

impl<'a> Endpoint<'a> {
    /// An endpoint; `addr` is a host pointer (as an integer) for host kinds.
    pub(crate) fn new(
        addr: u64,
        len: usize,
        kind: MemoryKind,
        device: Option<&'a Arc<Device>>,
    ) -> Self {
        Endpoint {
            addr,
            len,
            kind,
            device,
            tracker: None,
        }
    }

    /// The same endpoint, ordered through `tracker`.
    pub(crate) fn tracked(self, tracker: &'a AccessTracker) -> Self {
        Endpoint {
            tracker: Some(tracker),
            ..self
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory kind.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The device whose context owns this memory, if any (`None` for pageable and portable
    /// page-locked memory).
    pub fn device(&self) -> Option<&'a Arc<Device>> {
        self.device
    }
}

pub(crate) mod seal {
    pub trait Sealed {}
}

/// Memory that can be copied from. Sealed: implemented by every buffer kind of gpubind,
/// by `[T]` and by `Vec<T>`.
pub trait CopySource<T: DeviceRepr>: seal::Sealed {
    /// The readable range. It stays valid and unchanged while `self` is borrowed.
    fn source(&self) -> Endpoint<'_>;
}

/// Memory that can be copied into.
pub trait CopyDest<T: DeviceRepr>: CopySource<T> {
    /// The writable range, or an error if the memory is read-only.
    fn dest(&mut self) -> Result<Endpoint<'_>>;
}

/// Implements the copy traits for a type with `fn endpoint(&self) -> Endpoint<'_>` (and,
/// for `mut`, writable memory).
macro_rules! copy_endpoints {
    ($ty:ident $(<$lt:lifetime>)?, $mutable:tt) => {
        $crate::copy::copy_endpoints!($ty $(<$lt>)?, $mutable, Self::endpoint);
    };
    ($ty:ident $(<$lt:lifetime>)?, $mutable:tt, $endpoint:expr) => {
        impl<$($lt,)? T: $crate::memory::DeviceRepr> $crate::copy::seal::Sealed for $ty<$($lt,)? T> {}
        impl<$($lt,)? T: $crate::memory::DeviceRepr> $crate::copy::CopySource<T> for $ty<$($lt,)? T> {
            fn source(&self) -> $crate::copy::Endpoint<'_> {
                ($endpoint)(self)
            }
        }
        $crate::copy::copy_endpoints!(@mut $mutable $ty $(<$lt>)?, $endpoint);
    };
    (@mut mut $ty:ident $(<$lt:lifetime>)?, $endpoint:expr) => {
        impl<$($lt,)? T: $crate::memory::DeviceRepr> $crate::copy::CopyDest<T> for $ty<$($lt,)? T> {
            fn dest(&mut self) -> $crate::error::Result<$crate::copy::Endpoint<'_>> {
                Ok(($endpoint)(self))
            }
        }
    };
    (@mut const $ty:ident $(<$lt:lifetime>)?, $endpoint:expr) => {};
}
pub(crate) use copy_endpoints;

/// The copy endpoint of plain device memory: tracked, on its device.
pub(crate) fn device_endpoint<T: DeviceRepr>(
    m: &impl crate::memory::DeviceMemory<T>,
) -> Endpoint<'_> {
    Endpoint::new(
        m.device_ptr(),
        m.len(),
        MemoryKind::Device,
        Some(m.device()),
    )
    .tracked(m.tracker())
}

/// Implements the copy traits and [`DeviceOnlyMemory`] for plain device-memory types (all
/// `DeviceMemory`, host-unreachable). Modules owning such types (the IPC slices) invoke it
/// for their own types.
macro_rules! device_only_endpoints {
    ($($ty:ident $(<$lt:lifetime>)?, $mutable:tt;)*) => { $(
        $crate::copy::copy_endpoints!($ty $(<$lt>)?, $mutable, $crate::copy::device_endpoint);
        impl<$($lt,)? T: $crate::memory::DeviceRepr> $crate::copy::DeviceOnlyMemory
            for $ty<$($lt,)? T> {}
        impl<$($lt,)? T: $crate::memory::DeviceRepr> $crate::copy::TrackedMemory
            for $ty<$($lt,)? T> {}
    )* };
}
#[cfg_attr(not(feature = "ipc"), allow(unused_imports))]
pub(crate) use device_only_endpoints;
device_only_endpoints! {
    DeviceSlice, mut;
    DeviceView<'a>, const;
    DeviceViewMut<'a>, mut;
    ModuleGlobal, mut;
}

fn pageable<T>(s: &[T]) -> Endpoint<'_> {
    Endpoint::new(s.as_ptr() as u64, s.len(), MemoryKind::Pageable, None)
}

impl<T: DeviceRepr> seal::Sealed for [T] {}
impl<T: DeviceRepr> CopySource<T> for [T] {
    fn source(&self) -> Endpoint<'_> {
        pageable(self)
    }
}
impl<T: DeviceRepr> CopyDest<T> for [T] {
    fn dest(&mut self) -> Result<Endpoint<'_>> {
        Ok(Endpoint::new(
            self.as_mut_ptr() as u64,
            self.len(),
            MemoryKind::Pageable,
            None,
        ))
    }
}
impl<T: DeviceRepr> seal::Sealed for Vec<T> {}
impl<T: DeviceRepr> CopySource<T> for Vec<T> {
    fn source(&self) -> Endpoint<'_> {
        pageable(self)
    }
}
impl<T: DeviceRepr> CopyDest<T> for Vec<T> {
    fn dest(&mut self) -> Result<Endpoint<'_>> {
        self.as_mut_slice().dest()
    }
}

/// How a copy is ordered against the buffers' other uses.
#[derive(Clone, Copy)]
enum Order {
    /// On a stream: other streams' conflicting uses are waited for on the device, and the
    /// copy is recorded as a use on this stream.
    Stream,
    /// Synchronously: conflicting uses are waited for on the host first, and the copy
    /// has finished (the stream is synchronised) before the claim is released.
    Host,
}

/// The copy's claim on its tracked endpoints, held until the copy is enqueued (stream) or
/// finished (host).
enum Claimed<'t, 's> {
    Stream(#[allow(dead_code)] Claim<'t, 's, Locks<'t, 2>>),
    Host(#[allow(dead_code)] Locks<'t, 2>),
}

/// Claims the copy's two endpoints (untracked ones need nothing).
fn order<'t, 's>(
    bound_stream: &BoundStream<'s>,
    how: Order,
    src: &Endpoint<'t>,
    dst: &Endpoint<'t>,
) -> Result<Claimed<'t, 's>> {
    let uses = [
        src.tracker.map(|t| (t, Access::Read)),
        dst.tracker.map(|t| (t, Access::Write)),
    ];
    Ok(match how {
        Order::Stream => Claimed::Stream(bound_stream.claim(uses)?),
        Order::Host => {
            let mut uses = uses;
            Claimed::Host(host_claim(&mut uses, locks::<2>())?)
        }
    })
}

/// Enqueues one copy of `src` into `dst` on `stream` (host-to-host: synchronises `stream`
/// and copies on the CPU, which keeps stream order).
///
/// # Safety
///
/// `stream` is a stream of the bound (current) context; untracked endpoints (host memory)
/// stay valid (and `dst` unaliased) until `stream` has passed this point.
unsafe fn enqueue<T: DeviceRepr>(
    stream: &BoundStream<'_>,
    how: Order,
    src: Endpoint<'_>,
    dst: Endpoint<'_>,
    force_peer: bool,
) -> Result<()> {
    let bound = stream.bound();
    expect_bound_or_peer(bound, "copy source", &src)?;
    expect_bound_or_peer(bound, "copy destination", &dst)?;
    expect_len("copy", dst.len, src.len)?;
    let bytes = src.len * std::mem::size_of::<T>();
    if bytes == 0 {
        return Ok(());
    }
    // Two endpoints of one allocation (views sharing a tracker: module globals) must not
    // overlap; everything else is kept apart by the borrow of the destination.
    if let (Some(a), Some(b)) = (src.tracker, dst.tracker)
        && ByteSpan::new(a, src.addr, bytes as u64).overlaps(&ByteSpan::new(
            b,
            dst.addr,
            bytes as u64,
        ))
    {
        return Err(crate::error::Error::InvalidArgument(format!(
            "copy: the source ({:#x}) and the destination ({:#x}) overlap ({bytes} bytes \
             each, one allocation)",
            src.addr, dst.addr
        )));
    }
    stream.ensure_stream_context()?;
    let peer = peer_contexts(bound, &src, &dst, force_peer)?;
    let _claimed = order(stream, how, &src, &dst)?;
    // SAFETY: `raw` is the stream's handle, valid while `stream` is borrowed.
    let raw = unsafe { stream.raw() };
    // SAFETY (all arms): the context is current (BoundDevice invariant) and `raw`
    // belongs to it; both ranges hold `bytes` bytes; tracked endpoints are ordered after
    // their other uses (above) and freed only after this one; untracked ones outlive the
    // copy (the caller's contract); host endpoints carry host pointers, the others device
    // addresses; peer copies name the primary contexts of the endpoints' devices, retained
    // by those `Device`s, which the endpoints borrow.
    let enqueued: Result<()> = unsafe {
        match (src.kind.is_host(), dst.kind.is_host()) {
            (true, true) => {
                bound.device().check(result::stream::synchronize(raw))?;
                // `dst` comes from an exclusive borrow, so the ranges do not overlap.
                std::ptr::copy_nonoverlapping(src.addr as *const u8, dst.addr as *mut u8, bytes);
                Ok(())
            }
            (true, false) => {
                result::copy::htod_async(dst.addr, src.addr as *const c_void, bytes, raw)
            }
            (false, true) => {
                result::copy::dtoh_async(dst.addr as *mut c_void, src.addr, bytes, raw)
            }
            (false, false) => match peer {
                Some((dst_ctx, src_ctx)) => {
                    result::copy::peer_async(dst.addr, dst_ctx, src.addr, src_ctx, bytes, raw)
                }
                None => result::copy::dtod_async(dst.addr, src.addr, bytes, raw),
            },
        }
    };
    let enqueued = bound.device().check(enqueued);
    enqueued?;
    if let Order::Host = how {
        // Still claimed: nothing can use the buffers until the copy has landed.
        stream.synchronize()?;
    }
    Ok(())
}

/// Checks that `end` can be copied under `bound`: host memory (page-locked memory of any
/// device: under another context the driver copies it as pageable memory, synchronously)
/// and device memory of any device (copied with `cuMemcpyPeerAsync`) can; managed memory
/// must belong to the bound device.
fn expect_bound_or_peer(
    bound: &BoundDevice<'_>,
    what: &'static str,
    end: &Endpoint<'_>,
) -> Result<()> {
    match (end.kind, end.device) {
        (MemoryKind::Managed, Some(d)) => bound.expect_device(what, d),
        _ => Ok(()),
    }
}

/// The `(destination, source)` contexts for `cuMemcpyPeerAsync` when a device-to-device
/// copy involves a device other than the bound one (or `force` asks for the peer path);
/// `None` for a copy within the bound device.
fn peer_contexts(
    bound: &BoundDevice<'_>,
    src: &Endpoint<'_>,
    dst: &Endpoint<'_>,
    force: bool,
) -> Result<Option<(sys::CUcontext, sys::CUcontext)>> {
    if src.kind.is_host() || dst.kind.is_host() {
        return Ok(None);
    }
    let (Some(s), Some(d)) = (src.device, dst.device) else {
        return Ok(None);
    };
    let here = bound.device().ordinal();
    if !force && s.ordinal() == here && d.ordinal() == here {
        return Ok(None);
    }
    Ok(Some((d.primary_context()?.0.0, s.primary_context()?.0.0)))
}

/// Enqueues a copy between two device allocations of any devices on `stream` (bound to
/// any device): the copy behind [`BoundDevice::dtod`] and [`BoundStream::dtod_async`] when
/// the devices differ, and behind the peer calls.
pub(crate) fn device_to_device<T: DeviceRepr>(
    stream: &BoundStream<'_>,
    synchronous: bool,
    src: &impl crate::memory::DeviceMemory<T>,
    dst: &mut impl crate::memory::DeviceMemoryMut<T>,
    force_peer: bool,
) -> Result<()> {
    let how = if synchronous {
        Order::Host
    } else {
        Order::Stream
    };
    let dst: &_ = dst;
    // SAFETY: the stream belongs to the bound context; both endpoints are tracked device
    // memory, whose other uses are ordered around the copy and whose frees wait for it.
    unsafe {
        enqueue::<T>(
            stream,
            how,
            device_endpoint(src),
            device_endpoint(dst),
            force_peer,
        )
    }
}

impl<'a> BoundDevice<'a> {
    /// Copies `src` into `dst` — any pair of memory kinds — and returns when the copy is
    /// complete. Lengths must match ([`Error::SizeMismatch`](crate::Error::SizeMismatch));
    /// managed memory must belong to the bound device
    /// ([`Error::WrongDevice`](crate::Error::WrongDevice)). Device memory of another
    /// device is copied with `cuMemcpyPeerAsync` (the binding is unchanged); page-locked
    /// memory of another device's context, unless portable, is copied like pageable
    /// memory.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let managed = gpu.alloc_managed::<u32>(4)?;
    /// let mut host = vec![7u32; 4];
    /// gpu.copy(&managed, &mut host)?;
    /// assert_eq!(host, [0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn copy<T, S, D>(&self, src: &S, dst: &mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + ?Sized,
        D: CopyDest<T> + ?Sized,
    {
        let stream = self.default_stream();
        let dst = dst.dest()?;
        // SAFETY: the legacy default stream of the current context; with `Order::Host`
        // the copy has finished when `enqueue` returns, while `src` and `dst` are still
        // borrowed.
        unsafe { enqueue::<T>(&stream, Order::Host, src.source(), dst, false) }
    }
}

impl<'a> BoundDevice<'a> {
    /// Copies device memory `src` into device memory `dst` — of any two devices, or one —
    /// with `cuMemcpyPeerAsync`, and returns when the copy is complete. Ordered after
    /// every pending use of both buffers on every device; the binding is unchanged.
    /// Lengths must match ([`Error::SizeMismatch`](crate::Error::SizeMismatch)).
    pub fn copy_peer<T: DeviceRepr>(
        &self,
        src: &impl crate::memory::DeviceMemory<T>,
        dst: &mut impl crate::memory::DeviceMemoryMut<T>,
    ) -> Result<()> {
        device_to_device(&self.default_stream(), true, src, dst, true)
    }
}

impl<'b> BoundStream<'b> {
    /// Enqueues a copy of `src` into `dst` (any pair of kinds) without waiting.
    ///
    /// # Safety
    ///
    /// The copy may run after this call returns. Host memory on either side (pageable,
    /// pinned, registered, or an imported DLPack tensor) must stay alive, `dst` must not
    /// be read or written by the host and `src` not written by the host, until this
    /// stream has passed this point ([`synchronize`](Self::synchronize), or an event
    /// recorded after it). gpubind's device, pool and managed buffers need no such care:
    /// their other uses are ordered around the copy, and their frees wait for it.
    /// [`copy_scope`](Self::copy_scope) is the safe form of this call, and
    /// [`copy_tracked_async`](Self::copy_tracked_async) the safe form for
    /// [`TrackedMemory`] on both sides, with nothing to wait for.
    pub unsafe fn copy_async<T, S, D>(&self, src: &S, dst: &mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + ?Sized,
        D: CopyDest<T> + ?Sized,
    {
        let dst = dst.dest()?;
        // SAFETY: this stream belongs to the bound context (BoundStream invariant); the
        // buffers' lifetime is the caller's contract.
        unsafe { enqueue::<T>(self, Order::Stream, src.source(), dst, false) }
    }

    /// Enqueues a copy of `src` into `dst` without waiting; safe because both sides are
    /// [`TrackedMemory`]: the copy is recorded as a pending use of each, so it may stay in
    /// flight after this call, across iterations, with no synchronisation by the caller.
    ///
    /// Everything that touches either buffer afterwards is ordered after the copy: work on
    /// other streams waits for it on the device; host reads of a page-locked destination
    /// ([`PinnedHostBuffer`](crate::PinnedHostBuffer)'s `Deref`, `as_slice`) wait for it to
    /// land, host writes of a page-locked source wait until it has been read, and dropping
    /// either buffer waits for it. Copies to and from page-locked memory (also through a
    /// [`PageLockedView`](crate::PageLockedView)) are truly asynchronous DMA.
    ///
    /// Either side may be device memory of any device, whichever device is bound:
    /// device-to-device copies between devices run as `cuMemcpyPeerAsync` on this stream,
    /// after the source's pending writes and the destination's pending uses on every
    /// device. Lengths must match ([`Error::SizeMismatch`](crate::Error::SizeMismatch)).
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>) -> gpubind::Result<()> {
    /// let mut pinned = gpu.alloc_pinned::<f32>(1024, Default::default())?;
    /// let mut d = gpu.alloc_zeros::<f32>(1024)?;
    /// for step in 0..3 {
    ///     pinned.fill(step as f32);               // waits until the last upload has read it
    ///     s.copy_tracked_async(&pinned, &mut d)?; // in flight; nothing waits here
    ///     s.copy_tracked_async(&d, &mut pinned)?;
    /// }
    /// assert_eq!(pinned[0], 2.0);                 // the read waits for the download
    /// # Ok(()) }
    /// ```
    ///
    /// Pageable memory (`[T]`, `Vec<T>`) is not tracked, so it cannot be given here:
    ///
    /// ```compile_fail,E0277
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>) -> gpubind::Result<()> {
    /// let host = vec![0f32; 16];
    /// let mut d = gpu.alloc_zeros::<f32>(16)?;
    /// s.copy_tracked_async(&host, &mut d)?; // error[E0277]: `Vec<f32>: TrackedMemory` is not satisfied
    /// # Ok(()) }
    /// ```
    pub fn copy_tracked_async<T, S, D>(&self, src: &S, dst: &mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + TrackedMemory + ?Sized,
        D: CopyDest<T> + TrackedMemory + ?Sized,
    {
        let dst = dst.dest()?;
        // SAFETY: this stream belongs to the bound context; both endpoints are tracked
        // (`TrackedMemory`): their host accesses and frees wait for the copy recorded by
        // the claim in `enqueue`.
        unsafe { enqueue::<T>(self, Order::Stream, src.source(), dst, false) }
    }

    /// Enqueues a copy between device allocations of any two devices (also one device)
    /// with `cuMemcpyPeerAsync` on this stream, ordered like
    /// [`copy_tracked_async`](Self::copy_tracked_async): after the source's pending writes
    /// and the destination's pending reads and writes, on whichever device they run.
    /// The binding is unchanged. Lengths must match
    /// ([`Error::SizeMismatch`](crate::Error::SizeMismatch)).
    pub fn copy_peer_async<T: DeviceRepr>(
        &self,
        src: &impl crate::memory::DeviceMemory<T>,
        dst: &mut impl crate::memory::DeviceMemoryMut<T>,
    ) -> Result<()> {
        device_to_device(self, false, src, dst, true)
    }

    /// Runs `f`, in which [`CopyScope::copy`] enqueues asynchronous copies on this stream,
    /// then synchronises the stream (also if `f` fails or panics) and returns `f`'s value.
    ///
    /// Buffers given to the scope stay borrowed until it returns, so they can be neither
    /// freed nor touched by the host while a copy may still be running. A scope, not a
    /// guard: `std::mem::forget` of a guard would end the borrow without synchronising.
    pub fn copy_scope<'env, R>(
        &self,
        f: impl for<'s> FnOnce(&'s CopyScope<'s, 'env>) -> Result<R>,
    ) -> Result<R> {
        /// Synchronises on unwind, so a panic in `f` cannot end the borrows early; for at
        /// most `GPUBIND_DROP_TIMEOUT`. The borrowed host memory goes back to its owner
        /// when the unwinding goes on, so a wait that fails while the device may still
        /// copy (it gave up on a stream that is still busy) aborts the process instead.
        struct SyncOnUnwind<'x>(&'x BoundStream<'x>, bool);
        impl Drop for SyncOnUnwind<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    return;
                }
                let limit = crate::teardown::drop_wait::drop_timeout();
                let deadline = std::time::Instant::now().checked_add(limit);
                if let Err(e) = self.0.to_ref().synchronize_within(deadline, limit) {
                    let ordinal = Some(self.0.bound().device().ordinal());
                    if !crate::teardown::faults::nothing_runs_after(&e) {
                        crate::teardown::faults::abort_unreleasable(
                            format_args!("a copy scope, unwinding"),
                            ordinal,
                            &e,
                        );
                    }
                    crate::teardown::faults::report_drop(
                        format_args!("a copy scope, unwinding"),
                        ordinal,
                        "synchronizing its stream",
                        &e,
                        "its borrows end anyway: a poisoned context runs no more copies",
                    );
                }
            }
        }
        let mut guard = SyncOnUnwind(self, true);
        let scope = CopyScope {
            stream: self,
            _env: PhantomData,
        };
        let out = f(&scope);
        guard.1 = false;
        let synced = self.synchronize();
        let out = out?;
        synced?;
        Ok(out)
    }
}

/// Enqueues stream-ordered copies whose buffers stay borrowed until the scope ends; see
/// [`BoundStream::copy_scope`].
///
/// Every buffer kind is a [`CopySource`] (and, when writable, a [`CopyDest`]):
///
/// | kind | type | [`MemoryKind`] |
/// | --- | --- | --- |
/// | pageable host | `[T]`, `Vec<T>` | `Pageable` |
/// | pinned host (`cuMemHostAlloc`) | [`PinnedHostBuffer`](crate::PinnedHostBuffer) | `Pinned` |
/// | registered host (`cuMemHostRegister`) | [`RegisteredHost`](crate::RegisteredHost) | `Registered` |
/// | device (`cuMemAlloc`) | [`DeviceSlice`], views | `Device` |
/// | a module's `__device__` / `__constant__` variable | [`ModuleGlobal`] | `Device` |
/// | managed (`cuMemAllocManaged`) | [`ManagedSlice`](crate::ManagedSlice) | `Managed` |
/// | imported DLPack tensor | `dlpack::ImportedTensor` (feature `dlpack`) | by its device type |
///
/// so one generic pair of calls covers all of them: [`BoundDevice::copy`] (returns when the
/// copy is done) and [`CopyScope::copy`] inside [`BoundStream::copy_scope`]
/// (stream-ordered; truly asynchronous for page-locked host memory).
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, PinnedOptions, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let mut pinned = gpu.alloc_pinned::<f32>(1 << 20, PinnedOptions::default())?;
/// pinned.fill(1.5);
/// let mut dev_buf = gpu.alloc_zeros::<f32>(1 << 20)?;
/// let stream = gpu.new_stream()?;
/// let s = gpu.on(&stream)?;
/// s.copy_scope(|scope| {
///     scope.copy(&pinned, &mut dev_buf)?;      // asynchronous DMA
///     // `pinned` is borrowed until the scope ends: it cannot be written or dropped here
///     Ok(())
/// })?;                                          // the stream is synchronised here
/// assert_eq!(gpu.dtoh(&dev_buf)?[0], 1.5);
/// # Ok(()) }
/// ```
///
/// # Why a scope and not a guard
///
/// A guard returned by an async copy (`PendingCopy<'a>`, synchronising on drop) would not
/// be sound: `std::mem::forget(guard)` ends the borrow without the synchronisation, after
/// which the pinned buffer could be freed or written while the DMA engine still reads it.
/// [`BoundStream::copy_scope`] synchronises in its own frame before it returns (or
/// unwinds), like [`std::thread::scope`], so nothing the caller does can skip it. Writing a
/// buffer while a copy from it is pending does not compile:
///
/// ```compile_fail,E0506
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>) -> gpubind::Result<()> {
/// let mut pinned = gpu.alloc_pinned::<u8>(16, Default::default())?;
/// let mut d = gpu.alloc_zeros::<u8>(16)?;
/// s.copy_scope(|scope| {
///     scope.copy(&pinned, &mut d)?;
///     pinned[0] = 7; // error[E0506]: `pinned[_]` is assigned to here but it was already borrowed
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
///
/// and a buffer that would die inside the scope cannot be handed to it:
///
/// ```compile_fail,E0597
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>) -> gpubind::Result<()> {
/// let mut d = gpu.alloc_zeros::<u8>(16)?;
/// s.copy_scope(|scope| {
///     let short_lived = vec![1u8; 16];
///     scope.copy(&short_lived, &mut d) // error[E0597]: `short_lived` does not live long enough
/// })?;
/// # Ok(()) }
/// ```
///
/// Device memory ([`DeviceSlice`] and views) needs no such long borrow: the host reaches it
/// only through gpubind's calls, which its access tracker orders after the pending copy (a
/// `dtoh` inside the scope waits for it; a copy on another stream waits on the device), and
/// freeing it waits for the copy too (`docs/safety.md`). [`CopyScope::copy_to_device`] and
/// [`CopyScope::copy_from_device`] therefore borrow only the host side until the scope
/// ends, so a whole pipeline — upload, kernel, download — fits in one scope with a single
/// synchronisation:
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>,
/// #      k: &gpubind::Function<'_>) -> gpubind::Result<()> {
/// let input = gpu.pinned_from_slice(&[1.0f32; 1024], Default::default())?;
/// let mut output = gpu.alloc_pinned::<f32>(1024, Default::default())?;
/// let mut d = gpu.alloc_zeros::<f32>(1024)?;
/// let n = 1024u32;
/// s.copy_scope(|scope| {
///     scope.copy_to_device(&input, &mut d)?;
///     // SAFETY: `k` takes (float*, unsigned) and stays in bounds.
///     unsafe {
///         scope.stream().launch(k, gpubind::LaunchConfig::for_num_elems(n))
///             .arg(&mut d).arg(&n).launch()?;
///     }
///     scope.copy_from_device(&d, &mut output)
/// })?;
/// # Ok(()) }
/// ```
///
/// Buffers that are all [`TrackedMemory`] (device memory, pinned buffers and their
/// views) need no scope at all: [`BoundStream::copy_tracked_async`] is safe and leaves the
/// copy in flight. Code that manages the synchronisation itself can use the `unsafe`
/// [`BoundStream::copy_async`].
pub struct CopyScope<'s, 'env> {
    stream: &'s BoundStream<'s>,
    /// Invariant in `'env`, so borrows handed to `copy` cannot be shortened to the scope.
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for CopyScope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyScope")
            .field("stream", self.stream)
            .finish()
    }
}

impl<'s, 'env> CopyScope<'s, 'env> {
    /// Enqueues a copy of `src` into `dst` (any pair of memory kinds; lengths must match).
    /// Both stay borrowed until the scope has synchronised the stream.
    pub fn copy<T, S, D>(&self, src: &'env S, dst: &'env mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + ?Sized,
        D: CopyDest<T> + ?Sized,
    {
        // SAFETY: `src` and `dst` are borrowed for 'env, which outlives the
        // `copy_scope` call; `copy_scope` synchronises the stream before returning or
        // unwinding, so the copy completes while both borrows are held.
        unsafe { self.stream.copy_async(src, dst) }
    }

    /// Enqueues a copy of `src` (any kind) into device memory `dst`. Only `src` stays
    /// borrowed until the scope ends; `dst` is free again after this call, so kernels
    /// and further copies on this stream can use it — stream order runs them after the
    /// copy. (The host cannot reach device memory except through stream-ordered or
    /// synchronising calls, and freeing it waits for pending work.)
    pub fn copy_to_device<T, S, D>(&self, src: &'env S, dst: &mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + ?Sized,
        D: CopyDest<T> + DeviceOnlyMemory + ?Sized,
    {
        // SAFETY: `src` is borrowed for 'env (see `copy`); `dst` is device-only memory,
        // which the host cannot touch directly: its other uses and its free are ordered
        // after this copy by its tracker.
        unsafe { self.stream.copy_async(src, dst) }
    }

    /// Enqueues a copy of device memory `src` into `dst` (any kind). Only `dst` stays
    /// borrowed until the scope ends.
    pub fn copy_from_device<T, S, D>(&self, src: &S, dst: &'env mut D) -> Result<()>
    where
        T: DeviceRepr,
        S: CopySource<T> + DeviceOnlyMemory + ?Sized,
        D: CopyDest<T> + ?Sized,
    {
        // SAFETY: as in `copy_to_device`, with the roles swapped.
        unsafe { self.stream.copy_async(src, dst) }
    }

    /// The stream, to record events or launch kernels between copies.
    pub fn stream(&self) -> &'s BoundStream<'s> {
        self.stream
    }
}

/// Memory only the device reaches: [`DeviceSlice`] and its views, and the IPC pool slices
/// (not managed memory, which the host can read directly). Sealed. Such memory need not
/// stay borrowed until a [`CopyScope`] ends; see [`CopyScope::copy_to_device`].
pub trait DeviceOnlyMemory: seal::Sealed {}

/// Memory whose pending stream-ordered uses gpubind tracks, and which the host reaches
/// only through calls that wait for them: device memory ([`DeviceOnlyMemory`]),
/// [`PinnedHostBuffer`](crate::PinnedHostBuffer), a [`RegisteredHost`](crate::RegisteredHost)
/// that owns its pages (`'static`), and their [`PageLockedView`](crate::PageLockedView)s.
/// Its host reads wait for pending device writes into it, its host writes for pending
/// device reads, and its drop for both; so a copy between two such buffers needs no
/// borrow past its call ([`BoundStream::copy_tracked_async`]). Sealed.
///
/// A registration that borrows shorter-lived memory is not one: forgetting it would end
/// the borrow of the pages without any wait.
pub trait TrackedMemory: seal::Sealed {}

/// Memory the host reaches directly is no destination of the shared-borrow writes
/// (`Issue`, `Capture`, `blas::Enqueue`): the host may read it through a shared borrow
/// while the write runs.
#[cfg(test)]
mod device_only_by_type {
    use super::DeviceOnlyMemory;
    use crate::{
        DeviceSlice, DeviceView, ManagedSlice, ManagedView, ManagedViewMut, PinnedHostBuffer,
        RegisteredHost,
    };
    static_assertions::assert_not_impl_any!(ManagedSlice<f32>: DeviceOnlyMemory);
    static_assertions::assert_not_impl_any!(ManagedView<'static, f32>: DeviceOnlyMemory);
    static_assertions::assert_not_impl_any!(ManagedViewMut<'static, f32>: DeviceOnlyMemory);
    static_assertions::assert_not_impl_any!(PinnedHostBuffer<f32>: DeviceOnlyMemory);
    static_assertions::assert_not_impl_any!(RegisteredHost<'static, f32>: DeviceOnlyMemory);
    static_assertions::assert_impl_all!(DeviceSlice<f32>: DeviceOnlyMemory);
    static_assertions::assert_impl_all!(DeviceView<'static, f32>: DeviceOnlyMemory);
}
