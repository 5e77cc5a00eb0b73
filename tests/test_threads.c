/* ==== The thread pool and the threaded forward pass ====
 * - st_pool_run calls every thread exactly once per run, the caller as thread 0, for many
 *   runs in a row (also after the workers went to sleep), and pools of 1..5 threads;
 * - st_split_range covers [0, n) exactly with aligned boundaries; so does st_balance_split,
 *   whose shares follow the speeds st_balance_update measures (a thread half as fast gets
 *   a third, a stalled one keeps a floor, untimeable runs change nothing);
 * - the forward pass gives the same bits with 1, 2 and 3 threads (prefill, decode of a
 *   batch, and a decode past 512 positions where attention is split over the threads), on
 *   every kernel set this CPU runs (every region forced onto the pool);
 * - STRAND_THREADS sets the thread count (read by apps/ and the tests; library code reads none).
 * Prints the measured cost of an empty parallel region (information only). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/balance.h"
#include "core/threadpool.h"
#include "model/forward.h"
#include "kit.h"
#include "tap.h"

typedef struct count_ctx {
    atomic_int calls[8];
    atomic_int bad;
} count_ctx;

static void count_fn(void *ctx, int tid, int n) {
    count_ctx *c = ctx;
    if (tid < 0 || tid >= n || n > 8) atomic_fetch_add(&c->bad, 1);
    else atomic_fetch_add(&c->calls[tid], 1);
}

static void noop_fn(void *ctx, int tid, int n) {
    (void)ctx;
    (void)tid;
    (void)n;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_pool(void) {
    for (int n = 1; n <= 5; n++) {
        st_pool *p = NULL;
        st_error err = {0};
        if (!CHECK(st_pool_create(n, &p, &err) == ST_OK, "pool of %d threads starts (%s)", n, err.msg))
            continue;
        count_ctx c;
        memset(&c, 0, sizeof c);
        const int runs = 2000;
        for (int r = 0; r < runs; r++) {
            st_pool_run(p, count_fn, &c);
            if (r == 1000) usleep(20000); /* let the workers fall asleep once */
        }
        int ok = atomic_load(&c.bad) == 0 && st_pool_size(p) == n;
        for (int i = 0; i < n; i++) ok &= atomic_load(&c.calls[i]) == runs;
        CHECK(ok, "pool of %d: %d runs call each thread exactly once per run", n, runs);
        if (n == 2) {
            double t0 = now_s();
            for (int r = 0; r < 20000; r++) st_pool_run(p, noop_fn, NULL);
            printf("# empty parallel region with 2 threads: %.2f us\n", (now_s() - t0) / 20000 * 1e6);
        }
        st_pool_destroy(p);
    }
    st_pool_destroy(NULL);
    st_pool *p = NULL;
    st_error err = {0};
    CHECK(st_pool_create(0, &p, &err) == ST_ERR_ARG && p == NULL,
          "a pool of 0 threads is refused (%s)", err.msg);
}

static void test_split(void) {
    int ok = 1;
    for (int64_t n = 0; n < 200; n += 7)
        for (int parts = 1; parts <= 6; parts++)
            for (int64_t al = 1; al <= 32; al *= 4) {
                int64_t expect = 0;
                for (int i = 0; i < parts; i++) {
                    int64_t lo, hi;
                    st_split_range(n, parts, i, al, &lo, &hi);
                    ok &= lo == expect && hi >= lo && hi <= n && (lo % al == 0 || lo == n);
                    expect = hi;
                }
                ok &= expect == n;
            }
    CHECK(ok, "st_split_range partitions [0, n) in order with aligned boundaries");
}

/* parts of threads 0..b->n-1 cover [0, n) in order, aligned; returns 1 if so */
static int balance_covers(const st_balance *b, int64_t n, int64_t al) {
    int ok = 1;
    int64_t expect = 0;
    for (int i = 0; i < b->n; i++) {
        int64_t lo, hi;
        st_balance_split(b, n, i, al, &lo, &hi);
        ok &= lo == expect && hi >= lo && hi <= n && (lo % al == 0 || lo == n);
        expect = hi;
    }
    return ok && expect == n;
}

static void test_balance(void) {
    st_balance b;
    int ok = 1;
    for (int n_th = 1; n_th <= 5; n_th++) {
        st_balance_init(&b, n_th);
        for (int64_t n = 0; n < 300; n += 13)
            for (int64_t al = 1; al <= 16; al *= 4) ok &= balance_covers(&b, n, al);
    }
    CHECK(ok, "st_balance_split with equal speeds partitions [0, n) in order, aligned");
    st_balance_init(&b, 2);
    int64_t lo, hi;
    st_balance_split(&b, 1024, 0, 16, &lo, &hi);
    CHECK(lo == 0 && hi == 512, "equal speeds split 1024 rows 512 / 512 (got [%lld, %lld))",
          (long long)lo, (long long)hi);
    /* thread 1 takes twice as long per unit of work: its share goes to 1/3 */
    for (int r = 0; r < 200; r++) {
        st_balance_split(&b, 3072, 0, 16, &lo, &hi);
        double w[2] = {(double)(hi - lo), (double)(3072 - hi)};
        double s[2] = {w[0] * 1e-6, w[1] * 2e-6};
        st_balance_update(&b, w, s);
    }
    st_balance_split(&b, 3072, 0, 16, &lo, &hi);
    CHECK(hi >= 2048 - 32 && hi <= 2048 + 32,
          "a thread half as fast ends with a third of the rows (thread 0 has %lld of 3072)",
          (long long)hi);
    ok = 1;
    for (int64_t n = 0; n < 300; n += 13) ok &= balance_covers(&b, n, 16);
    CHECK(ok, "unequal shares still partition [0, n) in order, aligned");
    /* a thread stalled for a long time keeps at least a quarter of an equal share */
    for (int r = 0; r < 500; r++) {
        double w[2] = {1000, 1000}, s[2] = {1e-3, 10.0};
        st_balance_update(&b, w, s);
    }
    st_balance_split(&b, 4096, 1, 1, &lo, &hi);
    CHECK(hi - lo >= 4096 / 8 - 2, "a stalled thread keeps a quarter of an equal share (%lld of 4096)",
          (long long)(hi - lo));
    /* runs too short to time, or with one thread idle, teach nothing */
    st_balance_init(&b, 2);
    double w1[2] = {100, 100}, s1[2] = {1e-7, 1e-6};
    double w2[2] = {100, 0}, s2[2] = {1e-3, 0};
    st_balance_update(&b, w1, s1);
    st_balance_update(&b, w2, s2);
    st_balance_split(&b, 1024, 0, 16, &lo, &hi);
    CHECK(hi == 512, "untimeable runs and one-sided runs leave the split equal (%lld)", (long long)hi);
}

/* prefill two prompts, decode a batch; returns all logits produced (malloc'ed) */
static float *run_model(const st_model *m, const st_kernels *k, int threads, int64_t ctx,
                        int prompt_len, int steps, int64_t *n_out) {
    const int64_t V = m->cfg.vocab_size;
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = 3;
    cp.max_seq_len = ctx;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    st_error err = {0};
    st_cpu_params bp = kit_cpu_params();
    bp.n_threads = threads;
    bp.kernels = k;
    bp.min_parallel_work = 1; /* every region on the pool, even for tiny models */
    int64_t rows = 3 + 4 * (int64_t)steps;
    float *all = calloc((size_t)(rows * V), sizeof(float));
    int32_t *toks = malloc((size_t)prompt_len * sizeof(int32_t));
    for (int i = 0; i < prompt_len; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
    st_status st = st_cache_create(m, &cp, &c, &err);
    if (st == ST_OK && !(be = kit_backend(m, &bp, &err))) st = ST_ERR_ARG;
    if (st == ST_OK) st = kit_fwd(be, c, prompt_len, &f, &err);
    st_seq s[3];
    for (int i = 0; i < 3; i++) {
        s[i].slot = -1;
        if (st == ST_OK) st = st_cache_seq_start(c, &s[i], &err);
    }
    int64_t row = 0;
    for (int i = 0; i < 3 && st == ST_OK; i++) {
        st_batch_item it = {&s[i], toks, prompt_len - 5 * i, ST_LOGITS_LAST};
        st = st_batch_run(c, f, &it, 1, all + row * V, &err);
        row++;
    }
    for (int step = 0; step < steps && st == ST_OK; step++) {
        st_batch_item its[3];
        int32_t ids[3];
        for (int i = 0; i < 3; i++) {
            ids[i] = (int32_t)((step * 13 + i * 101) % V);
            its[i] = (st_batch_item){&s[i], &ids[i], 1, ST_LOGITS_LAST};
        }
        st = st_batch_run(c, f, its, 3, all + row * V, &err);
        row += 3;
    }
    /* one sequence alone: fewer attention tasks than threads, so its chunks are split */
    for (int step = 0; step < steps && st == ST_OK; step++) {
        int32_t id = (int32_t)((step * 7 + 3) % V);
        st_batch_item it = {&s[0], &id, 1, ST_LOGITS_LAST};
        st = st_batch_run(c, f, &it, 1, all + row * V, &err);
        row++;
    }
    if (st != ST_OK) printf("# run failed: %s\n", err.msg);
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_backend_destroy(be);
    free(toks);
    *n_out = st == ST_OK ? row * V : -1;
    return all;
}

static void test_forward_threads(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    const char *const *names = st_kernels_names();
    for (int i = 0; names[i]; i++) {
        const st_kernels *k = st_kernels_by_name(names[i]);
        if (!k || (k == st_kernels_ref() && strcmp(dir, "tiny-a") != 0)) continue;
        /* a long prompt (past one 512-position attention chunk) then decode steps */
        int64_t n1, n2, n3;
        double t0 = now_s();
        float *a = run_model(m, k, 1, 600, 530, 3, &n1);
        double t1 = now_s();
        float *b = run_model(m, k, 2, 600, 530, 3, &n2);
        double t2 = now_s();
        float *c = run_model(m, k, 3, 600, 530, 3, &n3);
        printf("# %s %s: %.2f s with 1 thread, %.2f s with 2, %.2f s with 3\n", dir, names[i],
               t1 - t0, t2 - t1, now_s() - t2);
        CHECK(n1 > 0 && n1 == n2 && n1 == n3 && memcmp(a, b, (size_t)n1 * 4) == 0 &&
                  memcmp(a, c, (size_t)n1 * 4) == 0,
              "%s %s: 1, 2 and 3 threads give identical logits (530-token prefill, batched and split decode)",
              dir, names[i]);
        free(a);
        free(b);
        free(c);
    }
    st_model_free(m);
}

int main(void) {
    test_pool();
    test_split();
    test_balance();
    setenv("STRAND_THREADS", "3", 1);
    CHECK(kit_cpu_params().n_threads == 3 && st_threads_parse("3") == 3,
          "STRAND_THREADS=3 sets the thread count (read by apps/ and tests, parsed by st_threads_parse)");
    setenv("STRAND_THREADS", "junk", 1);
    CHECK(kit_cpu_params().n_threads == 0 && st_default_threads() >= 1,
          "a bad STRAND_THREADS falls back to the CPU count");
    unsetenv("STRAND_THREADS");
    test_forward_threads("tiny-a");
    test_forward_threads("tiny-b/mlx-q8");
    return tap_done();
}
