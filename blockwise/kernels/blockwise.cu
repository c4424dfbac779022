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

// Integer grid parameters from the group's range (both ends already include 0):
// quant.Scheme.IntParamsRange.
__device__ __forceinline__ void int_params(float xmin, float xmax, int sym, int maxq, __half* scale_h, float* scale, float* zero) {
    if (sym) {
        xmax = fmaxf(-xmin, xmax);
        if (xmin < 0.0f) xmin = -xmax;
    }
    if (xmin == 0.0f && xmax == 0.0f) {
        xmin = -1.0f;
        xmax = 1.0f;
    }
    __half h = __float2half_rn(__fdiv_rn(xmax - xmin, (float)maxq));
    if (__half2float(h) == 0.0f) h = __ushort_as_half((unsigned short)1);
    *scale_h = h;
    *scale = __half2float(h);
    *zero = sym ? (float)((maxq + 1) / 2) : fminf(fmaxf(rintf(__fdiv_rn(-xmin, *scale)), 0.0f), (float)maxq);
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
//   scale or offset is not finite in F16. Both start at ~0 (bw_reset_status).
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

        unsigned int lo_codes = 0, hi_codes = 0;  // codes 0-3 and 4-7, each packed from bit 0
#pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned int code = 0;
            if (j < nv) {
                const float x = v[j];
                if (GRID == GRID_INT) {
                    code = (unsigned int)fminf(fmaxf(rintf(__fdiv_rn(x, scale)) + zero, 0.0f), (float)maxq);
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

extern "C" __global__ void bw_reset_status(u64* status) {
    if (threadIdx.x < 2) status[threadIdx.x] = ~0ull;
}
