/* ==== The JSON automaton and token masks (see grammar.h) ==== */
#include "grammar/grammar.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/strmap.h"
#include "core/utf8.h"
#include "grammar/gram_int.h"

/* what the next byte may be */
enum {
    P_VALUE = 0,    /* a value (whitespace first) */
    P_VALUE_OR_END, /* after '[': a value or ']' */
    P_KEY_OR_END,   /* after '{': a key or '}' */
    P_KEY,          /* after ',' in an object */
    P_COLON,        /* after a key */
    P_COMMA_OBJ,    /* after a member: ',' or '}' */
    P_COMMA_ARR,    /* after an element: ',' or ']' */
    P_STRING,       /* inside a string (sub: S_*) */
    P_NUMBER,       /* inside a number (sub: N_*) */
    P_LITERAL,      /* inside true, false or null */
    P_ENUM,         /* inside one of an enum's values (cand, cpos) */
    P_DONE,         /* the value is complete */
    /* a tool call (ST_GRAM_TOOL_CALL) */
    X_START,        /* whitespace, then the call */
    X_LIT,          /* a fixed text (lit: XL_*, lit_pos) */
    X_FNAME,        /* a function's name (cand, cpos) */
    X_AFTER,        /* after the function line or a parameter: '<' */
    X_AFTER2,       /* "<p" (another parameter) or "</" (the end) */
    X_PNAME,        /* a parameter's name (cand, cpos) */
    X_TEXT,         /* a text value (cpos: how much of "\n</parameter>" is matched) */
};
/* the fixed texts of a tool call */
enum { XL_OPEN = 0, XL_FN_NL, XL_VALUE_NL, XL_PCLOSE, XL_PCLOSE_NL, XL_POPEN, XL_END };
static const char *const xlits[] = {"<tool_call>\n<function=", "\n", "\n", "\n</parameter>\n", "\n", "<parameter=",
                                    "</function>\n</tool_call>"};
#define TEXT_END "\n</parameter>"
#define TEXT_END_LEN 13
enum { S_PLAIN = 0, S_ESC, S_HEX, S_SURR_BS, S_SURR_U }; /* S_SURR_*: a low surrogate's "\u" due */
enum { N_MINUS = 0, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
/* the range of a string's next UTF-8 continuation byte */
enum { U8_ANY = 0, U8_A0_BF, U8_80_9F, U8_90_BF, U8_80_8F };

#define MAX_INT_DIGITS 15  /* integer parts fit an int64 */
#define MAX_FRAC_DIGITS 15
#define MAX_EXP_DIGITS 2   /* |exponent| < 100: a double */

static const char *const literals[3] = {"true", "false", "null"};

void st_gram_init(st_gram_state *g, st_gram_mode mode) {
    memset(g, 0, offsetof(st_gram_state, stack));
    g->mode = (uint8_t)mode;
    g->phase = mode == ST_GRAM_TOOL_CALL ? X_START : P_VALUE;
    g->vnode = mode == ST_GRAM_JSON_SCHEMA ? 0 : GRAM_ANY;
    g->fn = g->param = -1;
    memset(&g->gb, 0, offsetof(st_gram_gbnf, cells));
}

void st_gram_begin(st_gram_state *g, const st_gram_schema *sc) {
    if (g->mode == ST_GRAM_GBNF && sc && sc->gb && !g->gb.started) st_gram_gbnf_start(sc->gb, &g->gb);
}

int st_gram_done(const st_gram_state *g) {
    if (g->mode == ST_GRAM_GBNF) return g->gb.started && !st_gram_gbnf_more(&g->gb);
    return g->phase == P_DONE;
}

int st_gram_may_end(const st_gram_state *g) {
    return g->mode == ST_GRAM_GBNF ? st_gram_gbnf_accepting(&g->gb) : st_gram_done(g);
}

/* the live part of a state (the stack above depth is never read before it is written) */
static void copy_live(st_gram_state *dst, const st_gram_state *src) {
    memcpy(dst, src, offsetof(st_gram_state, stack) + (size_t)src->depth * sizeof src->stack[0]);
    if (src->pat) st_gram_gbnf_copy(&dst->gb, &src->gb);
}

static int is_ws(unsigned char b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static int is_digit(unsigned char b) { return b >= '0' && b <= '9'; }
static int hex_value(unsigned char b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return -1;
}

static const gram_node *node_of(const st_gram_schema *sc, int n) { return sc && n >= 0 ? &sc->nodes[n] : NULL; }

/* the container on top (NULL at the top level) */
/* a pattern string's character (a code point an escape gave) to its matcher */
static int pat_cp(st_gram_state *g, const st_gram_schema *sc, uint32_t cp) {
    const gram_gbnf *G = sc->pats[node_of(sc, g->vnode)->pat - 1];
    unsigned char u[4];
    int n;
    if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[2] = (unsigned char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 63)),
        u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[3] = (unsigned char)(0x80 | (cp & 63)), n = 4;
    for (int i = 0; i < n; i++)
        if (!st_gram_gbnf_feed1(G, &g->gb, u[i])) return 0;
    return 1;
}

/* a pattern string within a \u escape, k of its 4 digits read (unit u so far): whether a
 * character the pattern takes next may still come of it (a high surrogate: the pair's) */
static int pat_hex_fits(const st_gram_state *g, const st_gram_schema *sc, uint32_t u, int k) {
    const gram_gbnf *G = sc->pats[node_of(sc, g->vnode)->pat - 1];
    const int sh = 4 * (4 - k);
    const uint32_t lo = u << sh, hi = lo | ((1u << sh) - 1);
    if (g->lit) { /* the low half of a pair */
        const uint32_t a = lo < 0xDC00 ? 0xDC00 : lo, b = hi > 0xDFFF ? 0xDFFF : hi;
        const uint32_t base = 0x10000u + (((uint32_t)g->hi_surr - 0xD800u) << 10);
        return a <= b && st_gram_gbnf_takes_range(G, &g->gb, base + (a - 0xDC00), base + (b - 0xDC00));
    }
    int ok = 0;
    if (lo < 0xD800) ok |= st_gram_gbnf_takes_range(G, &g->gb, lo ? lo : 1, hi < 0xD7FF ? hi : 0xD7FF);
    if (hi > 0xDFFF) ok |= st_gram_gbnf_takes_range(G, &g->gb, lo > 0xE000 ? lo : 0xE000, hi);
    if (lo <= 0xDBFF && hi >= 0xD800) {
        const uint32_t a = lo > 0xD800 ? lo : 0xD800, b = hi < 0xDBFF ? hi : 0xDBFF;
        ok |= st_gram_gbnf_takes_range(G, &g->gb, 0x10000u + ((a - 0xD800u) << 10), 0x10000u + ((b - 0xD800u) << 10) + 0x3FF);
    }
    return ok;
}

/* a pattern string's raw byte (ASCII or UTF-8) to its matcher */
static int pat_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    return st_gram_gbnf_feed1(sc->pats[node_of(sc, g->vnode)->pat - 1], &g->gb, b);
}

static st_gram_frame *top(st_gram_state *g) { return g->depth ? &g->stack[g->depth - 1] : NULL; }

/* an object may take another key: a property not yet given, or any key */
static int object_open(const st_gram_schema *sc, const st_gram_frame *f) {
    const gram_node *n = node_of(sc, f->node);
    if (!n) return 1;
    if (n->extra != GRAM_NO_EXTRA) return 1;
    const uint64_t all = n->n_props >= 64 ? ~0ull : (1ull << n->n_props) - 1;
    return (all & ~f->seen) != 0;
}
/* an object may end: every required property given */
static int object_complete(const st_gram_schema *sc, const st_gram_frame *f) {
    const gram_node *n = node_of(sc, f->node);
    return !n || (n->required & ~f->seen) == 0;
}
static int array_may_end(const st_gram_schema *sc, const st_gram_frame *f) {
    const gram_node *n = node_of(sc, f->node);
    return !n || (int64_t)f->count >= n->min_items;
}
static int array_may_grow(const st_gram_schema *sc, const st_gram_frame *f) {
    const gram_node *n = node_of(sc, f->node);
    return !n || (int64_t)f->count < n->max_items;
}

/* a value ended: its container's next phase */
static void value_done(st_gram_state *g) {
    st_gram_frame *f = top(g);
    if (!f && g->mode == ST_GRAM_TOOL_CALL) { /* a parameter's JSON value: its closing tag */
        g->phase = X_LIT, g->lit = XL_PCLOSE, g->lit_pos = 0;
    } else if (!f) {
        g->phase = P_DONE;
    } else if (f->object) {
        g->phase = P_COMMA_OBJ;
    } else {
        g->phase = P_COMMA_ARR;
        if (f->count < UINT32_MAX) f->count++;
    }
}

/* Could the integer whose digits so far are acc (negative when neg; digits of them) still
 * end inside [min, max]? Its completions are acc itself and, for each k more digits,
 * [acc 10^k, acc 10^k + 10^k - 1] (none after a lone 0). */
static int int_feasible(const gram_node *n, int64_t acc, int neg, int digits) {
    int64_t p = 1;
    for (int k = 0; digits + k <= MAX_INT_DIGITS; k++) {
        int64_t lo = acc * p, hi = acc * p + p - 1;
        if (neg) {
            const int64_t t = -hi;
            hi = -lo, lo = t;
        }
        if ((!n->has_min || hi >= n->min) && (!n->has_max || lo <= n->max)) return 1;
        if (acc == 0) break; /* no digit follows a leading 0 */
        p *= 10;
    }
    return 0;
}
static int int_in_range(const gram_node *n, int64_t acc, int neg) {
    const int64_t v = neg ? -acc : acc;
    return (!n->has_min || v >= n->min) && (!n->has_max || v <= n->max);
}

static int num_int_feasible(const gram_node *n, int64_t acc, int neg, int d);

/* the first byte of a value */
static int value_start(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    if (g->mode == ST_GRAM_JSON_OBJECT && g->depth == 0 && b != '{') return 0;
    const gram_node *n = node_of(sc, g->vnode);
    if (n && n->kind == GK_ANYOF) { /* the alternative this byte starts */
        const int32_t to = sc->dispatch[(size_t)n->disp * 256 + b];
        if (to == GRAM_NONE) return 0;
        g->vnode = (int16_t)to;
        n = node_of(sc, to);
    }
    const int kind = n ? n->kind : GK_ANY;
    if (kind == GK_ANY) g->vnode = GRAM_ANY; /* and so is everything inside it */
    g->sub = 0;
    g->lit_pos = 0;
    if (kind == GK_ENUM) {
        uint64_t c = 0;
        for (int i = 0; i < n->n_lits; i++) {
            const gram_lit *l = &sc->lits[n->lit0 + i];
            if ((unsigned char)sc->pool[l->off] == b) c |= 1ull << i;
        }
        if (!c) return 0;
        g->phase = P_ENUM, g->cand = c, g->cpos = 1;
        /* a one-byte value (a digit) ends at the next byte */
        return 1;
    }
    switch (b) {
    case '{':
    case '[':
        if (kind != GK_ANY && kind != (b == '{' ? GK_OBJECT : GK_ARRAY)) return 0;
        if (g->depth >= ST_GRAM_MAX_DEPTH) return 0;
        {
            st_gram_frame *f = &g->stack[g->depth++];
            f->node = g->vnode;
            f->object = b == '{';
            f->seen = 0;
            f->count = 0;
        }
        g->phase = b == '{' ? P_KEY_OR_END : P_VALUE_OR_END;
        return 1;
    case '"':
        if (kind != GK_ANY && kind != GK_STRING) return 0;
        g->phase = P_STRING;
        g->str_key = 0;
        g->utf8_need = 0;
        g->slen = 0;
        g->pat = 0;
        if (kind == GK_STRING && node_of(sc, g->vnode)->pat) {
            g->pat = 1;
            st_gram_gbnf_start(sc->pats[node_of(sc, g->vnode)->pat - 1], &g->gb);
        }
        return 1;
    case 't':
    case 'f':
    case 'n':
        if (kind != GK_ANY && !(kind == GK_BOOLEAN && b != 'n') && !(kind == GK_NULL && b == 'n')) return 0;
        g->phase = P_LITERAL;
        g->lit = b == 't' ? 0 : b == 'f' ? 1 : 2;
        g->lit_pos = 1;
        return 1;
    default:
        if (b != '-' && !is_digit(b)) return 0;
        if (kind != GK_ANY && kind != GK_NUMBER && kind != GK_INTEGER) return 0;
        if (kind == GK_INTEGER && b == '-' && n->has_min && n->min > 0) return 0; /* no value <= 0 fits */
        if (kind == GK_NUMBER && (n->has_min || n->has_max)) {
            if (b == '-' ? n->has_min && (n->min_excl ? n->dmin >= 0 : n->dmin > 0) : !num_int_feasible(n, b - '0', 0, 1))
                return 0;
        }
        g->phase = P_NUMBER;
        g->neg = b == '-';
        g->acc = b == '-' ? 0 : b - '0';
        g->sub = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        g->lit_pos = b == '-' ? 0 : 1;
        if (kind == GK_INTEGER && b != '-' && !int_feasible(n, g->acc, 0, 1)) return 0;
        return 1;
    }
}

/* the key just closed: its property (or another key) chosen, its value's node set */
static int key_done(st_gram_state *g, const st_gram_schema *sc) {
    st_gram_frame *f = top(g);
    const gram_node *n = node_of(sc, f->node);
    if (!n) {
        g->vnode = GRAM_ANY;
        return 1;
    }
    for (int i = 0; i < n->n_props; i++)
        if ((g->cand >> i & 1) && sc->props[n->prop0 + i].len == g->cpos) {
            f->seen |= 1ull << i;
            g->vnode = (int16_t)sc->props[n->prop0 + i].node;
            return 1;
        }
    if (!g->key_free) return 0;
    g->vnode = (int16_t)n->extra;
    return 1;
}

/* a byte of a key, matched against the properties still possible */
static int key_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    const gram_node *n = node_of(sc, top(g)->node);
    uint64_t c = 0;
    for (int i = 0; i < n->n_props; i++) {
        const gram_prop *p = &sc->props[n->prop0 + i];
        if ((g->cand >> i & 1) && g->cpos < p->len && (unsigned char)sc->pool[p->off + g->cpos] == b) c |= 1ull << i;
    }
    g->cand = c;
    g->cpos++;
    return c != 0 || g->key_free;
}

/* A UTF-8 lead byte (core/utf8.h): the continuation bytes it needs and the first one's
 * range (U8_*) into g; 0 when b cannot begin a sequence. */
static int utf8_lead(st_gram_state *g, unsigned char b) {
    uint8_t lo, hi;
    int len;
    if (!st_utf8_lead(b, &lo, &hi, &len)) return 0;
    g->utf8_need = (uint8_t)(len - 1);
    g->lit = lo == 0xA0 ? U8_A0_BF : hi == 0x9F ? U8_80_9F : lo == 0x90 ? U8_90_BF : hi == 0x8F ? U8_80_8F : U8_ANY;
    return 1;
}

/* a continuation byte, inside the range due */
static int utf8_cont(st_gram_state *g, unsigned char b) {
    static const unsigned char lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    if (b < lo[g->lit] || b > hi[g->lit]) return 0;
    g->utf8_need--;
    g->lit = U8_ANY;
    return 1;
}

/* a byte inside a string */
static int string_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    const int matching = g->str_key && sc && node_of(sc, top(g)->node);
    switch (g->sub) {
    case S_PLAIN:
        if (g->utf8_need) {
            if (!utf8_cont(g, b)) return 0;
            if (g->pat && !pat_byte(g, sc, b)) return 0;
            return !matching || key_byte(g, sc, b);
        }
        if (b == '"') {
            if (g->str_key) {
                if (matching && !key_done(g, sc)) return 0;
                if (!matching) g->vnode = GRAM_ANY;
                g->phase = P_COLON;
            } else {
                const gram_node *n = node_of(sc, g->vnode);
                if (n && n->kind == GK_STRING && (int64_t)g->slen < n->min_items) return 0; /* minLength */
                if (g->pat && !st_gram_gbnf_accepting(&g->gb)) return 0; /* the pattern matches the whole */
                g->pat = 0;
                value_done(g);
            }
            return 1;
        }
        if (b >= 0x20 && !g->str_key) { /* a character starts: maxLength */
            const gram_node *n = node_of(sc, g->vnode);
            if (n && n->kind == GK_STRING && (int64_t)g->slen >= n->max_items) return 0;
            if (g->slen < UINT32_MAX) g->slen++;
        }
        if (b == '\\') {
            g->sub = S_ESC;
            if (g->pat && !st_gram_gbnf_takes_range(sc->pats[node_of(sc, g->vnode)->pat - 1], &g->gb, 1, 0x10FFFF))
                return 0; /* the pattern takes no character here */
            return !matching || key_byte(g, sc, b);
        }
        if (b < 0x20) return 0;
        if (b >= 0x80 && !utf8_lead(g, b)) return 0;
        if (g->pat && !pat_byte(g, sc, b)) return 0;
        return !matching || key_byte(g, sc, b);
    case S_ESC:
        if (b == 'u') {
            g->sub = S_HEX, g->lit_pos = 0, g->lit = 0, g->unit = 0; /* lit: 1 while a low surrogate is read */
        } else {
            if (!b || !strchr("\"\\/bfnrt", b)) return 0;
            g->sub = S_PLAIN;
            if (g->pat) {
                static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
                if (!pat_cp(g, sc, (unsigned char)to[strchr(from, b) - from])) return 0;
            }
        }
        return !matching || key_byte(g, sc, b);
    case S_HEX: {
        const int h = hex_value(b);
        if (h < 0) return 0;
        const unsigned u = (unsigned)g->unit << 4 | (unsigned)h;
        g->unit = (uint16_t)u;
        if (matching && !key_byte(g, sc, b)) return 0;
        if (++g->lit_pos < 4) return !g->pat || pat_hex_fits(g, sc, u, g->lit_pos);
        const int low = g->lit;
        g->unit = 0;
        if (low) { /* the second half of a pair */
            if (u < 0xDC00 || u > 0xDFFF) return 0;
            g->sub = S_PLAIN;
            return !g->pat || pat_cp(g, sc, 0x10000u + (((uint32_t)g->hi_surr - 0xD800u) << 10) + (u - 0xDC00u));
        }
        if (u == 0 || (u >= 0xDC00 && u <= 0xDFFF)) return 0; /* NUL, a lone low surrogate */
        g->sub = u >= 0xD800 && u <= 0xDBFF ? S_SURR_BS : S_PLAIN;
        if (g->sub == S_SURR_BS) {
            g->hi_surr = (uint16_t)u;
            return !g->pat || pat_hex_fits(g, sc, u, 4); /* the pairs it begins */
        }
        return !g->pat || pat_cp(g, sc, u);
    }
    case S_SURR_BS:
        if (b != '\\') return 0;
        g->sub = S_SURR_U;
        return !matching || key_byte(g, sc, b);
    case S_SURR_U:
        if (b != 'u') return 0;
        g->sub = S_HEX, g->lit_pos = 0, g->lit = 1, g->unit = 0;
        return !matching || key_byte(g, sc, b);
    }
    return 0;
}

/* A bounded number's reachable values: [lo, hi) with more digits to come (negated: (-hi,
 * -lo]) against its bounds; `exact`: only lo itself (the number ends here). */
static int num_reach(const gram_node *n, double lo, double hi, int neg, int exact) {
    if (neg) {
        const double t = -hi;
        hi = -lo, lo = t;
    }
    if (exact) {
        const double v = neg ? hi : lo;
        return (!n->has_min || (n->min_excl ? v > n->dmin : v >= n->dmin)) &&
               (!n->has_max || (n->max_excl ? v < n->dmax : v <= n->dmax));
    }
    /* the open end of the interval is never reached, the closed one is */
    const int lo_open = neg, hi_open = !neg;
    const int above_min = !n->has_min || (hi_open || n->min_excl ? hi > n->dmin : hi >= n->dmin);
    const int below_max = !n->has_max || (lo_open || n->max_excl ? lo < n->dmax : lo <= n->dmax);
    return above_min && below_max;
}

static double pow10i(int k) {
    double p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

/* the integer part acc (d digits) may still become a number inside the bounds */
static int num_int_feasible(const gram_node *n, int64_t acc, int neg, int d) {
    for (int k = 0; d + k <= MAX_INT_DIGITS; k++) {
        const double p = pow10i(k);
        if (num_reach(n, (double)acc * p, ((double)acc + 1) * p, neg, 0)) return 1;
        if (acc == 0) break;
    }
    return 0;
}

/* a byte inside a number: 1 taken, 0 rejected, 2 the number ended before it */
static int number_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    const gram_node *n = node_of(sc, g->vnode);
    const int integer = n && n->kind == GK_INTEGER;
    const int bounded = n && n->kind == GK_NUMBER && (n->has_min || n->has_max); /* no exponent then */
    const int e = b == 'e' || b == 'E';
    switch (g->sub) {
    case N_MINUS:
        if (!is_digit(b)) return 0;
        g->sub = b == '0' ? N_ZERO : N_INT, g->lit_pos = 1, g->acc = b - '0';
        if (bounded) return num_int_feasible(n, g->acc, 1, 1);
        return !integer || int_feasible(n, g->acc, 1, 1);
    case N_ZERO:
    case N_INT:
        if (g->sub == N_INT && is_digit(b)) {
            if (g->lit_pos >= MAX_INT_DIGITS) return 0;
            g->lit_pos++;
            g->acc = g->acc * 10 + (b - '0');
            if (bounded) return num_int_feasible(n, g->acc, g->neg, g->lit_pos);
            return !integer || int_feasible(n, g->acc, g->neg, g->lit_pos);
        }
        if ((b == '.' || e) && integer) return 0;
        if (e && bounded) return 0;
        if (b == '.') {
            if (bounded && !num_reach(n, (double)g->acc, (double)g->acc + 1, g->neg, 0)) return 0;
            g->sub = N_DOT;
            g->frac = 0;
            return 1;
        }
        if (e) {
            g->sub = N_E;
            return 1;
        }
        if (integer && !int_in_range(n, g->acc, g->neg)) return 0;
        if (bounded && !num_reach(n, (double)g->acc, 0, g->neg, 1)) return 0;
        return 2;
    case N_DOT:
    case N_FRAC:
        if (is_digit(b)) {
            if (g->sub == N_FRAC && g->lit_pos >= MAX_FRAC_DIGITS) return 0;
            g->lit_pos = g->sub == N_DOT ? 1 : g->lit_pos + 1;
            g->sub = N_FRAC;
            if (!bounded) return 1;
            g->frac = g->frac * 10 + (b - '0');
            const double scale = pow10i(g->lit_pos), x = (double)g->acc + (double)g->frac / scale;
            return num_reach(n, x, x + 1 / scale, g->neg, 0);
        }
        if (g->sub == N_DOT) return 0;
        if (e) {
            if (bounded) return 0;
            g->sub = N_E;
            return 1;
        }
        if (bounded) {
            const double x = (double)g->acc + (double)g->frac / pow10i(g->lit_pos);
            if (!num_reach(n, x, 0, g->neg, 1)) return 0;
        }
        return 2;
    case N_E:
        if (b == '+' || b == '-') {
            g->sub = N_ESIGN;
            return 1;
        }
        /* fall through */
    case N_ESIGN:
        if (!is_digit(b)) return 0;
        g->sub = N_EXP, g->lit_pos = 1;
        return 1;
    case N_EXP:
        if (is_digit(b)) {
            if (g->lit_pos >= MAX_EXP_DIGITS) return 0;
            g->lit_pos++;
            return 1;
        }
        return 2;
    }
    return 0;
}

/* a byte inside an enum value: 1 taken, 0 rejected, 2 the value (a number) ended before it */
static int enum_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    const gram_node *n = node_of(sc, g->vnode);
    uint64_t c = 0, ended = 0;
    for (int i = 0; i < n->n_lits; i++) {
        if (!(g->cand >> i & 1)) continue;
        const gram_lit *l = &sc->lits[n->lit0 + i];
        if (g->cpos < l->len && (unsigned char)sc->pool[l->off + g->cpos] == b) c |= 1ull << i;
        if (g->cpos == l->len) ended |= 1ull << i;
    }
    if (c) {
        g->cand = c;
        g->cpos++;
        /* a value whose last byte ends it (a quote, a bracket, a letter) ends here when no
         * other candidate goes on */
        int all_end = 1, digit_end = 0;
        for (int i = 0; i < n->n_lits; i++) {
            if (!(c >> i & 1)) continue;
            const gram_lit *l = &sc->lits[n->lit0 + i];
            if (l->len != g->cpos) all_end = 0;
            else digit_end |= is_digit((unsigned char)sc->pool[l->off + l->len - 1]);
        }
        if (all_end && !digit_end) value_done(g);
        return 1;
    }
    return ended ? 2 : 0; /* a number value that is complete: the byte belongs to what follows */
}

static int feed1(st_gram_state *g, const st_gram_schema *sc, unsigned char b);

/* a byte of UTF-8 text (a text parameter's value): 1 allowed */
static int text_utf8(st_gram_state *g, unsigned char b) {
    if (g->utf8_need) return utf8_cont(g, b);
    if (b < 0x20) return b == '\n' || b == '\t' || b == '\r';
    return b < 0x80 || utf8_lead(g, b);
}

/* the function or parameter whose name is matched so far (cand, cpos) and ends here: its
 * index, or -1 */
static int name_done(const st_gram_schema *sc, const st_gram_state *g, int params) {
    const gram_fn *f = params ? &sc->fns[g->fn] : NULL;
    const int n = params ? f->n_params : sc->n_fns;
    for (int i = 0; i < n && i < 64; i++) {
        const uint32_t len = params ? sc->params[f->param0 + i].len : sc->fns[i].len;
        if ((g->cand >> i & 1) && len == g->cpos) return i;
    }
    return -1;
}

static void name_byte(const st_gram_schema *sc, st_gram_state *g, int params, unsigned char b) {
    const gram_fn *f = params ? &sc->fns[g->fn] : NULL;
    const int n = params ? f->n_params : sc->n_fns;
    uint64_t c = 0;
    for (int i = 0; i < n && i < 64; i++) {
        const uint32_t off = params ? sc->params[f->param0 + i].off : sc->fns[i].off;
        const uint32_t len = params ? sc->params[f->param0 + i].len : sc->fns[i].len;
        if ((g->cand >> i & 1) && g->cpos < len && (unsigned char)sc->pool[off + g->cpos] == b) c |= 1ull << i;
    }
    g->cand = c;
    g->cpos++;
}

static uint64_t all_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* a byte of a tool call outside its JSON values */
static int tool_byte(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    if (!sc || !sc->fns) return 0;
    switch (g->phase) {
    case X_START:
        if (is_ws(b)) {
            if (g->ws >= ST_GRAM_MAX_WS) return 0;
            g->ws++;
            return 1;
        }
        g->phase = X_LIT, g->lit = XL_OPEN, g->lit_pos = 0;
        return tool_byte(g, sc, b);
    case X_LIT: {
        const char *l = xlits[g->lit];
        if ((unsigned char)l[g->lit_pos] != b) return 0;
        if (l[++g->lit_pos]) return 1;
        switch (g->lit) { /* the text is complete: what follows it */
        case XL_OPEN:
            g->phase = X_FNAME, g->cand = all_bits(sc->n_fns), g->cpos = 0;
            break;
        case XL_FN_NL:
        case XL_PCLOSE:
        case XL_PCLOSE_NL: g->phase = X_AFTER; break;
        case XL_VALUE_NL: {
            const int32_t node = sc->params[sc->fns[g->fn].param0 + g->param].node;
            if (node == GRAM_TEXT) {
                g->phase = X_TEXT, g->cpos = 0, g->utf8_need = 0;
            } else { /* the value starts at once: a whitespace run is full already */
                g->phase = P_VALUE, g->vnode = (int16_t)node, g->depth = 0, g->ws = ST_GRAM_MAX_WS;
            }
            break;
        }
        case XL_POPEN:
            g->phase = X_PNAME, g->cand = all_bits(sc->fns[g->fn].n_params) & ~g->pseen, g->cpos = 0;
            break;
        case XL_END: g->phase = P_DONE; break;
        }
        return 1;
    }
    case X_FNAME:
    case X_PNAME: {
        const int params = g->phase == X_PNAME;
        if (b == '>') {
            const int i = name_done(sc, g, params);
            if (i < 0) return 0;
            if (params) {
                g->param = (int16_t)i;
                g->pseen |= 1ull << i;
                g->phase = X_LIT, g->lit = XL_VALUE_NL, g->lit_pos = 0;
            } else {
                g->fn = (int16_t)i;
                g->pseen = 0;
                g->phase = X_LIT, g->lit = XL_FN_NL, g->lit_pos = 0;
            }
            return 1;
        }
        name_byte(sc, g, params, b);
        return g->cand != 0;
    }
    case X_AFTER:
        if (b != '<') return 0;
        g->phase = X_AFTER2;
        return 1;
    case X_AFTER2: {
        const gram_fn *f = &sc->fns[g->fn];
        if (b == 'p' && (all_bits(f->n_params) & ~g->pseen)) {
            g->phase = X_LIT, g->lit = XL_POPEN, g->lit_pos = 2;
            return 1;
        }
        if (b == '/' && (f->required & ~g->pseen) == 0) {
            g->phase = X_LIT, g->lit = XL_END, g->lit_pos = 2;
            return 1;
        }
        return 0;
    }
    case X_TEXT:
        if (!text_utf8(g, b)) return 0;
        if ((unsigned char)TEXT_END[g->cpos] == b) g->cpos++;
        else g->cpos = b == '\n' ? 1 : 0;
        if (g->cpos == TEXT_END_LEN) g->phase = X_LIT, g->lit = XL_PCLOSE_NL, g->lit_pos = 0;
        return 1;
    default: return 0;
    }
}

/* one byte: 1 allowed (g advanced), 0 not */
static int feed1(st_gram_state *g, const st_gram_schema *sc, unsigned char b) {
    if (g->phase == P_STRING) return string_byte(g, sc, b);
    if (g->phase == P_LITERAL) {
        if ((unsigned char)literals[g->lit][g->lit_pos] != b) return 0;
        if (literals[g->lit][++g->lit_pos] == 0) value_done(g);
        return 1;
    }
    if (g->phase == P_NUMBER || g->phase == P_ENUM) {
        const int r = g->phase == P_NUMBER ? number_byte(g, sc, b) : enum_byte(g, sc, b);
        if (r != 2) return r;
        value_done(g); /* the byte after a number belongs to what follows it */
        if (g->phase == P_DONE) { /* a number alone: one whitespace byte ends it */
            if (!is_ws(b)) return 0;
            g->ws = 1;
            return 1;
        }
        if (g->phase >= X_START) return tool_byte(g, sc, b);
    }
    if (g->phase >= X_START) return tool_byte(g, sc, b);
    if (is_ws(b)) {
        if (g->phase == P_DONE || g->ws >= ST_GRAM_MAX_WS) return 0;
        g->ws++;
        return 1;
    }
    g->ws = 0;
    st_gram_frame *f = top(g);
    switch (g->phase) {
    case P_VALUE_OR_END:
        if (b == ']') {
            if (!array_may_end(sc, f)) return 0;
            g->depth--;
            value_done(g);
            return 1;
        }
        if (!array_may_grow(sc, f)) return 0;
        g->vnode = (int16_t)(node_of(sc, f->node) ? node_of(sc, f->node)->items : GRAM_ANY);
        return value_start(g, sc, b);
    case P_VALUE: return value_start(g, sc, b);
    case P_KEY_OR_END:
        if (b == '}') {
            if (!object_complete(sc, f)) return 0;
            g->depth--;
            value_done(g);
            return 1;
        }
        /* fall through */
    case P_KEY: {
        if (b != '"' || !object_open(sc, f)) return 0;
        g->phase = P_STRING, g->sub = S_PLAIN, g->str_key = 1, g->utf8_need = 0;
        const gram_node *n = node_of(sc, f->node);
        if (n) {
            const uint64_t all = n->n_props >= 64 ? ~0ull : (1ull << n->n_props) - 1;
            g->cand = all & ~f->seen;
            g->cpos = 0;
            g->key_free = n->extra != GRAM_NO_EXTRA;
        }
        return 1;
    }
    case P_COLON:
        if (b != ':') return 0;
        g->phase = P_VALUE;
        return 1;
    case P_COMMA_OBJ:
        if (b == ',') {
            if (!object_open(sc, f)) return 0;
            g->phase = P_KEY;
            return 1;
        }
        if (b != '}' || !object_complete(sc, f)) return 0;
        g->depth--;
        value_done(g);
        return 1;
    case P_COMMA_ARR:
        if (b == ',') {
            if (!array_may_grow(sc, f)) return 0;
            g->phase = P_VALUE;
            g->vnode = (int16_t)(node_of(sc, f->node) ? node_of(sc, f->node)->items : GRAM_ANY);
            return 1;
        }
        if (b != ']' || !array_may_end(sc, f)) return 0;
        g->depth--;
        value_done(g);
        return 1;
    default: return 0;
    }
}

int st_gram_feed(st_gram_state *g, const st_gram_schema *sc, const char *bytes, size_t n) {
    if (g->mode == ST_GRAM_GBNF) {
        if (!sc || !sc->gb) return 0;
        for (size_t i = 0; i < n; i++)
            if (!st_gram_gbnf_feed1(sc->gb, &g->gb, (unsigned char)bytes[i])) return 0;
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if (!feed1(g, sc, (unsigned char)bytes[i])) return 0;
    return 1;
}

/* ---- the vocabulary ---- */

#define N_SCTX 9 /* string contexts with precomputed masks */
enum { REST_INSIDE = 0, REST_STAYS, REST_CLOSES, REST_NONE }; /* after a \\u escape's digits */

/* a string context's canonical state */
static void string_ctx_state(int k, st_gram_state *s) {
    static const uint8_t need[N_SCTX] = {0, 1, 2, 2, 2, 3, 3, 3, 0};
    static const uint8_t range[N_SCTX] = {U8_ANY, U8_ANY, U8_ANY, U8_A0_BF, U8_80_9F, U8_ANY, U8_90_BF, U8_80_8F, U8_ANY};
    st_gram_init(s, ST_GRAM_JSON_VALUE);
    s->phase = P_STRING;
    s->sub = k == 8 ? S_ESC : S_PLAIN;
    s->utf8_need = need[k];
    s->lit = range[k];
}

/* the context of g's string, or -1 (a key matched against properties, a \u escape, not a
 * string) */
/* a key matched against a schema's properties */
static int matched_key(const st_gram_schema *sc, const st_gram_state *g) {
    return g->phase == P_STRING && g->str_key && sc && g->depth && g->stack[g->depth - 1].node >= 0;
}

/* a string value with a length bound */
static int bounded_string(const st_gram_schema *sc, const st_gram_state *g) {
    const gram_node *n = g->phase == P_STRING && !g->str_key ? node_of(sc, g->vnode) : NULL;
    return n && n->kind == GK_STRING && (n->min_items > 0 || n->max_items < INT64_MAX);
}

static int string_ctx_of(const st_gram_schema *sc, const st_gram_state *g) {
    if (g->phase != P_STRING || g->pat) return -1; /* a pattern's string: the walk */
    if (bounded_string(sc, g) && (g->sub != S_PLAIN || g->utf8_need)) return -1; /* (rare) the walk */
    if (matched_key(sc, g) && !g->key_free) return -1; /* only the properties' names: the walk prunes */
    if (g->sub == S_ESC) return 8;
    if (g->sub != S_PLAIN) return -1;
    switch (g->utf8_need) {
    case 0: return 0;
    case 1: return 1;
    case 2: return g->lit == U8_A0_BF ? 3 : g->lit == U8_80_9F ? 4 : 2;
    default: return g->lit == U8_90_BF ? 6 : g->lit == U8_80_8F ? 7 : 5;
    }
}

typedef struct trie_node {
    int32_t first_child, next_sibling;
    int32_t token;     /* the first token whose bytes end here, or -1 */
    uint8_t byte;
} trie_node;

#define GB_CACHE 8

struct st_gram_vocab {
    int64_t V;              /* the model's vocabulary (mask bits) */
    size_t words;
    trie_node *nodes;       /* [n_nodes]; node 0 the root; owned */
    int32_t n_nodes;
    int32_t *same;          /* [V] the next token with the same bytes, or -1; owned */
    const char **bytes;     /* [V] each token's bytes (the tokenizer's), NULL: never allowed */
    uint32_t *lens;         /* [V] */
    /* Inside a string, per context (string_ctx_of: at a character boundary, within a UTF-8
     * character by the bytes and range still due, after a backslash): */
    struct {
        uint32_t *safe;      /* [words] tokens that stay inside the string from there (fit
                                whatever the containers); owned */
        int32_t *hard;       /* [n_hard] tokens that close it: what precedes their closing
                                quote fits, what follows (their suffix) depends on the
                                containers; owned */
        int32_t *suffix;     /* [n_hard] each one's suffix (an index into suf_*); owned */
        int64_t n_hard;
    } sctx[N_SCTX];
    /* Inside a \\u escape that needs m = 1..4 more hex digits (hex[m - 1]): the tokens that
     * start with them (or are hex digits only, fewer); the escape's code unit then decides,
     * and what follows it is string text like any other */
    struct {
        int32_t *tok;        /* [n] owned */
        uint16_t *val;       /* [n] the value of their first min(m, length) hex digits */
        uint8_t *rest;       /* [n] REST_*: what follows the escape's last digit */
        int32_t *suffix;     /* [n] REST_CLOSES: the suffix from the closing quote on */
        int64_t n;
    } hex[4];
    const char **suf_bytes; /* [n_suf] the distinct suffixes, from the closing quote on (the
                               tokenizer's bytes); owned array */
    uint32_t *suf_lens;     /* [n_suf]; owned */
    uint8_t *suf_fits;      /* [n_suf] scratch of st_gram_mask; owned */
    int64_t n_suf;
    int64_t n_set;          /* the walk's count */
    uint16_t *nchars;       /* [V] the characters a token adds inside a string from a character
                               boundary (one it begins counts); owned */
    int32_t added[64];      /* added tokens that are not special (<tool_call>, ...): only a
                               tool call may use them; their bytes stay in bytes[] */
    int n_added;
    uint32_t *text_safe;    /* [words] tokens a text value takes from a character boundary
                               with nothing of its end tag matched: no newline; owned */
    int32_t *text_nl;       /* [n_text_nl] the other text tokens (they have a newline); owned */
    int64_t n_text_nl;
    /* GBNF masks of recent match states (a grammar's reading often comes back to the same
     * state: free text, repetitions), least recently used replaced */
    struct {
        uint64_t grammar;     /* its grammar's hash (0: empty) */
        st_gram_gbnf state;   /* the live part */
        uint32_t *mask;       /* [words]; owned */
        int64_t n;
        uint64_t used;
    } gbc[GB_CACHE];
    uint64_t gb_tick;
};

static int32_t child_of(st_gram_vocab *v, int32_t node, uint8_t b, int make) {
    int32_t *link = &v->nodes[node].first_child;
    while (*link >= 0) {
        if (v->nodes[*link].byte == b) return *link;
        link = &v->nodes[*link].next_sibling;
    }
    if (!make) return -1;
    const int32_t n = v->n_nodes++;
    v->nodes[n] = (trie_node){-1, -1, -1, b};
    *link = n;
    return n;
}

st_status st_gram_vocab_create(const st_tokenizer *tok, int64_t vocab_size, st_gram_vocab **out, st_error *err) {
    *out = NULL;
    const int64_t tv = st_tok_vocab_size(tok);
    st_gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    v->V = vocab_size;
    v->words = (size_t)(vocab_size + 31) / 32;
    v->same = malloc((size_t)vocab_size * sizeof *v->same);
    v->bytes = calloc((size_t)vocab_size, sizeof *v->bytes);
    v->lens = calloc((size_t)vocab_size, sizeof *v->lens);
    int ok = v->same && v->bytes && v->lens;
    for (int m = 0; m < 4 && ok; m++) {
        v->hex[m].tok = malloc((size_t)vocab_size * sizeof *v->hex[m].tok);
        v->hex[m].val = malloc((size_t)vocab_size * sizeof *v->hex[m].val);
        v->hex[m].rest = malloc((size_t)vocab_size);
        v->hex[m].suffix = malloc((size_t)vocab_size * sizeof *v->hex[m].suffix);
        ok = v->hex[m].tok && v->hex[m].val && v->hex[m].rest && v->hex[m].suffix;
    }
    for (int k = 0; k < N_SCTX && ok; k++) {
        v->sctx[k].safe = calloc(v->words, sizeof *v->sctx[k].safe);
        v->sctx[k].hard = malloc((size_t)vocab_size * sizeof *v->sctx[k].hard);
        v->sctx[k].suffix = malloc((size_t)vocab_size * sizeof *v->sctx[k].suffix);
        ok = v->sctx[k].safe && v->sctx[k].hard && v->sctx[k].suffix;
    }
    size_t total = 1;
    for (int64_t t = 0; ok && t < vocab_size && t < tv; t++) {
        size_t len = 0;
        const char *b = st_tok_token_bytes(tok, (int32_t)t, &len);
        if (!b || len == 0 || st_tok_is_special(tok, (int32_t)t)) continue;
        if (st_tok_is_added(tok, (int32_t)t)) { /* kept apart: not in the trie */
            if (v->n_added < 64) {
                v->added[v->n_added++] = (int32_t)t;
                v->bytes[t] = b;
                v->lens[t] = (uint32_t)len;
            }
            continue;
        }
        v->bytes[t] = b;
        v->lens[t] = (uint32_t)len;
        total += len;
    }
    v->nchars = ok ? calloc((size_t)vocab_size, sizeof *v->nchars) : NULL;
    ok = ok && v->nchars;
    for (int i = 0; i < GB_CACHE && ok; i++) ok = (v->gbc[i].mask = malloc(v->words * sizeof *v->gbc[i].mask)) != NULL;
    v->text_safe = ok ? calloc(v->words, sizeof *v->text_safe) : NULL;
    v->text_nl = ok ? malloc((size_t)vocab_size * sizeof *v->text_nl) : NULL;
    ok = ok && v->text_safe && v->text_nl;
    v->nodes = ok ? malloc(total * sizeof *v->nodes) : NULL;
    v->suf_bytes = ok ? malloc((size_t)vocab_size * sizeof *v->suf_bytes) : NULL;
    v->suf_lens = ok ? malloc((size_t)vocab_size * sizeof *v->suf_lens) : NULL;
    v->suf_fits = ok ? malloc((size_t)vocab_size) : NULL;
    st_strmap suffixes;
    if (!ok || !v->nodes || !v->suf_bytes || !v->suf_lens || !v->suf_fits ||
        st_strmap_init(&suffixes, 4096) != 0) {
        st_gram_vocab_free(v);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory for the grammar's token trie");
    }
    v->nodes[0] = (trie_node){-1, -1, -1, 0};
    v->n_nodes = 1;
    for (int64_t t = 0; t < vocab_size; t++) v->same[t] = -1;
    for (int i = 0; i < v->n_added; i++) { /* their bytes are kept, but they are not in the trie */
        v->bytes[v->added[i]] = NULL;
    }
    for (int64_t t = 0; t < vocab_size; t++) {
        if (!v->bytes[t]) continue;
        { /* a text value's tokens */
            st_gram_state s;
            st_gram_init(&s, ST_GRAM_TOOL_CALL);
            s.phase = X_TEXT;
            int fits = 1, nl = 0;
            for (uint32_t i = 0; i < v->lens[t] && fits; i++) {
                nl |= v->bytes[t][i] == '\n';
                fits = text_utf8(&s, (unsigned char)v->bytes[t][i]);
            }
            if (fits && !nl) v->text_safe[t / 32] |= 1u << (t % 32);
            else if (fits) v->text_nl[v->n_text_nl++] = (int32_t)t;
        }
        int32_t n = 0;
        for (uint32_t i = 0; i < v->lens[t]; i++) n = child_of(v, n, (uint8_t)v->bytes[t][i], 1);
        if (v->nodes[n].token < 0) {
            v->nodes[n].token = (int32_t)t;
        } else { /* bytes another token has: chained after it */
            int32_t k = v->nodes[n].token;
            while (v->same[k] >= 0) k = v->same[k];
            v->same[k] = (int32_t)t;
        }
        /* inside a \\u escape needing m more digits */
        for (int m = 1; m <= 4; m++) {
            uint32_t h = 0;
            unsigned val = 0;
            while (h < v->lens[t] && h < (uint32_t)m && hex_value((unsigned char)v->bytes[t][h]) >= 0)
                val = val << 4 | (unsigned)hex_value((unsigned char)v->bytes[t][h++]);
            if (h == 0 || (h < (uint32_t)m && h < v->lens[t])) continue; /* not hex digits first */
            int rest = REST_INSIDE;
            int64_t id = -1;
            if (h == (uint32_t)m) { /* the escape completes: the rest from a character boundary */
                st_gram_state s;
                string_ctx_state(0, &s);
                uint32_t q = h;
                int fits = 1;
                for (; q < v->lens[t]; q++) {
                    const unsigned char b = (unsigned char)v->bytes[t][q];
                    if (b == '"' && s.sub == S_PLAIN && s.utf8_need == 0) break;
                    if (!(fits = feed1(&s, NULL, b))) break;
                }
                rest = !fits ? REST_NONE : q == v->lens[t] ? REST_STAYS : REST_CLOSES;
                if (rest == REST_CLOSES && !st_strmap_get(&suffixes, v->bytes[t] + q, v->lens[t] - q, &id)) {
                    id = v->n_suf++;
                    v->suf_bytes[id] = v->bytes[t] + q;
                    v->suf_lens[id] = v->lens[t] - q;
                    if (st_strmap_put(&suffixes, v->bytes[t] + q, v->lens[t] - q, id) < 0) {
                        st_strmap_free(&suffixes);
                        st_gram_vocab_free(v);
                        return st_error_set(err, ST_ERR_NOMEM, "out of memory for the grammar's token suffixes");
                    }
                }
            }
            const int64_t i = v->hex[m - 1].n++;
            v->hex[m - 1].tok[i] = (int32_t)t;
            v->hex[m - 1].val[i] = (uint16_t)val;
            v->hex[m - 1].rest[i] = (uint8_t)rest;
            v->hex[m - 1].suffix[i] = (int32_t)id;
        }
        /* inside a string, per context: a token that does not close the string stays inside
         * it, so whether it fits does not depend on the containers (one run decides); one that
         * closes it is split at its closing quote, and its suffix is run each time */
        for (int k = 0; k < N_SCTX; k++) {
            st_gram_state s;
            string_ctx_state(k, &s);
            uint32_t q = 0;
            int fits = 1;
            for (; q < v->lens[t]; q++) {
                const unsigned char b = (unsigned char)v->bytes[t][q];
                if (b == '"' && s.sub == S_PLAIN && s.utf8_need == 0) break;
                if (!(fits = feed1(&s, NULL, b))) break;
            }
            if (!fits) continue; /* never fits there */
            if (q == v->lens[t]) {
                v->sctx[k].safe[t / 32] |= 1u << (t % 32);
                if (k == 0) v->nchars[t] = (uint16_t)(s.slen > UINT16_MAX ? UINT16_MAX : s.slen);
                continue;
            }
            int64_t id;
            if (!st_strmap_get(&suffixes, v->bytes[t] + q, v->lens[t] - q, &id)) {
                id = v->n_suf++;
                v->suf_bytes[id] = v->bytes[t] + q;
                v->suf_lens[id] = v->lens[t] - q;
                if (st_strmap_put(&suffixes, v->bytes[t] + q, v->lens[t] - q, id) < 0) {
                    st_strmap_free(&suffixes);
                    st_gram_vocab_free(v);
                    return st_error_set(err, ST_ERR_NOMEM, "out of memory for the grammar's token suffixes");
                }
            }
            v->sctx[k].suffix[v->sctx[k].n_hard] = (int32_t)id;
            v->sctx[k].hard[v->sctx[k].n_hard++] = (int32_t)t;
        }
    }
    for (int k = 0; k < N_SCTX; k++) { /* the lists to their size */
        const size_t n = (size_t)(v->sctx[k].n_hard ? v->sctx[k].n_hard : 1);
        int32_t *h = realloc(v->sctx[k].hard, n * sizeof *h), *x = realloc(v->sctx[k].suffix, n * sizeof *x);
        if (h) v->sctx[k].hard = h;
        if (x) v->sctx[k].suffix = x;
    }
    st_strmap_free(&suffixes);
    for (int i = 0; i < v->n_added; i++) { /* the added tokens' bytes, for tool calls */
        size_t len = 0;
        v->bytes[v->added[i]] = st_tok_token_bytes(tok, v->added[i], &len);
        v->lens[v->added[i]] = (uint32_t)len;
    }
    *out = v;
    return ST_OK;
}

void st_gram_vocab_free(st_gram_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->same);
    free(v->bytes);
    free(v->lens);
    free(v->text_safe);
    free(v->text_nl);
    free(v->nchars);
    for (int m = 0; m < 4; m++) {
        free(v->hex[m].tok);
        free(v->hex[m].val);
        free(v->hex[m].rest);
        free(v->hex[m].suffix);
    }
    for (int k = 0; k < N_SCTX; k++) {
        free(v->sctx[k].safe);
        free(v->sctx[k].hard);
        free(v->sctx[k].suffix);
    }
    free(v->suf_bytes);
    free(v->suf_lens);
    free(v->suf_fits);
    for (int i = 0; i < GB_CACHE; i++) free(v->gbc[i].mask);
    free(v);
}

size_t st_gram_mask_words(const st_gram_vocab *v) { return v->words; }

static void set_tokens(st_gram_vocab *v, int32_t t, uint32_t *mask) {
    for (; t >= 0; t = v->same[t]) {
        mask[t / 32] |= 1u << (t % 32);
        v->n_set++;
    }
}

/* every token under node's children, from state g (the path to node fed) */
static void walk(st_gram_vocab *v, const st_gram_schema *sc, int32_t node, const st_gram_state *g, uint32_t *mask) {
    for (int32_t c = v->nodes[node].first_child; c >= 0; c = v->nodes[c].next_sibling) {
        st_gram_state s;
        copy_live(&s, g);
        if (!feed1(&s, sc, v->nodes[c].byte)) continue;
        if (v->nodes[c].token >= 0) set_tokens(v, v->nodes[c].token, mask);
        if (v->nodes[c].first_child >= 0) walk(v, sc, c, &s, mask);
    }
}

static int64_t popcount_words(const uint32_t *m, size_t n) {
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += __builtin_popcount(m[i]);
    return c;
}

/* inside a \\u escape (not a matched key): the tokens that start with the digits it needs;
 * the code unit they complete decides, then what follows as any string text */
static int64_t hex_mask(st_gram_vocab *v, const st_gram_schema *sc, const st_gram_state *g, uint32_t *mask) {
    const int m = 4 - g->lit_pos, low = g->lit;
    memset(mask, 0, v->words * sizeof *mask);
    int suffixes_run = 0;
    for (int64_t i = 0; i < v->hex[m - 1].n; i++) {
        const int32_t t = v->hex[m - 1].tok[i];
        const int rest = v->hex[m - 1].rest[i];
        int fits;
        if (rest == REST_INSIDE) {
            fits = 1; /* more digits to come */
        } else {
            const unsigned u = ((unsigned)g->unit << (4 * m) | v->hex[m - 1].val[i]) & 0xffffu;
            if (low ? u < 0xDC00 || u > 0xDFFF : u == 0 || (u >= 0xDC00 && u <= 0xDFFF)) continue;
            if (!low && u >= 0xD800 && u <= 0xDBFF) { /* a high surrogate: its pair must follow */
                st_gram_state s;
                copy_live(&s, g);
                fits = st_gram_feed(&s, sc, v->bytes[t], v->lens[t]);
            } else if (rest == REST_STAYS) {
                fits = 1;
            } else if (rest == REST_CLOSES) {
                if (!suffixes_run) { /* the suffixes from here, once */
                    for (int64_t k = 0; k < v->n_suf; k++) {
                        st_gram_state s;
                        copy_live(&s, g);
                        s.sub = S_PLAIN, s.utf8_need = 0, s.unit = 0;
                        v->suf_fits[k] = (uint8_t)st_gram_feed(&s, sc, v->suf_bytes[k], v->suf_lens[k]);
                    }
                    suffixes_run = 1;
                }
                fits = v->suf_fits[v->hex[m - 1].suffix[i]];
            } else {
                fits = 0;
            }
        }
        if (fits) mask[t / 32] |= 1u << (t % 32);
    }
    return popcount_words(mask, v->words);
}

static int64_t mask_of(st_gram_vocab *v, const st_gram_schema *sc, const st_gram_state *g, uint32_t *mask);

/* GBNF: every token under node's children from the match s (the path to node fed) */
static void walk_gb(st_gram_vocab *v, const gram_gbnf *G, int32_t node, const st_gram_gbnf *s, uint32_t *mask) {
    for (int32_t c = v->nodes[node].first_child; c >= 0; c = v->nodes[c].next_sibling) {
        st_gram_gbnf t;
        st_gram_gbnf_copy(&t, s);
        if (!st_gram_gbnf_feed1(G, &t, v->nodes[c].byte)) continue;
        if (v->nodes[c].token >= 0) set_tokens(v, v->nodes[c].token, mask);
        if (v->nodes[c].first_child >= 0) walk_gb(v, G, c, &t, mask);
    }
}

/* the same match, the bounds' flag aside */
static int gb_same(const st_gram_gbnf *a, const st_gram_gbnf *b) {
    return a->n == b->n && a->need == b->need && a->cp == b->cp && a->lo == b->lo &&
           !memcmp(a->off, b->off, (size_t)(a->n + 1) * sizeof a->off[0]) &&
           !memcmp(a->cells, b->cells, (size_t)a->off[a->n] * sizeof a->cells[0]);
}

static int64_t gbnf_walk_mask(st_gram_vocab *v, const gram_gbnf *G, const st_gram_gbnf *sp, uint32_t *mask);

static int64_t gbnf_mask(st_gram_vocab *v, const gram_gbnf *G, const st_gram_state *g, uint32_t *mask) {
    st_gram_gbnf s;
    if (g->gb.started) st_gram_gbnf_copy(&s, &g->gb);
    else st_gram_gbnf_start(G, &s);
    int oldest = 0;
    for (int i = 0; i < GB_CACHE; i++) {
        if (v->gbc[i].grammar == G->hash && gb_same(&v->gbc[i].state, &s)) {
            v->gbc[i].used = ++v->gb_tick;
            memcpy(mask, v->gbc[i].mask, v->words * sizeof *mask);
            return v->gbc[i].n;
        }
        if (v->gbc[i].used < v->gbc[oldest].used) oldest = i;
    }
    const int64_t n = gbnf_walk_mask(v, G, &s, mask);
    v->gbc[oldest].grammar = G->hash;
    st_gram_gbnf_copy(&v->gbc[oldest].state, &s);
    memcpy(v->gbc[oldest].mask, mask, v->words * sizeof *mask);
    v->gbc[oldest].n = n;
    v->gbc[oldest].used = ++v->gb_tick;
    return n;
}

/* the trie walked from the match s, then the added tokens one by one */
static int64_t gbnf_walk_mask(st_gram_vocab *v, const gram_gbnf *G, const st_gram_gbnf *sp, uint32_t *mask) {
    st_gram_gbnf s;
    st_gram_gbnf_copy(&s, sp);
    memset(mask, 0, v->words * sizeof *mask);
    v->n_set = 0;
    walk_gb(v, G, 0, &s, mask);
    for (int i = 0; i < v->n_added; i++) { /* added tokens are text like any other here */
        const int32_t t = v->added[i];
        st_gram_gbnf u;
        st_gram_gbnf_copy(&u, &s);
        int fits = !(mask[t / 32] >> (t % 32) & 1u);
        for (uint32_t k = 0; fits && k < v->lens[t]; k++) fits = st_gram_gbnf_feed1(G, &u, (unsigned char)v->bytes[t][k]);
        if (fits) {
            mask[t / 32] |= 1u << (t % 32);
            v->n_set++;
        }
    }
    return v->n_set;
}

int64_t st_gram_mask(st_gram_vocab *v, const st_gram_schema *sc, const st_gram_state *g, uint32_t *mask) {
    if (g->mode == ST_GRAM_GBNF) {
        if (!sc || !sc->gb) {
            memset(mask, 0, v->words * sizeof *mask);
            return 0;
        }
        return gbnf_mask(v, sc->gb, g, mask);
    }
    int64_t n = mask_of(v, sc, g, mask);
    if (g->mode == ST_GRAM_TOOL_CALL && g->phase >= X_START && g->phase != X_TEXT) /* <tool_call> and its kin, where they fit */
        for (int i = 0; i < v->n_added; i++) {
            const int32_t t = v->added[i];
            st_gram_state s;
            copy_live(&s, g);
            if (!(mask[t / 32] >> (t % 32) & 1u) && st_gram_feed(&s, sc, v->bytes[t], v->lens[t])) {
                mask[t / 32] |= 1u << (t % 32);
                n++;
            }
        }
    return n;
}

static int64_t mask_of(st_gram_vocab *v, const st_gram_schema *sc, const st_gram_state *g, uint32_t *mask) {
    if (g->phase == X_TEXT && g->cpos == 0 && g->utf8_need == 0) {
        /* text without a newline at once; the tokens with one run from here */
        memcpy(mask, v->text_safe, v->words * sizeof *mask);
        for (int64_t i = 0; i < v->n_text_nl; i++) {
            const int32_t t = v->text_nl[i];
            st_gram_state s;
            copy_live(&s, g);
            if (st_gram_feed(&s, sc, v->bytes[t], v->lens[t])) mask[t / 32] |= 1u << (t % 32);
        }
        return popcount_words(mask, v->words);
    }
    const int k = string_ctx_of(sc, g);
    if (k >= 0) {
        /* the context-independent tokens at once; those that close the string by their
         * suffix, each distinct suffix run once from here */
        if (bounded_string(sc, g)) { /* k == 0: the tokens that stay inside, by their characters */
            const int64_t room = node_of(sc, g->vnode)->max_items - (int64_t)g->slen;
            memset(mask, 0, v->words * sizeof *mask);
            for (size_t w = 0; w < v->words; w++)
                for (uint32_t bits = v->sctx[0].safe[w]; bits; bits &= bits - 1) {
                    const size_t t = w * 32 + (size_t)__builtin_ctz(bits);
                    if ((int64_t)v->nchars[t] <= room) mask[w] |= 1u << (t % 32);
                }
            for (int64_t i = 0; i < v->sctx[0].n_hard; i++) { /* closing ones run whole */
                const int32_t t = v->sctx[0].hard[i];
                st_gram_state s;
                copy_live(&s, g);
                if (st_gram_feed(&s, sc, v->bytes[t], v->lens[t])) mask[t / 32] |= 1u << (t % 32);
            }
            return popcount_words(mask, v->words);
        }
        memcpy(mask, v->sctx[k].safe, v->words * sizeof *mask);
        if (matched_key(sc, g)) { /* a key any text may be: what precedes the quote picks the
                                     property, so each closing token runs whole */
            for (int64_t i = 0; i < v->sctx[k].n_hard; i++) {
                const int32_t t = v->sctx[k].hard[i];
                st_gram_state s;
                copy_live(&s, g);
                if (st_gram_feed(&s, sc, v->bytes[t], v->lens[t])) mask[t / 32] |= 1u << (t % 32);
            }
            return popcount_words(mask, v->words);
        }
        if (v->sctx[k].n_hard) {
            for (int64_t i = 0; i < v->n_suf; i++) {
                st_gram_state s;
                copy_live(&s, g);
                s.sub = S_PLAIN, s.utf8_need = 0;
                v->suf_fits[i] = (uint8_t)st_gram_feed(&s, sc, v->suf_bytes[i], v->suf_lens[i]);
            }
        }
        const int32_t *hard = v->sctx[k].hard, *suf = v->sctx[k].suffix;
        for (int64_t i = 0; i < v->sctx[k].n_hard; i++)
            if (v->suf_fits[suf[i]]) mask[hard[i] / 32] |= 1u << (hard[i] % 32);
        return popcount_words(mask, v->words);
    }
    if (g->phase == P_STRING && g->sub == S_HEX && !matched_key(sc, g) && !bounded_string(sc, g) && !g->pat)
        return hex_mask(v, sc, g, mask); /* (what follows an escape in a bounded string counts: the walk) */
    memset(mask, 0, v->words * sizeof *mask);
    v->n_set = 0;
    if (g->phase != P_DONE) walk(v, sc, 0, g, mask);
    return v->n_set;
}

int st_gram_advance(const st_gram_vocab *v, const st_gram_schema *sc, st_gram_state *g, int32_t t) {
    if (t < 0 || t >= v->V || !v->bytes[t]) return 0;
    for (int i = 0; i < v->n_added && g->mode != ST_GRAM_GBNF; i++) /* only between a tool call's parts */
        if (v->added[i] == t && (g->mode != ST_GRAM_TOOL_CALL || g->phase < X_START || g->phase == X_TEXT)) return 0;
    return st_gram_feed(g, sc, v->bytes[t], v->lens[t]);
}

void st_gram_apply(const uint32_t *mask, float *logits, int64_t n) {
    const int64_t full = n / 32;
    for (int64_t w = 0; w < full; w++) { /* whole words: most are all ones or all zeros */
        const uint32_t m = mask[w];
        float *l = logits + w * 32;
        if (m == 0xffffffffu) continue;
        if (m == 0) {
            for (int i = 0; i < 32; i++) l[i] = -INFINITY;
            continue;
        }
        for (uint32_t z = ~m; z; z &= z - 1) l[__builtin_ctz(z)] = -INFINITY;
    }
    for (int64_t t = full * 32; t < n; t++)
        if (!(mask[t / 32] >> (t % 32) & 1u)) logits[t] = -INFINITY;
}
