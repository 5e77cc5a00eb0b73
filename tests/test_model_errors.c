/* ==== Bad checkpoints get clear errors ====
 * Each case writes a damaged copy of a fixture checkpoint and checks that loading fails
 * with the right status and a message naming the file and the tensor or field at fault. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "model/model.h"
#include "tap.h"

static char tmp[256];

typedef struct copy_ctx {
    const st_checkpoint *src;
    st_sf_entry *e;
    const st_tensor **from; /* source tensor per entry, NULL = zeros */
} copy_ctx;

static st_status fill_copy(void *vctx, int index, int64_t row0, int64_t nrows, void *buf,
                           st_error *err) {
    (void)err;
    copy_ctx *c = vctx;
    const st_sf_entry *e = &c->e[index];
    size_t row_bytes = st_sf_entry_bytes(e);
    if (e->n_dims >= 2) row_bytes = (size_t)e->shape[e->n_dims - 1] * st_dtype_size(e->dtype);
    size_t off = (size_t)row0 * row_bytes, n = (size_t)nrows * row_bytes;
    const st_tensor *t = c->from[index];
    if (t && t->nbytes == st_sf_entry_bytes(e)) memcpy(buf, (const uint8_t *)t->data + off, n);
    else memset(buf, 0, n);
    return ST_OK;
}

/* edit(name, entry) returns 0 to drop the tensor; it may change dtype/shape */
typedef int (*edit_fn)(const char *name, st_sf_entry *e);

/* Copy fixture `src` to tmp/`name` with the tensors edited and config.json text replaced. */
static const char *make_bad(const char *name, const char *src, edit_fn edit, const char *cfg_from,
                            const char *cfg_to) {
    static char dst[512];
    char path[1024];
    snprintf(dst, sizeof dst, "%s/%s", tmp, name);
    mkdir(dst, 0755);
    snprintf(path, sizeof path, "%s/fixtures/%s", tap_data_dir(), src);
    st_checkpoint *ck;
    st_error err = {0};
    if (st_checkpoint_open(path, &ck, &err) != ST_OK) {
        printf("# cannot open %s: %s\n", path, err.msg);
        return dst;
    }
    st_sf_entry *e = calloc((size_t)ck->n_tensors, sizeof *e);
    const st_tensor **from = calloc((size_t)ck->n_tensors, sizeof *from);
    int n = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = st_checkpoint_tensor(ck, i);
        st_sf_entry x = {t->name, t->dtype, t->n_dims, {0}};
        memcpy(x.shape, t->shape, sizeof x.shape);
        if (edit && !edit(t->name, &x)) continue;
        from[n] = t;
        e[n++] = x;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    copy_ctx cc = {ck, e, from};
    if (st_sf_write(path, e, n, "pt", fill_copy, &cc, &err) != ST_OK) printf("# write: %s\n", err.msg);
    /* config.json with an optional textual replacement */
    char *cfg;
    size_t len;
    snprintf(path, sizeof path, "%s/fixtures/%s/config.json", tap_data_dir(), src);
    if (st_file_read(path, 1 << 20, &cfg, &len, &err) == ST_OK) {
        char *out = malloc(len + 4096);
        const char *hit = cfg_from ? strstr(cfg, cfg_from) : NULL;
        if (hit)
            snprintf(out, len + 4096, "%.*s%s%s", (int)(hit - cfg), cfg, cfg_to, hit + strlen(cfg_from));
        else
            snprintf(out, len + 4096, "%s", cfg);
        if (cfg_from && !hit) printf("# '%s' not in %s\n", cfg_from, path);
        snprintf(path, sizeof path, "%s/config.json", dst);
        st_file_write(path, out, strlen(out), NULL);
        free(out);
        free(cfg);
    }
    free(e);
    free(from);
    st_checkpoint_close(ck);
    return dst;
}

static void expect_load(const char *what, const char *dir, st_status want, const char *part1,
                        const char *part2) {
    st_model *m = NULL;
    st_error err = {0};
    st_status st = st_model_load(dir, &m, &err);
    st_model_free(m);
    CHECK(st == want && (!part1 || strstr(err.msg, part1)) && (!part2 || strstr(err.msg, part2)),
          "%s -> %s: %s", what, st_status_name(st), err.msg);
}

static int drop_z(const char *name, st_sf_entry *e) {
    (void)e;
    return strcmp(name, "model.layers.1.linear_attn.in_proj_z.weight") != 0;
}
static int reshape_k(const char *name, st_sf_entry *e) {
    if (!strcmp(name, "model.layers.3.self_attn.k_proj.weight")) e->shape[1] = 32;
    return 1;
}
static int i64_q(const char *name, st_sf_entry *e) {
    if (!strcmp(name, "model.layers.3.self_attn.q_proj.weight")) e->dtype = ST_DTYPE_I64;
    return 1;
}
static int i32_norm(const char *name, st_sf_entry *e) {
    if (!strcmp(name, "model.norm.weight")) e->dtype = ST_DTYPE_I32;
    return 1;
}
static int drop_scales(const char *name, st_sf_entry *e) {
    (void)e;
    return strcmp(name, "language_model.model.layers.0.mlp.up_proj.biases") != 0;
}
static int drop_embed(const char *name, st_sf_entry *e) {
    (void)e;
    return strcmp(name, "model.embed_tokens.weight") != 0;
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/strand-bad-XXXXXX");
    if (!CHECK(mkdtemp(tmp) != NULL, "temp dir")) return tap_done();
    const char *d;

    d = make_bad("ok", "tiny-a", NULL, NULL, NULL);
    expect_load("an unchanged copy loads", d, ST_OK, NULL, NULL);

    d = make_bad("missing", "tiny-a", drop_z, NULL, NULL);
    expect_load("missing tensor", d, ST_ERR_MISSING, "model.layers.1.linear_attn.in_proj_z.weight", "missing");
    d = make_bad("noembed", "tiny-a", drop_embed, NULL, NULL);
    expect_load("missing embedding", d, ST_ERR_MISSING, "embed_tokens", NULL);
    d = make_bad("shape", "tiny-a", reshape_k, NULL, NULL);
    expect_load("wrong shape", d, ST_ERR_SHAPE, "model.layers.3.self_attn.k_proj.weight",
                "has shape [64, 32], expected [64, 64]");
    d = make_bad("dtype", "tiny-a", i64_q, NULL, NULL);
    expect_load("matrix of an unsupported dtype", d, ST_ERR_UNSUPPORTED, "q_proj.weight", "I64");
    d = make_bad("normdtype", "tiny-a", i32_norm, NULL, NULL);
    expect_load("norm of an unsupported dtype", d, ST_ERR_UNSUPPORTED, "model.norm.weight", "I32");

    /* config problems */
    d = make_bad("nohidden", "tiny-a", NULL, "\"hidden_size\": 64,", "");
    expect_load("config missing hidden_size", d, ST_ERR_MISSING, "config.json", "'hidden_size'");
    d = make_bad("nolayers", "tiny-a", NULL, "\"num_hidden_layers\": 4,", "");
    expect_load("config missing num_hidden_layers", d, ST_ERR_MISSING, "'num_hidden_layers'", NULL);
    d = make_bad("badtype", "tiny-a", NULL, "\"qwen3_5_text\"", "\"llama\"");
    expect_load("config of another architecture", d, ST_ERR_UNSUPPORTED, "model_type 'llama'", NULL);
    d = make_bad("badjson", "tiny-a", NULL, "\"vocab_size\": 1024", "\"vocab_size\": 1024,,");
    expect_load("config not JSON", d, ST_ERR_FORMAT, "config.json", "not valid JSON");
    d = make_bad("strtype", "tiny-a", NULL, "\"hidden_size\": 64", "\"hidden_size\": \"64\"");
    expect_load("config field of the wrong type", d, ST_ERR_FORMAT, "'hidden_size'", "integer");
    d = make_bad("heads", "tiny-a", NULL, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
    expect_load("heads not a multiple of kv heads", d, ST_ERR_FORMAT, "num_key_value_heads", NULL);
    d = make_bad("eosstr", "tiny-a", NULL, "\"eos_token_id\": null", "\"eos_token_id\": \"2\"");
    expect_load("eos_token_id as a string (a model that would never stop)", d, ST_ERR_FORMAT, "eos_token_id", "token id");
    d = make_bad("eoslist", "tiny-a", NULL, "\"eos_token_id\": null", "\"eos_token_id\": [2, 3.5]");
    expect_load("eos_token_id with a non-integer member", d, ST_ERR_FORMAT, "eos_token_id", NULL);
    d = make_bad("ropestr", "tiny-a", NULL, "\"rope_parameters\": {", "\"rope_parameters\": \"yes\", \"x\": {");
    expect_load("rope_parameters not an object", d, ST_ERR_FORMAT, "rope_parameters must be an object", NULL);
    d = make_bad("layertypes", "tiny-a", NULL, "\"full_attention\"\n", "\"sliding_attention\"\n");
    expect_load("unknown layer type", d, ST_ERR_FORMAT, "layer_types[3]", "sliding_attention");
    {
        char path[1024];
        snprintf(path, sizeof path, "%s/noconfig", tmp);
        mkdir(path, 0755);
        expect_load("no config.json", path, ST_ERR_IO, "config.json", NULL);
    }

    /* quantization problems (MLX) */
    d = make_bad("bits7", "tiny-a/mlx-q4", NULL, "\"bits\": 4\n  },\n  \"quantization_config\"",
                 "\"bits\": 7\n  },\n  \"quantization_config\"");
    expect_load("7-bit quantization", d, ST_ERR_UNSUPPORTED, "7-bit quantization is not supported", "embed_tokens");
    d = make_bad("bits8", "tiny-a/mlx-q4", NULL, "\"bits\": 4\n  },\n  \"quantization_config\"",
                 "\"bits\": 8\n  },\n  \"quantization_config\"");
    expect_load("config bits disagree with the packed shape", d, ST_ERR_SHAPE, "embed_tokens.weight",
                "expected [1024, 16]");
    d = make_bad("nobiases", "tiny-a/mlx-q4", drop_scales, NULL, NULL);
    expect_load("quantized tensor without biases", d, ST_ERR_MISSING, "mlp.up_proj.biases", NULL);
    d = make_bad("mode", "tiny-a/mlx-q4", NULL, "\"group_size\": 64,", "\"group_size\": 64, \"mode\": \"mxfp4\",");
    expect_load("unsupported quantization mode", d, ST_ERR_UNSUPPORTED, "mxfp4", NULL);

    /* damaged files */
    {
        char src[1024], dst[1024];
        char *data;
        size_t len;
        snprintf(src, sizeof src, "%s/ok/model.safetensors", tmp);
        if (st_file_read(src, 64u << 20, &data, &len, NULL) == ST_OK) {
            d = make_bad("trunc", "tiny-a", NULL, NULL, NULL);
            snprintf(dst, sizeof dst, "%s/model.safetensors", d);
            st_file_write(dst, data, len / 2, NULL);
            expect_load("truncated file", d, ST_ERR_FORMAT, "trunc/model.safetensors", "out of range");
            d = make_bad("hdrlen", "tiny-a", NULL, NULL, NULL);
            snprintf(dst, sizeof dst, "%s/model.safetensors", d);
            data[5] = 0x7f; /* header length far past the end */
            st_file_write(dst, data, len, NULL);
            expect_load("header length past the end", d, ST_ERR_FORMAT, "hdrlen/model.safetensors",
                        "past the end");
            d = make_bad("tiny", "tiny-a", NULL, NULL, NULL);
            snprintf(dst, sizeof dst, "%s/model.safetensors", d);
            st_file_write(dst, data, 3, NULL);
            expect_load("3-byte file", d, ST_ERR_FORMAT, "truncated", NULL);
            free(data);
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) printf("# could not remove %s\n", tmp);
    return tap_done();
}
