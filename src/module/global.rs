//! [`ModuleGlobal`]: typed views of a module's variables; documented on the type.

use crate::access::AccessTracker;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceRepr, private};
use crate::module::{KernelArg, Loaded, Module};
use cudarc::driver::sys;
use std::ffi::{CString, c_void};
use std::marker::PhantomData;
use std::sync::Arc;

/// A typed view of one `__device__` or `__constant__` variable of a [`Module`]; see the
/// [`Module::global`](crate::Module::global). Needs no binding to move, clone or drop; `Send + Sync`.
///
/// [`Module::global`] looks a variable up by name (`cuModuleGetGlobal_v2`) and returns a
/// [`ModuleGlobal<T>`]: `len` elements of `T` at the variable's device address, checked
/// against the variable's size (a whole, non-zero number of elements, at an address
/// aligned for `T`; else [`Error::GlobalType`]; a name the module lacks is
/// [`Error::GlobalNotFound`]). It is device memory like a [`DeviceSlice`](crate::DeviceSlice):
/// it works with every copy ([`BoundDevice::copy`](crate::BoundDevice::copy),
/// [`htod_copy`](crate::BoundDevice::htod_copy), [`dtoh`](crate::BoundDevice::dtoh),
/// [`dtod`](crate::BoundDevice::dtod), the memsets,
/// [`BoundStream::copy_async`](crate::BoundStream::copy_async),
/// [`copy_scope`](crate::BoundStream::copy_scope): it is a
/// [`CopySource`](crate::CopySource) and [`CopyDest`](crate::CopyDest)) and as a kernel
/// argument (passed as its address). It cannot be lent to cudarc
/// ([`BoundStream::lend_to_cudarc`](crate::BoundStream::lend_to_cudarc) is
/// [`Error::InvalidArgument`]): copy it into a `DeviceSlice` first.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, LaunchConfig, ThreadContext};
/// const SRC: &str = r#"
/// __constant__ float scale[4];
/// __device__ unsigned calls;
/// extern "C" __global__ void apply(float* x, unsigned n) {
///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///     if (i < n) { x[i] *= scale[i % 4]; atomicAdd(&calls, 1u); }
/// }"#;
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let mut module = gpu.compile_and_load(SRC, "apply.cu")?;
/// let mut scale = module.global::<f32>("scale")?; // 4 elements
/// let calls = module.global::<u32>("calls")?;
/// gpu.copy(&[1.0f32, 2.0, 3.0, 4.0][..], &mut scale)?; // host → __constant__
/// let apply = module.function("apply")?;
/// let mut x = gpu.clone_htod(&[1.0f32; 8])?;
/// // SAFETY: (float*, unsigned) matches `apply`, which stays in bounds.
/// unsafe {
///     gpu.default_stream().launch(&apply, LaunchConfig::for_num_elems(8))
///         .arg(&mut x).arg(&8u32).launch()?;
/// }
/// assert_eq!(gpu.dtoh(&x)?, [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
/// assert_eq!(gpu.dtoh(&calls)?, [8]); // waits for the kernel that wrote it
/// # Ok(()) }
/// ```
///
/// # Ordering
///
/// A kernel reaches its module's globals by name, without being passed them, so a
/// launch cannot say which globals it uses. All views of one module therefore share one
/// access tracker with the module's launches, and once a module has a view (the first
/// [`Module::global`]) every launch of its kernels is claimed as a **write** of that
/// tracker, like a buffer argument: a copy into a global waits for the kernels before
/// it, a launch waits for the copies into globals before it (on any stream), and a read
/// of a global (`dtoh`, a copy out) sees what kernels wrote. The cost: kernels of such a
/// module no longer overlap across streams (they stay concurrent within a stream's
/// order, and kernels of other modules are unaffected). A module without views keeps the
/// ordinary launch path: its launches are recorded as reads and overlap freely.
///
/// The first `global` takes `&mut Module`: no `Function` of the module (and so no launch
/// being built) exists while it switches the module to this mode, so no launch can slip
/// between the switch and its claim. Kernels launched before stay recorded and are
/// treated as writes too. Look globals up right after loading, before the functions:
///
/// ```compile_fail,E0502
/// # fn f(gpu: &gpubind::BoundDevice<'_>, src: &str) -> gpubind::Result<()> {
/// let mut module = gpu.compile_and_load(src, "k.cu")?;
/// let k = module.function("k")?;
/// let g = module.global::<u32>("g")?; // error[E0502]: `module` is also borrowed as immutable
/// drop(k);
/// # Ok(()) }
/// ```
///
/// # Lifetime
///
/// A view holds the loaded module (an `Arc` shared with the [`Module`]) rather than
/// borrowing it: the module's unload frees its globals, so it happens only once the
/// `Module` *and* every view are gone, after every pending use of either (a faulted
/// context leaks the module instead, as for every drop). A view never dangles, and
/// looking globals up does not keep the module borrowed.
///
/// # `__constant__` memory
///
/// Constant memory is written from the host (any copy into the view) and is read-only
/// for kernels: CUDA C++ refuses a kernel assignment to a `__constant__` variable, and
/// writing it through a pointer (the view passed as an argument) is outside
/// [`LaunchBuilder::launch`](crate::LaunchBuilder::launch)'s contract. `__device__`
/// variables are ordinary global memory, readable and writable by both.
pub struct ModuleGlobal<T: DeviceRepr> {
    /// The loaded module: keeps the variable's memory alive, and its tracker orders
    /// the variable's uses with the module's launches.
    loaded: Arc<Loaded>,
    pub(crate) ptr: sys::CUdeviceptr,
    len: usize,
    name: Arc<str>,
    _t: PhantomData<T>,
}

impl<T: DeviceRepr> Clone for ModuleGlobal<T> {
    /// Another view of the same variable, ordered through the same tracker.
    fn clone(&self) -> Self {
        ModuleGlobal {
            loaded: Arc::clone(&self.loaded),
            ptr: self.ptr,
            len: self.len,
            name: Arc::clone(&self.name),
            _t: PhantomData,
        }
    }
}

impl<T: DeviceRepr> std::fmt::Debug for ModuleGlobal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleGlobal")
            .field("name", &self.name)
            .field("device", &self.loaded.device.ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: DeviceRepr> ModuleGlobal<T> {
    /// The variable's name, as looked up.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> &Arc<Device> {
        &self.loaded.device
    }

    /// Number of elements (the variable's size over `size_of::<T>()`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a variable has at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The variable's device address.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; work done through it is not ordered by gpubind (as for
    /// [`DeviceSlice::raw_ptr`](crate::DeviceSlice::raw_ptr)).
    pub unsafe fn raw_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl<T: DeviceRepr> private::Sealed for ModuleGlobal<T> {
    fn tracker(&self) -> &AccessTracker {
        &self.loaded.uses
    }
}

impl<T: DeviceRepr> DeviceMemory<T> for ModuleGlobal<T> {
    fn device(&self) -> &Arc<Device> {
        &self.loaded.device
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl<T: DeviceRepr> DeviceMemoryMut<T> for ModuleGlobal<T> {
    /// `None`: the tracker is shared with the module's launches and other views.
    fn tracker_mut(&mut self) -> Option<&mut AccessTracker> {
        None
    }
    fn shares_tracker(&self) -> bool {
        true
    }
}

crate::module::memory_arg!(ModuleGlobal);

/// The number of `T`s (`size` bytes each, aligned to `align`) a variable of `bytes` bytes
/// at `addr` holds, or why it cannot be viewed so.
pub(crate) fn global_len(
    name: &str,
    element: &'static str,
    size: usize,
    align: usize,
    bytes: usize,
    addr: u64,
) -> Result<usize> {
    let refuse = |reason: String| Error::GlobalType {
        name: name.to_owned(),
        element,
        reason,
    };
    if size == 0 {
        return Err(refuse("the element type has size 0".into()));
    }
    if bytes == 0 || !bytes.is_multiple_of(size) {
        return Err(refuse(format!(
            "the variable is {bytes} bytes, not a whole non-zero number of {size}-byte elements"
        )));
    }
    if !addr.is_multiple_of(align as u64) {
        return Err(refuse(format!(
            "its address {addr:#x} is not {align}-byte aligned"
        )));
    }
    Ok(bytes / size)
}

impl Module {
    /// A typed view of the module's `__device__` or `__constant__` variable `name` (its
    /// name at namespace scope, or its mangled name), as `len` elements of `T`: an array
    /// `float x[4]` is `global::<f32>("x")` (4 elements) or `global::<[f32; 4]>("x")`
    /// (one). See [`ModuleGlobal`] for how it is ordered and
    /// how long it lives.
    ///
    /// [`Error::GlobalNotFound`] if the module has no such variable;
    /// [`Error::GlobalType`] if its size is not a whole, non-zero number of `T`s or its
    /// address is not aligned for `T`; [`Error::InvalidArgument`] for a name with a NUL.
    ///
    /// Takes `&mut self` (the view does not keep it borrowed): the first call switches
    /// the module's launches to writes of its globals, which must not race a launch.
    pub fn global<T: DeviceRepr>(&mut self, name: &str) -> Result<ModuleGlobal<T>> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("global name {name:?} contains NUL")))?;
        let found = {
            let _guard = self.loaded.device.enter()?;
            // SAFETY: a loaded module of the current context.
            unsafe { crate::driver::result::module::get_global(self.raw, &cname) }
        };
        let not_found = |e: &Error| {
            e.driver_code().map(|c| c.as_cudarc()) == Some(sys::CUresult::CUDA_ERROR_NOT_FOUND)
        };
        let (ptr, bytes) = match found {
            Err(e) if not_found(&e) => {
                return Err(Error::GlobalNotFound {
                    name: name.to_owned(),
                });
            }
            other => self.loaded.device.check(other)?,
        };
        let len = global_len(
            name,
            std::any::type_name::<T>(),
            std::mem::size_of::<T>(),
            std::mem::align_of::<T>(),
            bytes,
            ptr,
        )?;
        if !self.globals {
            // `&mut self`: no launch of this module is being built, so none can be
            // enqueued between this and the switch. The launches recorded so far (as
            // reads) may have written globals: from now on they count as writes.
            self.loaded.uses.reads_become_writes();
            self.globals = true;
        }
        Ok(ModuleGlobal {
            loaded: Arc::clone(&self.loaded),
            ptr,
            len,
            name: name.into(),
            _t: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<usize>) -> String {
        match r {
            Err(Error::GlobalType { reason, .. }) => reason,
            other => panic!("not a GlobalType: {other:?}"),
        }
    }

    #[test]
    fn element_count_and_alignment_are_checked_against_the_symbol() {
        // float x[4] at an aligned address: 4 f32, 1 [f32; 4], 2 u64, 16 u8.
        assert_eq!(global_len("x", "f32", 4, 4, 16, 0x1000), Ok(4));
        assert_eq!(global_len("x", "[f32; 4]", 16, 4, 16, 0x1000), Ok(1));
        assert_eq!(global_len("x", "u64", 8, 8, 16, 0x1000), Ok(2));
        assert_eq!(global_len("x", "u8", 1, 1, 16, 0x1003), Ok(16));
        // Not a whole number of elements, either way round.
        let r = reason(global_len("x", "[u8; 3]", 3, 1, 16, 0x1000));
        assert!(r.contains("16 bytes") && r.contains("3-byte"), "{r}");
        let r = reason(global_len("c", "u64", 8, 8, 4, 0x1000));
        assert!(r.contains("4 bytes") && r.contains("8-byte"), "{r}");
        // A zero-sized element type, and a (driver-reported) empty variable.
        assert!(reason(global_len("x", "[u8; 0]", 0, 1, 16, 0x1000)).contains("size 0"));
        assert!(reason(global_len("x", "u8", 1, 1, 0, 0x1000)).contains("0 bytes"));
        // An address not aligned for the element type.
        let r = reason(global_len("b", "u32", 4, 4, 8, 0x1002));
        assert!(r.contains("0x1002") && r.contains("4-byte aligned"), "{r}");
        let e = global_len("coeffs", "u64", 8, 8, 12, 0x1000).unwrap_err();
        assert_eq!(
            e.to_string(),
            "global `coeffs` cannot be viewed as u64: the variable is 12 bytes, not a whole \
             non-zero number of 8-byte elements"
        );
    }
}
