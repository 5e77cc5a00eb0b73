/* ==== Tool calls in generated text (see toolcall.h) ==== */
#include "server/toolcall.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<tool_call>";
static const char CLOSE[] = "</tool_call>";

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *find(const char *s, const char *end, const char *pat) {
    size_t n = strlen(pat);
    for (const char *p = s; p + n <= end; p++)
        if (*p == *pat && memcmp(p, pat, n) == 0) return p;
    return NULL;
}

static void trim(const char **s, const char **e) {
    while (*s < *e && is_ws(**s)) (*s)++;
    while (*e > *s && is_ws((*e)[-1])) (*e)--;
}

/* the JSON-schema type of parameter `param` of tool `name`, or NULL */
static const char *param_type(const json_t *tools, const char *name, const char *param) {
    size_t i;
    json_t *t;
    if (!json_is_array(tools)) return NULL;
    json_array_foreach((json_t *)tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f) f = t;
        json_t *n = json_object_get(f, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name) != 0) continue;
        json_t *ty = json_object_get(json_object_get(json_object_get(json_object_get(f, "parameters"),
                                                                     "properties"), param), "type");
        if (json_is_string(ty)) return json_string_value(ty);
        if (json_is_array(ty)) { /* ["integer", "null"]: the first non-null type */
            size_t k;
            json_t *x;
            json_array_foreach(ty, k, x) if (json_is_string(x) && strcmp(json_string_value(x), "null") != 0) return json_string_value(x);
        }
        return NULL;
    }
    return NULL;
}

/* an XML parameter value, typed by the schema */
static json_t *typed_value(const char *v, size_t n, const char *type) {
    if (type && strcmp(type, "string") != 0) {
        json_error_t je;
        json_t *x = json_loadb(v, n, JSON_DECODE_ANY, &je);
        if (x) {
            int ok = (!strcmp(type, "integer") && json_is_integer(x)) ||
                     (!strcmp(type, "number") && json_is_number(x)) ||
                     (!strcmp(type, "boolean") && json_is_boolean(x)) ||
                     (!strcmp(type, "object") && json_is_object(x)) ||
                     (!strcmp(type, "array") && json_is_array(x)) || !strcmp(type, "null");
            if (ok) return x;
            json_decref(x);
        }
        if (!strcmp(type, "boolean") && (n == 4 || n == 5)) {
            if (!strncmp(v, "True", 4)) return json_true();
            if (!strncmp(v, "False", 5)) return json_false();
        }
    }
    return json_stringn(v, n);
}

/* <function=NAME> <parameter=P>\nV\n</parameter> ... </function> */
static int parse_xml(const char *s, const char *e, const json_t *tools, st_tool_call *out) {
    static const char FN[] = "<function=";
    if ((size_t)(e - s) < sizeof FN || memcmp(s, FN, sizeof FN - 1) != 0) return 0;
    const char *name = s + sizeof FN - 1, *gt = memchr(name, '>', (size_t)(e - name));
    if (!gt || gt == name) return 0;
    char *fname = strndup(name, (size_t)(gt - name));
    json_t *args = json_object();
    const char *p = gt + 1;
    int ok = 1;
    for (;;) {
        while (p < e && is_ws(*p)) p++;
        if (p >= e) break; /* tolerate a missing </function> at the very end */
        if ((size_t)(e - p) >= 11 && !memcmp(p, "</function>", 11)) break;
        static const char PA[] = "<parameter=";
        if ((size_t)(e - p) < sizeof PA || memcmp(p, PA, sizeof PA - 1) != 0) {
            ok = 0;
            break;
        }
        const char *pn = p + sizeof PA - 1, *pg = memchr(pn, '>', (size_t)(e - pn));
        if (!pg || pg == pn) {
            ok = 0;
            break;
        }
        const char *vs = pg + 1, *ve = find(vs, e, "</parameter>");
        const char *next;
        if (!ve) { /* unterminated: up to the next parameter or the end of the function */
            const char *np = find(vs, e, "<parameter="), *nf = find(vs, e, "</function>");
            ve = np && (!nf || np < nf) ? np : nf ? nf : e;
            next = ve;
        } else {
            next = ve + 12;
        }
        /* the format puts the value on its own lines */
        if (vs < ve && *vs == '\n') vs++;
        if (ve > vs && ve[-1] == '\n') ve--;
        char *pname = strndup(pn, (size_t)(pg - pn));
        json_object_set_new(args, pname, typed_value(vs, (size_t)(ve - vs), param_type(tools, fname, pname)));
        free(pname);
        p = next;
    }
    if (!ok) {
        free(fname);
        json_decref(args);
        return 0;
    }
    out->name = fname;
    out->arguments = json_dumps(args, 0);
    json_decref(args);
    return out->arguments != NULL;
}

/* {"name": ..., "arguments": {...} or "..."} */
static int parse_json(const char *s, const char *e, st_tool_call *out) {
    json_error_t je;
    json_t *o = json_loadb(s, (size_t)(e - s), 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return 0;
    }
    json_t *n = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
    if (!a) a = json_object_get(o, "parameters");
    if (!json_is_string(n)) {
        json_decref(o);
        return 0;
    }
    out->name = strdup(json_string_value(n));
    if (json_is_string(a)) out->arguments = strdup(json_string_value(a));
    else if (json_is_object(a)) out->arguments = json_dumps(a, 0);
    else out->arguments = strdup("{}");
    json_decref(o);
    return out->name && out->arguments;
}

void st_tool_calls_free(st_tool_calls *tc) {
    if (!tc) return;
    for (int i = 0; i < tc->n; i++) {
        free(tc->calls[i].name);
        free(tc->calls[i].arguments);
    }
    free(tc->calls);
    free(tc->content);
    memset(tc, 0, sizeof *tc);
}

int st_toolcall_parse(const char *text, size_t len, const json_t *tools, st_tool_calls *out) {
    memset(out, 0, sizeof *out);
    const char *end = text + len, *first = find(text, end, OPEN);
    if (!first) return 0;
    const char *p = first;
    while (p && p < end) {
        const char *body = p + sizeof OPEN - 1, *close = find(body, end, CLOSE);
        const char *be = close ? close : end, *bs = body;
        trim(&bs, &be);
        st_tool_call call = {0};
        int ok = bs < be && (*bs == '{' ? parse_json(bs, be, &call) : parse_xml(bs, be, tools, &call));
        if (!ok) {
            st_tool_calls_free(out);
            return 0;
        }
        st_tool_call *nc = realloc(out->calls, (size_t)(out->n + 1) * sizeof *nc);
        if (!nc) {
            free(call.name);
            free(call.arguments);
            st_tool_calls_free(out);
            return 0;
        }
        out->calls = nc;
        out->calls[out->n++] = call;
        if (!close) break;
        p = find(close + sizeof CLOSE - 1, end, OPEN);
    }
    const char *cs = text, *ce = first;
    trim(&cs, &ce);
    if (ce > cs) out->content = strndup(cs, (size_t)(ce - cs));
    return 1;
}
