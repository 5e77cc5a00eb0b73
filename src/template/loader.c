/* ==== Chat template loading: where transformers finds a model's template ====
 *
 * Precedence (transformers' tokenizer loading, checked against its tests): a
 * chat_template.jinja file clobbers any template in tokenizer_config.json; processors read
 * chat_template.jinja before the legacy chat_template.json; tokenizer_config.json's
 * "chat_template" comes last. Named templates: tokenizer_config.json may hold a list of
 * {"name", "template"}; with chat_template.jinja, additional_chat_templates/NAME.jinja add
 * named ones. Selection per request (transformers' get_chat_template): the name asked for;
 * else "tool_use" when tools are given and it exists; else "default".
 *
 * The render context is what apply_chat_template passes: messages, tools (None when absent),
 * documents (None), add_generation_prompt (False by default), the special tokens
 * (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token,
 * additional_special_tokens; each a string or an {"content": ...} object in the config),
 * then any extra keywords, which override the special tokens.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "template/tj_int.h"

#define MAX_TEMPLATE_FILE ((size_t)16 << 20)
#define MAX_NAMED 64

struct st_chat_template {
    int n;               /* templates */
    char *names[MAX_NAMED]; /* [n] owned; "default" for the unnamed one */
    char *srcs[MAX_NAMED];  /* [n] owned sources (kept for compiling on demand) */
    st_tmpl *tmpls[MAX_NAMED]; /* [n] owned; compiled at load for the selectable ones */
    char *origin;        /* owned: where the default template came from */
    json_t *special;     /* owned: special token strings */
    int fixed;           /* index chosen at load by name, or -1 */
};

void st_chat_template_free(st_chat_template *ct) {
    if (!ct) return;
    for (int i = 0; i < ct->n; i++) {
        free(ct->names[i]);
        free(ct->srcs[i]);
        st_tmpl_free(ct->tmpls[i]);
    }
    free(ct->origin);
    json_decref(ct->special);
    free(ct);
}

static st_status add_template(st_chat_template *ct, const char *name, const char *src,
                              size_t len, st_error *err) {
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->names[i], name)) return ST_OK; /* first one wins */
    if (ct->n == MAX_NAMED) return st_error_set(err, ST_ERR_LIMIT, "too many named chat templates");
    char *nm = strdup(name);
    char *s = malloc(len + 1);
    if (!nm || !s) {
        free(nm);
        free(s);
        return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    memcpy(s, src, len);
    s[len] = '\0';
    ct->names[ct->n] = nm;
    ct->srcs[ct->n] = s;
    ct->n++;
    return ST_OK;
}

/* "chat_template" value: a string, or a list of {"name", "template"}. */
static st_status add_from_json(st_chat_template *ct, const json_t *v, const char *where,
                               st_error *err) {
    if (json_is_string(v))
        return add_template(ct, "default", json_string_value(v), json_string_length(v), err);
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (!json_is_string(nm) || !json_is_string(tp))
                return st_error_set(err, ST_ERR_FORMAT,
                                    "%s: chat_template[%zu] needs string \"name\" and \"template\"",
                                    where, i);
            st_status st = add_template(ct, json_string_value(nm), json_string_value(tp),
                                        json_string_length(tp), err);
            if (st != ST_OK) return st;
        }
        return ST_OK;
    }
    if (json_is_object(v)) { /* {"name": "template", ...} as some tools write it */
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            if (!json_is_string(e)) continue;
            st_status st = add_template(ct, k, json_string_value(e), json_string_length(e), err);
            if (st != ST_OK) return st;
        }
        return ST_OK;
    }
    return st_error_set(err, ST_ERR_FORMAT, "%s: chat_template must be a string or a list", where);
}

static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static st_status read_special(st_chat_template *ct, const json_t *cfg, st_error *err) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *s = token_text(json_object_get(cfg, keys[i]));
        if (s && json_object_set_new(ct->special, keys[i], json_string(s)) != 0)
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    const json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(extra)) {
        json_t *arr = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(extra, i, e) {
            const char *s = token_text(e);
            if (s) json_array_append_new(arr, json_string(s));
        }
        if (json_object_set_new(ct->special, "additional_special_tokens", arr) != 0)
            return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    }
    return ST_OK;
}

static st_status load_json_file(const char *path, json_t **out, st_error *err) {
    char *buf;
    size_t len;
    st_status st = st_file_read(path, MAX_TEMPLATE_FILE, &buf, &len, err);
    if (st != ST_OK) return st;
    json_error_t je;
    *out = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    free(buf);
    if (!*out)
        return st_error_set(err, ST_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line,
                            st_json_error_text(je.text));
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return st_error_set(err, ST_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    return ST_OK;
}

static st_status add_jinja_file(st_chat_template *ct, const char *name, const char *path,
                                st_error *err) {
    char *buf;
    size_t len;
    st_status st = st_file_read(path, MAX_TEMPLATE_FILE, &buf, &len, err);
    if (st != ST_OK) return st;
    st = add_template(ct, name, buf, len, err);
    free(buf);
    return st;
}

static int index_of(const st_chat_template *ct, const char *name) {
    for (int i = 0; i < ct->n; i++)
        if (!strcmp(ct->names[i], name)) return i;
    return -1;
}

/* Compile the templates that can be selected; fix the named one. */
static st_status finish(st_chat_template *ct, const char *name, const st_tmpl_params *params,
                        st_error *err) {
    ct->fixed = -1;
    if (ct->n == 0) return st_error_set(err, ST_ERR_MISSING, "%s: no chat template", ct->origin);
    if (name) {
        int i = index_of(ct, name);
        if (i < 0 && ct->n == 1 && !strcmp(name, "default")) i = 0;
        if (i < 0) {
            char avail[512] = "";
            size_t o = 0;
            for (int k = 0; k < ct->n && o < sizeof avail - 1; k++)
                o += (size_t)snprintf(avail + o, sizeof avail - o, "%s%s", k ? ", " : "",
                                      ct->names[k]);
            return st_error_set(err, ST_ERR_MISSING, "%s: no chat template named '%s' (have: %s)",
                                ct->origin, name, avail);
        }
        ct->fixed = i;
    }
    for (int i = 0; i < ct->n; i++) {
        bool wanted = ct->fixed >= 0 ? i == ct->fixed
                                     : (!strcmp(ct->names[i], "default") ||
                                        !strcmp(ct->names[i], "tool_use") || ct->n == 1);
        if (!wanted) continue;
        st_status st = st_tmpl_compile(ct->srcs[i], strlen(ct->srcs[i]), params, &ct->tmpls[i], err);
        if (st != ST_OK) {
            st_error_prefix(err, "%s [%s]: ", ct->origin, ct->names[i]);
            return st;
        }
    }
    return ST_OK;
}

static st_chat_template *ct_new(void) {
    st_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return NULL;
    ct->special = json_object();
    if (!ct->special) {
        free(ct);
        return NULL;
    }
    return ct;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

st_status st_chat_template_load(const char *model_dir, const char *name,
                                const st_tmpl_params *params, st_chat_template **out,
                                st_error *err) {
    *out = NULL;
    st_chat_template *ct = ct_new();
    if (!ct) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    char path[4096];
    st_status st;
    json_t *cfg = NULL;
    if ((st = st_path_join(path, sizeof path, model_dir, "tokenizer_config.json", err)) != ST_OK)
        goto fail;
    if (st_file_exists(path)) {
        if ((st = load_json_file(path, &cfg, err)) != ST_OK) goto fail;
        if ((st = read_special(ct, cfg, err)) != ST_OK) goto fail;
    }
    char jinja[4096], cjson[4096];
    if ((st = st_path_join(jinja, sizeof jinja, model_dir, "chat_template.jinja", err)) != ST_OK ||
        (st = st_path_join(cjson, sizeof cjson, model_dir, "chat_template.json", err)) != ST_OK)
        goto fail;
    if (st_file_exists(jinja)) {
        ct->origin = strdup(jinja);
        if ((st = add_jinja_file(ct, "default", jinja, err)) != ST_OK) goto fail;
        char dir[4096];
        if (st_path_join(dir, sizeof dir, model_dir, "additional_chat_templates", NULL) == ST_OK) {
            DIR *d = opendir(dir);
            if (d) {
                struct dirent *de;
                char *names[MAX_NAMED];
                int nn = 0;
                while ((de = readdir(d)) && nn < MAX_NAMED)
                    if (ends_with(de->d_name, ".jinja") && de->d_name[0] != '.')
                        names[nn++] = strdup(de->d_name);
                closedir(d);
                /* sorted, so the result does not depend on readdir order */
                for (int i = 1; i < nn; i++)
                    for (int j = i; j > 0 && names[j] && names[j - 1] && strcmp(names[j - 1], names[j]) > 0; j--) {
                        char *tmp = names[j];
                        names[j] = names[j - 1];
                        names[j - 1] = tmp;
                    }
                for (int i = 0; i < nn; i++) {
                    if (!names[i]) continue;
                    char fp[4096];
                    if (st == ST_OK && st_path_join(fp, sizeof fp, dir, names[i], NULL) == ST_OK) {
                        names[i][strlen(names[i]) - 6] = '\0';
                        st = add_jinja_file(ct, names[i], fp, err);
                    }
                    free(names[i]);
                }
                if (st != ST_OK) goto fail;
            }
        }
    } else if (st_file_exists(cjson)) {
        json_t *j = NULL;
        if ((st = load_json_file(cjson, &j, err)) != ST_OK) goto fail;
        ct->origin = strdup(cjson);
        const json_t *v = json_object_get(j, "chat_template");
        if (!v) st = st_error_set(err, ST_ERR_MISSING, "%s: no \"chat_template\" member", cjson);
        else st = add_from_json(ct, v, cjson, err);
        json_decref(j);
        if (st != ST_OK) goto fail;
    } else if (cfg && json_object_get(cfg, "chat_template")) {
        ct->origin = strdup(path);
        if ((st = add_from_json(ct, json_object_get(cfg, "chat_template"), path, err)) != ST_OK)
            goto fail;
    } else {
        st = st_error_set(err, ST_ERR_MISSING,
                          "%s: no chat template (looked for chat_template.jinja, "
                          "chat_template.json and tokenizer_config.json \"chat_template\")",
                          model_dir);
        goto fail;
    }
    if (!ct->origin) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = finish(ct, name, params, err)) != ST_OK) goto fail;
    json_decref(cfg);
    *out = ct;
    return ST_OK;
fail:
    json_decref(cfg);
    st_chat_template_free(ct);
    return st;
}

st_status st_chat_template_load_file(const char *path, const char *name,
                                     const st_tmpl_params *params, st_chat_template **out,
                                     st_error *err) {
    *out = NULL;
    st_chat_template *ct = ct_new();
    if (!ct) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    st_status st;
    ct->origin = strdup(path);
    if (!ct->origin) {
        st = st_error_set(err, ST_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (ends_with(path, ".json")) {
        json_t *j = NULL;
        if ((st = load_json_file(path, &j, err)) != ST_OK) goto fail;
        const json_t *v = json_object_get(j, "chat_template");
        if (!v) {
            json_decref(j);
            st = st_error_set(err, ST_ERR_MISSING, "%s: no \"chat_template\" member", path);
            goto fail;
        }
        st = add_from_json(ct, v, path, err);
        if (st == ST_OK) st = read_special(ct, j, err);
        json_decref(j);
        if (st != ST_OK) goto fail;
    } else if ((st = add_jinja_file(ct, "default", path, err)) != ST_OK) {
        goto fail;
    }
    if ((st = finish(ct, name, params, err)) != ST_OK) goto fail;
    *out = ct;
    return ST_OK;
fail:
    st_chat_template_free(ct);
    return st;
}

const json_t *st_chat_template_special_tokens(const st_chat_template *ct) { return ct->special; }
const char *st_chat_template_origin(const st_chat_template *ct) { return ct->origin; }

st_status st_chat_template_render(const st_chat_template *ct, const json_t *messages,
                                  const json_t *tools, const json_t *documents,
                                  const json_t *kwargs, char **out, size_t *out_len,
                                  st_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (tools && json_is_null(tools)) tools = NULL;
    if (documents && json_is_null(documents)) documents = NULL;
    int idx = ct->fixed;
    if (idx < 0) {
        if (tools) idx = index_of(ct, "tool_use");
        if (idx < 0) idx = index_of(ct, "default");
        if (idx < 0 && ct->n == 1) idx = 0;
        if (idx < 0 || !ct->tmpls[idx])
            return st_error_set(err, ST_ERR_MISSING,
                                "This model has multiple chat templates with no default specified!");
    }
    json_t *ctx = json_deep_copy(ct->special);
    if (!ctx) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    if (kwargs && json_is_object(kwargs)) json_object_update(ctx, (json_t *)kwargs);
    json_object_set(ctx, "messages", messages ? (json_t *)messages : json_null());
    json_object_set(ctx, "tools", tools ? (json_t *)tools : json_null());
    json_object_set(ctx, "documents", documents ? (json_t *)documents : json_null());
    if (!json_object_get(ctx, "add_generation_prompt"))
        json_object_set_new(ctx, "add_generation_prompt", json_false());
    st_status st = st_tmpl_render(ct->tmpls[idx], ctx, out, out_len, err);
    json_decref(ctx);
    return st;
}

st_status st_chat_template_render_request(const st_chat_template *ct, const json_t *request,
                                          char **out, size_t *out_len, st_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!json_is_object(request))
        return st_error_set(err, ST_ERR_ARG, "request must be a JSON object");
    const json_t *messages = json_object_get(request, "messages");
    if (!json_is_array(messages))
        return st_error_set(err, ST_ERR_ARG, "request: \"messages\" must be a list of messages");
    json_t *kw = json_object();
    if (!kw) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)request, k, v) {
        if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents")) continue;
        json_object_set(kw, k, v);
    }
    st_status st = st_chat_template_render(ct, messages, json_object_get(request, "tools"),
                                           json_object_get(request, "documents"), kw, out,
                                           out_len, err);
    json_decref(kw);
    return st;
}
