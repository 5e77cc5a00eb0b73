/* ==== Shards of a model reproduce the whole model ====
 *
 * For every fixture model and world sizes 2 and 3 (and 4 and 8 on tiny-b, where KV heads and
 * GDN key heads are shared by ranks): each rank's CPU backend computes its shard (st_shard:
 * its query/KV heads, GDN key/value heads, MLP and expert widths), the ranks run the same
 * step plans on threads of one process, and their partial outputs are summed where tensor
 * parallelism all-reduces them (after each mixer's output projection and after each MLP or
 * MoE), over a 70-token prompt (a 64-token delta-rule chunk, KV blocks of 8) and ragged
 * decode steps. Their logits must equal the unsharded model's within 1e-5 (relative to each row's
 * largest logit), and every rank's logits must be the same bits. Where a shape does not
 * split, st_shard_make must refuse with a message naming it. Run with the environment's
 * kernel set (packed) and with the reference kernels on unpacked matrices (column views read
 * in place); see TOL_Q8 for the one integer kernel.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit.h"
#include "model/quantize.h"
#include "tap.h"

#define MAXW 8
#define TOL 1e-5
/* The AVX-512 VNNI kernel for MLX 8-bit matrices (kernels/cpu/q8vnni.c) rounds activations
 * to 21 bits per group of 32-128, so a 1-ulp change of a layer's input (which any other
 * summation order, sharded or not, makes) can move a product by 2^-21 of the group's
 * largest value: 8 times fp32's own rounding. On tiny-b/mlx-q8 the unsharded model's logits
 * move 1.3e-5 between kernel sets. Shards are held to 1e-5 on every fp32 path (the
 * reference, and the SIMD set on unpacked 8-bit matrices) and, on that kernel, to its own
 * accuracy class. */
#define TOL_Q8 1e-4
#define PROMPT 70

typedef struct rank_run {
    st_fwd *f;
    const st_step_plan *plan;
    float *logits;
    st_status st;
    st_error err;
} rank_run;

static void *rank_main(void *arg) {
    rank_run *r = arg;
    r->st = st_fwd_run(r->f, r->plan, r->logits, &r->err);
    return NULL;
}

/* The steps: two sequences' prompts (one in two chunks), then decode steps of both. */
typedef struct step_spec {
    int n_items;
    int seq[2], t0[2], n[2], logits[2];
} step_spec;

static void run_world(const char *dir, const st_model *m, const int32_t *ids, int n_ids, int world,
                      const st_cpu_params *cp, const char *how, double tol) {
    st_error err = {0};
    st_shard sh[MAXW];
    for (int r = 0; r < world; r++)
        if (st_shard_make(m, r, world, &sh[r], &err) != ST_OK) {
            CHECK(err.status == ST_ERR_ARG && strstr(err.msg, "shard:") &&
                      (strstr(err.msg, "do not split") || strstr(err.msg, "quantization groups")),
                  "%s, %d shards: refused with a clear error (%s)", dir, world, err.msg);
            return;
        }
    const int64_t V = m->cfg.vocab_size;
    enum { STEPS = 6, MAXROWS = 2 * PROMPT };
    st_backend *whole = NULL, *be[MAXW] = {0};
    st_fwd *fw = NULL, *fr[MAXW] = {0};
    st_cache *cache = NULL;
    st_cpu_group *g = NULL;
    st_plan_buf pb;
    memset(&pb, 0, sizeof pb);
    float *want = calloc((size_t)MAXROWS * (size_t)V, sizeof(float));
    float *got[MAXW] = {0};
    st_cache_params cpar = st_cache_default_params();
    cpar.n_slots = 2;
    cpar.max_seq_len = 128;
    cpar.block_size = 8;
    st_status st = st_cache_create(m, &cpar, &cache, &err);
    if (st == ST_OK) st = st_backend_cpu_create(m, cp, NULL, &whole, &err);
    if (st == ST_OK) st = kit_fwd(whole, cache, 2 * PROMPT, &fw, &err);
    if (st == ST_OK) st = st_cpu_group_create(world, &g, &err);
    for (int r = 0; r < world && st == ST_OK; r++) {
        st = st_backend_cpu_create(m, cp, &sh[r], &be[r], &err);
        if (st == ST_OK) st = kit_fwd(be[r], cache, 2 * PROMPT, &fr[r], &err);
        if (st == ST_OK) st_bctx_cpu_join(st_fwd_ctx(fr[r]), g, r);
        got[r] = calloc((size_t)MAXROWS * (size_t)V, sizeof(float));
    }
    const st_ctx_params *xp = fw ? st_fwd_params(fw) : NULL;
    if (st == ST_OK) st = st_plan_buf_init(&pb, xp->n_slots, xp->max_tokens, cache->p.n_blocks, &err);
    if (!CHECK(st == ST_OK, "%s, %d shards (%s): backends and contexts (%s)", dir, world, how, err.msg)) goto out;
    {
        st_seq seqs[2];
        for (int i = 0; i < 2; i++) {
            seqs[i].slot = -1;
            st_cache_seq_start(cache, &seqs[i], &err);
        }
        const int half = n_ids / 2;
        step_spec steps[STEPS] = {
            {1, {0, 0}, {0, 0}, {half, 0}, {ST_LOGITS_ALL, 0}},
            {2, {0, 1}, {half, 0}, {n_ids - half, n_ids}, {ST_LOGITS_ALL, ST_LOGITS_LAST}},
            {2, {0, 1}, {1, 2}, {1, 1}, {ST_LOGITS_LAST, ST_LOGITS_LAST}},
            {2, {1, 0}, {3, 4}, {1, 1}, {ST_LOGITS_LAST, ST_LOGITS_LAST}},
            {1, {0, 0}, {5, 0}, {1, 0}, {ST_LOGITS_LAST, 0}},
            {2, {0, 1}, {6, 7}, {3, 2}, {ST_LOGITS_ALL, ST_LOGITS_ALL}},
        };
        double worst = 0;
        int same = 1, ran = 1;
        for (int s = 0; s < STEPS && ran; s++) {
            st_batch_item items[2];
            for (int i = 0; i < steps[s].n_items; i++)
                items[i] = (st_batch_item){&seqs[steps[s].seq[i]], ids + steps[s].t0[i], steps[s].n[i], steps[s].logits[i]};
            st = st_batch_plan(cache, items, steps[s].n_items, &pb, &err);
            if (st == ST_OK) st = st_fwd_run(fw, &pb.plan, want, &err);
            rank_run rr[MAXW];
            pthread_t th[MAXW];
            for (int r = 0; r < world && st == ST_OK; r++) {
                rr[r] = (rank_run){fr[r], &pb.plan, got[r], ST_OK, {0}};
                pthread_create(&th[r], NULL, rank_main, &rr[r]);
            }
            for (int r = 0; r < world && st == ST_OK; r++) {
                pthread_join(th[r], NULL);
                if (rr[r].st != ST_OK) st = rr[r].st, err = rr[r].err;
            }
            if (st != ST_OK) {
                ran = 0;
                break;
            }
            st_batch_commit(cache, items, steps[s].n_items);
            const int64_t rows = pb.plan.n_logit_rows;
            double e = kit_row_err(got[0], want, rows, V);
            if (!(e <= worst)) worst = e;
            for (int r = 1; r < world; r++) same &= !memcmp(got[r], got[0], (size_t)(rows * V) * sizeof(float));
        }
        CHECK(ran && worst <= tol && same,
              "%s, %d shards (%s): %d steps (prefill chunks, ragged batches, decode) match the whole model within %.0e "
              "(worst %.2e), every rank the same bits (%s)",
              dir, world, how, STEPS, tol, worst, err.msg);
        for (int i = 0; i < 2; i++) st_cache_seq_release(cache, &seqs[i]);
    }
out:
    st_plan_buf_free(&pb);
    for (int r = 0; r < world; r++) {
        st_fwd_destroy(fr[r]);
        st_backend_destroy(be[r]);
        free(got[r]);
    }
    st_cpu_group_destroy(g);
    st_fwd_destroy(fw);
    st_backend_destroy(whole);
    st_cache_destroy(cache);
    free(want);
}

/* whether p's kernel set takes m's 8-bit matrices as packed integer kernels */
static int uses_q8_kernel(const st_model *m, const st_cpu_params *p) {
    if (!p->pack || !(st_kernels_packs(p->kernels) & ST_WPACK_BIT(ST_WPACK_Q8_V16))) return 0;
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (st_matrix_packs_possible(&m->layers[i].out_proj) & ST_WPACK_BIT(ST_WPACK_Q8_V16) ||
            st_matrix_packs_possible(&m->layers[i].o_proj) & ST_WPACK_BIT(ST_WPACK_Q8_V16))
            return 1;
    return 0;
}

/* the shard rules on one shape */
static void test_rules(const st_model *m) {
    st_error err = {0};
    const st_config *c = &m->cfg;
    st_shard a, b;
    int ok = st_shard_make(m, 0, 4, &a, &err) == ST_OK && st_shard_make(m, 3, 4, &b, &err) == ST_OK;
    CHECK(ok && a.n_heads == c->n_heads / 4 && a.n_kv_heads == 1 && a.kv_head0 == 0 && b.kv_head0 == c->n_kv_heads - 1 &&
              a.lin_v_heads == c->lin_n_value_heads / 4 && a.lin_k_heads == 1 && b.lin_k0 == c->lin_n_key_heads - 1 &&
              a.inter + b.inter == c->intermediate_size / 2,
          "4 ranks of %d query / %d KV heads: 2 query heads each, the KV head they read replicated on 2 ranks; GDN "
          "value heads split, key heads replicated; the MLP split evenly",
          c->n_heads, c->n_kv_heads);
    CHECK(st_shard_make(m, 4, 4, &a, &err) == ST_ERR_ARG && st_shard_make(m, 0, 0, &a, &err) == ST_ERR_ARG,
          "a rank outside the world is refused (%s)", err.msg);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

int main(void) {
    static const char *dirs[] = {"tiny-a", "tiny-a/mlx-q8", "tiny-a/mlx-q4", "tiny-b", "tiny-b/mlx-q8", "tiny-moe",
                                 "tiny-vl", "tiny-b at 4 bits, group 32", "tiny-moe at 6 bits, group 32"};
    char tmp[] = "/tmp/strand-shards-XXXXXX";
    const int have_tmp = mkdtemp(tmp) != NULL;
    st_cpu_params packed = kit_cpu_params();
    packed.n_threads = 1;
    st_cpu_params plain = packed;
    plain.kernels = st_kernels_ref();
    plain.pack = 0;
    st_cpu_params simd_plain = packed;
    simd_plain.pack = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dirs[i]);
        st_model *m = NULL;
        st_error err = {0};
        if (strstr(dirs[i], " bits")) { /* quantized here: column views of 4- and 6-bit matrices */
            const int bits = strstr(dirs[i], "4 bits") ? 4 : 6;
            char src[512];
            snprintf(src, sizeof src, "%s/fixtures/%s", tap_data_dir(), bits == 4 ? "tiny-b" : "tiny-moe");
            snprintf(path, sizeof path, "%s/q%d", tmp, bits);
            st_quantize_params qp = st_quantize_default_params();
            qp.bits = bits;
            qp.group_size = 32;
            qp.n_threads = 1;
            st_quantize_stats qs;
            if (!CHECK(have_tmp && st_quantize_checkpoint(src, path, &qp, &qs, &err) == ST_OK, "%s (%s)", dirs[i], err.msg))
                continue;
        }
        if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dirs[i], err.msg)) continue;
        /* a prompt past a 64-token delta-rule chunk and several KV blocks */
        int32_t ids[PROMPT];
        for (int j = 0; j < PROMPT; j++) ids[j] = (int32_t)((j * 37 + 11) % m->cfg.vocab_size);
        const int worlds[] = {2, 3, 4, 8};
        const int n_worlds = strncmp(dirs[i], "tiny-b", 6) == 0 ? 4 : 2; /* 8 query heads */
        const int q8 = uses_q8_kernel(m, &packed);
        char how[64];
        snprintf(how, sizeof how, "%s, %s", packed.kernels->name, q8 ? "unpacked" : "packed");
        for (int w = 0; w < n_worlds; w++) {
            run_world(dirs[i], m, ids, PROMPT, worlds[w], q8 ? &simd_plain : &packed, how, TOL);
            if (worlds[w] != 2) continue;
            run_world(dirs[i], m, ids, PROMPT, 2, &plain, "ref, unpacked", TOL);
            if (q8) run_world(dirs[i], m, ids, PROMPT, 2, &packed, "the 8-bit integer kernel, packed", TOL_Q8);
        }
        if (strcmp(dirs[i], "tiny-b") == 0) test_rules(m);
        st_model_free(m);
    }
    if (have_tmp) {
        char sub[1100];
        snprintf(sub, sizeof sub, "%s/q4", tmp);
        remove_dir(sub);
        snprintf(sub, sizeof sub, "%s/q6", tmp);
        remove_dir(sub);
        rmdir(tmp);
    }
    return tap_done();
}
