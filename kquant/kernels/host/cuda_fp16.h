// Stand-ins for the CUDA built-ins that kquant.cu uses, so that host.cpp can compile the kernels
// for the CPU (kquant's TestKernelOnCPU). kquant.cu includes <cuda_fp16.h> first; with -I this
// directory that is this file, which defines everything it needs:
//   - __fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn: one IEEE float32 operation each
//     (build with -ffp-contract=off, and the volatile keeps the compiler from fusing anyway);
//   - a NaN result is the GPU's canonical NaN 0x7fffffff, not x86's default NaN 0xffc00000, so
//     that the kernel's handling of NaN is tested as the GPU will run it;
//   - F16 rounding through _Float16 (round to nearest even, overflow to Inf: cvt.rn.f16.f32);
//   - blockIdx, blockDim and threadIdx are globals the caller sets before each "thread";
//   - atomicMin on 64-bit words, as the threads run one after another.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict

struct host_dim3 {
    unsigned x, y, z;
};
static host_dim3 blockIdx, blockDim, threadIdx;

static inline float gpu_nan(float v) {
    if (v != v) {
        uint32_t u = 0x7fffffffu;
        memcpy(&v, &u, 4);
    }
    return v;
}
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return gpu_nan(r); }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return gpu_nan(r); }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return gpu_nan(r); }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return gpu_nan(r); }
static inline float __fsqrt_rn(float a) { volatile float r = sqrtf(a); return gpu_nan(r); }
static inline int __float_as_int(float v) {
    int i;
    memcpy(&i, &v, 4);
    return i;
}
static inline float __int_as_float(int i) {
    float v;
    memcpy(&v, &i, 4);
    return v;
}

struct __half {
    _Float16 h;
};
static inline __half __float2half_rn(float v) { return __half{(_Float16)v}; }
static inline float __half2float(__half h) { return (float)h.h; }
static inline unsigned short __half_as_ushort(__half h) {
    unsigned short u;
    memcpy(&u, &h.h, 2);
    return u;
}
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p;
    if (v < old) *p = v;
    return old;
}
