/* ==== The CPU backend ====
 *
 * Implements backend/backend.h with the kernel sets of kernels/ (scalar, AVX2, AVX-512, AMX,
 * chosen at run time), a thread pool per context, splits by measured thread speed
 * (core/balance.h) and fp32 activations. Weights are the model's mapped matrices, each given
 * a packed copy in the layout the kernel set reads fastest (and, on a shard, the shard's
 * rows or columns copied out first); the mapped original's pages are then released.
 *
 * Every split of the work is static and none changes the arithmetic: results are the same
 * bits for any thread count and any batch composition (see the notes in cpu_backend.c).
 */
#ifndef ST_BACKEND_CPU_CPU_H
#define ST_BACKEND_CPU_CPU_H

#include <stdint.h>

#include "backend/backend.h"
#include "kernels/kernels.h"

typedef struct st_cpu_params {
    const st_kernels *kernels;  /* NULL = st_kernels_best() */
    int n_threads;              /* threads of each context's pool, the caller included;
                                   0 = st_default_threads() (the online CPUs) */
    int pack;                   /* give matrices packed copies (default 1) */
    int gdn_chunked;            /* 1: whole 64-token chunks at positions that are multiples of
                                   64 use the chunked delta rule; 0: always the per-step form */
    int64_t min_parallel_work;  /* a parallel region with fewer multiply-adds runs on the
                                   calling thread alone; 0 = the default (65536) */
    struct st_comm *comm;       /* borrowed: the job a shard's all-reduces sum over (one rank
                                   a process, dist/comm.h); NULL: none, or an in-process group */
} st_cpu_params;

st_cpu_params st_cpu_default_params(void);

/* A CPU backend for m (borrowed; it must outlive the backend), computing shard (NULL = the
 * whole model). */
st_status st_backend_cpu_create(const st_model *m, const st_cpu_params *p, const st_shard *shard,
                                st_backend **out, st_error *err);

/* The kernel set and the thread count of a CPU backend's contexts, and the bytes of its
 * packed weight copies. */
const st_kernels *st_backend_cpu_kernels(const st_backend *b);
int st_backend_cpu_threads(const st_backend *b);
size_t st_backend_cpu_packed_bytes(const st_backend *b);

/* What a CPU backend's context for p would take on the whole model with n_threads threads
 * (0 = the online CPUs), without making a backend (memory plans made before loading). */
void st_cpu_ctx_plan(const st_model *m, int n_threads, const st_ctx_params *p, st_ctx_plan *out);
/* Bytes of a CPU context's KV pool and state slots (the rest of ctx_bytes is scratch). */
size_t st_bctx_cpu_storage_bytes(const st_bctx *c);
/* A CPU context's thread pool (for benchmarks that must share its threads). */
struct st_pool *st_bctx_cpu_pool(st_bctx *c);
/* 1 when b is a CPU backend. */
int st_backend_is_cpu(const st_backend *b);

/* The shared part of an in-process all-reduce over several CPU backends' contexts run on
 * separate threads (the shard test, and single-process tensor parallelism): every rank adds
 * its buffer, then all read the sum. */
typedef struct st_cpu_group st_cpu_group;
st_status st_cpu_group_create(int world, st_cpu_group **out, st_error *err);
void st_cpu_group_destroy(st_cpu_group *g);
/* Make c's allreduce sum over the group (c is rank `rank`'s context). */
void st_bctx_cpu_join(st_bctx *c, st_cpu_group *g, int rank);

#endif /* ST_BACKEND_CPU_CPU_H */
