/* ==== The OpenAI-compatible HTTP server (see server.h) ==== */
#include "server/server.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fileio.h"
#include "core/log.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/oai.h"
#include "server/toolcall.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

enum { HEALTH_LOADING = 0, HEALTH_READY = 1, HEALTH_UNHEALTHY = 2 };

#define INBOX_TEXT 16384 /* bytes of undelivered content (and as much reasoning) */
#define INBOX_LP 64      /* undelivered log-probability records */

st_server_params st_server_default_params(void) {
    st_server_params p = {
        .host = "127.0.0.1",
        .port = 8080,
        .max_seqs = 8,
        .ctx = 0,
        .step_tokens = 512,
        .max_queue = 64,
        .kv_dtype = ST_KV_F32,
        .max_body = (size_t)32 << 20,
        .max_header = (size_t)64 << 10,
        .http_threads = 4,
        .keepalive_s = 10.0,
    };
    return p;
}


/* ---------------------------------------------------------------------------------------- */
/* growable byte buffers (HTTP threads only) */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------------------------------- */
/* the server and its streams */

typedef struct lp_rec {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top[ST_MAX_LOGPROBS];
    float top_lp[ST_MAX_LOGPROBS];
} lp_rec;

typedef struct srv srv;

/* One generation request between HTTP and the scheduler. References: the HTTP request (until
 * its connection completes), the scheduler (until the DONE event) and, when streaming, the
 * response reader (until libmicrohttpd frees the response). */
typedef struct stream {
    srv *s;
    atomic_int refs;
    pthread_mutex_t mu;
    struct stream *prev, *next;  /* the server's stream list (streams_mu) */
    /* fixed at creation */
    st_oai_request req;
    char id[48];
    long long created;
    int streaming;
    int split;                   /* reasoning is split off */
    char *prompt_text;           /* completions with echo */
    /* guarded by mu; the inbox is written by the scheduler thread */
    struct MHD_Connection *conn; /* NULL once the connection completed */
    int suspended;
    int submitted;
    uint64_t sched_id;
    char c_in[INBOX_TEXT];
    size_t c_in_len;
    char r_in[INBOX_TEXT];
    size_t r_in_len;
    lp_rec lp_in[INBOX_LP];
    int n_lp_in;
    int overflow, overflow_cancelled;
    int done;
    st_finish_reason finish;
    st_usage usage;
    char error[512];
    double last_token_t;
    int keepalive_due;
    int aborted;                 /* server shutting down */
    double last_write;
    /* formatting state (HTTP threads, under mu) */
    sbuf wire;                   /* formatted bytes not yet handed to libmicrohttpd */
    size_t wire_off;
    int role_sent, finished_sent;
    sbuf content_all, reasoning_all; /* non-streaming accumulation */
    json_t *lp_all;              /* non-streaming logprob entries (chat) */
    sbuf pend;                   /* streamed content held back while it could open a tool call */
    sbuf tool_hold;              /* streamed text from <tool_call> on */
    int in_tool;
    int64_t text_offset;         /* completions logprobs: bytes of text so far */
} stream;

struct srv {
    st_server_params p;
    char model_id[256];
    long long created;
    atomic_int health;
    char health_reason[1024];
    st_model *m;
    st_tokenizer *tok;
    st_chat_template *ct;
    st_sched *sched;
    st_oai_defaults defaults;
    int think_split;
    st_metrics metrics;
    struct MHD_Daemon *d;
    pthread_t sched_thread, tick_thread;
    int threads_started;
    atomic_int stopping;
    pthread_mutex_t streams_mu;
    stream *streams;
    atomic_ullong id_counter;
    uint64_t id_salt;
};

/* per HTTP request state */
typedef struct httpreq {
    sbuf body;
    int too_large;
    stream *st;
} httpreq;

static void stream_unref(stream *st) {
    if (atomic_fetch_sub(&st->refs, 1) != 1) return;
    srv *s = st->s;
    pthread_mutex_lock(&s->streams_mu);
    if (st->prev) st->prev->next = st->next;
    else s->streams = st->next;
    if (st->next) st->next->prev = st->prev;
    pthread_mutex_unlock(&s->streams_mu);
    st_oai_request_free(&st->req);
    sb_free(&st->wire);
    sb_free(&st->content_all);
    sb_free(&st->reasoning_all);
    sb_free(&st->pend);
    sb_free(&st->tool_hold);
    json_decref(st->lp_all);
    free(st->prompt_text);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* ---------------------------------------------------------------------------------------- */
/* the scheduler side: copy into the inbox, wake the connection (no allocation) */

static void on_event(void *user, const st_event *ev) {
    stream *st = user;
    srv *s = st->s;
    double t = st_now_s();
    pthread_mutex_lock(&st->mu);
    if (ev->content_len) {
        if (st->c_in_len + ev->content_len <= INBOX_TEXT) {
            memcpy(st->c_in + st->c_in_len, ev->content, ev->content_len);
            st->c_in_len += ev->content_len;
        } else {
            st->overflow = 1;
        }
    }
    if (ev->reasoning_len) {
        if (st->r_in_len + ev->reasoning_len <= INBOX_TEXT) {
            memcpy(st->r_in + st->r_in_len, ev->reasoning, ev->reasoning_len);
            st->r_in_len += ev->reasoning_len;
        } else {
            st->overflow = 1;
        }
    }
    double itl = -1;
    if (ev->kind == ST_EV_TOKEN) {
        if (ev->logprobs) {
            if (st->n_lp_in < INBOX_LP) {
                lp_rec *r = &st->lp_in[st->n_lp_in++];
                r->token = ev->token;
                r->logprob = ev->logprobs->logprob;
                r->n_top = ev->logprobs->n_top;
                memcpy(r->top, ev->logprobs->top_tokens, sizeof r->top);
                memcpy(r->top_lp, ev->logprobs->top_logprobs, sizeof r->top_lp);
            } else {
                st->overflow = 1;
            }
        }
        if (st->last_token_t > 0) itl = t - st->last_token_t;
        st->last_token_t = t;
    } else {
        st->done = 1;
        st->finish = ev->finish;
        st->usage = ev->usage;
        if (ev->error) snprintf(st->error, sizeof st->error, "%s", ev->error);
    }
    int pressure = st->c_in_len > INBOX_TEXT / 2 || st->r_in_len > INBOX_TEXT / 2 || st->n_lp_in > INBOX_LP / 2;
    if (st->conn && st->suspended && (st->streaming || st->done || pressure || st->overflow)) {
        st->suspended = 0;
        MHD_resume_connection(st->conn);
    }
    int cancel = st->overflow && !st->done && !st->overflow_cancelled;
    if (cancel) st->overflow_cancelled = 1;
    uint64_t id = st->sched_id;
    int done = ev->kind == ST_EV_DONE;
    pthread_mutex_unlock(&st->mu);
    if (itl >= 0) st_metrics_observe(&s->metrics, &s->metrics.itl, itl);
    if (cancel) st_sched_cancel(s->sched, id);
    if (done) {
        st_metrics_finished(&s->metrics, ev);
        stream_unref(st); /* the scheduler's reference */
    }
}

/* ---------------------------------------------------------------------------------------- */
/* formatting (HTTP threads, under st->mu) */

/* bytes as valid UTF-8 (invalid sequences become U+FFFD) */
static char *utf8_lossy(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1), *q = o;
    if (!o) return NULL;
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = k && i + k <= n;
        for (size_t j = 1; ok && j < k; j++) ok = ((unsigned char)s[i + j] >> 6) == 2;
        if (ok && k == 2 && c < 0xc2) ok = 0;
        if (ok) {
            memcpy(q, s + i, k);
            q += k;
            i += k;
        } else {
            memcpy(q, "\xef\xbf\xbd", 3);
            q += 3;
            i++;
        }
    }
    *q = 0;
    *out_len = (size_t)(q - o);
    return o;
}

static json_t *token_json_string(const st_tokenizer *tok, int32_t id) {
    size_t len = 0;
    const char *b = st_tok_token_bytes(tok, id, &len);
    if (!b) return json_string("");
    size_t ol;
    char *u = utf8_lossy(b, len, &ol);
    json_t *j = u ? json_stringn(u, ol) : json_string("");
    free(u);
    return j;
}

static json_t *token_bytes_json(const st_tokenizer *tok, int32_t id) {
    size_t len = 0;
    const char *b = st_tok_token_bytes(tok, id, &len);
    json_t *a = json_array();
    for (size_t i = 0; b && i < len; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* chat logprob entry: {"token", "logprob", "bytes", "top_logprobs": [...]} */
static json_t *chat_lp_entry(const st_tokenizer *tok, const lp_rec *r) {
    json_t *tops = json_array();
    for (int i = 0; i < r->n_top; i++)
        json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", token_json_string(tok, r->top[i]),
                                              "logprob", (double)r->top_lp[i], "bytes",
                                              token_bytes_json(tok, r->top[i])));
    return json_pack("{s:o,s:f,s:o,s:o}", "token", token_json_string(tok, r->token), "logprob",
                     (double)r->logprob, "bytes", token_bytes_json(tok, r->token), "top_logprobs", tops);
}

/* completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static json_t *completion_lp(const st_tokenizer *tok, const lp_rec *recs, int n, int64_t *offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(tokens, token_json_string(tok, recs[i].token));
        json_array_append_new(lps, json_real(recs[i].logprob));
        json_t *t = json_object();
        for (int k = 0; k < recs[i].n_top; k++) {
            json_t *key = token_json_string(tok, recs[i].top[k]);
            json_object_set_new(t, json_string_value(key), json_real(recs[i].top_lp[k]));
            json_decref(key);
        }
        json_array_append_new(tops, t);
        json_array_append_new(offs, json_integer(*offset));
        size_t len = 0;
        if (st_tok_token_bytes(tok, recs[i].token, &len) && !st_tok_is_special(tok, recs[i].token)) *offset += (int64_t)len;
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

static json_t *usage_json(const st_usage *u) {
    return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens,
                     "completion_tokens", (json_int_t)u->completion_tokens, "total_tokens",
                     (json_int_t)(u->prompt_tokens + u->completion_tokens), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)u->cached_tokens, "completion_tokens_details",
                     "reasoning_tokens", (json_int_t)u->reasoning_tokens);
}

static const char *finish_text(st_finish_reason f) {
    return f == ST_FINISH_LENGTH ? "length" : "stop";
}

static char *random_call_id(srv *s) {
    unsigned long long x = atomic_fetch_add(&s->id_counter, 1) * 0x9e3779b97f4a7c15ull ^ s->id_salt;
    char *id = malloc(40);
    if (id) snprintf(id, 40, "call_%016llx%08llx", x, (x >> 17) & 0xffffffffull);
    return id;
}

/* tool_calls array in the OpenAI shape (streamed deltas carry an index) */
static json_t *tool_calls_json(srv *s, const st_tool_calls *tc, int with_index) {
    json_t *a = json_array();
    for (int i = 0; i < tc->n; i++) {
        char *id = random_call_id(s);
        json_t *c = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id ? id : "call", "type", "function", "function",
                              "name", tc->calls[i].name, "arguments", tc->calls[i].arguments);
        if (with_index) json_object_set_new(c, "index", json_integer(i));
        free(id);
        json_array_append_new(a, c);
    }
    return a;
}

/* ---- streaming (SSE) ---- */

static void sse_data(stream *st, json_t *obj) {
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) return;
    sb_put(&st->wire, "data: ", 6);
    sb_put(&st->wire, s, strlen(s));
    sb_put(&st->wire, "\n\n", 2);
    free(s);
}

static json_t *chunk(stream *st, json_t *choice) {
    const char *obj = st->req.kind == ST_OAI_CHAT ? "chat.completion.chunk" : "text_completion";
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", st->id, "object", obj, "created",
                          (json_int_t)st->created, "model", st->s->model_id, "system_fingerprint",
                          "strand", "choices", choice);
    if (st->req.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static json_t *chat_choice(json_t *delta, json_t *logprobs, const char *finish) {
    return json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", logprobs ? logprobs : json_null(),
                     "finish_reason", finish ? json_string(finish) : json_null());
}

static json_t *completion_choice(const char *text, size_t n, json_t *logprobs, const char *finish) {
    return json_pack("{s:i,s:s%,s:o,s:o}", "index", 0, "text", text, n, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
}

/* content for the chat stream, through tool-call detection when tools were given */
static void stream_content(stream *st, const char *c, size_t n, json_t **lp) {
    sbuf out = {0};
    if (!st->req.tools) {
        sb_put(&out, c, n);
    } else if (st->in_tool) {
        sb_put(&st->tool_hold, c, n);
    } else {
        sb_put(&st->pend, c, n);
        const char *open = ST_TOOLCALL_OPEN;
        size_t ol = strlen(open);
        char *hit = st->pend.n >= ol ? memmem(st->pend.p, st->pend.n, open, ol) : NULL;
        if (hit) {
            sb_put(&out, st->pend.p, (size_t)(hit - st->pend.p));
            sb_put(&st->tool_hold, hit, st->pend.n - (size_t)(hit - st->pend.p));
            st->pend.n = 0;
            st->in_tool = 1;
        } else {
            size_t keep = 0;
            for (size_t k = 1; k < ol && k <= st->pend.n; k++)
                if (!memcmp(st->pend.p + st->pend.n - k, open, k)) keep = k;
            sb_put(&out, st->pend.p, st->pend.n - keep);
            memmove(st->pend.p, st->pend.p + st->pend.n - keep, keep);
            st->pend.n = keep;
        }
    }
    if (out.n || (lp && *lp)) {
        json_t *delta = json_object();
        if (out.n) json_object_set_new(delta, "content", json_stringn(out.p, out.n));
        sse_data(st, chunk(st, chat_choice(delta, lp ? *lp : NULL, NULL)));
        if (lp) *lp = NULL;
    }
    sb_free(&out);
}

/* Turn everything new in the inbox into SSE text in st->wire. */
static void format_stream(stream *st) {
    srv *s = st->s;
    if (st->keepalive_due) {
        sb_put(&st->wire, ": keep-alive\n\n", 14);
        st->keepalive_due = 0;
    }
    if (st->aborted && !st->finished_sent) {
        st_oai_error e;
        st_oai_error_set(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        char *j = st_oai_error_json(&e);
        sb_put(&st->wire, "data: ", 6);
        sb_put(&st->wire, j, strlen(j));
        sb_put(&st->wire, "\n\ndata: [DONE]\n\n", 16);
        free(j);
        st->finished_sent = 1;
        return;
    }
    int chat = st->req.kind == ST_OAI_CHAT;
    if (chat && !st->role_sent) {
        sse_data(st, chunk(st, chat_choice(json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL)));
        st->role_sent = 1;
    }
    json_t *lp = NULL;
    if (st->n_lp_in) {
        if (chat) {
            json_t *arr = json_array();
            for (int i = 0; i < st->n_lp_in; i++) json_array_append_new(arr, chat_lp_entry(s->tok, &st->lp_in[i]));
            lp = json_pack("{s:o}", "content", arr);
        } else {
            lp = completion_lp(s->tok, st->lp_in, st->n_lp_in, &st->text_offset);
        }
        st->n_lp_in = 0;
    }
    if (st->r_in_len) {
        json_t *delta = json_pack("{s:s%}", "reasoning_content", st->r_in, st->r_in_len);
        json_t *use_lp = st->c_in_len ? NULL : lp;
        sse_data(st, chunk(st, chat_choice(delta, use_lp, NULL)));
        if (use_lp) lp = NULL;
        st->r_in_len = 0;
    }
    if (chat) {
        if (st->c_in_len || lp) stream_content(st, st->c_in, st->c_in_len, &lp);
    } else if (st->c_in_len || lp) {
        sse_data(st, chunk(st, completion_choice(st->c_in, st->c_in_len, lp, NULL)));
        lp = NULL;
    }
    st->c_in_len = 0;
    json_decref(lp);
    if (!st->done || st->finished_sent) return;
    /* the end */
    if (st->finish == ST_FINISH_ERROR || st->overflow || st->finish == ST_FINISH_CANCELLED) {
        st_oai_error e;
        if (st->overflow)
            st_oai_error_set(&e, 500, "server_error", NULL, "stream_overflow",
                             "the client did not read the stream fast enough");
        else
            st_oai_error_set(&e, 500, "server_error", NULL, "generation_failed", "generation failed: %s",
                             st->error[0] ? st->error : st_finish_name(st->finish));
        char *j = st_oai_error_json(&e);
        sb_put(&st->wire, "data: ", 6);
        sb_put(&st->wire, j, strlen(j));
        sb_put(&st->wire, "\n\n", 2);
        free(j);
    } else {
        const char *fin = finish_text(st->finish);
        if (chat) {
            if (st->pend.n) { /* a held-back partial "<tool_call" that never completed */
                json_t *delta = json_pack("{s:s%}", "content", st->pend.p, st->pend.n);
                sse_data(st, chunk(st, chat_choice(delta, NULL, NULL)));
                st->pend.n = 0;
            }
            if (st->in_tool) {
                st_tool_calls tc;
                if (st_toolcall_parse(st->tool_hold.p, st->tool_hold.n, st->req.tools, &tc)) {
                    json_t *delta = json_pack("{s:o}", "tool_calls", tool_calls_json(s, &tc, 1));
                    sse_data(st, chunk(st, chat_choice(delta, NULL, NULL)));
                    fin = "tool_calls";
                    st_tool_calls_free(&tc);
                } else {
                    json_t *delta = json_pack("{s:s%}", "content", st->tool_hold.p, st->tool_hold.n);
                    sse_data(st, chunk(st, chat_choice(delta, NULL, NULL)));
                }
            }
            sse_data(st, chunk(st, chat_choice(json_object(), NULL, fin)));
        } else {
            sse_data(st, chunk(st, completion_choice("", 0, NULL, fin)));
        }
        if (st->req.include_usage) {
            json_t *u = chunk(st, json_null());
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(&st->usage));
            sse_data(st, u);
        }
    }
    sb_put(&st->wire, "data: [DONE]\n\n", 14);
    st->finished_sent = 1;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    pthread_mutex_lock(&st->mu);
    if (st->wire_off >= st->wire.n) {
        st->wire.n = st->wire_off = 0;
        if (!st->finished_sent) format_stream(st);
    }
    if (st->wire_off < st->wire.n) {
        size_t n = st->wire.n - st->wire_off;
        if (n > max) n = max;
        memcpy(buf, st->wire.p + st->wire_off, n);
        st->wire_off += n;
        st->last_write = st_now_s();
        pthread_mutex_unlock(&st->mu);
        return (ssize_t)n;
    }
    if (st->finished_sent) {
        pthread_mutex_unlock(&st->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    /* nothing yet: park the connection until the scheduler (or the ticker) wakes it */
    if (st->conn && !st->suspended) {
        MHD_suspend_connection(st->conn);
        st->suspended = 1;
    }
    pthread_mutex_unlock(&st->mu);
    return 0;
}

static void sse_reader_free(void *cls) { stream_unref(cls); }

/* ---- non-streaming ---- */

/* move the inbox into the accumulators (under st->mu) */
static void drain_inbox(stream *st) {
    sb_put(&st->content_all, st->c_in, st->c_in_len);
    sb_put(&st->reasoning_all, st->r_in, st->r_in_len);
    st->c_in_len = st->r_in_len = 0;
    if (st->n_lp_in) {
        if (!st->lp_all) st->lp_all = json_array();
        if (st->req.kind == ST_OAI_CHAT) {
            for (int i = 0; i < st->n_lp_in; i++) json_array_append_new(st->lp_all, chat_lp_entry(st->s->tok, &st->lp_in[i]));
        } else {
            json_array_append_new(st->lp_all, completion_lp(st->s->tok, st->lp_in, st->n_lp_in, &st->text_offset));
        }
        st->n_lp_in = 0;
    }
}

/* merge a list of completions logprob objects into one */
static json_t *merge_completion_lp(json_t *parts) {
    static const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    json_t *out = json_object();
    for (int k = 0; k < 4; k++) {
        json_t *a = json_array();
        size_t i;
        json_t *p;
        json_array_foreach(parts, i, p) json_array_extend(a, json_object_get(p, keys[k]));
        json_object_set_new(out, keys[k], a);
    }
    return out;
}

static char *final_response(stream *st, int *status) {
    srv *s = st->s;
    if (st->finish == ST_FINISH_ERROR || st->overflow || st->aborted || st->finish == ST_FINISH_CANCELLED) {
        st_oai_error e;
        if (st->aborted) st_oai_error_set(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        else st_oai_error_set(&e, 500, "server_error", NULL, "generation_failed", "generation failed: %s",
                              st->error[0] ? st->error : st_finish_name(st->finish));
        *status = e.status;
        return st_oai_error_json(&e);
    }
    *status = 200;
    const char *fin = finish_text(st->finish);
    json_t *choice;
    if (st->req.kind == ST_OAI_CHAT) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        st_tool_calls tc;
        int calls = st->req.tools && st_toolcall_parse(st->content_all.p ? st->content_all.p : "", st->content_all.n, st->req.tools, &tc);
        if (calls) {
            json_object_set_new(msg, "content", tc.content ? json_string(tc.content) : json_null());
            json_object_set_new(msg, "tool_calls", tool_calls_json(s, &tc, 0));
            fin = "tool_calls";
            st_tool_calls_free(&tc);
        } else {
            json_object_set_new(msg, "content", json_stringn(st->content_all.p ? st->content_all.p : "", st->content_all.n));
        }
        if (st->reasoning_all.n)
            json_object_set_new(msg, "reasoning_content", json_stringn(st->reasoning_all.p, st->reasoning_all.n));
        json_t *lp = st->req.logprobs ? json_pack("{s:O}", "content", st->lp_all ? st->lp_all : json_array()) : json_null();
        if (st->req.logprobs && !st->lp_all) json_decref(json_object_get(lp, "content"));
        choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs", lp, "finish_reason", fin);
    } else {
        sbuf text = {0};
        if (st->req.echo && st->prompt_text) sb_put(&text, st->prompt_text, strlen(st->prompt_text));
        sb_put(&text, st->content_all.p ? st->content_all.p : "", st->content_all.n);
        json_t *lp = st->req.logprobs ? merge_completion_lp(st->lp_all ? st->lp_all : json_array()) : json_null();
        choice = json_pack("{s:i,s:s%,s:o,s:s}", "index", 0, "text", text.p ? text.p : "", text.n, "logprobs", lp,
                           "finish_reason", fin);
        sb_free(&text);
    }
    json_t *root = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", st->id, "object",
                             st->req.kind == ST_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                             (json_int_t)st->created, "model", s->model_id, "system_fingerprint", "strand",
                             "choices", choice, "usage", usage_json(&st->usage));
    char *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

/* ---------------------------------------------------------------------------------------- */
/* HTTP plumbing */

static void add_common_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Server", "strand");
}

static enum MHD_Result respond(srv *s, struct MHD_Connection *c, int status, const char *type, char *body) {
    if (!body) {
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        status = 500;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    add_common_headers(r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    st_metrics_count_status(&s->metrics, status);
    return ret;
}

static enum MHD_Result respond_error(srv *s, struct MHD_Connection *c, const st_oai_error *e) {
    return respond(s, c, e->status, "application/json", st_oai_error_json(e));
}

static enum MHD_Result error_simple(srv *s, struct MHD_Connection *c, int status, const char *type,
                                    const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result error_simple(srv *s, struct MHD_Connection *c, int status, const char *type,
                                    const char *code, const char *fmt, ...) {
    st_oai_error e;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st_oai_error_set(&e, status, type, NULL, code, "%s", msg);
    return respond_error(s, c, &e);
}


static enum MHD_Result start_generation(srv *s, struct MHD_Connection *c, httpreq *h, st_oai_kind kind) {
    st_oai_error e;
    stream *st = calloc(1, sizeof *st);
    if (!st) return error_simple(s, c, 500, "server_error", NULL, "out of memory");
    if (st_oai_parse(kind, h->body.p ? h->body.p : "", h->body.n, &s->defaults, &st->req, &e) != ST_OK) {
        free(st);
        return respond_error(s, c, &e);
    }
    st_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t text_len = 0;
    int start_r = 0;
    if (kind == ST_OAI_CHAT) {
        if (!s->ct) {
            st_oai_request_free(&st->req);
            free(st);
            return error_simple(s, c, 400, "invalid_request_error", NULL,
                                "this model has no chat template; use /v1/completions");
        }
        if (st_chat_template_render(s->ct, st->req.messages, st->req.tools, NULL, st->req.kwargs, &text, &text_len, &err) != ST_OK) {
            st_oai_request_free(&st->req);
            free(st);
            return error_simple(s, c, 400, "invalid_request_error", "chat_template_error", "chat template: %s", err.msg);
        }
        start_r = s->think_split && st_textout_prompt_opens_think(text);
    } else if (st->req.prompt) {
        text = strdup(st->req.prompt);
        text_len = strlen(st->req.prompt);
        if (st->req.echo) st->prompt_text = strdup(st->req.prompt);
    }
    if (text) {
        if (st_tok_encode(s->tok, text, text_len, 1, &ids, &n, &err) != ST_OK) {
            free(text);
            st_oai_request_free(&st->req);
            free(st);
            return error_simple(s, c, 400, "invalid_request_error", NULL, "tokenizing the prompt: %s", err.msg);
        }
        free(text);
    } else {
        ids = st->req.prompt_ids; /* owned by the request */
        n = (size_t)st->req.n_prompt_ids;
        if (st->req.echo) {
            size_t tl = 0;
            if (st_tok_decode(s->tok, ids, n, 0, &st->prompt_text, &tl, &err) != ST_OK) st->prompt_text = NULL;
        }
    }
    st->s = s;
    st->streaming = st->req.stream;
    st->created = (long long)time(NULL);
    unsigned long long x = atomic_fetch_add(&s->id_counter, 1) * 0x9e3779b97f4a7c15ull ^ s->id_salt;
    snprintf(st->id, sizeof st->id, "%s-%016llx", kind == ST_OAI_CHAT ? "chatcmpl" : "cmpl", x);
    pthread_mutex_init(&st->mu, NULL);
    st->req.params.split_reasoning = kind == ST_OAI_CHAT && s->think_split;
    st->req.params.start_in_reasoning = start_r;
    st->last_write = st_now_s();
    /* references: this HTTP request, the scheduler, the reader when streaming */
    atomic_store(&st->refs, 2 + (st->streaming ? 1 : 0));
    pthread_mutex_lock(&s->streams_mu);
    st->next = s->streams;
    if (s->streams) s->streams->prev = st;
    s->streams = st;
    pthread_mutex_unlock(&s->streams_mu);
    pthread_mutex_lock(&st->mu);
    st->conn = c;
    st_status sst = st_sched_submit(s->sched, ids, (int64_t)n, &st->req.params, on_event, st, &st->sched_id, &err);
    if (ids != st->req.prompt_ids) free(ids);
    if (sst != ST_OK) {
        st->conn = NULL;
        pthread_mutex_unlock(&st->mu);
        atomic_store(&st->refs, 1);
        stream_unref(st);
        if (sst == ST_ERR_BUSY) return error_simple(s, c, 429, "rate_limit_error", "queue_full", "%s", err.msg);
        if (sst == ST_ERR_LIMIT)
            return error_simple(s, c, 400, "invalid_request_error", "context_length_exceeded", "%s", err.msg);
        return error_simple(s, c, sst == ST_ERR_ARG ? 400 : 500, sst == ST_ERR_ARG ? "invalid_request_error" : "server_error",
                            NULL, "%s", err.msg);
    }
    st->submitted = 1;
    h->st = st;
    if (!st->streaming) {
        MHD_suspend_connection(c);
        st->suspended = 1;
        pthread_mutex_unlock(&st->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&st->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, sse_reader, st, sse_reader_free);
    if (!r) {
        st_sched_cancel(s->sched, st->sched_id);
        stream_unref(st); /* the reader's reference */
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_common_headers(r);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    st_metrics_count_status(&s->metrics, 200);
    return ret;
}

/* a non-streaming request woken by the scheduler */
static enum MHD_Result continue_generation(srv *s, struct MHD_Connection *c, httpreq *h) {
    stream *st = h->st;
    pthread_mutex_lock(&st->mu);
    drain_inbox(st);
    if (!st->done && !st->aborted && !st->overflow) {
        MHD_suspend_connection(c);
        st->suspended = 1;
        pthread_mutex_unlock(&st->mu);
        return MHD_YES;
    }
    int status;
    char *body = final_response(st, &status);
    pthread_mutex_unlock(&st->mu);
    return respond(s, c, status, "application/json", body);
}

static int check_auth(srv *s, struct MHD_Connection *c) {
    if (!s->p.api_key || !*s->p.api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncmp(a, "Bearer ", 7) != 0) return 0;
    a += 7;
    size_t n = strlen(a), k = strlen(s->p.api_key);
    unsigned char diff = (unsigned char)(n != k);
    for (size_t i = 0; i < n && i < k; i++) diff |= (unsigned char)(a[i] ^ s->p.api_key[i]);
    return diff == 0;
}

static json_t *model_json(srv *s) {
    const st_config *cfg = s->m ? &s->m->cfg : NULL;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", s->model_id, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "strand");
    if (cfg) json_object_set_new(o, "max_model_len", json_integer(s->p.ctx > 0 ? s->p.ctx : cfg->max_position_embeddings));
    return o;
}

static enum MHD_Result route(srv *s, struct MHD_Connection *c, httpreq *h, const char *url, const char *method) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        add_common_headers(r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        enum MHD_Result ret = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        st_metrics_count_status(&s->metrics, 204);
        return ret;
    }
    if (h->too_large)
        return error_simple(s, c, 413, "invalid_request_error", "request_too_large",
                            "the request body exceeds %zu bytes", s->p.max_body);
    int health = atomic_load(&s->health);
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health")) {
        if (!get) return error_simple(s, c, 405, "invalid_request_error", "method_not_allowed", "use GET %s", url);
        json_t *j;
        if (health == HEALTH_READY) j = json_pack("{s:s,s:s}", "status", "ready", "model", s->model_id);
        else if (health == HEALTH_LOADING) j = json_pack("{s:s}", "status", "loading");
        else j = json_pack("{s:s,s:s}", "status", "unhealthy", "reason", s->health_reason);
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        return respond(s, c, health == HEALTH_READY ? 200 : 503, "application/json", body);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return error_simple(s, c, 405, "invalid_request_error", "method_not_allowed", "use GET /metrics");
        st_sched_stats ss = {0};
        if (s->sched) st_sched_get_stats(s->sched, &ss);
        return respond(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", st_metrics_render(&s->metrics, &ss, health));
    }
    int is_v1 = !strncmp(url, "/v1/", 4);
    if (is_v1 && !check_auth(s, c))
        return error_simple(s, c, 401, "authentication_error", "invalid_api_key", "invalid or missing API key");
    int chat = !strcmp(url, "/v1/chat/completions"), comp = !strcmp(url, "/v1/completions");
    int models = !strcmp(url, "/v1/models"), one_model = !strncmp(url, "/v1/models/", 11);
    if (!chat && !comp && !models && !one_model)
        return error_simple(s, c, 404, "not_found_error", "not_found", "no route for %s %s", method, url);
    if (((chat || comp) && !post) || ((models || one_model) && !get))
        return error_simple(s, c, 405, "invalid_request_error", "method_not_allowed", "%s is not allowed on %s", method, url);
    if (health != HEALTH_READY)
        return error_simple(s, c, 503, "server_error", health == HEALTH_LOADING ? "model_loading" : "unhealthy",
                            health == HEALTH_LOADING ? "the model is loading" : "the server is unhealthy: %s", s->health_reason);
    if (models) {
        json_t *j = json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s));
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        return respond(s, c, 200, "application/json", body);
    }
    if (one_model) {
        if (strcmp(url + 11, s->model_id) != 0)
            return error_simple(s, c, 404, "not_found_error", "model_not_found", "The model '%s' does not exist", url + 11);
        json_t *j = model_json(s);
        char *body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        return respond(s, c, 200, "application/json", body);
    }
    return start_generation(s, c, h, chat ? ST_OAI_CHAT : ST_OAI_COMPLETION);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    httpreq *h = *con_cls;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) return MHD_NO;
        *con_cls = h;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) h->too_large = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!h->too_large) {
            if (h->body.n + *upload_size > s->p.max_body) {
                h->too_large = 1;
                sb_free(&h->body);
            } else if (sb_put(&h->body, upload, *upload_size) != 0) {
                h->too_large = 1;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (h->st) return continue_generation(s, c, h);
    return route(s, c, h, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    srv *s = cls;
    httpreq *h = *con_cls;
    if (!h) return;
    if (h->st) {
        stream *st = h->st;
        pthread_mutex_lock(&st->mu);
        st->conn = NULL;
        int running = st->submitted && !st->done;
        uint64_t id = st->sched_id;
        pthread_mutex_unlock(&st->mu);
        if (running) {
            st_sched_cancel(s->sched, id);
            if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) st_metrics_disconnect(&s->metrics);
        }
        stream_unref(st);
    }
    sb_free(&h->body);
    free(h);
    *con_cls = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* threads */

static void *scheduler_main(void *arg) {
    srv *s = arg;
    while (!atomic_load(&s->stopping)) {
        if (st_sched_step(s->sched) == 0 && !st_sched_wait(s->sched)) break;
    }
    return NULL;
}

/* wakes idle streams so they send a keep-alive comment */
static void *ticker_main(void *arg) {
    srv *s = arg;
    while (!atomic_load(&s->stopping)) {
        usleep(250 * 1000);
        double t = st_now_s();
        pthread_mutex_lock(&s->streams_mu);
        for (stream *st = s->streams; st; st = st->next) {
            pthread_mutex_lock(&st->mu);
            if (st->streaming && st->conn && st->suspended && !st->finished_sent && t - st->last_write >= s->p.keepalive_s) {
                st->keepalive_due = 1;
                st->last_write = t;
                st->suspended = 0;
                MHD_resume_connection(st->conn);
            }
            pthread_mutex_unlock(&st->mu);
        }
        pthread_mutex_unlock(&s->streams_mu);
    }
    return NULL;
}

/* sampling defaults from generation_config.json (OpenAI's when absent) */
static void load_defaults(srv *s) {
    st_sampling *d = &s->defaults.sampling;
    *d = st_sampling_default();
    d->temperature = 1.0f;
    char path[4096];
    if (st_path_join(path, sizeof path, s->p.model_dir, "generation_config.json", NULL) != ST_OK) return;
    json_error_t je;
    json_t *g = st_file_exists(path) ? json_load_file(path, 0, &je) : NULL;
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature"))) d->temperature = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "top_p"))) d->top_p = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k"))) d->top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(g, "min_p"))) d->min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "repetition_penalty"))) d->repetition_penalty = (float)json_number_value(v);
    if (json_is_false(json_object_get(g, "do_sample"))) d->temperature = 0.0f;
    json_decref(g);
    st_error err = {0};
    if (st_sampling_validate(d, 1 << 30, &err) != ST_OK) {
        ST_WARN("%s: ignoring its sampling defaults: %s", path, err.msg);
        *d = st_sampling_default();
        d->temperature = 1.0f;
    }
}

static st_status load_all(srv *s, st_error *err) {
    st_status st;
    if ((st = st_model_load(s->p.model_dir, &s->m, err)) != ST_OK) return st;
    if ((st = st_tok_load_dir(s->p.model_dir, &s->tok, err)) != ST_OK) return st;
    st_error terr = {0};
    if (st_chat_template_load(s->p.model_dir, NULL, NULL, &s->ct, &terr) != ST_OK) {
        ST_WARN("no chat template (%s): /v1/chat/completions is disabled", terr.msg);
        s->ct = NULL;
    }
    s->think_split = st_tok_token_to_id(s->tok, "</think>", 8) >= 0;
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = s->p.max_seqs;
    sp.ctx = s->p.ctx;
    sp.step_tokens = s->p.step_tokens > s->p.max_seqs ? s->p.step_tokens : s->p.max_seqs;
    sp.max_queue = s->p.max_queue;
    sp.kv_dtype = s->p.kv_dtype;
    sp.kv_blocks = s->p.kv_blocks;
    if ((st = st_sched_create(s->m, s->tok, &sp, &s->sched, err)) != ST_OK) return st;
    load_defaults(s);
    s->defaults.max_tokens_completion = 16;
    s->defaults.model_name = s->model_id;
    st_sched_stats ss;
    st_sched_get_stats(s->sched, &ss);
    st_model_stats ms;
    st_model_get_stats(s->m, s->p.kv_dtype == ST_KV_BF16 ? 2 : 4, &ms);
    fprintf(stderr, "strand: serving '%s': %d sequences, context %lld, memory planned: %.1f MiB weights (mapped) + %.1f MiB cache and scratch\n",
            s->model_id, s->p.max_seqs, (long long)(s->p.ctx > 0 ? s->p.ctx : s->m->cfg.max_position_embeddings),
            (double)ms.weight_bytes / 1048576.0, (double)ss.planned_bytes / 1048576.0);
    return ST_OK;
}

st_status st_server_run(const st_server_params *p, volatile sig_atomic_t *stop, st_error *err) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (s->p.http_threads < 1) s->p.http_threads = 1;
    s->created = (long long)time(NULL);
    s->id_salt = (uint64_t)s->created * 0x2545f4914f6cdd1dull ^ (uint64_t)getpid();
    pthread_mutex_init(&s->streams_mu, NULL);
    st_metrics_init(&s->metrics);
    atomic_store(&s->health, HEALTH_LOADING);
    if (p->model_name && *p->model_name) {
        snprintf(s->model_id, sizeof s->model_id, "%.255s", p->model_name);
    } else {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", p->model_dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
        const char *base = strrchr(tmp, '/');
        snprintf(s->model_id, sizeof s->model_id, "%.255s", base ? base + 1 : tmp);
    }
    st_status st = ST_OK;
    struct sockaddr_in sa4;
    struct sockaddr_in6 sa6;
    memset(&sa4, 0, sizeof sa4);
    memset(&sa6, 0, sizeof sa6);
    struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, s->p.host, &sa4.sin_addr) == 1) {
        sa4.sin_family = AF_INET;
        sa4.sin_port = htons((uint16_t)s->p.port);
        sa = (struct sockaddr *)&sa4;
    } else if (inet_pton(AF_INET6, s->p.host, &sa6.sin6_addr) == 1) {
        sa6.sin6_family = AF_INET6;
        sa6.sin6_port = htons((uint16_t)s->p.port);
        sa = (struct sockaddr *)&sa6;
        flags |= MHD_USE_IPv6;
    } else {
        st = st_error_set(err, ST_ERR_ARG, "--host '%s' is not an IPv4 or IPv6 address", s->p.host);
        goto out;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->p.http_threads,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->p.max_header, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)300, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (!s->d) {
        st = st_error_set(err, ST_ERR_IO, "cannot listen on %s:%d (address in use or not allowed?)", s->p.host, s->p.port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : s->p.port;
    fprintf(stderr, "strand: listening on http://%s:%d (loading %s)\n", s->p.host, port, s->p.model_dir);
    if ((st = load_all(s, err)) != ST_OK) {
        snprintf(s->health_reason, sizeof s->health_reason, "%s", err->msg);
        atomic_store(&s->health, HEALTH_UNHEALTHY);
        goto out;
    }
    if (pthread_create(&s->sched_thread, NULL, scheduler_main, s) != 0 ||
        pthread_create(&s->tick_thread, NULL, ticker_main, s) != 0) {
        st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
        goto out;
    }
    s->threads_started = 1;
    atomic_store(&s->health, HEALTH_READY);
    fprintf(stderr, "strand: ready\n");
    while (!*stop) usleep(100 * 1000);
    fprintf(stderr, "strand: shutting down\n");
out:
    snprintf(s->health_reason, sizeof s->health_reason, "%s", st == ST_OK ? "shutting down" : err->msg);
    atomic_store(&s->health, HEALTH_UNHEALTHY);
    atomic_store(&s->stopping, 1);
    if (s->sched) st_sched_shutdown(s->sched);
    if (s->threads_started) {
        pthread_join(s->sched_thread, NULL);
        pthread_join(s->tick_thread, NULL);
    }
    /* wake every parked connection so it can end */
    pthread_mutex_lock(&s->streams_mu);
    for (stream *x = s->streams; x; x = x->next) {
        pthread_mutex_lock(&x->mu);
        x->aborted = 1;
        if (x->conn && x->suspended) {
            x->suspended = 0;
            MHD_resume_connection(x->conn);
        }
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&s->streams_mu);
    if (s->d) {
        usleep(200 * 1000);
        MHD_stop_daemon(s->d);
    }
    st_sched_destroy(s->sched); /* drops the scheduler's references without events */
    st_chat_template_free(s->ct);
    st_tok_free(s->tok);
    st_model_free(s->m);
    st_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->streams_mu);
    free(s);
    return st;
}
