// Block-wise round-to-nearest quantization of W[N, K] (BF16, F16 or F32, row-major) straight
// into a packed layout, launched by blockwise.GPUQuantizer. Every kernel reproduces the pure-Go
// reference bit for bit (blockwise.Quantize, then packing's GPTQ or QPack Pack); see the
// package comment of blockwise for the formulas. All divisions are true float32 divisions
// (__fdiv_rn), rounding is half to even (rintf), binary means are float64 sums in input order.
//
// Work split. A tile is 32 rows × 256 columns; each lane holds one 8-element chunk of a row
// (one 16-byte load of BF16/F16), a warp one row of the tile at a time (4 rows per warp). A
// block of 256 threads loops over tiles (a persistent grid of 3 blocks per SM) and loads its
// next tile before it works on the current one. 8 codes of b bits are exactly b bytes
// of both layouts' bitstreams:
//   qpack (codes U8 [N, ceil(K·b/8)], each row a little-endian bitstream) is written directly;
//   GPTQ  (qweight I32 [K·b/32, N], column n a bitstream along K) is staged per row in shared
//         memory and written transposed, so that a warp stores 32 consecutive columns.
// Fused kernels (bw_fused_*) fit each group in registers: a group of G = 8·S columns is S
// consecutive lanes (S a power of two ≤ 32), reduced with xor shuffles. Other group sizes
// (per-channel, 96, 512, …) and the binary grid, whose float64 means must be summed in order,
// first run a parameter kernel (bw_params, bw_params_bin) and then bw_encode_*.
// Scales go straight to their layout; integer zero points go to a byte per (row, group) that
// bw_pack_zeros packs into GPTQ's qzeros or qpack's zeros afterwards.
// For 16-bit inputs, integer 2/3/4/8-bit and NF4 groups of 32, 64 and 128 (K a multiple of 128)
// run on bw_piece_* (a warp per 16 rows × 128 columns, both layouts; the hottest case, GPTQ int4
// with groups of 128, among them), binary groups of 32, 64 and 128 on bw_bin_* (a lane per group, summed in order), and
// per-channel groups of rows up to 6144 columns on bw_rowpc_* (a row per warp, in registers);
// these read the input once, where the tile kernels above are what remains for F32 and the
// other group sizes and shapes.
// Integer codes are computed without a division per weight: int_round_exact for 16-bit inputs,
// int_code_fast with a division fallback near rounding ties for F32 (see recip_int).
// Machine code for the H100 and H200 ships beside the PTX, so that they skip the JIT (≈ 4 s):
// qpack-cubin: sm_90
#include <cuda_fp16.h>

#define WARPS 8
#define THREADS (32 * WARPS)
#define TILE_ROWS 32
#define TILE_COLS 256
#define ROWS_PER_WARP (TILE_ROWS / WARPS)
#define MAX_STAGE_WORDS (8 * 8 + 1)  // one row's 256 codes of 8 bits, plus one word against bank conflicts

enum { IN_BF16 = 0, IN_F16 = 1, IN_F32 = 2 };
enum { LAYOUT_GPTQ = 0, LAYOUT_QPACK = 1 };
enum { GRID_INT = 0, GRID_NF4 = 1, GRID_BIN = 2 };

typedef unsigned long long u64;

__device__ __forceinline__ bool non_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

__device__ __forceinline__ float load_one(const void* w, int dtype, u64 i) {
    if (dtype == IN_F32) return __ldg((const float*)w + i);
    unsigned short h = __ldg((const unsigned short*)w + i);
    if (dtype == IN_BF16) return __uint_as_float((unsigned int)h << 16);
    return __half2float(__ushort_as_half(h));
}

// Raw is one 8-element chunk as loaded: 4 words of BF16/F16 pairs or 8 words of F32.
template <int DT>
struct Raw {
    unsigned int u[DT == IN_F32 ? 8 : 4];
};

// load_raw reads the `valid` (0..8) weights starting at flat index i; the rest become 0,
// which no group statistic of the integer or NF4 grids notices (their ranges include 0).
// vec: 16-byte loads are aligned (K is a multiple of 8).
template <int DT>
__device__ __forceinline__ void load_raw(const void* w, u64 i, int valid, bool vec, Raw<DT>& x) {
    if (valid == 8 && vec) {
        if constexpr (DT == IN_F32) {
            const uint4* p = (const uint4*)((const float*)w + i);
            const uint4 a = __ldg(p), b = __ldg(p + 1);
            x.u[0] = a.x; x.u[1] = a.y; x.u[2] = a.z; x.u[3] = a.w;
            x.u[4] = b.x; x.u[5] = b.y; x.u[6] = b.z; x.u[7] = b.w;
        } else {
            const uint4 a = __ldg((const uint4*)((const unsigned short*)w + i));
            x.u[0] = a.x; x.u[1] = a.y; x.u[2] = a.z; x.u[3] = a.w;
        }
        return;
    }
    if constexpr (DT == IN_F32) {
#pragma unroll
        for (int j = 0; j < 8; j++) x.u[j] = j < valid ? __float_as_uint(__ldg((const float*)w + i + j)) : 0u;
    } else {
        const unsigned short* h = (const unsigned short*)w + i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int lo = 2 * j < valid ? __ldg(h + 2 * j) : 0u;
            const unsigned int hi = 2 * j + 1 < valid ? __ldg(h + 2 * j + 1) : 0u;
            x.u[j] = lo | hi << 16;
        }
    }
}

// raw_at is element j (a compile-time constant in unrolled loops) of a chunk, as float32.
template <int DT>
__device__ __forceinline__ float raw_at(const Raw<DT>& x, int j) {
    if constexpr (DT == IN_F32) {
        return __uint_as_float(x.u[j]);
    } else {
        const unsigned int word = x.u[j >> 1];
        const unsigned short h = (j & 1) ? (unsigned short)(word >> 16) : (unsigned short)(word & 0xffffu);
        if constexpr (DT == IN_BF16) return __uint_as_float((unsigned int)h << 16);
        else return __half2float(__ushort_as_half(h));
    }
}

// int_range turns a group's range (both ends already include 0) into the one its integer grid
// spans: symmetric about 0 for sym, [−1, 1] when all zero (quant.Scheme.IntParamsRange).
__device__ __forceinline__ void int_range(float& xmin, float& xmax, int sym) {
    if (sym) {
        xmax = fmaxf(-xmin, xmax);
        if (xmin < 0.0f) xmin = -xmax;
    }
    if (xmin == 0.0f && xmax == 0.0f) {
        xmin = -1.0f;
        xmax = 1.0f;
    }
}

// Integer grid parameters from the group's range (both ends already include 0):
// quant.Scheme.IntParamsRange.
__device__ __forceinline__ void int_params(float xmin, float xmax, int sym, int maxq, __half* scale_h, float* scale, float* zero) {
    int_range(xmin, xmax, sym);
    __half h = __float2half_rn(__fdiv_rn(xmax - xmin, (float)maxq));
    if (__half2float(h) == 0.0f) h = __ushort_as_half((unsigned short)1);
    *scale_h = h;
    *scale = __half2float(h);
    *zero = sym ? (float)((maxq + 1) / 2) : fminf(fmaxf(rintf(__fdiv_rn(-xmin, *scale)), 0.0f), (float)maxq);
}

// Integer codes without a division per weight; blockwise/reciprocal_test.go derives the bound,
// mirrors this arithmetic and checks it against the reference. x = w·r with r = 1/scale
// correctly rounded is within 3.0001·2^-24·|x| of the quotient fl(w/scale), so both round to
// the same integer unless x lies that close to a half-integer. x + ROUND_MAGIC rounds x to an
// integer, ties to even (exact for |x| < 2^22); the distance of x to that integer is exact, and
// a weight whose distance to the half-integer is at most RECIP_MARGIN·X (X ≥ |x| for every
// weight it is applied to), or whose x is not finite, or of a group with X ≥ RECIP_LIMIT, is
// redone with int_code.
#define ROUND_MAGIC 12582912.0f             // 1.5·2^23
#define RECIP_MARGIN 4.76837158203125e-07f  // 2^-21
#define RECIP_LIMIT 2097152.0f              // 2^21

struct RecipInt {
    float r, cutoff, nlo, nhi, magic_zero, scale;
    bool safe;  // |w·r| < RECIP_LIMIT for the whole group (false when not finite): int_round_exact applies
};

// recip_int prepares int_round_fast for a group with scale, zero point and max |w| absw.
__device__ __forceinline__ RecipInt recip_int(float scale, float zero, int maxq, float absw) {
    RecipInt p;
    p.r = __frcp_rn(scale);
    const float absx = __fmul_rn(absw, p.r);
    const float thresh = absx < RECIP_LIMIT ? __fmul_rn(absx, RECIP_MARGIN) : __int_as_float(0x7f800000);
    p.cutoff = __fsub_rn(0.5f, thresh);
    p.nlo = -zero;
    p.nhi = __fsub_rn((float)maxq, zero);
    p.magic_zero = __fadd_rn(ROUND_MAGIC, zero);
    p.scale = scale;
    p.safe = absx < RECIP_LIMIT;
    return p;
}

// int_round_fast returns clamp(round(w/scale), −zero, maxq − zero) (the code minus the zero
// point, an integer-valued float), or clears ok when w must be redone with int_code.
__device__ __forceinline__ float int_round_fast(float w, const RecipInt& p, bool& ok) {
    const float x = __fmul_rn(w, p.r);
    const float n = __fsub_rn(__fadd_rn(x, ROUND_MAGIC), ROUND_MAGIC);
    ok &= fabsf(__fsub_rn(x, n)) < p.cutoff;
    return fminf(fmaxf(n, p.nlo), p.nhi);
}

// int_code_fast is the code itself: the low bits of n + zero + ROUND_MAGIC.
__device__ __forceinline__ unsigned int int_code_fast(float w, const RecipInt& p, bool& ok) {
    return __float_as_uint(__fadd_rn(int_round_fast(w, p, ok), p.magic_zero)) - __float_as_uint(ROUND_MAGIC);
}

// Weights of 16-bit inputs (BF16, F16) need no check and no slow path: quotient_exact returns
// fl(w/scale) without a division. x = fl(w·r) is a faithful quotient, so its remainder w − x·scale
// is exact in one FMA, and x + remainder·r rounded once is the correctly rounded quotient
// (Markstein's theorem; r is the correctly rounded reciprocal). int_round_exact then rounds it to
// an integer, ties to even, as rintf does; the NF4 kernels compare it with the thresholds. The GPU
// test TestGPURoundExactExhaustive checks both (the integer and the NF4 code) on every finite BF16
// and F16 weight against every finite F16 scale with |w·r| < RECIP_LIMIT (the group's
// RecipInt.safe; other groups take the division).
__device__ __forceinline__ float quotient_exact(float w, const RecipInt& p) {
    const float x = __fmul_rn(w, p.r);
    return __fmaf_rn(__fmaf_rn(-x, p.scale, w), p.r, x);
}

__device__ __forceinline__ float int_round_exact(float w, const RecipInt& p) {
    return __fsub_rn(__fadd_rn(quotient_exact(w, p), ROUND_MAGIC), ROUND_MAGIC);
}

// int_code_exact is the code of a 16-bit input's weight: clamp(round(w/scale) + zero, 0, maxq).
__device__ __forceinline__ unsigned int int_code_exact(float w, const RecipInt& p) {
    const float n = fminf(fmaxf(int_round_exact(w, p), p.nlo), p.nhi);
    return __float_as_uint(__fadd_rn(n, p.magic_zero)) - __float_as_uint(ROUND_MAGIC);
}

// div_const is x / C for x ≥ 0 (C = 2^b − 1), correctly rounded, without a division: the product
// by the rounded reciprocal is faithful, and Markstein's correction (its remainder exact in an
// FMA) rounds it correctly. TestKernelsOnCPU's divcheck compares it with the division on every
// finite float32 x ≥ 0 for C = 3, 7, 15, 255 (Inf gives NaN: a scale out of F16's range either way).
template <int C>
__device__ __forceinline__ float div_const(float x) {
    constexpr float r = 1.0f / C;
    const float q = __fmul_rn(x, r);
    return __fmaf_rn(__fmaf_rn(-q, (float)C, x), r, q);
}

// int_params16 is int_params and recip_int for a group of 16-bit weights (the range's ends are
// weights or 0), with no division where the group is safe: (xmax − xmin)/maxq by div_const, the
// zero point's −xmin/scale by quotient_exact (xmin is a 16-bit weight and |xmin| ≤ absw, see
// TestGPURoundExactExhaustive); an unsafe group divides.
template <int MAXQ>
__device__ __forceinline__ RecipInt int_params16(float xmin, float xmax, int sym, float absw, __half* scale_h, float* scale, float* zero) {
    int_range(xmin, xmax, sym);
    __half h = __float2half_rn(div_const<MAXQ>(xmax - xmin));
    if (__half2float(h) == 0.0f) h = __ushort_as_half((unsigned short)1);
    *scale_h = h;
    *scale = __half2float(h);
    RecipInt p = recip_int(*scale, 0.0f, MAXQ, absw);
    float z = (float)((MAXQ + 1) / 2);
    if (!sym) z = fminf(fmaxf(rintf(p.safe ? quotient_exact(-xmin, p) : __fdiv_rn(-xmin, *scale)), 0.0f), (float)MAXQ);
    *zero = z;
    p.nlo = -z;
    p.nhi = __fsub_rn((float)MAXQ, z);
    p.magic_zero = __fadd_rn(ROUND_MAGIC, z);
    return p;
}

// int_code is the reference formula with the true division.
__device__ __forceinline__ unsigned int int_code(float w, float scale, float zero, int maxq) {
    return (unsigned int)fminf(fmaxf(rintf(__fdiv_rn(w, scale)) + zero, 0.0f), (float)maxq);
}

// NF4 scale from the group's absolute maximum: quant.NF4Scale.
__device__ __forceinline__ void nf4_params(float absmax, __half* scale_h, float* scale) {
    __half h = __float2half_rn(absmax);
    if (absmax == 0.0f) h = __float2half_rn(1.0f);
    else if (__half2float(h) == 0.0f) h = __ushort_as_half((unsigned short)1);
    *scale_h = h;
    *scale = __half2float(h);
}

// nf4_code counts the thresholds x exceeds (quant.NF4Code), as a 4-step binary search whose
// candidates are picked with selects from registers.
__device__ __forceinline__ unsigned int nf4_code(float x, const float t[15]) {
    unsigned int c = x > t[7] ? 8u : 0u;
    c += x > ((c & 8) ? t[11] : t[3]) ? 4u : 0u;
    float b0 = (c & 8) ? t[9] : t[1], b1 = (c & 8) ? t[13] : t[5];
    c += x > ((c & 4) ? b1 : b0) ? 2u : 0u;
    float d00 = (c & 8) ? t[8] : t[0], d01 = (c & 8) ? t[10] : t[2];
    float d10 = (c & 8) ? t[12] : t[4], d11 = (c & 8) ? t[14] : t[6];
    float d0 = (c & 4) ? d10 : d00, d1 = (c & 4) ? d11 : d01;
    c += x > ((c & 2) ? d1 : d0) ? 1u : 0u;
    return c;
}

// NF4 codes by table (bw_piece_nf4_*, about half the instructions of nf4_code's search): the
// quotient x in [−1, 1] falls in one of 32 buckets of width 1/15, b = 16 + round(15x); no bucket
// holds two thresholds (the closest two, t7 and t8, are 0.0805 apart), so with base_b the number of
// thresholds below bucket b, the code is base_b + (x > t[base_b]). Lane b of each warp holds
// bucket b's base and threshold (nf4_bucket), and two shuffles fetch them for a weight. x beyond
// ±1 has the code of ±1 (t0 > −1, t14 < 1): CLAMP clamps it, which a group whose F16 scale is
// normal does not need (|x| ≤ 1 + 2^-10 stays in buckets 1–31); subnormal scales round absmax by
// up to half, x up to 1.5. TestGPURoundExactExhaustive checks both variants against the division.
__device__ __forceinline__ void nf4_bucket(const float (&t)[15], float& thr, unsigned int& base) {
    // bucket b is x in [(b − 16.5)/15, (b − 15.5)/15]; lo lies below it, with a margin
    const float lo = __fsub_rn(__fdiv_rn(__fsub_rn((float)(threadIdx.x & 31), 16.5f), 15.0f), 1e-3f);
    base = 0;
#pragma unroll
    for (int i = 0; i < 15; i++) base += t[i] < lo ? 1u : 0u;
    thr = __int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < 15; i++) thr = base == (unsigned int)i ? t[i] : thr;
}

// nf4_bucket_of is x's bucket in its low 5 bits: the bits of 2^23·1.5 + 16 + round(15x).
template <bool CLAMP>
__device__ __forceinline__ int nf4_bucket_of(float x) {
    return __float_as_int(__fmaf_rn(CLAMP ? fminf(fmaxf(x, -1.0f), 1.0f) : x, 15.0f, ROUND_MAGIC + 16.0f));
}

// nf4_code_in is the code of x in a bucket with this base and threshold: x > thr is the sign of
// thr − x (as quant.NF4Code has it: no threshold is 0, and the difference of finite floats is 0
// only when they are equal), a subtraction and a shift, no predicate.
__device__ __forceinline__ unsigned int nf4_code_in(float x, float thr, unsigned int base) {
    return base + (__float_as_uint(__fsub_rn(thr, x)) >> 31);
}

template <bool CLAMP>
__device__ __forceinline__ unsigned int nf4_code_table(float x, float thr, unsigned int base) {
    const int b = nf4_bucket_of<CLAMP>(x);
    return nf4_code_in(x, __shfl_sync(0xffffffffu, thr, b), __shfl_sync(0xffffffffu, base, b));
}

__device__ __forceinline__ void store_scale(unsigned short* scales, int layout, int r, int g, int n_rows, int groups, __half h) {
    u64 i = layout == LAYOUT_GPTQ ? (u64)g * n_rows + r : (u64)r * groups + g;
    scales[i] = __half_as_ushort(h);
}

// write_piece stores the `bytes` low bytes of piece at p, with the widest aligned stores.
__device__ __forceinline__ void write_piece(unsigned char* p, u64 piece, int bytes) {
    unsigned long long addr = (unsigned long long)p;
    if (bytes == 4 && (addr & 3) == 0) {
        *(unsigned int*)p = (unsigned int)piece;
    } else if (bytes == 8 && (addr & 3) == 0) {
        ((unsigned int*)p)[0] = (unsigned int)piece;
        ((unsigned int*)p)[1] = (unsigned int)(piece >> 32);
    } else if (bytes == 2 && (addr & 1) == 0) {
        *(unsigned short*)p = (unsigned short)piece;
    } else {
        for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(piece >> (8 * i));
    }
}

// Arguments shared by the fused and encode kernels.
//   gsize: columns per group (K for per-channel); groups: ceil(K / gsize)
//   codes: qweight (GPTQ) or qpack codes; scales: F16 in the layout's order
//   zbytes: zero point per (row, group), u8 [N·groups] (integer grid; written by the fused
//           kernels and bw_params, read by bw_encode_int)
//   pscale, poffset: float32 scale and binary offset per (row, group) from the parameter kernels
//   nf4t: the 15 NF4 thresholds (quant.NF4Thresholds)
//   status[0]: lowest flat index of a NaN/Inf weight; status[1]: lowest row·groups + group whose
//   scale or offset is not finite in F16. Both start at ~0 (uploaded with the input).
#define ENCODE_PARAMS                                                                              \
    const void *w, int dtype, int n_rows, int k, int gsize, int groups, int bits, int sym, int layout, \
        unsigned char *codes, unsigned short *scales, unsigned char *zbytes, const float *pscale,     \
        const float *poffset, const float *nf4t, u64 *status
#define ENCODE_ARGS w, dtype, n_rows, k, gsize, groups, bits, sym, layout, codes, scales, zbytes, pscale, poffset, nf4t, status

// load_tile loads this lane's chunk of the tile's rows for warp `warp`.
template <int DT>
__device__ __forceinline__ void load_tile(const void* w, int n_rows, int k, int tile, int tiles_x, bool vec, Raw<DT> x[ROWS_PER_WARP]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k0 = (tile % tiles_x) * TILE_COLS, n0 = (tile / tiles_x) * TILE_ROWS;
    const int kk = k0 + 8 * lane;
    const int valid = max(0, min(8, k - kk));
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; i++) {
        const int r = n0 + warp + WARPS * i;
        load_raw<DT>(w, (u64)r * k + kk, r < n_rows ? valid : 0, vec, x[i]);
    }
}

// process_tile quantizes and packs one loaded tile.
template <int GRID, bool FUSED, int DT>
__device__ __forceinline__ void process_tile(ENCODE_PARAMS, int tile, int tiles_x, const Raw<DT> x[ROWS_PER_WARP],
                                             const float t[15], unsigned int* stage) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k0 = (tile % tiles_x) * TILE_COLS, n0 = (tile / tiles_x) * TILE_ROWS;
    const int chunk = k0 / 8 + lane, kk = 8 * chunk;
    const int valid = max(0, min(8, k - kk));
    const int maxq = (1 << bits) - 1;
    const int seg = gsize >> 3;  // lanes per group (fused kernels only)
    const int g = kk / gsize;
    const int stride = 8 * bits + 1;
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; i++) {
        const int r = n0 + warp + WARPS * i;
        const int nv = r < n_rows ? valid : 0;
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = raw_at<DT>(x[i], j);
        unsigned int bad = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) bad |= (non_finite(v[j]) ? 1u : 0u) << j;
        if (bad) atomicMin(status, (u64)r * k + kk + __ffs(bad) - 1);

        float scale = 1.0f, zero = 0.0f, offset = 0.0f;
        float absw = 0.0f;  // bounds |v[j]|: the group's when fused, else this chunk's
        if (FUSED) {
            float lo = 0.0f, hi = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                lo = fminf(lo, v[j]);
                hi = fmaxf(hi, v[j]);
            }
            for (int off = seg >> 1; off > 0; off >>= 1) {
                lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
                hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
            }
            absw = fmaxf(-lo, hi);
            __half h;
            if (GRID == GRID_INT) int_params(lo, hi, sym, maxq, &h, &scale, &zero);
            else nf4_params(fmaxf(-lo, hi), &h, &scale);
            if (nv > 0 && (lane & (seg - 1)) == 0) {
                store_scale(scales, layout, r, g, n_rows, groups, h);
                if (GRID == GRID_INT && !sym) zbytes[(u64)r * groups + g] = (unsigned char)zero;
                if (non_finite(scale)) atomicMin(status + 1, (u64)r * groups + g);
            }
        } else if (nv > 0) {
            const u64 pi = (u64)r * groups + g;
            scale = pscale[pi];
            if (GRID == GRID_INT) zero = sym ? (float)((maxq + 1) / 2) : (float)zbytes[pi];
            if (GRID == GRID_BIN) offset = poffset[pi];
        }

        unsigned int icode[8];
        if (GRID == GRID_INT) {
            if (!FUSED) {
#pragma unroll
                for (int j = 0; j < 8; j++) absw = fmaxf(absw, fabsf(v[j]));
            }
            const RecipInt p = recip_int(scale, zero, maxq, absw);
            bool ok = true;
            if constexpr (DT == IN_F32) {
#pragma unroll
                for (int j = 0; j < 8; j++) icode[j] = int_code_fast(v[j], p, ok);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) icode[j] = int_code_exact(v[j], p);
                ok = p.safe;
            }
            if (!ok) {
#pragma unroll
                for (int j = 0; j < 8; j++) icode[j] = int_code(v[j], scale, zero, maxq);
            }
        }
        unsigned int lo_codes = 0, hi_codes = 0;  // codes 0-3 and 4-7, each packed from bit 0
#pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned int code = 0;
            if (j < nv) {
                const float x = v[j];
                if (GRID == GRID_INT) {
                    code = icode[j];
                } else if (GRID == GRID_NF4) {
                    code = nf4_code(__fdiv_rn(x, scale), t);
                } else {
                    code = x - offset >= 0.0f ? 1u : 0u;
                }
            }
            if (j < 4) lo_codes |= code << (j * bits);
            else hi_codes |= code << ((j - 4) * bits);
        }
        const u64 piece = (u64)lo_codes | (u64)hi_codes << (4 * bits);

        if (layout == LAYOUT_QPACK) {
            if (nv > 0) {
                const u64 row_bytes = ((u64)k * bits + 7) / 8;
                write_piece(codes + (u64)r * row_bytes + (u64)chunk * bits, piece, (nv * bits + 7) / 8);
            }
        } else {
            write_piece((unsigned char*)(stage + (warp + WARPS * i) * stride) + lane * bits, piece, bits);
        }
    }
    if (layout == LAYOUT_GPTQ) {
        __syncthreads();
        const int words = min(TILE_COLS, k - k0) * bits / 32;  // K·b is a multiple of 32 for GPTQ
        const int row0 = k0 / 32 * bits;
        const int col = threadIdx.x & 31;
        if (n0 + col < n_rows) {
            unsigned int* qweight = (unsigned int*)codes;
            for (int wi = warp; wi < words; wi += WARPS)
                qweight[(u64)(row0 + wi) * n_rows + n0 + col] = stage[col * stride + wi];
        }
        __syncthreads();  // before the next tile overwrites the stage
    }
}

// encode_tiles is a persistent loop over tiles (row bands × column blocks, column blocks
// fastest) that loads the next tile before it processes the current one, so that each block
// keeps its loads in flight while it computes.
template <int GRID, bool FUSED, int DT>
__device__ __forceinline__ void encode_tiles(ENCODE_PARAMS) {
    __shared__ unsigned int stage[TILE_ROWS * MAX_STAGE_WORDS];
    const int tiles_x = (k + TILE_COLS - 1) / TILE_COLS;
    const int tiles = tiles_x * ((n_rows + TILE_ROWS - 1) / TILE_ROWS);
    const bool vec = (k & 7) == 0;
    float t[15];
    if (GRID == GRID_NF4) {
#pragma unroll
        for (int i = 0; i < 15; i++) t[i] = __ldg(nf4t + i);
    }
    Raw<DT> cur[ROWS_PER_WARP], next[ROWS_PER_WARP];
    int tile = blockIdx.x;
    if (tile < tiles) load_tile<DT>(w, n_rows, k, tile, tiles_x, vec, cur);
    for (; tile < tiles; tile += gridDim.x) {
        if (tile + (int)gridDim.x < tiles) load_tile<DT>(w, n_rows, k, tile + gridDim.x, tiles_x, vec, next);
        process_tile<GRID, FUSED, DT>(ENCODE_ARGS, tile, tiles_x, cur, t, stage);
#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; i++) cur[i] = next[i];
    }
}


// One kernel per grid, fitting mode and input dtype. __launch_bounds__ keeps 3 blocks per SM
// resident; the host launches 3 × SMs blocks.
#define ENTRIES(name, GRIDV, FUSEDV)                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) name##_bf16(ENCODE_PARAMS) {             \
        encode_tiles<GRIDV, FUSEDV, IN_BF16>(ENCODE_ARGS);                                             \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) name##_f16(ENCODE_PARAMS) {              \
        encode_tiles<GRIDV, FUSEDV, IN_F16>(ENCODE_ARGS);                                              \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) name##_f32(ENCODE_PARAMS) {              \
        encode_tiles<GRIDV, FUSEDV, IN_F32>(ENCODE_ARGS);                                              \
    }
ENTRIES(bw_fused_int, GRID_INT, true)
ENTRIES(bw_fused_nf4, GRID_NF4, true)
ENTRIES(bw_encode_int, GRID_INT, false)
ENTRIES(bw_encode_nf4, GRID_NF4, false)
ENTRIES(bw_encode_bin, GRID_BIN, false)

// bw_params fits integer or NF4 groups of any length: one warp per (row, group), grid-stride.
// It writes the F16 scale in the layout's order, the float32 scale to pscale and the integer
// zero point to zbytes.
extern "C" __global__ void bw_params(const void* w, int dtype, int n_rows, int k, int gsize, int groups, int grid,
                                     int bits, int sym, int layout, unsigned short* scales, unsigned char* zbytes,
                                     float* pscale, u64* status) {
    const int lane = threadIdx.x & 31;
    const int maxq = (1 << bits) - 1;
    const u64 total = (u64)n_rows * groups;
    for (u64 item = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; item < total;
         item += (u64)gridDim.x * blockDim.x / 32) {
        const int r = (int)(item / groups), g = (int)(item % groups);
        const int lo = g * gsize, hi = min(lo + gsize, k);
        float xmin = 0.0f, xmax = 0.0f;
        for (int c = lo + lane; c < hi; c += 32) {
            const float v = load_one(w, dtype, (u64)r * k + c);
            xmin = fminf(xmin, v);
            xmax = fmaxf(xmax, v);
        }
        for (int off = 16; off > 0; off >>= 1) {
            xmin = fminf(xmin, __shfl_xor_sync(0xffffffffu, xmin, off));
            xmax = fmaxf(xmax, __shfl_xor_sync(0xffffffffu, xmax, off));
        }
        __half h;
        float scale, zero = 0.0f;
        if (grid == GRID_INT) int_params(xmin, xmax, sym, maxq, &h, &scale, &zero);
        else nf4_params(fmaxf(-xmin, xmax), &h, &scale);
        if (lane == 0) {
            store_scale(scales, layout, r, g, n_rows, groups, h);
            pscale[item] = scale;
            if (grid == GRID_INT) zbytes[item] = (unsigned char)zero;
            if (non_finite(scale)) atomicMin(status + 1, item);
        }
    }
}

// bw_params_bin fits binary groups (quant.BinaryParams): one thread per (row, group) sums the
// group in order in float64, as the reference does. Offsets go to qpack's F16 [N, groups].
extern "C" __global__ void bw_params_bin(const void* w, int dtype, int n_rows, int k, int gsize, int groups, int sym,
                                         unsigned short* scales, unsigned short* offsets, float* pscale,
                                         float* poffset, u64* status) {
    const u64 total = (u64)n_rows * groups;
    for (u64 item = (u64)blockIdx.x * blockDim.x + threadIdx.x; item < total; item += (u64)gridDim.x * blockDim.x) {
        const int r = (int)(item / groups), g = (int)(item % groups);
        const int lo = g * gsize, hi = min(lo + gsize, k);
        const u64 base = (u64)r * k;
        const double len = (double)(hi - lo);
        float offset = 0.0f;
        __half offset_h = __float2half_rn(0.0f);
        if (!sym) {
            double sum = 0.0;
            for (int c = lo; c < hi; c++) sum = __dadd_rn(sum, (double)load_one(w, dtype, base + c));
            offset_h = __float2half_rn(__double2float_rn(__ddiv_rn(sum, len)));
            offset = __half2float(offset_h);
        }
        double sum_abs = 0.0;
        for (int c = lo; c < hi; c++) sum_abs = __dadd_rn(sum_abs, fabs((double)__fsub_rn(load_one(w, dtype, base + c), offset)));
        __half h = __float2half_rn(__double2float_rn(__ddiv_rn(sum_abs, len)));
        if (__half2float(h) == 0.0f) h = __ushort_as_half((unsigned short)1);
        scales[item] = __half_as_ushort(h);
        pscale[item] = __half2float(h);
        poffset[item] = offset;
        if (!sym) offsets[item] = __half_as_ushort(offset_h);
        if (non_finite(__half2float(h)) || non_finite(offset)) atomicMin(status + 1, item);
    }
}

// stream_word assembles word j (of word_bits bits) of the little-endian bitstream of `count`
// codes of `bits` bits, code i being code_at(i).
template <typename CodeAt>
__device__ __forceinline__ unsigned int stream_word(u64 j, int word_bits, int count, int bits, CodeAt code_at) {
    const u64 first = j * word_bits;
    unsigned int word = 0;
    for (u64 i = first / bits; i < (u64)count && i * bits < first + word_bits; i++) {
        const long long pos = (long long)(i * bits) - (long long)first;
        const unsigned int code = code_at((int)i);
        word |= pos >= 0 ? code << pos : code >> -pos;
    }
    return word_bits == 32 ? word : word & ((1u << word_bits) - 1);
}

// bw_pack_zeros packs the zero points: GPTQ qzeros I32 [groups, ceil(N·b/32)], each group a
// bitstream over rows of (z − zero_shift) mod 2^b (z = 2^(b−1) when symmetric), or qpack zeros
// U8 [N, ceil(groups·b/8)], each row a bitstream over groups (asymmetric only).
extern "C" __global__ void bw_pack_zeros(const unsigned char* zbytes, int n_rows, int groups, int bits, int sym,
                                         int zero_shift, int layout, unsigned char* out) {
    const int maxq = (1 << bits) - 1;
    if (layout == LAYOUT_GPTQ) {
        const int words = (int)(((u64)n_rows * bits + 31) / 32);
        const u64 total = (u64)groups * words;
        for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
            const int g = (int)(idx / words);
            ((unsigned int*)out)[idx] = stream_word(idx % words, 32, n_rows, bits, [&](int n) {
                const int z = sym ? (maxq + 1) / 2 : zbytes[(u64)n * groups + g];
                return (unsigned int)((z - zero_shift) & maxq);
            });
        }
    } else {
        const int row_bytes = (groups * bits + 7) / 8;
        const u64 total = (u64)n_rows * row_bytes;
        for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
            const u64 r = idx / row_bytes;
            out[idx] = (unsigned char)stream_word(idx % row_bytes, 8, groups, bits,
                                                  [&](int g) { return (unsigned int)zbytes[r * groups + g]; });
        }
    }
}

// Packed min/max of two 16-bit floats. NaN wins, so that a NaN weight makes its group unsafe
// (RecipInt.safe) and takes the division path, which reports it.
template <int DT>
__device__ __forceinline__ unsigned int min2(unsigned int a, unsigned int b) {
#ifdef QPACK_HOST_STANDINS  // kernels/host/cuda_fp16.h's stand-in
    return host_minmax2(DT == IN_BF16, false, a, b);
#else
    unsigned int d;
    if constexpr (DT == IN_BF16) asm("min.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    else asm("min.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}
template <int DT>
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {
#ifdef QPACK_HOST_STANDINS
    return host_minmax2(DT == IN_BF16, true, a, b);
#else
    unsigned int d;
    if constexpr (DT == IN_BF16) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    else asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}

// range16 is the range of chunks x[j0, j0 + jn) of a 16-bit input (both ends including 0), from
// packed min/max, and whether all those weights are finite.
template <int DT, int N>
__device__ __forceinline__ void range16(const Raw<DT> (&x)[N], int j0, int jn, float& lo, float& hi, bool& finite) {
    unsigned int mn = 0, mx = 0;  // two +0s: the range includes 0
#pragma unroll
    for (int j = j0; j < j0 + jn; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            mn = min2<DT>(mn, x[j].u[q]);
            mx = max2<DT>(mx, x[j].u[q]);
        }
    }
    Raw<DT> m;
    m.u[0] = mn;
    m.u[1] = mx;
    const float lo0 = raw_at<DT>(m, 0), lo1 = raw_at<DT>(m, 1), hi0 = raw_at<DT>(m, 2), hi1 = raw_at<DT>(m, 3);
    finite = !(non_finite(lo0) || non_finite(lo1) || non_finite(hi0) || non_finite(hi1));  // before fminf drops a NaN
    lo = fminf(lo0, lo1);
    hi = fmaxf(hi0, hi1);
}

// int_chunk_words packs the 8 codes of chunk xj (16-bit input) of b = BITS ∈ {4, 8} bits into
// BITS/4 words. 16/b codes c_e = n_e + zero pack exactly in a float: 2^23 + Σ c_e·2^(b·e) stays
// in [2^23, 2^24), where the float's low 16 bits are the packed codes (all products and sums are
// exact). CLAMP false skips the clamp to [0, maxq], for warps whose groups' extremes already
// round inside it.
template <int DT, int BITS, bool CLAMP>
__device__ __forceinline__ void int_chunk_words(const Raw<DT>& xj, const RecipInt& p, float zero, unsigned int (&word)[BITS / 4]) {
    constexpr int per_half = 16 / BITS;  // codes per 16 bits
    const float pack0 = __fadd_rn(8388608.0f, __fmul_rn(zero, BITS == 4 ? 4369.0f : 257.0f));  // 2^23 + zero·Σ 2^(b·e)
    float pk[BITS / 2];
#pragma unroll
    for (int i = 0; i < BITS / 2; i++) pk[i] = pack0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float n = int_round_exact(raw_at<DT>(xj, e), p);
        if (CLAMP) n = fminf(fmaxf(n, p.nlo), p.nhi);
        pk[e / per_half] = __fmaf_rn(n, (float)(1 << (BITS * (e % per_half))), pk[e / per_half]);
    }
#pragma unroll
    for (int m = 0; m < BITS / 4; m++) word[m] = __byte_perm(__float_as_uint(pk[2 * m]), __float_as_uint(pk[2 * m + 1]), 0x5410);
}

// int_chunk_bits codes chunk xj of a 16-bit input in 8·BITS bits (BITS 2 or 3) as int_chunk_words
// does: the 8 2-bit codes in one float (2^23 + Σ c_e·4^e < 2^23 + 2^16), the 3-bit codes 0–3 and
// 4–7 in two (12 bits each; the second one's exponent bits shift out: 0x4b000000 << 12 is 0).
template <int DT, int BITS, bool CLAMP>
__device__ __forceinline__ unsigned int int_chunk_bits(const Raw<DT>& xj, const RecipInt& p, float zero) {
    constexpr int per = BITS == 2 ? 8 : 4;  // codes per float
    const float pack0 = __fadd_rn(8388608.0f, __fmul_rn(zero, BITS == 2 ? 21845.0f : 585.0f));  // 2^23 + zero·Σ 2^(b·e)
    float pk[8 / per];
#pragma unroll
    for (int i = 0; i < 8 / per; i++) pk[i] = pack0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float n = int_round_exact(raw_at<DT>(xj, e), p);
        if (CLAMP) n = fminf(fmaxf(n, p.nlo), p.nhi);
        pk[e / per] = __fmaf_rn(n, (float)(1 << (BITS * (e % per))), pk[e / per]);
    }
    if constexpr (BITS == 2) return __float_as_uint(pk[0]) & 0xffffu;
    else return (__float_as_uint(pk[0]) & 0xfffu) | __float_as_uint(pk[1]) << 12;
}

// bw_piece_*: integer 2-, 3-, 4- and 8-bit and NF4 groups of 32, 64 or 128 columns of a 16-bit
// input (BF16, F16) with K a multiple of 128, in one launch, in both layouts. A warp takes 16
// rows × one piece of 128 columns (blocks: 8 warps on consecutive pieces of the same rows,
// blockIdx.x along K, blockIdx.y row bands of 16); lanes 2i and 2i+1 hold row
// r0 + i, lane half h holding chunks 2j + h (j = 0..7), so that each 16-byte load instruction
// reads 16 rows × 32 contiguous bytes, and each lane quantizes 64 weights. A piece holds
// 128/GS groups; group q is chunks j ∈ [q·GS/16, (q+1)·GS/16) of both lanes of a row, so the
// group parameters cost one pair shuffle per group and are amortized over GS/2 weights.
// Codes go straight to their layout (GPTQ qweight: chunk c is words c·b/4 .. of row r; qpack:
// bytes c·b .. of row r), zero points too: GPTQ's qzeros words gathered with shuffles, qpack's
// bytes per row (for 4-bit groups of 128, two pieces share a byte: the odd warp hands its nibble
// to the even one through shared memory).
#define PIECE_ROWS 16
#define PIECE_COLS 128

#define PIECE_PARAMS                                                                                   \
    const void *w, int n_rows, int k, int sym, int zero_shift, int layout, unsigned char *codes,       \
        unsigned short *scales, unsigned char *zeros, const float *nf4t, u64 *status
#define PIECE_ARGS w, n_rows, k, sym, zero_shift, layout, codes, scales, zeros, nf4t, status

// chunk_codes_div loads the chunk at flat index at and codes it with the true division (the
// reference formula; for groups that are not finite or not safe), into the 8·BITS low bits of
// codes. It returns the chunk's non-finite weights as a bit mask.
template <int DT, int GRID, int BITS>
__device__ __forceinline__ unsigned int chunk_codes_div(const void* w, u64 at, float scale, float zero, const float (&t)[15],
                                                     u64& codes) {
    Raw<DT> x;
    load_raw<DT>(w, at, 8, true, x);
    u64 wd = 0;
    unsigned int bad = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        const float v = raw_at<DT>(x, e);
        bad |= (non_finite(v) ? 1u : 0u) << e;
        const unsigned int code = GRID == GRID_INT ? int_code(v, scale, zero, (1 << BITS) - 1) : nf4_code(__fdiv_rn(v, scale), t);
        wd |= (u64)code << (BITS * e);
    }
    codes = wd;
    return bad;
}

// chunk_store writes chunk c's codes (BITS 4 or 8: BITS/4 words) of row r, alone (the rare
// division path).
template <int BITS>
__device__ __forceinline__ void chunk_store(unsigned char* codes, int layout, int n_rows, int k, int r, u64 c, u64 bits) {
    if (layout == LAYOUT_GPTQ) {
#pragma unroll
        for (int m = 0; m < BITS / 4; m++) ((unsigned int*)codes)[(c * (BITS / 4) + m) * n_rows + r] = (unsigned int)(bits >> (32 * m));
    } else {
        unsigned char* dst = codes + (u64)r * ((u64)k / 8 * BITS) + c * BITS;
        if constexpr (BITS == 4) *(unsigned int*)dst = (unsigned int)bits;
        else *(uint2*)dst = make_uint2((unsigned int)bits, (unsigned int)(bits >> 32));
    }
}

// piece_store writes a lane's 8 chunks of codes (chunk 2j + h of the piece in word[j], BITS/4
// words each) of row r. GPTQ: chunk c is qweight words c·b/4 .. of column r, so that each store
// instruction writes two runs of 16 consecutive words. qpack: the row's 16 chunks are 16·b
// contiguous bytes; the two lanes of the row first swap chunks (d = 8/b apart in j) so that each
// holds runs of 16 contiguous bytes, and each 16-byte store instruction writes whole 32-byte
// sectors of 16 rows (storing chunk by chunk wrote 4 or 8 bytes per row and instruction, and ran
// at half the speed).
template <int BITS>
__device__ __forceinline__ void piece_store(unsigned char* codes, int layout, int n_rows, int k, int r, int pc, bool live,
                                            unsigned int (&word)[8][BITS / 4]) {
    constexpr int wpc = BITS / 4, d = 8 / BITS;
    const int h = threadIdx.x & 1;
    if (layout == LAYOUT_GPTQ) {
        if (!live) return;
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int m = 0; m < wpc; m++)
                ((unsigned int*)codes)[((u64)pc * 16 + 2 * j + h) * wpc * n_rows + (u64)m * n_rows + r] = word[j][m];
        }
        return;
    }
    // Swap: afterwards both lanes hold, for run u and t < d, chunks 2(2du + dh + t) and its
    // successor in word[2du + t] and word[2du + t + d]: bytes 32u + 16h .. of the piece's row.
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if ((j / d) % 2 != 0) continue;
#pragma unroll
        for (int m = 0; m < wpc; m++) {
            const unsigned int a = word[j][m], b = word[j + d][m];
            const unsigned int got = __shfl_xor_sync(0xffffffffu, h ? a : b, 1);
            word[j][m] = h ? got : a;
            word[j + d][m] = h ? b : got;
        }
    }
    if (!live) return;
    unsigned char* row = codes + (u64)r * ((u64)k / 8 * BITS) + (u64)pc * 16 * BITS;
#pragma unroll
    for (int u = 0; u < 8 / (2 * d); u++) {
        unsigned int v[4];
#pragma unroll
        for (int t = 0; t < d; t++) {
#pragma unroll
            for (int m = 0; m < wpc; m++) {
                v[2 * wpc * t + m] = word[2 * d * u + t][m];
                v[2 * wpc * t + wpc + m] = word[2 * d * u + t + d][m];
            }
        }
        *(uint4*)(row + 32 * u + 16 * h) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

// piece_store_narrow is piece_store for 2- and 3-bit codes: cb[j] holds the 8·BITS bits of chunk
// 2j + h. The piece's row is 4·BITS words of both layouts' bitstream; lane h stores words
// 2·BITS·h … 2·BITS·h + 2·BITS − 1 (chunks 8h … 8h + 7), so the lanes of a row first swap four
// chunks. BITS 2: word t is chunks 2t and 2t + 1 (lane 0's cb[t] and lane 1's). BITS 3: four
// chunks (96 bits) are three words, lane 0 holding chunks 4u and 4u + 2 of them. GPTQ: each store
// instruction writes two runs of 16 consecutive qweight words; qpack: 16 rows × 32 (2-bit) or 48
// (3-bit) contiguous bytes in a 16- and an 8-byte store per lane.
template <int BITS>
__device__ __forceinline__ void piece_store_narrow(unsigned char* codes, int layout, int n_rows, int k, int r, int pc, bool live,
                                                   const unsigned int (&cb)[8]) {
    constexpr int W = 2 * BITS;  // words per lane
    const int h = threadIdx.x & 1;
    unsigned int own[4], got[4];  // own[q]: this lane's chunk of its half; got[q]: the other lane's
#pragma unroll
    for (int q = 0; q < 4; q++) {
        own[q] = h ? cb[4 + q] : cb[q];
        got[q] = __shfl_xor_sync(0xffffffffu, h ? cb[q] : cb[4 + q], 1);
    }
    unsigned int wd[W];
    if constexpr (BITS == 2) {
#pragma unroll
        for (int q = 0; q < 4; q++) wd[q] = h ? got[q] | own[q] << 16 : own[q] | got[q] << 16;
    } else {
#pragma unroll
        for (int v = 0; v < 2; v++) {  // chunks 4u .. 4u + 3 of unit u = 2h + v, in order
            const unsigned int c0 = h ? got[2 * v] : own[2 * v], c1 = h ? own[2 * v] : got[2 * v];
            const unsigned int c2 = h ? got[2 * v + 1] : own[2 * v + 1], c3 = h ? own[2 * v + 1] : got[2 * v + 1];
            wd[3 * v] = c0 | c1 << 24;
            wd[3 * v + 1] = c1 >> 8 | c2 << 16;
            wd[3 * v + 2] = c2 >> 16 | c3 << 8;
        }
    }
    if (!live) return;
    if (layout == LAYOUT_GPTQ) {
#pragma unroll
        for (int t = 0; t < W; t++) ((unsigned int*)codes)[((u64)pc * 4 * BITS + W * h + t) * n_rows + r] = wd[t];
        return;
    }
    unsigned char* row = codes + (u64)r * ((u64)k / 8 * BITS) + (u64)pc * 16 * BITS;
    if constexpr (BITS == 2) {
        *(uint4*)(row + 16 * h) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
    } else {  // lane 0: bytes 0–15 and 16–23; lane 1: 32–47 and 24–31
        *(uint4*)(row + 32 * h) = h ? make_uint4(wd[2], wd[3], wd[4], wd[5]) : make_uint4(wd[0], wd[1], wd[2], wd[3]);
        *(uint2*)(row + 16 + 8 * h) = h ? make_uint2(wd[0], wd[1]) : make_uint2(wd[4], wd[5]);
    }
}

template <int DT, int GRID, int BITS, int GS>
__device__ __forceinline__ void piece_kernel(PIECE_PARAMS) {
    constexpr int NG = PIECE_COLS / GS;  // groups per piece
    constexpr int JG = GS / 16;          // chunks of a lane per group
    constexpr int maxq = (1 << BITS) - 1;
    __shared__ unsigned char zpair[WARPS][PIECE_ROWS];  // see the comment above
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pieces = k / PIECE_COLS, groups = k / GS;
    const int pc = blockIdx.x * WARPS + warp;
    const bool active = pc < pieces;  // whole warps: no shuffle misses a lane
    const int r0 = blockIdx.y * PIECE_ROWS;
    const int r = r0 + (lane >> 1), h = lane & 1;
    const bool live = active && r < n_rows;
    float zero[NG];
    if (active) {
        const u64 base = (u64)min(r, n_rows - 1) * k + (u64)pc * PIECE_COLS;  // rows past N reload the last
        Raw<DT> x[8];
#pragma unroll
        for (int j = 0; j < 8; j++) load_raw<DT>(w, base + 8 * (2 * j + h), 8, true, x[j]);
        float t[15], thr = 0.0f;
        unsigned int tbase = 0;
        if (GRID == GRID_NF4) {
#pragma unroll
            for (int i = 0; i < 15; i++) t[i] = __ldg(nf4t + i);
            nf4_bucket(t, thr, tbase);
        }
        __half scale_h[NG];
        float scale[NG];
        RecipInt p[NG];
        bool ok = true, inside = true;
        float lo[NG], hi[NG];  // the groups' ranges, the same in the row's two lanes
#pragma unroll
        for (int q = 0; q < NG; q++) {
            bool finite;
            range16<DT, 8>(x, q * JG, JG, lo[q], hi[q], finite);
            lo[q] = fminf(lo[q], __shfl_xor_sync(0xffffffffu, lo[q], 1));
            hi[q] = fmaxf(hi[q], __shfl_xor_sync(0xffffffffu, hi[q], 1));
            const bool other = __shfl_xor_sync(0xffffffffu, (int)finite, 1);  // the row's other lane: every lane shuffles
            ok = ok && other && finite;
        }
        if constexpr (GRID == GRID_INT && NG >= 2) {
            // Of each two groups, lane h fits group 2m + h (about 100 instructions) and the lanes swap
            // the results: the F16 scale, zero point and flags in one word, and the reciprocal.
#pragma unroll
            for (int m = 0; m < NG / 2; m++) {
                const float l = h ? lo[2 * m + 1] : lo[2 * m], u = h ? hi[2 * m + 1] : hi[2 * m];
                __half sh;
                float sc, z;
                const RecipInt f = int_params16<maxq>(l, u, sym, fmaxf(-l, u), &sh, &sc, &z);
                // Rounding is monotone in w: when the extremes round inside the code range, all do.
                const bool in = int_round_exact(l, f) >= f.nlo && int_round_exact(u, f) <= f.nhi;
                const unsigned int mine = __half_as_ushort(sh) | (unsigned int)z << 16 | (f.safe ? 1u << 24 : 0u) | (in ? 1u << 25 : 0u);
                const unsigned int theirs = __shfl_xor_sync(0xffffffffu, mine, 1);
                const float r_theirs = __shfl_xor_sync(0xffffffffu, f.r, 1);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int q = 2 * m + e;
                    const unsigned int word = e == h ? mine : theirs;
                    scale_h[q] = __ushort_as_half((unsigned short)(word & 0xffffu));
                    scale[q] = __half2float(scale_h[q]);
                    zero[q] = (float)(word >> 16 & 0xffu);
                    p[q].r = e == h ? f.r : r_theirs;
                    p[q].scale = scale[q];
                    p[q].safe = (word >> 24 & 1u) != 0;
                    p[q].cutoff = 0.0f;  // int_round_fast's (F32): unused
                    p[q].nlo = -zero[q];
                    p[q].nhi = __fsub_rn((float)maxq, zero[q]);
                    p[q].magic_zero = __fadd_rn(ROUND_MAGIC, zero[q]);
                    ok = ok && p[q].safe;
                    inside = inside && (word >> 25 & 1u) != 0;
                }
            }
        } else {
#pragma unroll
            for (int q = 0; q < NG; q++) {
                zero[q] = 0.0f;
                if constexpr (GRID == GRID_INT) {
                    p[q] = int_params16<maxq>(lo[q], hi[q], sym, fmaxf(-lo[q], hi[q]), &scale_h[q], &scale[q], &zero[q]);
                    // Rounding is monotone in w: when the extremes round inside the code range, all do.
                    inside = inside && int_round_exact(lo[q], p[q]) >= p[q].nlo && int_round_exact(hi[q], p[q]) <= p[q].nhi;
                } else {
                    nf4_params(fmaxf(-lo[q], hi[q]), &scale_h[q], &scale[q]);
                    p[q] = recip_int(scale[q], zero[q], maxq, fmaxf(-lo[q], hi[q]));
                }
                ok = ok && p[q].safe;
            }
        }
        bool normal = true;  // NF4: every scale a normal F16 (see nf4_code_table)
#pragma unroll
        for (int q = 0; q < NG; q++) normal = normal && scale[q] >= 6.103515625e-05f;
        const bool skip_clamp = __all_sync(0xffffffffu, ok && (GRID == GRID_INT ? inside : normal));
        constexpr int WPC = BITS >= 4 ? BITS / 4 : 1;
        // chunk 2j + h's codes: BITS/4 words, or (BITS 2, 3) its 8·BITS bits in word[j][0]; garbage
        // where !ok (redone below)
        unsigned int word[8][WPC];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int q = j / JG;
            if constexpr (GRID == GRID_NF4) {
                // codes packed from the last: one shift-add per weight
                unsigned int wd = 0;
                if (skip_clamp) {
#pragma unroll
                    for (int e = 7; e >= 0; e--) wd = wd * 16 + nf4_code_table<false>(quotient_exact(raw_at<DT>(x[j], e), p[q]), thr, tbase);
                } else {
#pragma unroll
                    for (int e = 7; e >= 0; e--) wd = wd * 16 + nf4_code_table<true>(quotient_exact(raw_at<DT>(x[j], e), p[q]), thr, tbase);
                }
                word[j][0] = wd;
            } else if constexpr (BITS < 4) {
                word[j][0] = skip_clamp ? int_chunk_bits<DT, BITS, false>(x[j], p[q], zero[q]) : int_chunk_bits<DT, BITS, true>(x[j], p[q], zero[q]);
            } else if (skip_clamp) {
                int_chunk_words<DT, BITS, false>(x[j], p[q], zero[q], word[j]);
            } else {
                int_chunk_words<DT, BITS, true>(x[j], p[q], zero[q], word[j]);
            }
        }
        // divide codes chunk 2j + h with the true division (groups not finite or not safe: rare) and
        // reports its non-finite weights.
        auto divide = [&](int j, u64& bits) {
            float sc = scale[0], zq = zero[0];  // group j / JG's, without indexing the arrays at run time
#pragma unroll
            for (int q = 1; q < NG; q++) {
                if (j / JG == q) {
                    sc = scale[q];
                    zq = zero[q];
                }
            }
            const u64 at = base + 8 * (2 * j + h);
            const unsigned int bad = chunk_codes_div<DT, GRID, BITS>(w, at, sc, zq, t, bits);
            if (bad) atomicMin(status, at + __ffs(bad) - 1);
        };
        if constexpr (BITS < 4) {  // 3-bit words hold parts of both lanes' chunks: divide first, then store
            if (!ok) {
#pragma unroll 1
                for (int j = 0; j < 8; j++) {
                    u64 bits;
                    divide(j, bits);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        if (i == j) word[i][0] = (unsigned int)bits;
                    }
                }
            }
            unsigned int cb[8];
#pragma unroll
            for (int j = 0; j < 8; j++) cb[j] = word[j][0];
            piece_store_narrow<BITS>(codes, layout, n_rows, k, r, pc, live, cb);  // converged: it shuffles
        } else {
            piece_store<BITS>(codes, layout, n_rows, k, r, pc, live && ok, word);  // converged: it shuffles
            if (!ok) {
#pragma unroll 1
                for (int j = 0; j < 8; j++) {
                    u64 bits;
                    divide(j, bits);
                    if (live) chunk_store<BITS>(codes, layout, n_rows, k, r, (u64)pc * 16 + 2 * j + h, bits);
                }
            }
        }
        if (live && h == 0) {
#pragma unroll
            for (int q = 0; q < NG; q++) {
                if (non_finite(scale[q])) atomicMin(status + 1, (u64)r * groups + pc * NG + q);
            }
            if (layout == LAYOUT_QPACK && NG == 4) {  // the row's 4 scales in one 8-byte store (groups is a multiple of 4)
                *(uint2*)(scales + (u64)r * groups + pc * NG) =
                    make_uint2(__half_as_ushort(scale_h[0]) | (unsigned int)__half_as_ushort(scale_h[NG > 1]) << 16,
                               __half_as_ushort(scale_h[NG > 2 ? 2 : 0]) | (unsigned int)__half_as_ushort(scale_h[NG > 3 ? 3 : 0]) << 16);
            } else if (layout == LAYOUT_QPACK && NG == 2) {  // in one 4-byte store (groups is even)
                *(unsigned int*)(scales + (u64)r * groups + pc * NG) =
                    __half_as_ushort(scale_h[0]) | (unsigned int)__half_as_ushort(scale_h[NG > 1]) << 16;
            } else {
#pragma unroll
                for (int q = 0; q < NG; q++) store_scale(scales, layout, r, pc * NG + q, n_rows, groups, scale_h[q]);
            }
        }
        if (GRID == GRID_INT && layout == LAYOUT_GPTQ && BITS == 3) {
            // qzeros [groups, ceil(3N/32)], each group a bitstream over rows: the warp's 16 rows are 48
            // bits from bit 48·band, whole and half words (even bands: a word and the low half of the
            // next, which the next band completes; odd bands: a high half and a word).
            const int wpg = (3 * n_rows + 31) / 32, bit = 48 * (int)blockIdx.y, wi = bit / 32;
#pragma unroll
            for (int q = 0; q < NG; q++) {
                u64 zb = live && h == 0 ? (u64)(((int)zero[q] - zero_shift) & 7) << (3 * (lane >> 1)) : 0;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) zb |= __shfl_xor_sync(0xffffffffu, zb, off);
                unsigned int* qz = (unsigned int*)zeros + (u64)(pc * NG + q) * wpg;
                if (lane == 0 && bit % 32 == 0) {
                    qz[wi] = (unsigned int)zb;
                    if (wi + 1 < wpg && r0 + PIECE_ROWS < n_rows) ((unsigned short*)(qz + wi + 1))[0] = (unsigned short)(zb >> 32);
                    else if (wi + 1 < wpg) qz[wi + 1] = (unsigned int)(zb >> 32);  // no next band: the whole word
                } else if (lane == 0) {
                    ((unsigned short*)(qz + wi))[1] = (unsigned short)zb;
                    if (wi + 1 < wpg) qz[wi + 1] = (unsigned int)(zb >> 16);
                }
            }
        } else if (GRID == GRID_INT && layout == LAYOUT_GPTQ) {
            // qzeros [groups, ceil(N·b/32)]: word (g, r/rpw) holds rows r..r+rpw−1, (z − zero_shift) mod 2^b each.
            constexpr int rpw = 32 / BITS, lpw = 2 * rpw > 32 ? 32 : 2 * rpw;  // rows and lanes per word
#pragma unroll
            for (int q = 0; q < NG; q++) {
                unsigned int zw = live && h == 0 ? ((unsigned int)((int)zero[q] - zero_shift) & maxq) << (BITS * ((lane >> 1) & (rpw - 1))) : 0u;
#pragma unroll
                for (int off = 1; off < lpw; off <<= 1) zw |= __shfl_xor_sync(0xffffffffu, zw, off);
                const int zr = r0 + rpw * (lane / lpw);
                if ((lane & (lpw - 1)) == 0 && zr < n_rows)
                    ((unsigned int*)zeros)[(u64)(pc * NG + q) * ((n_rows + rpw - 1) / rpw) + zr / rpw] = zw;
            }
        }
        if (GRID == GRID_INT && layout == LAYOUT_QPACK && !sym && live && h == 0) {
            // qpack zeros U8 [N, ceil(groups·b/8)], each row a bitstream over groups.
            if constexpr (BITS == 8) {
#pragma unroll
                for (int q = 0; q < NG; q++) zeros[(u64)r * groups + pc * NG + q] = (unsigned char)zero[q];
            } else if constexpr (BITS == 4 && NG == 4) {  // the piece's two bytes in one store (groups/2 is even)
                *(unsigned short*)(zeros + (u64)r * (groups / 2) + pc * 2) =
                    (unsigned short)((int)zero[0] | (int)zero[1] << 4 | (int)zero[2] << 8 | (int)zero[3] << 12);
            } else if constexpr (BITS == 4 && NG == 2) {
                zeros[(u64)r * (groups / 2) + pc] = (unsigned char)((int)zero[0] | (int)zero[1] << 4);
            }
        }
    }
    if constexpr (GRID == GRID_INT && BITS < 4) {
        if (layout == LAYOUT_QPACK && !sym) {  // block-uniform: every thread reaches the barrier
            // qpack zeros U8 [N, ceil(groups·b/8)], each row a bitstream over groups: the block's 8
            // pieces are 8·NG groups, NG·b whole bytes of each row, gathered in shared memory.
            constexpr int bpr = NG * BITS;  // bytes per row and block
            __shared__ unsigned char zs[PIECE_ROWS][WARPS * NG];
            if (h == 0) {
#pragma unroll
                for (int q = 0; q < NG; q++) zs[lane >> 1][warp * NG + q] = active ? (unsigned char)zero[q] : 0;
            }
            __syncthreads();
            const int row_bytes = (groups * BITS + 7) / 8;
            for (int idx = threadIdx.x; idx < PIECE_ROWS * bpr; idx += THREADS) {
                const int i = idx / bpr, m = idx % bpr, byte = blockIdx.x * bpr + m;
                if (r0 + i >= n_rows || byte >= row_bytes) continue;
                unsigned int v = 0;
                for (int l = 8 * m / BITS; l < WARPS * NG && l * BITS < 8 * m + 8; l++) {
                    const int pos = l * BITS - 8 * m;
                    v |= pos >= 0 ? (unsigned int)zs[i][l] << pos : (unsigned int)zs[i][l] >> -pos;
                }
                zeros[(u64)(r0 + i) * row_bytes + byte] = (unsigned char)v;
            }
        }
    }
    if constexpr (GRID == GRID_INT && BITS == 4 && NG == 1) {
        if (layout == LAYOUT_QPACK && !sym) {  // block-uniform: every thread reaches the barrier
            if (live && h == 0 && (warp & 1)) zpair[warp][lane >> 1] = (unsigned char)zero[0];
            __syncthreads();
            if (live && h == 0 && !(warp & 1)) {
                const int high = pc + 1 < pieces ? zpair[warp + 1][lane >> 1] : 0;
                zeros[(u64)r * ((groups + 1) / 2) + pc / 2] = (unsigned char)((int)zero[0] | high << 4);
            }
        }
    }
}

#define PIECE_ENTRY(name, GRIDV, BITSV, GSV)                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) name##_bf16(PIECE_PARAMS) {              \
        piece_kernel<IN_BF16, GRIDV, BITSV, GSV>(PIECE_ARGS);                                          \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) name##_f16(PIECE_PARAMS) {               \
        piece_kernel<IN_F16, GRIDV, BITSV, GSV>(PIECE_ARGS);                                           \
    }
PIECE_ENTRY(bw_piece_int2_g32, GRID_INT, 2, 32)
PIECE_ENTRY(bw_piece_int2_g64, GRID_INT, 2, 64)
PIECE_ENTRY(bw_piece_int2_g128, GRID_INT, 2, 128)
PIECE_ENTRY(bw_piece_int3_g32, GRID_INT, 3, 32)
PIECE_ENTRY(bw_piece_int3_g64, GRID_INT, 3, 64)
PIECE_ENTRY(bw_piece_int3_g128, GRID_INT, 3, 128)
PIECE_ENTRY(bw_piece_int4_g32, GRID_INT, 4, 32)
PIECE_ENTRY(bw_piece_int4_g64, GRID_INT, 4, 64)
PIECE_ENTRY(bw_piece_int4_g128, GRID_INT, 4, 128)
PIECE_ENTRY(bw_piece_int8_g32, GRID_INT, 8, 32)
PIECE_ENTRY(bw_piece_int8_g64, GRID_INT, 8, 64)
PIECE_ENTRY(bw_piece_int8_g128, GRID_INT, 8, 128)
PIECE_ENTRY(bw_piece_nf4_g32, GRID_NF4, 4, 32)
PIECE_ENTRY(bw_piece_nf4_g64, GRID_NF4, 4, 64)
PIECE_ENTRY(bw_piece_nf4_g128, GRID_NF4, 4, 128)

// bw_bin_g*: binary groups of GS = 32, 64 or 128 columns of a 16-bit input (BF16, F16), qpack
// layout, K a multiple of 2·GS, in one launch (bw_params_bin + bw_encode_bin read the input twice,
// one thread summing a whole group with scattered loads). A warp takes 16 rows × 2 groups: lanes
// 2i and 2i + 1 hold row r0 + i, lane half h loading chunks 2j + h (j < GS/8) so that each 16-byte
// load instruction reads 16 rows × 32 contiguous bytes; then the row's lanes swap GS/16 chunks so
// that lane h holds group h whole. Each lane then sums its group one weight after another in
// float64, as quant.BinaryParams does (no reordering: float64 sums of float32 terms are not
// associative), codes it and stores its GS/8 bytes of codes, its scale and its offset.
// The offset's sum adds scaled_double(w) = w·2^-896 (every 16-bit weight's sum is exact so, see
// scaled_double); the absolute deviations convert with cvt.f64.f32. A non-finite weight or
// parameter makes its lane reload its group and report (rare).
// scaled_pair adds the two weights of word u (16-bit input, element 0 first) to sum, a float64
// sum scaled by 2^-896: a weight v adds v·2^-896 built from its bits, the exponent field copied
// into the double's, not rebiased (a float32 subnormal becomes a double subnormal of the same
// fraction, also v·2^-896), and for BF16 straight from the packed word (a shift and a mask, with
// expressions of their own, so that the compiler does not keep 128 unpacked weights alive for
// the second pass). Sums of such terms round as the unscaled sums do: the weights are multiples
// of 2^-133 (BF16) or 2^-24 (F16), so every partial sum below 2^-126 in magnitude, the scaled
// ones' subnormal range, is exact either way, and above it both have 53 bits. NaN and Inf give
// finite garbage; the kernel detects them through the absolute deviations.
template <int DT>
__device__ __forceinline__ double scaled_pair(double sum, unsigned int u) {
    if constexpr (DT == IN_BF16) {
        sum = __dadd_rn(sum, __hiloint2double((int)__byte_perm(u, 0u, 0x1044) >> 3 & 0x8fffe000, 0));
        return __dadd_rn(sum, __hiloint2double((int)u >> 3 & 0x8fffe000, 0));
    } else {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const unsigned int b = __float_as_uint(__half2float(__ushort_as_half((unsigned short)(e ? u >> 16 : u & 0xffffu))));
            sum = __dadd_rn(sum, __hiloint2double((int)b >> 3 & 0x8fffffff, (int)(b << 29)));
        }
        return sum;
    }
}

template <int DT, int GS>
__device__ __forceinline__ void bin_kernel(const void* w, int n_rows, int k, int sym, unsigned char* codes,
                                           unsigned short* scales, unsigned short* offsets, u64* status) {
    constexpr int J = GS / 16;  // chunks of each group a lane loads
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pc = blockIdx.x * WARPS + warp;  // pair of groups
    if (pc >= k / (2 * GS)) return;            // whole warps: no shuffle misses a lane
    const int groups = k / GS, g = 2 * pc + (lane & 1);
    const int r = blockIdx.y * PIECE_ROWS + (lane >> 1), h = lane & 1;
    const bool live = r < n_rows;
    const u64 base = (u64)min(r, n_rows - 1) * k + (u64)pc * 2 * GS;  // rows past N reload the last
    Raw<DT> x[2 * J];
#pragma unroll
    for (int j = 0; j < 2 * J; j++) load_raw<DT>(w, base + 8 * (2 * j + h), 8, true, x[j]);
    // Lane 0 keeps its chunks 2j of group 0 and gets lane 1's 2j + 1; lane 1 keeps its chunks 2j + 1
    // of group 1 (its x[J + j]) and gets lane 0's 2j (lane 0's x[J + j]).
    Raw<DT> ev[J], od[J];  // the own group's chunks 2j and 2j + 1
#pragma unroll
    for (int j = 0; j < J; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const unsigned int got = __shfl_xor_sync(0xffffffffu, h ? x[j].u[q] : x[J + j].u[q], 1);
            ev[j].u[q] = h ? got : x[j].u[q];
            od[j].u[q] = h ? x[J + j].u[q] : got;
        }
    }
    float offset = 0.0f;
    __half offset_h = __float2half_rn(0.0f);
    if (!sym) {
        double sum = 0.0;  // scaled by 2^-896
#pragma unroll
        for (int j = 0; j < J; j++) {
#pragma unroll
            for (int q = 0; q < 4; q++) sum = scaled_pair<DT>(sum, ev[j].u[q]);
#pragma unroll
            for (int q = 0; q < 4; q++) sum = scaled_pair<DT>(sum, od[j].u[q]);
        }
        // sum·2^896 / GS: one exact multiplication (GS is a power of two, nothing underflows)
        offset_h = __float2half_rn(__double2float_rn(__dmul_rn(sum, __hiloint2double(0x77f00000, 0) / GS)));
        offset = __half2float(offset_h);
    }
    // The code is 1 where w − offset ≥ 0. Against an offset of −0 instead of +0 (the same
    // differences) no difference is −0, so the code is the complement of the difference's sign bit,
    // shifted in from the right (one funnel shift per weight) and the word's bits reversed after.
    const float off_nz = offset == 0.0f ? -0.0f : offset;
    double sum_abs = 0.0;
    unsigned int cw[GS / 32];  // codes, 32 per word
#pragma unroll
    for (int c = 0; c < GS / 8; c++) {  // the group's chunk c, in order
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float d = __fsub_rn(raw_at<DT>(c & 1 ? od[c >> 1] : ev[c >> 1], e), off_nz);
            sum_abs = __dadd_rn(sum_abs, (double)fabsf(d));
            cw[c / 4] = __funnelshift_l(__float_as_uint(d), c % 4 == 0 && e == 0 ? 0u : cw[c / 4], 1);
        }
    }
#pragma unroll
    for (int i = 0; i < GS / 32; i++) cw[i] = ~__brev(cw[i]);
    __half scale_h = __float2half_rn(__double2float_rn(__dmul_rn(sum_abs, 1.0 / GS)));
    if (__half2float(scale_h) == 0.0f) scale_h = __ushort_as_half((unsigned short)1);
    const float scale = __half2float(scale_h);
    if (!live) return;
    if (non_finite(scale) || non_finite(offset)) {  // a weight not finite, or a parameter out of F16's range
        atomicMin(status + 1, (u64)r * groups + g);
#pragma unroll 1
        for (int c = 0; c < GS / 8; c++) {
            Raw<DT> y;
            const u64 at = (u64)r * k + (u64)g * GS + 8 * c;
            load_raw<DT>(w, at, 8, true, y);
            unsigned int bad = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) bad |= (non_finite(raw_at<DT>(y, e)) ? 1u : 0u) << e;
            if (bad) {
                atomicMin(status, at + __ffs(bad) - 1);
                break;
            }
        }
    }
    unsigned char* dst = codes + (u64)r * (k / 8) + (u64)g * (GS / 8);
    if constexpr (GS == 128) *(uint4*)dst = make_uint4(cw[0], cw[1], cw[2], cw[3]);
    else if constexpr (GS == 64) *(uint2*)dst = make_uint2(cw[0], cw[1]);
    else *(unsigned int*)dst = cw[0];
    scales[(u64)r * groups + g] = __half_as_ushort(scale_h);
    if (!sym) offsets[(u64)r * groups + g] = __half_as_ushort(offset_h);
}

#define BIN_ENTRY(GSV)                                                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) bw_bin_g##GSV##_bf16(                      \
        const void* w, int n_rows, int k, int sym, unsigned char* codes, unsigned short* scales,        \
        unsigned short* offsets, u64* status) {                                                         \
        bin_kernel<IN_BF16, GSV>(w, n_rows, k, sym, codes, scales, offsets, status);                   \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, 3) bw_bin_g##GSV##_f16(                       \
        const void* w, int n_rows, int k, int sym, unsigned char* codes, unsigned short* scales,        \
        unsigned short* offsets, u64* status) {                                                         \
        bin_kernel<IN_F16, GSV>(w, n_rows, k, sym, codes, scales, offsets, status);                    \
    }
BIN_ENTRY(32)
BIN_ENTRY(64)
BIN_ENTRY(128)

// bw_rowpc_*: per-channel integer 4- and 8-bit and NF4 groups (one group per row) of a 16-bit
// input with K a multiple of 8 and K ≤ 256·CPL (CPL 16 or 24), in one launch that reads the input once: a warp
// holds one whole row in registers (lane l: chunks l + 32i, i < CPL, so that each load instruction
// reads 512 contiguous bytes), reduces its range with shuffles, fits the row's parameters once
// and quantizes. A block is 8 consecutive rows. qpack codes are stored straight from the
// registers (each store instruction: 128 or 256 contiguous bytes); GPTQ's qweight [K·b/32, N] is
// staged in shared memory (dynamic, 8·S words with S = K·b/32 rounded up to a multiple of 32) and
// written as runs of 8 consecutive words. Row rr's word wi sits at rr·S + (wi xor 4·rr): a warp
// writing its row's words (int4: 32 consecutive ones) and a warp reading words wi..wi+3 of all 8
// rows both touch 32 distinct banks.
#define RPC_ROWS WARPS

template <int DT, int GRID, int BITS, int CPL>
__device__ __forceinline__ void rowpc_kernel(PIECE_PARAMS) {
#ifdef QPACK_HOST_STANDINS
    static unsigned int rstage[(48 << 10) / 4];  // the stand-ins' shared memory: one block at a time
#else
    extern __shared__ unsigned int rstage[];
#endif
    constexpr int wpc = BITS / 4, maxq = (1 << BITS) - 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * RPC_ROWS, r = r0 + warp;
    const bool live = r < n_rows;
    const int nchunks = k / 8;
    const u64 base = (u64)min(r, n_rows - 1) * k;  // rows past N reload the last
    Raw<DT> x[CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        const int c = lane + 32 * i;
        if (c < nchunks) load_raw<DT>(w, base + 8 * c, 8, true, x[i]);
        else x[i].u[0] = x[i].u[1] = x[i].u[2] = x[i].u[3] = 0u;  // +0s: the range includes 0 anyway
    }
    float lo, hi;
    bool finite;
    range16<DT, CPL>(x, 0, CPL, lo, hi, finite);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, off));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, off));
    }
    finite = __all_sync(0xffffffffu, finite);
    __half scale_h;
    float scale, zero = 0.0f;
    if (GRID == GRID_INT) int_params(lo, hi, sym, maxq, &scale_h, &scale, &zero);
    else nf4_params(fmaxf(-lo, hi), &scale_h, &scale);
    const RecipInt p = recip_int(scale, zero, maxq, fmaxf(-lo, hi));
    const bool ok = p.safe && finite;  // warp-uniform, as is everything that depends on the row
    float t[15];
    if (GRID == GRID_NF4) {
#pragma unroll
        for (int i = 0; i < 15; i++) t[i] = __ldg(nf4t + i);
    }
    // emit stores chunk i's words: qpack codes straight to the row, GPTQ's to the stage.
    const int words = nchunks * wpc, stride = (words + 31) & ~31;
    unsigned char* row = codes + (u64)r * ((u64)nchunks * BITS);
    // word m of chunk lane + 32i is word wi = wpc·lane + m + 32·wpc·i of the row, at
    // (wpc·lane xor 4·warp) + m + 32·wpc·i (m < 2 and 32·wpc·i leave the xor's bits alone).
    unsigned int* const staged = rstage + warp * stride + ((wpc * lane) ^ (warp << 2));
    auto emit = [&](int i, const unsigned int (&word)[wpc]) {
        const int c = lane + 32 * i;
        if (c >= nchunks) return;
        if (GRID == GRID_INT && layout == LAYOUT_GPTQ) {  // GPTQ holds integer grids only
#pragma unroll
            for (int m = 0; m < wpc; m++) staged[32 * wpc * i + m] = word[m];
        } else if (live) {
            if constexpr (BITS == 4) *(unsigned int*)(row + 4 * c) = word[0];
            else *(uint2*)(row + 8 * c) = make_uint2(word[0], word[1]);
        }
    };
    // Rounding is monotone in w: when the row's extremes round inside the code range, every weight
    // does and needs no clamp (two instructions per weight; warp-uniform). Symmetric rows
    // often round their positive extreme to 2^(b−1), one past the range, and are clamped.
    const bool inside = GRID == GRID_INT && ok && int_round_exact(lo, p) >= p.nlo && int_round_exact(hi, p) <= p.nhi;
    if (ok) {  // warp-uniform
#pragma unroll
        for (int i = 0; i < CPL; i++) {
            unsigned int word[wpc];
            if (GRID == GRID_NF4) {
                word[0] = 0;
#pragma unroll
                for (int e = 0; e < 8; e++) word[0] |= nf4_code(quotient_exact(raw_at<DT>(x[i], e), p), t) << (4 * e);
            } else if (inside) {
                int_chunk_words<DT, BITS, false>(x[i], p, zero, word);
            } else {
                int_chunk_words<DT, BITS, true>(x[i], p, zero, word);
            }
            emit(i, word);
        }
    } else {  // not finite, or an unsafe row (rare): the true division, and the status report
#pragma unroll 1
        for (int i = 0; i < CPL; i++) {
            const int c = lane + 32 * i;
            if (c >= nchunks) break;
            u64 bits;
            const unsigned int bad = chunk_codes_div<DT, GRID, BITS>(w, base + 8 * c, scale, zero, t, bits);
            if (bad) atomicMin(status, base + 8 * c + __ffs(bad) - 1);
            unsigned int word[wpc];
#pragma unroll
            for (int m = 0; m < wpc; m++) word[m] = (unsigned int)(bits >> (32 * m));
            emit(i, word);
        }
    }
    if (live && lane == 0) {
        scales[r] = __half_as_ushort(scale_h);  // [1, N] and [N, 1] alike
        if (non_finite(scale)) atomicMin(status + 1, (u64)r);
        if (GRID == GRID_INT && layout == LAYOUT_QPACK && !sym) zeros[r] = (unsigned char)zero;
    }
    if (GRID != GRID_INT || layout == LAYOUT_QPACK) return;
    // GPTQ (block-uniform from here on): qweight from the stage, and qzeros.
    __syncthreads();
    // Thread t writes row t mod 8's words t/8, t/8 + 32, …: a warp instruction stores 4 runs of 8
    // words. (wi + 32i) xor 4·rr is (wi xor 4·rr) + 32i, so both addresses just step.
    const int rows = min(RPC_ROWS, n_rows - r0), rr = threadIdx.x % RPC_ROWS;
    if (rr < rows) {
        constexpr int step = THREADS / RPC_ROWS;
        const unsigned int* src = rstage + rr * stride + ((threadIdx.x / RPC_ROWS) ^ (rr << 2));
        unsigned int* dst = (unsigned int*)codes + (u64)(threadIdx.x / RPC_ROWS) * n_rows + r0 + rr;
        const u64 dst_step = (u64)step * n_rows;
#pragma unroll 4
        for (int wi = threadIdx.x / RPC_ROWS; wi < words; wi += step, src += step, dst += dst_step) *dst = *src;
    }
    // qzeros [1, ceil(N·b/32)]: word r/rpw holds rows r..r+rpw−1, (z − zero_shift) mod 2^b each.
    // The rows' zero points pass through the stage once it is read (a static array beside it
    // would not fit when the stage takes the whole default 48 KiB).
    constexpr int rpw = 32 / BITS;
    __syncthreads();
    if (lane == 0) rstage[warp] = (unsigned int)zero;
    __syncthreads();
    if (threadIdx.x < RPC_ROWS / rpw && threadIdx.x * rpw < rows) {
        unsigned int zw = 0;
        for (int i = 0; i < rpw && threadIdx.x * rpw + i < rows; i++)
            zw |= ((rstage[threadIdx.x * rpw + i] - zero_shift) & maxq) << (BITS * i);
        ((unsigned int*)zeros)[r0 / rpw + threadIdx.x] = zw;
    }
}

// CPL 16 (K ≤ 4096) and 24 (K ≤ 6144) fit 128 registers (2 blocks per SM). A CPL 32 variant
// (K ≤ 8192, 156 registers, 1 block per SM) ran at 36% of the copy and was dropped; longer rows
// keep the two-kernel path. The division path is a loop, to keep the unrolled code (and the PTX)
// smaller.
#define ROWPC_ENTRY(name, GRIDV, BITSV, CPLV, MIN_BLOCKS)                                              \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) name##_bf16(PIECE_PARAMS) {     \
        rowpc_kernel<IN_BF16, GRIDV, BITSV, CPLV>(PIECE_ARGS);                                         \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) name##_f16(PIECE_PARAMS) {      \
        rowpc_kernel<IN_F16, GRIDV, BITSV, CPLV>(PIECE_ARGS);                                          \
    }
ROWPC_ENTRY(bw_rowpc_int4_c16, GRID_INT, 4, 16, 2)
ROWPC_ENTRY(bw_rowpc_int4_c24, GRID_INT, 4, 24, 2)
ROWPC_ENTRY(bw_rowpc_int8_c16, GRID_INT, 8, 16, 2)
ROWPC_ENTRY(bw_rowpc_int8_c24, GRID_INT, 8, 24, 2)
ROWPC_ENTRY(bw_rowpc_nf4_c16, GRID_NF4, 4, 16, 2)
ROWPC_ENTRY(bw_rowpc_nf4_c24, GRID_NF4, 4, 24, 2)

// bw_check_round_exact is TestGPURoundExactExhaustive: thread t takes the 16-bit weight pattern t
// (BF16 or F16 by dtype) and every finite positive F16 scale, and compares int_round_exact with
// rintf of the true division (nf4t null), or the NF4 code of quotient_exact with that of the true
// division (nf4t the thresholds), wherever RecipInt.safe holds. counts[0] gets the mismatches,
// counts[1] the pairs compared; first gets the lowest mismatching weight << 16 | scale bits.
// With the thresholds, nf4_code_table's clamped variant is compared too, on every pair, and the
// unclamped one where the scale is a normal F16 and |w| ≤ scale·(1 + 2^-10), as in the kernels
// (the loop over scales is the same in every lane: the table's shuffles see the whole warp).
extern "C" __global__ void bw_check_round_exact(int dtype, const float* nf4t, u64* counts, unsigned int* first) {
    const unsigned int bits = blockIdx.x * blockDim.x + threadIdx.x;
    if (bits > 0xffffu) return;  // whole warps
    const float w = dtype == IN_BF16 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half((unsigned short)bits));
    const bool finite = !non_finite(w);
    float t[15], thr = 0.0f;
    unsigned int tbase = 0;
    if (nf4t) {
#pragma unroll
        for (int i = 0; i < 15; i++) t[i] = nf4t[i];
        nf4_bucket(t, thr, tbase);
    }
    u64 bad = 0, checked = 0;
    for (unsigned int sb = 1; sb < 0x7c00u; sb++) {
        const float scale = __half2float(__ushort_as_half((unsigned short)sb));
        const RecipInt p = recip_int(scale, 0.0f, 15, fabsf(w));
        const bool safe = finite && p.safe;
        bool same;
        if (nf4t) {
            const float x = quotient_exact(w, p);
            const unsigned int want = nf4_code(__fdiv_rn(w, scale), t);
            const unsigned int clamped = nf4_code_table<true>(x, thr, tbase), plain = nf4_code_table<false>(x, thr, tbase);
            same = nf4_code(x, t) == want && clamped == want &&
                   (sb < 0x0400u || fabsf(w) > __fmul_rn(scale, 1.0009765625f) || plain == want);
        } else {
            same = int_round_exact(w, p) == rintf(__fdiv_rn(w, scale));
        }
        if (!safe) continue;
        checked++;
        if (!same) {
            bad++;
            atomicMin(first, bits << 16 | sb);
        }
    }
    atomicAdd(counts, bad);
    atomicAdd(counts + 1, checked);
}
