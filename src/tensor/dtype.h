/* ==== Element types of stored tensors (the safetensors set) ==== */
#ifndef ST_TENSOR_DTYPE_H
#define ST_TENSOR_DTYPE_H

#include <stddef.h>

/* Element types (append-only; values are never renumbered). */
typedef enum st_dtype {
    ST_DTYPE_F32 = 0,
    ST_DTYPE_F16 = 1,
    ST_DTYPE_BF16 = 2,
    ST_DTYPE_U32 = 3,
    ST_DTYPE_I32 = 4,
    ST_DTYPE_U8 = 5,
    ST_DTYPE_I8 = 6,
    ST_DTYPE_F64 = 7,
    ST_DTYPE_I64 = 8,
    ST_DTYPE_U64 = 9,
    ST_DTYPE_I16 = 10,
    ST_DTYPE_U16 = 11,
    ST_DTYPE_BOOL = 12,
    ST_DTYPE_F8_E4M3 = 13,
    ST_DTYPE_F8_E5M2 = 14,
    ST_DTYPE_COUNT
} st_dtype;

size_t st_dtype_size(st_dtype dt);
const char *st_dtype_name(st_dtype dt);
/* Returns 0 and sets *out for a safetensors dtype name ("BF16", ...), -1 when unknown. */
int st_dtype_parse(const char *name, st_dtype *out);

#endif /* ST_TENSOR_DTYPE_H */
