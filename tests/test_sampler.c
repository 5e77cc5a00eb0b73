/* ==== Sampling: greedy, temperature, top-k/p, min-p, penalties, bias, seeds, logprobs ==== */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler/sampler.h"
#include "tap.h"

#define V 50

static st_sampler *S;

static int32_t sample(const st_sampling *p, st_sampler_state *st, const float *logits,
                      const int32_t *hist, int n_prompt, int n_hist, int nlp, st_logprobs *lp) {
    float l[V];
    memcpy(l, logits, sizeof l);
    return st_sampler_sample(S, p, st, l, hist, n_prompt, n_hist, nlp, lp);
}


/* Compact rows (st_logit_top): sampling from a row's top ST_TOP_MAX and its log-sum-exp gives
 * the full row's token, draw and log-probabilities, for every setting st_sampler_top_ok takes */
static void test_compact_rows(void) {
    enum { VB = 5000 };
    st_error err = {0};
    st_sampler *SB = NULL;
    if (!CHECK(st_sampler_create(VB, &SB, &err) == ST_OK, "sampler for %d tokens", VB)) return;
    static float row[VB], work[VB];
    static st_logit_top top;
    const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 2.0f};
    const int ks[] = {1, 5, 20, 64};
    const float ps[] = {1.0f, 0.8f, 0.95f}, mins[] = {0.0f, 0.05f};
    int cases = 0, same = 0, taken = 0, lp_same = 0;
    uint64_t seed = 42;
    for (int r = 0; r < 24; r++) {
        /* rows of different spreads (a peaked one, a flat one, ties) */
        const float spread = r % 3 == 0 ? 1.0f : r % 3 == 1 ? 4.0f : 12.0f;
        for (int i = 0; i < VB; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            row[i] = spread * ((float)(seed >> 40) / 16777216.0f - 0.5f);
            if (r % 4 == 3 && i % 97 == 0) row[i] = row[0]; /* exact ties */
        }
        st_logit_top_make(row, VB, &top);
        for (size_t a = 0; a < sizeof temps / sizeof temps[0]; a++)
            for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++)
                for (size_t c = 0; c < sizeof ps / sizeof ps[0]; c++)
                    for (size_t d = 0; d < sizeof mins / sizeof mins[0]; d++) {
                        st_sampling p = st_sampling_default();
                        p.temperature = temps[a];
                        p.top_k = ks[b];
                        p.top_p = ps[c];
                        p.min_p = mins[d];
                        p.seed = (uint64_t)(r * 1000 + cases);
                        p.has_seed = 1;
                        taken += st_sampler_top_ok(&p);
                        st_sampler_state s1, s2;
                        st_sampler_state_init(&s1, &p);
                        s2 = s1;
                        st_logprobs l1, l2;
                        memcpy(work, row, sizeof row);
                        const int32_t t1 = st_sampler_sample(SB, &p, &s1, work, NULL, 0, 0, 20, &l1);
                        const int32_t t2 = st_sampler_sample_top(SB, &p, &s2, &top, 20, &l2);
                        cases++;
                        same += t1 == t2 && !memcmp(&s1, &s2, sizeof s1);
                        lp_same += l1.logprob == l2.logprob && l1.n_top == l2.n_top &&
                                   !memcmp(l1.top_tokens, l2.top_tokens, sizeof l1.top_tokens[0] * (size_t)l1.n_top) &&
                                   !memcmp(l1.top_logprobs, l2.top_logprobs, sizeof l1.top_logprobs[0] * (size_t)l1.n_top);
                    }
    }
    CHECK(taken == cases, "st_sampler_top_ok takes greedy and top_k <= %d without bias or penalties (%d of %d)",
          ST_TOP_SAMPLE_MAX, taken, cases);
    CHECK(same == cases && lp_same == cases,
          "a compact row samples as its full row: %d of %d draws and %d log-probability sets equal", same, cases, lp_same);
    st_sampling p = st_sampling_default();
    p.temperature = 1.0f;
    CHECK(!st_sampler_top_ok(&p), "top_k 0 at temperature 1 needs the full row");
    p.top_k = 20;
    p.presence_penalty = 0.5f;
    CHECK(!st_sampler_top_ok(&p), "penalties need the full row");
    for (int i = 0; i < VB; i++) row[i] = (float)i;
    row[7] = NAN;
    st_logit_top_make(row, VB, &top);
    CHECK(!top.finite && top.n == ST_TOP_MAX, "a row with a NaN is marked not finite");
    st_sampler_destroy(SB);
}

int main(void) {
    st_error err = {0};
    if (!CHECK(st_sampler_create(V, &S, &err) == ST_OK, "sampler created")) return tap_done();
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = sinf((float)i * 1.7f) * 3.0f;
    int32_t argmax = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[argmax]) argmax = i;
    st_sampling p = st_sampling_default();
    st_sampler_state st;
    st_sampler_state_init(&st, &p);
    CHECK(sample(&p, &st, logits, NULL, 0, 0, 0, NULL) == argmax, "temperature 0 is argmax (%d)", argmax);

    /* temperature 1: frequencies follow softmax */
    p.temperature = 1.0f;
    p.seed = 42;
    p.has_seed = 1;
    st_sampler_state_init(&st, &p);
    enum { N = 200000 };
    static int hits[V];
    for (int i = 0; i < N; i++) hits[sample(&p, &st, logits, NULL, 0, 0, 0, NULL)]++;
    double mx = logits[argmax], z = 0, worst = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i] - mx);
    for (int i = 0; i < V; i++) {
        double pr = exp(logits[i] - mx) / z, sd = sqrt(pr * (1 - pr) / N);
        double dev = fabs((double)hits[i] / N - pr) / (sd + 1e-12);
        if (pr > 1e-4 && dev > worst) worst = dev;
    }
    CHECK(worst < 5.0, "temperature 1: frequencies match softmax (worst %.2f sigma)", worst);
    /* temperature 0.5 sharpens */
    memset(hits, 0, sizeof hits);
    p.temperature = 0.5f;
    for (int i = 0; i < N / 4; i++) hits[sample(&p, &st, logits, NULL, 0, 0, 0, NULL)]++;
    double z2 = 0;
    for (int i = 0; i < V; i++) z2 += exp(2 * (logits[i] - mx));
    double want = 1.0 / z2, got = (double)hits[argmax] / (N / 4);
    CHECK(fabs(got - want) < 0.01, "temperature 0.5: top token frequency %.4f vs %.4f", got, want);

    /* seeds */
    p.temperature = 1.0f;
    int32_t a[64], b[64], c[64];
    st_sampler_state_init(&st, &p);
    for (int i = 0; i < 64; i++) a[i] = sample(&p, &st, logits, NULL, 0, 0, 0, NULL);
    st_sampler_state_init(&st, &p);
    for (int i = 0; i < 64; i++) b[i] = sample(&p, &st, logits, NULL, 0, 0, 0, NULL);
    p.seed = 43;
    st_sampler_state_init(&st, &p);
    for (int i = 0; i < 64; i++) c[i] = sample(&p, &st, logits, NULL, 0, 0, 0, NULL);
    CHECK(!memcmp(a, b, sizeof a) && memcmp(a, c, sizeof a), "same seed, same draws; another seed differs");

    /* top-k */
    int32_t order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (logits[order[j]] > logits[order[i]]) {
                int32_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    p = st_sampling_default();
    p.temperature = 2.0f;
    p.top_k = 3;
    p.has_seed = 1;
    st_sampler_state_init(&st, &p);
    int bad = 0;
    memset(hits, 0, sizeof hits);
    for (int i = 0; i < 20000; i++) {
        int32_t t = sample(&p, &st, logits, NULL, 0, 0, 0, NULL);
        hits[t]++;
        bad += t != order[0] && t != order[1] && t != order[2];
    }
    CHECK(!bad && hits[order[0]] && hits[order[1]] && hits[order[2]], "top-k 3: only (and all of) the 3 best tokens");
    /* top-p: a distribution 0.5, 0.3, 0.2 with top_p 0.7 keeps two */
    float l3[V];
    for (int i = 0; i < V; i++) l3[i] = -1000;
    l3[7] = logf(0.5f);
    l3[3] = logf(0.3f);
    l3[9] = logf(0.2f);
    p = st_sampling_default();
    p.temperature = 1.0f;
    p.top_p = 0.7f;
    p.has_seed = 1;
    st_sampler_state_init(&st, &p);
    memset(hits, 0, sizeof hits);
    for (int i = 0; i < 20000; i++) hits[sample(&p, &st, l3, NULL, 0, 0, 0, NULL)]++;
    CHECK(hits[9] == 0 && hits[7] > 0 && hits[3] > 0 && fabs(hits[7] / 20000.0 - 0.625) < 0.02,
          "top-p 0.7 over (0.5, 0.3, 0.2): keeps the first two, renormalised (%.3f)", hits[7] / 20000.0);
    /* min-p 0.5: drops 0.2 (< 0.25) keeps 0.3 */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    memset(hits, 0, sizeof hits);
    for (int i = 0; i < 20000; i++) hits[sample(&p, &st, l3, NULL, 0, 0, 0, NULL)]++;
    CHECK(hits[9] == 0 && hits[3] > 0, "min-p 0.5 drops tokens under half the top probability");

    /* logit bias forces or bans */
    p = st_sampling_default();
    p.n_bias = 1;
    p.bias[0] = (st_logit_bias){11, 100.0f};
    CHECK(sample(&p, &st, logits, NULL, 0, 0, 0, NULL) == 11, "logit_bias +100 forces a token");
    p.bias[0] = (st_logit_bias){argmax, -100.0f};
    CHECK(sample(&p, &st, logits, NULL, 0, 0, 0, NULL) == order[1], "logit_bias -100 bans the top token");

    /* penalties */
    float lp2[V];
    for (int i = 0; i < V; i++) lp2[i] = 0;
    lp2[1] = 2.0f;  /* in the prompt */
    lp2[2] = 1.9f;  /* generated twice */
    lp2[3] = 1.0f;
    lp2[4] = -1.0f; /* generated once, negative */
    int32_t hist[5] = {1, 8, 2, 2, 4};
    p = st_sampling_default();
    p.repetition_penalty = 2.0f;
    float w[V];
    memcpy(w, lp2, sizeof w);
    st_sampler_sample(S, &p, &st, w, hist, 2, 5, 0, NULL);
    CHECK(w[1] == 1.0f && w[2] == 0.95f && w[4] == -2.0f && w[3] == 1.0f,
          "repetition penalty: positive logits divided, negative multiplied, prompt included");
    p = st_sampling_default();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    memcpy(w, lp2, sizeof w);
    st_sampler_sample(S, &p, &st, w, hist, 2, 5, 0, NULL);
    CHECK(w[1] == 2.0f && fabsf(w[2] - (1.9f - 0.5f - 0.5f)) < 1e-6f && w[4] == -1.75f && w[8] == 0.0f,
          "presence/frequency penalties on generated tokens only");
    memcpy(w, lp2, sizeof w);
    st_sampler_sample(S, &p, &st, w, hist, 2, 5, 0, NULL);
    CHECK(fabsf(w[2] - 0.9f) < 1e-6f, "penalty scratch is cleared between calls");

    /* logprobs from the raw distribution, whatever the sampling settings */
    st_logprobs lps;
    p = st_sampling_default();
    p.temperature = 0.7f;
    p.has_seed = 1;
    p.n_bias = 1;
    p.bias[0] = (st_logit_bias){5, 50.0f};
    int32_t t = sample(&p, &st, logits, NULL, 0, 0, 5, &lps);
    double lse = mx + log(z);
    CHECK(t == 5 && fabs(lps.logprob - (logits[5] - lse)) < 1e-5, "chosen logprob is the raw log-softmax (%g)", lps.logprob);
    int sorted = lps.n_top == 5 && lps.top_tokens[0] == argmax;
    for (int i = 1; i < lps.n_top; i++) sorted &= lps.top_logprobs[i] <= lps.top_logprobs[i - 1];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp(logits[i] - lse);
    CHECK(sorted && fabs(lps.top_logprobs[0] - (mx - lse)) < 1e-5 && fabs(s - 1) < 1e-9,
          "top-5 alternatives sorted, best first, normalised");
    /* validation */
    p = st_sampling_default();
    p.top_p = 0;
    CHECK(st_sampling_validate(&p, V, &err) == ST_ERR_ARG, "top_p 0 rejected (%s)", err.msg);
    p = st_sampling_default();
    p.temperature = -1;
    CHECK(st_sampling_validate(&p, V, &err) == ST_ERR_ARG, "negative temperature rejected");
    p = st_sampling_default();
    p.n_bias = 1;
    p.bias[0] = (st_logit_bias){V, 1};
    CHECK(st_sampling_validate(&p, V, &err) == ST_ERR_ARG, "bias on a token outside the vocabulary rejected (%s)", err.msg);
    st_sampler_destroy(S);
    test_compact_rows();
    return tap_done();
}
