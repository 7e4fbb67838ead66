//! [`MemoryPool`]: a stream-ordered memory pool on one device, optionally exportable.

use super::handle::{BufferHandle, PoolHandle, PoolId};
use super::{OwnedPool, PoolUsage, disown_and_free, free_in_context};
use crate::access::Access;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// How to create a [`MemoryPool`].
///
/// ```
/// use gpubind::ipc::PoolConfig;
/// let cfg = PoolConfig::default().ipc(true).release_threshold(64 << 20);
/// assert!(cfg.is_ipc());
/// ```
#[derive(Clone, Debug, Default)]
pub struct PoolConfig {
    ipc: bool,
    max_size: usize,
    release_threshold: Option<u64>,
}

impl PoolConfig {
    /// Makes the pool exportable to other processes with POSIX file descriptors
    /// (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`). Off by default.
    pub fn ipc(mut self, on: bool) -> Self {
        self.ipc = on;
        self
    }

    /// Caps the pool's reserved memory (0, the default, means no cap beyond the device).
    pub fn max_size(mut self, bytes: usize) -> Self {
        self.max_size = bytes;
        self
    }

    /// Sets `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` right after creation.
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = Some(bytes);
        self
    }

    /// Whether the pool will be exportable.
    pub fn is_ipc(&self) -> bool {
        self.ipc
    }
}

/// A stream-ordered memory pool on one device (`cuMemPoolCreate`), optionally IPC
/// capable. Cheap to clone (an `Arc`); `Send + Sync`; destroyed when the last clone and
/// the last [`PoolSlice`] from it are gone, in its own context.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::ipc::{MemoryPool, PoolConfig};
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true))?;
/// let stream = gpu.new_stream()?;
/// let mut buf = pool.alloc_zeros::<f32>(&gpu.on(&stream)?, 1024)?;
/// gpu.htod_copy(&vec![1.0; 1024], &mut buf)?;     // core copies accept pool slices
/// let (pool_handle, buf_handle) = (pool.export()?, buf.export()?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<OwnedPool>,
}

impl MemoryPool {
    /// Creates a pool of pinned device memory on the bound device.
    pub fn new(gpu: &BoundDevice<'_>, config: PoolConfig) -> Result<MemoryPool> {
        gpu.ensure_current()?;
        let device = Arc::clone(gpu.device());
        // Zeroed, then the fields every binding version has: the rest (`usage`, later
        // fields, `reserved`) differs between CUDA versions and must be zero.
        // SAFETY: an all-zero CUmemPoolProps is valid: integers, a null pointer, a
        // bit-flag newtype (handle types) and enums whose zero is a variant (`…_INVALID`).
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = if config.ipc {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        };
        props.location = crate::driver::version::mem_location(
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            device.raw_device(),
        );
        props.win32SecurityAttributes = std::ptr::null_mut();
        props.maxSize = config.max_size;
        // Before the pool exists: a failing random source then leaves nothing behind.
        let id = PoolId::fresh()?;
        // SAFETY: the bound context is current; `props` is fully initialised and outlives
        // the call.
        let raw = unsafe { result::pool::create(&props) }?;
        let mut owned = OwnedPool {
            device,
            raw,
            id,
            export_fd: None,
        };
        if config.ipc {
            // On failure `owned` drops here and destroys the pool.
            owned.export_fd = Some(export_shareable_handle(raw)?);
            // Memory of this pool may be used by other processes: see `cloexec`.
            super::cloexec::mark_driver_descriptors();
            // Importing this pool in this process is refused from now until it is
            // destroyed (OwnedPool's Drop removes the entry).
            super::registry::lock().add_own_pool(owned.id, raw as usize);
        }
        let pool = MemoryPool {
            inner: Arc::new(owned),
        };
        if let Some(bytes) = config.release_threshold {
            pool.set_release_threshold(bytes)?;
        }
        Ok(pool)
    }

    /// The pool's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.inner.device
    }

    /// The pool's id (carried by its pool and buffer handles).
    pub fn id(&self) -> PoolId {
        self.inner.id
    }

    /// Whether the pool was created with [`PoolConfig::ipc`].
    pub fn is_ipc(&self) -> bool {
        self.inner.is_ipc()
    }

    /// Exports the pool as a POSIX file descriptor: each call returns a new duplicate of
    /// the descriptor `cuMemPoolExportToShareableHandle` made when the pool was created
    /// (the driver exports no pointer of a pool it has not exported).
    /// [`Error::NotIpcPool`] unless the pool was created with [`PoolConfig::ipc`].
    pub fn export(&self) -> Result<PoolHandle> {
        export_pool(&self.inner)
    }

    /// Allocates `len` zeroed elements from the pool on `stream` and waits for the
    /// stream, so the slice can be used right away on any stream of its device (and
    /// exported). For stream-ordered use without the wait see
    /// [`alloc_async`](Self::alloc_async).
    pub fn alloc_zeros<T: DeviceRepr>(
        &self,
        stream: &BoundStream<'_>,
        len: usize,
    ) -> Result<PoolSlice<T>> {
        // SAFETY: zeroed on the same stream, and the stream is waited for before the
        // slice is handed out, so no other stream can see it before both are done.
        let mut buf = unsafe { self.alloc_async::<T>(stream, len)? };
        stream.memset_zeros_async(&mut buf)?;
        stream.synchronize()?;
        Ok(buf)
    }

    /// Allocates `len` uninitialised elements from the pool, ordered on `stream`
    /// (`cuMemAllocFromPoolAsync`); returns at once.
    ///
    /// # Safety
    ///
    /// The contents are uninitialised: read them only after writing them. (The memory
    /// exists only once `stream` reaches the allocation; gpubind orders every later use
    /// of the slice in this process after that point, and [`PoolSlice::export`] waits for
    /// it before another process can see the buffer.)
    pub unsafe fn alloc_async<T: DeviceRepr>(
        &self,
        stream: &BoundStream<'_>,
        len: usize,
    ) -> Result<PoolSlice<T>> {
        stream
            .bound()
            .expect_device("memory pool", &self.inner.device)?;
        // The null stream is the *current* context's: check it before enqueueing.
        stream.ensure_stream_context()?;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow usize bytes"))
        })?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            // SAFETY: the stream's device (= the pool's) is bound and current; the raw
            // stream handle is used only for this enqueue, while `stream` is borrowed.
            ptr = unsafe {
                result::memory::alloc_from_pool_async(bytes, self.inner.raw, stream.raw())
            }?;
        }
        // SAFETY: `ptr` holds `bytes` bytes on this device, owned by the new slice only;
        // the DeviceSlice never frees it (ManuallyDrop): PoolSlice's Drop does.
        let slice = unsafe { DeviceSlice::from_raw(Arc::clone(&self.inner.device), ptr, len) };
        // The memory exists from this point of `stream` on: every other use waits for it.
        // Recorded after the enqueue (the slice is new: nothing to wait for).
        drop(stream.claim([Some((
            crate::memory::Tracked::tracker(&slice),
            Access::Write,
        ))])?);
        Ok(PoolSlice {
            slice: ManuallyDrop::new(slice),
            pool: Arc::clone(&self.inner),
        })
    }

    /// Lets kernels on `peer` access the pool's memory (`cuMemPoolSetAccess`, read and
    /// write). A pool is always accessible from its own device; peers need peer access
    /// support ([`Device::can_access_peer`]).
    pub fn grant_access(&self, peer: &Device) -> Result<()> {
        self.inner.grant_access(peer)
    }

    /// Reserved and used bytes, current and peak (`CU_MEMPOOL_ATTR_*_MEM_*`).
    pub fn usage(&self) -> Result<PoolUsage> {
        self.inner.usage()
    }

    /// Bytes the pool keeps reserved when idle (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`).
    pub fn release_threshold(&self) -> Result<u64> {
        self.inner
            .get_attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the release threshold.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.inner.set_attr(
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            bytes,
        )
    }

    /// Resets the peak (`*_HIGH`) counters to the current values.
    pub fn reset_peaks(&self) -> Result<()> {
        for attr in [
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        ] {
            self.inner.set_attr(attr, 0)?;
        }
        Ok(())
    }

    /// Releases reserved memory above `keep` bytes back to the device (`cuMemPoolTrimTo`;
    /// a no-op for IPC pools, whose memory the driver does not release).
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let _guard = self.inner.device.enter()?;
        // SAFETY: valid pool; its context is current.
        unsafe { result::pool::trim_to(self.inner.raw, keep) }
    }

    /// The raw pool handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not destroy it.
    pub unsafe fn raw(&self) -> sys::CUmemoryPool {
        self.inner.raw
    }
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("device", &self.inner.device.ordinal())
            .field("id", &self.inner.id)
            .field("ipc", &self.inner.is_ipc())
            .finish()
    }
}

/// `len` elements allocated from a [`MemoryPool`].
///
/// Behaves like a [`DeviceSlice`]: it implements [`DeviceMemory`](crate::DeviceMemory)
/// and [`DeviceMemoryMut`](crate::DeviceMemoryMut) and is a kernel argument, so every
/// core copy and launch accepts it, and it derefs to `&DeviceSlice<T>` for views. It
/// holds the pool alive. Dropping it waits for its context's pending work and frees it
/// with `cuMemFree`; [`free_async`](Self::free_async) is the stream-ordered alternative.
///
/// The deref is read-only: the pool allocation inside can never be swapped with (or
/// replaced by) an ordinary `DeviceSlice`, which would free it the wrong way:
///
/// ```compile_fail,E0596
/// # use gpubind::{DeviceSlice, ipc::PoolSlice};
/// fn swap(a: &mut PoolSlice<f32>, b: &mut DeviceSlice<f32>) {
///     std::mem::swap(&mut **a, b); // error[E0596]: cannot borrow data in dereference as mutable
/// }
/// ```
///
/// Write through [`slice_mut`](Self::slice_mut) views or pass `&mut slice` to copies.
pub struct PoolSlice<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
    pool: Arc<OwnedPool>,
}

super::foreign_slice!(PoolSlice);

impl<T: DeviceRepr> PoolSlice<T> {
    /// The id of the pool this slice came from.
    pub fn pool_id(&self) -> PoolId {
        self.pool.id
    }

    /// Exports the allocation (`cuMemPoolExportPointer`) for a process that imported the
    /// pool. [`Error::NotIpcPool`] for a pool created without IPC; empty slices cannot be
    /// exported.
    ///
    /// The exporting process must keep the slice alive until every importer has dropped
    /// its [`ImportedSlice`](super::ImportedSlice) (tell it to, and wait for the answer).
    ///
    /// Waits first for the slice's pending stream-ordered uses in this process: the
    /// importer's work is not ordered after them by anything else.
    pub fn export(&self) -> Result<BufferHandle> {
        if !self.pool.is_ipc() {
            return Err(Error::NotIpcPool);
        }
        if self.slice.is_empty() {
            return Err(Error::InvalidArgument(
                "an empty pool slice has no allocation to export".into(),
            ));
        }
        crate::memory::Tracked::tracker(&*self.slice).host_access(Access::Write)?;
        self.export_unordered()
    }

    /// The pool of this slice, exported ([`MemoryPool::export`]).
    pub(super) fn export_pool(&self) -> Result<PoolHandle> {
        export_pool(&self.pool)
    }

    /// [`export`](Self::export) without the wait for pending uses: for a caller that
    /// orders the importer after them by other means (an interprocess event).
    pub(super) fn export_unordered(&self) -> Result<BufferHandle> {
        if !self.pool.is_ipc() {
            return Err(Error::NotIpcPool);
        }
        if self.slice.is_empty() {
            return Err(Error::InvalidArgument(
                "an empty pool slice has no allocation to export".into(),
            ));
        }
        let _guard = self.pool.device.enter()?;
        // SAFETY: `ptr` is a live allocation of this IPC pool; its context is current.
        let data = unsafe { result::pool::export_pointer(self.slice.ptr) }?;
        super::registry::lock().add_own_export(
            super::registry::ImportKey::Pool(self.pool.id, data.reserved),
            self.slice.ptr,
            (self.slice.len() * std::mem::size_of::<T>()) as u64,
        );
        Ok(BufferHandle::new::<T>(
            self.pool.id,
            self.pool.device.uuid(),
            data.reserved,
            self.slice.len(),
        ))
    }

    /// Frees the slice ordered on `stream` (`cuMemFreeAsync`), without waiting: the free
    /// is ordered after every pending use of the slice in this process (on any stream),
    /// as gpubind tracks them.
    ///
    /// # Safety
    ///
    /// Every use of the slice in importing processes must be complete before `stream`
    /// reaches the free (gpubind cannot see other processes' work).
    pub unsafe fn free_async(self, stream: &BoundStream<'_>) -> Result<()> {
        stream
            .bound()
            .expect_device("pool slice", &self.pool.device)?;
        // Owned here, so no other use can begin between this claim and the free.
        drop(stream.claim([Some((
            crate::memory::Tracked::tracker(&*self.slice),
            Access::Write,
        ))])?);
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so the slice and the Arc are moved
        // out once.
        let (slice, pool) =
            unsafe { (ManuallyDrop::take(&mut me.slice), std::ptr::read(&me.pool)) };
        // Every pending use is ordered before this point of `stream` (tracked above).
        let (device, ptr) = slice.into_raw_ordered_on_stream();
        if ptr == 0 {
            return Ok(());
        }
        // SAFETY: `ptr` came from this pool and is freed once; the stream belongs to the
        // current context and every use in this process is ordered before it (above);
        // other processes' uses are the caller's contract. Relaxed (as every free a drop
        // makes, `teardown::faults::enter_and_call`): a call the default capture mode
        // forbids while any capture runs, on a slice no capture uses (its uses are
        // ordered on `stream`, which is not being captured: gpubind's own streams never
        // are, and the claim above refuses a stream its owner captures).
        let queued = crate::driver::with_relaxed_capture_mode(|| {
            // SAFETY: as above.
            unsafe { result::memory::free_async(ptr, stream.raw()) }
        })
        .and_then(|freed| freed);
        if queued.is_ok() && pool.is_ipc() {
            // Freed (in stream order): no longer memory another process can map.
            super::registry::lock().remove_own_export(ptr);
        }
        if queued.is_err() {
            // Refused: the memory is still ours. Wait for the stream (which orders every
            // use) and free it synchronously.
            if stream.synchronize().is_ok() {
                let what = format_args!(
                    "PoolSlice<{}> whose cuMemFreeAsync was refused",
                    std::any::type_name::<T>()
                );
                free_in_context(what, &device, ptr, "cuMemFree_v2", |p| {
                    // SAFETY: the async free was refused, so `ptr` is still ours to free
                    // once; its uses are complete (the stream was synchronised).
                    unsafe { result::memory::free(p) }
                });
            }
        }
        drop(pool);
        queued
    }
}

impl<T: DeviceRepr> Drop for PoolSlice<T> {
    fn drop(&mut self) {
        let len = self.slice.len();
        let what = format_args!(
            "PoolSlice<{}> of {len} elements",
            std::any::type_name::<T>()
        );
        let call = "cuMemFreeAsync (legacy stream) + cuStreamSynchronize";
        // On the release thread, bounded (disown_and_free): the legacy stream's sync waits
        // for whatever else runs on it. (A plain cuMemFree of pool memory does not wait,
        // but the pool's usage counters did not see that free on the H200.)
        let freed = disown_and_free(&mut self.slice, what, call, |p| {
            // SAFETY: a live allocation of our pool, freed once, after its own pending
            // uses (run only after the wait for them succeeded), in its context. Freed on
            // the legacy stream and waited for, so the pool counts it as free when the
            // drop returns.
            unsafe {
                result::memory::free_async(p, std::ptr::null_mut())
                    .and_then(|()| result::stream::synchronize(std::ptr::null_mut()))
            }
        });
        if freed && self.pool.is_ipc() {
            super::registry::lock().remove_own_export(self.slice.ptr);
        }
        if !freed {
            // Leaked while the device may still use it: the pool (and its entry in the
            // registry of this process's own pools) must outlive that use, or a re-import
            // of the allocation could alias memory the old work still writes.
            std::mem::forget(Arc::clone(&self.pool));
        }
    }
}

/// A duplicate of the pool's export descriptor as a [`PoolHandle`];
/// [`Error::NotIpcPool`] for a pool created without IPC.
fn export_pool(pool: &OwnedPool) -> Result<PoolHandle> {
    let Some(kept) = &pool.export_fd else {
        return Err(Error::NotIpcPool);
    };
    let fd = kept
        .try_clone()
        .map_err(|e| super::io_error("dup of the pool's descriptor", &e))?;
    Ok(PoolHandle::new(
        pool.id,
        pool.device.uuid(),
        pool.device.ordinal(),
        fd,
    ))
}

/// `cuMemPoolExportToShareableHandle` as a POSIX descriptor; the pool's context must be
/// current.
fn export_shareable_handle(raw: sys::CUmemoryPool) -> Result<OwnedFd> {
    // SAFETY: a live pool created with the POSIX descriptor handle type; the caller has
    // its context current.
    let fd = unsafe { result::pool::export_to_fd(raw) }?;
    if fd < 0 {
        return Err(Error::InvalidArgument(format!(
            "cuMemPoolExportToShareableHandle returned descriptor {fd}"
        )));
    }
    // SAFETY: the driver just created `fd` for us; nobody else owns or closes it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The driver creates it inheritable: a program this process starts would hold the
    // pool, and could import its memory.
    super::cloexec::set_cloexec(fd.as_raw_fd()).map_err(|e| {
        super::io_error(
            "fcntl(F_SETFD, FD_CLOEXEC) of the pool's exported descriptor",
            &e,
        )
    })?;
    Ok(fd)
}
