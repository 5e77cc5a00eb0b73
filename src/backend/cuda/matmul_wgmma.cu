/* ==== bf16 matrices times many tokens on Hopper's warpgroup MMA (wgmma), `bf16` mode ====
 *
 * y[t*ldy + r] = sum_c W[r][c] xs[t][c]: W a tiled bf16 matrix (CU_FMT_BF16_TILED, see
 * matmul_bf16.cu), xs the activations rounded to bf16 ([T][ldxs], the split's one part).
 * Built for sm_90a alone (wgmma, setmaxnreg); cu_wgmma_available says whether the device runs
 * it. Only the `bf16` precision takes it: its summation order is the tensor cores' own over
 * 16 columns at a time, in column order, not the 8 summation classes of k_mmv / k_gemm, so it
 * gives other bits than the few-token kernels (`exact` keeps those everywhere).
 *
 * A block: 128 weight rows by 256 tokens, three warpgroups. The first is the producer: one
 * thread moves each stage's operands into shared memory with the tensor memory accelerator
 * (TMA), two 32-column steps a stage, in WG_STAGES stages, each completing on its own
 * mbarrier ("full"); the other two are consumers, each 64 rows by 256 tokens of fp32
 * accumulators in registers (wgmma m64n256k16, both operands from shared memory), which
 * free a stage by arriving on its "empty" barrier.
 *
 * The tiled layout is what TMA reads directly: a 16-row tile's 32-column step is 16 rows of
 * 64 contiguous bytes (lanes 4g + t of the few-token kernels load row g's 16-byte piece t),
 * so the matrix is a 4-D tensor {32 columns, 16 rows, steps, tiles} of strides {2, 64, 1024,
 * steps * 1024} bytes, and a box of {32, 16, 1, 8} is 128 rows of one step, 64 bytes a row,
 * as wgmma's K-major layout with the 64-byte swizzle wants it (TMA swizzles as it writes).
 * The activations are a 2-D tensor {ldxs, T}; a box of {32, 256} is 256 tokens of one step.
 * Rows past the matrix and tokens past T are read as zeros (TMA's out-of-bounds fill) and
 * never written back. Matrices of an odd number of steps (columns not a multiple of 64 once
 * padded to 32) are refused: cu_wgmma_matmul returns -1 and the caller takes k_gemm.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/mm_int.cuh"
#include "backend/cuda/wgmma.cuh"

#define WG_BM 128                            /* weight rows a block (2 consumers of 64) */
#define WG_BN 256                            /* tokens a block */
#define WG_STAGES 4                          /* stages of 2 steps in flight */
#define WG_A_STEP (WG_BM * 64)               /* bytes of one step of the weights: 128 rows of 64 */
#define WG_B_STEP (WG_BN * 64)               /* one step of the activations: 256 tokens of 64 */
#define WG_STAGE (2 * WG_A_STEP + 2 * WG_B_STEP)
#define WG_SMEM (WG_STAGES * WG_STAGE + 1024 + 2 * WG_STAGES * 8) /* + alignment, barriers */
#define WG_THREADS 384

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                 "%5}], [%6];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* d += A (64 rows x 16 columns) B^T (256 tokens x 16 columns) */
__device__ __forceinline__ void wgmma_256(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1));
}

/* clusters: this block's rank, a barrier of every thread of the cluster, an arrival on the
 * barrier at the same place in block cta's shared memory, and a 2-D TMA load written into the
 * shared memory of every block of `mask` (at dst's place in each), completing on each one's
 * barrier at bar's place */
__device__ __forceinline__ uint32_t wg_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void wg_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_at(uint32_t bar, uint32_t cta) {
    asm volatile("{\n"
                 ".reg .b32 ra;\n"
                 "mapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n"
                 "}\n" ::"r"(bar),
                 "r"(cta)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar,
                                               uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
                 "[%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}

/* tma_load_4d, written into the shared memory of every block of `mask` (as tma_load_2d_mc) */
__device__ __forceinline__ void tma_load_4d_mc(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                               uint32_t bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
                 "[%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask)
                 : "memory");
}

/* The grid is one-dimensional, CL consecutive blocks a cluster; the clusters' places cover
 * a grid of cols (token tiles / the cluster's along them) by crows (row blocks / the
 * cluster's along them), cluster c of G in the launch taking places c, c + G, ... (G the
 * places: one each; fewer: persistent clusters). Place c in it: group 0, token tiles
 * fastest (the blocks running at once share a few row blocks' weights, read from memory
 * once); group g > 0, in bands of g
 * cluster rows, each band's clusters row fastest, so that the blocks running at once cover a
 * squarer patch of the output (fewer bytes of both operands read from memory a wave). */
struct wg_raster {
    int cols, crows, group;
    int n; /* the clusters' places: cols x crows */
};
__device__ __forceinline__ void wg_place(const wg_raster &r, int c, int *ct, int *cr) {
    if (r.group <= 0) {
        *ct = c % r.cols, *cr = c / r.cols;
        return;
    }
    const int band = c / (r.group * r.cols), in = c % (r.group * r.cols), first = band * r.group;
    const int h = min(r.group, r.crows - first); /* the last band may be thinner */
    *cr = first + in % h, *ct = in / h;
}

/* CL: the blocks of a cluster: 1; 2, along the row blocks (the pair of row blocks 2 p and
 * 2 p + 1 of one token tile, each block's producer loading one of a stage's two activation
 * steps into both blocks' shared memory by TMA multicast, so the cluster reads the token
 * tile's activations from L2 once where two blocks read them twice); or 4, two row blocks by
 * two token tiles (rank = token tile within the pair + 2 x row block within the pair): each
 * block loads one of a stage's two weight steps into itself and the block of the same row
 * block, and one of its two activation steps into itself and the block of the same token
 * tile, so each operand is read from L2 once for two blocks (a quarter less than CL 2). A
 * stage is refilled once every block's consumers have freed it, and no block leaves before
 * the others. XW: the activations come as two halves of the token tile, 128 tokens of a
 * stage's 64 columns each (rows of 128 bytes under the 128-byte swizzle: half the TMA rows
 * of two 64-byte steps), where the clusters share them by halves (the same bytes each). YBF:
 * the outputs rounded to bf16. */
template <int CL, bool YBF, bool XW>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_wgmma(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, int64_t rows,
            int64_t T, int nsteps, void *y, int64_t ldy, wg_raster ras) {
    static_assert(CL == 1 || CL == 2 || CL == 4, "clusters of 1, 2 or 4 blocks");
    extern __shared__ uint8_t wg_raw[];
    const uint32_t base = (smem_u32(wg_raw) + 1023u) & ~1023u; /* the swizzles repeat every 512 / 1,024 bytes */
    const uint32_t full = base + WG_STAGES * WG_STAGE, empty = full + WG_STAGES * 8;
    const int tid = threadIdx.x, wg = tid / 128;
    const int q = CL > 1 ? (int)wg_cluster_rank() : 0; /* blockIdx.x % CL */
    const int c0 = (int)(blockIdx.x / CL), cstep = (int)(gridDim.x / CL); /* this cluster's places */
    /* place c's token tile and row block for this block: CL 2, row blocks 2 cr + q of token
     * tile ct; CL 4, token tiles 2 ct + q % 2 by row blocks 2 cr + q / 2 */
    auto tile_of = [&](int c, int *tb, int *rb) {
        int ct, cr;
        wg_place(ras, c, &ct, &cr);
        *tb = CL == 4 ? 2 * ct + (q & 1) : ct, *rb = CL == 4 ? 2 * cr + (q >> 1) : CL * cr + q;
    };
    const int nk = nsteps / 2; /* stages a place: two steps each (nsteps is even) */
    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8 * CL); /* a consumer warp's lane 0 each, of each block of the cluster */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL > 1) wg_cluster_sync(); /* the other block's barriers are ready before anything reaches them */
    else __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            /* it: the stages this block has loaded, every place's (the ring runs on across
             * places, so the next place's first stages load while the consumers write out) */
            int it = 0;
            for (int pc = c0; pc < ras.n; pc += cstep) {
                int tb, rb;
                tile_of(pc, &tb, &rb);
                for (int i = 0; i < nk; i++, it++) {
                    const int s = it % WG_STAGES;
                    mbar_wait(empty + 8 * s, ((it / WG_STAGES) & 1) ^ 1);
                    mbar_expect_tx(full + 8 * s, WG_STAGE); /* (CL > 1: some of it from the other blocks) */
                    const uint32_t st = base + s * WG_STAGE;
                    /* the activations' part h of a stage (XW: half h of the token tile's 64 columns;
                     * else step h's 32 columns of all of it) starts at column xc0 + h xdc, token
                     * tb WG_BN + h xdt */
                    const int xc0 = 64 * i, xdc = XW ? 0 : 32, xdt = XW ? WG_BN / 2 : 0;
                    if constexpr (CL == 4) { /* weight step q % 2 to this row block's pair, activation part q / 2 to this token tile's */
                        const int qt = q & 1, qr = q >> 1;
                        tma_load_4d_mc(st + qt * WG_A_STEP, &wmap, 0, 0, 2 * i + qt, rb * (WG_BM / 16), full + 8 * s,
                                       (uint16_t)(3u << (2 * qr)));
                        tma_load_2d_mc(st + 2 * WG_A_STEP + qr * WG_B_STEP, &xmap, xc0 + qr * xdc, tb * WG_BN + qr * xdt,
                                       full + 8 * s, (uint16_t)(5u << qt));
                    } else {
                        for (int h = 0; h < 2; h++)
                            tma_load_4d(st + h * WG_A_STEP, &wmap, 0, 0, 2 * i + h, rb * (WG_BM / 16), full + 8 * s);
                        if constexpr (CL > 1)
                            tma_load_2d_mc(st + 2 * WG_A_STEP + q * WG_B_STEP, &xmap, xc0 + q * xdc, tb * WG_BN + q * xdt,
                                           full + 8 * s, (uint16_t)((1u << CL) - 1));
                        else
                            for (int h = 0; h < 2; h++)
                                tma_load_2d(st + 2 * WG_A_STEP + h * WG_B_STEP, &xmap, xc0 + h * xdc, tb * WG_BN + h * xdt,
                                            full + 8 * s);
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int c = wg - 1, warp = (tid / 32) % 4, lane = tid % 32;
        float d[128];
        int it = 0; /* the stages this block has used, every place's */
        for (int pc = c0; pc < ras.n; pc += cstep) {
            int tb, rb;
            tile_of(pc, &tb, &rb);
#pragma unroll
            for (int i = 0; i < 128; i++) d[i] = 0.0f;
            /* one stage's MMAs stay in flight while the next stage's are issued: a stage is freed
             * once the group after it has been committed and its own has completed (the tensor
             * cores never wait for the barrier round trip; the order of the sums is unchanged);
             * the place's last stage once its MMAs are done, before the outputs are written */
            /* stage s freed in this block and (CL > 1) in the cluster's others: a warp's lane 0 arrives */
            auto free_stage = [&](int s) {
                if (lane != 0) return;
                mbar_arrive(empty + 8 * s);
                for (int p = 1; p < CL; p++) mbar_arrive_at(empty + 8 * s, (uint32_t)(q ^ p));
            };
            int prev = -1;
            for (int i = 0; i < nk; i++, it++) {
                const int s = it % WG_STAGES;
                mbar_wait(full + 8 * s, (it / WG_STAGES) & 1);
                const uint32_t st = base + s * WG_STAGE;
                wg_fence_regs(d);
                wg_fence();
#pragma unroll
                for (int h = 0; h < 2; h++) {
#pragma unroll
                    for (int kk = 0; kk < 2; kk++)
                        wgmma_256(d, wg_desc(st + h * WG_A_STEP + c * (64 * 64) + 32 * kk),
                                  XW ? wg_desc128(st + 2 * WG_A_STEP + 32 * (2 * h + kk))
                                     : wg_desc(st + 2 * WG_A_STEP + h * WG_B_STEP + 32 * kk));
                }
                wg_commit();
                wg_wait<1>();
                wg_fence_regs(d);
                if (prev >= 0) free_stage(prev);
                prev = s;
            }
            wg_wait<0>();
            wg_fence_regs(d);
            free_stage(prev);
            /* d[4j + e]: row 16 warp + g (+ 8 for e >= 2), token 8j + 2t + (e & 1) */
            const int g = lane / 4, t = lane % 4;
            const int64_t r0 = (int64_t)rb * WG_BM + c * 64 + warp * 16 + g, n0 = (int64_t)tb * WG_BN + 2 * t;
#pragma unroll
            for (int j = 0; j < 32; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t r = r0 + (e >= 2 ? 8 : 0), n = n0 + 8 * j + (e & 1);
                    if (r < rows && n < T) {
                        if constexpr (YBF) ((uint16_t *)y)[n * ldy + r] = f2bf16(d[4 * j + e]);
                        else ((float *)y)[n * ldy + r] = d[4 * j + e];
                    }
                }
        }
    }
    /* CL > 1: no block leaves while another may still load into its stages or arrive on its barriers */
    if constexpr (CL > 1) wg_cluster_sync();
}


/* k_wgmma's instance for clusters of cl (1, 2 or 4) blocks, fp32 (ybf 0) or bf16 outputs,
 * the activations in 64-byte rows (xw 0) or 128 */
typedef void (*wg_kernel_fn)(CUtensorMap, CUtensorMap, int64_t, int64_t, int, void *, int64_t, wg_raster);
#define WG_KERNELS 12
static wg_kernel_fn wg_kernel(int cl, int ybf, int xw) {
    static const wg_kernel_fn k[2][2][3] = {
        {{k_wgmma<1, false, false>, k_wgmma<2, false, false>, k_wgmma<4, false, false>},
         {k_wgmma<1, true, false>, k_wgmma<2, true, false>, k_wgmma<4, true, false>}},
        {{k_wgmma<1, false, true>, k_wgmma<2, false, true>, k_wgmma<4, false, true>},
         {k_wgmma<1, true, true>, k_wgmma<2, true, true>, k_wgmma<4, true, true>}}};
    return k[xw ? 1 : 0][ybf ? 1 : 0][cl == 4 ? 2 : cl - 1];
}

/* ---- few tokens: k_wgmma_stream ----
 * Decode steps of 9 to 127 sequences (and any product of fewer than CU_WGMMA_MIN_T tokens in
 * `bf16`) read every weight once for a few tokens: the bytes, not the arithmetic, set the
 * time. So the blocks stay resident (one an SM) and stream: the work is the units (row block
 * of 128 rows, stage of SP 32-column steps) of all the launch's matrices in order (matrix,
 * row block, stage), and block b takes the `per` consecutive units from b * per, its producer
 * warp keeping the stages that fit in KB in flight across the row blocks it crosses (TMA, as
 * k_wgmma's producer), its two consumer warpgroups summing 64 rows each (wgmma m64nBNk16, BN
 * the launch's tokens rounded up to 8, 16, 32, 64 or 128). A row block whose units all fall in
 * one block is written out at its end; one shared by blocks b0 .. b1 (the ranges cut it) is
 * summed by them in block order: each leaves its partial sums in the scratch (part, slot 0
 * for the first row block of its range, 1 for the last) and counts itself in count[row
 * block]; the last to arrive adds the pieces in block order, writes y and sets the count back
 * to 0. So the sum of every output has an order fixed by the launch's shape (the same bits
 * run to run); it is not the few-token kernels' order, which `bf16` does not promise. */
#define WS_THREADS 288 /* two consumer warpgroups, then the producer warp */
#define WS_MATS 4

/* d += A (64 rows x 16 columns) B^T (8 tokens x 16 columns) */
__device__ __forceinline__ void ws_wgmma(float (&d)[4], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, %4, %5, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns) B^T (16 tokens x 16 columns) */
__device__ __forceinline__ void ws_wgmma(float (&d)[8], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, %8, %9, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(da), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns) B^T (32 tokens x 16 columns) */
__device__ __forceinline__ void ws_wgmma(float (&d)[16], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns) B^T (64 tokens x 16 columns) */
__device__ __forceinline__ void ws_wgmma(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns) B^T (128 tokens x 16 columns) */
__device__ __forceinline__ void ws_wgmma(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
}

/* the backend's blocks: stages of CU_WS_SP steps (ws_shape) in CU_WS_KB KB, 0: by the tokens
 * (ws_kb). A block in 110 KB lets a block of the next launch start beside it while it drains
 * (measured in the model, not alone); deeper rings pay where the stages are small. */
#ifndef CU_WS_KB
#define CU_WS_KB 0
#endif
#ifndef CU_WS_SP
#define CU_WS_SP 4
#endif
/* Tried and not kept (H100, 2026-12-07, decode side by side, two rounds): the consumers keeping
 * a stage's products in flight while they issue the next stage's within a row block (k_wgmma's
 * order, a stage freed a stage later; the same bits): 64 sequences 1,838-1,843 against
 * 2,034-2,040 tok/s (the 64-token blocks' two stages come back later), 16 the same */
/* the blocks of the backend's clusters (1; a build may set 2 or 4 to compare in the model) */
#ifndef CU_WS_CL
#define CU_WS_CL 1
#endif
/* stages of 2 steps (the form on clusters, and for matrices whose steps are not a multiple of
 * CU_WS_SP) in this many KB */
#define WS_SP2_KB 110
/* SP: the 32-column steps a stage. 4 for the backend's blocks: each tile row's weights then come
 * as runs of 4 KB instead of 2 (the tiled layout: a tile row's steps follow each other), which
 * the memory streams better (H100, 2026-12-06, `mmv_bench ws`: one 27B token's products at 16 /
 * 32 / 64 tokens 89.9 / 88.5 / 84.3% of the copy floor -> 94.1 / 91.2 / 87.1% in 200 KB, 94.5
 * / 93.0 / 88.0 in 150; 200 KB of stages of 2 steps alone: 91.2 / 88.8 / 83.7) */
template <int BN, int KB, int SP>
struct ws_shape {
    static constexpr int B_STEP = BN * 64;                     /* one step of the activations */
    static constexpr int STAGE = SP * WG_A_STEP + SP * B_STEP; /* SP steps of both */
    static constexpr int STAGES = KB * 1024 / STAGE > 12 ? 12 : KB * 1024 / STAGE;
    static constexpr int SMEM = STAGES * STAGE + 1024 + 2 * STAGES * 8;
    static constexpr int ACC = BN / 2; /* a consumer thread's accumulators */
};

/* blocks of the BN-token kernel an SM: 2 where a build sets CU_WS_2BLK and two blocks' stages
 * fit (64 tokens in 110 KB: two stages of 48 KB each, 95 registers a thread), else 1. Twice the
 * bytes in flight, but no room for the next launch's block beside a draining one: on an H100
 * (2026-12-06) decode at 64 sequences 1,913-1,917 against 2,004-2,006 tok/s, so 0; the H200,
 * which wants more bytes in flight, is not measured */
#ifndef CU_WS_2BLK
#define CU_WS_2BLK 0
#endif
#define WS_MINB(BN, KB, CL) (CU_WS_2BLK && (BN) == 64 && (KB) <= 110 && (CL) == 1 ? 2 : 1)
/* Tried and not kept (H100, 2026-12-07, decode at 40 / 64 sequences, two rounds): the
 * 64-token kernel compiled for two blocks an SM (95 registers a thread) while the grid keeps
 * one, so a block of the next launch fits beside a draining one: 1,453-1,455 / 2,030-2,032 ->
 * 1,322-1,324 / 2,026-2,028 tok/s (and with the fused decode rule at 64 sequences 1,346-1,347 /
 * 1,950-1,952). */
/* CL: the blocks of a cluster (1: the backend's; 2 and 4: mmv_bench ws's variants). With CL >
 * 1, a unit is (group of CL row blocks, stage): the cluster's blocks take the group's row
 * blocks (block q of the cluster row block CL p + q) at the same stages, and each stage's
 * activations are read once for all of them, blocks 0 and 1 each loading one of its two steps
 * into every block's shared memory (TMA multicast): at 64 tokens the activations are half the
 * bytes of a row block's weights, and the L2 was the bound. A stage is refilled once every
 * block's consumers have freed it (each consumer warp arrives on every block's "empty"
 * barrier), and no block leaves before the others (a cluster barrier at the end). Rows of a
 * group's row blocks past its matrix read zeros and are never written. */
struct ws_args {
    int n;                   /* matrices */
    int nk;                  /* stages of a row block (the steps / 2) */
    int64_t per, units;      /* units a cluster (CL 1: a block); all the launch's */
    int64_t T;
    int64_t rb0[WS_MATS + 1]; /* each matrix's first row block (CL > 1: group); rb0[n]: all */
    int64_t rows[WS_MATS], ldy[WS_MATS];
    float *y[WS_MATS];
    float *part;             /* [blocks][2][ACC][256] */
    int32_t *count;          /* [CL rb0[n]] (row block q of group p: CL p + q), 0 between launches */
};
struct ws_maps {
    CUtensorMap w[WS_MATS];
    CUtensorMap x;
};

__device__ __forceinline__ void ws_griddep_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* the matrix of global row block (CL > 1: group) R, and R within it */
__device__ __forceinline__ int ws_mat(const ws_args &a, int64_t R, int64_t *r) {
    int i = 0;
#pragma unroll
    for (int q = 1; q < WS_MATS; q++)
        if (q < a.n && R >= a.rb0[q]) i = q;
    *r = R - a.rb0[i];
    return i;
}

/* The end of unit u of a stream block's range (range_end: its range's last): where it ends
 * the block's part of its row block (the row block's last stage, or the range's end), the
 * row block out, or the block's piece of it; the last of the row block's blocks (clusters) to
 * arrive adds the pieces in block order and writes y. d is left zero for the next row block.
 * The consumer threads (tid < 256) alone call it; last_flag is the block's shared word. */
template <int ACC, int CL>
__device__ __forceinline__ void ws_unit_end(const ws_args &a, float (&d)[ACC], int64_t u, bool range_end, int64_t cl,
                                            int q, int tid, int &last_flag) {
    const int64_t R = u / a.nk;
    if (u % a.nk != a.nk - 1 && !range_end) return;
    const int warp = (tid / 32) % 4, c = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
    /* this block's row block of unit R's (CL > 1: of group R's) is done here: out, or a piece of it */
    int64_t r;
    const int m = ws_mat(a, R, &r);
    const int64_t b0 = R * a.nk / a.per, b1 = (R * a.nk + a.nk - 1) / a.per; /* the clusters sharing it */
    const int64_t rows = a.rows[m], ldy = a.ldy[m], cnt = R * CL + q;
    float *const y = a.y[m];
    if (b0 != b1) {
        /* cluster b's piece of it: slot 0 where it is the first of b's range */
        auto piece = [&](int64_t b) {
            const int slot = b * a.per / a.nk == R ? 0 : 1;
            return a.part + ((size_t)(2 * (b * CL + q) + slot) * ACC) * 256 + tid;
        };
        float *pp = piece(cl);
#pragma unroll
        for (int e = 0; e < ACC; e++) pp[e * 256] = d[e];
        __threadfence();
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (tid == 0) {
            const int last = atomicAdd(&a.count[cnt], 1) == (int)(b1 - b0);
            if (last) a.count[cnt] = 0; /* every piece is in: for the next launch */
            last_flag = last;
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const int last = last_flag;
#pragma unroll
        for (int e = 0; e < ACC; e++) d[e] = 0.0f;
        if (!last) return;
        __threadfence();
        for (int64_t b = b0; b <= b1; b++) { /* this cluster's own piece too, as it left it */
            const float *o = piece(b);
#pragma unroll
            for (int e = 0; e < ACC; e++) d[e] += __ldcg(o + e * 256);
        }
    }
    /* d[4jj + e]: row 16 warp + g (+ 8 for e >= 2) of the row block, token 8jj + 2t + (e & 1) */
    const int64_t row0 = (r * CL + q) * WG_BM + c * 64 + warp * 16 + g;
#pragma unroll
    for (int jj = 0; jj < ACC / 4; jj++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t rr = row0 + (e >= 2 ? 8 : 0), n = 8 * jj + 2 * t + (e & 1);
            if (rr < rows && n < a.T) y[n * ldy + rr] = d[4 * jj + e];
            d[4 * jj + e] = 0.0f;
        }
}

template <int BN, int KB, int CL, int SP>
__global__ void __launch_bounds__(WS_THREADS, WS_MINB(BN, KB, CL)) k_wgmma_stream(const __grid_constant__ ws_maps maps, const ws_args a) {
    static_assert(CL == 1 || CL == 2 || CL == 4, "clusters of 1, 2 or 4 blocks");
    static_assert(SP == 2 || (SP == 4 && CL == 1), "stages of 2 steps, or of 4 without clusters");
    typedef ws_shape<BN, KB, SP> S;
    extern __shared__ uint8_t wg_raw[];
    __shared__ int ws_last;
    const uint32_t base = (smem_u32(wg_raw) + 1023u) & ~1023u;
    const uint32_t full = base + S::STAGES * S::STAGE, empty = full + S::STAGES * 8;
    const int tid = threadIdx.x;
    const int q = CL > 1 ? (int)wg_cluster_rank() : 0; /* the block's row block of its group */
    const int64_t cl = (int64_t)blockIdx.x / CL;      /* the cluster (CL 1: the block) */
    const int64_t u0 = cl * a.per;
    const int nu = (int)(a.units - u0 < a.per ? a.units - u0 : a.per);
    if (tid == 0) {
        for (int s = 0; s < S::STAGES; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8 * CL); /* a consumer warp's lane 0 each, of each block of the cluster */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL > 1) wg_cluster_sync(); /* the other block's barriers are ready before anything reaches them */
    else __syncthreads();
    if (tid >= 256) { /* the producer */
        if (tid == 256) {
            auto load_w = [&](int i) {
                const int64_t u = u0 + i, R = u / a.nk;
                const int k = (int)(u % a.nk), s = i % S::STAGES;
                int64_t r;
                const int m = ws_mat(a, R, &r);
                const uint32_t st = base + s * S::STAGE;
                for (int h = 0; h < SP; h++)
                    tma_load_4d(st + h * WG_A_STEP, &maps.w[m], 0, 0, SP * k + h, (int)((r * CL + q) * (WG_BM / 16)),
                                full + 8 * s);
            };
            auto load_x = [&](int i) {
                const int k = (int)((u0 + i) % a.nk), s = i % S::STAGES;
                const uint32_t st = base + s * S::STAGE + SP * WG_A_STEP;
                if constexpr (CL > 1) { /* blocks 0 and 1: step q of the stage, to every block */
                    if (q < 2)
                        tma_load_2d_mc(st + q * S::B_STEP, &maps.x, 32 * (2 * k + q), 0, full + 8 * s,
                                       (uint16_t)((1u << CL) - 1));
                } else
                    for (int h = 0; h < SP; h++) tma_load_2d(st + h * S::B_STEP, &maps.x, 32 * (SP * k + h), 0, full + 8 * s);
            };
            /* the first stages' weights go out before the predecessor is done (they never
             * change); its activations after */
            const int pre = nu < S::STAGES ? nu : S::STAGES;
            for (int i = 0; i < pre; i++) {
                mbar_expect_tx(full + 8 * i, S::STAGE);
                load_w(i);
            }
            ws_griddep_wait();
            for (int i = 0; i < pre; i++) load_x(i);
            for (int i = pre; i < nu; i++) {
                const int s = i % S::STAGES;
                mbar_wait(empty + 8 * s, ((i / S::STAGES) & 1) ^ 1);
                mbar_expect_tx(full + 8 * s, S::STAGE);
                load_w(i);
                load_x(i);
            }
        }
    } else { /* the consumers */
        ws_griddep_wait(); /* y, part and count are the predecessors' until they are done */
        const int c = tid / 128, lane = tid % 32;
        float d[S::ACC];
#pragma unroll
        for (int i = 0; i < S::ACC; i++) d[i] = 0.0f;
        /* stage s freed in this block and (CL > 1) in the cluster's others: a warp's lane 0 arrives */
        auto free_stage = [&](int s) {
            if (lane != 0) return;
            mbar_arrive(empty + 8 * s);
            if constexpr (CL > 1)
#pragma unroll
                for (int p = 1; p < CL; p++) mbar_arrive_at(empty + 8 * s, (uint32_t)(q ^ p));
        };
        /* a stage's products: issued and committed */
        auto products = [&](int s) {
            const uint32_t st = base + s * S::STAGE;
            wg_fence_regs(d);
            wg_fence();
#pragma unroll
            for (int h = 0; h < SP; h++)
#pragma unroll
                for (int kk = 0; kk < 2; kk++)
                    ws_wgmma(d, wg_desc(st + h * WG_A_STEP + c * (64 * 64) + 32 * kk),
                             wg_desc(st + SP * WG_A_STEP + h * S::B_STEP + 32 * kk));
            wg_commit();
        };
        for (int i = 0; i < nu; i++) {
            const int s = i % S::STAGES;
            mbar_wait(full + 8 * s, (i / S::STAGES) & 1);
            products(s);
            wg_wait<0>();
            wg_fence_regs(d);
            free_stage(s);
            ws_unit_end<S::ACC, CL>(a, d, u0 + i, i == nu - 1, cl, q, tid, ws_last);
        }
    }
    /* CL > 1: no block leaves while another may still load into its stages or arrive on its barriers */
    if constexpr (CL > 1) wg_cluster_sync();
}

typedef CUresult (*tmap_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                   const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

template <int BN, int KB, int CL, int SP>
static int ws_attr() {
    const cudaError_t e = cudaFuncSetAttribute(k_wgmma_stream<BN, KB, CL, SP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               ws_shape<BN, KB, SP>::SMEM);
    return e == cudaSuccess ? 0 : -1;
}
/* the KB of stages of the BN-token kernel: kb, or for kb 0 the backend's pick. With stages of 4
 * steps on an H100 (2026-12-06, decode side by side, tok/s at 24 / 32 / 48 / 64 sequences):
 * 110 KB 897 / 1,141 / 1,575 / 1,920, 150 KB 948 / 1,197 / 1,565 / 1,905, 200 KB 932 / 1,172 /
 * 1,554 / 1,891 (stages of 2 in 110 KB, the form before: 847 / 1,078 / 1,410 / 1,882). So 110
 * where BN is 64 (two stages of 48 KB), 150 elsewhere (128 tokens need two stages of 64 KB). */
constexpr int ws_kb(int bn, int kb) { return kb ? kb : bn == 64 ? 110 : 150; }

template <int KB, int CL, int SP>
static int ws_attrs() {
    if (ws_attr<8, ws_kb(8, KB), CL, SP>() || ws_attr<16, ws_kb(16, KB), CL, SP>() ||
        ws_attr<32, ws_kb(32, KB), CL, SP>() || ws_attr<64, ws_kb(64, KB), CL, SP>())
        return -1;
    return ws_attr<128, ws_kb(128, KB), CL, SP>();
}

/* the backend's forms' shared memory allowed */
static int ws_attrs_backend(void) {
#if CU_WS_CL == 1
    return ws_attrs<CU_WS_KB, 1, CU_WS_SP>() || ws_attrs<WS_SP2_KB, 1, 2>() ? -1 : 0;
#else
    return ws_attrs<WS_SP2_KB, CU_WS_CL, 2>();
#endif
}

/* ---- MLX 4- and 8-bit matrices times few tokens on wgmma: k_wgmma_qstream (`bf16`) ----
 * k_wgmma_stream's scheme for Q tiled matrices (matmul_q.cu's layout): one resident block an
 * SM, the launch's units (row block of 128 rows = 8 tiles, stage of 4 steps) in order, block
 * b the `per` consecutive units from b * per, the row blocks its range cuts summed in block
 * order (ws_unit_end). Its producer thread fills each stage with five TMA loads and the
 * activations' four (qs_maps): the 8 tiles' 4 steps of values, their scales and their biases of
 * the groups the stage touches (32 bytes a tile and group, rows in the layout's order), a
 * unit's place kept as a cursor (no division a stage: with 24 bulk copies a stage and the
 * place divided out three times it held every launch near 27 ms a 27B token, at any token
 * count and either width, on an H100). Consumer warp w of
 * warpgroup c takes tile 4c + w: each lane turns its 16 values of a step (8 columns of rows
 * g and g + 8) into bf16 s q + b of their group, rounded to nearest (8-bit as k_dequant_q
 * rounds cuBLASLt's copy; 4-bit from 16 + q as k_qmvp takes it, with the bias b - 16 s), the
 * A registers of two wgmma m64nBNk16 whose B is the stage's activations.
 * A lane holds columns 8t .. 8t + 7 of a step (the layout's), where a k16 MMA's A registers
 * are its columns 2t, 2t + 1, 2t + 8, 2t + 9: the activations come permuted instead
 * (k_split_qperm: in each 32-column step, position 16 kk + 8 hi + 2 t + i holds column
 * 8 t + 4 kk + 2 hi + i), so that MMA kk takes a lane's columns 8t + 4kk .. 8t + 4kk + 3, the
 * pairs k_qmvp's q_frag makes. The sums are the weights as rounded times the activations in
 * bf16 (the library's operands in a prefill), in the tensor cores' order: not k_qmvp's bits,
 * which keep s and b outside the sums, so `bf16` alone may take it. */
#define QS_BM 128 /* rows a unit: 8 tiles of 16 */
/* steps a stage (every group of 32, 64 or 128 columns falls in whole stages or holds them).
 * Tried and not kept (H100, session 48, MLX 8-bit decode at 9 / 16 / 32 / 64 sequences):
 * stages of 8 steps 628 / 1,039 / 1,754 / 2,632 tok/s against 4's 617 / 1,021 / 1,734 /
 * 2,648, within the runs' spread; two blocks an SM up to 32 tokens (100 KB of stages each)
 * 586 / 977 / 1,667, slower */
#define QS_SP 4

template <int BN, int BITS>
struct qs_shape {
    static constexpr int B_STEP = BN * 64;                 /* one step of the activations */
    static constexpr int X = QS_SP * B_STEP;               /* the stage's activations (first: 1,024-aligned) */
    static constexpr int V_TILE = QS_SP * 64 * BITS;       /* a tile's values of a stage */
    static constexpr int G_TILE = QS_SP * 32;              /* a tile's share of the scales (or biases): up to 4 groups */
    static constexpr int STAGE = X + 8 * V_TILE + 16 * G_TILE; /* a multiple of 1,024 */
    static constexpr int STAGES = 150 * 1024 / STAGE > 12 ? 12 : 150 * 1024 / STAGE;
    static constexpr int SMEM = STAGES * STAGE + 1024 + 2 * STAGES * 8;
    static constexpr int ACC = BN / 2;
};

/* a launch's MLX matrices beside k_wgmma_stream's arguments (whose y, rows and units it
 * uses), and their tensor maps: each matrix's values as bytes {256, BITS / 4, steps, tiles}
 * (a tile's step is 64 BITS bytes), a box of {256, BITS / 4, 4, 8} a stage's 8 tiles' 4 steps
 * (tile j's at j V_TILE, as they lie); its scales and biases as bf16 {16, groups, tiles}, a
 * box of {16, ngs, 8} the stage's ngs groups of 8 tiles (tile j's at j ngs 32 bytes); tiles
 * past the matrix read as zeros */
struct qs_args {
    ws_args a;
    int ngs; /* groups a stage touches: 1, 2 or 4 */
    int gsh; /* the group's steps as a power of two: 0, 1 or 2 */
};
struct qs_maps {
    CUtensorMap v[WS_MATS], s[WS_MATS], b[WS_MATS];
    CUtensorMap x;
};

/* a lane's A registers of a step, both k16 MMAs (a[0..3], a[4..7]: q_frag's order): its values
 * v (8-bit: v.x, v.y row g's columns 0-3, 4-7, v.z, v.w row g + 8's; 4-bit: v.x row g's 8
 * nibbles, v.y row g + 8's) as bf16 s q + b, s0, b0 row g's scale and bias, s1, b1 row g + 8's
 * (4-bit: the bias less 16 s) */
template <int BITS>
__device__ __forceinline__ void qs_frag(const uint4 &v, float s0, float b0, float s1, float b1, uint32_t (&a)[8]) {
    if (BITS == 8) {
        auto pr = [](uint32_t w, int b, float s, float o) {
            const float f0 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440 + b)) - 8388608.0f;
            const float f1 = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7441 + b)) - 8388608.0f;
            return bf16x2_rn(fmaf(s, f0, o), fmaf(s, f1, o));
        };
        a[0] = pr(v.x, 0, s0, b0), a[1] = pr(v.z, 0, s1, b1), a[2] = pr(v.x, 2, s0, b0), a[3] = pr(v.z, 2, s1, b1);
        a[4] = pr(v.y, 0, s0, b0), a[5] = pr(v.w, 0, s1, b1), a[6] = pr(v.y, 2, s0, b0), a[7] = pr(v.w, 2, s1, b1);
    } else {
        /* q_frag's pair of bf16 16 + n, then each as fp32 */
        auto pr = [](uint32_t w, int sh, float s, float o) {
            const uint32_t u = sh >= 3 ? w >> (sh - 3) : w << (3 - sh), hi = 0x41804180u;
            uint32_t p;
            asm("lop3.b32 %0, %1, 0x00780078, %2, 0xEA;" : "=r"(p) : "r"(u), "r"(hi));
            return bf16x2_rn(fmaf(s, __uint_as_float(p << 16), o), fmaf(s, __uint_as_float(p & 0xffff0000u), o));
        };
        a[0] = pr(v.x, 0, s0, b0), a[1] = pr(v.y, 0, s1, b1), a[2] = pr(v.x, 4, s0, b0), a[3] = pr(v.y, 4, s1, b1);
        a[4] = pr(v.x, 8, s0, b0), a[5] = pr(v.y, 8, s1, b1), a[6] = pr(v.x, 12, s0, b0), a[7] = pr(v.y, 12, s1, b1);
    }
}

/* d += A (64 rows x 16 columns, from registers: a warp's 16 rows as mma.m16n8k16's A) B^T (8 tokens x 16 columns) */
__device__ __forceinline__ void qs_wgmma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns, from registers: a warp's 16 rows as mma.m16n8k16's A) B^T (16 tokens x 16 columns) */
__device__ __forceinline__ void qs_wgmma(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns, from registers: a warp's 16 rows as mma.m16n8k16's A) B^T (32 tokens x 16 columns) */
__device__ __forceinline__ void qs_wgmma(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns, from registers: a warp's 16 rows as mma.m16n8k16's A) B^T (64 tokens x 16 columns) */
__device__ __forceinline__ void qs_wgmma(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}
/* d += A (64 rows x 16 columns, from registers: a warp's 16 rows as mma.m16n8k16's A) B^T (128 tokens x 16 columns) */
__device__ __forceinline__ void qs_wgmma(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

template <int BN, int BITS>
__global__ void __launch_bounds__(WS_THREADS, 1)
    k_wgmma_qstream(const __grid_constant__ qs_maps maps, const __grid_constant__ qs_args qa) {
    typedef qs_shape<BN, BITS> S;
    const ws_args &a = qa.a;
    extern __shared__ uint8_t wg_raw[];
    __shared__ int qs_last;
    const uint32_t base = (smem_u32(wg_raw) + 1023u) & ~1023u;
    const uint8_t *ring = wg_raw + (base - smem_u32(wg_raw)); /* base as a pointer */
    const uint32_t full = base + S::STAGES * S::STAGE, empty = full + S::STAGES * 8;
    const int tid = threadIdx.x;
    const int64_t u0 = (int64_t)blockIdx.x * a.per;
    const int nu = (int)(a.units - u0 < a.per ? a.units - u0 : a.per);
    if (tid == 0) {
        for (int s = 0; s < S::STAGES; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 8); /* a consumer warp's lane 0 each */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid >= 256) { /* the producer */
        if (tid == 256) {
            /* the unit to load next: row block R (r of matrix m), stage k; advanced a unit at a time */
            int64_t R = u0 / a.nk, r;
            int k = (int)(u0 % a.nk);
            int m = ws_mat(a, R, &r);
            auto advance = [&]() {
                if (++k == a.nk) k = 0, m = ws_mat(a, ++R, &r);
            };
            /* the stage's bytes: every box whole (TMA counts what it fills past the tensor) */
            const uint32_t tx = (uint32_t)(S::X + 8 * S::V_TILE + 2 * 8 * 32 * qa.ngs);
            auto load_w = [&](int i) {
                const uint32_t st = base + (i % S::STAGES) * S::STAGE, bar = full + 8 * (i % S::STAGES);
                const int t0 = (int)(r * 8), g0 = (QS_SP * k) >> qa.gsh;
                tma_load_4d(st + S::X, &maps.v[m], 0, 0, QS_SP * k, t0, bar);
                tma_load_3d(st + S::X + 8 * S::V_TILE, &maps.s[m], 0, g0, t0, bar);
                tma_load_3d(st + S::X + 8 * S::V_TILE + 8 * S::G_TILE, &maps.b[m], 0, g0, t0, bar);
            };
            auto load_x = [&](int i, int kx) {
                const uint32_t st = base + (i % S::STAGES) * S::STAGE, bar = full + 8 * (i % S::STAGES);
                for (int h = 0; h < QS_SP; h++) tma_load_2d(st + h * S::B_STEP, &maps.x, 32 * (QS_SP * kx + h), 0, bar);
            };
            /* the first stages' weights go out before the predecessor (the split) is done; the
             * activations after */
            const int pre = nu < S::STAGES ? nu : S::STAGES;
            for (int i = 0; i < pre; i++) {
                mbar_expect_tx(full + 8 * i, tx);
                load_w(i);
                advance();
            }
            ws_griddep_wait();
            for (int i = 0; i < pre; i++) load_x(i, (int)((u0 + i) % a.nk));
            for (int i = pre; i < nu; i++) {
                const int s = i % S::STAGES;
                mbar_wait(empty + 8 * s, ((i / S::STAGES) & 1) ^ 1);
                mbar_expect_tx(full + 8 * s, tx);
                load_w(i);
                load_x(i, k);
                advance();
            }
        }
    } else { /* the consumers */
        ws_griddep_wait(); /* y, part and count are the predecessors' until they are done */
        const int c = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4;
        const int j = 4 * c + warp; /* this warp's tile of the row block (rows past the matrix: never written) */
        float d[S::ACC];
#pragma unroll
        for (int i = 0; i < S::ACC; i++) d[i] = 0.0f;
        /* unit i's stage (stage k of its row block), once in: this lane's A registers of its 4 steps */
        auto convert = [&](int i, int k, uint32_t(&af)[QS_SP][8]) {
            const int s = i % S::STAGES;
            const int sk = QS_SP * k; /* the stage's first step */
            mbar_wait(full + 8 * s, (i / S::STAGES) & 1);
            const uint8_t *sv = ring + s * S::STAGE + S::X + j * S::V_TILE + lane * 2 * BITS;
            const uint8_t *sg = ring + s * S::STAGE + S::X + 8 * S::V_TILE + j * 32 * qa.ngs + 4 * g;
#pragma unroll
            for (int h = 0; h < QS_SP; h++) {
                const int gl = ((sk + h) >> qa.gsh) - (sk >> qa.gsh); /* step h's group in the stage's */
                const uint32_t sp = *(const uint32_t *)(sg + 32 * gl), bp = *(const uint32_t *)(sg + 8 * S::G_TILE + 32 * gl);
                const float s0 = __uint_as_float(sp << 16), s1 = __uint_as_float(sp & 0xffff0000u);
                float b0 = __uint_as_float(bp << 16), b1 = __uint_as_float(bp & 0xffff0000u);
                uint4 v;
                if (BITS == 8) v = *(const uint4 *)(sv + h * 64 * BITS);
                else {
                    const uint2 w = *(const uint2 *)(sv + h * 64 * BITS);
                    v = make_uint4(w.x, w.y, 0, 0);
                    b0 = fmaf(-16.0f, s0, b0), b1 = fmaf(-16.0f, s1, b1);
                }
                qs_frag<BITS>(v, s0, b0, s1, b1, af[h]);
            }
        };
        /* its products, issued and committed */
        auto products = [&](int i, const uint32_t(&af)[QS_SP][8]) {
            const uint32_t st = base + (i % S::STAGES) * S::STAGE;
            wg_fence_regs(d);
            wg_fence();
#pragma unroll
            for (int h = 0; h < QS_SP; h++)
#pragma unroll
                for (int kk = 0; kk < 2; kk++)
                    qs_wgmma(d, af[h][4 * kk], af[h][4 * kk + 1], af[h][4 * kk + 2], af[h][4 * kk + 3],
                             wg_desc(st + h * S::B_STEP + 32 * kk));
            wg_commit();
        };
        auto free_stage = [&](int i) {
            if (lane == 0) mbar_arrive(empty + 8 * (i % S::STAGES));
        };
        uint32_t af[QS_SP][8];
        int k = (int)(u0 % a.nk); /* the unit's stage in its row block, as a cursor */
        for (int i = 0; i < nu; i++) {
            convert(i, k, af);
            products(i, af);
            wg_wait<0>();
            wg_fence_regs(d);
            free_stage(i);
            if (k == a.nk - 1 || i == nu - 1) /* (no division a stage) */
                ws_unit_end<S::ACC, 1>(a, d, u0 + i, i == nu - 1, (int64_t)blockIdx.x, 0, tid, qs_last);
            k = k + 1 == a.nk ? 0 : k + 1;
        }
    }
}

/* xs[t][p] = x[t][c] rounded to bf16 as k_split rounds it, permuted as k_wgmma_qstream reads
 * it: in each 32-column step, position 16 kk + 8 hi + 2 t + i holds column 8 t + 4 kk + 2 hi +
 * i (zeros past cols); a thread a pair of positions */
__global__ void k_split_qperm(const float *x, int64_t ldx, int64_t T, int64_t cols, uint16_t *xs, int64_t ldxs) {
    pdl_wait(); /* x is the predecessor's */
    const int64_t pairs = ldxs / 2, n = T * pairs;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = q / pairs, p = q % pairs;
        const int P = (int)(p % 16), kk = P >> 3, hi = (P >> 2) & 1, t4 = P & 3;
        const int64_t c = 32 * (p / 16) + 8 * t4 + 4 * kk + 2 * hi;
        const float *xr = x + t * ldx;
        const float lo = c < cols ? xr[c] : 0.0f, up = c + 1 < cols ? xr[c + 1] : 0.0f;
        ((uint32_t *)xs)[q] = bf16x2_rn(lo, up);
    }
}

template <int BN, int BITS>
static int qs_attr() {
    const int n = qs_shape<BN, BITS>::SMEM;
    return cudaFuncSetAttribute(k_wgmma_qstream<BN, BITS>, cudaFuncAttributeMaxDynamicSharedMemorySize, n) ==
                   cudaSuccess
               ? 0
               : -1;
}
template <int BITS>
static int qs_attrs_b() {
    return qs_attr<8, BITS>() || qs_attr<16, BITS>() || qs_attr<32, BITS>() || qs_attr<64, BITS>() ||
                   qs_attr<128, BITS>()
               ? -1
               : 0;
}

extern "C" void *cu_wgmma_available(void) {
    if (!wg_device_runs_sm90a()) return NULL;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
        return NULL;
    for (int i = 0; i < WG_KERNELS; i++)
        if (cudaFuncSetAttribute(wg_kernel(i % 3 == 2 ? 4 : i % 3 + 1, i / 3 % 2, i / 6),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM) != cudaSuccess)
            return NULL;
    if (ws_attrs_backend() != 0 || qs_attrs_b<8>() != 0 || qs_attrs_b<4>() != 0) return NULL;
    return fn;
}

/* the tensor map of a tiled bf16 matrix: boxes of one 32-column step of 8 tiles (128 rows) */
static int wg_map_w(tmap_encode_fn enc, const cu_mat *w, CUtensorMap *map) {
    const int64_t nsteps = (w->cols + 31) / 32, ntiles = (w->rows + 15) / 16;
    const cuuint64_t dim[4] = {32, 16, (cuuint64_t)nsteps, (cuuint64_t)ntiles};
    const cuuint64_t stride[3] = {64, 1024, (cuuint64_t)nsteps * 1024};
    const cuuint32_t box[4] = {32, 16, 1, WG_BM / 16}, ones[4] = {1, 1, 1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)w->data, dim, stride, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* the activations' tensor map: boxes of one step of `tokens` tokens (wide: of two steps,
 * 128-byte rows under the 128-byte swizzle) */
static int wg_map_x(tmap_encode_fn enc, const uint16_t *xs, int64_t ldxs, int64_t T, int tokens, CUtensorMap *map,
                    int wide = 0) {
    const cuuint64_t dim[2] = {(cuuint64_t)ldxs, (cuuint64_t)T};
    const cuuint64_t stride[1] = {(cuuint64_t)ldxs * 2};
    const cuuint32_t box[2] = {wide ? 64u : 32u, (cuuint32_t)tokens}, ones[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)xs, dim, stride, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, wide ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* whether a matrix can be read by the TMA products (an even number of steps, aligned) */
static bool wg_takes(const cu_mat *w) {
    const int64_t nsteps = (w->cols + 31) / 32;
    return w->fmt == CU_FMT_BF16_TILED && w->rows > 0 && nsteps % 2 == 0 && nsteps <= (1 << 30) &&
           ((uintptr_t)w->data & 15) == 0;
}

/* k_wgmma's blocks a cluster in the backend (a build may set 1 or 4 to compare) */
#ifndef CU_WG_CL
#define CU_WG_CL 2
#endif

/* k_wgmma's bands, in row blocks (0: token tiles fastest; a build may set others to compare) */
#ifndef CU_WG_GROUP
#define CU_WG_GROUP 0
#endif

/* whether k_wgmma reads the activations in 128-byte rows (0: two 64-byte steps a stage). 1
 * since an H100 measured it (2026-12-07, `mmv_bench wg`, the 27B's shapes on clusters of 2):
 * up to 10% faster at most shapes and sizes (down at 4,096 tokens 687 -> 761 TFLOP/s, gate+up
 * at 2,048 674 -> 713, GDN in at 512 585 -> 670), slower only at a few (gate+up at 4,096 665
 * -> 648), the same bits */
#ifndef CU_WG_XW
#define CU_WG_XW 1
#endif

/* whether k_wgmma's clusters stay resident: a grid of as many clusters as the device runs at
 * once (cu_mm_scratch.wg_clusters), each taking every G-th place, its producer loading the
 * next place's first stages while its consumers write the outputs of the one before; 0, a
 * cluster for each place. 1 since an H100 measured it in the model (2026-12-07, 128-byte
 * rows, every product on k_wgmma, two rounds): the prefill of 1,024 / 2,048 / 4,096 / 8,192
 * tokens 8,628-8,630 / 9,727-9,772 / 9,626-9,674 / 9,542-9,553 -> 8,605-8,650 / 9,926-9,941 /
 * 9,706-9,843 / 9,666-9,698 tok/s (512: 7,552-7,570 -> 7,475-7,530) */
#ifndef CU_WG_PERSIST
#define CU_WG_PERSIST 1
#endif
/* Tried and not kept (H100, 2026-12-07, session 46): blocks of 192 weight rows by 192 tokens,
 * the tile of cuBLASLt's kernels at 8,192 tokens (nvjet_sm90_tst_192x192_64x4_2x1): three
 * consumer warpgroups of m64n192k16 (setmaxnreg 40 / 152 in 512 threads), 48 KB stages, and
 * the same with wgmma's operands swapped (the activations A, so that adjacent rows of a token
 * are stored as one). The same bits; `mmv_bench wg` at 8,192 tokens, resident clusters of 2:
 * gate+up 649.8 / 648.6 TFLOP/s, down 588.3 / 602.6, GDN in 606.5 / 629.2 against the 128 x
 * 256 tile's 750.2, 767.2, 734.7; the prefill with every product on k_wgmma, 2,048 / 8,192
 * tokens: 9,542 / 9,282 and 9,406 / 9,317 against 9,681 / 9,732 tok/s. With clusters of two
 * along the row blocks both tiles read the same L2 bytes a product (an effective 256 x 256
 * against 384 x 192), and a 192-token wgmma reads more of shared memory a product. */

/* a launch's configuration: n blocks of `threads` in clusters of cl, `smem` bytes of dynamic
 * shared memory, programmatic dependent launch where pdl (at: its attributes' storage, 2) */
static cudaLaunchConfig_t cluster_cfg(cu_stream s, int64_t n, int threads, size_t smem, int cl, bool pdl,
                                      cudaLaunchAttribute *at) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)n);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)cl, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 2 : 1;
    return cfg;
}
/* k_wgmma's: n blocks in clusters of cl */
static cudaLaunchConfig_t wg_cfg(cu_stream s, int64_t n, int cl, cudaLaunchAttribute *at) {
    return cluster_cfg(s, n, WG_THREADS, WG_SMEM, cl, false, at);
}

extern "C" int cu_wgmma_clusters(int cl) {
    if (cl == 0) {
        if (!CU_WG_PERSIST) return 0;
        cl = CU_WG_CL;
    }
    if (cl != 1 && cl != 2 && cl != 4) return 0;
    int most = 0;
    for (int ybf = 0; ybf < 2; ybf++) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = wg_cfg(0, cl, cl, at);
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, wg_kernel(cl, ybf, CU_WG_XW), &cfg) != cudaSuccess) n = 0;
        most = ybf == 0 || n < most ? n : most;
    }
    (void)cudaGetLastError(); /* a refused query: no error left for a later launch to report */
    return most;
}

/* k_wgmma on clusters of cl (1, 2 or 4) blocks, in bands of `group` row blocks (wg_place;
 * rounded up to whole clusters), the activations in rows of 64 bytes or (xw) 128; at most
 * `clusters` clusters, resident, each taking every G-th place (0: a cluster a place) */
static int wg_matmul_cl(cu_stream s, void *encode, const cu_mat *w, const uint16_t *xs, int64_t ldxs, int64_t T,
                        void *y, int64_t ldy, int cl, int ybf = 0, int group = CU_WG_GROUP, int xw = CU_WG_XW,
                        int clusters = 0) {
    const tmap_encode_fn enc = (tmap_encode_fn)encode;
    const int64_t nsteps = (w->cols + 31) / 32;
    if (!enc || !wg_takes(w) || T <= 0 || ldxs % 32 != 0 || ((uintptr_t)xs & 15) || (cl != 1 && cl != 2 && cl != 4))
        return -1;
    CUtensorMap wmap, xmap;
    if (wg_map_w(enc, w, &wmap) != 0 || wg_map_x(enc, xs, ldxs, T, xw ? WG_BN / 2 : WG_BN, &xmap, xw) != 0) return -1;
    /* the row blocks (cl 4: and the token tiles) rounded up to whole clusters (a block past
     * the matrix reads zeros and writes nothing) */
    const int64_t rbs = (w->rows + WG_BM - 1) / WG_BM, tbs = (T + WG_BN - 1) / WG_BN;
    const int cx = cl == 4 ? 2 : 1, cy = cl == 4 ? 2 : cl; /* the cluster's blocks along token tiles, row blocks */
    const int64_t cols = (tbs + cx - 1) / cx, crows = (rbs + cy - 1) / cy;
    if (cols * crows * cl > INT32_MAX || group < 0) return -1;
    const wg_raster ras = {(int)cols, (int)crows, (group + cy - 1) / cy, (int)(cols * crows)};
    const int64_t grid = clusters > 0 && clusters < ras.n ? clusters : ras.n;
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg = wg_cfg(s, grid * cl, cl, at);
    const cudaError_t e =
        cudaLaunchKernelEx(&cfg, wg_kernel(cl, ybf, xw), wmap, xmap, w->rows, T, (int)nsteps, y, ldy, ras);
    return e == cudaSuccess && cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int cu_wgmma_matmul(cu_stream s, void *encode, const cu_mat *w, const uint16_t *xs, int64_t ldxs, int64_t T,
                               float *y, int64_t ldy, int clusters) {
    return wg_matmul_cl(s, encode, w, xs, ldxs, T, y, ldy, CU_WG_CL, 0, CU_WG_GROUP, CU_WG_XW, clusters);
}

extern "C" int cu_wgmma_matmul_bf16(cu_stream s, void *encode, const cu_mat *w, const uint16_t *xs, int64_t ldxs,
                                    int64_t T, uint16_t *y, int64_t ldy, int clusters) {
    return wg_matmul_cl(s, encode, w, xs, ldxs, T, y, ldy, CU_WG_CL, 1, CU_WG_GROUP, CU_WG_XW, clusters);
}

/* a cluster launch's configuration (at: its attributes' storage, 2) */
template <int BN, int KB, int CL>
static cudaLaunchConfig_t ws_cluster_cfg(cu_stream s, int64_t blocks, cudaLaunchAttribute *at) {
    return cluster_cfg(s, blocks, WS_THREADS, (size_t)ws_shape<BN, KB, 2>::SMEM, CL, CU_PDL, at);
}
/* the most clusters of CL blocks of the BN-token kernel the device runs at once (0: none, or
 * the query failed: the caller then takes its other kernel) */
template <int BN, int KB, int CL>
static int ws_clusters_of() {
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg = ws_cluster_cfg<BN, KB, CL>(0, CL, at);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, k_wgmma_stream<BN, KB, CL, 2>, &cfg) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky */
        return 0;
    }
    return n;
}
template <int KB, int CL>
static int ws_clusters_all() {
    int most = ws_clusters_of<8, KB, CL>();
    const int n[4] = {ws_clusters_of<16, KB, CL>(), ws_clusters_of<32, KB, CL>(), ws_clusters_of<64, KB, CL>(),
                      ws_clusters_of<128, KB, CL>()};
    for (int i = 0; i < 4; i++) most = n[i] < most ? n[i] : most;
    return most;
}
extern "C" int cu_wgmma_stream_clusters(int cl) {
    if (cl == 0) cl = CU_WS_CL;
    int n = 0;
    if (cl == 2) n = ws_attrs<WS_SP2_KB, 2, 2>() == 0 ? ws_clusters_all<WS_SP2_KB, 2>() : 0;
    else if (cl == 4) n = ws_attrs<WS_SP2_KB, 4, 2>() == 0 ? ws_clusters_all<WS_SP2_KB, 4>() : 0;
    (void)cudaGetLastError(); /* a refused attribute or query: no error left for a later launch to report */
    return n;
}

template <int BN, int KB, int CL, int SP>
static int ws_launch(cu_stream s, const ws_maps &maps, const ws_args &a, int64_t blocks) {
    if constexpr (CL == 1)
        launch_pdl(k_wgmma_stream<BN, KB, CL, SP>, dim3((unsigned)blocks), dim3(WS_THREADS),
                   (size_t)ws_shape<BN, KB, SP>::SMEM, s, maps, a);
    else {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = ws_cluster_cfg<BN, KB, CL>(s, blocks, at);
        cudaLaunchKernelEx(&cfg, k_wgmma_stream<BN, KB, CL, SP>, maps, a);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

template <int KB, int CL, int SP>
static int ws_stream(cu_stream s, const cu_mm_scratch *sc, int n, const cu_mat *const *w, float *const *y,
                     const int64_t *ldy, const uint16_t *xs, int64_t ldxs, int64_t T) {
    const tmap_encode_fn enc = sc ? (tmap_encode_fn)sc->tma_encode : NULL;
    if (!enc || !sc->wpart || !sc->wcount || n < 1 || n > WS_MATS || T < 1 || T > 128 || ldxs % 32 != 0 ||
        ((uintptr_t)xs & 15))
        return -1;
    const int bn = T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128;
    ws_maps maps;
    ws_args a;
    memset(&maps, 0, sizeof maps);
    memset(&a, 0, sizeof a);
    a.n = n;
    if (((w[0]->cols + 31) / 32) % SP != 0) return -1;
    a.nk = (int)((w[0]->cols + 31) / 32 / SP);
    a.T = T;
    int64_t R = 0;
    for (int i = 0; i < n; i++) {
        if (!wg_takes(w[i]) || w[i]->cols != w[0]->cols || wg_map_w(enc, w[i], &maps.w[i]) != 0) return -1;
        a.rb0[i] = R;
        R += ((w[i]->rows + WG_BM - 1) / WG_BM + CL - 1) / CL; /* row blocks (CL > 1: groups) */
        a.rows[i] = w[i]->rows, a.ldy[i] = ldy[i], a.y[i] = y[i];
    }
    a.rb0[n] = R;
    if (a.nk < 1 || R * CL > sc->wcount_n || wg_map_x(enc, xs, ldxs, T, bn, &maps.x) != 0) return -1;
    a.units = R * a.nk;
    /* a block an SM, as many as the scratch has pieces for (a piece pair a block), in clusters
     * of CL (no more than can run at once: a cluster's blocks share a GPC), none without units */
    int64_t clusters = mm_sms() / CL * (bn == 64 ? WS_MINB(64, ws_kb(64, KB), CL) : 1);
    if constexpr (CL > 1) {
        if (sc->ws_clusters < 1) return -1;
        clusters = clusters < sc->ws_clusters ? clusters : sc->ws_clusters;
    }
    const int64_t fit = sc->wpart_elems / (256 * (int64_t)bn) / CL;
    clusters = clusters < fit ? clusters : fit;
    clusters = clusters < a.units ? clusters : a.units;
    if (clusters < 1) return -1;
    a.per = (a.units + clusters - 1) / clusters;
    clusters = (a.units + a.per - 1) / a.per;
    a.part = sc->wpart;
    a.count = sc->wcount;
    const int64_t blocks = clusters * CL;
    switch (bn) {
    case 8: return ws_launch<8, ws_kb(8, KB), CL, SP>(s, maps, a, blocks);
    case 16: return ws_launch<16, ws_kb(16, KB), CL, SP>(s, maps, a, blocks);
    case 32: return ws_launch<32, ws_kb(32, KB), CL, SP>(s, maps, a, blocks);
    case 64: return ws_launch<64, ws_kb(64, KB), CL, SP>(s, maps, a, blocks);
    default: return ws_launch<128, ws_kb(128, KB), CL, SP>(s, maps, a, blocks);
    }
}

extern "C" int cu_wgmma_stream(cu_stream s, const cu_mm_scratch *sc, int n, const cu_mat *const *w, float *const *y,
                               const int64_t *ldy, const uint16_t *xs, int64_t ldxs, int64_t T) {
#if CU_WS_CL == 1
    if (n >= 1 && ((w[0]->cols + 31) / 32) % CU_WS_SP != 0) /* (every launch's matrices have one width) */
        return ws_stream<WS_SP2_KB, 1, 2>(s, sc, n, w, y, ldy, xs, ldxs, T);
    return ws_stream<CU_WS_KB, 1, CU_WS_SP>(s, sc, n, w, y, ldy, xs, ldxs, T);
#else
    return ws_stream<WS_SP2_KB, CU_WS_CL, 2>(s, sc, n, w, y, ldy, xs, ldxs, T);
#endif
}

/* the backend's bf16-activation products of MLX matrices of few tokens (cuda_kernels.h). A
 * form that made the next stage's values while this stage's products ran (a second set of A
 * registers, CU_QS_ASYNC) was measured on an H100 (mmv_bench qs, one 27B token's 8-bit
 * matrices) and removed: 12.19 / 12.30 / 12.65 / 14.33 / 19.02 ms at 1 / 16 / 17 / 64 / 127
 * tokens against this form's 12.39 / 12.49 / 12.47 / 13.59 / 17.80, 4-bit slower at every
 * count from 16; ptxas serialized its wgmma (C7513: A registers defined while a stage's
 * products ran), which fencing them did not mend */
extern "C" int cu_wgmma_qstream(cu_stream s, const cu_mm_scratch *sc, int n, const cu_mat *const *w, float *const *y,
                                const int64_t *ldy, const float *x, int64_t ldx, int64_t T) {
    const tmap_encode_fn enc = sc ? (tmap_encode_fn)sc->tma_encode : NULL;
    if (!enc || !sc->wpart || !sc->wcount || !sc->xs || n < 1 || n > WS_MATS || T < 1 || T > 128 ||
        T > sc->xs_tokens)
        return -1;
    const cu_mat *w0 = w[0];
    const int64_t cols = w0->cols, nsteps = cols / 32;
    const int gsh = w0->group == 32 ? 0 : w0->group == 64 ? 1 : w0->group == 128 ? 2 : -1;
    if (gsh < 0 || (w0->bits != 4 && w0->bits != 8) || cols % 32 != 0 || nsteps % QS_SP != 0 || nsteps < QS_SP)
        return -1;
    qs_args qa;
    qs_maps maps;
    memset(&qa, 0, sizeof qa);
    memset(&maps, 0, sizeof maps);
    ws_args &a = qa.a;
    a.n = n;
    a.nk = (int)(nsteps / QS_SP);
    a.T = T;
    const int64_t ng = cols / w0->group;
    qa.gsh = gsh;
    qa.ngs = (QS_SP >> gsh) > 0 ? QS_SP >> gsh : 1;
    const int bits = w0->bits;
    int64_t R = 0;
    for (int i = 0; i < n; i++) {
        const cu_mat *wi = w[i];
        if (wi->fmt != CU_FMT_Q_TILED || wi->sdtype != 2 || wi->bits != bits || wi->group != w0->group ||
            wi->cols != cols || wi->rows < 1 || (((uintptr_t)wi->data | (uintptr_t)wi->scales | (uintptr_t)wi->biases) & 15))
            return -1;
        a.rb0[i] = R;
        R += (wi->rows + QS_BM - 1) / QS_BM;
        a.rows[i] = wi->rows, a.ldy[i] = ldy[i], a.y[i] = y[i];
        const cuuint64_t tiles = (cuuint64_t)((wi->rows + 15) / 16);
        const cuuint32_t ones[4] = {1, 1, 1, 1};
        const cuuint64_t vdim[4] = {256, (cuuint64_t)bits / 4, (cuuint64_t)nsteps, tiles};
        const cuuint64_t vstr[3] = {256, (cuuint64_t)(64 * bits), (cuuint64_t)(nsteps * 64 * bits)};
        const cuuint32_t vbox[4] = {256, (cuuint32_t)bits / 4, QS_SP, 8};
        const cuuint64_t gdim[3] = {16, (cuuint64_t)ng, tiles}, gstr[2] = {32, (cuuint64_t)(ng * 32)};
        const cuuint32_t gbox[3] = {16, (cuuint32_t)qa.ngs, 8};
        auto map = [&](CUtensorMap *mp, CUtensorMapDataType dt, cuuint32_t rank, const void *p, const cuuint64_t *dim,
                       const cuuint64_t *str, const cuuint32_t *box) {
            return enc(mp, dt, rank, (void *)p, dim, str, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
        };
        if (!map(&maps.v[i], CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, wi->data, vdim, vstr, vbox) ||
            !map(&maps.s[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, wi->scales, gdim, gstr, gbox) ||
            !map(&maps.b[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, wi->biases, gdim, gstr, gbox))
            return -1;
    }
    a.rb0[n] = R;
    const int bn = T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128;
    const int64_t ldxs = nsteps * 32;
    if (R > sc->wcount_n || ((uintptr_t)sc->xs & 15) || wg_map_x(enc, sc->xs, ldxs, T, bn, &maps.x) != 0) return -1;
    a.units = R * a.nk;
    /* a block an SM, as many as the scratch has pieces for, none without units */
    int64_t blocks = mm_sms();
    const int64_t fit = sc->wpart_elems / (256 * (int64_t)bn);
    blocks = blocks < fit ? blocks : fit;
    blocks = blocks < a.units ? blocks : a.units;
    if (blocks < 1) return -1;
    a.per = (a.units + blocks - 1) / blocks;
    blocks = (a.units + a.per - 1) / a.per;
    a.part = sc->wpart;
    a.count = sc->wcount;
    const int64_t pairs = T * ldxs / 2;
    launch_pdl(k_split_qperm, dim3((unsigned)((pairs + 255) / 256 < 4096 ? (pairs + 255) / 256 : 4096)), dim3(256), 0,
               s, x, ldx, T, cols, sc->xs, ldxs);
    auto go = [&](auto kern, int smem) {
        launch_pdl(kern, dim3((unsigned)blocks), dim3(WS_THREADS), (size_t)smem, s, maps, qa);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    };
#define QS_GO(BN, BITS) go(k_wgmma_qstream<BN, BITS>, qs_shape<BN, BITS>::SMEM)
    if (w0->bits == 8) {
        switch (bn) {
        case 8: return QS_GO(8, 8);
        case 16: return QS_GO(16, 8);
        case 32: return QS_GO(32, 8);
        case 64: return QS_GO(64, 8);
        default: return QS_GO(128, 8);
        }
    }
    switch (bn) {
    case 8: return QS_GO(8, 4);
    case 16: return QS_GO(16, 4);
    case 32: return QS_GO(32, 4);
    case 64: return QS_GO(64, 4);
    default: return QS_GO(128, 4);
    }
#undef QS_GO
}
