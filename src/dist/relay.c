/* ==== The relay (see relay.h) ==== */
#include "dist/relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "model/forward.h"

enum { MSG_CREATE = 1, MSG_DESTROY, MSG_EMBEDS, MSG_STEP, MSG_STATE_COPY, MSG_KV_COPY, MSG_END };
#define RELAY_MAGIC 0x5352454cu
#define MAX_CTXS 16 /* contexts a follower holds at once */

/* One message: fixed size, the same build on every rank (mpirun starts one executable). */
typedef struct relay_msg {
    uint32_t magic, kind;
    int32_t ctx, n_items;
    int64_t n_tokens, n_logit_rows, n_blocks, n_embeds;
    int64_t from, to;
    int32_t has_mrope, pad;
    st_ctx_params params;
} relay_msg;

/* where each array of a packed plan starts (8-byte aligned) */
typedef struct layout {
    size_t tokens, item_t0, pos0, slot, logits, block_t0, blocks, mrope, embed_rows, end;
} layout;

static size_t al8(size_t x) { return (x + 7) & ~(size_t)7; }

static layout layout_of(int64_t T, int64_t n, int64_t nb, int mrope, int64_t ne) {
    layout l;
    size_t o = 0;
    l.tokens = o, o = al8(o + 4 * (size_t)T);
    l.item_t0 = o, o = al8(o + 8 * (size_t)(n + 1));
    l.pos0 = o, o = al8(o + 8 * (size_t)n);
    l.slot = o, o = al8(o + 4 * (size_t)n);
    l.logits = o, o = al8(o + 4 * (size_t)n);
    l.block_t0 = o, o = al8(o + 8 * (size_t)(n + 1));
    l.blocks = o, o = al8(o + 4 * (size_t)nb);
    l.mrope = o, o = al8(o + (mrope ? 12 * (size_t)T : 0));
    l.embed_rows = o, o = al8(o + 8 * (size_t)ne);
    l.end = o;
    return l;
}

size_t st_relay_step_bytes(const st_ctx_params *p, int64_t cap_blocks) {
    return layout_of(p->max_tokens, p->n_slots, cap_blocks, 1, p->max_tokens).end;
}

/* ---- rank 0 ---- */

static st_status send_msg(st_backend *b, relay_msg *m, st_error *err) {
    m->magic = RELAY_MAGIC;
    return st_comm_bcast(b->comm, m, sizeof *m, 0, b->comm->timeout_s, err);
}

st_status st_relay_ctx_create(st_backend *b, int id, const st_ctx_params *p, st_error *err) {
    relay_msg m = {.kind = MSG_CREATE, .ctx = id, .params = *p};
    return send_msg(b, &m, err);
}

st_status st_relay_ctx_destroy(st_backend *b, int id, st_error *err) {
    relay_msg m = {.kind = MSG_DESTROY, .ctx = id};
    return send_msg(b, &m, err);
}

st_status st_relay_enable_embeds(st_backend *b, int id, st_error *err) {
    relay_msg m = {.kind = MSG_EMBEDS, .ctx = id};
    return send_msg(b, &m, err);
}

st_status st_relay_state_copy(st_backend *b, int id, int from, int to, st_error *err) {
    relay_msg m = {.kind = MSG_STATE_COPY, .ctx = id, .from = from, .to = to};
    return send_msg(b, &m, err);
}

st_status st_relay_kv_copy(st_backend *b, int id, int32_t from, int32_t to, st_error *err) {
    relay_msg m = {.kind = MSG_KV_COPY, .ctx = id, .from = from, .to = to};
    return send_msg(b, &m, err);
}

st_status st_relay_end(st_backend *b, st_error *err) {
    if (b->relay_ended) return ST_OK; /* once: the followers have returned */
    b->relay_ended = 1;
    relay_msg m = {.kind = MSG_END};
    return send_msg(b, &m, err);
}

st_status st_relay_step(st_backend *b, int id, const st_step_plan *pl, void *pack, st_error *err) {
    const int n = pl->n_items;
    const int64_t nb = pl->block_t0[n];
    relay_msg m = {.kind = MSG_STEP, .ctx = id, .n_items = n, .n_tokens = pl->n_tokens,
                   .n_logit_rows = pl->n_logit_rows, .n_blocks = nb, .n_embeds = pl->n_embeds,
                   .has_mrope = pl->mrope != NULL};
    const layout l = layout_of(pl->n_tokens, n, nb, m.has_mrope, pl->n_embeds);
    uint8_t *p = pack;
    memcpy(p + l.tokens, pl->tokens, 4 * (size_t)pl->n_tokens);
    memcpy(p + l.item_t0, pl->item_t0, 8 * (size_t)(n + 1));
    memcpy(p + l.pos0, pl->pos0, 8 * (size_t)n);
    memcpy(p + l.slot, pl->slot, 4 * (size_t)n);
    memcpy(p + l.logits, pl->logits, 4 * (size_t)n);
    memcpy(p + l.block_t0, pl->block_t0, 8 * (size_t)(n + 1));
    if (nb) memcpy(p + l.blocks, pl->blocks, 4 * (size_t)nb);
    if (pl->mrope) memcpy(p + l.mrope, pl->mrope, 12 * (size_t)pl->n_tokens);
    if (pl->n_embeds) memcpy(p + l.embed_rows, pl->embed_rows, 8 * (size_t)pl->n_embeds);
    st_status st = send_msg(b, &m, err);
    if (st == ST_OK) st = st_comm_bcast(b->comm, pack, l.end, 0, b->comm->timeout_s, err);
    const size_t row = (size_t)b->m->cfg.hidden_size * sizeof(float);
    for (int64_t i = 0; i < pl->n_embeds && st == ST_OK; i++) /* the image rows, one by one */
        st = st_comm_bcast(b->comm, (void *)pl->embeds[i], row, 0, b->comm->timeout_s, err);
    return st;
}

/* ---- the other ranks ---- */

typedef struct follower_ctx {
    int id;                /* rank 0's id; -1: free */
    st_fwd *f;             /* owned */
    uint8_t *pack;         /* [st_relay_step_bytes] a received plan; owned */
    float *emb;            /* [max_tokens][d] received image rows, or NULL; owned */
    const float **emb_ptr; /* [max_tokens] pointers into emb; owned */
} follower_ctx;

static follower_ctx *find_ctx(follower_ctx *t, int id) {
    for (int i = 0; i < MAX_CTXS; i++)
        if (t[i].id == id) return &t[i];
    return NULL;
}

static void free_ctx(follower_ctx *x) {
    st_fwd_destroy(x->f);
    free(x->pack);
    free(x->emb);
    free(x->emb_ptr);
    memset(x, 0, sizeof *x);
    x->id = -1;
}

/* receive a step's arrays into x->pack and run it (no logits: rank 0 computes them) */
static st_status follow_step(st_backend *b, follower_ctx *x, const relay_msg *m, st_error *err) {
    const st_ctx_params *p = st_fwd_params(x->f);
    const int64_t cap_blocks = st_fwd_plan_buf(x->f)->cap_blocks;
    if (m->n_items < 1 || m->n_items > p->n_slots || m->n_tokens < 1 || m->n_tokens > p->max_tokens ||
        m->n_blocks < 0 || m->n_blocks > cap_blocks || m->n_embeds < 0 || m->n_embeds > m->n_tokens ||
        (m->n_embeds && !x->emb))
        return st_error_set(err, ST_ERR_INTERNAL, "relay: a step that does not fit context %d", m->ctx);
    const layout l = layout_of(m->n_tokens, m->n_items, m->n_blocks, m->has_mrope, m->n_embeds);
    st_status st = st_comm_bcast(b->comm, x->pack, l.end, 0, b->comm->timeout_s, err);
    const int64_t d = b->m->cfg.hidden_size;
    for (int64_t i = 0; i < m->n_embeds && st == ST_OK; i++) {
        st = st_comm_bcast(b->comm, x->emb + i * d, (size_t)d * sizeof(float), 0, b->comm->timeout_s, err);
        x->emb_ptr[i] = x->emb + i * d;
    }
    if (st != ST_OK) return st;
    const uint8_t *q = x->pack;
    st_step_plan pl = {
        .n_items = m->n_items,
        .n_tokens = m->n_tokens,
        .n_logit_rows = m->n_logit_rows,
        .tokens = (const int32_t *)(q + l.tokens),
        .item_t0 = (const int64_t *)(q + l.item_t0),
        .pos0 = (const int64_t *)(q + l.pos0),
        .slot = (const int32_t *)(q + l.slot),
        .logits = (const int32_t *)(q + l.logits),
        .block_t0 = (const int64_t *)(q + l.block_t0),
        .blocks = (const int32_t *)(q + l.blocks),
        .mrope = m->has_mrope ? (const int32_t *)(q + l.mrope) : NULL,
        .n_embeds = m->n_embeds,
        .embed_rows = m->n_embeds ? (const int64_t *)(q + l.embed_rows) : NULL,
        .embeds = m->n_embeds ? x->emb_ptr : NULL,
    };
    return st_fwd_run(x->f, &pl, NULL, err);
}

static st_status follow_create(st_backend *b, follower_ctx *t, const relay_msg *m, st_error *err) {
    follower_ctx *x = find_ctx(t, -1);
    if (m->ctx < 0 || find_ctx(t, m->ctx) || !x)
        return st_error_set(err, ST_ERR_INTERNAL, "relay: context %d exists or %d are open", m->ctx, MAX_CTXS);
    st_status st = st_fwd_create(b, &m->params, &x->f, err);
    if (st != ST_OK) return st;
    x->id = m->ctx;
    x->pack = malloc(st_relay_step_bytes(&m->params, st_fwd_plan_buf(x->f)->cap_blocks));
    if (!x->pack) {
        free_ctx(x);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory for a relayed context");
    }
    return ST_OK;
}

static st_status follow_embeds(st_backend *b, follower_ctx *x, st_error *err) {
    if (x->emb) return ST_OK;
    const size_t T = (size_t)st_fwd_params(x->f)->max_tokens, d = (size_t)b->m->cfg.hidden_size;
    x->emb = malloc(T * d * sizeof(float));
    x->emb_ptr = malloc(T * sizeof *x->emb_ptr);
    if (!x->emb || !x->emb_ptr) return st_error_set(err, ST_ERR_NOMEM, "out of memory for image rows");
    return st_fwd_enable_embeds(x->f, err);
}

st_status st_relay_follow(st_backend *b, st_error *err) {
    if (!b->comm || b->comm->rank == 0) return st_error_set(err, ST_ERR_ARG, "relay: rank 0 does not follow");
    follower_ctx t[MAX_CTXS];
    memset(t, 0, sizeof t);
    for (int i = 0; i < MAX_CTXS; i++) t[i].id = -1;
    st_status st = ST_OK;
    for (;;) {
        relay_msg m;
        if ((st = st_comm_bcast(b->comm, &m, sizeof m, 0, 0, err)) != ST_OK) break; /* idle: no watchdog */
        if (m.magic != RELAY_MAGIC) {
            st = st_error_set(err, ST_ERR_INTERNAL, "relay: a message that is not one (another strand build on rank 0?)");
            break;
        }
        if (m.kind == MSG_END) break;
        if (m.kind == MSG_CREATE) {
            if ((st = follow_create(b, t, &m, err)) != ST_OK) break;
            continue;
        }
        follower_ctx *x = find_ctx(t, m.ctx);
        if (!x || m.ctx < 0) {
            st = st_error_set(err, ST_ERR_INTERNAL, "relay: message %u for context %d, which is not open", m.kind, m.ctx);
            break;
        }
        const st_ctx_params *p = st_fwd_params(x->f);
        const int64_t n_states = (int64_t)p->n_slots + p->n_snapshots;
        if (m.kind == MSG_DESTROY) {
            free_ctx(x);
        } else if (m.kind == MSG_EMBEDS) {
            if ((st = follow_embeds(b, x, err)) != ST_OK) break;
        } else if (m.kind == MSG_STEP) {
            if ((st = follow_step(b, x, &m, err)) != ST_OK) break;
        } else if (m.kind == MSG_STATE_COPY && m.from >= 0 && m.from < n_states && m.to >= 0 && m.to < n_states) {
            st_fwd_state_copy(x->f, (int)m.from, (int)m.to);
        } else if (m.kind == MSG_KV_COPY && m.from >= 0 && m.from < p->n_blocks && m.to >= 0 && m.to < p->n_blocks) {
            st_fwd_kv_copy(x->f, (int32_t)m.from, (int32_t)m.to);
        } else {
            st = st_error_set(err, ST_ERR_INTERNAL, "relay: message %u with arguments %lld, %lld out of range", m.kind,
                              (long long)m.from, (long long)m.to);
            break;
        }
    }
    for (int i = 0; i < MAX_CTXS; i++)
        if (t[i].id >= 0) free_ctx(&t[i]);
    return st;
}
