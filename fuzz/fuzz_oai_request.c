/* ==== libFuzzer target: the OpenAI request path (JSON body -> engine request) ====
 * The first byte picks the endpoint; the rest is the body. Parsed requests are also turned
 * back into tool-call text parsing and error JSON, the other pure pieces of the path. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/oai.h"
#include "server/toolcall.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    st_oai_defaults d = {0};
    d.sampling = st_sampling_default();
    d.max_tokens_completion = 16;
    d.model_name = (data[0] & 2) ? "m" : NULL;
    d.max_images = (data[0] & 4) ? 3 : 0; /* image_url parts decoded (data URLs) or refused */
    st_oai_request r;
    st_oai_error e;
    st_oai_kind kind = (data[0] & 1) ? ST_OAI_COMPLETION : ST_OAI_CHAT;
    if (st_oai_parse(kind, (const char *)data + 1, size - 1, &d, &r, &e) == ST_OK) {
        st_oai_request_free(&r);
    } else {
        free(st_oai_error_json(&e));
    }
    st_tool_calls tc;
    if (st_toolcall_parse((const char *)data + 1, size - 1, NULL, &tc)) st_tool_calls_free(&tc);
    return 0;
}
