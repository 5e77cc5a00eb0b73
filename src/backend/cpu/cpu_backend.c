/* ==== The CPU backend (see cpu.h and backend/backend.h; spec/text-model.md section 4) ====
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
 *     weighted V) that is merged in chunk order. When a step has fewer such tasks than
 *     threads (decode of few sequences) the chunks are spread over the threads and merged
 *     after a barrier: the same partials, the same merge order, the same bits.
 * Splits follow measured thread speeds (core/balance.h); results are the same bits for any
 * thread count and any batch composition.
 *
 * Shapes are the shard's (st_shard): local query/KV heads, GDN key/value heads, MLP widths.
 * A shard's weights are views (st_matrix_rows / st_matrix_cols) of the model's matrices, so
 * world 1 is the whole model with no copy. Each matrix may get a packed copy (st_cpu_params
 * pack) owned by the backend; the model's descriptors are never changed.
 */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/moe_route.h"
#include "core/balance.h"
#include "core/clock.h"
#include "core/mem.h"
#include "core/numeric.h"
#include "core/threadpool.h"
#include "dist/comm.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* Subnormal floats take microcode assists (over 100 cycles per operation): the GDN decays
 * (exp of large negative cumulative log-decays) and states produce them, and a layer can
 * slow down tenfold. Steps therefore run with flush-to-zero and denormals-are-zero on every
 * thread (the pool's workers are set once at creation; the calling thread's MXCSR is saved
 * at step_begin and restored at step_end). Values below 1.2e-38 are treated as 0, on every
 * kernel set alike. */
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
#define LOGIT_ROWS 32 /* logit rows a shard computes and gathers at a time */
#define SPLIT_TOK 8   /* at most this many decode tokens spread attention chunks over threads */
#define PAR_MIN 8     /* fewer tokens than this: small per-token loops run on the caller */
#define PAR_WORK 65536 /* a region with less work than this (multiply-adds) runs on the caller:
                          starting threads would cost more than it saves (tiny models) */
#define MM_MAX 8      /* matrices (parts) of one parallel matrix product */

/* ---------------------------------------------------------------------------------------- */
/* the backend: local shapes and prepared weights */

/* A weight as the kernels see it: up to three row sections (the q, k and v parts of a
 * shard's fused qkv) written side by side into one output row. */
typedef struct cpu_mat {
    int n;               /* parts; 0 when the layer has no such weight */
    st_matrix part[3];   /* views of the model's matrix (packed copies owned by the backend) */
    int64_t off[3];      /* each part's first output column */
    int64_t rows, cols;  /* output width (sum of the parts' rows), input width */
} cpu_mat;

typedef struct cpu_layer {
    st_layer_kind kind;
    int kind_index;
    const float *input_norm, *post_norm;  /* [d] (the model's) */
    cpu_mat w[ST_W_COUNT];
    const float *conv_t;     /* [K][cd] conv taps of the local channels, tap-major (owned by
                                the backend's vector block) */
    const float *dt_bias;    /* [Hv] local value heads (the model's, offset) */
    const float *neg_exp_a;  /* [Hv] */
    const float *gdn_norm;   /* [Dv] */
    const float *q_norm, *k_norm; /* [hd] */
    st_matrix router;        /* [E][d] (whole on every shard) */
    st_matrix *exp_gate, *exp_up, *exp_down; /* [E] local widths (into cpu_backend.experts) */
    int has_shared;
    st_matrix sh_gate, sh_up, sh_down, sh_egate;
} cpu_layer;

/* shapes of the shard (world 1: the model's) */
typedef struct cpu_dims {
    int64_t d, V;
    int nh, nkv, hd, grp, head0, kv0;  /* local query / KV heads; grp = global heads per KV head */
    int Hk, Hv, Dk, Dv, rep, k0, v0;   /* local GDN key / value heads; rep = global Hv / Hk */
    int64_t kd, vd, cd;                /* local key, value and conv widths */
    int K;                             /* conv taps */
    int64_t I;                         /* the widest local MLP (dense, expert or shared) */
    int64_t Vl, Vmax;       /* this shard's LM head rows; the widest shard's */
    int E, topk, norm_topk;
    int rope_dim;
    float eps;
    int64_t w1, w2, w3, wm, maxcols, qmax; /* activation widths */
} cpu_dims;

typedef struct cpu_backend {
    st_backend base;
    const st_kernels *k;
    int n_threads, gdn_chunked;
    int64_t par_work;
    cpu_dims z;
    cpu_layer *layers;     /* [n_layers], owned */
    st_matrix lm_head;     /* [V][d] */
    const st_matrix *embed;/* the model's */
    const float *final_norm;
    st_matrix *experts;    /* [n_layers][3][E] local expert views, owned */
    float *vecs;           /* owned: conv taps of every GDN layer, then inv_freq */
    const float *inv_freq; /* [rope_dim/2] */
    unsigned char *rope_axis; /* [rope_dim/2] each frequency's M-RoPE axis; owned */
    void *pack_storage;    /* owned (st_big_alloc_huge): every packed copy */
    size_t pack_bytes;
} cpu_backend;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static cpu_dims dims_of(const st_model *m, const st_shard *s) {
    const st_config *c = &m->cfg;
    cpu_dims z;
    memset(&z, 0, sizeof z);
    z.d = c->hidden_size;
    z.V = c->vocab_size;
    z.Vl = s->vocab ? s->vocab : c->vocab_size;
    for (int r = 0; r < s->world; r++) { /* the widest rank's slice: the gathers' row width */
        int64_t v0, n;
        st_shard_vocab(c->vocab_size, s->world, r, &v0, &n);
        z.Vmax = n > z.Vmax ? n : z.Vmax;
    }
    if (s->world <= 1) z.Vmax = z.V;
    z.nh = s->n_heads;
    z.nkv = s->n_kv_heads;
    z.hd = c->head_dim;
    z.grp = c->n_kv_heads ? c->n_heads / c->n_kv_heads : 1;
    z.head0 = s->head0;
    z.kv0 = s->kv_head0;
    z.Hk = s->lin_k_heads;
    z.Hv = s->lin_v_heads;
    z.Dk = c->lin_key_head_dim;
    z.Dv = c->lin_value_head_dim;
    z.rep = c->lin_n_key_heads ? c->lin_n_value_heads / c->lin_n_key_heads : 1;
    z.k0 = s->lin_k0;
    z.v0 = s->lin_v0;
    z.kd = (int64_t)z.Hk * z.Dk;
    z.vd = (int64_t)z.Hv * z.Dv;
    z.cd = 2 * z.kd + z.vd;
    z.K = c->conv_kernel;
    z.I = max64(s->inter, max64(s->moe_inter, s->shared_inter));
    z.E = c->is_moe ? c->n_experts : 0;
    z.topk = c->is_moe ? c->n_experts_per_tok : 0;
    z.norm_topk = c->norm_topk_prob;
    z.rope_dim = c->rope_dim;
    z.eps = c->rms_norm_eps;
    const int64_t nh = z.nh, nkv = z.nkv, hd = z.hd;
    z.w1 = max64(max64(z.cd, 2 * nh * hd), z.I);
    z.w2 = max64(max64(z.vd, nkv * hd), z.I);
    z.w3 = max64(z.Hv, nkv * hd);
    z.wm = max64(z.vd, nh * hd);
    z.maxcols = max64(max64(max64(z.d, z.I), max64(z.vd, nh * hd)), max64(hd, max64(z.Dk, z.Dv)));
    z.qmax = z.grp > ATT_QMAX ? z.grp : ATT_QMAX;
    return z;
}

/* local query heads [*qa, *qb) that read local KV head h */
static void kv_queries(const cpu_dims *z, int h, int *qa, int *qb) {
    const int g0 = (z->kv0 + h) * z->grp, g1 = g0 + z->grp;
    *qa = (g0 > z->head0 ? g0 : z->head0) - z->head0;
    *qb = (g1 < z->head0 + z->nh ? g1 : z->head0 + z->nh) - z->head0;
}

/* local value heads [*va, *vb) that read local key head g */
static void key_values(const cpu_dims *z, int g, int *va, int *vb) {
    const int h0 = (z->k0 + g) * z->rep, h1 = h0 + z->rep;
    *va = (h0 > z->v0 ? h0 : z->v0) - z->v0;
    *vb = (h1 < z->v0 + z->Hv ? h1 : z->v0 + z->Hv) - z->v0;
}

/* one whole matrix, or a row range of it, as a one-part weight */
static cpu_mat mat_rows(const st_matrix *w, int64_t r0, int64_t n) {
    cpu_mat a;
    memset(&a, 0, sizeof a);
    if (!w->data) return a;
    a.n = 1;
    a.part[0] = r0 == 0 && n == w->rows ? *w : st_matrix_rows(w, r0, n);
    a.rows = n;
    a.cols = w->cols;
    return a;
}

static cpu_mat mat_cols(const st_matrix *w, int64_t c0, int64_t n) {
    cpu_mat a;
    memset(&a, 0, sizeof a);
    if (!w->data) return a;
    a.n = 1;
    a.part[0] = c0 == 0 && n == w->cols ? *w : st_matrix_cols(w, c0, n);
    a.rows = w->rows;
    a.cols = n;
    return a;
}

static st_matrix view_rows(const st_matrix *w, int64_t r0, int64_t n) {
    return r0 == 0 && n == w->rows ? *w : st_matrix_rows(w, r0, n);
}
static st_matrix view_cols(const st_matrix *w, int64_t c0, int64_t n) {
    return c0 == 0 && n == w->cols ? *w : st_matrix_cols(w, c0, n);
}

/* The shard's weights of layer i (the shard was checked by st_shard_make). */
static void prepare_layer(cpu_backend *b, int i, float *conv_t, st_matrix *experts) {
    const st_model *m = b->base.m;
    const st_config *c = &m->cfg;
    const st_shard *s = &b->base.shard;
    const cpu_dims *z = &b->z;
    const st_layer *L = &m->layers[i];
    cpu_layer *o = &b->layers[i];
    o->kind = L->kind;
    o->kind_index = L->kind_index;
    o->input_norm = L->input_norm;
    o->post_norm = L->post_norm;
    if (L->kind == ST_LAYER_LINEAR) {
        const int64_t kd = st_config_key_dim(c), Dk = z->Dk, Dv = z->Dv;
        /* q, k and v channels of the local heads: the three row sections of in_proj_qkv */
        const int64_t sec[3][2] = {{z->k0 * Dk, z->kd}, {kd + z->k0 * Dk, z->kd},
                                   {2 * kd + z->v0 * Dv, z->vd}};
        cpu_mat *q = &o->w[ST_W_IN_QKV];
        if (z->kd == kd && z->vd == st_config_value_dim(c)) {
            *q = mat_rows(&L->in_qkv, 0, L->in_qkv.rows);
        } else {
            q->n = 3;
            q->cols = L->in_qkv.cols;
            for (int p = 0; p < 3; p++) {
                q->part[p] = st_matrix_rows(&L->in_qkv, sec[p][0], sec[p][1]);
                q->off[p] = q->rows;
                q->rows += sec[p][1];
            }
        }
        o->w[ST_W_IN_Z] = mat_rows(&L->in_z, z->v0 * Dv, z->vd);
        o->w[ST_W_IN_B] = mat_rows(&L->in_b, z->v0, z->Hv);
        o->w[ST_W_IN_A] = mat_rows(&L->in_a, z->v0, z->Hv);
        o->w[ST_W_OUT_PROJ] = mat_cols(&L->out_proj, z->v0 * Dv, z->vd);
        /* conv taps of the local channels, tap-major */
        for (int p = 0, ch = 0; p < 3; p++)
            for (int64_t e = 0; e < sec[p][1]; e++, ch++)
                for (int j = 0; j < z->K; j++)
                    conv_t[j * z->cd + ch] = L->conv_w[(sec[p][0] + e) * z->K + j];
        o->conv_t = conv_t;
        o->dt_bias = L->dt_bias + z->v0;
        o->neg_exp_a = L->neg_exp_a + z->v0;
        o->gdn_norm = L->gdn_norm;
    } else {
        const int64_t hd = z->hd;
        o->w[ST_W_Q] = mat_rows(&L->q_proj, (int64_t)z->head0 * 2 * hd, (int64_t)z->nh * 2 * hd);
        o->w[ST_W_K] = mat_rows(&L->k_proj, (int64_t)z->kv0 * hd, (int64_t)z->nkv * hd);
        o->w[ST_W_V] = mat_rows(&L->v_proj, (int64_t)z->kv0 * hd, (int64_t)z->nkv * hd);
        o->w[ST_W_O] = mat_cols(&L->o_proj, (int64_t)z->head0 * hd, (int64_t)z->nh * hd);
        o->q_norm = L->q_norm;
        o->k_norm = L->k_norm;
    }
    if (!c->is_moe) {
        o->w[ST_W_GATE] = mat_rows(&L->gate, s->inter0, s->inter);
        o->w[ST_W_UP] = mat_rows(&L->up, s->inter0, s->inter);
        o->w[ST_W_DOWN] = mat_cols(&L->down, s->inter0, s->inter);
        return;
    }
    o->router = L->router;
    o->exp_gate = experts;
    o->exp_up = experts + z->E;
    o->exp_down = experts + 2 * z->E;
    for (int e = 0; e < z->E; e++) {
        o->exp_gate[e] = view_rows(&L->exp_gate[e], s->moe_inter0, s->moe_inter);
        o->exp_up[e] = view_rows(&L->exp_up[e], s->moe_inter0, s->moe_inter);
        o->exp_down[e] = view_cols(&L->exp_down[e], s->moe_inter0, s->moe_inter);
    }
    o->has_shared = L->has_shared;
    if (L->has_shared) {
        o->sh_gate = view_rows(&L->sh_gate, s->shared_inter0, s->shared_inter);
        o->sh_up = view_rows(&L->sh_up, s->shared_inter0, s->shared_inter);
        o->sh_down = view_cols(&L->sh_down, s->shared_inter0, s->shared_inter);
        o->sh_egate = L->sh_expert_gate;
    }
}

/* Every matrix the backend multiplies by: the count, and the pointers in out[] when given. */
static size_t backend_matrices(cpu_backend *b, st_matrix **out) {
    size_t n = 0;
#define ADD(w) do { if ((w)->data) { if (out) out[n] = (w); n++; } } while (0)
    ADD(&b->lm_head);
    const st_config *c = &b->base.m->cfg;
    for (int i = 0; i < c->n_layers; i++) {
        cpu_layer *L = &b->layers[i];
        for (int w = 0; w < ST_W_COUNT; w++)
            for (int p = 0; p < L->w[w].n; p++) ADD(&L->w[w].part[p]);
        if (!c->is_moe) continue;
        ADD(&L->router);
        for (int e = 0; e < b->z.E; e++) {
            ADD(&L->exp_gate[e]);
            ADD(&L->exp_up[e]);
            ADD(&L->exp_down[e]);
        }
        if (L->has_shared) {
            ADD(&L->sh_gate);
            ADD(&L->sh_up);
            ADD(&L->sh_down);
            ADD(&L->sh_egate);
        }
    }
#undef ADD
    return n;
}

typedef struct pack_job {
    st_matrix *w;
    void *dst;
} pack_job;

static void pack_fn(void *ctx, int tid, int n) {
    pack_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->w->rows, n, tid, 16, &lo, &hi);
    if (lo < hi) st_matrix_pack(j->w, j->w->pack, j->dst, lo, hi);
}

/* Give every matrix a packed copy in the first packing of `packs` it can take. On the whole
 * model (world 1) the originals' pages then leave memory (they stay mapped, and come back
 * from the file if read). */
/* the whole pages of [p, p + bytes) leave this process's resident set (a read-only mapping:
 * a later read faults them back in) */
static void release_span(const void *p, size_t bytes, size_t page) {
    if (!p || !bytes) return;
    const uintptr_t a = (uintptr_t)p, e = a + bytes;
    const uintptr_t pa = (a + page - 1) / page * page, pe = e / page * page;
    if (pe > pa) madvise((void *)pa, pe - pa, MADV_DONTNEED);
}

/* A packed matrix's source bytes in the checkpoint's mapping, released: the rows of a row
 * view, every row's span of a column view (a shard's out projections: the pages hold the
 * other ranks' columns too, which this process never reads). */
static void release_source(const st_matrix *m, size_t page) {
    if (m->rows < 1) return;
    const size_t ld = (size_t)st_matrix_ld(m), cols = (size_t)m->cols, rows = (size_t)m->rows;
    if (m->fmt == ST_WFMT_AFFINE) {
        const size_t bits = (size_t)m->bits, g = (size_t)m->group, ss = st_dtype_size(m->sdtype);
        release_span(m->data, (rows - 1) * ld * bits / 8 + cols * bits / 8, page);
        release_span(m->scales, ((rows - 1) * (ld / g) + cols / g) * ss, page);
        release_span(m->biases, ((rows - 1) * (ld / g) + cols / g) * ss, page);
    } else {
        const size_t es = m->fmt == ST_WFMT_F32 ? 4 : 2;
        release_span(m->data, ((rows - 1) * ld + cols) * es, page);
    }
}

static st_status pack_weights(cpu_backend *b, unsigned packs, st_error *err) {
    static const st_wpack order[] = {ST_WPACK_BF16_V16, ST_WPACK_Q8_V16};
    const size_t n = backend_matrices(b, NULL);
    st_matrix **mats = calloc(n ? n : 1, sizeof *mats);
    size_t *offs = calloc(n ? n : 1, sizeof *offs);
    if (!mats || !offs) {
        free(mats);
        free(offs);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    backend_matrices(b, mats);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        st_wpack kind = ST_WPACK_NONE;
        const unsigned possible = st_matrix_packs_possible(mats[i]) & packs;
        for (size_t o = 0; o < sizeof order / sizeof order[0] && kind == ST_WPACK_NONE; o++)
            if (possible & ST_WPACK_BIT(order[o])) kind = order[o];
        if (kind == ST_WPACK_NONE) {
            offs[i] = SIZE_MAX;
            continue;
        }
        offs[i] = total;
        total += (st_matrix_pack_bytes(mats[i], kind) + 63) / 64 * 64;
    }
    st_status st = ST_OK;
    st_pool *pool = NULL;
    uint8_t *block = NULL;
    if (total == 0) goto done;
    block = st_big_alloc_huge(total);
    if (!block) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory packing %zu MiB of weights", total >> 20);
        goto done;
    }
    if ((st = st_pool_create(b->n_threads, &pool, err)) != ST_OK) {
        st_big_free(block, total);
        goto done;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i++) {
        if (offs[i] == SIZE_MAX) continue;
        st_wpack kind = ST_WPACK_NONE;
        const unsigned possible = st_matrix_packs_possible(mats[i]) & packs;
        for (size_t o = 0; o < sizeof order / sizeof order[0] && kind == ST_WPACK_NONE; o++)
            if (possible & ST_WPACK_BIT(order[o])) kind = order[o];
        mats[i]->pack = kind;
        pack_job j = {mats[i], block + offs[i]};
        st_pool_run(pool, pack_fn, &j);
        mats[i]->packed = j.dst;
        release_source(mats[i], page);
    }
    st_pool_destroy(pool);
    b->pack_storage = block;
    b->pack_bytes = total;
done:
    free(mats);
    free(offs);
    return st;
}

static const st_backend_ops cpu_ops;

static void cpu_destroy(st_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b) return;
    if (b->pack_storage) st_big_free(b->pack_storage, b->pack_bytes);
    free(b->layers);
    free(b->experts);
    free(b->vecs);
    free(b->rope_axis);
    free(b);
}

st_cpu_params st_cpu_default_params(void) {
    st_cpu_params p = {.kernels = NULL, .n_threads = 0, .pack = 1, .gdn_chunked = 1, .min_parallel_work = 0};
    return p;
}

st_status st_backend_cpu_create(const st_model *m, const st_cpu_params *p, const st_shard *shard,
                                st_backend **out, st_error *err) {
    *out = NULL;
    if (m->synthetic)
        return st_error_set(err, ST_ERR_UNSUPPORTED,
                            "this model's weights are synthesized in device memory (--synth): the CPU backend "
                            "needs a checkpoint (strand synth writes one)");
    st_cpu_params dp = st_cpu_default_params();
    if (!p) p = &dp;
    const int nth = p->n_threads > 0 ? p->n_threads : st_default_threads();
    if (nth > ST_POOL_MAX_THREADS)
        return st_error_set(err, ST_ERR_ARG, "n_threads %d exceeds %d", nth, ST_POOL_MAX_THREADS);
    st_shard whole;
    if (!shard) {
        st_status st = st_shard_make(m, 0, 1, &whole, err);
        if (st != ST_OK) return st;
        shard = &whole;
    }
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const st_config *c = &m->cfg;
    b->base.ops = &cpu_ops;
    b->base.m = m;
    b->base.shard = *shard;
    b->k = p->kernels ? p->kernels : st_kernels_best();
    b->n_threads = nth;
    b->gdn_chunked = p->gdn_chunked;
    b->base.comm = p->comm;
    b->par_work = p->min_parallel_work > 0 ? p->min_parallel_work : PAR_WORK;
    b->z = dims_of(m, shard);
    b->embed = &m->embed;
    b->final_norm = m->final_norm;
    b->lm_head = shard->world > 1 && m->lm_head.data ? st_matrix_rows(&m->lm_head, shard->vocab0, shard->vocab) : m->lm_head;
    b->layers = calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *b->layers);
    const size_t conv_floats = (size_t)m->n_linear * (size_t)b->z.K * (size_t)b->z.cd;
    b->vecs = calloc(conv_floats + (size_t)c->rope_dim / 2 + 1, sizeof *b->vecs);
    const size_t n_exp = c->is_moe ? (size_t)c->n_layers * 3 * (size_t)b->z.E : 0;
    b->experts = calloc(n_exp ? n_exp : 1, sizeof *b->experts);
    if (!b->layers || !b->vecs || !b->experts) {
        cpu_destroy(&b->base);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < c->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        float *ct = b->vecs + (size_t)(L->kind == ST_LAYER_LINEAR ? L->kind_index : 0) *
                                  (size_t)b->z.K * (size_t)b->z.cd;
        prepare_layer(b, i, ct, b->experts + (size_t)i * 3 * (size_t)b->z.E);
    }
    /* inverse frequencies as the reference computes them: fp32 theta^(-2i/rope_dim) */
    float *inv = b->vecs + conv_floats;
    for (int i = 0; i < c->rope_dim / 2; i++)
        inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->rope_dim));
    b->inv_freq = inv;
    b->rope_axis = malloc((size_t)(c->rope_dim / 2 + 1));
    if (!b->rope_axis) {
        cpu_destroy(&b->base);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < c->rope_dim / 2; i++) b->rope_axis[i] = (unsigned char)st_config_mrope_axis(c, i);
    if (p->pack) {
        st_status st = pack_weights(b, st_kernels_packs(b->k), err);
        if (st != ST_OK) {
            cpu_destroy(&b->base);
            return st;
        }
    }
    *out = &b->base;
    return ST_OK;
}

int st_backend_is_cpu(const st_backend *b) { return b && b->ops == &cpu_ops; }
const st_kernels *st_backend_cpu_kernels(const st_backend *b) { return ((const cpu_backend *)b)->k; }
int st_backend_cpu_threads(const st_backend *b) { return ((const cpu_backend *)b)->n_threads; }
size_t st_backend_cpu_packed_bytes(const st_backend *b) { return ((const cpu_backend *)b)->pack_bytes; }

/* ---------------------------------------------------------------------------------------- */
/* in-process all-reduce groups */

struct st_cpu_group {
    int world;
    pthread_barrier_t bar;
    float *bufs[ST_POOL_MAX_THREADS]; /* each rank's buffer of the current all-reduce */
};

st_status st_cpu_group_create(int world, st_cpu_group **out, st_error *err) {
    *out = NULL;
    if (world < 1 || world > ST_POOL_MAX_THREADS)
        return st_error_set(err, ST_ERR_ARG, "group: world %d", world);
    st_cpu_group *g = calloc(1, sizeof *g);
    if (!g) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    g->world = world;
    if (pthread_barrier_init(&g->bar, NULL, (unsigned)world) != 0) {
        free(g);
        return st_error_set(err, ST_ERR_IO, "group: cannot make a barrier");
    }
    *out = g;
    return ST_OK;
}

void st_cpu_group_destroy(st_cpu_group *g) {
    if (!g) return;
    pthread_barrier_destroy(&g->bar);
    free(g);
}

/* ---------------------------------------------------------------------------------------- */
/* contexts */

/* per-thread scratch (all owned) */
typedef struct cpu_thread {
    float *mm;        /* matmul scratch: st_kernels_matmul_scratch(max cols) */
    float *tmp;       /* [cd] conv outputs of one token */
    float *rope_cos;  /* [rope_dim/2] */
    float *rope_sin;
    float *att_q;     /* [qmax][hd] scaled queries of a task */
    float *att_s;     /* [qmax][ATT_CHUNK] scores / probabilities of a chunk */
    float *att_oc;    /* [qmax][hd] a chunk's weighted V */
    float *att_o;     /* [qmax][hd] merged output */
    float *att_m;     /* [4][qmax] merged max, sum; chunk max, sum */
    int64_t *att_pos; /* [qmax] position of each query */
    float *gdn;       /* chunked delta-rule work area (gdn_ws_floats) */
    float *gates;     /* [max_tokens][2] beta, log-decay of one head over an item */
} cpu_thread;

typedef struct cpu_ctx {
    st_bctx base;
    cpu_backend *b;
    const st_kernels *k;
    const cpu_dims *z;
    st_ctx_params p;
    st_pool *pool;            /* owned */
    int n_threads;
    int att_qmax;             /* query vectors per attention task: max(ATT_QMAX, group) */
    size_t bytes;             /* everything allocated */
    /* the step */
    const st_step_plan *plan; /* borrowed from step_begin to step_end */
    int64_t T;
    unsigned fp_saved;
    /* activations, T = max_tokens (all owned) */
    float *x;       /* [T][d] residual stream */
    float *xn;      /* [T][d] normalised input of a block */
    float *out;     /* [T][d] block output */
    float *p1;      /* [T][w1] q_proj|qkv|gate output */
    float *p2;      /* [T][w2] k|z|up output */
    float *p3;      /* [T][w3] v|b output */
    float *p4;      /* [T][Hv] a output */
    float *mix;     /* [T][wm] mixer output before its out projection */
    float *gath;    /* [T][d] gathered rows (MoE, logits, all-reduce sums) */
    float *comm_buf; /* [world][T][d] every rank's partial sums (a communicator's all-reduce), or NULL */
    float *lg_part;  /* [LOGIT_ROWS][Vmax] a shard's vocabulary slice of some logit rows, or NULL */
    float *lg_all;   /* [world][LOGIT_ROWS][Vmax] every rank's (a communicator's), or NULL */
    st_error comm_err; /* the step's first failed all-reduce (step_end reports it) */
    float *gout;    /* [T][d] gathered outputs (MoE) */
    float *router;  /* [T][E] */
    int32_t *moe_sel;  /* [T][k] chosen experts */
    float *moe_w;      /* [T][k] their weights */
    int32_t *moe_list; /* [T] tokens routed to one expert */
    float *moe_lw;     /* [T] their weights */
    int64_t *task_w;   /* [max tasks + 2] cumulative task weights */
    float *part;       /* attention partials of split decode steps (mapped, owned) */
    size_t part_bytes;
    int64_t part_chunks; /* chunks per query the partial area holds */
    cpu_thread *th;    /* [n_threads] */
    st_balance mm_bal; /* rows of matrix products per thread, by measured speed */
    st_balance task_bal; /* delta-rule and attention tasks per thread, likewise */
    double *run_work;  /* [n_threads] the last parallel run: each thread's work (rows x cols,
                          or task weights) and, while it runs, its start, then its seconds */
    double *run_s;
    /* storage the engine keeps the books of (engine/cache.h) */
    uint8_t *kv;             /* [n_blocks][n_full][2][nkv][block_size][hd] of kv_dtype */
    size_t kv_elem, kv_head_stride, kv_block_elems, kv_bytes;
    float *conv;             /* [n_slots + n_snapshots][n_linear][K-1][cd] */
    float *rec;              /* [n_slots + n_snapshots][n_linear][Hv][Dv][Dk] */
    size_t conv_slot_floats, rec_slot_floats;
    /* an in-process all-reduce group, when joined */
    st_cpu_group *group;     /* borrowed */
    int rank;
} cpu_ctx;

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

/* attention chunks of a context of max_seq_len positions, and the split-decode tasks */
static int64_t part_chunks_of(int64_t max_seq_len) { return (max_seq_len + ATT_CHUNK - 1) / ATT_CHUNK; }
static int64_t max_tasks_of(const cpu_dims *z, int64_t T, int64_t chunks) {
    return max64(T * max64(z->Hk, z->nkv), SPLIT_TOK * z->nkv * chunks);
}

/* storage sizes of a context */
typedef struct storage_dims {
    size_t kv_elem, kv_head_stride, kv_block_elems, conv_slot_floats, rec_slot_floats;
} storage_dims;

static storage_dims storage_of(const cpu_backend *b, const st_ctx_params *p) {
    const st_model *m = b->base.m;
    const cpu_dims *z = &b->z;
    storage_dims s;
    s.kv_elem = p->kv_dtype == ST_KV_BF16 ? 2 : 4;
    s.kv_head_stride = (size_t)p->block_size * (size_t)z->hd;
    s.kv_block_elems = (size_t)m->n_full * 2 * (size_t)z->nkv * s.kv_head_stride;
    s.conv_slot_floats = (size_t)m->n_linear * (size_t)(z->K - 1) * (size_t)z->cd;
    s.rec_slot_floats = (size_t)m->n_linear * (size_t)z->Hv * (size_t)z->Dv * (size_t)z->Dk;
    return s;
}

/* scratch bytes (activations, tasks, per-thread areas, partials) as cpu_ctx_create takes them */
static size_t scratch_plan(const cpu_backend *b, const st_ctx_params *p) {
    const cpu_dims *z = &b->z;
    int64_t T = p->max_tokens, chunks = part_chunks_of(p->max_seq_len);
    const int nth = b->n_threads;
    int64_t floats = T * (5 * z->d + z->w1 + z->w2 + z->w3 + z->Hv + z->wm);
    size_t bytes = (size_t)(max_tasks_of(z, T, chunks) + 2) * sizeof(int64_t);
    if (z->E) {
        floats += T * (z->E + z->topk + 1);
        bytes += (size_t)(T * z->topk + T) * sizeof(int32_t);
    }
    int64_t per_thread = st_kernels_matmul_scratch(z->maxcols) + z->cd + z->rope_dim +
                         z->qmax * (3 * z->hd + ATT_CHUNK + 4) + gdn_ws_floats(z->Dk, z->Dv) + 2 * T;
    floats += nth * per_thread;
    bytes += (size_t)floats * sizeof(float) + (size_t)nth * (size_t)z->qmax * sizeof(int64_t);
    if (nth > 1 && chunks > 1 && z->nh > 0)
        bytes += (size_t)SPLIT_TOK * (size_t)z->nh * (size_t)chunks * (size_t)(z->hd + 2) * sizeof(float);
    const int world = b->base.shard.world;
    if (world > 1) bytes += (size_t)LOGIT_ROWS * (size_t)z->Vmax * sizeof(float);
    if (b->base.comm && b->base.comm->world > 1) /* the all-reduce's and the logits' gathers */
        bytes += (size_t)world * ((size_t)T * (size_t)z->d + (size_t)LOGIT_ROWS * (size_t)z->Vmax) * sizeof(float);
    return bytes;
}

static void cpu_ctx_plan(const st_backend *base, const st_ctx_params *p, st_ctx_plan *out) {
    const cpu_backend *b = (const cpu_backend *)base;
    storage_dims s = storage_of(b, p);
    out->kv_block_bytes = s.kv_block_elems * s.kv_elem;
    out->slot_bytes = (s.conv_slot_floats + s.rec_slot_floats) * sizeof(float);
    out->scratch_bytes = scratch_plan(b, p);
    out->total_bytes = (size_t)p->n_blocks * out->kv_block_bytes +
                       (size_t)(p->n_slots + p->n_snapshots) * out->slot_bytes + out->scratch_bytes;
}

static void cpu_ctx_destroy(st_bctx *base) {
    cpu_ctx *c = (cpu_ctx *)base;
    if (!c) return;
    st_pool_destroy(c->pool);
    float *bufs[] = {c->x, c->xn, c->out, c->p1, c->p2, c->p3, c->p4, c->mix, c->gath, c->gout,
                     c->router, c->moe_w, c->moe_lw, c->comm_buf, c->lg_part, c->lg_all};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->moe_sel);
    free(c->moe_list);
    free(c->task_w);
    st_big_free(c->part, c->part_bytes);
    if (c->th) {
        for (int i = 0; i < c->n_threads; i++) {
            cpu_thread *t = &c->th[i];
            float *tb[] = {t->mm,    t->tmp,   t->rope_cos, t->rope_sin, t->att_q, t->att_s,
                           t->att_oc, t->att_o, t->att_m,   t->gdn,      t->gates};
            for (size_t j = 0; j < sizeof tb / sizeof tb[0]; j++) free(tb[j]);
            free(t->att_pos);
        }
        free(c->th);
    }
    free(c->run_work);
    free(c->run_s);
    st_big_free(c->kv, c->kv_bytes);
    const size_t n_states = (size_t)(c->p.n_slots + c->p.n_snapshots);
    st_big_free(c->conv, n_states * c->conv_slot_floats * sizeof(float));
    st_big_free(c->rec, n_states * c->rec_slot_floats * sizeof(float));
    free(c);
}

/* 64-byte aligned, zeroed */
static float *falloc(cpu_ctx *c, int64_t n, int *fail) {
    if (n < 1) n = 1;
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (!p) *fail = 1;
    else memset(p, 0, bytes);
    c->bytes += bytes;
    return p;
}

static st_status cpu_ctx_create(st_backend *base, const st_ctx_params *p, st_bctx **out, st_error *err) {
    *out = NULL;
    cpu_backend *b = (cpu_backend *)base;
    if (p->max_tokens < 1 || p->max_tokens > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "max_tokens must be in [1, 2^20]");
    if (p->n_slots < 1 || p->block_size < 1 || p->max_seq_len < 1 || p->n_blocks < 0 || p->n_snapshots < 0 ||
        p->n_snapshots > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "context: slots, block size and length must be positive");
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    c->base.b = base;
    c->b = b;
    c->k = b->k;
    c->z = &b->z;
    c->p = *p;
    c->n_threads = b->n_threads;
    const cpu_dims *z = &b->z;
    const int nth = c->n_threads;
    const int64_t T = p->max_tokens, d = z->d;
    int fail = 0;
    c->x = falloc(c, T * d, &fail);
    c->xn = falloc(c, T * d, &fail);
    c->out = falloc(c, T * d, &fail);
    c->p1 = falloc(c, T * z->w1, &fail);
    c->p2 = falloc(c, T * z->w2, &fail);
    c->p3 = falloc(c, T * z->w3, &fail);
    c->p4 = falloc(c, T * z->Hv, &fail);
    c->mix = falloc(c, T * z->wm, &fail);
    c->gath = falloc(c, T * d, &fail);
    c->gout = falloc(c, T * d, &fail);
    if (b->base.comm && b->base.comm->world > 1) {
        c->comm_buf = falloc(c, (int64_t)b->base.comm->world * T * d, &fail);
        c->lg_all = falloc(c, (int64_t)b->base.comm->world * LOGIT_ROWS * z->Vmax, &fail);
    }
    if (b->base.shard.world > 1) c->lg_part = falloc(c, LOGIT_ROWS * z->Vmax, &fail);
    /* tasks: (item, key head), (item, KV head, tile) or, split, (item, KV head, chunk) */
    c->part_chunks = part_chunks_of(p->max_seq_len);
    const int64_t max_tasks = max_tasks_of(z, T, c->part_chunks);
    c->task_w = calloc((size_t)max_tasks + 2, sizeof *c->task_w);
    c->bytes += ((size_t)max_tasks + 2) * sizeof *c->task_w;
    fail |= !c->task_w;
    if (z->E) {
        c->router = falloc(c, T * z->E, &fail);
        c->moe_w = falloc(c, T * z->topk, &fail);
        c->moe_lw = falloc(c, T, &fail);
        c->moe_sel = calloc((size_t)(T * z->topk), sizeof *c->moe_sel);
        c->moe_list = calloc((size_t)T, sizeof *c->moe_list);
        c->bytes += (size_t)(T * z->topk + T) * sizeof(int32_t);
        fail |= !c->moe_sel || !c->moe_list;
    }
    st_balance_init(&c->mm_bal, nth);
    st_balance_init(&c->task_bal, nth);
    c->att_qmax = (int)z->qmax;
    c->th = calloc((size_t)nth, sizeof *c->th);
    c->run_work = calloc((size_t)nth, sizeof *c->run_work);
    c->run_s = calloc((size_t)nth, sizeof *c->run_s);
    fail |= !c->th || !c->run_work || !c->run_s;
    for (int i = 0; i < nth && !fail; i++) {
        cpu_thread *t = &c->th[i];
        const int64_t qm = c->att_qmax;
        t->mm = falloc(c, st_kernels_matmul_scratch(z->maxcols), &fail);
        t->tmp = falloc(c, z->cd, &fail);
        t->rope_cos = falloc(c, z->rope_dim / 2, &fail);
        t->rope_sin = falloc(c, z->rope_dim / 2, &fail);
        t->att_q = falloc(c, qm * z->hd, &fail);
        t->att_s = falloc(c, qm * ATT_CHUNK, &fail);
        t->att_oc = falloc(c, qm * z->hd, &fail);
        t->att_o = falloc(c, qm * z->hd, &fail);
        t->att_m = falloc(c, qm * 4, &fail);
        t->att_pos = calloc((size_t)qm, sizeof *t->att_pos);
        c->bytes += (size_t)qm * sizeof *t->att_pos;
        fail |= !t->att_pos;
        t->gdn = falloc(c, gdn_ws_floats(z->Dk, z->Dv), &fail);
        t->gates = falloc(c, 2 * T, &fail);
    }
    /* attention partials for split decode steps: SPLIT_TOK tokens x nh heads x chunks of
     * (hd + 2); mapped, so only what is touched becomes resident */
    if (!fail && nth > 1 && c->part_chunks > 1 && z->nh > 0) {
        c->part_bytes = (size_t)SPLIT_TOK * (size_t)z->nh * (size_t)c->part_chunks *
                        (size_t)(z->hd + 2) * sizeof(float);
        c->part = st_big_alloc(c->part_bytes);
        if (!c->part) c->part_bytes = 0; /* no split mode then */
        c->bytes += c->part_bytes;
    }
    /* the KV pool and the state slots */
    storage_dims s = storage_of(b, p);
    c->kv_elem = s.kv_elem;
    c->kv_head_stride = s.kv_head_stride;
    c->kv_block_elems = s.kv_block_elems;
    c->conv_slot_floats = s.conv_slot_floats;
    c->rec_slot_floats = s.rec_slot_floats;
    c->kv_bytes = (size_t)p->n_blocks * s.kv_block_elems * s.kv_elem;
    const size_t n_slots = (size_t)(p->n_slots + p->n_snapshots);
    if (!fail) {
        c->kv = st_big_alloc(c->kv_bytes);
        c->conv = st_big_alloc(n_slots * c->conv_slot_floats * sizeof(float));
        c->rec = st_big_alloc_huge(n_slots * c->rec_slot_floats * sizeof(float));
        if ((c->kv_bytes && !c->kv) || (c->conv_slot_floats && !c->conv) || (c->rec_slot_floats && !c->rec)) {
            cpu_ctx_destroy(&c->base);
            return st_error_set(err, ST_ERR_NOMEM, "cache: cannot reserve %lld KV blocks and %d state slots",
                                (long long)p->n_blocks, p->n_slots);
        }
        c->bytes += c->kv_bytes + n_slots * (c->conv_slot_floats + c->rec_slot_floats) * sizeof(float);
    }
    if (fail) {
        cpu_ctx_destroy(&c->base);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory planning scratch for %d tokens", p->max_tokens);
    }
    st_status st = st_pool_create(nth, &c->pool, err);
    if (st != ST_OK) {
        cpu_ctx_destroy(&c->base);
        return st;
    }
    st_pool_run(c->pool, fp_mode_fn, NULL); /* the workers keep it for their lifetime */
    *out = &c->base;
    return ST_OK;
}

static size_t cpu_ctx_bytes(const st_bctx *base) { return ((const cpu_ctx *)base)->bytes; }

struct st_pool *st_bctx_cpu_pool(st_bctx *c) { return ((cpu_ctx *)c)->pool; }

size_t st_bctx_cpu_storage_bytes(const st_bctx *base) {
    const cpu_ctx *c = (const cpu_ctx *)base;
    return c->kv_bytes +
           (size_t)(c->p.n_slots + c->p.n_snapshots) * (c->conv_slot_floats + c->rec_slot_floats) * sizeof(float);
}

static void cpu_state_copy(st_bctx *base, int from, int to) {
    cpu_ctx *c = (cpu_ctx *)base;
    ST_ASSERT(from >= 0 && to >= 0 && from < c->p.n_slots + c->p.n_snapshots && to < c->p.n_slots + c->p.n_snapshots);
    if (from == to) return;
    memcpy(c->conv + (size_t)to * c->conv_slot_floats, c->conv + (size_t)from * c->conv_slot_floats,
           c->conv_slot_floats * sizeof(float));
    memcpy(c->rec + (size_t)to * c->rec_slot_floats, c->rec + (size_t)from * c->rec_slot_floats,
           c->rec_slot_floats * sizeof(float));
}

static void cpu_kv_copy(st_bctx *base, int32_t from, int32_t to) {
    cpu_ctx *c = (cpu_ctx *)base;
    ST_ASSERT(from >= 0 && to >= 0 && from < c->p.n_blocks && to < c->p.n_blocks);
    if (from == to) return;
    const size_t bytes = c->kv_block_elems * c->kv_elem;
    memcpy(c->kv + (size_t)to * bytes, c->kv + (size_t)from * bytes, bytes);
}

void st_bctx_cpu_join(st_bctx *base, st_cpu_group *g, int rank) {
    cpu_ctx *c = (cpu_ctx *)base;
    ST_ASSERT(!g || (rank >= 0 && rank < g->world));
    c->group = g;
    c->rank = rank;
}

/* ---------------------------------------------------------------------------------------- */
/* the step's items */

static int64_t item_t0(const cpu_ctx *c, int it) { return c->plan->item_t0[it]; }
static int64_t item_len(const cpu_ctx *c, int it) { return c->plan->item_t0[it + 1] - c->plan->item_t0[it]; }
static int64_t item_pos0(const cpu_ctx *c, int it) { return c->plan->pos0[it]; }

/* Element pointer of K (kv = 0) or V (kv = 1) for full layer li, local head h, at position
 * pos of item it; the run of positions within a block is contiguous (stride head_dim). */
static inline void *kv_ptr(const cpu_ctx *c, int it, int li, int kv, int h, int64_t pos) {
    const int32_t *bt = c->plan->blocks + c->plan->block_t0[it];
    const int64_t bs = c->p.block_size;
    const int64_t b = bt[pos / bs], off = pos % bs;
    size_t e = (size_t)b * c->kv_block_elems +
               ((size_t)(li * 2 + kv) * (size_t)c->z->nkv + (size_t)h) * c->kv_head_stride +
               (size_t)off * (size_t)c->z->hd;
    return c->kv + e * c->kv_elem;
}
static inline float *conv_state(const cpu_ctx *c, int it, int li) {
    return c->conv + (size_t)c->plan->slot[it] * c->conv_slot_floats +
           (size_t)li * (size_t)(c->z->K - 1) * (size_t)c->z->cd;
}
static inline float *rec_state(const cpu_ctx *c, int it, int li) {
    return c->rec + (size_t)c->plan->slot[it] * c->rec_slot_floats +
           (size_t)li * (size_t)c->z->Hv * (size_t)c->z->Dv * (size_t)c->z->Dk;
}

static st_status cpu_step_begin(st_bctx *base, const st_step_plan *plan, st_error *err) {
    cpu_ctx *c = (cpu_ctx *)base;
    (void)err;
    c->plan = plan;
    c->T = plan->n_tokens;
    c->fp_saved = fp_mode_enter();
    /* a sequence's first step starts from zero state */
    for (int it = 0; it < plan->n_items; it++) {
        if (plan->pos0[it] != 0) continue;
        const size_t slot = (size_t)plan->slot[it];
        memset(c->conv + slot * c->conv_slot_floats, 0, c->conv_slot_floats * sizeof(float));
        memset(c->rec + slot * c->rec_slot_floats, 0, c->rec_slot_floats * sizeof(float));
    }
    return ST_OK;
}

static st_status cpu_step_end(st_bctx *base, st_error *err) {
    cpu_ctx *c = (cpu_ctx *)base;
    fp_mode_leave(c->fp_saved);
    c->plan = NULL;
    if (c->comm_err.status) { /* the job is broken: every later step fails the same way */
        if (err) *err = c->comm_err;
        return c->comm_err.status;
    }
    return ST_OK;
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
static void run_start(cpu_ctx *c, int tid) { c->run_s[tid] = st_now_s(); }
static void run_stop(cpu_ctx *c, int tid, double work) {
    c->run_work[tid] = work;
    c->run_s[tid] = st_now_s() - c->run_s[tid];
}

/* Per-task jobs (delta rule, attention): a thread's tasks, by speed */
static void tasks_begin(cpu_ctx *c, int tid, int nth, int64_t n_tasks, int64_t *lo, int64_t *hi) {
    split_weighted(&c->task_bal, c->task_w, n_tasks, nth, tid, lo, hi);
    run_start(c, tid);
}

static void tasks_end(cpu_ctx *c, int tid, int64_t lo, int64_t hi) {
    run_stop(c, tid, (double)(c->task_w[hi] - c->task_w[lo]));
}

/* Run fn on the pool, or on the caller alone when the work is small. Either way the same
 * arithmetic: partitions never change results. Returns whether the pool ran it. */
static int par_run(cpu_ctx *c, int64_t work, st_pool_fn fn, void *ctx) {
    if (work < c->b->par_work || c->n_threads == 1) {
        fn(ctx, 0, 1);
        return 0;
    }
    st_pool_run(c->pool, fn, ctx);
    return 1;
}

/* small per-token loops run on the caller below PAR_MIN tokens (unless the pool is forced) */
static int tok_serial(const cpu_ctx *c) {
    return (c->T < PAR_MIN && c->b->par_work >= PAR_WORK) || c->n_threads == 1;
}

/* ---------------------------------------------------------------------------------------- */
/* parallel matrix products */

typedef struct mm_req {
    const st_matrix *w;
    float *y;
    int64_t ldy;
} mm_req;

typedef struct mm_job {
    cpu_ctx *c;
    const float *x;
    int64_t ldx, n_tok;
    mm_req r[MM_MAX];
    int n;
    int swiglu; /* r[0].y = silu(r[0].y) * r[1].y on each thread's rows (same shapes) */
} mm_job;

/* Thread tid's rows of a matrix product: by measured thread speed on the pool, all of
 * them alone. */
static void mm_rows(const cpu_ctx *c, int64_t rows, int tid, int nth, int64_t *lo, int64_t *hi) {
    if (nth == c->mm_bal.n) st_balance_split(&c->mm_bal, rows, tid, 16, lo, hi);
    else st_split_range(rows, nth, tid, 16, lo, hi);
}

static void mm_job_fn(void *ctx, int tid, int nth) {
    mm_job *j = ctx;
    cpu_ctx *c = j->c;
    cpu_thread *th = &c->th[tid];
    run_start(c, tid);
    double work = 0;
    for (int i = 0; i < j->n; i++) {
        int64_t lo, hi;
        mm_rows(c, j->r[i].w->rows, tid, nth, &lo, &hi);
        if (lo < hi)
            c->k->matmul(j->r[i].w, j->x, j->ldx, j->n_tok, j->r[i].y, j->r[i].ldy, lo, hi, th->mm);
        work += (double)(hi - lo) * (double)j->r[i].w->cols;
    }
    if (j->swiglu) { /* the same rows this thread just wrote */
        int64_t lo, hi;
        mm_rows(c, j->r[0].w->rows, tid, nth, &lo, &hi);
        for (int64_t t = 0; t < j->n_tok && lo < hi; t++)
            c->k->silu_mul(j->r[0].y + t * j->r[0].ldy + lo, j->r[1].y + t * j->r[1].ldy + lo, hi - lo);
    }
    run_stop(c, tid, work);
}

static void mm_run(cpu_ctx *c, mm_job *j) {
    int64_t work = 0;
    for (int i = 0; i < j->n; i++) work += j->r[i].w->rows * j->r[i].w->cols * j->n_tok;
    if (par_run(c, work, mm_job_fn, j)) st_balance_update(&c->mm_bal, c->run_work, c->run_s);
}

static void mm(cpu_ctx *c, const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
               float *y, int64_t ldy) {
    mm_job j = {.c = c, .x = x, .ldx = ldx, .n_tok = n_tok, .n = 1};
    j.r[0] = (mm_req){w, y, ldy};
    mm_run(c, &j);
}

static float *act(cpu_ctx *c, st_act a) {
    switch (a) {
    case ST_ACT_X: return c->x;
    case ST_ACT_XN: return c->xn;
    case ST_ACT_OUT: return c->out;
    case ST_ACT_P1: return c->p1;
    case ST_ACT_P2: return c->p2;
    case ST_ACT_P3: return c->p3;
    case ST_ACT_P4: return c->p4;
    case ST_ACT_MIX: return c->mix;
    default: break;
    }
    ST_ASSERT(0 && "unknown activation buffer");
    return NULL;
}

static void cpu_matmul(st_bctx *base, int layer, st_act in, const st_mm *mms, int n, int swiglu) {
    cpu_ctx *c = (cpu_ctx *)base;
    const cpu_layer *L = &c->b->layers[layer];
    ST_ASSERT(n >= 1 && n <= 4);
    mm_job j = {.c = c, .x = act(c, in), .ldx = L->w[mms[0].w].cols, .n_tok = c->T, .swiglu = swiglu};
    for (int i = 0; i < n; i++) {
        const cpu_mat *w = &L->w[mms[i].w];
        ST_ASSERT(w->n >= 1 && w->cols == j.ldx);
        float *y = act(c, mms[i].out);
        for (int p = 0; p < w->n; p++) {
            ST_ASSERT(j.n < MM_MAX);
            j.r[j.n++] = (mm_req){&w->part[p], y + w->off[p], w->rows};
        }
    }
    ST_ASSERT(!swiglu || (n == 2 && j.n == 2));
    mm_run(c, &j);
}

/* ---------------------------------------------------------------------------------------- */
/* embedding, residual add + norm, logits, reads */

static void cpu_embed(st_bctx *base) {
    cpu_ctx *c = (cpu_ctx *)base;
    const int64_t d = c->z->d;
    for (int64_t t = 0; t < c->T; t++) st_matrix_row_f32(c->b->embed, c->plan->tokens[t], c->x + t * d);
}

typedef struct tok_job {
    cpu_ctx *c;
    const float *w; /* norm weight */
    int mode;       /* ST_NORM_* */
} tok_job;

static void add_norm_range(cpu_ctx *c, int64_t t0, int64_t t1, const float *w, int mode) {
    const int64_t d = c->z->d;
    const float eps = c->z->eps;
    for (int64_t t = t0; t < t1; t++) {
        float *x = c->x + t * d;
        if (mode & ST_NORM_ADD) {
            const float *o = c->out + t * d;
            for (int64_t e = 0; e < d; e++) x[e] += o[e];
        }
        if (mode & ST_NORM_APPLY) rmsnorm(x, w, d, eps, c->xn + t * d);
    }
}

static void tok_job_fn(void *ctx, int tid, int nth) {
    tok_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->c->T, nth, tid, 1, &lo, &hi);
    add_norm_range(j->c, lo, hi, j->w, j->mode);
}

static void cpu_add_norm(st_bctx *base, int layer, st_norm which, int mode) {
    cpu_ctx *c = (cpu_ctx *)base;
    const float *w = which == ST_NORM_FINAL ? c->b->final_norm
                     : which == ST_NORM_INPUT ? c->b->layers[layer].input_norm
                                              : c->b->layers[layer].post_norm;
    if (tok_serial(c)) {
        add_norm_range(c, 0, c->T, w, mode);
        return;
    }
    tok_job j = {c, w, mode};
    par_run(c, c->T * c->z->d * 4, tok_job_fn, &j);
}

static void cpu_logits(st_bctx *base, float *out) {
    cpu_ctx *c = (cpu_ctx *)base;
    const st_step_plan *pl = c->plan;
    const int64_t d = c->z->d;
    int64_t rows = 0;
    for (int i = 0; i < pl->n_items; i++) {
        const int64_t t = item_t0(c, i), n = item_len(c, i);
        if (pl->logits[i] == ST_LOGITS_ALL) {
            memcpy(c->gath + rows * d, c->xn + t * d, (size_t)(n * d) * sizeof(float));
            rows += n;
        } else if (pl->logits[i] == ST_LOGITS_LAST || pl->logits[i] == ST_LOGITS_LAST_TOP) {
            memcpy(c->gath + rows * d, c->xn + (t + n - 1) * d, (size_t)d * sizeof(float));
            rows++;
        }
    }
    if (c->b->base.shard.world == 1) {
        if (rows && out) mm(c, &c->b->lm_head, c->gath, d, rows, out, c->z->V);
        return;
    }
    /* a shard: its vocabulary slice of LOGIT_ROWS rows at a time, gathered from every rank */
    const st_shard *sh = &c->b->base.shard;
    const int64_t V = c->z->V, W = c->z->Vmax;
    st_cpu_group *g = c->group;
    for (int64_t r0 = 0; r0 < rows; r0 += LOGIT_ROWS) {
        const int64_t nr = rows - r0 < LOGIT_ROWS ? rows - r0 : LOGIT_ROWS;
        mm(c, &c->b->lm_head, c->gath + r0 * d, d, nr, c->lg_part, W);
        const float *src[ST_POOL_MAX_THREADS];
        if (g) { /* in-process ranks: read each other's slices between two barriers */
            g->bufs[c->rank] = c->lg_part;
            pthread_barrier_wait(&g->bar);
            for (int k = 0; k < sh->world; k++) src[k] = g->bufs[k];
        } else if (!c->b->base.comm || c->b->base.comm->world == 1) { /* a shard on its own: its slice */
            for (int64_t r = 0; out && r < nr; r++)
                memcpy(out + (r0 + r) * V + sh->vocab0, c->lg_part + r * W, (size_t)sh->vocab * sizeof(float));
            continue;
        } else {
            if (c->comm_err.status ||
                st_comm_allgather(c->b->base.comm, c->lg_part, (size_t)(nr * W) * sizeof(float), c->lg_all,
                                  &c->comm_err) != ST_OK)
                return; /* step_end reports it */
            for (int k = 0; k < sh->world; k++) src[k] = c->lg_all + (int64_t)k * nr * W;
        }
        for (int k = 0; out && k < sh->world; k++) {
            int64_t v0, nv;
            st_shard_vocab(V, sh->world, k, &v0, &nv);
            for (int64_t r = 0; r < nr; r++)
                memcpy(out + (r0 + r) * V + v0, src[k] + r * W, (size_t)nv * sizeof(float));
        }
        if (g) pthread_barrier_wait(&g->bar);
    }
}

/* floats per row a buffer holds */
static int64_t act_width(const cpu_ctx *c, st_act a) {
    const cpu_dims *z = c->z;
    switch (a) {
    case ST_ACT_P1: return z->w1;
    case ST_ACT_P2: return z->w2;
    case ST_ACT_P3: return z->w3;
    case ST_ACT_P4: return z->Hv;
    case ST_ACT_MIX: return z->wm;
    default: return z->d;
    }
}

static void cpu_read(st_bctx *base, st_act a, int64_t width, float *out) {
    cpu_ctx *c = (cpu_ctx *)base;
    ST_ASSERT(width >= 0 && width <= act_width(c, a));
    memcpy(out, act(c, a), (size_t)(c->T * width) * sizeof(float));
}

static void cpu_write(st_bctx *base, st_act a, int64_t width, const float *in) {
    cpu_ctx *c = (cpu_ctx *)base;
    ST_ASSERT(width >= 0 && width <= act_width(c, a));
    memcpy(act(c, a), in, (size_t)(c->T * width) * sizeof(float));
}

/* The group's ranks meet; each sums every rank's buffer in rank order (so all get the same
 * bits), they meet again, and each takes the sum. */
static void cpu_allreduce(st_bctx *base, st_act a) {
    cpu_ctx *c = (cpu_ctx *)base;
    st_cpu_group *g = c->group;
    float *buf = act(c, a);
    const int64_t n = c->T * c->z->d;
    if (!g && c->comm_buf) { /* a rank of a job: the communicator's sum, in the same order */
        if (!c->comm_err.status) st_comm_allreduce_sum(c->b->base.comm, buf, n, c->comm_buf, &c->comm_err);
        return;
    }
    if (!g || g->world == 1) return;
    g->bufs[c->rank] = buf;
    pthread_barrier_wait(&g->bar);
    for (int64_t e = 0; e < n; e++) {
        float s = g->bufs[0][e];
        for (int r = 1; r < g->world; r++) s += g->bufs[r][e];
        c->gath[e] = s;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(buf, c->gath, (size_t)n * sizeof(float));
}

/* ---------------------------------------------------------------------------------------- */
/* Gated DeltaNet */

typedef struct gdn_job {
    cpu_ctx *c;
    const cpu_layer *L;
    int64_t n_tasks; /* n_items * Hk; task = item * Hk + local key head */
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

/* item it, local key head g: its channels' conv, the norms, and its value heads */
static void gdn_task(cpu_ctx *c, cpu_thread *th, const cpu_layer *L, int it, int g) {
    const cpu_dims *z = c->z;
    const st_kernels *k = c->k;
    const int64_t cd = z->cd, kd = z->kd, vd = z->vd;
    const int K = z->K, Hv = z->Hv, Dk = z->Dk, Dv = z->Dv;
    const float qscale = 1.0f / sqrtf((float)Dk);
    const int64_t t0 = item_t0(c, it), n = item_len(c, it), pos0 = item_pos0(c, it);
    int va, vb;
    key_values(z, g, &va, &vb);
    float *qkv = c->p1, *zz = c->p2, *bb = c->p3, *aa = c->p4, *tmp = th->tmp;
    float *cs = conv_state(c, it, L->kind_index); /* [K-1][cd] */
    float *S = rec_state(c, it, L->kind_index);   /* [Hv][Dv][Dk] */
    const int64_t rng[3][2] = {{(int64_t)g * Dk, Dk},
                               {kd + (int64_t)g * Dk, Dk},
                               {2 * kd + (int64_t)va * Dv, (int64_t)(vb - va) * Dv}};
    /* causal depthwise conv + SiLU of this task's channels, token by token */
    const float *ct = L->conv_t;
    for (int64_t i = 0; i < n; i++) {
        float *mrow = qkv + (t0 + i) * cd;
        for (int r = 0; r < 3; r++) {
            const int64_t c0 = rng[r][0], len = rng[r][1];
            k->conv_silu(ct + c0, cd, K, cs + c0, cd, mrow + c0, tmp, len);
            memcpy(mrow + c0, tmp, (size_t)len * sizeof(float));
        }
        l2norm_scale(mrow + (int64_t)g * Dk, Dk, qscale);
        l2norm_scale(mrow + kd + (int64_t)g * Dk, Dk, 1.0f);
    }
    for (int h = va; h < vb; h++) {
        float *Sh = S + (size_t)h * Dv * Dk;
        float *beta = th->gates, *gam = th->gates + n;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = t0 + i;
            beta[i] = sigmoid(bb[t * Hv + h]);
            gam[i] = L->neg_exp_a[h] * softplus(aa[t * Hv + h] + L->dt_bias[h]);
        }
        const float *q0 = qkv + t0 * cd + (int64_t)g * Dk, *k0 = q0 + kd;
        const float *v0 = qkv + t0 * cd + 2 * kd + (int64_t)h * Dv;
        float *o0 = c->mix + t0 * vd + (int64_t)h * Dv;
        for (int64_t i = 0; i < n;) {
            const int64_t pos = pos0 + i;
            if (c->b->gdn_chunked && pos % GDN_C == 0 && n - i >= GDN_C) {
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
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = t0 + i;
            float *o = o0 + i * vd, *zh = zz + t * vd + (int64_t)h * Dv;
            float ss = 0.0f;
            for (int r = 0; r < Dv; r++) ss += o[r] * o[r];
            float rs = 1.0f / sqrtf(ss / (float)Dv + z->eps);
            k->silu_mul(zh, NULL, Dv);
            for (int r = 0; r < Dv; r++) o[r] = o[r] * rs * L->gdn_norm[r] * zh[r];
        }
    }
}

static void gdn_job_fn(void *ctx, int tid, int nth) {
    gdn_job *j = ctx;
    cpu_ctx *c = j->c;
    const int Hk = c->z->Hk;
    int64_t lo, hi;
    tasks_begin(c, tid, nth, j->n_tasks, &lo, &hi);
    for (int64_t task = lo; task < hi; task++)
        gdn_task(c, &c->th[tid], j->L, (int)(task / Hk), (int)(task % Hk));
    tasks_end(c, tid, lo, hi);
}

static void cpu_gdn(st_bctx *base, int layer) {
    cpu_ctx *c = (cpu_ctx *)base;
    const cpu_layer *L = &c->b->layers[layer];
    const cpu_dims *z = c->z;
    /* tasks (item, key head), weighted by the item's tokens */
    int64_t nt = 0;
    c->task_w[0] = 0;
    for (int it = 0; it < c->plan->n_items; it++)
        for (int g = 0; g < z->Hk; g++, nt++) c->task_w[nt + 1] = c->task_w[nt] + item_len(c, it);
    gdn_job j = {c, L, nt};
    if (par_run(c, c->T * z->Hv * z->Dk * z->Dv * 2, gdn_job_fn, &j))
        st_balance_update(&c->task_bal, c->run_work, c->run_s);
}

/* ---------------------------------------------------------------------------------------- */
/* gated full attention */

/* cos/sin of the rotary angles of token row t at position pos (M-RoPE: the plan's t, h, w
 * positions, each frequency on its axis) */
static void rope_angles(const cpu_ctx *c, cpu_thread *th, int64_t pos, int64_t t) {
    const int half = c->z->rope_dim / 2;
    const int32_t *m3 = c->plan->mrope ? c->plan->mrope + t * 3 : NULL;
    for (int i = 0; i < half; i++) {
        float a = (float)(m3 ? (int64_t)m3[c->b->rope_axis[i]] : pos) * c->b->inv_freq[i];
        th->rope_cos[i] = cosf(a);
        th->rope_sin[i] = sinf(a);
    }
}

/* half-split rotation of the first rope_dim dims of x */
static void rope_apply(const cpu_ctx *c, const cpu_thread *th, float *x) {
    const int half = c->z->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * th->rope_cos[i] - b * th->rope_sin[i];
        x[i + half] = b * th->rope_cos[i] + a * th->rope_sin[i];
    }
}

static inline void kv_store(const cpu_ctx *c, void *dst, const float *src, int n) {
    if (c->p.kv_dtype == ST_KV_BF16) {
        uint16_t *d = dst;
        for (int i = 0; i < n; i++) d[i] = st_f32_to_bf16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

typedef struct att_job {
    cpu_ctx *c;
    const cpu_layer *L;
    int64_t n_tasks;
    int tq;            /* query tokens per task (non-split mode) */
} att_job;

/* q/k norm, RoPE, and K/V of tokens [t0, t1) into the pool */
static void att_prep_range(cpu_ctx *c, cpu_thread *th, const cpu_layer *L, int64_t t0, int64_t t1) {
    const cpu_dims *z = c->z;
    const int nh = z->nh, nkv = z->nkv, hd = z->hd, li = L->kind_index;
    int it = 0;
    for (int64_t t = t0; t < t1; t++) {
        while (item_t0(c, it + 1) <= t) it++;
        const int64_t pos = item_pos0(c, it) + (t - item_t0(c, it));
        rope_angles(c, th, pos, t);
        for (int j = 0; j < nh; j++) {
            float *q = c->p1 + t * 2 * nh * hd + (int64_t)j * 2 * hd;
            rmsnorm(q, L->q_norm, hd, z->eps, q);
            rope_apply(c, th, q);
        }
        for (int h = 0; h < nkv; h++) {
            float *kv = c->p2 + t * nkv * hd + (int64_t)h * hd;
            rmsnorm(kv, L->k_norm, hd, z->eps, kv);
            rope_apply(c, th, kv);
            kv_store(c, kv_ptr(c, it, li, 0, h, pos), kv, hd);
            kv_store(c, kv_ptr(c, it, li, 1, h, pos), c->p3 + t * nkv * hd + (int64_t)h * hd, hd);
        }
    }
}

static void att_prep_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    int64_t lo, hi;
    st_split_range(j->c->T, nth, tid, 1, &lo, &hi);
    att_prep_range(j->c, &j->c->th[tid], j->L, lo, hi);
}

static void cpu_attn_prep(st_bctx *base, int layer) {
    cpu_ctx *c = (cpu_ctx *)base;
    att_job j = {.c = c, .L = &c->b->layers[layer]};
    if (tok_serial(c)) att_prep_range(c, &c->th[0], j.L, 0, c->T);
    else par_run(c, c->T * (c->z->nh + c->z->nkv) * c->z->hd * 4, att_prep_fn, &j);
}

/* The partial of chunk [c0, c1) for nq queries (th->att_q, positions th->att_pos) of one
 * item and KV head: per query the chunk max mc, sum lc and weighted V oc (empty when the
 * query's position is below c0: mc = -inf). */
/* the largest of x[0..n), n >= 1 (eight running maxima, then theirs: the same on every path) */
static float row_max(const float *x, int64_t n) {
    float m8[8];
    for (int u = 0; u < 8; u++) m8[u] = x[0];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) m8[u] = x[i + u] > m8[u] ? x[i + u] : m8[u];
    float mx = m8[0];
    for (int u = 1; u < 8; u++) mx = m8[u] > mx ? m8[u] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static void att_partial(cpu_ctx *c, cpu_thread *th, int li, int it, int h, int nq, int64_t c0,
                        int64_t c1, float *mc, float *lc, float *oc, int64_t ldo) {
    const st_kernels *k = c->k;
    const int hd = c->z->hd, bs = c->p.block_size;
    const int bf = c->p.kv_dtype == ST_KV_BF16;
    int64_t maxpos = -1;
    for (int q = 0; q < nq; q++) maxpos = max64(maxpos, th->att_pos[q]);
    const int64_t end = min64(c1, maxpos + 1);
    float *s = th->att_s;
    /* scores of all queries against the chunk's positions, block segment by segment */
    for (int64_t p = c0; p < end;) {
        const int64_t seg = min64(end, (p / bs + 1) * bs) - p;
        st_matrix kb = {.fmt = bf ? ST_WFMT_BF16 : ST_WFMT_F32, .rows = seg, .cols = hd,
                        .data = kv_ptr(c, it, li, 0, h, p)};
        k->matmul(&kb, th->att_q, hd, nq, s + (p - c0), ATT_CHUNK, 0, seg, th->mm);
        p += seg;
    }
    /* per query: max, exp, sum; then the weighted sum of V rows (every output a chain over the
     * positions in order, so the queries go together when they all see the whole range) */
    int64_t common = -1;
    for (int q = 0; q < nq; q++) {
        float *oq = oc + q * ldo;
        memset(oq, 0, (size_t)hd * sizeof(float));
        const int64_t len = min64(c1, th->att_pos[q] + 1) - c0;
        common = q == 0 ? len : common == len ? len : -1;
        if (len <= 0) {
            mc[q] = -INFINITY;
            lc[q] = 0.0f;
            continue;
        }
        float *sq = s + (int64_t)q * ATT_CHUNK;
        mc[q] = row_max(sq, len);
        lc[q] = k->exp_sum(sq, len, mc[q]);
    }
    if (common > 0 && nq > 1) {
        for (int64_t p = c0; p < c0 + common;) {
            const int64_t seg = min64(c0 + common, (p / bs + 1) * bs) - p;
            k->accum_rows(kv_ptr(c, it, li, 1, h, p), bf, hd, seg, s + (p - c0), ATT_CHUNK, nq, oc, ldo, hd);
            p += seg;
        }
        return;
    }
    for (int q = 0; q < nq; q++) {
        float *oq = oc + q * ldo;
        const int64_t len = min64(c1, th->att_pos[q] + 1) - c0;
        float *sq = s + (int64_t)q * ATT_CHUNK;
        for (int64_t p = c0; p < c0 + len;) {
            const int64_t seg = min64(c0 + len, (p / bs + 1) * bs) - p;
            k->accum_rows(kv_ptr(c, it, li, 1, h, p), bf, hd, seg, sq + (p - c0), ATT_CHUNK, 1,
                          oq, hd, hd);
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

/* out = o / l * sigmoid(gate) into mix: token row t, local query head j */
static void att_finish(cpu_ctx *c, int64_t t, int j, const float *o, float l) {
    const int nh = c->z->nh, hd = c->z->hd;
    const float *gate = c->p1 + t * 2 * nh * hd + (int64_t)j * 2 * hd + hd;
    float *dst = c->mix + t * nh * hd + (int64_t)j * hd;
    const float inv = 1.0f / l;
    for (int e = 0; e < hd; e++) dst[e] = o[e] * inv * sigmoid(gate[e]);
}

/* task = (item, KV head, tile of tq tokens): queries = tile tokens x the heads reading it */
typedef struct att_task {
    int it, h;
    int64_t i0, n; /* tokens [i0, i0+n) of the item */
} att_task;

static att_task att_task_at(const att_job *j, int64_t task) {
    /* tasks are enumerated item by item, KV head by head, tile by tile */
    const cpu_ctx *c = j->c;
    const int nkv = c->z->nkv;
    att_task a = {0, 0, 0, 0};
    for (int it = 0; it < c->plan->n_items; it++) {
        const int64_t n = item_len(c, it), tiles = (n + j->tq - 1) / j->tq;
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
static int att_load_queries(cpu_ctx *c, cpu_thread *th, att_task a) {
    const int nh = c->z->nh, hd = c->z->hd;
    const float scale = 1.0f / sqrtf((float)hd);
    int qa, qb;
    kv_queries(c->z, a.h, &qa, &qb);
    int nq = 0;
    for (int64_t i = a.i0; i < a.i0 + a.n; i++) {
        const int64_t t = item_t0(c, a.it) + i;
        for (int jj = qa; jj < qb; jj++, nq++) {
            const float *q = c->p1 + t * 2 * nh * hd + (int64_t)jj * 2 * hd;
            for (int e = 0; e < hd; e++) th->att_q[nq * hd + e] = q[e] * scale;
            th->att_pos[nq] = item_pos0(c, a.it) + i;
        }
    }
    return nq;
}

static void att_task_run(cpu_ctx *c, cpu_thread *th, const att_job *j, att_task a) {
    const int hd = c->z->hd;
    int qa, qb;
    kv_queries(c->z, a.h, &qa, &qb);
    const int per = qb - qa;
    const int nq = att_load_queries(c, th, a);
    const int64_t last = item_pos0(c, a.it) + a.i0 + a.n - 1;
    const int qm = c->att_qmax;
    float *m = th->att_m, *l = m + qm, *mc = l + qm, *lc = mc + qm;
    for (int q = 0; q < nq; q++) m[q] = -INFINITY, l[q] = 0.0f;
    for (int64_t c0 = 0; c0 <= last; c0 += ATT_CHUNK) {
        att_partial(c, th, j->L->kind_index, a.it, a.h, nq, c0, c0 + ATT_CHUNK, mc, lc, th->att_oc, hd);
        for (int q = 0; q < nq; q++)
            att_merge(&m[q], &l[q], th->att_o + q * hd, mc[q], lc[q], th->att_oc + q * hd, hd);
    }
    for (int q = 0; q < nq; q++)
        att_finish(c, item_t0(c, a.it) + a.i0 + q / per, qa + q % per, th->att_o + q * hd, l[q]);
}

static void att_job_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    int64_t lo, hi;
    tasks_begin(j->c, tid, nth, j->n_tasks, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) att_task_run(j->c, &j->c->th[tid], j, att_task_at(j, task));
    tasks_end(j->c, tid, lo, hi);
}

/* split mode: decode tokens only (one token per item); partial slot of (item, local query
 * head q, chunk) */
static float *part_at(const cpu_ctx *c, int64_t it, int q, int64_t ch) {
    return c->part + (((size_t)it * (size_t)c->z->nh + (size_t)q) * (size_t)c->part_chunks +
                      (size_t)ch) * (size_t)(c->z->hd + 2);
}

/* phase 1 task = (item, KV head, chunk) over the flattened list; weights by chunk length */
static void att_split1_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    cpu_ctx *c = j->c;
    cpu_thread *th = &c->th[tid];
    const int nkv = c->z->nkv, hd = c->z->hd;
    int64_t lo, hi;
    split_weighted(&c->task_bal, c->task_w, j->n_tasks, nth, tid, &lo, &hi);
    float *mc = th->att_m, *lc = mc + c->att_qmax;
    for (int64_t task = lo; task < hi; task++) {
        /* decode: every item has one token; chunks per item = ceil((pos+1)/ATT_CHUNK) */
        int64_t rest = task;
        int it = 0;
        int64_t nch = 0;
        for (;; it++) {
            nch = (item_pos0(c, it) + ATT_CHUNK) / ATT_CHUNK;
            if (rest < nch * nkv) break;
            rest -= nch * nkv;
        }
        att_task a = {it, (int)(rest / nch), 0, 1};
        const int64_t ch = rest % nch;
        int qa, qb;
        kv_queries(c->z, a.h, &qa, &qb);
        const int nq = att_load_queries(c, th, a);
        att_partial(c, th, j->L->kind_index, it, a.h, nq, ch * ATT_CHUNK, (ch + 1) * ATT_CHUNK, mc,
                    lc, th->att_oc, hd);
        for (int q = 0; q < nq; q++) {
            float *pp = part_at(c, it, qa + q, ch);
            pp[0] = mc[q];
            pp[1] = lc[q];
            memcpy(pp + 2, th->att_oc + q * hd, (size_t)hd * sizeof(float));
        }
    }
}

/* phase 2: (item, query head) merges its chunks in order */
static void att_split2_fn(void *ctx, int tid, int nth) {
    att_job *j = ctx;
    cpu_ctx *c = j->c;
    cpu_thread *th = &c->th[tid];
    const int nh = c->z->nh, hd = c->z->hd;
    int64_t lo, hi;
    st_split_range((int64_t)c->plan->n_items * nh, nth, tid, 1, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) {
        const int it = (int)(task / nh), q = (int)(task % nh);
        const int64_t nch = (item_pos0(c, it) + ATT_CHUNK) / ATT_CHUNK;
        float m = -INFINITY, l = 0.0f, *o = th->att_o;
        for (int64_t ch = 0; ch < nch; ch++) {
            const float *pp = part_at(c, it, q, ch);
            att_merge(&m, &l, o, pp[0], pp[1], pp + 2, hd);
        }
        att_finish(c, item_t0(c, it), q, o, l);
    }
}

static void cpu_attention(st_bctx *base, int layer) {
    cpu_ctx *c = (cpu_ctx *)base;
    const cpu_dims *z = c->z;
    const int n_items = c->plan->n_items;
    const int64_t T = c->T;
    const int nh = z->nh, nkv = z->nkv, hd = z->hd, grp = z->grp;
    att_job j = {.c = c, .L = &c->b->layers[layer]};
    /* split mode: decode only, few tasks, long enough contexts */
    int split = c->part && T == n_items && T <= SPLIT_TOK && (int64_t)n_items * nkv < c->n_threads;
    int64_t nt = 0;
    if (split) {
        int64_t chunks = 0;
        c->task_w[0] = 0;
        for (int it = 0; it < n_items; it++) {
            const int64_t np = item_pos0(c, it) + 1, nch = (np + ATT_CHUNK - 1) / ATT_CHUNK;
            chunks += nch;
            for (int h = 0; h < nkv; h++)
                for (int64_t ch = 0; ch < nch; ch++, nt++)
                    c->task_w[nt + 1] = c->task_w[nt] + min64(ATT_CHUNK, np - ch * ATT_CHUNK);
        }
        split = chunks > n_items; /* some item spans two chunks or more */
    }
    if (split) {
        j.n_tasks = nt;
        const int64_t work = c->task_w[nt] * grp * hd * 2;
        par_run(c, work, att_split1_fn, &j);
        par_run(c, work, att_split2_fn, &j);
        return;
    }
    j.tq = c->att_qmax / grp; /* >= 1: att_qmax >= grp */
    nt = 0;
    c->task_w[0] = 0;
    for (int it = 0; it < n_items; it++) {
        const int64_t n = item_len(c, it), tiles = (n + j.tq - 1) / j.tq;
        for (int h = 0; h < nkv; h++)
            for (int64_t ti = 0; ti < tiles; ti++, nt++) {
                const int64_t nn = min64(j.tq, n - ti * j.tq);
                /* cost ~ queries x context */
                c->task_w[nt + 1] = c->task_w[nt] + nn * (item_pos0(c, it) + ti * j.tq + nn);
            }
    }
    j.n_tasks = nt;
    if (par_run(c, c->task_w[nt] * (nkv ? nh / nkv : 0) * hd * 2, att_job_fn, &j))
        st_balance_update(&c->task_bal, c->run_work, c->run_s);
}

/* ---------------------------------------------------------------------------------------- */
/* MoE */

static void swiglu(cpu_ctx *c, const st_matrix *gate, const st_matrix *up, const st_matrix *down,
                   const float *x, int64_t n, float *y) {
    const int64_t d = c->z->d, I = gate->rows;
    mm_job j = {.c = c, .x = x, .ldx = d, .n_tok = n, .n = 2, .swiglu = 1};
    j.r[0] = (mm_req){gate, c->p1, I};
    j.r[1] = (mm_req){up, c->p2, I};
    mm_run(c, &j);
    mm(c, down, c->p1, I, n, y, d);
}

static void cpu_moe(st_bctx *base, int layer) {
    cpu_ctx *c = (cpu_ctx *)base;
    const cpu_layer *L = &c->b->layers[layer];
    const cpu_dims *z = c->z;
    const int64_t d = z->d, T = c->T;
    const int E = z->E, k = z->topk;
    mm(c, &L->router, c->xn, d, T, c->router, E);
    for (int64_t t = 0; t < T; t++)
        st_moe_route(c->router + t * E, E, k, z->norm_topk, c->moe_sel + t * k, c->moe_w + t * k);
    memset(c->out, 0, (size_t)(T * d) * sizeof(float));
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int s = 0; s < k; s++)
                if (c->moe_sel[t * k + s] == e) {
                    c->moe_list[n] = (int32_t)t;
                    c->moe_lw[n] = c->moe_w[t * k + s];
                    memcpy(c->gath + n * d, c->xn + t * d, (size_t)d * sizeof(float));
                    n++;
                }
        if (!n) continue;
        swiglu(c, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->gath, n, c->gout);
        for (int64_t i = 0; i < n; i++) {
            float *o = c->out + (int64_t)c->moe_list[i] * d;
            const float *g = c->gout + i * d;
            for (int64_t jj = 0; jj < d; jj++) o[jj] += c->moe_lw[i] * g[jj];
        }
    }
    if (L->has_shared) {
        swiglu(c, &L->sh_gate, &L->sh_up, &L->sh_down, c->xn, T, c->gout);
        mm(c, &L->sh_egate, c->xn, d, T, c->moe_lw, 1);
        for (int64_t t = 0; t < T; t++) {
            float g = sigmoid(c->moe_lw[t]);
            for (int64_t jj = 0; jj < d; jj++) c->out[t * d + jj] += g * c->gout[t * d + jj];
        }
    }
}

/* ---------------------------------------------------------------------------------------- */

static const st_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .ctx_create = cpu_ctx_create,
    .ctx_destroy = cpu_ctx_destroy,
    .ctx_bytes = cpu_ctx_bytes,
    .ctx_plan = cpu_ctx_plan,
    .step_begin = cpu_step_begin,
    .embed = cpu_embed,
    .add_norm = cpu_add_norm,
    .matmul = cpu_matmul,
    .gdn = cpu_gdn,
    .attn_prep = cpu_attn_prep,
    .attention = cpu_attention,
    .moe = cpu_moe,
    .allreduce = cpu_allreduce,
    .logits = cpu_logits,
    .read = cpu_read,
    .write = cpu_write,
    .step_end = cpu_step_end,
    .state_copy = cpu_state_copy,
    .kv_copy = cpu_kv_copy,
};

void st_cpu_ctx_plan(const st_model *m, int n_threads, const st_ctx_params *p, st_ctx_plan *out) {
    cpu_backend b;
    memset(&b, 0, sizeof b);
    b.base.ops = &cpu_ops;
    b.base.m = m;
    st_shard whole;
    if (st_shard_make(m, 0, 1, &whole, NULL) != ST_OK) memset(&whole, 0, sizeof whole);
    b.base.shard = whole;
    b.z = dims_of(m, &whole);
    b.n_threads = n_threads > 0 ? n_threads : st_default_threads();
    cpu_ctx_plan(&b.base, p, out);
}
