/* ==== Template methods and globals: Python str/dict/list methods, range(), namespace() ====
 *
 * Templates call Python methods on their values: 'x'.startswith(...), content.split('</think>'),
 * text.strip('\n'), d.items(), d.get(k, default), ... This file binds those (by receiver
 * type, as jinja2's sandbox exposes them: the mutating list/dict methods resolve to an
 * "unsafe" undefined that errors when called) and implements them on UTF-8 strings with
 * code-point indexing. It also holds the global functions (range with the sandbox's
 * 100000 cap, dict, namespace, raise_exception, strftime_now). Formatting (`%`,
 * str.format) is in format.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/tj_int.h"

/* ==== Method table ==== */

typedef enum tj_method_id {
    M_NONE = 0,
    /* str */
    M_CAPITALIZE, M_CASEFOLD, M_CENTER, M_COUNT, M_ENDSWITH, M_FIND, M_FORMAT, M_INDEX,
    M_ISALNUM, M_ISALPHA, M_ISASCII, M_ISDECIMAL, M_ISDIGIT, M_ISLOWER, M_ISNUMERIC, M_ISSPACE,
    M_ISTITLE, M_ISUPPER, M_JOIN, M_LJUST, M_LOWER, M_LSTRIP, M_PARTITION, M_REMOVEPREFIX,
    M_REMOVESUFFIX, M_REPLACE, M_RFIND, M_RINDEX, M_RJUST, M_RPARTITION, M_RSPLIT, M_RSTRIP,
    M_SPLIT, M_SPLITLINES, M_STARTSWITH, M_STRIP, M_SWAPCASE, M_TITLE, M_UPPER, M_ZFILL,
    M_STR_UNSUPPORTED,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DCOPY,
    /* list / tuple */
    M_LCOUNT, M_LINDEX, M_LCOPY,
    /* loop */
    M_CYCLE, M_CHANGED,
} tj_method_id;

typedef struct mentry {
    const char *name;
    uint16_t id;
} mentry;

static const mentry str_methods[] = {
    {"capitalize", M_CAPITALIZE}, {"casefold", M_CASEFOLD}, {"center", M_CENTER},
    {"count", M_COUNT}, {"endswith", M_ENDSWITH}, {"find", M_FIND}, {"format", M_FORMAT},
    {"index", M_INDEX}, {"isalnum", M_ISALNUM}, {"isalpha", M_ISALPHA}, {"isascii", M_ISASCII},
    {"isdecimal", M_ISDECIMAL}, {"isdigit", M_ISDIGIT}, {"islower", M_ISLOWER},
    {"isnumeric", M_ISNUMERIC}, {"isspace", M_ISSPACE}, {"istitle", M_ISTITLE},
    {"isupper", M_ISUPPER}, {"join", M_JOIN}, {"ljust", M_LJUST}, {"lower", M_LOWER},
    {"lstrip", M_LSTRIP}, {"partition", M_PARTITION}, {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX}, {"replace", M_REPLACE}, {"rfind", M_RFIND},
    {"rindex", M_RINDEX}, {"rjust", M_RJUST}, {"rpartition", M_RPARTITION},
    {"rsplit", M_RSPLIT}, {"rstrip", M_RSTRIP}, {"split", M_SPLIT},
    {"splitlines", M_SPLITLINES}, {"startswith", M_STARTSWITH}, {"strip", M_STRIP},
    {"swapcase", M_SWAPCASE}, {"title", M_TITLE}, {"upper", M_UPPER}, {"zfill", M_ZFILL},
    {"encode", M_STR_UNSUPPORTED}, {"expandtabs", M_STR_UNSUPPORTED},
    {"format_map", M_STR_UNSUPPORTED}, {"isidentifier", M_STR_UNSUPPORTED},
    {"isprintable", M_STR_UNSUPPORTED}, {"maketrans", M_STR_UNSUPPORTED},
    {"translate", M_STR_UNSUPPORTED}, {NULL, 0}};

static const mentry dict_methods[] = {{"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS},
                                      {"values", M_VALUES}, {"copy", M_DCOPY}, {NULL, 0}};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update",
                                          NULL};
static const mentry list_methods[] = {{"count", M_LCOUNT}, {"index", M_LINDEX},
                                      {"copy", M_LCOPY}, {NULL, 0}};
static const char *const list_unsafe[] = {"append", "clear", "extend", "insert", "pop",
                                          "remove", "reverse", "sort", NULL};
static const mentry loop_methods[] = {{"cycle", M_CYCLE}, {"changed", M_CHANGED}, {NULL, 0}};

static int find_entry(const mentry *t, const char *name, size_t len) {
    for (int i = 0; t[i].name; i++)
        if (strlen(t[i].name) == len && memcmp(t[i].name, name, len) == 0) return t[i].id;
    return 0;
}

static bool in_list(const char *const *t, const char *name, size_t len) {
    for (int i = 0; t[i]; i++)
        if (strlen(t[i]) == len && memcmp(t[i], name, len) == 0) return true;
    return false;
}

static tj_val method_val(tj_render *rs, tj_val self, int id) {
    tj_method *m = tj_alloc(rs, sizeof *m);
    m->self = self;
    m->mid = (uint16_t)id;
    tj_val v = {.kind = TJ_METHOD};
    v.as.bm = m;
    return v;
}

bool tj_method_lookup(tj_render *rs, tj_val obj, const char *name, size_t len, tj_val *out) {
    int id = 0;
    switch ((tj_kind)obj.kind) {
    case TJ_STR: id = find_entry(str_methods, name, len); break;
    case TJ_DICT:
        id = find_entry(dict_methods, name, len);
        if (!id && in_list(dict_unsafe, name, len)) {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(len < 60 ? len : 60), name);
            *out = tj_undef_unsafe(rs, obj, nm);
            return true;
        }
        break;
    case TJ_LIST:
        if (obj.as.l->type != TJ_L_LIST && obj.as.l->type != TJ_L_TUPLE) break;
        id = find_entry(list_methods, name, len);
        if (id == M_LCOPY && obj.as.l->type == TJ_L_TUPLE) id = 0;
        if (!id && obj.as.l->type == TJ_L_LIST && in_list(list_unsafe, name, len)) {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(len < 60 ? len : 60), name);
            *out = tj_undef_unsafe(rs, obj, nm);
            return true;
        }
        break;
    case TJ_LOOP: id = find_entry(loop_methods, name, len); break;
    default: break;
    }
    if (!id) return false;
    *out = method_val(rs, obj, id);
    return true;
}

/* ==== Argument binding ==== */

void tj_bind(tj_render *rs, const char *fname, tj_args *args, int np, const char *const *names,
             tj_val *out) {
    for (int i = 0; i < np; i++) {
        out[i] = tj_undef_plain();
        out[i].id = 0xffff;
    }
    if (args->n > np)
        tj_fail(rs, ST_ERR_ARG, "%s() takes at most %d argument%s (%d given)", fname, np,
                np == 1 ? "" : "s", args->n);
    for (int i = 0; i < args->n; i++) out[i] = args->pos[i];
    for (int k = 0; k < args->nkw; k++) {
        int idx = -1;
        for (int i = 0; i < np; i++)
            if (strlen(names[i]) == args->kw[k].len &&
                memcmp(names[i], args->kw[k].name, args->kw[k].len) == 0)
                idx = i;
        if (idx < 0)
            tj_fail(rs, ST_ERR_ARG, "%s() got an unexpected keyword argument '%s'", fname,
                    args->kw[k].name);
        if (tj_given(out[idx]))
            tj_fail(rs, ST_ERR_ARG, "%s() got multiple values for argument '%s'", fname,
                    names[idx]);
        out[idx] = args->kw[k].v;
    }
}

static void need_args(tj_render *rs, const char *fname, tj_args *a, int lo, int hi) {
    if (a->nkw) tj_fail(rs, ST_ERR_ARG, "%s() takes no keyword arguments", fname);
    if (a->n < lo || a->n > hi) {
        if (lo == hi)
            tj_fail(rs, ST_ERR_ARG, "%s() takes exactly %d argument%s (%d given)", fname, lo,
                    lo == 1 ? "" : "s", a->n);
        tj_fail(rs, ST_ERR_ARG, "%s() takes at most %d argument%s (%d given)", fname, hi,
                hi == 1 ? "" : "s", a->n);
    }
}

static const tj_str *want_str(tj_render *rs, tj_val v, const char *what) {
    if (v.kind != TJ_STR)
        tj_fail(rs, ST_ERR_ARG, "%s must be str, not %s", what, tj_type_name(v));
    return v.as.s;
}

static int64_t want_int(tj_render *rs, tj_val v, const char *what) {
    if (!tj_is_intlike(v))
        tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer (%s)",
                tj_type_name(v), what);
    return v.as.i;
}

/* ==== String helpers (code points over UTF-8) ==== */

typedef struct cps {
    uint32_t *cp; /* [n] */
    size_t *off;  /* [n + 1] byte offsets */
    size_t n;
} cps;

static cps decode(tj_render *rs, const tj_str *s) {
    cps c;
    c.n = s->ncp;
    c.cp = tj_alloc(rs, (c.n + 1) * sizeof(uint32_t));
    c.off = tj_alloc(rs, (c.n + 1) * sizeof(size_t));
    size_t p = 0;
    for (size_t k = 0; k < c.n; k++) {
        c.off[k] = p;
        c.cp[k] = tj_utf8_next(s->data, s->len, &p);
    }
    c.off[c.n] = s->len;
    tj_work(rs, (int64_t)(s->len >> 4));
    return c;
}

static void put_cp(tj_render *rs, tj_buf *b, uint32_t c) {
    char u[4];
    int n = tj_utf8_put(c, u);
    tj_put(rs, b, u, (size_t)n);
}

static bool in_chars(uint32_t c, const cps *chars) {
    if (!chars) return tj_py_isspace(c);
    for (size_t i = 0; i < chars->n; i++)
        if (chars->cp[i] == c) return true;
    return false;
}

/* strip: mode 1 = left, 2 = right, 3 = both; chars NULL = whitespace. */
tj_val tj_str_strip(tj_render *rs, tj_val v, const tj_str *chars, int mode) {
    const tj_str *s = v.as.s;
    cps ch, *chp = NULL;
    if (chars) {
        ch = decode(rs, chars);
        chp = &ch;
    }
    size_t a = 0, b = s->len;
    if (mode & 1) {
        while (a < b) {
            size_t q = a;
            uint32_t c = tj_utf8_next(s->data, s->len, &q);
            if (!in_chars(c, chp)) break;
            a = q;
        }
    }
    if (mode & 2) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s->data[st] & 0xc0) == 0x80) st--;
            size_t q = st;
            uint32_t c = tj_utf8_next(s->data, s->len, &q);
            if (!in_chars(c, chp)) break;
            b = st;
        }
    }
    if (a == 0 && b == s->len) return v;
    return tj_strn(rs, s->data + a, b - a);
}

/* Case mapping with Python's special cases; mode 'u' upper, 'l' lower, 't' title. */
static void case_map(tj_render *rs, tj_buf *b, uint32_t c, char mode, const cps *ctx, size_t i) {
    if (mode == 'u' || mode == 't') {
        const char *sp = NULL;
        switch (c) {
        case 0xdf: sp = mode == 'u' ? "SS" : "Ss"; break;
        case 0xfb00: sp = mode == 'u' ? "FF" : "Ff"; break;
        case 0xfb01: sp = mode == 'u' ? "FI" : "Fi"; break;
        case 0xfb02: sp = mode == 'u' ? "FL" : "Fl"; break;
        case 0xfb03: sp = mode == 'u' ? "FFI" : "Ffi"; break;
        case 0xfb04: sp = mode == 'u' ? "FFL" : "Ffl"; break;
        case 0xfb05:
        case 0xfb06: sp = mode == 'u' ? "ST" : "St"; break;
        case 0x149: sp = "\xca\xbcN"; break;
        default: break;
        }
        if (sp) {
            tj_puts(rs, b, sp);
            return;
        }
        put_cp(rs, b, mode == 'u' ? tj_py_upper(c) : tj_py_title(c));
        return;
    }
    if (c == 0x130) {
        tj_puts(rs, b, "i\xcc\x87");
        return;
    }
    if (c == 0x3a3 && ctx) {
        /* final sigma: preceded by a cased letter and not followed by one */
        bool before = false, after = false;
        for (size_t k = i; k > 0; k--) {
            uint32_t p = ctx->cp[k - 1];
            if (tj_py_isalpha(p)) {
                before = true;
                break;
            }
            if (p != '\'' && p != 0x2019) break;
        }
        for (size_t k = i + 1; k < ctx->n; k++) {
            uint32_t p = ctx->cp[k];
            if (tj_py_isalpha(p)) {
                after = true;
                break;
            }
            if (p != '\'' && p != 0x2019) break;
        }
        put_cp(rs, b, before && !after ? 0x3c2 : 0x3c3);
        return;
    }
    put_cp(rs, b, tj_py_lower(c));
}

static bool is_cased(uint32_t c) {
    return tj_py_iscased_upper(c) || tj_py_iscased_lower(c) || tj_py_istitle_cp(c);
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' str.title, 's' swapcase, 'f' casefold */
tj_val tj_str_case(tj_render *rs, tj_val v, char mode) {
    const tj_str *s = v.as.s;
    tj_buf b = {0};
    if (s->ncp == s->len && mode != 's') { /* ASCII fast path */
        tj_put(rs, &b, s->data, s->len);
        bool prev_cased = false;
        for (size_t i = 0; i < s->len; i++) {
            char c = b.data[i];
            bool up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z';
            switch (mode) {
            case 'u': if (lo) c = (char)(c - 32); break;
            case 'l':
            case 'f': if (up) c = (char)(c + 32); break;
            case 'c':
                if (i == 0 && lo) c = (char)(c - 32);
                else if (i > 0 && up) c = (char)(c + 32);
                break;
            case 't':
                if (prev_cased && up) c = (char)(c + 32);
                else if (!prev_cased && lo) c = (char)(c - 32);
                prev_cased = up || lo;
                break;
            default: break;
            }
            b.data[i] = c;
        }
        return tj_str_buf(rs, &b);
    }
    cps c = decode(rs, s);
    bool prev_cased = false;
    for (size_t i = 0; i < c.n; i++) {
        uint32_t ch = c.cp[i];
        switch (mode) {
        case 'u': case_map(rs, &b, ch, 'u', &c, i); break;
        case 'l': case_map(rs, &b, ch, 'l', &c, i); break;
        case 'f':
            if (ch == 0xdf) tj_puts(rs, &b, "ss");
            else case_map(rs, &b, ch, 'l', &c, i);
            break;
        case 'c': case_map(rs, &b, ch, i == 0 ? 't' : 'l', &c, i); break;
        case 't':
            case_map(rs, &b, ch, prev_cased ? 'l' : 't', &c, i);
            prev_cased = is_cased(ch);
            break;
        case 's':
            if (tj_py_iscased_upper(ch)) case_map(rs, &b, ch, 'l', &c, i);
            else if (tj_py_iscased_lower(ch)) case_map(rs, &b, ch, 'u', &c, i);
            else put_cp(rs, &b, ch);
            break;
        default: put_cp(rs, &b, ch); break;
        }
    }
    return tj_str_buf(rs, &b);
}

tj_val tj_str_replace(tj_render *rs, const tj_str *s, const tj_str *old, const tj_str *nw,
                      int64_t count) {
    tj_buf b = {0};
    if (count < 0) count = INT64_MAX;
    if (old->len == 0) {
        /* insert nw before every code point and at the end */
        size_t p = 0;
        int64_t done = 0;
        while (p <= s->len) {
            if (done < count) {
                tj_put(rs, &b, nw->data, nw->len);
                done++;
            }
            if (p == s->len) break;
            size_t q = p;
            tj_utf8_next(s->data, s->len, &q);
            tj_put(rs, &b, s->data + p, q - p);
            p = q;
        }
        return tj_str_buf(rs, &b);
    }
    size_t p = 0;
    int64_t done = 0;
    while (done < count) {
        const char *hit = memmem(s->data + p, s->len - p, old->data, old->len);
        if (!hit) break;
        size_t h = (size_t)(hit - s->data);
        tj_put(rs, &b, s->data + p, h - p);
        tj_put(rs, &b, nw->data, nw->len);
        p = h + old->len;
        done++;
    }
    tj_put(rs, &b, s->data + p, s->len - p);
    return tj_str_buf(rs, &b);
}

/* Python's str.center(width, fill) */
tj_val tj_str_pad(tj_render *rs, tj_val v, int64_t width, uint32_t fill, char how) {
    const tj_str *s = v.as.s;
    int64_t n = (int64_t)s->ncp;
    if (width <= n) return v;
    if (width - n > (int64_t)(rs->t->params.max_memory / 4))
        tj_fail(rs, ST_ERR_LIMIT, "template string size limit exceeded");
    int64_t marg = width - n, left;
    tj_work(rs, marg);
    if (how == 'c') left = marg / 2 + (marg & width & 1);
    else if (how == 'l') left = 0;
    else left = marg;
    tj_buf b = {0};
    for (int64_t i = 0; i < left; i++) put_cp(rs, &b, fill);
    tj_put(rs, &b, s->data, s->len);
    for (int64_t i = 0; i < marg - left; i++) put_cp(rs, &b, fill);
    return tj_str_buf(rs, &b);
}

/* Code-point range [start, end) from Python-style optional start/end arguments. */
static void sub_range(tj_val a, tj_val b, size_t n, size_t *lo, size_t *hi) {
    int64_t s = 0, e = (int64_t)n;
    if (tj_given(a) && a.kind != TJ_NONE && tj_is_intlike(a)) s = a.as.i;
    if (tj_given(b) && b.kind != TJ_NONE && tj_is_intlike(b)) e = b.as.i;
    if (s < 0) s += (int64_t)n;
    if (s < 0) s = 0;
    if (e < 0) e += (int64_t)n;
    if (e < 0) e = 0;
    if (e > (int64_t)n) e = (int64_t)n;
    *lo = (size_t)s;
    *hi = (size_t)(e < s ? s : e);
}

static size_t cp_off(const tj_str *s, size_t k) {
    if (s->ncp == s->len) return k < s->len ? k : s->len;
    return tj_utf8_offset(s->data, s->len, k);
}

/* find / rfind / count in code points; returns index or -1 (count: number). */
static int64_t str_find(tj_render *rs, const tj_str *s, const tj_str *sub, tj_val a, tj_val b,
                        int kind) {
    size_t lo, hi;
    sub_range(a, b, s->ncp, &lo, &hi);
    if (lo > s->ncp) return kind == 2 ? 0 : -1;
    size_t bl = cp_off(s, lo), bh = cp_off(s, hi);
    tj_work(rs, (int64_t)((bh - bl) >> 4));
    if (kind == 2) {
        if (sub->len == 0) return (int64_t)(hi - lo) + 1;
        int64_t cnt = 0;
        size_t p = bl;
        while (p + sub->len <= bh) {
            const char *h = memmem(s->data + p, bh - p, sub->data, sub->len);
            if (!h) break;
            cnt++;
            p = (size_t)(h - s->data) + sub->len;
        }
        return cnt;
    }
    if (sub->len > bh - bl) return -1;
    size_t found = SIZE_MAX;
    if (kind == 0) {
        const char *h = memmem(s->data + bl, bh - bl, sub->data, sub->len);
        if (h) found = (size_t)(h - s->data);
    } else {
        for (size_t p = bh - sub->len + 1; p-- > bl;) {
            if (memcmp(s->data + p, sub->data, sub->len) == 0) {
                found = p;
                break;
            }
        }
    }
    if (found == SIZE_MAX) return -1;
    return (int64_t)st_utf8_count(s->data, found);
}

static bool affix_match(tj_render *rs, const tj_str *s, tj_val prefix, tj_val a, tj_val b,
                        bool end, const char *fname) {
    size_t lo, hi;
    sub_range(a, b, s->ncp, &lo, &hi);
    if (lo > s->ncp) return false;
    size_t bl = cp_off(s, lo), bh = cp_off(s, hi);
    const tj_list *alts = NULL;
    tj_list one = {0};
    if (prefix.kind == TJ_STR) {
        one.len = 1;
        one.items = &prefix;
        alts = &one;
    } else if (prefix.kind == TJ_LIST && prefix.as.l->type == TJ_L_TUPLE) {
        alts = prefix.as.l;
    } else {
        tj_fail(rs, ST_ERR_ARG, "%s first arg must be str or a tuple of str, not %s", fname,
                tj_type_name(prefix));
    }
    for (int64_t i = 0; i < alts->len; i++) {
        tj_val p = alts->items[i];
        if (p.kind != TJ_STR)
            tj_fail(rs, ST_ERR_ARG, "tuple for %s must only contain str, not %s", fname,
                    tj_type_name(p));
        size_t pl = p.as.s->len;
        if (pl > bh - bl) continue;
        const char *at = end ? s->data + bh - pl : s->data + bl;
        if (memcmp(at, p.as.s->data, pl) == 0) return true;
    }
    return false;
}

/* split on whitespace runs (sep NULL) or on sep; maxsplit < 0 = all; from the right if rev. */
tj_val tj_str_split(tj_render *rs, const tj_str *s, const tj_str *sep, int64_t maxsplit, bool rev) {
    if (sep && sep->len == 0) tj_fail(rs, ST_ERR_ARG, "empty separator");
    if (maxsplit < 0) maxsplit = INT64_MAX;
    /* collect pieces as (start, end) byte ranges */
    int64_t cap = 8, n = 0;
    size_t *rg = tj_alloc(rs, (size_t)cap * 2 * sizeof(size_t));
#define ADD(a_, b_)                                                                         \
    do {                                                                                    \
        if (n == cap) {                                                                     \
            size_t *nr = tj_alloc(rs, (size_t)cap * 4 * sizeof(size_t));                    \
            memcpy(nr, rg, (size_t)n * 2 * sizeof(size_t));                                 \
            rg = nr;                                                                        \
            cap *= 2;                                                                       \
        }                                                                                   \
        rg[2 * n] = (a_);                                                                   \
        rg[2 * n + 1] = (b_);                                                               \
        n++;                                                                                \
    } while (0)
    tj_work(rs, (int64_t)(s->len >> 4));
    if (sep) {
        if (!rev) {
            size_t p = 0;
            int64_t k = 0;
            while (k < maxsplit) {
                const char *h = memmem(s->data + p, s->len - p, sep->data, sep->len);
                if (!h) break;
                size_t hp = (size_t)(h - s->data);
                ADD(p, hp);
                p = hp + sep->len;
                k++;
            }
            ADD(p, s->len);
        } else {
            size_t e = s->len;
            int64_t k = 0;
            while (k < maxsplit && e >= sep->len) {
                size_t found = SIZE_MAX;
                for (size_t q = e - sep->len + 1; q-- > 0;) {
                    if (memcmp(s->data + q, sep->data, sep->len) == 0) {
                        found = q;
                        break;
                    }
                }
                if (found == SIZE_MAX) break;
                ADD(found + sep->len, e);
                e = found;
                k++;
            }
            ADD(0, e);
        }
    } else {
        cps c = decode(rs, s);
        if (!rev) {
            size_t i = 0;
            int64_t k = 0;
            while (i < c.n) {
                while (i < c.n && tj_py_isspace(c.cp[i])) i++;
                if (i == c.n) break;
                if (k == maxsplit) { /* the rest, trailing whitespace included */
                    ADD(c.off[i], c.off[c.n]);
                    break;
                }
                size_t j = i;
                while (j < c.n && !tj_py_isspace(c.cp[j])) j++;
                ADD(c.off[i], c.off[j]);
                k++;
                i = j;
            }
        } else {
            size_t i = c.n;
            int64_t k = 0;
            while (i > 0) {
                while (i > 0 && tj_py_isspace(c.cp[i - 1])) i--;
                if (i == 0) break;
                if (k == maxsplit) { /* the rest, leading whitespace included */
                    ADD(c.off[0], c.off[i]);
                    break;
                }
                size_t j = i;
                while (j > 0 && !tj_py_isspace(c.cp[j - 1])) j--;
                ADD(c.off[j], c.off[i]);
                k++;
                i = j;
            }
        }
    }
#undef ADD
    tj_list *l = tj_list_new(rs, n, TJ_L_LIST);
    for (int64_t i = 0; i < n; i++) {
        int64_t src = rev ? n - 1 - i : i;
        l->items[i] = tj_strn(rs, s->data + rg[2 * src], rg[2 * src + 1] - rg[2 * src]);
    }
    return tj_listv(l);
}

tj_val tj_str_splitlines(tj_render *rs, const tj_str *s, bool keepends) {
    cps c = decode(rs, s);
    int64_t cnt = 0;
    for (size_t i = 0; i < c.n; i++)
        if (tj_py_islinebreak(c.cp[i])) cnt++;
    tj_list *l = tj_list_new(rs, cnt + 1, TJ_L_LIST);
    int64_t k = 0;
    size_t i = 0;
    while (i < c.n) {
        size_t j = i;
        while (j < c.n && !tj_py_islinebreak(c.cp[j])) j++;
        size_t eol = j;
        if (j < c.n) {
            if (c.cp[j] == '\r' && j + 1 < c.n && c.cp[j + 1] == '\n') j += 2;
            else j += 1;
        }
        size_t e = keepends ? j : eol;
        l->items[k++] = tj_strn(rs, s->data + c.off[i], c.off[e] - c.off[i]);
        i = j;
    }
    l->len = k;
    return tj_listv(l);
}

static tj_val join_seq(tj_render *rs, const tj_str *sep, tj_val seq) {
    const tj_list *it = tj_iterate(rs, seq);
    tj_buf b = {0};
    for (int64_t i = 0; i < it->len; i++) {
        tj_val x = it->items[i];
        if (x.kind != TJ_STR)
            tj_fail(rs, ST_ERR_ARG, "sequence item %lld: expected str instance, %s found",
                    (long long)i, tj_type_name(x));
        if (i) tj_put(rs, &b, sep->data, sep->len);
        tj_put(rs, &b, x.as.s->data, x.as.s->len);
    }
    return tj_str_buf(rs, &b);
}

static tj_val str_pred(const tj_str *s, int id, tj_render *rs) {
    if (s->len == 0) return tj_bool(false);
    cps c = decode(rs, s);
    bool any_cased = false, ok = true;
    bool prev_cased = false;
    for (size_t i = 0; i < c.n && ok; i++) {
        uint32_t ch = c.cp[i];
        switch (id) {
        case M_ISALNUM: ok = tj_py_isalnum(ch); break;
        case M_ISALPHA: ok = tj_py_isalpha(ch); break;
        case M_ISASCII: ok = ch < 0x80; break;
        case M_ISDECIMAL:
        case M_ISDIGIT: ok = tj_py_isdigit(ch); break;
        case M_ISNUMERIC: ok = tj_py_isalnum(ch) && !tj_py_isalpha(ch); break;
        case M_ISSPACE: ok = tj_py_isspace(ch); break;
        case M_ISLOWER:
            if (tj_py_iscased_upper(ch) || tj_py_istitle_cp(ch)) ok = false;
            if (tj_py_iscased_lower(ch)) any_cased = true;
            break;
        case M_ISUPPER:
            if (tj_py_iscased_lower(ch) || tj_py_istitle_cp(ch)) ok = false;
            if (tj_py_iscased_upper(ch)) any_cased = true;
            break;
        case M_ISTITLE:
            if (tj_py_iscased_upper(ch) || tj_py_istitle_cp(ch)) {
                if (prev_cased) ok = false;
                prev_cased = true;
                any_cased = true;
            } else if (tj_py_iscased_lower(ch)) {
                if (!prev_cased) ok = false;
                prev_cased = true;
                any_cased = true;
            } else {
                prev_cased = false;
            }
            break;
        default: break;
        }
    }
    if (id == M_ISLOWER || id == M_ISUPPER || id == M_ISTITLE) ok = ok && any_cased;
    if (id == M_ISASCII && s->len == 0) ok = true;
    return tj_bool(ok);
}


static tj_val str_method(tj_render *rs, tj_val self, int id, tj_args *a) {
    const tj_str *s = self.as.s;
    tj_val p[3];
    static const char *const n3[] = {"a", "b", "c"};
    switch (id) {
    case M_CAPITALIZE: need_args(rs, "capitalize", a, 0, 0); return tj_str_case(rs, self, 'c');
    case M_CASEFOLD: need_args(rs, "casefold", a, 0, 0); return tj_str_case(rs, self, 'f');
    case M_LOWER: need_args(rs, "lower", a, 0, 0); return tj_str_case(rs, self, 'l');
    case M_UPPER: need_args(rs, "upper", a, 0, 0); return tj_str_case(rs, self, 'u');
    case M_TITLE: need_args(rs, "title", a, 0, 0); return tj_str_case(rs, self, 't');
    case M_SWAPCASE: need_args(rs, "swapcase", a, 0, 0); return tj_str_case(rs, self, 's');
    case M_CENTER:
    case M_LJUST:
    case M_RJUST: {
        const char *fn = id == M_CENTER ? "center" : id == M_LJUST ? "ljust" : "rjust";
        need_args(rs, fn, a, 1, 2);
        int64_t w = want_int(rs, a->pos[0], fn);
        uint32_t fill = ' ';
        if (a->n > 1) {
            const tj_str *f = want_str(rs, a->pos[1], "fill character");
            if (f->ncp != 1)
                tj_fail(rs, ST_ERR_ARG, "The fill character must be exactly one character long");
            size_t q = 0;
            fill = tj_utf8_next(f->data, f->len, &q);
        }
        return tj_str_pad(rs, self, w, fill, id == M_CENTER ? 'c' : id == M_LJUST ? 'l' : 'r');
    }
    case M_ZFILL: {
        need_args(rs, "zfill", a, 1, 1);
        int64_t w = want_int(rs, a->pos[0], "zfill");
        if (w <= (int64_t)s->ncp) return self;
        if (w > (int64_t)rs->t->params.max_memory) tj_fail(rs, ST_ERR_LIMIT, "string too long");
        tj_work(rs, w);
        tj_buf b = {0};
        size_t st = 0;
        if (s->len && (s->data[0] == '+' || s->data[0] == '-')) {
            tj_put(rs, &b, s->data, 1);
            st = 1;
        }
        for (int64_t i = 0; i < w - (int64_t)s->ncp; i++) tj_putc(rs, &b, '0');
        tj_put(rs, &b, s->data + st, s->len - st);
        return tj_str_buf(rs, &b);
    }
    case M_COUNT:
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX: {
        const char *fn = id == M_COUNT ? "count" : id == M_FIND ? "find" : id == M_RFIND ? "rfind"
                       : id == M_INDEX ? "index" : "rindex";
        need_args(rs, fn, a, 1, 3);
        const tj_str *sub = want_str(rs, a->pos[0], "substring");
        tj_val st = a->n > 1 ? a->pos[1] : tj_none(), en = a->n > 2 ? a->pos[2] : tj_none();
        int kind = id == M_COUNT ? 2 : (id == M_RFIND || id == M_RINDEX) ? 1 : 0;
        int64_t r = str_find(rs, s, sub, st, en, kind);
        if (r < 0 && (id == M_INDEX || id == M_RINDEX)) tj_fail(rs, ST_ERR_ARG, "substring not found");
        return tj_int(r);
    }
    case M_STARTSWITH:
    case M_ENDSWITH: {
        const char *fn = id == M_STARTSWITH ? "startswith" : "endswith";
        need_args(rs, fn, a, 1, 3);
        tj_val st = a->n > 1 ? a->pos[1] : tj_none(), en = a->n > 2 ? a->pos[2] : tj_none();
        return tj_bool(affix_match(rs, s, a->pos[0], st, en, id == M_ENDSWITH, fn));
    }
    case M_FORMAT: return tj_str_format(rs, s, a);
    case M_JOIN: need_args(rs, "join", a, 1, 1); return join_seq(rs, s, a->pos[0]);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        const char *fn = id == M_STRIP ? "strip" : id == M_LSTRIP ? "lstrip" : "rstrip";
        need_args(rs, fn, a, 0, 1);
        const tj_str *chars = NULL;
        if (a->n && a->pos[0].kind != TJ_NONE) chars = want_str(rs, a->pos[0], "strip arg");
        return tj_str_strip(rs, self, chars, id == M_STRIP ? 3 : id == M_LSTRIP ? 1 : 2);
    }
    case M_PARTITION:
    case M_RPARTITION: {
        need_args(rs, id == M_PARTITION ? "partition" : "rpartition", a, 1, 1);
        const tj_str *sep = want_str(rs, a->pos[0], "separator");
        if (sep->len == 0) tj_fail(rs, ST_ERR_ARG, "empty separator");
        tj_list *l = tj_list_new(rs, 3, TJ_L_TUPLE);
        const char *h = NULL;
        if (id == M_PARTITION) {
            h = memmem(s->data, s->len, sep->data, sep->len);
        } else if (sep->len <= s->len) {
            for (size_t q = s->len - sep->len + 1; q-- > 0;)
                if (memcmp(s->data + q, sep->data, sep->len) == 0) {
                    h = s->data + q;
                    break;
                }
        }
        tj_val empty = tj_strn(rs, "", 0);
        if (!h) {
            l->items[0] = id == M_PARTITION ? self : empty;
            l->items[1] = empty;
            l->items[2] = id == M_PARTITION ? empty : self;
        } else {
            size_t hp = (size_t)(h - s->data);
            l->items[0] = tj_strn(rs, s->data, hp);
            l->items[1] = a->pos[0];
            l->items[2] = tj_strn(rs, s->data + hp + sep->len, s->len - hp - sep->len);
        }
        return tj_listv(l);
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        need_args(rs, id == M_REMOVEPREFIX ? "removeprefix" : "removesuffix", a, 1, 1);
        const tj_str *x = want_str(rs, a->pos[0], "argument");
        if (x->len > s->len) return self;
        if (id == M_REMOVEPREFIX && memcmp(s->data, x->data, x->len) == 0)
            return tj_strn(rs, s->data + x->len, s->len - x->len);
        if (id == M_REMOVESUFFIX && x->len && memcmp(s->data + s->len - x->len, x->data, x->len) == 0)
            return tj_strn(rs, s->data, s->len - x->len);
        return self;
    }
    case M_REPLACE: {
        need_args(rs, "replace", a, 2, 3);
        const tj_str *o = want_str(rs, a->pos[0], "replace() argument 1");
        const tj_str *nw = want_str(rs, a->pos[1], "replace() argument 2");
        int64_t cnt = a->n > 2 ? want_int(rs, a->pos[2], "count") : -1;
        return tj_str_replace(rs, s, o, nw, cnt);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        static const char *const names[] = {"sep", "maxsplit"};
        const char *fn = id == M_SPLIT ? "split" : "rsplit";
        tj_bind(rs, fn, a, 2, names, p);
        const tj_str *sep = NULL;
        if (tj_given(p[0]) && p[0].kind != TJ_NONE) sep = want_str(rs, p[0], "separator");
        int64_t ms = tj_given(p[1]) ? want_int(rs, p[1], "maxsplit") : -1;
        return tj_str_split(rs, s, sep, ms, id == M_RSPLIT);
    }
    case M_SPLITLINES: {
        static const char *const names[] = {"keepends"};
        tj_bind(rs, "splitlines", a, 1, names, p);
        return tj_str_splitlines(rs, s, tj_given(p[0]) && tj_truthy(p[0]));
    }
    case M_ISALNUM: case M_ISALPHA: case M_ISASCII: case M_ISDECIMAL: case M_ISDIGIT:
    case M_ISLOWER: case M_ISNUMERIC: case M_ISSPACE: case M_ISTITLE: case M_ISUPPER:
        need_args(rs, "is*", a, 0, 0);
        if (id == M_ISASCII && s->len == 0) return tj_bool(true);
        return str_pred(s, id, rs);
    default:
        (void)n3;
        tj_fail(rs, ST_ERR_UNSUPPORTED, "this str method is not supported by the template engine");
    }
}

static tj_val dict_items_view(tj_render *rs, const tj_dict *d, int which) {
    tj_list *l = tj_list_new(rs, d->len, which == 0 ? TJ_L_ITEMS : which == 1 ? TJ_L_KEYS : TJ_L_VALUES);
    for (int64_t i = 0; i < d->len; i++) {
        if (which == 0) {
            tj_list *pair = tj_list_new(rs, 2, TJ_L_TUPLE);
            pair->items[0] = d->keys[i];
            pair->items[1] = d->vals[i];
            l->items[i] = tj_listv(pair);
        } else {
            l->items[i] = which == 1 ? d->keys[i] : d->vals[i];
        }
    }
    return tj_listv(l);
}

tj_val tj_call_method(tj_render *rs, const tj_method *m, tj_args *a) {
    tj_val self = m->self;
    if (self.kind == TJ_STR) return str_method(rs, self, m->mid, a);
    switch (m->mid) {
    case M_GET: {
        need_args(rs, "get", a, 1, 2);
        if (!tj_is_hashable(rs, a->pos[0]))
            tj_fail(rs, ST_ERR_ARG, "unhashable type: '%s'", tj_type_name(a->pos[0]));
        tj_val *v = tj_dict_get(rs, self.as.d, a->pos[0]);
        return v ? *v : (a->n > 1 ? a->pos[1] : tj_none());
    }
    case M_ITEMS: need_args(rs, "items", a, 0, 0); return dict_items_view(rs, self.as.d, 0);
    case M_KEYS: need_args(rs, "keys", a, 0, 0); return dict_items_view(rs, self.as.d, 1);
    case M_VALUES: need_args(rs, "values", a, 0, 0); return dict_items_view(rs, self.as.d, 2);
    case M_DCOPY: {
        need_args(rs, "copy", a, 0, 0);
        tj_dict *d = tj_dict_new(rs, self.as.d->len);
        for (int64_t i = 0; i < self.as.d->len; i++)
            tj_dict_set(rs, d, self.as.d->keys[i], self.as.d->vals[i]);
        return tj_dictv(d);
    }
    case M_LCOUNT: {
        need_args(rs, "count", a, 1, 1);
        int64_t c = 0;
        for (int64_t i = 0; i < self.as.l->len; i++)
            if (tj_equal(rs, self.as.l->items[i], a->pos[0])) c++;
        return tj_int(c);
    }
    case M_LINDEX: {
        need_args(rs, "index", a, 1, 3);
        for (int64_t i = 0; i < self.as.l->len; i++)
            if (tj_equal(rs, self.as.l->items[i], a->pos[0])) return tj_int(i);
        tj_buf b = {0};
        tj_repr_of(rs, &b, a->pos[0]);
        tj_fail(rs, ST_ERR_ARG, "%s is not in list", b.data);
    }
    case M_LCOPY: {
        need_args(rs, "copy", a, 0, 0);
        tj_list *l = tj_list_new(rs, self.as.l->len, TJ_L_LIST);
        memcpy(l->items, self.as.l->items, (size_t)l->len * sizeof(tj_val));
        return tj_listv(l);
    }
    case M_CYCLE: {
        if (a->n == 0) tj_fail(rs, ST_ERR_ARG, "no items for cycling given");
        return a->pos[self.as.loop->index0 % a->n];
    }
    case M_CHANGED: {
        tj_loop *lp = self.as.loop;
        tj_list *cur = tj_list_new(rs, a->n, TJ_L_TUPLE);
        for (int i = 0; i < a->n; i++) cur->items[i] = a->pos[i];
        tj_val cv = tj_listv(cur);
        if (!lp->has_changed || !tj_equal(rs, lp->changed_last, cv)) {
            lp->has_changed = true;
            lp->changed_last = cv;
            return tj_bool(true);
        }
        return tj_bool(false);
    }
    default:
        tj_fail(rs, ST_ERR_INTERNAL, "unknown method");
    }
}

/* ==== Global functions ==== */

static tj_val make_range(tj_render *rs, tj_args *a) {
    need_args(rs, "range", a, 1, 3);
    int64_t v[3] = {0, 0, 0};
    for (int i = 0; i < a->n; i++) {
        if (!tj_is_intlike(a->pos[i]))
            tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer",
                    tj_type_name(a->pos[i]));
        v[i] = a->pos[i].as.i;
    }
    int64_t start = 0, stop, step = 1;
    if (a->n == 1) stop = v[0];
    else {
        start = v[0];
        stop = v[1];
        if (a->n == 3) step = v[2];
    }
    if (step == 0) tj_fail(rs, ST_ERR_ARG, "range() arg 3 must not be zero");
    double cnt = 0;
    if (step > 0 && stop > start) cnt = ((double)stop - (double)start - 1) / (double)step + 1;
    if (step < 0 && start > stop) cnt = ((double)start - (double)stop - 1) / (double)-step + 1;
    if (cnt > 100000)
        tj_fail(rs, ST_ERR_LIMIT,
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    int64_t n = (int64_t)cnt;
    tj_list *l = tj_list_new(rs, n, TJ_L_RANGE);
    for (int64_t i = 0; i < n; i++) l->items[i] = tj_int(start + i * step);
    l->r_start = start;
    l->r_stop = stop;
    l->r_step = step;
    return tj_listv(l);
}

static tj_dict *dict_from(tj_render *rs, tj_args *a, const char *fname) {
    if (a->n > 1) tj_fail(rs, ST_ERR_ARG, "%s expected at most 1 argument, got %d", fname, a->n);
    tj_dict *d = tj_dict_new(rs, 4 + a->nkw);
    if (a->n == 1) {
        tj_val src = a->pos[0];
        if (src.kind == TJ_DICT) {
            for (int64_t i = 0; i < src.as.d->len; i++)
                tj_dict_set(rs, d, src.as.d->keys[i], src.as.d->vals[i]);
        } else {
            const tj_list *it = tj_iterate(rs, src);
            for (int64_t i = 0; i < it->len; i++) {
                const tj_list *pair = tj_iterate(rs, it->items[i]);
                if (pair->len != 2)
                    tj_fail(rs, ST_ERR_ARG,
                            "dictionary update sequence element #%lld has length %lld; 2 is required",
                            (long long)i, (long long)pair->len);
                tj_dict_set(rs, d, pair->items[0], pair->items[1]);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++)
        tj_dict_set(rs, d, tj_strn(rs, a->kw[k].name, a->kw[k].len), a->kw[k].v);
    return d;
}

tj_val tj_call_func(tj_render *rs, int fid, tj_args *a) {
    switch (fid) {
    case TJ_FN_RANGE: return make_range(rs, a);
    case TJ_FN_DICT: return tj_dictv(dict_from(rs, a, "dict"));
    case TJ_FN_NAMESPACE: {
        tj_ns *ns = tj_alloc(rs, sizeof *ns);
        ns->attrs = dict_from(rs, a, "namespace");
        tj_val v = {.kind = TJ_NS};
        v.as.ns = ns;
        return v;
    }
    case TJ_FN_RAISE: {
        static const char *const names[] = {"message"};
        tj_val p[1];
        tj_bind(rs, "raise_exception", a, 1, names, p);
        if (!tj_given(p[0]))
            tj_fail(rs, ST_ERR_ARG, "raise_exception() missing 1 required positional argument: 'message'");
        tj_val s = tj_to_str(rs, p[0]);
        tj_fail(rs, ST_ERR_ARG, "%s", s.as.s->data);
    }
    case TJ_FN_STRFTIME: {
        static const char *const names[] = {"format"};
        tj_val p[1];
        tj_bind(rs, "strftime_now", a, 1, names, p);
        if (!tj_given(p[0]))
            tj_fail(rs, ST_ERR_ARG, "strftime_now() missing 1 required positional argument: 'format'");
        const tj_str *f = want_str(rs, p[0], "strftime() argument 1");
        time_t now = (time_t)rs->now;
        struct tm tmv;
        localtime_r(&now, &tmv);
        if (memchr(f->data, '\0', f->len)) tj_fail(rs, ST_ERR_ARG, "embedded null character");
        if (f->len == 0) return tj_strn(rs, "", 0);
        /* strftime returns 0 both for an empty result and for a full buffer: grow a few times */
        for (size_t cap = 256; cap <= 64 * f->len + 256; cap *= 4) {
            char *out = tj_alloc(rs, cap);
            size_t n = strftime(out, cap, f->data, &tmv);
            if (n > 0) return tj_strn(rs, out, n);
        }
        return tj_strn(rs, "", 0);
    }
    default:
        tj_fail(rs, ST_ERR_UNSUPPORTED, "this global function is not supported by the template engine");
    }
}
