// Runs blockwise.cu's one-launch kernels bw_piece_*, bw_rowpc_* and bw_bin_* on the CPU, threads and warps
// emulated (cuda_fp16.h in this directory), for blockwise's TestKernelsOnCPU:
//   c++ -O2 -ffp-contract=off -std=c++20 -pthread -I kernels/host -I kernels -o bw-host kernels/host/blockwise_host.cpp
//   bw-host NAME GX GY N K SYM ZSHIFT LAYOUT CODES SCALES ZEROS OFFSETS < T W > OUT
// NAME is a kernel (bw_piece_int3_g64_bf16, bw_rowpc_int4_c24_f16, bw_bin_g128_f16, …) launched on GX × GY blocks of 256
// threads; T the 15 NF4 thresholds (float32), W the N·K raw weights; CODES … OFFSETS the byte sizes
// of the outputs, which start poisoned (0xa5) and are written out in that order, then the two
// status words.
//   bw-host nf4table DTYPE STEP < T
// compares nf4_code_table's buckets (both variants, with the table nf4_bucket gives each lane)
// with nf4_code of the true division on every finite 16-bit weight (DTYPE 0 BF16, 1 F16) and
// every STEP-th finite positive F16 scale, where the kernels use it, as bw_check_round_exact does
// on the GPU; it prints the pairs compared and exits 1 on a mismatch.
//   bw-host divcheck STEP < T
// compares div_const<C>(x) with the division x / C for C = 3, 7, 15, 255 on every STEP-th finite
// float32 x ≥ 0 (and the largest), likewise.
#include <cuda_fp16.h>  // the stand-ins in this directory

#include "blockwise.cu"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

typedef void (*piece_fn)(const void*, int, int, int, int, int, unsigned char*, unsigned short*, unsigned char*, const float*, u64*);
typedef void (*bin_fn)(const void*, int, int, int, unsigned char*, unsigned short*, unsigned short*, u64*);

#define PIECE(name) {#name "_bf16", name##_bf16}, {#name "_f16", name##_f16}
static const std::map<std::string, piece_fn> pieces = {
    PIECE(bw_piece_int2_g32), PIECE(bw_piece_int2_g64), PIECE(bw_piece_int2_g128), PIECE(bw_piece_int3_g32),
    PIECE(bw_piece_int3_g64), PIECE(bw_piece_int3_g128), PIECE(bw_piece_int4_g32), PIECE(bw_piece_int4_g64),
    PIECE(bw_piece_int4_g128), PIECE(bw_piece_int8_g32), PIECE(bw_piece_int8_g64), PIECE(bw_piece_int8_g128),
    PIECE(bw_piece_nf4_g32), PIECE(bw_piece_nf4_g64), PIECE(bw_piece_nf4_g128),
    PIECE(bw_rowpc_int4_c16), PIECE(bw_rowpc_int4_c24), PIECE(bw_rowpc_int8_c16), PIECE(bw_rowpc_int8_c24),
    PIECE(bw_rowpc_nf4_c16), PIECE(bw_rowpc_nf4_c24),  // the same parameters
};
static const std::map<std::string, bin_fn> bins = {
    {"bw_bin_g32_bf16", bw_bin_g32_bf16}, {"bw_bin_g64_bf16", bw_bin_g64_bf16}, {"bw_bin_g128_bf16", bw_bin_g128_bf16},
    {"bw_bin_g32_f16", bw_bin_g32_f16},   {"bw_bin_g64_f16", bw_bin_g64_f16},   {"bw_bin_g128_f16", bw_bin_g128_f16},
};

static int nf4table(int dt, int step, const float (&t)[15]) {
    float thr[32];
    unsigned int base[32];
    for (unsigned l = 0; l < 32; l++) {
        threadIdx.x = l;
        nf4_bucket(t, thr[l], base[l]);
    }
    unsigned long long checked = 0, bad = 0;
    for (unsigned bits = 0; bits <= 0xffffu; bits++) {
        const float w = dt == IN_BF16 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half((unsigned short)bits));
        if (non_finite(w)) continue;
        for (unsigned sb = 1; sb < 0x7c00u; sb += step) {
            const float scale = __half2float(__ushort_as_half((unsigned short)sb));
            const RecipInt p = recip_int(scale, 0.0f, 15, fabsf(w));
            if (!p.safe) continue;
            const float x = quotient_exact(w, p);
            const unsigned int want = nf4_code(__fdiv_rn(w, scale), t);
            const int bc = nf4_bucket_of<true>(x) & 31, bp = nf4_bucket_of<false>(x) & 31;
            const bool plain_used = sb >= 0x0400u && fabsf(w) <= __fmul_rn(scale, 1.0009765625f);
            checked++;
            if (nf4_code_in(x, thr[bc], base[bc]) != want || (plain_used && nf4_code_in(x, thr[bp], base[bp]) != want)) {
                if (bad++ < 5) fprintf(stderr, "mismatch: weight %#06x scale %#06x x %.9g want %u\n", bits, sb, x, want);
            }
        }
    }
    printf("%llu pairs, %llu mismatches\n", checked, bad);
    return bad ? 1 : 0;
}

template <int C>
static unsigned long long divcheck(unsigned step, unsigned long long& checked) {
    unsigned long long bad = 0;
    for (uint64_t u = 0; u <= 0x7f7fffffu; u += step) {
        const float x = __uint_as_float((unsigned int)(u == 0 ? 0 : u > 0x7f7fffffu - step ? 0x7f7fffffu : u));
        checked++;
        if (__float_as_uint(div_const<C>(x)) != __float_as_uint(__fdiv_rn(x, (float)C)) && bad++ < 5)
            fprintf(stderr, "mismatch: %#010x / %d\n", __float_as_uint(x), C);
    }
    return bad;
}

int main(int argc, char** argv) {
    float t[15];
    if (fread(t, 4, 15, stdin) != 15) return 3;
    if (argc == 4 && std::string(argv[1]) == "nf4table") return nf4table(atoi(argv[2]), atoi(argv[3]), t);
    if (argc == 3 && std::string(argv[1]) == "divcheck") {
        const unsigned step = atoi(argv[2]);
        unsigned long long checked = 0;
        const unsigned long long bad = divcheck<3>(step, checked) + divcheck<7>(step, checked) + divcheck<15>(step, checked) +
                                       divcheck<255>(step, checked);
        printf("%llu quotients, %llu mismatches\n", checked, bad);
        return bad ? 1 : 0;
    }
    if (argc != 13) return 2;
    const std::string name = argv[1];
    const unsigned gx = atoi(argv[2]), gy = atoi(argv[3]);
    const int n = atoi(argv[4]), k = atoi(argv[5]), sym = atoi(argv[6]), zshift = atoi(argv[7]), layout = atoi(argv[8]);
    size_t sizes[4];
    for (int i = 0; i < 4; i++) sizes[i] = strtoull(argv[9 + i], nullptr, 10);
    const size_t in = (size_t)n * k * 2;
    std::vector<uint4> w(in / 16 + 1);  // 16-byte loads: aligned
    if (fread(w.data(), 1, in, stdin) != in) return 3;
    std::vector<std::vector<uint4>> out(4);
    for (int i = 0; i < 4; i++) {
        out[i].resize(sizes[i] / 16 + 1);
        memset(out[i].data(), 0xa5, out[i].size() * 16);
    }
    u64 status[2] = {~0ull, ~0ull};
    auto codes = (unsigned char*)out[0].data();
    auto scales = (unsigned short*)out[1].data();
    if (auto p = pieces.find(name); p != pieces.end()) {
        auto f = p->second;
        host_launch(host_dim3{gx, gy, 1}, THREADS, [&] {
            f(w.data(), n, k, sym, zshift, layout, codes, scales, (unsigned char*)out[2].data(), t, status);
        });
    } else if (auto b = bins.find(name); b != bins.end()) {
        auto f = b->second;
        host_launch(host_dim3{gx, gy, 1}, THREADS, [&] {
            f(w.data(), n, k, sym, codes, scales, (unsigned short*)out[3].data(), status);
        });
    } else {
        fprintf(stderr, "no kernel %s\n", name.c_str());
        return 2;
    }
    bool ok = true;
    for (int i = 0; i < 4; i++) ok = ok && fwrite(out[i].data(), 1, sizes[i], stdout) == sizes[i];
    ok = ok && fwrite(status, 8, 2, stdout) == 2;
    return ok ? 0 : 4;
}
