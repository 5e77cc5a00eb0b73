/* ==== Every SIMD kernel set against the scalar reference ====
 *
 * For each kernel set this CPU runs (st_kernels_by_name), on random shapes including odd
 * sizes and every weight format (f32, f16, bf16, MLX affine 2/3/4/5/6/8 bits with group 32,
 * 64 and 128 and bf16/f16/f32 scales):
 *   - matmul within a tolerance of the reference, scaled by sum |w x| per output;
 *   - batch invariance, bit for bit: each token's outputs equal the same token run alone, and
 *     any row sub-range equals the full call (the rule in kernels.h);
 *   - accum_rows (f32 and bf16 rows), exp_sum, silu_mul and the delta-rule step.
 * `test_kernels --list` prints the names of the available sets, one per line, and `--best`
 * the one chosen by default (used by tests/kernel_paths_test.sh).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/numeric.h"
#include "kernels/cpu/cpu_tables.h"
#include "kernels/kernels.h"
#include "tap.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((double)(next_u64() >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }
static int64_t irand(int64_t lo, int64_t hi) { return lo + (int64_t)(next_u64() % (uint64_t)(hi - lo + 1)); }

static float *falloc(int64_t n) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    memset(p, 0, bytes);
    return p;
}

/* a random matrix of the given format; storage in *buf (free with free_matrix) */
typedef struct tmat {
    st_matrix m;
    void *data, *scales, *biases;
} tmat;

static void make_matrix(tmat *t, st_wformat fmt, int64_t rows, int64_t cols, int bits, int group,
                        st_dtype sdt) {
    memset(t, 0, sizeof *t);
    t->m.fmt = fmt;
    t->m.rows = rows;
    t->m.cols = cols;
    if (fmt == ST_WFMT_AFFINE) {
        int64_t words = rows * cols * bits / 32, ng = rows * (cols / group);
        uint32_t *d = malloc((size_t)words * 4);
        for (int64_t i = 0; i < words; i++) d[i] = (uint32_t)next_u64();
        size_t es = st_dtype_size(sdt);
        uint8_t *s = malloc((size_t)ng * es), *b = malloc((size_t)ng * es);
        for (int64_t i = 0; i < ng; i++) {
            float sv = frand() * 0.05f, bv = frand() * 0.5f;
            if (sdt == ST_DTYPE_BF16) {
                uint16_t hs = st_f32_to_bf16(sv), hb = st_f32_to_bf16(bv);
                memcpy(s + 2 * i, &hs, 2);
                memcpy(b + 2 * i, &hb, 2);
            } else if (sdt == ST_DTYPE_F16) {
                uint16_t hs = st_f32_to_f16(sv), hb = st_f32_to_f16(bv);
                memcpy(s + 2 * i, &hs, 2);
                memcpy(b + 2 * i, &hb, 2);
            } else {
                memcpy(s + 4 * i, &sv, 4);
                memcpy(b + 4 * i, &bv, 4);
            }
        }
        t->data = d;
        t->scales = s;
        t->biases = b;
        t->m.bits = bits;
        t->m.group = group;
        t->m.sdtype = sdt;
    } else {
        int64_t n = rows * cols;
        if (fmt == ST_WFMT_F32) {
            float *d = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) d[i] = frand();
            t->data = d;
        } else {
            uint16_t *d = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++)
                d[i] = fmt == ST_WFMT_BF16 ? st_f32_to_bf16(frand()) : st_f32_to_f16(frand());
            t->data = d;
        }
    }
    t->m.data = t->data;
    t->m.scales = t->scales;
    t->m.biases = t->biases;
}

static void free_matrix(tmat *t) {
    free(t->data);
    free(t->scales);
    free(t->biases);
}

/* sum_c |W[r][c] x[t][c]| per output: the scale of the rounding error */
static void abs_products(const st_matrix *w, const float *x, int64_t n_tok, float *out) {
    float *row = falloc(w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        st_matrix_row_f32(w, r, row);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0;
            for (int64_t c = 0; c < w->cols; c++) s += fabs((double)row[c] * x[t * w->cols + c]);
            out[t * w->rows + r] = (float)s;
        }
    }
    free(row);
}

/* one matrix: accuracy against ref, then the invariance checks. Returns 1 when all passed. */
static int check_matmul(const st_kernels *k, const tmat *t, int64_t n_tok, double tol,
                        const char *what, double *worst) {
    const st_matrix *w = &t->m;
    const int64_t R = w->rows, K = w->cols;
    float *x = falloc(n_tok * K), *y = falloc(n_tok * R), *yr = falloc(n_tok * R);
    float *ya = falloc(R), *ys = falloc(n_tok * R), *sc = falloc(n_tok * R);
    float *scratch = falloc(st_kernels_matmul_scratch(K));
    for (int64_t i = 0; i < n_tok * K; i++) x[i] = frand();
    st_kernels_ref()->matmul(w, x, K, n_tok, yr, R, 0, R, scratch);
    k->matmul(w, x, K, n_tok, y, R, 0, R, scratch);
    abs_products(w, x, n_tok, sc);
    int ok = 1;
    for (int64_t i = 0; i < n_tok * R; i++) {
        double e = fabs((double)y[i] - yr[i]) / ((double)sc[i] + 1e-30);
        if (!(e <= tol)) {
            if (ok) printf("# %s: output %lld: got %.9g want %.9g (sum|wx| %.3g)\n", what,
                           (long long)i, y[i], yr[i], sc[i]);
            ok = 0;
        }
        if (e > *worst) *worst = e;
    }
    /* each token alone gives the same bits */
    int inv = 1;
    for (int64_t tk = 0; tk < n_tok && inv; tk++) {
        k->matmul(w, x + tk * K, K, 1, ya, R, 0, R, scratch);
        inv = memcmp(ya, y + tk * R, (size_t)R * sizeof(float)) == 0;
        if (!inv) printf("# %s: token %lld alone differs from the batch of %lld\n", what, (long long)tk, (long long)n_tok);
    }
    /* a sub-range of rows, with an odd start, gives the same bits */
    if (inv && R > 2) {
        int64_t r0 = irand(1, R - 1), r1 = irand(r0, R);
        memset(ys, 0, (size_t)(n_tok * R) * sizeof(float));
        k->matmul(w, x, K, n_tok, ys, R, r0, r1, scratch);
        for (int64_t tk = 0; tk < n_tok && inv; tk++)
            inv = memcmp(ys + tk * R + r0, y + tk * R + r0, (size_t)(r1 - r0) * sizeof(float)) == 0;
        if (!inv) printf("# %s: rows [%lld, %lld) alone differ\n", what, (long long)r0, (long long)r1);
    }
    free(x);
    free(y);
    free(yr);
    free(ya);
    free(ys);
    free(sc);
    free(scratch);
    return ok && inv;
}

static void test_matmul(const st_kernels *k) {
    const double tol_f32 = 1e-5;
    const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 13, 67};
    /* dense formats: odd sizes */
    const st_wformat dense[] = {ST_WFMT_F32, ST_WFMT_F16, ST_WFMT_BF16};
    const char *dname[] = {"f32", "f16", "bf16"};
    for (int f = 0; f < 3; f++) {
        int all = 1, n = 0;
        double worst = 0;
        for (int trial = 0; trial < 30; trial++) {
            int64_t R = irand(1, 45), K = trial < 4 ? (int64_t[]){1, 31, 32, 33}[trial] : irand(1, 300);
            if (trial == 5) K = 1024;
            if (trial == 6) K = 11000, R = 3; /* wide: several activation blocks of tokens */
            if (trial >= 24) { /* widths that are whole 32-column chunks (the AMX tiles) */
                K = 32 * irand(1, 6);
                R = irand(1, 70);
            }
            int64_t nt = trial >= 24 ? (int64_t[]){1, 16, 17, 33, 40, 67}[trial - 24] : toks[trial % 9];
            if (trial == 6) nt = 67;
            tmat t;
            make_matrix(&t, dense[f], R, K, 0, 0, ST_DTYPE_BF16);
            char what[128];
            snprintf(what, sizeof what, "%s %s [%lld x %lld] x %lld tokens", k->name, dname[f],
                     (long long)R, (long long)K, (long long)nt);
            double tol = tol_f32;
            all &= check_matmul(k, &t, nt, tol, what, &worst);
            free_matrix(&t);
            n++;
        }
        CHECK(all, "%s matmul %s: %d random shapes (odd sizes, whole 32-column chunks, 1..67 tokens) match ref (worst %.2e of sum|wx|), each token alone and any row range bit-identical",
              k->name, dname[f], n, worst);
    }
    /* packed bf16 (vectors over rows): rows not a multiple of 16, even widths, 1..67 tokens */
    if (st_kernels_packs(k) & ST_WPACK_BIT(ST_WPACK_BF16_V16)) {
        int all = 1, n = 0;
        double worst = 0;
        const int64_t ptoks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 25, 67};
        for (int trial = 0; trial < 32; trial++) {
            int64_t R = irand(1, 150), K = 2 * irand(1, 300);
            if (trial == 0) R = 16, K = 1024;
            if (trial == 1) R = 300, K = 2;
            if (trial == 2) R = 5, K = 20000; /* wide: several token blocks */
            if (trial >= 20) K = 32 * irand(1, 12); /* whole 32-column chunks (the AMX tiles) */
            int64_t nt = ptoks[trial % 16];
            if (trial == 2) nt = 40;
            tmat t;
            make_matrix(&t, ST_WFMT_BF16, R, K, 0, 0, ST_DTYPE_BF16);
            const size_t pb = st_matrix_pack_bytes(&t.m, ST_WPACK_BF16_V16);
            void *pk = malloc(pb);
            memset(pk, 0xA5, pb); /* pack must write every byte it owns */
            st_matrix_pack(&t.m, ST_WPACK_BF16_V16, pk, 0, R);
            t.m.pack = ST_WPACK_BF16_V16;
            t.m.packed = pk;
            char what[128];
            snprintf(what, sizeof what, "%s packed bf16 [%lld x %lld] x %lld tokens", k->name,
                     (long long)R, (long long)K, (long long)nt);
            all &= check_matmul(k, &t, nt, tol_f32, what, &worst);
            free(pk);
            free_matrix(&t);
            n++;
        }
        CHECK(all, "%s matmul packed bf16: %d shapes (1..300 rows, widths 2..20000 and whole 32-column chunks, 1..67 tokens) match ref (worst %.2e of sum|wx|), each token alone and any row range bit-identical",
              k->name, n, worst);
    }
    /* packed MLX 8-bit (integer dot products on activation limbs) */
    if (st_kernels_packs(k) & ST_WPACK_BIT(ST_WPACK_Q8_V16)) {
        int all = 1, n = 0;
        double worst = 0;
        const int64_t ptoks[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 67};
        for (int trial = 0; trial < 30; trial++) {
            const int group = (int[]){32, 64, 128, 20}[trial % 4]; /* 20: the scalar limbs */
            const st_dtype sdt = (st_dtype[]){ST_DTYPE_BF16, ST_DTYPE_F16, ST_DTYPE_F32}[(trial / 3) % 3];
            int64_t R = irand(1, 100), K = group * irand(1, 8);
            if (trial == 0) R = 64, K = 1024;
            int64_t nt = ptoks[trial % 10];
            tmat t;
            make_matrix(&t, ST_WFMT_AFFINE, R, K, 8, group, sdt);
            const size_t pb = st_matrix_pack_bytes(&t.m, ST_WPACK_Q8_V16);
            void *pk = malloc(pb);
            memset(pk, 0xA5, pb);
            st_matrix_pack(&t.m, ST_WPACK_Q8_V16, pk, 0, R);
            t.m.pack = ST_WPACK_Q8_V16;
            t.m.packed = pk;
            char what[160];
            snprintf(what, sizeof what, "%s packed q8 g%d %s [%lld x %lld] x %lld tokens", k->name,
                     group, st_dtype_name(sdt), (long long)R, (long long)K, (long long)nt);
            all &= check_matmul(k, &t, nt, tol_f32, what, &worst);
            free(pk);
            free_matrix(&t);
            n++;
        }
        CHECK(all, "%s matmul packed q8: %d shapes (groups 32/64/128/20, bf16/f16/f32 scales, 1..67 tokens) match ref (worst %.2e of sum|wx|), each token alone and any row range bit-identical",
              k->name, n, worst);
    }
    /* affine: every width, group and scale dtype */
    const int bits[] = {2, 3, 4, 5, 6, 8};
    const int groups[] = {32, 64, 128};
    const st_dtype sdts[] = {ST_DTYPE_BF16, ST_DTYPE_F16, ST_DTYPE_F32};
    for (int b = 0; b < 6; b++) {
        int all = 1, n = 0;
        double worst = 0;
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++) {
                int64_t R = irand(1, 40), K = groups[g] * irand(1, 6);
                int64_t nt = toks[(g * 3 + s + b) % 9];
                tmat t;
                make_matrix(&t, ST_WFMT_AFFINE, R, K, bits[b], groups[g], sdts[s]);
                char what[128];
                snprintf(what, sizeof what, "%s q%d g%d %s [%lld x %lld] x %lld tokens", k->name,
                         bits[b], groups[g], st_dtype_name(sdts[s]), (long long)R, (long long)K,
                         (long long)nt);
                all &= check_matmul(k, &t, nt, tol_f32, what, &worst);
                free_matrix(&t);
                n++;
            }
        CHECK(all, "%s matmul affine %d-bit: %d shapes (groups 32/64/128, bf16/f16/f32 scales) match ref (worst %.2e), batch-invariant",
              k->name, bits[b], n, worst);
    }
}

/* A contiguous copy of rows [r0, r0+nr) x columns [c0, c0+nc) of m (c0, nc whole groups and
 * whole words for affine): what a view of them must compute like. */
static void copy_block(const st_matrix *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, tmat *t) {
    memset(t, 0, sizeof *t);
    t->m = *m;
    t->m.rows = nr;
    t->m.cols = nc;
    t->m.ld = 0;
    t->m.pack = ST_WPACK_NONE;
    t->m.packed = NULL;
    const int64_t K = m->cols;
    if (m->fmt == ST_WFMT_AFFINE) {
        const size_t es = st_dtype_size(m->sdtype);
        const int64_t wpr = K * m->bits / 32, w0 = c0 * m->bits / 32, nw = nc * m->bits / 32;
        const int64_t gpr = K / m->group, g0 = c0 / m->group, ng = nc / m->group;
        uint32_t *d = malloc((size_t)(nr * nw) * 4);
        uint8_t *sc = malloc((size_t)(nr * ng) * es), *bi = malloc((size_t)(nr * ng) * es);
        for (int64_t r = 0; r < nr; r++) {
            memcpy(d + r * nw, (const uint32_t *)m->data + (r0 + r) * wpr + w0, (size_t)nw * 4);
            memcpy(sc + (size_t)(r * ng) * es, (const uint8_t *)m->scales + (size_t)((r0 + r) * gpr + g0) * es, (size_t)ng * es);
            memcpy(bi + (size_t)(r * ng) * es, (const uint8_t *)m->biases + (size_t)((r0 + r) * gpr + g0) * es, (size_t)ng * es);
        }
        t->data = d, t->scales = sc, t->biases = bi;
    } else {
        const size_t es = m->fmt == ST_WFMT_F32 ? 4 : 2;
        uint8_t *d = malloc((size_t)(nr * nc) * es);
        for (int64_t r = 0; r < nr; r++)
            memcpy(d + (size_t)(r * nc) * es, (const uint8_t *)m->data + (size_t)((r0 + r) * K + c0) * es, (size_t)nc * es);
        t->data = d;
    }
    t->m.data = t->data;
    t->m.scales = t->scales;
    t->m.biases = t->biases;
}

/* Views (st_matrix_rows / st_matrix_cols: the shards of tensor parallelism) compute the same
 * bits as contiguous copies of the same block, unpacked and packed. */
static void test_views(const st_kernels *k) {
    typedef struct { st_wformat fmt; int bits, group; const char *name; } vf;
    const vf fmts[] = {{ST_WFMT_F32, 0, 0, "f32"},    {ST_WFMT_F16, 0, 0, "f16"},
                       {ST_WFMT_BF16, 0, 0, "bf16"},  {ST_WFMT_AFFINE, 8, 32, "q8 g32"},
                       {ST_WFMT_AFFINE, 4, 64, "q4 g64"}, {ST_WFMT_AFFINE, 3, 32, "q3 g32"},
                       {ST_WFMT_AFFINE, 6, 64, "q6 g64"}};
    int all = 1, n = 0;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (int trial = 0; trial < 6; trial++) {
            const int64_t unit = fmts[f].group ? fmts[f].group : (trial % 2 ? 1 : 2);
            const int64_t K = unit * irand(3, 12), R = irand(3, 70);
            tmat p;
            make_matrix(&p, fmts[f].fmt, R, K, fmts[f].bits, fmts[f].group, ST_DTYPE_BF16);
            const int64_t r0 = irand(0, R - 2), nr = irand(1, R - r0);
            const int64_t c0 = unit * irand(0, K / unit - 2), nc = unit * irand(1, (K - c0) / unit);
            const int col_view = trial % 3 != 0; /* rows only, columns only, both */
            const int row_view = trial % 3 != 1;
            const int64_t vr0 = row_view ? r0 : 0, vnr = row_view ? nr : R;
            const int64_t vc0 = col_view ? c0 : 0, vnc = col_view ? nc : K;
            st_matrix v = st_matrix_rows(&p.m, vr0, vnr);
            if (col_view) v = st_matrix_cols(&v, vc0, vnc);
            tmat c;
            copy_block(&p.m, vr0, vnr, vc0, vnc, &c);
            const int64_t nt = (int64_t[]){1, 3, 17, 5, 2, 40}[trial];
            float *x = falloc(nt * vnc), *ya = falloc(nt * vnr), *yb = falloc(nt * vnr);
            float *scr = falloc(st_kernels_matmul_scratch(K));
            for (int64_t i = 0; i < nt * vnc; i++) x[i] = frand();
            for (int pk = 0; pk < 3; pk++) {
                const st_wpack kind = pk == 0 ? ST_WPACK_NONE : pk == 1 ? ST_WPACK_BF16_V16 : ST_WPACK_Q8_V16;
                void *pa = NULL, *pb = NULL;
                st_matrix va = v, cb = c.m;
                if (kind != ST_WPACK_NONE) {
                    if (!(st_matrix_packs_possible(&v) & ST_WPACK_BIT(kind)) ||
                        !(st_kernels_packs(k) & ST_WPACK_BIT(kind)))
                        continue;
                    const size_t bytes = st_matrix_pack_bytes(&v, kind);
                    pa = malloc(bytes), pb = malloc(bytes);
                    st_matrix_pack(&v, kind, pa, 0, v.rows);
                    st_matrix_pack(&c.m, kind, pb, 0, c.m.rows);
                    all &= memcmp(pa, pb, bytes) == 0;
                    va.pack = cb.pack = kind;
                    va.packed = pa, cb.packed = pb;
                }
                memset(ya, 0, (size_t)(nt * vnr) * 4);
                memset(yb, 0, (size_t)(nt * vnr) * 4);
                k->matmul(&va, x, vnc, nt, ya, vnr, 0, vnr, scr);
                k->matmul(&cb, x, vnc, nt, yb, vnr, 0, vnr, scr);
                const int same = memcmp(ya, yb, (size_t)(nt * vnr) * 4) == 0;
                if (!same)
                    printf("# %s %s view rows [%lld,+%lld) cols [%lld,+%lld) of [%lld x %lld], pack %d: differs from its copy\n",
                           k->name, fmts[f].name, (long long)vr0, (long long)vnr, (long long)vc0,
                           (long long)vnc, (long long)R, (long long)K, pk);
                all &= same;
                n++;
                free(pa);
                free(pb);
            }
            /* rows converted one by one, too */
            float *ra = falloc(vnc), *rb = falloc(vnc);
            for (int64_t r = 0; r < vnr; r++) {
                st_matrix_row_f32(&v, r, ra);
                st_matrix_row_f32(&c.m, r, rb);
                all &= memcmp(ra, rb, (size_t)vnc * 4) == 0;
            }
            free(ra);
            free(rb);
            free(x);
            free(ya);
            free(yb);
            free(scr);
            free_matrix(&c);
            free_matrix(&p);
        }
    CHECK(all, "%s matmul on row and column views (f32/f16/bf16, q3/q4/q6/q8; unpacked and packed): %d cases bit-identical to contiguous copies of the same blocks",
          k->name, n);
}

static void test_accum_rows(const st_kernels *k) {
    int ok = 1, inv = 1;
    double worst = 0;
    for (int trial = 0; trial < 20; trial++) {
        int64_t n = trial == 0 ? 256 : irand(1, 300), np = irand(1, 40), nq = irand(1, 9);
        int bf = trial & 1;
        int64_t ldv = n + irand(0, 5), lda = np + irand(0, 3), ldy = n + irand(0, 3);
        float *vf = falloc(np * ldv);
        uint16_t *vb = malloc((size_t)(np * ldv) * 2);
        for (int64_t i = 0; i < np * ldv; i++) {
            vf[i] = frand();
            vb[i] = st_f32_to_bf16(vf[i]);
        }
        float *a = falloc(nq * lda), *y = falloc(nq * ldy), *yr = falloc(nq * ldy);
        for (int64_t i = 0; i < nq * lda; i++) a[i] = frand();
        for (int64_t i = 0; i < nq * ldy; i++) y[i] = yr[i] = frand();
        const void *v = bf ? (const void *)vb : (const void *)vf;
        st_kernels_ref()->accum_rows(v, bf, ldv, np, a, lda, nq, yr, ldy, n);
        k->accum_rows(v, bf, ldv, np, a, lda, nq, y, ldy, n);
        for (int64_t q = 0; q < nq; q++)
            for (int64_t j = 0; j < n; j++) {
                double e = fabs((double)y[q * ldy + j] - yr[q * ldy + j]) / (double)(np + 1);
                if (e > worst) worst = e;
                if (!(e < 1e-6)) ok = 0;
            }
        /* the last query alone gives the same bits as in the group */
        float *y1 = falloc(ldy);
        const int64_t ql = nq - 1;
        memcpy(y1, yr + ql * ldy, (size_t)ldy * sizeof(float));
        for (int64_t j = 0; j < n; j++) y1[j] = 0.5f; /* any start value, the same for both */
        float *y2 = falloc(nq * ldy);
        for (int64_t i = 0; i < nq * ldy; i++) y2[i] = 0.5f;
        k->accum_rows(v, bf, ldv, np, a + ql * lda, lda, 1, y1, ldy, n);
        k->accum_rows(v, bf, ldv, np, a, lda, nq, y2, ldy, n);
        inv &= memcmp(y1, y2 + ql * ldy, (size_t)n * sizeof(float)) == 0;
        free(y1);
        free(y2);
        free(vf);
        free(vb);
        free(a);
        free(y);
        free(yr);
    }
    CHECK(ok && inv, "%s accum_rows: 20 random shapes (f32 and bf16 rows) match ref (worst %.2e), a query alone is bit-identical",
          k->name, worst);
}

static void test_elementwise(const st_kernels *k) {
    int ok = 1;
    double worst = 0;
    for (int trial = 0; trial < 10; trial++) {
        int64_t n = irand(1, 700);
        float *a = falloc(n), *b = falloc(n), *u = falloc(n);
        for (int64_t i = 0; i < n; i++) {
            a[i] = b[i] = frand() * 30.0f;
            u[i] = frand();
        }
        if (n > 3) a[0] = b[0] = -200.0f, a[1] = b[1] = 200.0f;
        int with_u = trial & 1;
        st_kernels_ref()->silu_mul(a, with_u ? u : NULL, n);
        k->silu_mul(b, with_u ? u : NULL, n);
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)a[i] - b[i]) / (fabs((double)a[i]) + 1e-30);
            if (fabs(a[i]) < 1e-30 && fabs(b[i]) < 1e-30) e = 0;
            if (e > worst) worst = e;
            if (!(e < 1e-5)) ok = 0;
        }
        free(a);
        free(b);
        free(u);
    }
    CHECK(ok, "%s silu_mul: 10 random lengths within 1e-5 relative (worst %.2e)", k->name, worst);
    ok = 1;
    worst = 0;
    for (int trial = 0; trial < 10; trial++) {
        int64_t n = irand(1, 900);
        float *a = falloc(n), *b = falloc(n);
        float mx = -1e30f;
        for (int64_t i = 0; i < n; i++) {
            a[i] = b[i] = frand() * 40.0f;
            if (a[i] > mx) mx = a[i];
        }
        double sa = st_kernels_ref()->exp_sum(a, n, mx), sb = k->exp_sum(b, n, mx);
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)a[i] - b[i]) / (fabs((double)a[i]) + 1e-37);
            if (a[i] < 1e-30f) e = fabs((double)a[i] - b[i]) < 1e-30 ? 0 : 1;
            if (e > worst) worst = e;
            if (!(e < 1e-5)) ok = 0;
        }
        if (!(fabs(sa - sb) / sa < 1e-5)) ok = 0;
        free(a);
        free(b);
    }
    CHECK(ok, "%s exp_sum: 10 random lengths within 1e-5 relative (worst %.2e)", k->name, worst);
}

static void test_conv(const st_kernels *k) {
    int ok = 1;
    double worst = 0;
    for (int trial = 0; trial < 12; trial++) {
        int K = (int)irand(1, 5);
        int64_t n = trial == 0 ? 6144 : irand(1, 300), ldw = n + irand(0, 7), lds = n + irand(0, 7);
        float *w = falloc(K * ldw), *s1 = falloc(K * lds), *s2 = falloc(K * lds);
        float *m = falloc(n), *o1 = falloc(n), *o2 = falloc(n);
        for (int64_t i = 0; i < K * ldw; i++) w[i] = frand();
        for (int64_t i = 0; i < K * lds; i++) s1[i] = s2[i] = frand() * 3.0f;
        float *sc = falloc(n);
        for (int step = 0; step < 3; step++) {
            for (int64_t i = 0; i < n; i++) {
                m[i] = frand() * 3.0f;
                double a = fabs((double)w[(K - 1) * ldw + i] * m[i]);
                for (int j = 0; j < K - 1; j++) a += fabs((double)w[j * ldw + i] * s1[j * lds + i]);
                sc[i] = (float)a; /* the scale of the rounding error of the sum */
            }
            st_kernels_ref()->conv_silu(w, ldw, K, s1, lds, m, o1, n);
            k->conv_silu(w, ldw, K, s2, lds, m, o2, n);
            for (int64_t i = 0; i < n; i++) {
                double e = fabs((double)o1[i] - o2[i]) / ((double)sc[i] + 1e-6);
                if (e > worst) worst = e;
                if (!(e < 1e-5)) ok = 0;
            }
            ok &= memcmp(s1, s2, (size_t)(K * lds) * sizeof(float)) == 0;
        }
        free(w);
        free(s1);
        free(s2);
        free(m);
        free(o1);
        free(o2);
        free(sc);
    }
    CHECK(ok, "%s conv_silu: 12 random widths and 1..5 taps x 3 steps match ref, state identical (worst %.2e of sum|w x|)",
          k->name, worst);
}

static void test_gdn_step(const st_kernels *k) {
    int ok = 1;
    double worst = 0;
    const int64_t dims[][2] = {{128, 128}, {16, 16}, {32, 64}, {7, 13}, {64, 48}};
    for (int d = 0; d < 5; d++) {
        int64_t Dv = dims[d][0], Dk = dims[d][1];
        float *S = falloc(Dv * Dk), *S2 = falloc(Dv * Dk), *q = falloc(Dk), *kk = falloc(Dk);
        float *v = falloc(Dv), *o = falloc(Dv), *o2 = falloc(Dv);
        for (int64_t i = 0; i < Dv * Dk; i++) S[i] = S2[i] = frand();
        double qn = 0, kn = 0;
        for (int64_t i = 0; i < Dk; i++) {
            q[i] = frand();
            kk[i] = frand();
            qn += q[i] * q[i];
            kn += kk[i] * kk[i];
        }
        for (int64_t i = 0; i < Dk; i++) {
            q[i] /= (float)sqrt(qn);
            kk[i] /= (float)sqrt(kn);
        }
        for (int64_t i = 0; i < Dv; i++) v[i] = frand();
        /* several steps, so the state errors compound as in a sequence */
        for (int step = 0; step < 8; step++) {
            float alpha = 0.5f + 0.5f * fabsf(frand()), beta = fabsf(frand());
            st_kernels_ref()->gdn_step(S, Dv, Dk, q, kk, v, alpha, beta, o);
            k->gdn_step(S2, Dv, Dk, q, kk, v, alpha, beta, o2);
            for (int64_t i = 0; i < Dv; i++) {
                double e = fabs((double)o[i] - o2[i]);
                if (e > worst) worst = e;
                if (!(e < 1e-5)) ok = 0;
            }
        }
        for (int64_t i = 0; i < Dv * Dk; i++)
            if (!(fabs((double)S[i] - S2[i]) < 1e-5)) ok = 0;
        free(S);
        free(S2);
        free(q);
        free(kk);
        free(v);
        free(o);
        free(o2);
    }
    CHECK(ok, "%s gdn_step: 5 head shapes x 8 steps match ref (worst |do| %.2e)", k->name, worst);
}

int main(int argc, char **argv) {
    const char *const *names = st_kernels_names();
    if (argc > 1 && strcmp(argv[1], "--best") == 0) {
        printf("%s\n", st_kernels_best()->name);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; names[i]; i++)
            if (st_kernels_by_name(names[i])) printf("%s\n", names[i]);
        return 0;
    }
    const st_cpu_features *f = st_cpu_get_features();
    printf("# cpu: avx2 %d fma %d f16c %d avx512f %d bw %d vl %d dq %d bf16 %d amx-tile %d amx-bf16 %d amx usable %d\n",
           f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512dq,
           f->avx512bf16, f->amx_tile, f->amx_bf16, f->amx_usable);
    CHECK(st_kernels_by_name("ref") == st_kernels_ref() && st_kernels_by_name("nonsense") == NULL,
          "kernel sets by name: ref always, unknown names NULL");
    printf("# best kernel set here: %s\n", st_kernels_best()->name);
    for (int i = 0; names[i]; i++) {
        const st_kernels *k = st_kernels_by_name(names[i]);
        if (!k) {
            printf("# %s: not available on this CPU, skipped\n", names[i]);
            continue;
        }
        if (argc > 1 && strcmp(argv[1], names[i]) != 0) continue;
        test_views(k);
        if (k == st_kernels_ref()) continue; /* the oracle itself */
        test_matmul(k);
        test_accum_rows(k);
        test_elementwise(k);
        test_conv(k);
        test_gdn_step(k);
    }
    /* the AMX tile logic with the tile instructions emulated, where AMX itself is absent */
    if (st_kernels_by_name("avx512") && (argc < 2 || strcmp(argv[1], "amx-emulated") == 0)) {
        printf("# amx-emulated: the amx set's packing and tiling with emulated tile instructions\n");
        test_matmul(st_kernels_amx_emulated());
        test_views(st_kernels_amx_emulated());
    }
    return tap_done();
}
