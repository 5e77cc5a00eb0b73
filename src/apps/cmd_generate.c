/* ==== strand generate: token ids in, generated token ids out ====
 * strand generate -m DIR (--ids 1,2,3 [--image FILE ...] | --batch-file F) -n N [--print-ids]
 *                 [sampling options] [--ctx N] [--chunk N] [--kv-dtype f32|bf16]
 * With --image, IDS holds each image's run of image tokens (as strand logits takes them).
 * With --batch-file every line (comma-separated ids) is a prompt; all run as one ragged batch
 * and one line of generated ids is printed per prompt, in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "engine/scheduler.h"
#include "vision/prompt.h"

#define MAX_IMAGES 64

static void usage(void) {
    fprintf(stderr,
            "usage: strand generate -m DIR (--ids 1,2,3 [--image FILE ...] | --batch-file F) -n N [--print-ids]\n"
            "                       [sampling options] [--ctx N] [--chunk N] [--kv-dtype f32|bf16]\n"
            "                       [--full-logits]\n"
            "  Prints the generated ids space-separated, one line per prompt (after each line,\n"
            "  with --logprobs N, one line per token: id logprob | alternative:logprob ...).\n"
            "  --batch-file F: one prompt per line (comma-separated ids); all run as one batch.\n"
            "  --ctx N: context length (default: the model's max_position_embeddings).\n"
            "  --chunk N: tokens per step while prefilling (default 512).\n"
            "  --full-logits: sample from whole logit rows even where a row's top tokens settle\n"
            "  the draw (compact rows: on a GPU, a kilobyte a token comes back; same tokens).\n%s",
            cli_sampling_help());
}

/* Split the batch file into prompts (one per non-empty line). */
static st_status read_batch(const char *path, int32_t ***prompts, int **lens, int *n,
                            st_error *err) {
    char *text;
    size_t len;
    st_status st = st_file_read(path, 256u << 20, &text, &len, err);
    if (st != ST_OK) return st;
    int cap = 16, count = 0;
    int32_t **p = calloc((size_t)cap, sizeof *p);
    int *l = calloc((size_t)cap, sizeof *l);
    char *save = NULL;
    int line_no = 0;
    for (char *line = strtok_r(text, "\n", &save); line && p && l;
         line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        int32_t *ids;
        int nn;
        if ((st = cli_parse_ids(line, &ids, &nn, err)) != ST_OK) {
            st_error_prefix(err, "%s line %d: ", path, line_no);
            break;
        }
        if (nn == 0) {
            free(ids);
            continue;
        }
        if (count == cap) {
            cap *= 2;
            int32_t **np = realloc(p, (size_t)cap * sizeof *np);
            int *nl = np ? realloc(l, (size_t)cap * sizeof *nl) : NULL;
            if (np) p = np;
            if (!np || !nl) {
                free(ids);
                st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
                break;
            }
            l = nl;
        }
        p[count] = ids;
        l[count++] = nn;
    }
    free(text);
    if (st == ST_OK && (!p || !l)) st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (st == ST_OK && count == 0) st = st_error_set(err, ST_ERR_ARG, "%s: no prompts", path);
    if (st != ST_OK) {
        for (int i = 0; p && i < count; i++) free(p[i]);
        free(p);
        free(l);
        return st;
    }
    *prompts = p;
    *lens = l;
    *n = count;
    return ST_OK;
}

/* one prompt's output, filled by the scheduler's events */
typedef struct gen_out {
    int32_t *ids;        /* [cap] */
    float *lp;           /* [cap] chosen token logprob (when --logprobs) */
    int32_t *alt;        /* [cap][n_alt] */
    float *alt_lp;       /* [cap][n_alt] */
    int n, cap, n_alt;
    int done;
    st_finish_reason finish;
    char error[512];
} gen_out;

static int on_event(void *user, const st_event *ev) {
    gen_out *o = user;
    if (ev->kind == ST_EV_TOKEN) {
        if (o->n >= o->cap) return ST_EV_CONTINUE;
        o->ids[o->n] = ev->token;
        if (ev->logprobs && o->lp) {
            o->lp[o->n] = ev->logprobs->logprob;
            for (int k = 0; k < o->n_alt; k++) {
                int have = k < ev->logprobs->n_top;
                o->alt[(size_t)o->n * (size_t)o->n_alt + (size_t)k] = have ? ev->logprobs->top_tokens[k] : -1;
                o->alt_lp[(size_t)o->n * (size_t)o->n_alt + (size_t)k] = have ? ev->logprobs->top_logprobs[k] : 0;
            }
        }
        o->n++;
        return ST_EV_CONTINUE;
    }
    o->done = 1;
    o->finish = ev->finish;
    if (ev->error) snprintf(o->error, sizeof o->error, "%s", ev->error);
    return ST_EV_CONTINUE;
}

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *batch = NULL, *image_path[MAX_IMAGES];
    int n_images = 0;
    long long n_new = -1, chunk = 512, ctx = 0;
    int full_logits = 0;
    st_kv_dtype kvd = ST_KV_F32;
    st_req_params rp = st_req_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        int r = cli_parse_sampling(argc, argv, &i, &rp);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            if (!(ids_s = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--image")) {
            if (!(image_path[n_images < MAX_IMAGES ? n_images : 0] = cli_value(argc, argv, &i))) return 2;
            if (++n_images > MAX_IMAGES) return cli_failf("generate: at most %d images", MAX_IMAGES);
        } else if (!strcmp(a, "--batch-file")) {
            if (!(batch = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 30, &n_new)) return 2;
        } else if (!strcmp(a, "--full-logits")) {
            full_logits = 1;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &chunk)) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, (long long)1 << 30, &ctx)) return 2;
        } else if (!strcmp(a, "--print-ids")) {
            /* ids are what this command prints */
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (cli_parse_kv_dtype(v, &kvd) != 0) return 2;
        } else {
            usage();
            return cli_failf("generate: unknown option '%s'", a);
        }
    }
    if (!dir || (!ids_s == !batch) || n_new < 0) {
        usage();
        return cli_failf("generate: -m, -n and one of --ids / --batch-file are required");
    }
    if (n_images && batch) return cli_failf("generate: --image goes with --ids, not --batch-file");
    st_error err = {0};
    int32_t **prompts = NULL;
    int *lens = NULL, n = 0;
    if (batch) {
        if (read_batch(batch, &prompts, &lens, &n, &err) != ST_OK) return cli_fail(&err);
    } else {
        prompts = calloc(1, sizeof *prompts);
        lens = calloc(1, sizeof *lens);
        int rc0 = 0;
        if (!prompts || !lens) rc0 = cli_failf("out of memory");
        else if (cli_parse_ids(ids_s, &prompts[0], &lens[0], &err) != ST_OK) rc0 = cli_fail(&err);
        else if (lens[0] == 0) rc0 = cli_failf("generate: --ids is empty");
        if (rc0) {
            if (prompts) free(prompts[0]);
            free(prompts);
            free(lens);
            return rc0;
        }
        n = 1;
    }
    st_model *m = NULL;
    st_backend *be = NULL;
    st_tokenizer *tok = NULL;
    st_sched *s = NULL;
    st_vision_tower *vt = NULL;
    st_vision_prompt vp = {0};
    st_req_images im = {0};
    gen_out *outs = calloc((size_t)n, sizeof *outs);
    int rc = 1;
    if (!outs) {
        st_error_set(&err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (st_model_load(dir, &m, &err) != ST_OK) goto done;
    if (n_images) {
        int64_t nn = lens[0];
        if (cli_vision_prompt(dir, m, &prompts[0], &nn, 0, image_path, n_images, &vt, &vp, &err) != ST_OK) goto done;
        im = (st_req_images){(const int32_t(*)[3])vp.mrope, vp.next, vp.n_rows, vp.rows, vp.embeds, vp.keys};
        rp.images = &im;
    }
    if (cli_backend(m, &be, &err) != ST_OK) goto done;
    if (rp.n_stop && st_tok_load_dir(dir, &tok, &err) != ST_OK) {
        st_error_prefix(&err, "--stop needs the model's tokenizer: ");
        goto done;
    }
    if (ctx <= 0) ctx = m->cfg.max_position_embeddings;
    /* the KV pool holds what these prompts can use */
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = n;
    sp.ctx = ctx;
    sp.step_tokens = (int)(chunk > n ? chunk : n);
    sp.kv_dtype = kvd;
    sp.max_queue = n;
    sp.kv_blocks = 0;
    sp.mem_budget = st_sched_memory_budget(m, be, 0.9);
    sp.backend = be;
    sp.images = n_images > 0;
    sp.logits_top = !full_logits;
    for (int i = 0; i < n; i++) {
        if (lens[i] >= ctx) {
            st_error_set(&err, ST_ERR_LIMIT, "prompt %d has %d tokens; the context length is %lld",
                         i, lens[i], ctx);
            goto done;
        }
        /* generation stops at the context length (finish "length") */
        long long pos = lens[i] + n_new < ctx ? lens[i] + n_new : ctx;
        sp.kv_blocks += (pos + sp.block_size - 1) / sp.block_size;
    }
    if (sp.kv_blocks == 0) sp.kv_blocks = 1;
    if (st_sched_create(m, tok, &sp, &s, &err) != ST_OK) goto done;
    rp.max_tokens = n_new;
    for (int i = 0; i < n; i++) {
        gen_out *o = &outs[i];
        o->cap = (int)n_new;
        o->n_alt = rp.logprobs > 0 ? rp.logprobs : 0;
        o->ids = calloc((size_t)(n_new ? n_new : 1), sizeof *o->ids);
        if (rp.logprobs >= 0) {
            o->lp = calloc((size_t)(n_new ? n_new : 1), sizeof *o->lp);
            o->alt = calloc((size_t)(n_new ? n_new : 1) * (size_t)(o->n_alt ? o->n_alt : 1), sizeof *o->alt);
            o->alt_lp = calloc((size_t)(n_new ? n_new : 1) * (size_t)(o->n_alt ? o->n_alt : 1), sizeof *o->alt_lp);
        }
        if (!o->ids || (rp.logprobs >= 0 && (!o->lp || !o->alt || !o->alt_lp))) {
            st_error_set(&err, ST_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (n_new == 0) {
            o->done = 1;
            continue;
        }
        if (st_sched_submit(s, prompts[i], lens[i], &rp, on_event, o, NULL, &err) != ST_OK) {
            st_error_prefix(&err, "prompt %d: ", i);
            goto done;
        }
    }
    while (st_sched_step(s) > 0) {
    }
    for (int i = 0; i < n; i++) {
        if (outs[i].finish == ST_FINISH_ERROR) {
            st_error_set(&err, ST_ERR_INTERNAL, "prompt %d: %s", i, outs[i].error);
            goto done;
        }
    }
    for (int i = 0; i < n; i++) {
        gen_out *o = &outs[i];
        for (int j = 0; j < o->n; j++) printf(j ? " %d" : "%d", o->ids[j]);
        printf("\n");
        for (int j = 0; o->lp && j < o->n; j++) {
            printf("  %d %.6f |", o->ids[j], o->lp[j]);
            for (int k = 0; k < o->n_alt; k++)
                if (o->alt[(size_t)j * (size_t)o->n_alt + (size_t)k] >= 0)
                    printf(" %d:%.6f", o->alt[(size_t)j * (size_t)o->n_alt + (size_t)k],
                           o->alt_lp[(size_t)j * (size_t)o->n_alt + (size_t)k]);
            printf("\n");
        }
    }
    rc = 0;
done:
    if (rc) cli_fail(&err);
    for (int i = 0; i < n; i++) {
        free(prompts[i]);
        if (outs) {
            free(outs[i].ids);
            free(outs[i].lp);
            free(outs[i].alt);
            free(outs[i].alt_lp);
        }
    }
    free(outs);
    free(prompts);
    free(lens);
    st_sched_destroy(s);
    st_vision_prompt_free(&vp);
    st_vision_free(vt);
    st_tok_free(tok);
    st_backend_destroy(be);
    st_model_free(m);
    return rc;
}
