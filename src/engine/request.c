/* ==== A request's defaults and names (scheduler.h): plain data, no scheduler ====
 * Apart from scheduler.c so that the request parser (server/oai.c) and its fuzz target link
 * without the engine. */
#include <string.h>

#include "engine/scheduler.h"

const char *st_finish_name(st_finish_reason r) {
    switch (r) {
    case ST_FINISH_STOP: return "stop";
    case ST_FINISH_LENGTH: return "length";
    case ST_FINISH_CANCELLED: return "cancelled";
    case ST_FINISH_ERROR: return "error";
    default: return "none";
    }
}

st_req_params st_req_default_params(void) {
    st_req_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 0;
    p.sampling = st_sampling_default();
    p.logprobs = -1;
    p.skip_special = 1;
    return p;
}
