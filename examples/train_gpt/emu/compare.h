// Comparison of a kernel's output with a double-precision reference, for the emulator's
// check programs: one printed line per tensor, true when it is within tolerance.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

// Rows of `width` elements, element (i, c) of the kernel's output `got(i, c)` and of the
// reference `want(i, c)`. MAX: the largest |got − want| over the tensor / the
// reference's largest |value|. ROW: per row, ‖got − want‖₂ / max(‖want row‖₂,
// floor_frac · the tensor's RMS row norm): the floor keeps rows whose reference nearly
// vanishes from amplifying absolute rounding noise. A reference that is zero everywhere
// (an exact cancellation, such as the gradient of a softmax over one element) leaves
// nothing to be relative to: its MAX and ROW are absolute errors (the checks' inputs are
// of unit scale). A non-finite output fails.
template <class Got, class Want>
bool compare(const char* label, const char* name, int rows, int width, Got got, Want want,
             double max_tol, double row_tol, double floor_frac) {
    double refmax = 0, errmax = 0, norms = 0, worst_row = 0;
    for (int i = 0; i < rows; ++i)
        for (int c = 0; c < width; ++c) {
            double w = want(i, c);
            refmax = std::max(refmax, std::fabs(w));
            norms += w * w;
        }
    const double unit = refmax > 0 ? 0.0 : 1.0;  // an all-zero reference: absolute errors
    double floor = std::max(floor_frac * std::sqrt(norms / std::max(rows, 1)), unit);
    bool finite = true;
    for (int i = 0; i < rows; ++i) {
        double e2 = 0, n2 = 0;
        for (int c = 0; c < width; ++c) {
            double g = got(i, c), w = want(i, c);
            if (!std::isfinite(g)) finite = false;
            errmax = std::max(errmax, std::fabs(g - w));
            e2 += (g - w) * (g - w);
            n2 += w * w;
        }
        double norm = std::max({std::sqrt(n2), floor, 1e-30});
        worst_row = std::max(worst_row, std::sqrt(e2) / norm);
    }
    double rel = errmax / std::max(refmax, unit);
    bool ok = finite && rel <= max_tol && worst_row <= row_tol;
    std::printf("%s %-5s max %.2e (tol %.0e)  row %.2e (tol %.0e)%s  %s\n", label, name, rel,
                max_tol, worst_row, row_tol, finite ? "" : "  non-finite", ok ? "ok" : "FAIL");
    return ok;
}

// A deterministic generator of the checks' inputs.
struct Rng {
    uint64_t s;
    double uniform() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(s >> 11) / 9007199254740992.0;
    }
    double normal() {  // Irwin–Hall: close enough to a unit normal
        double t = 0;
        for (int i = 0; i < 12; ++i) t += uniform();
        return t - 6.0;
    }
};
