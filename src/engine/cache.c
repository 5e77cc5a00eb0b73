/* ==== The books of KV blocks and state slots (see cache.h) ==== */
#include "engine/cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/numeric.h"

st_cache_params st_cache_default_params(void) {
    st_cache_params p = {
        .n_slots = 1,
        .max_seq_len = 4096,
        .block_size = 16,
        .n_blocks = 0,
        .kv_dtype = ST_KV_F32,
    };
    return p;
}

/* Sizes of everything st_cache_create allocates; the caller has validated p. */
static void layout(st_cache *c, const st_model *m, const st_cache_params *p) {
    c->p = *p;
    c->n_full = m->n_full;
    c->n_linear = m->n_linear;
    c->vocab = m->cfg.vocab_size;
    c->max_blocks_per_seq = (p->max_seq_len + p->block_size - 1) / p->block_size;
    if (c->p.n_blocks <= 0) c->p.n_blocks = c->max_blocks_per_seq * p->n_slots;
    const size_t n_slots = (size_t)p->n_slots;
    if (!p->prefix || c->n_full == 0) {
        c->p.prefix = 0;
        c->p.n_snapshots = 0;
    }
    /* per block: its free-list entry, reference count and generation */
    c->planned_bytes = (size_t)c->p.n_blocks * 12 + n_slots * ((size_t)c->max_blocks_per_seq * 4 + sizeof(int));
    if (c->p.prefix) {
        uint64_t nb = 1;
        while (nb < (uint64_t)c->p.n_blocks * 2) nb <<= 1;
        c->bucket_mask = nb - 1;
        c->planned_bytes += (size_t)c->p.n_blocks * (4 * 5 + 1 + (size_t)p->block_size * 4) + (size_t)nb * 4 +
                            (size_t)c->p.n_snapshots * sizeof(st_snap);
    }
}

static st_status check_params(const st_cache_params *p, st_error *err) {
    if (p->n_slots < 1 || p->n_slots > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "cache: n_slots must be in [1, 2^20]");
    if (p->block_size < 1 || p->block_size > 4096)
        return st_error_set(err, ST_ERR_ARG, "cache: block_size must be in [1, 4096]");
    if (p->max_seq_len < 1 || p->max_seq_len > ((int64_t)1 << 30))
        return st_error_set(err, ST_ERR_ARG, "cache: max_seq_len must be in [1, 2^30]");
    if (p->n_snapshots < 0 || p->n_snapshots > (1 << 20))
        return st_error_set(err, ST_ERR_ARG, "cache: n_snapshots must be in [0, 2^20]");
    return ST_OK;
}

st_cache_plan st_cache_plan_of(const st_model *m, const st_cache_params *p) {
    st_cache_plan pl = {0, 0, 0};
    st_cache c;
    memset(&c, 0, sizeof c);
    if (check_params(p, NULL) != ST_OK) return pl;
    layout(&c, m, p);
    pl.total_bytes = c.planned_bytes;
    pl.block_bytes = 12;
    pl.slot_bytes = (size_t)c.max_blocks_per_seq * 4 + sizeof(int);
    return pl;
}

st_ctx_params st_cache_ctx_params(const st_cache *c, int max_tokens) {
    st_ctx_params p = {
        .max_tokens = max_tokens,
        .n_slots = c->p.n_slots,
        .n_blocks = c->p.n_blocks,
        .block_size = c->p.block_size,
        .max_seq_len = c->p.max_seq_len,
        .kv_dtype = c->p.kv_dtype,
        .n_snapshots = c->p.n_snapshots,
    };
    return p;
}

st_status st_cache_create(const st_model *m, const st_cache_params *p, st_cache **out,
                          st_error *err) {
    *out = NULL;
    st_status st = check_params(p, err);
    if (st != ST_OK) return st;
    st_cache *c = calloc(1, sizeof *c);
    if (!c) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    layout(c, m, p);
    if (c->p.n_blocks > INT32_MAX) {
        long long nb = (long long)c->p.n_blocks;
        free(c);
        return st_error_set(err, ST_ERR_ARG, "cache: too many KV blocks (%lld)", nb);
    }
    size_t n_slots = (size_t)p->n_slots;
    c->free_blocks = malloc((size_t)(c->p.n_blocks ? c->p.n_blocks : 1) * sizeof *c->free_blocks);
    c->block_tables = calloc(n_slots * (size_t)c->max_blocks_per_seq, sizeof *c->block_tables);
    c->free_slots = malloc(n_slots * sizeof *c->free_slots);
    int fail = !c->free_blocks || !c->block_tables || !c->free_slots;
    const size_t nb = (size_t)(c->p.n_blocks ? c->p.n_blocks : 1);
    c->ref = calloc(nb, sizeof *c->ref);
    c->gen = calloc(nb, sizeof *c->gen);
    fail |= !c->ref || !c->gen;
    if (!fail && c->p.prefix) {
        c->tokens = malloc(nb * (size_t)p->block_size * sizeof *c->tokens);
        c->parent = malloc(nb * sizeof *c->parent);
        c->parent_gen = calloc(nb, sizeof *c->parent_gen);
        c->registered = calloc(nb, 1);
        c->bucket = malloc((size_t)(c->bucket_mask + 1) * sizeof *c->bucket);
        c->chain = malloc(nb * sizeof *c->chain);
        c->lru_prev = malloc(nb * sizeof *c->lru_prev);
        c->lru_next = malloc(nb * sizeof *c->lru_next);
        c->snaps = calloc((size_t)(c->p.n_snapshots ? c->p.n_snapshots : 1), sizeof *c->snaps);
        fail = !c->tokens || !c->parent || !c->parent_gen || !c->registered || !c->bucket ||
               !c->chain || !c->lru_prev || !c->lru_next || !c->snaps;
        if (!fail) {
            for (uint64_t i = 0; i <= c->bucket_mask; i++) c->bucket[i] = -1;
            c->lru_head = c->lru_tail = -1;
            c->snap_head = c->snap_tail = -1;
            for (int i = 0; i < c->p.n_snapshots; i++) c->snaps[i].owner = -1;
        }
    }
    if (fail) {
        st_cache_destroy(c);
        return st_error_set(err, ST_ERR_NOMEM, "cache: cannot plan %lld KV blocks and %d state slots",
                            (long long)p->n_blocks, p->n_slots);
    }
    /* stacks: lowest ids on top */
    c->n_free_blocks = c->p.n_blocks;
    for (int64_t i = 0; i < c->p.n_blocks; i++)
        c->free_blocks[i] = (int32_t)(c->p.n_blocks - 1 - i);
    c->n_free_slots = p->n_slots;
    for (int i = 0; i < p->n_slots; i++) c->free_slots[i] = p->n_slots - 1 - i;
    *out = c;
    return ST_OK;
}

void st_cache_destroy(st_cache *c) {
    if (!c) return;
    free(c->free_blocks);
    free(c->block_tables);
    free(c->free_slots);
    free(c->ref);
    free(c->gen);
    free(c->tokens);
    free(c->parent);
    free(c->parent_gen);
    free(c->registered);
    free(c->bucket);
    free(c->chain);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->snaps);
    free(c);
}

st_status st_cache_seq_start(st_cache *c, st_seq *seq, st_error *err) {
    if (c->n_free_slots == 0)
        return st_error_set(err, ST_ERR_BUSY, "all %d sequence slots are in use", c->p.n_slots);
    int slot = c->free_slots[--c->n_free_slots];
    seq->slot = slot;
    seq->n_past = 0;
    seq->n_blocks = 0;
    seq->blocks = c->block_tables + (size_t)slot * (size_t)c->max_blocks_per_seq;
    seq->snap = -1;
    seq->private_kv = 0;
    return ST_OK;
}

int64_t st_cache_available_blocks(const st_cache *c) { return c->n_free_blocks + c->n_cached_blocks; }

/* ---- the prefix cache's blocks ---- */

static void lru_unlink(st_cache *c, int32_t b) {
    const int32_t p = c->lru_prev[b], n = c->lru_next[b];
    if (p >= 0) c->lru_next[p] = n;
    else c->lru_head = n;
    if (n >= 0) c->lru_prev[n] = p;
    else c->lru_tail = p;
    c->n_cached_blocks--;
}

static void lru_push(st_cache *c, int32_t b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_cached_blocks++;
}

static uint64_t block_key(int32_t parent, uint32_t parent_gen, const int32_t *tokens, int n) {
    uint64_t h = st_splitmix64(((uint64_t)(uint32_t)parent << 32 | parent_gen) ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = st_splitmix64(h ^ (uint32_t)tokens[i]);
    return h;
}

/* the registered block with these contents, -1: none */
static int32_t find_block(const st_cache *c, int32_t parent, uint32_t parent_gen, const int32_t *tokens) {
    const int bs = c->p.block_size;
    for (int32_t b = c->bucket[block_key(parent, parent_gen, tokens, bs) & c->bucket_mask]; b >= 0; b = c->chain[b])
        if (c->parent[b] == parent && c->parent_gen[b] == parent_gen &&
            memcmp(c->tokens + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof *tokens) == 0)
            return b;
    return -1;
}

static void unregister(st_cache *c, int32_t b) {
    const int bs = c->p.block_size;
    int32_t *at = &c->bucket[block_key(c->parent[b], c->parent_gen[b], c->tokens + (size_t)b * (size_t)bs, bs) &
                             c->bucket_mask];
    while (*at != b) {
        ST_ASSERT(*at >= 0);
        at = &c->chain[*at];
    }
    *at = c->chain[b];
    c->registered[b] = 0;
}

/* a block for new positions (the caller has checked that one is available) */
static int32_t take_block(st_cache *c) {
    int32_t b;
    if (c->n_free_blocks > 0) {
        b = c->free_blocks[--c->n_free_blocks];
    } else {
        ST_ASSERT(c->p.prefix && c->lru_head >= 0);
        b = c->lru_head;
        lru_unlink(c, b);
        unregister(c, b);
        c->stats.blocks_evicted++;
    }
    c->gen[b]++;
    c->ref[b] = 1;
    return b;
}

/* a holder lets block b go */
static void drop_block(st_cache *c, int32_t b) {
    ST_ASSERT(c->ref[b] > 0);
    if (--c->ref[b] > 0) return;
    if (c->p.prefix && c->registered[b]) {
        lru_push(c, b);
        return;
    }
    c->free_blocks[c->n_free_blocks++] = b;
}

/* a sequence takes block b (registered, or another holder's) */
static void hold_block(st_cache *c, int32_t b) {
    if (c->ref[b]++ == 0) lru_unlink(c, b);
}

/* ---- snapshots ---- */

static void snap_unlink(st_cache *c, int i) {
    st_snap *s = &c->snaps[i];
    if (s->prev >= 0) c->snaps[s->prev].next = s->next;
    else c->snap_head = s->next;
    if (s->next >= 0) c->snaps[s->next].prev = s->prev;
    else c->snap_tail = s->prev;
    c->stats.snapshots_public--;
}

static void snap_push(st_cache *c, int i) {
    st_snap *s = &c->snaps[i];
    s->owner = -1;
    s->prev = c->snap_tail;
    s->next = -1;
    if (c->snap_tail >= 0) c->snaps[c->snap_tail].next = i;
    else c->snap_head = i;
    c->snap_tail = i;
    c->stats.snapshots_public++;
}

static int snap_valid(const st_cache *c, const st_snap *s) {
    return s->pos > 0 && c->registered[s->base] && c->gen[s->base] == s->base_gen;
}

/* a free snapshot entry: an unused one, else the oldest public one that no request has
 * resumed from, else the oldest public one (a flood of new snapshots cannot push out those
 * that proved useful); -1 when all are private */
static int snap_take(st_cache *c) {
    for (int i = 0; i < c->p.n_snapshots; i++)
        if (c->snaps[i].pos == 0 && c->snaps[i].owner < 0) return i;
    int i = c->snap_head;
    for (int j = c->snap_head; j >= 0; j = c->snaps[j].next)
        if (!c->snaps[j].used) {
            i = j;
            break;
        }
    if (i < 0) return -1;
    snap_unlink(c, i);
    if (snap_valid(c, &c->snaps[i])) c->stats.snapshots_evicted++;
    else c->stats.snapshots_dropped++;
    c->snaps[i].pos = 0;
    return i;
}

/* the public snapshot of exactly this prefix, -1 */
static int snap_find(const st_cache *c, int64_t pos, int32_t base) {
    for (int i = c->snap_head; i >= 0; i = c->snaps[i].next) {
        const st_snap *s = &c->snaps[i];
        if (s->pos == pos && s->base == base && s->base_gen == c->gen[base] && c->registered[base]) return i;
    }
    return -1;
}

/* the prefix of the sequence as a snapshot names it: its last block (registered) */
static int seq_snap_base(const st_cache *c, const st_seq *seq, int32_t *base) {
    const int64_t bs = c->p.block_size;
    if (!c->p.prefix || seq->n_past <= 0 || seq->n_past % bs) return 0;
    *base = seq->blocks[seq->n_past / bs - 1];
    return c->registered[*base];
}

int st_cache_snap_public(st_cache *c, st_seq *seq) {
    int32_t base;
    if (!seq_snap_base(c, seq, &base)) return -1;
    int i = snap_find(c, seq->n_past, base);
    if (i >= 0) { /* an equal one: it becomes the newest */
        snap_unlink(c, i);
        snap_push(c, i);
        return -1;
    }
    if ((i = snap_take(c)) < 0) return -1;
    c->snaps[i] = (st_snap){.pos = seq->n_past, .base = base, .base_gen = c->gen[base], .owner = -1};
    snap_push(c, i);
    c->stats.snapshots_taken++;
    return c->p.n_slots + i;
}

int st_cache_snap_private(st_cache *c, st_seq *seq) {
    int32_t base;
    if (!seq_snap_base(c, seq, &base)) return -1;
    int i = seq->snap;
    if (i < 0 && (i = snap_take(c)) < 0) return -1;
    c->snaps[i] = (st_snap){.pos = seq->n_past, .base = base, .base_gen = c->gen[base], .owner = seq->slot,
                            .prev = -1, .next = -1};
    if (seq->snap < 0) c->stats.snapshots_taken++;
    seq->snap = i;
    return c->p.n_slots + i;
}

/* the sequence's private snapshot becomes public (or is freed when an equal one is public) */
static void snap_publish(st_cache *c, st_seq *seq) {
    const int i = seq->snap;
    if (i < 0) return;
    seq->snap = -1;
    st_snap *s = &c->snaps[i];
    s->owner = -1;
    if (!snap_valid(c, s) || snap_find(c, s->pos, s->base) >= 0) {
        s->pos = 0;
        return;
    }
    snap_push(c, i);
}

st_status st_cache_seq_start_prefix(st_cache *c, st_seq *seq, const int32_t *prompt, int64_t n,
                                    int *snap_slot, st_error *err) {
    *snap_slot = -1;
    st_status st = st_cache_seq_start(c, seq, err);
    if (st != ST_OK || !c->p.prefix) return st;
    const int bs = c->p.block_size;
    c->stats.lookups++;
    c->stats.lookup_tokens += n;
    /* the registered blocks of the prompt's prefix, at most n - 1 positions; the sequence's
     * table row holds them while we look (nothing is held yet) */
    int64_t k = 0;
    int32_t parent = -1;
    uint32_t pgen = 0;
    while ((k + 1) * bs <= n - 1) {
        int32_t b = find_block(c, parent, pgen, prompt + k * bs);
        if (b < 0) break;
        seq->blocks[k++] = b;
        parent = b;
        pgen = c->gen[b];
    }
    /* the longest of those prefixes with a snapshot (any, without linear layers) */
    int64_t best = 0;
    int snap = -1;
    if (c->n_linear == 0) {
        best = k;
    } else {
        for (int i = c->snap_head; i >= 0;) {
            st_snap *s = &c->snaps[i];
            const int next = s->next;
            if (!snap_valid(c, s)) { /* its prefix was evicted */
                snap_unlink(c, i);
                s->pos = 0;
                c->stats.snapshots_dropped++;
            } else {
                const int64_t j = s->pos / bs;
                if (j <= k && j > best && seq->blocks[j - 1] == s->base) {
                    best = j;
                    snap = i;
                }
            }
            i = next;
        }
    }
    for (int64_t j = 0; j < best; j++) hold_block(c, seq->blocks[j]);
    seq->n_blocks = (int32_t)best;
    seq->n_past = best * bs;
    if (best > 0) {
        c->stats.hits++;
        c->stats.hit_tokens += seq->n_past;
        c->stats.blocks_shared += best;
    }
    if (snap >= 0) {
        snap_unlink(c, snap);
        snap_push(c, snap);
        c->snaps[snap].used = 1;
        c->stats.snapshots_used++;
        *snap_slot = c->p.n_slots + snap;
    }
    return ST_OK;
}

int32_t st_cache_seq_fork(st_cache *c, const st_seq *parent, st_seq *child, int32_t *copy_from) {
    ST_ASSERT(parent->slot >= 0 && child->slot >= 0 && child->n_blocks == 0);
    const int64_t bs = c->p.block_size, full = c->n_full ? parent->n_past / bs : 0;
    for (int64_t j = 0; j < full; j++) {
        hold_block(c, parent->blocks[j]);
        child->blocks[child->n_blocks++] = parent->blocks[j];
    }
    child->n_past = parent->n_past;
    child->private_kv = parent->private_kv;
    *copy_from = -1;
    if (!c->n_full || parent->n_past % bs == 0) return -1;
    /* the partial block: the child writes its own positions after the parent's */
    ST_ASSERT(st_cache_available_blocks(c) > 0);
    const int32_t src = parent->blocks[full], dst = take_block(c);
    child->blocks[child->n_blocks++] = dst;
    if (c->p.prefix)
        memcpy(c->tokens + (size_t)dst * (size_t)bs, c->tokens + (size_t)src * (size_t)bs, (size_t)bs * sizeof *c->tokens);
    *copy_from = src;
    return dst;
}

void st_cache_seq_commit(st_cache *c, st_seq *seq, const int32_t *tokens, int64_t n) {
    ST_ASSERT(seq->slot >= 0);
    if (!c->p.prefix || seq->private_kv) {
        seq->n_past += n;
        return;
    }
    ST_ASSERT(seq->n_past + n <= (int64_t)seq->n_blocks * c->p.block_size);
    const int64_t bs = c->p.block_size;
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos = seq->n_past + i, j = pos / bs;
        int32_t b = seq->blocks[j];
        c->tokens[(size_t)b * (size_t)bs + (size_t)(pos % bs)] = tokens[i];
        if (pos % bs != bs - 1) continue;
        /* block j is full: register it, or take the registered one equal to it */
        const int32_t parent = j > 0 ? seq->blocks[j - 1] : -1;
        const uint32_t pgen = j > 0 ? c->gen[parent] : 0;
        const int32_t *tk = c->tokens + (size_t)b * (size_t)bs;
        const int32_t e = find_block(c, parent, pgen, tk);
        if (e >= 0 && e != b) {
            ST_ASSERT(!c->registered[b] && c->ref[b] == 1);
            hold_block(c, e);
            seq->blocks[j] = e;
            drop_block(c, b);
            c->stats.blocks_shared++;
        } else if (e < 0) {
            c->parent[b] = parent;
            c->parent_gen[b] = pgen;
            int32_t *head = &c->bucket[block_key(parent, pgen, tk, (int)bs) & c->bucket_mask];
            c->chain[b] = *head;
            *head = b;
            c->registered[b] = 1;
        }
    }
    seq->n_past += n;
}

int64_t st_cache_blocks_needed(const st_cache *c, const st_seq *seq, int64_t n_new) {
    if (c->n_full == 0) return 0;
    int64_t want = (seq->n_past + n_new + c->p.block_size - 1) / c->p.block_size;
    return want > seq->n_blocks ? want - seq->n_blocks : 0;
}

st_status st_cache_seq_reserve(st_cache *c, st_seq *seq, int64_t n_new, st_error *err) {
    ST_ASSERT(seq->slot >= 0);
    if (seq->n_past + n_new > c->p.max_seq_len)
        return st_error_set(err, ST_ERR_LIMIT,
                            "sequence of %lld positions exceeds the context length %lld",
                            (long long)(seq->n_past + n_new), (long long)c->p.max_seq_len);
    int64_t need = st_cache_blocks_needed(c, seq, n_new);
    if (need > st_cache_available_blocks(c))
        return st_error_set(err, ST_ERR_BUSY, "KV pool exhausted: need %lld blocks, %lld free",
                            (long long)need, (long long)st_cache_available_blocks(c));
    for (int64_t i = 0; i < need; i++) seq->blocks[seq->n_blocks++] = take_block(c);
    return ST_OK;
}

void st_cache_seq_trim(st_cache *c, st_seq *seq) {
    if (seq->slot < 0) return;
    const int64_t keep = c->n_full ? (seq->n_past + c->p.block_size - 1) / c->p.block_size : 0;
    while (seq->n_blocks > keep) drop_block(c, seq->blocks[--seq->n_blocks]);
}

void st_cache_seq_release(st_cache *c, st_seq *seq) {
    if (seq->slot < 0) return;
    if (c->p.prefix) snap_publish(c, seq);
    /* the last block first: a prefix's first blocks are the last evicted */
    for (int32_t i = seq->n_blocks - 1; i >= 0; i--) drop_block(c, seq->blocks[i]);
    c->free_slots[c->n_free_slots++] = seq->slot;
    seq->slot = -1;
    seq->n_blocks = 0;
    seq->n_past = 0;
    seq->blocks = NULL;
}
