/* ==== MLX 8-bit matrices packed for AVX-512 VNNI (ST_WPACK_Q8_V16) ====
 *
 * y[t][r] = sum_g s[r][g] sum_{k in g} q[r][k] x[t][k] + b[r][g] X[t][g], X = the group's sum
 * of x, computed with integer dot products (vpdpbusd: 64 u8 x s8 products per instruction)
 * instead of converting every weight to fp32:
 *   - Per token and group g the activations become integers X_k = round(x_k / d_g) with
 *     d_g = max |x_k| / XMAX (XMAX = 2088895, 21 bits and a sign: the rounding error is at
 *     most d_g / 2, a relative 2.4e-7 of the group's largest value, the size of fp32's own
 *     rounding), written as three signed 7-bit limbs X = a2 2^14 + a1 2^7 + a0 (a0, a1 in
 *     [-64, 63], a2 in [-128, 127]): the s8 operands.
 *   - Per group, for 16 rows at once (one vector lane per row, the packed layout): three
 *     int32 accumulators (one per limb) of vpdpbusd(q quad, limb quad broadcast), exact;
 *     then T = fma(A2, 2^14, fma(A1, 2^7, A0)) in fp32, and the row accumulator gets
 *     fma(T, s_g d_g) and fma(b_g, X_g). Groups in order, one accumulator lane per output:
 *     the tile shape never changes a result (batch invariance), and the same integers come
 *     out for a token alone or in a batch.
 * Per 1024 weights of 16 rows and a group of 64: 48 vpdpbusd and 8 vector operations, against
 * 208 for converting the weights (simd_impl.h), so 8-bit decode is bound by memory alone.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"
#include "kernels/cpu/q8vnni.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#endif

#define XMAX 2088895 /* 127 * 2^14 + 63 * 2^7 + 63 */
#define QV_RMAX 6 /* tile shapes: row blocks x tokens (tqv_full below) */
#ifndef QV_MMAX
#define QV_MMAX 8
#endif
#define AI static inline __attribute__((always_inline))
#if defined(__clang__)
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif

/* One token's activations in limbs: xl[j * 3 + l] = the four s8 limbs l of columns 4j..4j+3;
 * per group: dq[g] = d_g, xs[g] = the sum of the group's x (in a fixed order). Groups of a
 * multiple of 16 columns take the vector form, others the scalar one; a matrix always takes
 * the same form, and both give each X_k from the same IEEE operations. */
static inline void limbs_of(int32_t X, int32_t *a0, int32_t *a1, int32_t *a2) {
    *a0 = ((X + 64) & 127) - 64;
    const int32_t x1 = (X - *a0) / 128;
    *a1 = ((x1 + 64) & 127) - 64;
    *a2 = (x1 - *a1) / 128;
}

static void prep_group_scalar(const float *xg, int64_t G, int32_t *o, float *dq, float *xs) {
    float amax = 0, sum = 0;
    for (int64_t k = 0; k < G; k++) {
        const float a = fabsf(xg[k]);
        amax = a > amax ? a : amax;
        sum += xg[k];
    }
    const float d = amax / (float)XMAX;
    *dq = d;
    *xs = sum;
    for (int64_t j = 0; j < G / 4; j++) {
        uint32_t l0 = 0, l1 = 0, l2 = 0;
        for (int u = 0; u < 4; u++) {
            int32_t X = 0, a0, a1, a2;
            if (d > 0) {
                float v = rintf(xg[4 * j + u] / d);
                v = v > (float)XMAX ? (float)XMAX : v < -(float)XMAX ? -(float)XMAX : v;
                X = (int32_t)v;
            }
            limbs_of(X, &a0, &a1, &a2);
            l0 |= (uint32_t)(uint8_t)(int8_t)a0 << (8 * u);
            l1 |= (uint32_t)(uint8_t)(int8_t)a1 << (8 * u);
            l2 |= (uint32_t)(uint8_t)(int8_t)a2 << (8 * u);
        }
        o[j * 3] = (int32_t)l0;
        o[j * 3 + 1] = (int32_t)l1;
        o[j * 3 + 2] = (int32_t)l2;
    }
}

static void prep_group_vec(const float *xg, int64_t G, int32_t *o, float *dq, float *xs) {
    __m512 mx = _mm512_setzero_ps(), sm = _mm512_setzero_ps();
    for (int64_t k = 0; k < G; k += 16) {
        const __m512 v = _mm512_loadu_ps(xg + k);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        sm = _mm512_add_ps(sm, v);
    }
    const float amax = _mm512_reduce_max_ps(mx);
    const float d = amax / (float)XMAX;
    *dq = d;
    *xs = _mm512_reduce_add_ps(sm);
    const __m512 dv = _mm512_set1_ps(d > 0 ? d : 1.0f), lim = _mm512_set1_ps((float)XMAX);
    const __m512i c64 = _mm512_set1_epi32(64), c127 = _mm512_set1_epi32(127);
    for (int64_t k = 0; k < G; k += 16) {
        __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(xg + k), dv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_max_ps(_mm512_min_ps(v, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
        __m512i X = d > 0 ? _mm512_cvtps_epi32(v) : _mm512_setzero_si512();
        const __m512i a0 = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X, c64), c127), c64);
        const __m512i x1 = _mm512_srai_epi32(_mm512_sub_epi32(X, a0), 7);
        const __m512i a1 = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(x1, c64), c127), c64);
        const __m512i a2 = _mm512_srai_epi32(_mm512_sub_epi32(x1, a1), 7);
        int32_t b[3][4];
        _mm_storeu_si128((__m128i *)(void *)b[0], _mm512_cvtepi32_epi8(a0));
        _mm_storeu_si128((__m128i *)(void *)b[1], _mm512_cvtepi32_epi8(a1));
        _mm_storeu_si128((__m128i *)(void *)b[2], _mm512_cvtepi32_epi8(a2));
        int32_t *oq = o + (k / 4) * 3;
        for (int q = 0; q < 4; q++) {
            oq[q * 3] = b[0][q];
            oq[q * 3 + 1] = b[1][q];
            oq[q * 3 + 2] = b[2][q];
        }
    }
}

static void prep_token(const float *x, int64_t K, int64_t G, int32_t *xl, float *dq, float *xs) {
    for (int64_t g = 0; g < K / G; g++) {
        if (G % 16 == 0) prep_group_vec(x + g * G, G, xl + g * (G / 4) * 3, dq + g, xs + g);
        else prep_group_scalar(x + g * G, G, xl + g * (G / 4) * 3, dq + g, xs + g);
    }
}

/* 16 scales or biases (sdtype) as fp32 */
AI __m512 ld16(const uint8_t *p, st_dtype dt) {
    if (dt == ST_DTYPE_F32) return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (dt == ST_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

typedef struct q8v_tok {
    const int32_t *xl; /* [M] token limbs, stride ldl int32 */
    const float *dq, *xs; /* [M] per-group d and sums, stride ldg */
    int64_t ldl, ldg;
} q8v_tok;

/* R blocks (b0 ..) of 16 rows x M tokens over every group; rows outside [r0, r1) unwritten */
AI void tile_q8v(const int R, const int M, const st_matrix *w, int64_t b0, const q8v_tok *tk,
                 float *y, int64_t ldy, int64_t r0, int64_t r1, int pf) {
    const int64_t K = w->cols, G = w->group, ng = K / G, qpg = G / 4;
    const size_t bb = st_matrix_q8v16_block_bytes(w), so = st_matrix_q8v16_scales_at(w);
    const size_t bo = st_matrix_q8v16_biases_at(w), es = st_dtype_size(w->sdtype);
    const st_dtype dt = w->sdtype;
    const uint8_t *blk[QV_RMAX], *bn[QV_RMAX];
    const int64_t nq = K / 4, b_end = (r1 + 15) / 16;
    UNROLL for (int v = 0; v < R; v++) {
        blk[v] = (const uint8_t *)w->packed + (size_t)(b0 + v) * bb;
        /* the next tile's block, whose start is prefetched over this one's last quads */
        bn[v] = b0 + R + v < b_end ? (const uint8_t *)w->packed + (size_t)(b0 + R + v) * bb : blk[v];
    }
    /* the fp32 accumulators change once per group: they live in memory, the registers hold
     * the integer ones */
    float acc[QV_RMAX * QV_MMAX * 16] __attribute__((aligned(64)));
    UNROLL for (int v = 0; v < R; v++) UNROLL for (int t = 0; t < M; t++)
        _mm512_store_ps(acc + (v * M + t) * 16, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
        __m512i ia[QV_RMAX][QV_MMAX][3];
        UNROLL for (int v = 0; v < R; v++) UNROLL for (int t = 0; t < M; t++) {
            ia[v][t][0] = _mm512_setzero_si512();
            ia[v][t][1] = _mm512_setzero_si512();
            ia[v][t][2] = _mm512_setzero_si512();
        }
        for (int64_t j = g * qpg; j < (g + 1) * qpg; j++) {
            __m512i wq[QV_RMAX];
            UNROLL for (int v = 0; v < R; v++) {
                if (pf) __builtin_prefetch(j + 64 < nq ? blk[v] + (j + 64) * 64 : bn[v] + (j + 64 - nq) * 64, 0, 3);
                wq[v] = _mm512_loadu_si512((const void *)(blk[v] + j * 64));
            }
            UNROLL for (int t = 0; t < M; t++) {
                const int32_t *l = tk->xl + t * tk->ldl + j * 3;
                const __m512i l0 = _mm512_set1_epi32(l[0]), l1 = _mm512_set1_epi32(l[1]);
                const __m512i l2 = _mm512_set1_epi32(l[2]);
                UNROLL for (int v = 0; v < R; v++) {
                    ia[v][t][0] = _mm512_dpbusd_epi32(ia[v][t][0], wq[v], l0);
                    ia[v][t][1] = _mm512_dpbusd_epi32(ia[v][t][1], wq[v], l1);
                    ia[v][t][2] = _mm512_dpbusd_epi32(ia[v][t][2], wq[v], l2);
                }
            }
        }
        UNROLL for (int v = 0; v < R; v++) {
            const __m512 sv = ld16(blk[v] + so + (size_t)g * 16 * es, dt);
            const __m512 bv = ld16(blk[v] + bo + (size_t)g * 16 * es, dt);
            UNROLL for (int t = 0; t < M; t++) {
                const __m512 T = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(ia[v][t][2]), _mm512_set1_ps(16384.0f),
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[v][t][1]), _mm512_set1_ps(128.0f),
                                    _mm512_cvtepi32_ps(ia[v][t][0])));
                const __m512 sd = _mm512_mul_ps(sv, _mm512_set1_ps(tk->dq[t * tk->ldg + g]));
                float *a = acc + (v * M + t) * 16;
                __m512 av = _mm512_fmadd_ps(T, sd, _mm512_load_ps(a));
                av = _mm512_fmadd_ps(bv, _mm512_set1_ps(tk->xs[t * tk->ldg + g]), av);
                _mm512_store_ps(a, av);
            }
        }
    }
    UNROLL for (int v = 0; v < R; v++) {
        const int64_t row = (b0 + v) * 16;
        if (row >= r0 && row + 16 <= r1) {
            UNROLL for (int t = 0; t < M; t++)
                _mm512_storeu_ps(y + t * ldy + row, _mm512_load_ps(acc + (v * M + t) * 16));
            continue;
        }
        UNROLL for (int t = 0; t < M; t++) {
            const float *tmp = acc + (v * M + t) * 16;
            for (int i = 0; i < 16; i++)
                if (row + i >= r0 && row + i < r1) y[t * ldy + row + i] = tmp[i];
        }
    }
}

typedef void (*tile_q8v_fn)(const st_matrix *, int64_t, const q8v_tok *, float *, int64_t,
                            int64_t, int64_t, int);
#define TQV(R, M)                                                                              \
    static void tqv_##R##_##M(const st_matrix *w, int64_t b0, const q8v_tok *tk, float *y,      \
                              int64_t ldy, int64_t r0, int64_t r1, int pf) {                    \
        tile_q8v(R, M, w, b0, tk, y, ldy, r0, r1, pf);                                          \
    }
/* 32 registers: 3RM integer accumulators + R weights + 3 broadcasts */
TQV(6, 1) TQV(4, 2) TQV(2, 3) TQV(2, 4) TQV(1, 5) TQV(1, 6) TQV(1, 7) TQV(1, 8)
TQV(1, 1) TQV(1, 2) TQV(1, 3) TQV(1, 4)
static const tile_q8v_fn tqv_full[QV_MMAX] = {tqv_6_1, tqv_4_2, tqv_2_3, tqv_2_4,
                                              tqv_1_5, tqv_1_6, tqv_1_7, tqv_1_8};
static const int tqv_rows[QV_MMAX] = {6, 4, 2, 2, 1, 1, 1, 1};
static const tile_q8v_fn tqv_one[QV_MMAX] = {tqv_1_1, tqv_1_2, tqv_1_3, tqv_1_4,
                                             tqv_1_5, tqv_1_6, tqv_1_7, tqv_1_8};

/* ---- tokens in lanes, for 8 to 16 tokens ----
 * The same arithmetic with the vectors turned: a lane per token, a row's weight quad
 * broadcast. Integer sums are exact in any order and the fp32 steps per output are the same
 * operations on the same values (s_r * d_t, fma(T, sd, acc), fma(b_r, X_t, acc)), so the
 * results are bit-identical to the row-lane tiles above; per quad of columns a row costs one
 * broadcast and three vpdpbusd for all 16 tokens. */

/* the limbs of n <= 16 prepared tokens turned to lanes: xt[(j * 3 + l) * 16 + t]; dt/st
 * [g][16] the tokens' d and sums; missing tokens zero */
static void turn_tokens(const q8v_tok *tk, int n, int64_t K, int64_t ng, int32_t *xt, float *dt,
                        float *st) {
    const int64_t nq = K / 4;
    for (int64_t j = 0; j < nq * 3; j++)
        for (int t = 0; t < 16; t++) xt[j * 16 + t] = t < n ? tk->xl[t * tk->ldl + j] : 0;
    for (int64_t g = 0; g < ng; g++)
        for (int t = 0; t < 16; t++) {
            dt[g * 16 + t] = t < n ? tk->dq[t * tk->ldg + g] : 0.0f;
            st[g * 16 + t] = t < n ? tk->xs[t * tk->ldg + g] : 0.0f;
        }
}

AI float ld1(const uint8_t *p, st_dtype dt) {
    if (dt == ST_DTYPE_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == ST_DTYPE_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
}

/* rows [r, r+R) for the n turned tokens */
AI void tile_q8t(const int R, const st_matrix *w, int64_t r, const int32_t *xt, const float *dt,
                 const float *st, int n, float *y, int64_t ldy) {
    const int64_t K = w->cols, G = w->group, ng = K / G, qpg = G / 4;
    const size_t bb = st_matrix_q8v16_block_bytes(w), so = st_matrix_q8v16_scales_at(w);
    const size_t bo = st_matrix_q8v16_biases_at(w), es = st_dtype_size(w->sdtype);
    const uint8_t *q[8], *sc[8], *bi[8];
    UNROLL for (int v = 0; v < R; v++) {
        const uint8_t *blk = (const uint8_t *)w->packed + (size_t)((r + v) / 16) * bb;
        const int i = (int)((r + v) % 16);
        q[v] = blk + 4 * i;
        sc[v] = blk + so + (size_t)i * es;
        bi[v] = blk + bo + (size_t)i * es;
    }
    float acc[8 * 16] __attribute__((aligned(64)));
    UNROLL for (int v = 0; v < R; v++) _mm512_store_ps(acc + v * 16, _mm512_setzero_ps());
    for (int64_t g = 0; g < ng; g++) {
        __m512i ia[8][3];
        UNROLL for (int v = 0; v < R; v++) {
            ia[v][0] = _mm512_setzero_si512();
            ia[v][1] = _mm512_setzero_si512();
            ia[v][2] = _mm512_setzero_si512();
        }
        for (int64_t j = g * qpg; j < (g + 1) * qpg; j++) {
            const __m512i l0 = _mm512_load_si512((const void *)(xt + (j * 3) * 16));
            const __m512i l1 = _mm512_load_si512((const void *)(xt + (j * 3 + 1) * 16));
            const __m512i l2 = _mm512_load_si512((const void *)(xt + (j * 3 + 2) * 16));
            UNROLL for (int v = 0; v < R; v++) {
                int32_t qd;
                memcpy(&qd, q[v] + j * 64, 4);
                const __m512i wq = _mm512_set1_epi32(qd);
                ia[v][0] = _mm512_dpbusd_epi32(ia[v][0], wq, l0);
                ia[v][1] = _mm512_dpbusd_epi32(ia[v][1], wq, l1);
                ia[v][2] = _mm512_dpbusd_epi32(ia[v][2], wq, l2);
            }
        }
        const __m512 dv = _mm512_load_ps(dt + g * 16), xv = _mm512_load_ps(st + g * 16);
        UNROLL for (int v = 0; v < R; v++) {
            const __m512 T = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(ia[v][2]), _mm512_set1_ps(16384.0f),
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[v][1]), _mm512_set1_ps(128.0f),
                                _mm512_cvtepi32_ps(ia[v][0])));
            const __m512 sd = _mm512_mul_ps(_mm512_set1_ps(ld1(sc[v] + (size_t)g * 16 * es, w->sdtype)), dv);
            __m512 av = _mm512_fmadd_ps(T, sd, _mm512_load_ps(acc + v * 16));
            av = _mm512_fmadd_ps(_mm512_set1_ps(ld1(bi[v] + (size_t)g * 16 * es, w->sdtype)), xv, av);
            _mm512_store_ps(acc + v * 16, av);
        }
    }
    UNROLL for (int v = 0; v < R; v++)
        for (int t = 0; t < n; t++) y[t * ldy + r + v] = acc[v * 16 + t];
}

static void tqt_8(const st_matrix *w, int64_t r, const int32_t *xt, const float *dt,
                  const float *st, int n, float *y, int64_t ldy) {
    tile_q8t(8, w, r, xt, dt, st, n, y, ldy);
}
static void tqt_1(const st_matrix *w, int64_t r, const int32_t *xt, const float *dt,
                  const float *st, int n, float *y, int64_t ldy) {
    tile_q8t(1, w, r, xt, dt, st, n, y, ldy);
}

#ifndef QV_TURN_MIN
#define QV_TURN_MIN 8 /* token tiles of at least this many tokens use the turned tiles */
#endif

void st_q8v_matmul_avx512vnni(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
                              float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    ST_ASSERT(w->pack == ST_WPACK_Q8_V16 && w->packed);
    if (r0 >= r1 || n_tok <= 0) return;
    const int64_t K = w->cols, G = w->group, ng = K / G;
    /* a block of tokens' limbs within the scratch (st_kernels_matmul_scratch: >= 2^18 floats) */
    const int64_t ldl = (K / 4) * 3, ldg = ng, per_tok = ldl + 2 * ldg;
    int64_t mblk = 262144 / per_tok;
    mblk = mblk < 1 ? 1 : mblk;
    ST_ASSERT(per_tok <= 262144);
    int32_t *xl = (int32_t *)(void *)scratch;
    const int64_t b_lo = r0 / 16, b_hi = (r1 + 15) / 16;
    for (int64_t m0 = 0; m0 < n_tok; m0 += mblk) {
        const int64_t mb = n_tok - m0 < mblk ? n_tok - m0 : mblk;
        float *dq = (float *)(void *)(xl + mb * ldl), *xs = dq + mb * ldg;
        for (int64_t t = 0; t < mb; t++)
            prep_token(x + (m0 + t) * ldx, K, G, xl + t * ldl, dq + t * ldg, xs + t * ldg);
        /* token tiles of equal size, at most QV_MMAX; row chunks of 12 blocks meet every
         * token tile while in L2 */
        const int64_t n_tt = (mb + QV_MMAX - 1) / QV_MMAX, mt = (mb + n_tt - 1) / n_tt;
        if (mb >= QV_TURN_MIN) {
            /* tiles of up to 16 tokens in lanes, each meeting rows [r0, r1) in chunks of 8 */
            int32_t *xt = xl + 262144; /* past the limbs: 12K int32 + 32 ng floats */
            float *dt = (float *)(void *)(xt + 3 * K * 4), *st = dt + ng * 16;
            for (int64_t t = 0; t < mb; t += 16) {
                const int n = (int)(mb - t < 16 ? mb - t : 16);
                const q8v_tok tk = {xl + t * ldl, dq + t * ldg, xs + t * ldg, ldl, ldg};
                turn_tokens(&tk, n, K, ng, xt, dt, st);
                float *yt = y + (m0 + t) * ldy;
                int64_t r = r0;
                for (; r + 8 <= r1; r += 8) tqt_8(w, r, xt, dt, st, n, yt, ldy);
                for (; r < r1; r++) tqt_1(w, r, xt, dt, st, n, yt, ldy);
            }
            continue;
        }
        for (int64_t bc = b_lo; bc < b_hi; bc += 12) {
            const int64_t bc1 = bc + 12 < b_hi ? bc + 12 : b_hi;
            for (int64_t t = 0; t < mb; t += mt) {
                const int M = (int)(mb - t < mt ? mb - t : mt);
                const q8v_tok tk = {xl + t * ldl, dq + t * ldg, xs + t * ldg, ldl, ldg};
                float *yt = y + (m0 + t) * ldy;
                const int R = tqv_rows[M - 1], pf = t == 0;
                int64_t b = bc;
                for (; b + R <= bc1; b += R) tqv_full[M - 1](w, b, &tk, yt, ldy, r0, r1, pf);
                for (; b < bc1; b++) tqv_one[M - 1](w, b, &tk, yt, ldy, r0, r1, pf);
            }
        }
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#endif /* __x86_64__ */
