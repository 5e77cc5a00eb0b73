/* ==== Chat template engine tests ====
 *
 * 1. The reference fixtures: chat-A.json (Qwen3 tokenizer_config.json template, rendered by
 *    transformers) and chat-qwen3.5-A.json (qwen3.5.jinja, rendered by jinja2): every string
 *    byte-identical; cases with an error must fail mentioning the raise_exception text.
 * 2. Language goldens (template-cases/cases.json, produced by the real jinja2 configured like
 *    transformers, see gen.py): every construct, filter, test, whitespace rule, error and
 *    line number; plus the real templates over many conversations.
 * 3. Limits (recursion, loops, output, memory), threads, loader precedence, API edges.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "tap.h"
#include "template/template.h"

static char data_path[1024];

static const char *dpath(const char *rel) {
    snprintf(data_path, sizeof data_path, "%s/%s", tap_data_dir(), rel);
    return data_path;
}

static json_t *load_json(const char *rel) {
    json_error_t je;
    json_t *j = json_load_file(dpath(rel), JSON_ALLOW_NUL, &je);
    if (!j) printf("# cannot load %s: %s (line %d)\n", rel, je.text, je.line);
    return j;
}

/* Print where two strings first differ, as TAP comments. */
static void show_diff(const char *want, size_t wl, const char *got, size_t gl) {
    size_t i = 0;
    while (i < wl && i < gl && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("#   first difference at byte %zu (want %zu bytes, got %zu)\n", i, wl, gl);
    printf("#   want: ");
    for (size_t k = from; k < wl && k < i + 40; k++) printf(want[k] == '\n' ? "\\n" : "%c", want[k]);
    printf("\n#   got:  ");
    for (size_t k = from; k < gl && k < i + 40; k++) printf(got[k] == '\n' ? "\\n" : "%c", got[k]);
    printf("\n");
}

static int same(const char *want, size_t wl, const char *got, size_t gl) {
    if (got && wl == gl && memcmp(want, got, wl) == 0) return 1;
    if (got) show_diff(want, wl, got, gl);
    return 0;
}

/* ==== 1. Reference fixtures ==== */

static void test_fixture_qwen3(void) {
    json_t *fx = load_json("chat-A.json");
    if (!CHECK(fx, "chat-A.json loads")) return;
    st_chat_template *ct = NULL;
    st_error err;
    st_status st = st_chat_template_load(dpath("tokenizers/qwen3"), NULL, NULL, &ct, &err);
    if (!CHECK(st == ST_OK, "qwen3 template loads from tokenizer_config.json")) {
        printf("# %s\n", err.msg);
        json_decref(fx);
        return;
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(fx, "cases"), i, c) {
        json_t *kw = json_object();
        json_object_set_new(kw, "add_generation_prompt", json_true());
        json_t *et = json_object_get(c, "enable_thinking");
        if (et && !json_is_null(et)) json_object_set(kw, "enable_thinking", et);
        char *out = NULL;
        size_t n = 0;
        st = st_chat_template_render(ct, json_object_get(c, "messages"), json_object_get(c, "tools"),
                                     NULL, kw, &out, &n, &err);
        const char *want = json_string_value(json_object_get(c, "rendered"));
        size_t wl = json_string_length(json_object_get(c, "rendered"));
        if (st != ST_OK) printf("# error: %s\n", err.msg);
        CHECK(st == ST_OK && same(want, wl, out, n), "chat-A %s: qwen3 template byte-identical",
              json_string_value(json_object_get(c, "name")));
        free(out);
        json_decref(kw);
    }
    st_chat_template_free(ct);
    json_decref(fx);
}

static void test_fixture_qwen35(void) {
    json_t *fx = load_json("chat-qwen3.5-A.json");
    if (!CHECK(fx, "chat-qwen3.5-A.json loads")) return;
    st_chat_template *ct = NULL;
    st_error err;
    st_status st = st_chat_template_load_file(dpath("templates/qwen3.5.jinja"), NULL, NULL, &ct, &err);
    if (!CHECK(st == ST_OK, "qwen3.5.jinja compiles")) {
        printf("# %s\n", err.msg);
        json_decref(fx);
        return;
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(fx, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *kw = json_object();
        json_object_set_new(kw, "add_generation_prompt", json_true());
        json_t *k2 = json_object_get(c, "kwargs");
        if (json_is_object(k2)) json_object_update(kw, k2);
        char *out = NULL;
        size_t n = 0;
        st = st_chat_template_render(ct, json_object_get(c, "messages"), json_object_get(c, "tools"),
                                     NULL, kw, &out, &n, &err);
        json_t *e = json_object_get(c, "error");
        if (e && !json_is_null(e)) {
            const char *etext = json_is_string(e) ? json_string_value(e) : "";
            CHECK(st != ST_OK && strstr(err.msg, etext), "chat-qwen3.5-A %s: fails with '%s'", name,
                  etext);
        } else {
            json_t *r = json_object_get(c, "rendered");
            if (st != ST_OK) printf("# error: %s\n", err.msg);
            CHECK(st == ST_OK && same(json_string_value(r), json_string_length(r), out, n),
                  "chat-qwen3.5-A %s: byte-identical", name);
        }
        free(out);
        json_decref(kw);
    }
    st_chat_template_free(ct);
    json_decref(fx);
}

/* ==== 2. Language goldens ==== */

static void check_error(const char *name, st_status st, const st_error *err, json_t *c) {
    const char *etext = json_string_value(json_object_get(c, "error"));
    json_t *jl = json_object_get(c, "error_line");
    char want_line[32] = "";
    if (json_is_integer(jl)) snprintf(want_line, sizeof want_line, "line %lld:", (long long)json_integer_value(jl));
    /* raise_exception's message must come through verbatim */
    const char *raised = NULL;
    if (etext && !strncmp(etext, "TemplateError: ", 15)) raised = etext + 15;
    int ok = st != ST_OK && (!want_line[0] || strstr(err->msg, want_line)) &&
             (!raised || strstr(err->msg, raised));
    if (!ok)
        printf("#   jinja2: %s (line %s)\n#   strand: %s\n", etext ? etext : "?",
               json_is_integer(jl) ? want_line : "?", st == ST_OK ? "(no error)" : err->msg);
    CHECK(ok, "%s: error%s%s", name, want_line[0] ? " at " : "", want_line);
}

static void run_chat_case(json_t *c, st_chat_template *q3, st_chat_template *q35) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *src = json_string_value(json_object_get(c, "source"));
    st_chat_template *ct = src && strstr(src, "qwen3.5") ? q35 : q3;
    if (!ct) {
        CHECK(0, "%s: template not loaded", name);
        return;
    }
    st_error err;
    st_error_clear(&err);
    char *out = NULL;
    size_t n = 0;
    st_status st = st_chat_template_render(ct, json_object_get(c, "messages"), json_object_get(c, "tools"),
                                           NULL, json_object_get(c, "kwargs"), &out, &n, &err);
    json_t *exp = json_object_get(c, "expected");
    if (exp) {
        if (st != ST_OK) printf("#   error: %s\n", err.msg);
        CHECK(st == ST_OK && same(json_string_value(exp), json_string_length(exp), out, n), "%s", name);
    } else {
        check_error(name, st, &err, c);
    }
    free(out);
}

static void test_goldens(void) {
    json_t *g = load_json("template-cases/cases.json");
    if (!CHECK(g, "template-cases/cases.json loads")) return;
    st_tmpl_params p = st_tmpl_default_params();
    p.max_call_depth = 60;
    st_chat_template *q3 = NULL, *q35 = NULL;
    st_error err;
    if (st_chat_template_load(dpath("tokenizers/qwen3"), NULL, NULL, &q3, &err) != ST_OK)
        printf("# qwen3: %s\n", err.msg);
    if (st_chat_template_load_file(dpath("templates/qwen3.5.jinja"), NULL, NULL, &q35, &err) != ST_OK)
        printf("# qwen3.5: %s\n", err.msg);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(g, "cases"), i, c) {
        if (json_is_true(json_object_get(c, "chat"))) {
            run_chat_case(c, q3, q35);
            continue;
        }
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *tj = json_object_get(c, "template");
        st_tmpl *t = NULL;
        st_error_clear(&err);
        st_status st = st_tmpl_compile(json_string_value(tj), json_string_length(tj), &p, &t, &err);
        char *out = NULL;
        size_t n = 0;
        if (st == ST_OK) st = st_tmpl_render(t, json_object_get(c, "context"), &out, &n, &err);
        json_t *exp = json_object_get(c, "expected");
        if (exp) {
            if (st != ST_OK) printf("#   error: %s\n", err.msg);
            CHECK(st == ST_OK && same(json_string_value(exp), json_string_length(exp), out, n), "%s", name);
        } else {
            check_error(name, st, &err, c);
        }
        free(out);
        st_tmpl_free(t);
    }
    st_chat_template_free(q3);
    st_chat_template_free(q35);
    json_decref(g);
}

/* ==== 3. Limits, threads, loader, API ==== */

static st_status render_str(const char *src, const char *ctx_json, const st_tmpl_params *p,
                            char **out, size_t *n, st_error *err) {
    st_tmpl *t = NULL;
    *out = NULL;
    st_status st = st_tmpl_compile(src, strlen(src), p, &t, err);
    if (st != ST_OK) return st;
    json_t *ctx = ctx_json ? json_loads(ctx_json, JSON_ALLOW_NUL, NULL) : NULL;
    st = st_tmpl_render(t, ctx, out, n, err);
    json_decref(ctx);
    st_tmpl_free(t);
    return st;
}

static void expect_limit(const char *what, const char *src, const st_tmpl_params *p, const char *needle) {
    char *out = NULL;
    size_t n;
    st_error err;
    st_error_clear(&err);
    st_status st = render_str(src, NULL, p, &out, &n, &err);
    int ok = st != ST_OK && strstr(err.msg, needle) != NULL;
    if (!ok) printf("#   got status %d: %s\n", st, err.msg);
    CHECK(ok, "limit: %s fails with '%s'", what, needle);
    free(out);
}

static void test_limits(void) {
    st_tmpl_params p = st_tmpl_default_params();
    expect_limit("infinite macro recursion", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", &p,
                 "macro call depth");
    expect_limit("mutual recursion", "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
                 &p, "macro call depth");
    st_tmpl_params lp = p;
    lp.max_loop_iters = 100000;
    expect_limit("huge nested loops",
                 "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", &lp,
                 "loop iteration limit");
    st_tmpl_params op = p;
    op.max_output = 1000;
    expect_limit("output size", "{% for a in range(1000) %}xxxxxxxxxx{% endfor %}", &op, "output limit");
    expect_limit("output via macro capture", "{% macro m() %}{% for a in range(1000) %}xxxxxxxxxx{% endfor %}{% endmacro %}{% set s = m() %}",
                 &op, "output limit");
    st_tmpl_params mp = p;
    mp.max_memory = 1 << 20;
    expect_limit("memory via string doubling",
                 "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", &mp,
                 "limit");
    expect_limit("string repetition", "{{ 'x' * 100000000000 }}", &mp, "limit");
    st_tmpl_params sp = p;
    sp.max_steps = 100000;
    expect_limit("evaluation steps", "{% for a in range(100000) %}{{ a }}{% endfor %}", &sp, "step limit");
    /* deeply nested source: parse depth, not a crash */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t o = 0;
    o += (size_t)sprintf(deep + o, "{{ ");
    for (size_t i = 0; i < depth; i++) deep[o++] = '(';
    deep[o++] = '1';
    for (size_t i = 0; i < depth; i++) deep[o++] = ')';
    strcpy(deep + o, " }}");
    char *out = NULL;
    size_t n;
    st_error err;
    st_status st = render_str(deep, NULL, &p, &out, &n, &err);
    CHECK(st != ST_OK && strstr(err.msg, "nested"), "limit: 5000 nested parentheses give an error");
    free(out);
    free(deep);
    char *ifs = malloc(2000 * 24 + 64);
    o = 0;
    for (int i = 0; i < 2000; i++) o += (size_t)sprintf(ifs + o, "{%% if 1 %%}");
    for (int i = 0; i < 2000; i++) o += (size_t)sprintf(ifs + o, "{%% endif %%}");
    ifs[o] = 0;
    st = render_str(ifs, NULL, &p, &out, &n, &err);
    CHECK(st != ST_OK && strstr(err.msg, "nested"), "limit: 2000 nested ifs give an error");
    free(out);
    free(ifs);
    char *nots = malloc(3 * 100000 + 16);
    o = 0;
    o += (size_t)sprintf(nots, "{{ ");
    for (int i = 0; i < 100000; i++) o += (size_t)sprintf(nots + o, "-");
    sprintf(nots + o, "1 }}");
    st = render_str(nots, NULL, &p, &out, &n, &err);
    CHECK(st != ST_OK, "limit: 100000 unary minus signs give an error");
    free(out);
    free(nots);
    /* left-deep operator chains and deeply nested values: errors, not stack overflows */
    char *chain = malloc(200000 * 4 + 16);
    o = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 200000; i++) o += (size_t)sprintf(chain + o, " + 1");
    strcpy(chain + o, " }}");
    st = render_str(chain, NULL, &p, &out, &n, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "nested too deeply"), "limit: a 200000-term + chain is a compile error");
    free(out);
    o = (size_t)sprintf(chain, "{{ 'x'");
    for (int i = 0; i < 100000; i++) o += (size_t)sprintf(chain + o, "|trim");
    strcpy(chain + o, " }}");
    st = render_str(chain, NULL, &p, &out, &n, &err);
    CHECK(st == ST_ERR_FORMAT, "limit: a 100000-filter chain is a compile error");
    free(out);
    free(chain);
    expect_limit("comparing 20000-deep nested lists",
                 "{% set ns = namespace(a=[], b=[]) %}{% for i in range(20000) %}{% set ns.a = [ns.a] %}"
                 "{% set ns.b = [ns.b] %}{% endfor %}{{ ns.a == ns.b }}", &p, "nested too deeply");
    expect_limit("hashing a 20000-deep tuple",
                 "{% set ns = namespace(a=()) %}{% for i in range(20000) %}{% set ns.a = (ns.a,) %}{% endfor %}"
                 "{{ {ns.a: 1} }}", &p, "nested too deeply");
    expect_limit("printing a 20000-deep list",
                 "{% set ns = namespace(a=[]) %}{% for i in range(20000) %}{% set ns.a = [ns.a] %}{% endfor %}"
                 "{{ ns.a|tojson }}", &p, "nested too deeply");
    char *rec = malloc(950 * 6 + 200);
    o = (size_t)sprintf(rec, "{%% macro m(n) %%}{{ (m(n-1) if n > 0 else '')");
    for (int i = 0; i < 950; i++) o += (size_t)sprintf(rec + o, "|trim");
    strcpy(rec + o, " }}{% endmacro %}{{ m(99) }}");
    expect_limit("recursive macro with deep expressions", rec, &p, "recursion too deep");
    free(rec);
    /* a long flat template is fine */
    char *flat = malloc(200000 * 8 + 16);
    o = 0;
    for (int i = 0; i < 200000; i++) o += (size_t)sprintf(flat + o, "{{ 1 }}");
    flat[o] = 0;
    st = render_str(flat, NULL, &p, &out, &n, &err);
    CHECK(st == ST_OK && n == 200000, "200000 print tags in a row render");
    free(out);
    free(flat);
    /* deep JSON context values print without blowing the stack */
    char ctx[20000];
    o = 0;
    o += (size_t)sprintf(ctx, "{\"x\":");
    for (int i = 0; i < 1000; i++) ctx[o++] = '[';
    for (int i = 0; i < 1000; i++) ctx[o++] = ']';
    strcpy(ctx + o, "}");
    st = render_str("{{ x }}{{ x|tojson }}", ctx, &p, &out, &n, &err);
    CHECK(st == ST_OK || st == ST_ERR_LIMIT, "1000-deep nested list prints or fails cleanly");
    free(out);
}

typedef struct thr_arg {
    const st_tmpl *t;
    json_t *ctx;
    const char *want;
    int ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 50; i++) {
        char *out = NULL;
        size_t n;
        st_error err;
        if (st_tmpl_render(a->t, a->ctx, &out, &n, &err) != ST_OK || strcmp(out, a->want) != 0) a->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src =
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
        "<{{ m.role }}:{{ m.content|upper }}>{% endfor %}{{ ns.n }}";
    st_tmpl *t;
    st_error err;
    if (!CHECK(st_tmpl_compile(src, strlen(src), NULL, &t, &err) == ST_OK, "thread test template compiles")) return;
    thr_arg args[4];
    pthread_t th[4];
    const char *ctxs[4] = {"{\"messages\":[{\"role\":\"a\",\"content\":\"x\"}]}",
                           "{\"messages\":[{\"role\":\"b\",\"content\":\"yy\"},{\"role\":\"c\",\"content\":\"z\"}]}",
                           "{\"messages\":[]}", "{\"messages\":[{\"role\":\"d\",\"content\":\"éé\"}]}"};
    const char *wants[4] = {"<a:X>1", "<b:YY><c:Z>3", "0", "<d:ÉÉ>2"};
    for (int i = 0; i < 4; i++) {
        args[i].t = t;
        args[i].ctx = json_loads(ctxs[i], 0, NULL);
        args[i].want = wants[i];
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ok &= args[i].ok;
        json_decref(args[i].ctx);
    }
    CHECK(ok, "one compiled template renders correctly from 4 threads at once");
    st_tmpl_free(t);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int render_dir(const char *dir, const char *name, const char *req_json, char **out, st_error *err) {
    st_chat_template *ct = NULL;
    *out = NULL;
    st_status st = st_chat_template_load(dir, name, NULL, &ct, err);
    if (st != ST_OK) return -1;
    json_t *req = json_loads(req_json, 0, NULL);
    size_t n;
    st = st_chat_template_render_request(ct, req, out, &n, err);
    json_decref(req);
    st_chat_template_free(ct);
    return st == ST_OK ? 0 : -1;
}

static void test_loader(void) {
    char dir[] = "/tmp/strand-tmpl-XXXXXX";
    if (!CHECK(mkdtemp(dir), "temporary model directory")) return;
    char p1[512], p2[512], p3[512], p4[600], adir[512];
    snprintf(p1, sizeof p1, "%s/tokenizer_config.json", dir);
    snprintf(p2, sizeof p2, "%s/chat_template.json", dir);
    snprintf(p3, sizeof p3, "%s/chat_template.jinja", dir);
    snprintf(adir, sizeof adir, "%s/additional_chat_templates", dir);
    snprintf(p4, sizeof p4, "%s/extra.jinja", adir);
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    const char *req_tools = "{\"messages\":[],\"tools\":[{\"name\":\"t\"}]}";
    char *out;
    st_error err;
    write_file(p1,
               "{\"bos_token\":{\"content\":\"<s>\",\"lstrip\":false},\"eos_token\":\"</s>\",\"pad_token\":null,"
               "\"chat_template\":[{\"name\":\"default\",\"template\":\"D{{ bos_token }}{{ eos_token }}{{ pad_token is defined }}{{ add_generation_prompt }}{{ tools }}\"},"
               "{\"name\":\"tool_use\",\"template\":\"T{{ tools|length }}\"},{\"name\":\"rag\",\"template\":\"R{{ documents }}\"}]}");
    CHECK(render_dir(dir, NULL, req, &out, &err) == 0 && !strcmp(out, "D<s></s>FalseFalseNone"),
          "loader: tokenizer_config list, default template, special tokens ({\"content\"} form), tools=None");
    free(out);
    CHECK(render_dir(dir, NULL, req_tools, &out, &err) == 0 && !strcmp(out, "T1"),
          "loader: tool_use chosen when tools are given");
    free(out);
    CHECK(render_dir(dir, "rag", req, &out, &err) == 0 && !strcmp(out, "RNone"), "loader: a named template");
    free(out);
    CHECK(render_dir(dir, "nope", req, &out, &err) != 0 && strstr(err.msg, "nope"),
          "loader: unknown template name is an error naming it");
    free(out);
    write_file(p2, "{\"chat_template\":\"J{{ messages[0].content }}{{ bos_token }}\"}");
    CHECK(render_dir(dir, NULL, req, &out, &err) == 0 && !strcmp(out, "Jhi<s>"),
          "loader: chat_template.json beats tokenizer_config.json");
    free(out);
    write_file(p3, "K{{ messages|length }}\n");
    CHECK(render_dir(dir, NULL, req, &out, &err) == 0 && !strcmp(out, "K1"),
          "loader: chat_template.jinja beats chat_template.json (trailing newline dropped)");
    free(out);
    mkdir(adir, 0755);
    write_file(p4, "X{{ extra_kw }}");
    CHECK(render_dir(dir, "extra", "{\"messages\":[],\"extra_kw\":7}", &out, &err) == 0 && !strcmp(out, "X7"),
          "loader: additional_chat_templates/NAME.jinja, extra request keywords passed through");
    free(out);
    CHECK(render_dir(dir, NULL, "{\"messages\":[],\"add_generation_prompt\":true,\"eos_token\":\"E\"}", &out, &err) == 0 &&
              !strcmp(out, "K0"),
          "loader: request keywords accepted");
    free(out);
    CHECK(render_dir(dir, NULL, "{\"messages\":5}", &out, &err) != 0 && strstr(err.msg, "messages"),
          "loader: request with bad messages is an error");
    free(out);
    unlink(p4);
    rmdir(adir);
    unlink(p3);
    unlink(p2);
    write_file(p1, "{\"eos_token\":\"</s>\"}");
    CHECK(render_dir(dir, NULL, req, &out, &err) != 0 && strstr(err.msg, "no chat template"),
          "loader: a directory without a template is an error");
    free(out);
    write_file(p1, "{\"chat_template\":\"{% if %}\"}");
    CHECK(render_dir(dir, NULL, req, &out, &err) != 0 && strstr(err.msg, "line 1"),
          "loader: a syntax error names the line");
    free(out);
    unlink(p1);
    rmdir(dir);
}

/* jansson keeps object keys in insertion order (a duplicate keeps its first place and the
 * last value, as Python's json does); tojson and iteration must show that order. */
static void test_key_order(void) {
    const char *ctx = "{\"d\":{\"z\":1,\"a\":2,\"m\":3,\"b\":4,\"y\":5,\"c\":6,\"x\":7,\"d\":8,"
                      "\"w\":9,\"e\":10,\"v\":11,\"f\":12,\"z\":13}}";
    char *out = NULL;
    size_t n;
    st_error err;
    st_status st = render_str("{{ d|tojson }}|{% for k in d %}{{ k }}{% endfor %}|{{ d.z }}{{ d['f'] }}", ctx, NULL,
                              &out, &n, &err);
    const char *want = "{\"z\": 13, \"a\": 2, \"m\": 3, \"b\": 4, \"y\": 5, \"c\": 6, \"x\": 7, \"d\": 8, "
                       "\"w\": 9, \"e\": 10, \"v\": 11, \"f\": 12}|zambycxdwevf|1312";
    CHECK(st == ST_OK && !strcmp(out, want), "context object keys keep insertion order (jansson), duplicates last-wins");
    if (st == ST_OK && strcmp(out, want)) printf("#   got %s\n", out);
    free(out);
}

static void test_api(void) {
    char *out = NULL;
    size_t n = 0;
    st_error err;
    st_tmpl_params p = st_tmpl_default_params();
    p.fixed_time = 86400 * 365; /* 1971-01-01 */
    setenv("TZ", "UTC", 1);
    CHECK(render_str("{{ strftime_now('%Y-%m-%d') }}", NULL, &p, &out, &n, &err) == ST_OK &&
              !strcmp(out, "1971-01-01"),
          "strftime_now uses the configured time");
    free(out);
    CHECK(render_str("{{ x }}", NULL, NULL, &out, &n, &err) == ST_OK && n == 0, "NULL context: variables undefined");
    free(out);
    st_tmpl *t = NULL;
    const char bad[] = "ab\xff{{ 1 }}";
    CHECK(st_tmpl_compile(bad, sizeof bad - 1, NULL, &t, &err) == ST_ERR_FORMAT && strstr(err.msg, "UTF-8"),
          "invalid UTF-8 template is rejected");
    const char nul[] = "a\0b{{ 'c' }}";
    CHECK(render_str("", NULL, NULL, &out, &n, &err) == ST_OK && n == 0, "empty template renders empty");
    free(out);
    if (st_tmpl_compile(nul, sizeof nul - 1, NULL, &t, &err) == ST_OK) {
        CHECK(st_tmpl_render(t, NULL, &out, &n, &err) == ST_OK && n == 4 && !memcmp(out, "a\0bc", 4),
              "NUL bytes in template text pass through");
        free(out);
        st_tmpl_free(t);
    } else {
        CHECK(0, "NUL bytes in template text compile");
    }
    json_t *arr = json_array();
    if (st_tmpl_compile("x", 1, NULL, &t, &err) == ST_OK) {
        CHECK(st_tmpl_render(t, arr, &out, &n, &err) == ST_ERR_ARG, "a non-object context is refused");
        st_tmpl_free(t);
    }
    json_decref(arr);
    st_tmpl_free(NULL);
    st_chat_template_free(NULL);
    CHECK(render_str("{{ s }}|{{ s|length }}|{{ s|tojson }}", "{\"s\":\"a\\u0000b\"}", NULL, &out, &n, &err) == ST_OK &&
              n == 16 && !memcmp(out, "a\0b|3|\"a\\u0000b\"", 16),
          "NUL in context strings");
    free(out);
}

int main(void) {
    test_fixture_qwen3();
    test_fixture_qwen35();
    test_goldens();
    test_limits();
    test_threads();
    test_loader();
    test_key_order();
    test_api();
    return tap_done();
}
