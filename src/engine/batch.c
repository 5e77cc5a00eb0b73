/* ==== Batch items to plans (see batch.h) ==== */
#include "engine/batch.h"

int64_t st_batch_logit_rows(const st_batch_item *items, int n_items) {
    int64_t n = 0;
    for (int i = 0; i < n_items; i++)
        n += st_logits_rows(items[i].logits, items[i].n_tokens);
    return n;
}

st_status st_batch_plan(st_cache *c, const st_batch_item *items, int n_items, st_plan_buf *pb,
                        st_error *err) {
    if (n_items < 1) return st_error_set(err, ST_ERR_ARG, "empty batch");
    int64_t T = 0, blocks = 0;
    for (int i = 0; i < n_items; i++) {
        const st_batch_item *it = &items[i];
        if (!it->seq || it->seq->slot < 0)
            return st_error_set(err, ST_ERR_ARG, "batch item %d: sequence not started", i);
        if (it->n_tokens < 1) return st_error_set(err, ST_ERR_ARG, "batch item %d: no tokens", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq || items[j].seq->slot == it->seq->slot)
                return st_error_set(err, ST_ERR_ARG, "batch items %d and %d are the same sequence", j, i);
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= c->vocab)
                return st_error_set(err, ST_ERR_ARG,
                                    "batch item %d: token id %d is outside the vocabulary [0, %lld)",
                                    i, it->tokens[j], (long long)c->vocab);
        if (it->seq->n_past + it->n_tokens > c->p.max_seq_len)
            return st_error_set(err, ST_ERR_LIMIT,
                                "batch item %d: %lld positions exceed the context length %lld", i,
                                (long long)(it->seq->n_past + it->n_tokens), (long long)c->p.max_seq_len);
        T += it->n_tokens;
        if (T > pb->cap_tokens)
            return st_error_set(err, ST_ERR_LIMIT, "batch of %lld+ tokens exceeds the planned %lld",
                                (long long)T, (long long)pb->cap_tokens);
        blocks += st_cache_blocks_needed(c, it->seq, it->n_tokens);
    }
    if (n_items > pb->cap_items)
        return st_error_set(err, ST_ERR_LIMIT, "a step of %d items exceeds the planned %d", n_items, pb->cap_items);
    if (blocks > st_cache_available_blocks(c))
        return st_error_set(err, ST_ERR_BUSY, "KV pool exhausted: need %lld blocks, %lld free",
                            (long long)blocks, (long long)st_cache_available_blocks(c));
    for (int i = 0; i < n_items; i++) {
        st_status st = st_cache_seq_reserve(c, items[i].seq, items[i].n_tokens, err);
        ST_ASSERT(st == ST_OK); /* checked above */
    }
    st_plan_reset(pb);
    for (int i = 0; i < n_items; i++) {
        const st_batch_item *it = &items[i];
        st_status st = st_plan_add(pb, it->tokens, it->n_tokens, it->seq->n_past, it->seq->slot,
                                   it->seq->blocks, it->seq->n_blocks, it->logits, err);
        if (st != ST_OK) {
            st_batch_undo(c, items, n_items);
            return st;
        }
    }
    return ST_OK;
}

void st_batch_commit(st_cache *c, const st_batch_item *items, int n_items) {
    for (int i = 0; i < n_items; i++) st_cache_seq_commit(c, items[i].seq, items[i].tokens, items[i].n_tokens);
}

void st_batch_undo(st_cache *c, const st_batch_item *items, int n_items) {
    for (int i = n_items - 1; i >= 0; i--) st_cache_seq_trim(c, items[i].seq);
}

st_status st_batch_run_images(st_cache *c, st_fwd *f, const st_batch_item *items, int n_items, const st_batch_images *im,
                              float *logits, st_error *err) {
    st_plan_buf *pb = st_fwd_plan_buf(f);
    st_status st = st_batch_plan(c, items, n_items, pb, err);
    if (st != ST_OK) return st;
    pb->plan.mrope = im->mrope;
    pb->plan.n_embeds = im->n_embeds;
    pb->plan.embed_rows = im->rows;
    pb->plan.embeds = im->embeds;
    if ((st = st_fwd_run(f, &pb->plan, logits, err)) != ST_OK) {
        st_batch_undo(c, items, n_items);
        return st;
    }
    for (int i = 0; i < n_items; i++) {
        const int32_t *keys = im->cache_tokens && im->cache_tokens[i] ? im->cache_tokens[i] : items[i].tokens;
        st_cache_seq_commit(c, items[i].seq, keys, items[i].n_tokens);
    }
    return ST_OK;
}

st_status st_batch_run(st_cache *c, st_fwd *f, const st_batch_item *items, int n_items,
                       float *logits, st_error *err) {
    st_plan_buf *pb = st_fwd_plan_buf(f);
    st_status st = st_batch_plan(c, items, n_items, pb, err);
    if (st != ST_OK) return st;
    if ((st = st_fwd_run(f, &pb->plan, logits, err)) != ST_OK) {
        st_batch_undo(c, items, n_items);
        return st;
    }
    st_batch_commit(c, items, n_items);
    return ST_OK;
}
