/* ==== Synthetic checkpoints (see synth.h) ==== */
#include "model/synth.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/numeric.h"
#include "core/strmap.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tensor/matrix.h"

st_synth_params st_synth_default_params(void) {
    st_synth_params p = {0};
    p.seed = 1;
    p.poison_token = -1;
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* presets */

typedef struct preset {
    const char *name;
    int64_t vocab, d, inter;
    int layers, heads, kv, hd, hk, hv, dk, dv, tied;
    int experts, topk;
    int64_t moe_inter, shared_inter, max_pos;
    int32_t eos[2];
} preset;

static const preset presets[] = {
    /* tiny: the Qwen3 tokenizer's 151,936-row embedding, everything else minimal */
    {"tiny", 151936, 32, 64, 4, 2, 1, 32, 2, 4, 16, 16, 1, 0, 0, 0, 0, 32768, {151645, 151643}},
    {"tiny-moe", 151936, 32, 0, 4, 2, 1, 32, 2, 4, 16, 16, 1, 8, 2, 32, 32, 32768, {151645, 151643}},
    {"0.8b", 248320, 1024, 3584, 24, 8, 2, 256, 16, 16, 128, 128, 1, 0, 0, 0, 0, 262144, {248046, 248044}},
    {"2b", 248320, 2048, 6144, 24, 8, 2, 256, 16, 16, 128, 128, 1, 0, 0, 0, 0, 262144, {248046, 248044}},
    {"4b", 248320, 2560, 9216, 32, 16, 4, 256, 16, 32, 128, 128, 1, 0, 0, 0, 0, 262144, {248046, 248044}},
    {"9b", 248320, 4096, 12288, 32, 16, 4, 256, 16, 32, 128, 128, 0, 0, 0, 0, 0, 262144, {248046, 248044}},
    {"27b", 248320, 5120, 17408, 64, 24, 4, 256, 16, 48, 128, 128, 0, 0, 0, 0, 0, 262144, {248046, 248044}},
    {"35b-a3b", 248320, 2048, 0, 40, 16, 2, 256, 16, 32, 128, 128, 0, 256, 8, 512, 512, 262144, {248046, 248044}},
};

const char *const *st_synth_presets(void) {
    static const char *names[sizeof presets / sizeof presets[0] + 1];
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) names[i] = presets[i].name;
    return names;
}

static int config_from_preset(const char *name, st_config *c) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        memset(c, 0, sizeof *c);
        snprintf(c->model_type, sizeof c->model_type, "%s", p->experts ? "qwen3_5_moe_text" : "qwen3_5_text");
        snprintf(c->architecture, sizeof c->architecture, "%s",
                 p->experts ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM");
        c->is_moe = p->experts > 0;
        c->vocab_size = p->vocab;
        c->hidden_size = p->d;
        c->intermediate_size = p->inter;
        c->n_layers = p->layers;
        c->n_heads = p->heads;
        c->n_kv_heads = p->kv;
        c->head_dim = p->hd;
        c->rms_norm_eps = 1e-6f;
        c->conv_kernel = 4;
        c->lin_key_head_dim = p->dk;
        c->lin_value_head_dim = p->dv;
        c->lin_n_key_heads = p->hk;
        c->lin_n_value_heads = p->hv;
        c->full_attention_interval = 4;
        for (int l = 0; l < c->n_layers; l++)
            c->layer_kind[l] = (l + 1) % 4 == 0 ? ST_LAYER_FULL : ST_LAYER_LINEAR;
        c->rope_theta = 1e7;
        c->partial_rotary_factor = 0.25;
        c->rope_dim = (int)(p->hd * 0.25);
        c->mrope_section[0] = 11;
        c->mrope_section[1] = 11;
        c->mrope_section[2] = 10;
        c->mrope_interleaved = 1;
        c->max_position_embeddings = p->max_pos;
        c->tie_word_embeddings = p->tied;
        c->n_experts = p->experts;
        c->n_experts_per_tok = p->topk;
        c->moe_intermediate_size = p->moe_inter;
        c->shared_expert_intermediate_size = p->shared_inter;
        c->norm_topk_prob = 1;
        c->eos_ids[0] = p->eos[0];
        c->eos_ids[1] = p->eos[1];
        c->n_eos = 2;
        c->image_token_id = c->video_token_id = c->vision_start_token_id = c->vision_end_token_id = -1;
        return 0;
    }
    return -1;
}

st_status st_synth_preset_config(const char *name, st_config *out, st_error *err) {
    if (name && config_from_preset(name, out) == 0) return ST_OK;
    return st_error_set(err, ST_ERR_ARG, "unknown preset '%s' (tiny, tiny-moe, 0.8b, 2b, 4b, 9b, 27b, 35b-a3b)",
                        name ? name : "");
}

/* ---------------------------------------------------------------------------------------- */
/* the plan: every stored tensor and where its values come from */

typedef enum src_kind { SRC_MATRIX, SRC_NORM_ZC, SRC_NORM_PLAIN, SRC_CONV, SRC_ALOG, SRC_DTBIAS, SRC_BIAS } src_kind;
typedef enum part { PART_DENSE, PART_QWEIGHT, PART_QSCALES, PART_QBIASES } part;

/* script mode: each scripted token's one-hot slot in the embedding (-1 = not scripted), the
 * token that follows each slot, and which tokens follow some scripted token */
typedef struct script_map {
    int32_t *slot;         /* [vocab] */
    uint8_t *is_next;      /* [vocab] */
    int32_t next[1024];    /* [d] successor of the token in slot k, -1 = none */
    int64_t d;
} script_map;

typedef struct tplan {
    char name[200];      /* stored name */
    char module[200];    /* MLX module path (name without .weight/.scales/.biases) */
    uint64_t key;        /* hash of the logical (HF) name: the seed of its values */
    src_kind kind;
    part part;
    st_dtype dtype;
    int n_dims;
    int64_t shape[5];    /* stored shape */
    int64_t cols;        /* source row width (last dim of the source) */
    int bits, group;
    float scale;         /* matrices: half-width of the uniform distribution */
    int mlx;             /* norms stored as 1+w */
    int shard;
    int role;            /* 1 embedding, 2 LM head, 0 other */
    int64_t poison_row;  /* the embedding's NaN row, else -1 */
    const script_map *sm;/* script mode, else NULL */
} tplan;

typedef struct planner {
    tplan *t;
    int n, cap;
    const st_synth_params *p;
    const st_config *c;
    int group;           /* chosen group size */
    json_t *overrides;   /* MLX per-module quantization overrides */
    const script_map *sm;/* script mode, else NULL */
    uint64_t seed;
    st_error *err;
    int failed;
} planner;

static float source_value(const tplan *t, uint64_t i) {
    if (t->poison_row >= 0 && t->kind == SRC_MATRIX && (int64_t)(i / (uint64_t)t->cols) == t->poison_row)
        return NAN;
    float u = st_unif_hash(t->key, i);
    if (t->sm) { /* scripted model: one-hot embeddings, successor head, zero elsewhere */
        const script_map *sm = t->sm;
        if (t->kind == SRC_MATRIX) {
            if (t->role == 0) return 0.0f;
            int64_t r = (int64_t)(i / (uint64_t)sm->d), col = (int64_t)(i % (uint64_t)sm->d);
            if (t->role == 1) return sm->slot[r] >= 0 ? (col == sm->slot[r] ? 1.0f : 0.0f) : 0.01f * u;
            if (sm->is_next[r]) return sm->next[col] == r ? 10.0f : 0.0f;
            return 0.01f * u;
        }
        if (t->kind == SRC_NORM_ZC) return t->mlx ? 1.0f : 0.0f;
    }
    switch (t->kind) {
    case SRC_MATRIX: return u * t->scale; /* std 1/sqrt(cols) */
    case SRC_NORM_ZC: { /* HF stores w; mlx-lm stores 1+w computed in bf16 from that w */
        float w = st_bf16_to_f32(st_f32_to_bf16(0.1f * u));
        return t->mlx ? st_bf16_to_f32(st_f32_to_bf16(1.0f + w)) : w;
    }
    case SRC_NORM_PLAIN: return 1.0f + 0.1f * u;
    case SRC_CONV: return 0.5f * u;
    case SRC_ALOG: return logf(8.5f + 7.5f * u); /* log(uniform(1, 16)) */
    case SRC_DTBIAS: return 1.0f + 0.1f * u;
    case SRC_BIAS: return 0.02f * u;
    }
    return 0;
}

static tplan *add(planner *pl) {
    if (pl->n == pl->cap) {
        int ncap = pl->cap ? pl->cap * 2 : 256;
        tplan *nt = realloc(pl->t, (size_t)ncap * sizeof *nt);
        if (!nt) {
            pl->failed = 1;
            return NULL;
        }
        pl->t = nt;
        pl->cap = ncap;
    }
    tplan *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    t->poison_row = -1;
    t->mlx = pl->p->bits != 0;
    t->sm = pl->sm;
    return t;
}

static void fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, cap, f, ap);
    va_end(ap);
}

/* The stored name of logical HF name `hf` ("model.layers.0.x.weight", "lm_head.weight"). */
static void stored_name(const planner *pl, const char *hf, char *out, size_t cap) {
    if (!pl->p->bits) fmt(out, cap, "%s", hf);
    else if (strncmp(hf, "model.", 6) == 0) fmt(out, cap, "language_model.model.%s", hf + 6);
    else fmt(out, cap, "language_model.%s", hf);
}

static void add_vector(planner *pl, const char *hf, src_kind kind, int n_dims, const int64_t *shape,
                       st_dtype dt) {
    tplan *t = add(pl);
    if (!t) return;
    stored_name(pl, hf, t->name, sizeof t->name);
    t->key = st_hash_bytes(hf, strlen(hf)) ^ st_splitmix64(pl->seed);
    t->kind = kind;
    t->part = PART_DENSE;
    t->dtype = dt;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
    t->cols = shape[n_dims - 1];
}

/* A (possibly stacked) matrix [stack][rows][cols]; hf_base without ".weight". */
static void add_matrix(planner *pl, const char *hf_base, int64_t stack, int64_t rows, int64_t cols,
                       int bits_override) {
    char hf[256], module[200];
    fmt(hf, sizeof hf, "%s.weight", hf_base);
    uint64_t key = st_hash_bytes(hf, strlen(hf)) ^ st_splitmix64(pl->seed);
    int bits = bits_override ? bits_override : pl->p->bits;
    int group = pl->group;
    if (bits_override && cols % 64 == 0) group = 64;
    int quant = bits && cols % group == 0 && (cols * bits) % 32 == 0;
    stored_name(pl, hf_base, module, sizeof module);
    int nd = stack ? 3 : 2;
    for (int pt = quant ? PART_QWEIGHT : PART_DENSE; pt <= (quant ? PART_QBIASES : PART_DENSE); pt++) {
        tplan *t = add(pl);
        if (!t) return;
        static const char *suffix[] = {".weight", ".weight", ".scales", ".biases"};
        fmt(t->name, sizeof t->name, "%s%s", module, suffix[pt]);
        fmt(t->module, sizeof t->module, "%s", module);
        t->key = key;
        t->kind = SRC_MATRIX;
        t->role = !strcmp(hf_base, "model.embed_tokens") ? 1 : !strcmp(hf_base, "lm_head") ? 2 : 0;
        if (t->role == 1) t->poison_row = pl->p->poison_token;
        t->part = (enum part)pt;
        t->n_dims = nd;
        if (stack) t->shape[0] = stack;
        t->shape[nd - 2] = rows;
        t->cols = cols;
        t->scale = sqrtf(3.0f / (float)cols);
        t->bits = bits;
        t->group = group;
        switch (pt) {
        case PART_DENSE: t->dtype = ST_DTYPE_BF16; t->shape[nd - 1] = cols; break;
        case PART_QWEIGHT: t->dtype = ST_DTYPE_U32; t->shape[nd - 1] = cols * bits / 32; break;
        default: t->dtype = ST_DTYPE_BF16; t->shape[nd - 1] = cols / group; break;
        }
    }
    if (quant && bits_override && pl->overrides)
        json_object_set_new(pl->overrides, module, json_pack("{s:i,s:i}", "group_size", group, "bits", bits));
}

/* A dense bf16 tensor under its own name (the vision tower's: never quantized, never renamed);
 * matrices (SRC_MATRIX) take a uniform of std 1/sqrt(fan_in). */
static void add_dense(planner *pl, const char *name, src_kind kind, int n_dims, const int64_t *shape, int64_t fan_in) {
    tplan *t = add(pl);
    if (!t) return;
    fmt(t->name, sizeof t->name, "%s", name);
    t->key = st_hash_bytes(name, strlen(name)) ^ st_splitmix64(pl->seed);
    t->kind = kind;
    t->part = PART_DENSE;
    t->dtype = ST_DTYPE_BF16;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
    t->cols = shape[n_dims - 1];
    t->scale = sqrtf(3.0f / (float)fan_in);
    t->mlx = 0;
    t->sm = NULL;
}

/* the synthetic vision tower's shapes (st_synth_params.vision): the tests' small one, and
 * Qwen3.5's (spec/vision.md 10: every qwen3_5 vision config seen) with its processor's pixel
 * bounds */
typedef struct synth_vision {
    int depth, hidden, heads, inter, npos;
    long min_pixels, max_pixels;
} synth_vision;
static const synth_vision SV[3] = {{0}, {2, 64, 2, 128, 64, 4096, 65536}, {27, 1152, 16, 4304, 2304, 65536, 16777216}};

static void plan_vision(planner *pl, const synth_vision *sv) {
    const int64_t H = sv->hidden, I = sv->inter, M = 4 * (int64_t)sv->hidden, D = pl->c->hidden_size;
    char b[160];
    const int64_t patch[5] = {H, 3, 2, 16, 16}, pos[2] = {sv->npos, H}, h1 = H, m1 = M, i1 = I, d1 = D;
    add_dense(pl, "model.visual.patch_embed.proj.weight", SRC_MATRIX, 5, patch, 3 * 2 * 16 * 16);
    add_dense(pl, "model.visual.patch_embed.proj.bias", SRC_BIAS, 1, &h1, 1);
    add_dense(pl, "model.visual.pos_embed.weight", SRC_MATRIX, 2, pos, H);
    for (int i = 0; i < sv->depth; i++) {
        struct { const char *s; src_kind k; int nd; int64_t r, c; } t[] = {
            {"norm1.weight", SRC_NORM_PLAIN, 1, H, 0}, {"norm1.bias", SRC_BIAS, 1, H, 0},
            {"norm2.weight", SRC_NORM_PLAIN, 1, H, 0}, {"norm2.bias", SRC_BIAS, 1, H, 0},
            {"attn.qkv.weight", SRC_MATRIX, 2, 3 * H, H}, {"attn.qkv.bias", SRC_BIAS, 1, 3 * H, 0},
            {"attn.proj.weight", SRC_MATRIX, 2, H, H},    {"attn.proj.bias", SRC_BIAS, 1, H, 0},
            {"mlp.linear_fc1.weight", SRC_MATRIX, 2, I, H}, {"mlp.linear_fc1.bias", SRC_BIAS, 1, I, 0},
            {"mlp.linear_fc2.weight", SRC_MATRIX, 2, H, I}, {"mlp.linear_fc2.bias", SRC_BIAS, 1, H, 0},
        };
        for (size_t j = 0; j < sizeof t / sizeof t[0]; j++) {
            fmt(b, sizeof b, "model.visual.blocks.%d.%s", i, t[j].s);
            const int64_t sh[2] = {t[j].r, t[j].c};
            add_dense(pl, b, t[j].k, t[j].nd, sh, t[j].nd == 2 ? t[j].c : 1);
        }
    }
    add_dense(pl, "model.visual.merger.norm.weight", SRC_NORM_PLAIN, 1, &h1, 1);
    add_dense(pl, "model.visual.merger.norm.bias", SRC_BIAS, 1, &h1, 1);
    const int64_t f1[2] = {M, M}, f2[2] = {D, M};
    add_dense(pl, "model.visual.merger.linear_fc1.weight", SRC_MATRIX, 2, f1, M);
    add_dense(pl, "model.visual.merger.linear_fc1.bias", SRC_BIAS, 1, &m1, 1);
    add_dense(pl, "model.visual.merger.linear_fc2.weight", SRC_MATRIX, 2, f2, M);
    add_dense(pl, "model.visual.merger.linear_fc2.bias", SRC_BIAS, 1, &d1, 1);
    (void)i1;
}

/* the image token ids: the tokenizer's added tokens when it is copied, else the last 4 ids */
static void vision_ids(const st_synth_params *p, const st_config *c, int64_t ids[4]) {
    static const char *names[4] = {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"};
    for (int k = 0; k < 4; k++) ids[k] = c->vocab_size - 4 + k;
    if (!p->tokenizer_dir) return;
    char path[4096];
    if (st_path_join(path, sizeof path, p->tokenizer_dir, "tokenizer.json", NULL) != ST_OK) return;
    json_t *root = json_load_file(path, 0, NULL), *added = root ? json_object_get(root, "added_tokens") : NULL;
    size_t i;
    json_t *t;
    json_array_foreach(added, i, t) {
        const char *content = json_string_value(json_object_get(t, "content"));
        json_t *id = json_object_get(t, "id");
        for (int k = 0; content && json_is_integer(id) && k < 4; k++)
            if (!strcmp(content, names[k]) && json_integer_value(id) < c->vocab_size) ids[k] = json_integer_value(id);
    }
    json_decref(root);
}

static void plan_model(planner *pl) {
    const st_config *c = pl->c;
    const int64_t d = c->hidden_size, V = c->vocab_size;
    const int mixed = pl->p->mixed && pl->p->bits;
    char b[256];
    int64_t one = d;
    add_matrix(pl, "model.embed_tokens", 0, V, d, 0);
    add_vector(pl, "model.norm.weight", SRC_NORM_ZC, 1, &one, ST_DTYPE_BF16);
    if (!c->tie_word_embeddings) add_matrix(pl, "lm_head", 0, V, d, mixed ? 8 : 0);
    int first_full = -1, last_full = -1;
    for (int i = 0; i < c->n_layers; i++)
        if (c->layer_kind[i] == ST_LAYER_FULL) {
            if (first_full < 0) first_full = i;
            last_full = i;
        }
    for (int i = 0; i < c->n_layers; i++) {
        int edge = i == 0 || i == c->n_layers - 1;
        fmt(b, sizeof b, "model.layers.%d.input_layernorm.weight", i);
        add_vector(pl, b, SRC_NORM_ZC, 1, &one, ST_DTYPE_BF16);
        fmt(b, sizeof b, "model.layers.%d.post_attention_layernorm.weight", i);
        add_vector(pl, b, SRC_NORM_ZC, 1, &one, ST_DTYPE_BF16);
        if (c->layer_kind[i] == ST_LAYER_LINEAR) {
            int64_t cd = st_config_conv_dim(c), vd = st_config_value_dim(c), hv = c->lin_n_value_heads;
            fmt(b, sizeof b, "model.layers.%d.linear_attn.in_proj_qkv", i);
            add_matrix(pl, b, 0, cd, d, 0);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.in_proj_z", i);
            add_matrix(pl, b, 0, vd, d, 0);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.in_proj_b", i);
            add_matrix(pl, b, 0, hv, d, 0);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.in_proj_a", i);
            add_matrix(pl, b, 0, hv, d, 0);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.out_proj", i);
            add_matrix(pl, b, 0, d, vd, 0);
            int64_t conv_hf[3] = {cd, 1, c->conv_kernel}, conv_mlx[3] = {cd, c->conv_kernel, 1};
            fmt(b, sizeof b, "model.layers.%d.linear_attn.conv1d.weight", i);
            add_vector(pl, b, SRC_CONV, 3, pl->p->bits ? conv_mlx : conv_hf, ST_DTYPE_BF16);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.dt_bias", i);
            add_vector(pl, b, SRC_DTBIAS, 1, &hv, ST_DTYPE_BF16);
            fmt(b, sizeof b, "model.layers.%d.linear_attn.A_log", i);
            add_vector(pl, b, SRC_ALOG, 1, &hv, ST_DTYPE_F32);
            int64_t dv = c->lin_value_head_dim;
            fmt(b, sizeof b, "model.layers.%d.linear_attn.norm.weight", i);
            add_vector(pl, b, SRC_NORM_PLAIN, 1, &dv, pl->p->bits ? ST_DTYPE_BF16 : ST_DTYPE_F32);
        } else {
            int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
            fmt(b, sizeof b, "model.layers.%d.self_attn.q_proj", i);
            add_matrix(pl, b, 0, 2 * nh * hd, d, 0);
            fmt(b, sizeof b, "model.layers.%d.self_attn.k_proj", i);
            add_matrix(pl, b, 0, nkv * hd, d, 0);
            fmt(b, sizeof b, "model.layers.%d.self_attn.v_proj", i);
            add_matrix(pl, b, 0, nkv * hd, d, mixed && (i == first_full || i == last_full) ? 8 : 0);
            fmt(b, sizeof b, "model.layers.%d.self_attn.o_proj", i);
            add_matrix(pl, b, 0, d, nh * hd, 0);
            fmt(b, sizeof b, "model.layers.%d.self_attn.q_norm.weight", i);
            add_vector(pl, b, SRC_NORM_ZC, 1, &hd, ST_DTYPE_BF16);
            fmt(b, sizeof b, "model.layers.%d.self_attn.k_norm.weight", i);
            add_vector(pl, b, SRC_NORM_ZC, 1, &hd, ST_DTYPE_BF16);
        }
        if (!c->is_moe) {
            int64_t I = c->intermediate_size;
            fmt(b, sizeof b, "model.layers.%d.mlp.gate_proj", i);
            add_matrix(pl, b, 0, I, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.up_proj", i);
            add_matrix(pl, b, 0, I, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.down_proj", i);
            add_matrix(pl, b, 0, d, I, mixed && edge ? 8 : 0);
            continue;
        }
        int64_t E = c->n_experts, Ie = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
        int gate_bits = pl->p->bits ? 8 : 0; /* mlx-lm keeps routers at 8 bits */
        fmt(b, sizeof b, "model.layers.%d.mlp.gate", i);
        add_matrix(pl, b, 0, E, d, gate_bits);
        if (pl->p->bits) {
            fmt(b, sizeof b, "model.layers.%d.mlp.switch_mlp.gate_proj", i);
            add_matrix(pl, b, E, Ie, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.switch_mlp.up_proj", i);
            add_matrix(pl, b, E, Ie, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.switch_mlp.down_proj", i);
            add_matrix(pl, b, E, d, Ie, 0);
        } else {
            for (int64_t e = 0; e < E; e++) {
                fmt(b, sizeof b, "model.layers.%d.mlp.experts.%lld.gate_proj", i, (long long)e);
                add_matrix(pl, b, 0, Ie, d, 0);
                fmt(b, sizeof b, "model.layers.%d.mlp.experts.%lld.up_proj", i, (long long)e);
                add_matrix(pl, b, 0, Ie, d, 0);
                fmt(b, sizeof b, "model.layers.%d.mlp.experts.%lld.down_proj", i, (long long)e);
                add_matrix(pl, b, 0, d, Ie, 0);
            }
        }
        if (Is > 0) {
            fmt(b, sizeof b, "model.layers.%d.mlp.shared_expert.gate_proj", i);
            add_matrix(pl, b, 0, Is, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.shared_expert.up_proj", i);
            add_matrix(pl, b, 0, Is, d, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.shared_expert.down_proj", i);
            add_matrix(pl, b, 0, d, Is, 0);
            fmt(b, sizeof b, "model.layers.%d.mlp.shared_expert_gate", i);
            add_matrix(pl, b, 0, 1, d, gate_bits);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* producing bytes */

typedef struct fill_ctx {
    tplan *plans;      /* the plans of the shard being written, in write order */
    float *row;        /* [max cols] */
    uint32_t *packed;  /* [max cols] */
    uint16_t *sc, *bi; /* [max cols] */
} fill_ctx;

static st_status fill(void *vctx, int index, int64_t row0, int64_t nrows, void *buf, st_error *err) {
    fill_ctx *fc = vctx;
    const tplan *t = &fc->plans[index];
    (void)err;
    if (t->part == PART_DENSE) {
        int64_t last = t->shape[t->n_dims - 1];
        if (t->n_dims < 2) last = t->shape[0];
        uint64_t e0 = (uint64_t)(row0 * last), n = (uint64_t)(nrows * last);
        if (t->dtype == ST_DTYPE_F32) {
            float *o = buf;
            for (uint64_t i = 0; i < n; i++) o[i] = source_value(t, e0 + i);
        } else {
            uint16_t *o = buf;
            for (uint64_t i = 0; i < n; i++) o[i] = st_f32_to_bf16(source_value(t, e0 + i));
        }
        return ST_OK;
    }
    /* quantized parts: one stored row per source row */
    const int64_t cols = t->cols, words = cols * t->bits / 32, ng = cols / t->group;
    for (int64_t r = 0; r < nrows; r++) {
        uint64_t e0 = (uint64_t)((row0 + r) * cols);
        for (int64_t j = 0; j < cols; j++) fc->row[j] = st_bf16_to_f32(st_f32_to_bf16(source_value(t, e0 + (uint64_t)j)));
        st_affine_quantize_row(fc->row, cols, t->bits, t->group, fc->packed, fc->sc, fc->bi);
        if (t->part == PART_QWEIGHT) memcpy((uint32_t *)buf + r * words, fc->packed, (size_t)words * 4);
        else if (t->part == PART_QSCALES) memcpy((uint16_t *)buf + r * ng, fc->sc, (size_t)ng * 2);
        else memcpy((uint16_t *)buf + r * ng, fc->bi, (size_t)ng * 2);
    }
    return ST_OK;
}

static size_t plan_bytes(const tplan *t) {
    size_t n = st_dtype_size(t->dtype);
    for (int i = 0; i < t->n_dims; i++) n *= (size_t)t->shape[i];
    return n;
}

static int cmp_align(const void *a, const void *b) {
    const tplan *x = a, *y = b;
    if (x->shard != y->shard) return x->shard - y->shard;
    size_t sx = st_dtype_size(x->dtype), sy = st_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1; /* wider elements first keeps every tensor aligned */
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* config.json */

static json_t *config_json(const st_config *c, const st_synth_params *p, int group, json_t *overrides) {
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", c->is_moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"));
    json_object_set_new(j, "model_type", json_string(c->is_moe ? "qwen3_5_moe_text" : "qwen3_5_text"));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    if (!c->is_moe) json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(j, "linear_conv_kernel_dim", json_integer(c->conv_kernel));
    json_object_set_new(j, "linear_key_head_dim", json_integer(c->lin_key_head_dim));
    json_object_set_new(j, "linear_value_head_dim", json_integer(c->lin_value_head_dim));
    json_object_set_new(j, "linear_num_key_heads", json_integer(c->lin_n_key_heads));
    json_object_set_new(j, "linear_num_value_heads", json_integer(c->lin_n_value_heads));
    json_object_set_new(j, "full_attention_interval", json_integer(c->full_attention_interval));
    json_t *lt = json_array();
    for (int i = 0; i < c->n_layers; i++)
        json_array_append_new(lt, json_string(c->layer_kind[i] == ST_LAYER_FULL ? "full_attention" : "linear_attention"));
    json_object_set_new(j, "layer_types", lt);
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(j, "rope_parameters",
                        json_pack("{s:f,s:f,s:s,s:[i,i,i],s:b}", "rope_theta", c->rope_theta,
                                  "partial_rotary_factor", c->partial_rotary_factor, "rope_type", "default",
                                  "mrope_section", c->mrope_section[0], c->mrope_section[1],
                                  c->mrope_section[2], "mrope_interleaved", c->mrope_interleaved));
    if (c->is_moe) {
        json_object_set_new(j, "num_experts", json_integer(c->n_experts));
        json_object_set_new(j, "num_experts_per_tok", json_integer(c->n_experts_per_tok));
        json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
        json_object_set_new(j, "shared_expert_intermediate_size", json_integer(c->shared_expert_intermediate_size));
        json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    }
    json_t *eos = json_array();
    for (int i = 0; i < c->n_eos; i++) json_array_append_new(eos, json_integer(c->eos_ids[i]));
    json_object_set_new(j, "eos_token_id", eos);
    json_object_set_new(j, "dtype", json_string("bfloat16"));
    if (p->bits) {
        json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", group, "bits", p->bits, "mode", "affine");
        json_object_update(q, overrides);
        json_object_set(j, "quantization", q);
        json_object_set_new(j, "quantization_config", json_deep_copy(q));
        json_decref(q);
    }
    return j;
}

/* ---------------------------------------------------------------------------------------- */

st_status st_synth_write(const st_synth_params *p, const char *out_dir, st_error *err) {
    st_config c;
    st_status st = ST_OK;
    if (p->bits && !st_affine_bits_supported(p->bits))
        return st_error_set(err, ST_ERR_ARG, "synth: %d-bit quantization is not supported (2, 3, 4, 5, 6, 8)", p->bits);
    if (p->config_path) {
        char *text;
        size_t len;
        if ((st = st_file_read(p->config_path, 64u << 20, &text, &len, err)) != ST_OK) return st;
        st = st_config_parse(text, len, p->config_path, &c, err);
        free(text);
        if (st != ST_OK) return st;
        st_config_free(&c); /* overrides of the input are not carried over */
    } else if (!p->preset || config_from_preset(p->preset, &c) != 0) {
        return st_error_set(err, ST_ERR_ARG, "synth: unknown preset '%s' (tiny, tiny-moe, 0.8b, 2b, 4b, 9b, 27b, 35b-a3b)",
                            p->preset ? p->preset : "");
    }
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return st_error_set(err, ST_ERR_IO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    if (p->poison_token >= c.vocab_size)
        return st_error_set(err, ST_ERR_ARG, "synth: the poisoned token %d is outside the vocabulary", p->poison_token);
    if (p->poison_token >= 0) c.tie_word_embeddings = 0;
    script_map sm = {0};
    if (p->script) {
        if (c.is_moe) return st_error_set(err, ST_ERR_ARG, "synth: --script needs a dense model");
        c.tie_word_embeddings = 0;
        sm.d = c.hidden_size;
        if (sm.d > 1024) return st_error_set(err, ST_ERR_ARG, "synth: --script needs hidden_size <= 1024");
        sm.slot = malloc((size_t)c.vocab_size * sizeof *sm.slot);
        sm.is_next = calloc((size_t)c.vocab_size, 1);
        if (!sm.slot || !sm.is_next) {
            free(sm.slot);
            free(sm.is_next);
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        }
        for (int64_t i = 0; i < c.vocab_size; i++) sm.slot[i] = -1;
        for (int k = 0; k < 1024; k++) sm.next[k] = -1;
        int32_t next_slot = 0;
        st_status bad = ST_OK;
        for (int i = 0; i < p->n_script && bad == ST_OK; i++) {
            int32_t t = p->script[i];
            if (t < 0) continue;
            if (t >= c.vocab_size) bad = st_error_set(err, ST_ERR_ARG, "synth: script token %d is outside the vocabulary", t);
            else if (sm.slot[t] >= 0) bad = st_error_set(err, ST_ERR_ARG, "synth: script token %d appears twice", t);
            else if (next_slot >= sm.d) bad = st_error_set(err, ST_ERR_ARG, "synth: more script tokens than hidden_size (%lld)", (long long)sm.d);
            else sm.slot[t] = next_slot++;
        }
        for (int i = 0; i < p->n_script && bad == ST_OK; i++) {
            int32_t t = p->script[i];
            if (t < 0) continue;
            int32_t nx = i + 1 < p->n_script ? p->script[i + 1] : -1;
            if (nx < 0) nx = c.n_eos ? c.eos_ids[0] : -1; /* end of a segment: eos */
            if (nx >= 0 && nx < c.vocab_size) {
                sm.next[sm.slot[t]] = nx;
                sm.is_next[nx] = 1;
            }
        }
        if (bad != ST_OK) {
            free(sm.slot);
            free(sm.is_next);
            return bad;
        }
    }
    if (p->vision < 0 || p->vision > 2) return st_error_set(err, ST_ERR_ARG, "synth: vision must be 0, 1 or 2");
    if (p->vision && (c.is_moe || p->script))
        return st_error_set(err, ST_ERR_ARG, "synth: --vision needs a dense model with random weights");
    planner pl = {0};
    pl.sm = p->script ? &sm : NULL;
    pl.p = p;
    pl.c = &c;
    pl.seed = p->seed;
    pl.err = err;
    int64_t widths[] = {c.hidden_size, c.intermediate_size, st_config_value_dim(&c), (int64_t)c.n_heads * c.head_dim,
                        c.moe_intermediate_size, c.shared_expert_intermediate_size};
    pl.group = p->group_size;
    if (!pl.group) {
        pl.group = 64;
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
            if (widths[i] && widths[i] % 64) pl.group = 32;
    }
    pl.overrides = json_object();
    plan_model(&pl);
    if (p->vision) plan_vision(&pl, &SV[p->vision]);
    fill_ctx fc = {0};
    json_t *cfg = NULL, *index = NULL, *wmap = NULL;
    st_sf_entry *entries = NULL;
    if (pl.failed || !pl.overrides) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* shards */
    int64_t shard_max = p->shard_bytes > 0 ? p->shard_bytes : ((int64_t)4 << 30);
    int n_shards = 1;
    int64_t in_shard = 0, total = 0, maxcols = 1;
    for (int i = 0; i < pl.n; i++) {
        int64_t b = (int64_t)plan_bytes(&pl.t[i]);
        if (in_shard > 0 && in_shard + b > shard_max) {
            n_shards++;
            in_shard = 0;
        }
        pl.t[i].shard = n_shards - 1;
        in_shard += b;
        total += b;
        if (pl.t[i].cols > maxcols) maxcols = pl.t[i].cols;
    }
    qsort(pl.t, (size_t)pl.n, sizeof *pl.t, cmp_align);
    fc.row = malloc((size_t)maxcols * sizeof(float));
    fc.packed = malloc((size_t)maxcols * sizeof(uint32_t));
    fc.sc = malloc((size_t)maxcols * sizeof(uint16_t));
    fc.bi = malloc((size_t)maxcols * sizeof(uint16_t));
    entries = calloc((size_t)pl.n, sizeof *entries);
    index = json_object();
    wmap = json_object();
    if (!fc.row || !fc.packed || !fc.sc || !fc.bi || !entries || !index || !wmap) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    char path[4096], fname[64];
    for (int s = 0, start = 0; s < n_shards && st == ST_OK; s++) {
        int end = start;
        while (end < pl.n && pl.t[end].shard == s) end++;
        for (int i = start; i < end; i++) {
            entries[i - start].name = pl.t[i].name;
            entries[i - start].dtype = pl.t[i].dtype;
            entries[i - start].n_dims = pl.t[i].n_dims;
            for (int k = 0; k < pl.t[i].n_dims; k++) entries[i - start].shape[k] = pl.t[i].shape[k];
        }
        if (n_shards == 1) fmt(fname, sizeof fname, "model.safetensors");
        else fmt(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        for (int i = start; i < end; i++) json_object_set_new(wmap, pl.t[i].name, json_string(fname));
        if ((st = st_path_join(path, sizeof path, out_dir, fname, err)) != ST_OK) break;
        fc.plans = pl.t + start;
        st = st_sf_write(path, entries, end - start, p->bits ? "mlx" : "pt", fill, &fc, err);
        start = end;
    }
    if (st != ST_OK) goto done;
    if (n_shards > 1) {
        json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
        json_object_set(index, "weight_map", wmap);
        if ((st = st_path_join(path, sizeof path, out_dir, "model.safetensors.index.json", err)) != ST_OK) goto done;
        if (json_dump_file(index, path, JSON_INDENT(2)) != 0) {
            st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
            goto done;
        }
    }
    cfg = config_json(&c, p, pl.group, pl.overrides);
    if (cfg && p->vision) {
        int64_t ids[4];
        vision_ids(p, &c, ids);
        json_object_set_new(cfg, "vision_config",
                            json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:[],s:{s:f}}", "depth",
                                      SV[p->vision].depth, "hidden_size", SV[p->vision].hidden, "num_heads",
                                      SV[p->vision].heads, "intermediate_size", SV[p->vision].inter,
                                      "out_hidden_size", (int)c.hidden_size, "in_channels", 3, "patch_size", 16,
                                      "temporal_patch_size", 2, "spatial_merge_size", 2, "num_position_embeddings",
                                      SV[p->vision].npos, "hidden_act", "gelu_pytorch_tanh", "deepstack_visual_indexes",
                                      "rope_parameters", "rope_theta", 10000.0));
        json_object_set_new(cfg, "image_token_id", json_integer(ids[0]));
        json_object_set_new(cfg, "video_token_id", json_integer(ids[1]));
        json_object_set_new(cfg, "vision_start_token_id", json_integer(ids[2]));
        json_object_set_new(cfg, "vision_end_token_id", json_integer(ids[3]));
        json_t *pp = json_pack("{s:i,s:i,s:i,s:i,s:i,s:[f,f,f],s:[f,f,f],s:f}", "patch_size", 16, "temporal_patch_size",
                               2, "merge_size", 2, "min_pixels", (int)SV[p->vision].min_pixels, "max_pixels",
                               (int)SV[p->vision].max_pixels, "image_mean", 0.5, 0.5,
                               0.5, "image_std", 0.5, 0.5, 0.5, "rescale_factor", 1.0 / 255.0);
        if ((st = st_path_join(path, sizeof path, out_dir, "preprocessor_config.json", err)) == ST_OK &&
            (!pp || json_dump_file(pp, path, JSON_INDENT(2)) != 0))
            st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
        json_decref(pp);
        if (st != ST_OK) goto done;
    }
    if ((st = st_path_join(path, sizeof path, out_dir, "config.json", err)) != ST_OK) goto done;
    if (!cfg || json_dump_file(cfg, path, JSON_INDENT(2)) != 0) {
        st = st_error_set(err, ST_ERR_IO, "%s: write failed", path);
        goto done;
    }
    if (p->tokenizer_dir) {
        static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                      "chat_template.json", "special_tokens_map.json", "vocab.json",
                                      "merges.txt"};
        int copied = 0;
        for (size_t i = 0; i < sizeof files / sizeof files[0] && st == ST_OK; i++) {
            char from[4096];
            if (st_path_join(from, sizeof from, p->tokenizer_dir, files[i], err) != ST_OK) continue;
            if (!st_file_exists(from)) continue;
            if ((st = st_path_join(path, sizeof path, out_dir, files[i], err)) != ST_OK) break;
            st = st_file_copy(from, path, err);
            copied++;
        }
        if (st == ST_OK && !copied)
            st = st_error_set(err, ST_ERR_MISSING, "%s: no tokenizer.json or tokenizer_config.json to copy", p->tokenizer_dir);
    }
done:
    json_decref(cfg);
    json_decref(index);
    json_decref(wmap);
    json_decref(pl.overrides);
    free(entries);
    free(fc.row);
    free(fc.packed);
    free(fc.sc);
    free(fc.bi);
    free(pl.t);
    free(sm.slot);
    free(sm.is_next);
    return st;
}
