//! Page-locked host memory: [`PinnedHostBuffer`] and [`RegisteredHost`] (documented on
//! [`PinnedHostBuffer`]).

use crate::access::{Access, AccessTracker};
use crate::context::BoundDevice;
use crate::copy::{Endpoint, MemoryKind, copy_endpoints};
use crate::device::Device;
use crate::driver::result::memory;
use crate::error::{Error, GivenBack, Result};
use crate::memory::DeviceRepr;
use crate::module::KernelArg;
use crate::teardown::{self, Runs, Teardown};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

mod register;
#[cfg(test)]
mod tests;
mod view;
pub use view::{PageLockedView, PageLockedViewMut};

/// Options for [`BoundDevice::alloc_pinned`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedOptions {
    /// `CU_MEMHOSTALLOC_PORTABLE`: page-locked for every context, usable under any binding.
    pub portable: bool,
    /// `CU_MEMHOSTALLOC_WRITECOMBINED`: faster host-to-device transfers, very slow host
    /// reads. For buffers the host only writes.
    pub write_combined: bool,
}

/// Options for [`BoundDevice::register_host`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterOptions {
    /// `CU_MEMHOSTREGISTER_PORTABLE`: page-locked for every context.
    pub portable: bool,
}

/// Host memory the CPU reads and writes directly: [`PinnedHostBuffer`] and
/// [`RegisteredHost`].
pub trait HostMemory<T: DeviceRepr>: crate::copy::CopyDest<T> {
    /// The contents, after the GPU's pending writes into them (as `Deref`).
    ///
    /// # Aborts
    ///
    /// When that wait fails, as `Deref` does (see [`PinnedHostBuffer`], "Host access");
    /// [`try_as_slice`](Self::try_as_slice) returns the error instead.
    fn as_slice(&self) -> &[T];
    /// The contents, writable, after the GPU's pending uses of them (as `DerefMut`).
    ///
    /// # Aborts
    ///
    /// As [`as_slice`](Self::as_slice); [`try_as_mut_slice`](Self::try_as_mut_slice)
    /// returns the error instead.
    fn as_mut_slice(&mut self) -> &mut [T];
    /// The contents, after the GPU's pending writes into them; the way to read when that
    /// wait may fail.
    ///
    /// # Errors
    ///
    /// The wait's error (see [`PinnedHostBuffer::try_as_slice`]).
    fn try_as_slice(&self) -> Result<&[T]>;
    /// The contents, writable, after the GPU's pending uses of them.
    ///
    /// # Errors
    ///
    /// The wait's error (see [`PinnedHostBuffer::try_as_slice`]).
    fn try_as_mut_slice(&mut self) -> Result<&mut [T]>;
    /// The device whose context owns the page-locking.
    fn device(&self) -> &Arc<Device>;
    /// Whether the memory is page-locked for all contexts.
    fn is_portable(&self) -> bool;
}

/// Page-locked memory a CUDA graph may read at every launch
/// ([`Capture::copy_from_host`](crate::Capture::copy_from_host)): a [`PinnedHostBuffer`],
/// or a [`RegisteredHost`] that owns its pages or borrows them for `'static`. Their host
/// writes wait for the GPU's pending uses, which keeps the host off the pages even when
/// the graph's borrow ended early (a forgotten `GraphExec`). A registration that borrows
/// shorter-lived memory is not one: forgetting it would end the borrow of the pages
/// without any wait, and the owner could write or free them under a launch.
///
/// Sealed.
pub trait CaptureSource<T: DeviceRepr>: HostMemory<T> + capture_source::Sealed {}

mod capture_source {
    pub trait Sealed {}
}
impl<T: DeviceRepr> capture_source::Sealed for PinnedHostBuffer<T> {}
impl<T: DeviceRepr> CaptureSource<T> for PinnedHostBuffer<T> {}
impl<T: DeviceRepr> capture_source::Sealed for RegisteredHost<'static, T> {}
impl<T: DeviceRepr> CaptureSource<T> for RegisteredHost<'static, T> {}

/// The part both host kinds share: a page-locked, device-mapped host range.
struct LockedRange<T> {
    device: Arc<Device>,
    ptr: NonNull<T>,
    len: usize,
    /// The mapped device address (`cuMemHostGetDevicePointer`), 0 when empty.
    dptr: sys::CUdeviceptr,
    portable: bool,
    kind: MemoryKind,
    /// Pending stream-ordered uses (copies, kernels reading the mapped address).
    tracker: AccessTracker,
}

// SAFETY: the range is plain `T: Send + Sync` data owned (or exclusively borrowed) by the
// wrapper; the driver handles are thread-agnostic, and frees push their own context.
unsafe impl<T: Send> Send for LockedRange<T> {}
// SAFETY: shared access only hands out `&[T]`.
unsafe impl<T: Sync> Sync for LockedRange<T> {}

impl<T: DeviceRepr> LockedRange<T> {
    fn endpoint(&self) -> Endpoint<'_> {
        let owner = (!self.portable).then_some(&self.device);
        Endpoint::new(self.ptr.as_ptr() as u64, self.len, self.kind, owner).tracked(&self.tracker)
    }

    /// The contents — after the GPU's pending writes into them have landed — or the
    /// error of that wait.
    ///
    /// A stream-ordered copy or kernel may write the pages after the call that enqueued
    /// it has returned ([`BoundStream::copy_tracked_async`](crate::BoundStream::copy_tracked_async)):
    /// the read waits for every pending write recorded in the tracker (and forgets it),
    /// so the host sees the data and never races the DMA. On an error nothing is
    /// forgotten: a later read waits again.
    fn try_as_slice(&self) -> Result<&[T]> {
        self.tracker.host_access(Access::Read)?;
        // SAFETY: no GPU write is pending (waited for above), and none can be enqueued
        // while the shared borrow of `self` lasts (a write needs `&mut` or a kernel's
        // write claim, which the read waited for).
        Ok(unsafe { self.contents() })
    }

    /// [`try_as_slice`](Self::try_as_slice), aborting on an error unless the context is
    /// poisoned ([`abort_unless_poisoned`](Self::abort_unless_poisoned)): for `Deref`,
    /// which cannot return one.
    fn as_slice(&self) -> &[T] {
        if let Err(e) = self.tracker.host_access(Access::Read) {
            self.abort_unless_poisoned("reading", &e);
        }
        // SAFETY: as in `try_as_slice`; or the context is poisoned and runs no more work.
        unsafe { self.contents() }
    }

    /// The contents, with no wait.
    ///
    /// # Safety
    ///
    /// No GPU write into the range may be pending or enqueued while the result lives.
    unsafe fn contents(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialised `T`s (zeroed or caller data) that the
        // wrapper owns or borrows exclusively for its life; no GPU write races the
        // reference (caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Aborts the process after a failed wait for the GPU's pending uses, unless the
    /// context is poisoned (it runs nothing more): handing out the memory would let the
    /// host race the GPU.
    fn abort_unless_poisoned(&self, doing: &str, e: &Error) {
        if self.device.is_poisoned() {
            return;
        }
        let msg = format!(
            "gpubind: {doing} page-locked memory of device {} through Deref: waiting for \
             the GPU's pending uses failed: {e}; the GPU may still use it, so gpubind \
             aborts the process instead of allowing a data race (try_as_slice / \
             try_as_mut_slice return this error instead)",
            self.device.ordinal()
        );
        log::error!("{msg}");
        eprintln!("{msg}");
        std::process::abort();
    }

    /// The contents, writable — after the GPU's pending uses of them have finished — or
    /// the error of that wait.
    ///
    /// The host must not write what a copy or kernel may still read. Safe code cannot
    /// reach such a pending read through a borrow (the borrow of `self` ends only when
    /// the operation that reads is ordered), but it can when that borrow is gone early:
    /// a graph with a captured upload ([`Capture::copy_from_host`](crate::Capture::copy_from_host))
    /// whose `GraphExec` was forgotten (`std::mem::forget`) or whose drop gave up at
    /// `GPUBIND_DROP_TIMEOUT`. So the write waits for every pending use recorded in the
    /// tracker (nothing when none is pending: one compare, no lock).
    fn try_as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.tracker.host_access_mut(Access::Write)?;
        // SAFETY: no GPU use is pending (waited for above); exclusive borrow of `self`.
        Ok(unsafe { self.contents_mut() })
    }

    /// [`try_as_mut_slice`](Self::try_as_mut_slice), aborting like
    /// [`as_slice`](Self::as_slice).
    fn as_mut_slice(&mut self) -> &mut [T] {
        if let Err(e) = self.tracker.host_access_mut(Access::Write) {
            self.abort_unless_poisoned("writing", &e);
        }
        // SAFETY: as in `try_as_mut_slice`; or the context is poisoned and runs no more
        // work.
        unsafe { self.contents_mut() }
    }

    /// The contents, writable, with no wait.
    ///
    /// # Safety
    ///
    /// No GPU use of the range may be pending or enqueued while the result lives.
    unsafe fn contents_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `contents`, with an exclusive borrow of `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The device address the driver mapped `ptr` to.
    fn mapped_address(ptr: NonNull<T>) -> Result<sys::CUdeviceptr> {
        // SAFETY: the caller's context is current and `ptr` is page-locked and mapped in
        // it (DEVICEMAP).
        unsafe { memory::host_get_device_pointer(ptr.as_ptr().cast()) }
    }
}

/// `len` elements of page-locked host memory (`cuMemHostAlloc`), zeroed on allocation.
///
/// Derefs to `[T]`. Mapped into the device's address space (a kernel may access it
/// directly: pass it as a launch argument). Freed with `cuMemFreeHost` in its own
/// context on drop.
///
/// # Page-locked host memory
///
/// A `PinnedHostBuffer` and a [`RegisteredHost`] (`cuMemHostRegister` over memory you
/// already have) both give safe `&[T]` / `&mut [T]` access (they deref to slices, and
/// share the [`HostMemory`] trait), are [`CopySource`](crate::CopySource) /
/// [`CopyDest`](crate::CopyDest) for copies with any other kind (truly asynchronous
/// inside [`BoundStream::copy_scope`](crate::BoundStream::copy_scope)), and are mapped
/// into the device's address space, so a kernel can read and write them directly (pass
/// them as launch arguments).
///
/// Both carry an access tracker, like device memory: a host read (`Deref`, `as_slice`,
/// `try_as_slice`) waits for the GPU's pending writes into the memory, a host write
/// (`DerefMut`, `as_mut_slice`, `try_as_mut_slice`) for every pending use, and the drop
/// too ("Host access" below says what happens when such a wait fails). So a
/// `PinnedHostBuffer` (and a `RegisteredHost<'static, T>`) is
/// [`TrackedMemory`](crate::TrackedMemory): copies with it on a stream are safe without a
/// scope and may stay in flight
/// ([`BoundStream::copy_tracked_async`](crate::BoundStream::copy_tracked_async)), and
/// [`slice`](PinnedHostBuffer::slice) / [`slice_mut`](PinnedHostBuffer::slice_mut) give
/// sub-ranges that stay page-locked ([`PageLockedView`]).
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, PinnedOptions, RegisterOptions, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let pinned = gpu.pinned_from_slice(&[1u32, 2, 3], PinnedOptions::default())?;
/// let mut mine = vec![0u32; 3];
/// {
///     let mut reg = gpu.register_host(&mut mine, RegisterOptions::default())?;
///     gpu.copy(&pinned, &mut reg)?;            // host-to-host through the driver's view
///     assert_eq!(&reg[..], [1, 2, 3]);
/// }                                            // unregistered here; `mine` is free again
/// mine.push(4);
/// # Ok(()) }
/// ```
///
/// The registered memory stays borrowed while registered:
///
/// ```compile_fail,E0499
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// let mut mine = vec![0u8; 64];
/// let reg = gpu.register_host(&mut mine, Default::default())?;
/// mine.push(1); // error[E0499]: `mine` is borrowed by the registration
/// drop(reg);
/// # Ok(()) }
/// ```
///
/// # Host access
///
/// `Deref` / `DerefMut` (and [`HostMemory::as_slice`] / [`HostMemory::as_mut_slice`])
/// wait for the GPU's pending uses and cannot return an error: when that wait fails,
/// they abort the process (logged, and printed to stderr), because handing out the
/// reference would let the host race the GPU's DMA — except on a poisoned context, which
/// runs no more work, where they hand it out. [`try_as_slice`](PinnedHostBuffer::try_as_slice)
/// and [`try_as_mut_slice`](PinnedHostBuffer::try_as_mut_slice) return the error instead:
/// use them where a wait may fail. Above all:
///
/// - A copy or kernel still pending on a stream another library owns (a stream shared
///   with cudarc, or borrowed) is waited for through the event gpubind records there
///   after each of its operations, before any capture of it, so the wait works while
///   the owner captures that stream later. Only if that record failed (the stream is
///   then asked itself) does a wait during the owner's capture fail, with
///   [`Error::NotCapturable`]: querying or synchronising a capturing stream would
///   invalidate the owner's graph, and waiting for the capture to end would hang when
///   the reading thread is the one capturing. `try_as_slice` then fails until the
///   capture ends, and succeeds after.
/// - A driver error of the wait (naming its call).
///
/// ```no_run
/// # fn f(pinned: &gpubind::PinnedHostBuffer<u32>) -> gpubind::Result<()> {
/// match pinned.try_as_slice() {
///     Ok(data) => println!("{}", data[0]),
///     Err(gpubind::Error::NotCapturable { .. }) => { /* read after the capture ends */ }
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
///
/// # Which context owns the memory
///
/// Both kinds keep an `Arc<Device>` of the device they were created under, also when
/// portable: the driver ties the allocation (or registration) to that context and frees
/// it with the context, so the context must outlive it. *Portable* memory is page-locked
/// for every context and may be used under a binding of any device; non-portable memory
/// only under its own device ([`Error::WrongDevice`]).
pub struct PinnedHostBuffer<T: DeviceRepr> {
    range: LockedRange<T>,
}

/// An existing host range page-locked with `cuMemHostRegister` for as long as this value
/// lives; unregistered on drop.
///
/// Borrows the memory mutably for `'a` ([`BoundDevice::register_host`]), or owns a `Vec`
/// (`RegisteredHost<'static, T>`, from [`BoundDevice::register_vec`]). Works on any host
/// memory the driver can lock, including an `mmap(MAP_SHARED)` region shared with
/// other processes. Derefs to `[T]`; mapped for kernels like [`PinnedHostBuffer`].
pub struct RegisteredHost<'a, T: DeviceRepr> {
    range: LockedRange<T>,
    /// `Some(capacity)` when the range is an owned `Vec`'s buffer.
    owned_capacity: Option<usize>,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T: DeviceRepr> PinnedHostBuffer<T> {
    /// The address and length, without waiting for pending uses (for callers that only
    /// pass them on, such as a DLPack export after its own wait).
    #[cfg(feature = "dlpack")]
    pub(crate) fn raw_parts(&self) -> (*mut T, usize) {
        (self.range.ptr.as_ptr(), self.range.len)
    }

    /// The tracker, for callers that hold the buffer exclusively.
    #[cfg(feature = "dlpack")]
    pub(crate) fn tracker_mut(&mut self) -> &mut AccessTracker {
        &mut self.range.tracker
    }

    fn endpoint(&self) -> Endpoint<'_> {
        self.range.endpoint()
    }
    fn kernel_range(&self) -> &LockedRange<T> {
        &self.range
    }
}

impl<T: DeviceRepr> RegisteredHost<'_, T> {
    /// The address and length, without waiting for pending uses (for callers that only
    /// pass them on, such as a DLPack export after its own wait).
    #[cfg(feature = "dlpack")]
    pub(crate) fn raw_parts(&self) -> (*mut T, usize) {
        (self.range.ptr.as_ptr(), self.range.len)
    }

    /// The tracker, for callers that hold the range exclusively.
    #[cfg(feature = "dlpack")]
    pub(crate) fn tracker_mut(&mut self) -> &mut AccessTracker {
        &mut self.range.tracker
    }

    fn endpoint(&self) -> Endpoint<'_> {
        self.range.endpoint()
    }
    fn kernel_range(&self) -> &LockedRange<T> {
        &self.range
    }

    /// Unregisters and gives back the owned `Vec` (`Ok(Some)`), or `Ok(None)` for a
    /// borrowed range (which is then simply unregistered).
    ///
    /// Waits first for the device's pending uses of the range (up to
    /// `GPUBIND_DROP_TIMEOUT`). `Ok(None)` too, for an owned `Vec`, if
    /// `cuMemHostUnregister` (which waits for all of the device's work) outlasts that
    /// limit: the `Vec` is then leaked, with its registration, and the leak logged at
    /// warn level.
    ///
    /// # Errors
    ///
    /// A [`GivenBack`] with the registration, unchanged and still registered, when the
    /// wait fails on a live context: [`Error::Timeout`] (the device may still write the
    /// memory), [`Error::NotCapturable`] (a pending use on a stream another library owns
    /// whose end mark failed, while its owner captures it), or a driver error. Nothing is forgotten: call
    /// `into_vec` again once the work has finished, or drop it (which leaks an owned
    /// `Vec` the device may still use). On a context poisoned by a sticky error, which runs
    /// no more work, the `Vec` is given back instead.
    pub fn into_vec(self) -> std::result::Result<Option<Vec<T>>, Box<GivenBack<Self>>> {
        let mut me = self;
        // A poisoned context runs no more work: the memory goes back (`unregister`).
        if let Err(error) = me.range.tracker.wait_all()
            && !crate::teardown::faults::nothing_runs_after(&error)
        {
            return Err(GivenBack::boxed(me, error));
        }
        let mut me = std::mem::ManuallyDrop::new(me);
        let released = me.unregister();
        // SAFETY: `me` is never dropped, so the Arc and the tracker are read out (and
        // dropped) once.
        drop(unsafe {
            (
                std::ptr::read(&me.range.device),
                std::ptr::read(&me.range.tracker),
            )
        });
        let Some(cap) = me.owned_capacity.filter(|_| released) else {
            return Ok(None);
        };
        // SAFETY: ptr/len/cap are those of the Vec `register_vec` took apart; it is
        // rebuilt exactly once, and only when no device use of it can be pending.
        Ok(Some(unsafe {
            Vec::from_raw_parts(me.range.ptr.as_ptr(), me.range.len, cap)
        }))
    }

    /// Waits for the device's pending uses of the range, then unregisters it; returns
    /// whether an owned `Vec` may be rebuilt and freed (`false`: it is leaked).
    ///
    /// - The wait fails because the context is poisoned (it runs no more work): the
    ///   registration is released as far as the context allows (a poisoned context
    ///   refuses entry, so it is leaked with the context); the memory goes back.
    /// - The wait fails otherwise (above all a wait that gave up after
    ///   `GPUBIND_DROP_TIMEOUT`: the device may still use the memory): an owned `Vec` is
    ///   leaked, still registered, and the context kept alive; borrowed memory cannot be
    ///   leaked — it goes back to its owner when the drop returns — so the process is
    ///   aborted rather than let safe code reach pages the GPU still writes
    ///   ([`crate::teardown::faults::abort_unreleasable`]).
    /// - `cuMemHostUnregister` waits for the whole device, so it runs on the release
    ///   thread ([`crate::teardown::release`]). If it does not end within the limit, the pages
    ///   would go back still registered, and a later copy to memory reusing their
    ///   addresses could reach the old, still-pinned pages instead: an owned `Vec` is
    ///   leaked then, and borrowed memory aborts the process, as above.
    fn unregister(&mut self) -> bool {
        if self.range.len == 0 {
            return true;
        }
        let what = || {
            format!(
                "RegisteredHost<{}> of {} elements",
                std::any::type_name::<T>(),
                self.range.len
            )
        };
        let ordinal = Some(self.range.device.ordinal());
        let borrowed = self.owned_capacity.is_none();
        if let Err(e) = self.range.tracker.wait_all() {
            if !crate::teardown::faults::nothing_runs_after(&e) {
                if borrowed {
                    crate::teardown::faults::abort_unreleasable(
                        format_args!("{}", what()),
                        ordinal,
                        &e,
                    );
                }
                crate::teardown::faults::report_drop(
                    format_args!("{}", what()),
                    ordinal,
                    crate::teardown::faults::WAIT,
                    &e,
                    "its Vec is leaked, still registered, because the device may still use it",
                );
                crate::teardown::faults::keep_context_alive(&self.range.device);
                return false;
            }
            crate::teardown::faults::report_drop(
                format_args!("{}", what()),
                ordinal,
                crate::teardown::faults::WAIT,
                &e,
                "the memory goes back to its owner: the context is poisoned and runs no \
                 more work",
            );
            return true;
        }
        let ptr = self.range.ptr.as_ptr() as usize;
        let released = teardown::release(
            Teardown {
                what: format_args!("{}", what()),
                device: &self.range.device,
                waited: Ok(()), // waited for above
                call: "cuMemHostUnregister",
                runs: Runs::OnReleaseThread,
            },
            // SAFETY: registered in this context (current while this runs) by
            // `register_raw`; unregistered once.
            move || unsafe { memory::host_unregister(ptr as *mut std::ffi::c_void) },
        );
        match released {
            crate::teardown::release::Released::Done => true,
            crate::teardown::release::Released::InBackground if borrowed => {
                crate::teardown::faults::abort_unreleasable(
                    format_args!("{}", what()),
                    ordinal,
                    &Error::Timeout {
                        what: "cuMemHostUnregister, which waits for all of the device's work \
                               (GPUBIND_DROP_TIMEOUT)",
                        after_ms: crate::teardown::drop_wait::drop_timeout()
                            .as_millis()
                            .min(u64::MAX.into()) as u64,
                    },
                )
            }
            // An owned Vec whose registration is still (or may still be) in place stays
            // allocated: leaked rather than handed to the allocator while pinned.
            crate::teardown::release::Released::InBackground
            | crate::teardown::release::Released::Failed => false,
        }
    }
}

impl<T: DeviceRepr> Drop for PinnedHostBuffer<T> {
    fn drop(&mut self) {
        if self.range.len == 0 {
            return;
        }
        // If the wait fails the device may still use the memory: it is leaked rather
        // than freed (and the failure logged).
        let waited = self.range.tracker.wait_all();
        let ptr = self.range.ptr.as_ptr() as usize;
        teardown::release(
            Teardown {
                what: format_args!(
                    "PinnedHostBuffer<{}> of {} elements",
                    std::any::type_name::<T>(),
                    self.range.len
                ),
                device: &self.range.device,
                waited,
                call: "cuMemFreeHost",
                runs: Runs::OnReleaseThread,
            },
            // SAFETY: allocated by cuMemHostAlloc in this context (current while this
            // runs); no use is pending (run only after the wait succeeded); freed once,
            // here.
            move || unsafe { memory::free_host(ptr as *mut std::ffi::c_void) },
        );
    }
}

impl<T: DeviceRepr> Drop for RegisteredHost<'_, T> {
    fn drop(&mut self) {
        let released = self.unregister();
        if let Some(cap) = self.owned_capacity.filter(|_| released) {
            // SAFETY: the Vec taken apart by `register_vec`, rebuilt once after the
            // memory was unregistered.
            drop(unsafe { Vec::from_raw_parts(self.range.ptr.as_ptr(), self.range.len, cap) });
        }
    }
}

/// Deref, HostMemory, Debug, copy endpoints and kernel-argument passing for a host kind.
macro_rules! host_kind {
    ($ty:ident $(<$lt:lifetime>)?) => {
        impl<$($lt,)? T: DeviceRepr> std::ops::Deref for $ty<$($lt,)? T> {
            type Target = [T];
            /// The contents, after the GPU's pending writes into them.
            ///
            /// # Aborts
            ///
            /// When that wait fails and the context is not poisoned (see
            /// [`PinnedHostBuffer`], "Host access"): use
            #[doc = concat!("[`try_as_slice`](", stringify!($ty), "::try_as_slice)")]
            /// where it may.
            fn deref(&self) -> &[T] {
                self.range.as_slice()
            }
        }
        impl<$($lt,)? T: DeviceRepr> std::ops::DerefMut for $ty<$($lt,)? T> {
            /// The contents, writable, after the GPU's pending uses of them.
            ///
            /// # Aborts
            ///
            /// As `Deref`: use
            #[doc = concat!("[`try_as_mut_slice`](", stringify!($ty), "::try_as_mut_slice)")]
            /// where the wait may fail.
            fn deref_mut(&mut self) -> &mut [T] {
                self.range.as_mut_slice()
            }
        }
        impl<$($lt,)? T: DeviceRepr> $ty<$($lt,)? T> {
            /// The contents, after the GPU's pending writes into them have landed: the
            /// way to read when that wait may fail (`Deref` aborts then).
            ///
            /// # Errors
            ///
            /// The wait's error, and the memory stays as it was (a later read waits
            /// again): [`Error::NotCapturable`] while the pending write is on a stream
            /// another library owns (shared with cudarc, or borrowed) whose end mark
            /// could not be recorded, and its owner captures it — waiting would
            /// invalidate the owner's capture; read after the capture ends —,
            /// [`Error::ContextPoisoned`] on a poisoned device, or
            /// a driver error naming its call.
            pub fn try_as_slice(&self) -> Result<&[T]> {
                self.range.try_as_slice()
            }

            /// The contents, writable, after the GPU's pending uses (reads too) have
            /// finished: the way to write when that wait may fail (`DerefMut` aborts
            /// then).
            ///
            /// # Errors
            ///
            /// As [`try_as_slice`](Self::try_as_slice).
            pub fn try_as_mut_slice(&mut self) -> Result<&mut [T]> {
                self.range.try_as_mut_slice()
            }
        }
        impl<$($lt,)? T: DeviceRepr> HostMemory<T> for $ty<$($lt,)? T> {
            fn as_slice(&self) -> &[T] {
                self.range.as_slice()
            }
            fn as_mut_slice(&mut self) -> &mut [T] {
                self.range.as_mut_slice()
            }
            fn try_as_slice(&self) -> Result<&[T]> {
                self.range.try_as_slice()
            }
            fn try_as_mut_slice(&mut self) -> Result<&mut [T]> {
                self.range.try_as_mut_slice()
            }
            fn device(&self) -> &Arc<Device> {
                &self.range.device
            }
            fn is_portable(&self) -> bool {
                self.range.portable
            }
        }
        impl<$($lt,)? T: DeviceRepr> std::fmt::Debug for $ty<$($lt,)? T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("device", &self.range.device.ordinal())
                    .field("ptr", &self.range.ptr)
                    .field("len", &self.range.len)
                    .field("portable", &self.range.portable)
                    .field("type", &std::any::type_name::<T>())
                    .finish()
            }
        }
        copy_endpoints!($ty $(<$lt>)?, mut);
        // SAFETY: passes the mapped device address, a field that lives as long as the
        // borrow; the memory is mapped (DEVICEMAP) in the owning context.
        unsafe impl<$($lt,)? T: DeviceRepr> KernelArg for $ty<$($lt,)? T> {
            fn param_ptr(&self) -> *mut c_void {
                &self.kernel_range().dptr as *const sys::CUdeviceptr as *mut c_void
            }
            fn param_size(&self) -> usize {
                std::mem::size_of::<sys::CUdeviceptr>()
            }
            fn arg_device(&self) -> Option<&Device> {
                let r = self.kernel_range();
                (!r.portable).then_some(&*r.device)
            }
            fn describe(&self) -> String {
                format!("{}<{}>", stringify!($ty), std::any::type_name::<T>())
            }
            fn access_tracker(&self) -> Option<&AccessTracker> {
                Some(&self.kernel_range().tracker)
            }
        }
        // SAFETY: host memory of this process, written in the order its tracker keeps
        // (the host's own accesses wait for the kernel's pending write).
        unsafe impl<$($lt,)? T: DeviceRepr> crate::module::WritableArg for $ty<$($lt,)? T> {}
    };
}
host_kind!(PinnedHostBuffer);
host_kind!(RegisteredHost<'a>);
impl<T: DeviceRepr> crate::copy::TrackedMemory for PinnedHostBuffer<T> {}
impl<T: DeviceRepr> crate::copy::TrackedMemory for RegisteredHost<'static, T> {}

fn byte_len<T>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow usize bytes")))
}

impl<'a> BoundDevice<'a> {
    /// Allocates `len` zeroed elements of page-locked, device-mapped host memory.
    pub fn alloc_pinned<T: DeviceRepr>(
        &self,
        len: usize,
        opts: PinnedOptions,
    ) -> Result<PinnedHostBuffer<T>> {
        self.ensure_current()?;
        let bytes = byte_len::<T>(len)?;
        let mut range = LockedRange {
            device: Arc::clone(self.device()),
            ptr: NonNull::dangling(),
            len: 0,
            dptr: 0,
            portable: opts.portable,
            kind: MemoryKind::Pinned,
            tracker: AccessTracker::default(),
        };
        if bytes > 0 {
            let mut flags = sys::CU_MEMHOSTALLOC_DEVICEMAP;
            if opts.portable {
                flags |= sys::CU_MEMHOSTALLOC_PORTABLE;
            }
            if opts.write_combined {
                flags |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
            }
            // SAFETY: this context is current; the buffer frees it.
            let p: *mut c_void = self
                .device()
                .check(unsafe { memory::host_alloc(bytes, flags) })?;
            let ptr = NonNull::new(p.cast::<T>()).ok_or_else(|| {
                Error::InvalidArgument("cuMemHostAlloc returned a null pointer".into())
            })?;
            // From here the buffer owns the allocation and frees it on any early return.
            range.ptr = ptr;
            range.len = len;
            // SAFETY: `bytes` writable bytes at `ptr`, just allocated, not yet shared.
            unsafe { std::ptr::write_bytes(ptr.as_ptr().cast::<u8>(), 0, bytes) };
        }
        let mut buf = PinnedHostBuffer { range };
        if bytes > 0 {
            buf.range.dptr = LockedRange::mapped_address(buf.range.ptr)?;
        }
        Ok(buf)
    }

    /// A pinned copy of `src`.
    pub fn pinned_from_slice<T: DeviceRepr>(
        &self,
        src: &[T],
        opts: PinnedOptions,
    ) -> Result<PinnedHostBuffer<T>> {
        let mut buf = self.alloc_pinned(src.len(), opts)?;
        buf.copy_from_slice(src);
        Ok(buf)
    }
}
