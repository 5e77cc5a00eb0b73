/* ==== Template JSON: jansson values in, Python json.dumps() out ====
 *
 * Context objects arrive as jansson values (object key order is insertion order, which
 * jansson 2.14 keeps, so dicts iterate as Python's do). The tojson filter must print
 * exactly what transformers' override prints: json.dumps(x, ensure_ascii=False,
 * indent=indent, separators=separators, sort_keys=sort_keys): Python's float repr, NaN and
 * Infinity spelled as Python does, only control characters, quotes and backslashes escaped
 * (non-ASCII and </> kept as is), ', ' and ': ' separators, or ',' with an indent.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "template/tj_int.h"

tj_val tj_from_json(tj_render *rs, const json_t *j) {
    tj_value_enter(rs);
    tj_val r;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tj_dict *d = tj_dict_new(rs, (int64_t)json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            tj_dict_set(rs, d, tj_str_cstr(rs, k), tj_from_json(rs, v));
        }
        r = tj_dictv(d);
        break;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tj_list *l = tj_list_new(rs, (int64_t)n, TJ_L_LIST);
        for (size_t i = 0; i < n; i++) l->items[i] = tj_from_json(rs, json_array_get(j, i));
        r = tj_listv(l);
        break;
    }
    case JSON_STRING: {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (st_utf8_check(s, n) != n) tj_fail(rs, ST_ERR_ARG, "context string is not valid UTF-8");
        r = tj_strn(rs, s, n);
        break;
    }
    case JSON_INTEGER: r = tj_int((int64_t)json_integer_value(j)); break;
    case JSON_REAL: r = tj_float(json_real_value(j)); break;
    case JSON_TRUE: r = tj_bool(true); break;
    case JSON_FALSE: r = tj_bool(false); break;
    default: r = tj_none(); break;
    }
    tj_value_leave(rs);
    return r;
}

/* ==== json.dumps ==== */

typedef struct dumper {
    tj_render *rs;
    tj_buf *b;
    bool ensure_ascii;
    bool has_indent;
    const char *indent; /* [indent_len] */
    size_t indent_len;
    const char *item_sep, *key_sep;
    bool sort_keys;
} dumper;

static void dump_str(dumper *d, const char *s, size_t len) {
    tj_render *rs = d->rs;
    tj_buf *b = d->b;
    tj_putc(rs, b, '"');
    size_t i = 0, run = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char esc[16];
        size_t adv = 1;
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            e = esc;
        } else if (c >= 0x80 && d->ensure_ascii) {
            size_t q = i;
            uint32_t cp = tj_utf8_next(s, len, &q);
            adv = q - i;
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            e = esc;
        }
        if (e) {
            if (run) tj_put(rs, b, s + i - run, run);
            run = 0;
            tj_puts(rs, b, e);
            i += adv;
        } else {
            run++;
            i++;
        }
    }
    if (run) tj_put(rs, b, s + len - run, run);
    tj_putc(rs, b, '"');
}

static void newline_indent(dumper *d, int level) {
    tj_putc(d->rs, d->b, '\n');
    for (int i = 0; i < level; i++) tj_put(d->rs, d->b, d->indent, d->indent_len);
}

_Noreturn static void not_serializable(tj_render *rs, tj_val v) {
    tj_fail(rs, ST_ERR_ARG, "Object of type %s is not JSON serializable", tj_type_name(v));
}

static void dump_float(dumper *d, double f) {
    if (isnan(f)) tj_puts(d->rs, d->b, "NaN");
    else if (isinf(f)) tj_puts(d->rs, d->b, f < 0 ? "-Infinity" : "Infinity");
    else {
        char t[40];
        tj_float_repr(f, t);
        tj_puts(d->rs, d->b, t);
    }
}

/* Key as JSON object key text (Python converts int/float/bool/None keys). */
static tj_val key_str(dumper *d, tj_val k) {
    tj_render *rs = d->rs;
    switch (k.kind) {
    case TJ_STR: return k;
    case TJ_BOOL: return tj_str_cstr(rs, k.as.i ? "true" : "false");
    case TJ_NONE: return tj_str_cstr(rs, "null");
    case TJ_INT:
    case TJ_FLOAT: {
        if (k.kind == TJ_FLOAT && (isnan(k.as.f) || isinf(k.as.f))) {
            const char *s = isnan(k.as.f) ? "NaN" : k.as.f < 0 ? "-Infinity" : "Infinity";
            return tj_str_cstr(rs, s);
        }
        return tj_to_str(rs, k);
    }
    default:
        tj_fail(rs, ST_ERR_ARG, "keys must be str, int, float, bool or None, not %s",
                tj_type_name(k));
    }
}

static void dump(dumper *d, tj_val v, int level) {
    tj_render *rs = d->rs;
    tj_value_enter(rs);
    tj_work(rs, 1);
    switch ((tj_kind)v.kind) {
    case TJ_NONE: tj_puts(rs, d->b, "null"); break;
    case TJ_BOOL: tj_puts(rs, d->b, v.as.i ? "true" : "false"); break;
    case TJ_INT: tj_str_of(rs, d->b, v); break;
    case TJ_FLOAT: dump_float(d, v.as.f); break;
    case TJ_STR: dump_str(d, v.as.s->data, v.as.s->len); break;
    case TJ_LIST: {
        const tj_list *l = v.as.l;
        if (l->type != TJ_L_LIST && l->type != TJ_L_TUPLE) not_serializable(rs, v);
        if (l->len == 0) {
            tj_puts(rs, d->b, "[]");
            break;
        }
        tj_putc(rs, d->b, '[');
        if (d->has_indent) newline_indent(d, level + 1);
        for (int64_t i = 0; i < l->len; i++) {
            if (i) {
                tj_puts(rs, d->b, d->item_sep);
                if (d->has_indent) newline_indent(d, level + 1);
            }
            dump(d, l->items[i], level + 1);
        }
        if (d->has_indent) newline_indent(d, level);
        tj_putc(rs, d->b, ']');
        break;
    }
    case TJ_DICT: {
        const tj_dict *m = v.as.d;
        if (m->len == 0) {
            tj_puts(rs, d->b, "{}");
            break;
        }
        int64_t *order = tj_alloc(rs, (size_t)m->len * sizeof *order);
        for (int64_t i = 0; i < m->len; i++) order[i] = i;
        if (d->sort_keys) { /* insertion sort keeps it stable; fine for template-sized dicts */
            for (int64_t i = 1; i < m->len; i++) {
                int64_t x = order[i], j = i;
                while (j > 0 && tj_compare(rs, m->keys[x], m->keys[order[j - 1]]) < 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        tj_putc(rs, d->b, '{');
        if (d->has_indent) newline_indent(d, level + 1);
        for (int64_t k = 0; k < m->len; k++) {
            int64_t i = order[k];
            if (k) {
                tj_puts(rs, d->b, d->item_sep);
                if (d->has_indent) newline_indent(d, level + 1);
            }
            tj_val ks = key_str(d, m->keys[i]);
            dump_str(d, ks.as.s->data, ks.as.s->len);
            tj_puts(rs, d->b, d->key_sep);
            dump(d, m->vals[i], level + 1);
        }
        if (d->has_indent) newline_indent(d, level);
        tj_putc(rs, d->b, '}');
        break;
    }
    default: not_serializable(rs, v);
    }
    tj_value_leave(rs);
}

void tj_dumps(tj_render *rs, tj_buf *b, tj_val v, bool ensure_ascii, const char *indent,
              size_t indent_len, bool has_indent, const char *item_sep, const char *key_sep,
              bool sort_keys) {
    dumper d = {.rs = rs,
                .b = b,
                .ensure_ascii = ensure_ascii,
                .has_indent = has_indent,
                .indent = indent ? indent : "",
                .indent_len = indent ? indent_len : 0,
                .item_sep = item_sep ? item_sep : (has_indent ? "," : ", "),
                .key_sep = key_sep ? key_sep : ": ",
                .sort_keys = sort_keys};
    dump(&d, v, 0);
}
