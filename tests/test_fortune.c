/* ==== tiny-fortune, a trained model, against the reference ====
 * models/tiny-fortune ships with strand (the demo). Its golden.safetensors holds the
 * reference's outputs (transformers, fp32 compute on the stored bf16 weights):
 * - chat.ids / chat.greedy: a chat prompt (thinking off) and its greedy reply, which a
 *   correct engine reproduces token for token;
 * - p0.ids / p0.logits: logits at every position of a prompt (the fixtures' 1e-3 bound);
 * - ppl.ids / ppl.nll: the held-out text's tokens and every scored position's NLL;
 *   golden.json's perplexity: strand's must agree to 1e-4 relative, each NLL to 1e-4,
 *   and the result must not depend on how many windows run together. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "engine/generate.h"
#include "engine/perplexity.h"
#include "golden.h"
#include "model/forward.h"
#include "kit.h"
#include "tap.h"
#include "tokenizer/tokenizer.h"

#define GOLDEN_PPL 151.82440585905297

static const char *model_dir(void) {
    const char *d = getenv("STRAND_FORTUNE");
    return d && *d ? d : "models/tiny-fortune";
}

typedef struct nll_capture {
    float *nll;   /* [n] */
    int64_t n, seen;
} nll_capture;

static void capture(void *user, int64_t index, const float *logits, double lse, int32_t token) {
    nll_capture *c = user;
    if (index < c->n) c->nll[index] = (float)(lse - (double)logits[token]);
    c->seen++;
}

int main(void) {
    st_model *m = NULL;
    st_checkpoint *g = NULL;
    st_tokenizer *tok = NULL;
    st_error err = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.safetensors", model_dir());
    if (!CHECK(st_model_load(model_dir(), &m, &err) == ST_OK && st_checkpoint_open(path, &g, &err) == ST_OK &&
                   st_tok_load_dir(model_dir(), &tok, &err) == ST_OK,
               "tiny-fortune loads with its goldens and tokenizer (%s)", err.msg))
        return tap_done();
    const int64_t V = m->cfg.vocab_size;

    /* the chat reply */
    const st_tensor *ci = golden_get(g, "chat.ids", ST_DTYPE_I32), *cg = golden_get(g, "chat.greedy", ST_DTYPE_I32);
    if (CHECK(ci && cg, "chat.ids and chat.greedy")) {
        int32_t out[64];
        st_gen_request rq = {ci->data, (int)ci->numel, (int)cg->numel, out, 0, NULL};
        st_gen_options o = st_gen_default_options();
        int ok = st_generate_greedy(m, &rq, 1, &o, &err) == ST_OK && rq.n_out == (int)cg->numel &&
                 !memcmp(out, cg->data, (size_t)cg->numel * sizeof *out);
        char *text = NULL;
        size_t len = 0;
        st_tok_decode(tok, out, (size_t)rq.n_out, 1, &text, &len, &err);
        CHECK(ok, "the greedy chat reply is the reference's, token for token (%d tokens: \"%.60s...\")", rq.n_out,
              text ? text : "");
        free(text);
    }

    /* logits at every position of p0 */
    const st_tensor *pi = golden_get(g, "p0.ids", ST_DTYPE_I32), *pl = golden_get(g, "p0.logits", ST_DTYPE_F32);
    if (CHECK(pi && pl, "p0.ids and p0.logits")) {
        st_cache_params cp = st_cache_default_params();
        cp.max_seq_len = pi->numel;
        st_cache *c = NULL;
        st_fwd *f = NULL;
    st_backend *kbe = NULL;
        float *lg = malloc((size_t)pi->numel * (size_t)V * sizeof *lg);
        st_seq seq = {.slot = -1};
        if (lg && st_cache_create(m, &cp, &c, &err) == ST_OK && kit_fwd_new(m, c, (int)pi->numel, &kbe, &f, &err) == ST_OK &&
            st_cache_seq_start(c, &seq, &err) == ST_OK) {
            st_batch_item it = {&seq, pi->data, (int)pi->numel, ST_LOGITS_ALL};
            if (st_batch_run(c, f, &it, 1, lg, &err) == ST_OK) {
                double e = rel_rows_err(lg, pl->data, pi->numel, V);
                CHECK(e < 1e-3, "p0 logits at all %lld positions within %.2e of the reference (bound 1e-3)",
                      (long long)pi->numel, e);
            }
        }
        st_fwd_destroy(f);
    st_backend_destroy(kbe);
        st_cache_destroy(c);
        free(lg);
    }

    /* perplexity of the held-out text */
    const st_tensor *ti = golden_get(g, "ppl.ids", ST_DTYPE_I32), *tn = golden_get(g, "ppl.nll", ST_DTYPE_F32);
    char *text = NULL;
    size_t text_len = 0, n_ids = 0;
    int32_t *ids = NULL;
    snprintf(path, sizeof path, "%s/heldout.txt", model_dir());
    if (CHECK(ti && tn && st_file_read(path, 1 << 24, &text, &text_len, &err) == ST_OK &&
                  st_tok_encode(tok, text, text_len, 1, &ids, &n_ids, &err) == ST_OK,
              "heldout.txt tokenizes (%s)", err.msg)) {
        CHECK(n_ids >= (size_t)ti->numel && !memcmp(ids, ti->data, (size_t)ti->numel * sizeof *ids),
              "its %zu tokens begin with the reference's %lld scored windows' tokens", n_ids, (long long)ti->numel);
        /* STRAND_TEST_SCALE=N (the sanitizer's run): the first 52 / N windows only; their
         * per-position NLLs are still the reference's, the whole text's value is the plain run's */
        const char *sc = getenv("STRAND_TEST_SCALE");
        const int scale = sc && atoi(sc) > 1 ? atoi(sc) : 1, nw = 52 / scale;
        const int64_t win = st_ppl_default_params().window;
        const int64_t n_use = scale > 1 ? nw * win : (int64_t)n_ids, scored = scale > 1 ? nw * (win - 1) : tn->numel;
        double ppl[3];
        int batches[3] = {1, 4, 13}, all = 1;
        nll_capture cap = {calloc((size_t)tn->numel, sizeof(float)), tn->numel, 0};
        for (int b = 0; b < 3; b++) {
            st_ppl_params p = st_ppl_default_params();
            p.batch = batches[b];
            p.step_tokens = b == 2 ? 300 : 0; /* also uneven chunks */
            p.row = b == 1 ? capture : NULL;
            p.user = &cap;
            st_ppl_result r;
            all &= st_perplexity(m, ids, n_use, &p, &r, &err) == ST_OK && r.scored == scored && r.windows == nw;
            ppl[b] = r.ppl;
            if (b == 1) printf("# perplexity %.6f +/- %.4f, %.0f tok/s\n", r.ppl, r.ppl_stderr, r.tokens_per_s);
        }
        double rel = fabs(ppl[1] - GOLDEN_PPL) / GOLDEN_PPL;
        if (scale == 1)
            CHECK(all && rel < 1e-4, "held-out perplexity %.6f vs the reference's %.6f (relative %.1e, bound 1e-4)", ppl[1],
                  GOLDEN_PPL, rel);
        else
            CHECK(all, "perplexity of the first %d windows %.6f (1/%d of the text; the whole text's value: the plain run)", nw,
                  ppl[1], scale);
        CHECK(ppl[0] == ppl[1] && ppl[1] == ppl[2],
              "the same to the last bit with 1, 4 or 13 windows at a time and uneven chunks");
        double worst = 0;
        const float *want = tn->data;
        for (int64_t i = 0; i < scored; i++) {
            double d = fabs((double)cap.nll[i] - (double)want[i]);
            if (!(d <= worst)) worst = d;
        }
        CHECK(cap.seen == scored && worst < 1e-4, "every one of the %lld per-position NLLs within %.1e of the reference's",
              (long long)scored, worst);
        free(cap.nll);
        st_ppl_params bad = st_ppl_default_params();
        bad.window = 1 << 20;
        st_ppl_result r;
        CHECK(st_perplexity(m, ids, (int64_t)n_ids, &bad, &r, &err) == ST_ERR_ARG,
              "a window longer than the model's context is refused: %s", err.msg);
        bad.window = 512;
        CHECK(st_perplexity(m, ids, 100, &bad, &r, &err) == ST_ERR_ARG && strstr(err.msg, "fewer than one window"),
              "a text shorter than a window is refused: %s", err.msg);
    }
    free(ids);
    free(text);
    st_tok_free(tok);
    st_checkpoint_close(g);
    st_model_free(m);
    return tap_done();
}
