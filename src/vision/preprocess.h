/* ==== Image preprocessing for the vision tower (spec/vision.md sections 1-4) ====
 *
 * From 8-bit RGB pixels to the tower's input: smart_resize picks the size (multiples of
 * patch x merge, the pixel count within [min_pixels, max_pixels]); a bicubic resize equal to
 * Pillow's (fixed-point, horizontal pass then vertical, a pass skipped when its size does
 * not change); rescale and normalise; the frame repeated temporal_patch_size times and cut
 * into patches in merge-block order, each flattened (channel, time, y, x).
 *
 * The parameters come from the numbers in preprocessor_config.json (or processor_config.json's
 * "image_processor"); no class name is looked at.
 */
#ifndef ST_VISION_PREPROCESS_H
#define ST_VISION_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct st_vision_pp {
    int patch;            /* patch_size (16) */
    int temporal;         /* temporal_patch_size (2) */
    int merge;            /* merge_size (2) */
    int64_t min_pixels, max_pixels;
    float mean[3], std[3];
    double rescale;       /* rescale_factor (1/255) */
} st_vision_pp;

/* Qwen3.5's values (spec 1.1). */
st_vision_pp st_vision_pp_default(void);

/* Overlay the numeric fields of a JSON object (text) on p: size.shortest_edge/longest_edge,
 * then min_pixels/max_pixels, patch_size, temporal_patch_size, merge_size, image_mean,
 * image_std, rescale_factor. ST_ERR_FORMAT naming a field that is out of range. */
st_status st_vision_pp_parse(const char *json, size_t len, st_vision_pp *p, st_error *err);

/* The resized height and width (spec 2): ST_ERR_ARG for an aspect ratio over 200 or an
 * empty image. */
st_status st_vision_smart_resize(int64_t h, int64_t w, const st_vision_pp *p, int64_t *out_h, int64_t *out_w,
                                 st_error *err);

/* Pillow's bicubic resize of an 8-bit image of `ch` interleaved channels: src [h][w][ch] ->
 * dst [oh][ow][ch]. tmp: at least st_vision_resize_scratch(...) bytes. */
size_t st_vision_resize_scratch(int64_t h, int64_t w, int64_t oh, int64_t ow, int ch);
void st_vision_resize_bicubic(const uint8_t *src, int64_t h, int64_t w, int ch, uint8_t *dst, int64_t oh, int64_t ow,
                              void *tmp);

/* Patches of an RGB image already at a smart_resize size: out [gh * gw][3 * temporal *
 * patch * patch] floats, rows in merge-block order (spec 4). */
void st_vision_patchify(const uint8_t *rgb, int64_t h, int64_t w, const st_vision_pp *p, float *out);

#endif /* ST_VISION_PREPROCESS_H */
