/* The vision path against the reference (tests/data/fixtures/tiny-vl): the reference's
 * pixel values of img0 and img2 in, its vision embeddings out (the scalar kernels and the
 * best set of this CPU); the M-RoPE positions of the prompt holding both images; that prompt's
 * logits and greedy tokens with the tower's embeddings in its image rows; the refusals (no
 * tower, bad grids, runs that do not match the images). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda.h"
#include "jpeg_write.h"
#include "kit.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tap.h"
#include "core/fileio.h"
#include "engine/scheduler.h"
#include "vision/image.h"
#include "vision/mrope.h"
#include "vision/prompt.h"
#include "vision/tower.h"

static const st_tensor *need(const st_checkpoint *g, const char *name) {
    const st_tensor *t = st_checkpoint_find(g, name);
    if (!CHECK(t != NULL, "golden tensor %s", name)) return NULL;
    return t;
}

/* largest |a - b| over the largest |b| */
static double rel_err(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN sticks */
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* gpu: the tower's arithmetic on the CUDA device (st_cuda_vision_create) */
static void test_embeds(const char *dir, const st_checkpoint *g, const st_kernels *k, const char *kname, int gpu) {
    st_error err = {0};
    st_vision_tower *v = NULL;
    if (!CHECK(st_vision_load(dir, k, &v, &err) == ST_OK, "tiny-vl's tower loads (%s kernels): %s", kname, err.msg))
        return;
    if (gpu) {
        st_vision_device *d = NULL;
        if (!CHECK(st_cuda_vision_create(NULL, v, &d, &err) == ST_OK, "tiny-vl's tower on the GPU (%s)", err.msg)) {
            st_vision_free(v);
            return;
        }
        st_vision_set_device(v, d);
    }
    const st_tensor *p0 = need(g, "img0.pixel_values"), *p2 = need(g, "img2.pixel_values");
    const st_tensor *g0 = need(g, "img0.grid_thw"), *g2 = need(g, "img2.grid_thw"), *ref = need(g, "vision.embeds");
    if (!p0 || !p2 || !g0 || !g2 || !ref) {
        st_vision_free(v);
        return;
    }
    const int64_t D = st_vision_patch_dim(v), n0 = p0->shape[0], n2 = p2->shape[0];
    CHECK(p0->shape[1] == D && p2->shape[1] == D, "pixel rows of %lld values (the tower's patch)", (long long)D);
    float *px = malloc((size_t)((n0 + n2) * D) * sizeof(float));
    float *out = malloc((size_t)ref->numel * sizeof(float));
    memcpy(px, p0->data, (size_t)(n0 * D) * sizeof(float));
    memcpy(px + n0 * D, p2->data, (size_t)(n2 * D) * sizeof(float));
    int32_t grid[2][3];
    memcpy(grid[0], g0->data, sizeof grid[0]);
    memcpy(grid[1], g2->data, sizeof grid[1]);
    const int64_t rows = (n0 + n2) / (v->cfg.merge * v->cfg.merge);
    CHECK(rows == ref->shape[0] && v->cfg.out_hidden == ref->shape[1], "%lld embeddings of %d (the reference's %lldx%lld)",
          (long long)rows, v->cfg.out_hidden, (long long)ref->shape[0], (long long)ref->shape[1]);
    st_status st = st_vision_encode(v, px, (const int32_t(*)[3])grid, 2, out, &err);
    const double e = st == ST_OK ? rel_err(out, ref->data, ref->numel) : INFINITY;
    CHECK(st == ST_OK && e < 1e-5, "img0 + img2 through the tower (%s kernels): embeddings within 1e-5 of the "
                                   "reference (max rel err %.2e) %s", kname, e, err.msg);
    /* on 3 threads: the same bits */
    float *thr = malloc((size_t)ref->numel * sizeof(float));
    st = st_vision_set_threads(v, 3, &err);
    if (st == ST_OK) st = st_vision_encode(v, px, (const int32_t(*)[3])grid, 2, thr, &err);
    CHECK(st == ST_OK && !memcmp(thr, out, (size_t)ref->numel * sizeof(float)),
          "the tower on 3 threads: the same bits as on one (%s kernels) %s", kname, err.msg);
    st_vision_set_threads(v, 1, &err);
    free(thr);
    /* each image alone gives its own rows, the same bits as in the pair */
    float *solo = malloc((size_t)ref->numel * sizeof(float));
    st = st_vision_encode(v, px + n0 * D, (const int32_t(*)[3])grid + 1, 1, solo, &err);
    const int64_t r0 = n0 / (v->cfg.merge * v->cfg.merge);
    CHECK(st == ST_OK && !memcmp(solo, out + r0 * v->cfg.out_hidden, (size_t)((rows - r0) * v->cfg.out_hidden) * sizeof(float)),
          "img2 alone: the same bits as beside img0 (%s kernels)", kname);
    /* refusals */
    int32_t bad[1][3] = {{1, 3, 4}};
    CHECK(st_vision_encode(v, px, (const int32_t(*)[3])bad, 1, solo, &err) == ST_ERR_ARG && strstr(err.msg, "multiples"),
          "a grid of odd height is refused: %s", err.msg);
    free(solo);
    free(px);
    free(out);
    st_vision_free(v);
}

/* the prompt with img0 and img2: positions, logits (every row) and 12 greedy tokens */
static void test_prompt(const char *dir, const st_checkpoint *g) {
    st_error err = {0};
    const st_tensor *ids_t = need(g, "mm.ids"), *pos_t = need(g, "mm.position_ids"), *lg_t = need(g, "mm.logits");
    const st_tensor *gr_t = need(g, "mm.greedy"), *p0 = need(g, "img0.pixel_values"), *p2 = need(g, "img2.pixel_values");
    const st_tensor *g0 = need(g, "img0.grid_thw"), *g2 = need(g, "img2.grid_thw");
    if (!ids_t || !pos_t || !lg_t || !gr_t || !p0 || !p2 || !g0 || !g2) return;
    const int32_t *ids = ids_t->data;
    const int64_t n = ids_t->numel;
    int32_t grid[2][3];
    memcpy(grid[0], g0->data, sizeof grid[0]);
    memcpy(grid[1], g2->data, sizeof grid[1]);
    int32_t(*pos)[3] = malloc((size_t)n * sizeof *pos);
    int64_t next = 0;
    st_status st = st_mrope_positions(ids, n, 1000, (const int32_t(*)[3])grid, 2, 2, pos, &next, &err);
    int same = st == ST_OK;
    const int32_t *want = pos_t->data; /* [3][n] */
    for (int64_t i = 0; same && i < n; i++)
        for (int a = 0; a < 3; a++) same &= pos[i][a] == want[a * n + i];
    CHECK(same, "M-RoPE positions of the %lld-token prompt with 2 images equal the reference's (%s)", (long long)n, err.msg);
    /* refusals: a run one token short, and one image too many */
    int32_t *cut = malloc((size_t)n * sizeof *cut);
    int64_t m = 0;
    int dropped = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] != 1000 || dropped++) cut[m++] = ids[i];
    CHECK(st_mrope_positions(cut, m, 1000, (const int32_t(*)[3])grid, 2, 2, pos, &next, &err) == ST_ERR_ARG &&
              strstr(err.msg, "image 1:"),
          "an image-token run one short of its grid is refused: %s", err.msg);
    CHECK(st_mrope_positions(ids, n, 1000, (const int32_t(*)[3])grid, 1, 2, pos, &next, &err) == ST_ERR_ARG,
          "more image runs than images is refused: %s", err.msg);
    free(cut);
    err.msg[0] = 0;
    st = st_mrope_positions(ids, n, 1000, (const int32_t(*)[3])grid, 2, 2, pos, &next, &err);
    /* the tower's embeddings for both images */
    st_vision_tower *v = NULL;
    st_model *model = NULL;
    st_backend *be = NULL;
    st_fwd *f = NULL;
    float *px = NULL, *emb = NULL, *logits = NULL;
    int64_t *rows = NULL;
    if (!CHECK(st == ST_OK && st_vision_load(dir, NULL, &v, &err) == ST_OK && st_model_load(dir, &model, &err) == ST_OK,
               "tiny-vl's tower and language model load (%s)", err.msg))
        goto out;
    const int64_t D = st_vision_patch_dim(v), n0 = p0->shape[0], n2 = p2->shape[0], H = model->cfg.hidden_size;
    const int64_t ne = (n0 + n2) / 4, V = model->cfg.vocab_size;
    px = malloc((size_t)((n0 + n2) * D) * sizeof(float));
    emb = malloc((size_t)(ne * H) * sizeof(float));
    memcpy(px, p0->data, (size_t)(n0 * D) * sizeof(float));
    memcpy(px + n0 * D, p2->data, (size_t)(n2 * D) * sizeof(float));
    if (!CHECK(st_vision_encode(v, px, (const int32_t(*)[3])grid, 2, emb, &err) == ST_OK && v->cfg.out_hidden == H,
               "the images' %lld embeddings of %lld (%s)", (long long)ne, (long long)H, err.msg))
        goto out;
    rows = malloc((size_t)ne * sizeof *rows);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == 1000 && k < ne) rows[k++] = i;
    st_ctx_params xp = {.max_tokens = 64, .n_slots = 1, .n_snapshots = 0, .n_blocks = 8, .block_size = 16,
                        .max_seq_len = 128, .kv_dtype = ST_KV_F32};
    be = kit_backend(model, NULL, &err);
    if (!CHECK(be && st_fwd_create(be, &xp, &f, &err) == ST_OK, "a CPU forward context (%s)", err.msg)) goto out;
    st_plan_buf *pb = st_fwd_plan_buf(f);
    const int32_t blocks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    logits = malloc((size_t)(n * V) * sizeof(float));
    st_plan_reset(pb);
    st_plan_add(pb, ids, (int)n, 0, 0, blocks, 8, ST_LOGITS_ALL, &err);
    pb->plan.mrope = &pos[0][0];
    pb->plan.n_embeds = ne;
    pb->plan.embed_rows = rows;
    const float **rowp = malloc((size_t)ne * sizeof *rowp);
    for (int64_t i = 0; i < ne; i++) rowp[i] = emb + i * H;
    pb->plan.embeds = rowp;
    CHECK(st_fwd_run(f, &pb->plan, logits, &err) == ST_ERR_ARG && strstr(err.msg, "takes none"),
          "a plan with embeddings on a context that takes none is refused: %s", err.msg);
    err.msg[0] = 0;
    st = st_fwd_enable_embeds(f, &err);
    if (st == ST_OK) st = st_fwd_run(f, &pb->plan, logits, &err);
    const double e = st == ST_OK ? rel_err(logits, lg_t->data, n * V) : INFINITY;
    CHECK(st == ST_OK && e < 1e-3, "the prompt's logits at all %lld positions within 1e-3 (max rel err %.2e) %s",
          (long long)n, e, err.msg);
    /* greedy: 12 tokens, each decoded at next + i on all three axes */
    const int32_t *gw = gr_t->data;
    int32_t tok = 0, got[64];
    int ng = 0;
    const float *last = logits + (n - 1) * V;
    for (int64_t j = 1; j < V; j++) tok = last[j] > last[tok] ? (int32_t)j : tok;
    for (; ng < gr_t->numel && st == ST_OK; ng++) {
        got[ng] = tok;
        const int32_t p3[3] = {(int32_t)(next + ng), (int32_t)(next + ng), (int32_t)(next + ng)};
        st_plan_reset(pb);
        st_plan_add(pb, &tok, 1, n + ng, 0, blocks, 8, ST_LOGITS_LAST, &err);
        pb->plan.mrope = p3;
        if ((st = st_fwd_run(f, &pb->plan, logits, &err)) != ST_OK) break;
        tok = 0;
        for (int64_t j = 1; j < V; j++) tok = logits[j] > logits[tok] ? (int32_t)j : tok;
    }
    CHECK(st == ST_OK && ng == gr_t->numel && !memcmp(got, gw, (size_t)ng * sizeof *got),
          "%d greedy tokens after the prompt equal the reference's (%s)", ng, err.msg);
    free(rowp);
out:
    free(pos);
    free(px);
    free(emb);
    free(rows);
    free(logits);
    st_fwd_destroy(f);
    st_backend_destroy(be);
    st_model_free(model);
    st_vision_free(v);
}

/* img0's pixels written again as a JPEG (other pixels, the same size) */
static char *jpeg_of_png(const char *png, size_t len, size_t *out_len) {
    uint8_t *rgb = NULL;
    int64_t w = 0, h = 0;
    if (st_image_decode(png, len, NULL, &rgb, &w, &h, NULL) != ST_OK) return NULL;
    unsigned long jl = 0;
    unsigned char *jpg = test_jpeg(rgb, (int)w, (int)h, 60, 0, &jl);
    free(rgb);
    *out_len = jl;
    return (char *)jpg;
}

/* tiny-vl's img0 and img2 (their bytes, to free), its tower, processor and model */
static int open_vl(const char *dir, char *img[2], size_t len[2], st_vision_tower **v, st_vision_pp *pp, st_model **model,
                   st_error *err) {
    char path[2][600];
    snprintf(path[0], sizeof path[0], "%s/images/img0.png", dir);
    snprintf(path[1], sizeof path[1], "%s/images/img2.png", dir);
    return st_file_read(path[0], 1 << 20, &img[0], &len[0], err) == ST_OK &&
           st_file_read(path[1], 1 << 20, &img[1], &len[1], err) == ST_OK && st_vision_load(dir, NULL, v, err) == ST_OK &&
           st_vision_pp_load(dir, pp, err) == ST_OK && st_model_load(dir, model, err) == ST_OK;
}

/* the same prompt from the PNG files, through st_vision_prompt_build (decode, preprocess,
 * tower, positions) and st_batch_run_images */
static void test_prompt_files(const char *dir, const st_checkpoint *g) {
    st_error err = {0};
    const st_tensor *ids_t = need(g, "mm.ids"), *lg_t = need(g, "mm.logits");
    if (!ids_t || !lg_t) return;
    const int32_t *ids = ids_t->data;
    const int n = (int)ids_t->numel;
    char *img[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    st_vision_tower *v = NULL;
    st_vision_pp pp;
    st_vision_prompt vp = {0};
    st_model *model = NULL;
    st_backend *be = NULL;
    st_cache *cache = NULL;
    st_fwd *f = NULL;
    float *logits = NULL;
    int64_t tok0 = 0;
    int ok = open_vl(dir, img, len, &v, &pp, &model, &err) &&
             st_vision_image_tokens(img[0], len[0], &pp, NULL, &tok0, &err) == ST_OK;
    if (!CHECK(ok && tok0 == 4, "img0.png takes %lld image tokens (4) (%s)", (long long)tok0, err.msg)) goto out;
    ok = st_vision_prompt_build(v, &pp, model->cfg.image_token_id, ids, n, (const void *const *)img, len, 2, NULL, &vp,
                                &err) == ST_OK;
    if (!CHECK(ok && vp.n_rows == 9, "the prompt's image parts from the PNG files: %lld rows (%s)", (long long)vp.n_rows,
               err.msg))
        goto out;
    st_cache_params cp = st_cache_default_params();
    cp.max_seq_len = 64;
    st_seq seq = {.slot = -1};
    be = kit_backend(model, NULL, &err);
    ok = be && st_cache_create(model, &cp, &cache, &err) == ST_OK;
    st_ctx_params xp = ok ? st_cache_ctx_params(cache, 64) : (st_ctx_params){0};
    ok = ok && st_fwd_create(be, &xp, &f, &err) == ST_OK && st_fwd_enable_embeds(f, &err) == ST_OK &&
         st_cache_seq_start(cache, &seq, &err) == ST_OK;
    const int64_t V = model->cfg.vocab_size;
    logits = malloc((size_t)(n * V) * sizeof(float));
    st_batch_item it = {&seq, ids, n, ST_LOGITS_ALL};
    const float **rowp = malloc((size_t)(vp.n_rows + 1) * sizeof *rowp);
    for (int64_t i = 0; i < vp.n_rows; i++) rowp[i] = vp.embeds + i * model->cfg.hidden_size;
    const st_batch_images im = {&vp.mrope[0][0], vp.n_rows, vp.rows, rowp, NULL};
    ok = ok && st_batch_run_images(cache, f, &it, 1, &im, logits, &err) == ST_OK;
    free(rowp);
    const double e = ok ? rel_err(logits, lg_t->data, n * V) : INFINITY;
    CHECK(ok && e < 1e-3, "from the files: the prompt's logits within 1e-3 of the reference (max rel err %.2e) %s", e,
          err.msg);
out:
    free(img[0]);
    free(img[1]);
    free(logits);
    st_vision_prompt_free(&vp);
    st_fwd_destroy(f);
    st_cache_destroy(cache);
    st_backend_destroy(be);
    st_model_free(model);
    st_vision_free(v);
}

/* through the scheduler: the image prompt (prefix cache on) beside a text request, greedy */
typedef struct sched_out {
    int32_t ids[64];
    int n, done;
    int64_t cached;
    st_finish_reason finish;
} sched_out;

static int on_sched_event(void *user, const st_event *ev) {
    sched_out *o = user;
    if (ev->kind == ST_EV_TOKEN && o->n < 64) o->ids[o->n++] = ev->token;
    if (ev->kind == ST_EV_DONE) o->done = 1, o->finish = ev->finish, o->cached = ev->usage.cached_tokens;
    return ST_EV_CONTINUE;
}

static void test_sched(const char *dir, const st_checkpoint *g) {
    st_error err = {0};
    const st_tensor *ids_t = need(g, "mm.ids"), *gr_t = need(g, "mm.greedy"), *tid_t = need(g, "text.ids");
    const st_tensor *tlg_t = need(g, "text.logits");
    if (!ids_t || !gr_t || !tid_t || !tlg_t) return;
    char *img[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    st_vision_tower *v = NULL;
    st_vision_pp pp;
    st_vision_prompt vp = {0};
    st_model *model = NULL;
    st_sched *s = NULL, *plain = NULL;
    int ok = open_vl(dir, img, len, &v, &pp, &model, &err) &&
             st_vision_prompt_build(v, &pp, model->cfg.image_token_id, ids_t->data, ids_t->numel, (const void *const *)img,
                                    len, 2, NULL, &vp, &err) == ST_OK;
    if (!CHECK(ok, "the image prompt for the scheduler (%s)", err.msg)) goto out;
    st_sched_params sp = st_sched_default_params();
    sp.max_seqs = 2;
    sp.ctx = 256;
    sp.prefix_cache = 1;
    sp.images = 1;
    ok = st_sched_create(model, NULL, &sp, &s, &err) == ST_OK;
    if (!CHECK(ok, "a scheduler that takes images, prefix cache on (%s)", err.msg)) goto out;
    const st_req_images im = {(const int32_t(*)[3])vp.mrope, vp.next, vp.n_rows, vp.rows, vp.embeds, NULL};
    st_req_params rp = st_req_default_params();
    rp.max_tokens = gr_t->numel;
    rp.sampling.temperature = 0;
    rp.ignore_eos = 1;
    sched_out a = {0}, b = {0}, c = {0};
    st_req_params ri = rp;
    ri.images = &im;
    ok = st_sched_submit(s, ids_t->data, ids_t->numel, &ri, on_sched_event, &a, NULL, &err) == ST_OK &&
         st_sched_submit(s, tid_t->data, tid_t->numel, &rp, on_sched_event, &b, NULL, &err) == ST_OK;
    while (ok && st_sched_step(s) > 0) {
    }
    /* the text request's first token: the reference's argmax */
    const float *tl = (const float *)tlg_t->data + (tid_t->numel - 1) * tlg_t->shape[1];
    int32_t arg = 0;
    for (int64_t j = 1; j < tlg_t->shape[1]; j++) arg = tl[j] > tl[arg] ? (int32_t)j : arg;
    CHECK(ok && a.done && a.n == gr_t->numel && !memcmp(a.ids, gr_t->data, (size_t)a.n * sizeof *a.ids),
          "the image prompt through the scheduler, beside a text request: the reference's %d greedy tokens (%s)", a.n,
          err.msg);
    CHECK(b.done && b.n == gr_t->numel && b.ids[0] == arg, "the text request beside it: its first token is the "
                                                           "reference's argmax (%d)", arg);
    const st_cache *cache = st_sched_cache(s);
    st_sched_stats stt;
    st_sched_get_stats(s, &stt);
    CHECK(cache->n_cached_blocks <= (int64_t)((tid_t->numel + gr_t->numel) / cache->p.block_size) &&
              stt.prefix.lookups == 1,
          "without keys, the image prompt neither looked up nor left blocks in the prefix cache (%lld lookups, %d "
          "blocks cached)",
          (long long)stt.prefix.lookups, (int)cache->n_cached_blocks);
    /* with its keys (its image rows by their pixels): the same prompt again resumes from the
     * cache and gives the same tokens; the same ids without the images, or with another
     * image of the same size, do not */
    {
        const st_req_images ik = {(const int32_t(*)[3])vp.mrope, vp.next, vp.n_rows, vp.rows, vp.embeds, vp.keys};
        st_req_params rk = rp;
        rk.images = &ik;
        sched_out k1 = {0}, k2 = {0}, k3 = {0}, k4 = {0};
        int okk = st_sched_submit(s, ids_t->data, ids_t->numel, &rk, on_sched_event, &k1, NULL, &err) == ST_OK;
        while (okk && st_sched_step(s) > 0) {
        }
        okk = okk && st_sched_submit(s, ids_t->data, ids_t->numel, &rk, on_sched_event, &k2, NULL, &err) == ST_OK;
        while (okk && st_sched_step(s) > 0) {
        }
        CHECK(okk && k1.done && k2.done && k1.cached == 0 && k2.cached == 16 && k2.n == k1.n &&
                  !memcmp(k2.ids, gr_t->data, (size_t)k2.n * sizeof *k2.ids),
              "with its image keys, the prompt again resumes 16 of its %lld positions from the cache and gives the "
              "reference's tokens (cached %lld then %lld) %s",
              (long long)ids_t->numel, (long long)k1.cached, (long long)k2.cached, err.msg);
        okk = st_sched_submit(s, ids_t->data, ids_t->numel, &rp, on_sched_event, &k3, NULL, &err) == ST_OK;
        while (okk && st_sched_step(s) > 0) {
        }
        size_t jl = 0;
        char *jpg = jpeg_of_png(img[0], len[0], &jl), *other[2] = {jpg, img[1]};
        size_t olen[2] = {jl, len[1]};
        st_vision_prompt vo = {0};
        okk = jpg && st_vision_prompt_build(v, &pp, model->cfg.image_token_id, ids_t->data, ids_t->numel,
                                            (const void *const *)other, olen, 2, NULL, &vo, &err) == ST_OK;
        const st_req_images io = {(const int32_t(*)[3])vo.mrope, vo.next, vo.n_rows, vo.rows, vo.embeds, vo.keys};
        st_req_params ro = rp;
        ro.images = &io;
        okk = okk && st_sched_submit(s, ids_t->data, ids_t->numel, &ro, on_sched_event, &k4, NULL, &err) == ST_OK;
        while (okk && st_sched_step(s) > 0) {
        }
        CHECK(k3.done && k3.cached == 0 && okk && k4.done && k4.cached == 0,
              "the same ids as text, or with img0 re-encoded (other pixels, same size), take nothing from the "
              "image prompt's blocks (cached %lld, %lld) %s",
              (long long)k3.cached, (long long)k4.cached, err.msg);
        st_vision_prompt_free(&vo);
        free(jpg);
    }
    /* a scheduler made without images refuses them */
    sp.images = 0;
    ok = st_sched_create(model, NULL, &sp, &plain, &err) == ST_OK;
    CHECK(ok && st_sched_submit(plain, ids_t->data, ids_t->numel, &ri, on_sched_event, &c, NULL, &err) == ST_ERR_ARG &&
              strstr(err.msg, "without images"),
          "a scheduler made without images refuses an image prompt: %s", err.msg);
out:
    free(img[0]);
    free(img[1]);
    st_sched_destroy(s);
    st_sched_destroy(plain);
    st_vision_prompt_free(&vp);
    st_model_free(model);
    st_vision_free(v);
}

int main(void) {
    char dir[512], gpath[600], other[512];
    snprintf(dir, sizeof dir, "%s/fixtures/tiny-vl", tap_data_dir());
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    snprintf(other, sizeof other, "%s/fixtures/tiny-a", tap_data_dir());
    st_error err = {0};
    st_checkpoint *g = NULL;
    if (CHECK(st_checkpoint_open(gpath, &g, &err) == ST_OK, "tiny-vl goldens open (%s)", err.msg)) {
        test_embeds(dir, g, st_kernels_ref(), "ref", 0);
        const st_kernels *best = st_kernels_best();
        test_embeds(dir, g, best, best->name, 0);
        char why[400];
        if (st_cuda_available(NULL, why, sizeof why)) test_embeds(dir, g, best, "cuda", 1);
        else CHECK(1, "the tower on the GPU skipped: no CUDA backend here (%.300s)", why);
        test_prompt(dir, g);
        test_prompt_files(dir, g);
        test_sched(dir, g);
        st_checkpoint_close(g);
    }
    st_vision_tower *v = NULL;
    CHECK(st_vision_load(other, NULL, &v, &err) == ST_ERR_MISSING && v == NULL && strstr(err.msg, "vision_config"),
          "a text-only checkpoint: no tower, and the error says so: %s", err.msg);
    return tap_done();
}
