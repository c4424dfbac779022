// Conversions of checkpoint element types to float32, launched by cuda.Device.ConvertToF32.
// F16 and BF16 widen exactly (every value, NaN included, maps to one float32), so these kernels
// must agree bit for bit with fp.F16ToF32 and fp.BF16ToF32 (NaN payloads aside).
#include <cuda_fp16.h>

struct F16 {
    static __device__ __forceinline__ float decode(unsigned short h) {
        return __half2float(__ushort_as_half(h));
    }
};

struct BF16 {
    static __device__ __forceinline__ float decode(unsigned short b) {
        return __uint_as_float((unsigned int)b << 16);
    }
};

// One element per thread and step; works for any alignment.
template <typename T>
__device__ void widen_scalar(const unsigned short* in, float* out, unsigned long long n) {
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = T::decode(in[i]);
    }
}

// Eight elements per thread and step: one 16-byte load, two 16-byte stores. in and out must be
// 16-byte aligned (the host checks). The n % 8 tail elements go to the first threads.
template <typename T>
__device__ void widen_vec8(const unsigned short* in, float* out, unsigned long long n) {
    const uint4* in8 = reinterpret_cast<const uint4*>(in);
    float4* out4 = reinterpret_cast<float4*>(out);
    unsigned long long chunks = n / 8;
    unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long c = tid; c < chunks; c += step) {
        uint4 v = in8[c];
        // Little-endian: the low half of each word is the earlier element.
        out4[2 * c] = make_float4(T::decode(v.x & 0xffff), T::decode(v.x >> 16),
                                  T::decode(v.y & 0xffff), T::decode(v.y >> 16));
        out4[2 * c + 1] = make_float4(T::decode(v.z & 0xffff), T::decode(v.z >> 16),
                                      T::decode(v.w & 0xffff), T::decode(v.w >> 16));
    }
    unsigned long long t = chunks * 8 + tid;
    if (t < n) {
        out[t] = T::decode(in[t]);
    }
}

extern "C" __global__ void f16_to_f32(const unsigned short* in, float* out, unsigned long long n) {
    widen_scalar<F16>(in, out, n);
}

extern "C" __global__ void f16_to_f32_vec8(const unsigned short* in, float* out, unsigned long long n) {
    widen_vec8<F16>(in, out, n);
}

extern "C" __global__ void bf16_to_f32(const unsigned short* in, float* out, unsigned long long n) {
    widen_scalar<BF16>(in, out, n);
}

extern "C" __global__ void bf16_to_f32_vec8(const unsigned short* in, float* out, unsigned long long n) {
    widen_vec8<BF16>(in, out, n);
}
