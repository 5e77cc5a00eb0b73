/* ==== The backend seam: what the model's layer loop asks of a device ====
 *
 * The model is written once (model/forward.c): for each layer it names which operation runs
 * on which activation buffer with which weight. A backend (backend/cpu/ today, CUDA and
 * tensor-parallel ranks next) implements those whole-batch operations on its own memory:
 *
 *   st_backend   one per model and device: the weights prepared for it (the CPU backend
 *                packs them for its kernels; a GPU copies them; a rank keeps its shard)
 *   st_bctx      an execution context: activations for up to max_tokens tokens, the KV
 *                block pool and the state slots (their storage; engine/cache.c keeps the
 *                books: free lists, block tables, slots), per-thread scratch or streams
 *   st_step_plan one step, as plain data: token ids, each item's token range, first
 *                position, state slot, KV block ids and which rows need logits. It lives in
 *                one buffer (st_plan_buf) with capacities fixed at creation, so a GPU uploads
 *                it in one copy and a rank 0 can broadcast the same bytes.
 *
 * A step: plan -> step_begin (states of items at position 0 are zeroed) -> embed -> per layer
 * norm, projections (matmul groups), the mixer (gdn, or attn_prep + attention), its output
 * projection, allreduce, norm, MLP (matmul group with SwiGLU, or moe), allreduce -> final
 * norm -> logits (downloaded to the host). Backends keep the batch-invariance rule of
 * kernels/kernels.h: a token's results never depend on the rest of the batch.
 *
 * Activation widths are the shard's (st_shard): with world size 1, the model's.
 */
#ifndef ST_BACKEND_BACKEND_H
#define ST_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

/* KV cache element type (append-only) */
typedef enum st_kv_dtype {
    ST_KV_F32 = 0,
    ST_KV_BF16 = 1,
} st_kv_dtype;

enum {
    ST_LOGITS_NONE = 0,     /* no logits for this item */
    ST_LOGITS_LAST = 1,     /* logits of the item's last token */
    ST_LOGITS_ALL = 2,      /* logits of every token of the item */
    ST_LOGITS_LAST_TOP = 3, /* the last token's row in compact form (st_logit_top) */
};

/* the logit rows an item of n tokens gets in mode m (ST_LOGITS_*) */
static inline int64_t st_logits_rows(int32_t m, int64_t n) {
    return m == ST_LOGITS_ALL ? n : m == ST_LOGITS_LAST || m == ST_LOGITS_LAST_TOP;
}

/* A logit row in compact form: what a sampler needs to draw from the most likely tokens and
 * report their log-probabilities, so that a device sends back a kilobyte a row instead of
 * the vocabulary. The ST_TOP_MAX largest logits (ties to the lower id) in descending order,
 * log(sum exp(l)) over the whole row, and whether every logit was finite. It sits at the
 * start of the row's place in the logits (vocab floats: a vocabulary of at least
 * sizeof(st_logit_top) / 4 tokens). sampler/sampler.c's st_logit_top_make is the reference. */
#define ST_TOP_MAX 128
typedef struct st_logit_top {
    int32_t n;      /* entries: min(ST_TOP_MAX, vocab) */
    int32_t finite; /* 1: every logit of the row finite */
    double lse;     /* max + log(sum exp(l - max)), summed in double in id order (0 if not finite) */
    int32_t id[ST_TOP_MAX];
    float val[ST_TOP_MAX];
} st_logit_top;

/* ---- the step plan ---- */

typedef struct st_step_plan {
    int n_items;
    int64_t n_tokens;
    int64_t n_logit_rows;
    const int32_t *tokens;   /* [n_tokens] token ids, item after item */
    const int64_t *item_t0;  /* [n_items + 1] each item's first row in tokens */
    const int64_t *pos0;     /* [n_items] the position of each item's first token */
    const int32_t *slot;     /* [n_items] each item's state slot */
    const int32_t *logits;   /* [n_items] ST_LOGITS_* */
    const int64_t *block_t0; /* [n_items + 1] each item's first entry in blocks */
    const int32_t *blocks;   /* the KV blocks holding each item's positions 0, bs, 2 bs, ... up
                                to its last token's position */
    /* prompts holding images (NULL / 0 otherwise; st_plan_reset clears them): */
    const int32_t *mrope;    /* [n_tokens][3] each token's (t, h, w) rotary positions (M-RoPE,
                                the config's mrope_section); NULL: every axis at the token's
                                KV position */
    int64_t n_embeds;        /* rows whose embedding comes from embeds, not the table */
    const int64_t *embed_rows; /* [n_embeds] those token rows, increasing */
    const float *const *embeds; /* [n_embeds] pointers to rows of hidden floats (host memory) */
} st_step_plan;

/* A plan's storage: one allocation, capacities fixed when it is made. */
typedef struct st_plan_buf {
    st_step_plan plan;       /* points into mem */
    int cap_items;
    int64_t cap_tokens, cap_blocks;
    void *mem;               /* owned */
    size_t bytes;
} st_plan_buf;

st_status st_plan_buf_init(st_plan_buf *b, int max_items, int64_t max_tokens, int64_t max_blocks,
                           st_error *err);
void st_plan_buf_free(st_plan_buf *b);
void st_plan_reset(st_plan_buf *b);
/* Append an item: n tokens continuing at position pos0 in state slot `slot`, whose KV blocks
 * (covering positions [0, pos0 + n)) are blocks[0..n_blocks). ST_ERR_LIMIT past a capacity. */
st_status st_plan_add(st_plan_buf *b, const int32_t *tokens, int n, int64_t pos0, int slot,
                      const int32_t *blocks, int64_t n_blocks, int logits, st_error *err);

/* ---- shards ---- */

/* The part of the model one rank computes (tensor parallelism); world 1 is the whole model.
 * Query heads and GDN value heads split evenly; KV heads and GDN key heads split where they
 * divide and are replicated where they do not (a rank holds every KV / key head its query /
 * value heads read); the MLP width splits in whole quantization groups, unevenly if need
 * be; experts are not split (each rank computes its slice of every expert's width). */
typedef struct st_shard {
    int rank, world;
    int n_heads, head0;          /* local query heads: global heads [head0, head0 + n_heads) */
    int n_kv_heads, kv_head0;    /* local KV heads, likewise */
    int lin_v_heads, lin_v0;     /* local GDN value heads */
    int lin_k_heads, lin_k0;     /* local GDN key heads (those the local value heads read) */
    int64_t inter, inter0;       /* local dense MLP width: columns [inter0, inter0 + inter) */
    int64_t moe_inter, moe_inter0;       /* local width of every expert */
    int64_t shared_inter, shared_inter0; /* local width of the shared expert */
    int64_t vocab, vocab0;       /* local LM head rows: vocabulary [vocab0, vocab0 + vocab) (the
                                    logits' slices are gathered; the embedding stays whole) */
} st_shard;

/* The shard of rank/world for this model: ST_ERR_ARG naming the shape that does not split. */
st_status st_shard_make(const st_model *m, int rank, int world, st_shard *out, st_error *err);
/* rank's LM head rows of a vocabulary of V over world ranks: [*v0, *v0 + *n) */
void st_shard_vocab(int64_t V, int world, int rank, int64_t *v0, int64_t *n);

/* ---- the operations ---- */

/* How a backend computes (`--precision`): every backend computes exact; a GPU backend may
 * also compute as the peers do. */
typedef enum st_precision {
    ST_PRECISION_EXACT = 0, /* fp32-grade: fp32 activations, accumulation and state */
    ST_PRECISION_BF16 = 1,  /* activations rounded to bf16 for the matrix products (tensor
                               cores), fp32 accumulation and state */
} st_precision;

/* Activation buffers of a context, by role; each is [max_tokens][width] of fp32. */
typedef enum st_act {
    ST_ACT_X = 0,   /* [T][d] residual stream */
    ST_ACT_XN = 1,  /* [T][d] normalised input of a block */
    ST_ACT_OUT = 2, /* [T][d] a block's output (a partial sum on a shard) */
    ST_ACT_P1 = 3,  /* [T][w1] q_proj | in_proj_qkv | gate output */
    ST_ACT_P2 = 4,  /* [T][w2] k_proj | in_proj_z | up output */
    ST_ACT_P3 = 5,  /* [T][w3] v_proj | in_proj_b */
    ST_ACT_P4 = 6,  /* [T][Hv] in_proj_a */
    ST_ACT_MIX = 7, /* [T][wm] a mixer's output before its out projection */
    ST_ACT_COUNT = 8,
} st_act;

/* Weights of a layer the loop names (append-only). */
typedef enum st_wid {
    ST_W_IN_QKV = 0, ST_W_IN_Z, ST_W_IN_B, ST_W_IN_A, ST_W_OUT_PROJ,
    ST_W_Q, ST_W_K, ST_W_V, ST_W_O,
    ST_W_GATE, ST_W_UP, ST_W_DOWN,
    ST_W_COUNT
} st_wid;

/* One matrix of a group: weight w of the layer, into buffer out. */
typedef struct st_mm {
    st_wid w;
    st_act out;
} st_mm;

/* Norms the loop names. */
typedef enum st_norm {
    ST_NORM_INPUT = 0, /* a layer's input_layernorm */
    ST_NORM_POST = 1,  /* its post_attention_layernorm */
    ST_NORM_FINAL = 2, /* the final norm (layer ignored) */
} st_norm;

enum {
    ST_NORM_ADD = 1,   /* x += out first */
    ST_NORM_APPLY = 2, /* then xn = rmsnorm(x) */
};

/* What a context is sized for. */
typedef struct st_ctx_params {
    int max_tokens;          /* tokens per step */
    int n_slots;             /* state slots of sequences (and items per step) */
    int n_snapshots;         /* further state slots, [n_slots, n_slots + n_snapshots): copies
                                of sequences' states kept for reuse (the prefix cache) */
    int64_t n_blocks;        /* KV blocks */
    int block_size;          /* positions per block */
    int64_t max_seq_len;     /* positions per sequence */
    st_kv_dtype kv_dtype;
} st_ctx_params;

/* Memory a context takes, before it exists (memory plans). */
typedef struct st_ctx_plan {
    size_t kv_block_bytes; /* one KV block (every full-attention layer's K and V) */
    size_t slot_bytes;     /* one state slot (conv and delta-rule state of every GDN layer);
                              a snapshot takes as much */
    size_t scratch_bytes;  /* activations, work areas, per-thread scratch */
    size_t total_bytes;    /* all of it for the parameters */
} st_ctx_plan;

typedef struct st_backend st_backend;

/* The common part of every backend's context (its first member). */
typedef struct st_bctx {
    st_backend *b;
} st_bctx;

/* matmul's swiglu: 0 none; ST_SWIGLU out0 = silu(out0) * out1, both readable after;
 * ST_SWIGLU_TO_NEXT the same where the caller promises that the next op is a matmul reading
 * out0 and that nothing reads out0 or out1 otherwise, so that a backend may keep them in a
 * form of its own in between (the CUDA backend's `bf16` MLP of many tokens: bf16) */
enum { ST_SWIGLU = 1, ST_SWIGLU_TO_NEXT = 2 };

typedef struct st_backend_ops {
    const char *name;
    void (*destroy)(st_backend *b);
    /* contexts: the backend allocates and owns their KV blocks and state slots */
    st_status (*ctx_create)(st_backend *b, const st_ctx_params *p, st_bctx **out, st_error *err);
    void (*ctx_destroy)(st_bctx *c);
    size_t (*ctx_bytes)(const st_bctx *c);     /* memory it holds */
    void (*ctx_plan)(const st_backend *b, const st_ctx_params *p, st_ctx_plan *out);
    /* A step, in this order: step_begin, the layer loop's operations, logits, step_end. The
     * plan (validated by the caller) stays valid and unchanged until step_end. */
    st_status (*step_begin)(st_bctx *c, const st_step_plan *plan, st_error *err);
    void (*embed)(st_bctx *c);                                        /* tokens -> X */
    void (*add_norm)(st_bctx *c, int layer, st_norm which, int mode); /* ST_NORM_* bits */
    /* up to 4 matrices of the layer reading buffer `in`; swiglu (ST_SWIGLU*): out0 = silu(out0)
     * * out1 */
    void (*matmul)(st_bctx *c, int layer, st_act in, const st_mm *mm, int n, int swiglu);
    void (*gdn)(st_bctx *c, int layer);        /* P1..P4 -> MIX: conv, norms, delta rule, gated norm */
    void (*attn_prep)(st_bctx *c, int layer);  /* P1, P2, P3: q/k norm, RoPE, K and V into the pool */
    void (*attention)(st_bctx *c, int layer);  /* P1 -> MIX: paged attention, sigmoid gate */
    void (*moe)(st_bctx *c, int layer);        /* XN -> OUT: router, top-k, experts, shared expert */
    void (*allreduce)(st_bctx *c, st_act a);   /* sum a [T][d] buffer over the shards */
    void (*logits)(st_bctx *c, float *out);    /* XN rows the plan asks for -> out[rows][vocab]
                                                  (host memory). A shard computes its vocabulary
                                                  slice and takes part in gathering the rows;
                                                  out NULL: nothing written (a follower) */
    /* host <-> the step's T rows of a buffer, `width` floats each (at most the buffer's):
     * the hidden-state hook reads X and XN; tests drive single operations with them */
    void (*read)(st_bctx *c, st_act a, int64_t width, float *out);
    void (*write)(st_bctx *c, st_act a, int64_t width, const float *in);
    /* results are in host memory when it returns; a device error is reported here */
    st_status (*step_end)(st_bctx *c, st_error *err);
    /* Between steps (they are ordered with the steps; a device reports its errors at the next
     * step_end): copy state slot `from` to state slot `to`, both in [0, n_slots +
     * n_snapshots); copy KV block `from` to block `to` (every full-attention layer). */
    void (*state_copy)(st_bctx *c, int from, int to);
    void (*kv_copy)(st_bctx *c, int32_t from, int32_t to);
    /* Optional (NULL: malloc/free): host memory the backend copies a step's results into
     * fastest (page-locked for a GPU, so the logits' copy runs at the bus's rate rather than
     * through the driver's staging); NULL when it cannot be had. */
    void *(*host_alloc)(st_backend *b, size_t bytes);
    void (*host_free)(st_backend *b, void *p);
} st_backend_ops;

/* The common part of every backend (its first member). */
struct st_backend {
    const st_backend_ops *ops;
    const st_model *m;       /* borrowed */
    st_shard shard;
    struct st_comm *comm;    /* borrowed: the job this backend is one rank of (dist/comm.h),
                                NULL for a process on its own. On rank 0, st_fwd sends every
                                context, step and copy to the other ranks (dist/relay.h). */
    int relay_ctxs;          /* contexts st_fwd made on it so far (their ids for the relay) */
    int relay_ended;         /* 1: st_relay_end has told the other ranks the work is over */
    int logits_top;          /* 1: ops->logits writes ST_LOGITS_LAST_TOP rows compact itself
                                (else st_fwd_run compacts the whole rows it wrote) */
};

void st_backend_destroy(st_backend *b);

#endif /* ST_BACKEND_BACKEND_H */
