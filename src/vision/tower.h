/* ==== The vision tower (spec/vision.md section 6): patches -> image embeddings ====
 *
 * `model.visual` of a Qwen3.5 ConditionalGeneration checkpoint (also named `visual.` or
 * `vision_tower.`): a linear patch embedding (the Conv3d over one patch), a learned position
 * table interpolated bilinearly to each image's grid, 2-D rotary positions, `depth` pre-norm
 * blocks (LayerNorm, attention within each image, LayerNorm, tanh-GELU MLP) and the patch
 * merger (LayerNorm, each 2x2 block of patches concatenated, exact-GELU MLP to the language
 * model's width). fp32 throughout; the matrices stay as stored (bf16, f16 or f32) and go
 * through a kernel set's matmul.
 */
#ifndef ST_VISION_TOWER_H
#define ST_VISION_TOWER_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/kernels.h"
#include "tensor/matrix.h"

/* config.json's vision_config */
typedef struct st_vision_config {
    int depth, hidden, heads, head_dim, intermediate, out_hidden;
    int in_channels, patch, temporal, merge;
    int pos_side;        /* sqrt(num_position_embeddings): the learned table is side x side */
    double rope_theta;
} st_vision_config;

typedef struct st_vision_block {
    float *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* [hidden], owned */
    st_matrix qkv, proj, fc1, fc2;                /* borrowed from the mapping */
    float *qkv_b, *proj_b, *fc1_b, *fc2_b;        /* owned */
} st_vision_block;

/* The tower's arithmetic on a device (the CUDA backend's: st_cuda_vision_create in
 * backend/cuda.h). st_vision_encode keeps the position work on the host and hands it:
 * pixels [N][patch_dim], pos [N][hidden] (the interpolated position rows, added after the
 * patch embedding's bias), cs, sn [N][head_dim] (the rotary tables: x[j] = x[j] cs[j] -
 * x[j + hd/2] sn[j], x[j + hd/2] = x[j + hd/2] cs[j + hd/2] + x[j] sn[j + hd/2]), seg[n_seg]
 * = (first patch, patches) of each attention segment (an image's frame), all host memory;
 * it writes out [N / merge^2][out_hidden] (host). The device computes in fp32. */
typedef struct st_vision_device st_vision_device;
struct st_vision_device {
    st_status (*encode)(st_vision_device *d, const float *pixels, int64_t N, const float *pos, const float *cs,
                        const float *sn, const int64_t (*seg)[2], int n_seg, float *out, st_error *err);
    void (*destroy)(st_vision_device *d);
    char name[64]; /* for reports: "cuda (NVIDIA H200)" */
};

typedef struct st_vision_tower {
    st_vision_config cfg;
    st_vision_device *dev;        /* owned (st_vision_set_device), or NULL: the host's kernels */
    struct st_checkpoint *ck;     /* owned: the mapping the matrices borrow */
    const st_kernels *k;          /* borrowed */
    struct st_pool *pool;         /* owned (st_vision_set_threads), or NULL: one thread */
    st_matrix patch;              /* [hidden][in_channels * temporal * patch * patch] */
    float *patch_f32;             /* owned: the patch matrix permuted from an MLX layout, or NULL */
    float *patch_b;               /* [hidden], owned */
    float *pos;                   /* [pos_side^2][hidden], owned */
    st_vision_block *blocks;      /* [depth], owned */
    float *mnorm_w, *mnorm_b;     /* merger LayerNorm [hidden], owned */
    st_matrix mfc1, mfc2;         /* merger [4h][4h], [out_hidden][4h] */
    float *mfc1_b, *mfc2_b;       /* owned */
} st_vision_tower;

/* The checkpoint directory's vision tower, its matrices run by kernel set k (NULL: the
 * reference). ST_ERR_MISSING when config.json has no vision_config or a tensor; ST_ERR_FORMAT /
 * ST_ERR_SHAPE / ST_ERR_UNSUPPORTED naming the field or tensor otherwise. */
st_status st_vision_load(const char *dir, const st_kernels *k, st_vision_tower **out, st_error *err);
void st_vision_free(st_vision_tower *v);

/* Run the products and the attention on n threads (a pool the tower owns; 1: none). The
 * results are the same bits for any n. One st_vision_encode at a time on a tower. */
st_status st_vision_set_threads(st_vision_tower *v, int n, st_error *err);

/* Run the tower on device d (owned by v from here; NULL: back to the host's kernels, the
 * previous device destroyed). */
void st_vision_set_device(st_vision_tower *v, st_vision_device *d);

/* Columns of one patch row of pixel_values (in_channels * temporal * patch * patch). */
int64_t st_vision_patch_dim(const st_vision_tower *v);

/* Embeddings of n images: pixels [sum t*h*w][patch_dim] in the images' order (spec 4: each
 * image's patches in merge-block order), grid[i] = (t, h, w) in patches; out [sum t*h*w /
 * merge^2][out_hidden]. ST_ERR_ARG for a grid that does not divide by the merge size. */
st_status st_vision_encode(const st_vision_tower *v, const float *pixels, const int32_t (*grid)[3], int n, float *out,
                           st_error *err);

#endif /* ST_VISION_TOWER_H */
