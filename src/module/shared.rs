//! [`SharedModule`] and its owning [`Kernel`]s; documented on [`SharedModule`].

use super::{Function, Kernel, Module, ModuleRef};
use crate::error::Result;
use std::sync::Arc;

/// A [`Module`] shared by `Arc`: cheap to clone, and the source of [`Kernel`]s that hold
/// it. Dereferences to the `Module` (for [`Module::function`], [`Module::device`], …),
/// but never mutably: see below for globals.
///
/// A [`Function`] borrows its [`Module`], so a struct cannot hold a
/// module and its kernels together. A shared module can: its [`kernel`](SharedModule::kernel)s
/// each hold the module, are `'static`, `Send + Sync` and cheap to clone, and work
/// wherever a `&Function` does (they *are* `Function<'static>`):
///
/// ```no_run
/// use gpubind::{BoundDevice, DeviceSlice, Kernel, LaunchConfig};
///
/// struct Scaler {
///     scale: Kernel, // no module field needed: the kernel holds it
/// }
///
/// impl Scaler {
///     fn new(gpu: &BoundDevice<'_>) -> gpubind::Result<Self> {
///         let module = gpu.compile_and_load(
///             r#"extern "C" __global__ void scale(float* x, float a, unsigned n) {
///                 unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///                 if (i < n) x[i] *= a;
///             }"#,
///             "scale.cu",
///         )?;
///         Ok(Scaler { scale: module.into_shared().kernel("scale")? })
///     }
///
///     fn run(&self, gpu: &BoundDevice<'_>, x: &mut DeviceSlice<f32>, a: f32) -> gpubind::Result<()> {
///         let n = x.len() as u32;
///         // SAFETY: (float*, float, unsigned) matches `scale`, which stays in bounds.
///         unsafe {
///             gpu.default_stream()
///                 .launch(&self.scale, LaunchConfig::for_num_elems(n))
///                 .arg(x).arg(&a).arg(&n)
///                 .launch()
///         }
///     }
/// }
/// ```
///
/// # Unload
///
/// The module is unloaded when its last handle is gone — the `SharedModule` clones, the
/// kernels, the [`ModuleGlobal`](crate::ModuleGlobal) views and the graphs that captured
/// a kernel's launch — after every launch of its kernels has finished, as for a
/// [`Module`]. Dropping the `SharedModule` first is fine.
///
/// # Globals
///
/// [`Module::global`] takes `&mut Module`: a module's launches are ordered as reads
/// until it has a global view, as writes after, and the switch must not happen while a
/// launch of it is being built. A shared module is never available as `&mut`, so its
/// globals are looked up on the [`Module`] before sharing it:
///
/// ```compile_fail,E0596
/// # fn f(gpu: &gpubind::BoundDevice<'_>, src: &str) -> gpubind::Result<()> {
/// let shared = gpu.compile_and_load(src, "k.cu")?.into_shared();
/// let k = shared.kernel("k")?;
/// let g = shared.global::<u32>("g")?; // error[E0596]: cannot borrow data in dereference of `SharedModule` as mutable
/// # Ok(()) }
/// ```
///
/// The fix:
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, src: &str) -> gpubind::Result<()> {
/// let mut module = gpu.compile_and_load(src, "k.cu")?;
/// let g = module.global::<u32>("g")?; // the view holds the loaded module too
/// let k = module.into_shared().kernel("k")?; // its launches are ordered with `g`'s uses
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedModule(Arc<Module>);

impl SharedModule {
    /// Looks up the kernel `name` (an `extern "C"` name, or the mangled one), as a
    /// [`Kernel`] holding this module.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        super::lookup(ModuleRef::Shared(Arc::clone(&self.0)), name)
    }
}

impl From<Module> for SharedModule {
    fn from(module: Module) -> Self {
        SharedModule(Arc::new(module))
    }
}

impl std::ops::Deref for SharedModule {
    type Target = Module;
    fn deref(&self) -> &Module {
        &self.0
    }
}

impl std::fmt::Debug for SharedModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedModule").field(&*self.0).finish()
    }
}

impl Function<'static> {
    /// The module this kernel holds, as a [`SharedModule`] handle; `None` for a function
    /// borrowed from a `&'static Module`.
    pub fn shared_module(&self) -> Option<SharedModule> {
        match &self.module {
            ModuleRef::Shared(m) => Some(SharedModule(Arc::clone(m))),
            ModuleRef::Borrowed(_) => None,
        }
    }
}
