/* ==== What textout must produce for a whole text, written independently of it ====
 *
 * The streaming pipeline (engine/textout.c) sees the text a token at a time and holds back
 * bounded tails; this oracle sees the whole decoded text at once. For any cut of the text
 * into tokens the two must agree. Used by tests/test_textout.c and fuzz/fuzz_textout.c.
 *   stop:  the match that completes first (the longest among those completing at the same
 *          byte) ends the text before it;
 *   split: in reasoning until the first "</think>"; reasoning loses its leading whitespace
 *          (once, at its start) and at most ST_TEXTOUT_WS_HOLD bytes of whitespace before the
 *          tag or the end; content loses its leading whitespace, and "<think>" at the very
 *          start of the content (after whitespace) opens a think block.
 */
#ifndef ST_TESTS_TEXTOUT_ORACLE_H
#define ST_TESTS_TEXTOUT_ORACLE_H

#include <stdlib.h>
#include <string.h>

#include "engine/textout.h"

typedef struct oracle_out {
    char *content, *reasoning; /* malloc'ed, [len + 1] */
    size_t content_len, reasoning_len;
    int stopped;
} oracle_out;

static int oracle_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static void oracle_append(char *dst, size_t *len, const char *s, size_t n) {
    memcpy(dst + *len, s, n);
    *len += n;
    dst[*len] = 0;
}

/* text[0..n): the whole decoded text (special tokens skipped) */
static oracle_out textout_oracle(const char *text, size_t n, const char *const *stops, int n_stop,
                                 int split, int start_in_reasoning) {
    oracle_out o;
    memset(&o, 0, sizeof o);
    o.content = calloc(n + 1, 1);
    o.reasoning = calloc(n + 1, 1);
    size_t len = n;
    for (size_t e = 1; e <= n && !o.stopped; e++) {
        size_t best = 0;
        for (int i = 0; i < n_stop; i++) {
            size_t sl = strlen(stops[i]);
            if (sl <= e && memcmp(text + e - sl, stops[i], sl) == 0 && sl > best) best = sl;
        }
        if (best) {
            len = e - best;
            o.stopped = 1;
        }
    }
    if (!split) {
        oracle_append(o.content, &o.content_len, text, len);
        return o;
    }
    size_t pos = 0;
    int in_r = start_in_reasoning, r_started = 0, c_started = 0;
    while (pos <= len) {
        if (in_r) {
            size_t m = pos, found = 0;
            for (; m + 8 <= len; m++)
                if (memcmp(text + m, "</think>", 8) == 0) {
                    found = 1;
                    break;
                }
            size_t end = found ? m : len, a = pos, b = end, cut = 0;
            while (b > a && cut < ST_TEXTOUT_WS_HOLD && oracle_ws(text[b - 1])) b--, cut++;
            if (!r_started)
                while (a < b && oracle_ws(text[a])) a++;
            if (b > a) {
                r_started = 1;
                oracle_append(o.reasoning, &o.reasoning_len, text + a, b - a);
            }
            if (!found) break;
            pos = m + 8;
            in_r = 0;
            continue;
        }
        if (!c_started) {
            while (pos < len && oracle_ws(text[pos])) pos++;
            if (pos + 7 <= len && memcmp(text + pos, "<think>", 7) == 0) {
                pos += 7;
                in_r = 1;
                continue;
            }
        }
        if (len > pos) {
            oracle_append(o.content, &o.content_len, text + pos, len - pos);
            c_started = 1;
        }
        break;
    }
    return o;
}

static void oracle_free(oracle_out *o) {
    free(o->content);
    free(o->reasoning);
}

#endif /* ST_TESTS_TEXTOUT_ORACLE_H */
