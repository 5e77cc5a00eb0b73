/* ==== M-RoPE positions of a prompt holding images (spec/vision.md 7.4) ====
 *
 * Text tokens take (p, p, p), counting on from the last position used; an image's run of
 * image tokens (t x h/merge x w/merge of them, in token order a, i, j) takes (base + a,
 * base + i, base + j), base being the position after the text before it; after an image the
 * count goes on from one past the largest position it used. Decoding continues on all three
 * axes from *next (a token at KV index k takes k + (*next - n)).
 */
#ifndef ST_VISION_MROPE_H
#define ST_VISION_MROPE_H

#include <stdint.h>

#include "core/status.h"

/* ids[n]; the k-th run of image_token ids is image k of grid[k] = (t, h, w) in patches;
 * pos[n][3] out. ST_ERR_ARG naming the image (counted from 1) when a run's length is not its grid's token
 * count, or the runs and the images do not pair up. */
st_status st_mrope_positions(const int32_t *ids, int64_t n, int32_t image_token, const int32_t (*grid)[3],
                             int n_images, int merge, int32_t (*pos)[3], int64_t *next, st_error *err);

#endif /* ST_VISION_MROPE_H */
