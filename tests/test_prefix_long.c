/* ==== The prefix cache at long contexts: 210,668 tokens, then 243,192 ====
 * The workload this engine answers: a 210,668-token cold prompt, then a 243,192-token
 * extension of it served from the cache. On a small model (2 layers, one of each kind) with a
 * 262,144-token context: the extension prefills only what follows the first prompt's last
 * snapshot, and its tokens and logprob bits equal a cold run of the whole 243,192 tokens.
 * STRAND_TEST_SCALE=N divides the lengths by N (the sanitizer build runs it at 1/10). */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "engine/scheduler.h"
#include "model/synth.h"
#include "tap.h"

#define GEN 4
typedef struct run_out {
    int32_t ids[GEN];
    float lp[GEN][1 + ST_MAX_LOGPROBS];
    int n, done;
    st_usage usage;
    char err[256];
} run_out;

static int on_event(void *user, const st_event *ev) {
    run_out *o = user;
    if (ev->kind == ST_EV_TOKEN) {
        if (o->n < GEN) {
            o->ids[o->n] = ev->token;
            o->lp[o->n][0] = ev->logprobs->logprob;
            for (int i = 0; i < ev->logprobs->n_top; i++) o->lp[o->n][1 + i] = ev->logprobs->top_logprobs[i];
        }
        o->n++;
    } else {
        o->done = 1;
        o->usage = ev->usage;
        if (ev->error) snprintf(o->err, sizeof o->err, "%.200s", ev->error);
    }
    return ST_EV_CONTINUE;
}

static st_sched *make(const st_model *m, int64_t ctx) {
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = 1;
    sp.ctx = ctx;
    sp.block_size = 512;
    sp.step_tokens = 8192;
    sp.prefix_cache = 1;
    st_sched *s = NULL;
    st_error err = {0};
    if (st_sched_create(m, NULL, &sp, &s, &err) != ST_OK) printf("# sched: %s\n", err.msg);
    return s;
}

static void run(st_sched *s, const int32_t *p, int64_t n, run_out *o) {
    memset(o, 0, sizeof *o);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = GEN;
    rp.sampling.temperature = 0;
    rp.logprobs = 20;
    rp.ignore_eos = 1;
    st_error err = {0};
    if (st_sched_submit(s, p, n, &rp, on_event, o, NULL, &err) != ST_OK) {
        snprintf(o->err, sizeof o->err, "%.200s", err.msg);
        return;
    }
    while (st_sched_step(s) > 0) {
    }
}

int main(void) {
    const char *sc = getenv("STRAND_TEST_SCALE");
    const int64_t scale = sc && atoi(sc) > 0 ? atoi(sc) : 1;
    const int64_t n1 = 210668 / scale, n2 = 243192 / scale, ctx = 262144 / scale;
    char dir[] = "/tmp/strand-long-prefix-XXXXXX", cfg[600];
    st_model *m = NULL;
    st_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL, "a temporary directory")) return tap_done();
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    if (f) {
        fprintf(f, "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 512, \"hidden_size\": 16,"
                   "\"intermediate_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 1,"
                   "\"num_key_value_heads\": 1, \"head_dim\": 16, \"linear_key_head_dim\": 8,"
                   "\"linear_value_head_dim\": 8, \"linear_num_key_heads\": 1, \"linear_num_value_heads\": 1,"
                   "\"full_attention_interval\": 2, \"max_position_embeddings\": %lld}",
                (long long)ctx);
        fclose(f);
    }
    st_synth_params sp = st_synth_default_params();
    sp.config_path = cfg;
    if (!CHECK(st_synth_write(&sp, dir, &err) == ST_OK && st_model_load(dir, &m, &err) == ST_OK,
               "a 2-layer model with a %lld-token context: %s", (long long)ctx, err.msg))
        return tap_done();
    int32_t *p = malloc((size_t)n2 * sizeof *p);
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (int32_t)(x % 512);
    }
    run_out first, ext, cold;
    st_sched *s = make(m, ctx);
    double t0 = st_now_s();
    run(s, p, n1, &first);
    double t1 = st_now_s();
    CHECK(first.done && first.n == GEN && first.usage.cached_tokens == 0, "the %lld-token prompt runs cold (%.1f s) %s",
          (long long)n1, t1 - t0, first.err);
    st_sched_stats st0, st1;
    st_sched_get_stats(s, &st0);
    run(s, p, n2, &ext);
    double t2 = st_now_s();
    st_sched_get_stats(s, &st1);
    const int64_t resumed = (n1 - 1) / 512 * 512, prefilled = st1.tokens_prefilled - st0.tokens_prefilled;
    CHECK(ext.done && ext.usage.cached_tokens == resumed && prefilled == n2 - resumed,
          "its %lld-token extension resumes at %lld (cached %lld) and prefills only %lld tokens (%.1f s)",
          (long long)n2, (long long)resumed, (long long)ext.usage.cached_tokens, (long long)prefilled, t2 - t1);
    st_sched_destroy(s);
    s = make(m, ctx);
    double t3 = st_now_s();
    run(s, p, n2, &cold);
    double t4 = st_now_s();
    st_sched_destroy(s);
    CHECK(cold.done && cold.n == GEN && cold.usage.cached_tokens == 0, "a cold run of the %lld tokens (%.1f s)",
          (long long)n2, t4 - t3);
    CHECK(memcmp(ext.ids, cold.ids, sizeof ext.ids) == 0 && memcmp(ext.lp, cold.lp, sizeof ext.lp) == 0,
          "the extension's %d tokens and their logprob bits (chosen and top 20) equal the cold run's", GEN);
    printf("# time to first token: cold %.2f s, from the cache %.2f s (%.1fx)\n", t4 - t3, t2 - t1,
           (t4 - t3) / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    free(p);
    st_model_free(m);
    snprintf(cfg, sizeof cfg, "rm -rf %s", dir);
    if (system(cfg) != 0) printf("# cleanup failed\n");
    return tap_done();
}
