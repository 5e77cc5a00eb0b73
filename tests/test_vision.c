/* The vision tower against the reference (tests/data/fixtures/tiny-vl): the reference's
 * pixel values of img0 and img2 in, its vision embeddings out; with the scalar kernels and
 * with the best set of this CPU; and the refusals (no tower, bad grids). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "tap.h"
#include "vision/tower.h"

static const st_tensor *need(const st_checkpoint *g, const char *name) {
    const st_tensor *t = st_checkpoint_find(g, name);
    if (!CHECK(t != NULL, "golden tensor %s", name)) return NULL;
    return t;
}

/* largest |a - b| over the largest |b| */
static double rel_err(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN sticks */
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static void test_embeds(const char *dir, const st_checkpoint *g, const st_kernels *k, const char *kname) {
    st_error err = {0};
    st_vision_tower *v = NULL;
    if (!CHECK(st_vision_load(dir, k, &v, &err) == ST_OK, "tiny-vl's tower loads (%s kernels): %s", kname, err.msg))
        return;
    const st_tensor *p0 = need(g, "img0.pixel_values"), *p2 = need(g, "img2.pixel_values");
    const st_tensor *g0 = need(g, "img0.grid_thw"), *g2 = need(g, "img2.grid_thw"), *ref = need(g, "vision.embeds");
    if (!p0 || !p2 || !g0 || !g2 || !ref) {
        st_vision_free(v);
        return;
    }
    const int64_t D = st_vision_patch_dim(v), n0 = p0->shape[0], n2 = p2->shape[0];
    CHECK(p0->shape[1] == D && p2->shape[1] == D, "pixel rows of %lld values (the tower's patch)", (long long)D);
    float *px = malloc((size_t)((n0 + n2) * D) * sizeof(float));
    float *out = malloc((size_t)ref->numel * sizeof(float));
    memcpy(px, p0->data, (size_t)(n0 * D) * sizeof(float));
    memcpy(px + n0 * D, p2->data, (size_t)(n2 * D) * sizeof(float));
    int32_t grid[2][3];
    memcpy(grid[0], g0->data, sizeof grid[0]);
    memcpy(grid[1], g2->data, sizeof grid[1]);
    const int64_t rows = (n0 + n2) / (v->cfg.merge * v->cfg.merge);
    CHECK(rows == ref->shape[0] && v->cfg.out_hidden == ref->shape[1], "%lld embeddings of %d (the reference's %lldx%lld)",
          (long long)rows, v->cfg.out_hidden, (long long)ref->shape[0], (long long)ref->shape[1]);
    st_status st = st_vision_encode(v, px, (const int32_t(*)[3])grid, 2, out, &err);
    const double e = st == ST_OK ? rel_err(out, ref->data, ref->numel) : INFINITY;
    CHECK(st == ST_OK && e < 1e-5, "img0 + img2 through the tower (%s kernels): embeddings within 1e-5 of the "
                                   "reference (max rel err %.2e) %s", kname, e, err.msg);
    /* each image alone gives its own rows, the same bits as in the pair */
    float *solo = malloc((size_t)ref->numel * sizeof(float));
    st = st_vision_encode(v, px + n0 * D, (const int32_t(*)[3])grid + 1, 1, solo, &err);
    const int64_t r0 = n0 / (v->cfg.merge * v->cfg.merge);
    CHECK(st == ST_OK && !memcmp(solo, out + r0 * v->cfg.out_hidden, (size_t)((rows - r0) * v->cfg.out_hidden) * sizeof(float)),
          "img2 alone: the same bits as beside img0 (%s kernels)", kname);
    /* refusals */
    int32_t bad[1][3] = {{1, 3, 4}};
    CHECK(st_vision_encode(v, px, (const int32_t(*)[3])bad, 1, solo, &err) == ST_ERR_ARG && strstr(err.msg, "multiples"),
          "a grid of odd height is refused: %s", err.msg);
    free(solo);
    free(px);
    free(out);
    st_vision_free(v);
}

int main(void) {
    char dir[512], gpath[600], other[512];
    snprintf(dir, sizeof dir, "%s/fixtures/tiny-vl", tap_data_dir());
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    snprintf(other, sizeof other, "%s/fixtures/tiny-a", tap_data_dir());
    st_error err = {0};
    st_checkpoint *g = NULL;
    if (CHECK(st_checkpoint_open(gpath, &g, &err) == ST_OK, "tiny-vl goldens open (%s)", err.msg)) {
        test_embeds(dir, g, st_kernels_ref(), "ref");
        const st_kernels *best = st_kernels_best();
        test_embeds(dir, g, best, best->name);
        st_checkpoint_close(g);
    }
    st_vision_tower *v = NULL;
    CHECK(st_vision_load(other, NULL, &v, &err) == ST_ERR_MISSING && v == NULL && strstr(err.msg, "vision_config"),
          "a text-only checkpoint: no tower, and the error says so: %s", err.msg);
    return tap_done();
}
