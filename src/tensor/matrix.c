/* ==== Weight matrices: row conversion, MLX affine dequantization and quantization ==== */
#include "tensor/matrix.h"

#include <math.h>
#include <string.h>

#include "core/numeric.h"
#include "core/status.h"

int st_affine_bits_supported(int bits) {
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

size_t st_matrix_row_bytes(const st_matrix *m) {
    switch (m->fmt) {
    case ST_WFMT_F32: return (size_t)m->cols * 4;
    case ST_WFMT_F16:
    case ST_WFMT_BF16: return (size_t)m->cols * 2;
    case ST_WFMT_AFFINE:
        return (size_t)m->cols * (size_t)m->bits / 8 +
               2 * (size_t)(m->cols / m->group) * st_dtype_size(m->sdtype);
    }
    return 0;
}

static inline float load_scalar(const void *base, st_dtype dt, int64_t i) {
    switch (dt) {
    case ST_DTYPE_BF16: return st_bf16_to_f32(((const uint16_t *)base)[i]);
    case ST_DTYPE_F16: return st_f16_to_f32(((const uint16_t *)base)[i]);
    case ST_DTYPE_F32: return ((const float *)base)[i];
    default: ST_ASSERT(0 && "bad scale dtype");
    }
    return 0;
}

void st_matrix_row_f32(const st_matrix *m, int64_t r, float *out) {
    const int64_t n = m->cols, ld = st_matrix_ld(m);
    switch (m->fmt) {
    case ST_WFMT_F32: memcpy(out, (const float *)m->data + r * ld, (size_t)n * 4); return;
    case ST_WFMT_BF16: {
        const uint16_t *w = (const uint16_t *)m->data + r * ld;
        for (int64_t j = 0; j < n; j++) out[j] = st_bf16_to_f32(w[j]);
        return;
    }
    case ST_WFMT_F16: {
        const uint16_t *w = (const uint16_t *)m->data + r * ld;
        for (int64_t j = 0; j < n; j++) out[j] = st_f16_to_f32(w[j]);
        return;
    }
    case ST_WFMT_AFFINE: {
        const int b = m->bits;
        const int64_t words = ld * b / 32, ngroups = n / m->group, lds = ld / m->group;
        const uint32_t *w = (const uint32_t *)m->data + r * words;
        const uint32_t mask = (1u << b) - 1u;
        for (int64_t g = 0; g < ngroups; g++) {
            float s = load_scalar(m->scales, m->sdtype, r * lds + g);
            float bias = load_scalar(m->biases, m->sdtype, r * lds + g);
            for (int64_t j = g * m->group; j < (g + 1) * m->group; j++) {
                uint64_t p = (uint64_t)j * (uint64_t)b;
                uint64_t wi = p >> 5;
                unsigned sh = (unsigned)(p & 31);
                uint32_t q = w[wi] >> sh;
                if (sh + (unsigned)b > 32) q |= w[wi + 1] << (32 - sh);
                out[j] = s * (float)(q & mask) + bias;
            }
        }
        return;
    }
    }
    ST_ASSERT(0 && "bad matrix format");
}

/* one group's parameters, as bf16 */
typedef struct qparams {
    uint16_t s, b;
} qparams;

/* the level of x on the grid (s, b): clamp(round((x - b) / s)) */
static inline float level(float x, float s, float b, float levels) {
    float q = s != 0.0f ? roundf((x - b) / s) : 0.0f;
    if (!(q >= 0.0f)) q = 0.0f; /* also catches NaN */
    return q > levels ? levels : q;
}

/* squared error of a group on the bf16 grid p */
static double group_error(const float *x, int g, qparams p, float levels) {
    float s = st_bf16_to_f32(p.s), b = st_bf16_to_f32(p.b);
    double e = 0;
    for (int i = 0; i < g; i++) {
        double d = (double)(s * level(x[i], s, b, levels) + b) - (double)x[i];
        e += d * d;
    }
    return e;
}

static qparams round_params(float s, float b) {
    qparams p = {st_f32_to_bf16(s), st_f32_to_bf16(b)};
    return p;
}

/* MLX: the edge of larger magnitude is the bias; the scale, pointing away from it, is snapped
 * so that the edge is an exact multiple of it (zero stays representable). Truncating (not
 * rounding) edge/scale only ever widens the step, so the grid still covers [lo, hi]. */
static qparams mlx_params(float lo, float hi, float levels) {
    int use_min = fabsf(lo) > fabsf(hi);
    float scale = (hi - lo) / levels;
    if (scale < 1e-7f) scale = 1e-7f;
    if (!use_min) scale = -scale;
    float edge = use_min ? lo : hi;
    float q0 = truncf(edge / scale);
    float bias = edge;
    if (q0 != 0.0f) scale = edge / q0;
    else bias = 0.0f;
    return round_params(scale, bias);
}

/* least-squares scale and bias for fixed levels q of x; 0 when the levels are all equal */
static int refit(const float *x, int g, const float *q, float *s, float *b) {
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < g; i++) {
        sq += q[i];
        sqq += (double)q[i] * q[i];
        sx += x[i];
        sqx += (double)q[i] * x[i];
    }
    double det = (double)g * sqq - sq * sq;
    if (det <= 0) return 0;
    *s = (float)(((double)g * sqx - sq * sx) / det);
    *b = (float)((sqq * sx - sq * sqx) / det);
    return 1;
}

static qparams group_params(const float *x, int g, float levels, st_quant_method method) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < g; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    if (method == ST_QUANT_MLX) return mlx_params(lo, hi, levels);
    qparams best = round_params(hi > lo ? (hi - lo) / levels : 0.0f, lo);
    if (method == ST_QUANT_MINMAX || !(hi > lo)) return best;
    double best_e = group_error(x, g, best, levels);
    qparams m = mlx_params(lo, hi, levels);
    double e = group_error(x, g, m, levels);
    if (e < best_e) best = m, best_e = e;
    /* grids of (levels - 1 .. levels + 1) steps over [lo, hi], each refitted on its levels */
    float q[256];
    for (int k = 0; k <= 20; k++) {
        float inv = (levels - 1.0f + 0.1f * (float)k) / (hi - lo);
        for (int i = 0; i < g; i++) {
            float l = roundf((x[i] - lo) * inv);
            q[i] = l < 0 ? 0 : l > levels ? levels : l;
        }
        float s, b;
        if (!refit(x, g, q, &s, &b)) continue;
        for (int pass = 0; pass < 2; pass++) { /* refit once more on the rounded grid's levels */
            qparams p = round_params(s, b);
            e = group_error(x, g, p, levels);
            if (e < best_e) best = p, best_e = e;
            float ps = st_bf16_to_f32(p.s), pb = st_bf16_to_f32(p.b);
            for (int i = 0; i < g; i++) q[i] = level(x[i], ps, pb, levels);
            if (!refit(x, g, q, &s, &b)) break;
        }
    }
    return best;
}

double st_affine_quantize_row_as(const float *w, int64_t n, int bits, int group,
                                 st_quant_method method, uint32_t *packed, uint16_t *scales_bf16,
                                 uint16_t *biases_bf16) {
    ST_ASSERT(n % group == 0 && (n * bits) % 32 == 0 && st_affine_bits_supported(bits) && group <= 256);
    const float levels = (float)((1 << bits) - 1);
    memset(packed, 0, (size_t)(n * bits / 32) * sizeof *packed);
    double err = 0;
    for (int64_t g = 0; g < n / group; g++) {
        const float *x = w + g * group;
        qparams p = group_params(x, group, levels, method);
        scales_bf16[g] = p.s;
        biases_bf16[g] = p.b;
        float s = st_bf16_to_f32(p.s), b0 = st_bf16_to_f32(p.b);
        for (int i = 0; i < group; i++) {
            float q = level(x[i], s, b0, levels);
            double d = (double)(s * q + b0) - (double)x[i];
            err += d * d;
            uint32_t qi = (uint32_t)q;
            uint64_t bit = (uint64_t)(g * group + i) * (uint64_t)bits;
            uint64_t wi = bit >> 5;
            unsigned sh = (unsigned)(bit & 31);
            packed[wi] |= qi << sh;
            if (sh + (unsigned)bits > 32) packed[wi + 1] |= qi >> (32 - sh);
        }
    }
    return err;
}

void st_affine_quantize_row(const float *w, int64_t n, int bits, int group, uint32_t *packed,
                            uint16_t *scales_bf16, uint16_t *biases_bf16) {
    (void)st_affine_quantize_row_as(w, n, bits, group, ST_QUANT_MLX, packed, scales_bf16, biases_bf16);
}

/* ---------------------------------------------------------------------------------------- */
/* packings */

unsigned st_matrix_packs_possible(const st_matrix *m) {
    unsigned k = 0;
    if (m->fmt == ST_WFMT_BF16 && m->cols % 2 == 0 && m->cols > 0 && m->rows > 0)
        k |= ST_WPACK_BIT(ST_WPACK_BF16_V16);
    if (m->fmt == ST_WFMT_AFFINE && m->bits == 8 && m->group % 4 == 0 && m->group > 0 &&
        m->cols % m->group == 0 && m->cols > 0 && m->rows > 0)
        k |= ST_WPACK_BIT(ST_WPACK_Q8_V16);
    return k;
}

size_t st_matrix_q8v16_scales_at(const st_matrix *m) { return (size_t)m->cols * 16; }

size_t st_matrix_q8v16_biases_at(const st_matrix *m) {
    return st_matrix_q8v16_scales_at(m) +
           (size_t)(m->cols / m->group) * 16 * st_dtype_size(m->sdtype);
}

size_t st_matrix_q8v16_block_bytes(const st_matrix *m) {
    const size_t end = st_matrix_q8v16_biases_at(m) +
                       (size_t)(m->cols / m->group) * 16 * st_dtype_size(m->sdtype);
    return (end + 63) / 64 * 64;
}

size_t st_matrix_pack_bytes(const st_matrix *m, st_wpack kind) {
    if (!(st_matrix_packs_possible(m) & ST_WPACK_BIT(kind))) return 0;
    const size_t blocks = (size_t)((m->rows + 15) / 16);
    switch (kind) {
    case ST_WPACK_BF16_V16: return blocks * 16 * (size_t)m->cols * 2;
    case ST_WPACK_Q8_V16: return blocks * st_matrix_q8v16_block_bytes(m);
    default: return 0;
    }
}

void st_matrix_pack(const st_matrix *m, st_wpack kind, void *dst, int64_t r0, int64_t r1) {
    ST_ASSERT(st_matrix_packs_possible(m) & ST_WPACK_BIT(kind));
    ST_ASSERT(r0 % 16 == 0 && r0 <= r1 && r1 <= m->rows);
    const int64_t K = m->cols, np = K / 2, ld = st_matrix_ld(m);
    const int64_t b0 = r0 / 16, b1 = (r1 + 15) / 16;
    if (kind == ST_WPACK_BF16_V16) {
        const uint8_t *src = m->data; /* rows of K bf16; a pair is 4 bytes (maybe unaligned) */
        uint32_t *out = dst;
        for (int64_t b = b0; b < b1; b++) {
            uint32_t *ob = out + b * np * 16;
            const int n = m->rows - b * 16 < 16 ? (int)(m->rows - b * 16) : 16;
            const uint8_t *rows = src + (size_t)(b * 16) * (size_t)ld * 2;
            for (int64_t p = 0; p < np; p++) {
                uint32_t *o = ob + p * 16;
                for (int i = 0; i < n; i++) memcpy(&o[i], rows + ((size_t)i * (size_t)ld + 2 * (size_t)p) * 2, 4);
                for (int i = n; i < 16; i++) o[i] = 0;
            }
        }
    }
    if (kind == ST_WPACK_Q8_V16) {
        const size_t bb = st_matrix_q8v16_block_bytes(m), es = st_dtype_size(m->sdtype);
        const size_t so = st_matrix_q8v16_scales_at(m), bo = st_matrix_q8v16_biases_at(m);
        const int64_t ng = K / m->group, lds = ld / m->group;
        const uint8_t *q = m->data; /* 8-bit: row r's q are bytes r*ld .. in column order */
        for (int64_t b = b0; b < b1; b++) {
            uint8_t *ob = (uint8_t *)dst + (size_t)b * bb;
            memset(ob, 0, bb);
            const int n = m->rows - b * 16 < 16 ? (int)(m->rows - b * 16) : 16;
            for (int i = 0; i < n; i++) {
                const int64_t r = b * 16 + i;
                const uint8_t *qr = q + (size_t)r * (size_t)ld;
                for (int64_t j = 0; j < K / 4; j++) memcpy(ob + j * 64 + 4 * i, qr + 4 * j, 4);
                const uint8_t *sr = (const uint8_t *)m->scales + (size_t)(r * lds) * es;
                const uint8_t *br = (const uint8_t *)m->biases + (size_t)(r * lds) * es;
                for (int64_t g = 0; g < ng; g++) {
                    memcpy(ob + so + ((size_t)g * 16 + (size_t)i) * es, sr + (size_t)g * es, es);
                    memcpy(ob + bo + ((size_t)g * 16 + (size_t)i) * es, br + (size_t)g * es, es);
                }
            }
        }
    }
}
