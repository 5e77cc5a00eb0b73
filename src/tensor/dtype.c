/* ==== Element types of stored tensors (see dtype.h) ==== */
#include "tensor/dtype.h"

#include <string.h>

#include "core/status.h"

static const struct {
    const char *name;
    size_t size;
} dtype_table[ST_DTYPE_COUNT] = {
    [ST_DTYPE_F32] = {"F32", 4},       [ST_DTYPE_F16] = {"F16", 2},
    [ST_DTYPE_BF16] = {"BF16", 2},     [ST_DTYPE_U32] = {"U32", 4},
    [ST_DTYPE_I32] = {"I32", 4},       [ST_DTYPE_U8] = {"U8", 1},
    [ST_DTYPE_I8] = {"I8", 1},         [ST_DTYPE_F64] = {"F64", 8},
    [ST_DTYPE_I64] = {"I64", 8},       [ST_DTYPE_U64] = {"U64", 8},
    [ST_DTYPE_I16] = {"I16", 2},       [ST_DTYPE_U16] = {"U16", 2},
    [ST_DTYPE_BOOL] = {"BOOL", 1},     [ST_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [ST_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(st_dtype dt) {
    ST_ASSERT(dt >= 0 && dt < ST_DTYPE_COUNT);
    return dtype_table[dt].size;
}

const char *st_dtype_name(st_dtype dt) {
    if (dt < 0 || dt >= ST_DTYPE_COUNT) return "?";
    return dtype_table[dt].name;
}

int st_dtype_parse(const char *name, st_dtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

