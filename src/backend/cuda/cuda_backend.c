/* ==== The CUDA backend: host side (see backend/cuda.h, cuda_kernels.h) ====
 *
 * Built into libstrand-cuda.so (with the kernels) and opened at run time by
 * backend/cuda_load.c. It uses nothing of libstrand but header-only helpers, so the shared
 * object stands alone.
 *
 * Memory: the weights are uploaded once into one device block (each matrix contiguous, in
 * its stored format; vectors in fp32); a context allocates its activations, the KV pool,
 * the state slots, the plan's device copy and pinned staging once. Every device allocation
 * goes through dev_alloc, which counts: a step allocates nothing.
 */
#include <assert.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/cu_error.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/nccl_comm.h"
#include "backend/cuda/vision_cuda.h"
#include "dist/comm.h"
#include "backend/moe_route.h"

#include <stddef.h>

/* the device writes compact rows in the host's layout */
_Static_assert(sizeof(cu_logit_top) == sizeof(st_logit_top) && CU_TOP_MAX == ST_TOP_MAX &&
                   offsetof(cu_logit_top, lse) == offsetof(st_logit_top, lse) &&
                   offsetof(cu_logit_top, id) == offsetof(st_logit_top, id) &&
                   offsetof(cu_logit_top, val) == offsetof(st_logit_top, val),
               "cu_logit_top is st_logit_top");
#include "model/model.h"

/* the depth of k_attn_ring's ring (2 or 3 chunks, at most what the device has the shared
 * memory for) for a decode step's attention split over the context (the same bits as
 * k_attn_split); -DCU_ATTN_RING=0 keeps k_attn_split. 2, as measured on an H100 side by side
 * (2026-12-06): after 4,096-token prompts batch 8 380.8 -> 389.6-390.0 tok/s and batch 1
 * 54.4 -> 55.3-55.4, after 32,768 batch 1 49.3 -> 51.0 (against k_attn_split with this
 * build's merge), at 128 positions batch 16 and 64 unchanged; 3 chunks (220 KB of shared
 * memory a block) slowed batch 16 at 128 positions by 2% (733 -> 718 tok/s) */
#ifndef CU_ATTN_RING
#define CU_ATTN_RING 2
#endif

/* ---------------------------------------------------------------------------------------- */
/* errors (cu_error.h: the shared object's own st_error_set) */

static st_status cuda_fail(st_error *err, cudaError_t e, const char *what) {
    return cu_error_set(err, e == cudaErrorMemoryAllocation ? ST_ERR_NOMEM : ST_ERR_INTERNAL, "CUDA: %s: %s", what,
                        cudaGetErrorString(e));
}

static size_t dtype_size(st_dtype d) { return d == ST_DTYPE_F32 ? 4 : 2; }
static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* ---------------------------------------------------------------------------------------- */
/* the backend */

typedef struct cl_layer {
    int kind, kind_index, has_shared;
    const float *input_norm, *post_norm;      /* device [d] */
    cu_mat w[ST_W_COUNT];
    const float *conv_t;                      /* [K][cd] tap-major */
    const float *dt_bias, *neg_exp_a, *gdn_norm;
    const float *q_norm, *k_norm;
    cu_mat router, sh_gate, sh_up, sh_down, sh_egate;
    cu_mat *exp_gate, *exp_up, *exp_down;     /* [E] host array of device matrices */
} cl_layer;

typedef struct cuda_backend {
    st_backend base;
    int device;
    char name[256];
    size_t total_mem;
    int64_t allocs;         /* device allocations made, ever */
    uint8_t *weights;       /* the device block of every weight and vector (owned) */
    size_t weight_bytes;
    cl_layer *layers;       /* [n_layers] host, owned */
    cu_mat *experts;        /* [n_layers][3][E] host, owned */
    cu_mat embed, lm_head;
    const float *final_norm, *inv_freq;
    const int32_t *rope_axis;   /* [rope_dim / 2] the M-RoPE axis (t, h, w) of each frequency */
    /* shapes: the shard's (base.shard; world 1: the model's). V is the whole vocabulary (the
     * logit rows' width), Vl the LM head rows this rank holds ([vocab0, vocab0 + Vl)), Vmax
     * the most any rank holds (the gathers' slices) */
    int64_t d, V, Vl, Vmax, vocab0, cd, kd, vd, I;
    int nh, nkv, hd, Hk, Hv, Dk, Dv, K, E, topk, norm_topk, rope_dim;
    int world, rank;
    struct st_comm *comm;   /* borrowed: the job (world > 1), or NULL */
    cu_nccl *nccl;          /* owned: the all-reduces and gathers over NCCL, or NULL (host) */
    uint8_t *gather;        /* [gather_bytes] host: a shard's matrix made contiguous for its upload */
    size_t gather_bytes;
    float eps;
    double upload_s;
    int mm_mode;            /* CU_MM_* for bf16 matrices */
    int gdn_chunked;        /* many-token steps take the chunked delta rule (`bf16` precision) */
    int attn_fw;            /* the device runs k_attn_fw (cu_attn_fw_init; `bf16` prompts, CU_ATTN_FW) */
    int attn_ring;          /* decode steps' split attention: k_attn_ring's depth (cu_attn_ring_init, CU_ATTN_RING), or 0 */
    int tiled;              /* bf16 matrices are stored tiled for the tensor cores (not in FMA mode) */
    int64_t tiled_cols;     /* the widest tiled matrix (the split activations' scratch) */
    /* the bits and group of every MLX tiled matrix where they are all one (qi_mixed 0): the
     * norm and SwiGLU then make the integer form's limbs (CU_QINT) */
    int qi_bits, qi_group, qi_mixed;
    size_t stage_bytes;     /* the largest tiled matrix, row-major (its device staging at upload) */
    uint16_t *stage;        /* that staging, during the upload only */
    int bf16_tiled;         /* some matrix is stored CU_FMT_BF16_TILED (`exact`'s products on cuBLASLt) */
    int blas;               /* products of many tokens may take cuBLASLt (the library opened): `bf16`'s,
                               and `exact`'s of bf16 tiled matrices where CU_BLAS_EXACT */
    char blas_what[200];    /* "cuBLASLt 13.1.0", or why it is not used */
} cuda_backend;

static const st_backend_ops cuda_ops;

static st_status dev_alloc(cuda_backend *b, size_t bytes, void **out, st_error *err) {
    *out = NULL;
    if (!bytes) bytes = 256;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        return cu_error_set(err, ST_ERR_NOMEM, "CUDA: cannot allocate %zu MiB on the device: %s", bytes >> 20,
                            cudaGetErrorString(e));
    }
    b->allocs++;
    return ST_OK;
}

/* Two passes over everything uploaded: the first sizes the block, the second copies. */
typedef struct uploader {
    cuda_backend *b;
    int copy;          /* 0: size only */
    size_t at;         /* bytes placed so far */
    cudaError_t err;
    int synthetic;     /* matrices are made on the device (st_model_synthetic) */
    uint64_t key;      /* the next synthetic matrix's seed */
    uint8_t *stage[2]; /* pinned staging [UP_STAGE] each (NULL: plain copies) */
    cudaStream_t stream;
    cudaEvent_t done[2];
    int turn;
} uploader;

#define UP_STAGE ((size_t)64 << 20)

/* room for bytes in the block, filled on the device (a synthetic matrix's part) */
static void *put_synth(uploader *u, size_t n, size_t elem, int kind, float a) {
    const size_t at = u->at;
    u->at += align256(n * elem);
    if (!u->copy) return NULL;
    cu_synth_fill(NULL, u->b->weights + at, n, kind, u->key++, a);
    return u->b->weights + at;
}

static void up_note(uploader *u, cudaError_t e) {
    if (e != cudaSuccess && u->err == cudaSuccess) u->err = e;
}

/* host bytes to the device through two pinned staging buffers: the copy of one buffer from
 * the (mapped) checkpoint overlaps the transfer of the other */
static void upload(uploader *u, uint8_t *dst, const uint8_t *src, size_t bytes) {
    if (!u->stage[0]) {
        up_note(u, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        return;
    }
    while (bytes) {
        const size_t n = bytes < UP_STAGE ? bytes : UP_STAGE;
        const int i = u->turn;
        up_note(u, cudaEventSynchronize(u->done[i])); /* its previous transfer is over */
        memcpy(u->stage[i], src, n);
        up_note(u, cudaMemcpyAsync(dst, u->stage[i], n, cudaMemcpyHostToDevice, u->stream));
        up_note(u, cudaEventRecord(u->done[i], u->stream));
        u->turn ^= 1;
        dst += n, src += n, bytes -= n;
    }
}

static const void *put(uploader *u, const void *host, size_t bytes) {
    const size_t at = u->at;
    u->at += align256(bytes);
    if (!u->copy || !bytes) return u->copy ? u->b->weights + at : NULL;
    upload(u, u->b->weights + at, (const uint8_t *)host, bytes);
    return u->b->weights + at;
}

/* room for bytes in the block, filled later (NULL while sizing) */
static void *put_room(uploader *u, size_t bytes) {
    const size_t at = u->at;
    u->at += align256(bytes);
    return u->copy ? u->b->weights + at : NULL;
}

static const float *put_vec(uploader *u, const float *v, size_t n) { return v ? put(u, v, n * sizeof(float)) : NULL; }

/* a bf16 matrix, tiled: through the device staging (row-major) into its place */
static const void *put_tiled(uploader *u, const void *host, int64_t rows, int64_t cols) {
    cuda_backend *b = u->b;
    const size_t at = u->at, raw = (size_t)rows * (size_t)cols * 2;
    u->at += align256(cu_tiled_elems(rows, cols) * 2);
    if (cols > b->tiled_cols) b->tiled_cols = cols;
    b->bf16_tiled = 1;
    if (raw > b->stage_bytes) b->stage_bytes = raw;
    if (!u->copy) return NULL;
    uint16_t *dst = (uint16_t *)(b->weights + at);
    upload(u, (uint8_t *)b->stage, (const uint8_t *)host, raw); /* on u->stream, as the tiling */
    cu_tile_bf16(u->stream, b->stage, rows, cols, dst);
    up_note(u, cudaGetLastError());
    return dst;
}

/* one more MLX tiled matrix of these bits and group */
static void note_q(cuda_backend *b, int bits, int group) {
    if (!b->qi_group) b->qi_bits = bits, b->qi_group = group;
    else if (b->qi_bits != bits || b->qi_group != group) b->qi_mixed = 1;
}

/* an MLX 4- or 8-bit matrix, Q tiled (cu_q_tileable): values, scales and biases through the
 * device staging into their places */
static void put_qtiled(uploader *u, const st_matrix *w, cu_mat *out) {
    cuda_backend *b = u->b;
    const size_t es = dtype_size(w->sdtype), db = (size_t)w->rows * (size_t)(w->cols * w->bits / 8);
    const size_t sb = (size_t)w->rows * (size_t)(w->cols / w->group) * es, raw = db + 2 * sb;
    const size_t gb = cu_qtiled_groups(w->rows, w->cols, w->group) * es;
    out->fmt = CU_FMT_Q_TILED;
    out->data = put_room(u, cu_qtiled_bytes(w->rows, w->cols, w->bits));
    out->scales = put_room(u, gb);
    out->biases = put_room(u, gb);
    if (w->cols > b->tiled_cols) b->tiled_cols = w->cols;
    note_q(b, w->bits, w->group);
    if (raw > b->stage_bytes) b->stage_bytes = raw;
    if (!u->copy) return;
    uint8_t *st = (uint8_t *)b->stage;
    upload(u, st, (const uint8_t *)w->data, db);
    upload(u, st + db, (const uint8_t *)w->scales, sb);
    upload(u, st + db + sb, (const uint8_t *)w->biases, sb);
    cu_tile_q(u->stream, st, st + db, st + db + sb, (int)es, w->rows, w->cols, w->bits, w->group, (void *)out->data,
              (void *)out->scales, (void *)out->biases);
    up_note(u, cudaGetLastError());
}

static void put_mat(uploader *u, const st_matrix *w, cu_mat *out) {
    memset(out, 0, sizeof *out);
    if (!w->rows) return;
    out->fmt = (int)w->fmt;
    out->rows = w->rows;
    out->cols = w->cols;
    const int tiled = u->b->tiled;
    if (u->synthetic) { /* bf16 uniform with std 1/sqrt(cols), or uniform q over the same range */
        const float half = sqrtf(3.0f / (float)w->cols);
        const size_t n = (size_t)w->rows * (size_t)w->cols;
        if (w->fmt == ST_WFMT_AFFINE) {
            out->bits = w->bits;
            out->group = w->group;
            out->sdtype = ST_DTYPE_BF16;
            const int qt = tiled && cu_q_tileable(w->bits, w->group, w->cols);
            const size_t ng = qt ? cu_qtiled_groups(w->rows, w->cols, w->group)
                                 : (size_t)w->rows * (size_t)(w->cols / w->group);
            if (qt) {
                out->fmt = CU_FMT_Q_TILED;
                if (w->cols > u->b->tiled_cols) u->b->tiled_cols = w->cols;
                note_q(u->b, w->bits, w->group);
            }
            out->data = put_synth(u, qt ? cu_qtiled_bytes(w->rows, w->cols, w->bits) / 4 : n * (size_t)w->bits / 32,
                                  4, CU_SYNTH_WORDS, 0);
            out->scales = put_synth(u, ng, 2, CU_SYNTH_BF16_CONST, 2 * half / (float)((1 << w->bits) - 1));
            out->biases = put_synth(u, ng, 2, CU_SYNTH_BF16_CONST, -half);
        } else if (tiled) {
            out->fmt = CU_FMT_BF16_TILED;
            if (w->cols > u->b->tiled_cols) u->b->tiled_cols = w->cols;
            u->b->bf16_tiled = 1;
            out->data = put_synth(u, cu_tiled_elems(w->rows, w->cols), 2, CU_SYNTH_BF16, half);
        } else {
            out->fmt = ST_WFMT_BF16;
            out->data = put_synth(u, n, 2, CU_SYNTH_BF16, half);
        }
        return;
    }
    if (!w->data) return;
    if (w->fmt == ST_WFMT_AFFINE && tiled && cu_q_tileable(w->bits, w->group, w->cols)) {
        out->bits = w->bits;
        out->group = w->group;
        out->sdtype = (int)w->sdtype;
        put_qtiled(u, w, out);
    } else if (w->fmt == ST_WFMT_AFFINE) {
        out->bits = w->bits;
        out->group = w->group;
        out->sdtype = (int)w->sdtype;
        const size_t es = dtype_size(w->sdtype), ng = (size_t)(w->cols / w->group);
        out->data = put(u, w->data, (size_t)w->rows * (size_t)(w->cols * w->bits / 8));
        out->scales = put(u, w->scales, (size_t)w->rows * ng * es);
        out->biases = put(u, w->biases, (size_t)w->rows * ng * es);
    } else if (w->fmt == ST_WFMT_BF16 && tiled) {
        out->fmt = CU_FMT_BF16_TILED;
        out->data = put_tiled(u, w->data, w->rows, w->cols);
    } else {
        const size_t es = w->fmt == ST_WFMT_F32 ? 4 : 2;
        out->data = put(u, w->data, (size_t)w->rows * (size_t)w->cols * es);
    }
}

/* ---- a shard's matrices: views of the model's (tensor/matrix.h's, header-only), made
 * contiguous in host memory for their upload ---- */

/* The views parts[n] (one width, one format) one under the other as one contiguous matrix:
 * in b->gather while copying (the sizing pass only counts its bytes), or the view itself
 * when it already is one. Valid until the next call. */
static st_matrix stacked(uploader *u, const st_matrix *parts, int n) {
    cuda_backend *b = u->b;
    st_matrix o = parts[0];
    for (int i = 1; i < n; i++) o.rows += parts[i].rows;
    const int contiguous = n == 1 && (!parts[0].ld || parts[0].ld == parts[0].cols);
    if (!parts[0].data || contiguous) {
        o.ld = 0;
        return o;
    }
    const int aff = o.fmt == ST_WFMT_AFFINE;
    const size_t es = aff ? dtype_size(o.sdtype) : o.fmt == ST_WFMT_F32 ? 4 : 2;
    const size_t drow = aff ? (size_t)(o.cols * o.bits / 8) : (size_t)o.cols * es;
    const size_t srow = aff ? (size_t)(o.cols / o.group) * es : 0;
    const size_t bytes = (size_t)o.rows * (drow + 2 * srow);
    if (bytes > b->gather_bytes) b->gather_bytes = bytes;
    o.ld = 0;
    if (!u->copy) return o; /* sizing: the shape, and data still set (so it is uploaded) */
    uint8_t *dp = b->gather, *sp = dp + (size_t)o.rows * drow, *bp = sp + (size_t)o.rows * srow;
    for (int i = 0; i < n; i++) {
        const st_matrix *w = &parts[i];
        const int64_t ld = w->ld ? w->ld : w->cols;
        const size_t dld = aff ? (size_t)(ld * w->bits / 8) : (size_t)ld * es;
        const size_t sld = aff ? (size_t)(ld / w->group) * es : 0;
        for (int64_t r = 0; r < w->rows; r++) {
            memcpy(dp, (const uint8_t *)w->data + (size_t)r * dld, drow), dp += drow;
            if (!aff) continue;
            memcpy(sp, (const uint8_t *)w->scales + (size_t)r * sld, srow), sp += srow;
            memcpy(bp, (const uint8_t *)w->biases + (size_t)r * sld, srow), bp += srow;
        }
    }
    o.data = b->gather;
    if (aff) {
        o.scales = b->gather + (size_t)o.rows * drow;
        o.biases = b->gather + (size_t)o.rows * (drow + srow);
    }
    return o;
}

/* the view v of w (its rows or its columns), uploaded: w itself where v is all of it, else
 * v made contiguous first */
static void put_view(uploader *u, const st_matrix *w, const st_matrix *v, cu_mat *out) {
    if (v->rows == w->rows && v->cols == w->cols) {
        put_mat(u, w, out);
        return;
    }
    const st_matrix g = stacked(u, v, 1);
    put_mat(u, &g, out);
}

/* rows [r0, r0 + n) of w, uploaded */
static void put_rows(uploader *u, const st_matrix *w, int64_t r0, int64_t n, cu_mat *out) {
    const st_matrix v = st_matrix_rows(w, r0, n);
    put_view(u, w, &v, out);
}

/* columns [c0, c0 + n) of w, uploaded */
static void put_cols(uploader *u, const st_matrix *w, int64_t c0, int64_t n, cu_mat *out) {
    const st_matrix v = st_matrix_cols(w, c0, n);
    put_view(u, w, &v, out);
}

/* every weight of the shard (world 1: of the model), through u */
static void put_model(uploader *u, const st_model *m, float *conv_tmp) {
    cuda_backend *b = u->b;
    const st_config *c = &m->cfg;
    const st_shard *s = &b->base.shard;
    put_mat(u, &m->embed, &b->embed); /* whole: a lookup reads only its rows */
    const st_matrix *head = m->tied ? &m->embed : &m->lm_head;
    if (m->tied && b->Vl == b->V) b->lm_head = b->embed;
    else put_rows(u, head, b->vocab0, b->Vl, &b->lm_head);
    /* the embedding and the head count for nothing in bf16_tiled: neither is a product of
     * many tokens on cuBLASLt (the head is wider than its copy's scratch) */
    b->bf16_tiled = 0;
    b->final_norm = put_vec(u, m->final_norm, (size_t)b->d);
    float *inv = conv_tmp; /* scratch: [K * cd] is at least rope_dim / 2 */
    for (int i = 0; i < c->rope_dim / 2; i++)
        inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->rope_dim));
    b->inv_freq = put_vec(u, inv, (size_t)(c->rope_dim / 2));
    int32_t axis[512];
    ST_ASSERT(c->rope_dim / 2 <= 512);
    for (int i = 0; i < c->rope_dim / 2; i++) axis[i] = st_config_mrope_axis(c, i);
    b->rope_axis = put(u, axis, (size_t)(c->rope_dim / 2) * sizeof(int32_t));
    for (int li = 0; li < c->n_layers; li++) {
        const st_layer *L = &m->layers[li];
        cl_layer *o = &b->layers[li];
        o->kind = L->kind;
        o->kind_index = L->kind_index;
        o->input_norm = put_vec(u, L->input_norm, (size_t)b->d);
        o->post_norm = put_vec(u, L->post_norm, (size_t)b->d);
        if (L->kind == ST_LAYER_LINEAR) {
            /* the local heads' q, k and v channels: three row sections of in_proj_qkv (and of
             * the conv's channels) */
            const int64_t kdg = st_config_key_dim(c);
            const int64_t sec[3][2] = {{(int64_t)s->lin_k0 * b->Dk, b->kd},
                                       {kdg + (int64_t)s->lin_k0 * b->Dk, b->kd},
                                       {2 * kdg + (int64_t)s->lin_v0 * b->Dv, b->vd}};
            if (b->world == 1) {
                put_mat(u, &L->in_qkv, &o->w[ST_W_IN_QKV]);
            } else {
                st_matrix parts[3];
                for (int k = 0; k < 3; k++) parts[k] = st_matrix_rows(&L->in_qkv, sec[k][0], sec[k][1]);
                const st_matrix g = stacked(u, parts, 3);
                put_mat(u, &g, &o->w[ST_W_IN_QKV]);
            }
            put_rows(u, &L->in_z, (int64_t)s->lin_v0 * b->Dv, b->vd, &o->w[ST_W_IN_Z]);
            put_rows(u, &L->in_b, s->lin_v0, b->Hv, &o->w[ST_W_IN_B]);
            put_rows(u, &L->in_a, s->lin_v0, b->Hv, &o->w[ST_W_IN_A]);
            put_cols(u, &L->out_proj, (int64_t)s->lin_v0 * b->Dv, b->vd, &o->w[ST_W_OUT_PROJ]);
            for (int k = 0, ch = 0; k < 3; k++) /* tap-major */
                for (int64_t e = 0; e < sec[k][1]; e++, ch++)
                    for (int j = 0; j < b->K; j++) conv_tmp[j * b->cd + ch] = L->conv_w[(sec[k][0] + e) * b->K + j];
            o->conv_t = put_vec(u, conv_tmp, (size_t)(b->K * b->cd));
            o->dt_bias = put_vec(u, L->dt_bias + s->lin_v0, (size_t)b->Hv);
            o->neg_exp_a = put_vec(u, L->neg_exp_a + s->lin_v0, (size_t)b->Hv);
            o->gdn_norm = put_vec(u, L->gdn_norm, (size_t)b->Dv);
        } else {
            const int64_t hd = b->hd;
            put_rows(u, &L->q_proj, (int64_t)s->head0 * 2 * hd, (int64_t)b->nh * 2 * hd, &o->w[ST_W_Q]);
            put_rows(u, &L->k_proj, (int64_t)s->kv_head0 * hd, (int64_t)b->nkv * hd, &o->w[ST_W_K]);
            put_rows(u, &L->v_proj, (int64_t)s->kv_head0 * hd, (int64_t)b->nkv * hd, &o->w[ST_W_V]);
            put_cols(u, &L->o_proj, (int64_t)s->head0 * hd, (int64_t)b->nh * hd, &o->w[ST_W_O]);
            o->q_norm = put_vec(u, L->q_norm, (size_t)b->hd);
            o->k_norm = put_vec(u, L->k_norm, (size_t)b->hd);
        }
        if (!c->is_moe) {
            put_rows(u, &L->gate, s->inter0, s->inter, &o->w[ST_W_GATE]);
            put_rows(u, &L->up, s->inter0, s->inter, &o->w[ST_W_UP]);
            put_cols(u, &L->down, s->inter0, s->inter, &o->w[ST_W_DOWN]);
            continue;
        }
        put_mat(u, &L->router, &o->router);
        o->exp_gate = b->experts + (size_t)li * 3 * (size_t)b->E;
        o->exp_up = o->exp_gate + b->E;
        o->exp_down = o->exp_up + b->E;
        for (int e = 0; e < b->E; e++) {
            put_rows(u, &L->exp_gate[e], s->moe_inter0, s->moe_inter, &o->exp_gate[e]);
            put_rows(u, &L->exp_up[e], s->moe_inter0, s->moe_inter, &o->exp_up[e]);
            put_cols(u, &L->exp_down[e], s->moe_inter0, s->moe_inter, &o->exp_down[e]);
        }
        o->has_shared = L->has_shared;
        if (L->has_shared) {
            put_rows(u, &L->sh_gate, s->shared_inter0, s->shared_inter, &o->sh_gate);
            put_rows(u, &L->sh_up, s->shared_inter0, s->shared_inter, &o->sh_up);
            put_cols(u, &L->sh_down, s->shared_inter0, s->shared_inter, &o->sh_down);
            put_mat(u, &L->sh_expert_gate, &o->sh_egate);
        }
    }
}

static void cuda_destroy(st_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b) return;
    if (b->weights) cudaFree(b->weights);
    cu_nccl_destroy(b->nccl);
    free(b->gather);
    free(b->layers);
    free(b->experts);
    free(b);
}

static int cuda_available(int device, char *why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver) {
        snprintf(why, cap, "no NVIDIA driver here, or one older than this CUDA runtime needs (%s)", cudaGetErrorString(e));
        return 0;
    }
    if (e != cudaSuccess) {
        snprintf(why, cap, "%s", cudaGetErrorString(e));
        return 0;
    }
    if (device < 0 || device >= n) {
        snprintf(why, cap, "device %d asked for; %d CUDA device%s here", device, n, n == 1 ? "" : "s");
        return 0;
    }
    return 1;
}

/* the fewest tokens of the precision's products on cuBLASLt (cuda_kernels.h): of bf16 tiled
 * matrices, blas_min_bf16; `bf16`'s MLX ones from CU_BLAS_Q_MIN_T */
static int blas_min_bf16(const cuda_backend *b) { return CU_BLAS_MIN_TOKENS(b->mm_mode == CU_MM_EXACT ? 3 : 1); }
static int blas_min_t(const cuda_backend *b) {
    const int t = blas_min_bf16(b);
    return b->mm_mode == CU_MM_BF16 && b->qi_group && CU_BLAS_Q_MIN_T < t ? CU_BLAS_Q_MIN_T : t;
}

/* whether the precision's products of blas_min_t tokens or more may take cuBLASLt: `bf16`'s
 * tiled ones (bf16 and MLX); `exact`'s where CU_BLAS_EXACT and there are bf16 tiled matrices
 * (MLX ones keep their own kernels there) */
static int blas_wanted(const cuda_backend *b) {
    return b->tiled && (b->mm_mode == CU_MM_BF16 || (CU_BLAS_EXACT && b->mm_mode == CU_MM_EXACT && b->bf16_tiled));
}

static st_status cuda_create(const st_model *m, const st_cuda_params *p, const st_shard *shard, st_backend **out,
                             st_error *err) {
    *out = NULL;
    if (m->cfg.is_moe && m->cfg.n_experts > 1024)
        return cu_error_set(err, ST_ERR_UNSUPPORTED, "the CUDA backend routes at most 1024 experts (the model has %d)",
                            m->cfg.n_experts);
    const int world = shard->world;
    if (world > 1 && (!p->comm || p->comm->world != world || p->comm->rank != shard->rank))
        return cu_error_set(err, ST_ERR_ARG, "a CUDA shard of %d ranks needs its job's communicator", world);
    /* the kernels map a local query head to a local KV head (and a GDN value head to its key
     * head) by the local ratio: every rank's heads must cover whole groups */
    {
        const st_config *mc = &m->cfg;
        const int g = mc->n_kv_heads ? mc->n_heads / mc->n_kv_heads : 1;
        const int lr = shard->n_kv_heads ? shard->n_heads / shard->n_kv_heads : 1;
        for (int j = 0; m->n_full && j < shard->n_heads; j++)
            if ((shard->head0 + j) / g - shard->kv_head0 != j / lr)
                return cu_error_set(err, ST_ERR_UNSUPPORTED,
                                    "the CUDA backend needs each rank's query heads to share whole KV heads: %d "
                                    "ranks give rank %d query heads %d..%d over KV heads %d..%d (use a world size "
                                    "that divides the %d KV heads, or one they divide)",
                                    world, shard->rank, shard->head0, shard->head0 + shard->n_heads - 1,
                                    shard->kv_head0, shard->kv_head0 + shard->n_kv_heads - 1, mc->n_kv_heads);
        const int gv = mc->lin_n_key_heads ? mc->lin_n_value_heads / mc->lin_n_key_heads : 1;
        const int lv = shard->lin_k_heads ? shard->lin_v_heads / shard->lin_k_heads : 1;
        for (int j = 0; m->n_linear && j < shard->lin_v_heads; j++)
            if ((shard->lin_v0 + j) / gv - shard->lin_k0 != j / lv)
                return cu_error_set(err, ST_ERR_UNSUPPORTED,
                                    "the CUDA backend needs each rank's GDN value heads to share whole key heads: "
                                    "%d ranks give rank %d value heads %d..%d over key heads %d..%d",
                                    world, shard->rank, shard->lin_v0, shard->lin_v0 + shard->lin_v_heads - 1,
                                    shard->lin_k0, shard->lin_k0 + shard->lin_k_heads - 1);
    }
    if (m->n_full > 0 && !cu_attention_fits(m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim))
        return cu_error_set(err, ST_ERR_UNSUPPORTED,
                            "the CUDA backend's attention takes at most 48 query heads a KV head and head dims up to 256 "
                            "(the model has %d heads over %d KV heads of %d dims)",
                            m->cfg.n_heads, m->cfg.n_kv_heads, m->cfg.head_dim);
    cudaError_t e = cudaSetDevice(p->device);
    if (e != cudaSuccess) return cuda_fail(err, e, "selecting the device");
    cu_mm_init();
    cu_attention_init(m->cfg.head_dim);
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    const st_config *c = &m->cfg;
    b->base.ops = &cuda_ops;
    b->base.m = m;
    b->base.logits_top = cu_logit_top_segs(m->cfg.vocab_size) > 0; /* compact rows made on the device (sample.cu) */
    b->base.shard = *shard;
    b->device = p->device;
    b->mm_mode = p->no_tensor_cores ? CU_MM_FMA : p->precision == ST_PRECISION_BF16 ? CU_MM_BF16 : CU_MM_EXACT;
    b->attn_fw = b->mm_mode == CU_MM_BF16 && m->n_full > 0 && cu_attn_fw_init(m->cfg.head_dim) == 0;
    if (CU_ATTN_RING && b->mm_mode != CU_MM_FMA && m->n_full > 0) {
        const int depth = cu_attn_ring_init(m->cfg.head_dim);
        b->attn_ring = depth < CU_ATTN_RING ? depth : CU_ATTN_RING;
    }
    b->tiled = b->mm_mode != CU_MM_FMA;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, p->device) == cudaSuccess) {
        snprintf(b->name, sizeof b->name, "%s", prop.name);
        b->total_mem = prop.totalGlobalMem;
    }
    b->world = world;
    b->rank = shard->rank;
    b->comm = world > 1 ? p->comm : NULL;
    b->d = c->hidden_size;
    b->V = c->vocab_size;
    b->Vl = shard->vocab;
    b->vocab0 = shard->vocab0;
    b->Vmax = (c->vocab_size + world - 1) / world; /* st_shard_vocab's widest slice (an even split) */
    ST_ASSERT(b->Vl <= b->Vmax);
    b->nh = shard->n_heads;
    b->nkv = shard->n_kv_heads;
    b->hd = c->head_dim;
    b->Hk = shard->lin_k_heads;
    b->Hv = shard->lin_v_heads;
    b->Dk = c->lin_key_head_dim;
    b->Dv = c->lin_value_head_dim;
    b->kd = (int64_t)b->Hk * b->Dk;
    b->vd = (int64_t)b->Hv * b->Dv;
    b->cd = 2 * b->kd + b->vd;
    b->K = c->conv_kernel;
    b->E = c->is_moe ? c->n_experts : 0;
    b->topk = c->is_moe ? c->n_experts_per_tok : 0;
    b->norm_topk = c->norm_topk_prob;
    b->rope_dim = c->rope_dim;
    b->eps = c->rms_norm_eps;
    int64_t I = c->is_moe ? 0 : shard->inter;
    if (c->is_moe && shard->moe_inter > I) I = shard->moe_inter;
    if (c->is_moe && shard->shared_inter > I) I = shard->shared_inter;
    b->I = I;
    b->layers = calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *b->layers);
    const size_t n_exp = c->is_moe ? (size_t)c->n_layers * 3 * (size_t)b->E : 1;
    b->experts = calloc(n_exp, sizeof *b->experts);
    const size_t tmp_n = (size_t)(b->K * b->cd) > (size_t)c->rope_dim ? (size_t)(b->K * b->cd) : (size_t)c->rope_dim + 1;
    float *tmp = malloc(tmp_n * sizeof(float));
    if (!b->layers || !b->experts || !tmp) {
        free(tmp);
        cuda_destroy(&b->base);
        return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    uploader u = {.b = b, .err = cudaSuccess, .synthetic = m->synthetic, .key = m->synth_seed};
    put_model(&u, m, tmp);
    b->weight_bytes = u.at;
    st_status st = dev_alloc(b, b->weight_bytes, (void **)&b->weights, err);
    if (st == ST_OK && b->stage_bytes && !m->synthetic) st = dev_alloc(b, b->stage_bytes, (void **)&b->stage, err);
    if (st == ST_OK && b->gather_bytes && !(b->gather = malloc(b->gather_bytes)))
        st = cu_error_set(err, ST_ERR_NOMEM, "out of memory for a %zu MiB shard matrix", b->gather_bytes >> 20);
    if (st == ST_OK) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        u = (uploader){.b = b, .copy = 1, .err = cudaSuccess, .synthetic = m->synthetic, .key = m->synth_seed};
        /* pinned staging when the host grants it (else plain, slower copies) */
        int staged = !m->synthetic && cudaStreamCreateWithFlags(&u.stream, cudaStreamNonBlocking) == cudaSuccess;
        for (int i = 0; i < 2 && staged; i++)
            staged = cudaMallocHost((void **)&u.stage[i], UP_STAGE) == cudaSuccess &&
                     cudaEventCreateWithFlags(&u.done[i], cudaEventDisableTiming) == cudaSuccess;
        if (!staged) {
            for (int i = 0; i < 2; i++) {
                if (u.stage[i]) cudaFreeHost(u.stage[i]);
                if (u.done[i]) cudaEventDestroy(u.done[i]);
                u.stage[i] = NULL;
                u.done[i] = NULL;
            }
            cudaGetLastError();
        } else {
            for (int i = 0; i < 2; i++) cudaEventRecord(u.done[i], u.stream);
        }
        put_model(&u, m, tmp);
        if (u.stream) {
            up_note(&u, cudaStreamSynchronize(u.stream));
            cudaStreamDestroy(u.stream);
        }
        for (int i = 0; i < 2; i++) {
            if (u.stage[i]) cudaFreeHost(u.stage[i]);
            if (u.done[i]) cudaEventDestroy(u.done[i]);
        }
        if (m->synthetic) {
            cudaError_t se = cudaDeviceSynchronize();
            if (se == cudaSuccess) se = cudaGetLastError();
            if (se != cudaSuccess && u.err == cudaSuccess) u.err = se;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        b->upload_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (u.err != cudaSuccess) st = cuda_fail(err, u.err, "uploading the weights");
    }
    if (b->stage) { /* cudaFree waits for the tiling kernels */
        cudaFree(b->stage);
        b->stage = NULL;
    }
    free(b->gather);
    b->gather = NULL;
    /* NCCL between the job's GPUs (or one GPU on its own), else the host over the job's comm */
    if (st == ST_OK && p->nccl) st = cu_nccl_create(b->comm, p->device, &b->nccl, err);
    if (st == ST_OK && m->n_linear && cu_gdn_prepare(b->Dk, b->Dv) != 0)
        st = cu_error_set(err, ST_ERR_UNSUPPORTED, "CUDA: a %dx%d delta-rule state head is not supported (key and value dims multiples of 4, key dims at most 256)",
                          b->Dk, b->Dv);
    /* the chunked rule's tf32 products are `bf16` precision's; `exact` keeps every step's
     * sums in one order, so a prefill's split into steps changes no bit */
    b->gdn_chunked = st == ST_OK && m->n_linear && b->mm_mode == CU_MM_BF16 && cu_gdn_chunked_prepare(b->Dk, b->Dv) == 0;
    /* prefill products on cuBLASLt where the library opens: `bf16`'s (else the backend's
     * wgmma), and `exact`'s of bf16 tiled matrices as three bf16 parts (else k_gemm) */
    if (st == ST_OK && blas_wanted(b)) {
        char why[300];
        cu_blas *h = cu_blas_create(why, sizeof why);
        if (h) {
            cu_blas_describe(h, b->blas_what, sizeof b->blas_what);
            cu_blas_destroy(h);
            b->blas = 1;
        } else
            snprintf(b->blas_what, sizeof b->blas_what, "%.190s", why);
    }
    free(tmp);
    if (st != ST_OK) {
        cuda_destroy(&b->base);
        return st;
    }
    *out = &b->base;
    return ST_OK;
}

static int64_t cuda_device_allocs(const st_backend *b) { return ((const cuda_backend *)b)->allocs; }

static void cuda_memory(const st_backend *base, size_t *free_bytes, size_t *total_bytes) {
    const cuda_backend *b = (const cuda_backend *)base;
    cudaSetDevice(b->device);
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) *free_bytes = *total_bytes = 0;
}

/* The device's bandwidth over two buffers of `bytes`, GB/s, best of several passes: the copy
 * (bytes read + written; the better of the copy kernel and cudaMemcpy, which on the H200
 * copy at 3.96 and 4.24 TB/s) and the read alone (read_gbs; 4.4-4.65 there: a decode step
 * only reads its weights). 0 on failure. */
static double cuda_bandwidth(const st_backend *base, size_t bytes, double *read_gbs) {
    const cuda_backend *b = (const cuda_backend *)base;
    cudaSetDevice(b->device);
    bytes = bytes / 4096 * 4096;
    float *src = NULL, *dst = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0, rbest = 0;
    if (cudaMalloc((void **)&src, bytes) == cudaSuccess && cudaMalloc((void **)&dst, bytes) == cudaSuccess &&
        cudaStreamCreate(&s) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        cudaMemsetAsync(src, 0, bytes, s);
        for (int pass = 0; pass < 24; pass++) { /* kernel copy, cudaMemcpy, read; the first of each warms up */
            const int kind = pass % 3;
            cudaEventRecord(e0, s);
            if (kind == 0) cu_copy(s, src, dst, (int64_t)(bytes / 4));
            else if (kind == 1) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
            else cu_read(s, src, bytes, (unsigned *)dst);
            cudaEventRecord(e1, s);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            const double gbs = ms > 0 ? (kind < 2 ? 2.0 : 1.0) * (double)bytes / (ms * 1e-3) / 1e9 : 0;
            if (pass < 3) continue;
            if (kind < 2 && gbs > best) best = gbs;
            if (kind == 2 && gbs > rbest) rbest = gbs;
        }
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    if (src) cudaFree(src);
    if (dst) cudaFree(dst);
    cudaGetLastError();
    if (read_gbs) *read_gbs = rbest;
    return best;
}

static void cuda_describe(const st_backend *base, char *buf, size_t cap) {
    const cuda_backend *b = (const cuda_backend *)base;
    static const char *modes[] = {"exact (tensor cores, 3-part bf16 activations)", "bf16 (tensor cores)",
                                  "exact (CUDA cores only)"};
    snprintf(buf, cap, "%s, %.1f GiB; weights %.2f GiB uploaded in %.2f s (%.1f GB/s); precision %s", b->name,
             (double)b->total_mem / (double)(1u << 30), (double)b->weight_bytes / (double)(1u << 30), b->upload_s,
             b->upload_s > 0 ? (double)b->weight_bytes / b->upload_s / 1e9 : 0.0, modes[b->mm_mode]);
    const size_t at = strlen(buf);
    char nc[96] = "";
    if (b->nccl) cu_nccl_describe(b->nccl, nc, sizeof nc);
    if (b->world > 1)
        snprintf(buf + at, cap > at ? cap - at : 0, "; rank %d of %d's shard, all-reduces over %s", b->rank, b->world,
                 b->nccl ? nc : "the host");
    else if (b->nccl)
        snprintf(buf + at, cap > at ? cap - at : 0, "; all-reduces over %s", nc);
    const size_t at2 = strlen(buf);
    const char *as = b->mm_mode == CU_MM_EXACT ? " as three bf16 parts" : "";
    if (blas_wanted(b) && b->blas) {
        snprintf(buf + at2, cap > at2 ? cap - at2 : 0, "; products of %d tokens or more on %s%s", blas_min_t(b),
                 b->blas_what, as);
        const size_t at3 = strlen(buf); /* (matmul_bf16.cu's launch_blas and blas_min_tiled) */
        const int wg = b->mm_mode == CU_MM_BF16 && b->tiled && CU_WG_BLAS_MIN_T > blas_min_bf16(b);
        if (blas_min_t(b) < blas_min_bf16(b))
            snprintf(buf + at3, cap > at3 ? cap - at3 : 0, " (MLX matrices; bf16 ones from %d%s)",
                     wg ? CU_WG_BLAS_MIN_T : blas_min_bf16(b), wg ? " where the device runs k_wgmma" : "");
        else if (wg)
            snprintf(buf + at3, cap > at3 ? cap - at3 : 0, " (bf16 matrices from %d where the device runs k_wgmma)",
                     CU_WG_BLAS_MIN_T);
    } else if (blas_wanted(b))
        snprintf(buf + at2, cap > at2 ? cap - at2 : 0, "; products of %d tokens or more on its own kernels (cuBLASLt: %s)",
                 blas_min_t(b), b->blas_what);
    const size_t at4 = strlen(buf); /* (matmul_q.cu's launch_qtiled) */
    if (CU_QS && b->mm_mode == CU_MM_BF16 && b->tiled && b->qi_group && cu_wgmma_available())
        snprintf(buf + at4, cap > at4 ? cap - at4 : 0,
                 "; MLX products of %d (8-bit) or %d (4-bit) to %d tokens on k_wgmma_qstream", CU_QS_MIN_T8,
                 CU_QS_MIN_T4, CU_WGMMA_MIN_T - 1);
}

/* ---------------------------------------------------------------------------------------- */
/* contexts */

#define LOGIT_CHUNK 64 /* logit rows computed per pass (the device buffer holds this many) */
#define XS_TOKENS 2048 /* the split activations' tokens: longer products run in slices of this many */

/* the most output rows of one launch of a layer's products (matrices reading one input share
 * a launch: gate and up; q, k and v; the four GDN input projections): the split products'
 * partial sums */
static int64_t widest_out(const cuda_backend *b) {
    int64_t w = b->d;
    const int64_t o[] = {2 * b->I, 2 * (int64_t)b->nh * b->hd + 2 * (int64_t)b->nkv * b->hd, b->cd + b->vd + 2 * (int64_t)b->Hv};
    for (size_t i = 0; i < sizeof o / sizeof o[0]; i++)
        if (o[i] > w) w = o[i];
    return w;
}

/* the row-major copy cuBLASLt reads a launch's matrices from: the most elements of one
 * launch's matrices side by side, each row padded to 32 columns (gate and up, q/k/v and the
 * GDN input projections read the hidden state; down, out_proj and o_proj one matrix each);
 * 0 where no product takes the library (no library, `exact` without CU_BLAS_EXACT or
 * without bf16 tiled matrices, steps of too few tokens). xs needs nothing more: it holds
 * three parts of xs_tokens at the widest width, the slice `exact` takes (`bf16` takes three
 * times as many tokens in its one part) */
static int64_t blas_wrm_elems(const cuda_backend *b, int64_t max_tokens) {
    if (!b->blas || max_tokens < blas_min_t(b)) return 0;
    const int64_t pad_d = (b->d + 31) / 32 * 32, in_w[] = {b->I, b->vd, (int64_t)b->nh * b->hd};
    int64_t n = widest_out(b) * pad_d;
    for (size_t i = 0; i < sizeof in_w / sizeof in_w[0]; i++)
        if (b->d * ((in_w[i] + 31) / 32 * 32) > n) n = b->d * ((in_w[i] + 31) / 32 * 32);
    return n;
}

/* k_wgmma_stream's scratch (bf16 products of few tokens, where the device runs wgmma): floats
 * of the partial sums and counts of row blocks, 0 in `exact` */
static size_t ws_floats(const cuda_backend *b) {
    if (b->mm_mode != CU_MM_BF16 || !b->tiled) return 0;
    const int64_t rows = widest_out(b) > b->V ? widest_out(b) : b->V;
    return cu_ws_part_elems() + (size_t)cu_ws_counts(rows);
}

/* decode attention split over the context: the chunks its scratch holds (every position of
 * the KV pool once, and a partial chunk a sequence), 0 where attention is not on the tensor
 * cores */
static int64_t split_chunks(const cuda_backend *b, const st_ctx_params *p) {
    if (!b->base.m->n_full || b->mm_mode == CU_MM_FMA || b->hd % 16 != 0) return 0;
    return ((int64_t)p->n_blocks * p->block_size + CU_ATT_CH - 1) / CU_ATT_CH + p->n_slots;
}

static int64_t xs_tokens(int64_t max_tokens) { return max_tokens < 16 ? 16 : max_tokens > XS_TOKENS ? XS_TOKENS : max_tokens; }

/* where each part of the plan sits in its staging (bytes from the start) */
typedef struct plan_layout {
    size_t tokens, item_t0, pos0, slot, block_t0, blocks, tok_item, rows, mrope, chunks, item_chunk, top_rows, total;
} plan_layout;

/* the most chunks of the chunked delta rule a step cuts (each item's last may be partial) */
static int64_t max_chunks_of(const st_ctx_params *p) { return (p->max_tokens + 63) / 64 + p->n_slots; }
/* the chunks the chunked rule's workspace holds: a step's chunks run in slabs of this many */
#ifndef CU_GDN_WS_CHUNKS
#define CU_GDN_WS_CHUNKS 32
#endif
static int64_t ws_chunks_of(const cuda_backend *b, const st_ctx_params *p) {
    if (!b->gdn_chunked) return 0;
    const int64_t n = max_chunks_of(p);
    return n < CU_GDN_WS_CHUNKS ? n : CU_GDN_WS_CHUNKS;
}
/* the workspace: the slabs' chunks, or the inputs the chunked conv saves before each chunk */
static size_t chunk_ws_floats(const cuda_backend *b, const st_ctx_params *p) {
    if (!b->gdn_chunked) return 0;
    const size_t rule =
        (size_t)CU_GDN_WS_SLABS * (size_t)ws_chunks_of(b, p) * (size_t)b->Hv * (size_t)cu_gdn_chunk_floats(b->Dk, b->Dv);
    const size_t conv = (size_t)max_chunks_of(p) * (size_t)(b->K - 1) * (size_t)b->cd;
    return rule > conv ? rule : conv;
}

/* an op of the forward pass, as called (kind and arguments) */
typedef struct g_op {
    int kind, layer, a, b, n;
    st_mm mm[4];
} g_op;

/* a decode step's captured graph, the op sequence it holds, or a refusal */
typedef struct g_slot {
    cudaGraphExec_t exec;
    g_op *ops;                  /* [n_ops] owned */
    int n_ops;
    int refused;                /* the step of this size once did something a graph cannot hold */
} g_slot;

enum { G_EAGER = 0, G_CAPTURE = 1, G_REPLAY = 2 };

/* the kinds of op timed for st_bctx_cuda_op_times */
enum { TK_EMBED, TK_NORM, TK_GDN_IN, TK_GDN_OUT, TK_QKV, TK_O, TK_GATE_UP, TK_DOWN, TK_GDN, TK_ATTN_PREP,
       TK_ATTENTION, TK_MOE, TK_LOGITS, TK_ALLREDUCE, TK_COUNT };
static const char *const tk_name[TK_COUNT] = {
    "embedding",        "norms (add + RMSNorm)", "GDN in-projections", "GDN out_proj",
    "attention q/k/v",  "attention o_proj",      "MLP gate/up + SwiGLU", "MLP down",
    "delta rule (conv, q/k norms, state steps, gated norm)", "q/k norm, RoPE, KV write", "attention",
    "MoE",              "LM head, logits to the host", "all-reduces (tensor parallelism)"};
enum { OP_EMBED = 1, OP_ADD_NORM, OP_MATMUL, OP_GDN, OP_ATTN_PREP, OP_ATTENTION, OP_ALLREDUCE };

typedef struct cuda_ctx {
    st_bctx base;
    cuda_backend *b;
    st_ctx_params p;
    cudaStream_t stream;
    /* activations (device, fp32) */
    float *x, *xn, *out, *p1, *p2, *p3, *p4, *mix, *gath, *gout, *lg, *small;
    cu_mm_scratch mms; /* the tiled products' scratch: xs [cu_split_elems(xs_tokens(T),
                          tiled_cols)] uint16, part [cu_mm_part_elems(T, widest_out)] floats;
                          device, owned */
    int xs_holds; /* the st_act buffer whose split xs holds now, or -1 */
    int xq_holds; /* the st_act buffer whose limbs mms.xq holds now (the integer form), or -1 */
    int h_bf16;   /* the st_act buffer (the MLP's gate output) holding h in bf16 [T][I] for the
                     down product next (cu_mlp_gate_up_bf16; its fp32 form never made), or -1 */
    float *chunk_ws;          /* the chunked delta rule's [chunk_ws_floats]; device, owned */
    int32_t *gdn_count;       /* [cu_gdn_counts(Hk)] zeros for the rule's decode kernels; device, owned */
    /* compact logit rows: each logit row's mode, the compact rows' places in their pass of
     * LOGIT_CHUNK rows (the plan's top_rows, in row order), the records */
    uint8_t *row_top;         /* [max_tokens] 1: the row is compact; host, owned */
    cu_logit_top *d_tops;     /* [LOGIT_CHUNK] device, owned */
    void *d_top_scratch;      /* [cu_logit_top_scratch(LOGIT_CHUNK, V)] bytes; device, owned */
    cu_logit_top *h_tops;     /* [LOGIT_CHUNK] pinned, owned */
    int n_chunks;             /* this step's chunks (0: the per-step rule) */
    float *att_split;         /* decode attention's chunks [cu_attn_split_floats(att_split_chunks)]; device, owned */
    int64_t att_split_chunks; /* 0: decode attention not split */
    int64_t w1, w2, w3, wm;
    /* tensor parallelism (world > 1, or NCCL on its own) */
    float *lg_part;           /* [LOGIT_CHUNK][Vmax] this rank's vocabulary slice of some logit rows; device, owned */
    float *lg_all;            /* NCCL: [world][LOGIT_CHUNK][Vmax] every rank's; device, owned */
    float *h_part;            /* host path: [max(T * d, LOGIT_CHUNK * Vmax)] pinned, owned */
    float *h_all;             /* host path: [world][max(T * d, LOGIT_CHUNK * Vmax)], owned */
    int comm_failed;          /* a collective failed this step: step_end reports comm_error */
    char comm_error[512];
    /* storage */
    void *kv;
    size_t kv_block_elems, kv_elem, kv_bytes;
    float *conv, *rec;
    size_t conv_slot, rec_slot; /* floats per slot */
    /* the plan: pinned staging, its device copy */
    uint8_t *h_plan, *d_plan;
    plan_layout layout;         /* of the plan's staging, fixed by the context's capacities */
    cu_plan plan;               /* device pointers of the current step */
    const st_step_plan *hp;     /* the host plan of the current step */
    int64_t T, max_item_tokens;
    /* MoE routing on the host: pinned */
    float *h_router;            /* [T][E] */
    int32_t *h_list, *d_list;   /* [T * topk] */
    float *h_w, *d_w;
    int32_t *h_sel;
    float *h_selw;
    cudaError_t first_error;
    size_t bytes;
    /* CUDA graphs of decode steps (see "graphs" below) */
    int graph_mode;             /* G_EAGER, G_CAPTURE or G_REPLAY for this step */
    int64_t graph_T;            /* the step's key: its token count (= item count) */
    g_op *log;                  /* [max_ops] the ops of the step being captured */
    int n_log, max_ops, at;     /* ops logged; capacity; replay: ops matched so far */
    g_slot *graphs;             /* [n_slots + 1] by token count; owned */
    int64_t graph_launches, graph_captures;
    /* op timing (st_bctx_cuda_time_ops): events in pairs, one pair an op of the step */
    int timing;
    cudaEvent_t *tev;           /* [2 * tev_pairs] owned, made on the first start */
    uint8_t *tev_kind;          /* [tev_pairs] the kind of each pair's op */
    int tev_pairs, tev_used;
    double tk_ms[TK_COUNT];
    int64_t tk_calls[TK_COUNT], untimed;
} cuda_ctx;

static void note(cuda_ctx *c, cudaError_t e) {
    if (e != cudaSuccess && c->first_error == cudaSuccess) c->first_error = e;
}

static size_t align8(size_t n) { return (n + 7) / 8 * 8; }

static plan_layout layout_of(const st_ctx_params *p, int64_t cap_blocks) {
    plan_layout l;
    size_t at = 0, T = (size_t)p->max_tokens, n = (size_t)p->n_slots;
    l.tokens = at, at += align8(T * 4);
    l.item_t0 = at, at += 8 * (n + 1);
    l.pos0 = at, at += 8 * n;
    l.slot = at, at += align8(4 * n);
    l.block_t0 = at, at += 8 * (n + 1);
    l.blocks = at, at += align8((size_t)cap_blocks * 4 + 4);
    l.tok_item = at, at += align8(T * 4);
    l.rows = at, at += align8(T * 4);
    l.mrope = at, at += align8(T * 12);
    l.chunks = at, at += (size_t)max_chunks_of(p) * 16;
    l.item_chunk = at, at += align8(4 * (n + 1));
    l.top_rows = at, at += align8(T * 4);
    l.total = at;
    return l;
}

static int64_t cap_blocks_of(const cuda_backend *b, const st_ctx_params *p) {
    const int64_t per = (p->max_seq_len + p->block_size - 1) / p->block_size, all = per * p->n_slots;
    return b->base.m->n_full ? (all < p->n_blocks ? all : p->n_blocks) : 0;
}

static void cuda_ctx_plan(const st_backend *base, const st_ctx_params *p, st_ctx_plan *out) {
    const cuda_backend *b = (const cuda_backend *)base;
    const st_model *m = b->base.m;
    const size_t kv_elem = p->kv_dtype == ST_KV_BF16 ? 2 : 4;
    out->kv_block_bytes = (size_t)m->n_full * 2 * (size_t)b->nkv * (size_t)p->block_size * (size_t)b->hd * kv_elem;
    out->slot_bytes = ((size_t)m->n_linear * (size_t)(b->K - 1) * (size_t)b->cd +
                       (size_t)m->n_linear * (size_t)b->Hv * (size_t)b->Dv * (size_t)b->Dk) * sizeof(float);
    const size_t T = (size_t)p->max_tokens;
    int64_t w1 = b->cd > 2 * b->nh * b->hd ? b->cd : 2 * b->nh * b->hd;
    if (b->I > w1) w1 = b->I;
    int64_t w2 = b->vd > b->nkv * b->hd ? b->vd : b->nkv * b->hd;
    if (b->I > w2) w2 = b->I;
    const int64_t w3 = b->Hv > b->nkv * b->hd ? b->Hv : b->nkv * b->hd;
    const int64_t wm = b->vd > b->nh * b->hd ? b->vd : b->nh * b->hd;
    size_t floats = T * (size_t)(5 * b->d + w1 + w2 + w3 + b->Hv + wm + 2) + (size_t)LOGIT_CHUNK * (size_t)b->V;
    floats += (cu_split_elems(xs_tokens(p->max_tokens), b->tiled_cols) + 1) / 2;
    floats += cu_mm_part_elems(p->max_tokens, widest_out(b)) + ws_floats(b);
    if (blas_wrm_elems(b, p->max_tokens)) floats += (size_t)(blas_wrm_elems(b, p->max_tokens) + 1) / 2 + CU_BLAS_WORKSPACE / 4;
    if (CU_QINT && b->tiled) floats += (cu_qint_bytes(b->tiled_cols) + 3) / 4;
    floats += cu_attn_split_floats(split_chunks(b, p), b->nh, b->hd);
    floats += cu_gdn_counts(b->Hk) + chunk_ws_floats(b, p) + (LOGIT_CHUNK * sizeof(cu_logit_top) + cu_logit_top_scratch(LOGIT_CHUNK, b->V)) / sizeof(float);
    if (b->world > 1) /* the logit slices and gathers (NCCL on the device, else through the host) */
        floats += (size_t)LOGIT_CHUNK * (size_t)b->Vmax * (b->nccl ? 1 + (size_t)b->world : 1);
    out->scratch_bytes = floats * sizeof(float) + 2 * layout_of(p, cap_blocks_of(b, p)).total +
                         T * (size_t)(b->E + 4 * b->topk + 2) * 4;
    out->total_bytes = (size_t)p->n_blocks * out->kv_block_bytes + (size_t)(p->n_slots + p->n_snapshots) * out->slot_bytes +
                       out->scratch_bytes;
}

static void cuda_ctx_destroy(st_bctx *base) {
    cuda_ctx *c = (cuda_ctx *)base;
    if (!c) return;
    cudaSetDevice(c->b->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    float *bufs[] = {c->x,   c->xn,   c->out, c->p1,   c->p2,   c->p3, c->p4, c->mix, c->gath,
                     c->gout, c->lg, c->small, (float *)c->mms.xs, c->mms.part, c->mms.wpart,
                     (float *)c->mms.wcount, (float *)c->mms.wrm, (float *)c->mms.blas_ws, (float *)c->mms.xq, c->att_split, c->conv, c->rec, c->d_w, c->chunk_ws, (float *)c->gdn_count,
                     (float *)c->d_tops, (float *)c->d_top_scratch, c->lg_part, c->lg_all};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    if (c->kv) cudaFree(c->kv);
    if (c->d_plan) cudaFree(c->d_plan);
    if (c->d_list) cudaFree(c->d_list);
    if (c->h_plan) cudaFreeHost(c->h_plan);
    if (c->h_tops) cudaFreeHost(c->h_tops);
    if (c->h_part) cudaFreeHost(c->h_part);
    free(c->h_all);
    free(c->row_top);
    if (c->h_router) cudaFreeHost(c->h_router);
    if (c->h_list) cudaFreeHost(c->h_list);
    if (c->h_w) cudaFreeHost(c->h_w);
    free(c->h_sel);
    free(c->h_selw);
    if (c->graphs)
        for (int i = 0; i <= c->p.n_slots; i++) {
            if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
            free(c->graphs[i].ops);
        }
    free(c->graphs);
    free(c->log);
    if (c->tev)
        for (int i = 0; i < 2 * c->tev_pairs; i++)
            if (c->tev[i]) cudaEventDestroy(c->tev[i]);
    free(c->tev);
    free(c->tev_kind);
    cu_blas_destroy(c->mms.blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

/* 1: a context with cuBLASLt runs two of the library's products of the hidden width at its
 * fewest tokens (fp32 and bf16 outputs, of zeroed scratch; their results overwritten before
 * anything reads them) before its first step: a process's first product on the
 * library took a few hundred ms more than the next ones (an H100, 2026-12-06: the first
 * 2,048-token prefill at 4,473-6,028 tok/s against 9,400 after it), which a server's first
 * long prompt would otherwise pay. A failure here is the first step's to meet. */
#ifndef CU_BLAS_WARM
#define CU_BLAS_WARM 1
#endif
static void blas_warm(cuda_ctx *c) {
    const cuda_backend *b = c->b;
    const int64_t T = blas_min_t(b), ld = (b->d + 31) / 32 * 32;
    if (!c->mms.blas || !c->mms.wrm || c->p.max_tokens < T || b->d * ld > c->mms.wrm_elems ||
        T * ld > c->mms.xs_elems)
        return;
    if (cudaMemsetAsync(c->mms.wrm, 0, (size_t)(b->d * ld) * 2, c->stream) != cudaSuccess ||
        cudaMemsetAsync(c->mms.xs, 0, (size_t)(T * ld) * 2, c->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    (void)cu_blas_gemm_to(c->mms.blas, c->stream, c->mms.wrm, ld, b->d, b->d, c->mms.xs, ld, T, c->x, b->d, 0, 0,
                          c->mms.blas_ws, c->mms.blas_ws_bytes);
    (void)cu_blas_gemm_to(c->mms.blas, c->stream, c->mms.wrm, ld, b->d, b->d, c->mms.xs, ld, T, c->out, b->d, 1, 0,
                          c->mms.blas_ws, c->mms.blas_ws_bytes);
    (void)cudaStreamSynchronize(c->stream);
    (void)cudaGetLastError();
}

static st_status cuda_ctx_create(st_backend *base, const st_ctx_params *p, st_bctx **out, st_error *err) {
    *out = NULL;
    cuda_backend *b = (cuda_backend *)base;
    const st_model *m = b->base.m;
    if (p->max_tokens < 1 || p->n_slots < 1 || p->block_size < 1 || p->max_seq_len < 1 || p->n_blocks < 0 ||
        p->n_snapshots < 0 || p->n_snapshots > (1 << 20))
        return cu_error_set(err, ST_ERR_ARG, "context: bad parameters");
    cudaSetDevice(b->device);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    c->base.b = base;
    c->b = b;
    c->p = *p;
    st_status st = ST_OK;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return cuda_fail(err, e, "creating a stream");
    }
    const int64_t T = p->max_tokens;
    c->w1 = b->cd > 2 * b->nh * b->hd ? b->cd : 2 * b->nh * b->hd;
    if (b->I > c->w1) c->w1 = b->I;
    c->w2 = b->vd > b->nkv * b->hd ? b->vd : b->nkv * b->hd;
    if (b->I > c->w2) c->w2 = b->I;
    c->w3 = b->Hv > b->nkv * b->hd ? b->Hv : b->nkv * b->hd;
    c->wm = b->vd > b->nh * b->hd ? b->vd : b->nh * b->hd;
    struct { float **p; int64_t n; } acts[] = {
        {&c->x, T * b->d},   {&c->xn, T * b->d},  {&c->out, T * b->d}, {&c->p1, T * c->w1},
        {&c->p2, T * c->w2}, {&c->p3, T * c->w3}, {&c->p4, T * (b->Hv ? b->Hv : 1)}, {&c->mix, T * c->wm},
        {&c->gath, T * b->d}, {&c->gout, T * b->d}, {&c->lg, (int64_t)LOGIT_CHUNK * b->V}, {&c->small, 2 * T},
        {(float **)&c->mms.xs, (int64_t)(cu_split_elems(xs_tokens(T), b->tiled_cols) + 1) / 2},
        {&c->mms.part, (int64_t)cu_mm_part_elems(T, widest_out(b))},
    };
    c->mms.xs_tokens = xs_tokens(T);
    c->mms.part_elems = (int64_t)cu_mm_part_elems(T, widest_out(b));
    /* `bf16` products of many tokens on Hopper's wgmma where the device runs it (`exact` keeps
     * k_gemm: its summation order is the few-token kernels', so a token's bits do not depend
     * on the batch; but for products of CU_BLAS_EXACT_MIN_T tokens or more on cuBLASLt where
     * CU_BLAS_EXACT) */
    c->mms.tma_encode = b->mm_mode == CU_MM_BF16 && b->tiled ? cu_wgmma_available() : NULL;
    c->mms.ws_clusters = c->mms.tma_encode ? cu_wgmma_stream_clusters(0) : 0; /* (a build's CU_WS_CL > 1) */
    c->mms.wg_clusters = c->mms.tma_encode ? cu_wgmma_clusters(0) : 0;        /* (a build's CU_WG_PERSIST) */
    c->mms.xs_elems = (int64_t)cu_split_elems(xs_tokens(T), b->tiled_cols);
    for (size_t i = 0; i < sizeof acts / sizeof acts[0] && st == ST_OK; i++) {
        st = dev_alloc(b, (size_t)acts[i].n * sizeof(float), (void **)acts[i].p, err);
        c->bytes += (size_t)acts[i].n * sizeof(float);
    }
    /* the few-token wgmma products' pieces and counts (the counts start at 0; every product
     * leaves them so) */
    if (st == ST_OK && c->mms.tma_encode && ws_floats(b)) {
        const int64_t counts = (int64_t)(ws_floats(b) - cu_ws_part_elems());
        st = dev_alloc(b, cu_ws_part_elems() * sizeof(float), (void **)&c->mms.wpart, err);
        if (st == ST_OK) st = dev_alloc(b, (size_t)counts * sizeof(int32_t), (void **)&c->mms.wcount, err);
        if (st == ST_OK && (e = cudaMemset(c->mms.wcount, 0, (size_t)counts * sizeof(int32_t))) != cudaSuccess)
            st = cuda_fail(err, e, "clearing the products' counts");
        c->mms.wpart_elems = (int64_t)cu_ws_part_elems();
        c->mms.wcount_n = counts;
        c->bytes += ws_floats(b) * sizeof(float);
    }
    /* cuBLASLt's handle, the row-major copy of a launch's matrices and the library's workspace */
    if (st == ST_OK && blas_wrm_elems(b, T)) {
        char why[300];
        c->mms.blas = cu_blas_create(why, sizeof why);
    }
    /* (a handle the library refuses leaves this context on its own kernels, as a missing
     * library does: launch_blas declines without blas and wrm) */
    if (st == ST_OK && c->mms.blas) {
        c->mms.wrm_elems = blas_wrm_elems(b, T);
        c->mms.blas_ws_bytes = CU_BLAS_WORKSPACE;
        if (st == ST_OK) st = dev_alloc(b, (size_t)c->mms.wrm_elems * 2, (void **)&c->mms.wrm, err);
        if (st == ST_OK) st = dev_alloc(b, CU_BLAS_WORKSPACE, &c->mms.blas_ws, err);
        c->bytes += (size_t)c->mms.wrm_elems * 2 + CU_BLAS_WORKSPACE;
    }
    /* MLX products on integer tensor cores: the activations' limbs */
    if (st == ST_OK && CU_QINT && b->tiled) {
        st = dev_alloc(b, cu_qint_bytes(b->tiled_cols), (void **)&c->mms.xq, err);
        c->bytes += cu_qint_bytes(b->tiled_cols);
    }
    /* the all-reduces' and the logit gathers' buffers */
    if (st == ST_OK && b->world > 1) {
        const size_t lg = (size_t)LOGIT_CHUNK * (size_t)b->Vmax, red = (size_t)T * (size_t)b->d;
        const size_t hn = lg > red ? lg : red;
        st = dev_alloc(b, lg * sizeof(float), (void **)&c->lg_part, err);
        c->bytes += lg * sizeof(float);
        if (st == ST_OK && b->nccl) {
            st = dev_alloc(b, (size_t)b->world * lg * sizeof(float), (void **)&c->lg_all, err);
            c->bytes += (size_t)b->world * lg * sizeof(float);
        } else if (st == ST_OK) {
            if ((e = cudaMallocHost((void **)&c->h_part, hn * sizeof(float))) != cudaSuccess)
                st = cuda_fail(err, e, "pinned staging");
            c->h_all = malloc((size_t)b->world * hn * sizeof(float));
            if (st == ST_OK && !c->h_all) st = cu_error_set(err, ST_ERR_NOMEM, "out of memory");
        }
    }
    /* the GDN decode kernels' counts (zeros; every launch leaves them so) */
    if (st == ST_OK && b->Hk > 0) {
        st = dev_alloc(b, cu_gdn_counts(b->Hk) * sizeof(int32_t), (void **)&c->gdn_count, err);
        if (st == ST_OK && (e = cudaMemset(c->gdn_count, 0, cu_gdn_counts(b->Hk) * sizeof(int32_t))) != cudaSuccess)
            st = cuda_fail(err, e, "clearing the delta rule's counts");
        c->bytes += cu_gdn_counts(b->Hk) * sizeof(int32_t);
    }
    /* decode attention's chunks */
    c->att_split_chunks = split_chunks(b, p);
    if (st == ST_OK && c->att_split_chunks) {
        const size_t n = cu_attn_split_floats(c->att_split_chunks, b->nh, b->hd);
        st = dev_alloc(b, n * sizeof(float), (void **)&c->att_split, err);
        c->bytes += n * sizeof(float);
    }
    /* the chunked delta rule's workspace */
    if (st == ST_OK && chunk_ws_floats(b, p)) {
        st = dev_alloc(b, chunk_ws_floats(b, p) * sizeof(float), (void **)&c->chunk_ws, err);
        c->bytes += chunk_ws_floats(b, p) * sizeof(float);
    }
    /* the KV pool and the state slots */
    c->kv_elem = p->kv_dtype == ST_KV_BF16 ? 2 : 4;
    c->kv_block_elems = (size_t)m->n_full * 2 * (size_t)b->nkv * (size_t)p->block_size * (size_t)b->hd;
    c->kv_bytes = (size_t)p->n_blocks * c->kv_block_elems * c->kv_elem;
    c->conv_slot = (size_t)m->n_linear * (size_t)(b->K - 1) * (size_t)b->cd;
    c->rec_slot = (size_t)m->n_linear * (size_t)b->Hv * (size_t)b->Dv * (size_t)b->Dk;
    if (st == ST_OK) st = dev_alloc(b, c->kv_bytes, &c->kv, err);
    const size_t n_states = (size_t)(p->n_slots + p->n_snapshots); /* sequences, then snapshots */
    if (st == ST_OK) st = dev_alloc(b, n_states * c->conv_slot * sizeof(float), (void **)&c->conv, err);
    if (st == ST_OK) st = dev_alloc(b, n_states * c->rec_slot * sizeof(float), (void **)&c->rec, err);
    c->bytes += c->kv_bytes + n_states * (c->conv_slot + c->rec_slot) * sizeof(float);
    /* the plan */
    plan_layout l = layout_of(p, cap_blocks_of(b, p));
    c->layout = l;
    if (st == ST_OK) st = dev_alloc(b, l.total, (void **)&c->d_plan, err);
    if (st == ST_OK && (e = cudaMallocHost((void **)&c->h_plan, l.total)) != cudaSuccess)
        st = cuda_fail(err, e, "pinned staging");
    c->bytes += 2 * l.total;
    /* compact logit rows */
    if (st == ST_OK) st = dev_alloc(b, LOGIT_CHUNK * sizeof(cu_logit_top), (void **)&c->d_tops, err);
    if (st == ST_OK && b->base.logits_top) {
        st = dev_alloc(b, cu_logit_top_scratch(LOGIT_CHUNK, b->V), &c->d_top_scratch, err);
        c->bytes += cu_logit_top_scratch(LOGIT_CHUNK, b->V);
    }
    if (st == ST_OK && (e = cudaMallocHost((void **)&c->h_tops, LOGIT_CHUNK * sizeof(cu_logit_top))) != cudaSuccess)
        st = cuda_fail(err, e, "pinned staging");
    c->row_top = calloc((size_t)T, 1);
    if (st == ST_OK && !c->row_top) st = cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    c->bytes += 2 * LOGIT_CHUNK * sizeof(cu_logit_top);
    /* MoE routing */
    if (st == ST_OK && b->E) {
        const size_t nk = (size_t)T * (size_t)b->topk;
        if ((e = cudaMallocHost((void **)&c->h_router, (size_t)T * (size_t)b->E * sizeof(float))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&c->h_list, nk * sizeof(int32_t))) != cudaSuccess ||
            (e = cudaMallocHost((void **)&c->h_w, nk * sizeof(float))) != cudaSuccess)
            st = cuda_fail(err, e, "pinned staging");
        if (st == ST_OK) st = dev_alloc(b, nk * sizeof(int32_t), (void **)&c->d_list, err);
        if (st == ST_OK) st = dev_alloc(b, nk * sizeof(float), (void **)&c->d_w, err);
        c->h_sel = malloc(nk * sizeof(int32_t));
        c->h_selw = malloc(nk * sizeof(float));
        if (st == ST_OK && (!c->h_sel || !c->h_selw)) st = cu_error_set(err, ST_ERR_NOMEM, "out of memory");
        c->bytes += nk * 16 + (size_t)T * (size_t)b->E * 4;
    }
    /* graphs: MoE steps sync with the host (routing), so only dense models capture */
    c->max_ops = 16 * (m->cfg.n_layers + 1) + 8;
    c->log = calloc((size_t)c->max_ops, sizeof *c->log);
    c->graphs = calloc((size_t)p->n_slots + 1, sizeof *c->graphs);
    if (st == ST_OK && (!c->log || !c->graphs)) st = cu_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (st != ST_OK) {
        cuda_ctx_destroy(&c->base);
        return st;
    }
    if (CU_BLAS_WARM) blas_warm(c);
    *out = &c->base;
    return ST_OK;
}

static size_t cuda_ctx_bytes(const st_bctx *base) { return ((const cuda_ctx *)base)->bytes; }

/* ---------------------------------------------------------------------------------------- */
/* a step */

static void graph_begin(cuda_ctx *c, const st_step_plan *pl);

static st_status cuda_step_begin(st_bctx *base, const st_step_plan *pl, st_error *err) {
    cuda_ctx *c = (cuda_ctx *)base;
    cudaSetDevice(c->b->device);
    c->first_error = cudaSuccess;
    c->hp = pl;
    c->T = pl->n_tokens;
    c->xs_holds = c->xq_holds = c->h_bf16 = -1;
    const plan_layout l = c->layout;
    const int n = pl->n_items;
    const int64_t nb = pl->block_t0[n];
    uint8_t *h = c->h_plan;
    memcpy(h + l.tokens, pl->tokens, (size_t)pl->n_tokens * 4);
    memcpy(h + l.item_t0, pl->item_t0, (size_t)(n + 1) * 8);
    memcpy(h + l.pos0, pl->pos0, (size_t)n * 8);
    memcpy(h + l.slot, pl->slot, (size_t)n * 4);
    memcpy(h + l.block_t0, pl->block_t0, (size_t)(n + 1) * 8);
    if (nb) memcpy(h + l.blocks, pl->blocks, (size_t)nb * 4);
    int32_t *ti = (int32_t *)(h + l.tok_item), *rows = (int32_t *)(h + l.rows), *m3 = (int32_t *)(h + l.mrope);
    /* every token's (t, h, w) rotary positions: the plan's (M-RoPE), else its position on every axis */
    if (pl->mrope) memcpy(m3, pl->mrope, (size_t)pl->n_tokens * 12);
    int64_t nr = 0;
    c->max_item_tokens = 0;
    for (int i = 0; i < n; i++) {
        const int64_t t0 = pl->item_t0[i], t1 = pl->item_t0[i + 1];
        if (t1 - t0 > c->max_item_tokens) c->max_item_tokens = t1 - t0;
        for (int64_t t = t0; t < t1; t++) ti[t] = i;
        if (!pl->mrope)
            for (int64_t t = t0; t < t1; t++) m3[3 * t] = m3[3 * t + 1] = m3[3 * t + 2] = (int32_t)(pl->pos0[i] + t - t0);
        if (pl->logits[i] == ST_LOGITS_ALL)
            for (int64_t t = t0; t < t1; t++) c->row_top[nr] = 0, rows[nr++] = (int32_t)t;
        else if (pl->logits[i] == ST_LOGITS_LAST || pl->logits[i] == ST_LOGITS_LAST_TOP)
            c->row_top[nr] = pl->logits[i] == ST_LOGITS_LAST_TOP && c->b->base.logits_top, rows[nr++] = (int32_t)(t1 - 1);
    }
    /* the compact rows' places in their logits pass */
    {
        int32_t *tr = (int32_t *)(h + l.top_rows);
        int64_t k = 0;
        for (int64_t r = 0; r < nr; r++)
            if (c->row_top[r]) tr[k++] = (int32_t)(r % LOGIT_CHUNK);
    }
    /* the chunked delta rule's chunks: 64 tokens from each item's start, the last partial */
    c->n_chunks = 0;
    if (c->b->gdn_chunked && c->max_item_tokens >= CU_GDN_CHUNKED_MIN) {
        int32_t *ch = (int32_t *)(h + l.chunks), *ic = (int32_t *)(h + l.item_chunk);
        for (int i = 0; i < n; i++) {
            ic[i] = c->n_chunks;
            for (int64_t t = pl->item_t0[i]; t < pl->item_t0[i + 1]; t += 64) {
                const int64_t left = pl->item_t0[i + 1] - t;
                int32_t *e = ch + 4 * c->n_chunks++;
                e[0] = (int32_t)t, e[1] = (int32_t)(left < 64 ? left : 64), e[2] = i, e[3] = 0;
            }
        }
        ic[n] = c->n_chunks;
    }
    note(c, cudaMemcpyAsync(c->d_plan, h, l.total, cudaMemcpyHostToDevice, c->stream));
    uint8_t *d = c->d_plan;
    c->plan = (cu_plan){.n_items = n,
                        .n_tokens = pl->n_tokens,
                        .tokens = (const int32_t *)(d + l.tokens),
                        .item_t0 = (const int64_t *)(d + l.item_t0),
                        .pos0 = (const int64_t *)(d + l.pos0),
                        .slot = (const int32_t *)(d + l.slot),
                        .block_t0 = (const int64_t *)(d + l.block_t0),
                        .blocks = (const int32_t *)(d + l.blocks),
                        .tok_item = (const int32_t *)(d + l.tok_item),
                        .rows = (const int32_t *)(d + l.rows),
                        .mrope = (const int32_t *)(d + l.mrope)};
    /* a sequence's first step starts from zero state */
    for (int i = 0; i < n; i++) {
        if (pl->pos0[i] != 0) continue;
        const size_t s = (size_t)pl->slot[i];
        if (c->conv_slot) note(c, cudaMemsetAsync(c->conv + s * c->conv_slot, 0, c->conv_slot * sizeof(float), c->stream));
        if (c->rec_slot) note(c, cudaMemsetAsync(c->rec + s * c->rec_slot, 0, c->rec_slot * sizeof(float), c->stream));
    }
    if (c->first_error != cudaSuccess) return cuda_fail(err, c->first_error, "starting a step");
    graph_begin(c, pl);
    return ST_OK;
}

static float *act(cuda_ctx *c, st_act a) {
    switch (a) {
    case ST_ACT_X: return c->x;
    case ST_ACT_XN: return c->xn;
    case ST_ACT_OUT: return c->out;
    case ST_ACT_P1: return c->p1;
    case ST_ACT_P2: return c->p2;
    case ST_ACT_P3: return c->p3;
    case ST_ACT_P4: return c->p4;
    case ST_ACT_MIX: return c->mix;
    default: return NULL;
    }
}

/* op timing: an event before the op and one after (nothing when not timing, or past the
 * step's pairs) */
static void tm_start(cuda_ctx *c) {
    if (c->timing && c->tev_used < c->tev_pairs) note(c, cudaEventRecord(c->tev[2 * c->tev_used], c->stream));
}

static void tm_stop(cuda_ctx *c, int kind) {
    if (!c->timing) return;
    if (c->tev_used >= c->tev_pairs) {
        c->untimed++;
        return;
    }
    note(c, cudaEventRecord(c->tev[2 * c->tev_used + 1], c->stream));
    c->tev_kind[c->tev_used++] = (uint8_t)kind;
}

/* after the step's stream has synchronized: its pairs into the sums */
static void tm_collect(cuda_ctx *c) {
    for (int i = 0; i < c->tev_used; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->tev[2 * i], c->tev[2 * i + 1]) == cudaSuccess) {
            c->tk_ms[c->tev_kind[i]] += ms;
            c->tk_calls[c->tev_kind[i]]++;
        }
    }
    c->tev_used = 0;
}

/* the timed kind of a product by the (first) weight it reads */
static int tm_kind_of(st_wid w) {
    switch (w) {
    case ST_W_IN_QKV: case ST_W_IN_Z: case ST_W_IN_B: case ST_W_IN_A: return TK_GDN_IN;
    case ST_W_OUT_PROJ: return TK_GDN_OUT;
    case ST_W_Q: case ST_W_K: case ST_W_V: return TK_QKV;
    case ST_W_O: return TK_O;
    case ST_W_GATE: case ST_W_UP: return TK_GATE_UP;
    default: return TK_DOWN;
    }
}

static void do_embed(cuda_ctx *c) {
    c->xs_holds = c->xq_holds = -1;
    cu_embed(c->stream, &c->b->embed, c->plan.tokens, c->T, c->x);
}

/* the parts of the split activations (tiled products), 0 when there are none */
static int split_parts(const cuda_ctx *c) {
    return c->b->tiled && c->T <= 16 ? (c->b->mm_mode == CU_MM_BF16 ? 1 : 3) : 0;
}

/* the parts a kernel making a product's input of `width` columns splits it into as it
 * writes it (xs holds that wide a split), 0: none */
static int xs_parts_for(const cuda_ctx *c, int64_t width) { return width <= c->b->tiled_cols ? split_parts(c) : 0; }

/* whether a kernel making a product's input of `width` columns makes the integer form's limbs
 * (CU_QINT, one MLX bits and group, the few tokens xq holds) instead of the split */
static int qi_fused(const cuda_ctx *c, int64_t width) {
    const cuda_backend *b = c->b;
    return c->mms.xq && b->qi_group && !b->qi_mixed && c->T <= 16 && width % b->qi_group == 0 &&
           width <= b->tiled_cols;
}

static void do_add_norm(cuda_ctx *c, int layer, st_norm which, int mode) {
    const float *w = which == ST_NORM_FINAL ? c->b->final_norm
                     : which == ST_NORM_INPUT ? c->b->layers[layer].input_norm
                                              : c->b->layers[layer].post_norm;
    const int apply = (mode & ST_NORM_APPLY) != 0, qi = apply && qi_fused(c, c->b->d);
    const int parts = apply && !qi ? xs_parts_for(c, c->b->d) : 0;
    const int made = cu_add_norm(c->stream, c->x, c->out, w, c->xn, c->T, c->b->d, c->b->eps, mode & ST_NORM_ADD, apply,
                                 parts ? c->mms.xs : NULL, parts, qi ? c->mms.xq : NULL, c->b->qi_group, c->b->qi_bits);
    c->xs_holds = parts ? ST_ACT_XN : (c->xs_holds == ST_ACT_XN ? -1 : c->xs_holds);
    c->xq_holds = made ? ST_ACT_XN : (c->xq_holds == ST_ACT_XN ? -1 : c->xq_holds);
}

/* The `bf16` MLP of many tokens with its intermediates in bf16 (cuda_kernels.h): gate, up
 * and SwiGLU into h (bf16, in the lower half of the gate output's buffer; gate's bf16 output
 * in its upper half, up's in the up output's, or both there side by side with
 * CU_BLAS_GU_ONE), which the down product then reads as it is.
 * 0, or -1 where cu_mlp_gate_up_bf16 does not take them (the fp32 path then). */
static int mlp_bf16(cuda_ctx *c, const cl_layer *L, st_act in, const st_mm *mm) {
    const cu_mat *g = &L->w[mm[0].w], *u = &L->w[mm[1].w];
    uint16_t *hb = (uint16_t *)act(c, mm[0].out), *ub = (uint16_t *)act(c, mm[1].out);
    /* (the buffers hold T x I floats each: twice T x I bf16) */
    if (cu_mlp_gate_up_bf16(c->stream, g, u, act(c, in), g->cols, c->T, hb + c->T * g->rows, ub, hb, &c->mms) != 0)
        return -1;
    c->xs_holds = c->xq_holds = -1;
    c->h_bf16 = (int)mm[0].out;
    return 0;
}

static void do_matmul(cuda_ctx *c, int layer, st_act in, const st_mm *mm, int n, int swiglu) {
    const cl_layer *L = &c->b->layers[layer];
    if (c->h_bf16 >= 0) { /* the down product of mlp_bf16's h: the only op that reads it (ST_SWIGLU_TO_NEXT) */
        assert((int)in == c->h_bf16 && n == 1 && !swiglu);
        const cu_mat *w = &L->w[mm[0].w];
        cu_matmul_bf16_in(c->stream, w, (const uint16_t *)act(c, in), w->cols, c->T, act(c, mm[0].out), w->rows, &c->mms);
        c->h_bf16 = -1;
        if ((int)mm[0].out == c->xs_holds) c->xs_holds = -1;
        if ((int)mm[0].out == c->xq_holds) c->xq_holds = -1;
        return;
    }
    if (swiglu == ST_SWIGLU_TO_NEXT && n == 2 && c->b->mm_mode == CU_MM_BF16 && mlp_bf16(c, L, in, mm) == 0) return;
    const float *x = act(c, in);
    for (int i0 = 0; i0 < n; i0 += 4) { /* up to 4 a launch */
        const int k = n - i0 < 4 ? n - i0 : 4;
        const cu_mat *w[4];
        float *y[4];
        int64_t ldy[4];
        for (int i = 0; i < k; i++) {
            w[i] = &L->w[mm[i0 + i].w];
            y[i] = act(c, mm[i0 + i].out);
            ldy[i] = w[i]->rows;
        }
        const int kept = cu_matmul_group(c->stream, k, w, y, ldy, x, w[0]->cols, c->T, c->b->mm_mode, &c->mms,
                                         c->xs_holds == (int)in, c->xq_holds == (int)in);
        if (kept & CU_MM_XS_LOST) c->xs_holds = -1;
        if ((kept & CU_MM_XS) && split_parts(c)) c->xs_holds = (int)in;
        if ((kept & CU_MM_XQ) && c->b->qi_group && !c->b->qi_mixed) c->xq_holds = (int)in;
        for (int i = 0; i < k; i++) {
            if ((int)mm[i0 + i].out == c->xs_holds) c->xs_holds = -1;
            if ((int)mm[i0 + i].out == c->xq_holds) c->xq_holds = -1;
        }
    }
    if (swiglu) {
        const cu_mat *g = &L->w[mm[0].w];
        const int qi = qi_fused(c, g->rows), parts = qi ? 0 : xs_parts_for(c, g->rows);
        const int made = cu_silu_mul(c->stream, act(c, mm[0].out), act(c, mm[1].out), c->T, g->rows, g->rows,
                                     parts ? c->mms.xs : NULL, parts, qi ? c->mms.xq : NULL, c->b->qi_group,
                                     c->b->qi_bits);
        c->xs_holds = parts ? (int)mm[0].out : -1;
        c->xq_holds = made ? (int)mm[0].out : -1;
    }
}

static void do_gdn(cuda_ctx *c, int layer) {
    c->xs_holds = c->xq_holds = -1;
    const cuda_backend *b = c->b;
    const cl_layer *L = &b->layers[layer];
    cu_gdn_args a = {
        .qkv = c->p1, .z = c->p2, .b = c->p3, .a = c->p4, .mix = c->mix, .conv_t = L->conv_t,
        .conv_state = c->conv + (size_t)L->kind_index * (size_t)(b->K - 1) * (size_t)b->cd, .conv_stride = c->conv_slot,
        .rec_state = c->rec + (size_t)L->kind_index * (size_t)b->Hv * (size_t)b->Dv * (size_t)b->Dk,
        .rec_stride = c->rec_slot, .dt_bias = L->dt_bias, .neg_exp_a = L->neg_exp_a, .norm_w = L->gdn_norm,
        .K = b->K, .Hk = b->Hk, .Hv = b->Hv, .Dk = b->Dk, .Dv = b->Dv, .cd = b->cd, .kd = b->kd, .vd = b->vd,
        .eps = b->eps,
        .chunks = (const int32_t *)(c->d_plan + c->layout.chunks), .item_chunk = (const int32_t *)(c->d_plan + c->layout.item_chunk),
        .n_chunks = c->n_chunks, .chunk_ws = c->chunk_ws, .ws_chunks = (int)ws_chunks_of(b, &c->p)};
    const int qi = qi_fused(c, b->vd), parts = qi ? 0 : xs_parts_for(c, b->vd); /* out_proj's input */
    a.xs = parts ? c->mms.xs : NULL;
    a.parts = parts;
    a.xq = qi ? c->mms.xq : NULL, a.qgroup = b->qi_group, a.qbits = b->qi_bits;
    a.counts = c->gdn_count;
    const int made = cu_gdn(c->stream, &c->plan, &a, (int)c->max_item_tokens);
    if (made & CU_MM_XS) c->xs_holds = ST_ACT_MIX;
    if (made & CU_MM_XQ) c->xq_holds = ST_ACT_MIX;
}

static cu_kv kv_of(const cuda_ctx *c) {
    cu_kv kv = {.base = c->kv, .bf16 = c->p.kv_dtype == ST_KV_BF16, .block_size = c->p.block_size,
                .nkv = c->b->nkv, .hd = c->b->hd, .n_full = c->b->base.m->n_full};
    return kv;
}

static cu_attn_args attn_args(cuda_ctx *c, int layer) {
    const cuda_backend *b = c->b;
    const cl_layer *L = &b->layers[layer];
    cu_attn_args a = {.q = c->p1, .k = c->p2, .v = c->p3, .mix = c->mix, .q_norm = L->q_norm, .k_norm = L->k_norm,
                      .inv_freq = b->inv_freq, .rope_axis = b->rope_axis, .nh = b->nh, .nkv = b->nkv, .hd = b->hd, .rope_dim = b->rope_dim,
                      .li = L->kind_index, .eps = b->eps,
                      .parts = b->mm_mode == CU_MM_EXACT ? 3 : b->mm_mode == CU_MM_BF16 ? 1 : 0,
                      .split = c->att_split, .split_chunks = c->att_split_chunks, .fw = b->attn_fw,
                      .ring = b->attn_ring};
    return a;
}

static void do_attn_prep(cuda_ctx *c, int layer) {
    c->xs_holds = c->xq_holds = -1;
    cu_attn_args a = attn_args(c, layer);
    cu_kv kv = kv_of(c);
    cu_attn_prep(c->stream, &c->plan, &a, &kv);
}

static void do_attention(cuda_ctx *c, int layer) {
    c->xs_holds = c->xq_holds = -1;
    cu_attn_args a = attn_args(c, layer);
    cu_kv kv = kv_of(c);
    const int parts = xs_parts_for(c, (int64_t)c->b->nh * c->b->hd); /* o_proj's input */
    a.xs = parts ? c->mms.xs : NULL;
    a.xs_parts = parts;
    if (cu_attention(c->stream, &c->plan, &a, &kv)) c->xs_holds = ST_ACT_MIX;
}

/* ---- tensor parallelism ---- */

static void comm_fail(cuda_ctx *c, const char *why) {
    if (c->comm_failed) return;
    c->comm_failed = 1;
    snprintf(c->comm_error, sizeof c->comm_error, "%s", why);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* recv[world][n] (host) = every rank's send[n] (host) over the job's communicator */
static int host_allgather(cuda_ctx *c, const float *send, int64_t n, float *recv) {
    struct st_comm *m = c->b->comm;
    if (c->comm_failed) return -1;
    if (m->broken || m->ops->allgather(m, send, (size_t)n * sizeof(float), recv) != 0) {
        char why[320];
        snprintf(why, sizeof why, "all-gather over %d ranks failed: %.250s", m->world, m->error);
        comm_fail(c, why);
        return -1;
    }
    return 0;
}

/* buf[n] (device) = its sum over the ranks: NCCL's on the device, or every rank's partial
 * through the host, added in rank order (as dist/comm.c's st_comm_allreduce_sum: every rank
 * the same bits) */
static void do_allreduce(cuda_ctx *c, st_act a) {
    cuda_backend *b = c->b;
    float *buf = act(c, a);
    const int64_t n = c->T * b->d;
    if (b->nccl) {
        if (cu_nccl_allreduce(b->nccl, buf, (size_t)n, c->stream)) comm_fail(c, cu_nccl_error(b->nccl));
        if (b->comm) b->comm->allreduces++;
        return;
    }
    const double t0 = now_s();
    note(c, cudaMemcpyAsync(c->h_part, buf, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
    if (host_allgather(c, c->h_part, n, c->h_all)) return;
    for (int64_t e = 0; e < n; e++) {
        float sum = c->h_all[e];
        for (int r = 1; r < b->world; r++) sum += c->h_all[(int64_t)r * n + e];
        c->h_part[e] = sum;
    }
    note(c, cudaMemcpyAsync(buf, c->h_part, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    b->comm->allreduces++;
    b->comm->allreduce_s += now_s() - t0;
}

/* lg[n][V] (device) = every rank's slice lg_part[n][Vmax] in its vocabulary columns */
static void gather_logits(cuda_ctx *c, int64_t n) {
    cuda_backend *b = c->b;
    const size_t slice = (size_t)n * (size_t)b->Vmax;
    const float *all = c->lg_all;
    enum cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
    const double t0 = now_s();
    if (b->nccl) {
        if (cu_nccl_allgather(b->nccl, c->lg_part, c->lg_all, slice, c->stream)) {
            comm_fail(c, cu_nccl_error(b->nccl));
            return;
        }
    } else {
        note(c, cudaMemcpyAsync(c->h_part, c->lg_part, slice * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
        note(c, cudaStreamSynchronize(c->stream));
        if (host_allgather(c, c->h_part, (int64_t)slice, c->h_all)) return;
        all = c->h_all;
        kind = cudaMemcpyHostToDevice;
    }
    for (int k = 0; k < b->world; k++) { /* st_shard_vocab's even split */
        const int64_t v0 = b->V * k / b->world, nv = b->V * (k + 1) / b->world - v0;
        note(c, cudaMemcpy2DAsync(c->lg + v0, (size_t)b->V * sizeof(float), all + (size_t)k * slice,
                                  (size_t)b->Vmax * sizeof(float), (size_t)nv * sizeof(float), (size_t)n, kind, c->stream));
    }
    if (!b->nccl) note(c, cudaStreamSynchronize(c->stream)); /* h_all is the next gather's */
    b->comm->gathers++;
    b->comm->gather_s += now_s() - t0;
}

/* ---------------------------------------------------------------------------------------- */
/* graphs
 *
 * A decode step (every item one token) of a dense model runs as one CUDA graph. The first
 * step of each token count T is captured while the forward pass calls its ops, and the ops'
 * kinds and arguments are logged; a later step of the same T matches each op against that
 * log without launching anything, and launches the graph when the logits are asked for. The
 * plan's device copy, the only thing that differs between such steps, is uploaded before.
 * Anything a graph cannot hold (reading or writing activations, routing on the host, an op
 * sequence that differs) ends the capture or the replay: the ops logged so far run eagerly,
 * and that token count is not captured again. So there are at most n_slots graphs, one per
 * token count, each made once. */

static int same_op(const g_op *x, const g_op *y) {
    if (x->kind != y->kind || x->layer != y->layer || x->a != y->a || x->b != y->b || x->n != y->n) return 0;
    for (int i = 0; i < x->n && x->kind == OP_MATMUL; i++)
        if (x->mm[i].w != y->mm[i].w || x->mm[i].out != y->mm[i].out) return 0;
    return 1;
}

static void run_op(cuda_ctx *c, const g_op *o) {
    switch (o->kind) {
    case OP_EMBED: do_embed(c); break;
    case OP_ADD_NORM: do_add_norm(c, o->layer, (st_norm)o->a, o->b); break;
    case OP_MATMUL: do_matmul(c, o->layer, (st_act)o->a, o->mm, o->n, o->b); break;
    case OP_GDN: do_gdn(c, o->layer); break;
    case OP_ATTN_PREP: do_attn_prep(c, o->layer); break;
    case OP_ATTENTION: do_attention(c, o->layer); break;
    case OP_ALLREDUCE: do_allreduce(c, (st_act)o->a); break;
    default: break;
    }
}

/* leave graph mode for this step: what was logged or matched runs eagerly */
static void graph_abort(cuda_ctx *c) {
    g_slot *g = &c->graphs[c->graph_T];
    const g_op *ops = c->log;
    int n = 0;
    if (c->graph_mode == G_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaStreamEndCapture(c->stream, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError(); /* an invalidated capture's error is not the step's */
        n = c->n_log;
    } else if (c->graph_mode == G_REPLAY) {
        ops = g->ops;
        n = c->at;
    }
    g->refused = 1;
    c->graph_mode = G_EAGER;
    c->xs_holds = c->xq_holds = c->h_bf16 = -1; /* the step from its start */
    for (int i = 0; i < n; i++) run_op(c, &ops[i]);
}

/* 1: the op is held by the graph (do not run it now) */
static int graph_op(cuda_ctx *c, const g_op *o) {
    if (c->graph_mode == G_EAGER) return 0;
    if (c->graph_mode == G_CAPTURE) {
        if (c->n_log < c->max_ops) {
            c->log[c->n_log++] = *o;
            return 0;
        }
    } else {
        const g_slot *g = &c->graphs[c->graph_T];
        if (c->at < g->n_ops && same_op(&g->ops[c->at], o)) {
            c->at++;
            return 1;
        }
    }
    graph_abort(c);
    return 0;
}

/* the step's ops are all in: instantiate a capture, launch the graph */
static void graph_finish(cuda_ctx *c) {
    g_slot *g = &c->graphs[c->graph_T];
    if (c->graph_mode == G_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
        cudaGraphExec_t exec = NULL;
        g_op *ops = malloc((size_t)(c->n_log ? c->n_log : 1) * sizeof *ops);
        if (e == cudaSuccess && graph && ops) e = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (e != cudaSuccess || !exec || !ops) { /* run it eagerly; never capture this size again */
            free(ops);
            if (exec) cudaGraphExecDestroy(exec);
            cudaGetLastError();
            g->refused = 1;
            c->graph_mode = G_EAGER;
            for (int i = 0; i < c->n_log; i++) run_op(c, &c->log[i]);
            return;
        }
        memcpy(ops, c->log, (size_t)c->n_log * sizeof *ops);
        g->exec = exec;
        g->ops = ops;
        g->n_ops = c->n_log;
        c->graph_captures++;
    } else if (c->graph_mode == G_REPLAY) {
        if (c->at != g->n_ops) {
            graph_abort(c);
            return;
        }
    } else {
        return;
    }
    c->graph_mode = G_EAGER;
    note(c, cudaGraphLaunch(g->exec, c->stream));
    c->graph_launches++;
}

/* the step's mode, after its plan is on the device */
static void graph_begin(cuda_ctx *c, const st_step_plan *pl) {
    c->graph_mode = G_EAGER;
    if (c->timing || c->b->E || pl->n_tokens != pl->n_items || pl->n_tokens > c->p.n_slots) return;
    if (c->b->world > 1 && !c->b->nccl) return; /* the host's all-reduces: a graph could hold no step */
    c->graph_T = pl->n_tokens;
    g_slot *g = &c->graphs[c->graph_T];
    if (g->refused) return;
    if (g->exec) {
        c->graph_mode = G_REPLAY;
        c->at = 0;
    } else if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        c->graph_mode = G_CAPTURE;
        c->n_log = 0;
    } else {
        cudaGetLastError();
        g->refused = 1;
    }
}

/* an op of the layer loop: held by the graph, or run now (between its timing events) */
static void layer_op(cuda_ctx *c, const g_op *o) {
    if (graph_op(c, o)) return;
    static const int kind[] = {[OP_EMBED] = TK_EMBED,           [OP_ADD_NORM] = TK_NORM,
                               [OP_GDN] = TK_GDN,               [OP_ATTN_PREP] = TK_ATTN_PREP,
                               [OP_ATTENTION] = TK_ATTENTION,   [OP_ALLREDUCE] = TK_ALLREDUCE};
    tm_start(c);
    run_op(c, o);
    tm_stop(c, o->kind == OP_MATMUL ? tm_kind_of(o->mm[0].w) : kind[o->kind]);
}

static void cuda_embed(st_bctx *base) {
    const g_op o = {.kind = OP_EMBED};
    layer_op((cuda_ctx *)base, &o);
}

static void cuda_add_norm(st_bctx *base, int layer, st_norm which, int mode) {
    const g_op o = {.kind = OP_ADD_NORM, .layer = layer, .a = (int)which, .b = mode};
    layer_op((cuda_ctx *)base, &o);
}

static void cuda_matmul(st_bctx *base, int layer, st_act in, const st_mm *mm, int n, int swiglu) {
    cuda_ctx *c = (cuda_ctx *)base;
    g_op o = {.kind = OP_MATMUL, .layer = layer, .a = (int)in, .b = swiglu, .n = n};
    if (n > 4) { /* not loggable: no graph for this step */
        if (c->graph_mode != G_EAGER) graph_abort(c);
        do_matmul(c, layer, in, mm, n, swiglu);
        return;
    }
    for (int i = 0; i < n; i++) o.mm[i] = mm[i];
    layer_op(c, &o);
}

static void cuda_gdn(st_bctx *base, int layer) {
    const g_op o = {.kind = OP_GDN, .layer = layer};
    layer_op((cuda_ctx *)base, &o);
}

static void cuda_attn_prep(st_bctx *base, int layer) {
    const g_op o = {.kind = OP_ATTN_PREP, .layer = layer};
    layer_op((cuda_ctx *)base, &o);
}

static void cuda_attention(st_bctx *base, int layer) {
    const g_op o = {.kind = OP_ATTENTION, .layer = layer};
    layer_op((cuda_ctx *)base, &o);
}

/* SwiGLU MLP of n rows of x into y, on p1/p2 */
static void swiglu(cuda_ctx *c, const cu_mat *g, const cu_mat *u, const cu_mat *dn, const float *x, int64_t n, float *y) {
    cu_matmul(c->stream, g, x, g->cols, n, c->p1, g->rows, c->b->mm_mode, &c->mms);
    cu_matmul(c->stream, u, x, u->cols, n, c->p2, u->rows, c->b->mm_mode, &c->mms);
    cu_silu_mul(c->stream, c->p1, c->p2, n, g->rows, g->rows, NULL, 0, NULL, 0, 0);
    cu_matmul(c->stream, dn, c->p1, dn->cols, n, y, dn->rows, c->b->mm_mode, &c->mms);
}

/* Routing on the host, as the CPU backend does it (the same selection, ties to the lower
 * expert), then each expert's tokens gathered, run and scattered back. */
static void cuda_moe(st_bctx *base, int layer) {
    cuda_ctx *c = (cuda_ctx *)base;
    c->xs_holds = c->xq_holds = -1; /* its products split into xs */
    if (c->graph_mode != G_EAGER) graph_abort(c);
    const cuda_backend *b = c->b;
    const cl_layer *L = &b->layers[layer];
    const int64_t T = c->T, d = b->d;
    const int E = b->E, k = b->topk;
    tm_start(c);
    cu_matmul(c->stream, &L->router, c->xn, d, T, c->gout, E, b->mm_mode, &c->mms);
    note(c, cudaMemcpyAsync(c->h_router, c->gout, (size_t)(T * E) * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
    for (int64_t t = 0; t < T; t++)
        st_moe_route(c->h_router + t * E, E, k, b->norm_topk, c->h_sel + t * k, c->h_selw + t * k);
    /* the lists of every expert, one after another, uploaded once */
    int64_t at = 0, start[1024 + 1];
    const int ne = E < 1024 ? E : 1024;
    for (int e = 0; e < ne; e++) {
        start[e] = at;
        for (int64_t t = 0; t < T; t++)
            for (int s = 0; s < k; s++)
                if (c->h_sel[t * k + s] == e) {
                    c->h_list[at] = (int32_t)t;
                    c->h_w[at] = c->h_selw[t * k + s];
                    at++;
                }
    }
    start[ne] = at;
    note(c, cudaMemcpyAsync(c->d_list, c->h_list, (size_t)at * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    note(c, cudaMemcpyAsync(c->d_w, c->h_w, (size_t)at * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    cu_fill_zero(c->stream, c->out, T * d);
    for (int e = 0; e < ne; e++) {
        const int64_t n = start[e + 1] - start[e];
        if (!n) continue;
        cu_gather_rows(c->stream, c->xn, d, c->d_list + start[e], n, c->gath);
        swiglu(c, &L->exp_gate[e], &L->exp_up[e], &L->exp_down[e], c->gath, n, c->gout);
        cu_scatter_add(c->stream, c->out, c->gout, c->d_list + start[e], c->d_w + start[e], n, d);
    }
    if (L->has_shared) {
        swiglu(c, &L->sh_gate, &L->sh_up, &L->sh_down, c->xn, T, c->gout);
        cu_matmul(c->stream, &L->sh_egate, c->xn, d, T, c->small, 1, b->mm_mode, &c->mms);
        cu_gated_add(c->stream, c->out, c->gout, c->small, T, d);
    }
    tm_stop(c, TK_MOE);
    /* the host lists are reused by the next layer: their copies must be done */
    note(c, cudaStreamSynchronize(c->stream));
}

static void cuda_allreduce(st_bctx *base, st_act a) {
    cuda_ctx *c = (cuda_ctx *)base;
    c->xs_holds = c->xq_holds = -1;
    if (c->b->world == 1 && !c->b->nccl) return; /* nothing to sum */
    if (!c->b->nccl && c->graph_mode != G_EAGER) graph_abort(c); /* the host's sums are not a graph's */
    const g_op o = {.kind = OP_ALLREDUCE, .a = (int)a};
    layer_op(c, &o);
}

static void cuda_logits(st_bctx *base, float *out) {
    cuda_ctx *c = (cuda_ctx *)base;
    graph_finish(c);
    const cuda_backend *b = c->b;
    if (!out && b->world == 1) return; /* nothing asked for (a shard takes part in the gathers) */
    const int64_t rows = c->hp->n_logit_rows;
    const int32_t *d_top = (const int32_t *)(c->d_plan + c->layout.top_rows);
    int64_t tops = 0; /* compact rows of the passes before */
    for (int64_t r0 = 0; r0 < rows; r0 += LOGIT_CHUNK) {
        const int64_t n = rows - r0 < LOGIT_CHUNK ? rows - r0 : LOGIT_CHUNK;
        int64_t nt = 0;
        for (int64_t j = 0; j < n; j++) nt += c->row_top[r0 + j];
        tm_start(c);
        cu_gather_rows(c->stream, c->xn, b->d, c->plan.rows + r0, n, c->gath);
        if (b->world > 1) { /* this rank's vocabulary slice, then every rank's */
            cu_matmul(c->stream, &b->lm_head, c->gath, b->d, n, c->lg_part, b->Vmax, b->mm_mode, &c->mms);
            gather_logits(c, n);
            if (!out || c->comm_failed) {
                tm_stop(c, TK_LOGITS);
                continue;
            }
        } else {
            cu_matmul(c->stream, &b->lm_head, c->gath, b->d, n, c->lg, b->V, b->mm_mode, &c->mms);
        }
        if (nt) {
            cu_logit_tops(c->stream, c->lg, b->V, d_top + tops, nt, c->d_top_scratch, c->d_tops);
            note(c, cudaMemcpyAsync(c->h_tops, c->d_tops, (size_t)nt * sizeof(cu_logit_top), cudaMemcpyDeviceToHost,
                                    c->stream));
        }
        for (int64_t j = 0; j < n;) { /* the whole rows, a run at a time */
            int64_t e = j;
            while (e < n && !c->row_top[r0 + e]) e++;
            if (e > j)
                note(c, cudaMemcpyAsync(out + (r0 + j) * b->V, c->lg + j * b->V, (size_t)((e - j) * b->V) * sizeof(float),
                                        cudaMemcpyDeviceToHost, c->stream));
            j = e + 1;
        }
        tm_stop(c, TK_LOGITS);
        note(c, cudaStreamSynchronize(c->stream));
        for (int64_t j = 0, k = 0; j < n; j++)
            if (c->row_top[r0 + j]) memcpy(out + (r0 + j) * b->V, &c->h_tops[k++], sizeof(cu_logit_top));
        tops += nt;
    }
}

static void cuda_read(st_bctx *base, st_act a, int64_t width, float *out) {
    cuda_ctx *c = (cuda_ctx *)base;
    if (c->graph_mode != G_EAGER) graph_abort(c);
    note(c, cudaMemcpyAsync(out, act(c, a), (size_t)(c->T * width) * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
}

static void cuda_write(st_bctx *base, st_act a, int64_t width, const float *in) {
    cuda_ctx *c = (cuda_ctx *)base;
    if (c->graph_mode != G_EAGER) graph_abort(c);
    c->xs_holds = c->xq_holds = -1;
    note(c, cudaMemcpyAsync(act(c, a), in, (size_t)(c->T * width) * sizeof(float), cudaMemcpyHostToDevice, c->stream));
    note(c, cudaStreamSynchronize(c->stream));
}

static st_status cuda_step_end(st_bctx *base, st_error *err) {
    cuda_ctx *c = (cuda_ctx *)base;
    graph_finish(c);
    /* NCCL's collectives of a job: a peer that died or hangs is an error, not a wait for ever */
    if (c->b->nccl && c->b->world > 1 && !c->comm_failed &&
        cu_nccl_wait(c->b->nccl, c->stream, c->b->comm->timeout_s) != 0)
        comm_fail(c, cu_nccl_error(c->b->nccl));
    note(c, cudaStreamSynchronize(c->stream));
    note(c, cudaGetLastError());
    tm_collect(c);
    c->hp = NULL;
    if (c->comm_failed) { /* the job is broken (the scheduler ends on ST_ERR_IO) */
        c->comm_failed = 0;
        return cu_error_set(err, ST_ERR_IO, "tensor parallelism: %s", c->comm_error);
    }
    if (c->first_error != cudaSuccess) return cuda_fail(err, c->first_error, "a step");
    return ST_OK;
}

/* between steps, on the context's stream (ordered with the steps; errors at the next step_end) */
static void cuda_state_copy(st_bctx *base, int from, int to) {
    cuda_ctx *c = (cuda_ctx *)base;
    const int n = c->p.n_slots + c->p.n_snapshots;
    ST_ASSERT(from >= 0 && to >= 0 && from < n && to < n);
    if (from == to) return;
    cudaSetDevice(c->b->device);
    if (c->conv_slot)
        note(c, cudaMemcpyAsync(c->conv + (size_t)to * c->conv_slot, c->conv + (size_t)from * c->conv_slot,
                                c->conv_slot * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    if (c->rec_slot)
        note(c, cudaMemcpyAsync(c->rec + (size_t)to * c->rec_slot, c->rec + (size_t)from * c->rec_slot,
                                c->rec_slot * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_kv_copy(st_bctx *base, int32_t from, int32_t to) {
    cuda_ctx *c = (cuda_ctx *)base;
    ST_ASSERT(from >= 0 && to >= 0 && from < c->p.n_blocks && to < c->p.n_blocks);
    if (from == to || !c->kv_block_elems) return;
    cudaSetDevice(c->b->device);
    const size_t bytes = c->kv_block_elems * c->kv_elem;
    char *kv = c->kv;
    note(c, cudaMemcpyAsync(kv + (size_t)to * bytes, kv + (size_t)from * bytes, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

/* page-locked host memory: the logits' copy at the bus's rate */
static void *cuda_host_alloc(st_backend *base, size_t bytes) {
    cudaSetDevice(((cuda_backend *)base)->device);
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(st_backend *base, void *p) {
    (void)base;
    if (p) cudaFreeHost(p);
}

static const st_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .ctx_create = cuda_ctx_create,
    .ctx_destroy = cuda_ctx_destroy,
    .ctx_bytes = cuda_ctx_bytes,
    .ctx_plan = cuda_ctx_plan,
    .step_begin = cuda_step_begin,
    .embed = cuda_embed,
    .add_norm = cuda_add_norm,
    .matmul = cuda_matmul,
    .gdn = cuda_gdn,
    .attn_prep = cuda_attn_prep,
    .attention = cuda_attention,
    .moe = cuda_moe,
    .allreduce = cuda_allreduce,
    .logits = cuda_logits,
    .read = cuda_read,
    .write = cuda_write,
    .step_end = cuda_step_end,
    .state_copy = cuda_state_copy,
    .kv_copy = cuda_kv_copy,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

static void cuda_graphs(const st_bctx *base, int64_t *captures, int64_t *launches) {
    const cuda_ctx *c = (const cuda_ctx *)base;
    *captures = c->graph_captures;
    *launches = c->graph_launches;
}

static int cuda_time_ops(st_bctx *base, int on) {
    cuda_ctx *c = (cuda_ctx *)base;
    if (on && !c->tev) { /* once: a pair for each op a step can hold */
        const int pairs = c->max_ops + c->p.max_tokens / LOGIT_CHUNK + 1; /* + the logits' passes */
        c->tev = calloc((size_t)(2 * pairs), sizeof *c->tev);
        c->tev_kind = calloc((size_t)pairs, 1);
        if (!c->tev || !c->tev_kind) return -1;
        c->tev_pairs = pairs;
        for (int i = 0; i < 2 * pairs; i++)
            if (cudaEventCreate(&c->tev[i]) != cudaSuccess) {
                cudaGetLastError();
                return -1;
            }
    }
    c->timing = on != 0;
    return 0;
}

static void cuda_op_times(st_bctx *base, st_cuda_op_times *out) {
    cuda_ctx *c = (cuda_ctx *)base;
    out->n = TK_COUNT;
    for (int i = 0; i < TK_COUNT; i++) {
        out->name[i] = tk_name[i];
        out->ms[i] = c->tk_ms[i];
        out->calls[i] = c->tk_calls[i];
        c->tk_ms[i] = 0;
        c->tk_calls[i] = 0;
    }
    out->untimed = c->untimed;
    c->untimed = 0;
}

static const st_cuda_entry entry = {
    .abi = ST_CUDA_ABI,
    .ops = &cuda_ops,
    .create = cuda_create,
    .available = cuda_available,
    .device_allocs = cuda_device_allocs,
    .describe = cuda_describe,
    .memory = cuda_memory,
    .bandwidth = cuda_bandwidth,
    .graphs = cuda_graphs,
    .time_ops = cuda_time_ops,
    .op_times = cuda_op_times,
    .vision_create = cuda_vision_create,
};

__attribute__((visibility("default"))) const st_cuda_entry *st_cuda_entry_get(void) { return &entry; }
