/* ==== grammar/: the compiled schema, shared by the compiler (schema.c) and the automaton ==== */
#ifndef ST_GRAMMAR_GRAM_INT_H
#define ST_GRAMMAR_GRAM_INT_H

#include <stdint.h>

#include "grammar/grammar.h"

#define GRAM_ANY (-1) /* the node of a value any JSON may fill */

typedef enum gram_kind {
    GK_ANY = 0,
    GK_OBJECT,
    GK_ARRAY,
    GK_STRING,
    GK_INTEGER,
    GK_NUMBER,
    GK_BOOLEAN,
    GK_NULL,
    GK_ENUM,  /* one of some JSON texts (enum, const), written compactly */
    GK_ANYOF, /* alternatives told apart by their first byte */
} gram_kind;

typedef struct gram_prop {
    uint32_t off, len; /* the key as written between the quotes (JSON-escaped): pool[off, off + len) */
    int32_t node;
} gram_prop;

typedef struct gram_node {
    uint8_t kind;        /* gram_kind */
    /* GK_OBJECT */
    int32_t prop0, n_props; /* props[prop0 .. prop0 + n_props) */
    uint64_t required;      /* bit i: props[prop0 + i] must be given */
    int32_t extra;          /* other keys' values' node; -2: no other keys */
    /* GK_ARRAY; GK_STRING: min_items / max_items are its minLength / maxLength; pat: its
     * pattern's matcher pats[pat - 1] (0: none) */
    int32_t pat;
    int32_t items;
    int64_t min_items, max_items;
    /* GK_INTEGER */
    int has_min, has_max;
    int64_t min, max;
    /* GK_NUMBER (has_min / has_max): its bounds, and whether they are exclusive */
    double dmin, dmax;
    int min_excl, max_excl;
    /* GK_ENUM */
    int32_t lit0, n_lits;   /* lits[lit0 .. lit0 + n_lits) */
    /* GK_ANYOF: the node a value starting with byte b takes: dispatch[disp * 256 + b] (-3:
     * none) */
    int32_t disp;
} gram_node;

#define GRAM_NO_EXTRA (-2)
#define GRAM_NONE (-3)

typedef struct gram_lit {
    uint32_t off, len; /* compact JSON: pool[off, off + len) */
} gram_lit;

/* A tool-call grammar's functions (Qwen3.5's XML call format) */
typedef struct gram_param {
    uint32_t off, len; /* its name, raw: pool[off, off + len) */
    int32_t node;      /* its value's schema node (a JSON value), or GRAM_TEXT */
} gram_param;

#define GRAM_TEXT (-6) /* a string parameter: its value is raw text */

typedef struct gram_fn {
    uint32_t off, len;     /* its name, raw */
    int32_t param0, n_params;
    uint64_t required;     /* bit i: params[param0 + i] must be given */
} gram_fn;

/* A GBNF grammar (gbnf.c): rule r's elements start at el[rule[r]]: its alternatives one after
 * another, GB_ALT between them, GB_END after the last. */
enum { GB_CHAR = 0, GB_REF = 1, GB_ALT = 2, GB_END = 3 };
typedef struct gb_el {
    uint8_t kind;   /* GB_* */
    uint8_t neg;    /* GB_CHAR: the code points outside its ranges */
    uint16_t n_rng; /* GB_CHAR: its ranges rng[2 * a ..] (lo, hi inclusive), n_rng of them */
    uint32_t a;     /* GB_CHAR: the first range; GB_REF: the rule */
} gb_el;

typedef struct gram_gbnf {
    gb_el *el;      /* [n_el]; owned */
    int32_t n_el;
    uint32_t *rng;  /* [2 * n_rng]; owned */
    int32_t n_rng;
    int32_t *rule;  /* [n_rules] each rule's first element; owned */
    int32_t n_rules;
    int32_t root;
    uint64_t hash;  /* of all the above: masks of the same grammar are shared (never 0) */
} gram_gbnf;

void st_gram_gbnf_free(gram_gbnf *G);
void st_gram_gbnf_start(const gram_gbnf *G, st_gram_gbnf *s);
/* one byte of the reply: 1 when some stack takes it (s advanced), 0 when none (s undefined) */
int st_gram_gbnf_feed1(const gram_gbnf *G, st_gram_gbnf *s, unsigned char b);
int st_gram_gbnf_accepting(const st_gram_gbnf *s); /* the text so far is a sentence */
int st_gram_gbnf_more(const st_gram_gbnf *s);      /* and it may go on */
/* whether some stack takes a code point in [lo, hi] next (between characters) */
int st_gram_gbnf_takes_range(const gram_gbnf *G, const st_gram_gbnf *s, uint32_t lo, uint32_t hi);
void st_gram_gbnf_copy(st_gram_gbnf *dst, const st_gram_gbnf *src); /* the live part */
/* a JSON schema's 'pattern' (a regular expression) as a grammar of the strings it matches
 * (gbnf.c says which subset); ST_ERR_ARG naming what is not supported */
st_status gram_pattern_compile(const char *re, size_t len, gram_gbnf **out, st_error *err);

struct st_gram_schema {
    gram_gbnf *gb;     /* a GBNF grammar's (ST_GRAM_GBNF), else NULL; owned */
    gram_gbnf **pats;  /* [n_pats] the strings' patterns; owned, each owned */
    int32_t n_pats;
    gram_fn *fns;      /* a tool-call grammar's, else NULL; owned */
    int32_t n_fns;
    gram_param *params; /* owned */
    int32_t n_params;
    gram_node *nodes;  /* [n_nodes]; node 0 the root; owned */
    int32_t n_nodes;
    gram_prop *props;  /* owned */
    int32_t n_props;
    gram_lit *lits;    /* owned */
    int32_t n_lits;
    int32_t *dispatch; /* [n_disp][256] node ids by first byte; owned */
    int32_t n_disp;
    char *pool;        /* keys and literal texts; owned */
    size_t pool_used, pool_cap;
};

#endif /* ST_GRAMMAR_GRAM_INT_H */
