/* ==== String -> integer hash map (see strmap.h) ==== */
#include "core/strmap.h"

#include <stdlib.h>
#include <string.h>

uint32_t st_hash_bytes(const void *data, size_t len) {
    const uint8_t *p = data;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

int st_strmap_init(st_strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    m->buckets = calloc(cap, sizeof *m->buckets);
    m->cap = m->buckets ? cap : 0;
    m->count = 0;
    return m->buckets ? 0 : -1;
}

void st_strmap_free(st_strmap *m) {
    if (!m) return;
    free(m->buckets);
    m->buckets = NULL;
    m->cap = m->count = 0;
}

static st_strmap_entry *find_slot(st_strmap_entry *b, size_t cap, const char *key, size_t len,
                                  uint32_t h) {
    size_t i = h & (cap - 1);
    for (;;) {
        st_strmap_entry *e = &b[i];
        if (!e->key) return e;
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) return e;
        i = (i + 1) & (cap - 1);
    }
}

static int grow(st_strmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 16;
    st_strmap_entry *nb = calloc(ncap, sizeof *nb);
    if (!nb) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        st_strmap_entry *e = &m->buckets[i];
        if (!e->key) continue;
        *find_slot(nb, ncap, e->key, e->len, e->hash) = *e;
    }
    free(m->buckets);
    m->buckets = nb;
    m->cap = ncap;
    return 0;
}

int st_strmap_put(st_strmap *m, const char *key, size_t len, int64_t value) {
    if ((m->count + 1) * 4 > m->cap * 3 && grow(m) != 0) return -1;
    uint32_t h = st_hash_bytes(key, len);
    st_strmap_entry *e = find_slot(m->buckets, m->cap, key, len, h);
    if (e->key) {
        e->value = value;
        return 0;
    }
    e->key = key;
    e->len = (uint32_t)len;
    e->hash = h;
    e->value = value;
    m->count++;
    return 1;
}

int st_strmap_get(const st_strmap *m, const char *key, size_t len, int64_t *value) {
    if (!m->cap) return 0;
    uint32_t h = st_hash_bytes(key, len);
    const st_strmap_entry *e = find_slot(m->buckets, m->cap, key, len, h);
    if (!e->key) return 0;
    if (value) *value = e->value;
    return 1;
}
