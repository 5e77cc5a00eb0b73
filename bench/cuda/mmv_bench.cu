/* The CUDA backend's matrix products on the GPU, side by side (a development bench, not part
 * of strand; `make mmv-bench` builds it as build/mmv_bench when nvcc is there): every 27B shape at 1, 4,
 * 8, 16, 64 and 256 tokens, the tiled bf16 kernels (with the scratch: k_mmv up to 16 tokens,
 * k_gemm beyond; without: k_mma), the row-major CUDA-core kernel and a plain read of the same
 * bytes (the ceiling); GB/s of weights each (times T / 1000: TFLOP/s), whether the two tiled
 * paths give the same bits, and the time of one 27B token's matrices against the
 * copy-bandwidth floor. Built for sm_90a (the wgmma kernel's target): it runs on an H100/H200. It includes the backend's product kernels (src/backend/cuda/matmul.cu,
 * matmul_bf16.cu, matmul_q.cu, matmul_wgmma.cu; elementwise.cu for the copy and the synthetic weights), so it
 * measures the code strand runs.
 *
 *   build/mmv_bench [reps]
 *   build/mmv_bench sweep [reps] [T,T..]  k_gemm's tile shapes (and splits) beside the backend's
 *                                    path, at 32 to 2,048 tokens (or those given)
 *   build/mmv_bench q [reps]         MLX 8- and 4-bit: k_qmvp against k_qmv
 *   build/mmv_bench qi [reps]        MLX 8- and 4-bit on integer tensor cores (the activations
 *                                    as limbs) against the bf16 ones: error against `exact`,
 *                                    a token's bits alone and in a batch, GB/s; exits 1 where
 *                                    the error passes 1e-5 or the bits differ
 *   build/mmv_bench wg [reps] [T,..] [band] bf16 products on wgmma (matmul_wgmma.cu) against
 *                                    k_gemm, its clusters of 2 against single blocks, clusters
 *                                    of 2 x 2 and both in bands of `band` row blocks (16; the
 *                                    same bits) and its bf16 outputs (the fp32 ones rounded):
 *                                    agreement and TFLOP/s at 64 to 2,048 tokens (or those
 *                                    given); exits 1 where they disagree
 *   build/mmv_bench blastune [reps] [T,..] the 27B's prefill products at 2,048 and 8,192
 *                                    tokens (or those given) with each algorithm cuBLASLt's
 *                                    heuristic offers (up to 16): TFLOP/s of each against
 *                                    its first (the backend's), outputs checked; exits 1
 *                                    where one disagrees
 *   build/mmv_bench blas [reps] [T,..] products of 512 to 8,192 tokens (or those given) on
 *                                    cuBLASLt (blas.c: the tiled matrix copied out row-major
 *                                    first) against the backend's own path, with bf16
 *                                    activations and in exact (three parts, three library
 *                                    products): agreement, TFLOP/s of each, of the library's
 *                                    products alone, and the copy's GB/s; exits 1 where they
 *                                    disagree
 *   build/mmv_bench ws [reps] [T,..] bf16 products of 1 to 128 tokens on resident wgmma blocks
 *                                    (k_wgmma_stream) against the backend's other path:
 *                                    agreement and GB/s; exits 1 where they disagree
 *   build/mmv_bench qs [reps] [T,..] MLX 8- and 4-bit products of 1 to 127 tokens in bf16 on
 *                                    resident wgmma blocks (k_wgmma_qstream) against the
 *                                    backend's path without it, both against a fp64 reference
 *                                    of the stream kernel's weights: error, GB/s; exits 1 where
 *                                    the stream kernel is off
 *   build/mmv_bench gdn [reps]       the delta rule of one 27B layer (conv, norms, rule, gated
 *                                    norm) per step against chunked (gdn_chunk.cu): agreement
 *                                    of outputs and state, ms; a decode step's kernels (three,
 *                                    fused, the conv inside) for the same bits; exits 1 where
 *                                    they disagree
 *   build/mmv_bench fa [reps]        a prompt's attention in `bf16` on the 27B's heads (up to 8,192
 *                                    tokens, bf16 and fp32 pools): k_attn_fw (wgmma) against
 *                                    k_attn_fa (k_attn_fw's two forms: waiting for each chunk's
 *                                    P V, or leaving it running into the next chunk), all
 *                                    against `exact` (k_attn_tc): agreement, ms and TFLOP/s;
 *                                    exits 1 where they disagree
 *   build/mmv_bench ad [reps]        a decode step's attention split over the context (27B heads,
 *                                    bf16 pool, 1-64 items at up to 32k positions, `exact` and
 *                                    `bf16`): k_attn_ring (rings of 2 and 3 chunks) against
 *                                    k_attn_split (both with k_attn_merge), all against
 *                                    k_attn_tc bit for bit; ms and GB/s of K and V; exits 1
 *                                    where they differ
 *   build/mmv_bench top [reps]       compact logit rows (sample.cu) of 1 and 64 rows of the 27B
 *                                    vocabulary against a host reference, and their time;
 *                                    exits 1 where they differ
 *   build/mmv_bench prof R C T P     one product, for a profiler
 *   build/mmv_bench bw [reps]        ways of reading a 16 GB buffer once: GB/s of each
 *   build/mmv_bench vp [reps]        k_mmvp's ring depth and blocks an SM on the 27B decode
 *                                    launches at 1-8 tokens; exits 1 where the bits differ
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <vector>

#include "backend/cuda/cu_common.cuh"
#include "core/numeric.h"
#include "backend/cuda/mm_int.cuh"
#include "backend/cuda/elementwise.cu"
#include "backend/cuda/matmul.cu"
#include "backend/cuda/matmul_bf16.cu"
#include "backend/cuda/matmul_q.cu"
#include "backend/cuda/matmul_wgmma.cu"
#include "backend/cuda/gdn.cu"
#include "backend/cuda/gdn_chunk.cu"
#include "backend/cuda/sample.cu"
#include "backend/cuda/attention.cu"
#include "backend/cuda/attention_wgmma.cu"
#include "backend/cuda/blas.h"

#define CK(x)                                                                                            \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));           \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

/* ---- the read ceiling: every weight byte read once ---- */
__global__ void k_read(const uint4 *p, int64_t n, unsigned *sink) {
    unsigned s = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 v = ldg_stream((const uint16_t *)(p + i));
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x12345678u) *sink = s;
}

/* whether device buffers a and b hold the same n floats, bit for bit */
static bool same_bits(const float *a, const float *b, size_t n) {
    std::vector<float> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    return !memcmp(ha.data(), hb.data(), n * 4);
}

/* whether b (bf16, device) is a (fp32, device) rounded to nearest even, every one of n */
static bool rounds_to(const float *a, const uint16_t *b, size_t n) {
    std::vector<float> ha(n);
    std::vector<uint16_t> hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (st_f32_to_bf16(ha[i]) != hb[i]) return false;
    return true;
}

/* seconds a launch, over reps launches of launch(i % copies) after 3 to warm up */
/* outputs against a reference's: the largest |y - ref| and |ref| over the device buffers
 * added (n floats each), and how many of y are NaN (an output never written, where y was
 * filled with NaNs first); err() = max |y - ref| / max |ref| */
struct agreement {
    double md = 0, mr = 0;
    size_t nan = 0;
    void add(const float *y, const float *ref, size_t n) {
        std::vector<float> a(n), b(n);
        CK(cudaMemcpy(a.data(), y, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), ref, n * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) {
            if (!(a[i] == a[i])) nan++;
            const double dd = fabs((double)a[i] - b[i]);
            md = dd > md ? dd : md;
            mr = fabs((double)b[i]) > mr ? fabs((double)b[i]) : mr;
        }
    }
    double err() const { return mr > 0 ? md / mr : md; }
};

/* a bench's stream and its two timing events */
static void timing_open(cudaStream_t *s, cudaEvent_t *e0, cudaEvent_t *e1) {
    CK(cudaStreamCreate(s));
    CK(cudaEventCreate(e0));
    CK(cudaEventCreate(e1));
}

/* a bench's stream and two timing events, the backend's kernels set up (cu_mm_init) */
struct bench_env {
    cudaStream_t s;
    cudaEvent_t e0, e1;
};
static bench_env bench_env_make(void) {
    bench_env b;
    timing_open(&b.s, &b.e0, &b.e1);
    cu_mm_init();
    return b;
}

template <typename F>
static double time_launches(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int reps, int copies, F launch) {
    for (int i = 0; i < 3; i++) launch(i % copies);
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; i++) launch(i % copies);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e-3 / reps;
}

/* the most tokens of a bench's list (at least 16): what its buffers are made for */
static int64_t most_tokens(const std::vector<int64_t> &Ts) {
    int64_t tm = 16;
    for (int64_t T : Ts) tm = T > tm ? T : tm;
    return tm;
}

/* a cuBLASLt handle with its description in desc[cap] ("cuBLASLt 13.1.0"); NULL, with the
 * reason printed after the mode's name, where the library is not there */
static cu_blas *blas_open(const char *mode, char *desc, size_t cap) {
    cu_blas *bl = cu_blas_create(desc, cap);
    if (!bl) {
        printf("%s: %s\n", mode, desc);
        return NULL;
    }
    cu_blas_describe(bl, desc, cap);
    return bl;
}

/* the device's copy bandwidth (bytes read + written a second, GB/s), printed */
static double copy_bandwidth(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1) {
    const size_t cb = (size_t)2 << 30;
    float *ca, *cbuf, ms;
    CK(cudaMalloc(&ca, cb));
    CK(cudaMalloc(&cbuf, cb));
    CK(cudaMemset(ca, 1, cb));
    cu_copy(s, ca, cbuf, (int64_t)(cb / 4));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 10; i++) cu_copy(s, ca, cbuf, (int64_t)(cb / 4));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double bw = 2.0 * cb * 10 / (ms * 1e-3) / 1e9;
    printf("copy bandwidth %.0f GB/s (read + written)\n", bw);
    CK(cudaFree(ca));
    CK(cudaFree(cbuf));
    return bw;
}

/* "T,T,..": the token counts given, else def */
static std::vector<int64_t> token_list(const char *tlist, std::vector<int64_t> def) {
    if (!tlist) return def;
    std::vector<int64_t> Ts;
    for (const char *q = tlist; *q;) {
        Ts.push_back(atoll(q));
        while (*q && *q != ',') q++;
        if (*q) q++;
    }
    return Ts;
}

/* ---------------------------------------------------------------------------------------- */

struct shape {
    const char *name;
    int64_t rows, cols;
    int per_token; /* such matrices a 27B token reads */
};

/* the backend's paths: tiled with the split activations (k_mmv, up to 16 tokens), tiled
 * without (k_mma), row-major on CUDA cores, and the read ceiling */
enum { V_MMV, V_OLD, V_P1, V_P2, V_P3, V_P4, V_MMA, V_FMA, V_READ, NV };
static const char *vname[NV] = {"mmv/gemm", "k_mmv", "mmvp 1 44/43", "mmvp 2 43/33", "mmvp 2 62/62", "mmvp 4 22/22", "tiled k_mma", "row fma", "read"};

/* up to 16 tokens, on split activations: k_mmv and k_mmvp at other tiles a block (MT), ring depths
 * and residencies ("mmvp MT D1B1/D2B2": D / MINB for up to 8 tokens, then for 16) */
static void v_old(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    launch_mmv_s<MM_SPLITS>(s, g, xs, ldxs, T, parts);
}
template <int D1, int B1, int D2, int B2, int MT>
static void v_mmvp(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    if (T <= 8) {
        if (parts == 1) launch_mmvp_p<1, 1, D1, B1, MT>(s, g, xs, ldxs, T);
        else launch_mmvp_p<3, 1, D1, B1, MT>(s, g, xs, ldxs, T);
    } else {
        if (parts == 1) launch_mmvp_p<1, 2, D2, B2, MT>(s, g, xs, ldxs, T);
        else launch_mmvp_p<3, 2, D2, B2, MT>(s, g, xs, ldxs, T);
    }
}
template <int D1, int B1, int D2, int B2, int MT>
static void v_attr() {
    mmvp_attr<1, 1, D1, B1, MT>();
    mmvp_attr<3, 1, D1, B1, MT>();
    mmvp_attr<1, 2, D2, B2, MT>();
    mmvp_attr<3, 2, D2, B2, MT>();
}

/* one shape's buffers for the many-token benches: a random bf16 matrix tiled, TM tokens of
 * random activations (rand() seeded with seed), their split, two outputs */
struct tiled_case {
    size_t bytes; /* the matrix's, row-major bf16 */
    uint16_t *wd, *wt, *xs;
    float *x, *y, *yref;
};
static tiled_case tiled_case_make(cudaStream_t s, int64_t rows, int64_t cols, int64_t TM, unsigned seed) {
    tiled_case c;
    c.bytes = (size_t)rows * cols * 2;
    CK(cudaMalloc(&c.wd, c.bytes));
    CK(cudaMalloc(&c.wt, cu_tiled_elems(rows, cols) * 2));
    cu_synth_fill(s, c.wd, c.bytes / 2, CU_SYNTH_BF16, 99, 0.05f);
    cu_tile_bf16(s, c.wd, rows, cols, c.wt);
    CK(cudaMalloc(&c.x, TM * cols * 4));
    CK(cudaMalloc(&c.xs, cu_split_elems(TM, cols) * 2));
    CK(cudaMalloc(&c.y, TM * rows * 4));
    CK(cudaMalloc(&c.yref, TM * rows * 4));
    std::vector<float> hx(TM * cols);
    srand(seed);
    for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    CK(cudaMemcpy(c.x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    return c;
}
static void tiled_case_free(const tiled_case &c) {
    CK(cudaFree(c.wd));
    CK(cudaFree(c.wt));
    CK(cudaFree(c.x));
    CK(cudaFree(c.xs));
    CK(cudaFree(c.y));
    CK(cudaFree(c.yref));
}

/* ---- `mmv_bench sweep`: k_gemm's tile shapes side by side, at the token counts of batched
 * decode and prefill, each checked against the backend's own choice bit for bit ---- */
struct gemm_cfg {
    const char *name;
    void (*launch)(cu_stream, mm_group, const uint16_t *, int64_t, int64_t);
    void (*attr)(void);
    int kz; /* split over the summation classes (up to 64 tokens) */
};
static float *sweep_part; /* the split configurations' partial sums */
template <int MTW, int NT, int WR, int P, int KZ>
static void cfg_launch(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T) {
    launch_gemm_p<MTW, NT, WR, P>(s, g, xs, ldxs, T, KZ, KZ > 1 ? sweep_part : NULL);
}
#define GEMM_CFG(MTW, NT, WR, P, KZ)                                                                           \
    {#MTW "," #NT "," #WR "/" #KZ, cfg_launch<MTW, NT, WR, P, KZ>, gemm_attr<MTW, NT, WR, P>, KZ}
static const gemm_cfg cfg1[] = {GEMM_CFG(4, 4, 2, 1, 1), GEMM_CFG(1, 4, 4, 1, 1), GEMM_CFG(1, 8, 8, 1, 1),
                                GEMM_CFG(1, 8, 8, 1, 8), GEMM_CFG(1, 4, 4, 1, 8), GEMM_CFG(1, 2, 8, 1, 1),
                                GEMM_CFG(1, 2, 8, 1, 4), GEMM_CFG(1, 2, 8, 1, 8), GEMM_CFG(1, 4, 8, 1, 1),
                                GEMM_CFG(1, 4, 8, 1, 8)};
static const gemm_cfg cfg3[] = {GEMM_CFG(4, 4, 2, 3, 1), GEMM_CFG(1, 4, 4, 3, 1), GEMM_CFG(1, 8, 8, 3, 1),
                                GEMM_CFG(1, 8, 8, 3, 8), GEMM_CFG(1, 4, 4, 3, 8), GEMM_CFG(1, 2, 8, 3, 1),
                                GEMM_CFG(1, 2, 8, 3, 4), GEMM_CFG(1, 2, 8, 3, 8), GEMM_CFG(1, 4, 8, 3, 1),
                                GEMM_CFG(1, 4, 8, 3, 8)};
enum { NCFG = sizeof cfg1 / sizeof cfg1[0] };

static int sweep(int reps, const char *tlist) {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    for (int i = 0; i < NCFG; i++) cfg1[i].attr(), cfg3[i].attr();
    CK(cudaMalloc(&sweep_part, (size_t)MM_SPLITS * 64 * 34816 * 4));
    const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"gate+up", 34816, 5120}, {"down", 5120, 17408}, {"gdn in", 16512, 5120}, {"out/o", 5120, 6144}, {"attn qkv", 14336, 5120}};
    const std::vector<int64_t> Ts = token_list(tlist, {32, 64, 128, 512, 2048});
    const int64_t TM = 2048;
    printf("k_gemm tile shapes (MTW,NT,WR: rows 16*MTW*WR, tokens 8*NT*(8/WR)); GB/s of weights | TFLOP/s; * differs in a bit\n");
    printf("%-9s %5s %2s", "shape", "T", "P");
    printf(" %15s", "backend");
    for (int i = 0; i < NCFG; i++) printf(" %15s", cfg1[i].name);
    printf("\n");
    for (const auto &sh : shapes) {
        const tiled_case tc = tiled_case_make(s, sh.rows, sh.cols, TM, 11);
        const size_t bytes = tc.bytes;
        uint16_t *const wt = tc.wt, *const xs = tc.xs;
        float *const x = tc.x, *const y = tc.y, *const yref = tc.yref;
        const cu_mm_scratch sc = {xs, TM, sweep_part, (int64_t)MM_SPLITS * 64 * 34816};
        const cu_mat w = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, wt, NULL, NULL};
        for (int64_t T : Ts)
            for (int P = 1; P <= 3; P += 2) {
                printf("%-9s %5lld %2d", sh.name, (long long)T, P);
                cu_matmul(s, &w, x, sh.cols, T, yref, sh.rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
                {
                    const int mode = P == 3 ? CU_MM_EXACT : CU_MM_BF16;
                    const double sec =
                        time_launches(s, e0, e1, reps, 1, [&](int) { cu_matmul(s, &w, x, sh.cols, T, y, sh.rows, mode, &sc); });
                    printf(" %7.0f|%5.0f ", bytes / sec / 1e9, 2.0 * sh.rows * sh.cols * T / sec / 1e12);
                }
                const int64_t ldxs = tiled_steps(sh.cols) * 32;
                launch_split(s, x, sh.cols, T, sh.cols, xs, ldxs, P);
                mm_group g;
                g.n = 1, g.w[0] = w, g.y[0] = y, g.ldy[0] = sh.rows, g.blk0[0] = 0;
                for (int i = 0; i < NCFG; i++) {
                    const gemm_cfg &c = P == 3 ? cfg3[i] : cfg1[i];
                    if (c.kz > 1 && T > 64) {
                        printf(" %15s", "");
                        continue;
                    }
                    CK(cudaMemsetAsync(y, 0xff, T * sh.rows * 4, s));
                    c.launch(s, g, xs, ldxs, T);
                    CK(cudaGetLastError());
                    const bool same = same_bits(y, yref, (size_t)(T * sh.rows));
                    const double sec = time_launches(s, e0, e1, reps, 1, [&](int) { c.launch(s, g, xs, ldxs, T); });
                    printf(" %7.0f|%5.0f%s", bytes / sec / 1e9, 2.0 * sh.rows * sh.cols * T / sec / 1e12, same ? " " : "*");
                }
                printf("\n");
            }
        tiled_case_free(tc);
    }
    return 0;
}

/* ---- `mmv_bench q`: MLX 8- and 4-bit (groups of 64, bf16 scales) at 1, 4 and 16 tokens: the
 * backend's path (k_qmvp up to 16 tokens) against k_qmv, bit for bit, GB/s of the bytes read
 * (values, scales, biases), over a gigabyte of copies so that L2 holds none ---- */
/* one MLX shape's buffers for the q benches: copies of a random Q tiled matrix (bf16 scales
 * and biases, groups of `group`) filling 1 GB, so that the timed launches read from memory;
 * TM tokens of random activations (rand() seeded with 5), their split, two outputs */
struct q_case {
    std::vector<cu_mat> ws;
    size_t bytes; /* one copy's values, scales and biases */
    float *x, *y, *yref;
    uint16_t *xs;
};
static q_case q_case_make(cudaStream_t s, int64_t rows, int64_t cols, int bits, int group, int64_t TM) {
    q_case qc;
    const size_t vb = cu_qtiled_bytes(rows, cols, bits), gn = cu_qtiled_groups(rows, cols, group);
    qc.bytes = vb + 2 * gn * 2;
    const int copies = (int)((((size_t)1 << 30) + qc.bytes - 1) / qc.bytes);
    qc.ws.resize(copies);
    for (int c = 0; c < copies; c++) {
        void *d, *sc_, *bs;
        CK(cudaMalloc(&d, vb));
        CK(cudaMalloc(&sc_, gn * 2));
        CK(cudaMalloc(&bs, gn * 2));
        cu_synth_fill(s, d, vb / 4, CU_SYNTH_WORDS, 77 + c, 0.0f);
        cu_synth_fill(s, sc_, gn, CU_SYNTH_BF16, 500 + c, 0.01f);
        cu_synth_fill(s, bs, gn, CU_SYNTH_BF16, 900 + c, 0.01f);
        qc.ws[c] = {CU_FMT_Q_TILED, 2, bits, group, rows, cols, d, sc_, bs};
    }
    CK(cudaMalloc(&qc.x, TM * cols * 4));
    CK(cudaMalloc(&qc.xs, cu_split_elems(TM, cols) * 2));
    CK(cudaMalloc(&qc.y, TM * rows * 4));
    CK(cudaMalloc(&qc.yref, TM * rows * 4));
    std::vector<float> hx(TM * cols);
    srand(5);
    for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    CK(cudaMemcpy(qc.x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    return qc;
}
static void q_case_free(q_case &qc) {
    for (auto &w : qc.ws) {
        CK(cudaFree((void *)w.data));
        CK(cudaFree((void *)w.scales));
        CK(cudaFree((void *)w.biases));
    }
    CK(cudaFree(qc.x));
    CK(cudaFree(qc.xs));
    CK(cudaFree(qc.y));
    CK(cudaFree(qc.yref));
}

static int qbench(int reps) {
    const bench_env env = bench_env_make();
    cudaStream_t s = env.s;
    cudaEvent_t e0 = env.e0, e1 = env.e1;
    const struct { const char *name; int64_t rows, cols; int per_token; } shapes[] = {
        {"mlp gate/up", 17408, 5120, 128}, {"mlp down", 5120, 17408, 64}, {"gdn qkv", 10240, 5120, 48},
        {"gdn z", 6144, 5120, 48}, {"gdn out, attn o", 5120, 6144, 64}, {"attn q+gate", 12288, 5120, 16}};
    const int64_t Ts[] = {1, 4, 16};
    const int group = 64;
    printf("MLX affine, groups of %d: GB/s of the bytes read; * the two differ in a bit (then: how far)\n", group);
    printf("%-15s %4s %3s %2s %10s %10s\n", "shape", "bits", "T", "P", "k_qmvp", "k_qmv");
    double tot[2][2][3][2] = {{{{0}}}}; /* [bits 8, 4][P 1, 3][T][kernel] */
    for (int bi = 0; bi < 2; bi++) {
        const int bits = bi ? 4 : 8;
        for (const auto &sh : shapes) {
            const int64_t TM = 16;
            q_case qc = q_case_make(s, sh.rows, sh.cols, bits, group, TM);
            const std::vector<cu_mat> &ws = qc.ws;
            const size_t bytes = qc.bytes;
            const int copies = (int)ws.size();
            float *x = qc.x, *y = qc.y, *yref = qc.yref;
            uint16_t *xs = qc.xs;
            const cu_mm_scratch sc = {xs, TM, NULL, 0};
            const int64_t ldxs = tiled_steps(sh.cols) * 32;
            for (int ti = 0; ti < 3; ti++)
                for (int P = 1; P <= 3; P += 2) {
                    const int64_t T = Ts[ti];
                    double sec[2];
                    bool same = true;
                    agreement ag; /* how far k_qmvp is from k_qmv where their bits differ (a trial form) */
                    for (int k = 0; k < 2; k++) {
                        auto launch = [&](int c) {
                            if (k == 0) {
                                cu_matmul(s, &ws[c], x, sh.cols, T, y, sh.rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
                                return;
                            }
                            mm_group g;
                            g.n = 1, g.w[0] = ws[c], g.y[0] = y, g.ldy[0] = sh.rows, g.blk0[0] = 0;
                            launch_split(s, x, sh.cols, T, sh.cols, xs, ldxs, P);
                            const int64_t nblk = group_blocks(&g, 1);
                            if (P == 1 && T <= 8) (bits == 8 ? launch_qmv_b<1, 1, 8> : launch_qmv_b<1, 1, 4>)(s, g, nblk, xs, ldxs, T);
                            else if (P == 1) (bits == 8 ? launch_qmv_b<1, 2, 8> : launch_qmv_b<1, 2, 4>)(s, g, nblk, xs, ldxs, T);
                            else if (T <= 2) (bits == 8 ? launch_qmv_b<3, 1, 8> : launch_qmv_b<3, 1, 4>)(s, g, nblk, xs, ldxs, T);
                            else if (T <= 8) (bits == 8 ? launch_qmv_b<3, 3, 8> : launch_qmv_b<3, 3, 4>)(s, g, nblk, xs, ldxs, T);
                            else (bits == 8 ? launch_qmv_b<3, 6, 8> : launch_qmv_b<3, 6, 4>)(s, g, nblk, xs, ldxs, T);
                        };
                        CK(cudaMemsetAsync(y, 0xff, TM * sh.rows * 4, s));
                        launch(0);
                        CK(cudaGetLastError());
                        if (k == 0) CK(cudaMemcpyAsync(yref, y, T * sh.rows * 4, cudaMemcpyDeviceToDevice, s));
                        else if (!(same = same_bits(y, yref, (size_t)(T * sh.rows)))) ag.add(yref, y, (size_t)(T * sh.rows));
                        sec[k] = time_launches(s, e0, e1, reps, copies, launch);
                        tot[bi][P / 2][ti][k] += sec[k] * sh.per_token;
                    }
                    printf("%-15s %4d %3lld %2d %10.0f %10.0f", sh.name, bits, (long long)T, P, bytes / sec[0] / 1e9,
                           bytes / sec[1] / 1e9);
                    if (same) printf("\n");
                    else printf(" * %.2e of the largest%s\n", ag.err(), ag.nan ? " (NaN)" : "");
                }
            q_case_free(qc);
        }
    }
    printf("\none 27B token's matrices (these shapes), summed: ms, k_qmvp | k_qmv\n");
    for (int bi = 0; bi < 2; bi++)
        for (int pi = 0; pi < 2; pi++) {
            printf("%d-bit P=%d", bi ? 4 : 8, pi ? 3 : 1);
            for (int ti = 0; ti < 3; ti++)
                printf("  T=%-2lld %6.2f | %6.2f", (long long)Ts[ti], tot[bi][pi][ti][0] * 1e3, tot[bi][pi][ti][1] * 1e3);
            printf("\n");
        }
    return 0;
}

/* ---- `mmv_bench qi [REPS]`: MLX products on integer tensor cores (the activations as
 * limbs: matmul_q.cu's IM form) against the bf16 ones: each output against `exact`'s
 * (three bf16 parts: fp32-grade), the IM form within 2e-6 of the largest (a correct one is
 * about 2e-7 off on these values; a wrong limb, even the lowest, 2e-5 or more) beside the bf16
 * form's own error; every token's bits the same as that token's alone, at 1, 4, 12, 16 and 40
 * tokens (the last in slices of 16, as `exact` takes it; `bf16` takes it for 16 or fewer);
 * GB/s of the bytes read of each ---- */
/* the T tokens' bytes of two limb buffers (device, qb bytes) of `cols` columns agree: their
 * limbs and each group's (d, d sum X) */
static bool qi_same_limbs(const uint8_t *qa, const uint8_t *qc, size_t qb, int64_t cols, int group, int64_t T) {
    std::vector<uint8_t> ha(qb), hc(qb);
    CK(cudaMemcpy(ha.data(), qa, qb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), qc, qb, cudaMemcpyDeviceToHost));
    const int64_t nsteps = tiled_steps(cols), ng = cols / group;
    if (memcmp(ha.data(), hc.data(), (size_t)(T * nsteps * 96))) return false;
    const float *da = (const float *)(ha.data() + QI_TP * nsteps * 96), *dc = (const float *)(hc.data() + QI_TP * nsteps * 96);
    for (int64_t gj = 0; gj < ng; gj++)
        if (memcmp(da + gj * QI_TP * 2, dc + gj * QI_TP * 2, (size_t)T * 8)) return false;
    return true;
}

/* the norm's and SwiGLU's limbs (cu_add_norm, cu_silu_mul with xq) against k_qlimbs's of
 * their outputs, byte for byte over the T tokens' limbs and (d, d sum X), and SwiGLU's
 * values against the plain kernel's: the failures */
static int qi_producers(cudaStream_t s) {
    const int64_t d = 5120, n = 17408, TM = 16;
    const size_t qb = cu_qint_bytes(n);
    float *x, *out, *w, *xn, *g, *g2, *u;
    uint8_t *qa, *qc;
    CK(cudaMalloc(&x, TM * d * 4));
    CK(cudaMalloc(&out, TM * d * 4));
    CK(cudaMalloc(&w, d * 4));
    CK(cudaMalloc(&xn, TM * d * 4));
    CK(cudaMalloc(&g, TM * n * 4));
    CK(cudaMalloc(&g2, TM * n * 4));
    CK(cudaMalloc(&u, TM * n * 4));
    CK(cudaMalloc(&qa, qb));
    CK(cudaMalloc(&qc, qb));
    int bad = 0;
    srand(17);
    auto fill = [&](float *p, int64_t cnt, float a) { /* a * uniform[-1, 1) */
        std::vector<float> h((size_t)cnt);
        for (auto &v : h) v = a * ((float)rand() / RAND_MAX * 2.0f - 1.0f);
        CK(cudaMemcpy(p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    };
    auto same_limbs = [&](int64_t cols, int group, int64_t T) { return qi_same_limbs(qa, qc, qb, cols, group, T); };
    const int64_t Ts[] = {1, 7, 16};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int group = 32; group <= 128; group *= 2)
            for (int64_t T : Ts) {
                fill(x, TM * d, 1.0f);
                fill(out, TM * d, 1.0f);
                fill(w, d, 1.0f);
                fill(g, TM * n, 4.0f);
                fill(u, TM * n, 1.0f);
                CK(cudaMemcpyAsync(g2, g, TM * n * 4, cudaMemcpyDeviceToDevice, s));
                CK(cudaMemsetAsync(qa, 0, qb, s));
                CK(cudaMemsetAsync(qc, 0, qb, s));
                const int made = cu_add_norm(s, x, out, w, xn, T, d, 1e-6f, 1, 1, NULL, 0, qa, group, bits);
                launch_pdl(k_qlimbs, dim3((unsigned)((QI_TP * (d / group) + 7) / 8)), dim3(256), 0, s, (const float *)xn, d, T,
                           d, group, bits, qc);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                const bool ok_n = made && same_limbs(d, group, T);
                CK(cudaMemsetAsync(qa, 0, qb, s));
                CK(cudaMemsetAsync(qc, 0, qb, s));
                const int made_s = cu_silu_mul(s, g, u, T, n, n, NULL, 0, qa, group, bits);
                cu_silu_mul(s, g2, u, T, n, n, NULL, 0, NULL, 0, 0);
                launch_pdl(k_qlimbs, dim3((unsigned)((QI_TP * (n / group) + 7) / 8)), dim3(256), 0, s, (const float *)g2, n, T,
                           n, group, bits, qc);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                const bool ok_s = made_s && same_bits(g, g2, (size_t)(T * n)) && same_limbs(n, group, T);
                bad += !ok_n + !ok_s;
                printf("limbs made by the norm / SwiGLU, %d-bit, groups of %3d, %2lld tokens: %s / %s\n", bits, group,
                       (long long)T, ok_n ? "same" : made ? "DIFF  FAIL" : "not made  FAIL",
                       ok_s ? "same" : made_s ? "DIFF  FAIL" : "not made  FAIL");
            }
    for (void *p : {(void *)x, (void *)out, (void *)w, (void *)xn, (void *)g, (void *)g2, (void *)u, (void *)qa, (void *)qc})
        CK(cudaFree(p));
    return bad;
}

static int qibench(int reps) {
    const bench_env env = bench_env_make();
    cudaStream_t s = env.s;
    cudaEvent_t e0 = env.e0, e1 = env.e1;
    const struct { const char *name; int64_t rows, cols; int per_token, group; } shapes[] = {
        {"mlp gate/up", 17408, 5120, 128, 64}, {"mlp down", 5120, 17408, 64, 64}, {"gdn qkv", 10240, 5120, 48, 64},
        {"gdn z", 6144, 5120, 48, 64},         {"gdn out, attn o", 5120, 6144, 64, 64}, {"attn q+gate", 12288, 5120, 16, 64},
        {"g32", 4096, 2048, 0, 32},            {"g128", 4096, 2048, 0, 128}};
    const int64_t Ts[] = {1, 4, 12, 16, 40};
    constexpr int NT = sizeof Ts / sizeof Ts[0];
    const int64_t TM = 40;
    int bad = qi_producers(s);
    printf("MLX affine on integer tensor cores (IM) against bf16 ones: GB/s of the bytes read; err = max |y - exact|\n"
           "/ max |exact| (IM bound 2e-6); 'bits' = every token's outputs the same bits as that token's alone\n");
    printf("%-15s %4s %5s %3s %10s %10s %10s %10s %10s %5s\n", "shape", "bits", "group", "T", "exact", "bf16", "IM",
           "err bf16", "err IM", "bits");
    double tot[2][NT][3] = {{{0}}}; /* [bits 8, 4][T][exact, bf16, IM] */
    for (int bi = 0; bi < 2; bi++) {
        const int bits = bi ? 4 : 8;
        for (const auto &sh : shapes) {
            q_case qc = q_case_make(s, sh.rows, sh.cols, bits, sh.group, TM);
            const size_t bytes = qc.bytes;
            const int copies = (int)qc.ws.size();
            uint8_t *xq;
            CK(cudaMalloc(&xq, cu_qint_bytes(sh.cols)));
            cu_mm_scratch sc = {qc.xs, 16, NULL, 0}; /* the backend's: slices of 16 tokens */
            cu_mm_scratch sq = sc;
            sq.xq = xq;
            float *yalone;
            CK(cudaMalloc(&yalone, TM * sh.rows * 4));
            auto run = [&](int k, int c, int64_t T, float *y, int64_t t0) {
                const float *x = qc.x + t0 * sh.cols;
                if (k == 2) cu_matmul(s, &qc.ws[c], x, sh.cols, T, y, sh.rows, CU_MM_EXACT, &sq); /* any T */
                else cu_matmul(s, &qc.ws[c], x, sh.cols, T, y, sh.rows, k == 0 ? CU_MM_EXACT : CU_MM_BF16, &sc);
            };
            /* each token alone on IM */
            for (int64_t t = 0; t < TM; t++) run(2, 0, 1, yalone + t * sh.rows, t);
            for (int ti = 0; ti < NT; ti++) {
                const int64_t T = Ts[ti];
                const size_t ne = (size_t)(T * sh.rows);
                std::vector<float> ye(ne), yv(ne);
                run(0, 0, T, qc.yref, 0);
                CK(cudaMemcpy(ye.data(), qc.yref, ne * 4, cudaMemcpyDeviceToHost));
                double mr = 0;
                for (float v : ye) mr = fabs((double)v) > mr ? fabs((double)v) : mr;
                double err[3] = {0, 0, 0};
                bool same = true;
                for (int k = 1; k <= 2; k++) {
                    CK(cudaMemsetAsync(qc.y, 0xff, ne * 4, s)); /* NaN: an output never written stays one */
                    run(k, 0, T, qc.y, 0);
                    CK(cudaStreamSynchronize(s));
                    CK(cudaGetLastError());
                    CK(cudaMemcpy(yv.data(), qc.y, ne * 4, cudaMemcpyDeviceToHost));
                    double md = 0;
                    for (size_t e = 0; e < ne; e++) {
                        const double dd = fabs((double)yv[e] - ye[e]);
                        if (!(dd <= md)) md = dd; /* NaN sticks */
                    }
                    err[k] = mr > 0 ? md / mr : md;
                    if (k == 2) same = same_bits(qc.y, yalone, ne);
                }
                const bool ok = err[2] <= 2e-6 && same;
                bad += !ok;
                double sec[3];
                for (int k = 0; k < 3; k++) {
                    sec[k] = time_launches(s, e0, e1, reps, copies, [&](int c) { run(k, c, T, qc.y, 0); });
                    tot[bi][ti][k] += sec[k] * sh.per_token;
                }
                printf("%-15s %4d %5d %3lld %10.0f %10.0f %10.0f %10.2e %10.2e %5s%s\n", sh.name, bits, sh.group, (long long)T,
                       bytes / sec[0] / 1e9, bytes / sec[1] / 1e9, bytes / sec[2] / 1e9, err[1], err[2], same ? "same" : "DIFF",
                       ok ? "" : "  FAIL");
            }
            CK(cudaFree(yalone));
            CK(cudaFree(xq));
            q_case_free(qc);
        }
    }
    printf("\none 27B token's matrices (these shapes, groups of 64), summed: ms, exact | bf16 | IM\n");
    for (int bi = 0; bi < 2; bi++) {
        printf("%d-bit", bi ? 4 : 8);
        for (int ti = 0; ti < NT; ti++)
            printf("  T=%-2lld %6.2f | %6.2f | %6.2f", (long long)Ts[ti], tot[bi][ti][0] * 1e3, tot[bi][ti][1] * 1e3,
                   tot[bi][ti][2] * 1e3);
        printf("\n");
    }
    printf("qi: %s\n", bad ? "FAILED" : "all products within the bound, token bits the same");
    return bad ? 1 : 0;
}

/* ---- `mmv_bench qv [REPS]`: k_qmvp at one token (groups of 64) over its ring depth D,
 * blocks an SM (B) and tiles a block (MT), on the 27B's longest and widest shapes; GB/s of
 * the bytes read, and whether each variant gives the backend's bits ---- */
template <int BITS>
struct qv_case {
    const char *name;
    void (*launch)(cu_stream, mm_group, const uint16_t *, int64_t, int64_t);
    void (*attr)(void);
};
#define QV(B, P, D, MINB, MT)                                                                                           \
    {"P" #P " D" #D " B" #MINB " MT" #MT, launch_qmvp_v<P, 1, B, 2, D, MINB, MT>, qmvp_attr_v<P, 1, B, 2, D, MINB, MT>}
static const qv_case<4> qv4[] = {QV(4, 1, 6, 3, 2), QV(4, 1, 8, 3, 1),  QV(4, 1, 10, 3, 1), QV(4, 1, 8, 2, 2),
                                 QV(4, 1, 10, 2, 2), QV(4, 1, 3, 3, 4), QV(4, 1, 4, 2, 4),  QV(4, 1, 5, 2, 4),
                                 QV(4, 3, 6, 3, 2), QV(4, 3, 10, 3, 1), QV(4, 3, 4, 2, 4)};
static const qv_case<8> qv8[] = {QV(8, 1, 3, 3, 2), QV(8, 1, 6, 3, 1), QV(8, 1, 4, 2, 2), QV(8, 1, 5, 2, 2),
                                 QV(8, 1, 8, 2, 1), QV(8, 1, 3, 1, 4), QV(8, 1, 5, 1, 4), QV(8, 3, 3, 3, 2),
                                 QV(8, 3, 6, 3, 1)};
#undef QV
template <int BITS, size_t N>
static void qv_run(const qv_case<BITS> (&cases)[N], cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int reps) {
    const struct { const char *name; int64_t rows, cols; } shapes[] = {{"mlp gate+up", 34816, 5120}, {"mlp down", 5120, 17408},
                                                                        {"gdn qkv+z", 16384, 5120},  {"gdn out", 5120, 6144},
                                                                        {"attn q+g+k+v", 14336, 5120}};
    const int group = 64;
    for (const auto &c : cases) c.attr();
    for (const auto &sh : shapes) {
        q_case qc = q_case_make(s, sh.rows, sh.cols, BITS, group, 1);
        const std::vector<cu_mat> &ws = qc.ws;
        const size_t bytes = qc.bytes;
        const int copies = (int)ws.size();
        float *x = qc.x, *y = qc.y, *yref = qc.yref;
        uint16_t *xs = qc.xs;
        const int64_t ldxs = tiled_steps(sh.cols) * 32;
        for (int P = 1; P <= 3; P += 2) {
            const cu_mm_scratch sc = {xs, 1, NULL, 0};
            cu_matmul(s, &ws[0], x, sh.cols, 1, yref, sh.rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
            const double sref = time_launches(s, e0, e1, reps, copies, [&](int c) {
                cu_matmul(s, &ws[c], x, sh.cols, 1, y, sh.rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
            });
            printf("%d-bit %-12s P%d  backend %6.0f GB/s\n", BITS, sh.name, P, bytes / sref / 1e9);
            launch_split(s, x, sh.cols, 1, sh.cols, xs, ldxs, P);
            for (const auto &c : cases) {
                if ((c.name[1] - '0') != P) continue;
                mm_group g;
                g.n = 1, g.w[0] = ws[0], g.y[0] = y, g.ldy[0] = sh.rows, g.blk0[0] = 0;
                CK(cudaMemsetAsync(y, 0xff, sh.rows * 4, s));
                c.launch(s, g, xs, ldxs, 1);
                CK(cudaGetLastError());
                const bool same = same_bits(y, yref, (size_t)sh.rows);
                const double sec = time_launches(s, e0, e1, reps, copies, [&](int k) {
                    mm_group gk = g;
                    gk.w[0] = ws[k];
                    c.launch(s, gk, xs, ldxs, 1);
                });
                printf("    %-18s %6.0f GB/s%s\n", c.name, bytes / sec / 1e9, same ? "" : "  (other bits)");
            }
        }
        q_case_free(qc);
    }
}
static int qvbench(int reps) {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    qv_run(qv4, s, e0, e1, reps);
    qv_run(qv8, s, e0, e1, reps);
    return 0;
}

/* ---- `mmv_bench prof ROWS COLS T P`: the backend's product of one shape, 3 times (for a
 * profiler: ncu --kernel-name regex:k_gemm build/mmv_bench prof 34816 5120 64 1) ---- */
static int prof(int64_t rows, int64_t cols, int64_t T, int P) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cu_mm_init();
    uint16_t *wd, *wt, *xs;
    float *x, *y, *part;
    CK(cudaMalloc(&wd, (size_t)rows * cols * 2));
    CK(cudaMalloc(&wt, cu_tiled_elems(rows, cols) * 2));
    cu_synth_fill(s, wd, (size_t)rows * cols, CU_SYNTH_BF16, 3, 0.05f);
    cu_tile_bf16(s, wd, rows, cols, wt);
    CK(cudaMalloc(&x, T * cols * 4));
    CK(cudaMemset(x, 0, T * cols * 4));
    CK(cudaMalloc(&xs, cu_split_elems(T, cols) * 2));
    CK(cudaMalloc(&y, T * rows * 4));
    CK(cudaMalloc(&part, cu_mm_part_elems(T, rows) * 4));
    /* as the backend runs it: in `bf16`, wgmma where the device has it */
    cu_mm_scratch sc = {xs, T < 16 ? 16 : T, part, (int64_t)cu_mm_part_elems(T, rows), P == 1 ? cu_wgmma_available() : NULL};
    float *wpart;
    int32_t *wcount;
    CK(cudaMalloc(&wpart, cu_ws_part_elems() * 4));
    CK(cudaMalloc(&wcount, cu_ws_counts(rows) * 4));
    CK(cudaMemset(wcount, 0, cu_ws_counts(rows) * 4));
    sc.wpart = wpart, sc.wpart_elems = (int64_t)cu_ws_part_elems(), sc.wcount = wcount, sc.wcount_n = cu_ws_counts(rows);
    const cu_mat w = {CU_FMT_BF16_TILED, 0, 0, 0, rows, cols, wt, NULL, NULL};
    for (int i = 0; i < 3; i++) cu_matmul(s, &w, x, cols, T, y, rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
    CK(cudaStreamSynchronize(s));
    printf("prof %lld x %lld, %lld tokens, %d parts: done\n", (long long)rows, (long long)cols, (long long)T, P);
    return 0;
}

/* ---- `mmv_bench qprof ROWS COLS T P BITS`: the backend's MLX product (groups of 64) of one
 * shape, over each of its 1 GiB of copies once, 3 rounds (for a profiler: ncu --kernel-name
 * regex:k_qmv --launch-skip 12 --launch-count 2 build/mmv_bench qprof 34816 5120 1 1 4; that
 * shape has 11 copies at 4 bits and 6 at 8, so 3 rounds launch 33 or 18 products: skip fewer) ---- */
static int qprof(int64_t rows, int64_t cols, int64_t T, int P, int bits) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cu_mm_init();
    q_case qc = q_case_make(s, rows, cols, bits, 64, T < 16 ? 16 : T);
    const cu_mm_scratch sc = {qc.xs, T < 16 ? 16 : T, NULL, 0};
    for (int r = 0; r < 3; r++)
        for (const auto &w : qc.ws) cu_matmul(s, &w, qc.x, cols, T, qc.y, rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
    CK(cudaStreamSynchronize(s));
    printf("qprof %lld x %lld, %d-bit, %lld tokens, %d parts: %d launches a round\n", (long long)rows, (long long)cols, bits,
           (long long)T, P, (int)qc.ws.size());
    q_case_free(qc);
    return 0;
}

/* ---- `mmv_bench wg [reps] [T,...] [band]`: bf16 products of many tokens on wgmma
 * (matmul_wgmma.cu) against k_gemm, on the same bf16 activations: the largest difference relative to the
 * largest output (the summation orders differ, so fp32 rounding apart: at most 4e-9 times the
 * columns passes), every output written, and TFLOP/s of each; k_wgmma on clusters of 2 (the
 * backend's, the activations multicast), of 1 and of 4 (both operands multicast), and of 2
 * and 4 in bands of `band` row blocks (wg_place), with the activations in 128-byte rows on
 * clusters of 2 and on 4 in bands, and the default and the last on resident clusters
 * (CU_WG_PERSIST's form), whose outputs must be the same bits, and its bf16 outputs, which
 * must be those rounded ---- */
static int wgbench(int reps, const char *tlist, int group) {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    void *enc = cu_wgmma_available();
    if (!enc) {
        printf("wgmma: this device does not run the sm_90a kernel\n");
        return 1;
    }
    const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"gate+up", 34816, 5120}, {"down", 5120, 17408}, {"gdn in", 16512, 5120}, {"out/o", 5120, 6144},
        {"attn qkv", 14336, 5120}, {"odd rows", 1000, 384}};
    const std::vector<int64_t> Ts = token_list(tlist, {64, 128, 256, 512, 1024, 2048});
    const int64_t TM = most_tokens(Ts);
    int bad = 0;
    printf("bf16 products on wgmma against k_gemm: TFLOP/s; err = max |wgmma - k_gemm| / max |k_gemm|\n");
    const int res2 = cu_wgmma_clusters(2), res4 = cu_wgmma_clusters(4), resb = cu_wgmma_clusters(0);
    printf("\"wgmma\": the backend's (clusters of %d, %d-byte activation rows, %d resident: 0 a cluster a tile;\n"
           "\"wg bf16\": the same with bf16 outputs, the MLP's gate and up);\n"
           "\"x64\", \"x128\": clusters of 2 with 64- and 128-byte rows\n", CU_WG_CL, CU_WG_XW ? 128 : 64, resb);
    printf("bands of %d row blocks (\"band 2\", \"band 4\": clusters of 2 and 4 so); \"x128\": the activations\n"
           "in 128-byte rows, clusters of 2 (\"x128 b2\": in bands; \"x128 b4\": of 4, in bands); \"res 2\",\n"
           "\"x128 b4 r\": those on resident clusters (%d of 2, %d of 4), each taking every G-th output tile\n",
           group, res2, res4);
    printf("%-9s %6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "T", "k_gemm", "wgmma", "wg bf16", "cluster 1",
           "cluster 4", "band 2", "band 4", "x64", "x128", "x128 b2", "x128 b4", "res 2", "x128 b4 r", "err");
    for (const auto &sh : shapes) {
        const tiled_case tc = tiled_case_make(s, sh.rows, sh.cols, TM, 13);
        uint16_t *const wt = tc.wt, *const xs = tc.xs;
        float *const x = tc.x, *const y = tc.y, *const yref = tc.yref;
        const cu_mm_scratch sc = {xs, TM, NULL, 0};
        const cu_mat w = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, wt, NULL, NULL};
        const int64_t ldxs = tiled_steps(sh.cols) * 32;
        mm_group g;
        g.n = 1, g.w[0] = w, g.y[0] = yref, g.ldy[0] = sh.rows, g.blk0[0] = 0;
        /* the variants of k_wgmma beside the backend's (clusters of CU_WG_CL), each checked for
         * the same bits: clusters of 1 and 4, both in bands, the 128-byte activation rows, on
         * resident clusters */
        struct wg_variant {
            int cl, group, xw, clusters;
            float *y;
        } vs[] = {{1, 0, 0, 0, NULL},     {4, 0, 0, 0, NULL},     {2, group, 0, 0, NULL},    {4, group, 0, 0, NULL},
                  {2, 0, 0, 0, NULL},     {2, 0, 1, 0, NULL},     {2, group, 1, 0, NULL},    {4, group, 1, 0, NULL},
                  {2, 0, 0, res2 ? res2 : -1, NULL}, {4, group, 1, res4 ? res4 : -1, NULL}}; /* (-1: the query failed) */
        for (auto &v : vs) CK(cudaMalloc(&v.y, (size_t)TM * sh.rows * 4));
        uint16_t *yb;
        CK(cudaMalloc(&yb, (size_t)TM * sh.rows * 2));
        for (int64_t T : Ts) {
            const size_t n = (size_t)(T * sh.rows);
            launch_split(s, x, sh.cols, T, sh.cols, xs, ldxs, 1);
            launch_gemm_shape<1>(s, g, xs, ldxs, T, &sc);
            CK(cudaMemsetAsync(y, 0xff, n * 4, s)); /* NaN: an output never written stays one */
            bool refused = cu_wgmma_matmul(s, enc, &w, xs, ldxs, T, y, sh.rows, resb) != 0 ||
                           cu_wgmma_matmul_bf16(s, enc, &w, xs, ldxs, T, yb, sh.rows, resb) != 0;
            for (auto &v : vs) {
                CK(cudaMemsetAsync(v.y, 0xff, n * 4, s));
                refused |= v.clusters < 0 ||
                           wg_matmul_cl(s, enc, &w, xs, ldxs, T, v.y, sh.rows, v.cl, 0, v.group, v.xw, v.clusters) != 0;
            }
            if (refused) {
                printf("%-9s %6lld refused\n", sh.name, (long long)T);
                bad++;
                continue;
            }
            CK(cudaStreamSynchronize(s));
            bool same = true;
            for (const auto &v : vs) same = same && same_bits(y, v.y, n);
            const bool rounded = rounds_to(y, yb, n); /* the bf16 outputs' form */
            agreement ag;
            ag.add(y, yref, n);
            const size_t nan = ag.nan;
            const double err = ag.err();
            /* two fp32 summation orders over `cols` products each: their rounding drifts apart
             * with the sum's length (measured on the H200: 6e-6 of the largest output at 5,120
             * columns, 2e-5 at 17,408); a wrong tile or index is of the order of the output */
            const double bound = 4e-9 * (double)sh.cols;
            const bool ok = nan == 0 && err <= bound && same && rounded;
            bad += !ok;
            const double fl = 2.0 * sh.rows * sh.cols * T;
            const double t_ref = time_launches(s, e0, e1, reps, 1, [&](int) { launch_gemm_shape<1>(s, g, xs, ldxs, T, &sc); });
            const double t_wg = time_launches(s, e0, e1, reps, 1, [&](int) { cu_wgmma_matmul(s, enc, &w, xs, ldxs, T, y, sh.rows, resb); });
            const double t_wb = time_launches(s, e0, e1, reps, 1, [&](int) { cu_wgmma_matmul_bf16(s, enc, &w, xs, ldxs, T, yb, sh.rows, resb); });
            printf("%-9s %6lld %9.1f %9.1f %9.1f", sh.name, (long long)T, fl / t_ref / 1e12, fl / t_wg / 1e12, fl / t_wb / 1e12);
            for (const auto &v : vs) {
                const double t = time_launches(s, e0, e1, reps, 1, [&](int) {
                    wg_matmul_cl(s, enc, &w, xs, ldxs, T, v.y, sh.rows, v.cl, 0, v.group, v.xw, v.clusters);
                });
                printf(" %9.1f", fl / t / 1e12);
            }
            printf(" %9.2e%s", err, ok ? "\n" : "  FAIL");
            if (nan) printf(" (%zu outputs not written)", nan);
            if (!same) printf(" (clusters of 1, 2 and 4, the bands, x128 or resident clusters differ)");
            if (!rounded) printf(" (the bf16 outputs are not the fp32 ones rounded)");
            if (!ok) printf("\n");
        }
        for (auto &v : vs) CK(cudaFree(v.y));
        CK(cudaFree(yb));
        tiled_case_free(tc);
    }
    printf("wgmma: %s\n", bad ? "FAILED" : "all products agree");
    return bad ? 1 : 0;
}

/* ---- `mmv_bench blastune [reps] [tokens]`: the library's other algorithms for the prefill
 * products (the 27B's matrices, bf16 activations, the backend's row-major copy's strides):
 * each of the first CU_BLAS_TRY its heuristic offers, timed, against the first (the one the
 * backend takes); every one checked against the first's outputs (two fp32 orders of the same
 * exact products: within 4e-9 times the columns of the largest, as `mmv_bench blas`) ---- */
static int blastune(int reps, const char *tlist) {
    const bench_env env = bench_env_make();
    cudaStream_t s = env.s;
    cudaEvent_t e0 = env.e0, e1 = env.e1;
    char why[300];
    cu_blas *bl = blas_open("blastune", why, sizeof why);
    if (!bl) return 1;
    printf("%s: TFLOP/s of each algorithm the heuristic offers (#0 the backend's), the best, and\n"
           "err = max |y - y#0| / max |y#0| of the worst\n", why);
    const struct { const char *name; int64_t rows, cols; int y_bf16; } shapes[] = {
        {"gate|up", 17408, 5120, 1}, {"down", 5120, 17408, 0}, {"gdn qkvz", 16384, 5120, 0}, {"out/o", 5120, 6144, 0},
        {"attn qkv", 14336, 5120, 0}};
    const std::vector<int64_t> Ts = token_list(tlist, {2048, 8192});
    const int64_t TM = most_tokens(Ts);
    void *ws;
    CK(cudaMalloc(&ws, CU_BLAS_WORKSPACE));
    int bad = 0;
    for (const auto &sh : shapes) {
        const tiled_case tc = tiled_case_make(s, sh.rows, sh.cols, TM, 23);
        const int64_t ldxs = tiled_steps(sh.cols) * 32;
        uint16_t *wrm;
        CK(cudaMalloc(&wrm, (size_t)sh.rows * ldxs * 2));
        cu_untile_bf16(s, tc.wt, sh.rows, sh.cols, wrm);
        for (int64_t T : Ts) {
            launch_split(s, tc.x, sh.cols, T, sh.cols, tc.xs, ldxs, 1);
            /* y#0 in yref (fp32, or bf16 in its first half), each other's in y */
            const int n = cu_blas_try_count(bl, wrm, ldxs, sh.rows, sh.cols, tc.xs, ldxs, T, tc.yref, sh.rows, sh.y_bf16,
                                            CU_BLAS_WORKSPACE, CU_BLAS_TRY);
            if (n < 1) {
                printf("%-9s %6lld: the library offers no algorithm\n", sh.name, (long long)T);
                bad++;
                continue;
            }
            const double fl = 2.0 * sh.rows * sh.cols * T;
            std::vector<double> tf((size_t)n, 0.0);
            double worst = 0.0;
            CK(cudaStreamSynchronize(s));
            if (cu_blas_gemm_try(bl, s, 0, wrm, ldxs, sh.rows, sh.cols, tc.xs, ldxs, T, tc.yref, sh.rows, sh.y_bf16, ws,
                                 CU_BLAS_WORKSPACE) != 0) {
                printf("%-9s %6lld: algorithm 0 failed\n", sh.name, (long long)T);
                bad++;
                continue;
            }
            for (int k = 0; k < n; k++) {
                if (cu_blas_gemm_try(bl, s, k, wrm, ldxs, sh.rows, sh.cols, tc.xs, ldxs, T, tc.y, sh.rows, sh.y_bf16, ws,
                                     CU_BLAS_WORKSPACE) != 0) {
                    CK(cudaGetLastError());
                    continue; /* (tf 0: failed) */
                }
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                double err = 0.0;
                if (sh.y_bf16) { /* bf16 outputs: the same rounding of sums within the bound, or a step apart */
                    std::vector<uint16_t> a((size_t)(T * sh.rows)), b((size_t)(T * sh.rows));
                    CK(cudaMemcpy(a.data(), tc.y, a.size() * 2, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(b.data(), tc.yref, b.size() * 2, cudaMemcpyDeviceToHost));
                    double md = 0.0, mr = 0.0;
                    auto bf = [](uint16_t h) {
                        const uint32_t u = (uint32_t)h << 16;
                        float f;
                        memcpy(&f, &u, 4);
                        return f;
                    };
                    for (size_t i = 0; i < a.size(); i++) {
                        const float fa = bf(a[i]), fb = bf(b[i]);
                        md = fabs((double)fa - fb) > md ? fabs((double)fa - fb) : md;
                        mr = fabs((double)fb) > mr ? fabs((double)fb) : mr;
                    }
                    err = mr > 0 ? md / mr : 0.0;
                } else {
                    agreement ag;
                    ag.add(tc.y, tc.yref, (size_t)(T * sh.rows));
                    err = ag.nan ? 1.0 : ag.err();
                }
                worst = err > worst ? err : worst;
                tf[(size_t)k] = fl / time_launches(s, e0, e1, reps, 1, [&](int) {
                                    cu_blas_gemm_try(bl, s, k, wrm, ldxs, sh.rows, sh.cols, tc.xs, ldxs, T, tc.y, sh.rows,
                                                     sh.y_bf16, ws, CU_BLAS_WORKSPACE);
                                }) / 1e12;
            }
            int best = 0;
            for (int k = 1; k < n; k++) best = tf[(size_t)k] > tf[(size_t)best] ? k : best;
            /* bf16 outputs: each sum rounded once, so two orders differ by a bf16 step at most
             * (of the largest: 2^-7 of it) */
            const bool ok = worst <= (sh.y_bf16 ? 1.0 / 128 : 4e-9 * (double)sh.cols);
            bad += !ok;
            printf("%-9s %6lld  #0 %6.1f  best #%-2d %6.1f (%+.1f%%)  of %2d, err %.2e%s\n   ", sh.name, (long long)T,
                   tf[0], best, tf[(size_t)best], 100.0 * (tf[(size_t)best] / tf[0] - 1.0), n, worst, ok ? "" : "  FAIL");
            for (int k = 0; k < n; k++) printf(" %.0f", tf[(size_t)k]);
            printf("\n");
        }
        CK(cudaFree(wrm));
        tiled_case_free(tc);
    }
    CK(cudaFree(ws));
    cu_blas_destroy(bl);
    printf("blastune: %s\n", bad ? "FAILED" : "every algorithm agrees");
    return bad ? 1 : 0;
}

/* ---- `mmv_bench blas`: the prefill products on cuBLASLt against the backend's own, with
 * bf16 activations (one part: against k_wgmma, or k_gemm) and in `exact` (three parts, three
 * library products a matrix: against k_gemm's three-part path) ---- */
static int blasbench(int reps, const char *tlist) {
    const bench_env env = bench_env_make();
    cudaStream_t s = env.s;
    cudaEvent_t e0 = env.e0, e1 = env.e1;
    char why[300];
    cu_blas *bl = blas_open("blas", why, sizeof why);
    if (!bl) return 1;
    void *enc = cu_wgmma_available();
    printf("%s; the backend's own path: bf16 %s, exact k_gemm\n", why, enc ? "k_wgmma (k_gemm under 128 tokens)" : "k_gemm");
    const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"gate+up", 34816, 5120}, {"down", 5120, 17408}, {"gdn in", 16512, 5120}, {"out/o", 5120, 6144},
        {"attn qkv", 14336, 5120}, {"odd rows", 1000, 384}};
    const std::vector<int64_t> Ts = token_list(tlist, {512, 1024, 2048, 4096, 8192});
    const int64_t TM = most_tokens(Ts);
    void *ws;
    CK(cudaMalloc(&ws, CU_BLAS_WORKSPACE));
    int bad = 0;
    printf("TFLOP/s (2 rows cols T a product, whatever its parts): own = the backend without the library;\n"
           "blas = with it (the matrix copied out of the tiled layout, the activations split, the library's\n"
           "products: one, or three in exact), gemm = the library's products alone; untile GB/s (read +\n"
           "written); err = max |blas - own| / max |own|\n");
    printf("%-9s %-5s %6s %8s %8s %8s %8s %10s\n", "shape", "acts", "T", "own", "blas", "gemm", "untile", "err");
    for (const auto &sh : shapes) {
        const tiled_case tc = tiled_case_make(s, sh.rows, sh.cols, TM, 17);
        const int64_t ldxs = tiled_steps(sh.cols) * 32;
        uint16_t *wrm;
        CK(cudaMalloc(&wrm, (size_t)sh.rows * ldxs * 2));
        /* the copy out of the tiled layout gives the row-major matrix back, bit for bit */
        cu_untile_bf16(s, tc.wt, sh.rows, sh.cols, wrm);
        CK(cudaStreamSynchronize(s));
        {
            std::vector<uint16_t> a((size_t)(sh.rows * ldxs)), b((size_t)(sh.rows * sh.cols));
            CK(cudaMemcpy(a.data(), wrm, a.size() * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), tc.wd, b.size() * 2, cudaMemcpyDeviceToHost));
            size_t diff = 0;
            for (int64_t r = 0; r < sh.rows; r++)
                for (int64_t c = 0; c < ldxs; c++)
                    diff += a[(size_t)(r * ldxs + c)] != (c < sh.cols ? b[(size_t)(r * sh.cols + c)] : 0);
            if (diff) {
                printf("%-9s untile: %zu elements differ  FAIL\n", sh.name, diff);
                bad++;
            }
            /* the backend's copy against the plain one (k_untile), GB/s read + written */
            const double by = 2.0 * sh.rows * ldxs * 2;
            const double t_b = time_launches(s, e0, e1, reps, 1, [&](int) { cu_untile_bf16(s, tc.wt, sh.rows, sh.cols, wrm); });
            const double t_p =
                time_launches(s, e0, e1, reps, 1, [&](int) { k_untile<<<4096, 256, 0, s>>>(tc.wt, sh.rows, sh.cols, wrm); });
            printf("%-9s untile GB/s: the backend's %.0f, k_untile %.0f\n", sh.name, by / t_b / 1e9, by / t_p / 1e9);
        }
        const cu_mat w = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, tc.wt, NULL, NULL};
        mm_group g;
        g.n = 1, g.w[0] = w, g.ldy[0] = sh.rows, g.blk0[0] = 0;
        for (int parts = 1; parts <= 3; parts += 2) {
            /* the backend's scratch: xs of 2,048 tokens of three parts (wgmma in bf16 only, as a
             * context's), the copy of this matrix */
            cu_mm_scratch own = {tc.xs, TM < 2048 ? TM : 2048, NULL, 0};
            own.tma_encode = parts == 1 ? enc : NULL;
            own.xs_elems = (int64_t)cu_split_elems(own.xs_tokens, sh.cols);
            cu_mm_scratch lib = own;
            lib.blas = bl, lib.wrm = wrm, lib.wrm_elems = sh.rows * ldxs, lib.blas_ws = ws, lib.blas_ws_bytes = CU_BLAS_WORKSPACE;
            for (int64_t T : Ts) {
                mm_group go = g, gl = g;
                go.y[0] = tc.yref, gl.y[0] = tc.y;
                launch_tiled(s, go, tc.x, sh.cols, T, parts, &own, 0);
                CK(cudaMemsetAsync(tc.y, 0xff, T * sh.rows * 4, s)); /* NaN: an output never written stays one */
                launch_tiled(s, gl, tc.x, sh.cols, T, parts, &lib, 0);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                agreement ag;
                ag.add(tc.y, tc.yref, (size_t)(T * sh.rows));
                const size_t nan = ag.nan;
                const double err = ag.err();
                /* two fp32 summation orders of the same exact products (a weight times a bf16
                 * activation, or times each of its three parts): as `mmv_bench wg` */
                const double bound = 4e-9 * (double)sh.cols;
                const bool ok = nan == 0 && err <= bound;
                bad += !ok;
                const double t_own =
                    time_launches(s, e0, e1, reps, 1, [&](int) { launch_tiled(s, go, tc.x, sh.cols, T, parts, &own, 0); });
                const double t_lib =
                    time_launches(s, e0, e1, reps, 1, [&](int) { launch_tiled(s, gl, tc.x, sh.cols, T, parts, &lib, 0); });
                /* the library's products alone, on a slice's tokens (as launch_blas makes them) */
                const int64_t cap = own.xs_elems / (parts * ldxs), n = T < cap ? T : cap;
                launch_split(s, tc.x, sh.cols, n, sh.cols, tc.xs, ldxs, parts);
                const double t_gemm = time_launches(s, e0, e1, reps, 1, [&](int) {
                    for (int p = parts - 1; p >= 0; p--)
                        cu_blas_gemm(bl, s, wrm, ldxs, sh.rows, sh.cols, tc.xs + p * n * ldxs, ldxs, n, tc.y, sh.rows,
                                     p < parts - 1, ws, CU_BLAS_WORKSPACE);
                });
                const double t_un = time_launches(s, e0, e1, reps, 1, [&](int) { cu_untile_bf16(s, tc.wt, sh.rows, sh.cols, wrm); });
                const double fl = 2.0 * sh.rows * sh.cols * T;
                printf("%-9s %-5s %6lld %8.1f %8.1f %8.1f %8.0f %10.2e%s", sh.name, parts == 1 ? "bf16" : "exact", (long long)T,
                       fl / t_own / 1e12, fl / t_lib / 1e12, 2.0 * sh.rows * sh.cols * n / t_gemm / 1e12,
                       2.0 * sh.rows * ldxs * 2 / t_un / 1e9, err, ok ? "\n" : "  FAIL");
                if (nan) printf(" (%zu outputs not written)", nan);
                if (!ok) printf("\n");
            }
        }
        CK(cudaFree(wrm));
        tiled_case_free(tc);
    }
    /* MLX 8- and 4-bit (groups of 64) on the library, dequantized to bf16 first, against
     * `exact` (three bf16 parts), beside the bf16 form's own error: both within the op test's
     * bf16 bound (2e-2 of the largest output); and `exact` with the library's scratch the
     * same bits as without (its MLX products keep their own kernels) */
    printf("\nMLX on the library (dequantized to bf16): TFLOP/s; err = max |y - exact| / max |exact|\n");
    printf("%-9s %4s %6s %8s %8s %10s %10s %10s\n", "shape", "bits", "T", "own", "blas", "err own", "err blas", "exact");
    for (int bits = 8; bits >= 4; bits -= 4) {
        const int64_t rows = 17408, cols = 5120, T = 2048;
        q_case qc = q_case_make(s, rows, cols, bits, 64, T);
        uint16_t *wrm;
        CK(cudaMalloc(&wrm, (size_t)rows * cols * 2));
        cu_mm_scratch own = {qc.xs, T, NULL, 0};
        own.xs_elems = (int64_t)cu_split_elems(T, cols);
        cu_mm_scratch lib = own;
        lib.blas = bl, lib.wrm = wrm, lib.wrm_elems = rows * cols, lib.blas_ws = ws, lib.blas_ws_bytes = CU_BLAS_WORKSPACE;
        cu_matmul(s, &qc.ws[0], qc.x, cols, T, qc.yref, rows, CU_MM_EXACT, &own);
        double err[2];
        for (int k = 0; k < 2; k++) {
            CK(cudaMemsetAsync(qc.y, 0xff, (size_t)T * rows * 4, s));
            cu_matmul(s, &qc.ws[0], qc.x, cols, T, qc.y, rows, CU_MM_BF16, k ? &lib : &own);
            CK(cudaStreamSynchronize(s));
            CK(cudaGetLastError());
            agreement ag;
            ag.add(qc.y, qc.yref, (size_t)(T * rows));
            err[k] = ag.nan ? 1.0 : ag.err();
        }
        CK(cudaMemsetAsync(qc.y, 0xff, (size_t)T * rows * 4, s));
        cu_matmul(s, &qc.ws[0], qc.x, cols, T, qc.y, rows, CU_MM_EXACT, &lib);
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        const bool exact_same = same_bits(qc.y, qc.yref, (size_t)(T * rows));
        const bool ok = err[1] <= 2e-2 && exact_same;
        bad += !ok;
        const int copies = (int)qc.ws.size();
        const double t_own = time_launches(s, e0, e1, reps, copies, [&](int c) {
            cu_matmul(s, &qc.ws[c], qc.x, cols, T, qc.y, rows, CU_MM_BF16, &own);
        });
        const double t_lib = time_launches(s, e0, e1, reps, copies, [&](int c) {
            cu_matmul(s, &qc.ws[c], qc.x, cols, T, qc.y, rows, CU_MM_BF16, &lib);
        });
        const double fl = 2.0 * rows * cols * T;
        printf("%-9s %4d %6lld %8.1f %8.1f %10.2e %10.2e %10s%s\n", "gate", bits, (long long)T, fl / t_own / 1e12,
               fl / t_lib / 1e12, err[0], err[1], exact_same ? "same bits" : "differ", ok ? "" : "  FAIL");
        CK(cudaFree(wrm));
        q_case_free(qc);
    }
    CK(cudaFree(ws));
    cu_blas_destroy(bl);
    printf("blas: %s\n", bad ? "FAILED" : "all products agree");
    return bad ? 1 : 0;
}

/* ---- the 27B decode's product launches, and a launch's buffers (ws and vp) ---- */
struct dec_launch {
    const char *name;
    int n;
    int64_t rows[4], cols;
    int per_token; /* such launches a 27B token makes */
};
static const dec_launch k27_launches[] = {
    {"gate+up", 2, {17408, 17408}, 5120, 64},      {"down", 1, {5120}, 17408, 64},
    {"gdn in", 4, {10240, 6144, 48, 48}, 5120, 48}, {"out/o", 1, {5120}, 6144, 64},
    {"attn qkv", 3, {12288, 1024, 1024}, 5120, 16}, {"lm head", 1, {248320}, 5120, 1}};

/* A launch's buffers: copies of its matrices tiled, filling 1 GB so that timed launches read
 * from memory (wt[c * n + i]), nout outputs of TM tokens (y[k][i]), TM tokens of random
 * activations (x) and room for their split (xs); all device memory, owned */
struct launch_bufs {
    size_t bytes; /* one copy's matrices, row-major bf16 */
    int copies;
    std::vector<uint16_t *> wt;
    std::vector<std::vector<float *>> y;
    float *x;
    uint16_t *xs;
};

static launch_bufs launch_bufs_make(cudaStream_t s, const dec_launch &gr, int64_t TM, int nout) {
    launch_bufs b;
    b.bytes = 0;
    for (int i = 0; i < gr.n; i++) b.bytes += (size_t)gr.rows[i] * gr.cols * 2;
    b.copies = (int)((((size_t)1 << 30) + b.bytes - 1) / b.bytes);
    b.wt.assign((size_t)b.copies * gr.n, NULL);
    b.y.assign(nout, std::vector<float *>(gr.n, NULL));
    for (int i = 0; i < gr.n; i++) {
        uint16_t *wd;
        CK(cudaMalloc(&wd, (size_t)gr.rows[i] * gr.cols * 2));
        for (int c = 0; c < b.copies; c++) {
            CK(cudaMalloc(&b.wt[(size_t)c * gr.n + i], cu_tiled_elems(gr.rows[i], gr.cols) * 2));
            cu_synth_fill(s, wd, (size_t)gr.rows[i] * gr.cols, CU_SYNTH_BF16, 77 + 7 * c + i, 0.05f);
            cu_tile_bf16(s, wd, gr.rows[i], gr.cols, b.wt[(size_t)c * gr.n + i]);
        }
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(wd));
        for (int k = 0; k < nout; k++) CK(cudaMalloc(&b.y[k][i], TM * gr.rows[i] * 4));
    }
    CK(cudaMalloc(&b.x, TM * gr.cols * 4));
    CK(cudaMalloc(&b.xs, cu_split_elems(TM, gr.cols) * 2));
    std::vector<float> hx(TM * gr.cols);
    srand(11);
    for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    CK(cudaMemcpy(b.x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    return b;
}

static void launch_bufs_free(launch_bufs &b) {
    for (uint16_t *w : b.wt) CK(cudaFree(w));
    for (auto &yk : b.y)
        for (float *p : yk) CK(cudaFree(p));
    CK(cudaFree(b.x));
    CK(cudaFree(b.xs));
}

/* ---- `mmv_bench ws [reps] [T,...]`: bf16-activation products of few tokens on resident
 * wgmma blocks (k_wgmma_stream, matmul_wgmma.cu) against the backend's other path for them
 * (k_mmvp up to 8 tokens, k_mmv to 16, k_gemm beyond), on the 27B launches (gate and up
 * together, the four GDN in-projections, q/k/v) and odd shapes: agreement (as `wg`: every
 * output written, within 4e-9 times the columns of the largest output), and the same for its
 * variants on clusters of two and four blocks (the group's row blocks at the same stages,
 * each stage's activations read from L2 once for all of them by TMA multicast; not yet the
 * backend's; the variant of two row blocks a block they replace measured 17.3 against 16.5 ms
 * at 64 tokens), GB/s of weights of each (the weights rotated over copies past the L2), and
 * one 27B token's matrices summed against the copy-bandwidth floor ---- */
static int wsbench(int reps, const char *tlist) {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    void *enc = cu_wgmma_available();
    if (!enc) {
        printf("wgmma: this device does not run the sm_90a kernel\n");
        return 1;
    }
    const double copy_bw = copy_bandwidth(s, e0, e1);
    std::vector<dec_launch> groups(std::begin(k27_launches), std::end(k27_launches));
    groups.push_back({"odd", 3, {1000, 200, 16}, 384, 0});
    const std::vector<int64_t> Ts = token_list(tlist, {1, 2, 4, 8, 9, 16, 17, 24, 32, 48, 64, 65, 96, 127});
    const int64_t TM = 128;
    int bad = 0;
    /* the backend's stream kernel (stages of 4 steps in ws_kb's KB); 110 KB of stages of 2 (the
     * form before); that on clusters of 2; 150 and 110 KB of stages of 4 */
    constexpr int NV = 5;
    static const char *const vname[NV] = {"stream", "sp2", "cl2", "k150", "k110"};
    std::vector<double> t_old(Ts.size(), 0.0), t_v[NV];
    for (int v = 0; v < NV; v++) t_v[v].assign(Ts.size(), 0.0);
    const int most2 = cu_wgmma_stream_clusters(2), most4 = cu_wgmma_stream_clusters(4);
    printf("clusters that run at once: %d of 2 blocks, %d of 4 (%d SMs)\n", most2, most4, mm_sms());
    if (ws_attrs<150, 1, 4>() != 0 || ws_attrs<110, 1, 4>() != 0) { /* (cu_wgmma_available allowed sp2's) */
        printf("ws: the variants' shared memory is refused\n");
        return 1;
    }
    float *wpart, *part;
    int32_t *wcount;
    const int64_t counts = cu_ws_counts(248320);
    CK(cudaMalloc(&wpart, cu_ws_part_elems() * 4));
    CK(cudaMalloc(&wcount, counts * 4));
    CK(cudaMemset(wcount, 0, counts * 4));
    CK(cudaMalloc(&part, cu_mm_part_elems(64, 248320) * 4));
    /* the backend's path without the stream kernel, and the stream kernel's scratch */
    cu_mm_scratch sc_old = {};
    sc_old.xs_tokens = TM, sc_old.part = part, sc_old.part_elems = (int64_t)cu_mm_part_elems(64, 248320);
    printf("bf16 products of few tokens: k_wgmma_stream against the backend's other path; GB/s of weights;\n"
           "err = max |variant - other| / max |other| over the variants; stream: the backend's (stages of %d\n"
           "steps in %d KB, 0: 110 at 33-64 tokens, 150 else); sp2: 110 KB of stages of 2 (the form before);\n"
           "cl2: that on clusters of 2 blocks; k150, k110: 150 and 110 KB of stages of 4\n", CU_WS_SP, CU_WS_KB);
    printf("%-9s %4s %8s", "launch", "T", "other");
    for (int v = 0; v < NV; v++) printf(" %8s", vname[v]);
    printf(" %9s\n", "err");
    for (const dec_launch &gr : groups) {
        launch_bufs lb = launch_bufs_make(s, gr, TM, NV + 1);
        const size_t bytes = lb.bytes;
        const int copies = lb.copies;
        const std::vector<uint16_t *> &wt = lb.wt;
        const std::vector<float *> &yref = lb.y[NV];
        float *x = lb.x;
        uint16_t *xs = lb.xs;
        cu_mm_scratch sc_old_x = sc_old, sc = sc_old;
        sc_old_x.xs = xs;
        sc.xs = xs, sc.tma_encode = enc, sc.wpart = wpart, sc.wpart_elems = (int64_t)cu_ws_part_elems();
        sc.wcount = wcount, sc.wcount_n = counts;
        cu_mm_scratch sc2 = sc;
        sc2.ws_clusters = most2;
        const int64_t ldxs = tiled_steps(gr.cols) * 32;
        auto group_of = [&](int c, const std::vector<float *> &out) {
            mm_group g;
            g.n = gr.n;
            for (int i = 0; i < gr.n; i++) {
                g.w[i] = {CU_FMT_BF16_TILED, 0, 0, 0, gr.rows[i], gr.cols, wt[(size_t)c * gr.n + i], NULL, NULL};
                g.y[i] = out[i], g.ldy[i] = gr.rows[i];
            }
            return g;
        };
        /* variant v (the clusters are not the backend's: measured here first) */
        auto stream = [&](int c, int v, int64_t T) {
            const mm_group g = group_of(c, lb.y[v]);
            const cu_mat *w[4];
            for (int i = 0; i < gr.n; i++) w[i] = &g.w[i];
            switch (v) {
            case 1: return ws_stream<WS_SP2_KB, 1, 2>(s, &sc, g.n, w, g.y, g.ldy, xs, ldxs, T);
            case 2: return ws_stream<WS_SP2_KB, 2, 2>(s, &sc2, g.n, w, g.y, g.ldy, xs, ldxs, T);
            case 3: return ws_stream<150, 1, 4>(s, &sc, g.n, w, g.y, g.ldy, xs, ldxs, T);
            case 4: return ws_stream<110, 1, 4>(s, &sc, g.n, w, g.y, g.ldy, xs, ldxs, T);
            default: return cu_wgmma_stream(s, &sc, g.n, w, g.y, g.ldy, xs, ldxs, T);
            }
        };
        for (size_t ti = 0; ti < Ts.size(); ti++) {
            const int64_t T = Ts[ti];
            if (T < 1 || T > TM) continue;
            launch_split(s, x, gr.cols, T, gr.cols, xs, ldxs, 1);
            launch_tiled(s, group_of(0, yref), x, gr.cols, T, 1, &sc_old_x, 1);
            bool refused = false;
            for (int v = 0; v < NV && !refused; v++) {
                for (int i = 0; i < gr.n; i++) /* NaN: an output never written stays one */
                    CK(cudaMemsetAsync(lb.y[v][i], 0xff, T * gr.rows[i] * 4, s));
                refused = stream(0, v, T) != 0;
            }
            if (refused) {
                printf("%-9s %4lld refused\n", gr.name, (long long)T);
                bad++;
                continue;
            }
            CK(cudaStreamSynchronize(s));
            CK(cudaGetLastError());
            /* each against the other path: the largest difference over the largest output, unwritten outputs */
            double err[NV];
            size_t nan = 0;
            bool ok = true;
            for (int v = 0; v < NV; v++) {
                agreement ag;
                for (int i = 0; i < gr.n; i++) ag.add(lb.y[v][i], yref[i], (size_t)(T * gr.rows[i]));
                nan += ag.nan;
                err[v] = ag.err();
                ok = ok && ag.nan == 0 && err[v] <= 4e-9 * (double)gr.cols;
            }
            bad += !ok;
            const double to = time_launches(s, e0, e1, reps, copies, [&](int c) { launch_tiled(s, group_of(c, yref), x, gr.cols, T, 1, &sc_old_x, 1); });
            double tv[NV];
            for (int v = 0; v < NV; v++) tv[v] = time_launches(s, e0, e1, reps, copies, [&](int c) { stream(c, v, T); });
            double emax = 0.0;
            printf("%-9s %4lld %8.0f", gr.name, (long long)T, bytes / to / 1e9);
            for (int v = 0; v < NV; v++) {
                printf(" %8.0f", bytes / tv[v] / 1e9);
                emax = err[v] > emax ? err[v] : emax;
            }
            printf(" %9.2e%s\n", emax, ok ? "" : "  FAIL");
            if (nan) printf("          (%zu outputs not written)\n", nan);
            t_old[ti] += to * gr.per_token;
            for (int v = 0; v < NV; v++) t_v[v][ti] += tv[v] * gr.per_token;
        }
        launch_bufs_free(lb);
    }
    printf("\none 27B token's matrices, summed: ms (%% of the copy-bandwidth floor, 51.2 GB)\n");
    printf("%4s %18s", "T", "other");
    for (int v = 0; v < NV; v++) printf(" %18s", vname[v]);
    printf("\n");
    const double floor_s = 51.2 / copy_bw;
    for (size_t ti = 0; ti < Ts.size(); ti++)
        if (t_old[ti] > 0) {
            printf("%4lld %9.2f (%5.1f%%)", (long long)Ts[ti], t_old[ti] * 1e3, 100.0 * floor_s / t_old[ti]);
            for (int v = 0; v < NV; v++) printf(" %9.2f (%5.1f%%)", t_v[v][ti] * 1e3, 100.0 * floor_s / t_v[v][ti]);
            printf("\n");
        }
    CK(cudaFree(wpart));
    CK(cudaFree(wcount));
    CK(cudaFree(part));
    printf("stream: %s\n", bad ? "FAILED" : "all products agree");
    return bad ? 1 : 0;
}

/* ---- `mmv_bench qs [reps] [T,..]`: MLX 8- and 4-bit products of few tokens in `bf16` on
 * resident wgmma blocks (cu_wgmma_qstream: the permuted split, then k_wgmma_qstream) against
 * the backend's path without it (k_qmvp up to 16 tokens, k_qmv beyond), on the 27B launches
 * (groups of 64, bf16 scales and biases, random values): each against a reference of the
 * kernel's own weights (s q + b rounded to bf16 as it rounds them, times the activations in
 * bf16, summed in fp64), the stream kernel within 4e-9 times the columns of the largest output
 * (only its fp32 order differs; a wrong column, group or row is off by far more) with every
 * output written; the backend's path (s and b outside its sums: a bf16 rounding of each
 * weight away) for information; GB/s of the values, scales and biases, and one 27B token's
 * matrices summed; exits 1 where the stream kernel is off or refuses ---- */

/* y[t*ldy + r] = sum_c w(r, c) bf16(x[t*ldx + c]) in fp64, w as k_wgmma_qstream makes it from
 * the Q tiled layout (a thread an output) */
__global__ void k_qs_ref(cu_mat w, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy) {
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= T * w.rows) return;
    const int64_t t = o / w.rows, r = o % w.rows, m = r / 16, nsteps = w.cols / 32, ng = w.cols / w.group;
    const int rr = (int)(r % 16), g = rr % 8, half = rr / 8;
    double acc = 0.0;
    for (int64_t c = 0; c < w.cols; c++) {
        const int64_t k = c / 32;
        const int L = 4 * g + (int)(c % 32) / 8, cc = (int)(c % 8);
        const int64_t gi = (m * ng + c / w.group) * 16 + 2 * g + half;
        const float s = bf16f(((const uint16_t *)w.scales)[gi]), b = bf16f(((const uint16_t *)w.biases)[gi]);
        float v;
        if (w.bits == 8) {
            const uint8_t q = ((const uint8_t *)w.data)[((m * nsteps + k) * 32 + L) * 16 + half * 8 + cc];
            v = fmaf(s, (float)q, b);
        } else {
            const uint32_t word = ((const uint32_t *)w.data)[((m * nsteps + k) * 32 + L) * 2 + half];
            const uint32_t q = (word >> ((cc & 1) * 16 + (cc >> 1) * 4)) & 15u;
            v = fmaf(s, (float)(16 + q), fmaf(-16.0f, s, b));
        }
        acc += (double)bf16f(f2bf16(v)) * (double)bf16f(f2bf16(x[t * ldx + c]));
    }
    y[t * ldy + r] = (float)acc;
}

static int qsbench(int reps, const char *tlist) {
    const bench_env env = bench_env_make();
    cudaStream_t s = env.s;
    cudaEvent_t e0 = env.e0, e1 = env.e1;
    void *enc = cu_wgmma_available();
    if (!enc) {
        printf("wgmma: this device does not run the sm_90a kernel\n");
        return 1;
    }
    const double copy_bw = copy_bandwidth(s, e0, e1);
    const std::vector<int64_t> Ts = token_list(tlist, {1, 4, 8, 16, 17, 24, 32, 48, 64, 96, 127});
    const int64_t TM = 128;
    const int group = 64;
    float *wpart, *part;
    int32_t *wcount;
    uint16_t *xs;
    const int64_t counts = cu_ws_counts(248320);
    CK(cudaMalloc(&wpart, cu_ws_part_elems() * 4));
    CK(cudaMalloc(&wcount, counts * 4));
    CK(cudaMemset(wcount, 0, counts * 4));
    CK(cudaMalloc(&part, cu_mm_part_elems(TM, 248320) * 4));
    CK(cudaMalloc(&xs, cu_split_elems(TM, 17408) * 2));
    cu_mm_scratch other = {}; /* the backend's path without the stream kernel */
    other.xs = xs, other.xs_tokens = TM, other.part = part, other.part_elems = (int64_t)cu_mm_part_elems(TM, 248320);
    cu_mm_scratch sc = other;
    sc.tma_encode = enc, sc.wpart = wpart, sc.wpart_elems = (int64_t)cu_ws_part_elems(), sc.wcount = wcount,
    sc.wcount_n = counts;
    printf("MLX products of few tokens in bf16, groups of %d: the backend's path without the stream kernel\n"
           "(other) against k_wgmma_qstream (qs); GB/s of values, scales and biases; err: max |y - ref| /\n"
           "max |ref|, ref the stream kernel's weights summed in fp64\n", group);
    printf("%-9s %4s %4s %8s %8s %10s %10s\n", "launch", "bits", "T", "other", "qs", "err other", "err qs");
    int bad = 0;
    double tot[2][2][64] = {{{0}}}; /* [bits 8, 4][other, qs][T] */
    double tok_bytes[2] = {0, 0};  /* one 27B token's bytes of these launches */
    for (int bi = 0; bi < 2; bi++) {
        const int bits = bi ? 4 : 8;
        for (const dec_launch &gr : k27_launches) {
            size_t bytes = 0; /* one copy's */
            for (int i = 0; i < gr.n; i++)
                bytes += cu_qtiled_bytes(gr.rows[i], gr.cols, bits) + 4 * cu_qtiled_groups(gr.rows[i], gr.cols, group);
            tok_bytes[bi] += (double)bytes * gr.per_token;
            const int copies = (int)((((size_t)1 << 30) + bytes - 1) / bytes);
            std::vector<cu_mat> ws((size_t)copies * gr.n);
            for (int c = 0; c < copies; c++)
                for (int i = 0; i < gr.n; i++) {
                    const size_t vb = cu_qtiled_bytes(gr.rows[i], gr.cols, bits), gn = cu_qtiled_groups(gr.rows[i], gr.cols, group);
                    void *d, *sc_, *bs;
                    CK(cudaMalloc(&d, vb));
                    CK(cudaMalloc(&sc_, gn * 2));
                    CK(cudaMalloc(&bs, gn * 2));
                    cu_synth_fill(s, d, vb / 4, CU_SYNTH_WORDS, 77 + 7 * c + i, 0.0f);
                    cu_synth_fill(s, sc_, gn, CU_SYNTH_BF16, 500 + 7 * c + i, 0.01f);
                    cu_synth_fill(s, bs, gn, CU_SYNTH_BF16, 900 + 7 * c + i, 0.01f);
                    ws[(size_t)c * gr.n + i] = {CU_FMT_Q_TILED, 2, bits, group, gr.rows[i], gr.cols, d, sc_, bs};
                }
            float *x, *y[3][4]; /* [ref, other, qs][matrix] */
            CK(cudaMalloc(&x, TM * gr.cols * 4));
            for (int k = 0; k < 3; k++)
                for (int i = 0; i < gr.n; i++) CK(cudaMalloc(&y[k][i], TM * gr.rows[i] * 4));
            std::vector<float> hx(TM * gr.cols);
            srand(13);
            for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            for (int i = 0; i < gr.n; i++) {
                const int64_t n = TM * gr.rows[i];
                k_qs_ref<<<(unsigned)((n + 127) / 128), 128, 0, s>>>(ws[i], x, gr.cols, TM, y[0][i], gr.rows[i]);
            }
            CK(cudaStreamSynchronize(s));
            CK(cudaGetLastError());
            auto group_of = [&](int c, int k) {
                mm_group g;
                g.n = gr.n;
                for (int i = 0; i < gr.n; i++) g.w[i] = ws[(size_t)c * gr.n + i], g.y[i] = y[k][i], g.ldy[i] = gr.rows[i];
                return g;
            };
            auto run_other = [&](int c, int64_t T) { launch_qtiled(s, group_of(c, 1), x, gr.cols, T, 1, &other, 0, 0); };
            auto run_qs = [&](int c, int64_t T) {
                const mm_group g = group_of(c, 2);
                const cu_mat *w[4];
                for (int i = 0; i < gr.n; i++) w[i] = &g.w[i];
                return cu_wgmma_qstream(s, &sc, g.n, w, g.y, g.ldy, x, gr.cols, T);
            };
            for (size_t ti = 0; ti < Ts.size() && ti < 64; ti++) {
                const int64_t T = Ts[ti];
                if (T < 1 || T > TM) continue;
                for (int k = 1; k < 3; k++)
                    for (int i = 0; i < gr.n; i++) /* NaN: an output never written stays one */
                        CK(cudaMemsetAsync(y[k][i], 0xff, T * gr.rows[i] * 4, s));
                run_other(0, T);
                const int rq = run_qs(0, T);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                if (rq != 0) {
                    printf("%-9s %4d %4lld refused\n", gr.name, bits, (long long)T);
                    bad++;
                    continue;
                }
                agreement ao, aq;
                for (int i = 0; i < gr.n; i++) {
                    ao.add(y[1][i], y[0][i], (size_t)(T * gr.rows[i]));
                    aq.add(y[2][i], y[0][i], (size_t)(T * gr.rows[i]));
                }
                const bool ok = aq.nan == 0 && aq.err() <= 4e-9 * (double)gr.cols;
                bad += !ok;
                const double to = time_launches(s, e0, e1, reps, copies, [&](int c) { run_other(c, T); });
                const double tq = time_launches(s, e0, e1, reps, copies, [&](int c) { run_qs(c, T); });
                printf("%-9s %4d %4lld %8.0f %8.0f %10.2e %10.2e%s\n", gr.name, bits, (long long)T, bytes / to / 1e9,
                       bytes / tq / 1e9, ao.err(), aq.err(), ok ? "" : "  FAIL");
                if (aq.nan) printf("          (%zu outputs not written)\n", aq.nan);
                tot[bi][0][ti] += to * gr.per_token;
                tot[bi][1][ti] += tq * gr.per_token;
            }
            for (auto &w : ws) {
                CK(cudaFree((void *)w.data));
                CK(cudaFree((void *)w.scales));
                CK(cudaFree((void *)w.biases));
            }
            CK(cudaFree(x));
            for (int k = 0; k < 3; k++)
                for (int i = 0; i < gr.n; i++) CK(cudaFree(y[k][i]));
        }
    }
    printf("\none 27B token's matrices, summed: ms, other | qs (%% of the copy-bandwidth floor of their bytes)\n");
    for (int bi = 0; bi < 2; bi++) {
        const double floor_s = tok_bytes[bi] / 1e9 / copy_bw;
        printf("%d-bit (%.1f GB):\n", bi ? 4 : 8, tok_bytes[bi] / 1e9);
        for (size_t ti = 0; ti < Ts.size() && ti < 64; ti++)
            if (tot[bi][0][ti] > 0)
                printf("  T=%-4lld %8.2f (%5.1f%%) | %8.2f (%5.1f%%)\n", (long long)Ts[ti], tot[bi][0][ti] * 1e3,
                       100.0 * floor_s / tot[bi][0][ti], tot[bi][1][ti] * 1e3, 100.0 * floor_s / tot[bi][1][ti]);
    }
    CK(cudaFree(wpart));
    CK(cudaFree(wcount));
    CK(cudaFree(part));
    CK(cudaFree(xs));
    printf("qs: %s\n", bad ? "FAILED" : "all products agree");
    return bad ? 1 : 0;
}

/* ---- the delta rule: per step (gdn.cu) against chunked (gdn_chunk.cu) ---- */

__global__ void k_fill_hash(float *p, int64_t n, unsigned seed, float lo, float hi) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed * 40503u;
        x ^= x >> 15, x *= 2246822519u, x ^= x >> 13, x *= 3266489917u, x ^= x >> 16;
        p[i] = lo + (hi - lo) * (float)(x >> 8) * (1.0f / 16777216.0f);
    }
}

/* a device copy of v (the caller frees it) */
template <typename T>
static T *dev_copy(const std::vector<T> &v) {
    T *p;
    CK(cudaMalloc(&p, v.size() * sizeof(T)));
    CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

/* cudaFree of each (NULL ones skipped) */
static void dev_free(std::initializer_list<void *> ps) {
    for (void *p : ps)
        if (p) CK(cudaFree(p));
}
static float *dev_floats(int64_t n, unsigned seed, float lo, float hi) {
    float *p;
    CK(cudaMalloc(&p, (size_t)n * 4));
    k_fill_hash<<<1024, 256>>>(p, n, seed, lo, hi);
    return p;
}

/* the largest |a - b| over the largest |a| of n device floats */
static double rel_diff(const float *a, const float *b, size_t n) {
    std::vector<float> ha(n), hb(n);
    CK(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost));
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = fabs((double)ha[i] - (double)hb[i]);
        if (!(v <= d)) d = v;
        if (fabs((double)ha[i]) > m) m = fabs((double)ha[i]);
    }
    return m > 0 ? d / m : d;
}

static int gdnbench(int reps) {
    const int Hk = 16, Hv = 48, Dk = 128, Dv = 128, K = 4;
    const int64_t kd = Hk * Dk, vd = Hv * Dv, cd = 2 * kd + vd;
    const struct { int items; int64_t len; } cases[] = {{1, 8192}, {1, 1000}, {4, 2000}, {16, 130}, {1, 63}, {64, 1}, {16, 1}, {1, 1}};
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    if (cu_gdn_prepare(Dk, Dv) || cu_gdn_chunked_prepare(Dk, Dv)) {
        printf("gdn: the kernels refuse 128 x 128 heads\n");
        return 1;
    }
    int bad = 0;
    for (const auto &cs : cases) {
        const int64_t T = cs.items * cs.len;
        float *qkv0 = dev_floats(T * cd, 1, -1.0f, 1.0f), *z = dev_floats(T * vd, 2, -1.0f, 1.0f);
        float *bb = dev_floats(T * Hv, 3, -2.0f, 2.0f), *aa = dev_floats(T * Hv, 4, -2.0f, 2.0f);
        float *conv_t = dev_floats(K * cd, 5, -0.5f, 0.5f), *normw = dev_floats(Dv, 6, 0.5f, 1.5f);
        float *qkv, *mix[2], *rec[2], *conv_st, *dtb, *nea, *ws;
        CK(cudaMalloc(&qkv, (size_t)T * cd * 4));
        const size_t rec_n = (size_t)cs.items * Hv * Dk * Dv, conv_n = (size_t)cs.items * (K - 1) * cd;
        for (int i = 0; i < 2; i++) {
            CK(cudaMalloc(&mix[i], (size_t)T * vd * 4));
            CK(cudaMalloc(&rec[i], rec_n * 4));
        }
        CK(cudaMalloc(&conv_st, conv_n * 4));
        std::vector<float> hd(Hv), hn(Hv);
        for (int h = 0; h < Hv; h++) hd[h] = -4.0f + 6.0f * h / Hv, hn[h] = -(1.0f + 15.0f * ((h * 7) % Hv) / Hv);
        CK(cudaMalloc(&dtb, Hv * 4));
        CK(cudaMalloc(&nea, Hv * 4));
        CK(cudaMemcpy(dtb, hd.data(), Hv * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(nea, hn.data(), Hv * 4, cudaMemcpyHostToDevice));
        /* the plan: items of len tokens, slot i, chunks of 64 from each item's start */
        std::vector<int64_t> t0(cs.items + 1);
        std::vector<int32_t> slot(cs.items), ch, ic(cs.items + 1);
        for (int i = 0; i <= cs.items; i++) t0[i] = i * cs.len;
        for (int i = 0; i < cs.items; i++) {
            slot[i] = i, ic[i] = (int32_t)(ch.size() / 4);
            for (int64_t t = t0[i]; t < t0[i + 1]; t += 64) {
                const int64_t n = t0[i + 1] - t < 64 ? t0[i + 1] - t : 64;
                ch.insert(ch.end(), {(int32_t)t, (int32_t)n, i, 0});
            }
        }
        ic[cs.items] = (int32_t)(ch.size() / 4);
        int64_t *d_t0 = dev_copy(t0);
        int32_t *d_slot = dev_copy(slot), *d_ch = dev_copy(ch), *d_ic = dev_copy(ic);
        const int ws_chunks = 32;
        const size_t ws_n = (size_t)CU_GDN_WS_SLABS * ws_chunks * Hv * cu_gdn_chunk_floats(Dk, Dv), conv_ws = ch.size() / 4 * (K - 1) * (size_t)cd;
        CK(cudaMalloc(&ws, (ws_n > conv_ws ? ws_n : conv_ws) * 4));
        float *qkv_after[2];
        for (int i = 0; i < 2; i++) CK(cudaMalloc(&qkv_after[i], (size_t)T * cd * 4));
        cu_plan p = {};
        p.n_items = cs.items, p.n_tokens = T, p.item_t0 = d_t0, p.slot = d_slot;
        cu_gdn_args a = {};
        a.qkv = qkv, a.z = z, a.b = bb, a.a = aa, a.conv_t = conv_t, a.conv_state = conv_st, a.conv_stride = (size_t)(K - 1) * cd;
        a.rec_stride = (size_t)Hv * Dk * Dv, a.dt_bias = dtb, a.neg_exp_a = nea, a.norm_w = normw;
        a.K = K, a.Hk = Hk, a.Hv = Hv, a.Dk = Dk, a.Dv = Dv, a.cd = cd, a.kd = kd, a.vd = vd, a.eps = 1e-6f;
        a.chunks = d_ch, a.item_chunk = d_ic, a.chunk_ws = ws, a.ws_chunks = ws_chunks;
        double ms[3] = {0, 0, 0};
        for (int path = 0; path < 2; path++) {
            a.mix = mix[path], a.rec_state = rec[path], a.n_chunks = path ? (int)(ch.size() / 4) : 0;
            for (int r = 0; r <= reps; r++) { /* the first untimed: its results compared */
                CK(cudaMemcpyAsync(qkv, qkv0, (size_t)T * cd * 4, cudaMemcpyDeviceToDevice, s));
                CK(cudaMemsetAsync(conv_st, 0, conv_n * 4, s));
                CK(cudaMemsetAsync(rec[path], 0, rec_n * 4, s));
                CK(cudaEventRecord(e0, s));
                cu_gdn(s, &p, &a, (int)cs.len);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (r) ms[path] += t / reps;
            }
            /* a decode step of few items normalizes q and k inside the rule's kernel, as does the chunked
             * rule (k_gdn_cprep), not in place: as the other path does */
            if ((path == 0 && cs.len == 1 && cs.items <= GDN_DEC_FUSED_MAX) || (path == 1 && a.n_chunks > 0))
                launch_pdl(k_gdn_qknorm, dim3((unsigned)(T * Hk)), dim3(32), 0, s, a, (int64_t)T * Hk);
            CK(cudaMemcpy(qkv_after[path], qkv, (size_t)T * cd * 4, cudaMemcpyDeviceToDevice));
        }
        const double dm = rel_diff(mix[0], mix[1], (size_t)T * vd), dsv = rel_diff(rec[0], rec[1], rec_n);
        const bool conv_same = same_bits(qkv_after[0], qkv_after[1], (size_t)T * cd);
        const bool ok = dm < 2e-2 && dsv < 2e-2 && conv_same;
        bad |= !ok;
        /* each kernel alone (on whatever the buffers hold by then) */
        auto time_ms = [&](auto launch) {
            launch();
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < reps; r++) launch();
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            return t / reps;
        };
        const int nch = (int)(ch.size() / 4);
        const double t_conv = time_ms([&] {
            dim3 gc((unsigned)p.n_items, (unsigned)((cd + CONV_THREADS - 1) / CONV_THREADS));
            launch_pdl(k_gdn_conv, gc, dim3(CONV_THREADS), 0, s, p, a);
        });
        const double t_convc = time_ms([&] { cu_gdn_conv_chunked(s, &p, &a); });
        const double t_qk = time_ms([&] { launch_pdl(k_gdn_qknorm, dim3((unsigned)(T * Hk)), dim3(32), 0, s, a, (int64_t)T * Hk); });
        const double t_gn = time_ms([&] { launch_pdl(k_gdn_gnorm, dim3((unsigned)(T * Hv)), dim3(32), 0, s, a, (int64_t)T * Hv); });
        /* the gated norm as the chunked rule takes it: GDN_NORM_WARPS warps a block (its q/k
         * norms are inside k_gdn_cprep) */
        const int64_t ngn = (int64_t)T * Hv, nw = GDN_NORM_WARPS;
        const double t_gn8 = time_ms(
            [&] { launch_pdl(k_gdn_gnorm, dim3((unsigned)((ngn + nw - 1) / nw)), dim3(32 * nw), 0, s, a, ngn); });
        const double t_prep = time_ms([&] {
            for (int c0 = 0; c0 < nch; c0 += ws_chunks) {
                const int c1 = c0 + ws_chunks < nch ? c0 + ws_chunks : nch;
                launch_pdl(k_gdn_cprep<128>, dim3((unsigned)(c1 - c0), (unsigned)Hv), dim3(GC_THREADS),
                           cprep_floats<128>(Dv) * sizeof(float), s, a, c0);
            }
        });
        const double t_scan = time_ms([&] {
            for (int c0 = 0; c0 < nch; c0 += ws_chunks) {
                const int c1 = c0 + ws_chunks < nch ? c0 + ws_chunks : nch;
                dim3 g3((unsigned)p.n_items, (unsigned)Hv, (unsigned)((Dv + GC_COLS - 1) / GC_COLS));
                launch_pdl(k_gdn_cscan<128>, g3, dim3(GC_THREADS), cscan_bytes<128>(), s, p, a, c0, c1);
            }
        });
        const int rec_cl = cs.len < GDN_CHUNK ? (int)cs.len : GDN_CHUNK;
        const double t_rec = time_ms([&] {
            dim3 gr((unsigned)p.n_items, (unsigned)Hv, (unsigned)((Dv + 8 * GDN_WARPS - 1) / (8 * GDN_WARPS)));
            launch_pdl(k_gdn_recur<16>, gr, dim3(32 * GDN_WARPS), gdn_smem(Dk, rec_cl), s, p, a, rec_cl);
        });
        printf("gdn %2d x %5lld tokens: per step %8.3f ms, chunked %8.3f ms; outputs differ by %.2e, state by %.2e of their"
               " largest, the conv's %s%s\n", cs.items, (long long)cs.len, ms[0], ms[1], dm, dsv,
               conv_same ? "bits equal" : "bits DIFFER", ok ? "" : "  FAILED");
        printf("    alone: conv %.3f ms, chunked conv %.3f, q/k norms %.3f, gated norm %.3f (%d warps a block %.3f),"
               " chunks' part %.3f, scan %.3f ms\n",
               t_conv, t_convc, t_qk, t_gn, (int)nw, t_gn8, t_prep, t_scan);
        printf("    the per-step rule alone %.3f ms: %.0f GB/s of its state read and written\n", t_rec,
               2.0 * rec_n * 4 / (t_rec * 1e-3) / 1e9);
        if (cs.len == 1) { /* a decode step's kernels (k_gdn_dec, and the fused one with the norms inside)
                              against the q/k norms, the per-step rule and the gated norm, from the same conv
                              outputs and random state */
            float *st0 = dev_floats((int64_t)rec_n, 7, -1.0f, 1.0f);
            dim3 gr((unsigned)p.n_items, (unsigned)Hv, (unsigned)((Dv + 8 * GDN_WARPS - 1) / (8 * GDN_WARPS)));
            auto norms_around = [&](auto rule) {
                launch_pdl(k_gdn_qknorm, dim3((unsigned)(T * Hk)), dim3(32), 0, s, a, (int64_t)T * Hk);
                rule();
                launch_pdl(k_gdn_gnorm, dim3((unsigned)(T * Hv)), dim3(32), 0, s, a, (int64_t)T * Hv);
            };
            auto recur = [&] { launch_pdl(k_gdn_recur<16>, gr, dim3(32 * GDN_WARPS), gdn_smem(Dk, 1), s, p, a, 1); };
            auto dec = [&] {
                launch_pdl(k_gdn_dec<16, 0>, dim3(gr.x, gr.y, (unsigned)((Dv + GDN_DEC_COLS - 1) / GDN_DEC_COLS)),
                           dim3(32 * GDN_DEC_WARPS), 0, s, p, a);
            };
            auto fused = [&] {
                launch_pdl(k_gdn_dec<16, 1>, dim3(gr.x, gr.y), dim3(32 * ((Dv + 15) / 16)), (size_t)Dv * 4, s, p, a);
            };
            const int64_t dunits = (int64_t)p.n_items * Hv;
            auto decs = [&] { /* the streamed one (k_gdn_decs), as the backend launches it */
                launch_pdl(k_gdn_decs<16>, dim3((unsigned)(dunits < mm_sms() ? dunits : mm_sms())), dim3(GDN_DS_THREADS),
                           gdn_decs_smem(Dk, Dv), s, p, a, gdn_decs_stages(Dk, Dv));
            };
            bool same = true, same_s = true;
            for (int k = 0; k < 4; k++) {
                a.mix = mix[k ? 1 : 0], a.rec_state = rec[k ? 1 : 0];
                CK(cudaMemcpy(a.rec_state, st0, rec_n * 4, cudaMemcpyDeviceToDevice));
                CK(cudaMemcpy(qkv, qkv_after[0], (size_t)T * cd * 4, cudaMemcpyDeviceToDevice));
                if (k == 0) norms_around(recur);
                else if (k == 1) norms_around(dec);
                else if (k == 2) fused();
                else norms_around(decs);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                const bool eq = k == 0 || (same_bits(mix[0], mix[1], (size_t)T * vd) && same_bits(rec[0], rec[1], rec_n));
                if (k == 3) same_s = eq;
                else same = same && eq;
            }
            bad |= !same || !same_s;
            const double t_three = time_ms([&] { norms_around(dec); }), t_fused = time_ms(fused);
            const double t_rule = time_ms(dec), t_decs = time_ms(decs), t_three_s = time_ms([&] { norms_around(decs); });
            printf("    a decode step's q/k norms, rule and gated norm: %.3f ms as three kernels (k_gdn_dec), %.3f ms fused"
                   " (%.0f GB/s of state); both %s the per-step rule's\n",
                   t_three, t_fused, 2.0 * rec_n * 4 / (t_fused * 1e-3) / 1e9, same ? "the same bits as" : "DIFFER from");
            printf("    the rule streamed (k_gdn_decs, %d stages): %.3f ms alone (%.0f GB/s of state) against k_gdn_dec's"
                   " %.3f (%.0f GB/s); %.3f ms with the norms; %s the per-step rule's\n",
                   gdn_decs_stages(Dk, Dv), t_decs, 2.0 * rec_n * 4 / (t_decs * 1e-3) / 1e9, t_rule,
                   2.0 * rec_n * 4 / (t_rule * 1e-3) / 1e9, t_three_s, same_s ? "the same bits as" : "DIFFERS from");
            { /* the conv inside too (k_gdn_dec<., 2>), from random windows: k_gdn_conv and the fused
                 kernel's outputs, state and windows (at any count of items: the counts here are the items') */
                float *w0 = dev_floats((int64_t)conv_n, 9, -1.0f, 1.0f), *wref;
                int32_t *cnt;
                CK(cudaMalloc(&wref, conv_n * 4));
                const size_t ncnt = (size_t)cs.items * Hk;
                CK(cudaMalloc(&cnt, ncnt * 4));
                CK(cudaMemset(cnt, 0, ncnt * 4));
                const dim3 gc((unsigned)p.n_items, (unsigned)((cd + CONV_THREADS - 1) / CONV_THREADS));
                auto conv_in = [&](int k) {
                    a.mix = mix[k], a.rec_state = rec[k];
                    CK(cudaMemcpy(conv_st, w0, conv_n * 4, cudaMemcpyDeviceToDevice));
                    CK(cudaMemcpy(qkv, qkv0, (size_t)T * cd * 4, cudaMemcpyDeviceToDevice));
                    CK(cudaMemcpy(a.rec_state, st0, rec_n * 4, cudaMemcpyDeviceToDevice));
                };
                auto with_conv = [&] {
                    launch_pdl(k_gdn_dec<16, 2>, dim3(gr.x, gr.y), dim3(32 * ((Dv + 15) / 16)), gdn_dec_conv_smem(Dk, Dv), s, p,
                               a);
                };
                conv_in(0);
                launch_pdl(k_gdn_conv, gc, dim3(CONV_THREADS), 0, s, p, a);
                fused();
                CK(cudaMemcpyAsync(wref, conv_st, conv_n * 4, cudaMemcpyDeviceToDevice, s));
                conv_in(1);
                a.counts = cnt;
                with_conv();
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                std::vector<int32_t> hc(ncnt);
                CK(cudaMemcpy(hc.data(), cnt, hc.size() * 4, cudaMemcpyDeviceToHost));
                bool zero = true;
                for (int32_t v : hc) zero = zero && v == 0;
                const bool same2 = same_bits(mix[0], mix[1], (size_t)T * vd) && same_bits(rec[0], rec[1], rec_n) &&
                                   same_bits(wref, conv_st, conv_n) && zero;
                bad |= !same2;
                const double t_conv1 = time_ms([&] { launch_pdl(k_gdn_conv, gc, dim3(CONV_THREADS), 0, s, p, a); });
                const double t_with = time_ms(with_conv);
                if (T <= QI_TP) { /* its QI form: the same outputs, and their limbs as k_qlimbs makes them from them */
                    const size_t qb = cu_qint_bytes(vd);
                    uint8_t *qa, *qc;
                    CK(cudaMalloc(&qa, qb));
                    CK(cudaMalloc(&qc, qb));
                    bool qsame = true;
                    for (int bits = 8; bits >= 4; bits -= 4) {
                        CK(cudaMemset(qa, 0, qb));
                        CK(cudaMemset(qc, 0, qb));
                        conv_in(1);
                        a.xq = qa, a.qgroup = 64, a.qbits = bits;
                        launch_pdl(k_gdn_dec<16, 2, true>, dim3(gr.x, gr.y), dim3(32 * ((Dv + 15) / 16)), gdn_dec_conv_smem(Dk, Dv),
                                   s, p, a);
                        a.xq = NULL;
                        launch_pdl(k_qlimbs, dim3((unsigned)((QI_TP * (vd / 64) + 7) / 8)), dim3(256), 0, s, (const float *)mix[0],
                                   (int64_t)vd, (int64_t)T, (int64_t)vd, 64, bits, qc);
                        CK(cudaStreamSynchronize(s));
                        CK(cudaGetLastError());
                        qsame = qsame && same_bits(mix[0], mix[1], (size_t)T * vd) && qi_same_limbs(qa, qc, qb, vd, 64, T);
                    }
                    bad |= !qsame;
                    printf("    its form making out_proj's limbs (QI, 8 and 4 bits, groups of 64): outputs and limbs %s\n",
                           qsame ? "the same bits as the others and k_qlimbs's" : "DIFFER  FAILED");
                    CK(cudaFree(qa));
                    CK(cudaFree(qc));
                }
                a.counts = NULL;
                printf("    with the conv inside: %.3f ms (the conv and the fused kernel %.3f ms); outputs, state and windows %s"
                       " k_gdn_conv's and the fused kernel's%s\n",
                       t_with, t_conv1 + t_fused, same2 ? "the same bits as" : "DIFFER from", zero ? "" : ", counts left NONZERO");
                CK(cudaFree(w0));
                CK(cudaFree(wref));
                CK(cudaFree(cnt));
            }
            CK(cudaFree(st0));
        }
        float *fr[] = {qkv0, z, bb, aa, conv_t, normw, qkv, mix[0], mix[1], rec[0], rec[1], conv_st, dtb, nea, ws,
                       qkv_after[0], qkv_after[1]};
        for (float *f : fr) CK(cudaFree(f));
        CK(cudaFree(d_t0));
        CK(cudaFree(d_slot));
        CK(cudaFree(d_ch));
        CK(cudaFree(d_ic));
    }
    printf("gdn: %s\n", bad ? "FAILED" : "chunked agrees with per step");
    return bad;
}

/* ---- a prompt's attention in `bf16`: k_attn_fw (wgmma) against k_attn_fa, both against exact ---- */

__global__ void k_floats_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const __nv_bfloat16 b = __float2bfloat16_rn(src[i]);
        dst[i] = *(const uint16_t *)&b;
    }
}

static int fabench(int reps) {
    const int nh = 24, nkv = 4, hd = 256, bs = 16; /* the 27B's attention layers; 16-position KV blocks */
    const struct { int items; int64_t len, pos0; int bf16kv; } cases[] = {
        {1, 8192, 0, 1}, {1, 2048, 0, 1}, {1, 1000, 0, 1}, {3, 300, 77, 1}, {1, 5, 0, 1}, {1, 2048, 0, 0}, {2, 129, 40, 0}};
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_attention_init(hd);
    if (cu_attn_fw_init(hd) != 0) {
        printf("fa: k_attn_fw does not run on this device\n");
        return 1;
    }
    int bad = 0;
    for (const auto &cs : cases) {
        const int64_t T = cs.items * cs.len, npos = cs.pos0 + cs.len, nb = (npos + bs - 1) / bs, NB = cs.items * nb;
        const int64_t pool_n = NB * 2 * nkv * bs * hd, mix_n = T * nh * hd;
        float *q = dev_floats(T * 2 * nh * hd, 11, -4.0f, 4.0f), *pool_f = dev_floats(pool_n, 12, -1.0f, 1.0f);
        uint16_t *pool_b = NULL;
        if (cs.bf16kv) {
            CK(cudaMalloc(&pool_b, (size_t)pool_n * 2));
            k_floats_to_bf16<<<1024, 256>>>(pool_f, pool_b, pool_n);
        }
        float *mix[4];
        for (int i = 0; i < 4; i++) CK(cudaMalloc(&mix[i], (size_t)mix_n * 4));
        /* items of len tokens from position pos0 (the positions before it as if cached), their
         * blocks in reverse order through the pool */
        std::vector<int64_t> t0(cs.items + 1), p0(cs.items, cs.pos0), bt0(cs.items + 1);
        std::vector<int32_t> blocks(NB);
        for (int i = 0; i <= cs.items; i++) t0[i] = i * cs.len, bt0[i] = i * nb;
        for (int64_t k = 0; k < NB; k++) blocks[k] = (int32_t)(NB - 1 - k);
        int64_t *d_t0 = dev_copy(t0), *d_p0 = dev_copy(p0), *d_bt0 = dev_copy(bt0);
        int32_t *d_blocks = dev_copy(blocks);
        cu_plan p = {};
        p.n_items = cs.items, p.n_tokens = T, p.item_t0 = d_t0, p.pos0 = d_p0, p.block_t0 = d_bt0, p.blocks = d_blocks;
        cu_kv kv = {};
        kv.base = cs.bf16kv ? (void *)pool_b : (void *)pool_f, kv.bf16 = cs.bf16kv, kv.block_size = bs, kv.nkv = nkv,
        kv.hd = hd, kv.n_full = 1;
        cu_attn_args a = {};
        a.q = q, a.nh = nh, a.nkv = nkv, a.hd = hd, a.li = 0, a.eps = 1e-6f;
        double flops = 0; /* the causal products' FLOPs */
        for (int64_t j = 0; j < cs.len; j++) flops += 4.0 * hd * nh * (double)(cs.pos0 + j + 1) * cs.items;
        double ms[4] = {0, 0, 0, 0};
        /* exact (k_attn_tc), k_attn_fa, k_attn_fw waiting for each chunk's P V, k_attn_fw with
         * P V running on into the next chunk (on an fp32 pool the same kernel) */
        for (int path = 0; path < 4; path++) {
            a.mix = mix[path], a.parts = path == 0 ? 3 : 1, a.fw = 0;
            for (int r = 0; r <= (path == 0 ? 0 : reps); r++) { /* the first untimed: its results compared */
                CK(cudaEventRecord(e0, s));
                if (path >= 2) {
                    if (fw_launch(s, &p, &a, &kv, path == 3) != 0) {
                        printf("fa: k_attn_fw refused the 27B's heads\n");
                        return 1;
                    }
                } else
                    cu_attention(s, &p, &a, &kv);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float tm;
                CK(cudaEventElapsedTime(&tm, e0, e1));
                if (r > 0 || path == 0) ms[path] += tm / (path == 0 ? 1 : reps);
            }
        }
        const double e_fa = rel_diff(mix[0], mix[1], mix_n), e_fw = rel_diff(mix[0], mix[2], mix_n);
        const double e_fa2 = rel_diff(mix[0], mix[3], mix_n);
        const double d = rel_diff(mix[1], mix[2], mix_n), d2 = rel_diff(mix[1], mix[3], mix_n);
        /* the bf16 kernels round the same operands (q, K, V, P) alike: they differ only in the
         * order of fp32 sums (and a weight rounded the other way where that moves it) */
        const bool ok = d <= 1e-3 && e_fw <= 1.25 * e_fa + 1e-4 && d2 <= 1e-3 && e_fa2 <= 1.25 * e_fa + 1e-4;
        bad |= !ok;
        printf("fa %d x %5lld from %3lld (%s pool): exact %8.3f ms; fa %7.3f ms %6.1f TFLOP/s, err %.2e; "
               "fw %7.3f ms %6.1f TFLOP/s, err %.2e, fa-fw %.2e; fw pva %7.3f ms %6.1f TFLOP/s, err %.2e, "
               "fa-fw %.2e %s\n",
               cs.items, (long long)cs.len, (long long)cs.pos0, cs.bf16kv ? "bf16" : "fp32", ms[0], ms[1],
               flops / ms[1] * 1e-9, e_fa, ms[2], flops / ms[2] * 1e-9, e_fw, d, ms[3], flops / ms[3] * 1e-9,
               e_fa2, d2, ok ? "ok" : "DIFFER");
        dev_free({mix[0], mix[1], mix[2], mix[3], q, pool_f, pool_b, d_t0, d_p0, d_bt0, d_blocks});
    }
    printf("fa: %s\n", bad ? "FAILED" : "k_attn_fw agrees with k_attn_fa");
    return bad ? 1 : 0;
}

/* ---- a decode step's attention split over the context: k_attn_ring against k_attn_split ----
 * The 27B's heads over a bf16 pool (16-position blocks in reverse order), one token an item at
 * the given positions: k_attn_tc (not split), k_attn_split and k_attn_ring, each in `exact`
 * (3 parts) and `bf16`; every output must be k_attn_tc's bits; times the two split ones (the
 * merge included) and the rate of the K and V they read. With the scratch a chunk short of
 * the step's, both take whole tiles (also checked). */
static int adbench(int reps) {
    const int nh = 24, nkv = 4, hd = 256, bs = 16;
    struct adcase { std::vector<int64_t> pos; int short_scratch; };
    const adcase cases[] = {{{127}, 0},  {{4095}, 0}, {{32767}, 0}, {std::vector<int64_t>(8, 4095), 0},
                            {std::vector<int64_t>(64, 127), 0}, {std::vector<int64_t>(64, 1023), 0},
                            {std::vector<int64_t>(16, 8191), 0}, {{77, 4000, 130, 0, 63, 64}, 0}, {{77, 4000, 130}, 1}};
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_attention_init(hd);
    const int depth = cu_attn_ring_init(hd);
    if (depth < 2) {
        printf("ad: k_attn_ring does not fit this device\n");
        return 1;
    }
    int bad = 0;
    for (const adcase &cs : cases) {
        const int items = (int)cs.pos.size();
        std::vector<int64_t> t0(items + 1), bt0(items + 1);
        int64_t NB = 0, chunks = 0;
        double bytes = 0;
        for (int i = 0; i < items; i++) {
            t0[i] = i, bt0[i] = NB;
            NB += cs.pos[i] / bs + 1, chunks += cs.pos[i] / CU_ATT_CH + 1;
            bytes += (double)(cs.pos[i] + 1) * nkv * hd * 2 * 2;
        }
        t0[items] = items, bt0[items] = NB;
        std::vector<int32_t> blocks(NB);
        for (int64_t k = 0; k < NB; k++) blocks[k] = (int32_t)(NB - 1 - k);
        const int64_t pool_n = NB * 2 * nkv * bs * hd, mix_n = (int64_t)items * nh * hd;
        float *q = dev_floats((int64_t)items * 2 * nh * hd, 21, -4.0f, 4.0f), *pool_f = dev_floats(pool_n, 22, -1.0f, 1.0f);
        uint16_t *pool_b;
        CK(cudaMalloc(&pool_b, (size_t)pool_n * 2));
        k_floats_to_bf16<<<1024, 256>>>(pool_f, pool_b, pool_n);
        CK(cudaFree(pool_f));
        float *split, *mix[4];
        CK(cudaMalloc(&split, cu_attn_split_floats(chunks, nh, hd) * 4));
        for (int i = 0; i < 4; i++) CK(cudaMalloc(&mix[i], (size_t)mix_n * 4));
        int64_t *d_t0 = dev_copy(t0), *d_p0 = dev_copy(cs.pos), *d_bt0 = dev_copy(bt0);
        int32_t *d_blocks = dev_copy(blocks);
        cu_plan p = {};
        p.n_items = items, p.n_tokens = items, p.item_t0 = d_t0, p.pos0 = d_p0, p.block_t0 = d_bt0, p.blocks = d_blocks;
        cu_kv kv = {};
        kv.base = pool_b, kv.bf16 = 1, kv.block_size = bs, kv.nkv = nkv, kv.hd = hd, kv.n_full = 1;
        for (int parts = 3; parts >= 1; parts -= 2) {
            cu_attn_args a = {};
            a.q = q, a.nh = nh, a.nkv = nkv, a.hd = hd, a.li = 0, a.eps = 1e-6f, a.parts = parts;
            double ms[4] = {0, 0, 0, 0};
            for (int path = 0; path < 2 + depth - 1; path++) { /* k_attn_tc, k_attn_split, k_attn_ring of depth 2, 3 */
                a.mix = mix[path], a.split = path ? split : NULL, a.split_chunks = chunks - cs.short_scratch;
                a.ring = path >= 2 ? path : 0;
                CK(cudaMemsetAsync(mix[path], 0xff, (size_t)mix_n * 4, s));
                cu_attention(s, &p, &a, &kv);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                if (path) ms[path] = 1e3 * time_launches(s, e0, e1, reps, 1, [&](int) { cu_attention(s, &p, &a, &kv); });
            }
            bool same = same_bits(mix[0], mix[1], mix_n) && same_bits(mix[0], mix[2], mix_n);
            if (depth >= 3) same = same && same_bits(mix[0], mix[3], mix_n);
            bad |= !same;
            printf("ad %2d items at %5lld..%5lld%s, %s: split %7.3f ms %5.0f GB/s, ring2 %7.3f ms %5.0f GB/s (%.2fx), "
                   "ring3 %7.3f ms %5.0f GB/s (%.2fx); %s\n",
                   items, (long long)*std::min_element(cs.pos.begin(), cs.pos.end()),
                   (long long)*std::max_element(cs.pos.begin(), cs.pos.end()), cs.short_scratch ? " (scratch short: whole tiles)" : "",
                   parts == 3 ? "exact" : "bf16 ", ms[1], bytes / ms[1] * 1e-6, ms[2], bytes / ms[2] * 1e-6, ms[1] / ms[2],
                   ms[3], ms[3] > 0 ? bytes / ms[3] * 1e-6 : 0.0, ms[3] > 0 ? ms[1] / ms[3] : 0.0,
                   same ? "k_attn_tc's bits" : "DIFFER  FAILED");
        }
        dev_free({mix[0], mix[1], mix[2], mix[3], split, q, pool_b, d_t0, d_p0, d_bt0, d_blocks});
    }
    printf("ad: %s\n", bad ? "FAILED" : "k_attn_ring gives k_attn_split's and k_attn_tc's bits");
    return bad ? 1 : 0;
}

/* ---- compact logit rows (sample.cu) against a host reference ---- */

static int topbench(int reps) {
    const int64_t V = 248320;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    int bad = 0;
    /* random rows with ties across segments; every segment alike (each one's top ties with
     * the others': more candidates left than the merge's threads); every logit equal */
    const struct { int n, kind; } cases[] = {{1, 0}, {64, 0}, {2, 1}, {2, 2}};
    for (const auto &cs : cases) {
        const int n = cs.n;
        std::vector<float> h((size_t)n * V);
        uint64_t x = 12345 + n;
        for (size_t i = 0; i < h.size(); i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = cs.kind == 0 ? 8.0f * ((float)(x >> 40) / 16777216.0f - 0.5f)
                   : cs.kind == 1 ? (float)((i % (size_t)V) % 8192) / 1024.0f : 0.5f;
        }
        if (cs.kind == 0)
            for (int r = 0; r < n; r++) /* ties across segments */
                for (int64_t i = 7; i < V; i += 9001) h[(size_t)r * V + i] = 3.9990234375f;
        h[5] = -1e30f;
        float *d;
        int32_t *rows;
        cu_logit_top *out;
        void *scratch;
        CK(cudaMalloc(&d, h.size() * 4));
        CK(cudaMalloc(&rows, n * 4));
        CK(cudaMalloc(&out, n * sizeof(cu_logit_top)));
        CK(cudaMalloc(&scratch, cu_logit_top_scratch(n, V)));
        std::vector<int32_t> hr(n);
        for (int r = 0; r < n; r++) hr[r] = n - 1 - r; /* rows in another order */
        CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(rows, hr.data(), n * 4, cudaMemcpyHostToDevice));
        cu_logit_tops(s, d, V, rows, n, scratch, out);
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        std::vector<cu_logit_top> ho(n);
        CK(cudaMemcpy(ho.data(), out, n * sizeof(cu_logit_top), cudaMemcpyDeviceToHost));
        double worst_lse = 0;
        int wrong = 0;
        for (int r = 0; r < n; r++) {
            const float *row = h.data() + (size_t)hr[r] * V;
            std::vector<int32_t> idx(V);
            for (int64_t i = 0; i < V; i++) idx[i] = (int32_t)i;
            std::partial_sort(idx.begin(), idx.begin() + CU_TOP_MAX, idx.end(), [&](int32_t a, int32_t b) {
                return row[a] > row[b] || (row[a] == row[b] && a < b);
            });
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
            for (int64_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
            const double lse = mx + log(sum);
            const cu_logit_top &t = ho[r];
            wrong += t.n != CU_TOP_MAX || t.finite != 1;
            for (int j = 0; j < CU_TOP_MAX && j < t.n; j++) wrong += t.id[j] != idx[j] || t.val[j] != row[idx[j]];
            const double e = fabs(t.lse - lse) / fabs(lse);
            worst_lse = e > worst_lse ? e : worst_lse;
        }
        const bool ok = wrong == 0 && worst_lse < 1e-12;
        bad |= !ok;
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; i++) cu_logit_tops(s, d, V, rows, n, scratch, out);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("top %2d rows of %lld%s: %d entries differ from the host's, lse within %.1e; %.1f us%s\n", n, (long long)V,
               cs.kind == 0 ? "" : cs.kind == 1 ? " (segments alike)" : " (all equal)", wrong, worst_lse, 1e3 * ms / reps,
               ok ? "" : "  FAILED");
        CK(cudaFree(d));
        CK(cudaFree(rows));
        CK(cudaFree(out));
        CK(cudaFree(scratch));
    }
    return bad;
}

/* ---- vp: k_mmvp's ring depth and residency on the 27B decode launches ----
 * The launches a 27B token makes (gate and up together, the four GDN in-projections, q/k/v,
 * the output projections, down, the LM head) at 1 to 8 tokens through k_mmvp of one tile a
 * block: the backend's pick (D6B3 or D5B4 by how evenly the tiles spread, launch_mmvp), ring
 * depths D and blocks an SM B, and the backend's other pick; GB/s of weights each, '*' where
 * the bits differ from the backend's; one token's launches summed. Exits 1 on a difference. */
template <int D, int B>
static void vp_launch(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    if (parts == 1) launch_mmvp_p<1, 1, D, B>(s, g, xs, ldxs, T);
    else launch_mmvp_p<3, 1, D, B>(s, g, xs, ldxs, T);
}
template <int D, int B>
static void vp_attr() {
    mmvp_attr<1, 1, D, B>();
    mmvp_attr<3, 1, D, B>();
}

static int vpbench(int reps) {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    vp_attr<4, 4>();
    vp_attr<6, 4>();
    vp_attr<8, 3>();
    enum { NV = 5, NT = 4 };
    static const char *vn[NV] = {"backend", "D4B4", "D6B4", "D8B3", "D5B4/D6B3"};
    const int Ts[NT] = {1, 2, 4, 8};
    double tot[2][NV][NT] = {{{0}}};
    bool all_same = true;
    const int64_t TM = 8;
    printf("k_mmvp (one tile a block) by ring depth D and blocks an SM B; GB/s of weights; * = not the backend's bits\n");
    printf("%-9s %2s %2s", "launch", "T", "P");
    for (int v = 0; v < NV; v++) printf(" %9s", vn[v]);
    printf("\n");
    for (const dec_launch &gr : k27_launches) {
        launch_bufs lb = launch_bufs_make(s, gr, TM, 2);
        const size_t bytes = lb.bytes;
        const int copies = lb.copies;
        const std::vector<uint16_t *> &wt = lb.wt;
        const std::vector<float *> &y = lb.y[0], &yref = lb.y[1];
        float *x = lb.x;
        uint16_t *xs = lb.xs;
        const int64_t ldxs = tiled_steps(gr.cols) * 32;
        for (int ti = 0; ti < NT; ti++) {
            const int64_t T = Ts[ti];
            for (int P = 1; P <= 3; P += 2) {
                if (P == 3 && T > 2) continue;
                launch_split(s, x, gr.cols, T, gr.cols, xs, ldxs, P);
                printf("%-9s %2lld %2d", gr.name, (long long)T, P);
                for (int v = 0; v < NV; v++) {
                    auto launch = [&](int c) {
                        mm_group g;
                        memset(&g, 0, sizeof g);
                        g.n = gr.n;
                        for (int i = 0; i < gr.n; i++) {
                            g.w[i] = {CU_FMT_BF16_TILED, 0, 0, 0, gr.rows[i], gr.cols, wt[(size_t)c * gr.n + i], NULL, NULL};
                            g.y[i] = y[i], g.ldy[i] = gr.rows[i];
                        }
                        switch (v) {
                        case 0: launch_mmvp(s, g, xs, ldxs, T, P); break;
                        case 1: vp_launch<4, 4>(s, g, xs, ldxs, T, P); break;
                        case 2: vp_launch<6, 4>(s, g, xs, ldxs, T, P); break;
                        case 3: vp_launch<8, 3>(s, g, xs, ldxs, T, P); break;
                        default: /* the backend's two, the other of the launch's */
                            if (mmvp_three(group_blocks(&g, 1)))
                                vp_launch<MMVP_D4, 4>(s, g, xs, ldxs, T, P);
                            else vp_launch<MMVP_D3, 3>(s, g, xs, ldxs, T, P);
                        }
                    };
                    for (int i = 0; i < gr.n; i++) CK(cudaMemsetAsync(y[i], 0xff, T * gr.rows[i] * 4, s));
                    launch(0);
                    CK(cudaStreamSynchronize(s));
                    CK(cudaGetLastError());
                    bool same = true;
                    for (int i = 0; i < gr.n; i++) {
                        if (v == 0) CK(cudaMemcpy(yref[i], y[i], T * gr.rows[i] * 4, cudaMemcpyDeviceToDevice));
                        else same = same && same_bits(y[i], yref[i], (size_t)(T * gr.rows[i]));
                    }
                    all_same = all_same && same;
                    const double sec = time_launches(s, e0, e1, reps, copies, launch);
                    printf(" %8.0f%s", bytes / sec / 1e9, same ? " " : "*");
                    tot[P / 2][v][ti] += sec * gr.per_token;
                }
                printf("\n");
            }
        }
        launch_bufs_free(lb);
    }
    printf("\none 27B token's launches, summed: ms\n");
    for (int pi = 0; pi < 2; pi++)
        for (int v = 0; v < NV; v++) {
            printf("P=%d %-5s", pi ? 3 : 1, vn[v]);
            for (int ti = 0; ti < NT; ti++)
                if (tot[pi][v][ti] > 0) printf("  T=%d %6.2f ms", Ts[ti], tot[pi][v][ti] * 1e3);
            printf("\n");
        }
    printf("vp: %s\n", all_same ? "every variant the backend's bits" : "BITS DIFFER");
    return all_same ? 0 : 1;
}

/* ---- bw: which way of reading memory reaches the most bandwidth ----
 * The products stream their weights; the copy kernel the bench measures sets the floor
 * they are held to. This times ways of reading one large buffer once, each its GB/s: the
 * grid-stride loads of k_read with U loads in flight a thread, blocks reading their own
 * contiguous ranges (with and without the L2's 256-byte prefetch hint), bulk copies into
 * shared memory on an mbarrier ring (cp.async.bulk, as TMA reads), and the copies. */
template <int HINT>
__device__ __forceinline__ uint4 bw_ld(const uint4 *p) {
    uint4 v;
    if (HINT)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    return v;
}

/* grid-stride, U loads a thread in flight */
template <int U, int HINT>
__global__ void k_bw_stride(const uint4 *p, int64_t n, unsigned *sink) {
    unsigned s = 0;
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * st < n; i += U * st) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = bw_ld<HINT>(p + i + u * st);
#pragma unroll
        for (int u = 0; u < U; u++) s ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += st) {
        const uint4 v = bw_ld<HINT>(p + i);
        s ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x12345678u) *sink = s;
}

/* block b reads its own contiguous range, U loads a thread in flight */
template <int U, int HINT>
__global__ void k_bw_chunk(const uint4 *p, int64_t n, unsigned *sink) {
    unsigned s = 0;
    const int64_t per = (n + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t i = b0 + threadIdx.x; i < b1; i += U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i + u * blockDim.x < b1 ? bw_ld<HINT>(p + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) s ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (s == 0x12345678u) *sink = s;
}

/* block b's contiguous range in stages of SB bytes, NS of them in flight by cp.async.bulk */
template <int SB, int NS>
__global__ void __launch_bounds__(128) k_bw_bulk(const uint8_t *p, int64_t nstages, unsigned *sink) {
    extern __shared__ __align__(128) uint8_t bw_sm[];
    __shared__ __align__(8) uint64_t bar[NS];
    const int64_t per = (nstages + gridDim.x - 1) / gridDim.x, s0 = blockIdx.x * per;
    const int64_t s1 = s0 + per < nstages ? s0 + per : nstages;
    const uint32_t sm = smem_u32(bw_sm), b = smem_u32(bar);
    if (threadIdx.x == 0) {
        for (int k = 0; k < NS; k++) mbar_init(b + 8 * k, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int64_t i) {
        const int k = (int)((i - s0) % NS);
        mbar_expect_tx(b + 8 * k, SB);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         sm + k * SB),
                     "l"(p + i * SB), "r"(SB), "r"(b + 8 * k)
                     : "memory");
    };
    if (threadIdx.x == 0)
        for (int64_t i = s0; i < s0 + NS && i < s1; i++) issue(i);
    unsigned s = 0;
    for (int64_t i = s0; i < s1; i++) {
        const int k = (int)((i - s0) % NS);
        mbar_wait(b + 8 * k, (int)(((i - s0) / NS) & 1));
        s ^= ((const unsigned *)(bw_sm + k * SB))[threadIdx.x];
        __syncthreads();
        if (threadIdx.x == 0 && i + NS < s1) issue(i + NS);
    }
    if (s == 0x12345678u) *sink = s;
}

template <int SB, int NS>
static void bw_bulk_run(cudaStream_t s, int blocks, const void *p, size_t bytes, unsigned *sink) {
    static bool set = false;
    if (!set) {
        CK(cudaFuncSetAttribute(k_bw_bulk<SB, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, SB * NS));
        set = true;
    }
    k_bw_bulk<SB, NS><<<blocks, 128, SB * NS, s>>>((const uint8_t *)p, (int64_t)(bytes / SB), sink);
}

static int bwbench(int reps) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MB, memory %.0f GB\n", prop.name, sms, prop.l2CacheSize >> 20,
           prop.totalGlobalMem / 1e9);
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    copy_bandwidth(s, e0, e1);
    const size_t bytes = (size_t)16 << 30;
    uint8_t *buf;
    unsigned *sink;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 1, bytes));
    const int64_t n = (int64_t)(bytes / 16);
    const uint4 *p = (const uint4 *)buf;
    struct run {
        const char *name;
        std::function<void()> go;
    };
    std::vector<run> runs;
    char nm[64];
    for (int bps : {1, 2, 4, 8}) {
        const int th = bps >= 4 ? 512 : 1024, g = sms * bps * (bps >= 4 ? 1 : 1);
        snprintf(nm, sizeof nm, "stride U1 %dx%d", bps, th);
        runs.push_back({strdup(nm), [=] { k_bw_stride<1, 0><<<g, th, 0, s>>>(p, n, sink); }});
        snprintf(nm, sizeof nm, "stride U4 %dx%d", bps, th);
        runs.push_back({strdup(nm), [=] { k_bw_stride<4, 0><<<g, th, 0, s>>>(p, n, sink); }});
        snprintf(nm, sizeof nm, "stride U4 L2:256 %dx%d", bps, th);
        runs.push_back({strdup(nm), [=] { k_bw_stride<4, 1><<<g, th, 0, s>>>(p, n, sink); }});
        snprintf(nm, sizeof nm, "chunk U4 %dx%d", bps, th);
        runs.push_back({strdup(nm), [=] { k_bw_chunk<4, 0><<<g, th, 0, s>>>(p, n, sink); }});
        snprintf(nm, sizeof nm, "chunk U8 L2:256 %dx%d", bps, th);
        runs.push_back({strdup(nm), [=] { k_bw_chunk<8, 1><<<g, th, 0, s>>>(p, n, sink); }});
    }
    runs.push_back({"k_read (mmv_bench's) 8x512", [=] { k_read<<<sms * 8, 512, 0, s>>>(p, n, sink); }});
    for (int bps : {1, 2, 4}) {
        snprintf(nm, sizeof nm, "bulk 16KBx8 %d/SM", bps);
        runs.push_back({strdup(nm), [=] { bw_bulk_run<16384, 8>(s, sms * bps, buf, bytes, sink); }});
        snprintf(nm, sizeof nm, "bulk 32KBx6 %d/SM", bps);
        if (bps <= 1) runs.push_back({strdup(nm), [=] { bw_bulk_run<32768, 6>(s, sms * bps, buf, bytes, sink); }});
        snprintf(nm, sizeof nm, "bulk 8KBx8 %d/SM", bps);
        runs.push_back({strdup(nm), [=] { bw_bulk_run<8192, 8>(s, sms * bps, buf, bytes, sink); }});
        snprintf(nm, sizeof nm, "bulk 4KBx16 %d/SM", bps);
        runs.push_back({strdup(nm), [=] { bw_bulk_run<4096, 16>(s, sms * bps, buf, bytes, sink); }});
    }
    printf("\nreading %.1f GB once (GB/s)\n", bytes / 1e9);
    for (const run &r : runs) {
        r.go();
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        const double sec = time_launches(s, e0, e1, reps, 1, [&](int) { r.go(); });
        printf("  %-28s %7.0f\n", r.name, bytes / sec / 1e9);
    }
    const size_t half = bytes / 2;
    const double sec = time_launches(s, e0, e1, reps, 1, [&](int) { CK(cudaMemcpyAsync(buf + half, buf, half, cudaMemcpyDeviceToDevice, s)); });
    printf("  %-28s %7.0f (read + written)\n", "cudaMemcpy device to device", 2.0 * half / sec / 1e9);
    CK(cudaFree(buf));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "bw")) return bwbench(argc > 2 ? atoi(argv[2]) : 10);
    if (argc > 1 && !strcmp(argv[1], "vp")) return vpbench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "top")) return topbench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "gdn")) return gdnbench(argc > 2 ? atoi(argv[2]) : 10);
    if (argc > 1 && !strcmp(argv[1], "fa")) return fabench(argc > 2 ? atoi(argv[2]) : 10);
    if (argc > 1 && !strcmp(argv[1], "ad")) return adbench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "sweep")) return sweep(argc > 2 ? atoi(argv[2]) : 10, argc > 3 ? argv[3] : NULL);
    if (argc > 5 && !strcmp(argv[1], "prof")) return prof(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]));
    if (argc > 6 && !strcmp(argv[1], "qprof"))
        return qprof(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (argc > 1 && !strcmp(argv[1], "q")) return qbench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "qi")) return qibench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "qv")) return qvbench(argc > 2 ? atoi(argv[2]) : 20);
    if (argc > 1 && !strcmp(argv[1], "wg")) return wgbench(argc > 2 ? atoi(argv[2]) : 10, argc > 3 ? argv[3] : NULL, argc > 4 ? atoi(argv[4]) : 16);
    if (argc > 1 && !strcmp(argv[1], "blas")) return blasbench(argc > 2 ? atoi(argv[2]) : 10, argc > 3 ? argv[3] : NULL);
    if (argc > 1 && !strcmp(argv[1], "blastune")) return blastune(argc > 2 ? atoi(argv[2]) : 5, argc > 3 ? argv[3] : NULL);
    if (argc > 1 && !strcmp(argv[1], "qs")) return qsbench(argc > 2 ? atoi(argv[2]) : 20, argc > 3 ? argv[3] : NULL);
    if (argc > 1 && !strcmp(argv[1], "ws")) return wsbench(argc > 2 ? atoi(argv[2]) : 20, argc > 3 ? argv[3] : NULL);
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t s;
    cudaEvent_t e0, e1;
    timing_open(&s, &e0, &e1);
    cu_mm_init();
    v_attr<4, 4, 4, 3, 1>();
    v_attr<4, 3, 3, 3, 2>();
    v_attr<6, 2, 6, 2, 2>();
    v_attr<2, 2, 2, 2, 4>(); /* four tiles a block: the activations' fragments serve four (9-16 tokens' L2 reads) */
    const double copy_bw = copy_bandwidth(s, e0, e1);
    const shape shapes[] = {{"mlp gate/up", 17408, 5120, 128}, {"mlp down", 5120, 17408, 64}, {"gdn qkv", 10240, 5120, 48},
                            {"gdn z", 6144, 5120, 48}, {"gdn out, attn o", 5120, 6144, 64},   {"attn q+gate", 12288, 5120, 16},
                            {"attn k, v", 1024, 5120, 32},      {"gdn b, a", 48, 5120, 96},    {"lm head", 248320, 5120, 1}};
    const int Ts[] = {1, 4, 8, 16, 64, 256};
    enum { NTS = 6 };
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    printf("\n%-15s %3s %2s", "shape", "T", "P");
    for (int v = 0; v < NV; v++) printf(" %12s", vname[v]);
    printf("   (GB/s of weights; * = the scratch and k_mma paths differ in a bit)\n");
    double tot[2][NV][NTS] = {{{0}}}; /* [P=1, 3] per T, summed over one 27B token's matrices */
    for (const shape &sh : shapes) {
        const size_t bytes = (size_t)sh.rows * sh.cols * 2, tbytes = cu_tiled_elems(sh.rows, sh.cols) * 2;
        const int copies = (int)((((size_t)1 << 30) + bytes - 1) / bytes);
        std::vector<uint16_t *> wd(copies), wtd(copies);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&wd[c], bytes));
            CK(cudaMalloc(&wtd[c], tbytes));
            cu_synth_fill(s, wd[c], bytes / 2, CU_SYNTH_BF16, 1234 + c, 0.05f);
            cu_tile_bf16(s, wd[c], sh.rows, sh.cols, wtd[c]);
        }
        const int64_t TM = 256;
        float *x, *y, *yref;
        uint16_t *xs;
        CK(cudaMalloc(&x, TM * sh.cols * 4));
        CK(cudaMalloc(&xs, cu_split_elems(TM, sh.cols) * 2));
        float *part;
        CK(cudaMalloc(&part, cu_mm_part_elems(TM, sh.rows) * 4));
        const cu_mm_scratch sc = {xs, TM, part, (int64_t)cu_mm_part_elems(TM, sh.rows)};
        CK(cudaMalloc(&y, TM * sh.rows * 4));
        CK(cudaMalloc(&yref, TM * sh.rows * 4));
        {
            std::vector<float> hx(TM * sh.cols);
            srand(7);
            for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        }
        for (int ti = 0; ti < NTS; ti++) {
            const int64_t T = Ts[ti];
            for (int P = 1; P <= 3; P += 2) {
                printf("%-15s %3lld %2d", sh.name, (long long)T, P);
                const int mode = P == 3 ? CU_MM_EXACT : CU_MM_BF16;
                for (int v = 0; v < NV; v++) {
                    const bool small = v == V_OLD || v == V_P1 || v == V_P2 || v == V_P3 || v == V_P4;
                    if ((v == V_READ && P == 1) || (v == V_FMA && T > 64) || (small && T > 16)) {
                        printf(" %12s", "");
                        continue;
                    }
                    auto launch = [&](int c) {
                        cu_mat wt = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, wtd[c], NULL, NULL};
                        cu_mat w = {2, 0, 0, 0, sh.rows, sh.cols, wd[c], NULL, NULL};
                        mm_group g;
                        g.n = 1, g.w[0] = wt, g.y[0] = y, g.ldy[0] = sh.rows, g.blk0[0] = 0;
                        const int64_t ldxs = tiled_steps(sh.cols) * 32;
                        if (small) launch_split(s, x, sh.cols, T, sh.cols, xs, ldxs, P);
                        switch (v) {
                        case V_MMV: cu_matmul(s, &wt, x, sh.cols, T, y, sh.rows, mode, &sc); break;
                        case V_OLD: v_old(s, g, xs, ldxs, T, P); break;
                        case V_P1: v_mmvp<4, 4, 4, 3, 1>(s, g, xs, ldxs, T, P); break;
                        case V_P2: v_mmvp<4, 3, 3, 3, 2>(s, g, xs, ldxs, T, P); break;
                        case V_P3: v_mmvp<6, 2, 6, 2, 2>(s, g, xs, ldxs, T, P); break;
                        case V_P4: v_mmvp<2, 2, 2, 2, 4>(s, g, xs, ldxs, T, P); break;
                        case V_MMA: cu_matmul(s, &wt, x, sh.cols, T, y, sh.rows, mode, NULL); break;
                        case V_FMA: cu_matmul(s, &w, x, sh.cols, T, y, sh.rows, CU_MM_FMA, NULL); break;
                        default: k_read<<<prop.multiProcessorCount * 8, 512, 0, s>>>((const uint4 *)wd[c], (int64_t)(bytes / 16), sink);
                        }
                    };
                    CK(cudaMemsetAsync(y, 0xff, TM * sh.rows * 4, s));
                    launch(0);
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(s));
                    bool same = true;
                    if (v == V_MMV) CK(cudaMemcpy(yref, y, T * sh.rows * 4, cudaMemcpyDeviceToDevice));
                    if (v != V_MMV && v != V_FMA && v != V_READ) same = same_bits(y, yref, (size_t)(T * sh.rows));
                    const double sec = time_launches(s, e0, e1, reps, copies, launch);
                    printf(" %11.0f%s", bytes / sec / 1e9, same ? " " : "*");
                    tot[P / 2][v][ti] += sec * sh.per_token;
                }
                printf("\n");
            }
        }
        for (int c = 0; c < copies; c++) {
            CK(cudaFree(wd[c]));
            CK(cudaFree(wtd[c]));
        }
        CK(cudaFree(x));
        CK(cudaFree(xs));
        CK(cudaFree(part));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    printf("\none 27B token's matrices, summed: ms (%% of the copy-bandwidth floor, 51.2 GB)\n");
    for (int pi = 0; pi < 2; pi++)
        for (int v = 0; v < NV; v++) {
            printf("P=%d %-12s", pi ? 3 : 1, vname[v]);
            for (int ti = 0; ti < NTS; ti++)
                if (tot[pi][v][ti] > 0)
                    printf("  T=%-2d %6.2f ms (%5.1f%%)", Ts[ti], tot[pi][v][ti] * 1e3, 100.0 * (51.2 / copy_bw) / tot[pi][v][ti]);
            printf("\n");
        }
    return 0;
}
