/* ==== Template API: compile, render, free, and the symbol table ====
 *
 * st_tmpl_compile normalises the source as jinja2 does (\r\n and \r become \n, one trailing
 * newline is dropped), checks it is UTF-8, lexes and parses it into an AST kept in the
 * template's arena. st_tmpl_render converts the JSON context into values in a fresh
 * per-render arena, runs the AST and hands back a malloc'ed copy of the output. Both unwind
 * errors through longjmp to here; renders share nothing mutable, so one compiled template
 * may be rendered from many threads at once.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/tj_int.h"

st_tmpl_params st_tmpl_default_params(void) {
    st_tmpl_params p;
    memset(&p, 0, sizeof p);
    p.max_output = (size_t)64 << 20;
    p.max_memory = (size_t)512 << 20;
    p.max_loop_iters = 10000000;
    p.max_steps = 1000000000;
    p.max_call_depth = 100;
    p.max_nesting = 200;
    p.fixed_time = 0;
    return p;
}

/* ==== Symbols ==== */

int32_t tj_intern(st_tmpl *t, const char *s, size_t len) {
    int64_t id;
    if (st_strmap_get(&t->symmap, s, len, &id)) return (int32_t)id;
    if (t->nsyms == t->cap_syms) {
        int32_t nc = t->cap_syms ? t->cap_syms * 2 : 64;
        const char **ns = tj_arena_alloc(&t->arena, (size_t)nc * sizeof *ns);
        size_t *nl = tj_arena_alloc(&t->arena, (size_t)nc * sizeof *nl);
        const tj_str **nstr = tj_arena_alloc(&t->arena, (size_t)nc * sizeof *nstr);
        if (!ns || !nl || !nstr) return -1;
        if (t->nsyms) {
            memcpy(ns, t->syms, (size_t)t->nsyms * sizeof *ns);
            memcpy(nl, t->sym_lens, (size_t)t->nsyms * sizeof *nl);
            memcpy(nstr, t->sym_strs, (size_t)t->nsyms * sizeof *nstr);
        }
        t->syms = ns;
        t->sym_lens = nl;
        t->sym_strs = nstr;
        t->cap_syms = nc;
    }
    const tj_str *str = tj_str_const(&t->arena, s, len);
    if (!str) return -1;
    int32_t nid = t->nsyms++;
    t->syms[nid] = str->data;
    t->sym_lens[nid] = len;
    t->sym_strs[nid] = str;
    if (st_strmap_put(&t->symmap, str->data, len, nid) < 0) return -1;
    return nid;
}

int32_t tj_sym_find(const st_tmpl *t, const char *s, size_t len) {
    int64_t id;
    return st_strmap_get(&t->symmap, s, len, &id) ? (int32_t)id : -1;
}

/* ==== Compile ==== */

void st_tmpl_free(st_tmpl *t) {
    if (!t) return;
    st_strmap_free(&t->symmap);
    tj_arena_free(&t->arena);
    free(t);
}

st_status st_tmpl_compile(const char *src, size_t len, const st_tmpl_params *params,
                          st_tmpl **out, st_error *err) {
    *out = NULL;
    st_error local;
    if (!err) err = &local;
    st_tmpl *t = calloc(1, sizeof *t);
    if (!t) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    t->params = params ? *params : st_tmpl_default_params();
    if (t->params.max_nesting <= 0) t->params.max_nesting = 200;
    if (t->params.max_call_depth <= 0) t->params.max_call_depth = 100;
    if (st_strmap_init(&t->symmap, 256) != 0) {
        free(t);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    static const char *const reserved[TJ_SYM_NRESERVED] = {
        "loop", "varargs", "kwargs", "caller", "range", "dict", "namespace",
        "raise_exception", "strftime_now", "lipsum", "cycler", "joiner"};
    for (int i = 0; i < TJ_SYM_NRESERVED; i++) {
        if (tj_intern(t, reserved[i], strlen(reserved[i])) != i) {
            st_tmpl_free(t);
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
        }
    }
    size_t bad = st_utf8_check(src, len);
    if (bad != len) {
        int line = 1;
        for (size_t i = 0; i < bad; i++)
            if (src[i] == '\n') line++;
        st_tmpl_free(t);
        return st_error_set(err, ST_ERR_FORMAT, "line %d: template is not valid UTF-8 (byte %zu)",
                            line, bad);
    }
    /* newline normalisation and the dropped trailing newline (keep_trailing_newline=False) */
    char *norm = malloc(len + 1);
    if (!norm) {
        st_tmpl_free(t);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = '\0';
    tj_token *toks = NULL;
    int64_t ntoks = 0;
    st_status st = tj_lex(t, norm, n, &toks, &ntoks, err);
    if (st == ST_OK) st = tj_parse(t, toks, ntoks, err);
    free(toks);
    free(norm);
    if (st != ST_OK) {
        st_tmpl_free(t);
        return st;
    }
    *out = t;
    return ST_OK;
}

/* ==== Render ==== */


/* Everything that may longjmp, kept out of st_tmpl_render's frame. */
static int render_protected(tj_render *rs, const json_t *context) {
    if (setjmp(rs->jb) != 0) return -1;
    rs->globals = tj_alloc(rs, sizeof *rs->globals);
    memset(rs->globals, 0, sizeof *rs->globals);
    if (context) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)context, k, v) {
            int32_t sym = tj_sym_find(rs->t, k, strlen(k));
            if (sym < 0) continue; /* the template never names it */
            tj_set_global(rs, sym, tj_from_json(rs, v));
        }
    }
    tj_exec_root(rs);
    return 0;
}

st_status st_tmpl_render(const st_tmpl *t, const json_t *context, char **out, size_t *out_len,
                         st_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    st_error local;
    if (!err) err = &local;
    if (context && !json_is_object(context))
        return st_error_set(err, ST_ERR_ARG, "template context must be a JSON object");
    tj_render *rs = calloc(1, sizeof *rs);
    if (!rs) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    rs->t = t;
    rs->err = err;
    rs->arena.limit = t->params.max_memory;
    rs->now = t->params.fixed_time ? t->params.fixed_time : (int64_t)time(NULL);
    rs->nbufs = 1;
    st_status st = ST_OK;
    if (render_protected(rs, context) == 0) {
        tj_buf *b = &rs->bufs[0];
        char *res = malloc(b->len + 1);
        if (!res) {
            st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        } else {
            if (b->len) memcpy(res, b->data, b->len);
            res[b->len] = '\0';
            *out = res;
            if (out_len) *out_len = b->len;
        }
    } else {
        st = err->status != ST_OK ? err->status : ST_ERR_INTERNAL;
    }
    tj_arena_free(&rs->arena);
    free(rs);
    return st;
}
