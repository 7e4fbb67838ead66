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
//!
//! Each handle owns a workspace (device memory, 32 MiB on Hopper and later, 4 MiB
//! before, as NVIDIA recommends) that it gives cuBLAS before every product
//! (`cublasSetWorkspace_v2`), so cuBLAS never allocates its own. Every product claims the
//! workspace as written: products of one handle on different streams run one after the
//! other (use a handle per stream for concurrency). Products can also be captured into a
//! CUDA graph ([`Capture::matmul`]); the graph then keeps the workspace alive, not the
//! handle.

use crate::access::{Access, AccessTracker};
use crate::context::BoundDevice;
use crate::copy::DeviceOnlyMemory;
use crate::device::Device;
use crate::driver::libraries::{self as libs, CublasHandle};
use crate::error::{Error, Result};
use crate::graph::{Capture, Owned};
use crate::memory::{ByteSpan, DeviceMemory, DeviceMemoryMut, DeviceSlice, Tracked, expect_len};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::sync::Arc;

/// A cuBLAS handle of one device.
///
/// `Send` (it may move to another thread with its device) but not `Sync`: cuBLAS handles
/// must not be used by two threads at once, and every product takes `&mut Blas`.
pub struct Blas {
    device: Arc<Device>,
    handle: CublasHandle,
    /// The handle's workspace (`cublasSetWorkspace_v2`), set before every product: cuBLAS
    /// then never allocates one of its own, which a graph capture cannot have. Shared
    /// with the graphs whose products use it.
    workspace: Arc<Workspace>,
}

/// A cuBLAS workspace: device memory the products of one [`Blas`] (eager and captured)
/// use as scratch. Every product claims it as written, so products of one handle on
/// different streams, and launches of graphs that captured them, are ordered around it.
struct Workspace {
    buf: DeviceSlice<u8>,
}

impl Owned for Workspace {
    fn tracker(&self) -> &AccessTracker {
        Tracked::tracker(&self.buf)
    }
}

/// The workspace size NVIDIA recommends for cuBLAS (`cublasSetWorkspace`): 32 MiB on
/// Hopper (compute capability 9.x) and later, 4 MiB before.
fn workspace_bytes(compute_capability: (u32, u32)) -> usize {
    if compute_capability.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    }
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
        // release thread, bounded by GPUBIND_DROP_TIMEOUT (crate::teardown::release).
        crate::teardown::release::release(
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
    /// fitting the driver can be loaded (which one: [`cublas_info`](crate::cublas_info)).
    pub fn new_blas(&self) -> Result<Blas> {
        self.ensure_current()?;
        let api = libs::cublas()?;
        let bytes = workspace_bytes(self.device().compute_capability()?);
        // SAFETY: scratch that cuBLAS writes before it reads; never read by gpubind.
        let buf = unsafe { self.alloc::<u8>(bytes)? };
        let mut handle: CublasHandle = std::ptr::null_mut();
        // SAFETY: the bound context is current; writes one handle.
        check(unsafe { (api.create)(&mut handle) }, "cublasCreate_v2")?;
        Ok(Blas {
            device: Arc::clone(self.device()),
            handle,
            workspace: Arc::new(Workspace { buf }),
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

/// A checked product: buffer lengths match the shape; `None` when C is empty.
struct Gemm {
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
}

impl Gemm {
    /// Checks the devices (against `device`) and the buffer lengths against `shape`.
    fn check<A, B, C>(
        device: &Device,
        blas: &Blas,
        shape: &Matmul,
        a: &A,
        b: &B,
        c: &C,
    ) -> Result<Option<Gemm>>
    where
        A: DeviceMemory<f32> + ?Sized,
        B: DeviceMemory<f32> + ?Sized,
        C: DeviceMemory<f32> + ?Sized,
    {
        device.expect_same("cuBLAS handle", blas.device())?;
        device.expect_same("matrix A", a.device())?;
        device.expect_same("matrix B", b.device())?;
        device.expect_same("matrix C", c.device())?;
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
            return Ok(None);
        }
        let lda = if shape.transpose_a { m } else { k };
        let ldb = if shape.transpose_b { k } else { n };
        Ok(Some(Gemm {
            m: dim(m)?,
            n: dim(n)?,
            k: dim(k)?,
            lda: dim(lda.max(1))?,
            ldb: dim(ldb.max(1))?,
        }))
    }

    /// Points `blas` at `stream` and its workspace, and enqueues the product there.
    ///
    /// # Safety
    ///
    /// `blas`'s context is current and `stream` is one of its streams (or null). The
    /// addresses are live allocations of that context with the lengths `check` accepted,
    /// and they and the workspace stay alive and unused by other streams until the
    /// product has run (the caller's claim or the graph's).
    unsafe fn enqueue(
        &self,
        blas: &mut Blas,
        shape: &Matmul,
        stream: sys::CUstream,
        (a, b, c): (u64, u64, u64),
    ) -> Result<()> {
        // The library is loaded: `blas` was created through it.
        let api = libs::cublas()?;
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| std::ffi::c_int::from(t);
        // SAFETY: the handle belongs to the current context (the caller's contract); the
        // stream is a stream of that context (or null for the default stream).
        check(
            unsafe { (api.set_stream)(blas.handle, stream.cast()) },
            "cublasSetStream_v2",
        )?;
        // cublasSetStream resets the handle to cuBLAS's own workspace pool: set ours
        // after it, for this stream.
        let ws = &blas.workspace.buf;
        // SAFETY: a live allocation of the handle's context, 256-byte aligned (cuMemAlloc),
        // of the size given; kept alive by the Blas (and by every graph that captured a
        // product with it) and ordered by the claims on its tracker.
        check(
            unsafe { (api.set_workspace)(blas.handle, ws.device_ptr() as _, ws.len()) },
            "cublasSetWorkspace_v2",
        )?;
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
        // SAFETY: the caller's contract: live buffers with exactly the element counts the
        // dimensions imply, ordered and kept alive; alpha and beta are host scalars alive
        // for the call (default pointer mode), read during it.
        check(
            unsafe {
                (api.sgemm)(
                    blas.handle,
                    op(shape.transpose_b),
                    op(shape.transpose_a),
                    self.n,
                    self.m,
                    self.k,
                    &shape.alpha,
                    b as *const f32,
                    self.ldb,
                    a as *const f32,
                    self.lda,
                    &shape.beta,
                    c as *mut f32,
                    self.n,
                )
            },
            "cublasSgemm_v2",
        )
    }
}

impl<'b> BoundStream<'b> {
    /// Enqueues a row-major f32 matrix product (cuBLAS SGEMM). Buffer lengths must be
    /// exactly `m·k`, `k·n` and `m·n`; everything must live on the bound device.
    ///
    /// The product uses the handle's workspace, which every product of the handle claims
    /// as written: products of one [`Blas`] on different streams run one after another
    /// (use one handle per stream for concurrent products).
    pub fn matmul(
        &self,
        blas: &mut Blas,
        shape: &Matmul,
        a: &impl DeviceMemory<f32>,
        b: &impl DeviceMemory<f32>,
        c: &mut impl DeviceMemoryMut<f32>,
    ) -> Result<()> {
        let bound = self.bound();
        let Some(gemm) = Gemm::check(bound.device(), blas, shape, a, b, c)? else {
            return Ok(());
        };
        // Only memory that shares a tracker can alias `c` here (a module global and its
        // clone): everything else is kept apart by the `&mut` borrow of `c`.
        refuse_c_overlap(a, b, &*c)?;
        // cuBLAS launches through the runtime, which uses the current context.
        bound.ensure_current()?;
        let workspace = Arc::clone(&blas.workspace);
        let _claim = self.claim([
            Some((a.tracker(), Access::Read)),
            Some((b.tracker(), Access::Read)),
            Some((c.tracker(), Access::Write)),
            Some((workspace.tracker(), Access::Write)),
        ])?;
        let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        // SAFETY: the handle's context is current (checked above) and the stream is one
        // of its streams; the buffers were checked against the shape and, with the
        // workspace, are claimed for this stream until after the enqueue (their later
        // uses and frees wait for it).
        unsafe { gemm.enqueue(blas, shape, self.raw(), ptrs) }
    }
}

/// [`Error::InvalidArgument`] when C overlaps A or B (one allocation, overlapping bytes):
/// the product would read what it writes.
fn refuse_c_overlap<A, B, C>(a: &A, b: &B, c: &C) -> Result<()>
where
    A: DeviceMemory<f32> + ?Sized,
    B: DeviceMemory<f32> + ?Sized,
    C: DeviceMemory<f32> + ?Sized,
{
    let c = ByteSpan::of(c);
    if ByteSpan::of(a).overlaps(&c) || ByteSpan::of(b).overlaps(&c) {
        return Err(Error::InvalidArgument(
            "matmul: C overlaps A or B (the product would read what it writes)".into(),
        ));
    }
    Ok(())
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Captures a row-major f32 matrix product (cuBLAS SGEMM) into the graph: the same
    /// shapes and checks as [`BoundStream::matmul`]. `a` and `b` are read, `c` written
    /// at each launch of the graph; all three are borrowed for the graph's lifetime, and
    /// `c` must not overlap `a` or `b` ([`Error::InvalidArgument`]).
    ///
    /// cuBLAS handles are not part of a graph — only the kernels the product enqueues
    /// are — so `blas` is free again when this returns, and may be dropped before the
    /// graph. The handle's workspace, which those kernels use at every launch, is not:
    /// the graph keeps it alive and claims it as written at each launch, ordered against
    /// the handle's other products and other graphs that use it.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::Matmul, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let mut blas = gpu.new_blas()?;
    /// let a = gpu.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
    /// let b = gpu.clone_htod(&[1.0f32, 0.0, 0.0, 1.0])?;
    /// let c = gpu.alloc_zeros::<f32>(4)?;
    /// let graph = gpu.capture(|cap| cap.matmul(&mut blas, &Matmul::new(2, 2, 2), &a, &b, &c))?;
    /// drop(blas); // the graph keeps the workspace
    /// let exec = graph.instantiate()?;
    /// exec.launch(&gpu.default_stream())?;
    /// assert_eq!(gpu.dtoh(&c)?, [1.0, 2.0, 3.0, 4.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// The matrices stay borrowed while the graph lives:
    ///
    /// ```compile_fail,E0505
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, blas: &mut gpubind::blas::Blas) -> gpubind::Result<()> {
    /// use gpubind::blas::Matmul;
    /// let (a, b, c) = (gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?, gpu.alloc_zeros::<f32>(4)?);
    /// let graph = gpu.capture(|cap| cap.matmul(blas, &Matmul::new(2, 2, 2), &a, &b, &c))?;
    /// drop(c); // error[E0505]: cannot move out of `c` because it is borrowed
    /// let _ = graph.instantiate()?;
    /// # Ok(()) }
    /// ```
    pub fn matmul<A, B, C>(
        &mut self,
        blas: &mut Blas,
        shape: &Matmul,
        a: &'buf A,
        b: &'buf B,
        c: &'buf C,
    ) -> Result<()>
    where
        A: DeviceMemory<f32> + ?Sized,
        B: DeviceMemory<f32> + ?Sized,
        C: DeviceMemory<f32> + DeviceOnlyMemory + ?Sized,
    {
        let device = self.device();
        let Some(gemm) = Gemm::check(device, blas, shape, a, b, c)? else {
            return Ok(());
        };
        refuse_c_overlap(a, b, c)?;
        self.record_memory(a, Access::Read)?;
        self.record_memory(b, Access::Read)?;
        self.record_memory(c, Access::Write)?;
        self.record_owned(Arc::clone(&blas.workspace) as Arc<dyn Owned>, Access::Write);
        let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let stream = self.stream_handle();
        // Products of one handle on two branches of a fork would share the workspace
        // within a launch: the second is ordered after the first.
        let workspace = Arc::clone(&blas.workspace);
        // Code outside gpubind may have changed the thread's context since the capture
        // began (cudarc can, from safe code): make the capture's device current for the
        // cuBLAS calls (nothing is pushed when it already is).
        let _current = self.device().enter()?;
        let out = self.marked(|| {
            self.exclusive_use(workspace.tracker(), || {
                // SAFETY: the capture device's context is current (entered just above)
                // and the stream is its capturing stream: cuBLAS's kernels are recorded,
                // not run. The buffers were checked against the shape; the graph borrows
                // them for 'buf, holds the workspace, and claims all of them at each
                // launch; within the graph, the workspace's uses are ordered
                // (`exclusive_use`), and so are the buffers' (`record_span`, `marked`).
                unsafe { gemm.enqueue(blas, shape, stream, ptrs) }
            })
        });
        // Leave the handle on no stream of the capture (the stream is destroyed when the
        // capture ends); this also drops the workspace setting. Every product sets both.
        let api = libs::cublas()?;
        // SAFETY: the handle's context is current; the null stream is always valid.
        let reset = check(
            unsafe { (api.set_stream)(blas.handle, std::ptr::null_mut()) },
            "cublasSetStream_v2",
        );
        out.and(reset)
    }
}
