/* ==== Tokenizer regexes: Oniguruma patterns run by PCRE2 ====
 *
 * Hugging Face `tokenizers` compiles Split patterns with Oniguruma (Ruby-like syntax, UTF-8).
 * PCRE2 with PCRE2_UTF | PCRE2_UCP agrees with it on \p{L}, \p{N}, \p{M}, \d and on the
 * case-insensitive contractions of the GPT-2/Qwen patterns (checked code point by code point
 * against libonig), but differs on a few escapes, which we rewrite before compiling:
 *   \s, \S   Oniguruma: White_Space; PCRE2 also matches U+180E  -> explicit class
 *   \w, \W   Oniguruma: Alphabetic, marks, Nd, Pc (+ outside [...] a Latin-1 quirk);
 *            PCRE2 10.42: letters, numbers, underscore             -> explicit class
 *   \h, \H   Oniguruma: hex digit; PCRE2: horizontal space         -> [0-9a-fA-F]
 *   \v       Oniguruma: vertical tab only                          -> \x{0B}
 *   \uHHHH   Oniguruma only                                        -> \x{HHHH}
 *   (?m)     Oniguruma: dot matches newline                        -> (?s)
 *   ^ $      Oniguruma: always line anchors                        -> PCRE2_MULTILINE
 *   \b, \B   boundaries over Oniguruma's \w                        -> lookarounds
 * Constructs whose meaning differs and that are not rewritten (nested classes and && inside
 * [...], POSIX classes [:name:], \W or \H inside [...], \Q) are rejected with
 * ST_ERR_UNSUPPORTED rather than silently changed.
 *
 * A compiled pattern is read-only and shared by all threads; match data is per call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* Class bodies (without brackets) for the rewritten escapes. */
static const char WS_ITEMS[] = "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                               "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
static const char NOT_WS_ITEMS[] =
    "\\x{0}-\\x{8}\\x{E}-\\x{1F}\\x{21}-\\x{84}\\x{86}-\\x{9F}\\x{A1}-\\x{167F}"
    "\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}\\x{2030}-\\x{205E}"
    "\\x{2060}-\\x{2FFF}\\x{3001}-\\x{10FFFF}";
/* Oniguruma's \w: outside a class it also takes U+B2 B3 B9 BC-BE (a Latin-1 ctype quirk);
 * inside a class it does not. */
static const char WORD_ITEMS[] =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
static const char WORD_ITEMS_IN_CLASS[] = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
static const char HEX_ITEMS[] = "0-9a-fA-F";

/* ==== Pattern translation ==== */

typedef struct tr_buf {
    char *buf;  /* [cap] caller's buffer (may be NULL when cap == 0) */
    size_t cap;
    size_t len; /* bytes that would have been written */
} tr_buf;

static void tr_put(tr_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++, b->len++)
        if (b->len + 1 < b->cap) b->buf[b->len] = s[i];
}
static void tr_str(tr_buf *b, const char *s) { tr_put(b, s, strlen(s)); }

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

long st_tok_regex_translate(const char *p, size_t n, char *out, size_t cap, st_error *err) {
    tr_buf b = {out, cap, 0};
    int in_class = 0;
    size_t class_first = 0; /* index where a ']' is still literal (just after '[' or '[^') */
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        if (c == '\\') {
            if (i + 1 >= n) {
                st_error_set(err, ST_ERR_FORMAT, "pattern ends with a lone backslash");
                return -1;
            }
            char d = p[i + 1];
            switch (d) {
            case 's':
                if (in_class) tr_str(&b, WS_ITEMS);
                else tr_str(&b, "["), tr_str(&b, WS_ITEMS), tr_str(&b, "]");
                i += 2;
                continue;
            case 'S':
                if (in_class) tr_str(&b, NOT_WS_ITEMS);
                else tr_str(&b, "[^"), tr_str(&b, WS_ITEMS), tr_str(&b, "]");
                i += 2;
                continue;
            case 'w':
                if (in_class) tr_str(&b, WORD_ITEMS_IN_CLASS);
                else tr_str(&b, "["), tr_str(&b, WORD_ITEMS), tr_str(&b, "]");
                i += 2;
                continue;
            case 'h':
                if (in_class) tr_str(&b, HEX_ITEMS);
                else tr_str(&b, "["), tr_str(&b, HEX_ITEMS), tr_str(&b, "]");
                i += 2;
                continue;
            case 'W':
            case 'H':
                if (in_class) {
                    st_error_set(err, ST_ERR_UNSUPPORTED,
                                 "pattern uses \\%c inside a character class (offset %zu)", d, i);
                    return -1;
                }
                tr_str(&b, "[^"), tr_str(&b, d == 'W' ? WORD_ITEMS : HEX_ITEMS), tr_str(&b, "]");
                i += 2;
                continue;
            case 'b':
            case 'B':
                if (in_class) break; /* backspace */
                /* a word boundary over Oniguruma's \w, as lookarounds */
                tr_str(&b, d == 'b' ? "(?:(?<=[" : "(?:(?<=[");
                tr_str(&b, WORD_ITEMS);
                tr_str(&b, d == 'b' ? "])(?![" : "])(?=[");
                tr_str(&b, WORD_ITEMS);
                tr_str(&b, d == 'b' ? "])|(?<![" : "])|(?<![");
                tr_str(&b, WORD_ITEMS);
                tr_str(&b, d == 'b' ? "])(?=[" : "])(?![");
                tr_str(&b, WORD_ITEMS);
                tr_str(&b, "]))");
                i += 2;
                continue;
            case 'v':
                tr_str(&b, "\\x{B}");
                i += 2;
                continue;
            case 'Q':
                st_error_set(err, ST_ERR_UNSUPPORTED, "pattern uses \\Q (offset %zu)", i);
                return -1;
            case 'u':
                if (i + 5 < n && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                    is_hex(p[i + 5])) {
                    tr_str(&b, "\\x{");
                    tr_put(&b, p + i + 2, 4);
                    tr_str(&b, "}");
                    i += 6;
                    continue;
                }
                st_error_set(err, ST_ERR_FORMAT, "pattern has a bad \\u escape (offset %zu)", i);
                return -1;
            case 'p':
            case 'P':
                /* copy \p{...} whole so nothing inside is looked at */
                if (i + 2 < n && p[i + 2] == '{') {
                    size_t j = i + 3;
                    while (j < n && p[j] != '}') j++;
                    if (j >= n) {
                        st_error_set(err, ST_ERR_FORMAT, "pattern has an unclosed \\%c{ (offset %zu)",
                                     d, i);
                        return -1;
                    }
                    tr_put(&b, p + i, j + 1 - i);
                    i = j + 1;
                    continue;
                }
                break;
            default:
                break;
            }
            tr_put(&b, p + i, 2);
            i += 2;
            continue;
        }
        if (in_class) {
            if (c == '[') {
                if (i + 1 < n && p[i + 1] == ':') {
                    st_error_set(err, ST_ERR_UNSUPPORTED,
                                 "pattern uses a POSIX bracket class [:name:] (offset %zu)", i);
                    return -1;
                }
                st_error_set(err, ST_ERR_UNSUPPORTED,
                             "pattern nests a character class inside another (offset %zu)", i);
                return -1;
            }
            if (c == '&' && i + 1 < n && p[i + 1] == '&') {
                st_error_set(err, ST_ERR_UNSUPPORTED,
                             "pattern uses class intersection && (offset %zu)", i);
                return -1;
            }
            if (c == ']' && i != class_first) in_class = 0;
            tr_put(&b, &c, 1);
            i++;
            continue;
        }
        if (c == '[') {
            in_class = 1;
            tr_put(&b, &c, 1);
            i++;
            if (i < n && p[i] == '^') {
                tr_put(&b, "^", 1);
                i++;
            }
            class_first = i;
            continue;
        }
        if (c == '(' && i + 1 < n && p[i + 1] == '?') {
            /* an option group "(?imx-imx)" or "(?imx-imx:": Oniguruma's m is PCRE2's s */
            size_t j = i + 2;
            while (j < n && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) j++;
            if (j > i + 2 && j < n && (p[j] == ')' || p[j] == ':')) {
                tr_str(&b, "(?");
                for (size_t k = i + 2; k < j; k++) tr_put(&b, p[k] == 'm' ? "s" : p + k, 1);
                i = j;
                continue;
            }
        }
        tr_put(&b, &c, 1);
        i++;
    }
    if (b.cap) b.buf[b.len < b.cap ? b.len : b.cap - 1] = '\0';
    return (long)b.len;
}

/* ==== Compile and match ==== */

st_status st_tok_regex_compile(st_tok_regex *re, const char *pat, size_t len, int literal,
                               const char *what, st_error *err) {
    memset(re, 0, sizeof *re);
    char *src = NULL;
    size_t src_len = len;
    uint32_t opts = PCRE2_UTF;
    if (literal) {
        opts |= PCRE2_LITERAL; /* (UCP and NEVER_BACKSLASH_C are not allowed with it) */
    } else {
        opts |= PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C;
        long need = st_tok_regex_translate(pat, len, NULL, 0, err);
        if (need < 0) {
            st_error_prefix(err, "%s: ", what);
            return err ? err->status : ST_ERR_FORMAT;
        }
        src = malloc((size_t)need + 1);
        if (!src) return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", what);
        st_tok_regex_translate(pat, len, src, (size_t)need + 1, NULL);
        src_len = (size_t)need;
        opts |= PCRE2_MULTILINE;
    }
    int ec = 0;
    PCRE2_SIZE eoff = 0;
    re->code = pcre2_compile((PCRE2_SPTR)(src ? src : pat), src_len, opts, &ec, &eoff, NULL);
    free(src);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return st_error_set(err, ST_ERR_FORMAT, "%s: bad regex (PCRE2 error at offset %zu: %s)",
                            what, (size_t)eoff, (const char *)msg);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    return ST_OK;
}

void st_tok_regex_free(st_tok_regex *re) {
    if (!re) return;
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

int st_tok_regex_find(const st_tok_regex *re, const char *s, size_t n, size_t start,
                      pcre2_match_data *md, pcre2_match_context *mctx, size_t *ms, size_t *me,
                      st_error *err) {
    int rc;
    if (re->jit) {
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, 0, md, mctx);
        /* the JIT's small machine stack can run out on deeply nested patterns: the
         * interpreter keeps its backtracking state on the heap (bounded by mctx) */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             md, mctx);
    } else {
        rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        st_error_set(err, ST_ERR_LIMIT, "pre-tokenizer regex failed on the input: %s",
                     (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    /* \K in a lookahead can report start > end; treat such a match as empty at its end */
    *me = ov[1];
    *ms = ov[0] <= ov[1] ? ov[0] : ov[1];
    if (*ms < start) *ms = start;
    if (*me < *ms) *me = *ms;
    return 1;
}
