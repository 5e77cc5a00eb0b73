/* ==== Compute kernels: the interface every backend implements ====
 *
 * A kernel set is a table of function pointers. The scalar reference (kernels/cpu/ref.c) is
 * the oracle every faster variant (AVX2, AVX-512, AMX, CUDA) is tested against.
 */
#ifndef ST_KERNELS_KERNELS_H
#define ST_KERNELS_KERNELS_H

#include <stdint.h>

#include "tensor/matrix.h"

typedef struct st_kernels {
    const char *name;
    /* y[t*ldy + r] = sum_c W[r][c] * x[t*ldx + c] for rows r in [r0, r1) and tokens
     * t in [0, n_tok). scratch: at least W->cols floats, private to the caller. */
    void (*matmul)(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                   int64_t ldy, int64_t r0, int64_t r1, float *scratch);
} st_kernels;

/* The scalar reference kernels. */
const st_kernels *st_kernels_ref(void);

#endif /* ST_KERNELS_KERNELS_H */
