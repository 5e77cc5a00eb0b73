/* ==== A stream: its life, the inbox from the scheduler, SSE and JSON formatting (see srv.h) ==== */
#include "server/srv.h"

void srv_stream_free(stream *st) {
    st_oai_request_free(&st->req);
    free(st->body);
    free(st->fail_body);
    st_inbox_free(&st->inbox);
    free(st->rec);
    for (int i = 0; i < st->n_ch; i++) {
        choice_out *c = &st->ch[i];
        sb_free(&c->c_in);
        sb_free(&c->r_in);
        free(c->lp_in);
        sb_free(&c->content_all);
        sb_free(&c->reasoning_all);
        sb_free(&c->pend);
        sb_free(&c->tool_hold);
        json_decref(c->lp_all);
    }
    free(st->ch);
    pthread_mutex_destroy(&st->wake_mu);
    sb_free(&st->wire);
    free(st->prompt_text);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

void srv_stream_unref(stream *st) {
    if (atomic_fetch_sub(&st->refs, 1) != 1) return;
    srv *s = st->s;
    pthread_mutex_lock(&s->streams_mu);
    if (st->prev) st->prev->next = st->next;
    else s->streams = st->next;
    if (st->next) st->next->prev = st->prev;
    pthread_mutex_unlock(&s->streams_mu);
    srv_stream_free(st);
}

/* Wake a parked connection (any thread; under st->mu or not). */
void srv_wake(stream *st) {
    pthread_mutex_lock(&st->wake_mu);
    atomic_store(&st->want_wake, 0);
    if (st->conn && atomic_load(&st->suspended)) {
        atomic_store(&st->pulled_us, (long long)(st_now_s() * 1e6)); /* the stall clock starts */
        atomic_store(&st->suspended, 0);
        MHD_resume_connection(st->conn);
    }
    pthread_mutex_unlock(&st->wake_mu);
}

/* Suspend the connection until wake (under st->mu: what it waits for is set under st->mu). */
void srv_suspend(stream *st) {
    pthread_mutex_lock(&st->wake_mu);
    if (st->conn && !atomic_load(&st->suspended)) {
        MHD_suspend_connection(st->conn);
        atomic_store(&st->suspended, 1);
    }
    pthread_mutex_unlock(&st->wake_mu);
}

/* Park the connection until the scheduler delivers (under st->mu): unless it already has. A
 * streaming consumer waits for any record, a non-streaming one for the end or a pause. The
 * consumer announces itself (want_wake) before it looks, the producer publishes before it
 * looks at want_wake (both sequentially consistent): one of them sees the other. Returns 1
 * when parked, 0 when there is something to take (or nothing to srv_park). */
int srv_park(stream *st) {
    pthread_mutex_lock(&st->wake_mu);
    atomic_store(&st->want_wake, 1);
    int ready = atomic_load(&st->ended) || atomic_load(&st->paused) || atomic_load(&st->overflow) ||
                (st->streaming && st_inbox_next_len(&st->inbox) >= 0);
    if (ready || !st->conn) {
        atomic_store(&st->want_wake, 0);
        pthread_mutex_unlock(&st->wake_mu);
        return 0;
    }
    if (!atomic_load(&st->suspended)) {
        MHD_suspend_connection(st->conn);
        atomic_store(&st->suspended, 1);
    }
    pthread_mutex_unlock(&st->wake_mu);
    return 1;
}

/* The producer's side of park: wake a consumer that announced itself. */
static void notify(stream *st) {
    if (atomic_load(&st->want_wake)) srv_wake(st);
}

/* stop watching the connection's socket (under st->mu) */
void srv_unwatch(stream *st) {
    if (!st->watched) return;
    epoll_ctl(st->s->epoll_fd, EPOLL_CTL_DEL, st->fd, NULL);
    st->watched = 0;
}


/* ---------------------------------------------------------------------------------------- */
/* the scheduler side: a record into the inbox, a wake when the consumer waits for one (no
 * lock, no allocation) */


int srv_on_event(void *user, const st_event *ev) {
    stream *st = user;
    srv *s = st->s;
    const double t = st_now_s();
    const size_t max_text = st_sched_max_event_text(s->sched);
    ev_head h;
    memset(&h, 0, sizeof h);
    h.kind = (uint32_t)ev->kind;
    h.index = (uint32_t)ev->index;
    h.last = (uint32_t)ev->last;
    h.content_len = (uint32_t)ev->content_len;
    h.reasoning_len = (uint32_t)ev->reasoning_len;
    lp_rec lr;
    double itl = -1;
    if (ev->kind == ST_EV_TOKEN) {
        if (ev->logprobs) {
            h.has_lp = 1;
            lr.token = ev->token;
            lr.logprob = ev->logprobs->logprob;
            lr.n_top = ev->logprobs->n_top;
            memcpy(lr.top, ev->logprobs->top_tokens, sizeof lr.top);
            memcpy(lr.top_lp, ev->logprobs->top_logprobs, sizeof lr.top_lp);
        }
        if (st->last_token_t > 0) itl = t - st->last_token_t;
        st->last_token_t = t;
    } else {
        h.finish = (int32_t)ev->finish;
        h.usage = ev->usage;
        h.lp_sum = ev->logprob_sum;
        h.error_len = ev->error ? (uint32_t)strnlen(ev->error, ERROR_MAX - 1) : 0;
    }
    const void *parts[5] = {&h, &lr, ev->content, ev->reasoning, ev->error};
    size_t lens[5] = {sizeof h, h.has_lp ? sizeof lr : 0, ev->content_len, ev->reasoning_len, h.error_len};
    /* A token's record leaves room for the DONE records of every choice (slack: n records of
     * the largest size R). The sequence pauses once the room left is under 2 x slack: the
     * other choices of the same step (at most n - 1 records) then still leave the slack. */
    (void)max_text;
    const size_t len = lens[0] + lens[1] + lens[2] + lens[3] + lens[4];
    const size_t reserve = ev->kind == ST_EV_TOKEN ? st->slack : 0;
    int put = st_inbox_room(&st->inbox) >= len + reserve && st_inbox_put(&st->inbox, parts, lens, 5);
    int answer = ST_EV_CONTINUE, cancel = 0;
    const int final = ev->kind == ST_EV_DONE && ev->last;
    if (!put && !atomic_exchange(&st->overflow, 1)) cancel = ev->kind == ST_EV_TOKEN;
    if (final) atomic_store(&st->ended, 1);
    if (ev->kind == ST_EV_TOKEN && put && st_inbox_room(&st->inbox) < 2 * st->slack && !atomic_exchange(&st->paused, 1))
        answer = ST_EV_PAUSE;
    if (st->streaming || ev->kind == ST_EV_DONE || answer == ST_EV_PAUSE || !put) notify(st);
    if (itl >= 0) st_metrics_observe(&s->metrics, &s->metrics.itl, itl);
    if (cancel) {
        ST_WARN("stream %s: inbox overflow (a bug); cancelled", st->id);
        st_sched_cancel(s->sched, ev->id);
    }
    if (ev->kind == ST_EV_DONE) {
        st_event one = *ev; /* the prompt counted once per request */
        if (ev->index > 0) one.usage.prompt_tokens = 0;
        st_metrics_finished(&s->metrics, &one);
    }
    if (final) srv_stream_unref(st); /* the scheduler's reference */
    return answer;
}

/* Take what the scheduler delivered into the consumer's buffers (under st->mu). */
static void pull(stream *st) {
    for (;;) {
        int64_t len = st_inbox_take(&st->inbox, st->rec, st->rec_cap);
        if (len < 0) break;
        ev_head h;
        memcpy(&h, st->rec, sizeof h);
        const uint8_t *p = st->rec + sizeof h;
        ST_ASSERT(h.index < (uint32_t)st->n_ch);
        choice_out *c = &st->ch[h.index];
        if (h.has_lp) {
            if (c->n_lp_in == c->lp_cap) {
                int cap = c->lp_cap ? 2 * c->lp_cap : INBOX_LP;
                lp_rec *n = realloc(c->lp_in, (size_t)cap * sizeof *n);
                if (n) c->lp_in = n, c->lp_cap = cap;
            }
            if (c->n_lp_in < c->lp_cap) memcpy(&c->lp_in[c->n_lp_in++], p, sizeof(lp_rec));
            p += sizeof(lp_rec);
        }
        sb_put(&c->c_in, (const char *)p, h.content_len);
        p += h.content_len;
        sb_put(&c->r_in, (const char *)p, h.reasoning_len);
        p += h.reasoning_len;
        if (h.kind == ST_EV_DONE) {
            const st_finish_reason f = (st_finish_reason)h.finish;
            c->done = 1;
            c->finish = f;
            c->usage = h.usage;
            c->lp_sum = h.lp_sum;
            /* the stream's: the first error or cancel of a choice wins, else the last finish */
            int bad = st->finish == ST_FINISH_ERROR || st->finish == ST_FINISH_CANCELLED;
            if (!bad) {
                st->finish = f;
                if (h.error_len) snprintf(st->error, sizeof st->error, "%.*s", (int)h.error_len, (const char *)p);
            }
            st->usage.prompt_tokens = h.usage.prompt_tokens; /* every choice reports the request's prompt */
            st->usage.cached_tokens = h.usage.cached_tokens;
            st->usage.completion_tokens += h.usage.completion_tokens;
            st->usage.reasoning_tokens += h.usage.reasoning_tokens;
            if (h.last) st->done = 1;
        }
    }
}

/* After the taken events were consumed (under st->mu): 1 when the sequence waits for that,
 * to be resumed with st_sched_resume once the mutex is released. */
int srv_drained(stream *st) {
    if (!atomic_exchange(&st->paused, 0)) return 0;
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

static json_t *chat_choice(int index, json_t *delta, json_t *logprobs, const char *finish) {
    return json_pack("{s:i,s:o,s:o,s:o}", "index", index, "delta", delta, "logprobs", logprobs ? logprobs : json_null(),
                     "finish_reason", finish ? json_string(finish) : json_null());
}

static json_t *completion_choice(int index, const char *text, size_t n, json_t *logprobs, const char *finish) {
    return json_pack("{s:i,s:s%,s:o,s:o}", "index", index, "text", text, n, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
}

/* content for the chat stream of choice i, through tool-call detection when tools were given */
static void stream_content(stream *st, int i, const char *text, size_t n, json_t **lp) {
    choice_out *c = &st->ch[i];
    sbuf out = {0};
    if (!st->req.tools) {
        sb_put(&out, text, n);
    } else if (c->in_tool) {
        sb_put(&c->tool_hold, text, n);
    } else {
        sb_put(&c->pend, text, n);
        const char *open = ST_TOOLCALL_OPEN;
        size_t ol = strlen(open);
        char *hit = c->pend.n >= ol ? memmem(c->pend.p, c->pend.n, open, ol) : NULL;
        if (hit) {
            sb_put(&out, c->pend.p, (size_t)(hit - c->pend.p));
            sb_put(&c->tool_hold, hit, c->pend.n - (size_t)(hit - c->pend.p));
            c->pend.n = 0;
            c->in_tool = 1;
        } else {
            size_t keep = 0;
            for (size_t k = 1; k < ol && k <= c->pend.n; k++)
                if (!memcmp(c->pend.p + c->pend.n - k, open, k)) keep = k;
            sb_put(&out, c->pend.p, c->pend.n - keep);
            memmove(c->pend.p, c->pend.p + c->pend.n - keep, keep);
            c->pend.n = keep;
        }
    }
    if (out.n || (lp && *lp)) {
        json_t *delta = json_object();
        if (out.n) json_object_set_new(delta, "content", json_stringn(out.p, out.n));
        sse_data(st, chunk(st, chat_choice(i, delta, lp ? *lp : NULL, NULL)));
        if (lp) *lp = NULL;
    }
    sb_free(&out);
}

/* the chunks that end choice i of a stream that ended well */
static void finish_choice(stream *st, int i) {
    srv *s = st->s;
    choice_out *c = &st->ch[i];
    const char *fin = finish_text(c->finish);
    if (st->kind == ST_OAI_CHAT) {
        if (c->pend.n) { /* a held-back partial "<tool_call" that never completed */
            json_t *delta = json_pack("{s:s%}", "content", c->pend.p, c->pend.n);
            sse_data(st, chunk(st, chat_choice(i, delta, NULL, NULL)));
            c->pend.n = 0;
        }
        if (c->in_tool) {
            st_tool_calls tc;
            if (st_toolcall_parse(c->tool_hold.p, c->tool_hold.n, st->req.tools, &tc)) {
                json_t *delta = json_pack("{s:o}", "tool_calls", tool_calls_json(s, &tc, 1));
                sse_data(st, chunk(st, chat_choice(i, delta, NULL, NULL)));
                if (c->finish == ST_FINISH_STOP) fin = "tool_calls"; /* a call cut by max_tokens stays "length" */
                st_tool_calls_free(&tc);
            } else {
                json_t *delta = json_pack("{s:s%}", "content", c->tool_hold.p, c->tool_hold.n);
                sse_data(st, chunk(st, chat_choice(i, delta, NULL, NULL)));
            }
        }
        sse_data(st, chunk(st, chat_choice(i, json_object(), NULL, fin)));
    } else {
        sse_data(st, chunk(st, completion_choice(i, "", 0, NULL, fin)));
    }
    c->finish_sent = 1;
}

/* what is new for choice i, as SSE chunks */
static void format_choice(stream *st, int i) {
    srv *s = st->s;
    choice_out *c = &st->ch[i];
    const int chat = st->kind == ST_OAI_CHAT;
    if (chat && !c->role_sent) {
        sse_data(st, chunk(st, chat_choice(i, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL)));
        c->role_sent = 1;
    }
    if (!chat && st->req.echo && !c->echo_sent) {
        const char *p = st->prompt_text ? st->prompt_text : "";
        sse_data(st, chunk(st, completion_choice(i, p, strlen(p), NULL, NULL)));
        c->echo_sent = 1;
    }
    json_t *lp = NULL;
    if (c->n_lp_in) {
        if (chat) {
            json_t *arr = json_array();
            for (int k = 0; k < c->n_lp_in; k++) json_array_append_new(arr, chat_lp_entry(s->tok, &c->lp_in[k]));
            lp = json_pack("{s:o}", "content", arr);
        } else {
            lp = completion_lp(s->tok, c->lp_in, c->n_lp_in, &c->text_offset);
        }
        c->n_lp_in = 0;
    }
    if (c->r_in.n) {
        json_t *delta = json_pack("{s:s%}", "reasoning_content", c->r_in.p, c->r_in.n);
        json_t *use_lp = c->c_in.n ? NULL : lp;
        sse_data(st, chunk(st, chat_choice(i, delta, use_lp, NULL)));
        if (use_lp) lp = NULL;
        c->r_in.n = 0;
    }
    if (chat) {
        if (c->c_in.n || lp) stream_content(st, i, c->c_in.n ? c->c_in.p : "", c->c_in.n, &lp);
    } else if (c->c_in.n || lp) {
        sse_data(st, chunk(st, completion_choice(i, c->c_in.n ? c->c_in.p : "", c->c_in.n, lp, NULL)));
        lp = NULL;
    }
    c->c_in.n = 0;
    json_decref(lp);
    /* a choice that ended well ends in the stream at once (one with an error waits for all) */
    if (c->done && !c->finish_sent && c->finish != ST_FINISH_ERROR && c->finish != ST_FINISH_CANCELLED &&
        !atomic_load(&st->overflow))
        finish_choice(st, i);
}

/* Turn everything new in the inbox into SSE text in st->wire. */
static void format_stream(stream *st) {
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
    for (int i = 0; i < st->n_ch; i++) format_choice(st, i);
    if ((!st->done && !atomic_load(&st->overflow)) || st->finished_sent) return;
    /* the end */
    st_oai_error e;
    if (stream_error(st, &e)) {
        if (st->finish == ST_FINISH_ERROR) /* the finish reason first, then the error */
            for (int i = 0; i < st->n_ch; i++)
                if (!st->ch[i].finish_sent)
                    sse_data(st, chunk(st, st->kind == ST_OAI_CHAT ? chat_choice(i, json_object(), NULL, "error")
                                                                    : completion_choice(i, "", 0, NULL, "error")));
        sse_error(st, &e);
    } else {
        for (int i = 0; i < st->n_ch; i++)
            if (!st->ch[i].finish_sent) finish_choice(st, i);
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

ssize_t srv_sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    int resume = 0;
    ssize_t ret;
    atomic_store(&st->pulled_us, (long long)(st_now_s() * 1e6));
    pthread_mutex_lock(&st->mu);
    for (;;) {
        if (st->wire_off >= st->wire.n) {
            st->wire.n = st->wire_off = 0;
            if (!st->finished_sent) {
                pull(st);
                format_stream(st);
                resume |= srv_drained(st);
            }
        }
        if (st->wire_off < st->wire.n) {
            size_t n = st->wire.n - st->wire_off;
            if (n > max) n = max;
            memcpy(buf, st->wire.p + st->wire_off, n);
            st->wire_off += n;
            st->last_write = st_now_s();
            ret = (ssize_t)n;
            break;
        }
        if (st->finished_sent) {
            ret = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        /* nothing yet: park until the scheduler (or the watcher) wakes the connection */
        if (srv_park(st) || !st->conn) {
            ret = 0;
            break;
        }
    }
    uint64_t id = st->sched_id;
    pthread_mutex_unlock(&st->mu);
    if (resume) st_sched_resume(st->s->sched, id);
    return ret;
}

void srv_sse_reader_free(void *cls) { srv_stream_unref(cls); }

/* ---- non-streaming ---- */

/* move the inbox into the accumulators (under st->mu) */
void srv_drain_inbox(stream *st) {
    pull(st);
    for (int i = 0; i < st->n_ch; i++) {
        choice_out *c = &st->ch[i];
        sb_put(&c->content_all, c->c_in.n ? c->c_in.p : "", c->c_in.n);
        sb_put(&c->reasoning_all, c->r_in.n ? c->r_in.p : "", c->r_in.n);
        c->c_in.n = c->r_in.n = 0;
        if (c->n_lp_in) {
            if (!c->lp_all) c->lp_all = json_array();
            if (st->kind == ST_OAI_CHAT) {
                for (int k = 0; k < c->n_lp_in; k++) json_array_append_new(c->lp_all, chat_lp_entry(st->s->tok, &c->lp_in[k]));
            } else {
                json_array_append_new(c->lp_all, completion_lp(st->s->tok, c->lp_in, c->n_lp_in, &c->text_offset));
            }
            c->n_lp_in = 0;
        }
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

/* the response's choice `index`: the request's choice i */
static json_t *final_choice(stream *st, int i, int index) {
    srv *s = st->s;
    choice_out *c = &st->ch[i];
    const char *fin = finish_text(c->finish);
    if (st->kind == ST_OAI_CHAT) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        st_tool_calls tc;
        int calls = st->req.tools && st_toolcall_parse(c->content_all.p ? c->content_all.p : "", c->content_all.n, st->req.tools, &tc);
        if (calls) {
            json_object_set_new(msg, "content", tc.content ? json_string(tc.content) : json_null());
            json_object_set_new(msg, "tool_calls", tool_calls_json(s, &tc, 0));
            if (c->finish == ST_FINISH_STOP) fin = "tool_calls"; /* a call cut by max_tokens stays "length" */
            st_tool_calls_free(&tc);
        } else {
            json_object_set_new(msg, "content", json_stringn(c->content_all.p ? c->content_all.p : "", c->content_all.n));
        }
        if (c->reasoning_all.n)
            json_object_set_new(msg, "reasoning_content", json_stringn(c->reasoning_all.p, c->reasoning_all.n));
        json_t *lp = st->req.logprobs ? json_pack("{s:O}", "content", c->lp_all ? c->lp_all : json_array()) : json_null();
        if (st->req.logprobs && !c->lp_all) json_decref(json_object_get(lp, "content"));
        return json_pack("{s:i,s:o,s:o,s:s}", "index", index, "message", msg, "logprobs", lp, "finish_reason", fin);
    }
    sbuf text = {0};
    if (st->req.echo && st->prompt_text) sb_put(&text, st->prompt_text, strlen(st->prompt_text));
    sb_put(&text, c->content_all.p ? c->content_all.p : "", c->content_all.n);
    json_t *lp = st->req.logprobs ? merge_completion_lp(c->lp_all ? c->lp_all : json_array()) : json_null();
    json_t *choice = json_pack("{s:i,s:s%,s:o,s:s}", "index", index, "text", text.p ? text.p : "", text.n, "logprobs", lp,
                               "finish_reason", fin);
    sb_free(&text);
    return choice;
}

char *srv_final_response(stream *st, int *status) {
    srv *s = st->s;
    st_oai_error e;
    if (stream_error(st, &e)) {
        *status = e.status;
        return st_oai_error_json(&e);
    }
    *status = 200;
    /* best_of: the n choices whose tokens are likeliest (sum of log-probabilities), in that order */
    int order[ST_MAX_CHOICES];
    for (int i = 0; i < st->n_ch; i++) order[i] = i;
    const int n_out = st->req.n_return > 0 && st->req.n_return < st->n_ch ? st->req.n_return : st->n_ch;
    if (n_out < st->n_ch)
        for (int i = 1; i < st->n_ch; i++) /* insertion sort, stable: ties keep the earlier choice */
            for (int j = i; j > 0 && st->ch[order[j]].lp_sum > st->ch[order[j - 1]].lp_sum; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
    json_t *choices = json_array();
    for (int i = 0; i < n_out; i++) json_array_append_new(choices, final_choice(st, order[i], i));
    json_t *root = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o}", "id", st->id, "object",
                             st->kind == ST_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                             (json_int_t)st->created, "model", s->model_id, "system_fingerprint", "strand",
                             "choices", choices, "usage", usage_json(&st->usage));
    char *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}
