/* The image parts of a prompt (vision/prompt.h). */
#include "vision/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/numeric.h"
#include "vision/mrope.h"

/* 64-bit FNV-1a of n bytes */
static uint64_t hash64(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

st_status st_vision_pp_load(const char *dir, st_vision_pp *pp, st_error *err) {
    *pp = st_vision_pp_default();
    char path[4096];
    st_status st = st_path_join(path, sizeof path, dir, "preprocessor_config.json", err);
    if (st != ST_OK || !st_file_exists(path)) return st;
    char *text = NULL;
    size_t len = 0;
    if ((st = st_file_read(path, 1u << 20, &text, &len, err)) != ST_OK) return st;
    st = st_vision_pp_parse(text, len, pp, err);
    free(text);
    return st;
}

/* one image: decoded, sized, resampled and cut into patches (*px owned by the caller) */
static st_status image_patches(const void *image, size_t len, const st_vision_pp *pp, const st_image_limits *lim,
                               float **px, int32_t grid[3], st_error *err) {
    uint8_t *rgb = NULL, *rs = NULL;
    void *tmp = NULL;
    int64_t w = 0, h = 0, oh = 0, ow = 0;
    *px = NULL;
    st_status st = st_image_decode(image, len, lim, &rgb, &w, &h, err);
    if (st == ST_OK) st = st_vision_smart_resize(h, w, pp, &oh, &ow, err);
    if (st != ST_OK) {
        free(rgb);
        return st;
    }
    const int64_t gh = oh / pp->patch, gw = ow / pp->patch, D = 3 * (int64_t)pp->temporal * pp->patch * pp->patch;
    rs = malloc((size_t)(oh * ow * 3));
    tmp = malloc(st_vision_resize_scratch(h, w, oh, ow, 3) + 1);
    *px = malloc((size_t)(gh * gw * D) * sizeof(float));
    if (!rs || !tmp || !*px) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory for a %lldx%lld image", (long long)ow, (long long)oh);
    } else {
        st_vision_resize_bicubic(rgb, h, w, 3, rs, oh, ow, tmp);
        st_vision_patchify(rs, oh, ow, pp, *px);
        grid[0] = 1, grid[1] = (int32_t)gh, grid[2] = (int32_t)gw;
    }
    free(rgb);
    free(rs);
    free(tmp);
    if (st != ST_OK) {
        free(*px);
        *px = NULL;
    }
    return st;
}

st_status st_vision_image_tokens(const void *image, size_t len, const st_vision_pp *pp, const st_image_limits *lim,
                                 int64_t *tokens, st_error *err) {
    float *px = NULL;
    int32_t grid[3];
    st_status st = image_patches(image, len, pp, lim, &px, grid, err);
    free(px);
    if (st == ST_OK) *tokens = (int64_t)grid[0] * grid[1] * grid[2] / ((int64_t)pp->merge * pp->merge);
    return st;
}

void st_vision_prompt_free(st_vision_prompt *p) {
    if (!p) return;
    free(p->mrope);
    free(p->embeds);
    free(p->rows);
    free(p->keys);
    memset(p, 0, sizeof *p);
}

/* every image decoded, sized, resampled and cut into patches (errors name the image, from 1);
 * px[i] and grid[i] for the caller to free */
static st_status all_patches(const st_vision_tower *v, const st_vision_pp *pp, const void *const *images,
                             const size_t *lens, int n_images, const st_image_limits *lim, float **px, int32_t (*grid)[3],
                             st_error *err) {
    if (pp->patch != v->cfg.patch || pp->temporal != v->cfg.temporal || pp->merge != v->cfg.merge)
        return st_error_set(err, ST_ERR_FORMAT, "the processor's patch %d, temporal %d, merge %d differ from the "
                                                "tower's %d, %d, %d", pp->patch, pp->temporal, pp->merge, v->cfg.patch,
                            v->cfg.temporal, v->cfg.merge);
    for (int i = 0; i < n_images; i++) {
        const st_status st = image_patches(images[i], lens[i], pp, lim, &px[i], grid[i], err);
        if (st != ST_OK) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return st_error_set(err, st, "image %d: %s", i + 1, msg);
        }
    }
    return ST_OK;
}

/* the prompt's parts from its images' patches */
static st_status build(const st_vision_tower *v, int32_t image_token, const int32_t *ids, int64_t n, float *const *px,
                       const int32_t (*grid)[3], int n_images, st_vision_prompt *out, st_error *err) {
    const int64_t D = st_vision_patch_dim(v);
    int64_t patches = 0;
    for (int i = 0; i < n_images; i++) patches += (int64_t)grid[i][0] * grid[i][1] * grid[i][2];
    const int64_t rows = patches / ((int64_t)v->cfg.merge * v->cfg.merge);
    out->mrope = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->mrope);
    out->keys = malloc((size_t)(n > 0 ? n : 1) * sizeof *out->keys);
    out->embeds = malloc((size_t)(rows * v->cfg.out_hidden + 1) * sizeof(float));
    out->rows = malloc((size_t)(rows + 1) * sizeof *out->rows);
    float *all = malloc((size_t)(patches * D + 1) * sizeof(float));
    st_status st = out->mrope && out->keys && out->embeds && out->rows && all
                       ? st_mrope_positions(ids, n, image_token, grid, n_images, v->cfg.merge, out->mrope, &out->next, err)
                       : st_error_set(err, ST_ERR_NOMEM, "out of memory for %lld patches", (long long)patches);
    if (st == ST_OK) {
        int64_t at = 0;
        for (int i = 0; i < n_images; i++) {
            const int64_t np = (int64_t)grid[i][0] * grid[i][1] * grid[i][2];
            memcpy(all + at * D, px[i], (size_t)(np * D) * sizeof(float));
            at += np;
        }
        st = st_vision_encode(v, all, grid, n_images, out->embeds, err);
    }
    if (st == ST_OK) { /* the image rows, and the prompt as the prefix cache keys it */
        int64_t k = 0, img = -1, row = 0, left = 0;
        uint64_t h = 0;
        for (int64_t i = 0; i < n; i++) {
            out->keys[i] = ids[i];
            if (ids[i] != image_token) continue;
            out->rows[k++] = i;
            if (left == 0) { /* the next image's run: its pixels' hash */
                img++;
                const int64_t np = (int64_t)grid[img][0] * grid[img][1] * grid[img][2];
                h = hash64(px[img], (size_t)(np * D) * sizeof(float));
                left = np / ((int64_t)v->cfg.merge * v->cfg.merge);
                row = 0;
            }
            out->keys[i] = -1 - (int32_t)(st_splitmix64(h ^ ((uint64_t)row++ * 0x9e3779b97f4a7c15ull)) & 0x3fffffff);
            left--;
        }
        out->n_rows = k; /* == rows: st_mrope_positions matched every run to its image */
    }
    free(all);
    return st;
}

/* the patches of n_images images, freed */
static void free_patches(float **px, int32_t (*grid)[3], int n_images) {
    for (int i = 0; px && i < n_images; i++) free(px[i]);
    free(px);
    free(grid);
}

st_status st_vision_prompt_build(const st_vision_tower *v, const st_vision_pp *pp, int32_t image_token,
                                 const int32_t *ids, int64_t n, const void *const *images, const size_t *lens,
                                 int n_images, const st_image_limits *lim, st_vision_prompt *out, st_error *err) {
    memset(out, 0, sizeof *out);
    float **px = calloc((size_t)(n_images > 0 ? n_images : 1), sizeof *px);
    int32_t(*grid)[3] = calloc((size_t)(n_images > 0 ? n_images : 1), sizeof *grid);
    st_status st = px && grid ? all_patches(v, pp, images, lens, n_images, lim, px, grid, err)
                              : st_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (st == ST_OK) st = build(v, image_token, ids, n, px, (const int32_t(*)[3])grid, n_images, out, err);
    free_patches(px, grid, n_images);
    if (st != ST_OK) st_vision_prompt_free(out);
    return st;
}

st_status st_vision_prompt_expand(const st_vision_tower *v, const st_vision_pp *pp, int32_t image_token,
                                  const int32_t *ids, int64_t n, const void *const *images, const size_t *lens,
                                  int n_images, const st_image_limits *lim, int64_t max_tokens, int32_t **out,
                                  int64_t *n_out, st_vision_prompt *vp, st_error *err) {
    *out = NULL;
    *n_out = 0;
    memset(vp, 0, sizeof *vp);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += ids[i] == image_token;
    if (k != n_images)
        return st_error_set(err, ST_ERR_ARG, "the chat template placed %lld image placeholders for %d images",
                            (long long)k, n_images);
    float **px = calloc((size_t)(n_images > 0 ? n_images : 1), sizeof *px);
    int32_t(*grid)[3] = calloc((size_t)(n_images > 0 ? n_images : 1), sizeof *grid);
    st_status st = px && grid ? all_patches(v, pp, images, lens, n_images, lim, px, grid, err)
                              : st_error_set(err, ST_ERR_NOMEM, "out of memory");
    /* each placeholder becomes its image's run: patches / merge^2 tokens */
    const int64_t mm = (int64_t)pp->merge * pp->merge;
    int64_t extra = 0;
    for (int i = 0; st == ST_OK && i < n_images; i++) extra += (int64_t)grid[i][0] * grid[i][1] * grid[i][2] / mm - 1;
    if (st == ST_OK && n + extra >= max_tokens)
        st = st_error_set(err, ST_ERR_LIMIT, "the prompt with its images has %lld tokens; the context length is %lld",
                          (long long)(n + extra), (long long)max_tokens);
    int32_t *x = st == ST_OK ? malloc((size_t)(n + extra) * sizeof *x) : NULL;
    if (st == ST_OK && !x) st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
    int64_t at = 0;
    for (int64_t i = 0, img = 0; st == ST_OK && i < n; i++) {
        if (ids[i] != image_token) {
            x[at++] = ids[i];
            continue;
        }
        for (int64_t j = (int64_t)grid[img][0] * grid[img][1] * grid[img][2] / mm; j > 0; j--) x[at++] = image_token;
        img++;
    }
    if (st == ST_OK) st = build(v, image_token, x, at, px, (const int32_t(*)[3])grid, n_images, vp, err);
    free_patches(px, grid, n_images);
    if (st != ST_OK) {
        st_vision_prompt_free(vp);
        free(x);
        return st;
    }
    *out = x;
    *n_out = at;
    return ST_OK;
}
