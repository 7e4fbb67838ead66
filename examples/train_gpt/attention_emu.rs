//! CPU emulations of the fused attention kernels' index math, checked against plain
//! products: the `mma.sync` / `ldmatrix` fragment addressing of `attention_mma.cu` (lane
//! by lane, with the layouts the PTX ISA gives), and the tile loops of both sources (loop
//! bounds, causal masks, online softmax, the log-sum-exp the backward pass reuses) at
//! sequence lengths that are not multiples of the tiles. The addressing expressions are
//! also looked up in the source, so the emulation cannot drift from it silently.

use super::{SOURCE, SOURCE_MMA};

const HD: usize = 64;
const TILE: usize = 64;

/// One 32-bit register of each lane, as its two 16-bit halves (low first).
type Reg = [[f32; 2]; 32];
/// A C fragment of each lane: c0..c3.
type Acc = [[f32; 4]; 32];

fn gq(lane: usize) -> (usize, usize) {
    (lane / 4, lane % 4)
}

/// `mma.m16n8k16.row.col`, lane layouts from the PTX ISA: A regs {row g, k 2q..}, {row
/// g+8, k 2q..}, {row g, k 2q+8..}, {row g+8, k 2q+8..}; B regs {k 2q.., col g}, {k
/// 2q+8.., col g}; C {row g, cols 2q, 2q+1}, {row g+8, cols 2q, 2q+1}.
fn mma(c: &mut Acc, a: &[Reg; 4], b0: &Reg, b1: &Reg) {
    let mut am = [[0.0f32; 16]; 16];
    let mut bm = [[0.0f32; 8]; 16];
    for lane in 0..32 {
        let (g, q) = gq(lane);
        for h in 0..2 {
            am[g][2 * q + h] = a[0][lane][h];
            am[g + 8][2 * q + h] = a[1][lane][h];
            am[g][2 * q + 8 + h] = a[2][lane][h];
            am[g + 8][2 * q + 8 + h] = a[3][lane][h];
            bm[2 * q + h][g] = b0[lane][h];
            bm[2 * q + 8 + h][g] = b1[lane][h];
        }
    }
    for (lane, cl) in c.iter_mut().enumerate() {
        let (g, q) = gq(lane);
        for (e, v) in cl.iter_mut().enumerate() {
            let (row, col) = (g + 8 * (e / 2), 2 * q + e % 2);
            *v += (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f32>();
        }
    }
}

/// `ldmatrix.m8n8.x4` (`trans`: `.trans`) from a row-major tile: lanes 8m..8m+7 give the
/// (row, column) of matrix m's rows 0..7; without `.trans` r[m] of lane (g, q) holds
/// matrix m's row g, columns 2q and 2q+1, with it rows 2q and 2q+1 of column g.
fn ldsm(s: &[Vec<f32>], addr: impl Fn(usize) -> (usize, usize), trans: bool) -> [Reg; 4] {
    let mut r = [[[0.0f32; 2]; 32]; 4];
    for (m, rm) in r.iter_mut().enumerate() {
        for (lane, v) in rm.iter_mut().enumerate() {
            let (g, q) = gq(lane);
            *v = if trans {
                let (r0, c0) = addr(8 * m + 2 * q);
                let (r1, c1) = addr(8 * m + 2 * q + 1);
                [s[r0][c0 + g], s[r1][c1 + g]]
            } else {
                let (r0, c0) = addr(8 * m + g);
                [s[r0][c0 + 2 * q], s[r0][c0 + 2 * q + 1]]
            };
        }
    }
    r
}

/// `load_a`: the A fragments (4 k-steps) of rows row0..row0+15 of a tile.
fn load_a(s: &[Vec<f32>], row0: usize) -> [[Reg; 4]; 4] {
    let mut a = [[[[0.0f32; 2]; 32]; 4]; 4];
    for (kk, ak) in a.iter_mut().enumerate() {
        for lane in 0..32 {
            let (g, q) = gq(lane);
            let at = |row: usize, col: usize| [s[row][col], s[row][col + 1]];
            let col = kk * 16 + 2 * q;
            ak[0][lane] = at(row0 + g, col);
            ak[1][lane] = at(row0 + g + 8, col);
            ak[2][lane] = at(row0 + g, col + 8);
            ak[3][lane] = at(row0 + g + 8, col + 8);
        }
    }
    a
}

/// `mm_abt`: acc[j] = A·Bᵀ with B(k, n) = s[j·8 + n][k].
fn mm_abt(a: &[[Reg; 4]; 4], s: &[Vec<f32>]) -> [Acc; 8] {
    let mut acc = [[[0.0f32; 4]; 32]; 8];
    mm_abt_from(&mut acc, a, s, 0);
    acc
}

/// `mm_abt<NJ>` with `s` shifted down `r0` rows (NJ = `acc.len()`): acc[j] = A·Bᵀ with
/// B(k, n) = s[r0 + j·8 + n][k].
fn mm_abt_from(acc: &mut [Acc], a: &[[Reg; 4]; 4], s: &[Vec<f32>], r0: usize) {
    for (j, aj) in acc.iter_mut().enumerate() {
        *aj = [[0.0f32; 4]; 32];
        for h in 0..2 {
            // base = s + (lane % 8) * LDA + (lane / 8) * 8, then + j * 8 * LDA + h * 32
            let b = ldsm(s, |l| (r0 + l % 8 + j * 8, (l / 8) * 8 + h * 32), false);
            mma(aj, &a[2 * h], &b[0], &b[1]);
            mma(aj, &a[2 * h + 1], &b[2], &b[3]);
        }
    }
}

/// `mm_ab`: acc[j] += P·s over s's 64 rows, columns j·8..j·8+7.
fn mm_ab(acc: &mut [Acc; 8], p: &[[Reg; 4]; 4], s: &[Vec<f32>]) {
    mm_ab_from(acc, p, s, 0);
}

/// `mm_ab<NK>` with `s` shifted down `r0` rows (NK = `p.len()`): acc[j] += P·s over
/// rows r0 .. r0 + 16·NK of s.
fn mm_ab_from(acc: &mut [Acc; 8], p: &[[Reg; 4]], s: &[Vec<f32>], r0: usize) {
    for (kk, pk) in p.iter().enumerate() {
        for j in (0..8).step_by(2) {
            // base = s + ((m & 1) * 8 + lane % 8) * LDA + (m >> 1) * 8, m = lane / 8,
            // then + kk * 16 * LDA + j * 8
            let b = ldsm(
                s,
                |l| {
                    let m = l / 8;
                    (r0 + (m & 1) * 8 + l % 8 + kk * 16, (m >> 1) * 8 + j * 8)
                },
                true,
            );
            let (lo, hi) = acc.split_at_mut(j + 1);
            mma(&mut lo[j], pk, &b[0], &b[1]);
            mma(&mut hi[0], pk, &b[2], &b[3]);
        }
    }
}

/// C fragments of 8 n-tiles as the A fragments of 4 k-steps (`pa[j / 2][(j % 2) * 2]`
/// = row g's pair, `+ 1` = row g+8's).
fn c_to_a(x: &[Acc; 8]) -> [[Reg; 4]; 4] {
    let mut a = [[[[0.0f32; 2]; 32]; 4]; 4];
    c_to_a_into(&mut a, x);
    a
}

/// `c_to_a` of 2·`a.len()` n-tiles.
fn c_to_a_into(a: &mut [[Reg; 4]], x: &[Acc]) {
    for (j, xj) in x.iter().enumerate() {
        for lane in 0..32 {
            a[j / 2][(j % 2) * 2][lane] = [xj[lane][0], xj[lane][1]];
            a[j / 2][(j % 2) * 2 + 1][lane] = [xj[lane][2], xj[lane][3]];
        }
    }
}

/// Row `g + 8·(e / 2)`, column `j·8 + 2q + e % 2` of a warp's 16 × 64 C fragments.
fn c_get(x: &[Acc; 8], row: usize, col: usize) -> f32 {
    let (j, c) = (col / 8, col % 8);
    let lane = (row % 8) * 4 + c / 2;
    x[j][lane][(row / 8) * 2 + c % 2]
}

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

#[test]
fn mma_fragments_multiply_tiles() {
    let s = matrix(TILE, HD, 1);
    let a_rows = matrix(TILE, HD, 2);
    for warp in 0..4 {
        let a = load_a(&a_rows, warp * 16);
        // Scores: rows of a against rows of s.
        let st = mm_abt(&a, &s);
        for r in 0..16 {
            for n in 0..TILE {
                let want: f32 = (0..HD).map(|k| a_rows[warp * 16 + r][k] * s[n][k]).sum();
                close(c_get(&st, r, n), want, &format!("abt w{warp} ({r}, {n})"));
            }
        }
        // Those scores as the A operand of a product with s (P·V).
        let mut o = [[[0.0f32; 4]; 32]; 8];
        mm_ab(&mut o, &c_to_a(&st), &s);
        for r in 0..16 {
            for n in 0..HD {
                let want: f32 = (0..TILE).map(|k| c_get(&st, r, k) * s[k][n]).sum();
                close(c_get(&o, r, n), want, &format!("ab w{warp} ({r}, {n})"));
            }
        }
    }
}

/// The backward kernels' loop over a tile's two halves of 32 rows (`mm_abt<4>` and
/// `mm_ab<2>` from the base shifted `half * 32` rows; column `half * 32 + j * 8 + 2q + (e
/// & 1)` of the statistics) gives what the whole tile gives, as attn_bwd_dkdv uses it:
/// p = st·w[c], ds = p − dpt·u[c] (w, u: per-column factors, as sl, sd or a key's mask),
/// dv += P·o, dk += dS·s. Each accumulator sees the same products in the same order.
#[test]
fn halved_tiles_are_the_whole_tile() {
    let (s, o) = (matrix(TILE, HD, 7), matrix(TILE, HD, 8));
    let (a_rows, d_rows) = (matrix(TILE, HD, 9), matrix(TILE, HD, 10));
    let (w, u) = (noise(TILE, 11), noise(TILE, 12));
    let f = |st: f32, dp: f32, c: usize| (st * w[c], st * w[c] - dp * u[c]);
    for warp in 0..4 {
        let (a, d) = (load_a(&a_rows, warp * 16), load_a(&d_rows, warp * 16));
        // The whole tile: 8 n-tiles of scores, 4 k-steps.
        let (st, dpt) = (mm_abt(&a, &s), mm_abt(&d, &o));
        let (mut pw, mut dw) = ([[[0.0f32; 4]; 32]; 8], [[[0.0f32; 4]; 32]; 8]);
        for j in 0..8 {
            for lane in 0..32 {
                let (_, q) = gq(lane);
                for e in 0..4 {
                    let c = j * 8 + 2 * q + (e & 1);
                    (pw[j][lane][e], dw[j][lane][e]) = f(st[j][lane][e], dpt[j][lane][e], c);
                }
            }
        }
        let (mut dv_whole, mut dk_whole) = ([[[0.0f32; 4]; 32]; 8], [[[0.0f32; 4]; 32]; 8]);
        mm_ab(&mut dv_whole, &c_to_a(&pw), &o);
        mm_ab(&mut dk_whole, &c_to_a(&dw), &s);
        // Two halves: 4 n-tiles of scores, 2 k-steps each.
        let (mut dv, mut dk) = ([[[0.0f32; 4]; 32]; 8], [[[0.0f32; 4]; 32]; 8]);
        for half in 0..2 {
            let (mut st, mut dpt) = ([[[0.0f32; 4]; 32]; 4], [[[0.0f32; 4]; 32]; 4]);
            mm_abt_from(&mut st, &a, &s, half * 32);
            mm_abt_from(&mut dpt, &d, &o, half * 32);
            let (mut pc, mut dc) = ([[[0.0f32; 4]; 32]; 4], [[[0.0f32; 4]; 32]; 4]);
            for j in 0..4 {
                for lane in 0..32 {
                    let (_, q) = gq(lane);
                    for e in 0..4 {
                        let c = half * 32 + j * 8 + 2 * q + (e & 1);
                        (pc[j][lane][e], dc[j][lane][e]) = f(st[j][lane][e], dpt[j][lane][e], c);
                    }
                }
            }
            let (mut pa, mut dsa) = ([[[[0.0f32; 2]; 32]; 4]; 2], [[[[0.0f32; 2]; 32]; 4]; 2]);
            c_to_a_into(&mut pa, &pc);
            c_to_a_into(&mut dsa, &dc);
            mm_ab_from(&mut dv, &pa, &o, half * 32);
            mm_ab_from(&mut dk, &dsa, &s, half * 32);
        }
        assert_eq!(dv, dv_whole, "dv, warp {warp}");
        assert_eq!(dk, dk_whole, "dk, warp {warp}");
        for r in 0..16 {
            let (ar, dr) = (&a_rows[warp * 16 + r], &d_rows[warp * 16 + r]);
            for n in 0..HD {
                let (mut want_v, mut want_k) = (0.0f32, 0.0f32);
                for c in 0..TILE {
                    let (p, ds) = f(dot(ar, &s[c]), dot(dr, &o[c]), c);
                    want_v += p * o[c][n];
                    want_k += ds * s[c][n];
                }
                close(c_get(&dv, r, n), want_v, &format!("dv w{warp} ({r}, {n})"));
                close(c_get(&dk, r, n), want_k, &format!("dk w{warp} ({r}, {n})"));
            }
        }
    }
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
        "s + (lane % 8) * LDA + (lane / 8) * 8",
        "ldsm(b, base + j * 8 * LDA + h * 32)",
        "mma(acc[j], a[2 * h], b[0], b[1])",
        "mma(acc[j], a[2 * h + 1], b[2], b[3])",
        "s + ((m & 1) * 8 + lane % 8) * LDA + (m >> 1) * 8",
        "ldsm_t(b, base + kk * 16 * LDA + j * 8)",
        "mma(acc[j + 1], p[kk], b[2], b[3])",
        "a[kk][1] = ld2(r + 8 * LDA + kk * 16)",
        "a[kk][2] = ld2(r + kk * 16 + 8)",
        "pa[j / 2][(j % 2) * 2 + 1] = hi",
        "dsa[j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3])",
        "unsigned key = k0 + j * 8 + 2 * q + (e & 1), row = e < 2 ? row0 : row1",
        "const unsigned row0 = q0 + warp * 16 + g, row1 = row0 + 8",
        "int c = half * 32 + j * 8 + 2 * q + (e & 1)",
        "unsigned key = k0 + half * 32 + j * 8 + 2 * q + (e & 1);",
        "const bf16* hk = sA[cur] + half * 32 * LDA;",
        "const bf16* hq = sQ[cur] + half * 32 * LDA;",
        "const bf16* ho = sO[cur] + half * 32 * LDA;",
        "for (int half = 0; half < 2; ++half)",
        "mm_abt<4>(s, qa, hk, lane)",
        "mm_abt<4>(dp, da, sB[cur] + half * 32 * LDA, lane)",
        "mm_ab<2>(dq, dsa, hk, lane)",
        "mm_abt<4>(st, ka, hq, lane)",
        "mm_abt<4>(dpt, va, ho, lane)",
        "mm_ab<2>(dv, pa, ho, lane)",
        "mm_ab<2>(dk, dsa, hq, lane)",
        "for (int j = 0; j < NJ; ++j)",
        "for (int kk = 0; kk < NK; ++kk)",
        "return q0 == k0 || q0 + TILE > T;",
        "const unsigned kend = umin(T, q0 + TILE)",
        "for (unsigned q0 = k0, cur = 0; q0 < T; q0 += TILE, cur ^= 1)",
    ] {
        assert!(SOURCE_MMA.contains(expr), "attention_mma.cu lacks `{expr}`");
    }
    for expr in [
        "unsigned row = blockIdx.x * 32 + threadIdx.x / 8, part = threadIdx.x % 8;",
        "i < HD; i += 8)",
        "for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);",
    ] {
        for (name, src) in [("attention.cu", SOURCE), ("attention_mma.cu", SOURCE_MMA)] {
            assert!(src.contains(expr), "{name} lacks `{expr}`");
        }
    }
    let host = include_str!("attention.rs");
    assert!(host.contains("grid_dim: (rows.div_ceil(32) as u32, 1, 1)"));
    assert!(host.contains("block_dim: (256, 1, 1)"));
    for expr in [
        "const unsigned kend = umin(T, q0 + BR)",
        "for (unsigned q0 = (k0 / BR) * BR; q0 < T; q0 += BR)",
        "bool ok = lane < BC && kj <= qi && kj < T",
        "if (qi < T && kj <= qi)",
    ] {
        assert!(SOURCE.contains(expr), "attention.cu lacks `{expr}`");
    }
}

/// attention_mma.cu's `needs_mask`: the tile pairs its kernels mask.
fn needs_mask(q0: usize, k0: usize, t: usize) -> bool {
    q0 == k0 || q0 + TILE > t
}

/// The mma kernels skip the causal mask on the tile pairs `needs_mask` leaves out: every
/// pair their loops visit (the forward's and dq's key tiles up to the query tile's end,
/// dkdv's query tiles from the key tile on) that is not masked must have every key at or
/// before every row, and every row and key inside T.
#[test]
fn unmasked_tile_pairs_need_no_mask() {
    for t in [1, 2, 63, 64, 65, 77, 127, 128, 200, 1024] {
        let mut pairs = vec![];
        for q0 in (0..t).step_by(TILE) {
            pairs.extend((0..t.min(q0 + TILE)).step_by(TILE).map(|k0| (q0, k0)));
        }
        for k0 in (0..t).step_by(TILE) {
            pairs.extend((k0..t).step_by(TILE).map(|q0| (q0, k0)));
        }
        let mut skipped = 0;
        for (q0, k0) in pairs.into_iter().filter(|&(q0, k0)| !needs_mask(q0, k0, t)) {
            skipped += 1;
            for row in q0..q0 + TILE {
                for key in k0..k0 + TILE {
                    assert!(
                        key <= row && key < t && row < t,
                        "T {t}: tiles q0 {q0}, k0 {k0} skip the mask at row {row}, key {key}"
                    );
                }
            }
        }
        // From two full tiles on, some pairs go unmasked: the test is not vacuous there.
        assert_eq!(
            skipped > 0,
            t >= 2 * TILE,
            "T {t}: {skipped} unmasked pairs"
        );
    }
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

/// Softmax attention and its gradients in f64, the T×T way.
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
        // attention_mma.cu (64 × 64), attention.cu bf16 (32 × 32) and fp32 (16 × 16).
        for (br, bc) in [(TILE, TILE), (32, 32), (16, 16)] {
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
