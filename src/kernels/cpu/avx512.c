/* ==== AVX-512 kernels (F/BW/VL/DQ; fp32 activations) ====
 * The vector vocabulary for simd_impl.h at 16 lanes. Compiled for AVX-512 by the target
 * pragma below (no build flags needed); only called after st_kernels_by_name checked the CPU.
 * q4 weights are dequantized through a 16-entry table per group (vpermps on the nibbles), so
 * a chunk of 32 weights costs one load, one widen, one shift and two permutes. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"

#include "kernels/cpu/cpu_tables.h"
#include "kernels/cpu/q8vnni.h"
#include "kernels/kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif

#define KSUFFIX avx512
#define VW 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
#define VROUND(a) _mm512_roundscale_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define RP 4
#define TP 6
#define RD1 8
#define RQ 4  /* 8-bit prefill tile: RQ rows x TQT tokens (two accumulator sets) */
#define TQT 3
#define VT_RMAX 8
#define VT_MMAX 8
#define VT_RCHUNK 8
#define VT_PF_PAIRS 64
#define RD2 4

static inline float vhsum(vf v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline vf vpow2i(vf n) {
    __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(i, 23));
}

static inline void eo_split(vf a, vf b, vf *e, vf *o) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    vf ev = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, io, b);
    *e = ev;
}

static inline void ld_bf16_eo(const uint16_t *p, vf *w0, vf *w1) {
    __m512i v = _mm512_loadu_si512((const void *)p);
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *w1 = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline void ld_f16(const uint16_t *p, vf *w0, vf *w1) {
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16)));
}

static inline void ld_pair16(const uint16_t *p, vf *e, vf *o) {
    __m512i v = _mm512_loadu_si512((const void *)p);
    *e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *o = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline vf ld_bf16_nat(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

typedef struct gctx {
    vf a; /* q8: scale; q4: the 16-entry table fma(s, q, b) */
    vf b; /* q8: bias */
} gctx;

static inline gctx q8_prep(float s, float b) {
    gctx g = {_mm512_set1_ps(s), _mm512_set1_ps(b)};
    return g;
}

static inline void ld_q8(const uint8_t *p, gctx g, vf *w0, vf *w1) {
    __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16)));
    *w0 = _mm512_fmadd_ps(g.a, _mm512_cvtepi32_ps(a), g.b);
    *w1 = _mm512_fmadd_ps(g.a, _mm512_cvtepi32_ps(b), g.b);
}

static inline vf ld_u8f(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline vf ld_scales(const void *p, st_dtype dt) {
    if (dt == ST_DTYPE_F32) return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (dt == ST_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}


static inline gctx q4_prep(float s, float b) {
    const vf iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    gctx g;
    g.a = _mm512_fmadd_ps(_mm512_set1_ps(s), iota, _mm512_set1_ps(b));
    g.b = g.a;
    return g;
}

/* 16 bytes = 32 nibbles; byte i holds element 2i (low) and 2i+1 (high). vpermps reads only
 * the low 4 bits of each index. */
static inline void ld_q4_eo(const uint8_t *p, gctx g, vf *w0, vf *w1) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *w0 = _mm512_permutexvar_ps(v, g.a);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), g.a);
}

#define KQ8V_MATMUL st_q8v_matmul_avx512vnni
#define KQ8V_OK() (st_cpu_get_features()->avx512vnni)
#include "kernels/cpu/simd_impl.h"

static const st_kernels avx512_kernels = {
    .name = "avx512",
    /* Q8_V16 runs on AVX512-VNNI only: st_kernels_packs drops it elsewhere */
    .packs = ST_WPACK_BIT(ST_WPACK_BF16_V16) | ST_WPACK_BIT(ST_WPACK_Q8_V16),
    .matmul = matmul_avx512,
    .accum_rows = accum_rows_avx512,
    .exp_sum = exp_sum_avx512,
    .silu_mul = silu_mul_avx512,
    .conv_silu = conv_silu_avx512,
    .gdn_step = gdn_step_avx512,
};

const st_kernels *st_kernels_avx512_table(void) { return &avx512_kernels; }

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
