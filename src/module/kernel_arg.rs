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
    /// Why the argument must never be written (a buffer another process reads at the
    /// same time, ordered by nothing), or `None`: a launch that would claim it as
    /// written (`&mut`, `arg_written`) fails with [`Error::InvalidArgument`] instead.
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    #[doc(hidden)]
    fn read_only(&self) -> Option<&'static str> {
        None
    }
}

/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if argument `i` is claimed
/// as written (`access`) but [`KernelArg::read_only`] says it must never be. Inlined: for
/// an argument whose `read_only` is the default `None` it costs nothing on the launch
/// path; the refusal is built out of line.
#[inline(always)]
pub(crate) fn check_write<A: KernelArg + ?Sized>(
    arg: &A,
    i: usize,
    access: crate::access::Access,
) -> crate::error::Result<()> {
    match arg.read_only() {
        Some(why) if access == crate::access::Access::Write => {
            Err(written_read_only(i, arg.describe(), why))
        }
        _ => Ok(()),
    }
}

/// The refusal of [`check_write`].
#[cold]
#[inline(never)]
fn written_read_only(i: usize, what: String, why: &'static str) -> crate::error::Error {
    crate::error::Error::InvalidArgument(format!(
        "kernel argument {i} ({what}) is passed as written (`&mut` or `arg_written`), but {why}"
    ))
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

/// How a launch is given a [`KernelArg`]: by `&` (the kernel only reads a buffer passed
/// so) or by `&mut` (the kernel may write it). The argument of
/// [`LaunchBuilder::arg`](crate::LaunchBuilder::arg) and its siblings; implemented for
/// `&A` and `&mut A` of every `KernelArg` type `A`, and for nothing else (sealed).
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

impl<'a, A: KernelArg + ?Sized> LaunchArg<'a> for &'a mut A {
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
    };
}
memory_arg!(DeviceSlice);
memory_arg!(DeviceView<'a>);
memory_arg!(DeviceViewMut<'a>);
pub(crate) use memory_arg;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Access;
    use crate::error::Error;

    /// An argument that must never be written.
    struct Frozen(u64);

    // SAFETY: passes its own 8 bytes, borrowed with it.
    unsafe impl KernelArg for Frozen {
        fn param_ptr(&self) -> *mut c_void {
            &self.0 as *const u64 as *mut c_void
        }
        fn param_size(&self) -> usize {
            8
        }
        fn describe(&self) -> String {
            "Frozen".into()
        }
        fn read_only(&self) -> Option<&'static str> {
            Some("it is frozen")
        }
    }

    #[test]
    fn a_read_only_argument_is_refused_as_written_only() {
        check_write(&Frozen(1), 0, Access::Read).unwrap();
        match check_write(&Frozen(1), 3, Access::Write) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("argument 3 (Frozen)"), "{m}");
                assert!(m.contains("it is frozen"), "{m}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        // Plain data and ordinary buffers are never refused.
        check_write(&7u32, 0, Access::Write).unwrap();
    }
}
