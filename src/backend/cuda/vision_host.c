/* ==== The vision tower on the GPU: host side (see vision_cuda.h, vision_kernels.h) ====
 *
 * Built into libstrand-cuda.so: it uses nothing of libstrand but header-only definitions.
 *
 * Memory: the weights are uploaded once, at create, into one device block (each matrix
 * contiguous: bf16 and f32 as stored, f16 widened to f32 here; vectors fp32). The activations
 * are one device block sized for the most patches an encode has had (grown, never shrunk),
 * the attention's tile list another; all freed at destroy. One stream; each encode copies its
 * inputs in, runs, copies the embeddings out and waits for the stream.
 *
 * An encode of N patches (H hidden, W = max(3H, intermediate, patch_dim) floats a patch):
 *   E [N][H]   the residual stream
 *   A [N][H]   the LayerNorms' output, the positions (before the patch product), the
 *              attention's output O (between the attention and proj)
 *   Q [N][W]   the pixels, then per block qkv [N][3H] and the MLP's [N][I]; the merger's
 *              middle [N/m^2][m^2 H]
 *   R [2][N][hd] the rotary tables cs, sn
 *   Y [N/m^2][out_hidden] the embeddings
 */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cu_error.h"
#include "backend/cuda/vision_cuda.h"
#include "backend/cuda/vision_kernels.h"
#include "vision/tower.h"

#define VIS_LN_EPS 1e-6f /* the tower's LayerNorms (as vision/tower.c) */

/* ---------------------------------------------------------------------------------------- */
/* errors (cu_error.h: the shared object's own) */

/* ST_OK for cudaSuccess; else ST_ERR_NOMEM (allocation) or ST_ERR_INTERNAL naming `what` */
static st_status vcheck(st_error *err, int e, const char *what) {
    if (e == (int)cudaSuccess) return ST_OK;
    return cu_error_set(err, e == (int)cudaErrorMemoryAllocation ? ST_ERR_NOMEM : ST_ERR_INTERNAL,
                 "CUDA vision tower: %s: %s", what, cudaGetErrorString((cudaError_t)e));
}

/* ---------------------------------------------------------------------------------------- */
/* the device tower */

typedef struct vis_block {
    const float *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* device [H] */
    cu_vmat qkv, proj, fc1, fc2;                        /* device [3H][H], [H][H], [I][H], [H][I] */
    const float *qkv_b, *proj_b, *fc1_b, *fc2_b;        /* device [3H], [H], [I], [H] */
} vis_block;

typedef struct vis_dev {
    st_vision_device base; /* first: the handle the tower holds */
    int device;
    cudaStream_t stream;   /* owned */
    st_vision_config cfg;
    int64_t D, W;          /* patch_dim; the Q buffer's floats a patch */
    void *weights;         /* the device block every matrix and vector lies in (owned) */
    cu_vmat patch, mfc1, mfc2;                       /* [H][D], [M][M], [out][M] */
    const float *patch_b, *mnorm_w, *mnorm_b;        /* device [H] */
    const float *mfc1_b, *mfc2_b;                    /* device [M], [out] */
    vis_block *blocks;     /* [depth] host, owned (device pointers into weights) */
    void *act;             /* the activations' device block (owned), room for cap patches */
    int64_t cap;
    float *E, *A, *Q, *R, *Y; /* into act: see the top comment */
    int64_t *tiles_h;      /* [tiles_cap][3] host, owned: the attention's query tiles */
    int64_t *tiles_d;      /* [tiles_cap][3] device, owned */
    int64_t tiles_cap;
} vis_dev;

/* ---------------------------------------------------------------------------------------- */
/* the weights' upload: a sizing pass (base NULL) adds up the block's bytes, a second pass
 * copies each item to its place */

typedef struct vis_up {
    uint8_t *base;  /* the device block, or NULL while sizing */
    size_t off;     /* bytes so far */
    int e;          /* the first CUDA failure (cudaSuccess: none) */
    float *tmp;     /* host staging for f16 matrices, tmp_n floats (owned) */
    size_t tmp_n;
} vis_up;

static size_t up_align(size_t n) { return (n + 255) / 256 * 256; }

/* f16 (IEEE half) bits to fp32 */
static float vis_f16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0 && man == 0) {
        u = sign;
    } else if (exp == 0) { /* subnormal: normalized, each shift one lower exponent */
        uint32_t e = 113; /* 127 - 14: the exponent of 2^-14, less one a shift below */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((man & 0x3ffu) << 13);
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* a vector of n floats; its device address (NULL while sizing) */
static const float *up_vec(vis_up *u, const float *h, int64_t n) {
    const size_t bytes = (size_t)n * sizeof(float);
    float *dst = u->base ? (float *)(u->base + u->off) : NULL;
    u->off += up_align(bytes);
    if (dst && u->e == (int)cudaSuccess) u->e = (int)cudaMemcpy(dst, h, bytes, cudaMemcpyHostToDevice);
    return dst;
}

/* a matrix (f32, f16 or bf16; checked by the caller) as a contiguous device copy in *out */
static void up_mat(vis_up *u, const st_matrix *m, cu_vmat *out) {
    const int bf16 = m->fmt == ST_WFMT_BF16;
    const size_t es = bf16 ? 2 : 4, row = (size_t)m->cols * es;
    out->fmt = bf16 ? CU_VFMT_BF16 : CU_VFMT_F32;
    out->rows = m->rows;
    out->cols = m->cols;
    uint8_t *dst = u->base ? u->base + u->off : NULL;
    out->data = dst;
    u->off += up_align(row * (size_t)m->rows);
    if (!dst || u->e != (int)cudaSuccess) return;
    const int64_t ld = st_matrix_ld(m);
    if (m->fmt != ST_WFMT_F16) {
        const size_t sld = (size_t)ld * es;
        u->e = (int)cudaMemcpy2D(dst, row, m->data, sld, row, (size_t)m->rows, cudaMemcpyHostToDevice);
        return;
    }
    /* f16: widened on the host, some rows at a time */
    const size_t want = (size_t)m->cols > ((size_t)1 << 20) ? (size_t)m->cols : ((size_t)1 << 20);
    if (u->tmp_n < want) {
        free(u->tmp);
        u->tmp_n = 0;
        if (!(u->tmp = malloc(want * sizeof(float)))) {
            u->e = (int)cudaErrorMemoryAllocation;
            return;
        }
        u->tmp_n = want;
    }
    const int64_t per = (int64_t)(u->tmp_n / (size_t)m->cols);
    for (int64_t r0 = 0; r0 < m->rows && u->e == (int)cudaSuccess; r0 += per) {
        const int64_t nr = m->rows - r0 < per ? m->rows - r0 : per;
        for (int64_t r = 0; r < nr; r++) {
            const uint16_t *src = (const uint16_t *)m->data + (r0 + r) * ld;
            for (int64_t c = 0; c < m->cols; c++) u->tmp[r * m->cols + c] = vis_f16(src[c]);
        }
        u->e = (int)cudaMemcpy(dst + (size_t)r0 * row, u->tmp, (size_t)nr * row, cudaMemcpyHostToDevice);
    }
}

/* every weight, in one order for both passes */
static void up_all(vis_up *u, vis_dev *d, const st_vision_tower *v) {
    const st_vision_config *c = &v->cfg;
    const int64_t H = c->hidden, I = c->intermediate, M = (int64_t)c->merge * c->merge * H;
    up_mat(u, &v->patch, &d->patch);
    d->patch_b = up_vec(u, v->patch_b, H);
    for (int i = 0; i < c->depth; i++) {
        const st_vision_block *B = &v->blocks[i];
        vis_block *b = &d->blocks[i];
        b->norm1_w = up_vec(u, B->norm1_w, H);
        b->norm1_b = up_vec(u, B->norm1_b, H);
        b->norm2_w = up_vec(u, B->norm2_w, H);
        b->norm2_b = up_vec(u, B->norm2_b, H);
        up_mat(u, &B->qkv, &b->qkv);
        up_mat(u, &B->proj, &b->proj);
        up_mat(u, &B->fc1, &b->fc1);
        up_mat(u, &B->fc2, &b->fc2);
        b->qkv_b = up_vec(u, B->qkv_b, 3 * H);
        b->proj_b = up_vec(u, B->proj_b, H);
        b->fc1_b = up_vec(u, B->fc1_b, I);
        b->fc2_b = up_vec(u, B->fc2_b, H);
    }
    d->mnorm_w = up_vec(u, v->mnorm_w, H);
    d->mnorm_b = up_vec(u, v->mnorm_b, H);
    up_mat(u, &v->mfc1, &d->mfc1);
    d->mfc1_b = up_vec(u, v->mfc1_b, M);
    up_mat(u, &v->mfc2, &d->mfc2);
    d->mfc2_b = up_vec(u, v->mfc2_b, c->out_hidden);
}

/* a matrix the device takes: dense f32/f16/bf16 of [rows][cols] */
static st_status check_mat(const st_matrix *m, const char *name, int64_t rows, int64_t cols, st_error *err) {
    if (m->fmt != ST_WFMT_F32 && m->fmt != ST_WFMT_F16 && m->fmt != ST_WFMT_BF16)
        return cu_error_set(err, ST_ERR_UNSUPPORTED, "CUDA vision tower: %s is not f32, f16 or bf16", name);
    if (m->rows != rows || m->cols != cols || !m->data || st_matrix_ld(m) < cols)
        return cu_error_set(err, ST_ERR_SHAPE, "CUDA vision tower: %s is [%lld][%lld], expected [%lld][%lld]", name,
                     (long long)m->rows, (long long)m->cols, (long long)rows, (long long)cols);
    if (cols > ((int64_t)1 << 30))
        return cu_error_set(err, ST_ERR_UNSUPPORTED, "CUDA vision tower: %s has %lld columns", name, (long long)cols);
    return ST_OK;
}

static st_status check_tower(const st_vision_tower *v, st_error *err) {
    const st_vision_config *c = &v->cfg;
    if (c->depth < 0 || c->hidden < 1 || c->heads < 1 || c->head_dim < 2 || c->head_dim % 2 ||
        (int64_t)c->heads * c->head_dim != c->hidden || c->intermediate < 1 || c->out_hidden < 1 || c->merge < 1)
        return cu_error_set(err, ST_ERR_ARG, "CUDA vision tower: bad config (hidden %d, heads %d, head_dim %d)", c->hidden,
                     c->heads, c->head_dim);
    if (c->head_dim > CU_VIS_ATT_HD_MAX || c->heads > 65535)
        return cu_error_set(err, ST_ERR_UNSUPPORTED, "CUDA vision tower: head dims up to %d (the tower has %d heads of %d)",
                     CU_VIS_ATT_HD_MAX, c->heads, c->head_dim);
    const int64_t H = c->hidden, I = c->intermediate, M = (int64_t)c->merge * c->merge * H;
    const int64_t D = (int64_t)c->in_channels * c->temporal * c->patch * c->patch;
    st_status st;
    if ((st = check_mat(&v->patch, "patch_embed", H, D, err)) != ST_OK) return st;
    char name[64];
    for (int i = 0; i < c->depth; i++) {
        const st_vision_block *B = &v->blocks[i];
        snprintf(name, sizeof name, "blocks.%d.attn.qkv", i);
        if ((st = check_mat(&B->qkv, name, 3 * H, H, err)) != ST_OK) return st;
        snprintf(name, sizeof name, "blocks.%d.attn.proj", i);
        if ((st = check_mat(&B->proj, name, H, H, err)) != ST_OK) return st;
        snprintf(name, sizeof name, "blocks.%d.mlp.linear_fc1", i);
        if ((st = check_mat(&B->fc1, name, I, H, err)) != ST_OK) return st;
        snprintf(name, sizeof name, "blocks.%d.mlp.linear_fc2", i);
        if ((st = check_mat(&B->fc2, name, H, I, err)) != ST_OK) return st;
    }
    if ((st = check_mat(&v->mfc1, "merger.linear_fc1", M, M, err)) != ST_OK) return st;
    return check_mat(&v->mfc2, "merger.linear_fc2", c->out_hidden, M, err);
}

/* room for n patches in the activations (the stream is idle: each encode waits for it) */
static st_status ensure_act(vis_dev *d, int64_t n, st_error *err) {
    if (n <= d->cap) return ST_OK;
    const st_vision_config *c = &d->cfg;
    const int64_t H = c->hidden, hd = c->head_dim, m2 = (int64_t)c->merge * c->merge;
    const int64_t cap = (n + 63) / 64 * 64;
    const size_t e = up_align((size_t)(cap * H) * sizeof(float)), q = up_align((size_t)(cap * d->W) * sizeof(float));
    const size_t r = up_align((size_t)(2 * cap * hd) * sizeof(float));
    const size_t y = up_align((size_t)((cap + m2 - 1) / m2 * c->out_hidden) * sizeof(float));
    if (d->act) cudaFree(d->act);
    d->act = NULL;
    d->cap = 0;
    const int rc = (int)cudaMalloc(&d->act, 2 * e + q + r + y);
    if (rc != (int)cudaSuccess) {
        d->act = NULL;
        return cu_error_set(err, rc == (int)cudaErrorMemoryAllocation ? ST_ERR_NOMEM : ST_ERR_INTERNAL,
                     "CUDA vision tower: allocating %.1f MiB of activations for %lld patches: %s",
                     (double)(2 * e + q + r + y) / (1024.0 * 1024.0), (long long)n,
                     cudaGetErrorString((cudaError_t)rc));
    }
    uint8_t *p = d->act;
    d->E = (float *)p;
    d->A = (float *)(p + e);
    d->Q = (float *)(p + 2 * e);
    d->R = (float *)(p + 2 * e + q);
    d->Y = (float *)(p + 2 * e + q + r);
    d->cap = cap;
    return ST_OK;
}

/* room for n attention tiles (host and device) */
static st_status ensure_tiles(vis_dev *d, int64_t n, st_error *err) {
    if (n <= d->tiles_cap) return ST_OK;
    const int64_t cap = (n + 255) / 256 * 256;
    free(d->tiles_h);
    if (d->tiles_d) cudaFree(d->tiles_d);
    d->tiles_d = NULL;
    d->tiles_cap = 0;
    if (!(d->tiles_h = malloc((size_t)cap * 3 * sizeof(int64_t))))
        return cu_error_set(err, ST_ERR_NOMEM, "CUDA vision tower: out of memory for %lld attention tiles", (long long)n);
    const int rc = (int)cudaMalloc((void **)&d->tiles_d, (size_t)cap * 3 * sizeof(int64_t));
    if (rc != (int)cudaSuccess) {
        d->tiles_d = NULL;
        return vcheck(err, rc, "allocating the attention tiles");
    }
    d->tiles_cap = cap;
    return ST_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* the forward pass */

/* the blocks and the merger over the inputs already in place (E, R, tiles); out in Y */
static st_status run_tower(vis_dev *d, int64_t N, int64_t n_tiles, st_error *err) {
    const st_vision_config *c = &d->cfg;
    const cudaStream_t s = d->stream;
    const int nh = c->heads, hd = c->head_dim;
    const int64_t H = c->hidden, I = c->intermediate, m2 = (int64_t)c->merge * c->merge, M = m2 * H, NM = N / m2;
    const float *cs = d->R, *sn = d->R + N * hd;
    st_status st;
    for (int i = 0; i < c->depth; i++) {
        const vis_block *B = &d->blocks[i];
        if ((st = vcheck(err, cu_vis_layernorm(s, d->E, N, H, B->norm1_w, B->norm1_b, VIS_LN_EPS, d->A),
                         "norm1")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_gemm(s, &B->qkv, d->A, H, N, B->qkv_b, CU_VACT_NONE, NULL, 0, d->Q, 3 * H),
                         "qkv")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_rope(s, d->Q, N, nh, hd, cs, sn), "rotary")) != ST_OK) return st;
        if ((st = vcheck(err, cu_vis_attention(s, d->Q, n_tiles, d->tiles_d, nh, hd, d->A), "attention")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_gemm(s, &B->proj, d->A, H, N, B->proj_b, CU_VACT_NONE, d->E, H, d->E, H),
                         "proj")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_layernorm(s, d->E, N, H, B->norm2_w, B->norm2_b, VIS_LN_EPS, d->A),
                         "norm2")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_gemm(s, &B->fc1, d->A, H, N, B->fc1_b, CU_VACT_GELU_TANH, NULL, 0, d->Q, I),
                         "fc1")) != ST_OK)
            return st;
        if ((st = vcheck(err, cu_vis_gemm(s, &B->fc2, d->Q, I, N, B->fc2_b, CU_VACT_NONE, d->E, H, d->E, H),
                         "fc2")) != ST_OK)
            return st;
    }
    /* the merger: A [N][H] is [NM][M] as it lies */
    if ((st = vcheck(err, cu_vis_layernorm(s, d->E, N, H, d->mnorm_w, d->mnorm_b, VIS_LN_EPS, d->A),
                     "merger norm")) != ST_OK)
        return st;
    if ((st = vcheck(err, cu_vis_gemm(s, &d->mfc1, d->A, M, NM, d->mfc1_b, CU_VACT_GELU_ERF, NULL, 0, d->Q, M),
                     "merger fc1")) != ST_OK)
        return st;
    return vcheck(err, cu_vis_gemm(s, &d->mfc2, d->Q, M, NM, d->mfc2_b, CU_VACT_NONE, NULL, 0, d->Y, c->out_hidden),
                  "merger fc2");
}

static st_status vis_encode(st_vision_device *base, const float *pixels, int64_t N, const float *pos, const float *cs,
                            const float *sn, const int64_t (*seg)[2], int n_seg, float *out, st_error *err) {
    vis_dev *d = (vis_dev *)base;
    const st_vision_config *c = &d->cfg;
    const int64_t H = c->hidden, hd = c->head_dim, m2 = (int64_t)c->merge * c->merge;
    if (N <= 0) return ST_OK;
    if (N % m2)
        return cu_error_set(err, ST_ERR_ARG, "CUDA vision tower: %lld patches do not divide by the merge block %lld",
                     (long long)N, (long long)m2);
    if (!pixels || !pos || !cs || !sn || !seg || !out || n_seg < 1)
        return cu_error_set(err, ST_ERR_ARG, "CUDA vision tower: missing inputs");
    /* the segments must tile [0, N) in order */
    int64_t at = 0, n_tiles = 0;
    for (int i = 0; i < n_seg; i++) {
        if (seg[i][0] != at || seg[i][1] < 1 || seg[i][1] > N - at)
            return cu_error_set(err, ST_ERR_ARG,
                         "CUDA vision tower: segment %d (%lld, %lld) does not follow the previous ones (at %lld of "
                         "%lld patches)",
                         i, (long long)seg[i][0], (long long)seg[i][1], (long long)at, (long long)N);
        at += seg[i][1];
        n_tiles += (seg[i][1] + CU_VIS_ATT_Q - 1) / CU_VIS_ATT_Q;
    }
    if (at != N)
        return cu_error_set(err, ST_ERR_ARG, "CUDA vision tower: the segments cover %lld of %lld patches", (long long)at,
                     (long long)N);
    st_status st = vcheck(err, (int)cudaSetDevice(d->device), "selecting the device");
    if (st == ST_OK) st = ensure_act(d, N, err);
    if (st == ST_OK) st = ensure_tiles(d, n_tiles, err);
    if (st != ST_OK) return st;
    int64_t *tl = d->tiles_h;
    for (int i = 0; i < n_seg; i++)
        for (int64_t q = seg[i][0]; q < seg[i][0] + seg[i][1]; q += CU_VIS_ATT_Q, tl += 3) {
            tl[0] = q;
            tl[1] = seg[i][0];
            tl[2] = seg[i][0] + seg[i][1];
        }
    const cudaStream_t s = d->stream;
    const size_t f = sizeof(float);
    const int64_t NM = N / m2;
    if (st == ST_OK)
        st = vcheck(err, (int)cudaMemcpyAsync(d->Q, pixels, (size_t)(N * d->D) * f, cudaMemcpyHostToDevice, s),
                    "copying the pixels");
    if (st == ST_OK)
        st = vcheck(err, (int)cudaMemcpyAsync(d->A, pos, (size_t)(N * H) * f, cudaMemcpyHostToDevice, s),
                    "copying the positions");
    if (st == ST_OK)
        st = vcheck(err, (int)cudaMemcpyAsync(d->R, cs, (size_t)(N * hd) * f, cudaMemcpyHostToDevice, s),
                    "copying the rotary table");
    if (st == ST_OK)
        st = vcheck(err, (int)cudaMemcpyAsync(d->R + N * hd, sn, (size_t)(N * hd) * f, cudaMemcpyHostToDevice, s),
                    "copying the rotary table");
    if (st == ST_OK)
        st = vcheck(err, (int)cudaMemcpyAsync(d->tiles_d, d->tiles_h, (size_t)n_tiles * 3 * sizeof(int64_t),
                                              cudaMemcpyHostToDevice, s),
                    "copying the attention tiles");
    /* the patch embedding: E = pixels patch^T + patch_b + pos */
    if (st == ST_OK)
        st = vcheck(err, cu_vis_gemm(s, &d->patch, d->Q, d->D, N, d->patch_b, CU_VACT_NONE, d->A, H, d->E, H),
                    "patch embedding");
    if (st == ST_OK) st = run_tower(d, N, n_tiles, err);
    if (st == ST_OK)
        st = vcheck(err,
                    (int)cudaMemcpyAsync(out, d->Y, (size_t)(NM * c->out_hidden) * f, cudaMemcpyDeviceToHost, s),
                    "copying the embeddings");
    const int rc = (int)cudaStreamSynchronize(s);
    if (st == ST_OK) st = vcheck(err, rc, "running the tower");
    if (st == ST_OK) st = vcheck(err, (int)cudaGetLastError(), "running the tower");
    return st;
}

static void vis_destroy(st_vision_device *base) {
    vis_dev *d = (vis_dev *)base;
    if (!d) return;
    cudaSetDevice(d->device);
    if (d->stream) cudaStreamSynchronize(d->stream);
    if (d->act) cudaFree(d->act);
    if (d->tiles_d) cudaFree(d->tiles_d);
    if (d->weights) cudaFree(d->weights);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d->tiles_h);
    free(d->blocks);
    free(d);
}

st_status cuda_vision_create(const st_vision_tower *v, int device, st_vision_device **out, st_error *err) {
    *out = NULL;
    st_status st = check_tower(v, err);
    if (st != ST_OK) return st;
    if ((st = vcheck(err, (int)cudaSetDevice(device), "selecting the device")) != ST_OK) return st;
    const st_vision_config *c = &v->cfg;
    if ((st = vcheck(err, cu_vis_attention_init(c->head_dim), "preparing the attention kernel")) != ST_OK) return st;
    vis_dev *d = calloc(1, sizeof *d);
    if (!d) return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    d->base.encode = vis_encode;
    d->base.destroy = vis_destroy;
    d->device = device;
    d->cfg = *c;
    d->D = (int64_t)c->in_channels * c->temporal * c->patch * c->patch;
    d->W = 3 * (int64_t)c->hidden;
    if (c->intermediate > d->W) d->W = c->intermediate;
    if (d->D > d->W) d->W = d->D;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(d->base.name, sizeof d->base.name, "cuda (%.50s)", prop.name);
    else
        snprintf(d->base.name, sizeof d->base.name, "cuda (device %d)", device);
    if (c->depth > 0 && !(d->blocks = calloc((size_t)c->depth, sizeof *d->blocks))) {
        free(d);
        return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    st = vcheck(err, (int)cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "creating a stream");
    vis_up u = {0};
    if (st == ST_OK) {
        up_all(&u, d, v); /* sizing */
        const int rc = (int)cudaMalloc(&d->weights, u.off);
        if (rc != (int)cudaSuccess) {
            d->weights = NULL;
            st = cu_error_set(err, rc == (int)cudaErrorMemoryAllocation ? ST_ERR_NOMEM : ST_ERR_INTERNAL,
                       "CUDA vision tower: allocating %.1f MiB for the weights: %s",
                       (double)u.off / (1024.0 * 1024.0), cudaGetErrorString((cudaError_t)rc));
        }
    }
    if (st == ST_OK) {
        u.base = d->weights;
        u.off = 0;
        up_all(&u, d, v);
        st = vcheck(err, u.e, "copying the weights");
    }
    free(u.tmp);
    if (st != ST_OK) {
        vis_destroy(&d->base);
        return st;
    }
    *out = &d->base;
    return ST_OK;
}
