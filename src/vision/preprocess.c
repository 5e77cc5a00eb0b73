/* ==== Image preprocessing (see preprocess.h) ==== */
#include "vision/preprocess.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

st_vision_pp st_vision_pp_default(void) {
    st_vision_pp p = {
        .patch = 16,
        .temporal = 2,
        .merge = 2,
        .min_pixels = 65536,
        .max_pixels = 16777216,
        .mean = {0.5f, 0.5f, 0.5f},
        .std = {0.5f, 0.5f, 0.5f},
        .rescale = 1.0 / 255.0,
    };
    return p;
}

static int get_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, st_error *err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        st_error_set(err, ST_ERR_FORMAT, "preprocessor config: '%s' must be an integer in [%lld, %lld]", k, (long long)lo,
                     (long long)hi);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static int get_triple(json_t *o, const char *k, int positive, float *out, st_error *err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) != 3) goto bad;
    for (int i = 0; i < 3; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_number(e)) goto bad;
        double x = json_number_value(e);
        if (!isfinite(x) || (positive && !(x > 0))) goto bad;
        out[i] = (float)x;
    }
    return 0;
bad:
    st_error_set(err, ST_ERR_FORMAT, "preprocessor config: '%s' must be 3 %snumbers", k, positive ? "positive " : "");
    return -1;
}

st_status st_vision_pp_parse(const char *text, size_t len, st_vision_pp *p, st_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return st_error_set(err, ST_ERR_FORMAT, "preprocessor config: not a JSON object (%s)", je.text);
    }
    st_status st = ST_ERR_FORMAT;
    int64_t x;
    json_t *size = json_object_get(root, "size");
    if (json_is_object(size)) {
        if (get_int(size, "shortest_edge", 1, (int64_t)1 << 40, &p->min_pixels, err)) goto out;
        if (get_int(size, "longest_edge", 1, (int64_t)1 << 40, &p->max_pixels, err)) goto out;
    }
    if (get_int(root, "min_pixels", 1, (int64_t)1 << 40, &p->min_pixels, err)) goto out;
    if (get_int(root, "max_pixels", 1, (int64_t)1 << 40, &p->max_pixels, err)) goto out;
    x = p->patch;
    if (get_int(root, "patch_size", 1, 1024, &x, err)) goto out;
    p->patch = (int)x;
    x = p->temporal;
    if (get_int(root, "temporal_patch_size", 1, 64, &x, err)) goto out;
    p->temporal = (int)x;
    x = p->merge;
    if (get_int(root, "merge_size", 1, 64, &x, err)) goto out;
    p->merge = (int)x;
    if (get_triple(root, "image_mean", 0, p->mean, err) || get_triple(root, "image_std", 1, p->std, err)) goto out;
    json_t *rf = json_object_get(root, "rescale_factor");
    if (rf && !json_is_null(rf)) {
        if (!json_is_number(rf) || !(json_number_value(rf) > 0) || !isfinite(json_number_value(rf))) {
            st_error_set(err, ST_ERR_FORMAT, "preprocessor config: 'rescale_factor' must be a positive number");
            goto out;
        }
        p->rescale = json_number_value(rf);
    }
    if (p->min_pixels > p->max_pixels) {
        st_error_set(err, ST_ERR_FORMAT, "preprocessor config: min_pixels (%lld) is above max_pixels (%lld)",
                     (long long)p->min_pixels, (long long)p->max_pixels);
        goto out;
    }
    st = ST_OK;
out:
    json_decref(root);
    return st;
}

st_status st_vision_smart_resize(int64_t h, int64_t w, const st_vision_pp *p, int64_t *out_h, int64_t *out_w,
                                 st_error *err) {
    if (h < 1 || w < 1) return st_error_set(err, ST_ERR_ARG, "an image of %lld x %lld pixels", (long long)w, (long long)h);
    const double H = (double)h, W = (double)w, F = (double)p->patch * p->merge;
    if ((H > W ? H / W : W / H) > 200)
        return st_error_set(err, ST_ERR_ARG, "an image of %lld x %lld pixels: the aspect ratio must be below 200",
                            (long long)w, (long long)h);
    /* Python's round(): ties to even, which rint gives under the default rounding mode */
    double hb = rint(H / F) * F, wb = rint(W / F) * F;
    if (hb * wb > (double)p->max_pixels) {
        const double beta = sqrt(H * W / (double)p->max_pixels);
        hb = fmax(F, floor(H / beta / F) * F);
        wb = fmax(F, floor(W / beta / F) * F);
    } else if (hb * wb < (double)p->min_pixels) {
        const double beta = sqrt((double)p->min_pixels / (H * W));
        hb = ceil(H * beta / F) * F;
        wb = ceil(W * beta / F) * F;
    }
    *out_h = (int64_t)hb;
    *out_w = (int64_t)wb;
    return ST_OK;
}

/* ---- Pillow's bicubic resample (8 bits a channel, fixed point) ---- */

#define PREC_BITS 22 /* 32 - 8 - 2 */

static double bicubic(double x) {
    const double a = -0.5;
    if (x < 0) x = -x;
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

static int64_t ksize_of(int64_t in, int64_t out) {
    const double scale = (double)in / (double)out, fscale = scale < 1 ? 1 : scale;
    return (int64_t)ceil(2.0 * fscale) * 2 + 1;
}

/* bounds [out][2] (first, count) and fixed-point weights [out][ksize] */
static void coeffs(int64_t in, int64_t out, int64_t ksize, int64_t *bounds, int32_t *k, double *w) {
    const double scale = (double)in / (double)out, fscale = scale < 1 ? 1 : scale, support = 2.0 * fscale;
    const double ss = 1.0 / fscale;
    for (int64_t i = 0; i < out; i++) {
        const double center = ((double)i + 0.5) * scale;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        const int64_t n = xmax - xmin;
        double ww = 0;
        for (int64_t x = 0; x < n; x++) {
            w[x] = bicubic(((double)(x + xmin) - center + 0.5) * ss);
            ww += w[x];
        }
        for (int64_t x = 0; x < ksize; x++) {
            double v = x < n ? (ww != 0 ? w[x] / ww : w[x]) : 0;
            k[i * ksize + x] = v < 0 ? (int32_t)(-0.5 + v * (double)(1 << PREC_BITS)) : (int32_t)(0.5 + v * (double)(1 << PREC_BITS));
        }
        bounds[2 * i] = xmin;
        bounds[2 * i + 1] = n;
    }
}

static uint8_t clip8(int32_t v) {
    v >>= PREC_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

size_t st_vision_resize_scratch(int64_t h, int64_t w, int64_t oh, int64_t ow, int ch) {
    const int64_t kh = ksize_of(w, ow), kv = ksize_of(h, oh), km = kh > kv ? kh : kv;
    return (size_t)(ow * kh + oh * kv) * sizeof(int32_t) + (size_t)(2 * (ow + oh)) * sizeof(int64_t) +
           (size_t)km * sizeof(double) + (size_t)(h * ow * ch) + 64;
}

void st_vision_resize_bicubic(const uint8_t *src, int64_t h, int64_t w, int ch, uint8_t *dst, int64_t oh, int64_t ow,
                              void *tmp) {
    const int64_t kh = ksize_of(w, ow), kv = ksize_of(h, oh);
    double *wbuf = tmp;
    int64_t *bh = (int64_t *)(wbuf + (kh > kv ? kh : kv)), *bv = bh + 2 * ow;
    int32_t *k_h = (int32_t *)(bv + 2 * oh), *k_v = k_h + ow * kh;
    uint8_t *mid = (uint8_t *)(k_v + oh * kv);
    /* horizontal pass (skipped when the width stays) */
    const uint8_t *hsrc = src;
    if (ow != w) {
        coeffs(w, ow, kh, bh, k_h, wbuf);
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < ow; x++) {
                const int64_t x0 = bh[2 * x], n = bh[2 * x + 1];
                const int32_t *k = k_h + x * kh;
                for (int c = 0; c < ch; c++) {
                    int32_t ss = 1 << (PREC_BITS - 1);
                    for (int64_t j = 0; j < n; j++) ss += (int32_t)src[(y * w + x0 + j) * ch + c] * k[j];
                    mid[(y * ow + x) * ch + c] = clip8(ss);
                }
            }
        hsrc = mid;
    }
    /* vertical pass (skipped when the height stays) */
    if (oh != h) {
        coeffs(h, oh, kv, bv, k_v, wbuf);
        for (int64_t y = 0; y < oh; y++) {
            const int64_t y0 = bv[2 * y], n = bv[2 * y + 1];
            const int32_t *k = k_v + y * kv;
            for (int64_t x = 0; x < ow; x++)
                for (int c = 0; c < ch; c++) {
                    int32_t ss = 1 << (PREC_BITS - 1);
                    for (int64_t j = 0; j < n; j++) ss += (int32_t)hsrc[((y0 + j) * ow + x) * ch + c] * k[j];
                    dst[(y * ow + x) * ch + c] = clip8(ss);
                }
        }
    } else {
        memcpy(dst, hsrc, (size_t)(oh * ow * ch));
    }
}

void st_vision_patchify(const uint8_t *rgb, int64_t h, int64_t w, const st_vision_pp *p, float *out) {
    const int P = p->patch, T = p->temporal, M = p->merge;
    const int64_t gh = h / P, gw = w / P, cols = (int64_t)3 * T * P * P;
    for (int64_t bh = 0; bh < gh / M; bh++)
        for (int64_t bw = 0; bw < gw / M; bw++)
            for (int r = 0; r < M; r++)
                for (int s = 0; s < M; s++) {
                    const int64_t n = ((bh * (gw / M) + bw) * M + r) * M + s, ph = bh * M + r, pw = bw * M + s;
                    float *row = out + n * cols;
                    for (int c = 0; c < 3; c++)
                        for (int y = 0; y < P; y++)
                            for (int x = 0; x < P; x++) {
                                const uint8_t u = rgb[((ph * P + y) * w + pw * P + x) * 3 + c];
                                const float v = ((float)u * (float)p->rescale - p->mean[c]) / p->std[c];
                                for (int t = 0; t < T; t++) row[((c * T + t) * P + y) * P + x] = v;
                            }
                }
}
