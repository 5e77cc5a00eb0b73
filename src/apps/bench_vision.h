/* ==== strand bench --image (bench_vision.c) ==== */
#ifndef ST_APPS_BENCH_VISION_H
#define ST_APPS_BENCH_VISION_H

#include "core/status.h"
#include "backend/select.h"
#include "kernels/kernels.h"

/* The image path of the checkpoint in dir: for each sizes[i] = (width, height), a random
 * image of that size through preprocessing (smart resize, bicubic, patches) and the vision
 * tower, repeated for about `seconds`; prints each part's time and images/s (or JSON lines).
 * threads 0: every CPU; k NULL: the best kernel set; dp: the device the tower runs on (a GPU
 * where it picks one: st_vision_place). -1 with err on a failure. */
int bench_vision(const char *dir, const long long (*sizes)[2], int n, int threads, const st_kernels *k, double seconds,
                 int json, const st_device_params *dp, st_error *err);

#endif /* ST_APPS_BENCH_VISION_H */
