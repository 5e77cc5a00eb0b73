/* ==== The books of KV blocks and state slots (see cache.h) ==== */
#include "engine/cache.h"

#include <stdlib.h>
#include <string.h>

st_cache_params st_cache_default_params(void) {
    st_cache_params p = {
        .n_slots = 1,
        .max_seq_len = 4096,
        .block_size = 16,
        .n_blocks = 0,
        .kv_dtype = ST_KV_F32,
    };
    return p;
}

/* Sizes of everything st_cache_create allocates; the caller has validated p. */
static void layout(st_cache *c, const st_model *m, const st_cache_params *p) {
    c->p = *p;
    c->n_full = m->n_full;
    c->n_linear = m->n_linear;
    c->vocab = m->cfg.vocab_size;
    c->max_blocks_per_seq = (p->max_seq_len + p->block_size - 1) / p->block_size;
    if (c->p.n_blocks <= 0) c->p.n_blocks = c->max_blocks_per_seq * p->n_slots;
    const size_t n_slots = (size_t)p->n_slots;
    c->planned_bytes = (size_t)c->p.n_blocks * 4 + n_slots * ((size_t)c->max_blocks_per_seq * 4 + sizeof(int));
}

static st_status check_params(const st_cache_params *p, st_error *err) {
    if (p->n_slots < 1 || p->n_slots > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "cache: n_slots must be in [1, 2^20]");
    if (p->block_size < 1 || p->block_size > 4096)
        return st_error_set(err, ST_ERR_ARG, "cache: block_size must be in [1, 4096]");
    if (p->max_seq_len < 1 || p->max_seq_len > ((int64_t)1 << 30))
        return st_error_set(err, ST_ERR_ARG, "cache: max_seq_len must be in [1, 2^30]");
    return ST_OK;
}

st_cache_plan st_cache_plan_of(const st_model *m, const st_cache_params *p) {
    st_cache_plan pl = {0, 0, 0};
    st_cache c;
    memset(&c, 0, sizeof c);
    if (check_params(p, NULL) != ST_OK) return pl;
    layout(&c, m, p);
    pl.total_bytes = c.planned_bytes;
    pl.block_bytes = 4;
    pl.slot_bytes = (size_t)c.max_blocks_per_seq * 4 + sizeof(int);
    return pl;
}

st_ctx_params st_cache_ctx_params(const st_cache *c, int max_tokens) {
    st_ctx_params p = {
        .max_tokens = max_tokens,
        .n_slots = c->p.n_slots,
        .n_blocks = c->p.n_blocks,
        .block_size = c->p.block_size,
        .max_seq_len = c->p.max_seq_len,
        .kv_dtype = c->p.kv_dtype,
    };
    return p;
}

st_status st_cache_create(const st_model *m, const st_cache_params *p, st_cache **out,
                          st_error *err) {
    *out = NULL;
    st_status st = check_params(p, err);
    if (st != ST_OK) return st;
    st_cache *c = calloc(1, sizeof *c);
    if (!c) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    layout(c, m, p);
    if (c->p.n_blocks > INT32_MAX) {
        long long nb = (long long)c->p.n_blocks;
        free(c);
        return st_error_set(err, ST_ERR_ARG, "cache: too many KV blocks (%lld)", nb);
    }
    size_t n_slots = (size_t)p->n_slots;
    c->free_blocks = malloc((size_t)(c->p.n_blocks ? c->p.n_blocks : 1) * sizeof *c->free_blocks);
    c->block_tables = calloc(n_slots * (size_t)c->max_blocks_per_seq, sizeof *c->block_tables);
    c->free_slots = malloc(n_slots * sizeof *c->free_slots);
    if (!c->free_blocks || !c->block_tables || !c->free_slots) {
        st_cache_destroy(c);
        return st_error_set(err, ST_ERR_NOMEM, "cache: cannot plan %lld KV blocks and %d state slots",
                            (long long)p->n_blocks, p->n_slots);
    }
    /* stacks: lowest ids on top */
    c->n_free_blocks = c->p.n_blocks;
    for (int64_t i = 0; i < c->p.n_blocks; i++)
        c->free_blocks[i] = (int32_t)(c->p.n_blocks - 1 - i);
    c->n_free_slots = p->n_slots;
    for (int i = 0; i < p->n_slots; i++) c->free_slots[i] = p->n_slots - 1 - i;
    *out = c;
    return ST_OK;
}

void st_cache_destroy(st_cache *c) {
    if (!c) return;
    free(c->free_blocks);
    free(c->block_tables);
    free(c->free_slots);
    free(c);
}

st_status st_cache_seq_start(st_cache *c, st_seq *seq, st_error *err) {
    if (c->n_free_slots == 0)
        return st_error_set(err, ST_ERR_BUSY, "all %d sequence slots are in use", c->p.n_slots);
    int slot = c->free_slots[--c->n_free_slots];
    seq->slot = slot;
    seq->n_past = 0;
    seq->n_blocks = 0;
    seq->blocks = c->block_tables + (size_t)slot * (size_t)c->max_blocks_per_seq;
    return ST_OK;
}

int64_t st_cache_blocks_needed(const st_cache *c, const st_seq *seq, int64_t n_new) {
    if (c->n_full == 0) return 0;
    int64_t want = (seq->n_past + n_new + c->p.block_size - 1) / c->p.block_size;
    return want > seq->n_blocks ? want - seq->n_blocks : 0;
}

st_status st_cache_seq_reserve(st_cache *c, st_seq *seq, int64_t n_new, st_error *err) {
    ST_ASSERT(seq->slot >= 0);
    if (seq->n_past + n_new > c->p.max_seq_len)
        return st_error_set(err, ST_ERR_LIMIT,
                            "sequence of %lld positions exceeds the context length %lld",
                            (long long)(seq->n_past + n_new), (long long)c->p.max_seq_len);
    int64_t need = st_cache_blocks_needed(c, seq, n_new);
    if (need > c->n_free_blocks)
        return st_error_set(err, ST_ERR_BUSY, "KV pool exhausted: need %lld blocks, %lld free",
                            (long long)need, (long long)c->n_free_blocks);
    for (int64_t i = 0; i < need; i++) seq->blocks[seq->n_blocks++] = c->free_blocks[--c->n_free_blocks];
    return ST_OK;
}

void st_cache_seq_trim(st_cache *c, st_seq *seq) {
    if (seq->slot < 0) return;
    const int64_t keep = c->n_full ? (seq->n_past + c->p.block_size - 1) / c->p.block_size : 0;
    while (seq->n_blocks > keep) c->free_blocks[c->n_free_blocks++] = seq->blocks[--seq->n_blocks];
}

void st_cache_seq_release(st_cache *c, st_seq *seq) {
    if (seq->slot < 0) return;
    for (int32_t i = seq->n_blocks - 1; i >= 0; i--) c->free_blocks[c->n_free_blocks++] = seq->blocks[i];
    c->free_slots[c->n_free_slots++] = seq->slot;
    seq->slot = -1;
    seq->n_blocks = 0;
    seq->n_past = 0;
    seq->blocks = NULL;
}
