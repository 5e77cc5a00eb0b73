/* ==== libFuzzer target: the safetensors header parser ====
 * Any byte string is parsed as a whole safetensors file; on success every tensor's bytes
 * are touched to prove the validated offsets stay inside the buffer. */
#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_sf_header h;
    st_error err;
    if (st_sf_parse(data, size, "fuzz", &h, &err) != ST_OK) return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < h.n_tensors; i++) {
        const uint8_t *p = h.tensors[i].data;
        if (h.tensors[i].nbytes) sink ^= p[0] ^ p[h.tensors[i].nbytes - 1];
    }
    (void)sink;
    st_sf_header_free(&h);
    return 0;
}
