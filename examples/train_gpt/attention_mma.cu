// Fused causal attention of train_gpt in bf16 on tensor cores through mma.sync
// (m16n8k16, bf16 in, f32 accumulate), flash-attention-2 style: scores, probabilities and
// accumulators stay in registers, and K, V (or Q, dO) tiles of 64 rows stream through
// shared memory, double-buffered: the next tile's cp.async copies run while the current
// one is multiplied. The forward pass and dq take 128 queries a block, 32 a warp (two
// m-tiles, so that each B fragment loaded from shared memory feeds two products); dk and
// dv take 128 keys a block, 32 a warp (DKM = 2; 64 and 16 with DKM = 1). Exponentials are ex2.approx with the softmax scale
// folded into log2 units, one FFMA and one MUFU per score (bf16 precision is what the
// products keep); dS leaves out the softmax scale, which multiplies dq's and dk's sums
// once (a power of two for head size 64: the same bits). The forward pass's row sums are
// one more product, P against a column of ones. The causal mask is applied only where a
// warp's rows and a tile's keys need it (each tile's code comes in a masked and an
// unmasked build, MASK), and a warp skips tiles wholly after its rows. q, k, v are read from the QKV
// product (B, T, 3, NH, 64), y written as (B, T, NH, 64), dq, dk, dv into dqkv
// (B, T, 3, NH, 64); head size 64; no atomics. dq also computes D = rowsum(dy ⊙ y), which
// dk and dv read: the dq kernel runs first. Given a bsum buffer, the backward kernels also
// write per-block column sums of the dq, dk and dv they store, partial sums of the QKV
// bias gradient (colsum_finish adds them up). Every buffer is 16-byte aligned (the host
// checks).
//
// Fragments of mma.m16n8k16 (g = lane / 4, q = lane % 4): A (16×16, row-major) regs
// {row g, cols 2q..2q+1}, {row g+8, same}, {row g, cols 2q+8..+9}, {row g+8, same}; B (16×8)
// regs {k 2q..2q+1, col g}, {k 2q+8..+9, col g}; C (16×8, f32) {row g, cols 2q, 2q+1},
// {row g+8, cols 2q, 2q+1}. A 16-bit register pair holds the lower column (or k) in its
// low half.
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;
#define HD 64
#define TILE 64
#define NT 128
// Queries per block (forward, dq) and per warp.
#define QT 128
#define WR 32
// Keys a dq step takes at once (of a 64-key tile): a thread holds 2·KC/8 score fragments.
#define KC 16
// dk and dv: m-tiles of 16 keys a warp (1 or 2), keys a block, queries a step, blocks an SM.
#ifndef DKM
#define DKM 2
#endif
#define KB (4 * 16 * DKM)
#define DKQ (DKM == 1 ? 32 : 16)
#define DKB (DKM == 1 ? 3 : 2)
// Tile rows: 144 bytes, so 32-bit fragment loads of rows g = 0..7 hit distinct banks.
#define LDA (HD + 8)
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000u)
#define LOG2E 1.4426950408889634f
// Two bf16 ones, packed: a B fragment of ones.
#define ONES 0x3f803f80u
typedef unsigned long long idx_t;
__device__ __forceinline__ unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }

// The PTX instructions, in one place: a host emulation (HOST_EMULATION, the
// train_gpt tests) gives its own definitions of these, with the same semantics.
#ifndef HOST_EMULATION
__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (ex2.approx.ftz: 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ldmatrix .x4: four 8×8 bf16 matrices of shared memory, lanes 8m .. 8m+7 giving the
// addresses of matrix m's rows (16-byte aligned); r[m] of lane (g, q) gets matrix m's
// row g, columns 2q and 2q+1 — or with _t (.trans) its rows 2q and 2q+1 of column g.
__device__ __forceinline__ void ldsm(unsigned* r, const bf16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
__device__ __forceinline__ void ldsm_t(unsigned* r, const bf16* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
// 16 bytes from global `src` to shared `dst` with cp.async, in the calling thread's current
// group of copies; `bytes` 0 reads nothing and fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16(bf16* dst, const bf16* src, int bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits for this thread's copies but the most recent `pending` groups (0 or 1).
__device__ __forceinline__ void cp_wait(bool pending) {
    if (pending) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
#endif  // HOST_EMULATION

// Whether rows r0 .. r0+rows-1 against keys k0 .. k0+keys-1 need the causal mask: some
// key after some row, or rows past T (keys past T come only with one of those).
__device__ __forceinline__ bool needs_mask(unsigned r0, unsigned rows, unsigned k0,
                                           unsigned keys, unsigned T) {
    return k0 + keys > r0 + 1 || r0 + rows > T;
}

// Two consecutive bf16 of a row (even index).
__device__ __forceinline__ unsigned ld2(const bf16* p) { return *(const unsigned*)p; }
// Rounds (lo, hi) to bf16 and packs them.
__device__ __forceinline__ unsigned pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned*)&v;
}
// The max over the 4 lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL, v, 2));
}

// The sums of a warp's pairs s (columns 2q, 2q + 1 of an 8-column group, summed over the
// lane's rows) over its 8 row groups g: lanes xor 4, 8, 16, a fixed tree (every lane of the
// warp takes part, and every lane ends with the same bits).
__device__ __forceinline__ float2 group_sum(float2 s) {
    #pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        s.x += __shfl_xor_sync(FULL, s.x, o);
        s.y += __shfl_xor_sync(FULL, s.y, o);
    }
    return s;
}

// A thread's part of a tile copy: 16 bytes at column copy_col() of rows copy_row(),
// + ROWS_PER, ... (NT threads cover ROWS_PER rows of 64 columns a pass, TILE / ROWS_PER
// passes).
#define ROWS_PER (NT / (HD / 8))
__device__ __forceinline__ int copy_col() { return (threadIdx.x % (HD / 8)) * 8; }
__device__ __forceinline__ int copy_row() { return threadIdx.x / (HD / 8); }

// Rows r0 .. r0+63 of a (T × 64, rows `stride` apart) matrix at `base` into s (64 × LDA),
// 16 bytes at a time; rows at or past T are zeros.
__device__ __forceinline__ void load_tile(bf16* s, const bf16* base, idx_t stride, unsigned r0,
                                          unsigned T) {
    const int row = copy_row(), col = copy_col();
    const bf16* src = base + (idx_t)(r0 + row) * stride + col;
    #pragma unroll
    for (int i = 0; i < TILE / ROWS_PER; ++i) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + row + i * ROWS_PER < T)
            v = *(const uint4*)(src + (idx_t)i * ROWS_PER * stride);
        *(uint4*)(s + (row + i * ROWS_PER) * LDA + col) = v;
    }
}

// The same as load_tile with cp.async (16 bytes each, zeros past T), in the calling
// thread's current group of copies: one address computation a tile, then a fixed step.
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* base, idx_t stride,
                                                unsigned r0, unsigned T) {
    const int row = copy_row(), col = copy_col();
    const bf16* src = base + (idx_t)(r0 + row) * stride + col;
    #pragma unroll
    for (int i = 0; i < TILE / ROWS_PER; ++i) {
        const bool in = r0 + row + i * ROWS_PER < T;
        // Past T: no read (0 bytes; the 16 are zero-filled), from an address inside the
        // matrix all the same.
        cp_async16(s + (row + i * ROWS_PER) * LDA + col,
                   in ? src + (idx_t)i * ROWS_PER * stride : base, in ? 16 : 0);
    }
}
// A fragments (4 k-steps over the 64 columns) of rows row0 .. row0+15 of a tile.
__device__ __forceinline__ void load_a(unsigned (*a)[4], const bf16* s, int row0, int g, int q) {
    const bf16* r = s + (row0 + g) * LDA + 2 * q;
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = ld2(r + kk * 16);
        a[kk][1] = ld2(r + 8 * LDA + kk * 16);
        a[kk][2] = ld2(r + kk * 16 + 8);
        a[kk][3] = ld2(r + 8 * LDA + kk * 16 + 8);
    }
}

// acc[m][j] = A_m · Bᵀ over the 64 columns: the warp's M m-tiles of 16 rows (fragments
// a[m]) against rows j·8 .. j·8+7 of the tile s (B(k, n) = s[n][k]), j < NJ (8: 64 rows of
// s; 4: 32 rows). One ldmatrix gives the B fragments of two k-steps (matrices at columns
// 32h, +8, +16, +24), used by every m-tile.
template <int M, int NJ>
__device__ __forceinline__ void mm_abt(float (&acc)[M][NJ][4], const unsigned (&a)[M][4][4],
                                       const bf16* s, int lane) {
    const bf16* base = s + (lane % 8) * LDA + (lane / 8) * 8;
    #pragma unroll
    for (int j = 0; j < NJ; ++j) {
        #pragma unroll
        for (int m = 0; m < M; ++m) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            unsigned b[4];
            ldsm(b, base + j * 8 * LDA + h * 32);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                mma(acc[m][j], a[m][2 * h], b[0], b[1]);
                mma(acc[m][j], a[m][2 * h + 1], b[2], b[3]);
            }
        }
    }
}

// acc[m][j] += P_m · s over 16·NK rows of s (B(k, n) = s[k][n], columns j·8 .. j·8+7), P_m
// given as A fragments p[m] (NK k-steps over s's rows). One transposing ldmatrix gives the
// B fragments of two n-tiles (matrices at (rows, columns) (0, 0), (8, 0), (0, 8), (8, 8)
// of the block), used by every m-tile.
template <int M, int NK>
__device__ __forceinline__ void mm_ab(float (&acc)[M][8][4], const unsigned (&p)[M][NK][4],
                                      const bf16* s, int lane) {
    const int mi = lane / 8;
    const bf16* base = s + ((mi & 1) * 8 + lane % 8) * LDA + (mi >> 1) * 8;
    #pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
        #pragma unroll
        for (int j = 0; j < 8; j += 2) {
            unsigned b[4];
            ldsm_t(b, base + kk * 16 * LDA + j * 8);
            #pragma unroll
            for (int m = 0; m < M; ++m) {
                mma(acc[m][j], p[m][kk], b[0], b[1]);
                mma(acc[m][j + 1], p[m][kk], b[2], b[3]);
            }
        }
    }
}

// Zeroes M m-tiles of 64-column accumulators.
template <int M>
__device__ __forceinline__ void zero(float (&acc)[M][8][4]) {
    #pragma unroll
    for (int m = 0; m < M; ++m)
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
}

// A fragments of a warp's 32 rows (two m-tiles) from the 128-row staging of a block: rows
// 0..63 in s0, 64..127 in s1.
__device__ __forceinline__ void load_a32(unsigned (&a)[2][4][4], const bf16* s0, const bf16* s1,
                                         int warp, int g, int q) {
    const bf16* s = (warp < 2 ? s0 : s1) + (warp % 2) * WR * LDA;
    load_a(a[0], s, 0, g, q);
    load_a(a[1], s, 16, g, q);
}

// The row of C-fragment element e of m-tile m: r0 + 16m + g, + 8 for e ≥ 2.
__device__ __forceinline__ unsigned frag_row(unsigned r0, int m, int g, int e) {
    return r0 + 16 * m + g + (e < 2 ? 0 : 8);
}

// One key tile of the forward pass for a warp's 32 queries: the scores, the running row
// maxima mx, the rescaled accumulators o and row sums l. l is a C fragment of P·1 (one
// mma a k-step against a B of ones): the sum of the bf16 probabilities the products take,
// over the whole row, with no shuffles or conversions; l[m][0] is row g's, l[m][2] row
// g+8's. MASK: the tile needs the causal
// mask (needs_mask); a tile that does not gets code without it.
template <bool MASK>
__device__ __forceinline__ void fwd_tile(float (&o)[2][8][4], float (&mx)[2][2],
                                         float (&l)[2][4], const unsigned (&qa)[2][4][4],
                                         const bf16* sk, const bf16* sv, unsigned w0,
                                         unsigned k0, unsigned T, float sl2, int lane) {
    const int g = lane / 4, q = lane % 4;
    float s[2][8][4];
    mm_abt<2, 8>(s, qa, sk, lane);
    unsigned pa[2][4][4];
    #pragma unroll
    for (int m = 0; m < 2; ++m) {
        float tm0 = NEG_INF, tm1 = NEG_INF;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (MASK) {
                    unsigned key = k0 + j * 8 + 2 * q + (e & 1);
                    unsigned row = frag_row(w0, m, g, e);
                    if (!(key <= row && key < T)) s[m][j][e] = NEG_INF;
                }
                if (e < 2) tm0 = fmaxf(tm0, s[m][j][e]);
                else tm1 = fmaxf(tm1, s[m][j][e]);
            }
        }
        float mn0 = fmaxf(mx[m][0], quad_max(tm0)), mn1 = fmaxf(mx[m][1], quad_max(tm1));
        // Rows with no key yet (only rows past T, in a masked tile) keep exp() finite.
        float ref0 = MASK && mn0 == NEG_INF ? 0.0f : mn0;
        float ref1 = MASK && mn1 == NEG_INF ? 0.0f : mn1;
        float alpha0 = ex2((mx[m][0] - ref0) * sl2), alpha1 = ex2((mx[m][1] - ref1) * sl2);
        const float r0 = ref0 * sl2, r1 = ref1 * sl2;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            pa[m][j / 2][(j % 2) * 2] =
                pack(ex2(fmaf(s[m][j][0], sl2, -r0)), ex2(fmaf(s[m][j][1], sl2, -r0)));
            pa[m][j / 2][(j % 2) * 2 + 1] =
                pack(ex2(fmaf(s[m][j][2], sl2, -r1)), ex2(fmaf(s[m][j][3], sl2, -r1)));
        }
        l[m][0] *= alpha0;
        l[m][1] *= alpha0;
        l[m][2] *= alpha1;
        l[m][3] *= alpha1;
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk) mma(l[m], pa[m][kk], ONES, ONES);
        mx[m][0] = mn0;
        mx[m][1] = mn1;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            o[m][j][0] *= alpha0;
            o[m][j][1] *= alpha0;
            o[m][j][2] *= alpha1;
            o[m][j][3] *= alpha1;
        }
    }
    mm_ab<2, 4>(o, pa, sv, lane);
}

// Forward: grid (B·NH, ceil(T/128)), 128 threads; heads in x, so that every head's
// heaviest tiles (the last queries; for dk and dv the first keys) start first. Warp w
// owns queries w0 = q0 + 32w .. w0+31, m-tile m its rows w0 + 16m .. +15.
extern "C" __global__ void __launch_bounds__(NT, 2)
attn_fwd(bf16* y, float* lse, const bf16* qkv, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sK[2][TILE * LDA];
    __shared__ __align__(16) bf16 sV[2][TILE * LDA];
    const unsigned q0 = (gridDim.y - 1 - blockIdx.y) * QT;
    const unsigned bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned w0 = q0 + warp * WR;
    // The block's 128 queries through sK[1] and sV[1]; the first k and v tiles on their
    // way into sK[0] and sV[0].
    load_tile(sK[1], base, 3 * C, q0, T);
    load_tile(sV[1], base, 3 * C, q0 + TILE, T);
    load_tile_async(sK[0], base + C, 3 * C, 0, T);
    load_tile_async(sV[0], base + 2 * C, 3 * C, 0, T);
    cp_commit();
    __syncthreads();
    unsigned qa[2][4][4];
    load_a32(qa, sK[1], sV[1], warp, g, q);
    __syncthreads();  // every warp has its fragments: sK[1] and sV[1] are free
    float o[2][8][4];
    zero(o);
    // Row maxima of the raw scores s; exp((s − max)·scale) = 2^(s·sl2 − max·sl2), one FFMA
    // and one ex2 a score. Row state [m][r]: the rows of m-tile m, r = 0 for row +g, 1 for
    // +g+8.
    const float sl2 = scale * LOG2E;
    float mx[2][2], l[2][4];
    #pragma unroll
    for (int m = 0; m < 2; ++m) {
        mx[m][0] = mx[m][1] = NEG_INF;
        l[m][0] = l[m][1] = l[m][2] = l[m][3] = 0.0f;
    }
    const unsigned kend = umin(T, q0 + QT);
    for (unsigned k0 = 0, cur = 0; k0 < kend; k0 += TILE, cur ^= 1) {
        const bool next = k0 + TILE < kend;
        if (next) {  // into the buffers the last iteration was done with (synchronised)
            load_tile_async(sK[cur ^ 1], base + C, 3 * C, k0 + TILE, T);
            load_tile_async(sV[cur ^ 1], base + 2 * C, 3 * C, k0 + TILE, T);
            cp_commit();
        }
        cp_wait(next);
        __syncthreads();  // every thread's copies of this tile have landed
        if (k0 < w0 + WR && w0 < T) {  // some key at or before some row of the warp
            if (needs_mask(w0, WR, k0, TILE, T))
                fwd_tile<true>(o, mx, l, qa, sK[cur], sV[cur], w0, k0, T, sl2, lane);
            else
                fwd_tile<false>(o, mx, l, qa, sK[cur], sV[cur], w0, k0, T, sl2, lane);
        }
        __syncthreads();  // every warp is done with sK[cur] and sV[cur]
    }
    bf16* yb = y + (idx_t)b * T * C + (idx_t)h * HD + 2 * q;
    #pragma unroll
    for (int m = 0; m < 2; ++m) {
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned row = frag_row(w0, m, g, 2 * r);
            if (row < T) {
                const float sum = l[m][2 * r];
                float inv = 1.0f / sum;
                #pragma unroll
                for (int j = 0; j < 8; ++j)
                    *(__nv_bfloat162*)(yb + (idx_t)row * C + j * 8) =
                        __floats2bfloat162_rn(o[m][j][2 * r] * inv, o[m][j][2 * r + 1] * inv);
                if (q == 0) lse[(idx_t)bh * T + row] = mx[m][r] * scale + logf(sum);
            }
        }
    }
}

// D of the warp's 32 rows w0 .. w0+31 (D = Σ_d dy·y over the head's row; 0 past T) into
// sd[0..31] and D[bh·T + t]: eight lanes a row, 16 bytes of y and dy each, four rows a pass.
__device__ void rows_d(float* sd, float* D, const bf16* yb, const bf16* dyb, idx_t C,
                       unsigned w0, unsigned bh, unsigned T, int lane) {
    const int part = lane % 8;
    #pragma unroll 1
    for (int i = lane / 8; i < WR; i += 4) {
        const unsigned t = w0 + i;
        float s = 0.0f;
        if (t < T) {
            uint4 a = *(const uint4*)(yb + (idx_t)t * C + part * 8);
            uint4 d = *(const uint4*)(dyb + (idx_t)t * C + part * 8);
            const __nv_bfloat162* a2 = (const __nv_bfloat162*)&a;
            const __nv_bfloat162* d2 = (const __nv_bfloat162*)&d;
            #pragma unroll
            for (int k = 0; k < 4; ++k)
                s += __low2float(a2[k]) * __low2float(d2[k]) +
                     __high2float(a2[k]) * __high2float(d2[k]);
        }
        // Every lane takes part: the shuffles name the whole warp.
        for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
        if (part == 0) {
            sd[i] = s;
            if (t < T) D[(idx_t)bh * T + t] = s;
        }
    }
}

// One key tile of dq for a warp's 32 queries, KC keys a step. MASK as in fwd_tile.
template <bool MASK>
__device__ __forceinline__ void dq_tile(float (&dq)[2][8][4], const unsigned (&qa)[2][4][4],
                                        const unsigned (&da)[2][4][4], const float (&ls)[2][2],
                                        const float (&ds)[2][2], const bf16* sk, const bf16* sv,
                                        unsigned w0, unsigned k0, unsigned T, float sl2,
                                        int lane) {
    const int g = lane / 4, q = lane % 4;
    #pragma unroll 1
    for (int c = 0; c < TILE / KC; ++c) {
        const bf16* ck = sk + c * KC * LDA;  // keys k0 + KC·c ..
        float s[2][KC / 8][4], dp[2][KC / 8][4];
        mm_abt<2, KC / 8>(s, qa, ck, lane);
        mm_abt<2, KC / 8>(dp, da, sv + c * KC * LDA, lane);
        unsigned dsa[2][KC / 16][4];
        #pragma unroll
        for (int m = 0; m < 2; ++m) {
            #pragma unroll
            for (int j = 0; j < KC / 8; ++j) {
                float v[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float p = ex2(s[m][j][e] * sl2 - ls[m][e / 2]);
                    if (MASK) {
                        unsigned key = k0 + c * KC + j * 8 + 2 * q + (e & 1);
                        unsigned row = frag_row(w0, m, g, e);
                        if (!(key <= row && row < T)) p = 0.0f;
                    }
                    v[e] = p * (dp[m][j][e] - ds[m][e / 2]);
                }
                dsa[m][j / 2][(j % 2) * 2] = pack(v[0], v[1]);
                dsa[m][j / 2][(j % 2) * 2 + 1] = pack(v[2], v[3]);
            }
        }
        mm_ab<2, KC / 16>(dq, dsa, ck, lane);
    }
}

// Backward, dq: block per 128 queries (warp w: w0 = q0 + 32w .. +31, as in the forward
// pass), over the key tiles up to the block's last query: dS = P ⊙ (dP − D)·scale,
// P = exp(scale·q·kᵀ − lse), dP = dy·vᵀ; dq = Σ dS·k, with the factor scale applied to
// the sum once. Each key tile in steps of KC keys
// (a rolled loop), so that a thread holds the scores of KC keys, not 64. D of the block's
// rows is computed here, written for attn_bwd_dkdv.
// With bsum (not null), the block also writes the column sums of the dq it stores (the
// bf16 values, read back) over its rows < T: row b·⌈T/QT⌉ + q0/QT, columns h·64 .. +63, of
// a (B·⌈T/QT⌉ × C) f32 partial at bsum, the QKV bias gradient's q part once its rows are
// added up (attn_bwd_dkdv writes dk's and dv's after it). A lane sums its rows in order,
// group_sum the warp's row groups, and the block its warps' sums in warp order through
// shared memory: no atomics, a fixed order. Rows ≥ T add nothing.
extern "C" __global__ void __launch_bounds__(NT, 2)
attn_bwd_dq(bf16* dqkv, float* D, float* bsum, const bf16* qkv, const bf16* y,
            const bf16* dy, const float* lse, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sK[2][TILE * LDA];
    __shared__ __align__(16) bf16 sV[2][TILE * LDA];
    __shared__ float sD[QT];
    __shared__ float sB[NT / 32][HD];
    const unsigned q0 = (gridDim.y - 1 - blockIdx.y) * QT;
    const unsigned bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const bf16* dyb = dy + (idx_t)b * T * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned w0 = q0 + warp * WR;
    // q fragments through sK[1] and sV[1], then dy's; the first k and v tiles on their
    // way into sK[0] and sV[0]; D of the warp's rows into sD.
    load_tile(sK[1], base, 3 * C, q0, T);
    load_tile(sV[1], base, 3 * C, q0 + TILE, T);
    load_tile_async(sK[0], base + C, 3 * C, 0, T);
    load_tile_async(sV[0], base + 2 * C, 3 * C, 0, T);
    cp_commit();
    rows_d(sD + warp * WR, D, y + (idx_t)b * T * C + (idx_t)h * HD, dyb, C, w0, bh, T, lane);
    __syncthreads();
    unsigned qa[2][4][4], da[2][4][4];
    load_a32(qa, sK[1], sV[1], warp, g, q);
    __syncthreads();  // every warp has its q fragments
    load_tile(sK[1], dyb, C, q0, T);
    load_tile(sV[1], dyb, C, q0 + TILE, T);
    __syncthreads();
    load_a32(da, sK[1], sV[1], warp, g, q);
    __syncthreads();  // every warp has its dy fragments: sK[1] and sV[1] are free
    // P = 2^(s·sl2 − lse·log2(e)): exp(s·scale − lse) in log2 units. Row statistics
    // [m][r] as in the forward pass.
    const float sl2 = scale * LOG2E;
    float ls[2][2], ds[2][2];
    #pragma unroll
    for (int m = 0; m < 2; ++m) {
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned row = frag_row(w0, m, g, 2 * r);
            ls[m][r] = row < T ? lse[(idx_t)bh * T + row] * LOG2E : 0.0f;
            ds[m][r] = sD[row - q0];
        }
    }
    float dq[2][8][4];
    zero(dq);
    const unsigned kend = umin(T, q0 + QT);
    for (unsigned k0 = 0, cur = 0; k0 < kend; k0 += TILE, cur ^= 1) {
        const bool next = k0 + TILE < kend;
        if (next) {  // k and v of the next tile
            load_tile_async(sK[cur ^ 1], base + C, 3 * C, k0 + TILE, T);
            load_tile_async(sV[cur ^ 1], base + 2 * C, 3 * C, k0 + TILE, T);
            cp_commit();
        }
        cp_wait(next);
        __syncthreads();
        if (k0 < w0 + WR && w0 < T) {  // some key at or before some row of the warp
            if (needs_mask(w0, WR, k0, TILE, T))
                dq_tile<true>(dq, qa, da, ls, ds, sK[cur], sV[cur], w0, k0, T, sl2, lane);
            else
                dq_tile<false>(dq, qa, da, ls, ds, sK[cur], sV[cur], w0, k0, T, sl2, lane);
        }
        __syncthreads();  // every warp is done with sK[cur] and sV[cur]
    }
    bf16* out = dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD + 2 * q;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        float2 s = make_float2(0.0f, 0.0f);  // columns j·8 + 2q, +1 over the lane's rows
        #pragma unroll
        for (int m = 0; m < 2; ++m) {
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                const unsigned row = frag_row(w0, m, g, 2 * r);
                if (row < T) {
                    const __nv_bfloat162 v = __floats2bfloat162_rn(
                        dq[m][j][2 * r] * scale, dq[m][j][2 * r + 1] * scale);
                    *(__nv_bfloat162*)(out + (idx_t)row * 3 * C + j * 8) = v;
                    s.x += __low2float(v);
                    s.y += __high2float(v);
                }
            }
        }
        if (bsum) {
            s = group_sum(s);
            if (g == 0) {
                sB[warp][j * 8 + 2 * q] = s.x;
                sB[warp][j * 8 + 2 * q + 1] = s.y;
            }
        }
    }
    if (bsum) {
        __syncthreads();
        if (threadIdx.x < HD) {
            float t = 0.0f;
            #pragma unroll
            for (int w = 0; w < NT / 32; ++w) t += sB[w][threadIdx.x];
            const idx_t part = (idx_t)b * gridDim.y + q0 / QT;
            bsum[part * C + (idx_t)h * HD + threadIdx.x] = t;
        }
    }
}

// lse (in log2 units, lse·log2(e)) and D of rows q0 .. q0+63 of head bh into sl and sd
// (0 past T).
__device__ void load_stats(float* sl, float* sd, const float* lse, const float* D, unsigned bh,
                           unsigned q0, unsigned T) {
    if (threadIdx.x < TILE) {
        unsigned t = q0 + threadIdx.x;
        sl[threadIdx.x] = t < T ? lse[(idx_t)bh * T + t] * LOG2E : 0.0f;
        sd[threadIdx.x] = t < T ? D[(idx_t)bh * T + t] : 0.0f;
    }
}

// One query tile of dk and dv for a warp's 16·DKM keys key0 - g .. (key0 = its first key
// + g), from q and dy in sq and so and their rows' statistics in sl and sd, DKQ queries a
// step. MASK as in fwd_tile.
template <bool MASK>
__device__ __forceinline__ void dkdv_tile(float (&dk)[DKM][8][4], float (&dv)[DKM][8][4],
                                          const unsigned (&ka)[DKM][4][4],
                                          const unsigned (&va)[DKM][4][4], const bf16* sq,
                                          const bf16* so, const float* sl, const float* sd,
                                          unsigned q0, unsigned key0, unsigned T, float sl2,
                                          int lane) {
    const int q = lane % 4;
    #pragma unroll 1
    for (int part = 0; part < TILE / DKQ; ++part) {
        const bf16* hq = sq + part * DKQ * LDA;  // queries q0 + DKQ·part ..
        const bf16* ho = so + part * DKQ * LDA;
        float st[DKM][DKQ / 8][4], dpt[DKM][DKQ / 8][4];
        mm_abt<DKM, DKQ / 8>(st, ka, hq, lane);
        mm_abt<DKM, DKQ / 8>(dpt, va, ho, lane);
        unsigned pa[DKM][DKQ / 16][4], dsa[DKM][DKQ / 16][4];
        #pragma unroll
        for (int m = 0; m < DKM; ++m) {
            #pragma unroll
            for (int j = 0; j < DKQ / 8; ++j) {
                float p[4], ds[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = part * DKQ + j * 8 + 2 * q + (e & 1);
                    p[e] = ex2(st[m][j][e] * sl2 - sl[c]);
                    if (MASK) {
                        unsigned row = q0 + c, key = key0 + 16 * m + (e < 2 ? 0 : 8);
                        if (!(key <= row && row < T)) p[e] = 0.0f;
                    }
                    ds[e] = p[e] * (dpt[m][j][e] - sd[c]);  // scale: on dk's sum
                }
                pa[m][j / 2][(j % 2) * 2] = pack(p[0], p[1]);
                pa[m][j / 2][(j % 2) * 2 + 1] = pack(p[2], p[3]);
                dsa[m][j / 2][(j % 2) * 2] = pack(ds[0], ds[1]);
                dsa[m][j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3]);
            }
        }
        mm_ab<DKM, DKQ / 16>(dv, pa, ho, lane);
        mm_ab<DKM, DKQ / 16>(dk, dsa, hq, lane);
    }
}

// Backward, dk and dv: block per KB keys (grid (B·NH, ceil(T/KB)); warp w: keys
// kw0 = k0 + 16·DKM·w .. +16·DKM−1, m-tile m its keys kw0 + 16m ..), over the query
// tiles from the diagonal on, with the transposed products: Sᵀ = k·qᵀ, dPᵀ = v·dyᵀ,
// dv = Σ Pᵀ·dy, dk = Σ dSᵀ·q. Each query tile in steps of DKQ queries (a rolled loop), so
// that a thread holds the scores of DKQ queries: few enough registers for DKB blocks an
// SM. D is attn_bwd_dq's.
// With bsum (not null: attn_bwd_dq's, of (B·⌈T/QT⌉ + 2·B·⌈T/KB⌉) × C floats), the block
// also writes the column sums of the dk and dv it stores (the bf16 values, read back) over
// its keys < T, as attn_bwd_dq does for dq: row b·⌈T/KB⌉ + blockIdx.y, columns h·64 ..
// +63, of two (B·⌈T/KB⌉ × C) f32 partials placed after dq's B·⌈T/QT⌉ rows, dk's then
// dv's. The sums are taken after the main loop, from the values the epilogue stores (its
// registers are full before).
extern "C" __global__ void __launch_bounds__(NT, DKB)
attn_bwd_dkdv(bf16* dqkv, float* bsum, const bf16* qkv, const bf16* dy, const float* lse,
              const float* D, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sQ[2][TILE * LDA];
    __shared__ __align__(16) bf16 sO[2][TILE * LDA];
    __shared__ float sLse[2][TILE], sD[2][TILE];
    __shared__ float sB[2][NT / 32][HD];
    const unsigned k0 = blockIdx.y * KB;
    const unsigned bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const bf16* dyb = dy + (idx_t)b * T * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned kw0 = k0 + warp * 16 * DKM, key0 = kw0 + g;
    unsigned ka[DKM][4][4], va[DKM][4][4];
    if (KB == TILE) {
        // k and v fragments of the warp's keys, through sQ[1] and sO[1]; the first q and
        // dy tiles (from the diagonal, q0 = k0) on their way into sQ[0] and sO[0].
        load_tile(sQ[1], base + C, 3 * C, k0, T);
        load_tile(sO[1], base + 2 * C, 3 * C, k0, T);
        load_tile_async(sQ[0], base, 3 * C, k0, T);
        load_tile_async(sO[0], dyb, C, k0, T);
        cp_commit();
        __syncthreads();
        #pragma unroll
        for (int m = 0; m < DKM; ++m) {
            load_a(ka[m], sQ[1], warp * 16 * DKM + 16 * m, g, q);
            load_a(va[m], sO[1], warp * 16 * DKM + 16 * m, g, q);
        }
    } else {
        // KB = 128: k through sQ[0] and sQ[1], v through sO[0] and sO[1]; then the first
        // q and dy tiles.
        load_tile(sQ[0], base + C, 3 * C, k0, T);
        load_tile(sQ[1], base + C, 3 * C, k0 + TILE, T);
        load_tile(sO[0], base + 2 * C, 3 * C, k0, T);
        load_tile(sO[1], base + 2 * C, 3 * C, k0 + TILE, T);
        __syncthreads();
        #pragma unroll
        for (int m = 0; m < DKM; ++m) {
            const int r = warp * 16 * DKM + 16 * m;
            load_a(ka[m], sQ[r / TILE], r % TILE, g, q);
            load_a(va[m], sO[r / TILE], r % TILE, g, q);
        }
        __syncthreads();
        load_tile_async(sQ[0], base, 3 * C, k0, T);
        load_tile_async(sO[0], dyb, C, k0, T);
        cp_commit();
    }
    load_stats(sLse[0], sD[0], lse, D, bh, k0, T);
    __syncthreads();  // every warp has its fragments: sQ[1] and sO[1] are free
    float dk[DKM][8][4], dv[DKM][8][4];
    zero(dk);
    zero(dv);
    const float sl2 = scale * LOG2E;
    for (unsigned q0 = k0, cur = 0; q0 < T; q0 += TILE, cur ^= 1) {
        const bool next = q0 + TILE < T;
        if (next) {  // q, dy and the statistics of the next tile
            load_tile_async(sQ[cur ^ 1], base, 3 * C, q0 + TILE, T);
            load_tile_async(sO[cur ^ 1], dyb, C, q0 + TILE, T);
            cp_commit();
            load_stats(sLse[cur ^ 1], sD[cur ^ 1], lse, D, bh, q0 + TILE, T);
        }
        cp_wait(next);
        __syncthreads();
        const float* sl = sLse[cur];
        const float* sd = sD[cur];
        if (q0 + TILE > kw0 && kw0 < T) {  // some query at or after some key of the warp
            if (needs_mask(q0, TILE, kw0, 16 * DKM, T))
                dkdv_tile<true>(dk, dv, ka, va, sQ[cur], sO[cur], sl, sd, q0, key0, T, sl2,
                                lane);
            else
                dkdv_tile<false>(dk, dv, ka, va, sQ[cur], sO[cur], sl, sd, q0, key0, T, sl2,
                                 lane);
        }
        __syncthreads();  // every warp is done with this tile's buffers and statistics
    }
    bf16* out = dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD + 2 * q;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        // Columns j·8 + 2q, +1 of dk and dv over the lane's keys.
        float2 sk = make_float2(0.0f, 0.0f), sv = make_float2(0.0f, 0.0f);
        #pragma unroll
        for (int m = 0; m < DKM; ++m) {
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                const unsigned key = key0 + 16 * m + 8 * r;
                if (key < T) {
                    const __nv_bfloat162 vk = __floats2bfloat162_rn(
                        dk[m][j][2 * r] * scale, dk[m][j][2 * r + 1] * scale);
                    const __nv_bfloat162 vv =
                        __floats2bfloat162_rn(dv[m][j][2 * r], dv[m][j][2 * r + 1]);
                    *(__nv_bfloat162*)(out + (idx_t)key * 3 * C + C + j * 8) = vk;
                    *(__nv_bfloat162*)(out + (idx_t)key * 3 * C + 2 * C + j * 8) = vv;
                    sk.x += __low2float(vk);
                    sk.y += __high2float(vk);
                    sv.x += __low2float(vv);
                    sv.y += __high2float(vv);
                }
            }
        }
        if (bsum) {
            sk = group_sum(sk);
            sv = group_sum(sv);
            if (g == 0) {
                sB[0][warp][j * 8 + 2 * q] = sk.x;
                sB[0][warp][j * 8 + 2 * q + 1] = sk.y;
                sB[1][warp][j * 8 + 2 * q] = sv.x;
                sB[1][warp][j * 8 + 2 * q + 1] = sv.y;
            }
        }
    }
    if (bsum) {
        __syncthreads();
        // Threads 0..63 dk's columns, 64..127 dv's (NT = 2·HD).
        const unsigned kv = threadIdx.x / HD, c = threadIdx.x % HD;
        float t = 0.0f;
        #pragma unroll
        for (int w = 0; w < NT / 32; ++w) t += sB[kv][w][c];
        const idx_t batch = gridDim.x / NH, q_parts = batch * ((T + QT - 1) / QT);
        const idx_t part =
            q_parts + kv * batch * gridDim.y + (idx_t)b * gridDim.y + blockIdx.y;
        bsum[part * C + (idx_t)h * HD + c] = t;
    }
}
