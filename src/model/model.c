/* ==== Loading a Qwen3.5-family text model from a checkpoint (see model.h) ==== */
#include "model/model.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "core/log.h"
#include "core/numeric.h"

typedef struct loader {
    st_model *m;
    st_error *err;
} loader;

/* snprintf for tensor names; long names are simply truncated (and then not found) */
static void name_fmt(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void name_fmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static const st_tensor *find(loader *l, const char *name) {
    return st_checkpoint_find(l->m->ck, name);
}

static st_status missing(loader *l, const char *name) {
    return st_error_set(l->err, ST_ERR_MISSING, "%s: missing tensor '%s'", l->m->dir, name);
}

static void fmt_shape(char *buf, size_t cap, const st_tensor *t) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int d = 0; d < t->n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Check that t has exactly the dims given (n of them). */
static st_status expect_shape(loader *l, const st_tensor *t, int n, const int64_t *dims) {
    int ok = t->n_dims == n;
    for (int d = 0; ok && d < n; d++) ok = t->shape[d] == dims[d];
    if (ok) return ST_OK;
    char have[128], want[128];
    fmt_shape(have, sizeof have, t);
    st_tensor tmp = {.n_dims = n};
    for (int d = 0; d < n; d++) tmp.shape[d] = dims[d];
    fmt_shape(want, sizeof want, &tmp);
    return st_error_set(l->err, ST_ERR_SHAPE, "%s: tensor '%s' has shape %s, expected %s",
                        t->file, t->name, have, want);
}

static st_status float_vector_dtype(loader *l, const st_tensor *t) {
    if (t->dtype == ST_DTYPE_F32 || t->dtype == ST_DTYPE_BF16 || t->dtype == ST_DTYPE_F16)
        return ST_OK;
    return st_error_set(l->err, ST_ERR_UNSUPPORTED,
                        "%s: tensor '%s' has dtype %s (expected F32, BF16 or F16)", t->file,
                        t->name, st_dtype_name(t->dtype));
}

/* fp32 storage carved from the model's vector block */
static float *vec_alloc(loader *l, size_t n) {
    st_model *m = l->m;
    if (m->vec_used + n > m->vec_cap) {
        st_error_set(l->err, ST_ERR_INTERNAL, "vector storage exhausted (%zu + %zu > %zu)",
                     m->vec_used, n, m->vec_cap);
        return NULL;
    }
    float *p = m->vec_storage + m->vec_used;
    m->vec_used += (n + 15) & ~(size_t)15;
    return p;
}

static void tensor_to_f32(const st_tensor *t, float *out) {
    for (int64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case ST_DTYPE_F32: out[i] = ((const float *)t->data)[i]; break;
        case ST_DTYPE_BF16: out[i] = st_bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        case ST_DTYPE_F16: out[i] = st_f16_to_f32(((const uint16_t *)t->data)[i]); break;
        default: ST_ASSERT(0);
        }
    }
}

/* A 1-D vector of n floats. zero_centred: HF stores w and the model multiplies by 1+w; in
 * the MLX layout the file already holds 1+w. */
static st_status load_vec(loader *l, const char *name, int64_t n, int zero_centred, float **out) {
    const st_tensor *t = find(l, name);
    if (!t) return missing(l, name);
    st_status st = float_vector_dtype(l, t);
    if (st != ST_OK) return st;
    if ((st = expect_shape(l, t, 1, &n)) != ST_OK) return st;
    float *v = vec_alloc(l, (size_t)n);
    if (!v) return ST_ERR_INTERNAL;
    tensor_to_f32(t, v);
    if (zero_centred && !l->m->is_mlx_layout)
        for (int64_t i = 0; i < n; i++) v[i] += 1.0f;
    *out = v;
    return ST_OK;
}

/* Fill *out with a matrix view of `base` (+".weight", and ".scales"/".biases" when quantized),
 * logically [n_stack][rows][cols] (n_stack = 0 for a plain 2-D matrix). */
static st_status load_stack(loader *l, const char *base, int64_t n_stack, int64_t rows,
                            int64_t cols, st_matrix *out) {
    char name[512], sname[512], bname[512];
    name_fmt(name, sizeof name, "%s.weight", base);
    const st_tensor *t = find(l, name);
    if (!t && n_stack) { /* fused HF expert stacks have no ".weight" suffix */
        t = find(l, base);
        if (t) name_fmt(name, sizeof name, "%s", base);
    }
    if (!t) return missing(l, name);
    name_fmt(sname, sizeof sname, "%s.scales", base);
    name_fmt(bname, sizeof bname, "%s.biases", base);
    const st_tensor *ts = find(l, sname);
    int nd = n_stack ? 3 : 2;
    int64_t dims[3];
    int k = 0;
    if (n_stack) dims[k++] = n_stack;
    dims[k++] = rows;
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    st_status st;
    if (!ts) {
        dims[k] = cols;
        switch (t->dtype) {
        case ST_DTYPE_BF16: out->fmt = ST_WFMT_BF16; break;
        case ST_DTYPE_F16: out->fmt = ST_WFMT_F16; break;
        case ST_DTYPE_F32: out->fmt = ST_WFMT_F32; break;
        default:
            return st_error_set(l->err, ST_ERR_UNSUPPORTED,
                                "%s: tensor '%s' has dtype %s (expected BF16, F16 or F32, or U32 "
                                "with .scales/.biases for MLX quantization)",
                                t->file, name, st_dtype_name(t->dtype));
        }
        if ((st = expect_shape(l, t, nd, dims)) != ST_OK) return st;
        out->data = t->data;
        return ST_OK;
    }
    /* MLX affine quantization */
    const st_tensor *tb = find(l, bname);
    if (!tb) return missing(l, bname);
    if (t->dtype != ST_DTYPE_U32)
        return st_error_set(l->err, ST_ERR_FORMAT,
                            "%s: quantized tensor '%s' has dtype %s (expected U32)", t->file, name,
                            st_dtype_name(t->dtype));
    if (ts->dtype != tb->dtype ||
        (ts->dtype != ST_DTYPE_BF16 && ts->dtype != ST_DTYPE_F16 && ts->dtype != ST_DTYPE_F32))
        return st_error_set(l->err, ST_ERR_UNSUPPORTED,
                            "%s: '%s'/'%s' must both be BF16, F16 or F32 (have %s/%s)", ts->file,
                            sname, bname, st_dtype_name(ts->dtype), st_dtype_name(tb->dtype));
    if (t->n_dims != nd || ts->n_dims != nd)
        return st_error_set(l->err, ST_ERR_SHAPE, "%s: quantized tensor '%s' must have %d dims",
                            t->file, name, nd);
    const st_config *c = &l->m->cfg;
    int bits, group;
    const st_quant_override *o = st_config_quant_override(c, base);
    if (!o && strncmp(base, "language_model.", 15) == 0) o = st_config_quant_override(c, base + 15);
    if (o) {
        bits = o->bits;
        group = o->group_size;
    } else if (c->has_quant) {
        bits = c->quant_bits;
        group = c->quant_group_size;
    } else { /* no quantization object: infer from the shapes */
        int64_t words = t->shape[nd - 1], ng = ts->shape[nd - 1];
        bits = (int)(words * 32 / (cols ? cols : 1));
        group = (int)(ng ? cols / ng : 0);
    }
    if (!st_affine_bits_supported(bits))
        return st_error_set(l->err, ST_ERR_UNSUPPORTED,
                            "%s: tensor '%s': %d-bit quantization is not supported (2, 3, 4, 5, 6 "
                            "or 8 bits)",
                            t->file, name, bits);
    if (group <= 0 || cols % group != 0 || (cols * bits) % 32 != 0)
        return st_error_set(l->err, ST_ERR_UNSUPPORTED,
                            "%s: tensor '%s': group size %d does not divide %lld columns", t->file,
                            name, group, (long long)cols);
    dims[k] = cols * bits / 32;
    if ((st = expect_shape(l, t, nd, dims)) != ST_OK) return st;
    dims[k] = cols / group;
    if ((st = expect_shape(l, ts, nd, dims)) != ST_OK) return st;
    if ((st = expect_shape(l, tb, nd, dims)) != ST_OK) return st;
    out->fmt = ST_WFMT_AFFINE;
    out->data = t->data;
    out->scales = ts->data;
    out->biases = tb->data;
    out->sdtype = ts->dtype;
    out->bits = bits;
    out->group = group;
    return ST_OK;
}

static st_status load_matrix(loader *l, const char *base, int64_t rows, int64_t cols,
                             st_matrix *out) {
    return load_stack(l, base, 0, rows, cols, out);
}

/* View of item e of a stack loaded with load_stack (each item [rows][cols]). */
static st_matrix stack_item(const st_matrix *s, int64_t e) {
    st_matrix v = *s;
    size_t data_row = s->fmt == ST_WFMT_AFFINE ? (size_t)s->cols * (size_t)s->bits / 8
                                               : (size_t)s->cols * (s->fmt == ST_WFMT_F32 ? 4 : 2);
    v.data = (const uint8_t *)s->data + (size_t)e * (size_t)s->rows * data_row;
    if (s->fmt == ST_WFMT_AFFINE) {
        size_t srow = (size_t)(s->cols / s->group) * st_dtype_size(s->sdtype);
        v.scales = (const uint8_t *)s->scales + (size_t)e * (size_t)s->rows * srow;
        v.biases = (const uint8_t *)s->biases + (size_t)e * (size_t)s->rows * srow;
    }
    return v;
}

/* Row range [r0, r0+n) of a matrix as a view. */
static st_matrix row_slice(const st_matrix *s, int64_t r0, int64_t n) {
    st_matrix v = stack_item(s, 0);
    size_t data_row = s->fmt == ST_WFMT_AFFINE ? (size_t)s->cols * (size_t)s->bits / 8
                                               : (size_t)s->cols * (s->fmt == ST_WFMT_F32 ? 4 : 2);
    v.rows = n;
    v.data = (const uint8_t *)s->data + (size_t)r0 * data_row;
    if (s->fmt == ST_WFMT_AFFINE) {
        size_t srow = (size_t)(s->cols / s->group) * st_dtype_size(s->sdtype);
        v.scales = (const uint8_t *)s->scales + (size_t)r0 * srow;
        v.biases = (const uint8_t *)s->biases + (size_t)r0 * srow;
    }
    return v;
}

static st_status load_conv(loader *l, const char *name, int64_t channels, int kernel,
                           float **out) {
    const st_tensor *t = find(l, name);
    if (!t) return missing(l, name);
    st_status st = float_vector_dtype(l, t);
    if (st != ST_OK) return st;
    int64_t hf[3] = {channels, 1, kernel}, mlx[3] = {channels, kernel, 1};
    int64_t *want = l->m->is_mlx_layout ? mlx : hf;
    if ((st = expect_shape(l, t, 3, want)) != ST_OK) return st;
    /* [C,1,K] and [C,K,1] have the same memory order: tap j of channel c at c*K + j */
    float *v = vec_alloc(l, (size_t)(channels * kernel));
    if (!v) return ST_ERR_INTERNAL;
    tensor_to_f32(t, v);
    *out = v;
    return ST_OK;
}

static st_status load_mlp_dense(loader *l, const char *lp, st_layer *L) {
    const st_config *c = &l->m->cfg;
    char b[512];
    st_status st;
    int64_t d = c->hidden_size, I = c->intermediate_size;
    name_fmt(b, sizeof b, "%smlp.gate_proj", lp);
    if ((st = load_matrix(l, b, I, d, &L->gate)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%smlp.up_proj", lp);
    if ((st = load_matrix(l, b, I, d, &L->up)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%smlp.down_proj", lp);
    return load_matrix(l, b, d, I, &L->down);
}

static st_status load_mlp_moe(loader *l, const char *lp, st_layer *L, st_matrix *views) {
    const st_config *c = &l->m->cfg;
    char b[512], n[512];
    st_status st;
    int64_t d = c->hidden_size, E = c->n_experts, Ie = c->moe_intermediate_size;
    L->exp_gate = views;
    L->exp_up = views + E;
    L->exp_down = views + 2 * E;
    name_fmt(b, sizeof b, "%smlp.gate", lp);
    if ((st = load_matrix(l, b, E, d, &L->router)) != ST_OK) return st;
    /* expert layouts: per-expert HF, fused HF (experts.gate_up_proj), MLX switch_mlp */
    name_fmt(n, sizeof n, "%smlp.switch_mlp.gate_proj.weight", lp);
    char fused[512], fused_w[512];
    name_fmt(fused, sizeof fused, "%smlp.experts.gate_up_proj", lp);
    name_fmt(fused_w, sizeof fused_w, "%s.weight", fused);
    int has_fused = find(l, fused) || find(l, fused_w);
    if (find(l, n)) {
        st_matrix sg, su, sd;
        name_fmt(b, sizeof b, "%smlp.switch_mlp.gate_proj", lp);
        if ((st = load_stack(l, b, E, Ie, d, &sg)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%smlp.switch_mlp.up_proj", lp);
        if ((st = load_stack(l, b, E, Ie, d, &su)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%smlp.switch_mlp.down_proj", lp);
        if ((st = load_stack(l, b, E, d, Ie, &sd)) != ST_OK) return st;
        for (int64_t e = 0; e < E; e++) {
            L->exp_gate[e] = stack_item(&sg, e);
            L->exp_up[e] = stack_item(&su, e);
            L->exp_down[e] = stack_item(&sd, e);
        }
    } else if (has_fused) {
        st_matrix sgu, sd;
        if ((st = load_stack(l, fused, E, 2 * Ie, d, &sgu)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%smlp.experts.down_proj", lp);
        if ((st = load_stack(l, b, E, d, Ie, &sd)) != ST_OK) return st;
        for (int64_t e = 0; e < E; e++) {
            st_matrix item = stack_item(&sgu, e);
            L->exp_gate[e] = row_slice(&item, 0, Ie);
            L->exp_up[e] = row_slice(&item, Ie, Ie);
            L->exp_down[e] = stack_item(&sd, e);
        }
    } else {
        for (int64_t e = 0; e < E; e++) {
            name_fmt(b, sizeof b, "%smlp.experts.%lld.gate_proj", lp, (long long)e);
            if ((st = load_matrix(l, b, Ie, d, &L->exp_gate[e])) != ST_OK) return st;
            name_fmt(b, sizeof b, "%smlp.experts.%lld.up_proj", lp, (long long)e);
            if ((st = load_matrix(l, b, Ie, d, &L->exp_up[e])) != ST_OK) return st;
            name_fmt(b, sizeof b, "%smlp.experts.%lld.down_proj", lp, (long long)e);
            if ((st = load_matrix(l, b, d, Ie, &L->exp_down[e])) != ST_OK) return st;
        }
    }
    int64_t Is = c->shared_expert_intermediate_size;
    L->has_shared = Is > 0;
    if (!L->has_shared) return ST_OK;
    name_fmt(b, sizeof b, "%smlp.shared_expert.gate_proj", lp);
    if ((st = load_matrix(l, b, Is, d, &L->sh_gate)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%smlp.shared_expert.up_proj", lp);
    if ((st = load_matrix(l, b, Is, d, &L->sh_up)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%smlp.shared_expert.down_proj", lp);
    if ((st = load_matrix(l, b, d, Is, &L->sh_down)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%smlp.shared_expert_gate", lp);
    return load_matrix(l, b, 1, d, &L->sh_expert_gate);
}

static st_status load_layer(loader *l, int i, st_layer *L, st_matrix *views) {
    st_model *m = l->m;
    const st_config *c = &m->cfg;
    char lp[256], b[512];
    st_status st;
    name_fmt(lp, sizeof lp, "%slayers.%d.", m->prefix, i);
    int64_t d = c->hidden_size;
    L->kind = (st_layer_kind)c->layer_kind[i];
    name_fmt(b, sizeof b, "%sinput_layernorm.weight", lp);
    if ((st = load_vec(l, b, d, 1, &L->input_norm)) != ST_OK) return st;
    name_fmt(b, sizeof b, "%spost_attention_layernorm.weight", lp);
    if ((st = load_vec(l, b, d, 1, &L->post_norm)) != ST_OK) return st;
    if (L->kind == ST_LAYER_LINEAR) {
        int64_t kd = st_config_key_dim(c), vd = st_config_value_dim(c), cd = st_config_conv_dim(c);
        int64_t hv = c->lin_n_value_heads;
        name_fmt(b, sizeof b, "%slinear_attn.in_proj_qkv", lp);
        if ((st = load_matrix(l, b, cd, d, &L->in_qkv)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.in_proj_z", lp);
        if ((st = load_matrix(l, b, vd, d, &L->in_z)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.in_proj_b", lp);
        if ((st = load_matrix(l, b, hv, d, &L->in_b)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.in_proj_a", lp);
        if ((st = load_matrix(l, b, hv, d, &L->in_a)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.out_proj", lp);
        if ((st = load_matrix(l, b, d, vd, &L->out_proj)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.conv1d.weight", lp);
        if ((st = load_conv(l, b, cd, c->conv_kernel, &L->conv_w)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.dt_bias", lp);
        if ((st = load_vec(l, b, hv, 0, &L->dt_bias)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%slinear_attn.A_log", lp);
        if ((st = load_vec(l, b, hv, 0, &L->neg_exp_a)) != ST_OK) return st;
        for (int64_t h = 0; h < hv; h++) L->neg_exp_a[h] = -expf(L->neg_exp_a[h]);
        name_fmt(b, sizeof b, "%slinear_attn.norm.weight", lp);
        if ((st = load_vec(l, b, c->lin_value_head_dim, 0, &L->gdn_norm)) != ST_OK) return st;
        (void)kd;
    } else {
        int64_t hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
        name_fmt(b, sizeof b, "%sself_attn.q_proj", lp);
        if ((st = load_matrix(l, b, 2 * nh * hd, d, &L->q_proj)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%sself_attn.k_proj", lp);
        if ((st = load_matrix(l, b, nkv * hd, d, &L->k_proj)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%sself_attn.v_proj", lp);
        if ((st = load_matrix(l, b, nkv * hd, d, &L->v_proj)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%sself_attn.o_proj", lp);
        if ((st = load_matrix(l, b, d, nh * hd, &L->o_proj)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%sself_attn.q_norm.weight", lp);
        if ((st = load_vec(l, b, hd, 1, &L->q_norm)) != ST_OK) return st;
        name_fmt(b, sizeof b, "%sself_attn.k_norm.weight", lp);
        if ((st = load_vec(l, b, hd, 1, &L->k_norm)) != ST_OK) return st;
    }
    return c->is_moe ? load_mlp_moe(l, lp, L, views) : load_mlp_dense(l, lp, L);
}

/* Find the text-model prefix and whether the file uses the MLX layout. */
static st_status detect_layout(loader *l) {
    st_model *m = l->m;
    static const char *prefixes[] = {"model.language_model.", "language_model.model.", "model.",
                                     ""};
    char name[256];
    int found = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        name_fmt(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (find(l, name)) {
            snprintf(m->prefix, sizeof m->prefix, "%s", prefixes[i]);
            found = 1;
            break;
        }
    }
    if (!found)
        return st_error_set(l->err, ST_ERR_MISSING,
                            "%s: missing tensor 'model.embed_tokens.weight' (also looked for the "
                            "model.language_model. and language_model.model. prefixes)",
                            m->dir);
    /* the conv1d shape tells the layouts apart: HF [C,1,K], MLX [C,K,1] */
    int layout = -1;
    for (int i = 0; i < m->cfg.n_layers && layout < 0; i++) {
        if (m->cfg.layer_kind[i] != ST_LAYER_LINEAR) continue;
        name_fmt(name, sizeof name, "%slayers.%d.linear_attn.conv1d.weight", m->prefix, i);
        const st_tensor *t = find(l, name);
        if (t && t->n_dims == 3 && m->cfg.conv_kernel > 1) layout = t->shape[2] == 1;
    }
    if (layout < 0) layout = strcmp(m->prefix, "language_model.model.") == 0;
    m->is_mlx_layout = layout;
    return ST_OK;
}

static size_t count_vec_floats(const st_config *c) {
    size_t n = (size_t)c->hidden_size + 16;
    for (int i = 0; i < c->n_layers; i++) {
        n += 2 * ((size_t)c->hidden_size + 16);
        if (c->layer_kind[i] == ST_LAYER_LINEAR)
            n += (size_t)st_config_conv_dim(c) * (size_t)c->conv_kernel + 16 +
                 2 * ((size_t)c->lin_n_value_heads + 16) + (size_t)c->lin_value_head_dim + 16;
        else
            n += 2 * ((size_t)c->head_dim + 16);
    }
    return n;
}

st_status st_model_load(const char *dir, st_model **out, st_error *err) {
    *out = NULL;
    st_model *m = calloc(1, sizeof *m);
    if (!m) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    loader l = {m, err};
    st_status st;
    m->dir = strdup(dir);
    if (!m->dir) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = st_config_load(dir, &m->cfg, err)) != ST_OK) goto fail;
    if ((st = st_checkpoint_open(dir, &m->ck, err)) != ST_OK) goto fail;
    if ((st = detect_layout(&l)) != ST_OK) goto fail;
    const st_config *c = &m->cfg;
    m->vec_cap = count_vec_floats(c);
    m->vec_storage = calloc(m->vec_cap, sizeof(float));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (c->is_moe)
        m->expert_views = calloc((size_t)c->n_layers * 3 * (size_t)c->n_experts, sizeof(st_matrix));
    if (!m->vec_storage || !m->layers || (c->is_moe && !m->expert_views)) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    char name[512];
    name_fmt(name, sizeof name, "%sembed_tokens", m->prefix);
    if ((st = load_matrix(&l, name, c->vocab_size, c->hidden_size, &m->embed)) != ST_OK) goto fail;
    name_fmt(name, sizeof name, "%snorm.weight", m->prefix);
    if ((st = load_vec(&l, name, c->hidden_size, 1, &m->final_norm)) != ST_OK) goto fail;
    int n_lin = 0, n_full = 0;
    for (int i = 0; i < c->n_layers; i++) {
        st_matrix *views = c->is_moe ? m->expert_views + (size_t)i * 3 * (size_t)c->n_experts : NULL;
        if ((st = load_layer(&l, i, &m->layers[i], views)) != ST_OK) goto fail;
        m->layers[i].kind_index = m->layers[i].kind == ST_LAYER_LINEAR ? n_lin++ : n_full++;
    }
    m->n_linear = n_lin;
    m->n_full = n_full;
    /* LM head: lm_head unless tied or absent */
    static const char *heads[] = {"lm_head", "language_model.lm_head", "model.lm_head",
                                  "model.language_model.lm_head"};
    const char *head = NULL;
    for (size_t i = 0; i < sizeof heads / sizeof heads[0] && !head; i++) {
        name_fmt(name, sizeof name, "%s.weight", heads[i]);
        if (find(&l, name)) head = heads[i];
    }
    if (c->tie_word_embeddings || !head) {
        if (!c->tie_word_embeddings)
            ST_INFO("%s: no lm_head tensor; using the tied embedding as the LM head", dir);
        m->lm_head = m->embed;
        m->tied = 1;
    } else if ((st = load_matrix(&l, head, c->vocab_size, c->hidden_size, &m->lm_head)) != ST_OK) {
        goto fail;
    }
    *out = m;
    return ST_OK;
fail:
    st_model_free(m);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* synthetic models */

/* n values centre + half * uniform[-1, 1) drawn from (seed, key) */
static float *syn_vec(st_model *m, uint64_t seed, uint64_t key, size_t n, float centre, float half) {
    float *v = m->vec_storage + m->vec_used;
    assert(m->vec_used + n <= m->vec_cap);
    m->vec_used += (n + 15) & ~(size_t)15;
    const uint64_t k = st_splitmix64(seed ^ st_splitmix64(key));
    for (size_t i = 0; i < n; i++) v[i] = centre + half * st_unif_hash(k, i);
    return v;
}

static st_matrix syn_mat(int64_t rows, int64_t cols, int bits, int group) {
    st_matrix w = {.fmt = ST_WFMT_BF16, .rows = rows, .cols = cols};
    if (bits && cols % group == 0 && (cols * bits) % 32 == 0) {
        w.fmt = ST_WFMT_AFFINE;
        w.bits = bits;
        w.group = group;
        w.sdtype = ST_DTYPE_BF16;
    }
    return w;
}

st_status st_model_synthetic(const st_config *c, int bits, int group, uint64_t seed, st_model **out,
                             st_error *err) {
    *out = NULL;
    if (bits && (bits < 2 || bits > 8 || bits == 7))
        return st_error_set(err, ST_ERR_ARG, "synthetic model: %d bits (2, 3, 4, 5, 6 or 8)", bits);
    if (bits && group != 32 && group != 64 && group != 128)
        return st_error_set(err, ST_ERR_ARG, "synthetic model: group %d (32, 64 or 128)", group);
    if (c->n_layers < 1 || c->n_layers > ST_MAX_LAYERS || c->hidden_size < 1 || c->vocab_size < 1)
        return st_error_set(err, ST_ERR_ARG, "synthetic model: a config without layers or vocabulary");
    st_model *m = calloc(1, sizeof *m);
    if (!m) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    m->cfg = *c;
    m->cfg.quant_overrides = NULL;
    m->cfg.n_quant_overrides = 0;
    m->synthetic = 1;
    m->synth_seed = seed;
    m->dir = strdup("(synthetic)");
    snprintf(m->prefix, sizeof m->prefix, "model.");
    m->vec_cap = count_vec_floats(c);
    m->vec_storage = calloc(m->vec_cap, sizeof(float));
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (c->is_moe)
        m->expert_views = calloc((size_t)c->n_layers * 3 * (size_t)c->n_experts, sizeof(st_matrix));
    if (!m->dir || !m->vec_storage || !m->layers || (c->is_moe && !m->expert_views)) {
        st_model_free(m);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    const int64_t d = c->hidden_size, V = c->vocab_size;
    const int64_t vd = st_config_value_dim(c), cd = st_config_conv_dim(c);
    const int64_t hd = c->head_dim;
    uint64_t key = 1;
    m->embed = syn_mat(V, d, bits, group);
    m->final_norm = syn_vec(m, seed, key++, (size_t)d, 1.0f, 0.1f);
    int n_lin = 0, n_full = 0;
    for (int i = 0; i < c->n_layers; i++) {
        st_layer *L = &m->layers[i];
        L->kind = c->layer_kind[i];
        L->kind_index = L->kind == ST_LAYER_LINEAR ? n_lin++ : n_full++;
        L->input_norm = syn_vec(m, seed, key++, (size_t)d, 1.0f, 0.1f);
        L->post_norm = syn_vec(m, seed, key++, (size_t)d, 1.0f, 0.1f);
        if (L->kind == ST_LAYER_LINEAR) {
            const int64_t Hv = c->lin_n_value_heads;
            L->in_qkv = syn_mat(cd, d, bits, group);
            L->in_z = syn_mat(vd, d, bits, group);
            L->in_b = syn_mat(Hv, d, bits, group);
            L->in_a = syn_mat(Hv, d, bits, group);
            L->out_proj = syn_mat(d, vd, bits, group);
            L->conv_w = syn_vec(m, seed, key++, (size_t)(cd * c->conv_kernel), 0.0f, 0.5f);
            L->dt_bias = syn_vec(m, seed, key++, (size_t)Hv, 1.0f, 0.1f);
            L->neg_exp_a = syn_vec(m, seed, key++, (size_t)Hv, -8.5f, 7.5f); /* -A, A in [1, 16) */
            L->gdn_norm = syn_vec(m, seed, key++, (size_t)c->lin_value_head_dim, 1.0f, 0.1f);
        } else {
            L->q_proj = syn_mat(2 * c->n_heads * hd, d, bits, group);
            L->k_proj = syn_mat(c->n_kv_heads * hd, d, bits, group);
            L->v_proj = syn_mat(c->n_kv_heads * hd, d, bits, group);
            L->o_proj = syn_mat(d, c->n_heads * hd, bits, group);
            L->q_norm = syn_vec(m, seed, key++, (size_t)hd, 1.0f, 0.1f);
            L->k_norm = syn_vec(m, seed, key++, (size_t)hd, 1.0f, 0.1f);
        }
        if (!c->is_moe) {
            L->gate = syn_mat(c->intermediate_size, d, bits, group);
            L->up = syn_mat(c->intermediate_size, d, bits, group);
            L->down = syn_mat(d, c->intermediate_size, bits, group);
            continue;
        }
        const int E = c->n_experts;
        const int64_t Ie = c->moe_intermediate_size;
        L->router = syn_mat(E, d, 0, group);
        L->exp_gate = m->expert_views + (size_t)i * 3 * (size_t)E;
        L->exp_up = L->exp_gate + E;
        L->exp_down = L->exp_up + E;
        for (int e = 0; e < E; e++) {
            L->exp_gate[e] = syn_mat(Ie, d, bits, group);
            L->exp_up[e] = syn_mat(Ie, d, bits, group);
            L->exp_down[e] = syn_mat(d, Ie, bits, group);
        }
        if (c->shared_expert_intermediate_size > 0) {
            const int64_t Is = c->shared_expert_intermediate_size;
            L->has_shared = 1;
            L->sh_gate = syn_mat(Is, d, bits, group);
            L->sh_up = syn_mat(Is, d, bits, group);
            L->sh_down = syn_mat(d, Is, bits, group);
            L->sh_expert_gate = syn_mat(1, d, 0, group);
        }
    }
    m->n_linear = n_lin;
    m->n_full = n_full;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        m->tied = 1;
    } else {
        m->lm_head = syn_mat(V, d, bits, group);
    }
    *out = m;
    return ST_OK;
}

void st_model_free(st_model *m) {
    if (!m) return;
    st_checkpoint_close(m->ck);
    st_config_free(&m->cfg);
    free(m->vec_storage);
    free(m->layers);
    free(m->expert_views);
    free(m->dir);
    free(m);
}

/* ---------------------------------------------------------------------------------------- */
/* sizes */

static void add_matrix(const st_matrix *w, int64_t *params, size_t *bytes) {
    if (!w->rows) return; /* absent (a synthetic model's matrices have shapes, no data) */
    *params += w->rows * w->cols;
    *bytes += st_matrix_bytes(w);
}

void st_model_get_stats(const st_model *m, size_t kv_elem_size, st_model_stats *s) {
    const st_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    int64_t params = 0;
    size_t bytes = 0, per_token = 0;
    add_matrix(&m->embed, &params, &bytes);
    per_token += st_matrix_row_bytes(&m->embed);
    if (!m->tied) add_matrix(&m->lm_head, &params, &bytes);
    per_token += st_matrix_bytes(&m->lm_head);
    params += c->hidden_size;
    for (int i = 0; i < c->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        int64_t p0 = params;
        size_t b0 = bytes;
        params += 2 * c->hidden_size;
        const st_matrix *mats[] = {&L->in_qkv, &L->in_z,   &L->in_b,   &L->in_a,    &L->out_proj,
                                   &L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj,  &L->gate,
                                   &L->up,     &L->down,   &L->router, &L->sh_gate, &L->sh_up,
                                   &L->sh_down, &L->sh_expert_gate};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) add_matrix(mats[k], &params, &bytes);
        size_t dense_bytes = bytes - b0;
        if (L->kind == ST_LAYER_LINEAR)
            params += st_config_conv_dim(c) * c->conv_kernel + 2 * c->lin_n_value_heads +
                      c->lin_value_head_dim;
        else
            params += 2 * c->head_dim;
        per_token += dense_bytes;
        if (c->is_moe) {
            size_t one_expert = 0;
            for (int e = 0; e < c->n_experts; e++) {
                size_t eb = 0;
                add_matrix(&L->exp_gate[e], &params, &eb);
                add_matrix(&L->exp_up[e], &params, &eb);
                add_matrix(&L->exp_down[e], &params, &eb);
                bytes += eb;
                one_expert = eb;
            }
            per_token += one_expert * (size_t)c->n_experts_per_tok;
        }
        (void)p0;
    }
    s->n_params = params;
    s->weight_bytes = bytes;
    s->bytes_per_token = per_token;
    s->kv_bytes_per_token =
        (size_t)m->n_full * 2 * (size_t)c->n_kv_heads * (size_t)c->head_dim * kv_elem_size;
    s->state_bytes_per_seq =
        (size_t)m->n_linear *
        ((size_t)c->lin_n_value_heads * (size_t)c->lin_value_head_dim *
             (size_t)c->lin_key_head_dim +
         (size_t)(c->conv_kernel - 1) * (size_t)st_config_conv_dim(c)) *
        sizeof(float);
}
