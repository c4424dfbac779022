// Runs microscaled.cu's FP4 arithmetic on the CPU, block after block, for blockwise's
// TestFP4KernelOnCPU:
//   c++ -O2 -ffp-contract=off -std=c++17 -I kernels/host -I kernels -o fp4-host kernels/host/microscaled_host.cpp
//   fp4-host NV N K DTYPE G < W > CODES SCALES GLOBAL
// NV is 1 for NVFP4, 0 for MXFP4; DTYPE 0 (BF16), 1 (F16) or 2 (F32) as the kernels number
// them; W the N·K raw weights; G the global scale's float bits in hex (0: from the tensor).
// Each block's chunks are coded with the kernel's functions, its absmax is their max as the
// kernel's shuffles take it, and G comes from the same amax the amax kernel reduces. Outputs:
// codes (N·K/2 bytes), scale bytes (N·K/block) and G as float32 (NVFP4).
#include <cuda_fp16.h>  // the stand-ins in this directory

#include "microscaled.cu"

#include <cstdio>
#include <vector>

template <int DT, bool NV>
static void run(const void* w, u64 chunks, unsigned int g_bits, std::vector<unsigned int>& codes, std::vector<unsigned char>& scales, float& g) {
    constexpr int per = NV ? 2 : 4;  // chunks per block
    unsigned int amax_all = 0;
    for (u64 c = 0; c < chunks; c++) {
        Chunk<DT> x;
        load_chunk<DT>(w, c, x);
        amax_all = max(amax_all, chunk_absmax<DT>(x));
    }
    g = g_bits ? __uint_as_float(g_bits) : nvfp4_global(__uint_as_float(amax_all));
    for (u64 b = 0; b < chunks / per; b++) {
        Chunk<DT> x[4];
        unsigned int amax = 0;
        for (int i = 0; i < per; i++) {
            load_chunk<DT>(w, b * per + i, x[i]);
            amax = max(amax, chunk_absmax<DT>(x[i]));
        }
        if (amax >= 0x7f800000u) {
            fprintf(stderr, "non-finite weight in block %llu\n", b);
            exit(5);
        }
        const FP4Block blk = NV ? nvfp4_block(__uint_as_float(amax), g) : mxfp4_block(amax);
        for (int i = 0; i < per; i++) codes[b * per + i] = chunk_codes<DT, NV>(x[i], blk);
        scales[b] = (unsigned char)blk.byte;
    }
}

int main(int argc, char** argv) {
    if (argc != 6) return 2;
    const int nv = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]), dt = atoi(argv[4]);
    const unsigned int g_bits = (unsigned int)strtoul(argv[5], nullptr, 16);
    const size_t size = (size_t)n * k * (dt == IN_F32 ? 4 : 2);
    std::vector<unsigned char> w(size + 16);  // 16-byte loads: keep the buffer aligned and whole
    void* wp = (void*)(((uintptr_t)w.data() + 15) & ~(uintptr_t)15);
    if (fread(wp, 1, size, stdin) != size) return 3;
    const u64 chunks = (u64)n * k / 8;
    std::vector<unsigned int> codes(chunks);
    std::vector<unsigned char> scales((size_t)n * k / (nv ? 16 : 32));
    float g = 0;
    if (nv) {
        if (dt == IN_BF16) run<IN_BF16, true>(wp, chunks, g_bits, codes, scales, g);
        else if (dt == IN_F16) run<IN_F16, true>(wp, chunks, g_bits, codes, scales, g);
        else run<IN_F32, true>(wp, chunks, g_bits, codes, scales, g);
    } else {
        if (dt == IN_BF16) run<IN_BF16, false>(wp, chunks, g_bits, codes, scales, g);
        else if (dt == IN_F16) run<IN_F16, false>(wp, chunks, g_bits, codes, scales, g);
        else run<IN_F32, false>(wp, chunks, g_bits, codes, scales, g);
    }
    bool ok = fwrite(codes.data(), 4, codes.size(), stdout) == codes.size() &&
              fwrite(scales.data(), 1, scales.size(), stdout) == scales.size();
    if (nv) ok = ok && fwrite(&g, 4, 1, stdout) == 1;
    return ok ? 0 : 4;
}
