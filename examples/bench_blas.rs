//! Throughput of gpubind's products against cuBLAS / cuBLASLt called raw (through
//! cudarc's sys bindings, on the same stream, buffers and workspace size, in the same
//! run): a 4096³ bf16 GEMM (cuBLAS and cuBLASLt), f16, f32 with TF32, f32, strided
//! batches shaped like attention, and a cuBLASLt GELU+bias epilogue.
//!
//! Each row: warm-up, then `--reps` timed runs (CUDA events around a loop of products
//! sized to take about 20 ms), alternating gpubind and raw; the median run gives the
//! TFLOP/s. Prints a markdown table with the ratio gpubind / raw, then a second table for
//! GEMV (memory-bound: GB/s of the matrix and vectors moved, f32 and f64, 8192×8192,
//! either transpose).
//!
//! Run: `cargo run --release --example bench_blas [-- --reps 9]` (needs a GPU).

use cudarc::cublas::sys as cb;
use cudarc::cublaslt::sys as lt;
use gpubind::blas::{Batch, Blas, BlasFloat, Epilogue, Gemv, LtArgs, Matmul};
use gpubind::{BoundDevice, BoundStream, Device, DeviceMemory, DeviceSlice, ThreadContext};
use half::{bf16, f16};
use std::ffi::c_void;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn ok(status: cb::cublasStatus_t, call: &str) -> Res<()> {
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {status:?}").into())
    }
}

fn ok_lt(status: lt::cublasStatus_t, call: &str) -> Res<()> {
    if status == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {status:?}").into())
    }
}

/// A product to time, enqueued `iters` times on the stream.
type Enqueue<'a> = Box<dyn FnMut(usize) -> Res<()> + 'a>;

/// Milliseconds per product: median over `reps` runs of `iters` products each.
fn time(s: &BoundStream<'_>, f: &mut Enqueue<'_>, iters: usize, reps: usize) -> Res<Vec<f64>> {
    let gpu = s.bound();
    let (start, end) = (gpu.new_event(true)?, gpu.new_event(true)?);
    let mut runs = Vec::with_capacity(reps);
    for _ in 0..reps {
        s.record(&start)?;
        f(iters)?;
        s.record(&end)?;
        end.synchronize()?;
        runs.push(start.elapsed_ms(&end)? as f64 / iters as f64);
    }
    Ok(runs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One row: gpubind and raw alternately, `reps` runs each, after a warm-up that also
/// sizes the loop to about 20 ms.
fn row(
    s: &BoundStream<'_>,
    flops: f64,
    reps: usize,
    mut ours: Enqueue<'_>,
    mut raw: Enqueue<'_>,
) -> Res<(f64, f64)> {
    ours(3)?;
    raw(3)?;
    let probe = median(time(s, &mut ours, 3, 3)?);
    let iters = ((20.0 / probe.max(1e-3)).ceil() as usize).clamp(3, 500);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        a.extend(time(s, &mut ours, iters, 1)?);
        b.extend(time(s, &mut raw, iters, 1)?);
    }
    let tflops = |ms: f64| flops / (ms * 1e-3) / 1e12;
    Ok((tflops(median(a)), tflops(median(b))))
}

/// Raw cuBLAS and cuBLASLt handles on the bench stream, with their own workspace of the
/// size gpubind's Blas uses.
struct Raw {
    handle: cb::cublasHandle_t,
    lt: lt::cublasLtHandle_t,
    ws: DeviceSlice<u8>,
}

impl Raw {
    fn new(gpu: &BoundDevice<'_>, s: &BoundStream<'_>) -> Res<Raw> {
        let cc = gpu.device().compute_capability()?;
        let bytes = if cc.0 >= 9 { 32 << 20 } else { 4 << 20 };
        let ws = gpu.alloc_zeros::<u8>(bytes)?;
        let mut handle = std::ptr::null_mut();
        let mut lth = std::ptr::null_mut();
        // SAFETY: the bound context is current; the stream is one of its streams; the
        // workspace is a live allocation of it that outlives the handles (freed after
        // them, by `Drop` order in main).
        unsafe {
            ok(cb::cublasCreate_v2(&mut handle), "cublasCreate_v2")?;
            ok(
                cb::cublasSetStream_v2(handle, s.raw().cast()),
                "cublasSetStream_v2",
            )?;
            let p = ws.device_ptr() as *mut c_void;
            ok(
                cb::cublasSetWorkspace_v2(handle, p, ws.len()),
                "cublasSetWorkspace_v2",
            )?;
            ok_lt(lt::cublasLtCreate(&mut lth), "cublasLtCreate")?;
        }
        Ok(Raw {
            handle,
            lt: lth,
            ws,
        })
    }
}

/// A raw cuBLASLt row-major product `C[m×n] = A[m×k]·B[k×n]` (column-major `Cᵀ = Bᵀ·Aᵀ`)
/// with `epilogue` and an optional bias, its descriptors and heuristic algorithm.
struct RawLt {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: [lt::cublasLtMatrixLayout_t; 3],
    algo: lt::cublasLtMatmulAlgo_t,
}

impl RawLt {
    fn new(
        raw: &Raw,
        ty: lt::cudaDataType_t,
        (m, n, k): (usize, usize, usize),
        epilogue: lt::cublasLtEpilogue_t,
        bias: u64,
    ) -> Res<RawLt> {
        use lt::cublasLtMatmulDescAttributes_t as D;
        use lt::cublasLtMatmulPreferenceAttributes_t as P;
        let mut desc = std::ptr::null_mut();
        let mut layouts = [std::ptr::null_mut(); 3];
        let mut pref = std::ptr::null_mut();
        let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let mut found = 0;
        let compute = lt::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let scale = lt::cudaDataType_t::CUDA_R_32F;
        // SAFETY: cuBLASLt's documented calls on objects created here; every attribute
        // value has the attribute's C type and size; the result array holds one entry.
        unsafe {
            ok_lt(
                lt::cublasLtMatmulDescCreate(&mut desc, compute, scale),
                "DescCreate",
            )?;
            let set = |attr: D, p: *const c_void, size: usize| {
                ok_lt(
                    lt::cublasLtMatmulDescSetAttribute(desc, attr, p, size),
                    "DescSet",
                )
            };
            let e = epilogue as u32;
            set(
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&e as *const u32).cast(),
                4,
            )?;
            if bias != 0 {
                let b = bias as *const c_void;
                set(
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&b as *const *const c_void).cast(),
                    8,
                )?;
            }
            for (l, (r, c)) in layouts.iter_mut().zip([(n, k), (k, m), (n, m)]) {
                ok_lt(
                    lt::cublasLtMatrixLayoutCreate(l, ty, r as u64, c as u64, r as i64),
                    "Layout",
                )?;
            }
            ok_lt(lt::cublasLtMatmulPreferenceCreate(&mut pref), "PrefCreate")?;
            let bytes = raw.ws.len() as u64;
            let attr = P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;
            let p = (&bytes as *const u64).cast();
            ok_lt(
                lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, p, 8),
                "PrefSet",
            )?;
            let [a, b, c] = layouts;
            ok_lt(
                lt::cublasLtMatmulAlgoGetHeuristic(
                    raw.lt,
                    desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    1,
                    &mut result,
                    &mut found,
                ),
                "GetHeuristic",
            )?;
            lt::cublasLtMatmulPreferenceDestroy(pref);
        }
        if found < 1 {
            return Err("raw cuBLASLt: no algorithm".into());
        }
        Ok(RawLt {
            desc,
            layouts,
            algo: result.algo,
        })
    }

    /// Enqueues the product: `B` is cuBLAS's first operand (row-major swap).
    fn enqueue(&self, raw: &Raw, s: &BoundStream<'_>, (a, b, c): (u64, u64, u64)) -> Res<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, lc] = self.layouts;
        // SAFETY: live handle, descriptors and buffers of the sizes the layouts describe;
        // the stream is the bench stream of the handle's context.
        let status = unsafe {
            lt::cublasLtMatmul(
                raw.lt,
                self.desc,
                (&alpha as *const f32).cast(),
                b as *const c_void,
                la,
                a as *const c_void,
                lb,
                (&beta as *const f32).cast(),
                c as *const c_void,
                lc,
                c as *mut c_void,
                lc,
                &self.algo,
                raw.ws.device_ptr() as *mut c_void,
                raw.ws.len(),
                s.raw().cast(),
            )
        };
        ok_lt(status, "cublasLtMatmul")
    }
}

/// A raw `cublasGemmStridedBatchedEx` / `cublasGemmEx` (batch 1) row-major product
/// (swapped operands), f32 accumulation unless `compute` says otherwise.
#[allow(clippy::too_many_arguments)]
fn raw_gemm(
    raw: &Raw,
    ty: cb::cudaDataType,
    compute: cb::cublasComputeType_t,
    s: &Matmul,
    batch: Option<&Batch>,
    (a, b, c): (u64, u64, u64),
) -> Res<()> {
    use cb::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
    let (m, n, k) = (s.m as i32, s.n as i32, s.k as i32);
    let lda = if s.transpose_a { m } else { k };
    let ldb = if s.transpose_b { k } else { n };
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (al, be) = ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
    let algo = cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
    let (ta, tb) = (op(s.transpose_b), op(s.transpose_a));
    let (pa, pb, pc) = (b as *const c_void, a as *const c_void, c as *mut c_void);
    // SAFETY: live buffers of the sizes the dimensions describe, on the handle's stream;
    // alpha and beta are f32 host scalars (f32 compute) alive for the call.
    let status = unsafe {
        match batch {
            None => cb::cublasGemmEx(
                raw.handle, ta, tb, n, m, k, al, pa, ty, ldb, pb, ty, lda, be, pc, ty, n, compute,
                algo,
            ),
            Some(bt) => cb::cublasGemmStridedBatchedEx(
                raw.handle,
                ta,
                tb,
                n,
                m,
                k,
                al,
                pa,
                ty,
                ldb,
                bt.stride_b as i64,
                pb,
                ty,
                lda,
                bt.stride_a as i64,
                be,
                pc,
                ty,
                n,
                bt.stride_c as i64,
                bt.count as i32,
                compute,
                algo,
            ),
        }
    };
    ok(status, "cublasGemmEx")
}

/// Rows of the table: (product, shape, gpubind TFLOP/s, raw TFLOP/s, raw call).
type Rows = Vec<(String, String, f64, f64, &'static str)>;

/// The 4096³ GEMM rows of element type `T`.
fn gemm_rows<T: gpubind::blas::BlasScalar + gpubind::DeviceRepr>(
    env: (&BoundDevice<'_>, &BoundStream<'_>, &Blas, &Raw),
    name: &str,
    (ty, compute, tf32): (cb::cudaDataType, cb::cublasComputeType_t, bool),
    reps: usize,
    rows: &mut Rows,
) -> Res<()> {
    let (gpu, s, blas, raw) = env;
    let n = 4096usize;
    let (a, b) = (gpu.alloc_zeros::<T>(n * n)?, gpu.alloc_zeros::<T>(n * n)?);
    let mut c = gpu.alloc_zeros::<T>(n * n)?;
    let mut shape = Matmul::new(n, n, n);
    shape.tf32 = tf32;
    let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
    let flops = 2.0 * (n as f64).powi(3);
    let (g, r) = row(
        s,
        flops,
        reps,
        Box::new(|it| {
            for _ in 0..it {
                s.matmul(blas, &shape, &a, &b, &mut c)?;
            }
            Ok(())
        }),
        Box::new(|it| {
            for _ in 0..it {
                raw_gemm(raw, ty, compute, &shape, None, ptrs)?;
            }
            Ok(())
        }),
    )?;
    rows.push((
        format!("GEMM {name}"),
        "4096×4096×4096".into(),
        g,
        r,
        "cublasGemmEx",
    ));
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(7usize);
    let mut ctx = ThreadContext::acquire()?;
    let dev = Device::get(0)?;
    let gpu = ctx.bind(&dev)?;
    let stream = gpu.new_stream()?;
    let s = gpu.on(&stream)?;
    let blas = gpu.new_blas()?;
    let raw = Raw::new(&gpu, &s)?;
    let mut rows: Rows = Vec::new();
    use cb::cublasComputeType_t as C;
    use cb::cudaDataType_t as D;
    let f32c = C::CUBLAS_COMPUTE_32F;
    gemm_rows::<bf16>(
        (&gpu, &s, &blas, &raw),
        "bf16",
        (D::CUDA_R_16BF, f32c, false),
        reps,
        &mut rows,
    )?;
    gemm_rows::<f16>(
        (&gpu, &s, &blas, &raw),
        "f16",
        (D::CUDA_R_16F, f32c, false),
        reps,
        &mut rows,
    )?;
    let tf32 = (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32, true);
    gemm_rows::<f32>((&gpu, &s, &blas, &raw), "f32 TF32", tf32, reps, &mut rows)?;
    gemm_rows::<f32>(
        (&gpu, &s, &blas, &raw),
        "f32",
        (D::CUDA_R_32F, f32c, false),
        reps,
        &mut rows,
    )?;
    lt_rows(&gpu, &s, &blas, &raw, reps, &mut rows)?;
    batched_rows(&gpu, &s, &blas, &raw, reps, &mut rows)?;
    println!("| product | shape | gpubind TFLOP/s | raw TFLOP/s | gpubind / raw | raw call |");
    println!("|---|---|---:|---:|---:|---|");
    for (what, shape, g, r, call) in &rows {
        println!(
            "| {what} | {shape} | {g:.1} | {r:.1} | {:.3} | {call} |",
            g / r
        );
    }
    let gemv = gemv_rows(&gpu, &s, &blas, &raw, reps)?;
    println!("\n| GEMV | shape | gpubind GB/s | raw GB/s | gpubind / raw | raw call |");
    println!("|---|---|---:|---:|---:|---|");
    for (what, shape, g, r, call) in &gemv {
        println!(
            "| {what} | {shape} | {g:.0} | {r:.0} | {:.3} | {call} |",
            g / r
        );
    }
    println!(
        "\n{} on {}; median of {reps} runs (CUDA events, ~20 ms of products each, gpubind and raw alternating); raw: cudarc's sys bindings on the same stream, workspace size and buffers.",
        gpubind::blas::cublaslt_info()
            .map(|i| format!("cuBLASLt {}.{} ({})", i.version.0, i.version.1, i.name))
            .unwrap_or_default(),
        dev.name()
    );
    s.synchronize()?;
    // SAFETY: no product is pending after the synchronize; destroyed once.
    unsafe {
        cb::cublasDestroy_v2(raw.handle);
        lt::cublasLtDestroy(raw.lt);
    }
    Ok(())
}

/// cuBLASLt rows: bf16 4096³ without epilogue, and with GELU+bias.
fn lt_rows(
    gpu: &BoundDevice<'_>,
    s: &BoundStream<'_>,
    blas: &Blas,
    raw: &Raw,
    reps: usize,
    rows: &mut Rows,
) -> Res<()> {
    let n = 4096usize;
    let (a, b) = (
        gpu.alloc_zeros::<bf16>(n * n)?,
        gpu.alloc_zeros::<bf16>(n * n)?,
    );
    let bias = gpu.alloc_zeros::<bf16>(n)?;
    let mut c = gpu.alloc_zeros::<bf16>(n * n)?;
    let shape = Matmul::new(n, n, n);
    let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
    let flops = 2.0 * (n as f64).powi(3);
    use lt::cublasLtEpilogue_t as E;
    for (e, raw_e, name) in [
        (Epilogue::Default, E::CUBLASLT_EPILOGUE_DEFAULT, "Lt bf16"),
        (
            Epilogue::GeluBias,
            E::CUBLASLT_EPILOGUE_GELU_BIAS,
            "Lt bf16 GELU+bias",
        ),
    ] {
        let with_bias = e == Epilogue::GeluBias;
        let plan = RawLt::new(
            raw,
            lt::cudaDataType_t::CUDA_R_16BF,
            (n, n, n),
            raw_e,
            if with_bias { bias.device_ptr() } else { 0 },
        )?;
        let (g, r) = row(
            s,
            flops,
            reps,
            Box::new(|it| {
                for _ in 0..it {
                    let args = if with_bias {
                        LtArgs::new().bias(&bias)
                    } else {
                        LtArgs::new()
                    };
                    s.matmul_lt(blas, &shape, e, &a, &b, &mut c, args)?;
                }
                Ok(())
            }),
            Box::new(|it| {
                for _ in 0..it {
                    plan.enqueue(raw, s, ptrs)?;
                }
                Ok(())
            }),
        )?;
        rows.push((name.into(), "4096×4096×4096".into(), g, r, "cublasLtMatmul"));
    }
    Ok(())
}

/// Strided-batch rows shaped like attention (96 = 12 heads × batch 8): scores `Q·Kᵀ`
/// (1024×1024×64) and `P·V` (1024×64×1024), bf16.
fn batched_rows(
    gpu: &BoundDevice<'_>,
    s: &BoundStream<'_>,
    blas: &Blas,
    raw: &Raw,
    reps: usize,
    rows: &mut Rows,
) -> Res<()> {
    let count = 96usize;
    for (shape, name) in [
        (
            Matmul::new(1024, 1024, 64).transpose_b(),
            "batched bf16 Q·Kᵀ",
        ),
        (Matmul::new(1024, 64, 1024), "batched bf16 P·V"),
    ] {
        let batch = Batch::packed(count, &shape);
        let a = gpu.alloc_zeros::<bf16>(count * batch.stride_a)?;
        let b = gpu.alloc_zeros::<bf16>(count * batch.stride_b)?;
        let mut c = gpu.alloc_zeros::<bf16>(count * batch.stride_c)?;
        let ptrs = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let flops = 2.0 * (shape.m * shape.n * shape.k * count) as f64;
        let ty = cb::cudaDataType_t::CUDA_R_16BF;
        let compute = cb::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let (g, r) = row(
            s,
            flops,
            reps,
            Box::new(|it| {
                for _ in 0..it {
                    s.matmul_batched(blas, &shape, &batch, &a, &b, &mut c)?;
                }
                Ok(())
            }),
            Box::new(|it| {
                for _ in 0..it {
                    raw_gemm(raw, ty, compute, &shape, Some(&batch), ptrs)?;
                }
                Ok(())
            }),
        )?;
        let dims = format!("{count} × {}×{}×{}", shape.m, shape.n, shape.k);
        rows.push((name.into(), dims, g, r, "cublasGemmStridedBatchedEx"));
    }
    Ok(())
}

/// cudarc's `cublasSgemv_v2` / `cublasDgemv_v2`.
type RawGemv<T> = unsafe fn(
    cb::cublasHandle_t,
    cb::cublasOperation_t,
    i32,
    i32,
    *const T,
    *const T,
    i32,
    *const T,
    i32,
    *const T,
    *mut T,
    i32,
) -> cb::cublasStatus_t;

/// GEMV rows (memory-bound): `y = A·x` and `y = Aᵀ·x` with A 8192×8192 row-major, f32
/// and f64; GB/s of A, x and y moved once (beta 0: y is only written).
fn gemv_rows(
    gpu: &BoundDevice<'_>,
    s: &BoundStream<'_>,
    blas: &Blas,
    raw: &Raw,
    reps: usize,
) -> Res<Rows> {
    let mut rows = Rows::new();
    let f = cb::cublasSgemv_v2 as RawGemv<f32>;
    gemv_type::<f32>(
        (gpu, s, blas, raw),
        "f32",
        (f, "cublasSgemv_v2"),
        reps,
        &mut rows,
    )?;
    let d = cb::cublasDgemv_v2 as RawGemv<f64>;
    gemv_type::<f64>(
        (gpu, s, blas, raw),
        "f64",
        (d, "cublasDgemv_v2"),
        reps,
        &mut rows,
    )?;
    Ok(rows)
}

fn gemv_type<T: BlasFloat + From<f32>>(
    env: (&BoundDevice<'_>, &BoundStream<'_>, &Blas, &Raw),
    name: &str,
    (raw_gemv, call): (RawGemv<T>, &'static str),
    reps: usize,
    rows: &mut Rows,
) -> Res<()> {
    let (gpu, s, blas, raw) = env;
    let n = 8192usize;
    let a = gpu.alloc_zeros::<T>(n * n)?;
    let x = gpu.alloc_zeros::<T>(n)?;
    let mut y = gpu.alloc_zeros::<T>(n)?;
    let (pa, px, py) = (a.device_ptr(), x.device_ptr(), y.device_ptr());
    let bytes = ((n * n + 2 * n) * std::mem::size_of::<T>()) as f64;
    let (one, zero) = (T::from(1.0), T::from(0.0));
    for transpose in [false, true] {
        let shape = if transpose {
            Gemv::new(n, n).transpose()
        } else {
            Gemv::new(n, n)
        };
        // Row-major A is column-major Aᵀ: cuBLAS gets the other transpose.
        let op = if transpose {
            cb::cublasOperation_t::CUBLAS_OP_N
        } else {
            cb::cublasOperation_t::CUBLAS_OP_T
        };
        let (g, r) = row(
            s,
            bytes,
            reps,
            Box::new(|it| {
                for _ in 0..it {
                    s.gemv(blas, &shape, &a, &x, &mut y)?;
                }
                Ok(())
            }),
            Box::new(|it| {
                for _ in 0..it {
                    let ni = n as i32;
                    // SAFETY: the raw handle is on the bench stream; A holds n×n
                    // elements, x and y n each, all live; host scalars alive for the
                    // call (the handle's default host pointer mode).
                    let status = unsafe {
                        raw_gemv(
                            raw.handle,
                            op,
                            ni,
                            ni,
                            &one,
                            pa as *const T,
                            ni,
                            px as *const T,
                            1,
                            &zero,
                            py as *mut T,
                            1,
                        )
                    };
                    ok(status, call)?;
                }
                Ok(())
            }),
        )?;
        // `row` reports units of 1e12 per second: TB/s here.
        let what = format!("GEMV {name}{}", if transpose { " Aᵀ·x" } else { " A·x" });
        rows.push((what, format!("{n}×{n}"), g * 1e3, r * 1e3, call));
    }
    Ok(())
}
