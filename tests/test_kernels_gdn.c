/* ==== The chunked delta rule against the per-timestep form, through the forward pass ====
 * On fixture models (Gated DeltaNet layers with 1 and 2 value heads per key head), for a
 * 300-token prompt and every kernel set this CPU runs:
 *   - one call with the chunked form (4 whole 64-token chunks + a 44-token tail),
 *   - one call with the per-timestep form only (st_cpu_params.gdn_chunked = 0),
 *   - token by token (always per-timestep),
 * all logits within 1e-5 of each other relative to the row's largest |logit|; and a prompt
 * split at a multiple of 64 gives the one-call bits exactly (chunks sit on absolute
 * positions). The fixtures' reference comparison of the same prompts is in test_fixtures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "golden.h"
#include "model/forward.h"
#include "kit.h"
#include "tap.h"

enum { N = 300 };

/* logits of all N positions, fed in pieces of `piece` tokens */
static float *run(const st_model *m, const st_kernels *k, int chunked, const int32_t *ids,
                  int piece) {
    const int64_t V = m->cfg.vocab_size;
    float *lg = calloc((size_t)N * (size_t)V, sizeof(float));
    st_cache_params cp = st_cache_default_params();
    cp.max_seq_len = N;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    st_error err = {0};
    st_cpu_params bp = kit_cpu_params();
    bp.kernels = k;
    bp.gdn_chunked = chunked;
    st_seq s = {.slot = -1};
    st_status st = st_cache_create(m, &cp, &c, &err);
    if (st == ST_OK && !(be = kit_backend(m, &bp, &err))) st = ST_ERR_ARG;
    if (st == ST_OK) st = kit_fwd(be, c, piece, &f, &err);
    if (st == ST_OK) st = st_cache_seq_start(c, &s, &err);
    for (int i = 0; i < N && st == ST_OK; i += piece) {
        st_batch_item it = {&s, ids + i, N - i < piece ? N - i : piece, ST_LOGITS_ALL};
        st = st_batch_run(c, f, &it, 1, lg + (size_t)i * (size_t)V, &err);
    }
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_backend_destroy(be);
    if (st != ST_OK) {
        printf("# run failed: %s\n", err.msg);
        free(lg);
        return NULL;
    }
    return lg;
}

static void test_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    const int64_t V = m->cfg.vocab_size;
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % V);
    const char *const *names = st_kernels_names();
    for (int i = 0; names[i]; i++) {
        const st_kernels *k = st_kernels_by_name(names[i]);
        if (!k) continue;
        float *chunked = run(m, k, 1, ids, N), *steps = run(m, k, 0, ids, N);
        float *single = run(m, k, 1, ids, 1), *split = run(m, k, 1, ids, 128);
        if (CHECK(chunked && steps && single && split, "%s %s: the four runs complete", dir, names[i])) {
            double e1 = rel_rows_err(chunked, steps, N, V), e2 = rel_rows_err(chunked, single, N, V);
            CHECK(e1 < 1e-5 && e2 < 1e-5,
                  "%s %s: chunked delta rule = per-timestep form (rel %.2e) = token by token (rel %.2e)",
                  dir, names[i], e1, e2);
            CHECK(memcmp(chunked, split, (size_t)N * (size_t)V * sizeof(float)) == 0,
                  "%s %s: prompt split at 128 gives the one-call logits bit for bit", dir, names[i]);
            printf("# %s %s: chunked and per-timestep logits %s\n", dir, names[i],
                   memcmp(chunked, steps, (size_t)N * (size_t)V * sizeof(float)) ? "differ in the last bits (both forms ran)"
                                                                               : "are identical");
        }
        free(chunked);
        free(steps);
        free(single);
        free(split);
    }
    st_model_free(m);
}

int main(void) {
    test_model("tiny-a");
    test_model("tiny-b");
    return tap_done();
}
