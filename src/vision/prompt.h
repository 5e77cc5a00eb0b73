/* ==== The image parts of a prompt: images -> embeddings, rows and M-RoPE positions ====
 *
 * Each image file is decoded (vision/image.h), sized and resampled as the reference's
 * processor does and cut into patches (vision/preprocess.h); the tower turns all of them
 * into embeddings (vision/tower.h); the prompt's k-th run of image tokens takes image k's
 * (its length must be the image's token count) and the prompt's M-RoPE positions follow
 * (vision/mrope.h). What st_batch_run_images needs.
 */
#ifndef ST_VISION_PROMPT_H
#define ST_VISION_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/tower.h"

typedef struct st_vision_prompt {
    int32_t (*mrope)[3]; /* [n][3], owned */
    float *embeds;       /* [n_rows][out_hidden], owned */
    int64_t *rows;       /* [n_rows] the image tokens' rows, increasing; owned */
    int64_t n_rows;
    int64_t next;        /* the rotary position (every axis) of the token after the prompt */
    int32_t *keys;       /* [n] the prompt as the prefix cache keys it: each image row's id replaced
                            by a negative value from its image's pixels and its row; owned */
} st_vision_prompt;

/* The image token count of an image file as the processor would size it (for building a
 * prompt's runs); ST_ERR_* as st_image_decode and st_vision_smart_resize. */
st_status st_vision_image_tokens(const void *image, size_t len, const st_vision_pp *pp, const st_image_limits *lim,
                                 int64_t *tokens, st_error *err);

/* ids[n] holding one run of image_token per image, images[i] (lens[i] bytes) in order. */
st_status st_vision_prompt_build(const st_vision_tower *v, const st_vision_pp *pp, int32_t image_token,
                                 const int32_t *ids, int64_t n, const void *const *images, const size_t *lens,
                                 int n_images, const st_image_limits *lim, st_vision_prompt *out, st_error *err);
void st_vision_prompt_free(st_vision_prompt *p);

/* A rendered chat prompt whose template placed one image token per image: each becomes the
 * image's run of image tokens (*out [*n_out], malloc'd) and *vp is built on it. ST_ERR_ARG
 * when the placeholders and the images differ in number, ST_ERR_LIMIT when the prompt grows
 * to max_tokens or more, and st_vision_prompt_build's errors (naming the image, from 1). */
st_status st_vision_prompt_expand(const st_vision_tower *v, const st_vision_pp *pp, int32_t image_token,
                                  const int32_t *ids, int64_t n, const void *const *images, const size_t *lens,
                                  int n_images, const st_image_limits *lim, int64_t max_tokens, int32_t **out,
                                  int64_t *n_out, st_vision_prompt *vp, st_error *err);

/* The processor parameters of a checkpoint directory: preprocessor_config.json's numbers
 * over Qwen3.5's defaults (the defaults alone when the file is absent). */
st_status st_vision_pp_load(const char *dir, st_vision_pp *pp, st_error *err);

#endif /* ST_VISION_PROMPT_H */
