//! GPU tests of `gpubind::blas`: every element type × transposes × layout (packed and
//! with leading dimensions) against an f64 host reference, strided batches, each
//! cuBLASLt epilogue (forward and backward) against host math, an addend in place of C,
//! captured products equal
//! to eager ones with the `Blas` dropped before the launch, and the typed errors.
//! Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_blas` (on a GPU machine, or the built binary).

#[macro_use]
mod common;

use common::{Ctx, on_device0, run_suite, skip};
use gpubind::blas::{
    Batch, BlasScalar, CaptureLtArgs, Enqueue, Epilogue, GemmGroup, Gemv, Layout, LtArgs, Matmul,
    MatmulError, MatmulOutput,
};
use gpubind::{BoundDevice, DeviceRepr, Error};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

type R = Result<(), String>;

/// An element type with its conversions and the relative tolerance of a product of it
/// (against the sum of the magnitudes of the terms).
trait El: BlasScalar + DeviceRepr + std::fmt::Debug + PartialEq {
    fn of(x: f64) -> Self;
    fn f(self) -> f64;
    const TOL: f64;
}

macro_rules! el {
    ($t:ty, $of:expr, $f:expr, $tol:expr) => {
        impl El for $t {
            fn of(x: f64) -> Self {
                $of(x)
            }
            fn f(self) -> f64 {
                $f(self)
            }
            const TOL: f64 = $tol;
        }
    };
}
el!(f32, |x| x as f32, |v: f32| v as f64, 1e-5);
el!(f64, |x| x, |v| v, 1e-13);
el!(f16, f16::from_f64, |v: f16| v.to_f64(), 2e-3);
el!(bf16, bf16::from_f64, |v: bf16| v.to_f64(), 1.6e-2);

/// Index of `(r, c)` in a matrix stored with leading dimension `ld`.
fn at(layout: Layout, ld: usize, r: usize, c: usize) -> usize {
    match layout {
        Layout::RowMajor => r * ld + c,
        Layout::ColMajor => r + c * ld,
    }
}

/// The stored `rows×cols` of A and B of `s` (a transposed operand is stored transposed).
fn stored(s: &Matmul) -> ((usize, usize), (usize, usize)) {
    let a = if s.transpose_a {
        (s.k, s.m)
    } else {
        (s.m, s.k)
    };
    let b = if s.transpose_b {
        (s.n, s.k)
    } else {
        (s.k, s.n)
    };
    (a, b)
}

/// Leading dimensions of A, B and C of `s` (the packed ones where unset).
fn lds(s: &Matmul) -> (usize, usize, usize) {
    let inner = |rows: usize, cols: usize| match s.layout {
        Layout::RowMajor => cols,
        Layout::ColMajor => rows,
    };
    let ((ar, ac), (br, bc)) = stored(s);
    (
        s.lda.unwrap_or(inner(ar, ac).max(1)),
        s.ldb.unwrap_or(inner(br, bc).max(1)),
        s.ldc.unwrap_or(inner(s.m, s.n).max(1)),
    )
}

/// Elements a buffer needs for a `rows×cols` matrix with leading dimension `ld`.
fn span(layout: Layout, ld: usize, rows: usize, cols: usize) -> usize {
    if rows == 0 || cols == 0 {
        return 0;
    }
    at(layout, ld, rows - 1, cols - 1) + 1
}

/// `P = alpha·op(A)·op(B)` at each `(i, j)` of C, with the sum of the terms' magnitudes.
fn host_product(s: &Matmul, a: &[f64], b: &[f64]) -> Vec<(f64, f64)> {
    let (lda, ldb, _) = lds(s);
    let mut out = Vec::with_capacity(s.m * s.n);
    for i in 0..s.m {
        for j in 0..s.n {
            let (mut sum, mut mag) = (0.0, 0.0);
            for p in 0..s.k {
                let x = if s.transpose_a {
                    a[at(s.layout, lda, p, i)]
                } else {
                    a[at(s.layout, lda, i, p)]
                };
                let y = if s.transpose_b {
                    b[at(s.layout, ldb, j, p)]
                } else {
                    b[at(s.layout, ldb, p, j)]
                };
                sum += x * y;
                mag += (x * y).abs();
            }
            out.push((s.alpha * sum, s.alpha.abs() * mag));
        }
    }
    out
}

/// `C = alpha·op(A)·op(B) + beta·C` on the host: the whole C buffer (elements outside
/// the matrix unchanged) and each element's error scale.
fn host_gemm(s: &Matmul, a: &[f64], b: &[f64], c: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (_, _, ldc) = lds(s);
    let (mut want, mut scale) = (c.to_vec(), vec![0.0; c.len()]);
    for (ij, (p, mag)) in host_product(s, a, b).into_iter().enumerate() {
        let at_c = at(s.layout, ldc, ij / s.n, ij % s.n);
        want[at_c] = p + s.beta * c[at_c];
        scale[at_c] = mag + (s.beta * c[at_c]).abs();
    }
    (want, scale)
}

/// Random values of `T` (and their exact f64 values).
fn random<T: El>(rng: &mut impl Rng, n: usize) -> (Vec<T>, Vec<f64>) {
    let v: Vec<T> = (0..n).map(|_| T::of(rng.random_range(-1.0..1.0))).collect();
    let f = v.iter().map(|&x| x.f()).collect();
    (v, f)
}

/// `Err` naming the first element of `got` farther from `want` than `tol·scale` (plus a
/// tiny absolute slack).
fn close(what: &str, got: &[f64], want: &[f64], scale: &[f64], tol: f64) -> R {
    ensure!(
        got.len() == want.len(),
        "{what}: {} elements, expected {}",
        got.len(),
        want.len()
    );
    for i in 0..got.len() {
        let bound = tol * scale[i].max(want[i].abs()) + 1e-30;
        ensure!(
            (got[i] - want[i]).abs() <= bound,
            "{what}: [{i}] = {} but the host says {} (tolerance {bound:e})",
            got[i],
            want[i]
        );
    }
    Ok(())
}

fn dtoh_f64<T: El>(gpu: &BoundDevice<'_>, x: &gpubind::DeviceSlice<T>) -> Result<Vec<f64>, String> {
    Ok(gpu.dtoh(x).ctx("dtoh")?.into_iter().map(El::f).collect())
}

/// Every transpose pair × layout × packed/padded leading dimensions, a few shapes, for
/// one element type (`tf32`: f32 with TF32 allowed).
fn gemm_sweep<T: El>(gpu: &BoundDevice<'_>, tf32: bool, rng: &mut impl Rng) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let stream = gpu.default_stream();
    let tol = if tf32 { 2e-3 } else { T::TOL };
    for (m, n, k) in [(1, 1, 1), (7, 5, 3), (33, 17, 29), (64, 48, 80)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for layout in [Layout::RowMajor, Layout::ColMajor] {
                for padded in [false, true] {
                    let mut s = Matmul::new(m, n, k).scaled(0.75, -0.5);
                    s.transpose_a = ta;
                    s.transpose_b = tb;
                    s.layout = layout;
                    s.tf32 = tf32;
                    if padded {
                        let (la, lb, lc) = lds(&s);
                        s = s.with_ld(la + 3, lb + 1, lc + 5);
                    }
                    let (lda, ldb, ldc) = lds(&s);
                    let (ar, ac) = if ta { (k, m) } else { (m, k) };
                    let (br, bc) = if tb { (n, k) } else { (k, n) };
                    // Padded buffers get a few elements past the span (allowed).
                    let extra = if padded { 2 } else { 0 };
                    let (a, af) = random::<T>(rng, span(layout, lda, ar, ac) + extra);
                    let (b, bf) = random::<T>(rng, span(layout, ldb, br, bc) + extra);
                    let (c0, cf) = random::<T>(rng, span(layout, ldc, m, n) + extra);
                    let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
                    let mut dc = gpu.clone_htod(&c0).ctx("c")?;
                    let what = format!(
                        "{:?} {m}x{n}x{k} ta={ta} tb={tb} {layout:?} padded={padded} tf32={tf32}",
                        T::DATA_TYPE
                    );
                    stream.matmul(&blas, &s, &da, &db, &mut dc).ctx(&what)?;
                    let got = dtoh_f64(gpu, &dc)?;
                    let (want, scale) = host_gemm(&s, &af, &bf, &cf);
                    close(&what, &got, &want, &scale, tol)?;
                }
            }
        }
    }
    Ok(())
}

fn gemm_types_transposes_and_layouts_match_the_host(gpu: &BoundDevice<'_>) -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    gemm_sweep::<f32>(gpu, false, &mut rng)?;
    gemm_sweep::<f32>(gpu, true, &mut rng)?;
    gemm_sweep::<f64>(gpu, false, &mut rng)?;
    gemm_sweep::<f16>(gpu, false, &mut rng)?;
    gemm_sweep::<bf16>(gpu, false, &mut rng)
}

/// One strided batch against per-matrix host products; gaps between the C matrices
/// stay untouched.
fn batch_case<T: El>(gpu: &BoundDevice<'_>, s: &Matmul, batch: &Batch, rng: &mut impl Rng) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let (lda, ldb, ldc) = lds(s);
    let ((ar, ac), (br, bc)) = stored(s);
    let len = |stride: usize, one: usize| (batch.count - 1) * stride + one;
    let (a, af) = random::<T>(rng, len(batch.stride_a, span(s.layout, lda, ar, ac)));
    let (b, bf) = random::<T>(rng, len(batch.stride_b, span(s.layout, ldb, br, bc)));
    let c_one = span(s.layout, ldc, s.m, s.n);
    let (c0, cf) = random::<T>(rng, len(batch.stride_c, c_one));
    let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
    let mut dc = gpu.clone_htod(&c0).ctx("c")?;
    let what = format!("{:?} {s:?} {batch:?}", T::DATA_TYPE);
    gpu.default_stream()
        .matmul_batched(&blas, s, batch, &da, &db, &mut dc)
        .ctx(&what)?;
    let got = dtoh_f64(gpu, &dc)?;
    let (mut want, mut scale) = (cf.clone(), vec![0.0; cf.len()]);
    for i in 0..batch.count {
        let (oa, ob, oc) = (i * batch.stride_a, i * batch.stride_b, i * batch.stride_c);
        let (w, sc) = host_gemm(s, &af[oa..], &bf[ob..], &cf[oc..oc + c_one]);
        want[oc..oc + c_one].copy_from_slice(&w);
        scale[oc..oc + c_one].copy_from_slice(&sc);
    }
    close(&what, &got, &want, &scale, T::TOL)
}

fn strided_batches_match_the_host(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    // Attention-like: scores = Q·Kᵀ per head, packed.
    let qk = Matmul::new(33, 31, 16).transpose_b().scaled(0.25, 0.0);
    batch_case::<f32>(gpu, &qk, &Batch::packed(6, &qk), &mut rng)?;
    batch_case::<bf16>(gpu, &qk, &Batch::packed(6, &qk), &mut rng)?;
    batch_case::<f16>(gpu, &qk, &Batch::packed(6, &qk), &mut rng)?;
    batch_case::<f64>(gpu, &qk, &Batch::packed(6, &qk), &mut rng)?;
    // One B for the whole batch (stride 0), gaps between the Cs, accumulating.
    let s = Matmul::new(9, 12, 7).scaled(1.0, 1.0);
    batch_case::<f32>(gpu, &s, &Batch::new(5, 9 * 7, 0, 9 * 12 + 5), &mut rng)?;
    // Column-major with leading dimensions, transposed A.
    let c = Matmul::new(10, 6, 4)
        .col_major()
        .transpose_a()
        .with_ld(6, 12, 11);
    batch_case::<bf16>(gpu, &c, &Batch::new(3, 40, 80, 70), &mut rng)
}

/// `T` inputs, an f32 output: single products (transposes × layouts, accumulating into
/// C) and a strided batch against the host, the captured product equal to the eager one
/// bit for bit.
fn mixed_case<T: El>(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> R
where
    f32: MatmulOutput<T>,
{
    let blas = gpu.new_blas().ctx("new_blas")?;
    let stream = gpu.default_stream();
    // f32 accumulation of exactly representable products: f32 rounding only.
    let tol = 2e-5;
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for layout in [Layout::RowMajor, Layout::ColMajor] {
            let (m, n, k) = (33, 17, 80);
            let mut s = Matmul::new(m, n, k).scaled(0.75, 1.0);
            (s.transpose_a, s.transpose_b, s.layout) = (ta, tb, layout);
            let (a, af) = random::<T>(rng, m * k);
            let (b, bf) = random::<T>(rng, k * n);
            let (c0, cf) = random::<f32>(rng, m * n);
            let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
            let mut dc = gpu.clone_htod(&c0).ctx("c")?;
            let what = format!("{:?} -> f32 ta={ta} tb={tb} {layout:?}", T::DATA_TYPE);
            stream
                .matmul_mixed(&blas, &s, &da, &db, &mut dc)
                .ctx(&what)?;
            let got = dtoh_f64(gpu, &dc)?;
            let (want, scale) = host_gemm(&s, &af, &bf, &cf);
            close(&what, &got, &want, &scale, tol)?;
            // The same product captured, from the same C, gives the same bits.
            let dc2 = gpu.clone_htod(&c0).ctx("c")?;
            let graph = gpu
                .capture(|cap| cap.matmul_mixed(&blas, &s, &da, &db, &dc2))
                .ctx("capture")?;
            let exec = graph.instantiate().ctx("instantiate")?;
            exec.launch(&stream).ctx("launch")?;
            let (eager, captured) = (gpu.dtoh(&dc).ctx("dtoh")?, gpu.dtoh(&dc2).ctx("dtoh")?);
            ensure!(
                eager == captured,
                "{what}: captured product differs from eager"
            );
        }
    }
    // Attention-like batch: scores in f32 of 16-bit Q and K.
    let qk = Matmul::new(33, 31, 16).transpose_b().scaled(0.25, 0.0);
    let batch = Batch::packed(6, &qk);
    let (q, qf) = random::<T>(rng, 6 * 33 * 16);
    let (kk, kf) = random::<T>(rng, 6 * 31 * 16);
    let (dq, dk) = (gpu.clone_htod(&q).ctx("q")?, gpu.clone_htod(&kk).ctx("k")?);
    let mut ds = gpu.alloc_zeros::<f32>(6 * 33 * 31).ctx("s")?;
    let what = format!("{:?} -> f32 batched", T::DATA_TYPE);
    stream
        .matmul_batched_mixed(&blas, &qk, &batch, &dq, &dk, &mut ds)
        .ctx(&what)?;
    let got = dtoh_f64(gpu, &ds)?;
    let one = 33 * 31;
    let zeros = vec![0.0; one];
    for i in 0..6 {
        let (w, sc) = host_gemm(&qk, &qf[i * 33 * 16..], &kf[i * 31 * 16..], &zeros);
        close(&what, &got[i * one..(i + 1) * one], &w, &sc, tol)?;
    }
    Ok(())
}

fn mixed_products_match_the_host(gpu: &BoundDevice<'_>) -> R {
    let seed: u64 = rand::random();
    println!("    seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    mixed_case::<bf16>(gpu, &mut rng)?;
    mixed_case::<f16>(gpu, &mut rng)?;
    // The same type through matmul_mixed is matmul; TF32 stays an f32-only option.
    let blas = gpu.new_blas().ctx("new_blas")?;
    let a = gpu.clone_htod(&[bf16::ONE; 4]).ctx("a")?;
    let mut c = gpu.alloc_zeros::<f32>(4).ctx("c")?;
    let tf32 = Matmul::new(2, 2, 2).allow_tf32();
    refused(
        "tf32 on bf16 -> f32",
        gpu.default_stream()
            .matmul_mixed(&blas, &tf32, &a, &a, &mut c),
        |e| matches!(e, MatmulError::Unsupported { .. }),
    )
}

/// A small forward through [`Enqueue`]: `h = GELU(x·Wᵀ + bias)` (cuBLASLt), the scores
/// `h·hᵀ` per batch (f32 of bf16) and `y = h·W2ᵀ`, the same code eager and captured.
fn enqueue_forward<'buf>(
    e: &mut impl Enqueue<'buf>,
    blas: &gpubind::blas::Blas,
    x: &'buf gpubind::DeviceSlice<bf16>,
    w: [&'buf gpubind::DeviceSlice<bf16>; 3],
    out: (
        &'buf gpubind::DeviceSlice<bf16>,
        &'buf gpubind::DeviceSlice<f32>,
        &'buf gpubind::DeviceSlice<bf16>,
    ),
) -> gpubind::Result<()> {
    let (h, scores, y) = out;
    let lin = Matmul::new(16, 32, 24).transpose_b();
    let args = CaptureLtArgs::new().bias(w[1]);
    e.matmul_lt(blas, &lin, Epilogue::GeluBias, x, w[0], h, args)?;
    let sc = Matmul::new(8, 8, 32).transpose_b();
    e.matmul_batched_mixed(blas, &sc, &Batch::new(2, 8 * 32, 8 * 32, 64), h, h, scores)?;
    e.matmul(blas, &Matmul::new(16, 8, 32).transpose_b(), h, w[2], y)
}

/// One generic forward ([`Enqueue`]) run on a stream, equal to the inherent products,
/// then captured: the graph's outputs equal the eager ones bit for bit.
fn enqueue_serves_eager_and_captured_steps(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let blas = gpu.new_blas().ctx("new_blas")?;
    let mut up = |len: usize| gpu.clone_htod(&random::<bf16>(&mut rng, len).0).ctx("htod");
    let (x, w0, b0, w2) = (up(16 * 24)?, up(32 * 24)?, up(32)?, up(8 * 32)?);
    let h = gpu.alloc_zeros::<bf16>(16 * 32).ctx("alloc")?;
    let scores = gpu.alloc_zeros::<f32>(2 * 64).ctx("alloc")?;
    let y = gpu.alloc_zeros::<bf16>(16 * 8).ctx("alloc")?;
    let mut stream = gpu.default_stream();
    let w = [&w0, &b0, &w2];
    enqueue_forward(&mut stream, &blas, &x, w, (&h, &scores, &y)).ctx("eager")?;
    let eager = (
        gpu.dtoh(&h).ctx("dtoh")?,
        gpu.dtoh(&scores).ctx("dtoh")?,
        gpu.dtoh(&y).ctx("dtoh")?,
    );
    // The inherent (`&mut` output) product gives the same last output.
    let mut y2 = gpu.alloc_zeros::<bf16>(16 * 8).ctx("alloc")?;
    let last = Matmul::new(16, 8, 32).transpose_b();
    stream
        .matmul(&blas, &last, &h, &w2, &mut y2)
        .ctx("inherent")?;
    ensure!(
        gpu.dtoh(&y2).ctx("dtoh")? == eager.2,
        "inherent matmul differs"
    );
    // Captured, into zeroed outputs.
    let h = gpu.alloc_zeros::<bf16>(16 * 32).ctx("alloc")?;
    let scores = gpu.alloc_zeros::<f32>(2 * 64).ctx("alloc")?;
    let y = gpu.alloc_zeros::<bf16>(16 * 8).ctx("alloc")?;
    let graph = gpu
        .capture(|cap| enqueue_forward(cap, &blas, &x, w, (&h, &scores, &y)))
        .ctx("capture")?;
    graph
        .instantiate()
        .ctx("instantiate")?
        .launch(&stream)
        .ctx("launch")?;
    ensure!(gpu.dtoh(&h).ctx("dtoh")? == eager.0, "captured h differs");
    ensure!(
        gpu.dtoh(&scores).ctx("dtoh")? == eager.1,
        "captured scores differ"
    );
    ensure!(gpu.dtoh(&y).ctx("dtoh")? == eager.2, "captured y differs");
    Ok(())
}

/// GELU (tanh approximation, as cuBLASLt computes it) and its derivative.
fn gelu(z: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z);
    0.5 * z * (1.0 + u.tanh())
}

fn dgelu(z: f64) -> f64 {
    let s = (2.0 / std::f64::consts::PI).sqrt();
    let t = (s * (z + 0.044715 * z * z * z)).tanh();
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * z * z)
}

/// Multiples of 0.5 in [-2, 2]: products and their sums over a short k are exact in f32.
fn halves<T: El>(n: usize, salt: usize) -> (Vec<T>, Vec<f64>) {
    let v: Vec<T> = (0..n)
        .map(|i| T::of((((i * 7 + salt * 3) % 9) as f64 - 4.0) * 0.5))
        .collect();
    let f = v.iter().map(|&x| x.f()).collect();
    (v, f)
}

/// The forward epilogues on a row-major `Y[m×n] = act(X[m×k]·W[k×n] + b)`, the
/// auxiliary outputs checked through the backward epilogues that read them.
fn lt_case<T: El>(gpu: &BoundDevice<'_>) -> R {
    let (m, n, k) = (24usize, 40usize, 16usize);
    let blas = gpu.new_blas().ctx("new_blas")?;
    let st = gpu.default_stream();
    let s = Matmul::new(m, n, k);
    let (x, xf) = halves::<T>(m * k, 1);
    let (w, wf) = halves::<T>(k * n, 2);
    // Bias ≡ 0.125 (mod 0.25): no pre-activation is 0, so ReLU's mask is unambiguous.
    let bias_f: Vec<f64> = (0..n)
        .map(|j| ((j % 7) as f64 - 3.0) * 0.25 + 0.125)
        .collect();
    let bias_t: Vec<T> = bias_f.iter().map(|&v| T::of(v)).collect();
    let (dx, dw, db) = (
        gpu.clone_htod(&x).ctx("x")?,
        gpu.clone_htod(&w).ctx("w")?,
        gpu.clone_htod(&bias_t).ctx("bias")?,
    );
    let p = host_product(&s, &xf, &wf);
    let tol = T::TOL.max(1e-5);
    let gelu_tol = T::TOL.max(2e-3);
    let z = |ij: usize, with_bias: bool| p[ij].0 + if with_bias { bias_f[ij % n] } else { 0.0 };
    let scale = |ij: usize| p[ij].1 + 1.0;
    type Act = fn(f64) -> f64;
    let relu: Act = |v| v.max(0.0);
    let ident: Act = |v| v;
    let cases: [(Epilogue, bool, Act, f64); 6] = [
        (Epilogue::Default, false, ident, tol),
        (Epilogue::Relu, false, relu, tol),
        (Epilogue::Gelu, false, gelu, gelu_tol),
        (Epilogue::Bias, true, ident, tol),
        (Epilogue::ReluBias, true, relu, tol),
        (Epilogue::GeluBias, true, gelu, gelu_tol),
    ];
    for (e, with_bias, act, tol) in cases {
        let mut y = gpu.alloc_zeros::<T>(m * n).ctx("y")?;
        let args = if with_bias {
            LtArgs::new().bias(&db)
        } else {
            LtArgs::new()
        };
        st.matmul_lt(&blas, &s, e, &dx, &dw, &mut y, args)
            .ctx(e.name())?;
        let got = dtoh_f64(gpu, &y)?;
        let want: Vec<f64> = (0..m * n).map(|ij| act(z(ij, with_bias))).collect();
        let sc: Vec<f64> = (0..m * n).map(scale).collect();
        close(
            &format!("{:?} {}", T::DATA_TYPE, e.name()),
            &got,
            &want,
            &sc,
            tol,
        )?;
    }
    lt_aux_roundtrips(gpu, &blas, &s, (&dx, &dw, &db), &p, &bias_f)
}

/// What the aux round trips share: the forward product `X·W (+ b)` (`p`: its host
/// values and scales, `bias`: the host bias) and the backward product `G·H` (`q`).
struct Fixture<'g, 'd, T: El> {
    gpu: &'g BoundDevice<'d>,
    s: Matmul,
    x: &'g gpubind::DeviceSlice<T>,
    w: &'g gpubind::DeviceSlice<T>,
    b: &'g gpubind::DeviceSlice<T>,
    p: &'g [(f64, f64)],
    bias: &'g [f64],
    g: gpubind::DeviceSlice<T>,
    h: gpubind::DeviceSlice<T>,
    q: Vec<(f64, f64)>,
}

impl<T: El> Fixture<'_, '_, T> {
    fn name(&self, e: Epilogue) -> String {
        format!("{:?} {}", T::DATA_TYPE, e.name())
    }

    /// The pre-activation `Z` on the host, and its error scales.
    fn z(&self, with_bias: bool) -> (Vec<f64>, Vec<f64>) {
        let n = self.s.n;
        let z = (0..self.p.len())
            .map(|ij| self.p[ij].0 + if with_bias { self.bias[ij % n] } else { 0.0 })
            .collect();
        (z, self.p.iter().map(|v| v.1 + 1.0).collect())
    }

    /// `Y = fwd(X·W + b)` into a new `Y` (the bias only when `with_bias`), the
    /// epilogue's output in `args`.
    fn forward<'a>(
        &'a self,
        blas: &gpubind::blas::Blas,
        fwd: Epilogue,
        with_bias: bool,
        args: LtArgs<'a, T>,
    ) -> Result<gpubind::DeviceSlice<T>, String> {
        let mut y = self.gpu.alloc_zeros::<T>(self.s.m * self.s.n).ctx("y")?;
        let args = if with_bias { args.bias(self.b) } else { args };
        let st = self.gpu.default_stream();
        st.matmul_lt(blas, &self.s, fwd, self.x, self.w, &mut y, args)
            .ctx(&self.name(fwd))?;
        Ok(y)
    }

    /// `dz = e(G·H)`, the epilogue's operands in `args`.
    fn backward(
        &self,
        blas: &gpubind::blas::Blas,
        e: Epilogue,
        dz: &mut gpubind::DeviceSlice<T>,
        args: LtArgs<'_, T>,
    ) -> R {
        let st = self.gpu.default_stream();
        st.matmul_lt(blas, &self.s, e, &self.g, &self.h, dz, args)
            .ctx(&self.name(e))
    }
}

/// GELU_AUX(_BIAS) stores Z; DGELU(_BGRAD) reads it; RELU_AUX(_BIAS) stores the mask,
/// DRELU(_BGRAD) reads it; BGRADA/BGRADB reduce an operand.
fn lt_aux_roundtrips<T: El>(
    gpu: &BoundDevice<'_>,
    blas: &gpubind::blas::Blas,
    s: &Matmul,
    (x, w, b): (
        &gpubind::DeviceSlice<T>,
        &gpubind::DeviceSlice<T>,
        &gpubind::DeviceSlice<T>,
    ),
    p: &[(f64, f64)],
    bias: &[f64],
) -> R {
    // The product the backward epilogues scale: G[m×k]·H[k×n] (halves, other salts).
    let (g, gf) = halves::<T>(s.m * s.k, 5);
    let (h, hf) = halves::<T>(s.k * s.n, 6);
    let fx = Fixture {
        gpu,
        s: *s,
        x,
        w,
        b,
        p,
        bias,
        g: gpu.clone_htod(&g).ctx("g")?,
        h: gpu.clone_htod(&h).ctx("h")?,
        q: host_product(s, &gf, &hf),
    };
    for with_bias in [false, true] {
        gelu_roundtrip(&fx, blas, with_bias)?;
        relu_roundtrip(&fx, blas, with_bias)?;
    }
    lt_bias_grads(gpu, blas, (&fx.g, &gf), s.n)
}

/// GELU_AUX(_BIAS) then DGELU_BGRAD and DGELU through the stored pre-activation.
fn gelu_roundtrip<T: El>(
    fx: &Fixture<'_, '_, T>,
    blas: &gpubind::blas::Blas,
    with_bias: bool,
) -> R {
    let (gpu, s) = (fx.gpu, &fx.s);
    let (m, n, ld) = (s.m, s.n, s.gelu_aux_ld());
    let fwd = if with_bias {
        Epilogue::GeluAuxBias
    } else {
        Epilogue::GeluAux
    };
    let mut aux = gpu.alloc_zeros::<T>(s.gelu_aux_len()).ctx("aux")?;
    let y = fx.forward(blas, fwd, with_bias, LtArgs::new().aux_out(&mut aux))?;
    let (want_z, sc) = fx.z(with_bias);
    let zf = dtoh_f64(gpu, &aux)?;
    let got_z: Vec<f64> = (0..m * n).map(|ij| zf[(ij / n) * ld + ij % n]).collect();
    close(
        &format!("{} aux (Z)", fx.name(fwd)),
        &got_z,
        &want_z,
        &sc,
        T::TOL.max(1e-5),
    )?;
    let want_y: Vec<f64> = want_z.iter().map(|&z| gelu(z)).collect();
    close(
        &fx.name(fwd),
        &dtoh_f64(gpu, &y)?,
        &want_y,
        &sc,
        T::TOL.max(2e-3),
    )?;
    // Backward through Z as the device stored it.
    let mut dz = gpu.alloc_zeros::<T>(m * n).ctx("dz")?;
    let mut bgrad = gpu.alloc_zeros::<T>(n).ctx("bgrad")?;
    let e = Epilogue::DGeluBGrad;
    let args = LtArgs::new().aux(&aux).bias_grad(&mut bgrad);
    fx.backward(blas, e, &mut dz, args)?;
    let q = &fx.q;
    let want: Vec<f64> = (0..m * n).map(|ij| q[ij].0 * dgelu(got_z[ij])).collect();
    let sc: Vec<f64> = (0..m * n).map(|ij| (q[ij].1 + 1.0) * 2.0).collect();
    let got = dtoh_f64(gpu, &dz)?;
    close(&fx.name(e), &got, &want, &sc, T::TOL.max(2e-3))?;
    check_bias_grad(gpu, &fx.name(e), &bgrad, &got, m, n)?;
    let mut dz2 = gpu.alloc_zeros::<T>(m * n).ctx("dz2")?;
    let e = Epilogue::DGelu;
    fx.backward(blas, e, &mut dz2, LtArgs::new().aux(&aux))?;
    close(
        &fx.name(e),
        &dtoh_f64(gpu, &dz2)?,
        &want,
        &sc,
        T::TOL.max(2e-3),
    )
}

/// RELU_AUX(_BIAS) then DRELU and DRELU_BGRAD through the stored mask.
fn relu_roundtrip<T: El>(
    fx: &Fixture<'_, '_, T>,
    blas: &gpubind::blas::Blas,
    with_bias: bool,
) -> R {
    let (gpu, s) = (fx.gpu, &fx.s);
    let (m, n) = (s.m, s.n);
    let fwd = if with_bias {
        Epilogue::ReluAuxBias
    } else {
        Epilogue::ReluAux
    };
    let mut mask = gpu.alloc_zeros::<u8>(s.relu_mask_len()).ctx("mask")?;
    let y = fx.forward(blas, fwd, with_bias, LtArgs::new().relu_mask_out(&mut mask))?;
    let (z, sc) = fx.z(with_bias);
    let relu: Vec<f64> = z.iter().map(|v| v.max(0.0)).collect();
    close(
        &fx.name(fwd),
        &dtoh_f64(gpu, &y)?,
        &relu,
        &sc,
        T::TOL.max(1e-5),
    )?;
    let q = &fx.q;
    let want: Vec<f64> = (0..m * n)
        .map(|ij| if z[ij] > 0.0 { q[ij].0 } else { 0.0 })
        .collect();
    let sc: Vec<f64> = (0..m * n).map(|ij| q[ij].1 + 1.0).collect();
    let mut dz = gpu.alloc_zeros::<T>(m * n).ctx("dz")?;
    let e = Epilogue::DRelu;
    let args = LtArgs::new().relu_mask(&mask);
    fx.backward(blas, e, &mut dz, args)?;
    let what = format!("{} after {}", fx.name(e), fwd.name());
    close(&what, &dtoh_f64(gpu, &dz)?, &want, &sc, T::TOL.max(1e-5))?;
    let mut bgrad = gpu.alloc_zeros::<T>(n).ctx("bgrad")?;
    let e = Epilogue::DReluBGrad;
    let args = LtArgs::new().relu_mask(&mask).bias_grad(&mut bgrad);
    fx.backward(blas, e, &mut dz, args)?;
    let got = dtoh_f64(gpu, &dz)?;
    close(&fx.name(e), &got, &want, &sc, T::TOL.max(1e-5))?;
    check_bias_grad(gpu, &fx.name(e), &bgrad, &got, m, n)
}

/// `bgrad[j] = Σ_i dz[i][j]` (row-major `m×n`), within the type's tolerance.
fn check_bias_grad<T: El>(
    gpu: &BoundDevice<'_>,
    what: &str,
    bgrad: &gpubind::DeviceSlice<T>,
    dz: &[f64],
    m: usize,
    n: usize,
) -> R {
    let want: Vec<f64> = (0..n)
        .map(|j| (0..m).map(|i| dz[i * n + j]).sum())
        .collect();
    let sc: Vec<f64> = (0..n)
        .map(|j| (0..m).map(|i| dz[i * n + j].abs()).sum::<f64>() + 1.0)
        .collect();
    close(
        &format!("{what} bias gradient"),
        &dtoh_f64(gpu, bgrad)?,
        &want,
        &sc,
        T::TOL.max(1e-5),
    )
}

/// Weight gradients with bias gradients, `dW[16×n] = Xᵀ·D` for `X` 24×16 and `D`
/// 24×n: BGRADB adds `Σ_rows D` (the bias gradient of the layer), BGRADA `Σ_rows X`
/// (the reduction of op(A) over k).
fn lt_bias_grads<T: El>(
    gpu: &BoundDevice<'_>,
    blas: &gpubind::blas::Blas,
    (x, xf): (&gpubind::DeviceSlice<T>, &[f64]),
    n: usize,
) -> R {
    let (rows, cols) = (24usize, 16usize);
    let (d, df) = halves::<T>(rows * n, 9);
    let dd = gpu.clone_htod(&d).ctx("d")?;
    let s = Matmul::new(cols, n, rows).transpose_a();
    let p = host_product(&s, xf, &df);
    let want_w: Vec<f64> = p.iter().map(|v| v.0).collect();
    let sc: Vec<f64> = p.iter().map(|v| v.1 + 1.0).collect();
    for e in [Epilogue::BGradB, Epilogue::BGradA] {
        let what = format!("{:?} {}", T::DATA_TYPE, e.name());
        let len = if e == Epilogue::BGradB { n } else { cols };
        let mut dw = gpu.alloc_zeros::<T>(cols * n).ctx("dw")?;
        let mut bgrad = gpu.alloc_zeros::<T>(len).ctx("bgrad")?;
        gpu.default_stream()
            .matmul_lt(
                blas,
                &s,
                e,
                x,
                &dd,
                &mut dw,
                LtArgs::new().bias_grad(&mut bgrad),
            )
            .ctx(&what)?;
        close(&what, &dtoh_f64(gpu, &dw)?, &want_w, &sc, T::TOL.max(1e-5))?;
        let want: Vec<f64> = if e == Epilogue::BGradB {
            (0..n)
                .map(|j| (0..rows).map(|i| df[i * n + j]).sum())
                .collect()
        } else {
            (0..cols)
                .map(|c| (0..rows).map(|i| xf[i * cols + c]).sum())
                .collect()
        };
        let sc = vec![64.0; len];
        let got = dtoh_f64(gpu, &bgrad)?;
        close(
            &format!("{what} bias gradient"),
            &got,
            &want,
            &sc,
            T::TOL.max(1e-5),
        )?;
    }
    Ok(())
}

fn lt_epilogues_match_host_math(gpu: &BoundDevice<'_>) -> R {
    lt_case::<f32>(gpu)?;
    lt_case::<bf16>(gpu)?;
    lt_case::<f16>(gpu)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    lt_layouts::<f32>(gpu, &mut rng)?;
    lt_layouts::<bf16>(gpu, &mut rng)
}

/// The BIAS epilogue with every transpose pair × layout × packed/padded leading
/// dimensions, accumulating into C (beta 0.5): the bias runs along C's rows for
/// row-major products (one per column, `n`) and along its columns for column-major ones
/// (one per row, `m`).
fn lt_layouts<T: El>(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let (m, n, k) = (24usize, 40usize, 16usize);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for layout in [Layout::RowMajor, Layout::ColMajor] {
            for padded in [false, true] {
                let mut s = Matmul::new(m, n, k).scaled(1.0, 0.5);
                (s.transpose_a, s.transpose_b, s.layout) = (ta, tb, layout);
                if padded {
                    let (la, lb, lc) = lds(&s);
                    s = s.with_ld(la + 8, lb + 8, lc + 8);
                }
                let (lda, ldb, ldc) = lds(&s);
                let (ar, ac) = if ta { (k, m) } else { (m, k) };
                let (br, bc) = if tb { (n, k) } else { (k, n) };
                let (a, af) = random::<T>(rng, span(layout, lda, ar, ac));
                let (b, bf) = random::<T>(rng, span(layout, ldb, br, bc));
                let (c0, cf) = random::<T>(rng, span(layout, ldc, m, n));
                let along = if layout == Layout::RowMajor { n } else { m };
                let (bias, bias_f) = random::<T>(rng, along);
                let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
                let dbias = gpu.clone_htod(&bias).ctx("bias")?;
                let mut dc = gpu.clone_htod(&c0).ctx("c")?;
                let what = format!(
                    "{:?} BIAS ta={ta} tb={tb} {layout:?} padded={padded}",
                    T::DATA_TYPE
                );
                gpu.default_stream()
                    .matmul_lt(
                        &blas,
                        &s,
                        Epilogue::Bias,
                        &da,
                        &db,
                        &mut dc,
                        LtArgs::new().bias(&dbias),
                    )
                    .ctx(&what)?;
                let (mut want, mut scale) = host_gemm(&s, &af, &bf, &cf);
                for i in 0..m {
                    for j in 0..n {
                        let at_c = at(layout, ldc, i, j);
                        let b = bias_f[if layout == Layout::RowMajor { j } else { i }];
                        want[at_c] += b;
                        scale[at_c] += b.abs();
                    }
                }
                close(&what, &dtoh_f64(gpu, &dc)?, &want, &scale, T::TOL)?;
            }
        }
    }
    Ok(())
}

/// The inputs of the capture test: a bf16 GEMM, an f32 strided batch, and a bf16
/// GELU_AUX_BIAS forward with its DGELU_BGRAD backward.
struct CaptureInputs {
    gemm: Matmul,
    a16: gpubind::DeviceSlice<bf16>,
    b16: gpubind::DeviceSlice<bf16>,
    qk: Matmul,
    batch: Batch,
    q: gpubind::DeviceSlice<f32>,
    k: gpubind::DeviceSlice<f32>,
    lt: Matmul,
    x: gpubind::DeviceSlice<bf16>,
    w: gpubind::DeviceSlice<bf16>,
    bias: gpubind::DeviceSlice<bf16>,
}

/// The outputs of those products.
struct CaptureOutputs {
    c: gpubind::DeviceSlice<bf16>,
    s: gpubind::DeviceSlice<f32>,
    y: gpubind::DeviceSlice<bf16>,
    z: gpubind::DeviceSlice<bf16>,
    dz: gpubind::DeviceSlice<bf16>,
    db: gpubind::DeviceSlice<bf16>,
}

impl CaptureInputs {
    fn new(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> Result<Self, String> {
        let (m, n, k) = (96usize, 64usize, 80usize);
        let mut up = |len: usize| gpu.clone_htod(&random::<bf16>(rng, len).0).ctx("htod");
        let (a16, b16, x, w, bias) = (up(m * k)?, up(n * k)?, up(m * k)?, up(k * n)?, up(n)?);
        let qk = Matmul::new(32, 32, 16).transpose_b();
        let q = gpu
            .clone_htod(&random::<f32>(rng, 12 * 32 * 16).0)
            .ctx("q")?;
        let kt = gpu
            .clone_htod(&random::<f32>(rng, 12 * 32 * 16).0)
            .ctx("k")?;
        Ok(CaptureInputs {
            gemm: Matmul::new(m, n, k).transpose_b(),
            a16,
            b16,
            batch: Batch::packed(12, &qk),
            qk,
            q,
            k: kt,
            lt: Matmul::new(m, n, k),
            x,
            w,
            bias,
        })
    }

    fn outputs(&self, gpu: &BoundDevice<'_>) -> Result<CaptureOutputs, String> {
        let (mn, n) = (self.lt.m * self.lt.n, self.lt.n);
        Ok(CaptureOutputs {
            c: gpu.alloc_zeros(mn).ctx("alloc")?,
            s: gpu.alloc_zeros(12 * 32 * 32).ctx("alloc")?,
            y: gpu.alloc_zeros(mn).ctx("alloc")?,
            z: gpu.alloc_zeros(self.lt.gelu_aux_len()).ctx("alloc")?,
            dz: gpu.alloc_zeros(mn).ctx("alloc")?,
            db: gpu.alloc_zeros(n).ctx("alloc")?,
        })
    }

    fn eager(
        &self,
        gpu: &BoundDevice<'_>,
        blas: &gpubind::blas::Blas,
        o: &mut CaptureOutputs,
    ) -> R {
        let st = gpu.default_stream();
        st.matmul(blas, &self.gemm, &self.a16, &self.b16, &mut o.c)
            .ctx("eager gemm")?;
        st.matmul_batched(blas, &self.qk, &self.batch, &self.q, &self.k, &mut o.s)
            .ctx("eager batched")?;
        let args = LtArgs::new().bias(&self.bias).aux_out(&mut o.z);
        let e = Epilogue::GeluAuxBias;
        st.matmul_lt(blas, &self.lt, e, &self.x, &self.w, &mut o.y, args)
            .ctx("eager gelu")?;
        let args = LtArgs::new().aux(&o.z).bias_grad(&mut o.db);
        let e = Epilogue::DGeluBGrad;
        st.matmul_lt(blas, &self.lt, e, &self.x, &self.w, &mut o.dz, args)
            .ctx("eager dgelu")
    }
}

/// `Err` unless `a` and `b` hold the same bits.
fn same<T: DeviceRepr + PartialEq>(
    gpu: &BoundDevice<'_>,
    what: &str,
    a: &gpubind::DeviceSlice<T>,
    b: &gpubind::DeviceSlice<T>,
) -> R {
    ensure!(
        gpu.dtoh(a).ctx("dtoh")? == gpu.dtoh(b).ctx("dtoh")?,
        "{what} differs"
    );
    Ok(())
}

/// A bf16 GEMM, an f32 strided batch, a GELU_AUX_BIAS forward and a DGELU_BGRAD
/// backward captured into one graph equal the same products run eagerly, bit for bit,
/// at every launch, with the Blas dropped before the graph is instantiated (the graph
/// keeps the handles and the workspace); a new Blas works alongside.
fn captured_products_equal_eager_with_the_blas_dropped(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let blas = gpu.new_blas().ctx("new_blas")?;
    let i = CaptureInputs::new(gpu, &mut rng)?;
    let mut e = i.outputs(gpu)?;
    i.eager(gpu, &blas, &mut e)?;
    let g = i.outputs(gpu)?;
    let graph = gpu
        .capture(|cap| {
            cap.matmul(&blas, &i.gemm, &i.a16, &i.b16, &g.c)?;
            cap.matmul_batched(&blas, &i.qk, &i.batch, &i.q, &i.k, &g.s)?;
            let args = CaptureLtArgs::new().bias(&i.bias).aux_out(&g.z);
            cap.matmul_lt(&blas, &i.lt, Epilogue::GeluAuxBias, &i.x, &i.w, &g.y, args)?;
            let args = CaptureLtArgs::new().aux(&g.z).bias_grad(&g.db);
            cap.matmul_lt(&blas, &i.lt, Epilogue::DGeluBGrad, &i.x, &i.w, &g.dz, args)
        })
        .ctx("capture")?;
    ensure!(
        gpu.dtoh(&g.c)
            .ctx("dtoh")?
            .iter()
            .all(|v| v.to_f32() == 0.0),
        "the capture ran the product instead of recording it"
    );
    drop(blas);
    let exec = graph.instantiate().ctx("instantiate")?;
    let other = gpu.new_blas().ctx("a new Blas")?;
    let stream = gpu.new_stream().ctx("stream")?;
    for launch in 0..3 {
        exec.launch(&gpu.on(&stream).ctx("on")?).ctx("launch")?;
        let mut scratch = gpu.alloc_zeros::<bf16>(g.c.len()).ctx("alloc")?;
        gpu.default_stream()
            .matmul(&other, &i.gemm, &i.a16, &i.b16, &mut scratch)
            .ctx("gemm on a new Blas")?;
        let at = |what: &str| format!("launch {launch}: {what}");
        same(gpu, &at("GEMM"), &g.c, &e.c)?;
        same(gpu, &at("the new Blas's GEMM"), &scratch, &e.c)?;
        same(gpu, &at("strided batch"), &g.s, &e.s)?;
        same(gpu, &at("GELU_AUX_BIAS output"), &g.y, &e.y)?;
        same(gpu, &at("GELU_AUX_BIAS pre-activation"), &g.z, &e.z)?;
        same(gpu, &at("DGELU_BGRAD output"), &g.dz, &e.dz)?;
        same(gpu, &at("DGELU_BGRAD bias gradient"), &g.db, &e.db)?;
    }
    Ok(())
}

/// Two handles on two streams read one weight concurrently (read claims) and both
/// products are right, repeatedly, with the weight then rewritten and read again.
fn two_streams_read_one_weight(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let (m, n, k) = (128usize, 96usize, 64usize);
    let s = Matmul::new(m, n, k);
    let (wv, wf) = random::<f32>(&mut rng, k * n);
    let (x1, x1f) = random::<f32>(&mut rng, m * k);
    let (x2, x2f) = random::<f32>(&mut rng, m * k);
    let mut w = gpu.clone_htod(&wv).ctx("w")?;
    let (x1, x2) = (
        gpu.clone_htod(&x1).ctx("x1")?,
        gpu.clone_htod(&x2).ctx("x2")?,
    );
    let (b1, b2) = (gpu.new_blas().ctx("blas")?, gpu.new_blas().ctx("blas")?);
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (mut y1, mut y2) = (
        gpu.alloc_zeros::<f32>(m * n).ctx("y")?,
        gpu.alloc_zeros::<f32>(m * n).ctx("y")?,
    );
    let mut wf = wf;
    for round in 0..3 {
        gpu.on(&s1)
            .ctx("on")?
            .matmul(&b1, &s, &x1, &w, &mut y1)
            .ctx("y1")?;
        gpu.on(&s2)
            .ctx("on")?
            .matmul(&b2, &s, &x2, &w, &mut y2)
            .ctx("y2")?;
        let zeros = vec![0.0; m * n];
        let (w1, sc1) = host_gemm(&s, &x1f, &wf, &zeros);
        let (w2, sc2) = host_gemm(&s, &x2f, &wf, &zeros);
        close(
            &format!("round {round} y1"),
            &dtoh_f64(gpu, &y1)?,
            &w1,
            &sc1,
            1e-5,
        )?;
        close(
            &format!("round {round} y2"),
            &dtoh_f64(gpu, &y2)?,
            &w2,
            &sc2,
            1e-5,
        )?;
        // The next round's weight, written after both reads.
        let (nv, nf) = random::<f32>(&mut rng, k * n);
        gpu.htod_copy(&nv, &mut w).ctx("rewrite w")?;
        wf = nf;
    }
    Ok(())
}

/// `Err` unless `r` is the matmul error `pred` accepts.
fn refused(what: &str, r: gpubind::Result<()>, pred: impl Fn(&MatmulError) -> bool) -> R {
    match r {
        Err(Error::Matmul(e)) if pred(&e) => {
            println!("    {what}: {e}");
            Ok(())
        }
        other => Err(format!("{what}: {other:?}")),
    }
}

/// Every refusal is a typed error, before anything is enqueued, on the GPU path too.
fn bad_input_is_a_typed_error(gpu: &BoundDevice<'_>) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let st = gpu.default_stream();
    let (a, b) = (
        gpu.alloc_zeros::<f32>(6).ctx("a")?,
        gpu.alloc_zeros::<f32>(6).ctx("b")?,
    );
    let mut c = gpu.alloc_zeros::<f32>(5).ctx("c")?;
    refused(
        "C of 5 for 2×2",
        st.matmul(&blas, &Matmul::new(2, 2, 3), &a, &b, &mut c),
        |e| {
            matches!(
                e,
                MatmulError::BufferSize {
                    operand: "C",
                    expected: 4,
                    found: 5,
                    ..
                }
            )
        },
    )?;
    let mut c4 = gpu.alloc_zeros::<f32>(4).ctx("c")?;
    let small_ld = Matmul::new(2, 2, 3).with_ld(2, 2, 2);
    refused(
        "lda 2 < 3",
        st.matmul(&blas, &small_ld, &a, &b, &mut c4),
        |e| {
            matches!(
                e,
                MatmulError::LeadingDimension {
                    operand: "A",
                    ld: 2,
                    min: 3
                }
            )
        },
    )?;
    let mut c8 = gpu.alloc_zeros::<f32>(8).ctx("c")?;
    let s = Matmul::new(2, 2, 3);
    let overlap = Batch::new(2, 0, 0, 3);
    refused(
        "batch stride 3 < 4",
        st.matmul_batched(&blas, &s, &overlap, &a, &b, &mut c8),
        |e| {
            matches!(
                e,
                MatmulError::BatchOverlap {
                    stride: 3,
                    matrix: 4
                }
            )
        },
    )?;
    let (h_a, h_b) = (
        gpu.alloc_zeros::<f16>(6).ctx("a")?,
        gpu.alloc_zeros::<f16>(6).ctx("b")?,
    );
    let mut h_c = gpu.alloc_zeros::<f16>(4).ctx("c")?;
    refused(
        "tf32 on f16",
        st.matmul(&blas, &s.allow_tf32(), &h_a, &h_b, &mut h_c),
        |e| matches!(e, MatmulError::Unsupported { .. }),
    )?;
    lt_refusals(gpu, &blas)?;
    refused_in_capture(gpu, &blas)
}

/// cuBLASLt refusals: an epilogue on f64, a missing operand, a wrong length.
fn lt_refusals(gpu: &BoundDevice<'_>, blas: &gpubind::blas::Blas) -> R {
    let st = gpu.default_stream();
    let s = Matmul::new(2, 2, 3);
    let (a, b) = (
        gpu.alloc_zeros::<f32>(6).ctx("a")?,
        gpu.alloc_zeros::<f32>(6).ctx("b")?,
    );
    let mut c = gpu.alloc_zeros::<f32>(4).ctx("c")?;
    let (d_a, d_b) = (
        gpu.alloc_zeros::<f64>(6).ctx("a")?,
        gpu.alloc_zeros::<f64>(6).ctx("b")?,
    );
    let mut d_c = gpu.alloc_zeros::<f64>(4).ctx("c")?;
    let r = st.matmul_lt(
        blas,
        &s,
        Epilogue::Gelu,
        &d_a,
        &d_b,
        &mut d_c,
        LtArgs::new(),
    );
    refused("GELU on f64", r, |e| {
        matches!(e, MatmulError::Unsupported { .. })
    })?;
    let r = st.matmul_lt(blas, &s, Epilogue::Bias, &a, &b, &mut c, LtArgs::new());
    refused("BIAS without a bias", r, |e| {
        matches!(
            e,
            MatmulError::EpilogueOperand {
                operand: "bias",
                missing: true,
                ..
            }
        )
    })?;
    let short = gpu.alloc_zeros::<f32>(1).ctx("bias")?;
    let r = st.matmul_lt(
        blas,
        &s,
        Epilogue::Bias,
        &a,
        &b,
        &mut c,
        LtArgs::new().bias(&short),
    );
    refused("bias of 1 for n = 2", r, |e| {
        matches!(
            e,
            MatmulError::BufferSize {
                operand: "bias",
                expected: 2,
                found: 1,
                ..
            }
        )
    })?;
    Ok(())
}

/// Outputs overlapping inputs (only reachable through shared borrows: a capture, or
/// views) are refused.
fn refused_in_capture(gpu: &BoundDevice<'_>, blas: &gpubind::blas::Blas) -> R {
    let (a, b) = (
        gpu.alloc_zeros::<f32>(6).ctx("a")?,
        gpu.alloc_zeros::<f32>(6).ctx("b")?,
    );
    let s = Matmul::new(2, 2, 3);
    let tiny = gpu.alloc_zeros::<f32>(1).ctx("tiny")?;
    let view = tiny.slice(..).ctx("view")?;
    let one = Matmul::new(1, 1, 1);
    let r = gpu
        .capture(|cap| cap.matmul(blas, &one, &view, &view, &tiny))
        .map(drop);
    refused("C = A", r, |e| {
        matches!(
            e,
            MatmulError::Aliasing {
                output: "C",
                input: "A"
            }
        )
    })?;
    let big = gpu.alloc_zeros::<f32>(64).ctx("big")?;
    let (y, z) = (
        big.slice(0..4).ctx("y")?,
        big.slice(2..2 + s.gelu_aux_len()).ctx("z")?,
    );
    let r = gpu
        .capture(|cap| {
            let args = CaptureLtArgs::new().aux_out(&z);
            cap.matmul_lt(blas, &s, Epilogue::GeluAux, &a, &b, &y, args)
        })
        .map(drop);
    refused("aux overlapping C", r, |e| {
        matches!(
            e,
            MatmulError::Aliasing {
                output: "C",
                input: "aux_out"
            }
        )
    })?;
    Ok(())
}

/// `y = alpha·op(A)·x + beta·y` on the host: the whole y buffer (elements between the
/// increments unchanged) and each element's error scale.
fn host_gemv(g: &Gemv, a: &[f64], x: &[f64], y: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let ld = g.lda.unwrap_or(match g.layout {
        Layout::RowMajor => g.n.max(1),
        Layout::ColMajor => g.m.max(1),
    });
    let (mut want, mut scale) = (y.to_vec(), vec![0.0; y.len()]);
    for i in 0..g.y_len() {
        let (mut sum, mut mag) = (0.0, 0.0);
        for j in 0..g.x_len() {
            let (r, c) = if g.transpose { (j, i) } else { (i, j) };
            let t = a[at(g.layout, ld, r, c)] * x[j * g.incx];
            sum += t;
            mag += t.abs();
        }
        let yi = y[i * g.incy];
        want[i * g.incy] = g.alpha * sum + g.beta * yi;
        scale[i * g.incy] = g.alpha.abs() * mag + (g.beta * yi).abs();
    }
    (want, scale)
}

/// Every transpose × layout × packed/padded (leading dimension and increments) for one
/// type.
fn gemv_sweep<T: El + gpubind::blas::BlasFloat>(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let stream = gpu.default_stream();
    for (m, n) in [(1, 1), (7, 5), (33, 64), (129, 17)] {
        for transpose in [false, true] {
            for layout in [Layout::RowMajor, Layout::ColMajor] {
                for padded in [false, true] {
                    let mut g = Gemv::new(m, n).scaled(1.25, -0.5);
                    g.transpose = transpose;
                    g.layout = layout;
                    let inner = if layout == Layout::RowMajor { n } else { m };
                    let outer = if layout == Layout::RowMajor { m } else { n };
                    let mut ld = inner;
                    if padded {
                        ld += 3;
                        g = g.with_lda(ld).with_inc(2, 3);
                    }
                    let a_len = (outer - 1) * ld + inner;
                    let (a, af) = random::<T>(rng, a_len);
                    let (x, xf) = random::<T>(rng, (g.x_len() - 1) * g.incx + 1);
                    let (y0, yf) = random::<T>(rng, (g.y_len() - 1) * g.incy + 1);
                    let (da, dx) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&x).ctx("x")?);
                    let mut dy = gpu.clone_htod(&y0).ctx("y")?;
                    let what = format!(
                        "gemv {:?} {m}x{n} transpose={transpose} {layout:?} padded={padded}",
                        T::DATA_TYPE
                    );
                    stream.gemv(&blas, &g, &da, &dx, &mut dy).ctx(&what)?;
                    let got = dtoh_f64(gpu, &dy)?;
                    let (want, scale) = host_gemv(&g, &af, &xf, &yf);
                    close(&what, &got, &want, &scale, T::TOL)?;
                }
            }
        }
    }
    Ok(())
}

fn gemv_types_transposes_and_layouts_match_the_host(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    gemv_sweep::<f32>(gpu, &mut rng)?;
    gemv_sweep::<f64>(gpu, &mut rng)
}

fn asum_case<T: El + gpubind::blas::BlasFloat>(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let stream = gpu.default_stream();
    for (len, inc) in [(1, 1), (1000, 1), (1001, 3), (4096, 7)] {
        let (x, xf) = random::<T>(rng, len);
        let dx = gpu.clone_htod(&x).ctx("x")?;
        let want: f64 = xf.iter().step_by(inc).map(|v| v.abs()).sum();
        let what = format!("asum {:?} of {len} step {inc}", T::DATA_TYPE);
        // A reduction of up to 4096 terms: ten times a product's tolerance.
        let tol = 10.0 * T::TOL;
        let host = stream.asum(&blas, &dx, inc).ctx(&what)?.f();
        close(&what, &[host], &[want], &[want], tol)?;
        let mut out = gpu.clone_htod(&[T::of(-7.0)]).ctx("out")?;
        stream.asum_into(&blas, &dx, inc, &mut out).ctx(&what)?;
        let dev = dtoh_f64(gpu, &out)?;
        close(
            &format!("{what} into device memory"),
            &dev,
            &[want],
            &[want],
            tol,
        )?;
    }
    let empty = gpu.alloc_zeros::<T>(0).ctx("empty")?;
    let mut out = gpu.clone_htod(&[T::of(5.0)]).ctx("out")?;
    ensure!(
        stream.asum(&blas, &empty, 1).ctx("asum of nothing")?.f() == 0.0,
        "asum of nothing is not 0"
    );
    stream
        .asum_into(&blas, &empty, 1, &mut out)
        .ctx("asum_into of nothing")?;
    ensure!(
        dtoh_f64(gpu, &out)? == [0.0],
        "asum_into of nothing did not write 0"
    );
    Ok(())
}

fn asum_to_host_and_device_matches_the_host(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    asum_case::<f32>(gpu, &mut rng)?;
    asum_case::<f64>(gpu, &mut rng)
}

/// Three groups of different shapes, transposes and layouts (one of two products), in
/// one grouped call, against the host; the products' operands at offsets of shared
/// buffers, with gaps left untouched.
fn grouped_case<T: El>(gpu: &BoundDevice<'_>, rng: &mut impl Rng) -> R {
    let shapes = [
        Matmul::new(16, 24, 32).transpose_b().scaled(1.0, 0.0),
        Matmul::new(7, 40, 9).transpose_a().scaled(0.5, -1.0),
        Matmul::new(33, 8, 64).col_major().scaled(2.0, 0.25),
    ];
    let counts = [2usize, 1, 1];
    let (mut oa, mut ob, mut oc) = (0, 0, 0);
    let mut groups = Vec::new();
    let mut placed = Vec::new();
    for (s, &count) in shapes.iter().zip(&counts) {
        let mut g = GemmGroup::new(*s);
        for _ in 0..count {
            g = g.problem(oa, ob, oc);
            placed.push((*s, oa, ob, oc));
            // A gap of at least 5 elements after each matrix, the next one starting
            // 16-byte aligned.
            let next = |o: usize, len: usize| (o + len + 5).next_multiple_of(8);
            oa = next(oa, s.m * s.k);
            ob = next(ob, s.k * s.n);
            oc = next(oc, s.m * s.n);
        }
        groups.push(g);
    }
    let (a, af) = random::<T>(rng, oa);
    let (b, bf) = random::<T>(rng, ob);
    let (c0, cf) = random::<T>(rng, oc);
    let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
    let mut dc = gpu.clone_htod(&c0).ctx("c")?;
    let blas = gpu.new_blas().ctx("new_blas")?;
    let what = format!("grouped {:?}", T::DATA_TYPE);
    match gpu
        .default_stream()
        .matmul_grouped(&blas, &groups, &da, &db, &mut dc)
    {
        Err(Error::Matmul(e @ MatmulError::NeedsCublas { .. })) => {
            return Err(skip(&e.to_string()));
        }
        r => r.ctx(&what)?,
    }
    let got = dtoh_f64(gpu, &dc)?;
    let (mut want, mut scale) = (cf.clone(), vec![0.0; cf.len()]);
    for (s, oa, ob, oc) in placed {
        let span_c = s.m * s.n;
        let (w, sc) = host_gemm(&s, &af[oa..], &bf[ob..], &cf[oc..oc + span_c]);
        want[oc..oc + span_c].copy_from_slice(&w);
        scale[oc..oc + span_c].copy_from_slice(&sc);
    }
    close(&what, &got, &want, &scale, T::TOL)
}

fn grouped_gemm_of_three_shapes_matches_the_host(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    grouped_case::<f16>(gpu, &mut rng)?;
    grouped_case::<bf16>(gpu, &mut rng)
}

/// alpha and beta from device memory: eagerly for each type, and in a graph launched
/// twice with new scales written between the launches by a copy graph (alpha 2, beta 0,
/// then alpha 3, beta 1: C = 2·AB, then 5·AB).
fn device_scalars_eager_and_between_graph_launches(gpu: &BoundDevice<'_>) -> R {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let blas = gpu.new_blas().ctx("new_blas")?;
    device_scalars_eager::<f32>(gpu, &blas, &mut rng)?;
    device_scalars_eager::<f64>(gpu, &blas, &mut rng)?;
    device_scalars_eager::<bf16>(gpu, &blas, &mut rng)?;
    let s = Matmul::new(24, 16, 40).transpose_b();
    let (a, af) = random::<f32>(&mut rng, s.m * s.k);
    let (b, bf) = random::<f32>(&mut rng, s.n * s.k);
    let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
    let c = gpu.alloc_zeros::<f32>(s.m * s.n).ctx("c")?;
    let scales = gpu.alloc_zeros::<f32>(2).ctx("scales")?;
    let opts = gpubind::PinnedOptions::default();
    let first = gpu.pinned_from_slice(&[2.0f32, 0.0], opts).ctx("pinned")?;
    let second = gpu.pinned_from_slice(&[3.0f32, 1.0], opts).ctx("pinned")?;
    let write1 = gpu
        .capture(|cap| cap.copy_from_host(&first, &scales))
        .ctx("capture write 1")?;
    let write2 = gpu
        .capture(|cap| cap.copy_from_host(&second, &scales))
        .ctx("capture write 2")?;
    let product = gpu
        .capture(|cap| cap.matmul_device_scalars(&blas, &s, &scales, &da, &db, &c))
        .ctx("capture the product")?;
    // A host-scalar product on the same handle right after: the pointer mode was set back.
    let mut host = gpu.alloc_zeros::<f32>(s.m * s.n).ctx("host c")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let on = gpu.on(&stream).ctx("on")?;
    on.matmul(&blas, &s.scaled(0.5, 0.0), &da, &db, &mut host)
        .ctx("host-scalar product after the capture")?;
    let zeros = vec![0.0; s.m * s.n];
    let (half, hscale) = host_gemm(&s.scaled(0.5, 0.0), &af, &bf, &zeros);
    close(
        "host scalars after device ones",
        &dtoh_f64(gpu, &host)?,
        &half,
        &hscale,
        1e-5,
    )?;
    let w1 = write1.instantiate().ctx("instantiate")?;
    let w2 = write2.instantiate().ctx("instantiate")?;
    let e1 = product.instantiate().ctx("instantiate")?;
    w1.launch(&on).ctx("write 1")?;
    e1.launch(&on).ctx("launch 1")?;
    let (want1, sc1) = host_gemm(&s.scaled(2.0, 0.0), &af, &bf, &zeros);
    close(
        "graph launch 1 (alpha 2, beta 0)",
        &dtoh_f64(gpu, &c)?,
        &want1,
        &sc1,
        1e-5,
    )?;
    // The write runs on another stream: the product's read claim orders the launch after it.
    let other = gpu.new_stream().ctx("stream")?;
    w2.launch(&gpu.on(&other).ctx("on")?).ctx("write 2")?;
    e1.launch(&on).ctx("launch 2")?;
    let (want2, sc2) = host_gemm(&s.scaled(3.0, 1.0), &af, &bf, &want1);
    close(
        "graph launch 2 (alpha 3, beta 1)",
        &dtoh_f64(gpu, &c)?,
        &want2,
        &sc2,
        1e-5,
    )
}

fn device_scalars_eager<T: El>(
    gpu: &BoundDevice<'_>,
    blas: &gpubind::blas::Blas,
    rng: &mut impl Rng,
) -> R
where
    T::Scale: El,
{
    let s = Matmul::new(9, 13, 21).transpose_a().scaled(0.75, -0.5);
    let (a, af) = random::<T>(rng, s.m * s.k);
    let (b, bf) = random::<T>(rng, s.k * s.n);
    let (c0, cf) = random::<T>(rng, s.m * s.n);
    let (da, db) = (gpu.clone_htod(&a).ctx("a")?, gpu.clone_htod(&b).ctx("b")?);
    let mut dc = gpu.clone_htod(&c0).ctx("c")?;
    let scales = gpu
        .clone_htod(&[<T::Scale as El>::of(0.75), <T::Scale as El>::of(-0.5)])
        .ctx("scales")?;
    // The shape's own alpha and beta must be ignored.
    let ignored = s.scaled(100.0, 100.0);
    let what = format!("device scalars {:?}", T::DATA_TYPE);
    gpu.default_stream()
        .matmul_device_scalars(blas, &ignored, &scales, &da, &db, &mut dc)
        .ctx(&what)?;
    let (want, scale) = host_gemm(&s, &af, &bf, &cf);
    close(&what, &dtoh_f64(gpu, &dc)?, &want, &scale, T::TOL)?;
    // The same product through `Enqueue` on a stream, C by `&`.
    let dc2 = gpu.clone_htod(&c0).ctx("c")?;
    let what = format!("{what} through Enqueue");
    let mut stream = gpu.default_stream();
    Enqueue::matmul_device_scalars(&mut stream, blas, &ignored, &scales, &da, &db, &dc2)
        .ctx(&what)?;
    close(&what, &dtoh_f64(gpu, &dc2)?, &want, &scale, T::TOL)
}

/// The refusals of GEMV, ASUM, grouped GEMM and device scalars: typed, before anything
/// runs.
fn vector_grouped_and_scalar_refusals_are_typed(gpu: &BoundDevice<'_>) -> R {
    let blas = gpu.new_blas().ctx("new_blas")?;
    let st = gpu.default_stream();
    let a = gpu.alloc_zeros::<f32>(6).ctx("a")?;
    let x = gpu.alloc_zeros::<f32>(3).ctx("x")?;
    let mut y = gpu.alloc_zeros::<f32>(3).ctx("y")?;
    let g = Gemv::new(2, 3);
    refused(
        "gemv y of 3 for 2 rows",
        st.gemv(&blas, &g, &a, &x, &mut y),
        |e| {
            matches!(
                e,
                MatmulError::BufferSize {
                    operand: "y",
                    expected: 2,
                    found: 3,
                    exact: true,
                    ..
                }
            )
        },
    )?;
    let mut y2 = gpu.alloc_zeros::<f32>(2).ctx("y2")?;
    refused(
        "gemv x of 3 for Aᵀ",
        st.gemv(&blas, &g.transpose(), &a, &x, &mut y2),
        |e| {
            matches!(
                e,
                MatmulError::BufferSize {
                    operand: "x",
                    expected: 2,
                    ..
                }
            )
        },
    )?;
    refused(
        "gemv incx 0",
        st.gemv(&blas, &g.with_inc(0, 1), &a, &x, &mut y2),
        |e| {
            matches!(
                e,
                MatmulError::ZeroIncrement {
                    routine: "gemv",
                    operand: "x"
                }
            )
        },
    )?;
    refused(
        "gemv lda 2 for 3 columns",
        st.gemv(&blas, &g.with_lda(2), &a, &x, &mut y2),
        |e| {
            matches!(
                e,
                MatmulError::LeadingDimension {
                    operand: "A",
                    ld: 2,
                    min: 3
                }
            )
        },
    )?;
    refused("asum incx 0", st.asum(&blas, &x, 0).map(drop), |e| {
        matches!(
            e,
            MatmulError::ZeroIncrement {
                routine: "asum",
                ..
            }
        )
    })?;
    refused(
        "asum into 3 elements",
        st.asum_into(&blas, &a, 1, &mut y),
        |e| {
            matches!(
                e,
                MatmulError::BufferSize {
                    operand: "result",
                    found: 3,
                    ..
                }
            )
        },
    )?;
    let s = Matmul::new(2, 2, 3);
    let scales3 = gpu.alloc_zeros::<f32>(3).ctx("scales")?;
    let mut c = gpu.alloc_zeros::<f32>(4).ctx("c")?;
    refused(
        "3 device scalars",
        st.matmul_device_scalars(&blas, &s, &scales3, &a, &a, &mut c),
        |e| matches!(e, MatmulError::ScalarBuffer { found: 3 }),
    )?;
    let captured = gpu.capture(|cap| cap.matmul_device_scalars(&blas, &s, &scales3, &a, &a, &c));
    refused("3 device scalars, captured", captured.map(drop), |e| {
        matches!(e, MatmulError::ScalarBuffer { found: 3 })
    })?;
    let (ha, hb) = (
        gpu.alloc_zeros::<f16>(64).ctx("a")?,
        gpu.alloc_zeros::<f16>(64).ctx("b")?,
    );
    let mut hc = gpu.alloc_zeros::<f16>(64).ctx("c")?;
    let sq = Matmul::new(4, 4, 4);
    let too_far = [
        GemmGroup::new(sq).problem(0, 0, 0),
        GemmGroup::new(sq).problem(0, 60, 16),
    ];
    refused(
        "grouped B past the end",
        st.matmul_grouped(&blas, &too_far, &ha, &hb, &mut hc),
        |e| {
            matches!(e, MatmulError::InGroup { group: 1, problem: 0, error }
            if matches!(**error, MatmulError::BufferSize { operand: "B", expected: 76, found: 64, .. }))
        },
    )?;
    let overlap = [GemmGroup::new(sq).problem(0, 0, 0).problem(16, 16, 8)];
    refused(
        "grouped outputs overlapping",
        st.matmul_grouped(&blas, &overlap, &ha, &hb, &mut hc),
        |e| {
            matches!(e, MatmulError::InGroup { group: 0, problem: 1, error }
            if matches!(**error, MatmulError::Aliasing { output: "C", .. }))
        },
    )?;
    let fa = gpu.alloc_zeros::<f32>(16).ctx("a")?;
    let mut fc = gpu.alloc_zeros::<f32>(16).ctx("c")?;
    let one = [GemmGroup::new(sq).problem(0, 0, 0)];
    refused(
        "grouped f32",
        st.matmul_grouped(&blas, &one, &fa, &fa, &mut fc),
        |e| matches!(e, MatmulError::Unsupported { dtype: "f32", .. }),
    )?;
    Ok(())
}

/// `C = X·W + b + beta·addend` with the addend a buffer of its own (f32 and bf16, beta 1
/// and 0.5): C's old contents (NaN) are not read and the addend is left as it was; a
/// captured product equals the eager one bit for bit; and misuse is refused: an addend
/// of another length, beta 0 (it would not be read), an addend that is C (captures take
/// outputs by `&`, so only they can try).
fn lt_addend<T: El>(gpu: &BoundDevice<'_>) -> R {
    let (m, n, k) = (24usize, 40usize, 16usize);
    let blas = gpu.new_blas().ctx("new_blas")?;
    let st = gpu.default_stream();
    let (x, xf) = halves::<T>(m * k, 1);
    let (w, wf) = halves::<T>(k * n, 2);
    let (r, rf) = halves::<T>(m * n, 5);
    let bias_f: Vec<f64> = (0..n).map(|j| ((j % 7) as f64 - 3.0) * 0.25).collect();
    let bias_t: Vec<T> = bias_f.iter().map(|&v| T::of(v)).collect();
    let (dx, dw, db, dr) = (
        gpu.clone_htod(&x).ctx("x")?,
        gpu.clone_htod(&w).ctx("w")?,
        gpu.clone_htod(&bias_t).ctx("bias")?,
        gpu.clone_htod(&r).ctx("addend")?,
    );
    let p = host_product(&Matmul::new(m, n, k), &xf, &wf);
    let nan = vec![T::of(f64::NAN); m * n];
    let name = format!("{:?} addend", T::DATA_TYPE);
    let mut eager = None;
    for beta in [1.0, 0.5] {
        let s = Matmul::new(m, n, k).scaled(1.0, beta);
        let mut y = gpu.clone_htod(&nan).ctx("y")?;
        let args = LtArgs::new().bias(&db).addend(&dr);
        st.matmul_lt(&blas, &s, Epilogue::Bias, &dx, &dw, &mut y, args)
            .ctx("addend product")?;
        let got = dtoh_f64(gpu, &y)?;
        let want: Vec<f64> = (0..m * n)
            .map(|ij| p[ij].0 + bias_f[ij % n] + beta * rf[ij])
            .collect();
        let sc: Vec<f64> = (0..m * n).map(|ij| p[ij].1 + 1.0 + rf[ij].abs()).collect();
        close(
            &format!("{name}, beta {beta}"),
            &got,
            &want,
            &sc,
            T::TOL.max(1e-5),
        )?;
        ensure!(
            gpu.dtoh(&dr).ctx("dtoh")? == r,
            "{name}: the addend was written"
        );
        if beta == 1.0 {
            eager = Some(y);
        }
    }
    let eager = eager.ok_or("no eager product")?;
    let s = Matmul::new(m, n, k).scaled(1.0, 1.0);
    let g = gpu.clone_htod(&nan).ctx("captured y")?;
    let graph = gpu
        .capture(|cap| {
            let args = CaptureLtArgs::new().bias(&db).addend(&dr);
            cap.matmul_lt(&blas, &s, Epilogue::Bias, &dx, &dw, &g, args)
        })
        .ctx("capture")?;
    graph
        .instantiate()
        .ctx("instantiate")?
        .launch(&gpu.default_stream())
        .ctx("launch")?;
    same(gpu, &format!("{name}: captured product"), &g, &eager)?;
    let short = gpu.alloc_zeros::<T>(m * n - 1).ctx("short")?;
    let mut y = gpu.alloc_zeros::<T>(m * n).ctx("y")?;
    refused(
        &format!("{name} of another length"),
        st.matmul_lt(
            &blas,
            &s,
            Epilogue::Default,
            &dx,
            &dw,
            &mut y,
            LtArgs::new().addend(&short),
        ),
        |e| {
            matches!(
                e,
                MatmulError::BufferSize {
                    operand: "addend",
                    ..
                }
            )
        },
    )?;
    let zero_beta = Matmul::new(m, n, k);
    refused(
        &format!("{name} with beta 0"),
        st.matmul_lt(
            &blas,
            &zero_beta,
            Epilogue::Default,
            &dx,
            &dw,
            &mut y,
            LtArgs::new().addend(&dr),
        ),
        |e| matches!(e, MatmulError::UnreadAddend),
    )?;
    let r = gpu
        .capture(|cap| {
            let args = CaptureLtArgs::new().addend(&g);
            cap.matmul_lt(&blas, &s, Epilogue::Default, &dx, &dw, &g, args)
        })
        .map(drop);
    refused(&format!("{name} that is C"), r, |e| {
        matches!(
            e,
            MatmulError::Aliasing {
                output: "C",
                input: "addend"
            }
        )
    })
}

/// [`lt_addend`] in f32 and bf16.
fn lt_addend_replaces_c(gpu: &BoundDevice<'_>) -> R {
    lt_addend::<f32>(gpu)?;
    lt_addend::<bf16>(gpu)
}

fn main() {
    run_suite(
        "gpu_blas",
        &[
            ("gemm_types_transposes_and_layouts_match_the_host", || {
                on_device0(gemm_types_transposes_and_layouts_match_the_host)
            }),
            ("strided_batches_match_the_host", || {
                on_device0(strided_batches_match_the_host)
            }),
            ("mixed_products_match_the_host", || {
                on_device0(mixed_products_match_the_host)
            }),
            ("enqueue_serves_eager_and_captured_steps", || {
                on_device0(enqueue_serves_eager_and_captured_steps)
            }),
            ("lt_epilogues_match_host_math", || {
                on_device0(lt_epilogues_match_host_math)
            }),
            ("lt_addend_replaces_c", || on_device0(lt_addend_replaces_c)),
            (
                "captured_products_equal_eager_with_the_blas_dropped",
                || on_device0(captured_products_equal_eager_with_the_blas_dropped),
            ),
            ("two_streams_read_one_weight", || {
                on_device0(two_streams_read_one_weight)
            }),
            ("bad_input_is_a_typed_error", || {
                on_device0(bad_input_is_a_typed_error)
            }),
            ("gemv_types_transposes_and_layouts_match_the_host", || {
                on_device0(gemv_types_transposes_and_layouts_match_the_host)
            }),
            ("asum_to_host_and_device_matches_the_host", || {
                on_device0(asum_to_host_and_device_matches_the_host)
            }),
            ("grouped_gemm_of_three_shapes_matches_the_host", || {
                on_device0(grouped_gemm_of_three_shapes_matches_the_host)
            }),
            ("device_scalars_eager_and_between_graph_launches", || {
                on_device0(device_scalars_eager_and_between_graph_launches)
            }),
            ("vector_grouped_and_scalar_refusals_are_typed", || {
                on_device0(vector_grouped_and_scalar_refusals_are_typed)
            }),
        ],
    )
}
