/* ==== libFuzzer target: encode/decode arbitrary text with real tokenizers ====
 *
 * Loads, once, the Qwen3 tokenizer and the hand-made tiny one (added-token options) from
 * tests/data (or $STRAND_TEST_DATA). For each input, the first byte picks the tokenizer and
 * parse_special, the rest is the text. Checks:
 *   - invalid UTF-8 is rejected with ST_ERR_ARG and nothing else;
 *   - every id is assigned; encode_append gives the same ids as encode;
 *   - decode(encode(x)) equals the concatenated pre-tokenizer pieces (the normalized text) for
 *     Qwen3, and equals x itself when x is ASCII;
 *   - the streaming decoder emits exactly decode's text, in complete characters.
 * Run: make fuzz && build/fuzz/fuzz_tokenizer fuzz/corpus/fuzz_tokenizer
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static st_tokenizer *g_tok[2];

static st_tokenizer *load(const char *rel) {
    const char *dir = getenv("STRAND_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "tests/data", rel);
    st_error err;
    st_tokenizer *t = NULL;
    if (st_tok_load(path, &t, &err) != ST_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    g_tok[0] = load("tokenizers/qwen3/tokenizer.json");
    g_tok[1] = load("tokenizers/tiny/tokenizer.json");
    return 0;
}

typedef struct joined {
    char *buf;
    size_t len, cap;
} joined;

static int join_piece(const st_tok_piece *p, void *user) {
    joined *j = user;
    if (j->len + p->len + 1 > j->cap) {
        j->cap = (j->len + p->len + 1) * 2;
        j->buf = realloc(j->buf, j->cap);
        if (!j->buf) abort();
    }
    memcpy(j->buf + j->len, p->text, p->len);
    j->len += p->len;
    return 0;
}

static int valid_utf8_chunk(const char *s, size_t n) {
    for (size_t q = 0; q < n;) {
        unsigned char c = (unsigned char)s[q];
        size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (q + need > n) return 0;
        q += need;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const st_tokenizer *tok = g_tok[data[0] & 1];
    int parse_special = (data[0] >> 1) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    int valid = 1;
    for (size_t i = 0; i < len;) { /* reference UTF-8 check, independent of the library's */
        unsigned char c = (unsigned char)text[i];
        size_t need = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                    : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!need || i + need > len) { valid = 0; break; }
        uint32_t cp = need == 1 ? c : (uint32_t)(c & (0xFF >> (need + 1)));
        for (size_t k = 1; k < need; k++) {
            unsigned char d = (unsigned char)text[i + k];
            if ((d & 0xC0) != 0x80) { valid = 0; break; }
            cp = (cp << 6) | (d & 0x3F);
        }
        if (!valid) break;
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { valid = 0; break; }
        i += need;
    }

    st_error err;
    int32_t *ids = NULL;
    size_t n = 0;
    st_status st = st_tok_encode(tok, text, len, parse_special, &ids, &n, &err);
    if (!valid) {
        if (st != ST_ERR_ARG || ids || n) abort();
        return 0;
    }
    if (st != ST_OK) abort();
    for (size_t i = 0; i < n; i++)
        if (!st_tok_id_to_token(tok, ids[i], NULL)) abort();

    st_tok_ids v = {NULL, 0, 0};
    if (st_tok_encode_append(tok, text, len, parse_special, &v, &err) != ST_OK || v.n != n ||
        (n && memcmp(v.ids, ids, n * sizeof *ids)))
        abort();
    st_tok_ids_free(&v);

    char *dec = NULL;
    size_t dl = 0;
    if (st_tok_decode(tok, ids, n, 0, &dec, &dl, &err) != ST_OK) abort();
    if (tok == g_tok[0]) {
        joined j = {NULL, 0, 0};
        if (st_tok_split(tok, text, len, parse_special, join_piece, &j, &err) != ST_OK) abort();
        if (j.len != dl || (dl && memcmp(j.buf, dec, dl))) abort();
        free(j.buf);
        int ascii = 1;
        for (size_t i = 0; i < len; i++) ascii &= (unsigned char)text[i] < 0x80;
        if (ascii && (dl != len || memcmp(dec, text, len))) abort();
    }

    /* streaming == whole decode, complete characters only */
    for (int skip = 0; skip < 2; skip++) {
        char *whole = NULL;
        size_t wl = 0;
        if (st_tok_decode(tok, ids, n, skip, &whole, &wl, &err) != ST_OK) abort();
        st_tok_stream *s = NULL;
        if (st_tok_stream_create(tok, skip, &s, &err) != ST_OK) abort();
        size_t at = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *t;
            size_t k = i < n ? st_tok_stream_feed(s, ids[i], &t) : st_tok_stream_flush(s, &t);
            if (!valid_utf8_chunk(t, k) || at + k > wl || memcmp(whole + at, t, k)) abort();
            at += k;
        }
        if (at != wl) abort();
        st_tok_stream_free(s);
        free(whole);
    }
    free(dec);
    free(ids);
    return 0;
}
