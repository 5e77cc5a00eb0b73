/* ==== Compute kernels: the interface every backend implements ====
 *
 * A kernel set is a table of function pointers. The scalar reference (kernels/cpu/ref.c) is
 * the oracle every faster variant is tested against (tests/test_kernels.c). The CPU sets are
 *   ref         scalar C, fp32 accumulation in index order
 *   avx2        AVX2 + FMA + F16C, fp32 activations, weights converted in registers
 *   avx512      AVX-512 F/BW/VL/DQ, same numerics scheme with 16 lanes
 *   amx         avx512, but bf16 weights are multiplied in AMX tiles against activations
 *               split into three bf16 parts (hi + mid + lo: fp32 accuracy)
 * AVX512-BF16 (vdpbf16ps) is detected but not used: on the development CPU (Xeon, Emerald
 * Rapids class) it retires at a quarter of the FMA rate, so even plain bf16 activations are
 * slower than fp32 FMA on converted weights, and plain bf16 activations miss the fixtures'
 * 1e-3 bound (8e-3 to 0.7 relative measured on the tiny fixtures); a hi + lo split passes
 * the bound but costs two vdpbf16ps per chunk, slower still than fp32 FMA.
 * and one is chosen at run time from the CPU's features (st_kernels_select); no file is built
 * for the host CPU, each SIMD file gets its own target flags (Makefile).
 *
 * Batch invariance (every set): the value a kernel computes for one token (one row of x, one
 * query, one state) depends only on that token's inputs and the shapes of the model, never on
 * how many other tokens share the call, the row range [r0, r1) or the thread that runs it.
 * Kernels may choose different loop structures by the number of tokens, but each must then
 * produce the same bits (same products, same summation order). This is what makes a
 * sequence's result identical alone and in any batch.
 */
#ifndef ST_KERNELS_KERNELS_H
#define ST_KERNELS_KERNELS_H

#include <stdint.h>

#include "tensor/matrix.h"

typedef struct st_kernels {
    const char *name;
    /* the matrix packings (ST_WPACK_BIT mask, tensor/matrix.h) this set has code for; the
     * ones this CPU runs are st_kernels_packs(set), and the CPU backend packs its matrices for
     * its set. A set
     * reads a packed matrix's packed copy when it knows the packing, else the original: per
     * matrix one layout for every token count, so batch invariance holds either way. */
    unsigned packs;
    /* y[t*ldy + r] = sum_c W[r][c] * x[t*ldx + c] for rows r in [r0, r1) and tokens
     * t in [0, n_tok). scratch: at least st_kernels_matmul_scratch(W->cols) floats, private
     * to the caller (one per thread), 64-byte aligned. */
    void (*matmul)(const st_matrix *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
                   int64_t ldy, int64_t r0, int64_t r1, float *scratch);
    /* y[q*ldy + j] += sum_{p < n_pos} a[q*lda + p] * v[p*ldv + j] for q < n_q, j < n, summed
     * in increasing p for every output. v is fp32, or bf16 when v_bf16 (uint16_t rows); ldv
     * in elements. (Attention: probabilities times V; GDN chunks: coefficients times rows.) */
    void (*accum_rows)(const void *v, int v_bf16, int64_t ldv, int64_t n_pos, const float *a,
                       int64_t lda, int64_t n_q, float *y, int64_t ldy, int64_t n);
    /* x[i] = exp(x[i] - m) for i < n; returns their sum. */
    float (*exp_sum)(float *x, int64_t n, float m);
    /* g[i] = silu(g[i]) * u[i] (u NULL: silu(g[i])) for i < n. */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* Causal depthwise convolution step of n channels (spec/text-model.md 4.6, step 3) with
     * SiLU: out[c] = silu(sum_{j < K-1} w[j][c] state[j][c] + w[K-1][c] m[c]); then the state
     * rows move up one and m becomes the last row. w: [K][ldw] taps (tap K-1 multiplies the
     * current input), state: [K-1][lds] oldest first. */
    void (*conv_silu)(const float *w, int64_t ldw, int K, float *state, int64_t lds,
                      const float *m, float *out, int64_t n);
    /* One delta-rule step of one value head (spec/text-model.md 4.7, per-timestep form):
     * S [Dv][Dk] (row i predicts v[i]) is decayed by alpha, corrected towards v along k with
     * rate beta, and read with q: o[i] = (S' q)[i]. */
    void (*gdn_step)(float *S, int64_t Dv, int64_t Dk, const float *q, const float *k,
                     const float *v, float alpha, float beta, float *o);
} st_kernels;

/* The packings of k->packs this CPU runs (Q8_V16 needs AVX512-VNNI). */
unsigned st_kernels_packs(const st_kernels *k);

/* Floats of scratch one matmul call needs for a matrix of `cols` columns (any kernel set). */
int64_t st_kernels_matmul_scratch(int64_t cols);

/* The scalar reference kernels. */
const st_kernels *st_kernels_ref(void);

/* A kernel set by name ("ref", "avx2", "avx512", "amx"); NULL when the name is unknown or
 * this CPU (and OS) cannot run it. "amx-emulated" (not listed, never chosen) is the amx set
 * with the tile instructions emulated in C, for testing the AMX logic without AMX. */
const st_kernels *st_kernels_by_name(const char *name);

/* Every known name, NULL-terminated (available or not), in increasing preference. */
const char *const *st_kernels_names(void);

/* The best set this CPU runs: amx, else avx512, else avx2, else ref. */
const st_kernels *st_kernels_best(void);

/* The set called `name` (a name above, or NULL, "" or "auto" for st_kernels_best()); an
 * unavailable or unknown name warns and falls back to the best. (apps/ pass $STRAND_KERNELS.) */
const st_kernels *st_kernels_select(const char *name);

/* CPU features the dispatcher saw (for reports). */
typedef struct st_cpu_features {
    int avx2, fma, f16c;             /* and the OS saves ymm state */
    int avx512f, avx512bw, avx512vl, avx512dq; /* and the OS saves zmm state */
    int avx512bf16, avx512vnni;
    int amx_bf16, amx_tile;          /* CPUID bits */
    int amx_usable;                  /* CPUID + XCR0 + arch_prctl permission granted */
} st_cpu_features;
const st_cpu_features *st_cpu_get_features(void);

#endif /* ST_KERNELS_KERNELS_H */
