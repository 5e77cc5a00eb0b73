/* ==== Counting heap allocations (tests and benchmarks) ====
 *
 * Including this header in a program replaces malloc, calloc, realloc and the aligned
 * allocators with wrappers around glibc's that count calls while `alloc_counting` is set.
 * Allocations made inside libraries are counted too. Include it in one file per program.
 * Under AddressSanitizer, which owns the allocator, the sanitizer's allocation hook counts
 * instead (the same calls are seen).
 *
 * alloc_count_one_thread(): from then on only the calling thread's allocations go to
 * alloc_count, the other threads' to alloc_count_others (a GPU driver's own threads
 * allocate now and then, whatever the program does).
 */
#ifndef ST_TESTS_ALLOC_COUNT_H
#define ST_TESTS_ALLOC_COUNT_H

#include <pthread.h>
#include <stddef.h>

static int alloc_counting;       /* count while non-zero */
static long alloc_count;         /* allocations seen */
static long alloc_count_others;  /* after alloc_count_one_thread: the other threads' */
static int alloc_one_thread;
static pthread_t alloc_thread;

static inline void alloc_count_one_thread(void) {
    alloc_thread = pthread_self();
    alloc_one_thread = 1;
}
static inline void alloc_seen(void) {
    if (!alloc_counting) return;
    if (alloc_one_thread && !pthread_equal(pthread_self(), alloc_thread)) alloc_count_others++;
    else alloc_count++;
}

#if defined(__SANITIZE_ADDRESS__)
#define ST_ALLOC_COUNT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ST_ALLOC_COUNT_ASAN 1
#endif
#endif

#ifdef ST_ALLOC_COUNT_ASAN
#include <sanitizer/allocator_interface.h>

static void alloc_count_hook(const volatile void *p, size_t n) {
    (void)p, (void)n;
    alloc_seen();
}
static void alloc_count_free_hook(const volatile void *p) { (void)p; } /* both are required */
__attribute__((constructor)) static void alloc_count_install(void) {
    __sanitizer_install_malloc_and_free_hooks(alloc_count_hook, alloc_count_free_hook);
}
#else

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

void *malloc(size_t n) {
    alloc_seen();
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    alloc_seen();
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    alloc_seen();
    return __libc_realloc(p, n);
}
void *aligned_alloc(size_t al, size_t n) {
    alloc_seen();
    return __libc_memalign(al, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
    alloc_seen();
    *out = __libc_memalign(al, n);
    return *out ? 0 : 12;
}
void free(void *p) { __libc_free(p); }
#endif /* ST_ALLOC_COUNT_ASAN */

#endif /* ST_TESTS_ALLOC_COUNT_H */
