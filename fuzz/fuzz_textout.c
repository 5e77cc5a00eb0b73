/* ==== libFuzzer target: the text pipeline on random token streams ====
 *
 * Input layout: byte 0 = flags (bit 0 split reasoning, bit 1 start inside the reasoning,
 * bits 2-3 the number of stop strings); then for each stop string a length byte (1..16) and
 * its bytes (made valid UTF-8 by replacing bytes >= 0x80 with letters); the rest are tokens,
 * two bytes each: values below 2 * N_POOL pick a token from a pool of the tokens that matter
 * (whitespace runs up to the longest space token, the think tags and their fragments, bytes
 * of split characters), the others are raw vocabulary ids.
 * Checks: every delta is valid UTF-8 and no larger than st_textout_max_delta; the text, the
 * reasoning and the stop flag equal what tests/textout_oracle.h computes from the whole
 * decoded text. ASan/UBSan catch any overflow of the bounded buffers.
 * Run: make fuzz && build/fuzz/fuzz_textout fuzz/corpus/fuzz_textout
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/textout_oracle.h"
#include "core/utf8.h"
#include "engine/textout.h"
#include "tokenizer/tokenizer.h"

#define N_POOL 64

static st_tokenizer *g_tok;
static st_textout *g_tx;
static int32_t g_pool[N_POOL];
static int g_n_pool;

static void pool_add(const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    st_error err;
    if (st_tok_encode(g_tok, text, strlen(text), 1, &ids, &n, &err) == ST_OK)
        for (size_t i = 0; i < n && g_n_pool < N_POOL; i++) g_pool[g_n_pool++] = ids[i];
    free(ids);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("STRAND_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", dir && *dir ? dir : "tests/data");
    st_error err;
    if (st_tok_load(path, &g_tok, &err) != ST_OK ||
        st_textout_create(g_tok, st_textout_max_token_bytes(g_tok), &g_tx, &err) != ST_OK) {
        fprintf(stderr, "fuzz_textout: %s (run from the repository root)\n", err.msg);
        abort();
    }
    const char *pieces[] = {"\n", " ", "\n\n", "\t", "<", "</", "think", ">", "<think>", "</think>", "/",
                            "th", "ink", "a", "Hi", " world", "\xf0\x9f\x8e\x89", "\xe4\xb8\xad"};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) pool_add(pieces[i]);
    int32_t spaces = -1;
    size_t best = 0;
    for (int64_t i = 0; i < st_tok_vocab_size(g_tok) && g_n_pool < N_POOL; i++) {
        size_t n = 0, k = 0;
        const char *b = st_tok_token_bytes(g_tok, (int32_t)i, &n);
        while (b && k < n && (b[k] == ' ' || b[k] == '\n')) k++;
        if (b && n && k == n && n > best) best = n, spaces = (int32_t)i;
    }
    if (spaces >= 0) g_pool[g_n_pool++] = spaces;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int split = data[0] & 1, start_r = (data[0] >> 1) & 1, n_stop = (data[0] >> 2) & 3;
    size_t at = 1;
    char stop_buf[3][17];
    const char *stops[3];
    for (int i = 0; i < n_stop; i++) {
        if (at >= size) return 0;
        size_t len = 1 + data[at++] % 16;
        if (at + len > size) return 0;
        for (size_t k = 0; k < len; k++) {
            uint8_t c = data[at + k];
            stop_buf[i][k] = c >= 0x80 || c == 0 ? (char)('a' + c % 4) : (char)c;
        }
        stop_buf[i][len] = 0;
        stops[i] = stop_buf[i];
        at += len;
    }
    size_t n = (size - at) / 2;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return 0;
    int64_t vocab = st_tok_vocab_size(g_tok);
    for (size_t i = 0; i < n; i++) {
        unsigned v = (unsigned)data[at + 2 * i] | (unsigned)data[at + 2 * i + 1] << 8;
        ids[i] = v < 2u * N_POOL && g_n_pool ? g_pool[v % (unsigned)g_n_pool] : (int32_t)((int64_t)v * 7 % vocab);
    }
    st_error err;
    if (st_textout_reset(g_tx, stops, n_stop, split, start_r, 1, &err) != ST_OK) abort();
    size_t cap = 16 + n * 3 * (st_textout_max_token_bytes(g_tok) + 4);
    char *content = malloc(cap), *reasoning = malloc(cap);
    size_t nc = 0, nr = 0;
    int stopped = 0;
    st_text_delta d;
    for (size_t i = 0; i <= n && !stopped; i++) {
        if (i < n) st_textout_feed(g_tx, ids[i], &d);
        else st_textout_finish(g_tx, &d);
        if (d.content_len + d.reasoning_len > st_textout_max_delta(g_tx)) abort();
        if (st_utf8_check(d.content, d.content_len) != d.content_len ||
            st_utf8_check(d.reasoning, d.reasoning_len) != d.reasoning_len)
            abort();
        if (nc + d.content_len > cap || nr + d.reasoning_len > cap) abort();
        memcpy(content + nc, d.content, d.content_len);
        nc += d.content_len;
        memcpy(reasoning + nr, d.reasoning, d.reasoning_len);
        nr += d.reasoning_len;
        stopped = d.stopped;
    }
    if (stopped) { /* the end after a stop releases nothing */
        st_textout_finish(g_tx, &d);
        if (d.content_len || d.reasoning_len) abort();
    }
    char *text = NULL;
    size_t len = 0;
    if (st_tok_decode(g_tok, ids, n, 1, &text, &len, &err) != ST_OK) abort();
    oracle_out o = textout_oracle(text, len, stops, n_stop, split, start_r);
    if (o.stopped != stopped || o.content_len != nc || o.reasoning_len != nr ||
        memcmp(o.content, content, nc) || memcmp(o.reasoning, reasoning, nr))
        abort();
    oracle_free(&o);
    free(text);
    free(content);
    free(reasoning);
    free(ids);
    return 0;
}
