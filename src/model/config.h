/* ==== config.json of a Qwen3.5-family checkpoint ====
 *
 * Reads the three layouts users have: the flat text config (qwen3_5_text /
 * Qwen3_5ForCausalLM), the nested multimodal one (qwen3_5 / Qwen3_5ForConditionalGeneration
 * with text_config), and the MoE variants (qwen3_5_moe, qwen3_5_moe_text), plus MLX's
 * `quantization` object and generation_config.json's eos ids. Shape-defining fields are
 * required; others take the Hugging Face reference's defaults.
 */
#ifndef ST_MODEL_CONFIG_H
#define ST_MODEL_CONFIG_H

#include <stdint.h>

#include "core/status.h"

#define ST_MAX_LAYERS 512
#define ST_MAX_EOS 8

typedef enum st_layer_kind {
    ST_LAYER_LINEAR = 0, /* Gated DeltaNet */
    ST_LAYER_FULL = 1,   /* gated full softmax attention */
} st_layer_kind;

/* A per-module quantization override from config.json "quantization". */
typedef struct st_quant_override {
    char *path;    /* module path as written in config.json (no ".weight"); owned */
    int quantized; /* 0 when the override is `false` */
    int bits;
    int group_size;
} st_quant_override;

typedef struct st_config {
    char model_type[48];   /* top-level model_type */
    char architecture[64]; /* architectures[0] or "" */
    int is_moe;
    int has_vision;        /* a vision_config is present */

    /* text model */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size; /* dense MLP width (0 for MoE-only models) */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    float rms_norm_eps;
    int conv_kernel;           /* linear_conv_kernel_dim */
    int lin_key_head_dim;      /* Dk */
    int lin_value_head_dim;    /* Dv */
    int lin_n_key_heads;       /* Hk */
    int lin_n_value_heads;     /* Hv */
    uint8_t layer_kind[ST_MAX_LAYERS]; /* st_layer_kind per layer */
    int full_attention_interval;

    double rope_theta;
    double partial_rotary_factor;
    int rope_dim;              /* floor(head_dim * partial_rotary_factor), even */
    int mrope_section[3];
    int mrope_interleaved;
    int64_t max_position_embeddings;
    int tie_word_embeddings;

    /* MoE */
    int n_experts;
    int n_experts_per_tok;
    int64_t moe_intermediate_size;
    int64_t shared_expert_intermediate_size;
    int norm_topk_prob;

    /* MLX quantization (config.json "quantization"); has_quant = 0 when absent */
    int has_quant;
    int quant_bits;
    int quant_group_size;
    char quant_mode[16];
    st_quant_override *quant_overrides; /* [n_quant_overrides], owned */
    int n_quant_overrides;

    /* stop ids: config eos_token_id (top level and text_config), generation_config.json */
    int32_t eos_ids[ST_MAX_EOS];
    int n_eos;

    /* multimodal token ids (-1 when absent) */
    int32_t image_token_id, video_token_id, vision_start_token_id, vision_end_token_id;
} st_config;

/* Parse DIR/config.json (and DIR/generation_config.json when present). */
st_status st_config_load(const char *dir, st_config *cfg, st_error *err);

/* The M-RoPE axis (0 t, 1 h, 2 w) of rotary frequency k < rope_dim / 2 (spec/vision.md 7.5):
 * interleaved t h w t h w ... (h and w while their sections last), else in sections. */
static inline int st_config_mrope_axis(const st_config *c, int k) {
    const int *sec = c->mrope_section;
    if (c->mrope_interleaved) {
        if (k % 3 == 1 && k < 3 * sec[1]) return 1;
        if (k % 3 == 2 && k < 3 * sec[2]) return 2;
        return 0;
    }
    return k < sec[0] ? 0 : k < sec[0] + sec[1] ? 1 : 2;
}
/* Parse config JSON text (for tests and fuzzing); `label` names it in messages. */
st_status st_config_parse(const char *json, size_t len, const char *label, st_config *cfg,
                          st_error *err);
void st_config_free(st_config *cfg);

/* Derived sizes. */
static inline int64_t st_config_key_dim(const st_config *c) {
    return (int64_t)c->lin_n_key_heads * c->lin_key_head_dim;
}
static inline int64_t st_config_value_dim(const st_config *c) {
    return (int64_t)c->lin_n_value_heads * c->lin_value_head_dim;
}
static inline int64_t st_config_conv_dim(const st_config *c) {
    return 2 * st_config_key_dim(c) + st_config_value_dim(c);
}
int st_config_count_layers(const st_config *c, st_layer_kind kind);

/* The override for a module path, or NULL. */
const st_quant_override *st_config_quant_override(const st_config *c, const char *module_path);

#endif /* ST_MODEL_CONFIG_H */
