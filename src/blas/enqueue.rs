//! [`Enqueue`]: one way to call the products, on a stream or in a capture, so that one
//! forward or backward function serves eager and captured steps; it extends
//! [`Issue`](crate::Issue), which does the same for memsets, copies and kernels.
//!
//! Each product's signature and argument handling is written once, in the trait's
//! provided methods: they describe the call ([`GemmCall`], [`LtCall`]) and hand it to
//! one hidden method per kind of product, which `BoundStream` implements by claiming
//! and enqueueing (`BoundStream::gemm_call`, `lt_call`, which its inherent `&mut`
//! methods use too) and `Capture` by recording and capturing (`Capture::capture_gemm`,
//! `capture_lt`).

use super::call::{GemmCall, LtCall};
use super::capture::CaptureLtArgs;
use super::epilogue::Epilogue;
use super::handle::Blas;
use super::types::{Batch, BlasScalar, Matmul, MatmulOutput};
use crate::copy::DeviceOnlyMemory;
use crate::error::Result;
use crate::graph::{Capture, Issue};
use crate::memory::DeviceMemory;
use crate::stream::BoundStream;

/// Where products go: a [`BoundStream`] (enqueued now) or a [`Capture`] (recorded into
/// the graph, run at each launch). Both take the operands the same way, so a model's
/// forward and backward can be written once, generic over `E: Enqueue<'buf>`, and used
/// for eager steps and for the captured step. An `Enqueue` is an [`Issue`]: the same
/// `E` zeroes, copies and launches kernels ([`Issue::memset_zeros`], [`Issue::dtod`],
/// [`Issue::launch`]), its writes taken by `&` the same way.
///
/// Inputs are read and taken by `&`; the output too is taken by `&` and claimed as
/// **written**, as [`LaunchBuilder::arg_written`](crate::LaunchBuilder::arg_written)
/// does for kernels. That is sound because the output must be device-only memory
/// ([`DeviceOnlyMemory`]: [`DeviceSlice`](crate::DeviceSlice), its views, IPC pool
/// slices; not managed memory, which the host could read through the shared borrow):
/// every other access to such memory — kernels, copies, products, collectives, graph
/// launches, `dtoh` — goes through its access tracker and is ordered after the write.
/// On a stream, the borrows end when the call returns (the claims keep later uses and
/// frees ordered after the product); in a capture, they last for the graph (`'buf`).
/// The handle is taken by `&Blas` (it is not `Sync`), so the model can keep it beside
/// the buffers it lends the step.
///
/// The methods need the trait in scope (`use gpubind::blas::Enqueue`), as
/// `std::io::Read`'s do; they are the only way to capture a product. On a
/// `BoundStream`, method-call syntax finds its inherent methods first
/// ([`BoundStream::matmul`] and the others, which take C by `&mut`: the same checks,
/// claims and enqueue); `Enqueue::matmul(&mut stream, …)` or generic code calls the
/// trait's. Implemented by `BoundStream` and `Capture` only: it extends the sealed
/// [`Issue`].
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::blas::{Blas, Enqueue, Matmul};
/// use gpubind::{Device, DeviceSlice, Result, ThreadContext};
///
/// /// `h = x·W1ᵀ`, `y = h·W2ᵀ`: one forward, eager or captured.
/// fn forward<'buf>(
///     e: &mut impl Enqueue<'buf>,
///     blas: &Blas,
///     (w1, w2): (&'buf DeviceSlice<f32>, &'buf DeviceSlice<f32>),
///     x: &'buf DeviceSlice<f32>,
///     (h, y): (&'buf DeviceSlice<f32>, &'buf DeviceSlice<f32>),
/// ) -> Result<()> {
///     e.matmul(blas, &Matmul::new(8, 32, 16).transpose_b(), x, w1, h)?;
///     e.matmul(blas, &Matmul::new(8, 4, 32).transpose_b(), h, w2, y)
/// }
///
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let blas = gpu.new_blas()?;
/// let w = (gpu.clone_htod(&[0.5f32; 32 * 16])?, gpu.clone_htod(&[0.25f32; 4 * 32])?);
/// let x = gpu.clone_htod(&[1.0f32; 8 * 16])?;
/// let (h, y) = (gpu.alloc_zeros::<f32>(8 * 32)?, gpu.alloc_zeros::<f32>(8 * 4)?);
/// // Eagerly, on a stream:
/// let mut stream = gpu.default_stream();
/// forward(&mut stream, &blas, (&w.0, &w.1), &x, (&h, &y))?;
/// let eager = gpu.dtoh(&y)?;
/// // The same function captured into a graph:
/// let graph = gpu.capture(|cap| forward(cap, &blas, (&w.0, &w.1), &x, (&h, &y)))?;
/// graph.instantiate()?.launch(&gpu.default_stream())?;
/// assert_eq!(gpu.dtoh(&y)?, eager);
/// # Ok(()) }
/// ```
///
/// Managed memory is not an output (its host view would be readable while the product
/// writes it):
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &gpubind::blas::Blas) -> gpubind::Result<()> {
/// use gpubind::blas::{Enqueue, Matmul};
/// let a = gpu.alloc_zeros::<f32>(4)?;
/// let c = gpu.alloc_managed::<f32>(4)?;
/// Enqueue::matmul(&mut gpu.default_stream(), blas, &Matmul::new(2, 2, 2), &a, &a, &c)?;
/// # Ok(()) }
/// ```
pub trait Enqueue<'buf>: Issue<'buf> {
    /// `C = alpha·op(A)·op(B) + beta·C`, the product of [`BoundStream::matmul`] (its
    /// types, shapes, checks and claims) with C taken by `&`. `a` and `b` are read, `c`
    /// written (at each launch of the graph, in a capture); `c` must not overlap `a` or
    /// `b` ([`MatmulError::Aliasing`](super::MatmulError::Aliasing)).
    ///
    /// A graph keeps what its kernels need alive: the handle's workspace (which they
    /// use at each launch, claimed as written, so launches are ordered against the
    /// handle's other products and other graphs that use it) and the cuBLAS and cuBLASLt
    /// handles themselves. `blas` is free again when the capture call returns and may be
    /// dropped before the graph.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::blas::{Enqueue, Matmul};
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0])?;
    /// let c = gpu.alloc_zeros::<f32>(4)?;
    /// let graph = gpu.capture(|cap| cap.matmul(&blas, &Matmul::new(2, 2, 2), &a, &b, &c))?;
    /// drop(blas); // the graph keeps the handle and its workspace
    /// let exec = graph.instantiate()?;
    /// exec.launch(&gpu.default_stream())?;
    /// assert_eq!(gpu.dtoh(&c)?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// In a capture, the matrices stay borrowed while the graph lives:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &gpubind::blas::Blas) -> gpubind::Result<()> {
    /// use gpubind::blas::{Enqueue, Matmul};
    /// let (a, b, c) = (gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?);
    /// let graph = gpu.capture(|cap| cap.matmul(blas, &Matmul::new(2, 2, 2), &a, &b, &c))?;
    /// drop(c); // error[E0505]: cannot move out of `c` because it is borrowed
    /// let _ = graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul`], before cuBLAS is called.
    #[inline]
    fn matmul<T, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.issue_gemm(blas, GemmCall::new::<T, T, _, _, _>(shape, None, (a, b, c)))
    }

    /// A strided batch of products ([`BoundStream::matmul_batched`]), with the claims
    /// and lifetimes of [`matmul`](Enqueue::matmul).
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul_batched`].
    #[inline]
    fn matmul_batched<T, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let call = GemmCall::new::<T, T, _, _, _>(shape, Some(batch), (a, b, c));
        self.issue_gemm(blas, call)
    }

    /// A product with C of another element type than A and B
    /// ([`BoundStream::matmul_mixed`]: f16 or bf16 inputs, an f32 output), with the
    /// claims and lifetimes of [`matmul`](Enqueue::matmul).
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul_mixed`].
    #[inline]
    fn matmul_mixed<TIn, TOut, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        TIn: BlasScalar,
        TOut: MatmulOutput<TIn>,
        A: DeviceMemory<TIn> + ?Sized,
        B: DeviceMemory<TIn> + ?Sized,
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized,
    {
        let call = GemmCall::new::<TIn, TOut, _, _, _>(shape, None, (a, b, c));
        self.issue_gemm(blas, call)
    }

    /// A strided batch of mixed-type products
    /// ([`BoundStream::matmul_batched_mixed`]), with the claims and lifetimes of
    /// [`matmul`](Enqueue::matmul).
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul_batched_mixed`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn matmul_batched_mixed<TIn, TOut, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        TIn: BlasScalar,
        TOut: MatmulOutput<TIn>,
        A: DeviceMemory<TIn> + ?Sized,
        B: DeviceMemory<TIn> + ?Sized,
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized,
    {
        let call = GemmCall::new::<TIn, TOut, _, _, _>(shape, Some(batch), (a, b, c));
        self.issue_gemm(blas, call)
    }

    /// A product whose alpha and beta are read from device memory when it runs
    /// ([`BoundStream::matmul_device_scalars`]); in a capture, at each launch of the
    /// graph: write new values into `scales` between launches (a kernel or a copy on a
    /// stream; `scales` is claimed as read at each launch, so the launch runs after the
    /// write) and the next launch uses them. The claims and lifetimes of
    /// [`matmul`](Enqueue::matmul) otherwise.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::blas::{Enqueue, Matmul};
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0])?;
    /// let scales = gpu.clone_htod(&[3.0f32, 0.0])?;
    /// let c = gpu.alloc_zeros::<f32>(4)?;
    /// let shape = Matmul::new(2, 2, 2);
    /// let graph = gpu.capture(|cap| cap.matmul_device_scalars(&blas, &shape, &scales, &a, &b, &c))?;
    /// graph.instantiate()?.launch(&gpu.default_stream())?;
    /// assert_eq!(gpu.dtoh(&c)?, [3.0, 6.0, 9.0, 12.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul_device_scalars`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn matmul_device_scalars<T, S, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        scales: &'buf S,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        T: BlasScalar,
        S: DeviceMemory<T::Scale> + ?Sized,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let call = GemmCall::new::<T, T, _, _, _>(shape, None, (a, b, c));
        self.issue_gemm(blas, call.device_scalars::<T, _>(scales))
    }

    /// A cuBLASLt product with an epilogue ([`BoundStream::matmul_lt`]), its extra
    /// operands in [`CaptureLtArgs`] (outputs device-only, taken by `&` and claimed as
    /// written), with the claims and lifetimes of [`matmul`](Enqueue::matmul); in a
    /// capture, the epilogue's operands are borrowed for the graph's lifetime too, read
    /// or written at each launch.
    ///
    /// # Errors
    ///
    /// Those of [`BoundStream::matmul_lt`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn matmul_lt<T, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        epilogue: Epilogue,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
        args: CaptureLtArgs<'buf, T>,
    ) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let call = LtCall::new::<T, _, _, _>(shape, epilogue, (a, b, c), args.extras());
        self.issue_lt(blas, call)
    }

    /// Issues a described cuBLAS product: claimed and enqueued on a stream, recorded and
    /// captured in a capture. Not part of the API (the argument cannot be built outside
    /// gpubind).
    #[doc(hidden)]
    fn issue_gemm(&mut self, blas: &Blas, call: GemmCall<'_, 'buf>) -> Result<()>;

    /// Issues a described cuBLASLt product, as [`issue_gemm`](Enqueue::issue_gemm) does.
    #[doc(hidden)]
    fn issue_lt(&mut self, blas: &Blas, call: LtCall<'_, 'buf>) -> Result<()>;
}

impl<'buf> Enqueue<'buf> for BoundStream<'_> {
    #[inline]
    fn issue_gemm(&mut self, blas: &Blas, call: GemmCall<'_, 'buf>) -> Result<()> {
        self.gemm_call(blas, call)
    }

    #[inline]
    fn issue_lt(&mut self, blas: &Blas, call: LtCall<'_, 'buf>) -> Result<()> {
        self.lt_call(blas, call)
    }
}

impl<'buf> Enqueue<'buf> for Capture<'_, 'buf> {
    #[inline]
    fn issue_gemm(&mut self, blas: &Blas, call: GemmCall<'_, 'buf>) -> Result<()> {
        self.capture_gemm(blas, call)
    }

    #[inline]
    fn issue_lt(&mut self, blas: &Blas, call: LtCall<'_, 'buf>) -> Result<()> {
        self.capture_lt(blas, call)
    }
}

/// The type-level check that one step with every product compiles for both issuers (a
/// failure is a build error of the tests).
#[cfg(test)]
mod generic_step {
    use super::*;
    use crate::memory::DeviceSlice;
    use half::bf16;

    type F32<'buf> = &'buf DeviceSlice<f32>;

    /// Every product of [`Enqueue`], written once.
    fn step<'buf, E: Enqueue<'buf>>(
        e: &mut E,
        blas: &Blas,
        (x, y, scales): (F32<'buf>, F32<'buf>, F32<'buf>),
        h: &'buf DeviceSlice<bf16>,
    ) -> Result<()> {
        let (shape, batch) = (Matmul::new(2, 2, 2), Batch::new(1, 4, 4, 4));
        e.matmul(blas, &shape, x, x, y)?;
        e.matmul_batched(blas, &shape, &batch, x, x, y)?;
        e.matmul_mixed(blas, &shape, h, h, y)?;
        e.matmul_batched_mixed(blas, &shape, &batch, h, h, y)?;
        e.matmul_device_scalars(blas, &shape, scales, x, x, y)?;
        let args = CaptureLtArgs::new().bias(x);
        e.matmul_lt(blas, &shape, Epilogue::Bias, x, x, y, args)
    }

    type Buffers<'buf> = (F32<'buf>, F32<'buf>, F32<'buf>);
    type Step<'buf, E> = fn(&mut E, &Blas, Buffers<'buf>, &'buf DeviceSlice<bf16>) -> Result<()>;

    const _: Step<'static, BoundStream<'static>> = step;
    const _: Step<'static, Capture<'static, 'static>> = step;
}
