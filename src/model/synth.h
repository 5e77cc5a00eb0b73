/* ==== Synthetic checkpoints: random weights with real Qwen3.5 shapes ====
 *
 * Writes a complete checkpoint directory (config.json, safetensors shards with an index when
 * larger than the shard size, optionally the tokenizer files) so that tests, the README demo
 * and benchmarks need no download. bf16 output uses the Hugging Face CausalLM layout; quantized
 * output (2-8 bits) uses the MLX layout mlx-lm writes (language_model.* keys, conv1d [C,K,1],
 * norms stored as 1+w, affine quantization with a `quantization` object in config.json).
 * Weights are a deterministic function of (seed, tensor name, row).
 */
#ifndef ST_MODEL_SYNTH_H
#define ST_MODEL_SYNTH_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"

typedef struct st_synth_params {
    const char *preset;        /* tiny, tiny-moe, 0.8b, 2b, 4b, 9b, 27b, 35b-a3b; or NULL */
    const char *config_path;   /* a config.json to take the shapes from (instead of a preset) */
    int bits;                  /* 0 = bf16 (HF layout); 2, 3, 4, 5, 6, 8 = MLX affine */
    int group_size;            /* MLX group size; 0 = 64 when every input width allows, else 32 */
    int mixed;                 /* MLX: v_proj/down_proj of the first and last layer and the LM
                                  head at 8 bits, recorded as per-module overrides */
    uint64_t seed;
    const char *tokenizer_dir; /* copy tokenizer files from here (NULL = none) */
    int64_t shard_bytes;       /* 0 = 4 GiB */
    /* A scripted model, for end-to-end tests of the text pipeline: every layer is zero (the
     * residual stream is the current token's embedding) and the LM head holds a successor
     * table, so after token script[i] the model predicts script[i+1] by a wide margin, and
     * after the last token of a segment its first eos id. Segments are separated by -1; all
     * tokens must be distinct. The head is untied. NULL = random weights. */
    const int32_t *script;
    int n_script;
    /* A broken model, for tests of error handling: the embedding row of this token is NaN
     * (the head is then untied), so every sequence that contains the token gets non-finite
     * logits and the others are unaffected. -1 = none. */
    int32_t poison_token;
    /* A vision tower (model.visual.*, bf16 whatever the dtype, out to the model's width) with
     * vision_config, the image token ids (the tokenizer's <|image_pad|> etc. when one is
     * copied, else the last 4 ids) and a preprocessor_config.json. 1: depth 2, hidden 64,
     * 2 heads, images of 4,096 to 65,536 pixels (the image path's tests); 2: Qwen3.5's tower
     * (depth 27, hidden 1152, 16 heads, MLP 4304, 48x48 positions; 65,536 to 16,777,216
     * pixels), for benchmarks. 0: none. */
    int vision;
} st_synth_params;

st_synth_params st_synth_default_params(void);

/* Names of the presets, NULL-terminated. */
const char *const *st_synth_presets(void);

/* The config of a preset (st_synth_presets); ST_ERR_ARG naming the presets if unknown. */
st_status st_synth_preset_config(const char *preset, st_config *out, st_error *err);

/* Write the checkpoint into out_dir (created if missing). */
st_status st_synth_write(const st_synth_params *p, const char *out_dir, st_error *err);

#endif /* ST_MODEL_SYNTH_H */
