/* ==== Communicators: the collectives tensor parallelism needs ====
 *
 * A communicator joins the `world` processes of one job (rank 0 .. world-1). strand calls it
 * at the two all-reduces of each layer (after a mixer's output projection and after the
 * MLP/MoE) and nowhere else. The sum is taken in rank order on every rank from every rank's
 * partial (an all-gather, then the adds), so every rank holds the same bits, and the same
 * bits as the in-process shard test (backend/cpu/cpu.h's group).
 *
 * Implementations: MPI (libstrand-mpi.so, opened at run time so that the strand binary
 * never needs MPI's libraries; st_comm_mpi_create). A process on its own needs none (NULL).
 */
#ifndef ST_DIST_COMM_H
#define ST_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct st_comm st_comm;

/* What an implementation provides; each call returns 0, or non-zero with c->error set and
 * c->broken raised. A collective that has not completed on this rank after timeout_s seconds
 * fails (a rank died or hangs: the watchdog); timeout_s 0 waits for ever (a rank waiting
 * for work). Waits poll, and sleep once they last, so that an idle rank takes no core. */
typedef struct st_comm_ops {
    const char *name;
    /* recv[world][bytes]: every rank's send, in rank order (c->timeout_s) */
    int (*allgather)(st_comm *c, const void *send, size_t bytes, void *recv);
    int (*bcast)(st_comm *c, void *buf, size_t bytes, int root, double timeout_s);
    int (*barrier)(st_comm *c);
    /* also ends the library's use: MPI_Finalize, or MPI_Abort (the whole job exits non-zero)
     * when the communicator is broken */
    void (*destroy)(st_comm *c);
} st_comm_ops;

struct st_comm {
    const st_comm_ops *ops;
    int rank, world;
    double timeout_s;        /* the collectives' watchdog (st_comm_mpi_create: 3 s) */
    int broken;              /* a collective failed: every later one fails at once */
    char error[256];
    void *impl;              /* the implementation's */
    int64_t allreduces;      /* st_comm_allreduce_sum calls so far, */
    double allreduce_s;      /* and the seconds spent in them (waiting for the other ranks included) */
    int64_t gathers;         /* st_comm_allgather calls (the logits' vocabulary slices), */
    double gather_s;         /* and their seconds */
};

/* The MPI communicator of this process's job (MPI_COMM_WORLD), initialised with argc/argv
 * (MPI may take its own arguments out). library: libstrand-mpi.so's path, NULL to look next
 * to the executable. ST_ERR_UNSUPPORTED when the library or MPI cannot be loaded. */
st_status st_comm_mpi_create(const char *library, int *argc, char ***argv, st_comm **out, st_error *err);
void st_comm_destroy(st_comm *c);

/* buf[n] = the sum over the ranks of their buf[n], added in rank order; scratch holds
 * world * n floats. ST_ERR_IO naming the failure (a rank gone, a transport error). */
st_status st_comm_allreduce_sum(st_comm *c, float *buf, int64_t n, float *scratch, st_error *err);
/* recv[world][bytes] = every rank's send, in rank order (the watchdog: c->timeout_s) */
st_status st_comm_allgather(st_comm *c, const void *send, size_t bytes, void *recv, st_error *err);
/* buf[bytes] = rank root's; timeout_s as in st_comm_ops (0: wait for ever) */
st_status st_comm_bcast(st_comm *c, void *buf, size_t bytes, int root, double timeout_s, st_error *err);

/* the shared object's entry (libstrand-mpi.so exports ST_COMM_ENTRY_SYMBOL) */
#define ST_COMM_ABI 2
#define ST_COMM_ENTRY_SYMBOL "st_comm_mpi_entry"
typedef struct st_comm_entry {
    int abi;
    /* 0 with *out made, or non-zero with why[cap] */
    int (*create)(int *argc, char ***argv, st_comm **out, char *why, size_t cap);
} st_comm_entry;

#endif /* ST_DIST_COMM_H */
