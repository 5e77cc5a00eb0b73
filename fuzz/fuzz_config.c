/* ==== libFuzzer target: the config.json parser ==== */
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_config c;
    st_error err;
    if (st_config_parse((const char *)data, size, "fuzz", &c, &err) == ST_OK) st_config_free(&c);
    return 0;
}
