/* ==== CUDA kernels: what gdn.cu and gdn_chunk.cu compute alike (see cuda_kernels.h) ====
 *
 * The conv's one token and the q/k norms' scale: one order of sums for every kernel that
 * makes them, so the per-step, decode and chunked paths agree to the bit there.
 */
#ifndef ST_BACKEND_CUDA_GDN_COMMON_CUH
#define ST_BACKEND_CUDA_GDN_COMMON_CUH

#include "backend/cuda/cu_common.cuh"

/* one token of a K = 4 channel: the window sv (oldest first), the taps, the input m */
__device__ __forceinline__ float conv4_one(const float (&sv)[3], const float (&tap)[4], float m) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 3; j++) acc += tap[j] * sv[j];
    acc += tap[3] * m;
    return acc / (1.0f + expf(-acc));
}

/* The scale of a q row (also by 1 / sqrt(Dk)) or a k row of Dk by its L2 norm, as every kernel
 * makes it: a warp's lanes sum the squares of columns lane, lane + 32, ... in order, then a
 * butterfly (k_gdn_qknorm's order, which k_gdn_dec and k_gdn_cprep repeat: the same bits) */
__device__ __forceinline__ float gdn_l2_scale(const float *v, int Dk, bool is_q) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int j = lane; j < Dk; j += 32) ss = fmaf(v[j], v[j], ss);
    ss = warp_sum(ss);
    return (is_q ? 1.0f / sqrtf((float)Dk) : 1.0f) / sqrtf(ss + 1e-6f);
}

#endif /* ST_BACKEND_CUDA_GDN_COMMON_CUH */
