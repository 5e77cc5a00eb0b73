/* ==== A decode step allocates nothing ====
 * This program replaces malloc/calloc/realloc/aligned allocators with counting wrappers
 * around glibc's, then runs decode steps (and mixed prefill + decode steps) of several
 * models over a batch of sequences and checks that not one heap allocation happened. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "tap.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int counting;
static long n_allocs;

void *malloc(size_t n) {
    if (counting) n_allocs++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    if (counting) n_allocs++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    if (counting) n_allocs++;
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t al, size_t n) {
    if (counting) n_allocs++;
    return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
    if (counting) n_allocs++;
    *out = __libc_memalign(al, n);
    return *out ? 0 : 12;
}
void free(void *p) { __libc_free(p); }

static void run(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    enum { NS = 4, STEPS = 300 };
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = NS + 1;
    cp.max_seq_len = 512;
    st_status st = st_cache_create(m, &cp, &c, &err);
    if (st == ST_OK) st = st_fwd_create(m, c, 64, NULL, &f, &err);
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
        st = st_fwd_run(f, items, 1, logits, &err);
    }
    if (!CHECK(st == ST_OK, "%s: prefill (%s)", dir, err.msg)) goto out;
    n_allocs = 0;
    counting = 1;
    for (int s = 0; s < STEPS && st == ST_OK; s++) {
        for (int i = 0; i < NS; i++)
            items[i] = (st_batch_item){&seqs[i], &toks[i][s % 32], 1, ST_LOGITS_LAST};
        st = st_fwd_run(f, items, NS, logits, &err);
    }
    counting = 0;
    CHECK(st == ST_OK && n_allocs == 0, "%s: %d decode steps of %d sequences: %ld heap allocations",
          dir, STEPS, NS, n_allocs);
    /* a step mixing a new sequence's prefill chunk with decode tokens, and the sequence
     * ending and its slot being reused, also allocates nothing */
    n_allocs = 0;
    counting = 1;
    for (int round = 0; round < 3 && st == ST_OK; round++) {
        st = st_cache_seq_start(c, &seqs[NS], &err);
        for (int i = 0; i < NS; i++) items[i] = (st_batch_item){&seqs[i], &toks[i][round], 1, ST_LOGITS_LAST};
        items[NS] = (st_batch_item){&seqs[NS], toks[NS], 20, ST_LOGITS_LAST};
        if (st == ST_OK) st = st_fwd_run(f, items, NS + 1, logits, &err);
        st_cache_seq_release(c, &seqs[NS]);
    }
    counting = 0;
    CHECK(st == ST_OK && n_allocs == 0,
          "%s: mixed prefill+decode steps with slot reuse: %ld heap allocations (%s)", dir,
          n_allocs, err.msg);
out:
    free(logits);
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_model_free(m);
}

int main(void) {
    /* the counter itself works (including allocations made inside libraries) */
    n_allocs = 0;
    counting = 1;
    void *(*volatile alloc)(size_t) = malloc;
    void *p = alloc(10);
    char *d = strdup("x");
    counting = 0;
    free(p);
    free(d);
    CHECK(n_allocs == 2, "the allocation counter sees malloc and strdup (%ld)", n_allocs);
    run("tiny-a");
    run("tiny-b/mlx-q8");
    run("tiny-moe");
    return tap_done();
}
