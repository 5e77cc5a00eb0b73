/* ==== Splitting work over threads of unequal speed (see balance.h) ==== */
#include "core/balance.h"

#include "core/status.h"

/* fraction of the way to a run's measured speeds per run: about 20 runs (a few decode
 * layers) to follow a change */
#define BAL_RATE 0.1
#define BAL_MIN_S 2e-6
#define BAL_FLOOR 0.25 /* of an equal share */

static void set_cum(st_balance *b) {
    double total = 0;
    for (int i = 0; i < b->n; i++) total += b->speed[i];
    double acc = 0;
    b->cum[0] = 0;
    for (int i = 0; i < b->n; i++) {
        acc += b->speed[i];
        b->cum[i + 1] = acc / total;
    }
    b->cum[b->n] = 1.0;
}

void st_balance_init(st_balance *b, int n) {
    ST_ASSERT(n >= 1 && n <= ST_BALANCE_MAX);
    b->n = n;
    for (int i = 0; i < n; i++) b->speed[i] = 1.0;
    set_cum(b);
}

static int64_t boundary(const st_balance *b, int64_t n, int i, int64_t align) {
    if (i <= 0) return 0;
    if (i >= b->n) return n;
    const int64_t units = (n + align - 1) / align;
    int64_t u = (int64_t)(b->cum[i] * (double)units + 0.5);
    if (u > units) u = units;
    const int64_t at = u * align;
    return at < n ? at : n;
}

void st_balance_split(const st_balance *b, int64_t n, int tid, int64_t align, int64_t *lo,
                      int64_t *hi) {
    ST_ASSERT(tid >= 0 && tid < b->n && align >= 1 && n >= 0);
    *lo = boundary(b, n, tid, align);
    *hi = boundary(b, n, tid + 1, align);
    if (*hi < *lo) *hi = *lo; /* cum is non-decreasing, so only by rounding: never */
}

void st_balance_update(st_balance *b, const double *work, const double *seconds) {
    double rate[ST_BALANCE_MAX], sum = 0;
    int n_meas = 0;
    for (int i = 0; i < b->n; i++) {
        rate[i] = 0;
        if (work[i] > 0 && seconds[i] >= BAL_MIN_S) {
            rate[i] = work[i] / seconds[i];
            sum += rate[i];
            n_meas++;
        }
    }
    if (n_meas < 2) return; /* nothing to compare */
    /* the measured threads' rates, scaled to the mean of their current speeds */
    double cur = 0;
    for (int i = 0; i < b->n; i++)
        if (rate[i] > 0) cur += b->speed[i];
    const double scale = cur / sum;
    for (int i = 0; i < b->n; i++)
        if (rate[i] > 0) b->speed[i] += BAL_RATE * (rate[i] * scale - b->speed[i]);
    /* floor: raise the slowest to f with f / (U + k f) = q, q = BAL_FLOOR / n, where k
     * threads are raised and U is the others' sum; grow the raised set until stable */
    const double q = BAL_FLOOR / b->n;
    unsigned char low[ST_BALANCE_MAX] = {0};
    for (int changed = 1; changed;) {
        changed = 0;
        double U = 0;
        int k = 0;
        for (int i = 0; i < b->n; i++) {
            if (low[i]) k++;
            else U += b->speed[i];
        }
        const double f = q * U / (1 - q * k);
        for (int i = 0; i < b->n; i++)
            if (!low[i] && b->speed[i] < f) low[i] = 1, changed = 1;
        if (!changed)
            for (int i = 0; i < b->n; i++)
                if (low[i]) b->speed[i] = f;
    }
    set_cum(b);
}
