/* ==== CUDA kernels: a prompt's attention on Hopper's warpgroup MMA (k_attn_fw), `bf16` ====
 *
 * The work of k_attn_fa (attention.cu) with its products on wgmma. A block takes FW_ROWS query
 * rows, each a (token, query head) of one tile of an item's consecutive tokens and the query
 * heads of one KV head (the same tiles as k_attn_fa's); the queries are scaled by log2(e) /
 * sqrt(hd) and rounded to bf16, the positions go by in chunks of FW_CH whose K and V are
 * rounded to bf16 in shared memory (the next chunk in flight from a bf16 pool), the running
 * max and sum go per row and the weights are rounded to bf16 for P V. Each warpgroup takes 64
 * rows: S = Q K^T as m64n64k16 products with both operands read from shared memory (K-major),
 * P V as m64n64k16 products a 64-dim slab of the output, P from the registers that held S
 * (an accumulator's fragments are an A operand's) and V read from shared memory transposed
 * (MN-major). k_attn_fa's mma.sync products are 16 rows a warp, each warp loading its own K
 * and V fragments with ldmatrix: four times the shared-memory reads for the same products.
 *
 * Shared memory (wgmma.cuh's 64-byte swizzle): Q [hd / 32][FW_ROWS][32], K twice and V twice
 * (three times where P V runs on into the next chunk) [hd / 32][FW_CH][32], so a warpgroup's Q rows and a chunk's positions are the K-major rows
 * of S's operands and V's positions are the k-rows of the MN-major B of P V.
 *
 * Built for sm_90a alone; cu_attn_fw_init says whether the device runs it. `bf16` only: the
 * sums are in the tensor cores' order (not k_attn_fa's bits, not batch-invariant either).
 */
#include "backend/cuda/attention.cuh"
#include "backend/cuda/wgmma.cuh"

#define FW_WGS 2                     /* warpgroups a block */
#define FW_ROWS (64 * FW_WGS)        /* query rows a block */
#define FW_CH 64                     /* positions a chunk */
#define FW_THREADS (128 * FW_WGS)
/* V's descriptor offsets (wgmma.cuh's MN-major reading of the PTX ISA's canonical layouts; a
 * build with them swapped is the first thing to try should mmv_bench fa disagree) */
#ifndef FW_V_LBO
#define FW_V_LBO (FW_CH * 64)
#endif
#ifndef FW_V_SBO
#define FW_V_SBO 512
#endif

/* where P V's products run on into the next chunk (the bf16 pool alone): V held three times */
#ifndef FW_PV_ASYNC
#define FW_PV_ASYNC 1
#endif

template <int HD>
static constexpr size_t fw_smem() {
    /* alignment, Q, K twice and V up to three times, the rows' positions */
    return 1024 + (size_t)(FW_ROWS + 5 * FW_CH) * HD * 2 + FW_ROWS * 8;
}

/* the 32 accumulators of an m64n64 product: the operand list and the instruction's registers */
#define FW_ACC32(d)                                                                                            \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),     \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),    \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FW_D32                                                                                                 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"

/* d (+)= A B: 64 rows by 64 columns over 16, A and B K-major in shared memory; acc 0: d = A B */
__device__ __forceinline__ void wg_mma64_ss(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FW_D32 ", %32, %33, p, 1, 1, 0, 0;\n"
                 "}\n"
                 : FW_ACC32(d)
                 : "l"(da), "l"(db), "r"(acc)
                 : "memory");
}

/* d += A B: A (64 rows by 16, bf16 pairs) in registers as an mma.sync m16n8k16 A operand a
 * warp, B MN-major in shared memory (the transpose bit) */
__device__ __forceinline__ void wg_mma64_rs_t(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FW_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
                 "}\n"
                 : FW_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}

/* The 16-byte piece i of a load into an operand of `rows` rows: a warp's 32 take 8 rows' 4
 * pieces of one 32-dim region, 512 contiguous bytes of shared memory (no bank conflicts; a
 * row's pieces in turn would put a warp's stores in 8 regions on the same banks) */
__device__ __forceinline__ void fw_piece(int i, int rows, int *r, int *pc) {
    *r = (i >> 2) % rows, *pc = ((i >> 2) / rows) * 4 + (i & 3);
}

/* chunk c's K and V (positions c0 .. c0 + FW_CH - 1, zeros past last) into kb and vb, swizzled
 * (fw_piece's layout: kv_chunk_load's thread i writes fw_piece's pieces i, i + FW_THREADS, ...) */
template <int HD, bool BF16KV>
__device__ __forceinline__ void fw_load(const cu_kv &kv, const cu_plan &p, int it, int li, int h, int64_t c0,
                                        int64_t last, uint8_t *kb, uint8_t *vb) {
    static_assert(FW_THREADS == 256 && FW_CH == 64, "kv_chunk_load's threads and rows");
    kv_chunk_load<HD, BF16KV>(kv, p, it, li, h, c0, last, kb, vb, [](int r, int pc) { return wg_sw64(FW_CH, r, pc); });
}

/* the threads' shared-memory writes seen by the tensor cores' reads (wgmma's async proxy) */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* PVA (a bf16 pool): chunk c's P V products are left running while the next chunk's wait,
 * barrier and Q K^T products are issued (the tensor cores never idle across the barrier);
 * they are waited for with Q K^T's, before the softmax rescales the output. V then takes a
 * third buffer, as chunk c + 2's copy starts while chunk c's P V may still read its V. */
template <int HD, bool BF16KV, bool PVA>
__global__ void __launch_bounds__(FW_THREADS, 1) k_attn_fw(cu_plan p, cu_attn_args a, cu_kv kv, int tt) {
    pdl_wait();
    static_assert(BF16KV || !PVA, "P V runs on only where chunks are copied in ahead");
    constexpr int P8 = HD / 8, CB = FW_CH * HD * 2, NS = HD / 64, NV = PVA ? 3 : 2;
    static_assert(FW_CH == 64, "fa_softmax takes chunks of 64 positions");
    extern __shared__ uint8_t fw_raw[];
    uint8_t *qs = fw_raw + ((1024 - (smem_u32(fw_raw) & 1023)) & 1023); /* the swizzle's atoms aligned */
    uint8_t *ks = qs + FW_ROWS * HD * 2, *vs = ks + 2 * CB;
    int64_t *qpos = (int64_t *)(vs + NV * CB); /* [FW_ROWS] each row's position */
    const int G = a.nh / a.nkv, h = blockIdx.y, tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3;
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    int64_t t0 = 0, nt = 0;
    const int it = att_tile_at(p, tt, (int64_t)gridDim.x - 1 - blockIdx.x, &t0, &nt); /* the longest tiles first */
    if (it < 0) return;
    const int rows = (int)nt * G;
    const int64_t pos_first = p.pos0[it] + (t0 - p.item_t0[it]), pos_last = pos_first + nt - 1;
    const float scale = 1.4426950408889634f / sqrtf((float)HD); /* scores in units of log2 */
    if (BF16KV) fw_load<HD, true>(kv, p, it, a.li, h, 0, pos_last, ks, vs); /* chunk 0 in flight */
    cp_async_commit();
    for (int i = tid; i < FW_ROWS * P8; i += FW_THREADS) {
        int r, pc;
        fw_piece(i, FW_ROWS, &r, &pc);
        *(uint4 *)(qs + wg_sw64(FW_ROWS, r, pc)) = fa_q8(a, HD, t0, r, rows, G, h, pc * 8, scale);
    }
    /* rows past the tile take its last token's position: finite, never written */
    for (int r = tid; r < FW_ROWS; r += FW_THREADS) qpos[r] = pos_first + (r < rows ? r / G : nt - 1);
    __syncthreads();
    const int row0 = 64 * wg + 16 * warp + g; /* this thread's rows: row0 and row0 + 8 */
    const int64_t my_pos0 = qpos[row0], my_pos1 = qpos[row0 + 8];
    float o[NS][32]; /* slab j: o[j][4n + e] is row row0 (+ 8 for e >= 2), dim 64 j + 8 n + 2 t + (e & 1) */
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int i = 0; i < 32; i++) o[j][i] = 0.0f;
    float s[FW_CH / 8][4]; /* S's fragments (fa_softmax's layout), as wgmma's accumulators s32 */
    float(&s32)[32] = reinterpret_cast<float(&)[32]>(s);
#pragma unroll
    for (int i = 0; i < 32; i++) s32[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const uint32_t q_a = smem_u32(qs) + wg * 64 * 64;
    const int nch = (int)(pos_last / FW_CH) + 1;
    const bool wg_live = 64 * wg < rows; /* a warpgroup of padding rows writes nothing */
    for (int c = 0; c < nch; c++) {
        const int64_t c0 = (int64_t)c * FW_CH;
        uint8_t *kb = ks + (BF16KV ? (c & 1) : 0) * CB, *vb = vs + (BF16KV ? c % NV : 0) * CB;
        const uint32_t k_a = smem_u32(kb), v_a = smem_u32(vb);
        /* S = Q K^T: 64 rows by FW_CH positions (rows past the tile too: their queries are
         * zeros, and a branch around the products would have ptxas serialize them) */
        auto qk = [&]() {
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                wg_mma64_ss(s32, wg_desc(q_a + (kk >> 1) * (FW_ROWS * 64) + (kk & 1) * 32),
                            wg_desc(k_a + (kk >> 1) * (FW_CH * 64) + (kk & 1) * 32), kk > 0);
            wg_commit();
        };
        if (BF16KV) {
            cp_async_wait<0>();
            fence_proxy_async();
            __syncthreads(); /* chunk c is in; every warpgroup is done with chunk c - 1's K and
                              * (PVA: c - 2's) V */
            qk(); /* issued first: the tensor cores work while the next chunk's copies are issued */
            if (c + 1 < nch) /* the next chunk into those buffers, in flight while this one is used */
                fw_load<HD, true>(kv, p, it, a.li, h, c0 + FW_CH, pos_last, ks + ((c + 1) & 1) * CB,
                                  vs + ((c + 1) % NV) * CB);
            cp_async_commit();
        } else {
            __syncthreads(); /* the previous chunk is read */
            fw_load<HD, false>(kv, p, it, a.li, h, c0, pos_last, kb, vb);
            fence_proxy_async();
            __syncthreads();
            qk();
        }
        wg_wait<0>(); /* S (PVA: and chunk c - 1's P V) */
        wg_fence_regs(s32);
        if (PVA) { /* chunk c - 1's outputs (ptxas keeps the weights' registers for its reads) */
#pragma unroll
            for (int j = 0; j < NS; j++) wg_fence_regs(o[j]);
        }
        /* the causal mask where the chunk reaches past a row's position; the softmax */
        uint32_t pa[FW_CH / 16][4]; /* P as the A operand of P V, k steps of 16 positions */
        float al0, al1;
        fa_softmax(s, c0, c0 + FW_CH - 1 > pos_first, my_pos0, my_pos1, t, m0, m1, l0, l1, pa, al0, al1);
        /* the output's rescale only where a row's max moved */
        if (!__all_sync(FULL, al0 == 1.0f && al1 == 1.0f)) {
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int n = 0; n < 8; n++)
                    o[j][4 * n] *= al0, o[j][4 * n + 1] *= al0, o[j][4 * n + 2] *= al1, o[j][4 * n + 3] *= al1;
        }
        /* O += P V: V's chunk as the MN-major B, a k step 16 positions (1,024 bytes), a slab
         * two 32-dim regions (the leading offset: one region, FW_CH rows of 64 bytes) */
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < FW_CH / 16; kk++)
#pragma unroll
            for (int j = 0; j < NS; j++)
                wg_mma64_rs_t(o[j], pa[kk],
                              wg_desc_mn(v_a + kk * 1024 + j * 2 * (FW_CH * 64), FW_V_LBO, FW_V_SBO));
        wg_commit();
        if (!PVA) {
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < NS; j++) wg_fence_regs(o[j]);
        }
    }
    cp_async_wait<0>();
    if (PVA) { /* the last chunk's P V (before any branch: a warp may not leave with products in flight) */
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < NS; j++) wg_fence_regs(o[j]);
    }
    if (!wg_live) return;
    const float inv0 = 1.0f / fa_quad_sum(l0), inv1 = 1.0f / fa_quad_sum(l1);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = row0 + 8 * hf;
        if (r >= rows) continue;
        const float inv = hf ? inv1 : inv0;
#pragma unroll
        for (int j = 0; j < NS; j++)
#pragma unroll
            for (int n = 0; n < 8; n++)
                fa_put(a, HD, t0 + r / G, h * G + r % G, 64 * j + 8 * n + 2 * t, o[j][4 * n + 2 * hf] * inv,
                       o[j][4 * n + 2 * hf + 1] * inv);
    }
}

/* the shared memory of every form for head dims HD: true where the device refuses one */
template <int HD>
static bool fw_attrs() {
    const int n = (int)fw_smem<HD>();
    return cudaFuncSetAttribute(k_attn_fw<HD, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, n) !=
               cudaSuccess ||
           cudaFuncSetAttribute(k_attn_fw<HD, true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, n) !=
               cudaSuccess ||
           cudaFuncSetAttribute(k_attn_fw<HD, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, n) !=
               cudaSuccess;
}

extern "C" int cu_attn_fw_init(int hd) {
    if (!wg_device_runs_sm90a()) return -1;
    const bool bad = hd == 64 ? fw_attrs<64>() : hd == 128 ? fw_attrs<128>() : hd == 256 ? fw_attrs<256>() : true;
    return bad ? -1 : 0;
}

template <int HD>
static void fw_launch_hd(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv, int tt, bool pva) {
    const dim3 grid((unsigned)((p->n_tokens + tt - 1) / tt + p->n_items), (unsigned)a->nkv), blk(FW_THREADS);
    if (!kv->bf16) launch_pdl(k_attn_fw<HD, false, false>, grid, blk, fw_smem<HD>(), s, *p, *a, *kv, tt);
    else if (pva) launch_pdl(k_attn_fw<HD, true, true>, grid, blk, fw_smem<HD>(), s, *p, *a, *kv, tt);
    else launch_pdl(k_attn_fw<HD, true, false>, grid, blk, fw_smem<HD>(), s, *p, *a, *kv, tt);
}

/* k_attn_fw on these heads (-1 where it does not take them); pva: a bf16 pool's P V products
 * left running into the next chunk (mmv_bench fa times both forms) */
static int fw_launch(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv, bool pva) {
    if (p->n_tokens <= 0) return 0;
    const int G = a->nkv > 0 ? a->nh / a->nkv : 0;
    if (G < 1 || G > FW_ROWS || (a->hd != 64 && a->hd != 128 && a->hd != 256)) return -1;
    const int tt = FW_ROWS / G;
    if (a->hd == 64) fw_launch_hd<64>(s, p, a, kv, tt, pva);
    else if (a->hd == 128) fw_launch_hd<128>(s, p, a, kv, tt, pva);
    else fw_launch_hd<256>(s, p, a, kv, tt, pva);
    return 0;
}

extern "C" int cu_attn_fw(cu_stream s, const cu_plan *p, const cu_attn_args *a, const cu_kv *kv) {
    return fw_launch(s, p, a, kv, FW_PV_ASYNC != 0);
}
