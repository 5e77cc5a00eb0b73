/* ==== Step plans, shards and backends (see backend.h) ==== */
#include "backend/backend.h"

#include "dist/comm.h"
#include "dist/relay.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* plans */

static size_t align8(size_t n) { return (n + 7) / 8 * 8; }

st_status st_plan_buf_init(st_plan_buf *b, int max_items, int64_t max_tokens, int64_t max_blocks,
                           st_error *err) {
    memset(b, 0, sizeof *b);
    if (max_items < 1 || max_tokens < 1 || max_blocks < 0)
        return st_error_set(err, ST_ERR_ARG, "plan: capacities must be positive");
    size_t n_it = (size_t)max_items;
    size_t bytes = align8((size_t)max_tokens * 4) + 8 * (n_it + 1) + 8 * n_it + align8(4 * n_it) +
                   align8(4 * n_it) + 8 * (n_it + 1) + align8((size_t)max_blocks * 4 + 4);
    b->mem = calloc(1, bytes);
    if (!b->mem) return st_error_set(err, ST_ERR_NOMEM, "plan: out of memory");
    b->bytes = bytes;
    b->cap_items = max_items;
    b->cap_tokens = max_tokens;
    b->cap_blocks = max_blocks;
    uint8_t *p = b->mem;
    st_step_plan *pl = &b->plan;
    pl->tokens = (const int32_t *)p, p += align8((size_t)max_tokens * 4);
    pl->item_t0 = (const int64_t *)p, p += 8 * (n_it + 1);
    pl->pos0 = (const int64_t *)p, p += 8 * n_it;
    pl->slot = (const int32_t *)p, p += align8(4 * n_it);
    pl->logits = (const int32_t *)p, p += align8(4 * n_it);
    pl->block_t0 = (const int64_t *)p, p += 8 * (n_it + 1);
    pl->blocks = (const int32_t *)p;
    st_plan_reset(b);
    return ST_OK;
}

void st_plan_buf_free(st_plan_buf *b) {
    if (!b) return;
    free(b->mem);
    memset(b, 0, sizeof *b);
}

void st_plan_reset(st_plan_buf *b) {
    st_step_plan *pl = &b->plan;
    pl->n_items = 0;
    pl->n_tokens = 0;
    pl->n_logit_rows = 0;
    pl->mrope = NULL;
    pl->n_embeds = 0;
    pl->embed_rows = NULL;
    pl->embeds = NULL;
    ((int64_t *)pl->item_t0)[0] = 0;
    ((int64_t *)pl->block_t0)[0] = 0;
}

st_status st_plan_add(st_plan_buf *b, const int32_t *tokens, int n, int64_t pos0, int slot,
                      const int32_t *blocks, int64_t n_blocks, int logits, st_error *err) {
    st_step_plan *pl = &b->plan;
    const int i = pl->n_items;
    const int64_t bt = pl->block_t0[i];
    if (n < 1) return st_error_set(err, ST_ERR_ARG, "plan: item %d has no tokens", i);
    if (i >= b->cap_items || pl->n_tokens + n > b->cap_tokens || bt + n_blocks > b->cap_blocks)
        return st_error_set(err, ST_ERR_LIMIT,
                            "plan: %d items, %lld tokens, %lld blocks exceed the planned %d, %lld, %lld",
                            i + 1, (long long)(pl->n_tokens + n), (long long)(bt + n_blocks), b->cap_items,
                            (long long)b->cap_tokens, (long long)b->cap_blocks);
    memcpy((int32_t *)pl->tokens + pl->n_tokens, tokens, (size_t)n * sizeof *tokens);
    if (n_blocks) memcpy((int32_t *)pl->blocks + bt, blocks, (size_t)n_blocks * sizeof *blocks);
    ((int64_t *)pl->pos0)[i] = pos0;
    ((int32_t *)pl->slot)[i] = slot;
    ((int32_t *)pl->logits)[i] = logits;
    pl->n_tokens += n;
    ((int64_t *)pl->item_t0)[i + 1] = pl->n_tokens;
    ((int64_t *)pl->block_t0)[i + 1] = bt + n_blocks;
    pl->n_logit_rows += st_logits_rows(logits, n);
    pl->n_items = i + 1;
    return ST_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* shards */

/* an even split of n into world parts: part r is [*a, *a + *len) */
static void even(int64_t n, int world, int rank, int64_t *a, int64_t *len) {
    *a = n * rank / world;
    *len = n * (rank + 1) / world - *a;
}

void st_shard_vocab(int64_t V, int world, int rank, int64_t *v0, int64_t *n) { even(V, world, rank, v0, n); }

/* width n split in whole groups of g over world ranks (unevenly when the groups do not divide) */
static void by_groups(int64_t n, int64_t g, int world, int rank, int64_t *a, int64_t *len) {
    int64_t groups = n / g, ga, gl;
    even(groups, world, rank, &ga, &gl);
    *a = ga * g;
    *len = gl * g;
}

/* the quantization group of a matrix (1 when dense) */
static int64_t group_of(const st_matrix *w) { return w->data && w->fmt == ST_WFMT_AFFINE ? w->group : 1; }

static st_status cols_check(const st_matrix *w, int64_t c0, int64_t n, int layer, const char *what,
                            int rank, st_error *err) {
    if (!w->data || st_matrix_cols_ok(w, c0, n)) return ST_OK;
    return st_error_set(err, ST_ERR_ARG,
                        "shard: rank %d would read columns [%lld, %lld) of layer %d's %s, which are not whole "
                        "quantization groups of %d",
                        rank, (long long)c0, (long long)(c0 + n), layer, what, w->group);
}

st_status st_shard_make(const st_model *m, int rank, int world, st_shard *out, st_error *err) {
    const st_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    if (world < 1 || rank < 0 || rank >= world)
        return st_error_set(err, ST_ERR_ARG, "shard: rank %d of world %d", rank, world);
    out->rank = rank;
    out->world = world;
    st_shard_vocab(c->vocab_size, world, rank, &out->vocab0, &out->vocab);
    if (c->n_heads % world)
        return st_error_set(err, ST_ERR_ARG, "shard: %d query heads do not split over %d ranks", c->n_heads, world);
    if (m->n_linear && c->lin_n_value_heads % world)
        return st_error_set(err, ST_ERR_ARG, "shard: %d GDN value heads do not split over %d ranks",
                            c->lin_n_value_heads, world);
    out->n_heads = c->n_heads / world;
    out->head0 = out->n_heads * rank;
    const int grp = c->n_kv_heads ? c->n_heads / c->n_kv_heads : 1;
    /* the KV heads the local query heads read: a split where they divide, copies otherwise */
    out->kv_head0 = out->head0 / grp;
    out->n_kv_heads = (out->head0 + out->n_heads - 1) / grp - out->kv_head0 + 1;
    if (c->n_kv_heads == 0) out->n_kv_heads = 0;
    const int rep = c->lin_n_key_heads ? c->lin_n_value_heads / c->lin_n_key_heads : 1;
    out->lin_v_heads = c->lin_n_value_heads / world;
    out->lin_v0 = out->lin_v_heads * rank;
    out->lin_k0 = out->lin_v0 / rep;
    out->lin_k_heads = c->lin_n_value_heads ? (out->lin_v0 + out->lin_v_heads - 1) / rep - out->lin_k0 + 1 : 0;
    /* MLP widths in whole quantization groups of the matrices that read them (down_proj) */
    const st_layer *L0 = c->n_layers && m->layers ? &m->layers[0] : NULL; /* NULL: a config alone (plans) */
    int64_t a, len;
    if (!c->is_moe && c->intermediate_size) {
        by_groups(c->intermediate_size, L0 ? group_of(&L0->down) : 1, world, rank, &a, &len);
        out->inter0 = a, out->inter = len;
    }
    if (c->is_moe) {
        int64_t g = L0 && L0->exp_down ? group_of(&L0->exp_down[0]) : 1;
        by_groups(c->moe_intermediate_size, g, world, rank, &a, &len);
        out->moe_inter0 = a, out->moe_inter = len;
        if (c->shared_expert_intermediate_size) {
            by_groups(c->shared_expert_intermediate_size, L0 ? group_of(&L0->sh_down) : 1, world, rank, &a, &len);
            out->shared_inter0 = a, out->shared_inter = len;
        }
    }
    if ((!c->is_moe && c->intermediate_size && out->inter == 0) || (c->is_moe && out->moe_inter == 0))
        return st_error_set(err, ST_ERR_ARG, "shard: the MLP width has too few quantization groups for %d ranks", world);
    if (world == 1 || !m->layers) return ST_OK;
    /* the matrices a shard reads a column range of: whole quantization groups */
    for (int i = 0; i < c->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        st_status st = ST_OK;
        if (L->kind == ST_LAYER_LINEAR)
            st = cols_check(&L->out_proj, (int64_t)out->lin_v0 * c->lin_value_head_dim,
                            (int64_t)out->lin_v_heads * c->lin_value_head_dim, i, "out_proj", rank, err);
        else
            st = cols_check(&L->o_proj, (int64_t)out->head0 * c->head_dim, (int64_t)out->n_heads * c->head_dim, i,
                            "o_proj", rank, err);
        if (st == ST_OK && !c->is_moe) st = cols_check(&L->down, out->inter0, out->inter, i, "down_proj", rank, err);
        for (int e = 0; st == ST_OK && c->is_moe && e < c->n_experts; e++)
            st = cols_check(&L->exp_down[e], out->moe_inter0, out->moe_inter, i, "an expert's down_proj", rank, err);
        if (st == ST_OK && c->is_moe && L->has_shared)
            st = cols_check(&L->sh_down, out->shared_inter0, out->shared_inter, i, "shared_expert.down_proj", rank, err);
        if (st != ST_OK) return st;
    }
    return ST_OK;
}

void st_backend_destroy(st_backend *b) {
    if (!b) return;
    if (b->comm && b->comm->world > 1 && b->comm->rank == 0) { /* the job's work is over */
        st_error e = {0};
        st_relay_end(b, &e);
    }
    b->ops->destroy(b);
}
