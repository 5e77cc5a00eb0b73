/* ==== CUDA kernels (see cuda_kernels.h) ====
 *
 * Every reduction has a fixed order given by the output's own indices: a matrix row's dot
 * product is summed by lane (columns lane, lane+32, ...) then over the warp by a fixed
 * butterfly; norms by a fixed block tree; the delta rule by state row, sequentially over
 * the key dimension; attention by query, over positions in order. No kernel's result for a
 * token depends on the other tokens of the launch.
 */
#include <cuda_bf16.h>
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

/* Programmatic dependent launch: the decode path's kernels are launched with
 * programmaticStreamSerialization (launch_pdl), so that a kernel's blocks start while its
 * predecessor's last ones finish; each such kernel calls pdl_wait() before it touches
 * anything another kernel writes or reads, and before any early return (the product kernels
 * first put their first weight loads in flight: the weights never change). 0: plain launches. */
#define CU_PDL 1
__device__ __forceinline__ void pdl_wait() {
#if CU_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    /* and let the successor's blocks start as this kernel's leave: they put their weight loads
     * in flight in this kernel's tail, then wait (griddepcontrol.wait: until this grid is done
     * and its writes are visible, so a successor waiting is a successor of every grid before) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... KP, typename... A>
static void launch_pdl(void (*k)(KP...), dim3 grid, dim3 block, size_t shm, cu_stream s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = CU_PDL ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, args...);
}

/* ---------------------------------------------------------------------------------------- */
/* embedding, norms, elementwise */

template <int FMT>
__global__ void k_embed(cu_mat w, const int32_t *tokens, float *x) {
    const int64_t t = blockIdx.x, row = tokens[t];
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) x[t * w.cols + c] = w_at<FMT>(w, row, c);
}

__device__ __forceinline__ int64_t tiled_at(int64_t cols, int64_t r, int64_t c);
__global__ void k_embed_tiled(cu_mat w, const int32_t *tokens, float *x) {
    pdl_wait();
    const int64_t t = blockIdx.x, row = tokens[t];
    const uint16_t *d = (const uint16_t *)w.data;
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) x[t * w.cols + c] = bf16f(d[tiled_at(w.cols, row, c)]);
}

/* row r, column c of a Q tiled matrix (see k_qmv), as k_embed<3> makes it */
__global__ void k_embed_q(cu_mat w, const int32_t *tokens, float *x) {
    pdl_wait();
    const int64_t t = blockIdx.x, r = tokens[t], m = r / 16, rr = r % 16, nsteps = w.cols / 32, ng = w.cols / w.group;
    const uint8_t *d = (const uint8_t *)w.data;
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) {
        const int64_t k = c / 32, L = 4 * (rr % 8) + (c % 32) / 8, e = c % 8;
        const int64_t q = (m * nsteps + k) * 64 + L * 2 + rr / 8;
        const uint32_t v = w.bits == 8 ? d[q * 8 + e]
                                       : (*(const uint32_t *)(d + q * 4) >> ((e & 1) * 16 + (e >> 1) * 4)) & 15u;
        const int64_t gi = (m * ng + c / w.group) * 16 + rr;
        x[t * w.cols + c] = fmaf(load_s(w.scales, w.sdtype, gi), (float)v, load_s(w.biases, w.sdtype, gi));
    }
}

extern "C" void cu_embed(cu_stream s, const cu_mat *emb, const int32_t *tokens, int64_t T, float *x) {
    if (T <= 0) return;
    switch (emb->fmt) {
    case CU_FMT_BF16_TILED: launch_pdl(k_embed_tiled, dim3((unsigned)T), dim3(256), 0, s, *emb, tokens, x); break;
    case CU_FMT_Q_TILED: launch_pdl(k_embed_q, dim3((unsigned)T), dim3(256), 0, s, *emb, tokens, x); break;
    case 0: k_embed<0><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    case 1: k_embed<1><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    case 2: k_embed<2><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    default: k_embed<3><<<(unsigned)T, 256, 0, s>>>(*emb, tokens, x); break;
    }
}

/* v as its P bf16 parts into xs[p][t][c] (the split activations of the tiled products; pstride
 * elements a part) */
__device__ __forceinline__ void put_parts(uint16_t *xs, int parts, int64_t pstride, int64_t at, float v) {
    for (int p = 0; p < parts; p++) {
        const uint16_t h = f2bf16(v);
        xs[p * pstride + at] = h;
        v -= bf16f(h);
    }
}

/* a block of NORM_THREADS per token; a row of up to 8 * NORM_THREADS stays in registers
 * between the sum of squares and the scaling. xs (parts > 0): the result also split, as
 * k_split would, ldxs = d rounded up to 32. */
#define NORM_THREADS 1024
__global__ void __launch_bounds__(NORM_THREADS) k_add_norm(float *x, const float *out, const float *w, float *xn,
                                                           int64_t d, float eps, int add, int apply, uint16_t *xs,
                                                           int parts) {
    pdl_wait();
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    float *xr = x + t * d;
    float v[8];
    float ss = 0.0f;
    const bool held = d <= 8 * NORM_THREADS;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t c = threadIdx.x + (int64_t)i * NORM_THREADS;
        v[i] = 0.0f;
        if (held && c < d) {
            float e = xr[c];
            if (add) xr[c] = e = e + out[t * d + c];
            v[i] = e;
            ss += e * e;
        }
    }
    if (!held)
        for (int64_t c = threadIdx.x; c < d; c += NORM_THREADS) {
            float e = xr[c];
            if (add) xr[c] = e = e + out[t * d + c];
            ss += e * e;
        }
    if (!apply) return;
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (held) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int64_t c = threadIdx.x + (int64_t)i * NORM_THREADS;
            if (c < d) xn[t * d + c] = v[i] * r * w[c];
        }
    } else {
        for (int64_t c = threadIdx.x; c < d; c += NORM_THREADS) xn[t * d + c] = xr[c] * r * w[c];
    }
    if (xs) {
        const int64_t ldxs = (d + 31) / 32 * 32, pstride = (int64_t)gridDim.x * ldxs;
        for (int64_t c = threadIdx.x; c < ldxs; c += NORM_THREADS)
            put_parts(xs, parts, pstride, t * ldxs + c, c < d ? xn[t * d + c] : 0.0f); /* this thread's own */
    }
}

extern "C" void cu_add_norm(cu_stream s, float *x, const float *out, const float *w, float *xn, int64_t T,
                            int64_t d, float eps, int add, int apply, uint16_t *xs, int parts) {
    if (T <= 0) return;
    launch_pdl(k_add_norm, dim3((unsigned)T), dim3(NORM_THREADS), 0, s, x, out, w, xn, d, eps, add, apply,
               apply ? xs : (uint16_t *)NULL, parts);
}

/* xs (parts > 0): the result also split, ldxs = n rounded up to 32 (zeros past n) */
__global__ void k_silu_mul(float *g, const float *u, int64_t T, int64_t n, int64_t ld, uint16_t *xs, int parts) {
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, ldxs = (n + 31) / 32 * 32;
    if (i >= T * (xs ? ldxs : n)) return;
    const int64_t w = xs ? ldxs : n, t = i / w, c = i % w;
    float r = 0.0f;
    if (c < n) {
        const float v = g[t * ld + c];
        g[t * ld + c] = r = siluf_(v) * u[t * ld + c];
    }
    if (xs) put_parts(xs, parts, T * ldxs, t * ldxs + c, r);
}

extern "C" void cu_silu_mul(cu_stream s, float *g, const float *u, int64_t T, int64_t n, int64_t ld, uint16_t *xs,
                            int parts) {
    const int64_t total = T * (xs ? (n + 31) / 32 * 32 : n);
    if (total <= 0) return;
    launch_pdl(k_silu_mul, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, g, u, T, n, ld, xs, parts);
}

__global__ void k_gather_rows(const float *src, int64_t d, const int32_t *rows, float *dst) {
    pdl_wait();
    const int64_t i = blockIdx.x, r = rows[i];
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[i * d + c] = src[r * d + c];
}

extern "C" void cu_gather_rows(cu_stream s, const float *src, int64_t d, const int32_t *rows, int64_t n, float *dst) {
    if (n <= 0) return;
    launch_pdl(k_gather_rows, dim3((unsigned)n), dim3(256), 0, s, src, d, rows, dst);
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
 * The weights are stored tiled (CU_FMT_BF16_TILED, cu_tile_bf16): rows padded to 16 and
 * columns to 32 with zeros; tile m (rows 16m..16m+15) and step k (columns 32k..32k+31) are
 * 1 KB at element (m * nsteps + k) * 512, in the order the lanes load them: first lane L's
 * 8 columns 32k+8t..+7 of row 16m+g for every lane L = 4g + t, then the same of row 16m+g+8.
 * A warp's load of a step is 2 x 512 contiguous bytes and a tile is one contiguous run: the
 * memory sees long sequential reads, as a copy does (row-major tiles read 64 bytes from each
 * of 16 rows at a time and reached half the bandwidth; bench/cuda/mmv_bench.cu).
 *
 * Summation order, fixed by the matrix's shape alone: a block's S warps (MM_SPLITS) take the
 * 32-column steps in turn (warp s: steps s, s + S, ...), each step two MMAs (columns 8t..8t+3,
 * then 8t+4..8t+7 of lane group t) per part, hi first; then the S partial sums are added in
 * warp order. A token's result depends only on its own activations (an MMA's output column is its
 * own dot product), so it is the same bits whatever the batch, the tile it lands in, the
 * kernel (k_mmv for up to 16 tokens, k_mma beyond) and the tile shape a launch picks.
 *
 * Fragments (PTX ISA, m16n8k16 .bf16): lane = 4g + t; A regs a0 (row g, k 2t..2t+1),
 * a1 (row g+8, same k), a2 (row g, k 2t+8..9), a3 (row g+8, k 2t+8..9); B regs b0 (k 2t..2t+1,
 * column g), b1 (k 2t+8..9, column g); C c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8).
 * Which physical column feeds which k slot is free as long as A and B agree: lane (g, t)
 * holds 8 consecutive columns 8t..8t+7 of rows g and g+8 and of token g; the first MMA takes
 * columns 8t..8t+3 as k slots (2t, 2t+1, 2t+8, 2t+9), the second 8t+4..8t+7. */

/* S, the warps of a block splitting the steps (16 for long rows was measured slower: the
 * down projection at 1 token, 2,995 against 3,347 GB/s) */
#define MM_SPLITS 8

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a streamed weight load: read once, kept out of L1 */
__device__ __forceinline__ uint4 ldg_stream(const uint16_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* cp.async: 16 bytes (bytes < 16: the rest zeros) global -> shared, in groups */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int bytes) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* the tiled layout */
__host__ __device__ __forceinline__ int64_t tiled_steps(int64_t cols) { return (cols + 31) / 32; }
__host__ __device__ __forceinline__ int64_t tiled_tiles(int64_t rows) { return (rows + 15) / 16; }
__device__ __forceinline__ int64_t tiled_at(int64_t cols, int64_t r, int64_t c) {
    const int64_t m = r / 16, k = c / 32, rr = r % 16, cc = c % 32;
    return ((m * tiled_steps(cols) + k) * 64 + (rr / 8) * 32 + (rr % 8) * 4 + cc / 8) * 8 + cc % 8;
}

extern "C" size_t cu_tiled_elems(int64_t rows, int64_t cols) {
    return (size_t)tiled_tiles(rows) * (size_t)tiled_steps(cols) * 512;
}

/* a thread per 8-element piece of the destination */
__global__ void k_tile(const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    const int64_t nsteps = tiled_steps(cols), nq = tiled_tiles(rows) * nsteps * 64;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int half = (int)(q % 64) / 32, L = (int)(q % 32);
        const int64_t r = 16 * m + 8 * half + (L >> 2), c = 32 * k + 8 * (L & 3);
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = r < rows && c + e < cols ? src[r * cols + c + e] : 0;
        *(uint4 *)(dst + q * 8) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
    }
}

extern "C" void cu_tile_bf16(cu_stream s, const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    if (rows > 0 && cols > 0) k_tile<<<4096, 256, 0, s>>>(src, rows, cols, dst);
}

/* The activations split once into bf16 parts for k_mmv: xs[p][n][c], c < ldxs (the width
 * rounded up to 32, zeros past it); the same parts k_mma makes inside. */
template <int P>
__global__ void k_split(const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs) {
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = i / ldxs, c = i % ldxs;
    if (n >= T) return;
    float v = c < cols ? x[n * ldx + c] : 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint16_t h = f2bf16(v);
        xs[(int64_t)p * T * ldxs + n * ldxs + c] = h;
        v -= bf16f(h);
    }
}

/* A launch's matrices (up to 4 of one width, reading the same activations): block b belongs
 * to the last matrix i with blk0[i] <= b. */
struct mm_group {
    int n;
    cu_mat w[4];
    float *y[4];
    int64_t ldy[4];
    int64_t blk0[4];
    /* k_gemm split over its summation classes (gridDim.z > 1): each class's partial sums
     * [MM_SPLITS][T][rows] of matrix i at part + MM_SPLITS * T * prow[i] */
    float *part;
    int64_t prow[4];
};

struct mm_pick {
    cu_mat w;
    float *y;
    int64_t ldy, blk; /* the block's index within its matrix */
    int i;            /* the matrix's */
};

__device__ __forceinline__ mm_pick mm_select_at(const mm_group &g, int64_t b) {
    mm_pick o = {g.w[0], g.y[0], g.ldy[0], b, 0};
#pragma unroll
    for (int q = 1; q < 4; q++)
        if (q < g.n && b >= g.blk0[q]) o = {g.w[q], g.y[q], g.ldy[q], b - g.blk0[q], q};
    return o;
}

__device__ __forceinline__ mm_pick mm_select(const mm_group &g) { return mm_select_at(g, (int64_t)blockIdx.x); }

/* the S warps' partial sums of MT tiles and one token tile, in warp order, into y */
template <int MT, int MM_S>
__device__ __forceinline__ void mm_reduce(const float (&acc)[MT][4], float (*red)[MT * 128], int64_t r0, int64_t rows,
                                          int64_t n0, int64_t T, float *y, int64_t ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float *o = red[warp] + m * 128;
        o[g * 8 + 2 * t] = acc[m][0];
        o[g * 8 + 2 * t + 1] = acc[m][1];
        o[(g + 8) * 8 + 2 * t] = acc[m][2];
        o[(g + 8) * 8 + 2 * t + 1] = acc[m][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MT * 128; i += blockDim.x) {
        const int m = i / 128, row = (i % 128) / 8, col = i % 8;
        const int64_t r = r0 + 16 * m + row, n = n0 + col;
        float sum = 0.0f;
        for (int q = 0; q < MM_S; q++) sum += red[q][i];
        if (r < rows && n < T) y[n * ldy + r] = sum;
    }
}

/* the two MMAs of one step per part: A from registers, B as 8 bf16 of each part */
template <int P>
__device__ __forceinline__ void mma_step(float (&acc)[4], const uint4 &a0, const uint4 &a1, const uint4 (&b)[P]) {
#pragma unroll
    for (int p = 0; p < P; p++) mma_bf16(acc, a0.x, a1.x, a0.y, a1.y, b[p].x, b[p].y);
#pragma unroll
    for (int p = 0; p < P; p++) mma_bf16(acc, a0.z, a1.z, a0.w, a1.w, b[p].z, b[p].w);
}

/* Up to 16 tokens (NT token tiles of 8), activations split beforehand (k_split): a block a
 * tile; each warp keeps U steps of weights in flight. */
template <int P, int NT, int U, int MINB, int MM_S>
__global__ void __launch_bounds__(32 * MM_S, MINB) k_mmv(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    __shared__ float red[MM_S][128];
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = tiled_steps(w.cols), pstride = T * ldxs;
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_S - 1) / MM_S : 0; /* this warp's steps */
    const uint16_t *pa = (const uint16_t *)w.data + (pk.blk * nsteps + warp) * 512 + 8 * lane;
    const uint16_t *px = xs + 8 * t + warp * 32;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint4 a[U][2];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < ni) {
            a[u][0] = ldg_stream(pa + u * (MM_S * 512));
            a[u][1] = ldg_stream(pa + u * (MM_S * 512) + 256);
        }
    pdl_wait(); /* the activations are the predecessor's */
    for (int64_t i = 0; i < ni; i += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t ii = i + u;
            if (ii < ni) {
                const uint4 a0 = a[u][0], a1 = a[u][1];
                uint4 b[NT][P];
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int64_t n = 8 * j + g;
#pragma unroll
                    for (int p = 0; p < P; p++)
                        b[j][p] = n < T ? *(const uint4 *)(px + ii * (MM_S * 32) + p * pstride + n * ldxs)
                                        : make_uint4(0, 0, 0, 0);
                }
                if (ii + U < ni) {
                    a[u][0] = ldg_stream(pa + (ii + U) * (MM_S * 512));
                    a[u][1] = ldg_stream(pa + (ii + U) * (MM_S * 512) + 256);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) mma_step<P>(acc[j], a0, a1, b[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float one[1][4] = {{acc[j][0], acc[j][1], acc[j][2], acc[j][3]}};
        mm_reduce<1, MM_S>(one, red, pk.blk * 16, w.rows, 8 * j, T, pk.y, pk.ldy);
    }
}

/* token n's 8 activations at column c (zeros past T or the width) */
__device__ __forceinline__ void mma_load_x(const float *x, int64_t ldx, int64_t T, int64_t n, int64_t c, int64_t cols,
                                           bool vec, float (&xv)[8]) {
    if (n < T && vec && c + 8 <= cols) {
        const float4 u = *(const float4 *)(x + n * ldx + c), v = *(const float4 *)(x + n * ldx + c + 4);
        xv[0] = u.x, xv[1] = u.y, xv[2] = u.z, xv[3] = u.w, xv[4] = v.x, xv[5] = v.y, xv[6] = v.z, xv[7] = v.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) xv[k] = n < T && c + k < cols ? x[n * ldx + c + k] : 0.0f;
    }
}

/* Any number of tokens: MT tiles by NT token tiles a block, the activations split inside
 * (the same parts as k_split's). U: steps of weights in flight a warp. */
template <int MT, int NT, int P, int U, int MM_S>
__global__ void __launch_bounds__(32 * MM_S) k_mma(mm_group grp, const float *x, int64_t ldx, int64_t T) {
    __shared__ float red[MM_S][MT * 128];
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = tiled_steps(w.cols), ntiles = tiled_tiles(w.rows), m0 = pk.blk * MT;
    const int64_t n0 = (int64_t)blockIdx.y * (8 * NT);
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_S - 1) / MM_S : 0;
    const bool vec = ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
    const uint16_t *pa = (const uint16_t *)w.data + (m0 * nsteps + warp) * 512 + 8 * lane;
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    uint4 a[U][MT][2];
    auto load = [&](int64_t ii, uint4 (&dst)[MT][2]) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const bool in = m0 + m < ntiles;
            const uint16_t *q = pa + (m * nsteps + ii * MM_S) * 512;
            dst[m][0] = in ? ldg_stream(q) : make_uint4(0, 0, 0, 0);
            dst[m][1] = in ? ldg_stream(q + 256) : make_uint4(0, 0, 0, 0);
        }
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < ni) load(u, a[u]);
    for (int64_t i = 0; i < ni; i += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t ii = i + u;
            if (ii < ni) {
                uint4 cur[MT][2];
#pragma unroll
                for (int m = 0; m < MT; m++) cur[m][0] = a[u][m][0], cur[m][1] = a[u][m][1];
                if (ii + U < ni) load(ii + U, a[u]);
                const int64_t c = (warp + ii * MM_S) * 32 + 8 * t;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    float xv[8];
                    mma_load_x(x, ldx, T, n0 + 8 * j + g, c, w.cols, vec, xv);
                    uint4 b[P];
                    uint32_t bw[P][4];
#pragma unroll
                    for (int k = 0; k < 8; k += 2) {
                        float r0v = xv[k], r1v = xv[k + 1];
#pragma unroll
                        for (int p = 0; p < P; p++) {
                            const uint16_t h0 = f2bf16(r0v), h1 = f2bf16(r1v);
                            bw[p][k / 2] = pack2(h0, h1);
                            r0v -= bf16f(h0);
                            r1v -= bf16f(h1);
                        }
                    }
#pragma unroll
                    for (int p = 0; p < P; p++) b[p] = make_uint4(bw[p][0], bw[p][1], bw[p][2], bw[p][3]);
#pragma unroll
                    for (int m = 0; m < MT; m++) mma_step<P>(acc[m][j], cur[m][0], cur[m][1], b);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float accj[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) accj[m][e] = acc[m][j][e];
        mm_reduce<MT, MM_S>(accj, red, m0 * 16, w.rows, n0 + 8 * j, T, pk.y, pk.ldy);
    }
}

/* ---- MLX affine 4- and 8-bit on tensor cores: k_qmv ----
 * The packed values stay packed, re-laid at upload as the bf16 tiles are (CU_FMT_Q_TILED,
 * cu_tile_q): tile m, step k holds 32 lane chunks of 2 * bits bytes, lane 4g + t's columns
 * 32k + 8t .. + 7 of row 16m + g, then of row 16m + g + 8. 8-bit: the 8 bytes as stored;
 * 4-bit: the 8 nibbles of columns c0..c7 at bits c0 0, c1 16, c2 4, c3 20, c4 8, c5 24, c6 12,
 * c7 28, so that one shift and one mask make the bf16 pair of two neighbours. Scales and
 * biases: [tile][group][16 rows], as stored (f32, f16 or bf16).
 * An integer value q is exact in bf16, so on the tensor cores a group g of a row gives
 *   y += s_g * (sum_c q_c x_c) + b_g * (sum_c x_c)
 * both sums exact products accumulated in fp32 (the second by an MMA with a matrix of ones),
 * x in the same bf16 parts as the bf16 kernels (3: fp32-grade; 1: bf16). A block takes one
 * tile and up to 16 tokens; its S warps take the groups in turn (warp s: groups s, s + S, ...)
 * and their partial sums are added in warp order: the order is fixed by the shape alone, for
 * any token count (more than 16 tokens: the same kernel on slices of 16). */
extern "C" size_t cu_qtiled_bytes(int64_t rows, int64_t cols, int bits) {
    return (size_t)tiled_tiles(rows) * (size_t)(cols / 32) * 64 * (size_t)bits;
}
extern "C" size_t cu_qtiled_groups(int64_t rows, int64_t cols, int group) {
    return (size_t)tiled_tiles(rows) * (size_t)(cols / group) * 16;
}

/* a thread per destination chunk (8 columns of a row): src [rows][cols * bits / 8] */
__global__ void k_tile_q(const uint8_t *src, int64_t rows, int64_t cols, int bits, uint8_t *dst) {
    const int64_t nsteps = cols / 32, nq = tiled_tiles(rows) * nsteps * 64, rb = cols * bits / 8;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int L = (int)(q % 64) / 2, half = (int)(q % 2);
        const int64_t r = 16 * m + 8 * half + (L >> 2), c = 32 * k + 8 * (L & 3);
        if (bits == 8) {
            uint2 v = make_uint2(0, 0);
            if (r < rows) v = *(const uint2 *)(src + r * rb + c);
            *(uint2 *)(dst + q * 8) = v;
        } else {
            uint32_t v = r < rows ? *(const uint32_t *)(src + r * rb + c / 2) : 0u, o = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) o |= ((v >> (4 * e)) & 15u) << ((e & 1) * 16 + (e >> 1) * 4);
            *(uint32_t *)(dst + q * 4) = o;
        }
    }
}

/* a thread per (tile, group, row): src [rows][cols / group] of es bytes */
__global__ void k_tile_groups(const uint8_t *src, int64_t rows, int64_t ng, int es, uint8_t *dst) {
    const int64_t nq = tiled_tiles(rows) * ng * 16;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mj = q / 16, m = mj / ng, j = mj % ng, r = 16 * m + q % 16;
        for (int b = 0; b < es; b++) dst[q * es + b] = r < rows ? src[(r * ng + j) * es + b] : 0;
    }
}

extern "C" void cu_tile_q(cu_stream s, const void *data, const void *scales, const void *biases, int es, int64_t rows,
                          int64_t cols, int bits, int group, void *ddata, void *dscales, void *dbiases) {
    if (rows <= 0 || cols <= 0) return;
    k_tile_q<<<4096, 256, 0, s>>>((const uint8_t *)data, rows, cols, bits, (uint8_t *)ddata);
    k_tile_groups<<<1024, 256, 0, s>>>((const uint8_t *)scales, rows, cols / group, es, (uint8_t *)dscales);
    k_tile_groups<<<1024, 256, 0, s>>>((const uint8_t *)biases, rows, cols / group, es, (uint8_t *)dbiases);
}

/* bf16 pairs of the values of one step's chunk: a[0..3] the first MMA's A registers, a[4..7]
 * the second's (k_mmv's fragment order) */
template <int BITS>
__device__ __forceinline__ void q_frag(const uint4 &v, uint32_t (&a)[8]) {
    if (BITS == 8) {
        /* q as fp32 by 2^23 + q less 2^23 (exact), its high half the bf16 */
        auto pr = [](uint32_t w, int b) {
            const float f0 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440 + b)) - 8388608.0f;
            const float f1 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7441 + b)) - 8388608.0f;
            return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
        };
        /* v.x, v.y: row g's columns 0-3, 4-7; v.z, v.w: row g + 8's */
        a[0] = pr(v.x, 0), a[1] = pr(v.z, 0), a[2] = pr(v.x, 2), a[3] = pr(v.z, 2);
        a[4] = pr(v.y, 0), a[5] = pr(v.w, 0), a[6] = pr(v.y, 2), a[7] = pr(v.w, 2);
    } else {
        /* 0x4300 | n is the bf16 128 + n; less 128 (exact) */
        auto pr = [](uint32_t w, int sh) {
            const uint32_t u = ((w >> sh) & 0x000f000fu) | 0x43004300u;
            __nv_bfloat162 b = *(const __nv_bfloat162 *)&u;
            b = __hsub2(b, __floats2bfloat162_rn(128.0f, 128.0f));
            return *(const uint32_t *)&b;
        };
        /* v.x: row g's columns, v.y: row g + 8's */
        a[0] = pr(v.x, 0), a[1] = pr(v.y, 0), a[2] = pr(v.x, 4), a[3] = pr(v.y, 4);
        a[4] = pr(v.x, 8), a[5] = pr(v.y, 8), a[6] = pr(v.x, 12), a[7] = pr(v.y, 12);
    }
}

template <int BITS>
__device__ __forceinline__ uint4 q_load(const uint8_t *p) {
    if (BITS == 8) return ldg_stream((const uint16_t *)p);
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return make_uint4(v.x, v.y, 0, 0);
}

__device__ __forceinline__ float group_at(const void *p, int dt, int64_t i) { return load_s(p, dt, i); }

/* A block: one tile, BT tokens; the columns of its NTC token tiles of 8 hold the tokens' bf16
 * parts side by side (column n: token n / P, part n % P), so that a token alone takes one MMA
 * per part of the step, not one per part of each; each column's sums are its own, and the
 * parts of a token are added at the end, with the warps' partial sums, in a fixed order. GS:
 * the steps of a group (its columns / 32). R groups of values (and their scales and biases)
 * are in flight a warp. */
template <int P, int NTC, int BITS, int GS, int MM_S, int R>
__global__ void __launch_bounds__(32 * MM_S, NTC <= 2 ? 3 : 2)
    k_qmv(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    constexpr int BT = 8 * NTC / P; /* tokens a block */
    __shared__ float red[MM_S][NTC * 128];
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = w.cols / 32, ng = w.cols / w.group, m = pk.blk;
    const int64_t tb0 = (int64_t)blockIdx.y * BT, pstride = T * ldxs;
    const int64_t ni = warp < ng ? (ng - warp + MM_S - 1) / MM_S : 0; /* this warp's groups */
    constexpr int CB = 2 * BITS;                                      /* a lane's bytes a step */
    const uint8_t *pa = (const uint8_t *)w.data + m * nsteps * 32 * CB + lane * CB;
    const uint16_t *pb[NTC]; /* this lane's column g of each token tile: its token's part */
    bool bin[NTC];
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        const int n = 8 * j + g;
        const int64_t tok = tb0 + n / P;
        bin[j] = n / P < BT && tok < T;
        pb[j] = xs + (int64_t)(n % P) * pstride + (bin[j] ? tok : 0) * ldxs + 8 * t;
    }
    const uint32_t one2 = 0x3f803f80u; /* bf16 1.0, 1.0 */
    float acc[NTC][4];
#pragma unroll
    for (int j = 0; j < NTC; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint4 nx[R][GS];
    float nsb[R][4]; /* scale of rows g, g + 8, bias of rows g, g + 8 */
    auto fetch = [&](int sl, int64_t gi) {
        const int64_t gj = warp + gi * MM_S, k0 = gj * GS, q = (m * ng + gj) * 16 + g;
#pragma unroll
        for (int u = 0; u < GS; u++) nx[sl][u] = q_load<BITS>(pa + (k0 + u) * 32 * CB);
        nsb[sl][0] = load_s(w.scales, w.sdtype, q);
        nsb[sl][1] = load_s(w.scales, w.sdtype, q + 8);
        nsb[sl][2] = load_s(w.biases, w.sdtype, q);
        nsb[sl][3] = load_s(w.biases, w.sdtype, q + 8);
    };
#pragma unroll
    for (int sl = 0; sl < R; sl++)
        if (ni > sl) fetch(sl, sl);
    pdl_wait(); /* the activations are the predecessor's */
    for (int64_t i0 = 0; i0 < ni; i0 += R) {
#pragma unroll
        for (int sl = 0; sl < R; sl++) {
            const int64_t i = i0 + sl;
            if (i >= ni) break;
            const int64_t k0 = (warp + i * MM_S) * GS;
            uint4 cur[GS];
#pragma unroll
            for (int u = 0; u < GS; u++) cur[u] = nx[sl][u];
            const float s0 = nsb[sl][0], s1 = nsb[sl][1], b0 = nsb[sl][2], b1 = nsb[sl][3];
            if (i + R < ni) fetch(sl, i + R);
            float ga[NTC][4], xa[NTC][4];
#pragma unroll
            for (int j = 0; j < NTC; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) ga[j][e] = xa[j][e] = 0.0f;
#pragma unroll
            for (int u = 0; u < GS; u++) {
                uint32_t a[8];
                q_frag<BITS>(cur[u], a);
#pragma unroll
                for (int j = 0; j < NTC; j++) {
                    const uint4 b = bin[j] ? *(const uint4 *)(pb[j] + (k0 + u) * 32) : make_uint4(0, 0, 0, 0);
                    mma_bf16(ga[j], a[0], a[1], a[2], a[3], b.x, b.y);
                    mma_bf16(xa[j], one2, one2, one2, one2, b.x, b.y);
                    mma_bf16(ga[j], a[4], a[5], a[6], a[7], b.z, b.w);
                    mma_bf16(xa[j], one2, one2, one2, one2, b.z, b.w);
                }
            }
#pragma unroll
            for (int j = 0; j < NTC; j++) {
                acc[j][0] = fmaf(b0, xa[j][0], fmaf(s0, ga[j][0], acc[j][0]));
                acc[j][1] = fmaf(b0, xa[j][1], fmaf(s0, ga[j][1], acc[j][1]));
                acc[j][2] = fmaf(b1, xa[j][2], fmaf(s1, ga[j][2], acc[j][2]));
                acc[j][3] = fmaf(b1, xa[j][3], fmaf(s1, ga[j][3], acc[j][3]));
            }
        }
    }
    /* red[warp][tile j][row][column]; then each (token, row): warps in order, a warp's parts in order */
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        float *o = red[warp] + j * 128;
        o[g * 8 + 2 * t] = acc[j][0];
        o[g * 8 + 2 * t + 1] = acc[j][1];
        o[(g + 8) * 8 + 2 * t] = acc[j][2];
        o[(g + 8) * 8 + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < BT * 16; i += blockDim.x) {
        const int tl = i / 16, row = i % 16;
        const int64_t r = m * 16 + row, tok = tb0 + tl;
        if (r >= w.rows || tok >= T) continue;
        float sum = 0.0f;
        for (int q = 0; q < MM_S; q++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int n = tl * P + p;
                sum += red[q][(n / 8) * 128 + row * 8 + n % 8];
            }
        pk.y[tok * pk.ldy + r] = sum;
    }
}

/* ---- MLX 4- and 8-bit, up to 16 tokens, blocks that stay: k_qmvp ----
 * k_qmv's sums in k_qmv's order (the same bits), from k_mmvp's resident blocks: block b takes
 * tiles b, b + G, ...; each warp streams its groups of all its tiles (a group's GS steps of
 * values and its 16 rows' scales and biases) through a ring of D groups in shared memory,
 * filled by cp.async D - 1 groups ahead. A lane copies and reads its own values; four or
 * eight lanes copy a group's scales and biases for all (read after a warp barrier).
 * Shared memory: the ring [S][D][qmvp_slot bytes], then the partial sums [S][NTC * 128]. */
template <int BITS, int GS>
__host__ __device__ constexpr int qmvp_slot() { return GS * 32 * 2 * BITS + 128; } /* values; scales, biases: 64 bytes each at most */
template <int NTC, int BITS, int GS, int D>
__host__ __device__ constexpr size_t qmvp_smem() {
    return (size_t)MM_SPLITS * D * qmvp_slot<BITS, GS>() + (size_t)MM_SPLITS * NTC * 128 * 4;
}

template <int P, int NTC, int BITS, int GS, int D, int MINB>
__global__ void __launch_bounds__(32 * MM_SPLITS, MINB)
    k_qmvp(mm_group grp, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t T) {
    constexpr int BT = 8 * NTC / P, CB = 2 * BITS, SLOT = qmvp_slot<BITS, GS>(), VB = GS * 32 * CB;
    extern __shared__ uint4 smq[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned char *ring = (unsigned char *)smq + warp * D * SLOT;
    float(*red)[NTC * 128] = (float(*)[NTC * 128])((unsigned char *)smq + MM_SPLITS * D * SLOT);
    const int64_t nsteps = grp.w[0].cols / 32, ng = grp.w[0].cols / grp.w[0].group; /* one width, bits and group */
    const int dt = grp.w[0].sdtype, es = dt == 0 ? 4 : 2;
    const int64_t ni = warp < ng ? (ng - warp + MM_SPLITS - 1) / MM_SPLITS : 0; /* a tile's groups, this warp */
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring);
    /* the producer: group pi of tile pb, this warp's; into slot ps */
    int64_t pb = blockIdx.x, pi = 0;
    int ps = 0;
    mm_pick pq = {};
    auto p_open = [&]() {
        if (pb < nblk) pq = mm_select_at(grp, pb);
    };
    auto produce = [&]() {
        if (ni > 0 && pb < nblk) {
            const int64_t gj = warp + pi * MM_SPLITS, m = pq.blk;
            const uint8_t *src = (const uint8_t *)pq.w.data + (m * nsteps + gj * GS) * 32 * CB + lane * CB;
            const unsigned sa = ring_sa + (unsigned)(ps * SLOT + lane * CB);
#pragma unroll
            for (int u = 0; u < GS; u++) {
                if (CB == 16)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + u * 32 * CB), "l"(src + u * 32 * CB)
                                 : "memory");
                else
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(sa + u * 32 * CB), "l"(src + u * 32 * CB)
                                 : "memory");
            }
            const int nch = es; /* 16 rows of es bytes: es chunks of 16 */
            if (lane < 2 * nch) {
                const int which = lane / nch, ch = lane % nch;
                const uint8_t *ss = (const uint8_t *)(which ? pq.w.biases : pq.w.scales) + (m * ng + gj) * 16 * es + ch * 16;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ring_sa + (unsigned)(ps * SLOT + VB + which * 64 + ch * 16)),
                             "l"(ss)
                             : "memory");
            }
            if (++pi == ni) pi = 0, pb += gridDim.x, p_open();
        }
        cp_async_commit();
        ps = ps + 1 == D ? 0 : ps + 1;
    };
    p_open();
#pragma unroll
    for (int d = 0; d < D - 1; d++) produce();
    pdl_wait(); /* the activations are the predecessor's */
    const uint16_t *pbx[NTC]; /* this lane's column g of each token tile: its token's part */
    bool bin[NTC];
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        const int n = 8 * j + g;
        const int64_t tok = n / P;
        bin[j] = n / P < BT && tok < T;
        pbx[j] = xs + (int64_t)(n % P) * (T * ldxs) + (bin[j] ? tok : 0) * ldxs + 8 * t;
    }
    const uint32_t one2 = 0x3f803f80u; /* bf16 1.0, 1.0 */
    int cs = 0;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const mm_pick pk = mm_select_at(grp, b);
        const int64_t m = pk.blk;
        float acc[NTC][4];
#pragma unroll
        for (int j = 0; j < NTC; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        for (int64_t i = 0; i < ni; i++) {
            cp_async_wait<D - 2>(); /* this group is in (this lane's copies) */
            __syncwarp();           /* and the other lanes' (the scales) */
            const unsigned char *sl = ring + cs * SLOT;
            uint4 cur[GS];
#pragma unroll
            for (int u = 0; u < GS; u++) {
                if (CB == 16) cur[u] = *(const uint4 *)(sl + u * 32 * CB + lane * CB);
                else {
                    const uint2 v = *(const uint2 *)(sl + u * 32 * CB + lane * CB);
                    cur[u] = make_uint4(v.x, v.y, 0, 0);
                }
            }
            const float s0 = load_s(sl + VB, dt, g), s1 = load_s(sl + VB, dt, g + 8);
            const float b0 = load_s(sl + VB + 64, dt, g), b1 = load_s(sl + VB + 64, dt, g + 8);
            __syncwarp(); /* every lane has read the slot before it refills */
            cs = cs + 1 == D ? 0 : cs + 1;
            produce(); /* into the slot read the group before */
            const int64_t k0 = (warp + i * MM_SPLITS) * GS;
            float ga[NTC][4], xa[NTC][4];
#pragma unroll
            for (int j = 0; j < NTC; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) ga[j][e] = xa[j][e] = 0.0f;
#pragma unroll
            for (int u = 0; u < GS; u++) {
                uint32_t a[8];
                q_frag<BITS>(cur[u], a);
#pragma unroll
                for (int j = 0; j < NTC; j++) {
                    const uint4 bb = bin[j] ? *(const uint4 *)(pbx[j] + (k0 + u) * 32) : make_uint4(0, 0, 0, 0);
                    mma_bf16(ga[j], a[0], a[1], a[2], a[3], bb.x, bb.y);
                    mma_bf16(xa[j], one2, one2, one2, one2, bb.x, bb.y);
                    mma_bf16(ga[j], a[4], a[5], a[6], a[7], bb.z, bb.w);
                    mma_bf16(xa[j], one2, one2, one2, one2, bb.z, bb.w);
                }
            }
#pragma unroll
            for (int j = 0; j < NTC; j++) {
                acc[j][0] = fmaf(b0, xa[j][0], fmaf(s0, ga[j][0], acc[j][0]));
                acc[j][1] = fmaf(b0, xa[j][1], fmaf(s0, ga[j][1], acc[j][1]));
                acc[j][2] = fmaf(b1, xa[j][2], fmaf(s1, ga[j][2], acc[j][2]));
                acc[j][3] = fmaf(b1, xa[j][3], fmaf(s1, ga[j][3], acc[j][3]));
            }
        }
#pragma unroll
        for (int j = 0; j < NTC; j++) {
            float *o = red[warp] + j * 128;
            o[g * 8 + 2 * t] = acc[j][0];
            o[g * 8 + 2 * t + 1] = acc[j][1];
            o[(g + 8) * 8 + 2 * t] = acc[j][2];
            o[(g + 8) * 8 + 2 * t + 1] = acc[j][3];
        }
        __syncthreads();
        for (int q = threadIdx.x; q < BT * 16; q += blockDim.x) {
            const int tl = q / 16, row = q % 16;
            const int64_t r = m * 16 + row, tok = tl;
            if (r >= pk.w.rows || tok >= T) continue;
            float sum = 0.0f;
            for (int w = 0; w < MM_SPLITS; w++)
#pragma unroll
                for (int p = 0; p < P; p++) {
                    const int n = tl * P + p;
                    sum += red[w][(n / 8) * 128 + row * 8 + n % 8];
                }
            pk.y[tok * pk.ldy + r] = sum;
        }
        __syncthreads(); /* red is read before the next tile's sums go in */
    }
    cp_async_wait<0>();
}

/* ---- many tokens: k_gemm ----
 * The same sums as k_mmv's, in the same order, for a block tile of TILES row tiles by BN
 * tokens, the weights read once per tile of tokens instead of once per 16 tokens. k_mmv's
 * warp s sums steps s, s + S, ... (summation class s) and the S partial sums are added in
 * class order; here a block walks the steps class by class (0, S, 2S, ..., then 1, 1 + S,
 * ...), with the same MMAs on the same fragments, and at the end of each class adds its
 * partial sums into the running total (0 + p0 + p1 + ...): a token's result is the same bits
 * as k_mmv's, whatever the token count, the tile shape and the slice it lands in.
 *
 * 8 warps, WR (rows: MTW tiles each) by 8 / WR (tokens: NT token tiles of 8 each); a
 * pipeline of G::STAGES steps in shared memory filled by cp.async: a step is its tiles'
 * 1 KB of weights each (already in the lanes' load order: a lane reads its fragment as one
 * 16-byte word, without bank conflicts) and the split activations of the block's tokens,
 * 64 bytes a token and part. */
#define GEMM_WARPS 8


/* ---- up to 16 tokens, blocks that stay: k_mmvp ----
 * k_mmv's sums, the same MMAs on the same fragments in the same order (warp s: steps s,
 * s + S, ...; the warps' partial sums added in warp order), so the same bits; but a launch has
 * only as many blocks as stay resident (G), the tiles shared out evenly (block b: tiles b,
 * b + G, ...), and each warp streams its steps of all its tiles through a ring of D steps in
 * shared memory, filled by cp.async D - 1 steps ahead: the weights flow as a copy's do, and the
 * next tile's are in flight while a tile's sums are added. A lane copies, and later reads, only
 * its own fragment, so the ring needs no barrier. Shared memory: the ring [S][D][2][32] of 16
 * bytes, then the partial sums [S][NT * 128] floats (mmvp_smem). */
template <int NT, int D, int MT>
__host__ __device__ constexpr size_t mmvp_smem() {
    return (size_t)MM_SPLITS * D * MT * 1024 + (size_t)MM_SPLITS * MT * NT * 128 * 4;
}

/* MT: the tiles a block takes at once (their steps side by side in the ring; a warp's B
 * fragments serve them all) */
template <int P, int NT, int D, int MINB, int MT>
__global__ void __launch_bounds__(32 * MM_SPLITS, MINB)
    k_mmvp(mm_group grp, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t T) {
    extern __shared__ uint4 smv[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 *ring = smv + warp * D * MT * 64;
    float(*red)[MT * NT * 128] = (float(*)[MT * NT * 128])(smv + MM_SPLITS * D * MT * 64);
    const int64_t nsteps = tiled_steps(grp.w[0].cols), pstride = T * ldxs; /* one width a group */
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_SPLITS - 1) / MM_SPLITS : 0; /* a tile's steps, this warp */
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring) + lane * 16;
    /* the producer: step pi of block pb's tiles, this warp's; into slot ps */
    int64_t pb = blockIdx.x, pi = 0;
    int ps = 0, pn = 0; /* pn: the block's tiles inside its matrix */
    const uint16_t *pa = NULL;
    auto p_open = [&]() {
        if (pb < nblk) {
            const mm_pick q = mm_select_at(grp, pb);
            const int64_t left = tiled_tiles(q.w.rows) - q.blk * MT;
            pn = left < MT ? (int)left : MT;
            pa = (const uint16_t *)q.w.data + (q.blk * MT * nsteps + warp) * 512 + 8 * lane;
        }
    };
    auto produce = [&]() {
        if (ni > 0 && pb < nblk) {
            const uint16_t *src = pa + pi * (MM_SPLITS * 512);
            const unsigned sa = ring_sa + (unsigned)ps * MT * 1024;
#pragma unroll
            for (int m = 0; m < MT; m++)
                if (m < pn) { /* past the matrix's last tile: rows never written */
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + m * 1024), "l"(src + m * nsteps * 512)
                                 : "memory");
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + m * 1024 + 512),
                                 "l"(src + m * nsteps * 512 + 256)
                                 : "memory");
                }
            if (++pi == ni) pi = 0, pb += gridDim.x, p_open();
        }
        cp_async_commit();
        ps = ps + 1 == D ? 0 : ps + 1;
    };
    p_open();
#pragma unroll
    for (int d = 0; d < D - 1; d++) produce();
    pdl_wait(); /* the activations are the predecessor's */
    const uint16_t *px = xs + 8 * t + warp * 32;
    /* the activations of this warp's next step, loaded a step ahead (every tile has the same
     * columns: after a tile's last step comes step 0 again) */
    uint4 bn[NT][P];
    auto load_x = [&](int64_t i) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int64_t n = 8 * j + g;
#pragma unroll
            for (int p = 0; p < P; p++)
                bn[j][p] = n < T ? *(const uint4 *)(px + i * (MM_SPLITS * 32) + p * pstride + n * ldxs) : make_uint4(0, 0, 0, 0);
        }
    };
    if (ni > 0) load_x(0);
    int cs = 0;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const mm_pick pk = mm_select_at(grp, b);
        float acc[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
        for (int64_t i = 0; i < ni; i++) {
            cp_async_wait<D - 2>(); /* this step is in */
            uint4 a[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++) a[m][0] = ring[(cs * MT + m) * 64 + lane], a[m][1] = ring[(cs * MT + m) * 64 + 32 + lane];
            cs = cs + 1 == D ? 0 : cs + 1;
            produce(); /* into the slot read the step before */
            uint4 bx[NT][P];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int p = 0; p < P; p++) bx[j][p] = bn[j][p];
            load_x(i + 1 < ni ? i + 1 : 0);
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++) mma_step<P>(acc[m][j], a[m][0], a[m][1], bx[j]);
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float *o = red[warp] + (m * NT + j) * 128;
                o[g * 8 + 2 * t] = acc[m][j][0];
                o[g * 8 + 2 * t + 1] = acc[m][j][1];
                o[(g + 8) * 8 + 2 * t] = acc[m][j][2];
                o[(g + 8) * 8 + 2 * t + 1] = acc[m][j][3];
            }
        __syncthreads();
        for (int q = threadIdx.x; q < MT * NT * 128; q += blockDim.x) {
            const int m = q / (NT * 128), j = (q / 128) % NT, row = (q % 128) / 8, col = q % 8;
            const int64_t r = (pk.blk * MT + m) * 16 + row, n = 8 * j + col;
            float sum = 0.0f;
            for (int s = 0; s < MM_SPLITS; s++) sum += red[s][q];
            if (r < pk.w.rows && n < T) pk.y[n * pk.ldy + r] = sum;
        }
        __syncthreads(); /* red is read before the next tile's sums go in */
    }
    cp_async_wait<0>();
}

template <int MTW, int NT, int WR, int P>
struct gemm_shape {
    static constexpr int WC = GEMM_WARPS / WR, TILES = MTW * WR, BN = 8 * NT * WC;
    static constexpr int A_U4 = TILES * 64;  /* a step's weights: its tiles' 64 16-byte words */
    static constexpr int B_U4 = P * BN * 4;  /* its activations: [P][BN][4 words] */
    static constexpr int STAGE_U4 = A_U4 + B_U4;
    /* steps in flight: the loads' latency (about 2 us under load, measured: 4 stages left a
     * T = 64 product at a quarter of the bandwidth) over the little work of a step */
    static constexpr int STAGES = STAGE_U4 * 16 * 8 <= 128 * 1024 ? 8 : 192 * 1024 / (STAGE_U4 * 16);
    static_assert(STAGES >= 4, "steps go in pairs");
    static constexpr size_t SMEM = (size_t)STAGES * STAGE_U4 * 16;
    /* blocks an SM: two where the accumulators leave the registers for it (one block of 8
     * warps leaves the schedulers idle half the time: Nsight Compute, 64 tokens) */
    static constexpr int MINB = MTW * NT * P <= 8 && 2 * (SMEM + 1024) <= 227 * 1024 ? 2 : 1;
};

template <int MTW, int NT, int WR, int P>
__global__ void __launch_bounds__(32 * GEMM_WARPS, gemm_shape<MTW, NT, WR, P>::MINB)
    k_gemm(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    typedef gemm_shape<MTW, NT, WR, P> G;
    extern __shared__ uint4 sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp % WR, wn = warp / WR;
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int64_t nsteps = tiled_steps(w.cols), ntiles = tiled_tiles(w.rows), m0 = pk.blk * G::TILES;
    const int64_t n0 = (int64_t)blockIdx.y * G::BN, pstride = T * ldxs;
    const int64_t q8 = nsteps / MM_SPLITS, r8 = nsteps % MM_SPLITS; /* class c has q8 + (c < r8) steps */
    /* split (gridDim.z > 1): this block's classes c_lo .. c_hi - 1, their partial sums to grp.part */
    const int kz = (int)gridDim.z, c_lo = (int)blockIdx.z * MM_SPLITS / kz, c_hi = ((int)blockIdx.z + 1) * MM_SPLITS / kz;
    int nb = 0; /* its steps (a matrix has fewer than 2^31) */
    for (int c = c_lo; c < c_hi; c++) nb += (int)(q8 + (c < r8));
    const uint16_t *wd = (const uint16_t *)w.data;
    /* this thread's copies of a step, fixed but for the step's column offset */
    constexpr int NA = G::A_U4 / (32 * GEMM_WARPS), NB = (G::B_U4 + 32 * GEMM_WARPS - 1) / (32 * GEMM_WARPS);
    static_assert(G::A_U4 % (32 * GEMM_WARPS) == 0, "whole rounds of weight copies");
    /* the activations' last round may be partial (fewer than 16 tokens a part): b_cp */
    /* each copy's source at step 0 and its advance a step (0 for a copy past the matrix or
     * the tokens: it reads nothing, src-size 0), fixed, so that a step's copies are a multiply
     * and an add each */
    const uint16_t *a_src[NA], *b_src[NB];
    int a_mul[NA], b_mul[NB], a_sz[NA], b_sz[NB];
    bool b_cp[NB];
#pragma unroll
    for (int c = 0; c < NA; c++) {
        const int q = tid + c * 32 * GEMM_WARPS;
        const int64_t m = m0 + q / 64;
        const bool in = m < ntiles;
        a_src[c] = in ? wd + (m * nsteps) * 512 + (q % 64) * 8 : wd;
        a_mul[c] = in ? 512 : 0, a_sz[c] = in ? 16 : 0;
    }
#pragma unroll
    for (int c = 0; c < NB; c++) {
        const int q = tid + c * 32 * GEMM_WARPS;
        const int pp = q / (G::BN * 4), n = (q / 4) % G::BN, c4 = q % 4;
        const int64_t tok = n0 + n;
        b_cp[c] = q < G::B_U4;
        const bool in = b_cp[c] && tok < T;
        b_src[c] = in ? xs + pp * pstride + tok * ldxs + c4 * 8 : xs;
        b_mul[c] = in ? 32 : 0, b_sz[c] = in ? 16 : 0;
    }
    const unsigned sm_u32 = (unsigned)__cvta_generic_to_shared(sm);
    pdl_wait();
    int ic = c_lo, ik = 0, ks_i = c_lo; /* the next step to fetch: class ic, its ik-th, step ks_i */
    int st_i = 0;                       /* and its stage */
    const int q8i = (int)q8, r8i = (int)r8;
    auto issue = [&]() {
        const unsigned sa = sm_u32 + (unsigned)(st_i * G::STAGE_U4 + tid) * 16;
#pragma unroll
        for (int c = 0; c < NA; c++)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa + c * 32 * GEMM_WARPS * 16),
                         "l"(a_src[c] + ks_i * a_mul[c]), "r"(a_sz[c]));
#pragma unroll
        for (int c = 0; c < NB; c++)
            if (b_cp[c])
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa + (G::A_U4 + c * 32 * GEMM_WARPS) * 16),
                             "l"(b_src[c] + ks_i * b_mul[c]), "r"(b_sz[c]));
        st_i = st_i + 1 == G::STAGES ? 0 : st_i + 1;
        if (++ik == q8i + (ic < r8i)) ic++, ik = 0, ks_i = ic;
        else ks_i += MM_SPLITS;
    };
    float acc[MTW][NT][4], sum[MTW][NT][4];
#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = sum[m][j][e] = 0.0f;
    /* steps go in pairs: one wait and one barrier for two steps */
#pragma unroll
    for (int i = 0; i < G::STAGES - 2; i++) {
        if (i < nb) issue();
        cp_async_commit();
    }
    int cc = c_lo, ck = 0; /* the step being summed: class cc, its ck-th */
    int st_c = 0;              /* and its stage */
    for (int i0 = 0; i0 < nb; i0 += 2) {
        cp_async_wait<G::STAGES - 4>();
        __syncthreads(); /* steps i0, i0 + 1 are in; every warp is done with the two before, whose stages refill */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (i0 + G::STAGES - 2 + u < nb) issue();
            cp_async_commit();
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (i0 + u >= nb) break;
            const uint4 *sa = sm + st_c * G::STAGE_U4, *sb = sa + G::A_U4;
            st_c = st_c + 1 == G::STAGES ? 0 : st_c + 1;
            uint4 b[NT][P];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int p = 0; p < P; p++) b[j][p] = sb[(p * G::BN + wn * 8 * NT + 8 * j + g) * 4 + t];
            uint4 a[MTW][2];
#pragma unroll
            for (int m = 0; m < MTW; m++) a[m][0] = sa[(wm * MTW + m) * 64 + lane], a[m][1] = sa[(wm * MTW + m) * 64 + 32 + lane];
            /* mma_step's order for every accumulator (first half: parts in order, then the second),
             * the accumulators interleaved so that no MMA waits on the one before it */
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int p = 0; p < P; p++)
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            const uint4 &a0 = a[m][0], &a1 = a[m][1], &bb = b[j][p];
                            if (hf == 0) mma_bf16(acc[m][j], a0.x, a1.x, a0.y, a1.y, bb.x, bb.y);
                            else mma_bf16(acc[m][j], a0.z, a1.z, a0.w, a1.w, bb.z, bb.w);
                        }
            if (++ck == q8i + (cc < r8i)) { /* the class is summed: into the total, in class order */
                if (kz > 1) {                 /* or its partial sums out, for k_gemm_sum */
                    float *pp = grp.part + (int64_t)MM_SPLITS * T * grp.prow[pk.i] + cc * T * w.rows;
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int64_t r = (m0 + wm * MTW + m) * 16 + g + (e >= 2 ? 8 : 0);
                                const int64_t n = n0 + wn * 8 * NT + 8 * j + 2 * t + (e & 1);
                                if (r < w.rows && n < T) pp[n * w.rows + r] = acc[m][j][e];
                                acc[m][j][e] = 0.0f;
                            }
                } else {
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++) sum[m][j][e] += acc[m][j][e], acc[m][j][e] = 0.0f;
                }
                cc++, ck = 0;
            }
        }
    }
    cp_async_wait<0>();
    if (kz > 1) return;
    const bool empty = nsteps < MM_SPLITS; /* k_mmv adds its idle warps' zeros too (-0 + 0 = +0) */
#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t r = (m0 + wm * MTW + m) * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t n = n0 + wn * 8 * NT + 8 * j + 2 * t + (e & 1);
                if (r < w.rows && n < T) pk.y[n * pk.ldy + r] = empty ? sum[m][j][e] + 0.0f : sum[m][j][e];
            }
}

/* k_gemm split: y = 0 + p_0 + p_1 + ... + p_{S-1}, the classes' partial sums in class order (k_gemm's
 * and k_mmv's order, so the same bits); a thread per (matrix row over the group, token) */
__global__ void k_gemm_sum(mm_group g, int64_t T, int64_t rows_all) {
    pdl_wait();
    const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= rows_all * T) return;
    const int64_t n = q / rows_all;
    int64_t r = q % rows_all;
    int i = 0;
    while (i + 1 < g.n && r >= g.prow[i + 1]) i++;
    r -= g.prow[i];
    const int64_t rows = g.w[i].rows;
    const float *pp = g.part + (int64_t)MM_SPLITS * T * g.prow[i] + n * rows + r;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < MM_SPLITS; c++) sum += pp[c * T * rows];
    g.y[i][n * g.ldy[i] + r] = sum;
}

/* the group's block offsets for MT tiles a block; its blocks in all */
static int64_t group_blocks(mm_group *g, int MT) {
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        g->blk0[i] = at;
        at += (tiled_tiles(g->w[i].rows) + MT - 1) / MT;
    }
    return at;
}

template <int MT, int NT, int S>
static void launch_mma_p(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts) {
    dim3 grid((unsigned)group_blocks(&g, MT), (unsigned)((T + 8 * NT - 1) / (8 * NT)));
    constexpr int U = MT == 1 ? 4 : 2;
    if (parts == 1) k_mma<MT, NT, 1, U, S><<<grid, 32 * S, 0, s>>>(g, x, ldx, T);
    else k_mma<MT, NT, 3, U, S><<<grid, 32 * S, 0, s>>>(g, x, ldx, T);
}

template <int S>
static void launch_mmv_s(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    dim3 grid((unsigned)group_blocks(&g, 1), 1);
    constexpr int M1 = 256 * 4 / (32 * S), M2 = 256 * 3 / (32 * S) > 0 ? 256 * 3 / (32 * S) : 1;
    if (T <= 8) {
        if (parts == 1) launch_pdl(k_mmv<1, 1, 2, M1, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
        else launch_pdl(k_mmv<3, 1, 2, M1, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
    } else {
        if (parts == 1) launch_pdl(k_mmv<1, 2, 2, M2, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
        else launch_pdl(k_mmv<3, 2, 2, M2, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
    }
}

static void launch_tiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                         const cu_mm_scratch *sc, int xs_ready);

/* k_mmvp's grid: as many blocks as stay resident (MINB an SM), fewer where the tiles then
 * share out more evenly (every block takes ceil(tiles / slots) of them, but the last) */
static unsigned mmvp_grid(int64_t nblk, int minb) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int64_t slots = (int64_t)(sms > 0 ? sms : 1) * minb, per = (nblk + slots - 1) / slots;
    return (unsigned)((nblk + per - 1) / per);
}

template <int P, int NT, int D, int MINB, int MT = 1>
static void launch_mmvp_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T) {
    const int64_t nblk = group_blocks(&g, MT);
    launch_pdl(k_mmvp<P, NT, D, MINB, MT>, dim3(mmvp_grid(nblk, MINB)), dim3(32 * MM_SPLITS), mmvp_smem<NT, D, MT>(), s, g,
               nblk, xs, ldxs, T);
}

template <int P, int NT, int D, int MINB, int MT = 1>
static void mmvp_attr() {
    static_assert(mmvp_smem<NT, D, MT>() * MINB + 1024 * MINB <= 227 * 1024, "MINB blocks fit an SM");
    cudaFuncSetAttribute(k_mmvp<P, NT, D, MINB, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)mmvp_smem<NT, D, MT>());
}

/* the ring depths and residency the backend takes (bench/cuda/mmv_bench.cu compares others) */
#define MMVP_D1 4
#define MMVP_B1 4
/* up to 8 tokens */
static void launch_mmvp(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    if (parts == 1) launch_mmvp_p<1, 1, MMVP_D1, MMVP_B1>(s, g, xs, ldxs, T);
    else launch_mmvp_p<3, 1, MMVP_D1, MMVP_B1>(s, g, xs, ldxs, T);
}

/* xs[p][n][c] = part p of x[n][c], n < T, c < ldxs (zeros past cols) */
static void launch_split(cu_stream s, const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs,
                         int parts) {
    const unsigned sb = (unsigned)((T * ldxs + 255) / 256);
    if (parts == 1) launch_pdl(k_split<1>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs);
    else launch_pdl(k_split<3>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs);
}

/* kz > 1: split over the summation classes (kz of 2, 4 or 8; the matrices at least MM_SPLITS
 * steps wide, part holding MM_SPLITS * T * their rows floats), then k_gemm_sum */
template <int MTW, int NT, int WR, int P>
static void launch_gemm_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T, int kz = 1,
                          float *part = NULL) {
    typedef gemm_shape<MTW, NT, WR, P> G;
    int64_t rows_all = 0;
    for (int i = 0; i < g.n; i++) g.prow[i] = rows_all, rows_all += g.w[i].rows;
    g.part = part;
    dim3 grid((unsigned)group_blocks(&g, G::TILES), (unsigned)((T + G::BN - 1) / G::BN), (unsigned)kz);
    launch_pdl(k_gemm<MTW, NT, WR, P>, grid, dim3(32 * GEMM_WARPS), G::SMEM, s, g, xs, ldxs, T);
    if (kz > 1) launch_pdl(k_gemm_sum, dim3((unsigned)((rows_all * T + 255) / 256)), dim3(256), 0, s, g, T, rows_all);
}

/* the tile shapes (measured with `mmv_bench sweep` on the 27B shapes): 128 rows by 128 tokens;
 * or, for up to 64 tokens (128 in exact mode), 128 rows by 64 tokens where there are at least
 * 100 such row tiles (14-38% faster than 64 by 64 there), else 64 by 64 */
template <int P>
static void launch_gemm_shape(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T,
                              const cu_mm_scratch *sc) {
    mm_group c = g;
    const int64_t tiles128 = group_blocks(&c, 8), big = tiles128 * ((T + 127) / 128);
    int64_t rows_all = 0;
    for (int i = 0; i < g.n; i++) rows_all += g.w[i].rows;
    /* a split over the classes where the scratch holds the partial sums */
    const bool can_split = T <= 64 && tiled_steps(g.w[0].cols) >= MM_SPLITS && sc->part &&
                           (int64_t)MM_SPLITS * T * rows_all <= sc->part_elems;
    float *part = sc->part;
    /* up to 32 tokens (`mmv_bench sweep` on the H200, 27B shapes): in exact, 128 rows by 16
     * tokens split 8 ways (1.2-1.3x k_mmv at 16 tokens, 1.4-1.9x the 64-token tile at 32);
     * with bf16 activations, 128 rows by 32 tokens (1.3-2x at 32 tokens), split 8 ways where
     * the row tiles are few */
    if constexpr (P == 3) {
        if (T <= 32 && can_split) {
            launch_gemm_p<1, 2, 8, P>(s, g, xs, ldxs, T, MM_SPLITS, part);
            return;
        }
    } else {
        if (T <= 32) {
            if (tiles128 < 100 && can_split) launch_gemm_p<1, 4, 8, P>(s, g, xs, ldxs, T, MM_SPLITS, part);
            else launch_gemm_p<1, 4, 8, P>(s, g, xs, ldxs, T);
            return;
        }
    }
    /* too few row tiles to fill the device at up to 64 tokens: split, so that there are at
     * least 2 blocks an SM (132 SMs) */
    int kz = 1;
    while (kz < MM_SPLITS && tiles128 * kz < 2 * 132) kz *= 2;
    if (tiles128 < 100 && kz > 1 && can_split) {
        launch_gemm_p<1, 8, 8, P>(s, g, xs, ldxs, T, kz, part);
        return;
    }
    if (T <= (P == 3 ? 128 : 64) && tiles128 >= 100) launch_gemm_p<1, 8, 8, P>(s, g, xs, ldxs, T);
    else if (T >= 128 && big >= 2 * 132) launch_gemm_p<4, 4, 2, P>(s, g, xs, ldxs, T);
    else launch_gemm_p<1, 4, 4, P>(s, g, xs, ldxs, T);
}

/* more than 16 tokens, in slices of at most sc->xs_tokens: split, then k_gemm */
static void launch_gemm(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T, int parts,
                        const cu_mm_scratch *sc) {
    const int64_t ldxs = tiled_steps(g.w[0].cols) * 32;
    int64_t slice = sc->xs_tokens;
    while (slice > 16 && 3 * slice * ldxs >= ((int64_t)1 << 31)) slice /= 2; /* k_gemm's 32-bit offsets */
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        launch_split(s, x + t0 * ldx, ldx, n, g.w[0].cols, sc->xs, ldxs, parts);
        if (parts == 1) launch_gemm_shape<1>(s, gs, sc->xs, ldxs, n, sc);
        else launch_gemm_shape<3>(s, gs, sc->xs, ldxs, n, sc);
    }
}

template <int MTW, int NT, int WR, int P>
static void gemm_attr() {
    cudaFuncSetAttribute(k_gemm<MTW, NT, WR, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)gemm_shape<MTW, NT, WR, P>::SMEM);
}

static void qmvp_init();
extern "C" void cu_mm_init(void) {
    qmvp_init();
    mmvp_attr<1, 1, MMVP_D1, MMVP_B1>();
    mmvp_attr<3, 1, MMVP_D1, MMVP_B1>();
    gemm_attr<1, 8, 8, 1>();
    gemm_attr<1, 8, 8, 3>();
    gemm_attr<4, 4, 2, 1>();
    gemm_attr<4, 4, 2, 3>();
    gemm_attr<1, 4, 4, 1>();
    gemm_attr<1, 4, 4, 3>();
    gemm_attr<1, 2, 8, 3>();
    gemm_attr<1, 4, 8, 1>();
}

static void launch_tiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                         const cu_mm_scratch *sc, int xs_ready) {
    if (sc && T > 16) {
        launch_gemm(s, g, x, ldx, T, parts, sc);
        return;
    }
    if (sc) {
        const int64_t ldxs = tiled_steps(g.w[0].cols) * 32;
        if (!xs_ready) launch_split(s, x, ldx, T, g.w[0].cols, sc->xs, ldxs, parts);
        /* k_mmvp where it measured faster (`mmv_bench` on the H200, one 27B token's matrices:
         * 15.8 against 16.6 ms in exact at 1 token, 14.0 against 15.8 ms in bf16; 15.5 against
         * 16.2 at 8 tokens in bf16); beyond, its ring's shared memory leaves too little L1 for
         * the activations (3 parts of them in exact), and k_mmv wins */
        if (T <= (parts == 1 ? 8 : 2)) launch_mmvp(s, g, sc->xs, ldxs, T, parts);
        else if (parts == 3 && T > 8) launch_gemm_shape<3>(s, g, sc->xs, ldxs, T, sc); /* split 8 ways: see there */
        else launch_mmv_s<MM_SPLITS>(s, g, sc->xs, ldxs, T, parts);
        return;
    }
    if (T <= 8) launch_mma_p<1, 1, MM_SPLITS>(s, g, x, ldx, T, parts);
    else if (T <= 16) launch_mma_p<1, 2, MM_SPLITS>(s, g, x, ldx, T, parts);
    else if (T <= 32) launch_mma_p<1, 4, MM_SPLITS>(s, g, x, ldx, T, parts);
    else launch_mma_p<2, 8, MM_SPLITS>(s, g, x, ldx, T, parts);
}

template <int P, int NTC, int BITS>
static void launch_qmv_b(cu_stream s, const mm_group &g, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t n) {
    const dim3 grid((unsigned)nblk, (unsigned)((n + 8 * NTC / P - 1) / (8 * NTC / P)));
    const dim3 blk(32 * MM_SPLITS);
    /* two groups in flight a warp (more spill registers) */
    switch (g.w[0].group / 32) {
    case 1: launch_pdl(k_qmv<P, NTC, BITS, 1, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    case 2: launch_pdl(k_qmv<P, NTC, BITS, 2, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    default: launch_pdl(k_qmv<P, NTC, BITS, 4, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    }
}

/* k_qmvp: ring depth and residency by group width (the steps in flight a warp about 8) */
/* blocks an SM: 3 (2 where 3 token tiles or more want the registers) */
template <int NTC>
static constexpr int qmvp_minb() { return NTC <= 2 ? 3 : 2; }
template <int P, int NTC, int BITS, int GS>
static constexpr int qmvp_depth() {
    /* about 8 steps in flight a warp (4 at least), as deep as qmvp_minb blocks an SM allow */
    constexpr int want = GS == 1 ? 10 : GS == 2 ? 5 : 3;
    constexpr int fit = (int)((227 * 1024 / qmvp_minb<NTC>() - 1024 - MM_SPLITS * NTC * 128 * 4) / (MM_SPLITS * qmvp_slot<BITS, GS>()));
    return want < fit ? want : fit;
}
template <int P, int NTC, int BITS, int GS>
static void qmvp_attr() {
    constexpr int D = qmvp_depth<P, NTC, BITS, GS>();
    static_assert((qmvp_smem<NTC, BITS, GS, D>() + 1024) * qmvp_minb<NTC>() <= 227 * 1024, "the blocks fit an SM");
    cudaFuncSetAttribute(k_qmvp<P, NTC, BITS, GS, D, qmvp_minb<NTC>()>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)qmvp_smem<NTC, BITS, GS, D>());
}
template <int P, int NTC, int BITS>
static void qmvp_attr_b() {
    qmvp_attr<P, NTC, BITS, 1>();
    qmvp_attr<P, NTC, BITS, 2>();
    qmvp_attr<P, NTC, BITS, 4>();
}
static void qmvp_init() {
    qmvp_attr_b<1, 1, 8>(), qmvp_attr_b<1, 2, 8>(), qmvp_attr_b<3, 1, 8>(), qmvp_attr_b<3, 3, 8>(), qmvp_attr_b<3, 6, 8>();
    qmvp_attr_b<1, 1, 4>(), qmvp_attr_b<1, 2, 4>(), qmvp_attr_b<3, 1, 4>(), qmvp_attr_b<3, 3, 4>(), qmvp_attr_b<3, 6, 4>();
}

template <int P, int NTC, int BITS, int GS>
static void launch_qmvp_g(cu_stream s, const mm_group &g, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t n) {
    constexpr int D = qmvp_depth<P, NTC, BITS, GS>();
    launch_pdl(k_qmvp<P, NTC, BITS, GS, D, qmvp_minb<NTC>()>, dim3(mmvp_grid(nblk, qmvp_minb<NTC>())), dim3(32 * MM_SPLITS),
               qmvp_smem<NTC, BITS, GS, D>(), s, g, nblk, xs, ldxs, n);
}

/* whether k_qmvp takes the group: its cp.async copies need 16-byte aligned values, scales and biases */
static bool qmvp_fits(const mm_group &g, int64_t n, int P, int NTC) {
    if (n > 8 * NTC / P) return false;
    for (int i = 0; i < g.n; i++)
        if (((uintptr_t)g.w[i].data | (uintptr_t)g.w[i].scales | (uintptr_t)g.w[i].biases) & 15) return false;
    return true;
}

template <int P, int NTC>
static void launch_qmv_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t n) {
    const int64_t nblk = group_blocks(&g, 1);
    if (qmvp_fits(g, n, P, NTC)) {
        const int bits = g.w[0].bits, gs = g.w[0].group / 32;
        if (bits == 8) {
            if (gs == 1) launch_qmvp_g<P, NTC, 8, 1>(s, g, nblk, xs, ldxs, n);
            else if (gs == 2) launch_qmvp_g<P, NTC, 8, 2>(s, g, nblk, xs, ldxs, n);
            else launch_qmvp_g<P, NTC, 8, 4>(s, g, nblk, xs, ldxs, n);
        } else {
            if (gs == 1) launch_qmvp_g<P, NTC, 4, 1>(s, g, nblk, xs, ldxs, n);
            else if (gs == 2) launch_qmvp_g<P, NTC, 4, 2>(s, g, nblk, xs, ldxs, n);
            else launch_qmvp_g<P, NTC, 4, 4>(s, g, nblk, xs, ldxs, n);
        }
        return;
    }
    if (g.w[0].bits == 8) launch_qmv_b<P, NTC, 8>(s, g, nblk, xs, ldxs, n);
    else launch_qmv_b<P, NTC, 4>(s, g, nblk, xs, ldxs, n);
}

/* MLX tiled matrices (one width, bits and group): split (unless xs holds x already), then
 * k_qmv, in slices of the scratch's tokens */
static void launch_qtiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                          const cu_mm_scratch *sc, int xs_ready) {
    const int64_t cols = g.w[0].cols, ldxs = tiled_steps(cols) * 32, slice = T <= 16 ? T : sc->xs_tokens;
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        if (!(xs_ready && T <= 16)) launch_split(s, x + t0 * ldx, ldx, n, cols, sc->xs, ldxs, parts);
        if (parts == 1) {
            if (n <= 8) launch_qmv_p<1, 1>(s, gs, sc->xs, ldxs, n);
            else launch_qmv_p<1, 2>(s, gs, sc->xs, ldxs, n);
        } else {
            if (n <= 2) launch_qmv_p<3, 1>(s, gs, sc->xs, ldxs, n);
            else if (n <= 8) launch_qmv_p<3, 3>(s, gs, sc->xs, ldxs, n);
            else launch_qmv_p<3, 6>(s, gs, sc->xs, ldxs, n);
        }
    }
}

extern "C" int cu_q_tileable(int bits, int group, int64_t cols) {
    return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128) && cols % group == 0;
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

extern "C" void cu_matmul_group(cu_stream s, int n, const cu_mat *const *w, float *const *y, const int64_t *ldy,
                                const float *x, int64_t ldx, int64_t T, int mode, const cu_mm_scratch *sc,
                                int xs_ready) {
    if (T <= 0) return;
    const int parts = mode == CU_MM_BF16 ? 1 : 3;
    mm_group g;
    g.n = 0;
    auto flush = [&]() {
        if (g.n == 0) return;
        if (g.w[0].fmt == CU_FMT_Q_TILED) launch_qtiled(s, g, x, ldx, T, parts, sc, xs_ready);
        else launch_tiled(s, g, x, ldx, T, parts, sc, xs_ready);
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
}

extern "C" void cu_matmul(cu_stream s, const cu_mat *w, const float *x, int64_t ldx, int64_t T, float *y,
                          int64_t ldy, int mode, const cu_mm_scratch *sc) {
    cu_matmul_group(s, 1, &w, &y, &ldy, x, ldx, T, mode, sc, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Gated DeltaNet */

/* causal depthwise conv + SiLU: a thread per (item, channel), the item's tokens in order
 * (K = 4, Qwen3.5's width: the window in registers, the inputs of 8 tokens loaded at once) */
#define CONV_THREADS 64
#define CONV_U 8
__global__ void __launch_bounds__(CONV_THREADS) k_gdn_conv(cu_plan p, cu_gdn_args a) {
    pdl_wait();
    const int it = blockIdx.x;
    const int64_t ch = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= a.cd) return;
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0;
    float *st = a.conv_state + (size_t)p.slot[it] * a.conv_stride;
    const int K = a.K;
    if (K == 4) {
        float sv[3], tap[4];
#pragma unroll
        for (int j = 0; j < 3; j++) sv[j] = st[j * a.cd + ch];
#pragma unroll
        for (int j = 0; j < 4; j++) tap[j] = a.conv_t[j * a.cd + ch];
        float *col = a.qkv + t0 * a.cd + ch;
        for (int64_t i = 0; i < n; i += CONV_U) {
            const int c = n - i < CONV_U ? (int)(n - i) : CONV_U;
            float mv[CONV_U];
#pragma unroll
            for (int u = 0; u < CONV_U; u++) mv[u] = u < c ? col[(i + u) * a.cd] : 0.0f;
#pragma unroll
            for (int u = 0; u < CONV_U; u++) {
                if (u >= c) break;
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < 3; j++) acc += tap[j] * sv[j];
                acc += tap[3] * mv[u];
                sv[0] = sv[1], sv[1] = sv[2], sv[2] = mv[u];
                col[(i + u) * a.cd] = acc / (1.0f + expf(-acc));
            }
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

/* the L2 norms of every token's q and k heads, in place (q also by 1 / sqrt(Dk)): a warp per
 * (token, key head); columns lane, lane + 32, ... then a butterfly */
__global__ void k_gdn_qknorm(cu_gdn_args a) {
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int g = blockIdx.y, lane = threadIdx.x;
    for (int which = 0; which < 2; which++) {
        float *v = a.qkv + t * a.cd + (which ? a.kd : 0) + (int64_t)g * a.Dk;
        float ss = 0.0f;
        for (int j = lane; j < a.Dk; j += 32) ss += v[j] * v[j];
        ss = warp_sum(ss);
        const float r = (which ? 1.0f : 1.0f / sqrtf((float)a.Dk)) / sqrtf(ss + 1e-6f);
        for (int j = lane; j < a.Dk; j += 32) v[j] *= r;
    }
}

/* The delta rule, per step, on the normed q and k: a block per (item, value head, 32 state
 * columns), a warp per 8 columns (the columns of a head are independent: each has its own
 * error and output). Lane 4a + b holds columns 2b, 2b + 1 of the warp's 8 for the key rows
 * a*RP .. a*RP + RP - 1, in registers over the item's steps (RP = Dk / 8 rounded up). A
 * column's dot products (the error k.S, the output q.S) are summed over the lane's rows in
 * order (even and odd rows apart, then added), then over a by a butterfly (lanes 4, 8, 16
 * apart): an order fixed by the shape alone. The device keeps each head's state as
 * [Dk][Dv]; four lanes read a row's 8 columns as one 32-byte run. The steps' inputs (q, k,
 * the block's v columns, b, a) come through shared memory in chunks of GDN_CHUNK tokens,
 * the next chunk copied (cp.async) while this one's steps run; each token's beta and decay
 * are made there by one thread, before the chunk's steps. */
#define GDN_WARPS 4
#define GDN_CHUNK 16
/* floats a token's inputs take in shared memory: q [Dk], k [Dk], v [32], b, a, padding to 4 */
__host__ __device__ __forceinline__ int gdn_token_floats(int Dk) { return 2 * Dk + 8 * GDN_WARPS + 4; }

__device__ __forceinline__ void cp_async_4(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(gmem));
}

template <int RP>
__global__ void __launch_bounds__(32 * GDN_WARPS) k_gdn_recur(cu_plan p, cu_gdn_args a) {
    pdl_wait();
    extern __shared__ float4 gsh4[];
    float *gsh = (float *)gsh4; /* [2][GDN_CHUNK][gdn_token_floats(Dk)] */
    const int it = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int ra = lane >> 2, Dk = a.Dk, Dv = a.Dv, g = h / (a.Hv / a.Hk), r0 = ra * RP, TS = gdn_token_floats(Dk);
    const int c0 = blockIdx.z * 8 * GDN_WARPS;           /* the block's first column */
    const int i0 = c0 + w * 8 + 2 * (lane & 3);          /* this lane's columns i0, i0 + 1 */
    const bool on = i0 < Dv;                             /* Dv is a multiple of 4 */
    float *Sg = a.rec_state + (size_t)p.slot[it] * a.rec_stride + (size_t)h * Dv * Dk;
    float S0[RP], S1[RP];
#pragma unroll
    for (int m = 0; m < RP; m++) {
        float2 v = make_float2(0.0f, 0.0f);
        if (on && r0 + m < Dk) v = *(const float2 *)(Sg + (size_t)(r0 + m) * Dv + i0);
        S0[m] = v.x, S1[m] = v.y;
    }
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0, nch = (n + GDN_CHUNK - 1) / GDN_CHUNK;
    const float dtb = a.dt_bias[h], nea = a.neg_exp_a[h];
    /* chunk c's inputs into buffer c & 1: q and k as 16-byte pieces, v likewise, b and a as words */
    auto issue = [&](int64_t c) {
        float *buf = gsh + (c & 1) * GDN_CHUNK * TS;
        const int64_t tc = t0 + c * GDN_CHUNK;
        const int nu = n - c * GDN_CHUNK < GDN_CHUNK ? (int)(n - c * GDN_CHUNK) : GDN_CHUNK;
        const int qk4 = 2 * Dk / 4;
        for (int i = tid; i < nu * qk4; i += 32 * GDN_WARPS) {
            const int u = i / qk4, f = i % qk4, which = f >= Dk / 4, e = (f % (Dk / 4)) * 4;
            cp_async16(buf + u * TS + which * Dk + e, a.qkv + (tc + u) * a.cd + (which ? a.kd : 0) + (int64_t)g * Dk + e, 16);
        }
        for (int i = tid; i < nu * 2 * GDN_WARPS; i += 32 * GDN_WARPS) {
            const int u = i / (2 * GDN_WARPS), col = c0 + (i % (2 * GDN_WARPS)) * 4;
            if (col < Dv) cp_async16(buf + u * TS + 2 * Dk + (col - c0), a.qkv + (tc + u) * a.cd + 2 * a.kd + (int64_t)h * Dv + col, 16);
        }
        for (int i = tid; i < 2 * nu; i += 32 * GDN_WARPS) {
            const int u = i / 2;
            cp_async_4(buf + u * TS + 2 * Dk + 8 * GDN_WARPS + (i & 1), ((i & 1) ? a.a : a.b) + (tc + u) * a.Hv + h);
        }
    };
    if (nch > 0) issue(0);
    cp_async_commit();
    for (int64_t c = 0; c < nch; c++) {
        __syncthreads(); /* every warp is done with the buffer chunk c + 1 fills */
        if (c + 1 < nch) issue(c + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); /* chunk c is in */
        float *buf = gsh + (c & 1) * GDN_CHUNK * TS;
        const int nu = n - c * GDN_CHUNK < GDN_CHUNK ? (int)(n - c * GDN_CHUNK) : GDN_CHUNK;
        if (tid < nu) { /* b, a into beta and the decay alpha, off the steps' chain */
            float *ba = buf + tid * TS + 2 * Dk + 8 * GDN_WARPS;
            const float bt = ba[0], at = ba[1];
            ba[0] = sigmoidf_(bt);
            ba[1] = expf(nea * softplusf_(at + dtb));
        }
        __syncthreads();
        for (int u = 0; u < nu; u++) {
            const float *tk = buf + u * TS;
            const int64_t t = t0 + c * GDN_CHUNK + u;
            float q[RP], k[RP];
#pragma unroll
            for (int m = 0; m < RP; m++) {
                q[m] = r0 + m < Dk ? tk[r0 + m] : 0.0f;
                k[m] = r0 + m < Dk ? tk[Dk + r0 + m] : 0.0f;
            }
            const float2 v = on ? *(const float2 *)(tk + 2 * Dk + (i0 - c0)) : make_float2(0.0f, 0.0f);
            const float beta = tk[2 * Dk + 8 * GDN_WARPS], alpha = tk[2 * Dk + 8 * GDN_WARPS + 1];
            float e[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* [column][even/odd rows] */
#pragma unroll
            for (int m = 0; m < RP; m++) {
                S0[m] *= alpha;
                S1[m] *= alpha;
                e[0][m & 1] = fmaf(S0[m], k[m], e[0][m & 1]);
                e[1][m & 1] = fmaf(S1[m], k[m], e[1][m & 1]);
            }
            float e0 = e[0][0] + e[0][1], e1 = e[1][0] + e[1][1];
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                e0 += __shfl_xor_sync(FULL, e0, o);
                e1 += __shfl_xor_sync(FULL, e1, o);
            }
            const float d0 = beta * (v.x - e0), d1 = beta * (v.y - e1);
            float o2[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
            for (int m = 0; m < RP; m++) {
                S0[m] = fmaf(d0, k[m], S0[m]);
                S1[m] = fmaf(d1, k[m], S1[m]);
                o2[0][m & 1] = fmaf(S0[m], q[m], o2[0][m & 1]);
                o2[1][m & 1] = fmaf(S1[m], q[m], o2[1][m & 1]);
            }
            float o0 = o2[0][0] + o2[0][1], o1 = o2[1][0] + o2[1][1];
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                o0 += __shfl_xor_sync(FULL, o0, o);
                o1 += __shfl_xor_sync(FULL, o1, o);
            }
            if (ra == 0 && on) *(float2 *)(a.mix + t * a.vd + (int64_t)h * Dv + i0) = make_float2(o0, o1);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int m = 0; m < RP; m++)
        if (on && r0 + m < Dk) *(float2 *)(Sg + (size_t)(r0 + m) * Dv + i0) = make_float2(S0[m], S1[m]);
}

/* gated RMSNorm: norm(o) * w * silu(z), a warp per (token, value head) */
__global__ void k_gdn_gnorm(cu_gdn_args a) {
    pdl_wait();
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

static size_t gdn_smem(int Dk) { return (size_t)2 * GDN_CHUNK * gdn_token_floats(Dk) * sizeof(float); }

/* the rows a lane of k_gdn_recur holds (Dk / 8 rounded up to a kernel's), 0: none */
static int gdn_rows(int Dk) {
    const int r = (Dk + 7) / 8;
    return r <= 2 ? 2 : r <= 4 ? 4 : r <= 8 ? 8 : r <= 16 ? 16 : r <= 32 ? 32 : 0;
}

extern "C" void cu_gdn(cu_stream s, const cu_plan *p, const cu_gdn_args *a, int max_item_tokens) {
    (void)max_item_tokens;
    if (p->n_tokens <= 0) return;
    dim3 gc((unsigned)p->n_items, (unsigned)((a->cd + CONV_THREADS - 1) / CONV_THREADS));
    launch_pdl(k_gdn_conv, gc, dim3(CONV_THREADS), 0, s, *p, *a);
    launch_pdl(k_gdn_qknorm, dim3((unsigned)p->n_tokens, (unsigned)a->Hk), dim3(32), 0, s, *a);
    dim3 gr((unsigned)p->n_items, (unsigned)a->Hv, (unsigned)((a->Dv + 8 * GDN_WARPS - 1) / (8 * GDN_WARPS)));
    const size_t shm = gdn_smem(a->Dk);
    switch (gdn_rows(a->Dk)) {
    case 2: launch_pdl(k_gdn_recur<2>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a); break;
    case 4: launch_pdl(k_gdn_recur<4>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a); break;
    case 8: launch_pdl(k_gdn_recur<8>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a); break;
    case 16: launch_pdl(k_gdn_recur<16>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a); break;
    default: launch_pdl(k_gdn_recur<32>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a); break;
    }
    dim3 gn((unsigned)p->n_tokens, (unsigned)a->Hv);
    launch_pdl(k_gdn_gnorm, gn, dim3(32), 0, s, *a);
}

/* key dims at most 256 (a lane's registers hold 32 rows); key and value dims multiples of 4
 * (16-byte copies); the shared memory of the largest kernel allowed */
extern "C" int cu_gdn_prepare(int Dk, int Dv) {
    if (Dk < 4 || Dk % 4 != 0 || gdn_rows(Dk) == 0 || Dv < 4 || Dv % 4 != 0) return -1;
    const int shm = (int)gdn_smem(Dk);
    cudaFuncSetAttribute(k_gdn_recur<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    return cudaFuncSetAttribute(k_gdn_recur<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm) == cudaSuccess ? 0 : -1;
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
    pdl_wait();
    extern __shared__ float sh[];
    float *cs = sh, *sn = sh + a.rope_dim / 2;
    const int64_t t = blockIdx.x;
    const int it = p.tok_item[t];
    const int64_t pos = p.pos0[it] + (t - p.item_t0[it]);
    for (int i = threadIdx.x; i < a.rope_dim / 2; i += blockDim.x) {
        const float ang = (float)(int64_t)p.mrope[t * 3 + a.rope_axis[i]] * a.inv_freq[i]; /* M-RoPE */
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
    /* a warp per head (q and k), at most 1024 threads */
    int threads = 32 * (a->nh + a->nkv);
    threads = threads > 1024 ? 1024 : threads;
    launch_pdl(k_attn_prep, dim3((unsigned)p->n_tokens), dim3(threads), (size_t)a->rope_dim * sizeof(float), s, *p, *a, *kv);
}


__device__ __forceinline__ float kv_load(const cu_kv &kv, size_t i) {
    return kv.bf16 ? bf16f(((const uint16_t *)kv.base)[i]) : ((const float *)kv.base)[i];
}

/* Paged attention, a block per (tile of up to ATT_QT consecutive tokens of one item, KV head):
 * its queries are the tile's tokens times the G = nh / nkv query heads that read the KV head,
 * so every K and V row a block loads from the pool serves up to ATT_Q queries. The positions
 * go in chunks of ATT_CH; a query's result is fixed by the chunking alone, not by the tile:
 *   score  s_p = sum over e in order of (q_e * scale) k_pe       (fp32 FMAs from 0)
 *   chunk  mc = max s_p, w_p = exp(s_p - mc) (0 past the query's position),
 *          lc = the lanes' butterfly sum of w_p + w_p+32, oc_e = sum over p in order of w_p v_pe
 *   merge  (chunks in order, from m = -inf, l = 0, o = 0): mn = max(m, mc),
 *          a = exp(m - mn), b = exp(mc - mn), l = l a + lc b, o_e = o_e a + oc_e b, m = mn
 *   out_e  = o_e / l * sigmoid(gate_e)
 * The same bits for a query alone (decode) and in any tile, batch or split of the prompt. */
#define ATT_CH 64  /* positions a chunk */
#define ATT_Q 48   /* queries a block at most (tokens times the query heads of a KV head) */
#define ATT_THREADS 256
#define ATT_QW (ATT_Q / 8) /* queries a warp scores */
static_assert(ATT_QW == 6, "the score loop loads a warp's queries as 4 + 2");
#define ATT_QS 64          /* qT's row: a warp's ATT_QW queries at 8-float offsets (vector loads) */

static int att_tokens(const cu_attn_args *a) {
    const int g = a->nh / a->nkv;
    return g >= ATT_Q ? 1 : ATT_Q / g;
}

static size_t att_smem(const cu_attn_args *a) {
    /* pos [ATT_Q] (int64), qT [hd][ATT_QS], kT [hd][ATT_CH + 1] then v [ATT_CH][hd],
     * w [ATT_Q][ATT_CH], m, l, a, b [ATT_Q] */
    return ATT_Q * 8 + ((size_t)a->hd * ATT_QS + (size_t)a->hd * (ATT_CH + 1) + ATT_Q * ATT_CH + 4 * ATT_Q) * 4;
}

/* the tile of block k: the k-th of the step's tiles, items in order, ceil(n_i / qt) each */
__device__ __forceinline__ int att_tile(const cu_plan &p, int qt, int64_t *t0, int64_t *nt) {
    int64_t k = blockIdx.x;
    for (int i = 0; i < p.n_items; i++) {
        const int64_t n = p.item_t0[i + 1] - p.item_t0[i], tiles = (n + qt - 1) / qt;
        if (k < tiles) {
            *t0 = p.item_t0[i] + k * qt, *nt = n - k * qt < qt ? n - k * qt : qt;
            return i;
        }
        k -= tiles;
    }
    return -1;
}

__global__ void __launch_bounds__(ATT_THREADS, 1) k_attention(cu_plan p, cu_attn_args a, cu_kv kv, int qt) {
    pdl_wait();
    extern __shared__ int64_t sh64[];
    const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int64_t *qpos = sh64;
    float *qT = (float *)(sh64 + ATT_Q), *kvb = qT + hd * ATT_QS, *wt = kvb + hd * (ATT_CH + 1), *sm_m = wt + ATT_Q * ATT_CH;
    float *sm_l = sm_m + ATT_Q, *sm_a = sm_l + ATT_Q, *sm_b = sm_a + ATT_Q;
    int64_t t0 = 0, nt = 0;
    const int it = att_tile(p, qt, &t0, &nt);
    if (it < 0) return;
    const int Q = (int)nt * G;
    const int64_t pos_first = p.pos0[it] + (t0 - p.item_t0[it]), pos_last = pos_first + nt - 1;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = tid; i < hd * ATT_Q; i += ATT_THREADS) {
        const int qi = i % ATT_Q, e = i / ATT_Q;
        float v = 0.0f;
        if (qi < Q) {
            const int64_t t = t0 + qi / G;
            v = __fmul_rn(a.q[t * 2 * a.nh * hd + (int64_t)(h * G + qi % G) * 2 * hd + e], scale);
        }
        qT[e * ATT_QS + (qi / ATT_QW) * 8 + qi % ATT_QW] = v;
    }
    if (tid < ATT_Q) {
        sm_m[tid] = -INFINITY;
        sm_l[tid] = 0.0f;
        qpos[tid] = pos_first + (tid < Q ? tid / G : 0);
    }
    float o[ATT_Q]; /* this thread's dimension e = tid of every query */
#pragma unroll
    for (int q = 0; q < ATT_Q; q++) o[q] = 0.0f;
    for (int64_t c0 = 0; c0 <= pos_last; c0 += ATT_CH) {
        __syncthreads(); /* the previous chunk's v is read */
        /* K rows, transposed: a warp a row, its lanes over the dims; zeros past the tile's last position */
        for (int r = warp; r < ATT_CH; r += ATT_THREADS / 32) {
            const int64_t pq = c0 + r;
            const size_t ki = pq <= pos_last ? kv_index(kv, p, it, a.li, 0, h, pq) : 0;
            for (int e = lane; e < hd; e += 32) kvb[e * (ATT_CH + 1) + r] = pq <= pos_last ? kv_load(kv, ki + e) : 0.0f;
        }
        __syncthreads();
        /* scores: lane -> positions lane, lane + 32; warp -> queries warp * ATT_QW .. */
        if (warp * ATT_QW < Q) {
            float sc[ATT_QW][2];
#pragma unroll
            for (int k = 0; k < ATT_QW; k++) sc[k][0] = sc[k][1] = 0.0f;
            for (int e = 0; e < hd; e++) {
                const float k0 = kvb[e * (ATT_CH + 1) + lane], k1 = kvb[e * (ATT_CH + 1) + lane + 32];
                const float4 qa = *(const float4 *)(qT + e * ATT_QS + warp * 8);
                const float2 qb = *(const float2 *)(qT + e * ATT_QS + warp * 8 + 4);
                const float qv[ATT_QW] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y};
#pragma unroll
                for (int k = 0; k < ATT_QW; k++) {
                    sc[k][0] = __fmaf_rn(qv[k], k0, sc[k][0]);
                    sc[k][1] = __fmaf_rn(qv[k], k1, sc[k][1]);
                }
            }
#pragma unroll
            for (int k = 0; k < ATT_QW; k++) {
                const int qi = warp * ATT_QW + k;
                wt[qi * ATT_CH + lane] = c0 + lane <= qpos[qi] ? sc[k][0] : -INFINITY;
                wt[qi * ATT_CH + lane + 32] = c0 + lane + 32 <= qpos[qi] ? sc[k][1] : -INFINITY;
            }
        }
        __syncthreads();
        /* V rows; and each query's chunk weights, sum and merge factors */
        for (int r = warp; r < ATT_CH; r += ATT_THREADS / 32) {
            const int64_t pq = c0 + r;
            const size_t vi = pq <= pos_last ? kv_index(kv, p, it, a.li, 1, h, pq) : 0;
            for (int e = lane; e < hd; e += 32) kvb[r * hd + e] = pq <= pos_last ? kv_load(kv, vi + e) : 0.0f;
        }
        for (int q = warp; q < Q; q += ATT_THREADS / 32) /* a warp a query */
            if (c0 <= qpos[q]) {
                float *w = wt + q * ATT_CH;
                const float x0 = w[lane], x1 = w[lane + 32];
                float mc = fmaxf(x0, x1);
                for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL, mc, off));
                const float e0 = c0 + lane <= qpos[q] ? expf(x0 - mc) : 0.0f;
                const float e1 = c0 + lane + 32 <= qpos[q] ? expf(x1 - mc) : 0.0f;
                w[lane] = e0;
                w[lane + 32] = e1;
                const float lc = warp_sum(__fadd_rn(e0, e1));
                if (lane == 0) {
                    const float m = sm_m[q], mn = fmaxf(m, mc), ca = expf(m - mn), cb = expf(mc - mn);
                    sm_l[q] = __fmaf_rn(sm_l[q], ca, __fmul_rn(lc, cb));
                    sm_m[q] = mn;
                    sm_a[q] = ca;
                    sm_b[q] = cb;
                }
            }
        __syncthreads();
        if (tid < hd) {
            float oc[ATT_Q];
#pragma unroll
            for (int q = 0; q < ATT_Q; q++) oc[q] = 0.0f;
            for (int r = 0; r < ATT_CH; r += 4) {
                const float v0 = kvb[r * hd + tid], v1 = kvb[(r + 1) * hd + tid], v2 = kvb[(r + 2) * hd + tid],
                            v3 = kvb[(r + 3) * hd + tid];
#pragma unroll
                for (int q = 0; q < ATT_Q; q++) {
                    if (q >= Q) break;
                    const float4 w4 = *(const float4 *)(wt + q * ATT_CH + r);
                    oc[q] = __fmaf_rn(w4.x, v0, oc[q]);
                    oc[q] = __fmaf_rn(w4.y, v1, oc[q]);
                    oc[q] = __fmaf_rn(w4.z, v2, oc[q]);
                    oc[q] = __fmaf_rn(w4.w, v3, oc[q]);
                }
            }
#pragma unroll
            for (int q = 0; q < ATT_Q; q++)
                if (q < Q && c0 <= qpos[q]) o[q] = __fmaf_rn(o[q], sm_a[q], __fmul_rn(oc[q], sm_b[q]));
        }
    }
    __syncthreads();
    if (tid < hd)
#pragma unroll
        for (int q = 0; q < ATT_Q; q++)
            if (q < Q) {
                const int64_t t = t0 + q / G;
                const int j = h * G + q % G;
                const float gate = a.q[t * 2 * a.nh * hd + (int64_t)j * 2 * hd + hd + tid];
                a.mix[t * a.nh * hd + (int64_t)j * hd + tid] = __fmul_rn(__fmul_rn(o[q], 1.0f / sm_l[q]), sigmoidf_(gate));
            }
}

/* ---- attention on the tensor cores: k_attn_tc ----
 * k_attention's tiles, chunks, masks and merges, with its two products on the tensor cores:
 * the chunk's scores^T [position][query] = K Q^T and its output^T [dim][query] = V^T W^T
 * (mma m16n8k16; a column is one query's own sums). The operands as bf16 parts: the scaled
 * queries and the weights w in QP parts, K and V in KP (3 from an fp32 pool, 1 from a bf16
 * pool or in bf16 mode); of the part products, those of parts i + j <= 2 are summed (with
 * 3 and 3 the rest is below fp32's rounding), larger first, every k step in order, into one
 * fp32 accumulator. The loops over k steps stay loops: unrolled, the kernel outgrew the
 * instruction cache (Nsight Compute: 7 of 12 cycles an instruction stalled on fetch). A query's arithmetic is fixed by the chunking alone, as in k_attention:
 * the same bits alone (decode, which takes this kernel too) and in any tile or batch. */
#define ATC_PAD 8 /* bf16 of padding a shared row: a fragment's 8 rows fall in distinct banks */
#define ATC_KI (ATT_CH * (ATT_THREADS / 8) / ATT_THREADS) /* a thread's 8-element pieces of a chunk's K, at most */

static size_t atc_smem(int hd, int qp, int kp) {
    const size_t qs = (size_t)hd + ATC_PAD, vs = ATT_CH + ATC_PAD;
    const size_t kv = (size_t)ATT_CH * qs > (size_t)hd * vs ? (size_t)ATT_CH * qs : (size_t)hd * vs;
    return ATT_Q * 8 + ATT_CH * 8 + 4 * ATT_Q * 4 + (size_t)ATT_Q * (ATT_CH + 1) * 4 +
           2 * ((size_t)qp * ATT_Q * qs + (size_t)qp * ATT_Q * vs + (size_t)kp * kv);
}

/* 8 consecutive pool elements (hd is a multiple of 16, rows start 32-byte aligned) */
__device__ __forceinline__ void kv_load8(const cu_kv &kv, size_t i, float (&v)[8]) {
    if (kv.bf16) {
        const uint4 u = *(const uint4 *)((const uint16_t *)kv.base + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) v[2 * k] = __uint_as_float(w[k] << 16), v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
        const float4 x = *(const float4 *)((const float *)kv.base + i), y = *(const float4 *)((const float *)kv.base + i + 4);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
    }
}

/* two floats rounded to bf16 (nearest even) as one word, a the low half; and the residuals
 * a - bf16(a), b - bf16(b) (exact) in place: one part of a split */
__device__ __forceinline__ uint32_t bf2_part(float &a, float &b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const uint32_t w = *(const uint32_t *)&h;
    a -= __uint_as_float(w << 16);
    b -= __uint_as_float(w & 0xffff0000u);
    return w;
}

/* 8 floats as NP bf16 parts, 8 a uint4 */
template <int NP>
__device__ __forceinline__ void split8(const float (&v)[8], uint4 (&o)[NP]) {
    float r[8];
#pragma unroll
    for (int k = 0; k < 8; k++) r[k] = v[k];
#pragma unroll
    for (int q = 0; q < NP; q++) {
        const uint32_t w0 = bf2_part(r[0], r[1]), w1 = bf2_part(r[2], r[3]), w2 = bf2_part(r[4], r[5]), w3 = bf2_part(r[6], r[7]);
        o[q] = make_uint4(w0, w1, w2, w3);
    }
}

/* the part products of one k step into d: A parts a[KP][4], B parts b[QP][2], i + j <= 2 */
template <int QP, int KP>
__device__ __forceinline__ void atc_mma(float (&d)[4], const uint32_t (&a)[KP][4], const uint32_t (&b)[QP][2]) {
#pragma unroll
    for (int sum = 0; sum < 3; sum++)
#pragma unroll
        for (int i = 0; i <= sum; i++) {
            const int j = sum - i;
            if (i < QP && j < KP) mma_bf16(d, a[j][0], a[j][1], a[j][2], a[j][3], b[i][0], b[i][1]);
        }
}

template <int QP, int KP>
__global__ void __launch_bounds__(ATT_THREADS, 1) k_attn_tc(cu_plan p, cu_attn_args a, cu_kv kv, int qt) {
    pdl_wait();
    extern __shared__ int64_t sh64[];
    const int hd = a.hd, G = a.nh / a.nkv, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3, QS = hd + ATC_PAD, VS = ATT_CH + ATC_PAD, H8 = hd / 8;
    int64_t *qpos = sh64, *krow = sh64 + ATT_Q; /* krow: the chunk's K rows in the pool (V: + vstep) */
    float *sm_m = (float *)(krow + ATT_CH), *sm_l = sm_m + ATT_Q, *sm_a = sm_l + ATT_Q, *sm_b = sm_a + ATT_Q;
    float *st = sm_b + ATT_Q;                                 /* scores [ATT_Q][ATT_CH + 1] */
    uint16_t *qs = (uint16_t *)(st + ATT_Q * (ATT_CH + 1));   /* queries [QP][ATT_Q][QS] */
    uint16_t *ws = qs + QP * ATT_Q * QS;                      /* weights [QP][ATT_Q][VS] */
    uint16_t *kvs = ws + QP * ATT_Q * VS;                     /* K [KP][ATT_CH][QS], then V^T [KP][hd][VS] */
    const int kvstride = ATT_CH * QS > hd * VS ? ATT_CH * QS : hd * VS;
    int64_t t0 = 0, nt = 0;
    const int it = att_tile(p, qt, &t0, &nt);
    if (it < 0) return;
    const int Q = (int)nt * G, nqt = (Q + 7) / 8;
    const int64_t pos_first = p.pos0[it] + (t0 - p.item_t0[it]), pos_last = pos_first + nt - 1;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = tid; i < ATT_Q * H8; i += ATT_THREADS) {
        const int qi = i / H8, e0 = (i % H8) * 8;
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (qi < Q) {
            const float *src = a.q + (t0 + qi / G) * 2 * a.nh * hd + (int64_t)(h * G + qi % G) * 2 * hd + e0;
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __fmul_rn(src[k], scale);
        }
        uint4 o[QP];
        split8<QP>(v, o);
#pragma unroll
        for (int q = 0; q < QP; q++) *(uint4 *)(qs + q * ATT_Q * QS + qi * QS + e0) = o[q];
    }
    if (tid < ATT_Q) {
        sm_m[tid] = -INFINITY;
        sm_l[tid] = 0.0f;
        qpos[tid] = pos_first + (tid < Q ? tid / G : 0);
    }
    const bool pv = 32 * warp < hd; /* this warp's dims 32 warp .. + 31 of the output */
    float o[2][6][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int n = 0; n < 6; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    const int64_t vstep = (int64_t)kv.nkv * kv.block_size * hd; /* a V row from its K row */
    for (int64_t c0 = 0; c0 <= pos_last; c0 += ATT_CH) {
        __syncthreads(); /* the previous chunk's V^T, weights and rows are read */
        if (tid < ATT_CH) krow[tid] = c0 + tid <= pos_last ? (int64_t)kv_index(kv, p, it, a.li, 0, h, c0 + tid) : -1;
        __syncthreads();
        { /* K rows as parts, [part][position][dim]: every load in flight before the first store */
            float v[ATC_KI][8];
#pragma unroll
            for (int k = 0; k < ATC_KI; k++) {
                const int i = tid + k * ATT_THREADS, r = i / H8, e0 = (i % H8) * 8;
#pragma unroll
                for (int e = 0; e < 8; e++) v[k][e] = 0.0f;
                if (i < ATT_CH * H8 && krow[r] >= 0) kv_load8(kv, (size_t)krow[r] + e0, v[k]);
            }
#pragma unroll
            for (int k = 0; k < ATC_KI; k++) {
                const int i = tid + k * ATT_THREADS, r = i / H8, e0 = (i % H8) * 8;
                if (i >= ATT_CH * H8) break;
                uint4 o4[KP];
                split8<KP>(v[k], o4);
#pragma unroll
                for (int q = 0; q < KP; q++) *(uint4 *)(kvs + q * kvstride + r * QS + e0) = o4[q];
            }
        }
        __syncthreads();
        { /* scores: warp w takes position tile w % 4 and query tiles (w / 4) * 3 .. + 2 */
            const int mt = warp & 3, n0 = (warp >> 2) * 3;
            float sc[3][4];
#pragma unroll
            for (int n = 0; n < 3; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            if (n0 < nqt) {
#pragma unroll 1
                for (int ks = 0; ks < hd / 16; ks++) {
                    uint32_t af[KP][4];
#pragma unroll
                    for (int j = 0; j < KP; j++) {
                        const uint16_t *kb = kvs + j * kvstride + (mt * 16 + g) * QS + ks * 16 + 2 * t;
                        af[j][0] = *(const uint32_t *)kb, af[j][1] = *(const uint32_t *)(kb + 8 * QS);
                        af[j][2] = *(const uint32_t *)(kb + 8), af[j][3] = *(const uint32_t *)(kb + 8 * QS + 8);
                    }
#pragma unroll
                    for (int n = 0; n < 3; n++) {
                        if (n0 + n >= nqt) break;
                        uint32_t bf[QP][2];
#pragma unroll
                        for (int i = 0; i < QP; i++) {
                            const uint16_t *qb = qs + i * ATT_Q * QS + ((n0 + n) * 8 + g) * QS + ks * 16 + 2 * t;
                            bf[i][0] = *(const uint32_t *)qb, bf[i][1] = *(const uint32_t *)(qb + 8);
                        }
                        atc_mma<QP, KP>(sc[n], af, bf);
                    }
                }
#pragma unroll
                for (int n = 0; n < 3; n++) {
                    if (n0 + n >= nqt) break;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int pr = mt * 16 + g + (e >= 2 ? 8 : 0), qi = (n0 + n) * 8 + 2 * t + (e & 1);
                        st[qi * (ATT_CH + 1) + pr] = c0 + pr <= qpos[qi] ? sc[n][e] : -INFINITY;
                    }
                }
            }
        }
        __syncthreads();
        /* V^T as parts, [part][dim][position]: a thread two positions by 8 dims (a warp's
         * threads the 32 position pairs of 8 dims: their stores fall in distinct banks) */
        {
            float v[ATC_KI / 2][2][8];
#pragma unroll
            for (int k = 0; k < ATC_KI / 2; k++) {
                const int i = tid + k * ATT_THREADS, pr = (i % (ATT_CH / 2)) * 2, e0 = (i / (ATT_CH / 2)) * 8;
#pragma unroll
                for (int u = 0; u < 2; u++) {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[k][u][e] = 0.0f;
                    if (i < (ATT_CH / 2) * H8 && krow[pr + u] >= 0) kv_load8(kv, (size_t)(krow[pr + u] + vstep) + e0, v[k][u]);
                }
            }
#pragma unroll
            for (int k = 0; k < ATC_KI / 2; k++) {
                const int i = tid + k * ATT_THREADS, pr = (i % (ATT_CH / 2)) * 2, e0 = (i / (ATT_CH / 2)) * 8;
                if (i >= (ATT_CH / 2) * H8) break;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    float x0 = v[k][0][e], x1 = v[k][1][e];
#pragma unroll
                    for (int q = 0; q < KP; q++) *(uint32_t *)(kvs + q * kvstride + (e0 + e) * VS + pr) = bf2_part(x0, x1);
                }
            }
        }
        /* each query's chunk weights (as parts), sum and merge factors: a warp a query */
        for (int q = warp; q < Q; q += ATT_THREADS / 32)
            if (c0 <= qpos[q]) {
                const float *w = st + q * (ATT_CH + 1);
                const float x0 = w[lane], x1 = w[lane + 32];
                float mc = fmaxf(x0, x1);
                for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL, mc, off));
                const float e0 = c0 + lane <= qpos[q] ? expf(x0 - mc) : 0.0f;
                const float e1 = c0 + lane + 32 <= qpos[q] ? expf(x1 - mc) : 0.0f;
                float r0 = e0, r1 = e1;
#pragma unroll
                for (int i = 0; i < QP; i++) {
                    const uint16_t h0 = f2bf16(r0), h1 = f2bf16(r1);
                    ws[i * ATT_Q * VS + q * VS + lane] = h0;
                    ws[i * ATT_Q * VS + q * VS + lane + 32] = h1;
                    r0 -= bf16f(h0), r1 -= bf16f(h1);
                }
                const float lc = warp_sum(__fadd_rn(e0, e1));
                if (lane == 0) {
                    const float m = sm_m[q], mn = fmaxf(m, mc), ca = expf(m - mn), cb = expf(mc - mn);
                    sm_l[q] = __fmaf_rn(sm_l[q], ca, __fmul_rn(lc, cb));
                    sm_m[q] = mn;
                    sm_a[q] = ca;
                    sm_b[q] = cb;
                }
            }
        __syncthreads();
        if (pv) { /* the chunk's output for this warp's 32 dims and every query tile, then the merge */
            float oc[2][6][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int n = 0; n < 6; n++) oc[mi][n][0] = oc[mi][n][1] = oc[mi][n][2] = oc[mi][n][3] = 0.0f;
#pragma unroll 1 /* the kernel's code stays within the instruction cache */
            for (int ks = 0; ks < ATT_CH / 16; ks++) {
                uint32_t av[2][KP][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int j = 0; j < KP; j++) {
                        const uint16_t *vb = kvs + j * kvstride + (32 * warp + 16 * mi + g) * VS + ks * 16 + 2 * t;
                        const bool in = 32 * warp + 16 * mi < hd;
                        av[mi][j][0] = in ? *(const uint32_t *)vb : 0u, av[mi][j][1] = in ? *(const uint32_t *)(vb + 8 * VS) : 0u;
                        av[mi][j][2] = in ? *(const uint32_t *)(vb + 8) : 0u, av[mi][j][3] = in ? *(const uint32_t *)(vb + 8 * VS + 8) : 0u;
                    }
#pragma unroll
                for (int n = 0; n < 6; n++) {
                    if (n >= nqt) break;
                    uint32_t bw[QP][2];
#pragma unroll
                    for (int i = 0; i < QP; i++) {
                        const uint16_t *wb = ws + i * ATT_Q * VS + (n * 8 + g) * VS + ks * 16 + 2 * t;
                        bw[i][0] = *(const uint32_t *)wb, bw[i][1] = *(const uint32_t *)(wb + 8);
                    }
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) atc_mma<QP, KP>(oc[mi][n], av[mi], bw);
                }
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int n = 0; n < 6; n++) {
                    if (n >= nqt) break;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = n * 8 + 2 * t + (e & 1);
                        if (qi < Q && c0 <= qpos[qi]) o[mi][n][e] = __fmaf_rn(o[mi][n][e], sm_a[qi], __fmul_rn(oc[mi][n][e], sm_b[qi]));
                    }
                }
        }
    }
    __syncthreads();
    float *ot = (float *)qs; /* the outputs before the gate, [ATT_Q][hd]: qs, ws and kvs (free now) hold them */
    if (pv)
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int n = 0; n < 6; n++) {
                if (n >= nqt) break;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int dim = 32 * warp + 16 * mi + g + (e >= 2 ? 8 : 0), qi = n * 8 + 2 * t + (e & 1);
                    if (qi < Q && dim < hd) ot[qi * hd + dim] = o[mi][n][e];
                }
            }
    __syncthreads();
    for (int i = tid; i < Q * hd; i += ATT_THREADS) {
        const int qi = i / hd, dim = i % hd, j = h * G + qi % G;
        const int64_t tt = t0 + qi / G;
        const float gate = a.q[tt * 2 * a.nh * hd + (int64_t)j * 2 * hd + hd + dim];
        a.mix[tt * a.nh * hd + (int64_t)j * hd + dim] = __fmul_rn(__fmul_rn(ot[i], 1.0f / sm_l[qi]), sigmoidf_(gate));
    }
}

extern "C" void cu_attention(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv) {
    if (p->n_tokens <= 0) return;
    const int qt = att_tokens(a);
    dim3 grid((unsigned)((p->n_tokens + qt - 1) / qt + p->n_items), (unsigned)a->nkv);
    const dim3 blk(ATT_THREADS);
    const int parts = a->hd % 16 == 0 ? a->parts : 0;
    if (parts == 3 && !kv->bf16) launch_pdl(k_attn_tc<3, 3>, grid, blk, atc_smem(a->hd, 3, 3), s, *p, *a, *kv, qt);
    else if (parts == 3) launch_pdl(k_attn_tc<3, 1>, grid, blk, atc_smem(a->hd, 3, 1), s, *p, *a, *kv, qt);
    else if (parts == 1) launch_pdl(k_attn_tc<1, 1>, grid, blk, atc_smem(a->hd, 1, 1), s, *p, *a, *kv, qt);
    else launch_pdl(k_attention, grid, blk, att_smem(a), s, *p, *a, *kv, qt);
}

extern "C" int cu_attention_fits(int nh, int nkv, int hd) {
    return nkv > 0 && nh % nkv == 0 && nh / nkv <= ATT_Q && hd <= ATT_THREADS;
}

extern "C" void cu_attention_init(int hd) {
    cu_attn_args a = {};
    a.hd = hd;
    cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)att_smem(&a));
    cudaFuncSetAttribute(k_attn_tc<3, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 3));
    cudaFuncSetAttribute(k_attn_tc<3, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 1));
    cudaFuncSetAttribute(k_attn_tc<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 1, 1));
}
