/* ==== Tokenizer: loading tokenizer.json ====
 *
 * Reads the file and builds the immutable tables of st_tokenizer. The two big sections,
 * model.vocab and model.merges, are read straight from the text by the strict scanner of
 * tok_json.c (jansson would build ~450k nodes for them: 0.4 s for Qwen3); everything else is
 * parsed by jansson from a copy of the document with those two values emptied. Built here:
 *   - the id table (token string and decoded bytes of every id) in one arena sized up front,
 *   - the vocab map (token string -> id) and the merges map ((id_a, id_b) -> rank, merged id),
 *   - the normalizer list, the pre-tokenizer steps (compiled regexes) and the added tokens
 *     with their two tries (raw and normalized).
 * Everything in the file is untrusted: types, ranges and sizes are checked, and every problem
 * is reported as a status plus a message naming the file and the field.
 *
 * Added-token ids follow Hugging Face's AddedVocabulary rule (a content that is in the vocab
 * gets the vocab id; a new content gets the next id after the vocab / the largest added id);
 * when the file's "id" disagrees a warning is logged and HF's id is used.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/fileio.h"
#include "core/log.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_json.h"

/* The pattern ByteLevel uses when use_regex is true (GPT-2's). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ==== Small helpers ==== */

static st_status fail(st_error *err, st_status st, const st_tokenizer *t, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static st_status fail(st_error *err, st_status st, const st_tokenizer *t, const char *fmt, ...) {
    if (!err) return st;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return st_error_set(err, st, "%s: %s", t->name, msg);
}

/* Optional boolean field: absent or null gives def; another type is an error (-1). */
static int get_bool(const json_t *obj, const char *key, int def) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) return -1;
    return json_is_true(v);
}

/* Short, printable excerpt of a token for messages. */
static const char *excerpt(const char *s, size_t n, char *buf, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n && w + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7F) w += (size_t)snprintf(buf + w, cap - w, "\\x%02X", c);
        else buf[w++] = (char)c;
    }
    buf[w < cap ? w : cap - 1] = '\0';
    return buf;
}

static char *arena_put(st_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    ST_ASSERT(t->arena_len + n + 1 <= t->arena_cap);
    char *p = t->arena + t->arena_len;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    *off = (uint32_t)t->arena_len;
    t->arena_len += n + 1;
    return p;
}

/* ByteLevel decoding of one token string: every character mapped back to its byte, or, when a
 * character is outside the byte alphabet, the string's own UTF-8 bytes (as HF does). */
static void put_token_bytes(st_tokenizer *t, const char *s, size_t n, st_tok_entry *e) {
    ST_ASSERT(t->arena_len + n + 1 <= t->arena_cap);
    char *dst = t->arena + t->arena_len;
    size_t w = 0, i = 0;
    int mapped = 1;
    while (i < n) {
        uint32_t cp;
        int l = st_utf8_seq((const uint8_t *)s + i, n - i, &cp);
        int b = l ? st_tok_cp_to_byte(cp) : -1;
        if (b < 0) {
            mapped = 0;
            break;
        }
        dst[w++] = (char)b;
        i += (size_t)l;
    }
    if (!mapped) {
        memcpy(dst, s, n);
        w = n;
    }
    dst[w] = '\0';
    e->bytes_off = (uint32_t)t->arena_len;
    e->bytes_len = (uint32_t)w;
    t->arena_len += w + 1;
    if (w > t->max_token_bytes) t->max_token_bytes = w;
}

/* ==== Tries of added tokens ==== */

static void trie_init(st_tok_trie *tr) {
    memset(tr, 0, sizeof *tr);
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
}

static void trie_free(st_tok_trie *tr) {
    free(tr->nodes);
    tr->nodes = NULL;
    tr->n_nodes = tr->cap = 0;
}

static int32_t trie_new_node(st_tok_trie *tr, uint8_t byte) {
    if (tr->n_nodes == tr->cap) {
        size_t nc = tr->cap ? tr->cap * 2 : 64;
        st_tok_trie_node *nn = realloc(tr->nodes, nc * sizeof *nn);
        if (!nn) return -1;
        tr->nodes = nn;
        tr->cap = nc;
    }
    st_tok_trie_node *nd = &tr->nodes[tr->n_nodes];
    nd->child = nd->sibling = nd->added = -1;
    nd->byte = byte;
    return (int32_t)tr->n_nodes++;
}

/* Insert s[0..n) (n >= 1) ending in added index `added`; a later insert of the same bytes
 * replaces the earlier one. Returns -1 on allocation failure. */
static int trie_insert(st_tok_trie *tr, const uint8_t *s, size_t n, int32_t added) {
    int32_t node = tr->root[s[0]];
    if (node < 0) {
        node = trie_new_node(tr, s[0]);
        if (node < 0) return -1;
        tr->root[s[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tr->nodes[node].child, prev = -1;
        while (c >= 0 && tr->nodes[c].byte != s[i]) prev = c, c = tr->nodes[c].sibling;
        if (c < 0) {
            c = trie_new_node(tr, s[i]);
            if (c < 0) return -1;
            if (prev >= 0) tr->nodes[prev].sibling = c;
            else tr->nodes[node].child = c;
        }
        node = c;
    }
    if (tr->nodes[node].added < 0) tr->n_tokens++;
    tr->nodes[node].added = added;
    return 0;
}

/* ==== Sections of tokenizer.json ==== */

static st_status parse_normalizer(st_tokenizer *t, const json_t *n, int depth, st_error *err) {
    if (!n || json_is_null(n)) return ST_OK;
    if (depth > 8) return fail(err, ST_ERR_UNSUPPORTED, t, "normalizer: nested too deeply");
    if (!json_is_object(n)) return fail(err, ST_ERR_FORMAT, t, "normalizer: not an object");
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return fail(err, ST_ERR_FORMAT, t, "normalizer: missing \"type\"");
    int op = 0;
    if (!strcmp(type, "NFC")) op = ST_TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) op = ST_TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) op = ST_TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) op = ST_TOK_NORM_NFKD;
    if (op) {
        if (t->n_norm >= ST_TOK_MAX_STEPS)
            return fail(err, ST_ERR_LIMIT, t, "normalizer: more than %d steps", ST_TOK_MAX_STEPS);
        t->norm[t->n_norm++] = op;
        return ST_OK;
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return fail(err, ST_ERR_FORMAT, t, "normalizer: Sequence without a \"normalizers\" array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            st_status st = parse_normalizer(t, json_array_get(list, i), depth + 1, err);
            if (st != ST_OK) return st;
        }
        return ST_OK;
    }
    return fail(err, ST_ERR_UNSUPPORTED, t,
                "normalizer type \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Sequence, null)",
                type);
}

static st_status add_step(st_tokenizer *t, st_tok_step **out, st_error *err) {
    if (t->n_steps >= ST_TOK_MAX_STEPS)
        return fail(err, ST_ERR_LIMIT, t, "pre_tokenizer: more than %d steps", ST_TOK_MAX_STEPS);
    *out = &t->steps[t->n_steps++];
    memset(*out, 0, sizeof **out);
    return ST_OK;
}

static st_status compile_step_re(st_tokenizer *t, st_tok_step *s, const char *pat, size_t len,
                                  int literal, const char *what, st_error *err) {
    char field[64];
    snprintf(field, sizeof field, "%s", what);
    st_status st = st_tok_regex_compile(&s->re, pat, len, literal, field, err);
    if (st != ST_OK) {
        st_error_prefix(err, "%s: ", t->name);
        return st;
    }
    s->has_re = 1;
    uint32_t pairs = 0;
    pcre2_pattern_info(s->re.code, PCRE2_INFO_CAPTURECOUNT, &pairs);
    if (pairs + 1 > t->max_capture_pairs) t->max_capture_pairs = pairs + 1;
    return ST_OK;
}

static st_status parse_pretok(st_tokenizer *t, const json_t *p, int depth, st_error *err) {
    if (depth > 8) return fail(err, ST_ERR_UNSUPPORTED, t, "pre_tokenizer: nested too deeply");
    if (!json_is_object(p)) return fail(err, ST_ERR_FORMAT, t, "pre_tokenizer: not an object");
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return fail(err, ST_ERR_FORMAT, t, "pre_tokenizer: missing \"type\"");
    st_status st;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return fail(err, ST_ERR_FORMAT, t,
                        "pre_tokenizer: Sequence without a \"pretokenizers\" array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if ((st = parse_pretok(t, json_array_get(list, i), depth + 1, err)) != ST_OK) return st;
        return ST_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        st_tok_step *s = NULL;
        if ((st = add_step(t, &s, err)) != ST_OK) return st;
        s->byte_level = 1;
        int aps = get_bool(p, "add_prefix_space", 1), ur = get_bool(p, "use_regex", 1);
        if (aps < 0 || ur < 0)
            return fail(err, ST_ERR_FORMAT, t, "pre_tokenizer ByteLevel: a flag is not a boolean");
        s->add_prefix_space = aps;
        if (ur)
            return compile_step_re(t, s, GPT2_PATTERN, strlen(GPT2_PATTERN), 0,
                                   "pre_tokenizer ByteLevel (GPT-2 regex)", err);
        return ST_OK;
    }
    if (!strcmp(type, "Split")) {
        st_tok_step *s = NULL;
        if ((st = add_step(t, &s, err)) != ST_OK) return st;
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *rx = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        const json_t *v = json_is_string(rx) ? rx : lit;
        if (!json_is_object(pat) || !json_is_string(v))
            return fail(err, ST_ERR_FORMAT, t,
                        "pre_tokenizer Split: \"pattern\" must be {\"Regex\": ...} or "
                        "{\"String\": ...}");
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!beh) return fail(err, ST_ERR_FORMAT, t, "pre_tokenizer Split: missing \"behavior\"");
        if (!strcmp(beh, "Removed")) s->behavior = ST_TOK_SPLIT_REMOVED;
        else if (!strcmp(beh, "Isolated")) s->behavior = ST_TOK_SPLIT_ISOLATED;
        else if (!strcmp(beh, "MergedWithPrevious")) s->behavior = ST_TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(beh, "MergedWithNext")) s->behavior = ST_TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(beh, "Contiguous")) s->behavior = ST_TOK_SPLIT_CONTIGUOUS;
        else
            return fail(err, ST_ERR_UNSUPPORTED, t, "pre_tokenizer Split: unknown behavior \"%s\"",
                        beh);
        int inv = get_bool(p, "invert", 0);
        if (inv < 0) return fail(err, ST_ERR_FORMAT, t, "pre_tokenizer Split: bad \"invert\"");
        s->invert = inv;
        return compile_step_re(t, s, json_string_value(v), json_string_length(v), v == lit,
                               "pre_tokenizer Split pattern", err);
    }
    return fail(err, ST_ERR_UNSUPPORTED, t,
                "pre_tokenizer type \"%s\" is not supported (Split, ByteLevel, Sequence)", type);
}

static st_status parse_decoder(st_tokenizer *t, const json_t *d, st_error *err) {
    if (!d || json_is_null(d))
        return fail(err, ST_ERR_UNSUPPORTED, t,
                    "decoder: null; only the ByteLevel decoder is supported");
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return fail(err, ST_ERR_FORMAT, t, "decoder: missing \"type\"");
    if (!strcmp(type, "ByteLevel")) return ST_OK;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list) || json_array_size(list) == 0)
            return fail(err, ST_ERR_FORMAT, t, "decoder: Sequence without decoders");
        for (size_t i = 0; i < json_array_size(list); i++) {
            const char *ty = json_string_value(json_object_get(json_array_get(list, i), "type"));
            if (!ty || strcmp(ty, "ByteLevel"))
                return fail(err, ST_ERR_UNSUPPORTED, t,
                            "decoder: Sequence item \"%s\" is not supported (ByteLevel only)",
                            ty ? ty : "?");
        }
        return ST_OK;
    }
    return fail(err, ST_ERR_UNSUPPORTED, t,
                "decoder type \"%s\" is not supported (ByteLevel only)", type);
}

/* BPE options other than vocab and merges. */
static st_status parse_model_options(st_tokenizer *t, const json_t *m, st_error *err) {
    const json_t *v = json_object_get(m, "dropout");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v))
            return fail(err, ST_ERR_FORMAT, t, "model.dropout: not a number");
        double d = json_number_value(v);
        if (!(d >= 0.0 && d <= 1.0))
            return fail(err, ST_ERR_FORMAT, t, "model.dropout: %g is outside [0, 1]", d);
        if (d > 0.0)
            return fail(err, ST_ERR_UNSUPPORTED, t,
                        "model.dropout = %g: BPE dropout is not supported", d);
    }
    static const char *const affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(m, affix[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) return fail(err, ST_ERR_FORMAT, t, "model.%s: not a string", affix[i]);
        if (json_string_length(v) > 0)
            return fail(err, ST_ERR_UNSUPPORTED, t, "model.%s = \"%s\" is not supported", affix[i],
                        json_string_value(v));
    }
    int b;
    if ((b = get_bool(m, "ignore_merges", 0)) < 0)
        return fail(err, ST_ERR_FORMAT, t, "model.ignore_merges: not a boolean");
    t->ignore_merges = b;
    if ((b = get_bool(m, "byte_fallback", 0)) < 0)
        return fail(err, ST_ERR_FORMAT, t, "model.byte_fallback: not a boolean");
    t->byte_fallback = b;
    if ((b = get_bool(m, "fuse_unk", 0)) < 0)
        return fail(err, ST_ERR_FORMAT, t, "model.fuse_unk: not a boolean");
    t->fuse_unk = b;
    v = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) return fail(err, ST_ERR_FORMAT, t, "model.unk_token: not a string");
        t->has_unk = 1;
        int64_t id;
        if (st_strmap_get(&t->vocab, json_string_value(v), json_string_length(v), &id))
            t->unk_id = (int32_t)id;
    }
    return ST_OK;
}

/* A JSON value located by the scanner: [start, end) of the text. */
typedef struct span {
    const char *start, *end; /* NULL when the key was absent */
} span;

/* Report a scanner syntax error with its line and column. */
static st_status json_error(st_tokenizer *t, const char *doc, const tj_cur *c, st_error *err) {
    int line, col;
    st_tok_tj_where(doc, c, &line, &col);
    return fail(err, ST_ERR_FORMAT, t, "invalid JSON at line %d, column %d: %s", line, col,
                c->err ? c->err : "syntax error");
}

/* model.vocab, first pass: validate, count, find the largest id, sum the key lengths. */
static st_status scan_vocab(st_tokenizer *t, const char *doc, span v, size_t *count,
                            int64_t *max_id, size_t *key_bytes, st_error *err) {
    tj_cur c = {v.start, v.end, NULL, NULL, NULL, 0};
    *count = 0, *max_id = -1, *key_bytes = 0;
    st_status st = ST_OK;
    char ex[64];
    if (st_tok_tj_peek(&c) != '{') {
        st = fail(err, ST_ERR_FORMAT, t, "model.vocab: not an object");
        goto out;
    }
    c.p++;
    int first = 1, r;
    while ((r = st_tok_tj_next(&c, '{', &first)) == 1) {
        tj_str k;
        if (st_tok_tj_string(&c, &k) || st_tok_tj_expect(&c, ':')) break;
        size_t kl = k.len;
        if (kl == 0) {
            st = fail(err, ST_ERR_FORMAT, t, "model.vocab: empty token string");
            goto out;
        }
        if (kl > ST_TOK_MAX_TOKEN_BYTES) {
            st = fail(err, ST_ERR_LIMIT, t, "model.vocab: a token is longer than %d bytes",
                      ST_TOK_MAX_TOKEN_BYTES);
            goto out;
        }
        /* (k stays valid until the next string is read: fine for the messages below) */
        int64_t id;
        int ch = st_tok_tj_peek(&c);
        if (ch != '-' && (ch < '0' || ch > '9')) {
            st = fail(err, ST_ERR_FORMAT, t, "model.vocab[\"%s\"]: id is not an integer",
                      excerpt(k.s, kl, ex, sizeof ex));
            goto out;
        }
        if (st_tok_tj_int(&c, &id)) {
            st = fail(err, ST_ERR_FORMAT, t, "model.vocab[\"%s\"]: id is not an integer",
                      excerpt(k.s, kl, ex, sizeof ex));
            goto out;
        }
        if (id < 0 || id >= ST_TOK_MAX_ID) {
            st = fail(err, ST_ERR_LIMIT, t, "model.vocab[\"%s\"]: id %lld is outside [0, %lld)",
                      excerpt(k.s, kl, ex, sizeof ex), (long long)id, (long long)ST_TOK_MAX_ID);
            goto out;
        }
        if (id > *max_id) *max_id = id;
        (*count)++;
        *key_bytes += kl;
    }
    if (c.err) st = json_error(t, doc, &c, err);
out:
    free(c.scratch);
    return st;
}

/* model.vocab, second pass: fill the id table and the vocab map. */
static st_status load_vocab(st_tokenizer *t, span v, size_t count, st_error *err) {
    tj_cur c = {v.start, v.end, NULL, NULL, NULL, 0};
    char ex1[64], ex2[64];
    st_status st = ST_OK;
    if (st_strmap_init(&t->vocab, count) != 0) return fail(err, ST_ERR_NOMEM, t, "out of memory");
    st_tok_tj_expect(&c, '{');
    int first = 1;
    while (st_tok_tj_next(&c, '{', &first) == 1) {
        tj_str k;
        int64_t id, old;
        st_tok_tj_string(&c, &k);
        uint32_t s_off;
        const char *s = arena_put(t, k.s, k.len, &s_off);
        size_t kl = k.len;
        st_tok_tj_expect(&c, ':');
        st_tok_tj_int(&c, &id);
        if (st_strmap_get(&t->vocab, s, kl, &old) && old != id)
            t->ent[old].flags = 0; /* a repeated key: the last one wins, as in serde/jansson */
        st_tok_entry *e = &t->ent[id];
        if ((e->flags & ST_TOK_F_PRESENT) &&
            !(e->str_len == kl && !memcmp(st_tok_ent_str(t, e), s, kl))) {
            st = fail(err, ST_ERR_FORMAT, t, "model.vocab: id %lld is given to both \"%s\" and \"%s\"",
                      (long long)id, excerpt(st_tok_ent_str(t, e), e->str_len, ex1, sizeof ex1),
                      excerpt(s, kl, ex2, sizeof ex2));
            break;
        }
        e->str_off = s_off;
        e->str_len = (uint32_t)kl;
        put_token_bytes(t, s, kl, e);
        e->flags = ST_TOK_F_PRESENT;
        if (st_strmap_put(&t->vocab, s, kl, id) < 0) {
            st = fail(err, ST_ERR_NOMEM, t, "out of memory");
            break;
        }
    }
    free(c.scratch);
    if (st != ST_OK) return st;
    t->vocab_count = t->vocab.count;
    for (int b = 0; b < 256; b++) {
        char u[4];
        uint32_t cp = st_tok_byte_to_cp((uint8_t)b);
        size_t n = (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)u);
        int64_t id;
        t->byte_id[b] = st_strmap_get(&t->vocab, u, n, &id) ? (int32_t)id : -1;
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->fallback_id[b] = st_strmap_get(&t->vocab, fb, 6, &id) ? (int32_t)id : -1;
    }
    return ST_OK;
}

/* Look a merge half up; fills a message naming it when absent. */
static int merge_part(st_tokenizer *t, const char *s, size_t n, size_t idx, int32_t *id,
                      st_error *err) {
    int64_t v;
    if (st_strmap_get(&t->vocab, s, n, &v)) {
        *id = (int32_t)v;
        return 1;
    }
    char ex[64];
    fail(err, ST_ERR_FORMAT, t, "model.merges[%zu]: \"%s\" is not in the vocab", idx,
         excerpt(s, n, ex, sizeof ex));
    return 0;
}

/* Append to a growable byte buffer. */
static int cat_put(char **buf, size_t *cap, size_t at, const char *s, size_t n) {
    if (n == 0) return 0; /* (an empty half: *buf may still be NULL) */
    if (at + n > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < at + n) nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return -1;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + at, s, n);
    return 0;
}

/* model.merges: "a b" strings or ["a", "b"] pairs (not mixed), in rank order. */
static st_status load_merges(st_tokenizer *t, const char *doc, span m, st_error *err) {
    tj_cur c = {m.start, m.end, NULL, NULL, NULL, 0};
    st_status st = ST_OK;
    char *cat = NULL;
    size_t cat_cap = 0, n = 0, cap = 0;
    int64_t *vals = NULL;
    if (st_tok_tj_peek(&c) != '[') return fail(err, ST_ERR_FORMAT, t, "model.merges: not an array");
    c.p++;
    int first = 1, first_form = 0, r;
    for (size_t i = 0; (r = st_tok_tj_next(&c, '[', &first)) == 1; i++) {
        int ch = st_tok_tj_peek(&c);
        int form = ch == '"' ? 1 : 2;
        if (i == 0) first_form = form;
        if (form != first_form) {
            /* HF reads the list as all strings or all pairs, never a mix */
            st = fail(err, ST_ERR_FORMAT, t,
                      "model.merges[%zu]: mixes \"a b\" strings and [\"a\", \"b\"] pairs", i);
            break;
        }
        size_t al, bl;
        tj_str x;
        if (form == 1) { /* legacy "a b": exactly one space */
            if (st_tok_tj_string(&c, &x)) break;
            const char *sp = memchr(x.s, ' ', x.len);
            if (!sp || memchr(sp + 1, ' ', x.len - (size_t)(sp + 1 - x.s))) {
                st = fail(err, ST_ERR_FORMAT, t,
                          "model.merges[%zu]: \"a b\" form needs exactly one space", i);
                break;
            }
            al = (size_t)(sp - x.s);
            bl = x.len - al - 1;
            if (cat_put(&cat, &cat_cap, 0, x.s, al) || cat_put(&cat, &cat_cap, al, sp + 1, bl)) {
                st = fail(err, ST_ERR_NOMEM, t, "out of memory");
                break;
            }
        } else {
            int ok = ch == '[';
            if (ok) c.p++;
            ok = ok && st_tok_tj_peek(&c) == '"' && !st_tok_tj_string(&c, &x);
            if (ok) {
                al = x.len;
                if (cat_put(&cat, &cat_cap, 0, x.s, al)) {
                    st = fail(err, ST_ERR_NOMEM, t, "out of memory");
                    break;
                }
            }
            ok = ok && st_tok_tj_peek(&c) == ',' && (c.p++, 1) && st_tok_tj_peek(&c) == '"' &&
                 !st_tok_tj_string(&c, &x) && st_tok_tj_peek(&c) == ']';
            if (!ok) {
                if (!c.err)
                    st = fail(err, ST_ERR_FORMAT, t,
                              "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
                break;
            }
            c.p++;
            bl = x.len;
            if (cat_put(&cat, &cat_cap, al, x.s, bl)) {
                st = fail(err, ST_ERR_NOMEM, t, "out of memory");
                break;
            }
        }
        int32_t ia, ib, im;
        if (!merge_part(t, cat, al, i, &ia, err) || !merge_part(t, cat + al, bl, i, &ib, err) ||
            !merge_part(t, cat, al + bl, i, &im, err)) {
            st = ST_ERR_FORMAT;
            break;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 4096;
            uint64_t *nk = realloc(t->merge_keys, nc * sizeof *nk);
            if (nk) t->merge_keys = nk;
            int64_t *nv = nk ? realloc(vals, nc * sizeof *nv) : NULL;
            if (!nv) {
                st = fail(err, ST_ERR_NOMEM, t, "out of memory");
                break;
            }
            vals = nv;
            cap = nc;
        }
        t->merge_keys[n] = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        vals[n] = (int64_t)(((uint64_t)i << 32) | (uint32_t)im);
        n++;
    }
    if (st == ST_OK && c.err) st = json_error(t, doc, &c, err);
    free(cat);
    free(c.scratch);
    t->n_merges = n;
    /* the keys no longer move: index them (a repeated pair takes the later rank, as HF's
     * HashMap collect does) */
    if (st == ST_OK && st_strmap_init(&t->merges, n) != 0) st = fail(err, ST_ERR_NOMEM, t, "out of memory");
    for (size_t i = 0; st == ST_OK && i < n; i++)
        if (st_strmap_put(&t->merges, (const char *)&t->merge_keys[i], 8, vals[i]) < 0)
            st = fail(err, ST_ERR_NOMEM, t, "out of memory");
    free(vals);
    if (st != ST_OK) return st;
    /* merges of two single bytes, straight from a table (most lookups of short words) */
    t->byte_pair = malloc(65536 * sizeof *t->byte_pair);
    if (!t->byte_pair) return fail(err, ST_ERR_NOMEM, t, "out of memory");
    for (size_t i = 0; i < 65536; i++) t->byte_pair[i] = -1;
    for (int a = 0; a < 256; a++) {
        if (t->byte_id[a] < 0) continue;
        for (int b = 0; b < 256; b++) {
            if (t->byte_id[b] < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)t->byte_id[a] << 32) | (uint32_t)t->byte_id[b];
            int64_t v;
            if (st_strmap_get(&t->merges, (const char *)&key, 8, &v)) t->byte_pair[a << 8 | b] = v;
        }
    }
    return ST_OK;
}

/* Added tokens: HF ids, flags, id-table entries and the two tries. */
static st_status load_added(st_tokenizer *t, const json_t *added, st_error *err) {
    size_t n = json_array_size(added);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added || st_strmap_init(&t->added_map, n) != 0)
        return fail(err, ST_ERR_NOMEM, t, "out of memory");
    int64_t max_added = -1;
    st_strmap index; /* content -> index into t->added, for repeated contents */
    if (st_strmap_init(&index, n) != 0) return fail(err, ST_ERR_NOMEM, t, "out of memory");
    st_status st = ST_OK;
    for (size_t i = 0; i < n && st == ST_OK; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *c = json_object_get(a, "content");
        const char *content = json_string_value(c);
        size_t cl = json_string_length(c);
        int special = get_bool(a, "special", 0);
        int lstrip = get_bool(a, "lstrip", 0), rstrip = get_bool(a, "rstrip", 0);
        int single = get_bool(a, "single_word", 0);
        int norm = get_bool(a, "normalized", special > 0 ? 0 : 1);
        if (special < 0 || lstrip < 0 || rstrip < 0 || single < 0 || norm < 0) {
            st = fail(err, ST_ERR_FORMAT, t, "added_tokens[%zu]: a flag is not a boolean", i);
            break;
        }
        if (cl == 0) continue; /* HF ignores empty contents */
        int64_t id, k_prev;
        if (st_strmap_get(&index, content, cl, &k_prev)) {
            /* the same content again: its flags replace the earlier ones, as in HF */
            st_tok_added *d = &t->added[k_prev];
            d->special |= (uint8_t)special;
            d->lstrip = (uint8_t)lstrip, d->rstrip = (uint8_t)rstrip;
            d->single_word = (uint8_t)single, d->normalized = (uint8_t)norm;
            continue;
        }
        if (!st_strmap_get(&t->vocab, content, cl, &id)) {
            int64_t vs = (int64_t)t->vocab_count;
            if (max_added < 0) id = vs;
            else id = (max_added >= vs || vs == 0) ? max_added + 1 : vs;
        }
        const json_t *fid = json_object_get(a, "id");
        if (fid && json_integer_value(fid) != id) {
            char ex[64];
            ST_WARN("%s: added token \"%s\" has id %lld in the file but gets id %lld (as in "
                    "Hugging Face tokenizers)",
                    t->name, excerpt(content, cl, ex, sizeof ex),
                    (long long)json_integer_value(fid), (long long)id);
        }
        if (id >= ST_TOK_MAX_ID) {
            st = fail(err, ST_ERR_LIMIT, t, "added_tokens[%zu]: id %lld is too large", i,
                      (long long)id);
            break;
        }
        if (id > max_added) max_added = id;
        st_tok_added *d = &t->added[t->n_added++];
        d->id = (int32_t)id;
        d->special = (uint8_t)special, d->lstrip = (uint8_t)lstrip, d->rstrip = (uint8_t)rstrip;
        d->single_word = (uint8_t)single, d->normalized = (uint8_t)norm;
        const char *s = arena_put(t, content, cl, &d->off);
        d->len = (uint32_t)cl;
        if (st_strmap_put(&t->added_map, s, cl, id) < 0 ||
            st_strmap_put(&index, s, cl, (int64_t)(t->n_added - 1)) < 0)
            st = fail(err, ST_ERR_NOMEM, t, "out of memory");
    }
    st_strmap_free(&index);
    if (st != ST_OK) return st;
    /* grow the id table to cover the added ids */
    int64_t n_ids = t->n_ids;
    if (max_added + 1 > n_ids) {
        st_tok_entry *ne = realloc(t->ent, (size_t)(max_added + 1) * sizeof *ne);
        if (!ne) return fail(err, ST_ERR_NOMEM, t, "out of memory");
        memset(ne + n_ids, 0, (size_t)(max_added + 1 - n_ids) * sizeof *ne);
        t->ent = ne;
        t->n_ids = max_added + 1;
    }
    for (size_t k = 0; k < t->n_added; k++) {
        st_tok_added *d = &t->added[k];
        st_tok_entry *e = &t->ent[d->id];
        if (!(e->flags & ST_TOK_F_PRESENT)) {
            e->str_off = d->off;
            e->str_len = d->len;
            put_token_bytes(t, t->arena + d->off, d->len, e);
        }
        e->flags = ST_TOK_F_PRESENT | ST_TOK_F_ADDED | (d->special ? ST_TOK_F_SPECIAL : 0);
    }
    /* tries: raw contents, and normalized contents for normalized=true tokens */
    char *nbuf = NULL;
    size_t ncap = 0;
    int32_t *u32 = NULL;
    size_t u32cap = 0;
    for (size_t k = 0; k < t->n_added && st == ST_OK; k++) {
        st_tok_added *d = &t->added[k];
        const char *s = t->arena + d->off;
        size_t sl = d->len;
        st_tok_trie *tr = &t->raw_trie;
        if (d->normalized) {
            tr = &t->norm_trie;
            if (t->n_norm) {
                st = st_tok_normalize(t, s, sl, &nbuf, &ncap, &u32, &u32cap, &s, &sl, err);
                if (st != ST_OK) break;
            }
            if (sl == 0) continue;
        }
        if (trie_insert(tr, (const uint8_t *)s, sl, (int32_t)k) != 0)
            st = fail(err, ST_ERR_NOMEM, t, "out of memory");
    }
    free(nbuf);
    free(u32);
    return st;
}

/* ==== Whole file ==== */

/* Validate the added tokens' types and sum their lengths (for the arena size). */
static st_status scan_added(st_tokenizer *t, const json_t *added, size_t *bytes, st_error *err) {
    *bytes = 0;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *c = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_string(c))
            return fail(err, ST_ERR_FORMAT, t, "added_tokens[%zu]: needs a string \"content\"", i);
        const json_t *id = json_object_get(a, "id");
        if (id && !json_is_integer(id))
            return fail(err, ST_ERR_FORMAT, t, "added_tokens[%zu]: \"id\" is not an integer", i);
        if (json_string_length(c) > ST_TOK_MAX_TOKEN_BYTES)
            return fail(err, ST_ERR_LIMIT, t, "added_tokens[%zu]: content longer than %d bytes", i,
                        ST_TOK_MAX_TOKEN_BYTES);
        *bytes += json_string_length(c);
    }
    return ST_OK;
}

/* root: the document without model.vocab and model.merges (parsed by jansson); vocab and
 * merges: their spans in the original text, read with the scanner. */
static st_status build(st_tokenizer *t, const char *doc, const json_t *root, span vocab,
                       span merges, st_error *err) {
    if (!json_is_object(root)) return fail(err, ST_ERR_FORMAT, t, "top level is not a JSON object");
    const json_t *model = json_object_get(root, "model");
    if (!model || json_is_null(model))
        return fail(err, ST_ERR_MISSING, t, "no \"model\" section");
    if (!json_is_object(model)) return fail(err, ST_ERR_FORMAT, t, "\"model\" is not an object");
    const json_t *type = json_object_get(model, "type");
    if (type && !json_is_string(type))
        return fail(err, ST_ERR_FORMAT, t, "model.type is not a string");
    if (type && strcmp(json_string_value(type), "BPE"))
        return fail(err, ST_ERR_UNSUPPORTED, t, "model.type \"%s\" is not supported (BPE only)",
                    json_string_value(type));
    if (!type && !merges.start)
        return fail(err, ST_ERR_UNSUPPORTED, t, "model has no \"type\" and no merges (BPE only)");
    if (!vocab.start) return fail(err, ST_ERR_MISSING, t, "model.vocab: missing");
    if (!merges.start) return fail(err, ST_ERR_MISSING, t, "model.merges: missing");
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return fail(err, ST_ERR_FORMAT, t, "\"added_tokens\" is not an array");

    st_status st;
    size_t count, key_bytes, added_bytes;
    int64_t max_id;
    if ((st = scan_vocab(t, doc, vocab, &count, &max_id, &key_bytes, err)) != ST_OK) return st;
    if ((st = scan_added(t, added, &added_bytes, err)) != ST_OK) return st;
    /* each token: its string and its bytes (never longer), NUL-terminated */
    size_t need = 2 * (key_bytes + added_bytes) + 2 * (count + json_array_size(added)) + 16;
    if (need > UINT32_MAX) return fail(err, ST_ERR_LIMIT, t, "vocabulary text exceeds 4 GiB");
    t->arena = malloc(need);
    if (!t->arena) return fail(err, ST_ERR_NOMEM, t, "out of memory (%zu bytes)", need);
    t->arena_cap = need;
    t->n_ids = max_id + 1;
    t->ent = calloc(t->n_ids > 0 ? (size_t)t->n_ids : 1, sizeof *t->ent);
    if (!t->ent) return fail(err, ST_ERR_NOMEM, t, "out of memory");
    if ((st = load_vocab(t, vocab, count, err)) != ST_OK) return st;
    if ((st = load_merges(t, doc, merges, err)) != ST_OK) return st;
    if ((st = parse_model_options(t, model, err)) != ST_OK) return st;
    if ((st = parse_normalizer(t, json_object_get(root, "normalizer"), 0, err)) != ST_OK) return st;

    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!pre || json_is_null(pre))
        return fail(err, ST_ERR_UNSUPPORTED, t,
                    "pre_tokenizer: null; only byte-level BPE (a ByteLevel pre-tokenizer) is "
                    "supported");
    if ((st = parse_pretok(t, pre, 0, err)) != ST_OK) return st;
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].byte_level != (i == t->n_steps - 1))
            return fail(err, ST_ERR_UNSUPPORTED, t,
                        "pre_tokenizer: ByteLevel must be the last step, and only once");
    if ((st = parse_decoder(t, json_object_get(root, "decoder"), err)) != ST_OK) return st;
    if ((st = load_added(t, added, err)) != ST_OK) return st;

    static const char *const ignored[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, ignored[i]);
        if (v && !json_is_null(v))
            ST_WARN("%s: \"%s\" is set but not applied by strand's encode", t->name, ignored[i]);
    }
    if (t->max_capture_pairs == 0) t->max_capture_pairs = 1;

    t->cache = calloc(ST_TOK_CACHE_SLOTS, sizeof *t->cache);
    if (!t->cache) return fail(err, ST_ERR_NOMEM, t, "out of memory");
    if (pthread_mutex_init(&t->cache_lock, NULL) != 0)
        return fail(err, ST_ERR_INTERNAL, t, "cannot create a mutex");
    t->cache_lock_init = 1;
    return ST_OK;
}

static int key_is(const tj_str *k, const char *lit) {
    return k->len == strlen(lit) && memcmp(k->s, lit, k->len) == 0;
}

/* Scan the whole document: check its syntax and find model.vocab and model.merges (the last
 * occurrence of each key, as jansson keeps). */
static st_status locate(st_tokenizer *t, const char *doc, size_t len, span *vocab, span *merges,
                        st_error *err) {
    tj_cur c = {doc, doc + len, NULL, NULL, NULL, 0};
    memset(vocab, 0, sizeof *vocab);
    memset(merges, 0, sizeof *merges);
    int top_is_object = st_tok_tj_peek(&c) == '{';
    if (!top_is_object) {
        st_tok_tj_skip(&c);
    } else {
        c.p++;
        int first = 1;
        while (st_tok_tj_next(&c, '{', &first) == 1) {
            tj_str k;
            if (st_tok_tj_string(&c, &k)) break;
            int is_model = key_is(&k, "model");
            if (st_tok_tj_expect(&c, ':')) break;
            if (!is_model || st_tok_tj_peek(&c) != '{') {
                if (st_tok_tj_skip(&c)) break;
                if (is_model) memset(vocab, 0, sizeof *vocab), memset(merges, 0, sizeof *merges);
                continue;
            }
            /* the model object: remember where vocab and merges are */
            span v = {NULL, NULL}, m = {NULL, NULL};
            c.p++;
            int mfirst = 1;
            while (st_tok_tj_next(&c, '{', &mfirst) == 1) {
                tj_str mk;
                if (st_tok_tj_string(&c, &mk)) break;
                int which = key_is(&mk, "vocab") ? 1 : key_is(&mk, "merges") ? 2 : 0;
                if (st_tok_tj_expect(&c, ':')) break;
                st_tok_tj_peek(&c);
                const char *start = c.p;
                if (st_tok_tj_skip(&c)) break;
                if (which == 1) v.start = start, v.end = c.p;
                if (which == 2) m.start = start, m.end = c.p;
            }
            if (c.err) break;
            *vocab = v;
            *merges = m;
        }
    }
    if (!c.err && st_tok_tj_peek(&c) >= 0) c.err = "garbage after the JSON document", c.err_at = c.p;
    st_status st = ST_OK;
    if (c.err) st = json_error(t, doc, &c, err);
    else if (!top_is_object) st = fail(err, ST_ERR_FORMAT, t, "top level is not a JSON object");
    free(c.scratch);
    return st;
}

st_status st_tok_load_buffer(const char *json, size_t len, const char *name, st_tokenizer **out,
                             st_error *err) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    if (!json && len) return st_error_set(err, ST_ERR_ARG, "%s: no buffer", name);
    if (len > ST_TOK_MAX_FILE_BYTES)
        return st_error_set(err, ST_ERR_LIMIT, "%s: larger than %zu bytes", name,
                            ST_TOK_MAX_FILE_BYTES);
    if (!json) json = "";
    st_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", name);
    t->name = strdup(name);
    if (!t->name) {
        free(t);
        return st_error_set(err, ST_ERR_NOMEM, "%s: out of memory", name);
    }
    for (int i = 0; i < 256; i++) t->byte_id[i] = t->fallback_id[i] = -1;
    trie_init(&t->raw_trie);
    trie_init(&t->norm_trie);

    span vocab, merges;
    st_status st = locate(t, json, len, &vocab, &merges, err);
    char *small = NULL;
    if (st == ST_OK) {
        /* the document with the two big values replaced by empty ones, for jansson */
        small = malloc(len + 8);
        if (!small) st = fail(err, ST_ERR_NOMEM, t, "out of memory");
    }
    if (st == ST_OK) {
        span cut[2] = {vocab, merges};
        if (cut[0].start && cut[1].start && cut[1].start < cut[0].start) {
            span x = cut[0];
            cut[0] = cut[1], cut[1] = x;
        }
        size_t w = 0;
        const char *p = json;
        for (int i = 0; i < 2; i++) {
            if (!cut[i].start) continue;
            memcpy(small + w, p, (size_t)(cut[i].start - p));
            w += (size_t)(cut[i].start - p);
            const char *rep = *cut[i].start == '{' ? "{}" : *cut[i].start == '[' ? "[]" : "0";
            memcpy(small + w, rep, strlen(rep));
            w += strlen(rep);
            p = cut[i].end;
        }
        memcpy(small + w, p, (size_t)(json + len - p));
        w += (size_t)(json + len - p);
        json_error_t je;
        json_t *root = json_loadb(small, w, JSON_ALLOW_NUL, &je);
        if (!root) {
            st = fail(err, ST_ERR_FORMAT, t, "invalid JSON: %s", st_json_error_text(je.text));
        } else {
            st = build(t, json, root, vocab, merges, err);
            json_decref(root);
        }
    }
    free(small);
    if (st != ST_OK) {
        st_tok_free(t);
        return st;
    }
    *out = t;
    return ST_OK;
}

st_status st_tok_load(const char *path, st_tokenizer **out, st_error *err) {
    *out = NULL;
    if (!path) return st_error_set(err, ST_ERR_ARG, "no tokenizer path");
    st_mapped_file f;
    st_status st = st_file_map(path, &f, err);
    if (st != ST_OK) return st;
    if (f.size > ST_TOK_MAX_FILE_BYTES) {
        st_file_unmap(&f);
        return st_error_set(err, ST_ERR_LIMIT, "%s: larger than %zu bytes", path,
                            ST_TOK_MAX_FILE_BYTES);
    }
    st = st_tok_load_buffer((const char *)f.data, f.size, path, out, err);
    st_file_unmap(&f);
    return st;
}

st_status st_tok_load_dir(const char *dir, st_tokenizer **out, st_error *err) {
    *out = NULL;
    if (!dir) return st_error_set(err, ST_ERR_ARG, "no model directory");
    char path[4096];
    st_status st = st_path_join(path, sizeof path, dir, "tokenizer.json", err);
    if (st != ST_OK) return st;
    if (!st_file_exists(path))
        return st_error_set(err, ST_ERR_MISSING, "%s: no tokenizer.json in this directory", dir);
    return st_tok_load(path, out, err);
}

void st_tok_free(st_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_steps; i++) st_tok_regex_free(&t->steps[i].re);
    st_strmap_free(&t->vocab);
    st_strmap_free(&t->added_map);
    st_strmap_free(&t->merges);
    free(t->merge_keys);
    free(t->byte_pair);
    free(t->ent);
    free(t->arena);
    free(t->added);
    trie_free(&t->raw_trie);
    trie_free(&t->norm_trie);
    free(t->cache);
    if (t->cache_lock_init) pthread_mutex_destroy(&t->cache_lock);
    free(t->name);
    free(t);
}
