//! cuBLAS and cuBLASLt matrix products on gpubind memory, bound to the right context by
//! the types.
//!
//! A [`Blas`] handle is created under a binding (`cublasCreate` attaches it to the current
//! context) and, like other resources, holds an `Arc<Device>`. Products are enqueued on a
//! [`BoundStream`](crate::BoundStream) of the same device, so they run in the right
//! context and in stream order with kernels and copies:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{blas::Matmul, Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let dev = Device::get(0)?;
//! let gpu = ctx.bind(&dev)?;
//! let blas = gpu.new_blas()?;
//! let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?; // 2×3, row-major
//! let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0])?; // 3×2
//! let mut c = gpu.alloc_zeros::<f32>(4)?;                       // 2×2
//! gpu.default_stream().matmul(&blas, &Matmul::new(2, 2, 3), &a, &b, &mut c)?;
//! assert_eq!(gpu.dtoh(&c)?, [4.0, 5.0, 10.0, 11.0]);
//! # Ok(()) }
//! ```
//!
//! What there is:
//!
//! * [`BoundStream::matmul`](crate::BoundStream::matmul): `C = alpha·op(A)·op(B) +
//!   beta·C` for f32 (TF32 opt-in: [`Matmul::allow_tf32`]), f64, f16 and bf16 (f32
//!   accumulation) — [`BlasScalar`]; any transposes; row- or column-major ([`Layout`]);
//!   leading dimensions ([`Matmul::with_ld`]).
//! * [`BoundStream::matmul_batched`](crate::BoundStream::matmul_batched): strided
//!   batches ([`Batch`]), as attention uses them.
//! * [`BoundStream::matmul_mixed`](crate::BoundStream::matmul_mixed) and
//!   [`matmul_batched_mixed`](crate::BoundStream::matmul_batched_mixed): f16 or bf16
//!   A and B with an f32 C ([`MatmulOutput`]), as f32 gradient accumulation uses them.
//! * [`BoundStream::matmul_lt`](crate::BoundStream::matmul_lt): cuBLASLt products with
//!   an [`Epilogue`] — bias, ReLU, GELU, their auxiliary outputs, and the backward
//!   epilogues (`DRELU`, `DGELU`, bias gradients) — with operands in [`LtArgs`]; the
//!   algorithm is cuBLASLt's heuristic's first or, with [`AlgoSelection::Timed`]
//!   ([`Blas::set_algo_selection`]), the fastest of its candidates, timed once per shape.
//! * [`BoundStream::matmul_device_scalars`](crate::BoundStream::matmul_device_scalars):
//!   alpha and beta read from device memory when the product runs.
//! * [`BoundStream::matmul_grouped`](crate::BoundStream::matmul_grouped): groups of
//!   f16/bf16 products of different shapes in one call ([`GemmGroup`]; cuBLAS 12.5+).
//! * [`BoundStream::gemv`](crate::BoundStream::gemv) ([`Gemv`]) and
//!   [`BoundStream::asum`](crate::BoundStream::asum) /
//!   [`asum_into`](crate::BoundStream::asum_into), f32 and f64 ([`BlasFloat`]).
//! * The products captured into CUDA graphs, through [`Enqueue`] on a
//!   [`Capture`](crate::Capture): [`matmul`](Enqueue::matmul),
//!   [`matmul_batched`](Enqueue::matmul_batched), [`matmul_mixed`](Enqueue::matmul_mixed),
//!   [`matmul_batched_mixed`](Enqueue::matmul_batched_mixed),
//!   [`matmul_device_scalars`](Enqueue::matmul_device_scalars) (new
//!   alpha and beta written between launches are read by the next launch),
//!   [`matmul_lt`](Enqueue::matmul_lt) (operands in [`CaptureLtArgs`]).
//!
//! [`Enqueue`] takes the products on a stream and in a capture the same way (outputs by
//! `&`, device-only memory, claimed as written), so that one model function serves both;
//! each product is written once, its stream and capture differing only in how the
//! described call is claimed or recorded.
//!
//! Inputs are taken by `&` and claimed as reads, so products on two streams reading one
//! weight run concurrently; outputs are taken by `&mut` (`BoundStream`'s methods) or by
//! `&` of device-only memory ([`Enqueue`]) and claimed as writes. Shapes that
//! do not fit their buffers, leading dimensions too small, a batch whose outputs overlap,
//! an output overlapping an input, or an option the type does not take are refused
//! before cuBLAS is called, with a [`MatmulError`] naming the problem
//! ([`Error::Matmul`](crate::Error::Matmul)).
//!
//! Each handle owns a workspace (device memory, 32 MiB on Hopper and later, 4 MiB
//! before, as NVIDIA recommends) that it gives cuBLAS before every product
//! (`cublasSetWorkspace_v2`) and cuBLASLt with every product, so neither allocates its
//! own. Every product claims the workspace as written: products of one handle on
//! different streams run one after the other (use a handle per stream for concurrency).
//! A graph that captured products keeps the workspace and both library handles alive:
//! the [`Blas`] may be dropped before the graph is launched.
//!
//! cuBLAS is loaded at run time, matching the driver ([`cublas_info`](crate::cublas_info),
//! `GPUBIND_CUBLAS_PATH`); cuBLASLt likewise (`GPUBIND_CUBLASLT_PATH`,
//! [`cublaslt_info`]) by the first `new_blas`. Without a cuBLASLt, plain products still
//! run and `matmul_lt` is [`Error::NoCublasLt`](crate::Error::NoCublasLt).

mod call;
mod capture;
mod enqueue;
mod epilogue;
mod gemm;
mod grouped;
mod handle;
mod lt;
mod plan;
mod select;
mod sys;
#[cfg(test)]
mod tests;
mod types;
mod vector;

pub use crate::error::MatmulError;
pub use capture::{CaptureLtArgs, CaptureOutput};
pub use enqueue::Enqueue;
pub use epilogue::{Epilogue, LtArgs};
pub use handle::Blas;
pub use select::AlgoSelection;
pub use sys::cublaslt_info;
pub use types::{
    Batch, BlasFloat, BlasScalar, DataType, GemmGroup, Gemv, Layout, Matmul, MatmulOutput,
};
