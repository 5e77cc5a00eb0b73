/* The vision tower: loading and the forward pass (spec/vision.md section 6). */
#include "vision/tower.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/numeric.h"
#include "core/threadpool.h"
#include "model/safetensors.h"

#define LN_EPS 1e-6f /* the tower's LayerNorms (hard-coded in the reference, not configured) */

/* ---- the config ---- */

static int get_int(json_t *o, const char *key, int dflt, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = dflt;
        return dflt >= 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20) return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

static st_status parse_config(const char *dir, st_vision_config *c, st_error *err) {
    char path[4096];
    st_status st = st_path_join(path, sizeof path, dir, "config.json", err);
    if (st != ST_OK) return st;
    char *text = NULL;
    size_t len = 0;
    if ((st = st_file_read(path, 16u << 20, &text, &len, err)) != ST_OK) return st;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root) return st_error_set(err, ST_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
    json_t *v = json_object_get(root, "vision_config");
    if (!json_is_object(v)) {
        json_decref(root);
        return st_error_set(err, ST_ERR_MISSING, "%s: no vision_config (the model has no vision tower)", path);
    }
    memset(c, 0, sizeof *c);
    const char *bad = NULL;
    int npos = 0;
    if (!get_int(v, "depth", -1, &c->depth)) bad = "depth";
    else if (!get_int(v, "hidden_size", -1, &c->hidden)) bad = "hidden_size";
    else if (!get_int(v, "num_heads", -1, &c->heads)) bad = "num_heads";
    else if (!get_int(v, "intermediate_size", -1, &c->intermediate)) bad = "intermediate_size";
    else if (!get_int(v, "out_hidden_size", -1, &c->out_hidden)) bad = "out_hidden_size";
    else if (!get_int(v, "in_channels", 3, &c->in_channels)) bad = "in_channels";
    else if (!get_int(v, "patch_size", 16, &c->patch)) bad = "patch_size";
    else if (!get_int(v, "temporal_patch_size", 2, &c->temporal)) bad = "temporal_patch_size";
    else if (!get_int(v, "spatial_merge_size", 2, &c->merge)) bad = "spatial_merge_size";
    else if (!get_int(v, "num_position_embeddings", -1, &npos)) bad = "num_position_embeddings";
    c->rope_theta = 10000.0;
    json_t *rp = json_object_get(v, "rope_parameters"), *th = rp ? json_object_get(rp, "rope_theta") : NULL;
    if (!th) th = json_object_get(v, "rope_theta");
    if (!bad && th) {
        if (!json_is_number(th) || !(json_number_value(th) > 1.0)) bad = "rope_theta";
        else c->rope_theta = json_number_value(th);
    }
    json_t *ds = json_object_get(v, "deepstack_visual_indexes");
    const int deepstack = json_is_array(ds) && json_array_size(ds) > 0;
    json_decref(root);
    if (bad) return st_error_set(err, ST_ERR_FORMAT, "%s: vision_config.%s is missing or out of range", path, bad);
    if (deepstack)
        return st_error_set(err, ST_ERR_UNSUPPORTED, "%s: vision_config.deepstack_visual_indexes is not empty "
                                                     "(Qwen3.5 towers have no deepstack mergers)", path);
    c->pos_side = (int)lrint(sqrt((double)npos));
    if (c->pos_side * c->pos_side != npos)
        return st_error_set(err, ST_ERR_FORMAT, "%s: vision_config.num_position_embeddings %d is not a square", path,
                            npos);
    if (c->hidden % c->heads != 0 || (c->hidden / c->heads) % 4 != 0)
        return st_error_set(err, ST_ERR_FORMAT,
                            "%s: vision_config hidden_size %d over num_heads %d must be a multiple of 4", path,
                            c->hidden, c->heads);
    c->head_dim = c->hidden / c->heads;
    return ST_OK;
}

/* ---- weights ---- */

typedef struct vloader {
    st_vision_tower *v;
    const char *prefix; /* "model.visual.", "visual." or "vision_tower." */
    st_error *err;
} vloader;

static const st_tensor *vfind(vloader *l, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", l->prefix, suffix);
    return st_checkpoint_find(l->v->ck, name);
}

static st_status vmissing(vloader *l, const char *suffix) {
    return st_error_set(l->err, ST_ERR_MISSING, "%s: no tensor '%s%s'", l->v->ck->dir, l->prefix, suffix);
}

static int float_dtype(st_dtype d) { return d == ST_DTYPE_F32 || d == ST_DTYPE_BF16 || d == ST_DTYPE_F16; }

static float to_f32(const st_tensor *t, int64_t i) {
    switch (t->dtype) {
    case ST_DTYPE_BF16: return st_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case ST_DTYPE_F16: return st_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

/* a float tensor of n elements (any shape with that many) as an owned fp32 copy */
static st_status vvec(vloader *l, const char *suffix, int64_t n, float **out) {
    const st_tensor *t = vfind(l, suffix);
    if (!t) return vmissing(l, suffix);
    if (!float_dtype(t->dtype))
        return st_error_set(l->err, ST_ERR_UNSUPPORTED, "%s: '%s%s' has dtype %s (expected F32, BF16 or F16)",
                            t->file, l->prefix, suffix, st_dtype_name(t->dtype));
    if (t->numel != n)
        return st_error_set(l->err, ST_ERR_SHAPE, "%s: '%s%s' has %lld elements, expected %lld", t->file, l->prefix,
                            suffix, (long long)t->numel, (long long)n);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) return st_error_set(l->err, ST_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) v[i] = to_f32(t, i);
    *out = v;
    return ST_OK;
}

/* a dense matrix [rows][cols] (a view of the mapping) */
static st_status vmat(vloader *l, const char *suffix, int64_t rows, int64_t cols, st_matrix *out) {
    char wname[512];
    snprintf(wname, sizeof wname, "%s.weight", suffix);
    const st_tensor *t = vfind(l, wname);
    if (!t) return vmissing(l, wname);
    char sname[512];
    snprintf(sname, sizeof sname, "%s.scales", suffix);
    if (vfind(l, sname))
        return st_error_set(l->err, ST_ERR_UNSUPPORTED, "%s: '%s%s' is quantized; quantized vision towers are not "
                                                        "supported yet", t->file, l->prefix, wname);
    if (!float_dtype(t->dtype))
        return st_error_set(l->err, ST_ERR_UNSUPPORTED, "%s: '%s%s' has dtype %s (expected F32, BF16 or F16)",
                            t->file, l->prefix, wname, st_dtype_name(t->dtype));
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return st_error_set(l->err, ST_ERR_SHAPE, "%s: '%s%s' must be [%lld, %lld]", t->file, l->prefix, wname,
                            (long long)rows, (long long)cols);
    memset(out, 0, sizeof *out);
    out->fmt = t->dtype == ST_DTYPE_BF16 ? ST_WFMT_BF16 : t->dtype == ST_DTYPE_F16 ? ST_WFMT_F16 : ST_WFMT_F32;
    out->rows = rows;
    out->cols = cols;
    out->data = t->data;
    return ST_OK;
}

/* The patch embedding: HF [hidden][C][T][P][P] is already the [hidden][patch_dim] matrix
 * (flattened channel, time, y, x: the pixel_values order); MLX [hidden][T][P][P][C] is
 * permuted into an fp32 copy. */
static st_status load_patch(vloader *l) {
    st_vision_tower *v = l->v;
    const st_vision_config *c = &v->cfg;
    const char *name = "patch_embed.proj.weight";
    const st_tensor *t = vfind(l, name);
    if (!t) return vmissing(l, name);
    const int64_t H = c->hidden, C = c->in_channels, T = c->temporal, P = c->patch, D = C * T * P * P;
    const int64_t hf[5] = {H, C, T, P, P}, mlx[5] = {H, T, P, P, C};
    const int is_hf = t->n_dims == 5 && !memcmp(t->shape, hf, sizeof hf);
    const int is_mlx = t->n_dims == 5 && !memcmp(t->shape, mlx, sizeof mlx);
    if (!float_dtype(t->dtype) || !(is_hf || is_mlx))
        return st_error_set(l->err, ST_ERR_SHAPE, "%s: '%s%s' must be [%lld, %lld, %lld, %lld, %lld] (or MLX's "
                                                  "[hidden, T, P, P, C]) of F32, BF16 or F16",
                            t->file, l->prefix, name, (long long)H, (long long)C, (long long)T, (long long)P,
                            (long long)P);
    memset(&v->patch, 0, sizeof v->patch);
    v->patch.rows = H;
    v->patch.cols = D;
    if (is_hf) {
        v->patch.fmt = t->dtype == ST_DTYPE_BF16 ? ST_WFMT_BF16 : t->dtype == ST_DTYPE_F16 ? ST_WFMT_F16 : ST_WFMT_F32;
        v->patch.data = t->data;
        return ST_OK;
    }
    float *w = malloc((size_t)(H * D) * sizeof(float));
    if (!w) return st_error_set(l->err, ST_ERR_NOMEM, "out of memory");
    for (int64_t o = 0; o < H; o++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t tt = 0; tt < T; tt++)
                for (int64_t y = 0; y < P; y++)
                    for (int64_t x = 0; x < P; x++)
                        w[o * D + ((ch * T + tt) * P + y) * P + x] = to_f32(t, (((o * T + tt) * P + y) * P + x) * C + ch);
    v->patch_f32 = w;
    v->patch.fmt = ST_WFMT_F32;
    v->patch.data = w;
    return ST_OK;
}

static st_status load_weights(vloader *l) {
    st_vision_tower *v = l->v;
    const st_vision_config *c = &v->cfg;
    const int64_t H = c->hidden, I = c->intermediate, M = (int64_t)c->merge * c->merge * H;
    st_status st;
    char b[160];
    if ((st = load_patch(l)) != ST_OK) return st;
    if ((st = vvec(l, "patch_embed.proj.bias", H, &v->patch_b)) != ST_OK) return st;
    if ((st = vvec(l, "pos_embed.weight", (int64_t)c->pos_side * c->pos_side * H, &v->pos)) != ST_OK) return st;
    v->blocks = calloc((size_t)c->depth, sizeof *v->blocks);
    if (!v->blocks) return st_error_set(l->err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->depth; i++) {
        st_vision_block *B = &v->blocks[i];
        struct { const char *s; int64_t n; float **p; } vecs[] = {
            {"norm1.weight", H, &B->norm1_w}, {"norm1.bias", H, &B->norm1_b},  {"norm2.weight", H, &B->norm2_w},
            {"norm2.bias", H, &B->norm2_b},   {"attn.qkv.bias", 3 * H, &B->qkv_b}, {"attn.proj.bias", H, &B->proj_b},
            {"mlp.linear_fc1.bias", I, &B->fc1_b}, {"mlp.linear_fc2.bias", H, &B->fc2_b},
        };
        for (size_t j = 0; j < sizeof vecs / sizeof vecs[0]; j++) {
            snprintf(b, sizeof b, "blocks.%d.%s", i, vecs[j].s);
            if ((st = vvec(l, b, vecs[j].n, vecs[j].p)) != ST_OK) return st;
        }
        struct { const char *s; int64_t r, c; st_matrix *m; } mats[] = {
            {"attn.qkv", 3 * H, H, &B->qkv},  {"attn.proj", H, H, &B->proj},
            {"mlp.linear_fc1", I, H, &B->fc1}, {"mlp.linear_fc2", H, I, &B->fc2},
        };
        for (size_t j = 0; j < sizeof mats / sizeof mats[0]; j++) {
            snprintf(b, sizeof b, "blocks.%d.%s", i, mats[j].s);
            if ((st = vmat(l, b, mats[j].r, mats[j].c, mats[j].m)) != ST_OK) return st;
        }
    }
    if ((st = vvec(l, "merger.norm.weight", H, &v->mnorm_w)) != ST_OK) return st;
    if ((st = vvec(l, "merger.norm.bias", H, &v->mnorm_b)) != ST_OK) return st;
    if ((st = vmat(l, "merger.linear_fc1", M, M, &v->mfc1)) != ST_OK) return st;
    if ((st = vvec(l, "merger.linear_fc1.bias", M, &v->mfc1_b)) != ST_OK) return st;
    if ((st = vmat(l, "merger.linear_fc2", c->out_hidden, M, &v->mfc2)) != ST_OK) return st;
    return vvec(l, "merger.linear_fc2.bias", c->out_hidden, &v->mfc2_b);
}

st_status st_vision_load(const char *dir, const st_kernels *k, st_vision_tower **out, st_error *err) {
    *out = NULL;
    st_vision_tower *v = calloc(1, sizeof *v);
    if (!v) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    v->k = k ? k : st_kernels_ref();
    st_status st = parse_config(dir, &v->cfg, err);
    if (st == ST_OK) st = st_checkpoint_open(dir, &v->ck, err);
    if (st == ST_OK) {
        static const char *prefixes[] = {"model.visual.", "visual.", "vision_tower."};
        vloader l = {v, NULL, err};
        for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !l.prefix; i++) {
            l.prefix = prefixes[i];
            if (!vfind(&l, "patch_embed.proj.weight")) l.prefix = NULL;
        }
        if (!l.prefix)
            st = st_error_set(err, ST_ERR_MISSING, "%s: no vision tower weights (model.visual.*, visual.* or "
                                                   "vision_tower.*)", dir);
        else st = load_weights(&l);
    }
    if (st != ST_OK) {
        st_vision_free(v);
        return st;
    }
    *out = v;
    return ST_OK;
}

void st_vision_free(st_vision_tower *v) {
    if (!v) return;
    if (v->blocks)
        for (int i = 0; i < v->cfg.depth; i++) {
            st_vision_block *B = &v->blocks[i];
            free(B->norm1_w), free(B->norm1_b), free(B->norm2_w), free(B->norm2_b);
            free(B->qkv_b), free(B->proj_b), free(B->fc1_b), free(B->fc2_b);
        }
    free(v->blocks);
    free(v->patch_f32);
    free(v->patch_b);
    free(v->pos);
    free(v->mnorm_w), free(v->mnorm_b), free(v->mfc1_b), free(v->mfc2_b);
    if (v->ck) st_checkpoint_close(v->ck);
    st_pool_destroy(v->pool);
    if (v->dev) v->dev->destroy(v->dev);
    free(v);
}

void st_vision_set_device(st_vision_tower *v, st_vision_device *d) {
    if (v->dev && v->dev != d) v->dev->destroy(v->dev);
    v->dev = d;
}

st_status st_vision_set_threads(st_vision_tower *v, int n, st_error *err) {
    st_pool_destroy(v->pool);
    v->pool = NULL;
    return n > 1 ? st_pool_create(n, &v->pool, err) : ST_OK;
}

int64_t st_vision_patch_dim(const st_vision_tower *v) {
    return (int64_t)v->cfg.in_channels * v->cfg.temporal * v->cfg.patch * v->cfg.patch;
}

/* ---- the forward pass ---- */

/* a product's rows split over the pool's threads (each output is one thread's, in the same
 * order whatever the split) */
typedef struct lin_job {
    const st_vision_tower *v;
    const st_matrix *w;
    const float *b, *x;
    int64_t n;
    float *y;
    float *scratch; /* [threads][scratch_n] */
    size_t scratch_n;
} lin_job;

static void lin_fn(void *ctx, int tid, int nth) {
    const lin_job *j = ctx;
    int64_t r0, r1;
    st_split_range(j->w->rows, nth, tid, 16, &r0, &r1);
    if (r0 >= r1) return;
    j->v->k->matmul(j->w, j->x, j->w->cols, j->n, j->y, j->w->rows, r0, r1, j->scratch + (size_t)tid * j->scratch_n);
    if (j->b)
        for (int64_t t = 0; t < j->n; t++)
            for (int64_t r = r0; r < r1; r++) j->y[t * j->w->rows + r] += j->b[r];
}

/* y[n][rows] = W x[n] + b */
static void linear(const st_vision_tower *v, const st_matrix *w, const float *b, const float *x, int64_t n, float *y,
                   float *scratch, size_t scratch_n) {
    lin_job j = {v, w, b, x, n, y, scratch, scratch_n};
    if (v->pool) st_pool_run(v->pool, lin_fn, &j);
    else lin_fn(&j, 0, 1);
}

/* attention of one (image, frame) segment [s0, s0 + L) of every head, its queries split over
 * the threads; sc: [threads][L] */
typedef struct att_job {
    const float *Q; /* [N][3H] q (rotated), k (rotated), v */
    float *O;       /* [N][H] */
    float *sc;
    int64_t s0, L, H, sc_n;
    int nh, hd;
} att_job;

static void att_fn(void *ctx, int tid, int nth) {
    const att_job *a = ctx;
    const int64_t H = a->H, total = (int64_t)a->nh * a->L;
    int64_t lo, hi;
    st_split_range(total, nth, tid, 1, &lo, &hi);
    float *sc = a->sc + (size_t)tid * (size_t)a->sc_n;
    const float scale = 1.0f / sqrtf((float)a->hd);
    for (int64_t u = lo; u < hi; u++) {
        const int h = (int)(u / a->L);
        const int64_t qi = a->s0 + u % a->L;
        const float *qv = a->Q + qi * 3 * H + (int64_t)h * a->hd;
        float mx = -INFINITY;
        int64_t kj = a->s0;
        /* 8 keys at a time: 8 independent sums, each still over e in order (the same bits) */
        for (; kj + 8 <= a->s0 + a->L; kj += 8) {
            const float *kv = a->Q + kj * 3 * H + H + (int64_t)h * a->hd;
            float dot[8] = {0};
            for (int e = 0; e < a->hd; e++) {
                const float q = qv[e];
                for (int j = 0; j < 8; j++) dot[j] += q * kv[j * 3 * H + e];
            }
            for (int j = 0; j < 8; j++) {
                sc[kj - a->s0 + j] = dot[j] * scale;
                if (sc[kj - a->s0 + j] > mx) mx = sc[kj - a->s0 + j];
            }
        }
        for (; kj < a->s0 + a->L; kj++) {
            const float *kv = a->Q + kj * 3 * H + H + (int64_t)h * a->hd;
            float dot = 0.0f;
            for (int e = 0; e < a->hd; e++) dot += qv[e] * kv[e];
            sc[kj - a->s0] = dot * scale;
            if (sc[kj - a->s0] > mx) mx = sc[kj - a->s0];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < a->L; j++) sum += sc[j] = expf(sc[j] - mx);
        float *o = a->O + qi * H + (int64_t)h * a->hd;
        for (int e = 0; e < a->hd; e++) o[e] = 0.0f;
        for (kj = a->s0; kj < a->s0 + a->L; kj++) {
            const float p = sc[kj - a->s0] / sum, *vv = a->Q + kj * 3 * H + 2 * H + (int64_t)h * a->hd;
            for (int e = 0; e < a->hd; e++) o[e] += p * vv[e];
        }
    }
}

/* LayerNorm of n rows of d: mean, biased variance (both summed in index order) */
static void layer_norm(const float *x, int64_t n, int64_t d, const float *w, const float *b, float *y) {
    for (int64_t t = 0; t < n; t++) {
        const float *r = x + t * d;
        float mean = 0.0f, var = 0.0f;
        for (int64_t i = 0; i < d; i++) mean += r[i];
        mean /= (float)d;
        for (int64_t i = 0; i < d; i++) var += (r[i] - mean) * (r[i] - mean);
        var /= (float)d;
        const float inv = 1.0f / sqrtf(var + LN_EPS);
        for (int64_t i = 0; i < d; i++) y[t * d + i] = (r[i] - mean) * inv * w[i] + b[i];
    }
}

static float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
static float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

/* torch.linspace(0, end, n) in float32: the first half counted from the start, the rest
 * from the end */
static float linspace_at(float end, int64_t n, int64_t i) {
    if (n == 1) return 0.0f;
    const float step = end / (float)(n - 1);
    return i < n / 2 ? step * (float)i : end - step * (float)(n - 1 - i);
}

/* the patch of merge-block order index i in an h x w grid: its row and column */
static void patch_coords(int64_t i, int64_t w, int m, int64_t *ph, int64_t *pw) {
    const int64_t blk = i / ((int64_t)m * m), in = i % ((int64_t)m * m), bw = w / m;
    *ph = (blk / bw) * m + in / m;
    *pw = (blk % bw) * m + in % m;
}

/* The patch embedding's position rows (pos [N][H], the learned table interpolated to each
 * image's grid) and the rotary tables (cs, sn [N][hd]), per image in merge-block order,
 * each frame; seg[n_seg] the (first patch, patches) of each frame. */
static void vision_positions(const st_vision_tower *v, const int32_t (*grid)[3], int n_img, float *pos, float *cs,
                             float *sn, int64_t (*seg)[2]) {
    const st_vision_config *c = &v->cfg;
    const int m = c->merge, S = c->pos_side, hd = c->head_dim;
    const int64_t H = c->hidden;
    const int q = hd / 4; /* frequencies per axis */
    int64_t at = 0;
    int ns = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t t = grid[i][0], h = grid[i][1], w = grid[i][2];
        for (int64_t f = 0; f < t; f++) {
            seg[ns][0] = at;
            seg[ns][1] = h * w;
            ns++;
            for (int64_t j = 0; j < h * w; j++, at++) {
                int64_t ph, pw;
                patch_coords(j, w, m, &ph, &pw);
                const float ys = linspace_at((float)(S - 1), h, ph), xs = linspace_at((float)(S - 1), w, pw);
                const int64_t y0 = (int64_t)ys, x0 = (int64_t)xs;
                const int64_t y1 = y0 + 1 < S ? y0 + 1 : S - 1, x1 = x0 + 1 < S ? x0 + 1 : S - 1;
                const float dy = ys - (float)y0, dx = xs - (float)x0;
                const float w00 = (1 - dy) * (1 - dx), w01 = (1 - dy) * dx, w10 = dy * (1 - dx), w11 = dy * dx;
                const float *p00 = v->pos + (y0 * S + x0) * H, *p01 = v->pos + (y0 * S + x1) * H;
                const float *p10 = v->pos + (y1 * S + x0) * H, *p11 = v->pos + (y1 * S + x1) * H;
                float *e = pos + at * H;
                for (int64_t d = 0; d < H; d++) e[d] = ((w00 * p00[d] + w01 * p01[d]) + w10 * p10[d]) + w11 * p11[d];
                for (int k = 0; k < q; k++) {
                    const double inv = 1.0 / pow(c->rope_theta, (double)(2 * k) / (double)(hd / 2));
                    const float ah = (float)ph * (float)inv, aw = (float)pw * (float)inv;
                    const float a4[2] = {ah, aw};
                    for (int ax = 0; ax < 2; ax++) {
                        const float ang = a4[ax];
                        for (int rep = 0; rep < 2; rep++) {
                            const int64_t jj = at * hd + rep * (hd / 2) + ax * q + k;
                            cs[jj] = cosf(ang);
                            sn[jj] = sinf(ang);
                        }
                    }
                }
            }
        }
    }
}

/* The tower's arithmetic on the host's kernels: E [N][H] holds the position rows on entry */
static st_status encode_host(const st_vision_tower *v, const float *pixels, int64_t N, float *E, const float *cs,
                             const float *sn, const int64_t (*seg)[2], int n_seg, float *out, st_error *err) {
    const st_vision_config *c = &v->cfg;
    const int m = c->merge, nh = c->heads, hd = c->head_dim;
    const int64_t H = c->hidden, I = c->intermediate, D = st_vision_patch_dim(v);
    const int64_t W3 = 3 * H > I ? 3 * H : I;
    int64_t widest = D > I ? D : I;
    if ((int64_t)m * m * H > widest) widest = (int64_t)m * m * H;
    const size_t scratch_n = (size_t)st_kernels_matmul_scratch(widest) + 16;
    float *A = malloc((size_t)(N * H) * sizeof(float));
    float *Q = malloc((size_t)(N * W3) * sizeof(float)), *O = malloc((size_t)(N * H) * sizeof(float));
    const int nth = v->pool ? st_pool_size(v->pool) : 1;
    const size_t scratch_t = (scratch_n + 15) / 16 * 16; /* each thread's, 64-byte aligned */
    float *sc = malloc((size_t)N * (size_t)nth * sizeof(float));
    float *scratch = aligned_alloc(64, scratch_t * (size_t)nth * sizeof(float));
    st_status st = ST_OK;
    if (!A || !Q || !O || !sc || !scratch) {
        st = st_error_set(err, ST_ERR_NOMEM, "vision tower: out of memory for %lld patches", (long long)N);
        goto done;
    }
    /* 1. patch embedding, 2. plus the interpolated positions */
    linear(v, &v->patch, v->patch_b, pixels, N, A, scratch, scratch_t);
    for (int64_t i = 0; i < N * H; i++) E[i] = A[i] + E[i];
    /* 4-5. the blocks; attention within each (image, frame) segment */
    for (int b = 0; b < c->depth; b++) {
        const st_vision_block *B = &v->blocks[b];
        layer_norm(E, N, H, B->norm1_w, B->norm1_b, A);
        linear(v, &B->qkv, B->qkv_b, A, N, Q, scratch, scratch_t);
        const int half = hd / 2;
        for (int64_t n = 0; n < N; n++) /* 3. rotary on q and k */
            for (int part = 0; part < 2; part++)
                for (int h = 0; h < nh; h++) {
                    float *x = Q + n * 3 * H + part * H + (int64_t)h * hd;
                    const float *cn = cs + n * hd, *sn_ = sn + n * hd;
                    for (int j = 0; j < half; j++) {
                        const float x0 = x[j], x1 = x[j + half];
                        x[j] = x0 * cn[j] - x1 * sn_[j];
                        x[j + half] = x1 * cn[j + half] + x0 * sn_[j + half];
                    }
                }
        for (int si = 0; si < n_seg; si++) {
            att_job aj = {Q, O, sc, seg[si][0], seg[si][1], H, N, nh, hd};
            if (v->pool) st_pool_run(v->pool, att_fn, &aj);
            else att_fn(&aj, 0, 1);
        }
        linear(v, &B->proj, B->proj_b, O, N, A, scratch, scratch_t);
        for (int64_t i = 0; i < N * H; i++) E[i] += A[i];
        layer_norm(E, N, H, B->norm2_w, B->norm2_b, A);
        linear(v, &B->fc1, B->fc1_b, A, N, Q, scratch, scratch_t);
        for (int64_t i = 0; i < N * I; i++) Q[i] = gelu_tanh(Q[i]);
        linear(v, &B->fc2, B->fc2_b, Q, N, A, scratch, scratch_t);
        for (int64_t i = 0; i < N * H; i++) E[i] += A[i];
    }
    /* 6. the merger: each block of merge^2 consecutive patches concatenated (rows of 4H) */
    {
        const int64_t NM = N / ((int64_t)m * m), M = (int64_t)m * m * H;
        layer_norm(E, N, H, v->mnorm_w, v->mnorm_b, A); /* A is [NM][M] as it lies */
        float *Y = malloc((size_t)(NM * M) * sizeof(float));
        if (!Y) {
            st = st_error_set(err, ST_ERR_NOMEM, "vision tower: out of memory");
            goto done;
        }
        linear(v, &v->mfc1, v->mfc1_b, A, NM, Y, scratch, scratch_t);
        for (int64_t i = 0; i < NM * M; i++) Y[i] = gelu_erf(Y[i]);
        linear(v, &v->mfc2, v->mfc2_b, Y, NM, out, scratch, scratch_t);
        free(Y);
    }
done:
    free(A), free(Q), free(O), free(sc), free(scratch);
    return st;
}

st_status st_vision_encode(const st_vision_tower *v, const float *pixels, const int32_t (*grid)[3], int n_img,
                           float *out, st_error *err) {
    const st_vision_config *c = &v->cfg;
    const int m = c->merge, hd = c->head_dim;
    const int64_t H = c->hidden;
    int64_t N = 0, n_seg = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t t = grid[i][0], h = grid[i][1], w = grid[i][2];
        if (t < 1 || h < 1 || w < 1 || h % m || w % m || t * h * w > ((int64_t)1 << 26))
            return st_error_set(err, ST_ERR_ARG, "image %d: grid %lldx%lldx%lld must be positive with h and w "
                                                 "multiples of %d", i, (long long)t, (long long)h, (long long)w, m);
        N += t * h * w;
        n_seg += t;
    }
    if (n_seg > INT32_MAX) return st_error_set(err, ST_ERR_ARG, "vision tower: %lld frames", (long long)n_seg);
    float *E = malloc((size_t)(N * H) * sizeof(float));
    float *cs = malloc((size_t)(N * hd) * sizeof(float)), *sn = malloc((size_t)(N * hd) * sizeof(float));
    int64_t(*seg)[2] = malloc((size_t)(n_seg ? n_seg : 1) * sizeof *seg);
    st_status st;
    if (!E || !cs || !sn || !seg) {
        st = st_error_set(err, ST_ERR_NOMEM, "vision tower: out of memory for %lld patches", (long long)N);
    } else {
        vision_positions(v, grid, n_img, E, cs, sn, seg);
        st = v->dev ? v->dev->encode(v->dev, pixels, N, E, cs, sn, (const int64_t(*)[2])seg, (int)n_seg, out, err)
                    : encode_host(v, pixels, N, E, cs, sn, (const int64_t(*)[2])seg, (int)n_seg, out, err);
    }
    free(E), free(cs), free(sn), free(seg);
    return st;
}
