/* ==== CUDA kernels: the device helpers of every family (see cuda_kernels.h) ====
 *
 * The kernels are one file per operation family: elementwise.cu (embedding, norms,
 * elementwise), matmul.cu (CUDA-core products and the dispatch), matmul_bf16.cu (bf16 on
 * tensor cores), matmul_q.cu (MLX 4- and 8-bit on tensor cores; mm_int.cuh: what the three
 * products share), gdn.cu (Gated DeltaNet), attention.cu. Each includes this header.
 *
 * Every reduction has a fixed order given by the output's own indices: a matrix row's dot
 * product is summed by lane (columns lane, lane+32, ...) then over the warp by a fixed
 * butterfly; norms by a fixed block tree; the delta rule by state row, sequentially over
 * the key dimension; attention by query, over positions in order. No kernel's result for a
 * token depends on the other tokens of the launch.
 */
#ifndef ST_BACKEND_CUDA_CU_COMMON_CUH
#define ST_BACKEND_CUDA_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <assert.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

#define FULL 0xffffffffu

__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float f16f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
/* round to nearest even; NaN stays NaN (core/numeric.h st_f32_to_bf16) */
__device__ __forceinline__ uint16_t f2bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float load_s(const void *p, int dt, int64_t i) {
    if (dt == 2) return bf16f(((const uint16_t *)p)[i]);
    if (dt == 1) return f16f(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* element c of row r, for the matrix format FMT */
template <int FMT>
__device__ __forceinline__ float w_at(const cu_mat &w, int64_t r, int64_t c) {
    if (FMT == 0) return ((const float *)w.data)[r * w.cols + c];
    if (FMT == 1) return f16f(((const uint16_t *)w.data)[r * w.cols + c]);
    if (FMT == 2) return bf16f(((const uint16_t *)w.data)[r * w.cols + c]);
    const uint32_t *row = (const uint32_t *)w.data + r * (w.cols * w.bits / 32);
    const uint64_t p = (uint64_t)c * (uint64_t)w.bits;
    const uint32_t wi = (uint32_t)(p >> 5), off = (uint32_t)(p & 31);
    uint64_t v = row[wi];
    if (off + w.bits > 32) v |= (uint64_t)row[wi + 1] << 32;
    const uint32_t q = (uint32_t)(v >> off) & ((1u << w.bits) - 1u);
    const int64_t g = r * (w.cols / w.group) + c / w.group;
    return fmaf(load_s(w.scales, w.sdtype, g), (float)q, load_s(w.biases, w.sdtype, g));
}

/* v as its P bf16 parts into xs[p][t][c] (the split activations of the tiled products; pstride
 * elements a part) */
__device__ __forceinline__ void put_parts(uint16_t *xs, int parts, int64_t pstride, int64_t at, float v) {
    for (int p = 0; p < parts; p++) {
        const uint16_t h = f2bf16(v);
        xs[p * pstride + at] = h;
        v -= bf16f(h);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

/* The scale of a q row (also by 1 / sqrt(Dk)) or a k row of Dk by its L2 norm, as every kernel
 * makes it: a warp's lanes sum the squares of columns lane, lane + 32, ... in order, then a
 * butterfly (k_gdn_qknorm's order, which k_gdn_dec and k_gdn_cprep repeat: the same bits) */
__device__ __forceinline__ float gdn_l2_scale(const float *v, int Dk, bool is_q) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int j = lane; j < Dk; j += 32) ss = fmaf(v[j], v[j], ss);
    ss = warp_sum(ss);
    return (is_q ? 1.0f / sqrtf((float)Dk) : 1.0f) / sqrtf(ss + 1e-6f);
}

/* sum over a block of blockDim.x (a multiple of 32, at most 1024) threads, in a fixed
 * order; every thread gets it. red: [32] shared floats. */
static inline __device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

static inline __device__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < nw; i++) m = fmaxf(m, red[i]);
    return m;
}

/* The activations as limbs for the IM form of the MLX products (matmul_q.cu's top comment):
 * xq holds limbs [QI_TP][steps][3][32] bytes, then (d_g, d_g sum_g X) floats
 * [groups][QI_TP][2]. Whatever makes them (k_qlimbs, or the norm, SwiGLU or the delta rule's
 * fused decode kernel that produces the activations) gives the same bytes: each value's X is its own, and the group's d (from its
 * largest |x|) and integer sum of X do not depend on how lanes hold the group. */
#define QI_XMAX 2088895 /* 127 * 2^14 + 63 * 2^7 + 63 */
#define QI_TP 16        /* tokens a launch */
/* the byte of column c within its step's 32 (4-bit: the order of the nibbles' unpacking) */
__device__ __forceinline__ int qi_byte(int64_t c, int bits) {
    const int b = (int)(c % 32);
    return bits == 4 ? (b & ~7) + 2 * (b % 4) + (b % 8) / 4 : b;
}
/* token tok's group gj, held by `width` aligned lanes (mask: theirs; a power of two up to 32):
 * this lane's N values v[i] of columns c0 + i * cstride; the group's first lane writes its
 * (d, d sum X) */
template <int N>
__device__ __forceinline__ void qi_put(uint8_t *xq, int64_t nsteps, int64_t tok, int64_t gj, const float (&v)[N],
                                       int64_t c0, int cstride, int bits, unsigned mask, int width) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(v[i]));
    for (int o = width / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
    const float d = __fdiv_rn(amax, (float)QI_XMAX);
    int32_t sx = 0;
#pragma unroll
    for (int i = 0; i < N; i++) {
        int32_t X = 0;
        if (d > 0.0f) {
            float q = rintf(__fdiv_rn(v[i], d));
            q = fminf(fmaxf(q, -(float)QI_XMAX), (float)QI_XMAX);
            X = (int32_t)q;
        }
        sx += X;
        const int32_t a0 = ((X + 64) & 127) - 64, x1 = (X - a0) / 128;
        const int32_t a1 = ((x1 + 64) & 127) - 64, a2 = (x1 - a1) / 128;
        const int64_t c = c0 + (int64_t)i * cstride;
        uint8_t *o = xq + (tok * nsteps + c / 32) * 96 + qi_byte(c, bits);
        o[0] = (uint8_t)(int8_t)a0, o[32] = (uint8_t)(int8_t)a1, o[64] = (uint8_t)(int8_t)a2;
    }
    for (int o = width / 2; o > 0; o >>= 1) sx += __shfl_xor_sync(mask, sx, o); /* exact: any order */
    if ((threadIdx.x & (unsigned)(width - 1)) == 0) {
        float *dx = (float *)(xq + QI_TP * nsteps * 96) + (gj * QI_TP + tok) * 2;
        dx[0] = d, dx[1] = d * (float)sx;
    }
}
/* a warp's group, lane l holding columns c0 + 32 i, i < per (the group / 32): qi_put of its
 * per values v[i] */
__device__ __forceinline__ void qi_put_warp(uint8_t *xq, int64_t nsteps, int64_t tok, int64_t gj, const float (&v)[4],
                                            int per, int64_t c0, int bits) {
    if (per == 1) {
        const float w1[1] = {v[0]};
        qi_put(xq, nsteps, tok, gj, w1, c0, 32, bits, FULL, 32);
    } else if (per == 2) {
        const float w2[2] = {v[0], v[1]};
        qi_put(xq, nsteps, tok, gj, w2, c0, 32, bits, FULL, 32);
    } else {
        qi_put(xq, nsteps, tok, gj, v, c0, 32, bits, FULL, 32);
    }
}

/* Programmatic dependent launch: the decode path's kernels are launched with
 * programmaticStreamSerialization (launch_pdl), so that a kernel's blocks start while its
 * predecessor's last ones finish; each such kernel calls pdl_wait() before it touches
 * anything another kernel writes or reads, and before any early return (the product kernels
 * first put their first weight loads in flight: the weights never change). 0: plain launches. */
#define CU_PDL 1
__device__ __forceinline__ void pdl_wait() {
#if CU_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
    /* and let the successor's blocks start as this kernel's leave: they put their weight loads
     * in flight in this kernel's tail, then wait (griddepcontrol.wait: until this grid is done
     * and its writes are visible, so a successor waiting is a successor of every grid before) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* the current device's SMs (1 where it cannot say; matmul_bf16.cu) */
__attribute__((visibility("hidden"))) int mm_sms(void);

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarriers (sm_90): a ring's stages filled by bulk copies (matmul_wgmma.cu, gdn.cu) ----
 * bar: a shared-memory address (smem_u32) */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* until the phase of this parity has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@p bra.uni DONE;\n"
                 "bra.uni WAIT;\n"
                 "DONE:\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* bytes (a multiple of 16; both addresses 16-byte aligned) from global src into shared dst,
 * counted on bar's transaction count */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <typename... KP, typename... A>
static void launch_pdl(void (*k)(KP...), dim3 grid, dim3 block, size_t shm, cu_stream s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = CU_PDL ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, args...);
}

/* ---- tensor cores, asynchronous copies and the tiled layout (matmul_bf16.cu's top comment
 * describes the layout and the MMA fragments) ---- */

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tf32_of(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* d += a b for a 16 x 8 tile over 8 of k: a (row-major, lane l: rows l/4 and l/4 + 8, columns
 * l%4 and l%4 + 4), b (columns l/4, rows l%4 and l%4 + 4), d (rows l/4 and l/4 + 8, columns
 * 2 (l%4) and 2 (l%4) + 1) */
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a streamed weight load: read once, kept out of L1 */
__device__ __forceinline__ uint4 ldg_stream(const uint16_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* ldmatrix: four 8 x 8 bf16 matrices from shared memory, lanes 8 i .. 8 i + 7 giving the 16-byte
 * rows of matrix i (r[i]); _t transposed (a lane gets its elements of a column pair instead of a
 * row pair: a B fragment from a [k][n] matrix, an A fragment from an [k][m] one) */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* cp.async: 16 bytes (bytes < 16: the rest zeros) global -> shared, in groups; _at from a
 * shared-memory address (__cvta_generic_to_shared's), without bytes all 16 */
__device__ __forceinline__ void cp_async16_at(uint32_t saddr, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async16_at(uint32_t saddr, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int bytes) {
    cp_async16_at((uint32_t)__cvta_generic_to_shared(smem), gmem, bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }
/* lo and hi rounded to bf16 (to nearest, ties to even: f2bf16's values, one instruction for
 * the pair; a NaN comes out as the canonical one) */
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); /* first source: the high half */
    return r;
}
__device__ __forceinline__ uint16_t bf16_rn(float f) {
    uint16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

/* the tiled layout */
__host__ __device__ __forceinline__ int64_t tiled_steps(int64_t cols) { return (cols + 31) / 32; }
__host__ __device__ __forceinline__ int64_t tiled_tiles(int64_t rows) { return (rows + 15) / 16; }
__device__ __forceinline__ int64_t tiled_at(int64_t cols, int64_t r, int64_t c) {
    const int64_t m = r / 16, k = c / 32, rr = r % 16, cc = c % 32;
    return ((m * tiled_steps(cols) + k) * 64 + (rr / 8) * 32 + (rr % 8) * 4 + cc / 8) * 8 + cc % 8;
}

#endif /* ST_BACKEND_CUDA_CU_COMMON_CUH */
