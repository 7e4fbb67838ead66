//! [`Enqueue`]: one way to call the products, on a stream or in a capture, so that one
//! forward or backward function serves eager and captured steps; it extends
//! [`Issue`](crate::Issue), which does the same for memsets, copies and kernels.

use super::capture::CaptureLtArgs;
use super::epilogue::Epilogue;
use super::handle::Blas;
use super::types::{Batch, BlasScalar, Matmul, MatmulOutput};
use crate::copy::DeviceOnlyMemory;
use crate::error::Result;
use crate::graph::{Capture, Issue};
use crate::memory::{DeviceMemory, DeviceSlice};
use crate::stream::BoundStream;

/// No device scalars.
type NoScales<T> = DeviceSlice<<T as BlasScalar>::Scale>;

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
/// The inherent `BoundStream` methods, which take the output by `&mut`, stay available.
/// The handle is taken by `&Blas` (it is not `Sync`), so the model can keep it beside
/// the buffers it lends the step.
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
    /// `C = alpha·op(A)·op(B) + beta·C`:
    /// [`BoundStream::matmul`] / [`Capture::matmul`].
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
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;

    /// A strided batch of products:
    /// [`BoundStream::matmul_batched`] / [`Capture::matmul_batched`].
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
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;

    /// A product with an f32 C of 16-bit A and B:
    /// [`BoundStream::matmul_mixed`] / [`Capture::matmul_mixed`].
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
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized;

    /// A strided batch of mixed-type products:
    /// [`BoundStream::matmul_batched_mixed`] / [`Capture::matmul_batched_mixed`].
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
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized;

    /// A cuBLASLt product with an epilogue, its extra operands in [`CaptureLtArgs`]
    /// (outputs device-only, taken by `&` and claimed as written):
    /// [`BoundStream::matmul_lt`] / [`Capture::matmul_lt`].
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
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized;
}

impl<'buf> Enqueue<'buf> for BoundStream<'_> {
    fn matmul<T, A, B, C>(&mut self, blas: &Blas, shape: &Matmul, a: &A, b: &B, c: &C) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.gemm_scaled::<T, T, NoScales<T>, _, _, _>(blas, shape, None, None, a, b, c)
    }

    fn matmul_batched<T, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &A,
        b: &B,
        c: &C,
    ) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.gemm_scaled::<T, T, NoScales<T>, _, _, _>(blas, shape, Some(batch), None, a, b, c)
    }

    fn matmul_mixed<TIn, TOut, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        a: &A,
        b: &B,
        c: &C,
    ) -> Result<()>
    where
        TIn: BlasScalar,
        TOut: MatmulOutput<TIn>,
        A: DeviceMemory<TIn> + ?Sized,
        B: DeviceMemory<TIn> + ?Sized,
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized,
    {
        self.gemm_scaled::<TIn, TOut, NoScales<TIn>, _, _, _>(blas, shape, None, None, a, b, c)
    }

    fn matmul_batched_mixed<TIn, TOut, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &A,
        b: &B,
        c: &C,
    ) -> Result<()>
    where
        TIn: BlasScalar,
        TOut: MatmulOutput<TIn>,
        A: DeviceMemory<TIn> + ?Sized,
        B: DeviceMemory<TIn> + ?Sized,
        C: DeviceMemory<TOut> + DeviceOnlyMemory + ?Sized,
    {
        let batch = Some(batch);
        self.gemm_scaled::<TIn, TOut, NoScales<TIn>, _, _, _>(blas, shape, batch, None, a, b, c)
    }

    fn matmul_lt<T, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        epilogue: Epilogue,
        a: &A,
        b: &B,
        c: &C,
        args: CaptureLtArgs<'buf, T>,
    ) -> Result<()>
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.lt_claimed(blas, shape, epilogue, (a, b, c), args.extras())
    }
}

impl<'buf> Enqueue<'buf> for Capture<'_, 'buf> {
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
        Capture::matmul(self, blas, shape, a, b, c)
    }

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
        Capture::matmul_batched(self, blas, shape, batch, a, b, c)
    }

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
        Capture::matmul_mixed(self, blas, shape, a, b, c)
    }

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
        Capture::matmul_batched_mixed(self, blas, shape, batch, a, b, c)
    }

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
        Capture::matmul_lt(self, blas, shape, epilogue, a, b, c, args)
    }
}
