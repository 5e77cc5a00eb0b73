/* ==== Choosing the device (see select.h) ==== */
#include "backend/select.h"

#include <stdio.h>
#include <string.h>

#include "dist/comm.h"
#include "vision/tower.h"

st_device_params st_device_default_params(void) {
    st_device_params p;
    p.kind = ST_DEVICE_AUTO;
    p.cpu = st_cpu_default_params();
    p.cuda = st_cuda_default_params();
    p.precision = ST_PRECISION_EXACT;
    return p;
}

int st_device_parse(const char *s, st_device_kind *out) {
    if (!s) return -1;
    if (!strcmp(s, "auto")) *out = ST_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = ST_DEVICE_CPU;
    else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) *out = ST_DEVICE_CUDA;
    else return -1;
    return 0;
}

int st_precision_parse(const char *s, st_precision *out) {
    if (!s) return -1;
    if (!strcmp(s, "exact")) *out = ST_PRECISION_EXACT;
    else if (!strcmp(s, "bf16")) *out = ST_PRECISION_BF16;
    else return -1;
    return 0;
}

st_status st_backend_create(const st_model *m, const st_device_params *p, st_backend **out, st_error *err) {
    st_device_params dp = st_device_default_params();
    if (!p) p = &dp;
    const st_comm *comm = p->cpu.comm;
    const int gpu = p->kind == ST_DEVICE_CUDA || (p->kind == ST_DEVICE_AUTO && st_cuda_available(&p->cuda, NULL, 0));
    if (comm && comm->world > 1 && !gpu) { /* a rank of a job: its shard, on the CPU */
        *out = NULL;
        if (p->precision != ST_PRECISION_EXACT)
            return st_error_set(err, ST_ERR_UNSUPPORTED, "--precision bf16 needs a GPU: the CPU backend computes exact only");
        st_shard sh;
        st_status st = st_shard_make(m, comm->rank, comm->world, &sh, err);
        if (st != ST_OK) return st;
        return st_backend_cpu_create(m, &p->cpu, &sh, out, err);
    }
    if (gpu) { /* the whole model, or under a job its rank's shard (p->cuda.comm) */
        st_cuda_params cp = p->cuda;
        cp.precision = p->precision;
        if (!cp.comm) cp.comm = (st_comm *)comm;
        return st_backend_cuda_create(m, &cp, out, err);
    }
    *out = NULL;
    if (p->precision != ST_PRECISION_EXACT)
        return st_error_set(err, ST_ERR_UNSUPPORTED, "--precision bf16 needs a GPU: the CPU backend computes exact only%s",
                            p->kind == ST_DEVICE_AUTO ? " (and no CUDA device is here)" : "");
    return st_backend_cpu_create(m, &p->cpu, NULL, out, err);
}

void st_backend_describe(const st_backend *b, char *buf, size_t cap) {
    if (st_backend_is_cpu(b)) {
        snprintf(buf, cap, "cpu (%s, %d threads)", st_backend_cpu_kernels(b)->name, st_backend_cpu_threads(b));
    } else if (st_backend_is_cuda(b)) {
        char d[400];
        st_backend_cuda_describe(b, d, sizeof d);
        snprintf(buf, cap, "cuda (%s)", d);
    } else {
        snprintf(buf, cap, "%s", b ? b->ops->name : "none");
    }
}

st_status st_vision_place(struct st_vision_tower *v, const st_device_params *p, st_error *err) {
    st_device_params dp = st_device_default_params();
    if (!p) p = &dp;
    if (p->kind == ST_DEVICE_CPU || (p->kind == ST_DEVICE_AUTO && !st_cuda_available(&p->cuda, NULL, 0))) return ST_OK;
    st_vision_device *d = NULL;
    st_status st = st_cuda_vision_create(&p->cuda, v, &d, err);
    if (st == ST_OK) st_vision_set_device(v, d);
    return st;
}
