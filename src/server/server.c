/* ==== The OpenAI-compatible HTTP server: start-up, threads, shutdown (see server.h, srv.h) ==== */
#include "server/srv.h"

#include <sys/stat.h>

#include "core/threadpool.h"
#include "vision/image.h"

st_server_params st_server_default_params(void) {
    st_server_params p = {
        .host = "127.0.0.1",
        .port = 8080,
        .max_seqs = 8,
        .ctx = 0,
        .step_tokens = 512,
        .max_queue = 64,
        .kv_dtype = ST_KV_F32,
        .mem_fraction = 0.9,
        .max_body = (size_t)32 << 20,
        .max_header = (size_t)64 << 10,
        .http_threads = 4,
        .prep_threads = 2,
        .max_connections = 4096,
        .idle_timeout_s = 5,
        .stall_timeout_s = 60.0,
        .keepalive_s = 10.0,
        .device = {.kind = ST_DEVICE_AUTO,
                   .cpu = {.kernels = NULL, .n_threads = 0, .pack = 1, .gdn_chunked = 1, .min_parallel_work = 0},
                   .cuda = {.device = 0, .library = NULL, .precision = ST_PRECISION_EXACT, .no_tensor_cores = 0},
                   .precision = ST_PRECISION_EXACT},
        .prefix_cache = 1,
    };
    return p;
}


/* ---------------------------------------------------------------------------------------- */
/* threads */

static void *scheduler_main(void *arg) {
    srv *s = arg;
    while (!atomic_load(&s->stopping)) {
        st_sched_step(s->sched);
        char why[200];
        if (!atomic_load(&s->fatal) && st_sched_broken(s->sched, why, sizeof why)) {
            /* every request ends with the error; /health says why until the server exits */
            fprintf(stderr, "strand: the engine cannot run: %s; exiting\n", why);
            snprintf(s->health_reason, sizeof s->health_reason, "the engine cannot run: %s", why);
            atomic_store(&s->health, HEALTH_UNHEALTHY);
            atomic_store(&s->fatal, 1);
        }
        if (!st_sched_wait(s->sched)) break;
    }
    return NULL;
}

/* a watched socket hung up */
static void on_hangup(srv *s, uint64_t serial) {
    uint64_t id = 0;
    pthread_mutex_lock(&s->streams_mu);
    for (stream *st = s->streams; st; st = st->next) {
        if (st->serial != serial) continue;
        pthread_mutex_lock(&st->mu);
        srv_unwatch(st);
        id = srv_note_gone(st);
        pthread_mutex_unlock(&st->mu);
        break;
    }
    pthread_mutex_unlock(&s->streams_mu);
    if (id) {
        st_sched_cancel(s->sched, id);
        st_metrics_disconnect(&s->metrics);
    }
}

/* hang-ups of suspended connections, lingering sockets' bytes (and their time), and keep-alive
 * comments for idle streams */
static void *watch_main(void *arg) {
    srv *s = arg;
    double last_tick = 0;
    while (!atomic_load(&s->stopping)) {
        struct epoll_event evs[64];
        int n = epoll_wait(s->epoll_fd, evs, 64, 250);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 & LINGER_TAG) srv_linger_read(s, evs[i].data.u64);
            else on_hangup(s, evs[i].data.u64);
        }
        double t = st_now_s();
        if (t - last_tick < 0.25) continue;
        last_tick = t;
        srv_linger_sweep(s, t);
        pthread_mutex_lock(&s->streams_mu);
        for (stream *st = s->streams; st; st = st->next) {
            pthread_mutex_lock(&st->mu);
            if (st->streaming && st->response_queued && st->conn && atomic_load(&st->suspended) && !st->finished_sent &&
                t - st->last_write >= s->p.keepalive_s) {
                st->keepalive_due = 1;
                st->last_write = t;
                srv_wake(st);
            }
            /* awake with bytes to send, and not asked for them: the client is not reading */
            if (st->streaming && st->response_queued && st->conn && st->submitted && !st->stall_failed &&
                !atomic_load(&st->suspended) && !atomic_load(&st->ended) &&
                t - (double)atomic_load(&st->pulled_us) * 1e-6 >= s->p.stall_timeout_s) {
                char why[128];
                snprintf(why, sizeof why, "the client did not read its stream for %.0f s", s->p.stall_timeout_s);
                st->stall_failed = 1;
                st_sched_fail(s->sched, st->sched_id, why);
            }
            pthread_mutex_unlock(&st->mu);
        }
        pthread_mutex_unlock(&s->streams_mu);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* start-up and shutdown */

/* sampling defaults from generation_config.json (OpenAI's when absent) */
static void load_defaults(srv *s) {
    st_sampling *d = &s->defaults.sampling;
    *d = st_sampling_default();
    d->temperature = 1.0f;
    char path[4096];
    if (st_path_join(path, sizeof path, s->p.model_dir, "generation_config.json", NULL) != ST_OK) return;
    json_error_t je;
    json_t *g = st_file_exists(path) ? json_load_file(path, 0, &je) : NULL;
    if (!json_is_object(g)) {
        json_decref(g);
        return;
    }
    json_t *v;
    if (json_is_number(v = json_object_get(g, "temperature"))) d->temperature = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "top_p"))) d->top_p = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(g, "top_k"))) d->top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(g, "min_p"))) d->min_p = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(g, "repetition_penalty"))) d->repetition_penalty = (float)json_number_value(v);
    if (json_is_false(json_object_get(g, "do_sample"))) d->temperature = 0.0f;
    json_decref(g);
    st_error err = {0};
    if (st_sampling_validate(d, 1 << 30, &err) != ST_OK) {
        ST_WARN("%s: ignoring its sampling defaults: %s", path, err.msg);
        *d = st_sampling_default();
        d->temperature = 1.0f;
    }
}

static st_status load_all(srv *s, st_error *err) {
    st_status st;
    if ((st = st_model_load(s->p.model_dir, &s->m, err)) != ST_OK) return st;
    st_device_params dev = s->p.device;
    dev.cpu = st_sched_cpu_params(dev.cpu, s->p.prefix_cache);
    if ((st = st_backend_create(s->m, &dev, &s->backend, err)) != ST_OK) return st;
    if ((st = st_tok_load_dir(s->p.model_dir, &s->tok, err)) != ST_OK) return st;
    s->max_token_bytes = st_textout_max_token_bytes(s->tok);
    st_error terr = {0};
    if (st_chat_template_load(s->p.model_dir, NULL, NULL, &s->ct, &terr) != ST_OK) {
        ST_WARN("no chat template (%s): /v1/chat/completions is disabled", terr.msg);
        s->ct = NULL;
    }
    s->think_split = st_tok_token_to_id(s->tok, "</think>", 8) >= 0;
    /* images: the tower on the GPU where the language model runs there, else on the CPU */
    snprintf(s->no_images, sizeof s->no_images, "this model takes no images");
    if (s->m->cfg.has_vision && s->m->cfg.image_token_id >= 0) {
        st_error verr = {0};
        if (st_vision_load(s->p.model_dir, st_kernels_best(), &s->vt, &verr) != ST_OK ||
                 st_vision_pp_load(s->p.model_dir, &s->pp, &verr) != ST_OK ||
                 st_vision_set_threads(s->vt, s->p.device.cpu.n_threads > 0 ? s->p.device.cpu.n_threads
                                                                              : st_default_threads(), &verr) != ST_OK) {
            ST_WARN("the vision tower does not load (%s): images are refused", verr.msg);
            snprintf(s->no_images, sizeof s->no_images, "the model's vision tower does not load: %.100s", verr.msg);
            st_vision_free(s->vt);
            s->vt = NULL;
        } else if (st_vision_place(s->vt, &s->p.device, &verr) != ST_OK) {
            ST_WARN("the vision tower stays on the CPU: %s", verr.msg);
        } else if (s->vt->dev) {
            ST_INFO("the vision tower runs on %s", s->vt->dev->name);
        }
    }
    st_sched_params sp = st_sched_default_params();
    sp.images = s->vt != NULL;
    sp.max_seqs = s->p.max_seqs;
    sp.ctx = s->p.ctx;
    sp.step_tokens = s->p.step_tokens > s->p.max_seqs ? s->p.step_tokens : s->p.max_seqs;
    sp.max_queue = s->p.max_queue;
    sp.kv_dtype = s->p.kv_dtype;
    sp.kv_blocks = s->p.kv_blocks;
    sp.stall_timeout_s = s->p.stall_timeout_s;
    sp.mem_budget = st_sched_memory_budget(s->m, s->backend, s->p.mem_fraction);
    sp.backend = s->backend;
    sp.prefix_cache = s->p.prefix_cache;
    sp.snapshots = s->p.snapshots;
    sp.snapshot_every = s->p.snapshot_every;
    if ((st = st_sched_create(s->m, s->tok, &sp, &s->sched, err)) != ST_OK) return st;
    size_t ev = st_sched_max_event_text(s->sched);
    s->inbox_cap = 4 * ev > INBOX_MIN_TEXT ? 4 * ev : INBOX_MIN_TEXT;
    load_defaults(s);
    s->defaults.max_tokens_completion = 16;
    s->defaults.model_name = s->model_id;
    s->defaults.max_images = s->vt ? SRV_MAX_IMAGES : 0;
    s->defaults.no_images_why = s->no_images;
    s->defaults.media_dir = s->media_dir;
    s->defaults.max_image_bytes = st_image_default_limits().max_bytes;
    st_model_stats ms;
    st_model_get_stats(s->m, s->p.kv_dtype == ST_KV_BF16 ? 2 : 4, &ms);
    const st_sched_plan *pl = st_sched_get_plan(s->sched);
    char plan[400];
    st_sched_plan_text(pl, plan, sizeof plan);
    fprintf(stderr, "strand: serving '%s': %d sequences, context %lld; weights %.2f GiB; memory plan %s%s\n",
            s->model_id, s->p.max_seqs, (long long)st_sched_context(s->sched),
            (double)ms.weight_bytes / (double)(1u << 30), plan,
            pl->fitted ? " (sized to fit the memory this process can have)" : "");
    return ST_OK;
}

/* the address to listen on: a numeric address, or a name resolved (IPv4 preferred) */
static st_status resolve_host(const char *host, int port, struct sockaddr_storage *out, socklen_t *len,
                              char *shown, size_t shown_cap, st_error *err) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return st_error_set(err, ST_ERR_ARG, "--host '%s': %s", host, rc ? gai_strerror(rc) : "no address");
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    char num[INET6_ADDRSTRLEN] = "?";
    if (pick->ai_family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)out;
        a4->sin_port = htons((uint16_t)port);
        inet_ntop(AF_INET, &a4->sin_addr, num, sizeof num);
        snprintf(shown, shown_cap, "%s", num);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
        a6->sin6_port = htons((uint16_t)port);
        inet_ntop(AF_INET6, &a6->sin6_addr, num, sizeof num);
        snprintf(shown, shown_cap, "[%s]", num);
    }
    freeaddrinfo(res);
    return ST_OK;
}

/* connections the open-file limit allows: each takes a descriptor */
static int connection_limit(int wanted) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return wanted;
    long room = (long)rl.rlim_cur - EXTRA_CONNECTIONS - 64; /* model files, epoll, threads */
    if (room >= wanted) return wanted;
    if (room < 16) room = 16;
    ST_WARN("--max-connections lowered from %d to %ld: the process may open %llu files (ulimit -n)",
            wanted, room, (unsigned long long)rl.rlim_cur);
    return (int)room;
}

/* every stream ends with the shutdown's error event; its parked connection wakes */
static void abort_streams(srv *s) {
    pthread_mutex_lock(&s->streams_mu);
    for (stream *x = s->streams; x; x = x->next) {
        pthread_mutex_lock(&x->mu);
        x->aborted = 1;
        srv_wake(x);
        pthread_mutex_unlock(&x->mu);
    }
    pthread_mutex_unlock(&s->streams_mu);
}

st_status st_server_run(const st_server_params *p, volatile sig_atomic_t *stop, st_error *err) {
    if (p->api_key && !*p->api_key)
        return st_error_set(err, ST_ERR_ARG, "the API key is empty (an unset variable?): give a key, or no --api-key");
    if (p->max_connections < 1 || p->idle_timeout_s < 1 || !(p->stall_timeout_s > 0))
        return st_error_set(err, ST_ERR_ARG, "max_connections and idle_timeout_s must be >= 1, stall_timeout_s > 0");
    srv *s = calloc(1, sizeof *s);
    if (!s) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    s->p = *p;
    if (p->local_media_dir) { /* its real path, so that requests' paths compare with it */
        struct stat sb;
        s->media_dir = realpath(p->local_media_dir, NULL);
        if (!s->media_dir || stat(s->media_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            free(s->media_dir);
            free(s);
            return st_error_set(err, ST_ERR_ARG, "--allowed-local-media-path %s: not a directory", p->local_media_dir);
        }
    }
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (s->p.http_threads < 1) s->p.http_threads = 1;
    if (s->p.prep_threads < 1) s->p.prep_threads = 1;
    s->p.max_connections = connection_limit(s->p.max_connections);
    s->created = (long long)time(NULL);
    s->id_salt = (uint64_t)s->created * 0x2545f4914f6cdd1dull ^ (uint64_t)getpid();
    s->epoll_fd = -1;
    pthread_mutex_init(&s->streams_mu, NULL);
    pthread_mutex_init(&s->prep_mu, NULL);
    pthread_cond_init(&s->prep_cv, NULL);
    srv_linger_init(s);
    st_metrics_init(&s->metrics);
    atomic_store(&s->health, HEALTH_LOADING);
    if (p->model_name && *p->model_name) {
        snprintf(s->model_id, sizeof s->model_id, "%.255s", p->model_name);
    } else {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", p->model_dir);
        size_t n = strlen(tmp);
        while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
        const char *base = strrchr(tmp, '/');
        snprintf(s->model_id, sizeof s->model_id, "%.255s", base ? base + 1 : tmp);
    }
    st_status st = ST_OK;
    struct sockaddr_storage sa;
    socklen_t sa_len = 0;
    char shown[INET6_ADDRSTRLEN + 2];
    if ((st = resolve_host(s->p.host, s->p.port, &sa, &sa_len, shown, sizeof shown, err)) != ST_OK) goto out;
    s->prep_cap = s->p.max_seqs + s->p.max_queue + 2 * s->p.http_threads;
    s->prep_ring = calloc((size_t)s->prep_cap, sizeof *s->prep_ring);
    s->prep_threads = calloc((size_t)s->p.prep_threads, sizeof *s->prep_threads);
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (!s->prep_ring || !s->prep_threads || s->epoll_fd < 0) {
        st = st_error_set(err, ST_ERR_NOMEM, "cannot set up the server's queues");
        goto out;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (sa.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->p.port, NULL, NULL, srv_on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->p.http_threads,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->p.max_connections + EXTRA_CONNECTIONS),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->p.max_header + HEADER_RESERVE, MHD_OPTION_CONNECTION_TIMEOUT,
                            s->p.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, srv_on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, srv_on_connection, s, MHD_OPTION_EXTERNAL_LOGGER, srv_mhd_log, s,
                            MHD_OPTION_END);
    if (!s->d) {
        st = st_error_set(err, ST_ERR_IO, "cannot listen on %s:%d (address in use or not allowed?)", s->p.host, s->p.port);
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : s->p.port;
    fprintf(stderr, "strand: listening on http://%s:%d (loading %s)\n", shown, port, s->p.model_dir);
    if ((st = load_all(s, err)) != ST_OK) {
        snprintf(s->health_reason, sizeof s->health_reason, "%s", err->msg);
        atomic_store(&s->health, HEALTH_UNHEALTHY);
        goto out;
    }
    if (pthread_create(&s->sched_thread, NULL, scheduler_main, s) != 0) {
        st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
        goto out;
    }
    s->sched_started = 1;
    if (pthread_create(&s->watch_thread, NULL, watch_main, s) != 0) {
        st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
        goto out;
    }
    s->watch_started = 1;
    for (; s->n_prep_started < s->p.prep_threads; s->n_prep_started++)
        if (pthread_create(&s->prep_threads[s->n_prep_started], NULL, srv_prep_main, s) != 0) {
            st = st_error_set(err, ST_ERR_INTERNAL, "cannot start threads");
            goto out;
        }
    atomic_store(&s->health, HEALTH_READY);
    {
        char what[512];
        st_backend_describe(s->backend, what, sizeof what);
        fprintf(stderr, "strand: running on %s\n", what);
    }
    fprintf(stderr, "strand: ready\n");
    while (!*stop && !atomic_load(&s->fatal)) usleep(100 * 1000);
    if (atomic_load(&s->fatal)) { /* the streams' error events go out; /health answers 503 a while */
        for (int i = 0; i < 5 && !*stop; i++) usleep(100 * 1000);
        st = st_error_set(err, ST_ERR_IO, "%s", s->health_reason);
    }
    fprintf(stderr, "strand: shutting down\n");
out:
    if (!atomic_load(&s->fatal))
        snprintf(s->health_reason, sizeof s->health_reason, "%s", st == ST_OK ? "shutting down" : err->msg);
    atomic_store(&s->health, HEALTH_UNHEALTHY);
    atomic_store(&s->stopping, 1);
    /* the streams first: their clients get the error event now, even while a step (a long
     * prefill, a collective waiting for a lost rank) keeps the scheduler thread */
    abort_streams(s);
    if (s->d) usleep(200 * 1000);
    if (s->sched) st_sched_shutdown(s->sched);
    if (s->sched_started) pthread_join(s->sched_thread, NULL);
    pthread_mutex_lock(&s->prep_mu);
    s->prep_stop = 1;
    pthread_cond_broadcast(&s->prep_cv);
    pthread_mutex_unlock(&s->prep_mu);
    for (int i = 0; i < s->n_prep_started; i++) pthread_join(s->prep_threads[i], NULL);
    if (s->watch_started) pthread_join(s->watch_thread, NULL);
    /* jobs never prepared: their references go */
    for (; s->prep_n > 0; s->prep_n--, s->prep_head = (s->prep_head + 1) % s->prep_cap) {
        atomic_fetch_sub(&s->preparing, 1);
        srv_stream_unref(s->prep_ring[s->prep_head]);
    }
    abort_streams(s); /* and those made since: every parked connection wakes and ends */
    if (s->d) {
        usleep(100 * 1000);
        MHD_stop_daemon(s->d);
    }
    st_sched_destroy(s->sched); /* drops the scheduler's references without events */
    /* every thread is gone: what is left was held by the scheduler */
    while (s->streams) {
        stream *x = s->streams;
        s->streams = x->next;
        srv_stream_free(x);
    }
    srv_linger_sweep(s, -1.0); /* (MHD and the watcher are gone) */
    if (s->epoll_fd >= 0) close(s->epoll_fd);
    free(s->prep_ring);
    free(s->prep_threads);
    free(s->media_dir);
    st_chat_template_free(s->ct);
    st_tok_free(s->tok);
    st_vision_free(s->vt);
    st_backend_destroy(s->backend);
    st_model_free(s->m);
    st_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->streams_mu);
    pthread_mutex_destroy(&s->prep_mu);
    pthread_cond_destroy(&s->prep_cv);
    pthread_mutex_destroy(&s->linger_mu);
    free(s);
    return st;
}

