/* ==== MLX affine quantization: packing, dequantization, the quantizer ====
 * Dequantization is checked against an independent bit-by-bit unpacker for every supported
 * width and group size, including values that straddle 32-bit words, negative scales and
 * f16/f32 scale dtypes; the quantizer's round-trip error stays within half a step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/numeric.h"
#include "tap.h"
#include "tensor/matrix.h"

/* the q value of element j read one bit at a time from the little-endian bit stream */
static uint32_t naive_q(const uint32_t *words, int64_t j, int bits) {
    uint32_t q = 0;
    for (int b = 0; b < bits; b++) {
        uint64_t p = (uint64_t)j * (uint64_t)bits + (uint64_t)b;
        q |= ((words[p / 32] >> (p % 32)) & 1u) << b;
    }
    return q;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

int main(void) {
    const int bits_list[] = {2, 3, 4, 5, 6, 8};
    const int groups[] = {32, 64, 128};
    const int64_t n = 256;
    float w[256], back[256];
    uint32_t packed[256];
    uint16_t sc[16], bi[16];
    for (int bi_ = 0; bi_ < 6; bi_++) {
        for (int gi = 0; gi < 3; gi++) {
            int bits = bits_list[bi_], g = groups[gi];
            int worst_ok = 1, exact = 1, neg_seen = 0;
            for (int trial = 0; trial < 8; trial++) {
                for (int64_t j = 0; j < n; j++) {
                    float x = frand();
                    if (trial == 1) x = fabsf(x) + 0.5f;   /* all positive */
                    if (trial == 2) x = -fabsf(x) - 0.5f;  /* all negative */
                    if (trial == 3) x = 0.25f;             /* constant */
                    if (trial == 4) x = x * 1e-3f;         /* tiny range */
                    w[j] = x;
                }
                st_affine_quantize_row(w, n, bits, g, packed, sc, bi);
                st_matrix m = {.fmt = ST_WFMT_AFFINE, .rows = 1, .cols = n, .data = packed,
                               .scales = sc, .biases = bi, .sdtype = ST_DTYPE_BF16,
                               .bits = bits, .group = g};
                st_matrix_row_f32(&m, 0, back);
                for (int64_t j = 0; j < n; j++) {
                    float s = st_bf16_to_f32(sc[j / g]), b = st_bf16_to_f32(bi[j / g]);
                    if (s < 0) neg_seen = 1;
                    float want = s * (float)naive_q(packed, j, bits) + b;
                    if (want != back[j]) exact = 0;
                    /* half a step plus the bf16 rounding of scale and bias */
                    float tol = fabsf(s) * 0.5f + fabsf(s) * (float)((1 << bits) - 1) * 0.0079f +
                                fabsf(b) * 0.0079f + 1e-6f;
                    if (fabsf(back[j] - w[j]) > tol) worst_ok = 0;
                }
            }
            CHECK(exact, "%d-bit group %d: dequantization equals the bit-by-bit reference", bits, g);
            CHECK(worst_ok, "%d-bit group %d: round-trip error within half a step", bits, g);
            CHECK(neg_seen, "%d-bit group %d: negative scales occur and dequantize", bits, g);
        }
    }
    /* 3-bit values straddling words: element 10 uses bits 30-31 of word 0 and bit 0 of word 1 */
    {
        uint32_t words[3] = {0, 0, 0};
        for (int j = 0; j < 32; j++) {
            uint32_t q = (uint32_t)(j * 5 + 3) & 7u;
            uint64_t p = (uint64_t)j * 3;
            words[p / 32] |= q << (p % 32);
            if (p % 32 > 29) words[p / 32 + 1] |= q >> (32 - p % 32);
        }
        uint16_t one = st_f32_to_bf16(1.0f), zero = st_f32_to_bf16(0.0f);
        uint16_t s1[1] = {one}, b1[1] = {zero};
        st_matrix m = {.fmt = ST_WFMT_AFFINE, .rows = 1, .cols = 32, .data = words, .scales = s1,
                       .biases = b1, .sdtype = ST_DTYPE_BF16, .bits = 3, .group = 32};
        float out[32];
        st_matrix_row_f32(&m, 0, out);
        int ok = 1;
        for (int j = 0; j < 32; j++) ok &= out[j] == (float)((j * 5 + 3) & 7);
        CHECK(ok, "3-bit elements straddling 32-bit words decode (element 10 = %g)", out[10]);
    }
    /* negative scale and f16 / f32 scale dtypes: w = scale * q + bias */
    {
        uint32_t words[1] = {0x76543210u}; /* 4-bit q = 0..7 */
        uint16_t s16[1] = {st_f32_to_f16(-0.5f)}, b16[1] = {st_f32_to_f16(2.0f)};
        float s32[1] = {-0.5f}, b32[1] = {2.0f};
        st_matrix m = {.fmt = ST_WFMT_AFFINE, .rows = 1, .cols = 8, .data = words, .scales = s16,
                       .biases = b16, .sdtype = ST_DTYPE_F16, .bits = 4, .group = 8};
        float o16[8], o32[8];
        st_matrix_row_f32(&m, 0, o16);
        m.scales = s32;
        m.biases = b32;
        m.sdtype = ST_DTYPE_F32;
        st_matrix_row_f32(&m, 0, o32);
        int ok = 1;
        for (int j = 0; j < 8; j++) ok &= o16[j] == 2.0f - 0.5f * (float)j && o32[j] == o16[j];
        CHECK(ok, "negative scale with f16 and f32 scales: w = 2 - 0.5 q");
    }
    /* dense formats */
    {
        uint16_t bf[4] = {st_f32_to_bf16(1.5f), st_f32_to_bf16(-2.0f), st_f32_to_bf16(0.0f), st_f32_to_bf16(3.25f)};
        uint16_t hf[4] = {st_f32_to_f16(1.5f), st_f32_to_f16(-2.0f), st_f32_to_f16(0.0f), st_f32_to_f16(3.25f)};
        float o1[4], o2[4];
        st_matrix a = {.fmt = ST_WFMT_BF16, .rows = 1, .cols = 4, .data = bf};
        st_matrix b = {.fmt = ST_WFMT_F16, .rows = 1, .cols = 4, .data = hf};
        st_matrix_row_f32(&a, 0, o1);
        st_matrix_row_f32(&b, 0, o2);
        CHECK(!memcmp(o1, o2, sizeof o1) && o1[3] == 3.25f, "bf16 and f16 rows convert exactly");
        CHECK(st_f16_to_f32(0x0001) == ldexpf(1.0f, -24) && st_f16_to_f32(0x7c00) == INFINITY,
              "f16 subnormals and infinity");
    }
    return tap_done();
}
