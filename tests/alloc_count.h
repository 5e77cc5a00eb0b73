/* ==== Counting heap allocations (tests and benchmarks) ====
 *
 * Including this header in a program replaces malloc, calloc, realloc and the aligned
 * allocators with wrappers around glibc's that count calls while `alloc_counting` is set.
 * Allocations made inside libraries are counted too. Include it in one file per program.
 */
#ifndef ST_TESTS_ALLOC_COUNT_H
#define ST_TESTS_ALLOC_COUNT_H

#include <stddef.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int alloc_counting; /* count while non-zero */
static long alloc_count;   /* allocations seen */

void *malloc(size_t n) {
    if (alloc_counting) alloc_count++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    if (alloc_counting) alloc_count++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    if (alloc_counting) alloc_count++;
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t al, size_t n) {
    if (alloc_counting) alloc_count++;
    return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
    if (alloc_counting) alloc_count++;
    *out = __libc_memalign(al, n);
    return *out ? 0 : 12;
}
void free(void *p) { __libc_free(p); }

#endif /* ST_TESTS_ALLOC_COUNT_H */
