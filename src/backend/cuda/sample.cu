/* ==== CUDA kernels: compact logit rows (see cuda_kernels.h) ====
 *
 * A block per row turns the vocabulary's logits into a cu_logit_top: the CU_TOP_MAX largest
 * (ties to the lower id) and log-sum-exp, so that a decode step sends back a kilobyte a
 * sequence. The largest are found by a radix select on order-preserving keys (four passes
 * of 8 bits from the top, each a histogram of the keys that match the digits so far), which
 * gives the CU_TOP_MAX-th key exactly; the keys above it all belong, and of those equal to
 * it the lowest ids. The few selected are then sorted (bitonic, by key and id). The sum of
 * exp(l - max) is taken in double, each thread over a fixed stride of ids, then over the
 * threads in a fixed tree: the same bits whatever else the batch holds. The host's
 * reference is sampler.c's st_logit_top_make (ids and values equal; lse within rounding).
 */
#include "backend/cuda/cu_common.cuh"

#define TOP_THREADS 1024
#define TIE_CAP 1024 /* ties of the threshold collected in parallel; more: one thread walks the row */

/* a key that orders as the float does (NaN above +inf; such a row is reported not finite) */
__device__ __forceinline__ uint32_t key_of(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(TOP_THREADS) k_logit_top(const float *lg, int64_t V, const int32_t *rows,
                                                           cu_logit_top *out) {
    __shared__ unsigned hist[256];
    __shared__ double red_s[TOP_THREADS / 32];
    __shared__ float red_m[TOP_THREADS / 32];
    __shared__ int red_f[TOP_THREADS / 32];
    __shared__ unsigned long long sel[CU_TOP_MAX];
    __shared__ int32_t ties[TIE_CAP];
    __shared__ unsigned n_gt, n_tie, pick_bin, pick_left;
    __shared__ float row_max;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const float *x = lg + (int64_t)rows[blockIdx.x] * V;
    cu_logit_top *o = out + blockIdx.x;
    const int K = V < CU_TOP_MAX ? (int)V : CU_TOP_MAX;
    /* the row's largest and whether it is finite */
    float m = -INFINITY;
    int fin = 1;
    for (int64_t i = tid; i < V; i += TOP_THREADS) {
        const float v = x[i];
        fin &= (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
        m = fmaxf(m, v);
    }
    for (int s = 16; s > 0; s >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(FULL, m, s));
        fin &= __shfl_xor_sync(FULL, fin, s);
    }
    if (lane == 0) red_m[w] = m, red_f[w] = fin;
    __syncthreads();
    if (tid == 0) {
        float mm = red_m[0];
        int ff = red_f[0];
        for (int i = 1; i < TOP_THREADS / 32; i++) mm = fmaxf(mm, red_m[i]), ff &= red_f[i];
        row_max = mm;
        o->finite = ff;
    }
    __syncthreads();
    /* log-sum-exp in double: each thread its stride of ids in order, then a fixed tree */
    const double mx = (double)row_max;
    double sum = 0.0;
    for (int64_t i = tid; i < V; i += TOP_THREADS) sum += exp((double)x[i] - mx);
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(FULL, sum, s);
    if (lane == 0) red_s[w] = sum;
    /* the K-th largest key, 8 bits a pass */
    uint32_t prefix = 0, mask = 0;
    unsigned left = (unsigned)K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += TOP_THREADS) hist[i] = 0;
        __syncthreads();
        for (int64_t i = tid; i < V; i += TOP_THREADS) {
            const uint32_t k = key_of(x[i]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned above = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (above + hist[b] >= left) break;
                above += hist[b];
            }
            pick_bin = (unsigned)b, pick_left = left - above;
        }
        __syncthreads();
        prefix |= pick_bin << shift, mask |= 255u << shift, left = pick_left;
        __syncthreads();
    }
    if (tid == 0) {
        double s = 0.0;
        for (int i = 0; i < TOP_THREADS / 32; i++) s += red_s[i];
        o->lse = o->finite ? mx + log(s) : 0.0;
        n_gt = 0, n_tie = 0;
    }
    __syncthreads();
    /* the keys above the threshold (K - left of them), and the threshold's ties */
    const uint32_t thr = prefix;
    for (int64_t i = tid; i < V; i += TOP_THREADS) {
        const uint32_t k = key_of(x[i]);
        if (k > thr) {
            sel[atomicAdd(&n_gt, 1u)] = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)i);
        } else if (k == thr) {
            const unsigned at = atomicAdd(&n_tie, 1u);
            if (at < TIE_CAP) ties[at] = (int32_t)i;
        }
    }
    __syncthreads();
    const unsigned G = n_gt, need = (unsigned)K - G; /* need == left */
    if (n_tie <= TIE_CAP) {
        /* the need lowest ids of the ties: each tie's rank among them */
        for (unsigned j = tid; j < n_tie; j += TOP_THREADS) {
            const int32_t id = ties[j];
            unsigned rank = 0;
            for (unsigned q = 0; q < n_tie; q++) rank += ties[q] < id;
            if (rank < need) sel[G + rank] = ((unsigned long long)thr << 32) | (0xffffffffu - (uint32_t)id);
        }
    } else if (tid == 0) {
        unsigned got = 0;
        for (int64_t i = 0; i < V && got < need; i++)
            if (key_of(x[i]) == thr) sel[G + got++] = ((unsigned long long)thr << 32) | (0xffffffffu - (uint32_t)i);
    }
    for (int j = K + tid; j < CU_TOP_MAX; j += TOP_THREADS) sel[j] = 0; /* below every key */
    __syncthreads();
    /* bitonic sort, descending (by key, then by the lower id) */
    for (int size = 2; size <= CU_TOP_MAX; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (tid < CU_TOP_MAX) {
                const int j = tid ^ stride;
                if (j > tid) {
                    const bool desc = (tid & size) == 0;
                    const unsigned long long a = sel[tid], b = sel[j];
                    if (desc ? a < b : a > b) sel[tid] = b, sel[j] = a;
                }
            }
            __syncthreads();
        }
    if (tid < K) {
        const uint32_t id = 0xffffffffu - (uint32_t)(sel[tid] & 0xffffffffu);
        o->id[tid] = (int32_t)id;
        o->val[tid] = x[id];
    }
    if (tid == 0) o->n = K;
}

extern "C" void cu_logit_tops(cu_stream s, const float *lg, int64_t V, const int32_t *rows, int64_t n,
                             cu_logit_top *out) {
    if (n <= 0) return;
    k_logit_top<<<(unsigned)n, TOP_THREADS, 0, s>>>(lg, V, rows, out);
}
