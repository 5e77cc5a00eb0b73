/* ==== Forward pass over a ragged batch (see forward.h and spec/text-model.md section 4) ==== */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/numeric.h"

struct st_fwd {
    const st_model *m;
    st_cache *cache;          /* borrowed */
    const st_kernels *k;      /* borrowed, static */
    int max_tokens;
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
    float *row;     /* [max cols] matmul scratch */
    float *tmp;     /* [max(conv_dim, hd)] */
    float *scores;  /* [max_seq_len] attention scores */
    float *rope_cos, *rope_sin; /* [rope_dim/2] */
    float *inv_freq;            /* [rope_dim/2] */
    st_hidden_hook hook;
    void *hook_user;
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

void st_fwd_destroy(st_fwd *f) {
    if (!f) return;
    float *bufs[] = {f->x,      f->xn,  f->out,    f->p1,     f->p2,       f->p3,
                     f->p4,     f->mix, f->gath,   f->gout,   f->router,   f->moe_w,
                     f->moe_lw, f->row, f->tmp,    f->scores, f->rope_cos, f->rope_sin,
                     f->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(f->moe_sel);
    free(f->moe_list);
    free(f);
}

static float *falloc(st_fwd *f, int64_t n, int *fail) {
    if (n < 1) n = 1;
    float *p = calloc((size_t)n, sizeof(float));
    if (!p) *fail = 1;
    f->scratch_bytes += (size_t)n * sizeof(float);
    return p;
}

st_status st_fwd_create(const st_model *m, st_cache *cache, int max_tokens,
                        const st_kernels *kernels, st_fwd **out, st_error *err) {
    *out = NULL;
    if (max_tokens < 1 || max_tokens > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "max_tokens must be in [1, 2^20]");
    st_fwd *f = calloc(1, sizeof *f);
    if (!f) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const st_config *c = &m->cfg;
    f->m = m;
    f->cache = cache;
    f->k = kernels ? kernels : st_kernels_ref();
    f->max_tokens = max_tokens;
    int64_t T = max_tokens, d = c->hidden_size;
    int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    int64_t cd = st_config_conv_dim(c), vd = st_config_value_dim(c), hv = c->lin_n_value_heads;
    int64_t I = max64(c->intermediate_size,
                      max64(c->moe_intermediate_size, c->shared_expert_intermediate_size));
    int64_t w1 = max64(max64(cd, 2 * nh * hd), I);
    int64_t w2 = max64(max64(vd, nkv * hd), I);
    int64_t w3 = max64(hv, nkv * hd);
    int64_t wm = max64(vd, nh * hd);
    int64_t maxcols = max64(max64(d, I), max64(vd, nh * hd));
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
    f->row = falloc(f, maxcols, &fail);
    f->tmp = falloc(f, max64(cd, hd), &fail);
    f->scores = falloc(f, cache->p.max_seq_len, &fail);
    f->rope_cos = falloc(f, c->rope_dim / 2, &fail);
    f->rope_sin = falloc(f, c->rope_dim / 2, &fail);
    f->inv_freq = falloc(f, c->rope_dim / 2, &fail);
    if (c->is_moe) {
        f->router = falloc(f, T * c->n_experts, &fail);
        f->moe_w = falloc(f, T * c->n_experts_per_tok, &fail);
        f->moe_lw = falloc(f, T, &fail);
        f->moe_sel = calloc((size_t)(T * c->n_experts_per_tok), sizeof *f->moe_sel);
        f->moe_list = calloc((size_t)T, sizeof *f->moe_list);
        fail |= !f->moe_sel || !f->moe_list;
    }
    if (fail) {
        st_fwd_destroy(f);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory planning scratch for %d tokens",
                            max_tokens);
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

int64_t st_fwd_logit_rows(const st_batch_item *items, int n_items) {
    int64_t n = 0;
    for (int i = 0; i < n_items; i++)
        n += items[i].logits == ST_LOGITS_ALL ? items[i].n_tokens : items[i].logits == ST_LOGITS_LAST;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* small ops */

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
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

static void mm(st_fwd *f, const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
               float *y, int64_t ldy) {
    f->k->matmul(w, x, ldx, n_tok, y, ldy, 0, w->rows, f->row);
}

/* cos/sin of the rotary angles at position pos */
static void rope_angles(st_fwd *f, int64_t pos) {
    int half = f->m->cfg.rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = (float)pos * f->inv_freq[i];
        f->rope_cos[i] = cosf(a);
        f->rope_sin[i] = sinf(a);
    }
}

/* half-split rotation of the first rope_dim dims of x */
static void rope_apply(const st_fwd *f, float *x) {
    int half = f->m->cfg.rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * f->rope_cos[i] - b * f->rope_sin[i];
        x[i + half] = b * f->rope_cos[i] + a * f->rope_sin[i];
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

static inline float kv_dot(const st_cache *c, const void *k, const float *q, int n) {
    float acc = 0.0f;
    if (c->p.kv_dtype == ST_KV_BF16) {
        const uint16_t *kk = k;
        for (int i = 0; i < n; i++) acc += st_bf16_to_f32(kk[i]) * q[i];
    } else {
        const float *kk = k;
        for (int i = 0; i < n; i++) acc += kk[i] * q[i];
    }
    return acc;
}

static inline void kv_axpy(const st_cache *c, float a, const void *v, float *y, int n) {
    if (c->p.kv_dtype == ST_KV_BF16) {
        const uint16_t *vv = v;
        for (int i = 0; i < n; i++) y[i] += a * st_bf16_to_f32(vv[i]);
    } else {
        const float *vv = v;
        for (int i = 0; i < n; i++) y[i] += a * vv[i];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Gated DeltaNet */

static void gdn_layer(st_fwd *f, const st_layer *L, const st_batch_item *items, int n_items,
                      int64_t T) {
    const st_config *c = &f->m->cfg;
    const st_cache *cache = f->cache;
    const int64_t d = c->hidden_size, cd = st_config_conv_dim(c), kd = st_config_key_dim(c);
    const int64_t vd = st_config_value_dim(c);
    const int K = c->conv_kernel, Hv = c->lin_n_value_heads, Hk = c->lin_n_key_heads;
    const int Dk = c->lin_key_head_dim, Dv = c->lin_value_head_dim, rep = Hv / Hk;
    const float qscale = 1.0f / sqrtf((float)Dk);
    float *qkv = f->p1, *z = f->p2, *bb = f->p3, *aa = f->p4, *tmp = f->tmp;
    mm(f, &L->in_qkv, f->xn, d, T, qkv, cd);
    mm(f, &L->in_z, f->xn, d, T, z, vd);
    mm(f, &L->in_b, f->xn, d, T, bb, Hv);
    mm(f, &L->in_a, f->xn, d, T, aa, Hv);
    int64_t t = 0;
    for (int it = 0; it < n_items; it++) {
        const st_seq *seq = items[it].seq;
        float *cs = st_cache_conv_state(cache, seq->slot, L->kind_index); /* [K-1][cd] */
        float *S = st_cache_rec_state(cache, seq->slot, L->kind_index);   /* [Hv][Dv][Dk] */
        for (int i = 0; i < items[it].n_tokens; i++, t++) {
            float *mrow = qkv + t * cd;
            /* causal depthwise conv over (state rows, this token); tap K-1 = this token */
            for (int64_t ch = 0; ch < cd; ch++) {
                const float *w = L->conv_w + ch * K;
                float acc = 0.0f;
                for (int j = 0; j < K - 1; j++) acc += w[j] * cs[j * cd + ch];
                tmp[ch] = acc + w[K - 1] * mrow[ch];
            }
            if (K > 1) {
                memmove(cs, cs + cd, (size_t)((K - 2) * cd) * sizeof(float));
                memcpy(cs + (K - 2) * cd, mrow, (size_t)cd * sizeof(float));
            }
            for (int64_t ch = 0; ch < cd; ch++) mrow[ch] = silu(tmp[ch]);
            float *q = mrow, *k = mrow + kd, *v = mrow + 2 * kd;
            for (int g = 0; g < Hk; g++) {
                l2norm_scale(q + g * Dk, Dk, qscale);
                l2norm_scale(k + g * Dk, Dk, 1.0f);
            }
            for (int h = 0; h < Hv; h++) {
                const float *kh = k + (h / rep) * Dk, *qh = q + (h / rep) * Dk;
                const float *vh = v + h * Dv;
                float beta = sigmoid(bb[t * Hv + h]);
                float alpha = expf(L->neg_exp_a[h] * softplus(aa[t * Hv + h] + L->dt_bias[h]));
                float *Sh = S + (size_t)h * Dv * Dk;
                float *o = f->mix + t * vd + h * Dv;
                /* rows of S are independent: decay, predict, correct, read */
                for (int r = 0; r < Dv; r++) {
                    float *row = Sh + (size_t)r * Dk;
                    float e = 0.0f;
                    for (int j = 0; j < Dk; j++) {
                        row[j] *= alpha;
                        e += row[j] * kh[j];
                    }
                    float delta = beta * (vh[r] - e);
                    float acc = 0.0f;
                    for (int j = 0; j < Dk; j++) {
                        row[j] += delta * kh[j];
                        acc += row[j] * qh[j];
                    }
                    o[r] = acc;
                }
                /* gated RMSNorm: norm(o) * w * silu(z) */
                const float *zh = z + t * vd + h * Dv;
                float ss = 0.0f;
                for (int r = 0; r < Dv; r++) ss += o[r] * o[r];
                float rs = 1.0f / sqrtf(ss / (float)Dv + c->rms_norm_eps);
                for (int r = 0; r < Dv; r++) o[r] = o[r] * rs * L->gdn_norm[r] * silu(zh[r]);
            }
        }
    }
    mm(f, &L->out_proj, f->mix, vd, T, f->out, d);
}

/* ---------------------------------------------------------------------------------------- */
/* gated full attention */

static void attn_layer(st_fwd *f, const st_layer *L, const st_batch_item *items, int n_items,
                       int64_t T) {
    const st_config *c = &f->m->cfg;
    const st_cache *cache = f->cache;
    const int64_t d = c->hidden_size;
    const int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, grp = nh / nkv;
    const int li = L->kind_index, bs = cache->p.block_size;
    const float scale = 1.0f / sqrtf((float)hd);
    float *qg = f->p1, *kk = f->p2, *vv = f->p3;
    mm(f, &L->q_proj, f->xn, d, T, qg, 2 * nh * hd);
    mm(f, &L->k_proj, f->xn, d, T, kk, nkv * hd);
    mm(f, &L->v_proj, f->xn, d, T, vv, nkv * hd);
    int64_t t0 = 0;
    for (int it = 0; it < n_items; it++) {
        const st_seq *seq = items[it].seq;
        const int n = items[it].n_tokens;
        /* q/k norm, RoPE, and K/V of every new token into the cache */
        for (int i = 0; i < n; i++) {
            int64_t t = t0 + i, pos = seq->n_past + i;
            rope_angles(f, pos);
            for (int j = 0; j < nh; j++) {
                float *q = qg + t * 2 * nh * hd + (int64_t)j * 2 * hd;
                rmsnorm(q, L->q_norm, hd, c->rms_norm_eps, q);
                rope_apply(f, q);
            }
            for (int h = 0; h < nkv; h++) {
                float *k = kk + t * nkv * hd + (int64_t)h * hd;
                rmsnorm(k, L->k_norm, hd, c->rms_norm_eps, k);
                rope_apply(f, k);
                kv_store(cache, st_cache_kv_ptr(cache, seq, li, 0, h, pos), k, hd);
                kv_store(cache, st_cache_kv_ptr(cache, seq, li, 1, h, pos), vv + t * nkv * hd + (int64_t)h * hd, hd);
            }
        }
        /* causal attention of each new token over positions 0..pos of its sequence */
        for (int i = 0; i < n; i++) {
            int64_t t = t0 + i, pos = seq->n_past + i, npos = pos + 1;
            for (int j = 0; j < nh; j++) {
                const float *q = qg + t * 2 * nh * hd + (int64_t)j * 2 * hd;
                const float *gate = q + hd;
                const int h = j / grp;
                float *s = f->scores;
                float mx = -INFINITY;
                for (int64_t p0 = 0; p0 < npos; p0 += bs) {
                    const uint8_t *kb = st_cache_kv_ptr(cache, seq, li, 0, h, p0);
                    int64_t nb = npos - p0 < bs ? npos - p0 : bs;
                    for (int64_t p = 0; p < nb; p++) {
                        float sc = kv_dot(cache, kb + (size_t)p * hd * cache->kv_elem, q, hd) * scale;
                        s[p0 + p] = sc;
                        if (sc > mx) mx = sc;
                    }
                }
                float sum = 0.0f;
                for (int64_t p = 0; p < npos; p++) {
                    s[p] = expf(s[p] - mx);
                    sum += s[p];
                }
                float *o = f->mix + t * nh * hd + (int64_t)j * hd;
                memset(o, 0, (size_t)hd * sizeof(float));
                for (int64_t p0 = 0; p0 < npos; p0 += bs) {
                    const uint8_t *vb = st_cache_kv_ptr(cache, seq, li, 1, h, p0);
                    int64_t nb = npos - p0 < bs ? npos - p0 : bs;
                    for (int64_t p = 0; p < nb; p++)
                        kv_axpy(cache, s[p0 + p], vb + (size_t)p * hd * cache->kv_elem, o, hd);
                }
                float inv = 1.0f / sum;
                for (int e = 0; e < hd; e++) o[e] = o[e] * inv * sigmoid(gate[e]);
            }
        }
        t0 += n;
    }
    mm(f, &L->o_proj, f->mix, (int64_t)nh * hd, T, f->out, d);
}

/* ---------------------------------------------------------------------------------------- */
/* MLPs */

static void swiglu(st_fwd *f, const st_matrix *gate, const st_matrix *up, const st_matrix *down,
                   const float *x, int64_t n, float *y) {
    const int64_t d = f->m->cfg.hidden_size, I = gate->rows;
    mm(f, gate, x, d, n, f->p1, I);
    mm(f, up, x, d, n, f->p2, I);
    for (int64_t i = 0; i < n * I; i++) f->p1[i] = silu(f->p1[i]) * f->p2[i];
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

st_status st_fwd_run(st_fwd *f, const st_batch_item *items, int n_items, float *logits,
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
        blocks += st_cache_blocks_needed(cache, it->seq, it->n_tokens);
    }
    if (T > f->max_tokens)
        return st_error_set(err, ST_ERR_LIMIT, "batch of %lld tokens exceeds the planned %d",
                            (long long)T, f->max_tokens);
    if (blocks > cache->n_free_blocks)
        return st_error_set(err, ST_ERR_BUSY, "KV pool exhausted: need %lld blocks, %lld free",
                            (long long)blocks, (long long)cache->n_free_blocks);
    for (int i = 0; i < n_items; i++) {
        st_status st = st_cache_seq_reserve(cache, items[i].seq, items[i].n_tokens, err);
        ST_ASSERT(st == ST_OK); /* checked above */
    }

    const int64_t d = c->hidden_size;
    int64_t t = 0;
    for (int i = 0; i < n_items; i++)
        for (int j = 0; j < items[i].n_tokens; j++, t++)
            st_matrix_row_f32(&m->embed, items[i].tokens[j], f->x + t * d);

    for (int li = 0; li < c->n_layers; li++) {
        const st_layer *L = &m->layers[li];
        if (f->hook) f->hook(f->hook_user, li, T, d, f->x);
        for (t = 0; t < T; t++)
            rmsnorm(f->x + t * d, L->input_norm, d, c->rms_norm_eps, f->xn + t * d);
        if (L->kind == ST_LAYER_LINEAR) gdn_layer(f, L, items, n_items, T);
        else attn_layer(f, L, items, n_items, T);
        for (int64_t e = 0; e < T * d; e++) f->x[e] += f->out[e];
        for (t = 0; t < T; t++)
            rmsnorm(f->x + t * d, L->post_norm, d, c->rms_norm_eps, f->xn + t * d);
        if (c->is_moe) moe_layer(f, L, T);
        else swiglu(f, &L->gate, &L->up, &L->down, f->xn, T, f->out);
        for (int64_t e = 0; e < T * d; e++) f->x[e] += f->out[e];
    }
    for (t = 0; t < T; t++) rmsnorm(f->x + t * d, m->final_norm, d, c->rms_norm_eps, f->xn + t * d);
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
