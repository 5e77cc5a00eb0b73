/* ==== Continuous batching (see scheduler.h) ==== */
#include "engine/scheduler.h"

#include "core/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "core/numeric.h"
#include "backend/cpu/cpu.h"
#include "engine/batch.h"
#include "grammar/grammar.h"
#include "model/forward.h"

#include <stdio.h>

/* A request from submit to done. Allocated by st_sched_submit (submitting thread), freed by
 * the scheduler thread after its DONE event. */
typedef struct req {
    uint64_t id;
    int32_t *prompt;            /* [n_prompt], owned until admission */
    int64_t n_prompt;
    st_req_params p;            /* stop pointers point into stop_buf */
    char stop_buf[ST_MAX_STOP][ST_MAX_STOP_LEN + 1];
    st_event_fn fn;
    void *user;
    double t_submit;
    double t_blocked;           /* first time admission found too few KV blocks (0: never) */
    atomic_int cancelled;       /* 1: cancelled; 2: failed with fail_msg (set once, from 0) */
    char fail_msg[160];         /* written under the mutex before cancelled becomes 2 */
    atomic_int hold;            /* pauses minus resumes; > 0: left out of steps */
    int live;                   /* choices running (the scheduler thread's) */
    struct req *prev, *next;    /* the live list (guarded by the mutex) */
    struct req *qnext;          /* the waiting queue (guarded by the mutex) */
    st_req_images im;           /* a prompt holding images: points into im_mem */
    void *im_mem;               /* owned: the copies of its positions, rows and embeddings; NULL: text */
    st_gram_schema *schema;     /* owned: a json_schema request's, else NULL */
} req;

static void req_free(req *r) {
    if (!r) return;
    st_gram_schema_free(r->schema);
    free(r->prompt);
    free(r->im_mem);
    free(r);
}

/* A running sequence. A fixed pool of these is allocated at creation. */
typedef struct rec {
    req *r;                 /* NULL when free */
    st_seq seq;
    int32_t *hist;          /* [ctx] prompt then generated tokens; owned by the scheduler */
    int64_t n_hist;         /* tokens in hist */
    int64_t n_prompt;
    int64_t n_fed;          /* tokens the model has seen */
    int64_t n_cached;       /* of those, taken from the prefix cache */
    int64_t max_new;        /* effective max_tokens */
    int64_t n_new;          /* generated so far */
    int64_t n_reasoning;    /* generated while inside the think block */
    int64_t budget_blocks;  /* KV blocks this sequence may come to hold (before a fork, its
                               choices' too) */
    int index;              /* its choice of the request */
    int fork_pending;       /* records reserved for the choices it forks into after the prompt */
    double lp_sum;          /* its tokens' log-probabilities (sum_logprobs) */
    uint64_t order;         /* admission order (prefill is served oldest first) */
    st_sampler_state ss;
    st_textout *tx;         /* owned; NULL without a tokenizer */
    st_gram_state gram;     /* the reply's JSON state (json_mode) */
    int gram_on;
    st_logprobs lp;
    double t_admit, t_first;
    int paused;             /* hold > 0 was seen; since t_paused */
    double t_paused;
    char error[200];        /* the message of an ST_FINISH_ERROR this sequence ended with */
} rec;

struct st_sched {
    const st_model *m;        /* borrowed */
    const st_tokenizer *tok;  /* borrowed, may be NULL */
    st_sched_params p;
    st_sched_plan plan;
    int64_t ctx;              /* the context requests get (plan.ctx) */
    size_t max_event_text;    /* bytes of text one event can carry */
    st_cache *cache;          /* owned */
    st_fwd *fwd;              /* owned */
    st_backend *own_backend;  /* owned when the params named none */
    st_sampler *sampler;      /* owned */
    rec *recs;                /* [max_seqs] */
    st_batch_item *items;     /* [max_seqs] */
    int *item_rec;            /* [max_seqs] */
    float *logits;            /* [max_seqs][vocab] */
    st_gram_vocab *gram;      /* made at the first JSON request (under mu); owned */
    uint32_t *gram_mask;      /* [st_gram_mask_words] the scheduler thread's */
    float *fork_logits;       /* [vocab] a forked choice's copy of its parent's row */
    int32_t (*im_mrope)[3];   /* [step tokens] a step's rotary positions (images); owned */
    int64_t *im_rows;         /* [step tokens] its image rows; owned */
    const float **im_ptrs;    /* [step tokens] their embeddings; owned */
    const int32_t **im_keys;  /* [max_seqs] each item's prefix-cache keys (image prompts); owned */
    int recs_reserved;        /* free records promised to forks */
    uint64_t admit_counter;
    int64_t snap_every;       /* positions between the snapshots of a prompt */
    size_t planned_bytes;
    /* shared with other threads */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req *live;                /* every request not yet done */
    req *qhead, *qtail;       /* waiting, FIFO */
    int n_waiting, n_running;
    uint64_t next_id;
    int shutdown;
    int broken;               /* a step failed with ST_ERR_IO (a tensor-parallel job lost a rank) */
    char broken_msg[160];     /* why; every request ends with it and none is accepted */
    uint64_t kicks;           /* submits, cancels, resumes: something may have changed */
    uint64_t kicks_seen;      /* kicks when the last step began */
    int idle;                 /* the last step could do nothing */
    double next_deadline;     /* the earliest stall timeout of a paused sequence (0: none) */
    st_sched_stats stats;
};


st_sched_params st_sched_default_params(void) {
    st_sched_params p = {
        .max_seqs = 8,
        .ctx = 0,
        .step_tokens = 512,
        .block_size = 16,
        .kv_blocks = 0,
        .kv_dtype = ST_KV_F32,
        .max_queue = 256,
        .stall_timeout_s = 60.0,
        .head_wait_s = 10.0,
        .logits_top = 1,
        .backend = NULL,
    };
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* the memory plan */

#define TEXTOUT_BYTES_EST 65536 /* a sequence's text pipeline, at most (tokenizer-dependent) */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int snapshots_of(const st_sched_params *p) { return p->snapshots > 0 ? p->snapshots : 4 * p->max_seqs + 4; }

/* the cache a scheduler makes at a context and pool size */
static st_cache_params cache_params_of(const st_model *m, const st_sched_params *p, int64_t ctx, int64_t blocks) {
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = p->max_seqs;
    cp.max_seq_len = ctx;
    cp.block_size = p->block_size;
    cp.n_blocks = blocks;
    cp.kv_dtype = p->kv_dtype;
    cp.prefix = p->prefix_cache && m->n_full > 0;
    cp.n_snapshots = cp.prefix ? snapshots_of(p) : 0;
    return cp;
}

st_cpu_params st_sched_cpu_params(st_cpu_params cpu, int prefix_cache) {
    if (prefix_cache) cpu.gdn_chunked = 0; /* a position's result must not depend on how steps split a prompt */
    return cpu;
}

/* the plan at a context and pool size */
static void plan_at(const st_model *m, const st_sched_params *p, int64_t ctx, int64_t blocks,
                    st_sched_plan *pl) {
    const st_cache_params cp = cache_params_of(m, p, ctx, blocks);
    st_cache_plan c = st_cache_plan_of(m, &cp);
    st_ctx_params xp = {.max_tokens = p->step_tokens + p->max_seqs, .n_slots = p->max_seqs, .n_blocks = blocks,
                        .block_size = p->block_size, .max_seq_len = ctx, .kv_dtype = p->kv_dtype,
                        .n_snapshots = cp.n_snapshots};
    st_ctx_plan bx;
    if (p->backend) p->backend->ops->ctx_plan(p->backend, &xp, &bx);
    else st_cpu_ctx_plan(m, 0, &xp, &bx);
    size_t n = (size_t)p->max_seqs, vocab = (size_t)m->cfg.vocab_size;
    pl->ctx = ctx;
    pl->kv_blocks = blocks;
    pl->block_size = p->block_size;
    pl->max_seqs = p->max_seqs;
    pl->kv_bytes = m->n_full ? (size_t)blocks * (c.block_bytes + bx.kv_block_bytes) : 0;
    pl->state_bytes = n * (c.slot_bytes + bx.slot_bytes);
    pl->snapshots = cp.n_snapshots;
    pl->snapshot_bytes = (size_t)cp.n_snapshots * bx.slot_bytes;
    pl->scratch_bytes = bx.scratch_bytes;
    pl->other_bytes = n * ((size_t)ctx * 4 + sizeof(rec) + vocab * 4 + TEXTOUT_BYTES_EST) + vocab * 21;
    pl->total_bytes = pl->kv_bytes + pl->state_bytes + pl->snapshot_bytes + pl->scratch_bytes + pl->other_bytes +
                      (c.total_bytes - (size_t)blocks * c.block_bytes - n * c.slot_bytes); /* the prefix books */
}

static double gib(size_t b) { return (double)b / (double)(1u << 30); }

void st_sched_plan_text(const st_sched_plan *pl, char *buf, size_t cap) {
    char snaps[96] = "";
    if (pl->snapshots)
        snprintf(snaps, sizeof snaps, ", prefix-cache snapshots %.2f GiB (%d)", gib(pl->snapshot_bytes), pl->snapshots);
    snprintf(buf, cap,
             "%.2f GiB: KV pool %.2f GiB (%lld blocks of %d positions, %.1f contexts of %lld), "
             "state %.2f GiB (%d sequences)%s, scratch %.2f GiB, histories and buffers %.2f GiB",
             gib(pl->total_bytes), gib(pl->kv_bytes), (long long)pl->kv_blocks, pl->block_size,
             pl->ctx ? (double)pl->kv_blocks * pl->block_size / (double)pl->ctx : 0.0, (long long)pl->ctx,
             gib(pl->state_bytes), pl->max_seqs, snaps, gib(pl->scratch_bytes), gib(pl->other_bytes));
}

/* the largest context (a multiple of the block size, <= ctx_max) at which every sequence
 * can hold a whole context within the budget; 0 when none */
static int64_t fit_ctx(const st_model *m, const st_sched_params *p, int64_t ctx_max, size_t budget) {
    st_sched_plan t;
    int64_t bs = p->block_size, lo = 0, hi = ctx_max / bs; /* in blocks */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        plan_at(m, p, mid * bs, (int64_t)p->max_seqs * mid, &t);
        if (t.total_bytes <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo * bs;
}

/* the largest pool within the budget, the context capped by it as an explicit pool caps it
 * (may be below one context); 0 when none */
static int64_t fit_blocks(const st_model *m, const st_sched_params *p, int64_t ctx, size_t budget) {
    st_sched_plan t;
    int64_t bs = p->block_size, lo = 0, hi = (int64_t)p->max_seqs * ceil_div(ctx, bs);
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        plan_at(m, p, mid * bs < ctx ? mid * bs : ctx, mid, &t);
        if (t.total_bytes <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* the most sequences that fit with a whole context each */
static int fit_seqs(const st_model *m, const st_sched_params *p, int64_t ctx, size_t budget) {
    st_sched_params q = *p;
    st_sched_plan t;
    for (q.max_seqs = p->max_seqs; q.max_seqs > 0; q.max_seqs--) {
        plan_at(m, &q, ctx, (int64_t)q.max_seqs * ceil_div(ctx, p->block_size), &t);
        if (t.total_bytes <= budget) break;
    }
    return q.max_seqs;
}

static st_status refuse(const st_model *m, const st_sched_params *p, const st_sched_plan *pl,
                        int64_t ctx_max, st_error *err) {
    char what[400], alt[300] = "";
    st_sched_plan_text(pl, what, sizeof what);
    size_t budget = p->mem_budget;
    int64_t c = fit_ctx(m, p, ctx_max, budget), b = fit_blocks(m, p, pl->ctx, budget);
    int n = fit_seqs(m, p, pl->ctx, budget);
    size_t at = 0;
    if (c > 0) at += (size_t)snprintf(alt + at, sizeof alt - at, " --ctx %lld,", (long long)c);
    if (b > 0 && at < sizeof alt)
        at += (size_t)snprintf(alt + at, sizeof alt - at, " --kv-blocks %lld (%lld positions shared by the sequences),",
                               (long long)b, (long long)b * p->block_size);
    if (n > 0 && at < sizeof alt) at += (size_t)snprintf(alt + at, sizeof alt - at, " --max-seqs %d,", n);
    if (at) alt[at - 1] = 0;
    return st_error_set(err, ST_ERR_LIMIT,
                        "the memory plan needs %s, but this process can have %.2f GiB for it%s%s",
                        what, gib(budget), at ? "; these would fit:" : "; nothing would: fewer sequences or a smaller model",
                        at ? alt : "");
}

st_status st_sched_plan_for(const st_model *m, const st_sched_params *p, st_sched_plan *out,
                            st_error *err) {
    memset(out, 0, sizeof *out);
    int64_t ctx = p->ctx > 0 ? p->ctx : m->cfg.max_position_embeddings;
    int64_t bs = p->block_size;
    if (ctx < 2 || ctx > ((int64_t)1 << 30) || bs < 1 || bs > 4096)
        return st_error_set(err, ST_ERR_ARG, "the context must be in [2, 2^30] and the block size in [1, 4096]");
    size_t budget = p->mem_budget;
    if (p->kv_blocks > 0) { /* an explicit pool: it caps the context */
        if (m->n_full > 0 && p->kv_blocks * bs < ctx) ctx = p->kv_blocks * bs;
        plan_at(m, p, ctx, p->kv_blocks, out);
        if (budget && out->total_bytes > budget) return refuse(m, p, out, ctx, err);
    } else if (p->ctx > 0) { /* an explicit context: the pool shrinks to fit, to one context */
        plan_at(m, p, ctx, (int64_t)p->max_seqs * ceil_div(ctx, bs), out);
        if (budget && out->total_bytes > budget) {
            int64_t b = fit_blocks(m, p, ctx, budget);
            if (b < ceil_div(ctx, bs)) return refuse(m, p, out, ctx, err);
            plan_at(m, p, ctx, b, out);
            out->fitted = 1;
        }
    } else { /* nothing asked: the largest context every sequence can hold */
        plan_at(m, p, ctx, (int64_t)p->max_seqs * ceil_div(ctx, bs), out);
        if (budget && out->total_bytes > budget) {
            int64_t c = fit_ctx(m, p, ctx, budget);
            if (c < bs) return refuse(m, p, out, ctx, err);
            plan_at(m, p, c, (int64_t)p->max_seqs * ceil_div(c, bs), out);
            out->fitted = 1;
        }
    }
    out->budget_bytes = budget;
    return ST_OK;
}

size_t st_sched_memory_budget(const st_model *m, const st_backend *b, double fraction) {
    size_t avail = st_sysmem_available();
    if (!avail || !(fraction > 0)) return 0;
    st_model_stats ms;
    st_model_get_stats(m, 4, &ms);
    /* packed copies are resident already; the rest of the weights is read from the mapping
     * and should stay in the page cache */
    const size_t packed = st_backend_is_cpu(b) ? st_backend_cpu_packed_bytes(b) : 0;
    size_t mapped = packed >= ms.weight_bytes ? 0 : ms.weight_bytes - packed;
    double room = fraction * (double)avail - (double)mapped;
    return room > 1 ? (size_t)room : 1;
}

const st_sched_plan *st_sched_get_plan(const st_sched *s) { return &s->plan; }

void st_sched_destroy(st_sched *s) {
    if (!s) return;
    if (s->recs)
        for (int i = 0; i < s->p.max_seqs; i++) {
            st_textout_destroy(s->recs[i].tx);
            free(s->recs[i].hist);
            if (s->recs[i].r) {
                req_free(s->recs[i].r);
            }
        }
    for (req *r = s->qhead; r;) {
        req *n = r->qnext;
        req_free(r);
        r = n;
    }
    free(s->recs);
    free(s->items);
    free(s->im_mrope);
    free(s->im_rows);
    free(s->im_ptrs);
    free(s->im_keys);
    free(s->item_rec);
    if (s->fwd) st_fwd_host_free(s->fwd, s->logits);
    st_gram_vocab_free(s->gram);
    free(s->gram_mask);
    free(s->fork_logits);
    st_sampler_destroy(s->sampler);
    st_fwd_destroy(s->fwd);
    st_cache_destroy(s->cache);
    st_backend_destroy(s->own_backend);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

st_status st_sched_create(const st_model *m, const st_tokenizer *tok, const st_sched_params *p,
                          st_sched **out, st_error *err) {
    *out = NULL;
    if (p->max_seqs < 1 || p->max_seqs > 4096)
        return st_error_set(err, ST_ERR_ARG, "max_seqs must be in [1, 4096]");
    if (p->step_tokens < p->max_seqs)
        return st_error_set(err, ST_ERR_ARG, "step_tokens (%d) must be at least max_seqs (%d)",
                            p->step_tokens, p->max_seqs);
    if (p->max_queue < 0) return st_error_set(err, ST_ERR_ARG, "max_queue must be >= 0");
    if (!(p->stall_timeout_s > 0) || !(p->head_wait_s >= 0))
        return st_error_set(err, ST_ERR_ARG, "stall_timeout_s must be > 0 and head_wait_s >= 0");
    st_sched_plan plan;
    st_status st = st_sched_plan_for(m, p, &plan, err);
    if (st != ST_OK) return st;
    st_sched *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* timed waits on st_now_s's clock */
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->m = m;
    s->tok = tok;
    s->p = *p;
    s->plan = plan;
    s->ctx = s->p.ctx = plan.ctx;
    s->next_id = 1;
    const st_cache_params cp = cache_params_of(m, p, s->ctx, plan.kv_blocks);
    if (p->snapshot_every < 0) {
        st = st_error_set(err, ST_ERR_ARG, "snapshot_every must be >= 0");
        goto fail;
    }
    s->snap_every = (int64_t)(p->snapshot_every > 0 ? p->snapshot_every : 32) * p->block_size;
    st_backend *be = p->backend;
    const st_cpu_params cpu = st_sched_cpu_params(st_cpu_default_params(), p->prefix_cache);
    if (!be && (st = st_backend_cpu_create(m, &cpu, NULL, &s->own_backend, err)) != ST_OK) goto fail;
    if (!be) be = s->own_backend;
    if ((st = st_cache_create(m, &cp, &s->cache, err)) != ST_OK) goto fail;
    st_ctx_params xp = st_cache_ctx_params(s->cache, p->step_tokens + p->max_seqs); /* decodes + chunks */
    if ((st = st_fwd_create(be, &xp, &s->fwd, err)) != ST_OK) goto fail;
    if ((st = st_sampler_create(m->cfg.vocab_size, &s->sampler, err)) != ST_OK) goto fail;
    size_t n = (size_t)p->max_seqs;
    s->recs = calloc(n, sizeof *s->recs);
    s->items = calloc(n, sizeof *s->items);
    s->item_rec = calloc(n, sizeof *s->item_rec);
    s->logits = st_fwd_host_alloc(s->fwd, n * (size_t)m->cfg.vocab_size * sizeof(float)); /* page-locked on a GPU */
    s->fork_logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    if (!s->recs || !s->items || !s->item_rec || !s->logits || !s->fork_logits) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (p->images) {
        const size_t T = (size_t)(p->step_tokens + p->max_seqs);
        s->im_mrope = malloc(T * sizeof *s->im_mrope);
        s->im_rows = malloc(T * sizeof *s->im_rows);
        s->im_ptrs = malloc(T * sizeof *s->im_ptrs);
        s->im_keys = malloc((size_t)p->max_seqs * sizeof *s->im_keys);
        if (!s->im_mrope || !s->im_rows || !s->im_ptrs || !s->im_keys) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = st_fwd_enable_embeds(s->fwd, err)) != ST_OK) goto fail;
    }
    size_t max_tok = tok ? st_textout_max_token_bytes(tok) : 0;
    for (size_t i = 0; i < n; i++) {
        rec *r = &s->recs[i];
        r->seq.slot = -1;
        r->hist = malloc((size_t)s->ctx * sizeof *r->hist);
        if (!r->hist) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory for %lld-token histories",
                              (long long)s->ctx);
            goto fail;
        }
        if (tok && (st = st_textout_create(tok, max_tok, &r->tx, err)) != ST_OK) goto fail;
    }
    s->max_event_text = s->recs[0].tx ? st_textout_max_delta(s->recs[0].tx) : 0;
    s->planned_bytes = s->cache->planned_bytes + st_fwd_bytes(s->fwd) +
                       n * ((size_t)s->ctx * 4 + sizeof(rec) + (size_t)m->cfg.vocab_size * 4) +
                       (size_t)m->cfg.vocab_size * 21 +
                       (p->images ? (size_t)(p->step_tokens + p->max_seqs) * ((size_t)m->cfg.hidden_size * 4 + 32) : 0);
    s->stats.kv_blocks_total = s->cache->p.n_blocks;
    s->stats.planned_bytes = s->planned_bytes;
    *out = s;
    return ST_OK;
fail:
    st_sched_destroy(s);
    return st;
}

const st_cache *st_sched_cache(const st_sched *s) { return s->cache; }
st_fwd *st_sched_forward(const st_sched *s) { return s->fwd; }
int64_t st_sched_context(const st_sched *s) { return s->ctx; }
size_t st_sched_max_event_text(const st_sched *s) { return s->max_event_text; }

/* something changed that a waiting scheduler thread should look at (under mu) */
static void kick(st_sched *s) {
    s->kicks++;
    pthread_cond_broadcast(&s->cv);
}

/* ---------------------------------------------------------------------------------------- */
/* submission (any thread) */

static int64_t blocks_for(const st_sched *s, int64_t positions) {
    if (s->cache->n_full == 0) return 0;
    return (positions + s->p.block_size - 1) / s->p.block_size;
}

/* the tokens a request may generate: max_tokens, bounded by the context */
static int64_t max_new_tokens(const st_sched *s, const req *r) {
    int64_t room = s->ctx - r->n_prompt, want = r->p.max_tokens > 0 ? r->p.max_tokens : room;
    return want < room ? want : room;
}

static int n_choices(const req *r) { return r->p.n > 1 ? r->p.n : 1; }

/* a choice's own blocks once forked: all it will hold but the prompt's full blocks */
static int64_t choice_blocks(const st_sched *s, const req *r) {
    const int64_t all = blocks_for(s, r->n_prompt + max_new_tokens(s, r));
    return s->cache->n_full ? all - r->n_prompt / s->p.block_size : 0;
}

/* the blocks a request may come to hold, every choice counted */
static int64_t request_blocks(const st_sched *s, const req *r) {
    return blocks_for(s, r->n_prompt + max_new_tokens(s, r)) + (n_choices(r) - 1) * choice_blocks(s, r);
}

st_status st_sched_submit(st_sched *s, const int32_t *prompt, int64_t n_prompt,
                          const st_req_params *p, st_event_fn fn, void *user, uint64_t *id,
                          st_error *err) {
    const st_config *c = &s->m->cfg;
    if (n_prompt < 1) return st_error_set(err, ST_ERR_ARG, "the prompt is empty");
    if (n_prompt >= s->ctx)
        return st_error_set(err, ST_ERR_LIMIT,
                            "the prompt has %lld tokens; the context length is %lld",
                            (long long)n_prompt, (long long)s->ctx);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
            return st_error_set(err, ST_ERR_ARG, "prompt token %lld (id %d) is outside the "
                                "vocabulary [0, %lld)", (long long)i, prompt[i], (long long)c->vocab_size);
    st_status st = st_sampling_validate(&p->sampling, c->vocab_size, err);
    if (st != ST_OK) return st;
    if (p->logprobs > ST_MAX_LOGPROBS)
        return st_error_set(err, ST_ERR_ARG, "logprobs must be at most %d", ST_MAX_LOGPROBS);
    if (p->n_stop_ids < 0 || p->n_stop_ids > ST_MAX_STOP_IDS)
        return st_error_set(err, ST_ERR_ARG, "at most %d stop token ids", ST_MAX_STOP_IDS);
    if (p->n_stop < 0 || p->n_stop > ST_MAX_STOP)
        return st_error_set(err, ST_ERR_ARG, "at most %d stop strings", ST_MAX_STOP);
    if (p->n < 0 || p->n > ST_MAX_CHOICES || p->n > s->p.max_seqs)
        return st_error_set(err, ST_ERR_ARG, "n (%d) must be in [1, %d] (the sequences this server runs at once)", p->n,
                            s->p.max_seqs < ST_MAX_CHOICES ? s->p.max_seqs : ST_MAX_CHOICES);
    if ((p->n_stop || p->split_reasoning) && !s->tok)
        return st_error_set(err, ST_ERR_ARG, "stop strings and reasoning need a tokenizer");
    if (p->json_mode < 0 || p->json_mode > ST_GRAM_GBNF)
        return st_error_set(err, ST_ERR_ARG, "json_mode %d is not a grammar mode", p->json_mode);
    if ((p->json_mode == ST_GRAM_JSON_SCHEMA || p->json_mode == ST_GRAM_TOOL_CALL || p->json_mode == ST_GRAM_GBNF) !=
        (p->json_schema != NULL))
        return st_error_set(err, ST_ERR_ARG, "a compiled schema goes with json_mode ST_GRAM_JSON_SCHEMA, ST_GRAM_TOOL_CALL or ST_GRAM_GBNF, and only with them");
    if (p->json_mode) {
        if (!s->tok) return st_error_set(err, ST_ERR_ARG, "JSON output needs a tokenizer");
        pthread_mutex_lock(&s->mu);
        st_status gs = ST_OK;
        if (!s->gram) { /* once: every token's bytes in a trie, and a mask buffer */
            st_gram_vocab *v = NULL;
            gs = st_gram_vocab_create(s->tok, c->vocab_size, &v, err);
            uint32_t *mask = gs == ST_OK ? malloc(st_gram_mask_words(v) * sizeof *mask) : NULL;
            if (gs == ST_OK && !mask) gs = st_error_set(err, ST_ERR_NOMEM, "out of memory for the JSON masks");
            if (gs == ST_OK) s->gram = v, s->gram_mask = mask;
            else st_gram_vocab_free(v);
        }
        pthread_mutex_unlock(&s->mu);
        if (gs != ST_OK) return gs;
    }
    req *r = calloc(1, sizeof *r);
    if (!r) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    if (!r->prompt) {
        free(r);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    r->p = *p;
    for (int i = 0; i < p->n_stop; i++) {
        size_t len = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (len == 0 || len > ST_MAX_STOP_LEN) {
            req_free(r);
            return st_error_set(err, ST_ERR_ARG, "stop strings must be 1 to %d bytes", ST_MAX_STOP_LEN);
        }
        memcpy(r->stop_buf[i], p->stop[i], len + 1);
        r->p.stop[i] = r->stop_buf[i];
    }
    if (p->images) { /* the image parts, checked and copied */
        const st_req_images *im = p->images;
        const int64_t d = c->hidden_size;
        const char *bad = !s->p.images ? "this scheduler was made without images (st_sched_params.images)"
                          : !im->mrope || im->n_rows < 0 || im->n_rows > n_prompt || (im->n_rows && (!im->rows || !im->embeds))
                              ? "the image parts are incomplete"
                          : im->next < 0 || im->next > (1 << 30) ? "the image parts' next position is out of range"
                                                                 : NULL;
        for (int64_t i = 0; !bad && i < im->n_rows; i++)
            if (im->rows[i] < (i ? im->rows[i - 1] + 1 : 0) || im->rows[i] >= n_prompt) bad = "image rows must increase within the prompt";
        for (int64_t i = 0; !bad && i < n_prompt; i++)
            for (int a = 0; a < 3; a++)
                if (im->mrope[i][a] < 0 || im->mrope[i][a] > (1 << 30)) bad = "an image prompt's rotary position is out of range";
        const size_t bytes = (size_t)n_prompt * (sizeof *im->mrope + (im->keys ? sizeof(int32_t) : 0)) +
                             (size_t)im->n_rows * (sizeof(int64_t) + (size_t)d * sizeof(float));
        if (!bad && !(r->im_mem = malloc(bytes + 1))) bad = "out of memory for the image parts";
        if (bad) {
            req_free(r);
            return st_error_set(err, ST_ERR_ARG, "%s", bad);
        }
        int64_t *rows = r->im_mem; /* the widest elements first: every part aligned */
        float *emb = (float *)(rows + im->n_rows);
        int32_t(*m3)[3] = (int32_t(*)[3])(emb + im->n_rows * d);
        memcpy(m3, im->mrope, (size_t)n_prompt * sizeof *m3);
        memcpy(rows, im->rows, (size_t)im->n_rows * sizeof *rows);
        memcpy(emb, im->embeds, (size_t)(im->n_rows * d) * sizeof *emb);
        int32_t *keys = im->keys ? (int32_t *)(m3 + n_prompt) : NULL;
        if (keys) memcpy(keys, im->keys, (size_t)n_prompt * sizeof *keys);
        r->im = (st_req_images){(const int32_t(*)[3])m3, im->next, im->n_rows, rows, emb, keys};
    }
    r->p.images = NULL;
    r->fn = fn;
    r->user = user;
    r->t_submit = st_now_s();
    /* every accepted request must fit the pool alone (else it would wait forever) */
    const int64_t need = request_blocks(s, r);
    if (need > s->cache->p.n_blocks) {
        const int nc = n_choices(r);
        const int64_t new_tokens = max_new_tokens(s, r);
        req_free(r);
        return st_error_set(err, ST_ERR_LIMIT,
                            "%d choices of up to %lld tokens after a %lld-token prompt need %lld KV blocks; the "
                            "pool has %lld: lower max_tokens or n",
                            nc, (long long)new_tokens, (long long)n_prompt, (long long)need,
                            (long long)s->cache->p.n_blocks);
    }
    pthread_mutex_lock(&s->mu);
    if (s->broken) {
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return st_error_set(err, ST_ERR_IO, "the engine cannot run: %s", s->broken_msg);
    }
    if (s->n_waiting + s->n_running >= s->p.max_seqs + s->p.max_queue) {
        int running = s->n_running, waiting = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return st_error_set(err, ST_ERR_BUSY,
                            "the server is busy: %d requests are running and %d waiting",
                            running, waiting);
    }
    r->id = s->next_id++;
    r->schema = p->json_schema; /* taken: the submit succeeds */
    r->p.json_schema = NULL;
    r->next = s->live;
    if (s->live) s->live->prev = r;
    s->live = r;
    if (s->qtail) s->qtail->qnext = r;
    else s->qhead = r;
    s->qtail = r;
    s->n_waiting++;
    s->stats.waiting = s->n_waiting;
    kick(s);
    pthread_mutex_unlock(&s->mu);
    if (id) *id = r->id;
    return ST_OK;
}

static req *find_live(st_sched *s, uint64_t id) {
    for (req *r = s->live; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

void st_sched_cancel(st_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    req *r = find_live(s, id);
    int zero = 0;
    if (r) atomic_compare_exchange_strong(&r->cancelled, &zero, 1);
    kick(s);
    pthread_mutex_unlock(&s->mu);
}

int st_sched_broken(st_sched *s, char *why, size_t cap) {
    pthread_mutex_lock(&s->mu);
    const int b = s->broken;
    if (b && why && cap) snprintf(why, cap, "%s", s->broken_msg);
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* (scheduler thread) a step failed so that no later one can run: every live request fails */
static void break_engine(st_sched *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    if (!s->broken) {
        s->broken = 1;
        snprintf(s->broken_msg, sizeof s->broken_msg, "%.159s", why);
    }
    for (req *r = s->live; r; r = r->next) {
        if (atomic_load(&r->cancelled) != 0) continue;
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", s->broken_msg);
        atomic_store(&r->cancelled, 2);
    }
    kick(s);
    pthread_mutex_unlock(&s->mu);
}

void st_sched_fail(st_sched *s, uint64_t id, const char *why) {
    pthread_mutex_lock(&s->mu);
    req *r = find_live(s, id);
    if (r && atomic_load(&r->cancelled) == 0) {
        snprintf(r->fail_msg, sizeof r->fail_msg, "%s", why ? why : "failed");
        atomic_store(&r->cancelled, 2);
    }
    kick(s);
    pthread_mutex_unlock(&s->mu);
}

void st_sched_resume(st_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    req *r = find_live(s, id);
    if (r) atomic_fetch_sub(&r->hold, 1);
    kick(s);
    pthread_mutex_unlock(&s->mu);
}

int st_sched_wait(st_sched *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->shutdown && s->kicks == s->kicks_seen &&
           (s->idle || s->n_waiting + s->n_running == 0)) {
        if (s->next_deadline > 0 && s->n_running > 0) {
            double t = s->next_deadline;
            struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
            if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) break; /* the deadline */
        } else {
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    int alive = !s->shutdown;
    pthread_mutex_unlock(&s->mu);
    return alive;
}

void st_sched_shutdown(st_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->shutdown = 1;
    kick(s);
    pthread_mutex_unlock(&s->mu);
}

void st_sched_get_stats(st_sched *s, st_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* the scheduler thread */

/* unlink from the live list and free (after its DONE event) */
static void retire(st_sched *s, req *r, st_finish_reason why) {
    pthread_mutex_lock(&s->mu);
    if (r->prev) r->prev->next = r->next;
    else s->live = r->next;
    if (r->next) r->next->prev = r->prev;
    s->stats.finished[why]++;
    pthread_mutex_unlock(&s->mu);
    req_free(r);
}

/* the common part of a DONE event */
static void done_event(st_event *ev, const req *r, st_finish_reason why, const char *error) {
    memset(ev, 0, sizeof *ev);
    ev->kind = ST_EV_DONE;
    ev->id = r->id;
    ev->last = 1;
    ev->finish = why;
    ev->error = error;
}

/* End a running sequence: release text, emit DONE, return its slot and blocks. */
static void finish_rec(st_sched *s, rec *c, st_finish_reason why, const char *error) {
    req *r = c->r;
    st_event ev;
    done_event(&ev, r, why, error);
    ev.index = c->index;
    ev.last = --r->live == 0;
    if (c->fork_pending) { /* it ended before it forked: the records it reserved are free */
        s->recs_reserved -= c->fork_pending;
        c->fork_pending = 0;
    }
    if (c->tx && why != ST_FINISH_ERROR) {
        st_text_delta d;
        st_textout_finish(c->tx, &d);
        ev.content = d.content;
        ev.content_len = d.content_len;
        ev.reasoning = d.reasoning;
        ev.reasoning_len = d.reasoning_len;
    }
    ev.usage.prompt_tokens = c->n_prompt;
    ev.usage.completion_tokens = c->n_new;
    ev.usage.reasoning_tokens = c->n_reasoning;
    ev.usage.cached_tokens = c->n_cached;
    ev.logprob_sum = c->lp_sum;
    double t = st_now_s();
    ev.queue_s = c->t_admit - r->t_submit;
    ev.ttft_s = c->t_first > 0 ? c->t_first - r->t_submit : 0;
    ev.total_s = t - r->t_submit;
    if (r->fn) r->fn(r->user, &ev);
    st_cache_seq_release(s->cache, &c->seq);
    c->r = NULL;
    if (!ev.last) return;
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    pthread_mutex_unlock(&s->mu);
    retire(s, r, why);
}

/* DONE for a request that never ran (cancelled while waiting, or refused at admission) */
static void finish_queued(st_sched *s, req *r, st_finish_reason why, const char *error) {
    st_event ev;
    done_event(&ev, r, why, error);
    ev.usage.prompt_tokens = r->n_prompt;
    ev.total_s = st_now_s() - r->t_submit;
    ev.queue_s = ev.total_s;
    if (r->fn) r->fn(r->user, &ev);
    retire(s, r, why);
}

/* KV blocks promised to running sequences but not yet taken */
static int64_t committed_blocks(const st_sched *s) {
    int64_t c = 0;
    for (int i = 0; i < s->p.max_seqs; i++)
        if (s->recs[i].r) c += s->recs[i].budget_blocks - s->recs[i].seq.n_blocks;
    return c;
}

static void unlink_queued(st_sched *s, req *prev, req *r) {
    if (prev) prev->qnext = r->qnext;
    else s->qhead = r->qnext;
    if (s->qtail == r) s->qtail = prev;
    r->qnext = NULL;
    s->n_waiting--;
    s->stats.waiting = s->n_waiting;
}

/* (under mu) unlink every cancelled request of the queue; returns them as a list */
static req *take_cancelled(st_sched *s) {
    req *out = NULL, **tail = &out, *prev = NULL;
    for (req *r = s->qhead; r;) {
        req *next = r->qnext;
        if (atomic_load(&r->cancelled)) {
            unlink_queued(s, prev, r);
            *tail = r;
            tail = &r->qnext;
        } else {
            prev = r;
        }
        r = next;
    }
    return out;
}

/* (under mu) the first queued request whose budget the pool can hold now, with records for
 * its choices. Requests behind one that is short may pass it until it has waited head_wait_s. */
static req *take_admissible(st_sched *s, double now, int free_recs) {
    int64_t avail = st_cache_available_blocks(s->cache) - committed_blocks(s);
    req *prev = NULL;
    for (req *r = s->qhead; r; prev = r, r = r->qnext) {
        if (request_blocks(s, r) <= avail && n_choices(r) <= free_recs) {
            unlink_queued(s, prev, r);
            s->n_running++;
            return r;
        }
        if (r->t_blocked == 0) r->t_blocked = now;
        if (now - r->t_blocked >= s->p.head_wait_s) return NULL; /* its turn: nobody passes */
    }
    return NULL;
}

static int free_rec(const st_sched *s) {
    for (int i = 0; i < s->p.max_seqs; i++)
        if (!s->recs[i].r) return i;
    return -1;
}

/* free records not promised to a fork */
static int free_recs(const st_sched *s) {
    int n = 0;
    for (int i = 0; i < s->p.max_seqs; i++) n += !s->recs[i].r;
    return n - s->recs_reserved;
}

/* Admit what fits; returns 1 when anything was admitted or dropped. */
static int admit(st_sched *s) {
    int changed = 0;
    for (;;) {
        double now = st_now_s();
        const int nfree = free_recs(s);
        int slot = nfree > 0 ? free_rec(s) : -1;
        pthread_mutex_lock(&s->mu);
        req *cancelled = take_cancelled(s);
        req *r = slot >= 0 ? take_admissible(s, now, nfree) : NULL;
        pthread_mutex_unlock(&s->mu);
        for (req *c = cancelled; c;) {
            req *next = c->qnext;
            if (atomic_load(&c->cancelled) == 2) finish_queued(s, c, ST_FINISH_ERROR, c->fail_msg);
            else finish_queued(s, c, ST_FINISH_CANCELLED, NULL);
            c = next;
            changed = 1;
        }
        if (!r) return changed;
        changed = 1;
        rec *c = &s->recs[slot];
        st_error err = {0};
        int snap_slot = -1;
        const int private_kv = r->im_mem && !r->im.keys; /* images the cache could not tell apart */
        st_status st = private_kv ? st_cache_seq_start(s->cache, &c->seq, &err)
                                  : st_cache_seq_start_prefix(s->cache, &c->seq, r->im_mem ? r->im.keys : r->prompt,
                                                              r->n_prompt, &snap_slot, &err);
        if (st == ST_OK && private_kv) c->seq.private_kv = 1;
        if (st == ST_OK && snap_slot >= 0) st_fwd_state_copy(s->fwd, snap_slot, c->seq.slot);
        if (st == ST_OK && c->tx)
            st = st_textout_reset(c->tx, r->p.stop, r->p.n_stop, r->p.split_reasoning,
                                  r->p.start_in_reasoning, r->p.skip_special, &err);
        if (st != ST_OK) {
            if (c->seq.slot >= 0) st_cache_seq_release(s->cache, &c->seq);
            pthread_mutex_lock(&s->mu);
            s->n_running--;
            pthread_mutex_unlock(&s->mu);
            finish_queued(s, r, ST_FINISH_ERROR, err.msg);
            continue;
        }
        c->r = r;
        c->gram_on = r->p.json_mode != 0;
        st_gram_init(&c->gram, (st_gram_mode)r->p.json_mode);
        st_gram_begin(&c->gram, r->schema);
        memcpy(c->hist, r->prompt, (size_t)r->n_prompt * sizeof *c->hist);
        c->n_hist = c->n_prompt = r->n_prompt;
        free(r->prompt);
        r->prompt = NULL;
        c->n_fed = c->n_cached = c->seq.n_past; /* positions resumed from the prefix cache */
        c->n_new = c->n_reasoning = 0;
        c->max_new = max_new_tokens(s, r);
        c->budget_blocks = request_blocks(s, r);
        c->index = 0;
        c->lp_sum = 0;
        c->fork_pending = n_choices(r) - 1;
        s->recs_reserved += c->fork_pending;
        r->live = 1;
        c->order = s->admit_counter++;
        c->t_admit = now;
        c->t_first = 0;
        c->paused = 0;
        c->error[0] = 0;
        st_sampler_state_init(&c->ss, &r->p.sampling);
    }
}

static int is_stop_token(const st_sched *s, const rec *c, int32_t t) {
    const st_req_params *p = &c->r->p;
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == t) return 1;
    if (!p->ignore_eos)
        for (int i = 0; i < s->m->cfg.n_eos; i++)
            if (s->m->cfg.eos_ids[i] == t) return 1;
    return 0;
}

/* the logits mode of c's next row: compact where its sampling needs no more */
static int32_t row_mode(const st_sched *s, const rec *c) {
    const int fits = (int64_t)sizeof(st_logit_top) <= s->m->cfg.vocab_size * (int64_t)sizeof(float);
    return s->p.logits_top && fits && !c->gram_on && !c->fork_pending && st_sampler_top_ok(&c->r->p.sampling)
               ? ST_LOGITS_LAST_TOP
               : ST_LOGITS_LAST;
}

/* After the model produced logits for c (a compact row when top): sample, emit, and maybe
 * finish. */
static void on_logits(st_sched *s, rec *c, float *logits, int top) {
    req *r = c->r;
    const st_logit_top *row_top = top ? (const st_logit_top *)(void *)logits : NULL;
    if (top ? !row_top->finite : !st_logits_finite(logits, s->m->cfg.vocab_size)) {
        snprintf(c->error, sizeof c->error,
                 "the model produced non-finite logits (NaN or infinity) at position %lld",
                 (long long)c->n_hist);
        finish_rec(s, c, ST_FINISH_ERROR, c->error);
        return;
    }
    /* JSON output: only tokens that keep the reply inside the grammar (after any reasoning) */
    const int constrain = !top && c->gram_on && !(c->tx && st_textout_in_reasoning(c->tx));
    const int may_end = constrain && c->gram.mode == ST_GRAM_GBNF && !r->p.ignore_eos && st_gram_may_end(&c->gram);
    if (constrain) {
        int64_t n = st_gram_mask(s->gram, r->schema, &c->gram, s->gram_mask);
        if (may_end) /* a GBNF sentence may end: the end-of-sequence tokens too */
            for (int i = 0; i < s->m->cfg.n_eos; i++) {
                const int32_t e = s->m->cfg.eos_ids[i];
                if (e >= 0 && e < s->m->cfg.vocab_size) s->gram_mask[e / 32] |= 1u << (e % 32), n++;
            }
        if (n == 0) {
            snprintf(c->error, sizeof c->error, "no token continues the constrained reply");
            finish_rec(s, c, ST_FINISH_ERROR, c->error);
            return;
        }
        st_gram_apply(s->gram_mask, logits, s->m->cfg.vocab_size);
    }
    const int want_lp = r->p.logprobs >= 0;
    st_logprobs *lp = want_lp || r->p.sum_logprobs ? &c->lp : NULL;
    int32_t t = top ? st_sampler_sample_top(s->sampler, &r->p.sampling, &c->ss, row_top, want_lp ? r->p.logprobs : 0, lp)
                    : st_sampler_sample(s->sampler, &r->p.sampling, &c->ss, logits, c->hist, c->n_prompt, c->n_hist,
                                        want_lp ? r->p.logprobs : 0, lp);
    if (constrain && !(may_end && is_stop_token(s, c, t)) && !st_gram_advance(s->gram, r->schema, &c->gram, t)) {
        /* the mask let only such tokens through */
        snprintf(c->error, sizeof c->error, "token %d does not continue the constrained reply (a bug)", t);
        finish_rec(s, c, ST_FINISH_ERROR, c->error);
        return;
    }
    if (lp) c->lp_sum += lp->logprob;
    if (!want_lp) lp = NULL;
    c->hist[c->n_hist++] = t;
    c->n_new++;
    if (c->t_first == 0) c->t_first = st_now_s();
    int stop_token = is_stop_token(s, c, t);
    st_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = ST_EV_TOKEN;
    ev.id = r->id;
    ev.index = c->index;
    ev.token = t;
    ev.logprobs = lp;
    int stopped = 0;
    if (c->tx) {
        int was_reasoning = st_textout_in_reasoning(c->tx);
        st_text_delta d;
        if (!stop_token) st_textout_feed(c->tx, t, &d);
        else memset(&d, 0, sizeof d);
        if (was_reasoning) c->n_reasoning++;
        ev.content = d.content;
        ev.content_len = d.content_len;
        ev.reasoning = d.reasoning;
        ev.reasoning_len = d.reasoning_len;
        stopped = d.stopped;
    }
    if (r->fn && r->fn(r->user, &ev) == ST_EV_PAUSE && atomic_fetch_add(&r->hold, 1) >= 0 &&
        !c->paused) {
        c->paused = 1;
        c->t_paused = st_now_s();
    }
    pthread_mutex_lock(&s->mu);
    s->stats.tokens_generated++;
    pthread_mutex_unlock(&s->mu);
    if (stop_token || stopped || (constrain && st_gram_done(&c->gram))) finish_rec(s, c, ST_FINISH_STOP, NULL);
    else if (c->n_new >= c->max_new) finish_rec(s, c, ST_FINISH_LENGTH, NULL);
}

/* Cancellations and stall timeouts take effect; pauses start and end. Returns 1 when a
 * sequence ended. */
static int check_running(st_sched *s, double now) {
    int ended = 0;
    double deadline = 0;
    for (int i = 0; i < s->p.max_seqs; i++) {
        rec *c = &s->recs[i];
        if (!c->r) continue;
        const int cancelled = atomic_load(&c->r->cancelled);
        if (cancelled == 2) {
            snprintf(c->error, sizeof c->error, "%s", c->r->fail_msg);
            finish_rec(s, c, ST_FINISH_ERROR, c->error);
            ended = 1;
            continue;
        }
        if (cancelled) {
            finish_rec(s, c, ST_FINISH_CANCELLED, NULL);
            ended = 1;
            continue;
        }
        if (atomic_load(&c->r->hold) <= 0) {
            c->paused = 0;
            continue;
        }
        if (!c->paused) {
            c->paused = 1;
            c->t_paused = now;
        }
        double due = c->t_paused + s->p.stall_timeout_s;
        if (now >= due) {
            snprintf(c->error, sizeof c->error, "the client did not read its stream for %.0f s",
                     s->p.stall_timeout_s);
            finish_rec(s, c, ST_FINISH_ERROR, c->error);
            ended = 1;
        } else if (deadline == 0 || due < deadline) {
            deadline = due;
        }
    }
    pthread_mutex_lock(&s->mu);
    s->next_deadline = deadline;
    pthread_mutex_unlock(&s->mu);
    return ended;
}

/* A request of n choices after its prompt: the parent's sequence forks into n - 1 more
 * (records and blocks were reserved at admission); each samples the prompt's logits with its
 * own stream (seeded requests: the seed plus the choice's index, in a fixed mix). */
static void fork_choices(st_sched *s, rec *parent, const float *row) {
    req *r = parent->r;
    const int64_t own = choice_blocks(s, r), V = s->m->cfg.vocab_size;
    int kids[ST_MAX_CHOICES];
    const int n = parent->fork_pending;
    for (int i = 0; i < n; i++) {
        const int k = free_rec(s);
        ST_ASSERT(k >= 0);
        rec *c = &s->recs[k];
        st_error err = {0};
        st_status st = st_cache_seq_start(s->cache, &c->seq, &err);
        ST_ASSERT(st == ST_OK); /* a record has a slot */
        if (c->tx)
            st = st_textout_reset(c->tx, r->p.stop, r->p.n_stop, r->p.split_reasoning, r->p.start_in_reasoning,
                                  r->p.skip_special, &err);
        ST_ASSERT(st == ST_OK); /* the parent's reset took the same parameters */
        int32_t from = -1;
        const int32_t to = st_cache_seq_fork(s->cache, &parent->seq, &c->seq, &from);
        if (to >= 0) st_fwd_kv_copy(s->fwd, from, to);
        st_fwd_state_copy(s->fwd, parent->seq.slot, c->seq.slot);
        c->r = r;
        c->gram_on = parent->gram_on;
        c->gram = parent->gram;
        memcpy(c->hist, parent->hist, (size_t)parent->n_hist * sizeof *c->hist);
        c->n_hist = parent->n_hist;
        c->n_prompt = parent->n_prompt;
        c->n_fed = parent->n_fed;
        c->n_cached = parent->n_cached; /* every choice reports the request's prompt */
        c->n_new = c->n_reasoning = 0;
        c->max_new = parent->max_new;
        c->budget_blocks = blocks_for(s, c->n_prompt + c->max_new);
        c->index = i + 1;
        c->fork_pending = 0;
        c->lp_sum = 0;
        c->order = parent->order;
        c->t_admit = parent->t_admit;
        c->t_first = 0;
        c->paused = parent->paused;
        c->t_paused = parent->t_paused;
        c->error[0] = 0;
        st_sampling sp = r->p.sampling;
        sp.seed = st_splitmix64(sp.seed + 0x9e3779b97f4a7c15ull * (uint64_t)c->index);
        st_sampler_state_init(&c->ss, &sp);
        kids[i] = k;
        s->recs_reserved--;
        r->live++;
    }
    parent->fork_pending = 0;
    parent->budget_blocks -= (int64_t)n * own;
    for (int i = 0; i < n; i++) { /* the parent's row stays unchanged for the parent */
        rec *c = &s->recs[kids[i]];
        if (!c->r) continue;
        memcpy(s->fork_logits, row, (size_t)V * sizeof *row);
        on_logits(s, c, s->fork_logits, 0);
    }
}

/* A prompt chunk of c from n_fed, at most `take` tokens, with the prefix cache: it stops at
 * the next snapshot point, a multiple of snap_every or the last block boundary before the
 * prompt's end. (Decode tokens do not count against the chunk budget, so chunks of a prompt
 * that runs beside others still end on those points.) */
static int64_t chunk_for_snapshots(const st_sched *s, const rec *c, int64_t take) {
    if (!s->cache->p.prefix) return take;
    const int64_t bs = s->p.block_size, from = c->n_fed, last = (c->n_prompt - 1) / bs * bs;
    int64_t point = (from / s->snap_every + 1) * s->snap_every;
    if (from < last && point > last) point = last;
    return point > from && point < from + take ? point - from : take;
}

/* After a step that ran c: a public snapshot where its prefill stopped at a snapshot point;
 * while it decodes, its private snapshot moves to each block boundary it reaches. */
static void take_snapshot(st_sched *s, rec *c, int prefill) {
    if (!s->cache->p.prefix || !c->r || c->seq.private_kv) return;
    const int64_t pos = c->seq.n_past, bs = s->p.block_size;
    if (pos <= 0 || pos % bs) return;
    int to = -1;
    if (prefill && pos < c->n_prompt) {
        if (pos % s->snap_every == 0 || pos == (c->n_prompt - 1) / bs * bs) to = st_cache_snap_public(s->cache, &c->seq);
    } else if (!prefill) {
        to = st_cache_snap_private(s->cache, &c->seq);
    }
    if (to >= 0) st_fwd_state_copy(s->fwd, c->seq.slot, to);
}

/* A step holding a prompt with images: every token's rotary positions (a text sequence's
 * at its position on every axis, an image prompt's as built, its generated tokens on from
 * the prompt's next position) and the image rows of the prompt chunks. */
static st_status run_images(st_sched *s, int n, st_error *err) {
    int64_t t = 0, ne = 0;
    for (int k = 0; k < n; k++) {
        const rec *c = &s->recs[s->item_rec[k]];
        const req *r = c->r;
        for (int j = 0; j < s->items[k].n_tokens; j++, t++) {
            const int64_t pos = c->seq.n_past + j;
            int32_t p3[3] = {(int32_t)pos, (int32_t)pos, (int32_t)pos};
            if (r->im_mem && pos < c->n_prompt) memcpy(p3, r->im.mrope[pos], sizeof p3);
            else if (r->im_mem) p3[0] = p3[1] = p3[2] = (int32_t)(pos - c->n_prompt + r->im.next);
            memcpy(s->im_mrope[t], p3, sizeof p3);
        }
        if (r->im_mem && c->n_fed < c->n_prompt) /* the chunk's image rows */
            for (int64_t i = 0; i < r->im.n_rows; i++) {
                const int64_t q = r->im.rows[i];
                if (q < c->seq.n_past || q >= c->seq.n_past + s->items[k].n_tokens) continue;
                s->im_rows[ne] = t - s->items[k].n_tokens + (q - c->seq.n_past);
                s->im_ptrs[ne++] = r->im.embeds + i * s->m->cfg.hidden_size;
            }
    }
    for (int k = 0; k < n; k++) { /* an image prompt's chunks: the cache keys their rows by their pixels */
        const rec *c = &s->recs[s->item_rec[k]];
        s->im_keys[k] = c->r->im.keys && c->n_fed < c->n_prompt ? c->r->im.keys + c->n_fed : NULL;
    }
    const st_batch_images im = {&s->im_mrope[0][0], ne, s->im_rows, s->im_ptrs, s->im_keys};
    return st_batch_run_images(s->cache, s->fwd, s->items, n, &im, s->logits, err);
}

int st_sched_step(st_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->kicks_seen = s->kicks;
    pthread_mutex_unlock(&s->mu);
    int progress = check_running(s, st_now_s());
    progress |= admit(s);
    /* the batch: decode tokens first, then prompt chunks, oldest sequence first */
    int n = 0, budget = s->p.step_tokens, paused = 0; /* the prompt chunks' budget */
    for (int i = 0; i < s->p.max_seqs; i++) {
        rec *c = &s->recs[i];
        paused += c->r && c->paused;
        if (!c->r || c->n_fed < c->n_prompt || c->paused) continue;
        s->items[n] = (st_batch_item){&c->seq, &c->hist[c->n_hist - 1], 1, row_mode(s, c)};
        s->item_rec[n++] = i;
    }
    for (;;) {
        int best = -1;
        for (int i = 0; i < s->p.max_seqs; i++) {
            rec *c = &s->recs[i];
            int queued = 0;
            for (int k = 0; k < n; k++) queued |= s->item_rec[k] == i;
            if (c->r && c->n_fed < c->n_prompt && !queued &&
                (best < 0 || c->order < s->recs[best].order))
                best = i;
        }
        if (best < 0 || budget <= 0) break;
        rec *c = &s->recs[best];
        int64_t take = c->n_prompt - c->n_fed;
        if (take > budget) take = budget;
        take = chunk_for_snapshots(s, c, take);
        s->items[n] = (st_batch_item){&c->seq, &c->hist[c->n_fed], (int)take,
                                      c->n_fed + take == c->n_prompt ? row_mode(s, c) : ST_LOGITS_NONE};
        s->item_rec[n++] = best;
        budget -= (int)take;
    }
    if (n > 0) {
        progress = 1;
        st_error err = {0};
        int images = 0;
        for (int k = 0; k < n; k++) images |= s->recs[s->item_rec[k]].r->im_mem != NULL;
        st_status st;
        if (images) st = run_images(s, n, &err);
        else st = st_batch_run(s->cache, s->fwd, s->items, n, s->logits, &err);
        if (st != ST_OK) {
            for (int k = 0; k < n; k++) finish_rec(s, &s->recs[s->item_rec[k]], ST_FINISH_ERROR, err.msg);
            if (st == ST_ERR_IO) break_engine(s, err.msg);
        } else {
            int64_t row = 0, prefilled = 0;
            for (int k = 0; k < n; k++) {
                rec *c = &s->recs[s->item_rec[k]];
                const int prefill = c->n_fed < c->n_prompt;
                if (prefill) prefilled += s->items[k].n_tokens;
                c->n_fed += s->items[k].n_tokens;
                take_snapshot(s, c, prefill);
                if (s->items[k].logits == ST_LOGITS_NONE) continue;
                float *lg = s->logits + row * s->m->cfg.vocab_size;
                if (c->fork_pending && c->n_fed == c->n_prompt) fork_choices(s, c, lg);
                on_logits(s, c, lg, s->items[k].logits == ST_LOGITS_LAST_TOP);
                row++;
            }
            pthread_mutex_lock(&s->mu);
            s->stats.steps++;
            s->stats.tokens_prefilled += prefilled;
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_lock(&s->mu);
    s->idle = !progress;
    s->stats.running = s->n_running;
    s->stats.paused = paused;
    s->stats.kv_blocks_used = s->cache->p.n_blocks - st_cache_available_blocks(s->cache);
    s->stats.prefix = s->cache->stats;
    s->stats.prefix.cached_blocks = s->cache->n_cached_blocks;
    int left = s->n_waiting + s->n_running;
    pthread_mutex_unlock(&s->mu);
    return left;
}

int st_sched_seq_info(st_sched *s, uint64_t id, st_seq_info *out) {
    for (int i = 0; i < s->p.max_seqs; i++) {
        rec *c = &s->recs[i];
        if (!c->r || c->r->id != id) continue;
        out->slot = c->seq.slot;
        out->n_past = c->seq.n_past;
        out->n_tokens = c->n_hist;
        out->n_generated = c->n_new;
        out->n_blocks = c->seq.n_blocks;
        out->blocks = c->seq.blocks;
        out->record_bytes = sizeof *c;
        return 1;
    }
    return 0;
}
