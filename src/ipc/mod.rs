//! Device memory shared between processes: IPC memory pools, their buffers, legacy
//! IPC handles, and the Unix-socket transport that carries them.
//!
//! * [`MemoryPool`] — a stream-ordered pool on a bound device (`cuMemPoolCreate`),
//!   exportable when created with [`PoolConfig::ipc`]. [`MemoryPool::alloc_zeros`]
//!   returns a [`PoolSlice<T>`], a typed slice that every core copy and launch accepts.
//! * Export: [`MemoryPool::export`] gives a [`PoolHandle`] (a POSIX file descriptor plus
//!   the pool's id and device UUID); [`PoolSlice::export`] gives a [`BufferHandle`]
//!   (`cuMemPoolExportPointer`'s 64 bytes, length, element type, pool id).
//! * Transport: [`send_handles`] / [`recv_handles`] over a [`UnixStream`]: one framed,
//!   checksummed message, descriptors by `SCM_RIGHTS`, bounded sizes, timeouts in both
//!   directions ([`Duration::MAX`](std::time::Duration::MAX) = none), and a check of the
//!   peer's uid (`SO_PEERCRED`, [`PeerPolicy`]; by default the peer must be the same
//!   user). [`TransportOptions`] sets both for the `_with` forms.
//! * Import in the other process: [`ImportedPool::import`] then
//!   [`ImportedPool::import_buffer`] give an [`ImportedSlice<T>`]. Importing needs
//!   only [`crate::init`] — never a hidden `cuCtxSetCurrent`: the driver calls run with
//!   the device's context pushed and popped. The device is found by UUID, so a child with
//!   a different `CUDA_VISIBLE_DEVICES` order maps each buffer on the right GPU.
//! * Interprocess events: [`EventHandle::export`] of an [`Event`](crate::Event) made
//!   with [`EventFlags::interprocess`](crate::EventFlags::interprocess), opened in the
//!   other process by [`EventHandle::open`] into an `Event` its streams wait on.
//! * Legacy IPC: [`LegacyIpcHandle::export`] of a [`DeviceSlice`], opened as a
//!   [`LegacySlice<T>`].
//! * Ordered hand-offs: [`PoolSlice::lend`] / [`PoolSlice::share`] send a buffer with
//!   its pending work to the process at the other end of a socket, which takes it with
//!   [`recv_handoff`] ([`LentImport`] / [`SharedImport`]) and hands it back by
//!   `give_back` or drop; [`Lent::join`] / [`Shared::join`] return it. The rules below
//!   are then kept by the types (`docs/ipc.md`, "Ordered hand-offs").
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::ipc::{self, MemoryPool, PoolConfig};
//! use gpubind::{Device, ThreadContext};
//! use std::os::unix::net::UnixStream;
//! let (parent_end, child_end) = UnixStream::pair().map_err(|e| ipc::io_error("socketpair", &e))?;
//! // exporter
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true))?;
//! let stream = gpu.new_stream()?;
//! let mut buf = pool.alloc_zeros::<u32>(&gpu.on(&stream)?, 256)?;
//! gpu.htod_copy(&[7u32; 256], &mut buf)?;
//! ipc::send_handles(&parent_end, &[pool.export()?], &[buf.export()?])?;
//! // importer (normally another process: see examples/ipc_workers.rs)
//! let (pools, buffers) = ipc::recv_handles(&child_end)?;
//! # Ok(()) }
//! ```
//!
//! Within one process, safe code never gets two live owning slices of one allocation
//! nor a slice longer than its mapping: importing what this process exported is
//! [`Error::SameProcessImport`], importing an allocation a live slice already maps is
//! [`Error::AlreadyImported`], a length the mapping does not cover (or cannot be
//! checked) is [`Error::CorruptHandle`], and a legacy export of anything but a whole
//! `cuMemAlloc` allocation is [`Error::NotLegacyExportable`] (`docs/ipc.md`,
//! "Soundness").
//!
//! Protocol rules the types cannot enforce across processes for buffers shared by
//! `export` rather than a hand-off (see `docs/ipc.md`): the exporter keeps a buffer (and its pool) alive until every importer has dropped its
//! imported slice — have importers answer after dropping, and wait for the answer or the
//! importer's exit; a process may only access an allocation after it is ready
//! ([`MemoryPool::alloc_zeros`] waits for that before returning).

mod cloexec;
mod event;
mod handle;
mod handoff;
mod import;
mod legacy;
mod pool;
mod registry;
mod socket;
mod wire;

pub use event::EventHandle;
pub use handle::{BufferHandle, LegacyIpcHandle, PoolHandle, PoolId};
pub use handoff::{
    GiveBackError, HandoffFailed, Incoming, JoinError, Lent, LentImport, Shared, SharedImport,
    recv_handoff,
};
pub use import::{ImportedPool, ImportedSlice};
pub use legacy::LegacySlice;
pub use pool::{MemoryPool, PoolConfig, PoolSlice};
pub use socket::{
    DEFAULT_TIMEOUT, MAX_FDS, MAX_MESSAGE_BYTES, Message, PeerCredentials, PeerPolicy,
    TransportOptions, check_peer, peer_credentials, recv_handles, recv_handles_timeout,
    recv_handles_with, recv_message, recv_message_timeout, recv_message_with, send_handles,
    send_handles_with, send_message, send_message_timeout, send_message_with,
};

use crate::device::{Device, Uuid};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice};
use cudarc::driver::sys;
use std::mem::ManuallyDrop;
use std::sync::Arc;

#[cfg(doc)]
use std::os::unix::net::UnixStream;

/// [`Error::Io`] from a `std::io::Error`, naming the call.
pub fn io_error(what: &'static str, e: &std::io::Error) -> Error {
    Error::Io {
        what,
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// Bytes reserved and in use by a pool, now and at their peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    pub reserved_current: u64,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`.
    pub reserved_high: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
    pub used_current: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
    pub used_high: u64,
}

/// A pool this process must destroy — created here or imported — with its device.
/// Shared by `Arc` between the pool value and every slice from it, so it is destroyed
/// (in its own context) only after the last slice was freed.
struct OwnedPool {
    device: Arc<Device>,
    raw: sys::CUmemoryPool,
    id: handle::PoolId,
    /// For an IPC pool, the descriptor from its first `cuMemPoolExportToShareableHandle`,
    /// made at creation and kept for the pool's life: the driver refuses to export
    /// pointers of a pool that was never exported (CUDA_ERROR_INVALID_VALUE from
    /// cuMemPoolExportPointer, seen on an H200 with driver 580). `export()` hands out
    /// duplicates of it.
    export_fd: Option<std::os::fd::OwnedFd>,
}

// SAFETY: a pool handle is an identifier the driver accepts from any thread; gpubind
// pushes the pool's own context around every call that uses it.
unsafe impl Send for OwnedPool {}
// SAFETY: as above; the driver serialises concurrent operations on one pool.
unsafe impl Sync for OwnedPool {}

impl OwnedPool {
    /// Whether the pool was created for export (imported pools never are): exactly the
    /// pools that hold an export descriptor.
    fn is_ipc(&self) -> bool {
        self.export_fd.is_some()
    }

    /// Reads one 64-bit pool attribute (all the ones gpubind exposes are `cuuint64_t`).
    fn get_attr(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let _guard = self.device.enter()?;
        // SAFETY: valid pool in the current context; these attributes write one u64.
        unsafe { result::pool::attribute(self.raw, attr) }
    }

    /// Writes one 64-bit pool attribute.
    fn set_attr(&self, attr: sys::CUmemPool_attribute, v: u64) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: valid pool in the current context; these attributes read one u64.
        unsafe { result::pool::set_attribute(self.raw, attr, v) }
    }

    /// Lets kernels on `peer` read and write the pool's memory (`cuMemPoolSetAccess`).
    fn grant_access(&self, peer: &Device) -> Result<()> {
        let _guard = self.device.enter()?;
        let desc = sys::CUmemAccessDesc {
            location: crate::driver::version::mem_location(
                sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                peer.raw_device(),
            ),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: valid pool in the current context; reads one descriptor.
        unsafe { result::pool::set_access(self.raw, std::slice::from_ref(&desc)) }
    }

    fn usage(&self) -> Result<PoolUsage> {
        use sys::CUmemPool_attribute as A;
        Ok(PoolUsage {
            reserved_current: self.get_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.get_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_current: self.get_attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: self.get_attr(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }
}

impl Drop for OwnedPool {
    fn drop(&mut self) {
        // A pool created here stays in the registry of own pools until it is destroyed,
        // so an import of it is refused for as long as any of its slices lives. The lock
        // is held across the destroy: no import can see the raw handle in between.
        let mut own = self.is_ipc().then(registry::lock);
        let raw = self.raw as usize;
        crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a memory pool"),
                device: &self.device,
                waited: Ok(()),
                call: "cuMemPoolDestroy",
                runs: crate::teardown::Runs::Inline,
            },
            move || {
                // SAFETY: created or imported once, destroyed once, here, in its context,
                // after every slice from it (each holds an Arc to us) has been freed.
                unsafe { result::pool::destroy(raw as sys::CUmemoryPool) }
            },
        );
        if let Some(reg) = own.as_mut() {
            reg.remove_own_pool(self.id);
        }
    }
}

/// The visible device with this UUID, or [`Error::UnknownDevice`].
/// The identity across processes of the device memory at `ptr`, if another process may
/// map it (an imported slice, or an allocation this process exported): the allocation's
/// key in byte form (the same in the exporter and every importer) and the byte offset
/// of `ptr` in it.
#[cfg_attr(not(feature = "collective"), allow(dead_code))]
pub(crate) fn shared_identity(ptr: u64) -> Option<([u8; 81], u64)> {
    registry::lock()
        .shared_identity(ptr)
        .map(|(key, offset)| (key.to_bytes(), offset))
}

fn device_by_uuid(uuid: Uuid) -> Result<Arc<Device>> {
    Device::by_uuid(uuid)?.ok_or(Error::UnknownDevice { uuid })
}

/// Takes the slice out of its `ManuallyDrop` without the `DeviceSlice`'s own free, waits
/// for every pending stream-ordered use of it and then, in its device's context, runs
/// `free(ptr)` (the driver call `call`). If the wait fails (a faulted context) the
/// mapping is leaked, not freed under the device; every failure is logged, naming
/// `what`. Nothing is freed for a null address. Call once, from the owner's `Drop`; the
/// slot is dead after. Returns whether the mapping is gone (`false`: leaked, or its
/// release still running in the background, so an import registry entry must stay: see
/// [`registry::LiveImport::keep`]).
fn disown_and_free<T: DeviceRepr>(
    slot: &mut ManuallyDrop<DeviceSlice<T>>,
    what: std::fmt::Arguments<'_>,
    call: &'static str,
    free: fn(sys::CUdeviceptr) -> Result<()>,
) -> bool {
    // SAFETY: every caller uses the slot exactly once, as the last thing it does with it.
    let slice = unsafe { ManuallyDrop::take(slot) };
    let (device, ptr, waited) = slice.disown_for_free();
    if ptr == 0 {
        return true;
    }
    // On the release thread, bounded (crate::teardown::release): some of these calls may wait for
    // the whole device. Only a release that ended counts as unmapped.
    crate::teardown::release(
        crate::teardown::Teardown {
            what,
            device: &device,
            waited,
            call,
            runs: crate::teardown::Runs::OnReleaseThread,
        },
        move || free(ptr),
    ) == crate::teardown::Released::Done
}

/// In `device`'s context (pushed and popped): `free(ptr)` (the driver call `call`), for
/// memory with no pending use (just mapped, or its stream synchronised). Does nothing
/// for a null address. Failures cannot be returned (cleanup paths): they are logged,
/// naming `what`.
fn free_in_context(
    what: std::fmt::Arguments<'_>,
    device: &Arc<Device>,
    ptr: sys::CUdeviceptr,
    call: &'static str,
    free: impl FnOnce(sys::CUdeviceptr) -> Result<()> + Send + 'static,
) {
    if ptr == 0 {
        return;
    }
    let t = crate::teardown::Teardown {
        what,
        device,
        waited: Ok(()),
        call,
        runs: crate::teardown::Runs::Inline,
    };
    crate::teardown::release(t, move || free(ptr));
}

/// Checks that `bytes` bytes from `ptr` lie in the allocation the driver mapped there
/// (`cuMemGetAddressRange`). Fails closed: [`Error::CorruptHandle`] if the allocation is
/// smaller than the handle claims, *or* if the driver cannot report its range (then the
/// length cannot be verified, and a slice longer than its mapping would be unsound). Run
/// with the allocation's context current; on error the caller unmaps `ptr`.
fn check_allocation_size(ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
    let (base, size) = allocation_range(ptr).map_err(|e| {
        wire::corrupt(format!(
            "the driver could not report the size of the mapped allocation ({e}), so the \
             handle's length of {bytes} bytes cannot be verified"
        ))
    })?;
    let available = (base + size as u64).saturating_sub(ptr) as usize;
    if ptr < base || available < bytes {
        return Err(wire::corrupt(format!(
            "the handle describes {bytes} bytes, but the mapped allocation has {available} \
             from the imported address"
        )));
    }
    Ok(())
}

/// `cuMemGetAddressRange` of `ptr`: the base and size of the allocation holding it. Run
/// with a context of the allocation's device current.
fn allocation_range(ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize)> {
    // SAFETY: the driver validates `ptr` (an unknown address is an error, not UB).
    unsafe { result::memory::address_range(ptr) }
}

/// `cuPointerGetAttribute` for an attribute of at most 8 bytes (a pointer, handle,
/// boolean or integer), read back as a `u64` (zero-extended: the buffer starts zeroed).
fn pointer_attribute(ptr: sys::CUdeviceptr, attr: sys::CUpointer_attribute) -> Result<u64> {
    // SAFETY: the callers pass only attributes whose value is at most 8 bytes (an
    // unsigned int, a bool or a handle); the driver validates `ptr`.
    unsafe { result::memory::pointer_attribute(ptr, attr) }
}

/// The parts of the core slice API that the three foreign slice types share: memory
/// traits, copy traits ([`CopySource`](crate::CopySource), [`CopyDest`](crate::CopyDest),
/// [`DeviceOnlyMemory`](crate::DeviceOnlyMemory): the copy layer knows nothing of IPC),
/// deref to `&DeviceSlice<T>` (views), `slice_mut`,
/// kernel argument, `Debug`. Each type has a `slice: ManuallyDrop<DeviceSlice<T>>`.
macro_rules! foreign_slice {
    ($ty:ident) => {
        impl<T: $crate::memory::DeviceRepr> $crate::memory::private::Sealed for $ty<T> {
            fn tracker(&self) -> &$crate::access::AccessTracker {
                $crate::memory::Tracked::tracker(&*self.slice)
            }
        }

        impl<T: $crate::memory::DeviceRepr> $crate::memory::DeviceMemory<T> for $ty<T> {
            fn device(&self) -> &std::sync::Arc<$crate::device::Device> {
                self.slice.device()
            }
            fn len(&self) -> usize {
                self.slice.len()
            }
            fn device_ptr(&self) -> cudarc::driver::sys::CUdeviceptr {
                self.slice.ptr
            }
        }

        impl<T: $crate::memory::DeviceRepr> $crate::memory::DeviceMemoryMut<T> for $ty<T> {
            fn tracker_mut(&mut self) -> Option<&mut $crate::access::AccessTracker> {
                Some(self.slice.tracker_mut())
            }
        }

        $crate::copy::device_only_endpoints! {
            $ty, mut;
        }

        impl<T: $crate::memory::DeviceRepr> std::ops::Deref for $ty<T> {
            type Target = $crate::memory::DeviceSlice<T>;
            /// Read-only access to the core slice API (`len`, `slice`, `device`, …).
            fn deref(&self) -> &Self::Target {
                &self.slice
            }
        }

        impl<T: $crate::memory::DeviceRepr> $ty<T> {
            /// A writable view of `range`, or [`Error::OutOfBounds`](crate::Error::OutOfBounds).
            pub fn slice_mut(
                &mut self,
                range: impl std::ops::RangeBounds<usize>,
            ) -> $crate::error::Result<$crate::memory::DeviceViewMut<'_, T>> {
                self.slice.slice_mut(range)
            }
        }

        // SAFETY: passes the inner slice's address field: 8 bytes that live as long as
        // the borrow of `self`.
        unsafe impl<T: $crate::memory::DeviceRepr> $crate::module::KernelArg for $ty<T> {
            fn param_ptr(&self) -> *mut std::ffi::c_void {
                &self.slice.ptr as *const cudarc::driver::sys::CUdeviceptr as *mut std::ffi::c_void
            }
            fn param_size(&self) -> usize {
                std::mem::size_of::<cudarc::driver::sys::CUdeviceptr>()
            }
            fn arg_device(&self) -> Option<&$crate::device::Device> {
                Some(self.slice.device())
            }
            fn describe(&self) -> String {
                format!("{}<{}>", stringify!($ty), std::any::type_name::<T>())
            }
            fn access_tracker(&self) -> Option<&$crate::access::AccessTracker> {
                Some($crate::memory::Tracked::tracker(&*self.slice))
            }
        }

        // SAFETY: a slice its `DeviceMemoryMut` API already writes (a pool slice of this
        // process, an import, a lent buffer): a kernel's write, ordered by its tracker,
        // allows nothing that API does not.
        unsafe impl<T: $crate::memory::DeviceRepr> $crate::module::WritableArg for $ty<T> {}

        impl<T: $crate::memory::DeviceRepr> std::fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("device", &self.slice.device().ordinal())
                    .field("ptr", &format_args!("{:#x}", self.slice.ptr))
                    .field("len", &self.slice.len())
                    .field("type", &std::any::type_name::<T>())
                    .finish()
            }
        }
    };
}
use foreign_slice;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn resources_are_send_and_sync() {
        assert_send_sync::<MemoryPool>();
        assert_send_sync::<PoolSlice<f32>>();
        assert_send_sync::<ImportedPool>();
        assert_send_sync::<ImportedSlice<u8>>();
        assert_send_sync::<LegacySlice<u64>>();
        assert_send_sync::<PoolHandle>();
        assert_send_sync::<BufferHandle>();
        assert_send_sync::<Lent<f32>>();
        assert_send_sync::<Shared<f32>>();
        assert_send_sync::<LentImport<u8>>();
        assert_send_sync::<SharedImport<u8>>();
    }

    #[test]
    fn import_without_a_driver_or_device_is_a_typed_error() {
        // On a machine without CUDA: NoDriver. With CUDA: this UUID names no device.
        let bogus = serde_json::json!({
            "pool_id": "00".repeat(16), "device_uuid": "ab".repeat(16), "device_ordinal": 0
        });
        let handle: PoolHandle = serde_json::from_value(bogus).unwrap();
        match ImportedPool::import(handle) {
            Err(Error::NoDriver) | Err(Error::UnknownDevice { .. }) => {}
            other => panic!("expected NoDriver or UnknownDevice, got {other:?}"),
        }
    }
}
