/* Image decoding: PNG (libpng's simplified API), JPEG (libjpeg), WebP (libwebp) and GIF
 * (giflib, the first frame), to 8-bit RGB. */
#include "vision/image.h"

#include <gif_lib.h>
#include <png.h>
#include <webp/decode.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h> /* after stdio.h: it uses FILE and size_t */

st_image_limits st_image_default_limits(void) {
    st_image_limits l = {.max_bytes = (size_t)32 << 20, .max_pixels = (int64_t)64 << 20, .max_side = 16384};
    return l;
}

static st_status check_size(int64_t w, int64_t h, const st_image_limits *lim, const char *kind, st_error *err) {
    if (w < 1 || h < 1) return st_error_set(err, ST_ERR_FORMAT, "%s image: empty (%lldx%lld)", kind, (long long)w, (long long)h);
    if (w > lim->max_side || h > lim->max_side || w * h > lim->max_pixels)
        return st_error_set(err, ST_ERR_LIMIT, "%s image of %lldx%lld pixels exceeds the limit (%lld a side, %lld in all)",
                            kind, (long long)w, (long long)h, (long long)lim->max_side, (long long)lim->max_pixels);
    return ST_OK;
}

/* ---- PNG ---- */

static st_status decode_png(const void *data, size_t len, const st_image_limits *lim, uint8_t **out, int64_t *ow,
                            int64_t *oh, st_error *err) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, data, len)) {
        st_status st = st_error_set(err, ST_ERR_FORMAT, "PNG image: %s", im.message[0] ? im.message : "unreadable");
        png_image_free(&im);
        return st;
    }
    st_status st = check_size((int64_t)im.width, (int64_t)im.height, lim, "PNG", err);
    if (st != ST_OK) {
        png_image_free(&im);
        return st;
    }
    im.format = PNG_FORMAT_RGBA; /* then alpha dropped, as convert("RGB") does */
    const size_t n = (size_t)im.width * (size_t)im.height;
    uint8_t *rgba = malloc(n * 4), *rgb = malloc(n * 3);
    if (!rgba || !rgb) {
        free(rgba);
        free(rgb);
        png_image_free(&im);
        return st_error_set(err, ST_ERR_NOMEM, "PNG image: out of memory for %zu pixels", n);
    }
    if (!png_image_finish_read(&im, NULL, rgba, 0, NULL)) {
        st = st_error_set(err, ST_ERR_FORMAT, "PNG image: %s", im.message[0] ? im.message : "corrupt");
        free(rgba);
        free(rgb);
        png_image_free(&im);
        return st;
    }
    for (size_t i = 0; i < n; i++) memcpy(rgb + 3 * i, rgba + 4 * i, 3);
    free(rgba);
    *out = rgb;
    *ow = im.width;
    *oh = im.height;
    png_image_free(&im);
    return ST_OK;
}

/* ---- JPEG ---- */

typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jerr;

static void jpeg_fail(j_common_ptr c) {
    jerr *e = (jerr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jump, 1);
}

static void jpeg_quiet(j_common_ptr c, int level) {
    (void)c;
    (void)level; /* warnings (corrupt data the library recovers from) are not printed */
}

static uint32_t rd(const uint8_t *p, int le, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint32_t)p[le ? i : n - 1 - i] << (8 * i);
    return v;
}

/* the EXIF orientation (1-8) of an APP1 payload, 1 when absent or unreadable */
static int exif_orientation(const uint8_t *p, size_t n) {
    if (n < 14 || memcmp(p, "Exif\0\0", 6)) return 1;
    p += 6, n -= 6;
    const int le = p[0] == 'I' && p[1] == 'I';
    if (!le && !(p[0] == 'M' && p[1] == 'M')) return 1;
    const uint32_t ifd = rd(p + 4, le, 4);
    if (ifd > n || n - ifd < 2) return 1;
    const uint32_t count = rd(p + ifd, le, 2);
    for (uint32_t i = 0; i < count; i++) {
        const size_t at = (size_t)ifd + 2 + (size_t)i * 12;
        if (at + 12 > n) return 1;
        if (rd(p + at, le, 2) == 0x0112) {
            const uint32_t v = rd(p + at + 8, le, 2);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
}

/* rgb [h][w][3] turned upright for orientation o (EXIF: 2 mirror, 3 rotate 180, 4 flip,
 * 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise) */
static uint8_t *orient(uint8_t *src, int64_t *w, int64_t *h, int o) {
    if (o == 1) return src;
    const int64_t W = *w, H = *h, swap = o >= 5, nw = swap ? H : W, nh = swap ? W : H;
    uint8_t *dst = malloc((size_t)(W * H * 3));
    if (!dst) return NULL;
    for (int64_t y = 0; y < nh; y++)
        for (int64_t x = 0; x < nw; x++) {
            int64_t sx, sy; /* the source pixel of output (x, y) */
            switch (o) {
            case 2: sx = W - 1 - x, sy = y; break;
            case 3: sx = W - 1 - x, sy = H - 1 - y; break;
            case 4: sx = x, sy = H - 1 - y; break;
            case 5: sx = y, sy = x; break;
            case 6: sx = y, sy = H - 1 - x; break;
            case 7: sx = W - 1 - y, sy = H - 1 - x; break;
            default: sx = W - 1 - y, sy = x; break; /* 8 */
            }
            memcpy(dst + (y * nw + x) * 3, src + (sy * W + sx) * 3, 3);
        }
    free(src);
    *w = nw;
    *h = nh;
    return dst;
}

static st_status decode_jpeg(const void *data, size_t len, const st_image_limits *lim, uint8_t **out, int64_t *ow,
                             int64_t *oh, st_error *err) {
    struct jpeg_decompress_struct c;
    jerr e;
    uint8_t *volatile rgb = NULL;
    memset(&c, 0, sizeof c);
    c.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jpeg_fail;
    e.pub.emit_message = jpeg_quiet;
    if (setjmp(e.jump)) {
        free(rgb);
        jpeg_destroy_decompress(&c);
        return st_error_set(err, ST_ERR_FORMAT, "JPEG image: %s", e.msg);
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, (const unsigned char *)data, (unsigned long)len);
    jpeg_save_markers(&c, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(&c, TRUE);
    st_status st = check_size((int64_t)c.image_width, (int64_t)c.image_height, lim, "JPEG", err);
    if (st == ST_OK && (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK))
        st = st_error_set(err, ST_ERR_UNSUPPORTED, "JPEG image: CMYK JPEGs are not supported");
    if (st != ST_OK) {
        jpeg_destroy_decompress(&c);
        return st;
    }
    int o = 1;
    for (jpeg_saved_marker_ptr m = c.marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1) o = exif_orientation(m->data, m->data_length);
    c.out_color_space = JCS_RGB;
    jpeg_start_decompress(&c);
    if (c.output_components != 3) {
        jpeg_destroy_decompress(&c);
        return st_error_set(err, ST_ERR_UNSUPPORTED, "JPEG image: %d output components", c.output_components);
    }
    const int64_t w = c.output_width, h = c.output_height;
    rgb = malloc((size_t)(w * h * 3));
    if (!rgb) {
        jpeg_destroy_decompress(&c);
        return st_error_set(err, ST_ERR_NOMEM, "JPEG image: out of memory");
    }
    while (c.output_scanline < c.output_height) {
        JSAMPROW row = rgb + (size_t)c.output_scanline * (size_t)w * 3;
        jpeg_read_scanlines(&c, &row, 1);
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    int64_t W = w, H = h;
    uint8_t *up = orient(rgb, &W, &H, o);
    if (!up) {
        free(rgb);
        return st_error_set(err, ST_ERR_NOMEM, "JPEG image: out of memory");
    }
    *out = up;
    *ow = W;
    *oh = H;
    return ST_OK;
}

/* ---- WebP (still images; an animation is refused) ---- */

static st_status decode_webp(const void *data, size_t len, const st_image_limits *lim, uint8_t **out, int64_t *ow,
                             int64_t *oh, st_error *err) {
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(data, len, &f) != VP8_STATUS_OK) return st_error_set(err, ST_ERR_FORMAT, "WebP image: unreadable header");
    if (f.has_animation)
        return st_error_set(err, ST_ERR_UNSUPPORTED, "WebP image: animated WebP is not supported (send one frame as a still image)");
    st_status st = check_size(f.width, f.height, lim, "WebP", err);
    if (st != ST_OK) return st;
    const size_t n = (size_t)f.width * (size_t)f.height;
    uint8_t *rgb = malloc(n * 3);
    if (!rgb) return st_error_set(err, ST_ERR_NOMEM, "WebP image: out of memory for %zu pixels", n);
    /* RGB output: an alpha channel is dropped, as convert("RGB") drops it */
    if (!WebPDecodeRGBInto(data, len, rgb, n * 3, f.width * 3)) {
        free(rgb);
        return st_error_set(err, ST_ERR_FORMAT, "WebP image: corrupt data");
    }
    *out = rgb;
    *ow = f.width;
    *oh = f.height;
    return ST_OK;
}

/* ---- GIF: the first frame on the logical screen (the background colour around it) ---- */

typedef struct gif_src {
    const uint8_t *p;
    size_t len, at;
} gif_src;

static int gif_read(GifFileType *g, GifByteType *dst, int n) {
    gif_src *s = g->UserData;
    const size_t k = n < 0 ? 0 : (size_t)n < s->len - s->at ? (size_t)n : s->len - s->at;
    memcpy(dst, s->p + s->at, k);
    s->at += k;
    return (int)k;
}

static st_status gif_fail(GifFileType *g, uint8_t *rgb, uint8_t *line, st_error *err, st_status code, const char *what) {
    const char *why = GifErrorString(g->Error);
    st_status st = st_error_set(err, code, "GIF image: %s%s%s", what, why ? ": " : "", why ? why : "");
    free(rgb);
    free(line);
    int e;
    DGifCloseFile(g, &e);
    return st;
}

static st_status decode_gif(const void *data, size_t len, const st_image_limits *lim, uint8_t **out, int64_t *ow,
                            int64_t *oh, st_error *err) {
    gif_src src = {data, len, 0};
    int e = 0;
    GifFileType *g = DGifOpen(&src, gif_read, &e);
    if (!g) {
        const char *why = GifErrorString(e);
        return st_error_set(err, ST_ERR_FORMAT, "GIF image: unreadable header%s%s", why ? ": " : "", why ? why : "");
    }
    const int64_t W = g->SWidth, H = g->SHeight;
    st_status st = check_size(W, H, lim, "GIF", err);
    if (st != ST_OK) {
        DGifCloseFile(g, &e);
        return st;
    }
    uint8_t *rgb = malloc((size_t)W * (size_t)H * 3), *line = malloc((size_t)W);
    if (!rgb || !line) return gif_fail(g, rgb, line, err, ST_ERR_NOMEM, "out of memory");
    const ColorMapObject *gm = g->SColorMap;
    GifColorType bg = {255, 255, 255};
    if (gm && g->SBackGroundColor < gm->ColorCount) bg = gm->Colors[g->SBackGroundColor];
    for (int64_t i = 0; i < W * H; i++) rgb[3 * i] = bg.Red, rgb[3 * i + 1] = bg.Green, rgb[3 * i + 2] = bg.Blue;
    for (;;) {
        GifRecordType rt;
        if (DGifGetRecordType(g, &rt) == GIF_ERROR) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "corrupt data");
        if (rt == TERMINATE_RECORD_TYPE) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "no image in the file");
        if (rt == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext;
            if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "corrupt extension");
            while (ext)
                if (DGifGetExtensionNext(g, &ext) == GIF_ERROR)
                    return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "corrupt extension");
            continue;
        }
        if (rt != IMAGE_DESC_RECORD_TYPE) continue;
        if (DGifGetImageDesc(g) == GIF_ERROR) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "corrupt frame header");
        const GifImageDesc *d = &g->Image;
        const ColorMapObject *cm = d->ColorMap ? d->ColorMap : gm;
        if (!cm) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "a frame without a colour table");
        if (d->Width < 1 || d->Height < 1 || d->Width > W || d->Height > H)
            return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "a frame larger than its screen");
        /* rows in the order they are stored: interlaced files in four passes */
        static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
        const int passes = d->Interlace ? 4 : 1;
        for (int ps = 0; ps < passes; ps++)
            for (int r = d->Interlace ? start[ps] : 0; r < d->Height; r += d->Interlace ? step[ps] : 1) {
                if (DGifGetLine(g, line, d->Width) == GIF_ERROR) return gif_fail(g, rgb, line, err, ST_ERR_FORMAT, "corrupt pixels");
                const int64_t y = (int64_t)d->Top + r;
                for (int x = 0; x < d->Width; x++) {
                    const int64_t X = (int64_t)d->Left + x;
                    if (y >= H || X >= W) continue; /* a frame hanging off its screen is clipped */
                    const GifColorType c = line[x] < cm->ColorCount ? cm->Colors[line[x]] : bg;
                    uint8_t *o = rgb + 3 * (y * W + X);
                    o[0] = c.Red, o[1] = c.Green, o[2] = c.Blue;
                }
            }
        break; /* the first frame only */
    }
    free(line);
    DGifCloseFile(g, &e);
    *out = rgb;
    *ow = W;
    *oh = H;
    return ST_OK;
}

st_status st_image_decode(const void *data, size_t len, const st_image_limits *lim, uint8_t **rgb, int64_t *w,
                          int64_t *h, st_error *err) {
    *rgb = NULL;
    *w = *h = 0;
    const st_image_limits dflt = st_image_default_limits();
    if (!lim) lim = &dflt;
    const uint8_t *p = data;
    if (len > lim->max_bytes)
        return st_error_set(err, ST_ERR_LIMIT, "image of %zu bytes exceeds the limit of %zu", len, lim->max_bytes);
    if (len >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return decode_png(data, len, lim, rgb, w, h, err);
    if (len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return decode_jpeg(data, len, lim, rgb, w, h, err);
    if (len >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) return decode_webp(data, len, lim, rgb, w, h, err);
    if (len >= 6 && (!memcmp(p, "GIF87a", 6) || !memcmp(p, "GIF89a", 6))) return decode_gif(data, len, lim, rgb, w, h, err);
    return st_error_set(err, ST_ERR_FORMAT,
                        "not an image this build reads (PNG, JPEG, WebP or GIF): %zu bytes starting %02x %02x %02x",
                        len, len > 0 ? p[0] : 0, len > 1 ? p[1] : 0, len > 2 ? p[2] : 0);
}
