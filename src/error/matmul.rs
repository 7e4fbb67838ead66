//! [`MatmulError`]: why a matrix product was refused before it reached cuBLAS.

use super::Error;

/// A matrix product (`gpubind::blas`, feature `cublas`) that cannot run as asked
/// ([`Error::Matmul`]): found on the host, before anything is enqueued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatmulError {
    /// An operand's buffer does not hold what its shape needs: exactly `expected`
    /// elements for a packed operand (dense, default strides), at least `expected`
    /// otherwise (the last element reached, plus one).
    #[error(
        "matmul: {operand} ({shape}) needs {} {expected} elements, the buffer has {found}",
        if *exact { "exactly" } else { "at least" }
    )]
    BufferSize {
        /// `"A"`, `"B"`, `"C"`, `"bias"`, `"aux"`, `"addend"`.
        operand: &'static str,
        /// The operand's shape as stored, e.g. `"64×32 row-major, ld 32, 4 batches of stride 2048"`.
        shape: String,
        /// The elements needed.
        expected: usize,
        /// The buffer's length.
        found: usize,
        /// Whether the length must be exactly `expected`.
        exact: bool,
    },
    /// A leading dimension smaller than the stored rows (column-major) or columns
    /// (row-major) of its matrix, or zero.
    #[error("matmul: leading dimension of {operand} is {ld}, at least {min} is needed")]
    LeadingDimension {
        /// `"A"`, `"B"` or `"C"`.
        operand: &'static str,
        /// The leading dimension given.
        ld: usize,
        /// The smallest valid one.
        min: usize,
    },
    /// Two output matrices of a strided batch would share elements.
    #[error(
        "matmul: the batch stride of C ({stride} elements) is smaller than one C matrix \
         ({matrix} elements): the batch's outputs would overlap"
    )]
    BatchOverlap {
        /// The stride of C.
        stride: usize,
        /// The elements one C matrix spans.
        matrix: usize,
    },
    /// An output overlaps an input (or another output) of the same product.
    #[error("matmul: {output} overlaps {input} (the product would read or write what it writes)")]
    Aliasing {
        /// The output.
        output: &'static str,
        /// The input (or other output) it overlaps.
        input: &'static str,
    },
    /// An option the element type or the product does not support.
    #[error("matmul: {what} is not supported for {dtype} products")]
    Unsupported {
        /// The option.
        what: String,
        /// The element type (`"f16"`, `"bf16"`, `"f32"`, `"f64"`).
        dtype: &'static str,
    },
    /// An epilogue operand missing, or given to an epilogue that does not use it.
    #[error("matmul_lt: the epilogue {epilogue} {}", if *missing { format!("needs {operand}") } else { format!("does not use {operand}") })]
    EpilogueOperand {
        /// The epilogue's name.
        epilogue: &'static str,
        /// The operand (`"bias"`, `"bias gradient"`, `"aux"`, ...).
        operand: &'static str,
        /// Whether it was missing (else unexpected).
        missing: bool,
    },
    /// An addend ([`LtArgs::addend`](crate::blas::LtArgs::addend)) given to a product
    /// whose `beta` is 0, which would not read it.
    #[error("matmul_lt: an addend is given but beta is 0: the product would not read it")]
    UnreadAddend,
    /// cuBLASLt has no algorithm for this combination of type, shape, layout and
    /// epilogue (its heuristic returned none).
    #[error("matmul_lt: cuBLASLt has no algorithm for {0}")]
    NoAlgorithm(String),
    /// A dimension, leading dimension, stride or count beyond what cuBLAS takes (`i32`
    /// dimensions, `i64` strides), or whose element count overflows `usize`.
    #[error("matmul: {what} = {value} is too large for cuBLAS")]
    TooLarge {
        /// What it is.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// A vector increment of zero (gpubind takes positive increments only).
    #[error("{routine}: the increment of {operand} is 0, at least 1 is needed")]
    ZeroIncrement {
        /// The routine (`"gemv"`, `"asum"`).
        routine: &'static str,
        /// `"x"` or `"y"`.
        operand: &'static str,
    },
    /// The device buffer of alpha and beta does not hold exactly the two scalars.
    #[error(
        "matmul_device_scalars: the scalar buffer holds {found} elements, exactly 2 (alpha, beta) are needed"
    )]
    ScalarBuffer {
        /// The buffer's length.
        found: usize,
    },
    /// One product of a grouped GEMM does not fit its buffers (or its output overlaps
    /// another product's).
    #[error("matmul_grouped: group {group}, product {problem}: {error}")]
    InGroup {
        /// The group's index.
        group: usize,
        /// The product's index within the group.
        problem: usize,
        /// What is wrong.
        error: Box<MatmulError>,
    },
    /// The loaded cuBLAS lacks an entry point this call needs.
    #[error(
        "{what} needs cuBLAS {}.{} or later ({symbol}); the loaded cuBLAS is {}.{}",
        needed.0, needed.1, loaded.0, loaded.1
    )]
    NeedsCublas {
        /// What needed it.
        what: &'static str,
        /// The entry point.
        symbol: &'static str,
        /// The first cuBLAS version that has it.
        needed: (u32, u32),
        /// The loaded cuBLAS's version.
        loaded: (u32, u32),
    },
}

impl From<MatmulError> for Error {
    fn from(e: MatmulError) -> Self {
        Error::Matmul(e)
    }
}
