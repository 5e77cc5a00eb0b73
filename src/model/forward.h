/* ==== The forward pass of a Qwen3.5-family text model over a ragged batch ====
 *
 * A batch is a list of (sequence, new tokens) with no padding: each sequence contributes any
 * number of consecutive tokens that continue its cache. One call runs every layer over all
 * the batch's tokens (the matrix products see one [T, d] activation block) while the
 * sequence-dependent parts (conv + delta-rule recurrence, attention over the sequence's own
 * KV blocks) run per sequence, so a sequence gets the same result alone or in any batch.
 *
 * All scratch memory is allocated by st_fwd_create for at most `max_tokens` tokens per call,
 * and the context's thread pool is started there; st_fwd_run allocates nothing. Work is
 * split statically over the pool: matrix products by output rows, the delta rule by
 * (sequence, key head), attention by (sequence, KV head, query tile) and, when a step has
 * fewer such tasks than threads (decode of few sequences), across fixed 512-position
 * chunks of the context merged with the online-softmax rule. No split changes the
 * arithmetic: results are the same bits for any thread count and any batch composition.
 *
 * Thread ownership: one thread at a time calls st_fwd_run on a context (it drives the
 * context's pool and writes the cache).
 */
#ifndef ST_MODEL_FORWARD_H
#define ST_MODEL_FORWARD_H

#include <stdint.h>

#include "core/status.h"
#include "engine/cache.h"
#include "kernels/kernels.h"
#include "model/model.h"

enum {
    ST_LOGITS_NONE = 0, /* no logits for this item */
    ST_LOGITS_LAST = 1, /* logits of the item's last token */
    ST_LOGITS_ALL = 2,  /* logits of every token of the item */
};

typedef struct st_batch_item {
    st_seq *seq;           /* started with st_cache_seq_start; advanced by n_tokens */
    const int32_t *tokens; /* [n_tokens] token ids; borrowed */
    int n_tokens;          /* >= 1 */
    int logits;            /* ST_LOGITS_* */
} st_batch_item;

/* Called with the residual stream: index 0 = embeddings, i = input of layer i, n_layers =
 * after the final norm (the same convention as transformers' hidden_states). */
typedef void (*st_hidden_hook)(void *user, int index, int64_t n_tokens, int64_t dim,
                               const float *hidden);

typedef struct st_fwd st_fwd;

/* How a forward context computes. Start from st_fwd_default_params(). */
typedef struct st_fwd_params {
    int n_threads;              /* threads of the context's pool, the caller included;
                                   0 = st_default_threads() ($STRAND_THREADS or online CPUs) */
    const st_kernels *kernels;  /* NULL = st_kernels_select() (best for this CPU, or
                                   $STRAND_KERNELS); st_kernels_ref() for the oracle */
    int gdn_chunked;            /* 1: whole 64-token chunks (aligned to positions that are
                                   multiples of 64) of a prefill use the chunked delta rule;
                                   0: always the per-timestep form */
    int64_t min_parallel_work;  /* a parallel region with fewer multiply-adds runs on the
                                   calling thread alone; 0 = the default (65536) */
} st_fwd_params;

st_fwd_params st_fwd_default_params(void);

/* Plan scratch for up to max_tokens tokens per call and start the thread pool. */
st_status st_fwd_create_ex(const st_model *m, st_cache *cache, int max_tokens,
                           const st_fwd_params *p, st_fwd **out, st_error *err);

/* The context's thread pool (borrowed; for benchmarks that must share its threads). */
struct st_pool *st_fwd_pool(st_fwd *f);

/* st_fwd_create_ex with default parameters and the given kernels (NULL = best available). */
st_status st_fwd_create(const st_model *m, st_cache *cache, int max_tokens,
                        const st_kernels *kernels, st_fwd **out, st_error *err);
void st_fwd_destroy(st_fwd *f);

/* Logit rows a batch produces (the row count of st_fwd_run's output). */
int64_t st_fwd_logit_rows(const st_batch_item *items, int n_items);

/* Run the batch. logits: [st_fwd_logit_rows][vocab] floats, rows in item order. On an error
 * caused by the request (bad token id, context or pool exhausted) nothing is changed. */
st_status st_fwd_run(st_fwd *f, const st_batch_item *items, int n_items, float *logits,
                     st_error *err);

void st_fwd_set_hidden_hook(st_fwd *f, st_hidden_hook hook, void *user);

/* Bytes of scratch the context planned (the mapped attention partials included). */
size_t st_fwd_scratch_bytes(const st_fwd *f);

/* About what st_fwd_create_ex allocates for these parameters (n_threads 0 = the default),
 * without allocating: for memory plans made before a context exists. */
size_t st_fwd_plan_bytes(const st_model *m, int max_tokens, int64_t max_seq_len, int n_threads);

/* The kernel set and thread count in use. */
const st_kernels *st_fwd_kernels(const st_fwd *f);
int st_fwd_threads(const st_fwd *f);

#endif /* ST_MODEL_FORWARD_H */
