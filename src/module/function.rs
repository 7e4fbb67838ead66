//! [`Function`]: one kernel of a module, its launch limits, attributes and occupancy.

use super::{Loaded, Module};
use crate::access::AccessTracker;
use crate::device::poison::KernelName;
use crate::error::{Error, Result};
use cudarc::driver::sys;

// SAFETY: a CUfunction handle is a thread-agnostic identifier; launching needs a
// BoundStream of the module's device on the launching thread.
unsafe impl Send for Function<'_> {}
// SAFETY: as above; Function has no interior mutability.
unsafe impl Sync for Function<'_> {}

/// One kernel of a [`Module`]: borrowed from it (`Function<'m>`, from
/// [`Module::function`]), or holding it ([`Kernel`], from
/// [`SharedModule::kernel`](super::SharedModule::kernel)).
#[derive(Clone)]
pub struct Function<'m> {
    pub(crate) module: ModuleRef<'m>,
    pub(crate) raw: sys::CUfunction,
    pub(crate) name: String,
    /// The name, interned: what a launch records as the device's last kernel (one atomic
    /// store), for `Error::ContextPoisoned`.
    pub(crate) interned: &'static KernelName,
    /// Parameter sizes in bytes, where the driver can report them.
    pub(crate) params: Option<Vec<usize>>,
    /// The kernel's own launch limits, read once at lookup.
    pub(crate) limits: FunctionLimits,
    /// Whether the module had global views at lookup. It cannot change while this
    /// `Function` lives: [`Module::global`] takes `&mut Module`, which a borrowed
    /// `Function` excludes, and a [`Kernel`]'s module is shared
    /// ([`SharedModule`](super::SharedModule)), which no one can borrow mutably.
    pub(crate) globals: bool,
}

/// A kernel that holds its module rather than borrowing it: it can be stored beside the
/// module (in one struct) or without it, sent to other threads, and used wherever a
/// `&Function` is (launches, graph capture, occupancy, attributes). Made by
/// [`SharedModule::kernel`](super::SharedModule::kernel); the module is unloaded when its
/// last handle is dropped, after the launches of its kernels have finished.
pub type Kernel = Function<'static>;

/// How a [`Function`] reaches its module.
#[derive(Clone)]
pub(crate) enum ModuleRef<'m> {
    /// Borrowed from a [`Module`] (`Module::function`).
    Borrowed(&'m Module),
    /// Holding a shared module (`SharedModule::kernel`): no `&mut Module` can exist.
    Shared(std::sync::Arc<Module>),
}

impl std::ops::Deref for ModuleRef<'_> {
    type Target = Module;
    #[inline]
    fn deref(&self) -> &Module {
        match self {
            ModuleRef::Borrowed(m) => m,
            ModuleRef::Shared(m) => m,
        }
    }
}

/// How a graph keeps a launch's module: borrowed for the graph's lifetime, or an `Arc`
/// of the loaded module that the graph holds (a [`Kernel`]'s).
pub(crate) enum ModuleHold<'m> {
    /// The module's tracker, borrowed as long as the function's module.
    Borrowed(&'m AccessTracker),
    /// The loaded module, which the graph keeps alive.
    Owned(std::sync::Arc<Loaded>),
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
    // SAFETY: a valid function handle of the current context.
    let v = unsafe { crate::driver::result::module::func_attribute(func, attr) }?;
    Ok(v.max(0) as u32)
}

/// The kernel's parameter sizes, from `cuFuncGetParamInfo` (CUDA 12.4+, looked up by
/// version: see `crate::driver::version`), or `None` if the driver cannot tell.
pub(crate) fn param_sizes(func: sys::CUfunction) -> Option<Vec<usize>> {
    // SAFETY: `FuncGetParamInfo` is cuFuncGetParamInfo's prototype
    // (CUfunction, size_t, size_t*, size_t*) -> CUresult.
    let get_param_info = unsafe {
        crate::driver::version::FUNC_GET_PARAM_INFO
            .get::<crate::driver::version::FuncGetParamInfo>()
    }
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
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The module's tracker, as a graph keeps it (see [`ModuleHold`]).
    pub(crate) fn module_hold(&self) -> ModuleHold<'m> {
        match &self.module {
            ModuleRef::Borrowed(m) => ModuleHold::Borrowed(&m.loaded.uses),
            ModuleRef::Shared(m) => ModuleHold::Owned(std::sync::Arc::clone(&m.loaded)),
        }
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
        let set = unsafe {
            crate::driver::result::module::func_set_attribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        };
        self.module.device.check(set)
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
        // SAFETY: a valid function of the module's context, current for the call; the
        // block size is at most the kernel's limit (checked above), so fits a c_int.
        let blocks = self.module.device.check(unsafe {
            crate::driver::result::module::max_active_blocks_per_multiprocessor(
                self.raw,
                block_size as i32,
                dynamic_shared_bytes,
            )
        })?;
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
        // SAFETY: a valid function of the module's context, current for the call; the
        // fixed `dynamic_shared_bytes` is used, no block size limit (0).
        let (min_grid, block) = self.module.device.check(unsafe {
            crate::driver::result::module::max_potential_block_size(
                self.raw,
                dynamic_shared_bytes,
                0,
            )
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
