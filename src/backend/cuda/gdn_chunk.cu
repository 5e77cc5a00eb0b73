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
 * the two Gram products on tensor cores (tf32 operands) and the substitution a thread per
 * column in fp32, and writes U and g in fp32 and W, P, exp(g) q and exp(g_last - g) k
 * rounded to bf16 (the scan's operands, as the peers' chunked kernels take them) to the
 * chunk workspace. The second is the only sequential part: k_gdn_cscan runs a block per
 * (item, head, 32 state columns) over the item's chunks in order, the fp32 state in its
 * warps' accumulators (a bf16 copy in shared memory as the products' operand), the products
 * mma.sync m16n8k16 on bf16 operands with fp32 sums, their fragments by ldmatrix; two such
 * blocks share an SM, each one's loads running while the other computes. The workspace holds
 * ws_chunks chunks; cu_gdn_chunked runs a step's chunks in slabs of that many.
 *
 * Rows past a partial chunk's end are zeros (beta 0, k 0, q 0, g constant), so they change
 * neither the outputs nor the state.
 */
#include "backend/cuda/cu_common.cuh"

#define GC 64          /* tokens a chunk */
#define GC_THREADS 256 /* both kernels */
#define GC_COLS 32     /* state columns a scan block */

/* a's fragment (tf32) of rows r0 .. r0 + 15, columns k0 .. k0 + 7 of a row-major smem matrix */
__device__ __forceinline__ void frag_a(uint32_t (&f)[4], const float *m, int ld, int r0, int k0, int lane) {
    const float *e = m + (r0 + (lane >> 2)) * ld + k0 + (lane & 3);
    f[0] = tf32_of(e[0]), f[1] = tf32_of(e[8 * ld]), f[2] = tf32_of(e[4]), f[3] = tf32_of(e[8 * ld + 4]);
}

/* lo and hi rounded to bf16, as a pair */
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) { return pack2(f2bf16(lo), f2bf16(hi)); }

/* a (chunk, head)'s place in the workspace (cu_gdn_chunk_floats): U [GC][Dv] and g [GC] in
 * fp32, then W, exp(g) q, exp(g_last - g) k [GC][DK] and P [GC][GC] in bf16 (row-major) */
struct gc_ws {
    float *U, *G;
    uint16_t *W, *Q, *K, *P;
};
template <int DK> __device__ __forceinline__ gc_ws gc_ws_at(const cu_gdn_args &a, int slab_chunk, int h) {
    gc_ws r;
    r.U = a.chunk_ws + ((size_t)slab_chunk * a.Hv + h) * (size_t)cu_gdn_chunk_floats(DK, a.Dv);
    r.G = r.U + GC * a.Dv;
    r.W = (uint16_t *)(r.G + GC);
    r.Q = r.W + GC * DK, r.K = r.Q + GC * DK, r.P = r.K + GC * DK;
    return r;
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
    const gc_ws cw = gc_ws_at<DK>(a, blockIdx.x, h);
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
            cw.G[tid + 32 * half] = l[half];
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    /* the scan's exp(g) q and exp(g_last - g) k, in bf16 */
    for (int e = tid; e < GC * DK / 4; e += GC_THREADS) {
        const int r = e / (DK / 4), i = e % (DK / 4) * 4;
        const float eq = expf(g[r]), ek = expf(g[GC - 1] - g[r]);
        const float4 q4 = *(const float4 *)(Qs + r * SW + i), k4 = *(const float4 *)(Ks + r * SW + i);
        *(uint2 *)(cw.Q + r * DK + i) = make_uint2(bf16x2(eq * q4.x, eq * q4.y), bf16x2(eq * q4.z, eq * q4.w));
        *(uint2 *)(cw.K + r * DK + i) = make_uint2(bf16x2(ek * k4.x, ek * k4.y), bf16x2(ek * k4.z, ek * k4.w));
    }
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
                *(uint32_t *)(cw.P + r * GC + col) = bf16x2(pv[0], pv[1]);
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
        if (col < DK) {
#pragma unroll
            for (int r = 0; r < GC; r++) cw.W[r * DK + col] = f2bf16(x[r]);
        } else {
#pragma unroll
            for (int r = 0; r < GC; r++) cw.U[r * Dv + (col - DK)] = x[r];
        }
    }
}

/* ---- the scan over an item's chunks ---- */

/* shared memory, bytes: W and exp(g) q [GC][DK] (one chunk's), exp(g_last - g) k [GC][DK] and P
 * [GC][GC] (two chunks': the next one's copied in during this one), the bf16 state [DK][GC_COLS]
 * and D [GC][GC_COLS]; every row 16 bytes past its values, so that ldmatrix's 8 rows fall on
 * distinct banks */
static_assert(GC_COLS == 32, "the scan's warps take 32 state columns");
template <int DK> struct cscan_at {
    static constexpr int SR = (DK + 8) * 2, PR = (GC + 8) * 2, CR = (GC_COLS + 8) * 2; /* a row's bytes */
    static constexpr int W = 0, Q = W + GC * SR, K = Q + GC * SR, P = K + 2 * GC * SR, S = P + 2 * GC * PR;
    static constexpr int D = S + DK * CR, BYTES = D + GC * CR;
};
template <int DK> constexpr size_t cscan_bytes() { return (size_t)cscan_at<DK>::BYTES; }

template <int DK>
__global__ void __launch_bounds__(GC_THREADS, 2) k_gdn_cscan(cu_plan p, cu_gdn_args a, int c0, int c1) {
    pdl_wait();
    typedef cscan_at<DK> L;
    const int it = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * GC_COLS;
    int cb = a.item_chunk[it], ce = a.item_chunk[it + 1];
    cb = cb > c0 ? cb : c0;
    ce = ce < c1 ? ce : c1;
    if (cb >= ce) return;
    extern __shared__ float4 cs_sh4[];
    uint8_t *sm = (uint8_t *)cs_sh4;
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(sm);
    const int Dv = a.Dv;
    const int nc = Dv - col0 < GC_COLS ? Dv - col0 : GC_COLS; /* a multiple of 8 */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gid = lane >> 2, tig = lane & 3;
    /* the state: warp w's accumulators hold its rows 16 w .. + 15 (of DK), every column, in fp32
     * (s[j][e]: row 16 w + gid (+ 8 for e >= 2), column 8 j + 2 tig + (e & 1)); its bf16 copy in
     * shared memory is what the products read */
    const int m0 = 16 * w;
    const bool owns = m0 < DK;
    float *Sg = a.rec_state + (size_t)p.slot[it] * a.rec_stride + (size_t)h * DK * Dv + col0;
    float s[4][4];
    auto put_state = [&] {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int col = 8 * j + 2 * tig;
            *(uint32_t *)(sm + L::S + (m0 + gid) * L::CR + 2 * col) = bf16x2(s[j][0], s[j][1]);
            *(uint32_t *)(sm + L::S + (m0 + gid + 8) * L::CR + 2 * col) = bf16x2(s[j][2], s[j][3]);
        }
    };
    if (owns) {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = m0 + gid + (e >= 2 ? 8 : 0), col = 8 * j + 2 * tig + (e & 1);
                s[j][e] = col < nc ? Sg[(size_t)r * Dv + col] : 0.0f;
            }
        put_state();
    }
    /* chunk c's W and exp(g) q; its exp(g_last - g) k and P into buffer c & 1 */
    auto issue_wq = [&](int c) {
        const gc_ws cw = gc_ws_at<DK>(a, c - c0, h);
        for (int e = tid; e < GC * DK / 8; e += GC_THREADS) {
            const int r = e / (DK / 8), i = e % (DK / 8) * 8;
            cp_async16(sm + L::W + r * L::SR + 2 * i, cw.W + r * DK + i, 16);
            cp_async16(sm + L::Q + r * L::SR + 2 * i, cw.Q + r * DK + i, 16);
        }
    };
    auto issue_kp = [&](int c) {
        const gc_ws cw = gc_ws_at<DK>(a, c - c0, h);
        uint8_t *kb = sm + L::K + (c & 1) * GC * L::SR, *pb = sm + L::P + (c & 1) * GC * L::PR;
        for (int e = tid; e < GC * DK / 8; e += GC_THREADS) {
            const int r = e / (DK / 8), i = e % (DK / 8) * 8;
            cp_async16(kb + r * L::SR + 2 * i, cw.K + r * DK + i, 16);
        }
        for (int e = tid; e < GC * GC / 8; e += GC_THREADS) {
            const int r = e / (GC / 8), i = e % (GC / 8) * 8;
            cp_async16(pb + r * L::PR + 2 * i, cw.P + r * GC + i, 16);
        }
    };
    /* in flight, in this order: k and P of the chunk, W and q of the chunk, k and P of the next */
    issue_kp(cb);
    cp_async_commit();
    issue_wq(cb);
    cp_async_commit();
    if (cb + 1 < ce) issue_kp(cb + 1);
    cp_async_commit();
    /* D = U - W S and Q S: warp w the rows 16 (w / 2) .. + 15 and columns 16 (w % 2) .. + 15 */
    const int mA = 16 * (w >> 1), nA = 16 * (w & 1);
    /* a lane's ldmatrix rows: A fragments (row-major [m][k]) and B fragments ([k][n], .trans) of
     * rows lane % 16 and the 8 columns from 8 (lane / 16); A fragments of a transposed [k][m]
     * (.trans): row lane % 8 + 8 (lane / 16), columns from 8 ((lane / 8) % 2) */
    const int lr = lane & 15, lc = (lane >> 4) * 8, tr = (lane & 7) + (lane >> 4) * 8, tc = ((lane >> 3) & 1) * 8;
    for (int c = cb; c < ce; c++) {
        const gc_ws cw = gc_ws_at<DK>(a, c - c0, h);
        const int64_t t0 = a.chunks[4 * c];
        const int n = a.chunks[4 * c + 1];
        /* this thread's U and the chunk's last log decay, ahead of the products */
        float2 u[2][2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = nA + 8 * j + 2 * tig;
            const bool on = col < nc;
            const float *U = cw.U + col0 + col;
            u[j][0] = on ? *(const float2 *)(U + (size_t)(mA + gid) * Dv) : make_float2(0.0f, 0.0f);
            u[j][1] = on ? *(const float2 *)(U + (size_t)(mA + gid + 8) * Dv) : make_float2(0.0f, 0.0f);
        }
        const float g_last = cw.G[GC - 1];
        cp_async_wait<1>();
        __syncthreads(); /* W, q, k and P of the chunk; the state */
        float dacc[2][4] = {}, o[2][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 16) {
            uint32_t fw[4], fq[4], fs[4];
            const uint32_t ra = (mA + lr) * L::SR + 2 * (k0 + lc);
            ldsm_x4(fw, sa + L::W + ra);
            ldsm_x4(fq, sa + L::Q + ra);
            ldsm_x4_t(fs, sa + L::S + (k0 + lr) * L::CR + 2 * (nA + lc));
#pragma unroll
            for (int j = 0; j < 2; j++) {
                mma_bf16(dacc[j], fw[0], fw[1], fw[2], fw[3], fs[2 * j], fs[2 * j + 1]);
                mma_bf16(o[j], fq[0], fq[1], fq[2], fq[3], fs[2 * j], fs[2 * j + 1]);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = nA + 8 * j + 2 * tig, r0 = mA + gid;
            *(uint32_t *)(sm + L::D + r0 * L::CR + 2 * col) = bf16x2(u[j][0].x - dacc[j][0], u[j][0].y - dacc[j][1]);
            *(uint32_t *)(sm + L::D + (r0 + 8) * L::CR + 2 * col) = bf16x2(u[j][1].x - dacc[j][2], u[j][1].y - dacc[j][3]);
        }
        __syncthreads(); /* D; W, q and the state read */
        if (c + 1 < ce) issue_wq(c + 1);
        cp_async_commit();
        /* O = exp(g) Q S + P D (P lower triangular) */
        const uint32_t pb = sa + L::P + (c & 1) * GC * L::PR, kb = sa + L::K + (c & 1) * GC * L::SR;
#pragma unroll
        for (int k0 = 0; k0 < GC; k0 += 16) {
            if (k0 > mA) break;
            uint32_t fp[4], fd[4];
            ldsm_x4(fp, pb + (mA + lr) * L::PR + 2 * (k0 + lc));
            ldsm_x4_t(fd, sa + L::D + (k0 + lr) * L::CR + 2 * (nA + lc));
#pragma unroll
            for (int j = 0; j < 2; j++) mma_bf16(o[j], fp[0], fp[1], fp[2], fp[3], fd[2 * j], fd[2 * j + 1]);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = nA + 8 * j + 2 * tig, r0 = mA + gid, r1 = r0 + 8;
            if (col >= nc) continue;
            float *op = a.mix + t0 * a.vd + (int64_t)h * Dv + col0 + col;
            if (r0 < n) *(float2 *)(op + (int64_t)r0 * a.vd) = make_float2(o[j][0], o[j][1]);
            if (r1 < n) *(float2 *)(op + (int64_t)r1 * a.vd) = make_float2(o[j][2], o[j][3]);
        }
        /* S = exp(g_last) S + (exp(g_last - g) K)^T D: warp w its rows of the state */
        if (owns) {
            const float dl = expf(g_last);
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] *= dl;
#pragma unroll
            for (int k0 = 0; k0 < GC; k0 += 16) {
                uint32_t fk[4], fd[2][4];
                ldsm_x4_t(fk, kb + (k0 + tr) * L::SR + 2 * (m0 + tc));
#pragma unroll
                for (int hh = 0; hh < 2; hh++) ldsm_x4_t(fd[hh], sa + L::D + (k0 + lr) * L::CR + 2 * (16 * hh + lc));
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mma_bf16(s[j], fk[0], fk[1], fk[2], fk[3], fd[j / 2][2 * (j % 2)], fd[j / 2][2 * (j % 2) + 1]);
            }
            put_state();
        }
        __syncthreads(); /* the state; k, P and D read */
        if (c + 2 < ce) issue_kp(c + 2);
        cp_async_commit();
    }
    cp_async_wait<0>();
    if (owns)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = m0 + gid + (e >= 2 ? 8 : 0), col = 8 * j + 2 * tig + (e & 1);
                if (col < nc) Sg[(size_t)r * Dv + col] = s[j][e];
            }
}

template <int DK> static int chunked_prepare(int Dv) {
    if (cudaFuncSetAttribute(k_gdn_cprep<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(cprep_floats<DK>(Dv) * sizeof(float))) != cudaSuccess)
        return -1;
    return cudaFuncSetAttribute(k_gdn_cscan<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)cscan_bytes<DK>()) == cudaSuccess ? 0 : -1;
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
        launch_pdl(k_gdn_cscan<DK>, gs, dim3(GC_THREADS), cscan_bytes<DK>(), s, *p, *a, c0, c1);
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
