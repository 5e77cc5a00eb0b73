/* ==== Tokenizer internals shared by tok_*.c (not part of the public API) ====
 *
 * The loaded tokenizer is one immutable struct (plus the mutex-guarded word cache). Token
 * strings and their decoded bytes live in one arena sized before it is filled, so the string
 * maps that borrow keys from it stay valid. BPE works on token ids: the initial symbols of a
 * pre-token are the ids of its single bytes (byte_id), and merges are looked up by the pair of
 * ids packed into 8 bytes.
 */
#ifndef ST_TOKENIZER_TOK_INTERNAL_H
#define ST_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/utf8.h"
#include "core/strmap.h"
#include "tokenizer/tokenizer.h"

/* ==== Regex (tok_regex.c) ==== */

typedef struct st_tok_regex {
    pcre2_code *code; /* owned; read-only after compile, shared by all threads */
    int jit;          /* 1 when JIT-compiled */
} st_tok_regex;

/* Compile a pattern from tokenizer.json. Oniguruma-only escapes (\s, \S, \w, \W, \h, \H, \v)
 * and option letters are rewritten so that PCRE2 (UTF + UCP) matches what Oniguruma matches.
 * literal != 0 compiles the text as a literal string (Split's {"String": ...}).
 * `what` names the field in messages. */
st_status st_tok_regex_compile(st_tok_regex *re, const char *pat, size_t len, int literal,
                               const char *what, st_error *err);
void st_tok_regex_free(st_tok_regex *re);

/* Find the next match in s[0..n) at or after `start` (a character boundary; s is valid UTF-8).
 * Returns 1 and sets *ms and *me, 0 when there is none, or -1 on a match error (resource limit)
 * with err filled. md must come from st_tok_regex_match_data (big enough for any pattern). */
int st_tok_regex_find(const st_tok_regex *re, const char *s, size_t n, size_t start,
                      pcre2_match_data *md, pcre2_match_context *mctx, size_t *ms, size_t *me,
                      st_error *err);

/* The translated pattern (for tests): writes at most cap bytes into buf (NUL-terminated) and
 * returns the full length, or -1 with err filled for an unsupported construct. */
long st_tok_regex_translate(const char *pat, size_t len, char *buf, size_t cap, st_error *err);

/* ==== Unicode helpers (tok_decode.c) ==== */

/* Rust's char::is_whitespace (White_Space) and the `\w` of Rust's regex crate (Alphabetic,
 * marks, Nd, Pc, Join_Control), used by added tokens' lstrip/rstrip and single_word. */
int st_tok_is_white_space(uint32_t cp);
int st_tok_is_word_char(uint32_t cp);

/* ==== The tokenizer ==== */

enum {
    ST_TOK_F_PRESENT = 1, /* the id is assigned */
    ST_TOK_F_ADDED = 2,   /* an added token */
    ST_TOK_F_SPECIAL = 4, /* an added token marked special */
};

typedef struct st_tok_entry {
    uint32_t str_off;   /* token string (JSON form, NUL-terminated) in tok->arena */
    uint32_t str_len;
    uint32_t bytes_off; /* decoded bytes in tok->arena */
    uint32_t bytes_len;
    uint32_t flags;     /* ST_TOK_F_* */
} st_tok_entry;

typedef struct st_tok_added {
    int32_t id;
    uint32_t off, len; /* content bytes in tok->arena (normalized content for normalized=true) */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} st_tok_added;

/* A byte trie over added-token contents for leftmost-longest matching. */
typedef struct st_tok_trie_node {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t added;   /* index into tok->added of the token ending here, -1 none */
    uint8_t byte;
} st_tok_trie_node;

typedef struct st_tok_trie {
    int32_t root[256];        /* node for each first byte, -1 none */
    st_tok_trie_node *nodes;  /* [n_nodes], owned */
    size_t n_nodes, cap;
    size_t n_tokens;          /* tokens inserted */
} st_tok_trie;

enum { ST_TOK_NORM_NFC = 1, ST_TOK_NORM_NFD, ST_TOK_NORM_NFKC, ST_TOK_NORM_NFKD };

enum {
    ST_TOK_SPLIT_REMOVED = 0,
    ST_TOK_SPLIT_ISOLATED,
    ST_TOK_SPLIT_MERGED_PREV,
    ST_TOK_SPLIT_MERGED_NEXT,
    ST_TOK_SPLIT_CONTIGUOUS,
};

#define ST_TOK_MAX_STEPS 16 /* pre-tokenizer steps and normalizers, each */

/* One pre-tokenizer step. Every chain ends with exactly one ByteLevel step. */
typedef struct st_tok_step {
    int byte_level;       /* 1: ByteLevel; 0: Split */
    st_tok_regex re;      /* Split's pattern, or the GPT-2 pattern of ByteLevel use_regex */
    int has_re;           /* re is compiled */
    int behavior;         /* ST_TOK_SPLIT_* (Split) */
    int invert;           /* Split */
    int add_prefix_space; /* ByteLevel */
} st_tok_step;

/* Bounded per-tokenizer cache of BPE results for short pre-tokens (direct-mapped, fixed size:
 * memory never grows). Guarded by tok->cache_lock (trylock: a busy cache is skipped). */
#define ST_TOK_CACHE_SLOTS 8192 /* power of two */
#define ST_TOK_CACHE_KEY 22     /* longest cached piece, bytes */
#define ST_TOK_CACHE_IDS 8      /* most ids a cached result may hold */
typedef struct st_tok_cache_slot {
    uint8_t klen; /* 0: empty */
    uint8_t nids;
    char key[ST_TOK_CACHE_KEY];
    int32_t ids[ST_TOK_CACHE_IDS];
} st_tok_cache_slot;

struct st_tokenizer {
    char *name;          /* owned: the file path or buffer name, for messages */
    char *arena;         /* owned: token strings and bytes; never reallocated after load */
    size_t arena_len, arena_cap;

    st_tok_entry *ent;   /* [n_ids], owned */
    int64_t n_ids;       /* largest id + 1 */
    size_t max_token_bytes;
    st_strmap vocab;     /* model vocab: token string -> id; keys borrowed from arena */
    size_t vocab_count;  /* entries in the model vocab (HF's get_vocab_size) */
    st_strmap added_map; /* added-token content -> id; keys borrowed from arena */

    uint64_t *merge_keys; /* [n_merges] (id_a << 32 | id_b), owned; keys of `merges` */
    size_t n_merges;
    st_strmap merges;     /* 8-byte pair key -> (rank << 32 | merged id) */
    int32_t byte_id[256]; /* id of the one-byte token for each byte, -1 when absent */
    int64_t *byte_pair;   /* [65536] merges value of (byte_id[a], byte_id[b]) at a << 8 | b,
                           * -1 none; owned */

    /* BPE options */
    int ignore_merges;
    int byte_fallback;
    int32_t fallback_id[256]; /* ids of "<0xXX>" tokens (byte_fallback), -1 when absent */
    int fuse_unk;
    int has_unk;          /* unk_token was given */
    int32_t unk_id;       /* its id, -1 when it is not in the vocab (an error when needed) */

    /* normalizer: applied in order */
    int norm[ST_TOK_MAX_STEPS];
    int n_norm;

    /* pre-tokenizer */
    st_tok_step steps[ST_TOK_MAX_STEPS];
    int n_steps;
    uint32_t max_capture_pairs; /* for sizing match data */

    /* added tokens */
    st_tok_added *added; /* [n_added], owned */
    size_t n_added;
    st_tok_trie raw_trie;  /* normalized=false tokens, matched on the raw text */
    st_tok_trie norm_trie; /* normalized=true tokens, matched on normalized pieces */

    /* word cache */
    st_tok_cache_slot *cache; /* [ST_TOK_CACHE_SLOTS], owned */
    pthread_mutex_t cache_lock;
    int cache_lock_init;
};

/* Pointers into the arena for an id that is assigned. */
static inline const char *st_tok_ent_str(const st_tokenizer *t, const st_tok_entry *e) {
    return t->arena + e->str_off;
}
static inline const char *st_tok_ent_bytes(const st_tokenizer *t, const st_tok_entry *e) {
    return t->arena + e->bytes_off;
}

/* Normalize s[0..n) (valid UTF-8) with the tokenizer's normalizers into a malloc'ed buffer
 * grown as needed (*buf and *cap: caller-owned scratch). Sets *out to the result: either s itself
 * (unchanged, e.g. ASCII) or *buf. Returns ST_OK or ST_ERR_NOMEM/ST_ERR_INTERNAL. */
st_status st_tok_normalize(const st_tokenizer *t, const char *s, size_t n, char **buf,
                           size_t *cap, int32_t **u32, size_t *u32_cap, const char **out,
                           size_t *out_len, st_error *err);

/* The GPT-2 byte <-> unicode map: code point of byte b, and byte of a code point (-1 none). */
uint32_t st_tok_byte_to_cp(uint8_t b);
int st_tok_cp_to_byte(uint32_t cp);

#endif /* ST_TOKENIZER_TOK_INTERNAL_H */
