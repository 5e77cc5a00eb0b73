/* ==== Test helpers: reading the reference's golden tensors and comparing logits ==== */
#ifndef ST_TESTS_GOLDEN_H
#define ST_TESTS_GOLDEN_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/safetensors.h"

/* A golden tensor of the given dtype, or NULL. */
__attribute__((unused)) static const st_tensor *golden_get(const st_checkpoint *g, const char *name, st_dtype dt) {
    const st_tensor *t = st_checkpoint_find(g, name);
    if (!t || t->dtype != dt) return NULL;
    return t;
}

/* max |a - b| / max |b| over a row of n values: the fixtures' tolerance measure */
__attribute__((unused)) static double rel_row_err(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double dd = fabs((double)a[i] - (double)b[i]);
        if (!(dd <= md)) md = dd; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* worst rel_row_err over rows */
__attribute__((unused)) static double rel_rows_err(const float *a, const float *b, int64_t rows, int64_t n) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e = rel_row_err(a + r * n, b + r * n, n);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* gap between the two largest values */
__attribute__((unused)) static double top2_margin(const float *x, int64_t n) {
    double a = -INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

#endif /* ST_TESTS_GOLDEN_H */
