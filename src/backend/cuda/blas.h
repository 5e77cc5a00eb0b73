/* ==== cuBLASLt for the CUDA backend's many-token bf16 products (private to src/backend/cuda) ====
 *
 * libcublasLt (the CUDA toolkit's, .so.13 or .so.12) is opened at run time (dlopen), as NCCL
 * is: the backend loads where it is not installed, and the products then stay on the
 * backend's own kernels. It takes the `bf16` precision's products of many tokens (prefill),
 * which are bound by the tensor cores, not by the bytes: bf16 weights row-major (the backend
 * copies a tiled matrix out into a row-major scratch first), bf16 activations, fp32 sums and
 * output (bf16 output for the `bf16` MLP's gate and up of many tokens), no epilogue. Its
 * summation order is the library's (fixed for a shape, algorithm and GPU: the same bits run
 * to run), not the few-token kernels'. `exact` takes it only where
 * CU_BLAS_EXACT (cuda_kernels.h) says, for bf16 tiled matrices: three products, one for
 * each bf16 part of the activations, the lowest first, the next two added into its output.
 *
 * A handle holds the library's handle and a small cache of the algorithm picked for each
 * shape (the heuristic query costs tens of microseconds on the host), bounded: CU_BLAS_CACHE
 * shapes, the oldest replaced. One handle is used by one thread at a time (a context's). No
 * call allocates device memory: the workspace is the caller's.
 */
#ifndef ST_BACKEND_CUDA_BLAS_H
#define ST_BACKEND_CUDA_BLAS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cu_blas cu_blas;

/* the shapes whose algorithm a handle remembers */
#define CU_BLAS_CACHE 32
/* the workspace a product may use (the library's advice for Hopper: 32 MiB) */
#define CU_BLAS_WORKSPACE ((size_t)32 << 20)

/* A handle for the current device; NULL with the reason in why[cap] where the library cannot
 * be opened or initialized. */
cu_blas *cu_blas_create(char *why, size_t cap);
void cu_blas_destroy(cu_blas *b);
/* "cuBLASLt 13.1.0" */
void cu_blas_describe(const cu_blas *b, char *buf, size_t cap);

/* y[t*ldy + r] = sum_c w[r*ldw + c] xs[t*ldxs + c] for r < rows, t < T, c < cols: w and xs bf16
 * (device), y fp32 (device), enqueued on s with the workspace ws[ws_bytes] (device).
 * accumulate 0: y is overwritten (beta 0); 1: the product is added to y (beta 1, y read
 * first). 0, or -1 where the library takes no algorithm for the shape or fails; the caller
 * then takes its own kernel (after a failed accumulate, y may hold part of the sum). */
int cu_blas_gemm(cu_blas *b, cudaStream_t s, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                 const uint16_t *xs, int64_t ldxs, int64_t T, float *y, int64_t ldy, int accumulate, void *ws,
                 size_t ws_bytes);
/* cu_blas_gemm with the output's type chosen: y_bf16 1, y holds bf16 (the sums rounded to
 * nearest, as the library rounds them), 0 fp32 */
int cu_blas_gemm_to(cu_blas *b, cudaStream_t s, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                    const uint16_t *xs, int64_t ldxs, int64_t T, void *y, int64_t ldy, int y_bf16, int accumulate,
                    void *ws, size_t ws_bytes);

/* For measuring the library's choice (`mmv_bench blastune`): up to cap (at most CU_BLAS_TRY)
 * of the algorithms its heuristic offers for cu_blas_gemm_to's shape (these operands'
 * alignments, this workspace), in its order, the first being the one cu_blas_gemm_to takes;
 * the count, 0 where none. cu_blas_gemm_try runs algorithm k of the last count's (beta 0):
 * 0, or -1 where k is past them or the library fails. */
#define CU_BLAS_TRY 16
int cu_blas_try_count(cu_blas *b, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols, const uint16_t *xs,
                      int64_t ldxs, int64_t T, const void *y, int64_t ldy, int y_bf16, size_t ws_bytes, int cap);
int cu_blas_gemm_try(cu_blas *b, cudaStream_t s, int k, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                     const uint16_t *xs, int64_t ldxs, int64_t T, void *y, int64_t ldy, int y_bf16, void *ws,
                     size_t ws_bytes);

#ifdef __cplusplus
}
#endif

#endif /* ST_BACKEND_CUDA_BLAS_H */
