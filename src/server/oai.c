/* ==== OpenAI API requests: parsing and validation (see oai.h) ==== */
#include "server/oai.h"

#include "grammar/grammar.h"

#include "core/fileio.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void st_oai_error_set(st_oai_error *e, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *st_oai_error_json(const st_oai_error *e) {
    json_t *err = json_object();
    json_object_set_new(err, "message", json_string(e->message));
    json_object_set_new(err, "type", json_string(e->type));
    json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code[0] ? json_string(e->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", err);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

int st_oai_json_depth(const char *s, size_t n, int limit) {
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
            if (depth > limit) return depth;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

void st_oai_request_free(st_oai_request *r) {
    if (!r) return;
    free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->kwargs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_images; i++) free(r->images[i]);
    free(r->images);
    free(r->image_lens);
    st_gram_schema_free(r->params.json_schema); /* unless the scheduler took it */
    memset(r, 0, sizeof *r);
}

/* ---- field helpers: each returns 0 on success, -1 after filling e ---- */

#define BAD(e, param, ...) (st_oai_error_set((e), 400, "invalid_request_error", (param), NULL, __VA_ARGS__), -1)

static int opt_number(json_t *o, const char *k, double lo, double hi, int lo_open, float *out, st_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return BAD(e, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return BAD(e, k, "'%s' must be in %s%g, %g], got %g", k, lo_open ? "(" : "[", lo, hi, x);
    *out = (float)x;
    return 0;
}

static int opt_int(json_t *o, const char *k, long long lo, long long hi, long long *out, int *present, st_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (present) *present = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return BAD(e, k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD(e, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *out = x;
    if (present) *present = 1;
    return 0;
}

static int opt_bool(json_t *o, const char *k, int *out, st_oai_error *e) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

/* base64 (standard alphabet, '=' padding) -> *out[*n] (malloc'd); -1 when it is not base64 */
static int b64_value(unsigned char c) {
    return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+' ? 62 : c == '/' ? 63 : -1;
}

static int b64_decode(const char *s, size_t n, char **out, size_t *on) {
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    char *o = malloc(n / 4 * 3 + 3);
    if (!o) return -1;
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(o);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if ((bits += 6) >= 8) o[k++] = (char)(acc >> (bits -= 8));
    }
    *out = o;
    *on = k;
    return 0;
}

/* a file:// URL's bytes, when d allows local files and the file's real path (symbolic links
 * and ".." resolved) lies under d->media_dir; 0, or -1 with e set */
static int local_image(const char *u, const char *param, size_t i, const st_oai_defaults *d, char **bytes, size_t *n,
                       st_oai_error *e) {
    if (!d->media_dir)
        return BAD(e, param, "%s[%zu]: local files are not read unless the server is started with "
                             "--allowed-local-media-path DIR; send the image as a data: URL", param, i);
    const char *path = u + 7;
    if (path[0] != '/') return BAD(e, param, "%s[%zu]: a file:// URL needs an absolute path (file:///dir/image.png)", param, i);
    char *real = realpath(path, NULL);
    const size_t dl = strlen(d->media_dir);
    if (!real || strncmp(real, d->media_dir, dl) || (dl > 1 && real[dl] != '/')) {
        const int missing = !real;
        free(real);
        return BAD(e, param, "%s[%zu]: %s", param, i,
                   missing ? "the file:// image does not exist" : "the file:// image is outside the allowed directory");
    }
    st_error fe = {0};
    st_status st = st_file_read(real, d->max_image_bytes ? d->max_image_bytes : (size_t)32 << 20, bytes, n, &fe);
    free(real);
    if (st != ST_OK) return BAD(e, param, "%s[%zu]: the file:// image cannot be read: %s", param, i, fe.msg);
    return 0;
}

/* an image_url part: a data: URL's bytes (or an allowed local file's) appended to r (remote
 * URLs are never fetched) */
static int image_part(json_t *part, const char *param, size_t i, st_oai_request *r, const st_oai_defaults *d,
                      st_oai_error *e) {
    if (!d || d->max_images <= 0)
        return BAD(e, param, "%s[%zu]: %s", param, i, d && d->no_images_why ? d->no_images_why : "this model takes no images");
    if (r->n_images >= d->max_images) return BAD(e, param, "%s: at most %d images a request", param, d->max_images);
    json_t *iu = json_object_get(part, "image_url");
    json_t *url = json_is_object(iu) ? json_object_get(iu, "url") : iu;
    if (!json_is_string(url)) return BAD(e, param, "%s[%zu].image_url.url must be a string", param, i);
    const char *u = json_string_value(url);
    const size_t ulen = json_string_length(url);
    if (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8))
        return BAD(e, param, "%s[%zu]: image URLs are not fetched by this server; send the image as a data: URL "
                             "(data:image/png;base64,...)", param, i);
    char *bytes = NULL;
    size_t n = 0;
    if (!strncmp(u, "file://", 7)) {
        if (strlen(u) != ulen) return BAD(e, param, "%s[%zu].image_url.url holds a NUL byte", param, i);
        if (local_image(u, param, i, d, &bytes, &n, e) != 0) return -1;
    } else {
        const char *comma = memchr(u, ',', ulen);
        if (strncmp(u, "data:", 5) || !comma || comma - u < 12 || memcmp(comma - 7, ";base64", 7))
            return BAD(e, param, "%s[%zu].image_url.url must be a data: URL with base64 content (data:image/png;base64,...)",
                       param, i);
        if (b64_decode(comma + 1, ulen - (size_t)(comma + 1 - u), &bytes, &n) != 0)
            return BAD(e, param, "%s[%zu].image_url.url: the data is not valid base64", param, i);
    }
    char **ni = realloc(r->images, (size_t)(r->n_images + 1) * sizeof *ni);
    if (ni) r->images = ni;
    size_t *nl = ni ? realloc(r->image_lens, (size_t)(r->n_images + 1) * sizeof *nl) : NULL;
    if (nl) r->image_lens = nl;
    if (!ni || !nl) {
        free(bytes);
        return BAD(e, param, "out of memory");
    }
    r->images[r->n_images] = bytes;
    r->image_lens[r->n_images++] = n;
    return 0;
}

/* text of a message content: a string, null, or a list of {"type": "text", "text": ...} and,
 * when d allows images, {"type": "image_url", ...} parts; then *parts is the content for the
 * template ({"type": "text", "text": ...} and {"type": "image"} in order) and the images'
 * bytes are appended to r */
static int content_text_(json_t *c, const char *param, char **out, json_t **parts, st_oai_request *r,
                         const st_oai_defaults *d, st_oai_error *e);

static int content_text(json_t *c, const char *param, char **out, json_t **parts, st_oai_request *r,
                        const st_oai_defaults *d, st_oai_error *e) {
    const int rc = content_text_(c, param, out, parts, r, d, e);
    if (rc) { /* nothing half-made is left */
        json_decref(*parts);
        *parts = NULL;
        free(*out);
        *out = NULL;
    }
    return rc;
}

static int content_text_(json_t *c, const char *param, char **out, json_t **parts, st_oai_request *r,
                         const st_oai_defaults *d, st_oai_error *e) {
    *out = NULL;
    *parts = NULL;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        *out = strdup(json_string_value(c));
        return 0;
    }
    if (!json_is_array(c)) return BAD(e, param, "'%s' must be a string or a list of content parts", param);
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *ty = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(ty))
            return BAD(e, param, "%s[%zu] must be an object with a 'type'", param, i);
        const char *t = json_string_value(ty);
        if (!strcmp(t, "image_url")) {
            if (image_part(part, param, i, r, d, e)) return -1;
            if (!*parts) *parts = json_array();
            continue;
        }
        if (!strcmp(t, "input_audio") || !strcmp(t, "image") || !strcmp(t, "file"))
            return BAD(e, param, "%s[%zu]: content of type '%s' is not supported by this server", param, i, t);
        if (strcmp(t, "text") != 0) return BAD(e, param, "%s[%zu]: unknown content type '%s'", param, i, t);
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx)) return BAD(e, param, "%s[%zu].text must be a string", param, i);
        total += json_string_length(tx);
    }
    if (*parts) { /* with images: the parts in order, for the template */
        json_array_foreach(c, i, part) {
            json_t *tx = json_object_get(part, "text");
            if (json_is_string(tx)) json_array_append_new(*parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
            else json_array_append_new(*parts, json_pack("{s:s}", "type", "image"));
        }
        return 0;
    }
    char *s = malloc(total), *p = s;
    if (!s) return BAD(e, param, "out of memory");
    json_array_foreach(c, i, part) {
        json_t *tx = json_object_get(part, "text");
        memcpy(p, json_string_value(tx), json_string_length(tx));
        p += json_string_length(tx);
    }
    *p = 0;
    *out = s;
    return 0;
}

static int parse_messages(json_t *msgs, st_oai_request *r, const st_oai_defaults *d, st_oai_error *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return BAD(e, "messages", "'messages' must be a non-empty array");
    json_t *out = json_array();
    char *system = NULL;
    size_t i;
    json_t *m;
    char param[64];
    int rc = 0, leading = 1; /* still in the run of system messages that opens the chat */
    json_array_foreach(msgs, i, m) {
        snprintf(param, sizeof param, "messages[%zu]", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            rc = BAD(e, param, "%s must be an object with a string 'role'", param);
            break;
        }
        const char *ro = json_string_value(role);
        int is_sys = !strcmp(ro, "system") || !strcmp(ro, "developer");
        if (!is_sys && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool")) {
            rc = BAD(e, param, "%s: unknown role '%s' (system, developer, user, assistant, tool)", param, ro);
            break;
        }
        char cparam[80];
        snprintf(cparam, sizeof cparam, "%s.content", param);
        char *text = NULL;
        json_t *content = json_object_get(m, "content"), *parts = NULL;
        if ((rc = content_text(content, cparam, &text, &parts, r, d, e)) != 0) break;
        if ((is_sys || strcmp(ro, "user")) && parts) {
            json_decref(parts);
            rc = BAD(e, cparam, "%s: images go in user messages", cparam);
            break;
        }
        if (is_sys && !text) {
            rc = BAD(e, cparam, "%s must be text", cparam);
            break;
        }
        if (is_sys && !leading) { /* in place: the template decides whether it may be there */
            json_array_append_new(out, json_pack("{s:s,s:s}", "role", "system", "content", text));
            free(text);
            continue;
        }
        if (is_sys) {
            if (!system) {
                system = text;
            } else {
                size_t a = strlen(system), b = strlen(text);
                char *j = realloc(system, a + b + 3);
                if (j) {
                    memcpy(j + a, "\n\n", 2);
                    memcpy(j + a + 2, text, b + 1);
                    system = j;
                }
                free(text);
            }
            continue;
        }
        if (leading && system)
            json_array_append_new(out, json_pack("{s:s,s:s}", "role", "system", "content", system));
        leading = 0;
        json_t *nm = json_object();
        json_object_set_new(nm, "role", json_string(ro));
        json_object_set_new(nm, "content", parts ? parts
                                           : text ? json_string(text)
                                                  : (strcmp(ro, "assistant") ? json_string("") : json_null()));
        free(text);
        json_t *name = json_object_get(m, "name");
        if (json_is_string(name)) json_object_set(nm, "name", name);
        if (!strcmp(ro, "assistant")) {
            json_t *rcn = json_object_get(m, "reasoning_content");
            if (json_is_string(rcn)) json_object_set(nm, "reasoning_content", rcn);
            json_t *tcs = json_object_get(m, "tool_calls");
            if (tcs && !json_is_null(tcs)) {
                if (!json_is_array(tcs)) {
                    json_decref(nm);
                    rc = BAD(e, param, "%s.tool_calls must be an array", param);
                    break;
                }
                json_t *ntcs = json_array();
                size_t k;
                json_t *tc;
                json_array_foreach(tcs, k, tc) {
                    json_t *fn = json_object_get(tc, "function");
                    json_t *fname = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
                    if (!json_is_object(fn) || !json_is_string(fname)) {
                        rc = BAD(e, param, "%s.tool_calls[%zu].function.name must be a string", param, k);
                        break;
                    }
                    json_t *oargs;
                    if (json_is_string(args)) {
                        json_error_t je;
                        oargs = json_loads(json_string_value(args), 0, &je);
                        if (!json_is_object(oargs)) {
                            json_decref(oargs);
                            rc = BAD(e, param, "%s.tool_calls[%zu].function.arguments is not a JSON object", param, k);
                            break;
                        }
                    } else if (json_is_object(args)) {
                        oargs = json_incref(args);
                    } else if (!args || json_is_null(args)) {
                        oargs = json_object();
                    } else {
                        rc = BAD(e, param, "%s.tool_calls[%zu].function.arguments must be a JSON object text", param, k);
                        break;
                    }
                    json_t *nfn = json_pack("{s:O,s:o}", "name", fname, "arguments", oargs);
                    json_t *ntc = json_pack("{s:s,s:o}", "type", "function", "function", nfn);
                    json_t *id = json_object_get(tc, "id");
                    if (json_is_string(id)) json_object_set(ntc, "id", id);
                    json_array_append_new(ntcs, ntc);
                }
                if (rc) {
                    json_decref(ntcs);
                    json_decref(nm);
                    break;
                }
                json_object_set_new(nm, "tool_calls", ntcs);
            }
        } else if (!strcmp(ro, "tool")) {
            json_t *id = json_object_get(m, "tool_call_id");
            if (json_is_string(id)) json_object_set(nm, "tool_call_id", id);
        }
        json_array_append_new(out, nm);
    }
    if (!rc && leading && system) /* only system messages */
        json_array_append_new(out, json_pack("{s:s,s:s}", "role", "system", "content", system));
    free(system);
    if (!rc && json_array_size(out) == 0) rc = BAD(e, "messages", "'messages' has no user or assistant message");
    if (rc) {
        json_decref(out);
        return rc;
    }
    r->messages = out;
    return 0;
}

static int parse_tools(json_t *root, st_oai_request *r, st_oai_error *e) {
    json_t *tools = json_object_get(root, "tools"), *choice = json_object_get(root, "tool_choice");
    const char *forced = NULL; /* "": any offered tool; else the function's name */
    if (choice && !json_is_null(choice)) {
        const char *cs = json_string_value(choice);
        json_t *cf = json_is_object(choice) ? json_object_get(choice, "function") : NULL;
        if (cs && !strcmp(cs, "none")) return 0;
        if (cs && !strcmp(cs, "required")) forced = "";
        else if (json_is_object(choice) && json_is_string(json_object_get(cf, "name")))
            forced = json_string_value(json_object_get(cf, "name"));
        else if (!cs || strcmp(cs, "auto") != 0)
            return BAD(e, "tool_choice",
                       "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (forced && (!json_is_array(tools) || json_array_size(tools) == 0))
            return BAD(e, "tool_choice", "tool_choice forces a call, but 'tools' offers none");
    }
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return BAD(e, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function"), *ty = json_object_get(t, "type");
        if (!json_is_object(t) || (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))))
            return BAD(e, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return BAD(e, "tools", "tools[%zu].function.name must be a string", i);
        json_t *pa = json_object_get(fn, "parameters");
        if (pa && !json_is_null(pa) && !json_is_object(pa))
            return BAD(e, "tools", "tools[%zu].function.parameters must be an object", i);
    }
    if (json_array_size(tools)) r->tools = json_incref(tools);
    if (forced) { /* the reply is one call, by constrained decoding (grammar/grammar.h) */
        char *text = json_dumps(tools, JSON_COMPACT);
        if (!text) return BAD(e, "tools", "out of memory");
        st_error err = {0};
        st_gram_schema *sc = NULL;
        const st_status st = st_gram_tools_compile(text, strlen(text), *forced ? forced : NULL, &sc, &err);
        free(text);
        if (st != ST_OK) return BAD(e, "tool_choice", "%s", err.msg);
        r->params.json_mode = ST_GRAM_TOOL_CALL;
        r->params.json_schema = sc;
    }
    return 0;
}

static int parse_stop(json_t *root, st_oai_request *r, st_oai_error *e) {
    json_t *stop = json_object_get(root, "stop");
    if (!stop || json_is_null(stop)) return 0;
    json_t *one[1] = {stop};
    size_t n = 1;
    if (json_is_array(stop)) n = json_array_size(stop);
    else if (!json_is_string(stop)) return BAD(e, "stop", "'stop' must be a string or an array of strings");
    if (n > ST_MAX_STOP) return BAD(e, "stop", "at most %d stop sequences", ST_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(stop) ? json_array_get(stop, i) : one[0];
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > ST_MAX_STOP_LEN)
            return BAD(e, "stop", "stop sequences must be strings of 1 to %d bytes", ST_MAX_STOP_LEN);
        memcpy(r->stop_buf[i], json_string_value(s), json_string_length(s) + 1);
        r->params.stop[r->params.n_stop++] = r->stop_buf[i];
    }
    return 0;
}

static int parse_sampling(json_t *root, const st_oai_defaults *d, st_oai_request *r, st_oai_error *e) {
    st_sampling *s = &r->params.sampling;
    *s = d->sampling;
    if (opt_number(root, "temperature", 0, 2, 0, &s->temperature, e) ||
        opt_number(root, "top_p", 0, 1, 1, &s->top_p, e) || opt_number(root, "min_p", 0, 1, 0, &s->min_p, e) ||
        opt_number(root, "presence_penalty", -2, 2, 0, &s->presence_penalty, e) ||
        opt_number(root, "frequency_penalty", -2, 2, 0, &s->frequency_penalty, e) ||
        opt_number(root, "repetition_penalty", 0, 2, 1, &s->repetition_penalty, e))
        return -1;
    long long x;
    int present;
    if (opt_int(root, "top_k", -1, 1 << 24, &x, &present, e)) return -1;
    if (present) s->top_k = x < 0 ? 0 : (int)x;
    if (opt_int(root, "seed", INT64_MIN, INT64_MAX, &x, &present, e)) return -1;
    if (present) {
        s->seed = (uint64_t)x;
        s->has_seed = 1;
    }
    if (opt_int(root, "n", 1, ST_MAX_CHOICES, &x, &present, e)) return -1;
    r->params.n = present ? (int)x : 1;
    r->n_return = r->params.n;
    if (opt_bool(root, "ignore_eos", &r->params.ignore_eos, e)) return -1; /* vLLM's extension */
    json_t *lb = json_object_get(root, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) return BAD(e, "logit_bias", "'logit_bias' must be an object of token id to bias");
        if (json_object_size(lb) > ST_MAX_LOGIT_BIAS)
            return BAD(e, "logit_bias", "at most %d logit_bias entries", ST_MAX_LOGIT_BIAS);
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char *end;
            long long id = strtoll(k, &end, 10);
            if (!*k || *end || id < 0 || id > INT32_MAX)
                return BAD(e, "logit_bias", "logit_bias key '%.40s' is not a token id", k);
            if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
                return BAD(e, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
            s->bias[s->n_bias++] = (st_logit_bias){(int32_t)id, (float)json_number_value(v)};
        }
    }
    return 0;
}

/* response_format: text, json_object (the reply constrained to one JSON object) or json_schema
 * (to a value the schema accepts) */
static int parse_response_format(json_t *root, st_oai_request *r, st_oai_error *e) {
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    json_t *ty = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    const char *t = json_is_string(ty) ? json_string_value(ty) : NULL;
    if (!t) return BAD(e, "response_format", "'response_format' must be an object with a 'type'");
    if (!strcmp(t, "text")) return 0;
    if (r->params.json_mode == ST_GRAM_TOOL_CALL)
        return BAD(e, "response_format", "a JSON response_format and a forced tool call cannot go together");
    if (!strcmp(t, "json_object")) {
        r->params.json_mode = ST_GRAM_JSON_OBJECT;
        return 0;
    }
    if (!strcmp(t, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
        if (!json_is_object(schema) && !json_is_boolean(schema))
            return BAD(e, "response_format", "response_format json_schema needs 'json_schema': {'name', 'schema'}");
        json_t *strict = json_object_get(js, "strict");
        if (strict && !json_is_boolean(strict)) return BAD(e, "response_format", "'json_schema.strict' must be a boolean");
        char *text = json_dumps(schema, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!text) return BAD(e, "response_format", "out of memory");
        st_error err = {0};
        st_gram_schema *sc = NULL;
        const st_status st = st_gram_schema_compile(text, strlen(text), json_is_true(strict), &sc, &err);
        free(text);
        if (st != ST_OK) return BAD(e, "response_format", "response_format json_schema: %s", err.msg);
        st_gram_schema_free(r->params.json_schema);
        r->params.json_schema = sc;
        r->params.json_mode = ST_GRAM_JSON_SCHEMA;
        return 0;
    }
    return BAD(e, "response_format", "response_format type '%s' is not one of text, json_object, json_schema", t);
}

/* grammar: a GBNF grammar (as llama-server takes it) the reply must match */
static int parse_grammar(json_t *root, st_oai_request *r, st_oai_error *e) {
    json_t *gr = json_object_get(root, "grammar");
    if (!gr || json_is_null(gr)) return 0;
    if (!json_is_string(gr)) return BAD(e, "grammar", "'grammar' must be a string (a GBNF grammar)");
    if (r->params.json_mode)
        return BAD(e, "grammar", "'grammar' cannot go with a JSON response_format or a forced tool call");
    st_error err = {0};
    st_gram_schema *sc = NULL;
    if (st_gram_gbnf_compile(json_string_value(gr), json_string_length(gr), &sc, &err) != ST_OK)
        return BAD(e, "grammar", "%s", err.msg);
    r->params.json_schema = sc;
    r->params.json_mode = ST_GRAM_GBNF;
    return 0;
}

static int parse_chat(json_t *root, const st_oai_defaults *d, st_oai_request *r, st_oai_error *e) {
    static const char *legacy[] = {"functions", "function_call"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, legacy[i]);
        if (v && !json_is_null(v))
            return BAD(e, legacy[i], "'%s' is the deprecated form of '%s'; send 'tools' and 'tool_choice' instead",
                       legacy[i], i ? "tool_choice" : "tools");
    }
    if (parse_messages(json_object_get(root, "messages"), r, d, e) || parse_tools(root, r, e)) return -1;
    long long x;
    int present, present2;
    long long mt = 0;
    if (opt_int(root, "max_tokens", 1, INT32_MAX, &mt, &present, e)) return -1;
    if (opt_int(root, "max_completion_tokens", 1, INT32_MAX, &x, &present2, e)) return -1;
    if (present2) mt = x;
    r->params.max_tokens = present || present2 ? mt : 0;
    if (opt_bool(root, "logprobs", &r->logprobs, e)) return -1;
    if (opt_int(root, "top_logprobs", 0, ST_MAX_LOGPROBS, &x, &present, e)) return -1;
    if (present) {
        if (!r->logprobs) return BAD(e, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
        r->top_logprobs = (int)x;
    }
    if (parse_response_format(root, r, e) || parse_grammar(root, r, e)) return -1;
    /* template keywords: add_generation_prompt, thinking switches, chat_template_kwargs */
    r->kwargs = json_object();
    json_object_set_new(r->kwargs, "add_generation_prompt", json_true());
    json_t *re = json_object_get(root, "reasoning_effort");
    if (re && !json_is_null(re)) {
        static const char *off[] = {"none", "minimal"}, *on[] = {"low", "medium", "high"};
        const char *v = json_is_string(re) ? json_string_value(re) : "";
        int think = -1;
        for (int i = 0; i < 2; i++) think = !strcmp(v, off[i]) ? 0 : think;
        for (int i = 0; i < 3; i++) think = !strcmp(v, on[i]) ? 1 : think;
        if (think < 0) return BAD(e, "reasoning_effort", "reasoning_effort must be none, minimal, low, medium or high");
        json_object_set_new(r->kwargs, "enable_thinking", json_boolean(think));
        json_object_set(r->kwargs, "reasoning_effort", re);
    }
    int think;
    json_t *et = json_object_get(root, "enable_thinking");
    if (et && !json_is_null(et)) {
        if (opt_bool(root, "enable_thinking", &think, e)) return -1;
        json_object_set_new(r->kwargs, "enable_thinking", json_boolean(think));
    }
    json_t *ck = json_object_get(root, "chat_template_kwargs");
    if (ck && !json_is_null(ck)) {
        if (!json_is_object(ck)) return BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(ck, k, v) {
            if (!strcmp(k, "messages") || !strcmp(k, "tools"))
                return BAD(e, "chat_template_kwargs", "chat_template_kwargs may not set '%s'", k);
            json_object_set(r->kwargs, k, v);
        }
    }
    return 0;
}

static int parse_completion(json_t *root, const st_oai_defaults *d, st_oai_request *r, st_oai_error *e) {
    if (parse_response_format(root, r, e) || parse_grammar(root, r, e)) return -1;
    json_t *p = json_object_get(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"] or [[1, 2, 3]] */
    if (json_is_string(p)) {
        r->prompt = strdup(json_string_value(p));
        if (!json_string_length(p)) return BAD(e, "prompt", "'prompt' is empty");
    } else if (json_is_array(p) && json_array_size(p) > 0) {
        size_t n = json_array_size(p), i;
        json_t *v;
        r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
        if (!r->prompt_ids) return BAD(e, "prompt", "out of memory");
        json_array_foreach(p, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                return BAD(e, "prompt", "'prompt' must be a string or one array of token ids (only one prompt per request)");
            r->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        r->n_prompt_ids = (int64_t)n;
    } else {
        return BAD(e, "prompt", "'prompt' must be a non-empty string or an array of token ids");
    }
    long long x;
    int present;
    if (opt_int(root, "max_tokens", 0, INT32_MAX, &x, &present, e)) return -1;
    r->params.max_tokens = present ? x : d->max_tokens_completion;
    if (present && x == 0) return BAD(e, "max_tokens", "'max_tokens' must be at least 1");
    if (opt_int(root, "logprobs", 0, ST_MAX_LOGPROBS, &x, &present, e)) return -1;
    if (present) {
        r->logprobs = 1;
        r->top_logprobs = (int)x;
    }
    if (opt_bool(root, "echo", &r->echo, e)) return -1;
    if (r->echo && r->logprobs) return BAD(e, "echo", "'echo' together with 'logprobs' is not supported");
    json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix)) return BAD(e, "suffix", "'suffix' is not supported");
    long long best_of;
    int has_best_of;
    if (opt_int(root, "best_of", 1, ST_MAX_CHOICES, &best_of, &has_best_of, e)) return -1;
    if (has_best_of) {
        if (best_of < r->n_return) return BAD(e, "best_of", "'best_of' (%lld) must be at least n (%d)", best_of, r->n_return);
        if (best_of > r->n_return && r->stream)
            return BAD(e, "best_of", "'best_of' greater than n cannot be used with 'stream'");
        r->params.n = (int)best_of;
        r->params.sum_logprobs = best_of > r->n_return;
    }
    return 0;
}

st_status st_oai_parse(st_oai_kind kind, const char *body, size_t len, const st_oai_defaults *d,
                       st_oai_request *out, st_oai_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->params = st_req_default_params();
    if (st_oai_json_depth(body, len, ST_OAI_MAX_DEPTH) > ST_OAI_MAX_DEPTH) {
        (void)BAD(e, NULL, "the JSON body is nested deeper than %d levels", ST_OAI_MAX_DEPTH);
        return ST_ERR_ARG;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        (void)BAD(e, NULL, "the body is not valid JSON (line %d, column %d): %s", je.line, je.column,
                  st_json_error_text(je.text));
        return ST_ERR_ARG;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = BAD(e, NULL, "the body must be a JSON object");
        goto done;
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            rc = BAD(e, "model", "'model' must be a string");
            goto done;
        }
        out->model = strdup(json_string_value(model));
        if (d->model_name && strcmp(d->model_name, out->model) != 0) {
            st_oai_error_set(e, 404, "not_found_error", "model", "model_not_found",
                             "The model '%.200s' does not exist; this server serves '%.200s'",
                             out->model, d->model_name);
            rc = -1;
            goto done;
        }
    }
    if ((rc = opt_bool(root, "stream", &out->stream, e)) != 0) goto done;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!out->stream) {
            rc = BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto done;
        }
        if (!json_is_object(so)) {
            rc = BAD(e, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if ((rc = opt_bool(so, "include_usage", &out->include_usage, e)) != 0) goto done;
    }
    if ((rc = parse_sampling(root, d, out, e)) != 0 || (rc = parse_stop(root, out, e)) != 0) goto done;
    rc = kind == ST_OAI_CHAT ? parse_chat(root, d, out, e) : parse_completion(root, d, out, e);
    out->params.logprobs = out->logprobs ? out->top_logprobs : -1;
done:
    json_decref(root);
    if (rc) {
        st_oai_request_free(out);
        return ST_ERR_ARG;
    }
    return ST_OK;
}
