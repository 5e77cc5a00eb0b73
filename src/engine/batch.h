/* ==== A step of the engine: batch items -> the plan -> the forward pass ====
 *
 * The engine's sequences (engine/cache.h) and the tokens each adds this step become one
 * plain-data plan (backend/backend.h): st_batch_plan checks the items, reserves the KV
 * blocks they need and writes token ids, positions, slots and block tables; the forward
 * pass runs it (model/forward.h); st_batch_commit then advances each sequence's position.
 * st_batch_run does the three. A tensor-parallel rank 0 would broadcast the same plan
 * bytes to every rank before running it.
 *
 * Thread ownership: the cache's owner.
 */
#ifndef ST_ENGINE_BATCH_H
#define ST_ENGINE_BATCH_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"
#include "engine/cache.h"
#include "model/forward.h"

typedef struct st_batch_item {
    st_seq *seq;           /* started with st_cache_seq_start; advanced by n_tokens */
    const int32_t *tokens; /* [n_tokens] token ids; borrowed */
    int n_tokens;          /* >= 1 */
    int logits;            /* ST_LOGITS_* */
} st_batch_item;

/* Logit rows a batch produces (the row count of st_batch_run's output). */
int64_t st_batch_logit_rows(const st_batch_item *items, int n_items);

/* Check the items (started, distinct, token ids in the vocabulary, within the context),
 * reserve their KV blocks and write the plan into pb. On an error (caused by the request:
 * bad token id, context or pool exhausted, plan capacity) nothing is changed. */
st_status st_batch_plan(st_cache *c, const st_batch_item *items, int n_items, st_plan_buf *pb,
                        st_error *err);
/* After the step ran: every item's sequence holds its new positions (st_cache_seq_commit). */
void st_batch_commit(st_cache *c, const st_batch_item *items, int n_items);
/* After a step that did not run: the blocks st_batch_plan reserved go back. */
void st_batch_undo(st_cache *c, const st_batch_item *items, int n_items);

/* Plan into f's plan buffer, run, commit. logits: [st_batch_logit_rows][vocab]. On an error
 * nothing is changed. */
st_status st_batch_run(st_cache *c, st_fwd *f, const st_batch_item *items, int n_items,
                       float *logits, st_error *err);

/* The image parts of a step's tokens (prompts holding images): mrope [n_tokens][3] every
 * token's rotary positions (NULL: none); rows [n_embeds] (token rows of the step, increasing)
 * take embeds[i] (hidden floats) instead of the token table's rows. f must have
 * st_fwd_enable_embeds when n_embeds > 0. */
typedef struct st_batch_images {
    const int32_t *mrope;
    int64_t n_embeds;
    const int64_t *rows;
    const float *const *embeds;
    const int32_t *const *cache_tokens; /* [n_items] what the prefix cache keys each item's
                                           positions by (an image prompt's rows: their pixels'
                                           hash), NULL entries (or NULL): its tokens */
} st_batch_images;

/* st_batch_run with the step's image parts. */
st_status st_batch_run_images(st_cache *c, st_fwd *f, const st_batch_item *items, int n_items, const st_batch_images *im,
                              float *logits, st_error *err);

#endif /* ST_ENGINE_BATCH_H */
