/* ==== Large zeroed allocations (see mem.h) ==== */
#include "core/mem.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

/* the first unsigned number in a file, or -1 (also for "max") */
static long long read_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* "<key>: <n> kB" of /proc/meminfo (or /proc/self/status) in bytes, or -1 */
static long long read_kb_field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            if (sscanf(line + kl + 1, "%lld", &v) == 1) v *= 1024;
            break;
        }
    fclose(f);
    return v;
}

/* room under this process's cgroup memory limit, or -1 when there is no limit */
static long long cgroup_room(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[1024], v2[900] = "", v1[900] = "";
    if (f) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (!strncmp(line, "0::", 3)) snprintf(v2, sizeof v2, "%.800s", line + 3);
            char *m = strstr(line, ":memory:");
            if (m) snprintf(v1, sizeof v1, "%.800s", m + 8);
        }
        fclose(f);
    }
    const long long unlimited = (long long)1 << 60;
    char a[1100], b[1100];
    long long limit = -1, used = -1;
    /* the process's own group first, then the root the container sees */
    const char *v2dirs[] = {v2, ""}, *v1dirs[] = {v1, ""};
    for (int i = 0; i < 2 && limit < 0; i++) {
        snprintf(a, sizeof a, "/sys/fs/cgroup%s/memory.max", v2dirs[i]);
        snprintf(b, sizeof b, "/sys/fs/cgroup%s/memory.current", v2dirs[i]);
        limit = read_number(a);
        used = read_number(b);
    }
    for (int i = 0; i < 2 && limit < 0; i++) {
        snprintf(a, sizeof a, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", v1dirs[i]);
        snprintf(b, sizeof b, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", v1dirs[i]);
        limit = read_number(a);
        used = read_number(b);
    }
    if (limit < 0 || limit >= unlimited) return -1;
    return used >= 0 && used < limit ? limit - used : 0;
}

size_t st_sysmem_available(void) {
    long long best = read_kb_field("/proc/meminfo", "MemAvailable");
    long long cg = cgroup_room();
    if (cg >= 0 && (best < 0 || cg < best)) best = cg;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        long long vm = read_kb_field("/proc/self/status", "VmSize");
        long long room = (long long)rl.rlim_cur - (vm > 0 ? vm : 0);
        if (room < 0) room = 0;
        if (best < 0 || room < best) best = room;
    }
    return best > 0 ? (size_t)best : 0;
}
