// Runs the layer-norm kernels of kernels.cu, unchanged, on the host through cuda_emu.h, and
// compares them with a double-precision reference of the same inputs: layernorm_fwd,
// residual_layernorm_fwd, and the backward pass (layernorm_bwd + colsum_finish for rows of
// up to 64·RP, layernorm_bwd_dx, layernorm_bwd_wb + colsum_finish for wider ones),
// launched as kernels.rs launches them. Where the one-pass layernorm_bwd runs, the
// two-pass kernels run on the same inputs too, and its dinp and partial sums must equal
// theirs bit for bit (no FMA contraction on the host); where it also takes the updated
// dinp's column sums along (a residual's bias gradient), they must equal colsum_partial's
// bit for bit, and their total the double-precision sum. One program, two builds, as
// kernels.cu has two precisions: fp32 activations, or bf16 with ACT_BF16 defined.
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing [-DACT_BF16=1] -I examples/train_gpt/emu
//     examples/train_gpt/emu/layernorm_check.cpp -o /tmp/layernorm_check
//   /tmp/layernorm_check
//
// The kernels use no cp.async: every shape runs in both warp orders. One line per shape,
// order and tensor; exit status 1 on any failure.
#define HOST_EMULATION
#include "cuda_emu.h"
#include "../kernels.cu"
#include "compare.h"

#include <cstring>
#include <vector>

using std::vector;

#ifdef ACT_BF16
static const char* const PRECISION = "bf16";
#else
static const char* const PRECISION = "fp32";
#endif

// ---- The launches, as kernels.rs issues them (change them here with the kernels) ----
static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }
static dim3 warp_rows(unsigned n) { return dim3(std::max(cdiv(n, 8), 1u)); }  // 256 threads
static unsigned colsum_parts(unsigned rows) { return std::clamp(cdiv(rows, 8), 1u, 256u); }

static void forward(act_t* out, float* mean, float* rstd, const act_t* inp, const act_t* w,
                    const act_t* b, unsigned N, unsigned C) {
    launch(layernorm_fwd, warp_rows(N), dim3(256), out, mean, rstd, inp, w, b, N, C);
}
static void residual_forward(act_t* res, act_t* out, float* mean, float* rstd, const act_t* x,
                             const act_t* y, const act_t* pb, const act_t* w, const act_t* b,
                             unsigned N, unsigned C) {
    launch(residual_layernorm_fwd, warp_rows(N), dim3(256), res, out, mean, rstd, x, y, pb, w,
           b, N, C);
}
// The widest rows of the one-pass backward (every pair of a row in a lane's registers).
static const unsigned FUSED_MAX_C = 64 * RP;
// The two-pass backward's first pass: dinp += the input gradient; partial: the
// colsum_parts(N) chunks' column sums (2C floats each).
static void backward_split(act_t* dinp, float* partial, const act_t* dout, const act_t* inp,
                           const float* mean, const float* rstd, const act_t* w, unsigned N,
                           unsigned C) {
    launch(layernorm_bwd_dx, warp_rows(N), dim3(256), dinp, dout, inp, mean, rstd, w, N, C);
    launch(layernorm_bwd_wb, dim3(cdiv(C / 2, 32), colsum_parts(N)), dim3(32, 8), partial,
           dout, inp, mean, rstd, N, C);
}
// dinp += the input gradient; dwb = (dw, db); partial: colsum_parts(N) · 2C floats. With
// rpartial (colsum_parts(N) · C floats), also rbias = the column sums of the updated dinp:
// taken along by the one-pass kernel, or by colsum_partial after the two-pass ones.
static void backward(act_t* dinp, act_t* dwb, float* partial, const act_t* dout, const act_t* inp,
                     const float* mean, const float* rstd, const act_t* w, unsigned N,
                     unsigned C, float* rpartial, act_t* rbias) {
    unsigned parts = colsum_parts(N);
    if (C <= FUSED_MAX_C) {
        launch(layernorm_bwd, dim3(parts), dim3(256), dinp, partial, rpartial, dout, inp, mean,
               rstd, w, N, C, rpartial ? 1u : 0u);
    } else {
        backward_split(dinp, partial, dout, inp, mean, rstd, w, N, C);
        if (rpartial)
            launch(colsum_partial, dim3(cdiv(C / 2, 32), parts), dim3(32, 8), rpartial,
                   (const act_t*)dinp, N, C);
    }
    launch(colsum_finish, dim3(2 * C), dim3(128), dwb, (const float*)partial, parts, 2 * C);
    if (rpartial)
        launch(colsum_finish, dim3(C), dim3(128), rbias, (const float*)rpartial, parts, C);
}

// ---- Tolerances ----
// In bf16 the activations are rounded (at most half an ulp, 2^-8 = 3.9e-3 of the value);
// sums are f32. Measured worst on the current kernels over every shape and order (the
// lines this program prints), MAX / ROW: out 3.5e-3 / 2.1e-3, res 3.5e-3 / 2.0e-3, rout
// (the layer norm of the stored bf16 residual) 3.3e-3 / 2.1e-3, dinp 3.2e-3 / 2.1e-3, dw
// 2.7e-3 / 1.9e-3, db 2.9e-3 / 1.8e-3 (dw and db: their C values as one row); ACT_TOL
// is 2.5x the rounding bound (2.8x the worst measured). In fp32 every activation's worst
// is at most 2.1e-7 (rout MAX 2.1e-7, dinp ROW 2.1e-7); ACT_TOL is 10x that (the device's
// FMA contraction rounds differently). The f32 statistics mean and rstd: MAX below
// 1.4e-7 in both builds; STAT_TOL leaves f32 sums over much wider rows room. A wrong index, a
// lost row or pair, or a missing reduction step gives errors of order 1 (or NaN from the
// poisoned shared memory and outputs).
#ifdef ACT_BF16
static const double ACT_TOL = 1e-2;
#else
static const double ACT_TOL = 2e-6;
#endif
static const double STAT_TOL = 1e-5, ROW_FLOOR = 0.1;

static double d(act_t v) { return ld(v); }

struct Stats {
    vector<double> mean, rstd;
};

// mean, rstd (eps 1e-5) of the rows of x, and its layer norm with w, b.
static Stats norm_ref(const vector<double>& x, const vector<double>& w, const vector<double>& b,
                      int N, int C, vector<double>& out) {
    Stats s{vector<double>(N), vector<double>(N)};
    out.assign((size_t)N * C, 0.0);
    for (int r = 0; r < N; ++r) {
        const double* xr = &x[(size_t)r * C];
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += xr[c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
        double rs = 1.0 / std::sqrt(v / C + 1e-5);
        s.mean[r] = m;
        s.rstd[r] = rs;
        for (int c = 0; c < C; ++c) out[(size_t)r * C + c] = (xr[c] - m) * rs * w[c] + b[c];
    }
    return s;
}

static vector<act_t> random_act(Rng& rng, size_t n, double scale, double offset) {
    vector<act_t> v(n);
    for (auto& e : v) e = st((float)(rng.normal() * scale + offset));
    return v;
}
static vector<double> wide(const vector<act_t>& v) {
    vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = d(v[i]);
    return r;
}

static bool check(int N, int C, emu::Order order) {
    emu::order = order;
    Rng rng{(uint64_t)(N * 7919 + C)};
    const size_t n = (size_t)N * C;
    vector<act_t> x = random_act(rng, n, 2.0, 0.5), y = random_act(rng, n, 1.0, 0.0);
    vector<act_t> pb = random_act(rng, C, 0.3, 0.0), w = random_act(rng, C, 0.1, 1.0);
    vector<act_t> b = random_act(rng, C, 0.1, 0.0), dout = random_act(rng, n, 1.0, 0.0);
    vector<act_t> dinp0 = random_act(rng, n, 0.5, 0.0);
    vector<double> xd = wide(x), wd = wide(w), bd = wide(b);

    // Reference.
    vector<double> out_ref, rout_ref, res_ref(n);
    Stats st = norm_ref(xd, wd, bd, N, C, out_ref);
    for (size_t i = 0; i < n; ++i) res_ref[i] = xd[i] + d(y[i]) + d(pb[i % C]);
    // The kernel normalises the residual it stores (bf16), as its comment says.
    vector<double> res_stored(n);
    for (size_t i = 0; i < n; ++i) res_stored[i] = d(::st((float)res_ref[i]));
    Stats rst = norm_ref(res_stored, wd, bd, N, C, rout_ref);
    vector<double> dinp_ref = wide(dinp0), dwb_ref(2 * C, 0.0);
    for (int r = 0; r < N; ++r) {
        double a = 0, bs = 0, m = st.mean[r], rs = st.rstd[r];
        for (int c = 0; c < C; ++c) {
            double g = wd[c] * d(dout[(size_t)r * C + c]);
            a += g;
            bs += g * (xd[(size_t)r * C + c] - m) * rs;
        }
        a /= C;
        bs /= C;
        for (int c = 0; c < C; ++c) {
            size_t i = (size_t)r * C + c;
            double nrm = (xd[i] - m) * rs, g = d(dout[i]);
            dinp_ref[i] += (wd[c] * g - a - nrm * bs) * rs;
            dwb_ref[c] += g * nrm;
            dwb_ref[C + c] += g;
        }
    }

    // Kernels; outputs poisoned with NaN.
    const float nan = std::nanf("");
    const act_t anan = ::st(nan);
    vector<act_t> out(n, anan), res(n, anan), rout(n, anan), dinp = dinp0, dwb(2 * C, anan);
    vector<float> mean(N, nan), rstd(N, nan), rmean(N, nan), rrstd(N, nan);
    vector<float> partial((size_t)colsum_parts(N) * 2 * C, nan);
    forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    residual_forward(res.data(), rout.data(), rmean.data(), rrstd.data(), x.data(), y.data(),
                     pb.data(), w.data(), b.data(), N, C);
    // Half the shapes take the residual gradient's column sums along.
    const bool with_res = (N + C) % 2 == 0;
    vector<float> rpartial((size_t)colsum_parts(N) * C, nan);
    vector<act_t> rbias(C, anan);
    backward(dinp.data(), dwb.data(), partial.data(), dout.data(), x.data(), mean.data(),
             rstd.data(), w.data(), N, C, with_res ? rpartial.data() : nullptr, rbias.data());

    char label[64];
    std::snprintf(label, sizeof label, "%s N %3d C %3d %-7s", PRECISION, N, C,
                  order == emu::Order::forward ? "forward" : "reverse");
    auto act = [&](const vector<act_t>& t) {
        return [&t, C](int i, int c) { return d(t[(size_t)i * C + c]); };
    };
    auto ref = [&](const vector<double>& t) {
        return [&t, C](int i, int c) { return t[(size_t)i * C + c]; };
    };
    auto stat = [](const vector<float>& t) {
        return [&t](int i, int) { return (double)t[i]; };
    };
    auto sref = [](const vector<double>& t) { return [&t](int i, int) { return t[i]; }; };
    const double T = ACT_TOL, S = STAT_TOL, F = ROW_FLOOR;
    bool ok = compare(label, "out", N, C, act(out), ref(out_ref), T, T, F);
    ok &= compare(label, "mean", N, 1, stat(mean), sref(st.mean), S, 1.0, F);
    ok &= compare(label, "rstd", N, 1, stat(rstd), sref(st.rstd), S, 1.0, F);
    ok &= compare(label, "res", N, C, act(res), ref(res_ref), T, T, F);
    ok &= compare(label, "rout", N, C, act(rout), ref(rout_ref), T, T, F);
    ok &= compare(label, "rmean", N, 1, stat(rmean), sref(rst.mean), S, 1.0, F);
    ok &= compare(label, "rrstd", N, 1, stat(rrstd), sref(rst.rstd), S, 1.0, F);
    ok &= compare(label, "dinp", N, C, act(dinp), ref(dinp_ref), T, T, F);
    if ((unsigned)C <= FUSED_MAX_C) {
        // The two-pass kernels on the same inputs: the same sums in the same order.
        vector<act_t> dinp2 = dinp0;
        vector<float> partial2(partial.size(), nan);
        backward_split(dinp2.data(), partial2.data(), dout.data(), x.data(), mean.data(),
                       rstd.data(), w.data(), N, C);
        bool same = std::memcmp(dinp.data(), dinp2.data(), n * sizeof(act_t)) == 0 &&
                    std::memcmp(partial.data(), partial2.data(), partial.size() * 4) == 0;
        std::printf("%s dinp, partial equal the two-pass kernels' bit for bit: %s\n", label,
                    same ? "ok" : "FAIL");
        ok &= same;
        if (with_res) {
            // The residual sums equal colsum_partial's of the stored dinp, bit for bit.
            vector<float> rpartial2(rpartial.size(), nan);
            launch(colsum_partial, dim3(cdiv(C / 2, 32), colsum_parts(N)), dim3(32, 8),
                   rpartial2.data(), (const act_t*)dinp.data(), (unsigned)N, (unsigned)C);
            bool rsame = std::memcmp(rpartial.data(), rpartial2.data(), rpartial.size() * 4) == 0;
            std::printf("%s residual sums equal colsum_partial's bit for bit: %s\n", label,
                        rsame ? "ok" : "FAIL");
            ok &= rsame;
        }
    }
    if (with_res) {
        // Σ_rows of the stored dinp, in double.
        vector<double> rb_ref(C, 0.0);
        for (int r = 0; r < N; ++r)
            for (int c = 0; c < C; ++c) rb_ref[c] += d(dinp[(size_t)r * C + c]);
        auto rb_got = [&](int, int c) { return d(rbias[c]); };
        auto rb_at = [&](int, int c) { return rb_ref[c]; };
        ok &= compare(label, "rbias", 1, C, rb_got, rb_at, ACT_TOL, ACT_TOL, ROW_FLOOR);
    }
    auto dwb_got = [&](int, int c) { return d(dwb[c]); };
    auto dwb_at = [&](int, int c) { return dwb_ref[c]; };
    auto db_got = [&](int, int c) { return d(dwb[C + c]); };
    auto db_at = [&](int, int c) { return dwb_ref[C + c]; };
    ok &= compare(label, "dw", 1, C, dwb_got, dwb_at, T, T, F);
    ok &= compare(label, "db", 1, C, db_got, db_at, T, T, F);
    return ok;
}

int main() {
    // (rows, C): one row of one pair; rows across blocks of 8 and C not a multiple of 64
    // (lanes with fewer pairs); column pairs past one block of 32; 33 row chunks (8 rows
    // each, the last 4), so that colsum_finish's tree adds more than 32. The one-pass
    // backward (C ≤ 64·RP = 768): one row and 5 rows (warps of a block without rows), the
    // widths of the models (384 and 768) with rows not a multiple of 8: 3 chunks of 7 or
    // 6 rows (20 rows), 9 and 26 chunks of 8 with a short last one (65 and 203 rows), and
    // 2100 rows: 256 chunks of 9 (warp 0 of a block takes two rows, the others one; the
    // last 22 blocks take none and write zero sums; colsum_finish adds two chunks a
    // thread). The two-pass one (C > 768): 9 rows of 1000, 70 rows of 770 (9 chunks).
    const int shapes[][2] = {{1, 2},    {13, 66},  {37, 200},  {260, 96}, {1, 768},
                             {5, 384},  {65, 384}, {20, 768},  {203, 768}, {2100, 384},
                             {9, 1000}, {70, 770}};
    int failed = 0, runs = 0;
    for (auto& s : shapes)
        for (auto order : {emu::Order::forward, emu::Order::reverse}) {
            failed += !check(s[0], s[1], order);
            ++runs;
        }
    std::printf("%s: %d of %d shape/order runs failed (%s)\n", failed ? "FAIL" : "PASS", failed,
                runs, PRECISION);
    return failed ? 1 : 0;
}
