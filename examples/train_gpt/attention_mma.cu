// Fused causal attention of train_gpt in bf16 on tensor cores through mma.sync
// (m16n8k16, bf16 in, f32 accumulate), flash-attention-2 style: each warp of a block owns
// 16 rows of a 64-row tile, its scores, probabilities and accumulators stay in registers,
// and K, V (or Q, dO) tiles of 64 rows stream through shared memory, double-buffered: the
// next tile's cp.async copies run while the current one is multiplied. Exponentials are
// ex2.approx with the softmax scale folded into log2 units, one FFMA and one MUFU per
// score (bf16 precision is what the products keep); the causal mask is applied only to
// the tiles that need it (the diagonal one, and rows past T). Same interface and
// layouts as attention.cu: q, k, v read from the QKV product (B, T, 3, NH, 64), y written
// as (B, T, NH, 64), dq, dk, dv into dqkv (B, T, 3, NH, 64); head size 64; no atomics.
// Every buffer is 16-byte aligned (the host checks).
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
// Tile rows: 144 bytes, so 32-bit fragment loads of rows g = 0..7 hit distinct banks.
#define LDA (HD + 8)
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000u)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
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

// Whether a tile pair needs the causal mask: it holds the diagonal, or rows past T.
__device__ __forceinline__ bool needs_mask(unsigned q0, unsigned k0, unsigned T) {
    return q0 == k0 || q0 + TILE > T;
}

// Two consecutive bf16 of a row (even index).
__device__ __forceinline__ unsigned ld2(const bf16* p) { return *(const unsigned*)p; }
// Rounds (lo, hi) to bf16 and packs them; `sum` gets the rounded values.
__device__ __forceinline__ unsigned pack(float lo, float hi, float& sum) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    sum += __low2float(v) + __high2float(v);
    return *(unsigned*)&v;
}
__device__ __forceinline__ unsigned pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned*)&v;
}
// Sum and max over the 4 lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL, v, 1);
    return v + __shfl_xor_sync(FULL, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL, v, 2));
}

// Rows r0 .. r0+63 of a (T × 64, rows `stride` apart) matrix at `base` into s (64 × LDA),
// 16 bytes at a time; rows at or past T are zeros.
__device__ void load_tile(bf16* s, const bf16* base, idx_t stride, unsigned r0, unsigned T) {
    for (int e = threadIdx.x; e < TILE * HD / 8; e += NT) {
        int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
        unsigned t = r0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (t < T) v = *(const uint4*)(base + (idx_t)t * stride + c);
        *(uint4*)(s + r * LDA + c) = v;
    }
}

// The same as load_tile with cp.async (16 bytes each, zeros past T), in the calling
// thread's current group of copies.
__device__ void load_tile_async(bf16* s, const bf16* base, idx_t stride, unsigned r0,
                                unsigned T) {
    for (int e = threadIdx.x; e < TILE * HD / 8; e += NT) {
        int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
        unsigned t = r0 + r;
        int bytes = t < T ? 16 : 0;  // 0: no read, the 16 bytes are zero-filled
        const bf16* src = base + (idx_t)(t < T ? t : 0) * stride + c;
        cp_async16(s + r * LDA + c, src, bytes);
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

// acc[j] = A · Bᵀ over the 64 columns: the warp's 16 rows (fragments a) against rows
// j·8 .. j·8+7 of the tile s (B(k, n) = s[n][k]), j < NJ (8: the whole tile; 4: the 32
// rows from s). One ldmatrix gives the B fragments of two k-steps: matrices at columns
// 32h, +8, +16, +24.
template <int NJ = 8>
__device__ __forceinline__ void mm_abt(float (*acc)[4], unsigned (*a)[4], const bf16* s,
                                       int lane) {
    const bf16* base = s + (lane % 8) * LDA + (lane / 8) * 8;
    #pragma unroll
    for (int j = 0; j < NJ; ++j) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            unsigned b[4];
            ldsm(b, base + j * 8 * LDA + h * 32);
            mma(acc[j], a[2 * h], b[0], b[1]);
            mma(acc[j], a[2 * h + 1], b[2], b[3]);
        }
    }
}

// acc[j] += P · s over 16·NK rows of s (B(k, n) = s[k][n], columns j·8 .. j·8+7), P
// given as A fragments p (NK k-steps over s's rows: 4, the whole tile; 2, the 32 rows
// from s). One transposing ldmatrix gives the B fragments of two n-tiles: matrices at
// (rows, columns) (0, 0), (8, 0), (0, 8), (8, 8) of the block.
template <int NK = 4>
__device__ __forceinline__ void mm_ab(float (*acc)[4], unsigned (*p)[4], const bf16* s,
                                      int lane) {
    const int m = lane / 8;
    const bf16* base = s + ((m & 1) * 8 + lane % 8) * LDA + (m >> 1) * 8;
    #pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
        #pragma unroll
        for (int j = 0; j < 8; j += 2) {
            unsigned b[4];
            ldsm_t(b, base + kk * 16 * LDA + j * 8);
            mma(acc[j], p[kk], b[0], b[1]);
            mma(acc[j + 1], p[kk], b[2], b[3]);
        }
    }
}

// Forward: grid (ceil(T/64), B·NH), 128 threads; warp w owns queries q0 + 16w .. +15.
extern "C" __global__ void __launch_bounds__(NT)
attn_fwd(bf16* y, float* lse, const bf16* qkv, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sQ[TILE * LDA];
    __shared__ __align__(16) bf16 sK[2][TILE * LDA];
    __shared__ __align__(16) bf16 sV[2][TILE * LDA];
    const unsigned q0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    load_tile(sQ, base, 3 * C, q0, T);
    load_tile_async(sK[0], base + C, 3 * C, 0, T);
    load_tile_async(sV[0], base + 2 * C, 3 * C, 0, T);
    cp_commit();
    __syncthreads();
    unsigned qa[4][4];
    load_a(qa, sQ, warp * 16, g, q);
    float o[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    // Scores in log2 units: s·scale·log2(e), so that exp(x·scale) = 2^(x·sl2).
    const float sl2 = scale * LOG2E;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const unsigned kend = umin(T, q0 + TILE);
    for (unsigned k0 = 0, cur = 0; k0 < kend; k0 += TILE, cur ^= 1) {
        const bool next = k0 + TILE < kend;
        if (next) {  // into the buffers the last iteration was done with (synchronised)
            load_tile_async(sK[cur ^ 1], base + C, 3 * C, k0 + TILE, T);
            load_tile_async(sV[cur ^ 1], base + 2 * C, 3 * C, k0 + TILE, T);
            cp_commit();
        }
        cp_wait(next);
        __syncthreads();  // every thread's copies of this tile have landed
        float s[8][4];
        mm_abt(s, qa, sK[cur], lane);
        const bool mask = needs_mask(q0, k0, T);
        float mx0 = NEG_INF, mx1 = NEG_INF;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                unsigned key = k0 + j * 8 + 2 * q + (e & 1), row = e < 2 ? row0 : row1;
                float v = s[j][e] * sl2;
                if (mask && !(key <= row && key < T)) v = NEG_INF;
                s[j][e] = v;
                if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
            }
        }
        float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
        // Rows with no key yet (only rows past T) keep exp() finite.
        float ref0 = mn0 == NEG_INF ? 0.0f : mn0, ref1 = mn1 == NEG_INF ? 0.0f : mn1;
        float alpha0 = ex2(m0 - ref0), alpha1 = ex2(m1 - ref1);
        unsigned pa[4][4];
        float ps0 = 0.0f, ps1 = 0.0f;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned lo = pack(ex2(s[j][0] - ref0), ex2(s[j][1] - ref0), ps0);
            unsigned hi = pack(ex2(s[j][2] - ref1), ex2(s[j][3] - ref1), ps1);
            pa[j / 2][(j % 2) * 2] = lo;
            pa[j / 2][(j % 2) * 2 + 1] = hi;
        }
        l0 = l0 * alpha0 + quad_sum(ps0);
        l1 = l1 * alpha1 + quad_sum(ps1);
        m0 = mn0;
        m1 = mn1;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            o[j][0] *= alpha0;
            o[j][1] *= alpha0;
            o[j][2] *= alpha1;
            o[j][3] *= alpha1;
        }
        mm_ab(o, pa, sV[cur], lane);
        __syncthreads();  // every warp is done with sK[cur] and sV[cur]
    }
    bf16* yb = y + (idx_t)b * T * C + (idx_t)h * HD + 2 * q;
    if (row0 < T) {
        float inv = 1.0f / l0;
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            *(__nv_bfloat162*)(yb + (idx_t)row0 * C + j * 8) =
                __floats2bfloat162_rn(o[j][0] * inv, o[j][1] * inv);
        if (q == 0) lse[(idx_t)bh * T + row0] = m0 * LN2 + logf(l0);
    }
    if (row1 < T) {
        float inv = 1.0f / l1;
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            *(__nv_bfloat162*)(yb + (idx_t)row1 * C + j * 8) =
                __floats2bfloat162_rn(o[j][2] * inv, o[j][3] * inv);
        if (q == 0) lse[(idx_t)bh * T + row1] = m1 * LN2 + logf(l1);
    }
}

// Backward preprocessing: D[b,h,t] = Σ_d dy·y over the head's row. Eight lanes per row
// (b·T + t)·NH + h of y and dy (B, T, NH, HD), lane p of the eight taking elements
// p, p + 8, ..; 32 rows per block of 256.
extern "C" __global__ void attn_bwd_d(float* D, const bf16* y, const bf16* dy, unsigned rows,
                                      unsigned T, unsigned NH) {
    unsigned row = blockIdx.x * 32 + threadIdx.x / 8, part = threadIdx.x % 8;
    float s = 0.0f;
    if (row < rows) {
        const bf16* a = y + (idx_t)row * HD;
        const bf16* g = dy + (idx_t)row * HD;
        for (unsigned i = part; i < HD; i += 8)
            s += __bfloat162float(a[i]) * __bfloat162float(g[i]);
    }
    // Every lane takes part: the shuffles name the whole warp.
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (row < rows && part == 0) {
        unsigned h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
        D[((idx_t)b * NH + h) * T + t] = s;
    }
}

// Backward, dq: block per 64 queries (warp w: 16), over the key tiles up to the diagonal:
// dS = P ⊙ (dP − D)·scale, P = exp(scale·q·kᵀ − lse), dP = dy·vᵀ; dq = Σ dS·k. Each
// key tile in two halves of 32 keys (a rolled loop), so that a thread holds the scores
// of 32 keys, not 64: few enough registers for 3 blocks per SM.
extern "C" __global__ void __launch_bounds__(NT, 3)
attn_bwd_dq(bf16* dqkv, const bf16* qkv, const bf16* dy, const float* lse, const float* D,
            unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sA[2][TILE * LDA];
    __shared__ __align__(16) bf16 sB[2][TILE * LDA];
    const unsigned q0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    // q and dy fragments of the warp's rows, through sA[1] and sB[1]; the first k and v
    // tiles on their way into sA[0] and sB[0].
    load_tile(sA[1], base, 3 * C, q0, T);
    load_tile(sB[1], dy + (idx_t)b * T * C + (idx_t)h * HD, C, q0, T);
    load_tile_async(sA[0], base + C, 3 * C, 0, T);
    load_tile_async(sB[0], base + 2 * C, 3 * C, 0, T);
    cp_commit();
    __syncthreads();
    unsigned qa[4][4], da[4][4];
    load_a(qa, sA[1], warp * 16, g, q);
    load_a(da, sB[1], warp * 16, g, q);
    __syncthreads();  // every warp has its fragments: sA[1] and sB[1] are free
    // P = 2^(s·sl2 − lse·log2(e)): exp(s·scale − lse) in log2 units.
    const float sl2 = scale * LOG2E;
    const float lse0 = row0 < T ? lse[(idx_t)bh * T + row0] * LOG2E : 0.0f;
    const float lse1 = row1 < T ? lse[(idx_t)bh * T + row1] * LOG2E : 0.0f;
    const float d0 = row0 < T ? D[(idx_t)bh * T + row0] : 0.0f;
    const float d1 = row1 < T ? D[(idx_t)bh * T + row1] : 0.0f;
    float dq[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
    const unsigned kend = umin(T, q0 + TILE);
    for (unsigned k0 = 0, cur = 0; k0 < kend; k0 += TILE, cur ^= 1) {
        const bool next = k0 + TILE < kend;
        if (next) {  // k and v of the next tile
            load_tile_async(sA[cur ^ 1], base + C, 3 * C, k0 + TILE, T);
            load_tile_async(sB[cur ^ 1], base + 2 * C, 3 * C, k0 + TILE, T);
            cp_commit();
        }
        cp_wait(next);
        __syncthreads();
        const bool mask = needs_mask(q0, k0, T);
        #pragma unroll 1
        for (int half = 0; half < 2; ++half) {
            const bf16* hk = sA[cur] + half * 32 * LDA;  // keys k0 + 32·half ..
            float s[4][4], dp[4][4];
            mm_abt<4>(s, qa, hk, lane);
            mm_abt<4>(dp, da, sB[cur] + half * 32 * LDA, lane);
            unsigned dsa[2][4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                float ds[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    unsigned key = k0 + half * 32 + j * 8 + 2 * q + (e & 1);
                    unsigned row = e < 2 ? row0 : row1;
                    float l = e < 2 ? lse0 : lse1, dd = e < 2 ? d0 : d1;
                    float p = ex2(s[j][e] * sl2 - l);
                    if (mask && !(key <= row && row < T)) p = 0.0f;
                    ds[e] = p * (dp[j][e] - dd) * scale;
                }
                dsa[j / 2][(j % 2) * 2] = pack(ds[0], ds[1]);
                dsa[j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3]);
            }
            mm_ab<2>(dq, dsa, hk, lane);
        }
        __syncthreads();  // every warp is done with sA[cur] and sB[cur]
    }
    bf16* out = dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD + 2 * q;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (row0 < T)
            *(__nv_bfloat162*)(out + (idx_t)row0 * 3 * C + j * 8) =
                __floats2bfloat162_rn(dq[j][0], dq[j][1]);
        if (row1 < T)
            *(__nv_bfloat162*)(out + (idx_t)row1 * 3 * C + j * 8) =
                __floats2bfloat162_rn(dq[j][2], dq[j][3]);
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

// Backward, dk and dv: block per 64 keys (warp w: keys k0 + 16w .. +15), over the query
// tiles from the diagonal on, with the transposed products: Sᵀ = k·qᵀ, dPᵀ = v·dyᵀ,
// dv = Σ Pᵀ·dy, dk = Σ dSᵀ·q. Each query tile in two halves of 32 queries, as in
// attn_bwd_dq.
extern "C" __global__ void __launch_bounds__(NT, 3)
attn_bwd_dkdv(bf16* dqkv, const bf16* qkv, const bf16* dy, const float* lse, const float* D,
              unsigned T, unsigned NH, float scale) {
    __shared__ __align__(16) bf16 sQ[2][TILE * LDA];
    __shared__ __align__(16) bf16 sO[2][TILE * LDA];
    __shared__ float sLse[2][TILE], sD[2][TILE];
    const unsigned k0 = blockIdx.x * TILE;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const bf16* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const bf16* dyb = dy + (idx_t)b * T * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const unsigned key0 = k0 + warp * 16 + g, key1 = key0 + 8;
    // k and v fragments of the warp's keys, through sQ[1] and sO[1]; the first q and dy
    // tiles (from the diagonal, q0 = k0) on their way into sQ[0] and sO[0].
    load_tile(sQ[1], base + C, 3 * C, k0, T);
    load_tile(sO[1], base + 2 * C, 3 * C, k0, T);
    load_tile_async(sQ[0], base, 3 * C, k0, T);
    load_tile_async(sO[0], dyb, C, k0, T);
    cp_commit();
    load_stats(sLse[0], sD[0], lse, D, bh, k0, T);
    __syncthreads();
    unsigned ka[4][4], va[4][4];
    load_a(ka, sQ[1], warp * 16, g, q);
    load_a(va, sO[1], warp * 16, g, q);
    __syncthreads();  // every warp has its fragments: sQ[1] and sO[1] are free
    float dk[8][4], dv[8][4];
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.0f;
        dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.0f;
    }
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
        const bool mask = needs_mask(q0, k0, T);
        #pragma unroll 1
        for (int half = 0; half < 2; ++half) {
            const bf16* hq = sQ[cur] + half * 32 * LDA;  // queries q0 + 32·half ..
            const bf16* ho = sO[cur] + half * 32 * LDA;
            float st[4][4], dpt[4][4];
            mm_abt<4>(st, ka, hq, lane);
            mm_abt<4>(dpt, va, ho, lane);
            unsigned pa[2][4], dsa[2][4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                float p[4], ds[4];
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = half * 32 + j * 8 + 2 * q + (e & 1);
                    unsigned row = q0 + c, key = e < 2 ? key0 : key1;
                    p[e] = ex2(st[j][e] * sl2 - sl[c]);
                    if (mask && !(key <= row && row < T)) p[e] = 0.0f;
                    ds[e] = p[e] * (dpt[j][e] - sd[c]) * scale;
                }
                pa[j / 2][(j % 2) * 2] = pack(p[0], p[1]);
                pa[j / 2][(j % 2) * 2 + 1] = pack(p[2], p[3]);
                dsa[j / 2][(j % 2) * 2] = pack(ds[0], ds[1]);
                dsa[j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3]);
            }
            mm_ab<2>(dv, pa, ho, lane);
            mm_ab<2>(dk, dsa, hq, lane);
        }
        __syncthreads();  // every warp is done with this tile's buffers and statistics
    }
    bf16* out = dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD + 2 * q;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (key0 < T) {
            *(__nv_bfloat162*)(out + (idx_t)key0 * 3 * C + C + j * 8) =
                __floats2bfloat162_rn(dk[j][0], dk[j][1]);
            *(__nv_bfloat162*)(out + (idx_t)key0 * 3 * C + 2 * C + j * 8) =
                __floats2bfloat162_rn(dv[j][0], dv[j][1]);
        }
        if (key1 < T) {
            *(__nv_bfloat162*)(out + (idx_t)key1 * 3 * C + C + j * 8) =
                __floats2bfloat162_rn(dk[j][2], dk[j][3]);
            *(__nv_bfloat162*)(out + (idx_t)key1 * 3 * C + 2 * C + j * 8) =
                __floats2bfloat162_rn(dv[j][2], dv[j][3]);
        }
    }
}
