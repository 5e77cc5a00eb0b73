/* ==== A loaded Qwen3.5-family text model: config + weights mapped from the checkpoint ====
 *
 * Weight matrices stay in the file's format (bf16/f16/f32 or MLX affine 2-8 bit) and are
 * read in place from the read-only mapping; only small vectors (norms, conv taps, gates)
 * are converted to fp32 at load. Both layouts are accepted and told apart as
 * spec/text-model.md describes: Hugging Face (model.layers.* / model.language_model.*,
 * zero-centred norms stored as w) and MLX (language_model.model.*, conv1d [C,K,1], norms
 * stored as 1+w). mtp.* and vision weights are ignored by the text model.
 */
#ifndef ST_MODEL_MODEL_H
#define ST_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tensor/matrix.h"

typedef struct st_layer {
    st_layer_kind kind;
    int kind_index;      /* index among layers of the same kind (state/KV arrays) */
    float *input_norm;   /* [d] multiplier (1+w folded in); owned by the model */
    float *post_norm;    /* [d] */

    /* Gated DeltaNet */
    st_matrix in_qkv;    /* [conv_dim][d] */
    st_matrix in_z;      /* [value_dim][d] */
    st_matrix in_b;      /* [Hv][d] */
    st_matrix in_a;      /* [Hv][d] */
    st_matrix out_proj;  /* [d][value_dim] */
    float *conv_w;       /* [conv_dim][K]; tap K-1 multiplies the current token */
    float *dt_bias;      /* [Hv] */
    float *neg_exp_a;    /* [Hv] = -exp(A_log) */
    float *gdn_norm;     /* [Dv] plain RMSNorm weight */

    /* gated full attention */
    st_matrix q_proj;    /* [2*heads*hd][d]: per head [query hd | gate hd] */
    st_matrix k_proj;    /* [kv*hd][d] */
    st_matrix v_proj;    /* [kv*hd][d] */
    st_matrix o_proj;    /* [d][heads*hd] */
    float *q_norm;       /* [hd] multiplier */
    float *k_norm;       /* [hd] multiplier */

    /* dense MLP */
    st_matrix gate, up, down; /* [I][d], [I][d], [d][I] */

    /* MoE MLP */
    st_matrix router;         /* [E][d] */
    st_matrix *exp_gate;      /* [E] views of [Ie][d]; array owned by the model */
    st_matrix *exp_up;        /* [E] views of [Ie][d] */
    st_matrix *exp_down;      /* [E] views of [d][Ie] */
    int has_shared;
    st_matrix sh_gate, sh_up, sh_down; /* shared expert SwiGLU */
    st_matrix sh_expert_gate;          /* [1][d], sigmoid gate of the shared expert */
} st_layer;

typedef struct st_model {
    st_config cfg;
    st_checkpoint *ck;    /* owned */
    char *dir;            /* owned */
    int is_mlx_layout;    /* norms stored as 1+w */
    char prefix[64];      /* text-model key prefix, e.g. "model." */
    st_matrix embed;      /* [V][d] */
    st_matrix lm_head;    /* [V][d] (the embedding when tied) */
    int tied;
    float *final_norm;    /* [d] */
    st_layer *layers;     /* [n_layers], owned */
    int n_linear, n_full; /* layer counts by kind */
    float *vec_storage;   /* owned block holding every fp32 vector above */
    size_t vec_used, vec_cap;
    st_matrix *expert_views; /* owned block of MoE views */
    /* A synthetic model (st_model_synthetic): its matrices have shapes and formats but no
     * host data (data, scales and biases are NULL); a backend that can synthesize weights in
     * its own memory fills them from synth_seed; the others refuse the model. */
    int synthetic;
    uint64_t synth_seed;
} st_model;

/* Load the text model of the checkpoint in dir (config.json + safetensors). The model is
 * immutable once loaded: each backend prepares its own copy of the weights it computes
 * with (packed for the CPU's kernels, on a device, a shard). */
st_status st_model_load(const char *dir, st_model **out, st_error *err);
void st_model_free(st_model *m);

/* A model of config c whose weight matrices exist only as a recipe, for benchmarks of real
 * shapes without a checkpoint (`strand bench --synth 27b`): bits 0 = bf16, else MLX affine
 * (bits 2-8, group `group`, bf16 scales and biases). The small fp32 vectors (norms, conv
 * taps, gates) are real, drawn from seed as `strand synth` draws them. */
st_status st_model_synthetic(const st_config *c, int bits, int group, uint64_t seed, st_model **out,
                             st_error *err);

/* Sizes for `inspect`, planning and benchmarks. */
typedef struct st_model_stats {
    int64_t n_params;          /* text parameters (as stored: quantized counted by element) */
    size_t weight_bytes;       /* bytes of all text weights as stored */
    size_t bytes_per_token;    /* weight bytes read per decoded token at batch 1 */
    size_t kv_bytes_per_token; /* KV cache (at the given element size) per token */
    size_t state_bytes_per_seq;/* recurrent + conv state per sequence (fp32) */
} st_model_stats;
void st_model_get_stats(const st_model *m, size_t kv_elem_size, st_model_stats *s);

#endif /* ST_MODEL_MODEL_H */
