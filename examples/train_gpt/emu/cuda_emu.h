// A CUDA device runtime on the host, for checking train_gpt's kernels without a GPU.
//
// Who it is for: tests that compile a kernel source (.cu) unchanged with a host C++
// compiler (g++ or clang++, -std=c++20, -fno-strict-aliasing for the kernels' type
// punning, this directory on the include path for <cuda_bf16.h>, HOST_EMULATION defined)
// and run its kernels on small shapes against a reference. The source keeps its PTX
// (inline asm) in a section guarded by `#ifndef HOST_EMULATION`; the end of this header
// defines those wrappers on the host: `mma`, `ex2`, `ldsm`, `ldsm_t`, `cp_async16`,
// `cp_commit`, `cp_wait`, with the semantics their comments in the kernel sources state.
//
// The check programs beside it, each comparing a source's kernels (launched as the Rust
// wrappers launch them) with a double-precision reference: attention_check.cpp the bf16
// kernels of attention_mma.cu; attention_tiled_check.cpp the fp32 kernels of attention.cu;
// built with fp32 and with bf16 activations, layernorm_check.cpp the layer norms of
// kernels.cu and kernels_check.cpp the rest of it (encoder_fwd, encoder_bwd_wpe,
// encoder_bwd_wte_partial/_finish, colsum_partial/_finish/_finish_qkv, bias_add,
// permute_qkv, unpermute, softmax_causal_fwd/_bwd, gelu_fwd/_bwd, xent, sum_finish,
// sumsq_partial, adamw, cast_weights); runtime_check.cpp this header itself. compare.h and
// attention_ref.h hold their shared comparison and attention reference.
//
// Use: set `emu::order` and `emu::copies`, then `launch(kernel, dim3(gx, gy),
// dim3(bx, by), args...)` runs the whole grid before it returns; "device" buffers are host
// memory (std::vector), read and written by the kernels directly.
//
// What it models:
// - Every CUDA thread of a block is a fiber (ucontext, one OS thread, 64 KiB stacks with
//   a guard page). Blocks run one after another, so a `__shared__` array can be a function
//   `static`: one copy, which only the block running now uses. The statics are placed in
//   one linker section, filled with 0xff bytes (NaN as bf16 and f32) before each block, so
//   a read of shared memory no thread of the block wrote shows up as NaN.
// - A deterministic scheduler. A fiber runs until a sync point: `__syncthreads()` (block
//   barrier) or a warp collective (`__shfl_xor_sync`, `__syncwarp`, and the kernels'
//   ldmatrix and mma.sync). A collective publishes each lane's operands (pointers into the lanes'
//   stacks) in its warp's exchange and waits at a warp barrier; when the last lane of the
//   warp arrives, every lane's outputs are computed from all lanes' inputs before any lane
//   resumes (what each lane computing its own outputs between two warp barriers gives,
//   with one fiber switch a lane instead of two). Between barriers the fibers run in a
//   fixed order, `Order::forward` (warp 0 first, lane 0 first) or `Order::reverse`, and
//   one warp runs as far as it can (up to a `__syncthreads`) before the next one starts:
//   the largest skew between warps, so a missing `__syncthreads` changes results in one
//   order or the other.
// - Deadlocks end the process (status 3) with a message: lanes of one warp at different
//   collectives, a block barrier that some thread exits without reaching, a warp
//   collective some lane never reaches. So do unaligned ldmatrix and cp.async addresses.
// - cp.async (16 bytes, zero fill) in two modes: `Copies::immediate` copies when issued
//   (exposes overwriting a buffer other warps still read); `Copies::deferred` copies when
//   a `cp.async.wait_group N` completes the copy's group: every committed group but the
//   newest N; copies not yet committed form the open group, which no wait completes (a
//   read before the wait sees the old contents). A correct kernel gives the same results
//   in both modes.
//
// What it does not model: timing, real concurrency (no data race is detected as such; a
// race shows only if the order of warps changes a result), shared-memory bank conflicts,
// memory fences and the memory model (a global or shared store is visible at once),
// registers and occupancy, __launch_bounds__, dynamic (extern) shared memory, blocks
// running side by side (inter-block communication), the error of the device's
// approximate instructions (ex2.approx is exp2f here; expf, tanhf and the other math
// functions are the host's), wmma (nvcuda::wmma fragments: attention.cu's bf16 path
// does not compile here), out-of-bounds accesses (use
// -fsanitize=address on the host for those), warps that diverge inside a collective
// (every lane of the warp must take part; a partial mask ends the run).
#pragma once
#include <ucontext.h>
#include <sys/mman.h>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <vector>
#include "cuda_bf16.h"

// ---- CUDA C++ keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((section("emu_shared")))

struct uint3 {
    unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// The running fiber's indices (the scheduler sets them before resuming a fiber).
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __int_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { return __int_as_float(v); }
inline int __float_as_int(float f) { int v; std::memcpy(&v, &f, 4); return v; }
inline unsigned __float_as_uint(float f) { unsigned v; std::memcpy(&v, &f, 4); return v; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

namespace emu {

enum class Order { forward, reverse };
enum class Copies { immediate, deferred };
// The scheduling mode of the next launches.
inline Order order = Order::forward;
inline Copies copies = Copies::immediate;

// Reports a fault of the kernel (or of its launch) and ends the process with status 3.
[[noreturn]] inline void fail(const char* what, const char* detail = "") {
    std::fflush(stdout);
    std::fprintf(stderr, "cuda_emu: block (%u,%u) thread (%u,%u): %s%s\n", blockIdx.x,
                 blockIdx.y, threadIdx.x, threadIdx.y, what, detail);
    std::fflush(stderr);
    std::_Exit(3);
}

enum class State { run, warp, block, done };
struct Copy {
    void* dst;
    const void* src;
    int bytes;
    unsigned group;
};
struct Fiber {
    ucontext_t ctx;
    State state = State::run;
    const char* what = "";  // the collective it waits at
    void* ops[8] = {};      // its operands there
    std::vector<Copy> pending;
    unsigned commits = 0;   // groups committed so far; the open group's number
};
// A warp's results are computed from all its lanes' operands by one of these.
using Collective = void (*)(Fiber* const* lanes, int n);

struct Block {
    std::vector<Fiber> fibers;
    std::vector<int> arrived;     // per warp: lanes waiting at a collective
    std::vector<Collective> fn;   // per warp: the collective of its first arrived lane
    std::vector<const char*> what;  // and its name
    int current = -1;
    ucontext_t sched;
};
inline Block block;

inline Fiber& self() { return block.fibers[block.current]; }

// Waits (yields to the scheduler) in the given state.
inline void yield(State s) {
    Fiber& f = self();
    f.state = s;
    swapcontext(&f.ctx, &block.sched);
}

// A warp collective: publishes `ops` and resumes when `fn` has given every lane its result.
inline void collective(Collective fn, const char* what, std::initializer_list<void*> ops) {
    Fiber& f = self();
    int i = 0;
    for (void* p : ops) f.ops[i++] = p;
    f.what = what;
    int w = block.current / 32;
    if (block.arrived[w] == 0) {
        block.fn[w] = fn;
        block.what[w] = what;
    } else if (block.fn[w] != fn) {
        std::fprintf(stderr, "cuda_emu: other lanes of the warp wait at %s\n", block.what[w]);
        fail("deadlock: lanes of a warp at different collectives; this one at ", what);
    }
    ++block.arrived[w];
    yield(State::warp);
}

inline void complete_copies(Fiber& f, unsigned below) {
    std::vector<Copy> keep;
    for (const Copy& c : f.pending) {
        if (c.group < below) {
            if (c.bytes) std::memcpy(c.dst, c.src, 16);
            else std::memset(c.dst, 0, 16);
        } else {
            keep.push_back(c);
        }
    }
    f.pending.swap(keep);
}

inline const std::function<void()>* body;

inline void entry() {
    (*body)();
    Fiber& f = self();
    complete_copies(f, ~0u);  // copies never waited for land at the end
    f.state = State::done;
    swapcontext(&f.ctx, &block.sched);
}

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

// The indices of linear thread t (threads x-major; warp = t / 32, as on the device).
inline void set_thread(int t) {
    threadIdx.x = t % blockDim.x;
    threadIdx.y = t / blockDim.x;
}

// Runs one block of `threads` fibers to the end.
inline void run_block(int threads, char* stacks, size_t stack) {
    if (__start_emu_shared)
        std::memset(__start_emu_shared, 0xff, __stop_emu_shared - __start_emu_shared);
    int warps = (threads + 31) / 32;
    block.fibers.assign(threads, Fiber{});
    block.arrived.assign(warps, 0);
    block.fn.assign(warps, nullptr);
    block.what.assign(warps, "");
    for (int t = 0; t < threads; ++t) {
        Fiber& f = block.fibers[t];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks + t * stack + 4096;
        f.ctx.uc_stack.ss_size = stack - 4096;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
    }
    auto pos = [&](int i) { return order == Order::forward ? i : threads - 1 - i; };
    int cursor = 0;  // every fiber before it (in run order) waits or is done
    for (;;) {
        while (cursor < threads && block.fibers[pos(cursor)].state != State::run) ++cursor;
        if (cursor < threads) {
            int t = pos(cursor);
            block.current = t;
            set_thread(t);
            swapcontext(&block.sched, &block.fibers[t].ctx);
            int w = t / 32, n = std::min(32, threads - 32 * w);
            if (block.fibers[t].state == State::warp && block.arrived[w] == n) {
                Fiber* lanes[32];
                for (int l = 0; l < n; ++l) lanes[l] = &block.fibers[32 * w + l];
                block.fn[w](lanes, n);
                for (int l = 0; l < n; ++l) lanes[l]->state = State::run;
                block.arrived[w] = 0;
                int first = order == Order::forward ? 32 * w : threads - 32 * w - n;
                cursor = std::min(cursor, first);
            }
            continue;
        }
        int done = 0, at_block = 0;
        for (const Fiber& f : block.fibers) {
            done += f.state == State::done;
            at_block += f.state == State::block;
        }
        if (done == threads) return;
        for (int t = 0; t < threads; ++t) {
            set_thread(t);
            const Fiber& f = block.fibers[t];
            if (f.state == State::warp)
                fail("deadlock: waits at a warp collective that a lane of its warp "
                     "does not reach (the lane exited or waits at __syncthreads): ", f.what);
            if (f.state == State::block && done)
                fail("deadlock: waits at __syncthreads, which exited threads never reach");
        }
        for (Fiber& f : block.fibers) f.state = State::run;  // every thread at the barrier
        cursor = 0;
    }
}

}  // namespace emu

// Runs `kernel(args...)` on a grid of `grid.x · grid.y` blocks of `threads.x · threads.y`
// threads.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 threads, A... args) {
    const unsigned n = threads.x * threads.y;
    if (threads.z != 1 || grid.z != 1 || n == 0 || n > 1024 || grid.x == 0 || grid.y == 0)
        emu::fail("launch: blocks of 1..1024 threads in x and y, grids in x and y");
    const size_t stack = 64 << 10;
    size_t bytes = stack * n;
    char* stacks = (char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) emu::fail("launch: no memory for the fibers' stacks");
    for (unsigned t = 0; t < n; ++t)  // stacks grow down: a guard page at the bottom
        mprotect(stacks + t * stack, 4096, PROT_NONE);
    std::function<void()> body = [&] { kernel(args...); };
    emu::body = &body;
    gridDim = grid;
    blockDim = threads;
    for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx.x = x;
            blockIdx.y = y;
            emu::run_block((int)n, stacks, stack);
        }
    munmap(stacks, bytes);
}

// ---- Warp intrinsics ----
inline void __syncthreads() { emu::yield(emu::State::block); }

namespace emu {
template <class T>
void shfl_xor(Fiber* const* lanes, int n) {
    T v[32];
    for (int l = 0; l < n; ++l) v[l] = *(T*)lanes[l]->ops[0];
    for (int l = 0; l < n; ++l) {
        int src = l ^ *(int*)lanes[l]->ops[2];
        if (*(unsigned*)lanes[l]->ops[3] != 0xffffffffu || n != 32 || src >= n)
            fail("__shfl_xor_sync: only the full mask of a whole warp is modelled");
        *(T*)lanes[l]->ops[1] = v[src];
    }
}
}  // namespace emu
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    T out;
    emu::collective(emu::shfl_xor<T>, "__shfl_xor_sync", {&v, &out, &lane_mask, &mask});
    return out;
}
namespace emu {
// A warp barrier: no lane resumes before every lane has arrived.
inline void syncwarp(Fiber* const* lanes, int n) {
    for (int l = 0; l < n; ++l)
        if (*(unsigned*)lanes[l]->ops[0] != 0xffffffffu || n != 32)
            fail("__syncwarp: only the full mask of a whole warp is modelled");
}
}  // namespace emu
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::collective(emu::syncwarp, "__syncwarp", {&mask});
}

// ---- The PTX wrappers of the kernel sources (their `#ifndef HOST_EMULATION` sections) ----
namespace emu {
// ldmatrix.x4: lanes 8m .. 8m+7 give matrix m's row addresses; r[m] of lane (g, q) = row g,
// columns 2q, 2q+1 of matrix m (or, transposed, rows 2q and 2q+1 of column g).
template <bool T>
void ldmatrix(Fiber* const* lanes, int n) {
    if (n != 32) fail("ldmatrix: needs a whole warp of 32 lanes");
    const uint16_t* row[32];
    for (int l = 0; l < 32; ++l) {
        row[l] = *(const uint16_t* const*)lanes[l]->ops[0];
        if ((uintptr_t)row[l] % 16) fail("ldmatrix: a row address is not 16-byte aligned");
    }
    for (int l = 0; l < 32; ++l) {
        unsigned* r = (unsigned*)lanes[l]->ops[1];
        int g = l / 4, q = l % 4;
        for (int m = 0; m < 4; ++m) {
            uint16_t lo = T ? row[8 * m + 2 * q][g] : row[8 * m + g][2 * q];
            uint16_t hi = T ? row[8 * m + 2 * q + 1][g] : row[8 * m + g][2 * q + 1];
            r[m] = lo | (unsigned)hi << 16;
        }
    }
}
inline float bf_half(unsigned reg, int h) {
    __nv_bfloat16 v;
    v.bits = (uint16_t)(reg >> (16 * h));
    return __bfloat162float(v);
}
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, the PTX ISA's fragment layouts (see the
// kernel source's header): operands a[4], b0, b1 and c[4] of every lane.
inline void mma16816(Fiber* const* lanes, int n) {
    if (n != 32) fail("mma.sync: needs a whole warp of 32 lanes");
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, q = l % 4;
        const unsigned* a = (const unsigned*)lanes[l]->ops[1];
        unsigned b0 = *(unsigned*)lanes[l]->ops[2], b1 = *(unsigned*)lanes[l]->ops[3];
        for (int h = 0; h < 2; ++h) {
            A[g][2 * q + h] = bf_half(a[0], h);
            A[g + 8][2 * q + h] = bf_half(a[1], h);
            A[g][2 * q + 8 + h] = bf_half(a[2], h);
            A[g + 8][2 * q + 8 + h] = bf_half(a[3], h);
            B[2 * q + h][g] = bf_half(b0, h);
            B[2 * q + 8 + h][g] = bf_half(b1, h);
        }
    }
    for (int l = 0; l < 32; ++l) {
        float* c = (float*)lanes[l]->ops[0];
        int g = l / 4, q = l % 4;
        for (int e = 0; e < 4; ++e) {
            int row = g + 8 * (e / 2), col = 2 * q + e % 2;
            float s = 0.0f;  // bf16 products are exact in f32; f32 sums
            for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
            c[e] += s;
        }
    }
}
}  // namespace emu

inline void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    emu::collective(emu::mma16816, "mma.sync", {c, (void*)a, &b0, &b1});
}
// ex2.approx.ftz: exp2f, with subnormal results flushed to zero (2^-inf = 0).
inline float ex2(float x) {
    float y = std::exp2(x);
    return std::fabs(y) < FLT_MIN ? 0.0f : y;
}
inline void ldsm(unsigned* r, const __nv_bfloat16* p) {
    emu::collective(emu::ldmatrix<false>, "ldmatrix", {&p, r});
}
inline void ldsm_t(unsigned* r, const __nv_bfloat16* p) {
    emu::collective(emu::ldmatrix<true>, "ldmatrix.trans", {&p, r});
}
// cp.async 16 bytes (`bytes` 0: zero fill) in the current group of the calling thread.
inline void cp_async16(__nv_bfloat16* dst, const __nv_bfloat16* src, int bytes) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) emu::fail("cp.async: unaligned address");
    emu::Fiber& f = emu::self();
    f.pending.push_back({dst, src, bytes, f.commits});
    if (emu::copies == emu::Copies::immediate) emu::complete_copies(f, ~0u);
}
inline void cp_commit() { ++emu::self().commits; }
// cp.async.wait_group n: every committed group but the newest n is complete.
inline void cp_wait(int n) {
    emu::Fiber& f = emu::self();
    emu::complete_copies(f, f.commits >= (unsigned)n ? f.commits - n : 0);
}
