/* ==== strand bench --image: images/s through preprocessing and the vision tower ==== */
#include "apps/bench_vision.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/threadpool.h"
#include "vision/preprocess.h"
#include "vision/prompt.h"
#include "vision/tower.h"

/* the tower's arithmetic for n patches, in FLOPs: per block the four products and the
 * attention within the image (q.k and p.v), then the merger's two products on n / merge^2 rows */
static double tower_flops(const st_vision_config *c, double n) {
    const double H = c->hidden, I = c->intermediate, m = (double)c->merge * c->merge;
    const double per_block = 2.0 * n * (4.0 * H * H + 2.0 * H * I) + 4.0 * n * n * H;
    const double merger = 2.0 * (n / m) * (m * H * m * H + m * H * c->out_hidden);
    return c->depth * per_block + merger + 2.0 * n * H * (double)(c->in_channels * c->temporal * c->patch * c->patch);
}

int bench_vision(const char *dir, const long long (*sizes)[2], int n, int threads, const st_kernels *k, double seconds,
                 int json, const st_device_params *dp, st_error *err) {
    st_vision_tower *vt = NULL;
    st_vision_pp pp;
    if (st_vision_load(dir, k ? k : st_kernels_best(), &vt, err) != ST_OK) return -1;
    const int nt = threads > 0 ? threads : st_default_threads();
    if (st_vision_set_threads(vt, nt, err) != ST_OK || st_vision_pp_load(dir, &pp, err) != ST_OK ||
        st_vision_place(vt, dp, err) != ST_OK) {
        st_vision_free(vt);
        return -1;
    }
    const st_vision_config *c = &vt->cfg;
    char where[96];
    if (vt->dev) snprintf(where, sizeof where, "on %s", vt->dev->name);
    else snprintf(where, sizeof where, "%d threads", nt);
    if (!json)
        printf("vision tower: depth %d, hidden %d, %d heads, MLP %d, out %d; %s\n\n%-11s %-11s %7s %7s %10s %10s "
               "%9s %9s\n",
               c->depth, c->hidden, c->heads, c->intermediate, c->out_hidden, where, "image", "resized", "patches", "tokens",
               "preproc ms", "tower s", "images/s", "GFLOP/s");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const int64_t W = sizes[i][0], H = sizes[i][1];
        int64_t oh = 0, ow = 0;
        if (st_vision_smart_resize(H, W, &pp, &oh, &ow, err) != ST_OK) {
            rc = -1;
            break;
        }
        const int64_t gh = oh / pp.patch, gw = ow / pp.patch, np = gh * gw, tokens = np / ((int64_t)pp.merge * pp.merge);
        const int64_t pd = st_vision_patch_dim(vt);
        uint8_t *rgb = malloc((size_t)(W * H * 3)), *sized = malloc((size_t)(oh * ow * 3));
        void *tmp = malloc(st_vision_resize_scratch(H, W, oh, ow, 3));
        float *px = malloc((size_t)(np * pd) * sizeof(float));
        float *emb = malloc((size_t)(tokens * c->out_hidden) * sizeof(float));
        if (!rgb || !sized || !tmp || !px || !emb) {
            st_error_set(err, ST_ERR_NOMEM, "bench: out of memory for a %lldx%lld image", (long long)W, (long long)H);
            rc = -1;
        }
        uint64_t x = 0x9e3779b97f4a7c15ull + (uint64_t)i;
        for (int64_t j = 0; rc == 0 && j < W * H * 3; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            rgb[j] = (uint8_t)(x >> 24);
        }
        const int32_t grid[1][3] = {{1, (int32_t)gh, (int32_t)gw}};
        double pre = 0.0, tow = 0.0;
        int reps = 0;
        const double t_start = st_now_s();
        while (rc == 0 && (reps == 0 || st_now_s() - t_start < seconds)) {
            const double t0 = st_now_s();
            st_vision_resize_bicubic(rgb, H, W, 3, sized, oh, ow, tmp);
            st_vision_patchify(sized, oh, ow, &pp, px);
            const double t1 = st_now_s();
            if (st_vision_encode(vt, px, grid, 1, emb, err) != ST_OK) rc = -1;
            const double t2 = st_now_s();
            pre += t1 - t0, tow += t2 - t1;
            reps++;
        }
        if (rc == 0) {
            pre /= reps, tow /= reps;
            const double gflops = tower_flops(c, (double)np) / tow / 1e9;
            char a[32], b[32];
            snprintf(a, sizeof a, "%lldx%lld", (long long)W, (long long)H);
            snprintf(b, sizeof b, "%lldx%lld", (long long)ow, (long long)oh);
            if (json)
                printf("{\"image\": \"%s\", \"resized\": \"%s\", \"patches\": %lld, \"tokens\": %lld, \"preprocess_s\": %.6f, "
                       "\"tower_s\": %.4f, \"images_per_s\": %.4f, \"tower_gflops\": %.1f, \"reps\": %d}\n",
                       a, b, (long long)np, (long long)tokens, pre, tow, 1.0 / (pre + tow), gflops, reps);
            else
                printf("%-11s %-11s %7lld %7lld %10.1f %10.3f %9.3f %9.1f\n", a, b, (long long)np, (long long)tokens,
                       pre * 1e3, tow, 1.0 / (pre + tow), gflops);
        }
        free(rgb);
        free(sized);
        free(tmp);
        free(px);
        free(emb);
    }
    if (!json && rc == 0)
        printf("(a random image of each size; 'preproc' = smart resize, bicubic and patches; the tower's GFLOP/s counts\n"
               " its products and attention)\n");
    st_vision_free(vt);
    return rc;
}
