/* ==== Chat templates: a Jinja interpreter with Hugging Face's semantics ====
 *
 * A model's chat template turns a list of messages into the prompt text. Hugging Face
 * transformers renders it with jinja2's ImmutableSandboxedEnvironment (trim_blocks and
 * lstrip_blocks on, the loopcontrols extension, a tojson filter that keeps non-ASCII text,
 * raise_exception() and strftime_now() globals); this module renders the same bytes.
 *
 *   st_tmpl *t;
 *   if (st_tmpl_compile(src, len, NULL, &t, &err) != ST_OK) ...;   // once
 *   st_tmpl_render(t, context_object, &out, &out_len, &err);        // many times, any thread
 *   free(out);
 *   st_tmpl_free(t);
 *
 * The context is a JSON object whose members become template variables. Templates are
 * untrusted: parse and runtime errors, and the limits in st_tmpl_params, come back as an
 * st_status with a message naming the template line ("line 12: No messages provided.").
 *
 * st_chat_template_* finds a model's template the way transformers does and builds the
 * context transformers passes (messages, tools, documents, add_generation_prompt, the special
 * tokens, extra keywords).
 */
#ifndef ST_TEMPLATE_TEMPLATE_H
#define ST_TEMPLATE_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct json_t json_t;

/* Limits for one compiled template's renders (and its parse). */
typedef struct st_tmpl_params {
    size_t max_output;      /* bytes of rendered text, captures included (default 64 MiB) */
    size_t max_memory;      /* bytes of render-time values (default 512 MiB) */
    int64_t max_loop_iters; /* for-loop iterations per render (default 10,000,000) */
    int64_t max_steps;      /* evaluation work units per render (default 1,000,000,000) */
    int max_call_depth;     /* nested macro calls (default 100) */
    int max_nesting;        /* nesting of blocks and expressions in the source (default 200) */
    int64_t fixed_time;     /* strftime_now() time in seconds since the epoch; 0 = now */
} st_tmpl_params;

st_tmpl_params st_tmpl_default_params(void);

/* A compiled template: immutable after compile, safe to render from several threads. */
typedef struct st_tmpl st_tmpl;

/* Compile src[len] (UTF-8). params may be NULL (defaults). On failure *out is NULL and err
 * holds "line N: ..." (ST_ERR_FORMAT for syntax errors). */
st_status st_tmpl_compile(const char *src, size_t len, const st_tmpl_params *params,
                          st_tmpl **out, st_error *err);

/* Render with the members of the JSON object `context` as variables (NULL = none).
 * *out is malloc'ed, NUL-terminated (the caller frees it); *out_len excludes the NUL.
 * Errors: ST_ERR_ARG (raise_exception, undefined values, type errors...), ST_ERR_LIMIT. */
st_status st_tmpl_render(const st_tmpl *t, const json_t *context, char **out, size_t *out_len,
                         st_error *err);

void st_tmpl_free(st_tmpl *t);

/* ==== A model's chat template ==== */

/* The templates of a model directory (or of one file) and its special tokens. */
typedef struct st_chat_template st_chat_template;

/* Find and compile the chat template of model_dir, with transformers' precedence:
 *   1. chat_template.jinja (plus additional_chat_templates/NAME.jinja as named ones),
 *   2. chat_template.json ({"chat_template": ...}),
 *   3. tokenizer_config.json "chat_template" (a string, or a list of {"name","template"}).
 * Special tokens (bos_token, eos_token, ... as strings or {"content": ...}) come from
 * tokenizer_config.json when present. `name` selects a named template (NULL: per request,
 * "tool_use" when tools are given and it exists, else "default"). */
st_status st_chat_template_load(const char *model_dir, const char *name,
                                const st_tmpl_params *params, st_chat_template **out,
                                st_error *err);

/* Load from one file: a raw Jinja template, or (a name ending in .json) a
 * tokenizer_config.json / chat_template.json. */
st_status st_chat_template_load_file(const char *path, const char *name,
                                     const st_tmpl_params *params, st_chat_template **out,
                                     st_error *err);

/* Render a chat the way transformers' apply_chat_template does:
 *   render(messages=messages, tools=tools, documents=documents,
 *          add_generation_prompt=..., **special_tokens, **kwargs)
 * messages: a JSON array. tools/documents: arrays or NULL (None in the template).
 * kwargs: an object of extra keywords (add_generation_prompt, enable_thinking, ...) or NULL;
 * its members override special tokens. */
st_status st_chat_template_render(const st_chat_template *ct, const json_t *messages,
                                  const json_t *tools, const json_t *documents,
                                  const json_t *kwargs, char **out, size_t *out_len,
                                  st_error *err);

/* Render a request object {"messages": [...], "tools": [...], "documents": [...],
 * "add_generation_prompt": true, ...}: every other member is passed as a keyword. */
st_status st_chat_template_render_request(const st_chat_template *ct, const json_t *request,
                                          char **out, size_t *out_len, st_error *err);

/* The special-token strings found ({"bos_token": "<s>", ...}); borrowed, never NULL. */
const json_t *st_chat_template_special_tokens(const st_chat_template *ct);
/* Where the default template came from (a path, with [name] for named templates). */
const char *st_chat_template_origin(const st_chat_template *ct);

void st_chat_template_free(st_chat_template *ct);

#endif /* ST_TEMPLATE_TEMPLATE_H */
