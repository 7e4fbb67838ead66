//! cuBLAS matrix products on gpubind memory, bound to the right context by the types.
//!
//! A [`Blas`] handle is created under a binding (`cublasCreate` attaches it to the current
//! context) and, like other resources, holds an `Arc<Device>`. Products are enqueued on a
//! [`BoundStream`] of the same device, so they run in the right context and in stream
//! order with kernels and copies:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{blas::Matmul, Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let mut blas = gpu.new_blas()?;
//! let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?; // 2×3, row-major
//! let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0])?; // 3×2
//! let mut c = gpu.alloc_zeros::<f32>(4)?;                       // 2×2
//! gpu.default_stream().matmul(&mut blas, &Matmul::new(2, 2, 3), &a, &b, &mut c)?;
//! assert_eq!(gpu.dtoh(&c)?, [4.0, 5.0, 10.0, 11.0]);
//! # Ok(()) }
//! ```

use crate::access::Access;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::libs::{self, CublasHandle};
use crate::memory::{DeviceMemory, DeviceMemoryMut, expect_len};
use crate::stream::BoundStream;
use std::sync::Arc;

/// A cuBLAS handle of one device.
///
/// `Send` (it may move to another thread with its device) but not `Sync`: cuBLAS handles
/// must not be used by two threads at once, and every product takes `&mut Blas`.
pub struct Blas {
    device: Arc<Device>,
    handle: CublasHandle,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas")
            .field("device", &self.device.ordinal())
            .finish_non_exhaustive()
    }
}

// SAFETY: a cuBLAS handle may be used from any thread (one at a time: `&mut self` on
// every use) whose current context is the handle's, which BoundStream proves.
unsafe impl Send for Blas {}

fn check(status: std::ffi::c_int, call: &'static str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Cublas {
            call,
            status: libs::cublas_status_name(status),
        })
    }
}

impl Blas {
    /// The handle's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // A handle exists only if the library loaded (it created the handle).
        let Ok(api) = libs::cublas() else { return };
        let destroy = api.destroy;
        let handle = self.handle as usize;
        // cuBLAS documents that cublasDestroy synchronises the device, so it runs on the
        // release thread, bounded by GPUBIND_DROP_TIMEOUT (crate::release).
        crate::release::release(
            format_args!("a cuBLAS handle"),
            &self.device,
            "cublasDestroy_v2",
            Box::new(move || {
                // SAFETY: created by cublasCreate in this context (current while this
                // runs); destroyed once, here.
                let status = unsafe { destroy(handle as CublasHandle) };
                match check(status, "cublasDestroy_v2") {
                    Ok(()) => cudarc::driver::sys::CUresult::CUDA_SUCCESS,
                    Err(e) => {
                        log::warn!("gpubind: dropping a cuBLAS handle: {e}");
                        cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN
                    }
                }
            }),
        );
    }
}

impl<'a> BoundDevice<'a> {
    /// Creates a cuBLAS handle for the bound device; [`Error::NoCublas`] if no `libcublas`
    /// fitting the driver can be loaded (which one: [`crate::libs`]).
    pub fn new_blas(&self) -> Result<Blas> {
        self.ensure_current()?;
        let api = libs::cublas()?;
        let mut handle: CublasHandle = std::ptr::null_mut();
        // SAFETY: the bound context is current; writes one handle.
        check(unsafe { (api.create)(&mut handle) }, "cublasCreate_v2")?;
        Ok(Blas {
            device: Arc::clone(self.device()),
            handle,
        })
    }
}

/// The shape of a row-major product `C[m×n] = alpha · op(A)[m×k] · op(B)[k×n] + beta · C`.
///
/// `op(X)` is `X` or, with `transpose_a`/`transpose_b`, `Xᵀ`; a transposed `A` is stored
/// `k×m`, a transposed `B` `n×k`. All matrices are dense row-major.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Matmul {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// Use `Aᵀ` (A stored k×m).
    pub transpose_a: bool,
    /// Use `Bᵀ` (B stored n×k).
    pub transpose_b: bool,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the old C (0 overwrites).
    pub beta: f32,
}

impl Matmul {
    /// `C = A · B` with `A: m×k`, `B: k×n`.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Matmul {
            m,
            n,
            k,
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// Uses `Aᵀ`.
    pub fn transpose_a(mut self) -> Self {
        self.transpose_a = true;
        self
    }

    /// Uses `Bᵀ`.
    pub fn transpose_b(mut self) -> Self {
        self.transpose_b = true;
        self
    }

    /// Sets `alpha` and `beta`.
    pub fn scaled(mut self, alpha: f32, beta: f32) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }
}

fn dim(v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::InvalidArgument(format!("matrix dimension {v} exceeds i32")))
}

impl<'b> BoundStream<'b> {
    /// Enqueues a row-major f32 matrix product (cuBLAS SGEMM). Buffer lengths must be
    /// exactly `m·k`, `k·n` and `m·n`; everything must live on the bound device.
    pub fn matmul(
        &self,
        blas: &mut Blas,
        shape: &Matmul,
        a: &impl DeviceMemory<f32>,
        b: &impl DeviceMemory<f32>,
        c: &mut impl DeviceMemoryMut<f32>,
    ) -> Result<()> {
        let bound = self.bound();
        bound.expect_device("cuBLAS handle", blas.device())?;
        bound.expect_device("matrix A", a.device())?;
        bound.expect_device("matrix B", b.device())?;
        bound.expect_device("matrix C", c.device())?;
        let Matmul { m, n, k, .. } = *shape;
        let elems = |x: usize, y: usize| {
            x.checked_mul(y).ok_or_else(|| {
                Error::InvalidArgument(format!("matmul: {x}·{y} elements overflow usize"))
            })
        };
        expect_len("matmul A (m·k)", elems(m, k)?, a.len())?;
        expect_len("matmul B (k·n)", elems(k, n)?, b.len())?;
        expect_len("matmul C (m·n)", elems(m, n)?, c.len())?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        // cuBLAS launches through the runtime, which uses the current context.
        bound.ensure_current()?;
        let _claim = self.claim([
            Some((a.tracker(), Access::Read)),
            Some((b.tracker(), Access::Read)),
            Some((c.tracker(), Access::Write)),
        ])?;
        // The library is loaded: `blas` was created through it.
        let api = libs::cublas()?;
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| std::ffi::c_int::from(t);
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
        let lda = if shape.transpose_a { m } else { k };
        let ldb = if shape.transpose_b { k } else { n };
        let (m_, n_, k_) = (dim(n)?, dim(m)?, dim(k)?);
        // SAFETY: the handle belongs to the current context (checked above); the stream
        // is a valid stream of that context (or null for the default stream).
        check(
            unsafe { (api.set_stream)(blas.handle, self.raw().cast()) },
            "cublasSetStream_v2",
        )?;
        // SAFETY: all three buffers are live device allocations of the current context
        // with exactly the element counts the dimensions imply (checked above), ordered
        // after their other pending uses and freed only after this one (tracked above);
        // alpha and beta are host scalars alive for the call (default pointer mode).
        check(
            unsafe {
                (api.sgemm)(
                    blas.handle,
                    op(shape.transpose_b),
                    op(shape.transpose_a),
                    m_,
                    n_,
                    k_,
                    &shape.alpha,
                    b.device_ptr() as *const f32,
                    dim(ldb.max(1))?,
                    a.device_ptr() as *const f32,
                    dim(lda.max(1))?,
                    &shape.beta,
                    c.device_ptr() as *mut f32,
                    dim(n)?,
                )
            },
            "cublasSgemm_v2",
        )
    }
}
