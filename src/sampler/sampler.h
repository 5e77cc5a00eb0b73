/* ==== Sampling the next token, and its log-probabilities ====
 *
 * Order of operations (as vLLM applies them): logprobs are taken from the model's raw
 * distribution (log-softmax of the raw logits), then logit bias, repetition / presence /
 * frequency penalties, then greedy argmax (temperature 0) or temperature, top-k, top-p and
 * min-p filtering and a draw from the request's own random stream. Everything a sequence
 * needs lives in a fixed-size st_sampler_state (the RNG) and the token history it passes in,
 * so a sequence samples the same tokens alone or in any batch. Scratch buffers are sized for
 * the vocabulary once (st_sampler_create); sampling allocates nothing.
 */
#ifndef ST_SAMPLER_SAMPLER_H
#define ST_SAMPLER_SAMPLER_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

#define ST_MAX_LOGPROBS 20
#define ST_MAX_LOGIT_BIAS 300

typedef struct st_logit_bias {
    int32_t token;
    float bias;
} st_logit_bias;

typedef struct st_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; prompt and output tokens (HF/vLLM rule) */
    float presence_penalty;   /* 0 = off; output tokens (OpenAI rule) */
    float frequency_penalty;  /* 0 = off; output tokens */
    uint64_t seed;            /* the request's seed (ignored unless has_seed) */
    int has_seed;             /* 0: seeded from the system's entropy */
    st_logit_bias bias[ST_MAX_LOGIT_BIAS];
    int n_bias;
} st_sampling;

/* Defaults: greedy, no filters, no penalties. */
st_sampling st_sampling_default(void);
/* Check ranges (temperature >= 0, top_p in (0,1], ...); vocab bounds the bias tokens. */
st_status st_sampling_validate(const st_sampling *s, int64_t vocab, st_error *err);

/* Per-sequence sampling state: fixed size. */
typedef struct st_sampler_state {
    uint64_t rng[4]; /* xoshiro256** */
} st_sampler_state;

void st_sampler_state_init(st_sampler_state *st, const st_sampling *s);

/* The chosen token's log-probability and the top alternatives. */
typedef struct st_logprobs {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_tokens[ST_MAX_LOGPROBS];
    float top_logprobs[ST_MAX_LOGPROBS];
} st_logprobs;

typedef struct st_sampler st_sampler; /* scratch sized for one vocabulary */

/* 1 when every x[0..n) is finite (no NaN, no infinity). A broken checkpoint or kernel shows
 * here first: sampling from such logits would pick an arbitrary token. */
int st_logits_finite(const float *x, int64_t n);

st_status st_sampler_create(int64_t vocab, st_sampler **out, st_error *err);
void st_sampler_destroy(st_sampler *s);

/* Choose the next token from logits[vocab] (modified in place). history holds the
 * sequence's tokens so far: [0, n_prompt) prompt, [n_prompt, n_history) generated.
 * When lp is non-NULL it receives the chosen token's raw log-probability and the top
 * n_logprobs (<= ST_MAX_LOGPROBS) alternatives. */
int32_t st_sampler_sample(st_sampler *s, const st_sampling *p, st_sampler_state *st,
                          float *logits, const int32_t *history, int64_t n_prompt,
                          int64_t n_history, int n_logprobs, st_logprobs *lp);

/* Compact logit rows (backend/backend.h's st_logit_top: the top tokens and log-sum-exp that
 * a GPU sends back instead of the vocabulary). st_logit_top_make is the reference every
 * backend's compaction equals (ids and values exactly; lse in the same order on the CPU).
 * st_sampler_top_ok: 1 when the request's sampling can be done from such a row alone (no
 * bias or penalties, greedy or top_k <= ST_TOP_SAMPLE_MAX); st_sampler_sample_top then gives
 * what st_sampler_sample gives on the full row (the same draw from the same stream, and the
 * same log-probabilities), except where the list's last entry ties the top_k-th in weight:
 * the tied tokens inside the list stand for those outside. */
#define ST_TOP_SAMPLE_MAX 64
void st_logit_top_make(const float *row, int64_t vocab, st_logit_top *out);
int st_sampler_top_ok(const st_sampling *p);
int32_t st_sampler_sample_top(st_sampler *s, const st_sampling *p, st_sampler_state *st, const st_logit_top *top,
                              int n_logprobs, st_logprobs *lp);

#endif /* ST_SAMPLER_SAMPLER_H */
