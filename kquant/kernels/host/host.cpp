// Runs kquant.cu's kernels on the CPU, one thread after another, for kquant's TestKernelOnCPU:
//   c++ -O2 -ffp-contract=off -std=c++17 -I kernels/host -I kernels -o kquant-host kernels/host/host.cpp
//   kquant-host BITS N K IMP < W [IMPORTANCE] > STATUS CODES D [DMIN] SCALES [MINS] [BLOCKS]
// W is N·K float32 (row-major), IMPORTANCE K float32 when IMP is 1; the outputs are the fit
// kernel's status words (two uint64, ~0 when nothing was found), then its outputs in its
// argument order (DMIN and MINS only for the types with mins), poisoned before the run, and,
// when K is a multiple of 256 and the status found nothing, the pack kernel's ggml blocks.
#include <cuda_fp16.h> // the stand-ins in this directory

#include "kquant.cu"

#include <cstdio>
#include <cstdlib>
#include <vector>

typedef void fit_kernel(const float*, const float*, int, int, uint8_t*, float*, float*, int8_t*, uint8_t*,
                        unsigned long long*);
typedef void pack_kernel(int, int, const uint8_t*, const float*, const float*, const int8_t*, const uint8_t*, uint8_t*);

template <typename T> static bool write(const std::vector<T>& v) {
    return fwrite(v.data(), sizeof(T), v.size(), stdout) == v.size();
}

// run calls kernel for each of threads "threads" of blocks of 128.
template <typename F> static void run(size_t threads, F kernel) {
    blockDim.x = 128;
    for (size_t t = 0; t < threads; t++) {
        blockIdx.x = (unsigned)(t / 128);
        threadIdx.x = (unsigned)(t % 128);
        kernel();
    }
}

int main(int argc, char** argv) {
    if (argc != 5) return 2;
    int bits = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]), has_imp = atoi(argv[4]);
    fit_kernel* fits[7] = {0, 0, kquant_fit_q2_k, kquant_fit_q3_k, kquant_fit_q4_k, kquant_fit_q5_k, kquant_fit_q6_k};
    pack_kernel* packs[7] = {0, 0, kquant_pack_q2_k, kquant_pack_q3_k, kquant_pack_q4_k, kquant_pack_q5_k, kquant_pack_q6_k};
    if (bits < 2 || bits > 6 || n <= 0 || k <= 0) return 2;
    std::vector<float> w((size_t)n * k), imp(k);
    if (fread(w.data(), 4, w.size(), stdin) != w.size()) return 3;
    if (has_imp && fread(imp.data(), 4, imp.size(), stdin) != imp.size()) return 3;
    bool mins = bits != 3 && bits != 6;
    size_t blocks = (size_t)n * ((k + 255) / 256), subs = (size_t)n * (k / sub_of(bits));
    std::vector<uint8_t> codes((size_t)n * k, 0xad), mn(mins ? subs : 0, 0xad);
    std::vector<int8_t> sc(subs, (int8_t)0xad);
    std::vector<float> d(blocks, -7.f), dmin(mins ? blocks : 0, -7.f);
    std::vector<unsigned long long> status(2, ~0ull);
    run(blocks, [&] {
        fits[bits](w.data(), has_imp ? imp.data() : nullptr, n, k, codes.data(), d.data(), mins ? dmin.data() : nullptr,
                   sc.data(), mins ? mn.data() : nullptr, status.data());
    });
    std::vector<uint8_t> out;
    if (k % 256 == 0 && status[0] == ~0ull && status[1] == ~0ull) {
        out.assign(blocks * block_bytes(bits), 0xad);
        run(blocks, [&] {
            packs[bits](n, k, codes.data(), d.data(), mins ? dmin.data() : nullptr, sc.data(), mins ? mn.data() : nullptr,
                        out.data());
        });
    }
    return write(status) && write(codes) && write(d) && write(dmin) && write(sc) && write(mn) && write(out) ? 0 : 4;
}
