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
//! [`Module::global`] ([`crate::global`]); cooperative, cluster and prioritised launches
//! are [`LaunchBuilder::cooperative`], [`LaunchBuilder::cluster`] and
//! [`LaunchBuilder::priority`] ([`crate::launch`]).

use crate::access::{self, Access, AccessTracker, Use};
use crate::context::BoundDevice;
use crate::device::{Device, DeviceLimits};
use crate::driver::Check;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut};
use crate::poison::KernelName;
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::ffi::{CString, c_void};
use std::sync::Arc;

/// Loaded device code of one device.
pub struct Module {
    device: Arc<Device>,
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

// SAFETY: a CUfunction handle is a thread-agnostic identifier; launching needs a
// BoundStream of the module's device on the launching thread.
unsafe impl Send for Function<'_> {}
// SAFETY: as above; Function has no interior mutability.
unsafe impl Sync for Function<'_> {}

/// One kernel of a [`Module`], borrowed from it.
#[derive(Clone)]
pub struct Function<'m> {
    module: &'m Module,
    raw: sys::CUfunction,
    name: String,
    /// The name, interned: what a launch records as the device's last kernel (one atomic
    /// store), for `Error::ContextPoisoned`.
    interned: &'static KernelName,
    /// Parameter sizes in bytes, where the driver can report them.
    params: Option<Vec<usize>>,
    /// The kernel's own launch limits, read once at lookup.
    limits: FunctionLimits,
    /// The module's tracker (`Loaded::uses`), borrowed from it.
    uses: &'m AccessTracker,
    /// Whether the module had global views at lookup. It cannot change while this
    /// `Function` lives: [`Module::global`] takes `&mut Module`, this borrows it.
    globals: bool,
}

impl std::fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("device", &self.module.device.ordinal())
            .field("param_sizes", &self.params)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The launch limits of one kernel that do not change after it is loaded, read by
/// [`Module::function`] (`cuFuncGetAttribute`).
///
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` is not kept: code holding the raw
/// handle may raise it (`cuFuncSetAttribute`) at any time, so a launch that needs more
/// than the default reads it then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FunctionLimits {
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`: at most the device's, fewer for a kernel
    /// whose registers (or `__launch_bounds__`) allow fewer threads.
    pub(crate) max_threads_per_block: u32,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: the kernel's static shared memory.
    pub(crate) static_shared: u32,
}

/// `cuFuncGetAttribute`. The function's context must be current.
pub(crate) fn func_attribute(
    func: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> Result<u32> {
    let mut v = 0;
    // SAFETY: a valid function handle of the current context; writes one int.
    unsafe { sys::cuFuncGetAttribute(&mut v, attr, func) }.check("cuFuncGetAttribute")?;
    Ok(v.max(0) as u32)
}

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
            interned: crate::poison::intern(name),
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
        crate::faults::release_bounded(
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

/// The kernel's parameter sizes, from `cuFuncGetParamInfo` (CUDA 12.4+, looked up by
/// version: see `crate::compat`), or `None` if the driver cannot tell.
fn param_sizes(func: sys::CUfunction) -> Option<Vec<usize>> {
    // SAFETY: `FuncGetParamInfo` is cuFuncGetParamInfo's prototype
    // (CUfunction, size_t, size_t*, size_t*) -> CUresult.
    let get_param_info =
        unsafe { crate::compat::FUNC_GET_PARAM_INFO.get::<crate::compat::FuncGetParamInfo>() }
            .ok()?;
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: valid function handle; writes two size_t. Past the last parameter the
        // driver returns CUDA_ERROR_INVALID_VALUE, which ends the loop.
        let r = unsafe { get_param_info(func, sizes.len(), &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Some(sizes),
            _ => return None,
        }
        if sizes.len() > 4096 {
            return None;
        }
    }
}

impl<'m> Function<'m> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module this function belongs to.
    pub fn module(&self) -> &'m Module {
        self.module
    }

    /// The raw handle, for gpubind's own calls (valid while the module lives).
    pub(crate) fn raw_handle(&self) -> sys::CUfunction {
        self.raw
    }

    /// The kernel's launch limits read at lookup.
    pub(crate) fn limits(&self) -> &FunctionLimits {
        &self.limits
    }

    /// Parameter sizes in bytes, if the driver reports them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// The raw handle (e.g. for `cuFuncSetAttribute` with
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, which launches honour).
    ///
    /// # Safety
    ///
    /// Valid while the module lives.
    pub unsafe fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// The kernel's attributes as the driver reports them now (`cuFuncGetAttribute`):
    /// registers, static memory sizes, its thread limit, the PTX and binary
    /// architectures, the dynamic shared memory it may use. Needs no binding.
    ///
    /// ```no_run
    /// # fn f(module: &gpubind::Module) -> gpubind::Result<()> {
    /// let attrs = module.function("saxpy")?.attributes()?;
    /// println!("{} registers per thread, compiled for sm_{}", attrs.registers_per_thread,
    ///          attrs.binary_version);
    /// # Ok(()) }
    /// ```
    pub fn attributes(&self) -> Result<FunctionAttributes> {
        let _guard = self.module.device.enter()?;
        use sys::CUfunction_attribute as A;
        let get = |a| func_attribute(self.raw, a);
        Ok(FunctionAttributes {
            max_threads_per_block: get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            registers_per_thread: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_bytes: get(A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            local_bytes_per_thread: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            ptx_version: get(A::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: get(A::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
            max_dynamic_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
        })
    }

    /// Lets launches of this kernel use up to `bytes` of dynamic shared memory
    /// (`cuFuncSetAttribute` with `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`):
    /// needed before a launch whose static plus dynamic shared memory is over the
    /// device's default per-block amount (48 KiB). Launches check against the value set
    /// here. The attribute belongs to the kernel, so it holds for every `Function` of
    /// it (clones, later lookups) until set again.
    ///
    /// More than the device's opt-in maximum less the kernel's static shared memory is
    /// [`Error::LaunchLimit`], before the driver is called.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, module: &gpubind::Module) -> gpubind::Result<()> {
    /// use gpubind::LaunchConfig;
    /// let f = module.function("uses_shared")?;
    /// f.set_max_dynamic_shared_memory(100 * 1024)?;
    /// let cfg = LaunchConfig { shared_mem_bytes: 100 * 1024, ..LaunchConfig::for_num_elems(256) };
    /// // ... gpu.default_stream().launch(&f, cfg) ... now passes the shared memory check
    /// # Ok(()) }
    /// ```
    pub fn set_max_dynamic_shared_memory(&self, bytes: u32) -> Result<()> {
        let dev = self.module.device.launch_limits()?;
        let ceiling = dev.shared_per_block_optin.max(dev.shared_per_block);
        let limit = ceiling.saturating_sub(self.limits.static_shared);
        if bytes > limit {
            return Err(Error::LaunchLimit {
                kernel: self.name.clone(),
                what: "dynamic shared memory (bytes) to allow exceeds the device's \
                       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN less the \
                       kernel's static shared memory",
                requested: bytes.into(),
                limit: limit.into(),
            });
        }
        let _guard = self.module.device.enter()?;
        // SAFETY: a valid function of the module's context, current for the call; the
        // value fits a c_int (at most the opt-in ceiling, a u32 read from a c_int).
        unsafe {
            sys::cuFuncSetAttribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .check_on(&self.module.device, "cuFuncSetAttribute")
    }

    /// How many blocks of `block_size` threads, each with `dynamic_shared_bytes` of
    /// dynamic shared memory, can be resident on one multiprocessor at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`). 0 means such a block does not fit
    /// at all. Needs no binding.
    ///
    /// A block size of 0 is [`Error::InvalidArgument`]; one over the kernel's
    /// `max_threads_per_block` is [`Error::LaunchLimit`].
    ///
    /// ```no_run
    /// # fn f(module: &gpubind::Module) -> gpubind::Result<()> {
    /// let f = module.function("saxpy")?;
    /// let per_sm = f.max_active_blocks_per_sm(256, 0)?;
    /// let sms = module.device().multiprocessor_count()?;
    /// println!("a grid of {} blocks of 256 fills the GPU", per_sm * sms);
    /// # Ok(()) }
    /// ```
    pub fn max_active_blocks_per_sm(
        &self,
        block_size: u32,
        dynamic_shared_bytes: usize,
    ) -> Result<u32> {
        self.check_block_size(block_size)?;
        let _guard = self.module.device.enter()?;
        let mut blocks = 0;
        // SAFETY: a valid function of the module's context, current for the call; the
        // block size is at most the kernel's limit (checked above), so fits a c_int;
        // writes one int.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.raw,
                block_size as i32,
                dynamic_shared_bytes,
            )
        }
        .check_on(
            &self.module.device,
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(blocks.max(0) as u32)
    }

    /// The block size that gives this kernel the highest occupancy with
    /// `dynamic_shared_bytes` of dynamic shared memory per block, whatever the block
    /// size, and the smallest grid that reaches it on the whole device
    /// (`cuOccupancyMaxPotentialBlockSize`). Needs no binding.
    ///
    /// ```no_run
    /// # fn f(module: &gpubind::Module) -> gpubind::Result<()> {
    /// let best = module.function("saxpy")?.max_potential_block_size(0)?;
    /// let cfg = gpubind::LaunchConfig {
    ///     grid_dim: (best.min_grid_size, 1, 1),
    ///     block_dim: (best.block_size, 1, 1),
    ///     shared_mem_bytes: 0,
    /// };
    /// # Ok(()) }
    /// ```
    pub fn max_potential_block_size(
        &self,
        dynamic_shared_bytes: usize,
    ) -> Result<PotentialBlockSize> {
        let _guard = self.module.device.enter()?;
        let (mut min_grid, mut block) = (0, 0);
        // SAFETY: a valid function of the module's context, current for the call; no
        // size callback (null: the fixed `dynamic_shared_bytes` is used), no block size
        // limit (0); writes two ints.
        unsafe {
            sys::cuOccupancyMaxPotentialBlockSize(
                &mut min_grid,
                &mut block,
                self.raw,
                None,
                dynamic_shared_bytes,
                0,
            )
        }
        .check_on(&self.module.device, "cuOccupancyMaxPotentialBlockSize")?;
        Ok(PotentialBlockSize {
            min_grid_size: min_grid.max(0) as u32,
            block_size: block.max(0) as u32,
        })
    }

    /// [`Error::InvalidArgument`] for 0, [`Error::LaunchLimit`] over the kernel's limit.
    fn check_block_size(&self, block_size: u32) -> Result<()> {
        check_block_size(&self.name, block_size, &self.limits)
    }
}

/// See [`Function::max_active_blocks_per_sm`].
pub(crate) fn check_block_size(
    kernel: &str,
    block_size: u32,
    limits: &FunctionLimits,
) -> Result<()> {
    if block_size == 0 {
        return Err(Error::InvalidArgument(format!(
            "kernel `{kernel}`: an occupancy query for blocks of 0 threads"
        )));
    }
    if block_size > limits.max_threads_per_block {
        return Err(Error::LaunchLimit {
            kernel: kernel.to_owned(),
            what: "threads per block exceed the kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK \
                   (its register use or __launch_bounds__ allow fewer than the device)",
            requested: block_size.into(),
            limit: limits.max_threads_per_block.into(),
        });
    }
    Ok(())
}

/// A kernel's attributes, from [`Function::attributes`] (`cuFuncGetAttribute`).
/// Versions are `10 * major + minor` (90 for `sm_90` / `compute_90`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct FunctionAttributes {
    /// The most threads a block of this kernel may have: at most the device's, fewer
    /// where its register use or `__launch_bounds__` require
    /// (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
    pub max_threads_per_block: u32,
    /// Registers each thread uses (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers_per_thread: u32,
    /// Statically allocated shared memory per block (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_shared_bytes: u32,
    /// User constant memory (`CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES`).
    pub const_bytes: u32,
    /// Local memory per thread (spills, local arrays: `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`).
    pub local_bytes_per_thread: u32,
    /// The PTX virtual architecture the kernel was compiled for
    /// (`CU_FUNC_ATTRIBUTE_PTX_VERSION`).
    pub ptx_version: u32,
    /// The architecture of the binary that runs (`CU_FUNC_ATTRIBUTE_BINARY_VERSION`;
    /// the device's own for PTX JIT-compiled at load).
    pub binary_version: u32,
    /// The dynamic shared memory a launch may use now
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; see
    /// [`Function::set_max_dynamic_shared_memory`]).
    pub max_dynamic_shared_bytes: u32,
}

/// A kernel's best block size for occupancy, from [`Function::max_potential_block_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PotentialBlockSize {
    /// The smallest grid (in blocks) that reaches the highest occupancy on the device.
    pub min_grid_size: u32,
    /// The block size (threads) that gives the highest occupancy.
    pub block_size: u32,
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid_dim: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One thread per element, 256 threads a block, at least one block.
    pub fn for_num_elems(n: u32) -> Self {
        const BLOCK: u32 = 256;
        LaunchConfig {
            grid_dim: (n.div_ceil(BLOCK).max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let (g, b) = (self.grid_dim, self.block_dim);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "launch dimensions must be non-zero (grid {g:?}, block {b:?})"
            )));
        }
        Ok(())
    }

    /// Checks the configuration against the device's and the kernel's limits, so a launch
    /// the driver would refuse is a typed [`Error::LaunchLimit`] instead. In order: threads
    /// per block (the device's, then the kernel's), block dimensions, grid dimensions,
    /// static plus dynamic shared memory against the device's opt-in ceiling, and — only
    /// when that total is over the default per-block amount, which every kernel may use —
    /// the dynamic part against the kernel's current
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, read by `max_dynamic_shared`.
    pub(crate) fn check_limits(
        &self,
        kernel: &str,
        dev: &DeviceLimits,
        func: &FunctionLimits,
        max_dynamic_shared: impl FnOnce() -> Result<u32>,
    ) -> Result<()> {
        let over = |what: &'static str, requested: u64, limit: u64| {
            if requested > limit {
                Err(Error::LaunchLimit {
                    kernel: kernel.to_owned(),
                    what,
                    requested,
                    limit,
                })
            } else {
                Ok(())
            }
        };
        let b = [self.block_dim.0, self.block_dim.1, self.block_dim.2].map(u64::from);
        let g = [self.grid_dim.0, self.grid_dim.1, self.grid_dim.2].map(u64::from);
        // Saturates only for blocks of more than 2^64 threads, which are over any limit.
        let threads = b[0].saturating_mul(b[1]).saturating_mul(b[2]);
        over(
            "threads per block exceed the device's CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
            threads,
            dev.max_threads_per_block.into(),
        )?;
        over(
            "threads per block exceed the kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK \
             (its register use or __launch_bounds__ allow fewer than the device)",
            threads,
            func.max_threads_per_block.into(),
        )?;
        const BLOCK: [&str; 3] = [
            "block dimension x exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X",
            "block dimension y exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y",
            "block dimension z exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z",
        ];
        const GRID: [&str; 3] = [
            "grid dimension x exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X",
            "grid dimension y exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y",
            "grid dimension z exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z",
        ];
        for i in 0..3 {
            over(BLOCK[i], b[i], dev.max_block_dim[i].into())?;
        }
        for i in 0..3 {
            over(GRID[i], g[i], dev.max_grid_dim[i].into())?;
        }
        let dynamic = u64::from(self.shared_mem_bytes);
        let total = u64::from(func.static_shared) + dynamic;
        // Devices without an opt-in report 0: their ceiling is the default amount.
        let ceiling = dev.shared_per_block_optin.max(dev.shared_per_block);
        over(
            "shared memory per block (static + dynamic bytes) exceeds the device's \
             CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
            total,
            ceiling.into(),
        )?;
        if total > u64::from(dev.shared_per_block) {
            over(
                "dynamic shared memory (bytes) exceeds the kernel's \
                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (raise it with \
                 cuFuncSetAttribute, up to the device's opt-in maximum less the kernel's \
                 static shared memory)",
                dynamic,
                max_dynamic_shared()?.into(),
            )?;
        }
        Ok(())
    }
}

/// A value that can be passed to a kernel: device memory (passed as its address) or
/// plain data (passed by value).
///
/// Every [`DeviceRepr`] type is a `KernelArg` passed by value, so one
/// `unsafe impl DeviceRepr` is all a `#[repr(C)]` struct needs to be a kernel parameter
/// (as with cudarc's `DeviceRepr`), besides being the element type of a buffer:
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, module: &gpubind::Module) -> gpubind::Result<()> {
/// use gpubind::{DeviceRepr, LaunchConfig};
/// // extern "C" __global__ void affine(Affine p, float* x, unsigned n) { … }
/// // with `struct Affine { float scale; float shift; unsigned n; unsigned pad; };`
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// struct Affine {
///     scale: f32,
///     shift: f32,
///     n: u32,
///     pad: u32, // explicit: DeviceRepr types have no padding
/// }
/// // SAFETY: repr(C), four 4-byte fields (no padding), every bit pattern valid.
/// unsafe impl DeviceRepr for Affine {}
///
/// let affine = module.function("affine")?;
/// let mut x = gpu.clone_htod(&[1.0f32; 64])?;
/// let p = Affine { scale: 2.0, shift: 1.0, n: 64, pad: 0 };
/// // SAFETY: (Affine, float*, unsigned) matches the kernel, which stays in bounds.
/// unsafe {
///     gpu.default_stream()
///         .launch(&affine, LaunchConfig::for_num_elems(64))
///         .arg(&p).arg(&mut x).arg(&64u32)
///         .launch()?;
/// }
/// # Ok(()) }
/// ```
///
/// gpubind buffers are passed as their address *and* claimed by the launch (ordered after
/// their pending uses). They can never be passed as plain data: a `DeviceRepr` type is
/// `Copy`, which an owning buffer is not, so a struct holding one cannot implement it:
///
/// ```compile_fail,E0204
/// #[repr(C)]
/// #[derive(Clone, Copy)] // error[E0204]: `DeviceSlice<f32>` is not `Copy`
/// struct Smuggled {
///     buf: gpubind::DeviceSlice<f32>,
/// }
/// ```
///
/// A raw device address (`u64`, from the `unsafe` [`DeviceSlice::raw_ptr`]) *is* plain
/// data and may be passed by value, alone or inside a struct: gpubind neither tracks nor
/// keeps alive what it points to, which is why [`LaunchBuilder::launch`] is `unsafe` and
/// its contract names such memory.
///
/// # Safety
///
/// `param_ptr` must point to `param_size` readable bytes that stay valid while `self` is
/// borrowed.
pub unsafe trait KernelArg {
    /// Pointer to the bytes the kernel receives.
    fn param_ptr(&self) -> *mut c_void;
    /// How many bytes the kernel receives.
    fn param_size(&self) -> usize;
    /// The device the argument lives on, for memory arguments.
    fn arg_device(&self) -> Option<&Device> {
        None
    }
    /// What the argument is, for error messages.
    fn describe(&self) -> String;
    /// The pending-use tracker of the gpubind allocation this argument passes, if any:
    /// the launch is ordered after its conflicting uses and recorded as a write.
    #[doc(hidden)]
    fn access_tracker(&self) -> Option<&crate::access::AccessTracker> {
        None
    }
    /// The device bytes the argument passes (address, length), within the allocation of
    /// [`access_tracker`](Self::access_tracker): what the kernel may touch through it
    /// (the launch contract). `None`: the whole allocation.
    #[doc(hidden)]
    fn arg_span(&self) -> Option<(u64, u64)> {
        None
    }
}

// SAFETY: plain data passed by value: the kernel receives the value's own
// `size_of::<T>()` bytes, borrowed for the launch. `DeviceRepr` promises no padding (every
// byte initialised) and no owned resources, so copying the bytes is all the driver does.
unsafe impl<T: DeviceRepr> KernelArg for T {
    fn param_ptr(&self) -> *mut c_void {
        self as *const T as *mut c_void
    }
    fn param_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
    fn describe(&self) -> String {
        std::any::type_name::<T>().to_owned()
    }
}

macro_rules! memory_arg {
    ($ty:ident $(<$lt:lifetime>)?) => {
        // SAFETY: passes the address field, 8 bytes that live as long as the borrow.
        unsafe impl<$($lt,)? T: DeviceRepr> KernelArg for $ty<$($lt,)? T> {
            fn param_ptr(&self) -> *mut c_void {
                &self.ptr as *const sys::CUdeviceptr as *mut c_void
            }
            fn param_size(&self) -> usize {
                std::mem::size_of::<sys::CUdeviceptr>()
            }
            fn arg_device(&self) -> Option<&Device> {
                Some(crate::memory::DeviceMemory::device(self))
            }
            fn describe(&self) -> String {
                format!("{}<{}>", stringify!($ty), std::any::type_name::<T>())
            }
            fn access_tracker(&self) -> Option<&crate::access::AccessTracker> {
                Some(crate::memory::Tracked::tracker(self))
            }
            fn arg_span(&self) -> Option<(u64, u64)> {
                let m: &dyn crate::memory::DeviceMemory<T> = self;
                Some((m.device_ptr(), m.num_bytes() as u64))
            }
        }
    };
}
memory_arg!(DeviceSlice);
memory_arg!(DeviceView<'a>);
memory_arg!(DeviceViewMut<'a>);
pub(crate) use memory_arg;

/// Builds one kernel launch; see [`BoundStream::launch`].
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct LaunchBuilder<'s, 'a> {
    pub(crate) stream: &'s BoundStream<'s>,
    pub(crate) func: &'s Function<'s>,
    pub(crate) cfg: LaunchConfig,
    args: ArgPtrs,
    /// The first argument of another device (or the module's device mismatch). Boxed,
    /// like `size_error`: the builder is moved at every `arg`, and errors are rare.
    error: Option<Box<Error>>,
    /// The first argument whose size differs from the kernel's parameter, found as it
    /// is appended (reported after the count check, as before).
    size_error: Option<Box<Error>>,
    /// The buffer arguments, claimed (with the module) when the kernel is enqueued.
    tracked: Tracked<'a>,
    _args: std::marker::PhantomData<&'a ()>,
}

impl std::fmt::Debug for LaunchBuilder<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchBuilder")
            .field("function", &self.func.name)
            .field("stream", self.stream)
            .field("config", &self.cfg)
            .field("args", &self.args.len())
            .field("error", &self.error.as_ref().or(self.size_error.as_ref()))
            .finish_non_exhaustive()
    }
}

/// How many argument pointers a launch keeps inline before spilling to the heap.
const INLINE_ARGS: usize = 12;

/// Up to this many buffer arguments, a launch claims them with smaller inline arrays.
const FEW_ARGS: usize = 4;

/// The gpubind buffers a launch passes: inline for up to [`INLINE_ARGS`], so a typical
/// launch allocates nothing.
struct Tracked<'a> {
    inline: [Option<&'a AccessTracker>; INLINE_ARGS],
    n: usize,
    spill: Vec<&'a AccessTracker>,
}

impl<'a> Tracked<'a> {
    #[inline]
    fn new() -> Self {
        Tracked {
            inline: [None; INLINE_ARGS],
            n: 0,
            spill: Vec::new(),
        }
    }

    #[inline(always)]
    fn push(&mut self, t: &'a AccessTracker) {
        if self.n < INLINE_ARGS {
            self.inline[self.n] = Some(t);
            self.n += 1;
        } else {
            self.spill.push(t);
        }
    }

    /// The first `N` of [`uses`](Self::uses), padded with `None` (for `n <= N` buffers).
    #[inline(always)]
    fn uses_array<const N: usize>(&self) -> [Use<'a>; N] {
        let mut out = [None; N];
        for (slot, u) in out.iter_mut().zip(self.uses()) {
            *slot = u;
        }
        out
    }

    /// Every buffer argument is claimed as written: a kernel may write through any
    /// pointer it is given.
    fn uses(&self) -> impl Iterator<Item = Use<'a>> + '_ {
        self.inline[..self.n]
            .iter()
            .map(|t| t.map(|t| (t, Access::Write)))
            .chain(self.spill.iter().map(|&t| Some((t, Access::Write))))
    }
}

/// The kernel-parameter pointer array: inline for up to [`INLINE_ARGS`] arguments, so a
/// typical launch allocates nothing.
enum ArgPtrs {
    Inline([*mut c_void; INLINE_ARGS], usize),
    Heap(Vec<*mut c_void>),
}

impl ArgPtrs {
    #[inline]
    fn new() -> Self {
        ArgPtrs::Inline([std::ptr::null_mut(); INLINE_ARGS], 0)
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            ArgPtrs::Inline(_, n) => *n,
            ArgPtrs::Heap(v) => v.len(),
        }
    }

    #[inline(always)]
    fn push(&mut self, p: *mut c_void) {
        match self {
            ArgPtrs::Inline(a, n) if *n < INLINE_ARGS => {
                a[*n] = p;
                *n += 1;
            }
            ArgPtrs::Inline(a, _) => {
                let mut v = Vec::with_capacity(2 * INLINE_ARGS);
                v.extend_from_slice(a);
                v.push(p);
                *self = ArgPtrs::Heap(v);
            }
            ArgPtrs::Heap(v) => v.push(p),
        }
    }

    #[inline]
    fn as_mut_ptr(&mut self) -> *mut *mut c_void {
        match self {
            ArgPtrs::Inline(a, _) => a.as_mut_ptr(),
            ArgPtrs::Heap(v) => v.as_mut_ptr(),
        }
    }
}

impl<'m> Function<'m> {
    /// The checks [`LaunchBuilder::launch`] makes before the driver call, for a launch of
    /// `nargs` arguments of `cfg` (used by graph capture, [`crate::graph`]; the launch
    /// builder keeps its own inlined copy on its hot path).
    pub(crate) fn check_launch(&self, cfg: &LaunchConfig, nargs: usize) -> Result<()> {
        cfg.validate()?;
        cfg.check_limits(
            &self.name,
            self.module.device.launch_limits()?,
            &self.limits,
            || {
                let _guard = self.module.device.enter()?;
                func_attribute(
                    self.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                )
            },
        )?;
        if let Some(expected) = &self.params
            && expected.len() != nargs
        {
            return Err(Error::LaunchArgs {
                kernel: self.name.clone(),
                reason: format!(
                    "the kernel takes {} parameter(s), {nargs} given",
                    expected.len()
                ),
            });
        }
        Ok(())
    }

    /// [`Error::LaunchArgs`] if argument `i` (of `size` bytes) does not fit parameter `i`
    /// where the driver reports the sizes.
    pub(crate) fn check_arg_size(
        &self,
        i: usize,
        size: usize,
        describe: impl FnOnce() -> String,
    ) -> Result<()> {
        match self.params.as_ref().and_then(|p| p.get(i)) {
            Some(&want) if want != size => Err(Error::LaunchArgs {
                kernel: self.name.clone(),
                reason: format!(
                    "parameter {i} is {want} bytes, but argument {i} is a {size}-byte {}",
                    describe()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The module's tracker of the streams its kernels run on (its unload waits for
    /// them), and how a launch uses it: a write when the module has global views (any of
    /// its kernels may write a global without being passed it), else a read. Graph
    /// launches record themselves there too.
    pub(crate) fn module_use(&self) -> (&'m AccessTracker, Access) {
        (
            self.uses,
            if self.globals {
                Access::Write
            } else {
                Access::Read
            },
        )
    }

    /// The name as recorded for [`Error::ContextPoisoned`].
    pub(crate) fn interned(&self) -> &'static KernelName {
        self.interned
    }
}

impl<'b> BoundStream<'b> {
    /// Starts a launch of `func` on this stream.
    #[inline]
    pub fn launch<'s, 'a>(
        &'s self,
        func: &'s Function<'_>,
        cfg: LaunchConfig,
    ) -> LaunchBuilder<'s, 'a> {
        let error = self
            .bound()
            .expect_device("kernel module", func.module.device())
            .err()
            .map(Box::new);
        LaunchBuilder {
            stream: self,
            func,
            cfg,
            args: ArgPtrs::new(),
            error,
            size_error: None,
            tracked: Tracked::new(),
            _args: std::marker::PhantomData,
        }
    }
}

impl<'s, 'a> LaunchBuilder<'s, 'a> {
    /// Appends an argument. Memory of another device is reported at `launch`.
    ///
    /// A gpubind buffer passed here is ordered like a write: the launch runs after every
    /// pending use of it on other streams, and later uses (on any stream, from the host,
    /// or its free) wait for the kernel. (A kernel may write through any pointer, so
    /// gpubind cannot treat a buffer passed by shared reference as read-only.) Pass
    /// `&mut slice` for buffers the kernel writes, to document intent (and, for a
    /// [`ManagedSlice`](crate::ManagedSlice), to keep the host out of it while the builder
    /// lives; clippy's `unnecessary_mut_passed` does not see that and may be allowed).
    ///
    /// The builder is taken by `&mut` (as in cudarc), so a chain
    /// `stream.launch(&f, cfg).arg(&a).arg(&b).launch()` moves nothing; to build one
    /// across statements, keep it in a variable: `let mut l = stream.launch(&f, cfg);
    /// l.arg(&a); unsafe { l.launch() }`. It may be launched again.
    #[inline(always)]
    pub fn arg<A: KernelArg + ?Sized>(&mut self, arg: &'a A) -> &mut Self {
        let this = self;
        if let (None, Some(dev)) = (&this.error, arg.arg_device()) {
            this.error = this
                .stream
                .bound()
                .expect_device("kernel argument", dev)
                .err()
                .map(Box::new);
        }
        if let Some(t) = arg.access_tracker() {
            this.tracked.push(t);
        }
        let i = this.args.len();
        if let (None, Some(&want)) = (
            &this.size_error,
            this.func.params.as_ref().and_then(|p| p.get(i)),
        ) {
            let got = arg.param_size();
            if want != got {
                // Only a mismatch pays for describing the argument.
                this.size_error = Some(Box::new(Error::LaunchArgs {
                    kernel: this.func.name.clone(),
                    reason: format!(
                        "parameter {i} is {want} bytes, but argument {i} is a {got}-byte {}",
                        arg.describe()
                    ),
                }));
            }
        }
        this.args.push(arg.param_ptr());
        this
    }

    /// Enqueues the kernel.
    ///
    /// Fails before the driver is called with [`Error::InvalidArgument`] for a zero
    /// dimension, [`Error::LaunchLimit`] for a configuration over a device or kernel
    /// limit (see the [module docs](self)), [`Error::LaunchArgs`] or
    /// [`Error::WrongDevice`] for arguments that do not fit.
    ///
    /// # Safety
    ///
    /// * The arguments must have the types the kernel declares (gpubind checks the count
    ///   and byte sizes where the driver reports them, i.e. from CUDA 12.4; never the
    ///   types).
    /// * The kernel must only access memory inside the buffers passed to it, and the
    ///   globals of its own module (never writing a `__constant__` one through a
    ///   pointer): gpubind orders those against their views' uses (see
    ///   [`Module::global`]).
    /// * gpubind's device, pool and managed buffers passed as arguments need nothing
    ///   more: the launch is ordered after their pending uses, and their later uses and
    ///   frees are ordered after the kernel. Any *other* memory the kernel reaches — device
    ///   addresses passed as plain integers or inside your own structs, and page-locked
    ///   host buffers ([`PinnedHostBuffer`](crate::PinnedHostBuffer),
    ///   [`RegisteredHost`](crate::RegisteredHost)), which the host reads and writes
    ///   directly through `Deref` — must stay alive and must not be accessed by the host
    ///   or by other streams until this stream has passed the launch (synchronize it, or
    ///   record and wait for an event).
    /// * A [`ManagedSlice`](crate::ManagedSlice) the kernel writes must be passed as
    ///   `&mut`: a shared one may be read by the host through
    ///   [`as_slice`](crate::ManagedSlice::as_slice) while the launch is enqueued.
    pub unsafe fn launch(&mut self) -> Result<()> {
        // SAFETY: the caller's contract is this function's; `Plain` enqueues the kernel
        // with exactly what it is given.
        unsafe { self.enqueue(Plain) }
    }

    /// The path every launch takes, ordinary or with attributes ([`crate::launch`]): the
    /// configuration and argument checks, then `driver.check` (the attributes' own
    /// checks, before anything is claimed), then the claim of the buffer arguments (and
    /// of the module's tracker once it has global views), then `driver.call`, with the
    /// claim held. Inlined into each caller, so the ordinary launch compiles to what it
    /// was.
    ///
    /// # Safety
    ///
    /// [`launch`](Self::launch)'s contract.
    #[inline(always)]
    pub(crate) unsafe fn enqueue(&mut self, driver: impl DriverLaunch) -> Result<()> {
        if let Some(e) = &self.error {
            return Err((**e).clone());
        }
        self.cfg.validate()?;
        let func = self.func;
        self.cfg.check_limits(
            &func.name,
            func.module.device.launch_limits()?,
            &func.limits,
            || {
                // Only for a launch over the default shared memory (rare): the attribute
                // may have been raised through the raw handle since the lookup.
                let _guard = func.module.device.enter()?;
                func_attribute(
                    func.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                )
            },
        )?;
        if let Some(expected) = &self.func.params
            && expected.len() != self.args.len()
        {
            return Err(Error::LaunchArgs {
                kernel: self.func.name.clone(),
                reason: format!(
                    "the kernel takes {} parameter(s), {} given",
                    expected.len(),
                    self.args.len()
                ),
            });
        }
        if let Some(e) = &self.size_error {
            return Err((**e).clone());
        }
        driver.check(self)?;
        // Claim the buffers from before the enqueue until after it: the launch is ordered
        // after their pending uses, and recorded as their latest.
        self.stream.ensure_stream_context()?;
        if self.func.globals {
            // SAFETY: forwarded: this function's contract.
            return unsafe { self.enqueue_claiming_globals(driver) };
        }
        let tracked = &self.tracked;
        let n = tracked.n + tracked.spill.len();
        // Initialised only when there is something to claim (the common empty or
        // scalar-only launch pays nothing).
        let mut inline_uses: [Use<'_>; INLINE_ARGS];
        let mut inline_locks: access::Locks<'_, INLINE_ARGS>;
        let mut few_uses: [Use<'_>; FEW_ARGS];
        let mut few_locks: access::Locks<'_, FEW_ARGS>;
        let _claim_few;
        let _claim_inline;
        let _claim_spilled;
        if n == 0 {
            // Nothing to claim (scalars only).
        } else if n <= FEW_ARGS {
            // The usual launch: smaller arrays to fill and to drop.
            few_uses = tracked.uses_array::<FEW_ARGS>();
            few_locks = access::locks::<FEW_ARGS>();
            _claim_few =
                access::claim(self.stream.slot(), &mut few_uses[..n], &mut few_locks[..n])?;
        } else if n <= INLINE_ARGS {
            inline_uses = tracked.uses_array::<INLINE_ARGS>();
            inline_locks = access::locks::<INLINE_ARGS>();
            _claim_inline = access::claim(
                self.stream.slot(),
                &mut inline_uses[..n],
                &mut inline_locks[..n],
            )?;
        } else {
            let mut uses: Vec<Use<'_>> = tracked.uses().collect();
            let locks: Vec<Option<access::Held<'_>>> = uses.iter().map(|_| None).collect();
            _claim_spilled = access::claim(self.stream.slot(), &mut uses, locks)?;
        }
        // The module's unload waits for this launch (the launch borrows the module, so the
        // unload cannot race the enqueue).
        self.func.uses.note_read(self.stream.slot());
        // SAFETY: forwarded (the claim is held until this returns).
        unsafe { self.call_driver(driver) }
    }

    /// [`enqueue`](Self::enqueue)'s claim for a module with global views (its kernels
    /// may write them without being passed them): the module's tracker is claimed as a
    /// write together with the buffers, in the one sorted claim (which records the
    /// launch; no `note_read`). Kept out of the ordinary path.
    ///
    /// # Safety
    ///
    /// As for `enqueue`; the stream context is checked.
    #[cold]
    #[inline(never)]
    unsafe fn enqueue_claiming_globals(&mut self, driver: impl DriverLaunch) -> Result<()> {
        let tracked = &self.tracked;
        let n = tracked.n + tracked.spill.len() + 1;
        let module = Some((self.func.uses, Access::Write));
        let mut inline_uses: [Use<'_>; INLINE_ARGS];
        let mut inline_locks: access::Locks<'_, INLINE_ARGS>;
        let _claim_inline;
        let _claim_spilled;
        if n <= INLINE_ARGS {
            inline_uses = tracked.uses_array::<INLINE_ARGS>();
            inline_uses[n - 1] = module;
            inline_locks = access::locks::<INLINE_ARGS>();
            _claim_inline = access::claim(
                self.stream.slot(),
                &mut inline_uses[..n],
                &mut inline_locks[..n],
            )?;
        } else {
            let mut uses: Vec<Use<'_>> = tracked.uses().collect();
            uses.push(module);
            let locks: Vec<Option<access::Held<'_>>> = uses.iter().map(|_| None).collect();
            _claim_spilled = access::claim(self.stream.slot(), &mut uses, locks)?;
        }
        // SAFETY: forwarded (the claim is held until this returns).
        unsafe { self.call_driver(driver) }
    }

    /// The last step of every launch, with its claim held: notes the kernel for
    /// `Error::ContextPoisoned`, then enqueues it.
    ///
    /// # Safety
    ///
    /// As for [`enqueue`](Self::enqueue), with the launch's buffers claimed.
    #[inline(always)]
    unsafe fn call_driver<D: DriverLaunch>(&mut self, driver: D) -> Result<()> {
        // Named in the error if this kernel poisons the context.
        self.stream
            .bound()
            .device()
            .poison_state()
            .launching(self.func.interned);
        // SAFETY: the stream's handle, valid while it is borrowed.
        let stream = unsafe { self.stream.raw() };
        // SAFETY: `DriverLaunch::call`'s contract: the function belongs to the bound
        // (current) context and the stream to it; each arg pointer points at a value
        // borrowed for 'a, which outlives this call (the driver copies the parameter bytes
        // before returning); the buffers are claimed (the caller's). Memory safety of the
        // kernel itself is the caller's contract.
        let status =
            unsafe { driver.call(self.func.raw, &self.cfg, stream, self.args.as_mut_ptr()) };
        status.check_on(self.stream.bound().device(), D::NAME)
    }
}

/// The driver call that ends a launch, and the checks it needs first: [`Plain`]
/// (`cuLaunchKernel`) or a launch with attributes (`cuLaunchKernelEx`, [`crate::launch`]).
/// A trait rather than closures so that the ordinary launch inlines it.
pub(crate) trait DriverLaunch {
    /// The entry point, for errors.
    const NAME: &'static str;
    /// Checks beyond the ordinary launch's, before anything is claimed.
    fn check(&self, launch: &LaunchBuilder<'_, '_>) -> Result<()>;
    /// Enqueues `func` with `cfg` on `stream` with `params`.
    ///
    /// # Safety
    ///
    /// `func` and `stream` belong to the current context; `params` points to one valid
    /// pointer per kernel parameter, each to that parameter's bytes, alive for the call;
    /// the launch's buffers are claimed; the kernel's own conduct is
    /// [`LaunchBuilder::launch`]'s contract. Implementations enqueue exactly this.
    unsafe fn call(
        self,
        func: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        params: *mut *mut c_void,
    ) -> sys::CUresult;
}

/// The ordinary launch: `cuLaunchKernel`, nothing more to check.
pub(crate) struct Plain;

impl DriverLaunch for Plain {
    const NAME: &'static str = "cuLaunchKernel";

    #[inline(always)]
    fn check(&self, _: &LaunchBuilder<'_, '_>) -> Result<()> {
        Ok(())
    }

    #[inline(always)]
    unsafe fn call(
        self,
        func: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        params: *mut *mut c_void,
    ) -> sys::CUresult {
        // SAFETY: the trait's contract: a function and stream of the current context,
        // parameters alive for the call (the driver copies them before returning).
        unsafe {
            sys::cuLaunchKernel(
                func,
                cfg.grid_dim.0,
                cfg.grid_dim.1,
                cfg.grid_dim.2,
                cfg.block_dim.0,
                cfg.block_dim.1,
                cfg.block_dim.2,
                cfg.shared_mem_bytes,
                stream,
                params,
                std::ptr::null_mut(),
            )
        }
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
        crate::image::validate(image)?;
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
    /// Which NVRTC is used: [`crate::libs`] (never a newer major version than the
    /// driver's; PTX from an NVRTC of a newer *minor* version than the driver can still be
    /// refused at load, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, where a cubin would load).
    pub fn compile_and_load(&self, src: &str, name: &str) -> Result<Module> {
        let (major, minor) = self.device().compute_capability()?;
        let cc = i32::try_from(major * 10 + minor).unwrap_or(i32::MAX);
        let nvrtc = crate::libs::nvrtc()?;
        let target =
            crate::libs::pick_target(nvrtc.supported_archs().as_deref(), cc).map_err(|log| {
                Error::Compile {
                    program: name.into(),
                    status: format!("no target for sm_{cc}"),
                    log,
                }
            })?;
        match target {
            crate::libs::Target::Cubin(arch) => {
                let cubin = compile(
                    src,
                    name,
                    &[format!("--gpu-architecture=sm_{arch}")],
                    Output::Cubin,
                )?;
                self.load_cubin(&cubin)
            }
            crate::libs::Target::Ptx(arch) => {
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

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text (portable; JIT-compiled at load).
    Ptx,
    /// A cubin for the one architecture named in the options.
    Cubin,
}

/// Whether an NVRTC gpubind can use can be loaded (see [`crate::libs`] for which one:
/// the driver's major version first, `GPUBIND_NVRTC_PATH` to override).
pub fn nvrtc_available() -> bool {
    crate::libs::nvrtc().is_ok()
}

/// Compiles CUDA C++ source with NVRTC. Needs no GPU, no context and no driver: only
/// `libnvrtc` (chosen as [`crate::libs`] describes). Options are passed through (e.g.
/// `--gpu-architecture=sm_90`, `-DN=4`).
pub fn compile(src: &str, name: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let nvrtc = crate::libs::nvrtc()?;
    let csrc =
        CString::new(src).map_err(|_| Error::InvalidArgument("source contains NUL".into()))?;
    let cname =
        CString::new(name).map_err(|_| Error::InvalidArgument("name contains NUL".into()))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::InvalidArgument("an option contains NUL".into()))?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let n_opts = i32::try_from(opt_ptrs.len())
        .map_err(|_| Error::InvalidArgument(format!("{} options", opt_ptrs.len())))?;

    let failed = |r: i32, log: String| Error::Compile {
        program: name.into(),
        status: crate::libs::nvrtc_status_name(r),
        log,
    };
    let mut prog: crate::libs::NvrtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name, alive for the call; no headers.
    let r = unsafe {
        (nvrtc.create_program)(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != crate::libs::NVRTC_SUCCESS {
        return Err(failed(r, String::new()));
    }
    let result = (|| {
        // SAFETY: `prog` is a live program; the option pointers are alive for the call.
        let r = unsafe { (nvrtc.compile_program)(prog, n_opts, opt_ptrs.as_ptr()) };
        if r != crate::libs::NVRTC_SUCCESS {
            return Err(failed(r, program_log(nvrtc, prog)));
        }
        let (get_size, get) = match output {
            Output::Ptx => (nvrtc.get_ptx_size, nvrtc.get_ptx),
            Output::Cubin => (nvrtc.get_cubin_size, nvrtc.get_cubin),
        };
        let mut size = 0usize;
        // SAFETY: live, compiled program; writes one size_t.
        let mut r = unsafe { get_size(prog, &mut size) };
        let mut out = vec![0u8; size];
        if r == crate::libs::NVRTC_SUCCESS && size > 0 {
            // SAFETY: live, compiled program; the buffer has the size NVRTC reported.
            r = unsafe { get(prog, out.as_mut_ptr().cast()) };
        }
        if r != crate::libs::NVRTC_SUCCESS || out.is_empty() {
            return Err(failed(
                r,
                "no output (for a cubin, name one real architecture: --gpu-architecture=sm_XY)"
                    .into(),
            ));
        }
        if output == Output::Ptx {
            // Drop the trailing NUL NVRTC includes in the size.
            while out.last() == Some(&0) {
                out.pop();
            }
        }
        Ok(out)
    })();
    // SAFETY: destroys the program created above, once.
    unsafe { (nvrtc.destroy_program)(&mut prog) };
    result
}

fn program_log(nvrtc: &crate::libs::Nvrtc, prog: crate::libs::NvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: live program; writes one size_t.
    if unsafe { (nvrtc.get_log_size)(prog, &mut size) } != crate::libs::NVRTC_SUCCESS {
        return String::new();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: live program; the buffer has (at least) the size NVRTC reported.
    if unsafe { (nvrtc.get_log)(prog, buf.as_mut_ptr().cast()) } != crate::libs::NVRTC_SUCCESS {
        return String::new();
    }
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_num_elems_covers_every_element() {
        for n in [0u32, 1, 255, 256, 257, 1 << 20] {
            let c = LaunchConfig::for_num_elems(n);
            assert!(c.grid_dim.0 * c.block_dim.0 >= n);
            assert!(c.grid_dim.0 >= 1);
        }
    }

    #[test]
    fn arg_pointers_keep_order_inline_and_after_spilling() {
        let vals: Vec<u64> = (0..3 * INLINE_ARGS as u64).collect();
        let mut args = ArgPtrs::new();
        for (i, v) in vals.iter().enumerate() {
            args.push(v as *const u64 as *mut c_void);
            assert_eq!(args.len(), i + 1);
            assert_eq!(matches!(args, ArgPtrs::Inline(..)), i < INLINE_ARGS);
            // SAFETY: `len()` pointers were pushed, each to a live u64 of `vals`.
            let seen: Vec<u64> = (0..args.len())
                .map(|k| unsafe { *(*args.as_mut_ptr().add(k) as *const u64) })
                .collect();
            assert_eq!(seen, vals[..=i]);
        }
    }

    /// An H200's limits.
    const H200: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block_dim: [1024, 1024, 64],
        max_grid_dim: [i32::MAX as u32, 65535, 65535],
        shared_per_block: 48 << 10,
        shared_per_block_optin: 227 << 10,
    };
    const PLAIN: FunctionLimits = FunctionLimits {
        max_threads_per_block: 1024,
        static_shared: 0,
    };

    fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: shared,
        }
    }

    /// The limit a configuration is refused for: `(what, requested, limit)`.
    fn refused(
        c: LaunchConfig,
        func: &FunctionLimits,
        max_dynamic: u32,
    ) -> Option<(&'static str, u64, u64)> {
        match c.check_limits("k", &H200, func, || Ok(max_dynamic)) {
            Ok(()) => None,
            Err(Error::LaunchLimit {
                kernel,
                what,
                requested,
                limit,
            }) => {
                assert_eq!(kernel, "k");
                Some((what, requested, limit))
            }
            Err(e) => panic!("not a LaunchLimit: {e:?}"),
        }
    }

    #[test]
    fn threads_per_block_over_the_device_limit_are_refused() {
        let (what, req, lim) = refused(cfg((1, 1, 1), (2048, 1, 1), 0), &PLAIN, 0).unwrap();
        assert!(what.contains("device's CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"));
        assert_eq!((req, lim), (2048, 1024));
        // The product counts, not only one dimension.
        let (what, req, _) = refused(cfg((1, 1, 1), (32, 32, 2), 0), &PLAIN, 0).unwrap();
        assert!(what.contains("MAX_THREADS_PER_BLOCK"));
        assert_eq!(req, 2048);
        // Absurd blocks saturate rather than overflow.
        let huge = cfg((1, 1, 1), (u32::MAX, u32::MAX, u32::MAX), 0);
        assert_eq!(refused(huge, &PLAIN, 0).unwrap().1, u64::MAX);
        let e = cfg((1, 1, 1), (2048, 1, 1), 0)
            .check_limits("saxpy", &H200, &PLAIN, || Ok(0))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel `saxpy`: threads per block exceed the device's \
             CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 2048 requested, limit 1024"
        );
    }

    #[test]
    fn threads_per_block_over_the_kernel_limit_are_refused() {
        let heavy = FunctionLimits {
            max_threads_per_block: 128,
            static_shared: 0,
        };
        let (what, req, lim) = refused(cfg((1, 1, 1), (256, 1, 1), 0), &heavy, 0).unwrap();
        assert!(what.contains("kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"));
        assert_eq!((req, lim), (256, 128));
        assert_eq!(refused(cfg((1, 1, 1), (128, 1, 1), 0), &heavy, 0), None);
    }

    #[test]
    fn block_and_grid_dimensions_are_checked_one_by_one() {
        let cases = [
            (cfg((1, 1, 1), (1, 1, 65), 0), "MAX_BLOCK_DIM_Z", 65, 64),
            (
                cfg((1, 1, 1), (1, 1025, 1), 0),
                "MAX_THREADS_PER_BLOCK",
                1025,
                1024,
            ),
            (
                cfg((1, 65536, 1), (1, 1, 1), 0),
                "MAX_GRID_DIM_Y",
                65536,
                65535,
            ),
            (
                cfg((1, 1, 65536), (1, 1, 1), 0),
                "MAX_GRID_DIM_Z",
                65536,
                65535,
            ),
            (
                cfg((1 << 31, 1, 1), (1, 1, 1), 0),
                "MAX_GRID_DIM_X",
                1 << 31,
                (1 << 31) - 1,
            ),
        ];
        for (c, name, req, lim) in cases {
            let (what, r, l) = refused(c, &PLAIN, 0).unwrap();
            assert!(what.contains(name), "{what} for {c:?}");
            assert_eq!((r, l), (req, lim), "{c:?}");
        }
        // A device with a smaller y limit on blocks.
        let mut small = H200;
        small.max_block_dim[1] = 512;
        let e = cfg((1, 1, 1), (1, 513, 1), 0).check_limits("k", &small, &PLAIN, || Ok(0));
        assert!(
            matches!(e, Err(Error::LaunchLimit { what, requested: 513, limit: 512, .. })
            if what.contains("MAX_BLOCK_DIM_Y"))
        );
    }

    #[test]
    fn shared_memory_over_the_opt_in_ceiling_is_refused() {
        let optin = 227u64 << 10;
        let (what, req, lim) =
            refused(cfg((1, 1, 1), (1, 1, 1), (227 << 10) + 1), &PLAIN, u32::MAX).unwrap();
        assert!(what.contains("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"));
        assert_eq!((req, lim), (optin + 1, optin));
        // Static shared memory counts towards the ceiling.
        let with_static = FunctionLimits {
            max_threads_per_block: 1024,
            static_shared: 1 << 10,
        };
        let (what, req, _) =
            refused(cfg((1, 1, 1), (1, 1, 1), 227 << 10), &with_static, u32::MAX).unwrap();
        assert!(what.contains("OPTIN"));
        assert_eq!(req, optin + 1024);
        // A device without opt-in (reports 0): the default amount is the ceiling.
        let mut old = H200;
        old.shared_per_block_optin = 0;
        let e = cfg((1, 1, 1), (1, 1, 1), (48 << 10) + 4)
            .check_limits("k", &old, &PLAIN, || Ok(u32::MAX));
        assert!(matches!(e, Err(Error::LaunchLimit { limit, .. }) if limit == 48 << 10));
    }

    #[test]
    fn dynamic_shared_memory_over_the_default_needs_the_kernels_opt_in() {
        // 64 KiB with the kernel's attribute at its default: refused, naming the attribute.
        let (what, req, lim) =
            refused(cfg((1, 1, 1), (1, 1, 1), 64 << 10), &PLAIN, 48 << 10).unwrap();
        assert!(what.contains("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"));
        assert_eq!((req, lim), (64 << 10, 48 << 10));
        // Raised: accepted, up to the device's opt-in maximum.
        assert_eq!(
            refused(cfg((1, 1, 1), (1, 1, 1), 64 << 10), &PLAIN, 227 << 10),
            None
        );
        assert_eq!(
            refused(cfg((1, 1, 1), (1, 1, 1), 227 << 10), &PLAIN, 227 << 10),
            None
        );
        // Within the default amount the attribute is not read at all.
        let mut read = false;
        let c = cfg((1, 1, 1), (1, 1, 1), 48 << 10);
        assert!(
            c.check_limits("k", &H200, &PLAIN, || {
                read = true;
                Ok(0)
            })
            .is_ok()
        );
        assert!(
            !read,
            "the kernel's attribute was read for a default-sized launch"
        );
        // A failure to read it is returned.
        let e = cfg((1, 1, 1), (1, 1, 1), 64 << 10).check_limits("k", &H200, &PLAIN, || {
            Err(Error::InvalidArgument("no attribute".into()))
        });
        assert_eq!(e, Err(Error::InvalidArgument("no attribute".into())));
    }

    #[test]
    fn maximal_configurations_pass() {
        let max = cfg((i32::MAX as u32, 65535, 65535), (1024, 1, 1), 227 << 10);
        assert_eq!(refused(max, &PLAIN, 227 << 10), None);
        assert_eq!(refused(cfg((1, 1, 1), (1, 1024, 1), 0), &PLAIN, 0), None);
        assert_eq!(refused(cfg((1, 1, 1), (16, 1, 64), 0), &PLAIN, 0), None);
        assert_eq!(
            refused(LaunchConfig::for_num_elems(u32::MAX), &PLAIN, 0),
            None
        );
    }

    #[test]
    fn occupancy_block_sizes_are_checked() {
        let limits = FunctionLimits {
            max_threads_per_block: 512,
            static_shared: 0,
        };
        assert!(matches!(
            super::check_block_size("k", 0, &limits),
            Err(Error::InvalidArgument(m)) if m.contains("0 threads") && m.contains("`k`")
        ));
        assert_eq!(
            super::check_block_size("k", 513, &limits),
            Err(Error::LaunchLimit {
                kernel: "k".into(),
                what: "threads per block exceed the kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK \
                       (its register use or __launch_bounds__ allow fewer than the device)",
                requested: 513,
                limit: 512,
            })
        );
        assert!(super::check_block_size("k", 512, &limits).is_ok());
        assert!(super::check_block_size("k", 1, &limits).is_ok());
    }

    #[test]
    fn zero_dimensions_are_rejected() {
        let mut c = LaunchConfig::for_num_elems(10);
        c.block_dim.1 = 0;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        assert!(LaunchConfig::for_num_elems(10).validate().is_ok());
    }
}
