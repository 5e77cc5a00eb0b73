/* ==== SIMD CPU kernels, written once for any vector width (included by avx2.c, avx512.c) ====
 *
 * The including file defines the vector vocabulary (VW lanes of fp32 in `vf`, the V* macros
 * and the small inline helpers listed under "provided by the includer" below), wraps the
 * include in its target pragma, and sets KSUFFIX. Everything here is static; the includer
 * builds its st_kernels table from the functions below.
 *
 * Matrix products (dot-product form, y[t][r] = sum_c W[r][c] x[t][c]):
 *   - A row is read in chunks of CH = 2*VW elements; a chunk gives two fp32 vectors
 *     (w0, w1) in the format's lane order: natural (f32, f16, q8: w0 = elements 0..VW-1)
 *     or even/odd (bf16, q4: w0 = the even elements, w1 = the odd ones, which is what a
 *     16-bit shift/mask or a nibble split gives for free). The activations are packed once
 *     per call in the same order, zero-padded to a whole chunk.
 *   - Every output has one accumulator vector: per chunk acc = fma(w0, x0, acc), then
 *     acc = fma(w1, x1, acc); at the end a fixed-tree horizontal sum. This order is the
 *     same in every code path below, so the result for a token does not depend on how many
 *     tokens share the call (the batch-invariance rule in kernels.h).
 *   - Few tokens (decode, <= MFUSED): weights are converted in registers as they stream in
 *     and multiplied at once (fused dequantize-and-multiply for MLX 4/8-bit, bf16 shift,
 *     f16 convert). More tokens (prefill, batches): a block of RP rows is converted once into
 *     a lane-ordered fp32 scratch (by the same loaders, so the same values) and an RP x TP
 *     register tile of accumulators runs over it; tokens are blocked (mblk_for) so the packed
 *     activations stay in L2.
 *   - MLX 8-bit rows use the scale after the dot product: per group g of a row,
 *     y = sum_g s_g (sum_{k in g} q_k x_k) + sum_g b_g X_g with X_g = sum_{k in g} x_k of the
 *     token (one fixed-tree sum per group, computed when packing). Per lane: a group
 *     accumulator of fma(q, x), folded into the row accumulator by fma(s_g, .) (the row's
 *     scales are converted VW at a time); the bias part is a vector dot
 *     of the row's biases with the X_g (q8_bias); y = tree sum + bias part. That is 3 vector
 *     operations per 16 weights instead of 4 (widen, convert, fma), which is what lets 8-bit
 *     decode keep up with memory; the prefill tiles use the same order (q converted once per
 *     row block).
 *   - Affine widths other than 4/8 (and groups that are not a multiple of CH) take a generic
 *     path: rows dequantized by st_matrix_row_f32 into the scratch, natural order.
 * Vector exp (exp_sum, silu) is a Cephes-style polynomial (about 1 ulp).
 */
#ifndef KSUFFIX
#error "include simd_impl.h from a kernel file that defines the vector vocabulary"
#endif

#include <math.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"
#include "kernels/kernels.h"

/* provided by the includer:
 *   VW, vf, VZERO(), VLOAD(p), VSTORE(p, v), VSET1(x), VFMA(a, b, c) = a*b+c, VMUL, VADD,
 *   VSUB, VDIV, VMAX, VMIN, VROUND (to nearest)
 *   float vhsum(vf)                                   fixed-tree horizontal sum
 *   vf vpow2i(vf n)                                   2^n for integral n in [-126, 127]
 *   void eo_split(vf a, vf b, vf *e, vf *o)           even/odd de-interleave of [a | b]
 *   void ld_bf16_eo(const uint16_t *, vf *, vf *)     CH bf16, even/odd order
 *   void ld_f16(const uint16_t *, vf *, vf *)         CH f16, natural order
 *   vf ld_bf16_nat(const uint16_t *)                  VW bf16, natural order
 *   gctx, gctx q8_prep(float s, float b), void ld_q8(const uint8_t *, gctx, vf *, vf *)
 *   vf ld_u8f(const uint8_t *)                        VW bytes as fp32 (0..255)
 *   vf ld_scales(const void *, st_dtype)              VW bf16/f16/f32 values as fp32
 *   gctx q4_prep(float s, float b), void ld_q4_eo(const uint8_t *, gctx, vf *, vf *)
 *   RP, TP (prefill register tile), RD1 (rows per fused step at 1 token), RD2 (2..MFUSED)
 *   void ld_pair16(const uint16_t *, vf *e, vf *o)  VW uint32 bf16 pairs: lows, highs as fp32
 *   VT_RMAX, VT_MMAX, VT_RCHUNK (packed bf16 tiles: row vectors, tokens, row vectors per
 *   chunk), VT_PF_PAIRS (prefetch distance in column pairs)
 */

#define CH (2 * VW)
/* tokens per activation block: the packed block stays within about 1 MiB (L2), at least 24
 * tokens; st_kernels_matmul_scratch provides max(2^18, 24 kp) floats for it */
static int64_t mblk_for(int64_t kp) {
    int64_t m = (262144 / kp) / TP * TP;
    return m < 24 ? 24 : m > 252 ? 252 : m;
}
#define MFUSED 4  /* at most this many tokens: fused decode kernels */
#define AI static inline __attribute__((always_inline))
/* full unrolling of the small constant loops of the register tiles */
#if defined(__clang__)
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define KFN(name) CAT(name, KSUFFIX)

enum { FK_F32, FK_F16, FK_BF16, FK_Q8, FK_Q4, FK_GEN };

static int fmt_kind(const st_matrix *w) {
    switch (w->fmt) {
    case ST_WFMT_F32: return FK_F32;
    case ST_WFMT_F16: return FK_F16;
    case ST_WFMT_BF16: return FK_BF16;
    case ST_WFMT_AFFINE:
        if (w->group % CH == 0 && w->group % 32 == 0 && w->bits == 8) return FK_Q8;
        if (w->group % CH == 0 && w->group % 32 == 0 && w->bits == 4) return FK_Q4;
        return FK_GEN;
    }
    return FK_GEN;
}

static int fk_even_odd(int fk) { return fk == FK_BF16 || fk == FK_Q4; }

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

/* ---------------------------------------------------------------------------------------- */
/* rows, scales, loaders */

typedef struct rowp {
    const uint8_t *d; /* row data */
    const uint8_t *s; /* affine: the row's scales */
    const uint8_t *b; /* affine: the row's biases */
} rowp;

AI rowp row_ptr(const st_matrix *w, int64_t r) {
    rowp p;
    if (w->fmt == ST_WFMT_AFFINE) {
        const int64_t ng = st_matrix_ld(w) / w->group;
        const size_t es = st_dtype_size(w->sdtype);
        p.d = (const uint8_t *)w->data + (size_t)r * (size_t)(st_matrix_ld(w) * w->bits / 8);
        p.s = (const uint8_t *)w->scales + (size_t)(r * ng) * es;
        p.b = (const uint8_t *)w->biases + (size_t)(r * ng) * es;
    } else {
        const size_t es = w->fmt == ST_WFMT_F32 ? 4 : 2;
        p.d = (const uint8_t *)w->data + (size_t)r * (size_t)st_matrix_ld(w) * es;
        p.s = p.b = NULL;
    }
    return p;
}

/* rows r .. r+n-1 (one division for all of them: tiles call this per block of rows) */
AI void row_ptrs(const st_matrix *w, int64_t r, int n, rowp *out) {
    if (w->fmt == ST_WFMT_AFFINE) {
        const size_t ds = (size_t)(st_matrix_ld(w) * w->bits / 8);
        const size_t ss = (size_t)(st_matrix_ld(w) / w->group) * st_dtype_size(w->sdtype);
        const uint8_t *d = (const uint8_t *)w->data + (size_t)r * ds;
        const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * ss;
        const uint8_t *bi = (const uint8_t *)w->biases + (size_t)r * ss;
        for (int i = 0; i < n; i++) {
            out[i].d = d + (size_t)i * ds;
            out[i].s = sc + (size_t)i * ss;
            out[i].b = bi + (size_t)i * ss;
        }
    } else {
        const size_t ds = (size_t)st_matrix_ld(w) * (w->fmt == ST_WFMT_F32 ? 4 : 2);
        const uint8_t *d = (const uint8_t *)w->data + (size_t)r * ds;
        for (int i = 0; i < n; i++) {
            out[i].d = d + (size_t)i * ds;
            out[i].s = out[i].b = NULL;
        }
    }
}

AI float ld_scalar(const uint8_t *base, st_dtype dt, int64_t i) {
    if (dt == ST_DTYPE_BF16) {
        uint16_t h;
        memcpy(&h, base + 2 * i, 2);
        return st_bf16_to_f32(h);
    }
    if (dt == ST_DTYPE_F16) {
        uint16_t h;
        memcpy(&h, base + 2 * i, 2);
        return st_f16_to_f32(h);
    }
    float f;
    memcpy(&f, base + 4 * i, 4);
    return f;
}

/* chunk c (CH elements) of a dense row */
AI void ld_dense(int fk, const uint8_t *d, int64_t c, vf *w0, vf *w1) {
    if (fk == FK_F32) {
        const float *p = (const float *)d + c * CH;
        *w0 = VLOAD(p);
        *w1 = VLOAD(p + VW);
    } else if (fk == FK_F16) {
        ld_f16((const uint16_t *)d + c * CH, w0, w1);
    } else {
        ld_bf16_eo((const uint16_t *)d + c * CH, w0, w1);
    }
}

/* the last, partial chunk of a dense row of K elements, zero-padded */
static void ld_dense_tail(int fk, const uint8_t *d, int64_t K, vf *w0, vf *w1) {
    float nat[CH];
    const int64_t c0 = K / CH * CH;
    memset(nat, 0, sizeof nat);
    for (int64_t i = c0; i < K; i++) {
        if (fk == FK_F32) nat[i - c0] = ((const float *)d)[i];
        else if (fk == FK_F16) nat[i - c0] = st_f16_to_f32(((const uint16_t *)d)[i]);
        else nat[i - c0] = st_bf16_to_f32(((const uint16_t *)d)[i]);
    }
    vf a = VLOAD(nat), b = VLOAD(nat + VW);
    if (fk_even_odd(fk)) eo_split(a, b, w0, w1);
    else {
        *w0 = a;
        *w1 = b;
    }
}

AI gctx aff_prep(int fk, float s, float b) { return fk == FK_Q8 ? q8_prep(s, b) : q4_prep(s, b); }

/* chunk c of an affine row (whole chunks lie in one group) */
AI void ld_aff(int fk, const uint8_t *d, int64_t c, gctx g, vf *w0, vf *w1) {
    if (fk == FK_Q8) ld_q8(d + c * CH, g, w0, w1);
    else ld_q4_eo(d + c * (CH / 2), g, w0, w1);
}

/* The bytes of data from row r's start to row r+n's: [*d0, *d1) (of a column view, the
 * parent's rows between). */
static void row_span(const st_matrix *w, int64_t r, int64_t n, const uint8_t **d0,
                     const uint8_t **d1) {
    rowp a = row_ptr(w, r);
    *d0 = a.d;
    *d1 = row_ptr(w, r + n).d;
}

/* Row r converted to fp32 in lane order into dst[kp] (zero-padded). */
static void convert_row(int fk, const st_matrix *w, int64_t r, float *dst, int64_t kp) {
    const int64_t K = w->cols;
    if (fk == FK_GEN) {
        st_matrix_row_f32(w, r, dst);
        memset(dst + K, 0, (size_t)(kp - K) * sizeof(float));
        return;
    }
    rowp p = row_ptr(w, r);
    vf w0, w1;
    if (fk == FK_Q8 || fk == FK_Q4) {
        const int64_t gpc = w->group / CH, ng = K / w->group;
        for (int64_t g = 0; g < ng; g++) {
            gctx gc = aff_prep(fk, ld_scalar(p.s, w->sdtype, g), ld_scalar(p.b, w->sdtype, g));
            for (int64_t c = g * gpc; c < (g + 1) * gpc; c++) {
                ld_aff(fk, p.d, c, gc, &w0, &w1);
                VSTORE(dst + c * CH, w0);
                VSTORE(dst + c * CH + VW, w1);
            }
        }
        return;
    }
    const int64_t nfull = K / CH;
    for (int64_t c = 0; c < nfull; c++) {
        ld_dense(fk, p.d, c, &w0, &w1);
        VSTORE(dst + c * CH, w0);
        VSTORE(dst + c * CH + VW, w1);
    }
    if (K % CH) {
        ld_dense_tail(fk, p.d, K, &w0, &w1);
        VSTORE(dst + nfull * CH, w0);
        VSTORE(dst + nfull * CH + VW, w1);
    }
}

/* Activation rows x[n][K] (stride ldx) packed into dst[n][kp] in lane order. */
static void pack_x(const float *x, int64_t ldx, int64_t n, int64_t K, int64_t kp, int eo,
                   float *dst) {
    const int64_t nfull = K / CH;
    for (int64_t t = 0; t < n; t++) {
        const float *xs = x + t * ldx;
        float *xd = dst + t * kp;
        for (int64_t c = 0; c < nfull; c++) {
            vf a = VLOAD(xs + c * CH), b = VLOAD(xs + c * CH + VW);
            if (eo) eo_split(a, b, &a, &b);
            VSTORE(xd + c * CH, a);
            VSTORE(xd + c * CH + VW, b);
        }
        int64_t done = nfull * CH;
        if (K % CH) {
            float nat[CH];
            memset(nat, 0, sizeof nat);
            memcpy(nat, xs + done, (size_t)(K - done) * sizeof(float));
            vf a = VLOAD(nat), b = VLOAD(nat + VW);
            if (eo) eo_split(a, b, &a, &b);
            VSTORE(xd + done, a);
            VSTORE(xd + done + VW, b);
            done += CH;
        }
        if (kp > done) memset(xd + done, 0, (size_t)(kp - done) * sizeof(float));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* register tiles */

#define RMAX 8
#define TMAX 8
#define KBLK 512 /* columns per block of the prefill tiles (2 KiB per converted row) */
#ifndef PF_Q8_BLOCKS
#define PF_Q8_BLOCKS 2
#endif

/* One call of a prefill tile: columns [c0, c1) of R converted rows times M packed tokens.
 * The accumulators start at zero (first) or from acc, and end in acc or, after the last
 * column block, as y[t*ldy + i] = the fixed-tree sum. Splitting the columns into blocks only
 * pauses each accumulator: the order of its operations is that of one pass. */
typedef struct tile_args {
    const float *wp; /* [R] rows, stride ldw */
    int64_t ldw;
    const float *xp; /* [M] packed tokens, stride ldx */
    int64_t ldx;
    int64_t c0, c1;
    float *acc;      /* [RMAX][TMAX][VW] saved accumulators */
    int first, last;
    float *y;
    int64_t ldy;
    const uint8_t *pf, *pf_end; /* lines to prefetch, one per step */
} tile_args;

AI void tile_f32(const int R, const int M, const tile_args *a) {
    vf acc[RMAX][TMAX];
    const float *wp = a->wp, *xp = a->xp;
    const int64_t ldw = a->ldw, ldx = a->ldx;
    const uint8_t *pf = a->pf, *pf_end = a->pf_end;
    if (a->first) {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++) acc[i][t] = VZERO();
    } else {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            acc[i][t] = VLOAD(a->acc + (i * TMAX + t) * VW);
    }
    /* the packed rows are [w0 | w1] per chunk, so stepping one vector at a time visits
     * w0 then w1 of each chunk: the same order as the fused tiles. One line of the next rows
     * is requested per step ([pf, pf_end)), spread over the compute-bound loop. */
    for (int64_t c = a->c0; c < a->c1; c += VW) {
        if (pf < pf_end) { /* two lines per step: a tile's share fits its first column block */
            __builtin_prefetch(pf, 0, 2);
            __builtin_prefetch(pf + 64, 0, 2);
            pf += 128;
        }
        /* the R weight vectors stay in registers, the tokens stream past them */
        vf wv[RMAX];
        UNROLL for (int i = 0; i < R; i++) wv[i] = VLOAD(wp + i * ldw + c);
        UNROLL for (int t = 0; t < M; t++) {
            const vf xv = VLOAD(xp + t * ldx + c);
            UNROLL for (int i = 0; i < R; i++) acc[i][t] = VFMA(wv[i], xv, acc[i][t]);
        }
    }
    if (a->last) {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            a->y[t * a->ldy + i] = vhsum(acc[i][t]);
    } else {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            VSTORE(a->acc + (i * TMAX + t) * VW, acc[i][t]);
    }
}

/* Fused: rows [r, r+R) read in place, M packed tokens. */
AI void tile_fused(const int fk, const int R, const int M, const st_matrix *w, int64_t r,
                   const float *xp, int64_t ldx, float *y, int64_t ldy) {
    vf acc[RMAX][TMAX];
    rowp rp[RMAX];
    const int64_t K = w->cols;
    /* the same place in the rows R further on (the next call's), requested as this block
     * streams: rows are short (2 KiB at 1024 bf16 columns) and the hardware prefetchers stop
     * at page boundaries; prefetching past the matrix is harmless */
    const int64_t pf_dist = (int64_t)R * (w->fmt == ST_WFMT_AFFINE ? st_matrix_ld(w) * w->bits / 8
                                                                   : st_matrix_ld(w) * (w->fmt == ST_WFMT_F32 ? 4 : 2));
    const int64_t chunk_bytes = w->fmt == ST_WFMT_AFFINE ? CH * w->bits / 8
                                : (int64_t)(CH * (w->fmt == ST_WFMT_F32 ? 4 : 2));
    row_ptrs(w, r, R, rp);
UNROLL
    for (int i = 0; i < R; i++)
UNROLL
        for (int t = 0; t < M; t++) acc[i][t] = VZERO();
    if (fk == FK_Q8 || fk == FK_Q4) {
        const int64_t gpc = w->group / CH, ng = K / w->group;
        for (int64_t g = 0; g < ng; g++) {
            gctx gc[RMAX];
UNROLL
            for (int i = 0; i < R; i++)
                gc[i] = aff_prep(fk, ld_scalar(rp[i].s, w->sdtype, g),
                                 ld_scalar(rp[i].b, w->sdtype, g));
            for (int64_t c = g * gpc; c < (g + 1) * gpc; c++) {
                vf x0[TMAX], x1[TMAX];
UNROLL
                for (int t = 0; t < M; t++) {
                    x0[t] = VLOAD(xp + t * ldx + c * CH);
                    x1[t] = VLOAD(xp + t * ldx + c * CH + VW);
                }
UNROLL
                for (int i = 0; i < R; i++) {
                    vf w0, w1;
                    __builtin_prefetch(rp[i].d + c * chunk_bytes + pf_dist, 0, 3);
                    ld_aff(fk, rp[i].d, c, gc[i], &w0, &w1);
UNROLL
                    for (int t = 0; t < M; t++) {
                        acc[i][t] = VFMA(w0, x0[t], acc[i][t]);
                        acc[i][t] = VFMA(w1, x1[t], acc[i][t]);
                    }
                }
            }
        }
    } else {
        const int64_t nfull = K / CH;
        for (int64_t c = 0; c <= nfull; c++) {
            if (c == nfull && K % CH == 0) break;
            vf x0[TMAX], x1[TMAX];
UNROLL
            for (int t = 0; t < M; t++) {
                x0[t] = VLOAD(xp + t * ldx + c * CH);
                x1[t] = VLOAD(xp + t * ldx + c * CH + VW);
            }
UNROLL
            for (int i = 0; i < R; i++) {
                vf w0, w1;
                __builtin_prefetch(rp[i].d + c * chunk_bytes + pf_dist, 0, 3);
                if (c < nfull) ld_dense(fk, rp[i].d, c, &w0, &w1);
                else ld_dense_tail(fk, rp[i].d, K, &w0, &w1);
UNROLL
                for (int t = 0; t < M; t++) {
                    acc[i][t] = VFMA(w0, x0[t], acc[i][t]);
                    acc[i][t] = VFMA(w1, x1[t], acc[i][t]);
                }
            }
        }
    }
UNROLL
    for (int i = 0; i < R; i++)
UNROLL
        for (int t = 0; t < M; t++) y[t * ldy + i] = vhsum(acc[i][t]);
}

/* instantiations */
typedef void (*tile_f32_fn)(const tile_args *);
typedef void (*tile_fused_fn)(const st_matrix *, int64_t, const float *, int64_t, float *,
                              int64_t);

#define TF(R, M)                                                                               \
    static void tf_##R##_##M(const tile_args *a) { tile_f32(R, M, a); }
#define TF_ROW(R) TF(R, 1) TF(R, 2) TF(R, 3) TF(R, 4) TF(R, 5) TF(R, 6) TF(R, 7) TF(R, 8)
TF_ROW(1)
TF_ROW(RP)
#define TF_PTRS(R) {tf_##R##_1, tf_##R##_2, tf_##R##_3, tf_##R##_4, tf_##R##_5, tf_##R##_6,     \
                    tf_##R##_7, tf_##R##_8}
#define TF_PTRS_(R) TF_PTRS(R)
static const tile_f32_fn tf_one[8] = TF_PTRS(1);
static const tile_f32_fn tf_full[8] = TF_PTRS_(RP);

#define TU(PRE, FK, R, M)                                                                      \
    static void PRE##_##FK##_##M(const st_matrix *w, int64_t r, const float *xp, int64_t ldx,  \
                                 float *y, int64_t ldy) {                                      \
        tile_fused(FK, R, M, w, r, xp, ldx, y, ldy);                                           \
    }
/* tub_*: a block of RD1 (one token) or RD2 (2..MFUSED tokens) rows; tus_*: one row */
#define TU_FK(FK, RA, RB)                                                                      \
    TU(tub, FK, RA, 1) TU(tub, FK, RB, 2) TU(tub, FK, RB, 3) TU(tub, FK, RB, 4)                \
        TU(tus, FK, 1, 1) TU(tus, FK, 1, 2) TU(tus, FK, 1, 3) TU(tus, FK, 1, 4)
#define TU_FK_(FK, RA, RB) TU_FK(FK, RA, RB)
TU_FK_(FK_F32, RD1, RD2)
TU_FK_(FK_F16, RD1, RD2)
TU_FK_(FK_BF16, RD1, RD2)
TU_FK_(FK_Q8, RD1, RD2)
TU_FK_(FK_Q4, RD1, RD2)
/* [fk][0: block of rows, 1: one row][M-1] */
#define TU_PTRS(FK)                                                                            \
    {{tub_##FK##_1, tub_##FK##_2, tub_##FK##_3, tub_##FK##_4},                                 \
     {tus_##FK##_1, tus_##FK##_2, tus_##FK##_3, tus_##FK##_4}}
static const tile_fused_fn tu_tab[5][2][MFUSED] = {TU_PTRS(FK_F32), TU_PTRS(FK_F16),
                                                     TU_PTRS(FK_BF16), TU_PTRS(FK_Q8),
                                                     TU_PTRS(FK_Q4)};

/* ---------------------------------------------------------------------------------------- */
/* MLX 8-bit: the scale after the dot product (see the top of this file) */

/* Per token and group: X_g = the fixed-tree sum of the group's packed x (natural order),
 * in rows of ldxs (ng rounded up to VW, zero-padded). */
static void group_sums(const float *xp, int64_t kp, int64_t n, int64_t K, int64_t group,
                       float *xsum, int64_t ldxs) {
    const int64_t ng = K / group;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t g = 0; g < ng; g++) {
            vf a = VZERO();
            for (int64_t v = g * group; v < (g + 1) * group; v += VW) a = VADD(a, VLOAD(xp + t * kp + v));
            xsum[t * ldxs + g] = vhsum(a);
        }
        for (int64_t g = ng; g < ldxs; g++) xsum[t * ldxs + g] = 0.0f;
    }
}

/* VW scales (or biases) of a row from index i0 as fp32; past n, zeros */
AI vf ld_scales_at(const uint8_t *base, st_dtype dt, int64_t i0, int64_t n) {
    const size_t es = dt == ST_DTYPE_F32 ? 4 : 2;
    if (i0 + VW <= n) return ld_scales(base + (size_t)i0 * es, dt);
    uint8_t tmp[VW * 4];
    memset(tmp, 0, sizeof tmp);
    memcpy(tmp, base + (size_t)i0 * es, (size_t)(n - i0) * es);
    return ld_scales(tmp, dt);
}

/* decode: rows [r, r+R) read in place, M tokens (packed xp, group sums xsum); y = tree sum */
AI void tile_q8_fused(const int R, const int M, const st_matrix *w, int64_t r, const float *xp,
                      int64_t ldx, const float *xsum, int64_t ldxs, float *y, int64_t ldy) {
    const int64_t K = w->cols, group = w->group, ng = K / group;
    /* prefetch the same place PF_Q8_BLOCKS row blocks on (at least 16 KiB ahead) */
    const int64_t pf_dist = R * K * PF_Q8_BLOCKS < 16384 ? 16384 : R * K * PF_Q8_BLOCKS;
    vf acc[RMAX][TMAX];
    rowp rp[RMAX];
    row_ptrs(w, r, R, rp);
    /* the bias part starts each accumulator: per lane, the row's biases times the token's
     * group sums, VW groups at a time in order (q8_bias_init) */
    UNROLL for (int i = 0; i < R; i++) {
        UNROLL for (int t = 0; t < M; t++) acc[i][t] = VZERO();
        for (int64_t g0 = 0; g0 < ng; g0 += VW) {
            const vf b = ld_scales_at(rp[i].b, w->sdtype, g0, ng);
            UNROLL for (int t = 0; t < M; t++)
                acc[i][t] = VFMA(b, VLOAD(xsum + t * ldxs + g0), acc[i][t]);
        }
    }
    for (int64_t g0 = 0; g0 < ng; g0 += VW) {
        /* the scales of the next VW groups as fp32, VW per row (then broadcast from memory,
         * which costs a load rather than a shuffle) */
        float sc[RMAX * VW];
        UNROLL for (int i = 0; i < R; i++) VSTORE(sc + i * VW, ld_scales_at(rp[i].s, w->sdtype, g0, ng));
        const int64_t g1 = g0 + VW < ng ? g0 + VW : ng;
        for (int64_t g = g0; g < g1; g++) {
            vf aq[RMAX][TMAX];
            UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++) aq[i][t] = VZERO();
            for (int64_t v = g * group; v < (g + 1) * group; v += VW) {
                vf xv[TMAX];
                UNROLL for (int t = 0; t < M; t++) xv[t] = VLOAD(xp + t * ldx + v);
                UNROLL for (int i = 0; i < R; i++) {
                    if (v % 64 == 0) __builtin_prefetch(rp[i].d + v + pf_dist, 0, 3);
                    const vf q = ld_u8f(rp[i].d + v);
                    UNROLL for (int t = 0; t < M; t++) aq[i][t] = VFMA(q, xv[t], aq[i][t]);
                }
            }
            UNROLL for (int i = 0; i < R; i++) {
                const vf sv = VSET1(sc[i * VW + (g - g0)]);
                UNROLL for (int t = 0; t < M; t++) acc[i][t] = VFMA(sv, aq[i][t], acc[i][t]);
            }
        }
    }
    UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
        y[t * ldy + i] = vhsum(acc[i][t]);
}

/* prefill: R rows of q as fp32 (qp, stride ldq; their scales/biases sc/bi [R][ng]) times M
 * packed tokens, columns [c0, c1) (whole groups); accumulators through a->acc as in tile_f32 */
typedef struct q8_args {
    tile_args t;
    const float *sc;   /* [R][ng] scales */
    const float *bi;   /* [R][ldbi] biases as fp32, zero-padded to whole vectors */
    int64_t ldbi;
    const float *xsum; /* [M][ldxs] the tokens' group sums */
    int64_t ldxs;
    int64_t group, ng;
} q8_args;

AI void tile_q8(const int R, const int M, const q8_args *qa) {
    const tile_args *a = &qa->t;
    const int64_t group = qa->group, ng = qa->ng;
    vf acc[RMAX][TMAX];
    if (a->first) { /* the bias part first, as in tile_q8_fused */
        UNROLL for (int i = 0; i < R; i++) {
            UNROLL for (int t = 0; t < M; t++) acc[i][t] = VZERO();
            for (int64_t g0 = 0; g0 < ng; g0 += VW) {
                const vf b = VLOAD(qa->bi + i * qa->ldbi + g0);
                UNROLL for (int t = 0; t < M; t++)
                    acc[i][t] = VFMA(b, VLOAD(qa->xsum + t * qa->ldxs + g0), acc[i][t]);
            }
        }
    } else {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            acc[i][t] = VLOAD(a->acc + (i * TMAX + t) * VW);
    }
    const uint8_t *pf = a->pf;
    for (int64_t g0 = a->c0; g0 < a->c1; g0 += group) {
        vf aq[RMAX][TMAX];
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++) aq[i][t] = VZERO();
        for (int64_t c = g0; c < g0 + group; c += VW) {
            if (pf < a->pf_end) {
                __builtin_prefetch(pf, 0, 2);
                __builtin_prefetch(pf + 64, 0, 2);
                pf += 128;
            }
            vf wv[RMAX];
            UNROLL for (int i = 0; i < R; i++) wv[i] = VLOAD(a->wp + i * a->ldw + c);
            UNROLL for (int t = 0; t < M; t++) {
                const vf xv = VLOAD(a->xp + t * a->ldx + c);
                UNROLL for (int i = 0; i < R; i++) aq[i][t] = VFMA(wv[i], xv, aq[i][t]);
            }
        }
        const int64_t g = g0 / group;
        UNROLL for (int i = 0; i < R; i++) {
            const vf sv = VSET1(qa->sc[i * ng + g]);
            UNROLL for (int t = 0; t < M; t++) acc[i][t] = VFMA(sv, aq[i][t], acc[i][t]);
        }
    }
    if (a->last) {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            a->y[t * a->ldy + i] = vhsum(acc[i][t]);
    } else {
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int t = 0; t < M; t++)
            VSTORE(a->acc + (i * TMAX + t) * VW, acc[i][t]);
    }
}

typedef void (*tile_q8f_fn)(const st_matrix *, int64_t, const float *, int64_t, const float *,
                            int64_t, float *, int64_t);
typedef void (*tile_q8_fn)(const q8_args *);
#define TQF(R, M)                                                                              \
    static void tqf_##R##_##M(const st_matrix *w, int64_t r, const float *xp, int64_t ldx,     \
                              const float *xsum, int64_t ldxs, float *y, int64_t ldy) {        \
        tile_q8_fused(R, M, w, r, xp, ldx, xsum, ldxs, y, ldy);                                \
    }
#define TQ(R, M)                                                                               \
    static void tq_##R##_##M(const q8_args *a) { tile_q8(R, M, a); }
/* decode tiles: 8 rows x 1 token, 4 x 2, 2 x 3, 2 x 4, and single rows */
TQF(8, 1) TQF(4, 2) TQF(2, 3) TQF(2, 4) TQF(1, 1) TQF(1, 2) TQF(1, 3) TQF(1, 4)
static const tile_q8f_fn tqf_block[MFUSED] = {tqf_8_1, tqf_4_2, tqf_2_3, tqf_2_4};
static const int tqf_rows[MFUSED] = {8, 4, 2, 2};
static const tile_q8f_fn tqf_one[MFUSED] = {tqf_1_1, tqf_1_2, tqf_1_3, tqf_1_4};
/* prefill tiles: RQ x TQ (two accumulator sets per output) and single rows */
#define TQ_ROW(R) TQ(R, 1) TQ(R, 2) TQ(R, 3) TQ(R, 4)
#define TQ_ROW_(R) TQ_ROW(R)
TQ_ROW_(RQ)
TQ_ROW(1)
#define TQ_PTRS(R) {tq_##R##_1, tq_##R##_2, tq_##R##_3, tq_##R##_4}
#define TQ_PTRS_(R) TQ_PTRS(R)
static const tile_q8_fn tq_full[4] = TQ_PTRS_(RQ);
static const tile_q8_fn tq_one[4] = TQ_PTRS(1);

/* rows [r0, r1) of an 8-bit matrix for mb packed tokens (group sums xsum [mb][ldxs]);
 * scratch: wp [RQ][kp], sc [RQ][ng], bi [RQ][ldxs] */
static void q8_rows(const st_matrix *w, const float *xp, int64_t kp, int64_t mb,
                    const float *xsum, int64_t ldxs, float *y, int64_t ldy, int64_t r0,
                    int64_t r1, float *wp, float *sc, float *bi, float *accs) {
    const int64_t K = w->cols, group = w->group, ng = K / group;
    if (mb <= MFUSED) {
        const int rd = tqf_rows[mb - 1];
        int64_t r = r0;
        for (; r + rd <= r1; r += rd) {
            tqf_block[mb - 1](w, r, xp, kp, xsum, ldxs, y + r, ldy);
        }
        for (; r < r1; r++) {
            tqf_one[mb - 1](w, r, xp, kp, xsum, ldxs, y + r, ldy);
        }
        return;
    }
    /* column blocks: whole groups, about KBLK columns */
    const int64_t kblk = group >= KBLK ? group : KBLK / group * group;
    const int64_t n_tiles = (mb + TQT - 1) / TQT;
    for (int64_t r = r0; r < r1; r += RQ) {
        const int R = r1 - r < RQ ? (int)(r1 - r) : RQ;
        for (int i = 0; i < R; i++) {
            rowp p = row_ptr(w, r + i);
            for (int64_t c = 0; c < K; c += VW) VSTORE(wp + i * kp + c, ld_u8f(p.d + c));
            for (int64_t g = 0; g < ng; g++) sc[i * ng + g] = ld_scalar(p.s, w->sdtype, g);
            for (int64_t g = 0; g < ldxs; g++)
                bi[i * ldxs + g] = g < ng ? ld_scalar(p.b, w->sdtype, g) : 0.0f;
        }
        const uint8_t *pf = NULL, *pf_end = NULL;
        if (r + 2 * RQ < r1) row_span(w, r + 2 * RQ, r1 - r - 2 * RQ < RQ ? r1 - r - 2 * RQ : RQ, &pf, &pf_end);
        const int64_t share = pf ? ((pf_end - pf) / 64 + n_tiles - 1) / n_tiles * 64 : 0;
        for (int64_t c0 = 0; c0 < K; c0 += kblk) {
            q8_args qa = {.t = {.ldw = kp, .ldx = kp, .c0 = c0, .c1 = c0 + kblk < K ? c0 + kblk : K,
                                .first = c0 == 0, .last = c0 + kblk >= K, .ldy = ldy},
                          .sc = sc, .bi = bi, .ldbi = ldxs, .ldxs = ldxs,
                          .group = group, .ng = ng};
            for (int64_t t = 0; t < mb; t += TQT) {
                const int M = mb - t < TQT ? (int)(mb - t) : TQT;
                qa.t.xp = xp + t * kp;
                qa.xsum = xsum + t * ldxs;
                qa.t.pf = qa.t.pf_end = NULL;
                if (pf && c0 == 0) {
                    qa.t.pf = pf + (t / TQT) * share;
                    qa.t.pf_end = qa.t.pf + share < pf_end ? qa.t.pf + share : pf_end;
                }
                if (R == RQ) {
                    qa.t.acc = accs + (t / TQT) * RQ * TMAX * VW;
                    qa.t.wp = wp;
                    qa.t.y = y + t * ldy + r;
                    tq_full[M - 1](&qa);
                    continue;
                }
                for (int i = 0; i < R; i++) {
                    q8_args q1 = qa;
                    q1.t.acc = accs + ((t / TQT) * RQ + i) * TMAX * VW;
                    q1.t.wp = wp + i * kp;
                    q1.t.y = y + t * ldy + r + i;
                    q1.sc = sc + i * ng;
                    q1.bi = bi + i * ldxs;
                    tq_one[M - 1](&q1);
                    qa.t.pf = qa.t.pf_end = NULL;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* packed bf16 (ST_WPACK_BF16_V16): vectors over rows */

/* One tile: R row vectors (VW rows each, row vector rv0 + v covers rows (rv0 + v) * VW ..)
 * times M tokens over every column. Per output one accumulator lane, in column order:
 * acc = fma(w[2p], x[2p], acc), then fma(w[2p+1], x[2p+1], acc) for p = 0, 1, ...; the tile
 * shape only chooses which outputs run side by side, so every shape gives the same bits.
 * x: the M tokens interleaved by column pair, x[(p * M + t) * 2 + j] = token t's column
 * 2p + j (so the broadcasts of a step read one or two lines, not M rows that may alias).
 * Results go straight to y (VW consecutive rows of one token); rows outside [r0, r1) are not
 * written. */
AI void tile_v16(const int R, const int M, const uint16_t *pk, int64_t np, int64_t rv0,
                 const float *x, float *y, int64_t ldy, int64_t r0, int64_t r1, int pf) {
    vf acc[VT_RMAX][VT_MMAX];
    const uint16_t *wr[VT_RMAX];
    UNROLL for (int v = 0; v < R; v++) {
        const int64_t row = (rv0 + v) * VW;
        wr[v] = pk + ((row / 16) * np * 16 + row % 16) * 2;
    }
    /* prefetch: VT_PF_PAIRS ahead in each stream; over the last VT_PF_PAIRS pairs, the start
     * of the next tile's streams instead (when they are in range), so that a tile does not
     * begin with every stream waiting for memory */
    const uint16_t *wn[VT_RMAX];
    UNROLL for (int v = 0; v < R; v++) {
        const int64_t row = (rv0 + R + v) * VW;
        wn[v] = row < r1 ? pk + ((row / 16) * np * 16 + row % 16) * 2 : wr[v];
    }
    UNROLL for (int v = 0; v < R; v++) UNROLL for (int t = 0; t < M; t++) acc[v][t] = VZERO();
    const int64_t p_sw = np > VT_PF_PAIRS ? np - VT_PF_PAIRS : 0;
#define V16_STEP(PFADDR)                                                                       \
    do {                                                                                       \
        vf we[VT_RMAX], wo[VT_RMAX];                                                           \
        UNROLL for (int v = 0; v < R; v++) {                                                   \
            if (pf) __builtin_prefetch(PFADDR, 0, 3);                                          \
            ld_pair16(wr[v] + p * 32, &we[v], &wo[v]);                                         \
        }                                                                                      \
        UNROLL for (int t = 0; t < M; t++) {                                                   \
            const vf xe = VSET1(x[(p * M + t) * 2]), xo = VSET1(x[(p * M + t) * 2 + 1]);       \
            UNROLL for (int v = 0; v < R; v++) {                                               \
                acc[v][t] = VFMA(we[v], xe, acc[v][t]);                                        \
                acc[v][t] = VFMA(wo[v], xo, acc[v][t]);                                        \
            }                                                                                  \
        }                                                                                      \
    } while (0)
    int64_t p = 0;
    for (; p < p_sw; p++) V16_STEP(wr[v] + (p + VT_PF_PAIRS) * 32);
    for (; p < np; p++) V16_STEP(wn[v] + (p - p_sw) * 32);
#undef V16_STEP
    UNROLL for (int v = 0; v < R; v++) {
        const int64_t row = (rv0 + v) * VW;
        if (row >= r0 && row + VW <= r1) {
            UNROLL for (int t = 0; t < M; t++) VSTORE(y + t * ldy + row, acc[v][t]);
            continue;
        }
        float tmp[VW];
        UNROLL for (int t = 0; t < M; t++) {
            VSTORE(tmp, acc[v][t]);
            for (int i = 0; i < VW; i++)
                if (row + i >= r0 && row + i < r1) y[t * ldy + row + i] = tmp[i];
        }
    }
}

typedef void (*tile_v16_fn)(const uint16_t *, int64_t, int64_t, const float *, float *, int64_t,
                            int64_t, int64_t, int);
#define TV(R, M)                                                                               \
    static void tv_##R##_##M(const uint16_t *pk, int64_t np, int64_t rv0, const float *x,       \
                             float *y, int64_t ldy, int64_t r0, int64_t r1, int pf) {           \
        tile_v16(R, M, pk, np, rv0, x, y, ldy, r0, r1, pf);                                    \
    }
#if VW == 16
/* 32 registers: R*M accumulators + 2R weights + 2 broadcasts. Measured on 16 tokens (two
 * tiles of 8): 2 x 8 beats 4 x 4, 2 x 6 and 1 x 16; 2 x 12 spills. */
TV(8, 1) TV(4, 2) TV(4, 3) TV(4, 4) TV(2, 5) TV(2, 6) TV(2, 7) TV(2, 8)
TV(1, 1) TV(1, 2) TV(1, 3) TV(1, 4) TV(1, 5) TV(1, 6) TV(1, 7) TV(1, 8)
static const tile_v16_fn tv_full[VT_MMAX] = {tv_8_1, tv_4_2, tv_4_3, tv_4_4,
                                             tv_2_5, tv_2_6, tv_2_7, tv_2_8};
static const int tv_rows[VT_MMAX] = {8, 4, 4, 4, 2, 2, 2, 2};
static const tile_v16_fn tv_one[VT_MMAX] = {tv_1_1, tv_1_2, tv_1_3, tv_1_4,
                                            tv_1_5, tv_1_6, tv_1_7, tv_1_8};
#else
/* 16 registers */
TV(4, 1) TV(2, 2) TV(2, 3) TV(2, 4) TV(1, 1) TV(1, 2) TV(1, 3) TV(1, 4) TV(1, 5) TV(1, 6)
static const tile_v16_fn tv_full[VT_MMAX] = {tv_4_1, tv_2_2, tv_2_3, tv_2_4, tv_1_5, tv_1_6};
static const int tv_rows[VT_MMAX] = {4, 2, 2, 2, 1, 1};
static const tile_v16_fn tv_one[VT_MMAX] = {tv_1_1, tv_1_2, tv_1_3, tv_1_4, tv_1_5, tv_1_6};
#endif

/* y rows [r0, r1) of a packed bf16 matrix for n_tok tokens; scratch: the interleaved
 * activations of a block of tokens (at most 2^17 floats) */
static void matmul_v16(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                       int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    const uint16_t *pk = w->packed;
    const int64_t K = w->cols, np = K / 2;
    const int64_t rv0 = r0 / VW, rv1 = (r1 + VW - 1) / VW;
    /* tokens per block: their activations within 512 KiB, so they stay in L2 beside a row
     * chunk's weights while the chunk meets every token tile */
    int64_t mblk = 131072 / K;
    mblk = mblk < VT_MMAX ? VT_MMAX : mblk;
    for (int64_t m0 = 0; m0 < n_tok; m0 += mblk) {
        const int64_t mb = n_tok - m0 < mblk ? n_tok - m0 : mblk;
        /* token tiles of equal size, at most VT_MMAX, each interleaved by column pair */
        const int64_t n_tt = (mb + VT_MMAX - 1) / VT_MMAX, mt = (mb + n_tt - 1) / n_tt;
        /* one token interleaved is the token itself: read it in place */
        const float *xin = mb == 1 ? x + m0 * ldx : scratch;
        for (int64_t t = 0; t < mb && mb > 1; t += mt) {
            const int64_t M = mb - t < mt ? mb - t : mt;
            float *xi = scratch + t * K;
            for (int64_t i = 0; i < M; i++) {
                const float *xs = x + (m0 + t + i) * ldx;
                for (int64_t p = 0; p < np; p++) {
                    xi[(p * M + i) * 2] = xs[2 * p];
                    xi[(p * M + i) * 2 + 1] = xs[2 * p + 1];
                }
            }
        }
        for (int64_t rc = rv0; rc < rv1; rc += VT_RCHUNK) {
            const int64_t rc1 = rc + VT_RCHUNK < rv1 ? rc + VT_RCHUNK : rv1;
            for (int64_t t = 0; t < mb; t += mt) {
                const int M = (int)(mb - t < mt ? mb - t : mt);
                const float *xt = xin + t * K;
                float *yt = y + (m0 + t) * ldy;
                const int R = tv_rows[M - 1];
                int64_t rv = rc;
                /* the first token tile meets the chunk's weights first: it asks for them
                 * ahead of use; the others find them in L2 */
                const int pf = t == 0;
                for (; rv + R <= rc1; rv += R) tv_full[M - 1](pk, np, rv, xt, yt, ldy, r0, r1, pf);
                for (; rv < rc1; rv++) tv_one[M - 1](pk, np, rv, xt, yt, ldy, r0, r1, pf);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* matmul */

static void KFN(matmul_)(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                         int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    if (r0 >= r1 || n_tok <= 0) return;
    if (w->pack == ST_WPACK_BF16_V16 && w->packed) {
        matmul_v16(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
#ifdef KQ8V_MATMUL /* the includer's kernel for ST_WPACK_Q8_V16, when the CPU runs it */
    if (w->pack == ST_WPACK_Q8_V16 && w->packed && KQ8V_OK()) {
        KQ8V_MATMUL(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
#endif
    const int fk = fmt_kind(w), eo = fk_even_odd(fk);
    const int64_t K = w->cols, kp = round_up(K, CH);
    /* an f32 matrix of whole chunks converts to itself: its rows are used in place (the same
     * values, the same order) when they are 64-byte aligned (split loads would cost more than
     * the copy). The activations are always packed: measured faster than reading them in
     * place even when aligned. */
    const int w_direct = fk == FK_F32 && K == kp && ((uintptr_t)w->data % 64 == 0) && K % 16 == 0 &&
                         st_matrix_ld(w) == K;
    const int64_t mblk = mblk_for(kp);
    float *xp = scratch, *wp = scratch + (262144 > 24 * kp ? 262144 : 24 * kp);
    float *accs = wp + 16 * kp; /* [tiles][RP][TMAX][VW] accumulators between column blocks */
    for (int64_t m0 = 0; m0 < n_tok; m0 += mblk) {
        const int64_t mb = n_tok - m0 < mblk ? n_tok - m0 : mblk;
        float *ym = y + m0 * ldy;
        pack_x(x + m0 * ldx, ldx, mb, K, kp, eo, xp);
        const float *xs = xp;
        const int64_t ldxs = kp;
        if (fk == FK_Q8) {
            const int64_t ng = K / w->group, ldg = round_up(ng, VW);
            float *xsum = accs + 43 * RMAX * TMAX * VW; /* [mb][ldg] */
            float *sc = xsum + mblk * ldg;              /* [RQ][ng] */
            float *bi = sc + RQ * ng;                   /* [RQ][ldg] */
            group_sums(xs, kp, mb, K, w->group, xsum, ldg);
            q8_rows(w, xs, kp, mb, xsum, ldg, ym, ldy, r0, r1, wp, sc, bi, accs);
            continue;
        }
        if (mb <= MFUSED && fk != FK_GEN) {
            const int rd = mb == 1 ? RD1 : RD2;
            int64_t r = r0;
            for (; r + rd <= r1; r += rd) tu_tab[fk][0][mb - 1](w, r, xs, ldxs, ym + r, ldy);
            for (; r < r1; r++) tu_tab[fk][1][mb - 1](w, r, xs, ldxs, ym + r, ldy);
            continue;
        }
        const int64_t n_tiles = (mb + TP - 1) / TP;
        for (int64_t r = r0; r < r1; r += RP) {
            const int R = r1 - r < RP ? (int)(r1 - r) : RP;
            const float *wr = wp;
            int64_t ldw = kp;
            if (w_direct) {
                wr = (const float *)w->data + r * K;
                ldw = K;
            } else {
                for (int i = 0; i < R; i++) convert_row(fk, w, r + i, wp + i * kp, kp);
            }
            /* the block after next, requested during this block's tiles (their loops are
             * compute-bound; the conversion would otherwise wait for DRAM) */
            const uint8_t *pf = NULL, *pf_end = NULL;
            if (r + 2 * RP < r1) row_span(w, r + 2 * RP, r1 - r - 2 * RP < RP ? r1 - r - 2 * RP : RP, &pf, &pf_end);
            const int64_t share = pf ? ((pf_end - pf) / 64 + n_tiles - 1) / n_tiles * 64 : 0;
            /* column blocks of KBLK keep this block's rows and the tokens' columns in L1 */
            for (int64_t c0 = 0; c0 < kp; c0 += KBLK) {
                tile_args ta = {.ldw = ldw, .ldx = ldxs, .c0 = c0, .c1 = c0 + KBLK < kp ? c0 + KBLK : kp,
                                .first = c0 == 0, .last = c0 + KBLK >= kp, .ldy = ldy};
                for (int64_t t = 0; t < mb; t += TP) {
                    const int M = mb - t < TP ? (int)(mb - t) : TP;
                    ta.xp = xs + t * ldxs;
                    ta.pf = ta.pf_end = NULL;
                    if (pf && c0 == 0) {
                        ta.pf = pf + (t / TP) * share;
                        ta.pf_end = ta.pf + share < pf_end ? ta.pf + share : pf_end;
                    }
                    if (R == RP) {
                        ta.acc = accs + (t / TP) * RP * TMAX * VW;
                        ta.wp = wr;
                        ta.y = ym + t * ldy + r;
                        tf_full[M - 1](&ta);
                        continue;
                    }
                    for (int i = 0; i < R; i++) { /* the last rows of the range, one by one */
                        ta.acc = accs + ((t / TP) * RP + i) * TMAX * VW;
                        ta.wp = wr + i * ldw;
                        ta.y = ym + t * ldy + r + i;
                        tf_one[M - 1](&ta);
                        ta.pf = ta.pf_end = NULL;
                    }
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* accum_rows: y[q][j] += sum_p a[q][p] v[p][j] */

#define QT 4

AI vf ld_v(const void *v, int v_bf16, int64_t off) {
    if (v_bf16) return ld_bf16_nat((const uint16_t *)v + off);
    return VLOAD((const float *)v + off);
}

AI void ar_tile(const int Q, const int NV, const void *v, int v_bf16, int64_t ldv, int64_t n_pos,
                const float *a, int64_t lda, float *y, int64_t ldy, int64_t j) {
    vf acc[QT][8];
    UNROLL for (int q = 0; q < Q; q++) UNROLL for (int u = 0; u < NV; u++)
        acc[q][u] = VLOAD(y + q * ldy + j + u * VW);
    for (int64_t p = 0; p < n_pos; p++) {
        vf vv[8];
        UNROLL for (int u = 0; u < NV; u++) vv[u] = ld_v(v, v_bf16, p * ldv + j + u * VW);
        UNROLL for (int q = 0; q < Q; q++) {
            vf ap = VSET1(a[q * lda + p]);
            UNROLL for (int u = 0; u < NV; u++) acc[q][u] = VFMA(ap, vv[u], acc[q][u]);
        }
    }
    UNROLL for (int q = 0; q < Q; q++) UNROLL for (int u = 0; u < NV; u++)
        VSTORE(y + q * ldy + j + u * VW, acc[q][u]);
}

/* every output is a sequential FMA chain over p, whichever tile computes it */
static void KFN(accum_rows_)(const void *v, int v_bf16, int64_t ldv, int64_t n_pos,
                             const float *a, int64_t lda, int64_t n_q, float *y, int64_t ldy,
                             int64_t n) {
    const int64_t nq4 = n_q / QT * QT;
    for (int64_t q = 0; q < n_q; q++) {
        const float *aq = a + q * lda;
        float *yq = y + q * ldy;
        int64_t j = 0;
        if (q < nq4) { /* 4 queries x 4 vectors, then x 1 vector, led by the block's first query */
            if (q % QT == 0) {
                for (; j + 4 * VW <= n; j += 4 * VW)
                    ar_tile(QT, 4, v, v_bf16, ldv, n_pos, aq, lda, yq, ldy, j);
                for (; j + VW <= n; j += VW) ar_tile(QT, 1, v, v_bf16, ldv, n_pos, aq, lda, yq, ldy, j);
            }
            j = n / VW * VW;
        } else { /* a lone query: 8 independent chains */
            for (; j + 8 * VW <= n; j += 8 * VW) ar_tile(1, 8, v, v_bf16, ldv, n_pos, aq, lda, yq, ldy, j);
        }
        for (; j + VW <= n; j += VW) ar_tile(1, 1, v, v_bf16, ldv, n_pos, aq, lda, yq, ldy, j);
        if (j < n) { /* the last n - j (< VW) outputs: their chains side by side over p */
            const int nt = (int)(n - j);
            float acc[VW];
            for (int u = 0; u < nt; u++) acc[u] = yq[j + u];
            if (v_bf16) {
                for (int64_t p = 0; p < n_pos; p++) {
                    const uint16_t *row = (const uint16_t *)v + p * ldv + j;
                    const float ap = aq[p];
                    for (int u = 0; u < nt; u++) acc[u] = fmaf(ap, st_bf16_to_f32(row[u]), acc[u]);
                }
            } else {
                for (int64_t p = 0; p < n_pos; p++) {
                    const float *row = (const float *)v + p * ldv + j;
                    const float ap = aq[p];
                    for (int u = 0; u < nt; u++) acc[u] = fmaf(ap, row[u], acc[u]);
                }
            }
            for (int u = 0; u < nt; u++) yq[j + u] = acc[u];
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* exp, silu */

AI vf vexp(vf x) {
    x = VMIN(VMAX(x, VSET1(-87.0f)), VSET1(88.0f));
    vf n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    vf r = VFMA(n, VSET1(-0.693359375f), x);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    vf p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET1(1.0f)));
    return VMUL(p, vpow2i(n));
}

static float KFN(exp_sum_)(float *x, int64_t n, float m) {
    vf acc = VZERO(), vm = VSET1(m);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        vf e = vexp(VSUB(VLOAD(x + i), vm));
        VSTORE(x + i, e);
        acc = VADD(acc, e);
    }
    float s = vhsum(acc);
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

static void KFN(silu_mul_)(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const vf one = VSET1(1.0f), zero = VZERO();
    for (; i + VW <= n; i += VW) {
        vf x = VLOAD(g + i);
        vf s = VDIV(x, VADD(one, vexp(VSUB(zero, x))));
        VSTORE(g + i, u ? VMUL(s, VLOAD(u + i)) : s);
    }
    for (; i < n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        g[i] = u ? s * u[i] : s;
    }
}

static void KFN(conv_silu_)(const float *w, int64_t ldw, int K, float *state, int64_t lds,
                            const float *m, float *out, int64_t n) {
    const vf one = VSET1(1.0f), zero = VZERO();
    int64_t c = 0;
    for (; c + VW <= n; c += VW) {
        const vf mv = VLOAD(m + c);
        vf acc = VZERO();
        for (int j = 0; j < K - 1; j++) acc = VFMA(VLOAD(w + j * ldw + c), VLOAD(state + j * lds + c), acc);
        acc = VFMA(VLOAD(w + (int64_t)(K - 1) * ldw + c), mv, acc);
        for (int j = 0; j + 1 < K - 1; j++) VSTORE(state + j * lds + c, VLOAD(state + (j + 1) * lds + c));
        if (K > 1) VSTORE(state + (int64_t)(K - 2) * lds + c, mv);
        VSTORE(out + c, VDIV(acc, VADD(one, vexp(VSUB(zero, acc)))));
    }
    for (; c < n; c++) {
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc = fmaf(w[j * ldw + c], state[j * lds + c], acc);
        acc = fmaf(w[(int64_t)(K - 1) * ldw + c], m[c], acc);
        for (int j = 0; j + 1 < K - 1; j++) state[j * lds + c] = state[(j + 1) * lds + c];
        if (K > 1) state[(int64_t)(K - 2) * lds + c] = m[c];
        out[c] = acc / (1.0f + expf(-acc));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* delta-rule step: S' = alpha S + delta k^T with delta = beta (v - alpha S k);
 * o = S' q = alpha (S q) + delta (k.q), so one read of each row serves both products. */

static void KFN(gdn_step_)(float *S, int64_t Dv, int64_t Dk, const float *q, const float *k,
                           const float *v, float alpha, float beta, float *o) {
    if (Dk % VW) { /* odd head sizes (tests only): the same formulas, scalar */
        float kq = 0.0f;
        for (int64_t j = 0; j < Dk; j++) kq = fmaf(k[j], q[j], kq);
        for (int64_t r = 0; r < Dv; r++) {
            float *row = S + r * Dk, rk = 0.0f, rq = 0.0f;
            for (int64_t j = 0; j < Dk; j++) {
                rk = fmaf(row[j], k[j], rk);
                rq = fmaf(row[j], q[j], rq);
            }
            float delta = beta * (v[r] - alpha * rk);
            o[r] = alpha * rq + delta * kq;
            for (int64_t j = 0; j < Dk; j++) row[j] = fmaf(row[j], alpha, delta * k[j]);
        }
        return;
    }
    vf kqv = VZERO();
    for (int64_t j = 0; j < Dk; j += VW) kqv = VFMA(VLOAD(k + j), VLOAD(q + j), kqv);
    const float kq = vhsum(kqv);
    const vf va = VSET1(alpha);
    for (int64_t r = 0; r < Dv; r++) {
        float *row = S + r * Dk;
        vf ak = VZERO(), aq = VZERO();
        for (int64_t j = 0; j < Dk; j += VW) {
            vf s = VLOAD(row + j);
            ak = VFMA(s, VLOAD(k + j), ak);
            aq = VFMA(s, VLOAD(q + j), aq);
        }
        const float rk = vhsum(ak), rq = vhsum(aq);
        const float delta = beta * (v[r] - alpha * rk);
        o[r] = alpha * rq + delta * kq;
        const vf vd = VSET1(delta);
        for (int64_t j = 0; j < Dk; j += VW)
            VSTORE(row + j, VFMA(VLOAD(row + j), va, VMUL(vd, VLOAD(k + j))));
    }
}
