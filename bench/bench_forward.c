/* ==== Forward-pass benchmark that needs nothing but the library (links statically) ====
 *
 * build/bench/bench_forward [-m DIR | --preset 0.8b [--dtype bf16|q8|q4] [--dir D]]
 *                           [-k KERNELS] [-t THREADS] [--prompts 512,2048] [--batches 1,4,16]
 *                           [--gdn-chunked 0|1]
 * Without -m it synthesizes the preset's checkpoint into --dir (default /tmp/strand-bench-*)
 * unless it is already there. Then: prefill tokens/s of one sequence per prompt length (the
 * whole prompt in one call), and decode tokens/s per batch size after a 128-token prompt
 * (--prompt-len),
 * with the weight bytes read per step per second. `strand bench` is the user-facing command
 * (it also measures the memory bandwidth); this program exists for machines where only a
 * static binary can run, and for A/B runs of the forward parameters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "engine/batch.h"
#include "model/forward.h"
#include "model/synth.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        while (*s && *s != ',') s++;
        if (*s == ',') s++;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *preset = "0.8b", *dtype = "bf16", *kname = NULL;
    char tmp[512];
    int threads = 0, chunked = 1, plen = 128;
    int prompts[8] = {512, 2048}, batches[8] = {1, 4, 16};
    int np = 2, nb = 3;
    const char *outdir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) outdir = argv[i + 1];
        else if (!strcmp(argv[i], "-k")) kname = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompts")) np = parse_list(argv[i + 1], prompts, 8);
        else if (!strcmp(argv[i], "--batches")) nb = parse_list(argv[i + 1], batches, 8);
        else if (!strcmp(argv[i], "--gdn-chunked")) chunked = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt-len")) plen = atoi(argv[i + 1]);
    }
    st_error err = {0};
    if (!dir) {
        snprintf(tmp, sizeof tmp, "%s", outdir ? outdir : "");
        if (!outdir) snprintf(tmp, sizeof tmp, "/tmp/strand-bench-%s-%s", preset, dtype);
        char cfg[600];
        snprintf(cfg, sizeof cfg, "%s/config.json", tmp);
        struct stat sb;
        if (stat(cfg, &sb) != 0) {
            st_synth_params sp = st_synth_default_params();
            sp.preset = preset;
            sp.bits = strcmp(dtype, "bf16") == 0 ? 0 : atoi(dtype + 1);
            sp.seed = 1;
            fprintf(stderr, "synthesizing %s %s into %s\n", preset, dtype, tmp);
            if (st_synth_write(&sp, tmp, &err) != ST_OK) {
                fprintf(stderr, "synth: %s\n", err.msg);
                return 1;
            }
        }
        dir = tmp;
    }
    st_model *m = NULL;
    if (st_model_load(dir, &m, &err) != ST_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_model_stats ms;
    st_model_get_stats(m, sizeof(float), &ms);
    int maxp = 128, maxb = 1;
    for (int i = 0; i < np; i++) maxp = prompts[i] > maxp ? prompts[i] : maxp;
    for (int i = 0; i < nb; i++) maxb = batches[i] > maxb ? batches[i] : maxb;
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = maxb;
    cp.max_seq_len = maxp + 1024;
    st_cache *c = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    st_cpu_params fp = st_cpu_default_params();
    fp.n_threads = threads;
    fp.gdn_chunked = chunked;
    if (kname && !(fp.kernels = st_kernels_by_name(kname))) {
        fprintf(stderr, "kernel set %s not available\n", kname);
        return 1;
    }
    int max_tokens = maxp > plen * maxb ? maxp : plen * maxb;
    st_ctx_params xp;
    if (st_backend_cpu_create(m, &fp, NULL, &be, &err) != ST_OK || st_cache_create(m, &cp, &c, &err) != ST_OK ||
        (xp = st_cache_ctx_params(c, max_tokens), st_fwd_create(be, &xp, &f, &err)) != ST_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int64_t V = m->cfg.vocab_size;
    float *logits = malloc((size_t)maxb * (size_t)V * sizeof(float));
    int32_t *toks = malloc((size_t)max_tokens * sizeof(int32_t));
    for (int i = 0; i < max_tokens; i++) toks[i] = (int32_t)((1000003LL * i + 17) % V);
    printf("%s: kernels %s, %d threads, %.3f GB of weights per decode step\n", dir,
           st_backend_cpu_kernels(be)->name, st_backend_cpu_threads(be), ms.bytes_per_token / 1e9);
    st_seq s[64];
    for (int i = 0; i < 64; i++) s[i].slot = -1;
    st_status st = st_cache_seq_start(c, &s[0], &err);
    st_batch_item it = {&s[0], toks, 1, ST_LOGITS_LAST};
    for (int r = 0; r < 2 && st == ST_OK; r++) st = st_batch_run(c, f, &it, 1, logits, &err);
    st_cache_seq_release(c, &s[0]);
    for (int i = 0; i < np && st == ST_OK; i++) {
        st = st_cache_seq_start(c, &s[0], &err);
        it = (st_batch_item){&s[0], toks, prompts[i], ST_LOGITS_LAST};
        double t0 = now_s();
        if (st == ST_OK) st = st_batch_run(c, f, &it, 1, logits, &err);
        double t = now_s() - t0;
        st_cache_seq_release(c, &s[0]);
        printf("prefill %5d tokens: %8.1f tok/s (%.2f s)\n", prompts[i], prompts[i] / t, t);
    }
    for (int b = 0; b < nb && st == ST_OK; b++) {
        const int B = batches[b];
        st_batch_item items[64];
        int32_t next[64];
        for (int i = 0; i < B && st == ST_OK; i++) {
            st = st_cache_seq_start(c, &s[i], &err);
            items[i] = (st_batch_item){&s[i], toks + plen * i, plen, ST_LOGITS_LAST};
        }
        if (st == ST_OK) st = st_batch_run(c, f, items, B, logits, &err);
        int steps = 0;
        double t0 = now_s(), t = 0, best = 1e30;
        while (st == ST_OK && (steps < 3 || t < 2.0) && steps < 900) {
            for (int i = 0; i < B; i++) {
                next[i] = (int32_t)((steps * 7919 + i * 104729) % V);
                items[i] = (st_batch_item){&s[i], &next[i], 1, ST_LOGITS_LAST};
            }
            double a = now_s();
            st = st_batch_run(c, f, items, B, logits, &err);
            double d = now_s() - a;
            if (d < best) best = d;
            steps++;
            t = now_s() - t0;
        }
        for (int i = 0; i < B; i++) st_cache_seq_release(c, &s[i]);
        printf("decode batch %2d: %8.2f tok/s (mean step %.2f ms, best %.2f ms), weights %.2f GB/s (best %.2f)\n",
               B, B * steps / t, t / steps * 1e3, best * 1e3, ms.bytes_per_token * steps / t / 1e9,
               ms.bytes_per_token / best / 1e9);
    }
    if (st != ST_OK) fprintf(stderr, "%s\n", err.msg);
    free(logits);
    free(toks);
    st_fwd_destroy(f);
    st_cache_destroy(c);
    st_backend_destroy(be);
    st_model_free(m);
    return st == ST_OK ? 0 : 1;
}
