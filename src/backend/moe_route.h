/* ==== MoE routing: softmax over the router's logits, top-k, renormalised ====
 *
 * Header-only so that every backend (the CUDA shared object too, which links no libstrand
 * code) routes with the same arithmetic: a backend's expert choice for a token is the
 * same bits whatever device computed the router logits the same way.
 */
#ifndef ST_BACKEND_MOE_ROUTE_H
#define ST_BACKEND_MOE_ROUTE_H

#include <math.h>
#include <stdint.h>

/* p: [E] router logits, replaced by their softmax. sel, w: [k] the chosen experts (by
 * selection, ties to the lower index) and their probabilities, divided by their sum when
 * norm_topk. */
static inline void st_moe_route(float *p, int E, int k, int norm_topk, int32_t *sel, float *w) {
    float mx = p[0];
    for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < E; e++) p[e] /= sum;
    float wsum = 0.0f;
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < s; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[s] = best;
        w[s] = p[best];
        wsum += p[best];
    }
    if (norm_topk)
        for (int s = 0; s < k; s++) w[s] /= wsum;
}

#endif /* ST_BACKEND_MOE_ROUTE_H */
