/* ==== CUDA kernels: what the attention files share (attention.cu, attention_wgmma.cu) ==== */
#ifndef ST_BACKEND_CUDA_ATTENTION_CUH
#define ST_BACKEND_CUDA_ATTENTION_CUH

#include "backend/cuda/cu_common.cuh"

/* the pool index of (item it, layer li, K (which 0) or V (1), KV head h, position pos); the
 * block by 32-bit division (a position is below 2^32: no pool holds more), a fraction of the
 * instructions of a 64-bit one */
__device__ __forceinline__ size_t kv_index(const cu_kv &kv, const cu_plan &p, int it, int li, int which, int h,
                                           int64_t pos) {
    const uint32_t pu = (uint32_t)pos, bs = (uint32_t)kv.block_size;
    const int64_t b = p.blocks[p.block_t0[it] + pu / bs], off = pu % bs;
    return (size_t)b * ((size_t)kv.n_full * 2 * kv.nkv * kv.block_size * kv.hd) +
           ((size_t)(li * 2 + which) * kv.nkv + h) * ((size_t)kv.block_size * kv.hd) + (size_t)off * kv.hd;
}

/* tile k of the items' tiles of qt tokens: its item (-1 past the last), first token and tokens */
__device__ __forceinline__ int att_tile_at(const cu_plan &p, int qt, int64_t k, int64_t *t0, int64_t *nt) {
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

/* two floats as a bf16 pair (a in the low half) */
__device__ __forceinline__ uint32_t bf2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&h;
}


/* ---- the `bf16` prompt kernels' shared steps (k_attn_fa, k_attn_fw): a block's query rows
 * are (token, query head) pairs of a tile, row r the token t0 + r / G and the query head
 * h G + r % G of KV head h; the scores are in units of log2; positions go by in chunks of 64 */

/* row r's dims e0 .. e0 + 7 scaled and rounded to bf16 (zeros for rows past the tile's) */
__device__ __forceinline__ uint4 fa_q8(const cu_attn_args &a, int hd, int64_t t0, int r, int rows, int G, int h,
                                       int e0, float scale) {
    uint4 o = make_uint4(0, 0, 0, 0);
    if (r < rows) {
        const float *src = a.q + (t0 + r / G) * 2 * a.nh * hd + (int64_t)(h * G + r % G) * 2 * hd + e0;
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __fmul_rn(src[k], scale);
        o = make_uint4(bf2(v[0], v[1]), bf2(v[2], v[3]), bf2(v[4], v[5]), bf2(v[6], v[7]));
    }
    return o;
}

/* 8 dims of a position's K and V from an fp32 pool (K at ki, V vstep on) rounded to bf16;
 * zeros where not `in` */
__device__ __forceinline__ void fa_kv8(const cu_kv &kv, size_t ki, int64_t vstep, bool in, uint4 *ok, uint4 *ov) {
    *ok = *ov = make_uint4(0, 0, 0, 0);
    if (in) {
        const float *kp = (const float *)kv.base + ki, *vp = kp + vstep;
        const float4 k0 = *(const float4 *)kp, k1 = *(const float4 *)(kp + 4);
        const float4 v0 = *(const float4 *)vp, v1 = *(const float4 *)(vp + 4);
        *ok = make_uint4(bf2(k0.x, k0.y), bf2(k0.z, k0.w), bf2(k1.x, k1.y), bf2(k1.z, k1.w));
        *ov = make_uint4(bf2(v0.x, v0.y), bf2(v0.z, v0.w), bf2(v1.x, v1.y), bf2(v1.z, v1.w));
    }
}

/* A chunk's K and V (positions c0 .. c0 + 63, zeros past last) into shared memory kb and vb,
 * as bf16, by 256 threads: thread i takes row i / 4, its 8-dim pieces pc = i % 4, + 4, ...,
 * each at byte offset at(row, pc) of both buffers (the kernel's layout); so a thread's row
 * has its place in the paged pool found once a chunk. From a bf16 pool by cp.async (the
 * caller commits and waits), from an fp32 pool converted and stored by the thread. */
template <int HD, bool BF16KV, typename At>
__device__ __forceinline__ void kv_chunk_load(const cu_kv &kv, const cu_plan &p, int it, int li, int h, int64_t c0,
                                              int64_t last, uint8_t *kb, uint8_t *vb, At at) {
    const int64_t vstep = (int64_t)kv.nkv * kv.block_size * HD;
    const int r = threadIdx.x >> 2;
    const int64_t pos = c0 + r;
    const bool in = pos <= last;
    const size_t k0 = in ? kv_index(kv, p, it, li, 0, h, pos) : 0;
#pragma unroll
    for (int j = 0; j < HD / 32; j++) {
        const int pc = 4 * j + (threadIdx.x & 3);
        const size_t ki = in ? k0 + (size_t)pc * 8 : 0;
        const uint32_t off = at(r, pc);
        if (BF16KV) {
            cp_async16(kb + off, (const uint16_t *)kv.base + ki, in ? 16 : 0);
            cp_async16(vb + off, (const uint16_t *)kv.base + ki + vstep, in ? 16 : 0);
        } else {
            uint4 ok, ov;
            fa_kv8(kv, ki, vstep, in, &ok, &ov);
            *(uint4 *)(kb + off) = ok;
            *(uint4 *)(vb + off) = ov;
        }
    }
}

/* One chunk of the online softmax for a warp's 16 rows, the scores as an MMA's accumulator
 * fragments (s[n][e]: row g, or g + 8 for e >= 2, position c0 + 8 n + 2 t + (e & 1)): where
 * `mask`, positions past a row's (pos0 for row g, pos1 for g + 8) are masked; the running
 * maxima and sums (m, l) move on; the weights become P V's A operand in bf16 (pa[k]: positions
 * 16 k .. 16 k + 15); al0, al1: the factors of the output's rows. The first chunk always holds
 * position 0 <= every row's, so the maxima are finite. */
__device__ __forceinline__ void fa_softmax(float (&s)[8][4], int64_t c0, bool mask, int64_t pos0, int64_t pos1, int t,
                                           float &m0, float &m1, float &l0, float &l1, uint32_t (&pa)[4][4],
                                           float &al0, float &al1) {
    if (mask) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t kp = c0 + 8 * n + 2 * t + (e & 1);
                if (kp > (e >= 2 ? pos1 : pos0)) s[n][e] = -INFINITY;
            }
    }
    float mc0 = m0, mc1 = m1;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        mc0 = fmaxf(mc0, fmaxf(s[n][0], s[n][1]));
        mc1 = fmaxf(mc1, fmaxf(s[n][2], s[n][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mc0 = fmaxf(mc0, __shfl_xor_sync(FULL, mc0, off));
        mc1 = fmaxf(mc1, __shfl_xor_sync(FULL, mc1, off));
    }
    al0 = exp2f(m0 - mc0), al1 = exp2f(m1 - mc1);
    m0 = mc0, m1 = mc1;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const float p0 = exp2f(s[n][0] - mc0), p1 = exp2f(s[n][1] - mc0);
        const float p2 = exp2f(s[n][2] - mc1), p3 = exp2f(s[n][3] - mc1);
        r0 += p0 + p1, r1 += p2 + p3;
        pa[n / 2][(n & 1) * 2] = bf2(p0, p1);
        pa[n / 2][(n & 1) * 2 + 1] = bf2(p2, p3);
    }
    l0 = l0 * al0 + r0, l1 = l1 * al1 + r1;
}

/* a row's sums over its quad's four lanes (the sums' last step) */
__device__ __forceinline__ float fa_quad_sum(float l) {
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) l += __shfl_xor_sync(FULL, l, off);
    return l;
}

/* the gated outputs of dims d, d + 1 of token tok's query head jh: x, y (normalized) times
 * the sigmoid of the gate (q's second half) */
__device__ __forceinline__ void fa_put(const cu_attn_args &a, int hd, int64_t tok, int jh, int d, float x, float y) {
    const float2 gv = *(const float2 *)(a.q + tok * 2 * a.nh * hd + (int64_t)jh * 2 * hd + hd + d);
    float2 out;
    out.x = x * sigmoidf_(gv.x);
    out.y = y * sigmoidf_(gv.y);
    *(float2 *)(a.mix + tok * a.nh * hd + (int64_t)jh * hd + d) = out;
}

#endif
