// Kernels of the GPU forward pass (model/forward_cuda.go): everything but the GEMMs, which are
// cuBLAS's. Each mirrors a pure-Go function of the model package (named in its comment) and is
// tested against it. Row-wise kernels use one block of ROW_THREADS threads per row.
// Machine code for the H100 and H200 ships beside the PTX, so that they skip the JIT:
// qpack-cubin: sm_90
#define ROW_THREADS 256
#define NEG_INF (-__int_as_float(0x7f800000))

// Sum of v over the block (blockDim.x == ROW_THREADS); every thread gets the total.
template <typename T>
__device__ T block_sum(T v) {
    __shared__ T partial[ROW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    __syncthreads(); // partial may still be read by a previous call
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    T total = 0;
    for (int w = 0; w < ROW_THREADS / 32; w++) total += partial[w];
    return total;
}

// Maximum of v over the block; every thread gets it.
__device__ float block_max(float v) {
    __shared__ float partial[ROW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = partial[0];
    for (int w = 1; w < ROW_THREADS / 32; w++) m = fmaxf(m, partial[w]);
    return m;
}

// embed: out[r] = table[ids[r]] for rows rows of dim values (Model.Embedding; ids are checked
// on the host).
extern "C" __global__ void embed(const float* table, const int* ids, float* out, int rows, int dim) {
    long long r = blockIdx.x;
    const float* src = table + (long long)ids[r] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = src[i];
}

// rms_norm: out[r] = weight · (x[r] · rsqrt(mean(x[r]²) + eps)), the sum of squares in double
// as rmsNorm does. out may be x. Grid: rows blocks.
extern "C" __global__ void rms_norm(const float* x, const float* weight, float* out, int dim, float eps) {
    long long r = blockIdx.x;
    const float* xr = x + r * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += ROW_THREADS) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss);
    float variance = (float)(ss / dim) + eps;
    float scale = (float)(1.0 / sqrt((double)variance));
    for (int i = threadIdx.x; i < dim; i += ROW_THREADS) out[r * dim + i] = weight[i] * (xr[i] * scale);
}

// add_bias: y[r, j] += bias[j] for y [rows, n]; one thread per element.
extern "C" __global__ void add_bias(float* y, const float* bias, long long total, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += bias[i % n];
}

// mirror_upper: the n×n matrix a (column-major) becomes the symmetric matrix of its upper
// triangle (row < column), which is what AddGram accumulates, tile by tile. A 32×32 tile of the
// lower triangle is written from its mirror through shared memory, so that both the reads and the
// writes are coalesced; blocks above the diagonal have nothing to do.
extern "C" __global__ void mirror_upper(float* a, int n) {
    __shared__ float tile[32][33];
    const int bx = blockIdx.x, by = blockIdx.y;
    if (by < bx) return;
    const int r = bx * 32 + threadIdx.x;  // read (r, c) above the diagonal
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int c = by * 32 + j;
        if (r < n && c < n) tile[j][threadIdx.x] = a[r + (long long)c * n];
    }
    __syncthreads();
    const int r2 = by * 32 + threadIdx.x;  // write (r2, c2) below it
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int c2 = bx * 32 + j;
        if (r2 < n && c2 < n && r2 > c2) a[r2 + (long long)c2 * n] = tile[threadIdx.x][j];
    }
}

// sum_upper_shards: for the columns c0 + blockIdx.y of the n×n column-major Gram matrices p0…p7
// (one per GPU, the first `shards` of them, each readable here: peer access), the upper triangle
// (row ≤ column) becomes the sum of all of them, added in shard order (((p0 + p1) + p2) + …, the
// order one GPU adding the others' copies would take), written back into every one. Each GPU runs
// it for its own band of columns, so no element is read by one GPU while another writes it.
extern "C" __global__ void sum_upper_shards(float* p0, float* p1, float* p2, float* p3, float* p4, float* p5,
                                            float* p6, float* p7, int shards, int n, int c0) {
    const int c = c0 + blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r > c || c >= n) return;
    float* p[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
    const long long i = r + (long long)c * n;
    float s = p0[i];
#pragma unroll
    for (int j = 1; j < 8; j++)
        if (j < shards) s += p[j][i];
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < shards) p[j][i] = s;
}

// add: x += y elementwise (the residual connections).
extern "C" __global__ void add(float* x, const float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// to_bf16: y = x rounded to bfloat16, to nearest even, NaN kept quiet (fp.F32ToBF16): the
// operands of the BF16 GEMMs.
extern "C" __global__ void to_bf16(const float* x, unsigned short* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int u = __float_as_uint(x[i]);
        y[i] = (u & 0x7fffffff) > 0x7f800000 ? (unsigned short)((u >> 16) | 0x40)
                                             : (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
}

// silu_mul: g = silu(g)·u elementwise (siluMul).
extern "C" __global__ void silu_mul(float* g, const float* u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = (float)((double)v / (1.0 + exp(-(double)v))) * u[i];
    }
}

// rope_heads: reads x [S, T, heads, D] (a projection's output), rotates the first half of each
// head against the second by position t (applyRope's rotate_half layout; rotate = 0 copies),
// and writes out [S, heads, T, D], the layout the batched attention GEMMs read.
// Grid: S·T·heads blocks of D/2 threads; cos, sin [T, D/2].
extern "C" __global__ void rope_heads(const float* x, float* out, const float* cos, const float* sin,
                                      int T, int heads, int D, int rotate) {
    long long b = blockIdx.x;
    int h = b % heads;
    long long st = b / heads; // s·T + t
    int t = st % T;
    long long s = st / T;
    int half = D / 2, i = threadIdx.x;
    const float* src = x + b * D;
    float* dst = out + ((s * heads + h) * T + t) * D;
    float lo = src[i], hi = src[i + half];
    if (rotate) {
        float c = cos[t * half + i], sn = sin[t * half + i];
        dst[i] = lo * c - hi * sn;
        dst[i + half] = hi * c + lo * sn;
    } else {
        dst[i] = lo;
        dst[i + half] = hi;
    }
}

// merge_heads: o [S, heads, T, D] → out [S, T, heads·D], the input of o_proj.
// Grid: S·T·heads blocks of D threads.
extern "C" __global__ void merge_heads(const float* o, float* out, int T, int heads, int D) {
    long long b = blockIdx.x; // (s·T + t)·heads + h
    int h = b % heads;
    long long st = b / heads;
    int t = st % T;
    long long s = st / T;
    out[b * D + threadIdx.x] = o[((s * heads + h) * T + t) * D + threadIdx.x];
}

// causal_softmax: each row of scores [rows, T] holds one query's (already scaled) scores
// against the T keys of its sequence; the query's position is t = row % T, and its band's keys
// (attention's products in bands of `band` queries) are [0, L), L = min(T, (t/band + 1)·band).
// Keys after t, and keys window or more tokens before it when window > 0, get probability 0;
// the rest softmax as attendOne does. Entries from L on are neither read nor written.
// Grid: rows blocks.
extern "C" __global__ void causal_softmax(float* scores, int T, int window, int band) {
    long long r = blockIdx.x;
    int t = r % T;
    int first = window > 0 ? max(0, t - window + 1) : 0;
    int L = min(T, (t / band + 1) * band);
    float* row = scores + r * T;
    float m = NEG_INF;
    for (int j = first + threadIdx.x; j <= t; j += ROW_THREADS) m = fmaxf(m, row[j]);
    m = block_max(m);
    double sum = 0;
    for (int j = first + threadIdx.x; j <= t; j += ROW_THREADS) {
        float e = (float)exp((double)(row[j] - m));
        row[j] = e;
        sum += e;
    }
    sum = block_sum(sum);
    float inv = (float)(1.0 / sum);
    for (int j = threadIdx.x; j < L; j += ROW_THREADS) {
        row[j] = (j >= first && j <= t) ? row[j] * inv : 0.0f;
    }
}

// Log-sum-exp of a row of n logits, computed by the whole block (in double, as logSoftmax).
__device__ double row_lse(const float* x, int n) {
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n; j += ROW_THREADS) m = fmaxf(m, x[j]);
    m = block_max(m);
    double sum = 0;
    for (int j = threadIdx.x; j < n; j += ROW_THREADS) sum += exp((double)x[j] - m);
    return m + log(block_sum(sum));
}

// First index of the row's maximum (argmax); every thread gets it.
__device__ int row_argmax(const float* x, int n) {
    __shared__ float bestV[ROW_THREADS];
    __shared__ int bestI[ROW_THREADS];
    float v = NEG_INF;
    int at = n;
    for (int j = threadIdx.x; j < n; j += ROW_THREADS) {
        if (x[j] > v) { v = x[j]; at = j; }
    }
    __syncthreads();
    bestV[threadIdx.x] = v;
    bestI[threadIdx.x] = at;
    __syncthreads();
    for (int s = ROW_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = bestV[threadIdx.x + s];
            int oi = bestI[threadIdx.x + s];
            if (ov > bestV[threadIdx.x] || (ov == bestV[threadIdx.x] && oi < bestI[threadIdx.x])) {
                bestV[threadIdx.x] = ov;
                bestI[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    return bestI[0];
}

// token_nll: nll[r] = log Σ exp(logits[r]) − logits[r, targets[r]] (the negative log-likelihood
// of the next token), 0 where targets[r] < 0. Grid: rows blocks.
extern "C" __global__ void token_nll(const float* logits, const int* targets, double* nll, int vocab) {
    long long r = blockIdx.x;
    const float* x = logits + r * vocab;
    double lse = row_lse(x, vocab);
    if (threadIdx.x == 0) nll[r] = targets[r] < 0 ? 0.0 : lse - x[targets[r]];
}

// token_compare: for a reference and a test model's logits of the same rows, writes per row
// {nll of ref, nll of test, KL(ref ‖ test), 1 if their argmaxes agree else 0} into out [rows, 4]
// (all 0 where targets[r] < 0), as Compare does per token. Grid: rows blocks.
extern "C" __global__ void token_compare(const float* ref, const float* test, const int* targets, double* out, int vocab) {
    long long r = blockIdx.x;
    const float* p = ref + r * vocab;
    const float* q = test + r * vocab;
    double lseP = row_lse(p, vocab), lseQ = row_lse(q, vocab);
    double kl = 0;
    for (int j = threadIdx.x; j < vocab; j += ROW_THREADS) {
        double lp = (double)p[j] - lseP, lq = (double)q[j] - lseQ;
        kl += exp(lp) * (lp - lq);
    }
    kl = block_sum(kl);
    int ap = row_argmax(p, vocab), aq = row_argmax(q, vocab);
    if (threadIdx.x == 0) {
        double* o = out + r * 4;
        if (targets[r] < 0) {
            o[0] = o[1] = o[2] = o[3] = 0;
        } else {
            o[0] = lseP - p[targets[r]];
            o[1] = lseQ - q[targets[r]];
            o[2] = fmax(kl, 0.0);
            o[3] = ap == aq ? 1 : 0;
        }
    }
}

// channel_stats_partial: for chunk c = blockIdx.y of chunk_rows rows of x [rows, cols]
// (row-major), partial_sq[c·cols + j] = Σ x[r, j]² and partial_abs[c·cols + j] = Σ |x[r, j]|
// (AddChannelStats). One thread per column, so a warp reads 32 consecutive floats of a row;
// the sums are in double, in row order, so the result does not depend on scheduling.
extern "C" __global__ void channel_stats_partial(const float* x, long long rows, int cols, int chunk_rows,
                                                 double* partial_sq, double* partial_abs) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    long long r0 = (long long)blockIdx.y * chunk_rows;
    long long r1 = min(rows, r0 + chunk_rows);
    double sq = 0, ab = 0;
    for (long long r = r0; r < r1; r++) {
        double v = x[r * cols + j];
        sq += v * v;
        ab += fabs(v);
    }
    partial_sq[(long long)blockIdx.y * cols + j] = sq;
    partial_abs[(long long)blockIdx.y * cols + j] = ab;
}

// channel_stats_finish: sq[j] += Σ_c partial_sq[c·cols + j] in chunk order, and the same for
// abs (skipped when abs is null).
extern "C" __global__ void channel_stats_finish(const double* partial_sq, const double* partial_abs, int chunks,
                                                int cols, double* sq, double* abs) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    double s = 0, a = 0;
    for (int c = 0; c < chunks; c++) {
        s += partial_sq[(long long)c * cols + j];
        a += partial_abs[(long long)c * cols + j];
    }
    sq[j] += s;
    if (abs) abs[j] += a;
}

// scale_columns: w[r, c] = w[r, c]·s[c] for w [rows, cols] (row-major), one rounded float32
// product each, as the host's w·s (AWQ's folded scales, GPU.ScaleColumns).
extern "C" __global__ void scale_columns(float* w, const float* s, long long n, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] = __fmul_rn(w[i], s[i % cols]);
}

// divide_rows: w[r, c] = w[r, c]/s[r] for w [rows, cols], one rounded float32 quotient each, as
// the host's w/s (GPU.DivideLinearRows, GPU.DivideNorm).
extern "C" __global__ void divide_rows(float* w, const float* s, long long n, int cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] = __fdiv_rn(w[i], s[i / cols]);
}

// ---- Fused causal attention (flash_attention_d64, flash_attention_d128) ----
//
// attention's products and softmax in one pass over the keys, without the T×T scores: for one
// sequence, query head and tile of FA_Q query positions (four warps of 16), the keys and values
// are read in tiles of FA_K, the scores of a tile are q·k (FP16 tensor-core products, float32
// sums) times alpha_qk·scale, and a running maximum and sum (float32) fold each tile's
// probabilities into the output, as Block.Attention's softmax and weighted sum give them in one
// piece. q, k and v are FP16 scaled by powers of two (cuda.Device.ToF16Scaled): alpha_qk undoes
// q's and k's, alpha_v v's. The probabilities enter the second product as FP16 (each ≤ 1 after
// the running maximum: FP16's 11-bit significand, TF32's). Keys after the query, and keys window
// or more tokens before it when window > 0, are left out. Layouts: q and out [S, H, T, D], k and
// v [S, KV, T, D] (query head h reads key/value head h / (H / KV)); out is float32. The key and
// value tiles sit row-major in shared memory (rows padded by 8 halves: no bank conflicts), their
// fragments read by ldmatrix (the values' transposed on load). A 7B's 4 × 2048 tokens on an
// H200, the FP16 conversions included: 0.90 ms; 1.89 ms with one synchronous load of each tile
// at a time, no ldmatrix for the keys, the query tiles in order and every tile masked (bit for
// bit the same output); the scores' path 2.4 ms. Registers are capped for three blocks of 128
// threads an SM with D = 128 (four with D = 64): a few spilled, faster than two (1.03 ms).
// Grid: (S·H, ceil(T / FA_Q)); 128 threads.
#define FA_Q 64
#define FA_K 64

// mma_16816 is C += A·B for a 16×16 FP16 A (row-major fragments a), a 16×8 FP16 B (b) and a
// 16×8 float32 C (c), one warp.
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// pack_f16 is {lo, hi} rounded to FP16 (nearest even) in one word, lo in the low half.
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// cp_async16 copies 16 bytes from global to shared memory without waiting (cp.async, sm_80 on),
// or writes 16 zero bytes where !valid (the source is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// cp_async_wait waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(n)); }

// flash_load_tile starts copying FA_K rows of D halves from src (rows k0 on, zero past T) into a
// shared tile of row stride D + 8.
template <int D>
__device__ __forceinline__ void flash_load_tile(unsigned short* dst, const unsigned short* src, int k0, int T) {
#pragma unroll
    for (int idx = threadIdx.x; idx < FA_K * D / 8; idx += 128) { // 8 halves at a time
        int key = idx / (D / 8), d = idx % (D / 8) * 8;
        bool valid = k0 + key < T;
        cp_async16(dst + key * (D + 8) + d, src + (long long)(valid ? k0 + key : 0) * D + d, valid);
    }
    cp_async_commit();
}

// flash_attention: the loads run beside the products (cp.async). Each step's values are copied
// while its scores are computed and the next step's keys while the probabilities are formed
// and multiplied by the values, so one tile of each fits under the 48 KB of static shared memory.
// The query tiles are taken last first (grid y counts down), so that the longest (the latest
// queries see the most keys) start first and the short ones fill the tail. Scores need masking
// only in tiles that reach past a query of the tile, or past T, or under a window.
template <int D>
__device__ void flash_attention(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                                const float* alpha_qk, const float* alpha_v, float scale, int T, int H, int KV,
                                int window, float* out) {
    constexpr int KS = D + 8;     // key and value tile row stride in halves: conflict-free fragment reads
    __shared__ __align__(16) unsigned short ks[FA_K * KS];
    __shared__ __align__(16) unsigned short vs[FA_K * KS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tig = lane & 3;
    const int sh = blockIdx.x, s = sh / H, h = sh % H, kvh = h / (H / KV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA_Q, r0 = q0 + warp * 16 + g; // this thread's rows: r0 and r0 + 8
    const unsigned short* qs = q + (long long)sh * T * D;
    const unsigned short* kb = k + ((long long)s * KV + kvh) * T * D;
    const unsigned short* vb = v + ((long long)s * KV + kvh) * T * D;
    const float sc = scale * *alpha_qk * 1.4426950408889634f; // scores in log2 units: exp2 below

    const int last = min(T, q0 + FA_Q) - 1; // the tile's last query
    int first_key = 0;
    if (window > 0) first_key = max(0, q0 - window + 1) / FA_K * FA_K;
    flash_load_tile<D>(ks, kb, first_key, T);

    unsigned qa[D / 16][4]; // the warp's 16 query rows as A fragments
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = r0 + (i & 1) * 8, col = kk * 16 + (i >> 1) * 8 + tig * 2;
            qa[kk][i] = row < T ? *(const unsigned*)(qs + (long long)row * D + col) : 0u;
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    for (int k0 = first_key; k0 <= last; k0 += FA_K) {
        __syncthreads(); // every warp is done with the previous step's values
        flash_load_tile<D>(vs, vb, k0, T);
        cp_async_wait<1>(); // this step's keys are in (its values may not be)
        __syncthreads();
        float sacc[FA_K / 8][4];
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
            sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk += 2) {
                // B = Kᵀ for kk and kk + 1: lanes 8j..8j+7 give the rows of matrix j (keys n·8 on, 8 columns)
                unsigned b[4];
                unsigned addr = (unsigned)__cvta_generic_to_shared(ks + (n * 8 + (lane & 7)) * KS + kk * 16 + (lane >> 3) * 8);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
                mma_16816(sacc[n], qa[kk], b[0], b[1]);
                mma_16816(sacc[n], qa[kk + 1], b[2], b[3]);
            }
        }
        __syncthreads(); // every warp has read this step's keys
        if (k0 + FA_K <= last) flash_load_tile<D>(ks, kb, k0 + FA_K, T);
        else cp_async_commit(); // an empty group: the waits count the same
        const bool masked = k0 + FA_K - 1 > q0 || k0 + FA_K > T || window > 0;
        float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + (i >> 1) * 8, key = k0 + n * 8 + tig * 2 + (i & 1);
                bool keep = !masked || (key <= row && key < T && (window <= 0 || key > row - window));
                sacc[n][i] = keep ? sacc[n][i] * sc : NEG_INF;
                tile_max[i >> 1] = fmaxf(tile_max[i >> 1], sacc[n][i]);
            }
        }
        float rescale[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            float mnew = fmaxf(m[r], tile_max[r]);
            float base = mnew == NEG_INF ? 0.f : mnew; // a row with no key yet: nothing to rescale
            rescale[r] = exp2f(m[r] - base);
            m[r] = mnew;
            tile_max[r] = base;
            l[r] *= rescale[r];
        }
        unsigned pa[FA_K / 16][4];
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
            float p0 = exp2f(sacc[n][0] - tile_max[0]), p1 = exp2f(sacc[n][1] - tile_max[0]);
            float p2 = exp2f(sacc[n][2] - tile_max[1]), p3 = exp2f(sacc[n][3] - tile_max[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            pa[n / 2][(n & 1) * 2] = pack_f16(p0, p1);
            pa[n / 2][(n & 1) * 2 + 1] = pack_f16(p2, p3);
        }
        cp_async_wait<1>(); // this step's values are in (the next keys may not be)
        __syncthreads();
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= rescale[0];
            o[n][1] *= rescale[0];
            o[n][2] *= rescale[1];
            o[n][3] *= rescale[1];
#pragma unroll
            for (int kk = 0; kk < FA_K / 16; kk += 2) {
                // B = V[keys kk·16 .. +32][d n·8 .. +8], transposed on load: lanes 0-15 give the
                // rows of kk's two matrices, lanes 16-31 those of kk + 1's
                unsigned b[4];
                unsigned addr = (unsigned)__cvta_generic_to_shared(vs + (kk * 16 + lane) * KS + n * 8);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
                mma_16816(o[n], pa[kk], b[0], b[1]);
                mma_16816(o[n], pa[kk + 1], b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = *alpha_v / l[r];
    }
    float* os = out + (long long)sh * T * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = r0 + r * 8;
            if (row < T) {
                *(float2*)(os + (long long)row * D + n * 8 + tig * 2) = make_float2(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 4) flash_attention_d64(const unsigned short* q, const unsigned short* k,
        const unsigned short* v, const float* alpha_qk, const float* alpha_v, float scale, int T, int H, int KV, int window, float* out) {
    flash_attention<64>(q, k, v, alpha_qk, alpha_v, scale, T, H, KV, window, out);
}

extern "C" __global__ void __launch_bounds__(128, 3) flash_attention_d128(const unsigned short* q, const unsigned short* k,
        const unsigned short* v, const float* alpha_qk, const float* alpha_v, float scale, int T, int H, int KV, int window, float* out) {
    flash_attention<128>(q, k, v, alpha_qk, alpha_v, scale, T, H, KV, window, out);
}
