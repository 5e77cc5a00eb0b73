/* ==== JSON schemas compiled for the automaton (see grammar.h) ==== */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

#define MAX_NODES 30000 /* a state names a node in 16 bits */
#define MAX_NEST 64     /* schemas inside schemas */

typedef struct def_entry {
    const char *name;    /* borrowed from the parsed document */
    json_t *schema;      /* borrowed */
    int32_t node;        /* -4: not compiled yet */
} def_entry;

typedef struct compiler {
    st_gram_schema *s;
    int32_t cap_nodes, cap_props, cap_lits;
    size_t n_alt_ids, cap_alt_ids;
    int32_t *alt_ids;    /* every anyOf's alternatives, in order */
    int32_t *alt_first;  /* [n_nodes] where a GK_ANYOF's alternatives begin in alt_ids (compile time) */
    int32_t *alt_count;
    def_entry *defs;
    int n_defs;
    int strict;
    st_error *err;
    int failed;
} compiler;

static int fail(compiler *c, const char *fmt, const char *arg) {
    if (!c->failed) st_error_set(c->err, ST_ERR_ARG, fmt, arg ? arg : "");
    c->failed = 1;
    return -100;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return 0;
    int32_t n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int32_t new_node(compiler *c, int kind) {
    st_gram_schema *s = c->s;
    if (s->n_nodes >= MAX_NODES) return fail(c, "the schema has too many parts (more than %s)", "30000");
    int32_t old_cap = c->cap_nodes;
    if (grow((void **)&s->nodes, &c->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) return fail(c, "out of memory%s", NULL);
    if (c->cap_nodes != old_cap) {
        int32_t cap = old_cap;
        if (grow((void **)&c->alt_first, &cap, c->cap_nodes, sizeof *c->alt_first)) return fail(c, "out of memory%s", NULL);
        cap = old_cap;
        if (grow((void **)&c->alt_count, &cap, c->cap_nodes, sizeof *c->alt_count)) return fail(c, "out of memory%s", NULL);
    }
    const int32_t id = s->n_nodes++;
    gram_node *n = &s->nodes[id];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->extra = GRAM_ANY;
    n->items = GRAM_ANY;
    n->max_items = INT64_MAX;
    c->alt_first[id] = -1;
    c->alt_count[id] = 0;
    return id;
}

/* text into the pool: its offset */
static int64_t pool_put(compiler *c, const char *t, size_t len) {
    st_gram_schema *s = c->s;
    if (len == 0) return (int64_t)s->pool_used; /* an empty key */
    if (s->pool_used + len > UINT32_MAX) return fail(c, "the schema's texts are too long%s", NULL);
    if (s->pool_used + len > s->pool_cap) {
        size_t n = s->pool_cap ? s->pool_cap * 2 : 1024;
        while (n < s->pool_used + len) n *= 2;
        char *q = realloc(s->pool, n);
        if (!q) return fail(c, "out of memory%s", NULL);
        s->pool = q;
        s->pool_cap = n;
    }
    memcpy(s->pool + s->pool_used, t, len);
    s->pool_used += len;
    return (int64_t)(s->pool_used - len);
}

static const char *const annotations[] = {"title", "description", "default", "$schema", "$id", "examples",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "strict", "name"};

static int known(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static int32_t compile(compiler *c, json_t *sc, int nest);

/* an integer bound: minimum / exclusiveMinimum (and the maximums) */
static int int_bound(compiler *c, json_t *sc, const char *key, int exclusive, int upper, gram_node *n) {
    json_t *v = json_object_get(sc, key);
    if (!v) return 0;
    if (!json_is_number(v)) return fail(c, "'%s' must be a number", key);
    const double x = json_number_value(v);
    if (!(x <= 9e14 && x >= -9e14)) return fail(c, "'%s' is beyond the integers strand writes (15 digits)", key);
    int64_t b = (int64_t)(upper ? floor(x) : ceil(x));
    if (exclusive && (double)b == x) b += upper ? -1 : 1;
    if (upper) {
        if (!n->has_max || b < n->max) n->max = b;
        n->has_max = 1;
    } else {
        if (!n->has_min || b > n->min) n->min = b;
        n->has_min = 1;
    }
    return 0;
}

static int32_t compile_typed(compiler *c, json_t *sc, const char *type, int nest) {
    const char *k;
    json_t *v;
    if (!strcmp(type, "object")) {
        int32_t id = new_node(c, GK_OBJECT);
        if (id < 0) return id;
        json_t *props = json_object_get(sc, "properties");
        if (props && !json_is_object(props)) return fail(c, "'properties' must be an object%s", NULL);
        const size_t np = props ? json_object_size(props) : 0;
        if (np > ST_GRAM_MAX_PROPS) return fail(c, "an object schema with more than %s properties", "64");
        const int32_t p0 = c->s->n_props;
        if (grow((void **)&c->s->props, &c->cap_props, p0 + (int32_t)np, sizeof *c->s->props)) return fail(c, "out of memory%s", NULL);
        c->s->n_props += (int32_t)np;
        int i = 0;
        json_object_foreach(props, k, v) {
            json_t *ks = json_string(k);
            char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            json_decref(ks);
            if (!enc) return fail(c, "out of memory%s", NULL);
            const size_t elen = strlen(enc) - 2;
            const int64_t off = pool_put(c, enc + 1, elen); /* between the quotes */
            free(enc);
            if (off < 0) return (int32_t)off;
            const int32_t pn = compile(c, v, nest + 1);
            if (c->failed) return -100;
            gram_prop *p = &c->s->props[p0 + i];
            p->off = (uint32_t)off;
            p->len = (uint32_t)elen;
            p->node = pn;
            i++;
        }
        gram_node *n = &c->s->nodes[id];
        n->prop0 = p0;
        n->n_props = (int32_t)np;
        json_t *req = json_object_get(sc, "required");
        if (req && !json_is_array(req)) return fail(c, "'required' must be a list of property names%s", NULL);
        size_t ri;
        json_array_foreach(req, ri, v) {
            const char *name = json_string_value(v);
            int found = -1, j = 0;
            const char *pk;
            json_t *pv;
            json_object_foreach(props, pk, pv) {
                if (name && !strcmp(pk, name)) found = j;
                j++;
            }
            if (found < 0) return fail(c, "'required' names '%s', which is not among the properties", name ? name : "?");
            c->s->nodes[id].required |= 1ull << found;
        }
        json_t *ap = json_object_get(sc, "additionalProperties");
        int32_t extra = GRAM_ANY;
        if (json_is_false(ap)) extra = GRAM_NO_EXTRA;
        else if (ap && !json_is_true(ap)) extra = compile(c, ap, nest + 1);
        if (c->failed) return -100;
        c->s->nodes[id].extra = extra;
        static const char *const own[] = {"type", "properties", "required", "additionalProperties"};
        json_object_foreach(sc, k, v) {
            if (known(k, own, 4) || known(k, annotations, sizeof annotations / sizeof annotations[0])) continue;
            if (c->strict) return fail(c, "the object keyword '%s' is not supported", k);
        }
        return id;
    }
    if (!strcmp(type, "array")) {
        int32_t id = new_node(c, GK_ARRAY);
        if (id < 0) return id;
        json_t *it = json_object_get(sc, "items");
        int32_t items = GRAM_ANY;
        if (it && !json_is_object(it) && !json_is_boolean(it)) return fail(c, "'items' must be a schema (a list is not supported)%s", NULL);
        if (json_is_false(it)) items = GRAM_NONE;
        else if (it) items = compile(c, it, nest + 1);
        if (c->failed) return -100;
        gram_node *n = &c->s->nodes[id];
        n->items = items;
        json_t *mn = json_object_get(sc, "minItems"), *mx = json_object_get(sc, "maxItems");
        if (mn && (!json_is_integer(mn) || json_integer_value(mn) < 0)) return fail(c, "'minItems' must be a count%s", NULL);
        if (mx && (!json_is_integer(mx) || json_integer_value(mx) < 0)) return fail(c, "'maxItems' must be a count%s", NULL);
        if (mn) n->min_items = json_integer_value(mn);
        if (mx) n->max_items = json_integer_value(mx);
        if (items == GRAM_NONE) n->max_items = 0;
        if (n->min_items > n->max_items) return fail(c, "'minItems' exceeds 'maxItems'%s", NULL);
        static const char *const own[] = {"type", "items", "minItems", "maxItems"};
        json_object_foreach(sc, k, v) {
            if (known(k, own, 4) || known(k, annotations, sizeof annotations / sizeof annotations[0])) continue;
            if (c->strict) return fail(c, "the array keyword '%s' is not supported", k);
        }
        return id;
    }
    int kind = !strcmp(type, "string") ? GK_STRING : !strcmp(type, "integer") ? GK_INTEGER
             : !strcmp(type, "number") ? GK_NUMBER : !strcmp(type, "boolean") ? GK_BOOLEAN
             : !strcmp(type, "null") ? GK_NULL : -1;
    if (kind < 0) return fail(c, "'type' '%s' is not a JSON schema type", type);
    int32_t id = new_node(c, kind);
    if (id < 0) return id;
    if (kind == GK_STRING) {
        gram_node *n = &c->s->nodes[id];
        json_t *mn = json_object_get(sc, "minLength"), *mx = json_object_get(sc, "maxLength");
        if (mn && (!json_is_integer(mn) || json_integer_value(mn) < 0)) return fail(c, "'minLength' must be a count%s", NULL);
        if (mx && (!json_is_integer(mx) || json_integer_value(mx) < 0)) return fail(c, "'maxLength' must be a count%s", NULL);
        if (mn) n->min_items = json_integer_value(mn);
        if (mx) n->max_items = json_integer_value(mx);
        if (n->min_items > n->max_items) return fail(c, "'minLength' exceeds 'maxLength'%s", NULL);
        json_t *pt = json_object_get(sc, "pattern");
        if (pt && !json_is_string(pt)) return fail(c, "'pattern' must be a string%s", NULL);
        if (pt) {
            gram_gbnf *G = NULL;
            st_error perr = {0};
            if (gram_pattern_compile(json_string_value(pt), json_string_length(pt), &G, &perr) != ST_OK) {
                if (c->strict) return fail(c, "%s", perr.msg);
            } else {
                gram_gbnf **ps = realloc(c->s->pats, (size_t)(c->s->n_pats + 1) * sizeof *ps);
                if (!ps) {
                    st_gram_gbnf_free(G);
                    return fail(c, "out of memory%s", NULL);
                }
                c->s->pats = ps;
                ps[c->s->n_pats++] = G;
                c->s->nodes[id].pat = c->s->n_pats;
            }
        }
    }
    if (kind == GK_NUMBER) {
        gram_node *n = &c->s->nodes[id];
        static const char *const keys[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++) {
            json_t *bv = json_object_get(sc, keys[i]);
            if (!bv) continue;
            if (!json_is_number(bv)) return fail(c, "'%s' must be a number", keys[i]);
            const double x = json_number_value(bv);
            if (!(x <= 9e14 && x >= -9e14)) return fail(c, "'%s' is beyond the numbers strand writes (15 digits)", keys[i]);
            if (i < 2 && (!n->has_min || x > n->dmin || (x == n->dmin && i == 1))) n->dmin = x, n->has_min = 1, n->min_excl = i == 1;
            if (i >= 2 && (!n->has_max || x < n->dmax || (x == n->dmax && i == 3))) n->dmax = x, n->has_max = 1, n->max_excl = i == 3;
        }
        if (n->has_min && n->has_max && (n->dmin > n->dmax || (n->dmin == n->dmax && (n->min_excl || n->max_excl))))
            return fail(c, "no number lies between the minimum and the maximum%s", NULL);
    }
    if (kind == GK_INTEGER) {
        gram_node *n = &c->s->nodes[id];
        if (int_bound(c, sc, "minimum", 0, 0, n) || int_bound(c, sc, "maximum", 0, 1, n) ||
            int_bound(c, sc, "exclusiveMinimum", 1, 0, n) || int_bound(c, sc, "exclusiveMaximum", 1, 1, n))
            return -100;
        if (n->has_min && n->has_max && n->min > n->max) return fail(c, "no integer lies between 'minimum' and 'maximum'%s", NULL);
    }
    json_object_foreach(sc, k, v) {
        if (!strcmp(k, "type") || known(k, annotations, sizeof annotations / sizeof annotations[0])) continue;
        if (kind == GK_INTEGER && (!strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "exclusiveMinimum") ||
                                   !strcmp(k, "exclusiveMaximum")))
            continue;
        if (kind == GK_STRING && (!strcmp(k, "minLength") || !strcmp(k, "maxLength") || !strcmp(k, "pattern"))) continue;
        if (kind == GK_NUMBER && (!strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "exclusiveMinimum") ||
                                  !strcmp(k, "exclusiveMaximum")))
            continue;
        if (c->strict) {
            char what[160];
            snprintf(what, sizeof what, "the %s keyword '%s' is not supported", type, k);
            return fail(c, "%s", what);
        }
    }
    return id;
}

static int32_t add_anyof(compiler *c, const int32_t *alts, int n) {
    int32_t id = new_node(c, GK_ANYOF);
    if (id < 0) return id;
    if (c->n_alt_ids + (size_t)n > c->cap_alt_ids) {
        size_t cap = c->cap_alt_ids ? c->cap_alt_ids * 2 : 64;
        while (cap < c->n_alt_ids + (size_t)n) cap *= 2;
        int32_t *q = realloc(c->alt_ids, cap * sizeof *q);
        if (!q) return fail(c, "out of memory%s", NULL);
        c->alt_ids = q;
        c->cap_alt_ids = cap;
    }
    c->alt_first[id] = (int32_t)c->n_alt_ids;
    c->alt_count[id] = n;
    memcpy(c->alt_ids + c->n_alt_ids, alts, (size_t)n * sizeof *alts);
    c->n_alt_ids += (size_t)n;
    return id;
}

static int32_t compile(compiler *c, json_t *sc, int nest) {
    if (nest > MAX_NEST) return fail(c, "the schema nests deeper than %s levels", "64");
    if (json_is_true(sc)) return GRAM_ANY;
    if (json_is_false(sc)) return fail(c, "a schema 'false' accepts nothing%s", NULL);
    if (!json_is_object(sc)) return fail(c, "a schema must be an object%s", NULL);
    json_t *ref = json_object_get(sc, "$ref");
    if (ref) {
        const char *r = json_string_value(ref);
        const char *name = !r ? NULL : !strncmp(r, "#/$defs/", 8) ? r + 8 : !strncmp(r, "#/definitions/", 14) ? r + 14 : NULL;
        if (r && !strcmp(r, "#")) return 0; /* the root */
        if (!name) return fail(c, "'$ref' '%s' is not #/$defs/NAME or #/definitions/NAME", r ? r : "?");
        for (int i = 0; i < c->n_defs; i++) {
            if (strcmp(c->defs[i].name, name)) continue;
            if (c->defs[i].node == -4) { /* compiled through an alternative that forwards to it */
                const int32_t fwd[1] = {GRAM_ANY};
                const int32_t id = add_anyof(c, fwd, 1); /* a placeholder the definition fills */
                if (id < 0) return id;
                c->defs[i].node = id;
                const int32_t body = compile(c, c->defs[i].schema, nest + 1);
                if (c->failed) return -100;
                c->alt_ids[c->alt_first[id]] = body;
                return id;
            }
            return c->defs[i].node;
        }
        return fail(c, "'$ref' names '%s', which $defs does not hold", name);
    }
    json_t *en = json_object_get(sc, "enum"), *cn = json_object_get(sc, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) return fail(c, "'enum' must be a non-empty list%s", NULL);
        const size_t n = en ? json_array_size(en) : 1;
        if (n > ST_GRAM_MAX_LITS) return fail(c, "an enum of more than %s values", "64");
        int32_t id = new_node(c, GK_ENUM);
        if (id < 0) return id;
        const int32_t l0 = c->s->n_lits;
        if (grow((void **)&c->s->lits, &c->cap_lits, l0 + (int32_t)n, sizeof *c->s->lits)) return fail(c, "out of memory%s", NULL);
        for (size_t i = 0; i < n; i++) {
            char *t = json_dumps(en ? json_array_get(en, i) : cn, JSON_ENCODE_ANY | JSON_COMPACT);
            if (!t) return fail(c, "out of memory%s", NULL);
            const int64_t off = pool_put(c, t, strlen(t));
            const uint32_t len = (uint32_t)strlen(t);
            free(t);
            if (off < 0) return (int32_t)off;
            c->s->lits[l0 + (int32_t)i] = (gram_lit){(uint32_t)off, len};
        }
        /* the same text twice would never end */
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++) {
                const gram_lit *a = &c->s->lits[l0 + (int32_t)i], *b = &c->s->lits[l0 + (int32_t)j];
                if (a->len == b->len && !memcmp(c->s->pool + a->off, c->s->pool + b->off, a->len))
                    return fail(c, "'enum' lists a value twice%s", NULL);
            }
        c->s->n_lits += (int32_t)n;
        c->s->nodes[id].lit0 = l0;
        c->s->nodes[id].n_lits = (int32_t)n;
        return id;
    }
    json_t *any = json_object_get(sc, "anyOf");
    if (!any) any = json_object_get(sc, "oneOf");
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0 || json_array_size(any) > 16)
            return fail(c, "'anyOf' / 'oneOf' must list 1 to 16 schemas%s", NULL);
        int32_t alts[16];
        size_t i;
        json_t *v;
        json_array_foreach(any, i, v) {
            alts[i] = compile(c, v, nest + 1);
            if (c->failed) return -100;
        }
        if (json_array_size(any) == 1) return alts[0];
        return add_anyof(c, alts, (int)json_array_size(any));
    }
    json_t *ty = json_object_get(sc, "type");
    if (json_is_array(ty)) { /* one alternative a type */
        if (json_array_size(ty) == 0 || json_array_size(ty) > 7) return fail(c, "'type' must list 1 to 7 types%s", NULL);
        int32_t alts[7];
        size_t i;
        json_t *v;
        json_array_foreach(ty, i, v) {
            if (!json_is_string(v)) return fail(c, "'type' must list type names%s", NULL);
            alts[i] = compile_typed(c, sc, json_string_value(v), nest);
            if (c->failed) return -100;
        }
        if (json_array_size(ty) == 1) return alts[0];
        return add_anyof(c, alts, (int)json_array_size(ty));
    }
    if (ty && !json_is_string(ty)) return fail(c, "'type' must be a type name or a list of them%s", NULL);
    const char *t = json_string_value(ty);
    if (!t && json_object_get(sc, "properties")) t = "object";
    if (!t && json_object_get(sc, "items")) t = "array";
    if (t) return compile_typed(c, sc, t, nest);
    const char *k;
    json_t *v;
    json_object_foreach(sc, k, v) {
        if (known(k, annotations, sizeof annotations / sizeof annotations[0])) continue;
        if (c->strict) return fail(c, "the keyword '%s' is not supported", k);
    }
    return GRAM_ANY;
}

/* the first bytes a value of node id may start with (bits of first[256]) */
static void first_bytes(const compiler *c, int32_t id, uint8_t *first, int depth) {
    static const char numeric[] = "-0123456789";
    if (id == GRAM_ANY) {
        const char *all = "{[\"tfn-0123456789";
        for (const char *p = all; *p; p++) first[(unsigned char)*p] = 1;
        return;
    }
    if (id < 0 || depth > 64) return;
    const gram_node *n = &c->s->nodes[id];
    switch (n->kind) {
    case GK_ANY: first_bytes(c, GRAM_ANY, first, depth); break;
    case GK_OBJECT: first['{'] = 1; break;
    case GK_ARRAY: first['['] = 1; break;
    case GK_STRING: first['"'] = 1; break;
    case GK_INTEGER:
    case GK_NUMBER:
        for (const char *p = numeric; *p; p++) first[(unsigned char)*p] = 1;
        break;
    case GK_BOOLEAN: first['t'] = first['f'] = 1; break;
    case GK_NULL: first['n'] = 1; break;
    case GK_ENUM:
        for (int i = 0; i < n->n_lits; i++) first[(unsigned char)c->s->pool[c->s->lits[n->lit0 + i].off]] = 1;
        break;
    case GK_ANYOF:
        for (int i = 0; i < c->alt_count[id]; i++) first_bytes(c, c->alt_ids[c->alt_first[id] + i], first, depth + 1);
        break;
    }
}

/* an anyOf's alternative for byte b, following nested anyOfs: the node, GRAM_NONE, or -5
 * when two alternatives start with b */
static int32_t pick(const compiler *c, int32_t id, unsigned char b, int depth) {
    int32_t found = GRAM_NONE;
    for (int i = 0; i < c->alt_count[id]; i++) {
        int32_t a = c->alt_ids[c->alt_first[id] + i];
        uint8_t first[256] = {0};
        first_bytes(c, a, first, 0);
        if (!first[b]) continue;
        if (a >= 0 && c->s->nodes[a].kind == GK_ANYOF && depth < 64) a = pick(c, a, b, depth + 1);
        if (a == -5) return -5;
        if (found != GRAM_NONE) return -5;
        found = a;
    }
    return found;
}

/* every anyOf's dispatch table by first byte */
static void finish(compiler *cp) {
    int32_t n_any = 0;
    for (int32_t i = 0; !cp->failed && i < cp->s->n_nodes; i++) n_any += cp->s->nodes[i].kind == GK_ANYOF;
    if (!cp->failed && n_any) {
        cp->s->dispatch = malloc((size_t)n_any * 256 * sizeof *cp->s->dispatch);
        if (!cp->s->dispatch) fail(cp, "out of memory%s", NULL);
    }
    for (int32_t i = 0; !cp->failed && i < cp->s->n_nodes; i++) {
        gram_node *n = &cp->s->nodes[i];
        if (n->kind != GK_ANYOF) continue;
        n->disp = cp->s->n_disp++;
        for (int b = 0; b < 256 && !cp->failed; b++) {
            const int32_t to = pick(cp, i, (unsigned char)b, 0);
            if (to == -5) {
                char what[8];
                snprintf(what, sizeof what, "%c", b);
                fail(cp, "'anyOf' / 'oneOf' / a list of types: two alternatives start with '%s' (two objects, say), "
                         "which strand cannot tell apart yet", what);
            }
            cp->s->dispatch[(size_t)n->disp * 256 + (size_t)b] = to;
        }
    }
}

st_status st_gram_schema_compile(const char *json, size_t len, int strict, st_gram_schema **out, st_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return st_error_set(err, ST_ERR_ARG, "the schema is not JSON: %s (line %d)", je.text, je.line);
    compiler c;
    memset(&c, 0, sizeof c);
    c.strict = strict;
    c.err = err;
    c.s = calloc(1, sizeof *c.s);
    if (!c.s) {
        json_decref(root);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    json_t *defs = json_is_object(root) ? json_object_get(root, "$defs") : NULL;
    if (!defs && json_is_object(root)) defs = json_object_get(root, "definitions");
    if (defs && json_is_object(defs)) {
        c.defs = calloc(json_object_size(defs) + 1, sizeof *c.defs);
        if (!c.defs) fail(&c, "out of memory%s", NULL);
        const char *k;
        json_t *v;
        if (c.defs) json_object_foreach(defs, k, v) c.defs[c.n_defs++] = (def_entry){k, v, -4};
    }
    /* node 0 is the root: a placeholder anyOf of one, filled once the root is compiled */
    const int32_t fwd[1] = {GRAM_ANY};
    const int32_t root_id = add_anyof(&c, fwd, 1);
    const int32_t body = root_id >= 0 ? compile(&c, root, 0) : -100;
    if (!c.failed) c.alt_ids[c.alt_first[root_id]] = body;
    finish(&c);
    free(c.alt_ids);
    free(c.alt_first);
    free(c.alt_count);
    free(c.defs);
    json_decref(root);
    if (c.failed) {
        st_gram_schema_free(c.s);
        return ST_ERR_ARG;
    }
    *out = c.s;
    return ST_OK;
}

/* A parameter's value as the call parser (server/toolcall.c) reads it: by the schema's type
 * (a name, or a list's first that is not null), JSON for any type but string, raw text
 * otherwise; an enum or const read as text is one of its values written raw. */
static int32_t param_node(compiler *c, json_t *ps) {
    json_t *ty = json_object_get(ps, "type");
    const char *type = json_string_value(ty);
    if (json_is_array(ty)) {
        size_t i;
        json_t *x;
        json_array_foreach(ty, i, x) if (json_is_string(x) && strcmp(json_string_value(x), "null") != 0) {
            type = json_string_value(x);
            break;
        }
    }
    if (type && strcmp(type, "string") != 0) return compile(c, ps, 1);
    json_t *en = json_object_get(ps, "enum"), *cn = json_object_get(ps, "const");
    if (!en && !cn) return GRAM_TEXT;
    const size_t n = en ? json_array_size(en) : 1;
    if (n == 0 || n > ST_GRAM_MAX_LITS) return fail(c, "a parameter's enum must list 1 to %s values", "64");
    int32_t id = new_node(c, GK_ENUM);
    if (id < 0) return id;
    const int32_t l0 = c->s->n_lits;
    if (grow((void **)&c->s->lits, &c->cap_lits, l0 + (int32_t)n, sizeof *c->s->lits)) return fail(c, "out of memory%s", NULL);
    for (size_t i = 0; i < n; i++) {
        json_t *v = en ? json_array_get(en, i) : cn;
        char *dump = json_is_string(v) ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        const char *t = json_is_string(v) ? json_string_value(v) : dump;
        const size_t len = json_is_string(v) ? json_string_length(v) : (dump ? strlen(dump) : 0);
        if (!t || len == 0 || memchr(t, '\n', len)) {
            free(dump);
            return fail(c, "a parameter's enum value cannot be written in a call (empty, or a newline)%s", NULL);
        }
        const int64_t off = pool_put(c, t, len);
        free(dump);
        if (off < 0) return (int32_t)off;
        c->s->lits[l0 + (int32_t)i] = (gram_lit){(uint32_t)off, (uint32_t)len};
    }
    c->s->n_lits += (int32_t)n;
    c->s->nodes[id].lit0 = l0;
    c->s->nodes[id].n_lits = (int32_t)n;
    return id;
}

st_status st_gram_tools_compile(const char *tools_json, size_t len, const char *only, st_gram_schema **out, st_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *tools = json_loadb(tools_json, len, 0, &je);
    if (!json_is_array(tools) || json_array_size(tools) == 0) {
        json_decref(tools);
        return st_error_set(err, ST_ERR_ARG, "a forced tool call needs a non-empty 'tools' list");
    }
    compiler c;
    memset(&c, 0, sizeof c);
    c.err = err;
    c.s = calloc(1, sizeof *c.s);
    const size_t nt = json_array_size(tools);
    if (c.s) {
        c.s->fns = calloc(nt, sizeof *c.s->fns);
        c.s->params = calloc(nt * 64 + 1, sizeof *c.s->params);
    }
    if (!c.s || !c.s->fns || !c.s->params) fail(&c, "out of memory%s", NULL);
    if (nt > 64) fail(&c, "a forced tool call chooses among at most %s tools", "64");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (c.failed) break;
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !*name) {
            fail(&c, "a tool without a function name%s", NULL);
            break;
        }
        if (only && strcmp(only, name) != 0) continue;
        if (strchr(name, '>') || strchr(name, '\n')) {
            fail(&c, "the function name '%s' cannot be written in a call", name);
            break;
        }
        json_t *pa = json_object_get(fn, "parameters");
        json_t *props = json_object_get(pa, "properties"), *req = json_object_get(pa, "required");
        if (props && !json_is_object(props)) {
            fail(&c, "the parameters of '%s' must have 'properties' as an object", name);
            break;
        }
        if (json_object_size(props) > 64) {
            fail(&c, "'%s' has more than 64 parameters", name);
            break;
        }
        free(c.defs); /* the function's own $defs */
        c.defs = NULL;
        c.n_defs = 0;
        json_t *defs = json_object_get(pa, "$defs");
        if (!defs) defs = json_object_get(pa, "definitions");
        if (json_is_object(defs)) {
            c.defs = calloc(json_object_size(defs) + 1, sizeof *c.defs);
            const char *k;
            json_t *v;
            if (c.defs) json_object_foreach(defs, k, v) c.defs[c.n_defs++] = (def_entry){k, v, -4};
        }
        gram_fn *f = &c.s->fns[c.s->n_fns++];
        const int64_t off = pool_put(&c, name, strlen(name));
        if (off < 0) break;
        f->off = (uint32_t)off, f->len = (uint32_t)strlen(name);
        f->param0 = c.s->n_params;
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v) {
            if (strchr(k, '>') || strchr(k, '\n')) {
                fail(&c, "the parameter name '%s' cannot be written in a call", k);
                break;
            }
            gram_param *p = &c.s->params[c.s->n_params];
            const int64_t po = pool_put(&c, k, strlen(k));
            if (po < 0) break;
            p->off = (uint32_t)po, p->len = (uint32_t)strlen(k);
            p->node = param_node(&c, v);
            if (c.failed) break;
            c.s->n_params++;
            f->n_params++;
        }
        size_t ri;
        json_array_foreach(req, ri, v) {
            const char *rn = json_string_value(v);
            int found = -1;
            for (int j = 0; rn && j < f->n_params; j++) {
                const gram_param *p = &c.s->params[f->param0 + j];
                if (p->len == strlen(rn) && !memcmp(c.s->pool + p->off, rn, p->len)) found = j;
            }
            if (found < 0) {
                fail(&c, "'required' names '%s', which is not among the function's parameters", rn ? rn : "?");
                break;
            }
            f->required |= 1ull << found;
        }
    }
    if (!c.failed && c.s->n_fns == 0) fail(&c, "tool_choice names '%s', which 'tools' does not hold", only ? only : "?");
    if (!c.failed) finish(&c);
    free(c.alt_ids);
    free(c.alt_first);
    free(c.alt_count);
    free(c.defs);
    json_decref(tools);
    if (c.failed) {
        st_gram_schema_free(c.s);
        return ST_ERR_ARG;
    }
    *out = c.s;
    return ST_OK;
}

void st_gram_schema_free(st_gram_schema *s) {
    if (!s) return;
    st_gram_gbnf_free(s->gb);
    for (int32_t i = 0; i < s->n_pats; i++) st_gram_gbnf_free(s->pats[i]);
    free(s->pats);
    free(s->fns);
    free(s->params);
    free(s->nodes);
    free(s->props);
    free(s->lits);
    free(s->dispatch);
    free(s->pool);
    free(s);
}
