/* ==== Template evaluator: statements, expressions, scopes, macros, loops ====
 *
 * Walks the AST with jinja2's runtime behaviour:
 *   - scopes: the render context, then the template's top level; a for loop body gets a
 *     fresh scope each iteration (assignments inside do not leak out, nor into the next
 *     iteration); if/elif/else share the enclosing scope; macros, with, set-blocks and
 *     filter blocks get their own; namespace() objects carry state across scopes;
 *   - attribute and item access follow the sandbox: `x.key` finds dict methods first
 *     (items, get, ...) then keys; `x['key']` finds keys first then methods; mutating methods
 *     of list and dict are "unsafe" (an error when called); a miss gives Undefined;
 *   - macros bind positional, keyword and default arguments (defaults evaluated at call
 *     time, in the macro's scope), collect extras into varargs/kwargs only when the body
 *     uses those names, and return their output as a string;
 *   - loop.* (index, first, last, length, previtem, nextitem, cycle, changed, depth...),
 *     break/continue, for-else, the inline filter `for x in xs if cond`, recursive loops;
 *   - names a frame assigns before reading start "missing" (scope.c); runtime errors report
 *     the line of the statement's top-level expression, as jinja2's tracebacks do;
 *   - slices are plain Python subscripts (errors surface) except in literal expressions
 *     jinja2 folds while compiling.
 * Every node counts towards the work limit; nesting, macro depth, loop iterations, output
 * and memory are bounded (st_tmpl_params).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"

enum { EX_OK = 0, EX_BREAK = 1, EX_CONTINUE = 2 };

/* Nested eval/exec frames in one render (about 350 bytes of stack each at -O2). */
#define TJ_MAX_EVAL_DEPTH 3000

static tj_val eval(tj_render *rs, const tj_node *n, tj_scope *sc);
static int exec(tj_render *rs, const tj_node *n, tj_scope *sc);

/* ==== Scopes ==== */

static tj_scope *scope_new(tj_render *rs, tj_scope *parent) {
    tj_scope *s = tj_alloc(rs, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(tj_render *rs, tj_scope *s, int32_t sym, tj_val v) {
    for (int32_t i = 0; i < s->n; i++) {
        if (s->syms[i] == sym) {
            s->vals[i] = v;
            return;
        }
    }
    if (s->n == s->cap) {
        int32_t nc = s->cap ? s->cap * 2 : 4;
        int32_t *ns = tj_alloc(rs, (size_t)nc * sizeof *ns);
        tj_val *nv = tj_alloc(rs, (size_t)nc * sizeof *nv);
        if (s->n) {
            memcpy(ns, s->syms, (size_t)s->n * sizeof *ns);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->syms = ns;
        s->vals = nv;
        s->cap = nc;
    }
    s->syms[s->n] = sym;
    s->vals[s->n] = v;
    s->n++;
}

static tj_val *scope_find(tj_scope *s, int32_t sym) {
    for (; s; s = s->parent)
        for (int32_t i = s->n - 1; i >= 0; i--)
            if (s->syms[i] == sym) return &s->vals[i];
    return NULL;
}

/* A name jinja2 compiles as a frame local that is not assigned yet (see scope.c). */
static const tj_val missing_marker = {.kind = TJ_UNDEF, .id = 0xfffe};

static bool is_missing(tj_val v) { return v.kind == TJ_UNDEF && v.id == 0xfffe; }

/* Bind a frame's not-yet-assigned locals when the frame starts. */
static void bind_missing(tj_render *rs, tj_scope *sc, const tj_node *body) {
    for (int32_t i = 0; i < body->nmissing; i++) scope_set(rs, sc, body->missing[i], missing_marker);
}

static tj_val lookup(tj_render *rs, tj_scope *sc, int32_t sym) {
    tj_val *v = scope_find(sc, sym);
    if (v) return is_missing(*v) ? tj_undef_name(rs, rs->t->syms[sym]) : *v;
    tj_val f = {.kind = TJ_FUNC};
    switch (sym) {
    case TJ_SYM_RANGE: f.id = TJ_FN_RANGE; return f;
    case TJ_SYM_DICT: f.id = TJ_FN_DICT; return f;
    case TJ_SYM_NAMESPACE: f.id = TJ_FN_NAMESPACE; return f;
    case TJ_SYM_RAISE: f.id = TJ_FN_RAISE; return f;
    case TJ_SYM_STRFTIME: f.id = TJ_FN_STRFTIME; return f;
    case TJ_SYM_LIPSUM: f.id = TJ_FN_LIPSUM; return f;
    case TJ_SYM_CYCLER: f.id = TJ_FN_CYCLER; return f;
    case TJ_SYM_JOINER: f.id = TJ_FN_JOINER; return f;
    default: break;
    }
    return tj_undef_name(rs, rs->t->syms[sym]);
}

/* ==== Output ==== */

static tj_buf *out_buf(tj_render *rs) { return &rs->bufs[rs->nbufs - 1]; }

static void check_out(tj_render *rs, const tj_buf *b) {
    if (b->len > rs->t->params.max_output)
        tj_fail(rs, ST_ERR_LIMIT, "template output limit (%zu bytes) exceeded",
                rs->t->params.max_output);
}

static void emit(tj_render *rs, const char *s, size_t n) {
    tj_buf *b = out_buf(rs);
    if (b->len + n > rs->t->params.max_output)
        tj_fail(rs, ST_ERR_LIMIT, "template output limit (%zu bytes) exceeded",
                rs->t->params.max_output);
    tj_put(rs, b, s, n);
}

void tj_capture_begin(tj_render *rs) {
    if (rs->nbufs >= TJ_MAX_BUFS) tj_fail(rs, ST_ERR_LIMIT, "template nested too deeply");
    tj_buf *b = &rs->bufs[rs->nbufs++];
    memset(b, 0, sizeof *b);
}

tj_val tj_capture_end(tj_render *rs) {
    ST_ASSERT(rs->nbufs > 1);
    tj_buf *b = &rs->bufs[--rs->nbufs];
    return tj_str_buf(rs, b);
}

/* ==== Attribute and item access ==== */

static tj_val loop_attr(tj_render *rs, tj_val lv, const char *name, size_t len, bool *found) {
    const tj_loop *lp = lv.as.loop;
    int64_t i = lp->index0, n = lp->items->len;
    *found = true;
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
    if (IS("index")) return tj_int(i + 1);
    if (IS("index0")) return tj_int(i);
    if (IS("revindex")) return tj_int(n - i);
    if (IS("revindex0")) return tj_int(n - i - 1);
    if (IS("first")) return tj_bool(i == 0);
    if (IS("last")) return tj_bool(i == n - 1);
    if (IS("length")) return tj_int(n);
    if (IS("depth")) return tj_int(lp->depth0 + 1);
    if (IS("depth0")) return tj_int(lp->depth0);
    if (IS("previtem"))
        return i > 0 ? lp->items->items[i - 1] : tj_undef_hint(rs, "there is no previous item");
    if (IS("nextitem"))
        return i + 1 < n ? lp->items->items[i + 1] : tj_undef_hint(rs, "there is no next item");
#undef IS
    tj_val m;
    if (tj_method_lookup(rs, lv, name, len, &m)) return m;
    *found = false;
    return tj_undef_plain();
}

tj_val tj_getattr(tj_render *rs, tj_val obj, const char *name, size_t len) {
    tj_val m;
    switch ((tj_kind)obj.kind) {
    case TJ_UNDEF: tj_fail_undef(rs, obj);
    case TJ_DICT: {
        if (tj_method_lookup(rs, obj, name, len, &m)) return m;
        tj_val *v = tj_dict_get_str(obj.as.d, name, len);
        if (v) return *v;
        break;
    }
    case TJ_NS: {
        tj_val *v = tj_dict_get_str(obj.as.ns->attrs, name, len);
        if (v) return *v;
        break;
    }
    case TJ_LOOP: {
        bool found;
        tj_val v = loop_attr(rs, obj, name, len, &found);
        if (found) return v;
        break;
    }
    case TJ_MACRO: {
        const tj_node *d = obj.as.m->def;
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
        if (IS("name")) return tj_strv(rs->t->sym_strs[d->sym]);
        if (IS("arguments")) {
            tj_list *l = tj_list_new(rs, d->nkw, TJ_L_TUPLE);
            for (int i = 0; i < d->nkw; i++) l->items[i] = tj_strv(rs->t->sym_strs[d->kwsyms[i]]);
            return tj_listv(l);
        }
        if (IS("catch_varargs")) return tj_bool(d->op & 1);
        if (IS("catch_kwargs")) return tj_bool(d->op & 2);
        if (IS("caller")) return tj_bool(false);
        break;
    }
    case TJ_INT:
    case TJ_BOOL:
    case TJ_FLOAT:
        if (IS("real")) return obj.kind == TJ_FLOAT ? obj : tj_int(obj.as.i);
        if (IS("imag")) return obj.kind == TJ_FLOAT ? tj_float(0.0) : tj_int(0);
#undef IS
        break;
    default:
        if (tj_method_lookup(rs, obj, name, len, &m)) return m;
        break;
    }
    return tj_undef_attr(rs, obj, name, len);
}

static bool indexable(tj_val v) {
    return v.kind == TJ_STR ||
           (v.kind == TJ_LIST && (v.as.l->type == TJ_L_LIST || v.as.l->type == TJ_L_TUPLE ||
                                  v.as.l->type == TJ_L_RANGE));
}

tj_val tj_getitem(tj_render *rs, tj_val obj, tj_val key) {
    if (obj.kind == TJ_UNDEF) tj_fail_undef(rs, obj);
    if (obj.kind == TJ_DICT) {
        if (tj_is_hashable(rs, key)) {
            tj_val *v = tj_dict_get(rs, obj.as.d, key);
            if (v) return *v;
        }
    } else if (indexable(obj) && tj_is_intlike(key)) {
        int64_t n = obj.kind == TJ_STR ? (int64_t)obj.as.s->ncp : obj.as.l->len;
        int64_t i = key.as.i;
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
            if (obj.kind != TJ_STR) return obj.as.l->items[i];
            const tj_str *s = obj.as.s;
            if (s->ncp == s->len) return tj_strn(rs, s->data + i, 1);
            size_t off = tj_utf8_offset(s->data, s->len, (size_t)i), e = off;
            tj_utf8_next(s->data, s->len, &e);
            return tj_strn(rs, s->data + off, e - off);
        }
        return tj_undef_item(rs, obj, key);
    } else if (obj.kind == TJ_NS && key.kind == TJ_STR) {
        return tj_getattr(rs, obj, key.as.s->data, key.as.s->len);
    }
    if (key.kind == TJ_STR) {
        tj_val m;
        if (obj.kind == TJ_LOOP) return tj_getattr(rs, obj, key.as.s->data, key.as.s->len);
        if (tj_method_lookup(rs, obj, key.as.s->data, key.as.s->len, &m)) return m;
    }
    return tj_undef_item(rs, obj, key);
}

/* Python's PySlice_AdjustIndices; returns the element count. */
static int64_t slice_adjust(int64_t len, bool has_start, int64_t start, bool has_stop,
                            int64_t stop, int64_t step, int64_t *ostart) {
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
    if (!has_start) start = step > 0 ? lower : upper;
    else if (start < 0) {
        start += len;
        if (start < lower) start = lower;
    } else if (start > upper) start = upper;
    if (!has_stop) stop = step > 0 ? upper : lower;
    else if (stop < 0) {
        stop += len;
        if (stop < lower) stop = lower;
    } else if (stop > upper) stop = upper;
    *ostart = start;
    if (step > 0) return stop > start ? (stop - start - 1) / step + 1 : 0;
    return start > stop ? (start - stop - 1) / (-step) + 1 : 0;
}

/* x[a:b:c]. jinja2 compiles slices to a plain Python subscript (bypassing the sandbox's
 * getitem), so type errors surface; only print items it folds while compiling get the
 * sandbox's "undefined instead of TypeError". */
static tj_val do_slice(tj_render *rs, tj_val obj, const tj_node *sl, tj_scope *sc) {
    tj_val a[3];
    bool has[3];
    const tj_node *parts[3] = {sl->a, sl->b, sl->c};
    for (int i = 0; i < 3; i++) {
        a[i] = parts[i] ? eval(rs, parts[i], sc) : tj_none();
        has[i] = a[i].kind != TJ_NONE;
    }
    bool folded = rs->const_fold;
    if (obj.kind == TJ_UNDEF) tj_fail_undef(rs, obj);
    for (int i = 0; i < 3; i++) {
        if (has[i] && !tj_is_intlike(a[i])) {
            if (folded) return tj_undef_hint(rs, "invalid slice");
            if (indexable(obj))
                tj_fail(rs, ST_ERR_ARG,
                        "slice indices must be integers or None or have an __index__ method");
            break;
        }
    }
    if (!indexable(obj)) {
        if (folded) return tj_undef_hint(rs, "'%s' object is not subscriptable", tj_type_name(obj));
        if (obj.kind == TJ_DICT) tj_fail(rs, ST_ERR_ARG, "unhashable type: 'slice'");
        tj_fail(rs, ST_ERR_ARG, "'%s' object is not subscriptable", tj_type_name(obj));
    }
    int64_t step = has[2] ? a[2].as.i : 1;
    if (step == 0) tj_fail(rs, ST_ERR_ARG, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int64_t len = obj.kind == TJ_STR ? (int64_t)obj.as.s->ncp : obj.as.l->len;
    int64_t start;
    int64_t cnt = slice_adjust(len, has[0], has[0] ? a[0].as.i : 0, has[1],
                               has[1] ? a[1].as.i : 0, step, &start);
    tj_work(rs, cnt);
    if (obj.kind == TJ_STR) {
        const tj_str *s = obj.as.s;
        if (step == 1) {
            size_t o = s->ncp == s->len ? (size_t)start : tj_utf8_offset(s->data, s->len, (size_t)start);
            size_t e = s->ncp == s->len ? (size_t)(start + cnt)
                                        : o + tj_utf8_offset(s->data + o, s->len - o, (size_t)cnt);
            return tj_strn(rs, s->data + o, e - o);
        }
        tj_buf b = {0};
        if (s->ncp == s->len) {
            for (int64_t k = 0, i = start; k < cnt; k++, i += step) tj_put(rs, &b, s->data + i, 1);
        } else {
            size_t *offs = tj_alloc(rs, (s->ncp + 1) * sizeof(size_t));
            size_t p = 0;
            for (size_t k = 0; k <= s->ncp; k++) {
                offs[k] = p;
                if (p < s->len) tj_utf8_next(s->data, s->len, &p);
            }
            for (int64_t k = 0, i = start; k < cnt; k++, i += step)
                tj_put(rs, &b, s->data + offs[i], offs[i + 1] - offs[i]);
        }
        return tj_str_buf(rs, &b);
    }
    const tj_list *l = obj.as.l;
    tj_list *r = tj_list_new(rs, cnt, l->type);
    for (int64_t k = 0, i = start; k < cnt; k++, i += step) r->items[k] = l->items[i];
    if (l->type == TJ_L_RANGE) {
        r->r_start = l->r_start + start * l->r_step;
        r->r_step = l->r_step * step;
        r->r_stop = r->r_start + cnt * r->r_step;
    }
    return tj_listv(r);
}

/* ==== Calls ==== */

static void eval_args(tj_render *rs, const tj_node *n, tj_scope *sc, tj_args *out) {
    int npos = n->n, nkw = n->nkw;
    const tj_list *dyn = NULL;
    const tj_dict *dkw = NULL;
    tj_val *pos = NULL;
    if (n->n) {
        pos = tj_alloc(rs, (size_t)n->n * sizeof *pos);
        for (int i = 0; i < n->n; i++) pos[i] = eval(rs, n->kids[i], sc);
    }
    tj_kwarg *kw = NULL;
    if (n->nkw) {
        kw = tj_alloc(rs, (size_t)n->nkw * sizeof *kw);
        for (int i = 0; i < n->nkw; i++) {
            kw[i].name = rs->t->syms[n->kwsyms[i]];
            kw[i].len = rs->t->sym_lens[n->kwsyms[i]];
            kw[i].v = eval(rs, n->kwvals[i], sc);
        }
    }
    if (n->c) {
        tj_val d = eval(rs, n->c, sc);
        dyn = tj_iterate(rs, d);
    }
    if (n->d) {
        tj_val d = eval(rs, n->d, sc);
        if (d.kind != TJ_DICT)
            tj_fail(rs, ST_ERR_ARG, "argument after ** must be a mapping, not %s", tj_type_name(d));
        dkw = d.as.d;
    }
    if (dyn && dyn->len) {
        tj_val *np = tj_alloc(rs, (size_t)(npos + dyn->len) * sizeof *np);
        if (npos) memcpy(np, pos, (size_t)npos * sizeof *np);
        memcpy(np + npos, dyn->items, (size_t)dyn->len * sizeof *np);
        pos = np;
        npos += (int)dyn->len;
    }
    if (dkw && dkw->len) {
        tj_kwarg *nk = tj_alloc(rs, (size_t)(nkw + dkw->len) * sizeof *nk);
        if (nkw) memcpy(nk, kw, (size_t)nkw * sizeof *nk);
        for (int64_t i = 0; i < dkw->len; i++) {
            tj_val k = dkw->keys[i];
            if (k.kind != TJ_STR) tj_fail(rs, ST_ERR_ARG, "keywords must be strings");
            for (int j = 0; j < nkw; j++)
                if (nk[j].len == k.as.s->len && memcmp(nk[j].name, k.as.s->data, nk[j].len) == 0)
                    tj_fail(rs, ST_ERR_ARG, "got multiple values for keyword argument '%s'",
                            k.as.s->data);
            nk[nkw].name = k.as.s->data;
            nk[nkw].len = k.as.s->len;
            nk[nkw].v = dkw->vals[i];
            nkw++;
        }
        kw = nk;
    }
    out->n = npos;
    out->pos = pos;
    out->nkw = nkw;
    out->kw = kw;
}

static tj_val call_macro(tj_render *rs, const tj_macro *m, tj_args *args) {
    const tj_node *d = m->def;
    const char *mname = rs->t->syms[d->sym];
    if (++rs->call_depth > rs->t->params.max_call_depth)
        tj_fail(rs, ST_ERR_LIMIT, "macro call depth limit (%d) exceeded in '%s'",
                rs->t->params.max_call_depth, mname);
    int caller_line = rs->line; /* errors report the innermost statement, as jinja2 does */
    tj_scope *ms = scope_new(rs, m->closure);
    int np = d->nkw;
    bool *bound = np ? tj_alloc(rs, (size_t)np) : NULL;
    if (np) memset(bound, 0, (size_t)np);
    int take = args->n < np ? args->n : np;
    for (int i = 0; i < take; i++) {
        scope_set(rs, ms, d->kwsyms[i], args->pos[i]);
        bound[i] = true;
    }
    tj_dict *extra_kw = (d->op & 2) ? tj_dict_new(rs, 4) : NULL;
    for (int k = 0; k < args->nkw; k++) {
        const tj_kwarg *a = &args->kw[k];
        int idx = -1;
        for (int i = take; i < np; i++) {
            if (rs->t->sym_lens[d->kwsyms[i]] == a->len &&
                memcmp(rs->t->syms[d->kwsyms[i]], a->name, a->len) == 0) {
                idx = i;
                break;
            }
        }
        if (idx >= 0) {
            scope_set(rs, ms, d->kwsyms[idx], a->v);
            bound[idx] = true;
        } else if (extra_kw) {
            tj_dict_set(rs, extra_kw, tj_strn(rs, a->name, a->len), a->v);
        } else {
            tj_fail(rs, ST_ERR_ARG, "macro '%s' takes no keyword argument '%s'", mname, a->name);
        }
    }
    if (args->n > np && !(d->op & 1))
        tj_fail(rs, ST_ERR_ARG, "macro '%s' takes not more than %d argument(s)", mname, np);
    for (int i = 0; i < np; i++) {
        if (bound[i]) continue;
        tj_val v;
        if (d->kwvals[i]) {
            rs->line = d->kwvals[i]->line;
            v = eval(rs, d->kwvals[i], ms);
        } else {
            v = tj_undef_hint(rs, "parameter '%s' was not provided", rs->t->syms[d->kwsyms[i]]);
        }
        scope_set(rs, ms, d->kwsyms[i], v);
    }
    if (d->op & 1) {
        int64_t ne = args->n > np ? args->n - np : 0;
        tj_list *va = tj_list_new(rs, ne, TJ_L_TUPLE);
        for (int64_t i = 0; i < ne; i++) va->items[i] = args->pos[np + i];
        scope_set(rs, ms, TJ_SYM_VARARGS, tj_listv(va));
    }
    if (extra_kw) scope_set(rs, ms, TJ_SYM_KWARGS, tj_dictv(extra_kw));
    bind_missing(rs, ms, d->a);
    tj_capture_begin(rs);
    exec(rs, d->a, ms);
    rs->call_depth--;
    rs->line = caller_line;
    return tj_capture_end(rs);
}

static int run_loop(tj_render *rs, const tj_node *n, tj_scope *sc, const tj_list *items,
                    int depth0);

tj_val tj_call(tj_render *rs, tj_val callee, tj_args *args) {
    switch ((tj_kind)callee.kind) {
    case TJ_MACRO: return call_macro(rs, callee.as.m, args);
    case TJ_FUNC: return tj_call_func(rs, callee.id, args);
    case TJ_METHOD: return tj_call_method(rs, callee.as.bm, args);
    case TJ_UNDEF: tj_fail_undef(rs, callee);
    case TJ_LOOP: {
        const tj_loop *lp = callee.as.loop;
        if (!lp->for_node)
            tj_fail(rs, ST_ERR_ARG,
                    "Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
        if (args->n != 1 || args->nkw)
            tj_fail(rs, ST_ERR_ARG, "loop() takes exactly one argument");
        const tj_list *items = tj_iterate(rs, args->pos[0]);
        int caller_line = rs->line;
        tj_capture_begin(rs);
        run_loop(rs, lp->for_node, lp->outer, items, lp->depth0 + 1);
        rs->line = caller_line;
        return tj_capture_end(rs);
    }
    default:
        tj_fail(rs, ST_ERR_ARG, "'%s' object is not callable", tj_type_name(callee));
    }
}

/* ==== Assignment ==== */

/* a name, a tuple of targets, or ns.attr of a namespace */
static void assign(tj_render *rs, const tj_node *target, tj_val v, tj_scope *sc) {
    if (target->type == TJ_N_NSREF) {
        tj_val ns = lookup(rs, sc, target->sym);
        if (ns.kind != TJ_NS) tj_fail(rs, ST_ERR_ARG, "cannot assign attribute on non-namespace object");
        tj_dict_set(rs, ns.as.ns->attrs, tj_strv(rs->t->sym_strs[target->sym2]), v);
        return;
    }
    if (target->type == TJ_N_NAME) {
        scope_set(rs, sc, target->sym, v);
        return;
    }
    ST_ASSERT(target->type == TJ_N_TUPLE);
    const tj_list *items = tj_iterate(rs, v);
    if (items->len > target->n)
        tj_fail(rs, ST_ERR_ARG, "too many values to unpack (expected %d)", target->n);
    if (items->len < target->n)
        tj_fail(rs, ST_ERR_ARG, "not enough values to unpack (expected %d, got %lld)", target->n,
                (long long)items->len);
    for (int i = 0; i < target->n; i++) assign(rs, target->kids[i], items->items[i], sc);
}

/* ==== Expressions ==== */

static tj_val apply_filter_node(tj_render *rs, const tj_node *n, tj_scope *sc,
                                const tj_val *inner) {
    tj_val operand;
    if (!n->a) {
        ST_ASSERT(inner);
        operand = *inner;
    } else if (inner && n->a->type == TJ_N_FILTER) {
        operand = apply_filter_node(rs, n->a, sc, inner);
    } else {
        operand = eval(rs, n->a, sc);
    }
    tj_args args;
    eval_args(rs, n, sc, &args);
    const char *name = rs->t->syms[n->sym];
    if (n->fid == TJ_FL_UNKNOWN) tj_fail(rs, ST_ERR_ARG, "No filter named '%s'.", name);
    return tj_apply_filter(rs, n->fid, name, operand, &args);
}

static tj_val eval_call(tj_render *rs, const tj_node *n, tj_scope *sc) {
    tj_val callee;
    const tj_node *c = n->a;
    if (c->type == TJ_N_GETATTR) {
        tj_val obj = eval(rs, c->a, sc);
        const char *name = rs->t->syms[c->sym];
        size_t len = rs->t->sym_lens[c->sym];
        tj_val m;
        if (obj.kind != TJ_UNDEF && obj.kind != TJ_NS && obj.kind != TJ_LOOP &&
            tj_method_lookup(rs, obj, name, len, &m) && m.kind == TJ_METHOD) {
            tj_args args;
            eval_args(rs, n, sc, &args);
            return tj_call_method(rs, m.as.bm, &args);
        }
        callee = tj_getattr(rs, obj, name, len);
    } else {
        callee = eval(rs, c, sc);
    }
    tj_args args;
    eval_args(rs, n, sc, &args);
    return tj_call(rs, callee, &args);
}

static tj_val eval_neg(tj_render *rs, tj_val v, bool neg) {
    if (v.kind == TJ_UNDEF) tj_fail_undef(rs, v);
    if (tj_is_intlike(v)) {
        if (!neg) return tj_int(v.as.i);
        if (v.as.i == INT64_MIN)
            tj_fail(rs, ST_ERR_UNSUPPORTED, "integer overflow (integers beyond 64 bits are not supported)");
        return tj_int(-v.as.i);
    }
    if (v.kind == TJ_FLOAT) return tj_float(neg ? -v.as.f : v.as.f);
    tj_fail(rs, ST_ERR_ARG, "bad operand type for unary %c: '%s'", neg ? '-' : '+', tj_type_name(v));
}


static tj_val eval_node(tj_render *rs, const tj_node *n, tj_scope *sc);

/* Values jinja2's optimizer may fold into the compiled code (Python's has_safe_repr). */
static bool safe_repr(tj_val v) {
    switch ((tj_kind)v.kind) {
    case TJ_NONE: case TJ_BOOL: case TJ_INT: case TJ_FLOAT: case TJ_STR: return true;
    case TJ_LIST:
        if (v.as.l->type != TJ_L_LIST && v.as.l->type != TJ_L_TUPLE) return false;
        for (int64_t i = 0; i < v.as.l->len; i++)
            if (!safe_repr(v.as.l->items[i])) return false;
        return true;
    case TJ_DICT:
        for (int64_t i = 0; i < v.as.d->len; i++)
            if (!safe_repr(v.as.d->keys[i]) || !safe_repr(v.as.d->vals[i])) return false;
        return true;
    default: return false;
    }
}

static tj_val eval(tj_render *rs, const tj_node *n, tj_scope *sc) {
    if (!n->konst || rs->const_fold) return eval_node(rs, n, sc);
    /* a literal expression with a slice: folded when the result is a plain value, else the
     * compiled code runs (and its subscript may raise) */
    rs->const_fold = true;
    tj_val r = eval_node(rs, n, sc);
    rs->const_fold = false;
    return safe_repr(r) ? r : eval_node(rs, n, sc);
}

static tj_val eval_node(tj_render *rs, const tj_node *n, tj_scope *sc) {
    if (++rs->depth > TJ_MAX_EVAL_DEPTH) tj_fail(rs, ST_ERR_LIMIT, "template recursion too deep");
    tj_work(rs, 1);
    tj_val r;
    switch ((tj_node_type)n->type) {
    case TJ_N_CONST: r = n->cval; break;
    case TJ_N_NAME: r = lookup(rs, sc, n->sym); break;
    case TJ_N_GETATTR: {
        tj_val obj = eval(rs, n->a, sc);
        r = tj_getattr(rs, obj, rs->t->syms[n->sym], rs->t->sym_lens[n->sym]);
        break;
    }
    case TJ_N_GETITEM: {
        tj_val obj = eval(rs, n->a, sc);
        if (n->b->type == TJ_N_SLICE) {
            r = do_slice(rs, obj, n->b, sc);
            break;
        }
        tj_val key = eval(rs, n->b, sc);
        r = tj_getitem(rs, obj, key);
        break;
    }
    case TJ_N_CALL: r = eval_call(rs, n, sc); break;
    case TJ_N_FILTER: r = apply_filter_node(rs, n, sc, NULL); break;
    case TJ_N_TEST: {
        tj_val v = eval(rs, n->a, sc);
        tj_args args;
        eval_args(rs, n, sc, &args);
        const char *name = rs->t->syms[n->sym];
        if (n->fid == TJ_TS_UNKNOWN) tj_fail(rs, ST_ERR_ARG, "No test named '%s'.", name);
        r = tj_bool(tj_apply_test(rs, n->fid, name, v, &args));
        break;
    }
    case TJ_N_NOT: r = tj_bool(!tj_truthy(eval(rs, n->a, sc))); break;
    case TJ_N_NEG:
    case TJ_N_POS: {
        tj_val v = eval(rs, n->a, sc);
        r = eval_neg(rs, v, n->type == TJ_N_NEG);
        break;
    }
    case TJ_N_BINOP: {
        tj_val a = eval(rs, n->a, sc);
        tj_val b = eval(rs, n->b, sc);
        r = tj_arith(rs, n->op, a, b);
        break;
    }
    case TJ_N_AND: {
        tj_val a = eval(rs, n->a, sc);
        r = tj_truthy(a) ? eval(rs, n->b, sc) : a;
        break;
    }
    case TJ_N_OR: {
        tj_val a = eval(rs, n->a, sc);
        r = tj_truthy(a) ? a : eval(rs, n->b, sc);
        break;
    }
    case TJ_N_CONCAT: {
        tj_buf b = {0};
        for (int i = 0; i < n->n; i++) {
            tj_val v = eval(rs, n->kids[i], sc);
            tj_str_of(rs, &b, v);
        }
        r = tj_str_buf(rs, &b);
        break;
    }
    case TJ_N_COMPARE: {
        tj_val a = eval(rs, n->a, sc);
        r = tj_bool(true);
        for (int i = 0; i < n->n; i++) {
            tj_val b = eval(rs, n->kids[i], sc);
            if (!tj_cmp(rs, n->ops[i], a, b)) {
                r = tj_bool(false);
                break;
            }
            a = b;
        }
        break;
    }
    case TJ_N_CONDEXPR:
        if (tj_truthy(eval(rs, n->a, sc))) r = eval(rs, n->b, sc);
        else if (n->c) r = eval(rs, n->c, sc);
        else
            r = tj_undef_hint(rs,
                              "the inline if-expression on line %d evaluated to false and no "
                              "else section was defined.",
                              n->line);
        break;
    case TJ_N_LIST:
    case TJ_N_TUPLE: {
        tj_list *l = tj_list_new(rs, n->n, n->type == TJ_N_LIST ? TJ_L_LIST : TJ_L_TUPLE);
        for (int i = 0; i < n->n; i++) l->items[i] = eval(rs, n->kids[i], sc);
        r = tj_listv(l);
        break;
    }
    case TJ_N_DICT: {
        tj_dict *d = tj_dict_new(rs, n->n);
        for (int i = 0; i < n->n; i++) {
            tj_val k = eval(rs, n->kids[2 * i], sc);
            tj_val v = eval(rs, n->kids[2 * i + 1], sc);
            tj_dict_set(rs, d, k, v);
        }
        r = tj_dictv(d);
        break;
    }
    case TJ_N_SLICE: /* only inside a subscript tuple (x[a:b, c]): no such key anywhere */
        r = tj_undef_hint(rs, "slice objects are not supported as subscript keys");
        break;
    default: ST_ASSERT(!"not an expression node"); r = tj_none();
    }
    rs->depth--;
    return r;
}

/* ==== Statements ==== */

static void print_val(tj_render *rs, tj_val v) {
    if (v.kind == TJ_STR) {
        emit(rs, v.as.s->data, v.as.s->len);
        return;
    }
    tj_buf *b = out_buf(rs);
    tj_str_of(rs, b, v);
    check_out(rs, b);
}

static int run_loop(tj_render *rs, const tj_node *n, tj_scope *sc, const tj_list *items,
                    int depth0) {
    if (n->c) {
        tj_scope *fs = scope_new(rs, sc);
        tj_list *kept = tj_list_new(rs, items->len, TJ_L_LIST);
        int64_t k = 0;
        for (int64_t i = 0; i < items->len; i++) {
            if (++rs->loop_iters > rs->t->params.max_loop_iters)
                tj_fail(rs, ST_ERR_LIMIT, "template loop iteration limit (%lld) exceeded",
                        (long long)rs->t->params.max_loop_iters);
            fs->n = 0;
            rs->line = n->line;
            assign(rs, n->a, items->items[i], fs);
            rs->line = n->c->line;
            if (tj_truthy(eval(rs, n->c, fs))) kept->items[k++] = items->items[i];
        }
        kept->len = k;
        items = kept;
    }
    tj_loop *lp = tj_alloc(rs, sizeof *lp);
    memset(lp, 0, sizeof *lp);
    lp->items = items;
    lp->depth0 = depth0;
    lp->for_node = n->op ? n : NULL;
    lp->outer = sc;
    tj_val lv = {.kind = TJ_LOOP};
    lv.as.loop = lp;
    tj_scope *ls = scope_new(rs, sc);
    for (int64_t i = 0; i < items->len; i++) {
        if (++rs->loop_iters > rs->t->params.max_loop_iters) {
            rs->line = n->line;
            tj_fail(rs, ST_ERR_LIMIT, "template loop iteration limit (%lld) exceeded",
                    (long long)rs->t->params.max_loop_iters);
        }
        ls->n = 0;
        lp->index0 = i;
        bind_missing(rs, ls, n->kids[0]);
        scope_set(rs, ls, TJ_SYM_LOOP, lv);
        rs->line = n->line;
        assign(rs, n->a, items->items[i], ls);
        int r = exec(rs, n->kids[0], ls);
        if (r == EX_BREAK) break;
    }
    if (items->len == 0 && n->d) {
        tj_scope *es = scope_new(rs, sc);
        bind_missing(rs, es, n->d);
        exec(rs, n->d, es);
    }
    return EX_OK;
}

static int exec(tj_render *rs, const tj_node *n, tj_scope *sc) {
    if (++rs->depth > TJ_MAX_EVAL_DEPTH) {
        rs->line = n->line;
        tj_fail(rs, ST_ERR_LIMIT, "template recursion too deep");
    }
    tj_work(rs, 1);
    rs->line = n->line;
    int r = EX_OK;
    switch ((tj_node_type)n->type) {
    case TJ_N_BODY:
        for (int i = 0; i < n->n && r == EX_OK; i++) r = exec(rs, n->kids[i], sc);
        break;
    case TJ_N_TEXT: emit(rs, n->cval.as.s->data, n->cval.as.s->len); break;
    case TJ_N_PRINT:
        rs->line = n->a->line; /* jinja2 reports the printed expression's line */
        rs->const_fold = n->a->konst; /* a folded print item may be undefined */
        print_val(rs, eval(rs, n->a, sc));
        rs->const_fold = false;
        break;
    case TJ_N_IF: {
        const tj_node *b = n;
        while (b && b->type == TJ_N_IF) {
            rs->line = b->line;
            if (tj_truthy(eval(rs, b->a, sc))) {
                r = exec(rs, b->b, sc);
                b = NULL;
                break;
            }
            b = b->c;
        }
        if (b) r = exec(rs, b, sc);
        break;
    }
    case TJ_N_FOR: {
        tj_val it = eval(rs, n->b, sc);
        rs->line = n->line;
        r = run_loop(rs, n, sc, tj_iterate(rs, it), 0);
        break;
    }
    case TJ_N_SET: {
        tj_val v = eval(rs, n->b, sc);
        rs->line = n->line;
        assign(rs, n->a, v, sc);
        break;
    }
    case TJ_N_SETBLOCK: {
        tj_capture_begin(rs);
        tj_scope *bs = scope_new(rs, sc);
        bind_missing(rs, bs, n->c);
        int br = exec(rs, n->c, bs);
        tj_val v = tj_capture_end(rs);
        if (br != EX_OK) {
            r = br;
            break;
        }
        rs->line = n->line;
        if (n->b) v = apply_filter_node(rs, n->b, sc, &v);
        assign(rs, n->a, v, sc);
        break;
    }
    case TJ_N_MACRO: {
        tj_macro *m = tj_alloc(rs, sizeof *m);
        m->def = n;
        m->closure = sc;
        tj_val v = {.kind = TJ_MACRO};
        v.as.m = m;
        scope_set(rs, sc, n->sym, v);
        break;
    }
    case TJ_N_FILTERBLOCK: {
        tj_capture_begin(rs);
        tj_scope *bs = scope_new(rs, sc);
        bind_missing(rs, bs, n->b);
        int br = exec(rs, n->b, bs);
        tj_val v = tj_capture_end(rs);
        if (br != EX_OK) {
            r = br;
            break;
        }
        rs->line = n->line;
        print_val(rs, apply_filter_node(rs, n->a, sc, &v));
        break;
    }
    case TJ_N_WITH: {
        tj_scope *ws = scope_new(rs, sc);
        tj_val *vals = n->n ? tj_alloc(rs, (size_t)n->n * sizeof *vals) : NULL;
        for (int i = 0; i < n->n; i++) vals[i] = eval(rs, n->kids2[i], sc);
        rs->line = n->line;
        for (int i = 0; i < n->n; i++) assign(rs, n->kids[i], vals[i], ws);
        bind_missing(rs, ws, n->a);
        r = exec(rs, n->a, ws);
        break;
    }
    case TJ_N_BREAK: r = EX_BREAK; break;
    case TJ_N_CONTINUE: r = EX_CONTINUE; break;
    default: ST_ASSERT(!"not a statement node");
    }
    rs->depth--;
    return r;
}

/* Run the template's root body (called by st_tmpl_render under setjmp). */
void tj_exec_root(tj_render *rs) {
    rs->root = scope_new(rs, rs->globals);
    bind_missing(rs, rs->root, rs->t->root);
    exec(rs, rs->t->root, rs->root);
}

/* Bind a context variable (called by st_tmpl_render). */
void tj_set_global(tj_render *rs, int32_t sym, tj_val v) { scope_set(rs, rs->globals, sym, v); }
