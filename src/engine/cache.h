/* ==== Per-sequence model state: the books of KV blocks and state slots ====
 *
 * The engine's side of the cache: which KV blocks and state slots are free, and each
 * sequence's block table. The storage itself (the blocks' K and V, the conv and delta-rule
 * state of every slot) is the backend's (backend/backend.h, st_bctx): a step's plan names
 * the slot and the blocks, and the backend reads and writes its own memory. A slot's state
 * is zeroed by the backend at the sequence's first step (position 0).
 *
 * The prefix cache (params.prefix): a KV block that a sequence has filled is registered
 * under its contents (the block before it, by id and generation, and its block_size token
 * ids; compared exactly, so a hash collision can cost a probe, never a wrong match). When its
 * last holder lets it go it stays registered with no holder (a "cached" block, least recently
 * used first) until a block is wanted and the free stack is empty; then the oldest cached
 * block is evicted (its generation bumped, so what named it no longer matches). A sequence
 * that fills a block equal to a registered one switches to that one (their contents are
 * equal bit for bit: a position's K and V depend only on the tokens up to it).
 *
 * State snapshots: the conv and delta-rule state of a sequence after pos positions, pos a
 * multiple of block_size, kept in the backend's snapshot slots (state slots n_slots + i).
 * A snapshot names its prefix by the registered block at pos - block_size; it holds no
 * block, and an eviction of that block makes it unreachable (it is freed when found so).
 * Public snapshots are found by st_cache_seq_start_prefix; the pool evicts the least
 * recently used of those no request has resumed from, then the least recently used; a running sequence may hold one private snapshot that it moves forward as it
 * decodes and that becomes public when the sequence is released (the end of a reply).
 * The caller copies state (backend state_copy) as these functions say.
 *
 * All memory is planned at creation: taking and returning blocks, slots or snapshots never
 * allocates. A sequence (st_seq) is a few integers and a borrowed row of block ids.
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
    int prefix;          /* keep filled blocks and state snapshots for reuse */
    int n_snapshots;     /* the snapshot pool (with prefix; state slots beyond n_slots) */
} st_cache_params;

st_cache_params st_cache_default_params(void);

/* One sequence's view of the cache: fixed-size, never grows. */
typedef struct st_seq {
    int slot;         /* state slot, -1 when not started */
    int64_t n_past;   /* positions already in the cache = position of the next token */
    int32_t n_blocks; /* KV blocks held */
    int32_t *blocks;  /* [max_blocks_per_seq] block ids; row `slot` of the cache's tables */
    int snap;         /* the private snapshot this sequence holds (prefix cache), -1: none */
    int private_kv;   /* 1: its blocks are never registered or shared (a prompt holding images:
                         its token ids do not say what its positions hold); forks inherit it */
} st_seq;

/* A snapshot's books (the state itself is the backend's slot n_slots + index). */
typedef struct st_snap {
    int64_t pos;       /* positions it holds; 0: free */
    int32_t base;      /* the registered block at pos - block_size */
    uint32_t base_gen; /* its generation then */
    int owner;         /* the state slot of the sequence holding it privately, -1: public */
    int used;          /* a request resumed from it (evicted after those that none did) */
    int32_t prev, next; /* the public snapshots, least recently used first */
} st_snap;

/* What the prefix cache did (counters since creation). */
typedef struct st_prefix_stats {
    int64_t lookups, lookup_tokens, hits, hit_tokens;
    int64_t snapshots_taken, snapshots_used, snapshots_evicted, snapshots_dropped;
    int64_t blocks_evicted, blocks_shared;
    int64_t cached_blocks, snapshots_public;
} st_prefix_stats;

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
    /* shared blocks (forks) and the prefix cache (the rest: p.prefix; NULL otherwise) */
    int32_t *ref;                   /* [n_blocks] sequences holding each block (always) */
    uint32_t *gen;                  /* [n_blocks] bumped whenever a block is given out fresh */
    int32_t *tokens;                /* [n_blocks][block_size] the ids of its positions */
    int32_t *parent;                /* [n_blocks] registered: the block before it, -1: first */
    uint32_t *parent_gen;           /* [n_blocks] */
    uint8_t *registered;            /* [n_blocks] */
    int32_t *bucket;                /* [n_buckets] first registered block of the bucket, -1 */
    int32_t *chain;                 /* [n_blocks] next registered block of its bucket */
    uint64_t bucket_mask;
    int32_t *lru_prev, *lru_next;   /* [n_blocks] cached blocks (registered, no holder) */
    int32_t lru_head, lru_tail;     /* oldest, newest; -1 */
    int64_t n_cached_blocks;
    st_snap *snaps;                 /* [n_snapshots] */
    int32_t snap_head, snap_tail;   /* public snapshots, oldest first */
    st_prefix_stats stats;
    size_t planned_bytes;           /* all of the above */
} st_cache;

st_status st_cache_create(const st_model *m, const st_cache_params *p, st_cache **out,
                          st_error *err);
void st_cache_destroy(st_cache *c);

/* What st_cache_create would allocate, without allocating (all 0 for bad parameters). */
typedef struct st_cache_plan {
    size_t total_bytes; /* everything */
    size_t block_bytes; /* one block's free-list entry, reference count and generation */
    size_t slot_bytes;  /* one slot's block table and free-list entry */
} st_cache_plan;
st_cache_plan st_cache_plan_of(const st_model *m, const st_cache_params *p);

/* The backend context a cache's sequences need, with max_tokens tokens per step. */
st_ctx_params st_cache_ctx_params(const st_cache *c, int max_tokens);

/* Take a state slot for a new sequence; ST_ERR_BUSY when none is free. */
st_status st_cache_seq_start(st_cache *c, st_seq *seq, st_error *err);
/* Blocks a sequence can still be given: the free stack and the cached blocks. */
int64_t st_cache_available_blocks(const st_cache *c);
/* The prefix cache: start a sequence for a prompt of n tokens, resumed from the longest
 * prefix of at most n - 1 positions that has its blocks and a snapshot. On a hit the
 * sequence holds those blocks, n_past is the prefix length and *snap_slot names the state
 * slot to copy into the sequence's slot; otherwise *snap_slot = -1 and n_past = 0. */
st_status st_cache_seq_start_prefix(st_cache *c, st_seq *seq, const int32_t *prompt, int64_t n,
                                    int *snap_slot, st_error *err);
/* A new sequence (started, empty) continues where parent is: it holds parent's full blocks
 * and a fresh block for the partial last one, whose id it returns (-1: none) with the block
 * to copy it from in *copy_from (backend kv_copy); the caller copies the state slot. The
 * caller has made sure a block is available (the parent's budget). */
int32_t st_cache_seq_fork(st_cache *c, const st_seq *parent, st_seq *child, int32_t *copy_from);
/* After a step: the sequence holds n more positions, with these token ids; blocks it filled
 * are registered (or exchanged for equal registered ones). */
void st_cache_seq_commit(st_cache *c, st_seq *seq, const int32_t *tokens, int64_t n);
/* A public snapshot of the sequence as it is now (n_past a multiple of block_size, > 0):
 * returns the state slot to copy the sequence's slot into, or -1 when none is needed (an
 * equal one exists, or the pool has no room). */
int st_cache_snap_public(st_cache *c, st_seq *seq);
/* Move the sequence's private snapshot to its present position (n_past a multiple of
 * block_size, > 0), taking one if it has none: the state slot to copy into, or -1. */
int st_cache_snap_private(st_cache *c, st_seq *seq);
/* Blocks needed so that the sequence holds n_past + n_new positions. */
int64_t st_cache_blocks_needed(const st_cache *c, const st_seq *seq, int64_t n_new);
/* Make room for n_new more positions (ST_ERR_LIMIT past max_seq_len, ST_ERR_BUSY when the
 * pool is empty; nothing is taken on failure). */
st_status st_cache_seq_reserve(st_cache *c, st_seq *seq, int64_t n_new, st_error *err);
/* Return the blocks beyond those n_past positions need (undoing a reservation). */
void st_cache_seq_trim(st_cache *c, st_seq *seq);
/* Return the sequence's blocks and slot to the pools (its filled registered blocks stay
 * cached, its private snapshot becomes public); seq becomes "not started". */
void st_cache_seq_release(st_cache *c, st_seq *seq);

#endif /* ST_ENGINE_CACHE_H */
