/* ==== Tensor parallelism on the CUDA backend, on one GPU ====
 *
 * Every fixture model split 2 ways (and 8 on tiny-b): each rank a CUDA backend on GPU 0
 * holding its shard (st_shard: query/KV heads, GDN key/value heads, MLP and expert widths,
 * the LM head's vocabulary slice), the ranks threads of this process joined by the
 * in-process communicator (dist/comm_local.h), rank 0 driving the others through the relay
 * exactly as under mpirun, its all-reduces and logit gathers through the host (NCCL takes one
 * rank a GPU; this machine may have one). Over a 70-token prompt (a 64-token delta-rule
 * chunk, KV blocks of 8), ragged batches and decode steps in `exact` precision the logits
 * must equal the whole model's on the same GPU within 1e-4 of each row's largest logit.
 * Also: the whole model with its all-reduces through a NCCL communicator of one GPU gives
 * the same bits as without. Without a GPU it says so and skips.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda.h"
#include "backend/select.h"
#include "core/clock.h"
#include "dist/comm_local.h"
#include "dist/relay.h"
#include "kit.h"
#include "tap.h"

#define MAXW 8
#define PROMPT 70
#define TOL 1e-4

typedef struct follower {
    const st_model *m;
    st_comm *comm;
    st_status st;
    st_error err;
} follower;

/* a rank other than 0: its shard's backend, replaying rank 0's work until it ends */
static void *follow_main(void *arg) {
    follower *f = arg;
    st_cuda_params p = st_cuda_default_params();
    p.comm = f->comm;
    st_backend *b = NULL;
    f->st = st_backend_cuda_create(f->m, &p, &b, &f->err);
    if (f->st == ST_OK) f->st = st_relay_follow(b, &f->err);
    st_backend_destroy(b);
    return NULL;
}

typedef struct step_spec {
    int n_items, seq[2], t0[2], n[2], logits[2];
} step_spec;

/* The steps both sides run: a prompt in two chunks beside a second sequence's, then ragged
 * decode. `other` (world > 1: rank 0 of a job; or a whole model through NCCL) against the
 * whole model `whole`; *worst its largest row error, *same 1 when every logit is the same bits. */
static st_status run_steps(const st_model *m, st_backend *whole, st_backend *other, const int32_t *ids, int n_ids,
                           double *worst, int *same, st_error *err) {
    const int64_t V = m->cfg.vocab_size;
    enum { STEPS = 6, MAXROWS = 2 * PROMPT };
    st_cache *cache = NULL;
    st_fwd *fw = NULL, *fo = NULL;
    st_plan_buf pb;
    memset(&pb, 0, sizeof pb);
    float *want = calloc((size_t)MAXROWS * (size_t)V, sizeof(float));
    float *got = calloc((size_t)MAXROWS * (size_t)V, sizeof(float));
    st_cache_params cpar = st_cache_default_params();
    cpar.n_slots = 2;
    cpar.max_seq_len = 128;
    cpar.block_size = 8;
    st_status st = want && got ? ST_OK : st_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (st == ST_OK) st = st_cache_create(m, &cpar, &cache, err);
    if (st == ST_OK) st = kit_fwd(whole, cache, 2 * PROMPT, &fw, err);
    if (st == ST_OK) st = kit_fwd(other, cache, 2 * PROMPT, &fo, err);
    if (st == ST_OK) st = st_plan_buf_init(&pb, st_fwd_params(fw)->n_slots, st_fwd_params(fw)->max_tokens, cache->p.n_blocks, err);
    *worst = 0;
    *same = 1;
    if (st == ST_OK) {
        st_seq seqs[2];
        for (int i = 0; i < 2; i++) {
            seqs[i].slot = -1;
            st_cache_seq_start(cache, &seqs[i], err);
        }
        const int half = n_ids / 2;
        const step_spec steps[STEPS] = {
            {1, {0, 0}, {0, 0}, {half, 0}, {ST_LOGITS_ALL, 0}},
            {2, {0, 1}, {half, 0}, {n_ids - half, n_ids}, {ST_LOGITS_ALL, ST_LOGITS_LAST}},
            {2, {0, 1}, {1, 2}, {1, 1}, {ST_LOGITS_LAST, ST_LOGITS_LAST}},
            {2, {1, 0}, {3, 4}, {1, 1}, {ST_LOGITS_LAST, ST_LOGITS_LAST}},
            {1, {0, 0}, {5, 0}, {1, 0}, {ST_LOGITS_LAST, 0}},
            {2, {0, 1}, {6, 7}, {3, 2}, {ST_LOGITS_ALL, ST_LOGITS_ALL}},
        };
        for (int s = 0; s < STEPS && st == ST_OK; s++) {
            st_batch_item items[2];
            for (int i = 0; i < steps[s].n_items; i++)
                items[i] = (st_batch_item){&seqs[steps[s].seq[i]], ids + steps[s].t0[i], steps[s].n[i], steps[s].logits[i]};
            st = st_batch_plan(cache, items, steps[s].n_items, &pb, err);
            if (st == ST_OK) st = st_fwd_run(fw, &pb.plan, want, err);
            if (st == ST_OK) st = st_fwd_run(fo, &pb.plan, got, err);
            if (st != ST_OK) break;
            st_batch_commit(cache, items, steps[s].n_items);
            const int64_t rows = pb.plan.n_logit_rows;
            const double e = kit_row_err(got, want, rows, V);
            if (!(e <= *worst)) *worst = e;
            *same &= !memcmp(got, want, (size_t)(rows * V) * sizeof(float));
        }
        for (int i = 0; i < 2; i++) st_cache_seq_release(cache, &seqs[i]);
    }
    st_plan_buf_free(&pb);
    st_fwd_destroy(fo);
    st_fwd_destroy(fw);
    st_cache_destroy(cache);
    free(want);
    free(got);
    return st;
}

static void run_world(const char *name, const st_model *m, st_backend *whole, const int32_t *ids, int world) {
    st_error err = {0};
    for (int r = 0; r < world; r++) {
        st_shard sh;
        if (st_shard_make(m, r, world, &sh, &err) != ST_OK) {
            CHECK(err.status == ST_ERR_ARG && strstr(err.msg, "shard:"), "%s over %d ranks: refused with a clear error (%s)",
                  name, world, err.msg);
            return;
        }
    }
    st_comm *ranks[MAXW] = {0};
    follower fol[MAXW];
    pthread_t th[MAXW];
    int started = 0;
    st_backend *b0 = NULL;
    const double t0 = st_now_s();
    printf("# %s over %d CUDA shards: starting\n", name, world); /* a hang shows where */
    st_status st = st_comm_local_create(world, 30.0, ranks, &err);
    /* rank 0 first: where it cannot be made no follower waits for it (and a follower that
     * cannot be made fails rank 0's first broadcast after the timeout) */
    st_cuda_params p = st_cuda_default_params();
    p.comm = ranks[0];
    if (st == ST_OK) st = st_backend_cuda_create(m, &p, &b0, &err);
    for (int r = 1; r < world && st == ST_OK; r++, started++) {
        fol[r] = (follower){m, ranks[r], ST_OK, {0}};
        pthread_create(&th[r], NULL, follow_main, &fol[r]);
    }
    double worst = 0;
    int same = 0;
    if (st == ST_OK) st = run_steps(m, whole, b0, ids, PROMPT, &worst, &same, &err);
    char desc[600] = "";
    if (b0) st_backend_describe(b0, desc, sizeof desc);
    st_backend_destroy(b0); /* on rank 0 it ends the job's work: the followers return */
    b0 = NULL;
    for (int r = 1; r <= started; r++) {
        pthread_join(th[r], NULL);
        if (st == ST_OK && fol[r].st != ST_OK) st = fol[r].st, err = fol[r].err;
    }
    CHECK(st == ST_OK && worst <= TOL,
          "%s over %d CUDA shards on one GPU (host all-reduces, the relay): prefill chunks, ragged batches and decode "
          "match the whole model within %.0e (worst %.2e; %.1f s) [%s] %s",
          name, world, TOL, worst, st_now_s() - t0, strstr(desc, "rank") ? strstr(desc, "rank") : desc, err.msg);
    for (int r = 0; r < world; r++) st_comm_destroy(ranks[r]);
}

int main(void) {
    alarm(600); /* a job that hangs fails the test rather than the run */
    setvbuf(stdout, NULL, _IOLBF, 0);
    char why[512];
    if (!st_cuda_available(NULL, why, sizeof why)) {
        CHECK(1, "CUDA tensor parallelism skipped: no CUDA backend here (%s)", why);
        return tap_done();
    }
    static const char *dirs[] = {"tiny-a", "tiny-b", "tiny-b/mlx-q8", "tiny-a/mlx-q4", "tiny-moe"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dirs[i]);
        st_model *m = NULL;
        st_backend *whole = NULL;
        st_error err = {0};
        if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dirs[i], err.msg)) continue;
        st_cuda_params p = st_cuda_default_params();
        if (!CHECK(st_backend_cuda_create(m, &p, &whole, &err) == ST_OK, "%s on the GPU (%s)", dirs[i], err.msg)) {
            st_model_free(m);
            continue;
        }
        int32_t ids[PROMPT];
        for (int j = 0; j < PROMPT; j++) ids[j] = (int32_t)((j * 37 + 11) % m->cfg.vocab_size);
        /* 2 ranks of every model; 8 of tiny-b (one query head each, KV and key heads replicated) */
        run_world(dirs[i], m, whole, ids, 2);
        if (!strcmp(dirs[i], "tiny-b")) run_world(dirs[i], m, whole, ids, 8);
        printf("# %s through NCCL: starting\n", dirs[i]);
        /* the whole model's all-reduces through NCCL (a communicator of this one GPU) */
        st_backend *nb = NULL;
        p.nccl = 1;
        const st_status sn = st_backend_cuda_create(m, &p, &nb, &err);
        if (sn == ST_ERR_UNSUPPORTED && strstr(err.msg, "libnccl")) {
            CHECK(1, "%s through NCCL skipped: %s", dirs[i], err.msg);
        } else {
            double worst = 1;
            int same = 0;
            st_status st = sn == ST_OK ? run_steps(m, whole, nb, ids, PROMPT, &worst, &same, &err) : sn;
            char desc[600] = "";
            if (nb) st_backend_describe(nb, desc, sizeof desc);
            CHECK(st == ST_OK && same, "%s with its all-reduces through NCCL on one GPU: the same bits as without (%s) %s",
                  dirs[i], strstr(desc, "NCCL") ? strstr(desc, "NCCL") : desc, err.msg);
        }
        st_backend_destroy(nb);
        st_backend_destroy(whole);
        st_model_free(m);
    }
    return tap_done();
}
