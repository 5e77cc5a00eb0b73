/* ==== Status codes and error messages ====
 *
 * Two error channels (see docs/ARCHITECTURE.md): anything that input or the environment can
 * cause is reported as an st_status plus a human-readable message in an st_error; broken
 * internal invariants abort through ST_ASSERT. Library code never calls exit().
 *
 * Enum values are append-only: never renumber.
 */
#ifndef ST_CORE_STATUS_H
#define ST_CORE_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum st_status {
    ST_OK = 0,
    ST_ERR_IO = 1,          /* file missing or unreadable, short read */
    ST_ERR_FORMAT = 2,      /* malformed content: corrupt header, bad JSON, bad offsets */
    ST_ERR_UNSUPPORTED = 3, /* well-formed but not supported: dtype, bit width, architecture */
    ST_ERR_MISSING = 4,     /* a required tensor or config field is absent */
    ST_ERR_SHAPE = 5,       /* a tensor's shape disagrees with the config */
    ST_ERR_NOMEM = 6,       /* allocation failed */
    ST_ERR_ARG = 7,         /* bad argument or request from the caller/user */
    ST_ERR_LIMIT = 8,       /* a configured limit is exceeded (context, batch, pool) */
    ST_ERR_BUSY = 9,        /* no capacity right now; try later */
    ST_ERR_INTERNAL = 10,   /* should not happen; a bug */
    ST_ERR_CANCELLED = 11,  /* the operation was cancelled */
} st_status;

/* An error report: the status and a message naming the file/tensor/field at fault.
 * Callers own it (usually on the stack); functions fill it when they fail. */
typedef struct st_error {
    st_status status;
    char msg[1024];
} st_error;

/* Short lowercase name of a status ("format error", ...). Never NULL. */
const char *st_status_name(st_status st);

/* Fill err (if non-NULL) with st and a printf-style message; returns st. */
st_status st_error_set(st_error *err, st_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepend printf-style context to an existing message ("loading DIR: " + old message). */
void st_error_prefix(st_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset to ST_OK with an empty message. */
void st_error_clear(st_error *err);

/* Invariant check: active in all builds, aborts with file:line. */
#define ST_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "strand: assertion failed: %s (%s:%d)\n", #cond, __FILE__,      \
                    __LINE__);                                                              \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

#define ST_UNUSED(x) ((void)(x))

/* jansson's parse error text as a user should read it: its messages that name its own
 * flags ("... without JSON_ALLOW_NUL") are said plainly; others are returned as they are. */
const char *st_json_error_text(const char *text);

#endif /* ST_CORE_STATUS_H */
