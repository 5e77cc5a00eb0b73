/* ==== CUDA kernels: compact logit rows (see cuda_kernels.h) ====
 *
 * The vocabulary's logits of a row become a cu_logit_top: the CU_TOP_MAX largest (ties to
 * the lower id) and log-sum-exp, so that a decode step sends back a kilobyte a sequence.
 * Each logit is ranked by its 64-bit value key << 32 | ~id (key: an order-preserving image
 * of the float), unique within a row, so that "the K largest" is one set. Two kernels, so
 * that one row's work spreads over many SMs:
 *   k_top_seg    a block per (row, segment of about 8 K ids), its keys in registers: the
 *                segment's largest and the sum of exp(l - that) in double, and its
 *                CU_TOP_MAX largest values, found by counting: the K-th largest key by a
 *                binary search (how many keys are at or above a guess: one block-wide count
 *                a step), then, where its ties are more than the places left, the largest ~id
 *                among them the same way; the values at or above the two are the top;
 *   k_top_merge  a block per row: the same search over the segments' candidates (every
 *                element of the row's top is in its segment's top), each of the K placed by
 *                its rank among them; the sums combined in segment order.
 * A count takes a few instructions a value and one barrier, where a radix pass's histogram
 * took a warp match a value (the kernels' time, by Nsight Compute: 46 and 44 us a row).
 * Every order is fixed by the row's length alone (each thread a fixed stride of ids, fixed
 * trees, segments in order): the same bits whatever else the batch holds. The host's
 * reference is sampler.c's st_logit_top_make (ids and values equal; lse within rounding).
 */
#include "backend/cuda/cu_common.cuh"

#define SEG_THREADS 256
#define SEG_LEN 8192  /* ids a segment at most */
#define SEG_MAX 32    /* segments a row at most: a vocabulary of up to 256 K ids */
#define SEG_PER (SEG_LEN / SEG_THREADS) /* a thread's keys */
#define MERGE_THREADS 1024
#define MERGE_PER (SEG_MAX * CU_TOP_MAX / MERGE_THREADS) /* a merging thread's candidates */

/* a segment's result */
typedef struct top_seg {
    float max;
    int32_t finite, n;
    double sum; /* of exp(l - max) */
    unsigned long long cand[CU_TOP_MAX]; /* key << 32 | ~id, unsorted */
} top_seg;

/* a key that orders as the float does (NaN above +inf; such a row is reported not finite) */
__device__ __forceinline__ uint32_t key_of(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

/* the block's sum of every thread's c (all threads call it, in the same turns): red holds
 * [2][32], the turn's parity picks the half, so one barrier a turn keeps a turn's reads
 * before the next-but-one's writes */
__device__ __forceinline__ unsigned block_count(unsigned c, unsigned *red, int &turn) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned *r = red + 32 * (turn & 1);
    turn++;
    c = __reduce_add_sync(FULL, c);
    if (lane == 0) r[w] = c;
    __syncthreads();
    return __reduce_add_sync(FULL, lane < nw ? r[lane] : 0u); /* every warp reads the warps' sums at once */
}

/* The largest t in [lo, hi] with count(t) >= need (count(lo) >= need is the caller's):
 * count(t) is how many of a thread's N values pass at t, summed over the block, and falls
 * as t rises. */
template <typename F>
__device__ __forceinline__ uint32_t search_at_least(uint32_t lo, uint32_t hi, unsigned need, unsigned *red, int &turn,
                                                    F count_at) {
    while (lo < hi) {
        const uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
        if (block_count(count_at(mid), red, turn) >= need) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The K-th largest of the block's distinct 64-bit values (K at most how many there are):
 * value_of(j) is a thread's value j, valid where bit j of `valid` is set, N of them. Its high
 * word is the largest h in [0, hi_max] with at least K high words at or above it; then, only
 * where that high word's values outnumber the places the larger ones leave, its low word the
 * same way among them. Exactly K values are at or above the result. */
template <int N, typename F>
__device__ __forceinline__ unsigned long long kth_largest(F value_of, uint32_t valid, unsigned K, uint32_t hi_max,
                                                          unsigned *red, int &turn) {
    auto count_hi = [&](uint32_t t) {
        unsigned c = 0;
#pragma unroll
        for (int j = 0; j < N; j++) c += (valid >> j & 1u) && (uint32_t)(value_of(j) >> 32) >= t;
        return c;
    };
    const uint32_t hi = search_at_least(0u, hi_max, K, red, turn, count_hi);
    unsigned gt = 0;
#pragma unroll
    for (int j = 0; j < N; j++) gt += (valid >> j & 1u) && (uint32_t)(value_of(j) >> 32) > hi;
    const unsigned need = K - block_count(gt, red, turn);
    auto count_lo = [&](uint32_t t) {
        unsigned c = 0;
#pragma unroll
        for (int j = 0; j < N; j++) {
            const unsigned long long v = value_of(j);
            c += (valid >> j & 1u) && (uint32_t)(v >> 32) == hi && (uint32_t)v >= t;
        }
        return c;
    };
    const unsigned ties = block_count(count_lo(0u), red, turn);
    const uint32_t lo = ties > need ? search_at_least(0u, 0xffffffffu, need, red, turn, count_lo) : 0u;
    return ((unsigned long long)hi << 32) | lo;
}

extern "C" int cu_logit_top_segs(int64_t V) {
    const int64_t s = (V + SEG_LEN - 1) / SEG_LEN;
    return s <= SEG_MAX ? (int)s : 0;
}

extern "C" size_t cu_logit_top_scratch(int64_t rows, int64_t V) {
    return (size_t)rows * (size_t)cu_logit_top_segs(V) * sizeof(top_seg);
}

__global__ void __launch_bounds__(SEG_THREADS, 4) k_top_seg(const float *lg, int64_t V, const int32_t *rows, top_seg *seg) {
    __shared__ float red_m[SEG_THREADS / 32];
    __shared__ int red_f[SEG_THREADS / 32];
    __shared__ double red_s[SEG_THREADS / 32];
    __shared__ unsigned red[64], n_out;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t s0 = (int64_t)blockIdx.y * SEG_LEN, len = V - s0 < SEG_LEN ? V - s0 : SEG_LEN;
    top_seg *o = seg + (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    pdl_wait(); /* the logits are the predecessor's */
    const float *x = lg + (int64_t)rows[blockIdx.x] * V + s0;
    /* this thread's keys: a whole segment as float4s where every row's are aligned (key j at
     * id 4 (tid + 256 (j / 4)) + j % 4), all in flight at once; else one at a time (key j at id
     * tid + 256 j); past the segment's end invalid. The choice depends on the segment's place
     * in a row alone (not on the row's), as the sums' order must. */
    const bool vec = len == SEG_LEN && V % 4 == 0 && ((uintptr_t)lg & 15) == 0;
    auto id_of = [&](int j) -> int { return vec ? 4 * (tid + SEG_THREADS * (j / 4)) + j % 4 : tid + SEG_THREADS * j; };
    uint32_t key[SEG_PER];
    if (vec) {
        float4 v[SEG_PER / 4];
#pragma unroll
        for (int j = 0; j < SEG_PER / 4; j++) v[j] = ((const float4 *)x)[tid + j * SEG_THREADS];
#pragma unroll
        for (int j = 0; j < SEG_PER / 4; j++)
            key[4 * j] = key_of(v[j].x), key[4 * j + 1] = key_of(v[j].y), key[4 * j + 2] = key_of(v[j].z), key[4 * j + 3] = key_of(v[j].w);
    } else {
#pragma unroll
        for (int j = 0; j < SEG_PER; j++) key[j] = id_of(j) < len ? key_of(x[id_of(j)]) : 0u;
    }
    /* which of them are inside the segment (bit j) */
    uint32_t valid = 0;
#pragma unroll
    for (int j = 0; j < SEG_PER; j++) valid |= (uint32_t)(id_of(j) < len) << j;
    /* the largest, finiteness */
    uint32_t km = 0;
    int fin = 1;
#pragma unroll
    for (int j = 0; j < SEG_PER; j++)
        if (id_of(j) < len) {
            const float v = float_of(key[j]);
            fin &= (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
            km = key[j] > km ? key[j] : km;
        }
    for (int s = 16; s > 0; s >>= 1) {
        const uint32_t ok = __shfl_xor_sync(FULL, km, s);
        km = ok > km ? ok : km;
        fin &= __shfl_xor_sync(FULL, fin, s);
    }
    if (lane == 0) red_m[w] = float_of(km), red_f[w] = fin;
    __syncthreads();
    float mx = red_m[0];
    fin = red_f[0];
    uint32_t kmax = key_of(red_m[0]);
    for (int i = 1; i < SEG_THREADS / 32; i++) {
        mx = fmaxf(mx, red_m[i]), fin &= red_f[i];
        const uint32_t k = key_of(red_m[i]);
        kmax = k > kmax ? k : kmax;
    }
    /* sum of exp(l - max) in double: each thread its ids in increasing order, then a fixed tree */
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < SEG_PER; j++)
        if (id_of(j) < len) sum += exp((double)float_of(key[j]) - (double)mx);
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(FULL, sum, s);
    if (lane == 0) red_s[w] = sum;
    /* the K-th largest value key << 32 | ~id (of a key's ties, the lowest ids first) */
    const int K = len < CU_TOP_MAX ? (int)len : CU_TOP_MAX;
    int turn = 0;
    auto value_of = [&](int j) {
        return ((unsigned long long)key[j] << 32) | (0xffffffffu - (uint32_t)(s0 + id_of(j)));
    };
    const unsigned long long bar = kth_largest<SEG_PER>(value_of, valid, (unsigned)K, kmax, red, turn);
    if (tid == 0) {
        double t = 0.0;
        for (int i = 0; i < SEG_THREADS / 32; i++) t += red_s[i];
        o->max = mx, o->finite = fin, o->n = K, o->sum = t;
        n_out = 0;
    }
    __syncthreads();
    /* the K values at or above it, in no order */
#pragma unroll
    for (int j = 0; j < SEG_PER; j++)
        if ((valid >> j & 1u) && value_of(j) >= bar) o->cand[atomicAdd(&n_out, 1u)] = value_of(j);
}

__global__ void __launch_bounds__(MERGE_THREADS) k_top_merge(const top_seg *seg, int segs, cu_logit_top *out) {
    __shared__ int off[SEG_MAX + 1]; /* segment s's candidates at off[s] .. off[s + 1] - 1 */
    __shared__ double s_term[SEG_MAX];
    __shared__ unsigned red[64], n_sel;
    __shared__ unsigned long long sel[CU_TOP_MAX];
    const int tid = threadIdx.x, r = blockIdx.x, lane = tid & 31;
    const top_seg *sg = seg + (size_t)r * segs;
    cu_logit_top *o = out + r;
    pdl_wait(); /* the segments' results are the predecessor's */
    if (tid < 32) { /* the segments' counts, summed in order; the log-sum-exp */
        const bool in = tid < segs;
        const int n = in ? sg[tid].n : 0;
        const float m = in ? sg[tid].max : -INFINITY;
        const double sm = in ? sg[tid].sum : 0.0;
        int fin = in ? sg[tid].finite : 1;
        int inc = n;
        for (int q = 1; q < 32; q <<= 1) {
            const int v = __shfl_up_sync(FULL, inc, q);
            if (lane >= q) inc += v;
        }
        off[tid + 1] = inc;
        if (tid == 0) off[0] = 0;
        float mx = m;
        for (int q = 16; q > 0; q >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, q));
            fin &= __shfl_xor_sync(FULL, fin, q);
        }
        /* each segment's term apart, then summed in segment order by one lane */
        if (in) s_term[tid] = sm * exp((double)m - (double)mx);
        __syncwarp();
        if (tid == 0) {
            double sum = 0.0;
            for (int q = 0; q < segs; q++) sum += s_term[q];
            o->finite = fin;
            o->lse = fin ? (double)mx + log(sum) : 0.0;
            n_sel = 0;
        }
    }
    __syncthreads();
    const int total = off[segs], K = total < CU_TOP_MAX ? total : CU_TOP_MAX;
    unsigned long long c[MERGE_PER]; /* this thread's candidates i = tid + MERGE_THREADS j (0: none) */
    uint32_t valid = 0;              /* bit j: c[j] is one */
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++) {
        const int i = tid + MERGE_THREADS * j;
        c[j] = 0;
        valid |= (uint32_t)(i < total) << j;
        if (i < total) {
            int lo = 0, hi = segs - 1; /* the s with off[s] <= i < off[s + 1] */
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (off[mid] <= i) lo = mid;
                else hi = mid - 1;
            }
            c[j] = sg[lo].cand[i - off[lo]];
        }
    }
    /* the K-th largest candidate (no two are equal): exactly K are at or above it */
    int turn = 0;
    const unsigned long long bar =
        kth_largest<MERGE_PER>([&](int j) { return c[j]; }, valid, (unsigned)K, 0xffffffffu, red, turn);
#pragma unroll
    for (int j = 0; j < MERGE_PER; j++)
        if ((valid >> j & 1u) && c[j] >= bar) sel[atomicAdd(&n_sel, 1u)] = c[j];
    __syncthreads();
    if (tid < K) { /* each placed by its rank among the K */
        const unsigned long long v = sel[tid];
        int rank = 0;
        for (int j = 0; j < K; j++) rank += sel[j] > v;
        o->id[rank] = (int32_t)(0xffffffffu - (uint32_t)(v & 0xffffffffu));
        o->val[rank] = float_of((uint32_t)(v >> 32));
    }
    if (tid == 0) o->n = K;
}

extern "C" void cu_logit_tops(cu_stream s, const float *lg, int64_t V, const int32_t *rows, int64_t n, void *scratch,
                              cu_logit_top *out) {
    const int segs = cu_logit_top_segs(V);
    if (n <= 0 || segs == 0) return;
    launch_pdl(k_top_seg, dim3((unsigned)n, (unsigned)segs), dim3(SEG_THREADS), 0, s, lg, V, rows, (top_seg *)scratch);
    launch_pdl(k_top_merge, dim3((unsigned)n), dim3(MERGE_THREADS), 0, s, (const top_seg *)scratch, segs, out);
}
