// Stand-ins for the CUDA built-ins that microscaled.cu uses, so that microscaled_host.cpp can
// compile it for the CPU (blockwise's TestFP4KernelOnCPU). microscaled.cu includes
// <cuda_fp16.h> first; with -I this directory that is this file:
//   - __fmul_rn, __fdiv_rn, __frcp_rn, __fmaf_rn: one IEEE float32 operation each (build with
//     -ffp-contract=off; the volatile keeps the compiler from fusing anyway);
//   - F16 decoding through _Float16 (g++ 12 or newer);
//   - the packed BF16/F16 min, max and FMA of the BF16 fast paths (QPACK_HOST_STANDINS keeps
//     microscaled.cu's inline assembly out), lane by lane in float (the F16 FMA's product and
//     sum exact in double, then one rounding), and the byte permute, funnel shift and directed
//     float64 → float32 conversions;
//   - the warp and atomic built-ins exist only so that the kernels compile: the host driver runs
//     the kernels' per-block arithmetic sequentially and never calls them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define QPACK_HOST_STANDINS 1

struct host_dim3 {
    unsigned x, y, z;
};
static host_dim3 blockIdx, blockDim, threadIdx, gridDim;
struct uint4 {
    unsigned int x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

using std::max;
using std::min;

// bits_as reinterprets the bits of v as a To of the same size.
template <typename To, typename From> static inline To bits_as(From v) {
    static_assert(sizeof(To) == sizeof(From), "sizes differ");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
static inline float __uint_as_float(unsigned int u) { return bits_as<float>(u); }
static inline unsigned int __float_as_uint(float v) { return bits_as<unsigned int>(v); }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __frcp_rn(float a) { volatile float r = 1.0f / a; return r; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline unsigned int __vmaxu2(unsigned int a, unsigned int b) {
    return std::max(a & 0xffffu, b & 0xffffu) | std::max(a >> 16, b >> 16) << 16;
}

struct __half {
    _Float16 h;
};
static inline __half __ushort_as_half(unsigned short s) {
    __half h;
    memcpy(&h.h, &s, 2);
    return h;
}
static inline float __half2float(__half h) { return (float)h.h; }

template <typename T> static inline T __ldg(const T* p) { return *p; }
template <typename T> static inline T __shfl_xor_sync(unsigned, T, int) { abort(); }
static inline unsigned long long atomicMin(unsigned long long*, unsigned long long) { abort(); }
static inline unsigned int atomicMax(unsigned int*, unsigned int) { abort(); }

static inline void __syncthreads() {}

static inline float bf16_lane(unsigned int w, int lane) { return __uint_as_float((w >> (16 * lane) & 0xffffu) << 16); }
static inline unsigned int bf16x2_pick(unsigned int a, unsigned int b, bool (*take_b)(float, float)) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const unsigned int h = take_b(bf16_lane(a, lane), bf16_lane(b, lane)) ? b : a;
        d |= (h >> (16 * lane) & 0xffffu) << (16 * lane);
    }
    return d;
}
// max.NaN.bf16x2: the canonical NaN 0x7fff when either lane is NaN.
static inline unsigned int bf16x2_max_nan(unsigned int a, unsigned int b) {
    unsigned int d = bf16x2_pick(a, b, [](float x, float y) { return y > x; });
    for (int lane = 0; lane < 2; lane++)
        if (std::isnan(bf16_lane(a, lane)) || std::isnan(bf16_lane(b, lane))) d = (d & ~(0xffffu << (16 * lane))) | 0x7fffu << (16 * lane);
    return d;
}
static inline unsigned int bf16x2_max(unsigned int a, unsigned int b) { return bf16x2_pick(a, b, [](float x, float y) { return y > x; }); }
static inline unsigned int bf16x2_min(unsigned int a, unsigned int b) { return bf16x2_pick(a, b, [](float x, float y) { return y < x; }); }

static inline _Float16 f16_lane(unsigned int w, int lane) { return bits_as<_Float16>((unsigned short)(w >> (16 * lane))); }
static inline unsigned int f16_bits(_Float16 h) { return bits_as<unsigned short>(h); }
static inline unsigned int f16x2_fma(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const double v = (double)f16_lane(a, lane) * (double)f16_lane(b, lane) + (double)f16_lane(c, lane);
        d |= f16_bits((_Float16)v) << (16 * lane);
    }
    return d;
}
static inline unsigned int f16x2_max(unsigned int a, unsigned int b) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const _Float16 x = f16_lane(a, lane), y = f16_lane(b, lane);
        d |= f16_bits(y > x ? y : x) << (16 * lane);
    }
    return d;
}

static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned int d = 0;
    for (int i = 0; i < 4; i++) d |= (unsigned int)(v >> (8 * (s >> (4 * i) & 7)) & 0xffu) << (8 * i);
    return d;
}
static inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
    const unsigned long long v = (unsigned long long)hi << 32 | lo;
    return (unsigned int)(v << (shift & 31) >> 32);
}
static inline float __double2float_ru(double v) {
    float f = (float)v;
    if ((double)f < v) f = std::nextafter(f, INFINITY);
    return f;
}
static inline float __double2float_rd(double v) {
    float f = (float)v;
    if ((double)f > v) f = std::nextafter(f, -INFINITY);
    return f;
}
using std::fmaxf;
