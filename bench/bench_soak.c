/* ==== Soak benchmark: many sequences decoding for a long time in bounded memory ====
 *
 * N concurrent sequences (default 8) each decode S tokens (default 20,000) through the
 * scheduler on a small synthetic model. Prints the memory the engine plans at start, then
 * every K steps (default 1,000) the resident set, the KV blocks in use (and the most ever
 * taken, since a freed block stays resident for reuse) and the heap
 * allocations made by the steps since the last row. At the end it checks the two claims:
 * after the first K steps the resident set grew by no more than the KV blocks newly taken
 * plus 1 MiB, and the steps made no heap allocation at all.
 *
 *   build/bench/bench_soak [--seqs N] [--steps S] [--every K] [-m DIR]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/mem.h"
#include "engine/scheduler.h"
#include "model/synth.h"

#include "alloc_count.h"

typedef struct seq_out {
    long n;
    int done;
    st_finish_reason finish;
} seq_out;

static int on_event(void *user, const st_event *ev) {
    seq_out *o = user;
    if (ev->kind == ST_EV_TOKEN) o->n++;
    else {
        o->done = 1;
        o->finish = ev->finish;
    }
    return ST_EV_CONTINUE;
}

static const char *soak_config =
    "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 2048, \"hidden_size\": 64,"
    "\"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
    "\"num_key_value_heads\": 1, \"head_dim\": 32, \"linear_key_head_dim\": 16,"
    "\"linear_value_head_dim\": 16, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
    "\"full_attention_interval\": 4, \"max_position_embeddings\": 65536, \"eos_token_id\": [0]}";

int main(int argc, char **argv) {
    int seqs = 8;
    long steps = 20000, every = 1000;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seqs") && i + 1 < argc) seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--every") && i + 1 < argc) every = atol(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench_soak [--seqs N] [--steps S] [--every K] [-m DIR]\n");
            return 2;
        }
    }
    if (seqs < 1 || steps < 2 || every < 1) return 2;
    st_error err = {0};
    char tmp[] = "/tmp/strand-soak-XXXXXX";
    if (!dir) {
        if (!mkdtemp(tmp)) return 1;
        char cfg[600];
        snprintf(cfg, sizeof cfg, "%s/soak-config.json", tmp);
        FILE *f = fopen(cfg, "w");
        if (!f) return 1;
        fputs(soak_config, f);
        fclose(f);
        st_synth_params sp = st_synth_default_params();
        sp.config_path = cfg;
        if (st_synth_write(&sp, tmp, &err) != ST_OK) {
            fprintf(stderr, "synth: %s\n", err.msg);
            return 1;
        }
        dir = tmp;
    }
    st_model *m = NULL;
    if (st_model_load(dir, &m, &err) != ST_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = seqs;
    sp.ctx = steps + 64;
    sp.step_tokens = 256 > seqs ? 256 : seqs;
    sp.max_queue = seqs;
    st_sched *s = NULL;
    if (st_sched_create(m, NULL, &sp, &s, &err) != ST_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const st_cache *c = st_sched_cache(s);
    const st_sched_plan *pl = st_sched_get_plan(s);
    st_model_stats ms;
    st_model_get_stats(m, c->p.kv_dtype == ST_KV_BF16 ? 2 : 4, &ms);
    st_sched_stats ss;
    st_sched_get_stats(s, &ss);
    size_t block_bytes = pl->kv_blocks ? pl->kv_bytes / (size_t)pl->kv_blocks : 0;
    double MiB = 1024.0 * 1024.0;
    printf("soak: %d sequences x %ld tokens, model %s (%lld params)\n", seqs, steps, dir,
           (long long)ms.n_params);
    printf("planned memory: weights %.2f MiB (mapped) + KV pool %.2f MiB (%lld blocks of %zu B) + "
           "state slots %.2f MiB + scratch and records %.2f MiB = %.2f MiB\n",
           (double)ms.weight_bytes / MiB, (double)c->p.n_blocks * (double)block_bytes / MiB,
           (long long)c->p.n_blocks, block_bytes,
           (double)pl->state_bytes / MiB,
           (double)(ss.planned_bytes - pl->kv_bytes - pl->state_bytes) / MiB,
           ((double)ms.weight_bytes + (double)ss.planned_bytes) / MiB);
    seq_out *outs = calloc((size_t)seqs, sizeof *outs);
    st_req_params rp = st_req_default_params();
    rp.max_tokens = steps;
    rp.ignore_eos = 1;
    rp.sampling.temperature = 1.0f;
    rp.sampling.has_seed = 1;
    for (int i = 0; i < seqs; i++) {
        int32_t prompt[16];
        for (int j = 0; j < 16; j++) prompt[j] = (int32_t)((i * 131 + j * 17) % 2048);
        rp.sampling.seed = (uint64_t)i + 1;
        if (st_sched_submit(s, prompt, 16, &rp, on_event, &outs[i], NULL, &err) != ST_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    printf("\n%8s %10s %14s %12s %16s %16s %12s %10s\n", "step", "RSS MiB", "RSS since K",
           "KV blocks", "KV taken since K", "allowed growth", "allocs/step", "tok/s");
    double t0 = st_now_s(), t_last = t0;
    long step = 0, allocs_total = 0, steps_counted = 0;
    size_t rss_k = 0;
    int64_t blocks_k = 0, peak_blocks = 0;
    int ok = 1;
    while (1) {
        alloc_count = 0;
        alloc_counting = step > 0; /* the first step admits and prefills */
        int left = st_sched_step(s);
        alloc_counting = 0;
        step++;
        if (step > 1) {
            allocs_total += alloc_count;
            steps_counted++;
        }
        st_sched_get_stats(s, &ss);
        if (ss.kv_blocks_used > peak_blocks) peak_blocks = ss.kv_blocks_used;
        if (step % every == 0 || left == 0) {
            size_t rss = st_rss_bytes();
            double t = st_now_s();
            if (step == every) {
                rss_k = rss;
                blocks_k = peak_blocks;
            }
            double grown = step >= every ? ((double)rss - (double)rss_k) / MiB : 0;
            /* freed blocks stay resident for reuse: count the peak taken so far */
            int64_t taken = step >= every ? peak_blocks - blocks_k : 0;
            double allowed = (double)taken * (double)block_bytes / MiB + 1.0;
            if (step > every && grown > allowed) ok = 0;
            printf("%8ld %10.2f %14.2f %12lld %16lld %16.2f %12.3f %10.0f\n", step,
                   (double)rss / MiB, grown, (long long)ss.kv_blocks_used, (long long)taken, allowed,
                   steps_counted ? (double)allocs_total / (double)steps_counted : 0.0,
                   (double)every * seqs / (t - t_last));
            t_last = t;
            fflush(stdout);
        }
        if (left == 0) break;
    }
    long total = 0;
    for (int i = 0; i < seqs; i++) total += outs[i].n;
    printf("\n%ld tokens in %.1f s; heap allocations in %ld decode steps: %ld\n", total,
           st_now_s() - t0, steps_counted, allocs_total);
    printf("resident growth after step %ld within KV blocks taken + 1 MiB: %s\n", every, ok ? "yes" : "NO");
    printf("zero heap allocations per decode step: %s\n", allocs_total == 0 ? "yes" : "NO");
    st_sched_destroy(s);
    st_model_free(m);
    free(outs);
    if (dir == tmp) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    }
    return ok && allocs_total == 0 ? 0 : 1;
}
