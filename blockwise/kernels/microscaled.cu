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
// 16-bit inputs (BF16, the common one, and F16) have their own loop (fp4_half_loop: a lane
// takes 16 weights) and arithmetic: BF16 two weights per 32-bit operation where it can
// (mxfp4_bf16_codes), F16 in float32, which holds an F16 weight's 11 bits with room to spare
// (mxfp4_f16_codes), and NVFP4 for both by a scale table (nvfp4_half_codes). F32 takes the
// general per-weight path (chunk_codes; NVFP4's f and 1/f of each scale byte from a table,
// NVScale): a warp takes 32 consecutive chunks (grid-stride over
// the tensor), lane l loads chunk 32i + l, the 2 (NVFP4) or 4 (MXFP4) lanes of a block reduce
// its absolute maximum with xor shuffles, every lane stores its 4 code bytes and the block's
// first lane its scale byte.
//
// The general path's NVFP4 quotient w/f without a division per weight: x = w·r with r = 1/f
// correctly rounded is within 2 ulps of fl(w/f) (two roundings of relative size 2^-24 each).
// Every E2M1 decision threshold (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) has a mantissa of at most
// 3 bits, so unless x lies within 4 ulps of such a number, fl(w/f) is on the same side of every
// threshold and codes the same; the rare weights that do (and any non-finite x) are redone with
// the division. The 16-bit paths instead decide per scale byte, before the loop, whether their
// cheaper arithmetic, with factors chosen for the byte, is exact for every weight of the dtype
// (nvfp4_table, nvfp4_factor), and send the blocks of the bytes where it is not to the general
// path.
//
// Non-finite weights are reported like blockwise.cu's kernels: status[0] is lowered to the
// lowest flat index of one (atomicMin), and the host turns it into the CPU's error.
// qpack-cubin: sm_90
#include <cuda_fp16.h>

enum { IN_BF16 = 0, IN_F16 = 1, IN_F32 = 2 };

typedef unsigned long long u64;

#define FP4_THREADS 256

// Packed BF16 and F16 operations on the two 16-bit lanes of a word (PTX for sm_80; the host
// harness brings its own).
#ifndef QPACK_HOST_STANDINS
__device__ __forceinline__ unsigned int bf16x2_max_nan(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int bf16x2_max(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int bf16x2_min(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int f16x2_fma(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ unsigned int f16x2_max(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ unsigned int f16x2_max_nan(unsigned int a, unsigned int b) {
    unsigned int d;
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
#endif

// e4m3_byte is fp.F32ToE4M3 for v ≥ 0 (a block scale, +Inf included): round to nearest even,
// saturating at 448, without branches. From 2^-6 on, the float32 mantissa rounded to 3 bits
// (ties to even) in integer steps; below, subnormal steps of 2^-9: v·512 (exact) rounded to an
// integer by adding 2^23 in one fused rounding. Anything from 448 on (Inf too) gives at least
// 0x7e before the saturation. Equal to the branching form for every non-negative float32
// (checked exhaustively).
__device__ __forceinline__ unsigned int e4m3_byte(float v) {
    const unsigned int u = __float_as_uint(v);
    const unsigned int normal = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
    const unsigned int sub = __float_as_uint(__fmaf_rn(v, 512.0f, 8388608.0f)) - 0x4b000000u;
    return min(u < 0x3c800000u ? sub : normal, 0x7eu);
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
__device__ __forceinline__ void load_chunk(const void* w, unsigned int c, Chunk<DT>& x) {
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

// bf16x2_absmax is the lane-wise maximum of a BF16 chunk's magnitudes (packed BF16 max, NaN
// kept as 0x7fff); bf16_absmax_bits turns such a pair of lanes into the float32 bits of their max.
__device__ __forceinline__ unsigned int bf16x2_absmax(const Chunk<IN_BF16>& x) {
    const unsigned int m = bf16x2_max_nan(x.u[0] & 0x7fff7fffu, x.u[1] & 0x7fff7fffu);
    return bf16x2_max_nan(m, bf16x2_max_nan(x.u[2] & 0x7fff7fffu, x.u[3] & 0x7fff7fffu));
}
__device__ __forceinline__ unsigned int bf16_absmax_bits(unsigned int m) { return bf16x2_max_nan(m, m >> 16) << 16; }

// chunk_absmax returns the largest |w| of a chunk as float32 bits (non-negative floats order as
// their bits), which exceed 0x7f7fffff exactly when a weight is not finite.
template <int DT>
__device__ __forceinline__ unsigned int chunk_absmax(const Chunk<DT>& x) {
    unsigned int m = 0;
    if constexpr (DT == IN_F32) {
#pragma unroll
        for (int j = 0; j < 8; j++) m = max(m, x.u[j] & 0x7fffffffu);
    } else if constexpr (DT == IN_BF16) {
        m = bf16_absmax_bits(bf16x2_absmax(x));
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) m = __vmaxu2(m, x.u[j] & 0x7fff7fffu);  // both halves at once
        m = max(m & 0xffffu, m >> 16);
        m = __float_as_uint(__half2float(__ushort_as_half((unsigned short)m)));  // F16 bits order like F32's
    }
    return m;
}

// absmax_bits turns a packed maximum of 16-bit magnitudes (vec_absmax's, pair_absmax's) or an
// F32 one into the float32 bits of the largest magnitude
// (bits ≥ 0x7f800000 exactly when a weight is not finite).
template <int DT>
__device__ __forceinline__ unsigned int absmax_bits(unsigned int m) {
    if constexpr (DT == IN_F32) return m;
    const unsigned int h = max(m & 0xffffu, m >> 16);  // 16-bit magnitudes order as their bits too
    if constexpr (DT == IN_BF16) return h << 16;
    else return __float_as_uint(__half2float(__ushort_as_half((unsigned short)h)));
}

// report_bad lowers status[0] to the flat index of the chunk's first non-finite weight.
template <int DT>
__device__ __forceinline__ void report_bad(const Chunk<DT>& x, unsigned int c, u64* status) {
#pragma unroll
    for (int j = 7; j >= 0; j--) {
        const float v = chunk_at<DT>(x, j);
        if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) atomicMin(status, 8 * (u64)c + j);
    }
}

// FP4Block is one block's parameters as a lane needs them.
struct FP4Block {
    unsigned int byte;  // the stored scale byte
    float f, r;         // NVFP4: f = s/G and r = 1/f; MXFP4: r = 1/s (exact), f unused
};

// nvfp4_byte is the scale byte of an NVFP4 block whose absolute maximum is amax, under G.
__device__ __forceinline__ unsigned int nvfp4_byte(float amax, float g) {
    const unsigned int byte = e4m3_byte(__fmul_rn(g, __fdiv_rn(amax, 6.0f)));
    return byte == 0u ? 1u : byte;  // quant.MinE4M3
}

// NVScale is the general path's f = s/G and r = 1/f of a scale byte; the F32 kernels keep a
// table of the 128 in shared memory (nvfp4_scale of each, once per thread block) instead of a
// division and a reciprocal per chunk.
struct NVScale {
    float f, r;
};

__device__ __forceinline__ NVScale nvfp4_scale(unsigned int byte, float g) {
    NVScale s;
    s.f = __fdiv_rn(e4m3_value(byte), g);
    s.r = __frcp_rn(s.f);
    // A subnormal or infinite reciprocal is not within half an ulp of 1/f: NaN sends every
    // weight of the block to the division (near_threshold).
    if (!(fabsf(s.r) >= 1.17549435e-38f && fabsf(s.r) <= 3.40282346638528859812e+38f)) s.r = __uint_as_float(0x7fc00000u);
    return s;
}

__device__ __forceinline__ FP4Block nvfp4_block(unsigned int byte, const NVScale& s) {
    FP4Block b;
    b.byte = byte;
    b.f = s.f;
    b.r = s.r;
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

// chunk_codes_general codes a chunk of a block with finite absolute maximum amax (float bits)
// by the rules above for any dtype, and sets byte to the block's scale byte.
template <int DT, bool NV>
__device__ __forceinline__ unsigned int chunk_codes_general(const Chunk<DT>& x, unsigned int amax, float g, unsigned int& byte) {
    FP4Block b;
    if (NV) {
        const unsigned int s = nvfp4_byte(__uint_as_float(amax), g);
        b = nvfp4_block(s, nvfp4_scale(s, g));
    } else {
        b = mxfp4_block(amax);
    }
    byte = b.byte;
    return chunk_codes<DT, NV>(x, b);
}

// ---- 16-bit fast paths --------------------------------------------------------------------
// A word holds two 16-bit weights (lanes: the even column in bits 0-15, the odd one in 16-31).
// The BF16 fast paths work on both lanes of a word at once where they can (packed BF16 and F16
// min/max/FMA, integer steps that cannot carry between lanes), the F16 ones on each weight in
// float32, and reach the rules' bytes exactly; the blocks they cannot do (BF16 MXFP4 scales
// below 2^-124; NVFP4 block scales for which no factors make the fast code equal the division's,
// a property of the scale byte that nvfp4_table decides beforehand) take chunk_codes_general.


// signed_codes puts the signs of a chunk's 8 16-bit weights on the magnitudes mag (nibble j the
// E2M1 magnitude of weight j) where the magnitude is not 0: fp.F32ToE2M1 codes zero as +0.
// The sign bits (bit 15 of each lane) are gathered by byte permutes: weight 2m's sign to bit
// 4·2m+3, weight 2m+1's to bit 4·(2m+1)+3.
template <int DT>
__device__ __forceinline__ unsigned int signed_codes(const Chunk<DT>& x, unsigned int mag) {
    const unsigned int p01 = __byte_perm(x.u[0], x.u[1], 0x7531), p23 = __byte_perm(x.u[2], x.u[3], 0x7531);
    const unsigned int even = __byte_perm(p01, p23, 0x6420), odd = __byte_perm(p01, p23, 0x7531);
    const unsigned int signs = (odd & 0x80808080u) | ((even >> 4) & 0x08080808u);
    const unsigned int nonzero = (mag + 0x77777777u) & 0x88888888u;  // bit 3 of a nibble: magnitude ≥ 1
    return mag | (signs & nonzero);
}

// mxfp4_bf16_codes codes a chunk of an MXFP4 block with scale byte e, 3 ≤ e ≤ 252, both lanes
// of a word at once. With s = 2^(e−127), clamping |w| to [0.25·s, 6·s] (BF16 min/max; all
// normal BF16 for these e) changes no code, and x = |w|/s is then exactly the F16 number whose
// bits are 8·bits(|w|) − (e − 15)·1024 (the exponent rebased, the 7 mantissa bits widened to
// 10). Below 1 the E2M1 grid steps by 0.5 (2|x| rounded to an integer); x' = max(x, 0.5·x + 0.5)
// maps [0.25, 1) onto [0.625, 1), exactly in F16, where the steps 1 and 2 begin at 0.875 and
// the 0 → 1 step at 0.625 — the one-mantissa-bit steps of [0.5, 1) — and leaves x ≥ 1 alone.
// So every code is x' rounded to one mantissa bit, ties to even, in integer steps on its F16
// bits u: code = (u − bits(0.5) + 0xff + bit 9 of u) >> 9, 0 … 7 (u ≤ bits(6)), never
// carrying between lanes.
__device__ __forceinline__ unsigned int mxfp4_bf16_codes(const Chunk<IN_BF16>& x, unsigned int e) {
    const unsigned int lo = e * 0x800080u - 0x1000100u;              // 0.25·s: exponent e − 2, both lanes
    const unsigned int hi = e * 0x800080u + 0x1400140u;              // 6·s = 1.5·2^(e−125)
    const unsigned int rebase = (15u - e) * 0x4000400u;              // per lane −(e − 15)·1024
    const unsigned int round = (0xffu - 0x3800u) * 0x10001u;         // per lane 0xff − bits(0.5)
    unsigned int t[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned int a = bf16x2_min(bf16x2_max(x.u[j] & 0x7fff7fffu, lo), hi);
        const unsigned int q = a * 8u + rebase;                                   // F16 x, both lanes
        const unsigned int u = f16x2_max(q, f16x2_fma(q, 0x38003800u, 0x38003800u));  // x'
        const unsigned int v = u + ((u >> 9) & 0x00010001u) + round;              // code in bits 9-11
        t[j] = (v << 3) | (x.u[j] & 0x80008000u);  // code in bits 12-14, the weight's sign in 15
    }
    // Gather the signed codes (high nibble of bytes 1 and 3 of each t) into nibbles 0-7, then
    // clear the sign of code 0 (fp.F32ToE2M1 codes zero as +0).
    const unsigned int p01 = __byte_perm(t[0], t[1], 0x7531), p23 = __byte_perm(t[2], t[3], 0x7531);
    const unsigned int even = __byte_perm(p01, p23, 0x6420), odd = __byte_perm(p01, p23, 0x7531);
    const unsigned int codes = ((even >> 4) & 0x0f0f0f0fu) | (odd & 0xf0f0f0f0u);
    const unsigned int nonzero = ((codes & 0x77777777u) + 0x77777777u) & 0x88888888u;  // bit 3: magnitude ≥ 1
    return codes & (0x77777777u | nonzero);
}

// NVEntry is what the NVFP4 16-bit path needs of one scale byte s under global scale G: the
// factors r ≈ 1/f (f = s/G) and rh ≈ r/2 (nvfp4_factor); r = 0 marks a byte whose blocks take
// chunk_codes_general.
struct NVEntry {
    float r, rh;
};

// NVFP4_LATE is how many float32 steps past an E2M1 threshold (x' at a rounding midpoint)
// nvfp4_step's code changes: a few, so that exact ties can go either way (nvfp4_factor).
#define NVFP4_LATE 8

// nvfp4_step is the NVFP4 16-bit path's magnitude code of a magnitude w, in bits 28-30
// of the result: with x = w·r, x' = max(x, w·rh + 0.5) (the map of mxfp4_bf16_codes, here in
// float32) rounded to one mantissa bit is bits(x')·64 + 0x48000000 (0.5 → 0, 6 → 7) for
// x' < 7, rounding up from NVFP4_LATE float steps past the midpoint (−64·NVFP4_LATE). The code
// is monotone in w, r and rh, and nvfp4_factor clears a byte only with factors r, rh under
// which it equals E2M1(fl(w/f)) at every step and stays 7 up to the largest weight a block of
// that byte holds.
__device__ __forceinline__ unsigned int nvfp4_step(float w, float r, float rh) {
    return __float_as_uint(fmaxf(__fmul_rn(w, r), __fmaf_rn(w, rh, 0.5f))) * 64u + (0x48000000u - 64u * NVFP4_LATE);
}

// half_value is the float32 value of a 16-bit weight's bits h (BF16 or F16: exact).
template <int DT>
__device__ __forceinline__ float half_value(unsigned int h) {
    if constexpr (DT == IN_BF16) return __uint_as_float(h << 16);
    else return __half2float(__ushort_as_half((unsigned short)h));
}

// half_max is the bits of the largest finite magnitude of the 16-bit dtype; half_ceil the bits
// of the smallest non-negative weight ≥ p (p ≥ 0), half_above of the smallest > p (both may be
// past half_max: an infinity's or beyond).
template <int DT>
__device__ __forceinline__ unsigned int half_max() { return DT == IN_BF16 ? 0x7f7fu : 0x7bffu; }
template <int DT>
__device__ __forceinline__ unsigned int half_ceil(double p) {
    const float v = __double2float_ru(p);  // rounding up twice is rounding up once: F16, BF16 ⊂ F32
    if constexpr (DT == IN_BF16) return (__float_as_uint(v) + 0xffffu) >> 16;
    else return __half_as_ushort(__float2half_ru(v));
}
template <int DT>
__device__ __forceinline__ unsigned int half_above(double p) {
    const float v = __double2float_rd(p);
    if constexpr (DT == IN_BF16) return (__float_as_uint(v) >> 16) + 1u;
    else return __half_as_ushort(__float2half_rd(v)) + 1u;
}

template <int DT>
__device__ __forceinline__ unsigned int nvfp4_fast(unsigned int a, float r, float rh) {
    return nvfp4_step(half_value<DT>(a), r, rh) >> 28;
}

// nvfp4_top is a 16-bit magnitude (BF16 or F16 bits) at least as large as any weight of a block
// whose scale byte is b < 0x7e under G (capped at the dtype's largest finite): v = G·(amax/6)
// rounds to b, so
// v ≤ (s + s⁺)/2 with s⁺ the next E4M3 value, and amax ≤ 3·(s + s⁺)/G up to the roundings of
// amax/6 and of the product (relative 2^-24 each while normal, absolute 2^-149 each below).
template <int DT>
__device__ __forceinline__ unsigned int nvfp4_top(unsigned int b, float g) {
    const double top = (3.0 * ((double)e4m3_value(b) + (double)e4m3_value(b + 1u)) * (1.0 + 0x1p-20) + 0x1p-146) / (double)g + 0x1p-146;
    return min(half_ceil<DT>(top), half_max<DT>());
}

// The exact codes of magnitudes change at 7 boundaries: fl(w/f) ≥ t exactly when
// w ≥ (t − ulp(t)/2)·f, and fl(w/f) > t exactly when w > (t + ulp(t)/2)·f (ties go to t, whose
// mantissa is even), for the E2M1 thresholds t = 0.25 (>), 0.75 (≥), 1.25 (>), 1.75 (≥),
// 2.5 (>), 3.5 (≥), 5 (>); the products are exact in float64 (25 × 24 bits) and rounded up or
// down to the dtype's boundary. e2m1_mid is t ± ulp(t)/2 for the i-th threshold t,
// ulp(t) = 2^(exponent of t − 23): the float32 quotients from which fl(w/f) codes above t (a
// switch, not an array: ptxas keeps an array it does not fold on the stack).
__device__ __forceinline__ double e2m1_mid(int i) {
    switch (i) {
    case 0: return 0.25 + 0x1p-26;
    case 1: return 0.75 - 0x1p-25;
    case 2: return 1.25 + 0x1p-24;
    case 3: return 1.75 - 0x1p-24;
    case 4: return 2.5 + 0x1p-23;
    case 5: return 3.5 - 0x1p-23;
    default: return 5.0 + 0x1p-22;
    }
}

// nvfp4_reaches reports whether, with the factors r, rh, every weight from u[i] on codes above
// the i-th threshold for LO ≤ i < HI (u[i] past half_max: no weight does), and nvfp4_stays
// whether every weight below u[i] codes at most i and, when HI is 7, the largest weight a block
// holds (top) keeps x' < 7. Both are monotone in r and in rh (reaches rising, stays falling):
// the factors that pass both form an interval of each.
template <int DT, int LO, int HI>
__device__ __forceinline__ bool nvfp4_reaches(const unsigned int* u, float r, float rh) {
    bool ok = true;
#pragma unroll
    for (int i = LO; i < HI; i++) ok &= u[i] > half_max<DT>() || nvfp4_fast<DT>(u[i], r, rh) >= (unsigned int)i + 1u;
    return ok;
}
template <int DT, int LO, int HI>
__device__ __forceinline__ bool nvfp4_stays(const unsigned int* u, unsigned int top, float r, float rh) {
    bool ok = true;
    if (HI == 7) {
        const float w = half_value<DT>(top);
        ok = fmaxf(__fmul_rn(w, r), __fmaf_rn(w, rh, 0.5f)) < 7.0f;
    }
#pragma unroll
    for (int i = LO; i < HI; i++) ok &= nvfp4_fast<DT>(min(u[i] - 1u, half_max<DT>()), r, rh) <= (unsigned int)i;
    return ok;
}

// nvfp4_search looks for a factor v (r or rh, the other fixed) within REACH float steps of its
// value under which the fast code reaches and stays at the thresholds LO … HI − 1: v itself when
// it does, else by bisection the first factor above v that reaches, or the last below it that
// stays (the nearer end of the interval). It returns false when that end is out of reach or
// fails the other test (the interval is empty).
template <int DT, int LO, int HI, unsigned int REACH>
__device__ __forceinline__ bool nvfp4_search(const unsigned int* u, unsigned int top, float& r, float& rh, float& v) {
    const bool reaches = nvfp4_reaches<DT, LO, HI>(u, r, rh);
    if (reaches && nvfp4_stays<DT, LO, HI>(u, top, r, rh)) return true;
    // lo fails the test that v failed, hi passes it; bisection brings them next to each other.
    unsigned int lo = __float_as_uint(v), hi = reaches ? lo - REACH : lo + REACH;
    v = __uint_as_float(hi);
    if (!(reaches ? nvfp4_stays<DT, LO, HI>(u, top, r, rh) : nvfp4_reaches<DT, LO, HI>(u, r, rh))) return false;
    while (lo + 1u != hi && hi + 1u != lo) {
        const unsigned int mid = lo / 2u + hi / 2u + (lo & hi & 1u);
        v = __uint_as_float(mid);
        if (reaches ? nvfp4_stays<DT, LO, HI>(u, top, r, rh) : nvfp4_reaches<DT, LO, HI>(u, r, rh)) hi = mid;
        else lo = mid;
    }
    v = __uint_as_float(hi);
    return nvfp4_reaches<DT, LO, HI>(u, r, rh) && nvfp4_stays<DT, LO, HI>(u, top, r, rh);
}

// nvfp4_factor computes one factor of the NVEntry of scale byte b under G for 16-bit weights of
// dtype DT (BF16 or F16; the table of one is not the other's): r when R, else rh; 0 when the
// byte's blocks must take the general path.
//
// The fast code is monotone in w and so is the exact one, which changes at 7 boundaries u[i]
// (e2m1_mid rounded to the dtype): the fast code is exact for every weight of a block with this
// byte when it steps at the same 7 places (nvfp4_reaches, nvfp4_stays) and its x' stays below 7
// up to the block's largest possible weight (nvfp4_top). Nothing asks that r be 1/f, and the
// two factors are found apart: rh alone places the steps at 0.25 and 0.75 (for weights up to
// 0.76·f, w·rh + 0.5 ≥ 0.88 > w·r), r alone the five from 1.25 on and x' at the top (from 1.24·f
// on, w·rh + 0.5 < w·r), for any r and rh within 2^-17 of 1/f and 1/(2f), as the searches keep
// them. Each is searched near a starting point: exact ties w = t·f are common under a computed
// G = 2688/amax, where f = s·amax/2688 often has as few bits as the weights (E4M3 scale 1.75·2^k
// and a BF16 amax whose mantissa 3 divides: f is a BF16 number and 0.25·f, 0.75·f are weights).
// fl(w/f) sends ties at 0.25, 1.25, 2.5, 5 down and at 0.75, 1.75, 3.5 up, and a code that
// changes at the midpoint itself cannot follow both; with the change NVFP4_LATE steps late
// (x' ≥ t + 8 ulps, 7.5 ulps past the midpoint: relative 6·2^-23 at 1.25·2^k, 4.3·2^-23 at
// 1.75·2^k), factors a relative 4.3 to 6·2^-23 above 1/f send the ties of both kinds their way,
// and rh a relative 10 to 30·2^-23 above 1/(2f) the two at 0.25 and 0.75: the searches start
// in those windows (r at 1/f·(1 + 5·2^-23), rh at 1/(2f)·(1 + 20·2^-23)). r, where near ties
// move the interval a step or two from there, searches 8 steps either side; rh, whose interval
// then lies 10 to 20 steps away (near 10 or 30·2^-23, the ties at 0.75 or 0.25), 32. Byte 0x7e
// (448) also takes the blocks that saturate, so it is never cleared.
// NVFP4_SHIFT_R and NVFP4_SHIFT_RH move the searches' starting points by that many float steps
// (0 in the kernels), and NVFP4_RH_FAILS makes every rh search fail (0): the host harness builds
// such copies to test both directions of each search and the tables' handling of a failed rh.
#ifndef NVFP4_SHIFT_R
#define NVFP4_SHIFT_R 0
#define NVFP4_SHIFT_RH 0
#define NVFP4_RH_FAILS 0
#endif
template <int DT, bool R>
__device__ __forceinline__ float nvfp4_factor(unsigned int b, float g) {
    if (b == 0u || b >= 0x7eu) return 0.0f;  // byte 0 is never a block's (MinE4M3), 0x7f is NaN
    const float f = __fdiv_rn(e4m3_value(b), g);
    const float r0 = __frcp_rn(f);
    if (!(r0 >= 0x1p-124f && r0 <= 0x1p126f)) return 0.0f;  // every factor searched normal and finite
    constexpr int lo = R ? 2 : 0, hi = R ? 7 : 2;
    unsigned int u[7];
#pragma unroll
    for (int i = lo; i < hi; i++) {
        const double p = e2m1_mid(i) * (double)f;
        u[i] = (i & 1) ? half_ceil<DT>(p) : half_above<DT>(p);  // ≥ t: the first weight ≥ p; > t: > p
    }
    float r = __fmul_rn(r0, 1.0f + 5.0f * 0x1p-23f), rh = __fmul_rn(r0, 0.5f + 10.0f * 0x1p-23f);
    if constexpr (R) {
        r = __uint_as_float(__float_as_uint(r) + NVFP4_SHIFT_R);
        return nvfp4_search<DT, lo, hi, 8>(u, nvfp4_top<DT>(b, g), r, rh, r) ? r : 0.0f;
    } else {
        rh = __uint_as_float(__float_as_uint(rh) + NVFP4_SHIFT_RH);
        return !NVFP4_RH_FAILS && nvfp4_search<DT, lo, hi, 32>(u, 0u, r, rh, rh) ? rh : 0.0f;
    }
}

// nvfp4_entry is the NVEntry of scale byte b under G for 16-bit weights of dtype DT.
template <int DT>
__device__ __forceinline__ NVEntry nvfp4_entry(unsigned int b, float g) {
    NVEntry e;
    e.r = nvfp4_factor<DT, true>(b, g);
    e.rh = nvfp4_factor<DT, false>(b, g);
    if (e.rh == 0.0f) e.r = 0.0f;
    return e;
}

// nvfp4_table fills a thread block's NVFP4 table of the 128 scale bytes under G, for 16-bit
// weights of dtype DT: thread t finds r of byte t (t < 128) or rh of byte t − 128, and a byte
// whose rh search fails gets r = 0.
template <int DT>
__device__ __forceinline__ void nvfp4_table(NVEntry* table, float g) {
    static_assert(FP4_THREADS == 256, "a thread for each factor of each of the 128 bytes");
    const unsigned int b = threadIdx.x & 127u;
    float rh = 0.0f;
    if (threadIdx.x < 128u) table[b].r = nvfp4_factor<DT, true>(b, g);
    else table[b].rh = rh = nvfp4_factor<DT, false>(b, g);
    __syncthreads();
    if (threadIdx.x >= 128u && rh == 0.0f) table[b].r = 0.0f;
    __syncthreads();
}

// nvfp4_bf16_div6 is fl(amax/6) for a BF16 amax: the product by fl(1/6) corrected once by its
// residual; equal to the division for all 2^15 non-negative BF16 values (checked exhaustively).
__device__ __forceinline__ float nvfp4_bf16_div6(float amax) {
    const float inv6 = 0.16666667163372039794921875f;  // fl(1/6)
    const float q = __fmul_rn(amax, inv6);
    return __fmaf_rn(__fmaf_rn(-q, 6.0f, amax), inv6, q);
}

// nvfp4_half_codes codes a chunk of 16-bit weights of an NVFP4 block by its scale byte's entry
// (r ≠ 0) in the table of their dtype.
template <int DT>
__device__ __forceinline__ unsigned int nvfp4_half_codes(const Chunk<DT>& x, const NVEntry& e) {
    unsigned int mag = 0;
#pragma unroll
    for (int j = 3; j >= 0; j--) {
#pragma unroll
        for (int h = 1; h >= 0; h--) {  // weight 2j + h; the last one coded ends in nibble 0
            float w;
            if constexpr (DT == IN_BF16) w = fabsf(__uint_as_float(h ? x.u[j] & 0xffff0000u : x.u[j] << 16));
            else w = fabsf(half_value<DT>(h ? x.u[j] >> 16 : x.u[j] & 0xffffu));
            mag = __funnelshift_l(nvfp4_step(w, e.r, e.rh), mag, 4);  // mag·16 + code
        }
    }
    return signed_codes(x, mag);
}

// mxfp4_f16_codes codes a chunk of F16 weights of an MXFP4 block with scale byte e, in float32:
// x = |w|·2^(127−e) is exact (11 significant bits), and so is x' = max(x, 0.5·x + 0.5) (the map
// of mxfp4_bf16_codes, which F16 arithmetic would round for F16's 11 bits); with x' clamped to 6
// (x < 8: the block's amax is below 2^(e−124)), every code is x' rounded to one mantissa bit
// with ties to even: on its bits u, (u + 0x1fffff + bit 22 of u)·64 + 2^30 has the code in its
// top nibble (0.5 → 0, 6 → 7), which a funnel shift appends to the codes so far.
__device__ __forceinline__ unsigned int mxfp4_f16_codes(const Chunk<IN_F16>& x, unsigned int e) {
    const float r = __uint_as_float((254u - e) << 23);
    unsigned int mag = 0;
#pragma unroll
    for (int j = 3; j >= 0; j--) {
#pragma unroll
        for (int h = 1; h >= 0; h--) {  // weight 2j + h; the last one coded ends in nibble 0
            const float v = __fmul_rn(fabsf(half_value<IN_F16>(h ? x.u[j] >> 16 : x.u[j] & 0xffffu)), r);
            const unsigned int u = __float_as_uint(fminf(fmaxf(v, __fmaf_rn(v, 0.5f, 0.5f)), 6.0f));
            mag = __funnelshift_l((u + 0x1fffffu + ((u >> 22) & 1u)) * 64u + 0x40000000u, mag, 4);
        }
    }
    return signed_codes(x, mag);
}

// nvfp4_table_codes codes m chunks of 16-bit weights of one NVFP4 block whose fl(amax/6) is
// sixth by the scale table and returns true, or returns false when the table sends the block's
// scale byte to the general path.
template <int DT, int M>
__device__ __forceinline__ bool nvfp4_table_codes(const Chunk<DT>* x, float sixth, float g, const NVEntry* table,
                                                  unsigned int& byte, unsigned int* out) {
    unsigned int s = e4m3_byte(__fmul_rn(g, sixth));
    s = s == 0u ? 1u : s;
    const NVEntry e = table[s];
    if (e.r == 0.0f) return false;
    byte = s;
#pragma unroll
    for (int i = 0; i < M; i++) out[i] = nvfp4_half_codes<DT>(x[i], e);
    return true;
}

// fp4_chunks codes m chunks of one block whose absolute maximum has the finite float bits amax
// into out and sets byte to the block's scale byte: the 16-bit fast paths where they apply, else
// chunk_codes_general.
template <int DT, bool NV, int M>
__device__ __forceinline__ void fp4_chunks(const Chunk<DT>* x, unsigned int amax, float g, const NVEntry* table,
                                           unsigned int& byte, unsigned int* out) {
    if constexpr (DT == IN_BF16) {
        if constexpr (NV) {
            if (nvfp4_table_codes<DT, M>(x, nvfp4_bf16_div6(__uint_as_float(amax)), g, table, byte, out)) return;
        } else {
            const unsigned int e = (unsigned int)max((int)(amax >> 23) - 2, 0);
            if (e >= 3u) {
                byte = e;
#pragma unroll
                for (int i = 0; i < M; i++) out[i] = mxfp4_bf16_codes(x[i], e);
                return;
            }
        }
    } else if constexpr (DT == IN_F16) {
        if constexpr (NV) {  // fl(amax/6) by the division, once a block
            if (nvfp4_table_codes<DT, M>(x, __fdiv_rn(__uint_as_float(amax), 6.0f), g, table, byte, out)) return;
        } else {  // every F16 block: x' < 8 is exact in float32 whatever the scale
            const unsigned int e = (unsigned int)max((int)(amax >> 23) - 2, 0);
            byte = e;
#pragma unroll
            for (int i = 0; i < M; i++) out[i] = mxfp4_f16_codes(x[i], e);
            return;
        }
    }
    if constexpr (DT != IN_F16 || NV) {
#pragma unroll
        for (int i = 0; i < M; i++) out[i] = chunk_codes_general<DT, NV>(x[i], amax, g, byte);
    }
}

// load_pair loads pair p (chunks 2p and 2p + 1) into x when p < pairs, else leaves x zero.
template <int DT>
__device__ __forceinline__ void load_pair(const void* w, unsigned int p, unsigned int pairs, Chunk<DT>* x) {
    x[0] = Chunk<DT>{};
    x[1] = Chunk<DT>{};
    if (p < pairs) {
        load_chunk<DT>(w, 2 * p, x[0]);
        load_chunk<DT>(w, 2 * p + 1, x[1]);
    }
}

// pair_absmax is the float32 bits of the largest magnitude of a pair of 16-bit chunks.
template <int DT>
__device__ __forceinline__ unsigned int pair_absmax(const Chunk<DT>* x) {
    if constexpr (DT == IN_BF16) {
        return bf16_absmax_bits(bf16x2_max_nan(bf16x2_absmax(x[0]), bf16x2_absmax(x[1])));
    } else {
        unsigned int m = 0;
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) m = f16x2_max_nan(m, x[i].u[j] & 0x7fff7fffu);
        return absmax_bits<DT>(m);
    }
}

// code_pair codes pair p (x, its 16 weights) of fp4_half_loop.
template <int DT, bool NV>
__device__ __forceinline__ void code_pair(const Chunk<DT>* x, unsigned int p, unsigned int pairs, float g, const NVEntry* table,
                                          unsigned int* codes, unsigned char* scales, u64* status) {
    unsigned int amax = pair_absmax<DT>(x);
    if (!NV) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // an MXFP4 block is two lanes'
    if (p >= pairs) return;
    if (amax >= 0x7f800000u) {  // a non-finite weight in the block: report it; codes do not matter
        report_bad<DT>(x[0], 2 * p, status);
        report_bad<DT>(x[1], 2 * p + 1, status);
        return;
    }
    unsigned int byte, out[2];
    fp4_chunks<DT, NV, 2>(x, amax, g, table, byte, out);
    reinterpret_cast<uint2*>(codes)[p] = make_uint2(out[0], out[1]);
    if (NV) scales[p] = (unsigned char)byte;
    else if ((p & 1) == 0) scales[p / 2] = (unsigned char)byte;
}

// fp4_half_loop is fp4_kernel's loop for BF16 and F16: a lane takes 16 consecutive weights (a pair of
// chunks, 32 bytes: a whole NVFP4 block, half an MXFP4 one), a warp 512 weights in a row per
// step, so that NVFP4's block work is done once per block and the codes leave as one 8-byte
// store. NVFP4 loads the next step's pair before it codes this one, so that each lane keeps 32
// bytes in flight while it computes: its kernels run 4 blocks of 256 threads a multiprocessor
// (63 registers), MXFP4's 8 (40 registers with that prefetch, which would leave room for 6).
template <int DT, bool NV>
__device__ __forceinline__ void fp4_half_loop(const void* w, unsigned int n, float g, const NVEntry* table,
                                              unsigned int* codes, unsigned char* scales, u64* status) {
    const unsigned int lane = threadIdx.x & 31, pairs = n / 2;  // n is even (NVFP4) or a multiple of 4
    const unsigned int step = gridDim.x * FP4_THREADS;
    unsigned int p0 = blockIdx.x * FP4_THREADS + (threadIdx.x & ~31u);
    Chunk<DT> x[2];
    if constexpr (NV) {
        Chunk<DT> next[2];
        load_pair<DT>(w, p0 + lane, pairs, x);
        for (; p0 < pairs; p0 += step) {
            load_pair<DT>(w, p0 + step + lane, pairs, next);
            code_pair<DT, NV>(x, p0 + lane, pairs, g, table, codes, scales, status);
            x[0] = next[0];
            x[1] = next[1];
        }
    } else {
        for (; p0 < pairs; p0 += step) {
            load_pair<DT>(w, p0 + lane, pairs, x);
            code_pair<DT, NV>(x, p0 + lane, pairs, g, table, codes, scales, status);
        }
    }
}

// fp4_kernel quantizes the chunks of W. amax_or_g holds G when have_g, else the bits of
// amax(W) (bw_fp4_amax's result); NVFP4 writes the G it used to global_out. BF16 and F16 take
// fp4_half_loop; for F32 a warp handles two runs of 32 chunks per step, so that each
// lane has two loads in flight, and the 2 (NVFP4) or 4 (MXFP4) lanes of a block reduce its
// absolute maximum with xor shuffles.
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
    __shared__ NVEntry table[NV && DT != IN_F32 ? 128 : 1];
    __shared__ NVScale f32_scales[NV && DT == IN_F32 ? 128 : 1];
    if constexpr (NV && DT != IN_F32) {
        nvfp4_table<DT>(table, g);
    } else if constexpr (NV) {
        if (threadIdx.x < 128u) f32_scales[threadIdx.x] = nvfp4_scale(threadIdx.x, g);  // bytes 0 and 127: never a block's
        __syncthreads();
    }
    const unsigned int n = (unsigned int)chunks;  // < 2^31 (checkFP4Job): no index below wraps
    if constexpr (DT != IN_F32) {
        fp4_half_loop<DT, NV>(w, n, g, table, codes, scales, status);
        return;
    }
    const unsigned int warps = gridDim.x * (FP4_THREADS / 32);
    for (unsigned int wc = blockIdx.x * (FP4_THREADS / 32) + (threadIdx.x >> 5); wc * 32 < n; wc += runs * warps) {
        Chunk<DT> x[runs];
        unsigned int amax[runs], c[runs];
#pragma unroll
        for (int i = 0; i < runs; i++) {
            c[i] = (wc + i * warps) * 32 + lane;
            x[i] = Chunk<DT>{};
            if (c[i] < n) load_chunk<DT>(w, c[i], x[i]);
            amax[i] = chunk_absmax<DT>(x[i]);  // 0 past the end
        }
#pragma unroll
        for (int i = 0; i < runs; i++) {
            // Every lane shuffles, live or not: chunks is even (NVFP4) or a multiple of 4, so a
            // block's lanes are all live or all past the end.
#pragma unroll
            for (int off = 1; off < lanes_per_block; off <<= 1) amax[i] = max(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], off));
            if (c[i] >= n) continue;
            if (amax[i] >= 0x7f800000u) {  // a non-finite weight in the block: report it; codes do not matter
                report_bad<DT>(x[i], c[i], status);
                continue;
            }
            unsigned int byte;
            if constexpr (NV) {  // the general path, its f and r from the table
                byte = nvfp4_byte(__uint_as_float(amax[i]), g);
                codes[c[i]] = chunk_codes<DT, NV>(x[i], nvfp4_block(byte, f32_scales[byte]));
            } else {
                fp4_chunks<DT, NV, 1>(&x[i], amax[i], g, table, byte, &codes[c[i]]);
            }
            if ((lane & (lanes_per_block - 1)) == 0) scales[c[i] / lanes_per_block] = (unsigned char)byte;
        }
    }
}

// FP4_AMAX_LOADS is how many independent 16-byte loads a thread of fp4_amax_kernel has in
// flight per tile: a tile is FP4_AMAX_LOADS·FP4_THREADS vectors (32 KiB), and 4 to 8 blocks of
// a multiprocessor keep 128 to 256 KiB in flight, several times what the memory's latency needs
// at full bandwidth. blockwise.fp4AmaxBlocks sizes the grid by it.
#define FP4_AMAX_LOADS 8

// vec_absmax folds the magnitudes of a 16-byte vector (8 BF16/F16 or 4 F32 weights) into m: for
// 16-bit weights both halves of m at once (packed max.NaN of the sign-cleared weights, NaN kept
// as 0x7fff), for F32 one word (non-negative floats order as their bits, NaN's above Inf's).
template <int DT>
__device__ __forceinline__ unsigned int vec_absmax(unsigned int m, const uint4& v) {
    if constexpr (DT == IN_F32) {
        return max(max(m, max(v.x & 0x7fffffffu, v.y & 0x7fffffffu)), max(v.z & 0x7fffffffu, v.w & 0x7fffffffu));
    } else if constexpr (DT == IN_BF16) {
        const unsigned int a = bf16x2_max_nan(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu);
        return bf16x2_max_nan(bf16x2_max_nan(m, a), bf16x2_max_nan(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu));
    } else {
        const unsigned int a = f16x2_max_nan(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu);
        return f16x2_max_nan(f16x2_max_nan(m, a), f16x2_max_nan(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu));
    }
}

// fp4_amax_kernel raises *amax_bits to the bits of max |w| over W (float bits order like the
// values; a non-finite weight gives bits ≥ 0x7f800000, which the quantization kernel reports).
// W is read as 16-byte vectors (a chunk is 1, 2 for F32) in tiles of FP4_AMAX_LOADS·FP4_THREADS:
// a block takes whole tiles (grid-stride), thread t loads vectors t, t + 256, … of its tile, so
// each load of a warp is 512 contiguous bytes at a constant offset from one address, and all
// of them are in flight before the first is used. The last, partial tile is spread over the
// grid one vector a thread. The thread block reduces its threads' maxima (shuffles, then shared
// memory) and raises the word once. Indices are 64-bit: an F32 tensor of 2^31 chunks has 2^32
// vectors.
template <int DT>
__device__ __forceinline__ void fp4_amax_kernel(const void* w, u64 chunks, unsigned int* amax_bits) {
    constexpr unsigned int tile = FP4_AMAX_LOADS * FP4_THREADS;
    const uint4* v = (const uint4*)w;
    const u64 vecs = DT == IN_F32 ? 2 * chunks : chunks, tiles = vecs / tile;
    unsigned int m = 0;
    for (u64 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const uint4* p = v + t * tile + threadIdx.x;
        uint4 x[FP4_AMAX_LOADS];
#pragma unroll
        for (int l = 0; l < FP4_AMAX_LOADS; l++) x[l] = __ldg(p + l * FP4_THREADS);
#pragma unroll
        for (int l = 0; l < FP4_AMAX_LOADS; l++) m = vec_absmax<DT>(m, x[l]);
    }
    for (u64 i = tiles * tile + (u64)blockIdx.x * FP4_THREADS + threadIdx.x; i < vecs; i += (u64)gridDim.x * FP4_THREADS)
        m = vec_absmax<DT>(m, __ldg(v + i));
    m = absmax_bits<DT>(m);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    __shared__ unsigned int warp_max[FP4_THREADS / 32];
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < FP4_THREADS / 32 ? warp_max[threadIdx.x] : 0u;
#pragma unroll
        for (int off = FP4_THREADS / 64; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (threadIdx.x == 0 && m != 0u) atomicMax(amax_bits, m);
    }
}

#define FP4_PARAMS                                                                                     \
    const void *w, u64 chunks, const unsigned int *amax_or_g, int have_g, unsigned int *codes,          \
        unsigned char *scales, float *global_out, u64 *status
#define FP4_ARGS w, chunks, amax_or_g, have_g, codes, scales, global_out, status

// The NVFP4 kernels promise 4 resident blocks of 256 threads (at most 64 registers): the host
// launches one wave of 4 a multiprocessor (blockwise.fp4NVFP4BlocksPerSM).
#define FP4_ENTRIES(suffix, DTV)                                                                       \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS, 4) bw_fp4_nvfp4##suffix(FP4_PARAMS) {    \
        fp4_kernel<DTV, true>(FP4_ARGS);                                                               \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS) bw_fp4_mxfp4##suffix(FP4_PARAMS) {       \
        fp4_kernel<DTV, false>(FP4_ARGS);                                                              \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FP4_THREADS, 8)                                       \
        bw_fp4_amax##suffix(const void* w, u64 chunks, unsigned int* amax_bits) {                      \
        fp4_amax_kernel<DTV>(w, chunks, amax_bits);                                                    \
    }
FP4_ENTRIES(_bf16, IN_BF16)
FP4_ENTRIES(_f16, IN_F16)
FP4_ENTRIES(_f32, IN_F32)
