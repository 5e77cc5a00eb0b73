/* ==== CUDA kernels: attention (see cuda_kernels.h) ====
 *
 * q/k norms and RoPE with K and V into the paged pool (k_attn_prep), then paged causal
 * attention with the sigmoid gate: on the CUDA cores (k_attention) or the tensor cores
 * (k_attn_tc), the same chunking and merge order; in the `bf16` precision, steps holding a
 * prompt take k_attn_fa (flash attention over many queries a block).
 */
#include "backend/cuda/attention.cuh"

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

/* A block per token: angles, q and k heads (a warp each), K and V into the pool. A head of
 * up to 32 * PREP_HELD dims (a lane's dims lane, lane + 32, ...) is read once into registers
 * with the norm's weights and (a KV head) its V row, every load in flight at once, normed
 * there in norm_rope's order, and rotated through the warp's row of shared memory (a dim's
 * partner half a rotation away may be another lane's); wider heads take norm_rope in place. */
#define PREP_HELD 8
__device__ __forceinline__ void prep_head(float *x, const float *w, const float *v, int hd, int rope_dim, float eps,
                                          const float *cs, const float *sn, float *row, const cu_kv &kv, size_t ki,
                                          size_t vi, bool to_pool) {
    const int lane = threadIdx.x & 31;
    float xv[PREP_HELD], wv[PREP_HELD], vv[PREP_HELD];
#pragma unroll
    for (int s = 0; s < PREP_HELD; s++) {
        const int e = lane + 32 * s;
        xv[s] = e < hd ? x[e] : 0.0f;
        wv[s] = e < hd ? w[e] : 0.0f;
        vv[s] = to_pool && e < hd ? v[e] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int s = 0; s < PREP_HELD; s++)
        if (lane + 32 * s < hd) ss += xv[s] * xv[s];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int s = 0; s < PREP_HELD; s++)
        if (lane + 32 * s < hd) row[lane + 32 * s] = xv[s] * r * wv[s];
    __syncwarp();
    const int half = rope_dim / 2;
#pragma unroll
    for (int s = 0; s < PREP_HELD; s++) {
        const int e = lane + 32 * s;
        if (e >= hd) break;
        float y = row[e];
        if (e < half) y = y * cs[e] - row[e + half] * sn[e];
        else if (e < rope_dim) y = y * cs[e - half] + row[e - half] * sn[e - half];
        x[e] = y;
        if (to_pool) {
            if (kv.bf16) {
                ((uint16_t *)kv.base)[ki + e] = f2bf16(y);
                ((uint16_t *)kv.base)[vi + e] = f2bf16(vv[s]);
            } else {
                ((float *)kv.base)[ki + e] = y;
                ((float *)kv.base)[vi + e] = vv[s];
            }
        }
    }
}

__global__ void k_attn_prep(cu_plan p, cu_attn_args a, cu_kv kv) {
    pdl_wait();
    extern __shared__ float sh[];
    float *cs = sh, *sn = sh + a.rope_dim / 2; /* then a row of hd a warp */
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
    float *row = sh + 2 * (a.rope_dim / 2) + warp * a.hd;
    if (a.hd <= 32 * PREP_HELD) {
        for (int j = warp; j < a.nh + a.nkv; j += nw) {
            if (j < a.nh) {
                prep_head(a.q + t * 2 * a.nh * a.hd + (int64_t)j * 2 * a.hd, a.q_norm, NULL, a.hd, a.rope_dim, a.eps, cs, sn,
                          row, kv, 0, 0, false);
            } else {
                const int h = j - a.nh;
                prep_head(a.k + t * a.nkv * a.hd + (int64_t)h * a.hd, a.k_norm, a.v + t * a.nkv * a.hd + (int64_t)h * a.hd,
                          a.hd, a.rope_dim, a.eps, cs, sn, row, kv, kv_index(kv, p, it, a.li, 0, h, pos),
                          kv_index(kv, p, it, a.li, 1, h, pos), true);
            }
            __syncwarp(); /* the row is read before the warp's next head fills it */
        }
        return;
    }
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
    const size_t shm = (2 * (size_t)(a->rope_dim / 2) + (a->hd <= 32 * PREP_HELD ? (size_t)(threads / 32) * a->hd : 0)) * sizeof(float);
    launch_pdl(k_attn_prep, dim3((unsigned)p->n_tokens), dim3(threads), shm, s, *p, *a, *kv);
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
#define ATT_CH CU_ATT_CH /* positions a chunk */
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

__device__ __forceinline__ int att_tile(const cu_plan &p, int qt, int64_t *t0, int64_t *nt) {
    return att_tile_at(p, qt, blockIdx.x, t0, nt);
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

/* atc_tile's shared memory for up to 8 * nq queries (nq query tiles) */
static size_t atc_smem(int hd, int qp, int kp, int nq = ATT_Q / 8) {
    const size_t qs = (size_t)hd + ATC_PAD, vs = ATT_CH + ATC_PAD, qm = (size_t)8 * nq;
    const size_t kv = (size_t)ATT_CH * qs > (size_t)hd * vs ? (size_t)ATT_CH * qs : (size_t)hd * vs;
    return qm * 8 + ATT_CH * 8 + 4 * qm * 4 + qm * (ATT_CH + 1) * 4 + 2 * ((size_t)qp * qm * qs + (size_t)qp * qm * vs + (size_t)kp * kv);
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

/* One tile's attention for KV head h: tokens t0 .. t0 + nt - 1 of item it. SPLIT: chunk cs alone
 * (positions cs * ATT_CH ..), its raw results out to part instead of merged: for query qi,
 * part[qi * (hd + 2)] = mc, [+ 1] = lc, [+ 2 + e] = oc_e (k_attn_merge merges them as this
 * does: from m = -inf, l = 0, o = 0 every chunk in order, so the same bits). NQ: the
 * query tiles of 8 it takes at most (6: ATT_Q; 1: a decode unit's G <= 8 queries). */
template <int QP, int KP, bool SPLIT, int NQ = ATT_Q / 8>
__device__ __forceinline__ void atc_tile(const cu_plan &p, const cu_attn_args &a, const cu_kv &kv, int it, int64_t t0,
                                         int64_t nt, int h, int64_t cs, float *part) {
    constexpr int QM = 8 * NQ, NS = NQ < 3 ? NQ : 3; /* queries at most; query tiles a scoring warp */
    static_assert(NQ <= 6, "two rows of four scoring warps take the query tiles");
    extern __shared__ int64_t sh64[];
    __syncthreads(); /* a block taking tiles in turn: the last one's reads of shared memory are done */
    const int hd = a.hd, G = a.nh / a.nkv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3, QS = hd + ATC_PAD, VS = ATT_CH + ATC_PAD, H8 = hd / 8;
    int64_t *qpos = sh64, *krow = sh64 + QM; /* krow: the chunk's K rows in the pool (V: + vstep) */
    float *sm_m = (float *)(krow + ATT_CH), *sm_l = sm_m + QM, *sm_a = sm_l + QM, *sm_b = sm_a + QM;
    float *st = sm_b + QM;                                 /* scores [QM][ATT_CH + 1] */
    uint16_t *qs = (uint16_t *)(st + QM * (ATT_CH + 1));   /* queries [QP][QM][QS] */
    uint16_t *ws = qs + QP * QM * QS;                      /* weights [QP][QM][VS] */
    uint16_t *kvs = ws + QP * QM * VS;                     /* K [KP][ATT_CH][QS], then V^T [KP][hd][VS] */
    const int kvstride = ATT_CH * QS > hd * VS ? ATT_CH * QS : hd * VS;
    const int Q = (int)nt * G, nqt = (Q + 7) / 8;
    const int64_t pos_first = p.pos0[it] + (t0 - p.item_t0[it]), pos_last = pos_first + nt - 1;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = tid; i < QM * H8; i += ATT_THREADS) {
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
        for (int q = 0; q < QP; q++) *(uint4 *)(qs + q * QM * QS + qi * QS + e0) = o[q];
    }
    if (tid < QM) {
        sm_m[tid] = -INFINITY;
        sm_l[tid] = 0.0f;
        qpos[tid] = pos_first + (tid < Q ? tid / G : 0);
    }
    const bool pv = 32 * warp < hd; /* this warp's dims 32 warp .. + 31 of the output */
    float o[2][NQ][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int n = 0; n < NQ; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    const int64_t vstep = (int64_t)kv.nkv * kv.block_size * hd; /* a V row from its K row */
    const int64_t c_first = SPLIT ? cs * ATT_CH : 0, c_last = SPLIT ? c_first : pos_last;
    for (int64_t c0 = c_first; c0 <= c_last; c0 += ATT_CH) {
        __syncthreads(); /* the previous chunk's V^T, weights and rows are read */
        if (tid < ATT_CH) krow[tid] = c0 + tid <= pos_last ? (int64_t)kv_index(kv, p, it, a.li, 0, h, c0 + tid) : -1;
        __syncthreads();
        /* a bf16 pool's K and V taken as one part (KP 1): loaded as stored and stored as they came
         * (a bf16 value is its own one part; V's pairs by a byte permute), V's rows prefetched into
         * L2 as K's loads go out, so that its loads after the scores meet L2: the same bits */
        const bool raw = KP == 1 && kv.bf16;
        if (raw) {
            const uint16_t *kb = (const uint16_t *)kv.base;
            uint4 kraw[ATC_KI];
#pragma unroll
            for (int k = 0; k < ATC_KI; k++) {
                const int i = tid + k * ATT_THREADS, r = i / H8, e0 = (i % H8) * 8;
                kraw[k] = make_uint4(0u, 0u, 0u, 0u);
                if (i < ATT_CH * H8 && krow[r] >= 0) kraw[k] = *(const uint4 *)(kb + krow[r] + e0);
            }
            /* V's rows on their way into L2 while K's come and the scores run */
#pragma unroll
            for (int k = 0; k < ATC_KI; k++) {
                const int i = tid + k * ATT_THREADS, r = i / H8, e0 = (i % H8) * 8;
                if (i < ATT_CH * H8 && krow[r] >= 0 && e0 % 64 == 0)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(kb + krow[r] + vstep + e0));
            }
#pragma unroll
            for (int k = 0; k < ATC_KI; k++) {
                const int i = tid + k * ATT_THREADS, r = i / H8, e0 = (i % H8) * 8;
                if (i >= ATT_CH * H8) break;
                *(uint4 *)(kvs + r * QS + e0) = kraw[k];
            }
        } else { /* K rows as parts, [part][position][dim]: every load in flight before the first store */
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
        { /* scores: warp w takes position tile w % 4 and query tiles (w / 4) * NS .. + NS - 1 */
            const int mt = warp & 3, n0 = (warp >> 2) * NS;
            float sc[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
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
                    for (int n = 0; n < NS; n++) {
                        if (n0 + n >= nqt) break;
                        uint32_t bf[QP][2];
#pragma unroll
                        for (int i = 0; i < QP; i++) {
                            const uint16_t *qb = qs + i * QM * QS + ((n0 + n) * 8 + g) * QS + ks * 16 + 2 * t;
                            bf[i][0] = *(const uint32_t *)qb, bf[i][1] = *(const uint32_t *)(qb + 8);
                        }
                        atc_mma<QP, KP>(sc[n], af, bf);
                    }
                }
#pragma unroll
                for (int n = 0; n < NS; n++) {
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
        if (raw) { /* dim e of the two rows: half e % 2 of word e / 2 of each */
            const uint16_t *kb = (const uint16_t *)kv.base;
            uint4 vraw[ATC_KI / 2][2];
#pragma unroll
            for (int k = 0; k < ATC_KI / 2; k++) {
                const int i = tid + k * ATT_THREADS, pr = (i % (ATT_CH / 2)) * 2, e0 = (i / (ATT_CH / 2)) * 8;
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    vraw[k][u] = make_uint4(0u, 0u, 0u, 0u);
                    if (i < (ATT_CH / 2) * H8 && krow[pr + u] >= 0) vraw[k][u] = *(const uint4 *)(kb + krow[pr + u] + vstep + e0);
                }
            }
#pragma unroll
            for (int k = 0; k < ATC_KI / 2; k++) {
                const int i = tid + k * ATT_THREADS, pr = (i % (ATT_CH / 2)) * 2, e0 = (i / (ATT_CH / 2)) * 8;
                if (i >= (ATT_CH / 2) * H8) break;
                const uint32_t w0[4] = {vraw[k][0].x, vraw[k][0].y, vraw[k][0].z, vraw[k][0].w};
                const uint32_t w1[4] = {vraw[k][1].x, vraw[k][1].y, vraw[k][1].z, vraw[k][1].w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    *(uint32_t *)(kvs + (e0 + e) * VS + pr) = __byte_perm(w0[e / 2], w1[e / 2], e % 2 ? 0x7632 : 0x5410);
            }
        } else {
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
                    ws[i * QM * VS + q * VS + lane] = h0;
                    ws[i * QM * VS + q * VS + lane + 32] = h1;
                    r0 -= bf16f(h0), r1 -= bf16f(h1);
                }
                const float lc = warp_sum(__fadd_rn(e0, e1));
                if (SPLIT) {
                    if (lane == 0) part[q * (hd + 2)] = mc, part[q * (hd + 2) + 1] = lc;
                } else if (lane == 0) {
                    const float m = sm_m[q], mn = fmaxf(m, mc), ca = expf(m - mn), cb = expf(mc - mn);
                    sm_l[q] = __fmaf_rn(sm_l[q], ca, __fmul_rn(lc, cb));
                    sm_m[q] = mn;
                    sm_a[q] = ca;
                    sm_b[q] = cb;
                }
            }
        __syncthreads();
        if (pv) { /* the chunk's output for this warp's 32 dims and every query tile, then the merge */
            float oc[2][NQ][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int n = 0; n < NQ; n++) oc[mi][n][0] = oc[mi][n][1] = oc[mi][n][2] = oc[mi][n][3] = 0.0f;
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
                for (int n = 0; n < NQ; n++) {
                    if (n >= nqt) break;
                    uint32_t bw[QP][2];
#pragma unroll
                    for (int i = 0; i < QP; i++) {
                        const uint16_t *wb = ws + i * QM * VS + (n * 8 + g) * VS + ks * 16 + 2 * t;
                        bw[i][0] = *(const uint32_t *)wb, bw[i][1] = *(const uint32_t *)(wb + 8);
                    }
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) atc_mma<QP, KP>(oc[mi][n], av[mi], bw);
                }
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int n = 0; n < NQ; n++) {
                    if (n >= nqt) break;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = n * 8 + 2 * t + (e & 1);
                        if (SPLIT) {
                            const int dim = 32 * warp + 16 * mi + g + (e >= 2 ? 8 : 0);
                            if (qi < Q && dim < hd) part[qi * (hd + 2) + 2 + dim] = oc[mi][n][e];
                        } else if (qi < Q && c0 <= qpos[qi])
                            o[mi][n][e] = __fmaf_rn(o[mi][n][e], sm_a[qi], __fmul_rn(oc[mi][n][e], sm_b[qi]));
                    }
                }
        }
    }
    if (SPLIT) return;
    __syncthreads();
    float *ot = (float *)qs; /* the outputs before the gate, [QM][hd]: qs, ws and kvs (free now) hold them */
    if (pv)
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int n = 0; n < NQ; n++) {
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
        const float y = __fmul_rn(__fmul_rn(ot[i], 1.0f / sm_l[qi]), sigmoidf_(gate));
        a.mix[tt * a.nh * hd + (int64_t)j * hd + dim] = y;
        if (a.xs) put_parts(a.xs, a.xs_parts, (int64_t)p.n_tokens * a.nh * hd, tt * a.nh * hd + (int64_t)j * hd + dim, y);
    }
}

template <int QP, int KP>
__global__ void __launch_bounds__(ATT_THREADS, 1) k_attn_tc(cu_plan p, cu_attn_args a, cu_kv kv, int qt) {
    pdl_wait();
    int64_t t0 = 0, nt = 0;
    const int it = att_tile(p, qt, &t0, &nt);
    if (it < 0) return;
    atc_tile<QP, KP, false>(p, a, kv, it, t0, nt, blockIdx.y, 0, NULL);
}

/* ---- decode steps, split over the context (flash-decoding): k_attn_split, k_attn_merge ----
 * In a step of one token an item (a decode step), each (item, KV head, chunk of ATT_CH
 * positions) is a unit of work: a block of k_attn_split computes it as k_attn_tc computes
 * that chunk (atc_tile's SPLIT) and leaves the chunk's raw results in the scratch
 * (a.split: [chunk][nh][hd + 2], item i's chunks after those of the items before it); then
 * k_attn_merge merges each query's chunks in order with k_attn_tc's own arithmetic and
 * applies the gate. So a decode step's results are k_attn_tc's bits, but its chunks run side
 * by side instead of one after another. The grids do not depend on the positions (a captured
 * decode graph replays at every length): k_attn_split's blocks take the units in turn; where
 * the step's chunks outnumber the scratch's (sequences sharing a prefix's blocks), its blocks
 * take whole (item, KV head) tiles as k_attn_tc does and k_attn_merge does nothing. */
/* the step's chunks before item `upto` (into *before) and in all, by the whole block (every
 * thread calls it; blockDim.x a multiple of 32, at most 1,024): one pass over the items
 * shared by the threads (every thread walking them all was most of k_attn_merge's time: 30
 * us a layer at 64 items on an H100, Nsight Compute) */
__device__ int64_t dec_chunks_block(const cu_plan &p, int upto, int64_t *before) {
    __shared__ int64_t red[2][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int64_t b = 0, all = 0;
    for (int i = threadIdx.x; i < p.n_items; i += blockDim.x) {
        const int64_t c = p.pos0[i] / ATT_CH + 1;
        all += c;
        if (i < upto) b += c;
    }
    for (int o = 16; o > 0; o >>= 1) {
        b += __shfl_xor_sync(FULL, b, o);
        all += __shfl_xor_sync(FULL, all, o);
    }
    __syncthreads(); /* red is free (a caller's earlier call is done with it) */
    if (lane == 0) red[0][w] = b, red[1][w] = all;
    __syncthreads();
    b = 0, all = 0;
    for (int i = 0; i < nw; i++) b += red[0][i], all += red[1][i];
    *before = b;
    return all;
}

template <int QP, int KP, int NQ>
__global__ void __launch_bounds__(ATT_THREADS, NQ == 1 ? 2 : 1) k_attn_split(cu_plan p, cu_attn_args a, cu_kv kv) {
    pdl_wait();
    int64_t none;
    const int64_t total = dec_chunks_block(p, 0, &none);
    const int G = a.nh / a.nkv;
    if (total > a.split_chunks) {
        for (int64_t u = blockIdx.x; u < (int64_t)p.n_items * a.nkv; u += gridDim.x) {
            const int it = (int)(u / a.nkv);
            atc_tile<QP, KP, false, NQ>(p, a, kv, it, p.item_t0[it], 1, (int)(u % a.nkv), 0, NULL);
        }
        return;
    }
    int it = 0;
    int64_t first = 0; /* item it's first chunk */
    for (int64_t u = blockIdx.x; u < total * a.nkv; u += gridDim.x) {
        const int64_t cg = u / a.nkv;
        const int h = (int)(u % a.nkv);
        while (cg >= first + p.pos0[it] / ATT_CH + 1) first += p.pos0[it] / ATT_CH + 1, it++;
        float *part = a.split + ((size_t)cg * a.nh + (size_t)h * G) * (a.hd + 2);
        atc_tile<QP, KP, true, NQ>(p, a, kv, it, p.item_t0[it], 1, h, cg - first, part);
    }
}

/* ---- decode steps, split over the context, streamed: k_attn_ring ----
 * k_attn_split's units and arithmetic (k_attn_merge merges its results: the same bits) for a
 * bf16 pool and up to 8 query heads a KV head, with the units' K and V streamed: each
 * resident block (one an SM) takes a run of consecutive units in the order (item, KV head,
 * chunk) and brings their K and V rows into shared memory by cp.async as stored, into a ring
 * of D chunks: chunk c + D's K goes out once chunk c's scores are done, chunk c + D - 1's V
 * once chunk c starts (chunk c - 1's P V done). V is read transposed by ldmatrix.trans, the
 * queries are split into their parts once a (item, KV head). k_attn_split brings each chunk's
 * rows in before its scores and its V after them, two blocks an SM: Nsight Compute saw it
 * reading a batch of 8 at 4,096 positions at 1.4 TB/s (H100), its warps waiting on loads
 * between the phases. mmv_bench ad (H100, the merge included, `bf16`): 8 items at 4,096
 * positions 0.105 -> 0.084 ms a layer (1.59 TB/s of K and V), 16 at 8,192 0.331 -> 0.277,
 * one at 32,768 0.144 -> 0.113 with a ring of 2; a ring of 3 no faster. */
#define ARING_PAD 8 /* bf16 of padding a K or V row: ldmatrix's 8 rows fall in distinct banks */
/* shared memory: K and V of D chunks [D][2][ATT_CH][hd + ARING_PAD], queries [QP][8][hd +
 * ARING_PAD], weights [QP][8][ATT_CH + ATC_PAD], scores [8][ATT_CH + 1] floats, pool rows
 * [D][ATT_CH]; at least atc_tile's (whole tiles where the scratch is too small) */
static size_t aring_smem(int hd, int qp, int d) {
    const size_t row = (size_t)(hd + ARING_PAD) * 2;
    const size_t n = 2 * (size_t)d * ATT_CH * row + (size_t)qp * 8 * row + (size_t)qp * 8 * (ATT_CH + ATC_PAD) * 2 +
                     8 * (ATT_CH + 1) * 4 + (size_t)d * ATT_CH * 8;
    const size_t whole = atc_smem(hd, qp, 1, 1);
    return n > whole ? n : whole;
}

/* a unit of the run: item it, KV head h, chunk c of the item's nch (first: the item's first
 * chunk among the step's) */
struct aring_unit {
    int it, h;
    int64_t c, nch, first;
};
/* unit u of the order (item, KV head, chunk); u below the step's units */
__device__ __forceinline__ aring_unit aring_at(const cu_plan &p, int nkv, int64_t u) {
    aring_unit k = {0, 0, 0, 1, 0};
    for (int it = 0; it < p.n_items; it++) {
        const int64_t nch = p.pos0[it] / ATT_CH + 1;
        if (u < nch * nkv) {
            k.it = it, k.h = (int)(u / nch), k.c = u % nch, k.nch = nch;
            return k;
        }
        u -= nch * nkv, k.first += nch;
    }
    return k;
}
__device__ __forceinline__ void aring_next(const cu_plan &p, int nkv, aring_unit &k) {
    if (++k.c < k.nch) return;
    k.c = 0;
    if (++k.h < nkv) return;
    k.h = 0, k.first += k.nch;
    if (++k.it < p.n_items) k.nch = p.pos0[k.it] / ATT_CH + 1;
}

template <int QP, int D>
__global__ void __launch_bounds__(ATT_THREADS, 1) k_attn_ring(cu_plan p, cu_attn_args a, cu_kv kv) {
    static_assert(D >= 2 && D * ATT_CH <= ATT_THREADS, "the prologue finds D chunks' rows at once");
    pdl_wait();
    int64_t none;
    const int64_t total = dec_chunks_block(p, 0, &none);
    if (total > a.split_chunks) { /* as k_attn_split: whole tiles */
        for (int64_t u = blockIdx.x; u < (int64_t)p.n_items * a.nkv; u += gridDim.x) {
            const int it = (int)(u / a.nkv);
            atc_tile<QP, 1, false, 1>(p, a, kv, it, p.item_t0[it], 1, (int)(u % a.nkv), 0, NULL);
        }
        return;
    }
    extern __shared__ int64_t sh64[];
    const int hd = a.hd, G = a.nh / a.nkv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3, RS = hd + ARING_PAD, VS = ATT_CH + ATC_PAD, H8 = hd / 8;
    uint16_t *kvs = (uint16_t *)sh64;                    /* [D][K, V][ATT_CH][RS] */
    uint16_t *qs = kvs + 2 * D * ATT_CH * RS;            /* [QP][8][RS] */
    uint16_t *ws = qs + QP * 8 * RS;                     /* [QP][8][VS] */
    float *st = (float *)(ws + QP * 8 * VS);             /* [8][ATT_CH + 1] */
    int64_t *krow = (int64_t *)(st + 8 * (ATT_CH + 1)); /* [D][ATT_CH]: a chunk's K rows in the pool (-1 past it) */
    const int64_t N = total * a.nkv, u0 = N * blockIdx.x / gridDim.x, u1 = N * (blockIdx.x + 1) / gridDim.x;
    if (u0 >= u1) return;
    const uint32_t kvs_sa = smem_u32(kvs);
    const int64_t vstep = (int64_t)kv.nkv * kv.block_size * hd; /* a V row from its K row */
    const uint16_t *pool = (const uint16_t *)kv.base;
    const float scale = 1.0f / sqrtf((float)hd);
    /* unit u (ring slot sl)'s pool rows into krow[sl], position i by the thread given i */
    auto rows = [&](const aring_unit &k, int64_t u, int sl, int i) {
        if (u < u1 && i >= 0 && i < ATT_CH) {
            const int64_t pos = k.c * ATT_CH + i;
            krow[sl * ATT_CH + i] = pos <= p.pos0[k.it] ? (int64_t)kv_index(kv, p, k.it, a.li, 0, k.h, pos) : -1;
        }
    };
    /* unit u's K (which 0) or V (1) rows into ring slot sl, a warp a row, as one group (empty past the run) */
    auto issue = [&](int64_t u, int sl, int which) {
        if (u < u1) {
            const uint32_t dst = kvs_sa + (uint32_t)((2 * sl + which) * ATT_CH * RS * 2);
            const int64_t *kr = krow + sl * ATT_CH;
            for (int r = warp; r < ATT_CH; r += ATT_THREADS / 32) {
                const int64_t at = kr[r];
                const uint16_t *src = at >= 0 ? pool + at + (which ? vstep : 0) : pool;
                for (int e = lane; e < H8; e += 32)
                    cp_async16_at(dst + (uint32_t)((r * RS + 8 * e) * 2), src + (at >= 0 ? 8 * e : 0), at >= 0 ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    aring_unit C = aring_at(p, a.nkv, u0), L = C; /* the unit computed; the next whose rows are found */
#pragma unroll
    for (int d = 0; d < D; d++) {
        rows(L, u0 + d, d, tid - d * ATT_CH);
        aring_next(p, a.nkv, L);
    }
    __syncthreads();
#pragma unroll
    for (int d = 0; d < D; d++) {
        issue(u0 + d, d, 0);
        if (d < D - 1) issue(u0 + d, d, 1);
    }
    int q_it = -1, q_h = -1; /* whose queries qs holds */
    int sl = 0;              /* u's ring slot */
    for (int64_t u = u0; u < u1; u++) {
        const int sv = sl == 0 ? D - 1 : sl - 1; /* the slot of u - 1 and of u + D - 1 */
        cp_async_wait<2 * (D - 1)>(); /* this thread's copies of u's K (later ones may be on their way) */
        __syncthreads();              /* everyone's; the last unit's P V is done */
        issue(u + D - 1, sv, 1);      /* into the V slot the last unit read */
        const int64_t c0 = C.c * ATT_CH, pos = p.pos0[C.it];
        if (C.it != q_it || C.h != q_h) { /* the queries as k_attn_split splits them */
            for (int i = tid; i < 8 * H8; i += ATT_THREADS) {
                const int qi = i / H8, e0 = (i % H8) * 8;
                float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                if (qi < G) {
                    const float *src = a.q + p.item_t0[C.it] * 2 * a.nh * hd + (int64_t)(C.h * G + qi) * 2 * hd + e0;
#pragma unroll
                    for (int k = 0; k < 8; k++) v[k] = __fmul_rn(src[k], scale);
                }
                uint4 o[QP];
                split8<QP>(v, o);
#pragma unroll
                for (int q = 0; q < QP; q++) *(uint4 *)(qs + (q * 8 + qi) * RS + e0) = o[q];
            }
            q_it = C.it, q_h = C.h;
            __syncthreads();
        }
        float *part = a.split + ((size_t)(C.first + C.c) * a.nh + (size_t)C.h * G) * (hd + 2);
        if (warp < 4) { /* scores: warp w the positions 16 w .. + 15 */
            const uint16_t *kb = kvs + 2 * sl * ATT_CH * RS;
            const int mt = warp;
            float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint32_t ka = smem_u32(kb + (mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8);
#pragma unroll 4 /* the K fragments' loads run ahead of the MMAs' chain */
            for (int ks = 0; ks < hd / 16; ks++) {
                uint32_t af[1][4];
                ldsm_x4(af[0], ka + (uint32_t)(ks * 32));
                uint32_t bf[QP][2];
#pragma unroll
                for (int i = 0; i < QP; i++) {
                    const uint16_t *qb = qs + (i * 8 + g) * RS + ks * 16 + 2 * t;
                    bf[i][0] = *(const uint32_t *)qb, bf[i][1] = *(const uint32_t *)(qb + 8);
                }
                atc_mma<QP, 1>(sc, af, bf);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int pr = mt * 16 + g + (e >= 2 ? 8 : 0), qi = 2 * t + (e & 1);
                st[qi * (ATT_CH + 1) + pr] = c0 + pr <= pos ? sc[e] : -INFINITY;
            }
        } else
            rows(L, u + D, sl, tid - 128); /* the idle warps: the rows of the unit D ahead */
        __syncthreads();                   /* the scores are in; u's K slot is free */
        issue(u + D, sl, 0);
        if (warp < G) { /* each query's chunk weights (as parts) and sum: a warp a query */
            const float *w = st + warp * (ATT_CH + 1);
            const float x0 = w[lane], x1 = w[lane + 32];
            float mc = fmaxf(x0, x1);
            for (int off = 16; off > 0; off >>= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL, mc, off));
            const float e0 = c0 + lane <= pos ? expf(x0 - mc) : 0.0f;
            const float e1 = c0 + lane + 32 <= pos ? expf(x1 - mc) : 0.0f;
            float r0 = e0, r1 = e1;
#pragma unroll
            for (int i = 0; i < QP; i++) {
                const uint16_t h0 = f2bf16(r0), h1 = f2bf16(r1);
                ws[(i * 8 + warp) * VS + lane] = h0;
                ws[(i * 8 + warp) * VS + lane + 32] = h1;
                r0 -= bf16f(h0), r1 -= bf16f(h1);
            }
            const float lc = warp_sum(__fadd_rn(e0, e1));
            if (lane == 0) part[warp * (hd + 2)] = mc, part[warp * (hd + 2) + 1] = lc;
        }
        cp_async_wait<2 * D - 1>(); /* this thread's copies of u's V */
        __syncthreads();    /* everyone's; the weights are in */
        if (32 * warp < hd) { /* the chunk's output for this warp's 32 dims */
            const uint16_t *vb = kvs + (2 * sl + 1) * ATT_CH * RS;
            float oc[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) oc[mi][0] = oc[mi][1] = oc[mi][2] = oc[mi][3] = 0.0f;
            /* V^T's A fragments from V's rows: matrix j of a 16 x 16 piece holds positions
             * 8 (j / 2) .., dims 8 (j % 2) .. */
            const uint32_t va = smem_u32(vb + ((lane & 7) + (lane >> 4) * 8) * RS + 32 * warp + ((lane >> 3) & 1) * 8);
#pragma unroll 1
            for (int ks = 0; ks < ATT_CH / 16; ks++) {
                uint32_t av[2][1][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    if (32 * warp + 16 * mi < hd) ldsm_x4_t(av[mi][0], va + (uint32_t)((ks * 16 * RS + 16 * mi) * 2));
                    else av[mi][0][0] = av[mi][0][1] = av[mi][0][2] = av[mi][0][3] = 0u;
                }
                uint32_t bw[QP][2];
#pragma unroll
                for (int i = 0; i < QP; i++) {
                    const uint16_t *wb = ws + (i * 8 + g) * VS + ks * 16 + 2 * t;
                    bw[i][0] = *(const uint32_t *)wb, bw[i][1] = *(const uint32_t *)(wb + 8);
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++) atc_mma<QP, 1>(oc[mi], av[mi], bw);
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = 2 * t + (e & 1), dim = 32 * warp + 16 * mi + g + (e >= 2 ? 8 : 0);
                    if (qi < G && dim < hd) part[qi * (hd + 2) + 2 + dim] = oc[mi][e];
                }
        }
        aring_next(p, a.nkv, C);
        aring_next(p, a.nkv, L);
        sl = sl + 1 == D ? 0 : sl + 1;
    }
    cp_async_wait<0>();
}

/* a block per (item, query head), a thread per dim: the chunks merged in order, then the gate.
 * The merge's arithmetic is k_attn_tc's (from m = -inf, l = 0, o = 0, each chunk in order:
 * mn = max(m, mc), a = exp(m - mn), b = exp(mc - mn), l = l a + lc b, o = o a + oc b), but
 * only l and o are chains: the running maxima are a scan (max is exact in any order) and
 * every chunk's a and b follow from them at once, so a pass of MERGE_SEG chunks finds them
 * side by side, and each thread's chain then takes MERGE_LD chunks' outputs a load. (Each
 * chunk after a load of its own took ~0.4 us: a 32k-position item's 512 chunks 0.2 ms a
 * layer on 24 SMs, an H100.) */
#ifndef CU_MERGE_SEG
#define CU_MERGE_SEG 1024
#endif
#define MERGE_SEG CU_MERGE_SEG
#define MERGE_LD 16
__global__ void k_attn_merge(cu_plan p, cu_attn_args a) {
    pdl_wait();
    __shared__ float mcs[MERGE_SEG], mbs[MERGE_SEG], cas[MERGE_SEG], cbs[MERGE_SEG], lcs[MERGE_SEG];
    __shared__ float m_end;
    const int it = blockIdx.x, j = blockIdx.y, e = threadIdx.x, hd = a.hd, E = hd + 2, lane = e & 31;
    int64_t first; /* item it's first chunk */
    if (dec_chunks_block(p, it, &first) > a.split_chunks) return; /* k_attn_split took the tiles whole */
    const int64_t nch = p.pos0[it] / ATT_CH + 1;
    const size_t cs = (size_t)a.nh * E; /* a chunk's results from the last's */
    const float *pp = a.split + ((size_t)first * a.nh + j) * E;
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int64_t s0 = 0; s0 < nch; s0 += MERGE_SEG, pp += MERGE_SEG * cs) {
        const int n = (int)(nch - s0 < MERGE_SEG ? nch - s0 : MERGE_SEG);
        __syncthreads(); /* the last pass's factors are read */
        for (int c = e; c < n; c += blockDim.x) mcs[c] = pp[c * cs], lcs[c] = pp[c * cs + 1];
        __syncthreads();
        if (e < 32) { /* the maxima before each chunk, 32 chunks a round */
            float carry = m;
            for (int b0 = 0; b0 < n; b0 += 32) {
                const int c = b0 + lane;
                float inc = c < n ? mcs[c] : -INFINITY; /* the round's inclusive scan */
                for (int off = 1; off < 32; off <<= 1) {
                    const float y = __shfl_up_sync(FULL, inc, off);
                    if (lane >= off) inc = fmaxf(inc, y);
                }
                const float before = __shfl_up_sync(FULL, inc, 1);
                if (c < n) mbs[c] = lane == 0 ? carry : fmaxf(carry, before);
                carry = fmaxf(carry, __shfl_sync(FULL, inc, 31));
            }
            if (lane == 0) m_end = carry;
        }
        __syncthreads();
        for (int c = e; c < n; c += blockDim.x) {
            const float mb = mbs[c], mc = mcs[c], mn = fmaxf(mb, mc);
            cas[c] = expf(mb - mn), cbs[c] = expf(mc - mn);
        }
        m = m_end;
        __syncthreads();
        for (int c0 = 0; c0 < n; c0 += MERGE_LD) {
            float ov[MERGE_LD];
#pragma unroll
            for (int k = 0; k < MERGE_LD; k++) ov[k] = e < hd && c0 + k < n ? pp[(c0 + k) * cs + 2 + e] : 0.0f;
#pragma unroll
            for (int k = 0; k < MERGE_LD; k++)
                if (c0 + k < n) {
                    const float ca = cas[c0 + k], cb = cbs[c0 + k];
                    l = __fmaf_rn(l, ca, __fmul_rn(lcs[c0 + k], cb));
                    o = __fmaf_rn(o, ca, __fmul_rn(ov[k], cb));
                }
        }
    }
    if (e >= hd) return;
    const int64_t tt = p.item_t0[it];
    const float gate = a.q[tt * 2 * a.nh * hd + (int64_t)j * 2 * hd + hd + e];
    const float y = __fmul_rn(__fmul_rn(o, 1.0f / l), sigmoidf_(gate));
    a.mix[tt * a.nh * hd + (int64_t)j * hd + e] = y;
    if (a.xs) put_parts(a.xs, a.xs_parts, (int64_t)p.n_tokens * a.nh * hd, tt * a.nh * hd + (int64_t)j * hd + e, y);
}

/* ---- attention in the `bf16` precision, many queries a block: k_attn_fa ----
 * The peers' way (flash attention, as FlashAttention-2 computes it): a block takes FA_ROWS
 * query rows, each a (token, query head) of one tile of consecutive tokens of an item and
 * the query heads of one KV head; a warp 16 of them. The queries (scaled by log2(e) /
 * sqrt(hd), so that the scores are in units of log2 and each weight is one exp2, as the peers
 * take them; rounded to bf16) sit in shared memory; the positions go by in chunks of FA_CH, their K and V rounded to
 * bf16 in shared memory (from a bf16 pool by cp.async, the next chunk in flight; from an fp32
 * pool converted by the threads); a warp's scores S = Q K^T (16 x FA_CH) stay in registers,
 * the running max and sum go per row, and S's fragments become the A operand of P V without
 * leaving the registers. Only the `bf16` precision takes it (the scores and weights are bf16
 * products, the order of the sums is the chunking's own: a query's bits depend on its tile's
 * first chunk to mask, so not batch-invariant as `exact` is); decode steps and head dims
 * other than 64, 128 and 256 keep k_attn_tc. */
#define FA_WARPS 8
/* whether `bf16` prompts take k_attn_fw (attention_wgmma.cu) where the device runs it (sm_90a):
 * 1, since it measured faster (`make mmv-bench; build/mmv_bench fa` on an H100, the 27B's
 * heads: 8,192 tokens 4.47 -> 3.67 ms a layer, 184 -> 225 TFLOP/s, the same bits as k_attn_fa;
 * the 8,192-token `bf16` prefill 9,527-9,591 -> 9,656-9,659 tok/s side by side); -DCU_ATTN_FW=0
 * keeps k_attn_fa everywhere */
#ifndef CU_ATTN_FW
#define CU_ATTN_FW 1
#endif
#define FA_ROWS (16 * FA_WARPS)
#define FA_CH 64
#define FA_PAD 8 /* bf16 a shared row past hd: ldmatrix's 8 rows fall in distinct banks */

template <int HD>
static constexpr size_t fa_smem() {
    return (size_t)(FA_ROWS + 4 * FA_CH) * (HD + FA_PAD) * 2 + FA_ROWS * 8;
}

/* chunk c's K and V (positions c0 .. c0 + FA_CH - 1, zeros past last) into buffer kb, vb
 * ([FA_CH][HD + FA_PAD] bf16 each) */
template <int HD, bool BF16KV>
__device__ __forceinline__ void fa_load(const cu_kv &kv, const cu_plan &p, int it, int li, int h, int64_t c0,
                                        int64_t last, uint16_t *kb, uint16_t *vb) {
    static_assert(32 * FA_WARPS == 256 && FA_CH == 64, "kv_chunk_load's threads and rows");
    kv_chunk_load<HD, BF16KV>(kv, p, it, li, h, c0, last, (uint8_t *)kb, (uint8_t *)vb,
                              [](int r, int pc) { return (uint32_t)(r * (HD + FA_PAD) + pc * 8) * 2; });
}

template <int HD, bool BF16KV>
__global__ void __launch_bounds__(32 * FA_WARPS, 1) k_attn_fa(cu_plan p, cu_attn_args a, cu_kv kv, int tt) {
    pdl_wait();
    constexpr int LD = HD + FA_PAD, P8 = HD / 8, NO = HD / 8;
    static_assert(FA_CH == 64, "fa_softmax takes chunks of 64 positions");
    extern __shared__ int64_t fa_sh[];
    int64_t *qpos = fa_sh;                               /* [FA_ROWS] each row's position */
    uint16_t *qs = (uint16_t *)(fa_sh + FA_ROWS);        /* [FA_ROWS][LD] */
    uint16_t *ks = qs + FA_ROWS * LD;                    /* [2][FA_CH][LD] */
    uint16_t *vs = ks + 2 * FA_CH * LD;                  /* [2][FA_CH][LD] */
    const int G = a.nh / a.nkv, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    int64_t t0 = 0, nt = 0;
    const int it = att_tile_at(p, tt, (int64_t)gridDim.x - 1 - blockIdx.x, &t0, &nt); /* the longest tiles first */
    if (it < 0) return;
    const int rows = (int)nt * G;
    const int64_t pos_first = p.pos0[it] + (t0 - p.item_t0[it]), pos_last = pos_first + nt - 1;
    /* the scores in units of log2 (the softmax's e^x as 2^(x log2 e): one ex2 a weight) */
    const float scale = 1.4426950408889634f / sqrtf((float)HD);
    if (BF16KV) fa_load<HD, true>(kv, p, it, a.li, h, 0, pos_last, ks, vs); /* chunk 0 in flight */
    cp_async_commit();
    for (int i = tid; i < FA_ROWS * P8; i += 32 * FA_WARPS) {
        const int r = i / P8, e0 = (i % P8) * 8;
        *(uint4 *)(qs + r * LD + e0) = fa_q8(a, HD, t0, r, rows, G, h, e0, scale);
    }
    /* rows past the tile take its last token's position: finite, never written */
    for (int r = tid; r < FA_ROWS; r += 32 * FA_WARPS) qpos[r] = pos_first + (r < rows ? r / G : nt - 1);
    __syncthreads();
    const int64_t my_pos0 = qpos[16 * warp + g], my_pos1 = qpos[16 * warp + g + 8];
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const uint32_t q_a = (uint32_t)__cvta_generic_to_shared(qs) +
                         (uint32_t)(((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8) * 2);
    const int nch = (int)(pos_last / FA_CH) + 1;
    const bool warp_live = 16 * warp < rows; /* a warp of padding rows only skips the products */
    for (int c = 0; c < nch; c++) {
        const int64_t c0 = (int64_t)c * FA_CH;
        uint16_t *kb = ks + (BF16KV ? (c & 1) : 0) * FA_CH * LD, *vb = vs + (BF16KV ? (c & 1) : 0) * FA_CH * LD;
        if (BF16KV) {
            cp_async_wait<0>();
            __syncthreads(); /* chunk c is in, and every warp is done with chunk c - 1's buffer */
            if (c + 1 < nch) /* the next chunk into that buffer, in flight while this one is used */
                fa_load<HD, true>(kv, p, it, a.li, h, c0 + FA_CH, pos_last, ks + ((c + 1) & 1) * FA_CH * LD,
                                  vs + ((c + 1) & 1) * FA_CH * LD);
            cp_async_commit();
        } else {
            __syncthreads(); /* the previous chunk is read */
            fa_load<HD, false>(kv, p, it, a.li, h, c0, pos_last, kb, vb);
            __syncthreads();
        }
        if (warp_live) {
            /* S = Q K^T: 16 rows by FA_CH positions */
            float s[FA_CH / 8][4];
#pragma unroll
            for (int n = 0; n < FA_CH / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const uint32_t k_a = (uint32_t)__cvta_generic_to_shared(kb) +
                                 (uint32_t)((((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll 4
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t af[4];
                ldsm_x4(af, q_a + kk * 32);
#pragma unroll
                for (int n = 0; n < FA_CH / 8; n += 2) {
                    uint32_t bf[4];
                    ldsm_x4(bf, k_a + (uint32_t)(n * 8 * LD * 2) + kk * 32);
                    mma_bf16(s[n], af[0], af[1], af[2], af[3], bf[0], bf[1]);
                    mma_bf16(s[n + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
                }
            }
            /* the causal mask where the chunk reaches past a row's position; the softmax */
            uint32_t pa[FA_CH / 16][4]; /* P as the A operand of P V, k steps of 16 positions */
            float al0, al1;
            fa_softmax(s, c0, c0 + FA_CH - 1 > pos_first, my_pos0, my_pos1, t, m0, m1, l0, l1, pa, al0, al1);
            /* the output's rescale only where a row's max moved (once the maxima settle, most
             * chunks leave every factor 1, and a product by 1 changes no bit) */
            if (!__all_sync(FULL, al0 == 1.0f && al1 == 1.0f)) {
#pragma unroll
                for (int n = 0; n < NO; n++) o[n][0] *= al0, o[n][1] *= al0, o[n][2] *= al1, o[n][3] *= al1;
            }
            /* O += P V: V^T's fragments by ldmatrix.trans from V's rows */
            const uint32_t v_a = (uint32_t)__cvta_generic_to_shared(vb) +
                                 (uint32_t)((((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8) * 2);
#pragma unroll
            for (int kk = 0; kk < FA_CH / 16; kk++)
#pragma unroll
                for (int n = 0; n < NO; n += 2) {
                    uint32_t bv[4];
                    ldsm_x4_t(bv, v_a + (uint32_t)(kk * 16 * LD * 2) + n * 16);
                    mma_bf16(o[n], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], bv[0], bv[1]);
                    mma_bf16(o[n + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], bv[2], bv[3]);
                }
        }
    }
    cp_async_wait<0>();
    if (!warp_live) return;
    const float inv0 = 1.0f / fa_quad_sum(l0), inv1 = 1.0f / fa_quad_sum(l1);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = 16 * warp + g + 8 * hf;
        if (r >= rows) continue;
        const float inv = hf ? inv1 : inv0;
#pragma unroll
        for (int n = 0; n < NO; n++)
            fa_put(a, HD, t0 + r / G, h * G + r % G, 8 * n + 2 * t, o[n][2 * hf] * inv, o[n][2 * hf + 1] * inv);
    }
}

extern "C" int cu_attention(cu_stream s, const cu_plan *p, const cu_attn_args *a_in, const cu_kv *kv) {
    if (p->n_tokens <= 0) return 0;
    const int parts = a_in->hd % 16 == 0 ? a_in->parts : 0;
    const bool split_step = parts != 0 && a_in->split && p->n_tokens == p->n_items; /* a decode step */
    cu_attn_args af = *a_in; /* the split only where a decode step's kernels make it */
    const cu_attn_args *a = &af;
    if (!split_step || ((int64_t)a_in->nh * a_in->hd) % 32 != 0) af.xs = NULL;
    const int qt = att_tokens(a);
    dim3 grid((unsigned)((p->n_tokens + qt - 1) / qt + p->n_items), (unsigned)a->nkv);
    const dim3 blk(ATT_THREADS);
    const int G = a->nh / a->nkv;
    if (parts == 1 && p->n_tokens > p->n_items && G <= FA_ROWS && (a->hd == 64 || a->hd == 128 || a->hd == 256)) {
        /* `bf16` with a prompt in the step: k_attn_fw where the device runs it and the build
         * takes it, else k_attn_fa (a decode step keeps k_attn_tc) */
        if (CU_ATTN_FW && a->fw && cu_attn_fw(s, p, a, kv) == 0) return 0;
        const int tt = FA_ROWS / G;
        const dim3 fgrid((unsigned)((p->n_tokens + tt - 1) / tt + p->n_items), (unsigned)a->nkv), fblk(32 * FA_WARPS);
#define FA_LAUNCH(HD)                                                                                          \
    (kv->bf16 ? launch_pdl(k_attn_fa<HD, true>, fgrid, fblk, fa_smem<HD>(), s, *p, *a, *kv, tt)               \
              : launch_pdl(k_attn_fa<HD, false>, fgrid, fblk, fa_smem<HD>(), s, *p, *a, *kv, tt))
        if (a->hd == 64) FA_LAUNCH(64);
        else if (a->hd == 128) FA_LAUNCH(128);
        else FA_LAUNCH(256);
#undef FA_LAUNCH
        return 0;
    }
    if (split_step) { /* split over the context */
        int dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        /* a unit's queries are one token's G: one query tile where G <= 8 (NQ 1: a sixth of the
         * registers and shared memory of six tiles, so blocks share an SM), else six */
#define SPLIT_LAUNCH(QP, KP, NQ)                                                                            \
    do {                                                                                                      \
        int per = 0;                                                                                          \
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_attn_split<QP, KP, NQ>, ATT_THREADS,            \
                                                      atc_smem(a->hd, QP, KP, NQ));                           \
        const dim3 sgrid((unsigned)((per > 0 ? per : 1) * (sms > 0 ? sms : 1))); /* the blocks that stay */ \
        launch_pdl(k_attn_split<QP, KP, NQ>, sgrid, blk, atc_smem(a->hd, QP, KP, NQ), s, *p, *a, *kv);         \
    } while (0)
        if (G <= 8 && kv->bf16 && a->ring >= 2) { /* streamed: a block an SM */
            const dim3 rgrid((unsigned)(sms > 0 ? sms : 1));
            const int d = a->ring >= 3 ? 3 : 2;
            if (parts == 3 && d == 3) launch_pdl(k_attn_ring<3, 3>, rgrid, blk, aring_smem(a->hd, 3, 3), s, *p, *a, *kv);
            else if (parts == 3) launch_pdl(k_attn_ring<3, 2>, rgrid, blk, aring_smem(a->hd, 3, 2), s, *p, *a, *kv);
            else if (d == 3) launch_pdl(k_attn_ring<1, 3>, rgrid, blk, aring_smem(a->hd, 1, 3), s, *p, *a, *kv);
            else launch_pdl(k_attn_ring<1, 2>, rgrid, blk, aring_smem(a->hd, 1, 2), s, *p, *a, *kv);
        } else if (G <= 8) {
            if (parts == 3 && !kv->bf16) SPLIT_LAUNCH(3, 3, 1);
            else if (parts == 3) SPLIT_LAUNCH(3, 1, 1);
            else SPLIT_LAUNCH(1, 1, 1);
        } else {
            if (parts == 3 && !kv->bf16) SPLIT_LAUNCH(3, 3, 6);
            else if (parts == 3) SPLIT_LAUNCH(3, 1, 6);
            else SPLIT_LAUNCH(1, 1, 6);
        }
#undef SPLIT_LAUNCH
        launch_pdl(k_attn_merge, dim3((unsigned)p->n_items, (unsigned)a->nh), dim3((unsigned)((a->hd + 31) / 32 * 32)), 0,
                   s, *p, *a);
        return a->xs != NULL;
    }
    if (parts == 3 && !kv->bf16) launch_pdl(k_attn_tc<3, 3>, grid, blk, atc_smem(a->hd, 3, 3), s, *p, *a, *kv, qt);
    else if (parts == 3) launch_pdl(k_attn_tc<3, 1>, grid, blk, atc_smem(a->hd, 3, 1), s, *p, *a, *kv, qt);
    else if (parts == 1) launch_pdl(k_attn_tc<1, 1>, grid, blk, atc_smem(a->hd, 1, 1), s, *p, *a, *kv, qt);
    else launch_pdl(k_attention, grid, blk, att_smem(a), s, *p, *a, *kv, qt);
    return 0;
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
    cudaFuncSetAttribute(k_attn_split<3, 3, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 3, 6));
    cudaFuncSetAttribute(k_attn_split<3, 1, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 1, 6));
    cudaFuncSetAttribute(k_attn_split<1, 1, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 1, 1, 6));
    cudaFuncSetAttribute(k_attn_split<3, 3, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 3, 1));
    cudaFuncSetAttribute(k_attn_split<3, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 3, 1, 1));
    cudaFuncSetAttribute(k_attn_split<1, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)atc_smem(hd, 1, 1, 1));
#define FA_ATTR(HD)                                                                                            \
    cudaFuncSetAttribute(k_attn_fa<HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<HD>()); \
    cudaFuncSetAttribute(k_attn_fa<HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<HD>())
    FA_ATTR(64);
    FA_ATTR(128);
    FA_ATTR(256);
#undef FA_ATTR
}

extern "C" int cu_attn_ring_init(int hd) {
    if (hd <= 0 || hd % 16 || hd > ATT_THREADS) return 0;
    int depth = 0;
#define RING_ATTR(QP, D) \
    (cudaFuncSetAttribute(k_attn_ring<QP, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)aring_smem(hd, QP, D)) == cudaSuccess)
    if (RING_ATTR(3, 2) && RING_ATTR(1, 2)) depth = 2;
    if (depth && RING_ATTR(3, 3) && RING_ATTR(1, 3)) depth = 3;
#undef RING_ATTR
    if (depth < 3) cudaGetLastError(); /* a depth the device has no room for: not the next launch's error */
    return depth;
}
