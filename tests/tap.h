/* ==== A tiny TAP-style test harness ====
 *
 * Each test program prints "ok N - what" or "not ok N - what (file:line)" per check and a
 * final "# N passed, M failed" line; tests/run.sh counts the lines of every program.
 * Include once per test program.
 */
#ifndef ST_TESTS_TAP_H
#define ST_TESTS_TAP_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_passed, tap_failed;

static int tap_check(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int tap_check(int ok, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", tap_passed + tap_failed + 1);
    vprintf(fmt, ap);
    va_end(ap);
    if (!ok) printf(" (%s:%d)", file, line);
    printf("\n");
    fflush(stdout);
    if (ok) tap_passed++;
    else tap_failed++;
    return ok;
}

/* CHECK(cond, "printf-style description", ...) -> 1 when the check passed */
#define CHECK(cond, ...) tap_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* Print the summary and return the exit status for main(). */
static int tap_done(void) {
    printf("# %d passed, %d failed\n", tap_passed, tap_failed);
    return tap_failed ? 1 : 0;
}

/* Directory holding test data (tests/data by default, run from the repo root). */
__attribute__((unused)) static const char *tap_data_dir(void) {
    const char *d = getenv("STRAND_TEST_DATA");
    return d && *d ? d : "tests/data";
}

#endif /* ST_TESTS_TAP_H */
