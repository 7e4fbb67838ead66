//! The importing side: [`ImportedPool`] and [`ImportedSlice`].

use super::handle::{BufferHandle, PoolHandle, PoolId};
use super::registry::{self, ImportKey, LiveImport};
use super::wire::corrupt;
use super::{
    OwnedPool, check_allocation_size, device_by_uuid, disown_and_free, free_in_context,
    pointer_attribute,
};
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice};
use cudarc::driver::sys;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// The pools this process has imported, by id, so a pool is imported once.
type Registry = Mutex<Vec<(PoolId, Weak<OwnedPool>)>>;

fn imported_pools() -> &'static Registry {
    static IMPORTED: OnceLock<Registry> = OnceLock::new();
    IMPORTED.get_or_init(Default::default)
}

/// Another process's IPC pool, imported from a [`PoolHandle`].
///
/// Importing needs only the driver ([`crate::init`]): no [`ThreadContext`](crate::ThreadContext)
/// and no binding. The pool maps on the device whose **UUID** the handle names (not the
/// exporter's ordinal, which may differ here); the calls run with that device's primary
/// context pushed and popped, so the thread's current context is left as it was. Cheap
/// to clone; `Send + Sync`; destroyed after its last clone and last [`ImportedSlice`].
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::ipc::{ImportedPool, recv_handles};
/// use gpubind::ThreadContext;
/// # let socket: std::os::unix::net::UnixStream = unimplemented!();
/// gpubind::init()?;
/// let (pools, buffers) = recv_handles(&socket)?;
/// let pool = ImportedPool::import(pools.into_iter().next().unwrap())?;
/// let buf = pool.import_buffer::<f32>(&buffers[0])?;
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(pool.device())?;     // bind to read or write it
/// let values = gpu.dtoh(&buf)?;
/// # Ok(()) }
/// ```
///
/// An imported pool only maps the exporter's allocations; allocating from it is not
/// possible (the driver forbids it, and the type has no `alloc`):
///
/// ```compile_fail,E0599
/// # fn f(pool: &gpubind::ipc::ImportedPool, s: &gpubind::BoundStream<'_>) {
/// let buf = pool.alloc_zeros::<u8>(s, 16); // error[E0599]: no method named `alloc_zeros`
/// # }
/// ```
///
/// Allocate in the exporting process and send a [`BufferHandle`].
#[derive(Clone)]
pub struct ImportedPool {
    inner: Arc<OwnedPool>,
}

impl ImportedPool {
    /// Imports the pool (`cuMemPoolImportFromShareableHandle`) on the device with the
    /// handle's UUID, consuming the handle (its descriptor is closed afterwards: the
    /// driver keeps its own reference).
    ///
    /// A pool already imported by this process (and still alive) is not imported again:
    /// the call returns that `ImportedPool` (so the driver's pool is destroyed exactly
    /// once, after its last user).
    ///
    /// Errors: [`Error::SameProcessImport`] for a pool this process created (and still
    /// has: importing it would give two owners of each of its allocations),
    /// [`Error::UnknownDevice`] if no visible device has that UUID,
    /// [`Error::CorruptHandle`] if the handle has no descriptor, a driver error if the
    /// descriptor is not a CUDA pool.
    pub fn import(handle: PoolHandle) -> Result<ImportedPool> {
        crate::driver::init()?;
        let device = device_by_uuid(handle.device_uuid())?;
        let fd = handle.require_fd()?;
        // Held across the import, so two threads importing one pool import it once.
        let mut imported = imported_pools().lock().unwrap_or_else(|p| p.into_inner());
        imported.retain(|(_, pool)| pool.strong_count() > 0);
        let id = handle.pool_id();
        // Held across the driver call too (always taken after `imported`, never before),
        // so a pool of ours cannot be destroyed and its handle reused in between.
        let own = registry::lock();
        if own.is_own_pool(id) {
            return Err(Error::SameProcessImport {
                what: format!("pool {id}"),
            });
        }
        if let Some(inner) = imported
            .iter()
            .filter(|(known, _)| *known == id)
            .find_map(|(_, pool)| pool.upgrade())
            .filter(|inner| inner.device.uuid() == device.uuid())
        {
            return Ok(ImportedPool { inner });
        }
        let _guard = device.enter()?;
        // SAFETY: `fd` is open for the call (the handle owns it); the driver does not take
        // ownership of it. The device's context is current.
        let raw = unsafe { result::pool::import_from_fd(fd.as_raw_fd()) }?;
        if own.is_own_raw_pool(raw as usize) {
            // The descriptor is one of our own pools' (its handle's id was rewritten) and
            // the driver gave back that very pool: not ours to destroy a second time, so
            // it is left alone (no OwnedPool is made for it).
            return Err(Error::SameProcessImport {
                what: format!("pool {id} (the driver returned a pool this process created)"),
            });
        }
        drop(own);
        let inner = Arc::new(OwnedPool {
            device,
            raw,
            id,
            export_fd: None,
        });
        imported.push((id, Arc::downgrade(&inner)));
        Ok(ImportedPool { inner })
    }

    /// Whether `self` and `other` are the same imported pool (one import).
    pub fn same_pool(&self, other: &ImportedPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The device the pool lives on, as this process numbers it.
    pub fn device(&self) -> &Arc<Device> {
        &self.inner.device
    }

    /// The exporter's pool id.
    pub fn id(&self) -> PoolId {
        self.inner.id
    }

    /// Lets kernels on `peer` access the pool's memory (`cuMemPoolSetAccess`, read and
    /// write). A pool is always accessible from its own device; peers need peer access
    /// support ([`Device::can_access_peer`]).
    pub fn grant_access(&self, peer: &Device) -> Result<()> {
        self.inner.grant_access(peer)
    }

    /// Maps one exported allocation (`cuMemPoolImportPointer`) as a typed slice.
    ///
    /// Checks before any driver call: the handle is valid, belongs to this pool
    /// (`InvalidArgument` otherwise) and holds `T`s ([`Error::TypeMismatch`]), and this
    /// process has no live slice imported from the same handle ([`Error::AlreadyImported`]:
    /// two owning slices of one mapping would alias and unmap it twice; importing again
    /// after that slice is dropped is fine).
    ///
    /// Checks after the import: the mapping overlaps no live imported slice
    /// ([`Error::AlreadyImported`]), is not memory of a pool this process created
    /// ([`Error::SameProcessImport`]), and holds at least the length the handle claims
    /// ([`Error::CorruptHandle`], also when the driver cannot report the mapping's size).
    /// A mapping refused for its size is unmapped again; one refused because it may be
    /// memory that a live slice of this process owns is left mapped (unmapping it could
    /// free the other slice's memory; it is released when the process exits).
    pub fn import_buffer<T: DeviceRepr>(&self, handle: &BufferHandle) -> Result<ImportedSlice<T>> {
        let len = handle.layout().expect_type::<T>()?;
        if handle.pool_id() != self.inner.id {
            return Err(Error::InvalidArgument(format!(
                "buffer handle belongs to pool {}, not to the imported pool {}",
                handle.pool_id(),
                self.inner.id
            )));
        }
        if handle.device_uuid() != self.inner.device.uuid() {
            return Err(corrupt(format!(
                "buffer handle names device {}, but its pool lives on {}",
                handle.device_uuid(),
                self.inner.device.uuid()
            )));
        }
        let bytes = len * std::mem::size_of::<T>();
        let key = ImportKey::Pool(self.inner.id, *handle.export_data());
        // Held until the slice is registered: imports in this process are serialised, so
        // no other import can map (or register) this allocation in between.
        let mut reg = registry::lock();
        if reg.is_own_pool(self.inner.id) {
            return Err(Error::SameProcessImport {
                what: format!("pool {}", self.inner.id),
            });
        }
        reg.check_key(&key)?;
        let _guard = self.inner.device.enter()?;
        // Before another process's memory is mapped here: see `cloexec`.
        super::cloexec::mark_driver_descriptors();
        let mut data = sys::CUmemPoolPtrExportData {
            reserved: *handle.export_data(),
        };
        // SAFETY: valid imported pool; its context is current; the driver validates the
        // content of `data`.
        let ptr = unsafe { result::pool::import_pointer(self.inner.raw, &mut data) }?;
        // Refusals that leave the mapping in place: `ptr` may be memory a live slice of
        // this process owns (the driver may hand back an existing mapping), and whether
        // cuMemFree here would only drop a reference or free it is not documented.
        if reg.overlaps(ptr, bytes as u64) {
            return Err(Error::AlreadyImported {
                what: format!(
                    "{} (mapped at {ptr:#x}, which a live imported slice covers)",
                    key.describe()
                ),
            });
        }
        if reg.has_own_pools() {
            // Only a process with IPC pools of its own can be handed its own memory
            // (through a pool handle whose id was rewritten). Fail closed if the driver
            // cannot say which pool the memory belongs to.
            match pointer_attribute(
                ptr,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ) {
                Ok(pool) if reg.is_own_raw_pool(pool as usize) => {
                    return Err(Error::SameProcessImport {
                        what: format!(
                            "a buffer of pool {} (the memory belongs to a pool this process created)",
                            self.inner.id
                        ),
                    });
                }
                Ok(_) => {}
                // The driver error itself (cuPointerGetAttribute): the mapping stays.
                Err(e) => return Err(e),
            }
        }
        if let Err(e) = check_allocation_size(ptr, bytes) {
            let what = format_args!("an imported pool buffer that failed its size check");
            free_in_context(what, &self.inner.device, ptr, "cuMemFree_v2", |p| {
                // SAFETY: `p` was just imported by this call and is unmapped once. No
                // other slice of this process owns it: it overlaps no live import, and it
                // is no allocation of an IPC pool of ours (none is alive, or the driver
                // named another pool as its owner above).
                unsafe { result::memory::free(p) }
            });
            return Err(e);
        }
        let live = reg.insert(key, ptr, bytes as u64)?;
        drop(reg);
        Ok(ImportedSlice {
            // SAFETY: `ptr` maps at least `len` elements (checked above); it overlaps no
            // other live import and is no allocation of this process's own IPC pools (the
            // only memory of ours a pool import can reach), so no other slice here frees
            // or hands out `&mut` to it; ImportedSlice's Drop unmaps it, never
            // DeviceSlice's.
            slice: ManuallyDrop::new(unsafe {
                DeviceSlice::from_raw(Arc::clone(&self.inner.device), ptr, len)
            }),
            pool: Arc::clone(&self.inner),
            live,
        })
    }
}

impl std::fmt::Debug for ImportedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPool")
            .field("device", &self.inner.device.ordinal())
            .field("id", &self.inner.id)
            .finish()
    }
}

/// An allocation of another process's pool, mapped here by [`ImportedPool::import_buffer`].
///
/// A typed slice like [`DeviceSlice`] (core copies, views via deref, kernel argument);
/// using it under a binding of another device is [`Error::WrongDevice`]. Holds its pool
/// alive, so dropping the `ImportedPool` first is fine. Dropping it waits for the
/// context's pending work, then unmaps it (`cuMemFree`).
pub struct ImportedSlice<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
    pool: Arc<OwnedPool>,
    /// This import's registry entry: dropped after `Drop` has unmapped the slice, and
    /// only then may the allocation be imported again.
    live: LiveImport,
}

super::foreign_slice!(ImportedSlice);

impl<T: DeviceRepr> ImportedSlice<T> {
    /// The exporter's pool id.
    pub fn pool_id(&self) -> PoolId {
        self.pool.id
    }
}

impl<T: DeviceRepr> ImportedSlice<T> {
    /// The slice's parts, without its `Drop`: whoever takes them must end the mapping
    /// with [`unmap_import`].
    pub(super) fn into_parts(self) -> (ManuallyDrop<DeviceSlice<T>>, Arc<OwnedPool>, LiveImport) {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so each field is moved out once.
        unsafe {
            (
                std::ptr::read(&me.slice),
                std::ptr::read(&me.pool),
                std::ptr::read(&me.live),
            )
        }
    }
}

/// Ends an imported mapping: waits for its pending uses in this process, then unmaps it
/// (`cuMemFree`); keeps its registry entry if it could not (see [`disown_and_free`]).
/// Returns whether the mapping is gone. Call once, as the last use of `slice`.
pub(super) fn unmap_import<T: DeviceRepr>(
    slice: &mut ManuallyDrop<DeviceSlice<T>>,
    live: &mut LiveImport,
) -> bool {
    let len = slice.len();
    let what = format_args!(
        "ImportedSlice<{}> of {len} elements",
        std::any::type_name::<T>()
    );
    let unmapped = disown_and_free(slice, what, "cuMemFree_v2", |p| {
        // SAFETY: imported by cuMemPoolImportPointer, unmapped once, in its context,
        // after its own pending uses in this process (run only after the wait
        // succeeded).
        unsafe { result::memory::free(p) }
    });
    if !unmapped {
        live.keep();
    }
    unmapped
}

impl<T: DeviceRepr> Drop for ImportedSlice<T> {
    fn drop(&mut self) {
        unmap_import(&mut self.slice, &mut self.live);
    }
}
