/* ==== CLI helpers (see cli.h) ==== */
#include "apps/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const st_error *err) {
    fprintf(stderr, "strand: %s\n", err->msg[0] ? err->msg : st_status_name(err->status));
    return 1;
}

int cli_failf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("strand: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

st_status cli_parse_ids(const char *s, int32_t **ids, int *n, st_error *err) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const char *p = s;
    int count = 0;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return st_error_set(err, ST_ERR_ARG, "bad token id near '%.20s'", p);
        }
        if ((size_t)count == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            }
            v = nv;
        }
        v[count++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = count;
    return ST_OK;
}

int cli_parse_int(const char *opt, const char *s, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < min || x > max) {
        fprintf(stderr, "strand: %s: expected an integer in [%lld, %lld], got '%s'\n", opt, min,
                max, s);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno) {
        fprintf(stderr, "strand: %s: expected a number, got '%s'\n", opt, s);
        return -1;
    }
    *out = x;
    return 0;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "strand: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}
