//! What a product is: the element types, the layout, [`Matmul`] (shape, transposes,
//! scales, leading dimensions) and [`Batch`] (strided batches).

use crate::memory::DeviceRepr;
use half::{bf16, f16};

/// The element type of a product's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataType {
    /// `half::f16`, accumulated in f32 (alpha and beta are f32).
    F16,
    /// `half::bf16`, accumulated in f32 (alpha and beta are f32).
    Bf16,
    /// `f32`, accumulated in f32; with [`Matmul::tf32`], TF32 tensor cores may be used.
    F32,
    /// `f64`, accumulated in f64.
    F64,
}

impl DataType {
    /// The Rust name of the element type (`"f16"`, `"bf16"`, `"f32"`, `"f64"`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
        }
    }

    /// Bytes of one element.
    pub(crate) fn bytes(self) -> usize {
        match self {
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 => 4,
            DataType::F64 => 8,
        }
    }

    /// `cudaDataType_t` of the matrices.
    pub(crate) fn cuda(self) -> std::ffi::c_int {
        use super::sys::*;
        match self {
            DataType::F16 => CUDA_R_16F,
            DataType::Bf16 => CUDA_R_16BF,
            DataType::F32 => CUDA_R_32F,
            DataType::F64 => CUDA_R_64F,
        }
    }

    /// `cudaDataType_t` of alpha and beta (the scale type).
    pub(crate) fn scale_cuda(self) -> std::ffi::c_int {
        use super::sys::*;
        match self {
            DataType::F64 => CUDA_R_64F,
            _ => CUDA_R_32F,
        }
    }

    /// `cublasComputeType_t` of the product.
    pub(crate) fn compute(self, tf32: bool) -> std::ffi::c_int {
        use super::sys::*;
        match (self, tf32) {
            (DataType::F64, _) => COMPUTE_64F,
            (DataType::F32, true) => COMPUTE_32F_FAST_TF32,
            _ => COMPUTE_32F,
        }
    }
}

/// An element type cuBLAS multiplies: `f32`, `f64`, `half::f16`, `half::bf16`. Sealed.
pub trait BlasScalar: DeviceRepr + Copy + sealed::Sealed {
    /// The type's [`DataType`].
    const DATA_TYPE: DataType;
    /// The type of alpha and beta in a product of this type (`f64` for `f64`, else
    /// `f32`): the element type of the device scalars of
    /// [`matmul_device_scalars`](crate::BoundStream::matmul_device_scalars).
    type Scale: DeviceRepr + Copy;
}

/// The output element type of a product whose inputs are `TIn`: `TIn` itself, or `f32`
/// for `f16` and `bf16` inputs (cuBLAS `GemmEx` with 16-bit A and B, an f32 C and f32
/// accumulation: [`matmul_mixed`](crate::BoundStream::matmul_mixed)). Sealed: no other
/// pair compiles.
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &gpubind::blas::Blas) -> gpubind::Result<()> {
/// use gpubind::blas::Matmul;
/// let a = gpu.alloc_zeros::<f32>(4)?;
/// let mut c = gpu.alloc_zeros::<half::bf16>(4)?; // an f32 product has no bf16 output
/// gpu.default_stream().matmul_mixed(blas, &Matmul::new(2, 2, 2), &a, &a, &mut c)?;
/// # Ok(()) }
/// ```
pub trait MatmulOutput<TIn: BlasScalar>: BlasScalar + output_seal::Sealed<TIn> {}

mod output_seal {
    pub trait Sealed<TIn> {}
}

macro_rules! output {
    ($in:ty => $out:ty) => {
        impl output_seal::Sealed<$in> for $out {}
        impl MatmulOutput<$in> for $out {}
    };
}
output!(f32 => f32);
output!(f64 => f64);
output!(f16 => f16);
output!(bf16 => bf16);
output!(f16 => f32);
output!(bf16 => f32);

/// `f32` or `f64`: the element types of cuBLAS's vector routines gpubind offers
/// ([`gemv`](crate::BoundStream::gemv), [`asum`](crate::BoundStream::asum)). Sealed.
pub trait BlasFloat: BlasScalar<Scale = Self> + float_seal::Sealed {}
impl BlasFloat for f32 {}
impl BlasFloat for f64 {}

/// The seal of [`BlasFloat`], with the type's conversions and cuBLAS entry points.
pub(crate) mod float_seal {
    use crate::blas::sys::{AsumFn, GemvFn};

    pub trait Sealed: Sized {
        /// `v` in this type.
        fn from_f64(v: f64) -> Self;
        /// This type's one of `cublasSgemv_v2` and `cublasDgemv_v2`, with its name.
        fn gemv(s: GemvFn<f32>, d: GemvFn<f64>) -> (GemvFn<Self>, &'static str);
        /// This type's one of `cublasSasum_v2` and `cublasDasum_v2`, with its name.
        fn asum(s: AsumFn<f32>, d: AsumFn<f64>) -> (AsumFn<Self>, &'static str);
    }

    impl Sealed for f32 {
        fn from_f64(v: f64) -> Self {
            v as f32
        }
        fn gemv(s: GemvFn<f32>, _: GemvFn<f64>) -> (GemvFn<f32>, &'static str) {
            (s, "cublasSgemv_v2")
        }
        fn asum(s: AsumFn<f32>, _: AsumFn<f64>) -> (AsumFn<f32>, &'static str) {
            (s, "cublasSasum_v2")
        }
    }

    impl Sealed for f64 {
        fn from_f64(v: f64) -> Self {
            v
        }
        fn gemv(_: GemvFn<f32>, d: GemvFn<f64>) -> (GemvFn<f64>, &'static str) {
            (d, "cublasDgemv_v2")
        }
        fn asum(_: AsumFn<f32>, d: AsumFn<f64>) -> (AsumFn<f64>, &'static str) {
            (d, "cublasDasum_v2")
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalar {
    ($t:ty, $d:ident, $s:ty) => {
        impl sealed::Sealed for $t {}
        impl BlasScalar for $t {
            const DATA_TYPE: DataType = DataType::$d;
            type Scale = $s;
        }
    };
}
scalar!(f32, F32, f32);
scalar!(f64, F64, f64);
scalar!(f16, F16, f32);
scalar!(bf16, Bf16, f32);

/// How a product's matrices are laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// Row after row (C, Rust, PyTorch): element `(i, j)` at `i·ld + j`.
    #[default]
    RowMajor,
    /// Column after column (Fortran, BLAS): element `(i, j)` at `i + j·ld`.
    ColMajor,
}

/// One product `C[m×n] = alpha · op(A)[m×k] · op(B)[k×n] + beta · C`.
///
/// `op(X)` is `X` or, with `transpose_a`/`transpose_b`, `Xᵀ`: a transposed `A` is stored
/// `k×m`, a transposed `B` `n×k`. Matrices are row-major unless [`col_major`] is set.
/// Leading dimensions default to the packed ones (the stored row length for row-major,
/// the column length for column-major); [`with_ld`] sets larger ones (a matrix inside a
/// larger one). Buffers of packed operands must have exactly the elements the shape
/// needs; with an explicit leading dimension (or a [`Batch`] stride that is not packed),
/// at least the last element reached plus one.
///
/// ```
/// use gpubind::blas::{Layout, Matmul};
/// // Y[64×256] = X[64×128] · Wᵀ, W stored 256×128 (out × in, as PyTorch's Linear).
/// let shape = Matmul::new(64, 256, 128).transpose_b();
/// assert_eq!(shape.layout, Layout::RowMajor);
/// assert_eq!((shape.alpha, shape.beta), (1.0, 0.0));
/// // The same, accumulating into Y: Y = 0.5·X·Wᵀ + Y.
/// let acc = shape.scaled(0.5, 1.0);
/// assert_eq!(acc.beta, 1.0);
/// ```
///
/// [`col_major`]: Matmul::col_major
/// [`with_ld`]: Matmul::with_ld
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
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
    /// Scale of the product (converted to f32 for f16, bf16 and f32 products).
    pub alpha: f64,
    /// Scale of the old C (0 overwrites; C is then not read).
    pub beta: f64,
    /// Row- or column-major matrices (all three).
    pub layout: Layout,
    /// Leading dimension of A (`None`: packed).
    pub lda: Option<usize>,
    /// Leading dimension of B (`None`: packed).
    pub ldb: Option<usize>,
    /// Leading dimension of C (`None`: packed).
    pub ldc: Option<usize>,
    /// Let f32 products use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`: inputs
    /// rounded to 10 mantissa bits, f32 accumulation). f32 only.
    pub tf32: bool,
}

impl Matmul {
    /// `C = A · B` with `A: m×k`, `B: k×n`, row-major and packed.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Matmul {
            m,
            n,
            k,
            transpose_a: false,
            transpose_b: false,
            alpha: 1.0,
            beta: 0.0,
            layout: Layout::RowMajor,
            lda: None,
            ldb: None,
            ldc: None,
            tf32: false,
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
    pub fn scaled(mut self, alpha: f64, beta: f64) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }

    /// Column-major matrices.
    pub fn col_major(mut self) -> Self {
        self.layout = Layout::ColMajor;
        self
    }

    /// Sets the leading dimensions of A, B and C (elements between the starts of two
    /// rows, for row-major; of two columns, for column-major).
    pub fn with_ld(mut self, lda: usize, ldb: usize, ldc: usize) -> Self {
        self.lda = Some(lda);
        self.ldb = Some(ldb);
        self.ldc = Some(ldc);
        self
    }

    /// Lets an f32 product use TF32 tensor cores (see [`tf32`](Self::tf32)).
    pub fn allow_tf32(mut self) -> Self {
        self.tf32 = true;
        self
    }

    /// The leading dimension of the pre-activation that the `GELU_AUX` epilogues store
    /// and `DGELU` reads ([`Epilogue`](super::Epilogue)): C's rows (row-major: its
    /// columns, `n`; column-major: `m`), rounded up to a multiple of 8 as cuBLASLt
    /// requires.
    pub fn gelu_aux_ld(&self) -> usize {
        self.aux_inner().div_ceil(8).saturating_mul(8)
    }

    /// Elements of the `GELU_AUX` pre-activation buffer: [`gelu_aux_ld`](Self::gelu_aux_ld)
    /// times C's outer dimension. Element `(i, j)` of row-major C is at
    /// `i · gelu_aux_ld + j`.
    pub fn gelu_aux_len(&self) -> usize {
        self.gelu_aux_ld().saturating_mul(self.aux_outer())
    }

    /// The leading dimension, in bits, of the ReLU mask that the `RELU_AUX` epilogues
    /// store and `DRELU` reads: C's inner dimension rounded up to a multiple of 128.
    pub fn relu_mask_ld(&self) -> usize {
        self.aux_inner().div_ceil(128).saturating_mul(128)
    }

    /// Bytes of the ReLU mask buffer (`u8`): one bit per element, rows of
    /// [`relu_mask_ld`](Self::relu_mask_ld) bits.
    pub fn relu_mask_len(&self) -> usize {
        (self.relu_mask_ld() / 8).saturating_mul(self.aux_outer())
    }

    /// C's inner dimension (contiguous in memory).
    fn aux_inner(&self) -> usize {
        match self.layout {
            Layout::RowMajor => self.n,
            Layout::ColMajor => self.m,
        }
    }

    /// C's outer dimension.
    fn aux_outer(&self) -> usize {
        match self.layout {
            Layout::RowMajor => self.m,
            Layout::ColMajor => self.n,
        }
    }
}

/// A strided batch: `count` products, the `i`-th reading `A` at `i · stride_a`, `B` at
/// `i · stride_b` and writing `C` at `i · stride_c` (elements). A stride of 0 reuses one
/// matrix for the whole batch (A and B only: the outputs of a batch must not overlap).
///
/// ```
/// use gpubind::blas::{Batch, Matmul};
/// // Attention scores: 96 heads of Q[1024×64] · Kᵀ.
/// let shape = Matmul::new(1024, 1024, 64).transpose_b();
/// let batch = Batch::packed(96, &shape);
/// assert_eq!((batch.stride_a, batch.stride_b, batch.stride_c), (65536, 65536, 1 << 20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Batch {
    /// Products in the batch.
    pub count: usize,
    /// Elements from one A to the next.
    pub stride_a: usize,
    /// Elements from one B to the next.
    pub stride_b: usize,
    /// Elements from one C to the next.
    pub stride_c: usize,
}

impl Batch {
    /// A batch with the given strides.
    pub fn new(count: usize, stride_a: usize, stride_b: usize, stride_c: usize) -> Self {
        Batch {
            count,
            stride_a,
            stride_b,
            stride_c,
        }
    }

    /// `count` packed matrices one after the other (strides `m·k`, `k·n`, `m·n`; leading
    /// dimensions of `shape` are ignored: a packed batch has packed matrices).
    pub fn packed(count: usize, shape: &Matmul) -> Self {
        let Matmul { m, n, k, .. } = *shape;
        Batch::new(
            count,
            m.saturating_mul(k),
            k.saturating_mul(n),
            m.saturating_mul(n),
        )
    }
}

/// A matrix–vector product `y = alpha · op(A) · x + beta · y` (cuBLAS `gemv`), with `A`
/// stored `m×n` in [`layout`](Self::layout) (leading dimension [`lda`](Self::lda)) and
/// `op(A)` either `A` or, with [`transpose`](Self::transpose), `Aᵀ`.
///
/// `x` has `op(A)`'s columns (`n`, or `m` transposed) and `y` its rows, every `incx`-th
/// (`incy`-th) element of their buffers from the first. Packed vectors (increment 1) and
/// a packed `A` must have exactly the elements the shape needs; otherwise at least the
/// last element reached plus one.
///
/// ```
/// use gpubind::blas::{Gemv, Layout};
/// // y[4] = Aᵀ·x with A stored 3×4 row-major, x of 3.
/// let g = Gemv::new(3, 4).transpose();
/// assert_eq!((g.x_len(), g.y_len()), (3, 4));
/// assert_eq!(g.layout, Layout::RowMajor);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Gemv {
    /// Rows of A as stored.
    pub m: usize,
    /// Columns of A as stored.
    pub n: usize,
    /// Use `Aᵀ`.
    pub transpose: bool,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the old y (0 overwrites; y is then not read).
    pub beta: f64,
    /// Row- or column-major A.
    pub layout: Layout,
    /// Leading dimension of A (`None`: packed).
    pub lda: Option<usize>,
    /// Elements from one element of x to the next (at least 1).
    pub incx: usize,
    /// Elements from one element of y to the next (at least 1).
    pub incy: usize,
}

impl Gemv {
    /// `y = A · x` with `A: m×n`, row-major and packed, increments 1.
    pub fn new(m: usize, n: usize) -> Self {
        Gemv {
            m,
            n,
            transpose: false,
            alpha: 1.0,
            beta: 0.0,
            layout: Layout::RowMajor,
            lda: None,
            incx: 1,
            incy: 1,
        }
    }

    /// Uses `Aᵀ`.
    pub fn transpose(mut self) -> Self {
        self.transpose = true;
        self
    }

    /// Sets `alpha` and `beta`.
    pub fn scaled(mut self, alpha: f64, beta: f64) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }

    /// Column-major A.
    pub fn col_major(mut self) -> Self {
        self.layout = Layout::ColMajor;
        self
    }

    /// Sets the leading dimension of A.
    pub fn with_lda(mut self, lda: usize) -> Self {
        self.lda = Some(lda);
        self
    }

    /// Sets the increments of x and y.
    pub fn with_inc(mut self, incx: usize, incy: usize) -> Self {
        self.incx = incx;
        self.incy = incy;
        self
    }

    /// Elements of x: the columns of `op(A)`.
    pub fn x_len(&self) -> usize {
        if self.transpose { self.m } else { self.n }
    }

    /// Elements of y: the rows of `op(A)`.
    pub fn y_len(&self) -> usize {
        if self.transpose { self.n } else { self.m }
    }
}

/// One group of a grouped GEMM ([`matmul_grouped`](crate::BoundStream::matmul_grouped)):
/// products of one [`shape`](Self::shape) (dimensions, transposes, layout, leading
/// dimensions, alpha and beta), one per entry of [`offsets`](Self::offsets), each
/// reading its A and B and writing its C at the given element offsets of the grouped
/// call's three buffers.
///
/// ```
/// use gpubind::blas::{GemmGroup, Matmul};
/// // Two experts' products of 16 tokens × 64 → 32, weights stored out × in.
/// let shape = Matmul::new(16, 32, 64).transpose_b();
/// let g = GemmGroup::new(shape).problem(0, 0, 0).problem(16 * 64, 32 * 64, 16 * 32);
/// assert_eq!(g.offsets.len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GemmGroup {
    /// The products' shape (TF32 is not taken).
    pub shape: Matmul,
    /// For each product, the element offsets of its A, B and C.
    pub offsets: Vec<[usize; 3]>,
}

impl GemmGroup {
    /// A group of `shape` with no product yet.
    pub fn new(shape: Matmul) -> Self {
        GemmGroup {
            shape,
            offsets: Vec::new(),
        }
    }

    /// Adds a product reading A at `a`, B at `b` and writing C at `c` (element offsets).
    pub fn problem(mut self, a: usize, b: usize, c: usize) -> Self {
        self.offsets.push([a, b, c]);
        self
    }
}
