// GPTQ on the GPU, launched by gptq.GPUSolver. The pure-Go gptq.Quantize is the reference:
// every kernel here does one of its steps with the same float32 operations (true divisions,
// no fused multiply-adds, rounding half to even), so that codes agree except where the
// different summation order of the trailing GEMM moves a weight across a rounding tie.
//
// Matrices: W and T′ row-major; the factor F of cuSOLVER column-major (F(a, b) at a + b·K).
// Positions i are columns in quantization order (perm[i] is the original column).
// Machine code for the H100 and H200 ships beside the PTX, so that they skip the JIT:
// qpack-cubin: sm_90

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

// h_entry is entry i of H: of the float64 matrix h, or where h is null of scale·gram, a
// calibration's float32 Gram matrix widened and scaled as it is read (one rounding: the double
// gptq_scale_gram wrote into h before, without h's 8·K² bytes).
__device__ __forceinline__ double h_entry(const double* h, const float* gram, double scale, u64 i) {
    return h ? h[i] : (double)gram[i] * scale;
}

// gptq_build_factor fills the lower triangle of F with J·P·(H + λI)·Pᵀ·J, where rev[a] is the
// original column at reversed position a (perm[K−1−a]) and dead columns get H_ii = 1 (H as
// h_entry reads it). H is symmetric: entry (ra, rb) is read from row rb, where consecutive a are
// consecutive columns in the natural order (rev reverses it), so that a warp's reads are contiguous.
extern "C" __global__ void gptq_build_factor(const double* h, const float* gram, double scale, const int* rev,
                                             const unsigned char* dead, int k, double lambda, double* f) {
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y * blockDim.y + threadIdx.y;
    if (a >= k || b >= k || b > a) return;
    int ra = rev[a];
    double v = h_entry(h, gram, scale, (u64)rev[b] * k + ra);
    if (a == b) v = (dead[ra] ? 1.0 : v) + lambda;
    f[(u64)b * k + a] = v;
}

// gptq_unreverse writes T′ from T = J·L·J (L the lower triangle of F, cuSOLVER's Cholesky
// factor of the reversed H) as float32, row-major, zero below the diagonal: T′(i, j) =
// T(i, j)/T(j, j) above the diagonal (the quotient in float64), T(i, i) on it; it sets *bad when
// an entry is not finite or a diagonal entry not positive. T(i, j) is F(k−1−i, k−1−j) of
// column-major F: a transpose, so each block of 32×8 threads moves a 32×32 tile through shared
// memory, reading F's columns and writing T′'s rows contiguously.
extern "C" __global__ void gptq_unreverse(const double* f, int k, float* t, int* bad) {
    __shared__ float tile[32][33];  // tile[j − j0][i − i0]; padded against bank conflicts
    const int i0 = blockIdx.y * 32, j0 = blockIdx.x * 32;
    const int tx = threadIdx.x, ty = threadIdx.y;  // 32 × 8
    for (int dj = ty; dj < 32; dj += 8) {  // read: consecutive tx are consecutive rows of F
        int i = i0 + tx, j = j0 + dj;
        float v = 0.f;
        if (i < k && j < k && j >= i) {
            double x = f[(u64)(k - 1 - j) * k + (k - 1 - i)];
            v = (float)(j == i ? x : x / f[(u64)(k - 1 - j) * k + (k - 1 - j)]);
            if (!finite(v) || (j == i && !(v > 0.f))) *bad = 1;
        }
        tile[dj][tx] = v;
    }
    __syncthreads();
    for (int di = ty; di < 32; di += 8) {  // write: consecutive tx are consecutive columns of T′
        int i = i0 + di, j = j0 + tx;
        if (i < k && j < k) t[(u64)i * k + j] = tile[tx][di];
    }
}

// gptq_copy_block copies the rows [row0, row0 + rows) of the columns [col0, col0 + gridDim.y)
// of a column-major float64 matrix with leading dimension ld from src to dst, where dst may be
// another GPU's copy (peer access): what a GPU solved of a factorisation shared among GPUs,
// pushed into the others' matrices.
extern "C" __global__ void gptq_copy_block(const double* src, double* dst, int ld, int row0, int rows, int col0) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    u64 at = (u64)(col0 + blockIdx.y) * ld + row0 + r;
    dst[at] = src[at];
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

// ---- Searched group fits: Options.Weighted (blockwise/weighted.go's weightedSearch) and
// Options.MSE (blockwise/clip.go's clipSearch) ----
//
// One warp fits one (row, group). The CPU tries the candidates one after another, keeping the
// first one with the smallest error; which candidates it tries never depends on the errors
// found so far, and its early exit (stop summing once the sum reaches the best error) never
// changes the winner. So here each lane evaluates a share of the candidates with the CPU's
// arithmetic, every sum over the group's weights in the CPU's order (a lane reads the
// weights one after another; all lanes read the same weight at once), and the warp then picks
// the smallest error, ties to the earliest candidate in the CPU's order. Products, sums and
// quotients are rounded intrinsics, as in blockwise/kernels/weighted.cu, so that nvcc cannot
// contract them into FMAs, which round differently from Go.

#define WSTEPS 40  // blockwise's weightedSteps
#define WGRID 50   // weightedGrid
#define CSTEPS 80  // blockwise's clipSteps
#define CGRID 100  // clipGrid

// group_view is one group's weights and importance, from its first column.
struct group_view {
    const float* w;
    const unsigned char* dead;  // null, or dead columns: their weights count as 0
    const float* imp;           // null: importance 1 (the search's plain squared error)
    int len;
    __device__ __forceinline__ float at(int i) const { return (dead && dead[i]) ? 0.f : w[i]; }
    __device__ __forceinline__ double weight(int i) const { return imp ? (double)imp[i] : 1.0; }
};

// cand is a lane's best candidate so far: its error, its place in the CPU's order (key) and
// its parameters. err = +Inf: none yet (the CPU never accepts an error that is not below +Inf).
struct cand {
    double err;
    int key;
    float scale;
    int zero;
};

// consider keeps the candidate (err, key) when it beats *best: a smaller error, or the same
// error earlier in the CPU's order. An error that is not below +Inf (NaN included) never wins.
__device__ __forceinline__ void consider(cand* best, double err, int key, float scale, int zero) {
    if (!(err < __longlong_as_double(0x7ff0000000000000LL))) return;
    if (err < best->err || (err == best->err && key < best->key)) *best = cand{err, key, scale, zero};
}

// warp_best leaves in every lane the warp's smallest (err, key).
__device__ cand warp_best(cand c) {
    for (int o = 16; o > 0; o >>= 1) {
        cand other;
        other.err = __shfl_xor_sync(0xffffffffu, c.err, o);
        other.key = __shfl_xor_sync(0xffffffffu, c.key, o);
        other.scale = __shfl_xor_sync(0xffffffffu, c.scale, o);
        other.zero = __shfl_xor_sync(0xffffffffu, c.zero, o);
        consider(&c, other.err, other.key, other.scale, other.zero);
    }
    return c;
}

// sq_term is groupError's term with norm 2: imp·(Q(w) − w)² for the code q of w.
__device__ __forceinline__ double sq_term(float v, int q, float scale, int zero, const group_view& g, int i) {
    float dq = __fmul_rn(scale, (float)(q - zero));
    double d = (double)__fsub_rn(dq, v);
    double e = __dmul_rn(d, d);
    if (g.imp) e = __dmul_rn(e, (double)g.imp[i]);
    return e;
}

// sq_error is groupError with norm 2, summed to the end.
__device__ double sq_error(const group_view& g, float scale, int zero, int maxq) {
    double sum = 0.0;
    for (int i = 0; i < g.len; i++) {
        float v = g.at(i);
        sum = __dadd_rn(sum, sq_term(v, quantize(v, scale, zero, maxq), scale, zero, g, i));
    }
    return sum;
}

// weighted_job is one range of weightedSearch: for j = 0 the full span, then for step
// i = 1..39 the span shrunk by p = 1 − i/50 at both ends, and on an asymmetric grid also at
// the low end only and at the high end only (j = 1 + 3(i − 1) + end). It tries the min-max fit
// of that range (key 2j) and, when the fit is usable, its weighted least-squares refit
// (intQuantizer.refit, key 2j + 1). The refit's sums share the first pass over the weights
// with the fit's error, each sum still in the CPU's order.
__device__ void weighted_job(const group_view& g, float rlo, float rhi, int j, int maxq, int sym, cand* best) {
    int step = j, end = 0;
    if (!sym && j > 0) {
        step = 1 + (j - 1) / 3;
        end = (j - 1) % 3;
    }
    float p = __double2float_rn(__dsub_rn(1.0, __ddiv_rn((double)step, (double)WGRID)));
    float lo = end == 2 ? rlo : __fmul_rn(p, rlo);
    float hi = end == 1 ? rhi : __fmul_rn(p, rhi);
    float scale;
    int zero;
    int_params(lo, hi, maxq, sym, &scale, &zero);
    if (!finite(scale) || !(scale > 0.f)) return;  // try: a scale the format cannot hold
    double err = 0.0, sv = 0.0, sq = 0.0, sqq = 0.0, sw = 0.0, sqw = 0.0, num = 0.0, den = 0.0;
    for (int i = 0; i < g.len; i++) {
        float v = g.at(i);
        int q = quantize(v, scale, zero, maxq);
        err = __dadd_rn(err, sq_term(v, q, scale, zero, g, i));
        double c = g.weight(i), wv = (double)v;
        if (!sym) {
            double x = (double)q, cx = __dmul_rn(c, x);
            sv = __dadd_rn(sv, c);
            sq = __dadd_rn(sq, cx);
            sqq = __dadd_rn(sqq, __dmul_rn(cx, x));
            sw = __dadd_rn(sw, __dmul_rn(c, wv));
            sqw = __dadd_rn(sqw, __dmul_rn(cx, wv));
        } else {
            double x = (double)(q - zero), cx = __dmul_rn(c, x);
            num = __dadd_rn(num, __dmul_rn(cx, wv));
            den = __dadd_rn(den, __dmul_rn(cx, x));
        }
    }
    consider(best, err, 2 * j, scale, zero);
    int rzero = zero;
    if (!sym) {
        double det = __dsub_rn(__dmul_rn(sv, sqq), __dmul_rn(sq, sq));
        if (det <= 0) return;
        double a = __ddiv_rn(__dsub_rn(__dmul_rn(sv, sqw), __dmul_rn(sq, sw)), det);
        double b = __ddiv_rn(__dsub_rn(__dmul_rn(sqq, sw), __dmul_rn(sq, sqw)), det);
        if (!(a > 0)) return;
        rzero = (int)fmin(fmax(rint(__ddiv_rn(-b, a)), 0.0), (double)maxq);
        for (int i = 0; i < g.len; i++) {
            float v = g.at(i);
            double c = g.weight(i), x = (double)(quantize(v, scale, zero, maxq) - rzero), cx = __dmul_rn(c, x);
            num = __dadd_rn(num, __dmul_rn(cx, (double)v));
            den = __dadd_rn(den, __dmul_rn(cx, x));
        }
    }
    if (!(den > 0) || !(num > 0)) return;
    float rscale = round_f16(__double2float_rn(__ddiv_rn(num, den)));
    if (rscale == 0.f || !finite(rscale)) return;  // refit's ok, then try
    consider(best, sq_error(g, rscale, rzero, maxq), 2 * j + 1, rscale, rzero);
}

// go_log is Go's math.Log on amd64 (math/log_amd64.s), one rounded operation per SSE
// instruction; gptq/clippow.go's amd64Log is the same in Go.
__device__ double go_log(double x) {
    const double hsqrt2 = __longlong_as_double(0x3fe6a09e667f3bcdLL), ln2hi = __longlong_as_double(0x3fe62e42fee00000LL),
                 ln2lo = __longlong_as_double(0x3dea39ef35793c76LL), l1 = __longlong_as_double(0x3fe5555555555593LL),
                 l2 = __longlong_as_double(0x3fd999999997fa04LL), l3 = __longlong_as_double(0x3fd2492494229359LL),
                 l4 = __longlong_as_double(0x3fcc71c51d8e78afLL), l5 = __longlong_as_double(0x3fc7466496cb03deLL),
                 l6 = __longlong_as_double(0x3fc39a09d078c69fLL), l7 = __longlong_as_double(0x3fc2f112df3e5244LL);
    long long b = __double_as_longlong(x);
    if ((b & 0x7fffffffffffffffLL) == 0) return __longlong_as_double(0xfff0000000000000LL);
    if (b < 0) return __longlong_as_double(0x7ff8000000000001LL);
    if (b >= 0x7ff0000000000000LL) return x;
    double f1 = __longlong_as_double((b & 0x000fffffffffffffLL) | 0x3fe0000000000000LL);
    double k = (double)((int)((b >> 52) & 0x7ff) - 0x3fe);
    double one = (hsqrt2 < f1) ? 0.0 : 1.0;  // CMPSD "not less than": also at f1 == √2/2
    k = __dsub_rn(k, one);
    f1 = __dmul_rn(f1, __dadd_rn(one, 1.0));
    double f = __dsub_rn(f1, 1.0);
    double s = __ddiv_rn(f, __dadd_rn(2.0, f));
    double s2 = __dmul_rn(s, s);
    double s4 = __dmul_rn(s2, s2);
    double t1 = __dmul_rn(s2, __dadd_rn(__dmul_rn(__dadd_rn(__dmul_rn(__dadd_rn(__dmul_rn(l7, s4), l5), s4), l3), s4), l1));
    double t2 = __dmul_rn(s4, __dadd_rn(__dmul_rn(__dadd_rn(__dmul_rn(l6, s4), l4), s4), l2));
    double r = __dadd_rn(t1, t2);
    double hfsq = __dmul_rn(__dmul_rn(0.5, f), f);
    double x3 = __dadd_rn(__dmul_rn(s, __dadd_rn(r, hfsq)), __dmul_rn(ln2lo, k));
    double x0 = __dsub_rn(__dsub_rn(hfsq, x3), f);
    return __dsub_rn(__dmul_rn(k, ln2hi), x0);
}

// go_exp is Go's math.Exp on amd64 (math/exp_amd64.s) with its FMA path (use_fma, on CPUs
// with FMA) or its plain one; gptq/clippow.go's amd64Exp is the same in Go.
__device__ double go_exp(double x, int use_fma) {
    const double log2e = __longlong_as_double(0x3ff71547652b82feLL), ln2u = __longlong_as_double(0x3fe62e42fefa3000LL),
                 ln2l = __longlong_as_double(0x3d53de6af278ece6LL), overflow = __longlong_as_double(0x40862e42fefa39efLL);
    const double coef[8] = {__longlong_as_double(0x3efa01a01a01a01aLL), __longlong_as_double(0x3f2a01a01a01a01aLL),
                            __longlong_as_double(0x3f56c16c16c16c17LL), __longlong_as_double(0x3f81111111111111LL),
                            __longlong_as_double(0x3fa5555555555555LL), __longlong_as_double(0x3fc5555555555555LL),
                            0.5, 1.0};
    long long b = __double_as_longlong(x);
    if ((b & 0x7fffffffffffffffLL) >= 0x7ff0000000000000LL) {
        if (b == (long long)0xfff0000000000000ULL) return 0.0;
        return x;  // NaN or +Inf
    }
    if (x > overflow) return __longlong_as_double(0x7ff0000000000000LL);
    double t = rint(__dmul_rn(log2e, x));  // CVTSD2SL: nearest, ties to even; out of range: MinInt32
    int bx = (t >= -2147483648.0 && t <= 2147483647.0) ? (int)t : (int)0x80000000u;
    double k = (double)bx;
    double p = coef[0];
    if (use_fma) {
        x = __fma_rn(-k, ln2u, x);
        x = __fma_rn(-k, ln2l, x);
        x = __dmul_rn(x, 0.0625);
#pragma unroll
        for (int i = 1; i < 8; i++) p = __fma_rn(p, x, coef[i]);
        x = __dmul_rn(x, p);
#pragma unroll
        for (int i = 0; i < 3; i++) x = __dmul_rn(x, __dadd_rn(x, 2.0));
        x = __fma_rn(__dadd_rn(x, 2.0), x, 1.0);
    } else {
        x = __dsub_rn(x, __dmul_rn(ln2u, k));
        x = __dsub_rn(x, __dmul_rn(ln2l, k));
        x = __dmul_rn(x, 0.0625);
#pragma unroll
        for (int i = 1; i < 8; i++) p = __dadd_rn(__dmul_rn(p, x), coef[i]);
        x = __dmul_rn(x, p);
#pragma unroll
        for (int i = 0; i < 4; i++) x = __dmul_rn(x, __dadd_rn(x, 2.0));
        x = __dadd_rn(x, 1.0);
    }
    bx += 0x3ff;  // fr·2^bx, as the assembly builds it
    if (bx >= 0x7ff) return __longlong_as_double(0x7ff0000000000000LL);
    if (bx > 0) return __dmul_rn(x, __longlong_as_double((long long)bx << 52));
    if (bx < -52) return 0.0;
    x = __dmul_rn(x, __longlong_as_double((long long)(bx + 0x3fe) << 52));
    return __dmul_rn(x, __longlong_as_double(1LL << 52));
}

// go_pow_clip is Go's math.Pow(d, 2.4) on amd64 for d ≥ 0, NaN or +Inf (gptq/clippow.go's
// clipPow): Exp(0.3999999999999999·Log(d)) times d² by pow's squaring loop, then Ldexp
// (exact here: the result is normal for any float32 d).
__device__ double go_pow_clip(double d, int use_fma) {
    if (d == 1.0) return 1.0;
    if (d != d) return d;
    if (d == 0.0) return 0.0;
    if (isinf(d)) return d;
    double a1 = go_exp(__dmul_rn(__longlong_as_double(0x3fd9999999999998LL), go_log(d)), use_fma);
    int xe;
    double x1 = frexp(d, &xe);
    int ae = 0;
    for (int i = 2; i != 0; i >>= 1) {
        if (i & 1) {
            a1 = __dmul_rn(a1, x1);
            ae += xe;
        }
        x1 = __dmul_rn(x1, x1);
        xe <<= 1;
        if (x1 < 0.5) {
            x1 = __dadd_rn(x1, x1);
            xe--;
        }
    }
    return ldexp(a1, ae);
}

// clip_job is step j of clipSearch: the range shrunk by p = 1 − j/100, its error
// Σ imp·|Q(w) − w|^2.4 (key j).
__device__ void clip_job(const group_view& g, float rlo, float rhi, int j, int maxq, int sym, int use_fma, cand* best) {
    float p = __double2float_rn(__dsub_rn(1.0, __ddiv_rn((double)j, (double)CGRID)));
    float scale;
    int zero;
    int_params(__fmul_rn(p, rlo), __fmul_rn(p, rhi), maxq, sym, &scale, &zero);
    double sum = 0.0;
    for (int i = 0; i < g.len; i++) {
        float v = g.at(i);
        float dq = __fmul_rn(scale, (float)(quantize(v, scale, zero, maxq) - zero));
        double e = go_pow_clip(fabs((double)__fsub_rn(dq, v)), use_fma);
        if (g.imp) e = __dmul_rn(e, (double)g.imp[i]);
        sum = __dadd_rn(sum, e);
    }
    consider(best, sum, j, scale, zero);
}

// gptq_fit_search fits groups g0 .. g0 + count − 1 of every row with the weighted search
// (weighted = 1) or the clip search, one warp per (row, group): group g is columns
// [g·gsize, min((g + 1)·gsize, K)) of src (row-major N×K), dead columns zeroed when dead is
// given, imp (K entries, or null) the importance. It serves every layout: per-channel and
// static groups from the original weights before the column loop, on-the-fly groups from the
// working weights (quantization order) when their block begins.
extern "C" __global__ void __launch_bounds__(256) gptq_fit_search(
    const float* src, const unsigned char* dead, const float* imp, int n, int k, int gsize, int groups, int g0,
    int count, int weighted, int use_fma, int bits, int sym, float* scales, unsigned char* zeros, u64* status) {
    u64 job = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (job >= (u64)n * count) return;
    int r = (int)(job / count), g = g0 + (int)(job % count);
    int lo = g * gsize;
    group_view v{src + (u64)r * k + lo, dead ? dead + lo : nullptr, imp ? imp + lo : nullptr, min(gsize, k - lo)};
    float rlo = 0.f, rhi = 0.f;  // minMax: the range always holds 0
    for (int i = lane; i < v.len; i += 32) {
        float x = v.at(i);
        rlo = fminf(rlo, x);
        rhi = fmaxf(rhi, x);
    }
    warp_min_max(rlo, rhi);
    const int maxq = (1 << bits) - 1;
    cand best{__longlong_as_double(0x7ff0000000000000LL), 0x7fffffff, 0.f, 0};
    if (weighted) {
        int jobs = sym ? WSTEPS : 1 + 3 * (WSTEPS - 1);
        for (int j = lane; j < jobs; j += 32) weighted_job(v, rlo, rhi, j, maxq, sym, &best);
    } else {
        for (int j = lane; j < CSTEPS; j += 32) clip_job(v, rlo, rhi, j, maxq, sym, use_fma, &best);
    }
    best = warp_best(best);
    if (lane != 0) return;
    if (best.key == 0x7fffffff) {  // nothing below +Inf: both searches start from q.fit(w, r, 1)
        int_params(rlo, rhi, maxq, sym, &best.scale, &best.zero);
    }
    u64 at = (u64)r * groups + g;
    scales[at] = best.scale;
    zeros[at] = (unsigned char)best.zero;
    if (!finite(best.scale)) atomicMin(status, at);
}

// load_triangle packs the upper triangle of T′'s diagonal block at (i1, i1), count columns, into
// us: row a at us[start(a) + b − a] for b ≥ a, zero past count. Each warp copies rows of the
// triangle, four loads of a row in flight per lane and several rows unrolled: the copy is
// latency-bound, and one load after another it took most of gptq_block where a GPU's share of
// the rows is small. It ends with __syncthreads.
__device__ __forceinline__ void load_triangle(float* us, const float* tprime, int k, int i1, int count) {
    const int lane = threadIdx.x % 32;
#pragma unroll 4
    for (int a = threadIdx.x / 32; a < BS; a += WARPS) {
        float v[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int b = t * 32 + lane;
            v[t] = (a < count && b < count && b >= a) ? tprime[(u64)(i1 + a) * k + i1 + b] : 0.f;
        }
        int start = a * BS - a * (a - 1) / 2;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int b = t * 32 + lane;
            if (b >= a) us[start + b - a] = v[t];
        }
    }
    __syncthreads();
}

// original is the weight as given at quantization position i of row r: W[r, perm[i]], zero in a
// dead column.
__device__ __forceinline__ float original(const float* orig, const unsigned char* dead, const int* perm, int k, int r, int i) {
    int col = perm[i];
    return dead[col] ? 0.f : orig[(u64)r * k + col];
}

// settle_lanes is gptq_settle for the up to 128 columns a warp holds (lane l: columns l, l+32,
// l+64, l+96): from the working weights x and the weights as given w0, v = w0 + y with y = x − w0,
// y_j −= y_l·T′[l, j] for l < j in order (us: T′'s packed triangle, as load_triangle leaves it).
__device__ __forceinline__ void settle_lanes(float v[4], const float x[4], const float w0[4], const float* us, int width,
                                             int lane) {
    float y[4];
#pragma unroll
    for (int t = 0; t < 4; t++) y[t] = __fsub_rn(x[t], w0[t]);
#pragma unroll
    for (int t = 0; t < 4; t++) {
        for (int l = 0; l < 32; l++) {
            const int i = t * 32 + l;
            if (i >= width) break;
            const float* ui = us + (i * BS - i * (i - 1) / 2) - i;  // ui[j] = T′[i, j] for j ≥ i
            float yl = __shfl_sync(0xffffffffu, y[t], l);
#pragma unroll
            for (int tt = t; tt < 4; tt++) {
                int j = tt * 32 + lane;
                if (j > i) y[tt] = __fsub_rn(y[tt], __fmul_rn(yl, ui[j]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 4; t++) v[t] = __fadd_rn(y[t], w0[t]);
}

// gptq_settle writes to out[r, from:from+width] the weights of those positions as the reference
// has them when its column loop reaches from (gptq.problem.settled): with y = P − W there (P the
// working weights w, W the weights as given), y_j −= y_l·T′[l, j] for l < j in order, then W + y.
// One warp per row. Up to 128 columns, lane l holds columns l, l+32, l+64, l+96 and T′'s
// triangle sits in shared memory, as in gptq_block; wider (groups that do not divide 128),
// the warp works in out itself, T′ read from global memory.
extern "C" __global__ void __launch_bounds__(32 * WARPS) gptq_settle(
    const float* w, const float* tprime, const float* orig, const unsigned char* dead, const int* perm, int n, int k,
    int from, int width, float* out) {
    __shared__ float us[PACKED];
    const int lane = threadIdx.x % 32;
    if (width <= BS) load_triangle(us, tprime, k, from, width);
    const int r = blockIdx.x * WARPS + threadIdx.x / 32;
    if (r >= n) return;
    const float* row = w + (u64)r * k;
    float* dst = out + (u64)r * k + from;
    if (width > BS) {
        for (int c = lane; c < width; c += 32) dst[c] = __fsub_rn(row[from + c], original(orig, dead, perm, k, r, from + c));
        for (int l = 0; l < width; l++) {
            __syncwarp();
            float yl = dst[l];
            const float* tl = tprime + (u64)(from + l) * k + from;
            for (int j = l + 1 + lane; j < width; j += 32) dst[j] = __fsub_rn(dst[j], __fmul_rn(yl, tl[j]));
        }
        __syncwarp();
        for (int c = lane; c < width; c += 32) dst[c] = __fadd_rn(dst[c], original(orig, dead, perm, k, r, from + c));
        return;
    }
    float x[4], w0[4], v[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        w0[t] = c < width ? original(orig, dead, perm, k, r, from + c) : 0.f;
        x[t] = c < width ? row[from + c] : 0.f;
    }
    settle_lanes(v, x, w0, us, width, lane);
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        if (c < width) dst[c] = v[t];
    }
}

// gptq_block quantizes the columns [i1, i1 + count) of every row, one warp per row: first it
// fits the on-the-fly groups that start in the block from the weights settled from i1 (the
// reference's find_params on the outer W: on_the_fly 1 reads them from settled, as gptq_settle
// wrote them; 2, where every group starting in the block ends in it, settles them here, as
// gptq_settle would), then for each column
// i: q = quantize(w_i), d = W_i − q (W the weights as given, dead columns zero),
// w_j += d·T′[i,j] for the later columns of the block (gptq.columnFactor).
// Lane l holds the block columns l, l+32, l+64, l+96; the owner of column i computes d and
// broadcasts it. The block's upper triangle of T′ sits packed in shared memory (33 KB).
// Outputs: codes in original column order, d in diff[r, 0:count] (row-major N×BS) for the
// trailing GEMM, and Σ e² with e = (w_i − q)·T[i,i] added to row_sq[r] (float64).
extern "C" __global__ void __launch_bounds__(32 * WARPS) gptq_block(
    const float* w, const float* tprime, const float* orig, const unsigned char* dead, int n, int k, int i1, int count,
    int bits, int sym, int gsize, int groups, int on_the_fly, const float* settled, const int* pos_group, const int* perm,
    float* scales, unsigned char* zeros, unsigned char* codes, float* diff, double* row_sq, u64* status) {
    __shared__ float us[PACKED];  // row a of the block: us[start(a) + b − a] = T′[i1+a, i1+b], b ≥ a
    const int lane = threadIdx.x % 32;
    load_triangle(us, tprime, k, i1, count);
    const int r = blockIdx.x * WARPS + threadIdx.x / 32;
    if (r >= n) return;
    const float* row = w + (u64)r * k;
    const int maxq = (1 << bits) - 1;

    float x[4], w0[4], scale[4], d_own[4];
    int zero[4], code[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        x[t] = c < count ? row[i1 + c] : 0.f;
        w0[t] = c < count ? original(orig, dead, perm, k, r, i1 + c) : 0.f;
        scale[t] = 1.f;
        zero[t] = 0;
        d_own[t] = 0.f;
        code[t] = 0;
    }
    if (on_the_fly == 2) {
        float v[4];
        settle_lanes(v, x, w0, us, count, lane);
        for (int p = (i1 + gsize - 1) / gsize * gsize; p < i1 + count; p += gsize) {
            float lo = 0.f, hi = 0.f;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                int c = i1 + t * 32 + lane;
                if (c >= p && c < p + gsize && c < i1 + count) {
                    lo = fminf(lo, v[t]);
                    hi = fmaxf(hi, v[t]);
                }
            }
            warp_min_max(lo, hi);
            if (lane == 0) store_params(r, pos_group[p], groups, lo, hi, maxq, sym, scales, zeros, status);
        }
        __syncwarp();
    } else if (on_the_fly == 1) {
        for (int p = (i1 + gsize - 1) / gsize * gsize; p < i1 + count; p += gsize) {
            int end = min(p + gsize, k);
            float lo = 0.f, hi = 0.f;
            for (int c = p + lane; c < end; c += 32) {
                float v = settled[(u64)r * k + c];
                lo = fminf(lo, v);
                hi = fmaxf(hi, v);
            }
            warp_min_max(lo, hi);
            if (lane == 0) store_params(r, pos_group[p], groups, lo, hi, maxq, sym, scales, zeros, status);
        }
        __syncwarp();
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        if (c < count) {
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
            const float* ui = us + (i * BS - i * (i - 1) / 2) - i;  // ui[j] = T′[i1+i, i1+j] for j ≥ i
            float d = 0.f;
            if (lane == l) {
                int q = quantize(x[t], scale[t], zero[t], maxq);
                float deq = __fmul_rn(scale[t], (float)(q - zero[t]));
                d = __fsub_rn(w0[t], deq);
                float e = __fmul_rn(__fsub_rn(x[t], deq), ui[i]);
                code[t] = q;
                d_own[t] = d;
                sq += (double)e * (double)e;
            }
            d = __shfl_sync(0xffffffffu, d, l);
#pragma unroll
            for (int tt = t; tt < 4; tt++) {
                int j = tt * 32 + lane;
                if (j > i) x[tt] = __fadd_rn(x[tt], __fmul_rn(d, ui[j]));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        int c = t * 32 + lane;
        if (c < count) {
            codes[(u64)r * k + perm[i1 + c]] = (unsigned char)code[t];
            diff[(u64)r * BS + c] = d_own[t];
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

// gptq_gram_diagonal sets out[i] = scale·gram[i, i] in float64: the diagonal of H from the K×K
// Gram matrix a calibration summed. One thread per entry.
extern "C" __global__ void gptq_gram_diagonal(const float* gram, double scale, int k, double* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k) out[i] = (double)gram[(u64)i * k + i] * scale;
}

// gptq_live sets out[r, c] = W[r, c], 0 for dead columns: the weights of the baseline loss
// tr(W H Wᵀ). One thread per element.
extern "C" __global__ void gptq_live(const float* orig, const unsigned char* dead, float* out, u64 total, int k) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = dead[i % k] ? 0.0f : orig[i];
}

// gptq_narrow sets out[i] = H's entry i (h_entry) rounded to float32: H for the baseline loss's
// product.
extern "C" __global__ void gptq_narrow(const double* h, const float* gram, double scale, float* out, u64 total) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = (float)h_entry(h, gram, scale, i);
}

// gptq_row_dot sets out[r] = Σ_c a[r, c]·b[r, c], summed in float64, one warp per row.
extern "C" __global__ void gptq_row_dot(const float* a, const float* b, int n, int k, double* out) {
    int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= n) return;
    double sum = 0.0;
    for (int c = lane; c < k; c += 32) sum += (double)a[(u64)r * k + c] * b[(u64)r * k + c];
    sum = warp_sum(sum);
    if (lane == 0) out[r] = sum;
}

// gptq_dequantize sets out[r, c] = scale·(code − zero) of the solved rows (quant.DequantizeInt:
// one rounded float32 product, so the values equal the host's Tensor.Dequantize bit for bit),
// out [n, k] row-major. One thread per element.
extern "C" __global__ void gptq_dequantize(const unsigned char* codes, const float* scales, const unsigned char* zeros,
                                           const int* col_group, int k, int groups, u64 total, float* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    u64 at = (i / k) * groups + col_group[i % k];
    out[i] = __fmul_rn(scales[at], (float)((int)codes[i] - (int)zeros[at]));
}

// gptq_first_non_finite sets *first = min(*first, i) for every i < total where w[i] is a NaN or
// an infinity: the check of weights that are on the device already (*first starts at ~0).
extern "C" __global__ void gptq_first_non_finite(const float* w, u64 total, unsigned long long* first) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total && !isfinite(w[i])) atomicMin(first, (unsigned long long)i);
}
