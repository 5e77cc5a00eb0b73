/* ==== The HTTP server's private parts (server.c, http.c, stream.c) ====
 *
 * A generation request's life:
 *   MHD thread (route):   the body is complete; a stream is made, the connection suspended,
 *                         registered with the watcher, and the stream queued for preparation
 *   prep thread:          parse, render, tokenize (bounded by the context), submit; on any
 *                         failure the error response is stored in the stream; resume
 *   MHD thread (resumed): queue the stored error, or the SSE response, or (non-streaming)
 *                         drain the inbox and park again until the end
 *   scheduler thread:     srv_on_event appends the event to the stream's inbox (a
 *                         single-producer single-consumer ring: no lock, no allocation),
 *                         wakes a parked connection, and pauses the sequence while the ring
 *                         is nearly full. It never waits on formatting: the HTTP threads
 *                         format under the stream's mutex, which the scheduler never takes.
 *   watcher thread:       a client that hangs up while suspended is cancelled at once
 * A stream is reference-counted: the HTTP request (until on_completed), the prep job (until
 * prepared), the scheduler (until its DONE event) and the SSE reader (until libmicrohttpd
 * frees the response) each hold one.
 *
 * Locks: srv.streams_mu, then a stream's mu, then its wake_mu (innermost, held only to
 * suspend or resume the connection).
 */
#ifndef ST_SERVER_SRV_H
#define ST_SERVER_SRV_H

#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#include "server/inbox.h"
#include "server/metrics.h"
#include "server/oai.h"
#include "vision/prompt.h"
#include "server/toolcall.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

enum { HEALTH_LOADING = 0, HEALTH_READY = 1, HEALTH_UNHEALTHY = 2 };

#define INBOX_MIN_TEXT 16384 /* bytes of undelivered content (and as much reasoning), at least */
#define INBOX_LP 64          /* undelivered log-probability records */
#define ERROR_MAX 512        /* bytes of a DONE event's error message kept */
#define EXTRA_CONNECTIONS 64 /* accepted past max_connections, to answer them 503 */
/* libmicrohttpd 0.9.75 parses a request's headers in place in its connection's memory pool and
 * builds the reply's header block in what is left: a request whose headers fit but leave too
 * little room was closed unanswered. So the pool is max_header + HEADER_RESERVE, and a request
 * whose header block (srv_header_bytes: an estimate from above of its share of the pool) exceeds
 * max_header is answered 431 before anything else (srv_refuse_headers): the reserve holds every
 * other reply's header block; blocks past the pool get libmicrohttpd's own 431. */
#define HEADER_RESERVE ((size_t)16 << 10)
/* A refused request's socket is kept open a while after its answer, its unread bytes read and
 * dropped (a lingering close): a socket closed with bytes unread resets the connection, and the
 * client can lose the answer (a 431 before a request body). LINGER_SOCKETS at once (more close
 * at once), each for at most LINGER_S seconds and LINGER_BYTES bytes; the watcher's epoll
 * data of one is LINGER_TAG | its slot. */
#define LINGER_SOCKETS 32
#define LINGER_S 2.0
#define LINGER_BYTES ((size_t)16 << 20)
#define LINGER_TAG (1ull << 63)

/* ---------------------------------------------------------------------------------------- */
/* growable byte buffers (HTTP and prep threads only) */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

/* room for n more bytes and a NUL */
static inline int sb_reserve(sbuf *b, size_t n) {
    if (n > SIZE_MAX / 4 - b->n) return -1; /* no size near the address space */
    if (b->n + n + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 1024;
    while (nc < b->n + n + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return -1;
    b->p = np;
    b->cap = nc;
    return 0;
}

static inline int sb_put(sbuf *b, const char *s, size_t n) {
    if (sb_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static inline void sb_free(sbuf *b) {
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

/* one choice's output: taken from the inbox, formatted (HTTP threads, under the stream's mu) */
typedef struct choice_out {
    sbuf c_in, r_in;             /* content, reasoning not yet formatted */
    lp_rec *lp_in;               /* [n_lp_in] of lp_cap */
    int n_lp_in, lp_cap;
    int done;                    /* its DONE arrived */
    double lp_sum;               /* its tokens' log-probabilities (best_of ranks by it) */
    st_finish_reason finish;
    st_usage usage;
    int role_sent, echo_sent, finish_sent;
    sbuf content_all, reasoning_all; /* non-streaming accumulation */
    json_t *lp_all;              /* non-streaming logprob entries */
    sbuf pend;                   /* streamed content held back while it could open a tool call */
    sbuf tool_hold;              /* streamed text from <tool_call> on */
    int in_tool;
    int64_t text_offset;         /* completions logprobs: characters of text so far */
} choice_out;

/* images a chat request may hold */
#define SRV_MAX_IMAGES 16

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
    int prepared;                /* 0 waiting, 1 submitted, -1 failed (fail_* hold the answer) */
    int fail_status;
    char *fail_body;
    int response_queued;         /* streaming: the SSE response is queued */
    int submitted;
    uint64_t sched_id;
    /* scheduler -> HTTP thread, without a lock (the scheduler never waits on formatting) */
    st_inbox inbox;              /* the events, as records (ev_head, then its bytes) */
    atomic_int paused;           /* on_event answered ST_EV_PAUSE; no resume sent yet */
    atomic_int ended;            /* the DONE record is in the inbox */
    atomic_int overflow;         /* an event did not fit (cannot happen while pausing works) */
    atomic_int want_wake;        /* the consumer is about to park or parked: wake it */
    double last_token_t;         /* the scheduler thread's own */
    /* the connection's parking (wake_mu, innermost lock; never held while formatting) */
    pthread_mutex_t wake_mu;
    atomic_int suspended;
    /* when libmicrohttpd last asked the stream for bytes, or the connection was woken with
     * something to send (st_now_s() in microseconds; any thread). Awake and not asked for
     * stall_timeout_s: the client is not reading (the watcher fails the request). */
    atomic_llong pulled_us;
    int stall_failed;            /* the watcher's (under mu) */
    size_t slack;                /* the inbox's reserve for the DONE records of every choice:
                                    n_ch records of the largest size (set before submission) */
    /* taken from the inbox, not yet formatted (HTTP threads, under mu) */
    uint8_t *rec;                /* [rec_cap] one record */
    size_t rec_cap;
    choice_out *ch;              /* [n_ch] the request's choices (set before submission) */
    int n_ch;
    int done;                    /* every choice ended */
    st_finish_reason finish;     /* the stream's: an error or cancel of any choice, else the last's */
    st_usage usage;              /* summed over the choices (prompt and cached once) */
    char error[ERROR_MAX];
    int keepalive_due;
    int aborted;                 /* server shutting down */
    double last_write;
    /* formatting state (HTTP threads, under mu) */
    sbuf wire;                   /* formatted bytes not yet handed to libmicrohttpd */
    size_t wire_off;
    int finished_sent;
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
    struct st_vision_tower *vt; /* owned: the model's vision tower, when it has one (images) */
    st_vision_pp pp;            /* its image processor's parameters */
    char no_images[160];        /* why images are refused, when vt is NULL */
    char *media_dir;            /* owned: the real path of --allowed-local-media-path, or NULL */
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
    atomic_int fatal;            /* the scheduler cannot run (st_sched_broken): the server exits */
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
    /* lingering sockets (linger_mu): a duplicate of each, -1 where a slot is free */
    pthread_mutex_t linger_mu;
    int linger_fd[LINGER_SOCKETS];
    double linger_until[LINGER_SOCKETS];
    size_t linger_left[LINGER_SOCKETS];
};

/* per HTTP request state */
typedef struct httpreq {
    sbuf body;
    int too_large;
    stream *st;
} httpreq;


/* an event as an inbox record: this header, then the lp_rec (has_lp), the content, the
 * reasoning and (DONE) the error message */
typedef struct ev_head {
    uint32_t kind;           /* st_event_kind */
    uint32_t index;          /* the choice */
    uint32_t last;           /* DONE: the request's last */
    uint32_t has_lp;
    uint32_t content_len, reasoning_len, error_len;
    int32_t finish;          /* DONE */
    st_usage usage;          /* DONE */
    double lp_sum;           /* DONE: the choice's tokens' log-probabilities (best_of) */
} ev_head;

/* the largest record of an event with up to max_text bytes of content and of reasoning */
static inline size_t srv_record_max(size_t max_text) { return sizeof(ev_head) + sizeof(lp_rec) + 2 * max_text + ERROR_MAX; }

/* ---- stream.c: a stream's life, its inbox, SSE and JSON formatting ---- */
void srv_stream_free(stream *st);
void srv_stream_unref(stream *st);            /* the last reference frees it */
void srv_wake(stream *st);                    /* any thread */
void srv_suspend(stream *st);                 /* under st->mu */
int srv_park(stream *st);                     /* under st->mu; 1 when parked */
void srv_unwatch(stream *st);                 /* under st->mu */
int srv_on_event(void *user, const st_event *ev); /* the scheduler's callback */
void srv_drain_inbox(stream *st);             /* non-streaming: into the accumulators (st->mu) */
int srv_drained(stream *st);                  /* st->mu; 1: resume the sequence after unlocking */
char *srv_final_response(stream *st, int *status); /* st->mu */
ssize_t srv_sse_reader(void *cls, uint64_t pos, char *buf, size_t max);
void srv_sse_reader_free(void *cls);

/* ---- http.c: plumbing, routes, request preparation ---- */
void srv_linger_init(srv *s);                    /* every slot free */
void srv_linger(srv *s, int fd);                 /* HTTP thread: fd's socket lingers (a duplicate) */
void srv_linger_read(srv *s, uint64_t slot);     /* the watcher: its bytes read and dropped */
void srv_linger_sweep(srv *s, double now);       /* the watcher: those past their time close; now < 0: all */
enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls);
void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);
void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
void srv_mhd_log(void *cls, const char *fmt, va_list ap);
void *srv_prep_main(void *arg);
uint64_t srv_note_gone(stream *st);           /* under st->mu */

#endif /* ST_SERVER_SRV_H */
