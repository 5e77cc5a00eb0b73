/* ==== cuBLASLt for the CUDA backend (see blas.h) ==== */
#define _POSIX_C_SOURCE 200809L
#include "backend/cuda/blas.h"
#include "backend/cuda/cu_dl.h"

#include <dlfcn.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* cublasLt.h declares f() for f(void) */
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the library's entry points this file calls (the descriptors are initialized in place, in
 * the caller's stack, through the *_internal functions the header's inline *Init call) */
typedef struct blas_api {
    cublasStatus_t (*create)(cublasLtHandle_t *);
    cublasStatus_t (*destroy)(cublasLtHandle_t);
    size_t (*version)(void);
    cublasStatus_t (*desc_init)(cublasLtMatmulDesc_t, size_t, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
    cublasStatus_t (*layout_init)(cublasLtMatrixLayout_t, size_t, cudaDataType, uint64_t, uint64_t, int64_t);
    cublasStatus_t (*pref_init)(cublasLtMatmulPreference_t, size_t);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t);
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                             const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                             void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
} blas_api;

/* The library, opened once a process and never closed (its kernels may be loaded). */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void *g_lib;
static blas_api g_api;
static char g_why[300];

static void open_blas(void) {
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !g_lib; i++) g_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        snprintf(g_why, sizeof g_why, "libcublasLt.so.13 could not be opened (%.200s)", dlerror());
        return;
    }
    const cu_dl_sym syms[] = {
        {(void **)&g_api.create, "cublasLtCreate"},
        {(void **)&g_api.destroy, "cublasLtDestroy"},
        {(void **)&g_api.version, "cublasLtGetVersion"},
        {(void **)&g_api.desc_init, "cublasLtMatmulDescInit_internal"},
        {(void **)&g_api.desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&g_api.layout_init, "cublasLtMatrixLayoutInit_internal"},
        {(void **)&g_api.pref_init, "cublasLtMatmulPreferenceInit_internal"},
        {(void **)&g_api.pref_set, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&g_api.heuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&g_api.matmul, "cublasLtMatmul"},
    };
    if (cu_dl_resolve(g_lib, syms, sizeof syms / sizeof syms[0], "libcublasLt", g_why, sizeof g_why) != 0)
        g_lib = NULL; /* left open: its code may be mapped by now */
}

/* a shape the heuristic was asked about, and its answer */
typedef struct blas_pick {
    int64_t rows, cols, T, ldw, ldxs, ldy;
    int y_bf16;        /* the output's type: bf16 (1) or fp32 (0) */
    uint32_t align[3]; /* w's, xs's and y's alignment, bytes (the algorithm depends on them) */
    int ok;         /* 0: the library offered no algorithm (the caller's kernel, every time) */
    cublasLtMatmulAlgo_t algo;
    size_t ws; /* the algorithm's workspace */
} blas_pick;

struct cu_blas {
    blas_api f;
    cublasLtHandle_t h; /* owned */
    blas_pick cache[CU_BLAS_CACHE];
    int n_cache, next; /* entries in use; the one to replace next when full */
    cublasLtMatmulHeuristicResult_t tries[CU_BLAS_TRY]; /* cu_blas_try_count's, n_tries of them */
    int n_tries;
};

cu_blas *cu_blas_create(char *why, size_t cap) {
    pthread_once(&g_once, open_blas);
    if (!g_lib) {
        snprintf(why, cap, "%s", g_why);
        return NULL;
    }
    cu_blas *b = (cu_blas *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    b->f = g_api;
    const cublasStatus_t st = b->f.create(&b->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, cap, "cublasLtCreate failed (status %d)", (int)st);
        free(b);
        return NULL;
    }
    return b;
}

void cu_blas_destroy(cu_blas *b) {
    if (!b) return;
    b->f.destroy(b->h);
    free(b);
}

void cu_blas_describe(const cu_blas *b, char *buf, size_t cap) {
    const size_t v = b->f.version(); /* major * 10000 + minor * 100 + patch */
    snprintf(buf, cap, "cuBLASLt %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
}

/* the largest power of two (up to 256) that divides the address */
static uint32_t align_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

/* the three layouts and the operation, initialized in the caller's storage: in cuBLASLt's
 * column-major terms y (rows x T, ld ldy) = op_T(w as cols x rows, ld ldw) . xs (cols x T, ld ldxs) */
typedef struct blas_op {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t a, b, c;
} blas_op;

static int op_init(cu_blas *bl, blas_op *o, int64_t rows, int64_t cols, int64_t ldw, int64_t T, int64_t ldxs, int64_t ldy,
                   int y_bf16) {
    const cublasOperation_t ta = CUBLAS_OP_T;
    cublasStatus_t st = bl->f.desc_init(&o->desc, sizeof o->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS) st = bl->f.desc_set(&o->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = bl->f.layout_init(&o->a, sizeof o->a, CUDA_R_16BF, (uint64_t)cols, (uint64_t)rows, ldw);
    if (st == CUBLAS_STATUS_SUCCESS) st = bl->f.layout_init(&o->b, sizeof o->b, CUDA_R_16BF, (uint64_t)cols, (uint64_t)T, ldxs);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = bl->f.layout_init(&o->c, sizeof o->c, y_bf16 ? CUDA_R_16BF : CUDA_R_32F, (uint64_t)rows, (uint64_t)T, ldy);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* the heuristic's first `cap` algorithms for the operation (the operands' alignments and the
 * workspace as given) into r: how many, 0 where it offers none or fails */
static int ask_heuristic(cu_blas *bl, blas_op *o, const uint32_t align[3], size_t ws_bytes, int cap,
                         cublasLtMatmulHeuristicResult_t *r) {
    cublasLtMatmulPreferenceOpaque_t pref;
    const uint64_t wsb = ws_bytes;
    cublasStatus_t st = bl->f.pref_init(&pref, sizeof pref);
    if (st == CUBLAS_STATUS_SUCCESS) st = bl->f.pref_set(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    const cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    /* A is w, B is xs, C and D are y */
    for (size_t i = 0; i < sizeof al / sizeof al[0] && st == CUBLAS_STATUS_SUCCESS; i++)
        st = bl->f.pref_set(&pref, al[i], &align[i < 2 ? i : 2], sizeof align[0]);
    memset(r, 0, (size_t)cap * sizeof *r);
    int n = 0;
    if (st == CUBLAS_STATUS_SUCCESS) st = bl->f.heuristic(bl->h, &o->desc, &o->a, &o->b, &o->c, &o->c, &pref, cap, r, &n);
    if (st != CUBLAS_STATUS_SUCCESS || n < 0) return 0;
    int ok = 0; /* the usable ones, in order */
    for (int i = 0; i < n && i < cap; i++)
        if (r[i].state == CUBLAS_STATUS_SUCCESS) r[ok++] = r[i];
    return ok;
}

/* the cached pick for the shape, asking the heuristic on a miss (a refusal or a failure is
 * kept too: the shape then takes the caller's kernel without asking again) */
static const blas_pick *pick_for(cu_blas *bl, blas_op *o, int64_t rows, int64_t cols, int64_t T, int64_t ldw,
                                 int64_t ldxs, int64_t ldy, int y_bf16, const uint32_t align[3], size_t ws_bytes) {
    for (int i = 0; i < bl->n_cache; i++) {
        const blas_pick *p = &bl->cache[i];
        if (p->rows == rows && p->cols == cols && p->T == T && p->ldw == ldw && p->ldxs == ldxs && p->ldy == ldy &&
            p->y_bf16 == y_bf16 &&
            p->align[0] == align[0] && p->align[1] == align[1] && p->align[2] == align[2] && p->ws <= ws_bytes)
            return p;
    }
    cublasLtMatmulHeuristicResult_t r;
    const int n = ask_heuristic(bl, o, align, ws_bytes, 1, &r);
    blas_pick *p;
    if (bl->n_cache < CU_BLAS_CACHE) p = &bl->cache[bl->n_cache++];
    else p = &bl->cache[bl->next], bl->next = (bl->next + 1) % CU_BLAS_CACHE;
    p->rows = rows, p->cols = cols, p->T = T, p->ldw = ldw, p->ldxs = ldxs, p->ldy = ldy, p->y_bf16 = y_bf16;
    memcpy(p->align, align, sizeof p->align);
    p->ok = n > 0;
    p->algo = r.algo;
    p->ws = p->ok ? r.workspaceSize : 0;
    return p;
}

/* y (+)= the operation o with algorithm algo (accumulate: beta 1, else 0), enqueued on s */
static int run_algo(cu_blas *bl, cudaStream_t s, blas_op *o, const cublasLtMatmulAlgo_t *algo, const uint16_t *w,
                    const uint16_t *xs, void *y, int accumulate, void *ws, size_t ws_bytes) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return bl->f.matmul(bl->h, &o->desc, &one, w, &o->a, xs, &o->b, &beta, y, &o->c, y, &o->c, algo, ws, ws_bytes, s) ==
                   CUBLAS_STATUS_SUCCESS
               ? 0
               : -1;
}

int cu_blas_gemm(cu_blas *bl, cudaStream_t s, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                 const uint16_t *xs, int64_t ldxs, int64_t T, float *y, int64_t ldy, int accumulate, void *ws,
                 size_t ws_bytes) {
    return cu_blas_gemm_to(bl, s, w, ldw, rows, cols, xs, ldxs, T, y, ldy, 0, accumulate, ws, ws_bytes);
}

int cu_blas_gemm_to(cu_blas *bl, cudaStream_t s, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                    const uint16_t *xs, int64_t ldxs, int64_t T, void *y, int64_t ldy, int y_bf16, int accumulate,
                    void *ws, size_t ws_bytes) {
    if (!bl || rows < 1 || cols < 1 || T < 1 || ldw < cols || ldxs < cols || ldy < rows) return -1;
    const uint32_t align[3] = {align_of(w), align_of(xs), align_of(y)};
    blas_op o;
    if (op_init(bl, &o, rows, cols, ldw, T, ldxs, ldy, y_bf16 != 0) != 0) return -1;
    const blas_pick *p = pick_for(bl, &o, rows, cols, T, ldw, ldxs, ldy, y_bf16 != 0, align, ws_bytes);
    if (!p->ok) return -1;
    /* (the heuristic is asked without alpha and beta: a shape's algorithm serves both) */
    return run_algo(bl, s, &o, &p->algo, w, xs, y, accumulate, ws, ws_bytes);
}

int cu_blas_try_count(cu_blas *bl, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols, const uint16_t *xs,
                      int64_t ldxs, int64_t T, const void *y, int64_t ldy, int y_bf16, size_t ws_bytes, int cap) {
    bl->n_tries = 0;
    if (rows < 1 || cols < 1 || T < 1 || ldw < cols || ldxs < cols || ldy < rows) return 0;
    const uint32_t align[3] = {align_of(w), align_of(xs), align_of(y)};
    blas_op o;
    if (op_init(bl, &o, rows, cols, ldw, T, ldxs, ldy, y_bf16 != 0) != 0) return 0;
    bl->n_tries = ask_heuristic(bl, &o, align, ws_bytes, cap < CU_BLAS_TRY ? cap : CU_BLAS_TRY, bl->tries);
    return bl->n_tries;
}

int cu_blas_gemm_try(cu_blas *bl, cudaStream_t s, int k, const uint16_t *w, int64_t ldw, int64_t rows, int64_t cols,
                     const uint16_t *xs, int64_t ldxs, int64_t T, void *y, int64_t ldy, int y_bf16, void *ws,
                     size_t ws_bytes) {
    if (k < 0 || k >= bl->n_tries || bl->tries[k].workspaceSize > ws_bytes) return -1;
    blas_op o;
    if (op_init(bl, &o, rows, cols, ldw, T, ldxs, ldy, y_bf16 != 0) != 0) return -1;
    return run_algo(bl, s, &o, &bl->tries[k].algo, w, xs, y, 0, ws, ws_bytes);
}
