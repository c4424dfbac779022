// Runs microscaled.cu's FP4 arithmetic on the CPU, block after block, for blockwise's
// TestFP4KernelOnCPU:
//   c++ -O2 -ffp-contract=off -std=c++20 -pthread -I kernels/host -I kernels -o fp4-host kernels/host/microscaled_host.cpp
//   fp4-host NV N K DTYPE G < W > CODES SCALES GLOBAL
//   fp4-host kernel NV N K DTYPE G BLOCKS < W > CODES SCALES GLOBAL STATUS
//   fp4-host exhaustive G...
//   fp4-host amax DTYPE CHUNKS BLOCKS < W > WORD
//   fp4-host slow DTYPE G...
// NV is 1 for NVFP4, 0 for MXFP4; DTYPE 0 (BF16), 1 (F16) or 2 (F32) as the kernels number
// them; W the N·K raw weights; G the global scale's float bits in hex (0: from the tensor).
// Each block's chunks are coded two by two with the kernel's fp4_chunks (the 16-bit fast paths included, with
// the NVFP4 scale table built as each thread block builds it), its absmax is their max as the
// kernel's shuffles take it, and G comes from the same amax the amax kernel reduces. Outputs:
// codes (N·K/2 bytes), scale bytes (N·K/block) and G as float32 (NVFP4). The amax mode runs
// bw_fp4_amax alone on CHUNKS chunks of 8 weights with a grid of BLOCKS thread blocks and writes
// the word it raised from 0 (4 bytes). The slow mode prints, for each G, a line of the scale
// bytes 1 … 125 whose blocks of 16-bit dtype DTYPE the NVFP4 table sends to the general path.
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
    NVEntry table[128];
    for (unsigned int b = 0; b < 128; b++) table[b] = nvfp4_entry<DT == IN_F32 ? IN_BF16 : DT>(b, g);  // F32 never reads it
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
        unsigned int byte = 0;
        for (int i = 0; i < per; i += 2) fp4_chunks<DT, NV, 2>(&x[i], amax, g, table, byte, &codes[b * per + i]);
        scales[b] = (unsigned char)byte;
    }
}

// nvfp4_exhaustive checks the NVFP4 fast path of 16-bit dtype DT under global scale g: every
// scale byte the table clears, every magnitude up to nvfp4_top, both signs, against the general
// arithmetic (the division and e2m1_code). It prints what it checked and fails on the first
// difference.
template <int DT>
static int nvfp4_exhaustive(float g) {
    int fast = 0;
    long checked = 0;
    for (unsigned int b = 1; b < 0x7f; b++) {
        const NVEntry entry = nvfp4_entry<DT>(b, g);
        if (entry.r == 0.0f) continue;
        fast++;
        const float f = __fdiv_rn(e4m3_value(b), g);
        const unsigned int top = nvfp4_top<DT>(b, g);
        for (unsigned int a = 0; a <= top; a += 4) {
            Chunk<DT> x;
            for (int j = 0; j < 4; j++) x.u[j] = min(a + j, top) | (min(a + j, top) | 0x8000u) << 16;
            const unsigned int got = nvfp4_half_codes<DT>(x, entry);
            for (int j = 0; j < 8; j++) {
                const unsigned int want = e2m1_code(__fdiv_rn(chunk_at<DT>(x, j), f));
                if ((got >> (4 * j) & 15u) != want) {
                    fprintf(stderr, "NVFP4 %s G %g byte %u, weight %08x: code %x, want %x\n", DT == IN_BF16 ? "BF16" : "F16", g, b,
                            __float_as_uint(chunk_at<DT>(x, j)), got >> (4 * j) & 15u, want);
                    return 1;
                }
            }
            checked += 8;
        }
    }
    printf("NVFP4 %s G=%g: %d of 126 scale bytes on the fast path, %ld weights\n", DT == IN_BF16 ? "BF16" : "F16", g, fast, checked);
    return 0;
}

// mxfp4_exhaustive checks the MXFP4 fast path of 16-bit dtype DT for every scale byte it takes
// (BF16: 3 … 252; F16: all up to 140, the largest F16's), every magnitude below 8·scale, both
// signs, against e2m1_code of the exact quotient.
template <int DT>
static int mxfp4_exhaustive() {
    long checked = 0;
    for (unsigned int e = DT == IN_BF16 ? 3 : 0; e <= (DT == IN_BF16 ? 252u : 140u); e++) {
        const float r = __uint_as_float((254u - e) << 23);
        unsigned int top = 0;  // the bits past the last magnitude below 8·2^(e−127)
        while (top <= half_max<DT>() && __float_as_uint(half_value<DT>(top)) < (e + 3u) << 23) top++;
        for (unsigned int a = 0; a < top; a += 4) {
            Chunk<DT> x;
            for (int j = 0; j < 4; j++) x.u[j] = min(a + j, top - 1) | (min(a + j, top - 1) | 0x8000u) << 16;
            unsigned int got;
            if constexpr (DT == IN_BF16) got = mxfp4_bf16_codes(x, e);
            else got = mxfp4_f16_codes(x, e);
            for (int j = 0; j < 8; j++) {
                const unsigned int want = e2m1_code(__fmul_rn(chunk_at<DT>(x, j), r));
                if ((got >> (4 * j) & 15u) != want) {
                    fprintf(stderr, "MXFP4 %s byte %u, weight %08x: code %x, want %x\n", DT == IN_BF16 ? "BF16" : "F16", e,
                            __float_as_uint(chunk_at<DT>(x, j)), got >> (4 * j) & 15u, want);
                    return 1;
                }
            }
            checked += 8;
        }
    }
    printf("MXFP4 %s: %ld weights\n", DT == IN_BF16 ? "BF16" : "F16", checked);
    return 0;
}

// exhaustive checks the fast paths of 16-bit weights against the kernels' general arithmetic (the
// division path and e2m1_code, which the block runs check against the CPU reference) on every
// BF16 and F16 weight: MXFP4 for every scale byte the fast path takes (BF16: 3 … 252; F16: all
// up to 140, the largest F16's) and every magnitude below 8·scale, both signs; NVFP4 for every
// scale byte the table clears under each global scale G given (hex float bits).
static int exhaustive(int n, char** gs) {
    if (mxfp4_exhaustive<IN_BF16>() != 0 || mxfp4_exhaustive<IN_F16>() != 0) return 1;
    for (int i = 0; i < n; i++) {
        const float g = __uint_as_float((unsigned int)strtoul(gs[i], nullptr, 16));
        if (nvfp4_exhaustive<IN_BF16>(g) != 0 || nvfp4_exhaustive<IN_F16>(g) != 0) return 1;
    }
    return 0;
}

// read_weights reads the N·K raw weights from stdin into buf, 16-byte aligned (the kernels load
// 16 bytes at a time), and returns where they start, or nullptr when stdin is short.
static void* read_weights(int n, int k, int dt, std::vector<unsigned char>& buf) {
    const size_t size = (size_t)n * k * (dt == IN_F32 ? 4 : 2);
    buf.resize(size + 16);
    void* wp = (void*)(((uintptr_t)buf.data() + 15) & ~(uintptr_t)15);
    return fread(wp, 1, size, stdin) == size ? wp : nullptr;
}

// launch runs the kernels themselves on a grid of the given number of thread blocks (each one
// FP4_THREADS threads, host_launch): bw_fp4_amax first when NVFP4's G is not given, then the
// quantization kernel, as blockwise.GPUQuantizer launches them; status ends as the flat index
// of the first non-finite weight, or all ones.
static void launch(int nv, int dt, const void* w, u64 chunks, unsigned int g_bits, unsigned int blocks, std::vector<unsigned int>& codes,
                   std::vector<unsigned char>& scales, float& g, u64& status) {
    typedef void (*quantize)(const void*, u64, const unsigned int*, int, unsigned int*, unsigned char*, float*, u64*);
    typedef void (*amax)(const void*, u64, unsigned int*);
    const quantize q[2][3] = {{bw_fp4_mxfp4_bf16, bw_fp4_mxfp4_f16, bw_fp4_mxfp4_f32}, {bw_fp4_nvfp4_bf16, bw_fp4_nvfp4_f16, bw_fp4_nvfp4_f32}};
    const amax a[3] = {bw_fp4_amax_bf16, bw_fp4_amax_f16, bw_fp4_amax_f32};
    unsigned int word = g_bits;
    status = ~0ull;
    if (nv && g_bits == 0) host_launch(blocks, FP4_THREADS, a[dt], w, chunks, &word);
    host_launch(blocks, FP4_THREADS, q[nv][dt], w, chunks, (const unsigned int*)&word, (int)(g_bits != 0), codes.data(), scales.data(), &g, &status);
}

// amax runs bw_fp4_amax of dtype dt on chunks chunks read from stdin, on a grid of blocks.
static int amax(int dt, u64 chunks, unsigned int blocks) {
    typedef void (*kernel)(const void*, u64, unsigned int*);
    const kernel a[3] = {bw_fp4_amax_bf16, bw_fp4_amax_f16, bw_fp4_amax_f32};
    std::vector<unsigned char> buf;
    const void* wp = read_weights(1, (int)(8 * chunks), dt, buf);
    if (wp == nullptr) return 3;
    unsigned int word = 0;
    host_launch(blocks, FP4_THREADS, a[dt], wp, chunks, &word);
    return fwrite(&word, 4, 1, stdout) == 1 ? 0 : 4;
}

// slow prints the scale bytes the NVFP4 table of dtype dt leaves to the general path under each
// global scale G of gs (hex float bits), a line each.
static int slow(int dt, int n, char** gs) {
    for (int i = 0; i < n; i++) {
        const float g = __uint_as_float((unsigned int)strtoul(gs[i], nullptr, 16));
        for (unsigned int b = 1; b < 0x7e; b++)
            if ((dt == IN_BF16 ? nvfp4_entry<IN_BF16>(b, g) : nvfp4_entry<IN_F16>(b, g)).r == 0.0f) printf(" %u", b);
        printf("\n");
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 3 && strcmp(argv[1], "slow") == 0) return slow(atoi(argv[2]), argc - 3, argv + 3);
    if (argc >= 2 && strcmp(argv[1], "exhaustive") == 0) return exhaustive(argc - 2, argv + 2);
    if (argc == 5 && strcmp(argv[1], "amax") == 0) return amax(atoi(argv[2]), strtoull(argv[3], nullptr, 10), (unsigned int)atoi(argv[4]));
    const bool kernels = argc == 8 && strcmp(argv[1], "kernel") == 0;
    if (kernels) argv++;
    else if (argc != 6) return 2;
    const int nv = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]), dt = atoi(argv[4]);
    const unsigned int g_bits = (unsigned int)strtoul(argv[5], nullptr, 16);
    std::vector<unsigned char> w;
    void* wp = read_weights(n, k, dt, w);
    if (wp == nullptr) return 3;
    const u64 chunks = (u64)n * k / 8;
    std::vector<unsigned int> codes(chunks);
    std::vector<unsigned char> scales((size_t)n * k / (nv ? 16 : 32));
    float g = 0;
    u64 status = 0;
    if (kernels) {
        launch(nv, dt, wp, chunks, g_bits, (unsigned int)atoi(argv[6]), codes, scales, g, status);
    } else if (nv) {
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
    if (kernels) ok = ok && fwrite(&status, 8, 1, stdout) == 1;
    return ok ? 0 : 4;
}
