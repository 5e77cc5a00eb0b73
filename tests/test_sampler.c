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
    return tap_done();
}
