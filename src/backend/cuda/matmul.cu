/* ==== CUDA kernels: matrix products on the CUDA cores, and the products' dispatch ====
 *
 * k_matmul, every matrix format kept row-major (fp32 FMAs); cu_matmul_group sends each
 * matrix to its kernel: tiled bf16 ones to matmul_bf16.cu's, MLX tiled ones to
 * matmul_q.cu's, the rest to k_matmul (see cuda_kernels.h).
 */
#include "backend/cuda/mm_int.cuh"

/* matrix products on the CUDA cores
 *
 * A block of MM_THREADS threads computes MM_R rows for up to NT tokens. Its threads sweep
 * the columns in chunks of 8 (thread j of the block takes columns j*8 .. j*8+7, then the
 * same plus MM_THREADS*8, ...), each keeping one partial sum per (row, token) in column
 * order; the partials are then added over each warp by a fixed butterfly and over the
 * block's warps in warp order. So every output's summation order is fixed by the matrix's
 * width alone: the same bits for any token count (the batch-invariance rule). The chunk's 8
 * weights are read with one 16-byte load (bf16), one 8-byte load (MLX 8-bit) or one 4-byte
 * load (4-bit); other formats are converted element by element in the same order. */

#define MM_THREADS 256
#define MM_R 4

enum { FK_F32 = 0, FK_F16 = 1, FK_BF16 = 2, FK_Q8 = 3, FK_Q4 = 4, FK_GEN = 5 };

/* the 8 weights of row r at columns c .. c+7, for the formats without a raw chunk (fp32:
 * two 16-byte loads; any other, element by element) */
template <int FK>
__device__ __forceinline__ void chunk8(const cu_mat &w, int64_t r, int64_t c, float *o) {
    if (FK == FK_F32) {
        const float4 a = *(const float4 *)((const float *)w.data + r * w.cols + c);
        const float4 b = *(const float4 *)((const float *)w.data + r * w.cols + c + 4);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int64_t cc = c + k;
            o[k] = cc >= w.cols  ? 0.0f
                   : w.fmt == 1 ? w_at<1>(w, r, cc)
                   : w.fmt == 2 ? w_at<2>(w, r, cc)
                   : w.fmt == 3 ? w_at<3>(w, r, cc)
                                : w_at<0>(w, r, cc);
        }
    }
}

/* the FMAs of one chunk: acc[r][i] += w[r][k] * x_i[k], k in order */
template <int NT>
__device__ __forceinline__ void chunk_fma(const float (&wv)[MM_R][8], const float *x, int64_t ldx, int64_t c,
                                          int64_t cols, int nt, bool vec_x, float (&acc)[MM_R][NT]) {
#pragma unroll
    for (int i = 0; i < NT; i++) {
        if (i >= nt) break;
        float xv[8];
        const float *xp = x + i * ldx + c;
        if (vec_x) {
            const float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
            xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = c + k < cols ? xp[k] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < MM_R; r++)
#pragma unroll
            for (int k = 0; k < 8; k++) acc[r][i] = fmaf(wv[r][k], xv[k], acc[r][i]);
    }
}

template <int FK>
__device__ __forceinline__ void chunk_load(const cu_mat &w, int64_t r0, int nr, int64_t c, float (&wv)[MM_R][8]) {
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        if (r < nr) chunk8<FK>(w, r0 + r, c, wv[r]);
        else
#pragma unroll
            for (int k = 0; k < 8; k++) wv[r][k] = 0.0f;
    }
}

/* a row's chunk as loaded (bf16: 16 bytes; MLX 8-bit: 8; 4-bit: 4; with its group's scale
 * and bias), converted to fp32 when used: the loads of later chunks are issued before the
 * FMAs of earlier ones */
struct raw_chunk {
    uint4 v;
    float sc, bi;
};

template <int FK>
__device__ __forceinline__ raw_chunk raw_load(const cu_mat &w, int64_t r, int64_t c) {
    raw_chunk o;
    if (FK == FK_BF16) {
        o.v = *(const uint4 *)((const uint16_t *)w.data + r * w.cols + c);
    } else {
        const int64_t g = r * (w.cols / w.group) + c / w.group;
        o.sc = load_s(w.scales, w.sdtype, g);
        o.bi = load_s(w.biases, w.sdtype, g);
        if (FK == FK_Q8) {
            const uint2 v = *(const uint2 *)((const uint8_t *)w.data + r * w.cols + c);
            o.v.x = v.x, o.v.y = v.y;
        } else {
            o.v.x = *((const uint32_t *)w.data + (r * w.cols + c) / 8);
        }
    }
    return o;
}

template <int FK>
__device__ __forceinline__ void raw_cvt(const raw_chunk &q, float *o) {
    if (FK == FK_BF16) {
        const uint32_t u[4] = {q.v.x, q.v.y, q.v.z, q.v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[2 * k] = __uint_as_float(u[k] << 16);
            o[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        }
    } else if (FK == FK_Q8) {
        /* q as a float without an int-to-float conversion: 2^23 + q, less 2^23 (exact) */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[k] = fmaf(q.sc, __uint_as_float(0x4b000000u | ((q.v.x >> (8 * k)) & 255u)) - 8388608.0f, q.bi);
            o[4 + k] = fmaf(q.sc, __uint_as_float(0x4b000000u | ((q.v.y >> (8 * k)) & 255u)) - 8388608.0f, q.bi);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[k] = fmaf(q.sc, __uint_as_float(0x4b000000u | ((q.v.x >> (4 * k)) & 15u)) - 8388608.0f, q.bi);
    }
}

/* NT: the most tokens a block takes (1, 2, 4, 8 or 16). Each variant sums every output in
 * the same order (the per-thread chunks in column order, then the same reductions), so the
 * variant a launch picks never changes a bit of the result. */
template <int FK, int NT>
__global__ void __launch_bounds__(MM_THREADS) k_matmul(cu_mat w, const float *x, int64_t ldx, int64_t T, float *y,
                                                       int64_t ldy) {
    __shared__ float red[MM_THREADS / 32][MM_R * NT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * MM_R;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = T - t0 < NT ? (int)(T - t0) : NT;
    const int nr = w.rows - r0 < MM_R ? (int)(w.rows - r0) : MM_R;
    const float *xb = x + t0 * ldx;
    float acc[MM_R][NT];
#pragma unroll
    for (int r = 0; r < MM_R; r++)
#pragma unroll
        for (int i = 0; i < NT; i++) acc[r][i] = 0.0f;
    const bool vec_x = FK != FK_GEN;
    const int64_t step = MM_THREADS * 8;
    if constexpr (FK == FK_BF16 || FK == FK_Q8 || FK == FK_Q4) {
        /* chunk i of this thread is at column tid*8 + i*step; two groups of two in flight */
        const int64_t c0 = (int64_t)tid * 8, nc = c0 < w.cols ? (w.cols - c0 + step - 1) / step : 0;
        raw_chunk ra[2][MM_R];
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int r = 0; r < MM_R; r++)
                if (u < nc && r < nr) ra[u][r] = raw_load<FK>(w, r0 + r, c0 + u * step);
        for (int64_t i = 0; i < nc; i += 2) {
            raw_chunk nx[2][MM_R];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int r = 0; r < MM_R; r++)
                    if (i + 2 + u < nc && r < nr) nx[u][r] = raw_load<FK>(w, r0 + r, c0 + (i + 2 + u) * step);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (i + u >= nc) break;
                float wv[MM_R][8];
#pragma unroll
                for (int r = 0; r < MM_R; r++) {
                    if (r < nr) raw_cvt<FK>(ra[u][r], wv[r]);
                    else
#pragma unroll
                        for (int k = 0; k < 8; k++) wv[r][k] = 0.0f;
                }
                chunk_fma<NT>(wv, xb, ldx, c0 + (i + u) * step, w.cols, nt, true, acc);
            }
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int r = 0; r < MM_R; r++) ra[u][r] = nx[u][r];
        }
    } else {
        for (int64_t c = (int64_t)tid * 8; c < w.cols; c += 2 * step) {
            float wa[MM_R][8], wb[MM_R][8];
            const bool two = c + step < w.cols;
            chunk_load<FK>(w, r0, nr, c, wa);
            if (two) chunk_load<FK>(w, r0, nr, c + step, wb);
            chunk_fma<NT>(wa, xb, ldx, c, w.cols, nt, vec_x, acc);
            if (two) chunk_fma<NT>(wb, xb, ldx, c + step, w.cols, nt, vec_x, acc);
        }
    }
#pragma unroll
    for (int r = 0; r < MM_R; r++)
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const float v = warp_sum(acc[r][i]);
            if (lane == 0) red[warp][r * NT + i] = v;
        }
    __syncthreads();
    if (tid < MM_R * NT) {
        const int r = tid / NT, i = tid % NT;
        if (r < nr && i < nt) {
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < MM_THREADS / 32; q++) s += red[q][tid];
            y[(t0 + i) * ldy + r0 + r] = s;
        }
    }
}

/* the kernel a matrix takes (one for every token count) */
static int fk_of(const cu_mat *w) {
    if (w->cols % 8 != 0) return FK_GEN;
    if (w->fmt == 2) return FK_BF16;
    if (w->fmt == 0) return FK_F32;
    if (w->fmt == 3 && w->bits == 8 && w->group % 8 == 0) return FK_Q8;
    if (w->fmt == 3 && w->bits == 4 && w->group % 8 == 0) return FK_Q4;
    return FK_GEN;
}

template <int FK>
static void launch_mm(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy) {
    const int nt = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : T <= 8 ? 8 : 16;
    dim3 grid((unsigned)((w->rows + MM_R - 1) / MM_R), (unsigned)((T + nt - 1) / nt));
    switch (nt) {
    case 1: k_matmul<FK, 1><<<grid, MM_THREADS, 0, s>>>(*w, x, ldx, T, y, ldy); break;
    case 2: k_matmul<FK, 2><<<grid, MM_THREADS, 0, s>>>(*w, x, ldx, T, y, ldy); break;
    case 4: k_matmul<FK, 4><<<grid, MM_THREADS, 0, s>>>(*w, x, ldx, T, y, ldy); break;
    case 8: k_matmul<FK, 8><<<grid, MM_THREADS, 0, s>>>(*w, x, ldx, T, y, ldy); break;
    default: k_matmul<FK, 16><<<grid, MM_THREADS, 0, s>>>(*w, x, ldx, T, y, ldy); break;
    }
}

static void matmul_one(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy) {
    /* 16-byte activation loads need 16-byte aligned rows */
    int fk = fk_of(w);
    if (ldx % 4 != 0 || ((uintptr_t)x & 15) != 0) fk = FK_GEN;
    switch (fk) {
    case FK_BF16: launch_mm<FK_BF16>(s, w, x, ldx, T, y, ldy); break;
    case FK_F32: launch_mm<FK_F32>(s, w, x, ldx, T, y, ldy); break;
    case FK_Q8: launch_mm<FK_Q8>(s, w, x, ldx, T, y, ldy); break;
    case FK_Q4: launch_mm<FK_Q4>(s, w, x, ldx, T, y, ldy); break;
    default: launch_mm<FK_GEN>(s, w, x, ldx, T, y, ldy); break;
    }
}

extern "C" void cu_mm_init(void) {
    qmvp_init();
    mm_bf16_init();
}

extern "C" int cu_matmul_group(cu_stream s, int n, const cu_mat *const *w, float *const *y, const int64_t *ldy,
                               const float *x, int64_t ldx, int64_t T, int mode, const cu_mm_scratch *sc,
                               int xs_ready, int xq_ready) {
    if (T <= 0) return 0;
    /* CU_MM_XS: a launch split x into xs (T <= 16: the whole of it); CU_MM_XS_LOST: the last
     * launch to write xs left something else there; CU_MM_XQ: xq holds its limbs */
    int wrote = 0;
    const int parts = mode == CU_MM_BF16 ? 1 : 3;
    mm_group g;
    g.n = 0;
    auto flush = [&]() {
        if (g.n == 0) return;
        int r;
        if (g.w[0].fmt == CU_FMT_Q_TILED) {
            r = launch_qtiled(s, g, x, ldx, T, parts, sc, xs_ready, xq_ready); /* (xq_ready: the caller's, for
                                                                                  the model's one bits and group) */
        } else {
            launch_tiled(s, g, x, ldx, T, parts, sc, xs_ready);
            r = T <= 16 && sc ? CU_MM_XS : 0;
        }
        if (r & CU_MM_XS_LOST) { /* the next launches split again */
            xs_ready = 0;
            wrote = (wrote & ~CU_MM_XS) | CU_MM_XS_LOST;
        } else if (r & CU_MM_XS) wrote &= ~CU_MM_XS_LOST;
        wrote |= r & ~CU_MM_XS_LOST;
        g.n = 0;
    };
    for (int i = 0; i < n; i++) {
        if (w[i]->rows <= 0) continue;
        if (w[i]->fmt != CU_FMT_BF16_TILED && w[i]->fmt != CU_FMT_Q_TILED) {
            matmul_one(s, w[i], x, ldx, T, y[i], ldy[i]);
            continue;
        }
        if (g.n > 0 && (g.w[0].fmt != w[i]->fmt || g.w[0].cols != w[i]->cols || g.w[0].bits != w[i]->bits ||
                        g.w[0].group != w[i]->group))
            flush(); /* one launch per kind and width */
        g.w[g.n] = *w[i];
        g.y[g.n] = y[i];
        g.ldy[g.n] = ldy[i];
        g.n++;
    }
    flush();
    return wrote;
}

extern "C" void cu_matmul(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y,
                          int64_t ldy, int mode, const cu_mm_scratch *sc) {
    cu_matmul_group(s, 1, &w, &y, &ldy, x, ldx, T, mode, sc, 0, 0);
}
