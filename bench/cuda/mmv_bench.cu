/* The CUDA backend's matrix products on the GPU, side by side (a development bench, not part
 * of strand; `make mmv-bench` builds it as build/mmv_bench when nvcc is there): every 27B shape at 1, 4,
 * 8, 16, 64 and 256 tokens, the tiled bf16 kernels (with the scratch: k_mmv up to 16 tokens,
 * k_gemm beyond; without: k_mma), the row-major CUDA-core kernel and a plain read of the same
 * bytes (the ceiling); GB/s of weights each (times T / 1000: TFLOP/s), whether the two tiled
 * paths give the same bits, and the time of one 27B token's matrices against the
 * copy-bandwidth floor. It includes the backend's kernels
 * (src/backend/cuda/kernels.cu), so it measures the code strand runs.
 *
 *   build/mmv_bench [reps]
 *   build/mmv_bench sweep [reps]     k_gemm's tile shapes at 32 to 2,048 tokens
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "backend/cuda/kernels.cu"

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

/* ---------------------------------------------------------------------------------------- */

struct shape {
    const char *name;
    int64_t rows, cols;
    int per_token; /* such matrices a 27B token reads */
};

/* the backend's paths: tiled with the split activations (k_mmv, up to 16 tokens), tiled
 * without (k_mma), row-major on CUDA cores, and the read ceiling */
enum { V_MMV, V_MMA, V_FMA, V_READ, NV };
static const char *vname[NV] = {"mmv/gemm", "tiled k_mma", "row fma", "read"};

/* ---- `mmv_bench sweep`: k_gemm's tile shapes side by side, at the token counts of batched
 * decode and prefill, each checked against the backend's own choice bit for bit ---- */
struct gemm_cfg {
    const char *name;
    void (*launch)(cu_stream, mm_group, const uint16_t *, int64_t, int64_t);
    void (*attr)(void);
};
#define GEMM_CFG(MTW, NT, WR, P)                                                                               \
    {#MTW "," #NT "," #WR, launch_gemm_p<MTW, NT, WR, P>, gemm_attr<MTW, NT, WR, P>}
static const gemm_cfg cfg1[] = {GEMM_CFG(4, 4, 2, 1), GEMM_CFG(1, 4, 4, 1), GEMM_CFG(2, 4, 4, 1),
                                GEMM_CFG(2, 8, 8, 1), GEMM_CFG(2, 8, 4, 1), GEMM_CFG(1, 8, 8, 1)};
static const gemm_cfg cfg3[] = {GEMM_CFG(4, 4, 2, 3), GEMM_CFG(1, 4, 4, 3), GEMM_CFG(2, 4, 4, 3),
                                GEMM_CFG(2, 8, 8, 3), GEMM_CFG(2, 8, 4, 3), GEMM_CFG(1, 8, 8, 3)};
enum { NCFG = sizeof cfg1 / sizeof cfg1[0] };

static int sweep(int reps) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cu_mm_init();
    for (int i = 0; i < NCFG; i++) cfg1[i].attr(), cfg3[i].attr();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"gate+up", 34816, 5120}, {"down", 5120, 17408}, {"gdn in", 16512, 5120}, {"out/o", 5120, 6144}, {"attn qkv", 14336, 5120}};
    const int64_t Ts[] = {32, 64, 128, 512, 2048};
    const int64_t TM = 2048;
    printf("k_gemm tile shapes (MTW,NT,WR: rows 16*MTW*WR, tokens 8*NT*(8/WR)); GB/s of weights | TFLOP/s; * differs in a bit\n");
    printf("%-9s %5s %2s", "shape", "T", "P");
    for (int i = 0; i < NCFG; i++) printf(" %15s", cfg1[i].name);
    printf("\n");
    for (const auto &sh : shapes) {
        const size_t bytes = (size_t)sh.rows * sh.cols * 2, tbytes = cu_tiled_elems(sh.rows, sh.cols) * 2;
        uint16_t *wd, *wt, *xs;
        float *x, *y, *yref;
        CK(cudaMalloc(&wd, bytes));
        CK(cudaMalloc(&wt, tbytes));
        cu_synth_fill(s, wd, bytes / 2, CU_SYNTH_BF16, 99, 0.05f);
        cu_tile_bf16(s, wd, sh.rows, sh.cols, wt);
        CK(cudaMalloc(&x, TM * sh.cols * 4));
        CK(cudaMalloc(&xs, cu_split_elems(TM, sh.cols) * 2));
        CK(cudaMalloc(&y, TM * sh.rows * 4));
        CK(cudaMalloc(&yref, TM * sh.rows * 4));
        {
            std::vector<float> hx(TM * sh.cols);
            srand(11);
            for (auto &v : hx) v = (float)rand() / RAND_MAX * 2.0f - 1.0f;
            CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        }
        const cu_mm_scratch sc = {xs, TM};
        const cu_mat w = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, wt, NULL, NULL};
        for (int64_t T : Ts)
            for (int P = 1; P <= 3; P += 2) {
                printf("%-9s %5lld %2d", sh.name, (long long)T, P);
                cu_matmul(s, &w, x, sh.cols, T, yref, sh.rows, P == 3 ? CU_MM_EXACT : CU_MM_BF16, &sc);
                const int64_t ldxs = tiled_steps(sh.cols) * 32;
                launch_split(s, x, sh.cols, T, sh.cols, xs, ldxs, P);
                mm_group g;
                g.n = 1, g.w[0] = w, g.y[0] = y, g.ldy[0] = sh.rows, g.blk0[0] = 0;
                for (int i = 0; i < NCFG; i++) {
                    const gemm_cfg &c = P == 3 ? cfg3[i] : cfg1[i];
                    CK(cudaMemsetAsync(y, 0xff, T * sh.rows * 4, s));
                    c.launch(s, g, xs, ldxs, T);
                    CK(cudaGetLastError());
                    std::vector<float> a(T * sh.rows), b(T * sh.rows);
                    CK(cudaMemcpy(a.data(), y, a.size() * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(b.data(), yref, b.size() * 4, cudaMemcpyDeviceToHost));
                    const bool same = !memcmp(a.data(), b.data(), a.size() * 4);
                    for (int r = 0; r < 2; r++) c.launch(s, g, xs, ldxs, T);
                    CK(cudaEventRecord(e0, s));
                    for (int r = 0; r < reps; r++) c.launch(s, g, xs, ldxs, T);
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    const double sec = ms * 1e-3 / reps;
                    printf(" %7.0f|%5.0f%s", bytes / sec / 1e9, 2.0 * sh.rows * sh.cols * T / sec / 1e12, same ? " " : "*");
                }
                printf("\n");
            }
        CK(cudaFree(wd));
        CK(cudaFree(wt));
        CK(cudaFree(x));
        CK(cudaFree(xs));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "sweep")) return sweep(argc > 2 ? atoi(argv[2]) : 10);
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cu_mm_init();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
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
    const double copy_bw = 2.0 * cb * 10 / (ms * 1e-3) / 1e9;
    printf("copy bandwidth %.0f GB/s (read + written)\n", copy_bw);
    CK(cudaFree(ca));
    CK(cudaFree(cbuf));
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
        const cu_mm_scratch sc = {xs, TM};
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
                    if ((v == V_READ && P == 1) || (v == V_FMA && T > 64)) {
                        printf(" %12s", "");
                        continue;
                    }
                    auto launch = [&](int c) {
                        cu_mat wt = {CU_FMT_BF16_TILED, 0, 0, 0, sh.rows, sh.cols, wtd[c], NULL, NULL};
                        cu_mat w = {2, 0, 0, 0, sh.rows, sh.cols, wd[c], NULL, NULL};
                        switch (v) {
                        case V_MMV: cu_matmul(s, &wt, x, sh.cols, T, y, sh.rows, mode, &sc); break;
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
                    if (v == V_MMA) {
                        std::vector<float> a(T * sh.rows), b(T * sh.rows);
                        CK(cudaMemcpy(a.data(), y, a.size() * 4, cudaMemcpyDeviceToHost));
                        CK(cudaMemcpy(b.data(), yref, b.size() * 4, cudaMemcpyDeviceToHost));
                        same = !memcmp(a.data(), b.data(), a.size() * 4);
                    }
                    for (int i = 0; i < 3; i++) launch(i % copies);
                    CK(cudaEventRecord(e0, s));
                    for (int i = 0; i < reps; i++) launch(i % copies);
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    const double sec = ms * 1e-3 / reps;
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
