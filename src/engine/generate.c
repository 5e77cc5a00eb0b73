/* ==== Greedy generation for a ragged batch of prompts (see generate.h) ==== */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/batch.h"
#include "model/forward.h"
#include "sampler/sampler.h"

st_gen_options st_gen_default_options(void) {
    st_gen_options o = {
        .max_batch_tokens = 512,
        .block_size = 16,
        .kv_dtype = ST_KV_F32,
        .max_seq_len = 0,
        .stop_at_eos = 0,
        .backend = NULL,
    };
    return o;
}

int32_t st_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

static int is_eos(const st_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}

st_status st_generate_greedy(const st_model *m, st_gen_request *reqs, int n_reqs,
                             const st_gen_options *opt, st_error *err) {
    const st_config *c = &m->cfg;
    int64_t need = 0;
    for (int i = 0; i < n_reqs; i++) {
        if (reqs[i].n_prompt < 1)
            return st_error_set(err, ST_ERR_ARG, "prompt %d is empty", i);
        if (reqs[i].n_new < 0) return st_error_set(err, ST_ERR_ARG, "prompt %d: n_new < 0", i);
        int64_t len = (int64_t)reqs[i].n_prompt + reqs[i].n_new;
        if (len > need) need = len;
        reqs[i].n_out = 0;
    }
    int64_t ctx = opt->max_seq_len > 0 ? opt->max_seq_len : c->max_position_embeddings;
    for (int i = 0; i < n_reqs; i++)
        if (reqs[i].n_prompt + (int64_t)reqs[i].n_new > ctx)
            return st_error_set(err, ST_ERR_LIMIT,
                                "prompt %d: %d prompt + %d new tokens exceed the context length "
                                "%lld",
                                i, reqs[i].n_prompt, reqs[i].n_new, (long long)ctx);
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = n_reqs;
    cp.max_seq_len = need; /* the pool holds what these requests can use, nothing more */
    cp.block_size = opt->block_size;
    cp.kv_dtype = opt->kv_dtype;
    st_cache *cache = NULL;
    st_fwd *fwd = NULL;
    st_backend *own = NULL, *be = opt->backend;
    st_seq *seqs = calloc((size_t)n_reqs, sizeof *seqs);
    st_batch_item *items = calloc((size_t)n_reqs, sizeof *items);
    int *item_req = calloc((size_t)n_reqs, sizeof *item_req);
    int *done = calloc((size_t)n_reqs, sizeof *done);
    int64_t *fed = calloc((size_t)n_reqs, sizeof *fed); /* prompt tokens fed so far */
    float *logits = malloc((size_t)n_reqs * (size_t)c->vocab_size * sizeof(float));
    st_status st = ST_OK;
    if (!seqs || !items || !item_req || !done || !fed || !logits) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_reqs; i++) seqs[i].slot = -1;
    int budget = opt->max_batch_tokens;
    if (budget < n_reqs) budget = n_reqs; /* a decode step holds one token per sequence */
    if (!be && (st = st_backend_cpu_create(m, NULL, NULL, &own, err)) != ST_OK) goto out;
    if (!be) be = own;
    if ((st = st_cache_create(m, &cp, &cache, err)) != ST_OK) goto out;
    st_ctx_params xp = st_cache_ctx_params(cache, budget);
    if ((st = st_fwd_create(be, &xp, &fwd, err)) != ST_OK) goto out;
    for (int i = 0; i < n_reqs; i++) {
        if ((st = st_cache_seq_start(cache, &seqs[i], err)) != ST_OK) goto out;
        done[i] = reqs[i].n_new == 0;
    }
    for (;;) {
        /* one step: prompt chunks first, then one decode token per generating sequence */
        int n_items = 0, left = budget;
        for (int i = 0; i < n_reqs && left > 0; i++) {
            if (done[i]) continue;
            st_batch_item *it = &items[n_items];
            if (fed[i] < reqs[i].n_prompt) {
                int64_t take = reqs[i].n_prompt - fed[i];
                if (take > left) take = left;
                it->tokens = reqs[i].prompt + fed[i];
                it->n_tokens = (int)take;
                it->logits = fed[i] + take == reqs[i].n_prompt ? ST_LOGITS_LAST : ST_LOGITS_NONE;
            } else {
                it->tokens = &reqs[i].out[reqs[i].n_out - 1];
                it->n_tokens = 1;
                it->logits = ST_LOGITS_LAST;
            }
            it->seq = &seqs[i];
            item_req[n_items++] = i;
            left -= it->n_tokens;
        }
        if (n_items == 0) break;
        if ((st = st_batch_run(cache, fwd, items, n_items, logits, err)) != ST_OK) goto out;
        int64_t row = 0;
        for (int k = 0; k < n_items; k++) {
            int i = item_req[k];
            if (fed[i] < reqs[i].n_prompt) fed[i] += items[k].n_tokens;
            if (items[k].logits == ST_LOGITS_NONE) continue;
            const float *lg = logits + row * c->vocab_size;
            row++;
            if (!st_logits_finite(lg, c->vocab_size)) {
                st = st_error_set(err, ST_ERR_FORMAT, "prompt %d: the model produced non-finite logits (NaN or "
                                  "infinity) at position %lld", i, (long long)(reqs[i].n_prompt + reqs[i].n_out));
                goto out;
            }
            int32_t id = st_argmax(lg, c->vocab_size);
            if (reqs[i].out_logits)
                memcpy(reqs[i].out_logits + (size_t)reqs[i].n_out * (size_t)c->vocab_size, lg,
                       (size_t)c->vocab_size * sizeof(float));
            reqs[i].out[reqs[i].n_out++] = id;
            if (reqs[i].n_out == reqs[i].n_new || (opt->stop_at_eos && is_eos(c, id))) done[i] = 1;
        }
    }
out:
    if (cache && seqs)
        for (int i = 0; i < n_reqs; i++) st_cache_seq_release(cache, &seqs[i]);
    st_fwd_destroy(fwd);
    st_cache_destroy(cache);
    st_backend_destroy(own);
    free(seqs);
    free(items);
    free(item_req);
    free(done);
    free(fed);
    free(logits);
    return st;
}
