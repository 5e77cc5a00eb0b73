/* ==== Monotonic time ==== */
#ifndef ST_CORE_CLOCK_H
#define ST_CORE_CLOCK_H

#include <time.h>

/* Seconds on the monotonic clock (for intervals only). */
static inline double st_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* ST_CORE_CLOCK_H */
