//! Checking a product against its buffers, and turning it into the column-major problem
//! cuBLAS solves. Pure host code: nothing here calls the driver or cuBLAS.

use super::handle::refuse_aliasing;
use super::types::{Batch, DataType, Layout, Matmul};
use crate::access::AccessTracker;
use crate::device::Device;
use crate::error::{MatmulError, Result};
use crate::memory::{ByteSpan, DeviceMemory};

/// One operand as stored: `rows×cols` in the product's layout, leading dimension `ld`,
/// `count` matrices `stride` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) ld: usize,
    pub(crate) count: usize,
    pub(crate) stride: usize,
    layout: Layout,
}

impl Stored {
    /// The operand `name` with the given stored size, leading dimension (`None`:
    /// packed) and batch; checks the leading dimension.
    pub(crate) fn new(
        name: &'static str,
        (rows, cols): (usize, usize),
        ld: Option<usize>,
        layout: Layout,
        batch: Option<(usize, usize)>,
    ) -> Result<Self, MatmulError> {
        let inner = match layout {
            Layout::RowMajor => cols,
            Layout::ColMajor => rows,
        };
        let min = inner.max(1);
        let ld = ld.unwrap_or(min);
        if ld < min {
            return Err(MatmulError::LeadingDimension {
                operand: name,
                ld,
                min,
            });
        }
        let (count, stride) = batch.unwrap_or((1, 0));
        Ok(Stored {
            rows,
            cols,
            ld,
            count,
            stride,
            layout,
        })
    }

    fn inner_outer(&self) -> (usize, usize) {
        match self.layout {
            Layout::RowMajor => (self.cols, self.rows),
            Layout::ColMajor => (self.rows, self.cols),
        }
    }

    /// Elements one matrix spans: from its first element to its last, inclusive.
    pub(crate) fn matrix_span(&self) -> Result<usize, MatmulError> {
        let (inner, outer) = self.inner_outer();
        if inner == 0 || outer == 0 {
            return Ok(0);
        }
        (outer - 1)
            .checked_mul(self.ld)
            .and_then(|x| x.checked_add(inner))
            .ok_or(MatmulError::TooLarge {
                what: "matrix span",
                value: outer,
            })
    }

    /// Whether the operand is packed: leading dimension equal to the inner dimension and
    /// (batched) stride equal to one matrix.
    fn packed(&self) -> bool {
        let (inner, _) = self.inner_outer();
        (self.ld == inner || inner == 0)
            && (self.count <= 1 || self.stride == self.rows.saturating_mul(self.cols))
    }

    /// The elements the buffer needs, and whether exactly that many.
    pub(crate) fn needed(&self) -> Result<(usize, bool), MatmulError> {
        let span = self.matrix_span()?;
        let too_large = MatmulError::TooLarge {
            what: "batch span",
            value: self.count,
        };
        if self.packed() {
            let n = self
                .rows
                .checked_mul(self.cols)
                .and_then(|x| x.checked_mul(self.count))
                .ok_or(too_large)?;
            return Ok((n, true));
        }
        if self.count == 0 || span == 0 {
            return Ok((0, false));
        }
        let n = (self.count - 1)
            .checked_mul(self.stride)
            .and_then(|x| x.checked_add(span))
            .ok_or(too_large)?;
        Ok((n, false))
    }

    /// [`MatmulError::BufferSize`] unless a buffer of `len` elements fits.
    pub(crate) fn check_len(&self, name: &'static str, len: usize) -> Result<(), MatmulError> {
        let (expected, exact) = self.needed()?;
        if (exact && len == expected) || (!exact && len >= expected) {
            return Ok(());
        }
        let layout = match self.layout {
            Layout::RowMajor => "row-major",
            Layout::ColMajor => "column-major",
        };
        let mut shape = format!("{}×{} {layout}, ld {}", self.rows, self.cols, self.ld);
        if self.count != 1 || self.stride != 0 {
            shape += &format!(", {} batches of stride {}", self.count, self.stride);
        }
        Err(MatmulError::BufferSize {
            operand: name,
            shape,
            expected,
            found: len,
            exact,
        })
    }
}

/// The column-major problem cuBLAS solves, with the operands in cuBLAS's order: for a
/// row-major product `C = op(A)·op(B)`, cuBLAS computes `Cᵀ = op(B)ᵀ·op(A)ᵀ`, so its
/// first operand is the caller's B (`swapped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// cuBLAS's A is the caller's B.
    pub(crate) swapped: bool,
    pub(crate) transa: bool,
    pub(crate) transb: bool,
    pub(crate) m: i32,
    pub(crate) n: i32,
    pub(crate) k: i32,
    pub(crate) lda: i32,
    pub(crate) ldb: i32,
    pub(crate) ldc: i32,
    pub(crate) count: i32,
    pub(crate) stride_a: i64,
    pub(crate) stride_b: i64,
    pub(crate) stride_c: i64,
    /// Nothing to compute (C or the batch is empty).
    pub(crate) empty: bool,
}

fn as_i32(what: &'static str, value: usize) -> Result<i32, MatmulError> {
    i32::try_from(value).map_err(|_| MatmulError::TooLarge { what, value })
}

fn as_i64(what: &'static str, value: usize) -> Result<i64, MatmulError> {
    i64::try_from(value).map_err(|_| MatmulError::TooLarge { what, value })
}

/// The stored operands A, B, C of `shape` (batched by `batch`).
pub(crate) fn operands(shape: &Matmul, batch: Option<&Batch>) -> Result<[Stored; 3], MatmulError> {
    let Matmul { m, n, k, .. } = *shape;
    let a = if shape.transpose_a { (k, m) } else { (m, k) };
    let b = if shape.transpose_b { (n, k) } else { (k, n) };
    let bt = |s: fn(&Batch) -> usize| batch.map(|b| (b.count, s(b)));
    Ok([
        Stored::new("A", a, shape.lda, shape.layout, bt(|b| b.stride_a))?,
        Stored::new("B", b, shape.ldb, shape.layout, bt(|b| b.stride_b))?,
        Stored::new("C", (m, n), shape.ldc, shape.layout, bt(|b| b.stride_c))?,
    ])
}

/// Checks that a product of `input` matrices may write `output` ones: the same type,
/// or f32 for f16 and bf16 inputs (f32 accumulation either way).
pub(crate) fn check_output(input: DataType, output: DataType) -> Result<(), MatmulError> {
    let mixed_ok = output == DataType::F32 && matches!(input, DataType::F16 | DataType::Bf16);
    if input == output || mixed_ok {
        return Ok(());
    }
    Err(MatmulError::Unsupported {
        what: format!("{} output", output.name()),
        dtype: input.name(),
    })
}

/// Checks `shape` (of `dtype` elements, batched by `batch`) against buffers of
/// `lens = [A, B, C]` elements, and plans it for cuBLAS.
pub(crate) fn plan(
    shape: &Matmul,
    dtype: DataType,
    batch: Option<&Batch>,
    lens: [usize; 3],
) -> Result<Plan, MatmulError> {
    if shape.tf32 && dtype != DataType::F32 {
        return Err(MatmulError::Unsupported {
            what: "tf32".into(),
            dtype: dtype.name(),
        });
    }
    let [a, b, c] = operands(shape, batch)?;
    a.check_len("A", lens[0])?;
    b.check_len("B", lens[1])?;
    c.check_len("C", lens[2])?;
    let count = batch.map_or(1, |b| b.count);
    let c_span = c.matrix_span()?;
    if count > 1 && c_span > 0 && c.stride < c_span {
        return Err(MatmulError::BatchOverlap {
            stride: c.stride,
            matrix: c_span,
        });
    }
    let Matmul { m, n, k, .. } = *shape;
    let swapped = shape.layout == Layout::RowMajor;
    let (first, second, ta, tb, cm, cn) = if swapped {
        (&b, &a, shape.transpose_b, shape.transpose_a, n, m)
    } else {
        (&a, &b, shape.transpose_a, shape.transpose_b, m, n)
    };
    Ok(Plan {
        swapped,
        transa: ta,
        transb: tb,
        m: as_i32("m", cm)?,
        n: as_i32("n", cn)?,
        k: as_i32("k", k)?,
        lda: as_i32("leading dimension", first.ld)?,
        ldb: as_i32("leading dimension", second.ld)?,
        ldc: as_i32("ldc", c.ld)?,
        count: as_i32("batch count", count)?,
        stride_a: as_i64("batch stride", first.stride)?,
        stride_b: as_i64("batch stride", second.stride)?,
        stride_c: as_i64("batch stride of C", c.stride)?,
        empty: m == 0 || n == 0 || count == 0,
    })
}

/// A buffer of a product as the checks, claims and records see it: its access tracker,
/// the device it lives on, its length in elements and the bytes it covers.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub(crate) tracker: &'a AccessTracker,
    pub(crate) device: &'a Device,
    pub(crate) len: usize,
    pub(crate) span: ByteSpan,
}

impl<'a> Operand<'a> {
    #[inline]
    pub(crate) fn of<T, M: DeviceMemory<T> + ?Sized>(m: &'a M) -> Self {
        Operand {
            tracker: m.tracker(),
            device: m.device(),
            len: m.len(),
            span: ByteSpan::of(m),
        }
    }

    /// Its device address.
    #[inline]
    pub(crate) fn ptr(&self) -> u64 {
        self.span.addr
    }
}

/// [`Error::WrongDevice`](crate::Error::WrongDevice) unless the cuBLAS handle (created
/// on `handle`) and each named buffer live on `device`, in that order.
pub(crate) fn check_devices(
    device: &Device,
    handle: &Device,
    bufs: &[(&'static str, &Device)],
) -> Result<()> {
    device.expect_same("cuBLAS handle", handle)?;
    for (what, d) in bufs {
        device.expect_same(what, d)?;
    }
    Ok(())
}

/// What a GEMM computes: its shape, its batch, and the element types of A and B
/// (`dtypes[0]`) and of C (`dtypes[1]`).
#[derive(Clone, Copy)]
pub(crate) struct Gemm<'a> {
    pub(crate) shape: &'a Matmul,
    pub(crate) batch: Option<&'a Batch>,
    pub(crate) dtypes: [DataType; 2],
}

/// The checks of every GEMM, eager or captured, in order: C's element type against A's
/// and B's; the handle's and the matrices' devices against `device`; the shape against
/// the buffers' lengths ([`plan`]); C against A and B (no overlap); then the device
/// scalars, if any (on `device`, exactly `[alpha, beta]`, not overlapping C). Plans the
/// product.
pub(crate) fn check_gemm(
    device: &Device,
    handle: &Device,
    gemm: Gemm<'_>,
    [a, b, c]: [Operand<'_>; 3],
    scales: Option<Operand<'_>>,
) -> Result<Plan> {
    let [dtype, out] = gemm.dtypes;
    check_output(dtype, out)?;
    let matrices = [
        ("matrix A", a.device),
        ("matrix B", b.device),
        ("matrix C", c.device),
    ];
    check_devices(device, handle, &matrices)?;
    let plan = plan(gemm.shape, dtype, gemm.batch, [a.len, b.len, c.len])?;
    refuse_aliasing(("C", c.span), &[("A", a.span), ("B", b.span)])?;
    if let Some(s) = scales {
        device.expect_same("alpha and beta", s.device)?;
        if s.len != 2 {
            return Err(MatmulError::ScalarBuffer { found: s.len }.into());
        }
        refuse_aliasing(("C", c.span), &[("alpha and beta", s.span)])?;
    }
    Ok(plan)
}
