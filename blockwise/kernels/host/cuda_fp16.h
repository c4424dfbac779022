// Stand-ins for the CUDA built-ins that microscaled.cu uses, so that microscaled_host.cpp can
// compile it for the CPU (blockwise's TestFP4KernelOnCPU). microscaled.cu includes
// <cuda_fp16.h> first; with -I this directory that is this file:
//   - __fmul_rn, __fdiv_rn, __frcp_rn, __fmaf_rn: one IEEE float32 operation each (build with
//     -ffp-contract=off; the volatile keeps the compiler from fusing anyway);
//   - F16 decoding through _Float16 (g++ 12 or newer);
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

struct host_dim3 {
    unsigned x, y, z;
};
static host_dim3 blockIdx, blockDim, threadIdx, gridDim;
struct uint4 {
    unsigned int x, y, z, w;
};

using std::max;
using std::min;

static inline float __uint_as_float(unsigned int u) {
    float v;
    memcpy(&v, &u, 4);
    return v;
}
static inline unsigned int __float_as_uint(float v) {
    unsigned int u;
    memcpy(&u, &v, 4);
    return u;
}
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
