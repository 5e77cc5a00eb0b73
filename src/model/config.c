/* ==== config.json of a Qwen3.5-family checkpoint (see config.h) ==== */
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/log.h"

/* Field readers: `obj` is the text config; `label` names the file in messages. */
typedef struct reader {
    const char *label;
    json_t *text; /* text_config, or the root for flat configs */
    json_t *root;
    st_error *err;
} reader;

static st_status get_int(reader *r, json_t *obj, const char *key, int required, int64_t def,
                         int64_t min, int64_t max, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return st_error_set(r->err, ST_ERR_MISSING, "%s: missing required field '%s'",
                                r->label, key);
        *out = def;
        return ST_OK;
    }
    if (!json_is_integer(v))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: field '%s' must be an integer", r->label,
                            key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: field '%s' = %lld out of range [%lld, %lld]",
                            r->label, key, (long long)x, (long long)min, (long long)max);
    *out = (int64_t)x;
    return ST_OK;
}

static st_status get_num(reader *r, json_t *obj, const char *key, double def, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return ST_OK;
    }
    if (!json_is_number(v))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: field '%s' must be a number", r->label,
                            key);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: field '%s' is not finite", r->label, key);
    return ST_OK;
}

static int get_bool(json_t *obj, const char *key, int def) {
    json_t *v = json_object_get(obj, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return def;
}

static void add_eos_id(st_config *cfg, int32_t id) {
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return;
    if (cfg->n_eos < ST_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = id;
}

/* Collect the ids of an eos_token_id field (absent, null, an id or a list of ids) into
 * cfg->eos_ids, deduplicated; anything else is refused (a model that never stops). */
static st_status add_eos(st_config *cfg, json_t *v, const char *label, st_error *err) {
    if (!v || json_is_null(v)) return ST_OK;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return st_error_set(err, ST_ERR_FORMAT,
                                "%s: eos_token_id must be a token id or a list of token ids", label);
        add_eos_id(cfg, (int32_t)json_integer_value(x));
    }
    return ST_OK;
}

static int32_t get_token_id(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX)
        return (int32_t)json_integer_value(v);
    return -1;
}

static st_status parse_quant(reader *r, st_config *cfg, json_t *q) {
    if (!json_is_object(q))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: 'quantization' must be an object",
                            r->label);
    int64_t bits, group;
    st_status st;
    if ((st = get_int(r, q, "bits", 1, 0, 1, 64, &bits)) != ST_OK) return st;
    if ((st = get_int(r, q, "group_size", 1, 0, 1, 1 << 20, &group)) != ST_OK) return st;
    json_t *mode = json_object_get(q, "mode");
    snprintf(cfg->quant_mode, sizeof cfg->quant_mode, "%s",
             json_is_string(mode) ? json_string_value(mode) : "affine");
    if (strcmp(cfg->quant_mode, "affine") != 0)
        return st_error_set(r->err, ST_ERR_UNSUPPORTED,
                            "%s: quantization mode '%s' is not supported (only affine)", r->label,
                            cfg->quant_mode);
    cfg->has_quant = 1;
    cfg->quant_bits = (int)bits;
    cfg->quant_group_size = (int)group;
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(q, key, val) if (json_is_object(val) || json_is_boolean(val)) n++;
    if (!n) return ST_OK;
    cfg->quant_overrides = calloc(n, sizeof *cfg->quant_overrides);
    if (!cfg->quant_overrides) return st_error_set(r->err, ST_ERR_NOMEM, "out of memory");
    json_object_foreach(q, key, val) {
        if (!json_is_object(val) && !json_is_boolean(val)) continue;
        st_quant_override *o = &cfg->quant_overrides[cfg->n_quant_overrides];
        o->path = strdup(key);
        if (!o->path) return st_error_set(r->err, ST_ERR_NOMEM, "out of memory");
        cfg->n_quant_overrides++;
        if (json_is_boolean(val)) {
            o->quantized = json_is_true(val);
            o->bits = cfg->quant_bits;
            o->group_size = cfg->quant_group_size;
            continue;
        }
        int64_t ob, og;
        if ((st = get_int(r, val, "bits", 0, bits, 1, 64, &ob)) != ST_OK) return st;
        if ((st = get_int(r, val, "group_size", 0, group, 1, 1 << 20, &og)) != ST_OK) return st;
        o->quantized = 1;
        o->bits = (int)ob;
        o->group_size = (int)og;
    }
    return ST_OK;
}

static st_status parse_root(reader *r, st_config *cfg) {
    json_t *root = r->root, *t = r->text;
    st_status st;
    int64_t v;
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return st_error_set(r->err, ST_ERR_MISSING, "%s: missing required field 'model_type'",
                            r->label);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", json_string_value(mt));
    static const char *known[] = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"};
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        ok |= strcmp(cfg->model_type, known[i]) == 0;
    if (!ok)
        return st_error_set(r->err, ST_ERR_UNSUPPORTED,
                            "%s: model_type '%s' is not a Qwen3.5-family model (expected "
                            "qwen3_5, qwen3_5_text, qwen3_5_moe or qwen3_5_moe_text)",
                            r->label, cfg->model_type);
    json_t *arch = json_object_get(root, "architectures");
    if (json_is_array(arch) && json_is_string(json_array_get(arch, 0)))
        snprintf(cfg->architecture, sizeof cfg->architecture, "%s",
                 json_string_value(json_array_get(arch, 0)));
    json_t *tmt = json_object_get(t, "model_type");
    cfg->is_moe = strstr(cfg->model_type, "moe") != NULL ||
                  (json_is_string(tmt) && strstr(json_string_value(tmt), "moe") != NULL);
    cfg->has_vision = json_is_object(json_object_get(root, "vision_config"));

    json_t *act = json_object_get(t, "hidden_act");
    if (act && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return st_error_set(r->err, ST_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\"",
                            r->label);
    if (get_bool(t, "attention_bias", 0))
        return st_error_set(r->err, ST_ERR_UNSUPPORTED,
                            "%s: attention_bias = true is not a Qwen3.5 configuration", r->label);

#define INT_FIELD(key, req, def, lo, hi, dst)                                                  \
    do {                                                                                       \
        if ((st = get_int(r, t, key, req, def, lo, hi, &v)) != ST_OK) return st;                \
        dst = v;                                                                               \
    } while (0)
    INT_FIELD("vocab_size", 1, 0, 1, 1 << 24, cfg->vocab_size);
    INT_FIELD("hidden_size", 1, 0, 1, 1 << 20, cfg->hidden_size);
    INT_FIELD("num_hidden_layers", 1, 0, 1, ST_MAX_LAYERS, cfg->n_layers);
    INT_FIELD("num_attention_heads", 1, 0, 1, 4096, cfg->n_heads);
    INT_FIELD("num_key_value_heads", 1, 0, 1, 4096, cfg->n_kv_heads);
    INT_FIELD("head_dim", 0, 256, 2, 4096, cfg->head_dim);
    INT_FIELD("intermediate_size", !cfg->is_moe, 0, 0, 1 << 22, cfg->intermediate_size);
    INT_FIELD("linear_conv_kernel_dim", 0, 4, 1, 64, cfg->conv_kernel);
    INT_FIELD("linear_key_head_dim", 0, 128, 1, 4096, cfg->lin_key_head_dim);
    INT_FIELD("linear_value_head_dim", 0, 128, 1, 4096, cfg->lin_value_head_dim);
    INT_FIELD("linear_num_key_heads", 0, 16, 1, 4096, cfg->lin_n_key_heads);
    INT_FIELD("linear_num_value_heads", 0, 32, 1, 4096, cfg->lin_n_value_heads);
    INT_FIELD("full_attention_interval", 0, 4, 1, ST_MAX_LAYERS, cfg->full_attention_interval);
    INT_FIELD("max_position_embeddings", 0, 32768, 1, (int64_t)1 << 30,
              cfg->max_position_embeddings);
    if (cfg->is_moe) {
        INT_FIELD("num_experts", 1, 0, 1, 1 << 16, cfg->n_experts);
        INT_FIELD("num_experts_per_tok", 1, 0, 1, 1 << 16, cfg->n_experts_per_tok);
        INT_FIELD("moe_intermediate_size", 1, 0, 1, 1 << 22, cfg->moe_intermediate_size);
        INT_FIELD("shared_expert_intermediate_size", 0, 0, 0, 1 << 22,
                  cfg->shared_expert_intermediate_size);
        cfg->norm_topk_prob = get_bool(t, "norm_topk_prob", 1);
        if (cfg->n_experts_per_tok > cfg->n_experts)
            return st_error_set(r->err, ST_ERR_FORMAT,
                                "%s: num_experts_per_tok (%d) exceeds num_experts (%d)", r->label,
                                cfg->n_experts_per_tok, cfg->n_experts);
    }
#undef INT_FIELD
    double eps;
    if ((st = get_num(r, t, "rms_norm_eps", 1e-6, &eps)) != ST_OK) return st;
    if (!(eps > 0 && eps < 1))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: rms_norm_eps must be in (0, 1)", r->label);
    cfg->rms_norm_eps = (float)eps;

    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return st_error_set(r->err, ST_ERR_FORMAT,
                            "%s: num_attention_heads (%d) is not a multiple of "
                            "num_key_value_heads (%d)",
                            r->label, cfg->n_heads, cfg->n_kv_heads);
    if (cfg->lin_n_value_heads % cfg->lin_n_key_heads != 0)
        return st_error_set(r->err, ST_ERR_FORMAT,
                            "%s: linear_num_value_heads (%d) is not a multiple of "
                            "linear_num_key_heads (%d)",
                            r->label, cfg->lin_n_value_heads, cfg->lin_n_key_heads);

    /* layer kinds: layer_types when present, else the interval rule */
    json_t *lt = json_object_get(t, "layer_types");
    for (int i = 0; i < cfg->n_layers; i++)
        cfg->layer_kind[i] =
            (i + 1) % cfg->full_attention_interval == 0 ? ST_LAYER_FULL : ST_LAYER_LINEAR;
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
            return st_error_set(r->err, ST_ERR_FORMAT,
                                "%s: layer_types must be a list of num_hidden_layers (%d) strings",
                                r->label, cfg->n_layers);
        int differs = 0;
        for (int i = 0; i < cfg->n_layers; i++) {
            json_t *s = json_array_get(lt, (size_t)i);
            const char *k = json_is_string(s) ? json_string_value(s) : "";
            uint8_t kind;
            if (strcmp(k, "linear_attention") == 0) kind = ST_LAYER_LINEAR;
            else if (strcmp(k, "full_attention") == 0) kind = ST_LAYER_FULL;
            else
                return st_error_set(r->err, ST_ERR_FORMAT,
                                    "%s: layer_types[%d] = '%.40s' (expected linear_attention or "
                                    "full_attention)",
                                    r->label, i, k);
            differs |= kind != cfg->layer_kind[i];
            cfg->layer_kind[i] = kind;
        }
        if (differs)
            ST_WARN("%s: layer_types differs from full_attention_interval %d; using layer_types "
                    "(as Hugging Face does; mlx-lm would use the interval)",
                    r->label, cfg->full_attention_interval);
    }

    /* RoPE */
    json_t *rp = json_object_get(t, "rope_parameters");
    const char *rp_name = "rope_parameters";
    if (!rp || json_is_null(rp)) {
        rp = json_object_get(t, "rope_scaling");
        rp_name = "rope_scaling";
    }
    if (json_is_null(rp)) rp = NULL;
    if (rp && !json_is_object(rp))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: %s must be an object", r->label, rp_name);
    double theta_legacy, prf_legacy;
    if ((st = get_num(r, t, "rope_theta", 10000.0, &theta_legacy)) != ST_OK) return st;
    if ((st = get_num(r, t, "partial_rotary_factor", 0.25, &prf_legacy)) != ST_OK) return st;
    cfg->rope_theta = theta_legacy;
    cfg->partial_rotary_factor = prf_legacy;
    cfg->mrope_section[0] = 11;
    cfg->mrope_section[1] = 11;
    cfg->mrope_section[2] = 10;
    cfg->mrope_interleaved = 1;
    if (rp) {
        if ((st = get_num(r, rp, "rope_theta", theta_legacy, &cfg->rope_theta)) != ST_OK) return st;
        if ((st = get_num(r, rp, "partial_rotary_factor", prf_legacy,
                          &cfg->partial_rotary_factor)) != ST_OK)
            return st;
        json_t *rt = json_object_get(rp, "rope_type");
        if (!rt) rt = json_object_get(rp, "type");
        if (json_is_string(rt)) {
            const char *s = json_string_value(rt);
            if (strcmp(s, "default") != 0 && strcmp(s, "mrope") != 0)
                return st_error_set(r->err, ST_ERR_UNSUPPORTED,
                                    "%s: rope_type '%s' is not supported (default/mrope only)",
                                    r->label, s);
        }
        json_t *ms = json_object_get(rp, "mrope_section");
        if (ms) {
            if (!json_is_array(ms) || json_array_size(ms) != 3)
                return st_error_set(r->err, ST_ERR_FORMAT,
                                    "%s: rope_parameters.mrope_section must be 3 integers",
                                    r->label);
            for (int i = 0; i < 3; i++) {
                json_t *x = json_array_get(ms, (size_t)i);
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) > 4096)
                    return st_error_set(r->err, ST_ERR_FORMAT,
                                        "%s: rope_parameters.mrope_section[%d] is not a small "
                                        "non-negative integer",
                                        r->label, i);
                cfg->mrope_section[i] = (int)json_integer_value(x);
            }
        }
        cfg->mrope_interleaved = get_bool(rp, "mrope_interleaved", 1);
    }
    if (!(cfg->rope_theta > 1.0))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: rope_theta must be > 1", r->label);
    if (!(cfg->partial_rotary_factor > 0 && cfg->partial_rotary_factor <= 1))
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: partial_rotary_factor must be in (0, 1]",
                            r->label);
    cfg->rope_dim = (int)(cfg->head_dim * cfg->partial_rotary_factor);
    cfg->rope_dim &= ~1;
    if (cfg->rope_dim < 2)
        return st_error_set(r->err, ST_ERR_FORMAT, "%s: rotary dimension is below 2", r->label);

    /* tied head: text_config's flag wins over the top level's */
    json_t *tie = json_object_get(t, "tie_word_embeddings");
    if (!json_is_boolean(tie)) tie = json_object_get(root, "tie_word_embeddings");
    cfg->tie_word_embeddings = json_is_true(tie);

    /* quantization (MLX) */
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q))
        if ((st = parse_quant(r, cfg, q)) != ST_OK) return st;

    if ((st = add_eos(cfg, json_object_get(root, "eos_token_id"), r->label, r->err)) != ST_OK) return st;
    if (t != root && (st = add_eos(cfg, json_object_get(t, "eos_token_id"), r->label, r->err)) != ST_OK)
        return st;

    cfg->image_token_id = get_token_id(root, "image_token_id");
    cfg->video_token_id = get_token_id(root, "video_token_id");
    cfg->vision_start_token_id = get_token_id(root, "vision_start_token_id");
    cfg->vision_end_token_id = get_token_id(root, "vision_end_token_id");
    return ST_OK;
}

st_status st_config_parse(const char *json, size_t len, const char *label, st_config *cfg,
                          st_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root)
        return st_error_set(err, ST_ERR_FORMAT, "%s: not valid JSON (line %d): %s", label,
                            jerr.line, st_json_error_text(jerr.text));
    st_status st;
    if (!json_is_object(root)) {
        st = st_error_set(err, ST_ERR_FORMAT, "%s: not a JSON object", label);
    } else {
        json_t *text = json_object_get(root, "text_config");
        if (text && !json_is_object(text)) {
            st = st_error_set(err, ST_ERR_FORMAT, "%s: text_config is not an object", label);
        } else {
            reader r = {label, text ? text : root, root, err};
            st = parse_root(&r, cfg);
        }
    }
    json_decref(root);
    if (st != ST_OK) st_config_free(cfg);
    return st;
}

st_status st_config_load(const char *dir, st_config *cfg, st_error *err) {
    char path[4096];
    st_status st = st_path_join(path, sizeof path, dir, "config.json", err);
    if (st != ST_OK) return st;
    char *text;
    size_t len;
    if ((st = st_file_read(path, 64u << 20, &text, &len, err)) != ST_OK) return st;
    st = st_config_parse(text, len, path, cfg, err);
    free(text);
    if (st != ST_OK) return st;
    /* generation_config.json: its eos ids join the stop set (mlx-lm lets them override) */
    if (st_path_join(path, sizeof path, dir, "generation_config.json", NULL) == ST_OK &&
        st_file_exists(path)) {
        json_error_t jerr;
        json_t *g = json_load_file(path, 0, &jerr);
        if (!g) {
            ST_WARN("%s: ignored, not valid JSON (line %d): %s", path, jerr.line, st_json_error_text(jerr.text));
        } else {
            st = json_is_object(g) ? add_eos(cfg, json_object_get(g, "eos_token_id"), path, err) : ST_OK;
            json_decref(g);
            if (st != ST_OK) {
                st_config_free(cfg);
                return st;
            }
        }
    }
    return ST_OK;
}

void st_config_free(st_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->n_quant_overrides; i++) free(cfg->quant_overrides[i].path);
    free(cfg->quant_overrides);
    cfg->quant_overrides = NULL;
    cfg->n_quant_overrides = 0;
}

int st_config_count_layers(const st_config *c, st_layer_kind kind) {
    int n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->layer_kind[i] == kind;
    return n;
}

const st_quant_override *st_config_quant_override(const st_config *c, const char *module_path) {
    for (int i = 0; i < c->n_quant_overrides; i++)
        if (strcmp(c->quant_overrides[i].path, module_path) == 0) return &c->quant_overrides[i];
    return NULL;
}

