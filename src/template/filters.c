/* ==== Template filters and tests: jinja2's builtins as HF templates use them ====
 *
 * Filters take the value, positional and keyword arguments with jinja2's parameter names
 * (default(value, default_value='', boolean=False), ...). tojson is transformers' override
 * (json.dumps with ensure_ascii=False). select/reject/map/unique/batch return one-shot
 * generators, as in jinja2 (always truthy, no len(), printed as <generator object>);
 * sort is stable and uses Python's < (TypeError on mixed types); case-insensitive sorting,
 * unique, min and max lower-case strings. Tests cover jinja2 3.1's list.
 * Filters jinja2 has but this engine does not (groupby, wordwrap, urlize, ...) fail when
 * called, with a message saying so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"


/* ==== Name tables ==== */

typedef struct named {
    const char *name;
    int id;
} named;

static const named filter_names[] = {
    {"abs", TJ_FL_ABS}, {"attr", TJ_FL_ATTR}, {"batch", TJ_FL_BATCH},
    {"capitalize", TJ_FL_CAPITALIZE}, {"center", TJ_FL_CENTER}, {"count", TJ_FL_COUNT},
    {"d", TJ_FL_DEFAULT}, {"default", TJ_FL_DEFAULT}, {"dictsort", TJ_FL_DICTSORT},
    {"e", TJ_FL_ESCAPE}, {"escape", TJ_FL_ESCAPE}, {"first", TJ_FL_FIRST},
    {"float", TJ_FL_FLOAT}, {"forceescape", TJ_FL_FORCEESCAPE}, {"format", TJ_FL_FORMAT},
    {"indent", TJ_FL_INDENT}, {"int", TJ_FL_INT}, {"items", TJ_FL_ITEMS}, {"join", TJ_FL_JOIN},
    {"last", TJ_FL_LAST}, {"length", TJ_FL_LENGTH}, {"list", TJ_FL_LIST},
    {"lower", TJ_FL_LOWER}, {"map", TJ_FL_MAP}, {"max", TJ_FL_MAX}, {"min", TJ_FL_MIN},
    {"reject", TJ_FL_REJECT}, {"rejectattr", TJ_FL_REJECTATTR}, {"replace", TJ_FL_REPLACE},
    {"reverse", TJ_FL_REVERSE}, {"round", TJ_FL_ROUND}, {"safe", TJ_FL_SAFE},
    {"select", TJ_FL_SELECT}, {"selectattr", TJ_FL_SELECTATTR}, {"slice", TJ_FL_SLICE},
    {"sort", TJ_FL_SORT}, {"string", TJ_FL_STRING}, {"sum", TJ_FL_SUM}, {"title", TJ_FL_TITLE},
    {"tojson", TJ_FL_TOJSON}, {"trim", TJ_FL_TRIM}, {"truncate", TJ_FL_TRUNCATE},
    {"unique", TJ_FL_UNIQUE}, {"upper", TJ_FL_UPPER}, {"wordcount", TJ_FL_WORDCOUNT},
    /* jinja2 filters not implemented here: an error when used */
    {"filesizeformat", TJ_FL_UNSUPPORTED}, {"groupby", TJ_FL_UNSUPPORTED},
    {"pprint", TJ_FL_UNSUPPORTED}, {"random", TJ_FL_UNSUPPORTED},
    {"striptags", TJ_FL_UNSUPPORTED}, {"urlencode", TJ_FL_UNSUPPORTED},
    {"urlize", TJ_FL_UNSUPPORTED}, {"wordwrap", TJ_FL_UNSUPPORTED},
    {"xmlattr", TJ_FL_UNSUPPORTED}, {NULL, 0}};

static const named test_names[] = {
    {"boolean", TJ_TS_BOOLEAN}, {"callable", TJ_TS_CALLABLE}, {"defined", TJ_TS_DEFINED},
    {"divisibleby", TJ_TS_DIVISIBLEBY}, {"eq", TJ_TS_EQ}, {"equalto", TJ_TS_EQ},
    {"==", TJ_TS_EQ}, {"escaped", TJ_TS_ESCAPED}, {"even", TJ_TS_EVEN},
    {"false", TJ_TS_FALSE}, {"filter", TJ_TS_FILTER}, {"float", TJ_TS_FLOAT}, {"ge", TJ_TS_GE},
    {">=", TJ_TS_GE}, {"gt", TJ_TS_GT}, {">", TJ_TS_GT}, {"greaterthan", TJ_TS_GT},
    {"in", TJ_TS_IN}, {"integer", TJ_TS_INTEGER}, {"iterable", TJ_TS_ITERABLE},
    {"le", TJ_TS_LE}, {"<=", TJ_TS_LE}, {"lower", TJ_TS_LOWER}, {"lt", TJ_TS_LT},
    {"<", TJ_TS_LT}, {"lessthan", TJ_TS_LT}, {"mapping", TJ_TS_MAPPING}, {"ne", TJ_TS_NE},
    {"!=", TJ_TS_NE}, {"none", TJ_TS_NONE}, {"number", TJ_TS_NUMBER}, {"odd", TJ_TS_ODD},
    {"sameas", TJ_TS_SAMEAS}, {"sequence", TJ_TS_SEQUENCE}, {"string", TJ_TS_STRING},
    {"test", TJ_TS_TEST}, {"true", TJ_TS_TRUE}, {"undefined", TJ_TS_UNDEFINED},
    {"upper", TJ_TS_UPPER}, {NULL, 0}};

static int lookup_named(const named *t, const char *name, size_t len) {
    for (int i = 0; t[i].name; i++)
        if (strlen(t[i].name) == len && memcmp(t[i].name, name, len) == 0) return t[i].id;
    return 0;
}

int tj_filter_lookup(const char *name, size_t len) { return lookup_named(filter_names, name, len); }
int tj_test_lookup(const char *name, size_t len) { return lookup_named(test_names, name, len); }

/* ==== Helpers ==== */

static tj_val missing(void) {
    tj_val v = tj_undef_plain();
    v.id = 0xffff;
    return v;
}

static tj_val arg_or(tj_val v, tj_val def) { return tj_given(v) ? v : def; }

static tj_val soft_str(tj_render *rs, tj_val v) {
    if (v.kind == TJ_STR) return v;
    return tj_to_str(rs, v);
}

static const tj_list *as_list(tj_render *rs, tj_val v) { return tj_iterate(rs, v); }

static tj_val gen_of(tj_list *l) {
    l->type = TJ_L_GEN;
    return tj_listv(l);
}

static tj_list *copy_list(tj_render *rs, const tj_list *src, uint8_t type) {
    tj_list *l = tj_list_new(rs, src->len, type);
    if (src->len) memcpy(l->items, src->items, (size_t)src->len * sizeof(tj_val));
    return l;
}

/* jinja2's make_attrgetter: "a.b.0" -> getitem chain; postprocess lower-cases strings. */
typedef struct attrgetter {
    int nparts;
    tj_val parts[16];
    bool lower;
    tj_val deflt; /* missing = none */
} attrgetter;

static void attr_prepare(tj_render *rs, attrgetter *g, tj_val attribute, bool lower, tj_val deflt) {
    g->nparts = 0;
    g->lower = lower;
    g->deflt = deflt;
    if (!tj_given(attribute) || attribute.kind == TJ_NONE) return;
    if (attribute.kind != TJ_STR) {
        g->parts[g->nparts++] = attribute;
        return;
    }
    const tj_str *s = attribute.as.s;
    size_t st = 0;
    for (size_t i = 0; i <= s->len; i++) {
        if (i < s->len && s->data[i] != '.') continue;
        if (g->nparts == 16) tj_fail(rs, ST_ERR_LIMIT, "attribute path too long");
        bool digits = i > st;
        int64_t num = 0;
        for (size_t k = st; k < i; k++) {
            if (s->data[k] < '0' || s->data[k] > '9') digits = false;
            else if (num < 100000000000LL) num = num * 10 + (s->data[k] - '0');
        }
        g->parts[g->nparts++] = digits ? tj_int(num) : tj_strn(rs, s->data + st, i - st);
        st = i + 1;
    }
}

static tj_val attr_get(tj_render *rs, const attrgetter *g, tj_val item) {
    for (int i = 0; i < g->nparts; i++) {
        item = tj_getitem(rs, item, g->parts[i]);
        if (tj_given(g->deflt) && g->deflt.kind != TJ_NONE && item.kind == TJ_UNDEF)
            item = g->deflt;
    }
    if (g->lower && item.kind == TJ_STR) item = tj_str_case(rs, item, 'l');
    return item;
}

/* Stable merge sort of vals by keys with Python's <. */
static void msort(tj_render *rs, tj_val *keys, tj_val *vals, int64_t n, tj_val *tk, tj_val *tv,
                  bool reverse) {
    if (n < 2) return;
    int64_t m = n / 2;
    msort(rs, keys, vals, m, tk, tv, reverse);
    msort(rs, keys + m, vals + m, n - m, tk, tv, reverse);
    int64_t i = 0, j = m, k = 0;
    while (i < m && j < n) {
        /* take from the right only when strictly before (stability) */
        bool right = reverse ? tj_cmp(rs, TJ_CMP_LT, keys[i], keys[j])
                             : tj_cmp(rs, TJ_CMP_LT, keys[j], keys[i]);
        if (right) {
            tk[k] = keys[j];
            tv[k++] = vals[j++];
        } else {
            tk[k] = keys[i];
            tv[k++] = vals[i++];
        }
    }
    while (i < m) {
        tk[k] = keys[i];
        tv[k++] = vals[i++];
    }
    while (j < n) {
        tk[k] = keys[j];
        tv[k++] = vals[j++];
    }
    memcpy(keys, tk, (size_t)n * sizeof(tj_val));
    memcpy(vals, tv, (size_t)n * sizeof(tj_val));
    tj_work(rs, n);
}

static void sort_by(tj_render *rs, tj_val *keys, tj_val *vals, int64_t n, bool reverse) {
    tj_val *tk = tj_alloc(rs, (size_t)(n ? n : 1) * sizeof(tj_val));
    tj_val *tv = tj_alloc(rs, (size_t)(n ? n : 1) * sizeof(tj_val));
    msort(rs, keys, vals, n, tk, tv, reverse);
}

static tj_val call_test_by_name(tj_render *rs, tj_val name, tj_val item, tj_args *rest);

/* select / reject / selectattr / rejectattr */
static tj_val select_reject(tj_render *rs, tj_val seq, tj_args *a, bool attr, bool want) {
    int off = 0;
    if (!tj_truthy(seq)) return gen_of(tj_list_new(rs, 0, TJ_L_LIST)); /* jinja2: `if value:` */
    attrgetter g;
    g.nparts = 0;
    g.lower = false;
    g.deflt = missing();
    if (attr) {
        if (a->n < 1) tj_fail(rs, ST_ERR_ARG, "Missing parameter for attribute name");
        attr_prepare(rs, &g, a->pos[0], false, missing());
        off = 1;
    }
    bool has_test = a->n > off;
    tj_args rest = {0};
    if (has_test) {
        rest.n = a->n - off - 1;
        rest.pos = a->pos + off + 1;
        rest.nkw = a->nkw;
        rest.kw = a->kw;
    }
    const tj_list *items = as_list(rs, seq);
    tj_list *out = tj_list_new(rs, items->len, TJ_L_LIST);
    int64_t k = 0;
    for (int64_t i = 0; i < items->len; i++) {
        tj_val x = items->items[i];
        tj_val t = attr ? attr_get(rs, &g, x) : x;
        bool ok = has_test ? tj_truthy(call_test_by_name(rs, a->pos[off], t, &rest)) : tj_truthy(t);
        if (ok == want) out->items[k++] = x;
    }
    out->len = k;
    return gen_of(out);
}

static tj_val do_map(tj_render *rs, tj_val seq, tj_args *a) {
    if (!tj_truthy(seq)) return gen_of(tj_list_new(rs, 0, TJ_L_LIST)); /* jinja2: `if value:` */
    const tj_list *items = as_list(rs, seq);
    tj_list *out = tj_list_new(rs, items->len, TJ_L_LIST);
    int attr_kw = -1;
    for (int k = 0; k < a->nkw; k++)
        if (a->kw[k].len == 9 && memcmp(a->kw[k].name, "attribute", 9) == 0) attr_kw = k;
    if (a->n == 0 && attr_kw >= 0) {
        tj_val deflt = missing();
        for (int k = 0; k < a->nkw; k++) {
            if (k == attr_kw) continue;
            if (a->kw[k].len == 7 && memcmp(a->kw[k].name, "default", 7) == 0) deflt = a->kw[k].v;
            else tj_fail(rs, ST_ERR_ARG, "Unexpected keyword argument '%s'", a->kw[k].name);
        }
        attrgetter g;
        attr_prepare(rs, &g, a->kw[attr_kw].v, false, deflt);
        for (int64_t i = 0; i < items->len; i++) out->items[i] = attr_get(rs, &g, items->items[i]);
        return gen_of(out);
    }
    if (a->n == 0) tj_fail(rs, ST_ERR_ARG, "map requires a filter argument");
    tj_val name = a->pos[0];
    if (name.kind != TJ_STR) tj_fail(rs, ST_ERR_ARG, "No filter named %s.", tj_type_name(name));
    int fid = tj_filter_lookup(name.as.s->data, name.as.s->len);
    if (!fid) tj_fail(rs, ST_ERR_ARG, "No filter named '%s'.", name.as.s->data);
    tj_args rest = {.n = a->n - 1, .pos = a->pos + 1, .nkw = a->nkw, .kw = a->kw};
    for (int64_t i = 0; i < items->len; i++)
        out->items[i] = tj_apply_filter(rs, fid, name.as.s->data, items->items[i], &rest);
    return gen_of(out);
}

static tj_val call_test_by_name(tj_render *rs, tj_val name, tj_val item, tj_args *rest) {
    if (name.kind != TJ_STR) tj_fail(rs, ST_ERR_ARG, "No test named %s.", tj_type_name(name));
    int tid = tj_test_lookup(name.as.s->data, name.as.s->len);
    if (!tid) tj_fail(rs, ST_ERR_ARG, "No test named '%s'.", name.as.s->data);
    return tj_bool(tj_apply_test(rs, tid, name.as.s->data, item, rest));
}

static tj_val min_max(tj_render *rs, tj_val v, tj_args *a, bool is_max) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    tj_val p[2];
    tj_bind(rs, is_max ? "max" : "min", a, 2, names, p);
    bool cs = tj_given(p[0]) && tj_truthy(p[0]);
    attrgetter g;
    attr_prepare(rs, &g, p[1], !cs, missing());
    const tj_list *items = as_list(rs, v);
    if (items->len == 0) return tj_undef_hint(rs, "No aggregated item, sequence was empty.");
    int64_t best = 0;
    tj_val bk = attr_get(rs, &g, items->items[0]);
    for (int64_t i = 1; i < items->len; i++) {
        tj_val k = attr_get(rs, &g, items->items[i]);
        bool better = is_max ? tj_cmp(rs, TJ_CMP_GT, k, bk) : tj_cmp(rs, TJ_CMP_LT, k, bk);
        if (better) {
            best = i;
            bk = k;
        }
    }
    return items->items[best];
}

static tj_val do_round(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"precision", "method"};
    tj_val p[2];
    tj_bind(rs, "round", a, 2, names, p);
    int64_t prec = 0;
    if (tj_given(p[0])) {
        if (!tj_is_intlike(p[0]))
            tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer",
                    tj_type_name(p[0]));
        prec = p[0].as.i;
    }
    const char *method = "common";
    if (tj_given(p[1])) {
        if (p[1].kind != TJ_STR) tj_fail(rs, ST_ERR_ARG, "method must be common, ceil or floor");
        method = p[1].as.s->data;
    }
    bool common = !strcmp(method, "common"), ceil_m = !strcmp(method, "ceil");
    if (!common && !ceil_m && strcmp(method, "floor"))
        tj_fail(rs, ST_ERR_ARG, "method must be common, ceil or floor");
    if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v);
    if (!tj_is_num(v))
        tj_fail(rs, ST_ERR_ARG, "type %s doesn't define __round__ method", tj_type_name(v));
    if (common) {
        if (tj_is_intlike(v)) {
            if (prec >= 0) return tj_int(v.as.i);
            if (prec < -18) return tj_int(0);
            int64_t m = 1;
            for (int64_t i = 0; i < -prec; i++) m *= 10;
            int64_t q = v.as.i / m, r = v.as.i % m;
            if (r < 0) {
                r += m;
                q--;
            }
            if (r * 2 > m || (r * 2 == m && (q & 1))) q++;
            return tj_int(q * m);
        }
        double x = v.as.f;
        if (!isfinite(x)) return v;
        if (prec > 320) return v;
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            double r = strtod(buf, NULL);
            if (r == 0) r = copysign(0.0, x);
            return tj_float(r);
        }
        if (prec < -308) return tj_float(copysign(0.0, x));
        double m = pow(10.0, (double)-prec);
        double r = nearbyint(x / m) * m;
        if (r == 0) r = copysign(0.0, x);
        return tj_float(r);
    }
    double m = pow(10.0, (double)prec);
    double x = tj_num_f(v);
    double r = (ceil_m ? ceil(x * m) : floor(x * m)) / m;
    return tj_float(r);
}

static tj_val do_int(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"default", "base"};
    tj_val p[2];
    tj_bind(rs, "int", a, 2, names, p);
    tj_val deflt = arg_or(p[0], tj_int(0));
    if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v); /* Undefined.__int__ fails */
    int64_t base = 10;
    if (tj_given(p[1])) {
        if (!tj_is_intlike(p[1])) return deflt;
        base = p[1].as.i;
    }
    if (tj_is_intlike(v)) return tj_int(v.as.i);
    if (v.kind == TJ_FLOAT) {
        if (!isfinite(v.as.f)) tj_fail(rs, ST_ERR_ARG, "cannot convert float infinity or NaN to integer");
        if (fabs(v.as.f) >= 9.2e18) tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow");
        return tj_int((int64_t)v.as.f);
    }
    if (v.kind != TJ_STR) return deflt;
    /* int(str, base): optional sign, whitespace, underscores between digits, 0x/0o/0b */
    const tj_str *s = v.as.s;
    tj_val st = tj_str_strip(rs, v, NULL, 3);
    const char *d = st.as.s->data;
    size_t n = st.as.s->len, i = 0;
    bool neg = false, ok = n > 0;
    if (i < n && (d[i] == '+' || d[i] == '-')) neg = d[i++] == '-';
    int64_t b = base;
    if (b == 0 || b == 16 || b == 8 || b == 2) {
        if (i + 1 < n && d[i] == '0') {
            char k = (char)(d[i + 1] | 0x20);
            int pb = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
            if (pb && (b == 0 || b == pb)) {
                b = pb;
                i += 2;
                if (i < n && d[i] == '_') i++;
            }
        }
        if (b == 0) b = 10;
    }
    if (b < 2 || b > 36) ok = false;
    uint64_t acc = 0;
    bool any = false, overflow = false;
    for (; ok && i < n; i++) {
        char c = d[i];
        if (c == '_' && any && i + 1 < n && d[i + 1] != '_') continue;
        int dv = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ? (c | 0x20) - 'a' + 10 : 99;
        if (dv >= b) {
            ok = false;
            break;
        }
        if (acc > (UINT64_MAX - (uint64_t)dv) / (uint64_t)b) overflow = true;
        acc = acc * (uint64_t)b + (uint64_t)dv;
        any = true;
    }
    if (ok && any) {
        if (overflow || acc > (uint64_t)INT64_MAX) tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow");
        return tj_int(neg ? -(int64_t)acc : (int64_t)acc);
    }
    /* "42.23"|int -> 42 via float() */
    (void)s;
    char *end;
    const char *fs = st.as.s->data;
    bool has_digit = false;
    for (size_t k = 0; k < st.as.s->len; k++)
        if (fs[k] >= '0' && fs[k] <= '9') has_digit = true;
    if (!has_digit || strchr(fs, '_') || strpbrk(fs, "xXpP")) return deflt;
    double f = strtod(fs, &end);
    if (end == fs || *end) return deflt;
    if (!isfinite(f)) tj_fail(rs, ST_ERR_ARG, "cannot convert float infinity or NaN to integer");
    if (fabs(f) >= 9.2e18) tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow");
    return tj_int((int64_t)f);
}

static tj_val do_float(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"default"};
    tj_val p[1];
    tj_bind(rs, "float", a, 1, names, p);
    tj_val deflt = arg_or(p[0], tj_float(0.0));
    if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v); /* Undefined.__float__ fails */
    if (tj_is_num(v)) return tj_float(tj_num_f(v));
    if (v.kind != TJ_STR) return deflt;
    tj_val st = tj_str_strip(rs, v, NULL, 3);
    const char *s = st.as.s->data;
    size_t n = st.as.s->len;
    if (n == 0) return deflt;
    /* Python accepts digits with single underscores, inf/infinity/nan, no hex */
    char *buf = tj_alloc(rs, n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '_') {
            if (i == 0 || i + 1 >= n || !(s[i - 1] >= '0' && s[i - 1] <= '9') ||
                !(s[i + 1] >= '0' && s[i + 1] <= '9'))
                return deflt;
            continue;
        }
        buf[o++] = s[i];
    }
    buf[o] = 0;
    if (strpbrk(buf, "xXpP")) return deflt;
    const char *q = buf;
    if (*q == '+' || *q == '-') q++;
    if (!strcasecmp(q, "inf") || !strcasecmp(q, "infinity") || !strcasecmp(q, "nan")) {
        double f = strcasecmp(q, "nan") == 0 ? NAN : INFINITY;
        return tj_float(buf[0] == '-' ? -f : f);
    }
    if (!((*q >= '0' && *q <= '9') || *q == '.')) return deflt;
    char *end;
    double f = strtod(buf, &end);
    if (end == buf || *end) return deflt;
    return tj_float(f);
}

static tj_val do_indent(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"width", "first", "blank"};
    tj_val p[3];
    tj_bind(rs, "indent", a, 3, names, p);
    tj_val w = arg_or(p[0], tj_int(4));
    bool first = tj_given(p[1]) && tj_truthy(p[1]);
    bool blank = tj_given(p[2]) && tj_truthy(p[2]);
    tj_buf ind = {0};
    if (w.kind == TJ_STR) {
        tj_put(rs, &ind, w.as.s->data, w.as.s->len);
    } else if (tj_is_intlike(w)) {
        if (w.as.i > 100000) tj_fail(rs, ST_ERR_LIMIT, "indent width too large");
        tj_work(rs, w.as.i);
        for (int64_t i = 0; i < w.as.i; i++) tj_putc(rs, &ind, ' ');
    } else {
        tj_fail(rs, ST_ERR_ARG, "can't multiply sequence by non-int of type '%s'", tj_type_name(w));
    }
    if (v.kind != TJ_STR)
        tj_fail(rs, ST_ERR_ARG, "unsupported operand type(s) for +=: '%s' and 'str'", tj_type_name(v));
    tj_buf sb = {0};
    tj_put(rs, &sb, v.as.s->data, v.as.s->len);
    tj_putc(rs, &sb, '\n');
    tj_val s2 = tj_str_buf(rs, &sb);
    const tj_list *lines = tj_str_splitlines(rs, s2.as.s, false).as.l;
    tj_buf o = {0};
    const char *id = ind.data ? ind.data : "";
    if (first) tj_put(rs, &o, id, ind.len);
    for (int64_t i = 0; i < lines->len; i++) {
        const tj_str *ln = lines->items[i].as.s;
        if (i) {
            tj_putc(rs, &o, '\n');
            if (blank || ln->len) tj_put(rs, &o, id, ind.len);
        }
        tj_put(rs, &o, ln->data, ln->len);
    }
    tj_val r = tj_str_buf(rs, &o);
    r.flags = v.flags;
    return r;
}

static tj_val do_truncate(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"length", "killwords", "end", "leeway"};
    tj_val p[4];
    tj_bind(rs, "truncate", a, 4, names, p);
    int64_t length = tj_given(p[0]) && tj_is_intlike(p[0]) ? p[0].as.i : 255;
    bool killwords = tj_given(p[1]) && tj_truthy(p[1]);
    tj_val end = arg_or(p[2], tj_str_cstr(rs, "..."));
    if (end.kind != TJ_STR) end = tj_to_str(rs, end);
    int64_t leeway = tj_given(p[3]) && p[3].kind != TJ_NONE && tj_is_intlike(p[3]) ? p[3].as.i : 5;
    int64_t elen = (int64_t)end.as.s->ncp;
    if (length < elen) tj_fail(rs, ST_ERR_ARG, "expected length >= %lld, got %lld", (long long)elen, (long long)length);
    if (leeway < 0) tj_fail(rs, ST_ERR_ARG, "expected leeway >= 0, got %lld", (long long)leeway);
    if (v.kind != TJ_STR) { /* jinja2 applies len() and slicing to the value as it is */
        if (tj_len(rs, v) <= length + leeway) return v;
        tj_fail(rs, ST_ERR_UNSUPPORTED, "truncate of a long non-string value is not supported");
    }
    const tj_str *s = v.as.s;
    if ((int64_t)s->ncp <= length + leeway) return v;
    size_t cut = tj_utf8_offset(s->data, s->len, (size_t)(length - elen));
    tj_buf o = {0};
    if (killwords) {
        tj_put(rs, &o, s->data, cut);
    } else {
        size_t k = cut;
        while (k > 0 && s->data[k - 1] != ' ') k--;
        tj_put(rs, &o, s->data, k > 0 ? k - 1 : cut);
    }
    tj_put(rs, &o, end.as.s->data, end.as.s->len);
    return tj_str_buf(rs, &o);
}

static tj_val do_tojson(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    tj_val p[4];
    tj_bind(rs, "tojson", a, 4, names, p);
    bool ensure_ascii = tj_given(p[0]) && tj_truthy(p[0]);
    bool has_indent = tj_given(p[1]) && p[1].kind != TJ_NONE;
    tj_buf ind = {0};
    if (has_indent) {
        tj_val w = p[1];
        if (w.kind == TJ_STR) tj_put(rs, &ind, w.as.s->data, w.as.s->len);
        else if (tj_is_intlike(w)) {
            if (w.as.i > 10000) tj_fail(rs, ST_ERR_LIMIT, "tojson indent too large");
            for (int64_t i = 0; i < w.as.i; i++) tj_putc(rs, &ind, ' ');
        } else {
            tj_fail(rs, ST_ERR_ARG, "can't multiply sequence by non-int of type '%s'", tj_type_name(w));
        }
    }
    const char *item_sep = NULL, *key_sep = NULL;
    if (tj_given(p[2]) && p[2].kind != TJ_NONE) {
        const tj_list *sp = tj_iterate(rs, p[2]);
        if (sp->len != 2) tj_fail(rs, ST_ERR_ARG, "separators must be a pair of strings");
        tj_val x = sp->items[0], y = sp->items[1];
        if (x.kind != TJ_STR || y.kind != TJ_STR)
            tj_fail(rs, ST_ERR_ARG, "separators must be a pair of strings");
        item_sep = x.as.s->data;
        key_sep = y.as.s->data;
    }
    bool sort_keys = tj_given(p[3]) && tj_truthy(p[3]);
    tj_buf o = {0};
    tj_dumps(rs, &o, v, ensure_ascii, ind.data ? ind.data : "", ind.len, has_indent, item_sep,
             key_sep, sort_keys);
    return tj_str_buf(rs, &o);
}

static tj_val do_wordcount(tj_render *rs, tj_val v) {
    tj_val s = soft_str(rs, v);
    const tj_str *t = s.as.s;
    int64_t count = 0;
    bool in_word = false;
    size_t i = 0;
    while (i < t->len) {
        uint32_t c = tj_utf8_next(t->data, t->len, &i);
        bool w = c == '_' || tj_py_isalnum(c);
        if (w && !in_word) count++;
        in_word = w;
    }
    return tj_int(count);
}

static tj_val do_title(tj_render *rs, tj_val v) {
    /* jinja2: split at runs of [-\s({[<], upper the first char of each piece, lower the rest */
    tj_val s = soft_str(rs, v);
    const tj_str *t = s.as.s;
    tj_buf o = {0};
    size_t i = 0;
    bool at_start = true;
    while (i < t->len) {
        size_t st = i;
        uint32_t c = tj_utf8_next(t->data, t->len, &i);
        bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tj_py_isspace(c);
        tj_val ch = tj_strn(rs, t->data + st, i - st);
        if (sep) {
            tj_put(rs, &o, t->data + st, i - st);
            at_start = true;
            continue;
        }
        tj_val m = tj_str_case(rs, ch, at_start ? 'u' : 'l');
        tj_put(rs, &o, m.as.s->data, m.as.s->len);
        at_start = false;
    }
    return tj_str_buf(rs, &o);
}

static tj_val do_sum(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"attribute", "start"};
    tj_val p[2];
    tj_bind(rs, "sum", a, 2, names, p);
    attrgetter g;
    attr_prepare(rs, &g, p[0], false, missing());
    tj_val acc = arg_or(p[1], tj_int(0));
    if (acc.kind == TJ_STR) tj_fail(rs, ST_ERR_ARG, "sum() can't sum strings [use ''.join(seq) instead]");
    const tj_list *items = as_list(rs, v);
    for (int64_t i = 0; i < items->len; i++)
        acc = tj_arith(rs, TJ_OP_ADD, acc, attr_get(rs, &g, items->items[i]));
    return acc;
}

static tj_val do_unique(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    tj_val p[2];
    tj_bind(rs, "unique", a, 2, names, p);
    bool cs = tj_given(p[0]) && tj_truthy(p[0]);
    attrgetter g;
    attr_prepare(rs, &g, p[1], !cs, missing());
    const tj_list *items = as_list(rs, v);
    tj_list *out = tj_list_new(rs, items->len, TJ_L_LIST);
    tj_dict *seen = tj_dict_new(rs, items->len);
    int64_t k = 0;
    for (int64_t i = 0; i < items->len; i++) {
        tj_val key = attr_get(rs, &g, items->items[i]);
        if (!tj_is_hashable(rs, key)) tj_fail(rs, ST_ERR_ARG, "unhashable type: '%s'", tj_type_name(key));
        if (tj_dict_get(rs, seen, key)) continue;
        tj_dict_set(rs, seen, key, tj_none());
        out->items[k++] = items->items[i];
    }
    out->len = k;
    return gen_of(out);
}

static tj_val do_sort(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
    tj_val p[3];
    tj_bind(rs, "sort", a, 3, names, p);
    bool rev = tj_given(p[0]) && tj_truthy(p[0]);
    bool cs = tj_given(p[1]) && tj_truthy(p[1]);
    const tj_list *items = as_list(rs, v);
    tj_list *out = copy_list(rs, items, TJ_L_LIST);
    int64_t n = out->len;
    /* attribute may list several, comma-separated: the key is then a tuple */
    int nattr = 0;
    attrgetter gs[8];
    if (tj_given(p[2]) && p[2].kind == TJ_STR && memchr(p[2].as.s->data, ',', p[2].as.s->len)) {
        const tj_str *s = p[2].as.s;
        size_t st = 0;
        for (size_t i = 0; i <= s->len && nattr < 8; i++) {
            if (i < s->len && s->data[i] != ',') continue;
            attr_prepare(rs, &gs[nattr++], tj_strn(rs, s->data + st, i - st), !cs, missing());
            st = i + 1;
        }
    } else {
        attr_prepare(rs, &gs[nattr++], p[2], !cs, missing());
    }
    tj_val *keys = tj_alloc(rs, (size_t)(n ? n : 1) * sizeof(tj_val));
    for (int64_t i = 0; i < n; i++) {
        if (nattr == 1) {
            keys[i] = attr_get(rs, &gs[0], out->items[i]);
        } else {
            tj_list *t = tj_list_new(rs, nattr, TJ_L_TUPLE);
            for (int k = 0; k < nattr; k++) t->items[k] = attr_get(rs, &gs[k], out->items[i]);
            keys[i] = tj_listv(t);
        }
    }
    sort_by(rs, keys, out->items, n, rev);
    return tj_listv(out);
}

static tj_val do_dictsort(tj_render *rs, tj_val v, tj_args *a) {
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    tj_val p[3];
    tj_bind(rs, "dictsort", a, 3, names, p);
    bool cs = tj_given(p[0]) && tj_truthy(p[0]);
    int pos = 0;
    if (tj_given(p[1])) {
        if (p[1].kind == TJ_STR && !strcmp(p[1].as.s->data, "value")) pos = 1;
        else if (!(p[1].kind == TJ_STR && !strcmp(p[1].as.s->data, "key")))
            tj_fail(rs, ST_ERR_ARG, "You can only sort by either \"key\" or \"value\"");
    }
    bool rev = tj_given(p[2]) && tj_truthy(p[2]);
    if (v.kind != TJ_DICT) tj_fail(rs, ST_ERR_ARG, "'%s' object has no attribute 'items'", tj_type_name(v));
    const tj_dict *d = v.as.d;
    tj_list *out = tj_list_new(rs, d->len, TJ_L_LIST);
    tj_val *keys = tj_alloc(rs, (size_t)(d->len ? d->len : 1) * sizeof(tj_val));
    for (int64_t i = 0; i < d->len; i++) {
        tj_list *pair = tj_list_new(rs, 2, TJ_L_TUPLE);
        pair->items[0] = d->keys[i];
        pair->items[1] = d->vals[i];
        out->items[i] = tj_listv(pair);
        tj_val k = pos ? d->vals[i] : d->keys[i];
        if (!cs && k.kind == TJ_STR) k = tj_str_case(rs, k, 'l');
        keys[i] = k;
    }
    sort_by(rs, keys, out->items, d->len, rev);
    return tj_listv(out);
}

static tj_val do_batch(tj_render *rs, tj_val v, tj_args *a, bool is_slice) {
    static const char *const names[] = {"linecount", "fill_with"};
    static const char *const snames[] = {"slices", "fill_with"};
    tj_val p[2];
    tj_bind(rs, is_slice ? "slice" : "batch", a, 2, is_slice ? snames : names, p);
    if (!tj_given(p[0]) || !tj_is_intlike(p[0]))
        tj_fail(rs, ST_ERR_ARG, "%s() needs an integer count", is_slice ? "slice" : "batch");
    int64_t cnt = p[0].as.i;
    bool fill = tj_given(p[1]) && p[1].kind != TJ_NONE;
    const tj_list *items = as_list(rs, v);
    int64_t n = items->len;
    if (!is_slice) {
        if (cnt <= 0) tj_fail(rs, ST_ERR_ARG, "batch count must be positive");
        int64_t groups = (n + cnt - 1) / cnt;
        tj_list *out = tj_list_new(rs, groups, TJ_L_LIST);
        for (int64_t gi = 0; gi < groups; gi++) {
            int64_t st = gi * cnt, len = n - st < cnt ? n - st : cnt;
            tj_list *g = tj_list_new(rs, fill ? cnt : len, TJ_L_LIST);
            for (int64_t k = 0; k < g->len; k++) g->items[k] = k < len ? items->items[st + k] : p[1];
            out->items[gi] = tj_listv(g);
        }
        return gen_of(out);
    }
    if (cnt <= 0) tj_fail(rs, ST_ERR_ARG, "integer division or modulo by zero");
    int64_t per = n / cnt, extra = n % cnt;
    tj_list *out = tj_list_new(rs, cnt, TJ_L_LIST);
    for (int64_t s = 0; s < cnt; s++) {
        int64_t st = s * per + (s < extra ? s : extra);
        int64_t len = per + (s < extra ? 1 : 0);
        bool pad = fill && s >= extra && extra > 0;
        tj_list *g = tj_list_new(rs, len + (pad ? 1 : 0), TJ_L_LIST);
        for (int64_t k = 0; k < len; k++) g->items[k] = items->items[st + k];
        if (pad) g->items[len] = p[1];
        out->items[s] = tj_listv(g);
    }
    return gen_of(out);
}

/* ==== Lazy generators ==== */

struct tj_thunk {
    int fid;
    const char *name;
    tj_val v;
    tj_args args; /* pos/kw arrays live in the render arena */
};

static tj_val apply_filter(tj_render *rs, int fid, const char *name, tj_val v, tj_args *a,
                           bool eager);

static tj_val lazy_gen(tj_render *rs, int fid, const char *name, tj_val v, tj_args *a) {
    tj_thunk *t = tj_alloc(rs, sizeof *t);
    t->fid = fid;
    t->name = name;
    t->v = v;
    t->args = *a;
    tj_list *l = tj_list_new(rs, 0, TJ_L_GEN);
    l->thunk = t;
    switch (fid) { /* the generator functions' names in jinja2 3.1 */
    case TJ_FL_MAP: l->pyname = "sync_do_map"; break;
    case TJ_FL_UNIQUE: l->pyname = "do_unique"; break;
    case TJ_FL_BATCH: l->pyname = "do_batch"; break;
    case TJ_FL_SLICE: l->pyname = "sync_do_slice"; break;
    case TJ_FL_ITEMS: l->pyname = "do_items"; break;
    default: l->pyname = "select_or_reject"; break;
    }
    return tj_listv(l);
}

void tj_gen_force(tj_render *rs, tj_list *gen) {
    const tj_thunk *t = gen->thunk;
    ST_ASSERT(t);
    gen->thunk = NULL; /* a failure below ends the render; no re-entry */
    tj_args a = t->args;
    tj_val r = apply_filter(rs, t->fid, t->name, t->v, &a, true);
    ST_ASSERT(r.kind == TJ_LIST);
    gen->items = r.as.l->items;
    gen->len = r.as.l->len;
}

/* ==== Filter dispatch ==== */

tj_val tj_apply_filter(tj_render *rs, int fid, const char *name, tj_val v, tj_args *a) {
    return apply_filter(rs, fid, name, v, a, false);
}

static tj_val apply_filter(tj_render *rs, int fid, const char *name, tj_val v, tj_args *a,
                           bool eager) {
    tj_val p[4];
    tj_work(rs, 1);
    switch (fid) {
    case TJ_FL_BATCH:
    case TJ_FL_SLICE:
    case TJ_FL_UNIQUE:
    case TJ_FL_ITEMS:
    case TJ_FL_MAP:
    case TJ_FL_SELECT:
    case TJ_FL_REJECT:
    case TJ_FL_SELECTATTR:
    case TJ_FL_REJECTATTR:
        if (!eager) {
            /* Python binds a generator function's arguments at the call, runs it later */
            static const char *const bnames[] = {"linecount", "fill_with"};
            static const char *const snames[] = {"slices", "fill_with"};
            static const char *const unames[] = {"case_sensitive", "attribute"};
            if (fid == TJ_FL_BATCH || fid == TJ_FL_SLICE) {
                tj_bind(rs, name, a, 2, fid == TJ_FL_BATCH ? bnames : snames, p);
                if (!tj_given(p[0]))
                    tj_fail(rs, ST_ERR_ARG, "do_%s() missing 1 required positional argument: '%s'",
                            fid == TJ_FL_BATCH ? "batch" : "slice", fid == TJ_FL_BATCH ? "linecount" : "slices");
            } else if (fid == TJ_FL_UNIQUE) {
                tj_bind(rs, name, a, 2, unames, p);
            } else if (fid == TJ_FL_ITEMS) {
                tj_bind(rs, name, a, 0, NULL, p);
            }
            return lazy_gen(rs, fid, name, v, a);
        }
        break;
    default: break;
    }
    switch (fid) {
    case TJ_FL_ABS:
        tj_bind(rs, "abs", a, 0, NULL, p);
        if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v);
        if (tj_is_intlike(v)) {
            if (v.as.i == INT64_MIN) tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow");
            return tj_int(v.as.i < 0 ? -v.as.i : v.as.i);
        }
        if (v.kind == TJ_FLOAT) return tj_float(fabs(v.as.f));
        tj_fail(rs, ST_ERR_ARG, "bad operand type for abs(): '%s'", tj_type_name(v));
    case TJ_FL_ATTR: {
        static const char *const names[] = {"name"};
        tj_bind(rs, "attr", a, 1, names, p);
        if (!tj_given(p[0]) || p[0].kind != TJ_STR)
            tj_fail(rs, ST_ERR_ARG, "attribute name must be a string");
        if (v.kind == TJ_UNDEF) return tj_undef_attr(rs, v, p[0].as.s->data, p[0].as.s->len);
        if (v.kind == TJ_DICT || v.kind == TJ_NS) {
            tj_val m;
            if (v.kind == TJ_DICT && tj_method_lookup(rs, v, p[0].as.s->data, p[0].as.s->len, &m)) return m;
            if (v.kind == TJ_NS) return tj_getattr(rs, v, p[0].as.s->data, p[0].as.s->len);
            return tj_undef_attr(rs, v, p[0].as.s->data, p[0].as.s->len);
        }
        return tj_getattr(rs, v, p[0].as.s->data, p[0].as.s->len);
    }
    case TJ_FL_BATCH: return do_batch(rs, v, a, false);
    case TJ_FL_SLICE: return do_batch(rs, v, a, true);
    case TJ_FL_CAPITALIZE:
        tj_bind(rs, "capitalize", a, 0, NULL, p);
        return tj_str_case(rs, soft_str(rs, v), 'c');
    case TJ_FL_CENTER: {
        static const char *const names[] = {"width"};
        tj_bind(rs, "center", a, 1, names, p);
        tj_val w = arg_or(p[0], tj_int(80));
        if (!tj_is_intlike(w))
            tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer", tj_type_name(w));
        return tj_str_pad(rs, soft_str(rs, v), w.as.i, ' ', 'c');
    }
    case TJ_FL_COUNT:
    case TJ_FL_LENGTH:
        tj_bind(rs, name, a, 0, NULL, p);
        return tj_int(tj_len(rs, v));
    case TJ_FL_DEFAULT: {
        static const char *const names[] = {"default_value", "boolean"};
        tj_bind(rs, "default", a, 2, names, p);
        tj_val d = arg_or(p[0], tj_strn(rs, "", 0));
        bool boolean = tj_given(p[1]) && tj_truthy(p[1]);
        if (v.kind == TJ_UNDEF || (boolean && !tj_truthy(v))) return d;
        return v;
    }
    case TJ_FL_DICTSORT: return do_dictsort(rs, v, a);
    case TJ_FL_ESCAPE:
    case TJ_FL_FORCEESCAPE: {
        tj_bind(rs, name, a, 0, NULL, p);
        if (fid == TJ_FL_ESCAPE && v.kind == TJ_STR && (v.flags & TJ_F_MARKUP)) return v;
        tj_val s = soft_str(rs, v);
        tj_buf o = {0};
        tj_html_escape(rs, &o, s.as.s->data, s.as.s->len);
        tj_val r = tj_str_buf(rs, &o);
        r.flags |= TJ_F_MARKUP;
        return r;
    }
    case TJ_FL_FIRST: {
        tj_bind(rs, "first", a, 0, NULL, p);
        const tj_list *items = as_list(rs, v);
        if (items->len == 0) return tj_undef_hint(rs, "No first item, sequence was empty.");
        return items->items[0];
    }
    case TJ_FL_LAST: {
        tj_bind(rs, "last", a, 0, NULL, p);
        if (v.kind == TJ_LIST && (v.as.l->type == TJ_L_GEN || v.as.l->type == TJ_L_REVITER))
            tj_fail(rs, ST_ERR_ARG, "'%s' object is not reversible", tj_type_name(v));
        const tj_list *items = as_list(rs, v);
        if (items->len == 0) return tj_undef_hint(rs, "No last item, sequence was empty.");
        return items->items[items->len - 1];
    }
    case TJ_FL_FLOAT: return do_float(rs, v, a);
    case TJ_FL_INT: return do_int(rs, v, a);
    case TJ_FL_FORMAT: {
        if (a->n && a->nkw)
            tj_fail(rs, ST_ERR_ARG, "can't handle positional and keyword arguments at the same time");
        tj_val s = soft_str(rs, v);
        tj_val arg;
        if (a->nkw) {
            tj_dict *d = tj_dict_new(rs, a->nkw);
            for (int k = 0; k < a->nkw; k++)
                tj_dict_set(rs, d, tj_strn(rs, a->kw[k].name, a->kw[k].len), a->kw[k].v);
            arg = tj_dictv(d);
        } else {
            tj_list *t = tj_list_new(rs, a->n, TJ_L_TUPLE);
            for (int k = 0; k < a->n; k++) t->items[k] = a->pos[k];
            arg = tj_listv(t);
        }
        return tj_percent_format(rs, s.as.s, arg);
    }
    case TJ_FL_INDENT: return do_indent(rs, v, a);
    case TJ_FL_ITEMS: {
        tj_bind(rs, "items", a, 0, NULL, p);
        if (v.kind == TJ_UNDEF) return gen_of(tj_list_new(rs, 0, TJ_L_LIST));
        if (v.kind != TJ_DICT) tj_fail(rs, ST_ERR_ARG, "Can only get item pairs from a mapping.");
        tj_list *out = tj_list_new(rs, v.as.d->len, TJ_L_LIST);
        for (int64_t i = 0; i < v.as.d->len; i++) {
            tj_list *pair = tj_list_new(rs, 2, TJ_L_TUPLE);
            pair->items[0] = v.as.d->keys[i];
            pair->items[1] = v.as.d->vals[i];
            out->items[i] = tj_listv(pair);
        }
        return gen_of(out);
    }
    case TJ_FL_JOIN: {
        static const char *const names[] = {"d", "attribute"};
        tj_bind(rs, "join", a, 2, names, p);
        tj_val sep = soft_str(rs, arg_or(p[0], tj_strn(rs, "", 0)));
        attrgetter g;
        attr_prepare(rs, &g, p[1], false, missing());
        const tj_list *items = as_list(rs, v);
        tj_buf o = {0};
        for (int64_t i = 0; i < items->len; i++) {
            if (i) tj_put(rs, &o, sep.as.s->data, sep.as.s->len);
            tj_str_of(rs, &o, attr_get(rs, &g, items->items[i]));
        }
        return tj_str_buf(rs, &o);
    }
    case TJ_FL_LIST:
        tj_bind(rs, "list", a, 0, NULL, p);
        return tj_listv(copy_list(rs, as_list(rs, v), TJ_L_LIST));
    case TJ_FL_LOWER:
        tj_bind(rs, "lower", a, 0, NULL, p);
        return tj_str_case(rs, soft_str(rs, v), 'l');
    case TJ_FL_UPPER:
        tj_bind(rs, "upper", a, 0, NULL, p);
        return tj_str_case(rs, soft_str(rs, v), 'u');
    case TJ_FL_TITLE:
        tj_bind(rs, "title", a, 0, NULL, p);
        return do_title(rs, v);
    case TJ_FL_MAP: return do_map(rs, v, a);
    case TJ_FL_MAX: return min_max(rs, v, a, true);
    case TJ_FL_MIN: return min_max(rs, v, a, false);
    case TJ_FL_SELECT: return select_reject(rs, v, a, false, true);
    case TJ_FL_REJECT: return select_reject(rs, v, a, false, false);
    case TJ_FL_SELECTATTR: return select_reject(rs, v, a, true, true);
    case TJ_FL_REJECTATTR: return select_reject(rs, v, a, true, false);
    case TJ_FL_REPLACE: {
        static const char *const names[] = {"old", "new", "count"};
        tj_bind(rs, "replace", a, 3, names, p);
        if (!tj_given(p[0]) || !tj_given(p[1]))
            tj_fail(rs, ST_ERR_ARG, "replace() missing required arguments 'old' and 'new'");
        int64_t cnt = -1;
        if (tj_given(p[2]) && p[2].kind != TJ_NONE) {
            if (!tj_is_intlike(p[2]))
                tj_fail(rs, ST_ERR_ARG, "'%s' object cannot be interpreted as an integer", tj_type_name(p[2]));
            cnt = p[2].as.i;
        }
        tj_val s = tj_to_str(rs, v);
        return tj_str_replace(rs, s.as.s, tj_to_str(rs, p[0]).as.s, tj_to_str(rs, p[1]).as.s, cnt);
    }
    case TJ_FL_REVERSE: {
        tj_bind(rs, "reverse", a, 0, NULL, p);
        if (v.kind == TJ_STR) {
            const tj_str *s = v.as.s;
            tj_buf o = {0};
            size_t e = s->len;
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)s->data[st] & 0xc0) == 0x80) st--;
                tj_put(rs, &o, s->data + st, e - st);
                e = st;
            }
            return tj_str_buf(rs, &o);
        }
        bool direct = v.kind == TJ_UNDEF || v.kind == TJ_DICT ||
                      (v.kind == TJ_LIST && v.as.l->type != TJ_L_GEN && v.as.l->type != TJ_L_REVITER);
        const char *pyname = "reversed"; /* reversed() of a sequence-protocol object */
        if (v.kind == TJ_DICT) pyname = "dict_reversekeyiterator";
        else if (v.kind == TJ_LIST && v.as.l->type == TJ_L_LIST) pyname = "list_reverseiterator";
        else if (v.kind == TJ_LIST && v.as.l->type == TJ_L_RANGE) pyname = "range_iterator";
        const tj_list *items = as_list(rs, v);
        tj_list *out = tj_list_new(rs, items->len, direct ? TJ_L_REVITER : TJ_L_LIST);
        out->pyname = pyname;
        for (int64_t i = 0; i < items->len; i++) out->items[i] = items->items[items->len - 1 - i];
        return tj_listv(out);
    }
    case TJ_FL_ROUND: return do_round(rs, v, a);
    case TJ_FL_SAFE: {
        tj_bind(rs, "safe", a, 0, NULL, p);
        tj_val s = soft_str(rs, v);
        s.flags |= TJ_F_MARKUP;
        return s;
    }
    case TJ_FL_SORT: return do_sort(rs, v, a);
    case TJ_FL_STRING:
        tj_bind(rs, "string", a, 0, NULL, p);
        return soft_str(rs, v);
    case TJ_FL_SUM: return do_sum(rs, v, a);
    case TJ_FL_TOJSON: return do_tojson(rs, v, a);
    case TJ_FL_TRIM: {
        static const char *const names[] = {"chars"};
        tj_bind(rs, "trim", a, 1, names, p);
        const tj_str *chars = NULL;
        if (tj_given(p[0]) && p[0].kind != TJ_NONE) {
            if (p[0].kind != TJ_STR) tj_fail(rs, ST_ERR_ARG, "strip arg must be None or str");
            chars = p[0].as.s;
        }
        tj_val s = soft_str(rs, v);
        tj_val r = tj_str_strip(rs, s, chars, 3);
        r.flags = s.flags;
        return r;
    }
    case TJ_FL_TRUNCATE: return do_truncate(rs, v, a);
    case TJ_FL_UNIQUE: return do_unique(rs, v, a);
    case TJ_FL_WORDCOUNT:
        tj_bind(rs, "wordcount", a, 0, NULL, p);
        return do_wordcount(rs, v);
    case TJ_FL_UNSUPPORTED:
        tj_fail(rs, ST_ERR_UNSUPPORTED, "the '%s' filter is not supported by this template engine",
                name);
    default:
        tj_fail(rs, ST_ERR_ARG, "No filter named '%s'.", name);
    }
}

/* ==== Tests ==== */

static bool is_sameas(tj_val a, tj_val b) {
    if (a.kind != b.kind) return false;
    switch ((tj_kind)a.kind) {
    case TJ_NONE: return true;
    case TJ_UNDEF: return a.as.u == b.as.u;
    case TJ_BOOL: return a.as.i == b.as.i;
    case TJ_INT: return a.as.i == b.as.i && a.as.i >= -5 && a.as.i <= 256;
    case TJ_FLOAT: return false;
    case TJ_FUNC: return a.id == b.id;
    default: return a.as.d == b.as.d;
    }
}

static bool test_mod(tj_render *rs, tj_val v, tj_val d, int64_t want) {
    tj_val r = tj_arith(rs, TJ_OP_MOD, v, d);
    return tj_equal(rs, r, tj_int(want));
}

bool tj_apply_test(tj_render *rs, int tid, const char *name, tj_val v, tj_args *a) {
    tj_val p[2];
    static const char *const one[] = {"other"};
    tj_work(rs, 1);
    switch (tid) {
    case TJ_TS_DEFINED: tj_bind(rs, name, a, 0, NULL, p); return v.kind != TJ_UNDEF;
    case TJ_TS_UNDEFINED: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_UNDEF;
    case TJ_TS_NONE: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_NONE;
    case TJ_TS_BOOLEAN: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_BOOL;
    case TJ_TS_FALSE: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_BOOL && !v.as.i;
    case TJ_TS_TRUE: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_BOOL && v.as.i;
    case TJ_TS_INTEGER: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_INT;
    case TJ_TS_FLOAT: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_FLOAT;
    case TJ_TS_NUMBER: tj_bind(rs, name, a, 0, NULL, p); return tj_is_num(v);
    case TJ_TS_STRING: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_STR;
    case TJ_TS_MAPPING: tj_bind(rs, name, a, 0, NULL, p); return v.kind == TJ_DICT;
    case TJ_TS_ESCAPED:
        tj_bind(rs, name, a, 0, NULL, p);
        return v.kind == TJ_STR && (v.flags & TJ_F_MARKUP);
    case TJ_TS_ITERABLE:
        tj_bind(rs, name, a, 0, NULL, p);
        return v.kind == TJ_STR || v.kind == TJ_LIST || v.kind == TJ_DICT || v.kind == TJ_UNDEF ||
               v.kind == TJ_LOOP;
    case TJ_TS_SEQUENCE:
        tj_bind(rs, name, a, 0, NULL, p);
        if (v.kind == TJ_LIST)
            return v.as.l->type == TJ_L_LIST || v.as.l->type == TJ_L_TUPLE || v.as.l->type == TJ_L_RANGE;
        return v.kind == TJ_STR || v.kind == TJ_DICT || v.kind == TJ_UNDEF;
    case TJ_TS_CALLABLE:
        tj_bind(rs, name, a, 0, NULL, p);
        return v.kind == TJ_MACRO || v.kind == TJ_FUNC || v.kind == TJ_METHOD ||
               v.kind == TJ_UNDEF || v.kind == TJ_LOOP;
    case TJ_TS_LOWER:
    case TJ_TS_UPPER: {
        tj_bind(rs, name, a, 0, NULL, p);
        tj_val s = tj_to_str(rs, v);
        const tj_str *t = s.as.s;
        bool any = false;
        size_t i = 0;
        while (i < t->len) {
            uint32_t c = tj_utf8_next(t->data, t->len, &i);
            if (tid == TJ_TS_LOWER) {
                if (tj_py_iscased_upper(c) || tj_py_istitle_cp(c)) return false;
                if (tj_py_iscased_lower(c)) any = true;
            } else {
                if (tj_py_iscased_lower(c) || tj_py_istitle_cp(c)) return false;
                if (tj_py_iscased_upper(c)) any = true;
            }
        }
        return any;
    }
    case TJ_TS_ODD:
        tj_bind(rs, name, a, 0, NULL, p);
        return test_mod(rs, v, tj_int(2), 1);
    case TJ_TS_EVEN:
        tj_bind(rs, name, a, 0, NULL, p);
        return test_mod(rs, v, tj_int(2), 0);
    case TJ_TS_DIVISIBLEBY: {
        static const char *const names[] = {"num"};
        tj_bind(rs, name, a, 1, names, p);
        if (!tj_given(p[0])) tj_fail(rs, ST_ERR_ARG, "test_divisibleby() missing 1 required positional argument: 'num'");
        return test_mod(rs, v, p[0], 0);
    }
    case TJ_TS_SAMEAS:
        tj_bind(rs, name, a, 1, one, p);
        if (!tj_given(p[0])) tj_fail(rs, ST_ERR_ARG, "test_sameas() missing 1 required positional argument: 'other'");
        return is_sameas(v, p[0]);
    case TJ_TS_IN: {
        static const char *const names[] = {"seq"};
        tj_bind(rs, name, a, 1, names, p);
        if (!tj_given(p[0])) tj_fail(rs, ST_ERR_ARG, "test_in() missing 1 required positional argument: 'seq'");
        return tj_contains(rs, p[0], v);
    }
    case TJ_TS_EQ: case TJ_TS_NE: case TJ_TS_LT: case TJ_TS_LE: case TJ_TS_GT: case TJ_TS_GE: {
        static const char *const names[] = {"b"};
        tj_bind(rs, name, a, 1, names, p);
        if (!tj_given(p[0])) tj_fail(rs, ST_ERR_ARG, "%s() missing 1 required positional argument: 'b'", name);
        int op = tid == TJ_TS_EQ ? TJ_CMP_EQ : tid == TJ_TS_NE ? TJ_CMP_NE : tid == TJ_TS_LT ? TJ_CMP_LT
               : tid == TJ_TS_LE ? TJ_CMP_LE : tid == TJ_TS_GT ? TJ_CMP_GT : TJ_CMP_GE;
        return tj_cmp(rs, op, v, p[0]);
    }
    case TJ_TS_FILTER:
    case TJ_TS_TEST:
        tj_bind(rs, name, a, 0, NULL, p);
        if (v.kind != TJ_STR) return false;
        if (tid == TJ_TS_FILTER) {
            int f = tj_filter_lookup(v.as.s->data, v.as.s->len);
            return f != 0;
        }
        return tj_test_lookup(v.as.s->data, v.as.s->len) != 0;
    default:
        tj_fail(rs, ST_ERR_ARG, "No test named '%s'.", name);
    }
}
