//! GPU tests of timed algorithm selection (`gpubind::blas::AlgoSelection`): timed products
//! compute what the heuristic's do and never touch their own buffers while timing
//! (an accumulating product adds once), a capture runs the algorithm an eager product
//! timed (bit for bit, with a new `Blas`), and a shape first met inside a capture is timed
//! there without breaking it; f32 layouts with transposes and padded leading dimensions
//! and a bias-gradient epilogue time on scratch that fits them. Without a driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_blas_select` (on a GPU machine, or the built binary).

#[macro_use]
mod common;

use common::{Ctx, on_device0, run_suite};
use gpubind::blas::{AlgoSelection, CaptureLtArgs, Enqueue, Epilogue, Layout, LtArgs, Matmul};
use gpubind::{BoundDevice, DeviceSlice};
use half::bf16;

type R = Result<(), String>;

/// `n` bf16 values in [-1, 1), a fixed pattern seeded by `salt`.
fn pattern(n: usize, salt: usize) -> Vec<bf16> {
    (0..n)
        .map(|i| bf16::from_f32((((i * 7919 + salt * 104_729) % 2003) as f32) / 1001.5 - 1.0))
        .collect()
}

/// The largest |a − b| relative to the largest |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// `y = gelu(x·Wᵀ + b)` (keeping the pre-activation) with `blas`, on the default stream.
fn gelu_layer(
    gpu: &BoundDevice<'_>,
    blas: &gpubind::blas::Blas,
    shape: &Matmul,
    (x, w, b): (&DeviceSlice<bf16>, &DeviceSlice<bf16>, &DeviceSlice<bf16>),
) -> Result<(Vec<bf16>, Vec<bf16>), String> {
    let mut y = gpu.alloc_zeros::<bf16>(shape.m * shape.n).ctx("alloc y")?;
    let mut z = gpu
        .alloc_zeros::<bf16>(shape.gelu_aux_len())
        .ctx("alloc z")?;
    let args = LtArgs::new().bias(b).aux_out(&mut z);
    gpu.default_stream()
        .matmul_lt(blas, shape, Epilogue::GeluAuxBias, x, w, &mut y, args)
        .ctx("matmul_lt")?;
    Ok((gpu.dtoh(&y).ctx("dtoh y")?, gpu.dtoh(&z).ctx("dtoh z")?))
}

/// A timed GELU layer equals the heuristic's within bf16 rounding, and a timed
/// accumulating f32 product (`C = A·B + C`) adds exactly once: the timing runs touch
/// scratch memory, never the product's C.
fn timed_products_match_and_leave_their_buffers_alone(gpu: &BoundDevice<'_>) -> R {
    let (m, n, k) = (1024, 768, 768);
    let shape = Matmul::new(m, n, k).transpose_b();
    let x = gpu.clone_htod(&pattern(m * k, 1)).ctx("htod")?;
    let w = gpu.clone_htod(&pattern(n * k, 2)).ctx("htod")?;
    let b = gpu.clone_htod(&pattern(n, 3)).ctx("htod")?;
    let heuristic = gpu.new_blas().ctx("new_blas")?;
    ensure!(
        heuristic.algo_selection() == AlgoSelection::Heuristic,
        "the default selection is not the heuristic"
    );
    let timed = gpu.new_blas().ctx("new_blas")?;
    timed.set_algo_selection(AlgoSelection::timed());
    ensure!(
        timed.algo_selection() == AlgoSelection::timed(),
        "the selection did not stick"
    );
    let (yh, zh) = gelu_layer(gpu, &heuristic, &shape, (&x, &w, &b))?;
    let (yt, zt) = gelu_layer(gpu, &timed, &shape, (&x, &w, &b))?;
    // Different algorithms may split k differently: bf16 outputs agree to its rounding.
    let (dy, dz) = (
        rel_diff(&f32s(&yt), &f32s(&yh)),
        rel_diff(&f32s(&zt), &f32s(&zh)),
    );
    ensure!(
        dy < 2e-2 && dz < 2e-2,
        "timed differs from heuristic: y {dy:e}, z {dz:e}"
    );
    ensure!(
        yt.iter().any(|v| v.to_f32() != 0.0),
        "the timed product wrote nothing"
    );

    // f32 (no TF32), C = 1·A·B + 1·C with C = 1 everywhere: the host's sum plus one.
    let (m, n, k) = (384, 256, 512);
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect();
    let bm: Vec<f32> = (0..k * n).map(|i| ((i % 11) as f32 - 5.0) / 8.0).collect();
    let acc = Matmul::new(m, n, k).scaled(1.0, 1.0);
    let da = gpu.clone_htod(&a).ctx("htod")?;
    let db = gpu.clone_htod(&bm).ctx("htod")?;
    let mut dc = gpu.clone_htod(&vec![1f32; m * n]).ctx("htod")?;
    gpu.default_stream()
        .matmul_lt(
            &timed,
            &acc,
            Epilogue::Default,
            &da,
            &db,
            &mut dc,
            LtArgs::new(),
        )
        .ctx("accumulating matmul_lt")?;
    let got = gpu.dtoh(&dc).ctx("dtoh")?;
    for (r, c) in [(0, 0), (m - 1, n - 1), (m / 2, n / 3), (7, n - 2)] {
        let want: f32 = 1.0 + (0..k).map(|j| a[r * k + j] * bm[j * n + c]).sum::<f32>();
        let g = got[r * n + c];
        ensure!(
            (g - want).abs() <= 1e-3 * want.abs().max(1.0),
            "C[{r},{c}] = {g}, want {want}: the product accumulated more than once"
        );
    }
    Ok(())
}

/// f32 products with transposes, column-major layout and padded leading dimensions, and
/// bf16 BGRADB (bias gradient of B, through the row-major swap): timed equal the
/// heuristic's within their rounding, so the scratch the timing ran on had room for
/// every layout and operand.
fn timed_layouts_and_bias_gradients_match(gpu: &BoundDevice<'_>) -> R {
    let heuristic = gpu.new_blas().ctx("new_blas")?;
    let timed = gpu.new_blas().ctx("new_blas")?;
    timed.set_algo_selection(AlgoSelection::timed());
    let (m, n, k) = (320, 288, 256);
    let shapes = [
        Matmul::new(m, n, k).transpose_a(),
        Matmul::new(m, n, k).transpose_b().col_major(),
        Matmul::new(m, n, k).with_ld(k + 8, n + 16, n + 4),
        Matmul::new(m, n, k)
            .transpose_a()
            .transpose_b()
            .col_major()
            .with_ld(k + 4, n + 8, m + 12),
    ];
    for (i, shape) in shapes.iter().enumerate() {
        // Elements a stored rows × cols matrix spans: (outer − 1)·ld + inner.
        let col = shape.layout == Layout::ColMajor;
        let span = |rows: usize, cols: usize, ld: Option<usize>| {
            let (inner, outer) = if col { (rows, cols) } else { (cols, rows) };
            (outer - 1) * ld.unwrap_or(inner) + inner
        };
        let (ar, ac) = if shape.transpose_a { (k, m) } else { (m, k) };
        let (br, bc) = if shape.transpose_b { (n, k) } else { (k, n) };
        let a: Vec<f32> = f32s(&pattern(span(ar, ac, shape.lda), 10 + i));
        let b: Vec<f32> = f32s(&pattern(span(br, bc, shape.ldb), 20 + i));
        let (da, db) = (
            gpu.clone_htod(&a).ctx("htod")?,
            gpu.clone_htod(&b).ctx("htod")?,
        );
        let clen = span(m, n, shape.ldc);
        let mut out = Vec::new();
        for blas in [&heuristic, &timed] {
            let mut c = gpu.alloc_zeros::<f32>(clen).ctx("alloc")?;
            gpu.default_stream()
                .matmul_lt(
                    blas,
                    shape,
                    Epilogue::Default,
                    &da,
                    &db,
                    &mut c,
                    LtArgs::new(),
                )
                .ctx("f32 matmul_lt")?;
            out.push(gpu.dtoh(&c).ctx("dtoh")?);
        }
        let d = rel_diff(&out[1], &out[0]);
        ensure!(
            d < 1e-5,
            "f32 shape {i}: timed differs from heuristic by {d:e}"
        );
    }
    // dW = dyᵀ·x with the bias gradient Σ_rows dy (BGRADA of the row-major product).
    let (rows, outf, inf) = (1024, 384, 256);
    let shape = Matmul::new(outf, inf, rows).transpose_a();
    let dy = gpu.clone_htod(&pattern(rows * outf, 30)).ctx("htod")?;
    let x = gpu.clone_htod(&pattern(rows * inf, 31)).ctx("htod")?;
    let mut got = Vec::new();
    for blas in [&heuristic, &timed] {
        let mut dw = gpu.alloc_zeros::<bf16>(outf * inf).ctx("alloc")?;
        let mut dbias = gpu.alloc_zeros::<bf16>(outf).ctx("alloc")?;
        let args = LtArgs::new().bias_grad(&mut dbias);
        gpu.default_stream()
            .matmul_lt(blas, &shape, Epilogue::BGradA, &dy, &x, &mut dw, args)
            .ctx("BGRADA matmul_lt")?;
        got.push((
            f32s(&gpu.dtoh(&dw).ctx("dtoh")?),
            f32s(&gpu.dtoh(&dbias).ctx("dtoh")?),
        ));
    }
    let (dw, dbias) = (
        rel_diff(&got[1].0, &got[0].0),
        rel_diff(&got[1].1, &got[0].1),
    );
    ensure!(
        dw < 2e-2 && dbias < 2e-2,
        "BGRADA: timed differs: dW {dw:e}, bias {dbias:e}"
    );
    ensure!(
        got[1].1.iter().any(|v| *v != 0.0),
        "the timed bias gradient is zero"
    );
    Ok(())
}

/// `dpre = (dz·w2) ⊙ gelu'(pre)` (DGELU) into `out`, issued on `e`.
fn dgelu<'b>(
    e: &mut impl Enqueue<'b>,
    blas: &gpubind::blas::Blas,
    shape: &Matmul,
    (dz, w2, pre): (
        &'b DeviceSlice<bf16>,
        &'b DeviceSlice<bf16>,
        &'b DeviceSlice<bf16>,
    ),
    out: &'b DeviceSlice<bf16>,
) -> gpubind::Result<()> {
    let args = CaptureLtArgs::new().aux(pre);
    e.matmul_lt(blas, shape, Epilogue::DGelu, dz, w2, out, args)
}

/// An eager timed product, then the same shape captured with a new timed `Blas`: the
/// graph computes the eager bits (one choice per device). A shape first met inside a
/// capture is timed there: the capture still instantiates, and its graph computes what
/// the same product then computes eagerly.
fn captures_run_the_timed_choice(gpu: &BoundDevice<'_>) -> R {
    let (n, out2, inp2) = (768, 1024, 2048);
    let shape = Matmul::new(n, inp2, out2);
    let dz = gpu.clone_htod(&pattern(n * out2, 4)).ctx("htod")?;
    let w2 = gpu.clone_htod(&pattern(out2 * inp2, 5)).ctx("htod")?;
    let pre = gpu
        .clone_htod(&pattern(shape.gelu_aux_len(), 6))
        .ctx("htod")?;
    let ins = (&dz, &w2, &pre);
    let eager_blas = gpu.new_blas().ctx("new_blas")?;
    eager_blas.set_algo_selection(AlgoSelection::timed());
    let out = gpu.alloc_zeros::<bf16>(n * inp2).ctx("alloc")?;
    let mut stream = gpu.default_stream();
    dgelu(&mut stream, &eager_blas, &shape, ins, &out).ctx("eager dgelu")?;
    let eager = gpu.dtoh(&out).ctx("dtoh")?;

    let graph_out = gpu.alloc_zeros::<bf16>(n * inp2).ctx("alloc")?;
    let cap_blas = gpu.new_blas().ctx("new_blas")?;
    cap_blas.set_algo_selection(AlgoSelection::timed());
    let graph = gpu
        .capture(|cap| dgelu(cap, &cap_blas, &shape, ins, &graph_out))
        .ctx("capture")?;
    drop(cap_blas);
    graph
        .instantiate()
        .ctx("instantiate")?
        .launch(&stream)
        .ctx("launch")?;
    ensure!(
        gpu.dtoh(&graph_out).ctx("dtoh")? == eager,
        "the captured product differs from the eager timed one"
    );

    // A shape no product has run: timed inside the capture.
    let (n2, o2, i2) = (640, 768, 1536);
    let fresh = Matmul::new(n2, i2, o2);
    let dz2 = gpu.clone_htod(&pattern(n2 * o2, 7)).ctx("htod")?;
    let w22 = gpu.clone_htod(&pattern(o2 * i2, 8)).ctx("htod")?;
    let pre2 = gpu
        .clone_htod(&pattern(fresh.gelu_aux_len(), 9))
        .ctx("htod")?;
    let ins2 = (&dz2, &w22, &pre2);
    let cap2 = gpu.alloc_zeros::<bf16>(n2 * i2).ctx("alloc")?;
    let blas2 = gpu.new_blas().ctx("new_blas")?;
    blas2.set_algo_selection(AlgoSelection::timed());
    let graph2 = gpu
        .capture(|cap| dgelu(cap, &blas2, &fresh, ins2, &cap2))
        .ctx("capture of a new shape")?;
    graph2
        .instantiate()
        .ctx("instantiate")?
        .launch(&stream)
        .ctx("launch")?;
    let eager2 = gpu.alloc_zeros::<bf16>(n2 * i2).ctx("alloc")?;
    dgelu(&mut stream, &eager_blas, &fresh, ins2, &eager2).ctx("eager dgelu")?;
    let (g, e) = (gpu.dtoh(&cap2).ctx("dtoh")?, gpu.dtoh(&eager2).ctx("dtoh")?);
    ensure!(
        g == e,
        "the product timed in a capture differs from its eager run"
    );
    ensure!(
        g.iter().any(|v| v.to_f32() != 0.0),
        "the captured product wrote nothing"
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_blas_select",
        &[
            ("timed_products_match_and_leave_their_buffers_alone", || {
                on_device0(timed_products_match_and_leave_their_buffers_alone)
            }),
            ("timed_layouts_and_bias_gradients_match", || {
                on_device0(timed_layouts_and_bias_gradients_match)
            }),
            ("captures_run_the_timed_choice", || {
                on_device0(captures_run_the_timed_choice)
            }),
        ],
    )
}
