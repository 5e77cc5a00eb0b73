/* ==== Tokenizer tests: exact ids against reference outputs, decoding, streaming, errors ====
 *
 * Data (tests/data, copied from shared/ or generated once, see tests/data/tokenizers/README.md):
 *   tokenizers/qwen3/tokenizer.json   the real Qwen3 tokenizer
 *   tokenizer-A.json                  reference ids and decodes from Hugging Face
 *   peer-tests/ggml-vocab-qwen2.*     llama.cpp's test pairs for the same vocabulary
 *   tokenizers/qwen3/goldens.json     ids from tokenizers.js for many texts (random ones too)
 *   tokenizers/qwen35-goldens.json    the same with the Qwen3.5 pre-tokenizer regex
 *   tokenizers/tiny/tokenizer.json    a hand-made tokenizer for added-token options
 * One CHECK per case. Runs from the repository root (or STRAND_TEST_DATA=dir).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fileio.h"
#include "tap.h"
#include "tokenizer/tokenizer.h"

/* ==== Helpers ==== */

static char *data_path(const char *rel) {
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tap_data_dir(), rel);
    return buf[k];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static json_t *load_json(const char *rel) {
    json_error_t je;
    json_t *j = json_load_file(data_path(rel), JSON_ALLOW_NUL, &je);
    if (!j) printf("# cannot read %s: %s\n", rel, je.text);
    return j;
}

static int ids_equal(const int32_t *a, size_t na, const json_t *arr) {
    if (na != json_array_size(arr)) return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != (int32_t)json_integer_value(json_array_get(arr, i))) return 0;
    return 1;
}

static int ids_equal_list(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Print both id lists as a TAP comment when they differ. */
static void show_ids(const char *what, const int32_t *a, size_t n) {
    printf("#   %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) printf(" %d", a[i]);
    printf("%s\n", n > 64 ? " ..." : "");
}

/* Short printable form of a text for test names (whole characters, control bytes as '?'). */
static const char *label(const char *s, size_t n) {
    static char buf[4][64];
    static int k;
    k = (k + 1) % 4;
    size_t w = 0, i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (i + len > n) len = n - i;
        if (w + len + 2 > 44) break;
        if (c == '\n') buf[k][w++] = '\\', buf[k][w++] = 'n';
        else if (c < 0x20 || c == 0x7f) buf[k][w++] = '?';
        else memcpy(buf[k] + w, s + i, len), w += len;
        i += len;
    }
    buf[k][w] = '\0';
    return buf[k];
}

typedef struct idvec {
    int32_t *v;
    size_t n;
} idvec;

static idvec enc(const st_tokenizer *tok, const char *s, size_t n, int parse_special) {
    idvec r = {NULL, 0};
    st_error err;
    if (st_tok_encode(tok, s, n, parse_special, &r.v, &r.n, &err) != ST_OK)
        printf("# encode failed: %s\n", err.msg);
    return r;
}

static char *dec(const st_tokenizer *tok, const int32_t *ids, size_t n, int skip, size_t *len) {
    char *t = NULL;
    st_error err;
    if (st_tok_decode(tok, ids, n, skip, &t, len, &err) != ST_OK) printf("# decode failed: %s\n", err.msg);
    return t;
}

/* Check one case: ids exact, and (when `decoded` is given) decode(ids) equals it. */
static void check_case(const st_tokenizer *tok, const char *set, size_t idx, const char *text,
                       size_t tlen, const json_t *ids, const char *decoded, size_t dlen) {
    idvec r = enc(tok, text, tlen, 1);
    int ok = ids_equal(r.v, r.n, ids);
    if (decoded) {
        size_t l = 0;
        char *d = dec(tok, r.v, r.n, 0, &l);
        ok = ok && d && l == dlen && memcmp(d, decoded, l) == 0;
        free(d);
    }
    if (!CHECK(ok, "%s case %zu \"%s\": ids%s exact", set, idx, label(text, tlen),
               decoded ? " and decode" : "")) {
        show_ids("got", r.v, r.n);
        int32_t want[4096];
        size_t nw = json_array_size(ids);
        for (size_t i = 0; i < nw && i < 4096; i++) want[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        show_ids("want", want, nw < 4096 ? nw : 4096);
    }
    free(r.v);
}

/* ==== Reference sets ==== */

static void test_json_cases(const st_tokenizer *tok, const char *rel, const char *set) {
    json_t *j = load_json(rel);
    if (!CHECK(j != NULL, "%s: %s readable", set, rel)) return;
    json_t *cases = json_object_get(j, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        json_t *t = json_object_get(c, "text"), *d = json_object_get(c, "decoded");
        check_case(tok, set, i, json_string_value(t), json_string_length(t),
                   json_object_get(c, "ids"), d ? json_string_value(d) : NULL,
                   d ? json_string_length(d) : 0);
    }
    json_decref(j);
}

/* llama.cpp's pairs: cases in .inp separated by "\n__ggml_vocab_test__\n"; one line of ids per
 * case in .out (leading space, empty for the empty text). */
static void test_llama_cpp(const st_tokenizer *tok) {
    char *inp = NULL, *out = NULL;
    size_t ni = 0, no = 0;
    st_error err;
    if (!CHECK(st_file_read(data_path("peer-tests/ggml-vocab-qwen2.gguf.inp"), 1 << 20, &inp, &ni,
                            &err) == ST_OK &&
                   st_file_read(data_path("peer-tests/ggml-vocab-qwen2.gguf.out"), 1 << 20, &out,
                                &no, &err) == ST_OK,
               "llama.cpp qwen2 test files readable")) {
        free(inp);
        return;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const char *p = inp, *q = out;
    size_t idx = 0;
    while (p < inp + ni) {
        const char *e = strstr(p, sep);
        if (!e) break;
        const char *eol = strchr(q, '\n');
        if (!eol) eol = out + no;
        /* parse the expected ids of this line */
        json_t *want = json_array();
        for (const char *s = q; s < eol;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s) {
                s++;
                continue;
            }
            json_array_append_new(want, json_integer(v));
            s = end;
        }
        check_case(tok, "llama.cpp", idx, p, (size_t)(e - p), want, p, (size_t)(e - p));
        json_decref(want);
        p = e + strlen(sep);
        q = eol < out + no ? eol + 1 : eol;
        idx++;
    }
    CHECK(idx == 46, "llama.cpp: all 46 cases read (%zu)", idx);
    free(inp);
    free(out);
}

/* ==== Added tokens in text, skip_special ==== */

static void test_special(const st_tokenizer *tok) {
    const char *t = "<|im_start|>user\nHi<|im_end|>";
    idvec a = enc(tok, t, strlen(t), 1);
    int32_t want[] = {151644, 872, 198, 13048, 151645};
    CHECK(ids_equal_list(a.v, a.n, want, 5), "special tokens in text are matched");
    idvec b = enc(tok, t, strlen(t), 0);
    int has_special = 0;
    for (size_t i = 0; i < b.n; i++) has_special |= st_tok_is_special(tok, b.v[i]);
    size_t l = 0;
    char *d = dec(tok, b.v, b.n, 0, &l);
    CHECK(!has_special && b.n > 5 && d && l == strlen(t) && !memcmp(d, t, l),
          "parse_special=0 encodes special-token text as plain text (%zu ids), round-trips", b.n);
    free(d);
    /* non-special added tokens are matched whatever parse_special says */
    const char *tc = "<tool_call>x</tool_call>";
    idvec c = enc(tok, tc, strlen(tc), 0);
    CHECK(c.n == 3 && c.v[0] == 151657 && c.v[2] == 151658 && !st_tok_is_special(tok, 151657),
          "non-special added tokens (<tool_call>) are matched with parse_special=0");
    /* skip_special */
    d = dec(tok, a.v, a.n, 1, &l);
    CHECK(d && !strcmp(d, "user\nHi"), "decode skip_special drops <|im_start|>/<|im_end|>");
    free(d);
    d = dec(tok, c.v, c.n, 1, &l);
    CHECK(d && !strcmp(d, tc), "decode skip_special keeps non-special added tokens");
    free(d);
    d = dec(tok, a.v, a.n, 0, &l);
    CHECK(d && !strcmp(d, t), "decode without skip keeps special tokens");
    free(d);
    int32_t odd[] = {9707, 151700, -5, 1879, 999999999};
    d = dec(tok, odd, 5, 0, &l);
    CHECK(d && !strcmp(d, "Hello world"), "decode skips unassigned ids (as HF does)");
    free(d);
    free(a.v);
    free(b.v);
    free(c.v);
}

static void test_lookups(const st_tokenizer *tok) {
    CHECK(st_tok_vocab_size(tok) == 151669, "vocab size 151669 (%lld)",
          (long long)st_tok_vocab_size(tok));
    CHECK(st_tok_token_to_id(tok, "<|im_end|>", 10) == 151645, "token_to_id(<|im_end|>)");
    CHECK(st_tok_token_to_id(tok, "\xC4\xA0the", 5) == 279, "token_to_id(\"Ġthe\") = 279");
    CHECK(st_tok_token_to_id(tok, "no such token at all", 20) == -1, "token_to_id of unknown: -1");
    size_t l = 0;
    const char *s = st_tok_id_to_token(tok, 279, &l);
    CHECK(s && l == 5 && !memcmp(s, "\xC4\xA0the", 5), "id_to_token(279) = \"Ġthe\"");
    const char *b = st_tok_token_bytes(tok, 279, &l);
    CHECK(b && l == 4 && !memcmp(b, " the", 4), "token_bytes(279) = \" the\"");
    CHECK(st_tok_id_to_token(tok, 151669, NULL) == NULL && st_tok_id_to_token(tok, -1, NULL) == NULL,
          "id_to_token out of range: NULL");
    CHECK(st_tok_is_special(tok, 151643) && !st_tok_is_special(tok, 279) &&
              st_tok_is_added(tok, 151657) && !st_tok_is_special(tok, 151657),
          "special / added flags");
}

/* ==== Added-token options on the hand-made tokenizer ==== */

typedef struct tiny_case {
    const char *text;
    int parse_special;
    int32_t ids[12];
    int n;
    const char *why;
} tiny_case;

/* Vocab: ids 0..255 are the bytes (GPT-2 byte characters), 256.. merges: he ll hell hello Ġw or
 * Ġwor Ġword wor word. Added: 266 <s> (special), 267 <mask> (special, lstrip), 268 [R] (rstrip),
 * 269 wd (single_word), 270 ÅB (normalized), 271 <both> (special, lstrip+rstrip), 272 <s>x. */
static const tiny_case TINY[] = {
    {"hello world", 1, {259, 262, 108, 100}, 4, "plain BPE: hello, Ġwor, l, d"},
    {"hello   <mask> world", 1, {259, 267, 262, 108, 100}, 5, "lstrip eats the spaces before <mask>"},
    {"a <mask>b", 1, {97, 267, 98}, 3, "lstrip: one space"},
    {"\xE3\x80\x80<mask>", 1, {267}, 1, "lstrip eats U+3000 (White_Space)"},
    {"\xC3\xA9<mask>", 1, {195, 169, 267}, 3, "lstrip keeps a non-space"},
    {"x[R]   y", 1, {120, 268, 121}, 3, "rstrip eats the spaces after [R]"},
    {"[R]\n\nz", 1, {268, 122}, 2, "rstrip eats newlines"},
    {" <both>  z", 1, {271, 122}, 2, "lstrip + rstrip"},
    {"  <mask>  <both>  ", 1, {267, 271}, 2, "the second lstrip stops at the first rstrip"},
    {"wd", 1, {269}, 1, "single_word alone"},
    {"a wd b", 1, {97, 32, 269, 32, 98}, 5, "single_word between spaces"},
    {"wd,wd", 1, {269, 44, 269}, 3, "single_word next to punctuation"},
    {"\xC3\xA9 wd", 1, {195, 169, 32, 269}, 4, "single_word after a space"},
    {"swd", 1, {115, 119, 100}, 3, "single_word: a letter before -> not matched"},
    {"wds", 1, {119, 100, 115}, 3, "single_word: a letter after -> not matched"},
    {"wd_x", 1, {119, 100, 95, 120}, 4, "single_word: '_' is a word char"},
    {"x_wd", 1, {120, 95, 119, 100}, 4, "single_word: '_' before"},
    {"1wd", 1, {49, 119, 100}, 3, "single_word: a digit before"},
    {"\xC3\xA9wd", 1, {195, 169, 119, 100}, 4, "single_word: a non-ASCII letter before"},
    {"\xC3\x85" "B", 1, {270}, 1, "normalized token on NFC text"},
    {"A\xCC\x8A" "B", 1, {270}, 1, "normalized token matches after NFC (A + U+030A)"},
    {"\xE2\x84\xAB" "B", 1, {270}, 1, "normalized token matches after NFC (U+212B)"},
    {"\xC3\x85" "BC", 1, {270, 67}, 2, "normalized token inside a word"},
    {"<s>", 1, {266}, 1, "special <s>"},
    {"<s>x", 1, {272}, 1, "longest match wins: <s>x over <s>"},
    {"<s>xy", 1, {272, 121}, 2, "longest match then text"},
    {"<s>", 0, {60, 115, 62}, 3, "parse_special=0: <s> is text"},
    {"<s>x", 0, {272}, 1, "parse_special=0: non-special <s>x still matched"},
    {"<mask><mask>", 1, {267, 267}, 2, "adjacent added tokens"},
    {"hello<s>", 1, {259, 266}, 2, "added token right after a word"},
};

static void test_tiny(void) {
    st_tokenizer *tok = NULL;
    st_error err;
    if (!CHECK(st_tok_load(data_path("tokenizers/tiny/tokenizer.json"), &tok, &err) == ST_OK,
               "tiny tokenizer loads")) {
        printf("# %s\n", err.msg);
        return;
    }
    for (size_t i = 0; i < sizeof TINY / sizeof TINY[0]; i++) {
        const tiny_case *c = &TINY[i];
        idvec r = enc(tok, c->text, strlen(c->text), c->parse_special);
        if (!CHECK(ids_equal_list(r.v, r.n, c->ids, (size_t)c->n), "tiny: %s", c->why))
            show_ids("got", r.v, r.n);
        free(r.v);
    }
    /* skip_special on lstrip/rstrip tokens drops the token and the whitespace it took */
    const char *t = "a  <both>  b";
    idvec r = enc(tok, t, strlen(t), 1);
    size_t l;
    char *d = dec(tok, r.v, r.n, 1, &l);
    CHECK(d && !strcmp(d, "ab"), "tiny: skip_special after lstrip/rstrip gives \"ab\"");
    free(d);
    free(r.v);
    st_tok_free(tok);
}

/* The same tokenizer with merges written as "a b" strings gives the same ids. */
static void test_merge_forms(void) {
    char *buf = NULL;
    size_t n = 0;
    st_error err;
    if (st_file_read(data_path("tokenizers/tiny/tokenizer.json"), 1 << 20, &buf, &n, &err) != ST_OK)
        return;
    json_error_t je;
    json_t *j = json_loadb(buf, n, 0, &je);
    free(buf);
    json_t *merges = json_object_get(json_object_get(j, "model"), "merges");
    json_t *strs = json_array();
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *m = json_array_get(merges, i);
        char s[64];
        snprintf(s, sizeof s, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_append_new(strs, json_string(s));
    }
    json_object_set_new(json_object_get(j, "model"), "merges", strs);
    char *dump = json_dumps(j, 0);
    st_tokenizer *tok = NULL;
    st_status st = st_tok_load_buffer(dump, strlen(dump), "tiny-strings", &tok, &err);
    int ok = st == ST_OK;
    for (size_t i = 0; ok && i < 6; i++) {
        idvec r = enc(tok, TINY[i].text, strlen(TINY[i].text), 1);
        ok = ids_equal_list(r.v, r.n, TINY[i].ids, (size_t)TINY[i].n);
        free(r.v);
    }
    CHECK(ok, "merges as \"a b\" strings give the same ids as [a, b] pairs");
    st_tok_free(tok);
    /* mixing both forms is rejected, as by HF's untagged deserializer */
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"),
                          json_pack("[ss]", "h", "e"));
    free(dump);
    dump = json_dumps(j, 0);
    st = st_tok_load_buffer(dump, strlen(dump), "tiny-mixed", &tok, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "merges"), "mixed merge forms rejected: %s",
          st ? err.msg : "loaded");
    st_tok_free(tok);
    free(dump);
    json_decref(j);
}

typedef struct pieces {
    char buf[1024];
    size_t len;
    int n;
} pieces;

/* Pieces joined by '|' (added tokens shown as <id>). */
static int collect_piece(const st_tok_piece *p, void *user) {
    pieces *ps = user;
    if (ps->n++ && ps->len < sizeof ps->buf - 1) ps->buf[ps->len++] = '|';
    if (p->added_id >= 0)
        ps->len += (size_t)snprintf(ps->buf + ps->len, sizeof ps->buf - ps->len, "<%d>", p->added_id);
    else if (ps->len + p->len < sizeof ps->buf - 1)
        memcpy(ps->buf + ps->len, p->text, p->len), ps->len += p->len;
    ps->buf[ps->len] = '\0';
    return 0;
}

/* ==== Split behaviours, ByteLevel options, BPE options (variants of the tiny tokenizer) ==== */

/* The tiny tokenizer.json with a change applied by `edit`, loaded from memory. */
static st_tokenizer *tiny_variant(void (*edit)(json_t *root, const void *arg), const void *arg) {
    json_error_t je;
    json_t *j = json_load_file(data_path("tokenizers/tiny/tokenizer.json"), 0, &je);
    if (!j) return NULL;
    edit(j, arg);
    char *dump = json_dumps(j, 0);
    json_decref(j);
    st_tokenizer *tok = NULL;
    st_error err;
    if (st_tok_load_buffer(dump, strlen(dump), "tiny-variant", &tok, &err) != ST_OK)
        printf("# %s\n", err.msg);
    free(dump);
    return tok;
}

/* arg: a JSON text for the new pre_tokenizer */
static void set_pretok(json_t *root, const void *arg) {
    json_error_t je;
    json_object_set_new(root, "pre_tokenizer", json_loads(arg, 0, &je));
}

typedef struct behavior_case {
    const char *pretok; /* pre_tokenizer JSON */
    const char *text;
    const char *pieces;
    const char *why;
} behavior_case;

#define SPLIT_DASH(beh, inv)                                                                  \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-\"}," \
    "\"behavior\":\"" beh "\",\"invert\":" inv "},{\"type\":\"ByteLevel\",\"add_prefix_space\":false," \
    "\"use_regex\":false}]}"

/* Expected pieces follow HF's NormalizedString::split on "a-b--c" (matches at 1, 3, 4). */
static const behavior_case BEHAVIORS[] = {
    {SPLIT_DASH("Isolated", "false"), "a-b--c", "a|-|b|-|-|c", "Split Isolated"},
    {SPLIT_DASH("Removed", "false"), "a-b--c", "a|b|c", "Split Removed"},
    {SPLIT_DASH("MergedWithPrevious", "false"), "a-b--c", "a-|b-|-|c", "Split MergedWithPrevious"},
    {SPLIT_DASH("MergedWithNext", "false"), "a-b--c", "a|-b|-|-c", "Split MergedWithNext"},
    {SPLIT_DASH("Contiguous", "false"), "a-b--c", "a|-|b|--|c", "Split Contiguous"},
    {SPLIT_DASH("Removed", "true"), "a-b--c", "-|-|-", "Split Removed, invert"},
    {SPLIT_DASH("MergedWithPrevious", "true"), "a-b--c", "a|-b|-|-c",
     "Split MergedWithPrevious, invert"},
    {"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\".\"},"
     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
     "\"use_regex\":false}]}",
     "a.b+c", "a|.|b+c", "Split with a String pattern is literal"},
    {"{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", "Hello  world<s>Hi",
     " Hello| | world|<266>| Hi", "bare ByteLevel: GPT-2 regex and a prefix space per piece"},
    {"{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", "it's 12 ok?!  \n",
     "it|'s| 12| ok|?!|  \n", "bare ByteLevel without prefix space"},
    {"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\" \"},"
     "\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\d\"},"
     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
     "\"use_regex\":false}]}",
     "ab12 cd3", "ab|1|2|cd|3", "two Split steps in a row"},
    {"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x*\"},"
     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
     "\"use_regex\":false}]}",
     "abxxc", "a|b|xx|c", "a pattern that matches empty strings"},
};

static void test_behaviors(void) {
    for (size_t i = 0; i < sizeof BEHAVIORS / sizeof BEHAVIORS[0]; i++) {
        const behavior_case *c = &BEHAVIORS[i];
        st_tokenizer *tok = tiny_variant(set_pretok, c->pretok);
        pieces ps;
        memset(&ps, 0, sizeof ps);
        st_error err;
        if (tok) st_tok_split(tok, c->text, strlen(c->text), 1, collect_piece, &ps, &err);
        if (!CHECK(tok && !strcmp(ps.buf, c->pieces), "%s", c->why))
            printf("#   got [%s] want [%s]\n", ps.buf, c->pieces);
        st_tok_free(tok);
    }
}

/* model options: arg selects the change */
static void set_model_option(json_t *root, const void *arg) {
    json_t *m = json_object_get(root, "model"), *v = json_object_get(m, "vocab");
    const char *what = arg;
    if (!strcmp(what, "ignore_merges")) {
        json_object_set_new(v, "xyz", json_integer(300));
        json_object_set_new(m, "ignore_merges", json_true());
    } else if (!strcmp(what, "no_ignore_merges")) {
        json_object_set_new(v, "xyz", json_integer(300));
    } else if (!strcmp(what, "byte_fallback")) {
        json_object_del(v, "z");
        json_object_set_new(v, "<0x7A>", json_integer(300));
        json_object_set_new(m, "byte_fallback", json_true());
    } else if (!strcmp(what, "unk") || !strcmp(what, "unk_fused")) {
        json_object_del(v, "q");
        json_object_set_new(v, "<unk>", json_integer(300));
        json_object_set_new(m, "unk_token", json_string("<unk>"));
        json_object_set_new(m, "fuse_unk", json_boolean(!strcmp(what, "unk_fused")));
    } else if (!strcmp(what, "drop")) {
        json_object_del(v, "q");
    } else if (!strcmp(what, "nfkc")) {
        json_object_set_new(root, "normalizer",
                            json_pack("{s:s,s:[{s:s},{s:s}]}", "type", "Sequence", "normalizers",
                                      "type", "NFD", "type", "NFKC"));
    } else if (!strcmp(what, "no_normalizer")) {
        json_object_set_new(root, "normalizer", json_null());
    }
}

typedef struct option_case {
    const char *option, *text;
    int32_t ids[8];
    int n;
    const char *why;
} option_case;

static const option_case OPTIONS[] = {
    {"ignore_merges", "xyz", {300}, 1, "ignore_merges: a whole word in the vocab is one token"},
    {"no_ignore_merges", "xyz", {120, 121, 122}, 3, "without ignore_merges: BPE from bytes"},
    {"ignore_merges", "hello", {259}, 1, "ignore_merges: merges still apply otherwise"},
    {"byte_fallback", "zz", {300, 300}, 2, "byte_fallback: a missing byte uses <0x7A>"},
    {"unk", "aqqb", {97, 300, 300, 98}, 4, "unk_token: one <unk> per unknown byte"},
    {"unk_fused", "aqqb", {97, 300, 98}, 3, "fuse_unk: consecutive unknowns become one <unk>"},
    {"drop", "aqqb", {97, 98}, 2, "no unk, no fallback: unknown bytes are dropped (as HF does)"},
    {"nfkc", "\xEF\xAC\x81" "x", {102, 105, 120}, 3, "Sequence[NFD, NFKC]: U+FB01 becomes \"fi\""},
    {"no_normalizer", "A\xCC\x8A" "B", {65, 204, 138, 66}, 4,
     "normalizer null: no NFC, so the normalized token does not match"},
};

static void test_model_options(void) {
    for (size_t i = 0; i < sizeof OPTIONS / sizeof OPTIONS[0]; i++) {
        const option_case *c = &OPTIONS[i];
        st_tokenizer *tok = tiny_variant(set_model_option, c->option);
        idvec r = {NULL, 0};
        if (tok) r = enc(tok, c->text, strlen(c->text), 1);
        if (!CHECK(tok && ids_equal_list(r.v, r.n, c->ids, (size_t)c->n), "%s", c->why))
            show_ids("got", r.v, r.n);
        free(r.v);
        st_tok_free(tok);
    }
}

/* ==== Streaming ==== */

static int stream_matches(const st_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                          size_t *max_pending) {
    st_tok_stream *s = NULL;
    st_error err;
    if (st_tok_stream_create(tok, skip, &s, &err) != ST_OK) return 0;
    size_t cap = 1024, len = 0;
    char *acc = malloc(cap);
    int ok = 1;
    for (size_t i = 0; i <= n; i++) {
        const char *t;
        size_t k = i < n ? st_tok_stream_feed(s, ids[i], &t) : st_tok_stream_flush(s, &t);
        size_t p = st_tok_stream_pending(s);
        if (max_pending && p > *max_pending) *max_pending = p;
        /* every chunk is complete UTF-8 on its own */
        const char *bad = NULL;
        for (size_t q = 0; q < k;) {
            unsigned char c = (unsigned char)t[q];
            size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (q + need > k) {
                bad = t + q;
                break;
            }
            q += need;
        }
        if (bad) ok = 0;
        while (len + k + 1 > cap) cap *= 2, acc = realloc(acc, cap);
        memcpy(acc + len, t, k);
        len += k;
    }
    size_t dl = 0;
    char *d = dec(tok, ids, n, skip, &dl);
    ok = ok && d && dl == len && memcmp(d, acc, len) == 0;
    free(d);
    free(acc);
    st_tok_stream_free(s);
    return ok;
}

static void test_stream(const st_tokenizer *tok) {
    static const char *texts[] = {
        "🙂🚀👍🏽 emoji 🇯🇵",
        "你好，世界！今天天气很好。",
        "こんにちは世界 안녕하세요 مرحبا",
        "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag ❤️‍🔥",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝓂𝒶𝓉𝒽 𐍈 𒀀",
        "<|im_start|>assistant\n好的😀<|im_end|>",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        idvec r = enc(tok, texts[i], strlen(texts[i]), 1);
        size_t maxp = 0;
        int ok = stream_matches(tok, r.v, r.n, 0, &maxp) && stream_matches(tok, r.v, r.n, 1, NULL);
        CHECK(ok, "stream \"%s\": complete characters only, same text as decode (held back up to %zu bytes)",
              label(texts[i], strlen(texts[i])), maxp);
        free(r.v);
    }
    /* a character split across tokens is held back, then released whole */
    int32_t flag[] = {11162, 229, 107}; /* " " + first bytes of U+1F1EF, then the rest */
    st_tok_stream *s;
    st_error err;
    st_tok_stream_create(tok, 0, &s, &err);
    const char *t;
    size_t k1 = st_tok_stream_feed(s, flag[0], &t);
    size_t p1 = st_tok_stream_pending(s);
    size_t k2 = st_tok_stream_feed(s, flag[1], &t);
    size_t k3 = st_tok_stream_feed(s, flag[2], &t);
    CHECK(k1 == 1 && p1 == 2 && k2 == 0 && k3 == 4 && !memcmp(t, "\xF0\x9F\x87\xAF", 4),
          "stream holds back a split emoji and emits it whole (%zu,%zu,%zu,%zu)", k1, p1, k2, k3);
    /* ids of the one-byte tokens */
    int32_t byte_ids[256];
    for (int b = 0; b < 256; b++) byte_ids[b] = -1;
    for (int32_t id = 0; id < 151643; id++) {
        size_t bl;
        const char *bb = st_tok_token_bytes(tok, id, &bl);
        if (bb && bl == 1) byte_ids[(unsigned char)bb[0]] = id;
    }
    /* invalid bytes: a lone continuation byte, then a lead byte cut by a space, then a lead
     * byte at the end -> one U+FFFD each, exactly like decode */
    int32_t bad[] = {byte_ids[0x80], 9707, byte_ids[0xF0], 220, byte_ids[0xF0]};
    st_tok_stream_reset(s);
    int ok = bad[0] >= 0 && bad[2] >= 0 && stream_matches(tok, bad, 5, 0, NULL);
    size_t l = 0;
    char *d = dec(tok, bad, 5, 0, &l);
    CHECK(ok && d && !strcmp(d, "\xEF\xBF\xBDHello\xEF\xBF\xBD \xEF\xBF\xBD"),
          "invalid bytes become U+FFFD in decode and stream alike");
    free(d);
    st_tok_stream_free(s);
    /* random byte-token sequences: stream == decode */
    unsigned seed = 12345;
    int all = 1;
    for (int round = 0; round < 300; round++) {
        int32_t seq[40];
        size_t n = 1 + (size_t)(round % 40);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 16) & 0x7fff;
            /* bias toward UTF-8 structure: leads, continuations, ASCII, and whole tokens */
            int b = (r % 4 == 0) ? 0x80 + (int)(r % 64) : (r % 4 == 1) ? 0xC0 + (int)(r % 64)
                  : (r % 4 == 2) ? 'a' + (int)(r % 26) : -1;
            seq[i] = b >= 0 ? byte_ids[b] : (int32_t)(r % 151700);
        }
        all &= stream_matches(tok, seq, n, (round & 1), NULL);
    }
    CHECK(all, "300 random id sequences: stream output == decode output");
}

/* ==== Qwen3.5 pre-tokenizer regex ==== */

/* The Qwen3 pattern as written (JSON-escaped) in tokenizer.json, and the Qwen3.5 one. */
static const char QWEN3_RE_JSON[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
static const char QWEN35_RE_JSON[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

/* Build the Qwen3.5 variant: the Qwen3 file with its regex replaced. */
static st_tokenizer *load_qwen35(void) {
    char *buf = NULL;
    size_t n = 0;
    st_error err;
    if (st_file_read(data_path("tokenizers/qwen3/tokenizer.json"), 64 << 20, &buf, &n, &err) != ST_OK)
        return NULL;
    char *at = strstr(buf, QWEN3_RE_JSON);
    if (!at) {
        free(buf);
        return NULL;
    }
    size_t ol = strlen(QWEN3_RE_JSON), nl = strlen(QWEN35_RE_JSON);
    char *nb = malloc(n - ol + nl + 1);
    size_t pre = (size_t)(at - buf);
    memcpy(nb, buf, pre);
    memcpy(nb + pre, QWEN35_RE_JSON, nl);
    memcpy(nb + pre + nl, at + ol, n - pre - ol);
    st_tokenizer *tok = NULL;
    if (st_tok_load_buffer(nb, n - ol + nl, "qwen3.5-regex", &tok, &err) != ST_OK)
        printf("# %s\n", err.msg);
    free(buf);
    free(nb);
    return tok;
}

static const char *split_str(const st_tokenizer *tok, const char *text, pieces *ps) {
    memset(ps, 0, sizeof *ps);
    st_error err;
    if (st_tok_split(tok, text, strlen(text), 1, collect_piece, ps, &err) != ST_OK)
        snprintf(ps->buf, sizeof ps->buf, "ERROR %.900s", err.msg);
    return ps->buf;
}

typedef struct split_case {
    const char *text;
    const char *qwen3;  /* pieces with the Qwen3 regex */
    const char *qwen35; /* pieces with the Qwen3.5 regex */
    const char *why;
} split_case;

/* Expected pieces, worked out from the patterns (NFC runs first):
 *  - Qwen3's letter run [^\r\n\p{L}\p{N}]?\p{L}+ stops at a combining mark; the mark then starts
 *    the next run as its optional prefix, or falls to " ?[^\s\p{L}\p{N}]+" when no letter
 *    follows. Qwen3.5's [\p{L}\p{M}]+ keeps marks inside the run. */
static const split_case SPLITS[] = {
    {"e\xCC\x81", "\xC3\xA9", "\xC3\xA9", "NFD e+U+0301 is composed by NFC first: one letter"},
    {"q\xCC\x81 x", "q|\xCC\x81| x", "q\xCC\x81| x",
     "q+U+0301 has no composed form: Qwen3 splits the mark off, Qwen3.5 keeps it"},
    {"\xCC\x81" "abc", "\xCC\x81" "abc", "\xCC\x81" "abc", "a leading mark is the optional prefix"},
    {"\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
     "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8|\xE0\xA5\x8D\xE0\xA4\xA4|\xE0\xA5\x87",
     "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
     "Devanagari namaste: virama and vowel sign (Mn) split in Qwen3, one word in Qwen3.5"},
    {"\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5",
     "\xE0\xB8\xAA\xE0\xB8\xA7|\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94|\xE0\xB8\xB5",
     "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5",
     "Thai sawasdee: vowel marks (Mn) split in Qwen3, one word in Qwen3.5"},
    {" \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87!",
     " \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8|\xE0\xA5\x8D\xE0\xA4\xA4|\xE0\xA5\x87!",
     " \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87|!",
     "space prefix, then punctuation: Qwen3 glues the last mark to '!', Qwen3.5 does not"},
    {"x\xCC\x81\xCC\xA3!", "x|\xCC\xA3\xCC\x81!", "x\xCC\xA3\xCC\x81|!",
     "two marks are reordered by NFC (ccc 220 before 230); runs as above"},
    {"Hello world's 123", "Hello| world|'s| |1|2|3", "Hello| world|'s| |1|2|3",
     "plain ASCII: both patterns agree"},
};

static void test_qwen35(const st_tokenizer *q3) {
    st_tokenizer *q35 = load_qwen35();
    if (!CHECK(q35 != NULL, "Qwen3.5 regex variant loads")) return;
    for (size_t i = 0; i < sizeof SPLITS / sizeof SPLITS[0]; i++) {
        const split_case *c = &SPLITS[i];
        pieces a, b;
        const char *s3 = split_str(q3, c->text, &a), *s35 = split_str(q35, c->text, &b);
        if (!CHECK(!strcmp(s3, c->qwen3) && !strcmp(s35, c->qwen35), "split: %s", c->why))
            printf("#   qwen3  [%s]\n#   qwen35 [%s]\n", s3, s35);
    }
    test_json_cases(q35, "tokenizers/qwen35-goldens.json", "qwen3.5-regex goldens");
    st_tok_free(q35);
}

/* ==== Errors ==== */

typedef struct err_case {
    const char *json;
    st_status want;
    const char *msg_has;
    const char *why;
} err_case;

#define BL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}," \
           "\"decoder\":{\"type\":\"ByteLevel\"}"
#define VOC "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

static const err_case ERRS[] = {
    {"{" BL "}", ST_ERR_MISSING, "\"model\"", "missing model"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"a c\"]}," BL "}", ST_ERR_FORMAT,
     "merges[0]: \"c\" is not in the vocab", "merge with an unknown token"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"a  b\"]}," BL "}", ST_ERR_FORMAT,
     "exactly one space", "merge string with two spaces"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[[\"a\"]]}," BL "}", ST_ERR_FORMAT,
     "merges[0]", "merge pair with one element"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}," BL "}",
     ST_ERR_FORMAT, "\"ab\" is not in the vocab", "merge result not in the vocab"},
    {"{\"model\":{\"type\":\"WordPiece\"," VOC "}," BL "}", ST_ERR_UNSUPPORTED, "WordPiece",
     "unknown model type"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]}," BL ",\"normalizer\":{\"type\":\"Lowercase\"}}",
     ST_ERR_UNSUPPORTED, "Lowercase", "unsupported normalizer"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Whitespace\"},"
     "\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "Whitespace", "unsupported pre-tokenizer"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":null,"
     "\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "pre_tokenizer", "no pre-tokenizer"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
     "\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Isolated\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "ByteLevel must be the last", "Split without ByteLevel"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Sequence\","
     "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"},"
     "{\"type\":\"ByteLevel\",\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_FORMAT, "bad regex", "regex that does not compile"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[],\"dropout\":0.1}," BL "}",
     ST_ERR_UNSUPPORTED, "dropout", "BPE dropout"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[],\"continuing_subword_prefix\":\"##\"}," BL "}",
     ST_ERR_UNSUPPORTED, "continuing_subword_prefix", "subword prefix"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[],\"end_of_word_suffix\":\"</w>\"}," BL "}",
     ST_ERR_UNSUPPORTED, "end_of_word_suffix", "end-of-word suffix"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}," BL "}",
     ST_ERR_FORMAT, "id 0 is given to both", "two tokens with one id"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}," BL "}", ST_ERR_LIMIT,
     "outside", "negative id"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}," BL "}", ST_ERR_LIMIT,
     "outside", "huge id"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}," BL "}", ST_ERR_FORMAT,
     "not an integer", "id not a number"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"decoder\":{\"type\":\"WordPiece\"},"
     "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "decoder", "unsupported decoder"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]}," BL ",\"added_tokens\":[{\"id\":5}]}",
     ST_ERR_FORMAT, "added_tokens[0]", "added token without content"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]}," BL ",\"added_tokens\":[{\"id\":5,"
     "\"content\":\"x\",\"special\":\"yes\"}]}",
     ST_ERR_FORMAT, "not a boolean", "added token flag not a boolean"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
     "\"pattern\":{\"Regex\":\"[[:alpha:]]\"},\"behavior\":\"Isolated\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "POSIX", "regex with a POSIX class (Oniguruma meaning differs)"},
    {"{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
     "\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"},\"decoder\":{\"type\":\"ByteLevel\"}}",
     ST_ERR_UNSUPPORTED, "Sideways", "unknown Split behavior"},
    {"[1,2,3]", ST_ERR_FORMAT, "not a JSON object", "top level not an object"},
    {"", ST_ERR_FORMAT, "invalid JSON", "empty file"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}", ST_ERR_FORMAT, "invalid JSON",
     "truncated JSON"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}," BL "} trailing",
     ST_ERR_FORMAT, "invalid JSON", "garbage after the JSON"},
};

static void test_errors(void) {
    st_error err;
    for (size_t i = 0; i < sizeof ERRS / sizeof ERRS[0]; i++) {
        const err_case *c = &ERRS[i];
        st_tokenizer *tok = (st_tokenizer *)1;
        st_error_clear(&err);
        st_status st = st_tok_load_buffer(c->json, strlen(c->json), "bad.json", &tok, &err);
        if (!CHECK(st == c->want && tok == NULL && strstr(err.msg, c->msg_has) &&
                       !strncmp(err.msg, "bad.json", 8),
                   "error: %s -> %s", c->why, err.msg))
            printf("#   status %d (want %d)\n", st, c->want);
    }
    /* a truncated real file */
    char *buf = NULL;
    size_t n = 0;
    st_file_read(data_path("tokenizers/tiny/tokenizer.json"), 1 << 20, &buf, &n, &err);
    st_tokenizer *tok = NULL;
    st_status st = st_tok_load_buffer(buf, n / 2, "half.json", &tok, &err);
    CHECK(st == ST_ERR_FORMAT && strstr(err.msg, "half.json: invalid JSON at line"),
          "truncated tokenizer.json: %s", err.msg);
    free(buf);
    st = st_tok_load(data_path("no/such/tokenizer.json"), &tok, &err);
    CHECK(st == ST_ERR_IO && strstr(err.msg, "no/such/tokenizer.json"), "missing file: %s", err.msg);
    st = st_tok_load_dir(data_path("peer-tests"), &tok, &err);
    CHECK(st == ST_ERR_MISSING && strstr(err.msg, "no tokenizer.json"), "directory without tokenizer.json: %s",
          err.msg);
    st = st_tok_load_dir(data_path("tokenizers/tiny"), &tok, &err);
    CHECK(st == ST_OK && tok, "load_dir finds DIR/tokenizer.json");
    /* invalid UTF-8 text is rejected, naming the offset */
    int32_t *ids = NULL;
    size_t nid = 0;
    st = st_tok_encode(tok, "ok\xC3(", 4, 1, &ids, &nid, &err);
    CHECK(st == ST_ERR_ARG && strstr(err.msg, "byte 2") && !ids && nid == 0,
          "invalid UTF-8 rejected: %s", err.msg);
    st_tok_ids v = {NULL, 0, 0};
    st_tok_encode_append(tok, "hello", 5, 1, &v, &err);
    size_t before = v.n;
    st = st_tok_encode_append(tok, "\xFF", 1, 1, &v, &err);
    CHECK(st == ST_ERR_ARG && v.n == before && before == 1, "failed append leaves the buffer as it was");
    st_tok_ids_free(&v);
    st_tok_free(tok);
    st_tok_free(NULL);
}

/* HF's added-token id rule: a content already in the vocab takes the vocab id; new contents
 * follow the vocab. A disagreeing "id" in the file is overridden (with a warning). */
static void test_added_ids(void) {
    const char *j =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"b\"]]},"
        BL ",\"added_tokens\":[{\"id\":7,\"content\":\"ab\",\"special\":true},"
        "{\"id\":3,\"content\":\"<x>\",\"special\":false},{\"id\":9,\"content\":\"<y>\",\"special\":true}]}";
    st_tokenizer *tok = NULL;
    st_error err;
    st_status st = st_tok_load_buffer(j, strlen(j), "ids.json", &tok, &err);
    CHECK(st == ST_OK && st_tok_token_to_id(tok, "ab", 2) == 2 &&
              st_tok_token_to_id(tok, "<x>", 3) == 3 && st_tok_token_to_id(tok, "<y>", 3) == 4 &&
              st_tok_is_special(tok, 2) && st_tok_vocab_size(tok) == 5,
          "added-token ids follow HF's rule (vocab id, then after the vocab)");
    st_tok_free(tok);
}

/* ==== Threads ==== */

/* Several threads encode the same texts on one tokenizer (the word cache goes to whichever
 * thread gets its lock); every result must equal the single-threaded one. */
typedef struct thread_job {
    const st_tokenizer *tok;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int ok;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    j->ok = 1;
    for (int r = 0; r < 40; r++) {
        int32_t *ids = NULL;
        size_t n = 0;
        st_error err;
        if (st_tok_encode(j->tok, j->text, j->len, 1, &ids, &n, &err) != ST_OK ||
            !ids_equal_list(ids, n, j->want, j->n_want))
            j->ok = 0;
        free(ids);
    }
    return NULL;
}

static void test_threads(const st_tokenizer *tok) {
    static const char text[] =
        "The quick brown fox jumps over the lazy dog. 你好，世界！ def f(x): return x ** 2\n"
        "<|im_start|>user\nI'm sure they'll've done it, we'd, you're, it's<|im_end|>\n";
    idvec want = enc(tok, text, strlen(text), 1);
    enum { NT = 4 };
    pthread_t th[NT];
    thread_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (thread_job){tok, text, strlen(text), want.v, want.n, 0};
        pthread_create(&th[i], NULL, thread_main, &jobs[i]);
    }
    int ok = 1;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        ok &= jobs[i].ok;
    }
    CHECK(ok, "%d threads encoding on one tokenizer get the single-threaded ids", NT);
    free(want.v);
}

/* ==== Encoding with a limit ==== */

/* A prompt over the context costs about the context's worth of work, not the prompt's:
 * encoding stops as soon as there are more ids than allowed, and a single long piece is
 * refused before its merges are worked out. */
static void test_limit(const st_tokenizer *tok) {
    const char *text = "Hello world, this is a sentence of several tokens, and then some more.";
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    st_error err = {0};
    st_tok_encode(tok, text, strlen(text), 1, &a, &na, &err);
    st_status in = st_tok_encode_limit(tok, text, strlen(text), 1, na, &b, &nb, &err);
    int same = in == ST_OK && nb == na && !memcmp(a, b, na * sizeof *a);
    free(b);
    b = NULL;
    st_status over = st_tok_encode_limit(tok, text, strlen(text), 1, na - 1, &b, &nb, &err);
    CHECK(same && over == ST_ERR_LIMIT && !b && nb == 0,
          "encode_limit: the same ids at the limit, ST_ERR_LIMIT one below (%s)", err.msg);
    free(a);
    size_t big = (size_t)3 << 20; /* one 3 MB piece, and 3 MB of words */
    char *x = malloc(big + 1);
    memset(x, 'x', big);
    x[big] = 0;
    double t0 = now_s();
    over = st_tok_encode_limit(tok, x, big, 1, 1000, &b, &nb, &err);
    double t1 = now_s();
    for (size_t i = 0; i < big; i++) x[i] = i % 6 == 5 ? ' ' : "lorem"[i % 6];
    st_status over2 = st_tok_encode_limit(tok, x, big, 1, 1000, &b, &nb, &err);
    double t2 = now_s();
    CHECK(over == ST_ERR_LIMIT && over2 == ST_ERR_LIMIT && t1 - t0 < 0.3 && t2 - t1 < 0.3,
          "3 MB of text with a limit of 1,000 ids is refused early (%.3f s one piece, %.3f s words)", t1 - t0,
          t2 - t1);
    free(x);
}

/* ==== Main ==== */

int main(void) {
    st_error err;
    st_tokenizer *tok = NULL;
    double t0 = now_s();
    st_status st = st_tok_load(data_path("tokenizers/qwen3/tokenizer.json"), &tok, &err);
    double dt = now_s() - t0;
    if (!CHECK(st == ST_OK, "qwen3 tokenizer.json loads (%.0f ms)", dt * 1000)) {
        printf("# %s\n", err.msg);
        return tap_done();
    }
    printf("# qwen3 load: %.1f ms\n", dt * 1000);
    test_lookups(tok);
    test_json_cases(tok, "tokenizer-A.json", "tokenizer-A");
    test_llama_cpp(tok);
    test_json_cases(tok, "tokenizers/qwen3/goldens.json", "qwen3 goldens");
    test_special(tok);
    test_stream(tok);
    test_threads(tok);
    test_qwen35(tok);
    test_tiny();
    test_merge_forms();
    test_behaviors();
    test_model_options();
    test_added_ids();
    test_errors();
    test_limit(tok);
    st_tok_free(tok);
    return tap_done();
}
