/* ==== strand: the command-line entry point ====
 * Dispatches `strand <command> ...` to the command's function (cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/log.h"

static const struct {
    const char *name;
    st_cmd_fn fn;
    const char *help;
} commands[] = {
    {"run", cmd_run, "chat with a model: render the template, stream the answer"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"generate", cmd_generate, "generate token ids from token ids (greedy or sampled)"},
    {"logits", cmd_logits, "write the logits of a prompt to a file"},
    {"inspect", cmd_inspect, "describe a checkpoint: layers, dtypes, sizes, cache"},
    {"synth", cmd_synth, "write a checkpoint with random weights (presets or a config)"},
    {"tokenize", cmd_tokenize, "text to token ids"},
    {"detokenize", cmd_detokenize, "token ids to text"},
    {"template", cmd_template, "render the chat template for a request"},
    {"bench", cmd_bench, "measure prefill/decode speed against this machine's bandwidth"},
    {"perplexity", cmd_perplexity, "perplexity of a text (and KL divergence from a saved run)"},
    {"quantize", cmd_quantize, "convert a Hugging Face checkpoint to MLX affine 2-8 bit"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: strand <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (commands[i].fn) fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n`strand <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *lvl = getenv("STRAND_LOG");
    if (lvl && !strcmp(lvl, "debug")) st_log_set_level(ST_LOG_DEBUG);
    else if (lvl && !strcmp(lvl, "info")) st_log_set_level(ST_LOG_INFO);
    /* --device DEV and --precision P (or --device=DEV, --precision=P) are every model
     * command's: taken out before the command parses the rest */
    static const struct { const char *opt, *values; int (*set)(const char *); } global[] = {
        {"--device", "cpu, cuda or auto", cli_set_device},
        {"--precision", "exact or bf16", cli_set_precision},
    };
    int n = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        size_t g = 0;
        for (; g < sizeof global / sizeof global[0]; g++) {
            const size_t len = strlen(global[g].opt);
            if (!strcmp(argv[i], global[g].opt)) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "strand: %s needs a value: %s\n", global[g].opt, global[g].values);
                    return 2;
                }
                v = argv[++i];
                break;
            }
            if (!strncmp(argv[i], global[g].opt, len) && argv[i][len] == '=') {
                v = argv[i] + len + 1;
                break;
            }
        }
        if (!v) {
            argv[n++] = argv[i];
            continue;
        }
        if (global[g].set(v) != 0) {
            fprintf(stderr, "strand: %s %s: expected %s\n", global[g].opt, v, global[g].values);
            return 2;
        }
    }
    argc = n;
    argv[argc] = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "strand: command '%s' is not available in this build\n", argv[1]);
            return 2;
        }
        int rc = cli_dist_start(argv[1], &argc, &argv);
        if (rc == 0) rc = commands[i].fn(argc - 1, argv + 1);
        cli_dist_end();
        return rc;
    }
    fprintf(stderr, "strand: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
