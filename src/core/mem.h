/* ==== Large zeroed allocations (anonymous mappings) ====
 * Pools planned at start (KV blocks, state slots) are mapped, not malloc'ed: the pages are
 * zero and only become resident when first written, and freeing returns them to the OS. */
#ifndef ST_CORE_MEM_H
#define ST_CORE_MEM_H

#include <stddef.h>

/* A zeroed region of `bytes` (page-aligned), or NULL. bytes == 0 returns NULL. */
void *st_big_alloc(size_t bytes);
/* As st_big_alloc, 2 MiB-aligned and advised to use huge pages (when the kernel does them
 * on request), for regions read in long streams (packed weights, recurrent state): one TLB
 * entry per 2 MiB instead of per 4 KiB. Freed with st_big_free. */
void *st_big_alloc_huge(size_t bytes);
void st_big_free(void *p, size_t bytes);

/* Resident set size of this process in bytes (from /proc/self/statm), 0 if unknown. */
size_t st_rss_bytes(void);

/* Memory this process can still make resident, in bytes: the least of the kernel's
 * MemAvailable, the room left under its cgroup's memory limit (v2 memory.max or v1
 * memory.limit_in_bytes) and the room left under RLIMIT_AS. 0 when none is known. */
size_t st_sysmem_available(void);

#endif /* ST_CORE_MEM_H */
