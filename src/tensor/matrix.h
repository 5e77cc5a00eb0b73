/* ==== Weight matrices as stored: dense (f32/f16/bf16) or MLX affine-quantized ====
 *
 * MLX affine format (spec/text-model.md section 3): each row is a little-endian bit stream of
 * `bits`-bit unsigned integers q packed into uint32 words (element j at stream bits
 * j*bits .. j*bits+bits-1); per group of `group` consecutive elements a scale and a bias,
 * w = scale * q + bias. Scales may be negative.
 */
#ifndef ST_TENSOR_MATRIX_H
#define ST_TENSOR_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tensor/dtype.h"

/* Storage format of a weight matrix (append-only). */
typedef enum st_wformat {
    ST_WFMT_F32 = 0,
    ST_WFMT_F16 = 1,
    ST_WFMT_BF16 = 2,
    ST_WFMT_AFFINE = 3, /* MLX affine: w = scale * q + bias per group */
} st_wformat;

/* Kernel-friendly copies of a matrix (st_matrix_pack), made once at load. The original
 * (`data`) stays valid: a kernel set that does not use a packing reads the original.
 *
 * ST_WPACK_BF16_V16 (bf16, even cols): blocks of 16 rows (the last zero-padded); per block,
 *   per pair of columns p (cols/2 pairs), 32 uint16: element [i][j] = W[16b + i][2p + j] at
 *   ((b * cols/2 + p) * 32 + 2i + j). As uint32 lanes: lane i holds row i's pair, so one
 *   64-byte load gives 16 rows' even column (<< 16) and odd column (& 0xffff0000) as fp32,
 *   and 16 consecutive pairs of a block are an AMX B tile (VNNI layout) as they lie.
 * ST_WPACK_Q8_V16 (MLX affine 8-bit): blocks of 16 rows (the last zero-padded), each
 *   st_matrix_q8v16_block_bytes long: first the q bytes by quads of columns, K/4 x 64 bytes,
 *   byte (j * 64 + 4i + u) = q[16b + i][4j + u] (lane i of a 64-byte load holds row i's four
 *   q of quad j: the unsigned operand of vpdpbusd); then the scales as [group][16 rows] and
 *   the biases likewise, in the matrix's sdtype. */
typedef enum st_wpack {
    ST_WPACK_NONE = 0,
    ST_WPACK_BF16_V16 = 1,
    ST_WPACK_Q8_V16 = 2,
} st_wpack;
#define ST_WPACK_BIT(kind) (1u << (kind))

/* A weight matrix W, logically [rows][cols]; a linear layer computes y = W x. */
typedef struct st_matrix {
    st_wformat fmt;
    int64_t rows, cols;
    const void *data;   /* dense: [rows][cols] of fmt; AFFINE: uint32 [rows][cols*bits/32];
                           borrowed from the mapping */
    const void *scales; /* AFFINE: [rows][cols/group] of sdtype; borrowed */
    const void *biases; /* AFFINE: [rows][cols/group] of sdtype; borrowed */
    st_dtype sdtype;    /* AFFINE: BF16, F16 or F32 */
    int bits;           /* AFFINE: 2, 3, 4, 5, 6 or 8 */
    int group;          /* AFFINE: 32, 64 or 128 (any divisor of cols accepted) */
    st_wpack pack;      /* the packed copy's layout, or ST_WPACK_NONE */
    const void *packed; /* the packed copy; owned by whoever packed (a backend) */
    int64_t ld;         /* elements from one row's start to the next's; 0 = cols. A view of
                           a column range (st_matrix_cols) keeps its parent's; for AFFINE the
                           scales and biases step ld/group per row */
} st_matrix;

/* Elements from one row to the next. */
static inline int64_t st_matrix_ld(const st_matrix *m) { return m->ld ? m->ld : m->cols; }

/* Views of a matrix (unpacked; sharing its storage): header-only, so that the backends' own
 * shared objects (the CUDA backend's upload of a shard) take the same views. A matrix without
 * storage (a synthetic model's shape) gives a view without storage. */

/* bytes of an AFFINE matrix's scale or bias (F32, F16 or BF16) */
static inline size_t st_matrix_scale_bytes(const st_matrix *m) { return m->sdtype == ST_DTYPE_F32 ? 4 : 2; }

/* A view of rows [r0, r0 + n) of m. */
static inline st_matrix st_matrix_rows(const st_matrix *m, int64_t r0, int64_t n) {
    ST_ASSERT(r0 >= 0 && n >= 0 && r0 + n <= m->rows);
    st_matrix v = *m;
    const int64_t ld = st_matrix_ld(m);
    v.rows = n;
    v.pack = ST_WPACK_NONE;
    v.packed = NULL;
    v.ld = ld;
    if (!m->data) return v;
    if (m->fmt == ST_WFMT_AFFINE) {
        const size_t es = st_matrix_scale_bytes(m), lds = (size_t)(ld / m->group);
        v.data = (const uint8_t *)m->data + (size_t)r0 * (size_t)(ld * m->bits / 8);
        v.scales = (const uint8_t *)m->scales + (size_t)r0 * lds * es;
        v.biases = (const uint8_t *)m->biases + (size_t)r0 * lds * es;
    } else {
        v.data = (const uint8_t *)m->data + (size_t)r0 * (size_t)ld * (m->fmt == ST_WFMT_F32 ? 4 : 2);
    }
    return v;
}

/* 1 when columns [c0, c0 + n) of m can be a view: whole quantization groups for AFFINE. */
static inline int st_matrix_cols_ok(const st_matrix *m, int64_t c0, int64_t n) {
    if (c0 < 0 || n < 1 || c0 + n > m->cols) return 0;
    if (m->fmt != ST_WFMT_AFFINE) return 1;
    return c0 % m->group == 0 && n % m->group == 0 && (c0 * m->bits) % 32 == 0;
}

/* A view of columns [c0, c0 + n) of m (st_matrix_cols_ok must hold). */
static inline st_matrix st_matrix_cols(const st_matrix *m, int64_t c0, int64_t n) {
    st_matrix v = *m;
    v.cols = n;
    v.pack = ST_WPACK_NONE;
    v.packed = NULL;
    v.ld = st_matrix_ld(m);
    if (!m->data) return v; /* a shape (whose groups a synthetic shard need not respect) */
    ST_ASSERT(st_matrix_cols_ok(m, c0, n));
    if (m->fmt == ST_WFMT_AFFINE) {
        const size_t es = st_matrix_scale_bytes(m);
        v.data = (const uint8_t *)m->data + (size_t)(c0 * m->bits / 8);
        v.scales = (const uint8_t *)m->scales + (size_t)(c0 / m->group) * es;
        v.biases = (const uint8_t *)m->biases + (size_t)(c0 / m->group) * es;
    } else {
        v.data = (const uint8_t *)m->data + (size_t)c0 * (m->fmt == ST_WFMT_F32 ? 4 : 2);
    }
    return v;
}

/* Bytes one row occupies (data plus scales and biases). */
size_t st_matrix_row_bytes(const st_matrix *m);
static inline size_t st_matrix_bytes(const st_matrix *m) {
    return st_matrix_row_bytes(m) * (size_t)m->rows;
}

/* Convert/dequantize row r to fp32: out[cols]. */
void st_matrix_row_f32(const st_matrix *m, int64_t r, float *out);

/* The packings this matrix can take (ST_WPACK_BIT mask). */
unsigned st_matrix_packs_possible(const st_matrix *m);
/* ST_WPACK_Q8_V16: bytes of one block of 16 rows (a multiple of 64), and the offsets of its
 * scales and biases within it. */
size_t st_matrix_q8v16_block_bytes(const st_matrix *m);
size_t st_matrix_q8v16_scales_at(const st_matrix *m);
size_t st_matrix_q8v16_biases_at(const st_matrix *m);
/* Bytes of the packed copy of m in `kind` (0 when m cannot take it). */
size_t st_matrix_pack_bytes(const st_matrix *m, st_wpack kind);
/* Write the packed copy of m in `kind` to dst (st_matrix_pack_bytes(m, kind) bytes); rows
 * [r0, r1) only, a multiple of 16 apart except at the end (so threads can share the work). */
void st_matrix_pack(const st_matrix *m, st_wpack kind, void *dst, int64_t r0, int64_t r1);

/* 1 when bits is a supported affine width (2, 3, 4, 5, 6, 8). */
int st_affine_bits_supported(int bits);

/* Quantize one row of n floats (n % group == 0, n * bits % 32 == 0) in MLX's format and
 * manner: per group the edge of larger magnitude becomes the bias and the scale is snapped so
 * that the edge is an exact multiple of it (zero stays representable; the snap widens the
 * step rather than rounding it, so no value is clipped), q = clamp(round((w - bias) / scale)).
 * Writes packed[n*bits/32] words and scales/biases[n/group] as bf16 (rounded before q is
 * computed, so dequantization reproduces q exactly). */
void st_affine_quantize_row(const float *w, int64_t n, int bits, int group, uint32_t *packed,
                            uint16_t *scales_bf16, uint16_t *biases_bf16);

/* How a group's scale and bias are chosen (append-only). */
typedef enum st_quant_method {
    ST_QUANT_MLX = 0,    /* MLX's rule, as st_affine_quantize_row */
    ST_QUANT_MINMAX = 1, /* scale = (max - min) / (2^bits - 1), bias = min */
    ST_QUANT_MSE = 2,    /* the least squared error among grids around min..max, each refitted
                            by least squares; never worse than MINMAX or MLX for a group */
} st_quant_method;

/* Quantize a row as st_affine_quantize_row does, choosing each group's scale and bias by
 * `method`; q = clamp(round((w - bias) / scale)) with the bf16-rounded scale and bias.
 * Returns the row's sum of squared errors (dequantized minus w). */
double st_affine_quantize_row_as(const float *w, int64_t n, int bits, int group,
                                 st_quant_method method, uint32_t *packed, uint16_t *scales_bf16,
                                 uint16_t *biases_bf16);

#endif /* ST_TENSOR_MATRIX_H */
