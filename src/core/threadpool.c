/* ==== Fixed worker pool (see threadpool.h) ====
 * A run publishes (fn, ctx), bumps an atomic generation counter and works as thread 0; each
 * worker waits for the generation to change (spinning for a short while, then sleeping on a
 * condition variable), runs its share and decrements the pending count the caller waits on.
 * Wake-up protocol: a worker increments `sleepers` and re-reads the generation under the
 * mutex before waiting; the caller bumps the generation before reading `sleepers` (both
 * sequentially consistent), so either the worker sees the new generation or the caller sees
 * the sleeper and broadcasts. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* pause iterations a worker spins before sleeping (about 1 ms): long enough to catch the
 * next parallel region of the same forward step across the serial parts between them (with
 * 2000, about 100 us, workers fell asleep inside decode steps and waking them cost about 12%
 * of 0.8B decode speed), short enough to leave the CPU to others between requests */
#define SPIN_ITERS 20000
/* pause iterations the caller spins for the workers to finish before it starts yielding its
 * CPU (so that a worker preempted on an oversubscribed machine gets to run) */
#define SPIN_JOIN 500

typedef struct worker {
    st_pool *pool; /* borrowed back-pointer */
    int tid;
    pthread_t th;
} worker;

struct st_pool {
    int n;
    worker *w;                 /* [n], w[0] unused (the caller); owned */
    st_pool_fn fn;             /* the current run's function; written before gen is bumped */
    void *ctx;
    atomic_uint gen;           /* bumped once per run */
    atomic_int pending;        /* workers still running the current run */
    atomic_int sleepers;       /* workers blocked (or about to block) on `cv` */
    atomic_int quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_started;             /* threads created (for cleanup after a partial failure) */
};

static unsigned wait_gen(st_pool *p, unsigned last) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != last) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->gen)) == last) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    st_pool *p = w->pool;
    unsigned last = 0;
    for (;;) {
        last = wait_gen(p, last);
        if (atomic_load(&p->quit)) break;
        p->fn(p->ctx, w->tid, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

static void bump(st_pool *p) {
    atomic_fetch_add(&p->gen, 1u);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

st_status st_pool_create(int n_threads, st_pool **out, st_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > ST_POOL_MAX_THREADS)
        return st_error_set(err, ST_ERR_ARG, "thread count %d is outside [1, %d]", n_threads,
                            ST_POOL_MAX_THREADS);
    st_pool *p = calloc(1, sizeof *p);
    if (!p) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    p->n = n_threads;
    p->w = calloc((size_t)n_threads, sizeof *p->w);
    if (!p->w) {
        free(p);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    atomic_init(&p->gen, 0u);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        p->w[i].pool = p;
        p->w[i].tid = i;
        int rc = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
        if (rc != 0) {
            st_pool_destroy(p);
            return st_error_set(err, ST_ERR_NOMEM, "cannot create worker thread %d of %d (%s)",
                                i, n_threads, strerror(rc));
        }
        p->n_started = i;
    }
    *out = p;
    return ST_OK;
}

void st_pool_destroy(st_pool *p) {
    if (!p) return;
    atomic_store(&p->quit, 1);
    bump(p);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->w[i].th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->w);
    free(p);
}

int st_pool_size(const st_pool *p) { return p->n; }

void st_pool_run(st_pool *p, st_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    bump(p);
    fn(ctx, 0, p->n);
    for (unsigned i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        if (i < SPIN_JOIN) cpu_relax();
        else sched_yield();
    }
}

int st_threads_parse(const char *e) {
    if (!e || !*e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end != 0 || v < 1) return 0;
    return v > ST_POOL_MAX_THREADS ? ST_POOL_MAX_THREADS : (int)v;
}

int st_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > ST_POOL_MAX_THREADS ? ST_POOL_MAX_THREADS : (int)n;
}

void st_split_range(int64_t n, int parts, int i, int64_t align, int64_t *lo, int64_t *hi) {
    ST_ASSERT(parts >= 1 && i >= 0 && i < parts && align >= 1 && n >= 0);
    int64_t units = (n + align - 1) / align;
    int64_t a = units * i / parts, b = units * (i + 1) / parts;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}
