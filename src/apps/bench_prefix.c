/* ==== strand bench --prefix: time to first token with and without the prefix cache ====
 * 1. A multi-turn chat: a system prompt, then `turns` turns of a user message and a reply
 *    (greedy, fixed lengths); each turn's prompt is the whole conversation so far. Run once
 *    on a scheduler with the prefix cache and once on one without; the time to first token
 *    of every turn, and the positions each took from the cache.
 * 2. With --prefix-long A,B: a prompt of A tokens, then its extension to B tokens, with the
 *    cache (the second resumes after the first), against B tokens cold; while the A-token
 *    prompt prefills, another stream decodes, and its inter-token latencies (p50, p99, max)
 *    say what a long prefill costs the streams already running.
 * Token ids are a fixed pseudo-random sequence; the model's output does not matter. */
#include "apps/bench_prefix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "engine/scheduler.h"

typedef struct ev_log {
    int32_t ids[64];
    int n, done;
    double ttft_s;
    int64_t cached;
    double *t;      /* [t_cap] token times, or NULL */
    int64_t n_t, t_cap;
    char err[200];
} ev_log;

static int on_event(void *user, const st_event *ev) {
    ev_log *o = user;
    if (ev->kind == ST_EV_TOKEN) {
        if (o->n < 64) o->ids[o->n] = ev->token;
        o->n++;
        if (o->t && o->n_t < o->t_cap) o->t[o->n_t++] = st_now_s();
    } else {
        o->done = 1;
        o->ttft_s = ev->ttft_s;
        o->cached = ev->usage.cached_tokens;
        if (ev->error) snprintf(o->err, sizeof o->err, "%.190s", ev->error);
    }
    return ST_EV_CONTINUE;
}

static st_sched *make(const st_model *m, st_backend *b, int prefix, int max_seqs, int64_t ctx, int64_t kv_blocks,
                      int every, st_error *err) {
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = max_seqs;
    sp.ctx = ctx;
    sp.kv_blocks = kv_blocks;
    sp.prefix_cache = prefix;
    sp.snapshot_every = every;
    sp.backend = b;
    st_sched *s = NULL;
    if (st_sched_create(m, NULL, &sp, &s, err) != ST_OK) return NULL;
    return s;
}

static int submit(st_sched *s, const int32_t *p, int64_t n, int64_t max_tokens, ev_log *o, uint64_t *id,
                  st_error *err) {
    st_req_params rp = st_req_default_params();
    rp.max_tokens = max_tokens;
    rp.sampling.temperature = 0;
    rp.ignore_eos = 1;
    return st_sched_submit(s, p, n, &rp, on_event, o, id, err) == ST_OK ? 0 : -1;
}

static void fill(int32_t *p, int64_t n, int64_t vocab, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* one backend per scheduler: the CPU backend must not chunk the delta rule with the cache on */
static st_backend *backend_for(const st_model *m, const st_device_params *dp, int prefix, st_error *err) {
    st_device_params d = *dp;
    d.cpu = st_sched_cpu_params(d.cpu, prefix);
    st_backend *b = NULL;
    return st_backend_create(m, &d, &b, err) == ST_OK ? b : NULL;
}

static int chat(const st_model *m, const st_device_params *dp, const bench_prefix_opts *o, int json, st_error *err) {
    const int64_t total = o->system_tokens + (int64_t)o->turns * (o->turn_tokens + o->reply_tokens);
    const int64_t ctx = (total + 64 + 15) / 16 * 16;
    int32_t *conv = malloc((size_t)total * sizeof *conv);
    double *ttft = calloc((size_t)o->turns * 2, sizeof *ttft);
    int64_t *cached = calloc((size_t)o->turns, sizeof *cached);
    int rc = -1;
    if (!conv || !ttft || !cached) {
        st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int pass = 0; pass < 2; pass++) { /* 0: with the cache, 1: without */
        st_backend *b = backend_for(m, dp, pass == 0, err);
        st_sched *s = b ? make(m, b, pass == 0, 1, ctx, 0, o->snapshot_every, err) : NULL;
        if (!s) {
            st_backend_destroy(b);
            goto out;
        }
        fill(conv, o->system_tokens, m->cfg.vocab_size, 1);
        int64_t n = o->system_tokens;
        for (int t = 0; t < o->turns; t++) {
            fill(conv + n, o->turn_tokens, m->cfg.vocab_size, 100 + (uint64_t)t);
            n += o->turn_tokens;
            ev_log e;
            memset(&e, 0, sizeof e);
            if (submit(s, conv, n, o->reply_tokens, &e, NULL, err) != 0) break;
            while (st_sched_step(s) > 0) {
            }
            ttft[t * 2 + pass] = e.ttft_s;
            if (pass == 0) cached[t] = e.cached;
            if (!json)
                fprintf(stderr, "  %s turn %d: %lld-token prompt, first token after %.3f s (%lld cached)\n",
                        pass ? "without" : "with", t + 1, (long long)n, e.ttft_s, (long long)e.cached);
            for (int64_t i = 0; i < o->reply_tokens && i < e.n && i < 64; i++) conv[n + i] = e.ids[i];
            if (o->reply_tokens > 64) fill(conv + n + 64, o->reply_tokens - 64, m->cfg.vocab_size, 7); /* as generated */
            n += o->reply_tokens;
        }
        st_sched_destroy(s);
        st_backend_destroy(b);
    }
    double sum_with = 0, sum_without = 0;
    for (int t = 0; t < o->turns; t++) sum_with += ttft[t * 2], sum_without += ttft[t * 2 + 1];
    if (json) {
        printf("{\"prefix_chat\": {\"turns\": %d, \"system_tokens\": %lld, \"turn_tokens\": %lld, \"reply_tokens\": %lld, "
               "\"ttft_with_s\": [", o->turns, (long long)o->system_tokens, (long long)o->turn_tokens,
               (long long)o->reply_tokens);
        for (int t = 0; t < o->turns; t++) printf("%s%.4f", t ? ", " : "", ttft[t * 2]);
        printf("], \"ttft_without_s\": [");
        for (int t = 0; t < o->turns; t++) printf("%s%.4f", t ? ", " : "", ttft[t * 2 + 1]);
        printf("], \"cached_tokens\": [");
        for (int t = 0; t < o->turns; t++) printf("%s%lld", t ? ", " : "", (long long)cached[t]);
        printf("]}}\n");
    } else {
        printf("prefix cache: a %d-turn chat (system %lld tokens, %lld per user turn, %lld per reply)\n", o->turns,
               (long long)o->system_tokens, (long long)o->turn_tokens, (long long)o->reply_tokens);
        printf("turn      prompt    cached   ttft with   ttft without   speedup\n");
        int64_t n = o->system_tokens;
        for (int t = 0; t < o->turns; t++) {
            n += o->turn_tokens;
            printf("%4d  %10lld  %8lld  %8.3f s  %11.3f s  %7.1fx\n", t + 1, (long long)n, (long long)cached[t],
                   ttft[t * 2], ttft[t * 2 + 1], ttft[t * 2] > 0 ? ttft[t * 2 + 1] / ttft[t * 2] : 0.0);
            n += o->reply_tokens;
        }
        printf(" all                        %8.3f s  %11.3f s  %7.1fx\n", sum_with, sum_without,
               sum_with > 0 ? sum_without / sum_with : 0.0);
    }
    rc = 0;
out:
    free(conv);
    free(ttft);
    free(cached);
    return rc;
}

static int long_context(const st_model *m, const st_device_params *dp, const bench_prefix_opts *o, int json,
                        st_error *err) {
    const int64_t a = o->long_first, bn = o->long_second, ctx = (bn + 256 + 15) / 16 * 16;
    int32_t *p = malloc((size_t)bn * sizeof *p);
    ev_log first, second, cold, bg;
    memset(&bg, 0, sizeof bg);
    bg.t_cap = 1 << 20;
    bg.t = malloc((size_t)bg.t_cap * sizeof *bg.t);
    int rc = -1;
    st_backend *b = NULL;
    st_sched *s = NULL;
    if (!p || !bg.t) {
        st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto out;
    }
    fill(p, bn, m->cfg.vocab_size, 3);
    int32_t bgp[64];
    fill(bgp, 64, m->cfg.vocab_size, 5);
    /* with the cache: a decoding stream, then the A-token prompt beside it, then B; the pool
     * holds B and the stream */
    const int64_t bg_max = 32768, blocks = (ctx + 64 + bg_max) / 16 + 4;
    uint64_t bg_id = 0;
    if (!(b = backend_for(m, dp, 1, err)) || !(s = make(m, b, 1, 2, ctx, blocks, o->snapshot_every, err))) goto out;
    memset(&first, 0, sizeof first);
    if (submit(s, bgp, 64, bg_max, &bg, &bg_id, err) != 0) goto out;
    for (int i = 0; i < 8; i++) st_sched_step(s); /* the stream is decoding */
    const int64_t bg_before = bg.n_t;
    if (submit(s, p, a, 1, &first, NULL, err) != 0) goto out;
    while (!first.done) st_sched_step(s);
    const int64_t bg_during = bg.n_t;
    st_sched_cancel(s, bg_id);
    while (st_sched_step(s) > 0) {
    }
    memset(&second, 0, sizeof second);
    if (submit(s, p, bn, 1, &second, NULL, err) != 0) goto out;
    while (st_sched_step(s) > 0) {
    }
    st_sched_destroy(s);
    s = NULL;
    st_backend_destroy(b);
    b = NULL;
    /* without: B tokens cold */
    if (!(b = backend_for(m, dp, 0, err)) || !(s = make(m, b, 0, 1, ctx, 0, o->snapshot_every, err))) goto out;
    memset(&cold, 0, sizeof cold);
    if (submit(s, p, bn, 1, &cold, NULL, err) != 0) goto out;
    while (st_sched_step(s) > 0) {
    }
    /* the stream's inter-token latencies while the long prompt prefilled */
    int64_t n_itl = bg_during - bg_before - 1;
    double p50 = 0, p99 = 0, mx = 0;
    if (n_itl > 0) {
        double *d = malloc((size_t)n_itl * sizeof *d);
        if (d) {
            for (int64_t i = 0; i < n_itl; i++) d[i] = bg.t[bg_before + i + 1] - bg.t[bg_before + i];
            qsort(d, (size_t)n_itl, sizeof *d, cmp_d);
            p50 = d[n_itl / 2];
            p99 = d[(int64_t)floor(0.99 * (double)(n_itl - 1))];
            mx = d[n_itl - 1];
            free(d);
        }
    }
    if (json) {
        printf("{\"prefix_long\": {\"first_tokens\": %lld, \"second_tokens\": %lld, \"ttft_first_s\": %.3f, "
               "\"ttft_second_cached_s\": %.3f, \"second_cached_tokens\": %lld, \"ttft_second_cold_s\": %.3f, "
               "\"stream_itl_during_prefill_s\": {\"n\": %lld, \"p50\": %.4f, \"p99\": %.4f, \"max\": %.4f}}}\n",
               (long long)a, (long long)bn, first.ttft_s, second.ttft_s, (long long)second.cached, cold.ttft_s,
               (long long)n_itl, p50, p99, mx);
    } else {
        printf("prefix cache: a %lld-token prompt, then its extension to %lld tokens\n", (long long)a, (long long)bn);
        printf("  first (cold)            ttft %9.2f s\n", first.ttft_s);
        printf("  extension, cached       ttft %9.2f s  (%lld positions from the cache)\n", second.ttft_s,
               (long long)second.cached);
        printf("  extension, cold         ttft %9.2f s  (%.1fx the cached one)\n", cold.ttft_s,
               second.ttft_s > 0 ? cold.ttft_s / second.ttft_s : 0.0);
        printf("  a stream decoding while the %lld-token prompt prefilled: %lld tokens, inter-token latency "
               "p50 %.3f s, p99 %.3f s, max %.3f s\n",
               (long long)a, (long long)n_itl + 1, p50, p99, mx);
    }
    rc = 0;
out:
    st_sched_destroy(s);
    st_backend_destroy(b);
    free(p);
    free(bg.t);
    return rc;
}

int bench_prefix(const st_model *m, const st_device_params *dp, const bench_prefix_opts *o, int json, st_error *err) {
    if (o->turns > 0 && chat(m, dp, o, json, err) != 0) return -1;
    if (o->long_first > 0 && long_context(m, dp, o, json, err) != 0) return -1;
    return 0;
}
