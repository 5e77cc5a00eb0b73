/* ==== Generated tokens to text: stop strings across tokens, reasoning split, UTF-8 ==== */
#include <stdlib.h>
#include <string.h>

#include "engine/textout.h"
#include "tap.h"
#include "textout_oracle.h"

static st_tokenizer *tok;
static st_textout *tx;

typedef struct result {
    char content[65536], reasoning[65536];
    size_t nc, nr;
    int stopped, bad_utf8, deltas;
} result;

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] >> 6) != 2) return 0;
        i += k;
    }
    return 1;
}

static void add(result *r, const st_text_delta *d) {
    if (r->nc + d->content_len > sizeof r->content || r->nr + d->reasoning_len > sizeof r->reasoning) {
        r->bad_utf8 = 1; /* more text than the test can hold: counted as a failure */
        return;
    }
    if (d->content_len) {
        r->bad_utf8 |= !valid_utf8(d->content, d->content_len);
        memcpy(r->content + r->nc, d->content, d->content_len);
        r->nc += d->content_len;
        r->deltas++;
    }
    if (d->reasoning_len) {
        r->bad_utf8 |= !valid_utf8(d->reasoning, d->reasoning_len);
        memcpy(r->reasoning + r->nr, d->reasoning, d->reasoning_len);
        r->nr += d->reasoning_len;
        r->deltas++;
    }
    r->stopped |= d->stopped;
}

/* encode text, feed it token by token through a fresh pipeline */
static result run(const char *text, const char *const *stops, int n_stop, int split, int start_r) {
    result r;
    memset(&r, 0, sizeof r);
    int32_t *ids = NULL;
    size_t n = 0;
    st_error err = {0};
    if (st_tok_encode(tok, text, strlen(text), 1, &ids, &n, &err) != ST_OK ||
        st_textout_reset(tx, stops, n_stop, split, start_r, 1, &err) != ST_OK) {
        printf("# setup failed: %s\n", err.msg);
        return r;
    }
    st_text_delta d;
    for (size_t i = 0; i < n && !r.stopped; i++) {
        st_textout_feed(tx, ids[i], &d);
        add(&r, &d);
    }
    st_textout_finish(tx, &d);
    add(&r, &d);
    free(ids);
    return r;
}

#define EQ(buf, len, want) ((len) == strlen(want) && memcmp((buf), (want), (len)) == 0)

/* the id of a text that is one token, else -1 */
static int32_t one_id(const char *text) {
    int32_t *ids = NULL, id = -1;
    size_t n = 0;
    st_error err = {0};
    if (st_tok_encode(tok, text, strlen(text), 1, &ids, &n, &err) == ST_OK && n == 1) id = ids[0];
    free(ids);
    return id;
}

/* the longest token made only of spaces */
static int32_t longest_spaces(size_t *len) {
    int32_t best = -1;
    *len = 0;
    for (int64_t i = 0; i < st_tok_vocab_size(tok); i++) {
        size_t n = 0;
        const char *b = st_tok_token_bytes(tok, (int32_t)i, &n);
        size_t k = 0;
        while (b && k < n && b[k] == ' ') k++;
        if (b && n && k == n && n > *len) best = (int32_t)i, *len = n;
    }
    return best;
}

/* feed ids[0..n) through a fresh pipeline */
static result run_ids(const int32_t *ids, size_t n, const char *const *stops, int n_stop, int split,
                      int start_r) {
    static result r;
    memset(&r, 0, sizeof r);
    st_error err = {0};
    if (st_textout_reset(tx, stops, n_stop, split, start_r, 1, &err) != ST_OK) {
        printf("# reset failed: %s\n", err.msg);
        r.bad_utf8 = 1;
        return r;
    }
    st_text_delta d;
    for (size_t i = 0; i < n && !r.stopped; i++) {
        st_textout_feed(tx, ids[i], &d);
        add(&r, &d);
        if (d.content_len + d.reasoning_len > st_textout_max_delta(tx)) r.bad_utf8 = 1;
    }
    st_textout_finish(tx, &d);
    add(&r, &d);
    return r;
}

/* does the pipeline's output equal the oracle's for the decoded text of ids? */
static int matches_oracle(const int32_t *ids, size_t n, const char *const *stops, int n_stop, int split,
                          int start_r, const result *r) {
    char *text = NULL;
    size_t len = 0;
    st_error err = {0};
    if (st_tok_decode(tok, ids, n, 1, &text, &len, &err) != ST_OK) return 0;
    oracle_out o = textout_oracle(text, len, stops, n_stop, split, start_r);
    int ok = !r->bad_utf8 && r->stopped == o.stopped && r->nc == o.content_len &&
             r->nr == o.reasoning_len && !memcmp(r->content, o.content, r->nc) &&
             !memcmp(r->reasoning, o.reasoning, r->nr);
    if (!ok)
        printf("# oracle: content '%.60s' (%zu) reasoning '%.60s' (%zu) stopped %d; got '%.60s' (%zu) '%.60s' (%zu) %d\n",
               o.content, o.content_len, o.reasoning, o.reasoning_len, o.stopped, r->content, r->nc,
               r->reasoning, r->nr, r->stopped);
    oracle_free(&o);
    free(text);
    return ok;
}

/* Runs of whitespace far longer than any buffer: nothing may grow with them (the old
 * splitter appended every feed to a fixed buffer while the text could precede a tag). */
static void test_long_runs(void) {
    static int32_t ids[10000];
    size_t sp_len;
    int32_t nl = one_id("\n"), sp = longest_spaces(&sp_len);
    int32_t hi[1] = {one_id("Hi")};
    size_t n_hi = hi[0] >= 0;
    int32_t close = st_tok_token_to_id(tok, "</think>", 8), open = st_tok_token_to_id(tok, "<think>", 7);
    const char *stops[] = {"never-there", "\n\n\n\nX"};
    int all = nl >= 0 && sp >= 0 && n_hi && close >= 0 && open >= 0;
    for (int shape = 0; shape < 6 && all; shape++) {
        size_t n = 0;
        int32_t ws = shape % 2 ? sp : nl;
        int start_r = shape >= 2;
        if (shape >= 4) ids[n++] = open, start_r = 0;
        for (int i = 0; i < 5000; i++) ids[n++] = ws;
        if (start_r || shape >= 4) {
            for (int k = 0; k < (int)n_hi; k++) ids[n++] = hi[k];
            for (int i = 0; i < 300; i++) ids[n++] = ws;
            ids[n++] = close;
            for (int i = 0; i < 100; i++) ids[n++] = ws;
        }
        for (int k = 0; k < (int)n_hi; k++) ids[n++] = hi[k];
        for (int st = 0; st < 2; st++) {
            result r = run_ids(ids, n, stops, st ? 2 : 0, 1, start_r);
            all &= matches_oracle(ids, n, stops, st ? 2 : 0, 1, start_r, &r);
            all &= EQ(r.content, r.nc, "Hi");
        }
    }
    CHECK(all && sp_len >= 64, "5,000 newlines or %zu-space tokens before the content, inside the reasoning and after it: "
               "bounded hold-back, the text is what the oracle says", sp_len);
}

/* Random token streams built from the pieces that matter (whitespace, the tags and their
 * fragments, partial UTF-8 bytes, ordinary words) against the oracle, with random stops. */
static void test_random_streams(void) {
    int32_t pool[96];
    int n_pool = 0;
    const char *pieces[] = {"\n", " ", "\n\n", "  ", "\t", "<", "</", "think", ">", "<think>", "</think>",
                            "/", "th", "ink", "a", "b", "ab", "Hello", " world", ".", "\xc3\xa9", "\xf0\x9f\x8e\x89"};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        int32_t id = one_id(pieces[i]);
        if (id >= 0) pool[n_pool++] = id;
    }
    /* byte tokens of the emoji's first bytes: characters split across tokens */
    int32_t *enc = NULL;
    size_t ne = 0;
    st_error err = {0};
    if (st_tok_encode(tok, "\xf0\x9f\x8e\x89\xe4\xb8\xad", 7, 1, &enc, &ne, &err) == ST_OK)
        for (size_t i = 0; i < ne && n_pool < 90; i++) pool[n_pool++] = enc[i];
    free(enc);
    for (int64_t id = 0; id < st_tok_vocab_size(tok) && n_pool < 96; id += 7919) pool[n_pool++] = (int32_t)id;
    const char *stop_pool[] = {"ab", "</", "\n\n", "think>", " world", "a", "\xc3\xa9", "k>H", "  \n"};
    uint64_t x = 88172645463325252ull;
    int bad = 0, cases = 0, stopped = 0;
    static int32_t ids[400];
    for (int it = 0; it < 4000; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = 1 + x % 300;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i] = pool[x % (uint64_t)n_pool];
        }
        int split = (int)(x >> 20) & 1, start_r = (int)(x >> 21) & 1, n_stop = (int)((x >> 22) % 4);
        const char *stops[3];
        for (int k = 0; k < n_stop; k++) stops[k] = stop_pool[(x >> (26 + 4 * k)) % 9];
        result r = run_ids(ids, n, stops, n_stop, split, start_r);
        if (!matches_oracle(ids, n, stops, n_stop, split, start_r, &r)) {
            if (bad++ < 3) printf("# case %d failed (split %d, start %d, %d stops)\n", it, split, start_r, n_stop);
        }
        stopped += r.stopped;
        cases++;
    }
    CHECK(bad == 0 && stopped > 100, "%d random token streams (tags, whitespace, split characters, stops) "
                                     "give the oracle's text (%d failed, %d stopped)", cases, bad, stopped);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", tap_data_dir());
    st_error err = {0};
    if (!CHECK(st_tok_load(path, &tok, &err) == ST_OK, "tokenizer loads (%s)", err.msg)) return tap_done();
    size_t mt = st_textout_max_token_bytes(tok);
    if (!CHECK(st_textout_create(tok, mt, &tx, &err) == ST_OK, "textout (longest token %zu bytes)", mt))
        return tap_done();

    const char *t1 = "Hello, world! Ünïcödé and emoji 🎉👍🏽 and 中文字符 too.";
    result r = run(t1, NULL, 0, 0, 0);
    CHECK(EQ(r.content, r.nc, t1) && r.nr == 0 && !r.bad_utf8 && r.deltas > 5,
          "no stops, no split: the text round-trips, every delta valid UTF-8 (%d deltas)", r.deltas);

    const char *stop1[] = {"STOP"};
    r = run("Counting: one two STOP three four", stop1, 1, 0, 0);
    CHECK(EQ(r.content, r.nc, "Counting: one two ") && r.stopped,
          "stop string ends the text and is not emitted ('%.*s')", (int)r.nc, r.content);
    const char *stop2[] = {"world peace", "xyz"};
    r = run("We want world peas and world peace now", stop2, 2, 0, 0);
    CHECK(EQ(r.content, r.nc, "We want world peas and ") && r.stopped,
          "a partial match is released, a later full match stops ('%.*s')", (int)r.nc, r.content);
    r = run("We want world peas", stop2, 2, 0, 0);
    CHECK(EQ(r.content, r.nc, "We want world peas") && !r.stopped,
          "held-back text is released at the end when no stop matched");
    const char *stop3[] = {"🎉"};
    r = run("party 🎉 time", stop3, 1, 0, 0);
    CHECK(EQ(r.content, r.nc, "party ") && r.stopped, "stop string made of a multi-byte character");
    const char *stop4[] = {"e, w"};
    r = run(t1, stop4, 1, 0, 0);
    CHECK(EQ(r.content, r.nc, "Hello, world! Ünïcödé and emoji 🎉👍🏽 and 中文字符 too.") && !r.stopped,
          "no false match");
    const char *stop5[] = {"lo, wo"};
    r = run(t1, stop5, 1, 0, 0);
    CHECK(EQ(r.content, r.nc, "Hel") && r.stopped, "stop string spanning several tokens ('%.*s')", (int)r.nc, r.content);

    r = run("Let me think about 2+2.\nIt is 4.\n</think>\n\nThe answer is **4**.", NULL, 0, 1, 1);
    CHECK(EQ(r.reasoning, r.nr, "Let me think about 2+2.\nIt is 4.") &&
              EQ(r.content, r.nc, "The answer is **4**."),
          "prompt opened <think>: reasoning until </think>, then content, trimmed");
    r = run("<think>\nhmm, hello?\n</think>\n\nHi there!", NULL, 0, 1, 0);
    CHECK(EQ(r.reasoning, r.nr, "hmm, hello?") && EQ(r.content, r.nc, "Hi there!"),
          "model opens <think> itself: split ('%.*s' / '%.*s')", (int)r.nr, r.reasoning, (int)r.nc,
          r.content);
    r = run("Just an answer, no thinking.", NULL, 0, 1, 0);
    CHECK(EQ(r.content, r.nc, "Just an answer, no thinking.") && r.nr == 0, "no think block: all content");
    r = run("Still thinking when the length limit hit", NULL, 0, 1, 1);
    CHECK(EQ(r.reasoning, r.nr, "Still thinking when the length limit hit") && r.nc == 0,
          "generation ends inside the think block: all reasoning, flushed");
    r = run("\n\n</think>\n\nDirect answer.", NULL, 0, 1, 1);
    CHECK(r.nr == 0 && EQ(r.content, r.nc, "Direct answer."), "empty reasoning (thinking off shape)");
    r = run("Reasoning <b>bold</b> text\n</think>\nAnswer </think> again", NULL, 0, 1, 1);
    CHECK(EQ(r.reasoning, r.nr, "Reasoning <b>bold</b> text") &&
              EQ(r.content, r.nc, "Answer </think> again"),
          "tags inside text: only the first </think> ends the reasoning");
    const char *stop6[] = {"END"};
    r = run("think think END more\n</think>\nanswer", stop6, 1, 1, 1);
    CHECK(EQ(r.reasoning, r.nr, "think think") && r.nc == 0 && r.stopped, "stop strings apply inside the reasoning too");
    r = run("Answer<|im_end|>", NULL, 0, 0, 0);
    CHECK(EQ(r.content, r.nc, "Answer"), "special tokens are not part of the text");
    test_long_runs();
    test_random_streams();
    /* reset validation */
    const char *empty[] = {""};
    CHECK(st_textout_reset(tx, empty, 1, 0, 0, 1, &err) == ST_ERR_ARG, "an empty stop string is rejected (%s)", err.msg);
    const char *bad[] = {"ok", "\xe2\x82"};
    CHECK(st_textout_reset(tx, bad, 2, 0, 0, 1, &err) == ST_ERR_ARG && strstr(err.msg, "UTF-8"),
          "a stop string that is not valid UTF-8 is rejected (%s)", err.msg);
    /* a stream that keeps special tokens, then one that skips them again */
    int32_t im_end = st_tok_token_to_id(tok, "<|im_end|>", 10);
    st_text_delta d;
    st_textout_reset(tx, NULL, 0, 0, 0, 0, &err);
    st_textout_feed(tx, im_end, &d);
    int kept = EQ(d.content, d.content_len, "<|im_end|>");
    st_textout_reset(tx, NULL, 0, 0, 0, 1, &err);
    st_textout_feed(tx, im_end, &d);
    CHECK(kept && d.content_len == 0, "skip_special is honoured when it changes between sequences");
    st_textout_destroy(tx);
    st_tok_free(tok);
    return tap_done();
}
