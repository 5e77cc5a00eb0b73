/* ==== strand synth: write a checkpoint with random weights ====
 * strand synth (--preset NAME | --config FILE) [--dtype bf16|q2..q8] [--group N] [--mixed]
 *              [--seed N] [--tokenizer DIR] [--shard-mb N] -o DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "model/synth.h"

static void usage(void) {
    fprintf(stderr,
            "usage: strand synth (--preset NAME | --config FILE) [--dtype bf16|q8|q6|q5|q4|q3|q2]\n"
            "                    [--group 32|64|128] [--mixed] [--vision|--vision-full] [--seed N] [--tokenizer DIR]\n"
            "                    [--shard-mb N] -o DIR\n"
            "  presets:");
    for (const char *const *p = st_synth_presets(); *p; p++) fprintf(stderr, " %s", *p);
    fprintf(stderr,
            "\n  bf16 writes the Hugging Face layout; qN the MLX layout with N-bit affine weights.\n"
            "  --mixed (MLX): first/last layers' v_proj and down_proj and the LM head at 8 bits.\n"
            "  --script IDS: a test model that emits fixed text: after id[i] it predicts id[i+1]\n"
            "  (segments separated by ';', each ending in eos; all ids distinct).\n"
            "  --vision: add a small vision tower (bf16), its image token ids and preprocessor config;\n"
            "  --vision-full: Qwen3.5's vision tower shape (depth 27, hidden 1152), for benchmarks.\n"
            "  --poison-token ID: a broken test model: token ID's embedding is NaN, so any\n"
            "  sequence containing it gets non-finite logits.\n");
}

int cmd_synth(int argc, char **argv) {
    st_synth_params p = st_synth_default_params();
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--preset")) {
            if (!(p.preset = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--config")) {
            if (!(p.config_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "bf16")) p.bits = 0;
            else if (v[0] == 'q' && strlen(v) == 2 && v[1] >= '2' && v[1] <= '8' && v[1] != '7') p.bits = v[1] - '0';
            else return cli_failf("--dtype: expected bf16, q2, q3, q4, q5, q6 or q8, got '%s'", v);
        } else if (!strcmp(a, "--group")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &x)) return 2;
            if (x != 32 && x != 64 && x != 128)
                return cli_failf("--group: MLX groups are 32, 64 or 128 columns, got %lld", x);
            p.group_size = (int)x;
        } else if (!strcmp(a, "--poison-token")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, INT32_MAX, &x)) return 2;
            p.poison_token = (int32_t)x;
        } else if (!strcmp(a, "--mixed")) {
            p.mixed = 1;
        } else if (!strcmp(a, "--vision")) {
            p.vision = 1;
        } else if (!strcmp(a, "--vision-full")) {
            p.vision = 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, INT64_MAX, &x)) return 2;
            p.seed = (uint64_t)x;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(p.tokenizer_dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--shard-mb")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 30, &x)) return 2;
            p.shard_bytes = x << 20;
        } else if (!strcmp(a, "--script")) {
            /* comma-separated ids; ';' starts a new segment */
            if (!(v = cli_value(argc, argv, &i))) return 2;
            static int32_t ids[4096];
            int n = 0;
            for (const char *q = v; *q && n < 4096;) {
                if (*q == ';') {
                    ids[n++] = -1;
                    q++;
                    continue;
                }
                if (*q == ',' || *q == ' ') {
                    q++;
                    continue;
                }
                char *end;
                long long id = strtoll(q, &end, 10);
                if (end == q || id < 0 || id > INT32_MAX) return cli_failf("--script: bad token id near '%.20s'", q);
                ids[n++] = (int32_t)id;
                q = end;
            }
            p.script = ids;
            p.n_script = n;
        } else if (!strcmp(a, "-o")) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else {
            usage();
            return cli_failf("synth: unknown option '%s'", a);
        }
    }
    if (!out || (!p.preset == !p.config_path)) {
        usage();
        return cli_failf("synth: -o and exactly one of --preset / --config are required");
    }
    if (p.mixed && !p.bits) return cli_failf("synth: --mixed needs a quantized --dtype");
    if (p.group_size && !p.bits) return cli_failf("synth: --group needs a quantized --dtype");
    if (!strcmp(out, "-")) return cli_failf("synth: -o names a directory; '-' (standard output) cannot hold a checkpoint");
    st_error err = {0};
    if (st_synth_write(&p, out, &err) != ST_OK) return cli_fail(&err);
    return 0;
}
