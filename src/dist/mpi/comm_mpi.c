/* ==== The MPI communicator: libstrand-mpi.so (see dist/comm.h) ====
 * Built with mpicc into its own shared object, opened by st_comm_mpi_create. Errors return
 * (MPI_ERRORS_RETURN on a duplicate of MPI_COMM_WORLD) with MPI's message in c->error.
 * Collectives are the non-blocking ones, tested until done or until the watchdog's time
 * (c->timeout_s) has passed: a dead or hung rank is an error, not a hang. MPI is initialised
 * MPI_THREAD_SERIALIZED: one thread at a time calls it (a server's scheduler thread). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dist/comm.h"

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

static int fail(st_comm *c, int rc, const char *what) {
    char m[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, m, &len) != MPI_SUCCESS) snprintf(m, sizeof m, "error %d", rc);
    snprintf(c->error, sizeof c->error, "%s: %.200s", what, m);
    c->broken = 1;
    return 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Test q until it completes (0) or timeout_s passes (1, the job broken; the request is left
 * pending: the job ends with MPI_Abort). Spins for the first 2 ms, then sleeps between
 * tests: 50 us, and 1 ms once it has waited 100 ms (a rank idle for hours takes no core). */
static int wait_for(st_comm *c, MPI_Request *q, double timeout_s, const char *what) {
    const double t0 = now_s();
    for (;;) {
        int done = 0;
        const int rc = MPI_Test(q, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return fail(c, rc, what);
        if (done) return 0;
        const double waited = now_s() - t0;
        if (timeout_s > 0 && waited >= timeout_s) {
            snprintf(c->error, sizeof c->error,
                     "%s: not every one of the %d ranks took part within %.1f s (a rank died or hangs)", what, c->world,
                     timeout_s);
            c->broken = 1;
            return 1;
        }
        if (waited > 0.002) {
            struct timespec ts = {0, waited > 0.1 ? 1000000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static int mpi_allgather(st_comm *c, const void *send, size_t bytes, void *recv) {
    if (bytes > (size_t)1 << 30) {
        snprintf(c->error, sizeof c->error, "all-gather of %zu bytes a rank: over 1 GiB", bytes);
        return 1;
    }
    MPI_Request q;
    const int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, ((mpi_impl *)c->impl)->comm, &q);
    if (rc != MPI_SUCCESS) return fail(c, rc, "MPI_Iallgather");
    return wait_for(c, &q, c->timeout_s, "all-reduce");
}

static int mpi_bcast(st_comm *c, void *buf, size_t bytes, int root, double timeout_s) {
    if (bytes > (size_t)1 << 30) {
        snprintf(c->error, sizeof c->error, "broadcast of %zu bytes: over 1 GiB", bytes);
        return 1;
    }
    MPI_Request q;
    const int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, ((mpi_impl *)c->impl)->comm, &q);
    if (rc != MPI_SUCCESS) return fail(c, rc, "MPI_Ibcast");
    return wait_for(c, &q, timeout_s, "broadcast");
}

static int mpi_barrier(st_comm *c) {
    MPI_Request q;
    const int rc = MPI_Ibarrier(((mpi_impl *)c->impl)->comm, &q);
    if (rc != MPI_SUCCESS) return fail(c, rc, "MPI_Ibarrier");
    return wait_for(c, &q, c->timeout_s, "barrier");
}

static void mpi_destroy(st_comm *c) {
    mpi_impl *m = c->impl;
    if (c->broken) { /* a collective is left pending: Finalize could wait for ever */
        fprintf(stderr, "strand: rank %d: ending the job (%s)\n", c->rank, c->error);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
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
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        snprintf(why, cap, "MPI_Init_thread failed");
        return 1;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(why, cap, "this MPI cannot be called from more than one thread (MPI_THREAD_SERIALIZED)");
        MPI_Finalize();
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
    c->timeout_s = 3.0;
    c->impl = m;
    *out = c;
    return 0;
}

static const st_comm_entry entry = {ST_COMM_ABI, mpi_create};

__attribute__((visibility("default"))) const st_comm_entry *st_comm_mpi_entry(void) { return &entry; }
