/* ==== The OpenAI-compatible HTTP server ====
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions (streaming with SSE or not),
 * GET /v1/models[/ID], GET /health, GET /metrics, OPTIONS (CORS preflight).
 *
 * Threads: libmicrohttpd's pool parses requests, renders the chat template, tokenizes and
 * formats responses; one scheduler thread runs the model (see engine/scheduler.h); a ticker
 * thread sends SSE keep-alive comments. The scheduler thread only copies each token's text
 * and log-probabilities into the request's fixed-size inbox and wakes its connection; it
 * never allocates. A client that goes away cancels its generation.
 */
#ifndef ST_SERVER_SERVER_H
#define ST_SERVER_SERVER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "engine/cache.h"

typedef struct st_server_params {
    const char *model_dir;
    const char *model_name;  /* served id; NULL = the directory's last component */
    const char *host;        /* default 127.0.0.1 */
    int port;                /* 0 = any free port (printed) */
    int max_seqs;            /* sequences generating at once */
    int64_t ctx;             /* context length; 0 = the model's */
    int step_tokens;         /* tokens per scheduler step */
    int max_queue;           /* waiting requests before 429 */
    st_kv_dtype kv_dtype;
    int64_t kv_blocks;       /* 0 = max_seqs full contexts */
    const char *api_key;     /* NULL = no authentication */
    size_t max_body;         /* request body limit in bytes */
    size_t max_header;       /* per-connection memory for headers */
    int http_threads;
    double keepalive_s;      /* SSE comment after this much silence */
} st_server_params;

st_server_params st_server_default_params(void);

/* Load the model, serve until *stop becomes non-zero (e.g. from a signal handler), shut down.
 * Prints "listening on http://HOST:PORT" to stderr once the socket is bound. */
st_status st_server_run(const st_server_params *p, volatile sig_atomic_t *stop, st_error *err);

#endif /* ST_SERVER_SERVER_H */
