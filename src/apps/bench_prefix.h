/* ==== strand bench --prefix (bench_prefix.c) ==== */
#ifndef ST_APPS_BENCH_PREFIX_H
#define ST_APPS_BENCH_PREFIX_H

#include <stdint.h>

#include "backend/select.h"
#include "core/status.h"
#include "model/model.h"

typedef struct bench_prefix_opts {
    int turns;                               /* chat turns; 0: no chat scenario */
    int64_t system_tokens, turn_tokens, reply_tokens;
    int64_t long_first, long_second;         /* the long scenario's lengths; 0: none */
    int snapshot_every;                      /* blocks; 0: the scheduler's default */
} bench_prefix_opts;

/* Prints the tables (or JSON lines); -1 with err on a failure. */
int bench_prefix(const st_model *m, const st_device_params *dp, const bench_prefix_opts *o, int json, st_error *err);

#endif /* ST_APPS_BENCH_PREFIX_H */
