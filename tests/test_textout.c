/* ==== Generated tokens to text: stop strings across tokens, reasoning split, UTF-8 ==== */
#include <stdlib.h>
#include <string.h>

#include "engine/textout.h"
#include "tap.h"

static st_tokenizer *tok;
static st_textout *tx;

typedef struct result {
    char content[4096], reasoning[4096];
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
    /* reset validation */
    const char *empty[] = {""};
    CHECK(st_textout_reset(tx, empty, 1, 0, 0, 1, &err) == ST_ERR_ARG, "an empty stop string is rejected (%s)", err.msg);
    st_textout_destroy(tx);
    st_tok_free(tok);
    return tap_done();
}
