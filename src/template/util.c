/* ==== Template engine utilities: arena, byte buffers, UTF-8, Python character classes ====
 *
 * Python's str methods work on code points and use Unicode properties; this file gives the
 * template engine the same classes (isspace, isprintable, isalnum...) and case mappings,
 * via utf8proc, plus Python's float repr(). Everything here is pure and thread-safe.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template/tj_int.h"

/* ==== Arena ==== */

void *tj_arena_alloc(tj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tj_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = 64 * 1024;
        if (c && c->cap < (size_t)8 << 20) cap = c->cap * 2;
        if (cap < n) cap = n;
        if (a->limit && a->total + cap > a->limit) {
            if (a->total + n > a->limit) return NULL;
            cap = n;
        }
        tj_chunk *nc = malloc(sizeof *nc + cap);
        if (!nc) return NULL;
        nc->next = c;
        nc->cap = cap;
        nc->used = 0;
        a->head = nc;
        a->total += cap;
        c = nc;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

void tj_arena_free(tj_arena *a) {
    if (!a) return;
    tj_chunk *c = a->head;
    while (c) {
        tj_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ==== Byte buffers (arena-backed) ==== */

int tj_buf_reserve(tj_arena *a, tj_buf *b, size_t n) {
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) {
        if (cap > SIZE_MAX / 4) return -1;
        cap *= 2;
    }
    tj_str *hdr = tj_arena_alloc(a, sizeof(tj_str) + cap);
    if (!hdr) return -1;
    if (b->len) memcpy(hdr->data, b->data, b->len);
    b->data = hdr->data;
    b->cap = cap;
    return 0;
}

/* ==== UTF-8 ==== */

uint32_t tj_utf8_next(const char *s, size_t len, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t p = *i;
    uint32_t c = u[p];
    if (c < 0x80 || p + 1 >= len) {
        *i = p + 1;
        return c;
    }
    if (c < 0xe0) {
        *i = p + 2;
        return ((c & 0x1f) << 6) | (u[p + 1] & 0x3f);
    }
    if (c < 0xf0) {
        if (p + 2 >= len) { *i = len; return 0xfffd; }
        *i = p + 3;
        return ((c & 0x0f) << 12) | ((uint32_t)(u[p + 1] & 0x3f) << 6) | (u[p + 2] & 0x3f);
    }
    if (p + 3 >= len) { *i = len; return 0xfffd; }
    *i = p + 4;
    return ((c & 0x07) << 18) | ((uint32_t)(u[p + 1] & 0x3f) << 12) |
           ((uint32_t)(u[p + 2] & 0x3f) << 6) | (u[p + 3] & 0x3f);
}

int tj_utf8_put(uint32_t cp, char *out) {
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd; /* lone surrogates cannot be encoded */
    if (cp > 0x10ffff) cp = 0xfffd;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t tj_utf8_offset(const char *s, size_t len, size_t k) {
    size_t i = 0;
    while (k > 0 && i < len) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xc0) == 0x80) i++;
        k--;
    }
    return i;
}

/* ==== Python character classes ==== */

bool tj_py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20);
    switch (c) {
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200a;
    }
}

static int cat(uint32_t c) { return (int)utf8proc_category((utf8proc_int32_t)c); }

bool tj_py_isprintable(uint32_t c) {
    if (c == ' ') return true;
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x7f) return true;
    switch (cat(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

bool tj_py_isalpha(uint32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    int k = cat(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

bool tj_py_isdigit(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return cat(c) == UTF8PROC_CATEGORY_ND;
}

bool tj_py_isalnum(uint32_t c) {
    if (c < 0x80) return tj_py_isalpha(c) || (c >= '0' && c <= '9');
    int k = cat(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

bool tj_py_islinebreak(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
           c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool tj_py_iscased_upper(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z';
    return utf8proc_isupper((utf8proc_int32_t)c) != 0;
}

bool tj_py_iscased_lower(uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z';
    return utf8proc_islower((utf8proc_int32_t)c) != 0;
}

bool tj_py_istitle_cp(uint32_t c) { return c >= 0x80 && cat(c) == UTF8PROC_CATEGORY_LT; }

uint32_t tj_py_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
}

uint32_t tj_py_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

uint32_t tj_py_title(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
}

/* ==== Python float repr ==== */

void tj_float_repr(double x, char *buf) {
    if (isnan(x)) {
        strcpy(buf, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(buf, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        strcpy(buf, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    /* the shortest %.{p}e that reads back exactly: the digits Python's repr() uses */
    char tmp[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *q = tmp;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    char digits[24];
    int nd = 0;
    while (*q && *q != 'e') {
        if (*q != '.') digits[nd++] = *q;
        q++;
    }
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(q + 1);
    int decpt = exp10 + 1; /* x = 0.digits * 10^decpt */
    char *o = buf;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}
