/* ==== libFuzzer target: compile and render arbitrary template text ====
 *
 * Any byte string is a template: it must compile or fail with a status, and render or fail
 * with a status, within the limits below, without crashes, leaks, undefined behaviour or
 * hangs. The context is fixed and small but covers the shapes chat templates see (messages
 * with string/list/null content, tool calls, tools, flags, special tokens).
 * Build: make fuzz; run: build/fuzz/fuzz_template fuzz/corpus/fuzz_template
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "template/template.h"

static const char *const context_json =
    "{\"messages\":["
    "{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Hi <b> \\u00e9 \\u65e5\\n\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>\\nx\\n</think>\\n\\nok\",\"reasoning_content\":\"r\","
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[1.5,null,true]}}}]},"
    "{\"role\":\"tool\",\"content\":\"{\\\"t\\\": 21}\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"see\"}]},"
    "{\"role\":\"assistant\",\"content\":null}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}],"
    "\"documents\":null,\"add_generation_prompt\":true,\"enable_thinking\":false,"
    "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"n\":3,\"x\":2.5,\"s\":\"a b  c\",\"d\":{\"k\":\"v\",\"n\":{}}}";

static json_t *context;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!context) context = json_loads(context_json, 0, NULL);
    st_tmpl_params p = st_tmpl_default_params();
    p.max_output = (size_t)1 << 20;
    p.max_memory = (size_t)64 << 20;
    p.max_loop_iters = 20000;
    p.max_steps = 300000;
    p.max_call_depth = 40;
    p.max_nesting = 100;
    p.fixed_time = 1700000000;
    st_tmpl *t = NULL;
    st_error err;
    if (st_tmpl_compile((const char *)data, size, &p, &t, &err) != ST_OK) return 0;
    char *out = NULL;
    size_t n = 0;
    if (st_tmpl_render(t, context, &out, &n, &err) == ST_OK) free(out);
    st_tmpl_free(t);
    return 0;
}
