/* ==== Image files to 8-bit RGB, for the vision path ====
 *
 * PNG (libpng: any bit depth, grayscale and palette expanded, alpha dropped as the
 * reference's convert("RGB") drops it), JPEG (libjpeg: grayscale or YCbCr to RGB, the EXIF
 * orientation applied), WebP (libwebp: still images, alpha dropped) and GIF (giflib: the
 * first frame on the logical screen, the background colour around it, palette expanded; a
 * transparent index keeps its palette colour, as convert("RGB") gives it), told apart by
 * their first bytes. Untrusted input: the size is checked
 * against the limits before any pixel is allocated, and a corrupt file is an error naming
 * the problem, never a crash (fuzz/fuzz_image.c).
 */
#ifndef ST_VISION_IMAGE_H
#define ST_VISION_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct st_image_limits {
    size_t max_bytes;   /* of the file */
    int64_t max_pixels; /* width x height */
    int64_t max_side;   /* width or height */
} st_image_limits;

/* 32 MiB, 64 megapixels, 16384 a side */
st_image_limits st_image_default_limits(void);

/* data[len] -> *rgb [h][w][3] (malloc'd; the caller frees). ST_ERR_FORMAT for a file that is
 * none of these or is corrupt, ST_ERR_LIMIT past lim (NULL: the defaults),
 * ST_ERR_UNSUPPORTED for what this build does not read (CMYK JPEG, animated WebP), naming it. */
st_status st_image_decode(const void *data, size_t len, const st_image_limits *lim, uint8_t **rgb, int64_t *w,
                          int64_t *h, st_error *err);

#endif /* ST_VISION_IMAGE_H */
