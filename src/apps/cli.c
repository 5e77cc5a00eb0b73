/* ==== CLI helpers (see cli.h) ==== */
#include "apps/cli.h"

#include "core/fileio.h"
#include "vision/prompt.h"

#include "core/threadpool.h"
#include "dist/comm.h"
#include "dist/relay.h"
#include "engine/scheduler.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int cli_fail(const st_error *err) {
    fprintf(stderr, "strand: %s\n", err->msg[0] ? err->msg : st_status_name(err->status));
    return 1;
}

int cli_failf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("strand: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

st_status cli_parse_ids(const char *s, int32_t **ids, int *n, st_error *err) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const char *p = s;
    int count = 0;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return st_error_set(err, ST_ERR_ARG, "bad token id near '%.20s'", p);
        }
        if ((size_t)count == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            }
            v = nv;
        }
        v[count++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = count;
    return ST_OK;
}

int cli_parse_int(const char *opt, const char *s, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < min || x > max) {
        fprintf(stderr, "strand: %s: expected an integer in [%lld, %lld], got '%s'\n", opt, min,
                max, s);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_parse_float(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno) {
        fprintf(stderr, "strand: %s: expected a number, got '%s'\n", opt, s);
        return -1;
    }
    *out = x;
    return 0;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "strand: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

const char *cli_sampling_help(void) {
    return "  sampling: --temp T (0 = greedy, the default) --top-k K --top-p P --min-p P\n"
           "            --repeat-penalty R --presence-penalty P --frequency-penalty F\n"
           "            --seed N --logit-bias ID=BIAS (repeatable)\n"
           "  stopping: --stop STR (repeatable) --ignore-eos\n"
           "  output:   --logprobs N (the chosen token's log-probability and N <= 20 alternatives)\n";
}

int cli_parse_sampling(int argc, char **argv, int *i, struct st_req_params *rp) {
    const char *a = argv[*i], *v;
    double x;
    long long k;
    st_sampling *s = &rp->sampling;
#define FLOAT_OPT(name, field)                                                                 \
    if (!strcmp(a, name)) {                                                                    \
        if (!(v = cli_value(argc, argv, i)) || cli_parse_float(a, v, &x)) return -1;           \
        field = (float)x;                                                                      \
        return 1;                                                                              \
    }
    FLOAT_OPT("--temp", s->temperature)
    FLOAT_OPT("--top-p", s->top_p)
    FLOAT_OPT("--min-p", s->min_p)
    FLOAT_OPT("--repeat-penalty", s->repetition_penalty)
    FLOAT_OPT("--repetition-penalty", s->repetition_penalty)
    FLOAT_OPT("--presence-penalty", s->presence_penalty)
    FLOAT_OPT("--frequency-penalty", s->frequency_penalty)
#undef FLOAT_OPT
    if (!strcmp(a, "--top-k")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, 1 << 30, &k)) return -1;
        s->top_k = (int)k;
        return 1;
    }
    if (!strcmp(a, "--seed")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, INT64_MAX, &k)) return -1;
        s->seed = (uint64_t)k;
        s->has_seed = 1;
        return 1;
    }
    if (!strcmp(a, "--logprobs")) {
        if (!(v = cli_value(argc, argv, i)) || cli_parse_int(a, v, 0, ST_MAX_LOGPROBS, &k)) return -1;
        rp->logprobs = (int)k;
        return 1;
    }
    if (!strcmp(a, "--ignore-eos")) {
        rp->ignore_eos = 1;
        return 1;
    }
    if (!strcmp(a, "--stop")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (rp->n_stop >= ST_MAX_STOP) {
            fprintf(stderr, "strand: at most %d --stop strings\n", ST_MAX_STOP);
            return -1;
        }
        rp->stop[rp->n_stop++] = v;
        return 1;
    }
    if (!strcmp(a, "--logit-bias")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        char *end;
        long long id = strtoll(v, &end, 10);
        if (end == v || *end != '=' || id < 0 || id > INT32_MAX) {
            fprintf(stderr, "strand: --logit-bias: expected ID=BIAS, got '%s'\n", v);
            return -1;
        }
        if (cli_parse_float(a, end + 1, &x)) return -1;
        if (s->n_bias >= ST_MAX_LOGIT_BIAS) {
            fprintf(stderr, "strand: at most %d --logit-bias entries\n", ST_MAX_LOGIT_BIAS);
            return -1;
        }
        s->bias[s->n_bias++] = (st_logit_bias){(int32_t)id, (float)x};
        return 1;
    }
    return 0;
}

int cli_parse_kv_dtype(const char *value, st_kv_dtype *out) {
    if (!strcmp(value, "f32")) *out = ST_KV_F32;
    else if (!strcmp(value, "bf16")) *out = ST_KV_BF16;
    else {
        cli_failf("--kv-dtype: expected f32 or bf16, got '%s'", value);
        return -1;
    }
    return 0;
}

/* ---- tensor parallelism: this process as one rank of an MPI job ---- */

static st_comm *g_comm; /* the job's communicator, or NULL (a process on its own) */

/* the job size the MPI launcher gives its processes, 0 outside a job */
static long launcher_world(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return strtol(v, NULL, 10);
    }
    return 0;
}

int cli_dist_start(const char *cmd, int *argc, char ***argv) {
    if (launcher_world() <= 1) return 0;
    static const char *const ok[] = {"generate", "logits", "run", "serve", "bench", "perplexity"};
    int known = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) known |= !strcmp(cmd, ok[i]);
    if (!known) {
        fprintf(stderr,
                "strand: '%s' does not run as a tensor-parallel job (under mpirun: generate, logits, run, serve, "
                "bench, perplexity)\n",
                cmd);
        return 2;
    }
    double timeout = 3.0;
    const char *tv = getenv("STRAND_COMM_TIMEOUT");
    if (tv && *tv) {
        char *end = NULL;
        timeout = strtod(tv, &end);
        if (*end || !(timeout > 0) || timeout > 86400) {
            fprintf(stderr, "strand: STRAND_COMM_TIMEOUT=%s: expected seconds in (0, 86400]\n", tv);
            return 2;
        }
    }
    st_error err = {0};
    if (st_comm_mpi_create(NULL, argc, argv, &g_comm, &err) != ST_OK) return cli_fail(&err);
    g_comm->timeout_s = timeout;
    if (g_comm->rank != 0 && !freopen("/dev/null", "w", stdout)) { /* rank 0 answers */
        fprintf(stderr, "strand: rank %d: cannot silence its standard output\n", g_comm->rank);
        return 2;
    }
    return 0;
}

void cli_dist_end(void) {
    struct rusage ru;
    if (g_comm && getrusage(RUSAGE_SELF, &ru) == 0) /* the peak: the model is freed by now */
        fprintf(stderr,
                "strand: rank %d of %d: %lld all-reduces, %.3f s in them; %lld logit gathers, %.3f s; %.1f MiB resident at "
                "most\n",
                g_comm->rank, g_comm->world, (long long)g_comm->allreduces, g_comm->allreduce_s, (long long)g_comm->gathers,
                g_comm->gather_s, (double)ru.ru_maxrss / 1024.0);
    st_comm_destroy(g_comm);
    g_comm = NULL;
}

int cli_rank(void) { return g_comm ? g_comm->rank : 0; }
int cli_world(void) { return g_comm ? g_comm->world : 1; }

_Noreturn void cli_follow(st_backend *b) {
    st_error err = {0};
    /* rank 0 ends the job's work (and its signals end rank 0); a lost rank 0 ends the job */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    fprintf(stderr, "strand: rank %d of %d (pid %ld): following rank 0\n", g_comm->rank, g_comm->world, (long)getpid());
    const st_status st = st_relay_follow(b, &err);
    if (st != ST_OK) fprintf(stderr, "strand: rank %d: %s\n", g_comm->rank, err.msg);
    st_backend_destroy(b);
    cli_dist_end();
    exit(st == ST_OK ? 0 : 1);
}

int cli_follow_model(const char *dir) {
    st_model *m = NULL;
    st_backend *b = NULL;
    st_error err = {0};
    if (st_model_load(dir, &m, &err) != ST_OK || cli_backend(m, &b, &err) != ST_OK) {
        st_model_free(m);
        return cli_fail(&err);
    }
    cli_follow(b); /* does not return */
}

st_cpu_params cli_cpu_params(void) {
    st_cpu_params p = st_cpu_default_params();
    p.comm = g_comm;
    p.kernels = st_kernels_select(getenv("STRAND_KERNELS"));
    p.n_threads = st_threads_parse(getenv("STRAND_THREADS"));
    const char *pack = getenv("STRAND_PACK");
    p.pack = !(pack && strcmp(pack, "0") == 0);
    return p;
}

static const char *g_device; /* the --device value main.c found, or NULL */

int cli_set_device(const char *value) {
    st_device_kind k;
    if (st_device_parse(value, &k) != 0) return -1;
    g_device = value;
    return 0;
}

static st_precision g_precision = ST_PRECISION_EXACT; /* the --precision value main.c found */

int cli_set_precision(const char *value) { return st_precision_parse(value, &g_precision); }

st_device_params cli_device_params(void) {
    st_device_params p = st_device_default_params();
    p.cpu = cli_cpu_params();
    p.precision = g_precision;
    const char *d = g_device ? g_device : getenv("STRAND_DEVICE");
    if (d && *d && st_device_parse(d, &p.kind) != 0)
        fprintf(stderr, "strand: warning: STRAND_DEVICE=%s is not a device (cpu, cuda, auto); using auto\n", d);
    /* a job's ranks on one host take one GPU each (the launcher's local rank); NCCL between
     * them unless STRAND_NCCL=0 (then through the host over MPI); STRAND_NCCL=1 on its own
     * runs the all-reduces through a NCCL communicator of one GPU */
    p.cuda.comm = g_comm;
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr || !*lr) lr = getenv("MPI_LOCALRANKID");
    if (g_comm && g_comm->world > 1 && lr && *lr) p.cuda.device = (int)strtol(lr, NULL, 10);
    const char *dev = getenv("STRAND_CUDA_DEVICE");
    if (dev && *dev) p.cuda.device = (int)strtol(dev, NULL, 10);
    const char *nc = getenv("STRAND_NCCL");
    p.cuda.nccl = nc && *nc ? strcmp(nc, "0") != 0 : (g_comm && g_comm->world > 1);
    return p;
}

st_status cli_backend(const st_model *m, st_backend **out, st_error *err) {
    st_device_params p = cli_device_params();
    st_status st = st_backend_create(m, &p, out, err);
    if (st == ST_OK && g_comm && g_comm->rank != 0) cli_follow(*out);
    if (st == ST_OK && p.kind != ST_DEVICE_CPU) {
        char what[512];
        st_backend_describe(*out, what, sizeof what);
        if (st_backend_is_cuda(*out)) fprintf(stderr, "strand: running on %s\n", what);
    }
    return st;
}

st_status cli_vision_prompt(const char *dir, const st_model *m, int32_t **ids, int64_t *n, int64_t expand_max,
                            const char *const *paths, int n_paths, st_vision_tower **vt, st_vision_prompt *vp,
                            st_error *err) {
    *vt = NULL;
    memset(vp, 0, sizeof *vp);
    if (m->cfg.image_token_id < 0)
        return st_error_set(err, ST_ERR_ARG, "%s: config.json has no image_token_id: the model takes no images", dir);
    const st_image_limits lim = st_image_default_limits();
    char **img = calloc((size_t)n_paths, sizeof *img);
    size_t *len = calloc((size_t)n_paths, sizeof *len);
    st_status st = img && len ? ST_OK : st_error_set(err, ST_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_paths && st == ST_OK; i++) st = st_file_read(paths[i], lim.max_bytes, &img[i], &len[i], err);
    st_vision_pp pp;
    if (st == ST_OK) st = st_vision_load(dir, st_kernels_best(), vt, err);
    if (st == ST_OK) { /* $STRAND_THREADS, else every CPU */
        const int nt = st_threads_parse(getenv("STRAND_THREADS"));
        st = st_vision_set_threads(*vt, nt > 0 ? nt : st_default_threads(), err);
    }
    if (st == ST_OK) { /* on the GPU where the model runs there */
        const st_device_params dp = cli_device_params();
        st_error verr = {0};
        if (st_vision_place(*vt, &dp, &verr) != ST_OK)
            fprintf(stderr, "strand: warning: the vision tower stays on the CPU: %s\n", verr.msg);
    }
    if (st == ST_OK) st = st_vision_pp_load(dir, &pp, err);
    int32_t *x = NULL;
    int64_t nx = 0;
    if (st == ST_OK && !expand_max)
        st = st_vision_prompt_build(*vt, &pp, m->cfg.image_token_id, *ids, *n, (const void *const *)img, len, n_paths, &lim,
                                    vp, err);
    else if (st == ST_OK)
        st = st_vision_prompt_expand(*vt, &pp, m->cfg.image_token_id, *ids, *n, (const void *const *)img, len, n_paths,
                                     &lim, expand_max, &x, &nx, vp, err);
    if (st == ST_OK && expand_max) {
        free(*ids);
        *ids = x;
        *n = nx;
    }
    for (int i = 0; img && i < n_paths; i++) free(img[i]);
    free(img);
    free(len);
    if (st != ST_OK) {
        st_vision_free(*vt);
        *vt = NULL;
    }
    return st;
}
