/* ==== The forward pass of a Qwen3.5-family text model: the layer loop, once ====
 *
 * A step is a ragged batch described by a plan (backend/backend.h st_step_plan: token ids,
 * each item's token range, first position, state slot and KV blocks, which rows need
 * logits). st_fwd_run checks the plan against the context's capacities and the model, then
 * names, layer by layer, which backend operation runs on which buffer with which weight:
 * embedding, residual add + norm, projections, the Gated DeltaNet or attention mixer, its
 * output projection, the all-reduce of a shard's partial sums, the MLP or MoE, the final
 * norm and the LM head rows. Nothing here knows threads, instruction sets or devices; the
 * backend does (backend/cpu/ today).
 *
 * A forward context (st_fwd) owns one backend context (activations for max_tokens tokens,
 * the KV blocks and state slots) and one plan buffer of fixed capacities, which the engine
 * fills (engine/batch.h) and st_fwd_run reads. st_fwd_run allocates nothing.
 *
 * Thread ownership: one thread at a time calls st_fwd_run on a context.
 */
#ifndef ST_MODEL_FORWARD_H
#define ST_MODEL_FORWARD_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"
#include "model/model.h"

/* Called with the residual stream: index 0 = embeddings, i = input of layer i, n_layers =
 * after the final norm (the same convention as transformers' hidden_states). */
typedef void (*st_hidden_hook)(void *user, int index, int64_t n_tokens, int64_t dim,
                               const float *hidden);

typedef struct st_fwd st_fwd;

/* A context on backend b (borrowed; it must outlive the context) sized by p. */
st_status st_fwd_create(st_backend *b, const st_ctx_params *p, st_fwd **out, st_error *err);
void st_fwd_destroy(st_fwd *f);

/* The plan buffer steps are built in (capacities: p's slots, tokens, and blocks). */
st_plan_buf *st_fwd_plan_buf(st_fwd *f);

/* Run one step. logits: [plan->n_logit_rows][vocab] floats, rows in item order (NULL: none
 * computed; the other ranks of a job). A plan that does not fit the context or the model
 * (token ids, slots, positions, blocks) is refused with ST_ERR_ARG or ST_ERR_LIMIT before
 * anything is computed. On rank 0 of a job the plan goes to the other ranks first
 * (dist/relay.h); ST_ERR_IO when the job is broken. */
st_status st_fwd_run(st_fwd *f, const st_step_plan *plan, float *logits, st_error *err);

/* Between steps: copy state slot `from` to `to` (both in [0, n_slots + n_snapshots)), or KV
 * block `from` to `to` (every full-attention layer); relayed like steps. */
void st_fwd_state_copy(st_fwd *f, int from, int to);
void st_fwd_kv_copy(st_fwd *f, int32_t from, int32_t to);

/* Let plans carry embeddings (st_step_plan.n_embeds: images): the host buffer of X it takes.
 * Without it such a plan is refused. */
st_status st_fwd_enable_embeds(st_fwd *f, st_error *err);

/* Call hook with the residual stream of every step (NULL: none). ST_ERR_NOMEM when the copy
 * buffer cannot be had. */
st_status st_fwd_set_hidden_hook(st_fwd *f, st_hidden_hook hook, void *user, st_error *err);

/* Host memory for the logits st_fwd_run writes, in the form the backend fills fastest
 * (page-locked for a GPU; malloc'd otherwise); NULL when out of memory. Free it with
 * st_fwd_host_free before the backend is destroyed. */
void *st_fwd_host_alloc(st_fwd *f, size_t bytes);
void st_fwd_host_free(st_fwd *f, void *p);

const st_ctx_params *st_fwd_params(const st_fwd *f);
st_backend *st_fwd_backend(st_fwd *f);
st_bctx *st_fwd_ctx(st_fwd *f);
/* Bytes the context holds (backend context, plan buffer). */
size_t st_fwd_bytes(const st_fwd *f);

#endif /* ST_MODEL_FORWARD_H */
