/* ==== Splitting work over threads of unequal speed ====
 * The cores a process gets are not always equal: on a shared or virtual machine one of them
 * may be running another guest's hyperthread and do a quarter less work per second, for
 * seconds at a time. A static equal split then leaves every thread but the slowest waiting
 * at each join. st_balance keeps a speed estimate per thread (work done per second, from
 * the runs it is told about) and splits ranges in proportion to it, so that the threads of
 * a run finish together. Contiguous ranges keep each thread's weight streams long.
 *
 * Which thread computes which rows never changes a result in this engine (kernels give the
 * same bits for any row range), so balancing is free to move boundaries between runs. */
#ifndef ST_CORE_BALANCE_H
#define ST_CORE_BALANCE_H

#include <stdint.h>

#define ST_BALANCE_MAX 256 /* = ST_POOL_MAX_THREADS */

typedef struct st_balance {
    int n;                          /* threads */
    double speed[ST_BALANCE_MAX];   /* relative work per second, mean 1 */
    double cum[ST_BALANCE_MAX + 1]; /* cum[i] = share of threads < i; cum[0] = 0, cum[n] = 1 */
} st_balance;

/* Equal speeds for n threads (1 <= n <= ST_BALANCE_MAX). */
void st_balance_init(st_balance *b, int n);

/* Thread tid's part [*lo, *hi) of [0, n): boundaries are multiples of align (or n), the
 * parts of threads 0..b->n-1 cover [0, n) in order, and each part's size follows the
 * thread's share. */
void st_balance_split(const st_balance *b, int64_t n, int tid, int64_t align, int64_t *lo,
                      int64_t *hi);

/* Learn from one run: work[i] units took seconds[i] on thread i. Threads with no work or a
 * time too short to measure (under 2 us) are left as they were. The estimate moves a
 * fraction of the way per run, and no thread's share drops below a quarter of an equal
 * one (so a thread that had one bad run gets work again and is measured again). */
void st_balance_update(st_balance *b, const double *work, const double *seconds);

#endif /* ST_CORE_BALANCE_H */
