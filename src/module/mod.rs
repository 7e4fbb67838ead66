//! Kernels: NVRTC compilation, modules and functions (the overview is on [`Module`]).

mod function;
pub mod global;
pub(crate) mod image;
mod kernel_arg;
mod nvrtc;
pub mod options;
pub mod shared;

pub use function::{Function, FunctionAttributes, Kernel, PotentialBlockSize};
pub(crate) use function::{FunctionLimits, ModuleHold, ModuleRef, param_sizes};
pub(crate) use function::{check_block_size, func_attribute};
pub(crate) use kernel_arg::arg_access;
pub(crate) use kernel_arg::memory_arg;
pub use kernel_arg::{KernelArg, LaunchArg, WritableArg};
pub use nvrtc::{Output, compile, compile_with, nvrtc_available};
pub use options::{Arch, CompileOptions, CppStandard, cuda_include_dir};
pub use shared::SharedModule;

use crate::access::AccessTracker;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{CString, c_void};
use std::sync::Arc;

/// Loaded device code of one device.
///
/// Compiling with NVRTC, loading and launching:
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, LaunchConfig, ThreadContext};
/// const SRC: &str = r#"
/// extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned n) {
///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///     if (i < n) y[i] = a * x[i] + y[i];
/// }"#;
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// let module = gpu.compile_and_load(SRC, "saxpy.cu")?; // cubin for this device's arch
/// let saxpy = module.function("saxpy")?;
/// let x = gpu.clone_htod(&[1.0f32; 1000])?;
/// let mut y = gpu.clone_htod(&[2.0f32; 1000])?;
/// let n = 1000u32;
/// let stream = gpu.default_stream();
/// // SAFETY: the arguments match the kernel's signature and it stays in bounds.
/// unsafe {
///     stream.launch(&saxpy, LaunchConfig::for_num_elems(n))
///         .arg(&3.0f32).arg(&x).arg(&mut y).arg(&n)
///         .launch()?;
/// }
/// assert_eq!(gpu.dtoh(&y)?, vec![5.0f32; 1000]);
/// # Ok(()) }
/// ```
///
/// A [`Module`] is a resource like a slice (it holds `Arc<Device>` and outlives binds); a
/// [`Function`] borrows its module, so it cannot outlive it:
///
/// ```compile_fail,E0597
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// let f = {
///     let module = gpu.load_ptx(".version 8.0\n.target sm_90\n.address_size 64\n")?;
///     module.function("k")? // error[E0597]: `module` does not live long enough
/// };
/// # Ok(()) }
/// ```
///
/// The fix, where a kernel must outlive the scope or live in a struct: share the module
/// ([`Module::into_shared`]) and take a [`Kernel`] from it, which holds the module
/// ([`SharedModule`]):
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// let k: gpubind::Kernel = {
///     let module = gpu.load_ptx(".version 8.0\n.target sm_90\n.address_size 64\n")?;
///     module.into_shared().kernel("k")?
/// };
/// # Ok(()) }
/// ```
///
/// [`compile_and_load_with`](BoundDevice::compile_and_load_with) takes
/// [`CompileOptions`] (macros, include directories, fast math, the C++ standard, debug
/// information, the architecture): see [`CompileOptions`].
///
/// Launch arguments and the launch configuration are checked before the driver sees
/// them: see [`LaunchBuilder`](crate::LaunchBuilder) and [`LaunchConfig`](crate::LaunchConfig).
///
/// [`Function::attributes`] reports the kernel's registers, memory sizes and
/// architectures; [`Function::max_active_blocks_per_sm`] and
/// [`Function::max_potential_block_size`] are the driver's occupancy calculator.
/// The device limits are read once per [`Device`], the kernel's at
/// [`Module::function`]: a launch pays a few compares.
///
/// A module's `__device__` and `__constant__` variables are typed device memory through
/// [`Module::global`] ([`ModuleGlobal`](crate::ModuleGlobal)); cooperative, cluster and
/// prioritised launches are
/// [`LaunchBuilder::cooperative`](crate::LaunchBuilder::cooperative),
/// [`LaunchBuilder::cluster`](crate::LaunchBuilder::cluster) and
/// [`LaunchBuilder::priority`](crate::LaunchBuilder::priority)
/// ([`LaunchExBuilder`](crate::LaunchExBuilder)).
pub struct Module {
    pub(crate) device: Arc<Device>,
    pub(crate) raw: sys::CUmodule,
    /// The loaded image, shared with the module's globals ([`Module::global`]): unloaded
    /// when the module and every global view of it are gone, after their pending uses.
    pub(crate) loaded: Arc<Loaded>,
    /// Set by the first [`Module::global`] (under `&mut self`, so no launch of this
    /// module is being built meanwhile): from then on each launch claims
    /// `loaded.uses` as a write, since any kernel of the module may write any of its
    /// globals without being passed them.
    pub(crate) globals: bool,
}

/// A loaded `CUmodule`: what [`Module`] and its globals ([`ModuleGlobal`](crate::ModuleGlobal))
/// share, and whose drop unloads it.
pub(crate) struct Loaded {
    pub(crate) device: Arc<Device>,
    raw: sys::CUmodule,
    /// The pending uses of the module: its launches (as reads while it has no global
    /// views: launches stay concurrent; as writes once it has), and the copies and
    /// launches that name one of its globals. The unload waits for all of them.
    pub(crate) uses: AccessTracker,
}

// SAFETY: a CUmodule handle is a thread-agnostic identifier; it is unloaded once, in
// `Drop`, with its own context pushed.
unsafe impl Send for Loaded {}
// SAFETY: as above; `Loaded` itself is only read (the tracker has its own lock).
unsafe impl Sync for Loaded {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

// SAFETY: a CUmodule handle is a thread-agnostic identifier; gpubind calls the driver
// on it only with its own context pushed (function lookup, unload).
unsafe impl Send for Module {}
// SAFETY: as above; the driver makes module queries thread-safe.
unsafe impl Sync for Module {}

impl Module {
    /// The module's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Looks up the kernel `name` (an `extern "C"` name, or the mangled one), borrowed
    /// from the module; [`SharedModule::kernel`] gives one that holds it.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        lookup(ModuleRef::Borrowed(self), name)
    }

    /// Shares the module (an `Arc`, cheap to clone) so that kernels can hold it
    /// ([`SharedModule::kernel`]). Look its globals up first ([`Module::global`] needs
    /// `&mut Module`, which a shared module never gives).
    pub fn into_shared(self) -> SharedModule {
        SharedModule::from(self)
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not unload it.
    pub unsafe fn raw(&self) -> sys::CUmodule {
        self.raw
    }

    /// Gives the loaded module up to the caller: its raw handle, which the caller must
    /// unload in its context (or leave to the context's end). `None` while a global view
    /// of it lives (the module is then dropped as usual). A launch made through the
    /// `Module` would no longer be waited for: call this before any.
    #[cfg_attr(not(feature = "collective"), allow(dead_code))]
    pub(crate) fn into_raw(self) -> Option<sys::CUmodule> {
        let Module { loaded, raw, .. } = self;
        let mut loaded = Arc::try_unwrap(loaded).ok()?;
        loaded.raw = std::ptr::null_mut();
        Some(raw)
    }
}

/// `cuModuleGetFunction` of `name` in `module`, with the kernel's limits and parameter
/// sizes.
fn lookup<'m>(module: ModuleRef<'m>, name: &str) -> Result<Function<'m>> {
    let cname = CString::new(name)
        .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} contains NUL")))?;
    let _guard = module.device.enter()?;
    // SAFETY: a loaded module (`module` keeps it loaded), its context current.
    // A sticky error seen here poisons the device like any other call on its context.
    let device = &module.device;
    let raw =
        device.check(unsafe { crate::driver::result::module::get_function(module.raw, &cname) })?;
    use sys::CUfunction_attribute as A;
    let limits = FunctionLimits {
        max_threads_per_block: device.check(func_attribute(
            raw,
            A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        ))?,
        static_shared: device.check(func_attribute(raw, A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES))?,
    };
    let globals = module.globals;
    Ok(Function {
        module,
        raw,
        name: name.to_owned(),
        interned: crate::device::poison::intern(name),
        globals,
        params: param_sizes(raw),
        limits,
    })
}

// A graph holding a `Kernel`'s launches holds its loaded module (`crate::graph`'s
// `Owned`): its tracker orders the graph's launches, and its drop waits for them.
impl crate::graph::Owned for Loaded {
    fn tracker(&self) -> &AccessTracker {
        &self.uses
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if self.raw.is_null() {
            // Handed over by `Module::into_raw`: no longer ours to unload.
            return;
        }
        // Unload only once no launched kernel (and no copy of a global) can still run; if
        // that cannot be known (a faulted context), leak the module instead (and log it).
        let waited = self.uses.wait_all();
        let raw = self.raw as usize;
        crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a Module"),
                device: &self.device,
                waited,
                call: "cuModuleUnload",
                runs: crate::teardown::Runs::OnReleaseThread,
            },
            move || {
                // SAFETY: loaded in this context (current while this runs), unloaded once
                // here, after every kernel launched from it and every copy of one of its
                // globals has finished (run only after the wait succeeded); no Function
                // outlives this `Loaded` (a borrowed one borrows its `Module`, a `Kernel`
                // holds it, and a `Module` holds the Arc), and neither does a global view
                // or a graph of a `Kernel`'s launches (each holds the Arc).
                unsafe { crate::driver::result::module::unload(raw as sys::CUmodule) }
            },
        );
    }
}

impl<'a> BoundDevice<'a> {
    /// Loads PTX text (JIT-compiled by the driver for this device).
    pub fn load_ptx(&self, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx)
            .map_err(|_| Error::InvalidArgument("PTX contains a NUL byte".into()))?;
        // SAFETY: `text` is NUL-terminated and alive for the call, so the driver, which
        // reads PTX up to its NUL, stays inside it.
        unsafe { self.load_image(text.as_ptr().cast()) }
    }

    /// Loads a cubin (ELF64, as NVRTC or `nvcc -cubin` write) or fatbin image.
    ///
    /// The driver is given only a pointer (`cuModuleLoadData`) and learns the image's
    /// length from its headers, so the image is validated first: an ELF's header,
    /// section and program tables, every section's and segment's bytes, its string
    /// tables and the symbol and relocation indices must lie inside `image`; a fatbin's
    /// header, contents and every entry likewise (an uncompressed ELF entry is checked as
    /// a cubin). Anything else — including PTX, which goes through
    /// [`load_ptx`](Self::load_ptx) — is [`Error::InvalidArgument`], before any driver
    /// call:
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) {
    /// use gpubind::Error;
    /// let cut_short = [0x7f, b'E', b'L', b'F', 2, 1, 1, 0]; // an ELF header's first bytes
    /// assert!(matches!(gpu.load_cubin(&cut_short), Err(Error::InvalidArgument(_))));
    /// # }
    /// ```
    ///
    /// The contents of NVIDIA-specific sections (code, `.nv.info` records) are the
    /// driver's to check, inside the bounds validated here.
    pub fn load_cubin(&self, image: &[u8]) -> Result<Module> {
        crate::module::image::validate(image)?;
        // SAFETY: `validate` checked that every structure the image's headers describe
        // (and so every byte the driver reads) lies inside `image`, which is alive for
        // the call.
        unsafe { self.load_image(image.as_ptr().cast()) }
    }

    /// `cuModuleLoadData` in this device's primary context.
    ///
    /// # Safety
    ///
    /// `image` must point to a NUL-terminated PTX string or to a cubin/fatbin whose
    /// headers describe only bytes that are readable for the length of the call.
    unsafe fn load_image(&self, image: *const c_void) -> Result<Module> {
        self.ensure_current()?;
        // SAFETY: the bound context is current (just checked); `image` is readable as
        // far as its format says (the caller's contract); the module is unloaded once,
        // by `Loaded`'s drop.
        let raw = self
            .device()
            .check(unsafe { crate::driver::result::module::load_data(image) })?;
        Ok(Module {
            device: Arc::clone(self.device()),
            raw,
            loaded: Arc::new(Loaded {
                device: Arc::clone(self.device()),
                raw,
                uses: AccessTracker::default(),
            }),
            globals: false,
        })
    }

    /// Compiles CUDA C++ with NVRTC for this device's architecture and loads it, with
    /// the default [`CompileOptions`]. `name` labels errors. See
    /// [`compile_and_load_with`](Self::compile_and_load_with).
    pub fn compile_and_load(&self, src: &str, name: &str) -> Result<Module> {
        self.compile_and_load_with(src, name, &CompileOptions::default())
    }

    /// Compiles CUDA C++ with NVRTC and `options` ([`CompileOptions`]: macros,
    /// include directories, fast math, …; the toolkit's headers are found on their own)
    /// and loads it. `name` labels errors.
    ///
    /// Unless the options name an architecture ([`CompileOptions::arch`]), it is a cubin
    /// for this device's `sm_XY`, so nothing is JIT-compiled at load. An NVRTC older
    /// than the GPU (one whose `nvrtcGetSupportedArchs` lacks `sm_XY`) compiles PTX for
    /// the newest architecture it knows below the device's instead (`compute_XY`), which
    /// the driver JIT-compiles for the device at load. A device older than every
    /// architecture the NVRTC supports is [`Error::Compile`] naming the supported range.
    /// Which NVRTC is used: [`nvrtc_info`](crate::nvrtc_info) (never a newer major version than the
    /// driver's; PTX from an NVRTC of a newer *minor* version than the driver can still be
    /// refused at load, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, where a cubin would load).
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// use gpubind::CompileOptions;
    /// const SRC: &str = r#"
    /// #include <cuda_fp16.h>
    /// extern "C" __global__ void add(__half* x, unsigned n) {
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) x[i] = __hadd(x[i], __float2half(STEP));
    /// }"#;
    /// let opts = CompileOptions::new().define("STEP", "0.5f").fast_math(true);
    /// let module = gpu.compile_and_load_with(SRC, "add.cu", &opts)?;
    /// # Ok(()) }
    /// ```
    pub fn compile_and_load_with(
        &self,
        src: &str,
        name: &str,
        options: &CompileOptions,
    ) -> Result<Module> {
        let arch = match options.target_arch() {
            Some(arch) => arch,
            None => self.default_arch(name)?,
        };
        let image = compile_with(src, name, &options.clone().arch(arch), arch.output())?;
        match arch {
            Arch::Sm(_) => self.load_cubin(&image),
            Arch::Compute(_) => {
                let ptx = String::from_utf8(image).map_err(|_| Error::Compile {
                    program: name.into(),
                    status: "PTX is not UTF-8".into(),
                    log: String::new(),
                })?;
                self.load_ptx(&ptx)
            }
        }
    }

    /// The architecture NVRTC compiles this device's kernels for when the options name
    /// none: `sm_XY` of the device, or `compute_XY` of the newest one an older NVRTC knows.
    fn default_arch(&self, name: &str) -> Result<Arch> {
        let (major, minor) = self.device().compute_capability()?;
        let cc = i32::try_from(major * 10 + minor).unwrap_or(i32::MAX);
        let nvrtc = crate::driver::libraries::nvrtc()?;
        let target = crate::driver::libraries::pick_target(nvrtc.supported_archs().as_deref(), cc)
            .map_err(|log| Error::Compile {
                program: name.into(),
                status: format!("no target for sm_{cc}"),
                log,
            })?;
        Ok(match target {
            crate::driver::libraries::Target::Cubin(a) => Arch::Sm(a.max(0) as u32),
            crate::driver::libraries::Target::Ptx(a) => Arch::Compute(a.max(0) as u32),
        })
    }
}
