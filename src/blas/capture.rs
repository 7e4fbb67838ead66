//! Products captured into CUDA graphs: how a [`Capture`] records and captures a
//! described product (the [`Enqueue`](super::Enqueue) methods build it), and
//! [`CaptureLtArgs`], the operands of a captured epilogue.

use super::call::{GemmCall, LtCall, MATRIX_ACCESS};
use super::epilogue::{Extra, Role};
use super::handle::{Blas, Shared};
use super::plan::Operand;
use super::sys::check;
use crate::access::Access;
use crate::copy::DeviceOnlyMemory;
use crate::driver::libraries as libs;
use crate::error::Result;
use crate::graph::{Capture, Owned};
use crate::memory::DeviceMemory;
use std::sync::Arc;

/// Memory a graph may write: device-only memory ([`DeviceOnlyMemory`]), for the outputs
/// of captured epilogues ([`CaptureLtArgs`]). Implemented for every such type.
pub trait CaptureOutput<T>: DeviceMemory<T> + DeviceOnlyMemory {}

impl<T, M: DeviceMemory<T> + DeviceOnlyMemory + ?Sized> CaptureOutput<T> for M {}

/// The extra operands of an epilogue through
/// [`Enqueue::matmul_lt`](super::Enqueue::matmul_lt), on a stream or in a capture: as
/// [`LtArgs`], borrowed for `'buf` (in a capture, the graph's lifetime); outputs must be
/// device-only memory.
///
/// [`LtArgs`]: super::LtArgs
pub struct CaptureLtArgs<'buf, T> {
    bias: Option<&'buf dyn DeviceMemory<T>>,
    bias_grad: Option<&'buf dyn CaptureOutput<T>>,
    aux: Option<&'buf dyn DeviceMemory<T>>,
    aux_out: Option<&'buf dyn CaptureOutput<T>>,
    relu_mask: Option<&'buf dyn DeviceMemory<u8>>,
    relu_mask_out: Option<&'buf dyn CaptureOutput<u8>>,
    addend: Option<&'buf dyn DeviceMemory<T>>,
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
            addend: None,
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

    /// The matrix `beta` scales in place of C (read at each launch), as
    /// [`LtArgs::addend`](super::LtArgs::addend).
    pub fn addend(mut self, addend: &'buf dyn DeviceMemory<T>) -> Self {
        self.addend = Some(addend);
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
        push(
            Role::Addend,
            self.addend.map(|m| Extra::of(Role::Addend, m)),
        );
        v
    }
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Checks a described product, records its buffers (A and B read, C written, the
    /// device scalars read) and the handle's shared part, and captures it.
    pub(crate) fn capture_gemm(&self, blas: &Blas, call: GemmCall<'_, 'buf>) -> Result<()> {
        let plan = call.check(self.device(), blas)?;
        if plan.empty {
            return Ok(());
        }
        self.record_matrices(blas, &call.matrices)?;
        if let Some(s) = &call.scales {
            self.record_operand(s, Access::Read)?;
        }
        let stream = self.stream_handle();
        let out = self.enqueue_captured(blas, |blas| {
            // SAFETY: the capture device's context is current (`enqueue_captured`) and
            // the stream is its capturing stream: cuBLAS's kernels are recorded, not
            // run. The buffers were checked against the plan; the graph borrows them for
            // 'buf, holds the workspace and the handles, and claims all of them at each
            // launch; within the graph, the workspace's uses are ordered
            // (`exclusive_use`), and so are the buffers' (`record_span`, `marked`).
            unsafe { call.enqueue(blas, &plan, stream) }
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

    /// Checks a described cuBLASLt product, records its buffers (the matrices as
    /// [`capture_gemm`](Self::capture_gemm) does, the epilogue's operands as their roles
    /// say) and the handle's shared part, and captures it.
    pub(crate) fn capture_lt(&self, blas: &Blas, call: LtCall<'_, 'buf>) -> Result<()> {
        let plan = call.check(self.device(), blas)?;
        if plan.empty {
            return Ok(());
        }
        self.record_matrices(blas, &call.matrices)?;
        for e in &call.extras {
            let (tracker, access) = e.claim();
            self.record_span(tracker, access, e.ptr, e.bytes)?;
        }
        let problem = call.problem(plan);
        {
            let _current = self.device().enter()?;
            // SAFETY: the capture's device is current; no stream is waited for (a timing
            // runs on a stream of its own, the capture's stream only records).
            unsafe { super::lt::prepare_lt(blas, &problem, call.shape, None) }?;
        }
        let stream = self.stream_handle();
        self.enqueue_captured(blas, |blas| {
            // SAFETY: the capture device's context is current (`enqueue_captured`) and
            // the stream is its capturing stream: cuBLASLt's kernels are recorded, not
            // run. The buffers were checked; the graph borrows them for 'buf, holds the
            // workspace and the handles, and claims all of them at each launch.
            unsafe { call.enqueue(blas, &problem, stream) }
        })
    }

    /// Records the matrices' uses (A and B read, C written) and the handle's shared part
    /// (workspace and handles), which the graph keeps alive and claims as written at each
    /// launch.
    fn record_matrices(&self, blas: &Blas, matrices: &[Operand<'buf>; 3]) -> Result<()> {
        for (m, access) in matrices.iter().zip(MATRIX_ACCESS) {
            self.record_operand(m, access)?;
        }
        self.record_owned(Arc::clone(&blas.shared) as Arc<dyn Owned>, Access::Write);
        Ok(())
    }

    /// Records a use of the bytes of `op`.
    fn record_operand(&self, op: &Operand<'buf>, access: Access) -> Result<()> {
        self.record_span(op.tracker, access, op.ptr(), op.span.bytes)
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
