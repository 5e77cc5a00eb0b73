/* ==== strand quantize: a Hugging Face checkpoint as an MLX affine one ====
 * strand quantize -m HF_DIR --bits 2|3|4|5|6|8 [--group 32|64|128] [--mixed [--high-bits N]]
 *                 [--method auto|mse|minmax|mlx] [--shard-mb N] [--threads N] -o OUT
 * See model/quantize.h for what is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/cli.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "model/quantize.h"

static void usage(void) {
    fprintf(stderr,
            "usage: strand quantize -m HF_DIR --bits 2|3|4|5|6|8 [--group 32|64|128] [--mixed]\n"
            "                       [--high-bits N] [--method auto|mse|minmax|mlx] [--shard-mb N]\n"
            "                       [--threads N] -o OUT\n"
            "  Writes the MLX affine checkpoint mlx-lm's converter makes of a Hugging Face one\n"
            "  (bf16/f16/f32; dense or MoE; CausalLM or ConditionalGeneration, text only).\n"
            "  --group: columns per scale and bias (default 64). --mixed: v_proj and down_proj of\n"
            "  the first and last eighth of the layers and every third between, and the LM head,\n"
            "  at --high-bits (default 6, or 8 from 6 bits). --method: how each group's scale and\n"
            "  bias are chosen: mse (the least squared error, never worse than the others for a\n"
            "  group), minmax (scale (max-min)/(2^b-1), bias min), mlx (MLX's own rule), auto\n"
            "  (the default: minmax at 8 bits, mse below).\n");
}

typedef struct progress {
    int tty;
    double t0, last;
} progress;

static void on_progress(void *user, size_t done, size_t total, const char *tensor) {
    progress *pr = user;
    double t = st_now_s();
    if (!pr->tty || (t - pr->last < 0.1 && done < total)) return;
    pr->last = t;
    int width = 30, fillw = total ? (int)((double)width * (double)done / (double)total) : width;
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fillw ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r[%s] %3.0f%% %7.1f MB  %-60.60s", bar, total ? 100.0 * (double)done / (double)total : 100.0,
            (double)done / 1e6, tensor);
    if (done >= total) fputc('\n', stderr);
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    st_quantize_params p = st_quantize_default_params();
    p.n_threads = st_threads_parse(getenv("STRAND_THREADS")); /* 0: the online CPUs */
    int bits_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(in = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-o")) {
            if (!(out = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--bits")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 2, 8, &x)) return 2;
            if (x == 7) return cli_failf("--bits: 7 is not an MLX affine width (2, 3, 4, 5, 6, 8)");
            p.bits = (int)x;
            bits_given = 1;
        } else if (!strcmp(a, "--high-bits")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 2, 8, &x)) return 2;
            if (x == 7) return cli_failf("--high-bits: 7 is not an MLX affine width (2, 3, 4, 5, 6, 8)");
            p.high_bits = (int)x;
        } else if (!strcmp(a, "--group")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &x)) return 2;
            if (x != 32 && x != 64 && x != 128) return cli_failf("--group: MLX groups are 32, 64 or 128 columns, got %lld", x);
            p.group_size = (int)x;
        } else if (!strcmp(a, "--mixed")) {
            p.mixed = 1;
        } else if (!strcmp(a, "--method")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "auto")) p.method = ST_QUANT_AUTO;
            else if (!strcmp(v, "mse")) p.method = ST_QUANT_MSE;
            else if (!strcmp(v, "minmax")) p.method = ST_QUANT_MINMAX;
            else if (!strcmp(v, "mlx")) p.method = ST_QUANT_MLX;
            else return cli_failf("--method: expected auto, mse, minmax or mlx, got '%s'", v);
        } else if (!strcmp(a, "--shard-mb")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 30, &x)) return 2;
            p.shard_bytes = x << 20;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 256, &x)) return 2;
            p.n_threads = (int)x;
        } else {
            usage();
            return cli_failf("quantize: unknown option '%s'", a);
        }
    }
    if (!in || !out || !bits_given) {
        usage();
        return cli_failf("quantize: -m HF_DIR, --bits and -o OUT are required");
    }
    if (p.high_bits && !p.mixed) return cli_failf("quantize: --high-bits needs --mixed");
    if (!strcmp(out, "-")) return cli_failf("quantize: -o names a directory; '-' (standard output) cannot hold a checkpoint");
    progress pr = {isatty(STDERR_FILENO), st_now_s(), 0};
    p.progress = on_progress;
    p.user = &pr;
    st_quantize_stats s;
    st_error err = {0};
    if (st_quantize_checkpoint(in, out, &p, &s, &err) != ST_OK) return cli_fail(&err);
    double secs = st_now_s() - pr.t0;
    fprintf(stderr,
            "strand: %s: %d matrices at %d bits (group %d%s), %d tensors kept; %.1f MB -> %.1f MB in %d shard%s, "
            "relative RMS error %.4f, %.1f s (%.0f MB/s)\n",
            out, s.quantized, p.bits, p.group_size, p.mixed ? ", mixed" : "", s.kept, (double)s.in_bytes / 1e6,
            (double)s.out_bytes / 1e6, s.shards, s.shards == 1 ? "" : "s", s.rel_rms_error, secs,
            secs > 0 ? (double)s.in_bytes / 1e6 / secs : 0.0);
    return 0;
}
