/* ==== CUDA kernels: the chunked delta rule (see cuda_kernels.h) ====
 *
 * The delta rule of many-token items in `bf16` precision, 64 tokens at a time on tensor
 * cores (fp32 accumulation and state). Per value head, for a chunk of n <= 64
 * tokens whose log decays cumulate to g (g_s = sum of l_u, u <= s, from the chunk's start):
 *
 *   A[s][j] = beta_s exp(g_s - g_j) (k_s . k_j), j < s        (strictly lower)
 *   (I + A) W = diag(beta exp(g)) K,  (I + A) U = diag(beta) V
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
 * the two Gram products on tensor cores (tf32 operands), T = (I + A)^-1 in fp32 by blocks of
 * 16 (the diagonal blocks by substitution, then those below from them), W = T diag(beta
 * exp(g)) K and U = T diag(beta) V on tensor cores (tf32 operands), and writes U and g in
 * fp32 and W, P, exp(g) q and exp(g_last - g) k rounded to bf16 (the scan's operands, as the
 * peers' chunked kernels take them) to the chunk workspace; it also scales q and k by their
 * L2 norms (k_gdn_qknorm's sums), which the chunked path does nowhere else. The second is
 * the only sequential part: k_gdn_cscan runs a block per
 * (item, head, 32 state columns) over the item's chunks in order, the fp32 state in its
 * warps' accumulators (a bf16 copy in shared memory as the products' operand), the products
 * mma.sync m16n8k16 on bf16 operands with fp32 sums, their fragments by ldmatrix; two such
 * blocks share an SM, each one's loads running while the other computes. cu_gdn_chunked runs a
 * step's chunks in slabs of ws_chunks; the workspace holds CU_GDN_WS_SLABS of them (two: a
 * slab's k_gdn_cprep, after the first, runs beside the scan of the slab before, into the
 * other half; see cuda_kernels.h).
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

/* a (chunk, head)'s place in the workspace (cu_gdn_chunk_floats): U [GC][Dv] and g [GC] in
 * fp32, then W, exp(g) q, exp(g_last - g) k [GC][DK] and P [GC][GC] in bf16 (row-major) */
struct gc_ws {
    float *U, *G;
    uint16_t *W, *Q, *K, *P;
};
template <int DK> __device__ __forceinline__ gc_ws gc_ws_at(const cu_gdn_args &a, int c0, int slab_chunk, int h) {
    gc_ws r;
    const int slab = CU_GDN_OVERLAP ? c0 / a.ws_chunks % 2 : 0; /* (CU_GDN_OVERLAP: slabs alternate) */
    r.U = a.chunk_ws + (((size_t)slab * a.ws_chunks + slab_chunk) * a.Hv + h) * (size_t)cu_gdn_chunk_floats(DK, a.Dv);
    r.G = r.U + GC * a.Dv;
    r.W = (uint16_t *)(r.G + GC);
    r.Q = r.W + GC * DK, r.K = r.Q + GC * DK, r.P = r.K + GC * DK;
    return r;
}

/* ---- the chunk's own part: W, U, P, g ---- */

/* shared memory, floats: q [GC][max(DK, Dv) + 4], where v [GC][Dv + 4] goes once q is read;
 * k [GC][DK + 4] (row-major), A and T = (I + A)^-1 [GC][GC + 4], beta, g and beta exp(g) [GC] */
template <int DK> __host__ __device__ constexpr int cprep_qw(int Dv) { return (DK > Dv ? DK : Dv) + 4; }
template <int DK> constexpr size_t cprep_floats(int Dv) {
    return (size_t)GC * cprep_qw<DK>(Dv) + (size_t)GC * (DK + 4) + 2 * GC * (GC + 4) + 3 * GC;
}

template <int DK>
__global__ void __launch_bounds__(GC_THREADS, 2) k_gdn_cprep(cu_gdn_args a, int c0) {
    /* CU_GDN_OVERLAP, a slab after the first: what it reads was written before the scan ahead
     * of it began (which waited for the first slab's part, which waited for them), so its
     * blocks run beside that scan, into the other slab (which the scan before that one read, and
     * that one finished before this grid could start); block (0, 0) waits for the scan at its
     * end, so that this grid ends after it, and the next scan, which waits for this grid, after
     * both. It lets the scan after it start only as it ends (it never calls pdl_wait) */
    const bool beside = CU_GDN_OVERLAP && c0 > 0;
    if (!beside) pdl_wait();
    extern __shared__ float4 cp_sh4[];
    constexpr int SW = DK + 4, LA = GC + 4;
    const int Dv = a.Dv, SV = Dv + 4; /* v's stride, where q was */
    float *Qs = (float *)cp_sh4, *Ks = Qs + GC * cprep_qw<DK>(Dv), *A = Ks + GC * SW, *T = A + GC * LA;
    float *bt = T + GC * LA, *g = bt + GC, *be = g + GC;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, h = blockIdx.y, c = c0 + blockIdx.x;
    const int64_t t0 = a.chunks[4 * c];
    const int n = a.chunks[4 * c + 1], kh = h / (a.Hv / a.Hk);
    const gc_ws cw = gc_ws_at<DK>(a, c0, blockIdx.x, h);
    /* q and k of the chunk as the conv left them (zeros past its end), every copy in flight at once */
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
    /* q and k by their L2 norms (q also by 1 / sqrt(DK)), a warp a row, as k_gdn_qknorm makes
     * them in place on the per-step path (the same bits) */
    for (int r = w; r < GC; r += GC_THREADS / 32) {
        float *qr = Qs + r * SW, *kr = Ks + r * SW;
        const float sq = gdn_l2_scale(qr, DK, true), sk = gdn_l2_scale(kr, DK, false);
        for (int j = lane; j < DK; j += 32) qr[j] *= sq, kr[j] *= sk;
    }
    __syncthreads();
    /* the scan's exp(g) q and exp(g_last - g) k, in bf16 */
    for (int e = tid; e < GC * DK / 4; e += GC_THREADS) {
        const int r = e / (DK / 4), i = e % (DK / 4) * 4;
        const float eq = expf(g[r]), ek = expf(g[GC - 1] - g[r]);
        const float4 q4 = *(const float4 *)(Qs + r * SW + i), k4 = *(const float4 *)(Ks + r * SW + i);
        *(uint2 *)(cw.Q + r * DK + i) = make_uint2(bf16x2_rn(eq * q4.x, eq * q4.y), bf16x2_rn(eq * q4.z, eq * q4.w));
        *(uint2 *)(cw.K + r * DK + i) = make_uint2(bf16x2_rn(ek * k4.x, ek * k4.y), bf16x2_rn(ek * k4.z, ek * k4.w));
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
                *(uint32_t *)(cw.P + r * GC + col) = bf16x2_rn(pv[0], pv[1]);
            }
    }
    cp_async_wait<0>();
    __syncthreads();
    /* T = (I + A)^-1 (unit lower triangular, fp32) in blocks of 16: first the diagonal blocks'
     * inverses, a thread per (block, column) by substitution */
    if (tid < GC) {
        const int b0 = 16 * (tid >> 4), j = tid & 15;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float v = r == j ? 1.0f : 0.0f; /* (x[k] is 0 for k < j: rows above the diagonal 0) */
#pragma unroll
            for (int k = 0; k < r; k++) v = fmaf(-A[(b0 + r) * LA + b0 + k], x[k], v);
            x[r] = v;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) T[(b0 + r) * LA + b0 + j] = x[r];
    }
    __syncthreads();
    /* then the blocks d below the diagonal, d = 1, 2, 3: T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj
     * (i = j + d), the sum M_ij kept in T's block (j, i) above the diagonal, which the products
     * never read */
#pragma unroll 1
    for (int d = 1; d < GC / 16; d++) {
        for (int e = tid; e < (GC / 16 - d) * 256; e += GC_THREADS) {
            const int i = d + (e >> 8), j = i - d, r = (e >> 4) & 15, cc = e & 15;
            float m = 0.0f;
#pragma unroll 1
            for (int kb = 16 * j; kb < 16 * i; kb += 16)
#pragma unroll
                for (int k = kb; k < kb + 16; k++) m = fmaf(A[(16 * i + r) * LA + k], T[k * LA + 16 * j + cc], m);
            T[(16 * j + r) * LA + 16 * i + cc] = m;
        }
        __syncthreads();
        for (int e = tid; e < (GC / 16 - d) * 256; e += GC_THREADS) {
            const int i = d + (e >> 8), j = i - d, r = (e >> 4) & 15, cc = e & 15;
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; k++) /* T_ii is 0 past its diagonal */
                t = fmaf(T[(16 * i + r) * LA + 16 * i + k], T[(16 * j + k) * LA + 16 * i + cc], t);
            T[(16 * i + r) * LA + 16 * j + cc] = -t;
        }
        __syncthreads();
    }
    /* [W | U] = T [diag(beta exp(g)) K | diag(beta) V] on tensor cores (tf32 operands, fp32
     * sums): warp w the 32 columns from 32 w (every 256th on), all 64 rows; T's row tile m
     * stops at its diagonal (k < 16 m + 16) */
    {
        const int gid = lane >> 2, tig = lane & 3, NC = DK + Dv;
        const float *Vs = Qs; /* stride SV */
        for (int n0 = 32 * w; n0 < NC; n0 += 32 * (GC_THREADS / 32)) {
            float acc[GC / 16][4][4] = {};
#pragma unroll
            for (int ks = 0; ks < GC / 8; ks++) {
                const int k = 8 * ks + tig;
                uint32_t fb[4][2];
#pragma unroll
                for (int nt = 0; nt < 4; nt++) { /* a tile's 8 columns all of k, or all of v */
                    const int col = n0 + 8 * nt + gid;
                    float b0 = 0.0f, b1 = 0.0f;
                    if (n0 + 8 * nt < DK) {
                        b0 = be[k] * Ks[k * SW + col], b1 = be[k + 4] * Ks[(k + 4) * SW + col];
                    } else if (n0 + 8 * nt < NC) {
                        b0 = bt[k] * Vs[k * SV + col - DK], b1 = bt[k + 4] * Vs[(k + 4) * SV + col - DK];
                    }
                    fb[nt][0] = tf32_of(b0), fb[nt][1] = tf32_of(b1);
                }
#pragma unroll
                for (int mt = ks / 2; mt < GC / 16; mt++) {
                    uint32_t fa[4];
                    frag_a(fa, T, LA, 16 * mt, 8 * ks, lane);
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) mma_tf32(acc[mt][nt], fa[0], fa[1], fa[2], fa[3], fb[nt][0], fb[nt][1]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < GC / 16; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int col = n0 + 8 * nt + 2 * tig, r0 = 16 * mt + gid;
                    if (n0 + 8 * nt < DK) {
                        *(uint32_t *)(cw.W + r0 * DK + col) = bf16x2_rn(acc[mt][nt][0], acc[mt][nt][1]);
                        *(uint32_t *)(cw.W + (r0 + 8) * DK + col) = bf16x2_rn(acc[mt][nt][2], acc[mt][nt][3]);
                    } else if (n0 + 8 * nt < NC) {
                        *(float2 *)(cw.U + r0 * Dv + col - DK) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
                        *(float2 *)(cw.U + (r0 + 8) * Dv + col - DK) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
                    }
                }
        }
    }
    if (beside && blockIdx.x == 0 && blockIdx.y == 0) asm volatile("griddepcontrol.wait;" ::: "memory");
}

/* ---- the scan over an item's chunks ---- */

/* shared memory, bytes: W and exp(g) q [GC][DK] (one chunk's), exp(g_last - g) k [GC][DK] and P
 * [GC][GC] (two chunks': the next one's copied in during this one), the bf16 state [DK][GC_COLS]
 * and D [GC][GC_COLS]; every row 16 bytes past its values, so that ldmatrix's 8 rows fall on
 * distinct banks */
static_assert(GC_COLS == 32, "the scan's warps take 32 state columns");
template <int DK> struct cscan_at {
    static constexpr int SR = (DK + 8) * 2, PR = (GC + 8) * 2, CR = (GC_COLS + 8) * 2; /* a row's bytes */
    static constexpr int UR = (GC_COLS + 8) * 4; /* U's rows (fp32): 8 rows a float2 per lane in two wavefronts */
    static constexpr int W = 0, Q = W + GC * SR, K = Q + GC * SR, P = K + 2 * GC * SR, S = P + 2 * GC * PR;
    static constexpr int D = S + DK * CR, U = D + GC * CR, BYTES = U + GC * UR;
};
/* a block's copies of a [GC][COLS] matrix's 16-byte pieces (ELEM bytes a value), piece e = tid +
 * GC_THREADS i of row e / (pieces a row): a thread's first piece and the rows between its pieces */
template <int COLS, int ELEM> struct cscan_pieces {
    static constexpr int ROW = COLS * ELEM / 16, ALL = GC * ROW;
    static constexpr int EACH = (ALL + GC_THREADS - 1) / GC_THREADS, STEP = GC_THREADS / ROW;
    static_assert(GC_THREADS % ROW == 0, "a row's pieces divide the block");
    static __device__ __forceinline__ bool on(int tid, int i) { return ALL % GC_THREADS == 0 || tid + GC_THREADS * i < ALL; }
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
            *(uint32_t *)(sm + L::S + (m0 + gid) * L::CR + 2 * col) = bf16x2_rn(s[j][0], s[j][1]);
            *(uint32_t *)(sm + L::S + (m0 + gid + 8) * L::CR + 2 * col) = bf16x2_rn(s[j][2], s[j][3]);
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
    /* a thread's pieces of the copies: their offsets in shared memory (bytes) and in the
     * workspace (values), the same every chunk */
    typedef cscan_pieces<DK, 2> PK;
    typedef cscan_pieces<GC, 2> PP;
    typedef cscan_pieces<GC_COLS, 4> PU;
    const uint32_t sk = (tid / PK::ROW) * L::SR + 16 * (tid % PK::ROW), sp = (tid / PP::ROW) * L::PR + 16 * (tid % PP::ROW);
    const uint32_t su = sa + L::U + (tid / PU::ROW) * L::UR + 16 * (tid % PU::ROW);
    const int gk = (tid / PK::ROW) * DK + 8 * (tid % PK::ROW), gp = (tid / PP::ROW) * GC + 8 * (tid % PP::ROW);
    const int uc = 4 * (tid % PU::ROW); /* a U piece's first column of the 32 */
    const size_t gu = (size_t)(tid / PU::ROW) * Dv + col0 + uc;
    const int ubytes = uc < nc ? 16 : 0;
    /* chunk c's W, exp(g) q and U; its exp(g_last - g) k and P into buffer c & 1 */
    auto issue_wq = [&](int c) {
        const gc_ws cw = gc_ws_at<DK>(a, c0, c - c0, h);
#pragma unroll
        for (int i = 0; i < PK::EACH; i++)
            if (PK::on(tid, i)) {
                cp_async16_at(sa + L::W + sk + i * PK::STEP * L::SR, cw.W + gk + i * PK::STEP * DK);
                cp_async16_at(sa + L::Q + sk + i * PK::STEP * L::SR, cw.Q + gk + i * PK::STEP * DK);
            }
#pragma unroll
        for (int i = 0; i < PU::EACH; i++)
            if (PU::on(tid, i)) cp_async16_at(su + i * PU::STEP * L::UR, ubytes ? cw.U + gu + (size_t)i * PU::STEP * Dv : cw.U, ubytes);
    };
    auto issue_kp = [&](int c) {
        const gc_ws cw = gc_ws_at<DK>(a, c0, c - c0, h);
        const uint32_t kb = sa + L::K + (c & 1) * GC * L::SR + sk, pb = sa + L::P + (c & 1) * GC * L::PR + sp;
#pragma unroll
        for (int i = 0; i < PK::EACH; i++)
            if (PK::on(tid, i)) cp_async16_at(kb + i * PK::STEP * L::SR, cw.K + gk + i * PK::STEP * DK);
#pragma unroll
        for (int i = 0; i < PP::EACH; i++)
            if (PP::on(tid, i)) cp_async16_at(pb + i * PP::STEP * L::PR, cw.P + gp + i * PP::STEP * GC);
    };
    /* in flight, in this order: k and P of the chunk, W, q and U of the chunk, k and P of the next */
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
        const gc_ws cw = gc_ws_at<DK>(a, c0, c - c0, h);
        const int64_t t0 = a.chunks[4 * c];
        const int n = a.chunks[4 * c + 1];
        const float g_last = cw.G[GC - 1]; /* the chunk's last log decay, ahead of the products */
        cp_async_wait<1>();
        __syncthreads(); /* W, q, U, k and P of the chunk; the state */
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
            const int col = nA + 8 * j + 2 * tig, r0 = mA + gid; /* U past nc: zeros */
            const float2 u0 = *(const float2 *)(sm + L::U + r0 * L::UR + 4 * col);
            const float2 u1 = *(const float2 *)(sm + L::U + (r0 + 8) * L::UR + 4 * col);
            *(uint32_t *)(sm + L::D + r0 * L::CR + 2 * col) = bf16x2_rn(u0.x - dacc[j][0], u0.y - dacc[j][1]);
            *(uint32_t *)(sm + L::D + (r0 + 8) * L::CR + 2 * col) = bf16x2_rn(u1.x - dacc[j][2], u1.y - dacc[j][3]);
        }
        __syncthreads(); /* D; W, q, U and the state read */
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
