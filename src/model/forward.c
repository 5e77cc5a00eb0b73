/* ==== Forward pass over a ragged batch (see forward.h and spec/text-model.md section 4) ====
 *
 * Every heavy loop is a parallel region on the context's pool (core/threadpool.h) with a
 * static partition; none of the partitions changes what is computed for a token:
 *   - matrix products: each matrix's rows split over the threads (st_kernels matmul is
 *     row-range and batch invariant); gate/up apply SiLU-multiply to their own rows;
 *   - Gated DeltaNet: tasks (item, key head) weighted by tokens; a task runs the causal conv
 *     of its channels, the L2 norms, the recurrence of the value heads reading that key head
 *     and their gated norms. Runs of 64 tokens starting at a position that is a multiple of
 *     64 use the chunked form (spec 4.7), every other token the fused per-timestep step, so
 *     the choice depends only on the sequence's own positions and item;
 *   - attention: tasks (item, KV head, tile of query tokens); the context is read in fixed
 *     512-position chunks (absolute positions), each chunk giving a partial (max, sum,
 *     weighted V) that is merged in chunk order. When a step has fewer tasks than threads
 *     (decode of few sequences) the chunks are spread over the threads and merged after a
 *     barrier: the same partials, the same merge order, the same bits.
 */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/balance.h"
#include "core/clock.h"
#include "core/mem.h"
#include "core/numeric.h"
#include "core/threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* Subnormal floats take microcode assists (over 100 cycles per operation): the GDN decays
 * (exp of large negative cumulative log-decays) and states produce them, and a layer can
 * slow down tenfold. The forward pass therefore runs with flush-to-zero and
 * denormals-are-zero on every thread (the pool's workers are set once at creation; the
 * calling thread's MXCSR is saved and restored around st_fwd_run). Values below 1.2e-38 are
 * treated as 0, on every kernel set alike. */
#define FP_FAST_MODE 0x8040u /* FTZ | DAZ */
static unsigned fp_mode_enter(void) {
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | FP_FAST_MODE);
    return old;
}
static void fp_mode_leave(unsigned old) { _mm_setcsr(old); }
#else
static unsigned fp_mode_enter(void) { return 0; }
static void fp_mode_leave(unsigned old) { (void)old; }
#endif

#define ATT_CHUNK 512 /* positions per attention partial (absolute grid) */
#define ATT_QMAX 64   /* query vectors per attention task (tokens x heads of one KV head) */
#define GDN_C 64      /* chunk of the chunked delta rule */
#define SPLIT_TOK 8   /* at most this many decode tokens spread attention chunks over threads */
#define PAR_MIN 8     /* fewer tokens than this: small per-token loops run on the caller */
#define PAR_WORK 65536 /* a region with less work than this (multiply-adds) runs on the caller:
                          starting threads would cost more than it saves (tiny models) */

/* per-thread scratch (all owned) */
typedef struct fwd_thread {
    float *mm;        /* matmul scratch: st_kernels_matmul_scratch(max cols) */
    float *tmp;       /* [conv_dim] conv outputs of one token */
    float *rope_cos;  /* [rope_dim/2] */
    float *rope_sin;
    float *att_q;     /* [qmax][hd] scaled queries of a task (qmax = st_fwd.att_qmax) */
    float *att_s;     /* [qmax][ATT_CHUNK] scores / probabilities of a chunk */
    float *att_oc;    /* [qmax][hd] a chunk's weighted V */
    float *att_o;     /* [qmax][hd] merged output */
    float *att_m;     /* [4][qmax] merged max, sum; chunk max, sum */
    int64_t *att_pos; /* [qmax] position of each query */
    float *gdn;       /* chunked delta-rule work area (gdn_ws_floats) */
    float *gates;     /* [max_tokens][2] beta, log-decay of one head over an item */
} fwd_thread;

struct st_fwd {
    const st_model *m;
    st_cache *cache;          /* borrowed */
    const st_kernels *k;      /* borrowed, static */
    st_pool *pool;            /* owned */
    int n_threads;
    int gdn_chunked;
    int64_t par_work;         /* min_parallel_work */
    int max_tokens;
    int att_qmax;             /* query vectors per attention task: max(ATT_QMAX, group) */
    size_t scratch_bytes;
    /* activations, T = max_tokens (all owned) */
    float *x;       /* [T][d] residual stream */
    float *xn;      /* [T][d] normalised input of a block */
    float *out;     /* [T][d] block output */
    float *p1;      /* [T][w1] q_proj|qkv|gate output */
    float *p2;      /* [T][w2] k|z|up output */
    float *p3;      /* [T][w3] v|b output */
    float *p4;      /* [T][Hv] a output */
    float *mix;     /* [T][wm] mixer output before its out projection */
    float *gath;    /* [T][d] gathered rows (MoE, logits) */
    float *gout;    /* [T][d] gathered outputs (MoE) */
    float *router;  /* [T][E] */
    int32_t *moe_sel;  /* [T][k] chosen experts */
    float *moe_w;      /* [T][k] their weights */
    int32_t *moe_list; /* [T] tokens routed to one expert */
    float *moe_lw;     /* [T] their weights */
    float *inv_freq;   /* [rope_dim/2] */
    float *conv_t;     /* [n_linear][K][conv_dim] conv taps, tap-major (from st_layer.conv_w) */
    int64_t *item_t0;  /* [T+1] first token row of each item */
    int64_t *task_w;   /* [T * max(Hk, nkv) + 1] cumulative task weights */
    float *part;       /* attention partials of split decode steps (mapped, owned) */
    size_t part_bytes;
    int64_t part_chunks; /* chunks per query the partial area holds */
    fwd_thread *th;    /* [n_threads] */
    st_balance mm_bal; /* rows of matrix products per thread, by measured speed */
    st_balance task_bal; /* delta-rule and attention tasks per thread, likewise */
    double *run_work;  /* [n_threads] the last parallel run: each thread's work (rows x cols,
                          or task weights) and, while it runs, its start, then its seconds */
    double *run_s;
    st_hidden_hook hook;
    void *hook_user;
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t gdn_ws_floats(int64_t Dk, int64_t Dv) {
    const int64_t C = GDN_C;
    /* Q K V O(chunk) | UW | V' | Kd | VT | KK QK NL P | G eG */
    return C * Dk * 3 + C * Dv * 2 + C * (Dv + Dk) + C * Dv + C * Dk + Dv * C + 4 * C * C + 2 * C;
}

static void fp_mode_fn(void *ctx, int tid, int n) {
    (void)ctx;
    (void)n;
    if (tid > 0) fp_mode_enter();
}

st_fwd_params st_fwd_default_params(void) {
    st_fwd_params p = {.n_threads = 0, .kernels = NULL, .gdn_chunked = 1, .min_parallel_work = 0};
    return p;
}

void st_fwd_destroy(st_fwd *f) {
    if (!f) return;
    st_pool_destroy(f->pool);
    float *bufs[] = {f->x,    f->xn,     f->out,  f->p1,     f->p2,    f->p3,
                     f->p4,   f->mix,    f->gath, f->gout,   f->router, f->moe_w,
                     f->moe_lw, f->inv_freq, f->conv_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(f->moe_sel);
    free(f->moe_list);
    free(f->item_t0);
    free(f->task_w);
    st_big_free(f->part, f->part_bytes);
    if (f->th) {
        for (int i = 0; i < f->n_threads; i++) {
            fwd_thread *t = &f->th[i];
            float *tb[] = {t->mm,    t->tmp,   t->rope_cos, t->rope_sin, t->att_q, t->att_s,
                           t->att_oc, t->att_o, t->att_m,   t->gdn,      t->gates};
            for (size_t j = 0; j < sizeof tb / sizeof tb[0]; j++) free(tb[j]);
            free(t->att_pos);
        }
        free(f->th);
    }
    free(f->run_work);
    free(f->run_s);
    free(f);
}

/* 64-byte aligned, zeroed */
static float *falloc(st_fwd *f, int64_t n, int *fail) {
    if (n < 1) n = 1;
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (!p) *fail = 1;
    else memset(p, 0, bytes);
    f->scratch_bytes += bytes;
    return p;
}

/* Element counts of the scratch buffers of a context for T tokens per call: one definition
 * for st_fwd_create_ex and st_fwd_plan_bytes. */
typedef struct scratch_dims {
    int64_t d, w1, w2, w3, wm, hv, cd, maxcols, qmax, hd, Dk, Dv;
} scratch_dims;

static scratch_dims dims_of(const st_config *c) {
    scratch_dims z;
    int64_t nh = c->n_heads, nkv = c->n_kv_heads;
    int64_t I = max64(c->intermediate_size,
                      max64(c->moe_intermediate_size, c->shared_expert_intermediate_size));
    z.d = c->hidden_size;
    z.hd = c->head_dim;
    z.cd = st_config_conv_dim(c);
    z.hv = c->lin_n_value_heads;
    z.Dk = c->lin_key_head_dim;
    z.Dv = c->lin_value_head_dim;
    int64_t vd = st_config_value_dim(c);
    z.w1 = max64(max64(z.cd, 2 * nh * z.hd), I);
    z.w2 = max64(max64(vd, nkv * z.hd), I);
    z.w3 = max64(z.hv, nkv * z.hd);
    z.wm = max64(vd, nh * z.hd);
    z.maxcols = max64(max64(max64(z.d, I), max64(vd, nh * z.hd)), max64(z.hd, max64(z.Dk, z.Dv)));
    z.qmax = nkv > 0 && nh / nkv > ATT_QMAX ? nh / nkv : ATT_QMAX;
    return z;
}

/* attention chunks of a context of max_seq_len positions, and the split-decode tasks */
static int64_t part_chunks_of(int64_t max_seq_len) { return (max_seq_len + ATT_CHUNK - 1) / ATT_CHUNK; }
static int64_t max_tasks_of(const st_config *c, int64_t T, int64_t chunks) {
    return max64(T * max64(c->lin_n_key_heads, c->n_kv_heads), SPLIT_TOK * c->n_kv_heads * chunks);
}

size_t st_fwd_plan_bytes(const st_model *m, int max_tokens, int64_t max_seq_len, int n_threads) {
    const st_config *c = &m->cfg;
    scratch_dims z = dims_of(c);
    int64_t T = max_tokens, chunks = part_chunks_of(max_seq_len);
    int nth = n_threads > 0 ? n_threads : st_default_threads();
    int64_t floats = T * (5 * z.d + z.w1 + z.w2 + z.w3 + z.hv + z.wm) + c->rope_dim / 2 +
                     (int64_t)m->n_linear * c->conv_kernel * z.cd;
    size_t bytes = (size_t)(T + 1 + max_tasks_of(c, T, chunks) + 2) * sizeof(int64_t);
    if (c->is_moe) {
        floats += T * (c->n_experts + c->n_experts_per_tok + 1);
        bytes += (size_t)(T * c->n_experts_per_tok + T) * sizeof(int32_t);
    }
    int64_t per_thread = st_kernels_matmul_scratch(z.maxcols) + z.cd + c->rope_dim + z.qmax * (3 * z.hd + ATT_CHUNK + 4) +
                         gdn_ws_floats(z.Dk, z.Dv) + 2 * T;
    floats += nth * per_thread;
    bytes += (size_t)floats * sizeof(float) + (size_t)nth * (size_t)z.qmax * sizeof(int64_t);
    if (nth > 1 && chunks > 1 && c->n_heads > 0)
        bytes += (size_t)SPLIT_TOK * (size_t)c->n_heads * (size_t)chunks * (size_t)(z.hd + 2) * sizeof(float);
    return bytes;
}

st_status st_fwd_create(const st_model *m, st_cache *cache, int max_tokens,
                        const st_kernels *kernels, st_fwd **out, st_error *err) {
    st_fwd_params p = st_fwd_default_params();
    p.kernels = kernels;
    return st_fwd_create_ex(m, cache, max_tokens, &p, out, err);
}

st_status st_fwd_create_ex(const st_model *m, st_cache *cache, int max_tokens,
                           const st_fwd_params *prm, st_fwd **out, st_error *err) {
    *out = NULL;
    if (max_tokens < 1 || max_tokens > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "max_tokens must be in [1, 2^20]");
    st_fwd_params dp = st_fwd_default_params();
    if (!prm) prm = &dp;
    int nth = prm->n_threads > 0 ? prm->n_threads : st_default_threads();
    if (nth > ST_POOL_MAX_THREADS)
        return st_error_set(err, ST_ERR_ARG, "n_threads %d exceeds %d", nth, ST_POOL_MAX_THREADS);
    st_fwd *f = calloc(1, sizeof *f);
    if (!f) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const st_config *c = &m->cfg;
    f->m = m;
    f->cache = cache;
    f->k = prm->kernels ? prm->kernels : st_kernels_select();
    f->gdn_chunked = prm->gdn_chunked;
    f->par_work = prm->min_parallel_work > 0 ? prm->min_parallel_work : PAR_WORK;
    f->max_tokens = max_tokens;
    scratch_dims z = dims_of(c);
    int64_t T = max_tokens, d = z.d, nh = c->n_heads, hd = z.hd, cd = z.cd;
    int64_t w1 = z.w1, w2 = z.w2, w3 = z.w3, wm = z.wm, hv = z.hv, Dk = z.Dk, Dv = z.Dv, maxcols = z.maxcols;
    int fail = 0;
    f->x = falloc(f, T * d, &fail);
    f->xn = falloc(f, T * d, &fail);
    f->out = falloc(f, T * d, &fail);
    f->p1 = falloc(f, T * w1, &fail);
    f->p2 = falloc(f, T * w2, &fail);
    f->p3 = falloc(f, T * w3, &fail);
    f->p4 = falloc(f, T * hv, &fail);
    f->mix = falloc(f, T * wm, &fail);
    f->gath = falloc(f, T * d, &fail);
    f->gout = falloc(f, T * d, &fail);
    f->inv_freq = falloc(f, c->rope_dim / 2, &fail);
    f->conv_t = falloc(f, (int64_t)m->n_linear * c->conv_kernel * cd, &fail);
    f->item_t0 = calloc((size_t)T + 1, sizeof *f->item_t0);
    /* tasks: (item, key head), (item, KV head, tile) or, split, (item, KV head, chunk) */
    f->part_chunks = part_chunks_of(cache->p.max_seq_len);
    int64_t max_tasks = max_tasks_of(c, T, f->part_chunks);
    f->task_w = calloc((size_t)max_tasks + 2, sizeof *f->task_w);
    fail |= !f->item_t0 || !f->task_w;
    if (c->is_moe) {
        f->router = falloc(f, T * c->n_experts, &fail);
        f->moe_w = falloc(f, T * c->n_experts_per_tok, &fail);
        f->moe_lw = falloc(f, T, &fail);
        f->moe_sel = calloc((size_t)(T * c->n_experts_per_tok), sizeof *f->moe_sel);
        f->moe_list = calloc((size_t)T, sizeof *f->moe_list);
        fail |= !f->moe_sel || !f->moe_list;
    }
    f->n_threads = nth;
    st_balance_init(&f->mm_bal, nth);
    st_balance_init(&f->task_bal, nth);
    f->att_qmax = (int)z.qmax;
    f->th = calloc((size_t)nth, sizeof *f->th);
    f->run_work = calloc((size_t)nth, sizeof *f->run_work);
    f->run_s = calloc((size_t)nth, sizeof *f->run_s);
    fail |= !f->th || !f->run_work || !f->run_s;
    for (int i = 0; i < nth && !fail; i++) {
        fwd_thread *t = &f->th[i];
        t->mm = falloc(f, st_kernels_matmul_scratch(maxcols), &fail);
        t->tmp = falloc(f, cd, &fail);
        t->rope_cos = falloc(f, c->rope_dim / 2, &fail);
        t->rope_sin = falloc(f, c->rope_dim / 2, &fail);
        const int64_t qm = f->att_qmax;
        t->att_q = falloc(f, qm * hd, &fail);
        t->att_s = falloc(f, qm * ATT_CHUNK, &fail);
        t->att_oc = falloc(f, qm * hd, &fail);
        t->att_o = falloc(f, qm * hd, &fail);
        t->att_m = falloc(f, qm * 4, &fail);
        t->att_pos = calloc((size_t)qm, sizeof *t->att_pos);
        fail |= !t->att_pos;
        t->gdn = falloc(f, gdn_ws_floats(Dk, Dv), &fail);
        t->gates = falloc(f, 2 * T, &fail);
    }
    /* attention partials for split decode steps: SPLIT_TOK tokens x nh heads x chunks of
     * (hd + 2); mapped, so only what is touched becomes resident */
    if (!fail && nth > 1 && f->part_chunks > 1 && nh > 0) {
        f->part_bytes = (size_t)SPLIT_TOK * (size_t)nh * (size_t)f->part_chunks *
                        (size_t)(hd + 2) * sizeof(float);
        f->part = st_big_alloc(f->part_bytes);
        if (!f->part) f->part_bytes = 0; /* no split mode then */
        f->scratch_bytes += f->part_bytes;
    }
    if (fail) {
        st_fwd_destroy(f);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory planning scratch for %d tokens",
                            max_tokens);
    }
    st_status st = st_pool_create(nth, &f->pool, err);
    if (st != ST_OK) {
        st_fwd_destroy(f);
        return st;
    }
    st_pool_run(f->pool, fp_mode_fn, NULL); /* the workers keep it for their lifetime */
    for (int li = 0; li < c->n_layers; li++) {
        const st_layer *L = &m->layers[li];
        if (L->kind != ST_LAYER_LINEAR) continue;
        float *ct = f->conv_t + (size_t)L->kind_index * (size_t)(c->conv_kernel * cd);
        for (int64_t ch = 0; ch < cd; ch++)
            for (int j = 0; j < c->conv_kernel; j++) ct[j * cd + ch] = L->conv_w[ch * c->conv_kernel + j];
    }
    /* inverse frequencies as the reference computes them: fp32 theta^(-2i/rope_dim) */
    for (int i = 0; i < c->rope_dim / 2; i++)
        f->inv_freq[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->rope_dim));
    *out = f;
    return ST_OK;
}

void st_fwd_set_hidden_hook(st_fwd *f, st_hidden_hook hook, void *user) {
    f->hook = hook;
    f->hook_user = user;
}

size_t st_fwd_scratch_bytes(const st_fwd *f) { return f->scratch_bytes; }
const st_kernels *st_fwd_kernels(const st_fwd *f) { return f->k; }

struct st_pool *st_fwd_pool(st_fwd *f) { return f->pool; }
int st_fwd_threads(const st_fwd *f) { return f->n_threads; }

int64_t st_fwd_logit_rows(const st_batch_item *items, int n_items) {
    int64_t n = 0;
    for (int i = 0; i < n_items; i++)
        n += items[i].logits == ST_LOGITS_ALL ? items[i].n_tokens : items[i].logits == ST_LOGITS_LAST;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* small ops */

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* y = x / sqrt(mean(x^2) + eps) * w  (w already holds 1+w for zero-centred norms) */
static void rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void l2norm_scale(float *x, int64_t n, float scale) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = scale / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++) x[i] *= r;
}

/* Split n tasks with cumulative weights cum[0..n] (cum[0] = 0) over nth threads: task i goes
 * to the thread whose share holds the task's midpoint; shares by bal's measured speeds when
 * it has nth threads, equal otherwise. Sets [*lo, *hi). */
static void split_weighted(const st_balance *bal, const int64_t *cum, int64_t n, int nth,
                           int tid, int64_t *lo, int64_t *hi) {
    const int64_t W = cum[n];
    const int by_speed = bal && bal->n == nth;
    int64_t a = 0, b = 0;
    int owner = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t mid2 = cum[i] + cum[i + 1]; /* twice the midpoint */
        if (by_speed) { /* midpoints only grow: the owner only moves forward */
            const double frac = W > 0 ? (double)mid2 / (2.0 * (double)W) : 0.0;
            while (owner < nth - 1 && frac >= bal->cum[owner + 1]) owner++;
        } else {
            owner = W > 0 ? (int)((mid2 * nth) / (2 * W)) : 0;
            if (owner >= nth) owner = nth - 1;
        }
        if (owner < tid) a = i + 1;
        if (owner <= tid) b = i + 1;
    }
    *lo = a;
    *hi = b < a ? a : b;
}

/* Timing of one thread's part of a parallel run, for st_balance_update(b, run_work, run_s) */
static void run_start(st_fwd *f, int tid) { f->run_s[tid] = st_now_s(); }
static void run_stop(st_fwd *f, int tid, double work) {
    f->run_work[tid] = work;
    f->run_s[tid] = st_now_s() - f->run_s[tid];
}

/* Per-task jobs (delta rule, attention): a thread's tasks, by speed */
static void tasks_begin(st_fwd *f, int tid, int nth, int64_t n_tasks, int64_t *lo, int64_t *hi) {
    split_weighted(&f->task_bal, f->task_w, n_tasks, nth, tid, lo, hi);
    run_start(f, tid);
}

static void tasks_end(st_fwd *f, int tid, int64_t lo, int64_t hi) {
    run_stop(f, tid, (double)(f->task_w[hi] - f->task_w[lo]));
}

/* ---------------------------------------------------------------------------------------- */
/* parallel matrix products */

typedef struct mm_req {
    const st_matrix *w;
    float *y;
    int64_t ldy;
} mm_req;

typedef struct mm_job {
    st_fwd *f;
    const float *x;
    int64_t ldx, n_tok;
    mm_req r[4];
    int n;
    int swiglu; /* r[0].y = silu(r[0].y) * r[1].y on each thread's rows (same shapes) */
} mm_job;

/* Thread tid's rows of a matrix product: by measured thread speed on the pool, all of
 * them alone. */
static void mm_rows(const st_fwd *f, int64_t rows, int tid, int nth, int64_t *lo, int64_t *hi) {
    if (nth == f->mm_bal.n) st_balance_split(&f->mm_bal, rows, tid, 16, lo, hi);
    else st_split_range(rows, nth, tid, 16, lo, hi);
}

static void mm_job_fn(void *ctx, int tid, int nth) {
    mm_job *j = ctx;
    st_fwd *f = j->f;
    fwd_thread *th = &f->th[tid];
    run_start(f, tid);
    double work = 0;
    for (int i = 0; i < j->n; i++) {
        int64_t lo, hi;
        mm_rows(f, j->r[i].w->rows, tid, nth, &lo, &hi);
        if (lo < hi)
            f->k->matmul(j->r[i].w, j->x, j->ldx, j->n_tok, j->r[i].y, j->r[i].ldy, lo, hi, th->mm);
        work += (double)(hi - lo) * (double)j->r[i].w->cols;
    }
    if (j->swiglu) { /* the same rows this thread just wrote */
        int64_t lo, hi;
        mm_rows(f, j->r[0].w->rows, tid, nth, &lo, &hi);
        for (int64_t t = 0; t < j->n_tok && lo < hi; t++)
            f->k->silu_mul(j->r[0].y + t * j->r[0].ldy + lo, j->r[1].y + t * j->r[1].ldy + lo, hi - lo);
    }
    run_stop(f, tid, work);
}

/* Run fn on the pool, or on the caller alone when the work is small. Either way the same
 * arithmetic: partitions never change results. Returns whether the pool ran it. */
static int par_run(st_fwd *f, int64_t work, st_pool_fn fn, void *ctx) {
    if (work < f->par_work || f->n_threads == 1) {
        fn(ctx, 0, 1);
        return 0;
    }
    st_pool_run(f->pool, fn, ctx);
    return 1;
}

static void mm_run(st_fwd *f, mm_job *j) {
    int64_t work = 0;
    for (int i = 0; i < j->n; i++) work += j->r[i].w->rows * j->r[i].w->cols * j->n_tok;
    if (par_run(f, work, mm_job_fn, j)) st_balance_update(&f->mm_bal, f->run_work, f->run_s);
}

static void mm(st_fwd *f, const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
               float *y, int64_t ldy) {
    mm_job j = {.f = f, .x = x, .ldx = ldx, .n_tok = n_tok, .n = 1};
    j.r[0] = (mm_req){w, y, ldy};
    mm_run(f, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* per-token loops: residual add + norm */

typedef struct tok_job {
    st_fwd *f;
    int64_t T;
    const float *w;   /* norm weight */
    int add;          /* x += out first */
} tok_job;

static void add_norm_range(st_fwd *f, int64_t t0, int64_t t1, const float *w, int add) {
    const int64_t d = f->m->cfg.hidden_size;
    const float eps = f->m->cfg.rms_norm_eps;
    for (int64_t t = t0; t < t1; t++) {
        float *x = f->x + t * d;
        if (add) {
            const float *o = f->out + t * d;
            for (int64_t e = 0; e < d; e++) x[e] += o[e];
        }
        rmsnorm(x, w, d, eps, f->xn + t * d);
    }
}

static void tok_job_fn(void *ctx, int tid, int nth) {
    tok_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->T, nth, tid, 1, &lo, &hi);
    add_norm_range(j->f, lo, hi, j->w, j->add);
}

static void add_norm(st_fwd *f, int64_t T, const float *w, int add) {
    if ((T < PAR_MIN && f->par_work >= PAR_WORK) || f->n_threads == 1) {
        add_norm_range(f, 0, T, w, add);
        return;
    }
    tok_job j = {f, T, w, add};
    par_run(f, T * f->m->cfg.hidden_size * 4, tok_job_fn, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* Gated DeltaNet */

typedef struct gdn_job {
    st_fwd *f;
    const st_layer *L;
    const st_batch_item *items;
    int n_items;
    int64_t n_tasks; /* n_items * Hk; task = item * Hk + key head */
} gdn_job;

/* The chunked form (spec 4.7) for one head over GDN_C tokens, state Sh [Dv][Dk] (= M^T).
 * q, k, v: rows of the chunk (stride ldq/ldk/ldv); beta, gam (log decay) per token;
 * o: output rows (stride ldo). */
static void gdn_chunk(const st_kernels *k, float *ws, float *mmscr, float *Sh, int64_t Dk,
                      int64_t Dv, const float *q, int64_t ldq, const float *kk, int64_t ldk,
                      const float *v, int64_t ldv, const float *beta, const float *gam, float *o,
                      int64_t ldo) {
    const int64_t C = GDN_C, W = Dv + Dk;
    float *Q = ws, *K = Q + C * Dk, *Kd = K + C * Dk, *O = Kd + C * Dk, *Vp = O + C * Dv;
    float *UW = Vp + C * Dv, *WS = UW + C * W, *VT = WS + C * Dv, *KK = VT + Dv * C;
    float *QK = KK + C * C, *NL = QK + C * C, *P = NL + C * C, *G = P + C * C, *eG = G + C;
    float acc = 0.0f;
    for (int64_t i = 0; i < C; i++) {
        acc += gam[i];
        G[i] = acc;
        eG[i] = expf(acc);
        memcpy(Q + i * Dk, q + i * ldq, (size_t)Dk * sizeof(float));
        memcpy(K + i * Dk, kk + i * ldk, (size_t)Dk * sizeof(float));
    }
    st_matrix km = {.fmt = ST_WFMT_F32, .rows = C, .cols = Dk, .data = K};
    k->matmul(&km, K, Dk, C, KK, C, 0, C, mmscr); /* KK[i][j] = k_i . k_j */
    k->matmul(&km, Q, Dk, C, QK, C, 0, C, mmscr); /* QK[i][j] = q_i . k_j */
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < C; j++) {
            float dij = j <= i ? expf(G[i] - G[j]) : 0.0f;
            NL[i * C + j] = j < i ? -beta[i] * KK[i * C + j] * dij : 0.0f;
            P[i * C + j] = QK[i * C + j] * dij;
        }
    /* (I + L) [U | W] = [diag(beta) V | diag(beta exp G) K], forward substitution */
    for (int64_t i = 0; i < C; i++) {
        float *u = UW + i * W;
        const float bi = beta[i], be = beta[i] * eG[i];
        for (int64_t j = 0; j < Dv; j++) u[j] = bi * v[i * ldv + j];
        for (int64_t j = 0; j < Dk; j++) u[Dv + j] = be * K[i * Dk + j];
        if (i > 0) k->accum_rows(UW, 0, W, i, NL + i * C, C, 1, u, W, W);
    }
    /* V' = U - W M, i.e. V'[i][a] = U[i][a] - sum_b W[i][b] S[a][b] */
    st_matrix sm = {.fmt = ST_WFMT_F32, .rows = Dv, .cols = Dk, .data = Sh};
    k->matmul(&sm, UW + Dv, W, C, WS, Dv, 0, Dv, mmscr);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < Dv; j++) Vp[i * Dv + j] = UW[i * W + j] - WS[i * Dv + j];
    /* O = diag(exp G) Q M + P V' */
    k->matmul(&sm, Q, Dk, C, O, Dv, 0, Dv, mmscr);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < Dv; j++) O[i * Dv + j] *= eG[i];
    k->accum_rows(Vp, 0, Dv, C, P, C, C, O, Dv, Dv);
    for (int64_t i = 0; i < C; i++) memcpy(o + i * ldo, O + i * Dv, (size_t)Dv * sizeof(float));
    /* M <- exp(G_last) M + (diag(exp(G_last - G)) K)^T V', i.e. for each state row a:
     * S[a][:] = exp(G_last) S[a][:] + sum_i V'[i][a] Kd[i][:] */
    const float gl = G[C - 1], egl = eG[C - 1];
    for (int64_t i = 0; i < C; i++) {
        const float s = expf(gl - G[i]);
        for (int64_t j = 0; j < Dk; j++) Kd[i * Dk + j] = s * K[i * Dk + j];
        for (int64_t a = 0; a < Dv; a++) VT[a * C + i] = Vp[i * Dv + a];
    }
    for (int64_t e = 0; e < Dv * Dk; e++) Sh[e] *= egl;
    k->accum_rows(Kd, 0, Dk, C, VT, C, Dv, Sh, Dk, Dk);
}

static void gdn_task(st_fwd *f, fwd_thread *th, const st_layer *L, const st_batch_item *it,
                     int64_t t0, int g) {
    const st_config *c = &f->m->cfg;
    const st_kernels *k = f->k;
    const int64_t cd = st_config_conv_dim(c), kd = st_config_key_dim(c);
    const int64_t vd = st_config_value_dim(c);
    const int K = c->conv_kernel, Hv = c->lin_n_value_heads, Hk = c->lin_n_key_heads;
    const int Dk = c->lin_key_head_dim, Dv = c->lin_value_head_dim, rep = Hv / Hk;
    const float qscale = 1.0f / sqrtf((float)Dk);
    const int n = it->n_tokens;
    float *qkv = f->p1, *z = f->p2, *bb = f->p3, *aa = f->p4, *tmp = th->tmp;
    float *cs = st_cache_conv_state(f->cache, it->seq->slot, L->kind_index); /* [K-1][cd] */
    float *S = st_cache_rec_state(f->cache, it->seq->slot, L->kind_index);   /* [Hv][Dv][Dk] */
    const int64_t rng[3][2] = {{(int64_t)g * Dk, Dk},
                               {kd + (int64_t)g * Dk, Dk},
                               {2 * kd + (int64_t)g * rep * Dv, (int64_t)rep * Dv}};
    /* causal depthwise conv + SiLU of this task's channels, token by token */
    const float *ct = f->conv_t + (size_t)L->kind_index * (size_t)(K * cd);
    for (int i = 0; i < n; i++) {
        float *mrow = qkv + (t0 + i) * cd;
        for (int r = 0; r < 3; r++) {
            const int64_t c0 = rng[r][0], len = rng[r][1];
            k->conv_silu(ct + c0, cd, K, cs + c0, cd, mrow + c0, tmp, len);
            memcpy(mrow + c0, tmp, (size_t)len * sizeof(float));
        }
        l2norm_scale(mrow + (int64_t)g * Dk, Dk, qscale);
        l2norm_scale(mrow + kd + (int64_t)g * Dk, Dk, 1.0f);
    }
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        float *Sh = S + (size_t)h * Dv * Dk;
        float *beta = th->gates, *gam = th->gates + n;
        for (int i = 0; i < n; i++) {
            const int64_t t = t0 + i;
            beta[i] = sigmoid(bb[t * Hv + h]);
            gam[i] = L->neg_exp_a[h] * softplus(aa[t * Hv + h] + L->dt_bias[h]);
        }
        const float *q0 = qkv + t0 * cd + (int64_t)g * Dk, *k0 = q0 + kd;
        const float *v0 = qkv + t0 * cd + 2 * kd + (int64_t)h * Dv;
        float *o0 = f->mix + t0 * vd + (int64_t)h * Dv;
        for (int i = 0; i < n;) {
            const int64_t pos = it->seq->n_past + i;
            if (f->gdn_chunked && pos % GDN_C == 0 && n - i >= GDN_C) {
                gdn_chunk(k, th->gdn, th->mm, Sh, Dk, Dv, q0 + i * cd, cd, k0 + i * cd, cd,
                          v0 + i * cd, cd, beta + i, gam + i, o0 + i * vd, vd);
                i += GDN_C;
            } else {
                k->gdn_step(Sh, Dv, Dk, q0 + i * cd, k0 + i * cd, v0 + i * cd, expf(gam[i]),
                            beta[i], o0 + i * vd);
                i++;
            }
        }
        /* gated RMSNorm: norm(o) * w * silu(z) */
        for (int i = 0; i < n; i++) {
            const int64_t t = t0 + i;
            float *o = o0 + i * vd, *zh = z + t * vd + (int64_t)h * Dv;
            float ss = 0.0f;
            for (int r = 0; r < Dv; r++) ss += o[r] * o[r];
            float rs = 1.0f / sqrtf(ss / (float)Dv + c->rms_norm_eps);
            k->silu_mul(zh, NULL, Dv);
            for (int r = 0; r < Dv; r++) o[r] = o[r] * rs * L->gdn_norm[r] * zh[r];
        }
    }
}

static void gdn_job_fn(void *ctx, int tid, int nth) {
    gdn_job *j = ctx;
    st_fwd *f = j->f;
    const int Hk = f->m->cfg.lin_n_key_heads;
    int64_t lo, hi;
    tasks_begin(f, tid, nth, j->n_tasks, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) {
        int it = (int)(task / Hk), g = (int)(task % Hk);
        gdn_task(f, &f->th[tid], j->L, &j->items[it], f->item_t0[it], g);
    }
    tasks_end(f, tid, lo, hi);
}

static void gdn_layer(st_fwd *f, const st_layer *L, const st_batch_item *items, int n_items,
                      int64_t T) {
    const st_config *c = &f->m->cfg;
    const int64_t d = c->hidden_size, cd = st_config_conv_dim(c);
    const int64_t vd = st_config_value_dim(c);
    const int Hv = c->lin_n_value_heads, Hk = c->lin_n_key_heads;
    mm_job pj = {.f = f, .x = f->xn, .ldx = d, .n_tok = T, .n = 4};
    pj.r[0] = (mm_req){&L->in_qkv, f->p1, cd};
    pj.r[1] = (mm_req){&L->in_z, f->p2, vd};
    pj.r[2] = (mm_req){&L->in_b, f->p3, Hv};
    pj.r[3] = (mm_req){&L->in_a, f->p4, Hv};
    mm_run(f, &pj);
    /* tasks (item, key head), weighted by the item's tokens */
    int64_t nt = 0;
    f->task_w[0] = 0;
    for (int it = 0; it < n_items; it++)
        for (int g = 0; g < Hk; g++, nt++) f->task_w[nt + 1] = f->task_w[nt] + items[it].n_tokens;
    gdn_job j = {f, L, items, n_items, nt};
    if (par_run(f, T * Hv * c->lin_key_head_dim * c->lin_value_head_dim * 2, gdn_job_fn, &j))
        st_balance_update(&f->task_bal, f->run_work, f->run_s);
    mm(f, &L->out_proj, f->mix, vd, T, f->out, d);
}

/* ---------------------------------------------------------------------------------------- */
/* gated full attention */

/* cos/sin of the rotary angles at position pos */
static void rope_angles(const st_fwd *f, fwd_thread *th, int64_t pos) {
    int half = f->m->cfg.rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = (float)pos * f->inv_freq[i];
        th->rope_cos[i] = cosf(a);
        th->rope_sin[i] = sinf(a);
    }
}

/* half-split rotation of the first rope_dim dims of x */
static void rope_apply(const st_fwd *f, const fwd_thread *th, float *x) {
    int half = f->m->cfg.rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * th->rope_cos[i] - b * th->rope_sin[i];
        x[i + half] = b * th->rope_cos[i] + a * th->rope_sin[i];
    }
}

static inline void kv_store(const st_cache *c, void *dst, const float *src, int n) {
    if (c->p.kv_dtype == ST_KV_BF16) {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++) d[i] = st_f32_to_bf16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

typedef struct att_job {
    st_fwd *f;
    const st_layer *L;
    const st_batch_item *items;
    int n_items;
    int64_t T;
    int64_t n_tasks;
    int tq;            /* query tokens per task (non-split mode) */
} att_job;

/* q/k norm, RoPE, and K/V of tokens [t0, t1) into the cache */
static void att_prep_range(st_fwd *f, fwd_thread *th, const st_layer *L,
                           const st_batch_item *items, int64_t t0, int64_t t1) {
    const st_config *c = &f->m->cfg;
    const st_cache *cache = f->cache;
    const int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, li = L->kind_index;
    int it = 0;
    for (int64_t t = t0; t < t1; t++) {
        while (f->item_t0[it + 1] <= t) it++;
        const st_seq *seq = items[it].seq;
        const int64_t pos = seq->n_past + (t - f->item_t0[it]);
        rope_angles(f, th, pos);
        for (int j = 0; j < nh; j++) {
            float *q = f->p1 + t * 2 * nh * hd + (int64_t)j * 2 * hd;
            rmsnorm(q, L->q_norm, hd, c->rms_norm_eps, q);
            rope_apply(f, th, q);
        }
        for (int h = 0; h < nkv; h++) {
            float *kv = f->p2 + t * nkv * hd + (int64_t)h * hd;
            rmsnorm(kv, L->k_norm, hd, c->rms_norm_eps, kv);
            rope_apply(f, th, kv);
            kv_store(cache, st_cache_kv_ptr(cache, seq, li, 0, h, pos), kv, hd);
            kv_store(cache, st_cache_kv_ptr(cache, seq, li, 1, h, pos),
                     f->p3 + t * nkv * hd + (int64_t)h * hd, hd);
        }
    }
}

static void att_prep_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->T, nth, tid, 1, &lo, &hi);
    att_prep_range(j->f, &j->f->th[tid], j->L, j->items, lo, hi);
}

/* The partial of chunk [c0, c1) for nq queries (th->att_q, positions th->att_pos) of one
 * sequence and KV head: per query the chunk max mc, sum lc and weighted V oc (empty when the
 * query's position is below c0: mc = -inf). */
static void att_partial(st_fwd *f, fwd_thread *th, int li, const st_seq *seq, int h, int nq,
                        int64_t c0, int64_t c1, float *mc, float *lc, float *oc, int64_t ldo) {
    const st_cache *cache = f->cache;
    const st_kernels *k = f->k;
    const int hd = f->m->cfg.head_dim, bs = cache->p.block_size;
    const int bf = cache->p.kv_dtype == ST_KV_BF16;
    int64_t maxpos = -1;
    for (int q = 0; q < nq; q++) maxpos = max64(maxpos, th->att_pos[q]);
    const int64_t end = min64(c1, maxpos + 1);
    float *s = th->att_s;
    /* scores of all queries against the chunk's positions, block segment by segment */
    for (int64_t p = c0; p < end;) {
        const int64_t seg = min64(end, (p / bs + 1) * bs) - p;
        st_matrix kb = {.fmt = bf ? ST_WFMT_BF16 : ST_WFMT_F32, .rows = seg, .cols = hd,
                        .data = st_cache_kv_ptr(cache, seq, li, 0, h, p)};
        k->matmul(&kb, th->att_q, hd, nq, s + (p - c0), ATT_CHUNK, 0, seg, th->mm);
        p += seg;
    }
    /* per query: max, exp, sum; then the weighted sum of V rows */
    for (int q = 0; q < nq; q++) {
        float *oq = oc + q * ldo;
        memset(oq, 0, (size_t)hd * sizeof(float));
        const int64_t len = min64(c1, th->att_pos[q] + 1) - c0;
        if (len <= 0) {
            mc[q] = -INFINITY;
            lc[q] = 0.0f;
            continue;
        }
        float *sq = s + (int64_t)q * ATT_CHUNK;
        float mx = sq[0];
        for (int64_t i = 1; i < len; i++) mx = sq[i] > mx ? sq[i] : mx;
        mc[q] = mx;
        lc[q] = k->exp_sum(sq, len, mx);
        for (int64_t p = c0; p < c0 + len;) {
            const int64_t seg = min64(c0 + len, (p / bs + 1) * bs) - p;
            k->accum_rows(st_cache_kv_ptr(cache, seq, li, 1, h, p), bf, hd, seg, sq + (p - c0),
                          ATT_CHUNK, 1, oq, hd, hd);
            p += seg;
        }
    }
}

/* merge a partial into the running (m, l, o) of one query; first: the running one is empty */
static void att_merge(float *m, float *l, float *o, float mc, float lc, const float *oc, int hd) {
    if (mc == -INFINITY) return;
    if (*m == -INFINITY) {
        *m = mc;
        *l = lc;
        memcpy(o, oc, (size_t)hd * sizeof(float));
        return;
    }
    const float mn = mc > *m ? mc : *m;
    const float a = expf(*m - mn), b = expf(mc - mn);
    *l = *l * a + lc * b;
    for (int e = 0; e < hd; e++) o[e] = o[e] * a + oc[e] * b;
    *m = mn;
}

/* out = o / l * sigmoid(gate) into f->mix */
static void att_finish(st_fwd *f, int64_t t, int j, const float *o, float l) {
    const int nh = f->m->cfg.n_heads, hd = f->m->cfg.head_dim;
    const float *gate = f->p1 + t * 2 * nh * hd + (int64_t)j * 2 * hd + hd;
    float *dst = f->mix + t * nh * hd + (int64_t)j * hd;
    const float inv = 1.0f / l;
    for (int e = 0; e < hd; e++) dst[e] = o[e] * inv * sigmoid(gate[e]);
}

/* task = (item, KV head, tile of tq tokens): queries = tile tokens x the group's heads */
typedef struct att_task {
    int it, h;
    int64_t i0, n; /* tokens [i0, i0+n) of the item */
} att_task;

static att_task att_task_at(const att_job *j, int64_t task) {
    /* tasks are enumerated item by item, KV head by head, tile by tile */
    const st_fwd *f = j->f;
    const int nkv = f->m->cfg.n_kv_heads;
    att_task a = {0, 0, 0, 0};
    for (int it = 0; it < j->n_items; it++) {
        const int64_t n = j->items[it].n_tokens, tiles = (n + j->tq - 1) / j->tq;
        if (task < tiles * nkv) {
            a.it = it;
            a.h = (int)(task / tiles);
            a.i0 = (task % tiles) * j->tq;
            a.n = min64(j->tq, n - a.i0);
            return a;
        }
        task -= tiles * nkv;
    }
    ST_ASSERT(0 && "attention task out of range");
    return a;
}

/* gather the task's queries (scaled by 1/sqrt(hd)) and positions into th */
static int att_load_queries(st_fwd *f, fwd_thread *th, const att_job *j, att_task a) {
    const st_config *c = &f->m->cfg;
    const int nh = c->n_heads, hd = c->head_dim, grp = nh / c->n_kv_heads;
    const float scale = 1.0f / sqrtf((float)hd);
    const st_seq *seq = j->items[a.it].seq;
    int nq = 0;
    for (int64_t i = a.i0; i < a.i0 + a.n; i++) {
        const int64_t t = f->item_t0[a.it] + i;
        for (int jj = 0; jj < grp; jj++, nq++) {
            const float *q = f->p1 + t * 2 * nh * hd + (int64_t)(a.h * grp + jj) * 2 * hd;
            for (int e = 0; e < hd; e++) th->att_q[nq * hd + e] = q[e] * scale;
            th->att_pos[nq] = seq->n_past + i;
        }
    }
    return nq;
}

static void att_task_run(st_fwd *f, fwd_thread *th, const att_job *j, att_task a) {
    const st_config *c = &f->m->cfg;
    const int hd = c->head_dim, grp = c->n_heads / c->n_kv_heads;
    const st_seq *seq = j->items[a.it].seq;
    const int nq = att_load_queries(f, th, j, a);
    const int64_t last = seq->n_past + a.i0 + a.n - 1;
    const int qm = f->att_qmax;
    float *m = th->att_m, *l = m + qm, *mc = l + qm, *lc = mc + qm;
    for (int q = 0; q < nq; q++) m[q] = -INFINITY, l[q] = 0.0f;
    for (int64_t c0 = 0; c0 <= last; c0 += ATT_CHUNK) {
        att_partial(f, th, j->L->kind_index, seq, a.h, nq, c0, c0 + ATT_CHUNK, mc, lc, th->att_oc, hd);
        for (int q = 0; q < nq; q++)
            att_merge(&m[q], &l[q], th->att_o + q * hd, mc[q], lc[q], th->att_oc + q * hd, hd);
    }
    for (int q = 0; q < nq; q++)
        att_finish(f, f->item_t0[a.it] + a.i0 + q / grp, a.h * grp + q % grp, th->att_o + q * hd, l[q]);
}

static void att_job_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    int64_t lo, hi;
    tasks_begin(j->f, tid, nth, j->n_tasks, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) att_task_run(j->f, &j->f->th[tid], j, att_task_at(j, task));
    tasks_end(j->f, tid, lo, hi);
}

/* split mode: decode tokens only (one token per item); partial slot of (token t, head q, chunk) */
static float *part_at(const st_fwd *f, int64_t t, int q, int64_t ch) {
    const st_config *c = &f->m->cfg;
    return f->part + (((size_t)t * (size_t)c->n_heads + (size_t)q) * (size_t)f->part_chunks +
                      (size_t)ch) * (size_t)(c->head_dim + 2);
}

/* phase 1 task = (item, KV head, chunk) over the flattened list; weights by chunk length */
static void att_split1_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    st_fwd *f = j->f;
    fwd_thread *th = &f->th[tid];
    const st_config *c = &f->m->cfg;
    const int nkv = c->n_kv_heads, hd = c->head_dim, grp = c->n_heads / nkv;
    int64_t lo, hi;
    split_weighted(&f->task_bal, f->task_w, j->n_tasks, nth, tid, &lo, &hi);
    float *mc = th->att_m, *lc = mc + f->att_qmax;
    for (int64_t task = lo; task < hi; task++) {
        /* decode: every item has one token; chunks per item = ceil((n_past+1)/ATT_CHUNK) */
        int64_t rest = task;
        int it = 0;
        int64_t nch = 0;
        for (;; it++) {
            nch = (j->items[it].seq->n_past + ATT_CHUNK) / ATT_CHUNK;
            if (rest < nch * nkv) break;
            rest -= nch * nkv;
        }
        att_task a = {it, (int)(rest / nch), 0, 1};
        const int64_t ch = rest % nch;
        const int nq = att_load_queries(f, th, j, a);
        att_partial(f, th, j->L->kind_index, j->items[it].seq, a.h, nq, ch * ATT_CHUNK,
                    (ch + 1) * ATT_CHUNK, mc, lc, th->att_oc, hd);
        for (int q = 0; q < nq; q++) {
            float *pp = part_at(f, it, a.h * grp + q, ch);
            pp[0] = mc[q];
            pp[1] = lc[q];
            memcpy(pp + 2, th->att_oc + q * hd, (size_t)hd * sizeof(float));
        }
    }
}

/* phase 2: (item, query head) merges its chunks in order */
static void att_split2_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    st_fwd *f = j->f;
    fwd_thread *th = &f->th[tid];
    const st_config *c = &f->m->cfg;
    const int nh = c->n_heads, hd = c->head_dim;
    int64_t lo, hi;
    st_split_range((int64_t)j->n_items * nh, nth, tid, 1, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) {
        const int it = (int)(task / nh), q = (int)(task % nh);
        const int64_t nch = (j->items[it].seq->n_past + ATT_CHUNK) / ATT_CHUNK;
        float m = -INFINITY, l = 0.0f, *o = th->att_o;
        for (int64_t ch = 0; ch < nch; ch++) {
            const float *pp = part_at(f, it, q, ch);
            att_merge(&m, &l, o, pp[0], pp[1], pp + 2, hd);
        }
        att_finish(f, f->item_t0[it], q, o, l);
    }
}

static void attn_layer(st_fwd *f, const st_layer *L, const st_batch_item *items, int n_items,
                       int64_t T) {
    const st_config *c = &f->m->cfg;
    const int64_t d = c->hidden_size;
    const int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, grp = nh / nkv;
    mm_job pj = {.f = f, .x = f->xn, .ldx = d, .n_tok = T, .n = 3};
    pj.r[0] = (mm_req){&L->q_proj, f->p1, 2 * (int64_t)nh * hd};
    pj.r[1] = (mm_req){&L->k_proj, f->p2, (int64_t)nkv * hd};
    pj.r[2] = (mm_req){&L->v_proj, f->p3, (int64_t)nkv * hd};
    mm_run(f, &pj);
    att_job j = {.f = f, .L = L, .items = items, .n_items = n_items, .T = T};
    if ((T < PAR_MIN && f->par_work >= PAR_WORK) || f->n_threads == 1)
        att_prep_range(f, &f->th[0], L, items, 0, T);
    else par_run(f, T * (nh + nkv) * hd * 4, att_prep_fn, &j);
    /* split mode: decode only, few tasks, long enough contexts */
    int split = f->part && T == n_items && T <= SPLIT_TOK && (int64_t)n_items * nkv < f->n_threads;
    int64_t nt = 0;
    if (split) {
        int64_t chunks = 0;
        f->task_w[0] = 0;
        for (int it = 0; it < n_items; it++) {
            const int64_t np = items[it].seq->n_past + 1, nch = (np + ATT_CHUNK - 1) / ATT_CHUNK;
            chunks += nch;
            for (int h = 0; h < nkv; h++)
                for (int64_t ch = 0; ch < nch; ch++, nt++)
                    f->task_w[nt + 1] = f->task_w[nt] + min64(ATT_CHUNK, np - ch * ATT_CHUNK);
        }
        split = chunks > n_items; /* some item spans two chunks or more */
    }
    if (split) {
        j.n_tasks = nt;
        const int64_t work = f->task_w[nt] * grp * hd * 2;
        par_run(f, work, att_split1_fn, &j);
        par_run(f, work, att_split2_fn, &j);
    } else {
        j.tq = f->att_qmax / grp; /* >= 1: att_qmax >= grp */
        nt = 0;
        f->task_w[0] = 0;
        for (int it = 0; it < n_items; it++) {
            const int64_t n = items[it].n_tokens, tiles = (n + j.tq - 1) / j.tq;
            for (int h = 0; h < nkv; h++)
                for (int64_t ti = 0; ti < tiles; ti++, nt++) {
                    const int64_t nn = min64(j.tq, n - ti * j.tq);
                    /* cost ~ queries x context */
                    f->task_w[nt + 1] = f->task_w[nt] + nn * (items[it].seq->n_past + ti * j.tq + nn);
                }
        }
        j.n_tasks = nt;
        if (par_run(f, f->task_w[nt] * nh / nkv * hd * 2, att_job_fn, &j))
            st_balance_update(&f->task_bal, f->run_work, f->run_s);
    }
    mm(f, &L->o_proj, f->mix, (int64_t)nh * hd, T, f->out, d);
}

/* ---------------------------------------------------------------------------------------- */
/* MLPs */

static void swiglu(st_fwd *f, const st_matrix *gate, const st_matrix *up, const st_matrix *down,
                   const float *x, int64_t n, float *y) {
    const int64_t d = f->m->cfg.hidden_size, I = gate->rows;
    mm_job j = {.f = f, .x = x, .ldx = d, .n_tok = n, .n = 2, .swiglu = 1};
    j.r[0] = (mm_req){gate, f->p1, I};
    j.r[1] = (mm_req){up, f->p2, I};
    mm_run(f, &j);
    mm(f, down, f->p1, I, n, y, d);
}

static void moe_layer(st_fwd *f, const st_layer *L, int64_t T) {
    const st_config *c = &f->m->cfg;
    const int64_t d = c->hidden_size;
    const int E = c->n_experts, k = c->n_experts_per_tok;
    mm(f, &L->router, f->xn, d, T, f->router, E);
    for (int64_t t = 0; t < T; t++) {
        float *p = f->router + t * E;
        float mx = p[0];
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        /* top-k by selection; ties go to the lower expert index */
        float wsum = 0.0f;
        for (int s = 0; s < k; s++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < s; q++) taken |= f->moe_sel[t * k + q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            f->moe_sel[t * k + s] = best;
            f->moe_w[t * k + s] = p[best];
            wsum += p[best];
        }
        if (c->norm_topk_prob)
            for (int s = 0; s < k; s++) f->moe_w[t * k + s] /= wsum;
    }
    memset(f->out, 0, (size_t)(T * d) * sizeof(float));
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int s = 0; s < k; s++)
                if (f->moe_sel[t * k + s] == e) {
                    f->moe_list[n] = (int32_t)t;
                    f->moe_lw[n] = f->moe_w[t * k + s];
                    memcpy(f->gath + n * d, f->xn + t * d, (size_t)d * sizeof(float));
                    n++;
                }
        if (!n) continue;
        swiglu(f, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], f->gath, n, f->gout);
        for (int64_t i = 0; i < n; i++) {
            float *o = f->out + (int64_t)f->moe_list[i] * d;
            const float *g = f->gout + i * d;
            for (int64_t j = 0; j < d; j++) o[j] += f->moe_lw[i] * g[j];
        }
    }
    if (L->has_shared) {
        swiglu(f, &L->sh_gate, &L->sh_up, &L->sh_down, f->xn, T, f->gout);
        mm(f, &L->sh_expert_gate, f->xn, d, T, f->moe_lw, 1);
        for (int64_t t = 0; t < T; t++) {
            float g = sigmoid(f->moe_lw[t]);
            for (int64_t j = 0; j < d; j++) f->out[t * d + j] += g * f->gout[t * d + j];
        }
    }
}

/* ---------------------------------------------------------------------------------------- */

static st_status fwd_run(st_fwd *f, const st_batch_item *items, int n_items, float *logits,
                         st_error *err) {
    const st_model *m = f->m;
    const st_config *c = &m->cfg;
    st_cache *cache = f->cache;
    if (n_items < 1) return st_error_set(err, ST_ERR_ARG, "empty batch");
    int64_t T = 0, blocks = 0;
    for (int i = 0; i < n_items; i++) {
        const st_batch_item *it = &items[i];
        if (!it->seq || it->seq->slot < 0)
            return st_error_set(err, ST_ERR_ARG, "batch item %d: sequence not started", i);
        if (it->n_tokens < 1)
            return st_error_set(err, ST_ERR_ARG, "batch item %d: no tokens", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq || items[j].seq->slot == it->seq->slot)
                return st_error_set(err, ST_ERR_ARG, "batch items %d and %d are the same sequence",
                                    j, i);
        for (int j = 0; j < it->n_tokens; j++)
            if (it->tokens[j] < 0 || it->tokens[j] >= c->vocab_size)
                return st_error_set(err, ST_ERR_ARG,
                                    "batch item %d: token id %d is outside the vocabulary [0, %lld)",
                                    i, it->tokens[j], (long long)c->vocab_size);
        if (it->seq->n_past + it->n_tokens > cache->p.max_seq_len)
            return st_error_set(err, ST_ERR_LIMIT,
                                "batch item %d: %lld positions exceed the context length %lld", i,
                                (long long)(it->seq->n_past + it->n_tokens),
                                (long long)cache->p.max_seq_len);
        T += it->n_tokens;
        if (T > f->max_tokens)
            return st_error_set(err, ST_ERR_LIMIT, "batch of %lld+ tokens exceeds the planned %d",
                                (long long)T, f->max_tokens);
        blocks += st_cache_blocks_needed(cache, it->seq, it->n_tokens);
    }
    if (blocks > cache->n_free_blocks)
        return st_error_set(err, ST_ERR_BUSY, "KV pool exhausted: need %lld blocks, %lld free",
                            (long long)blocks, (long long)cache->n_free_blocks);
    for (int i = 0; i < n_items; i++) {
        st_status st = st_cache_seq_reserve(cache, items[i].seq, items[i].n_tokens, err);
        ST_ASSERT(st == ST_OK); /* checked above */
    }

    const int64_t d = c->hidden_size;
    int64_t t = 0;
    f->item_t0[0] = 0;
    for (int i = 0; i < n_items; i++) {
        for (int j = 0; j < items[i].n_tokens; j++, t++)
            st_matrix_row_f32(&m->embed, items[i].tokens[j], f->x + t * d);
        f->item_t0[i + 1] = t;
    }

    /* the residual add of a block's output is fused with the next norm (x += out; norm) */
    for (int li = 0; li <= c->n_layers; li++) {
        const int pending = li > 0; /* f->out holds the previous MLP's output */
        const float *norm_w = li < c->n_layers ? m->layers[li].input_norm : m->final_norm;
        if (f->hook && li < c->n_layers) {
            if (pending)
                for (int64_t e = 0; e < T * d; e++) f->x[e] += f->out[e];
            f->hook(f->hook_user, li, T, d, f->x);
            add_norm(f, T, norm_w, 0);
        } else {
            add_norm(f, T, norm_w, pending);
        }
        if (li == c->n_layers) break;
        const st_layer *L = &m->layers[li];
        if (L->kind == ST_LAYER_LINEAR) gdn_layer(f, L, items, n_items, T);
        else attn_layer(f, L, items, n_items, T);
        add_norm(f, T, L->post_norm, 1);
        if (c->is_moe) moe_layer(f, L, T);
        else swiglu(f, &L->gate, &L->up, &L->down, f->xn, T, f->out);
    }
    if (f->hook) f->hook(f->hook_user, c->n_layers, T, d, f->xn);

    /* logits for the rows asked for, in item order */
    int64_t rows = 0;
    t = 0;
    for (int i = 0; i < n_items; i++) {
        int n = items[i].n_tokens;
        if (items[i].logits == ST_LOGITS_ALL) {
            memcpy(f->gath + rows * d, f->xn + t * d, (size_t)(n * d) * sizeof(float));
            rows += n;
        } else if (items[i].logits == ST_LOGITS_LAST) {
            memcpy(f->gath + rows * d, f->xn + (t + n - 1) * d, (size_t)d * sizeof(float));
            rows++;
        }
        t += n;
    }
    if (rows) mm(f, &m->lm_head, f->gath, d, rows, logits, c->vocab_size);
    for (int i = 0; i < n_items; i++) items[i].seq->n_past += items[i].n_tokens;
    return ST_OK;
}

st_status st_fwd_run(st_fwd *f, const st_batch_item *items, int n_items, float *logits,
                     st_error *err) {
    const unsigned mode = fp_mode_enter();
    st_status st = fwd_run(f, items, n_items, logits, err);
    fp_mode_leave(mode);
    return st;
}
