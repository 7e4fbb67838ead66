// Fused causal attention of train_gpt (flash-attention style), head size 64: the scores of
// a tile of queries against a tile of keys live in shared memory only, the softmax is
// online (running max and sum per query), and the T×T matrix is never stored. Reads q, k
// and v straight from the QKV product (B, T, 3, NH, 64) and writes y as (B, T, NH, 64),
// the projection's input; the backward pass writes dq, dk and dv into dqkv (B, T, 3, NH,
// 64). No atomics: every sum has a fixed order, so runs repeat bit for bit.
//
// With ACT_BF16 the products of tiles run on tensor cores (wmma, bf16 in, f32
// accumulate); without, they are f32 FMA loops. Tiles: BR queries × BC keys; products
// accumulate in f32 tiles in shared memory.
#ifdef ACT_BF16
#include <cuda_bf16.h>
#include <mma.h>
typedef __nv_bfloat16 act_t;
__device__ __forceinline__ float ld(act_t x) { return __bfloat162float(x); }
__device__ __forceinline__ act_t st(float x) { return __float2bfloat16(x); }
#define BR 32
#define BC 32
// Rows of act_t tiles: a multiple of 8 elements (wmma's ldm), 16 rows = 32-byte multiple.
#define LDA (HD + 8)
#define LDP (BC + 8)
#else
typedef float act_t;
__device__ __forceinline__ float ld(act_t x) { return x; }
__device__ __forceinline__ act_t st(float x) { return x; }
#define BR 16
#define BC 16
// Odd strides: the FMA loops read columns of these tiles without bank conflicts.
#define LDA (HD + 1)
#define LDP (BC + 1)
#endif
#define HD 64
#define NT 128
// f32 tiles: multiples of 4 floats (wmma's ldm), 16 rows = 32-byte multiple.
#define LDS (BC + 4)
#define LDO (HD + 4)
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000u)
typedef unsigned long long idx_t;
__device__ __forceinline__ unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }

#if BC > 32
#error "the softmax gives each lane at most one key of a tile"
#endif

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Block-wide products of shared-memory tiles into an f32 tile C (M × N, row stride ldc),
// overwritten or (ACC) accumulated. Every thread of the block calls them.
//   mm_nt: C (+)= A · Bᵀ, A: M × K, B: N × K.
//   mm_nn: C (+)= A · B,  A: M × K, B: K × N.
//   mm_tn: C (+)= Aᵀ · B, A: K × M, B: K × N.
#ifdef ACT_BF16
using namespace nvcuda;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

template <int M, int N, int K, bool ACC>
__device__ void mm_nt(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int t = threadIdx.x / 32; t < (M / 16) * (N / 16); t += NT / 32) {
        int ti = t / (N / 16), tj = t % (N / 16);
        frag_c c;
        if (ACC) wmma::load_matrix_sync(c, C + ti * 16 * ldc + tj * 16, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(c, 0.0f);
        for (int k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
            wmma::load_matrix_sync(a, A + ti * 16 * lda + k, lda);
            wmma::load_matrix_sync(b, B + tj * 16 * ldb + k, ldb);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + ti * 16 * ldc + tj * 16, c, ldc, wmma::mem_row_major);
    }
}

template <int M, int N, int K, bool ACC>
__device__ void mm_nn(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int t = threadIdx.x / 32; t < (M / 16) * (N / 16); t += NT / 32) {
        int ti = t / (N / 16), tj = t % (N / 16);
        frag_c c;
        if (ACC) wmma::load_matrix_sync(c, C + ti * 16 * ldc + tj * 16, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(c, 0.0f);
        for (int k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
            wmma::load_matrix_sync(a, A + ti * 16 * lda + k, lda);
            wmma::load_matrix_sync(b, B + k * ldb + tj * 16, ldb);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + ti * 16 * ldc + tj * 16, c, ldc, wmma::mem_row_major);
    }
}

template <int M, int N, int K, bool ACC>
__device__ void mm_tn(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int t = threadIdx.x / 32; t < (M / 16) * (N / 16); t += NT / 32) {
        int ti = t / (N / 16), tj = t % (N / 16);
        frag_c c;
        if (ACC) wmma::load_matrix_sync(c, C + ti * 16 * ldc + tj * 16, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(c, 0.0f);
        for (int k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
            wmma::load_matrix_sync(a, A + k * lda + ti * 16, lda);
            wmma::load_matrix_sync(b, B + k * ldb + tj * 16, ldb);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + ti * 16 * ldc + tj * 16, c, ldc, wmma::mem_row_major);
    }
}
#else
template <int M, int N, int K, bool ACC>
__device__ void mm_nt(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int e = threadIdx.x; e < M * N; e += NT) {
        int i = e / N, j = e % N;
        float s = ACC ? C[i * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) s += ld(A[i * lda + k]) * ld(B[j * ldb + k]);
        C[i * ldc + j] = s;
    }
}

template <int M, int N, int K, bool ACC>
__device__ void mm_nn(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int e = threadIdx.x; e < M * N; e += NT) {
        int i = e / N, j = e % N;
        float s = ACC ? C[i * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) s += ld(A[i * lda + k]) * ld(B[k * ldb + j]);
        C[i * ldc + j] = s;
    }
}

template <int M, int N, int K, bool ACC>
__device__ void mm_tn(float* C, int ldc, const act_t* A, int lda, const act_t* B, int ldb) {
    for (int e = threadIdx.x; e < M * N; e += NT) {
        int i = e / N, j = e % N;
        float s = ACC ? C[i * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) s += ld(A[k * lda + i]) * ld(B[k * ldb + j]);
        C[i * ldc + j] = s;
    }
}
#endif

// Rows r0 .. r0+R-1 of a (T × HD, rows `stride` apart) matrix at `base` into the tile s
// (R × LDA); rows at or past T are zeros.
template <int R>
__device__ void load_rows(act_t* s, const act_t* base, idx_t stride, unsigned r0, unsigned T) {
    for (int e = threadIdx.x; e < R * HD; e += NT) {
        int r = e / HD, d = e % HD;
        unsigned t = r0 + r;
        act_t v = st(0.0f);
        if (t < T) v = base[(idx_t)t * stride + d];
        s[r * LDA + d] = v;
    }
}

// Rows r0 .. r0+R-1 of the f32 tile s (R × LDO) into `base` (rows `stride` apart), those
// below T.
template <int R>
__device__ void store_rows(act_t* base, idx_t stride, const float* s, unsigned r0, unsigned T) {
    for (int e = threadIdx.x; e < R * HD; e += NT) {
        int r = e / HD, d = e % HD;
        unsigned t = r0 + r;
        if (t < T) base[(idx_t)t * stride + d] = st(s[r * LDO + d]);
    }
}

// Forward: y = softmax(scale·q·kᵀ, causal)·v, and lse[b,h,t] = the log of the row's
// softmax denominator (with its max). Grid (ceil(T/BR), B·NH), NT threads.
extern "C" __global__ void __launch_bounds__(NT)
attn_fwd(act_t* y, float* lse, const act_t* qkv, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(128) act_t sQ[BR * LDA];
    __shared__ __align__(128) act_t sK[BC * LDA];
    __shared__ __align__(128) act_t sV[BC * LDA];
    __shared__ __align__(128) float sS[BR * LDS];
    __shared__ __align__(128) act_t sP[BR * LDP];
    __shared__ __align__(128) float sO[BR * LDO];
    __shared__ float sM[BR], sL[BR];
    // The longest rows (last queries) first.
    const unsigned q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const act_t* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    load_rows<BR>(sQ, base, 3 * C, q0, T);
    for (int e = threadIdx.x; e < BR * LDO; e += NT) sO[e] = 0.0f;
    for (int e = threadIdx.x; e < BR * LDP; e += NT) sP[e] = st(0.0f);
    if (threadIdx.x < BR) {
        sM[threadIdx.x] = NEG_INF;
        sL[threadIdx.x] = 0.0f;
    }
    // Keys 0 ..= the tile's last query.
    const unsigned kend = umin(T, q0 + BR);
    for (unsigned k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads();  // the last tile's P·V is done with sK, sV, sP and sO
        load_rows<BC>(sK, base + C, 3 * C, k0, T);
        load_rows<BC>(sV, base + 2 * C, 3 * C, k0, T);
        __syncthreads();
        mm_nt<BR, BC, HD, false>(sS, LDS, sQ, LDA, sK, LDA);
        __syncthreads();
        // Online softmax: warp w owns rows w, w + NT/32, ...; lane j key k0 + j.
        for (int r = warp; r < BR; r += NT / 32) {
            unsigned qi = q0 + r, kj = k0 + lane;
            bool ok = lane < BC && kj <= qi && kj < T;
            float s = ok ? sS[r * LDS + lane] * scale : NEG_INF;
            float mold = sM[r];
            float mnew = fmaxf(mold, warp_max(s));
            // A row with no key yet (only rows past T) keeps exp() finite.
            float mref = mnew == NEG_INF ? 0.0f : mnew;
            act_t p = st(ok ? expf(s - mref) : 0.0f);
            if (lane < BC) sP[r * LDP + lane] = p;
            float psum = warp_sum(ok ? ld(p) : 0.0f);
            float alpha = expf(mold - mref);
            for (int d = lane; d < HD; d += 32) sO[r * LDO + d] *= alpha;
            // All lanes' reads of sM[r] precede lane 0's write: shuffles are no memory barrier.
            __syncwarp();
            if (lane == 0) {
                sM[r] = mnew;
                sL[r] = sL[r] * alpha + psum;
            }
        }
        __syncthreads();
        mm_nn<BR, HD, BC, true>(sO, LDO, sP, LDP, sV, LDA);
    }
    __syncthreads();
    for (int r = warp; r < BR; r += NT / 32) {
        unsigned qi = q0 + r;
        if (qi >= T) continue;  // warp-uniform
        float l = sL[r];
        float inv = 1.0f / l;
        act_t* yr = y + ((idx_t)b * T + qi) * C + (idx_t)h * HD;
        for (int d = lane; d < HD; d += 32) yr[d] = st(sO[r * LDO + d] * inv);
        if (lane == 0) lse[(idx_t)bh * T + qi] = sM[r] + logf(l);
    }
}

// Backward preprocessing: D[b,h,t] = Σ_d dy·y over the head's row. Eight lanes per row
// (b·T + t)·NH + h of y and dy (B, T, NH, HD), lane p of the eight taking elements
// p, p + 8, ..; 32 rows per block of 256.
extern "C" __global__ void attn_bwd_d(float* D, const act_t* y, const act_t* dy, unsigned rows,
                                      unsigned T, unsigned NH) {
    unsigned row = blockIdx.x * 32 + threadIdx.x / 8, part = threadIdx.x % 8;
    float s = 0.0f;
    if (row < rows) {
        const act_t* a = y + (idx_t)row * HD;
        const act_t* g = dy + (idx_t)row * HD;
        for (unsigned i = part; i < HD; i += 8) s += ld(a[i]) * ld(g[i]);
    }
    // Every lane takes part: the shuffles name the whole warp.
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (row < rows && part == 0) {
        unsigned h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
        D[((idx_t)b * NH + h) * T + t] = s;
    }
}

// dS = P ⊙ (dP − D)·scale for the tile (queries q0.., keys k0..), P recomputed from the
// scores sS and lse; masked entries are 0. Writes P (as act_t) to sP when `want_p`, and
// dS to sdP (f32, in place) and, when `ds_to_p`, to sP (as act_t).
template <bool want_p, bool ds_to_p>
__device__ void scores_to_grad(act_t* sP, float* sdP, const float* sS, const float* sLse,
                               const float* sD, unsigned q0, unsigned k0, unsigned T,
                               float scale) {
    for (int e = threadIdx.x; e < BR * BC; e += NT) {
        int r = e / BC, c = e % BC;
        unsigned qi = q0 + r, kj = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (qi < T && kj <= qi) {
            p = expf(sS[r * LDS + c] * scale - sLse[r]);
            ds = p * (sdP[r * LDS + c] - sD[r]) * scale;
        }
        sdP[r * LDS + c] = ds;
        if (want_p) sP[r * LDP + c] = st(p);
        if (ds_to_p) sP[r * LDP + c] = st(ds);
    }
}

// lse and D of rows q0 .. q0+BR-1 of head bh (0 past T).
__device__ void load_stats(float* sLse, float* sD, const float* lse, const float* D,
                           unsigned bh, unsigned q0, unsigned T) {
    if (threadIdx.x < BR) {
        unsigned t = q0 + threadIdx.x;
        bool in = t < T;
        sLse[threadIdx.x] = in ? lse[(idx_t)bh * T + t] : 0.0f;
        sD[threadIdx.x] = in ? D[(idx_t)bh * T + t] : 0.0f;
    }
}

// Backward, dq: block per tile of BR queries, over the key tiles up to its diagonal:
// dq = Σ dS·k. Grid (ceil(T/BR), B·NH), NT threads.
extern "C" __global__ void __launch_bounds__(NT)
attn_bwd_dq(act_t* dqkv, const act_t* qkv, const act_t* dy, const float* lse, const float* D,
            unsigned T, unsigned NH, float scale) {
    __shared__ __align__(128) act_t sQ[BR * LDA];
    __shared__ __align__(128) act_t sdO[BR * LDA];
    __shared__ __align__(128) act_t sK[BC * LDA];
    __shared__ __align__(128) act_t sV[BC * LDA];
    __shared__ __align__(128) float sS[BR * LDS];
    __shared__ __align__(128) float sdP[BR * LDS];
    __shared__ __align__(128) act_t sP[BR * LDP];
    __shared__ __align__(128) float sdQ[BR * LDO];
    __shared__ float sLse[BR], sD[BR];
    const unsigned q0 = (gridDim.x - 1 - blockIdx.x) * BR;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const act_t* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    load_rows<BR>(sQ, base, 3 * C, q0, T);
    load_rows<BR>(sdO, dy + (idx_t)b * T * C + (idx_t)h * HD, C, q0, T);
    load_stats(sLse, sD, lse, D, bh, q0, T);
    for (int e = threadIdx.x; e < BR * LDO; e += NT) sdQ[e] = 0.0f;
    for (int e = threadIdx.x; e < BR * LDP; e += NT) sP[e] = st(0.0f);
    const unsigned kend = umin(T, q0 + BR);
    for (unsigned k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads();  // the last tile's dS·K is done with sK and sP
        load_rows<BC>(sK, base + C, 3 * C, k0, T);
        load_rows<BC>(sV, base + 2 * C, 3 * C, k0, T);
        __syncthreads();
        mm_nt<BR, BC, HD, false>(sS, LDS, sQ, LDA, sK, LDA);
        mm_nt<BR, BC, HD, false>(sdP, LDS, sdO, LDA, sV, LDA);
        __syncthreads();
        scores_to_grad<false, true>(sP, sdP, sS, sLse, sD, q0, k0, T, scale);
        __syncthreads();
        mm_nn<BR, HD, BC, true>(sdQ, LDO, sP, LDP, sK, LDA);
    }
    __syncthreads();
    store_rows<BR>(dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD, 3 * C, sdQ, q0, T);
}

// Backward, dk and dv: block per tile of BC keys, over the query tiles from its diagonal
// on: dv = Σ Pᵀ·dy, dk = Σ dSᵀ·q. Grid (ceil(T/BC), B·NH), NT threads.
extern "C" __global__ void __launch_bounds__(NT)
attn_bwd_dkdv(act_t* dqkv, const act_t* qkv, const act_t* dy, const float* lse,
              const float* D, unsigned T, unsigned NH, float scale) {
    __shared__ __align__(128) act_t sK[BC * LDA];
    __shared__ __align__(128) act_t sV[BC * LDA];
    __shared__ __align__(128) act_t sQ[BR * LDA];
    __shared__ __align__(128) act_t sdO[BR * LDA];
    __shared__ __align__(128) float sS[BR * LDS];
    __shared__ __align__(128) float sdP[BR * LDS];
    __shared__ __align__(128) act_t sP[BR * LDP];
    __shared__ __align__(128) float sdK[BC * LDO];
    __shared__ __align__(128) float sdV[BC * LDO];
    __shared__ float sLse[BR], sD[BR];
    const unsigned k0 = blockIdx.x * BC;
    const unsigned bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const idx_t C = (idx_t)NH * HD;
    const act_t* base = qkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    const act_t* dyb = dy + (idx_t)b * T * C + (idx_t)h * HD;
    load_rows<BC>(sK, base + C, 3 * C, k0, T);
    load_rows<BC>(sV, base + 2 * C, 3 * C, k0, T);
    for (int e = threadIdx.x; e < BC * LDO; e += NT) {
        sdK[e] = 0.0f;
        sdV[e] = 0.0f;
    }
    for (int e = threadIdx.x; e < BR * LDP; e += NT) sP[e] = st(0.0f);
    // The first query tile holding a query >= k0.
    for (unsigned q0 = (k0 / BR) * BR; q0 < T; q0 += BR) {
        __syncthreads();  // the last tile's products are done with sQ, sdO, sP and stats
        load_rows<BR>(sQ, base, 3 * C, q0, T);
        load_rows<BR>(sdO, dyb, C, q0, T);
        load_stats(sLse, sD, lse, D, bh, q0, T);
        __syncthreads();
        mm_nt<BR, BC, HD, false>(sS, LDS, sQ, LDA, sK, LDA);
        mm_nt<BR, BC, HD, false>(sdP, LDS, sdO, LDA, sV, LDA);
        __syncthreads();
        scores_to_grad<true, false>(sP, sdP, sS, sLse, sD, q0, k0, T, scale);
        __syncthreads();
        mm_tn<BC, HD, BR, true>(sdV, LDO, sP, LDP, sdO, LDA);
        __syncthreads();  // dV's product is done reading P
        for (int e = threadIdx.x; e < BR * BC; e += NT) {
            int r = e / BC, c = e % BC;
            sP[r * LDP + c] = st(sdP[r * LDS + c]);
        }
        __syncthreads();
        mm_tn<BC, HD, BR, true>(sdK, LDO, sP, LDP, sQ, LDA);
    }
    __syncthreads();
    act_t* out = dqkv + (idx_t)b * T * 3 * C + (idx_t)h * HD;
    store_rows<BC>(out + C, 3 * C, sdK, k0, T);
    store_rows<BC>(out + 2 * C, 3 * C, sdV, k0, T);
}
