/* ==== libFuzzer target: the JSON-schema compiler and the automaton under a schema ====
 * Input: a flag byte, a schema (or, flag 2, a request's tools), a NUL byte, a document. Flag
 * 1: strict; flag 4: the tools' call forced to function "f". A schema must compile or fail with a message; a document the automaton
 * calls complete under it must be JSON that jansson parses. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int strict = data[0] & 1;
    const char *schema = (const char *)data + 1;
    const char *nul = memchr(schema, 0, size - 1);
    const size_t slen = nul ? (size_t)(nul - schema) : size - 1;
    st_gram_schema *sc = NULL;
    st_error err = {0};
    const int tools = data[0] & 2; /* the text is a request's tools: a forced call's grammar */
    const st_status st = tools ? st_gram_tools_compile(schema, slen, (data[0] & 4) ? "f" : NULL, &sc, &err)
                               : st_gram_schema_compile(schema, slen, strict, &sc, &err);
    if (st != ST_OK) {
        if (!err.msg[0]) abort(); /* a refusal names its reason */
        return 0;
    }
    if (nul) {
        const char *doc = nul + 1;
        const size_t n = size - 1 - slen - 1;
        st_gram_state g;
        st_gram_init(&g, tools ? ST_GRAM_TOOL_CALL : ST_GRAM_JSON_SCHEMA);
        if (st_gram_feed(&g, sc, doc, n) && st_gram_done(&g) && !tools) {
            json_t *j = json_loadb(doc, n, JSON_DECODE_ANY, NULL);
            if (!j) abort(); /* taken as complete, yet not JSON */
            json_decref(j);
        }
    }
    st_gram_schema_free(sc);
    return 0;
}
