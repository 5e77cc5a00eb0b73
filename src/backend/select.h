/* ==== Choosing the device a model runs on ====
 * `--device cpu|cuda|auto` everywhere a model runs: auto takes the GPU when a CUDA backend
 * can be made here (backend/cuda.h), else the CPU. */
#ifndef ST_BACKEND_SELECT_H
#define ST_BACKEND_SELECT_H

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cuda.h"

typedef enum st_device_kind {
    ST_DEVICE_AUTO = 0,
    ST_DEVICE_CPU = 1,
    ST_DEVICE_CUDA = 2,
} st_device_kind;

typedef struct st_device_params {
    st_device_kind kind;
    st_cpu_params cpu;
    st_cuda_params cuda;
    st_precision precision; /* given to the backend made; bf16 needs a GPU */
} st_device_params;

st_device_params st_device_default_params(void);

/* "cpu", "cuda" or "auto"; -1 for anything else. */
int st_device_parse(const char *s, st_device_kind *out);
/* "exact" or "bf16"; -1 for anything else. */
int st_precision_parse(const char *s, st_precision *out);

/* A backend for m on the device p names (auto: CUDA when available). ST_ERR_UNSUPPORTED for
 * cuda where none can be made, with the reason. */
st_status st_backend_create(const st_model *m, const st_device_params *p, st_backend **out, st_error *err);

/* Put vision tower v on the GPU when p picks one (cuda; auto where a GPU is here): its
 * arithmetic then runs there (vision/tower.h st_vision_set_device). ST_OK leaving it on the
 * host's kernels otherwise; an error where cuda is asked for and the tower cannot go there. */
struct st_vision_tower;
st_status st_vision_place(struct st_vision_tower *v, const st_device_params *p, st_error *err);

/* "cpu (avx512, 2 threads)" or "cuda (NVIDIA H200, ...)", for start-up lines. */
void st_backend_describe(const st_backend *b, char *buf, size_t cap);

#endif /* ST_BACKEND_SELECT_H */
