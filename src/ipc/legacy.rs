//! Legacy CUDA IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`) for plain
//! [`DeviceSlice`] allocations.
//!
//! No pool and no file descriptor: the 64-byte handle is plain data and may travel by
//! any channel (e.g. [`send_message`](super::send_message) with
//! [`LegacyIpcHandle::to_bytes`]). A handle cannot be opened in the process that made it
//! ([`Error::SameProcessImport`]), nor opened twice at once ([`Error::AlreadyImported`]).

use super::handle::LegacyIpcHandle;
use super::registry::{self, ImportKey, LiveImport};
use super::{
    allocation_range, check_allocation_size, device_by_uuid, disown_and_free, free_in_context,
    pointer_attribute,
};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice};
use cudarc::driver::sys;
use std::mem::ManuallyDrop;

impl LegacyIpcHandle {
    /// Exports the whole allocation of `slice` (`cuIpcGetMemHandle`). Needs no binding.
    ///
    /// `cuIpcGetMemHandle` describes a whole `cuMemAlloc` allocation by its base; the
    /// handle records `slice`'s length. So only a slice that *is* such an allocation,
    /// from its base, is exported; anything else is [`Error::NotLegacyExportable`]:
    /// memory of a [`MemoryPool`](super::MemoryPool) (a [`PoolSlice`](super::PoolSlice)
    /// reaches this function through its deref; export it with
    /// [`PoolSlice::export`](super::PoolSlice::export)), memory imported from another
    /// process ([`ImportedSlice`](super::ImportedSlice), [`LegacySlice`]), memory the
    /// driver does not report as legacy-IPC capable, and a pointer that is not the base
    /// of its allocation. When the driver cannot answer the checks' queries, the export
    /// is refused too (fail closed).
    ///
    /// Waits first for the slice's pending stream-ordered uses in this process. The
    /// exporter must keep `slice` alive until every importer has dropped its
    /// [`LegacySlice`].
    pub fn export<T: DeviceRepr>(slice: &DeviceSlice<T>) -> Result<LegacyIpcHandle> {
        if slice.is_empty() {
            return Err(Error::InvalidArgument(
                "an empty slice has no allocation to export".into(),
            ));
        }
        // The importer's work is ordered after nothing of ours: let pending uses finish.
        crate::memory::Tracked::tracker(slice).host_access(crate::access::Access::Write)?;
        let refuse = |reason: String| Error::NotLegacyExportable { reason };
        // Held to the end, so the handle is recorded as ours before anyone can open it.
        let mut reg = registry::lock();
        if reg.is_imported(slice.ptr) {
            return Err(refuse(format!(
                "the memory at {:#x} was imported from another process (an ImportedSlice or \
                 LegacySlice); only the process that allocated it may export it",
                slice.ptr
            )));
        }
        let _guard = slice.device().enter()?;
        let capable = pointer_attribute(
            slice.ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        )
        .map_err(|e| refuse(format!("the driver could not say whether it is: {e}")))?;
        if capable == 0 {
            return Err(refuse(
                "the driver reports it is not legacy-IPC capable (memory-pool or other \
                 non-cuMemAlloc memory; export a PoolSlice with PoolSlice::export)"
                    .into(),
            ));
        }
        let pool = pointer_attribute(
            slice.ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
        );
        if matches!(pool, Ok(p) if p != 0) {
            return Err(refuse(
                "it is memory-pool memory (export a PoolSlice with PoolSlice::export)".into(),
            ));
        }
        let (base, size) = allocation_range(slice.ptr)
            .map_err(|e| refuse(format!("the driver could not report its allocation: {e}")))?;
        let bytes = slice.len() * std::mem::size_of::<T>();
        if base != slice.ptr || size < bytes {
            return Err(refuse(format!(
                "the slice ({bytes} bytes at {:#x}) is not its allocation from the base (the \
                 allocation has {size} bytes at {base:#x}); the handle would name the whole \
                 allocation",
                slice.ptr
            )));
        }
        // SAFETY: `ptr` is the base of a live, legacy-IPC capable device allocation of at
        // least the slice's bytes (checked above with the driver; `slice` keeps it alive
        // for the call); its context is current.
        let handle = unsafe { result::ipc::get_mem_handle(slice.ptr) }?;
        let data = handle.reserved.map(|b| b as u8);
        reg.add_own_legacy(data);
        // Kept for the process's life like the handle: a later allocation at this address
        // is named by it only while a rank still imports the freed one.
        reg.add_own_export(ImportKey::Legacy(data), base, size as u64);
        Ok(LegacyIpcHandle::new::<T>(
            slice.device().uuid(),
            data,
            slice.len(),
        ))
    }

    /// Opens the allocation in this process (`cuIpcOpenMemHandle`, lazy peer access) on
    /// the device with the handle's UUID, with that device's context pushed and popped.
    ///
    /// Errors: [`Error::TypeMismatch`], [`Error::UnknownDevice`];
    /// [`Error::SameProcessImport`] for a handle this process exported (the driver
    /// refuses those too, with a plain driver error, for handles exported here other
    /// than through gpubind); [`Error::AlreadyImported`] while a [`LegacySlice`] of the
    /// same allocation is alive in this process (the driver would return the same,
    /// reference-counted mapping: two owning slices of it would alias; open it again
    /// after dropping the first); [`Error::CorruptHandle`] when the allocation is smaller
    /// than the handle claims or the driver cannot report its size; a driver error for
    /// handles that name nothing.
    pub fn open<T: DeviceRepr>(&self) -> Result<LegacySlice<T>> {
        let len = self.layout().expect_type::<T>()?;
        crate::driver::init()?;
        let device = device_by_uuid(self.device_uuid())?;
        let key = ImportKey::Legacy(*self.data());
        // Held until the slice is registered: opens and imports in this process are
        // serialised, so nothing can open or register this allocation in between.
        let mut reg = registry::lock();
        if reg.is_own_legacy(self.data()) {
            return Err(Error::SameProcessImport {
                what: "this legacy IPC handle".into(),
            });
        }
        reg.check_key(&key)?;
        let _guard = device.enter()?;
        // Before another process's memory is mapped here: see `cloexec`.
        super::cloexec::mark_driver_descriptors();
        let handle = sys::CUipcMemHandle {
            reserved: self.data().map(|b| b as std::ffi::c_char),
        };
        // SAFETY: the device's context is current; the handle is passed by value (the
        // driver validates its content).
        let ptr = unsafe {
            result::ipc::open_mem_handle(
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }?;
        let close = |p| {
            // SAFETY: this call opened `p` and it is closed once. Where the driver
            // returned a mapping that was already open (see below), it counted this open,
            // so the close drops only this call's reference and the other slice's mapping
            // stays (documented for cuIpcOpenMemHandle).
            unsafe { result::ipc::close_mem_handle(p) }
        };
        let bytes = len * std::mem::size_of::<T>();
        if reg.overlaps(ptr, bytes as u64) {
            let what = format_args!("a legacy IPC mapping that overlaps a live import");
            free_in_context(what, &device, ptr, "cuIpcCloseMemHandle", close);
            return Err(Error::AlreadyImported {
                what: format!(
                    "{} (mapped at {ptr:#x}, which a live imported slice covers)",
                    key.describe()
                ),
            });
        }
        if let Err(e) = check_allocation_size(ptr, bytes) {
            let what = format_args!("a legacy IPC mapping that failed its size check");
            free_in_context(what, &device, ptr, "cuIpcCloseMemHandle", close);
            return Err(e);
        }
        let live = reg.insert(key, ptr, bytes as u64)?;
        drop(reg);
        Ok(LegacySlice {
            // SAFETY: `ptr` maps at least `len` elements (checked above), overlaps no
            // other live import of this process (so no other slice here owns it);
            // LegacySlice's Drop closes it, never DeviceSlice's.
            slice: ManuallyDrop::new(unsafe { DeviceSlice::from_raw(device, ptr, len) }),
            live,
        })
    }
}

/// Another process's allocation opened from a [`LegacyIpcHandle`]: a typed slice like
/// [`DeviceSlice`] (copies, views, kernel argument), closed with `cuIpcCloseMemHandle`
/// (after the context's pending work) on drop.
pub struct LegacySlice<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
    /// This open's registry entry: dropped after `Drop` has closed the mapping, and only
    /// then may the handle be opened again.
    live: LiveImport,
}

super::foreign_slice!(LegacySlice);

impl<T: DeviceRepr> Drop for LegacySlice<T> {
    fn drop(&mut self) {
        let len = self.slice.len();
        let what = format_args!(
            "LegacySlice<{}> of {len} elements",
            std::any::type_name::<T>()
        );
        let unmapped = disown_and_free(&mut self.slice, what, "cuIpcCloseMemHandle", |p| {
            // SAFETY: opened by cuIpcOpenMemHandle, closed once, in its context, after
            // its own pending uses in this process (run only after the wait succeeded).
            unsafe { result::ipc::close_mem_handle(p) }
        });
        if !unmapped {
            self.live.keep();
        }
    }
}
