/* ==== NCCL for the CUDA backend (see nccl_comm.h) ==== */
#define _POSIX_C_SOURCE 200809L
#include "backend/cuda/nccl_comm.h"
#include "backend/cuda/cu_dl.h"
#include "backend/cuda/cu_error.h"

#include <dlfcn.h>
#include <pthread.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm.h"

/* the library's entry points this backend calls */
typedef struct nccl_api {
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api;

/* The library, opened once a process and never closed: NCCL keeps threads and state of its
 * own, which must not outlive its code. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void *g_lib;
static nccl_api g_api;
static char g_why[300];

static void open_nccl(void) {
    g_lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) g_lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        snprintf(g_why, sizeof g_why, "libnccl.so.2 could not be opened (%.200s)", dlerror());
        return;
    }
    const cu_dl_sym syms[] = {
        {(void **)&g_api.get_version, "ncclGetVersion"},      {(void **)&g_api.get_unique_id, "ncclGetUniqueId"},
        {(void **)&g_api.comm_init_rank, "ncclCommInitRank"},  {(void **)&g_api.all_reduce, "ncclAllReduce"},
        {(void **)&g_api.all_gather, "ncclAllGather"},         {(void **)&g_api.async_error, "ncclCommGetAsyncError"},
        {(void **)&g_api.comm_abort, "ncclCommAbort"},         {(void **)&g_api.comm_destroy, "ncclCommDestroy"},
        {(void **)&g_api.error_string, "ncclGetErrorString"},
    };
    if (cu_dl_resolve(g_lib, syms, sizeof syms / sizeof syms[0], "libnccl.so.2", g_why, sizeof g_why) != 0)
        g_lib = NULL; /* left open: its code may be mapped by now */
}

struct cu_nccl {
    nccl_api f;         /* the library's entry points (open_nccl's) */
    ncclComm_t comm;    /* owned */
    int rank, world, version;
    int broken;         /* a call failed: every later one fails */
    cudaEvent_t done;   /* cu_nccl_wait's marker, owned */
    char error[256];
};

static int note(cu_nccl *n, ncclResult_t r, const char *what) {
    if (r == ncclSuccess || r == ncclInProgress) return 0;
    snprintf(n->error, sizeof n->error, "NCCL: %s: %s", what, n->f.error_string ? n->f.error_string(r) : "error");
    n->broken = 1;
    return -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

st_status cu_nccl_create(struct st_comm *comm, int device, cu_nccl **out, st_error *err) {
    *out = NULL;
    cu_nccl *n = calloc(1, sizeof *n);
    if (!n) return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    pthread_once(&g_once, open_nccl);
    if (!g_lib) {
        free(n);
        return cu_error_set(err, ST_ERR_UNSUPPORTED,
                            "NCCL: %s; install NCCL or run the all-reduces through the host (STRAND_NCCL=0)", g_why);
    }
    n->f = g_api;
    n->rank = comm ? comm->rank : 0;
    n->world = comm ? comm->world : 1;
    n->f.get_version(&n->version);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (n->rank == 0) r = n->f.get_unique_id(&id);
    if (note(n, r, "ncclGetUniqueId") == 0 && n->world > 1) { /* rank 0's id to every rank, over the job's comm */
        if (comm->broken || comm->ops->bcast(comm, &id, sizeof id, 0, comm->timeout_s) != 0) {
            snprintf(n->error, sizeof n->error, "NCCL: sending the unique id: %.200s", comm->error);
            n->broken = 1;
        }
    }
    cudaSetDevice(device);
    if (!n->broken && note(n, n->f.comm_init_rank(&n->comm, n->world, id, n->rank), "ncclCommInitRank") != 0 &&
        n->world > 1) { /* NCCL takes one rank a GPU */
        const size_t at = strlen(n->error);
        snprintf(n->error + at, sizeof n->error - at,
                 " (each rank needs a GPU of its own; STRAND_NCCL=0 runs the all-reduces through the host)");
    }
    if (!n->broken && cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        snprintf(n->error, sizeof n->error, "NCCL: cannot make an event");
        n->broken = 1;
    }
    if (n->broken) {
        st_status st = cu_error_set(err, ST_ERR_IO, "%s", n->error);
        cu_nccl_destroy(n);
        return st;
    }
    *out = n;
    return ST_OK;
}

int cu_nccl_allreduce(cu_nccl *n, float *buf, size_t count, cudaStream_t s) {
    if (n->broken) return -1;
    return note(n, n->f.all_reduce(buf, buf, count, ncclFloat, ncclSum, n->comm, s), "ncclAllReduce");
}

int cu_nccl_allgather(cu_nccl *n, const float *send, float *recv, size_t count, cudaStream_t s) {
    if (n->broken) return -1;
    return note(n, n->f.all_gather(send, recv, count, ncclFloat, n->comm, s), "ncclAllGather");
}

int cu_nccl_wait(cu_nccl *n, cudaStream_t s, double timeout_s) {
    if (n->broken) return -1;
    cudaError_t e = cudaEventRecord(n->done, s);
    if (e != cudaSuccess) {
        snprintf(n->error, sizeof n->error, "NCCL: waiting for a step: %s", cudaGetErrorString(e));
        return -1; /* a device error: the step reports it */
    }
    const double t0 = now_s();
    for (;;) {
        e = cudaEventQuery(n->done);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return 0; /* a device error: the step's own check reports it */
        ncclResult_t ae = ncclSuccess;
        if (n->f.async_error(n->comm, &ae) != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress)) {
            note(n, ae != ncclSuccess ? ae : ncclSystemError, "a collective failed (a rank died?)");
            n->f.comm_abort(n->comm);
            n->comm = NULL;
            return -1;
        }
        const double waited = now_s() - t0;
        if (timeout_s > 0 && waited >= timeout_s) {
            snprintf(n->error, sizeof n->error,
                     "NCCL: a step's collectives did not complete within %.1f s on %d ranks (a rank died or hangs)",
                     timeout_s, n->world);
            n->broken = 1;
            n->f.comm_abort(n->comm);
            n->comm = NULL;
            return -1;
        }
        if (waited > 0.002) {
            struct timespec ts = {0, waited > 0.1 ? 1000000 : 20000};
            nanosleep(&ts, NULL);
        }
    }
}

const char *cu_nccl_error(const cu_nccl *n) { return n->error; }
int cu_nccl_world(const cu_nccl *n) { return n->world; }

void cu_nccl_describe(const cu_nccl *n, char *buf, size_t cap) {
    const int v = n->version;
    /* NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9 */
    snprintf(buf, cap, "NCCL %d.%d.%d, %d rank%s", v / 10000, v / 100 % 100, v % 100, n->world, n->world == 1 ? "" : "s");
}

void cu_nccl_destroy(cu_nccl *n) {
    if (!n) return;
    if (n->comm) {
        if (n->broken) n->f.comm_abort(n->comm);
        else n->f.comm_destroy(n->comm);
    }
    if (n->done) cudaEventDestroy(n->done);
    free(n);
}
