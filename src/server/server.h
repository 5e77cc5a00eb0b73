/* ==== The OpenAI-compatible HTTP server ====
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (streaming with SSE or not),
 * GET /v1/models[/ID], GET /health, GET /metrics, OPTIONS (CORS preflight).
 *
 * Threads:
 *   - libmicrohttpd's pool (http_threads) reads requests, answers the cheap routes (health,
 *     metrics, models, errors) and formats responses; it never parses a generation request's
 *     body, renders a template or tokenizes, so /health answers while prompts are prepared;
 *   - prep_threads parse generation requests, render the chat template, tokenize (refusing
 *     prompts over the context early) and submit to the scheduler;
 *   - one scheduler thread runs the model (engine/scheduler.h). It only copies each token's
 *     text and log-probabilities into the request's fixed-size inbox and wakes the
 *     connection; it never allocates. A full inbox (a client reading slower than the model
 *     writes) pauses that sequence until the client has read, up to stall_timeout_s;
 *   - a watcher thread notices clients that hang up while their request waits (queued,
 *     prefilling or non-streaming: libmicrohttpd does not watch suspended connections) and
 *     cancels their generation; it also sends SSE keep-alive comments, and fails (an
 *     error finish) a stream with bytes to send that libmicrohttpd has not asked for in
 *     stall_timeout_s: the client stopped reading, whether or not the inbox has filled yet.
 * Connections: at most max_connections (more get 503 and are closed); a connection with no
 * request in progress is closed after idle_timeout_s.
 */
#ifndef ST_SERVER_SERVER_H
#define ST_SERVER_SERVER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/select.h"
#include "core/status.h"
#include "engine/cache.h"

typedef struct st_server_params {
    const char *model_dir;
    const char *model_name;  /* served id; NULL = the directory's last component */
    const char *host;        /* an address or a host name; default 127.0.0.1 */
    int port;                /* 0 = any free port (printed) */
    int max_seqs;            /* sequences generating at once */
    int64_t ctx;             /* context length; 0 = the model's */
    int step_tokens;         /* tokens per scheduler step */
    int max_queue;           /* waiting requests before 429 */
    st_kv_dtype kv_dtype;
    int64_t kv_blocks;       /* 0 = max_seqs full contexts, or what fits (mem_fraction) */
    double mem_fraction;     /* of the memory this process can have, for the plan; 0 = no check */
    const char *api_key;     /* NULL = no authentication; "" is refused */
    size_t max_body;         /* request body limit in bytes */
    size_t max_header;       /* a request's header block, bytes (estimated as libmicrohttpd
                                stores it); larger ones are answered 431 */
    int http_threads;
    int prep_threads;        /* threads that parse, render and tokenize requests */
    int max_connections;     /* open connections; more are answered 503 */
    unsigned idle_timeout_s; /* a connection with no request in progress is closed after this */
    double stall_timeout_s;  /* a stream whose client reads nothing this long is cancelled */
    double keepalive_s;      /* SSE comment after this much silence */
    st_device_params device; /* where the model runs (cpu, cuda or auto) and how */
    int prefix_cache;        /* reuse prompt prefixes (KV blocks and state snapshots); default 1 */
    int snapshots;           /* the snapshot pool; 0 = 4 x max_seqs + 4 */
    int snapshot_every;      /* blocks between a prompt's snapshots; 0 = 32 */
    const char *local_media_dir; /* image_url file:// paths under this directory are read; NULL: never */
} st_server_params;

st_server_params st_server_default_params(void);

/* Load the model, serve until *stop becomes non-zero (e.g. from a signal handler), shut down.
 * Prints "listening on http://HOST:PORT" to stderr once the socket is bound. */
st_status st_server_run(const st_server_params *p, volatile sig_atomic_t *stop, st_error *err);

#endif /* ST_SERVER_SERVER_H */
