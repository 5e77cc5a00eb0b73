/* ==== strand inspect: describe a checkpoint ====
 * Architecture, layer kinds, storage formats, parameter count, bytes read per decoded token,
 * cache bytes per token and per sequence. */
#include <stdio.h>
#include <string.h>

#include "apps/cli.h"
#include "model/model.h"

static void usage(void) { fprintf(stderr, "usage: strand inspect -m DIR\n"); }

static const char *fmt_bytes(char *buf, size_t cap, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

/* A storage-format tally: one line per (format, bits, group). */
typedef struct tally {
    char label[48];
    int count;
    double bytes;
} tally;

static void tally_add(tally *t, int *n, const st_matrix *m) {
    if (!m->data) return;
    char label[48];
    if (m->fmt == ST_WFMT_AFFINE)
        snprintf(label, sizeof label, "affine %d-bit, group %d, %s scales", m->bits, m->group,
                 st_dtype_name(m->sdtype));
    else
        snprintf(label, sizeof label, "%s", m->fmt == ST_WFMT_BF16 ? "bf16" : m->fmt == ST_WFMT_F16 ? "f16" : "f32");
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].label, label)) {
            t[i].count++;
            t[i].bytes += (double)st_matrix_bytes(m);
            return;
        }
    if (*n >= 16) return;
    snprintf(t[*n].label, sizeof t[*n].label, "%s", label);
    t[*n].count = 1;
    t[*n].bytes = (double)st_matrix_bytes(m);
    (*n)++;
}

int cmd_inspect(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else {
            usage();
            return cli_failf("inspect: unknown option '%s'", argv[i]);
        }
    }
    if (!dir) {
        usage();
        return cli_failf("inspect: -m DIR is required");
    }
    st_error err = {0};
    st_model *m;
    if (st_model_load(dir, &m, &err) != ST_OK) return cli_fail(&err);
    const st_config *c = &m->cfg;
    char b1[32], b2[32], b3[32];
    printf("checkpoint:      %s (%d file%s, %s layout%s)\n", dir, m->ck->n_files,
           m->ck->n_files > 1 ? "s" : "", m->is_mlx_layout ? "MLX" : "Hugging Face",
           c->has_vision ? ", with a vision tower (used for --image)" : "");
    printf("architecture:    %s (model_type %s)%s\n",
           c->architecture[0] ? c->architecture : "?", c->model_type, c->is_moe ? ", MoE" : "");
    printf("layers:          %d = %d Gated DeltaNet + %d gated full attention\n", c->n_layers,
           m->n_linear, m->n_full);
    printf("layer kinds:     ");
    for (int i = 0; i < c->n_layers; i++) putchar(c->layer_kind[i] == ST_LAYER_FULL ? 'F' : 'L');
    printf("  (L = linear, F = full)\n");
    printf("hidden:          %lld, vocab %lld, %s LM head\n", (long long)c->hidden_size,
           (long long)c->vocab_size, m->tied ? "tied" : "separate");
    printf("attention:       %d query heads, %d KV heads, head_dim %d, RoPE on %d dims "
           "(theta %g)\n",
           c->n_heads, c->n_kv_heads, c->head_dim, c->rope_dim, c->rope_theta);
    printf("gated deltanet:  %d key heads x %d, %d value heads x %d, conv kernel %d\n",
           c->lin_n_key_heads, c->lin_key_head_dim, c->lin_n_value_heads, c->lin_value_head_dim,
           c->conv_kernel);
    if (c->is_moe)
        printf("mlp:             %d experts, top-%d, expert width %lld, shared expert %lld\n",
               c->n_experts, c->n_experts_per_tok, (long long)c->moe_intermediate_size,
               (long long)c->shared_expert_intermediate_size);
    else
        printf("mlp:             SwiGLU, width %lld\n", (long long)c->intermediate_size);
    printf("context:         %lld positions (max_position_embeddings)\n",
           (long long)c->max_position_embeddings);
    if (c->n_eos) {
        printf("stop ids:       ");
        for (int i = 0; i < c->n_eos; i++) printf(" %d", c->eos_ids[i]);
        printf("\n");
    }
    tally t[16];
    int nt = 0;
    tally_add(t, &nt, &m->embed);
    if (!m->tied) tally_add(t, &nt, &m->lm_head);
    for (int i = 0; i < c->n_layers; i++) {
        const st_layer *L = &m->layers[i];
        const st_matrix *mats[] = {&L->in_qkv, &L->in_z,   &L->in_b,   &L->in_a,    &L->out_proj,
                                   &L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj,  &L->gate,
                                   &L->up,     &L->down,   &L->router, &L->sh_gate, &L->sh_up,
                                   &L->sh_down, &L->sh_expert_gate};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) tally_add(t, &nt, mats[k]);
        for (int e = 0; c->is_moe && e < c->n_experts; e++) {
            tally_add(t, &nt, &L->exp_gate[e]);
            tally_add(t, &nt, &L->exp_up[e]);
            tally_add(t, &nt, &L->exp_down[e]);
        }
    }
    printf("weights:\n");
    for (int i = 0; i < nt; i++)
        printf("  %-44s %5d matrices  %s\n", t[i].label, t[i].count,
               fmt_bytes(b1, sizeof b1, t[i].bytes));
    st_model_stats s16, s32;
    st_model_get_stats(m, 2, &s16);
    st_model_get_stats(m, 4, &s32);
    printf("parameters:      %lld (%.3f B), %s as stored\n", (long long)s16.n_params,
           (double)s16.n_params / 1e9, fmt_bytes(b1, sizeof b1, (double)s16.weight_bytes));
    printf("read per token:  %s of weights per decoded token at batch 1 (%.3f GB)\n",
           fmt_bytes(b1, sizeof b1, (double)s16.bytes_per_token), (double)s16.bytes_per_token / 1e9);
    printf("kv cache:        %zu B per token in bf16 (%zu B in f32)\n", s16.kv_bytes_per_token,
           s32.kv_bytes_per_token);
    printf("recurrent state: %s per sequence (fp32 delta-rule state + conv state)\n",
           fmt_bytes(b1, sizeof b1, (double)s16.state_bytes_per_seq));
    printf("per sequence:    ");
    int64_t lens[] = {4096, 32768, c->max_position_embeddings};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && lens[2] <= 32768) break;
        double tot = (double)s16.kv_bytes_per_token * (double)lens[i] + (double)s16.state_bytes_per_seq;
        printf("%s%s at %lld", i ? ", " : "", fmt_bytes(b2, sizeof b2, tot), (long long)lens[i]);
    }
    printf(" tokens (bf16 KV)\n");
    (void)b3;
    st_model_free(m);
    return 0;
}
