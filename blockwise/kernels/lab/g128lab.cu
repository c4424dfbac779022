// g128lab: variants of the GPTQ int4 g128 BF16 kernel (blockwise.cu, bw_gptq4_g128_bf16), timed
// against each other and a device-to-device copy, each checked byte for byte against the
// committed kernel (which the Go tests check against the pure-Go reference). Built and run on
// the GPU machine:  nvcc -O3 -arch=sm_90 -Xptxas -v -o /tmp/g128lab g128lab.cu && /tmp/g128lab
// Notes and results: NOTES.md beside this file.
#include "../blockwise.cu"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// ---- shared pieces -------------------------------------------------------------------------

// g128_load reads one unit (16 rows × one group of 128 columns) the way bw_gptq4_g128 does.
__device__ __forceinline__ void lab_load(const void* w, int unit, int n_rows, int k, int groups, Raw<IN_BF16> (&x)[8]) {
    const int lane = threadIdx.x & 31;
    const int band = unit / groups, g = unit - band * groups;
    const int r = band * G128_ROWS + (lane >> 1), h = lane & 1;
    const u64 base = (u64)min(r, n_rows - 1) * k + (u64)g * 128;
#pragma unroll
    for (int j = 0; j < 8; j++) load_raw<IN_BF16>(w, base + 8 * (2 * j + h), 8, true, x[j]);
}

// lab_finish: everything after the loads, for one unit. FMA selects the arithmetic:
//   false: the committed one (x = w·r, magic add/sub, |x − n| check, clamp, FMA pack);
//   true:  y = fma(w, r, 1.5·2^23 + zero) rounds w·r exactly once, n = y − (1.5·2^23 + zero),
//          d = fma(w, r, −n) measures the distance to the half-integer, and the clamp is
//          skipped when the group's own extremes show no code leaves [0, 15] (warp-uniform).
template <bool FMA, bool FLAT = false>
__device__ __forceinline__ void lab_finish(const Raw<IN_BF16> (&x)[8], int unit, int n_rows, int k, int groups, int sym,
                                           int zero_shift, unsigned int* qweight, unsigned short* scales,
                                           unsigned int* qzeros, u64* status) {
    constexpr int DT = IN_BF16;
    const int lane = threadIdx.x & 31;
    const int band = unit / groups, g = unit - band * groups;
    const int r0 = band * G128_ROWS;
    const int r = r0 + (lane >> 1), h = lane & 1;
    const bool live = r < n_rows;
    const u64 base = (u64)min(r, n_rows - 1) * k + (u64)g * 128;

    unsigned int mn = 0, mx = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            mn = min2<DT>(mn, x[j].u[q]);
            mx = max2<DT>(mx, x[j].u[q]);
        }
    }
    Raw<DT> m;
    m.u[0] = mn;
    m.u[1] = mx;
    float lo = fminf(raw_at<DT>(m, 0), raw_at<DT>(m, 1));
    float hi = fmaxf(raw_at<DT>(m, 2), raw_at<DT>(m, 3));
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, 1));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, 1));
    __half scale_h;
    float scale, zero;
    int_params(lo, hi, sym, 15, &scale_h, &scale, &zero);
    const RecipInt p = recip_int(scale, zero, 15, fmaxf(-lo, hi));

    const float pack0 = __fadd_rn(8388608.0f, __fmul_rn(zero, 4369.0f));
    unsigned int word[8];
    bool ok = true;
    if constexpr (FMA) {
        const float mz = p.magic_zero;  // 1.5·2^23 + zero, exact
        const bool inside = __fmaf_rn(lo, p.r, mz) >= ROUND_MAGIC && __fmaf_rn(hi, p.r, mz) <= ROUND_MAGIC + 15.0f;
        if (__all_sync(0xffffffffu, inside)) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float pk[2] = {pack0, pack0};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float w = raw_at<DT>(x[j], e);
                    const float n = __fsub_rn(__fmaf_rn(w, p.r, mz), mz);
                    ok &= fabsf(__fmaf_rn(w, p.r, -n)) < p.cutoff;
                    pk[e >> 2] = __fmaf_rn(n, (float)(1 << (4 * (e & 3))), pk[e >> 2]);
                }
                word[j] = __byte_perm(__float_as_uint(pk[0]), __float_as_uint(pk[1]), 0x5410);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float pk[2] = {pack0, pack0};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float w = raw_at<DT>(x[j], e);
                    const float n = __fsub_rn(__fmaf_rn(w, p.r, mz), mz);
                    ok &= fabsf(__fmaf_rn(w, p.r, -n)) < p.cutoff;
                    pk[e >> 2] = __fmaf_rn(fminf(fmaxf(n, p.nlo), p.nhi), (float)(1 << (4 * (e & 3))), pk[e >> 2]);
                }
                word[j] = __byte_perm(__float_as_uint(pk[0]), __float_as_uint(pk[1]), 0x5410);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float pk[2] = {pack0, pack0};
#pragma unroll
            for (int e = 0; e < 8; e++)
                pk[e >> 2] = __fmaf_rn(int_round_fast(raw_at<DT>(x[j], e), p, ok), (float)(1 << (4 * (e & 3))), pk[e >> 2]);
            word[j] = __byte_perm(__float_as_uint(pk[0]), __float_as_uint(pk[1]), 0x5410);
        }
    }
    if (!ok) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            unsigned int wd = 0, bad = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float v = raw_at<DT>(x[j], e);
                bad |= (non_finite(v) ? 1u : 0u) << e;
                wd |= int_code(v, scale, zero, 15) << (4 * e);
            }
            word[j] = wd;
            if (bad) atomicMin(status, base + 8 * (2 * j + h) + __ffs(bad) - 1);
        }
    }
    if (live) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if constexpr (FLAT) qweight[(u64)unit * 256 + 32 * j + lane] = word[j];  // same bytes, contiguous per warp
            else qweight[(u64)(16 * g + 2 * j + h) * n_rows + r] = word[j];
        }
        if (h == 0) {
            scales[(u64)g * n_rows + r] = __half_as_ushort(scale_h);
            if (non_finite(scale)) atomicMin(status + 1, (u64)r * groups + g);
        }
    }
    unsigned int zw = live && h == 0 ? ((unsigned int)((int)zero - zero_shift) & 15u) << (4 * ((lane >> 1) & 7)) : 0u;
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) zw |= __shfl_xor_sync(0xffffffffu, zw, off);
    const int zr = r0 + 8 * (lane >> 4);
    if ((lane & 15) == 0 && zr < n_rows) qzeros[(u64)g * ((n_rows + 7) / 8) + zr / 8] = zw;
}

#define LAB_ARGS                                                                                       \
    const void *w, int n_rows, int k, int groups, int sym, int zero_shift, unsigned int *qweight,     \
        unsigned short *scales, unsigned int *qzeros, u64 *status
#define LAB_PASS n_rows, k, groups, sym, zero_shift, qweight, scales, qzeros, status

// ---- variant P: persistent grid, the next unit loaded into registers while this one is worked --

template <bool FMA>
__device__ __forceinline__ void persistent(LAB_ARGS) {
    const int units = ((n_rows + G128_ROWS - 1) / G128_ROWS) * groups;
    const int stride = gridDim.x * WARPS;
    int u = blockIdx.x * WARPS + (threadIdx.x >> 5);
    Raw<IN_BF16> a[8], b[8];
    if (u < units) lab_load(w, u, n_rows, k, groups, a);
    while (u < units) {
        const int u1 = u + stride;
        if (u1 < units) lab_load(w, u1, n_rows, k, groups, b);
        lab_finish<FMA>(a, u, LAB_PASS);
        if (u1 >= units) break;
        const int u2 = u1 + stride;
        if (u2 < units) lab_load(w, u2, n_rows, k, groups, a);
        lab_finish<FMA>(b, u1, LAB_PASS);
        u = u2;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) lab_p2(LAB_ARGS) { persistent<false>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 2) lab_p2f(LAB_ARGS) { persistent<true>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_p3f(LAB_ARGS) { persistent<true>(w, LAB_PASS); }

// ---- variant A with the FMA arithmetic: the committed launch shape, one unit per warp ----------

extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_af(LAB_ARGS) {
    const int g = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    lab_finish<true>(x, unit, LAB_PASS);
}

// ---- experiments: where does the time go? -------------------------------------------------------
// X1: the committed loads, no arithmetic, one word per lane stored contiguously (read ceiling of
// this access pattern). X2: everything, but qweight stored contiguously per warp instead of in
// GPTQ's column layout (the cost of the scattered 64-byte stores).
extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_x1(LAB_ARGS) {
    const int g = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    unsigned int acc = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) acc ^= x[j].u[0] ^ x[j].u[1] ^ x[j].u[2] ^ x[j].u[3];
    qweight[(u64)unit * 32 + (threadIdx.x & 31)] = acc;
}
extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_x2(LAB_ARGS) {
    const int g = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    lab_finish<false, true>(x, unit, LAB_PASS);
}
// X3: the committed kernel with 4 blocks per SM (≤ 64 registers).
extern "C" __global__ void __launch_bounds__(THREADS, 4) lab_x3(LAB_ARGS) {
    const int g = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    lab_finish<false>(x, unit, LAB_PASS);
}
// X4: blocks of 4 warps (more, smaller blocks: 6 per SM).
extern "C" __global__ void __launch_bounds__(128, 6) lab_x4(LAB_ARGS) {
    const int g = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    lab_finish<false>(x, unit, LAB_PASS);
}

// The committed kernel at other occupancies, and the arithmetic it replaced (lab_finish<false>:
// per-lane division fallback) at its old launch bounds.
extern "C" __global__ void __launch_bounds__(THREADS, 4) lab_new4(LAB_ARGS) { gptq4_g128<IN_BF16>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 2) lab_new2(LAB_ARGS) { gptq4_g128<IN_BF16>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_old(LAB_ARGS) {
    const int g = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= groups) return;
    const int unit = blockIdx.y * groups + g;
    Raw<IN_BF16> x[8];
    lab_load(w, unit, n_rows, k, groups, x);
    lab_finish<false>(x, unit, LAB_PASS);
}

// ---- variant C: cp.async into a ring of shared-memory stages ------------------------------------
// A block tile is 16 rows × 8 groups (1024 columns); 256 threads copy it with 16-byte cp.async
// (a warp instruction reads 512 contiguous bytes), S stages deep. Rows are padded by 32 bytes so
// that a warp's 16-byte reads of its 16 × 128 sub-tile hit distinct banks.
#define C_ROW_BYTES (1024 * 2 + 32)
#define C_STAGE_BYTES (G128_ROWS * C_ROW_BYTES)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// issue_tile copies block tile t (band t / gblocks, group block t % gblocks) into stage.
__device__ __forceinline__ void issue_tile(const void* w, int t, int gblocks, int n_rows, int k, int groups, unsigned char* stage) {
    const int band = t / gblocks, gb = t - band * gblocks;
    const int cols = min(1024, (groups - gb * 8) * 128);  // columns of this tile (partial at the right edge)
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int c = i * THREADS + threadIdx.x;  // 16-byte chunk of the tile: row c / 128, chunk c % 128
        const int row = c >> 7, ch = c & 127;
        if (ch * 8 < cols) {
            const int r = min(band * G128_ROWS + row, n_rows - 1);
            cp_async16(stage + row * C_ROW_BYTES + ch * 16,
                       (const unsigned short*)w + (u64)r * k + (u64)gb * 1024 + ch * 8);
        }
    }
}

template <bool FMA, int S>
__device__ __forceinline__ void staged(LAB_ARGS) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int gblocks = (groups + 7) / 8;
    const int tiles = ((n_rows + G128_ROWS - 1) / G128_ROWS) * gblocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        const int t = blockIdx.x + s * gridDim.x;
        if (t < tiles) issue_tile(w, t, gblocks, n_rows, k, groups, smem + s * C_STAGE_BYTES);
        cp_async_commit();
    }
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, it++) {
        const int tn = t + (S - 1) * gridDim.x;
        if (tn < tiles) issue_tile(w, tn, gblocks, n_rows, k, groups, smem + ((it + S - 1) % S) * C_STAGE_BYTES);
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncthreads();
        const unsigned char* st = smem + (it % S) * C_STAGE_BYTES;
        const int band = t / gblocks, g = (t - band * gblocks) * 8 + warp;
        Raw<IN_BF16> x[8];
        const unsigned char* row = st + (lane >> 1) * C_ROW_BYTES + warp * 256 + (lane & 1) * 16;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint4 v = *(const uint4*)(row + 32 * j);
            x[j].u[0] = v.x; x[j].u[1] = v.y; x[j].u[2] = v.z; x[j].u[3] = v.w;
        }
        __syncthreads();  // the stage is refilled by the next iteration's copies
        if (g < groups) lab_finish<FMA>(x, band * groups + g, LAB_PASS);
    }
    cp_async_wait<0>();
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) lab_c3(LAB_ARGS) { staged<false, 3>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 2) lab_c3f(LAB_ARGS) { staged<true, 3>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 3) lab_c2f(LAB_ARGS) { staged<true, 2>(w, LAB_PASS); }
extern "C" __global__ void __launch_bounds__(THREADS, 1) lab_c6f(LAB_ARGS) { staged<true, 6>(w, LAB_PASS); }

// ---- host ---------------------------------------------------------------------------------------

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

typedef void (*Kernel)(const void*, int, int, int, int, int, unsigned int*, unsigned short*, unsigned int*, u64*);

struct Variant {
    const char* name;
    Kernel fn;
    int kind;   // 0: committed grid (groups/8, bands); 1: persistent units; 2: persistent tiles + smem; 3: X4's grid
    int per_sm; // blocks per SM for persistent kinds
    int stages; // shared-memory stages (kind 2)
};

struct Bufs {
    unsigned int *qw, *qz;
    unsigned short* sc;
    u64* st;
    size_t qw_b, qz_b, sc_b;
};

static int sms;

static void launch(const Variant& v, const void* in, int n, int k, Bufs& b, cudaStream_t s) {
    const int groups = k / 128;
    CK(cudaMemsetAsync(b.st, 0xff, 16, s));  // the quantizer uploads this with the input
    if (v.kind == 3) {
        dim3 grid((groups + 3) / 4, (n + G128_ROWS - 1) / G128_ROWS);
        v.fn<<<grid, 128, 0, s>>>(in, n, k, groups, 0, 0, b.qw, b.sc, b.qz, b.st);
    } else if (v.kind == 0) {
        dim3 grid((groups + WARPS - 1) / WARPS, (n + G128_ROWS - 1) / G128_ROWS);
        v.fn<<<grid, THREADS, 0, s>>>(in, n, k, groups, 0, 0, b.qw, b.sc, b.qz, b.st);
    } else if (v.kind == 1) {
        const int units = (n + G128_ROWS - 1) / G128_ROWS * groups;
        const int blocks = std::min(sms * v.per_sm, (units + WARPS - 1) / WARPS);
        v.fn<<<blocks, THREADS, 0, s>>>(in, n, k, groups, 0, 0, b.qw, b.sc, b.qz, b.st);
    } else {
        const int tiles = (n + G128_ROWS - 1) / G128_ROWS * ((groups + 7) / 8);
        const int blocks = std::min(sms * v.per_sm, tiles);
        v.fn<<<blocks, THREADS, v.stages * C_STAGE_BYTES, s>>>(in, n, k, groups, 0, 0, b.qw, b.sc, b.qz, b.st);
    }
    CK(cudaGetLastError());
}

static unsigned short to_bf16(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void fill_random(std::vector<unsigned short>& h, unsigned seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&]() {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        return x;
    };
    for (size_t i = 0; i < h.size(); i++) {
        // sum of uniforms ~ Gaussian, row-dependent scale, a few outliers and exact zeros
        double g = 0;
        for (int t = 0; t < 4; t++) g += (double)(next() >> 11) / 9007199254740992.0 - 0.5;
        unsigned long long r = next();
        double scale = 0.02 * (1 + (r & 7));
        if ((r >> 8) % 997 == 0) scale *= 30;
        float v = (float)(g * scale);
        if ((r >> 20) % 503 == 0) v = 0;
        h[i] = to_bf16(v);
    }
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
    Variant vs[] = {
        {"committed", bw_gptq4_g128_bf16, 0, 0, 0},
        {"old arithmetic", lab_old, 0, 0, 0},
        {"committed, 4/SM", lab_new4, 0, 0, 0},
        {"committed, 2/SM", lab_new2, 0, 0, 0},
        {"X1 loads only", lab_x1, 0, 0, 0},
    };
    const int nv = sizeof(vs) / sizeof(vs[0]);
    for (auto& v : vs)
        if (v.kind == 2) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.stages * C_STAGE_BYTES));

    struct Shape { const char* label; int n, k; } shapes[] = {
        {"0.5M", 512, 1024}, {"1M", 1024, 1024}, {"5M", 2048, 2560}, {"10M", 4096, 2560},
        {"50M", 8192, 6144}, {"180M", 4 * 11008, 4096}, {"odd", 1001, 11008},
    };
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char* only = argc > 1 ? argv[1] : nullptr;  // one shape, few repetitions: for ncu
    const int reps = only ? 3 : 25;

    // copy ceiling: 1 GiB device to device
    {
        size_t bytes = 1ull << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        CK(cudaMemset(a, 1, bytes));
        std::vector<float> t;
        for (int i = 0; i < 21; i++) {
            CK(cudaEventRecord(e0, s));
            CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        printf("TABLE copy 1GiB D2D: %.3f TB/s\n", 2.0 * bytes / (t[10] * 1e-3) / 1e12);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }

    bool all_ok = true;
    for (auto& sh : shapes) {
        if (only && strcmp(only, sh.label) != 0) continue;
        const int n = sh.n, k = sh.k, groups = k / 128;
        const size_t elems = (size_t)n * k, in_b = elems * 2;
        const int rotate = std::max(2, (int)std::min<size_t>(256, (512ull << 20) / in_b + 1));
        std::vector<void*> ins(rotate);
        std::vector<unsigned short> h(elems);
        for (int i = 0; i < rotate; i++) {
            fill_random(h, 1000 * (unsigned)n + i);
            CK(cudaMalloc(&ins[i], in_b));
            CK(cudaMemcpy(ins[i], h.data(), in_b, cudaMemcpyHostToDevice));
        }
        Bufs ref{}, b{};
        ref.qw_b = b.qw_b = elems / 2;
        ref.qz_b = b.qz_b = (size_t)groups * ((n + 7) / 8) * 4;
        ref.sc_b = b.sc_b = (size_t)groups * n * 2;
        for (Bufs* p : {&ref, &b}) {
            CK(cudaMalloc(&p->qw, p->qw_b));
            CK(cudaMalloc(&p->qz, p->qz_b));
            CK(cudaMalloc(&p->sc, p->sc_b));
            CK(cudaMalloc(&p->st, 16));
        }
        const double moved = in_b + ref.qw_b + ref.qz_b + ref.sc_b;
        std::vector<unsigned char> hr(ref.qw_b + ref.qz_b + ref.sc_b), hb(hr.size());
        auto fetch = [&](Bufs& p, std::vector<unsigned char>& o) {
            CK(cudaMemcpy(o.data(), p.qw, p.qw_b, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + p.qw_b, p.qz, p.qz_b, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(o.data() + p.qw_b + p.qz_b, p.sc, p.sc_b, cudaMemcpyDeviceToHost));
        };
        // copy of these inputs, same rotation
        float copy_ms;
        {
            void* dst;
            CK(cudaMalloc(&dst, in_b));
            std::vector<float> t;
            for (int r = 0; r < reps; r++) {
                CK(cudaEventRecord(e0, s));
                for (int i = 0; i < rotate; i++) CK(cudaMemcpyAsync(dst, ins[i], in_b, cudaMemcpyDeviceToDevice, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms / rotate);
            }
            std::sort(t.begin(), t.end());
            copy_ms = t[reps / 2];
            CK(cudaFree(dst));
        }
        const double copy_bw = 2.0 * in_b / (copy_ms * 1e-3);
        for (int vi = 0; vi < nv; vi++) {
            const Variant& v = vs[vi];
            // correctness on every rotated input against the committed kernel; outputs poisoned
            bool ok = true;
            const bool checked = strncmp(v.name, "X1", 2) != 0 && strncmp(v.name, "X2", 2) != 0;  // other layouts
            for (int i = 0; i < rotate && i < 3 && checked && !only; i++) {
                CK(cudaMemset(ref.qw, 0xa5, ref.qw_b)); CK(cudaMemset(ref.qz, 0xa5, ref.qz_b)); CK(cudaMemset(ref.sc, 0xa5, ref.sc_b));
                CK(cudaMemset(b.qw, 0x5a, b.qw_b)); CK(cudaMemset(b.qz, 0x5a, b.qz_b)); CK(cudaMemset(b.sc, 0x5a, b.sc_b));
                launch(vs[0], ins[i], n, k, ref, s);
                launch(v, ins[i], n, k, b, s);
                CK(cudaStreamSynchronize(s));
                fetch(ref, hr);
                fetch(b, hb);
                if (memcmp(hr.data(), hb.data(), hr.size()) != 0) {
                    size_t at = 0;
                    while (hr[at] == hb[at]) at++;
                    printf("MISMATCH %s %s input %d at byte %zu of %zu\n", v.name, sh.label, i, at, hr.size());
                    ok = false;
                    all_ok = false;
                    break;
                }
            }
            std::vector<float> t;
            for (int r = 0; r < 3; r++) launch(v, ins[r % rotate], n, k, b, s);
            for (int r = 0; r < reps; r++) {
                CK(cudaEventRecord(e0, s));
                for (int i = 0; i < rotate; i++) launch(v, ins[i], n, k, b, s);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms / rotate);
            }
            std::sort(t.begin(), t.end());
            const float ms = t[reps / 2];
            printf("TABLE %-5s %-17s %8.1f us  %5.2f TB/s  copy %5.2f TB/s  %5.1f%% %s\n", sh.label, v.name, ms * 1e3,
                   moved / (ms * 1e-3) / 1e12, copy_bw / 1e12, 100 * moved / (ms * 1e-3) / copy_bw, ok ? "" : "WRONG");
        }
        for (Bufs* p : {&ref, &b}) {
            CK(cudaFree(p->qw)); CK(cudaFree(p->qz)); CK(cudaFree(p->sc)); CK(cudaFree(p->st));
        }
        for (void* p : ins) CK(cudaFree(p));
    }
    printf(all_ok ? "all variants equal the committed kernel\n" : "SOME VARIANTS DIFFER\n");
    return all_ok ? 0 : 1;
}
