/* ==== CUDA kernels (see cuda_kernels.h) ====
 *
 * Every reduction has a fixed order given by the output's own indices: a matrix row's dot
 * product is summed by lane (columns lane, lane+32, ...) then over the warp by a fixed
 * butterfly; norms by a fixed block tree; the delta rule by state row, sequentially over
 * the key dimension; attention by query, over positions in order. No kernel's result for a
 * token depends on the other tokens of the launch.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

#define FULL 0xffffffffu

__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
/* round to nearest even; NaN stays NaN (core/numeric.h st_f32_to_bf16) */
__device__ __forceinline__ uint16_t f2bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float load_s(const void *p, int dt, int64_t i) {
    if (dt == 2) return bf16f(((const uint16_t *)p)[i]);
    if (dt == 1) return f16f(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* element c of row r, for the matrix format FMT */
template <int FMT>
__device__ __forceinline__ float w_at(const cu_mat &w, int64_t r, int64_t c) {
    if (FMT == 0) return ((const float *)w.data)[r * w.cols + c];
    if (FMT == 1) return f16f(((const uint16_t *)w.data)[r * w.cols + c]);
    if (FMT == 2) return bf16f(((const uint16_t *)w.data)[r * w.cols + c]);
    const uint32_t *row = (const uint32_t *)w.data + r * (w.cols * w.bits / 32);
    const uint64_t p = (uint64_t)c * (uint64_t)w.bits;
    const uint32_t wi = (uint32_t)(p >> 5), off = (uint32_t)(p & 31);
    uint64_t v = row[wi];
    if (off + w.bits > 32) v |= (uint64_t)row[wi + 1] << 32;
    const uint32_t q = (uint32_t)(v >> off) & ((1u << w.bits) - 1u);
    const int64_t g = r * (w.cols / w.group) + c / w.group;
    return fmaf(load_s(w.scales, w.sdtype, g), (float)q, load_s(w.biases, w.sdtype, g));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

/* sum over a block of blockDim.x (a multiple of 32, at most 1024) threads, in a fixed
 * order; every thread gets it. red: [32] shared floats. */
__device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, red[i]);
    return m;
}

/* ---------------------------------------------------------------------------------------- */
/* embedding, norms, elementwise */

template <int FMT>
__global__ void k_embed(cu_mat w, const int32_t *tokens, float *x) {
    const int64_t t = blockIdx.x, row = tokens[t];
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) x[t * w.cols + c] = w_at<FMT>(w, row, c);
}

extern "C" void cu_embed(cu_stream s, const cu_mat *emb, const int32_t *tokens, int64_t T, float *x) {
    if (T <= 0) return;
    switch (emb->fmt) {
    case 0: k_embed<0><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    case 1: k_embed<1><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    case 2: k_embed<2><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    default: k_embed<3><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    }
}

__global__ void k_add_norm(float *x, const float *out, const float *w, float *xn, int64_t d, float eps, int add,
                           int apply) {
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    float *xr = x + t * d;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
        float v = xr[c];
        if (add) xr[c] = v = v + out[t * d + c];
        ss += v * v;
    }
    if (!apply) return;
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) xn[t * d + c] = xr[c] * r * w[c];
}

extern "C" void cu_add_norm(cu_stream s, float *x, const float *out, const float *w, float *xn, int64_t T,
                            int64_t d, float eps, int add, int apply) {
    if (T <= 0) return;
    k_add_norm<<<(unsigned)T, 256, 0, s>>>(x, out, w, xn, d, eps, add, apply);
}

__global__ void k_silu_mul(float *g, const float *u, int64_t T, int64_t n, int64_t ld) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * n) return;
    const int64_t t = i / n, c = i % n;
    const float v = g[t * ld + c];
    g[t * ld + c] = siluf_(v) * u[t * ld + c];
}

extern "C" void cu_silu_mul(cu_stream s, float *g, const float *u, int64_t T, int64_t n, int64_t ld) {
    const int64_t total = T * n;
    if (total <= 0) return;
    k_silu_mul<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(g, u, T, n, ld);
}

__global__ void k_gather_rows(const float *src, int64_t d, const int32_t *rows, float *dst) {
    const int64_t i = blockIdx.x, r = rows[i];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[i * d + c] = src[r * d + c];
}

extern "C" void cu_gather_rows(cu_stream s, const float *src, int64_t d, const int32_t *rows, int64_t n, float *dst) {
    if (n <= 0) return;
    k_gather_rows<<<(unsigned)n, 256, 0, s>>>(src, d, rows, dst);
}

__global__ void k_scatter_add(float *out, const float *src, const int32_t *list, const float *w, int64_t d) {
    const int64_t i = blockIdx.x, t = list[i];
    const float wi = w[i];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[t * d + c] += wi * src[i * d + c];
}

extern "C" void cu_scatter_add(cu_stream s, float *out, const float *src, const int32_t *list, const float *w,
                               int64_t n, int64_t d) {
    if (n <= 0) return;
    k_scatter_add<<<(unsigned)n, 256, 0, s>>>(out, src, list, w, d);
}

__global__ void k_gated_add(float *out, const float *src, const float *g, int64_t d) {
    const int64_t t = blockIdx.x;
    const float gv = sigmoidf_(g[t]);
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[t * d + c] += gv * src[t * d + c];
}

extern "C" void cu_gated_add(cu_stream s, float *out, const float *src, const float *g, int64_t T, int64_t d) {
    if (T <= 0) return;
    k_gated_add<<<(unsigned)T, 256, 0, s>>>(out, src, g, d);
}

extern "C" void cu_fill_zero(cu_stream s, float *p, int64_t n) {
    if (n > 0) cudaMemsetAsync(p, 0, (size_t)n * sizeof(float), s);
}

__global__ void k_copy(const float4 *src, float4 *dst, int64_t n4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" void cu_copy(cu_stream s, const float *src, float *dst, int64_t n) {
    k_copy<<<1024, 512, 0, s>>>((const float4 *)src, (float4 *)dst, n / 4);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__global__ void k_synth(void *dst, size_t n, int kind, uint64_t key, float a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t r = mix64(key ^ (i * 0xd1b54a32d192ed03ull));
        if (kind == CU_SYNTH_WORDS) ((uint32_t *)dst)[i] = (uint32_t)r;
        else if (kind == CU_SYNTH_BF16_CONST) ((uint16_t *)dst)[i] = f2bf16(a);
        else ((uint16_t *)dst)[i] = f2bf16(a * ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f));
    }
}

extern "C" void cu_synth_fill(cu_stream s, void *dst, size_t n, int kind, uint64_t key, float a) {
    if (n) k_synth<<<4096, 256, 0, s>>>(dst, n, kind, key, a);
}

/* ---------------------------------------------------------------------------------------- */
/* matrix products
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

/* ---------------------------------------------------------------------------------------- */
/* bf16 matrices on tensor cores
 *
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate): A is a 16-row tile of W, B 8 tokens of x.
 * The activations are split into bf16 parts, x = hi + mid + lo (3 parts: 24 significant
 * bits, fp32-grade; "exact") or rounded to bf16 (1 part; "bf16"); the weights are bf16 as
 * stored, so every product is exact and the tensor cores accumulate in fp32.
 *
 * Summation order, fixed by the matrix's shape alone: the columns go in steps of 32; warp s
 * of a block's S warps (S from the row count) takes the s-th of S contiguous runs of steps,
 * in order, each step two MMAs (columns 8t..8t+3 then 8t+4..8t+7 of lane group t) per part, hi first; then
 * the S partial sums are added in warp order. A token's result depends only on its own
 * activations (an MMA's output column is its own dot product), so it is the same bits
 * whatever the batch, the tile it lands in, and the tile shape a launch picks.
 *
 * Fragments (PTX ISA, m16n8k16 .bf16): lane = 4g + t; A regs a0 (row g, k 2t..2t+1),
 * a1 (row g+8, same k), a2 (row g, k 2t+8..9), a3 (row g+8, k 2t+8..9); B regs b0 (k 2t..2t+1,
 * column g), b1 (k 2t+8..9, column g); C c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8).
 * Which physical column feeds which k slot is free as long as A and B agree: lane (g, t)
 * loads 8 consecutive columns 8t..8t+7 of rows g and g+8 (one 16-byte load each) and of
 * token g; the first MMA takes columns 8t..8t+3 as k slots (2t, 2t+1, 2t+8, 2t+9), the
 * second 8t+4..8t+7. */

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* the S of a matrix: warps splitting its columns (more for fewer rows, so that small
 * matrices still fill the device) */
__host__ __device__ __forceinline__ int mma_splits(int64_t rows) { return rows <= 8192 ? 8 : rows <= 32768 ? 4 : 2; }

template <int MT>
__device__ __forceinline__ void mma_load_a(const cu_mat &w, int64_t r0, int64_t c, int g, uint4 (&a)[MT][2]) {
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int64_t ra = r0 + 16 * m + g, rb = ra + 8;
        const uint16_t *base = (const uint16_t *)w.data;
        const bool in = c < w.cols;
        a[m][0] = in && ra < w.rows ? *(const uint4 *)(base + ra * w.cols + c) : make_uint4(0, 0, 0, 0);
        a[m][1] = in && rb < w.rows ? *(const uint4 *)(base + rb * w.cols + c) : make_uint4(0, 0, 0, 0);
    }
}

/* one 32-column step: the token tiles' activations split into parts, then the MMAs */
template <int MT, int NT, int P>
__device__ __forceinline__ void mma_step(const uint4 (&a)[MT][2], const float *x, int64_t ldx, int64_t T, int64_t n0,
                                         int64_t c, int64_t cols, int g, float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int64_t n = n0 + 8 * j + g;
        float xv[8];
        if (n < T && c < cols) {
            const float4 u = *(const float4 *)(x + n * ldx + c), v = *(const float4 *)(x + n * ldx + c + 4);
            xv[0] = u.x, xv[1] = u.y, xv[2] = u.z, xv[3] = u.w, xv[4] = v.x, xv[5] = v.y, xv[6] = v.z, xv[7] = v.w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) xv[k] = 0.0f;
        }
        uint32_t b[P][4];
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            float r0v = xv[k], r1v = xv[k + 1];
#pragma unroll
            for (int p = 0; p < P; p++) {
                const uint16_t h0 = f2bf16(r0v), h1 = f2bf16(r1v);
                b[p][k / 2] = pack2(h0, h1);
                r0v -= bf16f(h0);
                r1v -= bf16f(h1);
            }
        }
#pragma unroll
        for (int m = 0; m < MT; m++) {
#pragma unroll
            for (int p = 0; p < P; p++)
                mma_bf16(acc[m][j], a[m][0].x, a[m][1].x, a[m][0].y, a[m][1].y, b[p][0], b[p][1]);
#pragma unroll
            for (int p = 0; p < P; p++)
                mma_bf16(acc[m][j], a[m][0].z, a[m][1].z, a[m][0].w, a[m][1].w, b[p][2], b[p][3]);
        }
    }
}

/* U: steps loaded ahead (two groups of U in flight) */
template <int MT, int NT, int P, int U>
__global__ void __launch_bounds__(256) k_mma(cu_mat w, const float *x, int64_t ldx, int64_t T, float *y,
                                             int64_t ldy) {
    __shared__ float red[8][MT * 128];
    const int S = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * (16 * MT);
    const int64_t n0 = (int64_t)blockIdx.y * (8 * NT);
    /* warp s takes the contiguous steps [kb, ke): each row streams from memory in order */
    const int64_t nsteps = (w.cols + 31) / 32, per = (nsteps + S - 1) / S;
    const int64_t kb = warp * per, ke = kb + per < nsteps ? kb + per : nsteps;
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    uint4 a[U][MT][2];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (kb + u < ke) mma_load_a<MT>(w, r0, (kb + u) * 32 + 8 * t, g, a[u]);
    for (int64_t k = kb; k < ke; k += U) {
        uint4 nx[U][MT][2];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k + U + u < ke) mma_load_a<MT>(w, r0, (k + U + u) * 32 + 8 * t, g, nx[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k + u < ke) mma_step<MT, NT, P>(a[u], x, ldx, T, n0, (k + u) * 32 + 8 * t, w.cols, g, acc);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int m = 0; m < MT; m++) a[u][m][0] = nx[u][m][0], a[u][m][1] = nx[u][m][1];
    }
    /* the S partial sums, one token tile at a time, in warp order */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        __syncthreads();
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float *o = red[warp] + m * 128;
            o[g * 8 + 2 * t] = acc[m][j][0];
            o[g * 8 + 2 * t + 1] = acc[m][j][1];
            o[(g + 8) * 8 + 2 * t] = acc[m][j][2];
            o[(g + 8) * 8 + 2 * t + 1] = acc[m][j][3];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < MT * 128; i += blockDim.x) {
            const int m = i / 128, row = (i % 128) / 8, col = i % 8;
            const int64_t r = r0 + 16 * m + row, n = n0 + 8 * j + col;
            float sum = 0.0f;
            for (int q = 0; q < S; q++) sum += red[q][i];
            if (r < w.rows && n < T) y[n * ldy + r] = sum;
        }
    }
}

template <int MT, int NT>
static void launch_mma_p(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                         int parts) {
    dim3 grid((unsigned)((w->rows + 16 * MT - 1) / (16 * MT)), (unsigned)((T + 8 * NT - 1) / (8 * NT)));
    const int threads = 32 * mma_splits(w->rows);
    constexpr int U = MT == 1 ? 4 : 2;
    if (parts == 1) k_mma<MT, NT, 1, U><<<grid, threads, 0, s>>>(*w, x, ldx, T, y, ldy);
    else k_mma<MT, NT, 3, U><<<grid, threads, 0, s>>>(*w, x, ldx, T, y, ldy);
}

static void launch_mma(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y, int64_t ldy,
                       int parts) {
    if (T <= 8) launch_mma_p<1, 1>(s, w, x, ldx, T, y, ldy, parts);
    else if (T <= 16) launch_mma_p<1, 2>(s, w, x, ldx, T, y, ldy, parts);
    else if (T <= 32) launch_mma_p<1, 4>(s, w, x, ldx, T, y, ldy, parts);
    else launch_mma_p<2, 8>(s, w, x, ldx, T, y, ldy, parts);
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

extern "C" void cu_matmul(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y,
                          int64_t ldy, int mode) {
    if (T <= 0 || w->rows <= 0) return;
    /* 16-byte activation loads need 16-byte aligned rows */
    int fk = fk_of(w);
    if (ldx % 4 != 0 || ((uintptr_t)x & 15) != 0) fk = FK_GEN;
    if (fk == FK_BF16 && mode != CU_MM_FMA) {
        launch_mma(s, w, x, ldx, T, y, ldy, mode == CU_MM_BF16 ? 1 : 3);
        return;
    }
    switch (fk) {
    case FK_BF16: launch_mm<FK_BF16>(s, w, x, ldx, T, y, ldy); break;
    case FK_F32: launch_mm<FK_F32>(s, w, x, ldx, T, y, ldy); break;
    case FK_Q8: launch_mm<FK_Q8>(s, w, x, ldx, T, y, ldy); break;
    case FK_Q4: launch_mm<FK_Q4>(s, w, x, ldx, T, y, ldy); break;
    default: launch_mm<FK_GEN>(s, w, x, ldx, T, y, ldy); break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Gated DeltaNet */

/* causal depthwise conv + SiLU: a thread per (item, channel), the item's tokens in order */
__global__ void k_gdn_conv(cu_plan p, cu_gdn_args a) {
    const int it = blockIdx.x;
    const int64_t ch = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= a.cd) return;
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0;
    float *st = a.conv_state + (size_t)p.slot[it] * a.conv_stride;
    const int K = a.K;
    if (K == 4) { /* Qwen3.5's width: the window in registers, one read and one write of the state */
        float sv[3], tap[4];
#pragma unroll
        for (int j = 0; j < 3; j++) sv[j] = st[j * a.cd + ch];
#pragma unroll
        for (int j = 0; j < 4; j++) tap[j] = a.conv_t[j * a.cd + ch];
        for (int64_t i = 0; i < n; i++) {
            float *m = a.qkv + (t0 + i) * a.cd + ch;
            const float mv = *m;
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < 3; j++) acc += tap[j] * sv[j];
            acc += tap[3] * mv;
            sv[0] = sv[1], sv[1] = sv[2], sv[2] = mv;
            *m = acc / (1.0f + expf(-acc));
        }
#pragma unroll
        for (int j = 0; j < 3; j++) st[j * a.cd + ch] = sv[j];
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float *m = a.qkv + (t0 + i) * a.cd + ch;
        const float mv = *m;
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += a.conv_t[j * a.cd + ch] * st[j * a.cd + ch];
        acc += a.conv_t[(K - 1) * a.cd + ch] * mv;
        for (int j = 0; j + 1 < K - 1; j++) st[j * a.cd + ch] = st[(j + 1) * a.cd + ch];
        if (K > 1) st[(K - 2) * a.cd + ch] = mv;
        *m = acc / (1.0f + expf(-acc));
    }
}

/* L2 norms of the q and k heads: a warp per (token, q or k, key head) */
__global__ void k_gdn_qknorm(cu_gdn_args a, int64_t T) {
    const int64_t t = blockIdx.x;
    const int which = blockIdx.y / a.Hk, g = blockIdx.y % a.Hk;
    float *v = a.qkv + t * a.cd + (which ? a.kd : 0) + (int64_t)g * a.Dk;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < a.Dk; j += 32) ss += v[j] * v[j];
    ss = warp_sum(ss);
    const float scale = which ? 1.0f : 1.0f / sqrtf((float)a.Dk);
    const float r = scale / sqrtf(ss + 1e-6f);
    for (int j = threadIdx.x; j < a.Dk; j += 32) v[j] *= r;
}

/* the delta rule, per step: a block of 32 threads per (item, value head, 32 state columns),
 * a thread per column (the columns of a head are independent: each has its own error and
 * output); the block's slice sits in shared memory as [Dk][32]. The device keeps each head's
 * state as [Dk][Dv], so the slice's loads and stores are coalesced. */
#define GDN_COLS 32
__global__ void k_gdn_recur(cu_plan p, cu_gdn_args a) {
    extern __shared__ float sh[];
    const int it = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, i = blockIdx.z * GDN_COLS + lane;
    const int Dk = a.Dk, Dv = a.Dv, g = h / (a.Hv / a.Hk);
    float *S = sh, *qs = sh + Dk * GDN_COLS, *ks = qs + Dk;
    float *Sg = a.rec_state + (size_t)p.slot[it] * a.rec_stride + (size_t)h * Dv * Dk;
    const bool on = i < Dv;
    if (on)
        for (int j = 0; j < Dk; j++) S[j * GDN_COLS + lane] = Sg[(size_t)j * Dv + i];
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0;
    for (int64_t s = 0; s < n; s++) {
        const int64_t t = t0 + s;
        const float *row = a.qkv + t * a.cd;
        __syncwarp();
        for (int j = lane; j < Dk; j += GDN_COLS) {
            qs[j] = row[(int64_t)g * Dk + j];
            ks[j] = row[a.kd + (int64_t)g * Dk + j];
        }
        __syncwarp();
        if (on) {
            const float beta = sigmoidf_(a.b[t * a.Hv + h]);
            const float alpha = expf(a.neg_exp_a[h] * softplusf_(a.a[t * a.Hv + h] + a.dt_bias[h]));
            const float v = row[2 * a.kd + (int64_t)h * Dv + i];
            float e = 0.0f;
            for (int j = 0; j < Dk; j++) {
                const float x = S[j * GDN_COLS + lane] * alpha;
                S[j * GDN_COLS + lane] = x;
                e += x * ks[j];
            }
            const float delta = beta * (v - e);
            float o = 0.0f;
            for (int j = 0; j < Dk; j++) {
                const float x = S[j * GDN_COLS + lane] + delta * ks[j];
                S[j * GDN_COLS + lane] = x;
                o += x * qs[j];
            }
            a.mix[t * a.vd + (int64_t)h * Dv + i] = o;
        }
    }
    if (on)
        for (int j = 0; j < Dk; j++) Sg[(size_t)j * Dv + i] = S[j * GDN_COLS + lane];
}

/* gated RMSNorm: norm(o) * w * silu(z), a warp per (token, value head) */
__global__ void k_gdn_gnorm(cu_gdn_args a) {
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y;
    float *o = a.mix + t * a.vd + (int64_t)h * a.Dv;
    const float *z = a.z + t * a.vd + (int64_t)h * a.Dv;
    float ss = 0.0f;
    for (int r = threadIdx.x; r < a.Dv; r += 32) ss += o[r] * o[r];
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)a.Dv + a.eps);
    for (int r = threadIdx.x; r < a.Dv; r += 32) o[r] = o[r] * rs * a.norm_w[r] * siluf_(z[r]);
}

extern "C" void cu_gdn(cu_stream s, const cu_plan *p, const cu_gdn_args *a, int max_item_tokens) {
    (void)max_item_tokens;
    if (p->n_tokens <= 0) return;
    dim3 gc((unsigned)p->n_items, (unsigned)((a->cd + 127) / 128));
    k_gdn_conv<<<gc, 128, 0, s>>>(*p, *a);
    dim3 gq((unsigned)p->n_tokens, (unsigned)(2 * a->Hk));
    k_gdn_qknorm<<<gq, 32, 0, s>>>(*a, p->n_tokens);
    const size_t shm = ((size_t)a->Dk * GDN_COLS + 2 * (size_t)a->Dk) * sizeof(float);
    dim3 gr((unsigned)p->n_items, (unsigned)a->Hv, (unsigned)((a->Dv + GDN_COLS - 1) / GDN_COLS));
    k_gdn_recur<<<gr, GDN_COLS, shm, s>>>(*p, *a);
    dim3 gn((unsigned)p->n_tokens, (unsigned)a->Hv);
    k_gdn_gnorm<<<gn, 32, 0, s>>>(*a);
}

extern "C" int cu_gdn_prepare(int Dk, int Dv) {
    (void)Dv;
    const size_t shm = ((size_t)Dk * GDN_COLS + 2 * (size_t)Dk) * sizeof(float);
    if (shm <= 48 * 1024) return 0;
    return cudaFuncSetAttribute(k_gdn_recur, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm) == cudaSuccess ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------- */
/* attention */

__device__ __forceinline__ size_t kv_index(const cu_kv &kv, const cu_plan &p, int it, int li, int which, int h,
                                           int64_t pos) {
    const int64_t b = p.blocks[p.block_t0[it] + pos / kv.block_size], off = pos % kv.block_size;
    return (size_t)b * ((size_t)kv.n_full * 2 * kv.nkv * kv.block_size * kv.hd) +
           ((size_t)(li * 2 + which) * kv.nkv + h) * ((size_t)kv.block_size * kv.hd) + (size_t)off * kv.hd;
}

/* rmsnorm (weight w) then the half-split rotation of the first rope_dim dims, one warp */
__device__ void norm_rope(float *x, const float *w, int hd, int rope_dim, float eps, const float *cs,
                          const float *sn) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int e = lane; e < hd; e += 32) ss += x[e] * x[e];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
    __syncwarp();
    for (int e = lane; e < hd; e += 32) x[e] = x[e] * r * w[e];
    __syncwarp();
    const int half = rope_dim / 2;
    for (int i = lane; i < half; i += 32) {
        const float a0 = x[i], b0 = x[i + half];
        x[i] = a0 * cs[i] - b0 * sn[i];
        x[i + half] = b0 * cs[i] + a0 * sn[i];
    }
    __syncwarp();
}

/* a block per token: angles, q and k heads (a warp each), K and V into the pool */
__global__ void k_attn_prep(cu_plan p, cu_attn_args a, cu_kv kv) {
    extern __shared__ float sh[];
    float *cs = sh, *sn = sh + a.rope_dim / 2;
    const int64_t t = blockIdx.x;
    const int it = p.tok_item[t];
    const int64_t pos = p.pos0[it] + (t - p.item_t0[it]);
    for (int i = threadIdx.x; i < a.rope_dim / 2; i += blockDim.x) {
        const float ang = (float)pos * a.inv_freq[i];
        cs[i] = cosf(ang);
        sn[i] = sinf(ang);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp; j < a.nh; j += nw)
        norm_rope(a.q + t * 2 * a.nh * a.hd + (int64_t)j * 2 * a.hd, a.q_norm, a.hd, a.rope_dim, a.eps, cs, sn);
    for (int h = warp; h < a.nkv; h += nw) {
        float *k = a.k + t * a.nkv * a.hd + (int64_t)h * a.hd;
        norm_rope(k, a.k_norm, a.hd, a.rope_dim, a.eps, cs, sn);
        const float *v = a.v + t * a.nkv * a.hd + (int64_t)h * a.hd;
        const size_t ki = kv_index(kv, p, it, a.li, 0, h, pos), vi = kv_index(kv, p, it, a.li, 1, h, pos);
        for (int e = lane; e < a.hd; e += 32) {
            if (kv.bf16) {
                ((uint16_t *)kv.base)[ki + e] = f2bf16(k[e]);
                ((uint16_t *)kv.base)[vi + e] = f2bf16(v[e]);
            } else {
                ((float *)kv.base)[ki + e] = k[e];
                ((float *)kv.base)[vi + e] = v[e];
            }
        }
    }
}

extern "C" void cu_attn_prep(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv) {
    if (p->n_tokens <= 0) return;
    k_attn_prep<<<(unsigned)p->n_tokens, 128, (size_t)a->rope_dim * sizeof(float), s>>>(*p, *a, *kv);
}

#define ATT_CH 128 /* positions per pass = threads per block */

__device__ __forceinline__ float kv_load(const cu_kv &kv, size_t i) {
    return kv.bf16 ? bf16f(((const uint16_t *)kv.base)[i]) : ((const float *)kv.base)[i];
}

/* a block per (token, query head): the causal softmax over the item's positions in passes of
 * ATT_CH positions merged online, then the sigmoid gate */
__global__ void k_attention(cu_plan p, cu_attn_args a, cu_kv kv) {
    extern __shared__ float sh[];
    __shared__ float red[32];
    float *qs = sh, *pr = sh + a.hd, *o = pr + ATT_CH;
    const int64_t t = blockIdx.x;
    const int j = blockIdx.y, h = j / (a.nh / a.nkv), tid = threadIdx.x;
    const int it = p.tok_item[t];
    const int64_t pos = p.pos0[it] + (t - p.item_t0[it]);
    const float scale = 1.0f / sqrtf((float)a.hd);
    const float *qg = a.q + t * 2 * a.nh * a.hd + (int64_t)j * 2 * a.hd;
    for (int e = tid; e < a.hd; e += blockDim.x) {
        qs[e] = qg[e] * scale;
        o[e] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    float *scs = o + a.hd; /* [ATT_CH] the chunk's scores */
    const int warp = tid >> 5, lane = tid & 31, nw = blockDim.x >> 5;
    for (int64_t c0 = 0; c0 <= pos; c0 += ATT_CH) {
        /* scores: a warp per position, its lanes over the head's dims (coalesced) */
        for (int q = warp; q < ATT_CH; q += nw) {
            const int64_t pq = c0 + q;
            float acc = 0.0f;
            if (pq <= pos) {
                const size_t ki = kv_index(kv, p, it, a.li, 0, h, pq);
                for (int e = lane; e < a.hd; e += 32) acc += qs[e] * kv_load(kv, ki + e);
            }
            acc = warp_sum(acc);
            if (lane == 0) scs[q] = pq <= pos ? acc : -INFINITY;
        }
        __syncthreads();
        const int64_t pp = c0 + tid;
        const float sc = scs[tid];
        const float cm = block_max(sc, red);
        const float mn = fmaxf(m, cm);
        const float pe = pp <= pos ? expf(sc - mn) : 0.0f;
        pr[tid] = pe;
        const float csum = block_sum(pe, red); /* also orders pr[] before the reads below */
        const float f = m == -INFINITY ? 0.0f : expf(m - mn);
        l = l * f + csum;
        const int64_t n = pos - c0 + 1 < ATT_CH ? pos - c0 + 1 : ATT_CH;
        for (int e = tid; e < a.hd; e += blockDim.x) {
            float acc = o[e] * f;
            for (int64_t q = 0; q < n; q++) acc += pr[q] * kv_load(kv, kv_index(kv, p, it, a.li, 1, h, c0 + q) + e);
            o[e] = acc;
        }
        m = mn;
        __syncthreads();
    }
    const float *gate = qg + a.hd;
    float *dst = a.mix + t * a.nh * a.hd + (int64_t)j * a.hd;
    const float inv = 1.0f / l;
    for (int e = tid; e < a.hd; e += blockDim.x) dst[e] = o[e] * inv * sigmoidf_(gate[e]);
}

extern "C" void cu_attention(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv) {
    if (p->n_tokens <= 0) return;
    dim3 grid((unsigned)p->n_tokens, (unsigned)a->nh);
    const size_t shm = (size_t)(2 * a->hd + 2 * ATT_CH) * sizeof(float);
    k_attention<<<grid, ATT_CH, shm, s>>>(*p, *a, *kv);
}
