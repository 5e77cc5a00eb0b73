/* ==== The scheduler: continuous batching over a fixed pool of sequences ====
 *
 * One thread (the scheduler thread) owns the model step, the cache and every running
 * sequence. Other threads only submit requests and cancel them (both thread-safe); results
 * come back through each request's callback, called on the scheduler thread.
 *
 * Each step is one ragged batch: one decode token for every generating sequence, then prompt
 * chunks of admitted sequences (oldest first) of up to `step_tokens` tokens in all (a step
 * holds at most step_tokens + max_seqs tokens).
 *
 * Admission. The context length a request can use is min(ctx, the KV pool's positions), so
 * the pool always holds at least one whole context and every accepted request can run: a
 * prompt that does not fit is refused at submission (ST_ERR_LIMIT), and a request's budget,
 * min(context, prompt + max_tokens) positions, is reserved when it is admitted. A request
 * waits (in a bounded queue: submit fails with ST_ERR_BUSY once max_seqs + max_queue
 * requests are live) until a sequence record is free and the pool can hold its budget.
 * Requests behind a queue head that waits for KV blocks may go first when they fit, for
 * `head_wait_s` seconds; after that the head is served before anyone else. A cancelled
 * request leaves the queue at the next step wherever it stands.
 *
 * Back-pressure. A TOKEN event's callback may answer ST_EV_PAUSE (its consumer's buffer is
 * full): the sequence keeps its slot and blocks but is left out of steps until
 * st_sched_resume; a sequence paused longer than `stall_timeout_s` ends with an error.
 *
 * Logits that are not finite (NaN or infinity) end that sequence with ST_FINISH_ERROR and a
 * message; the others in the batch go on.
 *
 * Memory. With a budget (mem_budget, e.g. from st_sched_memory_budget) the plan is checked
 * before anything is allocated: a context and a pool that were not asked for are sized to
 * fit (the largest context at which every sequence can hold a whole one; with an explicit
 * ctx, the largest pool that holds at least one), and an explicit plan that cannot fit is
 * refused with a message saying what would.
 *
 * Prefix cache (prefix_cache): filled KV blocks stay cached after their sequence ends and a
 * request resumes from the longest prefix of its prompt that has its blocks and a state
 * snapshot (engine/cache.h), prefilling only the rest; usage.cached_tokens says how many
 * positions it skipped. Snapshots are taken every snapshot_every blocks of a prompt, at the
 * last block boundary before a prompt's end, and at the last block boundary a reply reached
 * (the sequence keeps one moving forward as it decodes; it becomes public when the sequence
 * ends), so the next turn of a chat resumes after the previous answer. Results are bit for
 * bit those of a cold run: a position's computation depends only on the tokens up to it
 * (the CPU backend the scheduler makes then computes the delta rule per step, never in
 * chunks whose arithmetic differs; a backend passed in must do the same).
 *
 * Finished and cancelled sequences return their blocks and slot within the step. Every
 * per-sequence structure is fixed-size and allocated when the scheduler is created; a step
 * that only decodes allocates nothing.
 */
#ifndef ST_ENGINE_SCHEDULER_H
#define ST_ENGINE_SCHEDULER_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "engine/cache.h"
#include "engine/textout.h"
#include "model/forward.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define ST_MAX_STOP_IDS 16
#define ST_MAX_CHOICES 16

typedef enum st_finish_reason {
    ST_FINISH_NONE = 0,
    ST_FINISH_STOP = 1,      /* eos, a stop token id or a stop string */
    ST_FINISH_LENGTH = 2,    /* max_tokens or the context length */
    ST_FINISH_CANCELLED = 3, /* st_sched_cancel */
    ST_FINISH_ERROR = 4,     /* see the event's error text */
} st_finish_reason;

const char *st_finish_name(st_finish_reason r); /* "stop", "length", ... */

typedef struct st_req_params {
    int64_t max_tokens;     /* <= 0: until the context is full */
    st_sampling sampling;
    int logprobs;           /* -1: none; 0..20: the chosen token's logprob and N alternatives */
    int ignore_eos;         /* do not stop at the model's eos ids */
    int32_t stop_ids[ST_MAX_STOP_IDS];
    int n_stop_ids;
    const char *stop[ST_MAX_STOP]; /* stop strings; copied at submit */
    int n_stop;
    int skip_special;       /* special tokens are not part of the text (default 1) */
    int split_reasoning;    /* split <think> ... </think> into reasoning */
    int start_in_reasoning; /* the rendered prompt opened a think block */
    int n;                  /* choices (0 or 1: one): the prompt is prefilled once, then the
                               sequence forks (shared KV blocks, a copy of the state) and each
                               choice samples from its own stream; at most ST_MAX_CHOICES and
                               max_seqs */
    int sum_logprobs;       /* each choice's DONE carries the sum of its tokens' log-probabilities
                               (best_of), whether or not logprobs are asked */
    const struct st_req_images *images; /* a prompt holding images (copied at submit; the
                               scheduler must take images); NULL: text */
    int json_mode;          /* st_gram_mode (grammar/grammar.h): the reply after any reasoning
                               is one JSON object (or value, or a value json_schema accepts, or
                               a tool call, or text a GBNF grammar accepts) by constrained
                               decoding, and ends when it is complete (GBNF: the model's end of
                               sequence is allowed where a sentence may end); 0: free text.
                               Needs a tokenizer. */
    struct st_gram_schema *json_schema; /* ST_GRAM_JSON_SCHEMA, _TOOL_CALL, _GBNF: the compiled
                               schema, tools or grammar. A submit
                               that succeeds takes it (the request frees it); a refused one
                               leaves it to the caller. */
} st_req_params;

/* The image parts of a prompt (vision/prompt.h builds them): its rotary positions and the rows
 * whose embeddings come from the vision tower. The prefix cache keys such a prompt by keys
 * (its image rows stand for their pixels); without keys the request skips the cache (its
 * token ids do not say what its image rows hold). */
typedef struct st_req_images {
    const int32_t (*mrope)[3]; /* [n_prompt] the prompt's (t, h, w) rotary positions */
    int64_t next;              /* the rotary position (every axis) of the first generated token */
    int64_t n_rows;
    const int64_t *rows;       /* [n_rows] image rows of the prompt, increasing */
    const float *embeds;       /* [n_rows][hidden] their embeddings */
    const int32_t *keys;       /* [n_prompt] the prompt as the prefix cache keys it, or NULL */
} st_req_images;

st_req_params st_req_default_params(void);

typedef struct st_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t reasoning_tokens;
    int64_t cached_tokens;
} st_usage;

typedef enum st_event_kind {
    ST_EV_TOKEN = 1, /* a token was generated (its text may be held back: empty deltas) */
    ST_EV_DONE = 2,  /* a choice ended (the request with its last); carries the text released
                        at the end and that choice's usage */
} st_event_kind;

typedef struct st_event {
    st_event_kind kind;
    uint64_t id;
    int index;                    /* the choice (0 .. n-1); a DONE ends that choice */
    int last;                     /* DONE: the request's last choice ended (the request is over) */
    int32_t token;                /* TOKEN */
    const st_logprobs *logprobs;  /* TOKEN, when asked; valid during the callback */
    const char *content;          /* text deltas, valid during the callback */
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
    st_finish_reason finish;      /* DONE */
    const char *error;            /* DONE with ST_FINISH_ERROR */
    st_usage usage;               /* DONE */
    double logprob_sum;           /* DONE with sum_logprobs: the choice's tokens' log-probabilities */
    double queue_s;               /* DONE: seconds waiting for admission */
    double ttft_s;                /* DONE: submit to first token */
    double total_s;               /* DONE: submit to done */
} st_event;

/* The callback's answer to a TOKEN event (ignored for DONE). */
enum {
    ST_EV_CONTINUE = 0,
    ST_EV_PAUSE = 1, /* leave the sequence out of steps until st_sched_resume */
};
typedef int (*st_event_fn)(void *user, const st_event *ev);

typedef struct st_sched_params {
    int max_seqs;            /* sequences generating at once */
    int images;              /* 1: requests may hold images (a host copy of one step's
                                residual stream: step tokens x hidden floats) */
    int64_t ctx;             /* context length; 0 = the model's max_position_embeddings */
    int step_tokens;         /* prompt tokens per step (the chunk budget, beside the decode
                                tokens); >= max_seqs */
    int block_size;          /* KV positions per block */
    int64_t kv_blocks;       /* KV pool; 0 = max_seqs full contexts */
    st_kv_dtype kv_dtype;
    int max_queue;           /* requests beyond max_seqs before ST_ERR_BUSY */
    double stall_timeout_s;  /* a sequence paused this long ends with an error */
    double head_wait_s;      /* how long later requests may pass a queue head short of blocks */
    size_t mem_budget;       /* bytes the plan may take (cache, state, scratch, histories);
                                0 = not checked */
    int prefix_cache;        /* keep KV blocks and state snapshots for reuse (default 0) */
    int snapshots;           /* the snapshot pool with prefix_cache; 0 = 4 x max_seqs + 4 */
    int snapshot_every;      /* blocks between the snapshots of a prompt; 0 = 32 */
    int logits_top;          /* 1 (default): a sequence whose sampling a row's top tokens settle
                                (greedy, or top_k <= ST_TOP_SAMPLE_MAX; no bias, penalties or
                                grammar) gets compact logit rows (st_logit_top; a GPU sends back
                                a kilobyte, not the vocabulary); 0: whole rows for every one */
    st_backend *backend;     /* borrowed (it must outlive the scheduler); NULL = a CPU backend
                                with default parameters, made and owned by the scheduler */
} st_sched_params;

st_sched_params st_sched_default_params(void);

/* The CPU backend parameters a scheduler with (or without) the prefix cache needs, from
 * cpu: with the cache, the delta rule is computed per step (the chunked form's arithmetic
 * depends on how steps split a prompt). A backend passed in st_sched_params should be made
 * with these. */
st_cpu_params st_sched_cpu_params(st_cpu_params cpu, int prefix_cache);

/* What a scheduler allocates: decided before anything is. */
typedef struct st_sched_plan {
    int64_t ctx;          /* the context requests get */
    int64_t kv_blocks;    /* the KV pool */
    int block_size;
    int max_seqs;
    size_t kv_bytes;      /* the pool */
    size_t state_bytes;   /* recurrent and conv state, block tables */
    int snapshots;        /* the snapshot pool (0 without the prefix cache) */
    size_t snapshot_bytes; /* its state */
    size_t scratch_bytes; /* the forward pass's */
    size_t other_bytes;   /* histories, logits, sampler, text pipelines */
    size_t total_bytes;
    size_t budget_bytes;  /* 0: not checked */
    int fitted;           /* the context or the pool was made smaller to fit the budget */
} st_sched_plan;

/* The plan for these parameters (the same decision st_sched_create makes). ST_ERR_LIMIT with
 * a message naming what would fit when an explicit plan exceeds the budget. */
st_status st_sched_plan_for(const st_model *m, const st_sched_params *p, st_sched_plan *out,
                            st_error *err);

/* fraction (0..1] of the memory this process can still have (st_sysmem_available), less
 * the weights still read from their mapping (b: the backend that packed copies, or NULL);
 * 0 when that memory is unknown. */
size_t st_sched_memory_budget(const st_model *m, const st_backend *b, double fraction);

/* One line describing a plan ("KV pool 2.0 GiB (...), ..."), into buf. */
void st_sched_plan_text(const st_sched_plan *pl, char *buf, size_t cap);

typedef struct st_sched st_sched;

/* tok may be NULL: then there is no text (stop strings and reasoning need a tokenizer). */
st_status st_sched_create(const st_model *m, const st_tokenizer *tok, const st_sched_params *p,
                          st_sched **out, st_error *err);
void st_sched_destroy(st_sched *s);

/* Any thread. Validates and queues a request; *id identifies it in events and cancel.
 * ST_ERR_LIMIT: the prompt does not fit the context; ST_ERR_BUSY: the queue is full. */
st_status st_sched_submit(st_sched *s, const int32_t *prompt, int64_t n_prompt,
                          const st_req_params *p, st_event_fn fn, void *user, uint64_t *id,
                          st_error *err);

/* Any thread. The request ends (ST_FINISH_CANCELLED) at the next step, queued or running;
 * unknown ids are ignored. */
void st_sched_cancel(st_sched *s, uint64_t id);

/* Any thread. The request ends with ST_FINISH_ERROR and the message `why` (copied; cut at
 * 159 bytes) at the next step, queued or running; a request already cancelled or failed
 * keeps its first reason; unknown ids are ignored. */
void st_sched_fail(st_sched *s, uint64_t id, const char *why);

/* Any thread. 1 when a step failed with ST_ERR_IO (a tensor-parallel job that lost a rank:
 * dist/comm.h), with the reason in why[cap]: every request then ends with an error, and
 * submissions are refused (ST_ERR_IO). */
int st_sched_broken(st_sched *s, char *why, size_t cap);

/* Any thread. Undo one ST_EV_PAUSE of the request (its consumer made room); resumes may
 * arrive before the pause they answer. Unknown ids are ignored. */
void st_sched_resume(st_sched *s, uint64_t id);

/* The context length requests get: min(ctx, the KV pool's positions). */
int64_t st_sched_context(const st_sched *s);

/* The most bytes of text (content plus reasoning) one event can carry. */
size_t st_sched_max_event_text(const st_sched *s);

/* Scheduler thread: run one step. Returns the number of requests still queued or running. */
int st_sched_step(st_sched *s);

/* Scheduler thread: return at once while a step can make progress; otherwise sleep until a
 * submit, cancel, resume or shutdown, or until a paused sequence's timeout or a queue head's
 * priority is due. Returns 0 on shutdown. */
int st_sched_wait(st_sched *s);
void st_sched_shutdown(st_sched *s);

typedef struct st_sched_stats {
    int waiting, running;
    int paused;               /* running but waiting for their consumer */
    int64_t kv_blocks_used, kv_blocks_total;
    int64_t steps, tokens_prefilled, tokens_generated;
    int64_t finished[5];      /* by st_finish_reason */
    size_t planned_bytes;     /* cache + scratch + sequence records */
    st_prefix_stats prefix;   /* the prefix cache's counters */
} st_sched_stats;

void st_sched_get_stats(st_sched *s, st_sched_stats *out);

/* A running sequence's state, for tests and debugging (scheduler thread). 0 if not running. */
typedef struct st_seq_info {
    int slot;
    int64_t n_past, n_tokens, n_generated;
    int32_t n_blocks;
    const int32_t *blocks; /* [n_blocks] */
    size_t record_bytes;   /* size of the per-sequence record (constant) */
} st_seq_info;
int st_sched_seq_info(st_sched *s, uint64_t id, st_seq_info *out);

const st_cache *st_sched_cache(const st_sched *s);
/* The forward context steps run on (its backend context holds the KV blocks and states). */
st_fwd *st_sched_forward(const st_sched *s);
const st_sched_plan *st_sched_get_plan(const st_sched *s);

#endif /* ST_ENGINE_SCHEDULER_H */
