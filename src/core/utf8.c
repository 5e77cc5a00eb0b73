/* ==== UTF-8 validation and counting (see utf8.h) ==== */
#include "core/utf8.h"

#include <string.h>

int st_utf8_lead(uint8_t b0, uint8_t *lo, uint8_t *hi, int *len) {
    if (b0 >= 0xC2 && b0 <= 0xDF) *lo = 0x80, *hi = 0xBF, *len = 2;
    else if (b0 == 0xE0) *lo = 0xA0, *hi = 0xBF, *len = 3;
    else if (b0 >= 0xE1 && b0 <= 0xEC) *lo = 0x80, *hi = 0xBF, *len = 3;
    else if (b0 == 0xED) *lo = 0x80, *hi = 0x9F, *len = 3;
    else if (b0 >= 0xEE && b0 <= 0xEF) *lo = 0x80, *hi = 0xBF, *len = 3;
    else if (b0 == 0xF0) *lo = 0x90, *hi = 0xBF, *len = 4;
    else if (b0 >= 0xF1 && b0 <= 0xF3) *lo = 0x80, *hi = 0xBF, *len = 4;
    else if (b0 == 0xF4) *lo = 0x80, *hi = 0x8F, *len = 4;
    else return 0;
    return 1;
}

int st_utf8_seq(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        if (cp) *cp = b0;
        return 1;
    }
    uint8_t lo = 0, hi = 0;
    int len = 0;
    if (!st_utf8_lead(b0, &lo, &hi, &len) || (size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    if (cp) {
        uint32_t c = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
        for (int k = 1; k < len; k++) c = (c << 6) | (s[k] & 0x3F);
        *cp = c;
    }
    return len;
}

size_t st_utf8_check(const void *p, size_t n) {
    const uint8_t *s = p;
    size_t i = 0;
    while (i < n) {
        /* fast path: 8 ASCII bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int len = st_utf8_seq(s + i, n - i, NULL);
        if (!len) return i;
        i += (size_t)len;
    }
    return n;
}

size_t st_utf8_count(const void *p, size_t n) {
    const uint8_t *s = p;
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (s[i] & 0xC0) != 0x80;
    return c;
}
