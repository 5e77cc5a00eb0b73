/* ==== strand bench --grammar: the cost of JSON output (see bench_grammar.h) ==== */
#include "apps/bench_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/clock.h"
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "model/model.h"

/* a nested schema: objects in an array in an object, enums, bounded integers, optional fields */
static const char *const nested_schema =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"year\":{\"type\":\"integer\",\"minimum\":1900,"
    "\"maximum\":2100},\"genre\":{\"enum\":[\"drama\",\"comedy\",\"thriller\",\"documentary\"]},\"cast\":{\"type\":\"array\","
    "\"maxItems\":4,\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"role\":{\"type\":"
    "[\"string\",\"null\"]},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"role\"],"
    "\"additionalProperties\":false}},\"rating\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\"},\"maxItems\":5}},\"required\":[\"title\",\"year\",\"genre\",\"cast\"],\"additionalProperties\":false}";

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t next(rng *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* random replies from the masks: every step's mask and apply times into mask_s / apply_s */
static int64_t run_replies(st_gram_vocab *v, const st_tokenizer *tok, const st_gram_schema *sc, st_gram_mode mode, int64_t V,
                           int replies, double *mask_s, double *apply_s, int64_t cap, int *complete) {
    const size_t W = st_gram_mask_words(v);
    uint32_t *mask = malloc(W * sizeof *mask);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    float *logits = calloc((size_t)V, sizeof *logits);
    int64_t n = 0;
    rng r = {0x2545f4914f6cdd1dull};
    *complete = 0;
    for (int rep = 0; mask && allowed && logits && rep < replies; rep++) {
        st_gram_state g;
        st_gram_init(&g, mode);
        for (int step = 0; step < 300 && !st_gram_done(&g) && n < cap; step++) {
            const double t0 = st_now_s();
            st_gram_mask(v, sc, &g, mask);
            const double t1 = st_now_s();
            st_gram_apply(mask, logits, V);
            mask_s[n] = t1 - t0;
            apply_s[n++] = st_now_s() - t1;
            memset(logits, 0, (size_t)V * sizeof *logits);
            int64_t na = 0, ns = 0;
            for (int64_t t = 0; t < V; t++)
                if (mask[t / 32] >> (t % 32) & 1u) allowed[na++] = (int32_t)t;
            if (!na) break;
            for (int64_t i = 0; i < na; i++) { /* short tokens half the time, so that values close */
                size_t len = 0;
                st_tok_token_bytes(tok, allowed[i], &len);
                if (len <= 2) allowed[ns++] = allowed[i];
            }
            const int32_t t = next(&r) % 2 && ns ? allowed[next(&r) % (uint64_t)ns] : allowed[next(&r) % (uint64_t)na];
            if (!st_gram_advance(v, sc, &g, t)) break;
        }
        *complete += st_gram_done(&g);
    }
    free(mask);
    free(allowed);
    free(logits);
    return n;
}

static void report(const char *what, double *x, int64_t n, int json, int last) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    const double p50 = n ? x[n / 2] : 0, p99 = n ? x[n * 99 / 100] : 0, mx = n ? x[n - 1] : 0;
    if (json)
        printf("\"%s\": {\"p50_us\": %.2f, \"p99_us\": %.2f, \"max_us\": %.2f, \"mean_us\": %.2f}%s", what, p50 * 1e6,
               p99 * 1e6, mx * 1e6, n ? sum / (double)n * 1e6 : 0, last ? "" : ", ");
    else
        printf("  %-8s p50 %8.1f us   p99 %8.1f us   max %8.1f us   mean %8.1f us\n", what, p50 * 1e6, p99 * 1e6, mx * 1e6,
               n ? sum / (double)n * 1e6 : 0);
}

typedef struct count_out {
    int64_t n;
    int done;
    char err[200];
} count_out;

static int count_event(void *user, const st_event *ev) {
    count_out *o = user;
    if (ev->kind == ST_EV_TOKEN) o->n++;
    else {
        o->done = 1;
        if (ev->error) snprintf(o->err, sizeof o->err, "%s", ev->error);
    }
    return ST_EV_CONTINUE;
}

/* decode tok/s at batch 1 of the model in dir, free and as a JSON object; -1 on an error */
static int decode_compare(const char *dir, int json, st_error *err) {
    st_model *m = NULL;
    st_tokenizer *tok = NULL;
    st_backend *be = NULL;
    st_sched *s = NULL;
    int rc = -1;
    if (st_model_load(dir, &m, err) != ST_OK || st_tok_load_dir(dir, &tok, err) != ST_OK || cli_backend(m, &be, err) != ST_OK)
        goto done;
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = 1;
    sp.ctx = 1024;
    sp.backend = be;
    if (st_sched_create(m, tok, &sp, &s, err) != ST_OK) goto done;
    const int32_t prompt[8] = {9707, 11, 1879, 13, 358, 1079, 264, 1273};
    enum { ROUNDS = 7 };
    double rounds[2][ROUNDS];
    int64_t made[2] = {0, 0};
    /* free and JSON in turns (this machine's neighbours move the speed), the median of each */
    for (int round = -1; round < ROUNDS; round++) { /* round -1 warms up (and makes the grammar's tables) */
        for (int mode = 0; mode < 2; mode++) {
            st_req_params rp = st_req_default_params();
            rp.max_tokens = 64;
            rp.ignore_eos = 1;
            rp.sampling.temperature = 0;
            rp.json_mode = mode ? ST_GRAM_JSON_OBJECT : 0;
            count_out o = {0};
            if (st_sched_submit(s, prompt, 8, &rp, count_event, &o, NULL, err) != ST_OK) goto done;
            st_sched_step(s); /* the prompt and the first token */
            const double t0 = st_now_s();
            const int64_t n0 = o.n;
            while (st_sched_step(s) > 0) {
            }
            if (o.err[0]) {
                st_error_set(err, ST_ERR_INTERNAL, "%s", o.err);
                goto done;
            }
            if (round >= 0) rounds[mode][round] = (double)(o.n - n0) / (st_now_s() - t0);
            made[mode] = o.n;
        }
    }
    double tok_s[2];
    for (int mode = 0; mode < 2; mode++) {
        qsort(rounds[mode], ROUNDS, sizeof rounds[mode][0], cmp_double);
        tok_s[mode] = rounds[mode][ROUNDS / 2];
    }
    if (json)
        printf("\"decode_b1_tok_s\": {\"free\": %.2f, \"json_object\": %.2f, \"tokens\": [%lld, %lld]}", tok_s[0], tok_s[1],
               (long long)made[0], (long long)made[1]);
    else
        printf("\ndecode, batch 1 (%s, greedy, the median of 7 rounds each, in turns): free %.2f tok/s, json_object "
               "%.2f tok/s (%.1f%% slower; %lld and %lld tokens a round)\n",
               dir, tok_s[0], tok_s[1], tok_s[0] > 0 ? 100 * (1 - tok_s[1] / tok_s[0]) : 0, (long long)made[0],
               (long long)made[1]);
    rc = 0;
done:
    st_sched_destroy(s);
    st_backend_destroy(be);
    st_tok_free(tok);
    st_model_free(m);
    return rc;
}

int bench_grammar(const char *dir, const char *tokenizer, int64_t vocab, int json, st_error *err) {
    char path[4096];
    if (!tokenizer && !dir) {
        st_error_set(err, ST_ERR_ARG, "bench --grammar: give -m DIR or --tokenizer FILE");
        return -1;
    }
    if (!tokenizer) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        tokenizer = path;
    }
    st_tokenizer *tok = NULL;
    if (st_tok_load(tokenizer, &tok, err) != ST_OK) return -1;
    if (vocab <= 0) vocab = 248320;
    if (vocab < st_tok_vocab_size(tok)) vocab = st_tok_vocab_size(tok);
    st_gram_vocab *v = NULL;
    st_gram_schema *sc = NULL;
    const double t0 = st_now_s();
    if (st_gram_vocab_create(tok, vocab, &v, err) != ST_OK) {
        st_tok_free(tok);
        return -1;
    }
    const double build_s = st_now_s() - t0;
    if (st_gram_schema_compile(nested_schema, strlen(nested_schema), 1, &sc, err) != ST_OK) {
        st_gram_vocab_free(v);
        st_tok_free(tok);
        return -1;
    }
    const int64_t cap = 40 * 300;
    double *mask_s = malloc((size_t)cap * sizeof *mask_s), *apply_s = malloc((size_t)cap * sizeof *apply_s);
    int rc = mask_s && apply_s ? 0 : -1;
    if (json) printf("{\"tokenizer\": \"%s\", \"vocab\": %lld, \"build_ms\": %.1f", tokenizer, (long long)vocab, build_s * 1e3);
    else
        printf("tokenizer  %s (%lld tokens), masks over a vocabulary of %lld; tables built in %.0f ms\n", tokenizer,
               (long long)st_tok_vocab_size(tok), (long long)vocab, build_s * 1e3);
    for (int k = 0; rc == 0 && k < 2; k++) {
        int complete = 0;
        const int64_t n = run_replies(v, tok, k ? sc : NULL, k ? ST_GRAM_JSON_SCHEMA : ST_GRAM_JSON_OBJECT, vocab, 40, mask_s,
                                      apply_s, cap, &complete);
        const char *what = k ? "nested_schema" : "json_object";
        if (json) printf(", \"%s\": {\"steps\": %lld, \"complete\": %d, ", what, (long long)n, complete);
        else printf("\n%s: %lld steps of 40 random replies (%d complete)\n", what, (long long)n, complete);
        report("mask", mask_s, n, json, 0);
        report("apply", apply_s, n, json, 1);
        if (json) printf("}");
    }
    if (rc == 0 && dir) {
        if (json) printf(", ");
        rc = decode_compare(dir, json, err);
    }
    if (json) printf("}\n");
    free(mask_s);
    free(apply_s);
    st_gram_schema_free(sc);
    st_gram_vocab_free(v);
    st_tok_free(tok);
    if (rc && !err->msg[0]) st_error_set(err, ST_ERR_NOMEM, "out of memory");
    return rc;
}
