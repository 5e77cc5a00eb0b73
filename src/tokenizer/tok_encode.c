/* ==== Tokenizer: encoding (added tokens, normalizer, pre-tokenizer, BPE) ====
 *
 * Mirrors Hugging Face tokenizers' encode(text, add_special_tokens=False):
 *   1. AddedVocabulary.extract_and_normalize: find added tokens whose normalized=false in the
 *      raw text (leftmost-longest; single_word / lstrip / rstrip as HF applies them); normalize
 *      each remaining gap; find normalized=true tokens in the normalized gaps.
 *   2. Pre-tokenize each remaining piece: the Split steps in order (each regex match and each
 *      gap between matches become pieces, combined per the step's behavior; empty pieces are
 *      dropped), then ByteLevel (optional prefix space, optional GPT-2 regex split).
 *   3. BPE on each piece: the piece's bytes are the initial symbols (ids of the one-byte tokens;
 *      the byte -> unicode mapping is folded into byte_id), then the lowest-ranked adjacent pair
 *      is merged repeatedly, leftmost first on ties (a heap of candidate merges, as in HF's
 *      Word::merge_all).
 * The pieces are processed as they are produced (a depth-first walk over the steps), so the
 * only buffers are per-call scratch that grows to the largest piece.
 *
 * Thread safety: everything per call lives in enc_ctx; the tokenizer is read-only except the
 * word cache, taken with pthread_mutex_trylock once per call (skipped when busy).
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* ==== Per-call context ==== */

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the live list, -1 none */
    int32_t len;        /* bytes covered; 0 once merged into its left neighbour */
} bpe_sym;

typedef struct bpe_cand {
    uint32_t rank;
    int32_t pos;           /* left symbol */
    int32_t left, right;   /* the pair's ids when queued (stale when they changed) */
    int32_t new_id;
} bpe_cand;

typedef struct enc_ctx {
    const st_tokenizer *t;
    int parse_special;
    st_tok_ids *out;         /* ids are appended here (encode mode) */
    size_t max_ids;          /* stop with ST_ERR_LIMIT once out holds more (0: no limit) */
    st_tok_piece_fn fn;      /* or pieces are reported here (split mode) */
    void *user;
    pcre2_match_data *md;    /* owned, sized for the tokenizer's largest pattern */
    char *nbuf;              /* normalizer output, owned [ncap] */
    size_t ncap;
    int32_t *u32;            /* utf8proc scratch, owned [u32cap] */
    size_t u32cap;
    char *pbuf;              /* ByteLevel prefix-space copy, owned [pcap] */
    size_t pcap;
    char *mbuf;              /* byte-level string of a piece (ignore_merges), owned [mcap] */
    size_t mcap;
    bpe_sym *sym;            /* [sym_cap], owned */
    size_t sym_cap;
    bpe_cand *heap;          /* [heap_cap], owned */
    size_t heap_cap, heap_n;
    st_tok_cache_slot *cache; /* the tokenizer's cache while we hold its lock, else NULL */
    st_error *err;
} enc_ctx;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static st_status nomem(enc_ctx *c) {
    return st_error_set(c->err, ST_ERR_NOMEM, "encode: out of memory");
}

static st_status push_id(enc_ctx *c, int32_t id) {
    st_tok_ids *o = c->out;
    if (o->n == o->cap && grow((void **)&o->ids, &o->cap, o->n + 1, sizeof *o->ids) != 0)
        return nomem(c);
    o->ids[o->n++] = id;
    return ST_OK;
}

/* ==== Normalizer ==== */

static utf8proc_option_t norm_options(int op) {
    utf8proc_option_t o = UTF8PROC_STABLE;
    switch (op) {
    case ST_TOK_NORM_NFC: return o | UTF8PROC_COMPOSE;
    case ST_TOK_NORM_NFD: return o | UTF8PROC_DECOMPOSE;
    case ST_TOK_NORM_NFKC: return o | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    default: return o | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    }
}

/* Normalize the region s[0..n) and append it to buf at *w. */
static st_status norm_region(const char *s, size_t n, utf8proc_option_t opts, char **buf,
                             size_t *cap, size_t *w, int32_t **u32, size_t *u32cap, st_error *err) {
    for (;;) {
        utf8proc_ssize_t r = utf8proc_decompose_custom((const utf8proc_uint8_t *)s,
                                                       (utf8proc_ssize_t)n, *u32,
                                                       (utf8proc_ssize_t)*u32cap, opts, NULL, NULL);
        if (r < 0)
            return st_error_set(err, ST_ERR_INTERNAL, "normalizer: %s",
                                utf8proc_errmsg(r));
        if ((size_t)r > *u32cap) {
            if (grow((void **)u32, u32cap, (size_t)r, sizeof **u32) != 0)
                return st_error_set(err, ST_ERR_NOMEM, "normalizer: out of memory");
            continue;
        }
        r = utf8proc_reencode(*u32, r, opts);
        if (r < 0)
            return st_error_set(err, ST_ERR_INTERNAL, "normalizer: %s", utf8proc_errmsg(r));
        if (grow((void **)buf, cap, *w + (size_t)r + 1, 1) != 0)
            return st_error_set(err, ST_ERR_NOMEM, "normalizer: out of memory");
        memcpy(*buf + *w, *u32, (size_t)r);
        *w += (size_t)r;
        return ST_OK;
    }
}

/* One normalization form over s into *buf. ASCII needs no work; a boundary just before an
 * ASCII character is always stable (ASCII is a starter that composes with nothing before it),
 * so only each non-ASCII run, together with the ASCII character before it (which may compose
 * with a following mark), goes through utf8proc. */
static st_status norm_one(int op, const char *s, size_t n, char **buf, size_t *cap, size_t *out_n,
                          int32_t **u32, size_t *u32cap, st_error *err) {
    utf8proc_option_t opts = norm_options(op);
    size_t w = 0, i = 0;
    if (grow((void **)buf, cap, n + 1, 1) != 0)
        return st_error_set(err, ST_ERR_NOMEM, "normalizer: out of memory");
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        size_t rs = j == n ? n : (j > i ? j - 1 : j);
        if (grow((void **)buf, cap, w + (rs - i) + 1, 1) != 0)
            return st_error_set(err, ST_ERR_NOMEM, "normalizer: out of memory");
        memcpy(*buf + w, s + i, rs - i);
        w += rs - i;
        if (j == n) break;
        size_t k = j;
        while (k < n && (unsigned char)s[k] >= 0x80) k++;
        st_status st = norm_region(s + rs, k - rs, opts, buf, cap, &w, u32, u32cap, err);
        if (st != ST_OK) return st;
        i = k;
    }
    *out_n = w;
    return ST_OK;
}

st_status st_tok_normalize(const st_tokenizer *t, const char *s, size_t n, char **buf,
                           size_t *cap, int32_t **u32, size_t *u32cap, const char **out,
                           size_t *out_len, st_error *err) {
    *out = s;
    *out_len = n;
    for (int k = 0; k < t->n_norm; k++) {
        const char *cur = *out;
        size_t cur_n = *out_len;
        size_t i = 0;
        while (i < cur_n && (unsigned char)cur[i] < 0x80) i++;
        if (i == cur_n) return ST_OK; /* ASCII is invariant under every form */
        char *copy = NULL;
        if (cur == *buf) { /* a second form reads the first one's output */
            copy = malloc(cur_n ? cur_n : 1);
            if (!copy) return st_error_set(err, ST_ERR_NOMEM, "normalizer: out of memory");
            memcpy(copy, cur, cur_n);
            cur = copy;
        }
        size_t w = 0;
        st_status st = norm_one(t->norm[k], cur, cur_n, buf, cap, &w, u32, u32cap, err);
        free(copy);
        if (st != ST_OK) return st;
        *out = *buf;
        *out_len = w;
    }
    return ST_OK;
}

/* ==== BPE ==== */

static inline int merge_lookup(const st_tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                               int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    int64_t v;
    if (!st_strmap_get(&t->merges, (const char *)&key, 8, &v)) return 0;
    *rank = (uint32_t)((uint64_t)v >> 32);
    *new_id = (int32_t)(v & 0xffffffff);
    return 1;
}

static inline int cand_less(const bpe_cand *x, const bpe_cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static st_status heap_push(enc_ctx *c, const bpe_cand *v) {
    if (grow((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap) != 0)
        return nomem(c);
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(v, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = *v;
    return ST_OK;
}

static bpe_cand heap_pop(enc_ctx *c) {
    bpe_cand top = c->heap[0];
    bpe_cand last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_cand *best = &last;
        if (l < n && cand_less(&c->heap[l], best)) m = l, best = &c->heap[l];
        if (r < n && cand_less(&c->heap[r], best)) m = r, best = &c->heap[r];
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

static st_status queue_pair(enc_ctx *c, int32_t pos) {
    bpe_sym *s = c->sym;
    int32_t nx = s[pos].next;
    bpe_cand v;
    if (nx < 0 || !merge_lookup(c->t, s[pos].id, s[nx].id, &v.rank, &v.new_id)) return ST_OK;
    v.pos = pos;
    v.left = s[pos].id;
    v.right = s[nx].id;
    return heap_push(c, &v);
}

/* The first pairs of a piece whose symbols are all one-byte tokens: from the byte-pair table. */
static st_status queue_byte_pairs(enc_ctx *c, const uint8_t *s, size_t n) {
    const int64_t *bp = c->t->byte_pair;
    for (size_t i = 0; i + 1 < n; i++) {
        int64_t m = bp[(size_t)s[i] << 8 | s[i + 1]];
        if (m < 0) continue;
        bpe_cand v = {(uint32_t)((uint64_t)m >> 32), (int32_t)i, c->sym[i].id, c->sym[i + 1].id,
                      (int32_t)(m & 0xffffffff)};
        st_status st = heap_push(c, &v);
        if (st != ST_OK) return st;
    }
    return ST_OK;
}

/* Append a symbol (HF's Word::add). */
static void add_sym(enc_ctx *c, size_t *n, int32_t id, int32_t len) {
    bpe_sym *s = &c->sym[*n];
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = -1;
    if (*n > 0) c->sym[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* The initial symbols of a piece (HF's BPE::merge_word before merge_all): one per byte-level
 * character, i.e. per byte; a character missing from the vocab goes to byte fallback, then to
 * the unk token (fused when fuse_unk), and is dropped when there is neither (as in HF). */
static st_status initial_symbols(enc_ctx *c, const uint8_t *s, size_t n, size_t *n_sym,
                                 int *all_bytes) {
    const st_tokenizer *t = c->t;
    /* byte fallback can produce 2 symbols per byte (the mapped character's UTF-8) */
    if (grow((void **)&c->sym, &c->sym_cap, 2 * n + 1, sizeof *c->sym) != 0) return nomem(c);
    size_t k = 0;
    int32_t unk_len = 0; /* pending unk symbol's length, 0 none */
    *all_bytes = 1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) {
            if (unk_len) add_sym(c, &k, t->unk_id, unk_len), unk_len = 0;
            add_sym(c, &k, id, 1);
            continue;
        }
        *all_bytes = 0;
        if (t->byte_fallback) {
            char u[4];
            utf8proc_ssize_t ul =
                utf8proc_encode_char((utf8proc_int32_t)st_tok_byte_to_cp(s[i]), (utf8proc_uint8_t *)u);
            int ok = 1;
            for (utf8proc_ssize_t q = 0; q < ul; q++) ok &= t->fallback_id[(uint8_t)u[q]] >= 0;
            if (ok) {
                for (utf8proc_ssize_t q = 0; q < ul; q++)
                    add_sym(c, &k, t->fallback_id[(uint8_t)u[q]], 1);
                continue;
            }
        }
        if (t->has_unk) {
            if (t->unk_id < 0)
                return st_error_set(c->err, ST_ERR_FORMAT,
                                    "%s: model.unk_token is needed but is not in the vocab",
                                    t->name);
            if (unk_len && !t->fuse_unk) add_sym(c, &k, t->unk_id, unk_len), unk_len = 0;
            unk_len += 1;
        }
    }
    if (unk_len) add_sym(c, &k, t->unk_id, unk_len);
    *n_sym = k;
    return ST_OK;
}

/* Short pieces: the same merge order without a heap. Each round merges the lowest-ranked
 * adjacent pair, the leftmost on ties, which is what the heap pops first (positions keep their
 * order); with up to BPE_SMALL symbols a linear scan over a rank array is cheaper. */
#define BPE_SMALL 48
static st_status bpe_small(enc_ctx *c, const uint8_t *s, size_t m, int all_bytes) {
    const st_tokenizer *t = c->t;
    int32_t id[BPE_SMALL], nid[BPE_SMALL];
    uint32_t rank[BPE_SMALL];
    for (size_t i = 0; i < m; i++) id[i] = c->sym[i].id;
    for (size_t i = 0; i + 1 < m; i++) {
        if (all_bytes) {
            int64_t v = t->byte_pair[(size_t)s[i] << 8 | s[i + 1]];
            rank[i] = v < 0 ? UINT32_MAX : (uint32_t)((uint64_t)v >> 32);
            nid[i] = (int32_t)(v & 0xffffffff);
        } else if (!merge_lookup(t, id[i], id[i + 1], &rank[i], &nid[i])) {
            rank[i] = UINT32_MAX;
        }
    }
    while (m > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = nid[best];
        /* drop symbol best + 1 and the pair it started */
        for (size_t i = best + 1; i + 1 < m; i++) id[i] = id[i + 1];
        for (size_t i = best + 1; i + 2 < m; i++) rank[i] = rank[i + 1], nid[i] = nid[i + 1];
        m--;
        if (best > 0 && !merge_lookup(t, id[best - 1], id[best], &rank[best - 1], &nid[best - 1]))
            rank[best - 1] = UINT32_MAX;
        if (best + 1 < m && !merge_lookup(t, id[best], id[best + 1], &rank[best], &nid[best]))
            rank[best] = UINT32_MAX;
    }
    st_tok_ids *o = c->out;
    if (grow((void **)&o->ids, &o->cap, o->n + m, sizeof *o->ids) != 0) return nomem(c);
    memcpy(o->ids + o->n, id, m * sizeof *id);
    o->n += m;
    return ST_OK;
}

/* BPE of one piece; appends the ids to c->out. */
static st_status bpe_piece(enc_ctx *c, const uint8_t *s, size_t n) {
    const st_tokenizer *t = c->t;
    st_status st;
    if (n == 1 && t->byte_id[s[0]] >= 0) return push_id(c, t->byte_id[s[0]]);

    st_tok_cache_slot *slot = NULL;
    if (c->cache && n <= ST_TOK_CACHE_KEY) {
        slot = &c->cache[st_hash_bytes(s, n) & (ST_TOK_CACHE_SLOTS - 1)];
        if (slot->klen == n && memcmp(slot->key, s, n) == 0) {
            st_tok_ids *o = c->out;
            if (grow((void **)&o->ids, &o->cap, o->n + slot->nids, sizeof *o->ids) != 0)
                return nomem(c);
            memcpy(o->ids + o->n, slot->ids, slot->nids * sizeof *o->ids);
            o->n += slot->nids;
            return ST_OK;
        }
    }
    size_t first = c->out->n;

    if (t->ignore_merges) {
        /* the whole piece, as its byte-level string, may be a token by itself */
        if (grow((void **)&c->mbuf, &c->mcap, 2 * n, 1) != 0) return nomem(c);
        size_t w = 0;
        for (size_t i = 0; i < n; i++)
            w += (size_t)utf8proc_encode_char((utf8proc_int32_t)st_tok_byte_to_cp(s[i]),
                                              (utf8proc_uint8_t *)c->mbuf + w);
        int64_t id;
        if (st_strmap_get(&t->vocab, c->mbuf, w, &id)) {
            if ((st = push_id(c, (int32_t)id)) != ST_OK) return st;
            goto done;
        }
    }

    size_t n_sym = 0;
    int all_bytes;
    if ((st = initial_symbols(c, s, n, &n_sym, &all_bytes)) != ST_OK) return st;
    if (n_sym == 0) return ST_OK;
    if (n_sym <= BPE_SMALL) {
        if ((st = bpe_small(c, s, n_sym, all_bytes)) != ST_OK) return st;
        goto done;
    }
    c->heap_n = 0;
    if (all_bytes) {
        if ((st = queue_byte_pairs(c, s, n)) != ST_OK) return st;
    } else {
        for (size_t i = 0; i + 1 < n_sym; i++)
            if ((st = queue_pair(c, (int32_t)i)) != ST_OK) return st;
    }
    bpe_sym *y = c->sym;
    while (c->heap_n) {
        bpe_cand top = heap_pop(c);
        bpe_sym *l = &y[top.pos];
        if (l->len == 0 || l->next < 0) continue;
        bpe_sym *r = &y[l->next];
        /* stale entry: one side changed since it was queued (a changed pair can never
         * merge into the same token, so this is HF's new_id check) */
        if (l->id != top.left || r->id != top.right) continue;
        l->id = top.new_id;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) y[l->next].prev = top.pos;
        if (l->prev >= 0 && (st = queue_pair(c, l->prev)) != ST_OK) return st;
        if ((st = queue_pair(c, top.pos)) != ST_OK) return st;
    }
    for (int32_t i = 0; i >= 0; i = y[i].next)
        if ((st = push_id(c, y[i].id)) != ST_OK) return st;

done:
    if (slot) {
        size_t k = c->out->n - first;
        if (k <= ST_TOK_CACHE_IDS) {
            slot->klen = (uint8_t)n;
            slot->nids = (uint8_t)k;
            memcpy(slot->key, s, n);
            memcpy(slot->ids, c->out->ids + first, k * sizeof *slot->ids);
        }
    }
    return ST_OK;
}

/* A finished pre-token: to BPE, or to the caller in split mode. */
static st_status over_limit(enc_ctx *c) {
    return st_error_set(c->err, ST_ERR_LIMIT, "encode: more than %zu tokens", c->max_ids);
}

static st_status emit_piece(enc_ctx *c, const char *s, size_t n) {
    if (c->fn) {
        st_tok_piece p = {s, n, -1};
        return c->fn(&p, c->user) ? st_error_set(c->err, ST_ERR_CANCELLED, "split: stopped")
                                  : ST_OK;
    }
    /* a piece gives at least one id per max_token_bytes bytes: a long one past the limit is
     * refused before its merges are worked out */
    size_t at_least = c->t->max_token_bytes ? n / c->t->max_token_bytes : 0;
    if (c->max_ids && c->out->n + at_least > c->max_ids) return over_limit(c);
    st_status st = bpe_piece(c, (const uint8_t *)s, n);
    if (st == ST_OK && c->max_ids && c->out->n > c->max_ids) return over_limit(c);
    return st;
}

static st_status emit_added(enc_ctx *c, const char *s, size_t n, int32_t id) {
    if (c->fn) {
        st_tok_piece p = {s, n, id};
        return c->fn(&p, c->user) ? st_error_set(c->err, ST_ERR_CANCELLED, "split: stopped")
                                  : ST_OK;
    }
    st_status st = push_id(c, id);
    if (st == ST_OK && c->max_ids && c->out->n > c->max_ids) return over_limit(c);
    return st;
}

/* ==== Pre-tokenizer ==== */

static st_status pretok(enc_ctx *c, int step, const char *s, size_t n);

/* Groups of the Split behaviours, built while the matches stream in. */
typedef struct split_state {
    enc_ctx *c;
    int step, behavior;
    const char *s;
    size_t g_start, g_end; /* pending group */
    int g_valid, g_match;  /* group exists; its last element was a match */
    int prev_match;        /* is_match of the previous element */
} split_state;

static st_status split_flush(split_state *ss) {
    if (!ss->g_valid) return ST_OK;
    ss->g_valid = 0;
    if (ss->g_end == ss->g_start) return ST_OK; /* empty pieces are dropped */
    return pretok(ss->c, ss->step + 1, ss->s + ss->g_start, ss->g_end - ss->g_start);
}

/* One element of HF's find_matches list: [a, b) and whether the pattern matched it. */
static st_status split_elem(split_state *ss, size_t a, size_t b, int is_match) {
    st_status st = ST_OK;
    switch (ss->behavior) {
    case ST_TOK_SPLIT_ISOLATED:
        if (b > a) st = pretok(ss->c, ss->step + 1, ss->s + a, b - a);
        break;
    case ST_TOK_SPLIT_REMOVED:
        if (!is_match && b > a) st = pretok(ss->c, ss->step + 1, ss->s + a, b - a);
        break;
    case ST_TOK_SPLIT_MERGED_PREV: /* a match joins the non-match before it */
        if (is_match && !ss->prev_match && ss->g_valid) {
            ss->g_end = b;
        } else {
            st = split_flush(ss);
            ss->g_start = a, ss->g_end = b, ss->g_valid = 1;
        }
        break;
    case ST_TOK_SPLIT_MERGED_NEXT: /* a match joins the non-match after it */
        if (ss->g_valid && ss->g_match && !is_match) {
            ss->g_end = b;
            st = split_flush(ss);
        } else {
            st = split_flush(ss);
            ss->g_start = a, ss->g_end = b, ss->g_valid = 1, ss->g_match = is_match;
        }
        break;
    default: /* Contiguous: runs of matches, runs of non-matches */
        if (ss->g_valid && is_match == ss->prev_match) {
            ss->g_end = b;
        } else {
            st = split_flush(ss);
            ss->g_start = a, ss->g_end = b, ss->g_valid = 1;
        }
        break;
    }
    ss->prev_match = is_match;
    return st;
}

/* Run a regex over s and feed HF's (offsets, is_match) list to the behaviour. Matching follows
 * the onig crate's find_iter: an empty match right where the previous match ended is skipped
 * by advancing one character. */
static st_status split_regex(enc_ctx *c, int step, const st_tok_regex *re, int behavior,
                             int invert, const char *s, size_t n) {
    split_state ss = {c, step, behavior, s, 0, 0, 0, 0, 0};
    size_t prev = 0, last_end = 0;
    long last_match_end = -1;
    st_status st = ST_OK;
    while (last_end <= n) {
        size_t ms, me;
        int r = st_tok_regex_find(re, s, n, last_end, c->md, NULL, &ms, &me, c->err);
        if (r < 0) return c->err ? c->err->status : ST_ERR_LIMIT;
        if (r == 0) break;
        if (ms == me && last_match_end == (long)me) {
            int l = last_end < n ? st_utf8_seq((const uint8_t *)s + last_end, n - last_end, NULL)
                                 : 1;
            last_end += (size_t)(l > 0 ? l : 1);
            continue;
        }
        last_end = me;
        last_match_end = (long)me;
        if (prev != ms && (st = split_elem(&ss, prev, ms, invert)) != ST_OK) return st;
        if ((st = split_elem(&ss, ms, me, !invert)) != ST_OK) return st;
        prev = me;
    }
    if (prev != n && (st = split_elem(&ss, prev, n, invert)) != ST_OK) return st;
    return split_flush(&ss);
}

/* Step `step` of the pre-tokenizer on a non-empty piece. */
static st_status pretok(enc_ctx *c, int step, const char *s, size_t n) {
    const st_tok_step *p = &c->t->steps[step];
    if (!p->byte_level)
        return split_regex(c, step, &p->re, p->behavior, p->invert, s, n);
    /* ByteLevel: the last step */
    if (p->add_prefix_space && s[0] != ' ') {
        if (grow((void **)&c->pbuf, &c->pcap, n + 1, 1) != 0) return nomem(c);
        c->pbuf[0] = ' ';
        memcpy(c->pbuf + 1, s, n);
        s = c->pbuf;
        n++;
    }
    if (!p->has_re) return emit_piece(c, s, n);
    /* the GPT-2 split, Isolated: every match and every gap is a piece */
    size_t prev = 0, last_end = 0;
    long last_match_end = -1;
    st_status st;
    while (last_end <= n) {
        size_t ms, me;
        int r = st_tok_regex_find(&p->re, s, n, last_end, c->md, NULL, &ms, &me, c->err);
        if (r < 0) return c->err ? c->err->status : ST_ERR_LIMIT;
        if (r == 0) break;
        if (ms == me && last_match_end == (long)me) {
            int l = last_end < n ? st_utf8_seq((const uint8_t *)s + last_end, n - last_end, NULL)
                                 : 1;
            last_end += (size_t)(l > 0 ? l : 1);
            continue;
        }
        last_end = me;
        last_match_end = (long)me;
        if (ms > prev && (st = emit_piece(c, s + prev, ms - prev)) != ST_OK) return st;
        if (me > ms && (st = emit_piece(c, s + ms, me - ms)) != ST_OK) return st;
        prev = me;
    }
    if (prev < n) return emit_piece(c, s + prev, n - prev);
    return ST_OK;
}

/* ==== Added tokens ==== */

/* Leftmost-longest match of the trie in s[from..n). */
static int trie_find(const st_tok_trie *tr, const uint8_t *s, size_t n, size_t from, size_t *ms,
                     size_t *me, int32_t *added) {
    for (size_t p = from; p < n; p++) {
        int32_t node = tr->root[s[p]];
        if (node < 0) continue;
        int32_t best = -1;
        size_t best_end = 0, q = p + 1;
        for (;;) {
            if (tr->nodes[node].added >= 0) best = tr->nodes[node].added, best_end = q;
            if (q >= n) break;
            int32_t ch = tr->nodes[node].child;
            while (ch >= 0 && tr->nodes[ch].byte != s[q]) ch = tr->nodes[ch].sibling;
            if (ch < 0) break;
            node = ch;
            q++;
        }
        if (best >= 0) {
            *ms = p;
            *me = best_end;
            *added = best;
            return 1;
        }
    }
    return 0;
}

/* The character that ends at s[end) / starts at s[start]; s is valid UTF-8. */
static uint32_t char_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp = 0;
    st_utf8_seq((const uint8_t *)s + i, end - i, &cp);
    return cp;
}

static uint32_t char_at(const char *s, size_t n, size_t start, int *len) {
    uint32_t cp = 0;
    *len = st_utf8_seq((const uint8_t *)s + start, n - start, &cp);
    if (*len <= 0) *len = 1;
    return cp;
}

typedef st_status (*gap_fn)(enc_ctx *c, const char *s, size_t n);

/* HF's AddedVocabulary::find_matches + split_with_indices over one string: gaps go to `gap`,
 * tokens are emitted. */
static st_status split_added(enc_ctx *c, const st_tok_trie *tr, const char *s, size_t n,
                             gap_fn gap) {
    const st_tokenizer *t = c->t;
    if (tr->n_tokens == 0) return n ? gap(c, s, n) : ST_OK;
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t k;
    st_status st;
    while (trie_find(tr, (const uint8_t *)s, n, pos, &ms, &me, &k)) {
        pos = me;
        const st_tok_added *a = &t->added[k];
        if (a->special && !c->parse_special) continue;
        if (a->single_word) {
            int l;
            int start_ok = ms == 0 || !st_tok_is_word_char(char_before(s, ms));
            int stop_ok = me == n || !st_tok_is_word_char(char_at(s, n, me, &l));
            if (!start_ok || !stop_ok) continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                if (!st_tok_is_white_space(char_before(s, ns))) break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                uint32_t cp = char_at(s, n, stop, &l);
                if (!st_tok_is_white_space(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start && (st = gap(c, s + start_offset, start - start_offset)) != ST_OK)
            return st;
        if ((st = emit_added(c, s + start, stop - start, a->id)) != ST_OK) return st;
        start_offset = stop;
    }
    if (start_offset < n) return gap(c, s + start_offset, n - start_offset);
    return ST_OK;
}

/* A gap of the normalized text: pre-tokenize it. */
static st_status gap_normalized(enc_ctx *c, const char *s, size_t n) { return pretok(c, 0, s, n); }

/* A gap of the raw text: normalize, then look for normalized added tokens. */
static st_status gap_raw(enc_ctx *c, const char *s, size_t n) {
    const char *ns;
    size_t nn;
    st_status st = st_tok_normalize(c->t, s, n, &c->nbuf, &c->ncap, &c->u32, &c->u32cap, &ns, &nn,
                                    c->err);
    if (st != ST_OK) return st;
    if (nn == 0) return ST_OK;
    return split_added(c, &c->t->norm_trie, ns, nn, gap_normalized);
}

/* ==== Entry points ==== */

static st_status run(const st_tokenizer *t, const char *text, size_t len, int parse_special,
                     size_t max_ids, st_tok_ids *out, st_tok_piece_fn fn, void *user,
                     st_error *err) {
    if (!t) return st_error_set(err, ST_ERR_ARG, "encode: no tokenizer");
    if (!text && len) return st_error_set(err, ST_ERR_ARG, "encode: text is NULL");
    if (len > ST_TOK_MAX_TEXT_BYTES)
        return st_error_set(err, ST_ERR_LIMIT, "encode: text of %zu bytes exceeds the limit of %zu",
                            len, ST_TOK_MAX_TEXT_BYTES);
    size_t bad = st_utf8_check((const uint8_t *)text, len);
    if (bad < len)
        return st_error_set(err, ST_ERR_ARG, "encode: text is not valid UTF-8 (byte %zu)", bad);
    if (len == 0) return ST_OK;

    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.parse_special = parse_special;
    c.out = out;
    c.max_ids = max_ids;
    c.fn = fn;
    c.user = user;
    c.err = err;
    c.md = pcre2_match_data_create(t->max_capture_pairs, NULL);
    if (!c.md) return st_error_set(err, ST_ERR_NOMEM, "encode: out of memory");
    pthread_mutex_t *lock = (pthread_mutex_t *)&t->cache_lock; /* the one mutable part */
    if (!fn && t->cache && pthread_mutex_trylock(lock) == 0) c.cache = t->cache;

    st_status st = split_added(&c, &t->raw_trie, text, len, gap_raw);

    if (c.cache) pthread_mutex_unlock(lock);
    pcre2_match_data_free(c.md);
    free(c.nbuf);
    free(c.u32);
    free(c.pbuf);
    free(c.mbuf);
    free(c.sym);
    free(c.heap);
    return st;
}

st_status st_tok_encode_append(const st_tokenizer *tok, const char *text, size_t len,
                               int parse_special, st_tok_ids *out, st_error *err) {
    if (!out) return st_error_set(err, ST_ERR_ARG, "encode: no output buffer");
    size_t n0 = out->n;
    st_status st = run(tok, text, len, parse_special, 0, out, NULL, NULL, err);
    if (st != ST_OK) out->n = n0;
    return st;
}

st_status st_tok_encode_limit(const st_tokenizer *tok, const char *text, size_t len,
                              int parse_special, size_t max_ids, int32_t **ids, size_t *n,
                              st_error *err) {
    *ids = NULL;
    *n = 0;
    st_tok_ids v = {NULL, 0, 0};
    st_status st = run(tok, text, len, parse_special, max_ids, &v, NULL, NULL, err);
    if (st != ST_OK || v.n == 0) {
        st_tok_ids_free(&v);
        return st;
    }
    *ids = v.ids;
    *n = v.n;
    return ST_OK;
}

st_status st_tok_encode(const st_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n, st_error *err) {
    return st_tok_encode_limit(tok, text, len, parse_special, 0, ids, n, err);
}

void st_tok_ids_free(st_tok_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

st_status st_tok_split(const st_tokenizer *tok, const char *text, size_t len, int parse_special,
                       st_tok_piece_fn fn, void *user, st_error *err) {
    if (!fn) return st_error_set(err, ST_ERR_ARG, "split: no callback");
    return run(tok, text, len, parse_special, 0, NULL, fn, user, err);
}
