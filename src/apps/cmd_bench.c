/* ==== strand bench: prefill and decode speed against this machine's memory bandwidth ====
 * strand bench -m DIR [--json] [-t THREADS] [-k KERNELS] [--prompts 512,2048]
 *              [--batches 1,4,16] [--prompt-len 128] [--decode-s SECONDS]
 *
 * 1. Measures the memory read bandwidth: every thread of the pool streams its share of a
 *    512 MiB buffer (2x the largest last-level cache seen so far) with wide loads and a
 *    software prefetch, best of 5 passes (the "bandwidth" line; later passes can raise it).
 * 2. Prefill: one sequence, the whole prompt in one forward call (logits of the last token),
 *    for each prompt length; tokens per second. On a GPU each length runs twice and the
 *    second is the one reported: the first also loads the kernels it launches first (the
 *    CUDA runtime loads a kernel at its first launch, cuBLASLt picks an algorithm per
 *    shape); its rate is shown beside ("first").
 * 3. Decode: B sequences (B in --batches) each prefilled with a --prompt-len prompt, then
 *    steps of one token per sequence for about --decode-s seconds, in rounds of about 0.5 s
 *    each followed by two bandwidth passes on the same threads. Reports tokens per second
 *    (all sequences), the weight bytes read per step (st_model_get_stats: every matrix
 *    once, the LM head whole, one embedding row) per second, and per round that as a
 *    fraction of the round's bandwidth (the better of its two passes): the median round
 *    ("of floor") and the best. The floor is bandwidth / bytes per step steps per second.
 * Weights are touched once before timing (a warm-up decode step), so page faults of the
 * mapping are not counted. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/bench_prefix.h"
#include "dist/comm.h"
#include "apps/bench_vision.h"
#include "apps/bench_grammar.h"
#include "apps/cli.h"
#include "core/mem.h"
#include "core/threadpool.h"
#include "engine/batch.h"
#include "model/forward.h"
#include "model/synth.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --op-times: where a prefill's (what = "prefill", n its tokens) or a decode step's (what =
 * "decode", n its batch; the times of `steps` steps summed) device time went (stderr) */
static void print_op_times(st_fwd *f, const char *what, long long n, int steps, double wall_s) {
    st_cuda_op_times ot;
    st_bctx_cuda_op_times(st_fwd_ctx(f), &ot);
    double all = 0;
    for (int k = 0; k < ot.n; k++) all += ot.ms[k] / steps;
    if (!strcmp(what, "prefill"))
        fprintf(stderr, "device time of the %lld-token prefill by operation (%.1f ms timed of %.1f ms wall):\n", n, all,
                wall_s * 1e3);
    else
        fprintf(stderr, "device time of a decode step at batch %lld by operation, without graphs (%.2f ms timed of %.2f "
                        "ms wall, the mean of %d steps):\n",
                n, all, wall_s * 1e3 / steps, steps);
    for (int k = 0; k < ot.n; k++) ot.ms[k] /= steps, ot.calls[k] /= steps;
    for (int k = 0; k < ot.n; k++)
        if (ot.calls[k])
            fprintf(stderr, "  %-54s %9.2f ms %5.1f%%  %6lld calls\n", ot.name[k], ot.ms[k],
                    all > 0 ? 100.0 * ot.ms[k] / all : 0.0, (long long)ot.calls[k]);
    if (ot.untimed) fprintf(stderr, "  (%lld ops past the events' capacity, untimed)\n", (long long)ot.untimed);
}

/* one decode step of the B sequences, their tokens a function of the step's number k */
static st_status decode_step(st_cache *cache, st_fwd *f, st_seq *seqs, int B, int k, int64_t vocab, int32_t *next,
                             st_batch_item *items, float *logits, st_error *err) {
    for (int s = 0; s < B; s++) {
        next[s] = (int32_t)((k * 7919LL + s * 104729LL) % vocab);
        items[s] = (st_batch_item){&seqs[s], &next[s], 1, ST_LOGITS_LAST_TOP}; /* what a sampler needs */
    }
    return st_batch_run(cache, f, items, B, logits, err);
}

static void usage(void) {
    fprintf(stderr,
            "usage: strand bench (-m DIR | --synth PRESET [--dtype bf16|q8|q4]) [--json]\n"
            "                    [-t THREADS] [-k ref|avx2|avx512|amx] [--device cpu|cuda]\n"
            "                    [--prompts 512,2048] [--batches 1,4,16] [--prompt-len 128]\n"
            "                    [--decode-s SECONDS] [--kv-dtype f32|bf16] [--op-times]\n"
            "       strand bench --grammar (-m DIR | --tokenizer FILE) [--vocab 248320]\n"
            "       strand bench (-m DIR | --synth PRESET) --prefix [--prefix-turns 4]\n"
            "                    [--prefix-chat 1024,128,128] [--prefix-long A,B] [--prefix-every BLOCKS]\n"
            "       strand bench -m DIR --image 1024x768[,WxH...] [-t THREADS] [--decode-s SECONDS]\n"
            "  Measures memory read bandwidth, prefill tokens/s per prompt length, and decode\n"
            "  tokens/s per batch size with the weight bytes read per second as a fraction of\n"
            "  the bandwidth (the decode floor). --synth makes a preset's weights (e.g. 27b)\n"
            "  directly in device memory (GPU only): real shapes with no checkpoint. --op-times\n"
            "  (GPU): each prefill's and decode step's device time by kind of operation (those\n"
            "  steps run without graphs; decode's are 4 extra steps after each batch's rounds).\n"
            "  --grammar: JSON output's cost: each step's token-mask and apply times (p50, p99) for\n"
            "  JSON-object replies and a nested schema over a --vocab-id vocabulary, and with -m\n"
            "  DIR batch-1 decode tok/s free and as a JSON object.\n"
            "  --prefix: time to first token of a chat's turns (system, user-turn and reply token\n"
            "  counts from --prefix-chat) with and without the prefix cache; --prefix-long A,B: an\n"
            "  A-token prompt then its extension to B tokens (cached against cold), and the\n"
            "  inter-token latency of a stream decoding while the A tokens prefill.\n"
            "  --image: images/s of a random image of each size through preprocessing and the\n"
            "  checkpoint's vision tower (CPU), repeated for about --decode-s seconds.\n");
}

/* ---------------------------------------------------------------------------------------- */
/* memory bandwidth */

typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    atomic_size_t next; /* the next chunk to read: threads take chunks until none is left,
                           so a slower core reads less and the pass measures the machine */
    uint64_t sink[64]; /* per thread result, so the reads are not optimised away */
    int avx2, avx512;
} bw_job;

#if defined(__x86_64__)
/* the fastest plain read found here: wide loads with a software prefetch 4 KiB ahead (the
 * hardware prefetchers stop at page boundaries; measured 15-20% above loads alone), so the
 * floor is what a kernel can reach, not what a naive loop does */
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        __builtin_prefetch(p + i + 4096, 0, 3);
        __builtin_prefetch(p + i + 4096 + 64, 0, 3);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}

__attribute__((target("avx2,avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        __builtin_prefetch(p + i + 4096, 0, 3);
        __builtin_prefetch(p + i + 4096 + 64, 0, 3);
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
    }
    a0 = _mm512_xor_si512(a0, a1);
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}
#endif

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= n / 8; i += 8)
        for (int j = 0; j < 8; j++) a[j] ^= q[i + j];
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

#define BW_CHUNK ((size_t)1 << 20)

static void bw_fn(void *ctx, int tid, int n) {
    (void)n;
    bw_job *j = ctx;
    uint64_t acc = 0;
    for (;;) {
        const size_t lo = atomic_fetch_add(&j->next, BW_CHUNK);
        if (lo >= j->bytes) break;
        const size_t len = j->bytes - lo < BW_CHUNK ? j->bytes - lo : BW_CHUNK;
#if defined(__x86_64__)
        if (j->avx512) acc ^= read_avx512(j->buf + lo, len);
        else if (j->avx2) acc ^= read_avx2(j->buf + lo, len);
        else acc ^= read_scalar(j->buf + lo, len);
#else
        acc ^= read_scalar(j->buf + lo, len);
#endif
    }
    j->sink[tid % 64] ^= acc;
}

static void fill_fn(void *ctx, int tid, int n) {
    bw_job *j = ctx;
    int64_t lo, hi;
    st_split_range((int64_t)j->bytes, n, tid, 4096, &lo, &hi);
    memset((uint8_t *)j->buf + lo, tid + 1, (size_t)(hi - lo));
}

/* A bandwidth probe: a buffer 4x the largest last-level cache seen so far, read by every
 * thread of a pool. Kept alive through the decode measurements so that each round of
 * decode steps gets its own bandwidth sample (this machine's neighbours change it). */
typedef struct bw_probe {
    st_pool *pool; /* borrowed: the forward context's, so no other threads compete */
    bw_job job;
    uint8_t *buf; /* owned, j.bytes */
} bw_probe;

static int bw_probe_create(st_pool *pool, bw_probe *p, st_error *err) {
    memset(p, 0, sizeof *p);
    p->job.bytes = (size_t)512 << 20;
    p->job.avx2 = st_cpu_get_features()->avx2;
    p->job.avx512 = st_cpu_get_features()->avx512f;
    /* huge pages where the kernel gives them, as the packed weights get */
    if (!(p->buf = st_big_alloc_huge(p->job.bytes))) {
        st_error_set(err, ST_ERR_NOMEM, "out of memory for the bandwidth buffer");
        return -1;
    }
    p->job.buf = p->buf;
    p->pool = pool;
    st_pool_run(p->pool, fill_fn, &p->job); /* fault the pages in, on the threads that read them */
    return 0;
}

static void bw_probe_destroy(bw_probe *p) {
    st_big_free(p->buf, p->job.bytes);
    memset(p, 0, sizeof *p);
}

/* GB/s (1e9 bytes): the best of `passes` reads of the whole buffer */
static double bw_probe_measure(bw_probe *p, int passes) {
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        atomic_store(&p->job.next, 0);
        double t0 = now_s();
        st_pool_run(p->pool, bw_fn, &p->job);
        double t = now_s() - t0;
        if ((double)p->job.bytes / t / 1e9 > best) best = (double)p->job.bytes / t / 1e9;
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------------------------------- */

static int parse_list(const char *s, long long *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1) return -1;
        out[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

typedef struct decode_res {
    long long batch;
    double tok_s, step_s, gb_s; /* over all rounds */
    double frac;                /* median over rounds of weight GB/s / the round's bandwidth */
    double frac_best;           /* the best round's */
    double comm_ms;             /* a tensor-parallel job: rank 0's all-reduce and gather time per step */
    int steps, rounds;
} decode_res;

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *kname = NULL, *synth = NULL, *dtype = "bf16";
    int json = 0;
    long long threads = 0, plen = 128;
    long long prompts[8] = {512, 2048}, batches[8] = {1, 4, 16};
    int n_prompts = 2, n_batches = 3, lists_given = 0;
    double decode_s = 2.0;
    int prefix = 0, grammar = 0, op_times = 0;
    st_kv_dtype kvd = ST_KV_F32;
    const char *gram_tok = NULL;
    long long gram_vocab = 0;
    long long images[8][2];
    int n_images = 0;
    bench_prefix_opts po = {.turns = 4, .system_tokens = 1024, .turn_tokens = 128, .reply_tokens = 128};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--synth")) {
            if (!(synth = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--dtype")) {
            if (!(dtype = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, ST_POOL_MAX_THREADS, &threads)) return 2;
        } else if (!strcmp(a, "-k") || !strcmp(a, "--kernels")) {
            if (!(kname = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--prompts") || !strcmp(a, "--batches")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            int is_p = !strcmp(a, "--prompts");
            int n = parse_list(v, is_p ? prompts : batches, 8);
            if (n < 0) return cli_failf("%s: expected a comma-separated list of positive numbers", a);
            if (is_p) n_prompts = n;
            else n_batches = n;
            lists_given |= is_p ? 1 : 2;
        } else if (!strcmp(a, "--prompt-len")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 16, &plen)) return 2;
        } else if (!strcmp(a, "--prefix")) {
            prefix = 1;
        } else if (!strcmp(a, "--op-times")) {
            op_times = 1;
        } else if (!strcmp(a, "--kv-dtype")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_kv_dtype(v, &kvd) != 0) return 2;
        } else if (!strcmp(a, "--grammar")) {
            grammar = 1;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(gram_tok = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--vocab")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 24, &gram_vocab)) return 2;
        } else if (!strcmp(a, "--prefix-turns") || !strcmp(a, "--prefix-every")) {
            const char *v = cli_value(argc, argv, &i);
            long long x;
            if (!v || cli_parse_int(a, v, !strcmp(a, "--prefix-turns") ? 0 : 1, 1000, &x)) return 2;
            if (!strcmp(a, "--prefix-turns")) po.turns = (int)x;
            else po.snapshot_every = (int)x;
        } else if (!strcmp(a, "--prefix-chat")) { /* SYSTEM,TURN,REPLY token counts */
            long long t3[3];
            const char *v = cli_value(argc, argv, &i);
            if (!v || parse_list(v, t3, 3) != 3) return cli_failf("--prefix-chat: expected SYSTEM,TURN,REPLY token counts");
            po.system_tokens = t3[0], po.turn_tokens = t3[1], po.reply_tokens = t3[2];
        } else if (!strcmp(a, "--prefix-long")) { /* A,B */
            long long t2[2];
            const char *v = cli_value(argc, argv, &i);
            if (!v || parse_list(v, t2, 2) != 2 || t2[1] <= t2[0])
                return cli_failf("--prefix-long: expected A,B token counts with B > A");
            po.long_first = t2[0], po.long_second = t2[1];
        } else if (!strcmp(a, "--decode-s")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_float(a, v, &decode_s)) return 2;
        } else if (!strcmp(a, "--image")) { /* WxH[,WxH...] */
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            for (const char *q = v; *q;) {
                long long w = 0, h = 0;
                int used = 0;
                if (n_images == 8 || sscanf(q, "%lldx%lld%n", &w, &h, &used) != 2 || w < 1 || h < 1 || w > 16384 ||
                    h > 16384 || (q[used] && q[used] != ','))
                    return cli_failf("--image: expected up to 8 sizes WIDTHxHEIGHT, comma-separated (1024x768)");
                images[n_images][0] = w, images[n_images][1] = h, n_images++;
                q += used + (q[used] == ',');
            }
        } else {
            usage();
            return cli_failf("bench: unknown option '%s'", a);
        }
    }
    if (grammar) { /* the cost of JSON output instead of the speed table */
        if (cli_world() > 1) return cli_failf("bench --grammar does not run under mpirun");
        st_error gerr = {0};
        return bench_grammar(dir, gram_tok, gram_vocab, json, &gerr) == 0 ? 0 : cli_fail(&gerr);
    }
    if (!dir == !synth) {
        usage();
        return cli_failf("bench: give a checkpoint (-m DIR) or a preset to synthesize (--synth 27b)");
    }
    if ((n_images || prefix) && cli_world() > 1)
        return cli_failf("bench: --image and the prefix scenarios do not run under mpirun; the speed table does");
    if (n_images) { /* the image path instead of the speed table */
        if (!dir) return cli_failf("bench --image: give a checkpoint with a vision tower (-m DIR)");
        st_error verr = {0};
        const st_device_params vdp = cli_device_params();
        return bench_vision(dir, (const long long(*)[2])images, n_images, (int)threads,
                            kname ? st_kernels_by_name(kname) : NULL, decode_s, json, &vdp, &verr) == 0
                   ? 0
                   : cli_fail(&verr);
    }
    int synth_bits = 0;
    if (!strcmp(dtype, "q8")) synth_bits = 8;
    else if (!strcmp(dtype, "q4")) synth_bits = 4;
    else if (strcmp(dtype, "bf16") != 0) return cli_failf("bench: --dtype '%s' (bf16, q8 or q4)", dtype);
    const st_kernels *k = NULL;
    if (kname && !(k = st_kernels_by_name(kname)))
        return cli_failf("bench: kernel set '%s' is not available on this CPU", kname);
    st_error err = {0};
    st_model *m = NULL;
    st_cache *cache = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    bw_probe probe = {0};
    int rc = 1;
    char label[128];
    if (synth) { /* real shapes, weights made in device memory: no checkpoint, no disk */
        st_config sc;
        if (st_synth_preset_config(synth, &sc, &err) != ST_OK ||
            st_model_synthetic(&sc, synth_bits, 64, 1, &m, &err) != ST_OK)
            return cli_fail(&err);
        snprintf(label, sizeof label, "synthetic %s, %s (weights made on the device)", synth, dtype);
        dir = label;
    } else if (st_model_load(dir, &m, &err) != ST_OK) {
        return cli_fail(&err);
    }
    if (prefix) { /* the prefix-cache scenarios instead of the speed table */
        st_device_params pdp = cli_device_params();
        if (threads) pdp.cpu.n_threads = (int)threads;
        if (k) pdp.cpu.kernels = k;
        if (!json) fprintf(stderr, "model      %s\n", dir);
        rc = bench_prefix(m, &pdp, &po, json, &err) == 0 ? 0 : 1;
        goto done;
    }
    {   /* on a GPU the defaults reach further: 8192-token prompts, batch 64 */
        st_device_params probe_dp = cli_device_params();
        if (probe_dp.kind == ST_DEVICE_CUDA || (probe_dp.kind == ST_DEVICE_AUTO && st_cuda_available(NULL, NULL, 0))) {
            if (!(lists_given & 1)) prompts[n_prompts++] = 8192;
            if (!(lists_given & 2)) batches[n_batches++] = 64;
        }
    }
    const st_config *c = &m->cfg;
    st_model_stats ms;
    st_model_get_stats(m, sizeof(float), &ms);
    long long max_prompt = 0, max_batch = 0;
    for (int i = 0; i < n_prompts; i++) max_prompt = prompts[i] > max_prompt ? prompts[i] : max_prompt;
    for (int i = 0; i < n_batches; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    int64_t decode_steps_max = 4096;
    st_cache_params cp = st_cache_default_params();
    cp.kv_dtype = kvd;
    cp.n_slots = (int)max_batch;
    int max_tokens = (int)(max_prompt > plen * max_batch ? max_prompt : plen * max_batch);
    st_device_params dp = cli_device_params();
    if (threads) dp.cpu.n_threads = (int)threads;
    if (k) dp.cpu.kernels = k;
    if (st_backend_create(m, &dp, &be, &err) != ST_OK) goto done;
    if (cli_rank() != 0) cli_follow(be); /* rank 0 measures; the others follow */
    const int gpu = st_backend_is_cuda(be);
    char dev[512];
    st_backend_describe(be, dev, sizeof dev);
    /* the prompts run one at a time; the decode sequences together, each with room for
     * decode_steps_max steps: where that does not fit beside the weights on the device (64
     * sequences of the 27B shape on an 80 GB GPU), half as many, down to 256 */
    for (;;) {
        const int64_t bs = cp.block_size;
        cp.max_seq_len = (max_prompt > plen + decode_steps_max ? max_prompt : plen + decode_steps_max) + 8;
        cp.n_blocks = (max_prompt + 8 + bs - 1) / bs + max_batch * ((plen + decode_steps_max + 8 + bs - 1) / bs);
        if (st_cache_create(m, &cp, &cache, &err) != ST_OK) goto done;
        st_ctx_params xp = st_cache_ctx_params(cache, max_tokens);
        if (st_fwd_create(be, &xp, &f, &err) == ST_OK) break;
        if (!gpu || err.status != ST_ERR_NOMEM || decode_steps_max <= 256) goto done;
        st_cache_destroy(cache);
        cache = NULL;
        decode_steps_max /= 2;
        if (!json)
            fprintf(stderr, "%s; trying room for %lld decode steps a sequence\n", err.msg, (long long)decode_steps_max);
    }
    logits = st_fwd_host_alloc(f, (size_t)max_batch * (size_t)c->vocab_size * sizeof(float)); /* page-locked on a GPU */
    toks = malloc((size_t)max_tokens * sizeof(int32_t));
    if (!logits || !toks) {
        st_error_set(&err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < max_tokens; i++) toks[i] = (int32_t)((1000003LL * i + 17) % c->vocab_size);
    const int nth = gpu ? 0 : st_backend_cpu_threads(be);
    double bw, read_bw = 0;
    if (gpu) { /* the device's copy bandwidth, once: a GPU is not shared with neighbours */
        if (!json) fprintf(stderr, "measuring the device's copy bandwidth...\n");
        bw = st_backend_cuda_copy_bandwidth(be, (size_t)2 << 30, &read_bw);
    } else {
        if (bw_probe_create(st_bctx_cpu_pool(st_fwd_ctx(f)), &probe, &err)) goto done;
        if (!json) fprintf(stderr, "measuring memory bandwidth (%d threads)...\n", nth);
        bw = bw_probe_measure(&probe, 5);
    }

    /* warm-up: one decode step reads every weight once (faults the mapping in) */
    st_seq seqs[64];
    for (int i = 0; i < 64; i++) seqs[i].slot = -1;
    {
        if (st_cache_seq_start(cache, &seqs[0], &err) != ST_OK) goto done;
        st_batch_item it = {&seqs[0], toks, 1, ST_LOGITS_LAST};
        for (int r = 0; r < 2; r++)
            if (st_batch_run(cache, f, &it, 1, logits, &err) != ST_OK) goto done;
        st_cache_seq_release(cache, &seqs[0]);
    }

    double pre_tok_s[8] = {0}, pre_s[8] = {0}, pre_first_tok_s[8] = {0};
    if (op_times && st_bctx_cuda_time_ops(st_fwd_ctx(f), 1) != 0) {
        st_error_set(&err, ST_ERR_UNSUPPORTED, "--op-times: the device's op times cannot be taken (a GPU only)");
        goto done;
    }
    for (int i = 0; i < n_prompts; i++) {
        if (!json) fprintf(stderr, "prefill %lld tokens...\n", prompts[i]);
        for (int run = gpu ? 0 : 1; run < 2; run++) { /* run 0: the GPU's first (see the top) */
            if (st_cache_seq_start(cache, &seqs[0], &err) != ST_OK) goto done;
            st_batch_item it = {&seqs[0], toks, (int)prompts[i], ST_LOGITS_LAST};
            double t0 = now_s();
            if (st_batch_run(cache, f, &it, 1, logits, &err) != ST_OK) goto done;
            const double dt = now_s() - t0;
            st_cache_seq_release(cache, &seqs[0]);
            if (run == 0) {
                pre_first_tok_s[i] = (double)prompts[i] / dt;
                if (op_times) { /* the op times are the timed run's */
                    st_cuda_op_times skip;
                    st_bctx_cuda_op_times(st_fwd_ctx(f), &skip);
                }
            } else pre_s[i] = dt, pre_tok_s[i] = (double)prompts[i] / dt;
        }
        if (op_times) print_op_times(f, "prefill", prompts[i], 1, pre_s[i]);
    }
    if (op_times) st_bctx_cuda_time_ops(st_fwd_ctx(f), 0); /* decode is timed with its graphs */

    decode_res dr[8];
    memset(dr, 0, sizeof dr);
    for (int bi = 0; bi < n_batches; bi++) {
        const int B = (int)batches[bi];
        if (B > 64) {
            st_error_set(&err, ST_ERR_ARG, "batch %d exceeds 64", B);
            goto done;
        }
        if (!json) fprintf(stderr, "decode at batch %d...\n", B);
        st_batch_item items[64];
        int32_t next[64];
        for (int s = 0; s < B; s++) {
            if (st_cache_seq_start(cache, &seqs[s], &err) != ST_OK) goto done;
            items[s] = (st_batch_item){&seqs[s], toks + s * plen, (int)plen, ST_LOGITS_LAST};
        }
        if (st_batch_run(cache, f, items, B, logits, &err) != ST_OK) goto done;
        /* rounds of about half a second, each after its own bandwidth sample */
        int n_rounds = (int)(decode_s / 0.5);
        n_rounds = n_rounds < 3 ? 3 : n_rounds > 64 ? 64 : n_rounds;
        double fr[64];
        int steps = 0;
        double t = 0;
        const double comm0 = be->comm ? be->comm->allreduce_s + be->comm->gather_s : 0;
        double comm_probe = 0; /* none during the bandwidth samples, but counted apart anyway */
        for (int rd = 0; rd < n_rounds; rd++) {
            int steps_r = 0;
            double t0 = now_s(), t_r = 0;
            while (steps < decode_steps_max && (steps_r < 1 || t_r < decode_s / n_rounds)) {
                if (decode_step(cache, f, seqs, B, steps, c->vocab_size, next, items, logits, &err) != ST_OK) goto done;
                steps++;
                steps_r++;
                t_r = now_s() - t0;
            }
            t += t_r;
            /* the round's bandwidth: the better of two passes right after it (CPU) */
            const double cp0 = be->comm ? be->comm->allreduce_s + be->comm->gather_s : 0;
            const double bw_r = gpu ? bw : bw_probe_measure(&probe, 2);
            if (be->comm) comm_probe += be->comm->allreduce_s + be->comm->gather_s - cp0;
            bw = bw_r > bw ? bw_r : bw;
            fr[rd] = (double)ms.bytes_per_token * steps_r / t_r / 1e9 / bw_r;
        }
        if (op_times && steps + 4 <= decode_steps_max) { /* 4 more steps, timed op by op (no graphs) */
            st_bctx_cuda_time_ops(st_fwd_ctx(f), 1); /* the sums are clear: read after each timed run */
            const double t0 = now_s();
            for (int j = 0; j < 4; j++)
                if (decode_step(cache, f, seqs, B, j, c->vocab_size, next, items, logits, &err) != ST_OK) goto done;
            print_op_times(f, "decode", B, 4, now_s() - t0);
            st_bctx_cuda_time_ops(st_fwd_ctx(f), 0);
        }
        for (int s = 0; s < B; s++) st_cache_seq_release(cache, &seqs[s]);
        qsort(fr, (size_t)n_rounds, sizeof fr[0], cmp_double);
        dr[bi].batch = B;
        dr[bi].steps = steps;
        dr[bi].rounds = n_rounds;
        dr[bi].step_s = t / steps;
        dr[bi].tok_s = (double)B * steps / t;
        dr[bi].gb_s = (double)ms.bytes_per_token * steps / t / 1e9;
        dr[bi].frac = n_rounds % 2 ? fr[n_rounds / 2] : 0.5 * (fr[n_rounds / 2 - 1] + fr[n_rounds / 2]);
        dr[bi].frac_best = fr[n_rounds - 1];
        dr[bi].comm_ms = be->comm ? (be->comm->allreduce_s + be->comm->gather_s - comm0 - comm_probe) / steps * 1e3 : 0;
    }
    const int ranks = be->comm ? be->comm->world : 1;

    double b1_tok_s = 0;
    for (int i = 0; i < n_batches; i++)
        if (dr[i].batch == 1) b1_tok_s = dr[i].tok_s;
    const double floor_tok_s = bw > 0 ? bw * 1e9 / (double)ms.bytes_per_token : 0;
    const double read_floor_tok_s = read_bw > 0 ? read_bw * 1e9 / (double)ms.bytes_per_token : 0;
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"ranks\": %d, "
               "\"bandwidth_gb_s\": %.3f, \"read_bandwidth_gb_s\": %.3f, \"weight_bytes_per_step\": %zu, "
               "\"decode_floor_steps_s\": %.3f, \"decode_read_floor_steps_s\": %.3f, \"prefill\": [",
               dir, gpu ? "cuda" : "cpu", gpu ? "cuda" : st_backend_cpu_kernels(be)->name, nth, ranks, bw, read_bw,
               ms.bytes_per_token, floor_tok_s, read_floor_tok_s);
        for (int i = 0; i < n_prompts; i++) {
            printf("%s{\"tokens\": %lld, \"seconds\": %.4f, \"tok_s\": %.3f", i ? ", " : "", prompts[i], pre_s[i],
                   pre_tok_s[i]);
            if (gpu) printf(", \"first_tok_s\": %.3f", pre_first_tok_s[i]); /* a CPU has no untimed first run */
            printf("}");
        }
        printf("], \"decode\": [");
        for (int i = 0; i < n_batches; i++)
            printf("%s{\"batch\": %lld, \"prompt\": %lld, \"steps\": %d, \"step_ms\": %.3f, "
                   "\"tok_s\": %.3f, \"speedup_vs_batch1\": %.3f, \"weight_gb_s\": %.3f, "
                   "\"fraction_of_bandwidth\": %.4f, \"fraction_best_round\": %.4f, "
                   "\"rounds\": %d, \"collectives_ms_per_step\": %.4f}",
                   i ? ", " : "", dr[i].batch, plen, dr[i].steps, dr[i].step_s * 1e3,
                   dr[i].tok_s, b1_tok_s > 0 ? dr[i].tok_s / b1_tok_s : 0, dr[i].gb_s,
                   dr[i].frac, dr[i].frac_best, dr[i].rounds, dr[i].comm_ms);
        printf("]}\n");
    } else {
        printf("model      %s\n", dir);
        printf("device     %s\n", dev);
        printf("kv cache   %s\n", kvd == ST_KV_BF16 ? "bf16" : "f32");
        if (ranks > 1)
            printf("ranks      %d (tensor parallel over MPI; this rank's %d threads; every rank reads its shard)\n",
                   ranks, nth);
        if (gpu) printf("bandwidth  %.2f GB/s (device copy: bytes read + written); reads alone %.2f GB/s\n", bw, read_bw);
        else printf("bandwidth  %.2f GB/s (memory read, %d threads)\n", bw, nth);
        printf("weights    %.3f GB read per decode step -> floor %.2f steps/s", (double)ms.bytes_per_token / 1e9,
               floor_tok_s);
        if (read_floor_tok_s > 0) printf(" (at the rate of reads alone %.2f)", read_floor_tok_s);
        printf("\n");
        printf("\n%-10s %8s %10s%s\n", "prefill", "tokens", "tok/s", gpu ? "      first" : "");
        for (int i = 0; i < n_prompts; i++) {
            printf("%-10s %8lld %10.1f", "", prompts[i], pre_tok_s[i]);
            if (gpu) printf(" %10.1f", pre_first_tok_s[i]);
            printf("\n");
        }
        printf("\n%-10s %6s %9s %10s %7s %11s %10s %10s\n", "decode", "batch", "step ms", "tok/s",
               "x b1", "weight GB/s", "of floor", "best");
        for (int i = 0; i < n_batches; i++) {
            printf("%-10s %6lld %9.2f %10.2f ", "", dr[i].batch, dr[i].step_s * 1e3, dr[i].tok_s);
            if (b1_tok_s > 0) printf("%6.2fx ", dr[i].tok_s / b1_tok_s);
            else printf("%7s ", "-");
            printf("%11.2f %9.1f%% %9.1f%%", dr[i].gb_s, 100 * dr[i].frac, 100 * dr[i].frac_best);
            if (ranks > 1) printf("  collectives %.3f ms/step", dr[i].comm_ms);
            printf("\n");
        }
        printf("(decode after a %lld-token prompt per sequence, in rounds of about 0.5 s, each\n"
               " followed by a bandwidth sample; 'of floor' = weight bytes read per second / that\n"
               " bandwidth, the median round; 'best' the best round; 'x b1' = tok/s / batch 1's)\n",
               plen);
    }
    rc = 0;
done:
    if (rc) cli_fail(&err);
    if (f) st_fwd_host_free(f, logits);
    free(toks);
    bw_probe_destroy(&probe);
    st_fwd_destroy(f);
    st_cache_destroy(cache);
    st_backend_destroy(be);
    st_model_free(m);
    return rc;
}
