/* ==== Template parser: tokens -> AST, following jinja2's grammar ====
 *
 * A recursive-descent parser with jinja2's precedence and quirks:
 *   condexpr (a if b else c) > or > and > not > compare (chained, in, not in) > + - > ~ >
 *   * / // % > ** (left-associative, as in jinja2) > unary - + > primary with postfix
 *   (.attr, [key], [a:b:c], calls) and then filters (|f) and tests (is t) at unary level.
 * Statements: if/elif/else, for (tuple targets, inline if filter, else, recursive), set
 * (also ns.attr and block set with filters), macro (defaults), filter blocks, with,
 * break/continue (only inside a loop, as the loopcontrols extension compiles them), print,
 * and transformers' {% generation %} block. Unknown filters/tests are compile errors except
 * inside if/else bodies and conditional expressions, where jinja2 defers them to runtime.
 * Nesting depth is bounded so hostile input cannot exhaust the stack.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tj_int.h"

typedef struct parser {
    st_tmpl *t;
    const tj_token *toks; /* [ntoks], ends with EOF */
    int64_t ntoks, pos;
    st_error *err;
    jmp_buf jb;
    int depth;       /* current nesting */
    int walk_depth;  /* check_unknown recursion */
    int loop_depth;  /* enclosing for loops within the current macro */
    unsigned macro_uses; /* bit 1 varargs, bit 2 kwargs seen in the current macro body */
    char deferred[700]; /* first unknown filter/test outside soft frames */
    int deferred_line;
    const char *end_stack[64]; /* innermost open block names, for EOF messages */
    int n_end;
} parser;

_Noreturn static void pfail(parser *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pfail(parser *p, int line, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st_error_set(p->err, ST_ERR_FORMAT, "line %d: %s", line, msg);
    longjmp(p->jb, 1);
}

static void *palloc(parser *p, size_t n) {
    void *r = tj_arena_alloc(&p->t->arena, n);
    if (!r) {
        st_error_set(p->err, ST_ERR_NOMEM, "out of memory while parsing the template");
        longjmp(p->jb, 1);
    }
    memset(r, 0, n);
    return r;
}

static tj_node *node(parser *p, int type, int line) {
    tj_node *n = palloc(p, sizeof *n);
    n->type = (uint8_t)type;
    n->line = line;
    n->sym = n->sym2 = -1;
    return n;
}

static void enter(parser *p) {
    if (++p->depth > p->t->params.max_nesting)
        pfail(p, p->toks[p->pos].line, "template nested too deeply (limit %d)",
              p->t->params.max_nesting);
}
static void leave(parser *p) { p->depth--; }

/* ==== Token stream ==== */

static const tj_token *cur(parser *p) { return &p->toks[p->pos]; }
static const tj_token *look(parser *p) {
    return &p->toks[p->pos + 1 < p->ntoks ? p->pos + 1 : p->pos];
}
static const tj_token *advance(parser *p) {
    const tj_token *k = &p->toks[p->pos];
    if (p->pos + 1 < p->ntoks) p->pos++;
    return k;
}

static bool is_op(const tj_token *k, const char *op) {
    return k->type == TJ_T_OP && k->len == strlen(op) && memcmp(k->s, op, k->len) == 0;
}
static bool is_name(const tj_token *k, const char *nm) {
    return k->type == TJ_T_NAME && k->len == strlen(nm) && memcmp(k->s, nm, k->len) == 0;
}

/* jinja2's describe_token */
static void describe(const tj_token *k, char *buf, size_t cap) {
    switch (k->type) {
    case TJ_T_EOF: snprintf(buf, cap, "end of template"); break;
    case TJ_T_BLOCK_BEGIN: snprintf(buf, cap, "begin of statement block"); break;
    case TJ_T_BLOCK_END: snprintf(buf, cap, "end of statement block"); break;
    case TJ_T_VAR_BEGIN: snprintf(buf, cap, "begin of print statement"); break;
    case TJ_T_VAR_END: snprintf(buf, cap, "end of print statement"); break;
    case TJ_T_DATA: snprintf(buf, cap, "template data / text"); break;
    case TJ_T_STRING: snprintf(buf, cap, "string"); break;
    case TJ_T_INT: snprintf(buf, cap, "integer"); break;
    case TJ_T_FLOAT: snprintf(buf, cap, "float"); break;
    default: snprintf(buf, cap, "%.*s", (int)(k->len > 60 ? 60 : k->len), k->s); break;
    }
}

static void expect_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) {
        char d[80];
        describe(cur(p), d, sizeof d);
        pfail(p, cur(p)->line, "expected token '%s', got '%s'", op, d);
    }
    advance(p);
}

static void expect_type(parser *p, int type, const char *what) {
    if (cur(p)->type != type) {
        char d[80];
        describe(cur(p), d, sizeof d);
        pfail(p, cur(p)->line, "expected token '%s', got '%s'", what, d);
    }
    advance(p);
}

static const tj_token *expect_name(parser *p) {
    if (cur(p)->type != TJ_T_NAME) {
        char d[80];
        describe(cur(p), d, sizeof d);
        pfail(p, cur(p)->line, "expected token 'name', got '%s'", d);
    }
    return advance(p);
}

static bool skip_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) return false;
    advance(p);
    return true;
}
static bool skip_name(parser *p, const char *nm) {
    if (!is_name(cur(p), nm)) return false;
    advance(p);
    return true;
}

static int32_t intern(parser *p, const char *s, size_t len) {
    int32_t id = tj_intern(p->t, s, len);
    if (id < 0) {
        st_error_set(p->err, ST_ERR_NOMEM, "out of memory while parsing the template");
        longjmp(p->jb, 1);
    }
    return id;
}

/* Growable node list in the arena. */
typedef struct nlist {
    tj_node **v;
    int32_t n, cap;
} nlist;

static void nl_push(parser *p, nlist *l, tj_node *x) {
    if (l->n == l->cap) {
        int32_t nc = l->cap ? l->cap * 2 : 4;
        tj_node **nv = palloc(p, (size_t)nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

/* ==== Expressions ==== */

static tj_node *parse_expression(parser *p, bool with_condexpr);
static tj_node *parse_tuple(parser *p, bool simplified, bool with_condexpr,
                            const char *extra_end, bool explicit_parens);
static tj_node *parse_unary(parser *p, bool with_filter);
static tj_node *parse_primary(parser *p);
static tj_node *parse_postfix(parser *p, tj_node *n);
static tj_node *parse_filter(parser *p, tj_node *n, bool start_inline);

/* Call arguments: ( positional, name=value, *args, **kwargs ) into n. */
static void parse_call_args(parser *p, tj_node *n) {
    const tj_token *open = cur(p);
    expect_op(p, "(");
    nlist args = {0}, kwv = {0};
    int32_t *kws = NULL;
    int32_t nkw = 0, capkw = 0;
    bool require_comma = false;
    while (!is_op(cur(p), ")")) {
        if (require_comma) {
            expect_op(p, ",");
            if (is_op(cur(p), ")")) break;
        }
        if (is_op(cur(p), "*")) {
            if (n->c || n->d) pfail(p, open->line, "invalid syntax for function call expression");
            advance(p);
            n->c = parse_expression(p, true);
        } else if (is_op(cur(p), "**")) {
            if (n->d) pfail(p, open->line, "invalid syntax for function call expression");
            advance(p);
            n->d = parse_expression(p, true);
        } else if (cur(p)->type == TJ_T_NAME && is_op(look(p), "=")) {
            if (n->d) pfail(p, open->line, "invalid syntax for function call expression");
            const tj_token *k = advance(p);
            advance(p);
            int32_t sym = intern(p, k->s, k->len);
            for (int32_t i = 0; i < nkw; i++)
                if (kws[i] == sym) /* Python rejects this when jinja2 compiles the call */
                    pfail(p, k->line, "keyword argument repeated: %.*s", (int)k->len, k->s);
            if (nkw == capkw) {
                int32_t nc = capkw ? capkw * 2 : 4;
                int32_t *ns = palloc(p, (size_t)nc * sizeof *ns);
                if (nkw) memcpy(ns, kws, (size_t)nkw * sizeof *ns);
                kws = ns;
                capkw = nc;
            }
            kws[nkw++] = sym;
            nl_push(p, &kwv, parse_expression(p, true));
        } else {
            if (n->c || n->d || nkw)
                pfail(p, open->line, "invalid syntax for function call expression");
            nl_push(p, &args, parse_expression(p, true));
        }
        require_comma = true;
    }
    expect_op(p, ")");
    n->kids = args.v;
    n->n = args.n;
    n->kwsyms = kws;
    n->kwvals = kwv.v;
    n->nkw = nkw;
}

static tj_node *parse_call(parser *p, tj_node *callee) {
    tj_node *n = node(p, TJ_N_CALL, cur(p)->line);
    n->a = callee;
    parse_call_args(p, n);
    return n;
}

static const char *tok_text(parser *p, const tj_token *k) {
    char *s = palloc(p, k->len + 1);
    memcpy(s, k->s, k->len);
    return s;
}

/* Dotted name after | or is. */
static const char *dotted_name(parser *p, int *line) {
    const tj_token *k = expect_name(p);
    *line = k->line;
    const char *name = tok_text(p, k);
    while (is_op(cur(p), ".")) {
        advance(p);
        const tj_token *k2 = expect_name(p);
        size_t a = strlen(name);
        char *s = palloc(p, a + 1 + k2->len + 1);
        memcpy(s, name, a);
        s[a] = '.';
        memcpy(s + a + 1, k2->s, k2->len);
        name = s;
    }
    return name;
}

/* ==== Post-parse walk ====
 * jinja2 reports an unknown filter or test when it compiles the template, except inside if
 * statements and conditional expressions ("soft" frames), where the error waits until the
 * filter is actually called. Walk the AST in its code generator's order to find the first
 * unknown one outside such frames; the same walk bounds the AST's height and computes, bottom
 * up, which expressions are literal-only (CK_CONST) and contain a slice (CK_SLICE). */
enum { CK_CONST = 1, CK_SLICE = 2 };

static unsigned check_unknown_in(parser *p, tj_node *n, bool soft);
static unsigned check_unknown(parser *p, tj_node *n, bool soft) {
    if (!n) return CK_CONST;
    if (p->deferred[0]) return 0;
    /* operator chains (a + b + c ...) nest without recursing in the parser: bound them here */
    if (++p->walk_depth > 5 * p->t->params.max_nesting)
        pfail(p, n->line, "expression nested too deeply (limit %d levels)", 5 * p->t->params.max_nesting);
    unsigned f = check_unknown_in(p, n, soft);
    p->walk_depth--;
    /* jinja2's optimizer evaluates expressions made only of literals while compiling,
     * through the sandbox's getitem: a bad slice of a literal then gives undefined instead of
     * the TypeError the compiled subscript raises. Only slices differ: mark those (konst). */
    if (n->type < TJ_N_TEXT && n->type != TJ_N_SLICE && (f & CK_CONST) && (f & CK_SLICE))
        n->konst = 1;
    return f;
}

static unsigned check_unknown_in(parser *p, tj_node *n, bool soft) {
    unsigned all = CK_CONST, any = 0;
#define SUB(x, sf)                                                                          \
    do {                                                                                    \
        unsigned f_ = check_unknown(p, (x), (sf));                                          \
        if (!(f_ & CK_CONST)) all = 0;                                                      \
        any |= f_ & CK_SLICE;                                                               \
    } while (0)
    switch ((tj_node_type)n->type) {
    case TJ_N_FILTER:
    case TJ_N_TEST: {
        bool unknown = n->type == TJ_N_FILTER ? n->fid == TJ_FL_UNKNOWN : n->fid == TJ_TS_UNKNOWN;
        if (unknown && !soft) {
            snprintf(p->deferred, sizeof p->deferred, "No %s named '%s'.",
                     n->type == TJ_N_FILTER ? "filter" : "test", p->t->syms[n->sym]);
            p->deferred_line = n->line;
            return 0;
        }
        /* filters taking the context (select, map...) are never folded */
        if (n->type == TJ_N_FILTER &&
            (!n->a || unknown || n->fid == TJ_FL_MAP || n->fid == TJ_FL_SELECT ||
             n->fid == TJ_FL_REJECT || n->fid == TJ_FL_SELECTATTR || n->fid == TJ_FL_REJECTATTR))
            all = 0;
        if (n->c || n->d) all = 0;
        break;
    }
    case TJ_N_CONDEXPR:
        SUB(n->a, true);
        SUB(n->b, true);
        SUB(n->c, true);
        return all | any;
    case TJ_N_IF:
        check_unknown(p, n->a, true);
        check_unknown(p, n->b, true);
        check_unknown(p, n->c, true);
        return 0;
    case TJ_N_FOR:
        check_unknown(p, n->b, soft);
        check_unknown(p, n->c, false);
        check_unknown(p, n->kids[0], false);
        check_unknown(p, n->d, false);
        return 0;
    case TJ_N_MACRO:
        for (int i = 0; i < n->nkw; i++) check_unknown(p, n->kwvals[i], false);
        check_unknown(p, n->a, false);
        return 0;
    case TJ_N_SETBLOCK:
        check_unknown(p, n->b, false);
        check_unknown(p, n->c, false);
        return 0;
    case TJ_N_FILTERBLOCK:
        check_unknown(p, n->a, false);
        check_unknown(p, n->b, false);
        return 0;
    case TJ_N_WITH:
        for (int i = 0; i < n->n; i++) check_unknown(p, n->kids2[i], soft);
        check_unknown(p, n->a, false);
        return 0;
    case TJ_N_CONST: return CK_CONST;
    case TJ_N_SLICE: any = CK_SLICE; break;
    case TJ_N_NEG: case TJ_N_POS: case TJ_N_NOT: case TJ_N_BINOP: case TJ_N_AND: case TJ_N_OR:
    case TJ_N_GETITEM: case TJ_N_GETATTR: case TJ_N_COMPARE: case TJ_N_LIST: case TJ_N_TUPLE:
    case TJ_N_DICT: case TJ_N_CONCAT:
        break;
    default: all = 0; break; /* names, calls, statements */
    }
    SUB(n->a, soft);
    SUB(n->b, soft);
    SUB(n->c, soft);
    SUB(n->d, soft);
    int nk = n->type == TJ_N_DICT ? 2 * n->n : n->n;
    if (n->kids)
        for (int i = 0; i < nk; i++) SUB(n->kids[i], soft);
    if (n->kids2)
        for (int i = 0; i < n->n; i++) SUB(n->kids2[i], soft);
    for (int i = 0; i < n->nkw; i++) SUB(n->kwvals[i], soft);
#undef SUB
    return all | any;
}

static tj_node *parse_filter(parser *p, tj_node *n, bool start_inline) {
    while (is_op(cur(p), "|") || start_inline) {
        if (!start_inline) advance(p);
        int line;
        const char *name = dotted_name(p, &line);
        tj_node *f = node(p, TJ_N_FILTER, line);
        f->a = n;
        f->sym = intern(p, name, strlen(name));
        f->fid = (uint16_t)tj_filter_lookup(name, strlen(name));
        if (is_op(cur(p), "(")) parse_call_args(p, f);
        n = f;
        start_inline = false;
    }
    return n;
}

static tj_node *parse_test(parser *p, tj_node *n) {
    const tj_token *is = advance(p); /* 'is' */
    bool negated = skip_name(p, "not");
    int line;
    const char *name = dotted_name(p, &line);
    tj_node *t = node(p, TJ_N_TEST, is->line);
    t->a = n;
    t->sym = intern(p, name, strlen(name));
    t->fid = (uint16_t)tj_test_lookup(name, strlen(name));
    const tj_token *k = cur(p);
    if (is_op(k, "(")) {
        parse_call_args(p, t);
    } else if ((k->type == TJ_T_NAME || k->type == TJ_T_STRING || k->type == TJ_T_INT ||
                k->type == TJ_T_FLOAT || is_op(k, "(") || is_op(k, "[") || is_op(k, "{")) &&
               !is_name(k, "else") && !is_name(k, "or") && !is_name(k, "and")) {
        if (is_name(k, "is")) pfail(p, k->line, "You cannot chain multiple tests with is");
        tj_node *arg = parse_postfix(p, parse_primary(p));
        t->kids = palloc(p, sizeof(tj_node *));
        t->kids[0] = arg;
        t->n = 1;
    }
    if (negated) {
        tj_node *nn = node(p, TJ_N_NOT, is->line);
        nn->a = t;
        return nn;
    }
    return t;
}

static tj_node *parse_subscribed(parser *p) {
    int line = cur(p)->line;
    tj_node *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), ":")) {
        advance(p);
    } else {
        tj_node *e = parse_expression(p, true);
        if (!is_op(cur(p), ":")) return e;
        advance(p);
        args[0] = e;
    }
    if (!is_op(cur(p), ":") && !is_op(cur(p), "]") && !is_op(cur(p), ","))
        args[1] = parse_expression(p, true);
    if (is_op(cur(p), ":")) {
        advance(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = parse_expression(p, true);
    }
    tj_node *s = node(p, TJ_N_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static tj_node *parse_subscript(parser *p, tj_node *obj) {
    const tj_token *k = advance(p);
    if (is_op(k, ".")) {
        const tj_token *a = advance(p);
        if (a->type == TJ_T_NAME) {
            tj_node *n = node(p, TJ_N_GETATTR, k->line);
            n->a = obj;
            n->sym = intern(p, a->s, a->len);
            return n;
        }
        if (a->type != TJ_T_INT) pfail(p, a->line, "expected name or number");
        tj_node *c = node(p, TJ_N_CONST, a->line);
        c->cval = tj_int(a->i);
        tj_node *n = node(p, TJ_N_GETITEM, k->line);
        n->a = obj;
        n->b = c;
        return n;
    }
    /* '[' */
    nlist args = {0};
    while (!is_op(cur(p), "]")) {
        if (args.n) expect_op(p, ",");
        nl_push(p, &args, parse_subscribed(p));
    }
    expect_op(p, "]");
    tj_node *key;
    if (args.n == 1) {
        key = args.v[0];
    } else {
        key = node(p, TJ_N_TUPLE, k->line);
        key->kids = args.v;
        key->n = args.n;
    }
    tj_node *n = node(p, TJ_N_GETITEM, k->line);
    n->a = obj;
    n->b = key;
    return n;
}

static tj_node *parse_postfix(parser *p, tj_node *n) {
    for (;;) {
        if (is_op(cur(p), ".") || is_op(cur(p), "[")) n = parse_subscript(p, n);
        else if (is_op(cur(p), "(")) n = parse_call(p, n);
        else break;
    }
    return n;
}

static tj_node *parse_filter_expr(parser *p, tj_node *n) {
    for (;;) {
        if (is_op(cur(p), "|")) n = parse_filter(p, n, false);
        else if (is_name(cur(p), "is")) n = parse_test(p, n);
        else if (is_op(cur(p), "(")) n = parse_call(p, n);
        else break;
    }
    return n;
}

static tj_node *parse_primary(parser *p) {
    enter(p);
    const tj_token *k = cur(p);
    tj_node *n;
    if (k->type == TJ_T_NAME) {
        n = node(p, TJ_N_CONST, k->line);
        if (is_name(k, "true") || is_name(k, "True")) n->cval = tj_bool(true);
        else if (is_name(k, "false") || is_name(k, "False")) n->cval = tj_bool(false);
        else if (is_name(k, "none") || is_name(k, "None")) n->cval = tj_none();
        else {
            n->type = TJ_N_NAME;
            n->sym = intern(p, k->s, k->len);
            if (n->sym == TJ_SYM_VARARGS) p->macro_uses |= 1;
            if (n->sym == TJ_SYM_KWARGS) p->macro_uses |= 2;
        }
        advance(p);
    } else if (k->type == TJ_T_STRING) {
        advance(p);
        n = node(p, TJ_N_CONST, k->line);
        if (cur(p)->type != TJ_T_STRING) {
            const tj_str *s = tj_str_const(&p->t->arena, k->s, k->len);
            if (!s) palloc(p, SIZE_MAX / 2);
            n->cval = tj_strv(s);
        } else {
            size_t total = k->len;
            for (int64_t i = p->pos; p->toks[i].type == TJ_T_STRING; i++) total += p->toks[i].len;
            char *buf = palloc(p, total + 1);
            memcpy(buf, k->s, k->len);
            size_t o = k->len;
            while (cur(p)->type == TJ_T_STRING) {
                memcpy(buf + o, cur(p)->s, cur(p)->len);
                o += cur(p)->len;
                advance(p);
            }
            const tj_str *s = tj_str_const(&p->t->arena, buf, o);
            if (!s) palloc(p, SIZE_MAX / 2);
            n->cval = tj_strv(s);
        }
    } else if (k->type == TJ_T_INT) {
        advance(p);
        n = node(p, TJ_N_CONST, k->line);
        n->cval = tj_int(k->i);
    } else if (k->type == TJ_T_FLOAT) {
        advance(p);
        n = node(p, TJ_N_CONST, k->line);
        n->cval = tj_float(k->f);
    } else if (is_op(k, "(")) {
        advance(p);
        n = parse_tuple(p, false, true, NULL, true);
        expect_op(p, ")");
    } else if (is_op(k, "[")) {
        advance(p);
        n = node(p, TJ_N_LIST, k->line);
        nlist items = {0};
        while (!is_op(cur(p), "]")) {
            if (items.n) expect_op(p, ",");
            if (is_op(cur(p), "]")) break;
            nl_push(p, &items, parse_expression(p, true));
        }
        expect_op(p, "]");
        n->kids = items.v;
        n->n = items.n;
    } else if (is_op(k, "{")) {
        advance(p);
        n = node(p, TJ_N_DICT, k->line);
        nlist items = {0};
        while (!is_op(cur(p), "}")) {
            if (items.n) expect_op(p, ",");
            if (is_op(cur(p), "}")) break;
            nl_push(p, &items, parse_expression(p, true));
            expect_op(p, ":");
            nl_push(p, &items, parse_expression(p, true));
        }
        expect_op(p, "}");
        n->kids = items.v;
        n->n = items.n / 2;
    } else {
        char d[80];
        describe(k, d, sizeof d);
        pfail(p, k->line, "unexpected '%s'", d);
    }
    leave(p);
    return n;
}

static tj_node *parse_unary(parser *p, bool with_filter) {
    enter(p);
    const tj_token *k = cur(p);
    tj_node *n;
    if (is_op(k, "-") || is_op(k, "+")) {
        advance(p);
        n = node(p, is_op(k, "-") ? TJ_N_NEG : TJ_N_POS, k->line);
        n->a = parse_unary(p, false);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    leave(p);
    return n;
}

static tj_node *binop(parser *p, int op, tj_node *a, tj_node *b, int line) {
    tj_node *n = node(p, TJ_N_BINOP, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static tj_node *parse_pow(parser *p) {
    int line = cur(p)->line;
    tj_node *l = parse_unary(p, true);
    while (is_op(cur(p), "**")) {
        advance(p);
        l = binop(p, TJ_OP_POW, l, parse_unary(p, true), line);
        line = cur(p)->line;
    }
    return l;
}

static tj_node *parse_math2(parser *p) {
    int line = cur(p)->line;
    tj_node *l = parse_pow(p);
    for (;;) {
        int op = is_op(cur(p), "*") ? TJ_OP_MUL : is_op(cur(p), "/") ? TJ_OP_DIV
               : is_op(cur(p), "//") ? TJ_OP_FLOORDIV : is_op(cur(p), "%") ? TJ_OP_MOD : 0;
        if (!op) break;
        advance(p);
        l = binop(p, op, l, parse_pow(p), line);
        line = cur(p)->line;
    }
    return l;
}

static tj_node *parse_concat(parser *p) {
    int line = cur(p)->line;
    tj_node *first = parse_math2(p);
    if (!is_op(cur(p), "~")) return first;
    nlist items = {0};
    nl_push(p, &items, first);
    while (is_op(cur(p), "~")) {
        advance(p);
        nl_push(p, &items, parse_math2(p));
    }
    tj_node *n = node(p, TJ_N_CONCAT, line);
    n->kids = items.v;
    n->n = items.n;
    return n;
}

static tj_node *parse_math1(parser *p) {
    int line = cur(p)->line;
    tj_node *l = parse_concat(p);
    for (;;) {
        int op = is_op(cur(p), "+") ? TJ_OP_ADD : is_op(cur(p), "-") ? TJ_OP_SUB : 0;
        if (!op) break;
        advance(p);
        l = binop(p, op, l, parse_concat(p), line);
        line = cur(p)->line;
    }
    return l;
}

static tj_node *parse_compare(parser *p) {
    int line = cur(p)->line;
    tj_node *first = parse_math1(p);
    nlist rhs = {0};
    uint8_t opsbuf[256];
    uint8_t *ops = opsbuf;
    int cap = 256;
    for (;;) {
        const tj_token *k = cur(p);
        int op = 0;
        if (is_op(k, "==")) op = TJ_CMP_EQ;
        else if (is_op(k, "!=")) op = TJ_CMP_NE;
        else if (is_op(k, "<")) op = TJ_CMP_LT;
        else if (is_op(k, "<=")) op = TJ_CMP_LE;
        else if (is_op(k, ">")) op = TJ_CMP_GT;
        else if (is_op(k, ">=")) op = TJ_CMP_GE;
        else if (is_name(k, "in")) op = TJ_CMP_IN;
        else if (is_name(k, "not") && is_name(look(p), "in")) {
            op = TJ_CMP_NOTIN;
            advance(p);
        }
        if (!op) break;
        advance(p);
        if (rhs.n == cap) {
            uint8_t *no = palloc(p, (size_t)cap * 2);
            memcpy(no, ops, (size_t)cap);
            ops = no;
            cap *= 2;
        }
        ops[rhs.n] = (uint8_t)op;
        nl_push(p, &rhs, parse_math1(p));
        line = cur(p)->line;
    }
    if (!rhs.n) return first;
    tj_node *n = node(p, TJ_N_COMPARE, line);
    n->a = first;
    n->kids = rhs.v;
    n->n = rhs.n;
    n->ops = palloc(p, (size_t)rhs.n);
    memcpy(n->ops, ops, (size_t)rhs.n);
    return n;
}

static tj_node *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        enter(p);
        const tj_token *k = advance(p);
        tj_node *n = node(p, TJ_N_NOT, k->line);
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static tj_node *parse_and(parser *p) {
    int line = cur(p)->line;
    tj_node *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        advance(p);
        tj_node *n = node(p, TJ_N_AND, line);
        n->a = l;
        n->b = parse_not(p);
        l = n;
        line = cur(p)->line;
    }
    return l;
}

static tj_node *parse_or(parser *p) {
    int line = cur(p)->line;
    tj_node *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        advance(p);
        tj_node *n = node(p, TJ_N_OR, line);
        n->a = l;
        n->b = parse_and(p);
        l = n;
        line = cur(p)->line;
    }
    return l;
}

static tj_node *parse_condexpr(parser *p) {
    enter(p);
    int line = cur(p)->line;
    tj_node *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        advance(p);
        tj_node *n = node(p, TJ_N_CONDEXPR, line);
        n->b = e1;
        n->a = parse_or(p);
        if (skip_name(p, "else")) n->c = parse_condexpr(p);
        e1 = n;
        line = cur(p)->line;
    }
    leave(p);
    return e1;
}

static tj_node *parse_expression(parser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static bool is_tuple_end(parser *p, const char *extra_end) {
    const tj_token *k = cur(p);
    if (k->type == TJ_T_VAR_END || k->type == TJ_T_BLOCK_END || is_op(k, ")")) return true;
    return extra_end && is_name(k, extra_end);
}

static tj_node *parse_tuple(parser *p, bool simplified, bool with_condexpr,
                            const char *extra_end, bool explicit_parens) {
    int line = cur(p)->line;
    nlist args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n) expect_op(p, ",");
        if (is_tuple_end(p, extra_end)) break;
        tj_node *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        nl_push(p, &args, e);
        if (is_op(cur(p), ",")) is_tuple = true;
        else break;
        line = cur(p)->line;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char d[80];
            describe(cur(p), d, sizeof d);
            pfail(p, cur(p)->line, "Expected an expression, got '%s'", d);
        }
    }
    tj_node *n = node(p, TJ_N_TUPLE, line);
    n->kids = args.v;
    n->n = args.n;
    return n;
}

/* ==== Assignment targets ==== */

static void check_assignable(parser *p, tj_node *t) {
    if (t->type == TJ_N_NAME) {
        if (t->sym == TJ_SYM_LOOP) return; /* jinja2 allows it (and shadows) */
        return;
    }
    if (t->type == TJ_N_TUPLE) {
        for (int i = 0; i < t->n; i++) check_assignable(p, t->kids[i]);
        return;
    }
    const char *what = t->type == TJ_N_CONST ? "const" : "expression";
    pfail(p, t->line, "can't assign to '%s'", what);
}

static tj_node *parse_assign_target(parser *p, bool with_namespace, bool name_only,
                                    const char *extra_end) {
    if (with_namespace && cur(p)->type == TJ_T_NAME && is_op(look(p), ".")) {
        const tj_token *k = advance(p);
        advance(p);
        const tj_token *a = expect_name(p);
        tj_node *n = node(p, TJ_N_NSREF, k->line);
        n->sym = intern(p, k->s, k->len);
        n->sym2 = intern(p, a->s, a->len);
        return n;
    }
    tj_node *t;
    if (name_only) {
        const tj_token *k = expect_name(p);
        t = node(p, TJ_N_NAME, k->line);
        t->sym = intern(p, k->s, k->len);
        const char *bad[] = {"true", "false", "none", "True", "False", "None"};
        for (int i = 0; i < 6; i++)
            if (is_name(k, bad[i])) pfail(p, k->line, "can't assign to 'name'");
    } else {
        t = parse_tuple(p, true, true, extra_end, false);
    }
    check_assignable(p, t);
    return t;
}

/* ==== Statements ==== */

static tj_node *subparse(parser *p, const char *const *end_tokens);

static bool at_end_token(parser *p, const char *const *end_tokens) {
    if (!end_tokens) return false;
    for (int i = 0; end_tokens[i]; i++)
        if (is_name(cur(p), end_tokens[i])) return true;
    return false;
}

/* jinja2's parse_statements: optional ':', block end, body until one of end_tokens. */
static tj_node *parse_statements(parser *p, const char *const *end_tokens, bool drop_needle) {
    skip_op(p, ":");
    expect_type(p, TJ_T_BLOCK_END, "end of statement block");
    tj_node *body = subparse(p, end_tokens);
    if (cur(p)->type == TJ_T_EOF) {
        char want[300] = "";
        size_t o = 0;
        for (int i = 0; end_tokens[i]; i++)
            o += (size_t)snprintf(want + o, sizeof want - o, "%s'%s'", i ? " or " : "",
                                  end_tokens[i]);
        const char *inner = p->n_end ? p->end_stack[p->n_end - 1] : "?";
        pfail(p, cur(p)->line,
              "Unexpected end of template. Jinja was looking for the following tags: %s. The "
              "innermost block that needs to be closed is '%s'.",
              want, inner);
    }
    if (drop_needle) advance(p);
    return body;
}

static void push_block(parser *p, const char *name) {
    if (p->n_end < 64) p->end_stack[p->n_end] = name;
    p->n_end++;
}
static void pop_block(parser *p) { p->n_end--; }

static tj_node *parse_for(parser *p, int line) {
    static const char *const body_end[] = {"endfor", "else", NULL};
    static const char *const else_end[] = {"endfor", NULL};
    tj_node *n = node(p, TJ_N_FOR, line);
    n->a = parse_assign_target(p, false, false, "in");
    if (!skip_name(p, "in")) {
        char d[80];
        describe(cur(p), d, sizeof d);
        pfail(p, cur(p)->line, "expected token 'in', got '%s'", d);
    }
    n->b = parse_tuple(p, false, false, "recursive", false);
    if (skip_name(p, "if")) n->c = parse_expression(p, true);
    n->op = skip_name(p, "recursive") ? 1 : 0;
    push_block(p, "for");
    p->loop_depth++;
    tj_node *body = parse_statements(p, body_end, false);
    p->loop_depth--;
    n->kids = palloc(p, sizeof(tj_node *));
    n->kids[0] = body;
    n->n = 1;
    const tj_token *k = advance(p);
    if (is_name(k, "else")) n->d = parse_statements(p, else_end, true);
    pop_block(p);
    return n;
}

static tj_node *parse_if(parser *p, int line) {
    static const char *const body_end[] = {"elif", "else", "endif", NULL};
    static const char *const else_end[] = {"endif", NULL};
    push_block(p, "if");
    tj_node *top = node(p, TJ_N_IF, line), *n = top;
    for (;;) {
        n->a = parse_tuple(p, false, false, NULL, false);
        n->b = parse_statements(p, body_end, false);
        const tj_token *k = advance(p);
        if (is_name(k, "elif")) {
            tj_node *e = node(p, TJ_N_IF, cur(p)->line);
            n->c = e;
            n = e;
            continue;
        }
        if (is_name(k, "else")) n->c = parse_statements(p, else_end, true);
        break;
    }
    pop_block(p);
    return top;
}

static tj_node *parse_set(parser *p, int line) {
    static const char *const end[] = {"endset", NULL};
    tj_node *target = parse_assign_target(p, true, false, NULL);
    if (skip_op(p, "=")) {
        tj_node *n = node(p, TJ_N_SET, line);
        n->a = target;
        n->b = parse_tuple(p, false, true, NULL, false);
        return n;
    }
    tj_node *n = node(p, TJ_N_SETBLOCK, line);
    n->a = target;
    n->b = parse_filter(p, NULL, false);
    push_block(p, "set");
    n->c = parse_statements(p, end, true);
    pop_block(p);
    return n;
}

static tj_node *parse_macro(parser *p, int line) {
    static const char *const end[] = {"endmacro", NULL};
    tj_node *n = node(p, TJ_N_MACRO, line);
    tj_node *name = parse_assign_target(p, false, true, NULL);
    n->sym = name->sym;
    expect_op(p, "(");
    int32_t cap = 0;
    while (!is_op(cur(p), ")")) {
        if (n->nkw) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        tj_node *arg = parse_assign_target(p, false, true, NULL);
        tj_node *def = NULL;
        if (skip_op(p, "=")) def = parse_expression(p, true);
        else if (n->nkw && n->kwvals[n->nkw - 1])
            pfail(p, cur(p)->line, "non-default argument follows default argument");
        if (n->nkw == cap) {
            int32_t nc = cap ? cap * 2 : 4;
            int32_t *ns = palloc(p, (size_t)nc * sizeof *ns);
            tj_node **nv = palloc(p, (size_t)nc * sizeof *nv);
            if (n->nkw) {
                memcpy(ns, n->kwsyms, (size_t)n->nkw * sizeof *ns);
                memcpy(nv, n->kwvals, (size_t)n->nkw * sizeof *nv);
            }
            n->kwsyms = ns;
            n->kwvals = nv;
            cap = nc;
        }
        n->kwsyms[n->nkw] = arg->sym;
        n->kwvals[n->nkw] = def;
        n->nkw++;
    }
    expect_op(p, ")");
    unsigned saved_uses = p->macro_uses;
    int saved_loops = p->loop_depth;
    p->macro_uses = 0;
    p->loop_depth = 0;
    push_block(p, "macro");
    n->a = parse_statements(p, end, true);
    pop_block(p);
    n->op = (uint8_t)p->macro_uses;
    p->macro_uses = saved_uses;
    p->loop_depth = saved_loops;
    return n;
}

static tj_node *parse_statement(parser *p) {
    const tj_token *k = cur(p);
    if (k->type != TJ_T_NAME) pfail(p, k->line, "tag name expected");
    int line = k->line;
    enter(p);
    tj_node *r = NULL;
    if (is_name(k, "for")) {
        advance(p);
        r = parse_for(p, line);
    } else if (is_name(k, "if")) {
        advance(p);
        r = parse_if(p, line);
    } else if (is_name(k, "set")) {
        advance(p);
        r = parse_set(p, line);
    } else if (is_name(k, "macro")) {
        advance(p);
        r = parse_macro(p, line);
    } else if (is_name(k, "print")) {
        advance(p);
        r = node(p, TJ_N_PRINT, line);
        r->a = parse_tuple(p, false, true, NULL, false);
    } else if (is_name(k, "filter")) {
        static const char *const end[] = {"endfilter", NULL};
        advance(p);
        r = node(p, TJ_N_FILTERBLOCK, line);
        r->a = parse_filter(p, NULL, true);
        push_block(p, "filter");
        r->b = parse_statements(p, end, true);
        pop_block(p);
    } else if (is_name(k, "with")) {
        static const char *const end[] = {"endwith", NULL};
        advance(p);
        r = node(p, TJ_N_WITH, line);
        nlist targets = {0}, values = {0};
        while (cur(p)->type != TJ_T_BLOCK_END) {
            if (targets.n) expect_op(p, ",");
            nl_push(p, &targets, parse_assign_target(p, false, false, NULL));
            expect_op(p, "=");
            nl_push(p, &values, parse_expression(p, true));
        }
        r->kids = targets.v;
        r->kids2 = values.v;
        r->n = targets.n;
        push_block(p, "with");
        r->a = parse_statements(p, end, true);
        pop_block(p);
    } else if (is_name(k, "generation")) {
        /* transformers' AssistantTracker: a call block (own scope) rendering its body */
        static const char *const end[] = {"endgeneration", NULL};
        advance(p);
        r = node(p, TJ_N_WITH, line);
        int saved_loops = p->loop_depth;
        p->loop_depth = 0;
        push_block(p, "generation");
        r->a = parse_statements(p, end, true);
        pop_block(p);
        p->loop_depth = saved_loops;
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        bool brk = is_name(k, "break");
        advance(p);
        if (p->loop_depth == 0)
            pfail(p, line, "'%s' outside loop", brk ? "break" : "continue");
        r = node(p, brk ? TJ_N_BREAK : TJ_N_CONTINUE, line);
    } else if (is_name(k, "block") || is_name(k, "extends") || is_name(k, "include") ||
               is_name(k, "import") || is_name(k, "from") || is_name(k, "call") ||
               is_name(k, "autoescape")) {
        pfail(p, line, "the '%.*s' tag is not supported", (int)k->len, k->s);
    } else {
        pfail(p, line, "Encountered unknown tag '%.*s'.", (int)(k->len > 80 ? 80 : k->len), k->s);
    }
    leave(p);
    return r;
}

static tj_node *subparse(parser *p, const char *const *end_tokens) {
    nlist body = {0};
    int line = cur(p)->line;
    enter(p);
    for (;;) {
        const tj_token *k = cur(p);
        if (k->type == TJ_T_EOF) break;
        if (k->type == TJ_T_DATA) {
            tj_node *n = node(p, TJ_N_TEXT, k->line);
            const tj_str *s = tj_str_const(&p->t->arena, k->s, k->len);
            if (!s) palloc(p, SIZE_MAX / 2);
            n->cval = tj_strv(s);
            nl_push(p, &body, n);
            advance(p);
        } else if (k->type == TJ_T_VAR_BEGIN) {
            advance(p);
            tj_node *n = node(p, TJ_N_PRINT, k->line);
            n->a = parse_tuple(p, false, true, NULL, false);
            expect_type(p, TJ_T_VAR_END, "end of print statement");
            nl_push(p, &body, n);
        } else if (k->type == TJ_T_BLOCK_BEGIN) {
            advance(p);
            if (at_end_token(p, end_tokens)) break;
            nl_push(p, &body, parse_statement(p));
            expect_type(p, TJ_T_BLOCK_END, "end of statement block");
        } else {
            char d[80];
            describe(k, d, sizeof d);
            pfail(p, k->line, "unexpected '%s'", d);
        }
    }
    leave(p);
    tj_node *n = node(p, TJ_N_BODY, line);
    n->kids = body.v;
    n->n = body.n;
    return n;
}

st_status tj_parse(st_tmpl *t, const tj_token *toks, int64_t ntoks, st_error *err) {
    parser *p = calloc(1, sizeof *p);
    if (!p) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    p->t = t;
    p->toks = toks;
    p->ntoks = ntoks;
    p->err = err;
    st_status st = ST_OK;
    if (setjmp(p->jb) == 0) {
        tj_node *root = subparse(p, NULL);
        if (cur(p)->type != TJ_T_EOF) pfail(p, cur(p)->line, "unexpected trailing tokens");
        check_unknown(p, root, false);
        if (p->deferred[0]) pfail(p, p->deferred_line, "%s", p->deferred);
        t->root = root;
    } else {
        st = err ? err->status : ST_ERR_FORMAT;
        if (st == ST_OK) st = ST_ERR_FORMAT;
    }
    free(p);
    if (st == ST_OK) st = tj_analyze_scopes(t, t->root, err);
    return st;
}
