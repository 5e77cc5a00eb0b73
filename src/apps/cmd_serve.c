/* ==== strand serve: the OpenAI-compatible HTTP server ==== */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "apps/cli.h"
#include "server/server.h"

static volatile sig_atomic_t g_stop; /* set by SIGINT/SIGTERM; the only signal state */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: strand serve -m DIR [--host 127.0.0.1] [--port 8080] [--max-seqs N] [--ctx N]\n"
            "                    [--api-key KEY] [--model-name NAME] [--max-queue N] [--step-tokens N]\n"
            "                    [--kv-dtype f32|bf16] [--kv-blocks N] [--http-threads N]\n"
            "                    [--max-body-mb N] [--keepalive S]\n"
            "  Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
            "  GET /health, GET /metrics. --port 0 picks a free port (printed on stderr).\n");
}

int cmd_serve(int argc, char **argv) {
    st_server_params p = st_server_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long x;
        double f;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(p.model_dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--host")) {
            if (!(p.host = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--port")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 65535, &x)) return 2;
            p.port = (int)x;
        } else if (!strcmp(a, "--max-seqs")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &x)) return 2;
            p.max_seqs = (int)x;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 2, (long long)1 << 30, &x)) return 2;
            p.ctx = x;
        } else if (!strcmp(a, "--api-key")) {
            if (!(p.api_key = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--model-name")) {
            if (!(p.model_name = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-queue")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 20, &x)) return 2;
            p.max_queue = (int)x;
        } else if (!strcmp(a, "--step-tokens")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.step_tokens = (int)x;
        } else if (!strcmp(a, "--kv-blocks")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, (long long)1 << 31, &x)) return 2;
            p.kv_blocks = x;
        } else if (!strcmp(a, "--http-threads")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 256, &x)) return 2;
            p.http_threads = (int)x;
        } else if (!strcmp(a, "--max-body-mb")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &x)) return 2;
            p.max_body = (size_t)x << 20;
        } else if (!strcmp(a, "--keepalive")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_float(a, v, &f)) return 2;
            if (f <= 0) return cli_failf("--keepalive must be positive");
            p.keepalive_s = f;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (cli_parse_kv_dtype(v, &p.kv_dtype) != 0) return 2;
        } else {
            usage();
            return cli_failf("serve: unknown option '%s'", a);
        }
    }
    if (!p.model_dir) {
        usage();
        return cli_failf("serve: -m DIR is required");
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    st_error err = {0};
    if (st_server_run(&p, &g_stop, &err) != ST_OK) return cli_fail(&err);
    return 0;
}
