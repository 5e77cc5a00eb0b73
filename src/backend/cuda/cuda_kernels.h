/* ==== CUDA kernels of the CUDA backend (private to src/backend/cuda) ====
 *
 * Launchers callable from C: each enqueues its kernels on `stream` and returns. Numerics are
 * "exact": fp32 activations and accumulation, the reduction order of every output fixed by
 * its own index alone (never by how many tokens share the launch), so a sequence gets the
 * same bits alone or in any batch (in `exact`; where CU_BLAS_EXACT puts its products of
 * CU_BLAS_EXACT_MIN_T tokens or more on cuBLASLt, in steps of fewer tokens).
 */
#ifndef ST_BACKEND_CUDA_CUDA_KERNELS_H
#define ST_BACKEND_CUDA_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cu_stream; /* = cudaStream_t */

/* A weight matrix in device memory: contiguous rows, or tiled for the tensor cores (bf16;
 * MLX 4- and 8-bit kept packed). */
enum { CU_FMT_BF16_TILED = 4, CU_FMT_Q_TILED = 5 }; /* cu_mat.fmts beside st_wformat's: see matmul_bf16.cu, matmul_q.cu */
typedef struct cu_mat {
    int fmt;               /* st_wformat: 0 f32, 1 f16, 2 bf16, 3 MLX affine; or CU_FMT_BF16_TILED */
    int sdtype;            /* affine scales/biases: st_dtype 0 f32, 1 f16, 2 bf16 */
    int bits, group;       /* affine */
    int64_t rows, cols;
    const void *data;      /* dense [rows][cols]; affine uint32 [rows][cols*bits/32]; tiled
                              cu_tiled_elems(rows, cols) bf16; Q tiled cu_qtiled_bytes */
    const void *scales;    /* affine [rows][cols/group]; Q tiled cu_qtiled_groups of sdtype */
    const void *biases;
} cu_mat;

/* The step plan in device memory (pointers into one uploaded block). */
typedef struct cu_plan {
    int n_items;
    int64_t n_tokens;
    const int32_t *tokens;   /* [T] */
    const int64_t *item_t0;  /* [n_items + 1] */
    const int64_t *pos0;     /* [n_items] */
    const int32_t *slot;     /* [n_items] */
    const int64_t *block_t0; /* [n_items + 1] */
    const int32_t *blocks;
    const int32_t *tok_item; /* [T] the item of each token */
    const int32_t *rows;     /* [n_logit_rows] the token rows that get logits */
    const int32_t *mrope;    /* [T][3] each token's (t, h, w) rotary positions */
} cu_plan;

/* The KV pool: [n_blocks][n_full][2][nkv][block_size][hd] of f32 or bf16. */
typedef struct cu_kv {
    void *base;
    int bf16;
    int block_size, nkv, hd, n_full;
} cu_kv;

void cu_embed(cu_stream s, const cu_mat *emb, const int32_t *tokens, int64_t T, float *x);
/* xs (when apply): xn also split into `parts` bf16 parts for the tiled products, as
 * cu_matmul's own split makes them (T <= 16; cu_split_elems(T, d)). xq (when apply): xn also
 * as the MLX integer form's limbs for matrices of qbits bits and groups of qgroup columns
 * (cu_qint_bytes(d)), where it can (T <= 16, d a multiple of qgroup, held in registers):
 * returns 1 where it made them */
int cu_add_norm(cu_stream s, float *x, const float *out, const float *w, float *xn, int64_t T,
                int64_t d, float eps, int add, int apply, uint16_t *xs, int parts, uint8_t *xq, int qgroup,
                int qbits);
/* y[t*ldy + r] = sum_c W[r][c] x[t*ldx + c], r < rows, t < T. mode: how tiled bf16
 * matrices are computed (tiled ones always take the tensor cores; row-major bf16 and the
 * other formats the CUDA-core kernels): */
enum {
    CU_MM_EXACT = 0, /* tensor cores, activations split in three bf16 parts (fp32-grade) */
    CU_MM_BF16 = 1,  /* tensor cores, activations rounded to bf16 */
    CU_MM_FMA = 2,   /* CUDA cores, fp32 FMAs (matrices kept row-major) */
};
/* The tiled products' scratch (device memory, the context's): xs, the activations split into
 * bf16 parts, [3][xs_tokens][widest cols rounded up to 32] (cu_split_elems(xs_tokens,
 * widest)). Up to 16 tokens take k_mmv, more k_gemm in slices of xs_tokens (>= 16); the
 * same bits.
 * NULL: the kernel that splits inside (k_mma), the same bits again. */
typedef struct cu_mm_scratch {
    uint16_t *xs;
    int64_t xs_tokens;
    /* k_gemm's partial sums where a product of up to 64 tokens is split over its summation
     * classes (matrices of few rows: the device would be idle); NULL: never split */
    float *part;
    int64_t part_elems; /* cu_mm_part_elems of the most tokens and the widest output */
    /* the driver's cuTensorMapEncodeTiled where bf16-activation products of CU_WGMMA_MIN_T
     * tokens or more take k_wgmma (cu_wgmma_available; the `bf16` precision only); NULL:
     * k_gemm for every product */
    void *tma_encode;
    /* k_wgmma_stream's (bf16-activation products of CU_WS_MIN_T to CU_WGMMA_MIN_T - 1
     * tokens where tma_encode is set): the partial sums of the row blocks its blocks share
     * [cu_ws_part_elems()] and a count a row block of 128 rows [wcount_n], zeros before the
     * first product (each product leaves them so); NULL: k_gemm and k_mmv for those */
    float *wpart;
    int64_t wpart_elems;
    int32_t *wcount;
    int64_t wcount_n;
    /* its clusters of CU_WS_CL > 1 blocks: the most the device runs at once
     * (cu_wgmma_stream_clusters, asked once, outside any graph capture); 0: none */
    int ws_clusters;
    /* k_wgmma's resident clusters where a build sets CU_WG_PERSIST (cu_wgmma_clusters, asked
     * once); 0: a cluster for each output tile */
    int wg_clusters;
    /* cuBLASLt (blas.h) for products of CU_BLAS_MIN_TOKENS(parts) tokens or more (bf16 activations; in
     * `exact`, with CU_BLAS_EXACT, bf16 tiled matrices only, the activations' three parts as
     * three products): its handle, a row-major bf16 copy of a launch's matrices [wrm_elems]
     * (bf16 tiled as stored, MLX dequantized; matrices larger than it stay on the backend's
     * kernels) and the library's workspace [blas_ws_bytes]; NULL: k_wgmma (MLX: k_qmvp /
     * k_qmv; `exact`: k_gemm) */
    struct cu_blas *blas;
    uint16_t *wrm;
    int64_t wrm_elems;
    void *blas_ws;
    size_t blas_ws_bytes;
    int64_t xs_elems; /* xs's elements (cu_split_elems); 0: xs_tokens of three parts */
    /* MLX 4- and 8-bit products on integer tensor cores (matmul_q.cu: the activations as
     * limbs, k_qlimbs's [cu_qint_bytes(widest cols)]); NULL: on bf16 ones with xs */
    uint8_t *xq;
} cu_mm_scratch;
/* whether the backend takes MLX products on integer tensor cores (1), or on bf16 ones (0;
 * a build may set it to compare) */
#ifndef CU_QINT
#define CU_QINT 0
#endif
size_t cu_qint_bytes(int64_t cols);
/* the fewest tokens a bf16-activation product takes k_wgmma_stream for, and the scratch it
 * needs: the pieces of up to CU_WS_BLOCKS blocks, a count for each row block of a launch
 * whose matrices have `rows` rows together */
#ifndef CU_WS_MIN_T
#define CU_WS_MIN_T 17 /* `mmv_bench ws`: 16 tokens and fewer stream faster on k_mmvp / k_mmv */
#endif
#define CU_WS_BLOCKS 160
static inline size_t cu_ws_part_elems(void) { return (size_t)CU_WS_BLOCKS * 256 * 128; }
/* (each of up to 4 matrices rounds its row blocks up, and up again to whole groups of up to 4
 * in clusters) */
static inline int64_t cu_ws_counts(int64_t rows) { return (rows + 127) / 128 + 16; }
/* the most clusters of cl (2 or 4; 0: the backend's CU_WS_CL) k_wgmma_stream blocks the device
 * runs at once, whatever the tokens (0: none, or clusters of 1; an error is cleared) */
int cu_wgmma_stream_clusters(int cl);
/* y[i][t*ldy[i] + r] = sum_c W_i[r][c] xs[t*ldxs + c] for n <= 4 CU_FMT_BF16_TILED matrices
 * of one width and 1 <= T <= 128 bf16-activation tokens, on resident blocks streaming the
 * weights (matmul_wgmma.cu); 0, or -1 with nothing launched where it does not take them */
int cu_wgmma_stream(cu_stream s, const cu_mm_scratch *sc, int n, const cu_mat *const *w, float *const *y,
                    const int64_t *ldy, const uint16_t *xs, int64_t ldxs, int64_t T);
/* y[i][t*ldy[i] + r] = sum_c W_i[r][c] x[t*ldx + c] for n <= 4 MLX 4- or 8-bit CU_FMT_Q_TILED
 * matrices of one width, bits and group (bf16 scales and biases) and 1 <= T <= 128 tokens in
 * `bf16`: x split into sc->xs as bf16, permuted for it, then k_wgmma_qstream (matmul_wgmma.cu:
 * the weights as bf16 s q + b); 0, or -1 with nothing launched where it does not take them */
int cu_wgmma_qstream(cu_stream s, const cu_mm_scratch *sc, int n, const cu_mat *const *w, float *const *y,
                     const int64_t *ldy, const float *x, int64_t ldx, int64_t T);
/* whether `bf16` MLX products of CU_QS_MIN_T8 (8-bit) or CU_QS_MIN_T4 (4-bit) to
 * CU_WGMMA_MIN_T - 1 tokens take cu_wgmma_qstream (1) or k_qmvp / k_qmv (0). `mmv_bench qs`
 * on an H100, one 27B token's matrices: 8-bit 12.3 ms at 9-16 tokens against k_qmvp's 15.5,
 * 12.7-19.0 at 17-127 against k_qmv's 33-121, k_qmvp ahead to 8 (11.0 against 12.3); 4-bit
 * k_qmvp ahead to 16 (11.7 against 11.9) */
#ifndef CU_QS
#define CU_QS 1
#endif
#ifndef CU_QS_MIN_T8
#define CU_QS_MIN_T8 9
#endif
#ifndef CU_QS_MIN_T4
#define CU_QS_MIN_T4 17
#endif
/* the fewest tokens a product takes k_wgmma for (`make mmv-bench; build/mmv_bench wg`) */
#define CU_WGMMA_MIN_T 128
/* the fewest tokens a product takes cuBLASLt for, where the scratch has it (each product
 * first copies its matrix out of the tiled layout, which costs what reading and writing it
 * once does: `build/mmv_bench blas` compares the two paths) */
#ifndef CU_BLAS_MIN_T
#define CU_BLAS_MIN_T 1024
#endif
/* the fewest tokens a `bf16` product of MLX matrices takes the library for (their values
 * dequantized into the copy: a read of the packed weights, a write and a read of them in bf16,
 * some 20-30 ms for the 27B's on an H200, then the product). Their own kernel beyond 16 tokens,
 * k_qmv, converts the values again for every 16 tokens: on the H200 (2026-12-05) the 8-bit
 * 512-token prefill ran at 1,041 tok/s on it, the 2,048-token one at 8,702 on the library, and
 * 64 sequences decoded no faster than 16 (about 14 ms of products a 16-token slice). So from
 * 128 tokens, where k_qmv's eight slices (some 115 ms) cost about three times the library's
 * copy and product. An H100 (2026-12-07, `strand bench --synth 27b --dtype q8 --precision
 * bf16`): the 128 / 256 / 512-token prefill 2,039 / 3,792 / 5,944 tok/s against 1,040 /
 * 1,061 / 1,053 with the library from 1,024 */
#ifndef CU_BLAS_Q_MIN_T
#define CU_BLAS_Q_MIN_T 128
#endif
/* where k_wgmma runs (Hopper, `bf16`), the fewest tokens a bf16 tiled product takes the
 * library for: below it k_wgmma, which reads the tiled layout without the copy. An H100
 * (2026-12-07, the prefill side by side, two rounds; k_wgmma with 128-byte activation rows,
 * resident, the MLP in bf16): k_wgmma at every size against the library from 1,024 tokens,
 * 1,024 tokens 8,605-8,650 against 8,024-8,054 tok/s, 2,048 9,926-9,941 / 9,282-9,302,
 * 3,072 9,607-9,772 / 9,837-9,863, 4,096 9,706-9,843 / 9,698-9,777, 8,192 9,666-9,698 /
 * 10,304-10,360. MLX matrices (dequantized for the library) take CU_BLAS_Q_MIN_T */
#ifndef CU_WG_BLAS_MIN_T
#define CU_WG_BLAS_MIN_T 3072
#endif
/* 1: `exact` products of CU_BLAS_MIN_T tokens or more of bf16 tiled matrices take cuBLASLt
 * too, the activations as their three bf16 parts (three library products, the lowest part
 * first, summed in fp32: every weight still meets all 24 bits of its activation, only the
 * summation order is the library's); 0: they stay on k_gemm, which keeps `exact`
 * bit-invariant at every step size. 1 since an H100 ran it (2026-12-05): the 8,192-token
 * prefill 1,727 -> 2,669 tok/s; tiny-fortune's 2,048 tokens in one step against steps of
 * 128 (`make test-gpu`): 0 greedy flips, logits within 1.1e-6 of the largest */
#ifndef CU_BLAS_EXACT
#define CU_BLAS_EXACT 1
#endif
/* where CU_BLAS_EXACT, `exact`'s products from this many tokens take the library: fewer than
 * `bf16`'s CU_BLAS_MIN_T, as k_gemm's three MMAs a product are slower against the library's
 * than its one. Measured 2026-12-05, `exact` prefill with the library from 512 tokens against
 * from 1,024: 512 tokens 1,577 -> 2,903 tok/s on the H200 (`bf16` at 512 went slower, 7,286 ->
 * 6,415: the copy out of the tiled layout costs more than the library gains there); from 256
 * against from 512 on an H100: 256 tokens 1,296 -> 1,965, 384 1,506 -> 2,396 */
#ifndef CU_BLAS_EXACT_MIN_T
#define CU_BLAS_EXACT_MIN_T 256
#endif
/* the fewest tokens of a product on the library with activations of `parts` bf16 parts (1:
 * `bf16`; 3: `exact`) */
#define CU_BLAS_MIN_TOKENS(parts) ((parts) == 3 ? CU_BLAS_EXACT_MIN_T : CU_BLAS_MIN_T)
/* Hopper's warpgroup MMA (matmul_wgmma.cu, built for sm_90a): the tensor-map encoder the
 * products need when this device runs it (compute capability 9.0), else NULL. Once a device. */
void *cu_wgmma_available(void);
/* y[t*ldy + r] = sum_c W[r][c] xs[t*ldxs + c] for a CU_FMT_BF16_TILED W and bf16 activations
 * (the split's one part), on at most `clusters` resident clusters (cu_mm_scratch.wg_clusters;
 * 0: a cluster for each output tile; the same bits either way); 0, or -1 with nothing
 * launched where it does not take the matrix (an odd number of 32-column steps, misaligned
 * pointers, a refused tensor map) */
int cu_wgmma_matmul(cu_stream s, void *encode, const cu_mat *w, const uint16_t *xs, int64_t ldxs, int64_t T,
                    float *y, int64_t ldy, int clusters);
/* the same with y bf16 [T][ldy], each sum rounded to nearest (ties to even) */
int cu_wgmma_matmul_bf16(cu_stream s, void *encode, const cu_mat *w, const uint16_t *xs, int64_t ldxs, int64_t T,
                         uint16_t *y, int64_t ldy, int clusters);
/* the most clusters of cl (1, 2 or 4) k_wgmma blocks the device runs at once (0: the query
 * failed; an error is cleared); cl 0: the backend's (0 unless a build sets CU_WG_PERSIST) */
int cu_wgmma_clusters(int cl);
/* the floats part needs for products of up to `tokens` tokens and `rows` output rows (of all
 * the matrices of one launch together); splits are for up to 64 tokens */
static inline size_t cu_mm_part_elems(int64_t tokens, int64_t rows) {
    const int64_t t = tokens < 64 ? tokens : 64;
    return (size_t)(8 * t * rows);
}
/* once per device, before the first product */
void cu_mm_init(void);
void cu_matmul(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y,
               int64_t ldy, int mode, const cu_mm_scratch *sc);
/* n matrices reading the same x: those of one width share a launch */
/* xs_ready: sc->xs already holds x's split (cu_add_norm or cu_silu_mul made it; T <= 16);
 * xq_ready: sc->xq holds x's limbs for the MLX integer form (they made them; T <= 16).
 * Returns CU_MM_XS where a launch split x into sc->xs (T <= 16) and it holds that after them,
 * CU_MM_XS_LOST where sc->xs holds something else after them (k_wgmma_qstream's permuted
 * split: whatever xs held before is gone), | CU_MM_XQ where sc->xq holds x's limbs after it
 * (made or kept); 0 where none touched either (other formats) */
#define CU_MM_XS 1
#define CU_MM_XQ 2
#define CU_MM_XS_LOST 4
int cu_matmul_group(cu_stream s, int n, const cu_mat *const *w, float *const *y, const int64_t *ldy,
                    const float *x, int64_t ldx, int64_t T, int mode, const cu_mm_scratch *sc, int xs_ready,
                    int xq_ready);
static inline size_t cu_split_elems(int64_t T, int64_t cols) { return (size_t)(3 * T * ((cols + 31) / 32 * 32)); }
/* bf16 tiled: the elements a rows x cols matrix takes, and the tiling of a row-major one
 * (src and dst in device memory) */
size_t cu_tiled_elems(int64_t rows, int64_t cols);
void cu_tile_bf16(cu_stream s, const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst);
/* the reverse, into dst [rows][tiled_steps(cols) * 32] row-major (the products on cuBLASLt) */
void cu_untile_bf16(cu_stream s, const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst);
/* MLX affine, Q tiled (CU_FMT_Q_TILED; 4 or 8 bits, groups of 32, 64, 96 or 128 columns:
 * cu_q_tileable): the bytes of the values and the elements of the scales (and of the biases);
 * the tiling of a stored matrix (data [rows][cols*bits/8], scales and biases [rows][cols/group]
 * of es bytes; all in device memory). The scratch is required for these (cu_matmul's sc). */
int cu_q_tileable(int bits, int group, int64_t cols);
size_t cu_qtiled_bytes(int64_t rows, int64_t cols, int bits);
size_t cu_qtiled_groups(int64_t rows, int64_t cols, int group);
void cu_tile_q(cu_stream s, const void *data, const void *scales, const void *biases, int es, int64_t rows,
               int64_t cols, int bits, int group, void *ddata, void *dscales, void *dbiases);
/* g[t*ld + i] = silu(g) * u[t*ld + i], i < n; xs: the result also split (as cu_add_norm's);
 * xq: instead as the limbs (as cu_add_norm's, where it can: T <= 16, n a multiple of qgroup;
 * returns 1 where it made them, and then no split) */
int cu_silu_mul(cu_stream s, float *g, const float *u, int64_t T, int64_t n, int64_t ld, uint16_t *xs,
                int parts, uint8_t *xq, int qgroup, int qbits);
void cu_gather_rows(cu_stream s, const float *src, int64_t d, const int32_t *rows, int64_t n,
                    float *dst);

/* The `bf16` MLP of many tokens with its intermediates in bf16, as the peers keep them (on
 * cuBLASLt; about half the bytes of fp32 gate, up and h and of the down product's split):
 * cu_mlp_gate_up_bf16: gate and up (bf16 tiled, one width; x [T][ldx] fp32) into gb and ub
 * (bf16 [T][rows]; or, on the library with CU_BLAS_GU_ONE, both as one product into ub as
 * [T][2 rows], gate's rows first: ub has room for that), then h = silu(g) u into hb (bf16
 * [T][ldh], ldh the rows rounded up to 32, zeros past them). 0; or -1 where it does not take
 * them (no library or fewer tokens than it takes, CU_BLAS_MIN_TOKENS(1) or, where k_wgmma
 * runs, CU_WG_BLAS_MIN_T, unless CU_MLP_BF16_OWN; other
 * formats or widths, rows not a multiple of 32, a product refused), with gb and ub perhaps
 * written and hb untouched: the caller then computes the MLP in fp32. cu_silu_mul_bf16: that
 * SwiGLU alone (g and u rows ldgu apart; n, ldgu and ldh multiples of 8, the three 16-byte
 * aligned). cu_matmul_bf16_in: y [T][ldy] = w (bf16 tiled) times xb (bf16
 * [T][ldxb], ldxb >= w's columns rounded up to 32, zeros past them), on the library (from
 * the same threshold), else on k_wgmma (CU_MLP_BF16_OWN) or k_gemm. */
/* CU_MLP_BF16_OWN 1: where the library does not take the MLP (none, or fewer tokens than it
 * takes), products of CU_WGMMA_MIN_T tokens or more take it on k_wgmma, gate and up written
 * in bf16 (cu_wgmma_matmul_bf16), the down product on xb; 0, the fp32 MLP there. 1 since an
 * H100 measured it (2026-12-07, with the 128-byte activation rows, two rounds): the 512-token
 * prefill 7,411-7,430 -> 7,651-7,667 tok/s, the rest the same */
#ifndef CU_MLP_BF16_OWN
#define CU_MLP_BF16_OWN 1
#endif
/* CU_BLAS_GU_ONE 1: the library's gate and up as one product of twice the rows (their
 * row-major copies lie one after the other), one launch and one heuristic's pick for the pair;
 * 0, two products. 1 since an H100 measured it (2026-12-07, two rounds): 8,192-token prefill
 * 10,166-10,198 -> 10,226-10,259 tok/s, the rest within the noise; `make test-gpu` 18 of 18
 * with it (its 4,096-token windows take this path) */
#ifndef CU_BLAS_GU_ONE
#define CU_BLAS_GU_ONE 1
#endif
int cu_mlp_gate_up_bf16(cu_stream s, const cu_mat *gate, const cu_mat *up, const float *x, int64_t ldx, int64_t T,
                        uint16_t *gb, uint16_t *ub, uint16_t *hb, const cu_mm_scratch *sc);
void cu_silu_mul_bf16(cu_stream s, const uint16_t *g, const uint16_t *u, int64_t ldgu, int64_t T, int64_t n,
                      uint16_t *h, int64_t ldh);
void cu_matmul_bf16_in(cu_stream s, const cu_mat *w, const uint16_t *xb, int64_t ldxb, int64_t T, float *y,
                       int64_t ldy, const cu_mm_scratch *sc);

/* Gated DeltaNet of one layer: conv + SiLU over the item's tokens (state [K-1][cd] per slot,
 * slot stride conv_stride floats; in place in qkv), L2 norms of q and k (in place in qkv on the
 * per-step path, inside k_gdn_cprep on the chunked one), the delta rule (state [Hv][Dk][Dv] per
 * slot on the device, stride rec_stride), the gated norm; mix [T][Hv*Dv]. qkv's contents after
 * it are scratch. */
typedef struct cu_gdn_args {
    float *qkv;              /* P1 [T][cd] */
    const float *z, *b, *a;  /* P2 [T][vd], P3 [T][Hv], P4 [T][Hv] */
    float *mix;              /* [T][vd] */
    const float *conv_t;     /* [K][cd] */
    float *conv_state;       /* this layer's row of slot 0 */
    size_t conv_stride;
    float *rec_state;
    size_t rec_stride;
    const float *dt_bias, *neg_exp_a, *norm_w; /* [Hv], [Hv], [Dv] */
    int K, Hk, Hv, Dk, Dv;
    int64_t cd, kd, vd;
    float eps;
    /* the chunked delta rule (gdn_chunk.cu) in place of the per-step one where n_chunks > 0:
     * the step's items cut into chunks of up to 64 tokens from each item's start */
    const int32_t *chunks;     /* [n_chunks][4]: first token row, tokens, item, 0; device */
    const int32_t *item_chunk; /* [n_items + 1] each item's first chunk; device */
    int n_chunks;
    float *chunk_ws;           /* [CU_GDN_WS_SLABS][ws_chunks][Hv][cu_gdn_chunk_floats(Dk, Dv)]; device */
    int ws_chunks;
    /* where not NULL (vd a multiple of 32), the outputs also as `parts` bf16 parts for the next
     * product, xs [parts][T][vd] as cu_add_norm splits, by the decode kernels that can */
    uint16_t *xs;
    int parts;
    /* where not NULL, instead the MLX integer form's limbs of the outputs for out_proj
     * (cu_qint_bytes(vd); qbits bits, groups of qgroup columns dividing Dv; 16 tokens or
     * fewer), by the same kernels */
    uint8_t *xq;
    int qgroup, qbits;
    /* [cu_gdn_counts(Hk)] zeros (device; the kernels leave them so), for a decode step's conv
     * inside the rule; NULL: the conv on its own */
    int32_t *counts;
} cu_gdn_args;
/* decode steps of up to this many items: the rule's fused kernels (a build may set it,
 * -DCU_GDN_DEC_FUSED_MAX=64 for gdn.cu and cuda_backend.c, to compare in the model) */
#ifndef CU_GDN_DEC_FUSED_MAX
#define CU_GDN_DEC_FUSED_MAX 16
#endif
static inline size_t cu_gdn_counts(int Hk) { return (size_t)CU_GDN_DEC_FUSED_MAX * (size_t)Hk; }
/* CU_MM_XS when it left mix's split in a->xs, CU_MM_XQ its limbs in a->xq, 0 when neither */
int cu_gdn(cu_stream s, const cu_plan *p, const cu_gdn_args *a, int max_item_tokens);
/* Once per shape, before cu_gdn: 0 when cu_gdn takes these head dims, -1 when not. */
int cu_gdn_prepare(int Dk, int Dv);
/* the chunked rule: the floats a (chunk, head) takes in the workspace (U [64][Dv] and g [64]
 * in fp32, then W, exp(g) q and exp(g_last - g) k [64][Dk] and P [64][64] in bf16);
 * cu_gdn_chunked_prepare: 0 when it takes these head dims (Dk 16, 32, 64 or 128, Dv a
 * multiple of 8), -1 when not; the chunks' part of cu_gdn (tensor cores: `bf16` only) */
/* CU_GDN_OVERLAP 1 (the backend's; a build may set 0 to compare, for gdn_chunk.cu,
 * cuda_backend.c and mmv_bench alike): the workspace holds two slabs, and a slab's chunks' own
 * part (k_gdn_cprep) runs beside the scan of the slab before it, into the other slab. H100,
 * 2026-12-07, side by side, two rounds: the 8,192-token `bf16` prefill 10,247 / 10,313 ->
 * 10,378 / 10,356 tok/s (+0.4 to +1.3%), 2,048 tokens +0.3 to +0.5%; 139 MB more workspace
 * on the 27B shape */
#ifndef CU_GDN_OVERLAP
#define CU_GDN_OVERLAP 1
#endif
#define CU_GDN_WS_SLABS (CU_GDN_OVERLAP ? 2 : 1)
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t cu_gdn_chunk_floats(int Dk, int Dv) { return 64 * (int64_t)Dv + 64 + 96 * (int64_t)Dk + 64 * 64 / 2; }
int cu_gdn_chunked_prepare(int Dk, int Dv);
void cu_gdn_chunked(cu_stream s, const cu_plan *p, const cu_gdn_args *a);
/* the chunked rule runs for steps with an item of at least this many tokens */
#define CU_GDN_CHUNKED_MIN 64

/* Compact logit rows (sample.cu): for each of n rows of lg [.][V] (their indices in rows,
 * device), the CU_TOP_MAX largest logits (ties to the lower id) in descending order,
 * log-sum-exp in double and whether the row is finite; out [n] in device memory, through
 * scratch [cu_logit_top_scratch(n, V)] bytes of device memory. The layout is
 * backend/backend.h's st_logit_top (cuda_backend.c checks it). cu_logit_top_segs: the
 * segments a row is cut into, 0 where the vocabulary is too large (over 256 K ids). */
#define CU_TOP_MAX 128
typedef struct cu_logit_top {
    int32_t n, finite;
    double lse;
    int32_t id[CU_TOP_MAX];
    float val[CU_TOP_MAX];
} cu_logit_top;
int cu_logit_top_segs(int64_t V);
size_t cu_logit_top_scratch(int64_t rows, int64_t V);
void cu_logit_tops(cu_stream s, const float *lg, int64_t V, const int32_t *rows, int64_t n, void *scratch,
                   cu_logit_top *out);

/* Attention of one layer: q/k norm and RoPE (P1 [T][nh][q|gate][hd], P2 [T][nkv][hd]),
 * K and V (P3) into the pool at layer li; then per query causal softmax over its item's
 * positions and the sigmoid gate into mix [T][nh*hd]. */
typedef struct cu_attn_args {
    float *q, *k;
    const float *v;
    float *mix;
    const float *q_norm, *k_norm, *inv_freq;
    const int32_t *rope_axis; /* [rope_dim / 2] which of the token's 3 positions each frequency turns by */
    int nh, nkv, hd, rope_dim, li;
    int parts; /* the products' operands as bf16 parts on the tensor cores: 3 (exact), 1 (bf16);
                  0 (or head dims not a multiple of 16): fp32 CUDA cores */
    float eps;
    /* decode steps split over the context (device scratch: the chunks' raw results, room for
     * split_chunks chunks of CU_ATT_CH positions, cu_attn_split_floats); NULL: not split */
    float *split;
    int64_t split_chunks;
    /* where not NULL (nh * hd a multiple of 32), a decode step's outputs also as xs_parts bf16
     * parts for the next product, xs [xs_parts][T][nh * hd] as cu_add_norm splits */
    uint16_t *xs;
    int xs_parts;
    /* 1: a `bf16` prompt's attention may take k_attn_fw (wgmma; cu_attn_fw_init returned 0 for
     * this device), where the build's CU_ATTN_FW says so; 0: k_attn_fa */
    int fw;
    /* 2 or 3: a decode step's split takes k_attn_ring (each resident block streams a run of
     * chunks' K and V through a ring of that many chunks in shared memory) where the pool is
     * bf16 and a KV head has at most 8 query heads; 0: k_attn_split. The same bits either way */
    int ring;
} cu_attn_args;
/* positions an attention chunk; the floats of the split scratch for `chunks` chunks */
#define CU_ATT_CH 64
static inline size_t cu_attn_split_floats(int64_t chunks, int nh, int hd) { return (size_t)chunks * nh * (hd + 2); }
void cu_attn_prep(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv);
/* 1 when it left mix's split in a->xs, 0 when not */
int cu_attention(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv);
/* whether cu_attention takes these heads (nh / nkv query heads a KV head at most 48, head
 * dims at most 256); cu_attention_init: once per device, before the first call */
int cu_attention_fits(int nh, int nkv, int hd);
void cu_attention_init(int hd);
/* flash attention on wgmma (attention_wgmma.cu, sm_90a): cu_attn_fw_init returns 0 where the
 * device runs it for head dims hd (64, 128, 256), -1 where not; cu_attn_fw launches it for a
 * `bf16` step (a->parts 1) holding a prompt, -1 where it does not take these heads */
int cu_attn_fw_init(int hd);
/* k_attn_ring (cu_attn_args.ring): the deepest ring the device has the shared memory for at
 * head dim hd (3 chunks' K and V: 220 KB at hd 256; 2: 150 KB), 0 where none; a depth it
 * returned may then be asked for */
int cu_attn_ring_init(int hd);
int cu_attn_fw(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv);

/* MoE pieces: out[list[i]] += w[i] * src[i] (rows of d); out[t] += sigmoid(g[t]) * src[t] */
void cu_scatter_add(cu_stream s, float *out, const float *src, const int32_t *list, const float *w,
                    int64_t n, int64_t d);
void cu_gated_add(cu_stream s, float *out, const float *src, const float *g, int64_t T, int64_t d);
/* dst[i] = src[i] + ... : elementwise sum of two buffers into dst (all-reduce of one rank) */
void cu_fill_zero(cu_stream s, float *p, int64_t n);

/* the copy kernel bench measures the device's bandwidth with */
void cu_copy(cu_stream s, const float *src, float *dst, int64_t n);
/* a read of bytes (a multiple of 16) at p, as fast as the device reads (sink: a word of
 * device memory it may write) */
void cu_read(cu_stream s, const void *p, size_t bytes, unsigned *sink);

/* Synthetic weights (st_model_synthetic) made on the device: n elements at dst of
 * CU_SYNTH_BF16 (a * uniform[-1, 1), as bf16), CU_SYNTH_WORDS (random 32-bit words: packed
 * quantized values) or CU_SYNTH_BF16_CONST (a, as bf16), a deterministic function of key. */
enum { CU_SYNTH_BF16 = 0, CU_SYNTH_WORDS = 1, CU_SYNTH_BF16_CONST = 2 };
void cu_synth_fill(cu_stream s, void *dst, size_t n, int kind, uint64_t key, float a);

#ifdef __cplusplus
}
#endif

#endif /* ST_BACKEND_CUDA_CUDA_KERNELS_H */
