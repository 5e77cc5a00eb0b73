/* ==== Generated tokens to text deltas (see textout.h) ====
 *
 * Two filters in a row, each holding back a bounded tail of its text:
 *   stop filter: holds the longest suffix that is a proper prefix of a stop string
 *                (< ST_MAX_STOP_LEN bytes);
 *   splitter:    in reasoning, holds a partial "</think>" and at most ST_TEXTOUT_WS_HOLD
 *                bytes of whitespace before it; before any content, holds a partial
 *                "<think>" (leading whitespace there is dropped, not held); once content has
 *                started, holds nothing.
 * So each buffer holds at most one feed's bytes plus those bounds; `cap` is that sum and
 * every append is checked against it.
 */
#include "engine/textout.h"

#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
#define OPEN_LEN (sizeof THINK_OPEN - 1)
#define CLOSE_LEN (sizeof THINK_CLOSE - 1)

struct st_textout {
    const st_tokenizer *tok; /* borrowed */
    st_tok_stream *stream;   /* owned */
    int stream_skips;        /* the stream skips special tokens */
    size_t feed_max;         /* bytes one stream feed or flush can give */
    size_t cap;              /* capacity of each buffer below */
    /* stop strings */
    int n_stop;
    char stop[ST_MAX_STOP][ST_MAX_STOP_LEN];
    size_t stop_len[ST_MAX_STOP];
    char *spend;             /* [cap] text held back by the stop filter */
    size_t spend_len;
    int stopped;
    /* reasoning split */
    int split, in_reasoning;
    int reasoning_started;   /* non-whitespace reasoning emitted (leading ws is dropped) */
    int content_started;     /* non-whitespace content emitted */
    char *tpend;             /* [cap] text held back by the splitter */
    size_t tpend_len;
    /* output of the current call */
    char *content;           /* [cap] */
    size_t content_len;
    char *reasoning;         /* [cap] */
    size_t reasoning_len;
};

size_t st_textout_max_token_bytes(const st_tokenizer *tok) {
    size_t mx = 0;
    int64_t v = st_tok_vocab_size(tok);
    for (int64_t i = 0; i < v; i++) {
        size_t len = 0;
        if (st_tok_token_bytes(tok, (int32_t)i, &len) && len > mx) mx = len;
    }
    return mx;
}

st_status st_textout_create(const st_tokenizer *tok, size_t max_token_bytes, st_textout **out,
                            st_error *err) {
    *out = NULL;
    st_textout *t = calloc(1, sizeof *t);
    if (!t) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    t->tok = tok;
    /* a feed gives complete UTF-8: at worst every byte becomes U+FFFD, plus 3 pending bytes */
    t->feed_max = 3 * (max_token_bytes + 4);
    /* the stop filter's held prefix and the splitter's held tag and whitespace, plus a feed */
    t->cap = t->feed_max + ST_MAX_STOP_LEN + ST_TEXTOUT_WS_HOLD + CLOSE_LEN + 16;
    t->spend = malloc(t->cap);
    t->tpend = malloc(t->cap);
    t->content = malloc(t->cap);
    t->reasoning = malloc(t->cap);
    st_status st = ST_OK;
    if (!t->spend || !t->tpend || !t->content || !t->reasoning)
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
    else
        st = st_tok_stream_create(tok, 1, &t->stream, err);
    if (st != ST_OK) {
        st_textout_destroy(t);
        return st;
    }
    t->stream_skips = 1;
    *out = t;
    return ST_OK;
}

void st_textout_destroy(st_textout *t) {
    if (!t) return;
    st_tok_stream_free(t->stream);
    free(t->spend);
    free(t->tpend);
    free(t->content);
    free(t->reasoning);
    free(t);
}

size_t st_textout_max_delta(const st_textout *t) { return 2 * t->cap; }

st_status st_textout_reset(st_textout *t, const char *const *stops, int n_stop,
                           int split_reasoning, int start_in_reasoning, int skip_special,
                           st_error *err) {
    if (n_stop < 0 || n_stop > ST_MAX_STOP)
        return st_error_set(err, ST_ERR_ARG, "at most %d stop strings", ST_MAX_STOP);
    for (int i = 0; i < n_stop; i++) {
        size_t len = strlen(stops[i]);
        if (len == 0 || len > ST_MAX_STOP_LEN)
            return st_error_set(err, ST_ERR_ARG, "stop strings must be 1 to %d bytes",
                                ST_MAX_STOP_LEN);
        if (st_utf8_check(stops[i], len) != len)
            return st_error_set(err, ST_ERR_ARG, "stop string %d is not valid UTF-8", i + 1);
    }
    for (int i = 0; i < n_stop; i++) {
        t->stop_len[i] = strlen(stops[i]);
        memcpy(t->stop[i], stops[i], t->stop_len[i]);
    }
    t->n_stop = n_stop;
    if (!!skip_special != t->stream_skips) { /* remade only when the setting changes */
        st_tok_stream *s;
        st_status st = st_tok_stream_create(t->tok, skip_special, &s, err);
        if (st != ST_OK) return st;
        st_tok_stream_free(t->stream);
        t->stream = s;
        t->stream_skips = !!skip_special;
    }
    st_tok_stream_reset(t->stream);
    t->spend_len = t->tpend_len = 0;
    t->stopped = 0;
    t->split = split_reasoning;
    t->in_reasoning = split_reasoning && start_in_reasoning;
    t->reasoning_started = t->content_started = 0;
    return ST_OK;
}

int st_textout_in_reasoning(const st_textout *t) { return t->in_reasoning; }

int st_textout_prompt_opens_think(const char *prompt) {
    const char *open = NULL, *close = NULL, *p = prompt;
    while ((p = strstr(p, THINK_OPEN))) open = p++;
    p = prompt;
    while ((p = strstr(p, THINK_CLOSE))) close = p++;
    return open && (!close || open > close);
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* length of the longest suffix of s[0..n) that is a proper prefix of pat */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t plen) {
    size_t best = 0;
    for (size_t k = 1; k < plen && k <= n; k++)
        if (memcmp(s + n - k, pat, k) == 0) best = k;
    return best;
}

static const char *find(const char *s, size_t n, const char *pat, size_t plen) {
    if (plen > n) return NULL;
    for (size_t i = 0; i + plen <= n; i++)
        if (s[i] == pat[0] && memcmp(s + i, pat, plen) == 0) return s + i;
    return NULL;
}

/* appends to a buffer of capacity t->cap */
static void put(const st_textout *t, char *buf, size_t *len, const char *s, size_t n) {
    ST_ASSERT(*len + n <= t->cap);
    memcpy(buf + *len, s, n);
    *len += n;
}

static void emit_reasoning(st_textout *t, const char *s, size_t n) {
    if (!t->reasoning_started) { /* drop leading whitespace */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
        t->reasoning_started = 1;
    }
    put(t, t->reasoning, &t->reasoning_len, s, n);
}

static void emit_content(st_textout *t, const char *s, size_t n) {
    if (!t->content_started && t->split) { /* drop leading whitespace after the reasoning */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
    }
    t->content_started = 1;
    put(t, t->content, &t->content_len, s, n);
}

/* where the trimmed reasoning of p[0..end) ends: at most ST_TEXTOUT_WS_HOLD trailing
 * whitespace bytes are cut */
static size_t trim_held_ws(const char *p, size_t end) {
    size_t r = end;
    while (r && end - r < ST_TEXTOUT_WS_HOLD && is_ws(p[r - 1])) r--;
    return r;
}

/* keep p[from..len) as the splitter's held text */
static void hold(st_textout *t, size_t from) {
    memmove(t->tpend, t->tpend + from, t->tpend_len - from);
    t->tpend_len -= from;
}

/* the reasoning splitter: append s to the held text and emit what is certain */
static void split_text(st_textout *t, const char *s, size_t n, int final) {
    if (!t->split) {
        emit_content(t, s, n);
        return;
    }
    put(t, t->tpend, &t->tpend_len, s, n);
    for (;;) {
        const char *p = t->tpend;
        size_t len = t->tpend_len;
        if (t->in_reasoning) {
            const char *end = find(p, len, THINK_CLOSE, CLOSE_LEN);
            if (end) {
                size_t at = (size_t)(end - p);
                emit_reasoning(t, p, trim_held_ws(p, at));
                hold(t, at + CLOSE_LEN);
                t->in_reasoning = 0;
                continue;
            }
            /* hold back a partial "</think>" and the whitespace that may precede it */
            size_t keep = final ? 0 : partial_suffix(p, len, THINK_CLOSE, CLOSE_LEN);
            size_t out = trim_held_ws(p, len - keep);
            emit_reasoning(t, p, out);
            if (final) t->tpend_len = 0; /* generation ended inside the think block */
            else hold(t, out);
            return;
        }
        if (!t->content_started) { /* a think block may open before any content */
            size_t ws = 0;
            while (ws < len && is_ws(p[ws])) ws++;
            hold(t, ws); /* leading whitespace of the content is dropped */
            p = t->tpend;
            len = t->tpend_len;
            if (len >= OPEN_LEN && memcmp(p, THINK_OPEN, OPEN_LEN) == 0) {
                hold(t, OPEN_LEN);
                t->in_reasoning = 1;
                continue;
            }
            if (!final && len < OPEN_LEN && memcmp(p, THINK_OPEN, len) == 0) return; /* wait */
        }
        emit_content(t, p, len);
        t->tpend_len = 0;
        return;
    }
}

/* the stop filter: text in, certain text on to the splitter */
static void stop_text(st_textout *t, const char *s, size_t n, int final) {
    if (t->n_stop == 0) {
        split_text(t, s, n, final);
        return;
    }
    put(t, t->spend, &t->spend_len, s, n);
    const char *p = t->spend;
    size_t len = t->spend_len;
    /* the match that completes first; among those, the longest (it starts first) */
    size_t best_end = 0, best_start = 0;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = find(p, len, t->stop[i], t->stop_len[i]);
        if (!hit) continue;
        size_t start = (size_t)(hit - p), stop_end = start + t->stop_len[i];
        if (!best_end || stop_end < best_end || (stop_end == best_end && start < best_start)) {
            best_end = stop_end;
            best_start = start;
        }
    }
    if (best_end) {
        split_text(t, p, best_start, 1);
        t->spend_len = 0;
        t->stopped = 1;
        return;
    }
    size_t keep = 0;
    if (!final)
        for (int i = 0; i < t->n_stop; i++) {
            size_t k = partial_suffix(p, len, t->stop[i], t->stop_len[i]);
            if (k > keep) keep = k;
        }
    split_text(t, p, len - keep, final);
    memmove(t->spend, p + len - keep, keep);
    t->spend_len = keep;
}

static void begin(st_textout *t, st_text_delta *d) {
    t->content_len = t->reasoning_len = 0;
    memset(d, 0, sizeof *d);
}

static void end(st_textout *t, st_text_delta *d) {
    d->content = t->content;
    d->content_len = t->content_len;
    d->reasoning = t->reasoning;
    d->reasoning_len = t->reasoning_len;
    d->stopped = t->stopped;
    d->in_reasoning = t->in_reasoning;
}

void st_textout_feed(st_textout *t, int32_t token, st_text_delta *d) {
    begin(t, d);
    if (!t->stopped) {
        const char *bytes;
        size_t n = st_tok_stream_feed(t->stream, token, &bytes);
        ST_ASSERT(n <= t->feed_max);
        if (n) stop_text(t, bytes, n, 0);
    }
    end(t, d);
}

void st_textout_finish(st_textout *t, st_text_delta *d) {
    begin(t, d);
    if (!t->stopped) {
        const char *bytes;
        size_t n = st_tok_stream_flush(t->stream, &bytes);
        ST_ASSERT(n <= t->feed_max);
        stop_text(t, bytes, n, 1);
        if (!t->stopped) split_text(t, "", 0, 1);
    }
    end(t, d);
}
