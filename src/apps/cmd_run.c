/* ==== strand run: chat with a model from the command line ====
 * strand run -m DIR -p "..." [--image FILE ...] [--system "..."] [--no-think] [-n N] [sampling options]
 * Renders the model's chat template for one user message, streams the answer (the model's
 * reasoning set apart from the answer), and ends with a timing line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/cli.h"
#include "core/utf8.h"
#include "engine/scheduler.h"
#include "template/template.h"
#include "vision/prompt.h"

#define MAX_IMAGES 16

static void usage(void) {
    fprintf(stderr,
            "usage: strand run -m DIR -p PROMPT [--image FILE ...] [--system TEXT] [--no-think] [-n N] [--ctx N]\n"
            "                  [--raw] [--kv-dtype f32|bf16] [--mem-fraction F] [sampling options]\n"
            "  Renders the chat template, streams the reply, prints timings to stderr.\n"
            "  --image FILE (PNG or JPEG, repeatable): images before the prompt in the user message.\n"
            "  --no-think: enable_thinking=false for the template; --raw: no template, the\n"
            "  prompt is tokenized as is. -n N: at most N new tokens (default: to the context).\n"
            "  --logprobs N prints each generated token's log-probability and N alternatives after\n"
            "  the reply. --mem-fraction (default 0.9): share of the memory left after loading that\n"
            "  the cache may plan for (an unset --ctx shrinks to fit; 0 = no check).\n%s",
            cli_sampling_help());
}

typedef struct run_state {
    int tty;
    int in_reasoning_out; /* the reasoning header is open on the terminal */
    int any_content;
    st_event done;
    int finished;
    char error[512];
    st_logprobs *lp;      /* [lp_cap] per generated token, when --logprobs */
    int n_lp, lp_cap;
} run_state;

static void put(const char *s, size_t n) {
    if (n) fwrite(s, 1, n, stdout);
}

static int on_event(void *user, const st_event *ev) {
    run_state *r = user;
    if (ev->kind == ST_EV_TOKEN && ev->logprobs && r->n_lp < r->lp_cap) r->lp[r->n_lp++] = *ev->logprobs;
    if (ev->reasoning_len) {
        if (!r->in_reasoning_out) {
            fputs(r->tty ? "\x1b[2m" : "[thinking]\n", stdout);
            r->in_reasoning_out = 1;
        }
        put(ev->reasoning, ev->reasoning_len);
    }
    if (ev->content_len) {
        if (r->in_reasoning_out) {
            fputs(r->tty ? "\x1b[0m\n\n" : "\n[/thinking]\n\n", stdout);
            r->in_reasoning_out = 0;
        }
        put(ev->content, ev->content_len);
        r->any_content = 1;
    }
    fflush(stdout);
    if (ev->kind == ST_EV_DONE) {
        if (r->in_reasoning_out) fputs(r->tty ? "\x1b[0m" : "\n[/thinking]", stdout);
        fputc('\n', stdout);
        fflush(stdout);
        r->done = *ev;
        r->finished = 1;
        if (ev->error) snprintf(r->error, sizeof r->error, "%s", ev->error);
    }
    return ST_EV_CONTINUE;
}


/* a token's text for the logprob listing, escaped for one line (bytes that are not whole
 * UTF-8 characters as \xNN) */
static void print_token(const st_tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *b = st_tok_token_bytes(tok, id, &n);
    putchar('\'');
    for (size_t i = 0; b && i < n;) {
        unsigned char c = (unsigned char)b[i];
        int k = st_utf8_seq((const uint8_t *)b + i, n - i, NULL);
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\'' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f || k == 0) printf("\\x%02x", c);
        else fwrite(b + i, 1, (size_t)k, stdout);
        i += k > 1 ? (size_t)k : 1;
    }
    putchar('\'');
}

static void print_logprobs(const st_tokenizer *tok, const run_state *r) {
    printf("[logprobs: token, log-probability, then the top alternatives]\n");
    for (int i = 0; i < r->n_lp; i++) {
        const st_logprobs *l = &r->lp[i];
        printf("%4d ", i);
        print_token(tok, l->token);
        printf(" %.4f", l->logprob);
        for (int k = 0; k < l->n_top; k++) {
            printf(k ? ", " : " | ");
            print_token(tok, l->top_tokens[k]);
            printf(" %.4f", l->top_logprobs[k]);
        }
        putchar('\n');
    }
}

int cmd_run(int argc, char **argv) {
    const char *dir = NULL, *prompt = NULL, *system = NULL, *image_path[MAX_IMAGES];
    int no_think = 0, raw = 0, n_images = 0;
    long long n_new = 0, ctx = 0;
    double mem_fraction = 0.9;
    st_kv_dtype kvd = ST_KV_F32;
    st_req_params rp = st_req_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_parse_sampling(argc, argv, &i, &rp);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--system")) {
            if (!(system = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--image")) {
            if (!(image_path[n_images < MAX_IMAGES ? n_images : 0] = cli_value(argc, argv, &i))) return 2;
            if (++n_images > MAX_IMAGES) return cli_failf("run: at most %d images", MAX_IMAGES);
        } else if (!strcmp(a, "--no-think")) {
            no_think = 1;
        } else if (!strcmp(a, "--raw")) {
            raw = 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 30, &n_new)) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 2, (long long)1 << 30, &ctx)) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (cli_parse_kv_dtype(v, &kvd) != 0) return 2;
        } else if (!strcmp(a, "--mem-fraction")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_float(a, v, &mem_fraction)) return 2;
            if (!(mem_fraction >= 0 && mem_fraction <= 1)) return cli_failf("--mem-fraction must be in [0, 1]");
        } else {
            usage();
            return cli_failf("run: unknown option '%s'", a);
        }
    }
    if (!dir || !prompt) {
        usage();
        return cli_failf("run: -m DIR and -p PROMPT are required");
    }
    if (n_images && raw) return cli_failf("run: --image needs the chat template (not --raw)");
    if (st_utf8_check(prompt, strlen(prompt)) != strlen(prompt))
        return cli_failf("run: -p is not valid UTF-8 (byte %zu)", st_utf8_check(prompt, strlen(prompt)));
    if (system && st_utf8_check(system, strlen(system)) != strlen(system))
        return cli_failf("run: --system is not valid UTF-8 (byte %zu)", st_utf8_check(system, strlen(system)));
    st_error err = {0};
    st_model *m = NULL;
    st_backend *be = NULL;
    st_tokenizer *tok = NULL;
    st_chat_template *ct = NULL;
    st_sched *s = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0, text_len = 0;
    json_t *messages = NULL, *kwargs = NULL;
    run_state st = {0};
    int rc = 1;
    st_vision_tower *vt = NULL;
    st_vision_prompt vp = {0};
    st_req_images im = {0};
    if (st_model_load(dir, &m, &err) != ST_OK) goto done;
    if (cli_backend(m, &be, &err) != ST_OK) goto done;
    if (st_tok_load_dir(dir, &tok, &err) != ST_OK) goto done;
    if (raw) {
        text = strdup(prompt);
        text_len = strlen(prompt);
    } else {
        if (st_chat_template_load(dir, NULL, NULL, &ct, &err) != ST_OK) {
            st_error_prefix(&err, "no usable chat template (use --raw to send the prompt as is): ");
            goto done;
        }
        messages = json_array();
        if (system) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system));
        if (n_images) { /* the images, then the prompt */
            json_t *parts = json_array();
            for (int i = 0; i < n_images; i++) json_array_append_new(parts, json_pack("{s:s}", "type", "image"));
            json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text", prompt));
            json_array_append_new(messages, json_pack("{s:s,s:o}", "role", "user", "content", parts));
        } else {
            json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
        }
        kwargs = json_pack("{s:b}", "add_generation_prompt", 1);
        if (no_think) json_object_set_new(kwargs, "enable_thinking", json_false());
        if (st_chat_template_render(ct, messages, NULL, NULL, kwargs, &text, &text_len, &err) != ST_OK) goto done;
    }
    if (st_tok_encode(tok, text, text_len, 1, &ids, &n_ids, &err) != ST_OK) goto done;
    long long ctx_max = ctx > 0 ? ctx : m->cfg.max_position_embeddings;
    if (n_images) { /* each placeholder becomes its image's tokens */
        int64_t nn = (int64_t)n_ids;
        if (cli_vision_prompt(dir, m, &ids, &nn, ctx_max, image_path, n_images, &vt, &vp, &err) != ST_OK) goto done;
        n_ids = (size_t)nn;
        im = (st_req_images){(const int32_t(*)[3])vp.mrope, vp.next, vp.n_rows, vp.rows, vp.embeds, vp.keys};
        rp.images = &im;
    }
    if ((long long)n_ids >= ctx_max) {
        st_error_set(&err, ST_ERR_LIMIT, "the prompt has %zu tokens; the context length is %lld", n_ids, ctx_max);
        goto done;
    }
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = 1;
    sp.ctx = ctx;
    sp.kv_dtype = kvd;
    sp.mem_budget = st_sched_memory_budget(m, be, mem_fraction);
    sp.backend = be;
    sp.images = n_images > 0;
    if (n_new > 0) { /* the pool holds this request, no more */
        long long need = (long long)n_ids + n_new < ctx_max ? (long long)n_ids + n_new : ctx_max;
        sp.kv_blocks = (need + sp.block_size - 1) / sp.block_size;
    }
    if (st_sched_create(m, tok, &sp, &s, &err) != ST_OK) goto done;
    if (st_sched_get_plan(s)->fitted)
        fprintf(stderr, "strand: the context is %lld, sized to fit this machine's memory (--ctx, --mem-fraction)\n",
                (long long)st_sched_context(s));
    rp.max_tokens = n_new;
    rp.split_reasoning = st_tok_token_to_id(tok, "</think>", 8) >= 0;
    rp.start_in_reasoning = rp.split_reasoning && st_textout_prompt_opens_think(text);
    st.tty = isatty(STDOUT_FILENO);
    if (rp.logprobs >= 0) {
        st.lp_cap = (int)(st_sched_context(s) - (int64_t)n_ids);
        st.lp = malloc((size_t)st.lp_cap * sizeof *st.lp);
        if (!st.lp) {
            st_error_set(&err, ST_ERR_NOMEM, "out of memory for %d logprob records", st.lp_cap);
            goto done;
        }
    }
    if (st_sched_submit(s, ids, (int64_t)n_ids, &rp, on_event, &st, NULL, &err) != ST_OK) goto done;
    while (st_sched_step(s) > 0) {
    }
    if (st.done.finish == ST_FINISH_ERROR) {
        st_error_set(&err, ST_ERR_INTERNAL, "generation failed: %s", st.error);
        goto done;
    }
    if (st.lp) print_logprobs(tok, &st);
    const st_event *d = &st.done;
    double decode_s = d->total_s - d->ttft_s;
    int64_t gen = d->usage.completion_tokens;
    char rate[64] = "";
    if (gen > 1 && decode_s > 0) snprintf(rate, sizeof rate, " at %.1f tok/s", (double)(gen - 1) / decode_s);
    fprintf(stderr, "[%lld prompt tokens, first token after %.1f ms (prefill %.1f tok/s), %lld token%s%s, finish: %s]\n",
            (long long)d->usage.prompt_tokens, d->ttft_s * 1e3,
            d->ttft_s > 0 ? (double)d->usage.prompt_tokens / d->ttft_s : 0.0, (long long)gen, gen == 1 ? "" : "s",
            rate, st_finish_name(d->finish));
    rc = 0;
done:
    if (rc) cli_fail(&err);
    free(st.lp);
    json_decref(messages);
    json_decref(kwargs);
    free(text);
    free(ids);
    st_sched_destroy(s);
    st_vision_prompt_free(&vp);
    st_vision_free(vt);
    st_chat_template_free(ct);
    st_tok_free(tok);
    st_backend_destroy(be);
    st_model_free(m);
    return rc;
}
