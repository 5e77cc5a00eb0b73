/* ==== The in-process communicator (dist/comm_local.h) ====
 *
 * Ranks as threads: all-gathers hold every rank's buffer in rank order, broadcasts the root's,
 * all-reduces the same bits on every rank; a rank that does not join breaks the job within
 * its timeout (no hang). Then a tensor-parallel job of CPU backends on it, driven through the
 * relay as under mpirun: tiny-b over 2 and 4 ranks gives the whole model's greedy tokens and
 * logits within 1e-5.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/select.h"
#include "core/clock.h"
#include "dist/comm_local.h"
#include "dist/relay.h"
#include "kit.h"
#include "tap.h"

#define W 3
#define N 1000

typedef struct rank_job {
    st_comm *c;
    int ok;
    float red[N];
} rank_job;

static void *collectives(void *arg) {
    rank_job *j = arg;
    st_comm *c = j->c;
    st_error err = {0};
    int ok = 1;
    for (int round = 0; round < 50; round++) {
        int32_t send[4] = {c->rank, round, c->rank * round, 7}, recv[W][4];
        ok &= st_comm_allgather(c, send, sizeof send, recv, &err) == ST_OK;
        for (int r = 0; r < W; r++) ok &= recv[r][0] == r && recv[r][1] == round && recv[r][2] == r * round;
        int64_t v[2] = {c->rank == round % W ? 1000 + round : -1, 5};
        ok &= st_comm_bcast(c, v, sizeof v, round % W, 0, &err) == ST_OK && v[0] == 1000 + round && v[1] == 5;
    }
    float scratch[W * N];
    for (int e = 0; e < N; e++) j->red[e] = (float)(c->rank + 1) * 0.1f + (float)e * 1e-3f;
    ok &= st_comm_allreduce_sum(c, j->red, N, scratch, &err) == ST_OK;
    j->ok = ok;
    return NULL;
}

static void *late(void *arg) { /* joins one all-gather, then never again */
    st_comm *c = arg;
    st_error err = {0};
    int32_t x = 1, all[2];
    st_comm_allgather(c, &x, sizeof x, all, &err);
    return NULL;
}

typedef struct follower {
    const st_model *m;
    st_comm *c;
    st_status st;
    st_error err;
} follower;

static void *follow(void *arg) {
    follower *f = arg;
    st_device_params p = st_device_default_params();
    p.kind = ST_DEVICE_CPU;
    p.cpu = kit_cpu_params();
    p.cpu.n_threads = 1;
    p.cpu.comm = f->c;
    st_backend *b = NULL;
    f->st = st_backend_create(f->m, &p, &b, &f->err);
    if (f->st == ST_OK) f->st = st_relay_follow(b, &f->err);
    st_backend_destroy(b);
    return NULL;
}

/* greedy tokens and every step's logits of a whole model or of rank 0 of a job */
static st_status greedy(st_backend *b, const st_model *m, int n_new, int32_t *tok, float *lg, st_error *err) {
    st_cache *cache = NULL;
    st_fwd *f = NULL;
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = 1;
    cp.max_seq_len = 64;
    cp.block_size = 8;
    const int64_t V = m->cfg.vocab_size;
    st_status st = st_cache_create(m, &cp, &cache, err);
    if (st == ST_OK) st = kit_fwd(b, cache, 32, &f, err);
    st_seq s;
    s.slot = -1;
    if (st == ST_OK) st = st_cache_seq_start(cache, &s, err);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = (int32_t)((i * 29 + 3) % V);
    const int32_t *in = ids;
    int n = 20;
    for (int k = 0; k < n_new && st == ST_OK; k++) {
        st_batch_item it = {&s, in, n, ST_LOGITS_LAST};
        st = st_batch_run(cache, f, &it, 1, lg + (int64_t)k * V, err);
        if (st != ST_OK) break;
        const float *row = lg + (int64_t)k * V;
        int best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = (int)v;
        tok[k] = best;
        in = &tok[k];
        n = 1;
    }
    st_cache_seq_release(cache, &s);
    st_fwd_destroy(f);
    st_cache_destroy(cache);
    return st;
}

static void job(const st_model *m, int world, const int32_t *want_tok, const float *want_lg, int n_new) {
    st_error err = {0};
    st_comm *ranks[8] = {0};
    follower fo[8];
    pthread_t th[8];
    int started = 0;
    st_status st = st_comm_local_create(world, 30.0, ranks, &err);
    for (int r = 1; r < world && st == ST_OK; r++, started++) {
        fo[r] = (follower){m, ranks[r], ST_OK, {0}};
        pthread_create(&th[r], NULL, follow, &fo[r]);
    }
    st_device_params p = st_device_default_params();
    p.kind = ST_DEVICE_CPU;
    p.cpu = kit_cpu_params();
    p.cpu.n_threads = 1;
    p.cpu.comm = ranks[0];
    st_backend *b = NULL;
    const int64_t V = m->cfg.vocab_size;
    int32_t tok[16] = {0};
    float *lg = calloc((size_t)(n_new * V), sizeof(float));
    if (st == ST_OK) st = st_backend_create(m, &p, &b, &err);
    if (st == ST_OK) st = greedy(b, m, n_new, tok, lg, &err);
    /* on rank 0 destroying the backend ends the job's work (the followers return); with
     * world 2 the end is sent first by hand, and the destroy must not send it again (it
     * would wait out the watchdog for followers that are gone) */
    if (world == 2 && b) st_relay_end(b, &(st_error){0});
    const double t_end = st_now_s();
    st_backend_destroy(b);
    const double end_s = st_now_s() - t_end;
    b = NULL;
    if (world == 2) CHECK(end_s < 5.0, "st_relay_end, then the backend's destroy: the end is sent once (%.2f s)", end_s);
    for (int r = 1; r <= started; r++) {
        pthread_join(th[r], NULL);
        if (st == ST_OK && fo[r].st != ST_OK) st = fo[r].st, err = fo[r].err;
    }
    const double worst = st == ST_OK ? kit_row_err(lg, want_lg, n_new, V) : INFINITY;
    CHECK(st == ST_OK && !memcmp(tok, want_tok, (size_t)n_new * sizeof *tok) && worst <= 1e-5,
          "tiny-b over %d in-process ranks through the relay: the whole model's %d greedy tokens, logits within 1e-5 "
          "of each row's largest (worst %.2e; %lld all-reduces on rank 0) %s",
          world, n_new, worst, (long long)(ranks[0] ? ranks[0]->allreduces : 0), err.msg);
    for (int r = 0; r < world; r++) st_comm_destroy(ranks[r]);
    free(lg);
}

int main(void) {
    st_error err = {0};
    st_comm *c[W];
    rank_job jobs[W];
    pthread_t th[W];
    CHECK(st_comm_local_create(W, 10.0, c, &err) == ST_OK, "3 in-process ranks (%s)", err.msg);
    for (int r = 0; r < W; r++) {
        jobs[r] = (rank_job){.c = c[r]};
        pthread_create(&th[r], NULL, collectives, &jobs[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    int ok = jobs[0].ok && jobs[1].ok && jobs[2].ok;
    for (int e = 0; e < N && ok; e++) {
        const float want = (((float)1 * 0.1f + (float)e * 1e-3f) + ((float)2 * 0.1f + (float)e * 1e-3f)) +
                           ((float)3 * 0.1f + (float)e * 1e-3f);
        ok = jobs[1].red[e] == want && !memcmp(&jobs[0].red[e], &jobs[1].red[e], 4) &&
             !memcmp(&jobs[2].red[e], &jobs[1].red[e], 4);
    }
    CHECK(ok, "50 rounds of all-gathers (rank order) and broadcasts from each root; an all-reduce in rank order, the "
              "same bits on every rank");
    for (int r = 0; r < W; r++) st_comm_destroy(c[r]);

    /* a rank that stops taking part: the next collective fails within the timeout */
    st_comm *d[2];
    st_comm_local_create(2, 0.3, d, &err);
    pthread_t t;
    pthread_create(&t, NULL, late, d[1]);
    int32_t x = 0, all[2];
    const st_status s1 = st_comm_allgather(d[0], &x, sizeof x, all, &err);
    const double t0 = st_now_s();
    const st_status s2 = st_comm_allgather(d[0], &x, sizeof x, all, &err);
    const double waited = st_now_s() - t0;
    pthread_join(t, NULL);
    CHECK(s1 == ST_OK && s2 == ST_ERR_IO && d[0]->broken && waited < 2.0 && strstr(err.msg, "took part"),
          "a rank that stops joining: the next all-gather fails after %.2f s (timeout 0.3 s): %s", waited, err.msg);
    st_error e3 = {0};
    CHECK(st_comm_allgather(d[0], &x, sizeof x, all, &e3) == ST_ERR_IO, "and every later one at once: %s", e3.msg);
    st_comm_destroy(d[0]);
    st_comm_destroy(d[1]);
    CHECK(st_comm_local_create(0, 1, d, &err) == ST_ERR_ARG, "0 ranks refused: %s", err.msg);
    memset(&err, 0, sizeof err);

    /* a CPU job on it, through the relay */
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/tiny-b", tap_data_dir());
    st_model *m = NULL;
    if (CHECK(st_model_load(path, &m, &err) == ST_OK, "tiny-b loads (%s)", err.msg)) {
        enum { NEW = 8 };
        const int64_t V = m->cfg.vocab_size;
        int32_t tok[NEW];
        float *lg = calloc((size_t)(NEW * V), sizeof(float));
        st_device_params p = st_device_default_params();
        p.kind = ST_DEVICE_CPU;
        p.cpu = kit_cpu_params();
        p.cpu.n_threads = 1;
        st_backend *b = NULL;
        st_status st = st_backend_create(m, &p, &b, &err);
        if (st == ST_OK) st = greedy(b, m, NEW, tok, lg, &err);
        st_backend_destroy(b);
        if (CHECK(st == ST_OK, "tiny-b alone: %d greedy tokens (%s)", NEW, err.msg)) {
            job(m, 2, tok, lg, NEW);
            job(m, 4, tok, lg, NEW);
        }
        free(lg);
        st_model_free(m);
    }
    return tap_done();
}
