//! [`KernelArg`]: what a launch may pass to a kernel (plain data by value, gpubind
//! buffers by address), and `memory_arg!`, its impl for buffer types.

use crate::device::Device;
use crate::memory::{DeviceRepr, DeviceSlice, DeviceView, DeviceViewMut};
use cudarc::driver::sys;
use std::ffi::c_void;

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
/// keeps alive what it points to, which is why
/// [`LaunchBuilder::launch`](crate::LaunchBuilder::launch) is `unsafe` and its contract
/// names such memory.
///
/// # Arguments a kernel writes
///
/// Only a [`WritableArg`] can be passed as written (by `&mut`, or to
/// [`arg_written`](crate::LaunchBuilder::arg_written)): every `DeviceRepr` type and every
/// gpubind buffer and view is one, except the buffers shared for reading with another
/// process (`ipc::Shared`, `ipc::SharedImport`) and a shared
/// [`ManagedView`](crate::ManagedView), which go by `&` only. A type of your own
/// implements `KernelArg`, and `WritableArg` too if kernels may write what it passes:
///
/// ```
/// use gpubind::{KernelArg, WritableArg};
/// use std::ffi::c_void;
///
/// /// Device memory that another library owns and keeps alive, passed as its address.
/// struct Foreign {
///     dptr: u64,
/// }
///
/// // SAFETY: passes the address field: 8 bytes that live as long as the borrow.
/// unsafe impl KernelArg for Foreign {
///     fn param_ptr(&self) -> *mut c_void {
///         &self.dptr as *const u64 as *mut c_void
///     }
///     fn param_size(&self) -> usize {
///         8
///     }
///     fn describe(&self) -> String {
///         format!("Foreign({:#x})", self.dptr)
///     }
/// }
///
/// // SAFETY: nothing relies on the memory staying unchanged while a kernel runs.
/// unsafe impl WritableArg for Foreign {}
/// ```
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
    /// the launch is ordered after its conflicting uses and recorded as a read (passed
    /// by `&`) or a write (passed by `&mut`), see [`LaunchArg`].
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

/// A [`KernelArg`] that a kernel may write: one a launch may claim as written, passed by
/// `&mut` (see [`LaunchArg`]) or to [`LaunchBuilder::arg_written`] (or
/// [`CaptureLaunch::arg_written`]).
///
/// Implemented for every [`DeviceRepr`] type (plain data is passed the same either way)
/// and every gpubind buffer and view, except the buffers shared for reading with another
/// process (`ipc::Shared`, `ipc::SharedImport`): that process reads the memory at the
/// same time, ordered by nothing, so passing one as written does not compile (their
/// `unsafe` `view_mut` is the way to write one deliberately); and except a shared
/// [`ManagedView`](crate::ManagedView), made from `&ManagedSlice`, beside which host
/// slices of the memory may be held (write through
/// [`ManagedSlice::slice_mut`](crate::ManagedSlice::slice_mut) instead).
///
/// Generic code that passes an argument as written bounds it so:
///
/// ```compile_fail,E0277
/// # use gpubind::{BoundStream, Function, KernelArg, LaunchConfig};
/// fn fill<A: KernelArg>(s: &BoundStream<'_>, f: &Function<'_>, x: &A) -> gpubind::Result<()> {
///     // SAFETY: (T*) matches `f`, which stays in bounds and writes only `x`.
///     unsafe { s.launch(f, LaunchConfig::for_num_elems(1)).arg_written(x).launch() }
///     // error[E0277]: `A` is read-only as a kernel argument
/// }
/// ```
///
/// Bound it `A: WritableArg` (which implies `KernelArg`).
///
/// [`LaunchBuilder::arg_written`]: crate::LaunchBuilder::arg_written
/// [`CaptureLaunch::arg_written`]: crate::CaptureLaunch::arg_written
///
/// # Safety
///
/// A kernel may write the memory the argument passes whenever a launch claims it as
/// written: nothing relies on that memory staying unchanged beyond what the argument's
/// pending-use tracker orders (no other process reads it unordered, as it does a
/// buffer shared for reading).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is read-only as a kernel argument: it cannot be passed by `&mut` or to `arg_written`",
    label = "passed as written",
    note = "a buffer that others read meanwhile, ordered by nothing, is no `WritableArg`: pass it by `&`. To write, use a writable handle: for a buffer shared for reading with another process (`ipc::Shared`, `ipc::SharedImport`) the view of its `unsafe` `view_mut(range)`; for a shared view of managed memory (`ManagedView`, whose host slices may be held) `ManagedSlice::slice_mut` or the slice itself",
    note = "a `KernelArg` of your own that kernels may write implements `WritableArg`"
)]
pub unsafe trait WritableArg: KernelArg {}

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

// SAFETY: the kernel receives a copy of the value: nothing it writes reaches the value.
// Not recommended: a type that is no `WritableArg` is reported as such, not as a missing
// `DeviceRepr`.
#[diagnostic::do_not_recommend]
unsafe impl<T: DeviceRepr> WritableArg for T {}

/// How a launch is given a [`KernelArg`]: by `&` (the kernel only reads a buffer passed
/// so) or by `&mut` (the kernel may write it). The argument of
/// [`LaunchBuilder::arg`](crate::LaunchBuilder::arg) and its siblings; implemented for
/// `&A` of every `KernelArg` type `A` and for `&mut A` of every [`WritableArg`] one, and
/// for nothing else (sealed).
///
/// The launch claims a gpubind buffer passed by `&` as a **read**: it waits for the
/// buffer's pending write, launches on other streams that only read it run concurrently
/// with it, and only a write (a launch that passes it by `&mut`, a copy into it, the
/// host's access through `&mut`, its free) is ordered after it. A buffer passed by `&mut`
/// is claimed as a **write**: ordered after every pending use, and every later use is
/// ordered after it. Writing through a buffer passed by `&` is outside
/// [`LaunchBuilder::launch`](crate::LaunchBuilder::launch)'s contract; a buffer written
/// through a shared reference (one held in an `Arc`, or borrowed by a graph) goes by
/// [`arg_written`](crate::LaunchBuilder::arg_written). Plain data is passed the same
/// either way.
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, module: &gpubind::Module) -> gpubind::Result<()> {
/// use gpubind::LaunchConfig;
/// // extern "C" __global__ void scale(const float* w, float* y, unsigned n) { … }
/// let scale = module.function("scale")?;
/// let w = gpu.clone_htod(&[2.0f32; 64])?;
/// let (mut y1, mut y2) = (gpu.alloc_zeros::<f32>(64)?, gpu.alloc_zeros::<f32>(64)?);
/// let (s1, s2) = (gpu.new_stream()?, gpu.new_stream()?);
/// let cfg = LaunchConfig::for_num_elems(64);
/// // SAFETY: (const float*, float*, unsigned) matches `scale`, which stays in bounds and
/// // writes only `y`.
/// unsafe {
///     // Both read `w`: the two kernels may run at once.
///     gpu.on(&s1)?.launch(&scale, cfg).arg(&w).arg(&mut y1).arg(&64u32).launch()?;
///     gpu.on(&s2)?.launch(&scale, cfg).arg(&w).arg(&mut y2).arg(&64u32).launch()?;
/// }
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed to a kernel: a launch takes a `KernelArg` by `&`, or a `WritableArg` by `&mut`",
    label = "no `KernelArg` by `&`, nor a `WritableArg` by `&mut`",
    note = "plain data is a `KernelArg` when it is `DeviceRepr`; a `KernelArg` of your own that kernels may write implements `WritableArg`",
    note = "a buffer that others read meanwhile, ordered by nothing, is no `WritableArg`: pass it by `&`. To write, use a writable handle: for a buffer shared for reading with another process (`ipc::Shared`, `ipc::SharedImport`) the view of its `unsafe` `view_mut(range)`; for a shared view of managed memory (`ManagedView`, whose host slices may be held) `ManagedSlice::slice_mut` or the slice itself"
)]
pub trait LaunchArg<'a>: sealed::Sealed {
    /// The argument passed.
    #[doc(hidden)]
    type Target: KernelArg + ?Sized + 'a;
    /// Whether the kernel may write through the argument (it was passed by `&mut`).
    #[doc(hidden)]
    const WRITES: bool;
    /// The argument, borrowed shared for `'a` (a `&mut` keeps its exclusive borrow).
    #[doc(hidden)]
    fn into_arg(self) -> &'a Self::Target;
}

mod sealed {
    pub trait Sealed {}
    impl<A: super::KernelArg + ?Sized> Sealed for &A {}
    impl<A: super::KernelArg + ?Sized> Sealed for &mut A {}
}

impl<'a, A: KernelArg + ?Sized> LaunchArg<'a> for &'a A {
    type Target = A;
    const WRITES: bool = false;
    #[inline(always)]
    fn into_arg(self) -> &'a A {
        self
    }
}

impl<'a, A: KernelArg + WritableArg + ?Sized> LaunchArg<'a> for &'a mut A {
    type Target = A;
    const WRITES: bool = true;
    #[inline(always)]
    fn into_arg(self) -> &'a A {
        self
    }
}

/// How a launch claims an argument passed as `L` (a [`LaunchArg`]).
#[inline(always)]
pub(crate) fn arg_access<'a, L: LaunchArg<'a>>() -> crate::access::Access {
    if L::WRITES {
        crate::access::Access::Write
    } else {
        crate::access::Access::Read
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
        // SAFETY: gpubind memory of this process, written in the order its tracker keeps.
        unsafe impl<$($lt,)? T: DeviceRepr> crate::module::WritableArg for $ty<$($lt,)? T> {}
    };
}
memory_arg!(DeviceSlice);
memory_arg!(DeviceView<'a>);
memory_arg!(DeviceViewMut<'a>);
pub(crate) use memory_arg;
