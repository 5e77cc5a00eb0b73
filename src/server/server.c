/* ==== The OpenAI-compatible HTTP server (see server.h) ====
 *
 * A generation request's life:
 *   MHD thread (route):   the body is complete; a stream is made, the connection suspended,
 *                         registered with the watcher, and the stream queued for preparation
 *   prep thread:          parse, render, tokenize (bounded by the context), submit; on any
 *                         failure the error response is stored in the stream; resume
 *   MHD thread (resumed): queue the stored error, or the SSE response, or (non-streaming)
 *                         drain the inbox and suspend again until the end
 *   scheduler thread:     on_event copies text and logprobs into the inbox, wakes the
 *                         connection, and pauses the sequence while the inbox is nearly full
 *   watcher thread:       a client that hangs up while suspended is cancelled at once
 * A stream is reference-counted: the HTTP request (until on_completed), the prep job (until
 * prepared), the scheduler (until its DONE event) and the SSE reader (until libmicrohttpd
 * frees the response) each hold one.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/utf8.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/oai.h"
#include "server/toolcall.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

enum { HEALTH_LOADING = 0, HEALTH_READY = 1, HEALTH_UNHEALTHY = 2 };

#define INBOX_MIN_TEXT 16384 /* bytes of undelivered content (and as much reasoning), at least */
#define INBOX_LP 64          /* undelivered log-probability records */
#define EXTRA_CONNECTIONS 64 /* accepted past max_connections, to answer them 503 */

st_server_params st_server_default_params(void) {
    st_server_params p = {
        .host = "127.0.0.1",
        .port = 8080,
        .max_seqs = 8,
        .ctx = 0,
        .step_tokens = 512,
        .max_queue = 64,
        .kv_dtype = ST_KV_F32,
        .mem_fraction = 0.9,
        .max_body = (size_t)32 << 20,
        .max_header = (size_t)64 << 10,
        .http_threads = 4,
        .prep_threads = 2,
        .max_connections = 4096,
        .idle_timeout_s = 5,
        .stall_timeout_s = 60.0,
        .keepalive_s = 10.0,
        .cpu = {.kernels = NULL, .n_threads = 0, .pack = 1, .gdn_chunked = 1, .min_parallel_work = 0},
    };
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* growable byte buffers (HTTP and prep threads only) */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

/* room for n more bytes and a NUL */
static int sb_reserve(sbuf *b, size_t n) {
    if (b->n + n + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 1024;
    while (nc < b->n + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return -1;
    b->p = np;
    b->cap = nc;
    return 0;
}

static int sb_put(sbuf *b, const char *s, size_t n) {
    if (sb_reserve(b, n) != 0) return -1;
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

typedef struct stream {
    srv *s;
    atomic_int refs;
    pthread_mutex_t mu;
    struct stream *prev, *next;  /* the server's stream list (streams_mu) */
    uint64_t serial;             /* the watcher's handle (unique, never reused) */
    /* fixed at creation */
    st_oai_kind kind;
    char id[48];
    long long created;
    char *body;                  /* the request body until the prep thread parsed it */
    size_t body_len;
    /* set by the prep thread before submission; read-only afterwards */
    st_oai_request req;
    int streaming;
    char *prompt_text;           /* completions with echo */
    /* guarded by mu */
    struct MHD_Connection *conn; /* NULL once the connection completed */
    int fd;                      /* the connection's socket (watched while > 0 and watched) */
    int watched;
    int gone;                    /* the client hung up */
    int disconnect_counted;
    int suspended;
    int prepared;                /* 0 waiting, 1 submitted, -1 failed (fail_* hold the answer) */
    int fail_status;
    char *fail_body;
    int response_queued;         /* streaming: the SSE response is queued */
    int submitted;
    uint64_t sched_id;
    char *c_in;                  /* [inbox_cap] content the scheduler wrote, not yet formatted */
    size_t c_in_len;
    char *r_in;                  /* [inbox_cap] reasoning, likewise */
    size_t r_in_len;
    lp_rec lp_in[INBOX_LP];
    int n_lp_in;
    int paused;                  /* on_event answered ST_EV_PAUSE; no resume sent yet */
    int overflow, overflow_cancelled; /* cannot happen while pausing works; kept as a guard */
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
    int role_sent, echo_sent, finished_sent;
    sbuf content_all, reasoning_all; /* non-streaming accumulation */
    json_t *lp_all;              /* non-streaming logprob entries */
    sbuf pend;                   /* streamed content held back while it could open a tool call */
    sbuf tool_hold;              /* streamed text from <tool_call> on */
    int in_tool;
    int64_t text_offset;         /* completions logprobs: characters of text so far */
} stream;

struct srv {
    st_server_params p;
    char model_id[256];
    long long created;
    atomic_int health;
    char health_reason[1024];
    st_model *m;
    st_backend *backend;     /* owned: the model prepared for the CPU */
    st_tokenizer *tok;
    size_t max_token_bytes;
    st_chat_template *ct;
    st_sched *sched;
    size_t inbox_cap;
    st_oai_defaults defaults;
    int think_split;
    st_metrics metrics;
    struct MHD_Daemon *d;
    pthread_t sched_thread, watch_thread;
    pthread_t *prep_threads;     /* [p.prep_threads] */
    int n_prep_started, sched_started, watch_started;
    atomic_int stopping;
    atomic_int n_conns;          /* open connections */
    int epoll_fd;                /* the watcher's */
    pthread_mutex_t streams_mu;
    stream *streams;
    uint64_t next_serial;        /* streams_mu */
    /* the prep queue: a ring of streams (prep_mu) */
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;
    stream **prep_ring;          /* [prep_cap] */
    int prep_cap, prep_head, prep_n;
    atomic_int preparing;        /* queued or being prepared */
    int prep_stop;
    atomic_ullong id_counter;
    uint64_t id_salt;
};

/* per HTTP request state */
typedef struct httpreq {
    sbuf body;
    int too_large;
    stream *st;
} httpreq;

static void stream_free(stream *st) {
    st_oai_request_free(&st->req);
    free(st->body);
    free(st->fail_body);
    free(st->c_in);
    free(st->r_in);
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

static void stream_unref(stream *st) {
    if (atomic_fetch_sub(&st->refs, 1) != 1) return;
    srv *s = st->s;
    pthread_mutex_lock(&s->streams_mu);
    if (st->prev) st->prev->next = st->next;
    else s->streams = st->next;
    if (st->next) st->next->prev = st->prev;
    pthread_mutex_unlock(&s->streams_mu);
    stream_free(st);
}

/* wake a suspended connection (under st->mu) */
static void wake(stream *st) {
    if (st->conn && st->suspended) {
        st->suspended = 0;
        MHD_resume_connection(st->conn);
    }
}

/* stop watching the connection's socket (under st->mu) */
static void unwatch(stream *st) {
    if (!st->watched) return;
    epoll_ctl(st->s->epoll_fd, EPOLL_CTL_DEL, st->fd, NULL);
    st->watched = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* the scheduler side: copy into the inbox, wake the connection (no allocation) */

static int on_event(void *user, const st_event *ev) {
    stream *st = user;
    srv *s = st->s;
    double t = st_now_s();
    pthread_mutex_lock(&st->mu);
    if (ev->content_len) {
        if (st->c_in_len + ev->content_len <= s->inbox_cap) {
            memcpy(st->c_in + st->c_in_len, ev->content, ev->content_len);
            st->c_in_len += ev->content_len;
        } else {
            st->overflow = 1;
        }
    }
    if (ev->reasoning_len) {
        if (st->r_in_len + ev->reasoning_len <= s->inbox_cap) {
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
    /* room for the next event's text and logprobs, or pause until the client has read */
    size_t room = st_sched_max_event_text(s->sched);
    int full = s->inbox_cap - st->c_in_len < room || s->inbox_cap - st->r_in_len < room ||
               st->n_lp_in >= INBOX_LP - 1;
    int answer = ST_EV_CONTINUE;
    if (full && ev->kind == ST_EV_TOKEN && !st->done && !st->paused) {
        st->paused = 1;
        answer = ST_EV_PAUSE;
    }
    if (st->streaming || st->done || full || st->overflow) wake(st);
    int cancel = st->overflow && !st->done && !st->overflow_cancelled;
    if (cancel) st->overflow_cancelled = 1;
    uint64_t id = st->sched_id;
    int done = ev->kind == ST_EV_DONE;
    pthread_mutex_unlock(&st->mu);
    if (itl >= 0) st_metrics_observe(&s->metrics, &s->metrics.itl, itl);
    if (cancel) {
        ST_WARN("stream %s: inbox overflow (a bug); cancelled", st->id);
        st_sched_cancel(s->sched, id);
    }
    if (done) {
        st_metrics_finished(&s->metrics, ev);
        stream_unref(st); /* the scheduler's reference */
    }
    return answer;
}

/* After the inbox was drained (under st->mu): 1 when the sequence waits for that, to be
 * resumed with st_sched_resume once the mutex is released. */
static int drained(stream *st) {
    if (!st->paused) return 0;
    st->paused = 0;
    return !st->done;
}

/* ---------------------------------------------------------------------------------------- */
/* formatting (HTTP threads, under st->mu) */

/* bytes as valid UTF-8 (invalid sequences become U+FFFD) */
static char *utf8_lossy(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1), *q = o;
    if (!o) return NULL;
    size_t i = 0;
    while (i < n) {
        int k = st_utf8_seq((const uint8_t *)s + i, n - i, NULL);
        if (k) {
            memcpy(q, s + i, (size_t)k);
            q += k;
            i += (size_t)k;
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

/* a log-probability as JSON: -9999.0 (OpenAI's floor) for one that is not finite, so that
 * arrays keep one entry per token */
static json_t *logprob_json(double lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

/* chat logprob entry: {"token", "logprob", "bytes", "top_logprobs": [...]} */
static json_t *chat_lp_entry(const st_tokenizer *tok, const lp_rec *r) {
    json_t *tops = json_array();
    for (int i = 0; i < r->n_top; i++)
        json_array_append_new(tops, json_pack("{s:o,s:o,s:o}", "token", token_json_string(tok, r->top[i]),
                                              "logprob", logprob_json(r->top_lp[i]), "bytes",
                                              token_bytes_json(tok, r->top[i])));
    return json_pack("{s:o,s:o,s:o,s:o}", "token", token_json_string(tok, r->token), "logprob",
                     logprob_json(r->logprob), "bytes", token_bytes_json(tok, r->token), "top_logprobs", tops);
}

/* completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets
 * count characters of the text, as OpenAI's do */
static json_t *completion_lp(const st_tokenizer *tok, const lp_rec *recs, int n, int64_t *offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(tokens, token_json_string(tok, recs[i].token));
        json_array_append_new(lps, logprob_json(recs[i].logprob));
        json_t *t = json_object();
        for (int k = 0; k < recs[i].n_top; k++) {
            json_t *key = token_json_string(tok, recs[i].top[k]);
            json_object_set_new(t, json_string_value(key), logprob_json(recs[i].top_lp[k]));
            json_decref(key);
        }
        json_array_append_new(tops, t);
        json_array_append_new(offs, json_integer(*offset));
        size_t len = 0;
        const char *b = st_tok_token_bytes(tok, recs[i].token, &len);
        if (b && !st_tok_is_special(tok, recs[i].token)) *offset += (int64_t)st_utf8_count(b, len);
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
    return f == ST_FINISH_LENGTH ? "length" : f == ST_FINISH_ERROR ? "error" : "stop";
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

/* the error a finished stream ends with, or 0 when it ended well */
static int stream_error(const stream *st, st_oai_error *e) {
    if (st->aborted) {
        st_oai_error_set(e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
    } else if (st->overflow) {
        st_oai_error_set(e, 500, "server_error", NULL, "stream_overflow", "the stream's buffer overflowed");
    } else if (st->finish == ST_FINISH_ERROR || st->finish == ST_FINISH_CANCELLED) {
        st_oai_error_set(e, 500, "server_error", NULL, "generation_failed", "generation failed: %s",
                         st->error[0] ? st->error : st_finish_name(st->finish));
    } else {
        return 0;
    }
    return 1;
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

static void sse_error(stream *st, const st_oai_error *e) {
    char *j = st_oai_error_json(e);
    if (!j) return;
    sb_put(&st->wire, "data: ", 6);
    sb_put(&st->wire, j, strlen(j));
    sb_put(&st->wire, "\n\n", 2);
    free(j);
}

static json_t *chunk(stream *st, json_t *choice) {
    const char *obj = st->kind == ST_OAI_CHAT ? "chat.completion.chunk" : "text_completion";
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
        stream_error(st, &e);
        sse_error(st, &e);
        sb_put(&st->wire, "data: [DONE]\n\n", 14);
        st->finished_sent = 1;
        return;
    }
    int chat = st->kind == ST_OAI_CHAT;
    if (chat && !st->role_sent) {
        sse_data(st, chunk(st, chat_choice(json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL)));
        st->role_sent = 1;
    }
    if (!chat && st->req.echo && !st->echo_sent) {
        const char *p = st->prompt_text ? st->prompt_text : "";
        sse_data(st, chunk(st, completion_choice(p, strlen(p), NULL, NULL)));
        st->echo_sent = 1;
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
    st_oai_error e;
    if (stream_error(st, &e)) {
        if (st->finish == ST_FINISH_ERROR) /* the finish reason first, then the error */
            sse_data(st, chunk(st, chat ? chat_choice(json_object(), NULL, "error")
                                        : completion_choice("", 0, NULL, "error")));
        sse_error(st, &e);
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
    int resume = 0;
    pthread_mutex_lock(&st->mu);
    if (st->wire_off >= st->wire.n) {
        st->wire.n = st->wire_off = 0;
        if (!st->finished_sent) {
            format_stream(st);
            resume = drained(st);
        }
    }
    ssize_t ret;
    if (st->wire_off < st->wire.n) {
        size_t n = st->wire.n - st->wire_off;
        if (n > max) n = max;
        memcpy(buf, st->wire.p + st->wire_off, n);
        st->wire_off += n;
        st->last_write = st_now_s();
        ret = (ssize_t)n;
    } else if (st->finished_sent) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        /* nothing yet: park the connection until the scheduler (or the watcher) wakes it */
        if (st->conn && !st->suspended) {
            MHD_suspend_connection(st->conn);
            st->suspended = 1;
        }
        ret = 0;
    }
    uint64_t id = st->sched_id;
    pthread_mutex_unlock(&st->mu);
    if (resume) st_sched_resume(st->s->sched, id);
    return ret;
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
        if (st->kind == ST_OAI_CHAT) {
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
    st_oai_error e;
    if (stream_error(st, &e)) {
        *status = e.status;
        return st_oai_error_json(&e);
    }
    *status = 200;
    const char *fin = finish_text(st->finish);
    json_t *choice;
    if (st->kind == ST_OAI_CHAT) {
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
                             st->kind == ST_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                             (json_int_t)st->created, "model", s->model_id, "system_fingerprint", "strand",
                             "choices", choice, "usage", usage_json(&st->usage));
    char *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

/* ---------------------------------------------------------------------------------------- */
/* HTTP plumbing */

static void add_common_headers(srv *s, struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Server", "strand");
    char ka[32];
    snprintf(ka, sizeof ka, "timeout=%u", s->p.idle_timeout_s > 1 ? s->p.idle_timeout_s - 1 : 1);
    MHD_add_response_header(r, "Keep-Alive", ka);
}

static enum MHD_Result respond(srv *s, struct MHD_Connection *c, int status, const char *type, char *body) {
    if (!body) {
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    add_common_headers(s, r);
    if (status == 503) MHD_add_response_header(r, "Connection", "close");
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

/* ---------------------------------------------------------------------------------------- */
/* preparation (prep threads): parse, render, tokenize, submit */

/* the request failed before it could run: store the answer, wake the connection */
static void prep_fail(stream *st, const st_oai_error *e) {
    pthread_mutex_lock(&st->mu);
    st->prepared = -1;
    st->fail_status = e->status;
    st->fail_body = st_oai_error_json(e);
    wake(st);
    pthread_mutex_unlock(&st->mu);
}

static void prep_one(srv *s, stream *st) {
    st_oai_error e;
    pthread_mutex_lock(&st->mu);
    int gone = st->gone || !st->conn;
    pthread_mutex_unlock(&st->mu);
    if (gone) {
        st_oai_error_set(&e, 499, "invalid_request_error", NULL, "client_closed", "the client went away");
        prep_fail(st, &e);
        return;
    }
    st_oai_request req;
    st_status pst = st_oai_parse(st->kind, st->body ? st->body : "", st->body_len, &s->defaults, &req, &e);
    free(st->body);
    st->body = NULL;
    if (pst != ST_OK) {
        prep_fail(st, &e);
        return;
    }
    st_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL, *prompt_text = NULL;
    size_t text_len = 0;
    int start_r = 0;
    int64_t ctx = st_sched_context(s->sched);
    const char *param = st->kind == ST_OAI_CHAT ? "messages" : "prompt";
    if (st->kind == ST_OAI_CHAT) {
        if (!s->ct) {
            st_oai_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                             "this model has no chat template; use /v1/completions");
            goto fail;
        }
        if (st_chat_template_render(s->ct, req.messages, req.tools, NULL, req.kwargs, &text, &text_len, &err) != ST_OK) {
            st_oai_error_set(&e, 400, "invalid_request_error", "messages", "chat_template_error", "chat template: %s", err.msg);
            goto fail;
        }
        start_r = s->think_split && st_textout_prompt_opens_think(text);
    } else if (req.prompt) {
        text = strdup(req.prompt);
        text_len = strlen(req.prompt);
        if (req.echo) prompt_text = strdup(req.prompt);
    }
    if (text) {
        /* every token covers at most max_token_bytes of text: a longer text cannot fit */
        if (text_len / (s->max_token_bytes ? s->max_token_bytes : 1) >= (size_t)ctx) {
            st_oai_error_set(&e, 400, "invalid_request_error", param, "context_length_exceeded",
                             "the prompt has at least %zu tokens; the context length is %lld",
                             text_len / (s->max_token_bytes ? s->max_token_bytes : 1), (long long)ctx);
            goto fail;
        }
        st_status tst = st_tok_encode_limit(s->tok, text, text_len, 1, (size_t)ctx - 1, &ids, &n, &err);
        if (tst == ST_ERR_LIMIT) {
            st_oai_error_set(&e, 400, "invalid_request_error", param, "context_length_exceeded",
                             "the prompt has at least %lld tokens; the context length is %lld",
                             (long long)ctx, (long long)ctx);
            goto fail;
        }
        if (tst != ST_OK) {
            st_oai_error_set(&e, 400, "invalid_request_error", NULL, NULL, "tokenizing the prompt: %s", err.msg);
            goto fail;
        }
    } else {
        ids = req.prompt_ids; /* owned by the request */
        n = (size_t)req.n_prompt_ids;
        if (req.echo) {
            size_t tl = 0;
            if (st_tok_decode(s->tok, ids, n, 0, &prompt_text, &tl, &err) != ST_OK) prompt_text = NULL;
        }
    }
    free(text);
    text = NULL;
    pthread_mutex_lock(&st->mu);
    st->req = req; /* moved: its stop strings now live in st->req.stop_buf */
    memset(&req, 0, sizeof req);
    for (int i = 0; i < st->req.params.n_stop; i++) st->req.params.stop[i] = st->req.stop_buf[i];
    st->streaming = st->req.stream;
    st->prompt_text = prompt_text;
    prompt_text = NULL;
    st->req.params.split_reasoning = st->kind == ST_OAI_CHAT && s->think_split;
    st->req.params.start_in_reasoning = start_r;
    if (st->gone || !st->conn) {
        pthread_mutex_unlock(&st->mu);
        if (ids != st->req.prompt_ids) free(ids);
        st_oai_error_set(&e, 499, "invalid_request_error", NULL, "client_closed", "the client went away");
        prep_fail(st, &e);
        return;
    }
    atomic_fetch_add(&st->refs, 1); /* the scheduler's, before it can send DONE */
    st_status sst = st_sched_submit(s->sched, ids, (int64_t)n, &st->req.params, on_event, st, &st->sched_id, &err);
    if (ids != st->req.prompt_ids) free(ids);
    if (sst == ST_OK) {
        st->submitted = 1;
        st->prepared = 1;
        wake(st);
        pthread_mutex_unlock(&st->mu);
        return;
    }
    pthread_mutex_unlock(&st->mu);
    atomic_fetch_sub(&st->refs, 1);
    if (sst == ST_ERR_BUSY) st_oai_error_set(&e, 429, "rate_limit_error", NULL, "queue_full", "%s", err.msg);
    else if (sst == ST_ERR_LIMIT)
        st_oai_error_set(&e, 400, "invalid_request_error", st->kind == ST_OAI_CHAT ? "messages" : "prompt",
                         "context_length_exceeded", "%s", err.msg);
    else if (sst == ST_ERR_ARG) st_oai_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
    else st_oai_error_set(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
    prep_fail(st, &e);
    return;
fail:
    if (ids != req.prompt_ids) free(ids);
    free(text);
    free(prompt_text);
    st_oai_request_free(&req);
    prep_fail(st, &e);
}

static void *prep_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->prep_mu);
    for (;;) {
        while (!s->prep_stop && s->prep_n == 0) pthread_cond_wait(&s->prep_cv, &s->prep_mu);
        if (s->prep_stop) break;
        stream *st = s->prep_ring[s->prep_head];
        s->prep_head = (s->prep_head + 1) % s->prep_cap;
        s->prep_n--;
        pthread_mutex_unlock(&s->prep_mu);
        prep_one(s, st);
        atomic_fetch_sub(&s->preparing, 1);
        stream_unref(st); /* the prep job's reference */
        pthread_mutex_lock(&s->prep_mu);
    }
    pthread_mutex_unlock(&s->prep_mu);
    return NULL;
}

/* queue a stream for preparation; 0 when the queue is full */
static int prep_push(srv *s, stream *st) {
    pthread_mutex_lock(&s->prep_mu);
    int ok = s->prep_n < s->prep_cap && !s->prep_stop;
    if (ok) {
        s->prep_ring[(s->prep_head + s->prep_n) % s->prep_cap] = st;
        s->prep_n++;
        atomic_fetch_add(&s->preparing, 1);
        pthread_cond_signal(&s->prep_cv);
    }
    pthread_mutex_unlock(&s->prep_mu);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* routes (MHD threads) */

static enum MHD_Result start_generation(srv *s, struct MHD_Connection *c, httpreq *h, st_oai_kind kind) {
    stream *st = calloc(1, sizeof *st);
    char *c_in = malloc(s->inbox_cap), *r_in = malloc(s->inbox_cap);
    if (!st || !c_in || !r_in) {
        free(st);
        free(c_in);
        free(r_in);
        return error_simple(s, c, 500, "server_error", NULL, "out of memory");
    }
    st->s = s;
    st->kind = kind;
    st->c_in = c_in;
    st->r_in = r_in;
    st->body = h->body.p; /* the prep thread parses it */
    st->body_len = h->body.n;
    memset(&h->body, 0, sizeof h->body);
    st->created = (long long)time(NULL);
    unsigned long long x = atomic_fetch_add(&s->id_counter, 1) * 0x9e3779b97f4a7c15ull ^ s->id_salt;
    snprintf(st->id, sizeof st->id, "%s-%016llx", kind == ST_OAI_CHAT ? "chatcmpl" : "cmpl", x);
    pthread_mutex_init(&st->mu, NULL);
    st->last_write = st_now_s();
    atomic_store(&st->refs, 2); /* this HTTP request and the prep job */
    pthread_mutex_lock(&s->streams_mu);
    st->serial = ++s->next_serial;
    st->next = s->streams;
    if (s->streams) s->streams->prev = st;
    s->streams = st;
    pthread_mutex_unlock(&s->streams_mu);
    /* the stall timeout, not the idle one, while the request runs */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)(s->p.stall_timeout_s + 1));
    pthread_mutex_lock(&st->mu);
    st->conn = c;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    st->fd = ci ? ci->connect_fd : -1;
    if (st->fd >= 0) {
        struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLHUP | EPOLLERR, .data.u64 = st->serial};
        st->watched = epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, st->fd, &ev) == 0;
    }
    h->st = st;
    if (!prep_push(s, st)) {
        st->prepared = -1; /* answered here, at once */
        pthread_mutex_unlock(&st->mu);
        atomic_fetch_sub(&st->refs, 1); /* no prep job */
        return error_simple(s, c, 429, "rate_limit_error", "queue_full",
                            "the server is busy: %d requests are being prepared", s->prep_cap);
    }
    MHD_suspend_connection(c);
    st->suspended = 1;
    pthread_mutex_unlock(&st->mu);
    return MHD_YES;
}

static enum MHD_Result queue_sse(srv *s, struct MHD_Connection *c, stream *st) {
    atomic_fetch_add(&st->refs, 1); /* the reader's */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, sse_reader, st, sse_reader_free);
    if (!r) {
        st_sched_cancel(s->sched, st->sched_id);
        stream_unref(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_common_headers(s, r);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    st_metrics_count_status(&s->metrics, 200);
    return ret;
}

/* a generation request's connection, woken by the prep thread or the scheduler */
static enum MHD_Result continue_generation(srv *s, struct MHD_Connection *c, httpreq *h) {
    stream *st = h->st;
    pthread_mutex_lock(&st->mu);
    if (st->prepared == 0 && !st->aborted) { /* woken before the prep thread finished */
        MHD_suspend_connection(c);
        st->suspended = 1;
        pthread_mutex_unlock(&st->mu);
        return MHD_YES;
    }
    if (st->prepared < 0 || (st->prepared == 0 && st->aborted)) {
        int status = st->fail_status ? st->fail_status : 503;
        char *body = st->fail_body;
        st->fail_body = NULL;
        pthread_mutex_unlock(&st->mu);
        if (!body) return error_simple(s, c, 503, "server_error", "shutting_down", "the server is shutting down");
        return respond(s, c, status, "application/json", body);
    }
    if (st->streaming) {
        int queue = !st->response_queued;
        st->response_queued = 1;
        pthread_mutex_unlock(&st->mu);
        return queue ? queue_sse(s, c, st) : MHD_YES;
    }
    drain_inbox(st);
    int resume = drained(st);
    uint64_t id = st->sched_id;
    if (!st->done && !st->aborted && !st->overflow) {
        MHD_suspend_connection(c);
        st->suspended = 1;
        pthread_mutex_unlock(&st->mu);
        if (resume) st_sched_resume(s->sched, id);
        return MHD_YES;
    }
    int status;
    char *body = final_response(st, &status);
    pthread_mutex_unlock(&st->mu);
    return respond(s, c, status, "application/json", body);
}

static int check_auth(srv *s, struct MHD_Connection *c) {
    if (!s->p.api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7) != 0) return 0; /* the scheme is case-insensitive */
    a += 7;
    while (*a == ' ') a++;
    size_t n = strlen(a), k = strlen(s->p.api_key);
    while (n && a[n - 1] == ' ') n--;
    unsigned char diff = (unsigned char)(n != k);
    for (size_t i = 0; i < n && i < k; i++) diff |= (unsigned char)(a[i] ^ s->p.api_key[i]);
    return diff == 0;
}

static json_t *model_json(srv *s) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", s->model_id, "object", "model", "created",
                          (json_int_t)s->created, "owned_by", "strand");
    if (s->sched) json_object_set_new(o, "max_model_len", json_integer(st_sched_context(s->sched)));
    return o;
}

static enum MHD_Result route(srv *s, struct MHD_Connection *c, httpreq *h, const char *url, const char *method) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        add_common_headers(s, r);
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
        st_server_gauges g = {atomic_load(&s->n_conns), atomic_load(&s->preparing)};
        return respond(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", st_metrics_render(&s->metrics, &ss, &g, health));
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
        if (atomic_load(&s->n_conns) > s->p.max_connections) {
            st_metrics_refused(&s->metrics);
            return error_simple(s, c, 503, "server_error", "too_many_connections",
                                "the server has %d connections open, its limit", s->p.max_connections);
        }
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

/* the client went away: cancel its generation, once (under st->mu) */
static uint64_t note_gone(stream *st) {
    st->gone = 1;
    if (!st->submitted || st->done || st->disconnect_counted) return 0;
    st->disconnect_counted = 1;
    return st->sched_id;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    httpreq *h = *con_cls;
    if (!h) return;
    if (h->st) {
        stream *st = h->st;
        pthread_mutex_lock(&st->mu);
        st->conn = NULL;
        unwatch(st);
        uint64_t id = note_gone(st);
        pthread_mutex_unlock(&st->mu);
        if (id) {
            st_sched_cancel(s->sched, id);
            if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) st_metrics_disconnect(&s->metrics);
        }
        stream_unref(st);
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) /* a kept-alive connection idles again */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->p.idle_timeout_s);
    }
    sb_free(&h->body);
    free(h);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    (void)c, (void)socket_context;
    srv *s = cls;
    atomic_fetch_add(&s->n_conns, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* libmicrohttpd's own messages: debug output, not the server's voice */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (st_log_get_level() < ST_LOG_DEBUG) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    ST_DEBUG("http: %s", msg);
}

/* ---------------------------------------------------------------------------------------- */
/* threads */

static void *scheduler_main(void *arg) {
    srv *s = arg;
    while (!atomic_load(&s->stopping)) {
        st_sched_step(s->sched);
        if (!st_sched_wait(s->sched)) break;
    }
    return NULL;
}

/* a watched socket hung up */
static void on_hangup(srv *s, uint64_t serial) {
    uint64_t id = 0;
    pthread_mutex_lock(&s->streams_mu);
    for (stream *st = s->streams; st; st = st->next) {
        if (st->serial != serial) continue;
        pthread_mutex_lock(&st->mu);
        unwatch(st);
        id = note_gone(st);
        pthread_mutex_unlock(&st->mu);
        break;
    }
    pthread_mutex_unlock(&s->streams_mu);
    if (id) {
        st_sched_cancel(s->sched, id);
        st_metrics_disconnect(&s->metrics);
    }
}

/* hang-ups of suspended connections, and keep-alive comments for idle streams */
static void *watch_main(void *arg) {
    srv *s = arg;
    double last_tick = 0;
    while (!atomic_load(&s->stopping)) {
        struct epoll_event evs[64];
        int n = epoll_wait(s->epoll_fd, evs, 64, 250);
        for (int i = 0; i < n; i++) on_hangup(s, evs[i].data.u64);
        double t = st_now_s();
        if (t - last_tick < 0.25) continue;
        last_tick = t;
        pthread_mutex_lock(&s->streams_mu);
        for (stream *st = s->streams; st; st = st->next) {
            pthread_mutex_lock(&st->mu);
            if (st->streaming && st->response_queued && st->conn && st->suspended && !st->finished_sent &&
                t - st->last_write >= s->p.keepalive_s) {
                st->keepalive_due = 1;
                st->last_write = t;
                wake(st);
            }
            pthread_mutex_unlock(&st->mu);
        }
        pthread_mutex_unlock(&s->streams_mu);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* start-up and shutdown */

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
    if ((st = st_backend_cpu_create(s->m, &s->p.cpu, NULL, &s->backend, err)) != ST_OK) return st;
    if ((st = st_tok_load_dir(s->p.model_dir, &s->tok, err)) != ST_OK) return st;
    s->max_token_bytes = st_textout_max_token_bytes(s->tok);
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
    sp.stall_timeout_s = s->p.stall_timeout_s;
    sp.mem_budget = st_sched_memory_budget(s->m, s->backend, s->p.mem_fraction);
    sp.backend = s->backend;
    if ((st = st_sched_create(s->m, s->tok, &sp, &s->sched, err)) != ST_OK) return st;
    size_t ev = st_sched_max_event_text(s->sched);
    s->inbox_cap = 4 * ev > INBOX_MIN_TEXT ? 4 * ev : INBOX_MIN_TEXT;
    load_defaults(s);
    s->defaults.max_tokens_completion = 16;
    s->defaults.model_name = s->model_id;
    st_model_stats ms;
    st_model_get_stats(s->m, s->p.kv_dtype == ST_KV_BF16 ? 2 : 4, &ms);
    const st_sched_plan *pl = st_sched_get_plan(s->sched);
    char plan[400];
    st_sched_plan_text(pl, plan, sizeof plan);
    fprintf(stderr, "strand: serving '%s': %d sequences, context %lld; weights %.2f GiB; memory plan %s%s\n",
            s->model_id, s->p.max_seqs, (long long)st_sched_context(s->sched),
            (double)ms.weight_bytes / (double)(1u << 30), plan,
            pl->fitted ? " (sized to fit the memory this process can have)" : "");
    return ST_OK;
}

/* the address to listen on: a numeric address, or a name resolved (IPv4 preferred) */
static st_status resolve_host(const char *host, int port, struct sockaddr_storage *out, socklen_t *len,
                              char *shown, size_t shown_cap, st_error *err) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return st_error_set(err, ST_ERR_ARG, "--host '%s': %s", host, rc ? gai_strerror(rc) : "no address");
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    char num[INET6_ADDRSTRLEN] = "?";
    if (pick->ai_family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)out;
        a4->sin_port = htons((uint16_t)port);
        inet_ntop(AF_INET, &a4->sin_addr, num, sizeof num);
        snprintf(shown, shown_cap, "%s", num);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
        a6->sin6_port = htons((uint16_t)port);
        inet_ntop(AF_INET6, &a6->sin6_addr, num, sizeof num);
        snprintf(shown, shown_cap, "[%s]", num);
    }
    freeaddrinfo(res);
    return ST_OK;
}

/* connections the open-file limit allows: each takes a descriptor */
static int connection_limit(int wanted) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
    long room = (long)rl.rlim_cur - EXTRA_CONNECTIONS - 64; /* model files, epoll, threads */
    if (room >= wanted) return wanted;
    if (room < 16) room = 16;
    ST_WARN("--max-connections lowered from %d to %ld: the process may open %llu files (ulimit -n)",
            wanted, room, (unsigned long long)rl.rlim_cur);
    return (int)room;
}

st_status st_server_run(const st_server_params *p, volatile sig_atomic_t *stop, st_error *err) {
    if (p->api_key && !*p->api_key)
        return st_error_set(err, ST_ERR_ARG, "the API key is empty (an unset variable?): give a key, or no --api-key");
    if (p->max_connections < 1 || p->idle_timeout_s < 1 || !(p->stall_timeout_s > 0))
        return st_error_set(err, ST_ERR_ARG, "max_connections and idle_timeout_s must be >= 1, stall_timeout_s > 0");
    srv *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    s->p = *p;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (s->p.http_threads < 1) s->p.http_threads = 1;
    if (s->p.prep_threads < 1) s->p.prep_threads = 1;
    s->p.max_connections = connection_limit(s->p.max_connections);
    s->created = (long long)time(NULL);
    s->id_salt = (uint64_t)s->created * 0x2545f4914f6cdd1dull ^ (uint64_t)getpid();
    s->epoll_fd = -1;
    pthread_mutex_init(&s->streams_mu, NULL);
    pthread_mutex_init(&s->prep_mu, NULL);
    pthread_cond_init(&s->prep_cv, NULL);
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
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    char shown[INET6_ADDRSTRLEN + 2];
    if ((st = resolve_host(s->p.host, s->p.port, &sa, &sa_len, shown, sizeof shown, err)) != ST_OK) goto out;
    s->prep_cap = s->p.max_seqs + s->p.max_queue + 2 * s->p.http_threads;
    s->prep_ring = calloc((size_t)s->prep_cap, sizeof *s->prep_ring);
    s->prep_threads = calloc((size_t)s->p.prep_threads, sizeof *s->prep_threads);
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (!s->prep_ring || !s->prep_threads || s->epoll_fd < 0) {
        st = st_error_set(err, ST_ERR_NOMEM, "cannot set up the server's queues");
        goto out;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (sa.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->p.http_threads,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->p.max_connections + EXTRA_CONNECTIONS),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->p.max_header, MHD_OPTION_CONNECTION_TIMEOUT,
                            s->p.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_END);
    if (!s->d) {
        st = st_error_set(err, ST_ERR_IO, "cannot listen on %s:%d (address in use or not allowed?)", s->p.host, s->p.port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : s->p.port;
    fprintf(stderr, "strand: listening on http://%s:%d (loading %s)\n", shown, port, s->p.model_dir);
    if ((st = load_all(s, err)) != ST_OK) {
        snprintf(s->health_reason, sizeof s->health_reason, "%s", err->msg);
        atomic_store(&s->health, HEALTH_UNHEALTHY);
        goto out;
    }
    if (pthread_create(&s->sched_thread, NULL, scheduler_main, s) != 0) {
        st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
        goto out;
    }
    s->sched_started = 1;
    if (pthread_create(&s->watch_thread, NULL, watch_main, s) != 0) {
        st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
        goto out;
    }
    s->watch_started = 1;
    for (; s->n_prep_started < s->p.prep_threads; s->n_prep_started++)
        if (pthread_create(&s->prep_threads[s->n_prep_started], NULL, prep_main, s) != 0) {
            st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
            goto out;
        }
    atomic_store(&s->health, HEALTH_READY);
    fprintf(stderr, "strand: ready\n");
    while (!*stop) usleep(100 * 1000);
    fprintf(stderr, "strand: shutting down\n");
out:
    snprintf(s->health_reason, sizeof s->health_reason, "%s", st == ST_OK ? "shutting down" : err->msg);
    atomic_store(&s->health, HEALTH_UNHEALTHY);
    atomic_store(&s->stopping, 1);
    if (s->sched) st_sched_shutdown(s->sched);
    if (s->sched_started) pthread_join(s->sched_thread, NULL);
    pthread_mutex_lock(&s->prep_mu);
    s->prep_stop = 1;
    pthread_cond_broadcast(&s->prep_cv);
    pthread_mutex_unlock(&s->prep_mu);
    for (int i = 0; i < s->n_prep_started; i++) pthread_join(s->prep_threads[i], NULL);
    if (s->watch_started) pthread_join(s->watch_thread, NULL);
    /* jobs never prepared: their references go */
    for (; s->prep_n > 0; s->prep_n--, s->prep_head = (s->prep_head + 1) % s->prep_cap) {
        atomic_fetch_sub(&s->preparing, 1);
        stream_unref(s->prep_ring[s->prep_head]);
    }
    /* wake every parked connection so it can end */
    pthread_mutex_lock(&s->streams_mu);
    for (stream *x = s->streams; x; x = x->next) {
        pthread_mutex_lock(&x->mu);
        x->aborted = 1;
        wake(x);
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&s->streams_mu);
    if (s->d) {
        usleep(200 * 1000);
        MHD_stop_daemon(s->d);
    }
    st_sched_destroy(s->sched); /* drops the scheduler's references without events */
    /* every thread is gone: what is left was held by the scheduler */
    while (s->streams) {
        stream *x = s->streams;
        s->streams = x->next;
        stream_free(x);
    }
    if (s->epoll_fd >= 0) close(s->epoll_fd);
    free(s->prep_ring);
    free(s->prep_threads);
    st_chat_template_free(s->ct);
    st_tok_free(s->tok);
    st_backend_destroy(s->backend);
    st_model_free(s->m);
    st_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->streams_mu);
    pthread_mutex_destroy(&s->prep_mu);
    pthread_cond_destroy(&s->prep_cv);
    free(s);
    return st;
}
