/* ==== Errors of the CUDA backend's host files (private to src/backend/cuda) ====
 * The shared object links nothing of libstrand, so it sets an st_error itself. */
#ifndef ST_BACKEND_CUDA_CU_ERROR_H
#define ST_BACKEND_CUDA_CU_ERROR_H

#include <stdarg.h>
#include <stdio.h>

#include "core/status.h"

/* err (when given) = st with the message; returns st */
static inline st_status cu_error_set(st_error *err, st_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline st_status cu_error_set(st_error *err, st_status st, const char *fmt, ...) {
    if (err) {
        err->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

#endif /* ST_BACKEND_CUDA_CU_ERROR_H */
