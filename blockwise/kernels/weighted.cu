// The importance-weighted scale search of blockwise/weighted.go (Options.Weighted) for integer
// grids, on the GPU: one thread per (row, group) runs the CPU's search for its group — the same
// candidates in the same order, the same float32 and float64 operations in the same order — so
// that it returns the same scale and zero point bit for bit. Every product, sum and quotient is
// a rounded intrinsic (__fmul_rn, __dadd_rn, ...) so that nvcc cannot fuse them into FMAs, which
// round differently from Go. The codes of a candidate are recomputed where the CPU keeps them in
// a scratch array: a thread has no room for a group's codes.

#include <cuda_fp16.h>
#include <stdint.h>

#define STEPS 40 // weightedSteps
#define GRID 50  // weightedGrid

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

// encode is quant.Scheme.QuantizeInt: clamp(round_half_even(w/scale) + zero, 0, maxq).
__device__ int encode(float w, params p, int maxq) {
    double q = rint((double)__fdiv_rn(w, p.scale)) + (double)p.zero;
    return (int)fmin(fmax(q, 0.0), (double)maxq);
}

__device__ double weight_of(const float* imp, int i) { return imp ? (double)imp[i] : 1.0; }

// group_error is groupError with norm 2: Σ imp·(decode(encode(w)) − w)², stopping once the sum
// reaches limit.
__device__ double group_error(const float* w, const float* imp, int len, params p, int maxq, double limit) {
    double sum = 0.0;
    for (int i = 0; i < len; i++) {
        float dq = __fmul_rn(p.scale, (float)(encode(w[i], p, maxq) - p.zero));
        double d = (double)__fsub_rn(dq, w[i]);
        double e = __dmul_rn(d, d);
        if (imp) e = __dmul_rn(e, (double)imp[i]);
        sum = __dadd_rn(sum, e);
        if (sum >= limit) return sum;
    }
    return sum;
}

// refit is intQuantizer.refit: weighted least squares for the codes of p. ok is false when the
// fit is degenerate.
__device__ params refit(const float* w, const float* imp, int len, params p, int maxq, int sym, bool* ok) {
    *ok = false;
    int zero = p.zero;
    if (!sym) {
        double sv = 0, sq = 0, sqq = 0, sw = 0, sqw = 0;
        for (int i = 0; i < len; i++) {
            double c = weight_of(imp, i), x = (double)encode(w[i], p, maxq), v = (double)w[i];
            double cx = __dmul_rn(c, x);
            sv = __dadd_rn(sv, c);
            sq = __dadd_rn(sq, cx);
            sqq = __dadd_rn(sqq, __dmul_rn(cx, x));
            sw = __dadd_rn(sw, __dmul_rn(c, v));
            sqw = __dadd_rn(sqw, __dmul_rn(cx, v));
        }
        double det = __dsub_rn(__dmul_rn(sv, sqq), __dmul_rn(sq, sq));
        if (det <= 0) return p;
        double a = __ddiv_rn(__dsub_rn(__dmul_rn(sv, sqw), __dmul_rn(sq, sw)), det);
        double b = __ddiv_rn(__dsub_rn(__dmul_rn(sqq, sw), __dmul_rn(sq, sqw)), det);
        if (!(a > 0)) return p;
        zero = (int)fmin(fmax(rint(__ddiv_rn(-b, a)), 0.0), (double)maxq);
    }
    double num = 0, den = 0;
    for (int i = 0; i < len; i++) {
        double c = weight_of(imp, i), x = (double)(encode(w[i], p, maxq) - zero);
        double cx = __dmul_rn(c, x);
        num = __dadd_rn(num, __dmul_rn(cx, (double)w[i]));
        den = __dadd_rn(den, __dmul_rn(cx, x));
    }
    if (!(den > 0) || !(num > 0)) return p;
    params r;
    r.scale = round_f16(__double2float_rn(__ddiv_rn(num, den)));
    r.zero = zero;
    *ok = r.scale != 0.f;
    return r;
}

struct search {
    const float* w;
    const float* imp;
    int len, maxq;
    params best;
    double best_err;

    // try_params is weightedSearch's try: false for a scale the format cannot hold.
    __device__ bool try_params(params p) {
        if (!isfinite(p.scale) || p.scale <= 0.f) return false;
        double e = group_error(w, imp, len, p, maxq, best_err);
        if (e < best_err) {
            best = p;
            best_err = e;
        }
        return true;
    }
};

// weighted_params: scales[r·groups + g], zeros[r·groups + g] of W[n, k] (float32, row-major),
// groups of gsize columns (the last may be shorter), imp the per-column importance or null.
extern "C" __global__ void weighted_params(const float* __restrict__ w, const float* __restrict__ imp, int n, int k,
                                           int gsize, int groups, int bits, int sym, float* scales, uint8_t* zeros) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * groups) return;
    int row = (int)(t / groups), g = (int)(t % groups);
    int lo = g * gsize, hi = min(lo + gsize, k);
    search s;
    s.w = w + (long long)row * k + lo;
    s.imp = imp ? imp + lo : nullptr;
    s.len = hi - lo;
    s.maxq = (1 << bits) - 1;
    float rlo = 0.f, rhi = 0.f; // minMax: the range always holds 0
    for (int i = 0; i < s.len; i++) {
        rlo = fminf(rlo, s.w[i]);
        rhi = fmaxf(rhi, s.w[i]);
    }
    s.best = int_params(rlo, rhi, s.maxq, sym);
    s.best_err = __longlong_as_double(0x7ff0000000000000LL); // +Inf
    for (int i = 0; i < STEPS; i++) {
        float p = __double2float_rn(1.0 - __ddiv_rn((double)i, (double)GRID));
        float spans[3][2] = {{__fmul_rn(p, rlo), __fmul_rn(p, rhi)}, {__fmul_rn(p, rlo), rhi}, {rlo, __fmul_rn(p, rhi)}};
        int count = (!sym && i > 0) ? 3 : 1;
        for (int j = 0; j < count; j++) {
            params pr = int_params(spans[j][0], spans[j][1], s.maxq, sym);
            if (!s.try_params(pr)) continue;
            bool ok;
            params rp = refit(s.w, s.imp, s.len, pr, s.maxq, sym, &ok);
            if (ok) s.try_params(rp);
        }
    }
    scales[t] = s.best.scale;
    zeros[t] = (uint8_t)s.best.zero;
}
