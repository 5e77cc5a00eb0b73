/* ==== Test helper: a JPEG written with libjpeg (images the tests make themselves) ==== */
#ifndef ST_TESTS_JPEG_WRITE_H
#define ST_TESTS_JPEG_WRITE_H

#include <stdint.h>
#include <stdio.h>
#include <jpeglib.h> /* after stdio.h: it uses FILE and size_t */

/* rgb [h][w][3] as a JPEG of this quality, with an EXIF orientation tag o (0: none); the
 * bytes are malloc'd (*len of them) */
__attribute__((unused)) static unsigned char *test_jpeg(const uint8_t *rgb, int w, int h, int quality, int o,
                                                        unsigned long *len) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    unsigned char *buf = NULL;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &buf, len);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    if (o) { /* Exif, little-endian TIFF, IFD0 with one entry: orientation (SHORT) */
        unsigned char ex[] = {'E', 'x', 'i', 'f', 0, 0, 'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0,
                              0x12, 0x01, 3, 0, 1, 0, 0, 0, (unsigned char)o, 0, 0, 0, 0, 0, 0, 0};
        jpeg_write_marker(&c, JPEG_APP0 + 1, ex, sizeof ex);
    }
    for (int y = 0; y < h; y++) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)y * (size_t)w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return buf;
}

#endif /* ST_TESTS_JPEG_WRITE_H */
