/* ==== The scheduler: batch invariance, bounded per-sequence state, stops, cancel ====
 * - the fixtures' batch.* prompts submitted together give the reference's greedy ids and
 *   exactly what each gives alone; the same holds for seeded sampling, for requests that
 *   arrive while others run, and for small prefill chunks;
 * - after 1, 256, 1,000 and 20,000 decode steps a sequence's metadata is the same size with
 *   the right values, and no heap allocation happened in between (malloc is interposed);
 * - finished and cancelled sequences return their blocks and slot within one step;
 * - context limits, a full queue, stop ids, stop strings, logprobs. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "engine/scheduler.h"
#include "golden.h"
#include "model/synth.h"
#include "backend/cpu/cpu.h"
#include "backend/select.h"
#include "dist/comm.h"
#include "grammar/grammar.h"
#include "tap.h"

#include "alloc_count.h"

/* collects one request's output */
typedef struct out {
    int32_t ids[256];
    int n;
    int done;
    st_finish_reason finish;
    st_usage usage;
    char text[4096];
    size_t text_len;
    float first_logprob;
    int n_top;
    char err[256];
    int pause_at;  /* answer ST_EV_PAUSE at this many tokens (0: never) */
} out;

static int on_event(void *user, const st_event *ev) {
    out *o = user;
    if (ev->kind == ST_EV_TOKEN) {
        if (o->n < 256) o->ids[o->n] = ev->token;
        if (o->n == 0 && ev->logprobs) {
            o->first_logprob = ev->logprobs->logprob;
            o->n_top = ev->logprobs->n_top;
        }
        o->n++;
    } else {
        o->done = 1;
        o->finish = ev->finish;
        o->usage = ev->usage;
        if (ev->error) snprintf(o->err, sizeof o->err, "%s", ev->error);
    }
    if (ev->content_len && o->text_len + ev->content_len < sizeof o->text) {
        memcpy(o->text + o->text_len, ev->content, ev->content_len);
        o->text_len += ev->content_len;
    }
    return ev->kind == ST_EV_TOKEN && o->pause_at && o->n == o->pause_at ? ST_EV_PAUSE : ST_EV_CONTINUE;
}

static void run_all(st_sched *s) {
    while (st_sched_step(s) > 0) {
    }
}

typedef struct prompts {
    int32_t ids[4][16];
    int len[4];
    int B, G;
    const int32_t *greedy; /* [B][G] */
} prompts;

static int load_batch(const st_checkpoint *g, prompts *p) {
    const st_tensor *tb = golden_get(g, "batch.ids", ST_DTYPE_I32), *tm = golden_get(g, "batch.mask", ST_DTYPE_I32);
    const st_tensor *tg = golden_get(g, "batch.greedy", ST_DTYPE_I32);
    if (!tb || !tm || !tg) return 0;
    p->B = (int)tb->shape[0];
    p->G = (int)tg->shape[1];
    p->greedy = tg->data;
    int W = (int)tb->shape[1];
    for (int b = 0; b < p->B; b++) {
        p->len[b] = 0;
        for (int j = 0; j < W; j++)
            if (((const int32_t *)tm->data)[b * W + j]) p->ids[b][p->len[b]++] = ((const int32_t *)tb->data)[b * W + j];
    }
    return 1;
}

static st_sched *make(const st_model *m, const st_tokenizer *tok, int max_seqs, int step_tokens, int64_t ctx) {
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = max_seqs;
    sp.step_tokens = step_tokens;
    sp.ctx = ctx;
    sp.max_queue = 8;
    st_sched *s = NULL;
    st_error err = {0};
    if (st_sched_create(m, tok, &sp, &s, &err) != ST_OK) printf("# sched: %s\n", err.msg);
    return s;
}

static void test_invariance(const char *fx) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), fx);
    st_model *m = NULL;
    st_checkpoint *g = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads", fx)) return;
    snprintf(path, sizeof path, "%s/fixtures/%s/golden.safetensors", tap_data_dir(), fx);
    prompts P;
    if (st_checkpoint_open(path, &g, &err) != ST_OK || !load_batch(g, &P)) {
        CHECK(0, "%s: golden batch", fx);
        st_model_free(m);
        return;
    }
    for (int mode = 0; mode < 2; mode++) { /* greedy, then seeded sampling */
        st_req_params rp = st_req_default_params();
        rp.max_tokens = P.G;
        rp.ignore_eos = 1;
        if (mode) {
            rp.sampling.temperature = 1.5f;
            rp.sampling.top_p = 0.95f;
            rp.sampling.top_k = 50;
            rp.sampling.has_seed = 1;
        }
        out together[4], alone[4], staggered[4], chunked[4];
        memset(together, 0, sizeof together);
        memset(alone, 0, sizeof alone);
        memset(staggered, 0, sizeof staggered);
        memset(chunked, 0, sizeof chunked);
        st_sched *s = make(m, NULL, 4, 64, 64);
        for (int b = 0; b < P.B; b++) {
            rp.sampling.seed = 1000 + (uint64_t)b;
            st_sched_submit(s, P.ids[b], P.len[b], &rp, on_event, &together[b], NULL, &err);
        }
        run_all(s);
        /* alone, each on a fresh scheduler */
        for (int b = 0; b < P.B; b++) {
            st_sched *s1 = make(m, NULL, 1, 64, 64);
            rp.sampling.seed = 1000 + (uint64_t)b;
            st_sched_submit(s1, P.ids[b], P.len[b], &rp, on_event, &alone[b], NULL, &err);
            run_all(s1);
            st_sched_destroy(s1);
        }
        /* staggered arrivals on the shared scheduler: one new request every 3 steps */
        for (int b = 0; b < P.B; b++) {
            rp.sampling.seed = 1000 + (uint64_t)b;
            st_sched_submit(s, P.ids[b], P.len[b], &rp, on_event, &staggered[b], NULL, &err);
            for (int k = 0; k < 3; k++) st_sched_step(s);
        }
        run_all(s);
        st_sched_destroy(s);
        /* prefill in chunks of at most 5 tokens per step */
        s = make(m, NULL, 4, 5, 64);
        for (int b = 0; b < P.B; b++) {
            rp.sampling.seed = 1000 + (uint64_t)b;
            st_sched_submit(s, P.ids[b], P.len[b], &rp, on_event, &chunked[b], NULL, &err);
        }
        run_all(s);
        st_sched_destroy(s);
        int same = 1, ref = 1, chunk_same = 1, stag_same = 1;
        for (int b = 0; b < P.B; b++) {
            same &= together[b].n == P.G && alone[b].n == P.G &&
                    !memcmp(together[b].ids, alone[b].ids, (size_t)P.G * 4);
            stag_same &= staggered[b].n == P.G && !memcmp(staggered[b].ids, alone[b].ids, (size_t)P.G * 4);
            chunk_same &= chunked[b].n == P.G && !memcmp(chunked[b].ids, alone[b].ids, (size_t)P.G * 4);
            ref &= !memcmp(together[b].ids, P.greedy + b * P.G, (size_t)P.G * 4);
            same &= together[b].finish == ST_FINISH_LENGTH;
        }
        const char *what = mode ? "seeded sampling" : "greedy";
        CHECK(same, "%s %s: %d prompts together give exactly what each gives alone", fx, what, P.B);
        CHECK(stag_same, "%s %s: requests arriving while others run give the same ids", fx, what);
        CHECK(chunk_same, "%s %s: prefill in 5-token chunks gives the same ids", fx, what);
        if (!mode) CHECK(ref, "%s greedy: the scheduler's ids equal the reference's batch.greedy", fx);
        if (mode && !strcmp(fx, "tiny-a")) { /* tiny-b's top-2 margins (up to 25) make it greedy anyway */
            int differs = 0;
            for (int b = 0; b < P.B; b++) differs |= memcmp(together[b].ids, P.greedy + b * P.G, (size_t)P.G * 4) != 0;
            CHECK(differs, "%s seeded sampling: differs from greedy (sampling is real)", fx);
        }
    }
    st_checkpoint_close(g);
    st_model_free(m);
}

static int blocks_valid(const st_seq_info *in, int64_t total) {
    for (int i = 0; i < in->n_blocks; i++) {
        if (in->blocks[i] < 0 || in->blocks[i] >= total) return 0;
        for (int j = 0; j < i; j++)
            if (in->blocks[j] == in->blocks[i]) return 0;
    }
    return 1;
}

/* the seed regression in our terms: metadata after many decode steps */
static void test_bounded(const st_model *m) {
    enum { STEPS = 20000 };
    if (!m) return;
    st_sched *s = make(m, NULL, 2, 64, STEPS + 64);
    if (!s) return;
    st_req_params rp = st_req_default_params();
    rp.max_tokens = STEPS + 8;
    rp.ignore_eos = 1;
    rp.sampling.temperature = 1.0f;
    rp.sampling.has_seed = 1;
    out o;
    memset(&o, 0, sizeof o);
    int32_t prompt[7] = {5, 99, 300, 2, 7, 1000, 17};
    uint64_t id = 0;
    st_error err = {0};
    st_sched_submit(s, prompt, 7, &rp, on_event, &o, &id, &err);
    st_sched_step(s); /* prefill + first token */
    const st_cache *c = st_sched_cache(s);
    st_seq_info first, info;
    int checkpoints[] = {1, 256, 1000, STEPS};
    int ok_all = 1;
    int step = 1;
    st_sched_seq_info(s, id, &first);
    alloc_count = 0;
    alloc_counting = 1;
    for (int k = 0; k < 4; k++) {
        while (step < checkpoints[k]) {
            st_sched_step(s);
            step++;
        }
        alloc_counting = 0;
        int ok = st_sched_seq_info(s, id, &info);
        int64_t gen = step; /* one token per step, the first with the prefill */
        ok = ok && info.slot == first.slot && info.record_bytes == first.record_bytes &&
             info.n_generated == gen && info.n_tokens == 7 + gen && info.n_past == 7 + gen - 1 &&
             info.n_blocks == (info.n_past + c->p.block_size - 1) / c->p.block_size &&
             info.blocks == first.blocks && blocks_valid(&info, c->p.n_blocks);
        CHECK(ok, "after %d decode steps: slot %d, %lld positions, %d blocks (valid, distinct), record %zu bytes as after step 1",
              step, info.slot, (long long)info.n_past, info.n_blocks, info.record_bytes);
        ok_all &= ok;
        alloc_counting = 1;
    }
    alloc_counting = 0;
    CHECK(alloc_count == 0, "no heap allocation in %d decode steps (%ld)", STEPS - 1, alloc_count);
    st_sched_cancel(s, id);
    run_all(s);
    CHECK(o.done && o.finish == ST_FINISH_CANCELLED && c->n_free_blocks == c->p.n_blocks,
          "cancelled: all %lld blocks free again", (long long)c->p.n_blocks);
    st_sched_destroy(s);
}

/* st_sched_fail: a running and a queued request end with ST_FINISH_ERROR and the message;
 * a later cancel does not replace the first reason */
static void test_fail(const st_model *m) {
    st_sched *s = make(m, NULL, 1, 64, 256);
    const st_cache *c = st_sched_cache(s);
    st_req_params rp = st_req_default_params();
    rp.ignore_eos = 1;
    rp.max_tokens = 100;
    out o[2];
    memset(o, 0, sizeof o);
    int32_t prompt[12] = {5, 99, 300, 2, 7, 1000, 17, 3, 4, 5, 6, 7};
    uint64_t id[2];
    st_error err = {0};
    st_sched_submit(s, prompt, 12, &rp, on_event, &o[0], &id[0], &err);
    st_sched_submit(s, prompt, 8, &rp, on_event, &o[1], &id[1], &err);
    for (int i = 0; i < 3; i++) st_sched_step(s);
    st_sched_fail(s, id[0], "the client did not read its stream for 3 s");
    st_sched_cancel(s, id[0]);
    st_sched_fail(s, id[1], "queued and failed");
    st_sched_step(s);
    run_all(s);
    CHECK(o[0].done && o[0].finish == ST_FINISH_ERROR && !strcmp(o[0].err, "the client did not read its stream for 3 s") &&
              o[0].n >= 1 && o[0].n < 100,
          "a running request failed: error finish with its message after %d tokens (a later cancel keeps the reason)", o[0].n);
    CHECK(o[1].done && o[1].finish == ST_FINISH_ERROR && !strcmp(o[1].err, "queued and failed") && o[1].n == 0,
          "a queued request failed: error finish with its message, no tokens (%d)", o[1].n);
    CHECK(c->n_free_blocks == c->p.n_blocks && c->n_free_slots == 1, "everything free after the failures");
    st_sched_fail(s, 12345, "nobody");
    CHECK(st_sched_step(s) == 0, "an unknown id is ignored");
    st_sched_destroy(s);
}

/* A tensor-parallel job that loses a rank (a communicator whose all-gather fails, as the
 * MPI one does at its watchdog): the step fails with ST_ERR_IO, the scheduler is broken,
 * every request ends with the error (the queued one too), a new one is refused. */
static int lost_allgather(st_comm *c, const void *send, size_t bytes, void *recv) {
    (void)send, (void)bytes, (void)recv;
    snprintf(c->error, sizeof c->error, "rank 1 did not answer (a test)");
    c->broken = 1;
    return 1;
}
static int quiet_bcast(st_comm *c, void *buf, size_t bytes, int root, double timeout_s) {
    (void)c, (void)buf, (void)bytes, (void)root, (void)timeout_s;
    return 0; /* the relay's messages to a follower that is not there */
}
static int quiet_barrier(st_comm *c) { (void)c; return 0; }
static void keep_comm(st_comm *c) { (void)c; }

static void test_broken_job(const st_model *m) {
    static const st_comm_ops ops = {"lost", lost_allgather, quiet_bcast, quiet_barrier, keep_comm};
    st_comm comm = {.ops = &ops, .rank = 0, .world = 2, .timeout_s = 3};
    st_cpu_params cp = st_sched_cpu_params(st_cpu_default_params(), 1);
    cp.comm = &comm;
    cp.n_threads = 1;
    st_device_params dp = st_device_default_params();
    dp.kind = ST_DEVICE_CPU;
    dp.cpu = cp;
    st_backend *be = NULL;
    st_error err = {0};
    if (!CHECK(st_backend_create(m, &dp, &be, &err) == ST_OK, "rank 0 of 2's backend (%s)", err.msg)) return;
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = 1;
    sp.ctx = 256;
    sp.backend = be;
    st_sched *s = NULL;
    if (!CHECK(st_sched_create(m, NULL, &sp, &s, &err) == ST_OK, "a scheduler on it (%s)", err.msg)) {
        st_backend_destroy(be);
        return;
    }
    st_req_params rp = st_req_default_params();
    rp.max_tokens = 10;
    out o[3];
    memset(o, 0, sizeof o);
    int32_t prompt[4] = {5, 6, 7, 8};
    uint64_t id[3];
    st_sched_submit(s, prompt, 4, &rp, on_event, &o[0], &id[0], &err);
    st_sched_submit(s, prompt, 3, &rp, on_event, &o[1], &id[1], &err);
    char why[200] = "";
    CHECK(!st_sched_broken(s, why, sizeof why), "not broken before a step");
    run_all(s);
    const int broken = st_sched_broken(s, why, sizeof why);
    CHECK(broken && strstr(why, "rank 1 did not answer"), "the failed all-reduce breaks the scheduler: %s", why);
    CHECK(o[0].done && o[0].finish == ST_FINISH_ERROR && strstr(o[0].err, "rank 1 did not answer") && o[0].n == 0,
          "the running request ends with the error (%s)", o[0].err);
    CHECK(o[1].done && o[1].finish == ST_FINISH_ERROR && strstr(o[1].err, "rank 1 did not answer"),
          "the queued request ends with it too (%s)", o[1].err);
    st_error e2 = {0};
    const st_status st = st_sched_submit(s, prompt, 4, &rp, on_event, &o[2], &id[2], &e2);
    CHECK(st == ST_ERR_IO && strstr(e2.msg, "rank 1 did not answer"), "a new request is refused: %s", e2.msg);
    st_sched_destroy(s);
    st_backend_destroy(be);
}

/* blocks held by the given running requests */
static int64_t held_blocks(st_sched *s, const uint64_t *ids, int n, int *running) {
    int64_t h = 0;
    *running = 0;
    for (int i = 0; i < n; i++) {
        st_seq_info in;
        if (st_sched_seq_info(s, ids[i], &in)) {
            h += in.n_blocks;
            (*running)++;
        }
    }
    return h;
}

static void test_release(const st_model *m) {
    st_sched *s = make(m, NULL, 3, 64, 256);
    const st_cache *c = st_sched_cache(s);
    st_req_params rp = st_req_default_params();
    rp.ignore_eos = 1;
    out o[3];
    memset(o, 0, sizeof o);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (i * 37) % 1000;
    uint64_t id[3];
    st_error err = {0};
    rp.max_tokens = 100;
    st_sched_submit(s, prompt, 40, &rp, on_event, &o[0], &id[0], &err);
    rp.max_tokens = 5;
    st_sched_submit(s, prompt, 33, &rp, on_event, &o[1], &id[1], &err);
    rp.max_tokens = 100;
    st_sched_submit(s, prompt, 20, &rp, on_event, &o[2], &id[2], &err);
    /* step until request 1 finishes, then count: nothing may still be held for it */
    st_seq_info b = {0};
    int steps = 0;
    while (!o[1].done && steps < 50) {
        st_sched_seq_info(s, id[1], &b);
        st_sched_step(s);
        steps++;
    }
    int running;
    int64_t held = held_blocks(s, id, 3, &running);
    CHECK(o[1].done && o[1].finish == ST_FINISH_LENGTH && o[1].n == 5 && running == 2 &&
              c->n_free_blocks == c->p.n_blocks - held && c->n_free_slots == 1,
          "a sequence finishing mid-batch (it held %d blocks) returns them and its slot in that step: "
          "%lld free = %lld - %lld held by the 2 running",
          b.n_blocks, (long long)c->n_free_blocks, (long long)c->p.n_blocks, (long long)held);
    st_sched_step(s);
    st_seq_info a;
    st_sched_seq_info(s, id[0], &a);
    st_sched_cancel(s, id[0]);
    st_sched_step(s);
    held = held_blocks(s, id, 3, &running);
    CHECK(o[0].done && o[0].finish == ST_FINISH_CANCELLED && running == 1 &&
              c->n_free_blocks == c->p.n_blocks - held && c->n_free_slots == 2,
          "a cancelled sequence (it held %d blocks) returns them and its slot within one step", a.n_blocks);
    run_all(s);
    CHECK(c->n_free_blocks == c->p.n_blocks && c->n_free_slots == 3, "everything free at the end");
    st_sched_destroy(s);
}

static void test_limits(const st_model *m) {
    st_sched *s = make(m, NULL, 1, 64, 32);
    st_req_params rp = st_req_default_params();
    int32_t prompt[40] = {0};
    st_error err = {0};
    out o;
    memset(&o, 0, sizeof o);
    CHECK(st_sched_submit(s, prompt, 40, &rp, on_event, &o, NULL, &err) == ST_ERR_LIMIT &&
              strstr(err.msg, "context length is 32"),
          "a prompt longer than the context is refused: %s", err.msg);
    rp.max_tokens = 1000;
    rp.ignore_eos = 1;
    st_sched_submit(s, prompt, 20, &rp, on_event, &o, NULL, &err);
    run_all(s);
    CHECK(o.done && o.finish == ST_FINISH_LENGTH && o.n == 12,
          "max_tokens past the context stops at the context with finish length (%d tokens)", o.n);
    /* queue bound: max_seqs (1) + max_queue (8) live requests, the 10th is refused */
    out q[10];
    memset(q, 0, sizeof q);
    rp.max_tokens = 3;
    int busy = -1;
    for (int i = 0; i < 10; i++)
        if (st_sched_submit(s, prompt, 4, &rp, on_event, &q[i], NULL, &err) == ST_ERR_BUSY && busy < 0) busy = i;
    CHECK(busy == 9, "the bounded queue refuses request %d (max_seqs + max_queue are live) with busy: %s", busy, err.msg);
    run_all(s);
    int all = 1;
    for (int i = 0; i < 9; i++) all &= q[i].done && q[i].n == 3;
    CHECK(all, "the queued requests all complete");
    /* bad input */
    int32_t bad[2] = {1, 5000};
    CHECK(st_sched_submit(s, bad, 2, &rp, on_event, &o, NULL, &err) == ST_ERR_ARG, "token outside the vocabulary refused: %s", err.msg);
    rp.sampling.top_p = 2;
    CHECK(st_sched_submit(s, prompt, 2, &rp, on_event, &o, NULL, &err) == ST_ERR_ARG, "bad sampling refused: %s", err.msg);
    st_sched_destroy(s);
}

static void test_stops_logprobs(const st_model *m, const st_checkpoint *g) {
    const st_tensor *ti = golden_get(g, "p1.ids", ST_DTYPE_I32), *tg = golden_get(g, "p1.greedy", ST_DTYPE_I32);
    const st_tensor *tl = golden_get(g, "p1.greedy_logits", ST_DTYPE_F32);
    if (!ti || !tg || !tl) return;
    st_sched *s = make(m, NULL, 2, 64, 128);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = 20;
    rp.logprobs = 5;
    rp.stop_ids[0] = ((const int32_t *)tg->data)[3];
    rp.n_stop_ids = 1;
    out o;
    memset(&o, 0, sizeof o);
    st_error err = {0};
    st_sched_submit(s, ti->data, ti->numel, &rp, on_event, &o, NULL, &err);
    run_all(s);
    CHECK(o.finish == ST_FINISH_STOP && o.n == 4 && o.usage.completion_tokens == 4 &&
              o.usage.prompt_tokens == ti->numel,
          "a stop token id ends the request after it (finish %s, %d tokens)", st_finish_name(o.finish), o.n);
    const float *row = tl->data;
    int64_t V = m->cfg.vocab_size;
    double mx = -INFINITY, z = 0;
    for (int64_t i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int64_t i = 0; i < V; i++) z += exp(row[i] - mx);
    double want = row[o.ids[0]] - mx - log(z);
    CHECK(fabs(o.first_logprob - want) < 1e-4 && o.n_top == 5,
          "logprob of the first token = log-softmax of the reference logits (%.5f vs %.5f), 5 alternatives",
          o.first_logprob, want);
    st_sched_destroy(s);
}

/* step until cond or n steps; returns the steps taken */
#define STEP_UNTIL(s, cond, n)                                                                     \
    ({                                                                                             \
        int k_ = 0;                                                                                \
        while (!(cond) && k_ < (n)) st_sched_step(s), k_++;                                        \
        k_;                                                                                        \
    })

static st_sched *make_pool(const st_model *m, int max_seqs, int64_t ctx, int64_t kv_blocks, int max_queue,
                           double head_wait, double stall) {
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = max_seqs;
    sp.step_tokens = 64;
    sp.ctx = ctx;
    sp.kv_blocks = kv_blocks;
    sp.max_queue = max_queue;
    sp.head_wait_s = head_wait;
    sp.stall_timeout_s = stall;
    st_sched *s = NULL;
    st_error err = {0};
    if (st_sched_create(m, NULL, &sp, &s, &err) != ST_OK) printf("# sched: %s\n", err.msg);
    return s;
}

/* A pool smaller than a context, a queue head short of blocks, cancels in the queue, and a
 * queue of size 0. (Before: a request without max_tokens waited forever for blocks the pool
 * could never have, blocking everyone behind it; cancelled requests behind the head stayed;
 * --max-queue 0 refused everything.) */
static void test_admission(const st_model *m) {
    if (!m) return;
    st_error err = {0};
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = (i * 13) % 1000 + 1;
    st_req_params rp = st_req_default_params();
    rp.ignore_eos = 1;
    /* 16 blocks of 16 positions: the context becomes 256 */
    st_sched *s = make_pool(m, 3, 4096, 16, 4, 10.0, 60.0);
    if (!s) return;
    const st_cache *c = st_sched_cache(s);
    CHECK(st_sched_context(s) == 256, "a KV pool of 16 x 16 positions caps the 4096 context at %lld",
          (long long)st_sched_context(s));
    out a;
    memset(&a, 0, sizeof a);
    CHECK(st_sched_submit(s, prompt, 260, &rp, on_event, &a, NULL, &err) == ST_ERR_LIMIT &&
              strstr(err.msg, "context length is 256"),
          "a prompt the pool cannot hold is refused at submission: %s", err.msg);
    rp.max_tokens = 0; /* until the context is full, the chat default */
    CHECK(st_sched_submit(s, prompt, 10, &rp, on_event, &a, NULL, &err) == ST_OK, "submitted without max_tokens");
    int steps = STEP_UNTIL(s, a.done, 400);
    CHECK(a.done && a.finish == ST_FINISH_LENGTH && a.n == 246 && c->n_free_blocks == 16,
          "without max_tokens it runs to the end of what the pool holds (%d tokens, %d steps) instead of waiting forever",
          a.n, steps);
    /* a running sequence holds 10 blocks; the head wants 8 (6 are free), the next one 2 */
    out r1, head, small, gone;
    memset(&r1, 0, sizeof r1);
    memset(&head, 0, sizeof head);
    memset(&small, 0, sizeof small);
    memset(&gone, 0, sizeof gone);
    uint64_t id_gone = 0;
    rp.max_tokens = 150;
    st_sched_submit(s, prompt, 10, &rp, on_event, &r1, NULL, &err);
    st_sched_step(s);
    rp.max_tokens = 100;
    st_sched_submit(s, prompt, 28, &rp, on_event, &head, NULL, &err);
    rp.max_tokens = 20;
    st_sched_submit(s, prompt, 4, &rp, on_event, &gone, &id_gone, &err);
    st_sched_submit(s, prompt, 4, &rp, on_event, &small, NULL, &err);
    st_sched_cancel(s, id_gone);
    st_sched_step(s);
    st_sched_stats ss;
    st_sched_get_stats(s, &ss);
    CHECK(gone.done && gone.finish == ST_FINISH_CANCELLED && gone.n == 0,
          "a request cancelled behind a waiting head leaves the queue at the next step");
    CHECK(small.n >= 1 && head.n == 0 && ss.running == 2 && ss.waiting == 1,
          "a request that fits goes ahead of a head short of KV blocks (%d running, %d waiting)", ss.running, ss.waiting);
    STEP_UNTIL(s, r1.done && head.done && small.done, 2000);
    CHECK(r1.n == 150 && head.n == 100 && small.n == 20 && c->n_free_blocks == 16,
          "all three complete, every block back");
    st_sched_destroy(s);
    /* head_wait 0: the head's turn at once, nobody passes it */
    s = make_pool(m, 3, 4096, 16, 4, 0.0, 60.0);
    memset(&r1, 0, sizeof r1);
    memset(&head, 0, sizeof head);
    memset(&small, 0, sizeof small);
    rp.max_tokens = 150;
    st_sched_submit(s, prompt, 10, &rp, on_event, &r1, NULL, &err);
    st_sched_step(s);
    rp.max_tokens = 100;
    st_sched_submit(s, prompt, 28, &rp, on_event, &head, NULL, &err);
    rp.max_tokens = 20;
    st_sched_submit(s, prompt, 4, &rp, on_event, &small, NULL, &err);
    st_sched_step(s);
    int passed = small.n > 0;
    STEP_UNTIL(s, r1.done && head.done && small.done, 2000);
    CHECK(!passed && head.done && small.done && head.n == 100 && small.n == 20,
          "once the head has waited head_wait_s, later requests wait behind it");
    st_sched_destroy(s);
    /* max_queue 0: a free slot still takes a request */
    s = make_pool(m, 1, 256, 0, 0, 10.0, 60.0);
    memset(&a, 0, sizeof a);
    rp.max_tokens = 3;
    st_status st1 = st_sched_submit(s, prompt, 4, &rp, on_event, &a, NULL, &err);
    out b;
    memset(&b, 0, sizeof b);
    st_status st2 = st_sched_submit(s, prompt, 4, &rp, on_event, &b, NULL, &err);
    run_all(s);
    CHECK(st1 == ST_OK && a.done && a.n == 3 && st2 == ST_ERR_BUSY,
          "max_queue 0: an idle scheduler takes a request, the next one beyond max_seqs is busy");
    st_sched_destroy(s);
}

/* A consumer that cannot keep up pauses its sequence; the others go on; resume continues it;
 * a pause that lasts past stall_timeout_s ends it with an error. */
static void test_pause(const st_model *m) {
    if (!m) return;
    st_sched *s = make_pool(m, 2, 512, 0, 4, 10.0, 0.3);
    if (!s) return;
    const st_cache *c = st_sched_cache(s);
    st_error err = {0};
    int32_t prompt[4] = {3, 4, 5, 6};
    st_req_params rp = st_req_default_params();
    rp.ignore_eos = 1;
    rp.max_tokens = 40;
    out slow, fast;
    memset(&slow, 0, sizeof slow);
    memset(&fast, 0, sizeof fast);
    slow.pause_at = 3;
    uint64_t id_slow = 0;
    st_sched_submit(s, prompt, 4, &rp, on_event, &slow, &id_slow, &err);
    st_sched_submit(s, prompt, 4, &rp, on_event, &fast, NULL, &err);
    for (int i = 0; i < 10; i++) st_sched_step(s);
    st_sched_stats ss;
    st_sched_get_stats(s, &ss);
    CHECK(slow.n == 3 && fast.n == 10 && ss.paused == 1 && ss.running == 2,
          "a paused sequence is left out of steps, the other goes on (%d and %d tokens, %d paused)", slow.n, fast.n,
          ss.paused);
    st_sched_resume(s, id_slow);
    st_sched_step(s);
    CHECK(slow.n == 4, "resumed, it continues (%d tokens)", slow.n);
    /* a resume that arrives before its pause cancels it out */
    st_sched_resume(s, id_slow);
    slow.pause_at = 5;
    st_sched_step(s);
    st_sched_step(s);
    CHECK(slow.n == 6, "a resume sent before its pause leaves the sequence running (%d tokens)", slow.n);
    /* stalled */
    slow.pause_at = 7;
    STEP_UNTIL(s, slow.n == 7, 10);
    double t0 = st_now_s();
    int waits = 0;
    while (!slow.done && st_now_s() - t0 < 3.0) {
        if (!st_sched_wait(s)) break;
        st_sched_step(s);
        waits++;
    }
    double dt = st_now_s() - t0;
    CHECK(slow.done && slow.finish == ST_FINISH_ERROR && strstr(slow.err, "did not read") && dt >= 0.25 && dt < 1.5,
          "paused past the stall timeout, it ends with an error after %.2f s (%s); st_sched_wait woke for it", dt,
          slow.err);
    run_all(s);
    CHECK(fast.done && fast.n == 40 && c->n_free_blocks == c->p.n_blocks && c->n_free_slots == 2,
          "the other completes; every block and slot is back");
    st_sched_destroy(s);
}

/* A checkpoint whose logits turn NaN for one sequence: that one ends with an error naming
 * the problem, the other in the same batches completes. (Before: greedy picked token 0.) */
static void test_nonfinite(const char *cfg_path) {
    char dir[] = "/tmp/strand-nan-XXXXXX";
    if (!mkdtemp(dir)) return;
    st_synth_params sp = st_synth_default_params();
    sp.config_path = cfg_path;
    sp.poison_token = 7;
    st_model *m = NULL;
    st_error err = {0};
    if (CHECK(st_synth_write(&sp, dir, &err) == ST_OK && st_model_load(dir, &m, &err) == ST_OK,
              "a model whose token 7 embeds as NaN (%s)", err.msg)) {
        st_sched *s = make_pool(m, 2, 256, 0, 4, 10.0, 60.0);
        st_req_params rp = st_req_default_params();
        rp.ignore_eos = 1;
        rp.max_tokens = 20;
        rp.logprobs = 2;
        int32_t bad[3] = {5, 7, 9}, good[3] = {5, 8, 9};
        out ob, og;
        memset(&ob, 0, sizeof ob);
        memset(&og, 0, sizeof og);
        st_sched_submit(s, bad, 3, &rp, on_event, &ob, NULL, &err);
        st_sched_submit(s, good, 3, &rp, on_event, &og, NULL, &err);
        run_all(s);
        CHECK(ob.done && ob.finish == ST_FINISH_ERROR && ob.n == 0 && strstr(ob.err, "non-finite logits"),
              "non-finite logits end that sequence with an error: %s", ob.err);
        CHECK(og.done && og.finish == ST_FINISH_LENGTH && og.n == 20 && isfinite(og.first_logprob),
              "the other sequence of the same batches completes with finite logprobs");
        st_sched_destroy(s);
        st_model_free(m);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("# cleanup failed\n");
}

/* The memory plan on the 0.8B shape (only the config is needed): the default (262,144
 * context, 8 sequences: ~49 GiB) against a 20 GiB budget is sized down; explicit plans that
 * cannot fit are refused before anything is allocated, with alternatives that do fit. */
static void test_plan(void) {
    const char *cfg =
        "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 248320, \"hidden_size\": 1024, \"intermediate_size\": 3584,"
        "\"num_hidden_layers\": 24, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 256,"
        "\"linear_num_key_heads\": 16, \"linear_num_value_heads\": 16, \"linear_key_head_dim\": 128,"
        "\"linear_value_head_dim\": 128, \"full_attention_interval\": 4, \"max_position_embeddings\": 262144}";
    st_model m;
    memset(&m, 0, sizeof m);
    st_error err = {0};
    if (!CHECK(st_config_parse(cfg, strlen(cfg), "0.8b", &m.cfg, &err) == ST_OK, "0.8B config (%s)", err.msg)) return;
    m.n_full = st_config_count_layers(&m.cfg, ST_LAYER_FULL);
    m.n_linear = st_config_count_layers(&m.cfg, ST_LAYER_LINEAR);
    const size_t G = (size_t)1 << 30, budget = 20 * G;
    st_sched_params p = st_sched_default_params();
    st_sched_plan pl, up;
    CHECK(st_sched_plan_for(&m, &p, &pl, &err) == ST_OK && pl.ctx == 262144 && pl.kv_blocks == 8 * 262144 / 16 &&
              pl.total_bytes > 45 * G && !pl.fitted,
          "without a budget: 8 sequences x 262,144 positions, %.1f GiB", (double)pl.total_bytes / (double)G);
    p.mem_budget = budget;
    int ok = st_sched_plan_for(&m, &p, &pl, &err) == ST_OK;
    st_sched_params q = p;
    q.mem_budget = 0;
    q.ctx = pl.ctx + 16;
    st_sched_plan_for(&m, &q, &up, &err);
    CHECK(ok && pl.fitted && pl.ctx % 16 == 0 && pl.ctx < 262144 && pl.kv_blocks == 8 * pl.ctx / 16 &&
              pl.total_bytes <= budget && up.total_bytes > budget,
          "a 20 GiB budget: the default context shrinks to the largest that 8 sequences hold (%lld, %.2f GiB)",
          (long long)pl.ctx, (double)pl.total_bytes / (double)G);
    p.ctx = 262144;
    ok = st_sched_plan_for(&m, &p, &pl, &err) == ST_OK;
    CHECK(ok && pl.fitted && pl.ctx == 262144 && pl.kv_blocks >= 262144 / 16 && pl.kv_blocks < 8 * 262144 / 16 &&
              pl.total_bytes <= budget,
          "--ctx 262144: the pool shrinks to what fits (%.2f contexts)", (double)pl.kv_blocks * 16 / 262144.0);
    p.ctx = (int64_t)1 << 30;
    double t0 = st_now_s();
    st_status st = st_sched_plan_for(&m, &p, &pl, &err);
    double dt = st_now_s() - t0;
    long long alt_ctx = 0;
    const char *at = strstr(err.msg, "--ctx ");
    if (at) alt_ctx = atoll(at + 6);
    q = p;
    q.ctx = alt_ctx;
    CHECK(st == ST_ERR_LIMIT && strstr(err.msg, "GiB") && alt_ctx > 0 && strstr(err.msg, "--kv-blocks") &&
              st_sched_plan_for(&m, &q, &pl, &err) == ST_OK && dt < 1.0,
          "--ctx 2^30 is refused at once (%.3f s), naming plans that fit", dt);
    p.ctx = 0;
    p.kv_blocks = 2 * 1000000;
    CHECK(st_sched_plan_for(&m, &p, &pl, &err) == ST_ERR_LIMIT && strstr(err.msg, "--max-seqs"),
          "an explicit --kv-blocks beyond the budget is refused: %.200s", err.msg);
    st_config_free(&m.cfg);
}

/* The plan's parts are what st_sched_create allocates. */
static void test_plan_matches(const st_model *m) {
    if (!m) return;
    st_sched *s = make(m, NULL, 3, 64, 4096);
    if (!s) return;
    const st_sched_plan *pl = st_sched_get_plan(s);
    const st_cache *c = st_sched_cache(s);
    st_sched_stats ss;
    st_sched_get_stats(s, &ss);
    size_t cache_plan = pl->kv_bytes + pl->state_bytes;
    st_fwd *f = st_sched_forward(s);
    /* the cache: the engine's books and the backend's KV blocks and state slots */
    const size_t storage = st_bctx_cpu_storage_bytes(st_fwd_ctx(f));
    const size_t cache_got = c->planned_bytes + storage;
    const size_t scratch_got = st_fwd_bytes(f) - storage;
    double scratch_ratio = (double)pl->scratch_bytes / (double)scratch_got;
    double engine_ratio = (double)(cache_plan + pl->scratch_bytes) /
                          (double)(ss.planned_bytes - (pl->other_bytes - 3 * 65536));
    CHECK(cache_got >= cache_plan && cache_got - cache_plan < 64 * 1024 && scratch_ratio > 0.9 && scratch_ratio < 1.1 &&
              engine_ratio > 0.9 && engine_ratio < 1.1,
          "the plan's cache part is what the cache and the backend allocated (%zu vs %zu bytes), its scratch within 10%% "
          "(%.3f), the whole within 10%% (%.3f)",
          cache_plan, cache_got, scratch_ratio, engine_ratio);
    st_sched_destroy(s);
}

/* stop strings and text need a tokenizer: a synthetic tiny model with the Qwen3 tokenizer */
static void test_text(void) {
    char dir[] = "/tmp/strand-sched-XXXXXX";
    if (!mkdtemp(dir)) return;
    char tokdir[512];
    snprintf(tokdir, sizeof tokdir, "%s/tokenizers/qwen3", tap_data_dir());
    st_synth_params sp = st_synth_default_params();
    sp.preset = "tiny";
    sp.tokenizer_dir = tokdir;
    st_error err = {0};
    st_model *m = NULL;
    st_tokenizer *tok = NULL;
    if (!CHECK(st_synth_write(&sp, dir, &err) == ST_OK && st_model_load(dir, &m, &err) == ST_OK &&
                   st_tok_load_dir(dir, &tok, &err) == ST_OK,
               "tiny model with the Qwen3 tokenizer (%s)", err.msg))
        return;
    st_sched *s = make(m, tok, 2, 64, 256);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = 40;
    rp.ignore_eos = 1;
    int32_t prompt[3] = {9707, 11, 1879};
    out full, cut;
    memset(&full, 0, sizeof full);
    memset(&cut, 0, sizeof cut);
    st_sched_submit(s, prompt, 3, &rp, on_event, &full, NULL, &err);
    run_all(s);
    /* a stop string taken from the middle of the text, spanning bytes of several tokens */
    char stop[16] = "";
    size_t at = full.text_len / 2;
    if (full.text_len > 20) {
        while (at < full.text_len && ((unsigned char)full.text[at] & 0xc0) == 0x80) at++;
        size_t len = 6;
        while (at + len < full.text_len && ((unsigned char)full.text[at + len] & 0xc0) == 0x80) len++;
        memcpy(stop, full.text + at, len);
        stop[len] = 0;
        /* the stop must not occur earlier */
        char *first = strstr(full.text, stop);
        at = first ? (size_t)(first - full.text) : at;
    }
    rp.stop[0] = stop;
    rp.n_stop = 1;
    st_sched_submit(s, prompt, 3, &rp, on_event, &cut, NULL, &err);
    run_all(s);
    CHECK(full.text_len > 20 && cut.finish == ST_FINISH_STOP && cut.text_len == at &&
              !memcmp(cut.text, full.text, at),
          "a stop string ends the text just before it, not emitted (%zu of %zu bytes)", cut.text_len, full.text_len);
    /* JSON output beside a free sequence: the free one's tokens and log-probabilities are
     * the same bits as alone; the JSON one parses and ends with its object */
    {
        st_req_params fp = st_req_default_params();
        fp.max_tokens = 40;
        fp.ignore_eos = 1;
        fp.logprobs = 3;
        fp.sampling.temperature = 0.8f;
        fp.sampling.has_seed = 1;
        fp.sampling.seed = 11;
        out alone, beside, js;
        memset(&alone, 0, sizeof alone);
        memset(&beside, 0, sizeof beside);
        memset(&js, 0, sizeof js);
        st_sched_submit(s, prompt, 3, &fp, on_event, &alone, NULL, &err);
        run_all(s);
        st_req_params jp = fp;
        jp.json_mode = ST_GRAM_JSON_OBJECT;
        jp.max_tokens = 200;
        jp.sampling.seed = 7; /* a seed whose reply closes within 200 tokens */
        st_sched_submit(s, prompt, 3, &jp, on_event, &js, NULL, &err);
        st_sched_submit(s, prompt, 3, &fp, on_event, &beside, NULL, &err);
        run_all(s);
        CHECK(beside.n == alone.n && !memcmp(beside.ids, alone.ids, sizeof alone.ids) &&
                  !memcmp(&beside.first_logprob, &alone.first_logprob, sizeof alone.first_logprob) &&
                  beside.text_len == alone.text_len && !memcmp(beside.text, alone.text, alone.text_len),
              "a free sequence beside a JSON one: its %d tokens and text the same as alone", alone.n);
        json_t *j = json_loadb(js.text, js.text_len, 0, NULL);
        CHECK(js.finish == ST_FINISH_STOP && json_is_object(j),
              "the JSON one ends (finish %s, %d tokens) with its object: '%.60s'", st_finish_name(js.finish), js.n, js.text);
        json_decref(j);
    }
    st_sched_destroy(s);
    st_tok_free(tok);
    st_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("# cleanup failed\n");
}

int main(void) {
    test_invariance("tiny-a");
    test_invariance("tiny-b");
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/tiny-a", tap_data_dir());
    st_model *m = NULL;
    st_checkpoint *g = NULL;
    st_error err = {0};
    /* a 2-layer model (one of each kind) keeps 20,000 steps of attention cheap */
    {
        char dir[] = "/tmp/strand-long-XXXXXX", cfg[600];
        st_model *small = NULL;
        if (mkdtemp(dir)) {
            snprintf(cfg, sizeof cfg, "%s/config.json", dir);
            const char *text =
                "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 1100, \"hidden_size\": 32,"
                "\"intermediate_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 1,"
                "\"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_key_head_dim\": 8,"
                "\"linear_value_head_dim\": 8, \"linear_num_key_heads\": 1, \"linear_num_value_heads\": 1,"
                "\"full_attention_interval\": 2, \"max_position_embeddings\": 32768}";
            FILE *f = fopen(cfg, "w");
            if (f) {
                fputs(text, f);
                fclose(f);
            }
            st_synth_params sp = st_synth_default_params();
            sp.config_path = cfg;
            if (st_synth_write(&sp, dir, &err) != ST_OK || st_model_load(dir, &small, &err) != ST_OK)
                printf("# small model: %s\n", err.msg);
            test_bounded(small);
            test_admission(small);
            test_plan_matches(small);
            test_pause(small);
            FILE *untied = fopen(cfg, "w");
            if (untied) { /* the same shapes with an untied head */
                fputs(text, untied);
                fseek(untied, -1, SEEK_END);
                fputs(", \"tie_word_embeddings\": false}", untied);
                fclose(untied);
            }
            test_nonfinite(cfg);
            st_model_free(small);
            snprintf(cfg, sizeof cfg, "rm -rf %s", dir);
            if (system(cfg) != 0) printf("# cleanup failed\n");
        }
    }
    if (CHECK(st_model_load(path, &m, &err) == ST_OK, "tiny-a loads")) {
        test_release(m);
        test_fail(m);
        test_broken_job(m);
        test_limits(m);
        snprintf(path, sizeof path, "%s/fixtures/tiny-a/golden.safetensors", tap_data_dir());
        if (st_checkpoint_open(path, &g, &err) == ST_OK) test_stops_logprobs(m, g);
        st_checkpoint_close(g);
        st_model_free(m);
    }
    test_text();
    test_plan();
    return tap_done();
}
