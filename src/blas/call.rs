//! One product described: what it computes and the buffers it reads and writes (each
//! with its tracker and span), type-erased. Every public product method, on a stream
//! or in a capture, builds one ([`GemmCall`], [`LtCall`]) and hands it to its issuer's
//! one implementation, which checks it, claims (on a stream) or records (in a capture)
//! its buffers and enqueues it.
//!
//! A call claims C (and an epilogue's outputs) as written although it holds them by
//! `&`: it is built only where the caller holds them by `&mut` (`BoundStream`'s
//! methods, [`LtArgs`](super::LtArgs)) or where they are device-only memory
//! ([`Enqueue`](super::Enqueue)'s bounds, [`CaptureOutput`](super::CaptureOutput)),
//! which nothing reads or writes except through its tracker.
//!
//! The two types are public in name only: this module is private and their fields are
//! the crate's, so nothing outside gpubind can name or build one. They are public so
//! that the hidden required methods of the sealed [`Enqueue`](super::Enqueue) may take
//! them.

use super::epilogue::{Epilogue, Extra, Role, check_extras, check_type};
use super::gemm::{Ptrs, enqueue_gemm};
use super::handle::{Blas, refuse_aliasing};
use super::lt::{EpiloguePtrs, LtProblem, enqueue_lt};
use super::plan::{self, Gemm, Operand, Plan};
use super::types::{Batch, BlasScalar, DataType, Matmul};
use crate::access::{Access, Use};
use crate::device::Device;
use crate::error::{MatmulError, Result};
use crate::memory::DeviceMemory;
use cudarc::driver::sys as driver;

/// How every product uses A, B and C: it reads A and B and writes C.
pub(crate) const MATRIX_ACCESS: [Access; 3] = [Access::Read, Access::Read, Access::Write];

/// The claims a product on a stream makes on A, B and C ([`MATRIX_ACCESS`]).
#[inline]
pub(crate) fn matrix_claims<'t>(matrices: &[Operand<'t>; 3]) -> [Use<'t>; 3] {
    let [a, b, c] = matrices;
    let [ra, rb, rc] = MATRIX_ACCESS;
    [
        Some((a.tracker, ra)),
        Some((b.tracker, rb)),
        Some((c.tracker, rc)),
    ]
}

/// A cuBLAS product (`cublasSgemm_v2`, `cublasGemmEx`, `cublasGemmStridedBatchedEx`):
/// its shape, batch and element types, A, B and C, and the device alpha and beta if it
/// reads them from device memory.
pub struct GemmCall<'s, 'buf> {
    pub(crate) gemm: Gemm<'s>,
    /// A, B, C.
    pub(crate) matrices: [Operand<'buf>; 3],
    /// `[alpha, beta]` in device memory, if given.
    pub(crate) scales: Option<Operand<'buf>>,
}

impl std::fmt::Debug for GemmCall<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmCall").finish_non_exhaustive()
    }
}

impl<'s, 'buf> GemmCall<'s, 'buf> {
    /// `C = alpha·op(A)·op(B) + beta·C` of `T` matrices A and B into a `U` matrix C,
    /// batched by `batch` if given, alpha and beta from `shape`.
    #[inline]
    pub(crate) fn new<T, U, A, B, C>(
        shape: &'s Matmul,
        batch: Option<&'s Batch>,
        (a, b, c): (&'buf A, &'buf B, &'buf C),
    ) -> Self
    where
        T: BlasScalar,
        U: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<U> + ?Sized,
    {
        GemmCall {
            gemm: Gemm {
                shape,
                batch,
                dtypes: [T::DATA_TYPE, U::DATA_TYPE],
            },
            matrices: [Operand::of(a), Operand::of(b), Operand::of(c)],
            scales: None,
        }
    }

    /// The same product with alpha and beta read from `scales` (`[alpha, beta]` of
    /// `T`'s scale type) when it runs.
    #[inline]
    pub(crate) fn device_scalars<T, S>(self, scales: &'buf S) -> Self
    where
        T: BlasScalar,
        S: DeviceMemory<T::Scale> + ?Sized,
    {
        GemmCall {
            scales: Some(Operand::of(scales)),
            ..self
        }
    }

    /// The checks of every GEMM ([`plan::check_gemm`]) for a product issued on
    /// `device`; plans it.
    #[inline]
    pub(crate) fn check(&self, device: &Device, blas: &Blas) -> Result<Plan> {
        plan::check_gemm(device, blas.device(), self.gemm, self.matrices, self.scales)
    }

    /// The device addresses of A, B and C.
    #[inline]
    pub(crate) fn ptrs(&self) -> Ptrs {
        ptrs(&self.matrices)
    }

    /// Enqueues the product, checked and planned as `plan`, on `stream`.
    ///
    /// # Safety
    ///
    /// [`enqueue_gemm`]'s contract for the call's buffers (and its device scalars).
    #[inline]
    pub(crate) unsafe fn enqueue(
        &self,
        blas: &Blas,
        plan: &Plan,
        stream: driver::CUstream,
    ) -> Result<()> {
        let device_scales = self.scales.map(|s| s.ptr());
        let Gemm { shape, dtypes, .. } = self.gemm;
        // SAFETY: the caller's contract.
        unsafe {
            enqueue_gemm(
                blas,
                plan,
                dtypes,
                shape,
                stream,
                self.ptrs(),
                device_scales,
            )
        }
    }
}

/// A cuBLASLt product (`cublasLtMatmul`) with an epilogue: its shape, element type and
/// epilogue, A, B and C, and the epilogue's extra operands.
pub struct LtCall<'s, 'buf> {
    pub(crate) shape: &'s Matmul,
    pub(crate) epilogue: Epilogue,
    /// The element type of every matrix.
    pub(crate) dtype: DataType,
    /// A, B, C.
    pub(crate) matrices: [Operand<'buf>; 3],
    pub(crate) extras: Vec<Extra<'buf>>,
}

impl std::fmt::Debug for LtCall<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LtCall").finish_non_exhaustive()
    }
}

impl<'s, 'buf> LtCall<'s, 'buf> {
    /// `C = epilogue(alpha·op(A)·op(B) + beta·C)` of `T` matrices (`beta·addend` in place
    /// of `beta·C` when `extras` holds an addend), with the epilogue's operands `extras`.
    #[inline]
    pub(crate) fn new<T, A, B, C>(
        shape: &'s Matmul,
        epilogue: Epilogue,
        (a, b, c): (&'buf A, &'buf B, &'buf C),
        extras: Vec<Extra<'buf>>,
    ) -> Self
    where
        T: BlasScalar,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + ?Sized,
    {
        LtCall {
            shape,
            epilogue,
            dtype: T::DATA_TYPE,
            matrices: [Operand::of(a), Operand::of(b), Operand::of(c)],
            extras,
        }
    }

    /// Checks the product issued on `device`: the matrices as every GEMM is checked
    /// ([`plan::check_gemm`]), the epilogue against the type, its operands against the
    /// shape (exactly those it uses, with the lengths it needs, on the device), and that
    /// no output overlaps an input or another output. Plans it.
    pub(crate) fn check(&self, device: &Device, blas: &Blas) -> Result<Plan> {
        check_type(self.epilogue, self.dtype)?;
        let gemm = Gemm {
            shape: self.shape,
            batch: None,
            dtypes: [self.dtype; 2],
        };
        let plan = plan::check_gemm(device, blas.device(), gemm, self.matrices, None)?;
        check_extras(self.epilogue, self.shape, &plan, &self.extras)?;
        let [a, b, c] = &self.matrices;
        if let Some(addend) = self.extras.iter().find(|e| e.role == Role::Addend) {
            // C's length covers its layout (check_gemm): the addend's, the same, too.
            if addend.len != c.len {
                return Err(MatmulError::BufferSize {
                    operand: "addend",
                    shape: format!("C's layout, {}×{}", self.shape.m, self.shape.n),
                    expected: c.len,
                    found: addend.len,
                    exact: true,
                }
                .into());
            }
            if beta_is_zero(self.dtype, self.shape.beta) {
                return Err(MatmulError::UnreadAddend.into());
            }
        }
        let mut reads = vec![("A", a.span), ("B", b.span)];
        let mut writes = vec![("C", c.span)];
        for e in &self.extras {
            device.expect_same(e.role.name(), e.device)?;
            if e.role.writes() {
                writes.push((e.role.name(), e.span()));
            } else {
                reads.push((e.role.name(), e.span()));
            }
        }
        for (i, &w) in writes.iter().enumerate() {
            refuse_aliasing(w, &reads)?;
            refuse_aliasing(w, &writes[i + 1..])?;
        }
        Ok(plan)
    }

    /// The device addresses of A, B and C.
    pub(crate) fn ptrs(&self) -> Ptrs {
        ptrs(&self.matrices)
    }

    /// The Lt problem of the checked product planned as `plan`.
    pub(crate) fn problem(&self, plan: Plan) -> LtProblem {
        LtProblem::new(
            plan,
            self.shape,
            self.dtype,
            self.epilogue,
            self.ptrs(),
            EpiloguePtrs::of(&self.extras),
        )
    }

    /// Enqueues the product, checked and described by `problem`, on `stream`.
    ///
    /// # Safety
    ///
    /// [`enqueue_lt`]'s contract for the call's buffers.
    pub(crate) unsafe fn enqueue(
        &self,
        blas: &Blas,
        problem: &LtProblem,
        stream: driver::CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { enqueue_lt(blas, problem, self.shape, stream, self.ptrs()) }
    }
}

/// Whether cuBLAS gets a `beta` of 0 for a `dtype` product: f64 products take it as is,
/// the others as the f32 it rounds to (`1e-46` is 0 there).
pub(crate) fn beta_is_zero(dtype: DataType, beta: f64) -> bool {
    match dtype {
        DataType::F64 => beta == 0.0,
        _ => beta as f32 == 0.0,
    }
}

#[inline]
fn ptrs([a, b, c]: &[Operand<'_>; 3]) -> Ptrs {
    (a.ptr(), b.ptr(), c.ptr())
}
