/* ==== The MPI communicator: libstrand-mpi.so (see dist/comm.h) ====
 * Built with mpicc into its own shared object, opened by st_comm_mpi_create. Errors return
 * (MPI_ERRORS_RETURN on a duplicate of MPI_COMM_WORLD) with MPI's message in c->error. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist/comm.h"

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

static int fail(st_comm *c, int rc, const char *what) {
    char m[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, m, &len) != MPI_SUCCESS) snprintf(m, sizeof m, "error %d", rc);
    snprintf(c->error, sizeof c->error, "%s: %.200s", what, m);
    return 1;
}

static int mpi_allgather(st_comm *c, const void *send, size_t bytes, void *recv) {
    if (bytes > (size_t)1 << 30) {
        snprintf(c->error, sizeof c->error, "all-gather of %zu bytes a rank: over 1 GiB", bytes);
        return 1;
    }
    const int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, ((mpi_impl *)c->impl)->comm);
    return rc == MPI_SUCCESS ? 0 : fail(c, rc, "MPI_Allgather");
}

static int mpi_bcast(st_comm *c, void *buf, size_t bytes, int root) {
    if (bytes > (size_t)1 << 30) {
        snprintf(c->error, sizeof c->error, "broadcast of %zu bytes: over 1 GiB", bytes);
        return 1;
    }
    const int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, ((mpi_impl *)c->impl)->comm);
    return rc == MPI_SUCCESS ? 0 : fail(c, rc, "MPI_Bcast");
}

static int mpi_barrier(st_comm *c) {
    const int rc = MPI_Barrier(((mpi_impl *)c->impl)->comm);
    return rc == MPI_SUCCESS ? 0 : fail(c, rc, "MPI_Barrier");
}

static void mpi_destroy(st_comm *c) {
    mpi_impl *m = c->impl;
    MPI_Comm_free(&m->comm);
    free(m);
    free(c);
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

static const st_comm_ops mpi_ops = {"mpi", mpi_allgather, mpi_bcast, mpi_barrier, mpi_destroy};

static int mpi_create(int *argc, char ***argv, st_comm **out, char *why, size_t cap) {
    int provided = 0, rank = 0, world = 1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        snprintf(why, cap, "MPI_Init_thread failed");
        return 1;
    }
    st_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m || MPI_Comm_dup(MPI_COMM_WORLD, &m->comm) != MPI_SUCCESS) {
        free(c);
        free(m);
        snprintf(why, cap, "out of memory or MPI_Comm_dup failed");
        MPI_Finalize();
        return 1;
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &world);
    c->ops = &mpi_ops;
    c->rank = rank;
    c->world = world;
    c->impl = m;
    *out = c;
    return 0;
}

static const st_comm_entry entry = {ST_COMM_ABI, mpi_create};

__attribute__((visibility("default"))) const st_comm_entry *st_comm_mpi_entry(void) { return &entry; }
