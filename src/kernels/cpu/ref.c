/* ==== Scalar reference kernels ====
 * Plain C, fp32 accumulation in index order. Slow and obviously right: the oracle for
 * every SIMD/AMX/CUDA kernel. */
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

static const st_kernels ref_kernels = {
    .name = "ref",
    .matmul = matmul_ref,
};

const st_kernels *st_kernels_ref(void) { return &ref_kernels; }
