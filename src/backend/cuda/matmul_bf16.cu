/* ==== CUDA kernels: bf16 matrices on tensor cores ====
 *
 * The tiled layout (cu_tile_bf16), the activations' split into bf16 parts (k_split), and the
 * products of tiled bf16 matrices: k_mmv and k_mmvp (up to 16 tokens), k_gemm (more), k_mma
 * (any number, without the scratch), with their launchers; launch_tiled picks among them.
 */
#include "backend/cuda/mm_int.cuh"
#include "backend/cuda/blas.h"

/* bf16 matrices on tensor cores (MM_SPLITS: mm_int.cuh)
 *
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate): A is a 16-row tile of W, B 8 tokens of x.
 * The activations are split into bf16 parts, x = hi + mid + lo (3 parts: 24 significant
 * bits, fp32-grade; "exact") or rounded to bf16 (1 part; "bf16"); the weights are bf16 as
 * stored, so every product is exact and the tensor cores accumulate in fp32.
 *
 * The weights are stored tiled (CU_FMT_BF16_TILED, cu_tile_bf16): rows padded to 16 and
 * columns to 32 with zeros; tile m (rows 16m..16m+15) and step k (columns 32k..32k+31) are
 * 1 KB at element (m * nsteps + k) * 512, in the order the lanes load them: first lane L's
 * 8 columns 32k+8t..+7 of row 16m+g for every lane L = 4g + t, then the same of row 16m+g+8.
 * A warp's load of a step is 2 x 512 contiguous bytes and a tile is one contiguous run: the
 * memory sees long sequential reads, as a copy does (row-major tiles read 64 bytes from each
 * of 16 rows at a time and reached half the bandwidth; bench/cuda/mmv_bench.cu).
 *
 * Summation order, fixed by the matrix's shape alone: a block's S warps (MM_SPLITS) take the
 * 32-column steps in turn (warp s: steps s, s + S, ...), each step two MMAs (columns 8t..8t+3,
 * then 8t+4..8t+7 of lane group t) per part, hi first; then the S partial sums are added in
 * warp order. A token's result depends only on its own activations (an MMA's output column is its
 * own dot product), so it is the same bits whatever the batch, the tile it lands in, the
 * kernel (k_mmv for up to 16 tokens, k_mma beyond) and the tile shape a launch picks.
 *
 * Fragments (PTX ISA, m16n8k16 .bf16): lane = 4g + t; A regs a0 (row g, k 2t..2t+1),
 * a1 (row g+8, same k), a2 (row g, k 2t+8..9), a3 (row g+8, k 2t+8..9); B regs b0 (k 2t..2t+1,
 * column g), b1 (k 2t+8..9, column g); C c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8).
 * Which physical column feeds which k slot is free as long as A and B agree: lane (g, t)
 * holds 8 consecutive columns 8t..8t+7 of rows g and g+8 and of token g; the first MMA takes
 * columns 8t..8t+3 as k slots (2t, 2t+1, 2t+8, 2t+9), the second 8t+4..8t+7. */

extern "C" size_t cu_tiled_elems(int64_t rows, int64_t cols) {
    return (size_t)tiled_tiles(rows) * (size_t)tiled_steps(cols) * 512;
}

/* a thread per 8-element piece of the destination */
__global__ void k_tile(const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    const int64_t nsteps = tiled_steps(cols), nq = tiled_tiles(rows) * nsteps * 64;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int half = (int)(q % 64) / 32, L = (int)(q % 32);
        const int64_t r = 16 * m + 8 * half + (L >> 2), c = 32 * k + 8 * (L & 3);
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = r < rows && c + e < cols ? src[r * cols + c + e] : 0;
        *(uint4 *)(dst + q * 8) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
    }
}

extern "C" void cu_tile_bf16(cu_stream s, const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    if (rows > 0 && cols > 0) k_tile<<<4096, 256, 0, s>>>(src, rows, cols, dst);
}

/* a thread per 8-element piece of the source (a (tile, step) is 16 rows of 32 columns, row
 * by row): dst [rows][tiled_steps(cols) * 32], the padding columns' zeros too */
__global__ void k_untile(const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    const int64_t nsteps = tiled_steps(cols), nq = tiled_tiles(rows) * nsteps * 64, ld = nsteps * 32;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int p = (int)(q % 64); /* row p / 4 of the tile, columns 8 (p % 4) .. + 7 of the step */
        const int64_t r = 16 * m + p / 4;
        if (r < rows) *(uint4 *)(dst + r * ld + 32 * k + 8 * (p % 4)) = *(const uint4 *)(src + q * 8);
    }
}

/* k_untile's copy in runs: a warp per (tile, 4 steps), whose 4 KB of the source it reads at
 * once (8 16-byte pieces a lane) into shared memory and writes back as the tile's 16 rows'
 * 256-byte runs, two rows a store: whole 128-byte lines where k_untile writes 64-byte halves
 * of them in separate stores, and one division a unit where k_untile makes one a piece; 6
 * blocks an SM (32 KB of shared memory each: all resident, so the grid has no late wave) */
#define UNTILE_WARPS 8
__global__ void __launch_bounds__(32 * UNTILE_WARPS) k_untile_runs(const uint16_t *src, int64_t rows, int64_t cols,
                                                                    uint16_t *dst) {
    __shared__ uint4 buf[UNTILE_WARPS][256];
    const int64_t nsteps = tiled_steps(cols), ng = (nsteps + 3) / 4, ld = nsteps * 32;
    const int64_t units = tiled_tiles(rows) * ng;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint4 *b = buf[w];
    for (int64_t u = (int64_t)blockIdx.x * UNTILE_WARPS + w; u < units; u += (int64_t)gridDim.x * UNTILE_WARPS) {
        const int64_t m = u / ng, k0 = u % ng * 4;
        const int ns = nsteps - k0 < 4 ? (int)(nsteps - k0) : 4;
        const uint4 *s4 = (const uint4 *)(src + (m * nsteps + k0) * 512); /* a step: 64 pieces */
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (lane + 32 * i < 64 * ns) v[i] = s4[lane + 32 * i];
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (lane + 32 * i < 64 * ns) b[lane + 32 * i] = v[i];
        __syncwarp();
        /* piece e of the runs: row e / 16 of the tile, its step (e % 16) / 4 of the 4 and 8
         * columns e % 4 of that step; the source's piece of it: step * 64 + row * 4 + e % 4 */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = lane + 32 * i, r = e >> 4, st = (e & 15) >> 2, t = e & 3;
            const int64_t row = 16 * m + r;
            if (st < ns && row < rows) *(uint4 *)(dst + row * ld + 32 * (k0 + st) + 8 * t) = b[st * 64 + r * 4 + t];
        }
        __syncwarp();
    }
}

/* 1: k_untile_runs (0: k_untile, the reference it is checked against in `mmv_bench blas`).
 * H100, 2026-12-07 (`mmv_bench blas 1 1024`, GB/s read + written): gate/up 2,870 against
 * 2,804, down 2,850 / 2,776, GDN in 2,859 / 2,795, q/k/v 2,811 / 2,776, out/o 2,695 / 2,725:
 * k_untile was already near the copy rate (3,020) there, and the 8,192-token prefill moved
 * by less than its noise (10,294 / 10,308 against 10,247 / 10,313 tok/s) */
#ifndef CU_UNTILE_RUNS
#define CU_UNTILE_RUNS 1
#endif

extern "C" void cu_untile_bf16(cu_stream s, const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst) {
    if (rows <= 0 || cols <= 0) return;
    if (CU_UNTILE_RUNS) k_untile_runs<<<6 * mm_sms(), 32 * UNTILE_WARPS, 0, s>>>(src, rows, cols, dst);
    else k_untile<<<4096, 256, 0, s>>>(src, rows, cols, dst);
}

/* The activations split once into bf16 parts for k_mmv: xs[p][n][c], c < ldxs (the width
 * rounded up to 32, zeros past it); the same parts k_mma makes inside. */
template <int P>
__global__ void k_split(const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs) {
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = i / ldxs, c = i % ldxs;
    if (n >= T) return;
    float v = c < cols ? x[n * ldx + c] : 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint16_t h = f2bf16(v);
        xs[(int64_t)p * T * ldxs + n * ldxs + c] = h;
        v -= bf16f(h);
    }
}

/* token n's 8 activations at column c (zeros past T or the width) */
__device__ __forceinline__ void mma_load_x(const float *x, int64_t ldx, int64_t T, int64_t n, int64_t c, int64_t cols,
                                           bool vec, float (&xv)[8]) {
    if (n < T && vec && c + 8 <= cols) {
        const float4 u = *(const float4 *)(x + n * ldx + c), v = *(const float4 *)(x + n * ldx + c + 4);
        xv[0] = u.x, xv[1] = u.y, xv[2] = u.z, xv[3] = u.w, xv[4] = v.x, xv[5] = v.y, xv[6] = v.z, xv[7] = v.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) xv[k] = n < T && c + k < cols ? x[n * ldx + c + k] : 0.0f;
    }
}

/* k_split for many tokens: a thread per 8 consecutive columns of a token (two 16-byte
 * loads, a 16-byte store a part: the same values as k_split's, an eighth of its threads and
 * index arithmetic). vec: x and ldx keep every row's 8-column pieces 16-byte aligned. */
template <int P>
__global__ void k_split8(const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs, int vec) {
    pdl_wait();
    const int64_t per = ldxs / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = i / per, c = i % per * 8;
    if (n >= T) return;
    float v[8];
    mma_load_x(x, ldx, T, n, c, cols, vec, v);
#pragma unroll
    for (int p = 0; p < P; p++) {
        uint16_t h[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            h[k] = f2bf16(v[k]);
            v[k] -= bf16f(h[k]);
        }
        *(uint4 *)(xs + (int64_t)p * T * ldxs + n * ldxs + c) =
            make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16, h[4] | (uint32_t)h[5] << 16,
                       h[6] | (uint32_t)h[7] << 16);
    }
}

/* the S warps' partial sums of MT tiles and one token tile, in warp order, into y */
template <int MT, int MM_S>
__device__ __forceinline__ void mm_reduce(const float (&acc)[MT][4], float (*red)[MT * 128], int64_t r0, int64_t rows,
                                          int64_t n0, int64_t T, float *y, int64_t ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float *o = red[warp] + m * 128;
        o[g * 8 + 2 * t] = acc[m][0];
        o[g * 8 + 2 * t + 1] = acc[m][1];
        o[(g + 8) * 8 + 2 * t] = acc[m][2];
        o[(g + 8) * 8 + 2 * t + 1] = acc[m][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MT * 128; i += blockDim.x) {
        const int m = i / 128, row = (i % 128) / 8, col = i % 8;
        const int64_t r = r0 + 16 * m + row, n = n0 + col;
        float sum = 0.0f;
        for (int q = 0; q < MM_S; q++) sum += red[q][i];
        if (r < rows && n < T) y[n * ldy + r] = sum;
    }
}

/* the two MMAs of one step per part: A from registers, B as 8 bf16 of each part */
template <int P>
__device__ __forceinline__ void mma_step(float (&acc)[4], const uint4 &a0, const uint4 &a1, const uint4 (&b)[P]) {
#pragma unroll
    for (int p = 0; p < P; p++) mma_bf16(acc, a0.x, a1.x, a0.y, a1.y, b[p].x, b[p].y);
#pragma unroll
    for (int p = 0; p < P; p++) mma_bf16(acc, a0.z, a1.z, a0.w, a1.w, b[p].z, b[p].w);
}

/* Up to 16 tokens (NT token tiles of 8), activations split beforehand (k_split): a block a
 * tile; each warp keeps U steps of weights in flight. */
template <int P, int NT, int U, int MINB, int MM_S>
__global__ void __launch_bounds__(32 * MM_S, MINB) k_mmv(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    __shared__ float red[MM_S][128];
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = tiled_steps(w.cols), pstride = T * ldxs;
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_S - 1) / MM_S : 0; /* this warp's steps */
    const uint16_t *pa = (const uint16_t *)w.data + (pk.blk * nsteps + warp) * 512 + 8 * lane;
    const uint16_t *px = xs + 8 * t + warp * 32;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint4 a[U][2];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < ni) {
            a[u][0] = ldg_stream(pa + u * (MM_S * 512));
            a[u][1] = ldg_stream(pa + u * (MM_S * 512) + 256);
        }
    pdl_wait(); /* the activations are the predecessor's */
    for (int64_t i = 0; i < ni; i += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t ii = i + u;
            if (ii < ni) {
                const uint4 a0 = a[u][0], a1 = a[u][1];
                uint4 b[NT][P];
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int64_t n = 8 * j + g;
#pragma unroll
                    for (int p = 0; p < P; p++)
                        b[j][p] = n < T ? *(const uint4 *)(px + ii * (MM_S * 32) + p * pstride + n * ldxs)
                                        : make_uint4(0, 0, 0, 0);
                }
                if (ii + U < ni) {
                    a[u][0] = ldg_stream(pa + (ii + U) * (MM_S * 512));
                    a[u][1] = ldg_stream(pa + (ii + U) * (MM_S * 512) + 256);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) mma_step<P>(acc[j], a0, a1, b[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float one[1][4] = {{acc[j][0], acc[j][1], acc[j][2], acc[j][3]}};
        mm_reduce<1, MM_S>(one, red, pk.blk * 16, w.rows, 8 * j, T, pk.y, pk.ldy);
    }
}

/* Any number of tokens: MT tiles by NT token tiles a block, the activations split inside
 * (the same parts as k_split's). U: steps of weights in flight a warp. */
template <int MT, int NT, int P, int U, int MM_S>
__global__ void __launch_bounds__(32 * MM_S) k_mma(mm_group grp, const float *x, int64_t ldx, int64_t T) {
    __shared__ float red[MM_S][MT * 128];
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = tiled_steps(w.cols), ntiles = tiled_tiles(w.rows), m0 = pk.blk * MT;
    const int64_t n0 = (int64_t)blockIdx.y * (8 * NT);
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_S - 1) / MM_S : 0;
    const bool vec = ldx % 4 == 0 && ((uintptr_t)x & 15) == 0;
    const uint16_t *pa = (const uint16_t *)w.data + (m0 * nsteps + warp) * 512 + 8 * lane;
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    uint4 a[U][MT][2];
    auto load = [&](int64_t ii, uint4 (&dst)[MT][2]) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const bool in = m0 + m < ntiles;
            const uint16_t *q = pa + (m * nsteps + ii * MM_S) * 512;
            dst[m][0] = in ? ldg_stream(q) : make_uint4(0, 0, 0, 0);
            dst[m][1] = in ? ldg_stream(q + 256) : make_uint4(0, 0, 0, 0);
        }
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < ni) load(u, a[u]);
    for (int64_t i = 0; i < ni; i += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t ii = i + u;
            if (ii < ni) {
                uint4 cur[MT][2];
#pragma unroll
                for (int m = 0; m < MT; m++) cur[m][0] = a[u][m][0], cur[m][1] = a[u][m][1];
                if (ii + U < ni) load(ii + U, a[u]);
                const int64_t c = (warp + ii * MM_S) * 32 + 8 * t;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    float xv[8];
                    mma_load_x(x, ldx, T, n0 + 8 * j + g, c, w.cols, vec, xv);
                    uint4 b[P];
                    uint32_t bw[P][4];
#pragma unroll
                    for (int k = 0; k < 8; k += 2) {
                        float r0v = xv[k], r1v = xv[k + 1];
#pragma unroll
                        for (int p = 0; p < P; p++) {
                            const uint16_t h0 = f2bf16(r0v), h1 = f2bf16(r1v);
                            bw[p][k / 2] = pack2(h0, h1);
                            r0v -= bf16f(h0);
                            r1v -= bf16f(h1);
                        }
                    }
#pragma unroll
                    for (int p = 0; p < P; p++) b[p] = make_uint4(bw[p][0], bw[p][1], bw[p][2], bw[p][3]);
#pragma unroll
                    for (int m = 0; m < MT; m++) mma_step<P>(acc[m][j], cur[m][0], cur[m][1], b);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float accj[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) accj[m][e] = acc[m][j][e];
        mm_reduce<MT, MM_S>(accj, red, m0 * 16, w.rows, n0 + 8 * j, T, pk.y, pk.ldy);
    }
}

/* ---- up to 16 tokens, blocks that stay: k_mmvp ----
 * k_mmv's sums, the same MMAs on the same fragments in the same order (warp s: steps s,
 * s + S, ...; the warps' partial sums added in warp order), so the same bits; but a launch has
 * only as many blocks as stay resident (G), the tiles shared out evenly (block b: tiles b,
 * b + G, ...), and each warp streams its steps of all its tiles through a ring of D steps in
 * shared memory, filled by cp.async D - 1 steps ahead: the weights flow as a copy's do, and the
 * next tile's are in flight while a tile's sums are added. A lane copies, and later reads, only
 * its own fragment, so the ring needs no barrier. Shared memory: the ring [S][D][2][32] of 16
 * bytes, then the partial sums [S][NT * 128] floats (mmvp_smem). */
template <int NT, int D, int MT>
__host__ __device__ constexpr size_t mmvp_smem() {
    return (size_t)MM_SPLITS * D * MT * 1024 + (size_t)MM_SPLITS * MT * NT * 128 * 4;
}

/* MT: the tiles a block takes at once (their steps side by side in the ring; a warp's B
 * fragments serve them all) */
template <int P, int NT, int D, int MINB, int MT>
__global__ void __launch_bounds__(32 * MM_SPLITS, MINB)
    k_mmvp(mm_group grp, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t T) {
    extern __shared__ uint4 smv[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 *ring = smv + warp * D * MT * 64;
    float(*red)[MT * NT * 128] = (float(*)[MT * NT * 128])(smv + MM_SPLITS * D * MT * 64);
    const int64_t nsteps = tiled_steps(grp.w[0].cols), pstride = T * ldxs; /* one width a group */
    const int64_t ni = warp < nsteps ? (nsteps - warp + MM_SPLITS - 1) / MM_SPLITS : 0; /* a tile's steps, this warp */
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring) + lane * 16;
    /* the producer: step pi of block pb's tiles, this warp's; into slot ps */
    int64_t pb = blockIdx.x, pi = 0;
    int ps = 0, pn = 0; /* pn: the block's tiles inside its matrix */
    const uint16_t *pa = NULL;
    auto p_open = [&]() {
        if (pb < nblk) {
            const mm_pick q = mm_select_at(grp, pb);
            const int64_t left = tiled_tiles(q.w.rows) - q.blk * MT;
            pn = left < MT ? (int)left : MT;
            pa = (const uint16_t *)q.w.data + (q.blk * MT * nsteps + warp) * 512 + 8 * lane;
        }
    };
    auto produce = [&]() {
        if (ni > 0 && pb < nblk) {
            const uint16_t *src = pa + pi * (MM_SPLITS * 512);
            const unsigned sa = ring_sa + (unsigned)ps * MT * 1024;
#pragma unroll
            for (int m = 0; m < MT; m++)
                if (m < pn) { /* past the matrix's last tile: rows never written */
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + m * 1024), "l"(src + m * nsteps * 512)
                                 : "memory");
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + m * 1024 + 512),
                                 "l"(src + m * nsteps * 512 + 256)
                                 : "memory");
                }
            if (++pi == ni) pi = 0, pb += gridDim.x, p_open();
        }
        cp_async_commit();
        ps = ps + 1 == D ? 0 : ps + 1;
    };
    p_open();
#pragma unroll
    for (int d = 0; d < D - 1; d++) produce();
    pdl_wait(); /* the activations are the predecessor's */
    const uint16_t *px = xs + 8 * t + warp * 32;
    /* the activations of this warp's next step, loaded a step ahead (every tile has the same
     * columns: after a tile's last step comes step 0 again) */
    uint4 bn[NT][P];
    auto load_x = [&](int64_t i) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int64_t n = 8 * j + g;
#pragma unroll
            for (int p = 0; p < P; p++)
                bn[j][p] = n < T ? *(const uint4 *)(px + i * (MM_SPLITS * 32) + p * pstride + n * ldxs) : make_uint4(0, 0, 0, 0);
        }
    };
    if (ni > 0) load_x(0);
    int cs = 0;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const mm_pick pk = mm_select_at(grp, b);
        float acc[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
        for (int64_t i = 0; i < ni; i++) {
            cp_async_wait<D - 2>(); /* this step is in */
            uint4 a[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++) a[m][0] = ring[(cs * MT + m) * 64 + lane], a[m][1] = ring[(cs * MT + m) * 64 + 32 + lane];
            cs = cs + 1 == D ? 0 : cs + 1;
            produce(); /* into the slot read the step before */
            uint4 bx[NT][P];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int p = 0; p < P; p++) bx[j][p] = bn[j][p];
            load_x(i + 1 < ni ? i + 1 : 0);
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++) mma_step<P>(acc[m][j], a[m][0], a[m][1], bx[j]);
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float *o = red[warp] + (m * NT + j) * 128;
                o[g * 8 + 2 * t] = acc[m][j][0];
                o[g * 8 + 2 * t + 1] = acc[m][j][1];
                o[(g + 8) * 8 + 2 * t] = acc[m][j][2];
                o[(g + 8) * 8 + 2 * t + 1] = acc[m][j][3];
            }
        __syncthreads();
        for (int q = threadIdx.x; q < MT * NT * 128; q += blockDim.x) {
            const int m = q / (NT * 128), j = (q / 128) % NT, row = (q % 128) / 8, col = q % 8;
            const int64_t r = (pk.blk * MT + m) * 16 + row, n = 8 * j + col;
            float sum = 0.0f;
            for (int s = 0; s < MM_SPLITS; s++) sum += red[s][q];
            if (r < pk.w.rows && n < T) pk.y[n * pk.ldy + r] = sum;
        }
        __syncthreads(); /* red is read before the next tile's sums go in */
    }
    cp_async_wait<0>();
}

/* ---- many tokens: k_gemm ----
 * The same sums as k_mmv's, in the same order, for a block tile of TILES row tiles by BN
 * tokens, the weights read once per tile of tokens instead of once per 16 tokens. k_mmv's
 * warp s sums steps s, s + S, ... (summation class s) and the S partial sums are added in
 * class order; here a block walks the steps class by class (0, S, 2S, ..., then 1, 1 + S,
 * ...), with the same MMAs on the same fragments, and at the end of each class adds its
 * partial sums into the running total (0 + p0 + p1 + ...): a token's result is the same bits
 * as k_mmv's, whatever the token count, the tile shape and the slice it lands in.
 *
 * 8 warps, WR (rows: MTW tiles each) by 8 / WR (tokens: NT token tiles of 8 each); a
 * pipeline of G::STAGES steps in shared memory filled by cp.async: a step is its tiles'
 * 1 KB of weights each (already in the lanes' load order: a lane reads its fragment as one
 * 16-byte word, without bank conflicts) and the split activations of the block's tokens,
 * 64 bytes a token and part. */
#define GEMM_WARPS 8

template <int MTW, int NT, int WR, int P>
struct gemm_shape {
    static constexpr int WC = GEMM_WARPS / WR, TILES = MTW * WR, BN = 8 * NT * WC;
    static constexpr int A_U4 = TILES * 64;  /* a step's weights: its tiles' 64 16-byte words */
    static constexpr int B_U4 = P * BN * 4;  /* its activations: [P][BN][4 words] */
    static constexpr int STAGE_U4 = A_U4 + B_U4;
    /* steps in flight: the loads' latency (about 2 us under load, measured: 4 stages left a
     * T = 64 product at a quarter of the bandwidth) over the little work of a step */
    static constexpr int STAGES = STAGE_U4 * 16 * 8 <= 128 * 1024 ? 8 : 192 * 1024 / (STAGE_U4 * 16);
    static_assert(STAGES >= 4, "steps go in pairs");
    static constexpr size_t SMEM = (size_t)STAGES * STAGE_U4 * 16;
    /* blocks an SM: two where the accumulators leave the registers for it (one block of 8
     * warps leaves the schedulers idle half the time: Nsight Compute, 64 tokens) */
    static constexpr int MINB = MTW * NT * P <= 8 && 2 * (SMEM + 1024) <= 227 * 1024 ? 2 : 1;
};

template <int MTW, int NT, int WR, int P>
__global__ void __launch_bounds__(32 * GEMM_WARPS, gemm_shape<MTW, NT, WR, P>::MINB)
    k_gemm(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    typedef gemm_shape<MTW, NT, WR, P> G;
    extern __shared__ uint4 sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp % WR, wn = warp / WR;
    const mm_pick pk = mm_select(grp);
    const cu_mat &w = pk.w;
    const int64_t nsteps = tiled_steps(w.cols), ntiles = tiled_tiles(w.rows), m0 = pk.blk * G::TILES;
    const int64_t n0 = (int64_t)blockIdx.y * G::BN, pstride = T * ldxs;
    const int64_t q8 = nsteps / MM_SPLITS, r8 = nsteps % MM_SPLITS; /* class c has q8 + (c < r8) steps */
    /* split (gridDim.z > 1): this block's classes c_lo .. c_hi - 1, their partial sums to grp.part */
    const int kz = (int)gridDim.z, c_lo = (int)blockIdx.z * MM_SPLITS / kz, c_hi = ((int)blockIdx.z + 1) * MM_SPLITS / kz;
    int nb = 0; /* its steps (a matrix has fewer than 2^31) */
    for (int c = c_lo; c < c_hi; c++) nb += (int)(q8 + (c < r8));
    const uint16_t *wd = (const uint16_t *)w.data;
    /* this thread's copies of a step, fixed but for the step's column offset */
    constexpr int NA = G::A_U4 / (32 * GEMM_WARPS), NB = (G::B_U4 + 32 * GEMM_WARPS - 1) / (32 * GEMM_WARPS);
    static_assert(G::A_U4 % (32 * GEMM_WARPS) == 0, "whole rounds of weight copies");
    /* the activations' last round may be partial (fewer than 16 tokens a part): b_cp */
    /* each copy's source at step 0 and its advance a step (0 for a copy past the matrix or
     * the tokens: it reads nothing, src-size 0), fixed, so that a step's copies are a multiply
     * and an add each */
    const uint16_t *a_src[NA], *b_src[NB];
    int a_mul[NA], b_mul[NB], a_sz[NA], b_sz[NB];
    bool b_cp[NB];
#pragma unroll
    for (int c = 0; c < NA; c++) {
        const int q = tid + c * 32 * GEMM_WARPS;
        const int64_t m = m0 + q / 64;
        const bool in = m < ntiles;
        a_src[c] = in ? wd + (m * nsteps) * 512 + (q % 64) * 8 : wd;
        a_mul[c] = in ? 512 : 0, a_sz[c] = in ? 16 : 0;
    }
#pragma unroll
    for (int c = 0; c < NB; c++) {
        const int q = tid + c * 32 * GEMM_WARPS;
        const int pp = q / (G::BN * 4), n = (q / 4) % G::BN, c4 = q % 4;
        const int64_t tok = n0 + n;
        b_cp[c] = q < G::B_U4;
        const bool in = b_cp[c] && tok < T;
        b_src[c] = in ? xs + pp * pstride + tok * ldxs + c4 * 8 : xs;
        b_mul[c] = in ? 32 : 0, b_sz[c] = in ? 16 : 0;
    }
    const unsigned sm_u32 = (unsigned)__cvta_generic_to_shared(sm);
    pdl_wait();
    int ic = c_lo, ik = 0, ks_i = c_lo; /* the next step to fetch: class ic, its ik-th, step ks_i */
    int st_i = 0;                       /* and its stage */
    const int q8i = (int)q8, r8i = (int)r8;
    auto issue = [&]() {
        const unsigned sa = sm_u32 + (unsigned)(st_i * G::STAGE_U4 + tid) * 16;
#pragma unroll
        for (int c = 0; c < NA; c++)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa + c * 32 * GEMM_WARPS * 16),
                         "l"(a_src[c] + ks_i * a_mul[c]), "r"(a_sz[c]));
#pragma unroll
        for (int c = 0; c < NB; c++)
            if (b_cp[c])
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa + (G::A_U4 + c * 32 * GEMM_WARPS) * 16),
                             "l"(b_src[c] + ks_i * b_mul[c]), "r"(b_sz[c]));
        st_i = st_i + 1 == G::STAGES ? 0 : st_i + 1;
        if (++ik == q8i + (ic < r8i)) ic++, ik = 0, ks_i = ic;
        else ks_i += MM_SPLITS;
    };
    float acc[MTW][NT][4], sum[MTW][NT][4];
#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = sum[m][j][e] = 0.0f;
    /* steps go in pairs: one wait and one barrier for two steps */
#pragma unroll
    for (int i = 0; i < G::STAGES - 2; i++) {
        if (i < nb) issue();
        cp_async_commit();
    }
    int cc = c_lo, ck = 0; /* the step being summed: class cc, its ck-th */
    int st_c = 0;              /* and its stage */
    for (int i0 = 0; i0 < nb; i0 += 2) {
        cp_async_wait<G::STAGES - 4>();
        __syncthreads(); /* steps i0, i0 + 1 are in; every warp is done with the two before, whose stages refill */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (i0 + G::STAGES - 2 + u < nb) issue();
            cp_async_commit();
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (i0 + u >= nb) break;
            const uint4 *sa = sm + st_c * G::STAGE_U4, *sb = sa + G::A_U4;
            st_c = st_c + 1 == G::STAGES ? 0 : st_c + 1;
            uint4 b[NT][P];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int p = 0; p < P; p++) b[j][p] = sb[(p * G::BN + wn * 8 * NT + 8 * j + g) * 4 + t];
            uint4 a[MTW][2];
#pragma unroll
            for (int m = 0; m < MTW; m++) a[m][0] = sa[(wm * MTW + m) * 64 + lane], a[m][1] = sa[(wm * MTW + m) * 64 + 32 + lane];
            /* mma_step's order for every accumulator (first half: parts in order, then the second),
             * the accumulators interleaved so that no MMA waits on the one before it */
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int p = 0; p < P; p++)
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            const uint4 &a0 = a[m][0], &a1 = a[m][1], &bb = b[j][p];
                            if (hf == 0) mma_bf16(acc[m][j], a0.x, a1.x, a0.y, a1.y, bb.x, bb.y);
                            else mma_bf16(acc[m][j], a0.z, a1.z, a0.w, a1.w, bb.z, bb.w);
                        }
            if (++ck == q8i + (cc < r8i)) { /* the class is summed: into the total, in class order */
                if (kz > 1) {                 /* or its partial sums out, for k_gemm_sum */
                    float *pp = grp.part + (int64_t)MM_SPLITS * T * grp.prow[pk.i] + cc * T * w.rows;
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int64_t r = (m0 + wm * MTW + m) * 16 + g + (e >= 2 ? 8 : 0);
                                const int64_t n = n0 + wn * 8 * NT + 8 * j + 2 * t + (e & 1);
                                if (r < w.rows && n < T) pp[n * w.rows + r] = acc[m][j][e];
                                acc[m][j][e] = 0.0f;
                            }
                } else {
#pragma unroll
                    for (int m = 0; m < MTW; m++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++) sum[m][j][e] += acc[m][j][e], acc[m][j][e] = 0.0f;
                }
                cc++, ck = 0;
            }
        }
    }
    cp_async_wait<0>();
    if (kz > 1) return;
    const bool empty = nsteps < MM_SPLITS; /* k_mmv adds its idle warps' zeros too (-0 + 0 = +0) */
#pragma unroll
    for (int m = 0; m < MTW; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t r = (m0 + wm * MTW + m) * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t n = n0 + wn * 8 * NT + 8 * j + 2 * t + (e & 1);
                if (r < w.rows && n < T) pk.y[n * pk.ldy + r] = empty ? sum[m][j][e] + 0.0f : sum[m][j][e];
            }
}

/* k_gemm split: y = 0 + p_0 + p_1 + ... + p_{S-1}, the classes' partial sums in class order (k_gemm's
 * and k_mmv's order, so the same bits); a thread per (matrix row over the group, token) */
__global__ void k_gemm_sum(mm_group g, int64_t T, int64_t rows_all) {
    pdl_wait();
    const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= rows_all * T) return;
    const int64_t n = q / rows_all;
    int64_t r = q % rows_all;
    int i = 0;
    while (i + 1 < g.n && r >= g.prow[i + 1]) i++;
    r -= g.prow[i];
    const int64_t rows = g.w[i].rows;
    const float *pp = g.part + (int64_t)MM_SPLITS * T * g.prow[i] + n * rows + r;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < MM_SPLITS; c++) sum += pp[c * T * rows];
    g.y[i][n * g.ldy[i] + r] = sum;
}

/* the group's block offsets for MT tiles a block; its blocks in all */
int64_t group_blocks(mm_group *g, int MT) {
    int64_t at = 0;
    for (int i = 0; i < g->n; i++) {
        g->blk0[i] = at;
        at += (tiled_tiles(g->w[i].rows) + MT - 1) / MT;
    }
    return at;
}

template <int MT, int NT, int S>
static void launch_mma_p(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts) {
    dim3 grid((unsigned)group_blocks(&g, MT), (unsigned)((T + 8 * NT - 1) / (8 * NT)));
    constexpr int U = MT == 1 ? 4 : 2;
    if (parts == 1) k_mma<MT, NT, 1, U, S><<<grid, 32 * S, 0, s>>>(g, x, ldx, T);
    else k_mma<MT, NT, 3, U, S><<<grid, 32 * S, 0, s>>>(g, x, ldx, T);
}

/* steps of weights in flight a warp at 9 to 16 tokens with bf16 activations (the down and
 * output projections, which k_mmvp's two-tile blocks do not take): the same sums in the same
 * order whatever it is; 2 is what the H200 measured; 4 (more bytes in flight a lane for the
 * 320-tile launches) measured no faster on an H100 (batch 16: 721.9 tok/s against 722.9) */
#ifndef MMV16_U
#define MMV16_U 2
#endif
template <int S>
static void launch_mmv_s(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    dim3 grid((unsigned)group_blocks(&g, 1), 1);
    constexpr int M1 = 256 * 4 / (32 * S), M2 = 256 * 3 / (32 * S) > 0 ? 256 * 3 / (32 * S) : 1;
    if (T <= 8) {
        if (parts == 1) launch_pdl(k_mmv<1, 1, 2, M1, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
        else launch_pdl(k_mmv<3, 1, 2, M1, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
    } else {
        if (parts == 1) launch_pdl(k_mmv<1, 2, MMV16_U, M2, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
        else launch_pdl(k_mmv<3, 2, 2, M2, S>, grid, dim3(32 * S), 0, s, g, xs, ldxs, T);
    }
}

/* k_mmvp's grid: as many blocks as stay resident (MINB an SM), fewer where the tiles then
 * share out more evenly (every block takes ceil(tiles / slots) of them, but the last) */
int mm_sms(void) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms > 0 ? sms : 1;
}

unsigned mmvp_grid(int64_t nblk, int minb) {
    const int64_t slots = (int64_t)mm_sms() * minb, per = (nblk + slots - 1) / slots;
    return (unsigned)((nblk + per - 1) / per);
}

template <int P, int NT, int D, int MINB, int MT = 1>
static void launch_mmvp_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T) {
    const int64_t nblk = group_blocks(&g, MT);
    launch_pdl(k_mmvp<P, NT, D, MINB, MT>, dim3(mmvp_grid(nblk, MINB)), dim3(32 * MM_SPLITS), mmvp_smem<NT, D, MT>(), s, g,
               nblk, xs, ldxs, T);
}

template <int P, int NT, int D, int MINB, int MT = 1>
static void mmvp_attr() {
    static_assert(mmvp_smem<NT, D, MT>() * MINB + 1024 * MINB <= 227 * 1024, "MINB blocks fit an SM");
    cudaFuncSetAttribute(k_mmvp<P, NT, D, MINB, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)mmvp_smem<NT, D, MT>());
}

/* whether k_mmvp's grid for nblk blocks fills the SMs at least as evenly with 3 blocks an SM
 * as with 4 (evenness: the most blocks an SM over the mean) */
static bool mmvp_three(int64_t nblk) {
    const double sms = mm_sms();
    auto spread = [&](int minb) {
        const double g = mmvp_grid(nblk, minb);
        return ceil(g / sms) / (g / sms);
    };
    return spread(3) <= spread(4);
}

/* The ring depths and residencies the backend takes (`mmv_bench vp` on the H200, the 27B
 * launches at 1-8 tokens): 3 blocks an SM with a ring of 6 steps where that spreads the tiles
 * over the SMs at least as evenly as 4 (gate and up 3,901 -> 4,247 GB/s at one token, down
 * 3,122 -> 3,952, the output projections 2,982 -> 3,707, the LM head 4,401 -> 4,496), else 4
 * blocks with 5 steps (the GDN in-projections, 1,030 tiles: 4,373 against 4,054 with 3; q/k/v
 * 4,052 against 3,653); one token's launches 13.90 -> 12.4 ms there, launched back to back.
 * In the model, between its other kernels, the step moved less (same-run A/B, 27B: `exact`
 * b1 63.7 -> 64.8 tok/s, `bf16` b4 264 -> 268, b1 69.0 -> 69.2) */
#define MMVP_D3 6
#define MMVP_D4 5
/* up to 8 tokens */
static void launch_mmvp(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T, int parts) {
    mm_group c = g;
    if (mmvp_three(group_blocks(&c, 1))) {
        if (parts == 1) launch_mmvp_p<1, 1, MMVP_D3, 3>(s, g, xs, ldxs, T);
        else launch_mmvp_p<3, 1, MMVP_D3, 3>(s, g, xs, ldxs, T);
    } else {
        if (parts == 1) launch_mmvp_p<1, 1, MMVP_D4, 4>(s, g, xs, ldxs, T);
        else launch_mmvp_p<3, 1, MMVP_D4, 4>(s, g, xs, ldxs, T);
    }
}

/* 9 to 16 tokens in `bf16`: two tiles a block sharing the activations' fragments, 3 blocks
 * an SM with a ring of 3 steps, for launches of many tiles (`mmv_bench` on the H200 at 16
 * tokens: gate/up 3,265 -> 3,518 GB/s, the GDN qkv 2,974 -> 3,450, attention's q 3,269 ->
 * 3,538; k_mmv keeps the 320-tile down and output projections, 3,495 and 2,957 against
 * 2,974 and 2,598) */
#define MMVP16_D 3
#define MMVP16_MIN_ROWS 10240
static bool mmvp_many(const mm_group &g) {
    int64_t rows = 0;
    for (int i = 0; i < g.n; i++) rows += g.w[i].rows;
    return rows >= MMVP16_MIN_ROWS;
}

/* xs[p][n][c] = part p of x[n][c], n < T, c < ldxs (zeros past cols); k_split8 from
 * SPLIT8_MIN_T tokens (the same bits): prefill steps; decode steps keep k_split, since with
 * k_split8 (and k_silu_mul4) from 64 tokens 64 sequences decoded 2,343 -> 2,143 tok/s on the
 * H200 (2026-12-05: the products of 17-127 tokens stream on k_wgmma_stream, which took
 * longer after it) */
#ifndef SPLIT8_MIN_T
#define SPLIT8_MIN_T 128
#endif
void launch_split(cu_stream s, const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs,
                  int parts) {
    if (T >= SPLIT8_MIN_T && ldxs % 32 == 0) { /* (ldxs is the width rounded up to 32) */
        const unsigned sb = (unsigned)((T * (ldxs / 8) + 255) / 256);
        const int vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
        if (parts == 1) launch_pdl(k_split8<1>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs, vec);
        else launch_pdl(k_split8<3>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs, vec);
        return;
    }
    const unsigned sb = (unsigned)((T * ldxs + 255) / 256);
    if (parts == 1) launch_pdl(k_split<1>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs);
    else launch_pdl(k_split<3>, dim3(sb), dim3(256), 0, s, x, ldx, T, cols, xs, ldxs);
}

/* kz > 1: split over the summation classes (kz of 2, 4 or 8; the matrices at least MM_SPLITS
 * steps wide, part holding MM_SPLITS * T * their rows floats), then k_gemm_sum */
template <int MTW, int NT, int WR, int P>
static void launch_gemm_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t T, int kz = 1,
                          float *part = NULL) {
    typedef gemm_shape<MTW, NT, WR, P> G;
    int64_t rows_all = 0;
    for (int i = 0; i < g.n; i++) g.prow[i] = rows_all, rows_all += g.w[i].rows;
    g.part = part;
    dim3 grid((unsigned)group_blocks(&g, G::TILES), (unsigned)((T + G::BN - 1) / G::BN), (unsigned)kz);
    launch_pdl(k_gemm<MTW, NT, WR, P>, grid, dim3(32 * GEMM_WARPS), G::SMEM, s, g, xs, ldxs, T);
    if (kz > 1) launch_pdl(k_gemm_sum, dim3((unsigned)((rows_all * T + 255) / 256)), dim3(256), 0, s, g, T, rows_all);
}

/* the tile shapes (measured with `mmv_bench sweep` on the 27B shapes): 128 rows by 128 tokens;
 * or, for up to 64 tokens (128 in exact mode), 128 rows by 64 tokens where there are at least
 * 100 such row tiles (14-38% faster than 64 by 64 there), else 64 by 64 */
template <int P>
static void launch_gemm_shape(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T,
                              const cu_mm_scratch *sc) {
    mm_group c = g;
    const int64_t tiles128 = group_blocks(&c, 8), big = tiles128 * ((T + 127) / 128);
    int64_t rows_all = 0;
    for (int i = 0; i < g.n; i++) rows_all += g.w[i].rows;
    /* a split over the classes where the scratch holds the partial sums */
    const bool can_split = T <= 64 && tiled_steps(g.w[0].cols) >= MM_SPLITS && sc->part &&
                           (int64_t)MM_SPLITS * T * rows_all <= sc->part_elems;
    float *part = sc->part;
    /* up to 32 tokens (`mmv_bench sweep` on the H200, 27B shapes): in exact, 128 rows by 16
     * tokens split 8 ways (1.2-1.3x k_mmv at 16 tokens, 1.4-1.9x the 64-token tile at 32);
     * with bf16 activations, 128 rows by 32 tokens (1.3-2x at 32 tokens), split 8 ways where
     * the row tiles are few */
    if constexpr (P == 3) {
        if (T <= 32 && can_split) {
            launch_gemm_p<1, 2, 8, P>(s, g, xs, ldxs, T, MM_SPLITS, part);
            return;
        }
    } else {
        if (T <= 32) {
            if (tiles128 < 100 && can_split) launch_gemm_p<1, 4, 8, P>(s, g, xs, ldxs, T, MM_SPLITS, part);
            else launch_gemm_p<1, 4, 8, P>(s, g, xs, ldxs, T);
            return;
        }
    }
    /* too few row tiles to fill the device at up to 64 tokens: split, so that there are at
     * least 2 blocks an SM (132 SMs) */
    int kz = 1;
    while (kz < MM_SPLITS && tiles128 * kz < 2 * 132) kz *= 2;
    if (tiles128 < 100 && kz > 1 && can_split) {
        launch_gemm_p<1, 8, 8, P>(s, g, xs, ldxs, T, kz, part);
        return;
    }
    if (T <= (P == 3 ? 128 : 64) && tiles128 >= 100) launch_gemm_p<1, 8, 8, P>(s, g, xs, ldxs, T);
    else if (T >= 128 && big >= 2 * 132) launch_gemm_p<4, 4, 2, P>(s, g, xs, ldxs, T);
    else launch_gemm_p<1, 4, 4, P>(s, g, xs, ldxs, T);
}

/* bf16 activations (the split's one part) on k_wgmma_stream: 0, or -1 where it does not take
 * the group (no scratch for it, not Hopper, odd widths) and nothing was launched */
static int launch_stream(cu_stream s, const mm_group &g, const uint16_t *xs, int64_t ldxs, int64_t T,
                         const cu_mm_scratch *sc) {
    if (!sc->tma_encode || !sc->wpart || T < CU_WS_MIN_T || T >= CU_WGMMA_MIN_T) return -1;
    const cu_mat *w[4];
    for (int i = 0; i < g.n; i++) w[i] = &g.w[i];
    return cu_wgmma_stream(s, sc, g.n, w, g.y, g.ldy, xs, ldxs, T);
}

/* matrix i of gs alone: a group of one, its outputs where gs has them */
static mm_group one_of(const mm_group &gs, int i) {
    mm_group one = gs;
    one.n = 1, one.w[0] = gs.w[i], one.y[0] = gs.y[i], one.ldy[0] = gs.ldy[i], one.blk0[0] = 0;
    return one;
}

/* matrix i of gs (its outputs from the slice's first token) times the n split tokens in
 * sc->xs (bf16, one part): k_wgmma where the device runs it and the slice is long enough,
 * else (or where it refuses the matrix) k_gemm */
static void launch_one_bf16(cu_stream s, const mm_group &gs, int i, int64_t ldxs, int64_t n, const cu_mm_scratch *sc) {
    if (sc->tma_encode && n >= CU_WGMMA_MIN_T &&
        cu_wgmma_matmul(s, sc->tma_encode, &gs.w[i], sc->xs, ldxs, n, gs.y[i], gs.ldy[i], sc->wg_clusters) == 0)
        return;
    launch_gemm_shape<1>(s, one_of(gs, i), sc->xs, ldxs, n, sc);
}

/* matrix i of gs (its outputs from the slice's first token) times the n split tokens in
 * sc->xs (bf16, three parts) on k_gemm: what `exact` computes without the library */
static void launch_one_exact(cu_stream s, const mm_group &gs, int i, int64_t ldxs, int64_t n, const cu_mm_scratch *sc) {
    launch_gemm_shape<3>(s, one_of(gs, i), sc->xs, ldxs, n, sc);
}

/* the most tokens (halving from `tokens`, at least 16) a slice for k_gemm may hold: its
 * offsets into xs [3][slice][ldxs] are 32-bit */
static int64_t gemm_slice(int64_t tokens, int64_t ldxs) {
    while (tokens > 16 && 3 * tokens * ldxs >= ((int64_t)1 << 31)) tokens /= 2;
    return tokens;
}

/* the fewest tokens a `bf16` product of bf16 tiled matrices takes the library for: more
 * where k_wgmma runs (CU_WG_BLAS_MIN_T) */
static int64_t blas_min_tiled(const cu_mm_scratch *sc) {
    return sc->tma_encode && CU_WG_BLAS_MIN_T > CU_BLAS_MIN_TOKENS(1) ? CU_WG_BLAS_MIN_T : CU_BLAS_MIN_TOKENS(1);
}

/* Products on cuBLASLt: the group's matrices copied out into sc->wrm side by side (bf16
 * tiled: as stored; MLX Q tiled: dequantized to bf16, as the peers feed their GEMMs), then
 * slices of as many tokens as xs holds in `parts` parts, each split once and multiplied by
 * every matrix. parts 1 (bf16 activations): one library product a matrix; a product the
 * library refuses takes the backend's own kernel (bf16 launch_one_bf16, Q qtiled_own).
 * parts 3 (`exact`, CU_BLAS_EXACT; bf16 tiled only: a dequantized MLX value is not the
 * weight, so those stay on their own kernels): three products a matrix, the lowest part
 * first into y, then the middle and the high part added to it, fp32 sums of exact products
 * in the library's order; a matrix whose product the library refuses, at any of the three,
 * is computed again whole on k_gemm (launch_one_exact, which overwrites y). 0, or -1 with
 * nothing launched where it does not take the group (no library, too few tokens: MLX from
 * CU_BLAS_Q_MIN_T, bf16 tiled from CU_BLAS_MIN_TOKENS or blas_min_tiled; matrices
 * larger than the copy's scratch, MLX in `exact`, `exact` where CU_BLAS_EXACT is 0). */
int launch_blas(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T, int parts,
                const cu_mm_scratch *sc) {
    const bool q = g.w[0].fmt == CU_FMT_Q_TILED;
    if (!sc || !sc->blas || !sc->wrm || !sc->blas_ws || (parts != 1 && (parts != 3 || !CU_BLAS_EXACT)) ||
        (q && parts != 1) || T < (q ? CU_BLAS_Q_MIN_T : CU_BLAS_MIN_TOKENS(parts)))
        return -1;
    const int64_t cols = g.w[0].cols, ldxs = tiled_steps(cols) * 32;
    if (!q && parts == 1 && T < blas_min_tiled(sc)) return -1; /* k_wgmma's */
    int64_t at[4], need = 0;
    for (int i = 0; i < g.n; i++) {
        if ((g.w[i].fmt != CU_FMT_BF16_TILED && g.w[i].fmt != CU_FMT_Q_TILED) || g.w[i].fmt != g.w[0].fmt ||
            g.w[i].cols != cols)
            return -1;
        at[i] = need;
        need += g.w[i].rows * ldxs;
    }
    if (need > sc->wrm_elems || (q && ldxs != cols)) return -1;
    /* xs [parts][n][ldxs] for a slice of n tokens (launch_split's layout, k_gemm's reads) */
    int64_t slice = sc->xs_elems > 0 ? sc->xs_elems / (parts * ldxs) : sc->xs_tokens;
    slice = gemm_slice(slice, ldxs); /* (a refusal takes k_gemm) */
    if (slice < 16) return -1;
    for (int i = 0; i < g.n; i++) {
        if (q) dequant_q(s, g.w[i], sc->wrm + at[i]);
        else cu_untile_bf16(s, (const uint16_t *)g.w[i].data, g.w[i].rows, cols, sc->wrm + at[i]);
    }
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        launch_split(s, x + t0 * ldx, ldx, n, cols, sc->xs, ldxs, parts);
        for (int i = 0; i < g.n; i++) {
            if (parts == 3) {
                int p = 2; /* lo, mid, hi: the smallest terms summed first */
                while (p >= 0 && cu_blas_gemm(sc->blas, s, sc->wrm + at[i], ldxs, g.w[i].rows, cols, sc->xs + p * n * ldxs,
                                              ldxs, n, gs.y[i], gs.ldy[i], p < 2, sc->blas_ws, sc->blas_ws_bytes) == 0)
                    p--;
                if (p >= 0) launch_one_exact(s, gs, i, ldxs, n, sc);
                continue;
            }
            if (cu_blas_gemm(sc->blas, s, sc->wrm + at[i], ldxs, g.w[i].rows, cols, sc->xs, ldxs, n, gs.y[i], gs.ldy[i], 0,
                             sc->blas_ws, sc->blas_ws_bytes) == 0)
                continue;
            if (!q) {
                launch_one_bf16(s, gs, i, ldxs, n, sc);
                continue;
            }
            /* (its own split of the slice, then the same xs again for the next matrix) */
            qtiled_own(s, one_of(gs, i), x + t0 * ldx, ldx, n, 1, sc, 0);
            launch_split(s, x + t0 * ldx, ldx, n, cols, sc->xs, ldxs, 1);
        }
    }
    return 0;
}

/* ---- the `bf16` MLP of many tokens, its intermediates in bf16 (cuda_kernels.h) ---- */

/* whether the `bf16` MLP of T tokens takes k_wgmma where the library does not take it
 * (CU_MLP_BF16_OWN) */
static bool mlp_own(const cu_mm_scratch *sc, int64_t T) {
    return CU_MLP_BF16_OWN && sc->tma_encode && T >= CU_WGMMA_MIN_T;
}

extern "C" int cu_mlp_gate_up_bf16(cu_stream s, const cu_mat *gate, const cu_mat *up, const float *x, int64_t ldx,
                                   int64_t T, uint16_t *gb, uint16_t *ub, uint16_t *hb, const cu_mm_scratch *sc) {
    const int64_t rows = gate->rows, cols = gate->cols, ldxs = tiled_steps(cols) * 32;
    if (!sc || gate->fmt != CU_FMT_BF16_TILED || up->fmt != CU_FMT_BF16_TILED || up->rows != rows || up->cols != cols ||
        rows % 32 != 0)
        return -1;
    const bool lib = sc->blas && sc->wrm && sc->blas_ws && T >= blas_min_tiled(sc) && 2 * rows * ldxs <= sc->wrm_elems;
    if (!lib && !mlp_own(sc, T)) return -1;
    int64_t slice = sc->xs_elems > 0 ? sc->xs_elems / ldxs : sc->xs_tokens;
    if (slice < 16) return -1;
    /* the library reads the matrices copied out row-major; k_wgmma reads them tiled, its sums
     * rounded to bf16 as it writes them */
    uint16_t *wg = sc->wrm, *wu = sc->wrm + rows * ldxs;
    if (lib) {
        cu_untile_bf16(s, (const uint16_t *)gate->data, rows, cols, wg);
        cu_untile_bf16(s, (const uint16_t *)up->data, rows, cols, wu);
    }
    /* w's product of n tokens into out [n][ld] (the library: wr's first m rows) */
    auto product = [&](const cu_mat *w, const uint16_t *wr, int64_t m, int64_t n, uint16_t *out, int64_t ld) {
        return lib ? cu_blas_gemm_to(sc->blas, s, wr, ldxs, m, cols, sc->xs, ldxs, n, out, ld, 1, 0, sc->blas_ws,
                                     sc->blas_ws_bytes)
                   : cu_wgmma_matmul_bf16(s, sc->tma_encode, w, sc->xs, ldxs, n, out, ld, sc->wg_clusters);
    };
    /* CU_BLAS_GU_ONE: the copies side by side are one matrix of 2 rows rows, its product [T][2 rows] in ub */
    const bool one = lib && CU_BLAS_GU_ONE;
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        launch_split(s, x + t0 * ldx, ldx, n, cols, sc->xs, ldxs, 1);
        if (one ? product(gate, wg, 2 * rows, n, ub + t0 * 2 * rows, 2 * rows) != 0
                : product(gate, wg, rows, n, gb + t0 * rows, rows) != 0 ||
                      product(up, wu, rows, n, ub + t0 * rows, rows) != 0)
            return -1;
    }
    /* (rows a multiple of 32: ldh is rows) */
    if (one) cu_silu_mul_bf16(s, ub, ub + rows, 2 * rows, T, rows, hb, rows);
    else cu_silu_mul_bf16(s, gb, ub, rows, T, rows, hb, rows);
    return 0;
}

extern "C" void cu_matmul_bf16_in(cu_stream s, const cu_mat *w, const uint16_t *xb, int64_t ldxb, int64_t T, float *y,
                                  int64_t ldy, const cu_mm_scratch *sc) {
    const int64_t rows = w->rows, cols = w->cols;
    assert(w->fmt == CU_FMT_BF16_TILED && ldxb >= tiled_steps(cols) * 32);
    if (T <= 0) return;
    if (sc->blas && sc->wrm && sc->blas_ws && T >= blas_min_tiled(sc) && rows * ldxb <= sc->wrm_elems &&
        ldxb == tiled_steps(cols) * 32) {
        cu_untile_bf16(s, (const uint16_t *)w->data, rows, cols, sc->wrm);
        if (cu_blas_gemm_to(sc->blas, s, sc->wrm, ldxb, rows, cols, xb, ldxb, T, y, ldy, 0, 0, sc->blas_ws,
                            sc->blas_ws_bytes) == 0)
            return;
    }
    if (mlp_own(sc, T) && cu_wgmma_matmul(s, sc->tma_encode, w, xb, ldxb, T, y, ldy, sc->wg_clusters) == 0)
        return;
    /* k_gemm on xb as the split it is (one part), in slices its 32-bit offsets allow */
    mm_group g;
    g.n = 1, g.w[0] = *w, g.y[0] = y, g.ldy[0] = ldy, g.blk0[0] = 0;
    const int64_t slice = gemm_slice(sc->xs_tokens, ldxb);
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        gs.y[0] = y + t0 * ldy;
        launch_gemm_shape<1>(s, gs, xb + t0 * ldxb, ldxb, n, sc);
    }
}

/* more than 16 tokens, in slices of at most sc->xs_tokens: split, then k_gemm */
static void launch_gemm(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T, int parts,
                        const cu_mm_scratch *sc) {
    if (launch_blas(s, g, x, ldx, T, parts, sc) == 0) return;
    const int64_t ldxs = tiled_steps(g.w[0].cols) * 32;
    /* slices of xs_tokens (2,048) also in `bf16`, where xs could hold three times as many:
     * measured on the H200, an 8,192-token prompt's gate/up took 428 ms a launch each against
     * 379 in four slices (a slice's activations stay in L2 while every row block reads them) */
    const int64_t slice = gemm_slice(sc->xs_tokens, ldxs);
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        launch_split(s, x + t0 * ldx, ldx, n, g.w[0].cols, sc->xs, ldxs, parts);
        if (parts == 1 && sc->tma_encode && n >= CU_WGMMA_MIN_T) { /* Hopper: wgmma, a launch a matrix */
            for (int i = 0; i < g.n; i++) launch_one_bf16(s, gs, i, ldxs, n, sc);
            continue;
        }
        if (parts == 1 && launch_stream(s, gs, sc->xs, ldxs, n, sc) == 0) continue;
        if (parts == 1) launch_gemm_shape<1>(s, gs, sc->xs, ldxs, n, sc);
        else launch_gemm_shape<3>(s, gs, sc->xs, ldxs, n, sc);
    }
}

template <int MTW, int NT, int WR, int P>
static void gemm_attr() {
    cudaFuncSetAttribute(k_gemm<MTW, NT, WR, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)gemm_shape<MTW, NT, WR, P>::SMEM);
}

void mm_bf16_init(void) {
    mmvp_attr<1, 1, MMVP_D3, 3>();
    mmvp_attr<3, 1, MMVP_D3, 3>();
    mmvp_attr<1, 1, MMVP_D4, 4>();
    mmvp_attr<3, 1, MMVP_D4, 4>();
    mmvp_attr<1, 2, MMVP16_D, 3, 2>();
    gemm_attr<1, 8, 8, 1>();
    gemm_attr<1, 8, 8, 3>();
    gemm_attr<4, 4, 2, 1>();
    gemm_attr<4, 4, 2, 3>();
    gemm_attr<1, 4, 4, 1>();
    gemm_attr<1, 4, 4, 3>();
    gemm_attr<1, 2, 8, 3>();
    gemm_attr<1, 4, 8, 1>();
}

void launch_tiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                  const cu_mm_scratch *sc, int xs_ready) {
    if (sc && T > 16) {
        launch_gemm(s, g, x, ldx, T, parts, sc);
        return;
    }
    if (sc) {
        const int64_t ldxs = tiled_steps(g.w[0].cols) * 32;
        if (!xs_ready) launch_split(s, x, ldx, T, g.w[0].cols, sc->xs, ldxs, parts);
        if (parts == 1 && launch_stream(s, g, sc->xs, ldxs, T, sc) == 0) return;
        /* k_mmvp where it measured faster (`mmv_bench` on the H200, one 27B token's matrices:
         * 15.8 against 16.6 ms in exact at 1 token, 14.0 against 15.8 ms in bf16; 15.5 against
         * 16.2 at 8 tokens in bf16); beyond, its ring's shared memory leaves too little L1 for
         * the activations (3 parts of them in exact), and k_mmv wins, but for launches of many
         * tiles in bf16 with two tiles a block (mmvp_many: 27B b16 910 -> 934 tok/s, the same
         * run; one tile a block at 9-16 tokens, everywhere: 915 -> 813) */
        if (T <= (parts == 1 ? 8 : 2)) launch_mmvp(s, g, sc->xs, ldxs, T, parts);
        else if (parts == 1 && T <= 16 && mmvp_many(g)) launch_mmvp_p<1, 2, MMVP16_D, 3, 2>(s, g, sc->xs, ldxs, T);
        else if (parts == 3 && T > 8) launch_gemm_shape<3>(s, g, sc->xs, ldxs, T, sc); /* split 8 ways: see there */
        else launch_mmv_s<MM_SPLITS>(s, g, sc->xs, ldxs, T, parts);
        return;
    }
    if (T <= 8) launch_mma_p<1, 1, MM_SPLITS>(s, g, x, ldx, T, parts);
    else if (T <= 16) launch_mma_p<1, 2, MM_SPLITS>(s, g, x, ldx, T, parts);
    else if (T <= 32) launch_mma_p<1, 4, MM_SPLITS>(s, g, x, ldx, T, parts);
    else launch_mma_p<2, 8, MM_SPLITS>(s, g, x, ldx, T, parts);
}
