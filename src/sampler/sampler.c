/* ==== Sampling and log-probabilities (see sampler.h) ==== */
#include "sampler/sampler.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct cand {
    float p;   /* probability (unnormalised until the end) */
    int32_t t; /* token id */
} cand;

struct st_sampler {
    int64_t vocab;
    int32_t *count;    /* [vocab] occurrences in the generated part; zero between calls */
    uint8_t *in_prompt;/* [vocab] token occurs in the prompt; zero between calls */
    cand *cands;       /* [vocab] candidates of one draw */
    float *raw;        /* [vocab] copy of the raw logits when log-probabilities are asked */
};

st_sampling st_sampling_default(void) {
    st_sampling s;
    memset(&s, 0, sizeof s);
    s.temperature = 0.0f;
    s.top_p = 1.0f;
    s.repetition_penalty = 1.0f;
    return s;
}

st_status st_sampling_validate(const st_sampling *s, int64_t vocab, st_error *err) {
    if (!(s->temperature >= 0.0f && s->temperature <= 100.0f))
        return st_error_set(err, ST_ERR_ARG, "temperature must be in [0, 100]");
    if (s->top_k < 0) return st_error_set(err, ST_ERR_ARG, "top_k must be >= 0");
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return st_error_set(err, ST_ERR_ARG, "top_p must be in (0, 1]");
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return st_error_set(err, ST_ERR_ARG, "min_p must be in [0, 1]");
    if (!(s->repetition_penalty > 0.0f && s->repetition_penalty <= 10.0f))
        return st_error_set(err, ST_ERR_ARG, "repetition_penalty must be in (0, 10]");
    if (!(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return st_error_set(err, ST_ERR_ARG, "presence_penalty must be in [-2, 2]");
    if (!(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return st_error_set(err, ST_ERR_ARG, "frequency_penalty must be in [-2, 2]");
    if (s->n_bias < 0 || s->n_bias > ST_MAX_LOGIT_BIAS)
        return st_error_set(err, ST_ERR_ARG, "at most %d logit_bias entries", ST_MAX_LOGIT_BIAS);
    for (int i = 0; i < s->n_bias; i++) {
        if (s->bias[i].token < 0 || s->bias[i].token >= vocab)
            return st_error_set(err, ST_ERR_ARG, "logit_bias token %d is outside the vocabulary",
                                s->bias[i].token);
        if (!(s->bias[i].bias >= -100.0f && s->bias[i].bias <= 100.0f))
            return st_error_set(err, ST_ERR_ARG, "logit_bias values must be in [-100, 100]");
    }
    return ST_OK;
}

/* ---- xoshiro256** ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(st_sampler_state *st) {
    uint64_t *s = st->rng;
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double next_unit(st_sampler_state *st) { return (double)(next_u64(st) >> 11) * 0x1.0p-53; }

void st_sampler_state_init(st_sampler_state *st, const st_sampling *s) {
    uint64_t seed = s->seed;
    if (!s->has_seed) {
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd < 0 || read(fd, &seed, sizeof seed) != (ssize_t)sizeof seed) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid();
        }
        if (fd >= 0) close(fd);
    }
    for (int i = 0; i < 4; i++) st->rng[i] = splitmix64(&seed);
}

/* ---- sampler ---- */

int st_logits_finite(const float *x, int64_t n) {
    /* the exponent bits are all ones exactly for NaN and infinity; integer lanes vectorize */
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        bad |= (b & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

st_status st_sampler_create(int64_t vocab, st_sampler **out, st_error *err) {
    *out = NULL;
    st_sampler *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    s->vocab = vocab;
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->in_prompt = calloc((size_t)vocab, 1);
    s->cands = malloc((size_t)vocab * sizeof *s->cands);
    s->raw = malloc((size_t)vocab * sizeof *s->raw);
    if (!s->count || !s->in_prompt || !s->cands || !s->raw) {
        st_sampler_destroy(s);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return ST_OK;
}

void st_sampler_destroy(st_sampler *s) {
    if (!s) return;
    free(s->count);
    free(s->in_prompt);
    free(s->cands);
    free(s->raw);
    free(s);
}

/* max + log(sum exp(x - max)) over x[0..v), in double, in index order */
static double row_lse(const float *x, int64_t v) {
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < v; i++)
        if (x[i] > mx) mx = x[i];
    for (int64_t i = 0; i < v; i++) sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

/* the n largest values of x (ties to the lower index), descending */
static int top_n(const float *x, int64_t v, int n, int32_t *tok, float *val) {
    int k = 0;
    for (int64_t i = 0; i < v; i++) {
        float xi = x[i];
        if (k == n && !(xi > val[k - 1])) continue;
        int j = k < n ? k++ : k - 1;
        while (j > 0 && xi > val[j - 1]) {
            val[j] = val[j - 1];
            tok[j] = tok[j - 1];
            j--;
        }
        val[j] = xi;
        tok[j] = (int32_t)i;
    }
    return k;
}

static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* Draw from the candidates c[0..n) with weights p. */
static int32_t draw(st_sampler_state *st, const cand *c, int64_t n) {
    double mass = 0;
    for (int64_t j = 0; j < n; j++) mass += c[j].p;
    double u = next_unit(st) * mass, acc = 0;
    for (int64_t j = 0; j < n; j++) {
        acc += c[j].p;
        if (u < acc) return c[j].t;
    }
    return c[n - 1].t;
}

/* Temperature, min-p, top-k, top-p and the draw over candidates c[0..n) (weights from the
 * largest logit mx; in id order), as both entry points share them. */
static int32_t choose(const st_sampling *p, st_sampler_state *st, cand *c, int64_t n) {
    /* min-p: below min_p times the most likely token (weight 1) */
    if (p->min_p > 0.0f) {
        int64_t k = 0;
        for (int64_t j = 0; j < n; j++)
            if (c[j].p >= p->min_p) c[k++] = c[j];
        n = k;
    }
    int need_order = (p->top_k > 0 && p->top_k < n) || p->top_p < 1.0f;
    if (need_order) {
        qsort(c, (size_t)n, sizeof *c, cand_desc);
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        if (p->top_p < 1.0f) {
            double total = 0, cum = 0;
            for (int64_t j = 0; j < n; j++) total += c[j].p;
            for (int64_t j = 0; j < n; j++) {
                cum += c[j].p;
                if (cum >= (double)p->top_p * total) {
                    n = j + 1;
                    break;
                }
            }
        }
    }
    return draw(st, c, n);
}

/* a candidate's weight exp((l - max) / T), or 0 when it is below 1e-12 (not drawable at
 * double precision) */
static int weight_of(float l, float mx, float inv_t, float *w) {
    const float e = (l - mx) * inv_t;
    if (e < -27.6f) return 0;
    *w = expf(e);
    return 1;
}

int32_t st_sampler_sample(st_sampler *s, const st_sampling *p, st_sampler_state *st,
                          float *logits, const int32_t *history, int64_t n_prompt,
                          int64_t n_history, int n_logprobs, st_logprobs *lp) {
    const int64_t V = s->vocab;
    if (lp) memcpy(s->raw, logits, (size_t)V * sizeof(float));
    /* logit bias, then penalties over the history */
    for (int i = 0; i < p->n_bias; i++) logits[p->bias[i].token] += p->bias[i].bias;
    if (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int64_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= V) continue;
            if (i < n_prompt) s->in_prompt[t] = 1;
            else s->count[t]++;
        }
        for (int64_t i = 0; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= V || (!s->in_prompt[t] && !s->count[t])) continue;
            float l = logits[t];
            if (p->repetition_penalty != 1.0f)
                l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
            if (s->count[t]) l -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
            logits[t] = l;
            s->in_prompt[t] = 0; /* penalise each token once; this also clears the scratch */
            s->count[t] = 0;
        }
    }
    int32_t chosen = 0;
    if (p->temperature == 0.0f || p->top_k == 1) {
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[chosen]) chosen = (int32_t)i;
    } else {
        const float inv_t = 1.0f / p->temperature;
        float mx = -INFINITY;
        for (int64_t i = 0; i < V; i++)
            if (logits[i] > mx) mx = logits[i];
        cand *c = s->cands;
        int64_t n = 0;
        for (int64_t i = 0; i < V; i++)
            if (weight_of(logits[i], mx, inv_t, &c[n].p)) c[n++].t = (int32_t)i;
        chosen = choose(p, st, c, n);
    }
    if (lp) {
        /* the model's own distribution: log-softmax of the raw logits */
        const float *raw = s->raw;
        const double lse = row_lse(raw, V);
        lp->token = chosen;
        lp->logprob = (float)((double)raw[chosen] - lse);
        int nt = n_logprobs < 0 ? 0 : n_logprobs > ST_MAX_LOGPROBS ? ST_MAX_LOGPROBS : n_logprobs;
        lp->n_top = nt ? top_n(raw, V, nt, lp->top_tokens, lp->top_logprobs) : 0;
        for (int i = 0; i < lp->n_top; i++)
            lp->top_logprobs[i] = (float)((double)lp->top_logprobs[i] - lse);
    }
    return chosen;
}

void st_logit_top_make(const float *row, int64_t vocab, st_logit_top *out) {
    const int n = vocab < ST_TOP_MAX ? (int)vocab : ST_TOP_MAX;
    out->n = top_n(row, vocab, n, out->id, out->val);
    out->finite = st_logits_finite(row, vocab);
    out->lse = out->finite ? row_lse(row, vocab) : 0.0;
}

int st_sampler_top_ok(const st_sampling *p) {
    return p->n_bias == 0 && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f &&
           (p->temperature == 0.0f || (p->top_k >= 1 && p->top_k <= ST_TOP_SAMPLE_MAX));
}

static int by_token(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

int32_t st_sampler_sample_top(st_sampler *s, const st_sampling *p, st_sampler_state *st, const st_logit_top *top,
                              int n_logprobs, st_logprobs *lp) {
    int32_t chosen = top->id[0];
    float chosen_l = top->val[0];
    if (!(p->temperature == 0.0f || p->top_k == 1)) {
        /* the candidates the full row gives, in id order: every token of weight at least that
         * of the top_k-th is here unless the list's last ties it (then the list's ties stand in) */
        const float inv_t = 1.0f / p->temperature, mx = top->val[0];
        cand *c = s->cands;
        int64_t n = 0;
        for (int j = 0; j < top->n; j++)
            if (weight_of(top->val[j], mx, inv_t, &c[n].p)) c[n++].t = top->id[j];
        qsort(c, (size_t)n, sizeof *c, by_token);
        chosen = choose(p, st, c, n);
        for (int j = 0; j < top->n; j++)
            if (top->id[j] == chosen) chosen_l = top->val[j];
    }
    if (lp) {
        lp->token = chosen;
        lp->logprob = (float)((double)chosen_l - top->lse);
        int nt = n_logprobs < 0 ? 0 : n_logprobs > ST_MAX_LOGPROBS ? ST_MAX_LOGPROBS : n_logprobs;
        lp->n_top = nt < top->n ? nt : top->n;
        for (int i = 0; i < lp->n_top; i++) {
            lp->top_tokens[i] = top->id[i];
            lp->top_logprobs[i] = (float)((double)top->val[i] - top->lse);
        }
    }
    return chosen;
}
