/* ==== From generated tokens to text deltas: stop strings and reasoning ====
 *
 * Per sequence, a fixed-size pipeline turns each generated token into the text deltas a
 * client sees:
 *   token -> streaming detokenizer (complete UTF-8 only, special tokens skipped)
 *         -> stop strings: matched on the text across token boundaries; the text that could
 *            still become a stop string is held back, a matched stop string is not emitted
 *         -> reasoning split: text inside <think> ... </think> goes to `reasoning`, the rest
 *            to `content` (starting in reasoning when the prompt already opened a think
 *            block, as the Qwen3.5 template does); whitespace before the reasoning and at the
 *            start of the content is dropped, and the last ST_TEXTOUT_WS_HOLD bytes of
 *            whitespace before </think> (or before the end inside a think block) are
 *            trimmed; a partial tag is held back.
 *
 * Hold-back is bounded by construction, whatever the text: the stop filter holds at most the
 * longest proper prefix of a stop string, the splitter at most a partial tag plus
 * ST_TEXTOUT_WS_HOLD bytes of whitespace; anything that can no longer begin a marker is
 * emitted. A stop string ends the text at the match that completes first (the longest one
 * among those completing at the same byte). The result does not depend on how the text is
 * cut into tokens. All buffers are sized at creation; feeding a token allocates nothing.
 */
#ifndef ST_ENGINE_TEXTOUT_H
#define ST_ENGINE_TEXTOUT_H

#include <stddef.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

#define ST_MAX_STOP 16      /* stop strings per request */
#define ST_MAX_STOP_LEN 256 /* bytes per stop string */
#define ST_TEXTOUT_WS_HOLD 64 /* trailing reasoning whitespace held (and trimmed) at most */

typedef struct st_textout st_textout;

typedef struct st_text_delta {
    const char *content;   /* [content_len] bytes, owned by the textout, valid until next call */
    size_t content_len;
    const char *reasoning; /* [reasoning_len] */
    size_t reasoning_len;
    int stopped;           /* a stop string matched: the sequence ends (finish "stop") */
    int in_reasoning;      /* the state after this delta */
} st_text_delta;

/* max_token_bytes: the longest token's byte length (see st_textout_max_token_bytes). */
st_status st_textout_create(const st_tokenizer *tok, size_t max_token_bytes, st_textout **out,
                            st_error *err);
void st_textout_destroy(st_textout *t);

/* The longest byte string any token of tok decodes to. */
size_t st_textout_max_token_bytes(const st_tokenizer *tok);

/* Start a new sequence. stops: n_stop strings (copied; each 1..ST_MAX_STOP_LEN bytes of
 * valid UTF-8);
 * split_reasoning: 0 = all text is content; start_in_reasoning: the prompt opened <think>. */
st_status st_textout_reset(st_textout *t, const char *const *stops, int n_stop,
                           int split_reasoning, int start_in_reasoning, int skip_special,
                           st_error *err);

/* Feed one generated token; fills *d. After d->stopped, further feeds produce nothing. */
void st_textout_feed(st_textout *t, int32_t token, st_text_delta *d);

/* End of generation (eos, length, cancel): release everything held back. */
void st_textout_finish(st_textout *t, st_text_delta *d);

/* The most bytes of content plus reasoning one feed or finish can emit. */
size_t st_textout_max_delta(const st_textout *t);

/* 1 while the text is inside a think block. */
int st_textout_in_reasoning(const st_textout *t);

/* 1 when a rendered prompt leaves a <think> block open, i.e. generation starts inside the
 * reasoning (the Qwen3.5 template ends its generation prompt with "<think>\n"). */
int st_textout_prompt_opens_think(const char *prompt);

#endif /* ST_ENGINE_TEXTOUT_H */
