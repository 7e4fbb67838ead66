//! [`Issue`]: one way to issue memsets, copies and kernel launches, eagerly on a
//! [`BoundStream`] or into a [`Capture`], so that one step function serves both; and
//! [`KernelLaunch`], the launch builder both hand out.

use super::capture::Capture;
use super::capture_launch::CaptureLaunch;
use crate::copy::DeviceOnlyMemory;
use crate::error::Result;
use crate::launch::LaunchConfig;
use crate::memory::{DeviceMemory, DeviceRepr, MemsetValue};
use crate::module::{Function, KernelArg, WritableArg};

pub use super::issue_stream::StreamLaunch;

/// Where stream-ordered work goes: a [`BoundStream`](crate::BoundStream) (enqueued now)
/// or a [`Capture`] (recorded into the graph, run at each launch). Both take the buffers
/// the same way, so a framework's step — its memsets, copies and kernels, and with
/// `blas::Enqueue` (feature `cublas`, which builds on this trait) its matrix
/// products — is written once, generic over `E: Issue<'buf>`, and used for eager steps
/// and for the captured step.
///
/// Every buffer is taken by `&'buf`: in a capture, the graph borrows it for its lifetime
/// `'buf`; on a stream, the work needs nothing past the call (its claims keep the
/// buffer's later uses and its free ordered after it). A destination (of a memset,
/// of a copy, a kernel argument passed to [`arg_written`](KernelLaunch::arg_written)) is
/// taken by `&` too and claimed as **written**: a memset or copy destination must be
/// device-only memory ([`DeviceOnlyMemory`]: [`DeviceSlice`](crate::DeviceSlice), its
/// views, module globals, IPC pool slices; not managed memory, which the host could read
/// through the shared borrow, nor a buffer shared for reading with another process).
/// That is sound for the same reason as a graph's writes and `blas::Enqueue`'s products:
/// every other access to such memory goes through its access tracker and is ordered
/// after the write. The inherent methods of `BoundStream`, which take destinations by
/// `&mut`, stay available.
///
/// Implemented by `BoundStream` and `Capture` only (sealed). In a capture, the graph
/// borrows each kernel's module for `'buf` too ([`launch`](Issue::launch) takes a
/// `&Function<'buf>`); a [`Kernel`](crate::Kernel) holds its module and fits any `'buf`.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, DeviceSlice, Function, Issue, KernelLaunch, LaunchConfig, Result};
/// use gpubind::ThreadContext;
///
/// /// `y = 0`, then `y += x` twice: one step, eager or captured.
/// fn step<'buf>(
///     e: &mut impl Issue<'buf>,
///     add: &'buf Function<'buf>,
///     x: &'buf DeviceSlice<f32>,
///     y: &'buf DeviceSlice<f32>,
/// ) -> Result<()> {
///     let n = x.len() as u32;
///     e.memset_zeros(y)?;
///     for _ in 0..2 {
///         // SAFETY: (float*, const float*, unsigned) matches `add`, which stays in
///         // bounds and writes only `y`.
///         unsafe {
///             e.launch(add, LaunchConfig::for_num_elems(n))
///                 .arg_written(y).arg(x).value(n)
///                 .launch()?
///         };
///     }
///     Ok(())
/// }
///
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let module = gpu.compile_and_load(
///     r#"extern "C" __global__ void add(float* y, const float* x, unsigned n) {
///            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///            if (i < n) y[i] += x[i];
///        }"#,
///     "add.cu",
/// )?;
/// let add = module.function("add")?;
/// let x = gpu.clone_htod(&[1.5f32; 256])?;
/// let y = gpu.alloc_zeros::<f32>(256)?;
/// // Eagerly, on a stream:
/// step(&mut gpu.default_stream(), &add, &x, &y)?;
/// let eager = gpu.dtoh(&y)?;
/// // The same function captured into a graph:
/// let graph = gpu.capture(|cap| step(cap, &add, &x, &y))?;
/// graph.instantiate()?.launch(&gpu.default_stream())?;
/// assert_eq!(gpu.dtoh(&y)?, eager);
/// # Ok(()) }
/// ```
///
/// A buffer used in a capture is borrowed as long as the graph, also through the trait:
///
/// ```compile_fail,E0597
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// use gpubind::Issue;
/// fn zero<'buf>(e: &mut impl Issue<'buf>, x: &'buf gpubind::DeviceSlice<u32>) -> gpubind::Result<()> {
///     e.memset_zeros(x)
/// }
/// let graph = {
///     let x = gpu.alloc_zeros::<u32>(4)?;
///     gpu.capture(|c| zero(c, &x))? // error[E0597]: `x` does not live long enough
/// };
/// graph.instantiate()?;
/// # Ok(()) }
/// ```
///
/// Managed memory is not a destination (its host view would be readable while the
/// memset writes it):
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
/// use gpubind::Issue;
/// let m = gpu.alloc_managed::<f32>(4)?;
/// Issue::memset_zeros(&mut gpu.default_stream(), &m)?; // error[E0277]: not DeviceOnlyMemory
/// # Ok(()) }
/// ```
pub trait Issue<'buf>: sealed::Sealed {
    /// The launch builder of [`launch`](Issue::launch): [`StreamLaunch`] or
    /// [`CaptureLaunch`].
    type Launch<'l>: KernelLaunch<'buf>
    where
        Self: 'l,
        'buf: 'l;

    /// Zeroes `dst`: [`BoundStream::memset_zeros_async`](crate::BoundStream::memset_zeros_async)
    /// (through a shared borrow) / [`Capture::memset_zeros`].
    ///
    /// # Errors
    ///
    /// [`Error::WrongDevice`](crate::Error::WrongDevice) for memory of another device
    /// than the stream's or the capture's; a driver error.
    fn memset_zeros<T, D>(&mut self, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;

    /// Sets every element of `dst` to `value` (1-, 2- and 4-byte types):
    /// [`BoundStream::memset_async`](crate::BoundStream::memset_async) (through a shared
    /// borrow) / [`Capture::memset`].
    ///
    /// # Errors
    ///
    /// As [`memset_zeros`](Issue::memset_zeros), and
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a destination not
    /// aligned to the value's size.
    fn memset<T, D>(&mut self, dst: &'buf D, value: T) -> Result<()>
    where
        T: MemsetValue,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;

    /// Copies `src` into `dst`, both memory of the stream's or the capture's device:
    /// [`BoundStream::dtod_async`](crate::BoundStream::dtod_async) (through a shared
    /// borrow) / [`Capture::dtod`].
    ///
    /// # Errors
    ///
    /// [`Error::WrongDevice`](crate::Error::WrongDevice) for memory of another device,
    /// [`Error::SizeMismatch`](crate::Error::SizeMismatch) for different lengths,
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for overlapping parts
    /// of one allocation; a driver error.
    fn dtod<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;

    /// Starts a launch of `func`: [`BoundStream::launch`](crate::BoundStream::launch) /
    /// [`Capture::launch`], with the arguments of [`KernelLaunch`].
    fn launch<'l>(&'l mut self, func: &'l Function<'buf>, cfg: LaunchConfig) -> Self::Launch<'l>;
}

/// A kernel launch being built by an [`Issue`]r: [`StreamLaunch`] (eager) or
/// [`CaptureLaunch`] (captured). Arguments are appended in the kernel's parameter order;
/// the checks of [`LaunchBuilder`](crate::LaunchBuilder) (argument count and sizes,
/// devices, launch limits) report at [`launch`](KernelLaunch::launch). Sealed.
///
/// Generic code that passes an argument as written bounds it `WritableArg`, as for the
/// concrete builders:
///
/// ```compile_fail,E0277
/// use gpubind::{Function, Issue, KernelArg, KernelLaunch, LaunchConfig, Result};
/// fn fill<'buf, A: KernelArg>(
///     e: &mut impl Issue<'buf>,
///     f: &'buf Function<'buf>,
///     x: &'buf A,
/// ) -> Result<()> {
///     // SAFETY: (T*) matches `f`, which stays in bounds and writes only `x`.
///     unsafe { e.launch(f, LaunchConfig::for_num_elems(1)).arg_written(x).launch() }
///     // error[E0277]: `A` is read-only as a kernel argument
/// }
/// ```
pub trait KernelLaunch<'buf>: sealed::Sealed {
    /// Appends an argument the kernel only **reads**: a buffer is claimed as read
    /// ([`LaunchBuilder::arg`](crate::LaunchBuilder::arg) with `&`); plain data is
    /// passed by value (its bytes are read at `launch`, or copied at capture).
    fn arg<A: KernelArg>(&mut self, arg: &'buf A) -> &mut Self;

    /// Appends a buffer the kernel **writes**, borrowed shared and claimed as written
    /// ([`LaunchBuilder::arg_written`](crate::LaunchBuilder::arg_written),
    /// [`CaptureLaunch::arg_written`]): a [`WritableArg`](crate::WritableArg), so a
    /// buffer shared for reading with another process, or a shared
    /// [`ManagedView`](crate::ManagedView), does not compile here.
    fn arg_written<A: WritableArg>(&mut self, arg: &'buf A) -> &mut Self;

    /// Appends plain data by value: the launch keeps a copy, so nothing stays borrowed
    /// ([`CaptureLaunch::value`]).
    fn value<T: DeviceRepr>(&mut self, v: T) -> &mut Self;

    /// Enqueues the kernel (on a stream) or captures it (in a capture). May be called
    /// again.
    ///
    /// # Errors
    ///
    /// Those of [`LaunchBuilder::launch`](crate::LaunchBuilder::launch), before the
    /// driver is called.
    ///
    /// # Safety
    ///
    /// The contract of [`LaunchBuilder::launch`](crate::LaunchBuilder::launch) (and, in
    /// a capture, of [`CaptureLaunch::launch`], for every launch of the graph): the
    /// arguments have the types the kernel declares; the kernel stays inside the buffers
    /// passed and writes only those passed to [`arg_written`](KernelLaunch::arg_written),
    /// none of them a [`ManagedSlice`](crate::ManagedSlice) (a shared borrow does not
    /// keep its host slices away); any other memory it reaches stays alive and unused by
    /// the host and other streams while the kernel may run.
    unsafe fn launch(&mut self) -> Result<()>;
}

pub(super) mod sealed {
    /// Implemented by the [`Issue`](super::Issue)rs and their launches only.
    pub trait Sealed {}
    impl Sealed for crate::stream::BoundStream<'_> {}
    impl Sealed for super::Capture<'_, '_> {}
    impl Sealed for super::StreamLaunch<'_, '_> {}
    impl Sealed for super::CaptureLaunch<'_, '_, '_> {}
}

impl<'c, 'buf> Issue<'buf> for Capture<'c, 'buf> {
    type Launch<'l>
        = CaptureLaunch<'l, 'c, 'buf>
    where
        Self: 'l,
        'buf: 'l;

    fn memset_zeros<T, D>(&mut self, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        Capture::memset_zeros(self, dst)
    }

    fn memset<T, D>(&mut self, dst: &'buf D, value: T) -> Result<()>
    where
        T: MemsetValue,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        Capture::memset(self, dst, value)
    }

    fn dtod<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        Capture::dtod(self, src, dst)
    }

    fn launch<'l>(&'l mut self, func: &'l Function<'buf>, cfg: LaunchConfig) -> Self::Launch<'l> {
        Capture::launch(self, func, cfg)
    }
}

impl<'buf> KernelLaunch<'buf> for CaptureLaunch<'_, '_, 'buf> {
    fn arg<A: KernelArg>(&mut self, arg: &'buf A) -> &mut Self {
        CaptureLaunch::arg(self, arg)
    }

    fn arg_written<A: WritableArg>(&mut self, arg: &'buf A) -> &mut Self {
        CaptureLaunch::arg_written(self, arg)
    }

    fn value<T: DeviceRepr>(&mut self, v: T) -> &mut Self {
        CaptureLaunch::value(self, v)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        // SAFETY: the caller's contract is this one's, which includes `CaptureLaunch::launch`'s.
        unsafe { CaptureLaunch::launch(self) }
    }
}

/// The type-level check that one step compiles for both issuers (a failure is a build
/// error of the tests).
#[cfg(test)]
mod generic_step {
    use super::*;
    use crate::memory::DeviceSlice;
    use crate::stream::BoundStream;

    /// A step written once: a memset, a fill, a copy, and a launch with every kind of
    /// argument.
    fn step<'buf, E: Issue<'buf>>(
        e: &mut E,
        f: &'buf Function<'buf>,
        (x, y): (&'buf DeviceSlice<u32>, &'buf DeviceSlice<u32>),
        n: &'buf u32,
    ) -> Result<()> {
        e.memset_zeros(y)?;
        e.memset(x, 1u32)?;
        e.dtod(x, y)?;
        let mut l = e.launch(f, LaunchConfig::for_num_elems(*n));
        l.arg_written(y).arg(x).arg(n).value(2.5f32);
        // SAFETY: never called (a type-level check).
        unsafe { l.launch() }
    }

    type Buffers<'buf> = (&'buf DeviceSlice<u32>, &'buf DeviceSlice<u32>);
    type Step<'buf, E> = fn(&mut E, &'buf Function<'buf>, Buffers<'buf>, &'buf u32) -> Result<()>;

    const _: Step<'static, BoundStream<'static>> = step;
    const _: Step<'static, Capture<'static, 'static>> = step;
}
