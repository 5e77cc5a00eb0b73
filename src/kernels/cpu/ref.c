/* ==== Scalar reference kernels ====
 * Plain C, fp32 accumulation in index order. Slow and obviously right: the oracle for
 * every SIMD/AMX/CUDA kernel (tests/test_kernels.c compares each against these). */
#include <math.h>

#include "core/numeric.h"
#include "kernels/kernels.h"

static void matmul_ref(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                       int64_t ldy, int64_t r0, int64_t r1, float *scratch) {
    const int64_t n = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        st_matrix_row_f32(w, r, scratch);
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * ldx;
            float acc = 0.0f;
            for (int64_t c = 0; c < n; c++) acc += scratch[c] * xt[c];
            y[t * ldy + r] = acc;
        }
    }
}

static void accum_rows_ref(const void *v, int v_bf16, int64_t ldv, int64_t n_pos, const float *a,
                           int64_t lda, int64_t n_q, float *y, int64_t ldy, int64_t n) {
    for (int64_t q = 0; q < n_q; q++) {
        float *yq = y + q * ldy;
        for (int64_t p = 0; p < n_pos; p++) {
            const float ap = a[q * lda + p];
            if (v_bf16) {
                const uint16_t *vp = (const uint16_t *)v + p * ldv;
                for (int64_t j = 0; j < n; j++) yq[j] += ap * st_bf16_to_f32(vp[j]);
            } else {
                const float *vp = (const float *)v + p * ldv;
                for (int64_t j = 0; j < n; j++) yq[j] += ap * vp[j];
            }
        }
    }
}

static float exp_sum_ref(float *x, int64_t n, float m) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    return s;
}

static void silu_mul_ref(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        g[i] = u ? s * u[i] : s;
    }
}

static void conv_silu_ref(const float *w, int64_t ldw, int K, float *state, int64_t lds,
                          const float *m, float *out, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += w[j * ldw + c] * state[j * lds + c];
        acc += w[(K - 1) * ldw + c] * m[c];
        for (int j = 0; j + 1 < K - 1; j++) state[j * lds + c] = state[(j + 1) * lds + c];
        if (K > 1) state[(K - 2) * lds + c] = m[c];
        out[c] = acc / (1.0f + expf(-acc));
    }
}

/* rows of S are independent: decay, predict, correct, read */
static void gdn_step_ref(float *S, int64_t Dv, int64_t Dk, const float *q, const float *k,
                         const float *v, float alpha, float beta, float *o) {
    for (int64_t r = 0; r < Dv; r++) {
        float *row = S + r * Dk;
        float e = 0.0f;
        for (int64_t j = 0; j < Dk; j++) {
            row[j] *= alpha;
            e += row[j] * k[j];
        }
        float delta = beta * (v[r] - e);
        float acc = 0.0f;
        for (int64_t j = 0; j < Dk; j++) {
            row[j] += delta * k[j];
            acc += row[j] * q[j];
        }
        o[r] = acc;
    }
}

static const st_kernels ref_kernels = {
    .name = "ref",
    .matmul = matmul_ref,
    .accum_rows = accum_rows_ref,
    .exp_sum = exp_sum_ref,
    .silu_mul = silu_mul_ref,
    .conv_silu = conv_silu_ref,
    .gdn_step = gdn_step_ref,
};

const st_kernels *st_kernels_ref(void) { return &ref_kernels; }
