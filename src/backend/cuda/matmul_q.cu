/* ==== CUDA kernels: MLX affine 4- and 8-bit matrices on tensor cores ====
 *
 * The Q tiled layout (cu_tile_q), k_qmv and k_qmvp (up to 16 tokens a launch; more in
 * slices), their launchers and launch_qtiled, which picks between them.
 */
#include "backend/cuda/mm_int.cuh"

/* ---- MLX affine 4- and 8-bit on tensor cores: k_qmv ----
 * The packed values stay packed, re-laid at upload as the bf16 tiles are (CU_FMT_Q_TILED,
 * cu_tile_q): tile m, step k holds 32 lane chunks of 2 * bits bytes, lane 4g + t's columns
 * 32k + 8t .. + 7 of row 16m + g, then of row 16m + g + 8. 8-bit: the 8 bytes as stored;
 * 4-bit: the 8 nibbles of columns c0..c7 at bits c0 0, c1 16, c2 4, c3 20, c4 8, c5 24, c6 12,
 * c7 28, so that one shift and one mask make the bf16 pair of two neighbours. Scales and
 * biases: [tile][group][16], as stored (f32, f16 or bf16), the rows in the order 0, 8, 1, 9,
 * ..., 7, 15 (row r at 2 (r % 8) + r / 8), so that lane 4g + t reads its rows g and g + 8 as
 * one word.
 * An integer value q is exact in bf16, so on the tensor cores a group g of a row gives
 *   y += s_g * (sum_c q_c x_c) + b_g * (sum_c x_c)
 * both sums exact products accumulated in fp32 (the second by an MMA with a matrix of ones).
 * 4-bit values go in as 16 + q (exact; bf16 0x4180 | q << 3: one shift and one mask a pair),
 * so their bias is b_g - 16 s_g (q_bias);
 * x in the same bf16 parts as the bf16 kernels (3: fp32-grade; 1: bf16). A block takes one
 * tile and up to 16 tokens; its S warps take the groups in turn (warp s: groups s, s + S, ...)
 * and their partial sums are added in warp order: the order is fixed by the shape alone, for
 * any token count (more than 16 tokens: the same kernel on slices of 16). */
extern "C" size_t cu_qtiled_bytes(int64_t rows, int64_t cols, int bits) {
    return (size_t)tiled_tiles(rows) * (size_t)(cols / 32) * 64 * (size_t)bits;
}
extern "C" size_t cu_qtiled_groups(int64_t rows, int64_t cols, int group) {
    return (size_t)tiled_tiles(rows) * (size_t)(cols / group) * 16;
}

/* a thread per destination chunk (8 columns of a row): src [rows][cols * bits / 8] */
__global__ void k_tile_q(const uint8_t *src, int64_t rows, int64_t cols, int bits, uint8_t *dst) {
    const int64_t nsteps = cols / 32, nq = tiled_tiles(rows) * nsteps * 64, rb = cols * bits / 8;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int L = (int)(q % 64) / 2, half = (int)(q % 2);
        const int64_t r = 16 * m + 8 * half + (L >> 2), c = 32 * k + 8 * (L & 3);
        if (bits == 8) {
            uint2 v = make_uint2(0, 0);
            if (r < rows) v = *(const uint2 *)(src + r * rb + c);
            *(uint2 *)(dst + q * 8) = v;
        } else {
            uint32_t v = r < rows ? *(const uint32_t *)(src + r * rb + c / 2) : 0u, o = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) o |= ((v >> (4 * e)) & 15u) << ((e & 1) * 16 + (e >> 1) * 4);
            *(uint32_t *)(dst + q * 4) = o;
        }
    }
}

/* a thread per (tile, group, row): src [rows][cols / group] of es bytes; position i of a
 * (tile, group) holds row (i % 2) * 8 + i / 2 (row r at 2 (r % 8) + r / 8) */
__global__ void k_tile_groups(const uint8_t *src, int64_t rows, int64_t ng, int es, uint8_t *dst) {
    const int64_t nq = tiled_tiles(rows) * ng * 16;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mj = q / 16, m = mj / ng, j = mj % ng, i = q % 16, r = 16 * m + (i % 2) * 8 + i / 2;
        for (int b = 0; b < es; b++) dst[q * es + b] = r < rows ? src[(r * ng + j) * es + b] : 0;
    }
}

/* a thread per lane piece of the Q tiled layout (8 columns of a row, as k_tile_q wrote it):
 * its values s q + b (the stored scale and bias of its group) rounded to bf16, into dst
 * [rows][cols] row-major (cols is a multiple of 32: cu_q_tileable); cuBLASLt's copy */
__global__ void k_dequant_q(cu_mat w, uint16_t *dst) {
    const int64_t nsteps = w.cols / 32, nq = tiled_tiles(w.rows) * nsteps * 64, ng = w.cols / w.group;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t mk = q / 64, m = mk / nsteps, k = mk % nsteps;
        const int L = (int)(q % 64) / 2, half = (int)(q % 2), rr = 8 * half + (L >> 2);
        const int64_t r = 16 * m + rr, c = 32 * k + 8 * (L & 3);
        if (r >= w.rows) continue;
        const int64_t gi = (m * ng + c / w.group) * 16 + 2 * (rr % 8) + rr / 8; /* rows 0, 8, 1, 9, ... */
        const float sc = load_s(w.scales, w.sdtype, gi), bi = load_s(w.biases, w.sdtype, gi);
        uint32_t qv[8];
        if (w.bits == 8) {
            const uint2 v = *(const uint2 *)((const uint8_t *)w.data + q * 8);
#pragma unroll
            for (int e = 0; e < 4; e++) qv[e] = (v.x >> (8 * e)) & 255u, qv[4 + e] = (v.y >> (8 * e)) & 255u;
        } else {
            const uint32_t v = *(const uint32_t *)((const uint8_t *)w.data + q * 4);
#pragma unroll
            for (int e = 0; e < 8; e++) qv[e] = (v >> ((e & 1) * 16 + (e >> 1) * 4)) & 15u;
        }
        uint32_t o[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[e] = pack2(f2bf16(fmaf(sc, (float)qv[2 * e], bi)), f2bf16(fmaf(sc, (float)qv[2 * e + 1], bi)));
        *(uint4 *)(dst + r * w.cols + c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

void dequant_q(cu_stream s, const cu_mat &w, uint16_t *dst) {
    if (w.rows > 0 && w.cols > 0) k_dequant_q<<<4096, 256, 0, s>>>(w, dst);
}

extern "C" void cu_tile_q(cu_stream s, const void *data, const void *scales, const void *biases, int es, int64_t rows,
                          int64_t cols, int bits, int group, void *ddata, void *dscales, void *dbiases) {
    if (rows <= 0 || cols <= 0) return;
    k_tile_q<<<4096, 256, 0, s>>>((const uint8_t *)data, rows, cols, bits, (uint8_t *)ddata);
    k_tile_groups<<<1024, 256, 0, s>>>((const uint8_t *)scales, rows, cols / group, es, (uint8_t *)dscales);
    k_tile_groups<<<1024, 256, 0, s>>>((const uint8_t *)biases, rows, cols / group, es, (uint8_t *)dbiases);
}

/* bf16 pairs of the values of one step's chunk: a[0..3] the first MMA's A registers, a[4..7]
 * the second's (k_mmv's fragment order) */
template <int BITS>
__device__ __forceinline__ void q_frag(const uint4 &v, uint32_t (&a)[8]) {
    if (BITS == 8) {
        /* q as fp32 by 2^23 + q less 2^23 (exact), its high half the bf16 */
        auto pr = [](uint32_t w, int b) {
            const float f0 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440 + b)) - 8388608.0f;
            const float f1 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7441 + b)) - 8388608.0f;
            return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
        };
        /* v.x, v.y: row g's columns 0-3, 4-7; v.z, v.w: row g + 8's */
        a[0] = pr(v.x, 0), a[1] = pr(v.z, 0), a[2] = pr(v.x, 2), a[3] = pr(v.z, 2);
        a[4] = pr(v.y, 0), a[5] = pr(v.w, 0), a[6] = pr(v.y, 2), a[7] = pr(v.w, 2);
    } else {
        /* 0x4180 | n << 3 is the bf16 16 + n (q_bias takes the 16 off) */
        auto pr = [](uint32_t w, int sh) {
            const uint32_t u = sh >= 3 ? w >> (sh - 3) : w << (3 - sh), hi = 0x41804180u;
            uint32_t o; /* (u & 0x00780078) | hi as one LOP3 (the compiler makes two of it) */
            asm("lop3.b32 %0, %1, 0x00780078, %2, 0xEA;" : "=r"(o) : "r"(u), "r"(hi));
            return o;
        };
        /* v.x: row g's columns, v.y: row g + 8's */
        a[0] = pr(v.x, 0), a[1] = pr(v.y, 0), a[2] = pr(v.x, 4), a[3] = pr(v.y, 4);
        a[4] = pr(v.x, 8), a[5] = pr(v.y, 8), a[6] = pr(v.x, 12), a[7] = pr(v.y, 12);
    }
}

/* a group's bias as the MMAs want it: 4-bit values went in as 16 + q */
template <int BITS>
__device__ __forceinline__ float q_bias(float b, float s) { return BITS == 4 ? fmaf(-16.0f, s, b) : b; }

/* entries i and i + 1 (i even) of scales or biases of type dt: rows g and g + 8 of a group */
__device__ __forceinline__ void load_s2(const void *p, int dt, int64_t i, float &a, float &b) {
    if (dt == 2) {
        const uint32_t v = ((const uint32_t *)p)[i / 2];
        a = __uint_as_float(v << 16), b = __uint_as_float(v & 0xffff0000u);
    } else if (dt == 1) {
        const float2 f = __half22float2(((const __half2 *)p)[i / 2]);
        a = f.x, b = f.y;
    } else {
        const float2 f = ((const float2 *)p)[i / 2];
        a = f.x, b = f.y;
    }
}

template <int BITS>
__device__ __forceinline__ uint4 q_load(const uint8_t *p) {
    if (BITS == 8) return ldg_stream((const uint16_t *)p);
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return make_uint4(v.x, v.y, 0, 0);
}

__device__ __forceinline__ float group_at(const void *p, int dt, int64_t i) { return load_s(p, dt, i); }

/* ---- MLX 4- and 8-bit on integer tensor cores (the IM form of k_qmvp) ----
 * The scheme of the CPU's VNNI kernel (kernels/cpu/q8vnni.c): per token and group g the
 * activations become integers X = round(x / d_g), d_g = max |x| / QI_XMAX (21 bits and a
 * sign), as three signed limbs X = a2 2^14 + a1 2^7 + a0 (a0, a1 in [-64, 63], a2 in
 * [-128, 127]: s8 operands); each limb's products with the
 * unsigned values q are summed exactly in int32 (mma m16n8k32 u8 x s8: no value is converted
 * to a float), then T = fma(A2, 2^14, fma(A1, 2^7, A0)) and the output's sum takes
 * fma(T, s_g d_g) and fma(b_g, d_g sum_g X): the product of the values with the activations
 * as the integers say, d_g X (the CPU takes the sum of x itself, and its group order is not
 * the warps' of k_qmvp: not the CPU's bits; the integer sum is exact, so the limbs' makers
 * agree bit for bit whatever lanes hold a group). The values stay as uploaded: 8-bit lanes' bytes
 * are the A fragments as they lie (the MMA's k order within a lane's columns is free: the
 * sums are exact), 4-bit nibbles become bytes by a mask and a shift (columns 0, 4, 1, 5 and
 * 2, 6, 3, 7 of a lane's 8), and the limbs are laid in the same column order.
 * k_qlimbs makes them for QI_TP tokens (zeros past T), as mm_int.cuh's qi_put lays them. */

extern "C" size_t cu_qint_bytes(int64_t cols) {
    const int64_t nsteps = tiled_steps(cols), ng = cols / 32 + 1;
    return (size_t)(QI_TP * nsteps * 96 + ng * QI_TP * 8);
}

/* a warp per (token, group) of QI_TP tokens; x [T][ldx] (tokens past T: zeros); lane l holds
 * the group's columns l + 32 i */
__global__ void k_qlimbs(const float *x, int64_t ldx, int64_t T, int64_t cols, int group, int bits, uint8_t *xq) {
    pdl_wait(); /* x is the predecessor's */
    const int lane = threadIdx.x & 31;
    const int64_t nsteps = tiled_steps(cols), ng = cols / group;
    const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (wid >= QI_TP * ng) return;
    const int64_t tok = wid / ng, gj = wid % ng;
    const int per = group / 32;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < per && tok < T) v[i] = x[tok * ldx + gj * group + lane + 32 * i];
    qi_put_warp(xq, nsteps, tok, gj, v, per, gj * group + lane, bits);
}

/* d += A (16 rows x 32 columns, u8) B (32 x 8 tokens, s8), exact */
__device__ __forceinline__ void mma_u8s8(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a step's values as the u8 A fragment: 8-bit as they lie (v.x, v.y row g's columns 0-3,
 * 4-7; v.z, v.w row g + 8's), 4-bit unpacked (v.x row g, v.y row g + 8: columns 0, 4, 1, 5
 * then 2, 6, 3, 7) */
template <int BITS>
__device__ __forceinline__ void qi_frag(const uint4 &v, uint32_t (&a)[4]) {
    if (BITS == 8) a[0] = v.x, a[1] = v.z, a[2] = v.y, a[3] = v.w;
    else a[0] = v.x & 0x0f0f0f0fu, a[1] = v.y & 0x0f0f0f0fu, a[2] = (v.x >> 4) & 0x0f0f0f0fu, a[3] = (v.y >> 4) & 0x0f0f0f0fu;
}

/* A block: one tile, BT tokens; the columns of its NTC token tiles of 8 hold the tokens' bf16
 * parts side by side (column n: token n / P, part n % P), so that a token alone takes one MMA
 * per part of the step, not one per part of each; each column's sums are its own, and the
 * parts of a token are added at the end, with the warps' partial sums, in a fixed order. GS:
 * the steps of a group (its columns / 32). R groups of values (and their scales and biases)
 * are in flight a warp. */
template <int P, int NTC, int BITS, int GS, int MM_S, int R>
__global__ void __launch_bounds__(32 * MM_S, NTC <= 2 ? 3 : 2)
    k_qmv(mm_group grp, const uint16_t *xs, int64_t ldxs, int64_t T) {
    constexpr int BT = 8 * NTC / P; /* tokens a block */
    __shared__ float red[MM_S][NTC * 128];
    /* block b: row tile b / ntt, token tile b % ntt (a row tile's token tiles run side by side) */
    const int64_t ntt = (T + BT - 1) / BT;
    const mm_pick pk = mm_select_at(grp, (int64_t)blockIdx.x / ntt);
    const cu_mat &w = pk.w;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t nsteps = w.cols / 32, ng = w.cols / w.group, m = pk.blk;
    const int64_t tb0 = (int64_t)blockIdx.x % ntt * BT, pstride = T * ldxs;
    const int64_t ni = warp < ng ? (ng - warp + MM_S - 1) / MM_S : 0; /* this warp's groups */
    constexpr int CB = 2 * BITS;                                      /* a lane's bytes a step */
    const uint8_t *pa = (const uint8_t *)w.data + m * nsteps * 32 * CB + lane * CB;
    const uint16_t *pb[NTC]; /* this lane's column g of each token tile: its token's part */
    bool bin[NTC];
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        const int n = 8 * j + g;
        const int64_t tok = tb0 + n / P;
        bin[j] = n / P < BT && tok < T;
        pb[j] = xs + (int64_t)(n % P) * pstride + (bin[j] ? tok : 0) * ldxs + 8 * t;
    }
    const uint32_t one2 = 0x3f803f80u; /* bf16 1.0, 1.0 */
    float acc[NTC][4];
#pragma unroll
    for (int j = 0; j < NTC; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint4 nx[R][GS];
    float nsb[R][4]; /* scale of rows g, g + 8, bias of rows g, g + 8 */
    auto fetch = [&](int sl, int64_t gi) {
        const int64_t gj = warp + gi * MM_S, k0 = gj * GS, q = (m * ng + gj) * 16 + 2 * g;
#pragma unroll
        for (int u = 0; u < GS; u++) nx[sl][u] = q_load<BITS>(pa + (k0 + u) * 32 * CB);
        load_s2(w.scales, w.sdtype, q, nsb[sl][0], nsb[sl][1]);
        load_s2(w.biases, w.sdtype, q, nsb[sl][2], nsb[sl][3]);
    };
#pragma unroll
    for (int sl = 0; sl < R; sl++)
        if (ni > sl) fetch(sl, sl);
    pdl_wait(); /* the activations are the predecessor's */
    for (int64_t i0 = 0; i0 < ni; i0 += R) {
#pragma unroll
        for (int sl = 0; sl < R; sl++) {
            const int64_t i = i0 + sl;
            if (i >= ni) break;
            const int64_t k0 = (warp + i * MM_S) * GS;
            uint4 cur[GS];
#pragma unroll
            for (int u = 0; u < GS; u++) cur[u] = nx[sl][u];
            const float s0 = nsb[sl][0], s1 = nsb[sl][1];
            const float b0 = q_bias<BITS>(nsb[sl][2], s0), b1 = q_bias<BITS>(nsb[sl][3], s1);
            if (i + R < ni) fetch(sl, i + R);
            float ga[NTC][4], xa[NTC][4];
#pragma unroll
            for (int j = 0; j < NTC; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) ga[j][e] = xa[j][e] = 0.0f;
#pragma unroll
            for (int u = 0; u < GS; u++) {
                uint32_t a[8];
                q_frag<BITS>(cur[u], a);
#pragma unroll
                for (int j = 0; j < NTC; j++) {
                    const uint4 b = bin[j] ? *(const uint4 *)(pb[j] + (k0 + u) * 32) : make_uint4(0, 0, 0, 0);
                    mma_bf16(ga[j], a[0], a[1], a[2], a[3], b.x, b.y);
                    mma_bf16(xa[j], one2, one2, one2, one2, b.x, b.y);
                    mma_bf16(ga[j], a[4], a[5], a[6], a[7], b.z, b.w);
                    mma_bf16(xa[j], one2, one2, one2, one2, b.z, b.w);
                }
            }
#pragma unroll
            for (int j = 0; j < NTC; j++) {
                acc[j][0] = fmaf(b0, xa[j][0], fmaf(s0, ga[j][0], acc[j][0]));
                acc[j][1] = fmaf(b0, xa[j][1], fmaf(s0, ga[j][1], acc[j][1]));
                acc[j][2] = fmaf(b1, xa[j][2], fmaf(s1, ga[j][2], acc[j][2]));
                acc[j][3] = fmaf(b1, xa[j][3], fmaf(s1, ga[j][3], acc[j][3]));
            }
        }
    }
    /* red[warp][tile j][row][column]; then each (token, row): warps in order, a warp's parts in order */
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        float *o = red[warp] + j * 128;
        o[g * 8 + 2 * t] = acc[j][0];
        o[g * 8 + 2 * t + 1] = acc[j][1];
        o[(g + 8) * 8 + 2 * t] = acc[j][2];
        o[(g + 8) * 8 + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < BT * 16; i += blockDim.x) {
        const int tl = i / 16, row = i % 16;
        const int64_t r = m * 16 + row, tok = tb0 + tl;
        if (r >= w.rows || tok >= T) continue;
        float sum = 0.0f;
        for (int q = 0; q < MM_S; q++)
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int n = tl * P + p;
                sum += red[q][(n / 8) * 128 + row * 8 + n % 8];
            }
        pk.y[tok * pk.ldy + r] = sum;
    }
}

/* ---- MLX 4- and 8-bit, up to 16 tokens, blocks that stay: k_qmvp ----
 * k_qmv's sums in k_qmv's order (the same bits), from k_mmvp's resident blocks: block b takes
 * MT tiles at once (MT = 2 up to 8 tokens' columns, else 1): tile pairs b, b + G, ...; each
 * warp streams its groups of all its tiles (a group's GS steps of values and its 16 rows'
 * scales and biases, for each of the MT tiles) through a ring of D slots in shared memory,
 * filled by cp.async D - 1 slots ahead, 16 bytes a copy (the values of a group are a run:
 * lane c takes chunks c, c + 32, ...; four lanes a tile take its bf16 scales and biases, the
 * only scale type it takes); a slot is read after a warp barrier. The launcher takes one tile
 * a block where two would leave resident blocks idle; MT and D change no bits. The MT tiles
 * share the activations' fragments, loaded a group ahead where they fit the registers (PF),
 * and the MMAs that sum them (sum_c x_c is the same for every row).
 * Shared memory: the ring [S][D][MT][qmvp_tile bytes], then the partial sums
 * [S][MT * NTC * 128] floats. */
template <int BITS, int GS>
__host__ __device__ constexpr int qmvp_tile() { return GS * 32 * 2 * BITS + 64; } /* values; 16 bf16 scales, 16 biases */
/* the tiles a block takes at once: 2 where the registers and the ring allow */
template <int NTC, int BITS, int GS>
__host__ __device__ constexpr int qmvp_mt() { return NTC == 1 && GS * BITS <= 16 ? 2 : 1; }
template <int NTC, int BITS, int GS, int D, int MT>
__host__ __device__ constexpr size_t qmvp_smem() {
    return (size_t)MM_SPLITS * D * MT * qmvp_tile<BITS, GS>() + (size_t)MM_SPLITS * MT * NTC * 128 * 4;
}

template <int P, int NTC, int BITS, int GS, int D, int MINB, int MT, bool IM = false>
__global__ void __launch_bounds__(32 * MM_SPLITS, MINB)
    k_qmvp(mm_group grp, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t T) {
    static_assert(!IM || P == 1, "the IM form takes the activations as limbs (xs: k_qlimbs's xq)");
    constexpr int BT = 8 * NTC / P, CB = 2 * BITS, TB = qmvp_tile<BITS, GS>(), VB = GS * 32 * CB;
    constexpr int SLOT = MT * TB;
    constexpr bool PF = GS * NTC <= 4; /* the next group's activations in registers */
    extern __shared__ uint4 smq[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned char *ring = (unsigned char *)smq + warp * D * SLOT;
    float(*red)[MT * NTC * 128] = (float(*)[MT * NTC * 128])((unsigned char *)smq + MM_SPLITS * D * SLOT);
    const int64_t nsteps = grp.w[0].cols / 32, ng = grp.w[0].cols / grp.w[0].group; /* one width, bits and group */
    constexpr int es = 2; /* bf16 scales and biases (qmvp_fits) */
    const int ni = warp < ng ? (int)((ng - warp + MM_SPLITS - 1) / MM_SPLITS) : 0; /* a tile's groups, this warp */
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring);
    /* the producer: group pi of block pb's tiles (pn of them in its matrix), this warp's; into slot ps */
    int64_t pb = blockIdx.x;
    int pi = 0, ps = 0, pn = 0;
    /* this lane's part of the scales and biases: tile sm_m's (scales, or biases where sm_w),
     * the 16 bytes at sm_c (each tile's 16 of each are es chunks of 16 bytes) */
    const int sm_m = lane / (2 * es), sm_w = (lane / es) & 1, sm_c = lane % es;
    const unsigned sm_sa = (unsigned)(sm_m * TB + VB + sm_w * 32 + sm_c * 16);
    const uint8_t *pv[MT]; /* the block's tiles' values, group 0 */
    const uint8_t *psb = NULL; /* this lane's scales or biases of its tile, group 0 */
    auto p_open = [&]() {
        if (pb < nblk) {
            const mm_pick q = mm_select_at(grp, pb);
            const int64_t m0 = q.blk * MT, left = tiled_tiles(q.w.rows) - m0;
            pn = left < MT ? (int)left : MT;
#pragma unroll
            for (int m = 0; m < MT; m++) pv[m] = (const uint8_t *)q.w.data + (m0 + m) * nsteps * 32 * CB;
            psb = (const uint8_t *)(sm_w ? q.w.biases : q.w.scales) + (m0 + sm_m) * ng * 16 * es + sm_c * 16;
        }
    };
    auto produce = [&]() {
        if (ni > 0 && pb < nblk) {
            const int gj = warp + pi * MM_SPLITS;
            const unsigned sa = ring_sa + (unsigned)(ps * SLOT);
            /* a tile's group of values is VB bytes in a run, copied as VB / 16 chunks of 16 bytes
             * (through L2 only), chunk c by lane c % 32 */
#pragma unroll
            for (int m = 0; m < MT; m++)
                if (m < pn) { /* past the matrix's last tile: rows never written */
                    const uint8_t *src = pv[m] + (unsigned)gj * (unsigned)VB;
#pragma unroll
                    for (int c0 = 0; c0 < VB / 16; c0 += 32)
                        if (c0 + lane < VB / 16)
                            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + m * TB + (c0 + lane) * 16),
                                         "l"(src + (c0 + lane) * 16)
                                         : "memory");
                }
            if (sm_m < pn)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa + sm_sa), "l"(psb + (unsigned)gj * 16u * (unsigned)es)
                             : "memory");
            if (++pi == ni) pi = 0, pb += gridDim.x, p_open();
        }
        cp_async_commit();
        ps = ps + 1 == D ? 0 : ps + 1;
    };
    p_open();
#pragma unroll
    for (int d = 0; d < D - 1; d++) produce();
    pdl_wait(); /* the activations are the predecessor's */
    const uint16_t *pbx[NTC]; /* this lane's column g of each token tile: its token's part */
    bool bin[NTC];
#pragma unroll
    for (int j = 0; j < NTC; j++) {
        const int n = 8 * j + g;
        const int64_t tok = n / P;
        bin[j] = n / P < BT && tok < T;
        pbx[j] = xs + (int64_t)(n % P) * (T * ldxs) + (bin[j] ? tok : 0) * ldxs + 8 * t;
    }
    uint4 xn[PF ? GS : 1][NTC]; /* the next group's activation fragments (PF) */
    auto load_x = [&](uint4(&o)[PF ? GS : 1][NTC], int u0, int i) {
        const int k0 = (warp + i * MM_SPLITS) * GS;
#pragma unroll
        for (int u = 0; u < (PF ? GS : 1); u++)
#pragma unroll
            for (int j = 0; j < NTC; j++)
                o[u][j] = bin[j] ? *(const uint4 *)(pbx[j] + (k0 + u0 + u) * 32) : make_uint4(0, 0, 0, 0);
    };
    if (!IM && PF && ni > 0) load_x(xn, 0, 0);
    /* IM: this lane's token 8 j + g's limbs (its 8 bytes of each step's 32), the (d, sum x) of
     * its output columns' tokens 8 j + 2 t, + 1; a group ahead where they fit the registers
     * (PFL), else each step's as it is used. Tokens past T read nothing (their limbs are 0). */
    constexpr bool PFL = GS * NTC <= 1;
    const uint8_t *xl = (const uint8_t *)xs;
    const float *xd = (const float *)(xl + QI_TP * nsteps * 96);
    auto limb_at = [&](int64_t k, int j, int l) -> uint2 {
        return 8 * j + g < T ? *(const uint2 *)(xl + ((8 * j + g) * nsteps + k) * 96 + l * 32 + 8 * t) : make_uint2(0, 0);
    };
    auto d_at = [&](int64_t gj, int j) -> float4 {
        return 8 * j + 2 * t < T ? *(const float4 *)(xd + (gj * QI_TP + 8 * j + 2 * t) * 2) : make_float4(0, 0, 0, 0);
    };
    uint2 ln[IM && PFL ? GS : 1][NTC][3];
    float4 dn[NTC];
    auto load_l = [&](int i) {
        const int64_t gj = warp + (int64_t)i * MM_SPLITS;
#pragma unroll
        for (int j = 0; j < NTC; j++) {
#pragma unroll
            for (int u = 0; u < (IM && PFL ? GS : 1); u++)
#pragma unroll
                for (int l = 0; l < 3; l++) ln[u][j][l] = limb_at(gj * GS + u, j, l);
            dn[j] = d_at(gj, j);
        }
    };
    if (IM && PFL && ni > 0) load_l(0);
    const uint32_t one2 = 0x3f803f80u; /* bf16 1.0, 1.0 */
    int cs = 0;
    for (int64_t b = blockIdx.x; b < nblk; b += gridDim.x) {
        const mm_pick pk = mm_select_at(grp, b);
        float acc[MT][NTC][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NTC; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
        for (int i = 0; i < ni; i++) {
            cp_async_wait<D - 2>(); /* this group is in (this lane's copies) */
            __syncwarp();           /* and the other lanes' */
            const unsigned char *sl = ring + cs * SLOT;
            uint4 cur[MT][GS];
            float sb[MT][4]; /* scale of rows g, g + 8, bias (as q_bias makes it) of rows g, g + 8 */
#pragma unroll
            for (int m = 0; m < MT; m++) {
#pragma unroll
                for (int u = 0; u < GS; u++) {
                    if (CB == 16) cur[m][u] = *(const uint4 *)(sl + m * TB + u * 32 * CB + lane * CB);
                    else {
                        const uint2 v = *(const uint2 *)(sl + m * TB + u * 32 * CB + lane * CB);
                        cur[m][u] = make_uint4(v.x, v.y, 0, 0);
                    }
                }
                load_s2(sl + m * TB + VB, 2, 2 * g, sb[m][0], sb[m][1]); /* bf16 (qmvp_fits) */
                load_s2(sl + m * TB + VB + 32, 2, 2 * g, sb[m][2], sb[m][3]);
                if (!IM) { /* IM takes q itself, 4-bit too */
                    sb[m][2] = q_bias<BITS>(sb[m][2], sb[m][0]);
                    sb[m][3] = q_bias<BITS>(sb[m][3], sb[m][1]);
                }
            }
            __syncwarp(); /* every lane has read the slot before it refills */
            cs = cs + 1 == D ? 0 : cs + 1;
            produce(); /* into the slot read the group before */
            if constexpr (IM) {
                uint2 lb[PFL ? GS : 1][NTC][3];
                float4 db[NTC];
                const int64_t gj = warp + (int64_t)i * MM_SPLITS;
                if constexpr (PFL) {
#pragma unroll
                    for (int j = 0; j < NTC; j++) {
                        db[j] = dn[j];
#pragma unroll
                        for (int u = 0; u < GS; u++)
#pragma unroll
                            for (int l = 0; l < 3; l++) lb[u][j][l] = ln[u][j][l];
                    }
                    load_l(i + 1 < ni ? i + 1 : 0);
                } else {
#pragma unroll
                    for (int j = 0; j < NTC; j++) db[j] = d_at(gj, j);
                }
                int32_t ai[MT][NTC][3][4]; /* each limb's exact sums */
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < NTC; j++)
#pragma unroll
                        for (int l = 0; l < 3; l++) ai[m][j][l][0] = ai[m][j][l][1] = ai[m][j][l][2] = ai[m][j][l][3] = 0;
#pragma unroll
                for (int u = 0; u < GS; u++) {
                    if constexpr (!PFL) /* this step's limbs (the compiler hoists what the registers allow) */
#pragma unroll
                        for (int j = 0; j < NTC; j++)
#pragma unroll
                            for (int l = 0; l < 3; l++) lb[0][j][l] = limb_at(gj * GS + u, j, l);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        uint32_t a[4];
                        qi_frag<BITS>(cur[m][u], a);
#pragma unroll
                        for (int j = 0; j < NTC; j++)
#pragma unroll
                            for (int l = 0; l < 3; l++) {
                                const uint2 bl = lb[PFL ? u : 0][j][l];
                                mma_u8s8(ai[m][j][l], a[0], a[1], a[2], a[3], bl.x, bl.y);
                            }
                    }
                }
                /* element e: row g (e < 2) or g + 8, column 8 j + 2 t + (e & 1) */
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < NTC; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float T3 = fmaf(__int2float_rn(ai[m][j][2][e]), 16384.0f,
                                                  fmaf(__int2float_rn(ai[m][j][1][e]), 128.0f, __int2float_rn(ai[m][j][0][e])));
                            const float d = e & 1 ? db[j].z : db[j].x, sx = e & 1 ? db[j].w : db[j].y;
                            acc[m][j][e] = fmaf(sb[m][2 + e / 2], sx, fmaf(T3, sb[m][e / 2] * d, acc[m][j][e]));
                        }
                continue;
            }
            uint4 bx[PF ? GS : 1][NTC];
            if (PF) {
#pragma unroll
                for (int u = 0; u < (PF ? GS : 1); u++)
#pragma unroll
                    for (int j = 0; j < NTC; j++) bx[u][j] = xn[u][j];
                load_x(xn, 0, i + 1 < ni ? i + 1 : 0);
            }
            float ga[MT][NTC][4], xa[NTC][4];
#pragma unroll
            for (int j = 0; j < NTC; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) xa[j][e] = 0.0f;
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int e = 0; e < 4; e++) ga[m][j][e] = 0.0f;
            }
#pragma unroll
            for (int u = 0; u < GS; u++) {
                if (!PF) load_x(bx, u, i);
                const int ub = PF ? u : 0;
#pragma unroll
                for (int j = 0; j < NTC; j++) {
                    mma_bf16(xa[j], one2, one2, one2, one2, bx[ub][j].x, bx[ub][j].y);
                    mma_bf16(xa[j], one2, one2, one2, one2, bx[ub][j].z, bx[ub][j].w);
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    uint32_t a[8];
                    q_frag<BITS>(cur[m][u], a);
#pragma unroll
                    for (int j = 0; j < NTC; j++) {
                        mma_bf16(ga[m][j], a[0], a[1], a[2], a[3], bx[ub][j].x, bx[ub][j].y);
                        mma_bf16(ga[m][j], a[4], a[5], a[6], a[7], bx[ub][j].z, bx[ub][j].w);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NTC; j++) {
                    acc[m][j][0] = fmaf(sb[m][2], xa[j][0], fmaf(sb[m][0], ga[m][j][0], acc[m][j][0]));
                    acc[m][j][1] = fmaf(sb[m][2], xa[j][1], fmaf(sb[m][0], ga[m][j][1], acc[m][j][1]));
                    acc[m][j][2] = fmaf(sb[m][3], xa[j][2], fmaf(sb[m][1], ga[m][j][2], acc[m][j][2]));
                    acc[m][j][3] = fmaf(sb[m][3], xa[j][3], fmaf(sb[m][1], ga[m][j][3], acc[m][j][3]));
                }
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NTC; j++) {
                float *o = red[warp] + (m * NTC + j) * 128;
                o[g * 8 + 2 * t] = acc[m][j][0];
                o[g * 8 + 2 * t + 1] = acc[m][j][1];
                o[(g + 8) * 8 + 2 * t] = acc[m][j][2];
                o[(g + 8) * 8 + 2 * t + 1] = acc[m][j][3];
            }
        __syncthreads();
        for (int q = threadIdx.x; q < MT * BT * 16; q += blockDim.x) {
            const int m = q / (BT * 16), tl = (q / 16) % BT, row = q % 16;
            const int64_t r = (pk.blk * MT + m) * 16 + row, tok = tl;
            if (r >= pk.w.rows || tok >= T) continue;
            float sum = 0.0f;
            for (int w = 0; w < MM_SPLITS; w++)
#pragma unroll
                for (int p = 0; p < P; p++) {
                    const int n = tl * P + p;
                    sum += red[w][(m * NTC + n / 8) * 128 + row * 8 + n % 8];
                }
            pk.y[tok * pk.ldy + r] = sum;
        }
        __syncthreads(); /* red is read before the next tiles' sums go in */
    }
    cp_async_wait<0>();
}

template <int P, int NTC, int BITS>
static void launch_qmv_b(cu_stream s, const mm_group &g, int64_t nblk, const uint16_t *xs, int64_t ldxs, int64_t n) {
    /* a row tile's token tiles are consecutive blocks, so that they run at about the same time
     * and read its values once from memory, the others from L2 (token tiles outermost, each
     * read every matrix of the launch again: 27B MLX 8-bit at 64 sequences 746 tok/s against
     * 915 at 16, 2026-12-05) */
    const dim3 grid((unsigned)(nblk * ((n + 8 * NTC / P - 1) / (8 * NTC / P))));
    const dim3 blk(32 * MM_SPLITS);
    /* two groups in flight a warp (more spill registers) */
    switch (g.w[0].group / 32) {
    case 1: launch_pdl(k_qmv<P, NTC, BITS, 1, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    case 2: launch_pdl(k_qmv<P, NTC, BITS, 2, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    default: launch_pdl(k_qmv<P, NTC, BITS, 4, MM_SPLITS, 2>, grid, blk, 0, s, g, xs, ldxs, n); break;
    }
}

/* k_qmvp: ring depth and residency by group width (the steps in flight a warp about 8) */
/* blocks an SM: 3 (2 where 3 token tiles or more want the registers) */
template <int NTC>
static constexpr int qmvp_minb() { return NTC <= 2 ? 3 : 2; }
template <int P, int NTC, int BITS, int GS, int MT, int MINB = qmvp_minb<NTC>()>
static constexpr int qmvp_depth() {
    /* about 5 KB of values in flight a warp (3 slots at least; measured with mmv_bench qv), as
     * deep as MINB blocks an SM allow */
    constexpr int per = GS * 32 * 2 * BITS * MT, ahead = (5120 + per - 1) / per;
    constexpr int want = ahead + 1 < 3 ? 3 : ahead + 1;
    constexpr int fit = (int)((227 * 1024 / MINB - 1024 - MM_SPLITS * MT * NTC * 128 * 4) /
                              (MM_SPLITS * MT * qmvp_tile<BITS, GS>()));
    return want < fit ? want : fit;
}
/* one token tile: the third shape, two blocks an SM of twice the tiles (4-bit) or deeper
 * rings (8-bit), for matrices whose tiles leave the two-tile blocks' slots unevenly used */
template <int NTC, int BITS, int GS>
__host__ __device__ constexpr int qmvp_mt_deep() {
    /* (4-bit groups of 128: four tiles' ring would be under 3 slots deep) */
    return NTC == 1 && qmvp_mt<NTC, BITS, GS>() == 2 ? (BITS == 8 ? 2 : GS <= 2 ? 4 : 0) : 0;
}
template <int P, int NTC, int BITS, int GS, int D, int MINB, int MT, bool IM = false>
static void qmvp_attr_v() {
    static_assert(D >= 3 && (qmvp_smem<NTC, BITS, GS, D, MT>() + 1024) * MINB <= 227 * 1024, "the blocks fit an SM");
    cudaFuncSetAttribute(k_qmvp<P, NTC, BITS, GS, D, MINB, MT, IM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)qmvp_smem<NTC, BITS, GS, D, MT>());
}
template <int P, int NTC, int BITS, int GS, bool IM = false>
static void qmvp_attr() {
    constexpr int MT = qmvp_mt<NTC, BITS, GS>();
    qmvp_attr_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, MT>(), qmvp_minb<NTC>(), MT, IM>();
    if (MT == 2) qmvp_attr_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, 1>(), qmvp_minb<NTC>(), 1, IM>();
    constexpr int MD = qmvp_mt_deep<NTC, BITS, GS>();
    if (MD) qmvp_attr_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, MD ? MD : 1, 2>(), 2, MD ? MD : 1, IM>();
}
template <int P, int NTC, int BITS, bool IM = false>
static void qmvp_attr_b() {
    qmvp_attr<P, NTC, BITS, 1, IM>();
    qmvp_attr<P, NTC, BITS, 2, IM>();
    qmvp_attr<P, NTC, BITS, 4, IM>();
}
void qmvp_init(void) {
    qmvp_attr_b<1, 1, 8>(), qmvp_attr_b<1, 2, 8>(), qmvp_attr_b<3, 1, 8>(), qmvp_attr_b<3, 3, 8>(), qmvp_attr_b<3, 6, 8>();
    qmvp_attr_b<1, 1, 4>(), qmvp_attr_b<1, 2, 4>(), qmvp_attr_b<3, 1, 4>(), qmvp_attr_b<3, 3, 4>(), qmvp_attr_b<3, 6, 4>();
    qmvp_attr_b<1, 1, 8, true>(), qmvp_attr_b<1, 2, 8, true>(), qmvp_attr_b<1, 1, 4, true>(), qmvp_attr_b<1, 2, 4, true>();
}

/* a k_qmvp of ring depth D, MINB blocks an SM and MT tiles a block (mmv_bench compares them) */
template <int P, int NTC, int BITS, int GS, int D, int MINB, int MT, bool IM = false>
static void launch_qmvp_v(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t n) {
    const int64_t nblk = group_blocks(&g, MT);
    launch_pdl(k_qmvp<P, NTC, BITS, GS, D, MINB, MT, IM>, dim3(mmvp_grid(nblk, MINB)), dim3(32 * MM_SPLITS),
               qmvp_smem<NTC, BITS, GS, D, MT>(), s, g, nblk, xs, ldxs, n);
}
/* the share of the resident blocks' turns that the blocks of MT tiles fill (the last round of
 * a grid of B an SM may leave slots idle) */
static double qmvp_fill(const mm_group &g, int MT, int B) {
    mm_group gm = g;
    const int64_t units = group_blocks(&gm, MT), slots = (int64_t)B * mm_sms(), rounds = (units + slots - 1) / slots;
    return rounds > 0 ? (double)units / (double)(rounds * slots) : 0.0;
}
/* Two tiles a block, three blocks an SM, but where the tiles are fewer than two for each
 * resident block (the long rows of the down projection and out_proj: 320 tiles on 132 SMs):
 * one, which keeps every block busy; and for one token tile, where the last round of
 * two-tile blocks would leave more of the resident blocks idle than the other shape's:
 * blocks of four tiles (4-bit) or of two with a deeper ring (8-bit), two an SM (the 896 to
 * 1,024 tiles of the attention and GDN in-projections). mmv_bench qv at one token, groups
 * of 64, GB/s: 4-bit down projection 1,936 (one tile) against 1,828 (two), GDN
 * in-projections 2,899 (four) against 1,948 (two), attention q/k/v 2,665 against 1,688,
 * gate/up 2,740 (two) against 2,556 (four); 8-bit GDN in-projections 3,543 against 2,520,
 * attention 3,248 against 2,221, gate/up 3,454 (three an SM) against 3,360. No shape
 * changes a bit. */
template <int P, int NTC, int BITS, int GS, bool IM = false>
static void launch_qmvp_g(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t n) {
    constexpr int MT = qmvp_mt<NTC, BITS, GS>(), B = qmvp_minb<NTC>(), MD = qmvp_mt_deep<NTC, BITS, GS>();
    if (MT == 2) {
        mm_group g1 = g;
        if (group_blocks(&g1, 1) < (int64_t)2 * B * mm_sms()) {
            launch_qmvp_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, 1>(), B, 1, IM>(s, g, xs, ldxs, n);
            return;
        }
        if (MD && qmvp_fill(g, MD, 2) > qmvp_fill(g, 2, B)) {
            constexpr int M = MD ? MD : 1;
            launch_qmvp_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, M, 2>(), 2, M, IM>(s, g, xs, ldxs, n);
            return;
        }
    }
    launch_qmvp_v<P, NTC, BITS, GS, qmvp_depth<P, NTC, BITS, GS, MT>(), B, MT, IM>(s, g, xs, ldxs, n);
}

/* whether k_qmvp takes the group: bf16 scales and biases (MLX's own; k_qmv takes the others,
 * with the same bits), and 16-byte aligned values, scales and biases for its cp.async copies */
static bool qmvp_fits(const mm_group &g, int64_t n, int P, int NTC) {
    if (n > 8 * NTC / P) return false;
    for (int i = 0; i < g.n; i++)
        if (g.w[i].sdtype != 2 || (((uintptr_t)g.w[i].data | (uintptr_t)g.w[i].scales | (uintptr_t)g.w[i].biases) & 15)) return false;
    return true;
}

template <int P, int NTC>
static void launch_qmv_p(cu_stream s, mm_group g, const uint16_t *xs, int64_t ldxs, int64_t n) {
    if (qmvp_fits(g, n, P, NTC)) {
        const int bits = g.w[0].bits, gs = g.w[0].group / 32;
        if (bits == 8) {
            if (gs == 1) launch_qmvp_g<P, NTC, 8, 1>(s, g, xs, ldxs, n);
            else if (gs == 2) launch_qmvp_g<P, NTC, 8, 2>(s, g, xs, ldxs, n);
            else launch_qmvp_g<P, NTC, 8, 4>(s, g, xs, ldxs, n);
        } else {
            if (gs == 1) launch_qmvp_g<P, NTC, 4, 1>(s, g, xs, ldxs, n);
            else if (gs == 2) launch_qmvp_g<P, NTC, 4, 2>(s, g, xs, ldxs, n);
            else launch_qmvp_g<P, NTC, 4, 4>(s, g, xs, ldxs, n);
        }
        return;
    }
    const int64_t nblk = group_blocks(&g, 1);
    if (g.w[0].bits == 8) launch_qmv_b<P, NTC, 8>(s, g, nblk, xs, ldxs, n);
    else launch_qmv_b<P, NTC, 4>(s, g, nblk, xs, ldxs, n);
}

/* the IM form, QI_TP tokens a launch: k_qlimbs into sc->xq, then k_qmvp<IM>. In `exact` (3
 * parts) it takes every launch, so that a token's bits never depend on how many share it; in
 * `bf16` only those of up to QI_TP tokens (each launch reads every weight, where k_qmv's token
 * tiles of a many-token launch share theirs in L2). False (nothing launched) where it does not
 * take the launch, the scratch has no xq, or k_qmvp does not take the group (scales not bf16,
 * misaligned). */
template <int NTC, int BITS>
static void launch_qint_b(cu_stream s, const mm_group &g, const uint8_t *xq, int64_t n) {
    const int gs = g.w[0].group / 32;
    const uint16_t *xs = (const uint16_t *)xq;
    if (gs == 1) launch_qmvp_g<1, NTC, BITS, 1, true>(s, g, xs, 0, n);
    else if (gs == 2) launch_qmvp_g<1, NTC, BITS, 2, true>(s, g, xs, 0, n);
    else launch_qmvp_g<1, NTC, BITS, 4, true>(s, g, xs, 0, n);
}
static bool launch_qint(cu_stream s, const mm_group &g, const float *x, int64_t ldx, int64_t T, int parts,
                        const cu_mm_scratch *sc, int xq_ready) {
    if (!sc->xq || (parts == 1 && T > QI_TP) || !qmvp_fits(g, QI_TP, 1, 2)) return false;
    const int64_t cols = g.w[0].cols, warps = QI_TP * (cols / g.w[0].group);
    for (int64_t t0 = 0; t0 < T; t0 += QI_TP) {
        const int64_t n = T - t0 < QI_TP ? T - t0 : QI_TP;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        if (!(xq_ready && T <= QI_TP)) /* else the norm or SwiGLU made them */
            launch_pdl(k_qlimbs, dim3((unsigned)((warps + 7) / 8)), dim3(256), 0, s, x + t0 * ldx, ldx, n, cols,
                       g.w[0].group, g.w[0].bits, sc->xq);
        if (g.w[0].bits == 8) {
            if (n <= 8) launch_qint_b<1, 8>(s, gs, sc->xq, n);
            else launch_qint_b<2, 8>(s, gs, sc->xq, n);
        } else {
            if (n <= 8) launch_qint_b<1, 4>(s, gs, sc->xq, n);
            else launch_qint_b<2, 4>(s, gs, sc->xq, n);
        }
    }
    return true;
}

/* MLX tiled matrices (one width, bits and group): `bf16` products of many tokens on cuBLASLt
 * (the values dequantized to bf16 first: launch_blas); those of CU_QS_MIN_T8 (8-bit) or
 * CU_QS_MIN_T4 (4-bit) to 127 tokens on resident wgmma blocks where the device has them
 * (cu_wgmma_qstream: CU_MM_XS_LOST, its permuted split left in xs); on integer tensor cores
 * where the scratch has xq (launch_qint; xq_ready: xq holds x's limbs, T <= QI_TP); else
 * qtiled_own.
 * CU_MM_XS: it left sc->xs holding x's split; CU_MM_XQ: sc->xq holding x's limbs (T <= QI_TP) */
int launch_qtiled(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts,
                  const cu_mm_scratch *sc, int xs_ready, int xq_ready) {
    if (parts == 1 && launch_blas(s, g, x, ldx, T, 1, sc) == 0) return 0;
    if (CU_QS && parts == 1 && T >= (g.w[0].bits == 8 ? CU_QS_MIN_T8 : CU_QS_MIN_T4) && T < CU_WGMMA_MIN_T && sc &&
        sc->tma_encode) {
        const cu_mat *w[4];
        for (int i = 0; i < g.n; i++) w[i] = &g.w[i];
        if (cu_wgmma_qstream(s, sc, g.n, w, g.y, g.ldy, x, ldx, T) == 0) return CU_MM_XS_LOST; /* (xs: permuted) */
    }
    if (launch_qint(s, g, x, ldx, T, parts, sc, xq_ready)) return T <= QI_TP ? CU_MM_XQ : 0;
    qtiled_own(s, g, x, ldx, T, parts, sc, xs_ready);
    return T <= 16 ? CU_MM_XS : 0;
}

/* split (unless xs holds x already), then k_qmvp or k_qmv, in slices of the scratch's tokens */
void qtiled_own(cu_stream s, mm_group g, const float *x, int64_t ldx, int64_t T, int parts, const cu_mm_scratch *sc,
                int xs_ready) {
    const int64_t cols = g.w[0].cols, ldxs = tiled_steps(cols) * 32, slice = T <= 16 ? T : sc->xs_tokens;
    for (int64_t t0 = 0; t0 < T; t0 += slice) {
        const int64_t n = T - t0 < slice ? T - t0 : slice;
        mm_group gs = g;
        for (int i = 0; i < g.n; i++) gs.y[i] = g.y[i] + t0 * g.ldy[i];
        if (!(xs_ready && T <= 16)) launch_split(s, x + t0 * ldx, ldx, n, cols, sc->xs, ldxs, parts);
        if (parts == 1) {
            if (n <= 8) launch_qmv_p<1, 1>(s, gs, sc->xs, ldxs, n);
            else launch_qmv_p<1, 2>(s, gs, sc->xs, ldxs, n);
        } else {
            if (n <= 2) launch_qmv_p<3, 1>(s, gs, sc->xs, ldxs, n);
            else if (n <= 8) launch_qmv_p<3, 3>(s, gs, sc->xs, ldxs, n);
            else launch_qmv_p<3, 6>(s, gs, sc->xs, ldxs, n);
        }
    }
}

extern "C" int cu_q_tileable(int bits, int group, int64_t cols) {
    return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128) && cols % group == 0;
}
