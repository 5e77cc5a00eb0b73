/* ==== Constrained decoding: a JSON automaton and the token masks it allows ====
 *
 * A reply constrained to JSON is read byte by byte by a pushdown automaton whose whole state
 * is one fixed-size struct (st_gram_state: what is expected, a container stack of at most
 * ST_GRAM_MAX_DEPTH, the lexer's sub-state), so a sequence's grammar state is plain data
 * planned with its record: copied, never allocated.
 *
 * Per vocabulary (st_gram_vocab, made once per tokenizer), every token's bytes sit in a
 * trie. A mask (one bit per token: it keeps the reply inside the grammar) is the trie walked
 * from the current state, each subtree pruned at its first rejected byte; inside a string,
 * where nearly every token fits, the tokens without a quote come from a mask precomputed at a
 * character boundary (they stay inside the string, so the containers do not matter: context-
 * independent tokens, as xgrammar keeps them) and only those with a quote are run. Special and added tokens are never allowed: a reply ends
 * when its value is complete (st_gram_done), not at a token.
 *
 * Thread ownership: a vocabulary's scratch is its own; one thread at a time calls
 * st_gram_mask on it (the scheduler thread).
 */
#ifndef ST_GRAMMAR_GRAMMAR_H
#define ST_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

#define ST_GRAM_MAX_DEPTH 32 /* nested objects and arrays */
#define ST_GRAM_MAX_WS 16    /* whitespace bytes in a row (a model looping on newlines ends) */
#define ST_GRAM_MAX_PROPS 64 /* properties of one object in a schema */
#define ST_GRAM_MAX_LITS 64  /* values of one enum */

typedef enum st_gram_mode {
    ST_GRAM_NONE = 0,
    ST_GRAM_JSON_OBJECT = 1, /* response_format json_object: one JSON object */
    ST_GRAM_JSON_VALUE = 2,  /* any JSON value */
    ST_GRAM_JSON_SCHEMA = 3, /* a value a compiled JSON schema accepts */
    ST_GRAM_TOOL_CALL = 4,   /* one call of a compiled tool set, in Qwen3.5's XML format:
                                <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
                                ...</function>\n</tool_call> */
    ST_GRAM_GBNF = 5,        /* text a GBNF grammar accepts (st_gram_gbnf_compile) */
} st_gram_mode;

/* A JSON schema compiled for the automaton (immutable; any thread may read it). */
typedef struct st_gram_schema st_gram_schema;

/* Compile the schema in json[len] (the subset: type (a name or a list), properties,
 * required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, oneOf,
 * $ref to #/$defs/NAME or #/definitions/NAME; integers' minimum and maximum; strings'
 * minLength and maxLength (characters: code points) and pattern (a regular expression:
 * gbnf.c's subset); numbers' minimum and maximum (and
 * the exclusive ones: such a number is written without an exponent); title,
 * description, default and $schema are read past). Another keyword is an error naming it
 * when strict, and is ignored otherwise (as OpenAI does). ST_ERR_ARG naming the problem. */
st_status st_gram_schema_compile(const char *json, size_t len, int strict, st_gram_schema **out, st_error *err);
void st_gram_schema_free(st_gram_schema *s);

/* Compile a request's tools (the OpenAI 'tools' array as JSON text) for ST_GRAM_TOOL_CALL:
 * every function, or only the one named `only` (tool_choice naming a function). A parameter
 * whose schema is a string is raw text between the tags; any other is a JSON value its schema
 * accepts (compiled as not strict). ST_ERR_ARG naming the problem. */
st_status st_gram_tools_compile(const char *tools_json, size_t len, const char *only, st_gram_schema **out, st_error *err);

/* Compile a GBNF grammar (llama.cpp's format, as llama-server's 'grammar' field takes it):
 * rules NAME ::= alternatives, the start rule 'root'; literals "..." and classes [...] / [^...]
 * with escapes (\n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), '.' (any character), groups
 * ( ... ), postfix * + ? {m} {m,} {m,n} (counts up to 1000), # comments. An undefined rule,
 * left recursion or a syntax error is ST_ERR_ARG naming it (and the byte offset). The result
 * is a schema for ST_GRAM_GBNF. */
st_status st_gram_gbnf_compile(const char *text, size_t len, st_gram_schema **out, st_error *err);

/* A GBNF match in progress: a set of stacks of element positions (gbnf.c); what does not fit
 * the bounds is dropped (the rest still only accepts what the grammar does). */
#define ST_GRAM_GB_STACKS 32
#define ST_GRAM_GB_DEPTH 48
#define ST_GRAM_GB_CELLS 512
typedef struct st_gram_gbnf {
    uint8_t started, n;   /* the set is made; its stacks */
    uint8_t need;         /* UTF-8 continuation bytes the character being read still needs */
    uint8_t dropped;      /* a way was dropped at a bound */
    uint32_t cp, lo;      /* that character's bits so far; its least value (no overlong forms) */
    uint16_t off[ST_GRAM_GB_STACKS + 1]; /* stack i: cells[off[i], off[i + 1]), its top last */
    uint16_t cells[ST_GRAM_GB_CELLS];    /* last: only [0, off[n]) is live */
} st_gram_gbnf;

/* One container on the automaton's stack. */
typedef struct st_gram_frame {
    int16_t node;   /* its schema node (-1: any JSON) */
    uint8_t object; /* 1: an object, 0: an array */
    uint32_t count; /* an array's elements so far */
    uint64_t seen;  /* an object's properties given so far (bit i: its property i) */
} st_gram_frame;

typedef struct st_gram_state {
    uint8_t mode;      /* st_gram_mode */
    uint8_t phase;     /* what the next byte may be (grammar.c) */
    uint8_t sub;       /* within a string, number or literal */
    uint8_t lit;       /* the literal being read (true, false, null), */
    uint8_t lit_pos;   /* and how far */
    uint8_t utf8_need; /* continuation bytes a string still expects */
    uint8_t ws;        /* whitespace bytes in a row */
    uint8_t str_key;   /* the string is an object's key */
    uint8_t depth;     /* open containers */
    uint8_t neg;       /* the integer being read is negative */
    uint8_t key_free;  /* the key being read may be one no property has */
    uint16_t unit;     /* a \\u escape's code unit so far */
    int16_t vnode;     /* the schema node of the value expected or being read (-1: any) */
    uint16_t cpos;     /* bytes of a key or enum value matched so far */
    uint64_t cand;     /* the properties (a key) or enum values still matching */
    int64_t acc;       /* the integer's digits so far (a number's integer part) */
    int64_t frac;      /* a bounded number's fraction digits so far (lit_pos of them) */
    uint32_t slen;     /* characters of the string value being read (minLength, maxLength) */
    int16_t fn;        /* a tool call's function (ST_GRAM_TOOL_CALL), */
    int16_t param;     /* the parameter whose value is read, */
    uint64_t pseen;    /* and the parameters given */
    uint8_t pat;       /* the string value being read has a pattern: gb matches its characters */
    uint16_t hi_surr;  /* a \u escape's high surrogate, while its low half is read */
    st_gram_frame stack[ST_GRAM_MAX_DEPTH]; /* only [0, depth) is live */
    st_gram_gbnf gb;   /* ST_GRAM_GBNF's; a JSON schema's pattern string's (while pat) */
} st_gram_state;

void st_gram_init(st_gram_state *g, st_gram_mode mode);
/* After st_gram_init, with the request's schema: ST_GRAM_GBNF makes its start set (feeding and
 * masking make it too when it is not made yet); the other modes need nothing. */
void st_gram_begin(st_gram_state *g, const st_gram_schema *sc);
/* ST_GRAM_GBNF: 1 when the reply may end here (the text so far is a sentence; the model's
 * end-of-sequence tokens are then allowed beside the mask). The JSON modes: st_gram_done. */
int st_gram_may_end(const st_gram_state *g);
/* Feed n bytes: 1 when every one is allowed (g advanced), 0 when one is not (g is then
 * undefined: feed a copy to try). sc: the schema of ST_GRAM_JSON_SCHEMA, else NULL. */
int st_gram_feed(st_gram_state *g, const st_gram_schema *sc, const char *bytes, size_t n);
/* 1 when the value is complete (GBNF: a sentence nothing may follow): the reply ends here. */
int st_gram_done(const st_gram_state *g);

typedef struct st_gram_vocab st_gram_vocab;

/* The tokens of tok (ids below vocab_size; the model's vocabulary may be larger than the
 * tokenizer's: those ids are never allowed). */
st_status st_gram_vocab_create(const st_tokenizer *tok, int64_t vocab_size, st_gram_vocab **out, st_error *err);
void st_gram_vocab_free(st_gram_vocab *v);
/* uint32 words of a mask (vocab_size bits) */
size_t st_gram_mask_words(const st_gram_vocab *v);
/* mask[st_gram_mask_words]: bit t set when token t's bytes keep g inside the grammar (sc as
 * for st_gram_feed). Returns how many are set. */
int64_t st_gram_mask(st_gram_vocab *v, const st_gram_schema *sc, const st_gram_state *g, uint32_t *mask);
/* g after token t: 1, or 0 when t does not fit (g undefined). */
int st_gram_advance(const st_gram_vocab *v, const st_gram_schema *sc, st_gram_state *g, int32_t t);
/* logits[n]: -infinity where the mask's bit is clear */
void st_gram_apply(const uint32_t *mask, float *logits, int64_t n);

#endif /* ST_GRAMMAR_GRAMMAR_H */
