/* ==== Large zeroed allocations (see mem.h) ==== */
#include "core/mem.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

void *st_big_alloc(size_t bytes) {
    if (bytes == 0) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
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
