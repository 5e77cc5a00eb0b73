/* ==== Template values with Python semantics ====
 *
 * Templates are written against Python objects: truthiness, == between int/float/bool, list
 * and dict equality, ordering rules and their TypeErrors, str() and repr() spellings
 * ("None", "True", "1.0", "['a', 1]"), len(), `in`, and the arithmetic operators with int
 * vs float results. This file reproduces those on tj_val, plus jinja2's Undefined (prints as
 * "", iterates as empty, fails on attribute access and arithmetic).
 *
 * Every value lives in the render's arena; lists and dicts never change after they are
 * built (the sandbox forbids mutating methods), except namespace attributes.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"

/* ==== Failing, allocation, work ==== */

void tj_fail(tj_render *rs, st_status st, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (rs->line > 0) st_error_set(rs->err, st, "line %d: %s", rs->line, msg);
    else st_error_set(rs->err, st, "%s", msg); /* before any statement: the context */
    longjmp(rs->jb, 1);
}

void *tj_alloc(tj_render *rs, size_t n) {
    void *p = tj_arena_alloc(&rs->arena, n);
    if (!p)
        tj_fail(rs, ST_ERR_LIMIT, "template memory limit (%zu bytes) exceeded",
                rs->t->params.max_memory);
    return p;
}

void tj_work(tj_render *rs, int64_t units) {
    rs->steps += units;
    if (rs->steps > rs->t->params.max_steps)
        tj_fail(rs, ST_ERR_LIMIT, "template evaluation step limit (%lld) exceeded",
                (long long)rs->t->params.max_steps);
}

void tj_value_enter(tj_render *rs) {
    if (++rs->vdepth > TJ_MAX_VALUE_DEPTH)
        tj_fail(rs, ST_ERR_LIMIT, "value nested too deeply (limit %d levels)", TJ_MAX_VALUE_DEPTH);
}

/* ==== Buffers with limits ==== */

void tj_put(tj_render *rs, tj_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t lim = rs->t->params.max_memory;
        if (b->len + n > lim)
            tj_fail(rs, ST_ERR_LIMIT, "template string size limit (%zu bytes) exceeded", lim);
        if (tj_buf_reserve(&rs->arena, b, n) != 0)
            tj_fail(rs, ST_ERR_LIMIT, "template memory limit (%zu bytes) exceeded", lim);
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void tj_putc(tj_render *rs, tj_buf *b, char c) { tj_put(rs, b, &c, 1); }
void tj_puts(tj_render *rs, tj_buf *b, const char *s) { tj_put(rs, b, s, strlen(s)); }

/* ==== Constructors ==== */

static tj_undef *undef_new(tj_render *rs, uint8_t how) {
    tj_undef *u = tj_alloc(rs, sizeof *u);
    memset(u, 0, sizeof *u);
    u->how = how;
    return u;
}

static tj_val undef_val(const tj_undef *u) {
    tj_val v = {.kind = TJ_UNDEF};
    v.as.u = u;
    return v;
}

tj_val tj_undef_name(tj_render *rs, const char *name) {
    tj_undef *u = undef_new(rs, TJ_U_NAME);
    u->name = name;
    return undef_val(u);
}

tj_val tj_undef_attr(tj_render *rs, tj_val obj, const char *name, size_t len) {
    tj_undef *u = undef_new(rs, TJ_U_ATTR);
    u->obj = obj;
    u->key = tj_strn(rs, name, len);
    return undef_val(u);
}

tj_val tj_undef_item(tj_render *rs, tj_val obj, tj_val key) {
    tj_undef *u = undef_new(rs, TJ_U_ITEM);
    u->obj = obj;
    u->key = key;
    return undef_val(u);
}

tj_val tj_undef_hint(tj_render *rs, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tj_undef *u = undef_new(rs, TJ_U_HINT);
    tj_val s = tj_str_cstr(rs, msg);
    u->name = s.as.s->data;
    return undef_val(u);
}

tj_val tj_undef_unsafe(tj_render *rs, tj_val obj, const char *name) {
    tj_val v = tj_undef_hint(rs, "access to attribute '%s' of '%s' object is unsafe.", name,
                             tj_type_name(obj));
    ((tj_undef *)v.as.u)->security = true;
    return v;
}

static const char *object_type_repr(tj_val v, char *buf, size_t cap) {
    switch (v.kind) {
    case TJ_NONE: return "None";
    case TJ_NS: return "jinja2.utils.Namespace object";
    case TJ_LOOP: return "jinja2.runtime.LoopContext object";
    case TJ_MACRO: return "jinja2.runtime.Macro object";
    case TJ_UNDEF: return "jinja2.runtime.Undefined object";
    case TJ_STR:
        if (v.flags & TJ_F_MARKUP) return "markupsafe.Markup object";
        break;
    default: break;
    }
    snprintf(buf, cap, "%s object", tj_type_name(v));
    return buf;
}

void tj_fail_undef(tj_render *rs, tj_val v) {
    const tj_undef *u = v.as.u;
    if (!u) tj_fail(rs, ST_ERR_ARG, "undefined value");
    char tb[64];
    tj_buf b = {0};
    switch (u->how) {
    case TJ_U_NAME:
        tj_repr_str(rs, &b, u->name, strlen(u->name));
        tj_puts(rs, &b, " is undefined");
        break;
    case TJ_U_HINT:
        tj_puts(rs, &b, u->name);
        break;
    default: {
        const char *otr = object_type_repr(u->obj, tb, sizeof tb);
        if (u->key.kind == TJ_STR) {
            tj_repr_str(rs, &b, otr, strlen(otr));
            tj_puts(rs, &b, " has no attribute ");
        } else {
            tj_puts(rs, &b, otr);
            tj_puts(rs, &b, " has no element ");
        }
        tj_repr_of(rs, &b, u->key);
        break;
    }
    }
    tj_fail(rs, ST_ERR_ARG, "%s", b.data ? b.data : "");
}

const tj_str *tj_str_const(tj_arena *a, const char *s, size_t len) {
    tj_str *r = tj_arena_alloc(a, sizeof *r + len + 1);
    if (!r) return NULL;
    r->len = len;
    r->ncp = st_utf8_count(s, len);
    if (len) memcpy(r->data, s, len);
    r->data[len] = '\0';
    return r;
}

tj_val tj_strn(tj_render *rs, const char *s, size_t len) {
    if (len > rs->t->params.max_memory)
        tj_fail(rs, ST_ERR_LIMIT, "template string size limit exceeded");
    tj_str *r = tj_alloc(rs, sizeof *r + len + 1);
    r->len = len;
    r->ncp = st_utf8_count(s, len);
    if (len) memcpy(r->data, s, len);
    r->data[len] = '\0';
    tj_work(rs, (int64_t)(len >> 6));
    return tj_strv(r);
}

tj_val tj_str_cstr(tj_render *rs, const char *s) { return tj_strn(rs, s, strlen(s)); }

tj_val tj_str_buf(tj_render *rs, tj_buf *b) {
    if (!b->data) return tj_strn(rs, "", 0);
    tj_str *r = (tj_str *)(b->data - offsetof(tj_str, data));
    r->len = b->len;
    r->ncp = st_utf8_count(b->data, b->len);
    r->data[r->len] = '\0';
    b->data = NULL;
    b->len = b->cap = 0;
    tj_work(rs, (int64_t)(r->len >> 6));
    return tj_strv(r);
}

tj_list *tj_list_new(tj_render *rs, int64_t len, uint8_t type) {
    if (len < 0 || (uint64_t)len > rs->t->params.max_memory / sizeof(tj_val))
        tj_fail(rs, ST_ERR_LIMIT, "template memory limit exceeded (list of %lld items)",
                (long long)len);
    tj_list *l = tj_alloc(rs, sizeof *l);
    memset(l, 0, sizeof *l);
    l->len = len;
    l->type = type;
    l->items = tj_alloc(rs, (size_t)(len ? len : 1) * sizeof(tj_val)); /* never NULL */
    memset(l->items, 0, (size_t)(len ? len : 1) * sizeof(tj_val));
    tj_work(rs, len >> 4);
    return l;
}

tj_val tj_listv(tj_list *l) {
    tj_val v = {.kind = TJ_LIST};
    v.as.l = l;
    return v;
}

tj_dict *tj_dict_new(tj_render *rs, int64_t cap) {
    tj_dict *d = tj_alloc(rs, sizeof *d);
    memset(d, 0, sizeof *d);
    if (cap < 4) cap = 4;
    d->cap = cap;
    d->keys = tj_alloc(rs, (size_t)cap * sizeof(tj_val));
    d->vals = tj_alloc(rs, (size_t)cap * sizeof(tj_val));
    return d;
}

tj_val tj_dictv(tj_dict *d) {
    tj_val v = {.kind = TJ_DICT};
    v.as.d = d;
    return v;
}

/* ==== Hashing and dicts ==== */

const char *tj_type_name(tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF: return "Undefined";
    case TJ_NONE: return "NoneType";
    case TJ_BOOL: return "bool";
    case TJ_INT: return "int";
    case TJ_FLOAT: return "float";
    case TJ_STR: return (v.flags & TJ_F_MARKUP) ? "Markup" : "str";
    case TJ_LIST:
        switch ((tj_list_type)v.as.l->type) {
        case TJ_L_LIST: return "list";
        case TJ_L_TUPLE: return "tuple";
        case TJ_L_GEN: return "generator";
        case TJ_L_RANGE: return "range";
        case TJ_L_ITEMS: return "dict_items";
        case TJ_L_KEYS: return "dict_keys";
        case TJ_L_VALUES: return "dict_values";
        case TJ_L_REVITER: return "list_reverseiterator";
        }
        return "list";
    case TJ_DICT: return "dict";
    case TJ_NS: return "Namespace";
    case TJ_MACRO: return "Macro";
    case TJ_FUNC: return "function";
    case TJ_METHOD: return "builtin_function_or_method";
    case TJ_LOOP: return "LoopContext";
    }
    return "object";
}

bool tj_is_hashable(tj_render *rs, tj_val v) {
    switch (v.kind) {
    case TJ_LIST: {
        if (v.as.l->type != TJ_L_TUPLE) return v.as.l->type == TJ_L_GEN ||
                                               v.as.l->type == TJ_L_RANGE ||
                                               v.as.l->type == TJ_L_REVITER;
        bool ok = true;
        tj_value_enter(rs);
        for (int64_t i = 0; i < v.as.l->len && ok; i++) ok = tj_is_hashable(rs, v.as.l->items[i]);
        tj_value_leave(rs);
        return ok;
    }
    case TJ_DICT: return false;
    default: return true;
    }
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_val(tj_render *rs, tj_val v) {
    switch (v.kind) {
    case TJ_STR: return st_hash_bytes(v.as.s->data, v.as.s->len);
    case TJ_BOOL:
    case TJ_INT: return mix64((uint64_t)v.as.i);
    case TJ_FLOAT: {
        double f = v.as.f;
        if (f == floor(f) && fabs(f) < 9.2e18) return mix64((uint64_t)(int64_t)f);
        uint64_t bits;
        memcpy(&bits, &f, 8);
        return mix64(bits ^ 0x5bd1e995);
    }
    case TJ_NONE: return 0x9e3779b97f4a7c15ULL;
    case TJ_LIST: {
        if (v.as.l->type != TJ_L_TUPLE) return mix64((uint64_t)(uintptr_t)v.as.l);
        uint64_t h = 0x345678;
        tj_value_enter(rs);
        for (int64_t i = 0; i < v.as.l->len; i++) h = mix64(h ^ hash_val(rs, v.as.l->items[i]));
        tj_value_leave(rs);
        return h;
    }
    default: return mix64((uint64_t)(uintptr_t)v.as.d);
    }
}

static void dict_reindex(tj_render *rs, tj_dict *d, uint32_t nslots) {
    d->slots = tj_alloc(rs, nslots * sizeof(int32_t));
    memset(d->slots, 0, nslots * sizeof(int32_t));
    d->nslots = nslots;
    for (int64_t i = 0; i < d->len; i++) {
        uint32_t h = (uint32_t)hash_val(rs, d->keys[i]) & (nslots - 1);
        while (d->slots[h]) h = (h + 1) & (nslots - 1);
        d->slots[h] = (int32_t)(i + 1);
    }
}

static int64_t dict_find(tj_render *rs, const tj_dict *d, tj_val key) {
    if (!d->slots) {
        for (int64_t i = 0; i < d->len; i++) {
            tj_val k = d->keys[i];
            if (key.kind == TJ_STR) {
                if (k.kind == TJ_STR && k.as.s->len == key.as.s->len &&
                    memcmp(k.as.s->data, key.as.s->data, k.as.s->len) == 0)
                    return i;
            } else if (tj_equal(rs, k, key)) {
                return i;
            }
        }
        return -1;
    }
    uint32_t h = (uint32_t)hash_val(rs, key) & (d->nslots - 1);
    while (d->slots[h]) {
        int64_t i = d->slots[h] - 1;
        if (tj_equal(rs, d->keys[i], key)) return i;
        h = (h + 1) & (d->nslots - 1);
    }
    return -1;
}

void tj_dict_set(tj_render *rs, tj_dict *d, tj_val key, tj_val val) {
    if (!tj_is_hashable(rs, key)) tj_fail(rs, ST_ERR_ARG, "unhashable type: '%s'", tj_type_name(key));
    int64_t i = dict_find(rs, d, key);
    if (i >= 0) {
        d->vals[i] = val;
        return;
    }
    if (d->len == d->cap) {
        int64_t ncap = d->cap * 2;
        tj_val *nk = tj_alloc(rs, (size_t)ncap * sizeof(tj_val));
        tj_val *nv = tj_alloc(rs, (size_t)ncap * sizeof(tj_val));
        memcpy(nk, d->keys, (size_t)d->len * sizeof(tj_val));
        memcpy(nv, d->vals, (size_t)d->len * sizeof(tj_val));
        d->keys = nk;
        d->vals = nv;
        d->cap = ncap;
    }
    d->keys[d->len] = key;
    d->vals[d->len] = val;
    d->len++;
    if (d->len > 8) {
        if (!d->slots || (uint64_t)d->len * 2 > d->nslots) {
            uint32_t ns = 32;
            while ((uint64_t)ns < (uint64_t)d->len * 4) ns *= 2;
            dict_reindex(rs, d, ns);
        } else {
            uint32_t h = (uint32_t)hash_val(rs, key) & (d->nslots - 1);
            while (d->slots[h]) h = (h + 1) & (d->nslots - 1);
            d->slots[h] = (int32_t)d->len;
        }
    }
}

tj_val *tj_dict_get(tj_render *rs, const tj_dict *d, tj_val key) {
    if (!tj_is_hashable(rs, key)) tj_fail(rs, ST_ERR_ARG, "unhashable type: '%s'", tj_type_name(key));
    int64_t i = dict_find(rs, d, key);
    return i >= 0 ? &d->vals[i] : NULL;
}

tj_val *tj_dict_get_str(const tj_dict *d, const char *s, size_t len) {
    if (d->slots) {
        uint32_t h = (uint32_t)st_hash_bytes(s, len) & (d->nslots - 1);
        while (d->slots[h]) {
            int64_t i = d->slots[h] - 1;
            tj_val k = d->keys[i];
            if (k.kind == TJ_STR && k.as.s->len == len && memcmp(k.as.s->data, s, len) == 0)
                return &d->vals[i];
            h = (h + 1) & (d->nslots - 1);
        }
        return NULL;
    }
    for (int64_t i = 0; i < d->len; i++) {
        tj_val k = d->keys[i];
        if (k.kind == TJ_STR && k.as.s->len == len && memcmp(k.as.s->data, s, len) == 0)
            return &d->vals[i];
    }
    return NULL;
}

/* ==== Truth, equality, ordering ==== */

bool tj_truthy(tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF:
    case TJ_NONE: return false;
    case TJ_BOOL:
    case TJ_INT: return v.as.i != 0;
    case TJ_FLOAT: return v.as.f != 0.0;
    case TJ_STR: return v.as.s->len != 0;
    case TJ_LIST:
        if (v.as.l->type == TJ_L_GEN || v.as.l->type == TJ_L_REVITER) return true;
        return v.as.l->len != 0;
    case TJ_DICT: return v.as.d->len != 0;
    default: return true;
    }
}

bool tj_equal(tj_render *rs, tj_val a, tj_val b) {
    if (tj_is_num(a) && tj_is_num(b)) {
        if (a.kind != TJ_FLOAT && b.kind != TJ_FLOAT) return a.as.i == b.as.i;
        return tj_num_f(a) == tj_num_f(b);
    }
    if (a.kind != b.kind) return false;
    switch ((tj_kind)a.kind) {
    case TJ_UNDEF:
    case TJ_NONE: return true;
    case TJ_STR:
        return a.as.s->len == b.as.s->len && memcmp(a.as.s->data, b.as.s->data, a.as.s->len) == 0;
    case TJ_LIST: {
        const tj_list *x = a.as.l, *y = b.as.l;
        if (x == y) return true;
        if (x->type != y->type) return false;
        if (x->type == TJ_L_GEN || x->type == TJ_L_REVITER) return false;
        if (x->len != y->len) return false;
        tj_work(rs, x->len);
        bool eq = true;
        tj_value_enter(rs);
        for (int64_t i = 0; i < x->len && eq; i++) eq = tj_equal(rs, x->items[i], y->items[i]);
        tj_value_leave(rs);
        return eq;
    }
    case TJ_DICT: {
        const tj_dict *x = a.as.d, *y = b.as.d;
        if (x == y) return true;
        if (x->len != y->len) return false;
        tj_work(rs, x->len);
        bool eq = true;
        tj_value_enter(rs);
        for (int64_t i = 0; i < x->len && eq; i++) {
            int64_t j = dict_find(rs, y, x->keys[i]);
            eq = j >= 0 && tj_equal(rs, x->vals[i], y->vals[j]);
        }
        tj_value_leave(rs);
        return eq;
    }
    case TJ_FUNC: return a.id == b.id;
    case TJ_METHOD:
        return a.as.bm->mid == b.as.bm->mid && tj_equal(rs, a.as.bm->self, b.as.bm->self);
    default: return a.as.d == b.as.d;
    }
}

static const char *cmp_sym(int op) {
    switch (op) {
    case TJ_CMP_LT: return "<";
    case TJ_CMP_LE: return "<=";
    case TJ_CMP_GT: return ">";
    default: return ">=";
    }
}

/* Python's rich comparison for < <= > >=. */
static bool cmp_order(tj_render *rs, int op, tj_val a, tj_val b) {
    if (a.kind == TJ_UNDEF) tj_fail_undef(rs, a);
    if (b.kind == TJ_UNDEF) tj_fail_undef(rs, b);
    if (tj_is_num(a) && tj_is_num(b)) {
        if (a.kind != TJ_FLOAT && b.kind != TJ_FLOAT) {
            int64_t x = a.as.i, y = b.as.i;
            switch (op) {
            case TJ_CMP_LT: return x < y;
            case TJ_CMP_LE: return x <= y;
            case TJ_CMP_GT: return x > y;
            default: return x >= y;
            }
        }
        double x = tj_num_f(a), y = tj_num_f(b);
        switch (op) {
        case TJ_CMP_LT: return x < y;
        case TJ_CMP_LE: return x <= y;
        case TJ_CMP_GT: return x > y;
        default: return x >= y;
        }
    }
    if (a.kind == TJ_STR && b.kind == TJ_STR) {
        size_t n = a.as.s->len < b.as.s->len ? a.as.s->len : b.as.s->len;
        int c = memcmp(a.as.s->data, b.as.s->data, n);
        if (c == 0) c = (a.as.s->len > b.as.s->len) - (a.as.s->len < b.as.s->len);
        switch (op) {
        case TJ_CMP_LT: return c < 0;
        case TJ_CMP_LE: return c <= 0;
        case TJ_CMP_GT: return c > 0;
        default: return c >= 0;
        }
    }
    if (a.kind == TJ_LIST && b.kind == TJ_LIST && a.as.l->type == b.as.l->type &&
        (a.as.l->type == TJ_L_LIST || a.as.l->type == TJ_L_TUPLE)) {
        const tj_list *x = a.as.l, *y = b.as.l;
        int64_t i = 0;
        while (i < x->len && i < y->len && tj_equal(rs, x->items[i], y->items[i])) i++;
        if (i < x->len && i < y->len) {
            tj_value_enter(rs);
            bool r = cmp_order(rs, op, x->items[i], y->items[i]);
            tj_value_leave(rs);
            return r;
        }
        switch (op) {
        case TJ_CMP_LT: return x->len < y->len;
        case TJ_CMP_LE: return x->len <= y->len;
        case TJ_CMP_GT: return x->len > y->len;
        default: return x->len >= y->len;
        }
    }
    tj_fail(rs, ST_ERR_ARG, "'%s' not supported between instances of '%s' and '%s'", cmp_sym(op),
            tj_type_name(a), tj_type_name(b));
}

int tj_compare(tj_render *rs, tj_val a, tj_val b) {
    if (cmp_order(rs, TJ_CMP_LT, a, b)) return -1;
    if (cmp_order(rs, TJ_CMP_LT, b, a)) return 1;
    return 0;
}

bool tj_cmp(tj_render *rs, int op, tj_val a, tj_val b) {
    switch (op) {
    case TJ_CMP_EQ: return tj_equal(rs, a, b);
    case TJ_CMP_NE: return !tj_equal(rs, a, b);
    case TJ_CMP_IN: return tj_contains(rs, b, a);
    case TJ_CMP_NOTIN: return !tj_contains(rs, b, a);
    default: return cmp_order(rs, op, a, b);
    }
}

/* ==== str() and repr() ==== */

void tj_repr_str(tj_render *rs, tj_buf *b, const char *s, size_t len) {
    bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tj_putc(rs, b, q);
    size_t i = 0, run = 0;
    while (i < len) {
        size_t start = i;
        uint32_t c = tj_utf8_next(s, len, &i);
        char esc[16];
        const char *e = NULL;
        if (c == (uint32_t)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = 0;
            e = esc;
        } else if (c == '\t') e = "\\t";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            e = esc;
        } else if (c >= 0x80 && !tj_py_isprintable(c)) {
            if (c <= 0xff) snprintf(esc, sizeof esc, "\\x%02x", c);
            else if (c <= 0xffff) snprintf(esc, sizeof esc, "\\u%04x", c);
            else snprintf(esc, sizeof esc, "\\U%08x", c);
            e = esc;
        }
        if (e) {
            if (run) tj_put(rs, b, s + start - run, run);
            run = 0;
            tj_puts(rs, b, e);
        } else {
            run += i - start;
        }
    }
    if (run) tj_put(rs, b, s + len - run, run);
    tj_putc(rs, b, q);
}

static void put_int(tj_render *rs, tj_buf *b, int64_t i) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)i);
    tj_puts(rs, b, t);
}

static void repr_seq(tj_render *rs, tj_buf *b, const tj_list *l, const char *open,
                     const char *close) {
    tj_puts(rs, b, open);
    for (int64_t i = 0; i < l->len; i++) {
        if (i) tj_puts(rs, b, ", ");
        tj_repr_of(rs, b, l->items[i]);
    }
    tj_puts(rs, b, close);
}

static void repr_dict(tj_render *rs, tj_buf *b, const tj_dict *d) {
    tj_putc(rs, b, '{');
    for (int64_t i = 0; i < d->len; i++) {
        if (i) tj_puts(rs, b, ", ");
        tj_repr_of(rs, b, d->keys[i]);
        tj_puts(rs, b, ": ");
        tj_repr_of(rs, b, d->vals[i]);
    }
    tj_putc(rs, b, '}');
}

void tj_repr_of(tj_render *rs, tj_buf *b, tj_val v) {
    tj_value_enter(rs);
    tj_work(rs, 1);
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF: tj_puts(rs, b, "Undefined"); break;
    case TJ_STR:
        if (v.flags & TJ_F_MARKUP) {
            tj_puts(rs, b, "Markup(");
            tj_repr_str(rs, b, v.as.s->data, v.as.s->len);
            tj_putc(rs, b, ')');
        } else {
            tj_repr_str(rs, b, v.as.s->data, v.as.s->len);
        }
        break;
    case TJ_LIST: {
        const tj_list *l = v.as.l;
        switch ((tj_list_type)l->type) {
        case TJ_L_LIST: repr_seq(rs, b, l, "[", "]"); break;
        case TJ_L_TUPLE:
            if (l->len == 1) {
                tj_putc(rs, b, '(');
                tj_repr_of(rs, b, l->items[0]);
                tj_puts(rs, b, ",)");
            } else {
                repr_seq(rs, b, l, "(", ")");
            }
            break;
        case TJ_L_RANGE: {
            char t[96];
            if (l->r_step == 1)
                snprintf(t, sizeof t, "range(%lld, %lld)", (long long)l->r_start,
                         (long long)l->r_stop);
            else
                snprintf(t, sizeof t, "range(%lld, %lld, %lld)", (long long)l->r_start,
                         (long long)l->r_stop, (long long)l->r_step);
            tj_puts(rs, b, t);
            break;
        }
        case TJ_L_ITEMS: repr_seq(rs, b, l, "dict_items([", "])"); break;
        case TJ_L_KEYS: repr_seq(rs, b, l, "dict_keys([", "])"); break;
        case TJ_L_VALUES: repr_seq(rs, b, l, "dict_values([", "])"); break;
        /* Python prints an address here; a fixed one keeps the text's shape */
        case TJ_L_GEN:
            tj_puts(rs, b, "<generator object ");
            tj_puts(rs, b, l->pyname ? l->pyname : "genexpr");
            tj_puts(rs, b, " at 0x7f0000000000>");
            break;
        case TJ_L_REVITER:
            tj_putc(rs, b, '<');
            tj_puts(rs, b, l->pyname ? l->pyname : "list_reverseiterator");
            tj_puts(rs, b, " object at 0x7f0000000000>");
            break;
        }
        break;
    }
    case TJ_DICT: repr_dict(rs, b, v.as.d); break;
    case TJ_NS:
        tj_puts(rs, b, "<Namespace ");
        repr_dict(rs, b, v.as.ns->attrs);
        tj_putc(rs, b, '>');
        break;
    case TJ_MACRO: {
        const tj_node *m = v.as.m->def;
        tj_puts(rs, b, "<Macro ");
        const char *nm = rs->t->syms[m->sym];
        tj_repr_str(rs, b, nm, strlen(nm));
        tj_putc(rs, b, '>');
        break;
    }
    case TJ_LOOP: {
        char t[80];
        snprintf(t, sizeof t, "<LoopContext %lld/%lld>", (long long)v.as.loop->index0 + 1,
                 (long long)v.as.loop->items->len);
        tj_puts(rs, b, t);
        break;
    }
    case TJ_FUNC: tj_puts(rs, b, "<function>"); break;
    case TJ_METHOD: tj_puts(rs, b, "<built-in method>"); break;
    default: tj_str_of(rs, b, v); break;
    }
    tj_value_leave(rs);
}

void tj_str_of(tj_render *rs, tj_buf *b, tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF: break;
    case TJ_NONE: tj_puts(rs, b, "None"); break;
    case TJ_BOOL: tj_puts(rs, b, v.as.i ? "True" : "False"); break;
    case TJ_INT: put_int(rs, b, v.as.i); break;
    case TJ_FLOAT: {
        char t[40];
        tj_float_repr(v.as.f, t);
        tj_puts(rs, b, t);
        break;
    }
    case TJ_STR: tj_put(rs, b, v.as.s->data, v.as.s->len); break;
    default: tj_repr_of(rs, b, v); break;
    }
}

tj_val tj_to_str(tj_render *rs, tj_val v) {
    if (v.kind == TJ_STR) return v;
    tj_buf b = {0};
    tj_str_of(rs, &b, v);
    return tj_str_buf(rs, &b);
}

void tj_html_escape(tj_render *rs, tj_buf *b, const char *s, size_t len) {
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        const char *e = NULL;
        switch (s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        default: run++; continue;
        }
        if (run) tj_put(rs, b, s + i - run, run);
        run = 0;
        tj_puts(rs, b, e);
    }
    if (run) tj_put(rs, b, s + len - run, run);
}

/* ==== Iteration, len, in ==== */

static tj_val no_items[1];
static const tj_list empty_list = {.len = 0, .items = no_items};

const tj_list *tj_iterate(tj_render *rs, tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF: return &empty_list;
    case TJ_LIST:
        if (v.as.l->type == TJ_L_GEN || v.as.l->type == TJ_L_REVITER) {
            if (v.as.l->consumed) return &empty_list;
            if (v.as.l->thunk) tj_gen_force(rs, v.as.l); /* may fail: the deferred error */
            v.as.l->consumed = 1;
        }
        return v.as.l;
    case TJ_DICT: {
        tj_list *l = tj_list_new(rs, v.as.d->len, TJ_L_LIST);
        memcpy(l->items, v.as.d->keys, (size_t)v.as.d->len * sizeof(tj_val));
        return l;
    }
    case TJ_STR: {
        const tj_str *s = v.as.s;
        tj_list *l = tj_list_new(rs, (int64_t)s->ncp, TJ_L_LIST);
        size_t i = 0;
        for (int64_t k = 0; k < l->len; k++) {
            size_t st = i;
            tj_utf8_next(s->data, s->len, &i);
            l->items[k] = tj_strn(rs, s->data + st, i - st);
        }
        return l;
    }
    default:
        tj_fail(rs, ST_ERR_ARG, "'%s' object is not iterable", tj_type_name(v));
    }
}

int64_t tj_len(tj_render *rs, tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_UNDEF: return 0;
    case TJ_STR: return (int64_t)v.as.s->ncp;
    case TJ_LIST:
        if (v.as.l->type == TJ_L_GEN || v.as.l->type == TJ_L_REVITER) break;
        return v.as.l->len;
    case TJ_DICT: return v.as.d->len;
    case TJ_LOOP: return v.as.loop->items->len;
    default: break;
    }
    tj_fail(rs, ST_ERR_ARG, "object of type '%s' has no len()", tj_type_name(v));
}

bool tj_contains(tj_render *rs, tj_val c, tj_val x) {
    switch ((tj_kind)c.kind) {
    case TJ_UNDEF: return false;
    case TJ_STR:
        if (x.kind != TJ_STR)
            tj_fail(rs, ST_ERR_ARG, "'in <string>' requires string as left operand, not %s",
                    tj_type_name(x));
        if (x.as.s->len == 0) return true;
        tj_work(rs, (int64_t)(c.as.s->len >> 4));
        return memmem(c.as.s->data, c.as.s->len, x.as.s->data, x.as.s->len) != NULL;
    case TJ_LIST: {
        const tj_list *l = tj_iterate(rs, c);
        tj_work(rs, l->len);
        for (int64_t i = 0; i < l->len; i++)
            if (tj_equal(rs, l->items[i], x)) return true;
        return false;
    }
    case TJ_DICT:
        if (!tj_is_hashable(rs, x)) tj_fail(rs, ST_ERR_ARG, "unhashable type: '%s'", tj_type_name(x));
        return tj_dict_get(rs, c.as.d, x) != NULL;
    default:
        tj_fail(rs, ST_ERR_ARG, "argument of type '%s' is not iterable", tj_type_name(c));
    }
}

/* ==== Arithmetic ==== */

static const char *op_sym(int op) {
    switch (op) {
    case TJ_OP_ADD: return "+";
    case TJ_OP_SUB: return "-";
    case TJ_OP_MUL: return "*";
    case TJ_OP_DIV: return "/";
    case TJ_OP_FLOORDIV: return "//";
    case TJ_OP_MOD: return "%";
    default: return "** or pow()";
    }
}

_Noreturn static void bad_operands(tj_render *rs, int op, tj_val a, tj_val b) {
    tj_fail(rs, ST_ERR_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
            tj_type_name(a), tj_type_name(b));
}

_Noreturn static void overflow(tj_render *rs) {
    tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow (integers beyond 64 bits are not supported)");
}

static tj_val repeat_seq(tj_render *rs, tj_val seq, int64_t n) {
    if (n < 0) n = 0;
    int64_t len = seq.kind == TJ_STR ? (int64_t)seq.as.s->len : seq.as.l->len;
    if (len == 0) n = 0; /* '' * 10**12 is '' at once */
    tj_work(rs, n);
    if (seq.kind == TJ_STR) {
        const tj_str *s = seq.as.s;
        if (s->len && (uint64_t)n > rs->t->params.max_memory / s->len)
            tj_fail(rs, ST_ERR_LIMIT, "template string size limit exceeded");
        tj_buf b = {0};
        for (int64_t i = 0; i < n; i++) tj_put(rs, &b, s->data, s->len);
        tj_val r = tj_str_buf(rs, &b);
        r.flags = seq.flags;
        return r;
    }
    const tj_list *l = seq.as.l;
    if (l->len && (uint64_t)n > rs->t->params.max_memory / sizeof(tj_val) / (uint64_t)l->len)
        tj_fail(rs, ST_ERR_LIMIT, "template memory limit exceeded");
    tj_list *r = tj_list_new(rs, l->len * n, l->type);
    for (int64_t i = 0; i < n; i++)
        memcpy(r->items + i * l->len, l->items, (size_t)l->len * sizeof(tj_val));
    return tj_listv(r);
}

static tj_val concat_str(tj_render *rs, tj_val a, tj_val b) {
    bool ma = a.flags & TJ_F_MARKUP, mb = b.flags & TJ_F_MARKUP;
    tj_buf o = {0};
    if (mb && !ma) tj_html_escape(rs, &o, a.as.s->data, a.as.s->len);
    else tj_put(rs, &o, a.as.s->data, a.as.s->len);
    if (ma && !mb) tj_html_escape(rs, &o, b.as.s->data, b.as.s->len);
    else tj_put(rs, &o, b.as.s->data, b.as.s->len);
    tj_val r = tj_str_buf(rs, &o);
    if (ma || mb) r.flags |= TJ_F_MARKUP;
    return r;
}

static double py_fmod(double x, double y) {
    double m = fmod(x, y);
    if (m != 0) {
        if ((y < 0) != (m < 0)) m += y;
    } else {
        m = copysign(0.0, y);
    }
    return m;
}

static double py_floordiv(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    double fd;
    if (div != 0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    return fd;
}

static int64_t ipow(tj_render *rs, int64_t base, int64_t e) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1)
            if (__builtin_mul_overflow(r, base, &r)) overflow(rs);
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) overflow(rs);
    }
    return r;
}

tj_val tj_arith(tj_render *rs, int op, tj_val a, tj_val b) {
    /* str % x runs str.__mod__ first: an Undefined argument is just a (mapping) value */
    if (op == TJ_OP_MOD && a.kind == TJ_STR) return tj_percent_format(rs, a.as.s, b);
    if (a.kind == TJ_UNDEF) tj_fail_undef(rs, a);
    if (b.kind == TJ_UNDEF) tj_fail_undef(rs, b);
    bool ints = tj_is_intlike(a) && tj_is_intlike(b);
    bool nums = tj_is_num(a) && tj_is_num(b);
    switch (op) {
    case TJ_OP_ADD:
        if (ints) {
            int64_t r;
            if (__builtin_add_overflow(a.as.i, b.as.i, &r)) overflow(rs);
            return tj_int(r);
        }
        if (nums) return tj_float(tj_num_f(a) + tj_num_f(b));
        if (a.kind == TJ_STR && b.kind == TJ_STR) return concat_str(rs, a, b);
        if (a.kind == TJ_STR && !(a.flags & TJ_F_MARKUP))
            tj_fail(rs, ST_ERR_ARG, "can only concatenate str (not \"%s\") to str",
                    tj_type_name(b));
        if (a.kind == TJ_LIST && b.kind == TJ_LIST &&
            (a.as.l->type == TJ_L_LIST || a.as.l->type == TJ_L_TUPLE)) {
            if (a.as.l->type != b.as.l->type)
                tj_fail(rs, ST_ERR_ARG, "can only concatenate %s (not \"%s\") to %s",
                        tj_type_name(a), tj_type_name(b), tj_type_name(a));
            tj_list *r = tj_list_new(rs, a.as.l->len + b.as.l->len, a.as.l->type);
            if (a.as.l->len) memcpy(r->items, a.as.l->items, (size_t)a.as.l->len * sizeof(tj_val));
            if (b.as.l->len)
                memcpy(r->items + a.as.l->len, b.as.l->items, (size_t)b.as.l->len * sizeof(tj_val));
            return tj_listv(r);
        }
        if (a.kind == TJ_LIST && (a.as.l->type == TJ_L_LIST || a.as.l->type == TJ_L_TUPLE))
            tj_fail(rs, ST_ERR_ARG, "can only concatenate %s (not \"%s\") to %s",
                    tj_type_name(a), tj_type_name(b), tj_type_name(a));
        bad_operands(rs, op, a, b);
    case TJ_OP_SUB:
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(a.as.i, b.as.i, &r)) overflow(rs);
            return tj_int(r);
        }
        if (nums) return tj_float(tj_num_f(a) - tj_num_f(b));
        bad_operands(rs, op, a, b);
    case TJ_OP_MUL:
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(a.as.i, b.as.i, &r)) overflow(rs);
            return tj_int(r);
        }
        if (nums) return tj_float(tj_num_f(a) * tj_num_f(b));
        {
            tj_val seq = a, n = b;
            if (tj_is_intlike(a)) {
                seq = b;
                n = a;
            }
            bool is_seq = seq.kind == TJ_STR ||
                          (seq.kind == TJ_LIST &&
                           (seq.as.l->type == TJ_L_LIST || seq.as.l->type == TJ_L_TUPLE));
            if (is_seq && tj_is_intlike(n)) return repeat_seq(rs, seq, n.as.i);
            if (is_seq)
                tj_fail(rs, ST_ERR_ARG, "can't multiply sequence by non-int of type '%s'",
                        tj_type_name(n));
        }
        bad_operands(rs, op, a, b);
    case TJ_OP_DIV:
        if (nums) {
            if (tj_num_f(b) == 0) tj_fail(rs, ST_ERR_ARG, "division by zero");
            return tj_float(tj_num_f(a) / tj_num_f(b));
        }
        bad_operands(rs, op, a, b);
    case TJ_OP_FLOORDIV:
        if (ints) {
            if (b.as.i == 0) tj_fail(rs, ST_ERR_ARG, "integer division or modulo by zero");
            if (a.as.i == INT64_MIN && b.as.i == -1) overflow(rs);
            int64_t q = a.as.i / b.as.i;
            if ((a.as.i % b.as.i != 0) && ((a.as.i < 0) != (b.as.i < 0))) q--;
            return tj_int(q);
        }
        if (nums) {
            if (tj_num_f(b) == 0) tj_fail(rs, ST_ERR_ARG, "float floor division by zero");
            return tj_float(py_floordiv(tj_num_f(a), tj_num_f(b)));
        }
        bad_operands(rs, op, a, b);
    case TJ_OP_MOD:
        if (a.kind == TJ_STR) return tj_percent_format(rs, a.as.s, b);
        if (ints) {
            if (b.as.i == 0) tj_fail(rs, ST_ERR_ARG, "integer division or modulo by zero");
            if (b.as.i == -1) return tj_int(0);
            int64_t m = a.as.i % b.as.i;
            if (m != 0 && ((m < 0) != (b.as.i < 0))) m += b.as.i;
            return tj_int(m);
        }
        if (nums) {
            if (tj_num_f(b) == 0) tj_fail(rs, ST_ERR_ARG, "float modulo");
            return tj_float(py_fmod(tj_num_f(a), tj_num_f(b)));
        }
        bad_operands(rs, op, a, b);
    case TJ_OP_POW:
        if (ints && b.as.i >= 0) return tj_int(ipow(rs, a.as.i, b.as.i));
        if (nums) {
            double x = tj_num_f(a), y = tj_num_f(b);
            if (x == 0 && y < 0)
                tj_fail(rs, ST_ERR_ARG, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                tj_fail(rs, ST_ERR_UNSUPPORTED, "complex numbers are not supported");
            double r = pow(x, y);
            if (isinf(r) && !isinf(x) && !isinf(y))
                tj_fail(rs, ST_ERR_ARG, "(34, 'Numerical result out of range')");
            return tj_float(r);
        }
        bad_operands(rs, op, a, b);
    default:
        ST_ASSERT(!"unknown arithmetic operator");
    }
    bad_operands(rs, op, a, b);
}
