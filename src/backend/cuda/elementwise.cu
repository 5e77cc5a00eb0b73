/* ==== CUDA kernels: embedding, norms, elementwise (see cuda_kernels.h) ====
 *
 * The embedding lookups of every matrix format (the tiled ones through cu_common.cuh's
 * layout helpers), the residual add and RMS norm (which can also split its result into the
 * bf16 parts of the tiled products), SiLU-and-multiply, the gathers and scatters of the MoE
 * pieces, the copy the bench measures and the synthetic weights.
 */
#include "backend/cuda/mm_int.cuh"

template <int FMT>
__global__ void k_embed(cu_mat w, const int32_t *tokens, float *x) {
    const int64_t t = blockIdx.x, row = tokens[t];
    for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) x[t * w.cols + c] = w_at<FMT>(w, row, c);
}

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
        const int64_t gi = (m * ng + c / w.group) * 16 + 2 * (rr % 8) + rr / 8; /* the rows 0, 8, 1, 9, ... */
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

/* four consecutive values as their P bf16 parts, each part's four as one 8-byte store at
 * xs[p * pstride + at] (at a multiple of 4) */
__device__ __forceinline__ void put_parts4(uint16_t *xs, int parts, int64_t pstride, int64_t at, float4 v) {
    float r[4] = {v.x, v.y, v.z, v.w};
    for (int p = 0; p < parts; p++) {
        uint16_t h[4];
#pragma unroll
        for (int k = 0; k < 4; k++) h[k] = f2bf16(r[k]), r[k] -= bf16f(h[k]);
        *(uint2 *)(xs + p * pstride + at) = make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
    }
}

/* A block of NORM_THREADS per token. A row of a multiple of 4 up to 4 * NORM_HELD *
 * NORM_THREADS values stays in registers (float4 c4 = thread + i * NORM_THREADS) between the
 * sum of squares and the scaling, every load in flight before the first store: x, out, w
 * and xn may alias as far as the compiler knows, so a load after a store would wait for it
 * (a memory round trip each: most of a 1-token norm's 8 us on the H200, before). The
 * weights never change: read before the wait. Few threads: a block starts beside a
 * product's resident blocks, and the sum's last step is 8 warps'. Other rows go by a
 * strided loop. xs (parts > 0): the result also split, as k_split would, ldxs = d rounded up
 * to 32 (zeros past d). QI (xq; the register path only, d a multiple of qgroup): the result
 * also as the IM form's limbs (qi_put), a group of qgroup columns on qgroup / 4 lanes (a form
 * of its own, so that the others compile as they did). */
#define NORM_THREADS 256
#define NORM_HELD 8
template <bool QI>
__global__ void __launch_bounds__(NORM_THREADS) k_add_norm(float *x, const float *out, const float *w, float *xn,
                                                           int64_t d, float eps, int add, int apply, uint16_t *xs,
                                                           int parts, uint8_t *xq, int qgroup, int qbits) {
    __shared__ float red[32];
    const int64_t t = blockIdx.x, ldxs = (d + 31) / 32 * 32, pstride = (int64_t)gridDim.x * ldxs;
    float *xr = x + t * d;
    float ss = 0.0f;
    if (d % 4 == 0 && d <= 4 * NORM_HELD * NORM_THREADS) {
        const int64_t d4 = d / 4;
        float4 v[NORM_HELD], o[NORM_HELD], wv[NORM_HELD];
        const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < NORM_HELD; i++) {
            const int64_t c4 = threadIdx.x + (int64_t)i * NORM_THREADS;
            wv[i] = apply && c4 < d4 ? ((const float4 *)w)[c4] : z4;
        }
        pdl_wait();
#pragma unroll
        for (int i = 0; i < NORM_HELD; i++) {
            const int64_t c4 = threadIdx.x + (int64_t)i * NORM_THREADS;
            v[i] = c4 < d4 ? ((const float4 *)xr)[c4] : z4;
            o[i] = add && c4 < d4 ? ((const float4 *)(out + t * d))[c4] : z4;
        }
#pragma unroll
        for (int i = 0; i < NORM_HELD; i++) {
            const int64_t c4 = threadIdx.x + (int64_t)i * NORM_THREADS;
            if (c4 >= d4) break;
            if (add) {
                v[i].x += o[i].x, v[i].y += o[i].y, v[i].z += o[i].z, v[i].w += o[i].w;
                ((float4 *)xr)[c4] = v[i];
            }
            ss += v[i].x * v[i].x;
            ss += v[i].y * v[i].y;
            ss += v[i].z * v[i].z;
            ss += v[i].w * v[i].w;
        }
        if (!apply) return;
        ss = block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int i = 0; i < NORM_HELD; i++) {
            const int64_t c4 = threadIdx.x + (int64_t)i * NORM_THREADS;
            if (4 * c4 >= ldxs) break;
            float4 y = z4;
            if (c4 < d4) {
                y = make_float4(v[i].x * r * wv[i].x, v[i].y * r * wv[i].y, v[i].z * r * wv[i].z, v[i].w * r * wv[i].w);
                ((float4 *)(xn + t * d))[c4] = y;
                if constexpr (QI) { /* a group's lanes are all here: d is a multiple of qgroup */
                    const int width = qgroup / 4;
                    const unsigned lane = threadIdx.x & 31u,
                                   mask = width == 32 ? FULL : ((1u << width) - 1u) << (lane & ~(unsigned)(width - 1));
                    const float yv[4] = {y.x, y.y, y.z, y.w};
                    qi_put(xq, ldxs / 32, t, 4 * c4 / qgroup, yv, 4 * c4, 1, qbits, mask, width);
                }
            }
            if (xs) put_parts4(xs, parts, pstride, t * ldxs + 4 * c4, y);
        }
        return;
    }
    pdl_wait();
    for (int64_t c = threadIdx.x; c < d; c += NORM_THREADS) {
        float e = xr[c];
        if (add) xr[c] = e = e + out[t * d + c];
        ss += e * e;
    }
    if (!apply) return;
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t c = threadIdx.x; c < d; c += NORM_THREADS) xn[t * d + c] = xr[c] * r * w[c];
    if (xs)
        for (int64_t c = threadIdx.x; c < ldxs; c += NORM_THREADS)
            put_parts(xs, parts, pstride, t * ldxs + c, c < d ? xn[t * d + c] : 0.0f); /* this thread's own */
}

extern "C" int cu_add_norm(cu_stream s, float *x, const float *out, const float *w, float *xn, int64_t T,
                           int64_t d, float eps, int add, int apply, uint16_t *xs, int parts, uint8_t *xq, int qgroup,
                           int qbits) {
    if (T <= 0) return 0;
    const bool limbs = xq && apply && T <= QI_TP && (qgroup == 32 || qgroup == 64 || qgroup == 128) &&
                       (qbits == 4 || qbits == 8) && d % qgroup == 0 && d <= 4 * NORM_HELD * NORM_THREADS;
    launch_pdl(limbs ? k_add_norm<true> : k_add_norm<false>, dim3((unsigned)T), dim3(NORM_THREADS), 0, s, x, out, w, xn, d,
               eps, add, apply, apply ? xs : (uint16_t *)NULL, parts, limbs ? xq : (uint8_t *)NULL, qgroup, qbits);
    return limbs;
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

/* k_silu_mul for many tokens without a split: a thread per 4 consecutive columns (16-byte
 * loads and stores; the same arithmetic element by element). n and ld multiples of 4, g and
 * u 16-byte aligned. */
__global__ void k_silu_mul4(float *g, const float *u, int64_t T, int64_t n, int64_t ld) {
    pdl_wait();
    const int64_t per = n / 4, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = i / per, c = i % per * 4;
    if (t >= T) return;
    float4 v = *(const float4 *)(g + t * ld + c);
    const float4 w = *(const float4 *)(u + t * ld + c);
    v.x = siluf_(v.x) * w.x, v.y = siluf_(v.y) * w.y, v.z = siluf_(v.z) * w.z, v.w = siluf_(v.w) * w.w;
    *(float4 *)(g + t * ld + c) = v;
}

/* SwiGLU of bf16 gate and up outputs into bf16 h (the `bf16` MLP of many tokens, whose down
 * product takes h as it is): a thread per 8 consecutive columns, g, u [T][ldgu] (n of each
 * row), h [T][ldh], n, ldgu and ldh multiples of 8, the three 16-byte aligned; fp32
 * arithmetic, h rounded to nearest */
__global__ void k_silu_mul_bf(const uint16_t *g, const uint16_t *u, int64_t ldgu, int64_t T, int64_t n, uint16_t *h,
                              int64_t ldh) {
    pdl_wait();
    const int64_t per = n / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = i / per, c = i % per * 8;
    if (t >= T) return;
    const uint4 gv = *(const uint4 *)(g + t * ldgu + c), uv = *(const uint4 *)(u + t * ldgu + c);
    const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
    uint32_t hw[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float lo = siluf_(bf16f((uint16_t)gw[k])) * bf16f((uint16_t)uw[k]);
        const float hi = siluf_(bf16f((uint16_t)(gw[k] >> 16))) * bf16f((uint16_t)(uw[k] >> 16));
        hw[k] = pack2(f2bf16(lo), f2bf16(hi));
    }
    *(uint4 *)(h + t * ldh + c) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
}

extern "C" void cu_silu_mul_bf16(cu_stream s, const uint16_t *g, const uint16_t *u, int64_t ldgu, int64_t T, int64_t n,
                                 uint16_t *h, int64_t ldh) {
    if (T <= 0 || n <= 0) return;
    launch_pdl(k_silu_mul_bf, dim3((unsigned)((T * (n / 8) + 255) / 256)), dim3(256), 0, s, g, u, ldgu, T, n, h, ldh);
}

/* SwiGLU with its result also as the IM form's limbs (no split): a warp per (token, group),
 * lane l the group's columns l + 32 i, as k_qlimbs holds them */
__global__ void k_silu_mul_q(float *g, const float *u, int64_t T, int64_t n, int64_t ld, uint8_t *xq, int group,
                             int bits) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t ng = n / group, wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (wid >= T * ng) return;
    const int64_t t = wid / ng, gj = wid % ng, c0 = gj * group + lane;
    const int per = group / 32;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < per) {
            const int64_t at = t * ld + c0 + 32 * i;
            g[at] = v[i] = siluf_(g[at]) * u[at];
        }
    qi_put_warp(xq, (n + 31) / 32, t, gj, v, per, c0, bits);
}

/* from this many tokens SwiGLU without a split takes k_silu_mul4: prefill steps; decode
 * steps keep k_silu_mul (with both this and k_split8 from 64 tokens, 64 sequences decoded 9%
 * slower on the H200: matmul_bf16.cu's SPLIT8_MIN_T) */
#ifndef SILU4_MIN_T
#define SILU4_MIN_T 128
#endif
extern "C" int cu_silu_mul(cu_stream s, float *g, const float *u, int64_t T, int64_t n, int64_t ld, uint16_t *xs,
                           int parts, uint8_t *xq, int qgroup, int qbits) {
    if (xq && T > 0 && T <= QI_TP && (qgroup == 32 || qgroup == 64 || qgroup == 128) && (qbits == 4 || qbits == 8) &&
        n % qgroup == 0) {
        const int64_t warps = T * (n / qgroup);
        launch_pdl(k_silu_mul_q, dim3((unsigned)((warps + 7) / 8)), dim3(256), 0, s, g, u, T, n, ld, xq, qgroup, qbits);
        return 1;
    }
    const int64_t total = T * (xs ? (n + 31) / 32 * 32 : n);
    if (total <= 0) return 0;
    if (!xs && T >= SILU4_MIN_T && n % 4 == 0 && ld % 4 == 0 && (uintptr_t)g % 16 == 0 && (uintptr_t)u % 16 == 0) {
        launch_pdl(k_silu_mul4, dim3((unsigned)((T * (n / 4) + 255) / 256)), dim3(256), 0, s, g, u, T, n, ld);
        return 0;
    }
    launch_pdl(k_silu_mul, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, s, g, u, T, n, ld, xs, parts);
    return 0;
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

/* every byte read once, four 16-byte loads a thread in flight (`mmv_bench bw` on the H200:
 * 4.65 TB/s, where one load a thread reached 4.0 and bulk copies into shared memory 4.73) */
__global__ void k_read4(const uint4 *p, int64_t n, unsigned *sink) {
    unsigned acc = 0;
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * st < n; i += 4 * st) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = ldg_stream((const uint16_t *)(p + i + u * st));
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += st) {
        const uint4 v = ldg_stream((const uint16_t *)(p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* never, but the loads are kept */
}

extern "C" void cu_read(cu_stream s, const void *p, size_t bytes, unsigned *sink) {
    k_read4<<<(unsigned)mm_sms() * 8, 512, 0, s>>>((const uint4 *)p, (int64_t)(bytes / 16), sink);
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
