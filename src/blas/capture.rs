//! Products captured into CUDA graphs: [`Capture::matmul`], [`Capture::matmul_batched`]
//! and [`Capture::matmul_lt`].

use super::epilogue::{Epilogue, Extra, Role};
use super::gemm::{check_gemm, enqueue_gemm};
use super::handle::{Blas, Shared};
use super::lt::{EpiloguePtrs, LtProblem, check_lt, enqueue_lt};
use super::plan::{Operand, Plan};
use super::sys::check;
use super::types::{Batch, BlasScalar, Matmul, MatmulOutput};
use crate::access::Access;
use crate::copy::DeviceOnlyMemory;
use crate::driver::libraries as libs;
use crate::error::Result;
use crate::graph::{Capture, Owned};
use crate::memory::{DeviceMemory, DeviceSlice};
use std::sync::Arc;

/// Memory a graph may write: device-only memory ([`DeviceOnlyMemory`]), for the outputs
/// of captured epilogues ([`CaptureLtArgs`]). Implemented for every such type.
pub trait CaptureOutput<T>: DeviceMemory<T> + DeviceOnlyMemory {}

impl<T, M: DeviceMemory<T> + DeviceOnlyMemory + ?Sized> CaptureOutput<T> for M {}

/// The extra operands of a captured epilogue ([`Capture::matmul_lt`]): as [`LtArgs`],
/// borrowed for the graph's lifetime; outputs must be device-only memory.
///
/// [`LtArgs`]: super::LtArgs
pub struct CaptureLtArgs<'buf, T> {
    bias: Option<&'buf dyn DeviceMemory<T>>,
    bias_grad: Option<&'buf dyn CaptureOutput<T>>,
    aux: Option<&'buf dyn DeviceMemory<T>>,
    aux_out: Option<&'buf dyn CaptureOutput<T>>,
    relu_mask: Option<&'buf dyn DeviceMemory<u8>>,
    relu_mask_out: Option<&'buf dyn CaptureOutput<u8>>,
}

impl<T> Default for CaptureLtArgs<'_, T> {
    fn default() -> Self {
        CaptureLtArgs::new()
    }
}

impl<T> std::fmt::Debug for CaptureLtArgs<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureLtArgs").finish_non_exhaustive()
    }
}

impl<'buf, T> CaptureLtArgs<'buf, T> {
    /// No extra operand.
    pub fn new() -> Self {
        CaptureLtArgs {
            bias: None,
            bias_grad: None,
            aux: None,
            aux_out: None,
            relu_mask: None,
            relu_mask_out: None,
        }
    }

    /// The bias vector (read at each launch).
    pub fn bias(mut self, bias: &'buf dyn DeviceMemory<T>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Where the bias gradient is written at each launch.
    pub fn bias_grad(mut self, grad: &'buf dyn CaptureOutput<T>) -> Self {
        self.bias_grad = Some(grad);
        self
    }

    /// The pre-activation `DGelu*` reads.
    pub fn aux(mut self, aux: &'buf dyn DeviceMemory<T>) -> Self {
        self.aux = Some(aux);
        self
    }

    /// Where `GeluAux*` writes the pre-activation.
    pub fn aux_out(mut self, aux: &'buf dyn CaptureOutput<T>) -> Self {
        self.aux_out = Some(aux);
        self
    }

    /// The ReLU mask `DRelu*` reads.
    pub fn relu_mask(mut self, mask: &'buf dyn DeviceMemory<u8>) -> Self {
        self.relu_mask = Some(mask);
        self
    }

    /// Where `ReluAux*` writes the ReLU mask.
    pub fn relu_mask_out(mut self, mask: &'buf dyn CaptureOutput<u8>) -> Self {
        self.relu_mask_out = Some(mask);
        self
    }

    pub(crate) fn extras(&self) -> Vec<Extra<'buf>> {
        let mut v = Vec::new();
        let mut push = |role, e: Option<Extra<'buf>>| v.extend(e.map(|e| Extra { role, ..e }));
        push(Role::Bias, self.bias.map(|m| Extra::of(Role::Bias, m)));
        push(
            Role::BiasGrad,
            self.bias_grad.map(|m| Extra::of(Role::BiasGrad, m)),
        );
        push(Role::Aux, self.aux.map(|m| Extra::of(Role::Aux, m)));
        push(
            Role::AuxOut,
            self.aux_out.map(|m| Extra::of(Role::AuxOut, m)),
        );
        push(
            Role::ReluMask,
            self.relu_mask.map(|m| Extra::of(Role::ReluMask, m)),
        );
        let out = self.relu_mask_out.map(|m| Extra::of(Role::ReluMaskOut, m));
        push(Role::ReluMaskOut, out);
        v
    }
}

/// No device scalars (the product's alpha and beta are host values).
fn no_scales<'buf, T: BlasScalar>() -> Option<&'buf DeviceSlice<T::Scale>> {
    None
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Captures a matrix product into the graph: the same types, shapes and checks as
    /// [`BoundStream::matmul`](crate::BoundStream::matmul). `a` and `b` are read, `c`
    /// written at each launch of the graph; all three are borrowed for the graph's
    /// lifetime, and `c` must not overlap `a` or `b`
    /// ([`MatmulError::Aliasing`](super::MatmulError::Aliasing)).
    ///
    /// The graph keeps what its kernels need alive: the handle's workspace (which they
    /// use at each launch, claimed as written, so launches are ordered against the
    /// handle's other products and other graphs that use it) and the cuBLAS and cuBLASLt
    /// handles themselves. `blas` is free again when this returns and may be dropped
    /// before the graph.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
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
    /// The matrices stay borrowed while the graph lives:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &gpubind::blas::Blas) -> gpubind::Result<()> {
    /// use gpubind::blas::Matmul;
    /// let (a, b, c) = (gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?);
    /// let graph = gpu.capture(|cap| cap.matmul(blas, &Matmul::new(2, 2, 2), &a, &b, &c))?;
    /// drop(c); // error[E0505]: cannot move out of `c` because it is borrowed
    /// let _ = graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn matmul<T, A, B, C>(
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
        self.capture_gemm(blas, shape, None, no_scales::<T>(), (a, b, c))
    }

    /// Captures a matrix product whose alpha and beta are read from device memory at
    /// each launch of the graph
    /// ([`BoundStream::matmul_device_scalars`](crate::BoundStream::matmul_device_scalars)):
    /// write new values into `scales` between launches (a kernel or a copy on a stream;
    /// the graph holds `scales` by `&` and claims it as read at each launch, so the
    /// launch runs after the write) and the next launch uses them. The claims and
    /// lifetimes of [`matmul`](Self::matmul) otherwise.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
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
    pub fn matmul_device_scalars<T, S, A, B, C>(
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
        self.capture_gemm(blas, shape, None, Some(scales), (a, b, c))
    }

    /// Captures a strided batch of products
    /// ([`BoundStream::matmul_batched`](crate::BoundStream::matmul_batched)), with the
    /// claims and lifetimes of [`matmul`](Self::matmul).
    pub fn matmul_batched<T, A, B, C>(
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
        self.capture_gemm(blas, shape, Some(batch), no_scales::<T>(), (a, b, c))
    }

    /// Captures a product with C of another element type than A and B
    /// ([`BoundStream::matmul_mixed`](crate::BoundStream::matmul_mixed): f16 or bf16
    /// inputs, an f32 output), with the claims and lifetimes of [`matmul`](Self::matmul).
    pub fn matmul_mixed<TIn, TOut, A, B, C>(
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
        self.capture_gemm(blas, shape, None, no_scales::<TIn>(), (a, b, c))
    }

    /// Captures a strided batch of mixed-type products
    /// ([`BoundStream::matmul_batched_mixed`](crate::BoundStream::matmul_batched_mixed)),
    /// with the claims and lifetimes of [`matmul`](Self::matmul).
    pub fn matmul_batched_mixed<TIn, TOut, A, B, C>(
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
        self.capture_gemm(blas, shape, Some(batch), no_scales::<TIn>(), (a, b, c))
    }

    /// Captures a cuBLASLt product with an epilogue
    /// ([`BoundStream::matmul_lt`](crate::BoundStream::matmul_lt)), with the claims and
    /// lifetimes of [`matmul`](Self::matmul); the epilogue's operands are borrowed for
    /// the graph's lifetime too, read or written at each launch.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_lt<T, A, B, C>(
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
        let device = self.device();
        let (plan, extras) = check_lt(device, blas, shape, epilogue, (a, b, c), args.extras())?;
        if plan.empty {
            return Ok(());
        }
        self.record_matrices(blas, a, b, c)?;
        for e in &extras {
            let access = if e.role.writes() {
                Access::Write
            } else {
                Access::Read
            };
            self.record_span(e.tracker, access, e.ptr, e.bytes)?;
        }
        let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let problem = LtProblem::new(
            plan,
            shape,
            T::DATA_TYPE,
            epilogue,
            ptrs,
            EpiloguePtrs::of(&extras),
        );
        let stream = self.stream_handle();
        self.enqueue_captured(blas, |blas| {
            // SAFETY: the capture device's context is current (`enqueue_captured`) and
            // the stream is its capturing stream: cuBLASLt's kernels are recorded, not
            // run. The buffers were checked; the graph borrows them for 'buf, holds the
            // workspace and the handles, and claims all of them at each launch.
            unsafe { enqueue_lt(blas, &problem, shape, stream, ptrs) }
        })
    }

    fn capture_gemm<T, U, S, A, B, C>(
        &mut self,
        blas: &Blas,
        shape: &Matmul,
        batch: Option<&Batch>,
        scales: Option<&'buf S>,
        (a, b, c): (&'buf A, &'buf B, &'buf C),
    ) -> Result<()>
    where
        T: BlasScalar,
        U: BlasScalar,
        S: DeviceMemory<T::Scale> + ?Sized,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<U> + DeviceOnlyMemory + ?Sized,
    {
        let given = scales.map(Operand::of);
        let plan: Plan = check_gemm(self.device(), blas, (shape, batch), (a, b, c), given)?;
        if plan.empty {
            return Ok(());
        }
        self.record_matrices(blas, a, b, c)?;
        if let Some(s) = scales {
            self.record_memory(s, Access::Read)?;
        }
        let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let device_scales = scales.map(|s| s.device_ptr());
        let stream = self.stream_handle();
        let out = self.enqueue_captured(blas, |blas| {
            // SAFETY: the capture device's context is current (`enqueue_captured`) and
            // the stream is its capturing stream: cuBLAS's kernels are recorded, not
            // run. The buffers were checked against the plan; the graph borrows them for
            // 'buf, holds the workspace and the handles, and claims all of them at each
            // launch; within the graph, the workspace's uses are ordered
            // (`exclusive_use`), and so are the buffers' (`record_span`, `marked`).
            unsafe {
                enqueue_gemm(
                    blas,
                    &plan,
                    [T::DATA_TYPE, U::DATA_TYPE],
                    shape,
                    stream,
                    ptrs,
                    device_scales,
                )
            }
        });
        // Leave the handle on no stream of the capture (the stream is destroyed when the
        // capture ends); this also drops the workspace setting. Every product sets both.
        let api = libs::cublas()?;
        // SAFETY: the handle's context is current; the null stream is always valid.
        let reset = check(
            unsafe { (api.set_stream)(blas.handle(), std::ptr::null_mut()) },
            "cublasSetStream_v2",
        );
        out.and(reset)
    }

    /// Records the matrices' uses and the handle's shared part (workspace and handles),
    /// which the graph keeps alive and claims as written at each launch.
    fn record_matrices<T, U, A, B, C>(
        &self,
        blas: &Blas,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<U> + ?Sized,
    {
        self.record_memory(a, Access::Read)?;
        self.record_memory(b, Access::Read)?;
        self.record_memory(c, Access::Write)?;
        self.record_owned(Arc::clone(&blas.shared) as Arc<dyn Owned>, Access::Write);
        Ok(())
    }

    /// Runs `enqueue` with the capture's device current, marked as one operation and
    /// ordered after the previous use of the handle's workspace in this capture.
    fn enqueue_captured(
        &self,
        blas: &Blas,
        enqueue: impl FnOnce(&Blas) -> Result<()>,
    ) -> Result<()> {
        // Products of one handle on two branches of a fork would share the workspace
        // within a launch: the second is ordered after the first.
        let shared: Arc<Shared> = Arc::clone(&blas.shared);
        // Code outside gpubind may have changed the thread's context since the capture
        // began (cudarc can, from safe code): make the capture's device current for the
        // cuBLAS calls (nothing is pushed when it already is).
        let _current = self.device().enter()?;
        self.marked(|| self.exclusive_use(Owned::tracker(&*shared), || enqueue(blas)))
    }
}
