/* ==== A fixed pool of worker threads for data-parallel kernels ====
 *
 * st_pool_run(pool, fn, ctx) calls fn(ctx, tid, n) once on each of the pool's n threads
 * (tid 0 is the calling thread itself) and returns when all calls have returned. Work is
 * partitioned statically by the callee from (tid, n); the pool only starts and joins. The
 * threads are created once by st_pool_create; a run allocates nothing and takes no lock on
 * its fast path (workers spin briefly on an atomic generation counter, then sleep on a
 * condition variable, so an idle pool costs no CPU).
 *
 * Thread ownership: one thread at a time drives a pool (st_pool_run is not reentrant and must
 * not be called from inside fn). Results never depend on the thread count as long as the
 * callee's partition does not change the arithmetic (the forward pass keeps that rule).
 */
#ifndef ST_CORE_THREADPOOL_H
#define ST_CORE_THREADPOOL_H

#include <stdint.h>

#include "core/status.h"

typedef struct st_pool st_pool;

/* fn(ctx, tid, n_threads) with 0 <= tid < n_threads. */
typedef void (*st_pool_fn)(void *ctx, int tid, int n_threads);

/* The most threads a pool may have. */
#define ST_POOL_MAX_THREADS 256

/* A pool of n_threads threads in total, the caller included (n_threads - 1 are created).
 * n_threads must be in [1, ST_POOL_MAX_THREADS]. */
st_status st_pool_create(int n_threads, st_pool **out, st_error *err);
/* Joins the workers. NULL is accepted. */
void st_pool_destroy(st_pool *p);

int st_pool_size(const st_pool *p);

/* Run fn on every thread of the pool and wait for all of them. */
void st_pool_run(st_pool *p, st_pool_fn fn, void *ctx);

/* The default thread count: the number of online CPUs (at least 1, at most
 * ST_POOL_MAX_THREADS). */
int st_default_threads(void);
/* A thread count written as a positive decimal number (apps/ pass $STRAND_THREADS), capped at
 * ST_POOL_MAX_THREADS; 0 when s is NULL, empty or not such a number. */
int st_threads_parse(const char *s);

/* Split [0, n) into `parts` contiguous ranges whose boundaries are multiples of `align`
 * (except the end); part i is [*lo, *hi). Ranges may be empty. */
void st_split_range(int64_t n, int parts, int i, int64_t align, int64_t *lo, int64_t *hi);

#endif /* ST_CORE_THREADPOOL_H */
