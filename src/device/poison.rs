//! Sticky errors: recognising the codes that poison a context, and the per-device poison
//! state (documented on [`Error::ContextPoisoned`](crate::Error::ContextPoisoned)).

use crate::device::Device;
use crate::error::Error;
use cudarc::driver::sys::CUresult;
use std::collections::HashSet;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

/// Whether `code` leaves the context unusable (CUDA's "sticky" errors).
pub(crate) fn is_sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// What poisoned a device's context: the first failing call.
#[derive(Debug, Clone)]
pub(crate) struct Poison {
    pub(crate) call: &'static str,
    pub(crate) code: CUresult,
    pub(crate) kernel: Option<&'static str>,
}

/// A device's poison state and the name of the last kernel launched on it.
#[derive(Default)]
pub(crate) struct PoisonState {
    first: OnceLock<Poison>,
    last_kernel: AtomicPtr<KernelName>,
}

/// An interned kernel name: one leaked allocation per distinct name in the process, so a
/// launch records its kernel with a single atomic store.
pub(crate) struct KernelName(pub(crate) &'static str);

/// The interned name for `name` (allocated once per distinct name).
pub(crate) fn intern(name: &str) -> &'static KernelName {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    static BOXES: OnceLock<Mutex<Vec<&'static KernelName>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut boxes = BOXES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(&s) = names.get(name)
        && let Some(&k) = boxes.iter().find(|k| std::ptr::eq(k.0, s))
    {
        return k;
    }
    let s: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(s);
    let k: &'static KernelName = Box::leak(Box::new(KernelName(s)));
    boxes.push(k);
    k
}

impl PoisonState {
    /// Records the kernel a launch is about to enqueue.
    #[inline]
    pub(crate) fn launching(&self, kernel: &'static KernelName) {
        self.last_kernel.store(
            kernel as *const KernelName as *mut KernelName,
            Ordering::Relaxed,
        );
    }

    /// The first failure, if the context is poisoned.
    #[inline]
    pub(crate) fn get(&self) -> Option<&Poison> {
        self.first.get()
    }

    /// Marks the context poisoned (the first failure wins) and returns what poisoned it.
    pub(crate) fn poison(&self, call: &'static str, code: CUresult) -> &Poison {
        self.first.get_or_init(|| {
            let k = self.last_kernel.load(Ordering::Relaxed);
            Poison {
                call,
                code,
                // SAFETY: a non-null pointer was stored from a `&'static KernelName`.
                kernel: (!k.is_null()).then(|| unsafe { (*k).0 }),
            }
        })
    }
}

/// The error for `device`, poisoned by `p`.
pub(crate) fn error(device: &Device, p: &Poison) -> Error {
    let (name, description) = Error::driver_names(p.code);
    Error::ContextPoisoned {
        device: device.ordinal(),
        first_call: p.call,
        code: p.code.into(),
        name,
        description,
        kernel: p.kernel.map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_codes() {
        assert!(is_sticky(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(is_sticky(CUresult::CUDA_ERROR_ASSERT));
        assert!(!is_sticky(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!is_sticky(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn interning_returns_one_name_per_string() {
        let a = intern("saxpy_poison_test");
        let b = intern("saxpy_poison_test");
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.0, "saxpy_poison_test");
        assert!(!std::ptr::eq(a, intern("other_poison_test")));
    }

    #[test]
    fn the_first_failure_wins_and_names_the_last_kernel() {
        let st = PoisonState::default();
        assert!(st.get().is_none());
        st.launching(intern("k1"));
        st.launching(intern("k2"));
        let p = st.poison("cuStreamSynchronize", CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(p.kernel, Some("k2"));
        let p = st.poison("cuMemAlloc_v2", CUresult::CUDA_ERROR_LAUNCH_FAILED);
        assert_eq!(p.call, "cuStreamSynchronize");
    }
}
