/* ==== GBNF grammars (llama.cpp's grammar format) compiled for constrained decoding ====
 *
 * A grammar's rules become one array of elements: rule r is its alternatives one after
 * another, each a sequence of character sets and rule references, GB_ALT between them and
 * GB_END after the last. Groups, repetitions and options become rules of their own:
 * x* is R ::= x R | (empty), x+ is x x*, x? is R ::= x | (empty), x{m,n} is m copies of x
 * and n - m nested options. Left recursion is refused at compile time (its expansion would
 * never end).
 *
 * The matcher (llama.cpp's model, written anew): a set of stacks of element positions, each
 * a way the text so far can be read; a stack's top is the character set it expects next.
 * A code point advances every stack whose top accepts it (the top moves on; a finished
 * alternative pops back to where its rule was referenced), then references on the tops are
 * expanded into their alternatives. An empty stack means the text so far is a whole
 * sentence. The set lives in a fixed-size st_gram_gbnf (at most ST_GRAM_GB_STACKS stacks,
 * ST_GRAM_GB_DEPTH deep, ST_GRAM_GB_CELLS positions in all); a way beyond those bounds is
 * dropped, so what the bounds keep is still only text the grammar accepts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

/* ---- compiling ---- */

#define GB_MAX_RULES 4096
#define GB_MAX_REPEAT 1000
#define GB_MAX_NEST 64

typedef struct el_vec {
    gb_el *v;
    int32_t n, cap;
} el_vec;

typedef struct gb_rule {
    char name[64];
    int defined;
    el_vec body; /* its elements, appended to the grammar's at the end */
} gb_rule;

typedef struct gbp {
    const char *s, *end;
    st_error *err;
    int failed;
    gb_rule *rules;
    int32_t n_rules, cap_rules;
    uint32_t *rng;
    int32_t n_rng, cap_rng; /* pairs */
    int nest;
    const char *base; /* the text's start (error offsets) */
} gbp;

static int fail_at(gbp *p, const char *fmt, const char *arg) {
    if (!p->failed) {
        p->failed = 1;
        char what[160];
        snprintf(what, sizeof what, fmt, arg ? arg : "");
        st_error_set(p->err, ST_ERR_ARG, "grammar: %s (at byte %td)", what, p->s - p->base);
    }
    return -1;
}

static int push_el(gbp *p, el_vec *b, gb_el e) {
    if (b->n == b->cap) {
        const int32_t cap = b->cap ? 2 * b->cap : 16;
        if (cap > 1 << 20) return fail_at(p, "%stoo many elements", NULL);
        gb_el *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return fail_at(p, "%sout of memory", NULL);
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = e;
    return 0;
}

static int32_t new_rule(gbp *p, const char *name, size_t len) {
    if (p->n_rules == GB_MAX_RULES) return fail_at(p, "%smore than 4096 rules", NULL);
    if (p->n_rules == p->cap_rules) {
        const int32_t cap = p->cap_rules ? 2 * p->cap_rules : 32;
        gb_rule *r = realloc(p->rules, (size_t)cap * sizeof *r);
        if (!r) return fail_at(p, "%sout of memory", NULL);
        p->rules = r, p->cap_rules = cap;
    }
    gb_rule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    if (len >= sizeof r->name) len = sizeof r->name - 1;
    memcpy(r->name, name, len);
    return p->n_rules++;
}

static int32_t rule_named(gbp *p, const char *name, size_t len) {
    for (int32_t i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == len && !memcmp(p->rules[i].name, name, len)) return i;
    return new_rule(p, name, len);
}

static int32_t add_range(gbp *p, uint32_t lo, uint32_t hi) {
    if (p->n_rng == p->cap_rng) {
        const int32_t cap = p->cap_rng ? 2 * p->cap_rng : 64;
        if (cap > 1 << 20) return fail_at(p, "%stoo many character ranges", NULL);
        uint32_t *r = realloc(p->rng, (size_t)cap * 2 * sizeof *r);
        if (!r) return fail_at(p, "%sout of memory", NULL);
        p->rng = r, p->cap_rng = cap;
    }
    p->rng[2 * p->n_rng] = lo, p->rng[2 * p->n_rng + 1] = hi;
    return p->n_rng++;
}

static int is_name(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* whitespace, newlines and # comments */
static void skip_ws(gbp *p) {
    while (p->s < p->end) {
        if (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r') p->s++;
        else if (*p->s == '#')
            while (p->s < p->end && *p->s != '\n') p->s++;
        else break;
    }
}

/* a rule definition starts here: NAME ::= */
static int at_definition(const gbp *p) {
    const char *s = p->s;
    if (s >= p->end || !is_name((unsigned char)*s)) return 0;
    while (s < p->end && is_name((unsigned char)*s)) s++;
    while (s < p->end && (*s == ' ' || *s == '\t')) s++;
    return p->end - s >= 3 && !memcmp(s, "::=", 3);
}

static int hex_digits(gbp *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (p->s >= p->end) return fail_at(p, "%san escape ends early", NULL);
        const char c = *p->s++;
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail_at(p, "%sa hex digit is expected in an escape", NULL);
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* one character of a literal or a class: an escape or a UTF-8 sequence */
static int read_char(gbp *p, uint32_t *cp) {
    if (p->s >= p->end) return fail_at(p, "%sthe text ends inside a literal or class", NULL);
    unsigned char c = (unsigned char)*p->s++;
    if (c == '\\') {
        if (p->s >= p->end) return fail_at(p, "%sthe text ends inside an escape", NULL);
        c = (unsigned char)*p->s++;
        switch (c) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case 'x': return hex_digits(p, 2, cp);
        case 'u': return hex_digits(p, 4, cp);
        case 'U': return hex_digits(p, 8, cp);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '.': case '/':
            *cp = c;
            return 0;
        default: return fail_at(p, "%san unknown escape", NULL);
        }
    }
    if (c < 0x80) {
        *cp = c;
        return 0;
    }
    const int need = c >= 0xF0 && c < 0xF8 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 ? 1 : -1;
    if (need < 0 || c >= 0xF8) return fail_at(p, "%sinvalid UTF-8", NULL);
    uint32_t v = c & (0x3Fu >> need);
    for (int i = 0; i < need; i++) {
        if (p->s >= p->end || ((unsigned char)*p->s & 0xC0) != 0x80) return fail_at(p, "%sinvalid UTF-8", NULL);
        v = v << 6 | ((unsigned char)*p->s++ & 0x3Fu);
    }
    *cp = v;
    return 0;
}

static int parse_alternatives(gbp *p, el_vec *b);

/* append n copies of the atom x[0, nx) */
static int emit_copies(gbp *p, el_vec *b, const gb_el *x, int32_t nx, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        for (int32_t i = 0; i < nx; i++)
            if (push_el(p, b, x[i]) < 0) return -1;
    return 0;
}

/* a new rule R ::= x R | (empty) (star), or x | (empty) (option, then: R ::= x next | ... ) */
static int32_t rule_of(gbp *p, const gb_el *x, int32_t nx, int32_t tail) {
    char name[32];
    snprintf(name, sizeof name, "(%d)", p->n_rules);
    const int32_t r = new_rule(p, name, strlen(name));
    if (r < 0) return -1;
    p->rules[r].defined = 1;
    el_vec *rb = &p->rules[r].body;
    if (emit_copies(p, rb, x, nx, 1) < 0) return -1;
    if (tail == -2 && push_el(p, rb, (gb_el){GB_REF, 0, 0, (uint32_t)r}) < 0) return -1; /* star: itself */
    if (tail >= 0 && push_el(p, rb, (gb_el){GB_REF, 0, 0, (uint32_t)tail}) < 0) return -1;
    if (push_el(p, rb, (gb_el){GB_ALT, 0, 0, 0}) < 0 || push_el(p, rb, (gb_el){GB_END, 0, 0, 0}) < 0) return -1;
    return r;
}

static int parse_count(gbp *p, int64_t *v) {
    skip_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return fail_at(p, "%sa count is expected in {}", NULL);
    int64_t n = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        n = n * 10 + (*p->s++ - '0');
        if (n > GB_MAX_REPEAT) return fail_at(p, "%sa repetition count over 1000", NULL);
    }
    *v = n;
    return 0;
}

/* the postfix operator after the atom b->v[a0, b->n), if any */
static int parse_postfix(gbp *p, el_vec *b, int32_t a0) {
    if (p->s >= p->end) return 0;
    const char op = *p->s;
    int64_t lo, hi; /* hi -1: unbounded */
    if (op == '*') lo = 0, hi = -1, p->s++;
    else if (op == '+') lo = 1, hi = -1, p->s++;
    else if (op == '?') lo = 0, hi = 1, p->s++;
    else if (op == '{') {
        p->s++;
        if (parse_count(p, &lo) < 0) return -1;
        skip_ws(p);
        hi = lo;
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            skip_ws(p);
            hi = -1;
            if (p->s < p->end && *p->s != '}' && parse_count(p, &hi) < 0) return -1;
            skip_ws(p);
        }
        if (p->s >= p->end || *p->s != '}') return fail_at(p, "%s'}' is expected", NULL);
        p->s++;
        if (hi >= 0 && hi < lo) return fail_at(p, "%sa repetition's maximum is below its minimum", NULL);
    } else return 0;
    const int32_t nx = b->n - a0;
    gb_el *x = malloc((size_t)nx * sizeof *x);
    if (!x) return fail_at(p, "%sout of memory", NULL);
    memcpy(x, b->v + a0, (size_t)nx * sizeof *x);
    b->n = a0;
    int rc = emit_copies(p, b, x, nx, lo);
    if (rc == 0 && hi < 0) { /* then x* */
        const int32_t r = rule_of(p, x, nx, -2);
        rc = r < 0 ? -1 : push_el(p, b, (gb_el){GB_REF, 0, 0, (uint32_t)r});
    } else if (rc == 0 && hi > lo) { /* then hi - lo nested options */
        int32_t r = -1;
        for (int64_t k = 0; k < hi - lo && rc == 0; k++) {
            r = rule_of(p, x, nx, r);
            if (r < 0) rc = -1;
        }
        if (rc == 0) rc = push_el(p, b, (gb_el){GB_REF, 0, 0, (uint32_t)r});
    }
    free(x);
    return rc;
}

/* a sequence: atoms (each maybe with a postfix) up to '|', ')', the next definition or the end */
static int parse_sequence(gbp *p, el_vec *b) {
    for (;;) {
        skip_ws(p);
        if (p->failed) return -1;
        if (p->s >= p->end || *p->s == '|' || *p->s == ')' || at_definition(p)) return 0;
        const int32_t a0 = b->n;
        const char c = *p->s;
        if (c == '"') {
            p->s++;
            while (p->s < p->end && *p->s != '"') {
                uint32_t cp;
                if (read_char(p, &cp) < 0) return -1;
                const int32_t r = add_range(p, cp, cp);
                if (r < 0 || push_el(p, b, (gb_el){GB_CHAR, 0, 1, (uint32_t)r}) < 0) return -1;
            }
            if (p->s >= p->end) return fail_at(p, "%sa literal is not closed", NULL);
            p->s++;
            if (b->n == a0) continue; /* "" matches the empty text: nothing to repeat */
        } else if (c == '[') {
            p->s++;
            int neg = 0;
            if (p->s < p->end && *p->s == '^') neg = 1, p->s++;
            const int32_t r0 = p->n_rng;
            while (p->s < p->end && *p->s != ']') {
                uint32_t lo, hi;
                if (read_char(p, &lo) < 0) return -1;
                hi = lo;
                if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
                    p->s++;
                    if (read_char(p, &hi) < 0) return -1;
                    if (hi < lo) return fail_at(p, "%sa character range runs backwards", NULL);
                }
                if (add_range(p, lo, hi) < 0) return -1;
            }
            if (p->s >= p->end) return fail_at(p, "%sa character class is not closed", NULL);
            p->s++;
            if (!neg && p->n_rng == r0) return fail_at(p, "%san empty character class", NULL);
            if (push_el(p, b, (gb_el){GB_CHAR, (uint8_t)neg, (uint16_t)(p->n_rng - r0), (uint32_t)r0}) < 0) return -1;
            if (p->n_rng - r0 > 65535) return fail_at(p, "%sa character class with too many ranges", NULL);
        } else if (c == '.') {
            p->s++;
            if (push_el(p, b, (gb_el){GB_CHAR, 1, 0, 0}) < 0) return -1;
        } else if (c == '(') {
            p->s++;
            if (++p->nest > GB_MAX_NEST) return fail_at(p, "%sgroups nested more than 64 deep", NULL);
            char name[32];
            snprintf(name, sizeof name, "(%d)", p->n_rules);
            const int32_t r = new_rule(p, name, strlen(name));
            if (r < 0) return -1;
            p->rules[r].defined = 1;
            el_vec body = {0};
            const int rc = parse_alternatives(p, &body);
            p->rules[r].body = body; /* (rules may have moved) */
            if (rc < 0) return -1;
            skip_ws(p);
            if (p->s >= p->end || *p->s != ')') return fail_at(p, "%s')' is expected", NULL);
            p->s++;
            p->nest--;
            if (push_el(p, b, (gb_el){GB_REF, 0, 0, (uint32_t)r}) < 0) return -1;
        } else if (is_name((unsigned char)c)) {
            const char *n0 = p->s;
            while (p->s < p->end && is_name((unsigned char)*p->s)) p->s++;
            const int32_t r = rule_named(p, n0, (size_t)(p->s - n0));
            if (r < 0 || push_el(p, b, (gb_el){GB_REF, 0, 0, (uint32_t)r}) < 0) return -1;
        } else {
            char what[8];
            snprintf(what, sizeof what, "%c", c);
            return fail_at(p, "unexpected '%s'", what);
        }
        if (parse_postfix(p, b, a0) < 0) return -1;
    }
}

/* alternatives: sequences separated by '|', then GB_END */
static int parse_alternatives(gbp *p, el_vec *b) {
    if (parse_sequence(p, b) < 0) return -1;
    for (;;) {
        skip_ws(p);
        if (p->s >= p->end || *p->s != '|') break;
        p->s++;
        if (push_el(p, b, (gb_el){GB_ALT, 0, 0, 0}) < 0 || parse_sequence(p, b) < 0) return -1;
    }
    return push_el(p, b, (gb_el){GB_END, 0, 0, 0});
}

/* whether rule r can match the empty text, given what is known (a fixed point) */
static int alt_nullable(const gram_gbnf *G, int32_t i, const uint8_t *nullable) {
    for (; G->el[i].kind != GB_ALT && G->el[i].kind != GB_END; i++)
        if (G->el[i].kind == GB_CHAR || !nullable[G->el[i].a]) return 0;
    return 1;
}

static int32_t next_alt(const gram_gbnf *G, int32_t i) {
    while (G->el[i].kind != GB_ALT && G->el[i].kind != GB_END) i++;
    return G->el[i].kind == GB_ALT ? i + 1 : -1;
}

/* left recursion: a rule reached again at the left edge of its own expansion (through rules
 * that may match nothing). state: 0 new, 1 on the path, 2 done */
static int32_t left_cycle(const gram_gbnf *G, int32_t r, const uint8_t *nullable, uint8_t *state) {
    if (state[r] == 1) return r;
    if (state[r] == 2) return -1;
    state[r] = 1;
    for (int32_t a = G->rule[r]; a >= 0; a = next_alt(G, a))
        for (int32_t i = a; G->el[i].kind != GB_ALT && G->el[i].kind != GB_END; i++) {
            if (G->el[i].kind == GB_CHAR) break;
            const int32_t c = left_cycle(G, (int32_t)G->el[i].a, nullable, state);
            if (c >= 0) return c;
            if (!nullable[G->el[i].a]) break;
        }
    state[r] = 2;
    return -1;
}

void st_gram_gbnf_free(gram_gbnf *G) {
    if (!G) return;
    free(G->el);
    free(G->rng);
    free(G->rule);
    free(G);
}

st_status st_gram_gbnf_compile(const char *text, size_t len, st_gram_schema **out, st_error *err) {
    *out = NULL;
    gbp p = {text, text + len, err, 0, NULL, 0, 0, NULL, 0, 0, 0, text};
    skip_ws(&p);
    if (p.s >= p.end) fail_at(&p, "%sno rules", NULL);
    while (!p.failed && p.s < p.end) {
        if (!at_definition(&p)) {
            fail_at(&p, "%sa rule definition (NAME ::= ...) is expected", NULL);
            break;
        }
        const char *n0 = p.s;
        while (is_name((unsigned char)*p.s)) p.s++;
        const int32_t r = rule_named(&p, n0, (size_t)(p.s - n0));
        if (r < 0) break;
        if (p.rules[r].defined) {
            fail_at(&p, "rule '%s' is defined twice", p.rules[r].name);
            break;
        }
        p.rules[r].defined = 1;
        while (*p.s != ':') p.s++;
        p.s += 3;
        el_vec body = {0};
        const int rc = parse_alternatives(&p, &body);
        p.rules[r].body = body;
        if (rc < 0) break;
        skip_ws(&p);
        if (p.s < p.end && *p.s == ')') fail_at(&p, "%san unmatched ')'", NULL);
    }
    gram_gbnf *G = NULL;
    int32_t root = -1;
    for (int32_t i = 0; !p.failed && i < p.n_rules; i++) {
        if (!p.rules[i].defined) fail_at(&p, "rule '%s' is used but never defined", p.rules[i].name);
        if (!strcmp(p.rules[i].name, "root")) root = i;
    }
    if (!p.failed && root < 0) fail_at(&p, "%sthere is no rule 'root'", NULL);
    if (!p.failed) {
        G = calloc(1, sizeof *G);
        int64_t total = 0;
        for (int32_t i = 0; i < p.n_rules; i++) total += p.rules[i].body.n;
        if (total >= 65535) fail_at(&p, "%sthe grammar has more than 65,534 elements", NULL);
        else if (!G || !(G->el = malloc((size_t)total * sizeof *G->el)) || !(G->rule = malloc((size_t)p.n_rules * sizeof *G->rule)))
            fail_at(&p, "%sout of memory", NULL);
        else {
            for (int32_t i = 0; i < p.n_rules; i++) {
                G->rule[i] = G->n_el;
                memcpy(G->el + G->n_el, p.rules[i].body.v, (size_t)p.rules[i].body.n * sizeof *G->el);
                G->n_el += p.rules[i].body.n;
            }
            G->n_rules = p.n_rules;
            G->root = root;
            G->rng = p.rng, G->n_rng = p.n_rng;
            p.rng = NULL;
        }
    }
    if (!p.failed) { /* no left recursion */
        uint8_t *nullable = calloc((size_t)G->n_rules, 1), *state = calloc((size_t)G->n_rules, 1);
        if (!nullable || !state) fail_at(&p, "%sout of memory", NULL);
        for (int changed = 1; !p.failed && changed;) {
            changed = 0;
            for (int32_t r = 0; r < G->n_rules; r++)
                if (!nullable[r])
                    for (int32_t a = G->rule[r]; a >= 0; a = next_alt(G, a))
                        if (alt_nullable(G, a, nullable)) {
                            nullable[r] = 1, changed = 1;
                            break;
                        }
        }
        for (int32_t r = 0; !p.failed && r < G->n_rules; r++) {
            const int32_t c = left_cycle(G, r, nullable, state);
            if (c >= 0) {
                char name[64];
                snprintf(name, sizeof name, "%s", p.rules[c].name);
                p.s = p.end;
                fail_at(&p, name[0] == '(' ? "a group or repetition is left-recursive%s" : "rule '%s' is left-recursive", name[0] == '(' ? "" : name);
            }
        }
        free(nullable);
        free(state);
    }
    for (int32_t i = 0; i < p.n_rules; i++) free(p.rules[i].body.v);
    free(p.rules);
    free(p.rng);
    if (p.failed) {
        st_gram_gbnf_free(G);
        return ST_ERR_ARG;
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the elements, ranges and rule starts */
    const struct {
        const void *p;
        size_t n;
    } parts[3] = {{G->el, (size_t)G->n_el * sizeof *G->el}, {G->rng, (size_t)G->n_rng * 2 * sizeof *G->rng},
                  {G->rule, (size_t)G->n_rules * sizeof *G->rule}};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < parts[k].n; i++) h = (h ^ ((const uint8_t *)parts[k].p)[i]) * 1099511628211ull;
    h ^= (uint64_t)G->root << 32;
    G->hash = h ? h : 1;
    st_gram_schema *sc = calloc(1, sizeof *sc);
    if (!sc) {
        st_gram_gbnf_free(G);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    sc->gb = G;
    *out = sc;
    return ST_OK;
}

/* ---- matching ---- */

static int set_has(const gram_gbnf *G, const gb_el *e, uint32_t cp) {
    int in = 0;
    for (uint32_t i = 0; i < e->n_rng && !in; i++) in = cp >= G->rng[2 * (e->a + i)] && cp <= G->rng[2 * (e->a + i) + 1];
    return in != e->neg;
}

/* add the stack stk[0, len) to s unless it is there or s is full */
static void add_stack(st_gram_gbnf *s, const uint16_t *stk, int len) {
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] - s->off[i] == len && !memcmp(s->cells + s->off[i], stk, (size_t)len * sizeof *stk)) return;
    if (s->n == ST_GRAM_GB_STACKS || s->off[s->n] + len > ST_GRAM_GB_CELLS) {
        s->dropped = 1;
        return;
    }
    memcpy(s->cells + s->off[s->n], stk, (size_t)len * sizeof *stk);
    s->off[s->n + 1] = (uint16_t)(s->off[s->n] + len);
    s->n++;
}

static int is_tail(const gram_gbnf *G, int32_t i) { return G->el[i].kind == GB_ALT || G->el[i].kind == GB_END; }

/* stk with its top expanded until the top is a character set (or the stack is empty), into s;
 * calls: how deep this expansion has gone (a chain of references longer than GB_MAX_CALLS is
 * dropped: the C stack stays small whatever the grammar) */
#define GB_MAX_CALLS 256
static void expand_at(const gram_gbnf *G, st_gram_gbnf *s, const uint16_t *stk, int len, int calls);
static void expand(const gram_gbnf *G, st_gram_gbnf *s, const uint16_t *stk, int len) { expand_at(G, s, stk, len, 0); }

static void expand_at(const gram_gbnf *G, st_gram_gbnf *s, const uint16_t *stk, int len, int calls) {
    if (len == 0 || G->el[stk[len - 1]].kind == GB_CHAR) {
        add_stack(s, stk, len);
        return;
    }
    if (calls == GB_MAX_CALLS) {
        s->dropped = 1;
        return;
    }
    uint16_t base[ST_GRAM_GB_DEPTH + 1];
    const int32_t top = stk[len - 1], r = (int32_t)G->el[top].a;
    memcpy(base, stk, (size_t)(len - 1) * sizeof *base);
    int bl = len - 1;
    if (!is_tail(G, top + 1)) base[bl++] = (uint16_t)(top + 1); /* where the reference returns */
    for (int32_t a = G->rule[r]; a >= 0; a = next_alt(G, a)) {
        if (is_tail(G, a)) {
            expand_at(G, s, base, bl, calls + 1); /* an empty alternative */
            continue;
        }
        if (bl == ST_GRAM_GB_DEPTH) {
            s->dropped = 1;
            continue;
        }
        base[bl] = (uint16_t)a;
        expand_at(G, s, base, bl + 1, calls + 1);
    }
}

void st_gram_gbnf_start(const gram_gbnf *G, st_gram_gbnf *s) {
    memset(s, 0, offsetof(st_gram_gbnf, cells));
    s->started = 1;
    uint16_t ref[1];
    /* a stack holding a reference to root: expanding it gives root's alternatives */
    for (int32_t a = G->rule[G->root]; a >= 0; a = next_alt(G, a)) {
        if (is_tail(G, a)) add_stack(s, ref, 0);
        else {
            ref[0] = (uint16_t)a;
            expand(G, s, ref, 1);
        }
    }
}

/* every stack advanced by the code point cp (into a fresh set): 1 when one survives */
static int step(const gram_gbnf *G, st_gram_gbnf *s, uint32_t cp) {
    st_gram_gbnf in;
    memcpy(&in, s, offsetof(st_gram_gbnf, cells) + (size_t)s->off[s->n] * sizeof s->cells[0]);
    s->n = 0;
    s->off[0] = 0;
    uint16_t stk[ST_GRAM_GB_DEPTH];
    for (int i = 0; i < in.n; i++) {
        const int len = in.off[i + 1] - in.off[i];
        if (len == 0) continue;
        const uint16_t *st = in.cells + in.off[i];
        const int32_t top = st[len - 1];
        if (!set_has(G, &G->el[top], cp)) continue;
        memcpy(stk, st, (size_t)(len - 1) * sizeof *stk);
        int nl = len - 1;
        if (!is_tail(G, top + 1)) stk[nl++] = (uint16_t)(top + 1);
        expand(G, s, stk, nl);
    }
    return s->n > 0;
}

/* whether the set e holds a code point in [lo, hi] */
static int set_meets(const gram_gbnf *G, const gb_el *e, uint32_t lo, uint32_t hi) {
    const uint32_t *rg = e->n_rng ? G->rng + 2 * e->a : NULL; /* (a grammar of "." alone has no ranges) */
    if (!e->neg) {
        for (uint32_t i = 0; i < e->n_rng; i++)
            if (rg[2 * i] <= hi && rg[2 * i + 1] >= lo) return 1;
        return 0;
    }
    /* negated: unless its ranges cover [lo, hi] whole */
    for (uint32_t at = lo;;) {
        uint32_t i = 0;
        while (i < e->n_rng && !(rg[2 * i] <= at && rg[2 * i + 1] >= at)) i++;
        if (i == e->n_rng) return 1;
        if (rg[2 * i + 1] >= hi) return 0;
        at = rg[2 * i + 1] + 1;
    }
}

int st_gram_gbnf_takes_range(const gram_gbnf *G, const st_gram_gbnf *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] > s->off[i] && set_meets(G, &G->el[s->cells[s->off[i + 1] - 1]], lo, hi)) return 1;
    return 0;
}

/* within a character: whether a stack may take some code point that starts with the bytes so far */
static int prefix_fits(const gram_gbnf *G, const st_gram_gbnf *s) {
    const int bits = 6 * s->need;
    uint32_t lo = s->cp << bits, hi = lo | ((1u << bits) - 1);
    if (lo < s->lo) lo = s->lo;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return 0;
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] > s->off[i] && set_meets(G, &G->el[s->cells[s->off[i + 1] - 1]], lo, hi)) return 1;
    return 0;
}

int st_gram_gbnf_feed1(const gram_gbnf *G, st_gram_gbnf *s, unsigned char b) {
    if (!s->started) st_gram_gbnf_start(G, s);
    if (s->need) {
        if ((b & 0xC0) != 0x80) return 0;
        s->cp = s->cp << 6 | (b & 0x3Fu);
        if (--s->need) return prefix_fits(G, s);
        if (s->cp < s->lo || (s->cp >= 0xD800 && s->cp <= 0xDFFF) || s->cp > 0x10FFFF) return 0;
        return step(G, s, s->cp);
    }
    if (b < 0x80) return step(G, s, b);
    const int need = b >= 0xF0 && b < 0xF5 ? 3 : b >= 0xE0 && b < 0xF0 ? 2 : b >= 0xC2 && b < 0xE0 ? 1 : 0;
    if (!need) return 0;
    s->need = (uint8_t)need;
    s->lo = need == 1 ? 0x80 : need == 2 ? 0x800 : 0x10000;
    s->cp = b & (0x3Fu >> need);
    return prefix_fits(G, s);
}

int st_gram_gbnf_accepting(const st_gram_gbnf *s) {
    if (!s->started || s->need) return 0;
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] == s->off[i]) return 1;
    return 0;
}

int st_gram_gbnf_more(const st_gram_gbnf *s) {
    if (!s->started || s->need) return 1;
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] > s->off[i]) return 1;
    return 0;
}

void st_gram_gbnf_copy(st_gram_gbnf *dst, const st_gram_gbnf *src) {
    memcpy(dst, src, offsetof(st_gram_gbnf, cells) + (size_t)src->off[src->n] * sizeof src->cells[0]);
}

/* ---- JSON-schema patterns: a regular expression as a GBNF grammar ----
 * The subset (ECMA-262's, as JSON schemas write them): literals, '.', classes [...] / [^...],
 * \d \w \s (and \D \W \S outside classes), escaped punctuation, \n \t \r \f \v \uHHHH, groups
 * ( ) and (?: ), '|', * + ? {m} {m,} {m,n} (a lazy '?' after them is read past), '^' at the
 * start and '$' at the end. A pattern matches anywhere in the string unless anchored, so the
 * grammar is  root ::= .* ( R ) .*  with the unanchored sides. Lookarounds, backreferences,
 * \b and anchors elsewhere are refused, naming them. */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int bad;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->bad) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* one literal character (its bytes) as a GBNF literal */
static void sb_lit(sbuf *b, const char *c, size_t n) {
    char t[8];
    if (n == 1 && ((unsigned char)c[0] < 0x20 || c[0] == 0x7f)) {
        snprintf(t, sizeof t, "\"\\x%02x\"", (unsigned char)c[0]);
        sb_str(b, t);
        return;
    }
    sb_str(b, "\"");
    if (n == 1 && (c[0] == '"' || c[0] == '\\')) sb_str(b, "\\");
    sb_put(b, c, n);
    sb_str(b, "\"");
}

static int utf8_len(unsigned char c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

static const char *class_of(char e) {
    switch (e) {
    case 'd': return "0-9";
    case 'w': return "a-zA-Z0-9_";
    case 's': return " \\t\\n\\r\\x0c\\x0b";
    default: return NULL;
    }
}

st_status gram_pattern_compile(const char *re, size_t len, gram_gbnf **out, st_error *err) {
    *out = NULL;
    sbuf b = {0};
    size_t i = 0, end = len;
    const int start_anchor = len > 0 && re[0] == '^';
    if (start_anchor) i = 1;
    int end_anchor = 0;
    if (end > i && re[end - 1] == '$' && !(end >= 2 && re[end - 2] == '\\')) end_anchor = 1, end--;
    sb_str(&b, start_anchor ? "root ::= (" : "root ::= .* (");
    const char *why = NULL;
    int depth = 0;
    while (i < end && !why) {
        const char c = re[i];
        if (c != '|' && c != '*' && c != '+' && c != '?' && c != '{' && c != ')') sb_str(&b, " "); /* before an atom */
        if (c == '\\') {
            if (i + 1 >= end) {
                why = "a trailing backslash";
                break;
            }
            const char e = re[i + 1];
            i += 2;
            const char *cl = class_of((char)(e | 0x20));
            if (cl) {
                sb_str(&b, e >= 'a' ? "[" : "[^");
                sb_str(&b, cl);
                sb_str(&b, "]");
            } else if (e == 'n' || e == 't' || e == 'r' || e == 'f' || e == 'v') {
                const char v = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'f' ? '\f' : '\v';
                sb_lit(&b, &v, 1);
            } else if (e == 'u') {
                if (i + 4 > end) {
                    why = "a \\u escape without 4 hex digits";
                    break;
                }
                sb_str(&b, "\"\\u");
                sb_put(&b, re + i, 4);
                sb_str(&b, "\"");
                i += 4;
            } else if ((e >= '0' && e <= '9') || e == 'b' || e == 'B' || e == 'k' || e == 'p' || e == 'P') {
                why = e == 'b' || e == 'B' ? "a word boundary (\\b)" : "a backreference or property escape";
            } else if ((unsigned char)e < 0x80) {
                sb_lit(&b, &e, 1);
            } else {
                why = "an escaped non-ASCII character";
            }
        } else if (c == '[') {
            size_t j = i + 1;
            sb_str(&b, "[");
            if (j < end && re[j] == '^') sb_str(&b, "^"), j++;
            int first = 1;
            while (j < end && (re[j] != ']' || first) && !why) {
                first = 0;
                if (re[j] == '\\' && j + 1 < end) {
                    const char e = re[j + 1];
                    const char *cl = class_of(e);
                    if (cl) sb_str(&b, cl);
                    else if (e >= 'A' && e <= 'Z' && class_of((char)(e | 0x20))) why = "\\D, \\W or \\S inside a class";
                    else if (e == 'n' || e == 't' || e == 'r') {
                        const char t[3] = {'\\', e, 0};
                        sb_str(&b, t);
                    } else if (e == 'u' && j + 6 <= end) {
                        sb_str(&b, "\\u");
                        sb_put(&b, re + j + 2, 4);
                        j += 4;
                    } else if ((unsigned char)e < 0x80 && !(e >= '0' && e <= '9')) {
                        const char t[3] = {'\\', e, 0};
                        if (e == '"' || e == '\\' || e == ']' || e == '-' || e == '^' || e == '[') sb_str(&b, t);
                        else sb_put(&b, &e, 1);
                    } else why = "an escape in a class";
                    j += 2;
                } else if (re[j] == '"') {
                    sb_str(&b, "\\\"");
                    j++;
                } else if (re[j] == '[') {
                    sb_str(&b, "\\[");
                    j++;
                } else {
                    const int n = utf8_len((unsigned char)re[j]);
                    sb_put(&b, re + j, (size_t)n);
                    j += (size_t)n;
                }
            }
            if (j >= end) why = why ? why : "a class that is not closed";
            sb_str(&b, "]");
            i = j + 1;
        } else if (c == '(') {
            if (i + 1 < end && re[i + 1] == '?') {
                if (i + 2 < end && re[i + 2] == ':') i += 3;
                else {
                    why = "a lookaround or named group ((?...)";
                    break;
                }
            } else i++;
            depth++;
            sb_str(&b, "(");
        } else if (c == ')') {
            if (--depth < 0) why = "an unmatched ')'";
            sb_str(&b, ")");
            i++;
        } else if (c == '|' || c == '*' || c == '+' || c == '?') {
            const char t[4] = {c == '|' ? ' ' : c, c == '|' ? '|' : 0, c == '|' ? ' ' : 0, 0}; /* a postfix right after its atom */
            sb_str(&b, t);
            i++;
            if (c != '|' && i < end && re[i] == '?') i++; /* lazy: the same language */
        } else if (c == '{') {
            size_t j = i + 1;
            while (j < end && ((re[j] >= '0' && re[j] <= '9') || re[j] == ',')) j++;
            if (j < end && re[j] == '}' && j > i + 1) {
                sb_put(&b, re + i, j - i + 1);
                i = j + 1;
                if (i < end && re[i] == '?') i++;
            } else { /* a literal brace */
                sb_lit(&b, "{", 1);
                i++;
            }
        } else if (c == '.') {
            sb_str(&b, "[^\\n\\r]");
            i++;
        } else if (c == '^' || c == '$') {
            why = "an anchor ('^' or '$') inside the pattern";
        } else {
            const int n = utf8_len((unsigned char)c);
            sb_lit(&b, re + i, i + (size_t)n <= end ? (size_t)n : end - i);
            i += (size_t)n;
        }
    }
    if (!why && depth) why = "a group that is not closed";
    sb_str(&b, end_anchor ? ")" : ") .*");
    if (b.bad) why = "out of memory";
    if (why) {
        free(b.p);
        return st_error_set(err, ST_ERR_ARG, "'pattern': %s is not supported", why);
    }
    st_gram_schema *sc = NULL;
    st_error e2 = {0};
    const st_status st = st_gram_gbnf_compile(b.p, b.n, &sc, &e2);
    free(b.p);
    if (st != ST_OK) return st_error_set(err, ST_ERR_ARG, "'pattern' is not a regular expression strand reads (%s)", e2.msg);
    *out = sc->gb;
    sc->gb = NULL;
    st_gram_schema_free(sc);
    return ST_OK;
}
