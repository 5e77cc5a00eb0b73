/* ==== Logging to stderr (see log.h) ==== */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static st_log_level g_level = ST_LOG_WARN; /* the one documented global; set by the CLI */

void st_log_set_level(st_log_level level) { g_level = level; }
st_log_level st_log_get_level(void) { return g_level; }

void st_log(st_log_level level, const char *fmt, ...) {
    if (level > g_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "strand: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
