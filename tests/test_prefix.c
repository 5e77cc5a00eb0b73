/* ==== The prefix cache: block books, snapshots, and bit-exact reuse through the scheduler ====
 * Books (engine/cache.h, no model run): a filled block is found again by its contents and
 * only by them; a block equal to a registered one is exchanged for it; a snapshot is found
 * at the longest prefix that has its blocks, partial blocks never match; a snapshot whose
 * block was evicted is dropped and the lookup falls back to an earlier one; eviction takes
 * the oldest cached block and nothing that is held.
 * Scheduler (tiny-a, CPU): a request served from the cache gives the tokens and the logprob
 * bits (chosen and top 20) of the same request on a cold scheduler; a chat's next turn
 * resumes after the previous reply; sharers that run together are each right; a small pool
 * under pressure finishes everything with every block accounted for. */
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "backend/cuda.h"
#include "engine/cache.h"
#include "engine/scheduler.h"
#include "kit.h"
#include "model/synth.h"
#include "tap.h"

#include "alloc_count.h"

/* ---------------------------------------------------------------------------------------- */
/* the books */

static st_cache *books(const st_model *m, int n_slots, int64_t n_blocks, int n_snapshots) {
    st_cache_params p = st_cache_default_params();
    p.n_slots = n_slots;
    p.max_seq_len = 1024;
    p.block_size = 16;
    p.n_blocks = n_blocks;
    p.prefix = 1;
    p.n_snapshots = n_snapshots;
    st_cache *c = NULL;
    st_error err = {0};
    if (st_cache_create(m, &p, &c, &err) != ST_OK) printf("# cache: %s\n", err.msg);
    return c;
}

/* a sequence that takes n tokens of ids, with public snapshots at the positions listed */
static void feed(st_cache *c, st_seq *s, const int32_t *ids, int64_t n) {
    st_error err = {0};
    if (st_cache_seq_reserve(c, s, n, &err) != ST_OK) printf("# reserve: %s\n", err.msg);
    st_cache_seq_commit(c, s, ids, n);
}

static void test_books(const st_model *m) {
    st_cache *c = books(m, 4, 64, 3);
    if (!CHECK(c != NULL, "a cache with the prefix cache")) return;
    int32_t a[200], b[200];
    for (int i = 0; i < 200; i++) a[i] = b[i] = 1 + (i * 37) % 500;
    b[40] = 999; /* b shares 40 positions with a: two whole blocks and half of the third */
    st_seq s1, s2;
    int slot = 0;
    st_error err = {0};
    /* a cold lookup misses */
    st_cache_seq_start_prefix(c, &s1, a, 100, &slot, &err);
    CHECK(s1.n_past == 0 && slot < 0 && s1.n_blocks == 0, "a cold prompt misses");
    feed(c, &s1, a, 64);
    int snap64 = st_cache_snap_public(c, &s1);
    CHECK(snap64 == 4, "a snapshot at 64 takes the first snapshot slot after the 4 sequence slots (%d)", snap64);
    CHECK(st_cache_snap_public(c, &s1) == -1, "an equal snapshot is not taken twice");
    feed(c, &s1, a + 64, 36);
    int32_t held[8];
    memcpy(held, s1.blocks, sizeof held);
    st_cache_seq_release(c, &s1);
    CHECK(c->n_cached_blocks == 6 && c->n_free_blocks == 58,
          "after the release its 6 filled blocks stay cached, the partial one is free (%lld cached, %lld free)",
          (long long)c->n_cached_blocks, (long long)c->n_free_blocks);
    /* the same prompt resumes at 64 with the same blocks */
    st_cache_seq_start_prefix(c, &s1, a, 100, &slot, &err);
    CHECK(s1.n_past == 64 && slot == snap64 && s1.n_blocks == 4 && memcmp(s1.blocks, held, 4 * sizeof *held) == 0,
          "the same prompt resumes at 64 from that snapshot with the first 4 blocks (n_past %lld)", (long long)s1.n_past);
    CHECK(c->n_cached_blocks == 2, "the 4 blocks it holds left the cached list");
    /* b shares 40 positions: blocks 0 and 1 match, but no snapshot at 32 exists */
    st_cache_seq_start_prefix(c, &s2, b, 100, &slot, &err);
    CHECK(s2.n_past == 0 && slot < 0, "a prefix with blocks but no snapshot misses");
    /* it fills its own blocks 0 and 1: equal to the registered ones, so exchanged for them */
    feed(c, &s2, b, 32);
    int snap32 = st_cache_snap_public(c, &s2);
    feed(c, &s2, b + 32, 8);
    CHECK(s2.blocks[0] == held[0] && s2.blocks[1] == held[1] && s2.blocks[2] != held[2],
          "filled blocks equal to registered ones are exchanged for them; the differing one is not");
    CHECK(c->ref[held[0]] == 2, "a shared block has both holders");
    CHECK(snap32 == 5, "a snapshot at 32 (%d)", snap32);
    CHECK(st_cache_snap_public(c, &s2) == -1, "no snapshot inside a block (at 40)");
    st_cache_seq_release(c, &s2);
    /* now b resumes at 32 (a partial block, 32..40, never matches) */
    st_cache_seq_start_prefix(c, &s2, b, 100, &slot, &err);
    CHECK(s2.n_past == 32 && slot == snap32, "a prompt sharing 40 positions resumes at 32 (%lld)", (long long)s2.n_past);
    /* a prompt of exactly 64 tokens may resume at 48 at most (one token is always prefilled) */
    st_cache_seq_release(c, &s2);
    st_cache_seq_start_prefix(c, &s2, a, 64, &slot, &err);
    CHECK(s2.n_past == 32 && slot == snap32, "a 64-token prompt cannot use the snapshot at 64 (resumes at %lld)",
          (long long)s2.n_past);
    st_cache_seq_release(c, &s2);
    st_cache_seq_release(c, &s1);
    /* the pool of 3: another prompt's snapshot fits; a fourth evicts the one no request
     * resumed from (the third), not the older ones that were used */
    int32_t y[64];
    for (int i = 0; i < 64; i++) y[i] = 700 + i;
    st_cache_seq_start(c, &s1, &err);
    feed(c, &s1, y, 16);
    CHECK(st_cache_snap_public(c, &s1) == 6, "a third snapshot in the last free entry");
    feed(c, &s1, y + 16, 16);
    int snap_y = st_cache_snap_public(c, &s1);
    CHECK(snap_y == 6, "a fourth snapshot evicts the unused third, not the used ones: slot %d", snap_y);
    CHECK(c->stats.snapshots_evicted == 1, "one snapshot evicted");
    st_cache_seq_release(c, &s1);
    /* once all were used, the least recently used goes (64: 32 was used after it) */
    st_cache_seq_start_prefix(c, &s1, y, 40, &slot, &err);
    CHECK(s1.n_past == 32 && slot == snap_y, "y resumes at 32 from its snapshot");
    feed(c, &s1, y + 32, 16);
    CHECK(st_cache_snap_public(c, &s1) == snap64, "a fifth snapshot evicts the least recently used (at 64)");
    st_cache_seq_release(c, &s1);
    /* a prompt that shares 100 positions of a: the snapshot at 64 is gone, 32 is the nearest */
    for (int i = 0; i < 200; i++) b[i] = a[i];
    b[100] = 998;
    st_cache_seq_start_prefix(c, &s2, b, 150, &slot, &err);
    CHECK(s2.n_past == 32 && slot == snap32, "with the snapshot at 64 evicted it falls back to 32 (%lld)",
          (long long)s2.n_past);
    st_cache_seq_release(c, &s2);
    /* block pressure: a sequence that needs the whole pool evicts cached blocks, oldest first;
     * a snapshot whose block is gone is dropped at the next lookup */
    int64_t before = c->stats.blocks_evicted, cached_before = c->n_cached_blocks;
    st_cache_seq_start(c, &s1, &err);
    int32_t z[1024];
    for (int i = 0; i < 1024; i++) z[i] = 2000 + i % 7;
    feed(c, &s1, z, 1024);
    CHECK(s1.n_blocks == 64 && cached_before > 0 && c->stats.blocks_evicted - before == cached_before,
          "a sequence given the whole pool evicted the cached blocks (%lld)", (long long)(c->stats.blocks_evicted - before));
    st_cache_seq_release(c, &s1);
    st_cache_seq_start_prefix(c, &s2, a, 200, &slot, &err);
    CHECK(s2.n_past == 0 && slot < 0 && c->stats.snapshots_public == 0,
          "after the eviction nothing of a matches and its snapshots were dropped");
    st_cache_seq_release(c, &s2);
    CHECK(st_cache_available_blocks(c) == c->p.n_blocks && c->n_free_slots == 4, "everything is free or cached at the end");
    st_cache_destroy(c);
}

/* Every block is free, cached (registered, no holder) or held, and the holds add up to
 * the sequences' tables; cached ones are registered with no holder; a sequence's filled
 * blocks are registered. */
static int books_consistent(const st_cache *c, const st_seq *seqs, int n_seqs, char *why, size_t cap) {
    int64_t held = 0, refs = 0, table_refs = 0, cached = 0;
    for (int64_t b = 0; b < c->p.n_blocks; b++) {
        held += c->ref[b] > 0;
        refs += c->ref[b];
        if (c->ref[b] < 0) return snprintf(why, cap, "block %lld has %d holders", (long long)b, c->ref[b]), 0;
    }
    for (int32_t b = c->lru_head; b >= 0; b = c->lru_next[b]) {
        cached++;
        if (c->ref[b] != 0 || !c->registered[b]) return snprintf(why, cap, "cached block %d is held or unregistered", b), 0;
    }
    for (int i = 0; i < n_seqs; i++) {
        const st_seq *q = &seqs[i];
        if (q->slot < 0) continue;
        table_refs += q->n_blocks;
        for (int64_t j = 0; j < q->n_past / c->p.block_size; j++)
            if (!c->registered[q->blocks[j]]) return snprintf(why, cap, "a filled block of sequence %d is not registered", i), 0;
    }
    if (cached != c->n_cached_blocks || c->n_free_blocks + cached + held != c->p.n_blocks || refs != table_refs)
        return snprintf(why, cap, "free %lld + cached %lld + held %lld of %lld blocks; %lld holds, %lld in tables",
                        (long long)c->n_free_blocks, (long long)cached, (long long)held, (long long)c->p.n_blocks,
                        (long long)refs, (long long)table_refs),
               0;
    return 1;
}

/* Random operations on the books (prompts from a few families so that prefixes recur):
 * start with a lookup, grow, snapshot, fork, trim, release; the books stay consistent after
 * every one, and a resumed sequence's blocks hold the tokens of its prompt. */
static void test_books_random(const st_model *m) {
    enum { NS = 6 };
    st_cache *c = books(m, NS, 48, 5);
    if (!c) return;
    st_seq seqs[NS];
    int32_t toks[NS][1024];
    for (int i = 0; i < NS; i++) seqs[i].slot = -1;
    uint64_t x = 12345;
    int ok = 1, resumed_right = 1, ops = 0, hits = 0;
    char why[200] = "";
    st_error err = {0};
    for (; ops < 20000 && ok; ops++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int i = (int)(x % NS), op = (int)((x >> 8) % 8);
        st_seq *q = &seqs[i];
        if (q->slot < 0) {
            const int fam = (int)((x >> 16) % 3), len = 1 + (int)((x >> 20) % 300);
            for (int t = 0; t < 1024; t++) toks[i][t] = fam * 100 + (t < 100 + fam * 30 ? t % 50 : (int)((x >> 24) + t) % 97);
            int slot = -1;
            if (st_cache_seq_start_prefix(c, q, toks[i], len, &slot, &err) != ST_OK) continue;
            hits += q->n_past > 0;
            for (int64_t pos = 0; pos < q->n_past; pos++) /* the blocks it resumed with hold its prompt */
                resumed_right &= c->tokens[(size_t)q->blocks[pos / 16] * 16 + (size_t)(pos % 16)] == toks[i][pos];
        } else if (op < 4) { /* grow by a few tokens */
            const int64_t n = 1 + (int64_t)((x >> 12) % 40);
            if (q->n_past + n <= 1024 && st_cache_seq_reserve(c, q, n, &err) == ST_OK)
                st_cache_seq_commit(c, q, toks[i] + q->n_past, n);
        } else if (op == 4) {
            st_cache_snap_public(c, q);
        } else if (op == 5) {
            st_cache_snap_private(c, q);
        } else if (op == 6) { /* fork into a free record */
            int k = 0;
            while (k < NS && seqs[k].slot >= 0) k++;
            if (k < NS && st_cache_available_blocks(c) > 0 && st_cache_seq_start(c, &seqs[k], &err) == ST_OK) {
                int32_t from = -1;
                st_cache_seq_fork(c, q, &seqs[k], &from);
                memcpy(toks[k], toks[i], sizeof toks[k]);
            }
        } else {
            st_cache_seq_release(c, q);
        }
        ok = books_consistent(c, seqs, NS, why, sizeof why);
    }
    for (int i = 0; i < NS; i++) st_cache_seq_release(c, &seqs[i]);
    ok = ok && books_consistent(c, seqs, NS, why, sizeof why) && st_cache_available_blocks(c) == c->p.n_blocks;
    CHECK(ok && resumed_right && hits > 100,
          "%d random operations on the books: consistent after each (%s), %d resumed sequences hold their prompts' tokens",
          ops, why[0] ? why : "ok", hits);
    st_cache_destroy(c);
}

/* ---------------------------------------------------------------------------------------- */
/* through the scheduler */

#define MAXG 48
typedef struct rec_out {
    int32_t ids[MAXG];
    float lp[MAXG][1 + ST_MAX_LOGPROBS];
    int n, done;
    st_usage usage;
    st_finish_reason finish;
} rec_out;

static int on_event(void *user, const st_event *ev) {
    rec_out *o = user;
    if (ev->kind == ST_EV_TOKEN) {
        if (o->n < MAXG) {
            o->ids[o->n] = ev->token;
            o->lp[o->n][0] = ev->logprobs ? ev->logprobs->logprob : 0;
            for (int i = 0; ev->logprobs && i < ev->logprobs->n_top; i++) o->lp[o->n][1 + i] = ev->logprobs->top_logprobs[i];
        }
        o->n++;
    } else {
        o->done = 1;
        o->usage = ev->usage;
        o->finish = ev->finish;
    }
    return ST_EV_CONTINUE;
}

static st_backend *g_cuda; /* STRAND_DEVICE=cuda: every scheduler runs on it (borrowed) */

static st_sched *sched(const st_model *m, int prefix, int max_seqs, int64_t kv_blocks, int step_tokens, int snapshots) {
    st_sched_params sp = st_sched_default_params();
    sp.backend = g_cuda;
    sp.snapshots = snapshots;
    sp.max_seqs = max_seqs;
    sp.ctx = 1024;
    sp.step_tokens = step_tokens;
    sp.kv_blocks = kv_blocks;
    sp.prefix_cache = prefix;
    sp.snapshot_every = 4;
    st_sched *s = NULL;
    st_error err = {0};
    if (st_sched_create(m, NULL, &sp, &s, &err) != ST_OK) printf("# sched: %s\n", err.msg);
    return s;
}

static uint64_t submit(st_sched *s, const int32_t *p, int64_t n, int max_tokens, rec_out *o) {
    memset(o, 0, sizeof *o);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = max_tokens;
    rp.sampling.temperature = 0;
    rp.logprobs = 20;
    rp.ignore_eos = 1;
    uint64_t id = 0;
    st_error err = {0};
    if (st_sched_submit(s, p, n, &rp, on_event, o, &id, &err) != ST_OK) printf("# submit: %s\n", err.msg);
    return id;
}

static void run_all(st_sched *s) {
    while (st_sched_step(s) > 0) {
    }
}

/* one request alone on a fresh scheduler (a cold server), with the prefix cache or not */
static void cold_as(const st_model *m, int prefix, const int32_t *p, int64_t n, int max_tokens, rec_out *o) {
    st_sched *s = sched(m, prefix, 1, 0, 512, 0);
    if (!s) return;
    submit(s, p, n, max_tokens, o);
    run_all(s);
    st_sched_destroy(s);
}

static void cold(const st_model *m, const int32_t *p, int64_t n, int max_tokens, rec_out *o) {
    cold_as(m, 1, p, n, max_tokens, o);
}

static int same(const rec_out *a, const rec_out *b) {
    return a->done && b->done && a->n == b->n && memcmp(a->ids, b->ids, sizeof a->ids) == 0 &&
           memcmp(a->lp, b->lp, sizeof a->lp) == 0;
}

static void test_sched(const st_model *m) {
    const int V = (int)m->cfg.vocab_size;
    int32_t sys[300], turn2[400];
    for (int i = 0; i < 300; i++) sys[i] = (int32_t)((i * 7919 + 13) % V);
    rec_out want, got, o2;
    cold(m, sys, 150, 40, &want);
    st_sched *s = sched(m, 1, 4, 0, 64, 0);
    if (!CHECK(s != NULL, "a scheduler with the prefix cache")) return;
    submit(s, sys, 150, 40, &got);
    run_all(s);
    CHECK(same(&got, &want) && got.usage.cached_tokens == 0,
          "cold in 64-token steps: the tokens and logprob bits of a cold run in 512-token steps");
    submit(s, sys, 150, 40, &got);
    run_all(s);
    CHECK(same(&got, &want) && got.usage.cached_tokens == 144,
          "the same request again: 144 positions from the cache (%lld), the same tokens and logprob bits",
          (long long)got.usage.cached_tokens);
    /* the chat's next turn: prompt + reply + more; it resumes after the reply's last block
     * boundary (150 + 40 fed = 189 positions: the private snapshot at 176) */
    memcpy(turn2, sys, 150 * sizeof *turn2);
    memcpy(turn2 + 150, want.ids, 40 * sizeof *turn2);
    for (int i = 190; i < 260; i++) turn2[i] = (int32_t)((i * 31 + 5) % V);
    cold(m, turn2, 260, 30, &want);
    submit(s, turn2, 260, 30, &got);
    run_all(s);
    CHECK(same(&got, &want) && got.usage.cached_tokens == 176,
          "the next turn resumes after the previous reply (176 cached: %lld) and equals a cold run",
          (long long)got.usage.cached_tokens);
    /* sharers together: three prompts with the system part, submitted at once */
    rec_out w[3], g[3];
    int32_t q[3][240];
    for (int k = 0; k < 3; k++) {
        memcpy(q[k], sys + 100, 140 * sizeof(int32_t)); /* a prefix not seen from its start */
        for (int i = 140; i < 240; i++) q[k][i] = (int32_t)((i * (k + 3) + k) % V);
        cold(m, q[k], 200 + 20 * k, 20, &w[k]);
    }
    for (int k = 0; k < 3; k++) submit(s, q[k], 200 + 20 * k, 20, &g[k]);
    run_all(s);
    int ok = 1;
    for (int k = 0; k < 3; k++) ok &= same(&g[k], &w[k]);
    CHECK(ok, "three sharers submitted together each equal their cold run");
    for (int k = 0; k < 3; k++) submit(s, q[k], 200 + 20 * k, 20, &g[k]);
    run_all(s);
    ok = 1;
    int64_t cached = 0;
    for (int k = 0; k < 3; k++) ok &= same(&g[k], &w[k]), cached += g[k].usage.cached_tokens;
    CHECK(ok && cached >= 3 * 128, "and again from the cache (%lld positions cached in all)", (long long)cached);
    st_sched_stats st;
    st_sched_get_stats(s, &st);
    CHECK(st.prefix.hits >= 5 && st.prefix.snapshots_used >= 5 && st.prefix.snapshots_taken > 0,
          "the counters: %lld hits, %lld snapshots taken, %lld used", (long long)st.prefix.hits,
          (long long)st.prefix.snapshots_taken, (long long)st.prefix.snapshots_used);
    st_sched_destroy(s);
    /* block pressure: a pool of 40 blocks (640 positions) and 12 distinct prompts sharing
     * parts (snapshots enough for all) */
    s = sched(m, 1, 2, 40, 128, 64);
    if (!CHECK(s != NULL, "a small pool")) return;
    rec_out pw[12], pg[12];
    int32_t pp[12][300];
    for (int k = 0; k < 12; k++) {
        for (int i = 0; i < 300; i++) pp[k][i] = (int32_t)(((k % 3) * 1000 + i * 17 + (i >= 90 ? k * 7 : 0)) % V);
        cold(m, pp[k], 250, 12, &pw[k]);
    }
    ok = 1;
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 12; k++) submit(s, pp[k], 250, 12, &pg[k]);
        run_all(s);
        for (int k = 0; k < 12; k++) ok &= same(&pg[k], &pw[k]) && pg[k].finish == ST_FINISH_LENGTH;
    }
    st_sched_get_stats(s, &st);
    const st_cache *c = st_sched_cache(s);
    CHECK(ok, "24 requests through a 40-block pool each equal their cold run");
    CHECK(st.prefix.blocks_evicted > 0 && st.prefix.hits > 0 && st_cache_available_blocks(c) == c->p.n_blocks,
          "blocks were evicted (%lld), prefixes hit (%lld), and every block is free or cached at the end",
          (long long)st.prefix.blocks_evicted, (long long)st.prefix.hits);
    st_sched_destroy(s);
    (void)o2;
}

/* n choices: events by index, each choice's DONE, the last one marked */
typedef struct multi_out {
    rec_out ch[4];
    int dones, lasts, last_was_final;
} multi_out;

static int on_multi(void *user, const st_event *ev) {
    multi_out *m = user;
    if (ev->index < 0 || ev->index >= 4) return ST_EV_CONTINUE;
    on_event(&m->ch[ev->index], ev);
    if (ev->kind == ST_EV_DONE) {
        m->dones++;
        m->lasts += ev->last;
        m->last_was_final = ev->last;
    }
    return ST_EV_CONTINUE;
}

static void submit_n(st_sched *s, const int32_t *p, int64_t n, int max_tokens, int choices, float temp, int seeded,
                     multi_out *o) {
    memset(o, 0, sizeof *o);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = max_tokens;
    rp.sampling.temperature = temp;
    rp.sampling.seed = 1234;
    rp.sampling.has_seed = seeded;
    rp.logprobs = 20;
    rp.ignore_eos = 1;
    rp.n = choices;
    st_error err = {0};
    if (st_sched_submit(s, p, n, &rp, on_multi, o, NULL, &err) != ST_OK) printf("# submit: %s\n", err.msg);
}

/* n > 1: the prompt is prefilled once and forked; greedy choices equal the single request,
 * seeded ones are reproducible and choice 0 is the single request with that seed; the
 * blocks come back; n beyond the sequences is refused. */
static void test_fork(const st_model *m, int prefix) {
    const int V = (int)m->cfg.vocab_size;
    int32_t p[100];
    for (int i = 0; i < 100; i++) p[i] = (int32_t)((i * 53 + 7) % V);
    rec_out one;
    cold_as(m, prefix, p, 90, 20, &one);
    st_sched *s = sched(m, prefix, 4, 0, 64, 0);
    if (!s) return;
    multi_out g;
    st_sched_stats a, b;
    st_sched_get_stats(s, &a);
    submit_n(s, p, 90, 20, 3, 0, 0, &g);
    run_all(s);
    st_sched_get_stats(s, &b);
    int ok = g.dones == 3 && g.lasts == 1 && g.last_was_final;
    for (int k = 0; k < 3; k++) ok &= same(&g.ch[k], &one);
    CHECK(ok && b.tokens_prefilled - a.tokens_prefilled == 90,
          "n=3 greedy%s: the prompt prefilled once (%lld tokens), three choices equal to the single request, one last DONE",
          prefix ? " (prefix cache)" : "", (long long)(b.tokens_prefilled - a.tokens_prefilled));
    /* seeded sampling: reproducible, choice 0 = the n=1 request with the seed */
    multi_out x, y, single;
    submit_n(s, p, 90, 20, 3, 1.0f, 1, &x);
    run_all(s);
    submit_n(s, p, 90, 20, 3, 1.0f, 1, &y);
    run_all(s);
    submit_n(s, p, 90, 20, 1, 1.0f, 1, &single);
    run_all(s);
    ok = 1;
    for (int k = 0; k < 3; k++) ok &= same(&x.ch[k], &y.ch[k]);
    int differ = memcmp(x.ch[1].ids, x.ch[2].ids, sizeof x.ch[1].ids) != 0 || memcmp(x.ch[0].ids, x.ch[1].ids, sizeof x.ch[0].ids) != 0;
    CHECK(ok && differ && same(&x.ch[0], &single.ch[0]),
          "n=3 sampled with a seed: the same choices on a second run, choices that differ, choice 0 = the n=1 request");
    const st_cache *c = st_sched_cache(s);
    CHECK(st_cache_available_blocks(c) == c->p.n_blocks && c->n_free_slots == 4, "every block and slot back after the forks");
    multi_out big;
    memset(&big, 0, sizeof big);
    st_req_params rp = st_req_default_params();
    rp.n = 5;
    st_error err = {0};
    CHECK(st_sched_submit(s, p, 90, &rp, on_multi, &big, NULL, &err) == ST_ERR_ARG && strstr(err.msg, "n (5)"),
          "n=5 on 4 sequences is refused: %s", err.msg);
    /* choices that could never fit the pool together are refused at submission */
    st_req_params rq = st_req_default_params();
    rq.n = 4; /* up to the context each: 4 contexts of blocks, more than the pool */
    st_sched *tight = sched(m, prefix, 4, 80, 64, 0);
    CHECK(tight && st_sched_submit(tight, p, 90, &rq, on_multi, &big, NULL, &err) == ST_ERR_LIMIT &&
              strstr(err.msg, "lower max_tokens or n"),
          "n=4 unbounded choices on a 80-block pool are refused at once: %s", err.msg);
    st_sched_destroy(tight);
    /* cancelled before the fork: the reserved records return */
    uint64_t id = 0;
    rp.n = 4;
    rp.max_tokens = 5;
    st_sched_submit(s, p, 90, &rp, on_multi, &big, &id, &err);
    st_sched_cancel(s, id);
    run_all(s);
    submit_n(s, p, 90, 3, 4, 0, 0, &g);
    run_all(s);
    CHECK(big.dones == 1 && big.lasts == 1 && g.dones == 4 && g.ch[3].n == 3,
          "a request cancelled before its fork ends once; the next takes all 4 records");
    st_sched_destroy(s);
}

/* One pass of the soak: 240 requests of 4 prompt families (shared system parts, varying
 * questions, replies that the next request continues); the heap allocations of its steps. */
enum { SOAK_N = 240 };
static char soak_where[160]; /* the first steps that allocated: "step:count" */
static void soak_note(long step, long n) {
    const size_t at = strlen(soak_where);
    if (n && at + 24 < sizeof soak_where) snprintf(soak_where + at, sizeof soak_where - at, " %ld:%ld", step, n);
}
static int32_t soak_prompts[SOAK_N][200];
static long soak_pass(st_sched *s, const st_model *m, rec_out *o, long *steps) {
    const int V = (int)m->cfg.vocab_size;
    int32_t(*prompts)[200] = soak_prompts;
    long steps_allocs = 0;
    memset(o, 0, sizeof(rec_out) * SOAK_N);
    for (int r = 0; r < SOAK_N; r++) {
        const int fam = r % 4, len = 100 + (r * 37) % 90;
        for (int i = 0; i < len; i++) prompts[r][i] = (int32_t)((fam * 211 + i * 13 + (i >= 64 + fam * 8 ? r * 5 : 0)) % V);
        if (r >= 4 && o[r - 4].done) /* continue the family's previous conversation */
            for (int i = 0; i < 8 && 120 + i < len; i++) prompts[r][120 + i] = o[r - 4].ids[i];
        submit(s, prompts[r], len, 8 + r % 5, &o[r]);
        for (int k = 0; k < 3; k++) { /* a few steps per submission: requests overlap */
            alloc_count = 0;
            alloc_counting = 1;
            st_sched_step(s);
            alloc_counting = 0;
            steps_allocs += alloc_count;
            soak_note(*steps, alloc_count);
            (*steps)++;
        }
    }
    for (;;) {
        alloc_count = 0;
        alloc_counting = 1;
        int left = st_sched_step(s);
        alloc_counting = 0;
        steps_allocs += alloc_count;
        soak_note(*steps, alloc_count);
        (*steps)++;
        if (!left) break;
    }
    return steps_allocs;
}

/* A soak that reuses prefixes through 3 sequences; the steps allocate nothing, and every
 * block and snapshot is accounted for at the end. On CUDA a first pass lets the driver load
 * the kernels and capture each batch size's graph (its own one-time host allocations); the
 * second is counted, and device allocations over both. */
static void test_soak(const st_model *m) {
    st_sched *s = sched(m, 1, 3, 96, 64, 0);
    if (!CHECK(s != NULL, "a scheduler for the soak (the default snapshot pool)")) return;
    enum { N = SOAK_N };
    static rec_out o[N];
    long steps = 0, warm_steps = 0;
    const int64_t dev0 = g_cuda ? st_backend_cuda_device_allocs(g_cuda) : 0;
    if (g_cuda) { /* the backend runs on this thread; the driver's threads are its own */
        alloc_count_one_thread();
        soak_pass(s, m, o, &warm_steps);
    }
    alloc_count_others = 0;
    soak_where[0] = 0;
    /* the test's own arrays resident first: the growth measured is the scheduler's */
    memset(o, 0, sizeof(rec_out) * N);
    memset(soak_prompts, 0, sizeof soak_prompts);
    const size_t rss0 = st_rss_bytes(), planned = st_sched_get_plan(s)->total_bytes;
    const long steps_allocs = soak_pass(s, m, o, &steps);
    if (g_cuda)
        CHECK(st_backend_cuda_device_allocs(g_cuda) == dev0, "the soak on CUDA (%ld + %ld steps): %lld device allocations",
              warm_steps, steps, (long long)(st_backend_cuda_device_allocs(g_cuda) - dev0));
    int done = 0;
    for (int r = 0; r < N; r++) done += o[r].done && o[r].finish == ST_FINISH_LENGTH;
    st_sched_stats st;
    st_sched_get_stats(s, &st);
    const st_cache *c = st_sched_cache(s);
    const size_t rss1 = st_rss_bytes();
    char others[96] = "";
    if (g_cuda)
        snprintf(others, sizeof others, "; the CUDA driver's own threads made %ld meanwhile", alloc_count_others);
    CHECK(done == N && steps_allocs == 0,
          "%d prefix-sharing requests in %ld steps: every one finished, %ld heap allocations (step:count%s)%s", N, steps,
          steps_allocs, soak_where, others);
    CHECK(rss1 <= rss0 + planned, "resident memory grew %.2f MiB over the soak, within the %.2f MiB plan",
          ((double)rss1 - (double)rss0) / 1048576.0, (double)planned / 1048576.0);
    CHECK(st.prefix.hits > N / 2 && st.prefix.blocks_evicted > 0 && st_cache_available_blocks(c) == c->p.n_blocks &&
              c->n_free_slots == 3 && st.prefix.snapshots_public <= c->p.n_snapshots,
          "%lld hits, %lld blocks evicted; at the end every block is free or cached and %lld of %d snapshots are public",
          (long long)st.prefix.hits, (long long)st.prefix.blocks_evicted, (long long)st.prefix.snapshots_public,
          c->p.n_snapshots);
    st_sched_destroy(s);
}

/* The 27B shape at a 262,144-token context (only the shapes are needed): the plan says what
 * one context costs (bf16 KV: 64 KiB a position, 16 GiB) and the snapshot pool; a budget too
 * small is refused, naming what fits. */
static void test_plan_27b(void) {
    st_config cfg;
    st_model *m = NULL;
    st_error err = {0};
    if (!CHECK(st_synth_preset_config("27b", &cfg, &err) == ST_OK && st_model_synthetic(&cfg, 0, 64, 1, &m, &err) == ST_OK,
               "the 27B shape (%s)", err.msg))
        return;
    const size_t G = (size_t)1 << 30;
    st_sched_params p = st_sched_default_params();
    p.max_seqs = 4;
    p.ctx = 262144;
    p.kv_dtype = ST_KV_BF16;
    p.kv_blocks = 262144 / 16;
    p.prefix_cache = 1;
    st_sched_plan pl;
    char text[600];
    int ok = st_sched_plan_for(m, &p, &pl, &err) == ST_OK;
    st_sched_plan_text(&pl, text, sizeof text);
    const size_t kv_per_pos = (size_t)m->n_full * 2 * (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim * 2;
    CHECK(ok && kv_per_pos == 65536 && pl.ctx == 262144 && pl.kv_bytes >= 16 * G && pl.kv_bytes < 16 * G + G / 64 &&
              pl.snapshots == 20 && pl.snapshot_bytes * 4 >= pl.state_bytes * 20 - G / 64 && strstr(text, "snapshots"),
          "27B, --ctx 262144, bf16 KV: %zu bytes a position; the plan: %s", kv_per_pos, text);
    p.mem_budget = 16 * G;
    CHECK(st_sched_plan_for(m, &p, &pl, &err) == ST_ERR_LIMIT && strstr(err.msg, "these would fit"),
          "with 16 GiB it is refused, naming what fits: %.300s", err.msg);
    st_model_free(m);
    st_config_free(&cfg);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/tiny-a", tap_data_dir());
    st_model *m = NULL;
    st_error err = {0};
    if (CHECK(st_model_load(path, &m, &err) == ST_OK, "tiny-a loads")) {
        if (kit_on_cuda() && !CHECK((g_cuda = kit_backend(m, NULL, &err)) != NULL, "the CUDA backend (%s)", err.msg)) {
            st_model_free(m);
            return tap_done();
        }
        test_books(m);
        test_books_random(m);
        test_sched(m);
        test_soak(m);
        test_fork(m, 0);
        test_fork(m, 1);
        st_backend_destroy(g_cuda);
        st_model_free(m);
    }
    test_plan_27b();
    return tap_done();
}
