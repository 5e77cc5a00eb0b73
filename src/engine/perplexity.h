/* ==== Perplexity of a token sequence ====
 *
 * The measure llama-perplexity uses and tiny-fortune's golden.json defines: the tokens are cut
 * into consecutive non-overlapping windows of `window` tokens (a last window shorter than
 * that is left out); each window runs from an empty cache; every position but the first is
 * scored, nll = -log softmax(logits before it)[its token]; ppl = exp(mean nll). Its standard
 * error is ppl * sd(nll) / sqrt(n) (the delta method, as llama-perplexity reports it).
 *
 * Windows run `batch` at a time in one ragged batch (a window gets the same logits alone or
 * batched, so the result does not depend on the batch); log-softmax normalizers are taken in
 * double precision on the forward pass's threads, and the sum runs in window order, so the
 * result does not depend on the thread count either.
 */
#ifndef ST_ENGINE_PERPLEXITY_H
#define ST_ENGINE_PERPLEXITY_H

#include <stdint.h>

#include "backend/backend.h"
#include "engine/cache.h"
#include "model/model.h"

/* After each window: windows done and in all, the scored tokens so far and their ppl. */
typedef void (*st_ppl_progress_fn)(void *user, int64_t done, int64_t windows, int64_t scored,
                                   double ppl);

/* Each scored position, in order: its index among the scored ones, the logits that predicted
 * it ([vocab], valid during the call), their log-normalizer (logprob = logit - lse) and the
 * token. For KL divergence against a saved run. */
typedef void (*st_ppl_row_fn)(void *user, int64_t index, const float *logits, double lse,
                              int32_t token);

typedef struct st_ppl_params {
    int window;              /* tokens per window (>= 2) */
    int batch;               /* windows run together */
    int step_tokens;         /* tokens per forward step over all windows; 0 = as many as keep
                                the step's logits within about 256 MiB */
    st_kv_dtype kv_dtype;
    st_backend *backend;       /* borrowed; NULL = a CPU backend with default parameters */
    st_ppl_progress_fn progress;
    st_ppl_row_fn row;
    void *user;
} st_ppl_params;

st_ppl_params st_ppl_default_params(void);

typedef struct st_ppl_result {
    double ppl;
    double ppl_stderr;
    double nll_mean, nll_sd;
    int64_t scored;          /* positions scored */
    int64_t windows;
    double seconds;          /* wall time of the windows */
    double tokens_per_s;     /* tokens run through the model per second */
} st_ppl_result;

/* Perplexity of ids[0..n). ST_ERR_ARG when not even one window fits. */
st_status st_perplexity(const st_model *m, const int32_t *ids, int64_t n, const st_ppl_params *p,
                        st_ppl_result *out, st_error *err);

#endif /* ST_ENGINE_PERPLEXITY_H */
