//! Registration of existing host memory: [`BoundDevice::register_host`] and
//! [`BoundDevice::register_vec`].

use super::{LockedRange, RegisterOptions, RegisteredHost, byte_len};
use crate::access::AccessTracker;
use crate::context::BoundDevice;
use crate::copy::MemoryKind;
use crate::driver::result::memory;
use crate::error::{GivenBack, Result};
use crate::memory::DeviceRepr;
use cudarc::driver::sys;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

impl BoundDevice<'_> {
    /// Page-locks `mem` (`cuMemHostRegister`, mapped for kernels) until the returned
    /// value drops; `mem` stays borrowed until then.
    pub fn register_host<'m, T: DeviceRepr>(
        &self,
        mem: &'m mut [T],
        opts: RegisterOptions,
    ) -> Result<RegisteredHost<'m, T>> {
        let len = mem.len();
        let mut reg = self.unregistered(NonNull::from(mem).cast(), None, opts);
        // SAFETY: the borrow of `mem` is held (PhantomData) for the result's life and
        // the range is never reached through `mem` meanwhile.
        unsafe { self.lock_range(&mut reg, len, opts) }?;
        Ok(reg)
    }

    /// Page-locks the buffer of `vec`, which the result owns; get it back with
    /// [`RegisteredHost::into_vec`]. A `'static` registration can be exported to DLPack.
    ///
    /// # Errors
    ///
    /// A [`GivenBack`] with `vec`, unchanged, and the error: the binding's context cannot
    /// be made current, the byte length overflows `usize`, or the driver refuses the
    /// registration (`cuMemHostRegister`: memory it cannot lock, a range already
    /// registered, out of page-locked memory) or its mapping
    /// (`cuMemHostGetDevicePointer`). When the mapping failed and undoing the
    /// registration failed too (the context was poisoned, or `cuMemHostUnregister`
    /// outlasted `GPUBIND_DROP_TIMEOUT`), the driver may still hold the pages: the
    /// `Vec` is leaked then (logged at warn level) and `input` is an empty `Vec`.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let data = vec![0u8; 4096];
    /// let data = match gpu.register_vec(data, Default::default()) {
    ///     Ok(reg) => reg.into_vec()?.unwrap_or_default(),
    ///     Err(failed) => failed.input, // the same Vec, contents and all
    /// };
    /// # let _ = data; Ok(()) }
    /// ```
    pub fn register_vec<T: DeviceRepr>(
        &self,
        vec: Vec<T>,
        opts: RegisterOptions,
    ) -> std::result::Result<RegisteredHost<'static, T>, Box<GivenBack<Vec<T>>>> {
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let (ptr, len, cap) = (vec.as_mut_ptr(), vec.len(), vec.capacity());
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        // From here `reg` owns the Vec's buffer (taken apart once: ManuallyDrop).
        let mut reg = self.unregistered(ptr, Some(cap), opts);
        // SAFETY: ptr/len are the Vec's, whose buffer `reg` owns.
        let Err(error) = (unsafe { self.lock_range(&mut reg, len, opts) }) else {
            return Ok(reg);
        };
        let input = if reg.range.len == 0 {
            // Never registered: the buffer goes back as it was, with its length.
            reg.owned_capacity = None; // the drop below must not rebuild it
            drop(reg);
            // SAFETY: ptr/len/cap of the Vec taken apart above; `reg`, which owned it,
            // is gone without rebuilding it, so it is rebuilt exactly once, here.
            unsafe { Vec::from_raw_parts(ptr.as_ptr(), len, cap) }
        } else {
            // Registered, then the mapping failed: unregistered (nothing is pending, so
            // `into_vec` waits for nothing), or leaked if that fails.
            reg.into_vec().ok().flatten().unwrap_or_default()
        };
        Err(GivenBack::boxed(input, error))
    }

    /// A registration of `ptr` not yet made: its drop unregisters nothing (and rebuilds
    /// an owned `Vec` of length 0: set `owned_capacity` to `None` to take it back).
    fn unregistered<'m, T: DeviceRepr>(
        &self,
        ptr: NonNull<T>,
        owned_capacity: Option<usize>,
        opts: RegisterOptions,
    ) -> RegisteredHost<'m, T> {
        RegisteredHost {
            range: LockedRange {
                device: Arc::clone(self.device()),
                ptr,
                len: 0, // not registered yet: Drop must not unregister
                dptr: 0,
                portable: opts.portable,
                kind: MemoryKind::Registered,
                tracker: AccessTracker::default(),
            },
            owned_capacity,
            _borrow: PhantomData,
        }
    }

    /// Page-locks `len` elements at `reg`'s address and maps them for kernels; sets
    /// `reg`'s length once registered (so that its drop unregisters) and its mapped
    /// address.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` (`reg`'s address) is initialised memory of `T` that `reg` may use
    /// exclusively for its life (with `owned_capacity`, a `Vec` buffer it owns).
    unsafe fn lock_range<T: DeviceRepr>(
        &self,
        reg: &mut RegisteredHost<'_, T>,
        len: usize,
        opts: RegisterOptions,
    ) -> Result<()> {
        self.ensure_current()?;
        let bytes = byte_len::<T>(len)?;
        if bytes == 0 {
            return Ok(());
        }
        let mut flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        if opts.portable {
            flags |= sys::CU_MEMHOSTREGISTER_PORTABLE;
        }
        let ptr = reg.range.ptr;
        // SAFETY: this context is current; the range is live host memory of `bytes`
        // bytes (caller's contract).
        let registered = unsafe { memory::host_register(ptr.as_ptr().cast(), bytes, flags) };
        self.device().check(registered)?;
        reg.range.len = len;
        reg.range.dptr = LockedRange::mapped_address(ptr)?;
        Ok(())
    }
}
