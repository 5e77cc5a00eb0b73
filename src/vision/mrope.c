/* M-RoPE positions (spec/vision.md 7.4). */
#include "vision/mrope.h"

st_status st_mrope_positions(const int32_t *ids, int64_t n, int32_t image_token, const int32_t (*grid)[3],
                             int n_images, int merge, int32_t (*pos)[3], int64_t *next, st_error *err) {
    int64_t st = 0, p = 0;
    int img = 0;
    for (;;) {
        int64_t ed = st;
        while (ed < n && ids[ed] != image_token) ed++;
        if (ed == n) break;
        int64_t run = 0;
        while (ed + run < n && ids[ed + run] == image_token) run++;
        if (img >= n_images)
            return st_error_set(err, ST_ERR_ARG, "the prompt holds more image-token runs than its %d image%s",
                                n_images, n_images == 1 ? "" : "s");
        const int64_t gt = grid[img][0], gh = grid[img][1] / merge, gw = grid[img][2] / merge, L = gt * gh * gw;
        if (gt < 1 || gh < 1 || gw < 1 || grid[img][1] % merge || grid[img][2] % merge || run != L)
            return st_error_set(err, ST_ERR_ARG, "image %d: a run of %lld image tokens where its %dx%dx%d grid needs %lld",
                                img + 1, (long long)run, grid[img][0], grid[img][1], grid[img][2], (long long)L);
        for (int64_t i = st; i < ed; i++) pos[i][0] = pos[i][1] = pos[i][2] = (int32_t)(p + (i - st));
        const int64_t base = p + (ed - st);
        int64_t k = ed;
        for (int64_t a = 0; a < gt; a++)
            for (int64_t i = 0; i < gh; i++)
                for (int64_t j = 0; j < gw; j++, k++) {
                    pos[k][0] = (int32_t)(base + a);
                    pos[k][1] = (int32_t)(base + i);
                    pos[k][2] = (int32_t)(base + j);
                }
        int64_t span = gt > gh ? gt : gh;
        if (gw > span) span = gw;
        p = base + span;
        st = ed + L;
        img++;
    }
    if (img != n_images)
        return st_error_set(err, ST_ERR_ARG, "the prompt holds %d image-token run%s for %d images", img,
                            img == 1 ? "" : "s", n_images);
    for (int64_t i = st; i < n; i++) pos[i][0] = pos[i][1] = pos[i][2] = (int32_t)(p + (i - st));
    *next = p + (n - st);
    return ST_OK;
}
