/* ==== libFuzzer target: the GBNF compiler and the matcher under a grammar ====
 * Input: a grammar, a NUL byte, a reply. A grammar must compile or fail with a message; a
 * reply is fed byte by byte (the match state stays within its bounds whatever comes), and a
 * reply the matcher calls a sentence must feed again the same way from a fresh state. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    const size_t glen = nul ? (size_t)(nul - text) : size;
    st_gram_schema *sc = NULL;
    st_error err = {0};
    if (st_gram_gbnf_compile(text, glen, &sc, &err) != ST_OK) {
        if (!err.msg[0]) abort(); /* a refusal names its reason */
        return 0;
    }
    if (nul) {
        const char *reply = nul + 1;
        const size_t n = size - glen - 1;
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_GBNF);
        st_gram_begin(&g, sc);
        size_t fed = 0;
        while (fed < n && st_gram_feed(&g, sc, reply + fed, 1)) fed++;
        if (fed == n && st_gram_may_end(&g)) {
            st_gram_state h;
            st_gram_init(&h, ST_GRAM_GBNF);
            st_gram_begin(&h, sc);
            if (!st_gram_feed(&h, sc, reply, n) || !st_gram_may_end(&h)) abort(); /* the same bytes, another verdict */
        }
    }
    st_gram_schema_free(sc);
    return 0;
}
