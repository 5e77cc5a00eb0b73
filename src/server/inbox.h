/* ==== A single-producer single-consumer ring of records ====
 *
 * How a stream's events travel from the scheduler thread to the HTTP thread that formats
 * them: the producer appends records (several parts copied one after another), the consumer
 * takes them in order, and neither ever waits for the other (no lock: two counters, one
 * written by each side, with release/acquire ordering). The ring's size is fixed at
 * creation; a record that does not fit is refused (the producer pauses its sequence before
 * that can happen: st_inbox_free_bytes).
 *
 * Thread ownership: one producer thread and one consumer thread at a time.
 */
#ifndef ST_SERVER_INBOX_H
#define ST_SERVER_INBOX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct st_inbox {
    uint8_t *buf;                /* [cap] owned */
    size_t cap;
    _Atomic uint64_t head;       /* bytes ever written (the producer's) */
    _Atomic uint64_t tail;       /* bytes ever read (the consumer's) */
} st_inbox;

/* A ring of cap bytes (records take their length plus 8). */
st_status st_inbox_init(st_inbox *ib, size_t cap, st_error *err);
void st_inbox_free(st_inbox *ib);

/* Producer: bytes a record may still take (its parts' total). */
size_t st_inbox_room(const st_inbox *ib);
/* Producer: append one record made of n parts; 0 (nothing written) when it does not fit. */
int st_inbox_put(st_inbox *ib, const void *const *parts, const size_t *lens, int n);

/* Consumer: the length of the next record, or -1 when there is none. */
int64_t st_inbox_next_len(const st_inbox *ib);
/* Consumer: take the next record into dst (cap bytes, at least its length); returns its
 * length, -1 when there is none, -2 when dst is too small (nothing taken). */
int64_t st_inbox_take(st_inbox *ib, void *dst, size_t cap);

#endif /* ST_SERVER_INBOX_H */
