// Conversions of checkpoint element types to float32, launched by cuda.Device.ConvertToF32.
// F16 and BF16 widen exactly (every value, NaN included, maps to one float32), so these kernels
// must agree bit for bit with fp.F16ToF32 and fp.BF16ToF32 (NaN payloads aside). At the end, the
// scaled narrowing of float32 to FP16 of cuda.Device.ToF16Scaled.
#include <cuda_fp16.h>

struct F16 {
    static constexpr unsigned short exponent = 0x7c00;
    static __device__ __forceinline__ float decode(unsigned short h) {
        return __half2float(__ushort_as_half(h));
    }
};

struct BF16 {
    static constexpr unsigned short exponent = 0x7f80;
    static __device__ __forceinline__ float decode(unsigned short b) {
        return __uint_as_float((unsigned int)b << 16);
    }
};

// widen decodes element i, and when first is not null puts base + i into *first (atomicMin)
// if the element is a NaN or an infinity (all exponent bits set): the checked conversions find
// the first non-finite value of what they widen.
template <typename T>
__device__ __forceinline__ float widen(unsigned short v, unsigned long long i, unsigned long long* first, unsigned long long base) {
    if (first && (v & T::exponent) == T::exponent) atomicMin(first, base + i);
    return T::decode(v);
}

// One element per thread and step; works for any alignment.
template <typename T>
__device__ void widen_scalar(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = widen<T>(in[i], i, first, base);
    }
}

// Eight elements per thread and step: one 16-byte load, two 16-byte stores. in and out must be
// 16-byte aligned (the host checks). The n % 8 tail elements go to the first threads.
template <typename T>
__device__ void widen_vec8(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    const uint4* in8 = reinterpret_cast<const uint4*>(in);
    float4* out4 = reinterpret_cast<float4*>(out);
    unsigned long long chunks = n / 8;
    unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long c = tid; c < chunks; c += step) {
        uint4 v = in8[c];
        unsigned long long i = 8 * c;
        // Little-endian: the low half of each word is the earlier element.
        out4[2 * c] = make_float4(widen<T>(v.x & 0xffff, i, first, base), widen<T>(v.x >> 16, i + 1, first, base),
                                  widen<T>(v.y & 0xffff, i + 2, first, base), widen<T>(v.y >> 16, i + 3, first, base));
        out4[2 * c + 1] = make_float4(widen<T>(v.z & 0xffff, i + 4, first, base), widen<T>(v.z >> 16, i + 5, first, base),
                                      widen<T>(v.w & 0xffff, i + 6, first, base), widen<T>(v.w >> 16, i + 7, first, base));
    }
    unsigned long long t = chunks * 8 + tid;
    if (t < n) {
        out[t] = widen<T>(in[t], t, first, base);
    }
}

extern "C" __global__ void f16_to_f32(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    widen_scalar<F16>(in, out, n, first, base);
}

extern "C" __global__ void f16_to_f32_vec8(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    widen_vec8<F16>(in, out, n, first, base);
}

extern "C" __global__ void bf16_to_f32(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    widen_scalar<BF16>(in, out, n, first, base);
}

extern "C" __global__ void bf16_to_f32_vec8(const unsigned short* in, float* out, unsigned long long n, unsigned long long* first, unsigned long long base) {
    widen_vec8<BF16>(in, out, n, first, base);
}

// warp_amax folds the warp's m into *amax.
__device__ __forceinline__ void warp_amax(float m, unsigned int* amax) {
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m > 0) atomicMax(amax, __float_as_uint(m));
}

// amax_abs: *amax = max(*amax, |x[i]|) over x[0..n), as float bits (non-negative floats order
// as unsigned integers); NaNs are left out. Grid-stride; *amax must start at 0.
extern "C" __global__ void amax_abs(const float* x, long long n, unsigned int* amax) {
    float m = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) m = fmaxf(m, fabsf(x[i]));
    warp_amax(m, amax);
}

// amax_abs_vec4 is amax_abs four elements at a time (x 16-byte aligned); the n % 4 tail elements
// go to the first threads.
extern "C" __global__ void amax_abs_vec4(const float* x, long long n, unsigned int* amax) {
    float m = 0;
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (long long c = tid; c < n / 4; c += stride) {
        float4 v = x4[c];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    if (long long t = n / 4 * 4 + tid; t < n) m = fmaxf(m, fabsf(x[t]));
    warp_amax(m, amax);
}

// f16_shift is the power of two s that puts a largest magnitude a in [2^14, 2^15) — FP16's top
// binades, below its largest finite 65504 — clamped to ±60 so that 2^−(s+t) of two operands
// stays a normal float; 0 for a zero or non-finite a (infinities and NaNs then stay so).
__device__ int f16_shift(unsigned int amaxBits) {
    float a = __uint_as_float(amaxBits);
    if (!(a > 0) || isinf(a)) return 0;
    int e;
    frexpf(a, &e); // a < 2^e
    return max(-60, min(60, 15 - e));
}

// write_scale writes to_f16_scaled's shift s and alpha.
__device__ void write_scale(int s, const int* other, int* shift, float* alpha) {
    int t = other ? *other : s; // read before shift is written: they may be one word
    if (shift) *shift = s;
    if (alpha) *alpha = ldexpf(1.0f, -(s + t));
}

// scaled_f16 is x·2^s rounded to FP16 (to nearest even).
__device__ __forceinline__ unsigned short scaled_f16(float x, int s) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(ldexpf(x, s)));
    return h;
}

// scaled_f16x2 is scaled_f16 of lo and hi in one word, lo in the low half.
__device__ __forceinline__ unsigned scaled_f16x2(float lo, float hi, int s) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(ldexpf(hi, s)), "f"(ldexpf(lo, s)));
    return d;
}

// to_f16_scaled: y = x·2^s rounded to FP16 (to nearest even), s = f16_shift(*amax): the operands
// of the FP16 GEMMs keep FP16's 11-bit significand — TF32's — whatever their range. Thread 0
// writes s to *shift (when given) and, for the GEMM that multiplies y by an operand scaled by
// 2^t (t = *other, or s when other is null: a Gram matrix xᵀx), alpha = 2^−(s+t) to *alpha
// (when given), which undoes both scales exactly.
extern "C" __global__ void to_f16_scaled(const float* x, unsigned short* y, long long n, const unsigned int* amax,
                                         const int* other, int* shift, float* alpha) {
    int s = f16_shift(*amax);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) write_scale(s, other, shift, alpha);
    if (i < n) y[i] = scaled_f16(x[i], s);
}

// to_f16_scaled_vec8 is to_f16_scaled eight elements at a time (two 16-byte loads, one 16-byte
// store; x and y 16-byte aligned, the host checks), grid-stride; the n % 8 tail elements go to
// the first threads. Each element rounds as in to_f16_scaled.
extern "C" __global__ void to_f16_scaled_vec8(const float* x, unsigned short* y, long long n, const unsigned int* amax,
                                              const int* other, int* shift, float* alpha) {
    int s = f16_shift(*amax);
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
    if (tid == 0) write_scale(s, other, shift, alpha);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    uint4* y8 = reinterpret_cast<uint4*>(y);
    long long chunks = n / 8;
    for (long long c = tid; c < chunks; c += step) {
        float4 a = x4[2 * c], b = x4[2 * c + 1];
        y8[c] = make_uint4(scaled_f16x2(a.x, a.y, s), scaled_f16x2(a.z, a.w, s), scaled_f16x2(b.x, b.y, s), scaled_f16x2(b.z, b.w, s));
    }
    long long t = chunks * 8 + tid;
    if (t < n) y[t] = scaled_f16(x[t], s);
}

// f16_alpha writes to *alpha what to_f16_scaled would for an operand it already scaled by
// 2^*shift, read by a GEMM with another scaled by 2^t (t = *other, or *shift when other is null):
// an input converted once and read by several GEMMs, each with its own other operand.
extern "C" __global__ void f16_alpha(const int* shift, const int* other, float* alpha) {
    write_scale(*shift, other, 0, alpha);
}
