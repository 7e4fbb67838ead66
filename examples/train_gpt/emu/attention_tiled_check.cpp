// Runs the fp32 attention kernels of attention.cu (attn_fwd, attn_bwd_d, attn_bwd_dq,
// attn_bwd_dkdv), unchanged, on the host through cuda_emu.h, and compares them with the
// double-precision reference of attention_ref.h (the one attention_check.cpp uses).
// attention.cu's bf16 path (ACT_BF16) multiplies its tiles with wmma fragments, which
// the emulator does not model: only the fp32 path (FMA loops) runs here.
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing -I examples/train_gpt/emu
//     examples/train_gpt/emu/attention_tiled_check.cpp -o /tmp/attention_tiled_check
//   /tmp/attention_tiled_check
//
// The kernels use no cp.async: every shape runs in both warp orders. One line per shape,
// order and tensor; exit status 1 on any failure.
#define HOST_EMULATION
#include "cuda_emu.h"
#include "../attention.cu"
#include "attention_ref.h"

#include <vector>

using std::vector;

// ---- The launches, as attention.rs issues them for attention.cu (`tiled`: grid (tiles,
// B·NH), the tiles of `tiles(false)`, BR queries and BC keys; change them here with the
// kernels) ----
static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }
// Attention::forward.
static void forward(float* y, float* lse, const float* qkv, unsigned B, unsigned T,
                    unsigned NH, float scale) {
    launch(attn_fwd, dim3(cdiv(T, BR), B * NH), dim3(NT), y, lse, qkv, T, NH, scale);
}
// Attention::backward: dsum (attn_bwd_d, eight lanes a row, 32 rows a block of 256), then
// dq, then dk and dv (both read dsum).
static void backward(float* dqkv, float* dsum, const float* qkv, const float* y,
                     const float* lse, const float* dy, unsigned B, unsigned T, unsigned NH,
                     float scale) {
    const unsigned rows = B * T * NH;
    launch(attn_bwd_d, dim3(cdiv(rows, 32)), dim3(256), dsum, y, dy, rows, T, NH);
    launch(attn_bwd_dq, dim3(cdiv(T, BR), B * NH), dim3(NT), dqkv, qkv, dy, lse,
           (const float*)dsum, T, NH, scale);
    launch(attn_bwd_dkdv, dim3(cdiv(T, BC), B * NH), dim3(NT), dqkv, qkv, dy, lse,
           (const float*)dsum, T, NH, scale);
}

// ---- Tolerances ----
// Everything is f32: products of 64 terms, softmax sums over up to T terms, expf and logf
// (the host's here, the device's within 2 ulp), P·V and dS·K over up to T keys. The worst
// errors measured on the current kernels over every shape and order (the lines this
// program prints) are, relative to the reference's largest magnitude, at most 1.1e-6
// (dq); per row 1.5e-6 for y, 2.0e-6 for dv, 2.1e-6 for dk and 1.3e-5 for dq (a row of dq
// is Σ dS·k, which nearly cancels where the attention is sharp, as attention_check.cpp
// says); lse at most 1.7e-6 absolute; dsum 6.9e-7 (MAX) and 4.8e-7 (ROW). Each tolerance
// is 6x to 10x its measured worst: room for the device's own rounding (its expf, FMA
// contraction) while a wrong index, mask, tile bound or missing synchronisation gives
// errors of order 1 (or NaN from the poisoned shared memory and outputs). With T = 1, dq
// and dk vanish (ds = P·(dP − D) with P = 1, dP = D): compare.h compares them in absolute
// terms.
static const double MAX_TOL = 1e-5, ROW_FLOOR = 0.1, LSE_TOL = 1e-5, DSUM_TOL = 5e-6;
static const double ROW_TOL_Y_DV = 2e-5, ROW_TOL_DQ_DK = 1e-4;

static bool check(int B, int T, int NH, emu::Order order) {
    const int C = NH * HD;
    const size_t n = (size_t)B * T * C;
    AttnInputs in = attention_inputs(B, T, NH, HD);
    vector<float> qkv(3 * n), dy(n);
    for (size_t i = 0; i < 3 * n; ++i) in.qkv[i] = qkv[i] = (float)in.qkv[i];
    for (size_t i = 0; i < n; ++i) in.dy[i] = dy[i] = (float)in.dy[i];
    AttnRef ref = attention_reference(in.qkv, in.dy, B, T, NH, HD);

    emu::order = order;
    const float nan = std::nanf("");
    vector<float> y(n, nan), dqkv(3 * n, nan);
    vector<float> lse((size_t)B * NH * T, nan), dsum((size_t)B * NH * T, nan);
    forward(y.data(), lse.data(), qkv.data(), B, T, NH, 0.125f);
    backward(dqkv.data(), dsum.data(), qkv.data(), y.data(), lse.data(), dy.data(), B, T, NH,
             0.125f);

    char label[96];
    std::snprintf(label, sizeof label, "fp32 B %d T %3d NH %d %-7s", B, T, NH,
                  order == emu::Order::forward ? "forward" : "reverse");
    const AttnTol tol{MAX_TOL, ROW_TOL_Y_DV, ROW_TOL_DQ_DK, ROW_FLOOR, LSE_TOL};
    bool ok = compare_attention(
        label, ref, B, T, NH, HD, [&](size_t i) { return (double)y[i]; },
        [&](size_t i) { return (double)dqkv[i]; }, [&](size_t i) { return (double)lse[i]; },
        tol);
    // dsum (B, NH, T): a row of T per head.
    ok &= compare(
        label, "dsum", B * NH, T, [&](int i, int t) { return (double)dsum[(size_t)i * T + t]; },
        [&](int i, int t) { return ref.D[(size_t)i * T + t]; }, DSUM_TOL, DSUM_TOL, ROW_FLOOR);
    return ok;
}

int main() {
    // attention_check.cpp's shapes: one query; T not a multiple of the 16-row tiles (77,
    // 130, 200) and a multiple (256); two heads; two sequences.
    const int shapes[][3] = {{1, 1, 1}, {1, 77, 2}, {1, 130, 1}, {2, 200, 1}, {1, 256, 2}};
    int failed = 0, runs = 0;
    for (auto& s : shapes)
        for (auto order : {emu::Order::forward, emu::Order::reverse}) {
            failed += !check(s[0], s[1], s[2], order);
            ++runs;
        }
    std::printf("%s: %d of %d shape/order runs failed\n", failed ? "FAIL" : "PASS", failed,
                runs);
    return failed ? 1 : 0;
}
