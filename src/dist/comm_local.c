/* ==== The in-process communicator (see comm_local.h) ==== */
#define _POSIX_C_SOURCE 200809L
#include "dist/comm_local.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* what the ranks share: a barrier that counts generations, and each rank's posted buffer */
typedef struct local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int world, arrived, refs;
    unsigned long gen;   /* barrier generations passed */
    int broken;
    const void **post;   /* [world] each rank's buffer of the current collective */
} local_group;

typedef struct local_rank {
    local_group *g;
} local_rank;

/* every rank arrives, or the group breaks after timeout_s (0: for ever); 0 or 1 (broken) */
static int meet(st_comm *c, double timeout_s) {
    local_group *g = ((local_rank *)c->impl)->g;
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        pthread_mutex_unlock(&g->mu);
        snprintf(c->error, sizeof c->error, "the in-process job is broken");
        c->broken = 1;
        return 1;
    }
    const unsigned long gen = g->gen;
    if (++g->arrived == g->world) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double s = timeout_s > 0 ? timeout_s : 0;
    until.tv_sec += (time_t)s;
    until.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    while (g->gen == gen && !g->broken) {
        if (timeout_s > 0) {
            if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && g->gen == gen) {
                g->broken = 1;
                pthread_cond_broadcast(&g->cv);
            }
        } else {
            pthread_cond_wait(&g->cv, &g->mu);
        }
    }
    const int ok = g->gen != gen;
    pthread_mutex_unlock(&g->mu);
    if (!ok) {
        snprintf(c->error, sizeof c->error, "not every one of the %d in-process ranks took part within %.1f s", c->world,
                 timeout_s);
        c->broken = 1;
        return 1;
    }
    return 0;
}

static int local_allgather(st_comm *c, const void *send, size_t bytes, void *recv) {
    local_group *g = ((local_rank *)c->impl)->g;
    g->post[c->rank] = send;
    if (meet(c, c->timeout_s)) return 1;
    for (int r = 0; r < c->world; r++) memcpy((char *)recv + (size_t)r * bytes, g->post[r], bytes);
    return meet(c, c->timeout_s); /* every rank has read every buffer */
}

static int local_bcast(st_comm *c, void *buf, size_t bytes, int root, double timeout_s) {
    local_group *g = ((local_rank *)c->impl)->g;
    if (c->rank == root) g->post[root] = buf;
    if (meet(c, timeout_s)) return 1;
    if (c->rank != root) memcpy(buf, g->post[root], bytes);
    return meet(c, c->timeout_s);
}

static int local_barrier(st_comm *c) { return meet(c, c->timeout_s); }

static void local_destroy(st_comm *c) {
    local_rank *r = c->impl;
    local_group *g = r->g;
    pthread_mutex_lock(&g->mu);
    const int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g->post);
        free(g);
    }
    free(r);
    free(c);
}

static const st_comm_ops local_ops = {
    .name = "in-process",
    .allgather = local_allgather,
    .bcast = local_bcast,
    .barrier = local_barrier,
    .destroy = local_destroy,
};

st_status st_comm_local_create(int world, double timeout_s, st_comm **ranks, st_error *err) {
    if (world < 1 || world > 4096) return st_error_set(err, ST_ERR_ARG, "in-process job: %d ranks", world);
    local_group *g = calloc(1, sizeof *g);
    const void **post = calloc((size_t)world, sizeof *post);
    if (!g || !post) {
        free(g);
        free(post);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->world = world;
    g->post = post;
    for (int r = 0; r < world; r++) ranks[r] = NULL;
    for (int r = 0; r < world; r++) {
        st_comm *c = calloc(1, sizeof *c);
        local_rank *lr = calloc(1, sizeof *lr);
        if (!c || !lr) {
            free(c);
            free(lr);
            for (int k = 0; k < r; k++) st_comm_destroy(ranks[k]);
            if (r == 0) {
                pthread_mutex_destroy(&g->mu);
                pthread_cond_destroy(&g->cv);
                free(post);
                free(g);
            }
            for (int k = 0; k < world; k++) ranks[k] = NULL;
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        }
        lr->g = g;
        c->ops = &local_ops;
        c->rank = r;
        c->world = world;
        c->timeout_s = timeout_s;
        c->impl = lr;
        g->refs++;
        ranks[r] = c;
    }
    return ST_OK;
}
