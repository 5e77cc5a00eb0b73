/* ==== The CUDA backend, loaded at run time ====
 *
 * The CUDA code lives in a shared object (build/libstrand-cuda.so, built when nvcc is
 * present) that this loader opens with dlopen when a CUDA backend is asked for, so the
 * strand binary starts on machines with no GPU, no driver and no CUDA libraries. Asking for
 * it there is an error that says why (no library, no driver, no device).
 *
 * The backend implements backend/backend.h on one GPU: weights uploaded once, the KV pool,
 * state slots and every scratch buffer allocated with the context (a step allocates no
 * device memory; st_backend_cuda_device_allocs counts every allocation), one stream per
 * context, the plan uploaded in one copy at step_begin, results synchronized at step_end.
 * Numerics: fp32 activations, accumulation and state ("exact").
 */
#ifndef ST_BACKEND_CUDA_H
#define ST_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct st_cuda_params {
    int device;             /* CUDA device index */
    st_precision precision; /* exact: tensor-core products take the activations in three bf16
                               parts; bf16: rounded to bf16 */
    int no_tensor_cores;    /* 1: bf16 matrices on the CUDA cores too (fp32 FMAs; for comparison) */
    const char *library;    /* path of libstrand-cuda.so; NULL = next to the executable, or
                               one folder up from it (tests), or the loader's search path */
    struct st_comm *comm;   /* borrowed: the job this process is one rank of (dist/comm.h), or
                               NULL. With world > 1 the backend computes its rank's shard */
    int nccl;               /* 1: the all-reduces and the logits' gathers run over NCCL between
                               the job's GPUs (alone: a communicator of one GPU, the same
                               calls); 0: through host memory over comm */
} st_cuda_params;

st_cuda_params st_cuda_default_params(void);

/* A CUDA backend for m (borrowed): the whole model, or with p->comm of world > 1 the shard
 * of its rank (st_shard_make). ST_ERR_UNSUPPORTED when the library, the driver or the device
 * is missing (the message says which) or the shard is one the kernels do not take. */
st_status st_backend_cuda_create(const st_model *m, const st_cuda_params *p, st_backend **out,
                                 st_error *err);

/* 1 when a CUDA backend can be made here; else 0 with the reason in why. */
int st_cuda_available(const st_cuda_params *p, char *why, size_t why_cap);

/* 1 when b is a CUDA backend. */
int st_backend_is_cuda(const st_backend *b);

/* Device allocations the backend and its contexts have made since it was created. */
int64_t st_backend_cuda_device_allocs(const st_backend *b);

/* The device memory free now and in all (cudaMemGetInfo); 0, 0 when b is not a CUDA backend. */
void st_backend_cuda_memory(const st_backend *b, size_t *free_bytes, size_t *total_bytes);

/* The device's copy bandwidth (bytes read plus bytes written per second, GB/s) over two
 * buffers of `bytes`: the better of a copy kernel and cudaMemcpy, best of several passes; 0 on
 * failure. read_gbs (may be NULL): the rate of reading alone, as a decode step reads its
 * weights. */
double st_backend_cuda_copy_bandwidth(const st_backend *b, size_t bytes, double *read_gbs);

/* The device's name and memory (for reports); "" when b is not a CUDA backend. */
void st_backend_cuda_describe(const st_backend *b, char *buf, size_t cap);

/* Decode steps of context c captured as CUDA graphs and graph launches so far (0, 0 when c
 * is not a CUDA context). A decode step (one token per item) of a dense model is captured
 * once per item count and replayed after. */
void st_bctx_cuda_graphs(const st_bctx *c, int64_t *captures, int64_t *launches);

/* Device time by kind of operation (profiling; `strand bench --op-times`). While a context
 * times its ops, its steps run eagerly (no graphs) and each operation is bracketed by two
 * events on the context's stream; step_end adds the times up by kind. */
#define ST_CUDA_OP_KINDS 16
typedef struct st_cuda_op_times {
    int n;                               /* kinds */
    const char *name[ST_CUDA_OP_KINDS];  /* static strings */
    double ms[ST_CUDA_OP_KINDS];         /* device milliseconds since the last read */
    int64_t calls[ST_CUDA_OP_KINDS];
    int64_t untimed;                     /* ops past the events' capacity in a step */
} st_cuda_op_times;

/* Start (on = 1) or stop timing c's ops; -1 when c is not a CUDA context or its events
 * cannot be made (made once, on the first start: 2 per op of a step). */
int st_bctx_cuda_time_ops(st_bctx *c, int on);
/* The times since the last read (then cleared); n = 0 when c is not a CUDA context. */
void st_bctx_cuda_op_times(st_bctx *c, st_cuda_op_times *out);

/* The vision tower v (borrowed: its weights are copied) on the device p names, for
 * st_vision_set_device (vision/tower.h). ST_ERR_UNSUPPORTED where no CUDA device is usable. */
struct st_vision_tower;
struct st_vision_device;
st_status st_cuda_vision_create(const st_cuda_params *p, const struct st_vision_tower *v,
                                struct st_vision_device **out, st_error *err);

/* ---- the entry points the shared object exports (the loader's side of the contract) ---- */
#define ST_CUDA_ABI 6
typedef struct st_cuda_entry {
    int abi;                                /* ST_CUDA_ABI */
    const st_backend_ops *ops;              /* the ops table (identifies its backends) */
    st_status (*create)(const st_model *m, const st_cuda_params *p, const st_shard *shard,
                        st_backend **out, st_error *err);
    int (*available)(int device, char *why, size_t why_cap);
    int64_t (*device_allocs)(const st_backend *b);
    void (*describe)(const st_backend *b, char *buf, size_t cap);
    void (*memory)(const st_backend *b, size_t *free_bytes, size_t *total_bytes);
    double (*bandwidth)(const st_backend *b, size_t bytes, double *read_gbs);
    void (*graphs)(const st_bctx *c, int64_t *captures, int64_t *launches);
    int (*time_ops)(st_bctx *c, int on);
    void (*op_times)(st_bctx *c, st_cuda_op_times *out);
    st_status (*vision_create)(const struct st_vision_tower *v, int device, struct st_vision_device **out,
                               st_error *err);
} st_cuda_entry;
/* the symbol: const st_cuda_entry *st_cuda_entry_get(void) */
#define ST_CUDA_ENTRY_SYMBOL "st_cuda_entry_get"

#endif /* ST_BACKEND_CUDA_H */
