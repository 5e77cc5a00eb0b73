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

/* The activations as limbs for the IM form of the MLX products (matmul_q.cu's top comment):
 * xq holds limbs [QI_TP][steps][3][32] bytes, then (d_g, d_g sum_g X) floats
 * [groups][QI_TP][2]. Whatever makes them (k_qlimbs, or the norm or SwiGLU that produces the
 * activations) gives the same bytes: each value's X is its own, and the group's d (from its
 * largest |x|) and integer sum of X do not depend on how lanes hold the group. */
#define QI_XMAX 2088895 /* 127 * 2^14 + 63 * 2^7 + 63 */
#define QI_TP 16        /* tokens a launch */
/* the byte of column c within its step's 32 (4-bit: the order of the nibbles' unpacking) */
__device__ __forceinline__ int qi_byte(int64_t c, int bits) {
    const int b = (int)(c % 32);
    return bits == 4 ? (b & ~7) + 2 * (b % 4) + (b % 8) / 4 : b;
}
/* token tok's group gj, held by `width` aligned lanes (mask: theirs; a power of two up to 32):
 * this lane's N values v[i] of columns c0 + i * cstride; the group's first lane writes its
 * (d, d sum X) */
template <int N>
__device__ __forceinline__ void qi_put(uint8_t *xq, int64_t nsteps, int64_t tok, int64_t gj, const float (&v)[N],
                                       int64_t c0, int cstride, int bits, unsigned mask, int width) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(v[i]));
    for (int o = width / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
    const float d = __fdiv_rn(amax, (float)QI_XMAX);
    int32_t sx = 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        int32_t X = 0;
        if (d > 0.0f) {
            float q = rintf(__fdiv_rn(v[i], d));
            q = fminf(fmaxf(q, -(float)QI_XMAX), (float)QI_XMAX);
            X = (int32_t)q;
        }
        sx += X;
        const int32_t a0 = ((X + 64) & 127) - 64, x1 = (X - a0) / 128;
        const int32_t a1 = ((x1 + 64) & 127) - 64, a2 = (x1 - a1) / 128;
        const int64_t c = c0 + (int64_t)i * cstride;
        uint8_t *o = xq + (tok * nsteps + c / 32) * 96 + qi_byte(c, bits);
        o[0] = (uint8_t)(int8_t)a0, o[32] = (uint8_t)(int8_t)a1, o[64] = (uint8_t)(int8_t)a2;
    }
    for (int o = width / 2; o > 0; o >>= 1) sx += __shfl_xor_sync(mask, sx, o); /* exact: any order */
    if ((threadIdx.x & (unsigned)(width - 1)) == 0) {
        float *dx = (float *)(xq + QI_TP * nsteps * 96) + (gj * QI_TP + tok) * 2;
        dx[0] = d, dx[1] = d * (float)sx;
    }
}
/* a warp's group, lane l holding columns c0 + 32 i, i < per (the group / 32): qi_put of its
 * per values v[i] */
__device__ __forceinline__ void qi_put_warp(uint8_t *xq, int64_t nsteps, int64_t tok, int64_t gj, const float (&v)[4],
                                            int per, int64_t c0, int bits) {
    if (per == 1) {
        const float w1[1] = {v[0]};
        qi_put(xq, nsteps, tok, gj, w1, c0, 32, bits, FULL, 32);
    } else if (per == 2) {
        const float w2[2] = {v[0], v[1]};
        qi_put(xq, nsteps, tok, gj, w2, c0, 32, bits, FULL, 32);
    } else {
        qi_put(xq, nsteps, tok, gj, v, c0, 32, bits, FULL, 32);
    }
}

/* matmul_bf16.cu */
/* the group's block offsets for MT tiles a block; its blocks in all */
MM_HIDDEN int64_t group_blocks(mm_group *g, int MT);
/* the current device's SMs (1 where it cannot say) */
MM_HIDDEN int mm_sms(void);
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
/* bf16-activation products of many tokens on cuBLASLt, the group's matrices (bf16 tiled or
 * MLX Q tiled) copied out row-major into sc->wrm first: 0, or -1 with nothing launched where
 * it does not take the group */
MM_HIDDEN int launch_blas(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T,
                          const cu_mm_scratch *sc);

/* matmul_q.cu */
/* MLX tiled matrices of one width, bits and group (matmul_q.cu says which kernel): CU_MM_XS
 * where it left sc->xs holding x's split, CU_MM_XQ sc->xq its limbs */
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
