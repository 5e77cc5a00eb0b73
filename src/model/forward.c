/* ==== The layer loop (see forward.h and spec/text-model.md section 4) ==== */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "dist/relay.h"
#include "sampler/sampler.h"

struct st_fwd {
    st_backend *b;       /* borrowed */
    st_bctx *c;          /* owned */
    st_ctx_params p;
    st_plan_buf plan;    /* owned */
    st_hidden_hook hook;
    void *hook_user;
    float *hook_buf;     /* [max_tokens][d] when a hook is set; owned */
    float *emb_buf;      /* [max_tokens][d] X on the host for plans with embeddings; owned */
    int relay_id;        /* rank 0 of a job: this context's id on the other ranks; else -1 */
    void *relay_pack;    /* [st_relay_step_bytes] a step's plan packed for them; owned */
};

/* rank 0 of a job of several: contexts, steps and copies go to the other ranks too */
static int relays(const st_backend *b) { return b->comm && b->comm->world > 1 && b->comm->rank == 0; }

st_status st_fwd_create(st_backend *b, const st_ctx_params *p, st_fwd **out, st_error *err) {
    *out = NULL;
    if (p->max_tokens < 1 || p->max_tokens > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "max_tokens must be in [1, 2^20]");
    if (p->n_slots < 1 || p->block_size < 1 || p->max_seq_len < 1 || p->n_blocks < 0 ||
        p->n_blocks > INT32_MAX)
        return st_error_set(err, ST_ERR_ARG, "context: bad slot, block or length parameters");
    st_fwd *f = calloc(1, sizeof *f);
    if (!f) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    f->b = b;
    f->p = *p;
    const int64_t per_seq = (p->max_seq_len + p->block_size - 1) / p->block_size;
    const int64_t all = (int64_t)p->n_slots * per_seq;
    st_status st = st_plan_buf_init(&f->plan, p->n_slots, p->max_tokens,
                                    b->m->n_full ? (all < p->n_blocks ? all : p->n_blocks) : 0, err);
    f->relay_id = -1;
    if (st == ST_OK) st = b->ops->ctx_create(b, p, &f->c, err);
    if (st == ST_OK && relays(b)) {
        f->relay_pack = malloc(st_relay_step_bytes(p, f->plan.cap_blocks));
        if (!f->relay_pack) st = st_error_set(err, ST_ERR_NOMEM, "out of memory for the relay");
        if (st == ST_OK && (st = st_relay_ctx_create(b, b->relay_ctxs, p, err)) == ST_OK) f->relay_id = b->relay_ctxs++;
    }
    if (st != ST_OK) {
        st_fwd_destroy(f);
        return st;
    }
    *out = f;
    return ST_OK;
}

void *st_fwd_host_alloc(st_fwd *f, size_t bytes) {
    if (f->b->ops->host_alloc) return f->b->ops->host_alloc(f->b, bytes ? bytes : 1);
    return malloc(bytes ? bytes : 1);
}

void st_fwd_host_free(st_fwd *f, void *p) {
    if (!p) return;
    if (f->b->ops->host_free) f->b->ops->host_free(f->b, p);
    else free(p);
}

void st_fwd_destroy(st_fwd *f) {
    if (!f) return;
    if (f->relay_id >= 0) {
        st_error e = {0};
        st_relay_ctx_destroy(f->b, f->relay_id, &e); /* a broken job has nothing to free */
    }
    free(f->relay_pack);
    if (f->c) f->b->ops->ctx_destroy(f->c);
    st_plan_buf_free(&f->plan);
    free(f->hook_buf);
    free(f->emb_buf);
    free(f);
}

st_plan_buf *st_fwd_plan_buf(st_fwd *f) { return &f->plan; }
const st_ctx_params *st_fwd_params(const st_fwd *f) { return &f->p; }
st_backend *st_fwd_backend(st_fwd *f) { return f->b; }
st_bctx *st_fwd_ctx(st_fwd *f) { return f->c; }

size_t st_fwd_bytes(const st_fwd *f) {
    size_t hook = f->hook_buf ? (size_t)f->p.max_tokens * (size_t)f->b->m->cfg.hidden_size * sizeof(float) : 0;
    return f->b->ops->ctx_bytes(f->c) + f->plan.bytes + hook;
}

st_status st_fwd_set_hidden_hook(st_fwd *f, st_hidden_hook hook, void *user, st_error *err) {
    if (hook && !f->hook_buf) {
        f->hook_buf = malloc((size_t)f->p.max_tokens * (size_t)f->b->m->cfg.hidden_size * sizeof(float));
        if (!f->hook_buf) return st_error_set(err, ST_ERR_NOMEM, "out of memory for the hidden-state hook");
    }
    f->hook = hook;
    f->hook_user = user;
    return ST_OK;
}

st_status st_fwd_enable_embeds(st_fwd *f, st_error *err) {
    if (!f->emb_buf) {
        f->emb_buf = malloc((size_t)f->p.max_tokens * (size_t)f->b->m->cfg.hidden_size * sizeof(float));
        if (!f->emb_buf) return st_error_set(err, ST_ERR_NOMEM, "out of memory for image embeddings");
        if (f->relay_id >= 0) return st_relay_enable_embeds(f->b, f->relay_id, err);
    }
    return ST_OK;
}

void st_fwd_state_copy(st_fwd *f, int from, int to) {
    if (f->relay_id >= 0) {
        st_error e = {0}; /* a broken job fails its next step */
        st_relay_state_copy(f->b, f->relay_id, from, to, &e);
    }
    f->b->ops->state_copy(f->c, from, to);
}

void st_fwd_kv_copy(st_fwd *f, int32_t from, int32_t to) {
    if (f->relay_id >= 0) {
        st_error e = {0};
        st_relay_kv_copy(f->b, f->relay_id, from, to, &e);
    }
    f->b->ops->kv_copy(f->c, from, to);
}

/* The plan against the context's capacities and the model. */
static st_status check_plan(const st_fwd *f, const st_step_plan *pl, st_error *err) {
    const st_model *m = f->b->m;
    const int64_t V = m->cfg.vocab_size, bs = f->p.block_size;
    if (pl->n_items < 1) return st_error_set(err, ST_ERR_ARG, "empty batch");
    if (pl->n_items > f->p.n_slots)
        return st_error_set(err, ST_ERR_LIMIT, "a step of %d items exceeds the %d state slots", pl->n_items, f->p.n_slots);
    if (pl->n_tokens > f->p.max_tokens)
        return st_error_set(err, ST_ERR_LIMIT, "batch of %lld tokens exceeds the planned %d",
                            (long long)pl->n_tokens, f->p.max_tokens);
    if (pl->item_t0[0] != 0 || pl->item_t0[pl->n_items] != pl->n_tokens || pl->block_t0[0] != 0)
        return st_error_set(err, ST_ERR_ARG, "plan: item ranges do not cover its tokens");
    int64_t rows = 0;
    for (int i = 0; i < pl->n_items; i++) {
        const int64_t n = pl->item_t0[i + 1] - pl->item_t0[i];
        if (n < 1) return st_error_set(err, ST_ERR_ARG, "batch item %d: no tokens", i);
        if (pl->slot[i] < 0 || pl->slot[i] >= f->p.n_slots)
            return st_error_set(err, ST_ERR_ARG, "batch item %d: state slot %d outside [0, %d)", i, pl->slot[i], f->p.n_slots);
        if (pl->pos0[i] < 0 || pl->pos0[i] + n > f->p.max_seq_len)
            return st_error_set(err, ST_ERR_LIMIT, "batch item %d: %lld positions exceed the context length %lld",
                                i, (long long)(pl->pos0[i] + n), (long long)f->p.max_seq_len);
        const int32_t *tok = pl->tokens + pl->item_t0[i];
        for (int64_t j = 0; j < n; j++)
            if (tok[j] < 0 || tok[j] >= V)
                return st_error_set(err, ST_ERR_ARG, "batch item %d: token id %d is outside the vocabulary [0, %lld)",
                                    i, tok[j], (long long)V);
        if (m->n_full) {
            const int64_t need = (pl->pos0[i] + n + bs - 1) / bs;
            const int64_t have = pl->block_t0[i + 1] - pl->block_t0[i];
            if (have < need)
                return st_error_set(err, ST_ERR_ARG, "batch item %d: %lld KV blocks for %lld positions (need %lld)",
                                    i, (long long)have, (long long)(pl->pos0[i] + n), (long long)need);
            const int32_t *bl = pl->blocks + pl->block_t0[i];
            for (int64_t j = 0; j < need; j++)
                if (bl[j] < 0 || bl[j] >= f->p.n_blocks)
                    return st_error_set(err, ST_ERR_ARG, "batch item %d: KV block %d outside [0, %lld)", i, bl[j],
                                        (long long)f->p.n_blocks);
        }
        if (pl->logits[i] < ST_LOGITS_NONE || pl->logits[i] > ST_LOGITS_LAST_TOP)
            return st_error_set(err, ST_ERR_ARG, "batch item %d: logits mode %d", i, pl->logits[i]);
        rows += st_logits_rows(pl->logits[i], n);
    }
    if (rows != pl->n_logit_rows) return st_error_set(err, ST_ERR_ARG, "plan: logit rows do not add up");
    if (pl->n_embeds) {
        if (!f->emb_buf) return st_error_set(err, ST_ERR_ARG, "plan: embeddings given, but the context takes none");
        if (pl->n_embeds < 0 || pl->n_embeds > pl->n_tokens || !pl->embed_rows || !pl->embeds)
            return st_error_set(err, ST_ERR_ARG, "plan: %lld embedding rows for %lld tokens", (long long)pl->n_embeds,
                                (long long)pl->n_tokens);
        for (int64_t i = 0; i < pl->n_embeds; i++)
            if (pl->embed_rows[i] < (i ? pl->embed_rows[i - 1] + 1 : 0) || pl->embed_rows[i] >= pl->n_tokens)
                return st_error_set(err, ST_ERR_ARG, "plan: embedding row %lld is not increasing within [0, %lld)",
                                    (long long)pl->embed_rows[i], (long long)pl->n_tokens);
    }
    if (pl->mrope)
        for (int64_t t = 0; t < 3 * pl->n_tokens; t++)
            if (pl->mrope[t] < 0 || pl->mrope[t] > (1 << 30))
                return st_error_set(err, ST_ERR_ARG, "plan: rotary position %d out of range", pl->mrope[t]);
    return ST_OK;
}

/* the ST_LOGITS_LAST_TOP rows of a step's logits, made compact in place (for backends that
 * write them whole) */
static void compact_rows(const st_step_plan *pl, int64_t V, float *logits) {
    int64_t row = 0;
    for (int i = 0; i < pl->n_items; i++) {
        if (pl->logits[i] == ST_LOGITS_LAST_TOP) {
            st_logit_top top;
            st_logit_top_make(logits + row * V, V, &top);
            memcpy(logits + row * V, &top, sizeof top);
        }
        row += st_logits_rows(pl->logits[i], pl->item_t0[i + 1] - pl->item_t0[i]);
    }
}

st_status st_fwd_run(st_fwd *f, const st_step_plan *plan, float *logits, st_error *err) {
    st_status st = check_plan(f, plan, err);
    if (st == ST_OK && f->relay_id >= 0) st = st_relay_step(f->b, f->relay_id, plan, f->relay_pack, err);
    if (st != ST_OK) return st;
    const st_backend_ops *op = f->b->ops;
    const st_config *cfg = &f->b->m->cfg;
    const int64_t T = plan->n_tokens, d = cfg->hidden_size;
    st_bctx *c = f->c;
    if ((st = op->step_begin(c, plan, err)) != ST_OK) return st;
    op->embed(c);
    if (plan->n_embeds) { /* image rows: X through the host */
        op->read(c, ST_ACT_X, d, f->emb_buf);
        for (int64_t i = 0; i < plan->n_embeds; i++)
            memcpy(f->emb_buf + plan->embed_rows[i] * d, plan->embeds[i], (size_t)d * sizeof(float));
        op->write(c, ST_ACT_X, d, f->emb_buf);
    }
    for (int li = 0; li <= cfg->n_layers; li++) {
        /* the residual add of a block's output is fused with the next norm */
        const int add = li > 0 ? ST_NORM_ADD : 0;
        const st_norm which = li < cfg->n_layers ? ST_NORM_INPUT : ST_NORM_FINAL;
        if (f->hook && li < cfg->n_layers) {
            if (add) op->add_norm(c, li, which, ST_NORM_ADD);
            op->read(c, ST_ACT_X, d, f->hook_buf);
            f->hook(f->hook_user, li, T, d, f->hook_buf);
            op->add_norm(c, li, which, ST_NORM_APPLY);
        } else {
            op->add_norm(c, li, which, add | ST_NORM_APPLY);
        }
        if (li == cfg->n_layers) break;
        if (cfg->layer_kind[li] == ST_LAYER_LINEAR) {
            const st_mm in[] = {{ST_W_IN_QKV, ST_ACT_P1}, {ST_W_IN_Z, ST_ACT_P2},
                                {ST_W_IN_B, ST_ACT_P3}, {ST_W_IN_A, ST_ACT_P4}};
            op->matmul(c, li, ST_ACT_XN, in, 4, 0);
            op->gdn(c, li);
            const st_mm o[] = {{ST_W_OUT_PROJ, ST_ACT_OUT}};
            op->matmul(c, li, ST_ACT_MIX, o, 1, 0);
        } else {
            const st_mm in[] = {{ST_W_Q, ST_ACT_P1}, {ST_W_K, ST_ACT_P2}, {ST_W_V, ST_ACT_P3}};
            op->matmul(c, li, ST_ACT_XN, in, 3, 0);
            op->attn_prep(c, li);
            op->attention(c, li);
            const st_mm o[] = {{ST_W_O, ST_ACT_OUT}};
            op->matmul(c, li, ST_ACT_MIX, o, 1, 0);
        }
        op->allreduce(c, ST_ACT_OUT);
        op->add_norm(c, li, ST_NORM_POST, ST_NORM_ADD | ST_NORM_APPLY);
        if (cfg->is_moe) {
            op->moe(c, li);
        } else {
            const st_mm gu[] = {{ST_W_GATE, ST_ACT_P1}, {ST_W_UP, ST_ACT_P2}};
            op->matmul(c, li, ST_ACT_XN, gu, 2, ST_SWIGLU_TO_NEXT);
            const st_mm dn[] = {{ST_W_DOWN, ST_ACT_OUT}};
            op->matmul(c, li, ST_ACT_P1, dn, 1, 0);
        }
        op->allreduce(c, ST_ACT_OUT);
    }
    if (f->hook) {
        op->read(c, ST_ACT_XN, d, f->hook_buf);
        f->hook(f->hook_user, cfg->n_layers, T, d, f->hook_buf);
    }
    op->logits(c, logits); /* NULL on a follower: a shard still takes part in the gathers */
    st = op->step_end(c, err);
    if (st == ST_OK && logits && !f->b->logits_top) compact_rows(plan, cfg->vocab_size, logits);
    return st;
}
