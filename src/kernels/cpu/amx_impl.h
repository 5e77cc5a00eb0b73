/* ==== AMX-BF16 matrix product, written once over tile macros (included by amx.c twice) ====
 *
 * y[t][r] = sum_k W[r][k] x[t][k] for bf16 W, in tiles:
 *   A = 16 weight rows x 32 bf16 (64 bytes) loaded straight from the row-major weights;
 *   B = the activations in VNNI layout: 16 pairs of k x 16 tokens (64 bytes per row),
 *       packed once per block of 32 tokens;
 *   C = 16 weight rows x 16 tokens of fp32.
 * Each activation is split into three bf16 parts x = hi + mid + lo (hi = bf16(x), mid =
 * bf16(x - hi), lo = bf16(x - hi - mid), exact to about 2^-27), and every A tile meets all
 * three, so the products are those of fp32 activations (the bf16 weights are exact) and the
 * accumulation is fp32: accuracy of the fp32 paths, not of bf16 activations (which miss the
 * fixtures' bound, see kernels.h). Per output: for each k-chunk in order, hi, mid, lo; tokens
 * are independent columns of the tiles, so a token's result does not depend on the others
 * in its tile (batch invariance).
 * Rows: 32 per step (two A tiles), a remainder copied into a zero-padded block; tokens: a
 * packed block of up to about 1 MiB (amx_mblk), walked two tiles at a time for each row
 * block. K must be a multiple of 32 (the caller falls back to AVX-512 otherwise, per matrix).
 *
 * The includer defines AMX_FN(name), the tile macros T_ZERO(t), T_LOAD(t, ptr, stride),
 * T_DP(c, a, b), T_STORE(t, ptr, stride), T_BEGIN() / T_END() (configure / release), a
 * `tiles` parameter list through AMX_ARGS / AMX_PASS (empty for hardware), and
 * AMX_PACK_CHUNK(src, dst): 32 floats -> the three parts' 16 pairs, written at dst + 32 kp
 * (+ 512 per part) for pair kp.
 */

/* tokens per packed activation block: about 1 MiB of parts (6 bytes per column per token),
 * a multiple of 32, at least 32 (st_kernels_matmul_scratch provides max(2^18, 64 kp) floats) */
static int64_t AMX_FN(amx_mblk)(int64_t K) {
    int64_t m = ((int64_t)1 << 20) / (6 * K) / 32 * 32;
    return m < 32 ? 32 : m;
}

#ifndef AMX_PACK_DEFINED
#define AMX_PACK_DEFINED
/* bf16 of a float, rounded to nearest even (finite values) */
static inline uint16_t amx_bf16(float v) { return st_f32_to_bf16(v); }
#endif

/* x rows [n][K] -> three parts in B layout for ntt token tiles of 16: block (chunk c, token
 * tile tb, part p) is 16 rows (pairs of k) of 32 uint16 (16 tokens x 2), at
 * xb + ((c * ntt + tb) * 3 + p) * 512 */
static void AMX_FN(amx_pack)(const float *x, int64_t ldx, int64_t n, int64_t K, int64_t ntt,
                             uint16_t *xb) {
    const int64_t nc = K / 32;
    memset(xb, 0, (size_t)(nc * ntt * 3 * 512) * sizeof(uint16_t));
    for (int64_t t = 0; t < n; t++) {
        const float *xs = x + t * ldx;
        const int64_t tb = t / 16, tc = t % 16;
        for (int64_t c = 0; c < nc; c++) {
            uint16_t *blk = xb + ((c * ntt + tb) * 3) * 512 + tc * 2;
            AMX_PACK_CHUNK(xs + c * 32, blk);
        }
    }
}

/* rows [r, r+32) (w: first row, stride ldw bytes) against nt (1 or 2) token tiles starting at
 * tile tb0 of the packed block; ctmp receives C as [4][16][16] (row tile, token tile) */
static void AMX_FN(amx_rows32)(AMX_ARGS const uint16_t *w, int64_t ldw, int64_t K,
                               const uint16_t *xb, int64_t ntt, int64_t tb0, int nt,
                               float *ctmp) {
    const int64_t nc = K / 32;
    T_ZERO(0);
    T_ZERO(1);
    T_ZERO(2);
    T_ZERO(3);
    for (int64_t c = 0; c < nc; c++) {
        T_LOAD(4, w + c * 32, ldw);
        T_LOAD(5, (const uint16_t *)((const uint8_t *)w + 16 * ldw) + c * 32, ldw);
        const uint16_t *b0 = xb + ((c * ntt + tb0) * 3) * 512;
        for (int p = 0; p < 3; p++) {
            T_LOAD(6, b0 + p * 512, 64);
            T_DP(0, 4, 6);
            T_DP(2, 5, 6);
            if (nt > 1) {
                T_LOAD(7, b0 + (3 + p) * 512, 64);
                T_DP(1, 4, 7);
                T_DP(3, 5, 7);
            }
        }
    }
    T_STORE(0, ctmp, 64);
    T_STORE(1, ctmp + 256, 64);
    T_STORE(2, ctmp + 512, 64);
    T_STORE(3, ctmp + 768, 64);
}

static void AMX_FN(amx_matmul)(AMX_ARGS const st_matrix *w, const float *x, int64_t ldx,
                               int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1,
                               float *scratch) {
    const int64_t K = w->cols, mblk = AMX_FN(amx_mblk)(K);
    uint16_t *xb = (uint16_t *)scratch;                       /* nc * (mblk/16) * 3 * 512 */
    uint16_t *pad = xb + (K / 32) * (mblk / 16) * 3 * 512;    /* [32][K] remainder rows */
    float *ctmp = (float *)(void *)(pad + 32 * K);            /* [4][16][16] */
    ctmp = (float *)(((uintptr_t)ctmp + 63) & ~(uintptr_t)63);
    const uint16_t *wd = (const uint16_t *)w->data;
    T_BEGIN();
    for (int64_t m0 = 0; m0 < n_tok; m0 += mblk) {
        const int64_t mb = n_tok - m0 < mblk ? n_tok - m0 : mblk;
        const int64_t ntt = (mb + 15) / 16;
        AMX_FN(amx_pack)(x + m0 * ldx, ldx, mb, K, ntt, xb);
        for (int64_t r = r0; r < r1; r += 32) {
            const int64_t rows = r1 - r < 32 ? r1 - r : 32;
            const uint16_t *src = wd + r * K;
            if (rows < 32) {
                memset(pad, 0, (size_t)(32 * K) * sizeof(uint16_t));
                memcpy(pad, src, (size_t)(rows * K) * sizeof(uint16_t));
                src = pad;
            }
            /* the 32 rows stay in L1/L2 while the token tiles pass, two at a time */
            for (int64_t tb = 0; tb < ntt; tb += 2) {
                const int nt = ntt - tb > 1 ? 2 : 1;
                AMX_FN(amx_rows32)(AMX_PASS src, K * 2, K, xb, ntt, tb, nt, ctmp);
                const int64_t t0 = tb * 16, t1 = t0 + nt * 16 < mb ? t0 + nt * 16 : mb;
                for (int64_t t = t0; t < t1; t++)
                    for (int64_t i = 0; i < rows; i++)
                        y[(m0 + t) * ldy + r + i] =
                            ctmp[((i / 16) * 2 + (t - t0) / 16) * 256 + (i % 16) * 16 + (t - t0) % 16];
            }
        }
    }
    T_END();
}

/* ---------------------------------------------------------------------------------------- */
/* packed weights (ST_WPACK_BF16_V16): the weights are the B tiles as they lie (16 column
 * pairs x 16 rows of W), the activations the A tiles (16 tokens x 32 columns, row-major,
 * three parts each), C = 16 tokens x 16 rows of W, stored straight into y. Per output: for
 * each 32-column chunk in order, hi, mid, lo. K must be a multiple of 32. */

/* x rows [n][K] -> the three parts of ntt token tiles: tile (token tile tb, chunk c, part p)
 * is 16 rows (tokens) of 32 bf16 at xa + ((tb * nc + c) * 3 + p) * 512; missing tokens zero */
static void AMX_FN(amx_pack_rows)(const float *x, int64_t ldx, int64_t n, int64_t K, int64_t ntt,
                                  uint16_t *xa) {
    const int64_t nc = K / 32;
    if (n % 16) /* the last tile's missing tokens */
        for (int64_t c = 0; c < nc; c++)
            for (int p = 0; p < 3; p++)
                memset(xa + (((ntt - 1) * nc + c) * 3 + p) * 512 + (n % 16) * 32, 0,
                       (size_t)(16 - n % 16) * 64);
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < nc; c++)
            AMX_PACK_ROW(x + t * ldx + c * 32, xa + (((t / 16) * nc + c) * 3) * 512 + (t % 16) * 32);
}

static void AMX_FN(amx_matmul_packed)(AMX_ARGS const st_matrix *w, const float *x, int64_t ldx,
                                      int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1,
                                      float *scratch) {
    const int64_t K = w->cols, nc = K / 32, np = K / 2, mblk = AMX_FN(amx_mblk)(K);
    const uint16_t *pk = w->packed;
    uint16_t *xa = (uint16_t *)scratch;                               /* nc * (mblk/16) * 3 * 512 */
    float *ctmp = (float *)(void *)(xa + nc * (mblk / 16) * 3 * 512); /* [16][16] */
    ctmp = (float *)(((uintptr_t)ctmp + 63) & ~(uintptr_t)63);
    const int64_t b0 = r0 / 16, b1 = (r1 + 15) / 16;
    T_BEGIN();
    for (int64_t m0 = 0; m0 < n_tok; m0 += mblk) {
        const int64_t mb = n_tok - m0 < mblk ? n_tok - m0 : mblk;
        const int64_t ntt = (mb + 15) / 16;
        AMX_FN(amx_pack_rows)(x + m0 * ldx, ldx, mb, K, ntt, xa);
        for (int64_t b = b0; b < b1; b += 2) {
            const int nb = b1 - b > 1 ? 2 : 1;
            /* the two blocks' weights stay in L1/L2 while the token tiles pass */
            for (int64_t tb = 0; tb < ntt; tb += 2) {
                const int nt = ntt - tb > 1 ? 2 : 1;
                T_ZERO(0);
                T_ZERO(1);
                T_ZERO(2);
                T_ZERO(3);
                for (int64_t c = 0; c < nc; c++) {
                    if (tb == 0) { /* the first token tiles meet the weights first: ask ahead */
                        const uint8_t *pf = (const uint8_t *)(pk + (b * np + 16 * (c + 4)) * 32);
                        for (int l = 0; l < 16 * nb; l++)
                            __builtin_prefetch(pf + (l / 16) * np * 64 + (l % 16) * 64, 0, 3);
                    }
                    T_LOAD(4, pk + (b * np + 16 * c) * 32, 64);
                    if (nb > 1) T_LOAD(5, pk + ((b + 1) * np + 16 * c) * 32, 64);
                    for (int p = 0; p < 3; p++) {
                        T_LOAD(6, xa + ((tb * nc + c) * 3 + p) * 512, 64);
                        T_DP(0, 6, 4);
                        if (nb > 1) T_DP(1, 6, 5);
                        if (nt > 1) {
                            T_LOAD(7, xa + (((tb + 1) * nc + c) * 3 + p) * 512, 64);
                            T_DP(2, 7, 4);
                            if (nb > 1) T_DP(3, 7, 5);
                        }
                    }
                }
                /* tile numbers must be constants for the hardware build */
#define AMX_STORE_C(idx, tt, bb)                                                               \
    do {                                                                                       \
        const int64_t t0_ = (tb + (tt)) * 16, row0_ = (b + (bb)) * 16;                         \
        float *yo_ = y + (m0 + t0_) * ldy + row0_;                                             \
        if (t0_ + 16 <= mb && row0_ >= r0 && row0_ + 16 <= r1) {                               \
            T_STORE(idx, yo_, ldy * (int64_t)sizeof(float));                                   \
        } else {                                                                               \
            T_STORE(idx, ctmp, 64);                                                            \
            for (int64_t t_ = 0; t_ < 16 && t0_ + t_ < mb; t_++)                               \
                for (int64_t i_ = 0; i_ < 16; i_++)                                            \
                    if (row0_ + i_ >= r0 && row0_ + i_ < r1) yo_[t_ * ldy + i_] = ctmp[t_ * 16 + i_]; \
        }                                                                                      \
    } while (0)
                AMX_STORE_C(0, 0, 0);
                if (nb > 1) AMX_STORE_C(1, 0, 1);
                if (nt > 1) AMX_STORE_C(2, 1, 0);
                if (nt > 1 && nb > 1) AMX_STORE_C(3, 1, 1);
#undef AMX_STORE_C
            }
        }
    }
    T_END();
}
