/* ==== AVX2 + FMA + F16C kernels (fp32 activations) ====
 * The vector vocabulary for simd_impl.h at 8 lanes. Compiled for AVX2 by the target pragma
 * below (no build flags needed); only called after st_kernels_by_name checked the CPU. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"

#include "kernels/cpu/cpu_tables.h"
#include "kernels/kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define KSUFFIX avx2
#define VW 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define VROUND(a) _mm256_round_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define RP 2
#define TP 4
#define RD1 4
#define RQ 2  /* 8-bit prefill tile: RQ rows x TQT tokens (two accumulator sets) */
#define TQT 2
#define VT_RMAX 4
#define VT_MMAX 6
#define VT_RCHUNK 4
#define VT_PF_PAIRS 64
#define RD2 2

static inline float vhsum(vf v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline vf vpow2i(vf n) {
    __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
}

/* [a | b] = x0..x15 -> e = x0,x2,..,x14 and o = x1,..,x15 */
static inline void eo_split(vf a, vf b, vf *e, vf *o) {
    vf lo = _mm256_shuffle_ps(a, b, 0x88); /* a0 a2 b0 b2 | a4 a6 b4 b6 */
    vf hi = _mm256_shuffle_ps(a, b, 0xdd); /* a1 a3 b1 b3 | a5 a7 b5 b7 */
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(lo), 0xd8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(hi), 0xd8));
}

static inline void ld_bf16_eo(const uint16_t *p, vf *w0, vf *w1) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *w1 = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

static inline void ld_pair16(const uint16_t *p, vf *e, vf *o) { ld_bf16_eo(p, e, o); }

static inline void ld_f16(const uint16_t *p, vf *w0, vf *w1) {
    *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
}

static inline vf ld_bf16_nat(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

typedef struct gctx {
    vf a; /* scale */
    vf b; /* bias */
} gctx;

static inline gctx q8_prep(float s, float b) {
    gctx g = {_mm256_set1_ps(s), _mm256_set1_ps(b)};
    return g;
}
static inline gctx q4_prep(float s, float b) { return q8_prep(s, b); }

static inline vf ld_scales(const void *p, st_dtype dt) {
    if (dt == ST_DTYPE_F32) return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == ST_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}


static inline vf ld_u8f(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline void ld_q8(const uint8_t *p, gctx g, vf *w0, vf *w1) {
    __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    *w0 = _mm256_fmadd_ps(g.a, _mm256_cvtepi32_ps(a), g.b);
    *w1 = _mm256_fmadd_ps(g.a, _mm256_cvtepi32_ps(b), g.b);
}

/* 8 bytes = 16 nibbles; byte i holds element 2i (low) and 2i+1 (high) */
static inline void ld_q4_eo(const uint8_t *p, gctx g, vf *w0, vf *w1) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(15));
    __m256i hi = _mm256_srli_epi32(v, 4);
    *w0 = _mm256_fmadd_ps(g.a, _mm256_cvtepi32_ps(lo), g.b);
    *w1 = _mm256_fmadd_ps(g.a, _mm256_cvtepi32_ps(hi), g.b);
}

#include "kernels/cpu/simd_impl.h"

static const st_kernels avx2_kernels = {
    .name = "avx2",
    .packs = ST_WPACK_BIT(ST_WPACK_BF16_V16),
    .matmul = matmul_avx2,
    .accum_rows = accum_rows_avx2,
    .exp_sum = exp_sum_avx2,
    .silu_mul = silu_mul_avx2,
    .conv_silu = conv_silu_avx2,
    .gdn_step = gdn_step_avx2,
};

const st_kernels *st_kernels_avx2_table(void) { return &avx2_kernels; }

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
