// Runs the bf16 attention kernels of attention_mma.cu, unchanged, on the host through
// cuda_emu.h, and compares them with a double-precision reference of the same bf16 inputs.
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing -I examples/train_gpt/emu
//     examples/train_gpt/emu/attention_check.cpp -o /tmp/attention_check
//   /tmp/attention_check
//
// Every shape runs in the four scheduling modes (warp order forward / reverse, cp.async
// immediate / deferred); one line per shape, mode and tensor; exit status 1 on any failure.
// In three of the modes the backward kernels also take the column sums of what they store
// (bsum), finished here as colsum_finish adds partial rows: the QKV bias gradient, which
// must equal the double-precision column sums of the stored dq, dk and dv; the fourth
// runs them with bsum null. Build with -DDKM=1 for the dk/dv kernel of 64-key blocks.
#define HOST_EMULATION
#include "cuda_emu.h"
#include "../attention_mma.cu"
#include "attention_ref.h"

#include <string>
#include <vector>

using std::vector;
typedef __nv_bfloat16 bf;

// ---- The launches, as attention.rs issues them (change them here with the kernels) ----
// attn_fwd and attn_bwd_dq take QT queries a block, attn_bwd_dkdv KB keys; NT threads.
// attn_bwd_dq also writes dsum = rowsum(dy ⊙ y), which attn_bwd_dkdv reads: dq runs first.
// bsum (or null, both kernels): dq's column-sum partial (B·⌈T/QT⌉ × C), then dk's and
// dv's (B·⌈T/KB⌉ × C each), as attention.rs lays them out.
static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }
static size_t q_parts(unsigned B, unsigned T) { return (size_t)B * cdiv(T, QT); }
static size_t kv_parts(unsigned B, unsigned T) { return (size_t)B * cdiv(T, KB); }
static void forward(bf* y, float* lse, const bf* qkv, unsigned B, unsigned T, unsigned NH,
                    float scale) {
    launch(attn_fwd, dim3(B * NH, cdiv(T, QT)), dim3(NT), y, lse, qkv, T, NH, scale);
}
static void backward(bf* dqkv, float* dsum, float* bsum, const bf* qkv, const bf* y,
                     const float* lse, const bf* dy, unsigned B, unsigned T, unsigned NH,
                     float scale) {
    launch(attn_bwd_dq, dim3(B * NH, cdiv(T, QT)), dim3(NT), dqkv, dsum, bsum, qkv, y, dy,
           lse, T, NH, scale);
    launch(attn_bwd_dkdv, dim3(B * NH, cdiv(T, KB)), dim3(NT), dqkv, bsum, qkv, dy, lse,
           (const float*)dsum, T, NH, scale);
}
// The bias gradient (3C: q, k, v parts) from bsum: each column's partial rows added in
// order in f32, rounded to bf16.
static vector<bf> finish(const float* bsum, unsigned B, unsigned T, unsigned C) {
    vector<bf> db(3 * C);
    const size_t pq = q_parts(B, T), pkv = kv_parts(B, T);
    for (unsigned part = 0; part < 3; ++part) {
        const float* p = bsum + (part == 0 ? 0 : (pq + (part - 1) * pkv) * C);
        const size_t rows = part == 0 ? pq : pkv;
        for (unsigned c = 0; c < C; ++c) {
            float s = 0.0f;
            for (size_t r = 0; r < rows; ++r) s += p[r * C + c];
            db[part * C + c] = __float2bfloat16(s);
        }
    }
    return db;
}

// ---- Tolerances ----
// The kernels round to bf16 what the reference keeps in double: P before P·V and Pᵀ·dY,
// dS before dS·K and dSᵀ·Q, y before D = rowsum(dy ⊙ y), and every output (half an ulp,
// 2^-8 of the value, each), and they sum in f32. The worst errors measured on the
// current kernels over every shape and mode (the lines this program prints) are,
// relative to the reference's largest magnitude, at most 4.9e-3 (dq); per row 4.1e-3 for
// y and dv, 3.7e-2 for dq and 1.9e-2 for dk; lse at most 1.3e-3 absolute. Each tolerance
// below is 2.5x to 5x its measured worst; a wrong index, mask, fragment or missing
// synchronisation gives errors of order 1 (or NaN from the poisoned shared memory and
// outputs).
// MAX and ROW (per 64-element row, with ROW_FLOOR) as compare.h defines them. dq and dk
// get a wider row tolerance: a row of dq (or dk) is Σ dS·k with dS = P ⊙ (dP − D), which
// nearly cancels where the attention is sharp, while the rounding of y (in D) and of dS
// does not cancel with it.
// The bias sums (db_q, db_k, db_v) are compared with the double-precision sums of the
// stored values, not with the reference: their errors are the f32 additions and the final
// bf16 rounding, at most 3.3e-3 (MAX) and 2.0e-3 (ROW) measured; they take the y and dv
// tolerances. A warp's sums left out, or a row group, fail every shape with T > 96.
// lse is compared in absolute terms: a log, its error is the relative error of the row's
// sum of exponentials (f32 sums of bf16-rounded probabilities).
static const double MAX_TOL = 2e-2, ROW_FLOOR = 0.1, LSE_TOL = 5e-3;
static const double ROW_TOL_Y_DV = 2e-2, ROW_TOL_DQ_DK = 1e-1;

static double d(bf v) { return __bfloat162float(v); }

static bool check(int B, int T, int NH, emu::Order order, emu::Copies copies) {
    const int C = NH * HD;
    const size_t n = (size_t)B * T * C;
    AttnInputs in = attention_inputs(B, T, NH, HD);
    vector<bf> qkv(3 * n), dy(n);
    for (size_t i = 0; i < 3 * n; ++i) {
        qkv[i] = __float2bfloat16((float)in.qkv[i]);
        in.qkv[i] = d(qkv[i]);
    }
    for (size_t i = 0; i < n; ++i) {
        dy[i] = __float2bfloat16((float)in.dy[i]);
        in.dy[i] = d(dy[i]);
    }
    AttnRef ref = attention_reference(in.qkv, in.dy, B, T, NH, HD);

    emu::order = order;
    emu::copies = copies;
    const float nan = std::nanf("");
    vector<bf> y(n, __float2bfloat16(nan)), dqkv(3 * n, __float2bfloat16(nan));
    vector<float> lse((size_t)B * NH * T, nan), dsum((size_t)B * NH * T, nan);
    // Poisoned: a partial entry no block writes shows up as NaN.
    const bool sums = !(order == emu::Order::reverse && copies == emu::Copies::deferred);
    vector<float> bsum((q_parts(B, T) + 2 * kv_parts(B, T)) * C, nan);
    forward(y.data(), lse.data(), qkv.data(), B, T, NH, 0.125f);
    backward(dqkv.data(), dsum.data(), sums ? bsum.data() : nullptr, qkv.data(), y.data(),
             lse.data(), dy.data(), B, T, NH, 0.125f);

    char label[96];
    std::snprintf(label, sizeof label, "B %d T %3d NH %d %-7s %-9s", B, T, NH,
                  order == emu::Order::forward ? "forward" : "reverse",
                  copies == emu::Copies::immediate ? "immediate" : "deferred");
    const AttnTol tol{MAX_TOL, ROW_TOL_Y_DV, ROW_TOL_DQ_DK, ROW_FLOOR, LSE_TOL};
    bool ok = compare_attention(
        label, ref, B, T, NH, HD, [&](size_t i) { return d(y[i]); },
        [&](size_t i) { return d(dqkv[i]); }, [&](size_t i) { return (double)lse[i]; }, tol);
    if (sums) {
        // Σ_rows of the stored dq, dk, dv, in double, each part on its own (dk's sums
        // nearly cancel: softmax is invariant to a shift of k).
        const vector<bf> db = finish(bsum.data(), B, T, C);
        const char* names[3] = {"db_q", "db_k", "db_v"};
        for (int part = 0; part < 3; ++part) {
            vector<double> want(C, 0.0);
            for (int r = 0; r < B * T; ++r)
                for (int c = 0; c < C; ++c)
                    want[c] += d(dqkv[((size_t)r * 3 + part) * C + c]);
            ok &= compare(
                label, names[part], 1, C, [&](int, int c) { return d(db[part * C + c]); },
                [&](int, int c) { return want[c]; }, MAX_TOL, ROW_TOL_Y_DV, ROW_FLOOR);
        }
    }
    return ok;
}

int main() {
    const int shapes[][3] = {{1, 1, 1},   {1, 77, 2},  {1, 130, 1},
                             {2, 200, 1}, {1, 256, 2}, {1, 513, 2}};
    bool ok = true;
    int failed = 0;
    for (auto& s : shapes)
        for (auto order : {emu::Order::forward, emu::Order::reverse})
            for (auto copies : {emu::Copies::immediate, emu::Copies::deferred}) {
                bool good = check(s[0], s[1], s[2], order, copies);
                failed += !good;
                ok &= good;
            }
    std::printf("%s: %d of %d shape/mode runs failed\n", ok ? "PASS" : "FAIL", failed,
                (int)(sizeof shapes / sizeof shapes[0]) * 4);
    return ok ? 0 : 1;
}
