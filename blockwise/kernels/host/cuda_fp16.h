// Stand-ins for the CUDA built-ins that microscaled.cu uses, so that microscaled_host.cpp can
// compile it for the CPU (blockwise's TestFP4KernelOnCPU). microscaled.cu includes
// <cuda_fp16.h> first; with -I this directory that is this file:
//   - __fmul_rn, __fdiv_rn, __frcp_rn, __fmaf_rn: one IEEE float32 operation each (build with
//     -ffp-contract=off; the volatile keeps the compiler from fusing anyway);
//   - F16 decoding through _Float16 (g++ 12 or newer);
//   - the packed BF16/F16 min, max and FMA of the BF16 fast paths (QPACK_HOST_STANDINS keeps
//     microscaled.cu's inline assembly out), lane by lane in float (the F16 FMA's product and
//     sum exact in double, then one rounding), and the byte permute, funnel shift and directed
//     float64 → float32 conversions;
//   - thread blocks run as FP4_THREADS std::threads (host_launch): blockIdx and threadIdx are
//     thread-local, __syncthreads waits for the block, __shfl_xor_sync swaps through the warp's
//     slots between two waits for its 32 threads, atomics take a lock, __shared__ is static
//     (blocks run one after another). Build with -std=c++20 -pthread.
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
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __frcp_rn(float a) { volatile float r = 1.0f / a; return r; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
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

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int off) {
    const unsigned t = threadIdx.x, w = t / 32;
    host_block->slot[t] = (unsigned long long)v;
    host_block->warps[w]->arrive_and_wait();
    const T r = (T)host_block->slot[(t & ~31u) | ((t & 31u) ^ (unsigned)off)];
    host_block->warps[w]->arrive_and_wait();
    return r;
}
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
    std::lock_guard<std::mutex> l(host_atomics);
    const unsigned long long old = *p;
    *p = std::min(old, v);
    return old;
}
static inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
    std::lock_guard<std::mutex> l(host_atomics);
    const unsigned int old = *p;
    *p = std::max(old, v);
    return old;
}

// host_launch runs kernel(args...) on a grid of blocks × threads, one block at a time.
template <typename F, typename... A> static void host_launch(unsigned blocks, unsigned threads, F kernel, A... args) {
    gridDim = host_dim3{blocks, 1, 1};
    blockDim = host_dim3{threads, 1, 1};
    for (unsigned b = 0; b < blocks; b++) {
        HostBlock block(threads);
        host_block = &block;
        std::vector<std::thread> run;
        for (unsigned t = 0; t < threads; t++)
            run.emplace_back([=] {
                blockIdx = host_dim3{b, 0, 0};
                threadIdx = host_dim3{t, 0, 0};
                kernel(args...);
            });
        for (auto& r : run) r.join();
        host_block = nullptr;
    }
}

static inline void __syncthreads() { host_block->all.arrive_and_wait(); }

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
