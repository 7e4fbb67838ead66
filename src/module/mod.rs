//! Kernels: NVRTC compilation, modules, functions and launches.
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, LaunchConfig, ThreadContext};
//! const SRC: &str = r#"
//! extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned n) {
//!     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
//!     if (i < n) y[i] = a * x[i] + y[i];
//! }"#;
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let module = gpu.compile_and_load(SRC, "saxpy.cu")?; // cubin for this device's arch
//! let saxpy = module.function("saxpy")?;
//! let x = gpu.clone_htod(&[1.0f32; 1000])?;
//! let mut y = gpu.clone_htod(&[2.0f32; 1000])?;
//! let n = 1000u32;
//! let stream = gpu.default_stream();
//! // SAFETY: the arguments match the kernel's signature and it stays in bounds.
//! unsafe {
//!     stream.launch(&saxpy, LaunchConfig::for_num_elems(n))
//!         .arg(&3.0f32).arg(&x).arg(&mut y).arg(&n)
//!         .launch()?;
//! }
//! assert_eq!(gpu.dtoh(&y)?, vec![5.0f32; 1000]);
//! # Ok(()) }
//! ```
//!
//! A [`Module`] is a resource like a slice (it holds `Arc<Device>` and outlives binds); a
//! [`Function`] borrows its module, so it cannot outlive it:
//!
//! ```compile_fail,E0597
//! # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
//! let f = {
//!     let module = gpu.load_ptx(".version 8.0\n.target sm_90\n.address_size 64\n")?;
//!     module.function("k")? // error[E0597]: `module` does not live long enough
//! };
//! # Ok(()) }
//! ```
//!
//! Launch arguments are checked against the kernel's parameter list where the driver
//! reports it (`cuFuncGetParamInfo`, CUDA 12.4+; older drivers, or a version capped
//! below 12.4 with `GPUBIND_ASSUME_DRIVER_VERSION`, skip the check): a wrong count or a wrong size is
//! [`Error::LaunchArgs`], a slice of another device is [`Error::WrongDevice`].
//!
//! The launch configuration is checked against the device's and the kernel's limits
//! before the driver sees it: threads per block (the device's, and the kernel's own,
//! lower for kernels with many registers or `__launch_bounds__`), each block and grid
//! dimension, and static plus dynamic shared memory. Over a limit is
//! [`Error::LaunchLimit`], naming the limit. Dynamic shared memory above the default
//! per-block amount (48 KiB) needs the kernel's opt-in: raise
//! `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` with
//! [`Function::set_max_dynamic_shared_memory`] (or `cuFuncSetAttribute` on
//! [`Function::raw`]); gpubind reads the attribute at such a launch, so a raise is seen.
//!
//! [`Function::attributes`] reports the kernel's registers, memory sizes and
//! architectures; [`Function::max_active_blocks_per_sm`] and
//! [`Function::max_potential_block_size`] are the driver's occupancy calculator.
//! The device limits are read once per [`Device`], the kernel's at
//! [`Module::function`]: a launch pays a few compares.
//!
//! A module's `__device__` and `__constant__` variables are typed device memory through
//! [`Module::global`] ([`crate::module::global`]); cooperative, cluster and prioritised launches
//! are [`LaunchBuilder::cooperative`], [`LaunchBuilder::cluster`] and
//! [`LaunchBuilder::priority`] ([`crate::launch`]).

mod function;
pub mod global;
pub(crate) mod image;
mod kernel_arg;
mod nvrtc;

pub use function::{Function, FunctionAttributes, PotentialBlockSize};
pub(crate) use function::{FunctionLimits, param_sizes};
pub(crate) use function::{check_block_size, func_attribute};
pub(crate) use kernel_arg::arg_access;
pub(crate) use kernel_arg::memory_arg;
pub use kernel_arg::{KernelArg, LaunchArg};
pub use nvrtc::{Output, compile, nvrtc_available};

use crate::access::AccessTracker;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::Check;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{CString, c_void};
use std::sync::Arc;

/// Loaded device code of one device.
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

    /// Looks up the kernel `name` (an `extern "C"` name, or the mangled one).
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?} contains NUL")))?;
        let _guard = self.device.enter()?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: valid module; its context is current; writes one handle.
        unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, cname.as_ptr()) }
            .check("cuModuleGetFunction")?;
        use sys::CUfunction_attribute as A;
        let limits = FunctionLimits {
            max_threads_per_block: func_attribute(raw, A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            static_shared: func_attribute(raw, A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        };
        Ok(Function {
            module: self,
            raw,
            name: name.to_owned(),
            interned: crate::device::poison::intern(name),
            uses: &self.loaded.uses,
            globals: self.globals,
            params: param_sizes(raw),
            limits,
        })
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while `self` lives; do not unload it.
    pub unsafe fn raw(&self) -> sys::CUmodule {
        self.raw
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Unload only once no launched kernel (and no copy of a global) can still run; if
        // that cannot be known (a faulted context), leak the module instead (and log it).
        let waited = self.uses.wait_all();
        let raw = self.raw as usize;
        crate::teardown::faults::release_bounded(
            format_args!("a Module"),
            &self.device,
            waited,
            "cuModuleUnload",
            Box::new(move || {
                // SAFETY: loaded in this context (current while this runs), unloaded once
                // here, after every kernel launched from it and every copy of one of its
                // globals has finished (run only after the wait succeeded); no Function
                // outlives the module (they borrow it), and no global view outlives this
                // `Loaded` (each holds the Arc).
                unsafe { sys::cuModuleUnload(raw as sys::CUmodule) }
            }),
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
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the bound context is current (just checked); `image` is readable as
        // far as its format says (the caller's contract); writes one handle.
        unsafe { sys::cuModuleLoadData(&mut raw, image) }.check("cuModuleLoadData")?;
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

    /// Compiles CUDA C++ with NVRTC for this device's architecture and loads it. `name`
    /// labels errors.
    ///
    /// Normally a cubin for `sm_XY`, so nothing is JIT-compiled at load. An NVRTC older
    /// than the GPU (one whose `nvrtcGetSupportedArchs` lacks `sm_XY`) compiles PTX for
    /// the newest architecture it knows below the device's instead (`compute_XY`), which
    /// the driver JIT-compiles for the device at load. A device older than every
    /// architecture the NVRTC supports is [`Error::Compile`] naming the supported range.
    /// Which NVRTC is used: [`crate::driver::libraries`] (never a newer major version than the
    /// driver's; PTX from an NVRTC of a newer *minor* version than the driver can still be
    /// refused at load, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, where a cubin would load).
    pub fn compile_and_load(&self, src: &str, name: &str) -> Result<Module> {
        let (major, minor) = self.device().compute_capability()?;
        let cc = i32::try_from(major * 10 + minor).unwrap_or(i32::MAX);
        let nvrtc = crate::driver::libraries::nvrtc()?;
        let target = crate::driver::libraries::pick_target(nvrtc.supported_archs().as_deref(), cc)
            .map_err(|log| Error::Compile {
                program: name.into(),
                status: format!("no target for sm_{cc}"),
                log,
            })?;
        match target {
            crate::driver::libraries::Target::Cubin(arch) => {
                let cubin = compile(
                    src,
                    name,
                    &[format!("--gpu-architecture=sm_{arch}")],
                    Output::Cubin,
                )?;
                self.load_cubin(&cubin)
            }
            crate::driver::libraries::Target::Ptx(arch) => {
                let ptx = compile(
                    src,
                    name,
                    &[format!("--gpu-architecture=compute_{arch}")],
                    Output::Ptx,
                )?;
                let ptx = String::from_utf8(ptx).map_err(|_| Error::Compile {
                    program: name.into(),
                    status: "PTX is not UTF-8".into(),
                    log: String::new(),
                })?;
                self.load_ptx(&ptx)
            }
        }
    }
}
