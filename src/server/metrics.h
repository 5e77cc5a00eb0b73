/* ==== Server metrics in the Prometheus text format ====
 * Counters and histograms updated by the HTTP threads and the scheduler thread (each update
 * takes one mutex briefly and allocates nothing); rendered on GET /metrics. */
#ifndef ST_SERVER_METRICS_H
#define ST_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/scheduler.h"

#define ST_HIST_MAX_BUCKETS 20

typedef struct st_histogram {
    int n;                                 /* buckets (upper bounds below, then +Inf) */
    double bounds[ST_HIST_MAX_BUCKETS];
    uint64_t counts[ST_HIST_MAX_BUCKETS + 1]; /* non-cumulative */
    uint64_t count;
    double sum;
} st_histogram;

typedef struct st_metrics {
    pthread_mutex_t mu;
    struct {
        int status;
        uint64_t n;
    } by_status[24];                 /* HTTP responses by status code */
    int n_status;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t finished[5];            /* generations by st_finish_reason */
    uint64_t disconnects;            /* clients gone before the end */
    uint64_t refused_connections;    /* answered 503: over the connection limit */
    st_histogram ttft;               /* seconds, request to first token */
    st_histogram itl;                /* seconds between tokens of one stream */
    st_histogram e2e;                /* seconds, request to last token */
} st_metrics;

void st_metrics_init(st_metrics *m);
void st_metrics_destroy(st_metrics *m);
void st_metrics_count_status(st_metrics *m, int status);
void st_metrics_observe(st_metrics *m, st_histogram *h, double v);
void st_metrics_finished(st_metrics *m, const st_event *done);
void st_metrics_disconnect(st_metrics *m);
void st_metrics_refused(st_metrics *m);

/* What the HTTP side holds when /metrics is asked. */
typedef struct st_server_gauges {
    int connections; /* open TCP connections */
    int preparing;   /* requests being parsed, rendered or tokenized */
} st_server_gauges;

/* The exposition text (malloc'ed). health: 0 loading, 1 ready, 2 unhealthy. */
char *st_metrics_render(st_metrics *m, const st_sched_stats *ss, const st_server_gauges *g, int health);

#endif /* ST_SERVER_METRICS_H */
