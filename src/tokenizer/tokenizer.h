/* ==== Tokenizer: byte-level BPE from a Hugging Face tokenizer.json ====
 *
 * Loads a Qwen-family `tokenizer.json` (model type BPE, ByteLevel pre-tokenizer and decoder) and
 * turns text into token ids exactly like Hugging Face `tokenizers` does for
 * `encode(text, add_special_tokens=False)`, and ids back into text like
 * `decode(ids, skip_special_tokens=...)`:
 *
 *   text -> added tokens (longest match first; lstrip/rstrip/single_word/normalized)
 *        -> normalizer (NFC/NFD/NFKC/NFKD via utf8proc, a Sequence of them, or none)
 *        -> pre-tokenizer (Split steps with the file's regex, run by PCRE2; then ByteLevel)
 *        -> BPE merges per pre-token -> ids
 *   ids  -> token bytes (ByteLevel decoder) -> UTF-8 with U+FFFD for invalid bytes
 *
 * What is not applied: the post_processor (encode never adds special tokens; callers add BOS
 * etc. themselves), truncation and padding (a warning is logged when the file sets them).
 * Settings that would change the ids and are not implemented (BPE dropout > 0, a
 * continuing_subword_prefix or end_of_word_suffix, other normalizers or pre-tokenizers) make
 * the load fail with ST_ERR_UNSUPPORTED instead of being ignored.
 *
 * Thread safety: a loaded st_tokenizer is read-only; any number of threads may call encode,
 * decode and the lookups on one tokenizer at the same time (the compiled regex is shared
 * read-only; match data and scratch are per call; the bounded word cache is taken with a
 * trylock and skipped when another thread holds it). An st_tok_stream belongs to one thread.
 */
#ifndef ST_TOKENIZER_TOKENIZER_H
#define ST_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* ==== Limits on untrusted input ==== */

#define ST_TOK_MAX_FILE_BYTES ((size_t)512 << 20) /* tokenizer.json size */
#define ST_TOK_MAX_ID ((int64_t)1 << 22)           /* ids must be below this (4,194,304) */
#define ST_TOK_MAX_TOKEN_BYTES 65536               /* one vocab/added token, in bytes */
#define ST_TOK_MAX_TEXT_BYTES ((size_t)256 << 20)  /* one encode call */

/* ==== Types ==== */

typedef struct st_tokenizer st_tokenizer;   /* opaque, immutable after load */
typedef struct st_tok_stream st_tok_stream; /* opaque incremental detokenizer */

/* A growable id buffer owned by the caller: encode appends to it. Zero-initialise it, free it
 * with st_tok_ids_free. */
typedef struct st_tok_ids {
    int32_t *ids; /* [cap], owned (malloc) */
    size_t n;     /* ids used */
    size_t cap;   /* ids allocated */
} st_tok_ids;

/* One pre-token as seen by BPE (see st_tok_split): `text` are the piece's bytes after
 * normalisation (before the byte-to-unicode mapping); added tokens come with their id. */
typedef struct st_tok_piece {
    const char *text; /* [len] bytes, borrowed for the duration of the callback */
    size_t len;
    int32_t added_id; /* id of the added token this piece is, or -1 for a BPE piece */
} st_tok_piece;

/* Called once per piece; return non-zero to stop early (st_tok_split returns ST_ERR_CANCELLED). */
typedef int (*st_tok_piece_fn)(const st_tok_piece *piece, void *user);

/* ==== Loading ==== */

/* Load a tokenizer.json file. On failure *out is NULL and err names the file and the field. */
st_status st_tok_load(const char *tokenizer_json_path, st_tokenizer **out, st_error *err);

/* Load DIR/tokenizer.json; fails with ST_ERR_MISSING (naming DIR) when there is none. */
st_status st_tok_load_dir(const char *model_dir, st_tokenizer **out, st_error *err);

/* Load from a buffer (len bytes, need not be NUL-terminated). `name` is used in messages. */
st_status st_tok_load_buffer(const char *json, size_t len, const char *name, st_tokenizer **out,
                             st_error *err);

/* Free a tokenizer; tolerates NULL. No stream created from it may be used afterwards. */
void st_tok_free(st_tokenizer *tok);

/* ==== Vocabulary ==== */

/* Size of the id space: the largest id (vocab or added token) plus one. Ids below it may still
 * be unassigned (st_tok_id_to_token gives NULL for them). */
int64_t st_tok_vocab_size(const st_tokenizer *tok);

/* Id of a token given as it is written in tokenizer.json ("Ġthe", "<|im_end|>"): added tokens
 * first, then the BPE vocabulary. -1 when absent. */
int32_t st_tok_token_to_id(const st_tokenizer *tok, const char *token, size_t len);

/* The token string of an id as written in tokenizer.json (added-token content or vocab key);
 * NULL when the id is not assigned. The string is owned by the tokenizer (NUL-terminated; its
 * length goes to *len when len is non-NULL). */
const char *st_tok_id_to_token(const st_tokenizer *tok, int32_t id, size_t *len);

/* The raw bytes an id decodes to (ByteLevel decoder, before UTF-8 repair); NULL when the id is
 * not assigned. Owned by the tokenizer. */
const char *st_tok_token_bytes(const st_tokenizer *tok, int32_t id, size_t *len);

/* 1 if id is an added token marked "special" (what skip_special removes), else 0. */
int st_tok_is_special(const st_tokenizer *tok, int32_t id);

/* 1 if id is any added token (special or not), else 0. */
int st_tok_is_added(const st_tokenizer *tok, int32_t id);

/* ==== Encoding ==== */

/* Text (UTF-8, len bytes, NULs allowed) to ids. parse_special != 0 matches the text of special
 * added tokens ("<|im_start|>") as those tokens, like HF's default; 0 encodes it as plain text
 * (HF's encode_special_tokens=True). Non-special added tokens are always matched. No special
 * tokens are added. Invalid UTF-8 is rejected (ST_ERR_ARG, naming the byte offset).
 * *ids is malloc'ed (NULL when *n == 0); the caller frees it. */
st_status st_tok_encode(const st_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n, st_error *err);

/* As st_tok_encode, stopping with ST_ERR_LIMIT as soon as the text gives more than max_ids
 * ids (0: no limit), so that an over-long prompt costs little more than max_ids tokens of
 * work. */
st_status st_tok_encode_limit(const st_tokenizer *tok, const char *text, size_t len,
                              int parse_special, size_t max_ids, int32_t **ids, size_t *n,
                              st_error *err);

/* Same, appending to a caller-owned growable buffer (out->n grows; nothing is appended on
 * failure). */
st_status st_tok_encode_append(const st_tokenizer *tok, const char *text, size_t len,
                               int parse_special, st_tok_ids *out, st_error *err);

void st_tok_ids_free(st_tok_ids *v);

/* Run everything before BPE and report each piece in order (for tests and debugging). */
st_status st_tok_split(const st_tokenizer *tok, const char *text, size_t len, int parse_special,
                       st_tok_piece_fn fn, void *user, st_error *err);

/* ==== Decoding ==== */

/* Ids to text: the tokens' bytes concatenated, then invalid UTF-8 replaced by U+FFFD (one per
 * maximal invalid subsequence, like Python's errors="replace"). Ids that are not assigned are
 * skipped (as HF does); skip_special drops special added tokens. *text is malloc'ed and
 * NUL-terminated (*len excludes the NUL); the caller frees it. */
st_status st_tok_decode(const st_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                        char **text, size_t *len, st_error *err);

/* ==== Streaming decode ==== */

/* An incremental detokenizer fed one id at a time. It emits only complete UTF-8 characters,
 * holding back the first bytes of a character split across tokens; bytes that cannot become
 * valid UTF-8 are emitted as U+FFFD as soon as that is known. The concatenation of everything
 * emitted (feeds, then flush) equals st_tok_decode of the same ids. All memory is allocated at
 * create: feeding never allocates. */
st_status st_tok_stream_create(const st_tokenizer *tok, int skip_special, st_tok_stream **out,
                               st_error *err);
void st_tok_stream_free(st_tok_stream *s);

/* Forget held-back bytes (start a new text). */
void st_tok_stream_reset(st_tok_stream *s);

/* Feed one id. Returns the number of bytes now ready and points *text at them (owned by the
 * stream, valid until the next call on it; not NUL-terminated). Unassigned ids, and special
 * tokens when skip_special is set, produce nothing. */
size_t st_tok_stream_feed(st_tok_stream *s, int32_t id, const char **text);

/* End of text: held-back bytes of an incomplete character become U+FFFD. Same return
 * convention as feed; the stream is reset afterwards. */
size_t st_tok_stream_flush(st_tok_stream *s, const char **text);

/* Number of bytes currently held back (0..3). */
size_t st_tok_stream_pending(const st_tok_stream *s);

#endif /* ST_TOKENIZER_TOKENIZER_H */
