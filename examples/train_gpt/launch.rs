//! Where `train_gpt`'s kernel launches go ([`Target`]: a stream or a graph capture), their
//! arguments ([`Arg`]) and the buffers they take ([`In`]).

use gpubind::{BoundStream, Capture, DeviceMemory, DeviceRepr, Kernel, KernelArg};
use gpubind::{LaunchConfig, Result};

/// A buffer a kernel reads or writes, of `f32`, of the activation type (`f32` or `bf16`,
/// fixed when the module is compiled) or of `u32` tokens: [`Gpt`](crate::gpt::Gpt) keeps
/// each buffer's element type what its kernel parameter says. Taken by shared reference —
/// the buffers a kernel writes go by `arg_written`, claimed as writes — because a captured
/// launch borrows its buffers shared for the graph's lifetime: one wrapper serves both
/// [`Target`]s.
pub trait In: KernelArg {
    /// Elements.
    fn len(&self) -> usize;
    /// The device address of the first element.
    fn addr(&self) -> u64;
}
macro_rules! buffer {
    ($($ty:ident),*) => {$(
        impl<T: DeviceRepr> In for gpubind::$ty<'_, T> {
            fn len(&self) -> usize {
                DeviceMemory::len(self)
            }
            fn addr(&self) -> u64 {
                DeviceMemory::device_ptr(self)
            }
        }
    )*};
}
buffer!(DeviceView, DeviceViewMut);
impl<T: DeviceRepr> In for gpubind::DeviceSlice<T> {
    fn len(&self) -> usize {
        DeviceMemory::len(self)
    }
    fn addr(&self) -> u64 {
        DeviceMemory::device_ptr(self)
    }
}

/// One kernel argument: a buffer the kernel reads or writes (borrowed for `'b`), or a
/// scalar (copied).
#[derive(Clone, Copy)]
pub enum Arg<'b> {
    Buf(&'b dyn KernelArg),
    Written(&'b dyn KernelArg),
    U32(u32),
    I32(i32),
    F32(f32),
}

impl<'b> Arg<'b> {
    /// A buffer the kernel only reads (claimed as a read).
    pub fn b<A: KernelArg>(a: &'b A) -> Self {
        Arg::Buf(a)
    }
    /// A buffer the kernel writes (claimed as a write, though passed by `&`).
    pub fn w<A: KernelArg>(a: &'b A) -> Self {
        Arg::Written(a)
    }
    pub fn s(v: &impl Scalar) -> Self {
        v.arg()
    }
}

/// The scalar kernel parameters.
pub trait Scalar {
    fn arg(&self) -> Arg<'static>;
}
impl Scalar for u32 {
    fn arg(&self) -> Arg<'static> {
        Arg::U32(*self)
    }
}
impl Scalar for i32 {
    fn arg(&self) -> Arg<'static> {
        Arg::I32(*self)
    }
}
impl Scalar for f32 {
    fn arg(&self) -> Arg<'static> {
        Arg::F32(*self)
    }
}

/// Where a kernel launch goes: a stream (run now) or a graph capture (recorded, with
/// every buffer borrowed for the graph's lifetime `'b`).
pub trait Target<'b> {
    /// Launches (or records) `f` with `args`.
    ///
    /// # Safety
    ///
    /// `args` match `f`'s parameters in number and type, and `f` stays inside every
    /// buffer it is given for `cfg`.
    unsafe fn run(&mut self, f: &Kernel, cfg: LaunchConfig, args: &[Arg<'b>]) -> Result<()>;
}

impl<'b> Target<'b> for BoundStream<'_> {
    unsafe fn run(&mut self, f: &Kernel, cfg: LaunchConfig, args: &[Arg<'b>]) -> Result<()> {
        let mut l = self.launch(f, cfg);
        for a in args {
            match a {
                Arg::Buf(x) => l.arg(*x),
                Arg::Written(x) => l.arg_written(*x),
                Arg::U32(v) => l.arg(v),
                Arg::I32(v) => l.arg(v),
                Arg::F32(v) => l.arg(v),
            };
        }
        // SAFETY: the caller's contract.
        unsafe { l.launch() }
    }
}

impl<'b> Target<'b> for Capture<'_, 'b> {
    unsafe fn run(&mut self, f: &Kernel, cfg: LaunchConfig, args: &[Arg<'b>]) -> Result<()> {
        let mut l = self.launch(f, cfg);
        for a in args {
            match *a {
                Arg::Buf(x) => l.arg(x),
                Arg::Written(x) => l.arg_written(x),
                Arg::U32(v) => l.value(v),
                Arg::I32(v) => l.value(v),
                Arg::F32(v) => l.value(v),
            };
        }
        // SAFETY: the caller's contract.
        unsafe { l.launch() }
    }
}
