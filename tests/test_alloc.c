/* ==== A decode step allocates nothing ====
 * This program replaces malloc/calloc/realloc/aligned allocators with alloc_counting wrappers
 * around glibc's, then runs decode steps (and mixed prefill + decode steps) of several
 * models over a batch of sequences and checks that not one heap allocation happened. */
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "model/forward.h"
#include "tap.h"

#include "alloc_count.h"

/* pooled: 3 threads with every parallel region on the pool (tiny models would otherwise run
 * their small regions on the caller) */
static void run(const char *dir, int pooled) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    enum { NS = 4, STEPS = 300 };
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = NS + 1;
    cp.max_seq_len = 512;
    st_status st = st_cache_create(m, &cp, &c, &err);
    st_cpu_params bp = kit_cpu_params();
    if (pooled) {
        bp.n_threads = 3;
        bp.min_parallel_work = 1;
    }
    if (st == ST_OK && !(be = kit_backend(m, &bp, &err))) st = ST_ERR_ARG;
    if (st == ST_OK) st = kit_fwd(be, c, 64, &f, &err);
    st_seq seqs[NS + 1];
    int32_t toks[NS + 1][32];
    for (int i = 0; i <= NS; i++) {
        seqs[i].slot = -1;
        for (int j = 0; j < 32; j++) toks[i][j] = (int32_t)((i * 31 + j * 7) % 1000);
        if (st == ST_OK && i < NS) st = st_cache_seq_start(c, &seqs[i], &err);
    }
    float *logits = malloc((size_t)(NS + 1) * (size_t)m->cfg.vocab_size * sizeof(float));
    st_batch_item items[NS + 1];
    for (int i = 0; i < NS && st == ST_OK; i++) { /* prefill, different lengths */
        items[0] = (st_batch_item){&seqs[i], toks[i], 5 + 3 * i, ST_LOGITS_LAST};
        st = st_batch_run(c, f, items, 1, logits, &err);
    }
    if (!CHECK(st == ST_OK, "%s: prefill (%s)", dir, err.msg)) goto out;
    alloc_count = 0;
    alloc_counting = 1;
    for (int s = 0; s < STEPS && st == ST_OK; s++) {
        for (int i = 0; i < NS; i++)
            items[i] = (st_batch_item){&seqs[i], &toks[i][s % 32], 1, ST_LOGITS_LAST};
        st = st_batch_run(c, f, items, NS, logits, &err);
    }
    alloc_counting = 0;
    CHECK(st == ST_OK && alloc_count == 0, "%s%s: %d decode steps of %d sequences: %ld heap allocations",
          dir, pooled ? " (3 threads)" : "", STEPS, NS, alloc_count);
    /* a step mixing a new sequence's prefill chunk with decode tokens, and the sequence
     * ending and its slot being reused, also allocates nothing */
    alloc_count = 0;
    alloc_counting = 1;
    for (int round = 0; round < 3 && st == ST_OK; round++) {
        st = st_cache_seq_start(c, &seqs[NS], &err);
        for (int i = 0; i < NS; i++) items[i] = (st_batch_item){&seqs[i], &toks[i][round], 1, ST_LOGITS_LAST};
        items[NS] = (st_batch_item){&seqs[NS], toks[NS], 20, ST_LOGITS_LAST};
        if (st == ST_OK) st = st_batch_run(c, f, items, NS + 1, logits, &err);
        st_cache_seq_release(c, &seqs[NS]);
    }
    alloc_counting = 0;
    CHECK(st == ST_OK && alloc_count == 0,
          "%s%s: mixed prefill+decode steps with slot reuse: %ld heap allocations (%s)", dir,
          pooled ? " (3 threads)" : "", alloc_count, err.msg);
out:
    free(logits);
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_backend_destroy(be);
    st_model_free(m);
}

/* The CUDA backend: not one device allocation and no change in free device memory over
 * 20,000 decode steps, the free memory sampled every 1,000 (the soak issue 14 asks for; the
 * failure strand answers was a GPU object limit hit after 264 s of decoding). Skipped without
 * a GPU. */
static void run_cuda(const char *dir) {
    char why[512] = "";
    if (!st_cuda_available(NULL, why, sizeof why)) {
        printf("# %s on CUDA: skipped here: %s\n", dir, why);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    enum { NS = 4, STEPS = 20000, SAMPLE = 1000 };
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = NS;
    cp.max_seq_len = STEPS + 64;
    st_status st = st_cache_create(m, &cp, &c, &err);
    if (st == ST_OK) st = st_backend_cuda_create(m, NULL, &be, &err);
    if (st == ST_OK) st = kit_fwd(be, c, 64, &f, &err);
    st_seq seqs[NS];
    int32_t toks[NS][32];
    for (int i = 0; i < NS; i++) {
        seqs[i].slot = -1;
        for (int j = 0; j < 32; j++) toks[i][j] = (int32_t)((i * 31 + j * 7) % 1000);
        if (st == ST_OK) st = st_cache_seq_start(c, &seqs[i], &err);
    }
    float *logits = malloc((size_t)NS * (size_t)m->cfg.vocab_size * sizeof(float));
    st_batch_item items[NS];
    for (int i = 0; i < NS && st == ST_OK; i++) {
        items[0] = (st_batch_item){&seqs[i], toks[i], 5 + 3 * i, ST_LOGITS_LAST};
        st = st_batch_run(c, f, items, 1, logits, &err);
    }
    if (!CHECK(st == ST_OK, "%s on CUDA: prefill (%s)", dir, err.msg)) goto out;
    const int64_t allocs = st_backend_cuda_device_allocs(be);
    size_t free_pre, free0, free1, total;
    st_backend_cuda_memory(be, &free_pre, &total);
    /* the first decode step of a batch size is captured as a CUDA graph (once) */
    int64_t cap0, launch0, cap1, launch1;
    for (int s = 0; s < 2 && st == ST_OK; s++) {
        for (int i = 0; i < NS; i++) items[i] = (st_batch_item){&seqs[i], &toks[i][s % 32], 1, ST_LOGITS_LAST};
        st = st_batch_run(c, f, items, NS, logits, &err);
    }
    st_backend_cuda_memory(be, &free0, &total);
    st_bctx_cuda_graphs(st_fwd_ctx(f), &cap0, &launch0);
    size_t free_lo = free0, free_hi = free0; /* the samples' range */
    for (int s = 2; s < STEPS && st == ST_OK; s++) {
        for (int i = 0; i < NS; i++) items[i] = (st_batch_item){&seqs[i], &toks[i][s % 32], 1, ST_LOGITS_LAST};
        st = st_batch_run(c, f, items, NS, logits, &err);
        if (s % SAMPLE == 0) {
            size_t fr, tt;
            st_backend_cuda_memory(be, &fr, &tt);
            free_lo = fr < free_lo ? fr : free_lo;
            free_hi = fr > free_hi ? fr : free_hi;
        }
    }
    st_backend_cuda_memory(be, &free1, &total);
    CHECK(st == ST_OK && st_backend_cuda_device_allocs(be) == allocs && free1 == free0 && free_lo == free0 &&
              free_hi == free0,
          "%s on CUDA: %d decode steps of %d sequences: %lld device allocations, free device memory %zu -> %zu bytes, "
          "every %d steps within [%zu, %zu] (%s)",
          dir, STEPS, NS, (long long)(st_backend_cuda_device_allocs(be) - allocs), free0, free1, SAMPLE, free_lo,
          free_hi, err.msg);
    st_bctx_cuda_graphs(st_fwd_ctx(f), &cap1, &launch1);
    if (m->cfg.is_moe) /* routing on the host syncs: MoE steps run eagerly */
        CHECK(cap1 == 0 && launch1 == 0, "%s on CUDA: MoE decode steps run eagerly (%lld graphs)", dir, (long long)cap1);
    else
        CHECK(cap0 == 1 && cap1 == 1 && launch1 - launch0 == STEPS - 2,
              "%s on CUDA: the decode step was captured once as a graph (%lld) and replayed %lld times after; the "
              "capture took %lld bytes of device memory",
              dir, (long long)cap1, (long long)(launch1 - launch0), (long long)free_pre - (long long)free0);
out:
    free(logits);
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_backend_destroy(be);
    st_model_free(m);
}

int main(void) {
    /* the counter itself works (including allocations made inside libraries) */
    alloc_count = 0;
    alloc_counting = 1;
    static void *volatile sink[2]; /* escapes, so no compiler may elide the pair */
    void *(*volatile alloc)(size_t) = malloc;
    sink[0] = alloc(10);
    sink[1] = strdup("x");
    alloc_counting = 0;
    free(sink[0]);
    free(sink[1]);
    CHECK(alloc_count == 2, "the allocation counter sees malloc and strdup (%ld)", alloc_count);
    run("tiny-a", 0);
    run("tiny-b/mlx-q8", 0);
    run("tiny-moe", 0);
    run("tiny-a", 1);
    run("tiny-moe", 1);
    run_cuda("tiny-a");
    run_cuda("tiny-moe");
    return tap_done();
}
