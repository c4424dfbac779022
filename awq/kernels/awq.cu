// AWQ's searches on the GPU (awq/search_cuda.go). The candidates of both searches are
// fake-quantized here with the arithmetic of the pure-Go reference — quant.Scheme.IntParamsRange
// for a group's scale and zero point, the float32 quotient rounded half to even for its codes,
// scale·(q − z) back — so that each candidate weight equals the CPU's bit for bit; the output
// errors are then cuBLAS GEMMs of those weight differences with the sampled inputs, reduced here
// in double precision in a fixed order. Every product, sum and quotient that the reference
// rounds in float32 is a rounded intrinsic (__fmul_rn, __fdiv_rn, ...) so that nvcc cannot fuse
// it into an FMA, which rounds differently from Go.
// Machine code for the H100 and H200 ships beside the PTX, so that they skip the JIT:
// qpack-cubin: sm_90

#include <cuda_fp16.h>
#include <stdint.h>

#define GROUP_THREADS 128 // the block size of fake_quant_diff
#define SUM_THREADS 256   // the block size of sum_squares_partial

struct params {
    float scale;
    int zero;
};

__device__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }

// int_params is quant.Scheme.IntParamsRange.
__device__ params int_params(float xmin, float xmax, int maxq, int sym) {
    xmin = fminf(xmin, 0.f);
    xmax = fmaxf(xmax, 0.f);
    if (sym) {
        xmax = fmaxf(-xmin, xmax);
        if (xmin < 0.f) xmin = -xmax;
    }
    if (xmin == 0.f && xmax == 0.f) {
        xmin = -1.f;
        xmax = 1.f;
    }
    params p;
    p.scale = round_f16(__fdiv_rn(__fsub_rn(xmax, xmin), (float)maxq));
    if (p.scale == 0.f) p.scale = 5.9604644775390625e-08f; // F16's smallest subnormal
    if (sym) {
        p.zero = (maxq + 1) / 2;
    } else {
        double z = rint((double)__fdiv_rn(-xmin, p.scale));
        p.zero = (int)fmin(fmax(z, 0.0), (double)maxq);
    }
    return p;
}

// dequantized is scale·(clamp(round_half_even(w/scale) + zero, 0, maxq) − zero): blockwise's
// integer encode followed by quant.DequantizeInt.
__device__ float dequantized(float w, params p, int maxq) {
    double q = rint((double)__fdiv_rn(w, p.scale)) + (double)p.zero;
    int code = (int)fmin(fmax(q, 0.0), (double)maxq);
    return __fmul_rn(p.scale, (float)(code - p.zero));
}

// block_min_max reduces lo and hi (and am, the largest |w|) over the block's threads.
__device__ void block_min_max(float* lo, float* hi, float* am) {
    __shared__ float s_lo[GROUP_THREADS / 32], s_hi[GROUP_THREADS / 32], s_am[GROUP_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        *lo = fminf(*lo, __shfl_xor_sync(0xffffffff, *lo, o));
        *hi = fmaxf(*hi, __shfl_xor_sync(0xffffffff, *hi, o));
        *am = fmaxf(*am, __shfl_xor_sync(0xffffffff, *am, o));
    }
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        s_lo[warp] = *lo;
        s_hi[warp] = *hi;
        s_am[warp] = *am;
    }
    __syncthreads();
    for (int i = 0; i < GROUP_THREADS / 32; i++) {
        *lo = fminf(*lo, s_lo[i]);
        *hi = fmaxf(*hi, s_hi[i]);
        *am = fmaxf(*am, s_am[i]);
    }
}

// fake_quant_diff: one block per (row r, group g) of w [rows, k] (row-major), blockIdx.x =
// r·groups + g, groups of gs input channels (the last may be shorter).
//
// With s (len k): the α search's candidate. v = w·s[c] is quantized with the group's min-max
// parameters and d = Q(v)/s[c] − w, the change the scaled-and-quantized weight makes (awq's
// fakeQuantScaled minus W).
//
// Without s: the clipping search's candidate. The group is clamped to ±m, m = absmax·shrink
// (clampGroups), quantized, and d = w − Q(clamp(w)) (SearchClip's difference); absmax (len
// rows·groups, may be null) receives each group's max |w|.
extern "C" __global__ void fake_quant_diff(const float* w, const float* s, float* d, float* absmax, int k, int gs,
                                           int groups, int maxq, int sym, float shrink) {
    long long r = blockIdx.x / groups;
    int g = blockIdx.x % groups;
    int c0 = g * gs, len = min(gs, k - c0);
    const float* wr = w + r * k + c0;
    float lo = 0.f, hi = 0.f, am = 0.f;
    for (int c = threadIdx.x; c < len; c += GROUP_THREADS) {
        float v = s ? __fmul_rn(wr[c], s[c0 + c]) : wr[c];
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
        am = fmaxf(am, fabsf(v));
    }
    block_min_max(&lo, &hi, &am);
    float m = __fmul_rn(am, shrink);
    if (!s) { // the clamped group's extremes are the clamped extremes
        lo = fminf(fmaxf(lo, -m), m);
        hi = fminf(fmaxf(hi, -m), m);
        if (absmax && threadIdx.x == 0) absmax[blockIdx.x] = am;
    }
    params p = int_params(lo, hi, maxq, sym);
    float* dr = d + r * k + c0;
    for (int c = threadIdx.x; c < len; c += GROUP_THREADS) {
        float v = wr[c];
        if (s) {
            dr[c] = __fsub_rn(__fdiv_rn(dequantized(__fmul_rn(v, s[c0 + c]), p, maxq), s[c0 + c]), v);
        } else {
            dr[c] = __fsub_rn(v, dequantized(fminf(fmaxf(v, -m), m), p, maxq));
        }
    }
}

// sum_squares_partial: partial[blockIdx.x] = Σ x[i]² over the elements i ≡ blockIdx.x·SUM_THREADS
// + threadIdx.x (mod gridDim.x·SUM_THREADS), each thread in index order, then the block's threads
// in a fixed tree: the same sum on every run for a given grid. The host adds the partials.
extern "C" __global__ void sum_squares_partial(const float* x, long long n, double* partial) {
    __shared__ double s_sum[SUM_THREADS];
    double sum = 0;
    for (long long i = (long long)blockIdx.x * SUM_THREADS + threadIdx.x; i < n; i += (long long)gridDim.x * SUM_THREADS) {
        double v = x[i];
        sum = __dadd_rn(sum, __dmul_rn(v, v));
    }
    s_sum[threadIdx.x] = sum;
    __syncthreads();
    for (int o = SUM_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) s_sum[threadIdx.x] = __dadd_rn(s_sum[threadIdx.x], s_sum[threadIdx.x + o]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s_sum[0];
}

// group_errors: for row r and group g (one thread each, i = r·groups + g), err = Σ_t e_g[r, t]² / t
// where e_g [rows, t] is column-major at e + g·rows·t (the GEMM of group g's weight differences
// with the sampled inputs): SearchClip's groupErrors. At step 0 err0[i] = err; whenever err <
// best[i], best[i] = err and best_max[i] = absmax[i]·shrink.
extern "C" __global__ void group_errors(const float* e, int rows, int groups, int t, const float* absmax, float shrink,
                                        int step, double* err0, double* best, float* best_max) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * groups) return;
    int r = i / groups, g = i % groups;
    const float* eg = e + (long long)g * rows * t + r;
    double sum = 0;
    for (int tok = 0; tok < t; tok++) {
        double v = eg[(long long)tok * rows];
        sum = __dadd_rn(sum, __dmul_rn(v, v));
    }
    double err = __ddiv_rn(sum, (double)max(t, 1));
    if (step == 0) {
        err0[i] = err;
        best[i] = err;
        best_max[i] = __fmul_rn(absmax[i], shrink);
    } else if (err < best[i]) {
        best[i] = err;
        best_max[i] = __fmul_rn(absmax[i], shrink);
    }
}

// gather_rows: dst[i] = src[first + i·stride] for count rows of cols floats: the every-stride-th
// calibration tokens the α search keeps.
extern "C" __global__ void gather_rows(float* dst, const float* src, int cols, long long first, long long stride,
                                       long long count) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count * cols) return;
    long long row = i / cols;
    dst[i] = src[(first + row * stride) * cols + i % cols];
}

// divide_columns: x[r, c] /= s[c] for x [rows, cols]: the kept inputs as the folded model sees them.
extern "C" __global__ void divide_columns(float* x, const float* s, long long rows, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    x[i] = __fdiv_rn(x[i], s[i % cols]);
}
