// Runs iquant.cu's kernel on the CPU, one thread after another, for iquant's TestKernelOnCPU:
//   c++ -O2 -ffp-contract=off -std=c++17 -I ../kquant/kernels/host -I kernels -o iquant-host kernels/host/host.cpp
//   iquant-host TYPE N K IMP DIM SHIFT LEVELS KMAP NEIGHBOURS < W [IMPORTANCE] TABLES > D SCALES POINTS SIGNS CODES FLAGS
// W is N·K float32 (row-major), IMPORTANCE K float32 when IMP is 1, TABLES the lattice's levels
// (int8), coordinates (float32, as many), kmap (int32) and neighbours (uint16), of the counts
// given; the outputs are the kernel's, in its argument order (those a type has not: empty),
// zeroed before the run as GPUFitter zeroes them.
#include <cuda_fp16.h> // kquant's stand-ins for the CUDA built-ins
#define __constant__

#include "iquant.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>

template <typename T> static bool read(std::vector<T>& v) { return fread(v.data(), sizeof(T), v.size(), stdin) == v.size(); }
template <typename T> static bool write(const std::vector<T>& v) { return fwrite(v.data(), sizeof(T), v.size(), stdout) == v.size(); }
template <typename T> static T* ptr(std::vector<T>& v) { return v.empty() ? nullptr : v.data(); }

int main(int argc, char** argv) {
    if (argc != 10) return 2;
    int type = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]), has_imp = atoi(argv[4]), dim = atoi(argv[5]),
        shift = atoi(argv[6]);
    size_t nl = atol(argv[7]), nk = atol(argv[8]), nn = atol(argv[9]);
    std::vector<float> w((size_t)n * k), imp(has_imp ? k : 0), coords(nl);
    std::vector<int8_t> levels(nl);
    std::vector<int> kmap(nk);
    std::vector<uint16_t> neighbours(nn);
    if (!read(w) || !read(imp) || !read(levels) || !read(coords) || !read(kmap) || !read(neighbours)) return 3;
    int block = type == IQ4NL ? 32 : QK_K, sub = (type == IQ2XS || type == IQ2S || type == IQ1M) ? 16 : 32;
    size_t blocks = (size_t)n * k / block, weights = (size_t)n * k;
    bool iq4 = type == IQ4NL || type == IQ4XS;
    std::vector<float> d(blocks);
    std::vector<int8_t> scales(type == IQ4NL ? 0 : weights / sub);
    std::vector<uint16_t> points(iq4 ? 0 : weights / dim);
    std::vector<uint8_t> signs(iq4 ? 0 : weights / (type == IQ1S ? 32 : 8)), codes(iq4 ? weights : 0), flags(blocks);
    blockDim.x = 64;
    for (size_t t = 0; t < blocks; t++) {
        blockIdx.x = (unsigned)(t / 64);
        threadIdx.x = (unsigned)(t % 64);
        iquant_fit(type, w.data(), ptr(imp), n, k, ptr(levels), ptr(coords), ptr(kmap), ptr(neighbours), dim, shift, d.data(),
                   ptr(scales), ptr(points), ptr(signs), ptr(codes), flags.data());
    }
    return write(d) && write(scales) && write(points) && write(signs) && write(codes) && write(flags) ? 0 : 4;
}
