/* ==== Hugging Face -> MLX affine conversion (see quantize.h) ====
 *
 * Two passes: plan every output tensor (name, dtype, shape, where its rows come from, how
 * they are transformed), then stream the shards through st_sf_write, whose fill callback
 * produces rows on demand. A quantized module's three tensors are written one after the
 * other (.weight, .scales, .biases): the rows of .weight are quantized (in parallel) and
 * their scales and biases kept for the two tensors that follow, so nothing is quantized twice
 * and memory holds one module's scales at a time. Write order within a shard: 4-byte tensors
 * first (F32, then each module's uint32 weight with its two bf16 halves, whose sizes sum to a
 * multiple of 4), then the remaining bf16 tensors: every tensor stays aligned.
 */
#include "model/quantize.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/numeric.h"
#include "core/threadpool.h"
#include "model/config.h"
#include "model/safetensors.h"

st_quantize_params st_quantize_default_params(void) {
    st_quantize_params p = {
        .bits = 4,
        .group_size = 64,
        .mixed = 0,
        .high_bits = 0,
        .method = ST_QUANT_AUTO,
        .shard_bytes = 0,
        .n_threads = 0,
        .progress = NULL,
        .user = NULL,
    };
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* the plan */

typedef enum okind {
    K_DENSE = 0,   /* converted to the output dtype (or copied when it is the same) */
    K_NORM1 = 1,   /* bf16(1 + w) */
    K_QWEIGHT = 2, /* a quantized module's packed words */
    K_QSCALES = 3,
    K_QBIASES = 4,
} okind;

typedef struct otensor {
    char name[300];          /* output name */
    char module[300];        /* quantized: the module path (the name without the suffix) */
    okind kind;
    st_dtype dtype;
    int n_dims;
    int64_t shape[3];
    /* the logical matrix [rows][cols]: expert e's rows i come from source tensor
     * src[n_src > 1 ? e : 0] at row (n_src > 1 ? 0 : e * src_stride) + src_row0 + i */
    const st_tensor **src;   /* [n_src], owned array of borrowed tensors */
    int n_src;
    int64_t experts, rows_per_expert, src_stride, src_row0;
    int64_t rows, cols;
    int bits, group;
    int order;               /* write class: 0 F32, 1 quantized module, 2 other */
    int seq;                 /* plan order, for a stable sort */
    int shard;
} otensor;

typedef struct plan {
    otensor *t;              /* [n] */
    int n, cap;
    int failed;
} plan;

static otensor *add_tensor(plan *pl) {
    if (pl->n == pl->cap) {
        int nc = pl->cap ? pl->cap * 2 : 256;
        otensor *nt = realloc(pl->t, (size_t)nc * sizeof *nt);
        if (!nt) {
            pl->failed = 1;
            return NULL;
        }
        pl->t = nt;
        pl->cap = nc;
    }
    otensor *t = &pl->t[pl->n];
    memset(t, 0, sizeof *t);
    t->seq = pl->n++;
    return t;
}

static void plan_free(plan *pl) {
    for (int i = 0; i < pl->n; i++)
        if (pl->t[i].kind != K_QSCALES && pl->t[i].kind != K_QBIASES) free(pl->t[i].src);
    free(pl->t);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static void fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, cap, f, ap);
    va_end(ap);
}

/* the layer index in an MLX module path, or -1 */
static int layer_of(const char *module) {
    const char *p = strstr(module, ".layers.");
    return p ? atoi(p + 8) : -1;
}

/* mlx-lm's mixed recipe: the layers whose v_proj and down_proj get the high width */
static int more_bits_layer(int i, int n_layers) {
    return i < n_layers / 8 || i >= 7 * n_layers / 8 || (i - n_layers / 8) % 3 == 2;
}

static int is_float(st_dtype d) { return d == ST_DTYPE_BF16 || d == ST_DTYPE_F16 || d == ST_DTYPE_F32; }

/* Plan a matrix module (2-D, or experts stacked): quantized when its width allows, else dense
 * bf16. srcs: [n_src] sources (owned by the new tensor). */
static st_status plan_matrix(plan *pl, const st_quantize_params *p, const st_config *c, const char *module,
                             const st_tensor **srcs, int n_src, int64_t experts, int64_t rows_per_expert,
                             int64_t src_stride, int64_t src_row0, int64_t cols, st_error *err) {
    for (int i = 0; i < n_src; i++)
        if (!is_float(srcs[i]->dtype)) {
            st_status st = st_error_set(err, ST_ERR_UNSUPPORTED, "%s: dtype %s cannot be quantized (bf16, f16 or f32 only)",
                                        srcs[i]->name, st_dtype_name(srcs[i]->dtype));
            free(srcs);
            return st;
        }
    int bits = p->bits, group = p->group_size;
    int high = p->high_bits ? p->high_bits : p->bits < 6 ? 6 : 8;
    if (ends_with(module, ".mlp.gate") || ends_with(module, ".shared_expert_gate")) bits = 8, group = 64; /* as mlx-lm */
    else if (p->mixed && (ends_with(module, "lm_head") ||
                          ((ends_with(module, ".v_proj") || ends_with(module, ".down_proj")) &&
                           more_bits_layer(layer_of(module), c->n_layers))))
        bits = high;
    int quant = cols % group == 0 && (cols * bits) % 32 == 0;
    int nd = experts > 1 || strstr(module, "switch_mlp") ? 3 : 2;
    int64_t rows = experts * rows_per_expert;
    for (int part = quant ? K_QWEIGHT : K_DENSE; part <= (quant ? K_QBIASES : K_DENSE); part++) {
        otensor *t = add_tensor(pl);
        if (!t) {
            free(srcs);
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        }
        static const char *suffix[] = {".weight", "", ".weight", ".scales", ".biases"};
        fmt(t->name, sizeof t->name, "%s%s", module, suffix[part]);
        fmt(t->module, sizeof t->module, "%s", module);
        t->kind = (okind)part;
        t->src = srcs; /* the weight (or dense) part owns the array */
        t->n_src = n_src;
        t->experts = experts;
        t->rows_per_expert = rows_per_expert;
        t->src_stride = src_stride;
        t->src_row0 = src_row0;
        t->rows = rows;
        t->cols = cols;
        t->bits = bits;
        t->group = group;
        t->n_dims = nd;
        if (nd == 3) t->shape[0] = experts;
        t->shape[nd - 2] = rows_per_expert;
        t->shape[nd - 1] = part == K_DENSE ? cols : part == K_QWEIGHT ? cols * bits / 32 : cols / group;
        t->dtype = part == K_QWEIGHT ? ST_DTYPE_U32 : ST_DTYPE_BF16;
        t->order = part == K_DENSE ? 2 : 1;
    }
    return ST_OK;
}

/* a tensor converted as a whole: out_shape (n_dims) over the source's elements */
static st_status plan_vector(plan *pl, const char *name, const st_tensor *src, okind kind, st_dtype dt,
                             int n_dims, const int64_t *shape, st_error *err) {
    if (!is_float(src->dtype))
        return st_error_set(err, ST_ERR_UNSUPPORTED, "%s: dtype %s is not a floating type", src->name,
                            st_dtype_name(src->dtype));
    otensor *t = add_tensor(pl);
    const st_tensor **s = malloc(sizeof *s);
    if (!t || !s) {
        free(s);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    s[0] = src;
    fmt(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->dtype = dt;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
    t->src = s;
    t->n_src = 1;
    t->experts = 1;
    t->cols = src->n_dims ? src->shape[src->n_dims - 1] : 1;
    t->rows = src->numel / (t->cols ? t->cols : 1);
    t->rows_per_expert = t->rows;
    t->src_stride = t->rows;
    t->order = dt == ST_DTYPE_F32 ? 0 : 2;
    return ST_OK;
}

static int is_linear(const char *rest) {
    static const char *mods[] = {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                                 ".in_proj_qkv.weight", ".in_proj_z.weight", ".in_proj_a.weight",
                                 ".in_proj_b.weight", ".out_proj.weight", ".gate_proj.weight", ".up_proj.weight",
                                 ".down_proj.weight", ".mlp.gate.weight", ".shared_expert_gate.weight"};
    for (size_t i = 0; i < sizeof mods / sizeof *mods; i++)
        if (ends_with(rest, mods[i])) return 1;
    return !strcmp(rest, "embed_tokens.weight") || !strcmp(rest, "lm_head.weight");
}

static int is_shifted_norm(const char *rest) {
    return ends_with(rest, ".input_layernorm.weight") || ends_with(rest, ".post_attention_layernorm.weight") ||
           !strcmp(rest, "norm.weight") || ends_with(rest, ".q_norm.weight") || ends_with(rest, ".k_norm.weight");
}

/* MoE experts of one layer: per-expert tensors stacked, or the fused HF tensors split */
static st_status plan_experts(plan *pl, const st_quantize_params *p, const st_config *c, const st_checkpoint *ck,
                              const char *in_prefix, int layer, st_error *err) {
    const int64_t E = c->n_experts, I = c->moe_intermediate_size, d = c->hidden_size;
    char n[512], module[300];
    fmt(n, sizeof n, "%slayers.%d.mlp.experts.gate_up_proj", in_prefix, layer);
    const st_tensor *fused = st_checkpoint_find(ck, n);
    static const char *proj[] = {"gate_proj", "up_proj", "down_proj"};
    for (int k = 0; k < 3; k++) {
        fmt(module, sizeof module, "language_model.model.layers.%d.mlp.switch_mlp.%s", layer, proj[k]);
        int64_t rows = k == 2 ? d : I, cols = k == 2 ? I : d;
        if (fused) {
            const st_tensor *src = fused;
            if (k == 2) {
                fmt(n, sizeof n, "%slayers.%d.mlp.experts.down_proj", in_prefix, layer);
                src = st_checkpoint_find(ck, n);
            }
            int64_t want_rows = k == 2 ? d : 2 * I;
            if (!src || src->n_dims != 3 || src->shape[0] != E || src->shape[1] != want_rows || src->shape[2] != cols)
                return st_error_set(err, ST_ERR_SHAPE, "%s: missing or not [%lld, %lld, %lld]", n, (long long)E,
                                    (long long)want_rows, (long long)cols);
            const st_tensor **s = malloc(sizeof *s);
            if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            s[0] = src;
            st_status st = plan_matrix(pl, p, c, module, s, 1, E, rows, want_rows, k == 1 ? I : 0, cols, err);
            if (st != ST_OK) return st;
            continue;
        }
        const st_tensor **s = calloc((size_t)E, sizeof *s);
        if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        for (int64_t e = 0; e < E; e++) {
            fmt(n, sizeof n, "%slayers.%d.mlp.experts.%lld.%s.weight", in_prefix, layer, (long long)e, proj[k]);
            s[e] = st_checkpoint_find(ck, n);
            if (!s[e] || s[e]->n_dims != 2 || s[e]->shape[0] != rows || s[e]->shape[1] != cols) {
                free(s);
                return st_error_set(err, ST_ERR_SHAPE, "%s: missing or not [%lld, %lld]", n, (long long)rows,
                                    (long long)cols);
            }
        }
        st_status st = plan_matrix(pl, p, c, module, s, (int)E, E, rows, rows, 0, cols, err);
        if (st != ST_OK) return st;
    }
    return ST_OK;
}

static int cmp_write_order(const void *a, const void *b) {
    const otensor *x = a, *y = b;
    if (x->shard != y->shard) return x->shard - y->shard;
    if (x->order != y->order) return x->order - y->order;
    return x->seq - y->seq;
}

static size_t tensor_bytes(const otensor *t) {
    size_t n = st_dtype_size(t->dtype);
    for (int i = 0; i < t->n_dims; i++) n *= (size_t)t->shape[i];
    return n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* every output tensor, in the input's name order */
static st_status make_plan(plan *pl, const st_quantize_params *p, const st_config *c, const st_checkpoint *ck,
                           st_error *err) {
    const char *in_prefix = NULL;
    if (st_checkpoint_find(ck, "model.language_model.embed_tokens.weight")) in_prefix = "model.language_model.";
    else if (st_checkpoint_find(ck, "model.embed_tokens.weight")) in_prefix = "model.";
    else if (st_checkpoint_find(ck, "language_model.model.embed_tokens.weight"))
        return st_error_set(err, ST_ERR_ARG, "%s is an MLX checkpoint already: quantize from the Hugging Face one", ck->dir);
    else return st_error_set(err, ST_ERR_MISSING, "%s: no embed_tokens.weight: not a Qwen3.5 text checkpoint", ck->dir);
    size_t plen = strlen(in_prefix);
    const char **names = malloc((size_t)ck->n_tensors * sizeof *names);
    if (!names) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ck->n_tensors; i++) names[i] = st_checkpoint_tensor(ck, i)->name;
    qsort(names, (size_t)ck->n_tensors, sizeof *names, cmp_str);
    st_status st = ST_OK;
    for (int i = 0; i < ck->n_tensors && st == ST_OK; i++) {
        const char *name = names[i];
        const st_tensor *t = st_checkpoint_find(ck, name);
        if (strstr(name, "mtp.") || !strncmp(name, "model.visual.", 13) || !strncmp(name, "visual.", 7) ||
            strstr(name, "vision_tower"))
            continue; /* what mlx-lm leaves out of a text model */
        char out[300];
        const char *rest = NULL;
        if (!strncmp(name, in_prefix, plen)) {
            rest = name + plen;
            fmt(out, sizeof out, "language_model.model.%s", rest);
        } else if (!strcmp(name, "lm_head.weight")) {
            if (c->tie_word_embeddings) continue;
            rest = name;
            fmt(out, sizeof out, "language_model.lm_head.weight");
        } else {
            fmt(out, sizeof out, "language_model.%s", name); /* mlx-lm's rule for any other key */
        }
        if (rest && strstr(rest, ".mlp.experts.")) {
            /* planned once per layer, at its first expert tensor in name order */
            int layer = layer_of(out);
            char first[300];
            fmt(first, sizeof first, "layers.%d.mlp.experts.", layer);
            int seen = 0;
            for (int k = 0; k < i && !seen; k++)
                seen = !strncmp(names[k], in_prefix, plen) && !strncmp(names[k] + plen, first, strlen(first));
            if (!seen) st = plan_experts(pl, p, c, ck, in_prefix, layer, err);
            continue;
        }
        if (rest && is_linear(rest) && t->n_dims == 2) {
            char module[300];
            fmt(module, sizeof module, "%.*s", (int)(strlen(out) - 7), out); /* without ".weight" */
            const st_tensor **s = malloc(sizeof *s);
            if (!s) {
                st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
                break;
            }
            s[0] = t;
            st = plan_matrix(pl, p, c, module, s, 1, 1, t->shape[0], t->shape[0], 0, t->shape[1], err);
        } else if (rest && ends_with(rest, ".conv1d.weight") && t->n_dims == 3 && t->shape[1] == 1) {
            int64_t shape[3] = {t->shape[0], t->shape[2], 1}; /* [C,1,K] -> [C,K,1]: the same bytes */
            st = plan_vector(pl, out, t, K_DENSE, ST_DTYPE_BF16, 3, shape, err);
        } else if (rest && is_shifted_norm(rest) && t->n_dims == 1) {
            st = plan_vector(pl, out, t, K_NORM1, ST_DTYPE_BF16, 1, t->shape, err);
        } else {
            st_dtype dt = ends_with(name, "A_log") ? t->dtype : ST_DTYPE_BF16; /* mlx-lm keeps A_log */
            st = plan_vector(pl, out, t, K_DENSE, dt, t->n_dims, t->shape, err);
        }
    }
    free(names);
    if (st == ST_OK && pl->failed) st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* producing the bytes */

typedef struct qthread {
    float *row;          /* [max cols] */
    double err2, w2;
    int64_t bad_row;     /* first row with a value that is not finite, or -1 */
} qthread;

typedef struct fill_ctx {
    otensor *t;          /* the shard's tensors in write order */
    const st_quantize_params *p;
    st_pool *pool;
    qthread *th;         /* [nth] */
    int nth;
    uint16_t *sc, *bi;   /* [rows][groups] of the module being written */
    size_t cache_cap;    /* elements of sc and bi */
    /* the current parallel job */
    const otensor *job;
    int64_t job_row0, job_rows;
    void *job_buf;
    /* progress */
    size_t done_bytes, total_bytes;
    double err2, w2;
    int quantized;
} fill_ctx;

static float elem(const st_tensor *s, int64_t i) {
    switch (s->dtype) {
    case ST_DTYPE_BF16: return st_bf16_to_f32(((const uint16_t *)s->data)[i]);
    case ST_DTYPE_F16: return st_f16_to_f32(((const uint16_t *)s->data)[i]);
    default: return ((const float *)s->data)[i];
    }
}

/* row r of the logical matrix as fp32; 0 when a value is not finite */
static int source_row(const otensor *t, int64_t r, float *out) {
    int64_t e = r / t->rows_per_expert, i = r % t->rows_per_expert;
    const st_tensor *s = t->src[t->n_src > 1 ? e : 0];
    int64_t sr = (t->n_src > 1 ? 0 : e * t->src_stride) + t->src_row0 + i;
    int ok = 1;
    for (int64_t j = 0; j < t->cols; j++) {
        out[j] = elem(s, sr * t->cols + j);
        ok &= isfinite(out[j]) != 0;
    }
    return ok;
}

static void quantize_rows(void *vctx, int tid, int nth) {
    fill_ctx *fc = vctx;
    const otensor *t = fc->job;
    qthread *th = &fc->th[tid];
    int64_t lo, hi;
    st_split_range(fc->job_rows, nth, tid, 1, &lo, &hi);
    const int64_t words = t->cols * t->bits / 32, ng = t->cols / t->group;
    for (int64_t k = lo; k < hi; k++) {
        int64_t r = fc->job_row0 + k;
        if (!source_row(t, r, th->row) && th->bad_row < 0) th->bad_row = r;
        st_quant_method m = fc->p->method != ST_QUANT_AUTO ? (st_quant_method)fc->p->method
                            : t->bits == 8 ? ST_QUANT_MINMAX : ST_QUANT_MSE;
        th->err2 += st_affine_quantize_row_as(th->row, t->cols, t->bits, t->group, m,
                                              (uint32_t *)fc->job_buf + k * words, fc->sc + r * ng, fc->bi + r * ng);
        for (int64_t j = 0; j < t->cols; j++) th->w2 += (double)th->row[j] * th->row[j];
    }
}

static st_status fill(void *vctx, int index, int64_t row0, int64_t nrows, void *buf, st_error *err) {
    fill_ctx *fc = vctx;
    const otensor *t = &fc->t[index];
    if (t->kind == K_QWEIGHT) {
        size_t need = (size_t)t->rows * (size_t)(t->cols / t->group);
        if (need > fc->cache_cap) {
            uint16_t *ns = realloc(fc->sc, need * sizeof *ns), *nb = ns ? realloc(fc->bi, need * sizeof *nb) : NULL;
            if (ns) fc->sc = ns;
            if (nb) fc->bi = nb;
            if (!ns || !nb) return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory for its scales", t->name);
            fc->cache_cap = need;
        }
        fc->job = t;
        fc->job_row0 = row0;
        fc->job_rows = nrows;
        fc->job_buf = buf;
        for (int i = 0; i < fc->nth; i++) fc->th[i].bad_row = -1;
        st_pool_run(fc->pool, quantize_rows, fc);
        for (int i = 0; i < fc->nth; i++)
            if (fc->th[i].bad_row >= 0)
                return st_error_set(err, ST_ERR_FORMAT, "%s: row %lld holds a value that is not finite", t->src[0]->name,
                                    (long long)fc->th[i].bad_row);
        if (row0 + nrows == t->rows) fc->quantized++;
    } else if (t->kind == K_QSCALES || t->kind == K_QBIASES) {
        const int64_t ng = t->cols / t->group;
        memcpy(buf, (t->kind == K_QSCALES ? fc->sc : fc->bi) + row0 * ng, (size_t)(nrows * ng) * sizeof(uint16_t));
    } else {
        /* elements in output order are the source's elements in order */
        int64_t last = t->shape[t->n_dims - 1], e0 = row0 * last, n = nrows * last;
        const st_tensor *s = t->src[0];
        if (t->dtype == s->dtype && t->kind == K_DENSE && t->n_src == 1 && t->src_row0 == 0) {
            memcpy(buf, (const uint8_t *)s->data + (size_t)e0 * st_dtype_size(s->dtype), (size_t)n * st_dtype_size(s->dtype));
        } else if (t->dtype == ST_DTYPE_F32) {
            for (int64_t i = 0; i < n; i++) ((float *)buf)[i] = elem(s, e0 + i);
        } else {
            for (int64_t i = 0; i < n; i++) {
                float v = elem(s, e0 + i);
                if (t->kind == K_NORM1) v = st_bf16_to_f32(st_f32_to_bf16(v)) + 1.0f; /* in bf16, as mlx does */
                ((uint16_t *)buf)[i] = st_f32_to_bf16(v);
            }
        }
    }
    fc->done_bytes += (size_t)nrows * (size_t)t->shape[t->n_dims - 1] * st_dtype_size(t->dtype);
    if (fc->p->progress) fc->p->progress(fc->p->user, fc->done_bytes, fc->total_bytes, t->name);
    return ST_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* config.json and the other files */

static st_status write_config(const char *in_dir, const char *out_dir, const st_quantize_params *p, const plan *pl,
                              st_error *err) {
    char path[4096];
    st_status st = st_path_join(path, sizeof path, in_dir, "config.json", err);
    if (st != ST_OK) return st;
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return st_error_set(err, ST_ERR_FORMAT, "%s: not a JSON object (%s)", path, st_json_error_text(je.text));
    }
    json_object_del(cfg, "_name_or_path");
    json_object_del(cfg, "vision_config");
    json_t *mt = json_object_get(cfg, "model_type");
    if (json_is_string(mt) && !strcmp(json_string_value(mt), "qwen3_5_text"))
        json_object_set_new(cfg, "model_type", json_string("qwen3_5"));
    else if (json_is_string(mt) && !strcmp(json_string_value(mt), "qwen3_5_moe_text"))
        json_object_set_new(cfg, "model_type", json_string("qwen3_5_moe"));
    json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", p->group_size, "bits", p->bits, "mode", "affine");
    for (int i = 0; i < pl->n; i++) {
        const otensor *t = &pl->t[i];
        if (t->kind != K_QWEIGHT || (t->bits == p->bits && t->group == p->group_size)) continue;
        json_object_set_new(q, t->module, json_pack("{s:i,s:i}", "group_size", t->group, "bits", t->bits));
    }
    json_object_set_new(cfg, "quantization", q);
    json_object_set_new(cfg, "quantization_config", json_deep_copy(q));
    if ((st = st_path_join(path, sizeof path, out_dir, "config.json", err)) == ST_OK &&
        json_dump_file(cfg, path, JSON_INDENT(4) | JSON_SORT_KEYS) != 0)
        st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
    json_decref(cfg);
    return st;
}

static st_status copy_side_files(const char *in_dir, const char *out_dir, st_error *err) {
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "chat_template.jinja", "chat_template.json", "generation_config.json",
                                  "vocab.json", "merges.txt", "added_tokens.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char from[4096], to[4096];
        if (st_path_join(from, sizeof from, in_dir, files[i], NULL) != ST_OK || !st_file_exists(from)) continue;
        st_status st = st_path_join(to, sizeof to, out_dir, files[i], err);
        if (st == ST_OK) st = st_file_copy(from, to, err);
        if (st != ST_OK) return st;
    }
    return ST_OK;
}

/* ---------------------------------------------------------------------------------------- */

st_status st_quantize_checkpoint(const char *in_dir, const char *out_dir, const st_quantize_params *p,
                                 st_quantize_stats *stats, st_error *err) {
    memset(stats, 0, sizeof *stats);
    if (!st_affine_bits_supported(p->bits))
        return st_error_set(err, ST_ERR_ARG, "quantize: %d bits is not an MLX affine width (2, 3, 4, 5, 6, 8)", p->bits);
    if (p->group_size != 32 && p->group_size != 64 && p->group_size != 128)
        return st_error_set(err, ST_ERR_ARG, "quantize: groups are 32, 64 or 128 columns, not %d", p->group_size);
    if (p->method != ST_QUANT_AUTO && p->method != ST_QUANT_MSE && p->method != ST_QUANT_MINMAX && p->method != ST_QUANT_MLX)
        return st_error_set(err, ST_ERR_ARG, "quantize: unknown method %d", p->method);
    if (p->high_bits && !st_affine_bits_supported(p->high_bits))
        return st_error_set(err, ST_ERR_ARG, "quantize: --high-bits %d is not an MLX affine width", p->high_bits);
    char rin[PATH_MAX], rout[PATH_MAX];
    if (realpath(in_dir, rin) && realpath(out_dir, rout) && !strcmp(rin, rout))
        return st_error_set(err, ST_ERR_ARG, "quantize: the output directory is the input directory");
    st_config c;
    st_status st = st_config_load(in_dir, &c, err);
    if (st != ST_OK) return st;
    if (c.quant_bits > 0) {
        st_config_free(&c);
        return st_error_set(err, ST_ERR_ARG, "%s is quantized already (%d-bit): quantize from the Hugging Face checkpoint",
                            in_dir, c.quant_bits);
    }
    st_checkpoint *ck = NULL;
    plan pl = {0};
    fill_ctx fc = {0};
    st_sf_entry *entries = NULL;
    json_t *index = NULL, *wmap = NULL;
    if ((st = st_checkpoint_open(in_dir, &ck, err)) != ST_OK) goto done;
    if ((st = make_plan(&pl, p, &c, ck, err)) != ST_OK) goto done;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        st = st_error_set(err, ST_ERR_IO, "%s: cannot create directory: %s", out_dir, strerror(errno));
        goto done;
    }
    /* shards in write order */
    qsort(pl.t, (size_t)pl.n, sizeof *pl.t, cmp_write_order);
    int64_t shard_max = p->shard_bytes > 0 ? p->shard_bytes : (int64_t)5 << 30;
    int64_t in_shard = 0, maxcols = 1;
    int n_shards = 1;
    for (int i = 0; i < pl.n; i++) {
        int64_t b = (int64_t)tensor_bytes(&pl.t[i]);
        /* a module's three tensors stay together (alignment, and the scales cache) */
        int starts_unit = pl.t[i].kind != K_QSCALES && pl.t[i].kind != K_QBIASES;
        if (starts_unit && in_shard > 0 && in_shard + b > shard_max) {
            n_shards++;
            in_shard = 0;
        }
        pl.t[i].shard = n_shards - 1;
        in_shard += b;
        fc.total_bytes += (size_t)b;
        if (pl.t[i].cols > maxcols) maxcols = pl.t[i].cols;
    }
    qsort(pl.t, (size_t)pl.n, sizeof *pl.t, cmp_write_order);
    fc.p = p;
    fc.nth = p->n_threads > 0 ? p->n_threads : st_default_threads();
    fc.th = calloc((size_t)fc.nth, sizeof *fc.th);
    entries = calloc((size_t)pl.n, sizeof *entries);
    index = json_object();
    wmap = json_object();
    if (!fc.th || !entries || !index || !wmap) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < fc.nth; i++)
        if (!(fc.th[i].row = malloc((size_t)maxcols * sizeof(float)))) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
            goto done;
        }
    if ((st = st_pool_create(fc.nth, &fc.pool, err)) != ST_OK) goto done;
    char path[4096], fname[64];
    for (int s = 0, start = 0; s < n_shards && st == ST_OK; s++) {
        int end = start;
        while (end < pl.n && pl.t[end].shard == s) end++;
        for (int i = start; i < end; i++) {
            st_sf_entry *e = &entries[i - start];
            e->name = pl.t[i].name;
            e->dtype = pl.t[i].dtype;
            e->n_dims = pl.t[i].n_dims;
            for (int k = 0; k < pl.t[i].n_dims; k++) e->shape[k] = pl.t[i].shape[k];
        }
        if (n_shards == 1) fmt(fname, sizeof fname, "model.safetensors");
        else fmt(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        for (int i = start; i < end; i++) json_object_set_new(wmap, pl.t[i].name, json_string(fname));
        if ((st = st_path_join(path, sizeof path, out_dir, fname, err)) != ST_OK) break;
        fc.t = pl.t + start;
        st = st_sf_write(path, entries, end - start, "mlx", fill, &fc, err);
        start = end;
    }
    if (st != ST_OK) goto done;
    json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)fc.total_bytes));
    json_object_set(index, "weight_map", wmap);
    if ((st = st_path_join(path, sizeof path, out_dir, "model.safetensors.index.json", err)) != ST_OK) goto done;
    if (json_dump_file(index, path, JSON_INDENT(4) | JSON_SORT_KEYS) != 0) {
        st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
        goto done;
    }
    if ((st = write_config(in_dir, out_dir, p, &pl, err)) != ST_OK) goto done;
    if ((st = copy_side_files(in_dir, out_dir, err)) != ST_OK) goto done;
    for (int i = 0; i < fc.nth; i++) {
        fc.err2 += fc.th[i].err2;
        fc.w2 += fc.th[i].w2;
    }
    stats->quantized = fc.quantized;
    for (int i = 0; i < pl.n; i++) stats->kept += pl.t[i].kind == K_DENSE || pl.t[i].kind == K_NORM1;
    for (int i = 0; i < ck->n_tensors; i++) stats->in_bytes += st_checkpoint_tensor(ck, i)->nbytes;
    stats->out_bytes = fc.total_bytes;
    stats->rel_rms_error = fc.w2 > 0 ? sqrt(fc.err2 / fc.w2) : 0;
    stats->shards = n_shards;
done:
    if (fc.th)
        for (int i = 0; i < fc.nth; i++) free(fc.th[i].row);
    free(fc.th);
    free(fc.sc);
    free(fc.bi);
    st_pool_destroy(fc.pool);
    json_decref(index);
    json_decref(wmap);
    free(entries);
    plan_free(&pl);
    st_checkpoint_close(ck);
    st_config_free(&c);
    return st;
}
