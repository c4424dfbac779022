// llama.cpp's k-quant fitting (package kquant: Type.Fit, fit.go and search.go) on the GPU,
// launched by kquant.GPUFitter. Each function here is the Go function named in its comment, with
// the same float32 operations in the same order, so that every super-block gets the CPU's d, dmin,
// sub-block scales and mins and codes bit for bit:
//
//   - every product, sum, quotient and square root that matters is a rounded intrinsic
//     (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn): nvcc would otherwise contract
//     a·b + c into an FMA, which rounds once where Go (and ggml built with -ffp-contract=off)
//     rounds twice. Comparisons, negation, |x| and int ↔ float conversions are exact anyway;
//   - a product of three is ((a·b)·c), as Go evaluates a*b*c;
//   - min and max are C's `if (x < m) m = x`, as the Go code's minC/maxC (fminf/fmaxf treat −0
//     and NaN differently);
//   - nearest_int returns 0 for a NaN, as on the CPU (see there).
//
// One thread fits one super-block (row r, super-block b of the row). The fit is a chain of
// float32 sums in a fixed order, each sub-block's sweep depending on the last, and the
// super-block step needs every sub-block's result; splitting a sum across lanes would change its
// rounding, and a warp over the sub-blocks would leave half its lanes idle for q4_k and q5_k
// (8 sub-blocks) and need shuffles for the super-block step. A 7B linear has 10^5 super-blocks,
// enough threads to fill the GPU, so the plain per-thread transcription of the Go code is
// the clearest way to be exactly the CPU's. The super-block's weights are read in place
// (global memory, cached); the codes are written in place.
//
// The fit also checks what the CPU checks around it (fitTensor): a thread that finds a
// non-finite weight in its super-block lowers status[0] to that weight's flat index and fits
// nothing, and one whose d or dmin overflowed F16 lowers status[1] to its super-block's flat
// index, so that the host can name the first of each as the CPU does. kquant_pack_qX_k then
// writes ggml's blocks (Type.appendBlock) from the fit's outputs, one thread per super-block.
//
// qpack-cubin: sm_90

#include <cuda_fp16.h>
#include <stdint.h>

#define QK_K 256                // quant.SuperBlock
#define GROUP_MAX_EPS 1e-15f    // groupMaxEps
#define MAX_SUB (QK_K / 16)     // MaxSubBlocks

// params are one super-block's Params: D, DMin, Scales, Mins.
struct params {
    float d, dmin;
    int8_t scales[MAX_SUB];
    uint8_t mins[MAX_SUB];
};

// f16 is quant.RoundF16: to the nearest F16 (ties to even, overflow to ±Inf) and back.
__device__ __forceinline__ float f16(float v) { return __half2float(__float2half_rn(v)); }

// nearest_int is nearestInt: x + 1.5·2^23 in float32 leaves round(x) (ties to even) in the low
// mantissa bits. Weights near F32's smallest values or huge importance can make an Inf·0 or
// Inf − Inf on the way; the CPU's NaN (x86's and ARM's default NaN) has mantissa 0x400000 and
// so reads as 0, the GPU's canonical NaN has mantissa 0x7fffff: a NaN gives 0 here explicitly.
__device__ __forceinline__ int nearest_int(float x) {
    float v = __fadd_rn(x, 12582912.f);
    if (v != v) return 0;
    return (__float_as_int(v) & 0x007fffff) - 0x00400000;
}

// finite32 is finite: false for ±Inf and NaN (exponent all ones).
__device__ __forceinline__ bool finite32(float v) { return (__float_as_int(v) & 0x7f800000) != 0x7f800000; }

__device__ __forceinline__ int clampi(int l, int lo, int hi) { return l < lo ? lo : (l > hi ? hi : l); }
__device__ __forceinline__ int mini(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ float abs32(float v) { return __int_as_float(__float_as_int(v) & 0x7fffffff); }

// signed_max is signedMax: the value of largest magnitude (the first on ties) and its magnitude.
__device__ float signed_max(const float* x, int n, float* amax_out) {
    float max = 0.f, amax = 0.f;
    for (int i = 0; i < n; i++) {
        float a = abs32(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    *amax_out = amax;
    return max;
}

// sym_sums is fitSymmetric's sums: Σ w·x·l and Σ w·l² of the codes l = round(iscale·x) clamped
// to [−nmax, nmax−1], w = qw or x²; stores the codes l + nmax in L unless L is null.
__device__ void sym_sums(int nmax, const float* x, int n, const float* qw, float iscale, uint8_t* L, float* sumlx,
                         float* suml2) {
    float slx = 0.f, sl2 = 0.f;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest_int(__fmul_rn(iscale, x[i])), -nmax, nmax - 1);
        if (L) L[i] = (uint8_t)(l + nmax);
        float w = qw ? qw[i] : __fmul_rn(x[i], x[i]); // weightOr
        float fl = (float)l;
        slx = __fadd_rn(slx, __fmul_rn(__fmul_rn(w, x[i]), fl));
        sl2 = __fadd_rn(sl2, __fmul_rn(__fmul_rn(w, fl), fl));
    }
    *sumlx = slx;
    *suml2 = sl2;
}

// fit_symmetric is fitSymmetric (ggml's make_qx_quants, rmse_type 1).
__device__ float fit_symmetric(int nmax, const float* x, int n, uint8_t* L, const float* qw) {
    float amax;
    float max = signed_max(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float sumlx, suml2;
    sym_sums(nmax, x, n, qw, __fdiv_rn(-(float)nmax, max), L, &sumlx, &suml2);
    float scale = 0.f;
    if (suml2 != 0.f) scale = __fdiv_rn(sumlx, suml2);
    float best = __fmul_rn(scale, sumlx);
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        float iscale = __fdiv_rn(-__fadd_rn((float)nmax, __fmul_rn(0.1f, (float)is)), max);
        sym_sums(nmax, x, n, qw, iscale, nullptr, &sumlx, &suml2);
        if (suml2 > 0.f && __fmul_rn(sumlx, sumlx) > __fmul_rn(best, suml2)) {
            sym_sums(nmax, x, n, qw, iscale, L, &sumlx, &suml2);
            scale = __fdiv_rn(sumlx, suml2);
            best = __fmul_rn(scale, sumlx);
        }
    }
    return scale;
}

// fit_q3 is fitQ3 (ggml's make_q3_quants with do_rmse) for a sub-block of 16, nmax = 4.
__device__ float fit_q3(const float* x, uint8_t* L) {
    const int nmax = 4, n = 16;
    float amax;
    float max = signed_max(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = __fdiv_rn(-(float)nmax, max);
    int ls[16];
    float sumlx = 0.f, suml2 = 0.f;
    for (int i = 0; i < n; i++) {
        ls[i] = clampi(nearest_int(__fmul_rn(iscale, x[i])), -nmax, nmax - 1);
        float w = __fmul_rn(x[i], x[i]), fl = (float)ls[i];
        sumlx = __fadd_rn(sumlx, __fmul_rn(__fmul_rn(w, x[i]), fl));
        suml2 = __fadd_rn(suml2, __fmul_rn(__fmul_rn(w, fl), fl));
    }
    for (int round = 0; round < 5; round++) {
        bool changed = false;
        for (int i = 0; i < n; i++) {
            float v = x[i], w = __fmul_rn(v, v), fl = (float)ls[i];
            float slx = __fsub_rn(sumlx, __fmul_rn(__fmul_rn(w, v), fl));
            if (!(slx > 0.f)) continue;
            float sl2 = __fsub_rn(suml2, __fmul_rn(__fmul_rn(w, fl), fl));
            int nl = clampi(nearest_int(__fdiv_rn(__fmul_rn(v, sl2), slx)), -nmax, nmax - 1);
            if (nl == ls[i]) continue;
            float fn = (float)nl;
            slx = __fadd_rn(slx, __fmul_rn(__fmul_rn(w, v), fn));
            sl2 = __fadd_rn(sl2, __fmul_rn(__fmul_rn(w, fn), fn));
            if (sl2 > 0.f && __fmul_rn(__fmul_rn(slx, slx), suml2) > __fmul_rn(__fmul_rn(sumlx, sumlx), sl2)) {
                ls[i] = nl;
                sumlx = slx;
                suml2 = sl2;
                changed = true;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (uint8_t)(ls[i] + nmax);
    return suml2 > 0.f ? __fdiv_rn(sumlx, suml2) : 0.f;
}

// sweep is sweep: the inverse scales (rmin + rdelta·is + nmax)/range for is = 0 … nstep.
struct sweep {
    float rmin, rdelta;
    int nstep;
    bool mad;
};

// error_of is errorOf: |d| (mad) or d².
__device__ __forceinline__ float error_of(float d, bool mad) { return mad ? abs32(d) : __fmul_rn(d, d); }

// fit_scale_min is fitScaleMin (ggml's make_qkx2_quants / make_qkx3_quants) over n ≤ 32 weights
// x with weights w: returns the scale, *neg_min the min. Like ggml and the Go code, the sweep
// goes on from the best offset found so far (lo changes inside the loop).
__device__ float fit_scale_min(int nmax, const float* x, const float* w, int n, uint8_t* L, sweep sw, float* neg_min) {
    uint8_t aux[32];
    float lo = x[0], hi = x[0];
    float sumW = w[0];
    float sumX = __fmul_rn(sumW, x[0]);
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sumW = __fadd_rn(sumW, w[i]);
        sumX = __fadd_rn(sumX, __fmul_rn(w[i], x[i]));
    }
    if (lo > 0.f) lo = 0.f;
    if (hi == lo) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -lo;
        return 0.f;
    }
    float iscale = __fdiv_rn((float)nmax, __fsub_rn(hi, lo));
    float scale = __fdiv_rn(1.f, iscale);
    float bestErr = 0.f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(__fmul_rn(iscale, __fsub_rn(x[i], lo))), 0, nmax);
        float d = __fsub_rn(__fadd_rn(__fmul_rn(scale, (float)L[i]), lo), x[i]);
        bestErr = __fadd_rn(bestErr, __fmul_rn(w[i], error_of(d, sw.mad)));
    }
    for (int is = 0; is <= sw.nstep; is++) {
        iscale = __fdiv_rn(__fadd_rn(__fadd_rn(sw.rmin, __fmul_rn(sw.rdelta, (float)is)), (float)nmax), __fsub_rn(hi, lo));
        float sumL = 0.f, sumL2 = 0.f, sumXL = 0.f;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(__fmul_rn(iscale, __fsub_rn(x[i], lo))), 0, nmax);
            aux[i] = (uint8_t)l;
            float fl = (float)l;
            sumL = __fadd_rn(sumL, __fmul_rn(w[i], fl));
            sumL2 = __fadd_rn(sumL2, __fmul_rn(__fmul_rn(w[i], fl), fl));
            sumXL = __fadd_rn(sumXL, __fmul_rn(__fmul_rn(w[i], fl), x[i]));
        }
        float D = __fsub_rn(__fmul_rn(sumW, sumL2), __fmul_rn(sumL, sumL));
        if (!(D > 0.f)) continue;
        float thisScale = __fdiv_rn(__fsub_rn(__fmul_rn(sumW, sumXL), __fmul_rn(sumX, sumL)), D);
        float thisMin = __fdiv_rn(__fsub_rn(__fmul_rn(sumL2, sumX), __fmul_rn(sumL, sumXL)), D);
        if (thisMin > 0.f) {
            thisMin = 0.f;
            thisScale = __fdiv_rn(sumXL, sumL2);
        }
        float e = 0.f;
        for (int i = 0; i < n; i++) {
            float d = __fsub_rn(__fadd_rn(__fmul_rn(thisScale, (float)aux[i]), thisMin), x[i]);
            e = __fadd_rn(e, __fmul_rn(w[i], error_of(d, sw.mad)));
        }
        if (e < bestErr) {
            for (int i = 0; i < n; i++) L[i] = aux[i];
            bestErr = e;
            scale = thisScale;
            lo = thisMin;
        }
    }
    *neg_min = -lo;
    return scale;
}

// fit_positive is fitPositive (ggml's make_qp_quants) over n ≤ 16 non-negative values x.
__device__ float fit_positive(int nmax, const float* x, int n, uint8_t* L, const float* qw) {
    float max = 0.f;
    for (int i = 0; i < n; i++) {
        if (!(max > x[i])) max = x[i];
    }
    if (max < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = __fdiv_rn((float)nmax, max);
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(__fmul_rn(iscale, x[i]));
    float bestMSE = 0.f; // squaredError with the codes just stored
    float scale = __fdiv_rn(1.f, iscale);
    for (int i = 0; i < n; i++) {
        float d = __fsub_rn(x[i], __fmul_rn(scale, (float)L[i]));
        bestMSE = __fadd_rn(bestMSE, __fmul_rn(__fmul_rn(qw[i], d), d));
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        float isc = __fdiv_rn(__fadd_rn(__fmul_rn(0.1f, (float)is), (float)nmax), max);
        float s = __fdiv_rn(1.f, isc), mse = 0.f; // squaredError with codes min(nmax, round(isc·x))
        for (int i = 0; i < n; i++) {
            float d = __fsub_rn(x[i], __fmul_rn(s, (float)mini(nmax, nearest_int(__fmul_rn(isc, x[i])))));
            mse = __fadd_rn(mse, __fmul_rn(__fmul_rn(qw[i], d), d));
        }
        if (mse < bestMSE) {
            bestMSE = mse;
            iscale = isc;
        }
    }
    float sumlx = 0.f, suml2 = 0.f;
    for (int i = 0; i < n; i++) {
        int l = mini(nmax, nearest_int(__fmul_rn(iscale, x[i])));
        L[i] = (uint8_t)l;
        float fl = (float)l; // the int, not the stored byte, as in the Go code
        sumlx = __fadd_rn(sumlx, __fmul_rn(__fmul_rn(qw[i], x[i]), fl));
        suml2 = __fadd_rn(suml2, __fmul_rn(__fmul_rn(qw[i], fl), fl));
    }
    for (int round = 0; round < 5; round++) {
        bool changed = false;
        for (int i = 0; i < n; i++) {
            float w = qw[i], fl = (float)L[i];
            float slx = __fsub_rn(sumlx, __fmul_rn(__fmul_rn(w, x[i]), fl));
            float sl2 = __fsub_rn(suml2, __fmul_rn(__fmul_rn(w, fl), fl));
            if (!(slx > 0.f && sl2 > 0.f)) continue;
            int nl = mini(nmax, nearest_int(__fdiv_rn(__fmul_rn(x[i], sl2), slx)));
            if (nl == (int)L[i]) continue;
            float fn = (float)nl;
            slx = __fadd_rn(slx, __fmul_rn(__fmul_rn(w, x[i]), fn));
            sl2 = __fadd_rn(sl2, __fmul_rn(__fmul_rn(w, fn), fn));
            if (__fmul_rn(__fmul_rn(slx, slx), suml2) > __fmul_rn(__fmul_rn(sumlx, sumlx), sl2)) {
                L[i] = (uint8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed = true;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.f ? __fdiv_rn(sumlx, suml2) : 0.f;
}

// super_sigma2 is superSigma2: factor·Σx²/n.
__device__ float super_sigma2(const float* x, int n, float factor) {
    float sum = 0.f;
    for (int i = 0; i < n; i++) sum = __fadd_rn(sum, __fmul_rn(x[i], x[i]));
    return __fdiv_rn(__fmul_rn(factor, sum), (float)n);
}

// importance_weights is importanceWeights: w_i = qw_i·sqrt(σ² + x_i²), returning Σw.
__device__ float importance_weights(float* w, const float* x, const float* qw, int n, float sigma2) {
    float sum = 0.f;
    for (int i = 0; i < n; i++) {
        w[i] = __fmul_rn(qw[i], __fsqrt_rn(__fadd_rn(sigma2, __fmul_rn(x[i], x[i]))));
        sum = __fadd_rn(sum, w[i]);
    }
    return sum;
}

// The facts of each type (quant.KQuantType, Type.maxq) by code width.
__device__ __forceinline__ int sub_of(int bits) { return (bits == 4 || bits == 5) ? 32 : 16; }
__device__ __forceinline__ int maxq_of(int bits) { return (1 << bits) - 1; }
__device__ __forceinline__ int offset_of(int bits) { return bits == 3 ? 4 : (bits == 6 ? 32 : 0); }
__device__ __forceinline__ int scale_hi(int bits) { return bits == 2 ? 15 : 63; } // ScaleHi = MinHi, types with mins

// ref_weights is refWeights: |x| for q2_k, rms(x) + |x| for q4_k and q5_k.
__device__ void ref_weights(int bits, float* w, const float* x, int n) {
    float avX = 0.f;
    if (bits != 2) {
        float sumX2 = 0.f;
        for (int i = 0; i < n; i++) sumX2 = __fadd_rn(sumX2, __fmul_rn(x[i], x[i]));
        avX = __fsqrt_rn(__fdiv_rn(sumX2, (float)n));
    }
    for (int i = 0; i < n; i++) w[i] = __fadd_rn(avX, abs32(x[i]));
}

// quantize_to_max is quantizeToMax.
__device__ float quantize_to_max(const float* v, int n, uint8_t* l, float q) {
    float max = 0.f;
    for (int j = 0; j < n; j++) {
        if (v[j] > max) max = v[j];
    }
    if (!(max > 0.f)) {
        for (int j = 0; j < n; j++) l[j] = 0;
        return f16(0.f);
    }
    float iscale = __fdiv_rn(q, max);
    for (int j = 0; j < n; j++) l[j] = (uint8_t)nearest_int(__fmul_rn(iscale, v[j]));
    return f16(__fdiv_rn(max, q));
}

// set_scales_mins is Params.setScalesMins.
__device__ void set_scales_mins(int bits, const uint8_t* ls, const uint8_t* lm, int nsub, params* p) {
    for (int j = 0; j < nsub; j++) {
        if (bits == 2) {
            uint8_t b = (uint8_t)(ls[j] | (lm[j] << 4));
            p->scales[j] = (int8_t)(b & 15);
            p->mins[j] = (uint8_t)(b >> 4);
        } else {
            p->scales[j] = (int8_t)mini(63, ls[j]);
            p->mins[j] = (uint8_t)mini(63, lm[j]);
        }
    }
}

// fit_mins is fitMinsRef (qw null) and fitMinsImpl: q2_k, q4_k and q5_k.
__device__ void fit_mins(int bits, const float* x, const float* qw, int n, uint8_t* codes, params* p) {
    float scales[MAX_SUB], mins[MAX_SUB], sw[MAX_SUB], weights[32];
    const int sub = sub_of(bits), nsub = n / sub, maxq = maxq_of(bits);
    sweep s;
    float sigma2 = 0.f;
    if (qw) {
        s = sweep{-0.9f, 0.05f, 36, false}; // implSweep
        sigma2 = super_sigma2(x, n, bits == 2 ? 1.f : 2.f);
    } else if (bits == 2) { // refSweeps
        s = sweep{-0.5f, 0.1f, 15, true};
    } else if (bits == 4) {
        s = sweep{-1.f, 0.1f, 20, false};
    } else {
        s = sweep{-0.5f, 0.1f, 15, false};
    }
    for (int j = 0; j < nsub; j++) {
        const float* xs = x + sub * j;
        if (qw) {
            sw[j] = importance_weights(weights, xs, qw + sub * j, sub, sigma2);
        } else {
            ref_weights(bits, weights, xs, sub);
        }
        scales[j] = fit_scale_min(maxq, xs, weights, sub, codes + sub * j, s, &mins[j]);
    }
    uint8_t ls[MAX_SUB], lm[MAX_SUB];
    if (qw) {
        p->d = f16(fit_positive(scale_hi(bits), scales, nsub, ls, sw));
        p->dmin = f16(fit_positive(scale_hi(bits), mins, nsub, lm, sw));
    } else {
        p->d = quantize_to_max(scales, nsub, ls, (float)scale_hi(bits));
        p->dmin = quantize_to_max(mins, nsub, lm, (float)scale_hi(bits));
    }
    set_scales_mins(bits, ls, lm, nsub, p);
}

// fit_q3k is fitQ3Ref (qw null) and fitQ3Impl.
__device__ void fit_q3k(const float* x, const float* qw, int n, uint8_t* codes, params* p) {
    float scales[MAX_SUB], sw[MAX_SUB], weights[16];
    const int nsub = n / 16;
    if (qw) {
        float sigma2 = super_sigma2(x, n, 2.f);
        for (int j = 0; j < nsub; j++) {
            sw[j] = importance_weights(weights, x + 16 * j, qw + 16 * j, 16, sigma2);
            scales[j] = fit_symmetric(4, x + 16 * j, 16, codes + 16 * j, weights);
        }
        uint8_t ls[MAX_SUB];
        p->d = f16(fit_symmetric(32, scales, nsub, ls, sw));
        for (int j = 0; j < nsub; j++) p->scales[j] = (int8_t)((int8_t)ls[j] - 32);
        return;
    }
    for (int j = 0; j < nsub; j++) scales[j] = fit_q3(x + 16 * j, codes + 16 * j);
    for (int j = 0; j < nsub; j++) p->scales[j] = -32; // ggml's zeroed bytes when every scale is 0
    float amax;
    float max = signed_max(scales, nsub, &amax);
    if (max != 0.f) {
        float iscale = __fdiv_rn(-32.f, max);
        for (int j = 0; j < nsub; j++) {
            p->scales[j] = (int8_t)clampi((int)(int8_t)nearest_int(__fmul_rn(iscale, scales[j])), -32, 31);
        }
        p->d = f16(__fdiv_rn(1.f, iscale));
    }
}

// fit_q6k is fitQ6 (qw null for quantize_row_q6_K_ref). Returns false for a super-block stored
// as zeros, codes included (no requantize).
__device__ bool fit_q6k(const float* x, const float* qw, int n, uint8_t* codes, params* p) {
    float scales[MAX_SUB];
    const int nsub = n / 16;
    for (int j = 0; j < nsub; j++) scales[j] = fit_symmetric(32, x + 16 * j, 16, codes + 16 * j, qw ? qw + 16 * j : nullptr);
    float amax;
    float max = signed_max(scales, nsub, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) codes[i] = 0;
        return false;
    }
    float iscale = __fdiv_rn(-128.f, max);
    p->d = f16(__fdiv_rn(1.f, iscale));
    for (int j = 0; j < nsub; j++) p->scales[j] = (int8_t)mini(127, nearest_int(__fmul_rn(iscale, scales[j])));
    return true;
}

// requantize is Type.requantize: the codes again from the stored parameters (Type.code);
// sub-blocks with d·sc = 0 keep their own fit's codes.
__device__ void requantize(int bits, const params* p, const float* x, int n, uint8_t* codes) {
    const int sub = sub_of(bits), off = offset_of(bits), maxq = maxq_of(bits);
    for (int j = 0; j < n / sub; j++) {
        float dl = __fmul_rn(p->d, (float)p->scales[j]), ml = __fmul_rn(p->dmin, (float)p->mins[j]);
        if (dl == 0.f) continue;
        for (int i = j * sub; i < (j + 1) * sub; i++) {
            int l = clampi(nearest_int(__fdiv_rn(__fadd_rn(x[i], ml), dl)), -off, maxq - off);
            codes[i] = (uint8_t)(l + off);
        }
    }
}

// fit_super_block is Type.Fit of super-block b of row r of W[n, k] (imp: per column, or null),
// writing its codes and its parameters into the layout of quant.Tensor (Type.Put): d and dmin
// at r·blocks + b, sub-block scales and mins at r·(k/sub) + b·(256/sub) + j. dmin and mins are
// null for q3_k and q6_k.
__device__ void fit_super_block(int bits, const float* w, const float* imp, int n, int k, uint8_t* codes, float* d,
                                float* dmin, int8_t* scales, uint8_t* mins, unsigned long long* status) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int blocks = (k + QK_K - 1) / QK_K;
    if (t >= (long long)n * blocks) return;
    int r = (int)(t / blocks), b = (int)(t % blocks);
    int lo = b * QK_K, len = k - lo < QK_K ? k - lo : QK_K;
    const float* x = w + (long long)r * k + lo;
    for (int i = 0; i < len; i++) { // fitTensor's check of the weights (checkTensor)
        if (!finite32(x[i])) {
            atomicMin(&status[0], (unsigned long long)((long long)r * k + lo + i));
            return;
        }
    }
    const float* qw = imp ? imp + lo : nullptr;
    uint8_t* c = codes + (long long)r * k + lo;
    params p = {};
    bool requant = true;
    if (bits == 3) {
        fit_q3k(x, qw, len, c, &p);
    } else if (bits == 6) {
        requant = fit_q6k(x, qw, len, c, &p);
    } else {
        fit_mins(bits, x, qw, len, c, &p);
    }
    if (requant) requantize(bits, &p, x, len, c);
    const int sub = sub_of(bits);
    long long s0 = (long long)r * (k / sub) + lo / sub;
    d[t] = p.d;
    for (int j = 0; j < len / sub; j++) scales[s0 + j] = p.scales[j];
    if (dmin) {
        dmin[t] = p.dmin;
        for (int j = 0; j < len / sub; j++) mins[s0 + j] = p.mins[j];
    }
    if (!finite32(p.d) || !finite32(p.dmin)) atomicMin(&status[1], (unsigned long long)t); // checkScales
}

// put_f16 is appendF16 of a value that is already an F16 (the fitted d and dmin, once the
// host has refused non-finite ones): its two bytes, little-endian, in one 16-bit store (every
// F16 of a ggml k-quant block is at an even offset of a block of even size). Stored as two
// bytes, the low one came out 0 on an H100 (sm_90 code from ptxas 11.8 storing the low byte of
// the F16 register), so the value takes the integer path of a 16-bit store.
__device__ __forceinline__ void put_f16(uint8_t* o, float v) {
    *reinterpret_cast<unsigned short*>(o) = __half_as_ushort(__float2half_rn(v));
}

// put_crumbs is appendCrumbs: byte l of half h holds codes 128h + l + 32i in bits 2i, 2i+1.
__device__ void put_crumbs(uint8_t* o, const uint8_t* L) {
    for (int h = 0; h < QK_K; h += 128) {
        for (int l = 0; l < 32; l++) {
            const uint8_t* q = L + h + l;
            *o++ = (uint8_t)((q[0] & 3) | (q[32] & 3) << 2 | (q[64] & 3) << 4 | (q[96] & 3) << 6);
        }
    }
}

// put_nibbles is appendNibbles: byte l of chunk c holds code 64c + l (low) and 64c + 32 + l.
__device__ void put_nibbles(uint8_t* o, const uint8_t* L) {
    for (int c = 0; c < QK_K; c += 64) {
        for (int l = 0; l < 32; l++) *o++ = (uint8_t)((L[c + l] & 15) | (L[c + l + 32] & 15) << 4);
    }
}

// put_scale_min_k4 is appendScaleMinK4: eight 6-bit scales and mins in 12 bytes.
__device__ void put_scale_min_k4(uint8_t* o, const int8_t* sc, const uint8_t* m) {
    uint8_t s[12] = {};
    for (int j = 0; j < 8; j++) {
        uint8_t v = (uint8_t)sc[j], mj = m[j];
        if (j < 4) {
            s[j] |= v;
            s[j + 4] |= mj;
            continue;
        }
        s[j + 4] = (uint8_t)((v & 15) | (mj & 15) << 4);
        s[j - 4] |= (uint8_t)(v >> 4 << 6);
        s[j] |= (uint8_t)(mj >> 4 << 6);
    }
    for (int i = 0; i < 12; i++) o[i] = s[i];
}

// pack_block is Type.appendBlock: super-block t's codes L and parameters as ggml's block.
__device__ void pack_block(int bits, const uint8_t* L, float d, float dmin, const int8_t* sc, const uint8_t* m, uint8_t* o) {
    switch (bits) {
    case 2: // block_q2_K: scales[16], qs[64], d, dmin
        for (int j = 0; j < 16; j++) o[j] = (uint8_t)((uint8_t)sc[j] | m[j] << 4);
        put_crumbs(o + 16, L);
        put_f16(o + 80, d);
        put_f16(o + 82, dmin);
        return;
    case 3: { // block_q3_K: hmask[32], qs[64], scales[12], d (appendHighBits, appendScales6)
        for (int l = 0; l < 32; l++) {
            uint8_t h = 0;
            for (int i = 0; i < 8; i++) h |= (uint8_t)((L[32 * i + l] >> 2 & 1) << i);
            o[l] = h;
        }
        put_crumbs(o + 32, L);
        uint8_t s[12] = {};
        for (int j = 0; j < 16; j++) {
            uint8_t v = (uint8_t)(sc[j] + 32); // StoredScale
            s[j % 8] |= (uint8_t)((v & 15) << (4 * (j / 8)));
            s[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
        }
        for (int i = 0; i < 12; i++) o[96 + i] = s[i];
        put_f16(o + 108, d);
        return;
    }
    case 4: // block_q4_K: d, dmin, scales[12], qs[128]
    case 5: // block_q5_K: d, dmin, scales[12], qh[32], qs[128] (appendFifthBits)
        put_f16(o, d);
        put_f16(o + 2, dmin);
        put_scale_min_k4(o + 4, sc, m);
        if (bits == 5) {
            for (int l = 0; l < 32; l++) {
                uint8_t h = 0;
                for (int c = 0; c < 4; c++) h |= (uint8_t)((L[64 * c + l] >> 4 & 1) << (2 * c) | (L[64 * c + 32 + l] >> 4 & 1) << (2 * c + 1));
                o[16 + l] = h;
            }
            put_nibbles(o + 48, L);
        } else {
            put_nibbles(o + 16, L);
        }
        return;
    default: // block_q6_K: ql[128], qh[64], scales[16], d (appendQ6Codes)
        for (int h = 0; h < 2; h++) {
            const uint8_t* q = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[64 * h + l] = (uint8_t)((q[l] & 15) | (q[l + 64] & 15) << 4);
                o[64 * h + l + 32] = (uint8_t)((q[l + 32] & 15) | (q[l + 96] & 15) << 4);
                o[128 + 32 * h + l] = (uint8_t)(q[l] >> 4 | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 | (q[l + 96] >> 4) << 6);
            }
        }
        for (int j = 0; j < 16; j++) o[192 + j] = (uint8_t)sc[j];
        put_f16(o + 208, d);
    }
}

// block_bytes is Type.BlockBytes.
__device__ __forceinline__ int block_bytes(int bits) {
    return bits == 2 ? 84 : bits == 3 ? 110 : bits == 4 ? 144 : bits == 5 ? 176 : 210;
}

// pack_super_block packs super-block t of W[n, k] (k a multiple of 256) from the outputs of
// fit_super_block into out, the tensor's ggml blocks in row order.
__device__ void pack_super_block(int bits, int n, int k, const uint8_t* codes, const float* d, const float* dmin,
                                 const int8_t* scales, const uint8_t* mins, uint8_t* out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * (k / QK_K)) return;
    const int nsub = QK_K / sub_of(bits);
    pack_block(bits, codes + t * QK_K, d[t], dmin ? dmin[t] : 0.f, scales + t * nsub, mins ? mins + t * nsub : nullptr,
               out + t * block_bytes(bits));
}

// One kernel per type, so that each gets the registers of its own path.
#define KQUANT_KERNEL(B)                                                                                               \
    extern "C" __global__ void kquant_fit_q##B##_k(const float* __restrict__ w, const float* __restrict__ imp, int n, \
                                                  int k, uint8_t* codes, float* d, float* dmin, int8_t* scales,       \
                                                  uint8_t* mins, unsigned long long* status) {                       \
        fit_super_block(B, w, imp, n, k, codes, d, dmin, scales, mins, status);                                        \
    }                                                                                                                  \
    extern "C" __global__ void kquant_pack_q##B##_k(int n, int k, const uint8_t* __restrict__ codes,                 \
                                                   const float* __restrict__ d, const float* __restrict__ dmin,       \
                                                   const int8_t* __restrict__ scales,                                 \
                                                   const uint8_t* __restrict__ mins, uint8_t* out) {                  \
        pack_super_block(B, n, k, codes, d, dmin, scales, mins, out);                                                  \
    }
KQUANT_KERNEL(2)
KQUANT_KERNEL(3)
KQUANT_KERNEL(4)
KQUANT_KERNEL(5)
KQUANT_KERNEL(6)
