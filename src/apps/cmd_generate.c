/* ==== strand generate: token ids in, generated token ids out ====
 * strand generate -m DIR (--ids 1,2,3 | --batch-file F) -n N [--temp 0] [--print-ids]
 *                 [--ignore-eos] [--ctx N] [--chunk N] [--kv-dtype f32|bf16]
 * With --batch-file every line (comma-separated ids) is a prompt; all run as one ragged batch
 * and one line of generated ids is printed per prompt, in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "engine/generate.h"

static void usage(void) {
    fprintf(stderr,
            "usage: strand generate -m DIR (--ids 1,2,3 | --batch-file F) -n N [--temp 0]\n"
            "                       [--print-ids] [--ignore-eos] [--ctx N] [--chunk N]\n"
            "                       [--kv-dtype f32|bf16]\n"
            "  --ctx N: context length (default: the model's max_position_embeddings).\n"
            "  Greedy generation; prints the generated ids space-separated, one line per prompt.\n"
            "  --batch-file F: one prompt per line (comma-separated ids), run as one batch.\n");
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

int cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *batch = NULL;
    long long n_new = -1, chunk = 512;
    double temp = 0;
    st_gen_options opt = st_gen_default_options();
    opt.stop_at_eos = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            if (!(ids_s = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--batch-file")) {
            if (!(batch = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 30, &n_new))
                return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1 << 20, &chunk))
                return 2;
        } else if (!strcmp(a, "--ctx")) {
            long long ctx;
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, (long long)1 << 30, &ctx))
                return 2;
            opt.max_seq_len = ctx;
        } else if (!strcmp(a, "--temp")) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_float(a, v, &temp)) return 2;
        } else if (!strcmp(a, "--print-ids")) {
            /* ids are what this command prints */
        } else if (!strcmp(a, "--ignore-eos")) {
            opt.stop_at_eos = 0;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!strcmp(v, "f32")) opt.kv_dtype = ST_KV_F32;
            else if (!strcmp(v, "bf16")) opt.kv_dtype = ST_KV_BF16;
            else return cli_failf("--kv-dtype: expected f32 or bf16, got '%s'", v);
        } else {
            usage();
            return cli_failf("generate: unknown option '%s'", a);
        }
    }
    if (!dir || (!ids_s == !batch) || n_new < 0) {
        usage();
        return cli_failf("generate: -m, -n and one of --ids / --batch-file are required");
    }
    if (temp != 0)
        return cli_failf("generate: only greedy decoding (--temp 0) is available in this build");
    opt.max_batch_tokens = (int)chunk;
    st_error err = {0};
    int32_t **prompts = NULL;
    int *lens = NULL, n = 0;
    if (batch) {
        if (read_batch(batch, &prompts, &lens, &n, &err) != ST_OK) return cli_fail(&err);
    } else {
        prompts = calloc(1, sizeof *prompts);
        lens = calloc(1, sizeof *lens);
        if (!prompts || !lens) return cli_failf("out of memory");
        if (cli_parse_ids(ids_s, &prompts[0], &lens[0], &err) != ST_OK) return cli_fail(&err);
        if (lens[0] == 0) return cli_failf("generate: --ids is empty");
        n = 1;
    }
    st_model *m = NULL;
    st_gen_request *reqs = calloc((size_t)n, sizeof *reqs);
    int32_t *outs = calloc((size_t)n * (size_t)(n_new ? n_new : 1), sizeof *outs);
    int rc = 1;
    if (!reqs || !outs) {
        st_error_set(&err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (st_model_load(dir, &m, &err) != ST_OK) goto done;
    for (int i = 0; i < n; i++)
        reqs[i] = (st_gen_request){prompts[i], lens[i], (int)n_new, outs + (size_t)i * (size_t)n_new,
                                   0, NULL};
    if (st_generate_greedy(m, reqs, n, &opt, &err) != ST_OK) goto done;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < reqs[i].n_out; j++) printf(j ? " %d" : "%d", reqs[i].out[j]);
        printf("\n");
    }
    rc = 0;
done:
    if (rc) cli_fail(&err);
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(lens);
    free(reqs);
    free(outs);
    st_model_free(m);
    return rc;
}
