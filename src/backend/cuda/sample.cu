/* ==== CUDA kernels: compact logit rows (see cuda_kernels.h) ====
 *
 * The vocabulary's logits of a row become a cu_logit_top: the CU_TOP_MAX largest (ties to
 * the lower id) and log-sum-exp, so that a decode step sends back a kilobyte a sequence.
 * Two kernels, so that one row's work spreads over many SMs:
 *   k_top_seg    a block per (row, segment of about 8 K ids): the segment's keys (order-
 *                preserving images of the floats) into shared memory, its largest and the
 *                sum of exp(l - that) in double, and its CU_TOP_MAX largest by a radix
 *                select (four passes of 8 bits from the top, each a histogram of the keys
 *                that match the digits so far: the CU_TOP_MAX-th key exactly; the keys above
 *                it all belong, of those equal to it the lowest ids);
 *   k_top_merge  a block per row: of the segments' candidates (unique as key, then the
 *                lower id), the CU_TOP_MAX-th largest by the same radix select over all 64
 *                bits, those at or above it each placed by its rank among them; the sums
 *                combined in segment order. Every element of the row's top is in its
 *                segment's top, so the result is the row's top.
 * A pass's histogram counts a warp's keys of one bin with one atomic (hist_add), and one
 * warp finds the pass's bin (hist_pick).
 * Every order is fixed by the row's length alone (each thread a fixed stride of ids, fixed
 * trees, segments in order): the same bits whatever else the batch holds. The host's
 * reference is sampler.c's st_logit_top_make (ids and values equal; lse within rounding).
 */
#include "backend/cuda/cu_common.cuh"

#define SEG_THREADS 256
#define SEG_LEN 8192  /* ids a segment at most (its keys in shared memory) */
#define SEG_MAX 32    /* segments a row at most: a vocabulary of up to 256 K ids */
#define MERGE_THREADS 1024

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

/* one count into a shared histogram, the lanes of a warp with the same bin adding theirs at
 * once (most keys of a pass share few bins: one atomic a bin and warp instead of one a key);
 * every lane of the warp calls it, `in` says whether this one counts */
__device__ __forceinline__ void hist_add(unsigned *hist, bool in, unsigned bin) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned peers = __match_any_sync(FULL, in ? bin : 256u + lane);
    if (in && lane == (unsigned)__ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* a radix pass's choice, by one warp: the highest bin b whose count and those above it reach
 * left (else 0), and what is left of left inside it. Lane l sums the 8 bins from 255 - 8l
 * down, the lanes' sums added from the top. */
__device__ __forceinline__ void hist_pick(const unsigned *hist, unsigned left, unsigned *pick_bin, unsigned *pick_left) {
    const int lane = threadIdx.x & 31, hi = 255 - 8 * lane;
    unsigned own = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) own += hist[hi - k];
    unsigned inc = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned n = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += n;
    }
    const unsigned ball = __ballot_sync(FULL, inc >= left);
    if (lane == (ball ? __ffs(ball) - 1 : 31)) {
        unsigned above = inc - own;
        int b = hi;
        for (int k = 0; k < 8; k++, b--) {
            if (b == 0 || above + hist[b] >= left) break;
            above += hist[b];
        }
        *pick_bin = (unsigned)b, *pick_left = left - above;
    }
}

extern "C" int cu_logit_top_segs(int64_t V) {
    const int64_t s = (V + SEG_LEN - 1) / SEG_LEN;
    return s <= SEG_MAX ? (int)s : 0;
}

extern "C" size_t cu_logit_top_scratch(int64_t rows, int64_t V) {
    return (size_t)rows * (size_t)cu_logit_top_segs(V) * sizeof(top_seg);
}

__global__ void __launch_bounds__(SEG_THREADS) k_top_seg(const float *lg, int64_t V, const int32_t *rows, top_seg *seg) {
    __shared__ uint32_t keys[SEG_LEN];
    __shared__ unsigned hist[256];
    __shared__ float red_m[SEG_THREADS / 32];
    __shared__ int red_f[SEG_THREADS / 32];
    __shared__ double red_s[SEG_THREADS / 32];
    __shared__ unsigned n_gt, n_tie, pick_bin, pick_left;
    __shared__ int32_t ties[SEG_THREADS];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t s0 = (int64_t)blockIdx.y * SEG_LEN, len = V - s0 < SEG_LEN ? V - s0 : SEG_LEN;
    top_seg *o = seg + (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    const float *x = lg + (int64_t)rows[blockIdx.x] * V + s0;
    /* keys, the largest, finiteness */
    uint32_t km = 0;
    int fin = 1;
    for (int i = tid; i < len; i += SEG_THREADS) {
        const float v = x[i];
        const uint32_t k = key_of(v);
        keys[i] = k;
        fin &= (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
        km = k > km ? k : km;
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
    for (int i = 1; i < SEG_THREADS / 32; i++) mx = fmaxf(mx, red_m[i]), fin &= red_f[i];
    /* sum of exp(l - max) in double: each thread its stride, then a fixed tree */
    double sum = 0.0;
    for (int i = tid; i < len; i += SEG_THREADS) sum += exp((double)float_of(keys[i]) - (double)mx);
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(FULL, sum, s);
    if (lane == 0) red_s[w] = sum;
    /* the K-th largest key, 8 bits a pass */
    const int K = len < CU_TOP_MAX ? (int)len : CU_TOP_MAX;
    uint32_t prefix = 0, mask = 0;
    unsigned left = (unsigned)K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += SEG_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < len; i0 += SEG_THREADS) { /* whole warps each round */
            const int i = i0 + tid;
            const uint32_t k = i < len ? keys[i] : 0u;
            hist_add(hist, i < len && (k & mask) == prefix, (k >> shift) & 255u);
        }
        __syncthreads();
        if (w == 0) hist_pick(hist, left, &pick_bin, &pick_left);
        __syncthreads();
        prefix |= pick_bin << shift, mask |= 255u << shift, left = pick_left;
        __syncthreads();
    }
    if (tid == 0) {
        double t = 0.0;
        for (int i = 0; i < SEG_THREADS / 32; i++) t += red_s[i];
        o->max = mx, o->finite = fin, o->n = K, o->sum = t;
        n_gt = 0, n_tie = 0;
    }
    __syncthreads();
    /* the keys above the threshold, and its ties */
    const uint32_t thr = prefix;
    for (int i = tid; i < len; i += SEG_THREADS) {
        const uint32_t k = keys[i];
        const unsigned long long c = ((unsigned long long)k << 32) | (0xffffffffu - (uint32_t)(s0 + i));
        if (k > thr) o->cand[atomicAdd(&n_gt, 1u)] = c;
        else if (k == thr) {
            const unsigned at = atomicAdd(&n_tie, 1u);
            if (at < SEG_THREADS) ties[at] = i;
        }
    }
    __syncthreads();
    const unsigned G = n_gt, need = (unsigned)K - G;
    if (n_tie <= SEG_THREADS) { /* the need lowest ids of the ties: each one's rank among them */
        if ((unsigned)tid < n_tie) {
            const int32_t i = ties[tid];
            unsigned rank = 0;
            for (unsigned q = 0; q < n_tie; q++) rank += ties[q] < i;
            if (rank < need) o->cand[G + rank] = ((unsigned long long)thr << 32) | (0xffffffffu - (uint32_t)(s0 + i));
        }
    } else if (tid == 0) {
        unsigned got = 0;
        for (int i = 0; i < len && got < need; i++)
            if (keys[i] == thr) o->cand[G + got++] = ((unsigned long long)thr << 32) | (0xffffffffu - (uint32_t)(s0 + i));
    }
}

__global__ void __launch_bounds__(MERGE_THREADS) k_top_merge(const top_seg *seg, int segs, cu_logit_top *out) {
    __shared__ unsigned long long c[SEG_MAX * CU_TOP_MAX];
    __shared__ int off[SEG_MAX + 1]; /* segment s's candidates at off[s] .. off[s + 1] - 1 */
    __shared__ float s_max[SEG_MAX];
    __shared__ double s_sum[SEG_MAX];
    __shared__ int s_fin[SEG_MAX];
    __shared__ unsigned hist[256], pick_bin, pick_left, n_sel;
    __shared__ unsigned long long sel[CU_TOP_MAX];
    const int tid = threadIdx.x, r = blockIdx.x, lane = tid & 31;
    const top_seg *sg = seg + (size_t)r * segs;
    if (tid < 32) { /* the segments' counts, summed in order */
        const int n = tid < segs ? sg[tid].n : 0;
        if (tid < segs) s_max[tid] = sg[tid].max, s_sum[tid] = sg[tid].sum, s_fin[tid] = sg[tid].finite;
        int inc = n;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(FULL, inc, o);
            if (lane >= o) inc += v;
        }
        off[tid + 1] = inc;
        if (tid == 0) off[0] = 0;
    }
    __syncthreads();
    const int total = off[segs];
    for (int i = tid; i < total; i += MERGE_THREADS) { /* segment s's candidates after those before it */
        int lo = 0, hi = segs - 1;                     /* the s with off[s] <= i < off[s + 1] */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (off[mid] <= i) lo = mid;
            else hi = mid - 1;
        }
        c[i] = sg[lo].cand[i - off[lo]];
    }
    __syncthreads();
    /* the K-th largest candidate (each is unique: key, then ~id), 8 bits a pass from the top,
     * as k_top_seg finds its threshold; then the K at or above it, each placed by its rank */
    cu_logit_top *o = out + r;
    const int K = total < CU_TOP_MAX ? total : CU_TOP_MAX;
    unsigned long long prefix = 0, mask = 0;
    unsigned left = (unsigned)K;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += MERGE_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < total; i0 += MERGE_THREADS) {
            const int i = i0 + tid;
            const unsigned long long v = i < total ? c[i] : 0ull;
            hist_add(hist, i < total && (v & mask) == prefix, (unsigned)(v >> shift) & 255u);
        }
        __syncthreads();
        if (tid < 32) hist_pick(hist, left, &pick_bin, &pick_left);
        __syncthreads();
        prefix |= (unsigned long long)pick_bin << shift, mask |= 255ull << shift, left = pick_left;
        __syncthreads(); /* pick_bin is read before the next pass writes it */
    }
    if (tid == 0) n_sel = 0;
    __syncthreads();
    for (int i = tid; i < total; i += MERGE_THREADS)
        if (c[i] >= prefix) sel[atomicAdd(&n_sel, 1u)] = c[i];
    __syncthreads();
    if (tid < K) {
        const unsigned long long v = sel[tid];
        int rank = 0;
        for (int j = 0; j < K; j++) rank += sel[j] > v;
        o->id[rank] = (int32_t)(0xffffffffu - (uint32_t)(v & 0xffffffffu));
        o->val[rank] = float_of((uint32_t)(v >> 32));
    }
    if (tid == 0) {
        float mx = -INFINITY;
        int fin = 1;
        for (int s = 0; s < segs; s++) mx = fmaxf(mx, s_max[s]), fin &= s_fin[s];
        double sum = 0.0;
        for (int s = 0; s < segs; s++) sum += s_sum[s] * exp((double)s_max[s] - (double)mx);
        o->n = K, o->finite = fin;
        o->lse = fin ? (double)mx + log(sum) : 0.0;
    }
}

extern "C" void cu_logit_tops(cu_stream s, const float *lg, int64_t V, const int32_t *rows, int64_t n, void *scratch,
                              cu_logit_top *out) {
    const int segs = cu_logit_top_segs(V);
    if (n <= 0 || segs == 0) return;
    k_top_seg<<<dim3((unsigned)n, (unsigned)segs), SEG_THREADS, 0, s>>>(lg, V, rows, (top_seg *)scratch);
    k_top_merge<<<(unsigned)n, MERGE_THREADS, 0, s>>>((const top_seg *)scratch, segs, out);
}
