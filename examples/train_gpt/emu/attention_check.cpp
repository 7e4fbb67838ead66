// Runs the bf16 attention kernels of attention_mma.cu, unchanged, on the host through
// cuda_emu.h, and compares them with a double-precision reference of the same bf16 inputs.
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing -I examples/train_gpt/emu
//     examples/train_gpt/emu/attention_check.cpp -o /tmp/attention_check
//   /tmp/attention_check
//
// Every shape runs in the four scheduling modes (warp order forward / reverse, cp.async
// immediate / deferred); one line per shape, mode and tensor; exit status 1 on any failure.
#define HOST_EMULATION
#include "cuda_emu.h"
#include "../attention_mma.cu"
#include "compare.h"

#include <string>
#include <vector>

using std::vector;
typedef __nv_bfloat16 bf;

// ---- The launches, as attention.rs issues them (change them here with the kernels) ----
// attn_fwd and attn_bwd_dq take QT queries a block, attn_bwd_dkdv TILE keys; NT threads.
// attn_bwd_dq also writes dsum = rowsum(dy ⊙ y), which attn_bwd_dkdv reads: dq runs first.
static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }
static void forward(bf* y, float* lse, const bf* qkv, unsigned B, unsigned T, unsigned NH,
                    float scale) {
    launch(attn_fwd, dim3(B * NH, cdiv(T, QT)), dim3(NT), y, lse, qkv, T, NH, scale);
}
static void backward(bf* dqkv, float* dsum, const bf* qkv, const bf* y, const float* lse,
                     const bf* dy, unsigned B, unsigned T, unsigned NH, float scale) {
    launch(attn_bwd_dq, dim3(B * NH, cdiv(T, QT)), dim3(NT), dqkv, dsum, qkv, y, dy, lse, T,
           NH, scale);
    launch(attn_bwd_dkdv, dim3(B * NH, cdiv(T, TILE)), dim3(NT), dqkv, qkv, dy, lse,
           (const float*)dsum, T, NH, scale);
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
// lse is compared in absolute terms: a log, its error is the relative error of the row's
// sum of exponentials (f32 sums of bf16-rounded probabilities).
static const double MAX_TOL = 2e-2, ROW_FLOOR = 0.1, LSE_TOL = 5e-3;
static const double ROW_TOL_Y_DV = 2e-2, ROW_TOL_DQ_DK = 1e-1;

static double d(bf v) { return __bfloat162float(v); }

struct Ref {
    vector<double> y, lse, dqkv;
};

// Causal softmax attention in double from the bf16 inputs, scale 1/8, and its gradients.
static Ref reference(const vector<bf>& qkv, const vector<bf>& dy, int B, int T, int NH) {
    const int C = NH * HD;
    Ref r{vector<double>((size_t)B * T * C), vector<double>((size_t)B * NH * T),
          vector<double>((size_t)3 * B * T * C, 0.0)};
    auto at = [&](int b, int t, int which, int h) {
        return ((size_t)(b * T + t) * 3 + which) * C + h * HD;
    };
    vector<double> p(T), dp(T);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                const bf* q = &qkv[at(b, t, 0, h)];
                double mx = -1e300;
                for (int j = 0; j <= t; ++j) {
                    const bf* k = &qkv[at(b, j, 1, h)];
                    double s = 0;
                    for (int c = 0; c < HD; ++c) s += d(q[c]) * d(k[c]);
                    p[j] = s / 8.0;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
                for (int j = 0; j <= t; ++j) p[j] /= sum;
                r.lse[((size_t)b * NH + h) * T + t] = mx + std::log(sum);
                double* yr = &r.y[(size_t)(b * T + t) * C + h * HD];
                for (int j = 0; j <= t; ++j)
                    for (int c = 0; c < HD; ++c) yr[c] += p[j] * d(qkv[at(b, j, 2, h) + c]);
                const bf* g = &dy[(size_t)(b * T + t) * C + h * HD];
                double D = 0;
                for (int c = 0; c < HD; ++c) D += d(g[c]) * yr[c];
                for (int j = 0; j <= t; ++j) {
                    double s = 0;
                    for (int c = 0; c < HD; ++c) s += d(g[c]) * d(qkv[at(b, j, 2, h) + c]);
                    double ds = p[j] * (s - D) / 8.0;
                    double* dq = &r.dqkv[at(b, t, 0, h)];
                    double* dk = &r.dqkv[at(b, j, 1, h)];
                    double* dv = &r.dqkv[at(b, j, 2, h)];
                    for (int c = 0; c < HD; ++c) {
                        dq[c] += ds * d(qkv[at(b, j, 1, h) + c]);
                        dk[c] += ds * d(q[c]);
                        dv[c] += p[j] * d(g[c]);
                    }
                }
            }
    return r;
}

static bool check(int B, int T, int NH, emu::Order order, emu::Copies copies) {
    const int C = NH * HD;
    const size_t n = (size_t)B * T * C;
    Rng rng{(uint64_t)(B * 1000003 + T * 1009 + NH)};
    vector<bf> qkv(3 * n), dy(n);
    for (size_t i = 0; i < 3 * n; ++i) {
        bool is_q = (i / C) % 3 == 0;  // sharper attention: q twice the scale of k
        qkv[i] = __float2bfloat16((float)(rng.normal() * (is_q ? 2.0 : 1.0)));
    }
    for (auto& v : dy) v = __float2bfloat16((float)rng.normal());
    Ref ref = reference(qkv, dy, B, T, NH);

    emu::order = order;
    emu::copies = copies;
    const float nan = std::nanf("");
    vector<bf> y(n, __float2bfloat16(nan)), dqkv(3 * n, __float2bfloat16(nan));
    vector<float> lse((size_t)B * NH * T, nan), dsum((size_t)B * NH * T, nan);
    forward(y.data(), lse.data(), qkv.data(), B, T, NH, 0.125f);
    backward(dqkv.data(), dsum.data(), qkv.data(), y.data(), lse.data(), dy.data(), B, T, NH,
             0.125f);

    char label[96];
    std::snprintf(label, sizeof label, "B %d T %3d NH %d %-7s %-9s", B, T, NH,
                  order == emu::Order::forward ? "forward" : "reverse",
                  copies == emu::Copies::immediate ? "immediate" : "deferred");
    // Rows (b, t, h) of y and of each part of dqkv, in the same order for kernel and ref.
    auto yrow = [&](int i) { return (size_t)i * HD; };
    auto part = [&](int which) {
        return [=](int i) {
            int h = i % NH, bt = i / NH;
            return ((size_t)bt * 3 + which) * C + (size_t)h * HD;
        };
    };
    const int rows = B * T * NH;
    auto row_of = [&](const bf* t, auto off) {
        return [=](int i, int c) { return d(t[off(i) + c]); };
    };
    auto ref_of = [&](const vector<double>& t, auto off) {
        return [&t, off](int i, int c) { return t[off(i) + c]; };
    };
    bool ok = compare(label, "y", rows, HD, row_of(y.data(), yrow), ref_of(ref.y, yrow),
                      MAX_TOL, ROW_TOL_Y_DV, ROW_FLOOR);
    const char* names[3] = {"dq", "dk", "dv"};
    const double row_tols[3] = {ROW_TOL_DQ_DK, ROW_TOL_DQ_DK, ROW_TOL_Y_DV};
    for (int which = 0; which < 3; ++which)
        ok &= compare(label, names[which], rows, HD, row_of(dqkv.data(), part(which)),
                      ref_of(ref.dqkv, part(which)), MAX_TOL, row_tols[which], ROW_FLOOR);
    double lerr = 0;
    bool lfinite = true;
    for (size_t i = 0; i < lse.size(); ++i) {
        if (!std::isfinite(lse[i])) lfinite = false;
        lerr = std::max(lerr, std::fabs(lse[i] - ref.lse[i]));
    }
    bool lok = lfinite && lerr <= LSE_TOL;
    std::printf("%s lse abs %.2e (tol %.0e)%s  %s\n", label, lerr, LSE_TOL,
                lfinite ? "" : "  non-finite", lok ? "ok" : "FAIL");
    return ok && lok;
}

int main() {
    const int shapes[][3] = {{1, 1, 1}, {1, 77, 2}, {1, 130, 1}, {2, 200, 1}, {1, 256, 2}};
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
