/* ==== SPSC ring of records (see inbox.h) ====
 * A record is a uint64 length, then its bytes, then padding to 8: the length never wraps
 * around the end of the ring (it is 8-aligned), the bytes may. */
#include "server/inbox.h"

#include <stdlib.h>
#include <string.h>

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

st_status st_inbox_init(st_inbox *ib, size_t cap, st_error *err) {
    memset(ib, 0, sizeof *ib);
    cap = pad8(cap < 64 ? 64 : cap);
    ib->buf = malloc(cap);
    if (!ib->buf) return st_error_set(err, ST_ERR_NOMEM, "out of memory for a %zu-byte inbox", cap);
    ib->cap = cap;
    atomic_init(&ib->head, 0);
    atomic_init(&ib->tail, 0);
    return ST_OK;
}

void st_inbox_free(st_inbox *ib) {
    if (!ib) return;
    free(ib->buf);
    ib->buf = NULL;
    ib->cap = 0;
}

size_t st_inbox_room(const st_inbox *ib) {
    const uint64_t head = atomic_load_explicit(&ib->head, memory_order_relaxed);
    const uint64_t tail = atomic_load_explicit(&ib->tail, memory_order_acquire);
    const size_t free_bytes = ib->cap - (size_t)(head - tail);
    return free_bytes >= 8 + 8 ? (free_bytes - 8) & ~(size_t)7 : 0;
}

/* copy n bytes to/from ring offset `at` (mod cap), wrapping */
static void ring_write(st_inbox *ib, uint64_t at, const void *src, size_t n) {
    const size_t o = (size_t)(at % ib->cap), first = n < ib->cap - o ? n : ib->cap - o;
    memcpy(ib->buf + o, src, first);
    if (n > first) memcpy(ib->buf, (const uint8_t *)src + first, n - first);
}
static void ring_read(const st_inbox *ib, uint64_t at, void *dst, size_t n) {
    const size_t o = (size_t)(at % ib->cap), first = n < ib->cap - o ? n : ib->cap - o;
    memcpy(dst, ib->buf + o, first);
    if (n > first) memcpy((uint8_t *)dst + first, ib->buf, n - first);
}

int st_inbox_put(st_inbox *ib, const void *const *parts, const size_t *lens, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += lens[i];
    if (len > st_inbox_room(ib)) return 0;
    uint64_t at = atomic_load_explicit(&ib->head, memory_order_relaxed);
    const uint64_t len64 = len;
    ring_write(ib, at, &len64, 8);
    uint64_t p = at + 8;
    for (int i = 0; i < n; i++) {
        if (lens[i]) ring_write(ib, p, parts[i], lens[i]);
        p += lens[i];
    }
    /* the bytes before the new head: visible to a consumer that reads it */
    atomic_store_explicit(&ib->head, at + 8 + pad8(len), memory_order_seq_cst);
    return 1;
}

int64_t st_inbox_next_len(const st_inbox *ib) {
    const uint64_t tail = atomic_load_explicit(&ib->tail, memory_order_relaxed);
    const uint64_t head = atomic_load_explicit(&ib->head, memory_order_seq_cst);
    if (head == tail) return -1;
    uint64_t len;
    ring_read(ib, tail, &len, 8);
    return (int64_t)len;
}

int64_t st_inbox_take(st_inbox *ib, void *dst, size_t cap) {
    const int64_t len = st_inbox_next_len(ib);
    if (len < 0) return -1;
    if ((size_t)len > cap) return -2;
    const uint64_t tail = atomic_load_explicit(&ib->tail, memory_order_relaxed);
    ring_read(ib, tail + 8, dst, (size_t)len);
    /* the bytes are copied out: the producer may write over them */
    atomic_store_explicit(&ib->tail, tail + 8 + pad8((size_t)len), memory_order_release);
    return len;
}
