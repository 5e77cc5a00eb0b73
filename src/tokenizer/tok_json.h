/* ==== Tokenizer: strict JSON scanner (internal; see tok_json.c) ==== */
#ifndef ST_TOKENIZER_TOK_JSON_H
#define ST_TOKENIZER_TOK_JSON_H

#include <stddef.h>
#include <stdint.h>

/* A read position in a JSON text. Functions return 0 (or 1, see tj_next) on success and -1 on
 * a syntax error, which sets err/err_at once (later errors keep the first). */
typedef struct tj_cur {
    const char *p, *end; /* the unread text, borrowed */
    const char *err;     /* first error message (static string), NULL when none */
    const char *err_at;  /* where it was found */
    char *scratch;       /* unescaped strings, owned: free() it when done */
    size_t scratch_cap;
} tj_cur;

/* A string value: points into the text (no escapes) or into cur->scratch (valid until the
 * next string is read). */
typedef struct tj_str {
    const char *s;
    size_t len;
} tj_str;

int st_tok_tj_peek(tj_cur *c);           /* next non-space byte, or -1 at the end */
int st_tok_tj_expect(tj_cur *c, char ch); /* consume ch after spaces */
int st_tok_tj_string(tj_cur *c, tj_str *out);
int st_tok_tj_int(tj_cur *c, int64_t *v); /* an integer (no fraction/exponent); saturates */
int st_tok_tj_skip(tj_cur *c);            /* any value, validated */

/* Element iteration in a container whose opening `open` was consumed: returns 1 when an element
 * follows (for objects: the cursor is at its key), 0 after the closing bracket, -1 on error.
 * *first must start at 1. */
int st_tok_tj_next(tj_cur *c, char open, int *first);

/* 1-based line and column of the error (or of the cursor) from the text's start. */
void st_tok_tj_where(const char *start, const tj_cur *c, int *line, int *col);

#endif /* ST_TOKENIZER_TOK_JSON_H */
