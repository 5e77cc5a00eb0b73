/* ==== Status codes and error messages (see status.h) ==== */
#include "core/status.h"

#include <string.h>

const char *st_status_name(st_status st) {
    switch (st) {
    case ST_OK: return "ok";
    case ST_ERR_IO: return "i/o error";
    case ST_ERR_FORMAT: return "format error";
    case ST_ERR_UNSUPPORTED: return "unsupported";
    case ST_ERR_MISSING: return "missing";
    case ST_ERR_SHAPE: return "shape mismatch";
    case ST_ERR_NOMEM: return "out of memory";
    case ST_ERR_ARG: return "invalid argument";
    case ST_ERR_LIMIT: return "limit exceeded";
    case ST_ERR_BUSY: return "busy";
    case ST_ERR_INTERNAL: return "internal error";
    case ST_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

st_status st_error_set(st_error *err, st_status st, const char *fmt, ...) {
    if (!err) return st;
    err->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return st;
}

void st_error_prefix(st_error *err, const char *fmt, ...) {
    if (!err) return;
    char head[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    size_t cap = sizeof err->msg;
    size_t hl = strlen(head), ol = strlen(err->msg);
    if (hl > cap - 1) hl = cap - 1;
    if (hl + ol > cap - 1) ol = cap - 1 - hl;
    memmove(err->msg + hl, err->msg, ol);
    memcpy(err->msg, head, hl);
    err->msg[hl + ol] = '\0';
}

void st_error_clear(st_error *err) {
    if (!err) return;
    err->status = ST_OK;
    err->msg[0] = '\0';
}

const char *st_json_error_text(const char *text) {
    if (text && strstr(text, "JSON_ALLOW_NUL")) return "a string contains \\u0000 (NUL), which is not accepted";
    return text ? text : "";
}
