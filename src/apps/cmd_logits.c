/* ==== strand logits: write the logits of a prompt to a file ====
 * strand logits -m DIR --ids 1,2,3 [--image FILE ...] [--all] [--chunk N] [--kv-dtype f32|bf16] -o FILE
 * Output: float32 little-endian, [T][V] with --all, else [V] for the last position. With
 * --image, IDS holds each image's run of image tokens (config.json's image_token_id, as many
 * as the image's patches / merge^2), images in order: their rows take the vision tower's
 * embeddings and the prompt M-RoPE positions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "engine/batch.h"
#include "model/forward.h"
#include "vision/prompt.h"

#define MAX_IMAGES 64

static void usage(void) {
    fprintf(stderr,
            "usage: strand logits -m DIR --ids 1,2,3 [--image FILE ...] [--all] [--chunk N] "
            "[--kv-dtype f32|bf16] -o FILE\n"
            "  Writes float32 little-endian logits: [T][vocab] with --all, else [vocab] for the\n"
            "  last position. The prompt runs in chunks of N tokens (default 512). With --image\n"
            "  (PNG or JPEG, in order), IDS holds each image's run of image tokens.\n");
}

int cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *out_path = NULL, *image_path[MAX_IMAGES];
    int all = 0, n_images = 0;
    long long chunk = 512;
    st_kv_dtype kvd = ST_KV_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            if (!(ids_s = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-o")) {
            if (!(out_path = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--image")) {
            if (!(image_path[n_images < MAX_IMAGES ? n_images : 0] = cli_value(argc, argv, &i))) return 2;
            if (++n_images > MAX_IMAGES) return cli_failf("logits: at most %d images", MAX_IMAGES);
        } else if (!strcmp(a, "--all")) {
            all = 1;
        } else if (!strcmp(a, "--chunk")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &chunk)) return 2;
        } else if (!strcmp(a, "--kv-dtype")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            if (cli_parse_kv_dtype(v, &kvd) != 0) return 2;
        } else {
            usage();
            return cli_failf("logits: unknown option '%s'", a);
        }
    }
    if (!dir || !ids_s || !out_path) {
        usage();
        return cli_failf("logits: -m, --ids and -o are required");
    }
    st_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (cli_parse_ids(ids_s, &ids, &n, &err) != ST_OK) return cli_fail(&err);
    if (n == 0) {
        free(ids);
        return cli_failf("logits: --ids is empty");
    }
    st_model *m = NULL;
    st_cache *cache = NULL;
    st_fwd *f = NULL;
    st_backend *be = NULL;
    float *lg = NULL;
    FILE *fp = NULL;
    int rc = 1;
    st_vision_tower *vt = NULL;
    st_vision_prompt vp = {0};
    int64_t *rel = NULL;
    const float **rowp = NULL;
    if (st_model_load(dir, &m, &err) != ST_OK) goto done;
    if (n_images) { /* the image parts: tower, processor, embeddings, positions */
        int64_t nn = n;
        if (cli_vision_prompt(dir, m, &ids, &nn, 0, image_path, n_images, &vt, &vp, &err) != ST_OK) goto done;
        rel = malloc((size_t)(vp.n_rows + 1) * sizeof *rel);
        rowp = malloc((size_t)(vp.n_rows + 1) * sizeof *rowp);
        if (!rel || !rowp) {
            st_error_set(&err, ST_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (cli_backend(m, &be, &err) != ST_OK) goto done;
    st_cache_params cp = st_cache_default_params();
    cp.max_seq_len = n;
    cp.kv_dtype = kvd;
    if (st_cache_create(m, &cp, &cache, &err) != ST_OK) goto done;
    if (chunk > n) chunk = n;
    st_ctx_params xp = st_cache_ctx_params(cache, (int)chunk);
    if (st_fwd_create(be, &xp, &f, &err) != ST_OK) goto done;
    if (n_images && st_fwd_enable_embeds(f, &err) != ST_OK) goto done;
    int64_t V = m->cfg.vocab_size;
    lg = malloc((size_t)chunk * (size_t)V * sizeof(float));
    if (!lg) {
        st_error_set(&err, ST_ERR_NOMEM, "out of memory");
        goto done;
    }
    st_seq seq = {.slot = -1};
    if (st_cache_seq_start(cache, &seq, &err) != ST_OK) goto done;
    /* -o - is standard output; in a tensor-parallel job rank 0 writes, the others compute */
    fp = cli_rank() != 0 ? fopen("/dev/null", "wb") : strcmp(out_path, "-") ? fopen(out_path, "wb") : stdout;
    if (!fp) {
        st_error_set(&err, ST_ERR_IO, "%s: cannot create: %s", out_path, strerror(errno));
        goto done;
    }
    for (int i = 0; i < n; i += (int)chunk) {
        int take = n - i < chunk ? n - i : (int)chunk;
        int last = i + take == n;
        st_batch_item it = {&seq, ids + i, take,
                            all ? ST_LOGITS_ALL : (last ? ST_LOGITS_LAST : ST_LOGITS_NONE)};
        if (n_images) { /* this chunk's image rows, relative to it */
            int64_t r0 = 0, k = 0;
            while (r0 < vp.n_rows && vp.rows[r0] < i) r0++;
            while (r0 + k < vp.n_rows && vp.rows[r0 + k] < i + take) {
                rel[k] = vp.rows[r0 + k] - i;
                rowp[k] = vp.embeds + (r0 + k) * m->cfg.hidden_size;
                k++;
            }
            const st_batch_images im = {&vp.mrope[i][0], k, rel, rowp, NULL};
            if (st_batch_run_images(cache, f, &it, 1, &im, lg, &err) != ST_OK) goto done;
        } else if (st_batch_run(cache, f, &it, 1, lg, &err) != ST_OK) {
            goto done;
        }
        size_t rows = (size_t)st_batch_logit_rows(&it, 1);
        if (rows && fwrite(lg, sizeof(float) * (size_t)V, rows, fp) != rows) {
            st_error_set(&err, ST_ERR_IO, "%s: write failed", out_path);
            goto done;
        }
    }
    if ((fp == stdout ? fflush(fp) : fclose(fp)) != 0) {
        fp = NULL;
        st_error_set(&err, ST_ERR_IO, "%s: write failed", out_path);
        goto done;
    }
    fp = NULL;
    rc = 0;
done:
    if (fp && fp != stdout) fclose(fp);
    if (rc) cli_fail(&err);
    free(lg);
    free(ids);
    free(rel);
    free(rowp);
    st_vision_prompt_free(&vp);
    st_vision_free(vt);
    st_fwd_destroy(f);
    st_cache_destroy(cache);
    st_backend_destroy(be);
    st_model_free(m);
    return rc;
}
