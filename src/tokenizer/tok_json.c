/* ==== Tokenizer: a strict, allocation-free JSON scanner for the big sections ====
 *
 * jansson builds a tree node per value; for model.vocab (150k+ pairs) and model.merges
 * (150k+ pairs) of a Qwen tokenizer.json that costs ~0.4 s. This scanner walks the text
 * directly instead: it validates as it goes (RFC 8259 grammar, UTF-8, escapes, surrogates,
 * nesting depth) and hands strings over without building anything. The loader uses it to find
 * the spans of model.vocab and model.merges, reads those two itself, and gives jansson a copy
 * of the document with the two spans replaced by {} and [] for everything else.
 *
 * Duplicate keys behave as in jansson (and serde): the last occurrence wins.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_json.h"
#include "tokenizer/tok_internal.h"

#define TJ_MAX_DEPTH 1024

static void ws(tj_cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int fail(tj_cur *c, const char *what) {
    if (!c->err) {
        c->err = what;
        c->err_at = c->p;
    }
    return -1;
}

int st_tok_tj_peek(tj_cur *c) {
    ws(c);
    return c->p < c->end ? (unsigned char)*c->p : -1;
}

int st_tok_tj_expect(tj_cur *c, char ch) {
    ws(c);
    if (c->p >= c->end || *c->p != ch) return fail(c, ch == ':' ? "expected ':'" : "unexpected character");
    c->p++;
    return 0;
}

static int hexval(char h) {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
}

static int hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        x = (x << 4) | (uint32_t)h;
    }
    *v = x;
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int st_tok_tj_string(tj_cur *c, tj_str *out) {
    ws(c);
    if (c->p >= c->end || *c->p != '"') return fail(c, "expected a string");
    const char *s = ++c->p, *q = s;
    /* fast path: no escapes */
    while (q < c->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    if (q >= c->end) return c->p = q, fail(c, "unterminated string");
    if (*q == '"') {
        if (st_utf8_check((const uint8_t *)s, (size_t)(q - s)) != (size_t)(q - s))
            return c->p = s + st_utf8_check((const uint8_t *)s, (size_t)(q - s)),
                   fail(c, "invalid UTF-8 in a string");
        out->s = s;
        out->len = (size_t)(q - s);
        c->p = q + 1;
        return 0;
    }
    /* slow path: unescape into the scratch buffer (never longer than the source) */
    const char *e = q;
    while (e < c->end && *e != '"') {
        if (*e == '\\' && e + 1 < c->end) e++;
        e++;
    }
    if (e >= c->end) return c->p = c->end, fail(c, "unterminated string");
    size_t need = (size_t)(e - s) + 1;
    if (need > c->scratch_cap) {
        char *nb = realloc(c->scratch, need);
        if (!nb) return fail(c, "out of memory");
        c->scratch = nb;
        c->scratch_cap = need;
    }
    char *o = c->scratch;
    size_t w = 0;
    const char *p = s;
    while (p < e) {
        unsigned char ch = (unsigned char)*p;
        if (ch < 0x20) return c->p = p, fail(c, "control character in a string");
        if (ch != '\\') {
            int l = st_utf8_seq((const uint8_t *)p, (size_t)(e - p), NULL);
            if (l <= 0) return c->p = p, fail(c, "invalid UTF-8 in a string");
            memcpy(o + w, p, (size_t)l);
            w += (size_t)l;
            p += l;
            continue;
        }
        if (p + 1 >= e) return c->p = p, fail(c, "bad escape");
        char x = p[1];
        p += 2;
        switch (x) {
        case '"': o[w++] = '"'; break;
        case '\\': o[w++] = '\\'; break;
        case '/': o[w++] = '/'; break;
        case 'b': o[w++] = '\b'; break;
        case 'f': o[w++] = '\f'; break;
        case 'n': o[w++] = '\n'; break;
        case 'r': o[w++] = '\r'; break;
        case 't': o[w++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (e - p < 4 || hex4(p, &cp) != 0) return c->p = p, fail(c, "bad \\u escape");
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) != 0 ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return c->p = p, fail(c, "unpaired surrogate in \\u escape");
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return c->p = p, fail(c, "unpaired surrogate in \\u escape");
            }
            w += put_utf8(o + w, cp);
            break;
        }
        default: return c->p = p - 1, fail(c, "bad escape");
        }
    }
    out->s = o;
    out->len = w;
    c->p = e + 1;
    return 0;
}

int st_tok_tj_int(tj_cur *c, int64_t *v) {
    ws(c);
    const char *p = c->p;
    int neg = 0;
    if (p < c->end && *p == '-') neg = 1, p++;
    if (p >= c->end || *p < '0' || *p > '9') return fail(c, "expected an integer");
    if (*p == '0' && p + 1 < c->end && p[1] >= '0' && p[1] <= '9')
        return fail(c, "leading zero in a number");
    int64_t x = 0;
    int big = 0;
    while (p < c->end && *p >= '0' && *p <= '9') {
        if (x > (INT64_MAX - 9) / 10) big = 1;
        else x = x * 10 + (*p - '0');
        p++;
    }
    if (p < c->end && (*p == '.' || *p == 'e' || *p == 'E')) return fail(c, "not an integer");
    c->p = p;
    *v = big ? (neg ? INT64_MIN : INT64_MAX) : (neg ? -x : x);
    return 0;
}

static int skip_number(tj_cur *c) {
    const char *p = c->p;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end || *p < '0' || *p > '9') return fail(c, "bad number");
    if (*p == '0') p++;
    else
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    if (p < c->end && *p == '.') {
        p++;
        if (p >= c->end || *p < '0' || *p > '9') return c->p = p, fail(c, "bad number");
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || *p < '0' || *p > '9') return c->p = p, fail(c, "bad number");
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 0;
}

static int skip_literal(tj_cur *c, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0) return fail(c, "bad literal");
    c->p += n;
    return 0;
}

int st_tok_tj_skip(tj_cur *c) {
    /* iterative: a stack of open containers ('{' or '['), `after` says a value just ended */
    char stack[TJ_MAX_DEPTH];
    int depth = 0;
    for (;;) {
        int ch = st_tok_tj_peek(c);
        if (ch < 0) return fail(c, "unexpected end of input");
        tj_str s;
        switch (ch) {
        case '{':
        case '[':
            if (depth >= TJ_MAX_DEPTH) return fail(c, "nested too deeply");
            stack[depth++] = (char)ch;
            c->p++;
            ch = st_tok_tj_peek(c);
            if (ch == (stack[depth - 1] == '{' ? '}' : ']')) {
                c->p++;
                depth--;
                goto value_done;
            }
            if (stack[depth - 1] == '{') {
                if (st_tok_tj_string(c, &s) || st_tok_tj_expect(c, ':')) return -1;
            }
            continue;
        case '"':
            if (st_tok_tj_string(c, &s)) return -1;
            break;
        case 't': if (skip_literal(c, "true")) return -1; break;
        case 'f': if (skip_literal(c, "false")) return -1; break;
        case 'n': if (skip_literal(c, "null")) return -1; break;
        default:
            if (ch == '-' || (ch >= '0' && ch <= '9')) {
                if (skip_number(c)) return -1;
                break;
            }
            return fail(c, "unexpected character");
        }
    value_done:
        while (depth > 0) {
            ch = st_tok_tj_peek(c);
            char close = stack[depth - 1] == '{' ? '}' : ']';
            if (ch == ',') {
                c->p++;
                if (stack[depth - 1] == '{' && (st_tok_tj_string(c, &s) || st_tok_tj_expect(c, ':')))
                    return -1;
                break; /* next value */
            }
            if (ch != close) return fail(c, "expected ',' or a closing bracket");
            c->p++;
            depth--;
        }
        if (depth == 0) return 0;
    }
}

int st_tok_tj_next(tj_cur *c, char open, int *first) {
    int ch = st_tok_tj_peek(c);
    char close = open == '{' ? '}' : ']';
    if (*first) {
        *first = 0;
        if (ch == close) {
            c->p++;
            return 0;
        }
        return ch < 0 ? fail(c, "unexpected end of input") : 1;
    }
    if (ch == ',') {
        c->p++;
        return 1;
    }
    if (ch == close) {
        c->p++;
        return 0;
    }
    return fail(c, "expected ',' or a closing bracket");
}

void st_tok_tj_where(const char *start, const tj_cur *c, int *line, int *col) {
    const char *at = c->err_at ? c->err_at : c->p;
    if (at > c->end) at = c->end;
    int l = 1, k = 1;
    for (const char *p = start; p < at; p++) {
        if (*p == '\n') l++, k = 1;
        else k++;
    }
    *line = l;
    *col = k;
}
