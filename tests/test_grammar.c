/* ==== The JSON automaton and its token masks (grammar/grammar.h) ====
 * Documents the automaton must take whole, and ones it must refuse; random JSON written
 * here and fed byte by byte; random replies built from the masks over a real tokenizer's
 * 151k tokens (each complete one parses with jansson, and a JSON-object reply is an object);
 * every mask bit equals feeding that token's bytes; the masks' cost. */
#include <jansson.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "grammar/grammar.h"
#include "server/toolcall.h"
#include "tap.h"

/* the random replies' counts are divided by this (STRAND_TEST_SCALE, at most 3: the sanitizer's run) */
static int reps_div = 1;

static int whole(st_gram_mode mode, const char *s) {
    st_gram_state g;
    st_gram_init(&g, mode);
    return st_gram_feed(&g, NULL, s, strlen(s)) && st_gram_done(&g);
}

static void test_documents(void) {
    static const char *const good[] = {
        "{}", " {\"a\": 1}", "{\"a\":[1,2.5,-3e+2,0,true,false,null,\"x\"],\"b\":{\"c\":{}}}",
        "{\"k\\\"\\\\\\/\\b\\f\\n\\r\\t\":\"\\u00e9\\ud83d\\ude00\"}", "{\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\":0.5}",
        "{\"n\":-0.0e-0}", "{ \"a\" :\n [ ] }",
    };
    static const char *const bad[] = {
        "[1]", "\"x\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}",
        "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12g4\"}", "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}", "{\"a\":\"\\u0000\"}", "{\"\xc0\xaf\":1}", "{\"\xed\xa0\x80\":1}", "{\"\xe0\x80\xaf\":1}",
        "{\"\x80\":1}", "{} ", "{}x", "{\"a\":1 2}", "{\"a\":[1 2]}", "{\"a\":1]", "{'a':1}",
        "{\"a\":1234567890123456}", "{\"a\":1e100}",
    };
    int ok_good = 1, ok_bad = 1;
    const char *first_good = NULL, *first_bad = NULL;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!whole(ST_GRAM_JSON_OBJECT, good[i])) ok_good = 0, first_good = first_good ? first_good : good[i];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_JSON_OBJECT);
        if (st_gram_feed(&g, NULL, bad[i], strlen(bad[i])) && st_gram_done(&g)) ok_bad = 0, first_bad = first_bad ? first_bad : bad[i];
    }
    CHECK(ok_good, "JSON-object mode takes %zu documents whole (first refused: %s)", sizeof good / sizeof good[0],
          first_good ? first_good : "none");
    CHECK(ok_bad, "and refuses %zu that are not one JSON object or are cut (first taken: %s)", sizeof bad / sizeof bad[0],
          first_bad ? first_bad : "none");
    CHECK(whole(ST_GRAM_JSON_VALUE, "[1,\"x\"]") && whole(ST_GRAM_JSON_VALUE, "\"s\"") &&
              whole(ST_GRAM_JSON_VALUE, "12 ") && whole(ST_GRAM_JSON_VALUE, "null") && !whole(ST_GRAM_JSON_VALUE, "12"),
          "any-value mode takes arrays, strings, literals, and a number ended by a space");
    char deep[2 * ST_GRAM_MAX_DEPTH + 8];
    size_t n = 0;
    deep[n++] = '{', deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"', deep[n++] = ':';
    for (int i = 0; i < ST_GRAM_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n] = 0;
    st_gram_state g;
    st_gram_init(&g, ST_GRAM_JSON_OBJECT);
    CHECK(!st_gram_feed(&g, NULL, deep, n), "nesting beyond %d containers is refused", ST_GRAM_MAX_DEPTH);
    st_gram_init(&g, ST_GRAM_JSON_OBJECT);
    const char *ws = "{                 \"a\":1}";
    CHECK(!st_gram_feed(&g, NULL, ws, strlen(ws)), "a run of more than %d whitespace bytes is refused", ST_GRAM_MAX_WS);
}

/* ---- random JSON written here ---- */

typedef struct rng {
    uint64_t s;
} rng;
static uint64_t next(rng *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
static int below(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }

static void put(char *buf, size_t *n, size_t cap, const char *s) {
    size_t l = strlen(s);
    if (*n + l < cap) memcpy(buf + *n, s, l), *n += l;
}

static void random_value(rng *r, char *buf, size_t *n, size_t cap, int depth) {
    static const char *const strs[] = {"\"\"", "\"ab c\"", "\"\\n\\\"\\\\\"", "\"\\u00e9\"", "\"\xe6\x97\xa5\xe6\x9c\xac\"",
                                       "\"\\ud83d\\ude00\""};
    static const char *const nums[] = {"0", "-1", "3.25", "1e5", "-0.5E-3", "123456789012345"};
    static const char *const ws[] = {"", " ", "\n", "  ", "\t"};
    const int k = depth > 5 ? below(r, 4) : below(r, 6);
    put(buf, n, cap, ws[below(r, 5)]);
    if (k == 0) put(buf, n, cap, strs[below(r, 6)]);
    else if (k == 1) put(buf, n, cap, nums[below(r, 6)]);
    else if (k == 2) put(buf, n, cap, below(r, 2) ? "true" : "null");
    else if (k == 3) put(buf, n, cap, "false");
    else if (k == 4) {
        put(buf, n, cap, "[");
        const int m = below(r, 4);
        for (int i = 0; i < m; i++) {
            if (i) put(buf, n, cap, ",");
            random_value(r, buf, n, cap, depth + 1);
        }
        put(buf, n, cap, "]");
    } else {
        put(buf, n, cap, "{");
        const int m = below(r, 4);
        for (int i = 0; i < m; i++) {
            if (i) put(buf, n, cap, ",");
            put(buf, n, cap, ws[below(r, 5)]);
            put(buf, n, cap, strs[below(r, 6)]);
            put(buf, n, cap, ws[below(r, 5)]);
            put(buf, n, cap, ":");
            random_value(r, buf, n, cap, depth + 1);
        }
        put(buf, n, cap, "}");
    }
    put(buf, n, cap, ws[below(r, 5)]);
}

static void test_random_documents(void) {
    rng r = {0x9e3779b97f4a7c15ull};
    int ok = 1, cut_ok = 1, docs = 0;
    for (int i = 0; i < 2000; i++) {
        char buf[8192];
        size_t n = 0;
        put(buf, &n, sizeof buf, "{\"k\":");
        random_value(&r, buf, &n, sizeof buf - 2, 0);
        buf[n++] = '}';
        buf[n] = 0;
        json_error_t je;
        json_t *j = json_loads(buf, 0, &je);
        if (!j) continue; /* cut at the buffer's end */
        json_decref(j);
        docs++;
        if (!whole(ST_GRAM_JSON_OBJECT, buf)) ok = 0;
        /* every proper prefix is taken, never complete */
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_JSON_OBJECT);
        for (size_t p = 0; p + 1 < n && cut_ok; p++) cut_ok = st_gram_feed(&g, NULL, buf + p, 1) && !st_gram_done(&g);
    }
    CHECK(ok && docs > 1900, "%d random documents jansson parses are taken whole", docs);
    CHECK(cut_ok, "and each of their proper prefixes is taken but not complete");
}

/* ---- masks over a real vocabulary ---- */

/* every token's byte length (0: none), for drawing short tokens */
static uint32_t *token_lengths(const st_tokenizer *tok, int64_t V) {
    uint32_t *l = calloc((size_t)V, sizeof *l);
    for (int64_t t = 0; l && t < V && t < st_tok_vocab_size(tok); t++) {
        size_t n = 0;
        if (st_tok_token_bytes(tok, (int32_t)t, &n)) l[t] = (uint32_t)n;
    }
    return l;
}

static void test_masks(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", tap_data_dir());
    st_tokenizer *tok = NULL;
    st_error err = {0};
    if (!CHECK(st_tok_load(path, &tok, &err) == ST_OK, "the qwen3 tokenizer loads (%s)", err.msg)) return;
    const int64_t V = st_tok_vocab_size(tok) + 64; /* a model's vocabulary may be larger */
    st_gram_vocab *v = NULL;
    const double t0 = st_now_s();
    const st_status vst = st_gram_vocab_create(tok, V, &v, &err);
    const double build_ms = (st_now_s() - t0) * 1e3;
    if (!CHECK(vst == ST_OK, "a grammar vocabulary of %lld tokens (%.0f ms)", (long long)V, build_ms)) {
        st_tok_free(tok);
        return;
    }
    const size_t W = st_gram_mask_words(v);
    uint32_t *mask = malloc(W * sizeof *mask);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    uint32_t *tlen = token_lengths(tok, V);
    rng r = {12345};
    int replies = 0, complete = 0, parsed = 0, objects = 0, agree = 1, special_ok = 1;
    double mask_s = 0;
    int64_t masks = 0;
    for (int rep = 0; rep < 40; rep++) {
        st_gram_state g;
        st_gram_init(&g, rep % 2 ? ST_GRAM_JSON_VALUE : ST_GRAM_JSON_OBJECT);
        char text[16384];
        size_t n = 0;
        replies++;
        for (int step = 0; step < 300 && !st_gram_done(&g); step++) {
            double a = st_now_s();
            const int64_t count = st_gram_mask(v, NULL, &g, mask);
            mask_s += st_now_s() - a;
            masks++;
            int64_t na = 0, short_n = 0;
            for (size_t w = 0; w < W; w++)
                for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed[na++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(bits));
            if (na != count || na == 0) {
                agree = 0;
                break;
            }
            /* a sample of bits against feeding the token's bytes */
            for (int k = 0; k < 300; k++) {
                const int32_t t = (int32_t)below(&r, (int)V);
                st_gram_state s = g;
                const int fits = st_gram_advance(v, NULL, &s, t);
                if (fits != (int)(mask[t / 32] >> (t % 32) & 1u)) agree = 0;
                if ((st_tok_is_added(tok, t) || t >= st_tok_vocab_size(tok)) && (mask[t / 32] >> (t % 32) & 1u)) special_ok = 0;
            }
            /* half the time a short token, so that strings and containers close */
            for (int64_t i = 0; i < na; i++)
                if (tlen[allowed[i]] <= 2) allowed[short_n++] = allowed[i];
            const int32_t t = below(&r, 2) && short_n ? allowed[below(&r, (int)short_n)] : allowed[below(&r, (int)na)];
            size_t len = 0;
            const char *b = st_tok_token_bytes(tok, t, &len);
            if (!st_gram_advance(v, NULL, &g, t)) {
                agree = 0;
                break;
            }
            if (n + len < sizeof text) memcpy(text + n, b, len), n += len;
        }
        if (!st_gram_done(&g)) continue;
        complete++;
        text[n] = 0;
        json_error_t je;
        json_t *j = json_loadb(text, n, JSON_DECODE_ANY, &je);
        if (j) {
            parsed++;
            objects += json_is_object(j) || rep % 2;
            json_decref(j);
        } else {
            printf("# did not parse: %s (%s)\n", text, je.text);
        }
    }
    CHECK(agree, "every mask bit sampled equals feeding that token's bytes; the masks never empty");
    CHECK(special_ok, "special and added tokens, and ids past the tokenizer's, are never allowed");
    CHECK(complete >= 10 && parsed == complete && objects == complete,
          "of %d random replies drawn from the masks, %d completed: each parses with jansson, the JSON-object ones as objects",
          replies, complete);
    printf("# %lld masks, %.1f us each on average (the walk and the string fast path)\n", (long long)masks,
           masks ? mask_s / (double)masks * 1e6 : 0.0);
    /* the fast path inside strings (a key; values in an array and in nested objects, where a
     * closing quote may close containers too) equals feeding every token */
    static const char *const inside[] = {"{\"ab", "{\"a\":[\"x", "{\"a\":{\"b\":\"c", "{\"a\":[{\"b\":[\"\\u00e9",
                                         "{\"a\":\"\\u", "{\"a\":\"\\u00e", "{\"a\":[\"\\ud83d\\u", "{\"a\":\"\\ud8",
                                         "{\"\\u0", "{\"a\":\"\xe6\x97"};
    uint32_t *walked = calloc(W, sizeof *walked);
    int same = 1;
    int64_t fast = 0;
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++) {
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_JSON_OBJECT);
        st_gram_feed(&g, NULL, inside[i], strlen(inside[i]));
        memset(walked, 0, W * sizeof *walked);
        fast = st_gram_mask(v, NULL, &g, mask);
        int64_t slow = 0;
        for (int64_t t = 0; t < V; t++) {
            st_gram_state s = g;
            if (st_gram_advance(v, NULL, &s, t)) walked[t / 32] |= 1u << (t % 32), slow++;
        }
        same &= fast == slow && !memcmp(walked, mask, W * sizeof *mask);
    }
    CHECK(same, "inside strings (keys, array and nested values, \\u escapes, mid-character) the precomputed masks equal feeding every token (%lld allowed in the last)",
          (long long)fast);
    free(walked);
    free(mask);
    free(allowed);
    free(tlen);
    st_gram_vocab_free(v);
    st_tok_free(tok);
}

/* ---- schemas ---- */

/* a validator of the subset, for the tests: 1 when v satisfies schema sc (defs: the root's) */
static int valid(json_t *v, json_t *sc, json_t *defs) {
    if (json_is_true(sc) || (json_is_object(sc) && json_object_size(sc) == 0)) return 1;
    json_t *ref = json_object_get(sc, "$ref");
    if (ref) return valid(v, json_object_get(defs, json_string_value(ref) + 8), defs);
    json_t *en = json_object_get(sc, "enum");
    if (en) {
        size_t i;
        json_t *e;
        json_array_foreach(en, i, e) if (json_equal(e, v)) return 1;
        return 0;
    }
    json_t *any = json_object_get(sc, "anyOf");
    if (any) {
        size_t i;
        json_t *a;
        int n = 0;
        json_array_foreach(any, i, a) n += valid(v, a, defs);
        return n == 1;
    }
    json_t *ty = json_object_get(sc, "type");
    if (json_is_array(ty)) {
        size_t i;
        json_t *t;
        json_array_foreach(ty, i, t) {
            json_t *one = json_deep_copy(sc);
            json_object_set(one, "type", t);
            const int ok = valid(v, one, defs);
            json_decref(one);
            if (ok) return 1;
        }
        return 0;
    }
    const char *t = json_string_value(ty);
    if (!t) return 1;
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return 0;
        json_t *mn = json_object_get(sc, "minLength"), *mx = json_object_get(sc, "maxLength");
        long chars = 0;
        for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++) chars += (*p & 0xc0) != 0x80;
        json_t *pt = json_object_get(sc, "pattern"); /* (the tests' patterns read the same in POSIX EREs) */
        if (pt) {
            regex_t rx;
            if (regcomp(&rx, json_string_value(pt), REG_EXTENDED | REG_NOSUB)) return 0;
            const int m = regexec(&rx, json_string_value(v), 0, NULL, 0) == 0;
            regfree(&rx);
            if (!m) return 0;
        }
        return (!mn || chars >= json_integer_value(mn)) && (!mx || chars <= json_integer_value(mx));
    }
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "number")) {
        if (!json_is_number(v)) return 0;
        const double x = json_number_value(v);
        json_t *mn = json_object_get(sc, "minimum"), *mx = json_object_get(sc, "maximum");
        json_t *xmn = json_object_get(sc, "exclusiveMinimum"), *xmx = json_object_get(sc, "exclusiveMaximum");
        return (!mn || x >= json_number_value(mn)) && (!mx || x <= json_number_value(mx)) &&
               (!xmn || x > json_number_value(xmn)) && (!xmx || x < json_number_value(xmx));
    }
    if (!strcmp(t, "integer")) {
        json_t *mn = json_object_get(sc, "minimum"), *mx = json_object_get(sc, "maximum");
        return json_is_integer(v) && (!mn || json_integer_value(v) >= json_integer_value(mn)) &&
               (!mx || json_integer_value(v) <= json_integer_value(mx));
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        json_t *mn = json_object_get(sc, "minItems"), *mx = json_object_get(sc, "maxItems");
        const json_int_t n = (json_int_t)json_array_size(v);
        if ((mn && n < json_integer_value(mn)) || (mx && n > json_integer_value(mx))) return 0;
        json_t *it = json_object_get(sc, "items"), *e;
        size_t i;
        json_array_foreach(v, i, e) if (it && !valid(e, it, defs)) return 0;
        return 1;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        json_t *props = json_object_get(sc, "properties"), *req = json_object_get(sc, "required"), *e;
        json_t *extra = json_object_get(sc, "additionalProperties");
        size_t i;
        json_array_foreach(req, i, e) if (!json_object_get(v, json_string_value(e))) return 0;
        const char *k;
        json_object_foreach(v, k, e) {
            json_t *ps = json_object_get(props, k);
            if (ps && !valid(e, ps, defs)) return 0;
            if (!ps && json_is_false(extra)) return 0;
            if (!ps && json_is_object(extra) && !valid(e, extra, defs)) return 0;
        }
        return 1;
    }
    return 0;
}

static const char *const schema_a =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":3},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\",3,null,30]},\"opt\":{\"type\":[\"number\",\"null\"]},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"kind\"],\"additionalProperties\":false}";
static const char *const schema_list =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":-3},"
    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],"
    "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";

static int takes(const st_gram_schema *sc, const char *doc) {
    st_gram_state g;
    st_gram_init(&g, ST_GRAM_JSON_SCHEMA);
    return st_gram_feed(&g, sc, doc, strlen(doc)) && st_gram_done(&g);
}

static void test_schema_documents(void) {
    st_gram_schema *a = NULL, *l = NULL;
    st_error err = {0};
    if (!CHECK(st_gram_schema_compile(schema_a, strlen(schema_a), 1, &a, &err) == ST_OK, "a flat schema compiles (%s)", err.msg))
        return;
    if (!CHECK(st_gram_schema_compile(schema_list, strlen(schema_list), 1, &l, &err) == ST_OK,
               "a recursive schema ($defs, $ref, anyOf) compiles (%s)", err.msg)) {
        st_gram_schema_free(a);
        return;
    }
    static const char *const good_a[] = {
        "{\"name\":\"x\",\"age\":3,\"kind\":\"cat\"}", "{\"age\":150,\"name\":\"\",\"kind\":3,\"tags\":[\"a\"]}",
        "{\"name\":\"a\",\"age\":0,\"kind\":null,\"opt\":-1.5e3}", "{ \"name\" : \"a\", \"age\": 12, \"kind\": 30, \"ok\": true }",
        "{\"name\":\"a\",\"age\":12,\"kind\":\"dog\",\"opt\":null,\"tags\":[\"a\",\"b\",\"c\"]}",
    };
    static const char *const bad_a[] = {
        "{\"name\":\"x\",\"age\":3}", "{\"name\":\"x\",\"age\":3,\"kind\":\"cat\",\"zzz\":1}", "{\"name\":\"x\",\"age\":151,\"kind\":3}",
        "{\"name\":\"x\",\"age\":-1,\"kind\":3}", "{\"name\":\"x\",\"age\":1.5,\"kind\":3}", "{\"name\":\"x\",\"age\":1,\"kind\":3,\"tags\":[]}",
        "{\"name\":\"x\",\"age\":1,\"kind\":3,\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", "{\"name\":\"x\",\"age\":1,\"kind\":\"cow\"}",
        "{\"name\":\"x\",\"age\":1,\"kind\":33}", "{\"name\":\"x\",\"name\":\"y\",\"age\":1,\"kind\":3}", "{\"name\":5,\"age\":1,\"kind\":3}",
        "{\"name\":\"x\",\"age\":1,\"kind\":3,\"ok\":null}", "{\"name\":\"x\",\"age\":1,\"kind\":3,\"tags\":[1]}", "[]",
    };
    int ga = 1, ba = 1;
    const char *fg = NULL, *fb = NULL;
    for (size_t i = 0; i < sizeof good_a / sizeof good_a[0]; i++)
        if (!takes(a, good_a[i])) ga = 0, fg = fg ? fg : good_a[i];
    for (size_t i = 0; i < sizeof bad_a / sizeof bad_a[0]; i++)
        if (takes(a, bad_a[i])) ba = 0, fb = fb ? fb : bad_a[i];
    CHECK(ga, "the flat schema takes %zu documents (first refused: %s)", sizeof good_a / sizeof good_a[0], fg ? fg : "none");
    CHECK(ba, "and refuses %zu: a required property missing, an extra or repeated key, integers out of range or "
              "fractional, too few or many items, values outside the enum, wrong types (first taken: %s)",
          sizeof bad_a / sizeof bad_a[0], fb ? fb : "none");
    CHECK(takes(l, "{\"v\":-3,\"next\":{\"v\":-20,\"next\":null}}") && !takes(l, "{\"v\":-3,\"next\":{\"v\":-2,\"next\":null}}") &&
              !takes(l, "{\"v\":-3,\"next\":{\"v\":-4}}") && !takes(l, "{\"v\":-3,\"next\":[]}"),
          "the recursive schema takes a list of two and refuses a bad value, a missing key, a wrong alternative");
    st_gram_schema_free(a);
    st_gram_schema_free(l);
    struct {
        const char *schema;
        int strict;
        const char *says;
    } bad[] = {
        {"{\"type\":", 1, "not JSON"},
        {"{\"type\":\"string\",\"format\":\"email\"}", 1, "'format'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", 1, "'b'"},
        {"{\"$ref\":\"#/$defs/none\"}", 0, "'none'"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{\"a\":{}}}]}", 0, "two alternatives"},
        {"{\"enum\":[1,1]}", 0, "twice"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", 0, "no integer"},
        {"{\"type\":\"date\"}", 0, "'date'"},
    };
    int all = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_gram_schema *x = NULL;
        st_error e = {0};
        const st_status st = st_gram_schema_compile(bad[i].schema, strlen(bad[i].schema), bad[i].strict, &x, &e);
        if (st == ST_OK || !strstr(e.msg, bad[i].says)) {
            printf("# %s: %s\n", bad[i].schema, st == ST_OK ? "compiled" : e.msg);
            all = 0;
        }
        st_gram_schema_free(x);
    }
    CHECK(all, "%zu schemas strand cannot follow are refused, each naming why", sizeof bad / sizeof bad[0]);
    st_gram_schema *ls = NULL;
    const char *len_schema = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}";
    CHECK(st_gram_schema_compile(len_schema, strlen(len_schema), 1, &ls, &err) == ST_OK && takes(ls, "\"ab\"") &&
              takes(ls, "\"\xc3\xa9\\n\\u00e9\\ud83d\\ude00\"") && !takes(ls, "\"a\"") && !takes(ls, "\"abcde\"") &&
              !takes(ls, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""),
          "minLength / maxLength count characters (a UTF-8 sequence, an escape, a surrogate pair: one each)");
    st_gram_schema_free(ls);
    st_gram_schema *nb = NULL;
    const char *num_schema = "{\"type\":\"number\",\"minimum\":0.1,\"exclusiveMaximum\":1.25}";
    CHECK(st_gram_schema_compile(num_schema, strlen(num_schema), 1, &nb, &err) == ST_OK && takes(nb, "0.5 ") &&
              takes(nb, "1.2499 ") && takes(nb, "0.10 ") && !takes(nb, "1.25 ") && !takes(nb, "0 ") && !takes(nb, "-0.5 ") &&
              !takes(nb, "1e0 ") && !takes(nb, "2 "),
          "a bounded number stays in its bounds (an exclusive end refused), written without an exponent");
    st_gram_schema_free(nb);
    st_gram_schema *ek = NULL;
    const char *empty_key = "{\"type\":\"object\",\"properties\":{\"\":{\"type\":\"integer\"}},\"required\":[\"\"]}";
    CHECK(st_gram_schema_compile(empty_key, strlen(empty_key), 1, &ek, &err) == ST_OK && takes(ek, "{\"\":1}") &&
              !takes(ek, "{\"a\":1}"),
          "an empty property name works (the fuzz target found it reading past a null pool)");
    st_gram_schema_free(ek);
    st_gram_schema *lax = NULL;
    const char *pat = "{\"type\":\"string\",\"pattern\":\"(?=a)\",\"format\":\"email\"}";
    CHECK(st_gram_schema_compile(pat, strlen(pat), 0, &lax, &err) == ST_OK && takes(lax, "\"b\""),
          "not strict, an unsupported keyword is ignored (as OpenAI does)");
    st_gram_schema_free(lax);
}

/* replies drawn from a schema's masks: each completed one parses and validates */
static void test_schema_replies(const char *schema_text, const char *what, int reps, int min_complete) {
    reps /= reps_div, min_complete = (min_complete + reps_div - 1) / reps_div;
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", tap_data_dir());
    st_tokenizer *tok = NULL;
    st_gram_vocab *v = NULL;
    st_gram_schema *sc = NULL;
    st_error err = {0};
    if (st_tok_load(path, &tok, &err) != ST_OK || st_gram_vocab_create(tok, st_tok_vocab_size(tok), &v, &err) != ST_OK ||
        st_gram_schema_compile(schema_text, strlen(schema_text), 1, &sc, &err) != ST_OK) {
        CHECK(0, "%s: set-up (%s)", what, err.msg);
        st_gram_vocab_free(v);
        st_tok_free(tok);
        return;
    }
    json_t *schema_json = json_loads(schema_text, 0, NULL);
    json_t *defs = json_object_get(schema_json, "$defs");
    const int64_t V = st_tok_vocab_size(tok);
    const size_t W = st_gram_mask_words(v);
    uint32_t *mask = malloc(W * sizeof *mask);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    uint32_t *tlen = token_lengths(tok, V);
    rng r = {777};
    int complete = 0, good = 0, agree = 1, replies = 0;
    double worst = 0;
    for (int rep = 0; rep < reps; rep++) {
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_JSON_SCHEMA);
        char text[16384];
        size_t n = 0;
        replies++;
        for (int step = 0; step < 400 && !st_gram_done(&g); step++) {
            const double t0 = st_now_s();
            const int64_t count = st_gram_mask(v, sc, &g, mask);
            const double dt = st_now_s() - t0;
            worst = dt > worst ? dt : worst;

            int64_t na = 0, short_n = 0;
            for (size_t w = 0; w < W; w++)
                for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed[na++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(bits));
            if (na != count || na == 0) {
                printf("# %s: %lld allowed (count %lld) after '%.*s'\n", what, (long long)na, (long long)count, (int)n, text);
                agree = 0;
                break;
            }
            for (int k = 0; k < 200; k++) {
                const int32_t t = (int32_t)below(&r, (int)V);
                st_gram_state s = g;
                if (st_gram_advance(v, sc, &s, t) != (int)(mask[t / 32] >> (t % 32) & 1u)) agree = 0;
            }
            for (int64_t i = 0; i < na; i++)
                if (tlen[allowed[i]] <= 2) allowed[short_n++] = allowed[i];
            const int32_t t = below(&r, 4) && short_n ? allowed[below(&r, (int)short_n)] : allowed[below(&r, (int)na)];
            size_t len = 0;
            const char *b = st_tok_token_bytes(tok, t, &len);
            if (!st_gram_advance(v, sc, &g, t)) {
                agree = 0;
                break;
            }
            if (n + len < sizeof text) memcpy(text + n, b, len), n += len;
        }
        if (!st_gram_done(&g)) continue;
        complete++;
        json_t *j = json_loadb(text, n, JSON_DECODE_ANY, NULL);
        if (j && valid(j, schema_json, defs)) good++;
        else printf("# %s: not valid: %.*s\n", what, (int)n, text);
        json_decref(j);
    }
    CHECK(agree, "%s: every mask bit sampled equals feeding the token; no mask is ever empty (no dead end)", what);
    CHECK(complete >= min_complete && good == complete, "%s: %d of %d random replies completed, each parses and satisfies the schema (slowest mask %.0f us)",
          what, complete, replies, worst * 1e6);
    json_decref(schema_json);
    free(mask);
    free(allowed);
    free(tlen);
    st_gram_schema_free(sc);
    st_gram_vocab_free(v);
    st_tok_free(tok);
}

/* ---- random schemas ---- */

static void put_s(char *b, size_t *n, size_t cap, const char *t) { put(b, n, cap, t); }

/* a random schema of the subset (depth-limited), as JSON text */
static void random_schema(rng *r, char *b, size_t *n, size_t cap, int depth) {
    const int k = depth >= 3 ? below(r, 6) : below(r, 9);
    char tmp[160];
    switch (k) {
    case 0: put_s(b, n, cap, "{\"type\":\"string\"}"); break;
    case 1: put_s(b, n, cap, "{\"type\":\"boolean\"}"); break;
    case 2: put_s(b, n, cap, "{\"type\":\"number\"}"); break;
    case 3: {
        const int lo = below(r, 40) - 20, hi = lo + below(r, 300);
        snprintf(tmp, sizeof tmp, "{\"type\":\"integer\",\"minimum\":%d,\"maximum\":%d}", lo, hi);
        put_s(b, n, cap, tmp);
        break;
    }
    case 4: put_s(b, n, cap, below(r, 2) ? "{\"enum\":[\"red\",\"green\",12,null,true]}" : "{\"enum\":[1,10,100,\"x\"]}"); break;
    case 5: put_s(b, n, cap, below(r, 2) ? "{\"type\":[\"integer\",\"null\"]}" : "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}"); break;
    case 6:
    case 7: {
        static const char *const names[] = {"a", "bb", "name", "n\\u00e9", "x_1", "count"};
        const int np = 1 + below(r, 4);
        put_s(b, n, cap, "{\"type\":\"object\",\"properties\":{");
        int used[6] = {0}, got = 0;
        char req[128] = "";
        for (int i = 0; i < np; i++) {
            int j = below(r, 6);
            if (used[j]) continue;
            used[j] = 1;
            snprintf(tmp, sizeof tmp, "%s\"%s\":", got ? "," : "", names[j]);
            put_s(b, n, cap, tmp);
            random_schema(r, b, n, cap, depth + 1);
            if (below(r, 2)) {
                size_t l = strlen(req);
                snprintf(req + l, sizeof req - l, "%s\"%s\"", l ? "," : "", names[j]);
            }
            got++;
        }
        snprintf(tmp, sizeof tmp, "},\"required\":[%s],\"additionalProperties\":false}", req); /* open objects: below */
        put_s(b, n, cap, tmp);
        break;
    }
    default: {
        const int mn = below(r, 3), mx = mn + below(r, 4);
        put_s(b, n, cap, "{\"type\":\"array\",\"items\":");
        random_schema(r, b, n, cap, depth + 1);
        snprintf(tmp, sizeof tmp, ",\"minItems\":%d,\"maxItems\":%d}", mn, mx);
        put_s(b, n, cap, tmp);
    }
    }
}

static void test_random_schemas(void) {
    rng r = {0xfeedface12345ull};
    int compiled = 0, ok = 1;
    for (int i = 0; i < 8; i++) {
        char text[8192];
        size_t n = 0;
        random_schema(&r, text, &n, sizeof text - 1, 0);
        text[n] = 0;
        json_t *j = json_loads(text, 0, NULL);
        if (!j) {
            printf("# a random schema that is not JSON: %s\n", text);
            ok = 0;
            continue;
        }
        json_decref(j);
        char what[64];
        snprintf(what, sizeof what, "random schema %d", i);
        const int before = tap_failed;
        test_schema_replies(text, what, 10, 1);
        if (tap_failed != before) {
            printf("# the schema: %s\n", text);
            ok = 0;
        }
        compiled++;
    }
    CHECK(ok && compiled == 8, "%d random schemas: every reply drawn from the masks parses and satisfies its schema", compiled);
    /* bounded strings take the string masks filtered by each token's characters */
    test_schema_replies("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3,\"maxLength\":12},"
                        "\"t\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2}}},\"required\":[\"s\",\"t\"],"
                        "\"additionalProperties\":false}",
                        "bounded strings", 12, 5);
    test_schema_replies("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":0.75},\"maxItems\":4}",
                        "bounded numbers", 12, 5);
    /* an open object: other keys take booleans, a key that is a property takes its schema */
    test_schema_replies("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":4}},"
                        "\"additionalProperties\":{\"type\":\"boolean\"}}",
                        "an open object", 12, 3);
}

/* ---- forced tool calls (Qwen3.5's XML format) ---- */

static const char *const tools_json =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},\"units\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\",\"days\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"zone\":{\"type\":\"string\"}}}}}]";

static int call_takes(const st_gram_schema *sc, const char *doc) {
    st_gram_state g;
    st_gram_init(&g, ST_GRAM_TOOL_CALL);
    return st_gram_feed(&g, sc, doc, strlen(doc)) && st_gram_done(&g);
}

static void test_tool_calls(void) {
    st_gram_schema *all = NULL, *one = NULL;
    st_error err = {0};
    if (!CHECK(st_gram_tools_compile(tools_json, strlen(tools_json), NULL, &all, &err) == ST_OK &&
                   st_gram_tools_compile(tools_json, strlen(tools_json), "get_time", &one, &err) == ST_OK,
               "tools compile for a forced call, all of them or one named (%s)", err.msg))
        return;
    const char *w = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>";
    const char *multi = "<tool_call>\n<function=get_weather>\n<parameter=units>\nf\n</parameter>\n<parameter=days>\n7\n"
                        "</parameter>\n<parameter=city>\nLine 1\nLine </para 2\n</parameter>\n</function>\n</tool_call>";
    const char *t = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
    CHECK(call_takes(all, w) && call_takes(all, multi) && call_takes(all, t) && call_takes(one, t),
          "calls are taken: text and JSON parameters in any order, multi-line text, no parameters");
    CHECK(!call_takes(all, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>") &&
              !call_takes(all, "<tool_call>\n<function=get_wind>\n</function>\n</tool_call>") &&
              !call_takes(one, w) &&
              !call_takes(all, "<tool_call>\n<function=get_weather>\n<parameter=days>\n9\n</parameter>\n<parameter=city>\nx\n"
                               "</parameter>\n</function>\n</tool_call>") &&
              !call_takes(all, "<tool_call>\n<function=get_time>\n<parameter=zone>\nA\n</parameter>\n<parameter=zone>\nB\n"
                               "</parameter>\n</function>\n</tool_call>") &&
              !call_takes(all, "hello <tool_call>") &&
              !call_takes(all, "<tool_call>\n<function=get_weather>\n<parameter=units>\n\"f\"\n</parameter>\n<parameter=days>\n7\n"
                               "</parameter>\n<parameter=city>\nx\n</parameter>\n</function>\n</tool_call>") &&
              !call_takes(all, "<tool_call>\n<function=get_weather>\n<parameter=days>\n 7\n</parameter>\n<parameter=city>\nx\n"
                               "</parameter>\n</function>\n</tool_call>"),
          "and refused: a required parameter missing, an unknown function, one not named, a value outside its schema, "
          "a parameter twice, text before the call, a text enum quoted, a value after whitespace (as the call parser "
          "reads them: text raw, other types as JSON)");
    st_gram_schema *x = NULL;
    CHECK(st_gram_tools_compile(tools_json, strlen(tools_json), "nope", &x, &err) != ST_OK && strstr(err.msg, "'nope'"),
          "naming a function the tools lack is refused: %s", err.msg);
    /* random calls drawn from the masks over the qwen3 tokenizer (its <tool_call> tokens) */
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", tap_data_dir());
    st_tokenizer *tok = NULL;
    st_gram_vocab *v = NULL;
    if (st_tok_load(path, &tok, &err) != ST_OK || st_gram_vocab_create(tok, st_tok_vocab_size(tok), &v, &err) != ST_OK) {
        CHECK(0, "tool calls: set-up (%s)", err.msg);
        st_tok_free(tok);
        st_gram_schema_free(all);
        st_gram_schema_free(one);
        return;
    }
    const int64_t V = st_tok_vocab_size(tok);
    const size_t W = st_gram_mask_words(v);
    uint32_t *mask = malloc(W * sizeof *mask);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    uint32_t *tlen = token_lengths(tok, V);
    json_t *tools = json_loads(tools_json, 0, NULL);
    rng r = {4242};
    int complete = 0, good = 0, agree = 1, used_token = 0;
    const int32_t open_id = st_tok_token_to_id(tok, "<tool_call>", 11);
    for (int rep = 0; rep < 20; rep++) {
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_TOOL_CALL);
        char text[16384];
        size_t n = 0;
        for (int step = 0; step < 400 && !st_gram_done(&g); step++) {
            const int64_t count = st_gram_mask(v, all, &g, mask);
            int64_t na = 0, short_n = 0;
            for (size_t wd = 0; wd < W; wd++)
                for (uint32_t bits = mask[wd]; bits; bits &= bits - 1) allowed[na++] = (int32_t)(wd * 32 + (size_t)__builtin_ctz(bits));
            if (na != count || na == 0) {
                printf("# tool call: %lld allowed after '%.*s'\n", (long long)na, (int)n, text);
                agree = 0;
                break;
            }
            for (int k = 0; k < 200; k++) {
                const int32_t q = (int32_t)below(&r, (int)V);
                st_gram_state s = g;
                if (st_gram_advance(v, all, &s, q) != (int)(mask[q / 32] >> (q % 32) & 1u)) agree = 0;
            }
            used_token |= step == 0 && (mask[open_id / 32] >> (open_id % 32) & 1u);
            for (int64_t i = 0; i < na; i++)
                if (tlen[allowed[i]] <= 2) allowed[short_n++] = allowed[i];
            const int32_t tk = below(&r, 4) && short_n ? allowed[below(&r, (int)short_n)] : allowed[below(&r, (int)na)];
            size_t len = 0;
            const char *b = st_tok_token_bytes(tok, tk, &len);
            if (!st_gram_advance(v, all, &g, tk)) {
                agree = 0;
                break;
            }
            if (n + len < sizeof text) memcpy(text + n, b, len), n += len;
        }
        if (!st_gram_done(&g)) continue;
        complete++;
        st_tool_calls tc;
        memset(&tc, 0, sizeof tc);
        int ok = st_toolcall_parse(text, n, tools, &tc) && tc.n == 1;
        if (ok) {
            json_t *args = json_loads(tc.calls[0].arguments, 0, NULL);
            if (!strcmp(tc.calls[0].name, "get_weather")) {
                json_t *d = json_object_get(args, "days"), *u = json_object_get(args, "units");
                ok = json_is_string(json_object_get(args, "city")) && json_is_integer(d) && json_integer_value(d) >= 1 &&
                     json_integer_value(d) <= 7 && (!u || (json_is_string(u) && strchr("cf", json_string_value(u)[0])));
            } else {
                ok = !strcmp(tc.calls[0].name, "get_time") && json_is_object(args);
            }
            json_decref(args);
        }
        if (ok) good++;
        else printf("# not a valid call: %.*s\n", (int)n, text);
        st_tool_calls_free(&tc);
    }
    CHECK(agree && used_token, "tool calls: mask bits equal feeding the tokens, never empty; <tool_call> (an added token) is allowed to open");
    CHECK(complete >= 5 && good == complete,
          "%d random calls completed; each parses as one call of an offered tool with arguments its schema accepts", complete);
    json_decref(tools);
    free(mask);
    free(allowed);
    free(tlen);
    st_gram_vocab_free(v);
    st_tok_free(tok);
    st_gram_schema_free(all);
    st_gram_schema_free(one);
}

/* ---- GBNF grammars ---- */

static st_gram_schema *gbnf(const char *text, st_error *err) {
    st_gram_schema *sc = NULL;
    memset(err, 0, sizeof *err);
    return st_gram_gbnf_compile(text, strlen(text), &sc, err) == ST_OK ? sc : NULL;
}

/* 2: the whole text is a sentence; 1: it feeds but is no sentence yet; 0: it is refused */
static int gb_reads(const st_gram_schema *sc, const char *text) {
    st_gram_state g;
    st_gram_init(&g, ST_GRAM_GBNF);
    st_gram_begin(&g, sc);
    if (!st_gram_feed(&g, sc, text, strlen(text))) return 0;
    return st_gram_may_end(&g) ? 2 : 1;
}

static void test_gbnf_documents(void) {
    static const struct {
        const char *grammar, *what; /* what: a word of the error expected */
    } bad[] = {
        {"", "no rules"},
        {"root ::= item", "'item' is used but never defined"},
        {"item ::= \"a\"", "no rule 'root'"},
        {"root ::= root \"a\" | \"b\"", "'root' is left-recursive"},
        {"root ::= a\na ::= b \"x\"\nb ::= root | \"y\"", "left-recursive"},
        {"root ::= e root \"x\" | \"y\"\ne ::= \"\"", "left-recursive"},
        {"root ::= ( root \"x\" )* \"y\"", "left-recursive"},
        {"root ::= \"abc", "literal is not closed"},
        {"root ::= [a-", "not closed"},
        {"root ::= [z-a]", "backwards"},
        {"root ::= \"a\"{2000}", "over 1000"},
        {"root ::= \"a\"{3,1}", "below its minimum"},
        {"root ::= ( \"a\" ", "')' is expected"},
        {"root ::= \"a\" )", "unmatched ')'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= @", "unexpected '@'"},
        {"root = \"a\"", "rule definition"},
    };
    int ok_bad = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st_error err;
        st_gram_schema *sc = gbnf(bad[i].grammar, &err);
        if (sc || !strstr(err.msg, bad[i].what)) {
            printf("# grammar '%s': %s (want '%s')\n", bad[i].grammar, sc ? "compiled" : err.msg, bad[i].what);
            ok_bad = 0;
        }
        st_gram_schema_free(sc);
    }
    CHECK(ok_bad, "GBNF: %zu bad grammars are refused with a message naming the problem (undefined rule, no root, left recursion, syntax)",
          sizeof bad / sizeof bad[0]);
    static const struct {
        const char *grammar, *text;
        int want;
    } cases[] = {
        {"root ::= \"yes\" | \"no\"", "yes", 2},
        {"root ::= \"yes\" | \"no\"", "no", 2},
        {"root ::= \"yes\" | \"no\"", "ye", 1},
        {"root ::= \"yes\" | \"no\"", "yess", 0},
        {"root ::= \"yes\" | \"no\"", "maybe", 0},
        {"root ::= [a-z]+ (\",\" [a-z]+)*", "ab,cd,e", 2},
        {"root ::= [a-z]+ (\",\" [a-z]+)*", "ab,", 1},
        {"root ::= [a-z]+ (\",\" [a-z]+)*", "Ab", 0},
        {"root ::= num{2,3}\nnum ::= [0-9]", "12", 2},
        {"root ::= num{2,3}\nnum ::= [0-9]", "123", 2},
        {"root ::= num{2,3}\nnum ::= [0-9]", "1", 1},
        {"root ::= num{2,3}\nnum ::= [0-9]", "1234", 0},
        {"root ::= \"a\"{2,}", "aaaaa", 2},
        {"root ::= \"a\"{2,}", "a", 1},
        {"root ::= \"a\" root | \"\"", "", 2},
        {"root ::= \"a\" root | \"\"", "aaa", 2},
        {"root ::= [^\\n]* \"\\n\"", "h\xc3\xa9llo\n", 2},
        {"root ::= [^\\n]* \"\\n\"", "h\xc3\xa9llo", 1},
        {"root ::= [^\\n]* \"\\n\"", "a\nb", 0},
        {"root ::= \"\xc3\xa9\" [\\u4e00-\\u9fff]", "\xc3\xa9\xe4\xb8\xad", 2},
        {"root ::= .? \"x\"", "x", 2},
        {"root ::= .? \"x\"", "\xf0\x9f\x98\x80x", 2},
        {"root ::= .? \"x\"", "\xc3(", 0},  /* not UTF-8 */
        {"root ::= .? \"x\"", "\xc0\x80x", 0}, /* overlong */
        {"root ::= (\"ab\" | \"c\")* \"!\"", "abcab!", 2},
        {"root ::= (\"ab\" | \"c\")* \"!\"", "ac!", 0},
        {"# a list\nroot ::= item (\", \" item)*   # items\nitem ::= \"[\" root \"]\" | [0-9]+\n", "1, [2, [3]], 45", 2},
        {"root ::= item (\", \" item)*\nitem ::= \"[\" root \"]\" | [0-9]+", "1, [2", 1},
        {"root ::= [\\x41-\\x43]+", "ABCA", 2},
        {"root ::= \"\\\"\" [^\"]* \"\\\"\"", "\"hi\"", 2},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        st_error err;
        st_gram_schema *sc = gbnf(cases[i].grammar, &err);
        const int got = sc ? gb_reads(sc, cases[i].text) : -1;
        if (got != cases[i].want) {
            printf("# grammar '%s', text '%s': %d, want %d (%s)\n", cases[i].grammar, cases[i].text, got, cases[i].want, err.msg);
            ok = 0;
        }
        st_gram_schema_free(sc);
    }
    CHECK(ok, "GBNF: %zu texts are sentences, prefixes or refused as the grammar says (repetition counts, groups, classes, UTF-8)",
          sizeof cases / sizeof cases[0]);
    /* the end: a sentence nothing may follow is done; one that may go on only may end */
    st_error err;
    st_gram_schema *a = gbnf("root ::= \"yes\"", &err), *b = gbnf("root ::= \"a\"+", &err);
    st_gram_state g, h;
    st_gram_init(&g, ST_GRAM_GBNF);
    st_gram_init(&h, ST_GRAM_GBNF);
    int ends = a && b && st_gram_feed(&g, a, "yes", 3) && st_gram_done(&g) && st_gram_may_end(&g) &&
               st_gram_feed(&h, b, "aa", 2) && !st_gram_done(&h) && st_gram_may_end(&h);
    CHECK(ends, "GBNF: 'yes' under root ::= \"yes\" is done; 'aa' under root ::= \"a\"+ may end and is not done");
    st_gram_schema_free(a);
    st_gram_schema_free(b);
}

/* random replies drawn from the masks over the qwen3 tokenizer: every mask bit sampled equals
 * feeding the token, and a reply ended where the grammar may end is a sentence from scratch */
static void test_gbnf_replies(const char *grammar, const char *what, int reps) {
    reps = reps / reps_div > 0 ? reps / reps_div : 1;
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", tap_data_dir());
    st_tokenizer *tok = NULL;
    st_gram_vocab *v = NULL;
    st_error err = {0};
    st_gram_schema *sc = NULL;
    if (st_tok_load(path, &tok, &err) != ST_OK || st_gram_vocab_create(tok, st_tok_vocab_size(tok), &v, &err) != ST_OK ||
        !(sc = gbnf(grammar, &err))) {
        CHECK(0, "%s: set-up (%s)", what, err.msg);
        st_gram_vocab_free(v);
        st_tok_free(tok);
        return;
    }
    const int64_t V = st_tok_vocab_size(tok);
    const size_t W = st_gram_mask_words(v);
    uint32_t *mask = malloc(W * sizeof *mask);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    rng r = {4242};
    int agree = 1, ended = 0, good = 0;
    double worst = 0;
    for (int rep = 0; rep < reps; rep++) {
        st_gram_state g;
        st_gram_init(&g, ST_GRAM_GBNF);
        st_gram_begin(&g, sc);
        char text[4096];
        size_t n = 0;
        for (int step = 0; step < 60 && !st_gram_done(&g); step++) {
            if (st_gram_may_end(&g) && below(&r, 4) == 0) break; /* the model's end of sequence */
            const double t0 = st_now_s();
            const int64_t count = st_gram_mask(v, sc, &g, mask);
            const double dt = st_now_s() - t0;
            worst = dt > worst ? dt : worst;
            int64_t na = 0;
            for (size_t w = 0; w < W; w++)
                for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed[na++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(bits));
            if (na != count || (na == 0 && !st_gram_may_end(&g))) {
                printf("# %s: %lld allowed (count %lld) after '%.*s'\n", what, (long long)na, (long long)count, (int)n, text);
                agree = 0;
                break;
            }
            if (na == 0) break;
            for (int k = 0; k < 100; k++) {
                const int32_t t = (int32_t)below(&r, (int)V);
                st_gram_state s = g;
                if (st_gram_advance(v, sc, &s, t) != (int)(mask[t / 32] >> (t % 32) & 1u)) agree = 0;
            }
            const int32_t t = allowed[below(&r, (int)na)];
            size_t len = 0;
            const char *b = st_tok_token_bytes(tok, t, &len);
            if (!st_gram_advance(v, sc, &g, t)) {
                agree = 0;
                break;
            }
            if (n + len < sizeof text) memcpy(text + n, b, len), n += len;
        }
        if (!st_gram_may_end(&g)) continue;
        ended++;
        text[n < sizeof text ? n : sizeof text - 1] = 0;
        if (gb_reads(sc, text) == 2) good++;
        else printf("# %s: '%s' is no sentence from scratch\n", what, text);
    }
    CHECK(agree, "%s: every mask bit sampled equals feeding the token; no mask is empty where the reply may not end", what);
    CHECK(ended >= reps / 3 && good == ended, "%s: %d of %d random replies ended where the grammar may end, each a sentence read from scratch (slowest mask %.1f ms)",
          what, ended, reps, worst * 1e3);
    free(mask);
    free(allowed);
    st_gram_schema_free(sc);
    st_gram_vocab_free(v);
    st_tok_free(tok);
}

/* ---- JSON-schema patterns ---- */

static const char *const schema_pat =
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{2,4}$\"},"
    "\"any\":{\"type\":\"string\",\"pattern\":\"^[0-9]+(,[0-9]+)*$\"},\"alt\":{\"type\":\"string\",\"pattern\":\"^(ab|cd)*x?$\"}},"
    "\"required\":[\"code\",\"any\",\"alt\"],\"additionalProperties\":false}";

static void test_patterns(void) {
    static const struct {
        const char *pattern, *doc;
        int want;
    } cases[] = {
        {"^[A-Z]{3}-[0-9]{2,4}$", "\"ABC-12\"", 1},   {"^[A-Z]{3}-[0-9]{2,4}$", "\"ABC-12345\"", 0},
        {"^[A-Z]{3}-[0-9]{2,4}$", "\"ABC-1\"", 0},    {"^[A-Z]{3}-[0-9]{2,4}$", "\"abc-12\"", 0},
        {"^[A-Z]{3}-[0-9]{2,4}$", "\"\\u0041BC-12\"", 1}, /* an escape is its character */
        {"[0-9]+", "\"x1y\"", 1},                     {"[0-9]+", "\"xy\"", 0},
        {"^a\\\\.b$", "\"a.b\"", 1},                   {"^a\\\\.b$", "\"axb\"", 0},
        {"^\\\\d{3}$", "\"123\"", 1},                  {"^\\\\d{3}$", "\"12a\"", 0},
        {"^\\\\w+@\\\\w+$", "\"me@here\"", 1},         {"^[^@]+$", "\"a@b\"", 0},
        {"^(ab|cd)*x?$", "\"abcdx\"", 1},              {"^(ab|cd)*x?$", "\"abc\"", 0},
        {"^line\\\\nbreak$", "\"line\\nbreak\"", 1},  {"^.$", "\"\\ud83d\\ude00\"", 1}, /* a surrogate pair: one character */
        {"^caf\\u00e9$", "\"caf\xc3\xa9\"", 1},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", cases[i].pattern);
        st_gram_schema *sc = NULL;
        st_error err = {0};
        int got = -1;
        if (st_gram_schema_compile(schema, strlen(schema), 1, &sc, &err) == ST_OK) got = takes(sc, cases[i].doc);
        if (got != cases[i].want) {
            printf("# pattern %s, document %s: %d, want %d (%s)\n", cases[i].pattern, cases[i].doc, got, cases[i].want, err.msg);
            ok = 0;
        }
        st_gram_schema_free(sc);
    }
    CHECK(ok, "patterns: %zu strings match or not as the regular expression says (anchors, classes, \\d \\w, escapes, groups)",
          sizeof cases / sizeof cases[0]);
    static const char *const bad[] = {"(?=x)", "a\\\\1", "\\\\bword", "a^b", "(ab"};
    int ok_bad = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char schema[256];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", bad[i]);
        st_gram_schema *sc = NULL;
        st_error err = {0};
        const st_status strict = st_gram_schema_compile(schema, strlen(schema), 1, &sc, &err);
        st_gram_schema_free(sc);
        sc = NULL;
        const st_status lax = st_gram_schema_compile(schema, strlen(schema), 0, &sc, &err);
        if (strict == ST_OK || lax != ST_OK || takes(sc, "\"anything\"") != 1) {
            printf("# pattern %s: strict %d lax %d\n", bad[i], strict, lax);
            ok_bad = 0;
        }
        st_gram_schema_free(sc);
    }
    CHECK(ok_bad, "patterns beyond the subset (lookaround, backreference, \\b, inner anchors, an open group): a strict schema is refused naming 'pattern', a lax one ignores it");
}

int main(void) {
    const char *sc = getenv("STRAND_TEST_SCALE");
    if (sc && atoi(sc) > 1) reps_div = atoi(sc) < 3 ? atoi(sc) : 3;
    test_documents();
    test_random_documents();
    test_masks();
    test_schema_documents();
    test_schema_replies(schema_a, "the flat schema", 30, 5);
    test_schema_replies(schema_list, "the recursive schema", 30, 5);
    test_tool_calls();
    test_random_schemas();
    test_patterns();
    test_schema_replies(schema_pat, "the schema with patterns", 30, 5);
    test_gbnf_documents();
    test_gbnf_replies("root ::= \"The answer is \" (\"yes\" | \"no\") \".\"", "GBNF yes/no", 20);
    test_gbnf_replies("root ::= item (\", \" item)*\nitem ::= \"[\" root \"]\" | [0-9]{1,4} | [a-z]+", "GBNF nested lists", 20);
    test_gbnf_replies("root ::= [^\\n]* \"\\n\"", "GBNF free text to a newline", 3);
    return tap_done();
}
