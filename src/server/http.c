/* ==== HTTP plumbing, routes and request preparation (see srv.h) ==== */
#include "server/srv.h"

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
    srv_wake(st);
    pthread_mutex_unlock(&st->mu);
}

/* A chat prompt's images: each placeholder the template rendered becomes the image's run of
 * image tokens (st_vision_prompt_expand; *im, for the scheduler, points into *vp). -1 after
 * filling e. */
static int expand_images(srv *s, st_oai_request *req, int32_t **ids, size_t *n, int64_t ctx, st_vision_prompt *vp,
                         st_req_images *im, st_oai_error *e) {
    st_error err = {0};
    if (!s->vt) {
        st_oai_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", s->no_images);
        return -1;
    }
    int32_t *x = NULL;
    int64_t nx = 0;
    st_status st = st_vision_prompt_expand(s->vt, &s->pp, s->m->cfg.image_token_id, *ids, (int64_t)*n,
                                           (const void *const *)req->images, req->image_lens, req->n_images, NULL, ctx,
                                           &x, &nx, vp, &err);
    if (st != ST_OK) {
        if (st == ST_ERR_NOMEM) st_oai_error_set(e, 500, "server_error", NULL, NULL, "%s", err.msg);
        else
            st_oai_error_set(e, 400, "invalid_request_error", "messages",
                             st == ST_ERR_LIMIT ? "context_length_exceeded" : "invalid_image", "%s", err.msg);
        return -1;
    }
    if (*ids != req->prompt_ids) free(*ids);
    *ids = x;
    *n = (size_t)nx;
    *im = (st_req_images){(const int32_t(*)[3])vp->mrope, vp->next, vp->n_rows, vp->rows, vp->embeds, vp->keys};
    req->params.images = im;
    return 0;
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
    st_vision_prompt vp = {0};
    st_req_images im;
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
    if (req.n_images > 0 && expand_images(s, &req, &ids, &n, ctx, &vp, &im, &e) != 0) goto fail;
    /* the choices' buffers, and an inbox of inbox_cap bytes of text with the reserve for
     * every choice's DONE record and the pause threshold on top (stream.c) */
    const int n_ch = req.params.n > 1 ? req.params.n : 1;
    choice_out *chs = calloc((size_t)n_ch, sizeof *chs);
    st_inbox ib;
    const size_t slack = (size_t)n_ch * (st->rec_cap + 8);
    if (!chs || st_inbox_init(&ib, 2 * s->inbox_cap + 4 * slack, NULL) != ST_OK) {
        free(chs);
        st_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory for the request's buffers");
        goto fail;
    }
    pthread_mutex_lock(&st->mu);
    st->ch = chs;
    st->n_ch = n_ch;
    st->inbox = ib;
    st->slack = slack;
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
        st_vision_prompt_free(&vp);
        st_oai_error_set(&e, 499, "invalid_request_error", NULL, "client_closed", "the client went away");
        prep_fail(st, &e);
        return;
    }
    atomic_fetch_add(&st->refs, 1); /* the scheduler's, before it can send DONE */
    st_status sst = st_sched_submit(s->sched, ids, (int64_t)n, &st->req.params, srv_on_event, st, &st->sched_id, &err);
    if (sst == ST_OK) st->req.params.json_schema = NULL; /* the scheduler's now */
    if (ids != st->req.prompt_ids) free(ids);
    st->req.params.images = NULL; /* the scheduler copied them */
    st_vision_prompt_free(&vp);
    if (sst == ST_OK) {
        st->submitted = 1;
        st->prepared = 1;
        srv_wake(st);
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
    else if (sst == ST_ERR_IO) st_oai_error_set(&e, 503, "server_error", NULL, "unhealthy", "%s", err.msg);
    else st_oai_error_set(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
    prep_fail(st, &e);
    return;
fail:
    if (ids != req.prompt_ids) free(ids);
    st_vision_prompt_free(&vp);
    free(text);
    free(prompt_text);
    st_oai_request_free(&req);
    prep_fail(st, &e);
}

void *srv_prep_main(void *arg) {
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
        srv_stream_unref(st); /* the prep job's reference */
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
    const size_t rec_cap = srv_record_max(st_sched_max_event_text(s->sched));
    uint8_t *rec = malloc(rec_cap);
    if (!st || !rec) { /* the inbox and the choices come once the request is parsed */
        free(st);
        free(rec);
        return error_simple(s, c, 500, "server_error", NULL, "out of memory");
    }
    st->s = s;
    st->kind = kind;
    st->rec = rec;
    st->rec_cap = rec_cap;
    pthread_mutex_init(&st->wake_mu, NULL);
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
    /* while the request runs, a backstop beyond the stall timeout, not the idle one: the
     * watcher fails a stalled stream (server.c) well before this closes the connection */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)(s->p.stall_timeout_s + 5));
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
    srv_suspend(st);
    pthread_mutex_unlock(&st->mu);
    return MHD_YES;
}

static enum MHD_Result queue_sse(srv *s, struct MHD_Connection *c, stream *st) {
    atomic_fetch_add(&st->refs, 1); /* the reader's */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, srv_sse_reader, st, srv_sse_reader_free);
    if (!r) {
        st_sched_cancel(s->sched, st->sched_id);
        srv_stream_unref(st);
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
        srv_suspend(st);
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
    int resume = 0, parked = 0;
    for (;;) {
        srv_drain_inbox(st);
        resume |= srv_drained(st);
        if (st->done || st->aborted || atomic_load(&st->overflow)) break;
        if ((parked = srv_park(st)) || !st->conn) break;
    }
    uint64_t id = st->sched_id;
    if (parked || (!st->done && !st->aborted && !atomic_load(&st->overflow))) {
        pthread_mutex_unlock(&st->mu);
        if (resume) st_sched_resume(s->sched, id);
        return MHD_YES;
    }
    int status;
    char *body = srv_final_response(st, &status);
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

/* a header entry's share of libmicrohttpd's pool beyond its bytes: the entry's record (56 bytes on
 * 64-bit, rounded to 16, a red zone in sanitizer builds) and its ": " / "\r\n" */
#define HEADER_ENTRY_COST 100

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                        const char *value, size_t value_size) {
    size_t *n = cls;
    *n += key_size + value_size + HEADER_ENTRY_COST;
    if (kind == MHD_COOKIE_KIND) *n += key_size + value_size + 2; /* cookies are parsed from a copy */
    return MHD_YES;
}

/* an estimate from above of what a request's header block holds of its connection's pool: the
 * request line, every header, cookie and query argument (whose bytes are already in the URL,
 * counted twice) */
static size_t srv_header_bytes(struct MHD_Connection *c, const char *url, const char *method, const char *version) {
    size_t n = strlen(url) + strlen(method) + strlen(version) + 64;
    MHD_get_connection_values_n(c, MHD_HEADER_KIND | MHD_COOKIE_KIND | MHD_GET_ARGUMENT_KIND, add_header_bytes, &n);
    return n;
}

/* lingering sockets (srv.h, LINGER_*): the HTTP threads add them, the watcher reads and closes them */
void srv_linger_init(srv *s) {
    pthread_mutex_init(&s->linger_mu, NULL);
    for (int i = 0; i < LINGER_SOCKETS; i++) s->linger_fd[i] = -1;
}

/* slot i's socket closes (linger_mu held) */
static void linger_close(srv *s, int i) {
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, s->linger_fd[i], NULL);
    close(s->linger_fd[i]);
    s->linger_fd[i] = -1;
}

void srv_linger(srv *s, int fd) {
    pthread_mutex_lock(&s->linger_mu);
    int i = 0;
    while (i < LINGER_SOCKETS && s->linger_fd[i] >= 0) i++;
    const int d = i < LINGER_SOCKETS && s->epoll_fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (d >= 0) {
        /* the answer is out: a FIN after it, and the bytes behind it read until the client closes */
        shutdown(d, SHUT_WR); /* (its reads pass MSG_DONTWAIT: the flags it shares with libmicrohttpd's fd stay) */
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = LINGER_TAG | (uint64_t)i};
        if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, d, &ev) == 0) {
            s->linger_fd[i] = d;
            s->linger_until[i] = st_now_s() + LINGER_S;
            s->linger_left[i] = LINGER_BYTES;
        } else {
            close(d);
        }
    }
    pthread_mutex_unlock(&s->linger_mu);
}

void srv_linger_read(srv *s, uint64_t slot) {
    char buf[16384];
    pthread_mutex_lock(&s->linger_mu);
    const int i = (int)(slot & ~LINGER_TAG);
    if (i >= 0 && i < LINGER_SOCKETS && s->linger_fd[i] >= 0) {
        for (;;) {
            const ssize_t n = recv(s->linger_fd[i], buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break; /* more later */
            if (n <= 0 || (size_t)n >= s->linger_left[i]) { /* the client closed, or it sent enough */
                linger_close(s, i);
                break;
            }
            s->linger_left[i] -= (size_t)n;
        }
    }
    pthread_mutex_unlock(&s->linger_mu);
}

void srv_linger_sweep(srv *s, double now) {
    pthread_mutex_lock(&s->linger_mu);
    for (int i = 0; i < LINGER_SOCKETS; i++)
        if (s->linger_fd[i] >= 0 && (now < 0 || now >= s->linger_until[i])) linger_close(s, i);
    pthread_mutex_unlock(&s->linger_mu);
}

/* 431 for a header block over max_header (srv.h, HEADER_RESERVE), written to the socket
 * directly: libmicrohttpd may have no room left to build a reply; then the connection closes
 * (MHD_NO: libmicrohttpd shuts its writing side down after these bytes) and the socket
 * lingers (srv_linger) */
static enum MHD_Result srv_refuse_headers(srv *s, struct MHD_Connection *c, const char *method, size_t bytes) {
    st_oai_error e;
    st_oai_error_set(&e, 431, "invalid_request_error", NULL, "request_header_fields_too_large",
                     "the request's header block (about %zu bytes) exceeds the server's limit of %zu bytes", bytes,
                     s->p.max_header);
    char *body = st_oai_error_json(&e);
    if (!body) return MHD_NO;
    char msg[1200]; /* the head and the body (its message at most 600 bytes) */
    const int n = snprintf(msg, sizeof msg,
                           "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Type: "
                           "application/json\r\nContent-Length: %zu\r\nServer: strand\r\nAccess-Control-Allow-Origin: "
                           "*\r\n\r\n%s",
                           strlen(body), strcmp(method, "HEAD") ? body : "");
    free(body);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* a fresh request's socket has sent everything before it: these few bytes fit its buffer */
    if (ci && n > 0 && (size_t)n < sizeof msg) {
        if (send(ci->connect_fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
            ST_DEBUG("http: the 431 could not be written: %s", strerror(errno));
        else
            srv_linger(s, ci->connect_fd); /* a body behind the headers must not reset the connection before it is read */
    }
    st_metrics_count_status(&s->metrics, 431);
    return MHD_NO;
}

enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    httpreq *h = *con_cls;
    if (!h) {
        size_t hb = srv_header_bytes(c, url, method, version);
        if (hb > s->p.max_header) return srv_refuse_headers(s, c, method, hb);
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
uint64_t srv_note_gone(stream *st) {
    st->gone = 1;
    if (!st->submitted || atomic_load(&st->ended) || st->disconnect_counted) return 0;
    st->disconnect_counted = 1;
    return st->sched_id;
}

void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    httpreq *h = *con_cls;
    if (!h) return;
    if (h->st) {
        stream *st = h->st;
        pthread_mutex_lock(&st->mu);
        pthread_mutex_lock(&st->wake_mu);
        st->conn = NULL;
        pthread_mutex_unlock(&st->wake_mu);
        srv_unwatch(st);
        uint64_t id = srv_note_gone(st);
        pthread_mutex_unlock(&st->mu);
        if (id) {
            st_sched_cancel(s->sched, id);
            if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) st_metrics_disconnect(&s->metrics);
        }
        srv_stream_unref(st);
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) /* a kept-alive connection idles again */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->p.idle_timeout_s);
    }
    sb_free(&h->body);
    free(h);
    *con_cls = NULL;
}

void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    (void)c, (void)socket_context;
    srv *s = cls;
    atomic_fetch_add(&s->n_conns, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* libmicrohttpd's own messages: debug output, not the server's voice */
void srv_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (st_log_get_level() < ST_LOG_DEBUG) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    ST_DEBUG("http: %s", msg);
}

