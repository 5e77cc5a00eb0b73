/* ==== CUDA kernels: what the matrix products share (matmul.cu, matmul_bf16.cu, matmul_q.cu) ====
 *
 * A launch's group of matrices and the pick of a block's matrix, the warps a block's steps
 * are split over, and the host functions one product file calls in another (hidden in
 * libstrand-cuda.so, as the static functions of one file are).
 */
#ifndef ST_BACKEND_CUDA_MM_INT_CUH
#define ST_BACKEND_CUDA_MM_INT_CUH

#include "backend/cuda/cu_common.cuh"

/* S, the warps of a block splitting the steps (16 for long rows was measured slower: the
 * down projection at 1 token, 2,995 against 3,347 GB/s) */
#define MM_SPLITS 8

/* A launch's matrices (up to 4 of one width, reading the same activations): block b belongs
 * to the last matrix i with blk0[i] <= b. */
struct mm_group {
    int n;
    cu_mat w[4];
    float *y[4];
    int64_t ldy[4];
    int64_t blk0[4];
    /* k_gemm split over its summation classes (gridDim.z > 1): each class's partial sums
     * [MM_SPLITS][T][rows] of matrix i at part + MM_SPLITS * T * prow[i] */
    float *part;
    int64_t prow[4];
};

struct mm_pick {
    cu_mat w;
    float *y;
    int64_t ldy, blk; /* the block's index within its matrix */
    int i;            /* the matrix's */
};

__device__ __forceinline__ mm_pick mm_select_at(const mm_group &g, int64_t b) {
    mm_pick o = {g.w[0], g.y[0], g.ldy[0], b, 0};
#pragma unroll
    for (int q = 1; q < 4; q++)
        if (q < g.n && b >= g.blk0[q]) o = {g.w[q], g.y[q], g.ldy[q], b - g.blk0[q], q};
    return o;
}

__device__ __forceinline__ mm_pick mm_select(const mm_group &g) { return mm_select_at(g, (int64_t)blockIdx.x); }

#define MM_HIDDEN __attribute__((visibility("hidden")))

/* matmul_bf16.cu */
/* the group's block offsets for MT tiles a block; its blocks in all */
MM_HIDDEN int64_t group_blocks(mm_group *g, int MT);
/* k_mmvp's (and k_qmvp's) grid for nblk blocks, minb resident an SM */
MM_HIDDEN unsigned mmvp_grid(int64_t nblk, int minb);
/* xs[p][n][c] = part p of x[n][c], n < T, c < ldxs (zeros past cols) */
MM_HIDDEN void launch_split(cu_stream s, const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs,
                            int64_t ldxs, int parts);
/* bf16 tiled matrices of one width: k_mmvp, k_mmv, k_gemm or k_mma */
MM_HIDDEN void launch_tiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                            const cu_mm_scratch *sc, int xs_ready);
/* the bf16 kernels' shared memory attributes (cu_mm_init) */
MM_HIDDEN void mm_bf16_init(void);
/* products of many tokens on cuBLASLt, the group's matrices (bf16 tiled or MLX Q tiled)
 * copied out row-major into sc->wrm first, the activations as `parts` bf16 parts (1; or 3,
 * `exact`, bf16 tiled only): 0, or -1 with nothing launched where it does not take the group */
MM_HIDDEN int launch_blas(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T, int parts,
                          const cu_mm_scratch *sc);

/* matmul_q.cu */
/* MLX tiled matrices of one width, bits and group (matmul_q.cu says which kernel): CU_MM_XS
 * where it left sc->xs holding x's split, CU_MM_XS_LOST something else, CU_MM_XQ sc->xq its
 * limbs */
MM_HIDDEN int launch_qtiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                            const cu_mm_scratch *sc, int xs_ready, int xq_ready);
/* k_qmvp's shared memory attributes (cu_mm_init) */
MM_HIDDEN void qmvp_init(void);
/* launch_qtiled without the library or the integer form: k_qmvp or k_qmv on bf16 parts */
MM_HIDDEN void qtiled_own(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                          const cu_mm_scratch *sc, int xs_ready);
/* a Q tiled matrix's values s q + b as bf16, row-major into dst [rows][cols] */
MM_HIDDEN void dequant_q(cu_stream s, const cu_mat &w, uint16_t *dst);

#endif /* ST_BACKEND_CUDA_MM_INT_CUH */
