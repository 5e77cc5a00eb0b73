/* ==== strand quantize: round trips ====
 * For every bit width and group size, tiny-a (untied head) converts and loads; every
 * quantized matrix holds exactly what the quantizer makes of the source rows (words, scales
 * and biases compared bit for bit, each value within half a step or clipped to the grid's
 * edge), the norms are bf16(1 + w), the other tensors byte-identical, config.json says what
 * mlx-lm reads. The 8-bit conversion runs the fixtures' as-stored prompts close to the
 * reference's own MLX file. MoE (experts stacked, routers at 8 bits), ConditionalGeneration
 * (no vision weights left), a tied head, shards, the mixed recipe, thread-count independence
 * and refusals. The MSE quantizer is never worse than min-max or MLX's rule for a row. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "core/numeric.h"
#include "golden.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "kit.h"
#include "tap.h"

static char tmp[256];

static const char *fixture(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/fixtures/%s", tap_data_dir(), name);
    return p;
}

static st_status convert(const char *in, const char *out, int bits, int group, int mixed, int threads, int64_t shard,
                         st_error *err) {
    st_quantize_params p = st_quantize_default_params();
    p.bits = bits;
    p.group_size = group;
    p.mixed = mixed;
    p.n_threads = threads;
    p.shard_bytes = shard;
    st_quantize_stats s;
    return st_quantize_checkpoint(in, out, &p, &s, err);
}

static float elem(const st_tensor *t, int64_t i) {
    if (t->dtype == ST_DTYPE_BF16) return st_bf16_to_f32(((const uint16_t *)t->data)[i]);
    if (t->dtype == ST_DTYPE_F16) return st_f16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

/* the output of one HF tensor checked against the input; returns 1 when right */
static int check_matrix(const st_checkpoint *in, const st_checkpoint *out, const char *hf, const char *module, int bits,
                        int group, double *worst_step) {
    char n[400];
    const st_tensor *src = st_checkpoint_find(in, hf);
    snprintf(n, sizeof n, "%s.weight", module);
    const st_tensor *w = st_checkpoint_find(out, n);
    snprintf(n, sizeof n, "%s.scales", module);
    const st_tensor *sc = st_checkpoint_find(out, n);
    snprintf(n, sizeof n, "%s.biases", module);
    const st_tensor *bi = st_checkpoint_find(out, n);
    if (!src || !w || !sc || !bi || w->dtype != ST_DTYPE_U32 || sc->dtype != ST_DTYPE_BF16) {
        printf("# %s: missing or wrong dtype\n", module);
        return 0;
    }
    int64_t rows = src->shape[0], cols = src->shape[1], words = cols * bits / 32, ng = cols / group;
    if (w->shape[0] != rows || w->shape[1] != words || sc->shape[1] != ng) return 0;
    float row[4096], deq[4096];
    uint32_t pk[4096];
    uint16_t s[256], b[256];
    st_quant_method m = bits == 8 ? ST_QUANT_MINMAX : ST_QUANT_MSE; /* the default, auto */
    st_matrix mat = {ST_WFMT_AFFINE, rows, cols, w->data, sc->data, bi->data, ST_DTYPE_BF16, bits, group, 0, NULL, 0};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols; j++) row[j] = elem(src, r * cols + j);
        st_affine_quantize_row_as(row, cols, bits, group, m, pk, s, b);
        if (memcmp(pk, (const uint32_t *)w->data + r * words, (size_t)words * 4) ||
            memcmp(s, (const uint16_t *)sc->data + r * ng, (size_t)ng * 2) ||
            memcmp(b, (const uint16_t *)bi->data + r * ng, (size_t)ng * 2)) {
            printf("# %s row %lld differs from the quantizer's\n", module, (long long)r);
            return 0;
        }
        st_matrix_row_f32(&mat, r, deq);
        for (int64_t j = 0; j < cols; j++) {
            float step = fabsf(st_bf16_to_f32(s[j / group]));
            float lo = st_bf16_to_f32(b[j / group]), hi = lo + st_bf16_to_f32(s[j / group]) * (float)((1 << bits) - 1);
            float edge_lo = lo < hi ? lo : hi, edge_hi = lo < hi ? hi : lo;
            double d = fabs((double)deq[j] - (double)row[j]);
            int clipped = row[j] < edge_lo || row[j] > edge_hi;
            if (!clipped && step > 0 && d / step > *worst_step) *worst_step = d / step;
        }
    }
    return 1;
}

static json_t *load_json(const char *dir, const char *file) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    json_error_t je;
    return json_load_file(p, 0, &je);
}

/* tiny-a at every width and group size */
static void test_widths(void) {
    static const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    st_checkpoint *in = NULL;
    st_error err = {0};
    if (!CHECK(st_checkpoint_open(fixture("tiny-a"), &in, &err) == ST_OK, "tiny-a opens")) return;
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++) {
            char out[512];
            snprintf(out, sizeof out, "%s/a-q%d-g%d", tmp, bits[bi], groups[gi]);
            st_model *m = NULL;
            st_checkpoint *o = NULL;
            int ok = convert(fixture("tiny-a"), out, bits[bi], groups[gi], 0, 2, 0, &err) == ST_OK &&
                     st_model_load(out, &m, &err) == ST_OK && st_checkpoint_open(out, &o, &err) == ST_OK;
            if (!CHECK(ok, "q%d group %d: converts and loads (%s)", bits[bi], groups[gi], err.msg)) {
                st_model_free(m);
                st_checkpoint_close(o);
                continue;
            }
            double worst = 0;
            int mats = 0, good = 1;
            /* tiny-a's widths are 64 (hidden) and 128: a group of 128 leaves the 64-wide inputs dense */
            for (int i = 0; i < in->n_tensors; i++) {
                const st_tensor *t = st_checkpoint_tensor(in, i);
                const char *rest = strncmp(t->name, "model.", 6) ? NULL : t->name + 6;
                char module[400];
                int is_matrix = t->n_dims == 2; /* every 2-D tensor of tiny-a is a Linear or the embedding */
                if (!strcmp(t->name, "lm_head.weight")) snprintf(module, sizeof module, "language_model.lm_head");
                else if (rest) snprintf(module, sizeof module, "language_model.model.%.*s", (int)(strlen(rest) - 7), rest);
                else continue;
                if (!is_matrix || strstr(t->name, "conv1d")) continue;
                if (t->shape[1] % groups[gi]) {
                    char n[420];
                    snprintf(n, sizeof n, "%s.weight", module);
                    const st_tensor *d = st_checkpoint_find(o, n);
                    good &= d && d->dtype == ST_DTYPE_BF16 && d->nbytes == t->nbytes && !memcmp(d->data, t->data, t->nbytes);
                    continue;
                }
                good &= check_matrix(in, o, t->name, module, bits[bi], groups[gi], &worst);
                mats++;
            }
            CHECK(good && mats > 0 && worst <= 0.5 + 1e-6,
                  "q%d group %d: %d matrices hold exactly the quantizer's words, scales and biases; every value "
                  "within %.3f steps of its source (half a step at most); matrices too narrow for the group stay bf16",
                  bits[bi], groups[gi], mats, worst);
            if (bi == 2 && gi == 1) { /* once: the other tensors and config.json */
                int same = 1, norms = 1, n_norm = 0;
                for (int i = 0; i < in->n_tensors; i++) {
                    const st_tensor *t = st_checkpoint_tensor(in, i);
                    char n[420];
                    snprintf(n, sizeof n, "language_model.%s", t->name);
                    const st_tensor *d = st_checkpoint_find(o, n);
                    if (strstr(t->name, "layernorm") || !strcmp(t->name, "model.norm.weight") || strstr(t->name, "q_norm") ||
                        strstr(t->name, "k_norm")) {
                        n_norm++;
                        for (int64_t k = 0; d && k < t->numel; k++)
                            norms &= ((const uint16_t *)d->data)[k] == st_f32_to_bf16(elem(t, k) + 1.0f);
                        norms &= d != NULL;
                    } else if (strstr(t->name, "A_log") || strstr(t->name, "dt_bias") || strstr(t->name, "conv1d") ||
                               strstr(t->name, "linear_attn.norm")) {
                        same &= d && d->nbytes == t->nbytes && !memcmp(d->data, t->data, t->nbytes) &&
                                (strstr(t->name, "conv1d") ? d->shape[1] == t->shape[2] && d->shape[2] == 1
                                                            : d->dtype == t->dtype);
                    }
                }
                CHECK(norms && n_norm > 0, "the %d residual, final and q/k norms are stored as bf16(1 + w)", n_norm);
                CHECK(same, "A_log, dt_bias, linear_attn.norm and conv1d are byte-identical (conv [C,1,K] -> [C,K,1])");
                json_t *c = load_json(out, "config.json"), *q = json_object_get(c, "quantization");
                CHECK(json_integer_value(json_object_get(q, "bits")) == 4 &&
                          json_integer_value(json_object_get(q, "group_size")) == 64 &&
                          !strcmp(json_string_value(json_object_get(q, "mode")), "affine") &&
                          json_equal(q, json_object_get(c, "quantization_config")) &&
                          !strcmp(json_string_value(json_object_get(c, "model_type")), "qwen3_5"),
                      "config.json: quantization {bits 4, group_size 64, mode affine} and its copy "
                      "quantization_config, model_type qwen3_5 (mlx-lm's module)");
                json_decref(c);
                json_t *ix = load_json(out, "model.safetensors.index.json");
                CHECK(json_object_size(json_object_get(ix, "weight_map")) == (size_t)o->n_tensors &&
                          !strcmp(st_checkpoint_format(o), "mlx"),
                      "model.safetensors.index.json maps all %d tensors; __metadata__ format mlx", o->n_tensors);
                json_decref(ix);
            }
            st_checkpoint_close(o);
            st_model_free(m);
        }
    st_checkpoint_close(in);
}

/* the 8-bit conversion against the reference's own 8-bit MLX file (min-max groups, the same
 * bf16(1+w) norms): the same tensors, the same scales and biases, the same levels but for
 * rounding ties (a level apart at most), and the logits the reference got from its file */
static void test_against_reference_file(void) {
    char out[512], path[512];
    snprintf(out, sizeof out, "%s/a-q8-g64", tmp);
    snprintf(path, sizeof path, "%s/golden.safetensors", fixture("tiny-a/mlx-q8"));
    st_model *m = NULL;
    st_checkpoint *g = NULL, *mine = NULL, *ref = NULL;
    st_error err = {0};
    if (!CHECK(st_model_load(out, &m, &err) == ST_OK && st_checkpoint_open(path, &g, &err) == ST_OK &&
                   st_checkpoint_open(out, &mine, &err) == ST_OK && st_checkpoint_open(fixture("tiny-a/mlx-q8"), &ref, &err) == ST_OK,
               "the 8-bit tiny-a, the reference's own 8-bit file and its goldens (%s)", err.msg))
        return;
    int64_t n_q = 0, same_q = 0, n_s = 0, same_s = 0, worst_dq = 0;
    int n_other = 0, same_other = 0;
    int names_match = mine->n_tensors == ref->n_tensors;
    for (int i = 0; i < ref->n_tensors; i++) {
        const st_tensor *r = st_checkpoint_tensor(ref, i), *t = st_checkpoint_find(mine, r->name);
        if (!t || t->dtype != r->dtype || t->n_dims != r->n_dims || t->nbytes != r->nbytes) {
            names_match = 0;
            continue;
        }
        if (r->dtype == ST_DTYPE_U32) {
            for (int64_t k = 0; k < r->numel * 4; k++) {
                int a = ((const uint8_t *)t->data)[k], b = ((const uint8_t *)r->data)[k];
                same_q += a == b;
                if (abs(a - b) > worst_dq) worst_dq = abs(a - b);
                n_q++;
            }
        } else if (strstr(r->name, ".scales") || strstr(r->name, ".biases")) {
            for (int64_t k = 0; k < r->numel; k++) same_s += ((const uint16_t *)t->data)[k] == ((const uint16_t *)r->data)[k];
            n_s += r->numel;
        } else {
            n_other++;
            same_other += !memcmp(t->data, r->data, r->nbytes);
        }
    }
    CHECK(names_match && same_s == n_s && worst_dq <= 1 && (double)same_q > 0.99 * (double)n_q && n_other > 0 &&
              same_other == n_other,
          "8-bit tiny-a next to the reference's own 8-bit MLX file: the same %d tensors, the %d unquantized ones "
          "byte-identical, every scale and bias equal, %.3f%% of the levels equal, the rest one apart",
          ref->n_tensors, n_other, 100.0 * (double)same_q / (double)(n_q ? n_q : 1));
    double worst = 0;
    for (int p = 0; p < 2; p++) {
        char key[40];
        snprintf(key, sizeof key, "p%d.ids", p);
        const st_tensor *ti = golden_get(g, key, ST_DTYPE_I32);
        snprintf(key, sizeof key, "p%d.logits_as_stored", p);
        const st_tensor *tl = golden_get(g, key, ST_DTYPE_F32);
        if (!ti || !tl) continue;
        st_cache_params cp = st_cache_default_params();
        cp.max_seq_len = ti->numel;
        st_cache *c = NULL;
        st_fwd *f = NULL;
    st_backend *kbe = NULL;
        float *lg = malloc((size_t)ti->numel * (size_t)m->cfg.vocab_size * sizeof *lg);
        st_seq seq = {.slot = -1};
        if (st_cache_create(m, &cp, &c, &err) == ST_OK && kit_fwd_new(m, c, (int)ti->numel, &kbe, &f, &err) == ST_OK &&
            st_cache_seq_start(c, &seq, &err) == ST_OK) {
            st_batch_item it = {&seq, ti->data, (int)ti->numel, ST_LOGITS_ALL};
            if (st_batch_run(c, f, &it, 1, lg, &err) == ST_OK) {
                double e = rel_rows_err(lg, tl->data, ti->numel, m->cfg.vocab_size);
                if (e > worst) worst = e;
            }
        }
        st_fwd_destroy(f);
    st_backend_destroy(kbe);
        st_cache_destroy(c);
        free(lg);
    }
    printf("# its logits vs the reference's run of its own file: max rel err %.2e (random weights amplify the ties)\n", worst);
    st_checkpoint_close(ref);
    st_checkpoint_close(mine);
    st_checkpoint_close(g);
    st_model_free(m);
}

static void test_layouts(void) {
    st_error err = {0};
    char out[512];
    /* MoE */
    snprintf(out, sizeof out, "%s/moe-q4", tmp);
    st_model *m = NULL;
    st_checkpoint *o = NULL;
    int ok = convert(fixture("tiny-moe"), out, 4, 64, 0, 2, 0, &err) == ST_OK && st_model_load(out, &m, &err) == ST_OK &&
             st_checkpoint_open(out, &o, &err) == ST_OK;
    if (CHECK(ok, "tiny-moe converts and loads (%s)", err.msg)) {
        const st_tensor *g = st_checkpoint_find(o, "language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight");
        const st_tensor *r = st_checkpoint_find(o, "language_model.model.layers.0.mlp.gate.weight");
        json_t *c = load_json(out, "config.json");
        json_t *ov = json_object_get(json_object_get(c, "quantization"), "language_model.model.layers.0.mlp.gate");
        CHECK(g && g->n_dims == 3 && g->shape[0] == m->cfg.n_experts && r && r->dtype == ST_DTYPE_U32 &&
                  json_integer_value(json_object_get(ov, "bits")) == 8 && m->cfg.quant_bits == 4,
              "experts stacked as switch_mlp [E, out, in]; the router at 8 bits, recorded per module");
        json_decref(c);
    }
    st_checkpoint_close(o);
    st_model_free(m);
    /* ConditionalGeneration, text only */
    snprintf(out, sizeof out, "%s/vl-q8", tmp);
    m = NULL;
    o = NULL;
    ok = convert(fixture("tiny-vl"), out, 8, 64, 0, 1, 0, &err) == ST_OK && st_model_load(out, &m, &err) == ST_OK &&
         st_checkpoint_open(out, &o, &err) == ST_OK;
    if (CHECK(ok, "tiny-vl (ConditionalGeneration) converts and loads (%s)", err.msg)) {
        int vision = 0;
        for (int i = 0; i < o->n_tensors; i++) vision += strstr(st_checkpoint_tensor(o, i)->name, "visual") != NULL;
        json_t *c = load_json(out, "config.json");
        CHECK(!vision && !json_object_get(c, "vision_config") && json_is_object(json_object_get(c, "text_config")),
              "no vision weights and no vision_config are left; text_config stays");
        json_decref(c);
    }
    st_checkpoint_close(o);
    st_model_free(m);
    /* tied head, shards, mixed, threads */
    char out1[512], out3[512];
    snprintf(out1, sizeof out1, "%s/b-t1", tmp);
    snprintf(out3, sizeof out3, "%s/b-t3", tmp);
    m = NULL;
    ok = convert(fixture("tiny-b"), out1, 3, 64, 1, 1, 1 << 20, &err) == ST_OK &&
         convert(fixture("tiny-b"), out3, 3, 64, 1, 3, 1 << 20, &err) == ST_OK && st_model_load(out1, &m, &err) == ST_OK;
    if (CHECK(ok, "tiny-b (tied head) converts in 1 MiB shards with the mixed recipe and loads (%s)", err.msg)) {
        o = NULL;
        st_checkpoint_open(out1, &o, &err);
        json_t *c = load_json(out1, "config.json"), *q = json_object_get(c, "quantization");
        int n_high = 0;
        const char *k;
        json_t *v;
        json_object_foreach(q, k, v) n_high += json_is_object(v) && json_integer_value(json_object_get(v, "bits")) == 6;
        CHECK(o && o->n_files > 1 && !st_checkpoint_find(o, "language_model.lm_head.weight") && n_high > 0,
              "%d shards; no lm_head (tied); %d v_proj/down_proj modules at 6 bits by the mixed recipe", o ? o->n_files : 0,
              n_high);
        json_decref(c);
        int same = 1;
        for (int s = 1; s <= (o ? o->n_files : 0); s++) {
            char a[600], b[600];
            char *da = NULL, *db = NULL;
            size_t la = 0, lb = 0;
            snprintf(a, sizeof a, "%s/model-%05d-of-%05d.safetensors", out1, s, o->n_files);
            snprintf(b, sizeof b, "%s/model-%05d-of-%05d.safetensors", out3, s, o->n_files);
            same &= st_file_read(a, 1 << 26, &da, &la, &err) == ST_OK && st_file_read(b, 1 << 26, &db, &lb, &err) == ST_OK &&
                    la == lb && !memcmp(da, db, la);
            free(da);
            free(db);
        }
        CHECK(same, "1 and 3 threads write the same bytes");
        st_checkpoint_close(o);
    }
    st_model_free(m);
    /* a sharded Hugging Face input */
    char sharded[512], sout[512];
    snprintf(sharded, sizeof sharded, "%s/sharded-hf", tmp);
    snprintf(sout, sizeof sout, "%s/sharded-q6", tmp);
    st_synth_params sp = st_synth_default_params();
    sp.preset = "tiny";
    sp.shard_bytes = 2 << 20;
    st_checkpoint *sin = NULL;
    m = NULL;
    ok = st_synth_write(&sp, sharded, &err) == ST_OK && st_checkpoint_open(sharded, &sin, &err) == ST_OK && sin->n_files > 1 &&
         convert(sharded, sout, 6, 32, 0, 2, 0, &err) == ST_OK && st_model_load(sout, &m, &err) == ST_OK;
    CHECK(ok && m->cfg.quant_bits == 6 && m->cfg.quant_group_size == 32,
          "a Hugging Face checkpoint in %d shards converts (6-bit, group 32) and loads (%s)", sin ? sin->n_files : 0, err.msg);
    st_checkpoint_close(sin);
    st_model_free(m);
    /* refusals */
    CHECK(convert(out, "x", 4, 64, 0, 1, 0, &err) == ST_ERR_ARG && strstr(err.msg, "quantized already"),
          "an MLX checkpoint is refused as input: %s", err.msg);
    CHECK(convert(fixture("tiny-a"), fixture("tiny-a"), 4, 64, 0, 1, 0, &err) == ST_ERR_ARG,
          "writing over the input is refused: %s", err.msg);
    CHECK(convert(fixture("tiny-a"), out, 7, 64, 0, 1, 0, &err) == ST_ERR_ARG &&
              convert(fixture("tiny-a"), out, 4, 48, 0, 1, 0, &err) == ST_ERR_ARG,
          "7 bits and groups of 48 are refused: %s", err.msg);
}

/* the quantizer on random rows: MSE never loses to min-max or MLX's rule */
static void test_methods(void) {
    uint64_t x = 12345;
    float row[256];
    uint32_t pk[256];
    uint16_t s[8], b[8];
    int ok = 1, better = 0, rows = 0;
    for (int it = 0; it < 600; it++) {
        int bits = (int[]){2, 3, 4, 5, 6, 8}[it % 6], group = (int[]){32, 64, 128}[(it / 6) % 3];
        for (int j = 0; j < 256; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            double u = (double)(x >> 11) / 9007199254740992.0;
            row[j] = (float)(it % 4 == 0 ? tan(3.0 * (u - 0.5)) : u - 0.3); /* heavy tails, and offsets */
        }
        double e_mse = st_affine_quantize_row_as(row, 256, bits, group, ST_QUANT_MSE, pk, s, b);
        double e_mm = st_affine_quantize_row_as(row, 256, bits, group, ST_QUANT_MINMAX, pk, s, b);
        double e_mlx = st_affine_quantize_row_as(row, 256, bits, group, ST_QUANT_MLX, pk, s, b);
        ok &= e_mse <= e_mm * (1 + 1e-12) && e_mse <= e_mlx * (1 + 1e-12);
        better += e_mse < 0.9 * e_mm;
        rows++;
    }
    CHECK(ok && better > rows / 4, "MSE groups: never a larger squared error than min-max or MLX's rule on %d random rows "
                                   "(10%% smaller or more on %d)", rows, better);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/strand-quant-XXXXXX");
    if (!CHECK(mkdtemp(tmp) != NULL, "temp dir")) return tap_done();
    test_methods();
    test_widths();
    test_against_reference_file();
    test_layouts();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) printf("# cleanup failed\n");
    return tap_done();
}
