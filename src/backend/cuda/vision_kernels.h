/* ==== CUDA kernels of the vision tower (private to src/backend/cuda; see vision_cuda.h) ====
 *
 * Launchers callable from C (vision.cu): each enqueues its kernels on `stream` and returns
 * cudaGetLastError() as an int (0: launched). All pointers are device memory. fp32 throughout:
 * the products are fp32 FMAs on the CUDA cores (no tensor cores, no tf32), each output summed
 * over k in index order, so a patch's result never depends on the other patches of the call.
 */
#ifndef ST_BACKEND_CUDA_VISION_KERNELS_H
#define ST_BACKEND_CUDA_VISION_KERNELS_H

#include <stdint.h>

#include "backend/cuda/cuda_kernels.h" /* cu_stream */

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix on the device: [rows][cols] row-major, contiguous (row stride cols). */
enum { CU_VFMT_F32 = 0, CU_VFMT_BF16 = 2 }; /* st_wformat's values */
typedef struct cu_vmat {
    int fmt;            /* CU_VFMT_F32 or CU_VFMT_BF16 */
    int64_t rows, cols;
    const void *data;   /* [rows][cols] float or uint16 (bf16) */
} cu_vmat;

/* the elementwise function a product's epilogue applies */
enum { CU_VACT_NONE = 0, CU_VACT_GELU_TANH = 1, CU_VACT_GELU_ERF = 2 };

/* y[t*ldy + r] = add[t*ldadd + r] + act(sum_k x[t*ldx + k] w[r][k] + bias[r]) for t < n,
 * r < w->rows, k < w->cols. bias [rows] or NULL (0); add NULL (nothing added) or any matrix,
 * y itself included (the residual: y += ...); x must not overlap y. */
int cu_vis_gemm(cu_stream s, const cu_vmat *w, const float *x, int64_t ldx, int64_t n, const float *bias, int act,
                const float *add, int64_t ldadd, float *y, int64_t ldy);

/* y[t][:] = LayerNorm(x[t][:]) * w + b for n rows of d (mean, then the biased variance of
 * the row; x and y contiguous [n][d], may not overlap unless equal) */
int cu_vis_layernorm(cu_stream s, const float *x, int64_t n, int64_t d, const float *w, const float *b, float eps,
                     float *y);

/* Rotary in place on q and k of qkv [n][3 * nh * hd] (q | k | v, head h at h*hd of each):
 * with half = hd / 2, for j < half: x[j] = x[j] cs[j] - x[j+half] sn[j], x[j+half] =
 * x[j+half] cs[j+half] + x[j] sn[j+half]; cs, sn [n][hd]. */
int cu_vis_rope(cu_stream s, float *qkv, int64_t n, int nh, int hd, const float *cs, const float *sn);

/* Attention within segments: the query tiles of CU_VIS_ATT_Q queries, tiles[i] = (first
 * query, segment start, segment end) [n_tiles][3] (device; each tile's queries lie inside its
 * segment [start, end), the last tile of a segment may be short); o [n][nh * hd] gets, for each
 * query of a tile and each head, softmax over the segment's keys of q.k / sqrt(hd), times v
 * (qkv as cu_vis_rope's, rotated). Head dims even, up to CU_VIS_ATT_HD_MAX.
 * cu_vis_attention_init: once per device (and head dim) before the first call. */
#define CU_VIS_ATT_Q 64
#define CU_VIS_ATT_HD_MAX 128
int cu_vis_attention_init(int hd);
int cu_vis_attention(cu_stream s, const float *qkv, int64_t n_tiles, const int64_t *tiles, int nh, int hd, float *o);

#ifdef __cplusplus
}
#endif

#endif /* ST_BACKEND_CUDA_VISION_KERNELS_H */
