/* ==== Loading the CUDA backend's shared object (see cuda.h) ==== */
#include "backend/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/plugin.h"
#include "dist/comm.h"

st_cuda_params st_cuda_default_params(void) {
    st_cuda_params p = {.device = 0, .library = NULL, .precision = ST_PRECISION_EXACT, .no_tensor_cores = 0,
                        .comm = NULL, .nccl = 0};
    return p;
}

/* the entry of the library, opened once per process (the handle is kept: the library's
 * code runs as long as a backend may exist) */
static pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;
static const st_cuda_entry *g_entry;
static char g_load_error[512];

static const st_cuda_entry *load(const st_cuda_params *p, char *why, size_t cap) {
    pthread_mutex_lock(&g_load_mu);
    if (!g_entry) {
        char w[400];
        void *h = st_plugin_open("libstrand-cuda.so", p ? p->library : NULL, w, sizeof w);
        const st_cuda_entry *(*get)(void) = h ? (const st_cuda_entry *(*)(void))dlsym(h, ST_CUDA_ENTRY_SYMBOL) : NULL;
        const st_cuda_entry *e = get ? get() : NULL;
        if (e && e->abi == ST_CUDA_ABI) g_entry = e;
        else if (h) {
            snprintf(w, sizeof w, "%s: not a strand CUDA backend of this version", p && p->library ? p->library : "libstrand-cuda.so");
            dlclose(h);
        }
        if (!g_entry) snprintf(g_load_error, sizeof g_load_error, "the CUDA backend library could not be loaded (%s)", w);
    }
    const st_cuda_entry *e = g_entry;
    if (!e) snprintf(why, cap, "%s", g_load_error);
    pthread_mutex_unlock(&g_load_mu);
    return e;
}

int st_cuda_available(const st_cuda_params *p, char *why, size_t why_cap) {
    char w[512] = "";
    const st_cuda_entry *e = load(p, w, sizeof w);
    if (e && e->available(p ? p->device : 0, w, sizeof w)) return 1;
    if (why && why_cap) snprintf(why, why_cap, "%s", w);
    return 0;
}

/* the library's entry where p's device is usable, else NULL with ST_ERR_UNSUPPORTED saying why
 * (`what`: what the device is for) */
static const st_cuda_entry *usable(const st_cuda_params *p, const char *what, st_error *err) {
    char why[512] = "";
    const st_cuda_entry *e = load(p, why, sizeof why);
    if (!e) {
        st_error_set(err, ST_ERR_UNSUPPORTED, "%s", why);
        return NULL;
    }
    if (!e->available(p->device, why, sizeof why)) {
        st_error_set(err, ST_ERR_UNSUPPORTED, "no usable CUDA device%s: %s", what, why);
        return NULL;
    }
    return e;
}

st_status st_backend_cuda_create(const st_model *m, const st_cuda_params *p, st_backend **out,
                                 st_error *err) {
    *out = NULL;
    st_cuda_params dp = st_cuda_default_params();
    if (!p) p = &dp;
    const st_cuda_entry *e = usable(p, "", err);
    if (!e) return ST_ERR_UNSUPPORTED;
    st_shard sh;
    const int world = p->comm ? p->comm->world : 1, rank = p->comm ? p->comm->rank : 0;
    st_status st = st_shard_make(m, rank, world, &sh, err);
    if (st != ST_OK) return st;
    st = e->create(m, p, &sh, out, err);
    if (st == ST_OK) (*out)->comm = p->comm;
    return st;
}

int st_backend_is_cuda(const st_backend *b) {
    pthread_mutex_lock(&g_load_mu);
    const st_cuda_entry *e = g_entry;
    pthread_mutex_unlock(&g_load_mu);
    return b && e && b->ops == e->ops;
}

int64_t st_backend_cuda_device_allocs(const st_backend *b) {
    return st_backend_is_cuda(b) ? g_entry->device_allocs(b) : 0;
}

void st_backend_cuda_memory(const st_backend *b, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (st_backend_is_cuda(b)) g_entry->memory(b, free_bytes, total_bytes);
}

double st_backend_cuda_copy_bandwidth(const st_backend *b, size_t bytes, double *read_gbs) {
    if (read_gbs) *read_gbs = 0.0;
    return st_backend_is_cuda(b) ? g_entry->bandwidth(b, bytes, read_gbs) : 0.0;
}

int st_bctx_cuda_time_ops(st_bctx *c, int on) {
    return c && st_backend_is_cuda(c->b) ? g_entry->time_ops(c, on) : -1;
}

void st_bctx_cuda_op_times(st_bctx *c, st_cuda_op_times *out) {
    memset(out, 0, sizeof *out);
    if (c && st_backend_is_cuda(c->b)) g_entry->op_times(c, out);
}

void st_bctx_cuda_graphs(const st_bctx *c, int64_t *captures, int64_t *launches) {
    *captures = *launches = 0;
    if (c && st_backend_is_cuda(c->b)) g_entry->graphs(c, captures, launches);
}

void st_backend_cuda_describe(const st_backend *b, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    if (st_backend_is_cuda(b)) g_entry->describe(b, buf, cap);
}

st_status st_cuda_vision_create(const st_cuda_params *p, const struct st_vision_tower *v,
                                struct st_vision_device **out, st_error *err) {
    *out = NULL;
    st_cuda_params dp = st_cuda_default_params();
    if (!p) p = &dp;
    const st_cuda_entry *e = usable(p, " for the vision tower", err);
    return e ? e->vision_create(v, p->device, out, err) : ST_ERR_UNSUPPORTED;
}
