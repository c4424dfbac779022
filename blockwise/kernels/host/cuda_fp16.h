// Stand-ins for the CUDA built-ins that microscaled.cu and blockwise.cu use, so that
// microscaled_host.cpp and blockwise_host.cpp can compile them for the CPU (blockwise's
// TestFP4KernelOnCPU, TestKernelsOnCPU). The kernels include <cuda_fp16.h> first; with -I this
// directory that is this file:
//   - __fmul_rn, __fdiv_rn, __frcp_rn, __fmaf_rn, __dadd_rn, …: one IEEE operation each (build
//     with -ffp-contract=off; the volatile keeps the compiler from fusing anyway);
//   - F16 through _Float16 (g++ 12 or newer);
//   - the packed BF16/F16 min, max and FMA of the BF16 fast paths (QPACK_HOST_STANDINS keeps
//     microscaled.cu's inline assembly out), lane by lane in float (the F16 FMA's product and
//     sum exact in double, then one rounding), and the byte permute, funnel shift and directed
//     float64 → float32 conversions;
//   - thread blocks run as std::threads (host_launch): blockIdx and threadIdx are thread-local,
//     __syncthreads waits for the block, the shuffles (__shfl_xor_sync, __shfl_sync, __all_sync)
//     swap bits through the warp's slots between two waits for its 32 threads, a thread that
//     returns drops out of its warp's and block's barriers (as a finished thread on the GPU),
//     atomics take a lock, __shared__ is static (blocks run one after another). Build with
//     -std=c++20 -pthread.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define QPACK_HOST_STANDINS 1

struct host_dim3 {
    unsigned x, y, z;
};
static thread_local host_dim3 blockIdx, threadIdx;
static host_dim3 blockDim, gridDim;
struct uint4 {
    unsigned int x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }

using std::max;
using std::min;

// bits_as reinterprets the bits of v as a To of the same size.
template <typename To, typename From> static inline To bits_as(From v) {
    static_assert(sizeof(To) == sizeof(From), "sizes differ");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
static inline float __uint_as_float(unsigned int u) { return bits_as<float>(u); }
static inline unsigned int __float_as_uint(float v) { return bits_as<unsigned int>(v); }
static inline float __int_as_float(int u) { return bits_as<float>(u); }
static inline int __float_as_int(float v) { return bits_as<int>(v); }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __frcp_rn(float a) { volatile float r = 1.0f / a; return r; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
static inline float __double2float_rn(double a) { volatile float r = (float)a; return r; }
static inline double __hiloint2double(int hi, int lo) { return bits_as<double>((uint64_t)(uint32_t)hi << 32 | (uint32_t)lo); }
static inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; i++) r |= (x >> i & 1) << (31 - i);
    return r;
}
static inline int __ffs(unsigned int x) { return __builtin_ffs((int)x); }
static inline unsigned int __vmaxu2(unsigned int a, unsigned int b) {
    return std::max(a & 0xffffu, b & 0xffffu) | std::max(a >> 16, b >> 16) << 16;
}

struct __half {
    _Float16 h;
};
static inline __half __ushort_as_half(unsigned short s) {
    __half h;
    memcpy(&h.h, &s, 2);
    return h;
}
static inline float __half2float(__half h) { return (float)h.h; }
static inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
static inline unsigned short __half_as_ushort(__half h) { return bits_as<unsigned short>(h.h); }
// __float2half_ru and __float2half_rd for f ≥ 0 (what the kernels convert): the nearest F16, then
// one step up or down when it lies on the wrong side (non-negative F16 order as their bits).
static inline __half __float2half_ru(float f) {
    unsigned short b = __half_as_ushort(__float2half_rn(f));
    if (__half2float(__ushort_as_half(b)) < f) b++;
    return __ushort_as_half(b);
}
static inline __half __float2half_rd(float f) {
    unsigned short b = __half_as_ushort(__float2half_rn(f));
    if (__half2float(__ushort_as_half(b)) > f) b--;
    return __ushort_as_half(b);
}

template <typename T> static inline T __ldg(const T* p) { return *p; }

// HostBlock is the running thread block's synchronisation: one barrier for __syncthreads, one
// per warp and a slot per thread for the shuffles.
struct HostBlock {
    std::barrier<> all;
    std::vector<std::barrier<>*> warps;
    std::vector<unsigned long long> slot;
    explicit HostBlock(unsigned threads) : all(threads), slot(threads) {
        for (unsigned w = 0; w < threads / 32; w++) warps.push_back(new std::barrier<>(32));
    }
    ~HostBlock() {
        for (auto* w : warps) delete w;
    }
};
static HostBlock* host_block;
static std::mutex host_atomics;

// host_exchange posts this thread's v in its warp and returns the one lane src posted.
template <typename T> static inline T host_exchange(T v, unsigned src) {
    static_assert(sizeof(T) <= 8, "at most 8 bytes");
    const unsigned t = threadIdx.x, w = t / 32;
    unsigned long long u = 0;
    memcpy(&u, &v, sizeof v);
    host_block->slot[t] = u;
    host_block->warps[w]->arrive_and_wait();
    u = host_block->slot[(t & ~31u) | (src & 31u)];
    host_block->warps[w]->arrive_and_wait();
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int off) { return host_exchange(v, (threadIdx.x & 31u) ^ (unsigned)off); }
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) { return host_exchange(v, (unsigned)src); }
static inline bool __all_sync(unsigned, bool p) {
    bool all = true;
    for (unsigned l = 0; l < 32; l++) {
        const bool v = host_exchange(p, l);  // every lane exchanges every time
        all = all && v;
    }
    return all;
}

// host_atomic replaces *p by f(*p) under a lock and returns the old value.
template <typename T, typename F> static inline T host_atomic(T* p, F f) {
    std::lock_guard<std::mutex> l(host_atomics);
    const T old = *p;
    *p = f(old);
    return old;
}
template <typename T> static inline T atomicMin(T* p, T v) { return host_atomic(p, [v](T o) { return std::min(o, v); }); }
template <typename T> static inline T atomicMax(T* p, T v) { return host_atomic(p, [v](T o) { return std::max(o, v); }); }
template <typename T> static inline T atomicAdd(T* p, T v) { return host_atomic(p, [v](T o) { return o + v; }); }

// host_launch runs kernel(args...) on a grid of blocks (x fastest) × threads, one block at a time.
template <typename F, typename... A> static void host_launch(host_dim3 grid, unsigned threads, F kernel, A... args) {
    gridDim = grid;
    blockDim = host_dim3{threads, 1, 1};
    for (unsigned by = 0; by < grid.y; by++) {
        for (unsigned bx = 0; bx < grid.x; bx++) {
            HostBlock block(threads);
            host_block = &block;
            std::vector<std::thread> run;
            for (unsigned t = 0; t < threads; t++)
                run.emplace_back([=] {
                    blockIdx = host_dim3{bx, by, 0};
                    threadIdx = host_dim3{t, 0, 0};
                    kernel(args...);
                    host_block->warps[t / 32]->arrive_and_drop();
                    host_block->all.arrive_and_drop();
                });
            for (auto& r : run) r.join();
            host_block = nullptr;
        }
    }
}
template <typename F, typename... A> static void host_launch(unsigned blocks, unsigned threads, F kernel, A... args) {
    host_launch(host_dim3{blocks, 1, 1}, threads, kernel, args...);
}

static inline void __syncthreads() { host_block->all.arrive_and_wait(); }

// host_minmax2 is min.NaN/max.NaN.{bf16,f16}x2: per 16-bit half, NaN (0x7fff) when either is NaN.
static inline unsigned int host_minmax2(bool bf16, bool is_max, unsigned int a, unsigned int b) {
    unsigned int d = 0;
    for (int i = 0; i < 2; i++) {
        const unsigned short ha = (unsigned short)(a >> (16 * i)), hb = (unsigned short)(b >> (16 * i));
        const float fa = bf16 ? __uint_as_float((unsigned int)ha << 16) : __half2float(__ushort_as_half(ha));
        const float fb = bf16 ? __uint_as_float((unsigned int)hb << 16) : __half2float(__ushort_as_half(hb));
        unsigned short r;
        if (std::isnan(fa) || std::isnan(fb)) r = 0x7fff;
        else r = (is_max ? fb > fa : fb < fa) ? hb : ha;
        d |= (unsigned int)r << (16 * i);
    }
    return d;
}

static inline float bf16_lane(unsigned int w, int lane) { return __uint_as_float((w >> (16 * lane) & 0xffffu) << 16); }
static inline unsigned int bf16x2_pick(unsigned int a, unsigned int b, bool (*take_b)(float, float)) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const unsigned int h = take_b(bf16_lane(a, lane), bf16_lane(b, lane)) ? b : a;
        d |= (h >> (16 * lane) & 0xffffu) << (16 * lane);
    }
    return d;
}
// max.NaN.bf16x2: the canonical NaN 0x7fff when either lane is NaN.
static inline unsigned int bf16x2_max_nan(unsigned int a, unsigned int b) {
    unsigned int d = bf16x2_pick(a, b, [](float x, float y) { return y > x; });
    for (int lane = 0; lane < 2; lane++)
        if (std::isnan(bf16_lane(a, lane)) || std::isnan(bf16_lane(b, lane))) d = (d & ~(0xffffu << (16 * lane))) | 0x7fffu << (16 * lane);
    return d;
}
// max.NaN.f16x2: the canonical NaN 0x7fff when either lane is NaN.
static inline unsigned int f16x2_max_nan(unsigned int a, unsigned int b) { return host_minmax2(false, true, a, b); }
static inline unsigned int bf16x2_max(unsigned int a, unsigned int b) { return bf16x2_pick(a, b, [](float x, float y) { return y > x; }); }
static inline unsigned int bf16x2_min(unsigned int a, unsigned int b) { return bf16x2_pick(a, b, [](float x, float y) { return y < x; }); }

static inline _Float16 f16_lane(unsigned int w, int lane) { return bits_as<_Float16>((unsigned short)(w >> (16 * lane))); }
static inline unsigned int f16_bits(_Float16 h) { return bits_as<unsigned short>(h); }
static inline unsigned int f16x2_fma(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const double v = (double)f16_lane(a, lane) * (double)f16_lane(b, lane) + (double)f16_lane(c, lane);
        d |= f16_bits((_Float16)v) << (16 * lane);
    }
    return d;
}
static inline unsigned int f16x2_max(unsigned int a, unsigned int b) {
    unsigned int d = 0;
    for (int lane = 0; lane < 2; lane++) {
        const _Float16 x = f16_lane(a, lane), y = f16_lane(b, lane);
        d |= f16_bits(y > x ? y : x) << (16 * lane);
    }
    return d;
}

static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned int d = 0;
    for (int i = 0; i < 4; i++) d |= (unsigned int)(v >> (8 * (s >> (4 * i) & 7)) & 0xffu) << (8 * i);
    return d;
}
static inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
    const unsigned long long v = (unsigned long long)hi << 32 | lo;
    return (unsigned int)(v << (shift & 31) >> 32);
}
static inline float __double2float_ru(double v) {
    float f = (float)v;
    if ((double)f < v) f = std::nextafter(f, INFINITY);
    return f;
}
static inline float __double2float_rd(double v) {
    float f = (float)v;
    if ((double)f > v) f = std::nextafter(f, -INFINITY);
    return f;
}
using std::fmaxf;
