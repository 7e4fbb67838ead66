// Checks cuda_emu.h itself on small kernels: shuffles, ldmatrix and mma.sync against
// the layouts of the PTX ISA written out independently here, the two warp and lane
// orders, the block and warp barriers, the two cp.async modes and wait_group, the
// poisoned shared memory; and, given the name of a faulty kernel as argument, that the
// runtime reports its deadlock (status 3).
//
//   c++ -std=c++20 -O2 -fno-strict-aliasing -I examples/train_gpt/emu
//     examples/train_gpt/emu/runtime_check.cpp -o /tmp/runtime_check
//   /tmp/runtime_check; /tmp/runtime_check divergent-shuffle   # exits 3
#define HOST_EMULATION
#include "cuda_emu.h"

#include <string>
#include <vector>

typedef __nv_bfloat16 bf;
static int failures = 0;
static void expect(bool ok, const char* what) {
    std::printf("%-68s %s\n", what, ok ? "ok" : "FAIL");
    failures += !ok;
}

__global__ void shuffle(int* out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 5);
}

// Without a barrier between the write and the read of another warp's slot.
__global__ void racy(int* out) {
    __shared__ int sh[64];
    sh[threadIdx.x] = threadIdx.x;
    out[threadIdx.x] = sh[threadIdx.x ^ 32];
}
__global__ void synced(int* out) {
    __shared__ int sh[64];
    sh[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = sh[threadIdx.x ^ 32];
}

// Every lane reads a shared value that lane 0 then overwrites, without and with a warp
// barrier between the reads and the write.
__global__ void warp_racy(int* out) {
    __shared__ int sh;
    if (threadIdx.x == 0) sh = 7;
    __syncthreads();
    int v = sh;
    if (threadIdx.x == 0) sh = v + 1;
    out[threadIdx.x] = v;
}
__global__ void warp_synced(int* out) {
    __shared__ int sh;
    if (threadIdx.x == 0) sh = 7;
    __syncthreads();
    int v = sh;
    __syncwarp();
    if (threadIdx.x == 0) sh = v + 1;
    out[threadIdx.x] = v;
}

// Thread 0: two groups of one copy each, and a zero-filled copy; what it reads when.
__global__ void copies(unsigned* out, const bf* src) {
    __shared__ __align__(16) bf s[3][8];
    if (threadIdx.x != 0) return;
    auto word = [&](int i) { return *(const unsigned*)&s[i][0]; };
    cp_async16(s[0], src, 16);
    out[0] = word(0);  // before the commit
    cp_commit();
    cp_async16(s[1], src + 8, 16);
    cp_commit();
    cp_async16(s[2], src, 0);  // open group: zero fill
    cp_wait(1);
    out[1] = word(0);  // the first group: complete
    out[2] = word(1);  // the second: maybe not
    cp_wait(0);
    out[3] = word(1);
    out[4] = word(2);  // uncommitted: maybe not
}

// One warp: ldmatrix (.trans) of four 8×8 matrices at rows 8m.. of a 32 × 8 tile.
__global__ void ldmatrix_kernel(unsigned* out, const bf* tile, bool trans) {
    __shared__ __align__(16) bf s[32 * 8];
    for (int i = threadIdx.x; i < 32 * 8; i += 32) s[i] = tile[i];
    __syncthreads();
    unsigned r[4];
    if (trans) ldsm_t(r, s + threadIdx.x * 8);
    else ldsm(r, s + threadIdx.x * 8);
    for (int m = 0; m < 4; ++m) out[threadIdx.x * 4 + m] = r[m];
}

__global__ void mma_kernel(float* out, const unsigned* a, const unsigned* b) {
    int l = threadIdx.x;
    float c[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    mma(c, a + 4 * l, b[2 * l], b[2 * l + 1]);
    for (int e = 0; e < 4; ++e) out[4 * l + e] = c[e];
}

// Faulty kernels: each must end the process with a deadlock report.
__global__ void divergent_shuffle(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
__global__ void different_collectives(int* out) {
    int v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncthreads();
    out[threadIdx.x] = v;
}
__global__ void mixed_collectives(unsigned* out, const bf* p) {
    unsigned r[4] = {};
    if (threadIdx.x < 16) r[0] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
    else ldsm(r, p);
    out[threadIdx.x] = r[0];
}
__global__ void barrier_after_exit(int* out) {
    if (threadIdx.x == 40) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

static unsigned pack(float lo, float hi) {
    return __float2bfloat16(lo).bits | (unsigned)__float2bfloat16(hi).bits << 16;
}

static void check_collectives() {
    std::vector<int> out(64);
    launch(shuffle, dim3(1), dim3(64), out.data());
    bool ok = true;
    for (int t = 0; t < 64; ++t) ok &= out[t] == (t ^ 5);
    expect(ok, "__shfl_xor_sync: lane ^ 5 of the same warp");

    std::vector<bf> tile(32 * 8);
    for (int i = 0; i < 32 * 8; ++i) tile[i] = __float2bfloat16((float)i);
    std::vector<unsigned> r(32 * 4);
    for (bool trans : {false, true}) {
        launch(ldmatrix_kernel, dim3(1), dim3(32), r.data(), (const bf*)tile.data(), trans);
        ok = true;
        for (int l = 0; l < 32; ++l)
            for (int m = 0; m < 4; ++m) {
                int g = l / 4, q = l % 4;  // matrix m: rows 8m .. 8m+7 of the tile
                int lo = trans ? (8 * m + 2 * q) * 8 + g : (8 * m + g) * 8 + 2 * q;
                int hi = trans ? lo + 8 : lo + 1;
                ok &= r[4 * l + m] == pack((float)lo, (float)hi);
            }
        expect(ok, trans ? "ldmatrix.x4.trans: rows 2q, 2q+1 of column g"
                         : "ldmatrix.x4: row g, columns 2q, 2q+1");
    }

    // A(i, k) = i - k, B(k, n) = k + 2n: small integers, exact in bf16 and f32.
    std::vector<unsigned> a(32 * 4), b(32 * 2);
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, q = l % 4;
        auto A = [](int i, int k) { return (float)(i - k); };
        auto B = [](int k, int n) { return (float)(k + 2 * n); };
        a[4 * l + 0] = pack(A(g, 2 * q), A(g, 2 * q + 1));
        a[4 * l + 1] = pack(A(g + 8, 2 * q), A(g + 8, 2 * q + 1));
        a[4 * l + 2] = pack(A(g, 2 * q + 8), A(g, 2 * q + 9));
        a[4 * l + 3] = pack(A(g + 8, 2 * q + 8), A(g + 8, 2 * q + 9));
        b[2 * l + 0] = pack(B(2 * q, g), B(2 * q + 1, g));
        b[2 * l + 1] = pack(B(2 * q + 8, g), B(2 * q + 9, g));
    }
    std::vector<float> c(32 * 4);
    launch(mma_kernel, dim3(1), dim3(32), c.data(), (const unsigned*)a.data(),
           (const unsigned*)b.data());
    ok = true;
    for (int l = 0; l < 32; ++l)
        for (int e = 0; e < 4; ++e) {
            int i = l / 4 + 8 * (e / 2), n = 2 * (l % 4) + e % 2;
            float want = (float)(e + 1);
            for (int k = 0; k < 16; ++k) want += (float)(i - k) * (float)(k + 2 * n);
            ok &= c[4 * l + e] == want;
        }
    expect(ok, "mma.m16n8k16: C += A·B in the PTX ISA's fragment layouts");
}

static void check_modes() {
    std::vector<int> out(64);
    for (auto order : {emu::Order::forward, emu::Order::reverse}) {
        emu::order = order;
        bool fwd = order == emu::Order::forward;
        launch(racy, dim3(1), dim3(64), out.data());
        // The warp that runs first reads the other's slot before it is written (poison).
        bool ok = out[fwd ? 0 : 32] == -1 && out[fwd ? 32 : 0] == (fwd ? 0 : 32);
        expect(ok, fwd ? "forward order: warp 0 runs to the barrier first"
                       : "reverse order: the last warp runs to the barrier first");
        launch(synced, dim3(1), dim3(64), out.data());
        ok = true;
        for (int t = 0; t < 64; ++t) ok &= out[t] == (t ^ 32);
        expect(ok, "__syncthreads orders the writes before the reads");
        launch(warp_racy, dim3(1), dim3(32), out.data());
        // Forward, lane 0 writes before the other lanes read; reverse, it runs last.
        ok = out[0] == 7;
        for (int t = 1; t < 32; ++t) ok &= out[t] == (fwd ? 8 : 7);
        expect(ok, fwd ? "forward order: lane 0 runs to the next sync point first"
                       : "reverse order: lane 31 runs to the next sync point first");
        launch(warp_synced, dim3(1), dim3(32), out.data());
        ok = true;
        for (int t = 0; t < 32; ++t) ok &= out[t] == 7;
        expect(ok, "__syncwarp orders the warp's reads before lane 0's write");
    }
    emu::order = emu::Order::forward;

    std::vector<bf> src(16);
    for (int i = 0; i < 16; ++i) src[i] = __float2bfloat16((float)(i + 1));
    const unsigned first = pack(1, 2), second = pack(9, 10), poison = 0xffffffffu;
    std::vector<unsigned> o(5);
    emu::copies = emu::Copies::deferred;
    launch(copies, dim3(1), dim3(32), o.data(), (const bf*)src.data());
    expect(o[0] == poison && o[1] == first && o[2] == poison && o[3] == second &&
               o[4] == poison,
           "deferred cp.async: lands at the wait_group that completes its group");
    emu::copies = emu::Copies::immediate;
    launch(copies, dim3(1), dim3(32), o.data(), (const bf*)src.data());
    expect(o[0] == first && o[1] == first && o[2] == second && o[3] == second && o[4] == 0,
           "immediate cp.async: lands when issued; 0 bytes fill zeros");
}

int main(int argc, char** argv) {
    std::vector<unsigned> out(64);
    std::vector<bf> tile(64 * 8);
    if (argc > 1) {
        std::string which = argv[1];
        int* o = (int*)out.data();
        if (which == "divergent-shuffle") launch(divergent_shuffle, dim3(1), dim3(32), o);
        if (which == "different-collectives")
            launch(different_collectives, dim3(1), dim3(32), o);
        if (which == "mixed-collectives")
            launch(mixed_collectives, dim3(1), dim3(32), out.data(), (const bf*)tile.data());
        if (which == "barrier-after-exit") launch(barrier_after_exit, dim3(1), dim3(64), o);
        std::printf("%s: no deadlock reported\n", argv[1]);
        return 1;
    }
    check_collectives();
    check_modes();
    std::printf("%s: %d checks failed\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
