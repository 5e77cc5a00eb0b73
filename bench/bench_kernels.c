/* ==== Micro-benchmark of the matmul kernels on real layer shapes ====
 *
 * build/bench/bench_kernels [-k set] [-t threads] [-m tokens] [-f bf16|f32|f16|q8|q4]
 *                           [-r rows] [-c cols] [-s seconds] [-C copies] [-P 0|1 packed]
 *                           [-H 0|1 huge pages for packed copies, default 1]
 * Times y = W x for a random matrix (default the 0.8B MLP up projection, 3584 x 1024) on
 * every available kernel set (or one), split over threads by rows as the forward pass does,
 * and prints GFLOP/s and the weight bytes streamed per second. Weights larger than the
 * caches (default: enough copies to pass 512 MiB, -C to choose) so decode numbers are DRAM
 * numbers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "core/numeric.h"
#include "core/threadpool.h"
#include "kernels/kernels.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng = 1234567;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

typedef struct job {
    const st_kernels *k;
    const st_matrix *w;
    const float *x;
    int64_t m;
    float *y;
    float **scratch;
} job;

static void job_fn(void *ctx, int tid, int n) {
    job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->w->rows, n, tid, 16, &lo, &hi);
    j->k->matmul(j->w, j->x, j->w->cols, j->m, j->y, j->w->rows, lo, hi, j->scratch[tid]);
}

static void make(st_matrix *w, const char *fmt, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    int64_t n = rows * cols;
    if (!strcmp(fmt, "f32")) {
        float *d = aligned_alloc(64, (size_t)n * 4 + 64);
        for (int64_t i = 0; i < n; i++) d[i] = frand();
        w->fmt = ST_WFMT_F32;
        w->data = d;
    } else if (!strcmp(fmt, "bf16") || !strcmp(fmt, "f16")) {
        uint16_t *d = malloc((size_t)n * 2);
        int bf = !strcmp(fmt, "bf16");
        for (int64_t i = 0; i < n; i++) d[i] = bf ? st_f32_to_bf16(frand()) : st_f32_to_f16(frand());
        w->fmt = bf ? ST_WFMT_BF16 : ST_WFMT_F16;
        w->data = d;
    } else {
        int bits = atoi(fmt + 1);
        uint32_t *d = malloc((size_t)(n * bits / 32) * 4);
        for (int64_t i = 0; i < n * bits / 32; i++) d[i] = (uint32_t)(frand() * 4e9f);
        int64_t ng = n / 64;
        uint16_t *s = malloc((size_t)ng * 2), *b = malloc((size_t)ng * 2);
        for (int64_t i = 0; i < ng; i++) {
            s[i] = st_f32_to_bf16(frand() * 0.01f);
            b[i] = st_f32_to_bf16(frand() * 0.1f);
        }
        w->fmt = ST_WFMT_AFFINE;
        w->bits = bits;
        w->group = 64;
        w->sdtype = ST_DTYPE_BF16;
        w->data = d;
        w->scales = s;
        w->biases = b;
    }
}

int main(int argc, char **argv) {
    const char *only = NULL, *fmt = "bf16";
    int threads = st_default_threads();
    int64_t m = 1, rows = 3584, cols = 1024;
    double secs = 1.0;
    int copies_opt = 0, pack = 0, huge = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-k")) only = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-m")) m = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-f")) fmt = argv[i + 1];
        else if (!strcmp(argv[i], "-r")) rows = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-c")) cols = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-C")) copies_opt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-P")) pack = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-H")) huge = atoi(argv[i + 1]);
    }
    st_matrix w0;
    make(&w0, fmt, rows, cols);
    size_t wbytes = st_matrix_bytes(&w0);
    int copies = (int)((512u << 20) / wbytes) + 1;
    if (m > 16) copies = 1; /* prefill: compute-bound, keep the weights warm */
    if (copies_opt > 0) copies = copies_opt;
    st_matrix *ws = malloc((size_t)copies * sizeof *ws);
    ws[0] = w0;
    for (int c = 1; c < copies; c++) make(&ws[c], fmt, rows, cols);
    /* -P 1: the packed copy the model would make (for sets that read it) */
    for (int c = 0; c < copies && pack; c++) {
        const unsigned can = st_matrix_packs_possible(&ws[c]);
        const st_wpack kind = (can & ST_WPACK_BIT(ST_WPACK_BF16_V16))  ? ST_WPACK_BF16_V16
                              : (can & ST_WPACK_BIT(ST_WPACK_Q8_V16)) ? ST_WPACK_Q8_V16
                                                                      : ST_WPACK_NONE;
        if (kind == ST_WPACK_NONE) break;
        const size_t pb = st_matrix_pack_bytes(&ws[c], kind);
        void *pk = huge ? st_big_alloc_huge(pb) : st_big_alloc(pb); /* as the model's */
        st_matrix_pack(&ws[c], kind, pk, 0, rows);
        ws[c].pack = kind;
        ws[c].packed = pk;
    }
    float *x = aligned_alloc(64, (size_t)(m * cols) * 4 + 64), *y = malloc((size_t)(m * rows) * 4);
    for (int64_t i = 0; i < m * cols; i++) x[i] = frand();
    st_pool *pool = NULL;
    st_error err = {0};
    if (st_pool_create(threads, &pool, &err) != ST_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float **scr = malloc((size_t)threads * sizeof *scr);
    for (int t = 0; t < threads; t++)
        scr[t] = aligned_alloc(64, (size_t)st_kernels_matmul_scratch(cols) * 4 + 64);
    printf("%s [%lld x %lld] x %lld tokens, %d threads, %d copies of %.1f MB\n", fmt,
           (long long)rows, (long long)cols, (long long)m, threads, copies, wbytes / 1e6);
    const char *const *names = st_kernels_names();
    for (int i = 0; names[i]; i++) {
        const st_kernels *k = st_kernels_by_name(names[i]);
        if (!k || (only && strcmp(only, names[i]))) continue;
        if (k == st_kernels_ref() && !only) continue;
        job j = {k, NULL, x, m, y, scr};
        long iters = 0;
        double t0 = now_s(), c0 = cpu_s(), t, best = 1e30;
        do {
            j.w = &ws[iters % copies];
            double a = now_s();
            st_pool_run(pool, job_fn, &j);
            double b = now_s() - a;
            if (b < best) best = b;
            iters++;
            t = now_s() - t0;
        } while (t < secs);
        double per = t / (double)iters, cpu = (cpu_s() - c0) / (double)iters;
        const double flop = 2.0 * (double)rows * (double)cols * (double)m;
        printf("  %-11s mean %8.3f ms %7.1f GFLOP/s %6.2f GB/s | best %8.3f ms %7.1f GFLOP/s %6.2f GB/s"
               " | %.1f GFLOP per CPU-s\n",
               names[i], per * 1e3, flop / per / 1e9, (double)wbytes / per / 1e9, best * 1e3,
               flop / best / 1e9, (double)wbytes / best / 1e9, flop / cpu / 1e9);
    }
    st_pool_destroy(pool);
    return 0;
}
