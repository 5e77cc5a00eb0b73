/* ==== strand serve: the OpenAI-compatible HTTP server ==== */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "apps/cli.h"
#include "core/fileio.h"
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
            "                    [--prep-threads N] [--max-body-mb N] [--keepalive S]\n"
            "                    [--max-connections N] [--idle-timeout S] [--stall-timeout S]\n"
            "                    [--api-key-file FILE] [--mem-fraction F] [--prefix-cache on|off]\n"
            "                    [--snapshots N] [--snapshot-every BLOCKS] [--allowed-local-media-path DIR]\n"
            "  Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
            "  GET /health, GET /metrics. --port 0 picks a free port (printed on stderr).\n"
            "  The API key comes from --api-key, --api-key-file or $STRAND_API_KEY (in that order);\n"
            "  an empty key is refused. --idle-timeout: seconds a connection may sit with no request\n"
            "  in progress (default 5); --stall-timeout: seconds a stream's client may read nothing\n"
            "  before its generation is cancelled (default 60); --max-connections (default 4096):\n"
            "  more are answered 503. --mem-fraction (default 0.9) of the memory this process can have\n"
            "  is planned for the cache: an unset --ctx/--kv-blocks is sized to fit it, an explicit\n"
            "  plan that does not fit is refused (0: no check).\n"
            "  --prefix-cache (default on): prompt prefixes already computed are reused (their KV blocks\n"
            "  and a snapshot of the recurrent state, taken every --snapshot-every blocks of a prompt\n"
            "  (default 32), before its end and at the end of each reply); --snapshots: the snapshot\n"
            "  pool (default 4 x max-seqs + 4), sized in the start-up plan.\n"
            "  --allowed-local-media-path DIR: image_url parts may name files under DIR as\n"
            "  file:///path (real paths compared: links and .. resolved); without it file:// is refused.\n"
            "  http(s) image URLs are never fetched.\n");
}

/* the key in a file: its first line, without the line end */
static int read_key_file(const char *path, char **out) {
    char *text = NULL;
    size_t len = 0;
    st_error err = {0};
    if (st_file_read(path, 1 << 16, &text, &len, &err) != ST_OK) return cli_fail(&err);
    size_t n = 0;
    while (n < len && text[n] != '\n' && text[n] != '\r') n++;
    text[n] = 0;
    *out = text;
    return 0;
}

/* each connection takes a file descriptor: allow as many as the hard limit lets us */
static void raise_open_file_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int cmd_serve(int argc, char **argv) {
    st_server_params p = st_server_default_params();
    p.device = cli_device_params();
    const char *key_file = NULL;
    char *key_buf = NULL;
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
            if (!*p.api_key) return cli_failf("--api-key is empty (an unset variable?): give a key or leave the option out");
        } else if (!strcmp(a, "--allowed-local-media-path")) {
            if (!(p.local_media_dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--api-key-file")) {
            if (!(key_file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-connections")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.max_connections = (int)x;
        } else if (!strcmp(a, "--idle-timeout")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 86400, &x)) return 2;
            p.idle_timeout_s = (unsigned)x;
        } else if (!strcmp(a, "--stall-timeout")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_float(a, v, &f)) return 2;
            if (!(f > 0) || f > 86400) return cli_failf("--stall-timeout must be in (0, 86400] seconds");
            p.stall_timeout_s = f;
        } else if (!strcmp(a, "--mem-fraction")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_float(a, v, &f)) return 2;
            if (!(f >= 0 && f <= 1)) return cli_failf("--mem-fraction must be in [0, 1]");
            p.mem_fraction = f;
        } else if (!strcmp(a, "--prep-threads")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 256, &x)) return 2;
            p.prep_threads = (int)x;
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
        } else if (!strcmp(a, "--prefix-cache")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (strcmp(v, "on") && strcmp(v, "off")) return cli_failf("--prefix-cache must be on or off, not '%s'", v);
            p.prefix_cache = !strcmp(v, "on");
        } else if (!strcmp(a, "--snapshots")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.snapshots = (int)x;
        } else if (!strcmp(a, "--snapshot-every")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &x)) return 2;
            p.snapshot_every = (int)x;
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
    if (cli_rank() != 0) return cli_follow_model(p.model_dir); /* rank 0 serves; the others follow */
    if (!p.api_key && key_file) {
        if (read_key_file(key_file, &key_buf)) return 1;
        if (!*key_buf) {
            free(key_buf);
            return cli_failf("--api-key-file %s: the key is empty", key_file);
        }
        p.api_key = key_buf;
    }
    if (!p.api_key) {
        const char *env = getenv("STRAND_API_KEY");
        if (env && !*env) return cli_failf("STRAND_API_KEY is set but empty: give a key or unset it");
        p.api_key = env;
    }
    raise_open_file_limit();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    st_error err = {0};
    int rc = st_server_run(&p, &g_stop, &err) != ST_OK ? cli_fail(&err) : 0;
    free(key_buf);
    return rc;
}
