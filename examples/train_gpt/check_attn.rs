//! `--check-attention`: each fused attention (the tiled kernels; in bf16 also the mma
//! ones) against the unfused one on random q, k, v and output gradients, in fp32 and
//! bf16, at the shapes of `--model gpt2` and `--model small` and at sequence lengths that
//! are not multiples of the tiles: the output and the three gradients must agree within
//! [`tolerance`] of the largest magnitude, and every head's row (64 elements) of the
//! output, dk and dv within [`row_tolerance`] of its own size; each pass is timed.

use crate::GptError;
use crate::attend::{self, Bwd, Fwd, Saved};
use crate::attention::{Attention, HEAD_SIZE};
use crate::kernels::Kernels;
use crate::model::Dims;
use crate::precision::Act;
use gpubind::blas::Blas;
use gpubind::{BoundDevice, BoundStream, DeviceSlice};
use std::time::Instant;

/// The shapes checked: name, batch, sequence length, heads (head size 64).
const SHAPES: [(&str, usize, usize, usize); 5] = [
    ("gpt2", 8, 1024, 12),
    ("small", 8, 256, 6),
    ("T=77", 2, 77, 3),
    ("T=200", 1, 200, 2),
    ("T=1", 1, 1, 1),
];

/// Calls per timing.
const TIMED_CALLS: usize = 20;

/// The largest difference allowed between the paths, relative to the largest magnitude
/// of the unfused result: both sum in f32 in other orders; in bf16 the unfused path also
/// rounds the scores and probabilities to bf16, which the fused one keeps in f32.
pub fn tolerance(bf16: bool) -> f32 {
    if bf16 { 5e-2 } else { 1e-4 }
}

/// The largest difference allowed between one row of the paths, relative to that row's
/// norm ([`row_error`]), for the output, dk and dv. Loose against rounding (the paths
/// differ by about 1e-6 of a row in fp32 and 2e-2 in bf16) but tight against a row
/// computed wrongly (about 1 or more): the rows of the last keys' gradients are a
/// thousandth of the largest, below what [`tolerance`] sees. Not for dq: its rows of the
/// first few queries nearly cancel, and the unfused bf16 path, whose probabilities do not
/// sum to exactly 1 once rounded, leaves them off by up to about their own size.
pub fn row_tolerance(bf16: bool) -> f32 {
    if bf16 { 0.25 } else { 1e-3 }
}

/// The worst row of `got` against `want` (rows of `width`): the norm of the row's
/// difference relative to the norm of `want`'s row, or to a thousandth of the largest row
/// norm of `want` where that is larger (rows of nearly zero gradient). Infinite when
/// either holds a NaN or infinity.
pub fn row_error(got: &[f32], want: &[f32], width: usize) -> f32 {
    let norm = |r: &[f32]| r.iter().map(|x| x * x).sum::<f32>().sqrt();
    if got.iter().chain(want).any(|x| !x.is_finite()) {
        return f32::INFINITY;
    }
    let floor = 1e-3 * want.chunks(width).map(norm).fold(0.0, f32::max);
    let mut worst = 0.0f32;
    for (g, w) in got.chunks(width).zip(want.chunks(width)) {
        let diff: Vec<f32> = g.iter().zip(w).map(|(a, b)| a - b).collect();
        let (d, n) = (norm(&diff), norm(w).max(floor));
        worst = worst.max(if n > 0.0 { d / n } else { d });
    }
    worst
}

/// Largest absolute difference of `got` from `want`, and that relative to `want`'s largest
/// magnitude (infinite when `got` holds a NaN or infinity).
pub fn max_error(got: &[f32], want: &[f32]) -> (f32, f32) {
    let mut abs = 0.0f32;
    let mut scale = 0.0f32;
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() || !w.is_finite() {
            return (f32::INFINITY, f32::INFINITY);
        }
        abs = abs.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    (abs, if scale > 0.0 { abs / scale } else { abs })
}

/// Deterministic values uniform in `[-a, a)`.
fn noise(n: usize, seed: u64, a: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
        })
        .collect()
}

/// Part `p` (0 q, 1 k, 2 v) of a `(rows, 3, c)` buffer.
pub fn part(qkv: &[f32], c: usize, p: usize) -> Vec<f32> {
    qkv.chunks(3 * c)
        .flat_map(|row| &row[p * c..(p + 1) * c])
        .copied()
        .collect()
}

/// The shapes checked: all of [`SHAPES`], or with `quick` those shorter than the models'
/// (T = 77, 200, 1).
fn shapes(quick: bool) -> impl Iterator<Item = (&'static str, usize, usize, usize)> {
    SHAPES.into_iter().filter(move |s| !quick || s.2 < 256)
}

/// Runs the check in both precisions (with `quick`, on the small shapes only, untimed);
/// fails unless every comparison passes.
pub fn run(gpu: &BoundDevice<'_>, quick: bool) -> Result<(), GptError> {
    let mut failures = Vec::new();
    precision::<f32>(gpu, quick, &mut failures)?;
    precision::<half::bf16>(gpu, quick, &mut failures)?;
    if failures.is_empty() {
        println!("check-attention: PASS");
        Ok(())
    } else {
        Err(GptError::CheckFailed(format!(
            "fused attention: {}",
            failures.join("; ")
        )))
    }
}

fn precision<T: Act>(
    gpu: &BoundDevice<'_>,
    quick: bool,
    failures: &mut Vec<String>,
) -> Result<(), GptError> {
    let ks = Kernels::load(gpu, T::BF16)?;
    let mut fused = Vec::new();
    let kinds: &[bool] = if T::BF16 { &[false, true] } else { &[false] };
    for &mma in kinds {
        let name = if mma { "mma" } else { "tiled" };
        match Attention::load(gpu, T::BF16, mma) {
            Ok(fa) => fused.push(fa),
            Err(e) => {
                println!(
                    "check-attention: {} {name} FAIL: the kernels do not load: {e}",
                    T::PRECISION
                );
                failures.push(format!("{} {name}: the kernels do not load", T::PRECISION));
            }
        }
    }
    if fused.is_empty() {
        return Ok(());
    }
    let blas = gpu.new_blas()?;
    for (name, b, t, nh) in shapes(quick) {
        let d = Dims {
            b,
            t,
            c: nh * HEAD_SIZE,
            nh,
            hs: HEAD_SIZE,
            v: 256,
            l: 1,
        };
        let what = format!("{} {name} (B {b}, T {t}, NH {nh})", T::PRECISION);
        let k = (&ks, fused.as_slice());
        if let Err(e) = case::<T>(gpu, k, &blas, (d, quick), &what, failures) {
            println!("check-attention: {what} FAIL: {e}");
            failures.push(format!("{what}: {e}"));
        }
    }
    Ok(())
}

/// Every buffer of the paths for one shape; path `i` writes `y[i]` and `dqkv[i]`.
struct Bufs<T: Act> {
    qkv: DeviceSlice<T>,
    dy: DeviceSlice<T>,
    y: Vec<DeviceSlice<T>>,
    dqkv: Vec<DeviceSlice<T>>,
    lse: DeviceSlice<f32>,
    dsum: DeviceSlice<f32>,
    /// q, k, v, atty, daty, dq, dk, dv.
    heads: Vec<DeviceSlice<T>>,
    /// preatt, att, datt.
    square: Vec<DeviceSlice<T>>,
}

impl<T: Act> Bufs<T> {
    fn new(gpu: &BoundDevice<'_>, d: Dims, paths: usize) -> gpubind::Result<Self> {
        let n = d.bt() * d.c;
        let host = |v: Vec<f32>| v.into_iter().map(T::from_f32).collect::<Vec<T>>();
        let z = |len: usize| gpu.alloc_zeros::<T>(len);
        Ok(Bufs {
            qkv: gpu.clone_htod(&host(noise(3 * n, 1, 1.5)))?,
            dy: gpu.clone_htod(&host(noise(n, 2, 1.0)))?,
            y: (0..paths).map(|_| z(n)).collect::<gpubind::Result<_>>()?,
            dqkv: (0..paths)
                .map(|_| z(3 * n))
                .collect::<gpubind::Result<_>>()?,
            lse: gpu.alloc_zeros(d.b * d.nh * d.t)?,
            dsum: gpu.alloc_zeros(d.b * d.nh * d.t)?,
            heads: (0..8).map(|_| z(n)).collect::<gpubind::Result<_>>()?,
            square: (0..3).map(|_| z(d.att())).collect::<gpubind::Result<_>>()?,
        })
    }

    /// What path `i`'s forward pass writes for its backward pass.
    fn saved(&self, i: usize) -> Saved<'_, T> {
        let h = &self.heads;
        Saved {
            qkv: &self.qkv,
            y: &self.y[i],
            lse: &self.lse,
            q: &h[0],
            k: &h[1],
            v: &h[2],
            att: &self.square[1],
        }
    }

    /// The forward pass of path `i`.
    fn fwd(&self, i: usize) -> Fwd<'_, T> {
        Fwd {
            saved: self.saved(i),
            preatt: &self.square[0],
            atty: &self.heads[3],
        }
    }

    fn bwd(&self, i: usize) -> Bwd<'_, T> {
        let h = &self.heads;
        Bwd {
            bias: None,
            saved: self.saved(i),
            dy: &self.dy,
            dqkv: &self.dqkv[i],
            dsum: &self.dsum,
            daty: &h[4],
            dq: &h[5],
            dk: &h[6],
            dv: &h[7],
            datt: &self.square[2],
            dpre: &self.square[0],
        }
    }
}

/// Path `i` (`fused[i]`, or the unfused one past them): the forward pass, or with `back`
/// the backward one.
fn pass<T: Act>(
    s: &mut BoundStream<'_>,
    (ks, fa): (&Kernels, &[Attention]),
    blas: &Blas,
    d: Dims,
    bufs: &Bufs<T>,
    (i, back): (usize, bool),
) -> gpubind::Result<()> {
    let fused = fa.get(i);
    if back {
        attend::backward(s, (ks, fused), blas, d, bufs.bwd(i))
    } else {
        attend::forward(s, (ks, fused), blas, d, bufs.fwd(i))
    }
}

/// Milliseconds per call of `pass(i, back)`.
fn time<T: Act>(
    s: &mut BoundStream<'_>,
    k: (&Kernels, &[Attention]),
    blas: &Blas,
    d: Dims,
    bufs: &Bufs<T>,
    which: (usize, bool),
) -> gpubind::Result<f64> {
    pass(s, k, blas, d, bufs, which)?;
    s.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..TIMED_CALLS {
        pass(s, k, blas, d, bufs, which)?;
    }
    s.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3 / TIMED_CALLS as f64)
}

fn case<T: Act>(
    gpu: &BoundDevice<'_>,
    k: (&Kernels, &[Attention]),
    blas: &Blas,
    (d, quick): (Dims, bool),
    what: &str,
    failures: &mut Vec<String>,
) -> Result<(), GptError> {
    let unfused = k.1.len();
    let bufs = Bufs::<T>::new(gpu, d, unfused + 1)?;
    let mut s = gpu.default_stream();
    for i in 0..=unfused {
        pass(&mut s, k, blas, d, &bufs, (i, false))?;
        pass(&mut s, k, blas, d, &bufs, (i, true))?;
    }
    let f32s = |b: &DeviceSlice<T>| -> gpubind::Result<Vec<f32>> {
        Ok(gpu.dtoh(b)?.into_iter().map(T::to_f32).collect())
    };
    let (y_ref, dqkv_ref) = (f32s(&bufs.y[unfused])?, f32s(&bufs.dqkv[unfused])?);
    let (tol, row_tol) = (tolerance(T::BF16), row_tolerance(T::BF16));
    let time_of = |s: &mut BoundStream<'_>, blas: &Blas, i| -> gpubind::Result<[f64; 2]> {
        Ok([
            time(s, k, blas, d, &bufs, (i, false))?,
            time(s, k, blas, d, &bufs, (i, true))?,
        ])
    };
    let base = if quick {
        [0.0; 2]
    } else {
        time_of(&mut s, blas, unfused)?
    };
    for (i, fa) in k.1.iter().enumerate() {
        let (y, dqkv) = (f32s(&bufs.y[i])?, f32s(&bufs.dqkv[i])?);
        let mut line = format!("check-attention: {what} {}:", fa.name());
        let mut ok = true;
        let mut compare = |name: &str, got: &[f32], want: &[f32]| {
            let (abs, rel) = max_error(got, want);
            let mut pass = rel <= tol && got.len() == want.len();
            line += &format!(" {name} abs {abs:.2e} rel {rel:.2e}");
            if name != "dq" {
                let row = row_error(got, want, HEAD_SIZE);
                pass &= row <= row_tol;
                line += &format!(" row {row:.2e}");
            }
            ok &= pass;
            line += if pass { " ok" } else { " BAD" };
        };
        compare("y", &y, &y_ref);
        for (p, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
            compare(name, &part(&dqkv, d.c, p), &part(&dqkv_ref, d.c, p));
        }
        line += &format!(
            " (tol {tol:.0e}, row {row_tol:.0e}) -> {}",
            if ok { "PASS" } else { "FAIL" }
        );
        println!("{line}");
        if !ok {
            failures.push(format!("{what} {}: differs from the unfused", fa.name()));
        }
        if quick {
            continue;
        }
        let ms = time_of(&mut s, blas, i)?;
        println!(
            "check-attention: {what} {}: ms per call: forward {:.3} (unfused {:.3}, {:.2}x), \
             backward {:.3} (unfused {:.3}, {:.2}x)",
            fa.name(),
            ms[0],
            base[0],
            base[0] / ms[0],
            ms[1],
            base[1],
            base[1] / ms[1]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_relative_to_the_reference() {
        let (abs, rel) = max_error(&[1.0, 2.5], &[1.0, 2.0]);
        assert_eq!((abs, rel), (0.5, 0.25));
        assert_eq!(max_error(&[f32::NAN], &[1.0]).1, f32::INFINITY);
        assert!(max_error(&[0.0; 3], &[0.0; 3]).1 <= tolerance(false));
    }

    #[test]
    fn a_wrong_small_row_fails_the_row_check_only() {
        // Two rows of 4: a large one, and one a thousandth of its size (as the gradients
        // of the last keys are), zeroed in `got` (a tile the kernel never wrote).
        let want = [1.0, -2.0, 0.5, 1.5, 1e-3, 2e-3, -1e-3, 1e-3];
        let mut got = want;
        got[4..].fill(0.0);
        assert!(max_error(&got, &want).1 <= tolerance(true));
        assert!(row_error(&got, &want, 4) > row_tolerance(true));
        // Rounding-sized differences in every row pass both.
        let near: Vec<f32> = want.iter().map(|x| x * 1.01).collect();
        assert!(row_error(&near, &want, 4) <= row_tolerance(true));
        assert!(row_error(&want, &want, 4) == 0.0);
        // A row of nearly zero gradient is measured against the floor, not itself.
        let mut tiny = want;
        tiny[4..].copy_from_slice(&[1e-9, 0.0, 0.0, 0.0]);
        let mut off = tiny;
        off[4] = 2e-9;
        assert!(row_error(&off, &tiny, 4) <= row_tolerance(false));
        assert_eq!(row_error(&[f32::NAN; 4], &want[..4], 4), f32::INFINITY);
        assert_eq!(row_error(&[0.0; 4], &[0.0; 4], 4), 0.0);
    }

    #[test]
    fn quick_checks_the_ragged_shapes() {
        let quick: Vec<usize> = shapes(true).map(|s| s.2).collect();
        assert_eq!(quick, [77, 200, 1]);
        assert_eq!(shapes(false).count(), SHAPES.len());
    }

    #[test]
    fn parts_split_rows_of_three() {
        let qkv: Vec<f32> = (0..12).map(|x| x as f32).collect();
        assert_eq!(part(&qkv, 2, 0), [0.0, 1.0, 6.0, 7.0]);
        assert_eq!(part(&qkv, 2, 2), [4.0, 5.0, 10.0, 11.0]);
    }

    #[test]
    fn noise_is_bounded_and_seeded() {
        let a = noise(1000, 1, 1.5);
        assert!(a.iter().all(|x| x.abs() <= 1.5));
        assert_eq!(a, noise(1000, 1, 1.5));
        assert_ne!(a, noise(1000, 2, 1.5));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.1, "{mean}");
    }
}
