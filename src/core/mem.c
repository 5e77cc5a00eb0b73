/* ==== Large zeroed allocations (see mem.h) ==== */
#include "core/mem.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

void *st_big_alloc(size_t bytes) {
    if (bytes == 0) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void *st_big_alloc_huge(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) return st_big_alloc(bytes);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    bytes = (bytes + page - 1) / page * page;
    uint8_t *raw = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    /* keep the 2 MiB-aligned span of `bytes`; give back the slop on both sides */
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    const size_t tail = (size_t)(raw + bytes + huge - (p + bytes));
    if (tail) munmap(p + bytes, tail);
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it the span still works */
#endif
    return p;
}

void st_big_free(void *p, size_t bytes) {
    if (p && bytes) munmap(p, bytes);
}

size_t st_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, resident = 0;
    int n = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    if (n != 2) return 0;
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}
