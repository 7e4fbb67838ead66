// The attention checks' shared part (attention_check.cpp, attention_tiled_check.cpp): their
// inputs, causal softmax attention and its gradients in double precision from the inputs
// as the kernels see them (rounded to their activation type), and the comparison of a
// kernel's outputs with it, one printed line per tensor.
//
// Layouts as the kernels': qkv and dqkv (B, T, 3, NH, hd), y and dy (B, T, NH, hd), lse and
// D (B, NH, T); scale 1/√hd.
#pragma once
#include "compare.h"

#include <cmath>
#include <cstdio>
#include <vector>

struct AttnInputs {
    std::vector<double> qkv, dy;
};

// Unit normals (q at twice the scale of k: sharper attention), one generator a shape.
inline AttnInputs attention_inputs(int B, int T, int NH, int hd) {
    const int C = NH * hd;
    const size_t n = (size_t)B * T * C;
    Rng rng{(uint64_t)(B * 1000003 + T * 1009 + NH)};
    AttnInputs in{std::vector<double>(3 * n), std::vector<double>(n)};
    for (size_t i = 0; i < 3 * n; ++i) {
        bool is_q = (i / C) % 3 == 0;
        in.qkv[i] = rng.normal() * (is_q ? 2.0 : 1.0);
    }
    for (auto& v : in.dy) v = rng.normal();
    return in;
}

struct AttnRef {
    std::vector<double> y, lse, D, dqkv;
};

// y = softmax(scale·q·kᵀ, causal)·v, lse (the log of each row's softmax denominator),
// D = rowsum(dy ⊙ y), and dq, dk, dv into dqkv.
inline AttnRef attention_reference(const std::vector<double>& qkv,
                                   const std::vector<double>& dy, int B, int T, int NH,
                                   int hd) {
    const int C = NH * hd;
    const double scale = 1.0 / std::sqrt((double)hd);
    AttnRef r{std::vector<double>((size_t)B * T * C), std::vector<double>((size_t)B * NH * T),
              std::vector<double>((size_t)B * NH * T),
              std::vector<double>((size_t)3 * B * T * C, 0.0)};
    auto at = [&](int b, int t, int which, int h) {
        return ((size_t)(b * T + t) * 3 + which) * C + h * hd;
    };
    std::vector<double> p(T);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                const double* q = &qkv[at(b, t, 0, h)];
                double mx = -1e300;
                for (int j = 0; j <= t; ++j) {
                    const double* k = &qkv[at(b, j, 1, h)];
                    double s = 0;
                    for (int c = 0; c < hd; ++c) s += q[c] * k[c];
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
                for (int j = 0; j <= t; ++j) p[j] /= sum;
                const size_t stat = ((size_t)b * NH + h) * T + t;
                r.lse[stat] = mx + std::log(sum);
                double* yr = &r.y[(size_t)(b * T + t) * C + h * hd];
                for (int j = 0; j <= t; ++j)
                    for (int c = 0; c < hd; ++c) yr[c] += p[j] * qkv[at(b, j, 2, h) + c];
                const double* g = &dy[(size_t)(b * T + t) * C + h * hd];
                double D = 0;
                for (int c = 0; c < hd; ++c) D += g[c] * yr[c];
                r.D[stat] = D;
                for (int j = 0; j <= t; ++j) {
                    double s = 0;
                    for (int c = 0; c < hd; ++c) s += g[c] * qkv[at(b, j, 2, h) + c];
                    double ds = p[j] * (s - D) * scale;
                    double* dq = &r.dqkv[at(b, t, 0, h)];
                    double* dk = &r.dqkv[at(b, j, 1, h)];
                    double* dv = &r.dqkv[at(b, j, 2, h)];
                    for (int c = 0; c < hd; ++c) {
                        dq[c] += ds * qkv[at(b, j, 1, h) + c];
                        dk[c] += ds * q[c];
                        dv[c] += p[j] * g[c];
                    }
                }
            }
    return r;
}

// Tolerances of compare_attention: MAX and ROW (per hd-element row, with ROW_FLOOR) as
// compare.h defines them, ROW for y and dv and for dq and dk apart; lse absolute.
struct AttnTol {
    double max, row_y_dv, row_dq_dk, floor, lse;
};

// Compares y, dq, dk, dv (rows (b, t, h)) and lse with the reference: `y(i)`, `dqkv(i)`
// and `lse(i)` are the kernel's values at flat index i, as doubles.
template <class Y, class G, class L>
bool compare_attention(const char* label, const AttnRef& ref, int B, int T, int NH, int hd,
                       Y y, G dqkv, L lse, const AttnTol& tol) {
    const int C = NH * hd;
    auto yrow = [=](int i) { return (size_t)i * hd; };
    auto part = [=](int which) {
        return [=](int i) {
            int h = i % NH, bt = i / NH;
            return ((size_t)bt * 3 + which) * C + (size_t)h * hd;
        };
    };
    const int rows = B * T * NH;
    auto ref_of = [](const std::vector<double>& t, auto off) {
        return [&t, off](int i, int c) { return t[off(i) + c]; };
    };
    bool ok = compare(label, "y", rows, hd, [&](int i, int c) { return y(yrow(i) + c); },
                      ref_of(ref.y, yrow), tol.max, tol.row_y_dv, tol.floor);
    const char* names[3] = {"dq", "dk", "dv"};
    const double row_tols[3] = {tol.row_dq_dk, tol.row_dq_dk, tol.row_y_dv};
    for (int which = 0; which < 3; ++which) {
        auto off = part(which);
        ok &= compare(label, names[which], rows, hd,
                      [&](int i, int c) { return dqkv(off(i) + c); }, ref_of(ref.dqkv, off),
                      tol.max, row_tols[which], tol.floor);
    }
    double lerr = 0;
    bool lfinite = true;
    for (size_t i = 0; i < ref.lse.size(); ++i) {
        double v = lse(i);
        if (!std::isfinite(v)) lfinite = false;
        lerr = std::max(lerr, std::fabs(v - ref.lse[i]));
    }
    bool lok = lfinite && lerr <= tol.lse;
    std::printf("%s lse abs %.2e (tol %.0e)%s  %s\n", label, lerr, tol.lse,
                lfinite ? "" : "  non-finite", lok ? "ok" : "FAIL");
    return ok && lok;
}
