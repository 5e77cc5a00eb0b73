/* ==== String -> integer hash map (open addressing, FNV-1a) ====
 *
 * Used for tensor names (tens of thousands) and vocabularies (hundreds of thousands).
 * Keys are borrowed: the caller keeps them alive and unchanged while the map exists.
 * Insert-only; lookups take (pointer, length) so keys need not be NUL-terminated.
 */
#ifndef ST_CORE_STRMAP_H
#define ST_CORE_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_strmap_entry {
    const char *key; /* borrowed; NULL marks an empty bucket */
    uint32_t len;
    uint32_t hash;
    int64_t value;
} st_strmap_entry;

typedef struct st_strmap {
    st_strmap_entry *buckets; /* [cap], owned */
    size_t cap;               /* power of two */
    size_t count;
} st_strmap;

/* Initialise for about `expected` keys. Returns 0 on success, -1 on allocation failure. */
int st_strmap_init(st_strmap *m, size_t expected);
void st_strmap_free(st_strmap *m);

/* Insert or overwrite. Returns 1 if inserted, 0 if an existing key was overwritten,
 * -1 on allocation failure. */
int st_strmap_put(st_strmap *m, const char *key, size_t len, int64_t value);

/* Look up; returns 1 and sets *value when found, else 0. */
int st_strmap_get(const st_strmap *m, const char *key, size_t len, int64_t *value);

uint32_t st_hash_bytes(const void *data, size_t len);

#endif /* ST_CORE_STRMAP_H */
