/* ==== Template formatting: Python's `str % args` and str.format() ====
 *
 * Templates format numbers and strings the Python way: '%s-%d' % (a, b), '%05.1f' % x,
 * '%(name)s' % mapping, the |format filter (which is `%`), and '{:>8}'.format(x) with the
 * format-spec mini-language (fill, align, sign, #, 0, width, grouping, precision, type).
 * Widths count code points; numeric conversions go through the C library's printf where it
 * agrees with Python. Padding and repetition count towards the render's work limit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"

static void put_cp(tj_render *rs, tj_buf *b, uint32_t c) {
    char u[4];
    int n = tj_utf8_put(c, u);
    tj_put(rs, b, u, (size_t)n);
}

static int64_t want_int(tj_render *rs, tj_val v, const char *what) {
    if (!tj_is_intlike(v))
        tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer (%s)",
                tj_type_name(v), what);
    return v.as.i;
}

/* ==== printf-style formatting (str % args) ==== */

static tj_val fmt_num_arg(tj_render *rs, tj_val v, char conv) {
    if (tj_is_num(v)) return v;
    if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' || conv == 'o')
        tj_fail(rs, ST_ERR_ARG, "%%%c format: a real number is required, not %s", conv,
                tj_type_name(v));
    tj_fail(rs, ST_ERR_ARG, "must be real number, not %s", tj_type_name(v));
}

static void pad_str(tj_render *rs, tj_buf *out, const char *s, size_t len, int64_t width,
                    bool left) {
    int64_t n = (int64_t)st_utf8_count(s, len);
    if (width > (int64_t)rs->t->params.max_memory) tj_fail(rs, ST_ERR_LIMIT, "width too large");
    if (width > n) tj_work(rs, width - n);
    if (!left)
        for (int64_t i = n; i < width; i++) tj_putc(rs, out, ' ');
    tj_put(rs, out, s, len);
    if (left)
        for (int64_t i = n; i < width; i++) tj_putc(rs, out, ' ');
}

tj_val tj_percent_format(tj_render *rs, const tj_str *fmt, tj_val arg) {
    const tj_list *args = NULL;
    tj_list single = {0};
    const tj_dict *dict = NULL;
    int64_t argi = 0;
    bool is_tuple = arg.kind == TJ_LIST && arg.as.l->type == TJ_L_TUPLE;
    if (is_tuple) {
        args = arg.as.l;
    } else {
        single.len = 1;
        single.items = &arg;
        args = &single;
        if (arg.kind == TJ_DICT) dict = arg.as.d;
    }
    /* Python treats any non-tuple, non-str object with __getitem__ (dict, list, range,
     * Undefined) as a mapping argument: no "not all arguments converted" check then */
    bool mappingish = arg.kind == TJ_DICT || arg.kind == TJ_UNDEF ||
                      (arg.kind == TJ_LIST && (arg.as.l->type == TJ_L_LIST || arg.as.l->type == TJ_L_RANGE));
    tj_buf out = {0};
    const char *s = fmt->data;
    size_t n = fmt->len, i = 0;
    bool used_any = false;
    while (i < n) {
        const char *pc = memchr(s + i, '%', n - i);
        if (!pc) {
            tj_put(rs, &out, s + i, n - i);
            break;
        }
        size_t k = (size_t)(pc - s);
        tj_put(rs, &out, s + i, k - i);
        i = k + 1;
        if (i >= n) tj_fail(rs, ST_ERR_ARG, "incomplete format");
        tj_val v;
        bool have_v = false;
        if (s[i] == '(') {
            if (!dict) {
                if (mappingish) tj_fail(rs, ST_ERR_ARG, "%s indices must be integers or slices, not str", tj_type_name(arg));
                tj_fail(rs, ST_ERR_ARG, "format requires a mapping");
            }
            size_t st = ++i;
            int depth = 1;
            while (i < n && depth) {
                if (s[i] == '(') depth++;
                else if (s[i] == ')') depth--;
                if (depth) i++;
            }
            if (i >= n) tj_fail(rs, ST_ERR_ARG, "incomplete format key");
            tj_val *pv = tj_dict_get_str(dict, s + st, i - st);
            if (!pv) {
                tj_fail(rs, ST_ERR_ARG, "KeyError: '%.*s'", (int)(i - st), s + st);
            }
            v = *pv;
            have_v = true;
            i++;
        }
        char flags[8];
        int nf = 0;
        while (i < n && strchr("-+ #0", s[i]) && nf < 6) flags[nf++] = s[i++];
        while (i < n && strchr("-+ #0", s[i])) i++;
        flags[nf] = 0;
        int64_t width = -1, prec = -1;
        if (i < n && s[i] == '*') {
            if (argi >= args->len) tj_fail(rs, ST_ERR_ARG, "not enough arguments for format string");
            width = want_int(rs, args->items[argi++], "* wants int");
            i++;
        } else {
            while (i < n && s[i] >= '0' && s[i] <= '9') {
                width = (width < 0 ? 0 : width) * 10 + (s[i++] - '0');
                if (width > 100000000) tj_fail(rs, ST_ERR_LIMIT, "width too big");
            }
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            if (i < n && s[i] == '*') {
                if (argi >= args->len) tj_fail(rs, ST_ERR_ARG, "not enough arguments for format string");
                prec = want_int(rs, args->items[argi++], "* wants int");
                i++;
            } else {
                while (i < n && s[i] >= '0' && s[i] <= '9') {
                    prec = prec * 10 + (s[i++] - '0');
                    if (prec > 100000000) tj_fail(rs, ST_ERR_LIMIT, "precision too big");
                }
            }
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) tj_fail(rs, ST_ERR_ARG, "incomplete format");
        char conv = s[i++];
        if (conv == '%') {
            tj_putc(rs, &out, '%');
            continue;
        }
        if (!have_v) {
            if (argi >= args->len) tj_fail(rs, ST_ERR_ARG, "not enough arguments for format string");
            v = args->items[argi++];
        }
        used_any = true;
        bool left = strchr(flags, '-') != NULL;
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            tj_buf t = {0};
            if (conv == 's') tj_str_of(rs, &t, v);
            else tj_repr_of(rs, &t, v);
            size_t len = t.len;
            if (prec >= 0 && t.data) len = tj_utf8_offset(t.data, t.len, (size_t)prec);
            pad_str(rs, &out, t.data ? t.data : "", len, width, left);
            break;
        }
        case 'c': {
            char u[4];
            int m;
            if (v.kind == TJ_STR && v.as.s->ncp == 1) {
                pad_str(rs, &out, v.as.s->data, v.as.s->len, width, left);
                break;
            }
            if (!tj_is_intlike(v) || v.as.i < 0 || v.as.i > 0x10ffff)
                tj_fail(rs, ST_ERR_ARG, "%%c requires int or char");
            m = tj_utf8_put((uint32_t)v.as.i, u);
            pad_str(rs, &out, u, (size_t)m, width, left);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o':
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            v = fmt_num_arg(rs, v, conv);
            char cf[32], tmp[512];
            int o = 0;
            cf[o++] = '%';
            for (int f = 0; flags[f]; f++) cf[o++] = flags[f];
            cf[o++] = '*';
            if (prec >= 0) {
                cf[o++] = '.';
                cf[o++] = '*';
            }
            int w = width < 0 ? 0 : (int)(width > 400 ? 400 : width);
            int pr = prec < 0 ? 0 : (int)(prec > 300 ? 300 : prec);
            if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'x' || conv == 'X' ||
                conv == 'o') {
                int64_t iv;
                if (v.kind == TJ_FLOAT) {
                    if (conv == 'x' || conv == 'X' || conv == 'o')
                        tj_fail(rs, ST_ERR_ARG, "%%%c format: an integer is required, not float", conv);
                    if (!isfinite(v.as.f) || fabs(v.as.f) >= 9.2e18)
                        tj_fail(rs, ST_ERR_UNSUPPORTED, "cannot convert float to integer");
                    iv = (int64_t)v.as.f;
                } else {
                    iv = v.as.i;
                }
                bool neg = iv < 0;
                uint64_t mag = neg ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
                char digits[80];
                if (conv == 'x') snprintf(digits, sizeof digits, "%llx", (unsigned long long)mag);
                else if (conv == 'X') snprintf(digits, sizeof digits, "%llX", (unsigned long long)mag);
                else if (conv == 'o') snprintf(digits, sizeof digits, "%llo", (unsigned long long)mag);
                else snprintf(digits, sizeof digits, "%llu", (unsigned long long)mag);
                const char *pref = "";
                if (strchr(flags, '#') && (conv == 'x' || conv == 'X' || conv == 'o'))
                    pref = conv == 'x' ? "0x" : conv == 'X' ? "0X" : "0o";
                const char *sgn = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
                int64_t dl = (int64_t)strlen(digits);
                int64_t zeros = prec > dl ? prec - dl : 0;
                int64_t total = (int64_t)(strlen(sgn) + strlen(pref)) + zeros + dl;
                if (strchr(flags, '0') && !left && width > total) zeros += width - total;
                if (zeros > (int64_t)rs->t->params.max_memory) tj_fail(rs, ST_ERR_LIMIT, "width too large");
                tj_work(rs, zeros);
                tj_buf num = {0};
                tj_puts(rs, &num, sgn);
                tj_puts(rs, &num, pref);
                for (int64_t z = 0; z < zeros; z++) tj_putc(rs, &num, '0');
                tj_puts(rs, &num, digits);
                pad_str(rs, &out, num.data, num.len, width, left);
                (void)tmp;
            } else {
                double fv = tj_num_f(v);
                cf[o++] = conv;
                cf[o] = 0;
                if (prec < 0) {
                    cf[o - 1] = '.';
                    cf[o++] = '*';
                    cf[o++] = conv;
                    cf[o] = 0;
                    pr = 6;
                }
                char *big = tj_alloc(rs, 700);
                snprintf(big, 700, cf, w, pr, fv);
                tj_puts(rs, &out, big);
            }
            break;
        }
        default:
            tj_fail(rs, ST_ERR_ARG, "unsupported format character '%c' (0x%x) at index %zu", conv,
                    (unsigned char)conv, i - 1);
        }
    }
    if (!mappingish && argi < args->len && (is_tuple || !used_any))
        tj_fail(rs, ST_ERR_ARG, "not all arguments converted during string formatting");
    return tj_str_buf(rs, &out);
}

/* ==== str.format ==== */

typedef struct fspec {
    uint32_t fill;
    char align; /* 0, '<', '>', '^', '=' */
    char sign;  /* 0, '+', '-', ' ' */
    bool alt, zero;
    int64_t width, prec; /* -1 = none */
    char group;          /* 0, ',', '_' */
    char type;           /* 0 or a type letter */
} fspec;

static void parse_spec(tj_render *rs, const char *s, size_t n, fspec *f) {
    memset(f, 0, sizeof *f);
    f->fill = ' ';
    f->width = f->prec = -1;
    size_t i = 0;
    /* [[fill]align] */
    if (n >= 1) {
        size_t q = 0;
        uint32_t c0 = tj_utf8_next(s, n, &q);
        if (q < n && strchr("<>^=", s[q])) {
            f->fill = c0;
            f->align = s[q];
            i = q + 1;
        } else if (strchr("<>^=", s[0])) {
            f->align = s[0];
            i = 1;
        }
    }
    if (i < n && strchr("+- ", s[i])) f->sign = s[i++];
    if (i < n && s[i] == 'z') i++;
    if (i < n && s[i] == '#') {
        f->alt = true;
        i++;
    }
    if (i < n && s[i] == '0') {
        f->zero = true;
        i++;
    }
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        f->width = (f->width < 0 ? 0 : f->width) * 10 + (s[i++] - '0');
        if (f->width > 100000000) tj_fail(rs, ST_ERR_LIMIT, "format width too big");
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) f->group = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        f->prec = 0;
        if (i >= n || s[i] < '0' || s[i] > '9') tj_fail(rs, ST_ERR_ARG, "Format specifier missing precision");
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            f->prec = f->prec * 10 + (s[i++] - '0');
            if (f->prec > 100000) tj_fail(rs, ST_ERR_LIMIT, "format precision too big");
        }
    }
    if (i < n) f->type = s[i++];
    if (i < n) tj_fail(rs, ST_ERR_ARG, "Invalid format specifier");
}

static void apply_align(tj_render *rs, tj_buf *out, const char *sign, const char *body,
                        size_t blen, const fspec *f, char def_align) {
    char al = f->align ? f->align : def_align;
    uint32_t fill = f->fill;
    if (f->zero && !f->align) {
        al = '=';
        fill = '0';
    }
    int64_t len = (int64_t)(strlen(sign) + st_utf8_count(body, blen));
    int64_t pad = f->width > len ? f->width - len : 0;
    if (pad > (int64_t)rs->t->params.max_memory) tj_fail(rs, ST_ERR_LIMIT, "format width too large");
    tj_work(rs, pad);
    int64_t left = 0, right = 0;
    switch (al) {
    case '<': right = pad; break;
    case '^': left = pad / 2; right = pad - left; break;
    default: left = pad; break;
    }
    if (al == '=') {
        tj_puts(rs, out, sign);
        for (int64_t i = 0; i < left; i++) put_cp(rs, out, fill);
        tj_put(rs, out, body, blen);
        return;
    }
    for (int64_t i = 0; i < left; i++) put_cp(rs, out, fill);
    tj_puts(rs, out, sign);
    tj_put(rs, out, body, blen);
    for (int64_t i = 0; i < right; i++) put_cp(rs, out, fill);
}

static void group_digits(char *digits, char sep) {
    size_t n = strlen(digits), ip = n;
    char *dot = strchr(digits, '.');
    if (dot) ip = (size_t)(dot - digits);
    char tmp[512];
    size_t o = 0;
    for (size_t i = 0; i < ip && o < sizeof tmp - 2; i++) {
        if (i && (ip - i) % 3 == 0) tmp[o++] = sep;
        tmp[o++] = digits[i];
    }
    for (size_t i = ip; i < n && o < sizeof tmp - 1; i++) tmp[o++] = digits[i];
    tmp[o] = 0;
    strcpy(digits, tmp);
}

static void format_value(tj_render *rs, tj_buf *out, tj_val v, const char *spec, size_t slen) {
    if (slen == 0) {
        tj_str_of(rs, out, v);
        return;
    }
    fspec f;
    parse_spec(rs, spec, slen, &f);
    if (v.kind == TJ_STR) {
        if (f.type && f.type != 's')
            tj_fail(rs, ST_ERR_ARG, "Unknown format code '%c' for object of type 'str'", f.type);
        size_t len = v.as.s->len;
        if (f.prec >= 0) len = tj_utf8_offset(v.as.s->data, v.as.s->len, (size_t)f.prec);
        fspec g = f;
        g.zero = false;
        if (f.zero && !f.align) {
            g.fill = '0';
            g.align = '<';
        }
        apply_align(rs, out, "", v.as.s->data, len, &g, '<');
        return;
    }
    if (!tj_is_num(v))
        tj_fail(rs, ST_ERR_ARG, "unsupported format string passed to %s.__format__",
                tj_type_name(v));
    char body[512];
    const char *sign = "";
    char t = f.type;
    if (tj_is_intlike(v) && (t == 0 || strchr("bcdoxXn", t))) {
        if (v.kind == TJ_BOOL && t == 0 && f.prec < 0) {
            /* format(True, '>5') formats as int */
        }
        if (f.prec >= 0) tj_fail(rs, ST_ERR_ARG, "Precision not allowed in integer format specifier");
        int64_t iv = v.as.i;
        bool neg = iv < 0;
        uint64_t mag = neg ? (uint64_t)0 - (uint64_t)iv : (uint64_t)iv;
        if (t == 'c') {
            char u[4];
            int m = tj_utf8_put((uint32_t)mag, u);
            memcpy(body, u, (size_t)m);
            body[m] = 0;
        } else if (t == 'b') {
            char tmp[70];
            int k = 0;
            do {
                tmp[k++] = (char)('0' + (mag & 1));
                mag >>= 1;
            } while (mag);
            int o = 0;
            if (f.alt) {
                body[o++] = '0';
                body[o++] = 'b';
            }
            while (k) body[o++] = tmp[--k];
            body[o] = 0;
        } else if (t == 'o' || t == 'x' || t == 'X') {
            snprintf(body, sizeof body, "%s%llx", "", (unsigned long long)mag);
            if (t == 'o') snprintf(body, sizeof body, "%s%llo", f.alt ? "0o" : "", (unsigned long long)mag);
            else if (t == 'x') snprintf(body, sizeof body, "%s%llx", f.alt ? "0x" : "", (unsigned long long)mag);
            else snprintf(body, sizeof body, "%s%llX", f.alt ? "0X" : "", (unsigned long long)mag);
        } else {
            snprintf(body, sizeof body, "%llu", (unsigned long long)mag);
            if (f.group) group_digits(body, f.group);
        }
        sign = neg ? "-" : f.sign == '+' ? "+" : f.sign == ' ' ? " " : "";
        apply_align(rs, out, sign, body, strlen(body), &f, '>');
        return;
    }
    double x = tj_num_f(v);
    bool neg = signbit(x) && !isnan(x);
    double ax = fabs(x);
    int prec = f.prec < 0 ? 6 : (int)f.prec;
    if (t == 0) {
        if (f.prec < 0) {
            tj_float_repr(ax, body);
        } else {
            snprintf(body, sizeof body, "%.*g", prec ? prec : 1, ax);
            if (!strchr(body, '.') && !strchr(body, 'e') && !strchr(body, 'n') && !strchr(body, 'i')) {
                size_t bl = strlen(body);
                if (bl + 2 < sizeof body) strcat(body, ".0");
            }
        }
    } else if (t == '%') {
        snprintf(body, sizeof body, "%.*f%%", prec, ax * 100);
    } else if (strchr("eEfFgG", t)) {
        char cf[8] = {'%', '.', '*', t, 0};
        if (f.alt) {
            cf[0] = '%';
            cf[1] = '#';
            cf[2] = '.';
            cf[3] = '*';
            cf[4] = t;
            cf[5] = 0;
        }
        snprintf(body, sizeof body, cf, prec, ax);
    } else {
        tj_fail(rs, ST_ERR_ARG, "Unknown format code '%c' for object of type '%s'", t,
                tj_type_name(v));
    }
    if (f.group) group_digits(body, f.group);
    sign = neg ? "-" : f.sign == '+' ? "+" : f.sign == ' ' ? " " : "";
    apply_align(rs, out, sign, body, strlen(body), &f, '>');
}

/* Field numbering state shared with nested specs ('{:{}}'), as in Python. */
typedef struct fmt_state {
    int auto_idx;
    bool manual;
} fmt_state;

static tj_val str_format(tj_render *rs, const tj_str *fmt, tj_args *args, int depth,
                         fmt_state *fs);

tj_val tj_str_format(tj_render *rs, const tj_str *fmt, tj_args *args) {
    fmt_state fs = {0, false};
    return str_format(rs, fmt, args, 0, &fs);
}

static tj_val str_format(tj_render *rs, const tj_str *fmt, tj_args *args, int depth,
                         fmt_state *fs) {
    if (depth > 1) tj_fail(rs, ST_ERR_ARG, "Max string recursion exceeded");
    tj_buf out = {0};
    const char *s = fmt->data;
    size_t n = fmt->len, i = 0;
    while (i < n) {
        char c = s[i];
        if (c == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                tj_putc(rs, &out, '}');
                i += 2;
                continue;
            }
            tj_fail(rs, ST_ERR_ARG, "Single '}' encountered in format string");
        }
        if (c != '{') {
            size_t st = i;
            while (i < n && s[i] != '{' && s[i] != '}') i++;
            tj_put(rs, &out, s + st, i - st);
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            tj_putc(rs, &out, '{');
            i += 2;
            continue;
        }
        /* replacement field */
        size_t st = ++i;
        int nest = 1;
        while (i < n && nest) {
            if (s[i] == '{') nest++;
            else if (s[i] == '}') nest--;
            if (nest) i++;
        }
        if (i >= n) tj_fail(rs, ST_ERR_ARG, "expected '}' before end of string");
        size_t fe = i++; /* field is s[st..fe) */
        size_t p = st;
        while (p < fe && s[p] != '.' && s[p] != '[' && s[p] != '!' && s[p] != ':') p++;
        tj_val v;
        if (p == st) {
            if (fs->manual)
                tj_fail(rs, ST_ERR_ARG, "cannot switch from manual field specification to automatic field numbering");
            if (fs->auto_idx >= args->n)
                tj_fail(rs, ST_ERR_ARG, "Replacement index %d out of range for positional args tuple", fs->auto_idx);
            v = args->pos[fs->auto_idx++];
        } else if (s[st] >= '0' && s[st] <= '9') {
            if (fs->auto_idx > 0)
                tj_fail(rs, ST_ERR_ARG, "cannot switch from automatic field numbering to manual field specification");
            fs->manual = true;
            int64_t idx = 0;
            for (size_t q = st; q < p; q++) {
                if (s[q] < '0' || s[q] > '9') tj_fail(rs, ST_ERR_ARG, "bad field name");
                idx = idx * 10 + (s[q] - '0');
                if (idx > 1000000) break;
            }
            if (idx >= args->n)
                tj_fail(rs, ST_ERR_ARG, "Replacement index %lld out of range for positional args tuple",
                        (long long)idx);
            v = args->pos[idx];
        } else {
            int k;
            for (k = 0; k < args->nkw; k++)
                if (args->kw[k].len == p - st && memcmp(args->kw[k].name, s + st, p - st) == 0) break;
            if (k == args->nkw) tj_fail(rs, ST_ERR_ARG, "KeyError: '%.*s'", (int)(p - st), s + st);
            v = args->kw[k].v;
        }
        while (p < fe && (s[p] == '.' || s[p] == '[')) {
            if (s[p] == '.') {
                size_t a = ++p;
                while (p < fe && s[p] != '.' && s[p] != '[' && s[p] != '!' && s[p] != ':') p++;
                v = tj_getattr(rs, v, s + a, p - a);
                if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v);
            } else {
                size_t a = ++p;
                while (p < fe && s[p] != ']') p++;
                if (p >= fe) tj_fail(rs, ST_ERR_ARG, "Missing ']' in format string");
                bool digits = p > a;
                for (size_t q = a; q < p; q++)
                    if (s[q] < '0' || s[q] > '9') digits = false;
                tj_val key;
                if (digits) {
                    int64_t k = 0;
                    for (size_t q = a; q < p && k < 1000000000; q++) k = k * 10 + (s[q] - '0');
                    key = tj_int(k);
                } else {
                    key = tj_strn(rs, s + a, p - a);
                }
                v = tj_getitem(rs, v, key);
                if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v);
                p++;
            }
        }
        char conv = 0;
        if (p < fe && s[p] == '!') {
            if (p + 1 >= fe) tj_fail(rs, ST_ERR_ARG, "end of string while looking for conversion specifier");
            conv = s[p + 1];
            p += 2;
            if (conv != 'r' && conv != 's' && conv != 'a')
                tj_fail(rs, ST_ERR_ARG, "Unknown conversion specifier %c", conv);
        }
        const char *spec = "";
        size_t slen = 0;
        tj_buf specb = {0};
        if (p < fe && s[p] == ':') {
            spec = s + p + 1;
            slen = fe - p - 1;
            if (memchr(spec, '{', slen)) { /* nested fields */
                tj_val sub = str_format(rs, tj_strn(rs, spec, slen).as.s, args, depth + 1, fs);
                tj_put(rs, &specb, sub.as.s->data, sub.as.s->len);
                spec = specb.data;
                slen = specb.len;
            }
        } else if (p < fe) {
            tj_fail(rs, ST_ERR_ARG, "expected ':' after conversion specifier");
        }
        if (conv == 'r' || conv == 'a') {
            tj_buf t = {0};
            tj_repr_of(rs, &t, v);
            v = tj_str_buf(rs, &t);
        } else if (conv == 's') {
            v = tj_to_str(rs, v);
        }
        format_value(rs, &out, v, spec, slen);
    }
    return tj_str_buf(rs, &out);
}
