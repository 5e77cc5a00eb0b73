/* ==== Vision preprocessing against the reference (tiny-vl pixel goldens) ====
 * smart_resize on the spec's worked examples; the fixture's preprocessor config read by its
 * numbers; each image decoded (libpng, test side: built with ST_TEST_PNG when the Makefile
 * finds libpng), resized with Pillow's bicubic and cut into patches: pixel_values and
 * grid_thw equal to the reference's (Pillow backend). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "golden.h"
#include "tap.h"
#include "vision/preprocess.h"

#if ST_TEST_PNG
#include <png.h>

/* an 8-bit PNG as RGB, alpha dropped (as the reference's convert("RGB") does: img4_rgba
 * matches only so; composited on white it differs by up to 1.0); NULL on error */
static uint8_t *load_png(const char *path, int64_t *h, int64_t *w) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) return NULL;
    im.format = PNG_FORMAT_RGBA;
    uint8_t *rgba = malloc((size_t)PNG_IMAGE_SIZE(im));
    if (!rgba || !png_image_finish_read(&im, NULL, rgba, 0, NULL)) {
        free(rgba);
        png_image_free(&im);
        return NULL;
    }
    *h = im.height;
    *w = im.width;
    uint8_t *rgb = malloc((size_t)(*h * *w * 3));
    for (int64_t i = 0; rgb && i < *h * *w; i++)
        for (int c = 0; c < 3; c++) rgb[i * 3 + c] = rgba[i * 4 + c];
    free(rgba);
    return rgb;
}
#endif

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

int main(void) {
    test_smart_resize();
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
#if !ST_TEST_PNG
    CHECK(1, "the images' pixel checks skipped: built without libpng (scripts/deps.sh installs libpng-dev)");
    return tap_done();
#else
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
            uint8_t *rgb = load_png(path, &h, &w);
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
    return tap_done();
#endif
}
