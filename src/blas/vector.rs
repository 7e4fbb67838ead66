//! cuBLAS's vector routines gpubind offers: GEMV (`cublas{S,D}gemv_v2`) and ASUM
//! (`cublas{S,D}asum_v2`), for f32 and f64, on a stream.

use super::gemm::{bind_stream, with_pointer_mode};
use super::handle::{Blas, refuse_aliasing, span_of};
use super::plan::{Stored, check_devices};
use super::sys::{self, check};
use super::types::{BlasFloat, DataType, Gemv, Layout};
use crate::access::Access;
use crate::device::Device;
use crate::driver::libraries::CublasHandle;
use crate::error::{MatmulError, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use crate::stream::BoundStream;
use std::ffi::c_int;
use std::sync::Arc;

/// A GEMV as cuBLAS takes it: column-major `rows×cols` A, `trans`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemvPlan {
    pub(crate) trans: bool,
    pub(crate) rows: c_int,
    pub(crate) cols: c_int,
    pub(crate) lda: c_int,
    pub(crate) incx: c_int,
    pub(crate) incy: c_int,
    /// y has no element: nothing to do.
    pub(crate) empty: bool,
}

fn as_c_int(what: &'static str, value: usize) -> Result<c_int, MatmulError> {
    c_int::try_from(value).map_err(|_| MatmulError::TooLarge { what, value })
}

/// Elements a vector of `n` elements `inc` apart reaches (the last one plus one).
fn vector_span(n: usize, inc: usize) -> Result<usize, MatmulError> {
    if n == 0 {
        return Ok(0);
    }
    (n - 1)
        .checked_mul(inc)
        .and_then(|x| x.checked_add(1))
        .ok_or(MatmulError::TooLarge {
            what: "vector span",
            value: n,
        })
}

/// [`MatmulError::BufferSize`] unless a buffer of `len` elements holds the vector
/// `name` of `n` elements `inc` apart (exactly, for `inc` 1).
fn check_vector(name: &'static str, n: usize, inc: usize, len: usize) -> Result<(), MatmulError> {
    let expected = vector_span(n, inc)?;
    let exact = inc == 1;
    if (exact && len == expected) || (!exact && len >= expected) {
        return Ok(());
    }
    Err(MatmulError::BufferSize {
        operand: name,
        shape: format!("vector of {n}, increment {inc}"),
        expected,
        found: len,
        exact,
    })
}

/// Checks `g` against buffers of `lens = [A, x, y]` elements (of `dtype`) and plans it.
pub(crate) fn plan_gemv(
    g: &Gemv,
    dtype: DataType,
    lens: [usize; 3],
) -> Result<GemvPlan, MatmulError> {
    for (operand, inc) in [("x", g.incx), ("y", g.incy)] {
        if inc == 0 {
            return Err(MatmulError::ZeroIncrement {
                routine: "gemv",
                operand,
            });
        }
    }
    let a = Stored::new("A", (g.m, g.n), g.lda, g.layout, None)?;
    a.check_len("A", lens[0])?;
    check_vector("x", g.x_len(), g.incx, lens[1])?;
    check_vector("y", g.y_len(), g.incy, lens[2])?;
    if g.x_len() == 0 && g.y_len() > 0 {
        // cuBLAS returns at once when A has no element, leaving y unscaled by beta.
        return Err(MatmulError::Unsupported {
            what: "gemv with an empty x (op(A) with no column)".into(),
            dtype: dtype.name(),
        });
    }
    // Row-major A (m×n, ld) is column-major Aᵀ (n×m, ld): cuBLAS gets the other transpose.
    let (rows, cols, trans) = match g.layout {
        Layout::ColMajor => (g.m, g.n, g.transpose),
        Layout::RowMajor => (g.n, g.m, !g.transpose),
    };
    Ok(GemvPlan {
        trans,
        rows: as_c_int("m", rows)?,
        cols: as_c_int("n", cols)?,
        lda: as_c_int("lda", a.ld)?,
        incx: as_c_int("incx", g.incx)?,
        incy: as_c_int("incy", g.incy)?,
        empty: g.y_len() == 0,
    })
}

/// The element count of every `inc`-th element of a buffer of `len` elements.
fn strided_count(len: usize, inc: usize) -> usize {
    if len == 0 { 0 } else { (len - 1) / inc + 1 }
}

impl<'b> BoundStream<'b> {
    /// Enqueues a matrix–vector product `y = alpha·op(A)·x + beta·y` (cuBLAS `gemv`) of
    /// f32 or f64 ([`BlasFloat`]), with A row- or column-major, either transpose, a
    /// leading dimension and positive increments ([`Gemv`]). A and x are claimed as
    /// read, y as written, the handle's workspace as written (as for
    /// [`matmul`](Self::matmul)). Buffers that do not fit the shape, an increment of 0,
    /// or y overlapping A or x are a [`MatmulError`].
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Gemv, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let a = gpu.clone_htod(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0])?; // 2×3 row-major
    /// let x = gpu.clone_htod(&[1.0f64, 1.0, 1.0])?;
    /// let mut y = gpu.alloc_zeros::<f64>(2)?;
    /// gpu.default_stream().gemv(&blas, &Gemv::new(2, 3), &a, &x, &mut y)?;
    /// assert_eq!(gpu.dtoh(&y)?, [6.0, 15.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// cuBLAS has no half-precision GEMV: f16 and bf16 are not [`BlasFloat`].
    ///
    /// ```compile_fail,E0277
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &gpubind::blas::Blas) -> gpubind::Result<()> {
    /// use gpubind::blas::Gemv;
    /// use half::f16;
    /// let (a, x) = (gpu.alloc_zeros::<f16>(6)?, gpu.alloc_zeros::<f16>(3)?);
    /// let mut y = gpu.alloc_zeros::<f16>(2)?;
    /// gpu.default_stream().gemv(blas, &Gemv::new(2, 3), &a, &x, &mut y)?; // error[E0277]
    /// # Ok(()) }
    /// ```
    pub fn gemv<T: BlasFloat>(
        &self,
        blas: &Blas,
        shape: &Gemv,
        a: &impl DeviceMemory<T>,
        x: &impl DeviceMemory<T>,
        y: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let bound = self.bound();
        let bufs: [(_, &Device); 3] = [
            ("matrix A", a.device()),
            ("vector x", x.device()),
            ("vector y", y.device()),
        ];
        check_devices(bound.device(), blas.device(), &bufs)?;
        let plan = plan_gemv(shape, T::DATA_TYPE, [a.len(), x.len(), y.len()])?;
        refuse_aliasing(("y", span_of(&*y)), &[("A", span_of(a)), ("x", span_of(x))])?;
        if plan.empty {
            return Ok(());
        }
        bound.ensure_current()?;
        let shared = Arc::clone(&blas.shared);
        let _claim = self.claim([
            Some((a.tracker(), Access::Read)),
            Some((x.tracker(), Access::Read)),
            Some((y.tracker(), Access::Write)),
            Some((crate::graph::Owned::tracker(&*shared), Access::Write)),
        ])?;
        let (alpha, beta) = (T::from_f64(shape.alpha), T::from_f64(shape.beta));
        let ex = sys::cublas_ex()?;
        let (f, call) = T::gemv(ex.sgemv, ex.dgemv);
        let handle: CublasHandle = blas.handle();
        let (pa, px, py) = (a.device_ptr(), x.device_ptr(), y.device_ptr());
        // SAFETY: the handle's context is current and the stream is one of its streams;
        // A, x and y were checked against the plan (what the dimensions, leading
        // dimension and increments reach is in bounds) and are claimed for this stream,
        // with the workspace, until after the enqueue; alpha and beta are host scalars
        // alive for the call (host pointer mode, set for it).
        unsafe {
            bind_stream(blas, self.raw())?;
            with_pointer_mode(blas, sys::POINTER_MODE_HOST, || {
                let status = f(
                    handle,
                    c_int::from(plan.trans),
                    plan.rows,
                    plan.cols,
                    &alpha,
                    pa as *const T,
                    plan.lda,
                    px as *const T,
                    plan.incx,
                    &beta,
                    py as *mut T,
                    plan.incy,
                );
                check(status, call)
            })
        }
    }

    /// The sum of the magnitudes of every `incx`-th element of `x` from the first
    /// (cuBLAS `asum`), returned to the host: the call waits for the stream up to the
    /// sum. f32 or f64; `incx` 0 is [`MatmulError::ZeroIncrement`]. An empty `x` sums
    /// to 0.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let x = gpu.clone_htod(&[1.0f32, -2.0, 3.0, -4.0])?;
    /// assert_eq!(gpu.default_stream().asum(&blas, &x, 1)?, 10.0);
    /// assert_eq!(gpu.default_stream().asum(&blas, &x, 2)?, 4.0);
    /// # Ok(()) }
    /// ```
    pub fn asum<T: BlasFloat>(
        &self,
        blas: &Blas,
        x: &impl DeviceMemory<T>,
        incx: usize,
    ) -> Result<T> {
        let mut out = T::from_f64(0.0);
        let n = self.check_asum(blas, x, incx)?;
        if n == 0 {
            return Ok(out);
        }
        let ptr: *mut T = &mut out;
        self.enqueue_asum(blas, x, n, incx, (ptr, sys::POINTER_MODE_HOST), None)?;
        Ok(out)
    }

    /// The sum of the magnitudes of every `incx`-th element of `x`, written to the
    /// one-element `result` on the device when the stream gets there (nothing waits):
    /// `x` is claimed as read, `result` as written. A `result` of another length is
    /// [`MatmulError::BufferSize`]; it must not overlap `x`. An empty `x` writes 0.
    pub fn asum_into<T: BlasFloat>(
        &self,
        blas: &Blas,
        x: &impl DeviceMemory<T>,
        incx: usize,
        result: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.bound()
            .device()
            .expect_same("the result", result.device())?;
        let n = self.check_asum(blas, x, incx)?;
        if result.len() != 1 {
            return Err(MatmulError::BufferSize {
                operand: "result",
                shape: "one scalar".into(),
                expected: 1,
                found: result.len(),
                exact: true,
            }
            .into());
        }
        refuse_aliasing(("result", span_of(&*result)), &[("x", span_of(x))])?;
        if n == 0 {
            return self.memset_zeros_async(result);
        }
        let ptr = result.device_ptr() as *mut T;
        let tracker = result.tracker();
        self.enqueue_asum(
            blas,
            x,
            n,
            incx,
            (ptr, sys::POINTER_MODE_DEVICE),
            Some(tracker),
        )
    }

    /// Checks an ASUM's handle, vector and increment; the element count.
    fn check_asum<T: BlasFloat>(
        &self,
        blas: &Blas,
        x: &impl DeviceMemory<T>,
        incx: usize,
    ) -> Result<usize> {
        let x_device: [(_, &Device); 1] = [("vector x", x.device())];
        check_devices(self.bound().device(), blas.device(), &x_device)?;
        if incx == 0 {
            return Err(MatmulError::ZeroIncrement {
                routine: "asum",
                operand: "x",
            }
            .into());
        }
        let n = strided_count(x.len(), incx);
        as_c_int("n", n)?;
        as_c_int("incx", incx)?;
        Ok(n)
    }

    /// Enqueues a checked ASUM of `n` elements writing to `out` (an address of the kind
    /// its pointer mode says; `result`: its tracker, for a device result).
    fn enqueue_asum<T: BlasFloat>(
        &self,
        blas: &Blas,
        x: &impl DeviceMemory<T>,
        n: usize,
        incx: usize,
        (out, mode): (*mut T, c_int),
        result: Option<&crate::access::AccessTracker>,
    ) -> Result<()> {
        self.bound().ensure_current()?;
        let shared = Arc::clone(&blas.shared);
        let _claim = self.claim([
            Some((x.tracker(), Access::Read)),
            Some((crate::graph::Owned::tracker(&*shared), Access::Write)),
            result.map(|t| (t, Access::Write)),
        ])?;
        let ex = sys::cublas_ex()?;
        let (f, call) = T::asum(ex.sasum, ex.dasum);
        let handle = blas.handle();
        let px = x.device_ptr();
        // SAFETY: the handle's context is current and the stream is one of its streams;
        // x holds every `incx`-th element up to `n` (checked) and is claimed with the
        // workspace (and a device result) until after the enqueue; `out` is, as `mode`
        // says, a host value alive for the call (which then waits for the sum) or one
        // claimed device element.
        unsafe {
            bind_stream(blas, self.raw())?;
            with_pointer_mode(blas, mode, || {
                check(
                    f(handle, n as c_int, px as *const T, incx as c_int, out),
                    call,
                )
            })
        }
    }
}
