/* ==== libFuzzer target: the JSON automaton (grammar/grammar.h) ====
 * The first byte picks the mode (even: one object, odd: any value), the rest is fed. What the
 * automaton takes as a complete reply must be JSON that jansson parses (an object in object
 * mode), and feeding byte by byte must agree with feeding at once. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const st_gram_mode mode = data[0] % 2 ? ST_GRAM_JSON_VALUE : ST_GRAM_JSON_OBJECT;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    st_gram_state all, one;
    st_gram_init(&all, mode);
    st_gram_init(&one, mode);
    const int ok = st_gram_feed(&all, NULL, text, n);
    size_t i = 0;
    while (i < n && st_gram_feed(&one, NULL, text + i, 1)) i++;
    if (ok != (i == n)) abort(); /* byte by byte disagrees */
    if (!ok || !st_gram_done(&all)) return 0;
    json_error_t e;
    json_t *j = json_loadb(text, n, JSON_DECODE_ANY, &e);
    if (!j) abort(); /* taken as complete, yet not JSON */
    if (mode == ST_GRAM_JSON_OBJECT && !json_is_object(j)) abort();
    json_decref(j);
    return 0;
}
