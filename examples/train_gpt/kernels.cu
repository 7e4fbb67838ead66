// NVRTC kernels of train_gpt. Every reduction has a fixed order (no atomics): a step's
// results depend only on its inputs, so runs repeat bit for bit. Activations, gradients
// and the products' weights are act_t: float, or with ACT_BF16 defined __nv_bfloat16
// (arithmetic in float: ld() and st() convert). Master weights, AdamW moments, layer-norm
// statistics, losses and partial sums are float. Sizes are 32-bit (the host
// checks every product of dimensions against 2^31); flat indices are 64-bit (idx_t).
#ifdef ACT_BF16
#include <cuda_bf16.h>
typedef __nv_bfloat16 act_t;
typedef __nv_bfloat162 act2_t;
__device__ __forceinline__ float ld(act_t x) { return __bfloat162float(x); }
__device__ __forceinline__ act_t st(float x) { return __float2bfloat16(x); }
__device__ __forceinline__ float2 ld2(act2_t x) { return __bfloat1622float2(x); }
__device__ __forceinline__ act2_t st2(float a, float b) { return __floats2bfloat162_rn(a, b); }
#else
typedef float act_t;
typedef float2 act2_t;
__device__ __forceinline__ float ld(act_t x) { return x; }
__device__ __forceinline__ act_t st(float x) { return x; }
__device__ __forceinline__ float2 ld2(act2_t x) { return x; }
__device__ __forceinline__ act2_t st2(float a, float b) { return make_float2(a, b); }
#endif
// The row kernels (layer norms) read and write act2_t pairs: C is even and every row
// pair-aligned (the host checks).
// Pairs a lane of a row kernel keeps in registers between its passes over a row: rows of
// up to 64·RP activations are read from global memory once, with all of a lane's loads
// in flight together; wider rows read the rest again in each pass.
#define RP 12
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000u)
// No standard headers under NVRTC: the flat index type is spelled out.
typedef unsigned long long idx_t;
__device__ __forceinline__ unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
// Fixed-order sum over a block of 256 threads (every thread gets the result).
__device__ float block_sum256(float v, float* sh) {
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    return sh[0];
}
__device__ float block_max256(float v, float* sh) {
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + o]);
        __syncthreads();
    }
    return sh[0];
}
#define GRID_STRIDE(i, n) \
    for (idx_t i = blockIdx.x * (idx_t)blockDim.x + threadIdx.x; i < (idx_t)(n); \
         i += (idx_t)gridDim.x * blockDim.x)

// out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
extern "C" __global__ void encoder_fwd(act_t* out, const unsigned* tok, const act_t* wte,
                                       const act_t* wpe, unsigned BT, unsigned T, unsigned C) {
    GRID_STRIDE(i, (idx_t)BT * C) {
        idx_t bt = i / C, c = i % C, t = bt % T;
        out[i] = st(ld(wte[(idx_t)tok[bt] * C + c]) + ld(wpe[t * C + c]));
    }
}

// dwpe[t,c] = sum_b dout[b,t,c] (overwrites).
extern "C" __global__ void encoder_bwd_wpe(act_t* dwpe, const act_t* dout, unsigned B, unsigned T,
                                           unsigned C) {
    GRID_STRIDE(i, (idx_t)T * C) {
        float s = 0.0f;
        for (unsigned b = 0; b < B; ++b) s += ld(dout[(idx_t)b * T * C + i]);
        dwpe[i] = st(s);
    }
}

// The token embedding's gradient, pass 1: block (32) per 32 columns (blockIdx.x) and
// chunk of rows (blockIdx.y of gridDim.y): partial[(y·V + v)·C + c] = the sum, in row
// order, of dout[bt, c] over the chunk's rows bt whose token is v. V <= 256; each thread
// owns one column of the shared accumulators.
extern "C" __global__ void encoder_bwd_wte_partial(float* partial, const act_t* dout,
                                                   const unsigned* tok, unsigned BT, unsigned V,
                                                   unsigned C) {
    __shared__ float acc[256][33];
    unsigned c = blockIdx.x * 32 + threadIdx.x;
    unsigned chunk = (BT + gridDim.y - 1) / gridDim.y;
    unsigned r0 = umin(BT, blockIdx.y * chunk), r1 = umin(BT, r0 + chunk);
    for (unsigned v = 0; v < V; ++v) acc[v][threadIdx.x] = 0.0f;
    if (c >= C) return;
#pragma unroll 4
    for (unsigned r = r0; r < r1; ++r) acc[tok[r]][threadIdx.x] += ld(dout[(idx_t)r * C + c]);
    for (unsigned v = 0; v < V; ++v)
        partial[((idx_t)blockIdx.y * V + v) * C + c] = acc[v][threadIdx.x];
}

// Pass 2: dwte[v, c] += the P chunks' partial sums, in chunk order (thread per (v, c)).
extern "C" __global__ void encoder_bwd_wte_finish(act_t* dwte, const float* partial, unsigned P,
                                                  unsigned VC) {
    GRID_STRIDE(i, VC) {
        float s = 0.0f;
        for (unsigned p = 0; p < P; ++p) s += partial[(idx_t)p * VC + i];
        dwte[i] = st(ld(dwte[i]) + s);
    }
}

// One warp per row, 8 rows per block of 256, a pair of columns per lane and load.
extern "C" __global__ void layernorm_fwd(act_t* out, float* mean, float* rstd, const act_t* inp,
                                         const act_t* w, const act_t* b, unsigned N, unsigned C) {
    unsigned row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32, C2 = C / 2;
    if (row >= N) return;
    const act2_t* x = (const act2_t*)(inp + (idx_t)row * C);
    const act2_t* w2 = (const act2_t*)w;
    const act2_t* b2 = (const act2_t*)b;
    float s = 0.0f;
    for (unsigned i = lane; i < C2; i += 32) {
        float2 v = ld2(x[i]);
        s += v.x + v.y;
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    for (unsigned i = lane; i < C2; i += 32) {
        float2 v = ld2(x[i]);
        float d0 = v.x - m, d1 = v.y - m;
        var += d0 * d0 + d1 * d1;
    }
    float r = rsqrtf(warp_sum(var) / C + 1e-5f);
    act2_t* o = (act2_t*)(out + (idx_t)row * C);
    for (unsigned i = lane; i < C2; i += 32) {
        float2 v = ld2(x[i]), ww = ld2(w2[i]), bb = ld2(b2[i]);
        o[i] = st2((v.x - m) * r * ww.x + bb.x, (v.y - m) * r * ww.y + bb.y);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// res = x + y + pb[c] (a residual with its projection's bias), then out, mean, rstd = the
// layer norm of res (as layernorm_fwd): one warp per row, 8 rows per block of 256, pairs
// of columns, the first RP pairs of a lane held in registers; past those, each lane reads
// back the elements of res it wrote.
extern "C" __global__ void residual_layernorm_fwd(act_t* res, act_t* out, float* mean,
                                                  float* rstd, const act_t* x, const act_t* y,
                                                  const act_t* pb, const act_t* w,
                                                  const act_t* b, unsigned N, unsigned C) {
    unsigned row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32, C2 = C / 2;
    if (row >= N) return;
    idx_t off = (idx_t)row * C;
    act2_t* r = (act2_t*)(res + off);
    const act2_t* x2 = (const act2_t*)(x + off);
    const act2_t* y2 = (const act2_t*)(y + off);
    const act2_t* p2 = (const act2_t*)pb;
    const act2_t* w2 = (const act2_t*)w;
    const act2_t* b2 = (const act2_t*)b;
    // The lane's first RP pairs: every load issued before any store (res may be x).
    act2_t v[RP], yv[RP], pv[RP];
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) { v[k] = x2[i]; yv[k] = y2[i]; pv[k] = p2[i]; }
    }
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) {
            float2 a = ld2(v[k]), c = ld2(yv[k]), p = ld2(pv[k]);
            v[k] = st2(a.x + c.x + p.x, a.y + c.y + p.y);
            r[i] = v[k];
            float2 f = ld2(v[k]);
            s += f.x + f.y;
        }
    }
    for (unsigned i = lane + 32 * RP; i < C2; i += 32) {
        float2 a = ld2(x2[i]), c = ld2(y2[i]), p = ld2(p2[i]);
        act2_t t = st2(a.x + c.x + p.x, a.y + c.y + p.y);
        r[i] = t;
        float2 f = ld2(t);
        s += f.x + f.y;
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        if (lane + 32 * k < C2) {
            float2 f = ld2(v[k]);
            float d0 = f.x - m, d1 = f.y - m;
            var += d0 * d0 + d1 * d1;
        }
    }
    for (unsigned i = lane + 32 * RP; i < C2; i += 32) {
        float2 f = ld2(r[i]);
        float d0 = f.x - m, d1 = f.y - m;
        var += d0 * d0 + d1 * d1;
    }
    float rs = rsqrtf(warp_sum(var) / C + 1e-5f);
    act2_t* o = (act2_t*)(out + off);
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) {
            float2 f = ld2(v[k]), ww = ld2(w2[i]), bb = ld2(b2[i]);
            o[i] = st2((f.x - m) * rs * ww.x + bb.x, (f.y - m) * rs * ww.y + bb.y);
        }
    }
    for (unsigned i = lane + 32 * RP; i < C2; i += 32) {
        float2 f = ld2(r[i]), ww = ld2(w2[i]), bb = ld2(b2[i]);
        o[i] = st2((f.x - m) * rs * ww.x + bb.x, (f.y - m) * rs * ww.y + bb.y);
    }
    if (lane == 0) { mean[row] = m; rstd[row] = rs; }
}

// Layer-norm backward for rows wider than 64·RP (layernorm_bwd below takes the others),
// the input gradient: dinp += (w·dout − mean(w·dout) − norm · mean(w·dout·norm))·rstd,
// norm = (inp − mean)·rstd. One warp per row, 8 rows per block of 256 (as
// layernorm_fwd), pairs of columns, the first RP pairs of a lane held in registers: each
// lane's loads of a row are in flight together.
extern "C" __global__ void layernorm_bwd_dx(act_t* dinp, const act_t* dout, const act_t* inp,
                                            const float* mean, const float* rstd,
                                            const act_t* w, unsigned N, unsigned C) {
    unsigned row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32, C2 = C / 2;
    if (row >= N) return;
    idx_t off = (idx_t)row * C;
    const act2_t* x = (const act2_t*)(inp + off);
    const act2_t* d = (const act2_t*)(dout + off);
    const act2_t* w2 = (const act2_t*)w;
    act2_t* di = (act2_t*)(dinp + off);
    float m = mean[row], r = rstd[row];
    // The lane's first RP pairs of dout, inp and dinp, loaded together up front.
    act2_t dv[RP], xv[RP], gv[RP];
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) { dv[k] = d[i]; xv[k] = x[i]; gv[k] = di[i]; }
    }
    float a = 0.0f, bsum = 0.0f;
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) {
            float2 ww = ld2(w2[i]), dd = ld2(dv[k]), xx = ld2(xv[k]);
            float dn0 = ww.x * dd.x, dn1 = ww.y * dd.y;
            a += dn0 + dn1;
            bsum += dn0 * (xx.x - m) * r + dn1 * (xx.y - m) * r;
        }
    }
    for (unsigned i = lane + 32 * RP; i < C2; i += 32) {
        float2 ww = ld2(w2[i]), dd = ld2(d[i]), xx = ld2(x[i]);
        float dn0 = ww.x * dd.x, dn1 = ww.y * dd.y;
        a += dn0 + dn1;
        bsum += dn0 * (xx.x - m) * r + dn1 * (xx.y - m) * r;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        unsigned i = lane + 32 * k;
        if (i < C2) {
            float2 ww = ld2(w2[i]), dd = ld2(dv[k]), xx = ld2(xv[k]), g = ld2(gv[k]);
            float n0 = (xx.x - m) * r, n1 = (xx.y - m) * r;
            di[i] = st2(g.x + (ww.x * dd.x - a - n0 * bsum) * r,
                        g.y + (ww.y * dd.y - a - n1 * bsum) * r);
        }
    }
    for (unsigned i = lane + 32 * RP; i < C2; i += 32) {
        float2 ww = ld2(w2[i]), dd = ld2(d[i]), xx = ld2(x[i]), g = ld2(di[i]);
        float n0 = (xx.x - m) * r, n1 = (xx.y - m) * r;
        di[i] = st2(g.x + (ww.x * dd.x - a - n0 * bsum) * r,
                    g.y + (ww.y * dd.y - a - n1 * bsum) * r);
    }
}

// Layer-norm backward for rows wider than 64·RP, the weight and bias gradients' partial
// sums over chunk y of the rows (gridDim.y chunks), block (32, 8), thread (x, y) taking
// the column pair blockIdx.x·32 + x and every 8th row of the chunk from its y:
// partial[y·2C + c] = Σ dout·norm and partial[y·2C + C + c] = Σ dout, norm = (inp −
// mean)·rstd. colsum_finish adds the chunks.
extern "C" __global__ void layernorm_bwd_wb(float* partial, const act_t* dout,
                                            const act_t* inp, const float* mean,
                                            const float* rstd, unsigned N, unsigned C) {
    __shared__ float2 sw[8][33], sb[8][33];
    unsigned c2 = blockIdx.x * 32 + threadIdx.x, C2 = C / 2;
    unsigned chunk = (N + gridDim.y - 1) / gridDim.y;
    unsigned r0 = umin(N, blockIdx.y * chunk), r1 = umin(N, r0 + chunk);
    float2 dw = make_float2(0.0f, 0.0f), db = make_float2(0.0f, 0.0f);
    if (c2 < C2)
        for (unsigned r = r0 + threadIdx.y; r < r1; r += 8) {
            idx_t o = (idx_t)r * C2 + c2;
            float2 dd = ld2(((const act2_t*)dout)[o]), xx = ld2(((const act2_t*)inp)[o]);
            float m = mean[r], rs = rstd[r];
            dw.x += dd.x * ((xx.x - m) * rs);
            dw.y += dd.y * ((xx.y - m) * rs);
            db.x += dd.x;
            db.y += dd.y;
        }
    sw[threadIdx.y][threadIdx.x] = dw;
    sb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c2 < C2) {
        float2 tw = make_float2(0.0f, 0.0f), tb = make_float2(0.0f, 0.0f);
        for (int k = 0; k < 8; ++k) {
            tw.x += sw[k][threadIdx.x].x;
            tw.y += sw[k][threadIdx.x].y;
            tb.x += sb[k][threadIdx.x].x;
            tb.y += sb[k][threadIdx.x].y;
        }
        float* pw = partial + (idx_t)blockIdx.y * 2 * C + 2 * c2;
        pw[0] = tw.x;
        pw[1] = tw.y;
        pw[C] = tb.x;
        pw[C + 1] = tb.y;
    }
}

// Blocks per SM that layernorm_bwd's __launch_bounds__ asks for: in bf16 two (at most
// 128 registers a thread; it needs about 120, none spilled), in fp32 one (its pairs take
// twice the registers: about 200).
#ifdef ACT_BF16
#define LN_BWD_BLOCKS 2
#else
#define LN_BWD_BLOCKS 1
#endif

// Layer-norm backward in one pass over the rows, for C ≤ 64·RP (every pair of a row in
// a lane's registers; the host launches layernorm_bwd_dx and layernorm_bwd_wb for wider
// rows): dinp += dx as layernorm_bwd_dx computes it, and partial[y·2C + c] = Σ dout·norm,
// partial[y·2C + C + c] = Σ dout over chunk y of the rows, as layernorm_bwd_wb writes
// them (colsum_finish adds the chunks). Block y of gridDim.x (256 threads) takes chunk y
// (rows [y·chunk, min(N, (y+1)·chunk)), chunk = ⌈N / gridDim.x⌉; no rows, and zero sums,
// where y·chunk ≥ N); its warp w takes rows r0 + w, r0 + w + 8, ... in order, a lane
// keeping its pairs' sums in registers. The block then adds its warps' sums in warp
// order 0..7 through shared memory. Those are layernorm_bwd_wb's additions in its order
// (its thread y is warp w here), the same products and the same dx arithmetic as
// layernorm_bwd_dx: the results equal the split kernels' bit for bit where the compiler
// contracts the same products into FMAs (the host emulator, which contracts none, checks
// that they do: emu/layernorm_check.cpp).
// With res_sums, it also writes rpartial[y·C + c] = Σ dinp (the updated, stored values)
// over chunk y: colsum_partial's sums of dinp in its order (warp w is its thread row w),
// the bias gradient of the product whose output gradient dinp is, without a pass of its
// own. A warp keeps them in shared memory (registers are full), its own slots.
extern "C" __global__ void __launch_bounds__(256, LN_BWD_BLOCKS)
layernorm_bwd(act_t* dinp, float* partial, float* rpartial, const act_t* dout,
              const act_t* inp, const float* mean, const float* rstd, const act_t* w,
              unsigned N, unsigned C, unsigned res_sums) {
    __shared__ float2 sw[32 * RP], sb[32 * RP];
    __shared__ float2 sr[8][32 * RP];
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, C2 = C / 2;
    unsigned chunk = (N + gridDim.x - 1) / gridDim.x;
    unsigned r0 = umin(N, blockIdx.x * chunk), r1 = umin(N, r0 + chunk);
    const act2_t* w2 = (const act2_t*)w;
    // Σ dout·norm and Σ dout of the lane's pairs lane + 32k over the warp's rows.
    float2 dw[RP], db[RP];
    #pragma unroll
    for (int k = 0; k < RP; ++k) {
        dw[k] = make_float2(0.0f, 0.0f);
        db[k] = make_float2(0.0f, 0.0f);
        if (res_sums) sr[warp][lane + 32 * k] = make_float2(0.0f, 0.0f);
    }
    for (unsigned row = r0 + warp; row < r1; row += 8) {
        idx_t off = (idx_t)row * C;
        const act2_t* x = (const act2_t*)(inp + off);
        const act2_t* d = (const act2_t*)(dout + off);
        act2_t* di = (act2_t*)(dinp + off);
        float m = mean[row], r = rstd[row];
        // The lane's pairs of dout, inp and dinp, loaded together up front.
        act2_t dv[RP], xv[RP], gv[RP];
        #pragma unroll
        for (int k = 0; k < RP; ++k) {
            unsigned i = lane + 32 * k;
            if (i < C2) { dv[k] = d[i]; xv[k] = x[i]; gv[k] = di[i]; }
        }
        float a = 0.0f, bsum = 0.0f;
        #pragma unroll
        for (int k = 0; k < RP; ++k) {
            unsigned i = lane + 32 * k;
            if (i < C2) {
                float2 ww = ld2(w2[i]), dd = ld2(dv[k]), xx = ld2(xv[k]);
                float dn0 = ww.x * dd.x, dn1 = ww.y * dd.y;
                a += dn0 + dn1;
                bsum += dn0 * (xx.x - m) * r + dn1 * (xx.y - m) * r;
                dw[k].x += dd.x * ((xx.x - m) * r);
                dw[k].y += dd.y * ((xx.y - m) * r);
                db[k].x += dd.x;
                db[k].y += dd.y;
            }
        }
        a = warp_sum(a) / C;
        bsum = warp_sum(bsum) / C;
        #pragma unroll
        for (int k = 0; k < RP; ++k) {
            unsigned i = lane + 32 * k;
            if (i < C2) {
                float2 ww = ld2(w2[i]), dd = ld2(dv[k]), xx = ld2(xv[k]), g = ld2(gv[k]);
                float n0 = (xx.x - m) * r, n1 = (xx.y - m) * r;
                act2_t out = st2(g.x + (ww.x * dd.x - a - n0 * bsum) * r,
                                 g.y + (ww.y * dd.y - a - n1 * bsum) * r);
                di[i] = out;
                if (res_sums) {
                    float2 o = ld2(out), t = sr[warp][i];
                    sr[warp][i] = make_float2(t.x + o.x, t.y + o.y);
                }
            }
        }
    }
    // The block's sums, warp 0's first, then each warp's added in turn.
    for (unsigned v = 0; v < 8; ++v) {
        if (warp == v) {
            #pragma unroll
            for (int k = 0; k < RP; ++k) {
                unsigned i = lane + 32 * k;
                if (i < C2) {
                    float2 tw = dw[k], tb = db[k];
                    if (v > 0) {
                        tw = make_float2(sw[i].x + tw.x, sw[i].y + tw.y);
                        tb = make_float2(sb[i].x + tb.x, sb[i].y + tb.y);
                    }
                    sw[i] = tw;
                    sb[i] = tb;
                }
            }
        }
        __syncthreads();
    }
    float* pw = partial + (idx_t)blockIdx.x * 2 * C;
    for (unsigned i = threadIdx.x; i < C2; i += 256) {
        pw[2 * i] = sw[i].x;
        pw[2 * i + 1] = sw[i].y;
        pw[C + 2 * i] = sb[i].x;
        pw[C + 2 * i + 1] = sb[i].y;
    }
    if (res_sums) {
        // Each warp's sums, added in warp order 0..7 (the barrier above ordered them).
        float* pr = rpartial + (idx_t)blockIdx.x * C;
        for (unsigned i = threadIdx.x; i < C2; i += 256) {
            float2 t = make_float2(0.0f, 0.0f);
            for (unsigned v = 0; v < 8; ++v) {
                t.x += sr[v][i].x;
                t.y += sr[v][i].y;
            }
            pr[2 * i] = t.x;
            pr[2 * i + 1] = t.y;
        }
    }
}

// Column sums per chunk of rows (bias gradients), block (32, 8), blockIdx.y = chunk
// (gridDim.y chunks of ⌈N / gridDim.y⌉ rows; a chunk past the last row sums none), a pair
// of columns per thread (C even, pair-aligned: the host checks): partial[p*C + c] = sum of
// dout[r,c] over chunk p's rows.
extern "C" __global__ void colsum_partial(float* partial, const act_t* dout, unsigned N,
                                          unsigned C) {
    __shared__ float2 sb[8][33];
    unsigned c2 = blockIdx.x * 32 + threadIdx.x, C2 = C / 2;
    unsigned chunk = (N + gridDim.y - 1) / gridDim.y;
    unsigned r0 = umin(N, blockIdx.y * chunk), r1 = umin(N, r0 + chunk);
    float2 b = make_float2(0.0f, 0.0f);
    if (c2 < C2)
        for (unsigned r = r0 + threadIdx.y; r < r1; r += 8) {
            float2 v = ld2(((const act2_t*)dout)[(idx_t)r * C2 + c2]);
            b.x += v.x;
            b.y += v.y;
        }
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c2 < C2) {
        float2 tb = make_float2(0.0f, 0.0f);
        for (int k = 0; k < 8; ++k) {
            tb.x += sb[k][threadIdx.x].x;
            tb.y += sb[k][threadIdx.x].y;
        }
        partial[(idx_t)blockIdx.y * C + 2 * c2] = tb.x;
        partial[(idx_t)blockIdx.y * C + 2 * c2 + 1] = tb.y;
    }
}

// *out = sum_p col[p*W], p < P: a block of 128, fixed-order tree through sh (128 floats).
__device__ __forceinline__ void finish_column(float* sh, act_t* out, const float* col,
                                              unsigned P, unsigned W) {
    unsigned t = threadIdx.x;
    float s = 0.0f;
    for (unsigned p = t; p < P; p += 128) s += col[(idx_t)p * W];
    sh[t] = s;
    __syncthreads();
    for (unsigned o = 64; o > 0; o >>= 1) {
        if (t < o) sh[t] += sh[t + o];
        __syncthreads();
    }
    if (t == 0) *out = st(sh[0]);
}

// out[c] = sum_p partial[p*W + c], block of 128 per column, fixed-order tree.
extern "C" __global__ void colsum_finish(act_t* out, const float* partial, unsigned P, unsigned W) {
    __shared__ float sh[128];
    finish_column(sh, out + blockIdx.x, partial + blockIdx.x, P, W);
}

// The QKV bias gradient (3C) from the fused attention backward's column-sum partials: q's
// Pq rows of C, then k's and v's Pkv rows each. Block j < 3C: out[j] as colsum_finish sums
// column j % C of part j / C.
extern "C" __global__ void colsum_finish_qkv(act_t* out, const float* partial, unsigned Pq,
                                             unsigned Pkv, unsigned C) {
    unsigned part = blockIdx.x / C, c = blockIdx.x % C;
    idx_t first = part == 0 ? 0 : (idx_t)Pq + (idx_t)(part - 1) * Pkv;
    __shared__ float sh[128];
    finish_column(sh, out + blockIdx.x, partial + first * C + c, part == 0 ? Pq : Pkv, C);
}

// y[r,c] += b[c]
extern "C" __global__ void bias_add(act_t* y, const act_t* b, unsigned N, unsigned C) {
    GRID_STRIDE(i, (idx_t)N * C) y[i] = st(ld(y[i]) + ld(b[i % C]));
}

// qkv (B,T,3,NH,hs) -> q, k, v (B,NH,T,hs); dir 1: the reverse (gradients).
extern "C" __global__ void permute_qkv(act_t* q, act_t* k, act_t* v, act_t* qkv, unsigned B,
                                       unsigned T, unsigned NH, unsigned hs, int dir) {
    idx_t C = (idx_t)NH * hs;
    GRID_STRIDE(i, (idx_t)B * T * C) {
        idx_t d = i % hs, r = i / hs;
        idx_t t = r % T; r /= T;
        idx_t h = r % NH, b = r / NH;
        idx_t src = (b * T + t) * 3 * C + h * hs + d;
        if (dir == 0) {
            q[i] = qkv[src]; k[i] = qkv[src + C]; v[i] = qkv[src + 2 * C];
        } else {
            qkv[src] = q[i]; qkv[src + C] = k[i]; qkv[src + 2 * C] = v[i];
        }
    }
}

// y (B,NH,T,hs) <-> out (B,T,NH,hs): dir 0 writes out from y, dir 1 writes y from out.
extern "C" __global__ void unpermute(act_t* out, act_t* y, unsigned B, unsigned T, unsigned NH,
                                     unsigned hs, int dir) {
    GRID_STRIDE(i, (idx_t)B * T * NH * hs) {
        idx_t d = i % hs, r = i / hs;
        idx_t t = r % T; r /= T;
        idx_t h = r % NH, b = r / NH;
        idx_t o = (b * T + t) * NH * hs + h * hs + d;
        if (dir == 0) out[o] = y[i]; else y[i] = out[o];
    }
}

// Causal softmax over rows of length T (row r is query t = r % T): one warp per row.
extern "C" __global__ void softmax_causal_fwd(act_t* att, const act_t* pre, unsigned rows,
                                              unsigned T) {
    unsigned row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    unsigned t = row % T;
    const act_t* x = pre + (idx_t)row * T;
    float m = NEG_INF;
    for (unsigned i = lane; i <= t; i += 32) m = fmaxf(m, ld(x[i]));
    m = warp_max(m);
    float s = 0.0f;
    for (unsigned i = lane; i <= t; i += 32) s += expf(ld(x[i]) - m);
    float inv = 1.0f / warp_sum(s);
    act_t* a = att + (idx_t)row * T;
    for (unsigned i = lane; i < T; i += 32) a[i] = st(i <= t ? expf(ld(x[i]) - m) * inv : 0.0f);
}

extern "C" __global__ void softmax_causal_bwd(act_t* dpre, const act_t* datt, const act_t* att,
                                              unsigned rows, unsigned T) {
    unsigned row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    unsigned t = row % T;
    const act_t* a = att + (idx_t)row * T;
    const act_t* d = datt + (idx_t)row * T;
    float s = 0.0f;
    for (unsigned i = lane; i <= t; i += 32) s += ld(a[i]) * ld(d[i]);
    s = warp_sum(s);
    act_t* o = dpre + (idx_t)row * T;
    for (unsigned i = lane; i < T; i += 32) o[i] = st(i <= t ? ld(a[i]) * (ld(d[i]) - s) : 0.0f);
}

#define GELU_S 0.7978845608028654f
extern "C" __global__ void gelu_fwd(act_t* out, const act_t* inp, unsigned n) {
    GRID_STRIDE(i, n) {
        float x = ld(inp[i]);
        out[i] = st(0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x))));
    }
}

extern "C" __global__ void gelu_bwd(act_t* dinp, const act_t* inp, const act_t* dout, unsigned n) {
    GRID_STRIDE(i, n) {
        float x = ld(inp[i]);
        float th = tanhf(GELU_S * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = st(g * ld(dout[i]));
    }
}

// Softmax cross-entropy, one block of 256 per row: losses[r], and, when grad != 0,
// dlogits = (softmax - onehot) * scale.
extern "C" __global__ void xent(act_t* dlogits, float* losses, const act_t* logits,
                                const unsigned* targets, unsigned N, unsigned V, float scale,
                                int grad) {
    __shared__ float sh[256];
    unsigned row = blockIdx.x;
    const act_t* x = logits + (idx_t)row * V;
    float m = NEG_INF;
    for (unsigned i = threadIdx.x; i < V; i += 256) m = fmaxf(m, ld(x[i]));
    m = block_max256(m, sh);
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < V; i += 256) s += expf(ld(x[i]) - m);
    s = block_sum256(s, sh);
    unsigned y = targets[row];
    if (threadIdx.x == 0) losses[row] = logf(s) - (ld(x[y]) - m);
    if (grad) {
        act_t* d = dlogits + (idx_t)row * V;
        for (unsigned i = threadIdx.x; i < V; i += 256)
            d[i] = st((expf(ld(x[i]) - m) / s - (i == y ? 1.0f : 0.0f)) * scale);
    }
}

// out[slot] = scale * sum(in[0..n]), one block of 256 in a fixed order.
extern "C" __global__ void sum_finish(float* out, const float* in, unsigned n, float scale,
                                      unsigned slot) {
    __shared__ float sh[256];
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += 256) s += in[i];
    s = block_sum256(s, sh);
    if (threadIdx.x == 0) out[slot] = s * scale;
}

// partial[block] = sum of squares of the block's grid-stride share of g.
extern "C" __global__ void sumsq_partial(float* partial, const act_t* g, unsigned n) {
    __shared__ float sh[256];
    float s = 0.0f;
    GRID_STRIDE(i, n) { float x = ld(g[i]); s += x * x; }
    s = block_sum256(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// AdamW as torch.optim.AdamW, with the gradient clipped to norm max_norm first
// (torch.nn.utils.clip_grad_norm_), on the float master weights p; w receives the updated
// weights as act_t (what the products and kernels read). sched: [lr, 1 - beta1^t,
// 1 - beta2^t]; normsq[0]: the squared gradient norm; weight decay wd where decay[i] != 0.
extern "C" __global__ void adamw(float* p, act_t* w, const act_t* g, float* m, float* v,
                                 unsigned n, const float* sched, const float* normsq,
                                 const unsigned char* decay, float wd, float b1, float b2,
                                 float eps, float max_norm) {
    float lr = sched[0], bc1 = sched[1], bc2 = sched[2];
    float coef = fminf(max_norm / (sqrtf(normsq[0]) + 1e-6f), 1.0f);
    float step = lr / bc1, bc2s = sqrtf(bc2);
    GRID_STRIDE(i, n) {
        float gi = ld(g[i]) * coef;
        float mi = m[i] + (1.0f - b1) * (gi - m[i]);
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] * (1.0f - lr * (decay[i] ? wd : 0.0f));
        pi = pi - step * mi / (sqrtf(vi) / bc2s + eps);
        p[i] = pi;
        w[i] = st(pi);
    }
}

// w = p as act_t (the weights the products read, from the float master weights).
extern "C" __global__ void cast_weights(act_t* w, const float* p, unsigned n) {
    GRID_STRIDE(i, n) w[i] = st(p[i]);
}
