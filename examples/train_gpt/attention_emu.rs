//! CPU emulations of `attention.cu`'s index math, checked against plain products: its
//! tile loops (loop bounds, causal masks, online softmax, the log-sum-exp the backward pass
//! reuses) at sequence lengths that are not multiples of the tiles, and its `attn_bwd_d`
//! reduction. The addressing expressions are also looked up in the source, so the
//! emulation cannot drift from it silently. Both sources also run whole, unchanged, on the
//! host emulator (`emu/`, the `host_emulator` tests): `attention_mma.cu` in bf16,
//! `attention.cu` in fp32.

use super::SOURCE;

const HD: usize = 64;

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<Vec<f32>> {
    noise(rows * cols, seed)
        .chunks(cols)
        .map(<[f32]>::to_vec)
        .collect()
}

fn close(got: f32, want: f32, what: &str) {
    assert!(
        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
        "{what}: {got} != {want}"
    );
}

/// attn_bwd_d's reduction: thread x of a block of 256 takes row x / 8, elements p, p + 8,
/// .. (p = x % 8); the shuffles over lane masks 4, 2, 1 of each warp leave the row's sum
/// in its eight lanes, never mixing rows.
#[test]
fn eight_lanes_reduce_their_row() {
    let (y, dy) = (noise(32 * HD, 13), noise(32 * HD, 14));
    let row = |x: usize| &y[(x / 8) * HD..][..HD];
    let drow = |x: usize| &dy[(x / 8) * HD..][..HD];
    let mut s: Vec<f32> = (0..256)
        .map(|x| (x % 8..HD).step_by(8).map(|i| row(x)[i] * drow(x)[i]).sum())
        .collect();
    for o in [4, 2, 1] {
        // __shfl_xor_sync(FULL, s, o): lane l of a warp reads lane l ^ o of that warp.
        let prev = s.clone();
        for (x, v) in s.iter_mut().enumerate() {
            *v += prev[(x / 32) * 32 + ((x % 32) ^ o)];
        }
    }
    for (x, &v) in s.iter().enumerate() {
        close(v, dot(row(x), drow(x)), &format!("thread {x}"));
    }
}

#[test]
fn the_emulated_addressing_is_the_sources() {
    for expr in [
        "unsigned row = blockIdx.x * 32 + threadIdx.x / 8, part = threadIdx.x % 8;",
        "i < HD; i += 8)",
        "for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);",
        "const unsigned kend = umin(T, q0 + BR)",
        "for (unsigned q0 = (k0 / BR) * BR; q0 < T; q0 += BR)",
        "bool ok = lane < BC && kj <= qi && kj < T",
        "if (qi < T && kj <= qi)",
    ] {
        assert!(SOURCE.contains(expr), "attention.cu lacks `{expr}`");
    }
    let host = include_str!("attention.rs");
    assert!(host.contains("grid_dim: (rr.div_ceil(32), 1, 1)"));
    assert!(host.contains("block_dim: (256, 1, 1)"));
}

/// One head's q, k, v, dy (`t × 64` each).
struct Head {
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    dy: Vec<Vec<f32>>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The kernels' tile loops, row by row in f32: the forward pass (queries in tiles of
/// `br`, keys in tiles of `bc` up to the query tile's end, the online softmax from a
/// running max of −∞) and the backward passes (dq over the same key tiles; dk, dv over
/// the query tiles from the one holding the key tile's first key). Returns y, lse, dq,
/// dk, dv.
fn tiled(h: &Head, br: usize, bc: usize) -> [Vec<Vec<f32>>; 4] {
    let t = h.q.len();
    let scale = 1.0 / (HD as f32).sqrt();
    let mut y = vec![vec![0.0f32; HD]; t];
    let mut lse = vec![0.0f32; t];
    for q0 in (0..t).step_by(br) {
        let kend = t.min(q0 + br);
        for r in 0..br {
            let qi = q0 + r;
            let (mut m, mut l, mut o) = (f32::NEG_INFINITY, 0.0f32, vec![0.0f32; HD]);
            for k0 in (0..kend).step_by(bc) {
                let s: Vec<f32> = (0..bc)
                    .map(|c| {
                        let kj = k0 + c;
                        if kj <= qi && kj < t {
                            dot(&h.q[qi.min(t - 1)], &h.k[kj]) * scale
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                    .collect();
                let mnew = s.iter().copied().fold(m, f32::max);
                let mref = if mnew == f32::NEG_INFINITY { 0.0 } else { mnew };
                let p: Vec<f32> = s.iter().map(|x| (x - mref).exp()).collect();
                let alpha = (m - mref).exp();
                l = l * alpha + p.iter().sum::<f32>();
                for (d, od) in o.iter_mut().enumerate() {
                    *od = *od * alpha
                        + p.iter()
                            .enumerate()
                            .filter(|(c, _)| k0 + c < t)
                            .map(|(c, pc)| pc * h.v[k0 + c][d])
                            .sum::<f32>();
                }
                m = mnew;
            }
            if qi < t {
                y[qi] = o.iter().map(|x| x / l).collect();
                lse[qi] = m + l.ln();
            }
        }
    }
    let dsum: Vec<f32> = (0..t).map(|i| dot(&y[i], &h.dy[i])).collect();
    // dS(i, j) of a query row i < t and a key j, 0 where masked, from lse.
    let ds = |i: usize, j: usize| -> (f32, f32) {
        if j > i || i >= t {
            return (0.0, 0.0);
        }
        let p = (dot(&h.q[i], &h.k[j]) * scale - lse[i]).exp();
        (p, p * (dot(&h.dy[i], &h.v[j]) - dsum[i]) * scale)
    };
    let mut dq = vec![vec![0.0f32; HD]; t];
    for q0 in (0..t).step_by(br) {
        for (i, dqi) in dq.iter_mut().enumerate().skip(q0).take(br) {
            for k0 in (0..t.min(q0 + br)).step_by(bc) {
                for j in (k0..k0 + bc).filter(|&j| j < t) {
                    let g = ds(i, j).1;
                    dqi.iter_mut().zip(&h.k[j]).for_each(|(a, b)| *a += g * b);
                }
            }
        }
    }
    let (mut dk, mut dv) = (vec![vec![0.0f32; HD]; t], vec![vec![0.0f32; HD]; t]);
    for k0 in (0..t).step_by(bc) {
        for j in (k0..k0 + bc).filter(|&j| j < t) {
            for q0 in ((k0 / br) * br..t).step_by(br) {
                for i in (q0..q0 + br).filter(|&i| i < t) {
                    let (p, g) = ds(i, j);
                    dv[j]
                        .iter_mut()
                        .zip(&h.dy[i])
                        .for_each(|(a, b)| *a += p * b);
                    dk[j].iter_mut().zip(&h.q[i]).for_each(|(a, b)| *a += g * b);
                }
            }
        }
    }
    [y, dq, dk, dv]
}

/// Softmax attention and its gradients in f64, the T×T way (indexed as the formulas are).
#[allow(clippy::needless_range_loop)]
fn reference(h: &Head) -> [Vec<Vec<f32>>; 4] {
    let t = h.q.len();
    let scale = 1.0 / (HD as f64).sqrt();
    let d = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let mut p = vec![vec![0.0f64; t]; t];
    for i in 0..t {
        let s: Vec<f64> = (0..=i).map(|j| d(&h.q[i], &h.k[j]) * scale).collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for j in 0..=i {
            p[i][j] = (s[j] - m).exp() / z;
        }
    }
    let mut out = [(); 4].map(|_| vec![vec![0.0f64; HD]; t]);
    for i in 0..t {
        let dp: Vec<f64> = (0..t).map(|j| d(&h.dy[i], &h.v[j])).collect();
        let dsum: f64 = (0..t).map(|j| p[i][j] * dp[j]).sum();
        for j in 0..=i {
            let ds = p[i][j] * (dp[j] - dsum) * scale;
            for e in 0..HD {
                out[0][i][e] += p[i][j] * h.v[j][e] as f64;
                out[1][i][e] += ds * h.k[j][e] as f64;
                out[2][j][e] += ds * h.q[i][e] as f64;
                out[3][j][e] += p[i][j] * h.dy[i][e] as f64;
            }
        }
    }
    out.map(|m| {
        m.into_iter()
            .map(|r| r.into_iter().map(|x| x as f32).collect())
            .collect()
    })
}

#[test]
fn tile_loops_match_the_reference_at_ragged_lengths() {
    for t in [1, 2, 63, 64, 65, 77, 200] {
        let h = Head {
            q: matrix(t, HD, 3),
            k: matrix(t, HD, 4),
            v: matrix(t, HD, 5),
            dy: matrix(t, HD, 6),
        };
        let want = reference(&h);
        // attention.cu bf16 (32 × 32) and fp32 (16 × 16).
        for (br, bc) in [(32, 32), (16, 16)] {
            let got = tiled(&h, br, bc);
            for (name, (g, w)) in ["y", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                for (i, (gr, wr)) in g.iter().zip(w).enumerate() {
                    for (e, (&a, &b)) in gr.iter().zip(wr).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "T {t} tiles {br}×{bc} {name}[{i}][{e}]: {a} != {b}"
                        );
                    }
                }
            }
        }
    }
}
