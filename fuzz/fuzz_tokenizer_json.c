/* ==== libFuzzer target: tokenizer.json loader on mutated files ====
 *
 * Feeds the input to st_tok_load_buffer. Failures must be clean (a status and a message
 * naming the buffer); a tokenizer that loads must encode, decode and stream a few texts
 * without crashing, and ids it produces must be assigned.
 * Seeds: fuzz/corpus/fuzz_tokenizer_json (small tokenizer.json variants).
 * Run: make fuzz && build/fuzz/fuzz_tokenizer_json -max_len=65536 fuzz/corpus/fuzz_tokenizer_json
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *const TEXTS[] = {
    "Hello world, it's 2024!\n\n  indented\tcode();",
    "<s> <mask>  [R]  wd <both> \xC3\x85" "B A\xCC\x8A" "B",
    "\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80 e\xCC\x81 \xE0\xA4\xA8\xE0\xA5\x8D",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_error err;
    st_error_clear(&err);
    st_tokenizer *tok = (st_tokenizer *)&err; /* must be set to NULL on failure */
    st_status st = st_tok_load_buffer((const char *)data, size, "fuzz.json", &tok, &err);
    if (st != ST_OK) {
        if (tok != NULL || strncmp(err.msg, "fuzz.json", 9) != 0 || err.status != st) abort();
        return 0;
    }
    int64_t vs = st_tok_vocab_size(tok);
    for (size_t k = 0; k < sizeof TEXTS / sizeof TEXTS[0]; k++) {
        for (int ps = 0; ps < 2; ps++) {
            int32_t *ids = NULL;
            size_t n = 0;
            st = st_tok_encode(tok, TEXTS[k], strlen(TEXTS[k]), ps, &ids, &n, &err);
            if (st != ST_OK) {
                /* only resource limits or a missing unk token may fail an encode */
                if (st != ST_ERR_LIMIT && st != ST_ERR_FORMAT) abort();
                continue;
            }
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= vs || !st_tok_id_to_token(tok, ids[i], NULL)) abort();
            char *text = NULL;
            size_t len = 0;
            if (st_tok_decode(tok, ids, n, ps, &text, &len, &err) != ST_OK) abort();
            st_tok_stream *s = NULL;
            if (st_tok_stream_create(tok, ps, &s, &err) != ST_OK) abort();
            size_t at = 0;
            for (size_t i = 0; i <= n; i++) {
                const char *t;
                size_t m = i < n ? st_tok_stream_feed(s, ids[i], &t) : st_tok_stream_flush(s, &t);
                if (at + m > len || memcmp(text + at, t, m)) abort();
                at += m;
            }
            if (at != len) abort();
            st_tok_stream_free(s);
            free(text);
            free(ids);
        }
    }
    /* lookups on every id */
    for (int64_t id = 0; id < vs && id < 4096; id++) {
        size_t l;
        const char *s = st_tok_id_to_token(tok, (int32_t)id, &l);
        if (s && st_tok_token_to_id(tok, s, l) < 0) abort();
    }
    st_tok_free(tok);
    return 0;
}
