/* ==== strand perplexity: how well a model predicts a text ====
 * strand perplexity -m DIR --text-file F [--window N] [--batch B] [--json]
 *                   [--save-logprobs FILE] [--kl-divergence FILE]
 * The text is tokenized whole (special-token text matched, as Hugging Face's default does),
 * cut into windows (engine/perplexity.h) and scored. --save-logprobs writes, for every scored
 * position, the model's top KL_TOP log-probabilities; --kl-divergence reads such a file (made
 * by a reference run: bf16 weights, say) and reports the KL divergence of this model from it
 * and how often the two agree on the most likely token, as llama-perplexity's
 * --kl-divergence does. The KL is taken over the reference's top KL_TOP tokens plus the rest
 * as one outcome: a lower bound of the full divergence, short of it only by what the two
 * distributions differ within that tail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "engine/perplexity.h"
#include "tokenizer/tokenizer.h"

#define KL_TOP 32
#define KL_MAGIC "strandlp"

static void usage(void) {
    fprintf(stderr,
            "usage: strand perplexity -m DIR --text-file F [--window 512] [--batch 4] [--json]\n"
            "                         [--kv-dtype f32|bf16] [--save-logprobs FILE]\n"
            "                         [--kl-divergence FILE]\n"
            "  Perplexity of the text: consecutive windows of --window tokens, each from an empty\n"
            "  cache, every position but the first scored; --batch windows run together.\n"
            "  --save-logprobs FILE: keep this run's top-%d log-probabilities per position;\n"
            "  --kl-divergence FILE: compare with such a run (KL divergence, top-token agreement).\n",
            KL_TOP);
}

/* one scored position of a saved run: the top tokens and their log-probabilities */
typedef struct kl_row {
    int32_t token[KL_TOP];
    float logprob[KL_TOP];
} kl_row;

typedef struct ppl_cli {
    int tty;
    int64_t vocab;
    FILE *save;            /* --save-logprobs */
    const kl_row *base;    /* --kl-divergence: [n_base] rows, mapped */
    int64_t n_base;
    double kl_sum, kl_sum2, kl_max;
    int64_t kl_n, same_top;
    int failed;
} ppl_cli;

static void on_progress(void *user, int64_t done, int64_t windows, int64_t scored, double ppl) {
    ppl_cli *c = user;
    if (!c->tty) return;
    fprintf(stderr, "\r[window %lld/%lld] %lld tokens scored, perplexity %.4f   ", (long long)done,
            (long long)windows, (long long)scored, ppl);
    if (done == windows) fputc('\n', stderr);
}

/* the k largest logits, descending (ties to the lower id) */
static void top_k(const float *x, int64_t v, int32_t *tok, float *val) {
    int n = 0;
    for (int64_t i = 0; i < v; i++) {
        if (n == KL_TOP && !(x[i] > val[n - 1])) continue;
        int j = n < KL_TOP ? n++ : n - 1;
        while (j > 0 && x[i] > val[j - 1]) {
            val[j] = val[j - 1];
            tok[j] = tok[j - 1];
            j--;
        }
        val[j] = x[i];
        tok[j] = (int32_t)i;
    }
}

static void on_row(void *user, int64_t index, const float *logits, double lse, int32_t token) {
    ppl_cli *c = user;
    (void)token;
    if (c->failed) return;
    if (c->save) {
        kl_row r;
        top_k(logits, c->vocab, r.token, r.logprob);
        for (int k = 0; k < KL_TOP; k++) r.logprob[k] = (float)((double)r.logprob[k] - lse);
        long at = (long)(8 + 3 * sizeof(int64_t) + (size_t)index * sizeof r); /* rows by index, whatever the order */
        if (fseek(c->save, at, SEEK_SET) != 0 || fwrite(&r, sizeof r, 1, c->save) != 1) c->failed = 1;
    }
    if (c->base && index < c->n_base) {
        const kl_row *b = &c->base[index];
        double kl = 0, pb_rest = 1, pn_rest = 1;
        int32_t best = 0;
        for (int64_t i = 1; i < c->vocab; i++)
            if (logits[i] > logits[best]) best = (int32_t)i;
        for (int k = 0; k < KL_TOP; k++) {
            double lb = b->logprob[k], ln = (double)logits[b->token[k]] - lse, pb = exp(lb);
            kl += pb * (lb - ln);
            pb_rest -= pb;
            pn_rest -= exp(ln);
        }
        if (pb_rest > 1e-12 && pn_rest > 1e-12) kl += pb_rest * (log(pb_rest) - log(pn_rest));
        if (kl < 0) kl = 0; /* rounding: a divergence is never below zero */
        c->kl_sum += kl;
        c->kl_sum2 += kl * kl;
        if (kl > c->kl_max) c->kl_max = kl;
        c->kl_n++;
        c->same_top += best == b->token[0];
    }
}

int cmd_perplexity(int argc, char **argv) {
    const char *dir = NULL, *text_file = NULL, *save_path = NULL, *kl_path = NULL;
    int json = 0;
    st_ppl_params pp = st_ppl_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--text-file")) {
            if (!(text_file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--window")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 2, 1 << 24, &x)) return 2;
            pp.window = (int)x;
        } else if (!strcmp(a, "--batch")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &x)) return 2;
            pp.batch = (int)x;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_kv_dtype(v, &pp.kv_dtype) != 0) return 2;
        } else if (!strcmp(a, "--save-logprobs")) {
            if (!(save_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--kl-divergence")) {
            if (!(kl_path = cli_value(argc, argv, &i))) return 2;
        } else {
            usage();
            return cli_failf("perplexity: unknown option '%s'", a);
        }
    }
    if (!dir || !text_file) {
        usage();
        return cli_failf("perplexity: -m DIR and --text-file F are required");
    }
    st_error err = {0};
    st_model *m = NULL;
    st_backend *be = NULL;
    st_tokenizer *tok = NULL;
    char *text = NULL;
    size_t text_len = 0, n_ids = 0;
    int32_t *ids = NULL;
    st_mapped_file base = {0};
    ppl_cli c = {0};
    int rc = 1;
    if (st_file_read(text_file, (size_t)1 << 30, &text, &text_len, &err) != ST_OK) goto done;
    if (st_model_load(dir, &m, &err) != ST_OK) goto done;
    if (cli_backend(m, &be, &err) != ST_OK) goto done;
    pp.backend = be;
    if (st_tok_load_dir(dir, &tok, &err) != ST_OK) goto done;
    if (st_tok_encode(tok, text, text_len, 1, &ids, &n_ids, &err) != ST_OK) {
        st_error_prefix(&err, "%s: ", text_file);
        goto done;
    }
    c.tty = isatty(STDERR_FILENO) && !json;
    c.vocab = m->cfg.vocab_size;
    if (kl_path) {
        if (st_file_map(kl_path, &base, &err) != ST_OK) goto done;
        int64_t hdr[3];
        if (base.size < 8 + sizeof hdr || memcmp(base.data, KL_MAGIC, 8) != 0) {
            st_error_set(&err, ST_ERR_FORMAT, "%s: not a file of --save-logprobs", kl_path);
            goto done;
        }
        memcpy(hdr, base.data + 8, sizeof hdr); /* vocab, window, rows */
        if (hdr[0] != c.vocab || hdr[1] != pp.window || hdr[2] < 0 ||
            base.size != 8 + sizeof hdr + (size_t)hdr[2] * sizeof(kl_row)) {
            st_error_set(&err, ST_ERR_FORMAT,
                         "%s: saved for vocabulary %lld and window %lld (%lld rows); this run has %lld and %d",
                         kl_path, (long long)hdr[0], (long long)hdr[1], (long long)hdr[2], (long long)c.vocab,
                         pp.window);
            goto done;
        }
        c.base = (const kl_row *)(base.data + 8 + sizeof hdr);
        c.n_base = hdr[2];
    }
    if (save_path) {
        c.save = strcmp(save_path, "-") ? fopen(save_path, "wb") : NULL;
        int64_t rows = n_ids / (size_t)pp.window * (pp.window - 1);
        int64_t hdr[3] = {c.vocab, pp.window, rows};
        if (!c.save || fwrite(KL_MAGIC, 8, 1, c.save) != 1 || fwrite(hdr, sizeof hdr, 1, c.save) != 1) {
            st_error_set(&err, ST_ERR_IO, "%s: cannot write", save_path);
            goto done;
        }
    }
    pp.progress = on_progress;
    pp.row = c.save || c.base ? on_row : NULL;
    pp.user = &c;
    st_ppl_result r;
    if (st_perplexity(m, ids, (int64_t)n_ids, &pp, &r, &err) != ST_OK) goto done;
    if (c.failed || (c.save && fclose(c.save) != 0)) {
        c.save = NULL;
        st_error_set(&err, ST_ERR_IO, "%s: write failed", save_path);
        goto done;
    }
    c.save = NULL;
    if (c.base && c.kl_n != c.n_base) {
        st_error_set(&err, ST_ERR_FORMAT, "%s has %lld positions, this text %lld: not the same text", kl_path,
                     (long long)c.n_base, (long long)c.kl_n);
        goto done;
    }
    double kl_mean = c.kl_n ? c.kl_sum / (double)c.kl_n : 0;
    double kl_var = c.kl_n ? c.kl_sum2 / (double)c.kl_n - kl_mean * kl_mean : 0;
    double kl_se = c.kl_n ? sqrt(kl_var > 0 ? kl_var : 0) / sqrt((double)c.kl_n) : 0;
    double same = c.kl_n ? 100.0 * (double)c.same_top / (double)c.kl_n : 0;
    if (json) {
        printf("{\"perplexity\": %.6f, \"stderr\": %.6f, \"nll_mean\": %.6f, \"nll_sd\": %.6f, \"scored\": %lld, "
               "\"windows\": %lld, \"window\": %d, \"tokens_per_s\": %.1f, \"seconds\": %.3f",
               r.ppl, r.ppl_stderr, r.nll_mean, r.nll_sd, (long long)r.scored, (long long)r.windows, pp.window,
               r.tokens_per_s, r.seconds);
        if (c.base)
            printf(", \"kl_divergence\": %.6g, \"kl_stderr\": %.6g, \"kl_max\": %.6g, \"same_top_percent\": %.3f", kl_mean,
                   kl_se, c.kl_max, same);
        printf("}\n");
    } else {
        printf("perplexity %.4f +/- %.4f (%lld tokens scored in %lld windows of %d; mean NLL %.5f)\n", r.ppl,
               r.ppl_stderr, (long long)r.scored, (long long)r.windows, pp.window, r.nll_mean);
        if (c.base)
            printf("KL divergence from %s: %.6f +/- %.6f (max %.4f); same top token %.2f%%\n", kl_path, kl_mean,
                   kl_se, c.kl_max, same);
        fprintf(stderr, "[%lld tokens in %.2f s: %.1f tok/s, %d windows at a time]\n", (long long)(r.windows * pp.window),
                r.seconds, r.tokens_per_s, pp.batch);
    }
    rc = 0;
done:
    if (rc) cli_fail(&err);
    if (c.save) fclose(c.save);
    st_file_unmap(&base);
    free(ids);
    free(text);
    st_tok_free(tok);
    st_backend_destroy(be);
    st_model_free(m);
    return rc;
}
