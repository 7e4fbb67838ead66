// Runs the kernels of kernels.cu other than the layer norms (layernorm_check.cpp has those),
// unchanged, on the host through cuda_emu.h, launched as kernels.rs and kernels_optim.rs
// launch them, and compares them with double-precision references of the same inputs:
//   encoder     encoder_fwd; encoder_bwd_wpe, encoder_bwd_wte_partial + _finish
//   bias        colsum_partial + colsum_finish (the bias gradient), bias_add;
//               colsum_finish_qkv (the fused attention's QKV bias gradient)
//   permute     permute_qkv and unpermute, both directions
//   softmax     softmax_causal_fwd, softmax_causal_bwd
//   gelu        gelu_fwd, gelu_bwd
//   xent        xent with and without the gradient, then sum_finish (the mean loss)
//   sumsq       sumsq_partial + sum_finish (the squared gradient norm)
//   adamw       adamw (unclipped and clipped), cast_weights
//
// One program, two builds, as kernels.cu has two precisions: fp32 activations, or bf16
// with ACT_BF16 defined.
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing [-DACT_BF16=1] -I examples/train_gpt/emu
//     examples/train_gpt/emu/kernels_check.cpp -o /tmp/kernels_check
//   /tmp/kernels_check
//
// Exact lines: kernels whose results are sums (additions in an order the kernel fixes,
// no products) or copies are also compared bit for bit with a float replay of that order,
// which the device reproduces too (no product, so no FMA contraction; float additions are
// IEEE): the embedding and its gradients, the column sums, bias_add, the layout kernels,
// sum_finish (replayed from the kernel's own partial sums), and adamw's and
// cast_weights's act_t weights (the rounding of the float master weights). Kernels with
// products or transcendentals (softmax, gelu, xent, sumsq_partial, adamw's update) are
// compared within tolerances only: the device contracts a·b + c into FMAs and has its own
// expf, logf and tanhf, so a bitwise host replay would not say what it computes.
//
// The kernels use no cp.async: every shape runs in both warp orders. One line per kernel
// group, shape, order and tensor; exit status 1 on any failure.
#define HOST_EMULATION
#include "cuda_emu.h"
#include "../kernels.cu"
#include "compare.h"

#include <array>
#include <cstdarg>
#include <string>
#include <vector>

using std::vector;

#ifdef ACT_BF16
static const char* const PRECISION = "bf16";
#else
static const char* const PRECISION = "fp32";
#endif

// ---- The launches, as kernels.rs and kernels_optim.rs issue them (change them here with
// the kernels) ----
static unsigned cdiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
// `grid`: blocks of 256 for n elements, at most 8192 (grid-stride loops do the rest).
static dim3 grid(size_t n) { return dim3(std::clamp(cdiv(n, 256), 1u, 8192u)); }
// `warp_rows`: one warp a row, 8 rows a block of 256.
static dim3 warp_rows(unsigned rows) { return dim3(std::max(cdiv(rows, 8), 1u)); }
// `column_chunks`: blocks of (32, 8), x over column pairs, y over chunks of rows.
static dim3 column_chunks(unsigned cols, unsigned parts) { return dim3(cdiv(cols, 32), parts); }
// `blocks`: n blocks (at least one).
static dim3 blocks(unsigned n) { return dim3(std::max(n, 1u)); }
static unsigned wte_parts(unsigned rows) { return std::clamp(cdiv(rows, 256), 1u, 32u); }
static unsigned colsum_parts(unsigned rows) { return std::clamp(cdiv(rows, 8), 1u, 256u); }
static const unsigned NORM_PARTS = 1024;

// Kernels::encoder_fwd.
static void encoder_forward(act_t* out, const unsigned* tok, const act_t* wte,
                            const act_t* wpe, unsigned BT, unsigned T, unsigned C) {
    launch(encoder_fwd, grid((size_t)BT * C), dim3(256), out, tok, wte, wpe, BT, T, C);
}
// Kernels::encoder_bwd: dwpe = Σ_b dout (overwritten), dwte += dout scattered by token,
// through partial (wte_parts(B·T) · V · C).
static void encoder_backward(act_t* dwte, act_t* dwpe, float* partial, const act_t* dout,
                             const unsigned* tok, unsigned B, unsigned T, unsigned C,
                             unsigned V) {
    launch(encoder_bwd_wpe, grid((size_t)T * C), dim3(256), dwpe, dout, B, T, C);
    const unsigned pp = wte_parts(B * T);
    launch(encoder_bwd_wte_partial, dim3(cdiv(C, 32), pp), dim3(32), partial, dout, tok,
           B * T, V, C);
    launch(encoder_bwd_wte_finish, grid((size_t)V * C), dim3(256), dwte,
           (const float*)partial, pp, V * C);
}
// Kernels::bias_grad (`colsum`): the column sums of dout (N × C) into out, through
// partial (colsum_parts(N) · C).
static void bias_grad(act_t* out, float* partial, const act_t* dout, unsigned N, unsigned C) {
    const unsigned pp = colsum_parts(N);
    launch(colsum_partial, column_chunks(C / 2, pp), dim3(32, 8), partial, dout, N, C);
    launch(colsum_finish, blocks(C), dim3(128), out, (const float*)partial, pp, C);
}
// Kernels::qkv_bias_finish: out (3C) from the attention's partials (Pq, then 2 × Pkv rows).
static void qkv_bias_finish(act_t* out, const float* partial, unsigned Pq, unsigned Pkv,
                            unsigned C) {
    launch(colsum_finish_qkv, blocks(3 * C), dim3(128), out, partial, Pq, Pkv, C);
}
// Kernels::bias_add: y (N × C) += b.
static void bias_add_rows(act_t* y, const act_t* b, unsigned N, unsigned C) {
    launch(bias_add, grid((size_t)N * C), dim3(256), y, b, N, C);
}
// Kernels::permute_qkv (back: q, k, v into qkv) and Kernels::unpermute (back: out into y).
static void permute(act_t* q, act_t* k, act_t* v, act_t* qkv, unsigned B, unsigned T,
                    unsigned NH, unsigned hs, bool back) {
    launch(permute_qkv, grid((size_t)B * T * NH * hs), dim3(256), q, k, v, qkv, B, T, NH, hs,
           (int)back);
}
static void unpermute_heads(act_t* out, act_t* y, unsigned B, unsigned T, unsigned NH,
                            unsigned hs, bool back) {
    launch(unpermute, grid((size_t)B * T * NH * hs), dim3(256), out, y, B, T, NH, hs,
           (int)back);
}
// Kernels::softmax_fwd and softmax_bwd: rows of T.
static void softmax_forward(act_t* att, const act_t* pre, unsigned rows, unsigned T) {
    launch(softmax_causal_fwd, warp_rows(rows), dim3(256), att, pre, rows, T);
}
static void softmax_backward(act_t* dpre, const act_t* datt, const act_t* att, unsigned rows,
                             unsigned T) {
    launch(softmax_causal_bwd, warp_rows(rows), dim3(256), dpre, datt, att, rows, T);
}
// Kernels::gelu_fwd and gelu_bwd.
static void gelu_forward(act_t* out, const act_t* inp, unsigned n) {
    launch(gelu_fwd, grid(n), dim3(256), out, inp, n);
}
static void gelu_backward(act_t* dinp, const act_t* inp, const act_t* dout, unsigned n) {
    launch(gelu_bwd, grid(n), dim3(256), dinp, inp, dout, n);
}
// Kernels::xent: losses, loss[0] = their mean, and with `grad` (k) the logits' gradient of
// k × the mean.
static void cross_entropy(act_t* dlogits, float* losses, float* loss, const act_t* logits,
                          const unsigned* targets, unsigned N, unsigned V, const float* grad) {
    const float scale = 1.0f / (float)N;
    const float dscale = (grad ? *grad : 0.0f) * scale;
    launch(xent, blocks(N), dim3(256), dlogits, losses, logits, targets, N, V, dscale,
           (int)(grad != nullptr));
    launch(sum_finish, blocks(1), dim3(256), loss, (const float*)losses, N, scale, 0u);
}
// Kernels::sumsq: the squared norm of g into out[0], through partial (NORM_PARTS).
static void sumsq(float* out, float* partial, const act_t* g, unsigned n) {
    launch(sumsq_partial, blocks(NORM_PARTS), dim3(256), partial, g, n);
    launch(sum_finish, blocks(1), dim3(256), out, (const float*)partial, NORM_PARTS, 1.0f, 0u);
}
// Kernels::adamw with optim::AdamW's fields.
struct AdamW {
    float beta1, beta2, eps, weight_decay, max_norm;
};
static void adamw_step(float* p, act_t* w, const act_t* g, float* m, float* v, unsigned n,
                       const float* sched, const float* normsq, const unsigned char* decay,
                       const AdamW& hp) {
    launch(adamw, grid(n), dim3(256), p, w, g, m, v, n, sched, normsq, decay,
           hp.weight_decay, hp.beta1, hp.beta2, hp.eps, hp.max_norm);
}
// Kernels::cast_weights.
static void cast(act_t* w, const float* p, unsigned n) {
    launch(cast_weights, grid(n), dim3(256), w, p, n);
}

// ---- Tolerances ----
// MAX and ROW as compare.h defines them; the elementwise kernels (gelu, adamw, and the
// losses and partial sums) are compared as rows of one element: ROW is then each
// element's relative error (floored at ROW_FLOOR of the RMS value).
// ACT_TOL: act_t results. In bf16 their rounding, at most half an ulp (2^-8 = 3.9e-3 of
// the value), dominates: measured worst over every kernel, shape and order (the lines
// this program prints) 3.6e-3 MAX (encoder out) and 3.9e-3 ROW (gelu dinp); ACT_TOL is
// 2.5x the bound. In fp32 the f32 rounding of sums and of expf and tanhf: measured worst
// 2.6e-7 MAX and 1.5e-6 ROW (softmax dpre) but 1.1e-5 for an element of gelu dinp, where
// 0.5·(1 + tanh) cancels for inputs near -3; ACT_TOL is 9x that (the device's tanhf and
// FMA contraction round differently).
// F32_TOL: the f32 results (losses, the mean loss, partial and total sums of squares,
// AdamW's moments): measured worst 1.4e-7 MAX and 5.5e-7 ROW (an element of m), in both
// builds; F32_TOL is 9x that.
// DP_TOL: AdamW's update p − p0 per element: the rounding of p itself (half an ulp of
// |p| ≤ 0.1) against the floor, a tenth of the RMS update (2e-4): measured worst 1.9e-5;
// DP_TOL is 5x that.
// A wrong index, a lost row, chunk or element, a wrong reduction step or a missing barrier
// gives errors of order 1 (or NaN from the poisoned shared memory and outputs).
#ifdef ACT_BF16
static const double ACT_TOL = 1e-2;
#else
static const double ACT_TOL = 1e-4;
#endif
static const double F32_TOL = 5e-6, DP_TOL = 1e-4, ROW_FLOOR = 0.1;

// ---- Helpers ----
static double dbl(float v) { return v; }
#ifdef ACT_BF16
static double dbl(__nv_bfloat16 v) { return __bfloat162float(v); }
#endif
template <class T>
static vector<double> wide(const vector<T>& v) {
    vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = dbl(v[i]);
    return r;
}
static vector<act_t> random_act(Rng& rng, size_t n, double scale, double offset = 0.0) {
    vector<act_t> v(n);
    for (auto& e : v) e = st((float)(rng.normal() * scale + offset));
    return v;
}
static vector<float> random_f32(Rng& rng, size_t n, double scale, double offset = 0.0) {
    vector<float> v(n);
    for (auto& e : v) e = (float)(rng.normal() * scale + offset);
    return v;
}
static vector<unsigned> random_tokens(Rng& rng, size_t n, unsigned V) {
    vector<unsigned> v(n);
    for (auto& e : v) e = std::min((unsigned)(rng.uniform() * V), V - 1);
    return v;
}
static const float NAN_F = std::nanf("");
static const act_t NAN_ACT = st(NAN_F);

// Element (i, c) of a `width`-wide row-major tensor, as a double.
template <class T>
static auto at(const vector<T>& t, int width) {
    return [&t, width](int i, int c) { return dbl(t[(size_t)i * width + c]); };
}

// An "exact" line: how many of the kernel's values differ in any bit from `want`.
template <class T>
static bool exact(const char* label, const char* name, const vector<T>& got,
                  const vector<T>& want) {
    size_t differ = got.size() == want.size() ? 0 : std::max(got.size(), want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
        differ += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    std::printf("%s %-7s exact %zu of %zu differ  %s\n", label, name, differ, want.size(),
                differ ? "FAIL" : "ok");
    return differ == 0;
}

static std::string label_of(const char* group, emu::Order order, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static std::string label_of(const char* group, emu::Order order, const char* fmt, ...) {
    char shape[64];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(shape, sizeof shape, fmt, ap);
    va_end(ap);
    char label[128];
    std::snprintf(label, sizeof label, "%s %-7s %-7s %-22s", PRECISION,
                  order == emu::Order::forward ? "forward" : "reverse", group, shape);
    return label;
}

// ---- The checks: one a kernel group and shape ----

// encoder_fwd and the embedding's gradients.
static bool check_encoder(unsigned B, unsigned T, unsigned C, unsigned V, emu::Order order) {
    Rng rng{(uint64_t)(B * 131 + T * 7 + C * 3 + V)};
    const unsigned BT = B * T;
    vector<unsigned> tok = random_tokens(rng, BT, V);
    vector<act_t> wte = random_act(rng, (size_t)V * C, 1.0), wpe = random_act(rng, T * C, 0.5);
    vector<act_t> dout = random_act(rng, (size_t)BT * C, 1.0);
    vector<act_t> dwte0 = random_act(rng, (size_t)V * C, 1.0);
    const unsigned parts = wte_parts(BT);

    vector<act_t> out((size_t)BT * C, NAN_ACT), dwpe((size_t)T * C, NAN_ACT), dwte = dwte0;
    vector<float> partial((size_t)parts * V * C, NAN_F);
    encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), BT, T, C);
    encoder_backward(dwte.data(), dwpe.data(), partial.data(), dout.data(), tok.data(), B, T,
                     C, V);

    // Reference (double) and replay (float, the kernels' order).
    vector<double> out_ref((size_t)BT * C), dwpe_ref((size_t)T * C, 0.0), dwte_ref = wide(dwte0);
    vector<act_t> out_rep(out.size()), dwpe_rep(dwpe.size()), dwte_rep(dwte.size());
    for (unsigned r = 0; r < BT; ++r)
        for (unsigned c = 0; c < C; ++c) {
            size_t i = (size_t)r * C + c, w = (size_t)tok[r] * C + c, p = (size_t)(r % T) * C + c;
            out_ref[i] = dbl(wte[w]) + dbl(wpe[p]);
            out_rep[i] = st(ld(wte[w]) + ld(wpe[p]));
            dwpe_ref[p] += dbl(dout[i]);
            dwte_ref[w] += dbl(dout[i]);
        }
    for (size_t i = 0; i < (size_t)T * C; ++i) {
        float s = 0.0f;
        for (unsigned b = 0; b < B; ++b) s += ld(dout[(size_t)b * T * C + i]);
        dwpe_rep[i] = st(s);
    }
    // Chunk y of the rows sums its rows in order per (token, column); then the chunks in
    // order, then dwte's old value.
    vector<float> part_rep((size_t)parts * V * C, 0.0f);
    const unsigned chunk = cdiv(BT, parts);
    for (unsigned y = 0; y < parts; ++y)
        for (unsigned r = std::min(BT, y * chunk); r < std::min(BT, y * chunk + chunk); ++r)
            for (unsigned c = 0; c < C; ++c)
                part_rep[((size_t)y * V + tok[r]) * C + c] += ld(dout[(size_t)r * C + c]);
    for (size_t i = 0; i < (size_t)V * C; ++i) {
        float s = 0.0f;
        for (unsigned y = 0; y < parts; ++y) s += part_rep[(size_t)y * V * C + i];
        dwte_rep[i] = st(ld(dwte0[i]) + s);
    }

    std::string label = label_of("encoder", order, "B %u T %u C %u V %u", B, T, C, V);
    const char* l = label.c_str();
    auto ref = [](const vector<double>& t, int w) {
        return [&t, w](int i, int c) { return t[(size_t)i * w + c]; };
    };
    bool ok = compare(l, "out", BT, C, at(out, C), ref(out_ref, C), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= compare(l, "dwpe", T, C, at(dwpe, C), ref(dwpe_ref, C), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= compare(l, "dwte", V, C, at(dwte, C), ref(dwte_ref, C), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= exact(l, "out", out, out_rep);
    ok &= exact(l, "dwpe", dwpe, dwpe_rep);
    ok &= exact(l, "dwte", dwte, dwte_rep);
    return ok;
}

// The bias gradient (column sums, C even) and bias_add (any C).
static bool check_bias(unsigned N, unsigned C, emu::Order order) {
    Rng rng{(uint64_t)(N * 7919 + C)};
    vector<act_t> dout = random_act(rng, (size_t)N * C, 1.0);
    vector<act_t> y0 = random_act(rng, (size_t)N * C, 1.0);
    vector<act_t> b = random_act(rng, C, 1.0);
    const unsigned parts = colsum_parts(N);
    vector<act_t> db(C, NAN_ACT), y = y0;
    vector<float> partial((size_t)parts * C, NAN_F);
    bias_grad(db.data(), partial.data(), dout.data(), N, C);
    bias_add_rows(y.data(), b.data(), N, C);

    vector<double> db_ref(C, 0.0), y_ref((size_t)N * C);
    vector<act_t> y_rep(y.size()), db_rep(C);
    for (unsigned r = 0; r < N; ++r)
        for (unsigned c = 0; c < C; ++c) {
            size_t i = (size_t)r * C + c;
            db_ref[c] += dbl(dout[i]);
            y_ref[i] = dbl(y0[i]) + dbl(b[c]);
            y_rep[i] = st(ld(y0[i]) + ld(b[c]));
        }
    // colsum_partial: thread (x, j) of chunk p sums rows r0 + j, r0 + j + 8, .. of its
    // column, then thread (x, 0) the eight in order of j. colsum_finish: thread t < 128 sums
    // chunks t, t + 128, .., then a tree halving 128 → 1.
    const unsigned chunk = cdiv(N, parts);
    vector<float> part_rep((size_t)parts * C);
    for (unsigned p = 0; p < parts; ++p) {
        unsigned r0 = std::min(N, p * chunk), r1 = std::min(N, r0 + chunk);
        for (unsigned c = 0; c < C; ++c) {
            float tb = 0.0f;
            for (unsigned j = 0; j < 8; ++j) {
                float s = 0.0f;
                for (unsigned r = r0 + j; r < r1; r += 8) s += ld(dout[(size_t)r * C + c]);
                tb += s;
            }
            part_rep[(size_t)p * C + c] = tb;
        }
    }
    for (unsigned c = 0; c < C; ++c) {
        float sh[128];
        for (unsigned t = 0; t < 128; ++t) {
            sh[t] = 0.0f;
            for (unsigned p = t; p < parts; p += 128) sh[t] += part_rep[(size_t)p * C + c];
        }
        for (unsigned o = 64; o > 0; o >>= 1)
            for (unsigned t = 0; t < o; ++t) sh[t] += sh[t + o];
        db_rep[c] = st(sh[0]);
    }

    std::string label = label_of("bias", order, "N %u C %u", N, C);
    const char* l = label.c_str();
    auto ref = [](const vector<double>& t, int w) {
        return [&t, w](int i, int c) { return t[(size_t)i * w + c]; };
    };
    bool ok = compare(l, "db", 1, C, at(db, C), ref(db_ref, C), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= compare(l, "y", N, C, at(y, C), ref(y_ref, C), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= exact(l, "db", db, db_rep);
    ok &= exact(l, "y", y, y_rep);
    return ok;
}

// permute_qkv and unpermute, both directions: copies, every element exact.
static bool check_permute(unsigned B, unsigned T, unsigned NH, unsigned hs, emu::Order order) {
    Rng rng{(uint64_t)(B * 1009 + T * 101 + NH * 11 + hs)};
    const size_t n = (size_t)B * T * NH * hs;
    vector<act_t> qkv = random_act(rng, 3 * n, 1.0), y = random_act(rng, n, 1.0);
    vector<act_t> qkv_heads[3] = {random_act(rng, n, 1.0), random_act(rng, n, 1.0),
                                  random_act(rng, n, 1.0)};
    // Heads-major (B, NH, T, hs) from token-major (B, T, 3, NH, hs) and (B, T, NH, hs).
    vector<act_t> q_rep(n), k_rep(n), v_rep(n), qkv_rep(3 * n), out_rep(n);
    vector<act_t>* parts_rep[3] = {&q_rep, &k_rep, &v_rep};
    for (unsigned b = 0; b < B; ++b)
        for (unsigned t = 0; t < T; ++t)
            for (unsigned h = 0; h < NH; ++h)
                for (unsigned d = 0; d < hs; ++d) {
                    size_t heads = (((size_t)b * NH + h) * T + t) * hs + d;
                    size_t tokens = (((size_t)b * T + t) * NH + h) * hs + d;
                    for (unsigned which = 0; which < 3; ++which) {
                        size_t packed = (((size_t)b * T + t) * 3 + which) * NH * hs +
                                        (size_t)h * hs + d;
                        (*parts_rep[which])[heads] = qkv[packed];
                        qkv_rep[packed] = qkv_heads[which][heads];
                    }
                    out_rep[tokens] = y[heads];
                }
    vector<act_t> q(n, NAN_ACT), k(n, NAN_ACT), v(n, NAN_ACT), qkv_back(3 * n, NAN_ACT);
    permute(q.data(), k.data(), v.data(), qkv.data(), B, T, NH, hs, false);
    vector<act_t> kq = qkv_heads[0], kk = qkv_heads[1], kv = qkv_heads[2];
    permute(kq.data(), kk.data(), kv.data(), qkv_back.data(), B, T, NH, hs, true);
    vector<act_t> out(n, NAN_ACT), y_back(n, NAN_ACT);
    unpermute_heads(out.data(), y.data(), B, T, NH, hs, false);
    unpermute_heads(out.data(), y_back.data(), B, T, NH, hs, true);

    std::string label = label_of("permute", order, "B %u T %u NH %u hs %u", B, T, NH, hs);
    const char* l = label.c_str();
    bool ok = exact(l, "q", q, q_rep);
    ok &= exact(l, "k", k, k_rep);
    ok &= exact(l, "v", v, v_rep);
    ok &= exact(l, "qkv", qkv_back, qkv_rep);
    ok &= exact(l, "out", out, out_rep);
    ok &= exact(l, "y", y_back, y);  // back from out: y again
    return ok;
}

// softmax_causal_fwd and _bwd over R sequences of T rows (row r is query r % T).
static bool check_softmax(unsigned R, unsigned T, emu::Order order) {
    Rng rng{(uint64_t)(R * 4099 + T)};
    const unsigned rows = R * T;
    const size_t n = (size_t)rows * T;
    vector<act_t> pre = random_act(rng, n, 2.0), datt = random_act(rng, n, 1.0);
    vector<double> att_ref(n, 0.0), dpre_ref(n, 0.0);
    vector<act_t> att_in(n);  // the backward pass's input: the reference softmax, rounded
    for (unsigned r = 0; r < rows; ++r) {
        unsigned t = r % T;
        const size_t o = (size_t)r * T;
        double mx = -1e300, sum = 0;
        for (unsigned i = 0; i <= t; ++i) mx = std::max(mx, dbl(pre[o + i]));
        for (unsigned i = 0; i <= t; ++i) sum += std::exp(dbl(pre[o + i]) - mx);
        for (unsigned i = 0; i <= t; ++i) att_ref[o + i] = std::exp(dbl(pre[o + i]) - mx) / sum;
        for (unsigned i = 0; i < T; ++i) att_in[o + i] = st((float)att_ref[o + i]);
        double s = 0;
        for (unsigned i = 0; i <= t; ++i) s += dbl(att_in[o + i]) * dbl(datt[o + i]);
        for (unsigned i = 0; i <= t; ++i)
            dpre_ref[o + i] = dbl(att_in[o + i]) * (dbl(datt[o + i]) - s);
    }
    vector<act_t> att(n, NAN_ACT), dpre(n, NAN_ACT);
    softmax_forward(att.data(), pre.data(), rows, T);
    softmax_backward(dpre.data(), datt.data(), att_in.data(), rows, T);

    std::string label = label_of("softmax", order, "rows %u T %u", rows, T);
    const char* l = label.c_str();
    auto ref = [T](const vector<double>& t) {
        return [&t, T](int i, int c) { return t[(size_t)i * T + c]; };
    };
    bool ok = compare(l, "att", rows, T, at(att, T), ref(att_ref), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= compare(l, "dpre", rows, T, at(dpre, T), ref(dpre_ref), ACT_TOL, ACT_TOL, ROW_FLOOR);
    return ok;
}

// gelu_fwd and gelu_bwd (the tanh approximation), per element (rows of one).
static bool check_gelu(unsigned n, emu::Order order) {
    Rng rng{(uint64_t)(n * 31 + 5)};
    vector<act_t> inp = random_act(rng, n, 2.0), dout = random_act(rng, n, 1.0);
    vector<double> out_ref(n), dinp_ref(n);
    const double s = std::sqrt(2.0 / M_PI), a = 0.044715;
    for (unsigned i = 0; i < n; ++i) {
        double x = dbl(inp[i]), u = s * (x + a * x * x * x), th = std::tanh(u);
        out_ref[i] = 0.5 * x * (1.0 + th);
        double du = s * (1.0 + 3.0 * a * x * x);
        dinp_ref[i] = (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du) * dbl(dout[i]);
    }
    vector<act_t> out(n, NAN_ACT), dinp(n, NAN_ACT);
    gelu_forward(out.data(), inp.data(), n);
    gelu_backward(dinp.data(), inp.data(), dout.data(), n);

    std::string label = label_of("gelu", order, "n %u", n);
    const char* l = label.c_str();
    auto ref = [](const vector<double>& t) { return [&t](int i, int) { return t[i]; }; };
    bool ok = compare(l, "out", n, 1, at(out, 1), ref(out_ref), ACT_TOL, ACT_TOL, ROW_FLOOR);
    ok &= compare(l, "dinp", n, 1, at(dinp, 1), ref(dinp_ref), ACT_TOL, ACT_TOL, ROW_FLOOR);
    return ok;
}

// sum_finish's order: thread t < 256 sums in[t], in[t + 256], .., then block_sum256's tree
// halving 256 → 1; the sum times scale.
static float sum_finish_replay(const vector<float>& in, float scale) {
    float sh[256];
    for (unsigned t = 0; t < 256; ++t) {
        sh[t] = 0.0f;
        for (size_t i = t; i < in.size(); i += 256) sh[t] += in[i];
    }
    for (unsigned o = 128; o > 0; o >>= 1)
        for (unsigned t = 0; t < o; ++t) sh[t] += sh[t + o];
    return sh[0] * scale;
}

// xent (grad: the logits' gradient of `grad` × the mean, or none) and the mean loss.
static bool check_xent(unsigned N, unsigned V, const float* grad, emu::Order order) {
    Rng rng{(uint64_t)(N * 65537 + V)};
    vector<act_t> logits = random_act(rng, (size_t)N * V, 2.0);
    vector<unsigned> targets = random_tokens(rng, N, V);
    vector<double> losses_ref(N), dlogits_ref((size_t)N * V);
    double loss_ref = 0;
    const double dscale = grad ? *grad / (double)N : 0.0;
    for (unsigned r = 0; r < N; ++r) {
        const size_t o = (size_t)r * V;
        double mx = -1e300, sum = 0;
        for (unsigned i = 0; i < V; ++i) mx = std::max(mx, dbl(logits[o + i]));
        for (unsigned i = 0; i < V; ++i) sum += std::exp(dbl(logits[o + i]) - mx);
        losses_ref[r] = std::log(sum) + mx - dbl(logits[o + targets[r]]);
        loss_ref += losses_ref[r] / N;
        for (unsigned i = 0; i < V; ++i)
            dlogits_ref[o + i] =
                (std::exp(dbl(logits[o + i]) - mx) / sum - (i == targets[r])) * dscale;
    }
    vector<act_t> dlogits((size_t)N * V, NAN_ACT);
    vector<float> losses(N, NAN_F), loss(1, NAN_F);
    cross_entropy(dlogits.data(), losses.data(), loss.data(), logits.data(), targets.data(), N,
                  V, grad);

    std::string label = grad ? label_of("xent", order, "N %u V %u grad %.2g", N, V, *grad)
                             : label_of("xent", order, "N %u V %u grad none", N, V);
    const char* l = label.c_str();
    auto ref = [](const vector<double>& t, int w) {
        return [&t, w](int i, int c) { return t[(size_t)i * w + c]; };
    };
    bool ok = compare(l, "losses", N, 1, at(losses, 1), ref(losses_ref, 1), F32_TOL, F32_TOL,
                      ROW_FLOOR);
    ok &= compare(l, "loss", 1, 1, at(loss, 1), [&](int, int) { return loss_ref; }, F32_TOL,
                  F32_TOL, ROW_FLOOR);
    ok &= exact(l, "loss", loss, vector<float>{sum_finish_replay(losses, 1.0f / (float)N)});
    if (grad) {
        ok &= compare(l, "dlogit", N, V, at(dlogits, V), ref(dlogits_ref, V), ACT_TOL, ACT_TOL,
                      ROW_FLOOR);
    } else {  // no gradient: dlogits untouched (still the poison)
        ok &= exact(l, "dlogit", dlogits, vector<act_t>((size_t)N * V, NAN_ACT));
    }
    return ok;
}

// sumsq_partial + sum_finish: the squared norm, and each block's partial sum.
static bool check_sumsq(unsigned n, emu::Order order) {
    Rng rng{(uint64_t)(n * 17 + 3)};
    vector<act_t> g = random_act(rng, n, 1.0);
    vector<double> part_ref(NORM_PARTS, 0.0);
    double total = 0;
    for (unsigned i = 0; i < n; ++i) {  // grid-stride: element i in block (i / 256) % parts
        double x = dbl(g[i]);
        part_ref[(i / 256) % NORM_PARTS] += x * x;
        total += x * x;
    }
    vector<float> partial(NORM_PARTS, NAN_F), out(1, NAN_F);
    sumsq(out.data(), partial.data(), g.data(), n);

    std::string label = label_of("sumsq", order, "n %u", n);
    const char* l = label.c_str();
    bool ok = compare(l, "part", NORM_PARTS, 1, at(partial, 1),
                      [&](int i, int) { return part_ref[i]; }, F32_TOL, F32_TOL, ROW_FLOOR);
    ok &= compare(l, "normsq", 1, 1, at(out, 1), [&](int, int) { return total; }, F32_TOL,
                  F32_TOL, ROW_FLOOR);
    ok &= exact(l, "normsq", out, vector<float>{sum_finish_replay(partial, 1.0f)});
    return ok;
}

// adamw (its gradient clipped when normsq exceeds max_norm²), then cast_weights.
static bool check_adamw(unsigned n, float normsq, emu::Order order) {
    Rng rng{(uint64_t)(n * 7 + (unsigned)normsq)};
    const AdamW hp{0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};  // optim::AdamW::default()
    const int step = 3;
    const float sched[4] = {6e-4f, 1.0f - std::pow(hp.beta1, (float)step),
                            1.0f - std::pow(hp.beta2, (float)step), 0.0f};
    vector<float> p0 = random_f32(rng, n, 0.02), m0 = random_f32(rng, n, 0.01), v0(n);
    for (auto& e : v0) e = (float)(std::pow(rng.normal() * 0.003, 2) + 1e-8);
    vector<act_t> g = random_act(rng, n, 0.05);
    vector<unsigned char> decay(n);
    for (auto& e : decay) e = rng.uniform() < 0.5;

    vector<double> dp_ref(n), m_ref(n), v_ref(n);
    const double lr = sched[0], coef = std::min(hp.max_norm / (std::sqrt(normsq) + 1e-6), 1.0);
    for (unsigned i = 0; i < n; ++i) {
        double gi = dbl(g[i]) * coef;
        m_ref[i] = hp.beta1 * (double)m0[i] + (1 - (double)hp.beta1) * gi;
        v_ref[i] = hp.beta2 * (double)v0[i] + (1 - (double)hp.beta2) * gi * gi;
        double mhat = m_ref[i] / sched[1], vhat = v_ref[i] / sched[2];
        double p = p0[i] * (1 - lr * (decay[i] ? hp.weight_decay : 0.0));
        dp_ref[i] = p - lr * mhat / (std::sqrt(vhat) + hp.eps) - p0[i];
    }
    vector<float> p = p0, m = m0, v = v0;
    vector<act_t> w(n, NAN_ACT), wc(n, NAN_ACT);
    adamw_step(p.data(), w.data(), g.data(), m.data(), v.data(), n, sched, &normsq,
               decay.data(), hp);
    cast(wc.data(), p0.data(), n);

    vector<act_t> w_rep(n), wc_rep(n);
    for (unsigned i = 0; i < n; ++i) {
        w_rep[i] = st(p[i]);
        wc_rep[i] = st(p0[i]);
    }
    std::string label = label_of("adamw", order, "n %u normsq %g", n, normsq);
    const char* l = label.c_str();
    auto ref = [](const vector<double>& t) { return [&t](int i, int) { return t[i]; }; };
    // The update p − p0 (exact in double from the floats), not p: p0 would hide its errors.
    auto dp = [&](int i, int) { return (double)p[i] - (double)p0[i]; };
    bool ok = compare(l, "dp", n, 1, dp, ref(dp_ref), DP_TOL, DP_TOL, ROW_FLOOR);
    ok &= compare(l, "m", n, 1, at(m, 1), ref(m_ref), F32_TOL, F32_TOL, ROW_FLOOR);
    ok &= compare(l, "v", n, 1, at(v, 1), ref(v_ref), F32_TOL, F32_TOL, ROW_FLOOR);
    ok &= exact(l, "w", w, w_rep);
    ok &= exact(l, "cast", wc, wc_rep);
    return ok;
}

// colsum_finish_qkv: each part's columns equal colsum_finish's of that part bit for bit.
static bool check_qkv_bias(unsigned Pq, unsigned Pkv, unsigned C, emu::Order order) {
    Rng rng{(uint64_t)(Pq * 131 + Pkv * 17 + C)};
    vector<float> partial((size_t)(Pq + 2 * Pkv) * C);
    for (auto& v : partial) v = (float)rng.normal();
    vector<act_t> db(3 * C, NAN_ACT), db_rep(3 * C, NAN_ACT);
    qkv_bias_finish(db.data(), partial.data(), Pq, Pkv, C);
    const size_t first[3] = {0, (size_t)Pq, (size_t)Pq + Pkv};
    for (unsigned part = 0; part < 3; ++part)
        launch(colsum_finish, blocks(C), dim3(128), db_rep.data() + part * C,
               (const float*)partial.data() + first[part] * C, part == 0 ? Pq : Pkv, C);
    char l[64];
    std::snprintf(l, sizeof l, "%s Pq %3u Pkv %3u C %3u %-7s", PRECISION, Pq, Pkv, C,
                  order == emu::Order::forward ? "forward" : "reverse");
    return exact(l, "qkv bias", db, db_rep);
}

int main() {
    int failed = 0, runs = 0;
    auto tally = [&](bool ok) {
        failed += !ok;
        ++runs;
    };
    const float half = 0.5f;
    for (auto order : {emu::Order::forward, emu::Order::reverse}) {
        emu::order = order;
        // (B, T, C, V): one token; C and T ragged; 600 rows in 3 chunks of the token
        // gradient, C past one block of 32 columns, the full vocabulary of 256.
        for (auto s : {std::array<unsigned, 4>{1, 1, 1, 1}, {2, 5, 3, 7}, {2, 300, 70, 256}})
            tally(check_encoder(s[0], s[1], s[2], s[3], order));
        // (N, C): one pair; rows and column pairs ragged; 300 rows in 38 chunks of 8 (the
        // last 4), 35 pairs; 2048 rows of the small model's 384 columns: 256 chunks of 8,
        // past colsum_finish's 128 threads; 8256 rows: 256 chunks of 33, the last 5 empty.
        for (auto s :
             {std::array<unsigned, 2>{1, 2}, {13, 66}, {300, 70}, {2048, 384}, {8256, 2}})
            tally(check_bias(s[0], s[1], order));
        // (Pq, Pkv, C): one row each; more k rows than q rows (64-key blocks); past 128.
        for (auto s : {std::array<unsigned, 3>{1, 1, 64}, {3, 6, 128}, {130, 130, 64}})
            tally(check_qkv_bias(s[0], s[1], s[2], order));
        for (auto s : {std::array<unsigned, 4>{1, 1, 1, 1}, {2, 7, 3, 5}, {2, 37, 2, 64}})
            tally(check_permute(s[0], s[1], s[2], s[3], order));
        // (sequences, T): one row; rows not a multiple of 8; rows past a lane's 32 keys.
        for (auto s : {std::array<unsigned, 2>{1, 1}, {3, 7}, {2, 33}, {3, 70}})
            tally(check_softmax(s[0], s[1], order));
        for (unsigned n : {1u, 1000u, 3001u}) tally(check_gelu(n, order));
        // (N, V): one logit; a row of 256 (one per thread); rows past 256 and 512.
        for (auto s : {std::array<unsigned, 2>{1, 1}, {3, 256}, {5, 300}, {2, 700}})
            for (const float* grad : {(const float*)nullptr, &half})
                tally(check_xent(s[0], s[1], grad, order));
        // Past one pass of the 1024 × 256 threads (the first 856 take two elements). Each
        // launch runs 1024 blocks: one shape keeps the program's time down.
        tally(check_sumsq(263000, order));
        // Unclipped (norm below max_norm) and clipped (norm 3).
        tally(check_adamw(1000, 0.5f, order));
        tally(check_adamw(3001, 9.0f, order));
    }
    std::printf("%s: %d of %d kernel/shape/order runs failed (%s)\n", failed ? "FAIL" : "PASS",
                failed, runs, PRECISION);
    return failed ? 1 : 0;
}
