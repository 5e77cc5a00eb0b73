/* ==== An in-process communicator: ranks as threads of one process ====
 *
 * For tests (and tools) that run a tensor-parallel job inside one process: world ranks, each
 * driven by its own thread, meet at every collective through shared memory. It implements
 * dist/comm.h's operations like MPI does (every rank's send, in rank order), so that
 * backends and the relay run exactly as in an mpirun job. A collective that some rank has not
 * joined after timeout_s seconds fails and breaks every rank's communicator (0 waits for
 * ever, as a follower waiting for work does).
 */
#ifndef ST_DIST_COMM_LOCAL_H
#define ST_DIST_COMM_LOCAL_H

#include "dist/comm.h"

/* ranks[world] = the communicators of ranks 0 .. world-1 (each st_comm_destroy'ed by its own
 * thread or by the caller; the shared part goes with the last). ST_ERR_ARG for world < 1. */
st_status st_comm_local_create(int world, double timeout_s, st_comm **ranks, st_error *err);

#endif /* ST_DIST_COMM_LOCAL_H */
