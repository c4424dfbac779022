// GPTQ on the GPU, launched by gptq.GPUSolver. The pure-Go gptq.Quantize is the reference:
// every kernel here does one of its steps with the same float32 operations (true divisions,
// no fused multiply-adds, rounding half to even), so that codes agree except where the
// different summation order of the trailing GEMM moves a weight across a rounding tie.
//
// Matrices: W and U row-major; the factor F of cuSOLVER column-major (F(a, b) at a + b·K).
// Positions i are columns in quantization order (perm[i] is the original column).

typedef unsigned long long u64;

#define WARPS 8           // rows (one warp each) per block of gptq_block
#define BS 128            // columns per lazy batch; gptq.GPUSolver requires BlockSize 128
#define PACKED (BS * (BS + 1) / 2)

__device__ __forceinline__ bool finite(float v) { return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }

// round_f16 is quant.RoundF16: to the nearest F16 (ties to even, overflow to ±Inf) and back.
__device__ __forceinline__ float round_f16(float x) {
    unsigned short h;
    float y;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(h));
    return y;
}

// int_params is quant.Scheme.IntParamsRange for the group range [lo, hi].
__device__ void int_params(float lo, float hi, int maxq, int sym, float* scale, int* zero) {
    float xmin = fminf(lo, 0.f), xmax = fmaxf(hi, 0.f);
    if (sym) {
        xmax = fmaxf(-xmin, xmax);
        if (xmin < 0.f) xmin = -xmax;
    }
    if (xmin == 0.f && xmax == 0.f) {
        xmin = -1.f;
        xmax = 1.f;
    }
    float s = round_f16(__fdiv_rn(__fsub_rn(xmax, xmin), (float)maxq));
    if (s == 0.f) s = 5.9604644775390625e-08f;  // F16's smallest subnormal, 2^-24
    *scale = s;
    if (sym) {
        *zero = (maxq + 1) / 2;
    } else {
        *zero = (int)fminf(fmaxf(rintf(__fdiv_rn(-xmin, s)), 0.f), (float)maxq);
    }
}

// quantize is quant.Scheme.QuantizeInt: clamp(round(w/scale) + zero, 0, maxq).
__device__ __forceinline__ int quantize(float w, float scale, int zero, int maxq) {
    return (int)fminf(fmaxf(rintf(__fdiv_rn(w, scale)) + (float)zero, 0.f), (float)maxq);
}

__device__ __forceinline__ void warp_min_max(float& lo, float& hi) {
    for (int o = 16; o > 0; o >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// store_params writes one group's parameters and notes (lowest flat index wins) a scale that
// overflowed F16.
__device__ void store_params(int r, int g, int groups, float lo, float hi, int maxq, int sym, float* scales,
                             unsigned char* zeros, u64* status) {
    float scale;
    int zero;
    int_params(lo, hi, maxq, sym, &scale, &zero);
    u64 at = (u64)r * groups + g;
    scales[at] = scale;
    zeros[at] = (unsigned char)zero;
    if (!finite(scale)) atomicMin(status, at);
}

// gptq_build_factor fills the lower triangle of F with J·P·(H + λI)·Pᵀ·J, where rev[a] is the
// original column at reversed position a (perm[K−1−a]) and dead columns get H_ii = 1.
extern "C" __global__ void gptq_build_factor(const double* h, const int* rev, const unsigned char* dead, int k,
                                             double lambda, double* f) {
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y * blockDim.y + threadIdx.y;
    if (a >= k || b >= k || b > a) return;
    int ra = rev[a];
    double v = h[(u64)ra * k + rev[b]];
    if (a == b) v = (dead[ra] ? 1.0 : v) + lambda;
    f[(u64)b * k + a] = v;
}

// gptq_set_diagonal sets the diagonal of the K×K matrix a to v (the identity that the
// triangular solve inverts from, after zeroing).
extern "C" __global__ void gptq_set_diagonal(double* a, int k, double v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) a[(u64)i * k + i] = v;
}

// gptq_unreverse writes U = J·L⁻¹·J as float32 (row-major, zero below the diagonal) from the
// lower triangle of F holding L⁻¹, and sets *bad when an entry is not finite or a diagonal
// entry is not positive.
extern "C" __global__ void gptq_unreverse(const double* f, int k, float* u, int* bad) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= k || j >= k) return;
    float v = 0.f;
    if (j >= i) {
        v = (float)f[(u64)(k - 1 - j) * k + (k - 1 - i)];
        if (!finite(v) || (j == i && !(v > 0.f))) *bad = 1;
    }
    u[(u64)i * k + j] = v;
}

// gptq_load_weights fills the working weights: w[r, i] = W[r, perm[i]], dead columns zero.
extern "C" __global__ void gptq_load_weights(const float* orig, const int* perm, const unsigned char* dead, int n,
                                             int k, float* w) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    int c = perm[i];
    for (int r = blockIdx.y; r < n; r += gridDim.y) w[(u64)r * k + i] = dead[c] ? 0.f : orig[(u64)r * k + c];
}

// gptq_fit_fixed fits the parameters that precede all updates, one warp per (row, group) of
// the original column order: per-channel from the row as given (gsize = K, zero_dead = 0),
// static groups from the row with dead columns zeroed.
extern "C" __global__ void gptq_fit_fixed(const float* orig, const unsigned char* dead, int n, int k, int gsize,
                                          int groups, int zero_dead, int bits, int sym, float* scales,
                                          unsigned char* zeros, u64* status) {
    u64 job = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (job >= (u64)n * groups) return;
    int r = (int)(job / groups), g = (int)(job % groups);
    int end = min((g + 1) * gsize, k);
    float lo = 0.f, hi = 0.f;
    for (int c = g * gsize + lane; c < end; c += 32) {
        float v = (zero_dead && dead[c]) ? 0.f : orig[(u64)r * k + c];
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    warp_min_max(lo, hi);
    if (lane == 0) store_params(r, g, groups, lo, hi, (1 << bits) - 1, sym, scales, zeros, status);
}

// gptq_block quantizes the columns [i1, i1 + count) of every row, one warp per row: first it
// fits the on-the-fly groups that start in the block from the weights as they are (before this
// block's own updates, like the reference's find_params on the outer W), then for each column
// i: q = quantize(w_i), e = (w_i − q)/U[i,i], w_j −= e·U[i,j] for the later columns of the block.
// Lane l holds the block columns l, l+32, l+64, l+96; the owner of column i computes e and
// broadcasts it. The block's upper triangle of U sits packed in shared memory (33 KB).
// Outputs: codes in original column order, e in err[r, 0:count] (row-major N×BS) for the
// trailing GEMM, and Σ e² added to row_sq[r] (float64).
extern "C" __global__ void __launch_bounds__(32 * WARPS) gptq_block(
    const float* w, const float* u, int n, int k, int i1, int count, int bits, int sym, int gsize, int groups,
    int on_the_fly, const int* pos_group, const int* perm, float* scales, unsigned char* zeros,
    unsigned char* codes, float* err, double* row_sq, u64* status) {
    __shared__ float us[PACKED];  // row a of the block: us[start(a) + b − a] = U[i1+a, i1+b], b ≥ a
    for (int idx = threadIdx.x; idx < BS * BS; idx += blockDim.x) {
        int a = idx / BS, b = idx % BS;
        if (b < a) continue;
        int start = a * BS - a * (a - 1) / 2;
        us[start + b - a] = (a < count && b < count) ? u[(u64)(i1 + a) * k + i1 + b] : 0.f;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int r = blockIdx.x * WARPS + threadIdx.x / 32;
    if (r >= n) return;
    const float* row = w + (u64)r * k;
    const int maxq = (1 << bits) - 1;

    if (on_the_fly) {
        for (int p = (i1 + gsize - 1) / gsize * gsize; p < i1 + count; p += gsize) {
            int end = min(p + gsize, k);
            float lo = 0.f, hi = 0.f;
            for (int c = p + lane; c < end; c += 32) {
                float v = row[c];
                lo = fminf(lo, v);
                hi = fmaxf(hi, v);
            }
            warp_min_max(lo, hi);
            if (lane == 0) store_params(r, pos_group[p], groups, lo, hi, maxq, sym, scales, zeros, status);
        }
        __syncwarp();
    }

    float x[4], scale[4], e_own[4];
    int zero[4], code[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        x[t] = 0.f;
        scale[t] = 1.f;
        zero[t] = 0;
        e_own[t] = 0.f;
        code[t] = 0;
        if (c < count) {
            x[t] = row[i1 + c];
            u64 at = (u64)r * groups + pos_group[i1 + c];
            scale[t] = scales[at];
            zero[t] = zeros[at];
        }
    }
    double sq = 0.0;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        for (int l = 0; l < 32; l++) {
            const int i = t * 32 + l;
            if (i >= count) break;
            const float* ui = us + (i * BS - i * (i - 1) / 2) - i;  // ui[j] = U[i1+i, i1+j] for j ≥ i
            float e = 0.f;
            if (lane == l) {
                int q = quantize(x[t], scale[t], zero[t], maxq);
                float deq = __fmul_rn(scale[t], (float)(q - zero[t]));
                e = __fdiv_rn(__fsub_rn(x[t], deq), ui[i]);
                code[t] = q;
                e_own[t] = e;
                sq += (double)e * (double)e;
            }
            e = __shfl_sync(0xffffffffu, e, l);
#pragma unroll
            for (int tt = t; tt < 4; tt++) {
                int j = tt * 32 + lane;
                if (j > i) x[tt] = __fsub_rn(x[tt], __fmul_rn(e, ui[j]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        if (c < count) {
            codes[(u64)r * k + perm[i1 + c]] = (unsigned char)code[t];
            err[(u64)r * BS + c] = e_own[t];
        }
    }
    sq = warp_sum(sq);
    if (lane == 0) row_sq[r] += sq;
}

// gptq_squared_error sets row_dq[r] = Σ_c (W[r, c] − Q[r, c])² in float64 (dead columns of W
// as zero; Q = scale·(code − zero) in float32), one warp per row.
extern "C" __global__ void gptq_squared_error(const float* orig, const unsigned char* dead,
                                              const unsigned char* codes, const float* scales,
                                              const unsigned char* zeros, const int* col_group, int n, int k,
                                              int groups, double* row_dq) {
    int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= n) return;
    double sum = 0.0;
    for (int c = lane; c < k; c += 32) {
        u64 at = (u64)r * groups + col_group[c];
        float q = __fmul_rn(scales[at], (float)((int)codes[(u64)r * k + c] - (int)zeros[at]));
        float v = dead[c] ? 0.f : orig[(u64)r * k + c];
        double d = (double)v - (double)q;
        sum += d * d;
    }
    sum = warp_sum(sum);
    if (lane == 0) row_dq[r] = sum;
}

// gptq_widen_live sets out[r, c] = W[r, c] in float64, 0 for dead columns: the weights of the
// baseline loss tr(W H Wᵀ). One thread per element.
extern "C" __global__ void gptq_widen_live(const float* orig, const unsigned char* dead, double* out, u64 total, int k) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = dead[i % k] ? 0.0 : (double)orig[i];
}

// gptq_row_dot sets out[r] = Σ_c a[r, c]·b[r, c] in float64, one warp per row.
extern "C" __global__ void gptq_row_dot(const double* a, const double* b, int n, int k, double* out) {
    int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= n) return;
    double sum = 0.0;
    for (int c = lane; c < k; c += 32) sum += a[(u64)r * k + c] * b[(u64)r * k + c];
    sum = warp_sum(sum);
    if (lane == 0) out[r] = sum;
}
