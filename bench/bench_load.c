/* ==== Load benchmark: concurrent streaming clients against strand serve (loopback) ====
 *
 * N client threads each send R streaming chat requests (max_tokens K, ignore_eos) to the
 * server and time the stream: time to first token, the gaps between chunks, and the tokens
 * (from the usage chunk). Bounded in count (N x R requests) and time (--timeout).
 *
 *   build/bench/bench_load --port P [--host 127.0.0.1] [--clients 8] [--requests 4]
 *                          [--max-tokens 64] [--prompt TEXT] [--timeout 300] [--json]
 * bench/load.sh starts a server on a synthetic model and runs this.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

static const char *g_host = "127.0.0.1";
static int g_port, g_clients = 8, g_requests = 4, g_max_tokens = 64;
static double g_timeout = 300, g_t0;
static const char *g_prompt = "Write a short story about a lighthouse keeper.";


typedef struct result {
    double ttft;
    double *gaps;   /* inter-chunk gaps (owned) */
    int n_gaps;
    long tokens;
    int ok;
} result;

typedef struct client {
    int idx;
    result *res;    /* [g_requests] */
} client;

/* one streaming request; fills r */
static void one_request(int seed, result *r) {
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, g_host, &sa.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0) close(fd);
        return;
    }
    char body[2048], req[4096];
    int bl = snprintf(body, sizeof body,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"stream\":true,\"max_tokens\":%d,"
                      "\"ignore_eos\":true,\"temperature\":0.8,\"seed\":%d,\"reasoning_effort\":\"none\","
                      "\"stream_options\":{\"include_usage\":true}}",
                      g_prompt, g_max_tokens, seed);
    int rl = snprintf(req, sizeof req,
                      "POST /v1/chat/completions HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      g_host, bl, body);
    double t_start = st_now_s(), t_last = 0;
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int cap_gaps = g_max_tokens + 8;
    r->gaps = malloc((size_t)cap_gaps * sizeof *r->gaps);
    int header_done = 0, done = 0;
    while (!done) {
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) break;
        double t = st_now_s();
        len += (size_t)k;
        buf[len] = 0;
        char *p = buf;
        if (!header_done) {
            char *e = strstr(buf, "\r\n\r\n");
            if (!e) continue;
            if (strncmp(buf, "HTTP/1.0 200", 12) && strncmp(buf, "HTTP/1.1 200", 12)) break;
            header_done = 1;
            p = e + 4;
        }
        char *ev;
        while ((ev = strstr(p, "\n\n"))) {
            *ev = 0;
            if (!strncmp(p, "data: ", 6)) {
                if (!strcmp(p + 6, "[DONE]")) {
                    done = 1;
                } else if (strstr(p, "\"content\":\"") && !strstr(p, "\"content\":\"\"")) {
                    if (!r->ttft) r->ttft = t - t_start;
                    else if (r->n_gaps < cap_gaps) r->gaps[r->n_gaps++] = t - t_last;
                    t_last = t;
                } else if (strstr(p, "\"completion_tokens\":")) {
                    r->tokens = atol(strstr(p, "\"completion_tokens\":") + 20);
                } else if (strstr(p, "\"error\"")) {
                    done = 1;
                    r->tokens = -1;
                }
            }
            p = ev + 2;
        }
        size_t rest = len - (size_t)(p - buf);
        memmove(buf, p, rest);
        len = rest;
    }
    r->ok = done && r->tokens > 0;
    free(buf);
    close(fd);
}

static void *client_main(void *arg) {
    client *c = arg;
    for (int i = 0; i < g_requests && st_now_s() - g_t0 < g_timeout; i++) one_request(c->idx * 1000 + i, &c->res[i]);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    if (n == 0) return 0;
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc) g_port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--host") && i + 1 < argc) g_host = argv[++i];
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc) g_clients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) g_requests = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc) g_max_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) g_prompt = argv[++i];
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) g_timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_load --port P [--host H] [--clients N] [--requests R] [--max-tokens K] "
                            "[--prompt TEXT] [--timeout S] [--json]\n");
            return 2;
        }
    }
    if (g_port <= 0 || g_clients < 1 || g_requests < 1 || g_max_tokens < 1 || strchr(g_prompt, '"') || strchr(g_prompt, '\\')) {
        fprintf(stderr, "bench_load: --port is required; counts must be positive; no quotes in --prompt\n");
        return 2;
    }
    client *cl = calloc((size_t)g_clients, sizeof *cl);
    pthread_t *th = calloc((size_t)g_clients, sizeof *th);
    g_t0 = st_now_s();
    for (int i = 0; i < g_clients; i++) {
        cl[i].idx = i;
        cl[i].res = calloc((size_t)g_requests, sizeof *cl[i].res);
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < g_clients; i++) pthread_join(th[i], NULL);
    double wall = st_now_s() - g_t0;
    int total = g_clients * g_requests, ok = 0, n_gaps = 0;
    long tokens = 0;
    double *ttft = calloc((size_t)total, sizeof *ttft);
    for (int i = 0; i < g_clients; i++)
        for (int j = 0; j < g_requests; j++) n_gaps += cl[i].res[j].n_gaps;
    double *gaps = calloc((size_t)n_gaps + 1, sizeof *gaps);
    int ng = 0;
    for (int i = 0; i < g_clients; i++)
        for (int j = 0; j < g_requests; j++) {
            result *r = &cl[i].res[j];
            if (!r->ok) continue;
            ttft[ok++] = r->ttft;
            tokens += r->tokens;
            for (int k = 0; k < r->n_gaps; k++) gaps[ng++] = r->gaps[k];
        }
    qsort(ttft, (size_t)ok, sizeof *ttft, cmp_d);
    qsort(gaps, (size_t)ng, sizeof *gaps, cmp_d);
    if (json) {
        printf("{\"clients\":%d,\"requests\":%d,\"ok\":%d,\"max_tokens\":%d,\"wall_s\":%.3f,\"tokens\":%ld,"
               "\"tokens_per_s\":%.2f,\"ttft_p50_ms\":%.2f,\"ttft_p99_ms\":%.2f,\"itl_p50_ms\":%.2f,\"itl_p99_ms\":%.2f}\n",
               g_clients, total, ok, g_max_tokens, wall, tokens, tokens / wall, pct(ttft, ok, 0.5) * 1e3,
               pct(ttft, ok, 0.99) * 1e3, pct(gaps, ng, 0.5) * 1e3, pct(gaps, ng, 0.99) * 1e3);
    } else {
        printf("%-9s %-9s %-7s %-10s %12s %12s %12s %12s %12s\n", "clients", "requests", "ok", "tokens", "tok/s",
               "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms");
        printf("%-9d %-9d %-7d %-10ld %12.1f %12.1f %12.1f %12.2f %12.2f\n", g_clients, total, ok, tokens, tokens / wall,
               pct(ttft, ok, 0.5) * 1e3, pct(ttft, ok, 0.99) * 1e3, pct(gaps, ng, 0.5) * 1e3, pct(gaps, ng, 0.99) * 1e3);
    }
    for (int i = 0; i < g_clients; i++) {
        for (int j = 0; j < g_requests; j++) free(cl[i].res[j].gaps);
        free(cl[i].res);
    }
    free(cl);
    free(th);
    free(ttft);
    free(gaps);
    return ok == total ? 0 : 1;
}
