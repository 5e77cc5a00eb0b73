/* ==== Template lexer: jinja2's tokenizer with trim_blocks and lstrip_blocks ====
 *
 * Splits template source into data and tag tokens exactly where jinja2 3.1's lexer does:
 *   - `{{ }}`, `{% %}`, `{# #}` with `-` (strip whitespace on that side) and `+` (keep it);
 *   - trim_blocks: a block or comment end eats one following newline (unless `+%}`);
 *   - lstrip_blocks: spaces and tabs between a line start and `{%` / `{#` are dropped (not
 *     before `{{`, nor with `{%+`), where "line start" also covers the text right after a
 *     tag that ended with a newline;
 *   - `{% raw %}...{% endraw %}` passes text through;
 *   - inside tags: names, Python-style string literals (unicode-escape decoding), integers
 *     (with _ separators, 0b/0o/0x), floats, operators, and bracket balancing (so `}}` inside
 *     a dict literal does not end the tag).
 * The source given is already newline-normalised (\r\n and \r -> \n, one trailing \n
 * dropped), as jinja2 does before lexing. Tokens point into the source or the template arena.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"

#define LEX_MAX_BRACKETS 1024

typedef struct lexer {
    st_tmpl *t;
    const char *src; /* [len] */
    size_t len;
    size_t pos;
    int line;          /* line of pos */
    size_t line_pos;   /* position line was computed at */
    tj_token *toks;    /* [cap], malloc'ed */
    int64_t n, cap;
    st_error *err;
    char brackets[LEX_MAX_BRACKETS];
    int nbr;
} lexer;

static int line_at(lexer *lx, size_t pos) {
    if (pos < lx->line_pos) { /* rare: recount from the start */
        lx->line = 1;
        lx->line_pos = 0;
    }
    for (size_t i = lx->line_pos; i < pos && i < lx->len; i++)
        if (lx->src[i] == '\n') lx->line++;
    lx->line_pos = pos;
    return lx->line;
}

static st_status lex_err(lexer *lx, size_t pos, const char *fmt, const char *arg) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    return st_error_set(lx->err, ST_ERR_FORMAT, "line %d: %s", line_at(lx, pos), msg);
}

static st_status push(lexer *lx, uint8_t type, size_t at, const char *s, size_t len) {
    if (lx->n == lx->cap) {
        int64_t nc = lx->cap ? lx->cap * 2 : 256;
        tj_token *nt = realloc(lx->toks, (size_t)nc * sizeof *nt);
        if (!nt) return st_error_set(lx->err, ST_ERR_NOMEM, "out of memory");
        lx->toks = nt;
        lx->cap = nc;
    }
    tj_token *k = &lx->toks[lx->n++];
    memset(k, 0, sizeof *k);
    k->type = type;
    k->line = line_at(lx, at);
    k->s = s;
    k->len = len;
    return ST_OK;
}

/* Skip a run of Python whitespace starting at p. */
static size_t skip_ws(const char *s, size_t len, size_t p) {
    while (p < len) {
        size_t q = p;
        uint32_t c = tj_utf8_next(s, len, &q);
        if (!tj_py_isspace(c)) break;
        p = q;
    }
    return p;
}

/* End of s[a..b) after Python's rstrip(). */
static size_t rstrip_end(const char *s, size_t a, size_t b) {
    while (b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        size_t q = st;
        uint32_t c = tj_utf8_next(s, b, &q);
        if (!tj_py_isspace(c)) break;
        b = st;
    }
    return b;
}

static bool starts(const lexer *lx, size_t p, const char *lit) {
    size_t n = strlen(lit);
    return p + n <= lx->len && memcmp(lx->src + p, lit, n) == 0;
}

/* Apply jinja2's OptionalLStrip to the text src[a..b) before a tag whose sign is `sign`;
 * returns the new end of the text. */
static size_t strip_before(const lexer *lx, size_t a, size_t b, char sign, bool is_var,
                           bool line_starting) {
    if (sign == '-') return rstrip_end(lx->src, a, b);
    if (sign == '+' || is_var) return b;
    size_t l_pos = a;
    bool has_nl = false;
    for (size_t i = b; i > a; i--) {
        if (lx->src[i - 1] == '\n') {
            l_pos = i;
            has_nl = true;
            break;
        }
    }
    if (!has_nl && !line_starting) return b;
    for (size_t i = l_pos; i < b; i++)
        if (lx->src[i] != ' ' && lx->src[i] != '\t') return b;
    return l_pos;
}

/* `{%` [-+] \s* raw \s* (-%}\s* | %}) at p: returns the end, or 0. */
static size_t match_raw_begin(const lexer *lx, size_t p) {
    size_t q = p + 2;
    if (q < lx->len && (lx->src[q] == '-' || lx->src[q] == '+')) q++;
    q = skip_ws(lx->src, lx->len, q);
    if (!starts(lx, q, "raw")) return 0;
    q = skip_ws(lx->src, lx->len, q + 3);
    if (starts(lx, q, "-%}")) return skip_ws(lx->src, lx->len, q + 3);
    if (starts(lx, q, "%}")) return q + 2;
    return 0;
}

/* `{%` [-+] \s* endraw \s* (+%} | -%}\s* | %}\n?) at p: returns the end, or 0. */
static size_t match_raw_end(const lexer *lx, size_t p, char *sign) {
    size_t q = p + 2;
    *sign = 0;
    if (q < lx->len && (lx->src[q] == '-' || lx->src[q] == '+')) *sign = lx->src[q++];
    q = skip_ws(lx->src, lx->len, q);
    if (!starts(lx, q, "endraw")) return 0;
    q = skip_ws(lx->src, lx->len, q + 6);
    if (starts(lx, q, "+%}")) return q + 3;
    if (starts(lx, q, "-%}")) return skip_ws(lx->src, lx->len, q + 3);
    if (starts(lx, q, "%}")) {
        q += 2;
        if (q < lx->len && lx->src[q] == '\n') q++;
        return q;
    }
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at p: end, or 0 when no digit at p. */
static size_t match_digits(const lexer *lx, size_t p) {
    if (p >= lx->len || !is_digit(lx->src[p])) return 0;
    while (p < lx->len && is_digit(lx->src[p])) p++;
    while (p + 1 < lx->len && lx->src[p] == '_' && is_digit(lx->src[p + 1])) {
        p++;
        while (p < lx->len && is_digit(lx->src[p])) p++;
    }
    return p;
}

static size_t match_float(const lexer *lx, size_t p) {
    if (p > 0 && lx->src[p - 1] == '.') return 0;
    size_t d = match_digits(lx, p);
    if (!d) return 0;
    /* fraction? then exponent */
    size_t q = d;
    if (q < lx->len && lx->src[q] == '.') {
        size_t f = match_digits(lx, q + 1);
        if (f) q = f;
    }
    if (q < lx->len && (lx->src[q] == 'e' || lx->src[q] == 'E')) {
        size_t r = q + 1;
        if (r < lx->len && (lx->src[r] == '+' || lx->src[r] == '-')) r++;
        size_t e = match_digits(lx, r);
        if (e) return e;
    }
    if (d < lx->len && lx->src[d] == '.') {
        size_t f = match_digits(lx, d + 1);
        if (f) return f;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = (char)(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Integer literal at p: end (0 if none) and its value via *v (*big on overflow). */
static size_t match_int(const lexer *lx, size_t p, int64_t *v, bool *big) {
    const char *s = lx->src;
    size_t n = lx->len;
    *big = false;
    if (p >= n || !is_digit(s[p])) return 0;
    if (s[p] == '0' && p + 1 < n) {
        char k = (char)(s[p + 1] | 0x20);
        int base = k == 'b' ? 2 : k == 'o' ? 8 : k == 'x' ? 16 : 0;
        if (base) {
            size_t q = p + 2;
            uint64_t acc = 0;
            bool any = false;
            for (;;) {
                size_t r = q;
                if (r < n && s[r] == '_') r++;
                int dv = r < n ? hexval(s[r]) : -1;
                if (dv < 0 || dv >= base) break;
                if (acc > (UINT64_MAX - (uint64_t)dv) / (uint64_t)base) *big = true;
                acc = acc * (uint64_t)base + (uint64_t)dv;
                any = true;
                q = r + 1;
            }
            if (any) {
                if (acc > (uint64_t)INT64_MAX) *big = true;
                *v = (int64_t)acc;
                return q;
            }
        }
    }
    if (s[p] == '0') { /* 0(_?0)* */
        size_t q = p + 1;
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && s[r] == '0') q = r + 1;
            else break;
        }
        *v = 0;
        return q;
    }
    size_t q = p;
    uint64_t acc = 0;
    for (;;) {
        size_t r = q;
        if (r > p && r < n && s[r] == '_') r++;
        if (r >= n || !is_digit(s[r])) break;
        uint64_t dv = (uint64_t)(s[r] - '0');
        if (acc > (UINT64_MAX - dv) / 10) *big = true;
        acc = acc * 10 + dv;
        q = r + 1;
    }
    if (acc > (uint64_t)INT64_MAX) *big = true;
    *v = (int64_t)acc;
    return q;
}

static bool name_char(uint32_t c, bool first) {
    if (c < 0x80) {
        if (c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return true;
        return !first && c >= '0' && c <= '9';
    }
    if (c == 0xb7) return !first;
    if (tj_py_isalpha(c)) return true;
    return !first && tj_py_isalnum(c);
}

/* Decode a Python string literal body (after jinja2's backslashreplace trick). */
static st_status unescape(lexer *lx, size_t at, const char *s, size_t n, const char **out,
                          size_t *out_len) {
    tj_buf b = {0};
    tj_arena *a = &lx->t->arena;
#define PUTB(p, k)                                                                          \
    do {                                                                                    \
        if (tj_buf_reserve(a, &b, (k)) != 0) return st_error_set(lx->err, ST_ERR_NOMEM, "out of memory"); \
        memcpy(b.data + b.len, (p), (k));                                                   \
        b.len += (k);                                                                       \
        b.data[b.len] = 0;                                                                  \
    } while (0)
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            size_t st = i;
            i++;
            while (i < n && s[i] != '\\') i++;
            PUTB(s + st, i - st);
            continue;
        }
        char e = s[i + 1];
        i += 2;
        char u8[8];
        uint32_t cp = 0;
        switch (e) {
        case '\n': break;
        case '\\': PUTB("\\", 1); break;
        case '\'': PUTB("'", 1); break;
        case '"': PUTB("\"", 1); break;
        case 'a': PUTB("\a", 1); break;
        case 'b': PUTB("\b", 1); break;
        case 'f': PUTB("\f", 1); break;
        case 'n': PUTB("\n", 1); break;
        case 'r': PUTB("\r", 1); break;
        case 't': PUTB("\t", 1); break;
        case 'v': PUTB("\v", 1); break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            cp = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                cp = cp * 8 + (uint32_t)(s[i++] - '0');
            int m = tj_utf8_put(cp, u8);
            PUTB(u8, (size_t)m);
            break;
        }
        case 'x': case 'u': case 'U': {
            int need = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            for (int k = 0; k < need; k++) {
                int h = i + (size_t)k < n ? hexval(s[i + (size_t)k]) : -1;
                if (h < 0) {
                    static const char *msg[] = {"truncated \\xXX escape", "truncated \\uXXXX escape",
                                                "truncated \\UXXXXXXXX escape"};
                    return lex_err(lx, at, "%s", msg[e == 'x' ? 0 : e == 'u' ? 1 : 2]);
                }
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)need;
            if (cp > 0x10ffff) return lex_err(lx, at, "%s", "illegal Unicode character");
            int m = tj_utf8_put(cp, u8);
            PUTB(u8, (size_t)m);
            break;
        }
        case 'N':
            return lex_err(lx, at, "%s", "\\N{...} escapes are not supported");
        default:
            if ((unsigned char)e >= 0x80) {
                /* jinja2 first turns non-ASCII into \xNN / \uNNNN / \UNNNNNNNN text, so a
                 * backslash before it escapes that backslash and the text stays. */
                size_t q = i - 1;
                uint32_t ch = tj_utf8_next(s, n, &q);
                char t[16];
                if (ch <= 0xff) snprintf(t, sizeof t, "\\x%02x", ch);
                else if (ch <= 0xffff) snprintf(t, sizeof t, "\\u%04x", ch);
                else snprintf(t, sizeof t, "\\U%08x", ch);
                PUTB(t, strlen(t));
                i = q;
            } else {
                PUTB("\\", 1);
                PUTB(&e, 1);
            }
            break;
        }
    }
#undef PUTB
    if (!b.data) {
        if (tj_buf_reserve(a, &b, 0) != 0) return st_error_set(lx->err, ST_ERR_NOMEM, "out of memory");
        b.data[0] = 0;
    }
    *out = b.data;
    *out_len = b.len;
    return ST_OK;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char ops1[] = "+-/*%~[](){}><=.:|,;";

/* Lex the inside of a `{%` or `{{` tag, up to and including its end. */
static st_status lex_tag(lexer *lx, bool is_block, bool *line_starting) {
    st_status st;
    lx->nbr = 0;
    for (;;) {
        size_t p = lx->pos;
        if (p >= lx->len) return ST_OK; /* unterminated: the parser reports it */
        if (lx->nbr == 0) {
            size_t e = 0;
            if (is_block) {
                if (starts(lx, p, "+%}")) e = p + 3;
                else if (starts(lx, p, "-%}")) e = skip_ws(lx->src, lx->len, p + 3);
                else if (starts(lx, p, "%}")) {
                    e = p + 2;
                    if (e < lx->len && lx->src[e] == '\n') e++;
                }
            } else {
                if (starts(lx, p, "-}}")) e = skip_ws(lx->src, lx->len, p + 3);
                else if (starts(lx, p, "}}")) e = p + 2;
            }
            if (e) {
                if ((st = push(lx, is_block ? TJ_T_BLOCK_END : TJ_T_VAR_END, p, lx->src + p,
                               e - p)) != ST_OK)
                    return st;
                *line_starting = lx->src[e - 1] == '\n';
                lx->pos = e;
                return ST_OK;
            }
        }
        size_t q = p;
        uint32_t c = tj_utf8_next(lx->src, lx->len, &q);
        if (tj_py_isspace(c)) {
            lx->pos = skip_ws(lx->src, lx->len, p);
            continue;
        }
        size_t e = match_float(lx, p);
        if (e) {
            char tmp[128];
            size_t k = 0;
            for (size_t i = p; i < e && k < sizeof tmp - 1; i++)
                if (lx->src[i] != '_') tmp[k++] = lx->src[i];
            tmp[k] = 0;
            if ((st = push(lx, TJ_T_FLOAT, p, lx->src + p, e - p)) != ST_OK) return st;
            lx->toks[lx->n - 1].f = strtod(tmp, NULL);
            lx->pos = e;
            continue;
        }
        int64_t iv;
        bool big;
        e = match_int(lx, p, &iv, &big);
        if (e) {
            if (big) return lex_err(lx, p, "%s", "integer literal too large (64-bit integers only)");
            if ((st = push(lx, TJ_T_INT, p, lx->src + p, e - p)) != ST_OK) return st;
            lx->toks[lx->n - 1].i = iv;
            lx->pos = e;
            continue;
        }
        if (name_char(c, false) && !(c >= '0' && c <= '9')) {
            size_t r = p;
            while (r < lx->len) {
                size_t r2 = r;
                uint32_t ch = tj_utf8_next(lx->src, lx->len, &r2);
                if (!name_char(ch, false)) break;
                r = r2;
            }
            if (!name_char(c, true)) return lex_err(lx, p, "%s", "Invalid character in identifier");
            if ((st = push(lx, TJ_T_NAME, p, lx->src + p, r - p)) != ST_OK) return st;
            lx->pos = r;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t r = p + 1;
            bool closed = false;
            while (r < lx->len) {
                if (lx->src[r] == '\\') {
                    r += 2;
                    continue;
                }
                if ((unsigned char)lx->src[r] == c) {
                    closed = true;
                    break;
                }
                r++;
            }
            if (closed) {
                const char *val = NULL;
                size_t vlen = 0;
                if ((st = unescape(lx, p, lx->src + p + 1, r - p - 1, &val, &vlen)) != ST_OK)
                    return st;
                if ((st = push(lx, TJ_T_STRING, p, val, vlen)) != ST_OK) return st;
                lx->pos = r + 1;
                continue;
            }
        }
        size_t oplen = 0;
        for (int k = 0; ops2[k]; k++)
            if (starts(lx, p, ops2[k])) oplen = 2;
        if (!oplen && c < 0x80 && c && strchr(ops1, (int)c)) oplen = 1;
        if (oplen) {
            if (oplen == 1) {
                char ch = (char)c;
                if (ch == '(' || ch == '[' || ch == '{') {
                    if (lx->nbr >= LEX_MAX_BRACKETS)
                        return lex_err(lx, p, "%s", "brackets nested too deeply");
                    lx->brackets[lx->nbr++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
                } else if (ch == ')' || ch == ']' || ch == '}') {
                    if (lx->nbr == 0) {
                        char t[2] = {ch, 0};
                        return lex_err(lx, p, "unexpected '%s'", t);
                    }
                    char want = lx->brackets[--lx->nbr];
                    if (want != ch) {
                        char t[64];
                        snprintf(t, sizeof t, "unexpected '%c', expected '%c'", ch, want);
                        return lex_err(lx, p, "%s", t);
                    }
                }
            }
            if ((st = push(lx, TJ_T_OP, p, lx->src + p, oplen)) != ST_OK) return st;
            lx->pos = p + oplen;
            continue;
        }
        char t[64];
        char chs[8] = {0};
        memcpy(chs, lx->src + p, q - p);
        if (c == '\'') snprintf(t, sizeof t, "unexpected char \"'\" at %zu", st_utf8_count(lx->src, p));
        else snprintf(t, sizeof t, "unexpected char '%s' at %zu", chs, st_utf8_count(lx->src, p));
        return lex_err(lx, p, "%s", t);
    }
}

st_status tj_lex(st_tmpl *t, const char *src, size_t len, tj_token **toks, int64_t *ntoks,
                 st_error *err) {
    lexer lx = {.t = t, .src = src, .len = len, .line = 1, .err = err};
    st_status st = ST_OK;
    bool line_starting = true;
    while (lx.pos < len) {
        size_t p = lx.pos, k = p;
        int kind = 0; /* '{', '%', '#', 'r' (raw) */
        for (; k + 1 < len; k++) {
            if (src[k] == '{' && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
                kind = src[k + 1];
                break;
            }
        }
        if (!kind) {
            st = push(&lx, TJ_T_DATA, p, src + p, len - p);
            lx.pos = len;
            break;
        }
        char sign = 0;
        if (k + 2 < len && (src[k + 2] == '-' || src[k + 2] == '+')) sign = src[k + 2];
        size_t raw_end = kind == '%' ? match_raw_begin(&lx, k) : 0;
        if (raw_end) kind = 'r';
        size_t te = strip_before(&lx, p, k, sign, kind == '{', line_starting);
        if (te > p && (st = push(&lx, TJ_T_DATA, p, src + p, te - p)) != ST_OK) break;
        line_starting = false;
        if (kind == '#') {
            size_t q = k + 2 + (sign ? 1 : 0), j = q;
            while (j + 1 < len && !(src[j] == '#' && src[j + 1] == '}')) j++;
            if (j + 1 >= len) {
                st = lex_err(&lx, k, "%s", "Missing end of comment tag");
                break;
            }
            size_t e;
            if (j > q && src[j - 1] == '-') e = skip_ws(src, len, j + 2);
            else if (j > q && src[j - 1] == '+') e = j + 2;
            else {
                e = j + 2;
                if (e < len && src[e] == '\n') e++;
            }
            line_starting = src[e - 1] == '\n';
            lx.pos = e;
            continue;
        }
        if (kind == 'r') {
            line_starting = src[raw_end - 1] == '\n';
            size_t j = raw_end, end = 0;
            char esign = 0;
            for (; j + 1 < len; j++) {
                if (src[j] == '{' && src[j + 1] == '%' && (end = match_raw_end(&lx, j, &esign)))
                    break;
            }
            if (!end) {
                st = lex_err(&lx, k, "%s", "Missing end of raw directive");
                break;
            }
            size_t de = strip_before(&lx, raw_end, j, esign, false, line_starting);
            if (de > raw_end && (st = push(&lx, TJ_T_DATA, raw_end, src + raw_end, de - raw_end)) != ST_OK)
                break;
            line_starting = src[end - 1] == '\n';
            lx.pos = end;
            continue;
        }
        bool is_block = kind == '%';
        if ((st = push(&lx, is_block ? TJ_T_BLOCK_BEGIN : TJ_T_VAR_BEGIN, k, src + k,
                       2 + (sign ? 1 : 0))) != ST_OK)
            break;
        lx.pos = k + 2 + (sign ? 1 : 0);
        if ((st = lex_tag(&lx, is_block, &line_starting)) != ST_OK) break;
    }
    if (st == ST_OK) st = push(&lx, TJ_T_EOF, len, src + len, 0);
    if (st != ST_OK) {
        free(lx.toks);
        *toks = NULL;
        *ntoks = 0;
        return st;
    }
    *toks = lx.toks;
    *ntoks = lx.n;
    return ST_OK;
}
