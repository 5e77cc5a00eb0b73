/* ==== AMX kernels: bf16 weights multiplied in AMX tiles (see amx_impl.h) ====
 * The tile algorithm (amx_impl.h) is built twice: with the AMX instructions (target pragma
 * below; selected only when CPUID reports AMX-TILE and AMX-BF16, the OS enables the tile
 * state in XCR0 and arch_prctl grants XTILEDATA, see dispatch.c), and with the tile
 * operations emulated in C (st_kernels_amx_emulated, any CPU with AVX-512) so that the
 * tests check the packing, tiling and remainder logic on machines without AMX. Every other
 * weight format, matrices whose width is not a multiple of 32, and every other kernel are the
 * avx512 set's. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"
#include "kernels/cpu/cpu_tables.h"
#include "kernels/kernels.h"

/* ---------------------------------------------------------------------------------------- */
/* emulated tiles: 8 registers of 16 rows x 64 bytes */

typedef uint8_t emu_tile[1024];

static void emu_load(uint8_t *t, const void *p, int64_t stride) {
    for (int i = 0; i < 16; i++) memcpy(t + 64 * i, (const uint8_t *)p + i * stride, 64);
}
static void emu_store(const uint8_t *t, void *p, int64_t stride) {
    for (int i = 0; i < 16; i++) memcpy((uint8_t *)p + i * stride, t + 64 * i, 64);
}
static void emu_bf_tile(const uint8_t *t, float *out /* [16][32] */) {
    for (int i = 0; i < 16 * 32; i++) {
        uint16_t h;
        memcpy(&h, t + 2 * i, 2);
        out[i] = st_bf16_to_f32(h);
    }
}
/* C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1] (fp32) */
static void emu_dp(uint8_t *c, const uint8_t *a, const uint8_t *b) {
    float fa[16 * 32], fb[16 * 32], fc[16 * 16];
    emu_bf_tile(a, fa);
    emu_bf_tile(b, fb);
    memcpy(fc, c, sizeof fc);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc = fc[m * 16 + n];
            for (int k = 0; k < 16; k++) {
                acc += fa[m * 32 + 2 * k] * fb[k * 32 + 2 * n];
                acc += fa[m * 32 + 2 * k + 1] * fb[k * 32 + 2 * n + 1];
            }
            fc[m * 16 + n] = acc;
        }
    memcpy(c, fc, sizeof fc);
}

/* ---------------------------------------------------------------------------------------- */
/* packing the activations (AVX-512; shared by both builds, so the emulated tests check it) */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif

/* bf16 (nearest even) of 16 finite floats, in the low 16 bits of each dword */
static inline __m512i bf16_rne(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
}

/* 32 floats -> hi, mid, lo: per part 16 pair dwords scattered down the 16 rows of the
 * B block (stride 64 bytes). bf16_rne equals st_f32_to_bf16 except for NaN, which the
 * activations never hold. */
static inline void pack_chunk_avx512(const float *xs, uint16_t *blk) {
    const __m512i idx = _mm512_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448, 512, 576, 640,
                                          704, 768, 832, 896, 960);
    /* words 0..31 of the pair vector = the low halves of dwords 0..15 of a, then b */
    const __m512i sel = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000a0008, 0x000e000c,
                                          0x00120010, 0x00160014, 0x001a0018, 0x001e001c,
                                          0x00220020, 0x00260024, 0x002a0028, 0x002e002c,
                                          0x00320030, 0x00360034, 0x003a0038, 0x003e003c);
    __m512 a = _mm512_loadu_ps(xs), b = _mm512_loadu_ps(xs + 16);
    for (int p = 0; p < 3; p++) {
        __m512i ha = bf16_rne(a), hb = bf16_rne(b);
        __m512i pairs = _mm512_permutex2var_epi16(ha, sel, hb);
        _mm512_i32scatter_epi32((void *)(blk + p * 512), idx, pairs, 1);
        a = _mm512_sub_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(ha, 16)));
        b = _mm512_sub_ps(b, _mm512_castsi512_ps(_mm512_slli_epi32(hb, 16)));
    }
}

/* 32 floats -> hi, mid, lo as 32 bf16 each in column order, at dst + 512 * part (one A-tile
 * row per part) */
static inline void pack_row_avx512(const float *xs, uint16_t *dst) {
    const __m512i sel = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000a0008, 0x000e000c,
                                          0x00120010, 0x00160014, 0x001a0018, 0x001e001c,
                                          0x00220020, 0x00260024, 0x002a0028, 0x002e002c,
                                          0x00320030, 0x00360034, 0x003a0038, 0x003e003c);
    __m512 a = _mm512_loadu_ps(xs), b = _mm512_loadu_ps(xs + 16);
    for (int p = 0; p < 3; p++) {
        __m512i ha = bf16_rne(a), hb = bf16_rne(b);
        _mm512_storeu_si512((void *)(dst + p * 512), _mm512_permutex2var_epi16(ha, sel, hb));
        a = _mm512_sub_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(ha, 16)));
        b = _mm512_sub_ps(b, _mm512_castsi512_ps(_mm512_slli_epi32(hb, 16)));
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

#define AMX_PACK_CHUNK(src, dst) pack_chunk_avx512((src), (dst))
#define AMX_PACK_ROW(src, dst) pack_row_avx512((src), (dst))
#define AMX_FN(n) n##_emu
#define AMX_ARGS emu_tile *tl,
#define AMX_PASS tl,
#define T_ZERO(t) memset(tl[t], 0, 1024)
#define T_LOAD(t, p, s) emu_load(tl[t], (const void *)(p), (s))
#define T_DP(c, a, b) emu_dp(tl[c], tl[a], tl[b])
#define T_STORE(t, p, s) emu_store(tl[t], (void *)(p), (s))
#define T_BEGIN() ((void)0)
#define T_END() ((void)0)
#include "kernels/cpu/amx_impl.h"
#undef AMX_FN
#undef AMX_ARGS
#undef AMX_PASS
#undef T_ZERO
#undef T_LOAD
#undef T_DP
#undef T_STORE
#undef T_BEGIN
#undef T_END
#undef AMX_PACK_CHUNK
#undef AMX_PACK_ROW

/* packed bf16 with a width of whole 32-column chunks: AMX on the packed copy; unpacked bf16
 * of such a width: AMX on the rows; anything else: the avx512 set (which reads the packed
 * copy when there is one). Per matrix one path, whatever the token count. */
static int amx_takes_packed(const st_matrix *w) {
    return w->pack == ST_WPACK_BF16_V16 && w->packed && w->cols % 32 == 0;
}
static int amx_takes_rows(const st_matrix *w) {
    return w->fmt == ST_WFMT_BF16 && w->pack == ST_WPACK_NONE && w->cols % 32 == 0 &&
           st_matrix_ld(w) == w->cols;
}

static void matmul_amx_emu(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
                           float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    if (amx_takes_packed(w)) {
        if (r0 >= r1 || n_tok <= 0) return;
        emu_tile tl[8];
        amx_matmul_packed_emu(tl, w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
    if (!amx_takes_rows(w)) {
        st_kernels_avx512_table()->matmul(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
    if (r0 >= r1 || n_tok <= 0) return;
    emu_tile tl[8];
    amx_matmul_emu(tl, w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}

/* ---------------------------------------------------------------------------------------- */
/* hardware tiles */

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("amx-tile,amx-bf16,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif

/* the 64-byte tile configuration (palette 1): tiles 0-7 all 16 rows x 64 bytes */
typedef struct tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void amx_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
}

#define AMX_PACK_CHUNK(src, dst) pack_chunk_avx512((src), (dst))
#define AMX_PACK_ROW(src, dst) pack_row_avx512((src), (dst))
#define AMX_FN(n) n##_hw
#define AMX_ARGS
#define AMX_PASS
#define T_ZERO(t) _tile_zero(t)
#define T_LOAD(t, p, s) _tile_loadd(t, (const void *)(p), (s))
#define T_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define T_STORE(t, p, s) _tile_stored(t, (void *)(p), (s))
#define T_BEGIN() amx_configure()
#define T_END() _tile_release()
#include "kernels/cpu/amx_impl.h"

static void matmul_amx_hw(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
                          float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    if (amx_takes_packed(w)) {
        if (r0 >= r1 || n_tok <= 0) return;
        amx_matmul_packed_hw(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
    if (!amx_takes_rows(w)) {
        st_kernels_avx512_table()->matmul(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
        return;
    }
    if (r0 >= r1 || n_tok <= 0) return;
    amx_matmul_hw(w, x, ldx, n_tok, y, ldy, r0, r1, scratch);
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif /* __x86_64__ */

/* ---------------------------------------------------------------------------------------- */
/* the tables: matmul from above, everything else from avx512 */

static void accum_rows_w(const void *v, int v_bf16, int64_t ldv, int64_t n_pos, const float *a,
                         int64_t lda, int64_t n_q, float *y, int64_t ldy, int64_t n) {
    st_kernels_avx512_table()->accum_rows(v, v_bf16, ldv, n_pos, a, lda, n_q, y, ldy, n);
}
static float exp_sum_w(float *x, int64_t n, float m) {
    return st_kernels_avx512_table()->exp_sum(x, n, m);
}
static void silu_mul_w(float *g, const float *u, int64_t n) {
    st_kernels_avx512_table()->silu_mul(g, u, n);
}
static void conv_silu_w(const float *w, int64_t ldw, int K, float *state, int64_t lds,
                        const float *m, float *out, int64_t n) {
    st_kernels_avx512_table()->conv_silu(w, ldw, K, state, lds, m, out, n);
}
static void gdn_step_w(float *S, int64_t Dv, int64_t Dk, const float *q, const float *k,
                       const float *v, float alpha, float beta, float *o) {
    st_kernels_avx512_table()->gdn_step(S, Dv, Dk, q, k, v, alpha, beta, o);
}

#if defined(__x86_64__)
static const st_kernels amx_kernels = {
    .name = "amx",
    .packs = ST_WPACK_BIT(ST_WPACK_BF16_V16) | ST_WPACK_BIT(ST_WPACK_Q8_V16), /* Q8: avx512's */
    .matmul = matmul_amx_hw,
    .accum_rows = accum_rows_w,
    .exp_sum = exp_sum_w,
    .silu_mul = silu_mul_w,
    .conv_silu = conv_silu_w,
    .gdn_step = gdn_step_w,
};
const st_kernels *st_kernels_amx_table(void) { return &amx_kernels; }
#endif

static const st_kernels amx_emu_kernels = {
    .name = "amx-emulated",
    .packs = ST_WPACK_BIT(ST_WPACK_BF16_V16) | ST_WPACK_BIT(ST_WPACK_Q8_V16), /* Q8: avx512's */
    .matmul = matmul_amx_emu,
    .accum_rows = accum_rows_w,
    .exp_sum = exp_sum_w,
    .silu_mul = silu_mul_w,
    .conv_silu = conv_silu_w,
    .gdn_step = gdn_step_w,
};
const st_kernels *st_kernels_amx_emulated(void) { return &amx_emu_kernels; }
