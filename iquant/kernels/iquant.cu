// llama.cpp's IQ fits (package iquant: Type.Fit, lattice_fit.go, iq4_fit.go, iq1_fit.go) on the
// GPU, launched by iquant.GPUFitter. Each function here is the Go function named in its comment,
// with the same float32 operations in the same order, so that every block gets the CPU's d,
// sub-block scales, grid points, signs and codes bit for bit:
//
//   - every product, sum, quotient and square root that matters is a rounded intrinsic
//     (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn): nvcc would otherwise contract
//     a·b + c into an FMA, which rounds once where Go and ggml round twice;
//   - a product of three is ((a·b)·c), as Go and C evaluate a*b*c;
//   - max is C's MAX(a, b) = a > b ? a : b (cmax);
//   - nearest_int returns 0 for a NaN, as on the CPU (see kquant.cu).
//
// One thread fits one block (256 weights; 32 for iq4_nl), reading its weights in place and
// writing its fields into quant.Tensor's layout (Type.Put). ggml carries two things from one
// block of a row to the next and reads them back when a sub-block has no weighted values (see
// iquant's carry): the levels and on-grid record of the last sub-block (iq2_xs, iq2_s,
// iq3_xxs) and the δ shifts of skipped sub-blocks (iq1_s, iq1_m). A thread cannot know them,
// so it flags such a block (flags[block] = 1) and the host fits its row again on the CPU.

#include <cuda_fp16.h>
#include <stdint.h>

#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

// The IQ types, numbered as quant.IQType.
#define IQ4NL 1
#define IQ4XS 2
#define IQ3XXS 3
#define IQ3S 4
#define IQ2XXS 5
#define IQ2XS 6
#define IQ2S 7
#define IQ1S 8
#define IQ1M 9

__device__ __forceinline__ float f16(float v) { return __half2float(__float2half_rn(v)); }

// nearest_int is kquant.NearestInt (a NaN gives 0, as the CPU's default NaN does).
__device__ __forceinline__ int nearest_int(float x) {
    float v = __fadd_rn(x, 12582912.f);
    if (v != v) return 0;
    return (__float_as_int(v) & 0x007fffff) - 0x00400000;
}

__device__ __forceinline__ int clampi(int l, int lo, int hi) { return l < lo ? lo : (l > hi ? hi : l); }
__device__ __forceinline__ float abs32(float v) { return __int_as_float(__float_as_int(v) & 0x7fffffff); }
__device__ __forceinline__ float cmax(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float sqr_w(float w, float d) { return __fmul_rn(__fmul_rn(w, d), d); }

// The outputs of one block: quant.Tensor's fields at the block's place.
struct outputs {
    float* d;        // the block's d
    int8_t* scales;  // its sub-block scales
    uint16_t* points; // its grid points
    uint8_t* signs;  // its sign (δ) bytes
    uint8_t* codes;  // iq4: its codes
};

// ---------------------------------------------------------------- iq4 (iq4_fit.go)

__constant__ float iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// iq4_code is iq4Code: ggml's best_index_int8 (the bisection, which iq4Code's table equals).
__device__ int iq4_code(float x) {
    if (x <= iq4_values[0]) return 0;
    if (x >= iq4_values[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < iq4_values[mav]) mu = mav; else ml = mav;
    }
    return __fsub_rn(x, iq4_values[mu - 1]) < __fsub_rn(iq4_values[mu], x) ? mu - 1 : mu;
}

// iq4_sums is iq4Sums: codes at inverse scale id (into L unless null), Σ w·v·x and Σ w·v².
__device__ void iq4_sums(const float* xb, const float* w, float id, uint8_t* L, float* sumqx, float* sumq2) {
    float qx = 0.f, q2 = 0.f;
    for (int j = 0; j < 32; j++) {
        int l = iq4_code(__fmul_rn(id, xb[j]));
        if (L) L[j] = (uint8_t)l;
        float q = iq4_values[l];
        qx = __fadd_rn(qx, __fmul_rn(__fmul_rn(w[j], q), xb[j]));
        q2 = __fadd_rn(q2, __fmul_rn(__fmul_rn(w[j], q), q));
    }
    *sumqx = qx;
    *sumq2 = q2;
}

// iq4_scale is iq4Scale.
__device__ float iq4_scale(const float* xb, const float* w, uint8_t* L) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < 32; j++) {
        float a = abs32(xb[j]);
        if (a > amax) {
            amax = a;
            max = xb[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0.f;
    float d = __fdiv_rn(-max, iq4_values[0]);
    float sumqx, sumq2;
    iq4_sums(xb, w, __fdiv_rn(1.f, d), L, &sumqx, &sumq2);
    d = __fdiv_rn(sumqx, sumq2);
    float best = __fmul_rn(d, sumqx);
    for (int itry = -7; itry <= 7; itry++) {
        float id = __fdiv_rn((float)(itry - 127), max);
        iq4_sums(xb, w, id, nullptr, &sumqx, &sumq2);
        if (sumq2 > 0.f && __fmul_rn(sumqx, sumqx) > __fmul_rn(best, sumq2)) {
            d = __fdiv_rn(sumqx, sumq2);
            best = __fmul_rn(d, sumqx);
        }
    }
    return d;
}

// fit_iq4 is fitIQ4 over n = 32 (iq4_nl) or 256 (iq4_xs) weights.
__device__ void fit_iq4(int type, const float* x, const float* imp, int n, outputs o) {
    float sigma2 = 0.f;
    for (int j = 0; j < n; j++) sigma2 = __fadd_rn(sigma2, __fmul_rn(x[j], x[j]));
    sigma2 = __fmul_rn(sigma2, __fdiv_rn(2.f, (float)n));
    float scales[8], w[32];
    float max_scale = 0.f, amax_scale = 0.f;
    for (int ib = 0; ib < n / 32; ib++) {
        const float* xb = x + 32 * ib;
        for (int j = 0; j < 32; j++) {
            w[j] = imp ? __fmul_rn(imp[32 * ib + j], __fsqrt_rn(__fadd_rn(sigma2, __fmul_rn(xb[j], xb[j]))))
                       : __fmul_rn(xb[j], xb[j]);
        }
        scales[ib] = iq4_scale(xb, w, o.codes + 32 * ib);
        float a = abs32(scales[ib]);
        if (a > amax_scale) {
            amax_scale = a;
            max_scale = scales[ib];
        }
    }
    if (type == IQ4NL) {
        *o.d = f16(scales[0]);
        float id = scales[0] != 0.f ? __fdiv_rn(1.f, scales[0]) : 0.f;
        for (int j = 0; j < n; j++) o.codes[j] = (uint8_t)iq4_code(__fmul_rn(id, x[j]));
        return;
    }
    float d = __fdiv_rn(-max_scale, 32.f);
    *o.d = f16(d);
    float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    for (int ib = 0; ib < n / 32; ib++) {
        int l = clampi(nearest_int(__fmul_rn(id, scales[ib])), -32, 31);
        o.scales[ib] = (int8_t)l;
        float dl = __fmul_rn(d, (float)l);
        float idl = dl != 0.f ? __fdiv_rn(1.f, dl) : 0.f;
        for (int j = 0; j < 32; j++) o.codes[32 * ib + j] = (uint8_t)iq4_code(__fmul_rn(idl, x[32 * ib + j]));
    }
}

// ---------------------------------------------------------------- lattices (lattice.go)

// lattice is lattice: the grid's levels, its 2l+1 coordinates, the index map and the
// neighbour lists.
struct lattice {
    const int8_t* levels;
    const float* coords;
    const int* kmap;
    const uint16_t* neighbours;
    int dim, shift;
};

// index is lattice.index.
__device__ __forceinline__ int lat_index(const lattice& lat, const int8_t* L) {
    int u = 0;
    for (int i = 0; i < lat.dim; i++) u |= (int)L[i] << (lat.shift * i);
    return u;
}

// grid_point is lattice.onGrid.
__device__ int grid_point(const lattice& lat, const int8_t* L) {
    for (int i = 0; i < lat.dim; i++) {
        if (L[i] < 0 || (int)L[i] >= (1 << lat.shift)) return -1;
    }
    int p = lat.kmap[lat_index(lat, L)];
    return p >= 0 ? p : -1;
}

// nearest is lattice.nearest: the neighbour of the off-grid levels L with the least
// Σ w·(scale·(2l+1) − x)², its levels written to L; −1 when none is below float32's largest.
__device__ int nearest(const lattice& lat, int8_t* L, const float* x, const float* w, float scale) {
    int start = -1 - lat.kmap[lat_index(lat, L)];
    int count = lat.neighbours[start];
    int best = -1;
    float best_d2 = 3.40282347e38f;
    for (int j = 1; j <= count; j++) {
        int p = lat.neighbours[start + j];
        const float* c = lat.coords + p * lat.dim;
        float d2 = 0.f;
        for (int i = 0; i < lat.dim; i++) {
            float diff = __fsub_rn(__fmul_rn(scale, c[i]), x[i]);
            d2 = __fadd_rn(d2, sqr_w(w[i], diff));
        }
        if (d2 < best_d2) {
            best = p;
            best_d2 = d2;
        }
    }
    if (best >= 0) {
        for (int i = 0; i < lat.dim; i++) L[i] = lat.levels[best * lat.dim + i];
    }
    return best;
}

// ---------------------------------------------------------------- IQ2, IQ3 (lattice_fit.go)

// knobs are knobs.
struct knobs {
    int maxq;
    float sigma_factor, eps;
    int steps;
    float step, fudge;
    bool qp_start, requantize_all;
    int on_grid_start; // 0: on the grid, 1: off, 2: carried
};

__device__ knobs knobs_of(int type) {
    switch (type) {
    case IQ2XXS: return knobs{3, 1.f, 1e-15f, 6, 0.1f, 1.f, true, false, 0};
    case IQ2XS: return knobs{3, 1.f, 1e-15f, 9, 0.1f, 1.f, false, false, 0};
    case IQ2S: return knobs{3, 2.f, 1e-8f, 9, 0.1f, 0.9875f, false, false, 0};
    case IQ3XXS: return knobs{8, 2.f, 1e-8f, 15, 0.2f, 1.0125f, false, false, 2};
    default: return knobs{8, 2.f, 0.f, 9, 0.2f, 1.033f, false, true, 1}; // iq3_s
    }
}

// lfit is latticeFit.
struct lfit {
    int type, sub, dim;
    bool parity;
    knobs k;
    lattice lat;
    float weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    bool on_grid[8], on_grid_aux[8];
    uint8_t signs[4];
    bool carried; // the fit read the carried levels or on-grid record
};

// split_signs is latticeFit.splitSigns.
__device__ void split_signs(lfit& f, const float* x, int n) {
    for (int g = 0; g < n / 8; g++) {
        uint8_t s = 0;
        int nflip = 0;
        for (int i = g * 8; i < g * 8 + 8; i++) {
            if (x[i] >= 0.f) {
                f.xval[i] = x[i];
            } else {
                f.xval[i] = -x[i];
                s |= (uint8_t)(1 << (i - g * 8));
                nflip++;
            }
        }
        if (f.parity && nflip % 2 == 1) {
            int imin = g * 8;
            float min = __fmul_rn(__fmul_rn(f.weight[g * 8], x[g * 8]), x[g * 8]);
            for (int i = g * 8 + 1; i < g * 8 + 8; i++) {
                float ax = __fmul_rn(__fmul_rn(f.weight[i], x[i]), x[i]);
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            f.xval[imin] = -f.xval[imin];
            s ^= (uint8_t)(1 << (imin - g * 8));
        }
        f.signs[g] = s;
    }
}

// lround is latticeFit.round; returns false where ggml aborts.
__device__ bool lround(lfit& f, int8_t* L, int n, float id, float scale, bool* on_grid, bool all) {
    for (int g = 0; g < n / f.dim; g++) {
        if (!all && on_grid[g]) continue;
        int8_t* lg = L + g * f.dim;
        for (int i = 0; i < f.dim; i++) {
            int l = nearest_int(__fmul_rn(0.5f, __fsub_rn(__fmul_rn(id, f.xval[g * f.dim + i]), 1.f)));
            lg[i] = (int8_t)clampi(l, 0, f.k.maxq - 1);
        }
        on_grid[g] = grid_point(f.lat, lg) >= 0;
        if (!on_grid[g] && nearest(f.lat, lg, f.xval + g * f.dim, f.waux + g * f.dim, scale) < 0) return false;
    }
    return true;
}

// lsums is latticeFit.sums.
__device__ void lsums(const lfit& f, const int8_t* L, int n, float* sumqx, float* sumq2) {
    float qx = 0.f, q2 = 0.f;
    for (int i = 0; i < n; i++) {
        float w = f.weight[i], q = (float)(2 * L[i] + 1);
        qx = __fadd_rn(qx, __fmul_rn(__fmul_rn(w, f.xval[i]), q));
        q2 = __fadd_rn(q2, __fmul_rn(__fmul_rn(w, q), q));
    }
    *sumqx = qx;
    *sumq2 = q2;
}

// lsweep is latticeFit.sweep; returns false where ggml aborts. *accepted tells whether any
// inverse scale fitted.
__device__ bool lsweep(lfit& f, int n, float ref, float* scale, bool* accepted) {
    const knobs& k = f.k;
    float best = 0.f;
    *accepted = false;
    for (int is = -k.steps; is <= k.steps; is++) {
        float id = __fdiv_rn(__fadd_rn((float)(2 * k.maxq - 1), __fmul_rn((float)is, k.step)), ref);
        if (!lround(f, f.Laux, n, id, __fdiv_rn(1.f, id), f.on_grid_aux, true)) return false;
        float sumqx, sumq2;
        lsums(f, f.Laux, n, &sumqx, &sumq2);
        if (sumq2 > 0.f && __fmul_rn(sumqx, sumqx) > __fmul_rn(best, sumq2)) {
            *scale = __fdiv_rn(sumqx, sumq2);
            best = __fmul_rn(*scale, sumqx);
            for (int i = 0; i < n; i++) f.L[i] = f.Laux[i];
            for (int g = 0; g < n / f.dim; g++) f.on_grid[g] = f.on_grid_aux[g];
            *accepted = true;
        }
    }
    return true;
}

// lrequantize is latticeFit.requantize; returns false where ggml aborts.
__device__ bool lrequantize(lfit& f, int n, float* scale, bool all) {
    bool found[8];
    for (int g = 0; g < 8; g++) found[g] = f.on_grid[g];
    if (!lround(f, f.L, n, __fdiv_rn(1.f, *scale), *scale, found, all)) return false;
    float sumqx, sumq2;
    lsums(f, f.L, n, &sumqx, &sumq2);
    if (sumq2 > 0.f) *scale = __fdiv_rn(sumqx, sumq2);
    return true;
}

// lsearch is latticeFit.search; returns false where ggml aborts. A sweep that fits nothing
// leaves the carried levels (iq2_xs, iq2_s) or on-grid record (iq3_xxs) in use: f.carried.
__device__ bool lsearch(lfit& f, int n, float max, float* scale) {
    const knobs& k = f.k;
    if (k.on_grid_start != 2) {
        for (int g = 0; g < n / f.dim; g++) f.on_grid[g] = k.on_grid_start == 0;
    }
    *scale = __fdiv_rn(max, (float)(2 * k.maxq - 1));
    bool accepted;
    if (!lsweep(f, n, max, scale, &accepted)) return false;
    if (!accepted && (f.type == IQ2XS || f.type == IQ2S || f.type == IQ3XXS)) f.carried = true;
    bool off = false;
    for (int g = 0; g < n / f.dim; g++) off = off || !f.on_grid[g];
    if (!off || !(*scale > 0.f)) return true;
    return lrequantize(f, n, scale, k.requantize_all);
}

// qp_quants is kquant.QPQuants for n ≤ 32 values with a positive maximum, nmax = 4.
__device__ void qp_quants(int nmax, const float* x, int n, uint8_t* L, const float* qw, float* sumlx_out, float* suml2_out) {
    float max = 0.f;
    for (int i = 0; i < n; i++) {
        if (!(max > x[i])) max = x[i];
    }
    float iscale = __fdiv_rn((float)nmax, max);
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(__fmul_rn(iscale, x[i]));
    float scale = __fdiv_rn(1.f, iscale), best_mse = 0.f;
    for (int i = 0; i < n; i++) {
        float d = __fsub_rn(x[i], __fmul_rn(scale, (float)L[i]));
        best_mse = __fadd_rn(best_mse, __fmul_rn(__fmul_rn(qw[i], d), d));
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        float isc = __fdiv_rn(__fadd_rn(__fmul_rn(0.1f, (float)is), (float)nmax), max);
        float s = __fdiv_rn(1.f, isc), mse = 0.f;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(__fmul_rn(isc, x[i]));
            float d = __fsub_rn(x[i], __fmul_rn(s, (float)(l < nmax ? l : nmax)));
            mse = __fadd_rn(mse, __fmul_rn(__fmul_rn(qw[i], d), d));
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = isc;
        }
    }
    float sumlx = 0.f, suml2 = 0.f;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(__fmul_rn(iscale, x[i]));
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        float fl = (float)l;
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
            int nl = nearest_int(__fdiv_rn(__fmul_rn(x[i], sl2), slx));
            nl = nl < nmax ? nl : nmax;
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
    *sumlx_out = sumlx;
    *suml2_out = suml2;
}

// lsearch_qp is latticeFit.searchFromQP (iq2_xxs); returns false where ggml aborts.
__device__ bool lsearch_qp(lfit& f, int n, float* scale) {
    const knobs& k = f.k;
    uint8_t L8[32];
    float sumlx, suml2;
    qp_quants(k.maxq + 1, f.xval, n, L8, f.weight, &sumlx, &suml2);
    *scale = __fdiv_rn(sumlx, suml2);
    for (int i = 0; i < n; i++) f.L[i] = (int8_t)L8[i];
    bool accepted;
    if (!lsweep(f, n, __fmul_rn(*scale, (float)k.maxq), scale, &accepted)) return false;
    if (!(*scale > 0.f)) return true;
    return lrequantize(f, n, scale, true);
}

// lsub is latticeFit.subBlock: 1 for a fitted sub-block, 0 for a skipped one, −1 where ggml
// aborts.
__device__ int lsub(lfit& f, const float* x, const float* qw, int n, float sigma2, float* scale_out) {
    for (int i = 0; i < n; i++) {
        float xx = __fmul_rn(x[i], x[i]);
        if (qw) {
            f.weight[i] = __fmul_rn(qw[i], __fsqrt_rn(__fadd_rn(sigma2, xx)));
        } else if (f.type == IQ2S) {
            f.weight[i] = __fadd_rn(__fmul_rn(0.25f, sigma2), xx);
        } else {
            f.weight[i] = xx;
        }
        f.waux[i] = __fsqrt_rn(f.weight[i]);
    }
    split_signs(f, x, n);
    float max = f.xval[0];
    for (int i = 1; i < n; i++) max = cmax(max, f.xval[i]);
    if (max < f.k.eps || max == 0.f) return 0;
    float scale;
    if (!(f.k.qp_start ? lsearch_qp(f, n, &scale) : lsearch(f, n, max, &scale))) return -1;
    if (scale < 0.f) {
        scale = -scale;
        for (int g = 0; g < 4; g++) f.signs[g] = (uint8_t)~f.signs[g];
    }
    for (int g = 0; g < n / f.dim; g++) {
        if (grid_point(f.lat, f.L + g * f.dim) < 0) return -1;
    }
    if (!(scale >= 0.f)) return -1;
    *scale_out = scale;
    return 1;
}

// lstore is latticeFit.store.
__device__ void lstore(const lfit& f, outputs o, int ib, int skipped) {
    int groups = f.sub / f.dim, sign_groups = f.sub / 8;
    for (int g = 0; g < groups; g++) {
        uint16_t pt = (uint16_t)grid_point(f.lat, f.L + g * f.dim);
        if (f.type == IQ3S && skipped > 0) {
            int own = ib * groups + g, at = (ib - skipped) * groups + g;
            o.points[at] = (uint16_t)((o.points[at] & 0x100) | (pt & 0xff));
            o.points[own] = (uint16_t)((o.points[own] & 0xff) | (pt & 0x100));
            continue;
        }
        o.points[ib * groups + g] = pt;
    }
    for (int g = 0; g < sign_groups; g++) o.signs[(ib - skipped) * sign_groups + g] = f.signs[g];
}

// fit_lattice is fitLattice for one block (the carried state starts at zero); returns false
// where ggml aborts. The block's outputs start at zero.
__device__ bool fit_lattice(int type, const lattice& lat, const float* x, const float* imp, outputs o, bool* carried) {
    lfit f;
    f.type = type;
    f.k = knobs_of(type);
    f.lat = lat;
    f.dim = lat.dim;
    f.sub = (type == IQ2XS || type == IQ2S) ? 16 : 32;
    f.parity = type == IQ2XXS || type == IQ2XS || type == IQ3XXS;
    f.carried = false;
    for (int i = 0; i < 32; i++) f.L[i] = 0;
    for (int g = 0; g < 8; g++) f.on_grid[g] = false;
    float sumx2 = 0.f;
    for (int i = 0; i < QK_K; i++) sumx2 = __fadd_rn(sumx2, __fmul_rn(x[i], x[i]));
    float sigma2 = f.k.sigma_factor != 1.f ? __fdiv_rn(__fmul_rn(f.k.sigma_factor, sumx2), 256.f) : __fdiv_rn(sumx2, 256.f);
    float scales[16] = {};
    float max_scale = 0.f;
    int skipped = 0;
    for (int ib = 0; ib < QK_K / f.sub; ib++) {
        float scale;
        int r = lsub(f, x + ib * f.sub, imp ? imp + ib * f.sub : nullptr, f.sub, sigma2, &scale);
        if (r < 0) return false;
        if (r == 0) {
            if (type == IQ3S) skipped++;
            continue;
        }
        lstore(f, o, ib, skipped);
        scales[ib] = scale;
        max_scale = cmax(max_scale, scale);
    }
    *carried = f.carried;
    if (max_scale == 0.f) {
        if (type != IQ2S && type != IQ3S) { // the others clear their block
            for (int i = 0; i < QK_K / f.dim; i++) o.points[i] = 0;
            for (int i = 0; i < QK_K / 8; i++) o.signs[i] = 0;
        }
        return true;
    }
    float d = __fdiv_rn(max_scale, 31.f);
    *o.d = f16(__fmul_rn(d, f.k.fudge));
    float id = __fdiv_rn(1.f, d);
    for (int ib = 0; ib < QK_K / f.sub; ib++) {
        int l = nearest_int(__fmul_rn(0.5f, __fsub_rn(__fmul_rn(id, scales[ib]), 1.f)));
        o.scales[ib] = (int8_t)clampi(l, 0, 15);
    }
    return true;
}

// ---------------------------------------------------------------- IQ1 (iq1_fit.go)

__constant__ float iq1_values[2][3] = {{-1.f + 0.125f, 0.125f, 1.f + 0.125f}, {-1.f - 0.125f, -0.125f, 1.f - 0.125f}};

// i1fit is iq1Fit.
struct i1fit {
    int type, sub;
    lattice lat;
    float weight[32];
    int idx[32];
    int8_t L[32];
};

__device__ __forceinline__ int level_of(int j, int i1, int i2) { return j < i1 ? 0 : (j < i2 ? 1 : 2); }

// iq1_weights is iq1Fit.weights.
__device__ void iq1_weights(i1fit& f, const float* xb, const float* imp, float sigma2) {
    for (int i = 0; i < f.sub; i++) {
        float xx = __fmul_rn(xb[i], xb[i]);
        f.weight[i] = imp ? __fmul_rn(imp[i], __fsqrt_rn(__fadd_rn(sigma2, xx))) : xx;
    }
}

// iq1_values_of is iq1Fit.values: the level values of group g under shift.
__device__ const float* iq1_values_of(int type, int shift, int g) {
    bool neg = shift == -1;
    if (type == IQ1M) neg = ((shift >> (1 - g)) & 1) == 1;
    return iq1_values[neg ? 1 : 0];
}

__device__ float max_abs(const float* x, int n) {
    float m = abs32(x[0]);
    for (int i = 1; i < n; i++) m = cmax(m, abs32(x[i]));
    return m;
}

// split_s is iq1Fit.splitS.
__device__ float split_s(i1fit& f, const float* xb, int* bi1, int* bi2, int* bshift) {
    const int n = 32;
    float sumx[33], sumw[33];
    sumx[0] = sumw[0] = 0.f;
    for (int j = 0; j < n; j++) {
        int i = f.idx[j];
        sumx[j + 1] = __fadd_rn(sumx[j], __fmul_rn(f.weight[i], xb[i]));
        sumw[j + 1] = __fadd_rn(sumw[j], f.weight[i]);
    }
    float best = -1.17549435e-38f, scale = max_abs(xb, n);
    *bi1 = *bi2 = -1;
    *bshift = 0;
    for (int i1 = 0; i1 <= n; i1++) {
        for (int i2 = i1; i2 <= n; i2++) {
            for (int s = 0; s < 2; s++) {
                const float* xx = iq1_values[s];
                float sumqx = __fadd_rn(__fadd_rn(__fmul_rn(__fsub_rn(sumx[i1], sumx[0]), xx[0]), __fmul_rn(__fsub_rn(sumx[i2], sumx[i1]), xx[1])),
                                        __fmul_rn(__fsub_rn(sumx[n], sumx[i2]), xx[2]));
                float sumq2 = __fadd_rn(__fadd_rn(sqr_w(__fsub_rn(sumw[i1], sumw[0]), xx[0]), sqr_w(__fsub_rn(sumw[i2], sumw[i1]), xx[1])),
                                        sqr_w(__fsub_rn(sumw[n], sumw[i2]), xx[2]));
                if (sumq2 > 0.f && __fmul_rn(sumqx, sumqx) > __fmul_rn(best, sumq2)) {
                    scale = __fdiv_rn(sumqx, sumq2);
                    best = __fmul_rn(scale, sumqx);
                    *bi1 = i1;
                    *bi2 = i2;
                    *bshift = 1 - 2 * s;
                }
            }
        }
    }
    return scale;
}

// split_m is iq1Fit.splitM (the sums accumulated from scratch for each split, in ggml's order).
__device__ float split_m(i1fit& f, const float* xb, int* bi1, int* bi2, int* bk) {
    const int n = 16;
    float best = -1.17549435e-38f, scale = max_abs(xb, n);
    *bi1 = *bi2 = *bk = -1;
    for (int i1 = 0; i1 <= n; i1++) {
        for (int i2 = i1; i2 <= n; i2++) {
            float qx[4] = {0.f, 0.f, 0.f, 0.f}, q2[4] = {0.f, 0.f, 0.f, 0.f};
            for (int j = 0; j < n; j++) {
                int i = f.idx[j], l = level_of(j, i1, i2);
                float w = f.weight[i], x = xb[i], p = iq1_values[0][l], m = iq1_values[1][l];
                float px = __fmul_rn(__fmul_rn(w, p), x), mx = __fmul_rn(__fmul_rn(w, m), x);
                float pq = sqr_w(w, p), mq = sqr_w(w, m);
                bool second = i >= n / 2;
                qx[0] = __fadd_rn(qx[0], px);
                qx[1] = __fadd_rn(qx[1], second ? mx : px);
                qx[2] = __fadd_rn(qx[2], second ? px : mx);
                qx[3] = __fadd_rn(qx[3], mx);
                q2[0] = __fadd_rn(q2[0], pq);
                q2[1] = __fadd_rn(q2[1], second ? mq : pq);
                q2[2] = __fadd_rn(q2[2], second ? pq : mq);
                q2[3] = __fadd_rn(q2[3], mq);
            }
            for (int k = 0; k < 4; k++) {
                if (q2[k] > 0.f && __fmul_rn(qx[k], qx[k]) > __fmul_rn(best, q2[k])) {
                    scale = __fdiv_rn(qx[k], q2[k]);
                    best = __fmul_rn(scale, qx[k]);
                    *bi1 = i1;
                    *bi2 = i2;
                    *bk = k;
                }
            }
        }
    }
    return scale;
}

// iq1_nearest is iq1Fit.nearest.
__device__ int iq1_nearest(const lattice& lat, int8_t* L, const float* x, const float* w, float scale, const float* xx) {
    int start = -1 - lat.kmap[lat_index(lat, L)];
    int count = lat.neighbours[start];
    float sv[3] = {__fmul_rn(scale, xx[0]), __fmul_rn(scale, xx[1]), __fmul_rn(scale, xx[2])};
    int best = -1;
    float best_d2 = 3.40282347e38f;
    for (int j = 1; j <= count; j++) {
        int p = lat.neighbours[start + j];
        float d2 = 0.f;
        for (int i = 0; i < 8; i++) d2 = __fadd_rn(d2, sqr_w(w[i], __fsub_rn(sv[lat.levels[p * 8 + i]], x[i])));
        if (d2 < best_d2) {
            best = p;
            best_d2 = d2;
        }
    }
    if (best >= 0) {
        for (int i = 0; i < 8; i++) L[i] = lat.levels[best * 8 + i];
    }
    return best;
}

// iq1_sub is iq1Fit.subBlock; returns false where ggml aborts.
__device__ bool iq1_sub(i1fit& f, const float* xb, outputs o, int ib, float* scale_out, int* shift_out) {
    const int n = f.sub;
    for (int i = 0; i < n; i++) f.idx[i] = i;
    for (int i = 1; i < n; i++) { // a stable insertion sort by x (ggml's qsort is a stable merge sort)
        int v = f.idx[i], j = i - 1;
        while (j >= 0 && xb[f.idx[j]] > xb[v]) {
            f.idx[j + 1] = f.idx[j];
            j--;
        }
        f.idx[j + 1] = v;
    }
    int i1, i2, shift;
    float scale = f.type == IQ1S ? split_s(f, xb, &i1, &i2, &shift) : split_m(f, xb, &i1, &i2, &shift);
    if (i1 < 0) return false;
    for (int j = 0; j < n; j++) f.L[f.idx[j]] = (int8_t)level_of(j, i1, i2);
    if (scale < 0.f) {
        for (int i = 0; i < n; i++) f.L[i] = (int8_t)(2 - f.L[i]);
        scale = -scale;
        shift = f.type == IQ1S ? -shift : 3 - shift;
    }
    bool all_on_grid = true;
    for (int g = 0; g < n / 8; g++) {
        int8_t* lg = f.L + 8 * g;
        int pt = grid_point(f.lat, lg);
        if (pt < 0) {
            all_on_grid = false;
            pt = iq1_nearest(f.lat, lg, xb + 8 * g, f.weight + 8 * g, scale, iq1_values_of(f.type, shift, g));
            if (pt < 0) return false;
        }
        o.points[ib * n / 8 + g] = (uint16_t)pt;
    }
    if (!all_on_grid) {
        float sumqx = 0.f, sumq2 = 0.f;
        for (int g = 0; g < n / 8; g++) {
            const float* xx = iq1_values_of(f.type, shift, g);
            int pt = o.points[ib * n / 8 + g];
            for (int j = 0; j < 8; j++) {
                float w = f.weight[8 * g + j], q = xx[f.lat.levels[pt * 8 + j]];
                sumqx = __fadd_rn(sumqx, __fmul_rn(__fmul_rn(w, q), xb[8 * g + j]));
                sumq2 = __fadd_rn(sumq2, sqr_w(w, q));
            }
        }
        if (sumqx > 0.f && sumq2 > 0.f) scale = __fdiv_rn(sumqx, sumq2);
    }
    if (!(scale >= 0.f)) return false;
    *scale_out = scale;
    *shift_out = shift;
    return true;
}

// fit_iq1 is fitIQ1 for one block (shifts carried in as zero); returns false where ggml aborts.
__device__ bool fit_iq1(int type, const lattice& lat, const float* x, const float* imp, outputs o, bool* carried) {
    i1fit f;
    f.type = type;
    f.sub = type == IQ1S ? 32 : 16;
    f.lat = lat;
    float sumx2 = 0.f;
    for (int i = 0; i < QK_K; i++) sumx2 = __fadd_rn(sumx2, __fmul_rn(x[i], x[i]));
    float sigma2 = __fdiv_rn(__fmul_rn(2.f, sumx2), 256.f);
    float scales[16] = {};
    int shifts[16] = {};
    bool skipped = false;
    float max_scale = 0.f;
    float eps = type == IQ1S ? 1e-12f : 1e-7f;
    for (int ib = 0; ib < QK_K / f.sub; ib++) {
        const float* xb = x + ib * f.sub;
        iq1_weights(f, xb, imp ? imp + ib * f.sub : nullptr, sigma2);
        if (max_abs(xb, f.sub) < eps) {
            skipped = true;
            continue;
        }
        if (!iq1_sub(f, xb, o, ib, &scales[ib], &shifts[ib])) return false;
        max_scale = cmax(max_scale, scales[ib]);
    }
    if (max_scale == 0.f) return true;
    *carried = skipped; // the skipped sub-blocks' shifts are read below
    float d = __fdiv_rn(max_scale, 15.f), id = __fdiv_rn(1.f, d);
    for (int ib = 0; ib < QK_K / f.sub; ib++) {
        o.scales[ib] = (int8_t)clampi(nearest_int(__fmul_rn(0.5f, __fsub_rn(__fmul_rn(id, scales[ib]), 1.f))), 0, 7);
    }
    if (type == IQ1S) {
        for (int ib = 0; ib < 8; ib++) o.signs[ib] = shifts[ib] == -1 ? 1 : 0;
        *o.d = f16(__fmul_rn(d, 1.125f));
        return true;
    }
    float sumqx = 0.f, sumq2 = 0.f; // refitIQ1M
    for (int ib = 0; ib < 16; ib++) {
        int shift = shifts[ib];
        o.signs[2 * ib] = (uint8_t)((shift >> 1) & 1);
        o.signs[2 * ib + 1] = (uint8_t)(shift & 1);
        const float* xb = x + 16 * ib;
        iq1_weights(f, xb, imp ? imp + 16 * ib : nullptr, sigma2);
        float m = (float)(2 * o.scales[ib] + 1);
        for (int g = 0; g < 2; g++) {
            const float* xx = iq1_values_of(type, shift, g);
            int pt = o.points[2 * ib + g];
            for (int j = 0; j < 8; j++) {
                float w = f.weight[8 * g + j], q = __fmul_rn(xx[lat.levels[pt * 8 + j]], m);
                sumqx = __fadd_rn(sumqx, __fmul_rn(__fmul_rn(w, q), xb[8 * g + j]));
                sumq2 = __fadd_rn(sumq2, sqr_w(w, q));
            }
        }
    }
    if (sumq2 > 0.f) d = __fdiv_rn(sumqx, sumq2);
    *o.d = f16(__fmul_rn(d, 1.1125f));
    return true;
}

// ---------------------------------------------------------------- the kernel

// iquant_fit fits block t (row t / (k/block), block t % (k/block)) of W[n, k] for IQ type
// `type` (imp per column or null), writing quant.Tensor's fields of the block (zeroed by the
// host) and flags[t]: 1 when the block read state ggml carries from the block before (the host
// fits the row again), 2 where ggml aborts (the host fits the row again and reports its error).
extern "C" __global__ void iquant_fit(int type, const float* __restrict__ w, const float* __restrict__ imp, int n, int k,
                                      const int8_t* levels, const float* coords, const int* kmap, const uint16_t* neighbours,
                                      int dim, int shift, float* d, int8_t* scales, uint16_t* points, uint8_t* signs,
                                      uint8_t* codes, uint8_t* flags) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int block = type == IQ4NL ? 32 : QK_K;
    int blocks = k / block;
    if (t >= (long long)n * blocks) return;
    int r = (int)(t / blocks), b = (int)(t % blocks);
    long long lo = (long long)r * k + (long long)b * block; // flat index of the block's first weight
    const float* x = w + lo;
    const float* qw = imp ? imp + (long long)b * block : nullptr;
    int sub = (type == IQ4NL || type == IQ4XS || type == IQ3XXS || type == IQ3S || type == IQ2XXS || type == IQ1S) ? 32 : 16;
    int sign_group = type == IQ1S ? 32 : 8;
    outputs o;
    o.d = d + lo / block;
    o.scales = scales ? scales + lo / sub : nullptr;
    o.points = dim ? points + lo / dim : nullptr;
    o.signs = dim ? signs + lo / sign_group : nullptr;
    o.codes = dim ? nullptr : codes + lo;
    bool carried = false, ok = true;
    if (type == IQ4NL || type == IQ4XS) {
        fit_iq4(type, x, qw, block, o);
    } else {
        lattice lat{levels, coords, kmap, neighbours, dim, shift};
        ok = type == IQ1S || type == IQ1M ? fit_iq1(type, lat, x, qw, o, &carried) : fit_lattice(type, lat, x, qw, o, &carried);
    }
    flags[t] = !ok ? 2 : (carried ? 1 : 0);
}
