/* ==== The vision tower on the GPU (private to src/backend/cuda; see vision/tower.h) ====
 *
 * vision_host.c implements st_vision_device over the launchers of vision.cu: the tower's
 * weights copied to the device once (matrices in their stored bf16/f32, f16 widened to f32;
 * vectors fp32), then each encode runs the patch embedding, the blocks and the merger on the
 * device in fp32 (the host's st_vision_encode computes the positions and rotary tables).
 */
#ifndef ST_BACKEND_CUDA_VISION_CUDA_H
#define ST_BACKEND_CUDA_VISION_CUDA_H

#include "core/status.h"

struct st_vision_tower;
struct st_vision_device;

/* A device encoder for tower v (borrowed; its weights are copied) on CUDA device `device`.
 * ST_ERR_NOMEM / ST_ERR_INTERNAL naming the CUDA failure. */
st_status cuda_vision_create(const struct st_vision_tower *v, int device, struct st_vision_device **out,
                             st_error *err);

#endif /* ST_BACKEND_CUDA_VISION_CUDA_H */
