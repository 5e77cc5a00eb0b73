/* ==== Hopper's warpgroup MMA (wgmma): what its users share (matmul_wgmma.cu,
 * attention_wgmma.cu; sm_90a code alone) ====
 *
 * The shared-memory operands are bf16 under the 64-byte swizzle: rows of 64 bytes (32 values)
 * whose 16-byte pieces are permuted by the row's address (piece i of the row at byte offset
 * r * 64 sits at piece i ^ ((r >> 1) & 3), wg_sw64), 8 rows (512 bytes) an atom, each region
 * aligned to 512 bytes. TMA writes it so with CU_TENSOR_MAP_SWIZZLE_64B; threads write it with
 * wg_sw64's offsets.
 *   K-major (wg_desc): an operand's rows (M or N) are the 64-byte rows, K along them; a k16
 *     step is 32 bytes into the row, the next 32 columns another region.
 *   MN-major (wg_desc_mn, with the MMA's transpose bit): the 64-byte rows run along M or N
 *     (32 of them a row), one row a k; 8 k-rows 512 bytes apart (the stride offset), the next
 *     32 of M or N `lbo` bytes on (the leading offset); a k16 step is 16 rows (1,024 bytes).
 * k_wgmma may also read its activations K-major under the 128-byte swizzle (wg_desc128: rows
 * of 128 bytes, piece i at i ^ (r & 7), 8 rows 1,024 bytes an atom, regions aligned to 1,024).
 */
#ifndef ST_BACKEND_CUDA_WGMMA_CUH
#define ST_BACKEND_CUDA_WGMMA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cu_common.cuh"

/* whether the current device runs sm_90a code (compute capability 9.0 alone) */
static inline bool wg_device_runs_sm90a(void) {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
           minor == 0;
}


/* a shared-memory matrix descriptor: K-major rows of 64 bytes under the 64-byte swizzle, 8-row
 * groups 512 bytes apart (the leading offset is unused in this layout) */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(512 >> 4) << 32 | (uint64_t)2 << 62;
}

/* K-major under the 128-byte swizzle: 128-byte rows (64 columns), 8 rows 1,024 bytes apart;
 * a k16 step is 32 bytes on (the swizzle applied to the address as TMA wrote it) */
__device__ __forceinline__ uint64_t wg_desc128(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* MN-major under the 64-byte swizzle: the next 32 of M or N lbo bytes on, the next 8 k-rows
 * sbo bytes on (512 where they follow each other) */
__device__ __forceinline__ uint64_t wg_desc_mn(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)2 << 62;
}

/* a warpgroup's MMAs: the fence before any that read registers written since, a group's
 * commit, and the wait until at most N groups are in flight */
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* accumulators touched only on this side of a wait or fence (the compiler may not move their
 * reads or writes across it) */
template <int N>
__device__ __forceinline__ void wg_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* the byte offset of 16-byte piece i (0 .. 4 * regions - 1) of row r in a 64-byte-swizzled
 * operand of `rows` rows a 32-column region */
__device__ __forceinline__ uint32_t wg_sw64(int rows, int r, int i) {
    return (uint32_t)((i >> 2) * rows * 64 + r * 64 + (((i & 3) ^ ((r >> 1) & 3)) << 4));
}

#endif
