/* ==== Tokenizer: decoding, streaming decoding, UTF-8 and Unicode helpers ====
 *
 * Decoding is the ByteLevel decoder: each token's bytes (precomputed at load) are
 * concatenated, then turned into valid UTF-8 the way Rust's String::from_utf8_lossy (and
 * Python's errors="replace") do it: every maximal subpart of an ill-formed sequence becomes
 * one U+FFFD (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts").
 *
 * The streaming decoder runs the same byte-at-a-time state machine, so what it emits over a
 * sequence of ids is byte-for-byte what st_tok_decode gives for the whole sequence.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* ==== UTF-8 ==== */

/* Valid range of the second byte after lead byte b0 (Unicode Table 3-7); 0 for a bad lead. */
/* ==== Character classes for added tokens ==== */

int st_tok_is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

int st_tok_is_word_char(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D) return 1; /* Join_Control */
    /* Other_Alphabetic code points that are neither letters nor marks (circled letters) */
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
        (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

/* ==== GPT-2 byte <-> unicode map ==== */

/* Printable bytes ('!'..'~', U+A1..U+AC, U+AE..U+FF) map to themselves; the other 68 bytes
 * map, in byte order, to U+0100, U+0101, ... */
static int byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t st_tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t k = 0; /* rank of b among the non-printable bytes */
    if (b <= 0x20) k = b;                           /* 0x00..0x20: 33 bytes */
    else if (b <= 0xA0) k = 33 + (uint32_t)(b - 0x7F); /* 0x7F..0xA0: 34 bytes */
    else k = 67;                                    /* 0xAD */
    return 0x100 + k;
}

int st_tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 0x100 + 33) return (int)(cp - 0x100);
    if (cp < 0x100 + 67) return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 67) return 0xAD;
    return -1;
}

/* ==== Lossy UTF-8 state machine ==== */

/* Held-back bytes of a character that may still complete. */
typedef struct utf8_state {
    uint8_t pend[4];
    int n;    /* bytes held */
    int need; /* total length of the sequence being built */
} utf8_state;

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Push one byte; writes completed output to out (at most 4 + 3 bytes) and returns its length. */
static size_t utf8_push(utf8_state *st, uint8_t b, char *out) {
    size_t w = 0;
    for (;;) {
        if (st->n == 0) {
            if (b < 0x80) {
                out[w++] = (char)b;
                return w;
            }
            uint8_t lo = 0, hi = 0;
            int len = 0;
            if (!st_utf8_lead(b, &lo, &hi, &len)) {
                memcpy(out + w, REPL, 3);
                return w + 3;
            }
            st->pend[0] = b;
            st->n = 1;
            st->need = len;
            return w;
        }
        int ok;
        if (st->n == 1) {
            uint8_t lo = 0x80, hi = 0xBF;
            int len = 0;
            st_utf8_lead(st->pend[0], &lo, &hi, &len); /* pend[0] is a valid lead byte */
            ok = b >= lo && b <= hi;
        } else {
            ok = (b & 0xC0) == 0x80;
        }
        if (ok) {
            st->pend[st->n++] = b;
            if (st->n == st->need) {
                memcpy(out + w, st->pend, (size_t)st->n);
                w += (size_t)st->n;
                st->n = 0;
            }
            return w;
        }
        /* the held bytes are a maximal ill-formed subpart; b starts afresh */
        memcpy(out + w, REPL, 3);
        w += 3;
        st->n = 0;
    }
}

static size_t utf8_flush(utf8_state *st, char *out) {
    if (st->n == 0) return 0;
    st->n = 0;
    memcpy(out, REPL, 3);
    return 3;
}

/* ==== Lookups ==== */

static const st_tok_entry *entry(const st_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids) return NULL;
    const st_tok_entry *e = &t->ent[id];
    return (e->flags & ST_TOK_F_PRESENT) ? e : NULL;
}

int64_t st_tok_vocab_size(const st_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t st_tok_token_to_id(const st_tokenizer *t, const char *token, size_t len) {
    if (!t || (!token && len)) return -1;
    int64_t v;
    if (st_strmap_get(&t->added_map, token, len, &v)) return (int32_t)v;
    if (st_strmap_get(&t->vocab, token, len, &v)) return (int32_t)v;
    return -1;
}

const char *st_tok_id_to_token(const st_tokenizer *t, int32_t id, size_t *len) {
    const st_tok_entry *e = entry(t, id);
    if (!e) return NULL;
    if (len) *len = e->str_len;
    return st_tok_ent_str(t, e);
}

const char *st_tok_token_bytes(const st_tokenizer *t, int32_t id, size_t *len) {
    const st_tok_entry *e = entry(t, id);
    if (!e) return NULL;
    if (len) *len = e->bytes_len;
    return st_tok_ent_bytes(t, e);
}

int st_tok_is_special(const st_tokenizer *t, int32_t id) {
    const st_tok_entry *e = entry(t, id);
    return e && (e->flags & ST_TOK_F_SPECIAL);
}

int st_tok_is_added(const st_tokenizer *t, int32_t id) {
    const st_tok_entry *e = entry(t, id);
    return e && (e->flags & ST_TOK_F_ADDED);
}

/* ==== Decode ==== */

st_status st_tok_decode(const st_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                        char **text, size_t *len, st_error *err) {
    *text = NULL;
    if (len) *len = 0;
    if (!t) return st_error_set(err, ST_ERR_ARG, "decode: no tokenizer");
    if (n && !ids) return st_error_set(err, ST_ERR_ARG, "decode: ids is NULL");
    /* worst case: every byte becomes U+FFFD (3 bytes) */
    size_t raw = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tok_entry *e = entry(t, ids[i]);
        if (!e || (skip_special && (e->flags & ST_TOK_F_SPECIAL))) continue;
        raw += e->bytes_len;
    }
    if (raw > (SIZE_MAX - 16) / 3)
        return st_error_set(err, ST_ERR_LIMIT, "decode: output too large");
    char *out = malloc(raw * 3 + 4);
    if (!out) return st_error_set(err, ST_ERR_NOMEM, "decode: out of memory");
    utf8_state st = {{0}, 0, 0};
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tok_entry *e = entry(t, ids[i]);
        if (!e || (skip_special && (e->flags & ST_TOK_F_SPECIAL))) continue;
        const uint8_t *b = (const uint8_t *)st_tok_ent_bytes(t, e);
        for (uint32_t k = 0; k < e->bytes_len; k++) {
            if (b[k] < 0x80 && st.n == 0) {
                out[w++] = (char)b[k];
                continue;
            }
            w += utf8_push(&st, b[k], out + w);
        }
    }
    w += utf8_flush(&st, out + w);
    ST_ASSERT(w <= raw * 3 + 3);
    out[w] = '\0';
    *text = out;
    if (len) *len = w;
    return ST_OK;
}

/* ==== Streaming decode ==== */

struct st_tok_stream {
    const st_tokenizer *tok; /* borrowed; must outlive the stream */
    int skip_special;
    utf8_state st;
    char *out;  /* [cap] output of the latest call, owned */
    size_t cap; /* 3 * (longest token + 4): enough for any one feed */
};

st_status st_tok_stream_create(const st_tokenizer *tok, int skip_special, st_tok_stream **out,
                               st_error *err) {
    *out = NULL;
    if (!tok) return st_error_set(err, ST_ERR_ARG, "stream: no tokenizer");
    st_tok_stream *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "stream: out of memory");
    s->tok = tok;
    s->skip_special = skip_special;
    s->cap = 3 * (tok->max_token_bytes + 4);
    s->out = malloc(s->cap);
    if (!s->out) {
        free(s);
        return st_error_set(err, ST_ERR_NOMEM, "stream: out of memory");
    }
    *out = s;
    return ST_OK;
}

void st_tok_stream_free(st_tok_stream *s) {
    if (!s) return;
    free(s->out);
    free(s);
}

void st_tok_stream_reset(st_tok_stream *s) {
    if (s) s->st.n = 0;
}

size_t st_tok_stream_pending(const st_tok_stream *s) { return s ? (size_t)s->st.n : 0; }

size_t st_tok_stream_feed(st_tok_stream *s, int32_t id, const char **text) {
    *text = s->out;
    const st_tok_entry *e = entry(s->tok, id);
    if (!e || (s->skip_special && (e->flags & ST_TOK_F_SPECIAL))) return 0;
    const uint8_t *b = (const uint8_t *)st_tok_ent_bytes(s->tok, e);
    size_t w = 0;
    for (uint32_t k = 0; k < e->bytes_len; k++) w += utf8_push(&s->st, b[k], s->out + w);
    ST_ASSERT(w <= s->cap);
    return w;
}

size_t st_tok_stream_flush(st_tok_stream *s, const char **text) {
    *text = s->out;
    return utf8_flush(&s->st, s->out);
}
