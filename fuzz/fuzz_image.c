/* ==== libFuzzer target: the image decoder (PNG, JPEG, and the kinds it refuses) ==== */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "vision/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_image_limits lim = st_image_default_limits();
    lim.max_pixels = 4 << 20; /* a bomb is refused before its pixels are allocated */
    uint8_t *rgb = NULL;
    int64_t w = 0, h = 0;
    st_error err;
    if (st_image_decode(data, size, &lim, &rgb, &w, &h, &err) == ST_OK) {
        volatile uint8_t sink = rgb[(size_t)(w * h * 3) - 1]; /* the last pixel exists */
        (void)sink;
    }
    free(rgb);
    return 0;
}
