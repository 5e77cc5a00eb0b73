/* ==== Tool calls in generated text ====
 *
 * Qwen models call tools by writing blocks into their answer:
 *   Qwen3 (JSON):    <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>
 *   Qwen3.5 (XML):   <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>
 * This module finds those blocks and turns them into OpenAI tool calls: a name and the
 * arguments as a JSON object text. XML parameter values are text; they are converted with the
 * type the request's tool schema gives the parameter (number, integer, boolean, object,
 * array), and stay strings otherwise. Text before the first block is the message content.
 */
#ifndef ST_SERVER_TOOLCALL_H
#define ST_SERVER_TOOLCALL_H

#include <stddef.h>

typedef struct json_t json_t;

#define ST_TOOLCALL_OPEN "<tool_call>"

typedef struct st_tool_call {
    char *name;      /* owned */
    char *arguments; /* owned: a JSON object as text */
} st_tool_call;

typedef struct st_tool_calls {
    st_tool_call *calls; /* [n], owned */
    int n;
    char *content;       /* owned: text before the first call, trimmed; NULL when empty */
} st_tool_calls;

/* Parse text[len]. tools: the request's tools array (may be NULL). Returns 1 and fills out when
 * at least one well-formed call is found; 0 otherwise (out is left empty: the text is plain
 * content). */
int st_toolcall_parse(const char *text, size_t len, const json_t *tools, st_tool_calls *out);
void st_tool_calls_free(st_tool_calls *tc);

#endif /* ST_SERVER_TOOLCALL_H */
