//! What a device keeps for its own lifetime: values built once by an upper layer (the
//! collective backends' kernels), shared by every user of the device, and the modules
//! they loaded, unloaded by the device's drop.
//!
//! `cuModuleUnload` waits for every piece of work on the device, not only for the
//! module's own (see `crate::teardown::release`). A module that each communicator loaded
//! and unloaded itself made every communicator's drop wait for whatever the user's
//! streams still run. Kept here, such a module is loaded once per device and unloaded
//! only when the last gpubind value of the device is gone (`Device`'s drop, its context
//! entered, before the primary context's retain is released): no user stream of gpubind
//! can still run work by then, since each resource's drop waited for its own uses or
//! leaked an `Arc<Device>` (keeping the device, and so the module, alive).

use crate::error::Result;
use cudarc::driver::sys;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

type Slot = Arc<dyn Any + Send + Sync>;

/// One device's kept values (one per type) and the raw modules they loaded.
#[derive(Default)]
pub(crate) struct Kept {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    values: HashMap<TypeId, Slot>,
    /// `CUmodule` handles (as integers) to unload with the device.
    modules: Vec<usize>,
}

#[cfg_attr(not(feature = "collective"), allow(dead_code))]
impl Kept {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept `T`, made by `make` on first use. `make` runs under the lock (one at a
    /// time per device, so a value is never built twice) and returns the value with the
    /// modules it loaded, which are unloaded by [`Kept::take_modules`]'s caller.
    pub(crate) fn get_or_make<T: Any + Send + Sync>(
        &self,
        make: impl FnOnce() -> Result<(T, Vec<sys::CUmodule>)>,
    ) -> Result<Arc<T>> {
        let mut inner = self.lock();
        if let Some(v) = inner.values.get(&TypeId::of::<T>())
            && let Ok(t) = Arc::clone(v).downcast::<T>()
        {
            return Ok(t);
        }
        let (value, modules) = make()?;
        let value = Arc::new(value);
        inner
            .modules
            .extend(modules.into_iter().map(|m| m as usize));
        inner
            .values
            .insert(TypeId::of::<T>(), Arc::clone(&value) as Slot);
        Ok(value)
    }

    /// Empties the slots; returns the modules to unload.
    pub(crate) fn take_modules(&mut self) -> Vec<sys::CUmodule> {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        inner.values.clear();
        std::mem::take(&mut inner.modules)
            .into_iter()
            .map(|m| m as sys::CUmodule)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_made_once_per_type_and_its_modules_are_handed_back() {
        let mut kept = Kept::default();
        let mut made = 0;
        for _ in 0..3 {
            let v = kept
                .get_or_make(|| {
                    made += 1;
                    Ok((7u32, vec![0x10 as sys::CUmodule]))
                })
                .unwrap();
            assert_eq!(*v, 7);
        }
        assert_eq!(made, 1);
        let s = kept
            .get_or_make(|| Ok(("other type".to_string(), vec![])))
            .unwrap();
        assert_eq!(*s, "other type");
        // A failed make keeps nothing and is retried.
        assert!(
            kept.get_or_make::<u64>(|| Err(crate::error::Error::InvalidArgument("no".into())))
                .is_err()
        );
        assert_eq!(*kept.get_or_make(|| Ok((5u64, vec![]))).unwrap(), 5);
        assert_eq!(kept.take_modules(), vec![0x10 as sys::CUmodule]);
        assert!(kept.take_modules().is_empty());
    }
}
