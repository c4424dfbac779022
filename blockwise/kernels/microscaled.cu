// Round-to-nearest quantization of W[N, K] (BF16, F16 or F32, row-major) to the FP4 grids NVFP4
// and MXFP4 (quant/microscaled.go), straight into the bytes that qpack and compressed-tensors
// both store (packing/microscaled.go): codes U8 [N, K/2], two E2M1 codes a byte with the even
// column in the low nibble, and one scale byte per block (E4M3 for NVFP4's blocks of 16, E8M0
// for MXFP4's blocks of 32). Launched by blockwise.GPUQuantizer (fp4_cuda.go). Every kernel
// reproduces the pure-Go reference bit for bit (blockwise.Quantize, then the layout's Pack):
//
//   NVFP4: G = 2688/amax(W) (1 when amax is 0, FLT_MAX when the quotient overflows), or G given;
//          s = E4M3(G·(amax_b/6)) saturating at 448, 2^-9 when it rounds to 0; f = s/G;
//          code = E2M1(w/f), nearest with ties to even, saturating at ±6, +0 for zero.
//   MXFP4: s = 2^(⌊log2 amax_b⌋ − 2), the E8M0 byte max(exponent field of amax_b − 2, 0);
//          code = E2M1(w/s), w/s exact (s a power of two).
//
// K is a multiple of the block, so blocks never straddle rows and the tensor is a flat array of
// N·K/8 chunks of 8 weights: chunk c's codes are the 4 bytes at 4c, block b's scale the byte b.
// A warp takes 32 consecutive chunks (grid-stride over the tensor): lane l loads chunk 32i + l
// (one 16-byte load of a 16-bit input), the 2 (NVFP4) or 4 (MXFP4) lanes of a block reduce its
// absolute maximum with xor shuffles, and every lane stores its 4 code bytes (128 contiguous
// bytes a warp); the block's first lane stores its scale byte.
//
// NVFP4's quotient w/f without a division per weight: x = w·r with r = 1/f correctly rounded is
// within 2 ulps of fl(w/f) (two roundings of relative size 2^-24 each). Every E2M1 decision
// threshold (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) has a mantissa of at most 3 bits, so unless
// x lies within 4 ulps of such a number, fl(w/f) is on the same side of every threshold and
// codes the same; the rare weights that do (and any non-finite x) are redone with the division.
//
// Non-finite weights are reported like blockwise.cu's kernels: status[0] is lowered to the
// lowest flat index of one (atomicMin), and the host turns it into the CPU's error.
// qpack-cubin: sm_90
#include <cuda_fp16.h>

enum { IN_BF16 = 0, IN_F16 = 1, IN_F32 = 2 };

typedef unsigned long long u64;

#define FP4_THREADS 256

// e4m3_byte is fp.F32ToE4M3 for v ≥ 0 (a block scale): round to nearest even, saturating at 448.
__device__ __forceinline__ unsigned int e4m3_byte(float v) {
    if (v >= 448.0f) return 0x7eu;
    const unsigned int u = __float_as_uint(v);
    if (u < 0x3c800000u) return (unsigned int)rintf(__fmul_rn(v, 512.0f));  // below 2^-6: subnormal steps of 2^-9 (exact product)
    const unsigned int r = u + 0x7ffffu + ((u >> 20) & 1u);                  // the mantissa rounded to 3 bits, ties to even
    return (r >> 20) - ((127u - 7u) << 3);
}

// e4m3_value is the value of an E4M3 byte below 0x7f (fp.E4M3ToF32).
__device__ __forceinline__ float e4m3_value(unsigned int b) {
    if (b < 8u) return __fmul_rn((float)b, 0.001953125f);  // subnormal: b·2^-9
    return __uint_as_float((b + ((127u - 7u) << 3)) << 20);
}

// nvfp4_global is quant.NVFP4GlobalScale.
__device__ __forceinline__ float nvfp4_global(float amax) {
    if (amax == 0.0f) return 1.0f;
    const float g = __fdiv_rn(2688.0f, amax);
    return __float_as_uint(g) == 0x7f800000u ? 3.40282346638528859812e+38f : g;
}

// e2m1_code is fp.F32ToE2M1 for finite x: the nearest E2M1 magnitude (ties to even), the sign in
// bit 3, +0 for a magnitude of 0. In integer steps on the bits u of |x|: from 1 on, the
// magnitudes 1, 1.5, 2, 3, 4, 6 are the floats of one mantissa bit, so rounding u to one mantissa
// bit (ties to even) gives code 2 + 2·exponent + mantissa, saturated at 7 (6); below 1 the
// magnitudes 0, 0.5, 1 are steps of 0.5, so the code is 2|x| rounded to an integer, which adding
// 2^23 in one fused rounding does (ties to even).
__device__ __forceinline__ unsigned int e2m1_code(float x) {
    const unsigned int u = __float_as_uint(x) & 0x7fffffffu;
    const unsigned int big = min(((u + 0x1fffffu + ((u >> 22) & 1u)) >> 22) - 252u, 7u);
    const unsigned int small = __float_as_uint(__fmaf_rn(__uint_as_float(u), 2.0f, 8388608.0f)) - 0x4b000000u;
    const unsigned int m = u < 0x3f800000u ? small : big;
    return m == 0u ? 0u : m | (__float_as_uint(x) >> 31) << 3;
}

// near_threshold reports whether x lies within 4 ulps of a number whose mantissa has at most 3
// bits (every E2M1 threshold is one), or is not finite: then x = w·r may code differently from
// the quotient fl(w/f).
__device__ __forceinline__ bool near_threshold(float x) {
    const unsigned int u = __float_as_uint(x) & 0x7fffffffu;
    return u >= 0x7f800000u || (fabsf(x) > 0.2f && ((u + 4u) & 0xfffffu) <= 8u);
}

// Chunk is 8 weights as loaded: 4 words of BF16/F16 pairs or 8 words of F32.
template <int DT>
struct Chunk {
    unsigned int u[DT == IN_F32 ? 8 : 4];
};

template <int DT>
__device__ __forceinline__ void load_chunk(const void* w, u64 c, Chunk<DT>& x) {
    if constexpr (DT == IN_F32) {
        const uint4* p = (const uint4*)w + 2 * c;
        const uint4 a = __ldg(p), b = __ldg(p + 1);
        x.u[0] = a.x; x.u[1] = a.y; x.u[2] = a.z; x.u[3] = a.w;
        x.u[4] = b.x; x.u[5] = b.y; x.u[6] = b.z; x.u[7] = b.w;
    } else {
        const uint4 a = __ldg((const uint4*)w + c);
        x.u[0] = a.x; x.u[1] = a.y; x.u[2] = a.z; x.u[3] = a.w;
    }
}

// chunk_at is weight j (a compile-time constant in unrolled loops) of a chunk, as float32.
template <int DT>
__device__ __forceinline__ float chunk_at(const Chunk<DT>& x, int j) {
    if constexpr (DT == IN_F32) {
        return __uint_as_float(x.u[j]);
    } else {
        const unsigned int word = x.u[j >> 1];
        const unsigned int h = (j & 1) ? word >> 16 : word & 0xffffu;
        if constexpr (DT == IN_BF16) return __uint_as_float(h << 16);
        else return __half2float(__ushort_as_half((unsigned short)h));
    }
}

// chunk_absmax returns the largest |w| of a chunk as float32 bits (non-negative floats order as
// their bits), which exceed 0x7f7fffff exactly when a weight is not finite.
template <int DT>
__device__ __forceinline__ unsigned int chunk_absmax(const Chunk<DT>& x) {
    unsigned int m = 0;
    if constexpr (DT == IN_F32) {
#pragma unroll
        for (int j = 0; j < 8; j++) m = max(m, x.u[j] & 0x7fffffffu);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) m = __vmaxu2(m, x.u[j] & 0x7fff7fffu);  // both halves at once
        m = max(m & 0xffffu, m >> 16);
        if constexpr (DT == IN_BF16) m <<= 16;
        else m = __float_as_uint(__half2float(__ushort_as_half((unsigned short)m)));  // F16 bits order like F32's
    }
    return m;
}

// report_bad lowers status[0] to the flat index of the chunk's first non-finite weight.
template <int DT>
__device__ __forceinline__ void report_bad(const Chunk<DT>& x, u64 c, u64* status) {
#pragma unroll
    for (int j = 7; j >= 0; j--) {
        const float v = chunk_at<DT>(x, j);
        if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) atomicMin(status, 8 * c + j);
    }
}

// FP4Block is one block's parameters as a lane needs them.
struct FP4Block {
    unsigned int byte;  // the stored scale byte
    float f, r;         // NVFP4: f = s/G and r = 1/f; MXFP4: r = 1/s (exact), f unused
};

__device__ __forceinline__ FP4Block nvfp4_block(float amax, float g) {
    FP4Block b;
    b.byte = e4m3_byte(__fmul_rn(g, __fdiv_rn(amax, 6.0f)));
    if (b.byte == 0u) b.byte = 1u;  // quant.MinE4M3
    b.f = __fdiv_rn(e4m3_value(b.byte), g);
    b.r = __frcp_rn(b.f);
    // A subnormal or infinite reciprocal is not within half an ulp of 1/f: NaN sends every
    // weight of the block to the division (near_threshold).
    if (!(fabsf(b.r) >= 1.17549435e-38f && fabsf(b.r) <= 3.40282346638528859812e+38f)) b.r = __uint_as_float(0x7fc00000u);
    return b;
}

__device__ __forceinline__ FP4Block mxfp4_block(unsigned int amax_bits) {
    FP4Block b;
    b.byte = (unsigned int)max((int)(amax_bits >> 23) - 2, 0);
    b.f = 0.0f;
    b.r = __uint_as_float((254u - b.byte) << 23);  // 2^(127 − e): normal for e ≤ 252, which amax ≤ FLT_MAX gives
    return b;
}

// chunk_codes codes 8 weights of a block into 4 bytes, weight j in nibble j.
template <int DT, bool NV>
__device__ __forceinline__ unsigned int chunk_codes(const Chunk<DT>& x, const FP4Block& b) {
    float q[8];
    bool near = false;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        q[j] = __fmul_rn(chunk_at<DT>(x, j), b.r);
        if (NV) near |= near_threshold(q[j]);
    }
    if (NV && near) {  // rare: the true division for the weights that need it
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (near_threshold(q[j])) q[j] = __fdiv_rn(chunk_at<DT>(x, j), b.f);
    }
    unsigned int word = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) word |= e2m1_code(q[j]) << (4 * j);
    return word;
}

// fp4_kernel quantizes the chunks of W. amax_or_g holds G when have_g, else the bits of
// amax(W) (bw_fp4_amax's result); NVFP4 writes the G it used to global_out. A warp handles two
// runs of 32 chunks per step, so that each lane has two 16-byte loads in flight.
template <int DT, bool NV>
__device__ __forceinline__ void fp4_kernel(const void* w, u64 chunks, const unsigned int* amax_or_g, int have_g,
                                           unsigned int* codes, unsigned char* scales, float* global_out, u64* status) {
    constexpr int lanes_per_block = NV ? 2 : 4, runs = 2;
    const int lane = threadIdx.x & 31;
    float g = 0.0f;
    if (NV) {
        g = have_g ? __uint_as_float(*amax_or_g) : nvfp4_global(__uint_as_float(*amax_or_g));
        if (blockIdx.x == 0 && threadIdx.x == 0) *global_out = g;
    }
    const u64 warps = (u64)gridDim.x * (FP4_THREADS / 32);
    for (u64 wc = (u64)blockIdx.x * (FP4_THREADS / 32) + (threadIdx.x >> 5); wc * 32 < chunks; wc += runs * warps) {
        Chunk<DT> x[runs];
        unsigned int amax[runs];
        u64 c[runs];
#pragma unroll
        for (int i = 0; i < runs; i++) {
            c[i] = (wc + i * warps) * 32 + lane;
            amax[i] = 0;
            if (c[i] < chunks) {
                load_chunk<DT>(w, c[i], x[i]);
                amax[i] = chunk_absmax<DT>(x[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < runs; i++) {
            // Every lane shuffles, live or not: chunks is even (NVFP4) or a multiple of 4, so a
            // block's lanes are all live or all past the end.
#pragma unroll
            for (int off = 1; off < lanes_per_block; off <<= 1) amax[i] = max(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], off));
            if (c[i] >= chunks) continue;
            if (amax[i] >= 0x7f800000u) {  // a non-finite weight in the block: report it; codes do not matter
                report_bad<DT>(x[i], c[i], status);
                continue;
            }
            const FP4Block b = NV ? nvfp4_block(__uint_as_float(amax[i]), g) : mxfp4_block(amax[i]);
            codes[c[i]] = chunk_codes<DT, NV>(x[i], b);
            if ((lane & (lanes_per_block - 1)) == 0) scales[c[i] / lanes_per_block] = (unsigned char)b.byte;
        }
    }
}

// fp4_amax_kernel raises *amax_bits to the bits of max |w| over W (float bits order like the
// values; a non-finite weight gives bits ≥ 0x7f800000, which the quantization kernel reports).
template <int DT>
__device__ __forceinline__ void fp4_amax_kernel(const void* w, u64 chunks, unsigned int* amax_bits) {
    unsigned int m = 0;
    for (u64 c = (u64)blockIdx.x * FP4_THREADS + threadIdx.x; c < chunks; c += (u64)gridDim.x * FP4_THREADS) {
        Chunk<DT> x;
        load_chunk<DT>(w, c, x);
        m = max(m, chunk_absmax<DT>(x));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0 && m != 0u) atomicMax(amax_bits, m);
}

#define FP4_PARAMS                                                                                     \
    const void *w, u64 chunks, const unsigned int *amax_or_g, int have_g, unsigned int *codes,          \
        unsigned char *scales, float *global_out, u64 *status
#define FP4_ARGS w, chunks, amax_or_g, have_g, codes, scales, global_out, status

#define FP4_ENTRIES(suffix, DTV)                                                                       \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS) bw_fp4_nvfp4##suffix(FP4_PARAMS) {       \
        fp4_kernel<DTV, true>(FP4_ARGS);                                                               \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS) bw_fp4_mxfp4##suffix(FP4_PARAMS) {       \
        fp4_kernel<DTV, false>(FP4_ARGS);                                                              \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS)                                          \
        bw_fp4_amax##suffix(const void* w, u64 chunks, unsigned int* amax_bits) {                      \
        fp4_amax_kernel<DTV>(w, chunks, amax_bits);                                                    \
    }
FP4_ENTRIES(_bf16, IN_BF16)
FP4_ENTRIES(_f16, IN_F16)
FP4_ENTRIES(_f32, IN_F32)
