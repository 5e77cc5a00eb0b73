/* ==== Greedy generation for a set of prompts run as one ragged batch ====
 *
 * The simple driver behind `strand generate` and the fixture tests: all prompts are
 * prefilled together in chunks of at most max_batch_tokens tokens, then every unfinished
 * sequence decodes one token per step, all in the same batch. (The continuous-batching
 * scheduler of the server builds on the same st_batch_run steps.)
 */
#ifndef ST_ENGINE_GENERATE_H
#define ST_ENGINE_GENERATE_H

#include <stdint.h>

#include "backend/backend.h"
#include "engine/cache.h"
#include "model/model.h"

typedef struct st_gen_options {
    int max_batch_tokens;     /* tokens per forward step (prefill chunk budget) */
    int block_size;           /* KV block size */
    st_kv_dtype kv_dtype;
    int64_t max_seq_len;      /* context limit; 0 = the model's max_position_embeddings */
    int stop_at_eos;          /* stop a sequence after it emits one of the config's eos ids */
    st_backend *backend;      /* borrowed; NULL = a CPU backend with default parameters, made
                                 for the call */
} st_gen_options;

st_gen_options st_gen_default_options(void);

typedef struct st_gen_request {
    const int32_t *prompt; /* [n_prompt] borrowed */
    int n_prompt;          /* >= 1 */
    int n_new;             /* tokens to generate */
    int32_t *out;          /* [n_new] caller-owned; filled with the generated ids */
    int n_out;             /* set: how many were generated (< n_new after an eos stop) */
    float *out_logits;     /* optional [n_new][vocab]: the logits that chose each token */
} st_gen_request;

st_status st_generate_greedy(const st_model *m, st_gen_request *reqs, int n_reqs,
                             const st_gen_options *opt, st_error *err);

/* Index of the largest value (the first one on ties), as torch.argmax does. */
int32_t st_argmax(const float *x, int64_t n);

#endif /* ST_ENGINE_GENERATE_H */
