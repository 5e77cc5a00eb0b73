/* ==== Hugging Face checkpoint -> MLX affine checkpoint (what mlx-lm's converter writes) ====
 *
 * Reads a bf16/f16/f32 Hugging Face checkpoint of a Qwen3.5-family text model (sharded or
 * not, dense or MoE, Qwen3_5ForCausalLM or Qwen3_5ForConditionalGeneration) and writes the
 * layout mlx_lm.convert produces (spec/text-model.md sections 2.2-3.4):
 *   - keys `language_model.model.*` and `language_model.lm_head.weight` (none when tied);
 *     the vision tower and mtp.* are left out;
 *   - conv1d weights [C,1,K] -> [C,K,1]; the residual, final and q/k norms stored as
 *     bf16(1 + w) (linear_attn.norm is not shifted); A_log kept as stored; every other
 *     floating tensor as bf16;
 *   - every Linear and the embedding whose input width divides into groups quantized
 *     (uint32 .weight, bf16 .scales and .biases); MoE routers and the shared-expert gate at
 *     8 bits, group 64; experts stacked as mlp.switch_mlp.{gate,up,down}_proj [E, out, in];
 *   - config.json: the input's, keys sorted, without _name_or_path and vision_config, with
 *     `quantization` (and its copy `quantization_config`: group_size, bits, mode "affine",
 *     per-module overrides), model_type qwen3_5_text -> qwen3_5 (mlx-lm's module name);
 *   - shards of at most shard_bytes with model.safetensors.index.json, __metadata__
 *     format "mlx"; the tokenizer, chat template and generation config copied.
 * Tensor by tensor, in memory bounded by a few rows per thread plus the largest matrix's
 * scales and biases: the input is mapped, the output streamed. Rows are quantized in
 * parallel on n_threads threads; the result does not depend on the thread count.
 */
#ifndef ST_MODEL_QUANTIZE_H
#define ST_MODEL_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tensor/matrix.h"

/* The default method: min-max at 8 bits (where its grid is already fine: lowest perplexity
 * and near-lowest KL on tiny-fortune, and what llama.cpp's Q8_0 does in spirit), the
 * least-squared-error search below (much better at 2-6 bits). */
#define ST_QUANT_AUTO (-1)

typedef void (*st_quantize_progress_fn)(void *user, size_t done_bytes, size_t total_bytes,
                                        const char *tensor);

typedef struct st_quantize_params {
    int bits;                /* 2, 3, 4, 5, 6 or 8 */
    int group_size;          /* 32, 64 or 128 */
    int mixed;               /* mlx-lm's mixed recipe: v_proj and down_proj of the first and
                                last eighth of the layers and of every third layer between,
                                and the LM head, at high_bits */
    int high_bits;           /* for mixed; 0 = 6 below 6 bits, else 8 */
    int method;              /* how groups are fitted: an st_quant_method, or ST_QUANT_AUTO */
    int64_t shard_bytes;     /* 0 = 5 GB, as mlx-lm */
    int n_threads;           /* 0 = st_default_threads() */
    st_quantize_progress_fn progress;
    void *user;
} st_quantize_params;

st_quantize_params st_quantize_default_params(void);

typedef struct st_quantize_stats {
    int quantized;           /* matrices quantized */
    int kept;                /* tensors written unquantized */
    size_t in_bytes, out_bytes;
    double rel_rms_error;    /* sqrt(sum (dequantized - w)^2 / sum w^2) over quantized matrices */
    int shards;
} st_quantize_stats;

/* Convert in_dir into out_dir (created; existing files of the same names are replaced). */
st_status st_quantize_checkpoint(const char *in_dir, const char *out_dir, const st_quantize_params *p,
                                 st_quantize_stats *stats, st_error *err);

#endif /* ST_MODEL_QUANTIZE_H */
