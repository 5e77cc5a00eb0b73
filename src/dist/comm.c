/* ==== Communicators (see comm.h) ==== */
#include "dist/comm.h"

#include <dlfcn.h>
#include <string.h>

#include "core/clock.h"
#include "core/plugin.h"

st_status st_comm_mpi_create(const char *library, int *argc, char ***argv, st_comm **out, st_error *err) {
    *out = NULL;
    char why[400];
    void *h = st_plugin_open("libstrand-mpi.so", library, why, sizeof why);
    if (!h)
        return st_error_set(err, ST_ERR_UNSUPPORTED,
                            "MPI: libstrand-mpi.so could not be loaded (%s); build strand where mpicc is installed", why);
    const st_comm_entry *(*get)(void) = (const st_comm_entry *(*)(void))dlsym(h, ST_COMM_ENTRY_SYMBOL);
    const st_comm_entry *e = get ? get() : NULL;
    if (!e || e->abi != ST_COMM_ABI) {
        dlclose(h);
        return st_error_set(err, ST_ERR_UNSUPPORTED, "MPI: libstrand-mpi.so is not of this strand version");
    }
    if (e->create(argc, argv, out, why, sizeof why) != 0) return st_error_set(err, ST_ERR_UNSUPPORTED, "MPI: %s", why);
    return ST_OK; /* the library stays open: its code runs until the process ends */
}

void st_comm_destroy(st_comm *c) {
    if (c) c->ops->destroy(c);
}

st_status st_comm_allreduce_sum(st_comm *c, float *buf, int64_t n, float *scratch, st_error *err) {
    if (c->world == 1) return ST_OK;
    if (c->broken) return st_error_set(err, ST_ERR_IO, "the job is broken: %s", c->error);
    const double t0 = st_now_s();
    if (c->ops->allgather(c, buf, (size_t)n * sizeof(float), scratch) != 0)
        return st_error_set(err, ST_ERR_IO, "all-reduce over %d ranks failed: %s", c->world, c->error);
    for (int64_t e = 0; e < n; e++) {
        float s = scratch[e];
        for (int r = 1; r < c->world; r++) s += scratch[(int64_t)r * n + e];
        buf[e] = s;
    }
    c->allreduces++;
    c->allreduce_s += st_now_s() - t0;
    return ST_OK;
}

st_status st_comm_allgather(st_comm *c, const void *send, size_t bytes, void *recv, st_error *err) {
    if (c->world == 1) {
        memcpy(recv, send, bytes);
        return ST_OK;
    }
    if (c->broken) return st_error_set(err, ST_ERR_IO, "the job is broken: %s", c->error);
    const double t0 = st_now_s();
    if (c->ops->allgather(c, send, bytes, recv) != 0)
        return st_error_set(err, ST_ERR_IO, "all-gather over %d ranks failed: %s", c->world, c->error);
    c->gathers++;
    c->gather_s += st_now_s() - t0;
    return ST_OK;
}

st_status st_comm_bcast(st_comm *c, void *buf, size_t bytes, int root, double timeout_s, st_error *err) {
    if (c->world == 1) return ST_OK;
    if (c->broken) return st_error_set(err, ST_ERR_IO, "the job is broken: %s", c->error);
    if (c->ops->bcast(c, buf, bytes, root, timeout_s) != 0)
        return st_error_set(err, ST_ERR_IO, "broadcast from rank %d failed: %s", root, c->error);
    return ST_OK;
}
