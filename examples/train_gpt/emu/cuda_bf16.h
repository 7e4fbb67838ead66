// The subset of CUDA's <cuda_bf16.h> that train_gpt's kernels use, for compiling them on
// the host with cuda_emu.h (HOST_EMULATION). bf16 is the upper half of an IEEE binary32:
// a 16-bit struct; __nv_bfloat162 is two of them, `x` (the low 16 bits of the 32-bit
// pair) first. Conversions from float round to nearest, ties to even, and keep NaN a
// (quiet) NaN, as the device's cvt.rn.bf16.f32 does.
#pragma once
#include <cstdint>
#include <cstring>

// The vector types the real header brings in (vector_types.h), as far as used.
struct float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;  // trivial: __shared__ arrays of it are plain statics
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;  // x: the low half
    __nv_bfloat162() = default;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4, "bf16 layout");

inline uint16_t emu_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (inf stays inf)
    return (uint16_t)(u >> 16);
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    __nv_bfloat16 r;
    r.bits = emu_bf16_bits(f);
    return r;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16(lo);
    r.y = __float2bfloat16(hi);
    return r;
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) {
    return __floats2bfloat162_rn(v.x, v.y);
}
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    return float2{__low2float(v), __high2float(v)};
}
