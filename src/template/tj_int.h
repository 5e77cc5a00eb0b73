/* ==== Jinja template engine: internal types shared by the template/ files ====
 *
 * The engine is split into: tmpl.c (compile/render entry points, symbol table), util.c
 * (arena, byte buffers, UTF-8 and Python character classes, float repr), value.c (the value
 * type, Python equality/ordering/str()/repr()/arithmetic), json.c (jansson <-> values,
 * tojson), lexer.c (jinja2's tokenizer with trim_blocks/lstrip_blocks), parser.c (tokens ->
 * AST), scope.c (jinja2's static frame locals), eval.c (statements and expressions),
 * filters.c (filters and tests), methods.c (str, dict and list methods, global functions),
 * format.c (printf-style `%` and str.format) and loader.c (finding a model's chat
 * template). Internal names carry the prefix tj_.
 *
 * Memory: a compiled template owns one arena holding its AST and constants; each render owns
 * another arena holding every value and temporary buffer it creates, all freed together when
 * the render ends. Errors inside a render unwind with longjmp to st_tmpl_render (tj_fail),
 * the parser's to tj_parse; since everything lives in arenas, nothing leaks on the way and no
 * function below the entry point needs error checks.
 *
 * Stack: recursion is bounded (parse nesting, AST height, TJ_MAX_EVAL_DEPTH evaluation
 * frames, TJ_MAX_VALUE_DEPTH for nested values); a render needs about 1.5 MiB of stack at
 * worst. Floats are formatted with the C library, so LC_NUMERIC must be "C" (the default).
 */
#ifndef ST_TEMPLATE_TJ_INT_H
#define ST_TEMPLATE_TJ_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/strmap.h"
#include "core/utf8.h"
#include "template/template.h"

/* ==== Arena: bump allocation in chunks, freed at once ==== */

typedef struct tj_chunk {
    struct tj_chunk *next; /* older chunk, owned */
    size_t cap, used;      /* bytes in data */
    max_align_t data[];
} tj_chunk;

typedef struct tj_arena {
    tj_chunk *head;  /* newest chunk, owned */
    size_t total;    /* bytes reserved from malloc */
    size_t limit;    /* tj_alloc returns NULL past this many bytes (0 = no limit) */
} tj_arena;

void *tj_arena_alloc(tj_arena *a, size_t n); /* NULL when the limit is hit or malloc fails */
void tj_arena_free(tj_arena *a);

/* ==== Growable byte buffer, carved from an arena ==== */

typedef struct tj_buf {
    char *data; /* [cap] in an arena, preceded by room for a tj_str header (tj_str_buf) */
    size_t len, cap;
} tj_buf;

/* Room for n more bytes and a NUL; 0, or -1 past the arena's limit. The old block stays in
 * the arena (growth doubles, so at most as much again is wasted). */
int tj_buf_reserve(tj_arena *a, tj_buf *b, size_t n);

/* ==== UTF-8 and Python character classes ==== */

/* Decode one code point at s[*i] (s is valid UTF-8), advancing *i. */
uint32_t tj_utf8_next(const char *s, size_t len, size_t *i);
/* Encode cp into out (4 bytes room); returns the byte count. */
int tj_utf8_put(uint32_t cp, char *out);
/* Byte offset of code point number k (k <= count). */
size_t tj_utf8_offset(const char *s, size_t len, size_t k);

bool tj_py_isspace(uint32_t cp);     /* str.isspace() / regex \s */
bool tj_py_isprintable(uint32_t cp); /* str.isprintable() */
bool tj_py_isalnum(uint32_t cp);     /* str.isalnum() (letters and numerics) */
bool tj_py_isalpha(uint32_t cp);
bool tj_py_isdigit(uint32_t cp);     /* decimal digits (Nd) */
bool tj_py_islinebreak(uint32_t cp); /* str.splitlines() boundaries */
bool tj_py_iscased_upper(uint32_t cp);
bool tj_py_iscased_lower(uint32_t cp);
bool tj_py_istitle_cp(uint32_t cp);
uint32_t tj_py_upper(uint32_t cp);
uint32_t tj_py_lower(uint32_t cp);
uint32_t tj_py_title(uint32_t cp);

/* Python float repr() ("1.0", "1e+16", "inf", "nan") into buf (>= 32 bytes). */
void tj_float_repr(double x, char *buf);

/* ==== Values ==== */

typedef enum tj_kind {
    TJ_UNDEF = 0,
    TJ_NONE = 1,
    TJ_BOOL = 2,
    TJ_INT = 3,
    TJ_FLOAT = 4,
    TJ_STR = 5,
    TJ_LIST = 6,   /* list, tuple, generator, range, dict views (tj_list.type) */
    TJ_DICT = 7,
    TJ_NS = 8,     /* namespace() object */
    TJ_MACRO = 9,
    TJ_FUNC = 10,  /* a global function (range, namespace, ...): id in tj_val.id */
    TJ_METHOD = 11, /* a bound method of a str/dict/list/loop: tj_method */
    TJ_LOOP = 12,  /* the `loop` object of a for loop */
} tj_kind;

#define TJ_F_MARKUP 1 /* strings: a Markup (safe) string */

typedef struct tj_str tj_str;
typedef struct tj_list tj_list;
typedef struct tj_dict tj_dict;
typedef struct tj_ns tj_ns;
typedef struct tj_macro tj_macro;
typedef struct tj_method tj_method;
typedef struct tj_loop tj_loop;
typedef struct tj_undef tj_undef;

typedef struct tj_val {
    uint8_t kind;  /* tj_kind */
    uint8_t flags; /* TJ_F_* */
    uint16_t id;   /* TJ_FUNC: tj_func_id */
    union {
        int64_t i;   /* BOOL (0/1), INT */
        double f;    /* FLOAT */
        const tj_str *s;
        tj_list *l;
        tj_dict *d;
        tj_ns *ns;
        tj_macro *m;
        tj_method *bm;
        tj_loop *loop;
        const tj_undef *u; /* NULL: a plain undefined with no name */
    } as;
} tj_val;

struct tj_str {
    size_t len; /* bytes, excluding the NUL */
    size_t ncp; /* code points; == len when ASCII */
    char data[]; /* [len + 1], valid UTF-8, NUL-terminated */
};

typedef enum tj_list_type {
    TJ_L_LIST = 0,
    TJ_L_TUPLE = 1,
    TJ_L_GEN = 2,    /* a one-shot generator (select, map, ...): truthy, no len() */
    TJ_L_RANGE = 3,  /* range(start, stop, step) */
    TJ_L_ITEMS = 4,  /* dict_items view */
    TJ_L_KEYS = 5,
    TJ_L_VALUES = 6,
    TJ_L_REVITER = 7, /* list_reverseiterator (reverse filter) */
} tj_list_type;

typedef struct tj_thunk tj_thunk;

struct tj_list {
    int64_t len;
    tj_val *items;  /* [len], render arena */
    uint8_t type;   /* tj_list_type */
    uint8_t consumed; /* generators: already iterated once */
    const tj_thunk *thunk; /* TJ_L_GEN: the pending filter (jinja2's generators are lazy);
                            * NULL once computed */
    const char *pyname;    /* GEN/REVITER: Python's name in repr ("do_unique", "reversed") */
    int64_t r_start, r_stop, r_step; /* TJ_L_RANGE: the arguments, for repr */
};

struct tj_dict {
    int64_t len, cap;
    tj_val *keys;     /* [cap], insertion order */
    tj_val *vals;     /* [cap] */
    int32_t *slots;   /* [nslots] hash index (entry+1, 0 = empty), NULL while small */
    uint32_t nslots;  /* power of two */
};

struct tj_ns {
    tj_dict *attrs; /* mutable through {% set ns.x = ... %} */
};

typedef struct tj_node tj_node;
typedef struct tj_scope tj_scope;

struct tj_macro {
    const tj_node *def;  /* the MACRO node, template arena */
    tj_scope *closure;   /* scope where it was defined */
};

struct tj_method {
    tj_val self;
    uint16_t mid; /* tj_method_id */
};

struct tj_loop {
    const tj_list *items; /* the (filtered) sequence being iterated */
    int64_t index0;
    int depth0;
    bool has_changed;
    tj_val changed_last;     /* loop.changed() memory */
    const tj_node *for_node; /* for `loop(...)` recursion (NULL when not recursive) */
    tj_scope *outer;         /* scope the loop runs in */
};

typedef enum tj_undef_how {
    TJ_U_NAME = 0,  /* 'x' is undefined */
    TJ_U_ATTR = 1,  /* 'dict object' has no attribute 'x' */
    TJ_U_ITEM = 2,  /* list object has no element 3 */
    TJ_U_HINT = 3,  /* a custom message */
} tj_undef_how;

struct tj_undef {
    uint8_t how;       /* tj_undef_how */
    bool security;     /* an unsafe attribute (SecurityError when used) */
    tj_val obj;        /* ATTR/ITEM: the object */
    tj_val key;        /* ITEM: the key; ATTR: the name (a string) */
    const char *name;  /* NAME: the variable; HINT: the message */
};

/* ==== Symbols, tokens and AST ==== */

/* Symbols reserved at the start of every template's symbol table. */
enum {
    TJ_SYM_LOOP = 0,
    TJ_SYM_VARARGS,
    TJ_SYM_KWARGS,
    TJ_SYM_CALLER,
    TJ_SYM_RANGE,
    TJ_SYM_DICT,
    TJ_SYM_NAMESPACE,
    TJ_SYM_RAISE,
    TJ_SYM_STRFTIME,
    TJ_SYM_LIPSUM,
    TJ_SYM_CYCLER,
    TJ_SYM_JOINER,
    TJ_SYM_NRESERVED
};

typedef enum tj_node_type {
    /* expressions */
    TJ_N_CONST = 1, TJ_N_NAME, TJ_N_GETATTR, TJ_N_GETITEM, TJ_N_SLICE, TJ_N_CALL, TJ_N_FILTER,
    TJ_N_TEST, TJ_N_NOT, TJ_N_NEG, TJ_N_POS, TJ_N_BINOP, TJ_N_AND, TJ_N_OR, TJ_N_CONCAT,
    TJ_N_COMPARE, TJ_N_CONDEXPR, TJ_N_LIST, TJ_N_TUPLE, TJ_N_DICT, TJ_N_NSREF,
    /* statements */
    TJ_N_TEXT, TJ_N_PRINT, TJ_N_BODY, TJ_N_IF, TJ_N_FOR, TJ_N_SET, TJ_N_SETBLOCK, TJ_N_MACRO,
    TJ_N_FILTERBLOCK, TJ_N_WITH, TJ_N_BREAK, TJ_N_CONTINUE,
} tj_node_type;

typedef enum tj_binop {
    TJ_OP_ADD = 1, TJ_OP_SUB, TJ_OP_MUL, TJ_OP_DIV, TJ_OP_FLOORDIV, TJ_OP_MOD, TJ_OP_POW,
} tj_binop;

typedef enum tj_cmpop {
    TJ_CMP_EQ = 1, TJ_CMP_NE, TJ_CMP_LT, TJ_CMP_LE, TJ_CMP_GT, TJ_CMP_GE, TJ_CMP_IN,
    TJ_CMP_NOTIN,
} tj_cmpop;

/* One AST node; which fields mean what depends on type (see parser.c's constructors):
 *   CONST: cval.  NAME: sym.  GETATTR: a=object, sym=attribute.  GETITEM: a=object, b=key.
 *   SLICE: a,b,c = start/stop/step (each may be NULL).
 *   CALL: a=callee; FILTER/TEST: a=operand (NULL = block body), fid, sym=name; all three take
 *     args: kids[n] positional, kwsyms/kwvals[nkw] keyword, c = *args, d = **kwargs.
 *   NOT/NEG/POS: a.  BINOP: op, a, b.  AND/OR: a, b.  CONCAT/LIST/TUPLE: kids[n].
 *   DICT: kids[2n] key, value pairs (n = pairs).  COMPARE: a first, kids[n] with ops[n].
 *   CONDEXPR: a=test, b=value when true, c=value when false (NULL: undefined).
 *   NSREF (assignment target ns.attr): sym=name, sym2=attr.
 *   TEXT: cval.  PRINT: a.  BODY: kids[n].  IF: a=test, b=body, c=else (IF or BODY, or NULL).
 *   FOR: a=target, b=iterable, c=filter test, d=else body, kids[0]=body, op=recursive.
 *   SET: a=target, b=value.  SETBLOCK: a=target, b=filter chain or NULL, c=body.
 *   MACRO: sym=name, kwsyms/kwvals[nkw] parameters and defaults (NULL = none), a=body,
 *     op bit 1 = body uses varargs, bit 2 = uses kwargs.
 *   FILTERBLOCK: a=filter chain, b=body.  WITH: kids[n] targets, kids2[n] values, a=body.
 * Bodies that start a frame (the root, for body and else, macro, with, set and filter
 * blocks) carry the names scope.c found to start out missing there.
 */
struct tj_node {
    uint8_t type; /* tj_node_type */
    uint8_t op;   /* BINOP: tj_binop; FOR: recursive; MACRO: flags */
    uint8_t konst; /* expression: literals only and a slice inside (jinja2 folds it) */
    uint16_t fid; /* FILTER/TEST: id */
    int32_t line;
    int32_t sym, sym2;
    int32_t n, nkw;
    tj_node *a, *b, *c, *d;
    tj_node **kids;   /* [n] (DICT: [2n]) */
    tj_node **kids2;  /* [n] */
    uint8_t *ops;     /* COMPARE: [n] tj_cmpop */
    int32_t *kwsyms;  /* [nkw] */
    tj_node **kwvals; /* [nkw] */
    tj_val cval;
    int32_t *missing; /* BODY starting a frame: [nmissing] names bound "missing" on entry */
    int32_t nmissing;
};

typedef enum tj_tok_type {
    TJ_T_EOF = 0, TJ_T_DATA, TJ_T_BLOCK_BEGIN, TJ_T_BLOCK_END, TJ_T_VAR_BEGIN, TJ_T_VAR_END,
    TJ_T_NAME, TJ_T_STRING, TJ_T_INT, TJ_T_FLOAT, TJ_T_OP,
} tj_tok_type;

typedef struct tj_token {
    uint8_t type;      /* tj_tok_type */
    int32_t line;
    const char *s;     /* DATA/STRING: processed text; NAME/OP: source text; arena or source */
    size_t len;
    int64_t i;         /* INT */
    double f;          /* FLOAT */
} tj_token;

/* ==== Compiled template ==== */

struct st_tmpl {
    tj_arena arena;        /* AST, constants, symbol names */
    tj_node *root;         /* BODY */
    st_strmap symmap;      /* name -> symbol id; keys borrowed from the arena */
    const char **syms;     /* [nsyms] symbol names (NUL-terminated, arena) */
    size_t *sym_lens;      /* [nsyms] */
    const tj_str **sym_strs; /* [nsyms] the same names as string values */
    int32_t nsyms, cap_syms;
    st_tmpl_params params;
};

/* Lexer: tokens of src (already newline-normalised), in the template's arena.
 * On error fills err (with line) and returns non-OK. */
st_status tj_lex(st_tmpl *t, const char *src, size_t len, tj_token **toks, int64_t *ntoks,
                 st_error *err);
/* Parser: builds t->root. */
st_status tj_parse(st_tmpl *t, const tj_token *toks, int64_t ntoks, st_error *err);
/* Scope analysis (scope.c): fills tj_node.missing of each frame body. */
st_status tj_analyze_scopes(st_tmpl *t, tj_node *root, st_error *err);
/* Intern a name into t's symbol table (-1 when out of memory). */
int32_t tj_intern(st_tmpl *t, const char *s, size_t len);
/* Symbol id of a name, -1 when the template never mentions it. */
int32_t tj_sym_find(const st_tmpl *t, const char *s, size_t len);

/* ==== Filters and tests (ids resolved at parse time) ==== */

typedef enum tj_filter_id {
    TJ_FL_UNKNOWN = 0, /* not a jinja2 filter: error when called */
    TJ_FL_UNSUPPORTED, /* a jinja2 filter this engine does not implement */
    TJ_FL_ABS, TJ_FL_ATTR, TJ_FL_BATCH, TJ_FL_CAPITALIZE, TJ_FL_CENTER, TJ_FL_COUNT,
    TJ_FL_DEFAULT, TJ_FL_DICTSORT, TJ_FL_ESCAPE, TJ_FL_FIRST, TJ_FL_FLOAT, TJ_FL_FORCEESCAPE,
    TJ_FL_FORMAT, TJ_FL_INDENT, TJ_FL_INT, TJ_FL_ITEMS, TJ_FL_JOIN, TJ_FL_LAST, TJ_FL_LENGTH,
    TJ_FL_LIST, TJ_FL_LOWER, TJ_FL_MAP, TJ_FL_MAX, TJ_FL_MIN, TJ_FL_REJECT, TJ_FL_REJECTATTR,
    TJ_FL_REPLACE, TJ_FL_REVERSE, TJ_FL_ROUND, TJ_FL_SAFE, TJ_FL_SELECT, TJ_FL_SELECTATTR,
    TJ_FL_SLICE, TJ_FL_SORT, TJ_FL_STRING, TJ_FL_STRIPTAGS, TJ_FL_SUM, TJ_FL_TITLE,
    TJ_FL_TOJSON, TJ_FL_TRIM, TJ_FL_TRUNCATE, TJ_FL_UNIQUE, TJ_FL_UPPER, TJ_FL_WORDCOUNT,
    TJ_FL_GROUPBY, TJ_FL_PPRINT, TJ_FL_NCOUNT
} tj_filter_id;

typedef enum tj_test_id {
    TJ_TS_UNKNOWN = 0,
    TJ_TS_BOOLEAN, TJ_TS_CALLABLE, TJ_TS_DEFINED, TJ_TS_DIVISIBLEBY, TJ_TS_EQ, TJ_TS_ESCAPED,
    TJ_TS_EVEN, TJ_TS_FALSE, TJ_TS_FILTER, TJ_TS_FLOAT, TJ_TS_GE, TJ_TS_GT, TJ_TS_IN,
    TJ_TS_INTEGER, TJ_TS_ITERABLE, TJ_TS_LE, TJ_TS_LOWER, TJ_TS_LT, TJ_TS_MAPPING, TJ_TS_NE,
    TJ_TS_NONE, TJ_TS_NUMBER, TJ_TS_ODD, TJ_TS_SAMEAS, TJ_TS_SEQUENCE, TJ_TS_STRING,
    TJ_TS_TEST, TJ_TS_TRUE, TJ_TS_UNDEFINED, TJ_TS_UPPER, TJ_TS_NCOUNT
} tj_test_id;

/* Name -> id (TJ_FL_UNKNOWN / TJ_TS_UNKNOWN when not a jinja2 name). */
int tj_filter_lookup(const char *name, size_t len);
int tj_test_lookup(const char *name, size_t len);

typedef enum tj_func_id {
    TJ_FN_RANGE = 1, TJ_FN_DICT, TJ_FN_NAMESPACE, TJ_FN_RAISE, TJ_FN_STRFTIME, TJ_FN_LIPSUM,
    TJ_FN_CYCLER, TJ_FN_JOINER,
} tj_func_id;

/* ==== Rendering ==== */

struct tj_scope {
    tj_scope *parent; /* NULL at the top (context) */
    int32_t n, cap;
    int32_t *syms;    /* [cap] */
    tj_val *vals;     /* [cap] */
};

/* Evaluated call arguments. */
typedef struct tj_kwarg {
    const char *name; /* NUL-terminated */
    size_t len;
    tj_val v;
} tj_kwarg;

typedef struct tj_args {
    int n, nkw;
    tj_val *pos;    /* [n] */
    tj_kwarg *kw;   /* [nkw] */
} tj_args;

#define TJ_MAX_BUFS 512

typedef struct tj_render {
    const st_tmpl *t;     /* borrowed */
    tj_arena arena;       /* render-time values */
    jmp_buf jb;           /* tj_fail unwinds here */
    st_error *err;        /* filled by tj_fail */
    tj_buf bufs[TJ_MAX_BUFS]; /* output stack: [0] the result, above it captures (macros, set) */
    int nbufs;
    size_t out_total;     /* bytes written to all buffers */
    int64_t steps;        /* evaluation work done */
    int64_t loop_iters;
    int depth;            /* nested eval/exec calls */
    int vdepth;           /* nesting of the value being printed, compared, hashed, converted */
    int call_depth;       /* nested macro calls */
    int line;             /* line of the statement being run, for error messages */
    bool const_fold;      /* evaluating a literal expression jinja2 folds while compiling */
    tj_scope *globals;    /* the context variables */
    tj_scope *root;       /* top-level template scope */
    int64_t now;          /* strftime_now time (seconds since epoch) */
} tj_render;

/* Fail the render or compile: fill rs->err ("line N: message") and longjmp. */
_Noreturn void tj_fail(tj_render *rs, st_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail with the message an undefined value gives when used. */
_Noreturn void tj_fail_undef(tj_render *rs, tj_val u);
/* Allocation that fails the render past the memory limit. */
void *tj_alloc(tj_render *rs, size_t n);
/* Count work; fails past the step limit. */
void tj_work(tj_render *rs, int64_t units);

/* ---- value constructors (value.c) ---- */
static inline tj_val tj_none(void) { tj_val v = {.kind = TJ_NONE}; return v; }
static inline tj_val tj_bool(bool b) { tj_val v = {.kind = TJ_BOOL}; v.as.i = b; return v; }
static inline tj_val tj_int(int64_t i) { tj_val v = {.kind = TJ_INT}; v.as.i = i; return v; }
static inline tj_val tj_float(double f) { tj_val v = {.kind = TJ_FLOAT}; v.as.f = f; return v; }
static inline tj_val tj_undef_plain(void) { tj_val v = {.kind = TJ_UNDEF}; return v; }
tj_val tj_undef_name(tj_render *rs, const char *name);
tj_val tj_undef_attr(tj_render *rs, tj_val obj, const char *name, size_t len);
tj_val tj_undef_item(tj_render *rs, tj_val obj, tj_val key);
tj_val tj_undef_hint(tj_render *rs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tj_val tj_undef_unsafe(tj_render *rs, tj_val obj, const char *name);

/* Strings: copy bytes (valid UTF-8) into the render arena. */
tj_val tj_strn(tj_render *rs, const char *s, size_t len);
tj_val tj_str_cstr(tj_render *rs, const char *s);
tj_val tj_str_buf(tj_render *rs, tj_buf *b); /* adopts the buffer's bytes; b is spent */
/* A string in the template arena (compile time). NULL when out of memory. */
const tj_str *tj_str_const(tj_arena *a, const char *s, size_t len);
static inline tj_val tj_strv(const tj_str *s) {
    tj_val v = {.kind = TJ_STR};
    v.as.s = s;
    return v;
}
tj_list *tj_list_new(tj_render *rs, int64_t len, uint8_t type);
tj_val tj_listv(tj_list *l);
tj_dict *tj_dict_new(tj_render *rs, int64_t cap);
tj_val tj_dictv(tj_dict *d);

/* ---- dict ---- */
void tj_dict_set(tj_render *rs, tj_dict *d, tj_val key, tj_val val);
/* Returns a pointer to the value, or NULL. Fails for unhashable keys. */
tj_val *tj_dict_get(tj_render *rs, const tj_dict *d, tj_val key);
tj_val *tj_dict_get_str(const tj_dict *d, const char *s, size_t len);

/* ---- Python semantics ---- */
bool tj_truthy(tj_val v);
bool tj_equal(tj_render *rs, tj_val a, tj_val b);
/* a < b in Python; fails with TypeError text when not comparable. */
int tj_compare(tj_render *rs, tj_val a, tj_val b); /* -1, 0, 1 */
bool tj_is_hashable(tj_render *rs, tj_val v);
/* Recursion guard for walking nested values (fails past TJ_MAX_VALUE_DEPTH). */
#define TJ_MAX_VALUE_DEPTH 1000
void tj_value_enter(tj_render *rs);
static inline void tj_value_leave(tj_render *rs) { rs->vdepth--; }
const char *tj_type_name(tj_val v); /* Python type name: 'str', 'NoneType', ... */
/* str(v) appended to b; repr(v) appended to b. */
void tj_str_of(tj_render *rs, tj_buf *b, tj_val v);
void tj_repr_of(tj_render *rs, tj_buf *b, tj_val v);
/* str(v) as a value (returns v itself for strings). */
tj_val tj_to_str(tj_render *rs, tj_val v);
/* Items of an iterable (list, tuple, str chars, dict keys, generator...); fails when v is not
 * iterable. Undefined iterates as empty. */
const tj_list *tj_iterate(tj_render *rs, tj_val v);
/* len(v); fails when v has no len(). */
int64_t tj_len(tj_render *rs, tj_val v);
/* Python `x in container`. */
bool tj_contains(tj_render *rs, tj_val container, tj_val x);
/* Numeric helpers: is int-like (bool/int), number (bool/int/float). */
static inline bool tj_is_intlike(tj_val v) { return v.kind == TJ_INT || v.kind == TJ_BOOL; }
static inline bool tj_is_num(tj_val v) {
    return v.kind == TJ_INT || v.kind == TJ_BOOL || v.kind == TJ_FLOAT;
}
static inline double tj_num_f(tj_val v) { return v.kind == TJ_FLOAT ? v.as.f : (double)v.as.i; }
/* Binary arithmetic (+ - * / // % **) with Python rules. */
tj_val tj_arith(tj_render *rs, int op, tj_val a, tj_val b);
/* Buffer helpers that fail the render on out-of-memory / output limit. */
void tj_put(tj_render *rs, tj_buf *b, const char *s, size_t n);
void tj_putc(tj_render *rs, tj_buf *b, char c);
void tj_puts(tj_render *rs, tj_buf *b, const char *s);
/* Python repr of a string. */
void tj_repr_str(tj_render *rs, tj_buf *b, const char *s, size_t len);
/* HTML escaping as markupsafe.escape does. */
void tj_html_escape(tj_render *rs, tj_buf *b, const char *s, size_t len);

/* ---- JSON (json.c) ---- */
typedef struct json_t json_t;
tj_val tj_from_json(tj_render *rs, const json_t *j);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) appended to b.
 * indent: NULL for none; item_sep/key_sep: NULL for defaults. */
void tj_dumps(tj_render *rs, tj_buf *b, tj_val v, bool ensure_ascii, const char *indent,
              size_t indent_len, bool has_indent, const char *item_sep, const char *key_sep,
              bool sort_keys);

/* ---- attribute access and calls (eval.c / methods.c) ---- */
tj_val tj_getattr(tj_render *rs, tj_val obj, const char *name, size_t len);
tj_val tj_getitem(tj_render *rs, tj_val obj, tj_val key);
tj_val tj_call(tj_render *rs, tj_val callee, tj_args *args);
/* Method of obj named name: true with *out a TJ_METHOD (or, for a mutating list/dict
 * method, an "unsafe" undefined); false when obj has no such method. */
bool tj_method_lookup(tj_render *rs, tj_val obj, const char *name, size_t len, tj_val *out);
tj_val tj_call_method(tj_render *rs, const tj_method *m, tj_args *args);
tj_val tj_call_func(tj_render *rs, int fid, tj_args *args);
/* Python printf-style formatting: fmt % arg. */
tj_val tj_percent_format(tj_render *rs, const tj_str *fmt, tj_val arg);
/* Python comparison operator (tj_cmpop) between a and b. */
bool tj_cmp(tj_render *rs, int op, tj_val a, tj_val b);

/* str helpers (methods.c): strip (mode 1 left, 2 right, 3 both; chars NULL = whitespace),
 * case mapping (mode 'u' upper, 'l' lower, 'c' capitalize, 't' str.title, 's' swapcase,
 * 'f' casefold), replace (count < 0 = all), padding (how 'c' center, 'l' ljust, 'r' rjust),
 * split (sep NULL = whitespace runs; maxsplit < 0 = all; rev = rsplit), splitlines. */
tj_val tj_str_strip(tj_render *rs, tj_val v, const tj_str *chars, int mode);
tj_val tj_str_case(tj_render *rs, tj_val v, char mode);
tj_val tj_str_replace(tj_render *rs, const tj_str *s, const tj_str *old, const tj_str *nw,
                      int64_t count);
tj_val tj_str_pad(tj_render *rs, tj_val v, int64_t width, uint32_t fill, char how);
tj_val tj_str_split(tj_render *rs, const tj_str *s, const tj_str *sep, int64_t maxsplit,
                    bool rev);
tj_val tj_str_splitlines(tj_render *rs, const tj_str *s, bool keepends);
tj_val tj_str_format(tj_render *rs, const tj_str *fmt, tj_args *args);

/* eval.c entry points used by tmpl.c */
void tj_exec_root(tj_render *rs);
void tj_set_global(tj_render *rs, int32_t sym, tj_val v);

/* Filters and tests (filters.c). select/reject/map/unique/batch/slice/items return a lazy
 * generator whose work (and errors) happen when it is first iterated: tj_gen_force. */
tj_val tj_apply_filter(tj_render *rs, int fid, const char *name, tj_val v, tj_args *args);
void tj_gen_force(tj_render *rs, tj_list *gen);
bool tj_apply_test(tj_render *rs, int tid, const char *name, tj_val v, tj_args *args);

/* Argument binding for builtins: names[np] the parameters, after the first (the value).
 * out[i] is set to the argument, or to a "not given" marker (tj_given() false). */
void tj_bind(tj_render *rs, const char *fname, tj_args *args, int np, const char *const *names,
             tj_val *out);
static inline bool tj_given(tj_val v) { return !(v.kind == TJ_UNDEF && v.id == 0xffff); }

/* Capture: push a fresh output buffer, pop it as a string value. */
void tj_capture_begin(tj_render *rs);
tj_val tj_capture_end(tj_render *rs);

#endif /* ST_TEMPLATE_TJ_INT_H */
