/* ==== Per-sequence model state: paged KV blocks and recurrent-state slots ====
 *
 * All memory is planned at creation: a pool of KV blocks shared by all sequences (each block
 * holds `block_size` positions of K and V for every full-attention layer), and a fixed pool
 * of state slots (conv state + fp32 delta-rule state for every linear layer, plus the slot's
 * block table). A sequence (st_seq) is a few integers and a borrowed row of block ids; taking
 * and returning blocks or slots never allocates.
 *
 * Thread ownership: one thread (the scheduler/driver) owns a cache and its sequences.
 */
#ifndef ST_ENGINE_CACHE_H
#define ST_ENGINE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

typedef enum st_kv_dtype {
    ST_KV_F32 = 0,
    ST_KV_BF16 = 1,
} st_kv_dtype;

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
    st_cache_params p;
    int n_full, n_linear;           /* layers by kind */
    int n_kv_heads, head_dim;
    int conv_rows;                  /* K - 1 */
    int64_t conv_dim;
    int n_v_heads, v_head_dim, k_head_dim;
    int64_t max_blocks_per_seq;
    size_t kv_elem;                 /* bytes per K/V element */
    size_t kv_head_stride;          /* elements of one (layer, K|V, head) run: block_size*hd */
    size_t kv_block_elems;          /* elements of one block: n_full*2*n_kv*block_size*hd */
    uint8_t *kv;                    /* [n_blocks][n_full][2][n_kv][block_size][hd] of kv_dtype */
    int32_t *free_blocks;           /* [n_blocks] stack of free block ids */
    int64_t n_free_blocks;
    int32_t *block_tables;          /* [n_slots][max_blocks_per_seq] */
    size_t conv_slot_floats;        /* n_linear * (K-1) * conv_dim */
    size_t rec_slot_floats;         /* n_linear * Hv * Dv * Dk */
    float *conv;                    /* [n_slots][n_linear][K-1][conv_dim] */
    float *rec;                     /* [n_slots][n_linear][Hv][Dv][Dk] */
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
    size_t block_bytes; /* one KV block with its free-list entry */
    size_t slot_bytes;  /* one state slot with its block table */
} st_cache_plan;
st_cache_plan st_cache_plan_of(const st_model *m, const st_cache_params *p);

/* Take a state slot (zeroed) for a new sequence; ST_ERR_BUSY when none is free. */
st_status st_cache_seq_start(st_cache *c, st_seq *seq, st_error *err);
/* Blocks needed so that the sequence holds n_past + n_new positions. */
int64_t st_cache_blocks_needed(const st_cache *c, const st_seq *seq, int64_t n_new);
/* Make room for n_new more positions (ST_ERR_LIMIT past max_seq_len, ST_ERR_BUSY when the
 * pool is empty; nothing is taken on failure). */
st_status st_cache_seq_reserve(st_cache *c, st_seq *seq, int64_t n_new, st_error *err);
/* Return the sequence's blocks and slot to the pools; seq becomes "not started". */
void st_cache_seq_release(st_cache *c, st_seq *seq);

/* Element pointer of K (kv = 0) or V (kv = 1) for full layer `li`, head `h`, at position pos
 * of seq; the run of positions within a block is contiguous (stride head_dim). */
static inline void *st_cache_kv_ptr(const st_cache *c, const st_seq *seq, int li, int kv, int h,
                                    int64_t pos) {
    int64_t b = seq->blocks[pos / c->p.block_size];
    int64_t off = pos % c->p.block_size;
    size_t e = (size_t)b * c->kv_block_elems +
               ((size_t)(li * 2 + kv) * (size_t)c->n_kv_heads + (size_t)h) * c->kv_head_stride +
               (size_t)off * (size_t)c->head_dim;
    return c->kv + e * c->kv_elem;
}
static inline float *st_cache_conv_state(const st_cache *c, int slot, int li) {
    return c->conv + (size_t)slot * c->conv_slot_floats +
           (size_t)li * (size_t)c->conv_rows * (size_t)c->conv_dim;
}
static inline float *st_cache_rec_state(const st_cache *c, int slot, int li) {
    return c->rec + (size_t)slot * c->rec_slot_floats +
           (size_t)li * (size_t)c->n_v_heads * (size_t)c->v_head_dim * (size_t)c->k_head_dim;
}

#endif /* ST_ENGINE_CACHE_H */
