/* ==== Test helpers: a CPU backend and forward contexts ====
 * Tests take the CPU backend's parameters from the environment as the CLI does
 * (STRAND_KERNELS, STRAND_THREADS, STRAND_PACK=0), so tests/kernel_paths_test.sh can run the
 * fixture tests on every kernel set and layout. */
#ifndef ST_TESTS_KIT_H
#define ST_TESTS_KIT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda.h"
#include "core/threadpool.h"
#include "engine/batch.h"
#include "engine/cache.h"
#include "kernels/kernels.h"
#include "model/forward.h"

/* The environment's CPU parameters. */
__attribute__((unused)) static st_cpu_params kit_cpu_params(void) {
    st_cpu_params p = st_cpu_default_params();
    p.kernels = st_kernels_select(getenv("STRAND_KERNELS"));
    p.n_threads = st_threads_parse(getenv("STRAND_THREADS"));
    const char *pack = getenv("STRAND_PACK");
    p.pack = !(pack && strcmp(pack, "0") == 0);
    return p;
}

/* 1 when the environment asks for the CUDA backend (STRAND_DEVICE=cuda: tests/gpu_test.sh). */
__attribute__((unused)) static int kit_on_cuda(void) {
    const char *d = getenv("STRAND_DEVICE");
    return d && !strcmp(d, "cuda");
}

/* A backend for m: the CPU with p, or with the environment's parameters when p is NULL (or
 * the CUDA backend when p is NULL and STRAND_DEVICE=cuda). NULL on error. */
__attribute__((unused)) static st_backend *kit_backend(const st_model *m, const st_cpu_params *p,
                                                       st_error *err) {
    st_cpu_params e = kit_cpu_params();
    st_backend *b = NULL;
    if (!p && kit_on_cuda()) {
        if (st_backend_cuda_create(m, NULL, &b, err) != ST_OK) return NULL;
        return b;
    }
    if (st_backend_cpu_create(m, p ? p : &e, NULL, &b, err) != ST_OK) return NULL;
    return b;
}

/* The largest error of rows[V] a against b, each row's relative to its largest |b| (and at
 * least 1): max over rows of max |a - b| / max(1, max |b|); NaN sticks. */
__attribute__((unused)) static double kit_row_err(const float *a, const float *b, int64_t rows, int64_t V) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = 1, d = 0;
        for (int64_t j = 0; j < V; j++) {
            const double bv = fabs((double)b[r * V + j]);
            if (bv > mx) mx = bv;
        }
        for (int64_t j = 0; j < V; j++) {
            const double e = fabs((double)a[r * V + j] - (double)b[r * V + j]);
            if (!(e <= d)) d = e;
        }
        if (!(d / mx <= worst)) worst = d / mx;
    }
    return worst;
}

/* A forward context on b for the cache's sequences, max_tokens per step. */
__attribute__((unused)) static st_status kit_fwd(st_backend *b, const st_cache *c, int max_tokens,
                                                 st_fwd **out, st_error *err) {
    st_ctx_params xp = st_cache_ctx_params(c, max_tokens);
    return st_fwd_create(b, &xp, out, err);
}

/* A CPU backend for m with the environment's parameters (*be, to destroy after *out) and a
 * forward context on it for the cache's sequences. */
__attribute__((unused)) static st_status kit_fwd_new(const st_model *m, const st_cache *c, int max_tokens,
                                                     st_backend **be, st_fwd **out, st_error *err) {
    *out = NULL;
    if (!(*be = kit_backend(m, NULL, err))) return err && err->status ? err->status : ST_ERR_ARG;
    return kit_fwd(*be, c, max_tokens, out, err);
}

#endif /* ST_TESTS_KIT_H */
