/* ==== Per-sequence model state: the books of KV blocks and state slots ====
 *
 * The engine's side of the cache: which KV blocks and state slots are free, and each
 * sequence's block table. The storage itself (the blocks' K and V, the conv and delta-rule
 * state of every slot) is the backend's (backend/backend.h, st_bctx): a step's plan names
 * the slot and the blocks, and the backend reads and writes its own memory. A slot's state
 * is zeroed by the backend at the sequence's first step (position 0).
 *
 * All memory is planned at creation: taking and returning blocks or slots never allocates.
 * A sequence (st_seq) is a few integers and a borrowed row of block ids.
 *
 * Thread ownership: one thread (the scheduler/driver) owns a cache and its sequences.
 */
#ifndef ST_ENGINE_CACHE_H
#define ST_ENGINE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"
#include "model/model.h"

typedef struct st_cache_params {
    int n_slots;         /* sequences live at once */
    int64_t max_seq_len; /* positions per sequence (the context length) */
    int block_size;      /* positions per KV block */
    int64_t n_blocks;    /* KV pool size; 0 = enough for every slot at max_seq_len */
    st_kv_dtype kv_dtype;
} st_cache_params;

st_cache_params st_cache_default_params(void);

/* One sequence's view of the cache: fixed-size, never grows. */
typedef struct st_seq {
    int slot;         /* state slot, -1 when not started */
    int64_t n_past;   /* positions already in the cache = position of the next token */
    int32_t n_blocks; /* KV blocks held */
    int32_t *blocks;  /* [max_blocks_per_seq] block ids; row `slot` of the cache's tables */
} st_seq;

typedef struct st_cache {
    st_cache_params p;              /* n_blocks resolved */
    int n_full, n_linear;           /* layers by kind */
    int64_t vocab;                  /* token ids are in [0, vocab) */
    int64_t max_blocks_per_seq;
    int32_t *free_blocks;           /* [n_blocks] stack of free block ids */
    int64_t n_free_blocks;
    int32_t *block_tables;          /* [n_slots][max_blocks_per_seq] */
    int *free_slots;                /* [n_slots] stack */
    int n_free_slots;
    size_t planned_bytes;           /* all of the above */
} st_cache;

st_status st_cache_create(const st_model *m, const st_cache_params *p, st_cache **out,
                          st_error *err);
void st_cache_destroy(st_cache *c);

/* What st_cache_create would allocate, without allocating (all 0 for bad parameters). */
typedef struct st_cache_plan {
    size_t total_bytes; /* everything */
    size_t block_bytes; /* one block's free-list entry */
    size_t slot_bytes;  /* one slot's block table and free-list entry */
} st_cache_plan;
st_cache_plan st_cache_plan_of(const st_model *m, const st_cache_params *p);

/* The backend context a cache's sequences need, with max_tokens tokens per step. */
st_ctx_params st_cache_ctx_params(const st_cache *c, int max_tokens);

/* Take a state slot for a new sequence; ST_ERR_BUSY when none is free. */
st_status st_cache_seq_start(st_cache *c, st_seq *seq, st_error *err);
/* Blocks needed so that the sequence holds n_past + n_new positions. */
int64_t st_cache_blocks_needed(const st_cache *c, const st_seq *seq, int64_t n_new);
/* Make room for n_new more positions (ST_ERR_LIMIT past max_seq_len, ST_ERR_BUSY when the
 * pool is empty; nothing is taken on failure). */
st_status st_cache_seq_reserve(st_cache *c, st_seq *seq, int64_t n_new, st_error *err);
/* Return the blocks beyond those n_past positions need (undoing a reservation). */
void st_cache_seq_trim(st_cache *c, st_seq *seq);
/* Return the sequence's blocks and slot to the pools; seq becomes "not started". */
void st_cache_seq_release(st_cache *c, st_seq *seq);

#endif /* ST_ENGINE_CACHE_H */
