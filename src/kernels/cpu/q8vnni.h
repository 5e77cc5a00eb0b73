/* ==== MLX 8-bit matrices packed for AVX-512 VNNI (private to src/kernels/cpu) ==== */
#ifndef ST_KERNELS_CPU_Q8VNNI_H
#define ST_KERNELS_CPU_Q8VNNI_H

#include <stdint.h>

#include "tensor/matrix.h"

/* The matmul of kernels.h for a matrix packed as ST_WPACK_Q8_V16; only on CPUs with
 * AVX512-F/BW/VL/DQ and AVX512-VNNI. scratch: st_kernels_matmul_scratch(w->cols) floats. */
void st_q8v_matmul_avx512vnni(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok,
                              float *y, int64_t ldy, int64_t r0, int64_t r1, float *scratch);

#endif /* ST_KERNELS_CPU_Q8VNNI_H */
