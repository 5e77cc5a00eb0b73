/* ==== Template scope analysis: names that start out "missing" in a frame ====
 *
 * jinja2 compiles each frame (the template's top level, a for-loop body or else block, a
 * macro body, a with/set/filter block) to Python locals, decided statically by its symbol
 * visitor (idtracking.py): walking the frame's own statements in order, a name first *loaded*
 * is resolved from the enclosing frames or the context; a name first *stored* (by an
 * unconditional set, macro or for target) starts as "missing" -- printed as undefined, and
 * hiding a context variable of the same name -- unless an enclosing frame already knows the
 * name, in which case it aliases that frame's variable. Stores inside an if count as
 * unconditional only when the if body, its elif chain and its else all make them.
 * Nested frames read the variable of the nearest enclosing frame that knows the name.
 *
 * The evaluator looks names up dynamically through scopes, which agrees with this except for
 * the "missing" case; so this pass records, per frame body, the names to pre-bind as missing
 * when the frame starts (tj_node.missing), e.g.
 *   {% for m in messages %}{{ x }}{% endfor %}{% set x = 1 %}   -> x is undefined in the loop
 * even when the context has x.
 */
#include <setjmp.h>
#include <string.h>

#include "template/tj_int.h"

enum { K_DYN = 0, K_MISSING = 1, K_PARAM = 2 };

typedef struct sref {
    int32_t sym;
    uint8_t kind; /* K_* */
} sref;

typedef struct stab {
    const struct stab *parent; /* enclosing frame, NULL at the top */
    sref *refs;                /* [nrefs] names this frame knows, arena */
    int32_t nrefs, caprefs;
    int32_t *stores;           /* [nstores] names this frame assigns, arena */
    int32_t nstores, capstores;
} stab;

typedef struct analyzer {
    tj_arena *arena;
    jmp_buf jb; /* out of memory */
} analyzer;

typedef struct frame_req {
    tj_node *body;         /* the frame's BODY node */
    const tj_node *params; /* NAME/TUPLE targets bound on entry (for/with), or NULL */
    const tj_node *macro;  /* MACRO node: its parameters, or NULL */
    bool is_loop;          /* a for body: `loop` is a parameter */
} frame_req;

typedef struct frame_list {
    frame_req *v;
    int32_t n, cap;
} frame_list;

static void *aalloc(analyzer *an, size_t n) {
    void *p = tj_arena_alloc(an->arena, n);
    if (!p) longjmp(an->jb, 1);
    memset(p, 0, n);
    return p;
}

static int own_ref(const stab *st, int32_t sym) {
    for (int32_t i = 0; i < st->nrefs; i++)
        if (st->refs[i].sym == sym) return i;
    return -1;
}

static bool find_ref(const stab *st, int32_t sym) {
    for (; st; st = st->parent)
        if (own_ref(st, sym) >= 0) return true;
    return false;
}

static void set_ref(analyzer *an, stab *st, int32_t sym, uint8_t kind) {
    int i = own_ref(st, sym);
    if (i >= 0) {
        st->refs[i].kind = kind;
        return;
    }
    if (st->nrefs == st->caprefs) {
        int32_t nc = st->caprefs ? st->caprefs * 2 : 8;
        sref *nr = aalloc(an, (size_t)nc * sizeof *nr);
        if (st->nrefs) memcpy(nr, st->refs, (size_t)st->nrefs * sizeof *nr);
        st->refs = nr;
        st->caprefs = nc;
    }
    st->refs[st->nrefs].sym = sym;
    st->refs[st->nrefs].kind = kind;
    st->nrefs++;
}

static bool has_store(const stab *st, int32_t sym) {
    for (int32_t i = 0; i < st->nstores; i++)
        if (st->stores[i] == sym) return true;
    return false;
}

static void add_store(analyzer *an, stab *st, int32_t sym) {
    if (has_store(st, sym)) return;
    if (st->nstores == st->capstores) {
        int32_t nc = st->capstores ? st->capstores * 2 : 8;
        int32_t *ns = aalloc(an, (size_t)nc * sizeof *ns);
        if (st->nstores) memcpy(ns, st->stores, (size_t)st->nstores * sizeof *ns);
        st->stores = ns;
        st->capstores = nc;
    }
    st->stores[st->nstores++] = sym;
}

static void sv_load(analyzer *an, stab *st, int32_t sym) {
    if (!find_ref(st, sym)) set_ref(an, st, sym, K_DYN);
}

static void sv_store(analyzer *an, stab *st, int32_t sym) {
    add_store(an, st, sym);
    if (own_ref(st, sym) >= 0) return;
    set_ref(an, st, sym, st->parent && find_ref(st->parent, sym) ? K_DYN : K_MISSING);
}

static void sv_param(analyzer *an, stab *st, int32_t sym) {
    add_store(an, st, sym);
    set_ref(an, st, sym, K_PARAM);
}

static stab copy_tab(analyzer *an, const stab *st) {
    stab c = *st;
    c.refs = st->caprefs ? aalloc(an, (size_t)st->caprefs * sizeof *c.refs) : NULL;
    if (st->nrefs) memcpy(c.refs, st->refs, (size_t)st->nrefs * sizeof *c.refs);
    c.stores = st->capstores ? aalloc(an, (size_t)st->capstores * sizeof *c.stores) : NULL;
    if (st->nstores) memcpy(c.stores, st->stores, (size_t)st->nstores * sizeof *c.stores);
    return c;
}

static void visit_expr(analyzer *an, stab *st, const tj_node *n) {
    if (!n) return;
    if (n->type == TJ_N_NAME) {
        sv_load(an, st, n->sym);
        return;
    }
    visit_expr(an, st, n->a);
    visit_expr(an, st, n->b);
    visit_expr(an, st, n->c);
    visit_expr(an, st, n->d);
    int nk = n->type == TJ_N_DICT ? 2 * n->n : n->n;
    if (n->kids)
        for (int i = 0; i < nk; i++) visit_expr(an, st, n->kids[i]);
    if (n->kids2)
        for (int i = 0; i < n->n; i++) visit_expr(an, st, n->kids2[i]);
    if (n->kwvals)
        for (int i = 0; i < n->nkw; i++) visit_expr(an, st, n->kwvals[i]);
}

static void store_target(analyzer *an, stab *st, const tj_node *t, bool param) {
    if (t->type == TJ_N_NAME) {
        if (param) sv_param(an, st, t->sym);
        else sv_store(an, st, t->sym);
    } else if (t->type == TJ_N_TUPLE) {
        for (int i = 0; i < t->n; i++) store_target(an, st, t->kids[i], param);
    } else if (t->type == TJ_N_NSREF) {
        sv_load(an, st, t->sym);
    }
}

static void nest(analyzer *an, frame_list *fl, tj_node *body, const tj_node *params,
                 const tj_node *macro, bool is_loop) {
    if (!body) return;
    if (fl->n == fl->cap) {
        int32_t nc = fl->cap ? fl->cap * 2 : 4;
        frame_req *nv = aalloc(an, (size_t)nc * sizeof *nv);
        if (fl->n) memcpy(nv, fl->v, (size_t)fl->n * sizeof *nv);
        fl->v = nv;
        fl->cap = nc;
    }
    fl->v[fl->n++] = (frame_req){body, params, macro, is_loop};
}

static void visit_stmt(analyzer *an, stab *st, tj_node *n, frame_list *fl);

/* jinja2's branch_update: a name assigned in some but not all of (body, elifs, else) is
 * resolved from outside rather than starting missing. */
static void branch_update(analyzer *an, stab *st, stab *br[3]) {
    int32_t nbefore = st->nstores;
    int32_t *before = nbefore ? aalloc(an, (size_t)nbefore * sizeof *before) : NULL;
    if (nbefore) memcpy(before, st->stores, (size_t)nbefore * sizeof *before);
    for (int b = 0; b < 3; b++) {
        for (int32_t i = 0; i < br[b]->nrefs; i++) set_ref(an, st, br[b]->refs[i].sym, br[b]->refs[i].kind);
        for (int32_t i = 0; i < br[b]->nstores; i++) add_store(an, st, br[b]->stores[i]);
    }
    for (int b = 0; b < 3; b++) {
        for (int32_t i = 0; i < br[b]->nstores; i++) {
            int32_t sym = br[b]->stores[i];
            bool was = false;
            for (int32_t k = 0; k < nbefore; k++)
                if (before[k] == sym) was = true;
            if (was) continue;
            int count = 0;
            for (int c = 0; c < 3; c++) count += has_store(br[c], sym);
            if (count < 3) set_ref(an, st, sym, K_DYN);
        }
    }
}

/* An if with its elif chain as jinja2 structures it: body, elif_ (the chained ifs, each
 * visited as an if of its own), else_. */
static void visit_if(analyzer *an, stab *st, tj_node *n, frame_list *fl, bool chained) {
    visit_expr(an, st, n->a);
    stab b0 = copy_tab(an, st), b1 = copy_tab(an, st), b2 = copy_tab(an, st);
    visit_stmt(an, &b0, n->b, fl);
    tj_node *e = n->c;
    if (!chained) {
        while (e && e->type == TJ_N_IF) {
            visit_if(an, &b1, e, fl, true);
            e = e->c;
        }
        if (e) visit_stmt(an, &b2, e, fl);
    }
    stab *br[3] = {&b0, &b1, &b2};
    branch_update(an, st, br);
}

static void visit_stmt(analyzer *an, stab *st, tj_node *n, frame_list *fl) {
    if (!n) return;
    switch ((tj_node_type)n->type) {
    case TJ_N_BODY:
        for (int i = 0; i < n->n; i++) visit_stmt(an, st, n->kids[i], fl);
        break;
    case TJ_N_PRINT: visit_expr(an, st, n->a); break;
    case TJ_N_IF: visit_if(an, st, n, fl, false); break;
    case TJ_N_FOR:
        visit_expr(an, st, n->b);
        nest(an, fl, n->kids[0], n->a, NULL, true);
        nest(an, fl, n->d, NULL, NULL, false);
        break;
    case TJ_N_SET:
        visit_expr(an, st, n->b);
        store_target(an, st, n->a, false);
        break;
    case TJ_N_SETBLOCK:
        store_target(an, st, n->a, false);
        nest(an, fl, n->c, NULL, NULL, false);
        break;
    case TJ_N_MACRO:
        sv_store(an, st, n->sym);
        nest(an, fl, n->a, NULL, n, false);
        break;
    case TJ_N_FILTERBLOCK:
        visit_expr(an, st, n->a);
        nest(an, fl, n->b, NULL, NULL, false);
        break;
    case TJ_N_WITH:
        for (int i = 0; i < n->n; i++) visit_expr(an, st, n->kids2[i]);
        nest(an, fl, n->a, n, NULL, false);
        break;
    default: break;
    }
}

static void analyze_frame(analyzer *an, const frame_req *fr, const stab *parent) {
    stab st = {.parent = parent};
    if (fr->is_loop) {
        sv_param(an, &st, TJ_SYM_LOOP);
        store_target(an, &st, fr->params, true);
    } else if (fr->params) { /* with: its targets */
        for (int i = 0; i < fr->params->n; i++) store_target(an, &st, fr->params->kids[i], true);
    }
    if (fr->macro) {
        for (int i = 0; i < fr->macro->nkw; i++) sv_param(an, &st, fr->macro->kwsyms[i]);
        if (fr->macro->op & 1) sv_param(an, &st, TJ_SYM_VARARGS);
        if (fr->macro->op & 2) sv_param(an, &st, TJ_SYM_KWARGS);
        for (int i = 0; i < fr->macro->nkw; i++) visit_expr(an, &st, fr->macro->kwvals[i]);
    }
    frame_list nested = {0};
    visit_stmt(an, &st, fr->body, &nested);
    int32_t nm = 0;
    for (int32_t i = 0; i < st.nrefs; i++) nm += st.refs[i].kind == K_MISSING;
    if (nm) {
        fr->body->missing = aalloc(an, (size_t)nm * sizeof(int32_t));
        for (int32_t i = 0; i < st.nrefs; i++)
            if (st.refs[i].kind == K_MISSING) fr->body->missing[fr->body->nmissing++] = st.refs[i].sym;
    }
    for (int32_t i = 0; i < nested.n; i++) analyze_frame(an, &nested.v[i], &st);
}

st_status tj_analyze_scopes(st_tmpl *t, tj_node *root, st_error *err) {
    analyzer an;
    an.arena = &t->arena;
    if (setjmp(an.jb) != 0)
        return st_error_set(err, ST_ERR_NOMEM, "out of memory while analysing the template");
    frame_req top = {root, NULL, NULL, false};
    analyze_frame(&an, &top, NULL);
    return ST_OK;
}
