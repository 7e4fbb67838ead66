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
//! reports it (`cuFuncGetParamInfo`, CUDA 12.4+): a wrong count or a wrong size is
//! [`Error::LaunchArgs`], a slice of another device is [`Error::WrongDevice`].

use crate::access::{self, Access, AccessTracker, Use};
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::Check;
use crate::error::{Error, Result};
use crate::memory::{DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut};
use crate::poison::KernelName;
use crate::stream::BoundStream;
use cudarc::driver::sys;
use cudarc::nvrtc::sys as nvrtc_sys;
use std::ffi::{CStr, CString, c_void};
use std::sync::Arc;

/// Loaded device code of one device.
pub struct Module {
    device: Arc<Device>,
    raw: sys::CUmodule,
    /// The streams its kernels were launched on (as reads: launches stay concurrent), so
    /// the unload waits for them.
    launches: AccessTracker,
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
        Ok(Function {
            module: self,
            raw,
            name: name.to_owned(),
            interned: crate::poison::intern(name),
            params: param_sizes(raw),
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

impl Drop for Module {
    fn drop(&mut self) {
        // Unload only once no launched kernel can still run; if that cannot be known (a
        // faulted context), leak the module instead.
        if self.launches.wait_all().is_err() {
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: loaded in this context, unloaded once here, after every kernel
            // launched from it has finished (waited for above); no Function outlives the
            // module (they borrow it).
            let _ = unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

/// Whether the loaded driver exports `symbol` (checked before calling entry points newer
/// than the oldest driver we support, since a missing one would panic in cudarc's loader).
fn driver_has(symbol: &CStr) -> bool {
    // SAFETY: the library is loaded (cuInit succeeded before any Function exists); we only
    // look the symbol up, never call through the pointer.
    unsafe {
        cudarc::driver::sys::culib()
            .get::<*const c_void>(symbol.to_bytes())
            .is_ok()
    }
}

/// The kernel's parameter sizes, from `cuFuncGetParamInfo` (CUDA 12.4+), or `None` if
/// the driver cannot tell.
fn param_sizes(func: sys::CUfunction) -> Option<Vec<usize>> {
    if !driver_has(c"cuFuncGetParamInfo") {
        return None;
    }
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: valid function handle; writes two size_t. Past the last parameter the
        // driver returns CUDA_ERROR_INVALID_VALUE, which ends the loop.
        let r = unsafe { sys::cuFuncGetParamInfo(func, sizes.len(), &mut offset, &mut size) };
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

    /// Parameter sizes in bytes, if the driver reports them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// The raw handle.
    ///
    /// # Safety
    ///
    /// Valid while the module lives.
    pub unsafe fn raw(&self) -> sys::CUfunction {
        self.raw
    }
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

    fn validate(&self) -> Result<()> {
        let (g, b) = (self.grid_dim, self.block_dim);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "launch dimensions must be non-zero (grid {g:?}, block {b:?})"
            )));
        }
        Ok(())
    }
}

/// A value that can be passed to a kernel: device memory (passed as its address) or a
/// plain scalar (passed by value).
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
}

macro_rules! scalar_arg {
    ($($t:ty),*) => { $(
        // SAFETY: a scalar passed by value: its own bytes, borrowed for the launch.
        unsafe impl KernelArg for $t {
            fn param_ptr(&self) -> *mut c_void { self as *const $t as *mut c_void }
            fn param_size(&self) -> usize { std::mem::size_of::<$t>() }
            fn describe(&self) -> String { stringify!($t).to_owned() }
        }
    )* };
}
crate::memory::with_scalar_types!(scalar_arg);

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
    stream: &'s BoundStream<'s>,
    func: &'s Function<'s>,
    cfg: LaunchConfig,
    args: ArgPtrs,
    /// The first argument of another device (or the module's device mismatch).
    error: Option<Error>,
    /// The first argument whose size differs from the kernel's parameter, found as it
    /// is appended (reported after the count check, as before).
    size_error: Option<Error>,
    /// The buffer arguments, claimed (with the module) when the kernel is enqueued.
    tracked: Tracked<'a>,
    _args: std::marker::PhantomData<&'a ()>,
}

/// How many argument pointers a launch keeps inline before spilling to the heap.
const INLINE_ARGS: usize = 12;

/// The gpubind buffers a launch passes: inline for up to [`INLINE_ARGS`], so a typical
/// launch allocates nothing.
struct Tracked<'a> {
    inline: [Option<&'a AccessTracker>; INLINE_ARGS],
    n: usize,
    spill: Vec<&'a AccessTracker>,
}

impl<'a> Tracked<'a> {
    fn new() -> Self {
        Tracked {
            inline: [None; INLINE_ARGS],
            n: 0,
            spill: Vec::new(),
        }
    }

    fn push(&mut self, t: &'a AccessTracker) {
        if self.n < INLINE_ARGS {
            self.inline[self.n] = Some(t);
            self.n += 1;
        } else {
            self.spill.push(t);
        }
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
    fn new() -> Self {
        ArgPtrs::Inline([std::ptr::null_mut(); INLINE_ARGS], 0)
    }

    fn len(&self) -> usize {
        match self {
            ArgPtrs::Inline(_, n) => *n,
            ArgPtrs::Heap(v) => v.len(),
        }
    }

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

    fn as_mut_ptr(&mut self) -> *mut *mut c_void {
        match self {
            ArgPtrs::Inline(a, _) => a.as_mut_ptr(),
            ArgPtrs::Heap(v) => v.as_mut_ptr(),
        }
    }
}

impl<'b> BoundStream<'b> {
    /// Starts a launch of `func` on this stream.
    pub fn launch<'s>(
        &'s self,
        func: &'s Function<'_>,
        cfg: LaunchConfig,
    ) -> LaunchBuilder<'s, 's> {
        let error = self
            .bound()
            .expect_device("kernel module", func.module.device())
            .err();
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
    /// `&mut slice` for buffers the kernel writes, to document intent.
    pub fn arg<'n, A: KernelArg + ?Sized>(mut self, arg: &'n A) -> LaunchBuilder<'s, 'n>
    where
        'a: 'n,
    {
        if let (None, Some(dev)) = (&self.error, arg.arg_device()) {
            self.error = self
                .stream
                .bound()
                .expect_device("kernel argument", dev)
                .err();
        }
        // The buffers so far live for 'a, which outlives 'n: shorten to 'n.
        let mut tracked: Tracked<'n> = self.tracked;
        if let Some(t) = arg.access_tracker() {
            tracked.push(t);
        }
        let i = self.args.len();
        if let (None, Some(&want)) = (
            &self.size_error,
            self.func.params.as_ref().and_then(|p| p.get(i)),
        ) {
            let got = arg.param_size();
            if want != got {
                // Only a mismatch pays for describing the argument.
                self.size_error = Some(Error::LaunchArgs {
                    kernel: self.func.name.clone(),
                    reason: format!(
                        "parameter {i} is {want} bytes, but argument {i} is a {got}-byte {}",
                        arg.describe()
                    ),
                });
            }
        }
        self.args.push(arg.param_ptr());
        LaunchBuilder {
            stream: self.stream,
            func: self.func,
            cfg: self.cfg,
            args: self.args,
            error: self.error,
            size_error: self.size_error,
            tracked,
            _args: std::marker::PhantomData,
        }
    }

    /// Enqueues the kernel.
    ///
    /// # Safety
    ///
    /// * The arguments must have the types the kernel declares (gpubind checks the count
    ///   and byte sizes where the driver reports them, not the types).
    /// * The kernel must only access memory inside the buffers passed to it.
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
    pub unsafe fn launch(self) -> Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.cfg.validate()?;
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
        if let Some(e) = self.size_error {
            return Err(e);
        }
        // Claim the buffers from before the enqueue until after it: the launch is ordered
        // after their pending uses, and recorded as their latest.
        self.stream.ensure_stream_context()?;
        let tracked = self.tracked;
        let n = tracked.n + tracked.spill.len();
        let mut inline_uses: [Use<'_>; INLINE_ARGS] = [None; INLINE_ARGS];
        let mut inline_locks = access::locks::<INLINE_ARGS>();
        let _claim_inline;
        let _claim_spilled;
        if n == 0 {
            // Nothing to claim (scalars only).
        } else if n <= INLINE_ARGS {
            for (slot, u) in inline_uses.iter_mut().zip(tracked.uses()) {
                *slot = u;
            }
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
        self.func.module.launches.note_read(self.stream.slot());
        // Named in the error if this kernel poisons the context.
        self.stream
            .bound()
            .device()
            .poison_state()
            .launching(self.func.interned);
        let LaunchConfig {
            grid_dim: g,
            block_dim: b,
            shared_mem_bytes,
        } = self.cfg;
        let mut args = self.args;
        // SAFETY: the function belongs to the bound (current) context; each arg pointer
        // points at a value borrowed for 'a, which outlives this call; the driver copies
        // the parameter bytes before returning. Memory safety of the kernel itself is the
        // caller's contract.
        unsafe {
            sys::cuLaunchKernel(
                self.func.raw,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                shared_mem_bytes,
                self.stream.raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .check("cuLaunchKernel")
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
            launches: AccessTracker::default(),
        })
    }

    /// Compiles CUDA C++ with NVRTC for this device's architecture (`sm_XY` cubin, so
    /// nothing is JIT-compiled at load) and loads it. `name` labels errors.
    pub fn compile_and_load(&self, src: &str, name: &str) -> Result<Module> {
        let (major, minor) = self.device().compute_capability()?;
        let cubin = compile(
            src,
            name,
            &[format!("--gpu-architecture=sm_{major}{minor}")],
            Output::Cubin,
        )?;
        self.load_cubin(&cubin)
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

/// Whether `libnvrtc` can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries dlopen on candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Compiles CUDA C++ source with NVRTC. Needs no GPU, no context and no driver: only
/// `libnvrtc`. Options are passed through (e.g. `--gpu-architecture=sm_90`, `-DN=4`).
pub fn compile(src: &str, name: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    if !nvrtc_available() {
        return Err(Error::NoNvrtc);
    }
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

    let status_name = |r: nvrtc_sys::nvrtcResult| format!("{r:?}");
    let mut prog: nvrtc_sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name, alive for the call; no headers.
    let r = unsafe {
        nvrtc_sys::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Compile {
            program: name.into(),
            status: status_name(r),
            log: String::new(),
        });
    }
    let result = (|| {
        // SAFETY: `prog` is a live program; the option pointers are alive for the call.
        let r = unsafe {
            nvrtc_sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr())
        };
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Compile {
                program: name.into(),
                status: status_name(r),
                log: program_log(prog),
            });
        }
        let mut size = 0usize;
        let mut out;
        // SAFETY: live, compiled program; the buffer has the size NVRTC reported.
        let r = unsafe {
            match output {
                Output::Ptx => {
                    nvrtc_sys::nvrtcGetPTXSize(prog, &mut size);
                    out = vec![0u8; size];
                    nvrtc_sys::nvrtcGetPTX(prog, out.as_mut_ptr().cast())
                }
                Output::Cubin => {
                    nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                    out = vec![0u8; size];
                    nvrtc_sys::nvrtcGetCUBIN(prog, out.as_mut_ptr().cast())
                }
            }
        };
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || out.is_empty() {
            return Err(Error::Compile {
                program: name.into(),
                status: status_name(r),
                log:
                    "no output (for a cubin, name one real architecture: --gpu-architecture=sm_XY)"
                        .into(),
            });
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
    unsafe { nvrtc_sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: nvrtc_sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: live program; the buffer has the size NVRTC reported.
    unsafe {
        if nvrtc_sys::nvrtcGetProgramLogSize(prog, &mut size)
            != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        nvrtc_sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast());
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .trim()
            .to_owned()
    }
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

    #[test]
    fn zero_dimensions_are_rejected() {
        let mut c = LaunchConfig::for_num_elems(10);
        c.block_dim.1 = 0;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        assert!(LaunchConfig::for_num_elems(10).validate().is_ok());
    }
}
