/* ==== Every backend operation against the scalar reference, op by op ====
 *
 * In the spirit of ggml's test-backend-ops: each operation of backend/backend.h runs on
 * random inputs written into the context's buffers (st_backend_ops.write), over ragged step
 * plans (several sequences, odd lengths, steps that start and end on KV block boundaries of
 * 16 and on 64-token delta-rule chunk boundaries, single-token decode items, sequences
 * starting mid-plan), and its outputs are read back and compared with the reference
 * backend's: the CPU backend on the scalar kernels (kernels/cpu/ref.c), one thread,
 * unpacked matrices. States (conv, delta rule, KV) carry over from step to step in each
 * backend. Every backend under test declares its tolerance (the largest |got - want| over
 * an output, relative to the output's largest |want|) and whether its results must be the
 * same bits for any thread count; the CPU backend: 1e-5, and bit-exact across threads. A
 * CUDA backend will be listed here with its own.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "tap.h"

typedef struct declared {
    const char *name;
    double tol;
    int bit_exact_threads;
    int skip_moe; /* the MoE op is not held to tol (see CUDA_BF16) */
} declared;
static const declared CPU = {"cpu", 1e-5, 1, 0};
/* fp32 throughout, its own summation orders: the same bound; one configuration (no threads) */
static const declared CUDA = {"cuda", 1e-5, 0, 0};
/* --precision bf16: activations, queries, K, V and attention weights rounded to bf16 for the
 * tensor cores (fp32 accumulation and state), as the peers compute; a layout or indexing
 * fault is of the order of the output itself, rounding a fraction of a percent. The MoE op
 * is left out: a router logit rounded to bf16 can pick another expert for a token, which
 * changes its output whole (0.6 of the largest on tiny-moe's random weights, as the
 * reference's own bf16 run moves tiny-moe's logits by 0.66) */
static const declared CUDA_BF16 = {"cuda bf16", 2e-2, 0, 1};

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

enum { N_OPS = 17, MAX_T = 1104, LONG_T = 1100 };
static const char *op_names[N_OPS] = {"embed",      "add_norm (add, apply)", "add_norm (post)", "add_norm (final)",
                                      "matmul (GDN in-projections)", "gdn", "matmul (out_proj)",
                                      "matmul (q, k, v)", "attn_prep", "attention", "matmul (o_proj)",
                                      "matmul (gate, up + SwiGLU)", "matmul (down)", "moe", "allreduce", "logits",
                                      "matmul (gate, up + SwiGLU to the next, then down)"};

/* one backend context under test */
typedef struct ctx {
    st_backend *b;
    st_fwd *f;
    float *out[N_OPS]; /* each op's outputs of the current step, concatenated */
    int64_t n_out[N_OPS];
} ctx;

typedef struct shapes {
    int64_t d, V, cd, vd, Hv, qw, kvw, mix_att, I;
    int lin, full; /* a layer of each kind (-1: none) */
    int moe;
} shapes;

static shapes shapes_of(const st_model *m) {
    const st_config *c = &m->cfg;
    shapes s;
    s.d = c->hidden_size;
    s.V = c->vocab_size;
    s.cd = st_config_conv_dim(c);
    s.vd = st_config_value_dim(c);
    s.Hv = c->lin_n_value_heads;
    s.qw = 2 * (int64_t)c->n_heads * c->head_dim;
    s.kvw = (int64_t)c->n_kv_heads * c->head_dim;
    s.mix_att = (int64_t)c->n_heads * c->head_dim;
    s.I = c->intermediate_size;
    s.moe = c->is_moe;
    s.lin = s.full = -1;
    for (int i = c->n_layers - 1; i >= 0; i--) {
        if (c->layer_kind[i] == ST_LAYER_LINEAR) s.lin = i;
        else s.full = i;
    }
    return s;
}

/* the step's random inputs, the same for every context */
typedef struct inputs {
    float *x, *out, *xn, *p1, *p2, *p3, *p4, *mix;
} inputs;

static void fill(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = frand();
}

static void save(ctx *x, int op, st_bctx *c, st_act a, int64_t width, int64_t T) {
    x->out[op] = realloc(x->out[op], (size_t)((x->n_out[op] + T * width) > 0 ? x->n_out[op] + T * width : 1) * sizeof(float));
    c->b->ops->read(c, a, width, x->out[op] + x->n_out[op]);
    x->n_out[op] += T * width;
}

/* Run every operation of one step on one context. */
static void run_step(ctx *x, const shapes *s, const st_step_plan *pl, const inputs *in) {
    st_bctx *c = st_fwd_ctx(x->f);
    const st_backend_ops *op = x->b->ops;
    const int64_t T = pl->n_tokens;
    for (int i = 0; i < N_OPS; i++) x->n_out[i] = 0;
    st_error err = {0};
    op->step_begin(c, pl, &err);
    op->embed(c);
    save(x, 0, c, ST_ACT_X, s->d, T);
    op->write(c, ST_ACT_X, s->d, in->x);
    op->write(c, ST_ACT_OUT, s->d, in->out);
    op->add_norm(c, 0, ST_NORM_INPUT, ST_NORM_ADD | ST_NORM_APPLY);
    save(x, 1, c, ST_ACT_X, s->d, T);
    save(x, 1, c, ST_ACT_XN, s->d, T);
    op->add_norm(c, 0, ST_NORM_POST, ST_NORM_APPLY);
    save(x, 2, c, ST_ACT_XN, s->d, T);
    op->add_norm(c, 0, ST_NORM_FINAL, ST_NORM_APPLY);
    save(x, 3, c, ST_ACT_XN, s->d, T);
    if (s->lin >= 0) {
        op->write(c, ST_ACT_XN, s->d, in->xn);
        const st_mm mm[] = {{ST_W_IN_QKV, ST_ACT_P1}, {ST_W_IN_Z, ST_ACT_P2}, {ST_W_IN_B, ST_ACT_P3}, {ST_W_IN_A, ST_ACT_P4}};
        op->matmul(c, s->lin, ST_ACT_XN, mm, 4, 0);
        save(x, 4, c, ST_ACT_P1, s->cd, T);
        save(x, 4, c, ST_ACT_P2, s->vd, T);
        save(x, 4, c, ST_ACT_P3, s->Hv, T);
        save(x, 4, c, ST_ACT_P4, s->Hv, T);
        op->write(c, ST_ACT_P1, s->cd, in->p1);
        op->write(c, ST_ACT_P2, s->vd, in->p2);
        op->write(c, ST_ACT_P3, s->Hv, in->p3);
        op->write(c, ST_ACT_P4, s->Hv, in->p4);
        op->gdn(c, s->lin);
        save(x, 5, c, ST_ACT_MIX, s->vd, T);
        op->write(c, ST_ACT_MIX, s->vd, in->mix);
        const st_mm o[] = {{ST_W_OUT_PROJ, ST_ACT_OUT}};
        op->matmul(c, s->lin, ST_ACT_MIX, o, 1, 0);
        save(x, 6, c, ST_ACT_OUT, s->d, T);
    }
    if (s->full >= 0) {
        op->write(c, ST_ACT_XN, s->d, in->xn);
        const st_mm mm[] = {{ST_W_Q, ST_ACT_P1}, {ST_W_K, ST_ACT_P2}, {ST_W_V, ST_ACT_P3}};
        op->matmul(c, s->full, ST_ACT_XN, mm, 3, 0);
        save(x, 7, c, ST_ACT_P1, s->qw, T);
        save(x, 7, c, ST_ACT_P2, s->kvw, T);
        save(x, 7, c, ST_ACT_P3, s->kvw, T);
        op->write(c, ST_ACT_P1, s->qw, in->p1);
        op->write(c, ST_ACT_P2, s->kvw, in->p2);
        op->write(c, ST_ACT_P3, s->kvw, in->p3);
        op->attn_prep(c, s->full);
        save(x, 8, c, ST_ACT_P1, s->qw, T);
        save(x, 8, c, ST_ACT_P2, s->kvw, T);
        op->attention(c, s->full);
        save(x, 9, c, ST_ACT_MIX, s->mix_att, T);
        op->write(c, ST_ACT_MIX, s->mix_att, in->mix);
        const st_mm o[] = {{ST_W_O, ST_ACT_OUT}};
        op->matmul(c, s->full, ST_ACT_MIX, o, 1, 0);
        save(x, 10, c, ST_ACT_OUT, s->d, T);
    }
    op->write(c, ST_ACT_XN, s->d, in->xn);
    if (s->moe) {
        op->moe(c, 0);
        save(x, 13, c, ST_ACT_OUT, s->d, T);
    } else {
        const st_mm gu[] = {{ST_W_GATE, ST_ACT_P1}, {ST_W_UP, ST_ACT_P2}};
        op->matmul(c, 0, ST_ACT_XN, gu, 2, ST_SWIGLU);
        save(x, 11, c, ST_ACT_P1, s->I, T);
        op->write(c, ST_ACT_P1, s->I, in->p1);
        const st_mm dn[] = {{ST_W_DOWN, ST_ACT_OUT}};
        op->matmul(c, 0, ST_ACT_P1, dn, 1, 0);
        save(x, 12, c, ST_ACT_OUT, s->d, T);
        /* the pair as the model runs it: the SwiGLU's outputs read only by the down product
         * (the CUDA backend's bf16 MLP keeps them in bf16 in between) */
        op->write(c, ST_ACT_XN, s->d, in->xn);
        op->matmul(c, 0, ST_ACT_XN, gu, 2, ST_SWIGLU_TO_NEXT);
        op->matmul(c, 0, ST_ACT_P1, dn, 1, 0);
        save(x, 16, c, ST_ACT_OUT, s->d, T);
    }
    op->write(c, ST_ACT_OUT, s->d, in->out);
    op->allreduce(c, ST_ACT_OUT);
    save(x, 14, c, ST_ACT_OUT, s->d, T);
    op->write(c, ST_ACT_XN, s->d, in->xn);
    x->out[15] = realloc(x->out[15], (size_t)(pl->n_logit_rows * s->V + 1) * sizeof(float));
    op->logits(c, x->out[15]);
    x->n_out[15] = pl->n_logit_rows * s->V;
    op->step_end(c, &err);
}

/* a step: up to 4 items (sequence, tokens) */
typedef struct step {
    int n;
    int seq[4], len[4];
} step;

static void test_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), dir);
    st_model *m = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(path, &m, &err) == ST_OK, "%s loads (%s)", dir, err.msg)) return;
    const shapes s = shapes_of(m);
    /* the reference and the configurations under test (each kernel set, 1 and 3 threads) */
    enum { MAXC = 16 };
    ctx cx[MAXC];
    char label[MAXC][64];
    int n_cx = 0;
    memset(cx, 0, sizeof cx);
    st_cache_params cp = st_cache_default_params();
    cp.n_slots = 4;
    cp.max_seq_len = 1536;
    cp.block_size = 16;
    st_cache *cache = NULL;
    st_status st = st_cache_create(m, &cp, &cache, &err);
    st_cpu_params ref = st_cpu_default_params();
    ref.kernels = st_kernels_ref();
    ref.n_threads = 1;
    ref.pack = 0;
    st_cpu_params conf[MAXC];
    const declared *decl[MAXC];
    int partner[MAXC]; /* the 1-thread configuration a 3-thread one must equal, or -1 */
    conf[n_cx] = ref;
    decl[n_cx] = &CPU;
    partner[n_cx] = -1;
    snprintf(label[n_cx++], sizeof label[0], "reference");
    const char *const *names = st_kernels_names();
    for (int i = 0; names[i] && n_cx + 4 <= MAXC; i++) { /* room for the two CUDA configurations */
        const st_kernels *k = st_kernels_by_name(names[i]);
        if (!k) continue;
        for (int th = 1; th <= 3; th += 2) {
            st_cpu_params p = st_cpu_default_params();
            p.kernels = k;
            p.n_threads = th;
            p.min_parallel_work = 1; /* every region on the pool */
            conf[n_cx] = p;
            decl[n_cx] = &CPU;
            partner[n_cx] = th > 1 ? n_cx - 1 : -1;
            snprintf(label[n_cx++], sizeof label[0], "%s, %d thread%s", names[i], th, th > 1 ? "s" : "");
        }
    }
    char why[512] = "";
    const int cuda_at = st_cuda_available(NULL, why, sizeof why) ? n_cx : -1;
    if (cuda_at >= 0) {
        decl[n_cx] = &CUDA;
        partner[n_cx] = -1;
        snprintf(label[n_cx++], sizeof label[0], "device 0");
        decl[n_cx] = &CUDA_BF16;
        partner[n_cx] = -1;
        snprintf(label[n_cx++], sizeof label[0], "device 0");
    } else {
        printf("# %s: the CUDA backend is skipped here: %s\n", dir, why);
    }
    for (int i = 0; i < n_cx && st == ST_OK; i++) {
        if (i == cuda_at) {
            st = st_backend_cuda_create(m, NULL, &cx[i].b, &err);
        } else if (cuda_at >= 0 && i == cuda_at + 1) {
            st_cuda_params bp = st_cuda_default_params();
            bp.precision = ST_PRECISION_BF16;
            st = st_backend_cuda_create(m, &bp, &cx[i].b, &err);
        } else
            st = st_backend_cpu_create(m, &conf[i], NULL, &cx[i].b, &err);
        if (st == ST_OK) st = kit_fwd(cx[i].b, cache, MAX_T, &cx[i].f, &err);
    }
    st_plan_buf pb;
    memset(&pb, 0, sizeof pb);
    if (st == ST_OK) st = st_plan_buf_init(&pb, 4, MAX_T, cache->p.n_blocks, &err);
    inputs in;
    float **bufs[] = {&in.x, &in.out, &in.xn, &in.p1, &in.p2, &in.p3, &in.p4, &in.mix};
    const int64_t width = s.d > s.cd ? (s.d > s.qw ? s.d : s.qw) : (s.cd > s.qw ? s.cd : s.qw);
    const int64_t wide = width > s.I ? width : s.I;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = malloc((size_t)(MAX_T * wide) * sizeof(float));
    if (!CHECK(st == ST_OK, "%s: %d contexts (%s)", dir, n_cx, err.msg)) goto out;
    {
        /* steps: A: 70 tokens from 0 (a 64-token chunk, blocks of 16), then decode; B: 17, then 47
         * to end on position 64, then 65 (a whole chunk and one); C: 1 token, then 64 from
         * position 1 (no chunk); D starts in the second step with a whole chunk, later takes
         * 130 tokens at once (the many-token products' 128-token tiles, wgmma in bf16); then
         * random; where a GPU is there, last, C takes LONG_T tokens at once (products of that
         * many tokens: cuBLASLt in bf16, k_gemm in slices in exact). */
        enum { N_STEPS = 10 };
        const int n_steps = cuda_at >= 0 ? N_STEPS : N_STEPS - 1;
        step steps[N_STEPS] = {
            {3, {0, 1, 2}, {70, 17, 1}},
            {4, {0, 1, 2, 3}, {1, 47, 64, 64}},
            {4, {1, 0, 2, 3}, {65, 5, 1, 1}},
            {1, {3}, {130}},
        };
        for (int k = 4; k < N_STEPS - 1; k++) {
            steps[k].n = 1 + (int)((frand() + 1.0f) * 1.999f);
            for (int i = 0; i < steps[k].n; i++) {
                steps[k].seq[i] = (i + k) % 4;
                steps[k].len[i] = k % 2 ? 1 : 1 + (int)((frand() + 1.0f) * 15.0f);
            }
        }
        steps[N_STEPS - 1] = (step){1, {2}, {LONG_T}};
        st_seq seqs[4];
        int32_t toks[MAX_T];
        for (int i = 0; i < 4; i++) seqs[i].slot = -1;
        for (int i = 0; i < 4 && st == ST_OK; i++) st = st_cache_seq_start(cache, &seqs[i], &err);
        double worst[MAXC][N_OPS];
        int exact[MAXC][N_OPS], seen[N_OPS];
        memset(worst, 0, sizeof worst);
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < MAXC; i++)
            for (int o = 0; o < N_OPS; o++) exact[i][o] = 1;
        for (int k = 0; k < n_steps && st == ST_OK; k++) {
            st_batch_item items[4];
            int64_t T = 0;
            for (int i = 0; i < steps[k].n; i++) {
                for (int j = 0; j < steps[k].len[i]; j++) toks[T + j] = (int32_t)((T + j) * 131 % s.V);
                items[i] = (st_batch_item){&seqs[steps[k].seq[i]], toks + T, steps[k].len[i],
                                           i % 2 ? ST_LOGITS_ALL : ST_LOGITS_LAST};
                T += steps[k].len[i];
            }
            if ((st = st_batch_plan(cache, items, steps[k].n, &pb, &err)) != ST_OK) break;
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) fill(*bufs[i], T * wide);
            for (int i = 0; i < n_cx; i++) run_step(&cx[i], &s, &pb.plan, &in);
            st_batch_commit(cache, items, steps[k].n);
            for (int o = 0; o < N_OPS; o++) {
                if (!cx[0].n_out[o]) continue;
                seen[o] = 1;
                double mx = 0;
                for (int64_t e = 0; e < cx[0].n_out[o]; e++) mx = fabs(cx[0].out[o][e]) > mx ? fabs(cx[0].out[o][e]) : mx;
                for (int i = 1; i < n_cx; i++) {
                    double d = 0;
                    for (int64_t e = 0; e < cx[0].n_out[o]; e++) {
                        double v = fabs((double)cx[i].out[o][e] - (double)cx[0].out[o][e]);
                        if (!(v <= d)) d = v;
                    }
                    d = mx > 0 ? d / mx : d;
                    if (!(d <= worst[i][o])) worst[i][o] = d;
                    const int q = partner[i];
                    if (q >= 0)
                        exact[i][o] &= cx[i].n_out[o] == cx[q].n_out[o] &&
                                       !memcmp(cx[i].out[o], cx[q].out[o], (size_t)cx[i].n_out[o] * sizeof(float));
                }
            }
        }
        CHECK(st == ST_OK, "%s: %d ragged steps ran on %d contexts (%s)", dir, n_steps, n_cx, err.msg);
        for (int o = 0; o < N_OPS && st == ST_OK; o++) {
            if (!seen[o]) continue;
            for (int i = 1; i < n_cx; i++) {
                if (decl[i]->skip_moe && !strcmp(op_names[o], "moe")) continue;
                CHECK(worst[i][o] <= decl[i]->tol, "%s, %s %s: %s within %.0e of the reference (worst %.2e)", dir,
                      decl[i]->name, label[i], op_names[o], decl[i]->tol, worst[i][o]);
                if (partner[i] >= 0 && decl[i]->bit_exact_threads)
                    CHECK(exact[i][o], "%s, %s %s: %s the same bits with 1 and 3 threads", dir, decl[i]->name, label[i],
                          op_names[o]);
            }
        }
        for (int i = 0; i < 4; i++) st_cache_seq_release(cache, &seqs[i]);
    }
out:
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
    st_plan_buf_free(&pb);
    for (int i = 0; i < n_cx; i++) {
        st_fwd_destroy(cx[i].f);
        st_backend_destroy(cx[i].b);
        for (int o = 0; o < N_OPS; o++) free(cx[i].out[o]);
    }
    st_cache_destroy(cache);
    st_model_free(m);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--cuda-available")) { /* for tests/gpu_test.sh */
        char why[512] = "";
        int ok = st_cuda_available(NULL, why, sizeof why);
        printf("%s\n", ok ? "yes" : why);
        return ok ? 0 : 1;
    }
    test_model("tiny-b");
    test_model("tiny-b/mlx-q8");
    test_model("tiny-moe");
    test_model("tiny-a/mlx-q4");
    return tap_done();
}
