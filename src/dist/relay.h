/* ==== The relay: rank 0's forward contexts, replayed on every other rank ====
 *
 * Under tensor parallelism one process drives the model: rank 0 runs the command (the
 * server's scheduler, generate, bench, ...). Its forward contexts (model/forward.h), made on
 * a backend whose communicator it is rank 0 of, send every context creation, step plan,
 * state or KV copy and context end to the other ranks as broadcasts of plain data (a fixed
 * header, then the plan's arrays packed in one buffer, then any image embedding rows). The
 * other ranks run st_relay_follow on their shard's backend: it makes the same contexts and
 * runs the same steps, so that each of their all-reduces meets rank 0's. The LM head is
 * whole on every rank and only rank 0 computes logits; the sampled tokens reach the other
 * ranks as the next step's plan.
 *
 * Faults: rank 0's sends wait at most the communicator's timeout (a rank that died or
 * hangs is an error there); a follower waits for the next message for ever (rank 0 may be
 * idle for hours), sleeping between polls.
 */
#ifndef ST_DIST_RELAY_H
#define ST_DIST_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

/* Bytes of a step's packed arrays at most, for a context of p whose plans hold at most
 * cap_blocks KV block ids (rank 0 packs into a buffer this size; a follower receives). */
size_t st_relay_step_bytes(const st_ctx_params *p, int64_t cap_blocks);

/* ---- rank 0 (b->comm->rank == 0; each returns ST_ERR_IO when the job is broken) ---- */
st_status st_relay_ctx_create(st_backend *b, int id, const st_ctx_params *p, st_error *err);
st_status st_relay_ctx_destroy(st_backend *b, int id, st_error *err);
st_status st_relay_enable_embeds(st_backend *b, int id, st_error *err);
/* the plan (already checked against the context) packed into pack[st_relay_step_bytes] */
st_status st_relay_step(st_backend *b, int id, const st_step_plan *plan, void *pack, st_error *err);
st_status st_relay_state_copy(st_backend *b, int id, int from, int to, st_error *err);
st_status st_relay_kv_copy(st_backend *b, int id, int32_t from, int32_t to, st_error *err);
/* the job's work is over: every follower returns (once; st_backend_destroy calls it too) */
st_status st_relay_end(st_backend *b, st_error *err);

/* ---- every other rank ---- */
/* Replay rank 0's contexts and steps on b (this rank's shard) until st_relay_end: ST_OK,
 * or the error that stopped it (a context that could not be made, a broken job). */
st_status st_relay_follow(st_backend *b, st_error *err);

#endif /* ST_DIST_RELAY_H */
