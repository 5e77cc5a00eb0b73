/* ==== CUDA kernels: the vision tower (see vision_kernels.h) ====
 *
 * k_vgemm: the "NT" product y = x w^T of fp32 activations and f32 or bf16 weights on the CUDA
 *   cores. A block of 256 threads makes a 128 x 128 tile of y (128 patches x 128 weight rows),
 *   each thread 8 x 8 outputs (two 4-wide strips in each direction, 64 apart, so that a warp's
 *   shared-memory reads are broadcasts or contiguous). k steps of 16: both operands staged
 *   k-major in shared memory (two buffers; the next step's global loads are in registers while
 *   the current step is multiplied). Each output is summed over k in index order (one fp32 FMA
 *   a k), then the epilogue adds the bias, applies the activation and adds `add`.
 * k_vln: LayerNorm, a block a row, the mean and then the variance by a fixed block tree.
 * k_vrope: the rotary turn of q and k in place, an element pair a thread.
 * k_vattn: attention within a segment, flash style in fp32: a block takes 64 queries of one
 *   head and walks the segment's keys in tiles of 64 (q and k transposed, v and the tile's
 *   probabilities in shared memory), keeping each query's running maximum and sum (online
 *   softmax) and its output row in registers.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/vision_kernels.h"

/* ---------------------------------------------------------------------------------------- */
/* the product */

#define VG_M 128 /* patches (x rows) a block */
#define VG_N 128 /* weight rows a block */
#define VG_K 16  /* k a step */
#define VG_PAD 4 /* shared rows padded (keeps float4 alignment) */
#define VG_THREADS 256
#define VG_MINB 2 /* blocks an SM: 128 registers a thread (1: up to 255, measured slower) */

__device__ __forceinline__ float vis_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ float vis_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float vis_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

/* four consecutive k of a row from column k (zeros past K, or everywhere when !in) */
template <bool VEC>
__device__ __forceinline__ float4 vg_load(const float *p, bool in, int K, int k) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (VEC) {
        if (in && k < K) v = *(const float4 *)(p + k); /* K % 4 == 0: all four or none */
    } else {
        if (in && k < K) v.x = p[k];
        if (in && k + 1 < K) v.y = p[k + 1];
        if (in && k + 2 < K) v.z = p[k + 2];
        if (in && k + 3 < K) v.w = p[k + 3];
    }
    return v;
}

template <bool VEC>
__device__ __forceinline__ float4 vg_load(const uint16_t *p, bool in, int K, int k) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (VEC) {
        if (in && k < K) {
            const uint2 u = *(const uint2 *)(p + k);
            v.x = __uint_as_float(u.x << 16);
            v.y = __uint_as_float(u.x & 0xffff0000u);
            v.z = __uint_as_float(u.y << 16);
            v.w = __uint_as_float(u.y & 0xffff0000u);
        }
    } else {
        if (in && k < K) v.x = vis_bf16(p[k]);
        if (in && k + 1 < K) v.y = vis_bf16(p[k + 1]);
        if (in && k + 2 < K) v.z = vis_bf16(p[k + 2]);
        if (in && k + 3 < K) v.w = vis_bf16(p[k + 3]);
    }
    return v;
}

/* grid (n tiles, row tiles); VEC: K, ldx, ldw multiples of 4 and x, w 16- (f32) or 8-byte
 * (bf16) aligned */
template <typename WT, bool VEC>
__global__ void __launch_bounds__(VG_THREADS, VG_MINB)
    k_vgemm(const float *x, int64_t ldx, const WT *w, int64_t ldw, int64_t n, int64_t rows, int K,
            const float *bias, int act, const float *add, int64_t ldadd, float *y, int64_t ldy) {
    __shared__ __align__(16) float xs[2][VG_K][VG_M + VG_PAD]; /* [buffer][k][patch] */
    __shared__ __align__(16) float ws[2][VG_K][VG_N + VG_PAD]; /* [buffer][k][weight row] */
    const int t = threadIdx.x;
    const int64_t m0 = (int64_t)blockIdx.x * VG_M, r0 = (int64_t)blockIdx.y * VG_N;
    /* loading: rows lr and lr + 64 of each operand, k lk .. lk + 3 */
    const int lr = t >> 2, lk = (t & 3) * 4;
    /* computing: patches ty*4 + i and 64 + ty*4 + i, weight rows tx*4 + j and 64 + tx*4 + j */
    const int ty = t >> 4, tx = t & 15;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

    /* the rows this thread loads (clamped in range; `in` says whether they are) */
    const bool ix0 = m0 + lr < n, ix1 = m0 + lr + 64 < n, iw0 = r0 + lr < rows, iw1 = r0 + lr + 64 < rows;
    const float *px0 = x + (ix0 ? m0 + lr : 0) * ldx, *px1 = x + (ix1 ? m0 + lr + 64 : 0) * ldx;
    const WT *pw0 = w + (iw0 ? r0 + lr : 0) * ldw, *pw1 = w + (iw1 ? r0 + lr + 64 : 0) * ldw;
    float4 gx0 = vg_load<VEC>(px0, ix0, K, lk), gx1 = vg_load<VEC>(px1, ix1, K, lk);
    float4 gw0 = vg_load<VEC>(pw0, iw0, K, lk), gw1 = vg_load<VEC>(pw1, iw1, K, lk);
    const int nk = (K + VG_K - 1) / VG_K;
    int buf = 0;
    for (int kt = 0;; kt++) {
        /* stage step kt's operands into buffer buf (free: its last readers multiplied step
         * kt - 2, before step kt - 1's barrier) */
        xs[buf][lk + 0][lr] = gx0.x, xs[buf][lk + 1][lr] = gx0.y, xs[buf][lk + 2][lr] = gx0.z, xs[buf][lk + 3][lr] = gx0.w;
        xs[buf][lk + 0][lr + 64] = gx1.x, xs[buf][lk + 1][lr + 64] = gx1.y;
        xs[buf][lk + 2][lr + 64] = gx1.z, xs[buf][lk + 3][lr + 64] = gx1.w;
        ws[buf][lk + 0][lr] = gw0.x, ws[buf][lk + 1][lr] = gw0.y, ws[buf][lk + 2][lr] = gw0.z, ws[buf][lk + 3][lr] = gw0.w;
        ws[buf][lk + 0][lr + 64] = gw1.x, ws[buf][lk + 1][lr + 64] = gw1.y;
        ws[buf][lk + 2][lr + 64] = gw1.z, ws[buf][lk + 3][lr + 64] = gw1.w;
        __syncthreads();
        if (kt + 1 < nk) { /* the next step's loads in flight during this multiply */
            const int k = (kt + 1) * VG_K + lk;
            gx0 = vg_load<VEC>(px0, ix0, K, k);
            gx1 = vg_load<VEC>(px1, ix1, K, k);
            gw0 = vg_load<VEC>(pw0, iw0, K, k);
            gw1 = vg_load<VEC>(pw1, iw1, K, k);
        }
#pragma unroll
        for (int kk = 0; kk < VG_K; kk++) {
            const float4 a0 = *(const float4 *)&xs[buf][kk][ty * 4];
            const float4 a1 = *(const float4 *)&xs[buf][kk][64 + ty * 4];
            const float4 b0 = *(const float4 *)&ws[buf][kk][tx * 4];
            const float4 b1 = *(const float4 *)&ws[buf][kk][64 + tx * 4];
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (kt + 1 >= nk) break;
        buf ^= 1;
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (m >= n) continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t r = r0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (r >= rows) continue;
            float v = acc[i][j];
            if (bias) v += bias[r];
            if (act == CU_VACT_GELU_TANH) v = vis_gelu_tanh(v);
            else if (act == CU_VACT_GELU_ERF) v = vis_gelu_erf(v);
            if (add) v = add[m * ldadd + r] + v;
            y[m * ldy + r] = v;
        }
    }
}

extern "C" int cu_vis_gemm(cu_stream s, const cu_vmat *w, const float *x, int64_t ldx, int64_t n, const float *bias,
                           int act, const float *add, int64_t ldadd, float *y, int64_t ldy) {
    if (n <= 0 || w->rows <= 0) return (int)cudaGetLastError();
    const int64_t K = w->cols, ldw = w->cols;
    const int bf16 = w->fmt == CU_VFMT_BF16;
    const uintptr_t wal = bf16 ? 8 : 16;
    const bool vec = K % 4 == 0 && ldx % 4 == 0 && ldw % 4 == 0 && (uintptr_t)x % 16 == 0 &&
                     (uintptr_t)w->data % wal == 0;
    const dim3 grid((unsigned)((n + VG_M - 1) / VG_M), (unsigned)((w->rows + VG_N - 1) / VG_N));
    if (grid.y > 65535u || K > 0x7fffffff - VG_K) return (int)cudaErrorInvalidValue;
    if (bf16) {
        if (vec)
            k_vgemm<uint16_t, true><<<grid, VG_THREADS, 0, s>>>(x, ldx, (const uint16_t *)w->data, ldw, n, w->rows, (int)K, bias, act,
                                                                    add, ldadd, y, ldy);
        else
            k_vgemm<uint16_t, false><<<grid, VG_THREADS, 0, s>>>(x, ldx, (const uint16_t *)w->data, ldw, n, w->rows, (int)K, bias, act,
                                                                     add, ldadd, y, ldy);
    } else {
        if (vec)
            k_vgemm<float, true><<<grid, VG_THREADS, 0, s>>>(x, ldx, (const float *)w->data, ldw, n, w->rows, (int)K, bias, act,
                                                                   add, ldadd, y, ldy);
        else
            k_vgemm<float, false><<<grid, VG_THREADS, 0, s>>>(x, ldx, (const float *)w->data, ldw, n, w->rows, (int)K, bias, act,
                                                                    add, ldadd, y, ldy);
    }
    return (int)cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------- */
/* LayerNorm */

#define VLN_THREADS 256

/* the sum over the block (VLN_THREADS threads) in a fixed order; every thread gets it.
 * red: [VLN_THREADS / 32] shared */
__device__ __forceinline__ float vln_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* red's previous readers are done */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < VLN_THREADS / 32; i++) s += red[i];
    return s;
}

__global__ void __launch_bounds__(VLN_THREADS)
    k_vln(const float *x, int64_t d, const float *w, const float *b, float eps, float *y) {
    __shared__ float red[VLN_THREADS / 32];
    const float *r = x + (int64_t)blockIdx.x * d;
    float *o = y + (int64_t)blockIdx.x * d;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += VLN_THREADS) s += r[i];
    const float mean = vln_sum(s, red) / (float)d;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += VLN_THREADS) {
        const float e = r[i] - mean;
        v += e * e;
    }
    const float var = vln_sum(v, red) / (float)d;
    const float inv = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < d; i += VLN_THREADS) o[i] = (r[i] - mean) * inv * w[i] + b[i];
}

extern "C" int cu_vis_layernorm(cu_stream s, const float *x, int64_t n, int64_t d, const float *w, const float *b,
                                float eps, float *y) {
    if (n <= 0) return (int)cudaGetLastError();
    if (n > 0x7fffffff) return (int)cudaErrorInvalidValue;
    k_vln<<<(unsigned)n, VLN_THREADS, 0, s>>>(x, d, w, b, eps, y);
    return (int)cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------- */
/* rotary */

__global__ void k_vrope(float *qkv, int64_t n, int nh, int hd, const float *cs, const float *sn) {
    const int half = hd / 2;
    const int64_t H = (int64_t)nh * hd, total = n * 2 * nh * half;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(u % half);
        int64_t rest = u / half;
        const int h = (int)(rest % nh);
        rest /= nh;
        const int part = (int)(rest % 2); /* 0: q, 1: k */
        const int64_t t = rest / 2;
        float *xr = qkv + t * 3 * H + part * H + (int64_t)h * hd;
        const float *c = cs + t * hd, *sv = sn + t * hd;
        const float x0 = xr[j], x1 = xr[j + half];
        /* as the host writes it: two products, then the sum (no fused multiply-add) */
        xr[j] = __fsub_rn(__fmul_rn(x0, c[j]), __fmul_rn(x1, sv[j]));
        xr[j + half] = __fadd_rn(__fmul_rn(x1, c[j + half]), __fmul_rn(x0, sv[j + half]));
    }
}

extern "C" int cu_vis_rope(cu_stream s, float *qkv, int64_t n, int nh, int hd, const float *cs, const float *sn) {
    const int64_t total = n * nh * hd; /* pairs: n * 2 * nh * hd / 2 */
    if (total <= 0) return (int)cudaGetLastError();
    int64_t blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536; /* grid-stride beyond */
    k_vrope<<<(unsigned)blocks, 256, 0, s>>>(qkv, n, nh, hd, cs, sn);
    return (int)cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------- */
/* attention */

#define VA_Q CU_VIS_ATT_Q /* queries a block */
#define VA_K 64           /* keys a tile */
#define VA_THREADS 256
#define VA_TLD (64 + 4)   /* the transposed tiles' row stride (float4 rows) */

/* shared floats: q and k transposed [hd][VA_TLD], v [64][hd], the tile's probabilities
 * transposed [VA_K][VA_TLD] */
static size_t va_smem_bytes(int hd) {
    return sizeof(float) * ((size_t)2 * hd * VA_TLD + (size_t)VA_K * hd + (size_t)VA_K * VA_TLD);
}

/* DJ = ceil(hd / 16): the output columns a thread holds per query. grid (tiles, heads).
 * Thread (ty, tx) = (t / 16, t % 16) takes queries ty*4 + i (i < 4): their scores against keys
 * tx*4 + j (j < 4) of each tile, their running maximum and sum (the same in the 16 threads of
 * a ty, a half warp: butterflies over it), and their output columns tx + 16 j (j < DJ). */
template <int DJ>
__global__ void __launch_bounds__(VA_THREADS)
    k_vattn(const float *qkv, const int64_t *tiles, int nh, int hd, float scale, float *o) {
    extern __shared__ __align__(16) float va_sm[];
    float *qt = va_sm;              /* [hd][VA_TLD]: qt[e][q] */
    float *kt = qt + hd * VA_TLD;   /* [hd][VA_TLD]: kt[e][k] */
    float *vs = kt + hd * VA_TLD;   /* [VA_K][hd] */
    float *pt = vs + VA_K * hd;     /* [VA_K][VA_TLD]: pt[k][q] */

    const int t = threadIdx.x, ty = t >> 4, tx = t & 15;
    const int64_t *tl = tiles + (int64_t)blockIdx.x * 3;
    const int64_t q0 = tl[0], s0 = tl[1], s1 = tl[2];
    const int h = blockIdx.y;
    const int64_t H = (int64_t)nh * hd, ldq = 3 * H;
    const float *qb = qkv + (int64_t)h * hd, *kb = qb + H, *vb = qb + 2 * H;

    const int lane = t & 31, warp = t >> 5; /* the tiles' loads: a warp a row, a lane a column */
    for (int q = warp; q < VA_Q; q += VA_THREADS / 32) {
        const int64_t qi = q0 + q;
        for (int e = lane; e < hd; e += 32) qt[e * VA_TLD + q] = qi < s1 ? qb[qi * ldq + e] : 0.0f;
    }
    float acc[4][DJ], mrow[4], lrow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        mrow[i] = -INFINITY;
        lrow[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < DJ; j++) acc[i][j] = 0.0f;
    }

    for (int64_t k0 = s0; k0 < s1; k0 += VA_K) {
        __syncthreads(); /* the previous tile's readers of kt, vs, pt are done */
        for (int kk = warp; kk < VA_K; kk += VA_THREADS / 32) {
            const int64_t kj = k0 + kk;
            const bool in = kj < s1;
            for (int e = lane; e < hd; e += 32) {
                kt[e * VA_TLD + kk] = in ? kb[kj * ldq + e] : 0.0f;
                vs[kk * hd + e] = in ? vb[kj * ldq + e] : 0.0f;
            }
        }
        __syncthreads();
        /* the scores */
        float sc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) sc[i][j] = 0.0f;
        for (int e = 0; e < hd; e++) {
            const float4 a = *(const float4 *)&qt[e * VA_TLD + ty * 4];
            const float4 b = *(const float4 *)&kt[e * VA_TLD + tx * 4];
            const float qv[4] = {a.x, a.y, a.z, a.w}, kv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) sc[i][j] = fmaf(qv[i], kv[j], sc[i][j]);
        }
        /* the running maximum and sum of each query, the probabilities into pt */
        float al[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sc[i][j] = k0 + tx * 4 + j < s1 ? sc[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, sc[i][j]);
            }
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mnew = fmaxf(mrow[i], mx); /* finite: every tile has a key of the segment */
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sc[i][j] = expf(sc[i][j] - mnew);
                sum += sc[i][j];
            }
            /* a butterfly: every lane gets the same bits (each step adds the same two values) */
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            al[i] = expf(mrow[i] - mnew); /* 0 on the first tile */
            lrow[i] = lrow[i] * al[i] + sum;
            mrow[i] = mnew;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            *(float4 *)&pt[(tx * 4 + j) * VA_TLD + ty * 4] = make_float4(sc[0][j], sc[1][j], sc[2][j], sc[3][j]);
        __syncthreads();
        /* acc = acc * alpha + p v */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < DJ; j++) acc[i][j] *= al[i];
        const int64_t left = s1 - k0;
        const int kn = left < VA_K ? (int)left : VA_K;
        for (int kk = 0; kk < kn; kk++) {
            const float4 a = *(const float4 *)&pt[kk * VA_TLD + ty * 4];
            const float p[4] = {a.x, a.y, a.z, a.w};
            float vv[DJ];
#pragma unroll
            for (int j = 0; j < DJ; j++) {
                const int e = tx + 16 * j;
                vv[j] = e < hd ? vs[kk * hd + e] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < DJ; j++) acc[i][j] = fmaf(p[i], vv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t qi = q0 + ty * 4 + i;
        if (qi >= s1) continue;
        const float inv = 1.0f / lrow[i];
        float *orow = o + qi * H + (int64_t)h * hd;
#pragma unroll
        for (int j = 0; j < DJ; j++) {
            const int e = tx + 16 * j;
            if (e < hd) orow[e] = acc[i][j] * inv;
        }
    }
}

typedef void (*va_kernel)(const float *, const int64_t *, int, int, float, float *);

static va_kernel va_pick(int hd) {
    switch ((hd + 15) / 16) {
    case 1: return k_vattn<1>;
    case 2: return k_vattn<2>;
    case 3: return k_vattn<3>;
    case 4: return k_vattn<4>;
    case 5: return k_vattn<5>;
    case 6: return k_vattn<6>;
    case 7: return k_vattn<7>;
    case 8: return k_vattn<8>;
    default: return NULL;
    }
}

extern "C" int cu_vis_attention_init(int hd) {
    if (hd < 2 || hd % 2 || hd > CU_VIS_ATT_HD_MAX) return (int)cudaErrorInvalidValue;
    const size_t bytes = va_smem_bytes(hd);
    if (bytes <= 48 * 1024) return (int)cudaSuccess;
    return (int)cudaFuncSetAttribute(va_pick(hd), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

extern "C" int cu_vis_attention(cu_stream s, const float *qkv, int64_t n_tiles, const int64_t *tiles, int nh, int hd,
                                float *o) {
    if (hd < 2 || hd % 2 || hd > CU_VIS_ATT_HD_MAX || nh < 1 || nh > 65535 || n_tiles > 0x7fffffff)
        return (int)cudaErrorInvalidValue;
    if (n_tiles <= 0) return (int)cudaGetLastError();
    const dim3 grid((unsigned)n_tiles, (unsigned)nh);
    va_pick(hd)<<<grid, VA_THREADS, va_smem_bytes(hd), s>>>(qkv, tiles, nh, hd, 1.0f / sqrtf((float)hd), o);
    return (int)cudaGetLastError();
}
