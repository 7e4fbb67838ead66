//! GEMM through cuBLAS (`cublasGemmEx`, `cublasGemmStridedBatchedEx`): single products
//! and strided batches, on a stream.

use super::call::{GemmCall, matrix_claims};
use super::handle::Blas;
use super::plan::Plan;
use super::sys::{self, check};
use super::types::{Batch, BlasScalar, DataType, Matmul, MatmulOutput};
use crate::access::Access;
use crate::driver::libraries as libs;
use crate::error::Result;
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use crate::stream::BoundStream;
use cudarc::driver::sys as driver;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// alpha and beta in the product's scale type (f64 for f64 products, else f32), kept
/// alive for the enqueue (cuBLAS reads host scalars during the call), or the device
/// address of the two (read by the product's kernels when they run).
pub(crate) enum Scales {
    F32([f32; 2]),
    F64([f64; 2]),
    /// Device address of `[alpha, beta]`, elements of `bytes` bytes.
    Device {
        ptr: u64,
        bytes: u64,
    },
}

impl Scales {
    pub(crate) fn new(dtype: DataType, shape: &Matmul) -> Self {
        match dtype {
            DataType::F64 => Scales::F64([shape.alpha, shape.beta]),
            _ => Scales::F32([shape.alpha as f32, shape.beta as f32]),
        }
    }

    /// The scales at device address `ptr` (`[alpha, beta]` of the scale type of `dtype`).
    pub(crate) fn on_device(dtype: DataType, ptr: u64) -> Self {
        let bytes = match dtype {
            DataType::F64 => 8,
            _ => 4,
        };
        Scales::Device { ptr, bytes }
    }

    /// Pointers to alpha and beta.
    pub(crate) fn ptrs(&self) -> (*const c_void, *const c_void) {
        match self {
            Scales::F32(s) => ((&s[0] as *const f32).cast(), (&s[1] as *const f32).cast()),
            Scales::F64(s) => ((&s[0] as *const f64).cast(), (&s[1] as *const f64).cast()),
            Scales::Device { ptr, bytes } => {
                (*ptr as *const c_void, (ptr + bytes) as *const c_void)
            }
        }
    }

    /// `cublasSetPointerMode_v2`'s mode for these scales.
    fn pointer_mode(&self) -> c_int {
        match self {
            Scales::Device { .. } => sys::POINTER_MODE_DEVICE,
            _ => sys::POINTER_MODE_HOST,
        }
    }
}

/// Runs `call` with the handle's pointer mode set to `mode`, and sets it back to host
/// pointers afterwards (whatever `call` returned), so every other call of the handle
/// keeps reading host scalars.
///
/// # Safety
///
/// `blas`'s context is current; `call` reads its scalars as `mode` says.
pub(crate) unsafe fn with_pointer_mode<R>(
    blas: &Blas,
    mode: c_int,
    call: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let ex = sys::cublas_ex()?;
    // SAFETY: a live handle of the current context (the caller's contract).
    check(
        unsafe { (ex.set_pointer_mode)(blas.handle(), mode) },
        "cublasSetPointerMode_v2",
    )?;
    let out = call();
    if mode == sys::POINTER_MODE_HOST {
        return out;
    }
    // SAFETY: as above.
    let restore = check(
        unsafe { (ex.set_pointer_mode)(blas.handle(), sys::POINTER_MODE_HOST) },
        "cublasSetPointerMode_v2",
    );
    match (out, restore) {
        (Ok(r), Ok(())) => Ok(r),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// The device addresses of the caller's A, B and C.
pub(crate) type Ptrs = (u64, u64, u64);

/// Points `blas` at `stream` and its workspace (`cublasSetStream_v2` resets the
/// workspace, so the workspace is set after it).
///
/// # Safety
///
/// `blas`'s context is current and `stream` is one of its streams (or null).
pub(crate) unsafe fn bind_stream(blas: &Blas, stream: driver::CUstream) -> Result<()> {
    let api = libs::cublas()?;
    // SAFETY: the handle belongs to the current context (the caller's contract); the
    // stream is a stream of that context (or null for the default stream).
    check(
        unsafe { (api.set_stream)(blas.handle(), stream.cast()) },
        "cublasSetStream_v2",
    )?;
    let ws = &blas.shared.workspace;
    // SAFETY: a live allocation of the handle's context, 256-byte aligned (cuMemAlloc),
    // of the size given; kept alive by the Blas (and by every graph that captured a
    // product with it) and ordered by the claims on its tracker.
    check(
        unsafe { (api.set_workspace)(blas.handle(), ws.device_ptr() as _, ws.len()) },
        "cublasSetWorkspace_v2",
    )
}

/// Enqueues a planned product on `stream`: A and B of `dtypes[0]`, C of `dtypes[1]` (a
/// pair [`check_output`](super::plan::check_output) accepted).
///
/// # Safety
///
/// `blas`'s context is current and `stream` is one of its streams (or null). The
/// addresses are live allocations of that context whose lengths `GemmCall::check` accepted
/// for `plan`, and they and the workspace stay alive and unused by other streams until
/// the product has run (the caller's claim or the graph's). `device_scales`, if given, is
/// the address of two live elements of the scale type (`[alpha, beta]`), claimed as
/// read likewise; otherwise alpha and beta are `shape`'s.
pub(crate) unsafe fn enqueue_gemm(
    blas: &Blas,
    plan: &Plan,
    [dtype, out]: [DataType; 2],
    shape: &Matmul,
    stream: driver::CUstream,
    (a, b, c): Ptrs,
    device_scales: Option<u64>,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { bind_stream(blas, stream)? };
    let (first, second) = if plan.swapped { (b, a) } else { (a, b) };
    let scales = match device_scales {
        Some(ptr) => Scales::on_device(dtype, ptr),
        None => Scales::new(dtype, shape),
    };
    let call = CublasCall {
        handle: blas.handle(),
        plan,
        ty: dtype.cuda(),
        ty_c: out.cuda(),
        compute: dtype.compute(shape.tf32),
        scales: scales.ptrs(),
        ptrs: (first, second, c),
    };
    // SAFETY: the caller's contract; `scales` outlives the call, and the pointer mode
    // says where they are.
    unsafe {
        with_pointer_mode(blas, scales.pointer_mode(), || {
            if plan.count == 1 && dtype == DataType::F32 && out == DataType::F32 && !shape.tf32 {
                call.sgemm()
            } else if plan.count == 1 {
                call.gemm_ex()
            } else {
                call.strided_batched()
            }
        })
    }
}

/// One cuBLAS call of a planned product: cuBLAS's operands in its order.
struct CublasCall<'p> {
    handle: crate::driver::libraries::CublasHandle,
    plan: &'p Plan,
    /// `cudaDataType_t` of A and B.
    ty: c_int,
    /// `cudaDataType_t` of C.
    ty_c: c_int,
    compute: c_int,
    /// alpha and beta, of the scale type.
    scales: (*const c_void, *const c_void),
    ptrs: Ptrs,
}

/// `cublasOperation_t`: `CUBLAS_OP_N` = 0, `CUBLAS_OP_T` = 1.
fn op(transpose: bool) -> c_int {
    c_int::from(transpose)
}

impl CublasCall<'_> {
    /// `cublasSgemm_v2` (an f32 product without TF32).
    ///
    /// # Safety
    ///
    /// [`enqueue_gemm`]'s contract, with the handle bound to the stream and workspace;
    /// the scales are live f32 scalars where the handle's pointer mode says.
    unsafe fn sgemm(&self) -> Result<()> {
        let api = libs::cublas()?;
        let (p, (a, b, c)) = (self.plan, self.ptrs);
        let (alpha, beta) = (self.scales.0.cast::<f32>(), self.scales.1.cast::<f32>());
        // SAFETY: the contract: live f32 buffers holding what the planned dimensions and
        // leading dimensions reach, ordered and kept alive; f32 scalars where the pointer
        // mode says (host scalars alive for the call, or claimed device scalars).
        let status = unsafe {
            (api.sgemm)(
                self.handle,
                op(p.transa),
                op(p.transb),
                p.m,
                p.n,
                p.k,
                alpha,
                a as *const f32,
                p.lda,
                b as *const f32,
                p.ldb,
                beta,
                c as *mut f32,
                p.ldc,
            )
        };
        check(status, "cublasSgemm_v2")
    }

    /// `cublasGemmEx`.
    ///
    /// # Safety
    ///
    /// As for [`sgemm`](Self::sgemm), with buffers and scales of the call's types.
    unsafe fn gemm_ex(&self) -> Result<()> {
        let ex = sys::cublas_ex()?;
        let (p, (a, b, c), ty, ty_c) = (self.plan, self.ptrs, self.ty, self.ty_c);
        // SAFETY: the contract: live buffers of types `ty` (A, B) and `ty_c` (C), a pair
        // cuBLAS takes with the compute type (`check_output`), holding what the planned
        // dimensions and leading dimensions reach, ordered and kept alive; host scalars
        // of the scale type where the pointer mode says (host scalars alive for the call,
        // or claimed device scalars).
        let status = unsafe {
            (ex.gemm_ex)(
                self.handle,
                op(p.transa),
                op(p.transb),
                p.m,
                p.n,
                p.k,
                self.scales.0,
                a as *const c_void,
                ty,
                p.lda,
                b as *const c_void,
                ty,
                p.ldb,
                self.scales.1,
                c as *mut c_void,
                ty_c,
                p.ldc,
                self.compute,
                sys::GEMM_DEFAULT,
            )
        };
        check(status, "cublasGemmEx")
    }

    /// `cublasGemmStridedBatchedEx`.
    ///
    /// # Safety
    ///
    /// As for [`gemm_ex`](Self::gemm_ex), with every matrix of the batch in bounds
    /// (checked by the plan) and the outputs disjoint (stride of C at least one matrix).
    unsafe fn strided_batched(&self) -> Result<()> {
        let ex = sys::cublas_ex()?;
        let (p, (a, b, c), ty, ty_c) = (self.plan, self.ptrs, self.ty, self.ty_c);
        // SAFETY: the contract, as in `gemm_ex`, for all `count` matrices.
        let status = unsafe {
            (ex.gemm_strided_batched_ex)(
                self.handle,
                op(p.transa),
                op(p.transb),
                p.m,
                p.n,
                p.k,
                self.scales.0,
                a as *const c_void,
                ty,
                p.lda,
                p.stride_a,
                b as *const c_void,
                ty,
                p.ldb,
                p.stride_b,
                self.scales.1,
                c as *mut c_void,
                ty_c,
                p.ldc,
                p.stride_c,
                p.count,
                self.compute,
                sys::GEMM_DEFAULT,
            )
        };
        check(status, "cublasGemmStridedBatchedEx")
    }
}

impl<'b> BoundStream<'b> {
    /// Enqueues a matrix product `C = alpha·op(A)·op(B) + beta·C` (cuBLAS `GemmEx`) of
    /// f32, f64, f16 or bf16 matrices ([`BlasScalar`]), row- or column-major, with any
    /// transposes and leading dimensions ([`Matmul`]). Buffer lengths must fit the shape
    /// ([`MatmulError`](super::MatmulError)); everything must live on the bound device.
    ///
    /// A and B are read (claimed as reads: products on other streams that read them run
    /// concurrently), C is written. The product uses the handle's workspace, which every
    /// product of the handle claims as written: products of one [`Blas`] on different
    /// streams run one after another (use one handle per stream for concurrent products).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
    /// use half::bf16;
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let x = gpu.clone_htod(&vec![bf16::from_f32(1.0); 8 * 16])?; // 8×16
    /// let w = gpu.clone_htod(&vec![bf16::from_f32(0.5); 32 * 16])?; // 32×16 (out × in)
    /// let mut y = gpu.alloc_zeros::<bf16>(8 * 32)?;
    /// gpu.default_stream().matmul(&blas, &Matmul::new(8, 32, 16).transpose_b(), &x, &w, &mut y)?;
    /// assert!(gpu.dtoh(&y)?.iter().all(|v| v.to_f32() == 8.0));
    /// # Ok(()) }
    /// ```
    pub fn matmul<T: BlasScalar>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        a: &impl DeviceMemory<T>,
        b: &impl DeviceMemory<T>,
        c: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.gemm_call(
            blas,
            GemmCall::new::<T, T, _, _, _>(shape, None, (a, b, &*c)),
        )
    }

    /// Enqueues a strided batch of products (cuBLAS `GemmStridedBatchedEx`): the `i`-th
    /// computes `C_i = alpha·op(A_i)·op(B_i) + beta·C_i` with `X_i` at `i·stride_x`
    /// ([`Batch`]). The same types, layouts and claims as [`matmul`](Self::matmul); the
    /// buffers must reach the last matrix of the batch, and the C matrices must not
    /// overlap ([`MatmulError::BatchOverlap`](super::MatmulError::BatchOverlap)).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::{Batch, Matmul}, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// // Per head: S = Q · Kᵀ, Q and K 128×64, 8 heads.
    /// let shape = Matmul::new(128, 128, 64).transpose_b().scaled(0.125, 0.0);
    /// let batch = Batch::packed(8, &shape);
    /// let q = gpu.alloc_zeros::<f32>(8 * 128 * 64)?;
    /// let k = gpu.alloc_zeros::<f32>(8 * 128 * 64)?;
    /// let mut s = gpu.alloc_zeros::<f32>(8 * 128 * 128)?;
    /// gpu.default_stream().matmul_batched(&blas, &shape, &batch, &q, &k, &mut s)?;
    /// # Ok(()) }
    /// ```
    pub fn matmul_batched<T: BlasScalar>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &impl DeviceMemory<T>,
        b: &impl DeviceMemory<T>,
        c: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let call = GemmCall::new::<T, T, _, _, _>(shape, Some(batch), (a, b, &*c));
        self.gemm_call(blas, call)
    }

    /// Enqueues a matrix product as [`matmul`](Self::matmul) does, with C of another
    /// element type than A and B ([`MatmulOutput`]): f16 or bf16 inputs and an f32
    /// output (cuBLAS `GemmEx` with `CUDA_R_16F`/`CUDA_R_16BF` A and B, `CUDA_R_32F` C,
    /// `CUBLAS_COMPUTE_32F`), for example f32 weight gradients of bf16 activations, or
    /// the same type (then it is [`matmul`](Self::matmul)). Alpha and beta are f32; with
    /// `beta = 1` the product accumulates into the f32 C. The claims and checks of
    /// [`matmul`](Self::matmul); TF32 is refused (`MatmulError::Unsupported`).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
    /// use half::bf16;
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let x = gpu.clone_htod(&vec![bf16::from_f32(1.0); 8 * 16])?; // 8×16
    /// let dy = gpu.clone_htod(&vec![bf16::from_f32(0.5); 8 * 32])?; // 8×32
    /// let mut dw = gpu.alloc_zeros::<f32>(32 * 16)?; // f32 gradient of W (32×16)
    /// // dW += dYᵀ · X
    /// let shape = Matmul::new(32, 16, 8).transpose_a().scaled(1.0, 1.0);
    /// gpu.default_stream().matmul_mixed(&blas, &shape, &dy, &x, &mut dw)?;
    /// assert!(gpu.dtoh(&dw)?.iter().all(|&v| v == 4.0));
    /// # Ok(()) }
    /// ```
    pub fn matmul_mixed<TIn: BlasScalar, TOut: MatmulOutput<TIn>>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        a: &impl DeviceMemory<TIn>,
        b: &impl DeviceMemory<TIn>,
        c: &mut impl DeviceMemoryMut<TOut>,
    ) -> Result<()> {
        let call = GemmCall::new::<TIn, TOut, _, _, _>(shape, None, (a, b, &*c));
        self.gemm_call(blas, call)
    }

    /// A strided batch of products as [`matmul_batched`](Self::matmul_batched) does,
    /// with C of the output type of [`matmul_mixed`](Self::matmul_mixed)
    /// (`cublasGemmStridedBatchedEx` with 16-bit A and B and an f32 C).
    pub fn matmul_batched_mixed<TIn: BlasScalar, TOut: MatmulOutput<TIn>>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        batch: &Batch,
        a: &impl DeviceMemory<TIn>,
        b: &impl DeviceMemory<TIn>,
        c: &mut impl DeviceMemoryMut<TOut>,
    ) -> Result<()> {
        let call = GemmCall::new::<TIn, TOut, _, _, _>(shape, Some(batch), (a, b, &*c));
        self.gemm_call(blas, call)
    }

    /// Enqueues a matrix product as [`matmul`](Self::matmul) does, with alpha and beta
    /// read from device memory when the product runs (`CUBLAS_POINTER_MODE_DEVICE`):
    /// `scales` holds exactly `[alpha, beta]`, of the product's scale type (`f64` for
    /// `f64` products, else `f32`: [`BlasScalar::Scale`]); `shape.alpha` and `shape.beta`
    /// are not used. `scales` is claimed as read, so the product runs after its last
    /// write (a kernel or copy on any stream); captured
    /// ([`Enqueue::matmul_device_scalars`](super::Enqueue::matmul_device_scalars)), each
    /// launch of the graph reads the values written before it.
    ///
    /// The handle's pointer mode is set for this call and set back to host scalars after
    /// it. A `scales` buffer of another length is
    /// [`MatmulError::ScalarBuffer`](super::MatmulError::ScalarBuffer); `c` must not
    /// overlap it.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0])?;
    /// let scales = gpu.clone_htod(&[2.0f32, 0.0])?; // alpha = 2, beta = 0
    /// let mut c = gpu.alloc_zeros::<f32>(4)?;
    /// let s = gpu.default_stream();
    /// s.matmul_device_scalars(&blas, &Matmul::new(2, 2, 2), &scales, &a, &b, &mut c)?;
    /// assert_eq!(gpu.dtoh(&c)?, [2.0, 4.0, 6.0, 8.0]);
    /// # Ok(()) }
    /// ```
    pub fn matmul_device_scalars<T: BlasScalar>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        scales: &impl DeviceMemory<T::Scale>,
        a: &impl DeviceMemory<T>,
        b: &impl DeviceMemory<T>,
        c: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let call = GemmCall::new::<T, T, _, _, _>(shape, None, (a, b, &*c));
        self.gemm_call(blas, call.device_scalars::<T, _>(scales))
    }

    /// Checks, claims and enqueues a described product. C is claimed as written: the
    /// public callers hold it by `&mut`, or ([`Enqueue`](super::Enqueue)) by `&` of
    /// device-only memory, which nothing reads or writes except through its tracker.
    ///
    /// `#[inline]`: the public methods are generic, built in the caller's crate, and may
    /// inline this one body too (the GEMM path is measured against raw cuBLAS).
    #[inline]
    pub(crate) fn gemm_call(&self, blas: &Blas, call: GemmCall<'_, '_>) -> Result<()> {
        let bound = self.bound();
        let plan = call.check(bound.device(), blas)?;
        if plan.empty {
            return Ok(());
        }
        // cuBLAS launches through the runtime, which uses the current context.
        bound.ensure_current()?;
        let shared = Arc::clone(&blas.shared);
        let [a, b, c] = matrix_claims(&call.matrices);
        let _claim = self.claim([
            a,
            b,
            c,
            Some((crate::graph::Owned::tracker(&*shared), Access::Write)),
            call.scales.map(|s| (s.tracker, Access::Read)),
        ])?;
        // SAFETY: the handle's context is current (checked above) and the stream is one
        // of its streams; the buffers were checked against the plan (the scales: two
        // elements of the scale type) and, with the workspace, are claimed for this
        // stream until after the enqueue (their later uses and frees wait for it).
        unsafe { call.enqueue(blas, &plan, self.raw()) }
    }
}
