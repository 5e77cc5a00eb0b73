/* ==== Server pieces without a network: tool-call parsing, request normalisation ==== */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "server/inbox.h"
#include "server/oai.h"
#include "server/toolcall.h"
#include "tap.h"

static int args_equal(const char *json_text, const char *want) {
    json_t *a = json_loads(json_text, 0, NULL), *b = json_loads(want, 0, NULL);
    int eq = a && b && json_equal(a, b);
    json_decref(a);
    json_decref(b);
    return eq;
}

static void test_toolcalls(void) {
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"metric\":{\"type\":\"boolean\"},"
        "\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":\"array\"},\"zip\":{\"type\":\"string\"}}}}}]",
        0, NULL);
    st_tool_calls tc;
    const char *xml = "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n"
                      "</parameter>\n<parameter=zip>\n94110\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
                      "</function>\n</tool_call>";
    int ok = st_toolcall_parse(xml, strlen(xml), tools, &tc);
    CHECK(ok && tc.n == 1 && !strcmp(tc.calls[0].name, "get_weather") && tc.content && !strcmp(tc.content, "I will check.") &&
              args_equal(tc.calls[0].arguments,
                         "{\"city\":\"San Francisco\",\"days\":3,\"metric\":true,\"opts\":{\"a\":[1,2]},\"zip\":\"94110\","
                         "\"note\":\"line one\\nline two\"}"),
          "Qwen3.5 XML call: typed by the schema (integer, boolean, object; string stays string; multi-line text) %s",
          ok ? tc.calls[0].arguments : "");
    st_tool_calls_free(&tc);
    const char *json2 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>";
    ok = st_toolcall_parse(json2, strlen(json2), tools, &tc);
    CHECK(ok && tc.n == 2 && !tc.content && args_equal(tc.calls[0].arguments, "{\"city\":\"Paris\"}") &&
              !strcmp(tc.calls[1].name, "get_time") && args_equal(tc.calls[1].arguments, "{\"tz\":\"CET\"}"),
          "Qwen3 JSON calls: two in a row, arguments as an object or as JSON text");
    st_tool_calls_free(&tc);
    const char *open_end = "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n";
    ok = st_toolcall_parse(open_end, strlen(open_end), tools, &tc);
    CHECK(ok && tc.n == 1 && args_equal(tc.calls[0].arguments, "{\"days\":2}"), "a call cut off before </function> is still read");
    st_tool_calls_free(&tc);
    const char *untyped = "<tool_call><function=other><parameter=n>7</parameter></function></tool_call>";
    ok = st_toolcall_parse(untyped, strlen(untyped), tools, &tc);
    CHECK(ok && args_equal(tc.calls[0].arguments, "{\"n\":\"7\"}"), "parameters of an unknown tool stay strings");
    st_tool_calls_free(&tc);
    const char *bad[] = {"no call here", "<tool_call>\nnot json or xml\n</tool_call>", "<tool_call>{\"arguments\":{}}</tool_call>",
                         "<tool_call><function=>x</function></tool_call>", "<tool_call></tool_call>"};
    int all_plain = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        all_plain &= st_toolcall_parse(bad[i], strlen(bad[i]), tools, &tc) == 0 && tc.n == 0;
        st_tool_calls_free(&tc);
    }
    CHECK(all_plain, "text that is not a well-formed call stays plain content");
    json_decref(tools);
}

static st_oai_defaults defaults(void) {
    st_oai_defaults d = {0};
    d.sampling = st_sampling_default();
    d.sampling.temperature = 0.7f;
    d.max_tokens_completion = 16;
    d.model_name = "m";
    return d;
}

static void test_requests(void) {
    st_oai_defaults d = defaults();
    st_oai_request r;
    st_oai_error e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"system\","
        "\"content\":[{\"type\":\"text\",\"text\":\"Use \"},{\"type\":\"text\",\"text\":\"metric.\"}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"max_completion_tokens\":50,\"top_k\":-1,\"seed\":-5,\"stop\":\"END\",\"logprobs\":true,\"top_logprobs\":3,"
        "\"reasoning_effort\":\"low\",\"chat_template_kwargs\":{\"custom\":1},\"logit_bias\":{\"17\":-100}}";
    st_status st = st_oai_parse(ST_OAI_CHAT, body, strlen(body), &d, &r, &e);
    if (CHECK(st == ST_OK, "a full chat request parses (%s)", e.message)) {
        json_t *m0 = json_array_get(r.messages, 0), *m2 = json_array_get(r.messages, 2);
        json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(m2, "tool_calls"), 0), "function"), "arguments");
        CHECK(json_array_size(r.messages) == 4 && !strcmp(json_string_value(json_object_get(m0, "role")), "system") &&
                  !strcmp(json_string_value(json_object_get(m0, "content")), "Be brief.\n\nUse metric.") &&
                  !strcmp(json_string_value(json_object_get(json_array_get(r.messages, 1), "content")), "Hi"),
              "developer and system messages merge into one leading system message; text parts become strings");
        CHECK(json_is_object(args) && json_integer_value(json_object_get(args, "x")) == 1 &&
                  json_is_null(json_object_get(m2, "content")),
              "assistant tool-call arguments given as JSON text become an object for the template");
        CHECK(r.stream && r.include_usage && r.params.max_tokens == 50 && r.params.sampling.top_k == 0 &&
                  r.params.sampling.has_seed && r.params.n_stop == 1 && !strcmp(r.params.stop[0], "END") &&
                  r.params.logprobs == 3 && r.params.sampling.temperature == 0.7f && r.params.sampling.n_bias == 1,
              "sampling, stop, logprobs and defaults carried over");
        CHECK(json_is_true(json_object_get(r.kwargs, "enable_thinking")) && json_integer_value(json_object_get(r.kwargs, "custom")) == 1 &&
                  json_is_true(json_object_get(r.kwargs, "add_generation_prompt")),
              "reasoning_effort and chat_template_kwargs become template keywords");
        st_oai_request_free(&r);
    }
    struct {
        const char *body;
        int status;
        const char *param;
    } bad[] = {
        {"{\"model\":\"other\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", 400, "stream_options"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400, "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"always\"}", 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\"}}", 400, "response_format"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", 400, "response_format"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":\"json\"}", 400, "response_format"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", 400, "stop"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"[1\"}}]}]}", 400, "messages[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"max\"}", 400, "reasoning_effort"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", 400, "top_p"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"a\":1,\"a\":2}", 400, ""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"f\"}]}", 400, "functions"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"function_call\":\"auto\"}", 400, "function_call"},
    };
    int all = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st = st_oai_parse(ST_OAI_CHAT, bad[i].body, strlen(bad[i].body), &d, &r, &e);
        int ok = st == ST_ERR_ARG && e.status == bad[i].status && !strcmp(e.param, bad[i].param);
        if (!ok) printf("# case %zu: status %d param '%s' (%s)\n", i, e.status, e.param, e.message);
        all &= ok;
    }
    CHECK(all, "bad chat requests (legacy functions/function_call too): the right status and the offending parameter named");
    {
        const char *jb = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}";
        const char *jc = "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}";
        st_oai_request rj, rc;
        st_oai_error ej, ec;
        const st_status sj = st_oai_parse(ST_OAI_CHAT, jb, strlen(jb), &d, &rj, &ej);
        const st_status sc = st_oai_parse(ST_OAI_COMPLETION, jc, strlen(jc), &d, &rc, &ec);
        CHECK(sj == ST_OK && rj.params.json_mode == 1 && sc == ST_OK && rc.params.json_mode == 1,
              "response_format json_object asks for a JSON-object reply on chat and completions");
        if (sj == ST_OK) st_oai_request_free(&rj);
        if (sc == ST_OK) st_oai_request_free(&rc);
    }
    const char *late = "{\"messages\":[{\"role\":\"system\",\"content\":\"A\"},{\"role\":\"developer\",\"content\":\"B\"},"
                       "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"system\",\"content\":\"late\"}]}";
    st = st_oai_parse(ST_OAI_CHAT, late, strlen(late), &d, &r, &e);
    CHECK(st == ST_OK && json_array_size(r.messages) == 3 &&
              !strcmp(json_string_value(json_object_get(json_array_get(r.messages, 0), "content")), "A\n\nB") &&
              !strcmp(json_string_value(json_object_get(json_array_get(r.messages, 2), "role")), "system") &&
              !strcmp(json_string_value(json_object_get(json_array_get(r.messages, 2), "content")), "late"),
          "the opening system messages merge; a later one stays in place for the template to judge");
    if (st == ST_OK) st_oai_request_free(&r);
    const char nul[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}";
    st = st_oai_parse(ST_OAI_CHAT, nul, sizeof nul - 1, &d, &r, &e);
    CHECK(st == ST_ERR_ARG && e.status == 400 && !strstr(e.message, "JSON_") && strstr(e.message, "NUL"),
          "a NUL character in the JSON is named as such, not by a library flag (%s)", e.message);
    const char *comp = "{\"prompt\":[\"hello\"],\"logprobs\":2,\"echo\":false}";
    st = st_oai_parse(ST_OAI_COMPLETION, comp, strlen(comp), &d, &r, &e);
    CHECK(st == ST_OK && r.prompt && !strcmp(r.prompt, "hello") && r.params.max_tokens == 16 && r.params.logprobs == 2,
          "a completions request: [\"text\"] prompt, default max_tokens 16, legacy logprobs");
    st_oai_request_free(&r);
    const char *multi = "{\"prompt\":[\"a\",\"b\"]}";
    CHECK(st_oai_parse(ST_OAI_COMPLETION, multi, strlen(multi), &d, &r, &e) == ST_ERR_ARG && e.status == 400,
          "several prompts in one request are refused: %s", e.message);
    char *ej = st_oai_error_json(&e);
    json_t *ejo = json_loads(ej, 0, NULL);
    json_t *eo = json_object_get(ejo, "error");
    CHECK(json_is_string(json_object_get(eo, "message")) && json_is_string(json_object_get(eo, "type")) &&
              json_object_get(eo, "param") && json_object_get(eo, "code"),
          "error bodies have message, type, param and code");
    json_decref(ejo);
    free(ej);
    CHECK(st_oai_json_depth("{\"a\":\"[[[[\",\"b\":[[1]]}", 22, 64) == 3, "depth counting ignores brackets inside strings");
}

/* the inbox ring: a producer thread's records arrive whole and in order, across wrap-arounds,
 * with the producer refused (never blocked) while the ring is full */
typedef struct inbox_run {
    st_inbox ib;
    int n;
    long refused;
} inbox_run;

static size_t rec_len(int i) { return (size_t)((i * 7919) % 300); }

static void *inbox_producer(void *arg) {
    inbox_run *r = arg;
    unsigned char buf[400];
    for (int i = 0; i < r->n;) {
        size_t n = rec_len(i);
        for (size_t j = 0; j < n; j++) buf[j] = (unsigned char)(i + j);
        uint32_t tag = (uint32_t)i;
        const void *parts[2] = {&tag, buf};
        size_t lens[2] = {4, n};
        if (st_inbox_put(&r->ib, parts, lens, 2)) i++;
        else r->refused++;
    }
    return NULL;
}

static void test_inbox(void) {
    inbox_run r = {.n = 20000};
    st_error err = {0};
    if (!CHECK(st_inbox_init(&r.ib, 1000, &err) == ST_OK, "an inbox of 1000 bytes")) return;
    CHECK(st_inbox_next_len(&r.ib) == -1 && st_inbox_room(&r.ib) >= 900, "empty, with room (%zu)", st_inbox_room(&r.ib));
    pthread_t th;
    pthread_create(&th, NULL, inbox_producer, &r);
    unsigned char got[400];
    int ok = 1, seen = 0;
    while (seen < r.n && ok) {
        int64_t len = st_inbox_take(&r.ib, got, sizeof got);
        if (len == -1) continue;
        uint32_t tag;
        memcpy(&tag, got, 4);
        ok = len == (int64_t)(4 + rec_len(seen)) && tag == (uint32_t)seen;
        for (size_t j = 0; ok && j < rec_len(seen); j++) ok = got[4 + j] == (unsigned char)(seen + j);
        seen++;
    }
    pthread_join(th, NULL);
    CHECK(ok && seen == r.n && st_inbox_next_len(&r.ib) == -1,
          "%d records of 4-303 bytes through a 1000-byte ring, whole and in order (the producer refused %ld times "
          "while it was full)",
          seen, r.refused);
    const void *parts[1] = {got};
    size_t big = 2000;
    CHECK(!st_inbox_put(&r.ib, parts, &big, 1), "a record larger than the ring is refused");
    size_t small = 10;
    st_inbox_put(&r.ib, parts, &small, 1);
    CHECK(st_inbox_take(&r.ib, got, 4) == -2 && st_inbox_take(&r.ib, got, sizeof got) == 10,
          "a record larger than the reader's buffer stays until a larger one is given");
    st_inbox_free(&r.ib);
}

/* image_url parts: data URLs decoded in order, the template's content as parts, the refusals */
static void test_images(void) {
    st_oai_defaults d = defaults();
    d.max_images = 2;
    st_oai_request r;
    st_oai_error e;
    /* "hello" and "ab" in base64, with and without padding; detail is accepted */
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
                       "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,aGVsbG8=\",\"detail\":\"low\"}},"
                       "{\"type\":\"text\",\"text\":\"B\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/jpeg;base64,YWI\"}}]}]}";
    st_status st = st_oai_parse(ST_OAI_CHAT, body, strlen(body), &d, &r, &e);
    if (CHECK(st == ST_OK, "a user message with two data-URL images parses (%s)", e.message)) {
        json_t *c = json_object_get(json_array_get(r.messages, 0), "content");
        const char *t0 = json_string_value(json_object_get(json_array_get(c, 0), "type"));
        const char *t1 = json_string_value(json_object_get(json_array_get(c, 1), "type"));
        CHECK(r.n_images == 2 && r.image_lens[0] == 5 && !memcmp(r.images[0], "hello", 5) && r.image_lens[1] == 2 &&
                  !memcmp(r.images[1], "ab", 2) && json_array_size(c) == 4 && t0 && !strcmp(t0, "text") && t1 &&
                  !strcmp(t1, "image"),
              "their bytes in order, and the template's content as text and image parts in order");
        st_oai_request_free(&r);
    }
    struct {
        const char *url, *want;
    } bad[] = {
        {"https://example.com/a.png", "not fetched"},
        {"file:///etc/passwd", "--allowed-local-media-path"},
        {"data:image/png,raw", "data: URL"},
        {"data:image/png;base64,!!!!", "not valid base64"},
        {"data:image/png;base64,a", "not valid base64"},
    };
    int all = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char b[512];
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}]}]}",
                 bad[i].url);
        st = st_oai_parse(ST_OAI_CHAT, b, strlen(b), &d, &r, &e);
        int ok = st == ST_ERR_ARG && e.status == 400 && strstr(e.message, bad[i].want);
        if (!ok) printf("# %s: %s\n", bad[i].url, e.message);
        all &= ok;
    }
    CHECK(all, "remote, local, raw and broken image URLs: each a 400 saying why");
    const char *three = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"data:a;base64,YQ==\"},"
                        "{\"type\":\"image_url\",\"image_url\":\"data:a;base64,YQ==\"},{\"type\":\"image_url\",\"image_url\":\"data:a;base64,YQ==\"}]}]}";
    st = st_oai_parse(ST_OAI_CHAT, three, strlen(three), &d, &r, &e);
    CHECK(st == ST_ERR_ARG && strstr(e.message, "at most 2"), "a third image over a limit of 2: %s", e.message);
    const char *asst = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"image_url\","
                       "\"image_url\":\"data:a;base64,YQ==\"}]}]}";
    st = st_oai_parse(ST_OAI_CHAT, asst, strlen(asst), &d, &r, &e);
    CHECK(st == ST_ERR_ARG && strstr(e.message, "user messages"), "an image in an assistant message: %s", e.message);
}

/* file:// image URLs: read only under the allowed directory, by real path */
static int parse_url(const st_oai_defaults *d, const char *url, st_oai_request *r, st_oai_error *e) {
    char b[1200];
    snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"%s\"}}]}]}",
             url);
    e->message[0] = 0;
    return st_oai_parse(ST_OAI_CHAT, b, strlen(b), d, r, e) == ST_OK;
}

static void test_local_images(void) {
    char tmpl[] = "/tmp/strand-media-XXXXXX";
    char *base = mkdtemp(tmpl);
    if (!CHECK(base != NULL, "a scratch directory")) return;
    char dir[300], p[400], out[400], url[500];
    snprintf(dir, sizeof dir, "%s/media", base);
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/sub", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/a.png", dir);
    st_file_write(p, "PIXELS", 6, NULL);
    snprintf(out, sizeof out, "%s/secret.png", base);
    st_file_write(out, "SECRET", 6, NULL);
    snprintf(p, sizeof p, "%s/link.png", dir);
    CHECK(symlink(out, p) == 0, "a link inside pointing outside");
    char *real = realpath(dir, NULL);
    st_oai_defaults d = defaults();
    d.max_images = 4;
    st_oai_request r;
    st_oai_error e;
    snprintf(url, sizeof url, "file://%s/a.png", dir);
    CHECK(!parse_url(&d, url, &r, &e) && e.status == 400 && strstr(e.message, "--allowed-local-media-path"),
          "without a media directory file:// is refused: %s", e.message);
    d.media_dir = real;
    if (CHECK(parse_url(&d, url, &r, &e), "a file under the media directory is read (%s)", e.message)) {
        CHECK(r.n_images == 1 && r.image_lens[0] == 6 && !memcmp(r.images[0], "PIXELS", 6), "its bytes");
        st_oai_request_free(&r);
    }
    struct {
        const char *path, *want;
    } bad[] = {{"/../secret.png", "outside"}, {"/link.png", "outside"}, {"/missing.png", "does not exist"},
               {"/sub", "cannot be read"}};
    int all = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(url, sizeof url, "file://%s%s", dir, bad[i].path);
        const int ok = !parse_url(&d, url, &r, &e) && e.status == 400 && strstr(e.message, bad[i].want);
        if (!ok) printf("# %s: %s\n", url, e.message);
        all &= ok;
    }
    CHECK(all, "outside by .., outside by a link, missing, a directory: each a 400 saying why");
    CHECK(!parse_url(&d, "file://media/a.png", &r, &e) && strstr(e.message, "absolute"), "a relative file:// URL: %s",
          e.message);
    d.max_image_bytes = 5;
    snprintf(url, sizeof url, "file://%s/a.png", dir);
    CHECK(!parse_url(&d, url, &r, &e) && strstr(e.message, "cannot be read"), "a file over the image size limit: %s",
          e.message);
    free(real);
    remove(p);
    snprintf(p, sizeof p, "%s/a.png", dir);
    remove(p);
    snprintf(p, sizeof p, "%s/sub", dir);
    rmdir(p);
    rmdir(dir);
    remove(out);
    rmdir(base);
}

int main(void) {
    test_inbox();
    test_local_images();
    test_toolcalls();
    test_requests();
    test_images();
    return tap_done();
}
