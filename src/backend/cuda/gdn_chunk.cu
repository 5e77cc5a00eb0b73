/* ==== CUDA kernels: the chunked delta rule (see cuda_kernels.h) ====
 *
 * The delta rule of many-token items in `bf16` precision, 64 tokens at a time on tensor
 * cores (tf32 operands, fp32 accumulation and state). Per value head, for a chunk of n <= 64
 * tokens whose log decays cumulate to g (g_s = sum of l_u, u <= s, from the chunk's start):
 *
 *   A[s][j] = beta_s exp(g_s - g_j) (k_s . k_j), j < s        (strictly lower)
 *   (I + A) W = diag(beta exp(g)) K,  (I + A) U = diag(beta) V  (forward substitution)
 *   P[t][s] = exp(g_t - g_s) (q_t . k_s), s <= t
 *
 * and then, from the state S [Dk][Dv] at the chunk's start,
 *
 *   D = U - W S                       (each token's beta-weighted error, as the steps make it)
 *   O = diag(exp(g)) Q S + P D        (the chunk's outputs)
 *   S <- exp(g_last) S + K^T diag(exp(g_last - g)) D
 *
 * which is the per-step recurrence of gdn.cu rearranged (exactly, in real arithmetic). The
 * first part has no dependence between chunks: k_gdn_cprep runs a block per (chunk, head),
 * the two Gram products on tensor cores and the substitution a thread per column, and
 * writes W, U, P and g to the chunk workspace. The second is the only sequential part:
 * k_gdn_cscan runs a block per (item, head, 32 state columns) over the item's chunks in
 * order, the state in shared memory, the three products on tensor cores; two such blocks
 * share an SM, each one's loads running while the other computes. The workspace holds
 * ws_chunks chunks; cu_gdn_chunked runs a step's chunks in slabs of that many. Products are
 * mma.sync m16n8k8 with tf32 operands (rounded to nearest) and fp32 sums.
 *
 * Rows past a partial chunk's end are zeros (beta 0, k 0, q 0, g constant), so they change
 * neither the outputs nor the state.
 */
#include "backend/cuda/cu_common.cuh"

#define GC 64          /* tokens a chunk */
#define GC_THREADS 256 /* both kernels */
#define GC_COLS 32     /* state columns a scan block */

/* an MMA operand's bits: x rounded to tf32, or (TF32: x holds a tf32 value already, k_gdn_cprep's
 * W and P, the scan's D) as it is */
template <bool TF32 = false> __device__ __forceinline__ uint32_t tf32_bits(float x) {
    return TF32 ? __float_as_uint(x) : tf32_of(x);
}

/* a's fragment of rows r0 .. r0 + 15, columns k0 .. k0 + 7 of a row-major smem matrix */
template <bool TF32 = false>
__device__ __forceinline__ void frag_a(uint32_t (&f)[4], const float *m, int ld, int r0, int k0, int lane) {
    const float *e = m + (r0 + (lane >> 2)) * ld + k0 + (lane & 3);
    f[0] = tf32_bits<TF32>(e[0]), f[1] = tf32_bits<TF32>(e[8 * ld]), f[2] = tf32_bits<TF32>(e[4]),
    f[3] = tf32_bits<TF32>(e[8 * ld + 4]);
}

/* b's fragment of the 8-column tile n0 + 8 j, rows k0 .. k0 + 7, of B [k][n] (stride ldb) */
template <bool TF32 = false>
__device__ __forceinline__ void frag_b(uint32_t &b0, uint32_t &b1, const float *B, int ldb, int n0, int k0, int j, int lane) {
    const float *br = B + (k0 + (lane & 3)) * ldb + n0 + 8 * j + (lane >> 2);
    b0 = tf32_bits<TF32>(br[0]), b1 = tf32_bits<TF32>(br[4 * ldb]);
}

/* acc[j] += A B for rows m0 .. m0 + 15 and the 8-column tiles n0 and n0 + 8, over k < k_end:
 * A row-major (stride lda), B [k][n] (stride ldb) in shared memory; TF32: both hold tf32
 * values already */
template <bool TF32 = false>
__device__ __forceinline__ void mma_16x16(float (&acc)[2][4], const float *A, int lda, const float *B, int ldb, int m0,
                                          int n0, int k_end, int lane) {
#pragma unroll 4
    for (int k0 = 0; k0 < k_end; k0 += 8) {
        uint32_t f[4];
        frag_a<TF32>(f, A, lda, m0, k0, lane);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            uint32_t b0, b1;
            frag_b<TF32>(b0, b1, B, ldb, n0, k0, j, lane);
            mma_tf32(acc[j], f[0], f[1], f[2], f[3], b0, b1);
        }
    }
}

/* acc1 += A1 B and acc2 += A2 B (A1's values tf32 already), each as mma_16x16 sums it, B's
 * fragments loaded and rounded once for both */
__device__ __forceinline__ void mma_16x16_two(float (&acc1)[2][4], const float *A1, float (&acc2)[2][4], const float *A2,
                                              int lda, const float *B, int ldb, int m0, int n0, int k_end, int lane) {
#pragma unroll 4
    for (int k0 = 0; k0 < k_end; k0 += 8) {
        uint32_t f1[4], f2[4];
        frag_a<true>(f1, A1, lda, m0, k0, lane);
        frag_a(f2, A2, lda, m0, k0, lane);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            uint32_t b0, b1;
            frag_b(b0, b1, B, ldb, n0, k0, j, lane);
            mma_tf32(acc1[j], f1[0], f1[1], f1[2], f1[3], b0, b1);
            mma_tf32(acc2[j], f2[0], f2[1], f2[2], f2[3], b0, b1);
        }
    }
}

/* ---- the chunk's own part: W, U, P, g ---- */

/* shared memory, floats: q [GC][max(DK, Dv) + 4], where v [GC][Dv + 4] goes once q is read;
 * k [GC][DK + 4] (row-major), A [GC][GC + 4], beta, g and beta exp(g) [GC] */
template <int DK> __host__ __device__ constexpr int cprep_qw(int Dv) { return (DK > Dv ? DK : Dv) + 4; }
template <int DK> constexpr size_t cprep_floats(int Dv) {
    return (size_t)GC * cprep_qw<DK>(Dv) + (size_t)GC * (DK + 4) + GC * (GC + 4) + 3 * GC;
}

template <int DK>
__global__ void __launch_bounds__(GC_THREADS) k_gdn_cprep(cu_gdn_args a, int c0) {
    pdl_wait();
    extern __shared__ float4 cp_sh4[];
    constexpr int SW = DK + 4, LA = GC + 4;
    const int Dv = a.Dv, SV = Dv + 4; /* v's stride, where q was */
    float *Qs = (float *)cp_sh4, *Ks = Qs + GC * cprep_qw<DK>(Dv), *A = Ks + GC * SW, *bt = A + GC * LA, *g = bt + GC, *be = g + GC;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, h = blockIdx.y, c = c0 + blockIdx.x;
    const int64_t t0 = a.chunks[4 * c];
    const int n = a.chunks[4 * c + 1], kh = h / (a.Hv / a.Hk);
    float *W = a.chunk_ws + ((size_t)blockIdx.x * a.Hv + h) * (size_t)cu_gdn_chunk_floats(DK, Dv);
    float *U = W + GC * DK, *P = U + GC * Dv, *G = P + GC * GC;
    /* q and k of the chunk (zeros past its end), every copy in flight at once */
    for (int e = tid; e < GC * DK / 4; e += GC_THREADS) {
        const int r = e / (DK / 4), i = e % (DK / 4) * 4;
        const float *row = a.qkv + (t0 + (r < n ? r : 0)) * a.cd + (int64_t)kh * DK + i;
        cp_async16(Qs + r * SW + i, row, r < n ? 16 : 0);
        cp_async16(Ks + r * SW + i, row + a.kd, r < n ? 16 : 0);
    }
    cp_async_commit();
    /* beta and the cumulated log decay (warp 0: an inclusive scan of each half, then the
     * second half on the first's total; constant past the end) */
    if (tid < 32) {
        float l[2], b[2];
        for (int half = 0; half < 2; half++) {
            const int r = tid + 32 * half;
            b[half] = 0.0f, l[half] = 0.0f;
            if (r < n) {
                b[half] = sigmoidf_(a.b[(t0 + r) * a.Hv + h]);
                l[half] = a.neg_exp_a[h] * softplusf_(a.a[(t0 + r) * a.Hv + h] + a.dt_bias[h]);
            }
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float u = __shfl_up_sync(FULL, l[half], o);
                if (tid >= o) l[half] += u;
            }
        }
        l[1] += __shfl_sync(FULL, l[0], 31);
        for (int half = 0; half < 2; half++) {
            bt[tid + 32 * half] = b[half];
            g[tid + 32 * half] = l[half];
            be[tid + 32 * half] = b[half] * expf(l[half]); /* once a row, not once a column */
            G[tid + 32 * half] = l[half];
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    /* k_r . k_j and q_r . k_j on tensor cores: warp w the rows 16 (w / 2) .. + 15, columns
     * 32 (w % 2) .. + 31 (tiles wholly above the diagonal left zero), into A and P */
    {
        const int m0 = 16 * (w >> 1), n0 = 32 * (w & 1), gid = lane >> 2, tig = lane & 3;
        float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 8) {
            uint32_t fk[4], fq[4];
            frag_a(fk, Ks, SW, m0, k0, lane);
            frag_a(fq, Qs, SW, m0, k0, lane);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (n0 + 8 * j > m0 + 15) continue;
                const float *br = Ks + (n0 + 8 * j + gid) * SW + k0 + tig; /* b[i][col] = k_col[i] */
                const uint32_t b0 = tf32_of(br[0]), b1 = tf32_of(br[4]);
                mma_tf32(kk[j], fk[0], fk[1], fk[2], fk[3], b0, b1);
                mma_tf32(qk[j], fq[0], fq[1], fq[2], fq[3], b0, b1);
            }
        }
        /* q is read: the chunk's v [GC][Dv] into its place (zeros past the end), in flight
         * while A and P are made */
        __syncthreads();
        float *Vs = Qs; /* stride SV */
        for (int e = tid; e < GC * Dv / 4; e += GC_THREADS) {
            const int r = e / (Dv / 4), i = e % (Dv / 4) * 4;
            cp_async16(Vs + r * SV + i, a.qkv + (t0 + (r < n ? r : 0)) * a.cd + 2 * a.kd + (int64_t)h * Dv + i, r < n ? 16 : 0);
        }
        cp_async_commit();
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = m0 + gid + 8 * hh, col = n0 + 8 * j + 2 * tig;
                float av[2], pv[2];
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    const float d = expf(g[r] - g[col + v]);
                    av[v] = col + v < r ? bt[r] * d * kk[j][2 * hh + v] : 0.0f;
                    pv[v] = col + v <= r ? d * qk[j][2 * hh + v] : 0.0f;
                }
                *(float2 *)(A + r * LA + col) = make_float2(av[0], av[1]);
                /* P is only ever an MMA operand: rounded to tf32 here, once (the scan's
                 * rounding of it again changes nothing) */
                *(float2 *)(P + r * GC + col) = make_float2(tf32_val(pv[0]), tf32_val(pv[1]));
            }
    }
    cp_async_wait<0>();
    __syncthreads();
    /* (I + A) X = R by forward substitution, a thread per column of [W | U], the column in
     * registers; A's rows read four at a time (the same address across the block) */
    for (int col = tid; col < DK + Dv; col += GC_THREADS) {
        float x[GC];
        if (col < DK) {
#pragma unroll
            for (int r = 0; r < GC; r++) x[r] = be[r] * Ks[r * SW + col];
        } else {
            const float *v = Qs + (col - DK); /* Vs */
#pragma unroll
            for (int r = 0; r < GC; r++) x[r] = bt[r] * v[r * SV]; /* (beta and v are 0 past the end) */
        }
#pragma unroll
        for (int r = 1; r < GC; r++) {
            /* four sums (the columns j mod 4 apart), so that the chain of dependent FMAs is
             * a quarter as long */
            float s0 = x[r], s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
            for (int j = 0; j < (r & ~3); j += 4) {
                const float4 e = *(const float4 *)(A + r * LA + j);
                s0 = fmaf(-e.x, x[j], s0);
                s1 = fmaf(-e.y, x[j + 1], s1);
                s2 = fmaf(-e.z, x[j + 2], s2);
                s3 = fmaf(-e.w, x[j + 3], s3);
            }
#pragma unroll
            for (int j = r & ~3; j < r; j++) s0 = fmaf(-A[r * LA + j], x[j], s0);
            x[r] = (s0 + s1) + (s2 + s3);
        }
        if (col < DK) { /* W is only ever an MMA operand: rounded to tf32 once, as P */
#pragma unroll
            for (int r = 0; r < GC; r++) W[r * DK + col] = tf32_val(x[r]);
        } else {
#pragma unroll
            for (int r = 0; r < GC; r++) U[r * Dv + (col - DK)] = x[r];
        }
    }
}

/* ---- the scan over an item's chunks ---- */

/* shared memory, floats: X (q [GC][DK + 4], then k [GC][DK + 8]), Y (w [GC][DK + 4], then d
 * and diag(exp(g_last - g)) d, each [GC][GC_COLS + 8]), P [GC][GC + 4], the state [DK][GC_COLS
 * + 8], g and exp(g_last - g) [GC]. Strides that keep every fragment's 32 loads on distinct
 * banks: a row-major a (rows lane/4 apart) wants a stride of 4 mod 32, a transposed one or a
 * b (rows lane%4 apart) 8. */
#define CS_LD (GC_COLS + 8)
/* the floats of X and of Y: the widest of what each holds in turn */
template <int DK> __host__ __device__ constexpr int cscan_buf() { return GC * (DK + 8 > CS_LD ? DK + 8 : CS_LD); }
template <int DK> __host__ __device__ constexpr int cscan_ybuf() {
    return cscan_buf<DK>() > 2 * GC * CS_LD ? cscan_buf<DK>() : 2 * GC * CS_LD;
}
template <int DK> constexpr size_t cscan_floats() {
    return (size_t)cscan_buf<DK>() + cscan_ybuf<DK>() + GC * (GC + 4) + (size_t)DK * CS_LD + 2 * GC;
}

template <int DK>
__global__ void __launch_bounds__(GC_THREADS, 2) k_gdn_cscan(cu_plan p, cu_gdn_args a, int c0, int c1) {
    pdl_wait();
    const int it = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * GC_COLS;
    int cb = a.item_chunk[it], ce = a.item_chunk[it + 1];
    cb = cb > c0 ? cb : c0;
    ce = ce < c1 ? ce : c1;
    if (cb >= ce) return;
    extern __shared__ float4 cs_sh4[];
    constexpr int SW = DK + 4, SK = DK + 8, LP = GC + 4;
    const int Dv = a.Dv, kh = h / (a.Hv / a.Hk);
    const int nc = Dv - col0 < GC_COLS ? Dv - col0 : GC_COLS; /* a multiple of 8 */
    float *X = (float *)cs_sh4, *Y = X + cscan_buf<DK>(), *Ps = Y + cscan_ybuf<DK>(), *Ss = Ps + GC * LP, *gs = Ss + DK * CS_LD, *es = gs + GC;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const size_t CF = (size_t)cu_gdn_chunk_floats(DK, Dv);
    float *Sg = a.rec_state + (size_t)p.slot[it] * a.rec_stride + (size_t)h * DK * Dv + col0;
    for (int e = tid; e < DK * GC_COLS; e += GC_THREADS) {
        const int i = e / GC_COLS, j = e % GC_COLS;
        Ss[i * CS_LD + j] = j < nc ? Sg[(size_t)i * Dv + j] : 0.0f;
    }
    /* a chunk's W and g into Y, its q into X; its P; its k into X (t0, n: the chunk's first
     * token and tokens, read once a chunk: each copy's asm is a memory clobber) */
    auto issue_wq = [&](int c, int64_t t0, int n) {
        const float *ws = a.chunk_ws + ((size_t)(c - c0) * a.Hv + h) * CF;
        for (int e = tid; e < GC * DK / 4; e += GC_THREADS) {
            const int r = e / (DK / 4), i = e % (DK / 4) * 4;
            cp_async16(Y + r * SW + i, ws + r * DK + i, 16);
            cp_async16(X + r * SW + i, a.qkv + (t0 + (r < n ? r : 0)) * a.cd + (int64_t)kh * DK + i, r < n ? 16 : 0);
        }
        if (tid < GC / 4) cp_async16(gs + 4 * tid, ws + GC * (DK + Dv) + GC * GC + 4 * tid, 16);
    };
    auto issue_p = [&](int c) {
        const float *P = a.chunk_ws + ((size_t)(c - c0) * a.Hv + h) * CF + GC * (DK + Dv);
        for (int e = tid; e < GC * GC / 4; e += GC_THREADS) {
            const int r = e / (GC / 4), j = e % (GC / 4) * 4;
            cp_async16(Ps + r * LP + j, P + r * GC + j, 16);
        }
    };
    auto issue_k = [&](int64_t t0, int n) {
        for (int e = tid; e < GC * DK / 4; e += GC_THREADS) {
            const int r = e / (DK / 4), i = e % (DK / 4) * 4;
            cp_async16(X + r * SK + i, a.qkv + (t0 + (r < n ? r : 0)) * a.cd + a.kd + (int64_t)kh * DK + i, r < n ? 16 : 0);
        }
    };
    int64_t t0n = a.chunks[4 * cb]; /* the next chunk's first token and tokens */
    int nn = a.chunks[4 * cb + 1];
    issue_wq(cb, t0n, nn);
    issue_p(cb);
    cp_async_commit();
    /* phases A and B: warp w the rows 16 (w / 2) .. + 15 and columns 16 (w % 2) .. + 15 */
    const int mA = 16 * (w >> 1), nA = 16 * (w & 1);
    for (int c = cb; c < ce; c++) {
        const int64_t t0 = t0n;
        const int n = nn;
        if (c + 1 < ce) t0n = a.chunks[4 * (c + 1)], nn = a.chunks[4 * (c + 1) + 1];
        /* this thread's U, ahead of the product it is subtracted from */
        const float *U = a.chunk_ws + ((size_t)(c - c0) * a.Hv + h) * CF + GC * DK + col0;
        float2 u[2][2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = nA + 8 * j + 2 * tig;
            const bool on = col < nc;
            u[j][0] = on ? *(const float2 *)(U + (size_t)(mA + gid) * Dv + col) : make_float2(0.0f, 0.0f);
            u[j][1] = on ? *(const float2 *)(U + (size_t)(mA + gid + 8) * Dv + col) : make_float2(0.0f, 0.0f);
        }
        cp_async_wait<0>();
        __syncthreads(); /* W, q, g, P; the state */
        /* A: D = U - W S; and B's Q S beside it, on the same fragments of S */
        float acc[2][4] = {}, qs[2][4] = {};
        mma_16x16_two(acc, Y, qs, X, SW, Ss, CS_LD, mA, nA, DK, lane);
        const float g_last = gs[GC - 1], dec0 = expf(gs[mA + gid]), dec1 = expf(gs[mA + gid + 8]);
        if (tid < GC) es[tid] = expf(g_last - gs[tid]);
        __syncthreads(); /* W and q read */
        issue_k(t0, n); /* k into q's place, in flight through B */
        cp_async_commit();
        /* D (only ever an MMA operand) rounded to tf32 once, for B; and diag(e) D so, for C */
        float *Ds = Y, *Des = Y + GC * CS_LD;
        {
            const int r0 = mA + gid;
            const float e0 = es[r0], e1 = es[r0 + 8];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int col = nA + 8 * j + 2 * tig;
                const float d0 = u[j][0].x - acc[j][0], d1 = u[j][0].y - acc[j][1];
                const float d2 = u[j][1].x - acc[j][2], d3 = u[j][1].y - acc[j][3];
                *(float2 *)(Ds + r0 * CS_LD + col) = make_float2(tf32_val(d0), tf32_val(d1));
                *(float2 *)(Ds + (r0 + 8) * CS_LD + col) = make_float2(tf32_val(d2), tf32_val(d3));
                *(float2 *)(Des + r0 * CS_LD + col) = make_float2(tf32_val(d0 * e0), tf32_val(d1 * e0));
                *(float2 *)(Des + (r0 + 8) * CS_LD + col) = make_float2(tf32_val(d2 * e1), tf32_val(d3 * e1));
            }
        }
        __syncthreads(); /* D */
        /* B: O = diag(exp(g)) Q S + P D */
#pragma unroll
        for (int j = 0; j < 2; j++)
            acc[j][0] = qs[j][0] * dec0, acc[j][1] = qs[j][1] * dec0, acc[j][2] = qs[j][2] * dec1, acc[j][3] = qs[j][3] * dec1;
        mma_16x16<true>(acc, Ps, LP, Ds, CS_LD, mA, nA, mA + 16, lane); /* P is lower triangular; P and D tf32 */
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = nA + 8 * j + 2 * tig, r0 = mA + gid, r1 = r0 + 8;
            if (col >= nc) continue;
            float *o = a.mix + t0 * a.vd + (int64_t)h * Dv + col0 + col;
            if (r0 < n) *(float2 *)(o + (int64_t)r0 * a.vd) = make_float2(acc[j][0], acc[j][1]);
            if (r1 < n) *(float2 *)(o + (int64_t)r1 * a.vd) = make_float2(acc[j][2], acc[j][3]);
        }
        __syncthreads(); /* P and the state read */
        if (c + 1 < ce) issue_p(c + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); /* k */
        /* C: S = exp(g_last) S + K^T diag(e) D, warp w the rows 16 w, 16 (w + 8), ... and every
         * column */
        const float dl = expf(g_last);
        for (int m0 = 16 * w; m0 < DK; m0 += 16 * 8) {
            float sa[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = 8 * j + 2 * tig;
                const float2 s0 = *(const float2 *)(Ss + (m0 + gid) * CS_LD + col);
                const float2 s1 = *(const float2 *)(Ss + (m0 + gid + 8) * CS_LD + col);
                sa[j][0] = dl * s0.x, sa[j][1] = dl * s0.y, sa[j][2] = dl * s1.x, sa[j][3] = dl * s1.y;
            }
#pragma unroll
            for (int k0 = 0; k0 < GC; k0 += 8) {
                const float *kr = X + (k0 + tig) * SK + m0 + gid; /* a[i][r] = k_r[i] */
                const uint32_t a0 = tf32_of(kr[0]), a1 = tf32_of(kr[8]), a2 = tf32_of(kr[4 * SK]), a3 = tf32_of(kr[4 * SK + 8]);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float *dr = Des + (k0 + tig) * CS_LD + 8 * j + gid;
                    mma_tf32(sa[j], a0, a1, a2, a3, __float_as_uint(dr[0]), __float_as_uint(dr[4 * CS_LD]));
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = 8 * j + 2 * tig;
                *(float2 *)(Ss + (m0 + gid) * CS_LD + col) = make_float2(sa[j][0], sa[j][1]);
                *(float2 *)(Ss + (m0 + gid + 8) * CS_LD + col) = make_float2(sa[j][2], sa[j][3]);
            }
        }
        __syncthreads(); /* the state; k and D read */
        if (c + 1 < ce) issue_wq(c + 1, t0n, nn);
        cp_async_commit();
    }
    cp_async_wait<0>();
    for (int e = tid; e < DK * GC_COLS; e += GC_THREADS) {
        const int i = e / GC_COLS, j = e % GC_COLS;
        if (j < nc) Sg[(size_t)i * Dv + j] = Ss[i * CS_LD + j];
    }
}

template <int DK> static int chunked_prepare(int Dv) {
    if (cudaFuncSetAttribute(k_gdn_cprep<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(cprep_floats<DK>(Dv) * sizeof(float))) != cudaSuccess)
        return -1;
    return cudaFuncSetAttribute(k_gdn_cscan<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(cscan_floats<DK>() * sizeof(float))) == cudaSuccess ? 0 : -1;
}

extern "C" int cu_gdn_chunked_prepare(int Dk, int Dv) {
    if (Dv < 8 || Dv % 8 != 0 || Dk + Dv > 2 * GC_THREADS) return -1;
    switch (Dk) {
    case 16: return chunked_prepare<16>(Dv);
    case 32: return chunked_prepare<32>(Dv);
    case 64: return chunked_prepare<64>(Dv);
    case 128: return chunked_prepare<128>(Dv);
    default: return -1;
    }
}

template <int DK> static void chunked_run(cu_stream s, const cu_plan *p, const cu_gdn_args *a) {
    for (int c0 = 0; c0 < a->n_chunks; c0 += a->ws_chunks) {
        const int c1 = c0 + a->ws_chunks < a->n_chunks ? c0 + a->ws_chunks : a->n_chunks;
        launch_pdl(k_gdn_cprep<DK>, dim3((unsigned)(c1 - c0), (unsigned)a->Hv), dim3(GC_THREADS),
                   cprep_floats<DK>(a->Dv) * sizeof(float), s, *a, c0);
        dim3 gs((unsigned)p->n_items, (unsigned)a->Hv, (unsigned)((a->Dv + GC_COLS - 1) / GC_COLS));
        launch_pdl(k_gdn_cscan<DK>, gs, dim3(GC_THREADS), cscan_floats<DK>() * sizeof(float), s, *p, *a, c0, c1);
    }
}

extern "C" void cu_gdn_chunked(cu_stream s, const cu_plan *p, const cu_gdn_args *a) {
    switch (a->Dk) {
    case 16: chunked_run<16>(s, p, a); break;
    case 32: chunked_run<32>(s, p, a); break;
    case 64: chunked_run<64>(s, p, a); break;
    default: chunked_run<128>(s, p, a); break;
    }
}
