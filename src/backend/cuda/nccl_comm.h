/* ==== NCCL for the CUDA backend's all-reduces (private to src/backend/cuda) ====
 *
 * libnccl.so.2 is opened at run time (dlopen), so that the CUDA backend loads where NCCL is
 * not installed and only a job that asks for NCCL needs it. One NCCL communicator joins the
 * job's GPUs: rank 0 makes the unique id and broadcasts it over the job's own communicator
 * (dist/comm.h: MPI), or, for a process on its own, a communicator of one GPU (which runs
 * the same calls: the all-reduce is then a device copy). The sums are fp32 (ncclFloat,
 * ncclSum): every rank gets the same bits (NCCL reduces each element once and sends the
 * result), in NCCL's order rather than rank order.
 */
#ifndef ST_BACKEND_CUDA_NCCL_COMM_H
#define ST_BACKEND_CUDA_NCCL_COMM_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "core/status.h"

struct st_comm;
typedef struct cu_nccl cu_nccl;

/* The NCCL communicator of this process's GPU `device` (current) in job `comm` (borrowed; NULL
 * or world 1: a communicator of one). ST_ERR_UNSUPPORTED when libnccl.so.2 cannot be opened,
 * ST_ERR_IO naming NCCL's error otherwise. */
st_status cu_nccl_create(struct st_comm *comm, int device, cu_nccl **out, st_error *err);
/* buf[count] (device) = its sum over the ranks, enqueued on s; 0, or -1 with the reason in
 * cu_nccl_error (the communicator is then broken: every later call fails) */
int cu_nccl_allreduce(cu_nccl *n, float *buf, size_t count, cudaStream_t s);
/* recv[world][count] (device) = every rank's send[count], in rank order, enqueued on s; as
 * cu_nccl_allreduce */
int cu_nccl_allgather(cu_nccl *n, const float *send, float *recv, size_t count, cudaStream_t s);
/* Wait for stream s's work (which holds this communicator's collectives): 0 when done, -1
 * when NCCL reports an asynchronous error or the work has not finished after timeout_s
 * seconds (a peer died or hangs; the communicator is then aborted, so the stream's
 * collectives end). timeout_s 0 waits for ever. */
int cu_nccl_wait(cu_nccl *n, cudaStream_t s, double timeout_s);
const char *cu_nccl_error(const cu_nccl *n);
int cu_nccl_world(const cu_nccl *n);
/* "NCCL 2.28.3, 2 ranks" */
void cu_nccl_describe(const cu_nccl *n, char *buf, size_t cap);
void cu_nccl_destroy(cu_nccl *n);

#endif /* ST_BACKEND_CUDA_NCCL_COMM_H */
