/* ==== Server metrics (see metrics.h) ==== */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_init(st_histogram *h, const double *b, int n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->bounds, b, (size_t)n * sizeof *b);
}

void st_metrics_init(st_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    static const double ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
    static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
    static const double e2e[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    hist_init(&m->ttft, ttft, (int)(sizeof ttft / sizeof *ttft));
    hist_init(&m->itl, itl, (int)(sizeof itl / sizeof *itl));
    hist_init(&m->e2e, e2e, (int)(sizeof e2e / sizeof *e2e));
}

void st_metrics_destroy(st_metrics *m) { pthread_mutex_destroy(&m->mu); }

void st_metrics_count_status(st_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_status && m->by_status[i].status != status) i++;
    if (i == m->n_status && m->n_status < (int)(sizeof m->by_status / sizeof m->by_status[0])) {
        m->by_status[i].status = status;
        m->by_status[i].n = 0;
        m->n_status++;
    }
    if (i < m->n_status) m->by_status[i].n++;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(st_histogram *h, double v) {
    int b = 0;
    while (b < h->n && v > h->bounds[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += v;
}

void st_metrics_observe(st_metrics *m, st_histogram *h, double v) {
    pthread_mutex_lock(&m->mu);
    hist_add(h, v);
    pthread_mutex_unlock(&m->mu);
}

void st_metrics_finished(st_metrics *m, const st_event *done) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)done->usage.prompt_tokens;
    m->generation_tokens += (uint64_t)done->usage.completion_tokens;
    if (done->finish >= 0 && done->finish < 5) m->finished[done->finish]++;
    if (done->usage.completion_tokens > 0) {
        hist_add(&m->ttft, done->ttft_s);
        hist_add(&m->e2e, done->total_s);
    }
    pthread_mutex_unlock(&m->mu);
}

void st_metrics_disconnect(st_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->disconnects++;
    pthread_mutex_unlock(&m->mu);
}

void st_metrics_refused(st_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->refused_connections++;
    pthread_mutex_unlock(&m->mu);
}

/* a growable text buffer */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void out(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *np = realloc(b->p, nc);
        if (!np) return;
        b->p = np;
        b->cap = nc;
    }
}

static void hist_out(sbuf *b, const char *name, const char *help, const st_histogram *h) {
    out(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        out(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    out(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
        (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

char *st_metrics_render(st_metrics *m, const st_sched_stats *ss, const st_server_gauges *g, int health) {
    sbuf b = {0};
    pthread_mutex_lock(&m->mu);
    out(&b, "# HELP strand_requests_total HTTP responses by status code.\n# TYPE strand_requests_total counter\n");
    for (int i = 0; i < m->n_status; i++)
        out(&b, "strand_requests_total{status=\"%d\"} %llu\n", m->by_status[i].status,
            (unsigned long long)m->by_status[i].n);
    out(&b, "# HELP strand_prompt_tokens_total Prompt tokens of finished generations.\n"
            "# TYPE strand_prompt_tokens_total counter\nstrand_prompt_tokens_total %llu\n",
        (unsigned long long)m->prompt_tokens);
    out(&b, "# HELP strand_generation_tokens_total Tokens generated.\n"
            "# TYPE strand_generation_tokens_total counter\nstrand_generation_tokens_total %llu\n",
        (unsigned long long)m->generation_tokens);
    out(&b, "# HELP strand_generations_total Generations by finish reason.\n# TYPE strand_generations_total counter\n");
    for (int r = 1; r < 5; r++)
        out(&b, "strand_generations_total{finish=\"%s\"} %llu\n", st_finish_name((st_finish_reason)r),
            (unsigned long long)m->finished[r]);
    out(&b, "# HELP strand_client_disconnects_total Streams whose client went away before the end.\n"
            "# TYPE strand_client_disconnects_total counter\nstrand_client_disconnects_total %llu\n",
        (unsigned long long)m->disconnects);
    out(&b, "# HELP strand_refused_connections_total Requests answered 503 because the connection limit was reached.\n"
            "# TYPE strand_refused_connections_total counter\nstrand_refused_connections_total %llu\n",
        (unsigned long long)m->refused_connections);
    hist_out(&b, "strand_time_to_first_token_seconds", "Time from request to first token.", &m->ttft);
    hist_out(&b, "strand_inter_token_latency_seconds", "Time between consecutive tokens of a stream.", &m->itl);
    hist_out(&b, "strand_request_duration_seconds", "Time from request to the last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    out(&b, "# HELP strand_queue_depth Requests waiting for a sequence slot.\n# TYPE strand_queue_depth gauge\n"
            "strand_queue_depth %d\n", ss->waiting);
    out(&b, "# HELP strand_running_sequences Sequences generating.\n# TYPE strand_running_sequences gauge\n"
            "strand_running_sequences %d\n", ss->running);
    out(&b, "# HELP strand_paused_sequences Running sequences waiting for their client to read.\n"
            "# TYPE strand_paused_sequences gauge\nstrand_paused_sequences %d\n", ss->paused);
    out(&b, "# HELP strand_preparing_requests Requests being parsed, rendered or tokenized.\n"
            "# TYPE strand_preparing_requests gauge\nstrand_preparing_requests %d\n", g->preparing);
    out(&b, "# HELP strand_open_connections Open HTTP connections.\n# TYPE strand_open_connections gauge\n"
            "strand_open_connections %d\n", g->connections);
    out(&b, "# HELP strand_kv_blocks_used KV cache blocks in use.\n# TYPE strand_kv_blocks_used gauge\n"
            "strand_kv_blocks_used %lld\n", (long long)ss->kv_blocks_used);
    out(&b, "# HELP strand_kv_blocks_total KV cache blocks in the pool.\n# TYPE strand_kv_blocks_total gauge\n"
            "strand_kv_blocks_total %lld\n", (long long)ss->kv_blocks_total);
    out(&b, "# HELP strand_steps_total Scheduler steps run.\n# TYPE strand_steps_total counter\n"
            "strand_steps_total %lld\n", (long long)ss->steps);
    const st_prefix_stats *px = &ss->prefix;
    out(&b, "# HELP strand_kv_blocks_cached KV blocks no sequence holds, kept for prefix reuse.\n"
            "# TYPE strand_kv_blocks_cached gauge\nstrand_kv_blocks_cached %lld\n", (long long)px->cached_blocks);
    out(&b, "# HELP strand_prefix_lookup_tokens_total Prompt tokens looked up in the prefix cache.\n"
            "# TYPE strand_prefix_lookup_tokens_total counter\nstrand_prefix_lookup_tokens_total %lld\n",
        (long long)px->lookup_tokens);
    out(&b, "# HELP strand_prefix_hit_tokens_total Prompt tokens served from the prefix cache.\n"
            "# TYPE strand_prefix_hit_tokens_total counter\nstrand_prefix_hit_tokens_total %lld\n",
        (long long)px->hit_tokens);
    out(&b, "# HELP strand_prefix_requests_total Requests looked up in the prefix cache, by result.\n"
            "# TYPE strand_prefix_requests_total counter\nstrand_prefix_requests_total{result=\"hit\"} %lld\n"
            "strand_prefix_requests_total{result=\"miss\"} %lld\n",
        (long long)px->hits, (long long)(px->lookups - px->hits));
    out(&b, "# HELP strand_snapshots_total State snapshots of the prefix cache, by event.\n"
            "# TYPE strand_snapshots_total counter\nstrand_snapshots_total{event=\"taken\"} %lld\n"
            "strand_snapshots_total{event=\"used\"} %lld\nstrand_snapshots_total{event=\"evicted\"} %lld\n"
            "strand_snapshots_total{event=\"dropped\"} %lld\n",
        (long long)px->snapshots_taken, (long long)px->snapshots_used, (long long)px->snapshots_evicted,
        (long long)px->snapshots_dropped);
    out(&b, "# HELP strand_snapshots_public State snapshots a request can resume from.\n"
            "# TYPE strand_snapshots_public gauge\nstrand_snapshots_public %lld\n", (long long)px->snapshots_public);
    out(&b, "# HELP strand_kv_blocks_evicted_total Cached KV blocks evicted for new positions.\n"
            "# TYPE strand_kv_blocks_evicted_total counter\nstrand_kv_blocks_evicted_total %lld\n",
        (long long)px->blocks_evicted);
    out(&b, "# HELP strand_up 1 when the model is loaded and serving.\n# TYPE strand_up gauge\nstrand_up %d\n",
        health == 1);
    return b.p;
}
