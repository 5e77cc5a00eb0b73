/* ==== Logging to stderr ====
 * The one process-wide setting in strand: the log level (set once by the CLI at start). */
#ifndef ST_CORE_LOG_H
#define ST_CORE_LOG_H

typedef enum st_log_level {
    ST_LOG_ERROR = 0,
    ST_LOG_WARN = 1,
    ST_LOG_INFO = 2,
    ST_LOG_DEBUG = 3,
} st_log_level;

void st_log_set_level(st_log_level level);
st_log_level st_log_get_level(void);
void st_log(st_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ST_WARN(...) st_log(ST_LOG_WARN, __VA_ARGS__)
#define ST_INFO(...) st_log(ST_LOG_INFO, __VA_ARGS__)
#define ST_DEBUG(...) st_log(ST_LOG_DEBUG, __VA_ARGS__)

#endif /* ST_CORE_LOG_H */
