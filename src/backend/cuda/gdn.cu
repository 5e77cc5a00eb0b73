/* ==== CUDA kernels: Gated DeltaNet (see cuda_kernels.h) ====
 *
 * A layer's linear attention: the causal conv and SiLU, the L2 norms of q and k, the delta
 * rule over each item's steps (state rows in registers) and the gated RMS norm.
 */
#include "backend/cuda/cu_common.cuh"

/* causal depthwise conv + SiLU of one channel over n tokens in place (col: the first token's
 * value, tokens cd apart), the window sv (the K - 1 inputs before, oldest first; left holding
 * the last K - 1) and taps from conv_t: one order of sums for every caller. K = 4 (Qwen3.5's
 * width): the window in registers, the inputs of 8 tokens loaded at once. */
#define CONV_THREADS 64
#define CONV_U 8
/* one token of a K = 4 channel: the window sv (oldest first), the taps, the input m */
__device__ __forceinline__ float conv4_one(const float (&sv)[3], const float (&tap)[4], float m) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 3; j++) acc += tap[j] * sv[j];
    acc += tap[3] * m;
    return acc / (1.0f + expf(-acc));
}
__device__ __forceinline__ void conv4_run(float *col, int64_t n, int64_t cd, float (&sv)[3], const float (&tap)[4]) {
    for (int64_t i = 0; i < n; i += CONV_U) {
        const int c = n - i < CONV_U ? (int)(n - i) : CONV_U;
        float mv[CONV_U];
#pragma unroll
        for (int u = 0; u < CONV_U; u++) mv[u] = u < c ? col[(i + u) * cd] : 0.0f;
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            if (u >= c) break;
            col[(i + u) * cd] = conv4_one(sv, tap, mv[u]);
            sv[0] = sv[1], sv[1] = sv[2], sv[2] = mv[u];
        }
    }
}

/* K = 4 from a window win (3 values cd apart) and the channel's taps (4, cd apart); the
 * window after the last token into out where it is not NULL */
__device__ __forceinline__ void conv4_from(float *col, int64_t n, int64_t cd, const float *win, const float *taps,
                                           float *out) {
    float sv[3], tap[4];
#pragma unroll
    for (int j = 0; j < 3; j++) sv[j] = win[j * cd];
#pragma unroll
    for (int j = 0; j < 4; j++) tap[j] = taps[j * cd];
    conv4_run(col, n, cd, sv, tap);
    if (out)
#pragma unroll
        for (int j = 0; j < 3; j++) out[j * cd] = sv[j];
}

/* any K: the window in st ([K - 1] values cd apart), updated in place */
__device__ __forceinline__ void conv_run(float *col, int64_t n, int64_t cd, float *st, const float *taps, int K) {
    for (int64_t i = 0; i < n; i++) {
        float *m = col + i * cd;
        const float mv = *m;
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += taps[j * cd] * st[j * cd];
        acc += taps[(K - 1) * cd] * mv;
        for (int j = 0; j + 1 < K - 1; j++) st[j * cd] = st[(j + 1) * cd];
        if (K > 1) st[(K - 2) * cd] = mv;
        *m = acc / (1.0f + expf(-acc));
    }
}

/* a thread per (item, channel), the item's tokens in order */
__global__ void __launch_bounds__(CONV_THREADS) k_gdn_conv(cu_plan p, cu_gdn_args a) {
    pdl_wait();
    const int it = blockIdx.x;
    const int64_t ch = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= a.cd) return;
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0;
    float *st = a.conv_state + (size_t)p.slot[it] * a.conv_stride + ch;
    float *col = a.qkv + t0 * a.cd + ch;
    if (a.K == 4) conv4_from(col, n, a.cd, st, a.conv_t + ch, st);
    else conv_run(col, n, a.cd, st, a.conv_t + ch, a.K);
}

/* The conv of a step cut into the chunked rule's chunks (a thread per (chunk, channel), so
 * that a long item's tokens run in parallel): each chunk's window is saved first (save
 * [n_chunks][K - 1][cd], the chunk workspace): the K - 1 inputs before it, which the conv
 * overwrites, or for an item's first chunk the state, which its last chunk rewrites; then
 * each chunk runs from its window
 * in the same order of sums as k_gdn_conv, and an item's last chunk leaves its window in the
 * state. K = 4 only (others take k_gdn_conv). */
__global__ void k_gdn_conv_save(cu_plan p, cu_gdn_args a) {
    pdl_wait();
    const int c = blockIdx.x;
    const int it = a.chunks[4 * c + 2];
    const int64_t ch = (int64_t)blockIdx.y * blockDim.x + threadIdx.x, t0 = a.chunks[4 * c];
    if (ch >= a.cd) return;
    float *sv = a.chunk_ws + (size_t)c * (a.K - 1) * a.cd + ch;
    if (t0 == p.item_t0[it]) { /* the item's first chunk: the state (its last chunk rewrites it) */
        const float *st = a.conv_state + (size_t)p.slot[it] * a.conv_stride + ch;
        for (int j = 0; j < a.K - 1; j++) sv[j * a.cd] = st[j * a.cd];
        return;
    }
    for (int j = 0; j < a.K - 1; j++) sv[j * a.cd] = a.qkv[(t0 - (a.K - 1) + j) * a.cd + ch];
}

__global__ void __launch_bounds__(CONV_THREADS) k_gdn_conv_chunk(cu_plan p, cu_gdn_args a) {
    pdl_wait();
    const int c = blockIdx.x, it = a.chunks[4 * c + 2];
    const int64_t ch = (int64_t)blockIdx.y * blockDim.x + threadIdx.x, t0 = a.chunks[4 * c], n = a.chunks[4 * c + 1];
    if (ch >= a.cd) return;
    const bool last = t0 + n == p.item_t0[it + 1];
    float *st = a.conv_state + (size_t)p.slot[it] * a.conv_stride + ch;
    const float *win = a.chunk_ws + (size_t)c * (a.K - 1) * a.cd + ch;
    conv4_from(a.qkv + t0 * a.cd + ch, n, a.cd, win, a.conv_t + ch, last ? st : NULL);
}

static void cu_gdn_conv_chunked(cu_stream s, const cu_plan *p, const cu_gdn_args *a) {
    dim3 g((unsigned)a->n_chunks, (unsigned)((a->cd + CONV_THREADS - 1) / CONV_THREADS));
    launch_pdl(k_gdn_conv_save, g, dim3(CONV_THREADS), 0, s, *p, *a);
    launch_pdl(k_gdn_conv_chunk, g, dim3(CONV_THREADS), 0, s, *p, *a);
}

/* the gated RMSNorm's scale of a head's Dv outputs o (a warp; k_gdn_gnorm's order, which
 * k_gdn_dec repeats), and one output gated */
__device__ __forceinline__ float gdn_gnorm_scale(const float *o, int Dv, float eps) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int r = lane; r < Dv; r += 32) ss = fmaf(o[r], o[r], ss);
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)Dv + eps);
}
__device__ __forceinline__ float gdn_gated(float o, float rs, float w, float z) { return o * rs * w * siluf_(z); }

/* the L2 norms of every token's q and k heads, in place (q also by 1 / sqrt(Dk)): a warp per
 * (token, key head), n of them, blockDim.x / 32 a block */
__global__ void k_gdn_qknorm(cu_gdn_args a, int64_t n) {
    pdl_wait();
    const int64_t wi = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wi >= n) return;
    const int64_t t = wi / a.Hk;
    const int g = (int)(wi % a.Hk), lane = threadIdx.x & 31;
    for (int which = 0; which < 2; which++) {
        float *v = a.qkv + t * a.cd + (which ? a.kd : 0) + (int64_t)g * a.Dk;
        const float r = gdn_l2_scale(v, a.Dk, which == 0);
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

/* One token's step of a lane's state rows (k_gdn_recur's and k_gdn_dec's one arithmetic):
 * decay, the error k.S of its two columns, the update and the output q.S, each dot product
 * summed over the lane's rows (even and odd apart) and then over the lanes 4, 8 and 16 apart */
template <int RP>
__device__ __forceinline__ void gdn_token(float (&S0)[RP], float (&S1)[RP], const float (&q)[RP], const float (&k)[RP],
                                          float2 v, float beta, float alpha, float &o0, float &o1) {
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
    o0 = o2[0][0] + o2[0][1], o1 = o2[1][0] + o2[1][1];
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        o0 += __shfl_xor_sync(FULL, o0, o);
        o1 += __shfl_xor_sync(FULL, o1, o);
    }
}
/* a token's beta and decay alpha from its b and a */
__device__ __forceinline__ void gdn_gates(float bt, float at, float dtb, float nea, float &beta, float &alpha) {
    beta = sigmoidf_(bt);
    alpha = expf(nea * softplusf_(at + dtb));
}

template <int RP>
__global__ void __launch_bounds__(32 * GDN_WARPS) k_gdn_recur(cu_plan p, cu_gdn_args a, int CL) {
    pdl_wait();
    extern __shared__ float4 gsh4[];
    float *gsh = (float *)gsh4; /* [2][CL][gdn_token_floats(Dk)]: CL <= GDN_CHUNK tokens a chunk */
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
    const int64_t t0 = p.item_t0[it], n = p.item_t0[it + 1] - t0, nch = (n + CL - 1) / CL;
    const float dtb = a.dt_bias[h], nea = a.neg_exp_a[h];
    /* chunk c's inputs into buffer c & 1: q and k as 16-byte pieces, v likewise, b and a as words */
    auto issue = [&](int64_t c) {
        float *buf = gsh + (c & 1) * CL * TS;
        const int64_t tc = t0 + c * CL;
        const int nu = n - c * CL < CL ? (int)(n - c * CL) : CL;
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
        float *buf = gsh + (c & 1) * CL * TS;
        const int nu = n - c * CL < CL ? (int)(n - c * CL) : CL;
        if (tid < nu) { /* b, a into beta and the decay alpha, off the steps' chain */
            float *ba = buf + tid * TS + 2 * Dk + 8 * GDN_WARPS;
            gdn_gates(ba[0], ba[1], dtb, nea, ba[0], ba[1]);
        }
        __syncthreads();
        for (int u = 0; u < nu; u++) {
            const float *tk = buf + u * TS;
            const int64_t t = t0 + c * CL + u;
            float q[RP], k[RP];
#pragma unroll
            for (int m = 0; m < RP; m++) {
                q[m] = r0 + m < Dk ? tk[r0 + m] : 0.0f;
                k[m] = r0 + m < Dk ? tk[Dk + r0 + m] : 0.0f;
            }
            const float2 v = on ? *(const float2 *)(tk + 2 * Dk + (i0 - c0)) : make_float2(0.0f, 0.0f);
            const float beta = tk[2 * Dk + 8 * GDN_WARPS], alpha = tk[2 * Dk + 8 * GDN_WARPS + 1];
            float o0, o1;
            gdn_token(S0, S1, q, k, v, beta, alpha, o0, o1);
            if (ra == 0 && on) *(float2 *)(a.mix + t * a.vd + (int64_t)h * Dv + i0) = make_float2(o0, o1);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int m = 0; m < RP; m++)
        if (on && r0 + m < Dk) *(float2 *)(Sg + (size_t)(r0 + m) * Dv + i0) = make_float2(S0[m], S1[m]);
}

/* The delta rule of a decode step (every item one token): k_gdn_recur's rows a lane and
 * arithmetic (gdn_token, so the same bits), without its chunks, and with four columns a lane
 * (two gdn_tokens: a column's sums are its own) so that four lanes read 64 bytes of a state
 * row as one run. The token's q and k rows, v columns, b and a are read straight from global
 * memory (the four lanes of a row share them through L1) instead of through shared memory:
 * the chunk copies' index arithmetic was most of k_gdn_recur's instructions at one token, and
 * the state's read and write are what is left. A warp takes 16 columns.
 * FUSED 0: a block of GDN_DEC_WARPS warps (GDN_DEC_COLS columns) on q and k normed in place
 * (k_gdn_qknorm before, k_gdn_gnorm after). FUSED 1 (few items: the launches, not the state,
 * set the time): a block a whole value head (Dv <= GDN_DEC_MAX_DV), each warp scaling q and
 * k by their norms itself (gdn_l2_scale: k_gdn_qknorm's sums) and the head's outputs meeting
 * in shared memory for the gated norm (gdn_gnorm_scale: k_gdn_gnorm's), the same bits as
 * the three launches in one; at 64 items it was 1.1x slower than them (a block waits on its
 * slowest warp before the norm). FUSED 2: 1 with k_gdn_conv's step inside (K = 4): the
 * block convolves its head's v channels and its key head's q and k channels (conv4_one, the
 * same bits) into shared memory; a key head's windows move on once all its value heads'
 * blocks have read them (the last to count itself in a.counts writes them). FUSED 1 and 2
 * read what no kernel right before them writes (the state, the windows, the weights) before
 * their PDL wait: the rule's state only they write, a whole layer before.
 * The count's atomic is issued as soon as the block's windows are used, and its answer read
 * only at the end, where the last block writes its q and k windows (kept in shared memory
 * until then), so that its round trip is not on the rule's chain.
 * Shared memory: [Dv] the head's outputs; FUSED 2 then q [Dk], k [Dk], v [Dv] and the q and
 * k channels' next windows [3][2 Dk] (gdn_dec_conv_smem). (Writing every channel's next
 * window at the end, as the q and k ones are, tidier, spilled 136 bytes of the 27B form's
 * 128 registers: measured by ptxas, not kept.)
 * QI (FUSED, a.xq): the gated outputs also as the MLX integer form's limbs for out_proj, a
 * warp a group from shared memory (a form of its own: the 27B one spills 136 bytes, which
 * the others must not). */
/* FUSED 0's warps a block: 8, so that a 128-column head's block reads whole state rows (512
 * bytes each) where 4 read half of each, the other half in a block launched much later (H100,
 * 2026-12-06, decode at 48 / 64 sequences 1,613 / 1,965 -> 1,622-1,628 / 1,985-1,988 tok/s;
 * the same sums, so the same bits) */
#ifndef GDN_DEC_WARPS
#define GDN_DEC_WARPS 8
#endif
#define GDN_DEC_COLS (16 * GDN_DEC_WARPS)
#define GDN_DEC_MAX_DV 256
#define GDN_DEC_MAX_RP 16  /* FUSED: key dims up to 128 (more rows a lane spill under its 128 registers) */
#define GDN_DEC_FUSED_MAX CU_GDN_DEC_FUSED_MAX /* decode steps of up to this many items take FUSED */
#define GDN_CONV_PER 2       /* FUSED 2: channels a thread convolves at most (2 Dk + Dv <= 4 Dv) */
/* a decode lane's part of a head's state Sh [Dk][Dv]: rows r0 .. r0 + RP - 1, columns i0 .. i0 + 3
 * (on: i0 < Dv), S[c][m] column i0 + c of row r0 + m (zeros off the state); and back */
template <int RP>
__device__ __forceinline__ void gdn_lane_load(const float *Sh, int Dk, int Dv, int r0, int i0, bool on, float (&S)[4][RP]) {
#pragma unroll
    for (int m = 0; m < RP; m++) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (on && r0 + m < Dk) v = *(const float4 *)(Sh + (size_t)(r0 + m) * Dv + i0);
        S[0][m] = v.x, S[1][m] = v.y, S[2][m] = v.z, S[3][m] = v.w;
    }
}
template <int RP>
__device__ __forceinline__ void gdn_lane_store(float *Sh, int Dk, int Dv, int r0, int i0, bool on, const float (&S)[4][RP]) {
#pragma unroll
    for (int m = 0; m < RP; m++)
        if (on && r0 + m < Dk) *(float4 *)(Sh + (size_t)(r0 + m) * Dv + i0) = make_float4(S[0][m], S[1][m], S[2][m], S[3][m]);
}
/* the lane's rows r0 .. r0 + RP - 1 of q and k (zeros past Dk); Dk and r0 are multiples of 4
 * where RP is (cu_gdn_prepare): whole 16-byte pieces */
template <int RP>
__device__ __forceinline__ void gdn_lane_qk(const float *qr, const float *kr, int Dk, int r0, float (&q)[RP], float (&k)[RP]) {
#pragma unroll
    for (int m = 0; m < RP; m += (RP % 4 == 0 ? 4 : 1)) {
        if constexpr (RP % 4 == 0) {
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f), y = x;
            if (r0 + m < Dk) x = *(const float4 *)(qr + r0 + m), y = *(const float4 *)(kr + r0 + m);
            q[m] = x.x, q[m + 1] = x.y, q[m + 2] = x.z, q[m + 3] = x.w;
            k[m] = y.x, k[m + 1] = y.y, k[m + 2] = y.z, k[m + 3] = y.w;
        } else {
            q[m] = r0 + m < Dk ? qr[r0 + m] : 0.0f;
            k[m] = r0 + m < Dk ? kr[r0 + m] : 0.0f;
        }
    }
}

template <int RP, int FUSED, bool QI = false>
__global__ void __launch_bounds__(FUSED ? 32 * GDN_DEC_MAX_DV / 16 : 32 * GDN_DEC_WARPS) k_gdn_dec(cu_plan p, cu_gdn_args a) {
    if constexpr (!FUSED) pdl_wait();
    extern __shared__ float gdn_o[]; /* FUSED: [Dv] the head's outputs */
    const int it = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int ra = lane >> 2, Dk = a.Dk, Dv = a.Dv, g = h / (a.Hv / a.Hk), r0 = ra * RP;
    const int i0 = (FUSED ? 0 : blockIdx.z * GDN_DEC_COLS) + w * 16 + 4 * (lane & 3); /* columns i0 .. i0 + 3 */
    const bool on = i0 < Dv;                                                            /* Dv is a multiple of 4 */
    const int slot = p.slot[it];
    float *Sg = a.rec_state + (size_t)slot * a.rec_stride + (size_t)h * Dv * Dk;
    float S[4][RP];
    gdn_lane_load(Sg, Dk, Dv, r0, i0, on, S);
    const int64_t t = p.item_t0[it];
    float *cq = gdn_o + Dv, *ck = cq + Dk, *cv = ck + Dk; /* FUSED 2: the convolved inputs */
    /* FUSED 2: channel j < 2 Dk is q's (j < Dk) or k's of key head g, then v's of head h */
    auto conv_ch = [&](int j) -> int64_t {
        return j < Dk ? (int64_t)g * Dk + j : j < 2 * Dk ? a.kd + (int64_t)g * Dk + (j - Dk) : 2 * a.kd + (int64_t)h * Dv + (j - 2 * Dk);
    };
    float win[GDN_CONV_PER][3], tap[GDN_CONV_PER][4];
    if constexpr (FUSED == 2) {
        const float *ws = a.conv_state + (size_t)slot * a.conv_stride;
#pragma unroll
        for (int u = 0; u < GDN_CONV_PER; u++) {
            const int j = threadIdx.x + u * blockDim.x;
            const int64_t ch = conv_ch(j);
#pragma unroll
            for (int q = 0; q < 4; q++) tap[u][q] = j < 2 * Dk + Dv ? a.conv_t[q * a.cd + ch] : 0.0f;
#pragma unroll
            for (int q = 0; q < 3; q++) win[u][q] = j < 2 * Dk + Dv ? ws[q * a.cd + ch] : 0.0f;
        }
    }
    const float dtb = a.dt_bias[h], nea = a.neg_exp_a[h];
    const int r = w * 16 + lane; /* FUSED: the gated norm's column of this lane (lanes 0-15) */
    const float nw = FUSED && lane < 16 && r < Dv ? a.norm_w[r] : 0.0f;
    if constexpr (FUSED) pdl_wait();
    const float zr = FUSED && lane < 16 && r < Dv ? a.z[t * a.vd + (int64_t)h * Dv + r] : 0.0f;
    const float bt = a.b[t * a.Hv + h], at = a.a[t * a.Hv + h];
    const float *qr = a.qkv + t * a.cd + (int64_t)g * Dk, *kr = qr + a.kd;
    const int ratio = a.Hv / a.Hk; /* FUSED 2: value heads a key head */
    int seen = ratio - 1;          /* FUSED 2, thread 0: the blocks of the key head counted before this one */
    __shared__ int last;
    float *qkw = cv + Dv; /* FUSED 2: the q and k channels' next windows [3][2 Dk], for the end */
    if constexpr (FUSED == 2) {
        float xin[GDN_CONV_PER];
#pragma unroll
        for (int u = 0; u < GDN_CONV_PER; u++) {
            const int j = threadIdx.x + u * blockDim.x;
            xin[u] = j < 2 * Dk + Dv ? a.qkv[t * a.cd + conv_ch(j)] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GDN_CONV_PER; u++) {
            const int j = threadIdx.x + u * blockDim.x;
            if (j < 2 * Dk + Dv) cq[j] = conv4_one(win[u], tap[u], xin[u]); /* cq, ck, cv are one run */
        }
        /* the block's windows are read (their values used) and its inputs in: its v channels'
         * windows move on now, and thread 0 counts the block in; the key head's last block to
         * count itself moves its q and k windows on (and leaves the count at 0), at the end
         * (the count's round trip off the rule's chain) */
        __syncthreads();
        if (threadIdx.x == 0 && ratio > 1) seen = atomicAdd(a.counts + it * a.Hk + g, 1);
        float *ws = a.conv_state + (size_t)slot * a.conv_stride;
#pragma unroll
        for (int u = 0; u < GDN_CONV_PER; u++) {
            const int j = threadIdx.x + u * blockDim.x;
            if (j >= 2 * Dk && j < 2 * Dk + Dv) {
                const int64_t ch = conv_ch(j);
                ws[ch] = win[u][1], ws[a.cd + ch] = win[u][2], ws[2 * a.cd + ch] = xin[u];
            } else if (j < 2 * Dk)
                qkw[j] = win[u][1], qkw[2 * Dk + j] = win[u][2], qkw[4 * Dk + j] = xin[u];
        }
        qr = cq, kr = ck;
    }
    float q[RP], k[RP];
    gdn_lane_qk(qr, kr, Dk, r0, q, k);
    if constexpr (FUSED) { /* k_gdn_qknorm's in-place products, in registers */
        const float sq = gdn_l2_scale(qr, Dk, true), sk = gdn_l2_scale(kr, Dk, false);
#pragma unroll
        for (int m = 0; m < RP; m++) q[m] *= sq, k[m] *= sk;
    }
    const float *vr = FUSED == 2 ? cv : a.qkv + t * a.cd + 2 * a.kd + (int64_t)h * Dv;
    const float4 v = on ? *(const float4 *)(vr + i0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float beta, alpha, o[4];
    gdn_gates(bt, at, dtb, nea, beta, alpha);
    gdn_token(S[0], S[1], q, k, make_float2(v.x, v.y), beta, alpha, o[0], o[1]);
    gdn_token(S[2], S[3], q, k, make_float2(v.z, v.w), beta, alpha, o[2], o[3]);
    float *mo = a.mix + t * a.vd + (int64_t)h * Dv;
    if (ra == 0 && on) *(float4 *)((FUSED ? gdn_o : mo) + i0) = make_float4(o[0], o[1], o[2], o[3]);
    gdn_lane_store(Sg, Dk, Dv, r0, i0, on, S);
    if constexpr (FUSED) { /* the gated norm of the head */
        if (FUSED == 2 && threadIdx.x == 0) {
            last = seen == ratio - 1;
            if (last && ratio > 1) a.counts[it * a.Hk + g] = 0;
        }
        __syncthreads();
        const float rs = gdn_gnorm_scale(gdn_o, Dv, a.eps);
        float y = 0.0f;
        if (lane < 16 && r < Dv) {
            y = gdn_gated(gdn_o[r], rs, nw, zr);
            mo[r] = y;
            if (a.xs) put_parts(a.xs, a.parts, (int64_t)p.n_tokens * a.vd, t * a.vd + (int64_t)h * Dv + r, y);
        }
        if constexpr (QI) { /* the limbs (a.xq): the head's outputs through shared memory, then a warp a group */
            __syncthreads(); /* every thread has read gdn_o for rs */
            if (lane < 16 && r < Dv) gdn_o[r] = y;
            __syncthreads();
            if (w < Dv / a.qgroup) {
                const int per = a.qgroup / 32;
                float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (i < per) v[i] = gdn_o[w * a.qgroup + lane + 32 * i];
                const int64_t c0 = (int64_t)h * Dv + w * a.qgroup;
                qi_put_warp(a.xq, a.vd / 32, t, c0 / a.qgroup, v, per, c0 + lane, a.qbits);
            }
        }
    }
    if constexpr (FUSED == 2) /* the key head's last block: its q and k windows */
        if (last) {
            float *ws = a.conv_state + (size_t)slot * a.conv_stride;
            for (int j = threadIdx.x; j < 2 * Dk; j += blockDim.x) {
                const int64_t ch = conv_ch(j);
                ws[ch] = qkw[j], ws[a.cd + ch] = qkw[2 * Dk + j], ws[2 * a.cd + ch] = qkw[4 * Dk + j];
            }
        }
}

/* the rows a lane of k_gdn_recur holds (Dk / 8 rounded up to a kernel's), 0: none */
static int gdn_rows(int Dk) {
    const int r = (Dk + 7) / 8;
    return r <= 2 ? 2 : r <= 4 ? 4 : r <= 8 ? 8 : r <= 16 ? 16 : r <= 32 ? 32 : 0;
}

/* ---- the delta rule of a decode step of many items, streamed: k_gdn_decs ----
 * FUSED 0's arithmetic on the same lanes' rows (gdn_token: the same bits), on resident blocks
 * (one an SM) that take the step's (item, value head) units in turn: block b units b, b +
 * grid, ... A producer thread copies each unit's state (Dk x Dv fp32, one run of the slot) and
 * its token's q and k rows and v columns into a ring of stages in shared memory (bulk copies
 * on the stage's mbarrier), so that the next units' state is in flight while the block's
 * GDN_DEC_WARPS consumer warps step this one. FUSED 0's blocks each read their state, wait for
 * it, step it and write it, and a block's read starts only once a block before it has left:
 * few bytes in flight where the state is most of a step's bytes. The consumers free a stage as
 * soon as its values are in their registers and write the new state and the outputs straight
 * to global memory; the units' gates come from global memory. The first stages' state goes out
 * before the PDL wait (only this kernel writes it, a layer before); q, k and v after it.
 * Shapes (gdn_decs_stages > 0): Dv <= GDN_DEC_COLS (a block's columns), every piece 16-byte
 * aligned, at least 2 stages in GDN_DS_SMEM bytes. q and k normed in place before
 * (k_gdn_qknorm), the gated norm after (k_gdn_gnorm), as FUSED 0. */
/* whether decode steps of more than CU_GDN_DEC_FUSED_MAX items take k_gdn_decs (a build may set
 * 0: k_gdn_dec's FUSED 0 blocks) */
#ifndef CU_GDN_DECS
#define CU_GDN_DECS 1
#endif
#define GDN_DS_SMEM (200 * 1024) /* the ring's shared memory at most */
#define GDN_DS_THREADS (32 * GDN_DEC_WARPS + 32)
/* a stage's bytes: the state, then q [Dk], k [Dk], v [Dv]; 128-byte aligned stages */
__host__ __device__ static inline int gdn_decs_stage(int Dk, int Dv) { return ((Dk * Dv + 2 * Dk + Dv) * 4 + 127) / 128 * 128; }
/* the ring's stages for this shape (up to 4), or 0 where k_gdn_decs does not take it */
static int gdn_decs_stages(int Dk, int Dv) {
    if (Dv > GDN_DEC_COLS || Dk % 4 != 0 || Dv % 4 != 0 || gdn_rows(Dk) % 4 != 0) return 0;
    const int n = GDN_DS_SMEM / gdn_decs_stage(Dk, Dv);
    return n < 2 ? 0 : n > 4 ? 4 : n;
}
static size_t gdn_decs_smem(int Dk, int Dv) {
    return (size_t)gdn_decs_stages(Dk, Dv) * gdn_decs_stage(Dk, Dv) + 128 + 16 * 4;
}
template <int RP>
__global__ void __launch_bounds__(GDN_DS_THREADS, 1) k_gdn_decs(cu_plan p, cu_gdn_args a, int stages) {
    static_assert(RP % 4 == 0, "q and k as 16-byte pieces");
    extern __shared__ float4 gds4[];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, Dk = a.Dk, Dv = a.Dv, Hv = a.Hv;
    const int SB = gdn_decs_stage(Dk, Dv);
    const uint32_t base = (smem_u32(gds4) + 127u) & ~127u, full = base + stages * SB, empty = full + 8 * stages;
    const uint8_t *ring = (const uint8_t *)gds4 + (base - smem_u32(gds4));
    const int64_t units = (int64_t)p.n_items * Hv;
    const int nu = blockIdx.x < units ? (int)((units - blockIdx.x + gridDim.x - 1) / gridDim.x) : 0;
    if (tid == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, GDN_DEC_WARPS); /* a consumer warp's lane 0 each */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const uint32_t sbytes = (uint32_t)(Dk * Dv * 4), qbytes = (uint32_t)(Dk * 4), vbytes = (uint32_t)(Dv * 4);
    if (w == GDN_DEC_WARPS) { /* the producer */
        if (lane != 0) return;
        auto state = [&](int i) {
            const int64_t u = blockIdx.x + (int64_t)i * gridDim.x;
            const int s = i % stages;
            const float *Sg = a.rec_state + (size_t)p.slot[u / Hv] * a.rec_stride + (size_t)(u % Hv) * Dv * Dk;
            bulk_load(base + s * SB, Sg, sbytes, full + 8 * s);
        };
        auto inputs = [&](int i) {
            const int64_t u = blockIdx.x + (int64_t)i * gridDim.x, t = p.item_t0[u / Hv];
            const int h = (int)(u % Hv), g = h / (Hv / a.Hk), s = i % stages;
            const float *qr = a.qkv + t * a.cd + (int64_t)g * Dk;
            const uint32_t st = base + s * SB + sbytes;
            bulk_load(st, qr, qbytes, full + 8 * s);
            bulk_load(st + qbytes, qr + a.kd, qbytes, full + 8 * s);
            bulk_load(st + 2 * qbytes, a.qkv + t * a.cd + 2 * a.kd + (int64_t)h * Dv, vbytes, full + 8 * s);
        };
        const int pre = nu < stages ? nu : stages;
        for (int i = 0; i < pre; i++) {
            mbar_expect_tx(full + 8 * i, sbytes + 2 * qbytes + vbytes);
            state(i);
        }
        pdl_wait(); /* q, k and v are the predecessors' */
        for (int i = 0; i < pre; i++) inputs(i);
        for (int i = pre; i < nu; i++) {
            const int s = i % stages;
            mbar_wait(empty + 8 * s, ((i / stages) & 1) ^ 1);
            mbar_expect_tx(full + 8 * s, sbytes + 2 * qbytes + vbytes);
            state(i);
            inputs(i);
        }
        return;
    }
    pdl_wait(); /* the gates are the predecessors', and mix their input until they are done */
    const int ra = lane >> 2, r0 = ra * RP, i0 = w * 16 + 4 * (lane & 3); /* FUSED 0's rows and columns */
    const bool on = i0 < Dv;
    for (int i = 0; i < nu; i++) {
        const int64_t u = blockIdx.x + (int64_t)i * gridDim.x;
        const int it = (int)(u / Hv), h = (int)(u % Hv), s = i % stages;
        const int64_t t = p.item_t0[it];
        const float bt = a.b[t * Hv + h], at = a.a[t * Hv + h], dtb = a.dt_bias[h], nea = a.neg_exp_a[h];
        mbar_wait(full + 8 * s, (i / stages) & 1);
        const float *st = (const float *)(ring + (size_t)s * SB), *qs = st + Dk * Dv, *ks = qs + Dk;
        float S[4][RP], q[RP], k[RP];
        gdn_lane_load(st, Dk, Dv, r0, i0, on, S);
        gdn_lane_qk(qs, ks, Dk, r0, q, k);
        const float4 v = on ? *(const float4 *)(ks + Dk + i0) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * s); /* the warp's values are in its registers */
        float beta, alpha, o[4];
        gdn_gates(bt, at, dtb, nea, beta, alpha);
        gdn_token(S[0], S[1], q, k, make_float2(v.x, v.y), beta, alpha, o[0], o[1]);
        gdn_token(S[2], S[3], q, k, make_float2(v.z, v.w), beta, alpha, o[2], o[3]);
        if (ra == 0 && on) *(float4 *)(a.mix + t * a.vd + (int64_t)h * Dv + i0) = make_float4(o[0], o[1], o[2], o[3]);
        gdn_lane_store(a.rec_state + (size_t)p.slot[it] * a.rec_stride + (size_t)h * Dv * Dk, Dk, Dv, r0, i0, on, S);
    }
}

/* k_gdn_dec<., 2>'s shared memory: outputs [Dv], q, k [Dk], v [Dv], the q and k windows [3][2 Dk] */
static size_t gdn_dec_conv_smem(int Dk, int Dv) { return (size_t)(2 * Dv + 8 * Dk) * sizeof(float); }

/* gated RMSNorm: norm(o) * w * silu(z), a warp per (token, value head), n of them,
 * blockDim.x / 32 a block */
__global__ void k_gdn_gnorm(cu_gdn_args a, int64_t n) {
    pdl_wait();
    const int64_t wi = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (wi >= n) return;
    const int64_t t = wi / a.Hv;
    const int h = (int)(wi % a.Hv), lane = threadIdx.x & 31;
    float *o = a.mix + t * a.vd + (int64_t)h * a.Dv;
    const float *z = a.z + t * a.vd + (int64_t)h * a.Dv;
    const float rs = gdn_gnorm_scale(o, a.Dv, a.eps);
    for (int r = lane; r < a.Dv; r += 32) o[r] = gdn_gated(o[r], rs, a.norm_w[r], z[r]);
}

/* warps a block of the norms' kernels before and after the chunked rule (each warp's
 * arithmetic is the one-warp blocks', so the same bits): 8 since an H100 measured it against
 * 1 (2026-12-05: the 8,192-token bf16 prefill 8,775 -> 8,836 tok/s); the per-step rule after
 * them keeps 1 whatever this says (8 made it slower) */
#ifndef GDN_NORM_WARPS
#define GDN_NORM_WARPS 8
#endif

/* for chunks of cl tokens (a decode step's one token takes little, so more blocks share an SM) */
static size_t gdn_smem(int Dk, int cl) { return (size_t)2 * cl * gdn_token_floats(Dk) * sizeof(float); }


/* how a step's per-step rule runs: k_gdn_recur, k_gdn_dec (a decode step), or k_gdn_dec's
 * fused forms (a decode step of few items: the norms inside; and the conv) */
enum { GDN_RECUR, GDN_DEC, GDN_DEC_FUSED, GDN_DEC_CONV };

/* the per-step rule of RP rows a lane, as `how` says */
template <int RP>
static void gdn_rule(cu_stream s, dim3 gr, const cu_plan *p, const cu_gdn_args *a, int how, size_t shm, int cl) {
    if constexpr (RP <= GDN_DEC_MAX_RP) {
        const dim3 fb(32 * ((a->Dv + 15) / 16));
        if (how == GDN_DEC_FUSED) {
            launch_pdl(a->xq ? k_gdn_dec<RP, 1, true> : k_gdn_dec<RP, 1>, dim3(gr.x, gr.y), fb, (size_t)a->Dv * sizeof(float), s,
                       *p, *a);
            return;
        }
        if (how == GDN_DEC_CONV) {
            launch_pdl(a->xq ? k_gdn_dec<RP, 2, true> : k_gdn_dec<RP, 2>, dim3(gr.x, gr.y), fb, gdn_dec_conv_smem(a->Dk, a->Dv),
                       s, *p, *a);
            return;
        }
    }
    if constexpr (RP % 4 == 0 && RP <= GDN_DEC_MAX_RP)
        if (how == GDN_DEC && CU_GDN_DECS && gdn_decs_stages(a->Dk, a->Dv) > 0 &&
            ((uintptr_t)a->rec_state | (uintptr_t)a->qkv) % 16 == 0 && a->rec_stride % 4 == 0 && a->cd % 4 == 0 &&
            a->kd % 4 == 0) { /* (the bulk copies' pieces 16-byte aligned) */
            const int64_t units = (int64_t)p->n_items * a->Hv, sms = mm_sms();
            launch_pdl(k_gdn_decs<RP>, dim3((unsigned)(units < sms ? units : sms)), dim3(GDN_DS_THREADS),
                       gdn_decs_smem(a->Dk, a->Dv), s, *p, *a, gdn_decs_stages(a->Dk, a->Dv));
            return;
        }
    if (how == GDN_DEC) launch_pdl(k_gdn_dec<RP, 0>, dim3(gr.x, gr.y, (unsigned)((a->Dv + GDN_DEC_COLS - 1) / GDN_DEC_COLS)),
                        dim3(32 * GDN_DEC_WARPS), 0, s, *p, *a);
    else launch_pdl(k_gdn_recur<RP>, gr, dim3(32 * GDN_WARPS), shm, s, *p, *a, cl);
}

extern "C" int cu_gdn(cu_stream s, const cu_plan *p, const cu_gdn_args *a, int max_item_tokens) {
    if (p->n_tokens <= 0) return 0;
    int how = max_item_tokens == 1 && p->n_tokens == p->n_items && a->n_chunks == 0 ? GDN_DEC : GDN_RECUR;
    if (how == GDN_DEC && p->n_items <= GDN_DEC_FUSED_MAX && a->Dv <= GDN_DEC_MAX_DV && gdn_rows(a->Dk) <= GDN_DEC_MAX_RP)
        how = GDN_DEC_FUSED;
    /* the conv inside too: K = 4, the counts there, the channels within the threads'
     * GDN_CONV_PER each */
    const int fthreads = 32 * ((a->Dv + 15) / 16);
    if (how == GDN_DEC_FUSED && a->K == 4 && a->counts && 2 * a->Dk + a->Dv <= GDN_CONV_PER * fthreads && a->Dk % 4 == 0)
        how = GDN_DEC_CONV;
    const bool fused = how == GDN_DEC_FUSED || how == GDN_DEC_CONV; /* the norms inside */
    cu_gdn_args af = *a; /* the split or the limbs only where the fused kernel makes them */
    if (!fused || a->vd % 32 != 0) af.xs = NULL;
    if (!fused || !a->xq || p->n_tokens > QI_TP || (a->qgroup != 32 && a->qgroup != 64 && a->qgroup != 128) ||
        (a->qbits != 4 && a->qbits != 8) || a->Dv % a->qgroup != 0 || a->vd % 32 != 0 || (a->Dv + 15) / 16 < a->Dv / a->qgroup)
        af.xq = NULL;
    if (af.xq) af.xs = NULL;
    a = &af;
    if (how != GDN_DEC_CONV) {
        if (a->n_chunks > 0 && a->K == 4) {
            cu_gdn_conv_chunked(s, p, a);
        } else {
            dim3 gc((unsigned)p->n_items, (unsigned)((a->cd + CONV_THREADS - 1) / CONV_THREADS));
            launch_pdl(k_gdn_conv, gc, dim3(CONV_THREADS), 0, s, *p, *a);
        }
    }
    /* the q/k norms only before the per-step rule (the chunked rule's k_gdn_cprep normalizes
     * the rows it reads itself), one warp a block: 8 a block made the rule after them 1.4x
     * slower on one long prompt (8.7 -> 12.2 ms a 27B layer at 8,192 tokens on the H200),
     * though the norms alone were faster; the gated norm after the chunked rule takes
     * GDN_NORM_WARPS */
    const int nw = a->n_chunks > 0 ? GDN_NORM_WARPS : 1;
    const int64_t nqk = (int64_t)p->n_tokens * a->Hk, ng = (int64_t)p->n_tokens * a->Hv;
    if (!fused && a->n_chunks == 0) launch_pdl(k_gdn_qknorm, dim3((unsigned)nqk), dim3(32), 0, s, *a, nqk);
    dim3 gr((unsigned)p->n_items, (unsigned)a->Hv, (unsigned)((a->Dv + 8 * GDN_WARPS - 1) / (8 * GDN_WARPS)));
    const int cl = max_item_tokens < GDN_CHUNK ? (max_item_tokens > 0 ? max_item_tokens : 1) : GDN_CHUNK;
    const size_t shm = gdn_smem(a->Dk, cl);
    switch (a->n_chunks > 0 ? -1 : gdn_rows(a->Dk)) {
    case -1: cu_gdn_chunked(s, p, a); break;
    case 2: gdn_rule<2>(s, gr, p, a, how, shm, cl); break;
    case 4: gdn_rule<4>(s, gr, p, a, how, shm, cl); break;
    case 8: gdn_rule<8>(s, gr, p, a, how, shm, cl); break;
    case 16: gdn_rule<16>(s, gr, p, a, how, shm, cl); break;
    default: gdn_rule<32>(s, gr, p, a, how, shm, cl); break;
    }
    if (!fused) launch_pdl(k_gdn_gnorm, dim3((unsigned)((ng + nw - 1) / nw)), dim3(32 * nw), 0, s, *a, ng);
    return (a->xs ? CU_MM_XS : 0) | (a->xq ? CU_MM_XQ : 0);
}

/* key dims at most 256 (a lane's registers hold 32 rows); key and value dims multiples of 4
 * (16-byte copies); the shared memory of the largest kernel allowed */
extern "C" int cu_gdn_prepare(int Dk, int Dv) {
    if (Dk < 4 || Dk % 4 != 0 || gdn_rows(Dk) == 0 || Dv < 4 || Dv % 4 != 0) return -1;
    const int shm = (int)gdn_smem(Dk, GDN_CHUNK), dshm = (int)gdn_decs_smem(Dk, Dv);
    if (gdn_decs_stages(Dk, Dv) > 0) {
        cudaFuncSetAttribute(k_gdn_decs<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, dshm);
        cudaFuncSetAttribute(k_gdn_decs<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, dshm);
        cudaFuncSetAttribute(k_gdn_decs<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, dshm);
    }
    cudaFuncSetAttribute(k_gdn_recur<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    cudaFuncSetAttribute(k_gdn_recur<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm);
    return cudaFuncSetAttribute(k_gdn_recur<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, shm) == cudaSuccess ? 0 : -1;
}
