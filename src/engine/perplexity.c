/* ==== Perplexity (see perplexity.h) ==== */
#include "engine/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/threadpool.h"
#include "backend/cpu/cpu.h"
#include "engine/batch.h"
#include "model/forward.h"

#define ST_PPL_ALIGN 64 /* the chunked delta rule's chunk (model/forward.c) */

st_ppl_params st_ppl_default_params(void) {
    st_ppl_params p = {
        .window = 512,
        .batch = 4,
        .step_tokens = 0,
        .kv_dtype = ST_KV_F32,
        .backend = NULL,
        .progress = NULL,
        .row = NULL,
        .user = NULL,
    };
    return p;
}

/* log-sum-exp of rows [0, n) of logits, on the pool's threads */
typedef struct lse_job {
    const float *logits; /* [n][vocab] */
    int64_t n, vocab;
    double *lse;         /* [n] */
} lse_job;

static void lse_rows(void *ctx, int tid, int nth) {
    const lse_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->n, nth, tid, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->logits + r * j->vocab;
        float mx = x[0];
        for (int64_t i = 1; i < j->vocab; i++)
            if (x[i] > mx) mx = x[i];
        double s = 0;
        for (int64_t i = 0; i < j->vocab; i++) s += exp((double)x[i] - (double)mx);
        j->lse[r] = (double)mx + log(s);
    }
}

/* a window in a slot */
typedef struct slot {
    st_seq seq;
    int64_t window; /* index, -1 when free */
    int64_t fed;    /* tokens of the window run so far */
} slot;

st_status st_perplexity(const st_model *m, const int32_t *ids, int64_t n, const st_ppl_params *p,
                        st_ppl_result *out, st_error *err) {
    memset(out, 0, sizeof *out);
    const int64_t V = m->cfg.vocab_size, W = p->window;
    if (W < 2 || W > m->cfg.max_position_embeddings)
        return st_error_set(err, ST_ERR_ARG, "the window must be in [2, %lld] tokens (the model's context)",
                            (long long)m->cfg.max_position_embeddings);
    if (p->batch < 1 || p->batch > 4096) return st_error_set(err, ST_ERR_ARG, "the batch must be in [1, 4096] windows");
    const int64_t n_win = n / W;
    if (n_win < 1)
        return st_error_set(err, ST_ERR_ARG, "the text has %lld tokens, fewer than one window of %lld",
                            (long long)n, (long long)W);
    for (int64_t i = 0; i < n_win * W; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return st_error_set(err, ST_ERR_ARG, "token %lld (id %d) is outside the vocabulary", (long long)i, ids[i]);
    int64_t step = p->step_tokens;
    if (step <= 0) step = ((int64_t)256 << 20) / (V * 4);
    if (step > (1 << 20)) step = 1 << 20;
    /* every window of a step gets the same share, a multiple of the delta rule's 64-token
     * chunk: then chunk boundaries fall where they fall in a whole-window run, and a window's
     * logits are the same whatever the batch */
    int64_t batch = p->batch < n_win ? p->batch : n_win;
    if (step >= ST_PPL_ALIGN && batch > step / ST_PPL_ALIGN) batch = step / ST_PPL_ALIGN;
    if (batch < 1) batch = 1;
    int64_t share = step / batch;
    if (share >= ST_PPL_ALIGN) share -= share % ST_PPL_ALIGN;
    if (share > W) share = W;
    step = share * batch;

    st_cache_params cp = st_cache_default_params();
    cp.n_slots = (int)batch;
    cp.max_seq_len = W;
    cp.kv_dtype = p->kv_dtype;
    st_cache *cache = NULL;
    st_fwd *fwd = NULL;
    st_backend *own = NULL, *be = p->backend;
    slot *slots = calloc((size_t)batch, sizeof *slots);
    double *win_sum = calloc((size_t)n_win * 2, sizeof *win_sum); /* [n_win][sum, sum of squares] */
    st_batch_item *items = calloc((size_t)batch, sizeof *items);
    int *item_slot = calloc((size_t)batch, sizeof *item_slot);
    float *logits = malloc((size_t)step * (size_t)V * sizeof(float));
    double *lse = malloc((size_t)step * sizeof *lse);
    st_status st = ST_OK;
    if (!slots || !items || !item_slot || !logits || !lse || !win_sum) {
        st = st_error_set(err, ST_ERR_NOMEM, "perplexity: out of memory for %lld rows of logits", (long long)step);
        goto out;
    }
    if (!be && (st = st_backend_cpu_create(m, NULL, NULL, &own, err)) != ST_OK) goto out;
    if (!be) be = own;
    if ((st = st_cache_create(m, &cp, &cache, err)) != ST_OK) goto out;
    st_ctx_params xp = st_cache_ctx_params(cache, (int)step);
    if ((st = st_fwd_create(be, &xp, &fwd, err)) != ST_OK) goto out;
    /* the log-sum-exps run on the CPU backend's threads, or on this one */
    st_pool *pool = st_backend_is_cpu(be) ? st_bctx_cpu_pool(st_fwd_ctx(fwd)) : NULL;
    for (int64_t s = 0; s < batch; s++) slots[s].window = -1, slots[s].seq.slot = -1;

    double sum = 0; /* running, for the progress line only */
    int64_t scored = 0, next_win = 0, done = 0;
    double t0 = st_now_s();
    while (done < n_win) {
        /* fill free slots with the next windows */
        for (int64_t s = 0; s < batch && next_win < n_win; s++) {
            if (slots[s].window >= 0) continue;
            if ((st = st_cache_seq_start(cache, &slots[s].seq, err)) != ST_OK) goto out;
            slots[s].window = next_win++;
            slots[s].fed = 0;
        }
        /* one step: a share for every running window, in slot order */
        int64_t n_items = 0, rows = 0;
        for (int64_t s = 0; s < batch; s++) {
            slot *sl = &slots[s];
            if (sl->window < 0) continue;
            int64_t take = W - sl->fed < share ? W - sl->fed : share;
            items[n_items] = (st_batch_item){&sl->seq, ids + sl->window * W + sl->fed, (int)take, ST_LOGITS_ALL};
            item_slot[n_items++] = (int)s;
            rows += take;
        }
        if ((st = st_batch_run(cache, fwd, items, (int)n_items, logits, err)) != ST_OK) goto out;
        lse_job job = {logits, rows, V, lse};
        if (pool) st_pool_run(pool, lse_rows, &job);
        else lse_rows(&job, 0, 1);
        int64_t row = 0;
        for (int64_t k = 0; k < n_items; k++) {
            slot *sl = &slots[item_slot[k]];
            const int32_t *w = ids + sl->window * W;
            for (int64_t j = 0; j < items[k].n_tokens; j++, row++) {
                int64_t pos = sl->fed + j; /* this row predicts pos + 1 */
                if (pos + 1 >= W) continue;
                const float *lg = logits + row * V;
                double nll = lse[row] - (double)lg[w[pos + 1]];
                if (p->row) p->row(p->user, sl->window * (W - 1) + pos, lg, lse[row], w[pos + 1]);
                win_sum[2 * sl->window] += nll;
                win_sum[2 * sl->window + 1] += nll * nll;
                sum += nll;
                scored++;
            }
            sl->fed += items[k].n_tokens;
            if (sl->fed == W) {
                st_cache_seq_release(cache, &sl->seq);
                sl->window = -1;
                done++;
                if (p->progress) p->progress(p->user, done, n_win, scored, exp(sum / (double)scored));
            }
        }
    }
    double secs = st_now_s() - t0;
    double total = 0, total2 = 0; /* in window order: the same sum whatever the batch */
    for (int64_t w = 0; w < n_win; w++) {
        total += win_sum[2 * w];
        total2 += win_sum[2 * w + 1];
    }
    double mean = total / (double)scored, var = total2 / (double)scored - mean * mean;
    out->nll_mean = mean;
    out->nll_sd = var > 0 ? sqrt(var) : 0;
    out->ppl = exp(mean);
    out->ppl_stderr = out->ppl * out->nll_sd / sqrt((double)scored);
    out->scored = scored;
    out->windows = n_win;
    out->seconds = secs;
    out->tokens_per_s = secs > 0 ? (double)(n_win * W) / secs : 0;
out:
    if (cache && slots)
        for (int64_t s = 0; s < batch; s++) st_cache_seq_release(cache, &slots[s].seq);
    st_fwd_destroy(fwd);
    st_cache_destroy(cache);
    st_backend_destroy(own);
    free(slots);
    free(items);
    free(item_slot);
    free(logits);
    free(lse);
    free(win_sum);
    return st;
}
