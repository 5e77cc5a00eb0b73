/* ==== OpenAI API requests: parsing and validation ====
 *
 * Turns the JSON body of POST /v1/chat/completions or /v1/completions into what the engine
 * needs (normalised messages, tools and template keywords for the chat template, or a text
 * or token-id prompt; sampling, stop and logprob settings), or into an OpenAI-shaped error
 * with the HTTP status it deserves. Pure: no model, no network; safe to fuzz.
 *
 * Normalisation for the chat template: developer messages are system messages; the system
 * messages that open the chat are merged, in order, into one; a system message after the
 * first turn stays where it is (the template decides: Qwen's rejects it, and that error is
 * the client's 400); content given as a list of
 * text parts becomes a string; assistant tool-call arguments given as JSON text become
 * objects (Qwen templates iterate them). enable_thinking, reasoning_effort and
 * chat_template_kwargs become template keywords.
 */
#ifndef ST_SERVER_OAI_H
#define ST_SERVER_OAI_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "engine/scheduler.h"

typedef struct json_t json_t;

#define ST_OAI_MAX_DEPTH 64

typedef enum st_oai_kind {
    ST_OAI_CHAT = 1,
    ST_OAI_COMPLETION = 2,
} st_oai_kind;

typedef struct st_oai_error {
    int status;         /* HTTP status */
    char type[40];      /* "invalid_request_error", "not_found_error", ... */
    char param[64];     /* the offending field, or "" */
    char code[48];      /* machine-readable code, or "" */
    char message[600];
} st_oai_error;

void st_oai_error_set(st_oai_error *e, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} as malloc'ed text */
char *st_oai_error_json(const st_oai_error *e);

typedef struct st_oai_defaults {
    st_sampling sampling;      /* used for fields the request omits (generation_config.json) */
    int64_t max_tokens_completion; /* /v1/completions without max_tokens (OpenAI: 16) */
    const char *model_name;    /* the served model's id; other names get 404 */
    int max_images;            /* images a chat request may hold (0: image parts are refused) */
    const char *no_images_why; /* why a request's image parts are refused when max_images is 0 */
    const char *media_dir;     /* file:// image URLs are read when their real path lies under this
                                  directory (itself a real path, no trailing /); NULL: never */
    size_t max_image_bytes;    /* a file:// image's size limit */
} st_oai_defaults;

typedef struct st_oai_request {
    st_oai_kind kind;
    char *model;               /* owned, may be NULL */
    int stream;
    int include_usage;         /* stream_options.include_usage */
    json_t *messages;          /* chat: normalised (owned) */
    json_t *tools;             /* chat: the tools array or NULL (owned) */
    json_t *kwargs;            /* chat: template keywords (owned) */
    char *prompt;              /* completion: text prompt (owned) or NULL */
    int32_t *prompt_ids;       /* completion: token-id prompt (owned) or NULL */
    int64_t n_prompt_ids;
    int logprobs;              /* 1 when log-probabilities are asked */
    int top_logprobs;          /* alternatives per token (0..20) */
    int echo;                  /* completion: the prompt is part of the returned text */
    int n_return;              /* choices returned (n); params.n of them run (best_of) */
    char **images;             /* chat: [n_images] the image_url parts' bytes, in message order (owned) */
    size_t *image_lens;
    int n_images;
    st_req_params params;      /* stop strings point into stop_buf */
    char stop_buf[ST_MAX_STOP][ST_MAX_STOP_LEN + 1];
} st_oai_request;

/* Parse a request body. On failure fills e (status 400/404/413) and returns its status code
 * as ST_ERR_ARG (out is freed). */
st_status st_oai_parse(st_oai_kind kind, const char *body, size_t len, const st_oai_defaults *d,
                       st_oai_request *out, st_oai_error *e);
void st_oai_request_free(st_oai_request *r);

/* Deepest nesting of a JSON text (brackets outside strings); stops counting past limit. */
int st_oai_json_depth(const char *s, size_t n, int limit);

#endif /* ST_SERVER_OAI_H */
