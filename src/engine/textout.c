/* ==== Generated tokens to text deltas (see textout.h) ==== */
#include "engine/textout.h"

#include <stdlib.h>
#include <string.h>

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";

struct st_textout {
    const st_tokenizer *tok; /* borrowed */
    st_tok_stream *stream;   /* owned */
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
    int reasoning_started;   /* non-whitespace reasoning emitted (leading ws is trimmed) */
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
    /* everything one feed can hold: held-back stop text, held-back tag text and whitespace,
     * the new token's bytes (and a replacement character or two) */
    t->cap = 2 * (max_token_bytes + ST_MAX_STOP_LEN + 64);
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
        memcpy(t->stop[i], stops[i], len);
        t->stop_len[i] = len;
    }
    t->n_stop = n_stop;
    if (!skip_special) { /* the stream was made with skip_special; remake only when needed */
        st_tok_stream *s;
        st_status st = st_tok_stream_create(t->tok, 0, &s, err);
        if (st != ST_OK) return st;
        st_tok_stream_free(t->stream);
        t->stream = s;
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

static void emit_reasoning(st_textout *t, const char *s, size_t n) {
    if (!t->reasoning_started) { /* trim leading whitespace */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
        t->reasoning_started = 1;
    }
    memcpy(t->reasoning + t->reasoning_len, s, n);
    t->reasoning_len += n;
}

static void emit_content(st_textout *t, const char *s, size_t n) {
    if (!t->content_started && t->split) { /* trim leading whitespace after the reasoning */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
    }
    t->content_started = 1;
    memcpy(t->content + t->content_len, s, n);
    t->content_len += n;
}

/* the reasoning splitter: append s to the held text and emit what is certain */
static void split_text(st_textout *t, const char *s, size_t n, int final) {
    if (!t->split) {
        emit_content(t, s, n);
        return;
    }
    memcpy(t->tpend + t->tpend_len, s, n);
    t->tpend_len += n;
    for (;;) {
        char *p = t->tpend;
        size_t len = t->tpend_len;
        if (t->in_reasoning) {
            const char *end = find(p, len, THINK_CLOSE, sizeof THINK_CLOSE - 1);
            if (end) {
                size_t r = (size_t)(end - p);
                while (r && is_ws(p[r - 1])) r--; /* trailing whitespace of the reasoning */
                emit_reasoning(t, p, r);
                size_t rest = len - (size_t)(end - p) - (sizeof THINK_CLOSE - 1);
                memmove(t->tpend, end + sizeof THINK_CLOSE - 1, rest);
                t->tpend_len = rest;
                t->in_reasoning = 0;
                continue;
            }
            /* hold back a partial "</think>" and trailing whitespace (it may precede it) */
            size_t keep = final ? 0 : partial_suffix(p, len, THINK_CLOSE, sizeof THINK_CLOSE - 1);
            size_t out = len - keep;
            while (out && is_ws(p[out - 1])) out--;
            if (final) { /* generation ended inside the think block */
                emit_reasoning(t, p, out);
                t->tpend_len = 0;
                return;
            }
            emit_reasoning(t, p, out);
            memmove(t->tpend, p + out, len - out);
            t->tpend_len = len - out;
            return;
        }
        /* content: a think block may open before any content */
        if (!t->content_started) {
            size_t ws = 0;
            while (ws < len && is_ws(p[ws])) ws++;
            size_t rest = len - ws, ol = sizeof THINK_OPEN - 1;
            if (rest >= ol && memcmp(p + ws, THINK_OPEN, ol) == 0) {
                memmove(t->tpend, p + ws + ol, rest - ol);
                t->tpend_len = rest - ol;
                t->in_reasoning = 1;
                continue;
            }
            if (!final && rest < ol && memcmp(p + ws, THINK_OPEN, rest) == 0) return; /* wait */
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
    memcpy(t->spend + t->spend_len, s, n);
    t->spend_len += n;
    const char *p = t->spend;
    size_t len = t->spend_len;
    const char *first = NULL;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = find(p, len, t->stop[i], t->stop_len[i]);
        if (hit && (!first || hit < first)) first = hit;
    }
    if (first) {
        split_text(t, p, (size_t)(first - p), 1);
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
        if (n) stop_text(t, bytes, n, 0);
    }
    end(t, d);
}

void st_textout_finish(st_textout *t, st_text_delta *d) {
    begin(t, d);
    if (!t->stopped) {
        const char *bytes;
        size_t n = st_tok_stream_flush(t->stream, &bytes);
        stop_text(t, bytes, n, 1);
        if (!t->stopped) split_text(t, "", 0, 1);
    }
    end(t, d);
}
