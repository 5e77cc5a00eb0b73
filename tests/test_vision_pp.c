/* ==== Vision preprocessing against the reference (tiny-vl pixel goldens) ====
 * smart_resize on the spec's worked examples; the fixture's preprocessor config read by its
 * numbers; each image decoded (st_image_decode), resized with Pillow's bicubic and cut into
 * patches: pixel_values and grid_thw equal to the reference's (Pillow backend). The decoder's
 * refusals (corrupt, truncated, oversized, unknown kinds), a JPEG written here with an EXIF
 * orientation, read back upright, and WebP and GIF files written here (lossless WebP with and
 * without alpha; GIFs plain and interlaced, a frame smaller than its screen, a second frame)
 * read back pixel for pixel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <webp/encode.h>

#include "core/fileio.h"
#include "golden.h"
#include "jpeg_write.h"
#include "tap.h"
#include "vision/image.h"
#include "vision/preprocess.h"

/* an image file through st_image_decode; NULL on error */
static uint8_t *load_image(const char *path, int64_t *h, int64_t *w) {
    char *bytes = NULL;
    size_t len = 0;
    uint8_t *rgb = NULL;
    if (st_file_read(path, 64u << 20, &bytes, &len, NULL) != ST_OK) return NULL;
    if (st_image_decode(bytes, len, NULL, &rgb, w, h, NULL) != ST_OK) rgb = NULL;
    free(bytes);
    return rgb;
}

static void test_smart_resize(void) {
    st_vision_pp p = st_vision_pp_default();
    static const int64_t cases[][4] = {{768, 1024, 768, 1024}, {1080, 1920, 1088, 1920}, {720, 1280, 704, 1280},
                                       {1365, 2048, 1376, 2048}, {224, 224, 256, 256},   {48, 80, 224, 352},
                                       {4000, 6000, 3328, 4992}, {5000, 5000, 4096, 4096}};
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t h = 0, w = 0;
        ok &= st_vision_smart_resize(cases[i][0], cases[i][1], &p, &h, &w, NULL) == ST_OK && h == cases[i][2] &&
              w == cases[i][3];
        if (h != cases[i][2] || w != cases[i][3])
            printf("# %lldx%lld -> %lldx%lld (want %lldx%lld)\n", (long long)cases[i][0], (long long)cases[i][1],
                   (long long)h, (long long)w, (long long)cases[i][2], (long long)cases[i][3]);
    }
    CHECK(ok, "smart_resize: the spec's 8 worked examples (ties to even: 720 -> 704)");
    int64_t h, w;
    st_error err = {0};
    CHECK(st_vision_smart_resize(10, 2500, &p, &h, &w, &err) == ST_ERR_ARG && strstr(err.msg, "aspect"),
          "an aspect ratio over 200 is refused: %s", err.msg);
}

/* GIF written to memory with giflib: a screen of sw x sh (background index 0), then each
 * frame fr[i] (left, top, width, height, interlaced) with pixels idx (rows top to bottom) */
typedef struct gif_frame {
    int left, top, w, h, interlace;
    const uint8_t *idx;
} gif_frame;
typedef struct gif_buf {
    uint8_t data[8192];
    size_t len;
} gif_buf;
static int gif_put(GifFileType *g, const GifByteType *b, int n) {
    gif_buf *o = g->UserData;
    if (o->len + (size_t)n > sizeof o->data) return 0;
    memcpy(o->data + o->len, b, (size_t)n);
    o->len += (size_t)n;
    return n;
}
static int test_gif(gif_buf *o, int sw, int sh, const GifColorType *pal, int ncol, const gif_frame *fr, int nfr) {
    int e = 0;
    o->len = 0;
    GifFileType *g = EGifOpen(o, gif_put, &e);
    ColorMapObject *cm = GifMakeMapObject(ncol, pal);
    int ok = g && cm && EGifPutScreenDesc(g, sw, sh, 8, 0, cm) == GIF_OK;
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    for (int f = 0; ok && f < nfr; f++) {
        ok = EGifPutImageDesc(g, fr[f].left, fr[f].top, fr[f].w, fr[f].h, fr[f].interlace != 0, NULL) == GIF_OK;
        for (int ps = 0; ok && ps < (fr[f].interlace ? 4 : 1); ps++)
            for (int r = fr[f].interlace ? start[ps] : 0; ok && r < fr[f].h; r += fr[f].interlace ? step[ps] : 1)
                ok = EGifPutLine(g, (GifPixelType *)fr[f].idx + r * fr[f].w, fr[f].w) == GIF_OK;
    }
    if (g) ok &= EGifCloseFile(g, &e) == GIF_OK;
    GifFreeMapObject(cm);
    return ok;
}

static void test_webp_gif(void) {
    st_error err = {0};
    uint8_t *rgb = NULL;
    int64_t w = 0, h = 0;
    enum { W = 7, H = 5 };
    uint8_t img[H][W][4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            img[y][x][0] = (uint8_t)(37 * x + 11 * y), img[y][x][1] = (uint8_t)(200 - 23 * y), img[y][x][2] = (uint8_t)(x * y * 9),
            img[y][x][3] = (uint8_t)(255 - 30 * x);
    /* lossless WebP, RGB and RGBA: the same RGB back (alpha dropped) */
    for (int alpha = 0; alpha <= 1; alpha++) {
        uint8_t rgb_in[H][W][3], *file = NULL;
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) memcpy(rgb_in[y][x], img[y][x], 3);
        const size_t n = alpha ? WebPEncodeLosslessRGBA(&img[0][0][0], W, H, W * 4, &file)
                               : WebPEncodeLosslessRGB(&rgb_in[0][0][0], W, H, W * 3, &file);
        err.msg[0] = 0;
        st_status st = n ? st_image_decode(file, n, NULL, &rgb, &w, &h, &err) : ST_ERR_IO;
        CHECK(st == ST_OK && w == W && h == H && !memcmp(rgb, rgb_in, sizeof rgb_in),
              "a lossless WebP%s (%zu bytes) read back pixel for pixel%s (%s)", alpha ? " with alpha" : "", n,
              alpha ? ", its alpha dropped" : "", err.msg);
        free(rgb);
        rgb = NULL;
        if (n) {
            CHECK(st_image_decode(file, n / 2, NULL, &rgb, &w, &h, &err) != ST_OK && !rgb && strstr(err.msg, "WebP"),
                  "the WebP cut in half is refused: %s", err.msg);
            st_image_limits lim = st_image_default_limits();
            lim.max_side = W - 1;
            CHECK(st_image_decode(file, n, &lim, &rgb, &w, &h, &err) == ST_ERR_LIMIT && !rgb,
                  "a WebP over the side limit is refused before decoding: %s", err.msg);
        }
        WebPFree(file);
    }
    CHECK(st_image_decode("RIFF\0\0\0\0WEBPVP8 ", 16, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT && strstr(err.msg, "WebP"),
          "a WebP header and nothing else: %s", err.msg);
    /* GIF: 4 colours; a 6x4 screen with a 4x3 frame at (1, 1), then a second frame (ignored) */
    static const GifColorType pal[4] = {{250, 250, 250}, {200, 10, 10}, {10, 200, 10}, {10, 10, 200}};
    uint8_t idx[3][4], other[4 * 6];
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 4; x++) idx[y][x] = (uint8_t)(1 + (x + y) % 3);
    memset(other, 2, sizeof other);
    for (int il = 0; il <= 1; il++) {
        gif_frame fr[2] = {{1, 1, 4, 3, il, &idx[0][0]}, {0, 0, 6, 4, 0, other}};
        gif_buf gb;
        if (!CHECK(test_gif(&gb, 6, 4, pal, 4, fr, 2), "a GIF written (%s)", il ? "interlaced" : "plain")) continue;
        err.msg[0] = 0;
        st_status st = st_image_decode(gb.data, gb.len, NULL, &rgb, &w, &h, &err);
        int same = st == ST_OK && w == 6 && h == 4;
        for (int y = 0; same && y < 4; y++)
            for (int x = 0; x < 6; x++) {
                const int in = x >= 1 && x < 5 && y >= 1 && y < 4;
                const GifColorType c = pal[in ? idx[y - 1][x - 1] : 0];
                const uint8_t *o = rgb + 3 * (y * 6 + x);
                same &= o[0] == c.Red && o[1] == c.Green && o[2] == c.Blue;
            }
        CHECK(same, "%s GIF: its first frame on the 6x4 screen, the background around it (%s)",
              il ? "an interlaced" : "a plain", err.msg);
        free(rgb);
        rgb = NULL;
        CHECK(st_image_decode(gb.data, 20, NULL, &rgb, &w, &h, &err) != ST_OK && !rgb && strstr(err.msg, "GIF"),
              "the GIF cut to 20 bytes is refused: %s", err.msg);
    }
    CHECK(st_image_decode("GIF89a\1\0\1\0", 10, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT && strstr(err.msg, "GIF"),
          "a GIF header and nothing else: %s", err.msg);
}

static void test_decoder(const char *dir) {
    char path[600];
    st_error err = {0};
    snprintf(path, sizeof path, "%s/images/img1.png", dir);
    char *png = NULL;
    size_t len = 0;
    uint8_t *rgb = NULL;
    int64_t w = 0, h = 0;
    if (!CHECK(st_file_read(path, 1 << 20, &png, &len, &err) == ST_OK, "img1.png read (%s)", err.msg)) return;
    CHECK(st_image_decode(png, len / 2, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT && !rgb && strstr(err.msg, "PNG"),
          "a truncated PNG: %s", err.msg);
    png[len / 2] ^= 0x55;
    CHECK(st_image_decode(png, len, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT && !rgb, "a corrupted PNG: %s", err.msg);
    png[len / 2] ^= 0x55;
    st_image_limits lim = st_image_default_limits();
    lim.max_pixels = 100 * 75 - 1;
    CHECK(st_image_decode(png, len, &lim, &rgb, &w, &h, &err) == ST_ERR_LIMIT && !rgb && strstr(err.msg, "100x75"),
          "a PNG over the pixel limit is refused before decoding: %s", err.msg);
    lim = st_image_default_limits();
    lim.max_bytes = len - 1;
    CHECK(st_image_decode(png, len, &lim, &rgb, &w, &h, &err) == ST_ERR_LIMIT, "a file over the byte limit: %s", err.msg);
    CHECK(st_image_decode("hello", 5, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT && strstr(err.msg, "WebP or GIF"),
          "not an image: %s", err.msg);
    CHECK(st_image_decode("", 0, NULL, &rgb, &w, &h, &err) == ST_ERR_FORMAT, "no bytes: %s", err.msg);
    free(png);
    /* a 32x16 JPEG, left half red and right half blue, tagged "rotate 90 clockwise" (6): read
     * back 16x32 with red on top; untagged it stays as written; truncated it is refused */
    enum { W = 32, H = 16 };
    uint8_t img[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) img[y][x][0] = x < W / 2 ? 230 : 20, img[y][x][1] = 20, img[y][x][2] = x < W / 2 ? 20 : 230;
    for (int o = 0; o <= 6; o += 6) {
        unsigned long jl = 0;
        unsigned char *jpg = test_jpeg(&img[0][0][0], W, H, 95, o, &jl);
        st_status st = st_image_decode(jpg, jl, NULL, &rgb, &w, &h, &err);
        int ok = st == ST_OK && w == (o ? H : W) && h == (o ? W : H);
        if (ok) { /* the red half: the left (o 0) or the top (o 6) */
            const uint8_t *a = rgb + ((o ? 4 : 8) * w + (o ? 8 : 4)) * 3, *b = rgb + ((o ? 28 : 8) * w + (o ? 8 : 28)) * 3;
            ok = a[0] > 180 && a[2] < 70 && b[2] > 180 && b[0] < 70;
        }
        CHECK(ok, "a JPEG with EXIF orientation %d: %lldx%lld, the red half %s (%s)", o ? 6 : 1, (long long)w, (long long)h,
              o ? "on top" : "on the left", err.msg);
        free(rgb);
        rgb = NULL;
        CHECK(st_image_decode(jpg, jl / 3, NULL, &rgb, &w, &h, &err) != ST_OK || (free(rgb), 1),
              "a JPEG cut to a third decodes or is refused, without a crash (%s)", err.msg);
        rgb = NULL;
        free(jpg);
    }
}

int main(void) {
    test_smart_resize();
    test_webp_gif();
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/fixtures/tiny-vl", tap_data_dir());
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    char *text = NULL;
    size_t len = 0;
    st_error err = {0};
    st_vision_pp p = st_vision_pp_default();
    if (!CHECK(st_file_read(path, 1 << 20, &text, &len, &err) == ST_OK && st_vision_pp_parse(text, len, &p, &err) == ST_OK &&
                   p.min_pixels == 4096 && p.max_pixels == 49152 && p.patch == 16,
               "the fixture's preprocessor config by its numbers (%s)", err.msg))
        return tap_done();
    free(text);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    st_checkpoint *g = NULL;
    if (!CHECK(st_checkpoint_open(path, &g, &err) == ST_OK, "goldens (%s)", err.msg)) return tap_done();
    const char *files[] = {"img0.png", "img1.png", "img2.png", "img3.png", "img4_rgba.png", "img5_gray.png"};
    for (int i = 0; i < 6; i++) {
        char key[64];
        snprintf(key, sizeof key, "img%d.pixel_values", i);
        const st_tensor *pv = golden_get(g, key, ST_DTYPE_F32);
        snprintf(key, sizeof key, "img%d.grid_thw", i);
        const st_tensor *gt = golden_get(g, key, ST_DTYPE_I32);
        if (!pv || !gt) continue;
        const int32_t *thw = gt->data;
        {
            int64_t h = 0, w = 0, oh = 0, ow = 0;
            snprintf(path, sizeof path, "%s/images/%s", dir, files[i]);
            uint8_t *rgb = load_image(path, &h, &w);
            if (!rgb || st_vision_smart_resize(h, w, &p, &oh, &ow, &err) != ST_OK) {
                CHECK(0, "%s loads and sizes", files[i]);
                continue;
            }
            uint8_t *rs = malloc((size_t)(oh * ow * 3));
            void *tmp = malloc(st_vision_resize_scratch(h, w, oh, ow, 3));
            st_vision_resize_bicubic(rgb, h, w, 3, rs, oh, ow, tmp);
            const int64_t np = (oh / 16) * (ow / 16);
            float *out = malloc((size_t)(np * 1536) * sizeof(float));
            st_vision_patchify(rs, oh, ow, &p, out);
            double md = 0;
            const float *want = pv->data;
            int shape_ok = thw[0] == 1 && thw[1] == oh / 16 && thw[2] == ow / 16 && pv->shape[0] == np;
            for (int64_t k = 0; shape_ok && k < np * 1536; k++) md = fmax(md, fabs((double)out[k] - want[k]));
            CHECK(shape_ok && md <= 1e-6, "%s (%lldx%lld -> %lldx%lld%s): grid (1,%d,%d), pixel_values within %.3g of the reference",
                  files[i], (long long)w, (long long)h, (long long)ow, (long long)oh,
                  i == 4 ? ", alpha dropped as the reference does" : "", thw[1], thw[2], md);
            free(rgb);
            free(rs);
            free(tmp);
            free(out);
        }
    }
    st_checkpoint_close(g);
    test_decoder(dir);
    return tap_done();
}
