/* ==== Tokenizer benchmark: load time and encode/decode throughput (one core) ====
 *
 * usage: build/bench/bench_tokenizer [tokenizer.json] [--kb N]
 * Default tokenizer: tests/data/tokenizers/qwen3/tokenizer.json (run from the repo root).
 *
 * The texts are generated here (no network, no embedded copyrighted text), deterministic:
 *   prose  English sentences from a ~400-word vocabulary with Zipf-like frequencies,
 *          capitalisation, punctuation, quotes, numbers and paragraphs;
 *   code   C and Python functions built from templates with varied identifiers, indentation,
 *          comments, strings and operators;
 *   multi  a mix of Chinese, Russian, Japanese, emoji and accented Latin text.
 * Each row encodes its text once to warm up, then repeatedly for at least 1 s, and reports
 * MB/s of input text (1 MB = 10^6 bytes). "no cache" bypasses the bounded word cache (the
 * worst case: every pre-token goes through the BPE merge loop); "4KB chunks" encodes the text
 * as separate ~4 KB requests (per-call overhead); decode MB/s counts the text produced.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tok_internal.h" /* only to hold the word-cache lock for the no-cache row */
#include "tokenizer/tokenizer.h"

/* ==== Deterministic text generation ==== */

typedef struct gen {
    char *buf; /* [cap], owned */
    size_t len, cap;
    uint64_t rng;
} gen;

static uint32_t rnd(gen *g) {
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (uint32_t)(g->rng >> 11);
}

static void put(gen *g, const char *s) {
    size_t n = strlen(s);
    if (g->len + n + 1 > g->cap) {
        while (g->len + n + 1 > g->cap) g->cap = g->cap ? g->cap * 2 : 1 << 16;
        g->buf = realloc(g->buf, g->cap);
        if (!g->buf) abort();
    }
    memcpy(g->buf + g->len, s, n);
    g->len += n;
    g->buf[g->len] = '\0';
}

static const char *const WORDS[] = {
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
    "its", "may", "these", "what", "them", "than", "some", "him", "time", "into", "only", "do",
    "could", "new", "about", "two", "first", "then", "also", "any", "like", "my", "our",
    "people", "made", "over", "such", "after", "most", "years", "world", "many", "before",
    "between", "through", "where", "should", "those", "under", "because", "while", "during",
    "system", "however", "government", "important", "development", "different", "following",
    "without", "number", "public", "several", "general", "information", "national", "another",
    "example", "research", "problem", "history", "country", "company", "water", "family",
    "question", "children", "business", "service", "market", "interest", "experience",
    "education", "community", "although", "economic", "political", "social", "possible",
    "evidence", "analysis", "according", "increase", "available", "particular", "understand",
    "language", "computer", "network", "memory", "process", "results", "significant", "model",
    "learning", "training", "performance", "structure", "function", "pressure", "material",
    "surface", "energy", "temperature", "environment", "individual", "relationship", "species",
    "century", "university", "committee", "literature", "philosophy", "mathematics", "theory",
    "approach", "method", "practice", "quality", "knowledge", "society", "culture", "economy",
    "region", "village", "river", "mountain", "garden", "morning", "evening", "winter",
    "summer", "journey", "letter", "window", "kitchen", "doctor", "teacher", "student",
    "friend", "mother", "father", "brother", "sister", "woman", "man", "child", "house",
    "street", "city", "road", "light", "night", "day", "week", "month", "year", "hour",
    "moment", "story", "book", "paper", "idea", "reason", "answer", "result", "change", "power",
    "money", "work", "life", "hand", "head", "eye", "face", "voice", "word", "name", "place",
    "thing", "way", "end", "part", "side", "kind", "case", "point", "fact", "group", "state",
    "said", "went", "came", "took", "found", "gave", "told", "knew", "thought", "looked",
    "seemed", "asked", "turned", "began", "kept", "held", "brought", "wrote", "stood", "heard",
    "quickly", "slowly", "really", "almost", "always", "never", "often", "perhaps", "already",
    "together", "certainly", "probably", "simply", "nearly", "early", "late", "small", "large",
    "great", "little", "long", "short", "high", "low", "old", "young", "good", "bad", "best",
    "better", "right", "left", "whole", "certain", "clear", "strong", "free", "full", "close",
    "open", "ancient", "modern", "careful", "beautiful", "difficult", "dangerous", "quiet",
    "Europe", "London", "Paris", "America", "Thomas", "Elizabeth", "Charles", "Victoria",
    "Mr.", "Mrs.", "Dr.", "don't", "it's", "can't", "wasn't", "I'm", "you're", "we've",
    "they'll", "she'd", "couldn't", "wouldn't", "isn't", "I", "O'Brien", "twenty-one",
    "well-known", "self-evident", "co-operation", "re-examined", "nineteenth", "mid-century",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static const char *const SYLL[] = {
    "re", "con", "pro", "in", "ex", "de", "com", "dis", "un", "pre", "per", "ad", "sub", "ter",
    "tion", "ment", "ness", "able", "ing", "ed", "er", "ly", "al", "ous", "ive", "ful", "ic",
    "ate", "ist", "ize", "ance", "ence", "ship", "ward", "bor", "cal", "dor", "fen", "gal",
    "har", "lin", "mor", "nat", "pel", "quin", "ros", "sel", "tav", "ver", "wil", "zan", "bro",
};
#define N_SYLL (sizeof SYLL / sizeof SYLL[0])

/* A word: Zipf-like over the common words, and one time in eight a rarer word made of 2-4
 * syllables (tens of thousands of distinct forms, like the long tail of real text). */
static const char *zipf_word(gen *g) {
    static char rare[64];
    if (rnd(g) % 8 == 0) {
        int n = 2 + (int)(rnd(g) % 3);
        rare[0] = '\0';
        for (int i = 0; i < n; i++) strcat(rare, SYLL[rnd(g) % N_SYLL]);
        return rare;
    }
    uint32_t a = rnd(g) % N_WORDS, b = rnd(g) % N_WORDS;
    uint32_t k = a < b ? a : b;
    if (rnd(g) % 3 == 0) k = rnd(g) % (uint32_t)N_WORDS;
    return WORDS[k];
}

static void gen_prose(gen *g, size_t bytes) {
    char w[64];
    while (g->len < bytes) {
        int sentences = 3 + (int)(rnd(g) % 6);
        for (int s = 0; s < sentences; s++) {
            int words = 6 + (int)(rnd(g) % 22);
            int quote = rnd(g) % 9 == 0;
            if (quote) put(g, "\"");
            for (int i = 0; i < words; i++) {
                const char *x = zipf_word(g);
                if (i == 0) {
                    snprintf(w, sizeof w, "%s", x);
                    if (w[0] >= 'a' && w[0] <= 'z') w[0] = (char)(w[0] - 32);
                    put(g, w);
                } else {
                    put(g, " ");
                    uint32_t r = rnd(g) % 40;
                    if (r == 0) snprintf(w, sizeof w, "%u", 1 + rnd(g) % 2000), put(g, w);
                    else if (r == 1) snprintf(w, sizeof w, "(%s)", x), put(g, w);
                    else put(g, x);
                    if (i + 1 < words && rnd(g) % 9 == 0) put(g, rnd(g) % 5 ? "," : ";");
                }
            }
            uint32_t e = rnd(g) % 12;
            put(g, e < 9 ? "." : e < 11 ? "?" : "!");
            if (quote) put(g, "\"");
            put(g, s + 1 < sentences ? " " : "");
        }
        put(g, "\n\n");
    }
}

static const char *const IDENT[] = {
    "count", "index", "buffer", "length", "result", "value", "node", "next", "prev", "head",
    "tail", "size", "capacity", "offset", "stride", "data", "items", "key", "name", "path",
    "config", "state", "ctx", "tokens", "weights", "scale", "bias", "input", "output", "err",
    "tmp", "total", "max_len", "min_value", "is_valid", "num_heads", "hidden_dim", "batch",
};
#define N_IDENT (sizeof IDENT / sizeof IDENT[0])

static const char *ident(gen *g) { return IDENT[rnd(g) % N_IDENT]; }

static void gen_code(gen *g, size_t bytes) {
    char l[512];
    while (g->len < bytes) {
        if (rnd(g) % 2) { /* C */
            snprintf(l, sizeof l,
                     "/* Compute the %s of %s over %s. */\nstatic int %s_%s(const float *%s, "
                     "size_t %s, int32_t *%s) {\n",
                     ident(g), ident(g), ident(g), ident(g), ident(g), ident(g), ident(g), ident(g));
            put(g, l);
            int lines = 3 + (int)(rnd(g) % 10);
            for (int i = 0; i < lines; i++) {
                switch (rnd(g) % 6) {
                case 0:
                    snprintf(l, sizeof l, "    for (size_t i = 0; i < %s; i++) {\n        %s[i] += %s[i] * %.3ff;\n    }\n",
                             ident(g), ident(g), ident(g), (double)(rnd(g) % 1000) / 100.0);
                    break;
                case 1:
                    snprintf(l, sizeof l, "    if (%s == NULL || %s < %u) return -%u;\n", ident(g),
                             ident(g), rnd(g) % 64, 1 + rnd(g) % 9);
                    break;
                case 2:
                    snprintf(l, sizeof l, "    %s->%s = (%s + %s) >> %u;\n", ident(g), ident(g),
                             ident(g), ident(g), rnd(g) % 8);
                    break;
                case 3:
                    snprintf(l, sizeof l, "    fprintf(stderr, \"%s: bad %s %%d\\n\", %s);\n", ident(g),
                             ident(g), ident(g));
                    break;
                case 4:
                    snprintf(l, sizeof l, "    size_t %s = sizeof(%s) / sizeof(%s[0]); // %s\n",
                             ident(g), ident(g), ident(g), zipf_word(g));
                    break;
                default:
                    snprintf(l, sizeof l, "    memcpy(%s + %s, %s, %s * sizeof(*%s));\n", ident(g),
                             ident(g), ident(g), ident(g), ident(g));
                }
                put(g, l);
            }
            put(g, "    return 0;\n}\n\n");
        } else { /* Python */
            snprintf(l, sizeof l, "def %s_%s(self, %s, %s=None, *, %s: int = %u) -> list:\n    \"\"\"Return the %s of %s.\"\"\"\n",
                     ident(g), ident(g), ident(g), ident(g), ident(g), rnd(g) % 100, ident(g), ident(g));
            put(g, l);
            int lines = 3 + (int)(rnd(g) % 10);
            for (int i = 0; i < lines; i++) {
                switch (rnd(g) % 5) {
                case 0:
                    snprintf(l, sizeof l, "    for %s, %s in enumerate(self.%s):\n        %s.append(%s ** 2)\n",
                             ident(g), ident(g), ident(g), ident(g), ident(g));
                    break;
                case 1:
                    snprintf(l, sizeof l, "    if not %s or len(%s) > %u:\n        raise ValueError(f\"bad {%s!r}\")\n",
                             ident(g), ident(g), rnd(g) % 512, ident(g));
                    break;
                case 2:
                    snprintf(l, sizeof l, "    %s = {k: v for k, v in %s.items() if v != %u}  # %s\n",
                             ident(g), ident(g), rnd(g) % 10, zipf_word(g));
                    break;
                case 3:
                    snprintf(l, sizeof l, "    self.%s[%s:%s] = np.zeros((%u, %u), dtype=np.float32)\n",
                             ident(g), ident(g), ident(g), 1 + rnd(g) % 64, 1 + rnd(g) % 64);
                    break;
                default:
                    snprintf(l, sizeof l, "    return [%s for %s in %s if %s is not None]\n",
                             ident(g), ident(g), ident(g), ident(g));
                }
                put(g, l);
            }
            put(g, "\n\n");
        }
    }
}

static void gen_multi(gen *g, size_t bytes) {
    static const char *const parts[] = {
        "你好，世界！今天天气很好。", "机器学习模型需要大量的数据。", "Привет, как дела? ",
        "Это очень интересная книга. ", "こんにちは、元気ですか。", "東京は大きな都市です。",
        "안녕하세요, 반갑습니다. ", "Ça va très bien, merci ! ", "Größe über alles. ",
        "😀👍🏽🚀 ", "مرحبا بالعالم ", "नमस्ते दुनिया ", "\n",
    };
    while (g->len < bytes) put(g, parts[rnd(g) % (sizeof parts / sizeof parts[0])]);
}

/* ==== Timing ==== */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Encode text repeatedly for >= min_s seconds; returns MB/s and the token count. */
static double bench_encode(const st_tokenizer *tok, const char *text, size_t len, double min_s,
                           size_t *n_tokens) {
    st_tok_ids ids = {NULL, 0, 0};
    st_error err;
    if (st_tok_encode_append(tok, text, len, 1, &ids, &err) != ST_OK) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        exit(1);
    }
    *n_tokens = ids.n;
    double t0 = now_s(), t;
    size_t reps = 0;
    do {
        ids.n = 0;
        st_tok_encode_append(tok, text, len, 1, &ids, &err);
        reps++;
        t = now_s() - t0;
    } while (t < min_s);
    st_tok_ids_free(&ids);
    return (double)len * (double)reps / t / 1e6;
}

/* Encode the text as separate chunks of about `chunk` bytes (many small requests). */
static double bench_encode_chunks(const st_tokenizer *tok, const char *text, size_t len,
                                  size_t chunk) {
    st_tok_ids ids = {NULL, 0, 0};
    st_error err;
    double t0 = now_s();
    size_t off = 0;
    while (off < len) {
        size_t n = len - off < chunk ? len - off : chunk;
        while (off + n < len && ((unsigned char)text[off + n] & 0xC0) == 0x80) n++;
        ids.n = 0;
        st_tok_encode_append(tok, text + off, n, 1, &ids, &err);
        off += n;
    }
    double t = now_s() - t0;
    st_tok_ids_free(&ids);
    return (double)len / t / 1e6;
}

static double bench_decode(const st_tokenizer *tok, const char *text, size_t len, double min_s) {
    int32_t *ids = NULL;
    size_t n = 0;
    st_error err;
    st_tok_encode(tok, text, len, 1, &ids, &n, &err);
    double t0 = now_s(), t;
    size_t reps = 0;
    do {
        char *out = NULL;
        size_t ol = 0;
        st_tok_decode(tok, ids, n, 0, &out, &ol, &err);
        free(out);
        reps++;
        t = now_s() - t0;
    } while (t < min_s);
    free(ids);
    return (double)len * (double)reps / t / 1e6;
}

int main(int argc, char **argv) {
    const char *path = "tests/data/tokenizers/qwen3/tokenizer.json";
    size_t kb = 400;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kb") && i + 1 < argc) kb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: %s [tokenizer.json] [--kb N]\n", argv[0]);
            return 0;
        } else path = argv[i];
    }
    st_error err;
    st_tokenizer *tok = NULL;
    double t0 = now_s();
    if (st_tok_load(path, &tok, &err) != ST_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double load_ms = (now_s() - t0) * 1000;

    gen texts[3] = {{NULL, 0, 0, 0x9E3779B97F4A7C15ull},
                    {NULL, 0, 0, 0xD1B54A32D192ED03ull},
                    {NULL, 0, 0, 0x8CB92BA72F3D8DD7ull}};
    gen_prose(&texts[0], kb * 1000);
    gen_code(&texts[1], kb * 1000);
    gen_multi(&texts[2], kb * 1000 / 4);
    static const char *const names[] = {"English prose", "C/Python code", "multilingual"};

    printf("tokenizer: %s (%lld ids), load %.0f ms\n\n", path, (long long)st_tok_vocab_size(tok),
           load_ms);
    printf("%-15s %7s %8s %8s %12s %12s %12s %12s\n", "text", "KB", "tokens", "B/token",
           "encode MB/s", "no cache", "4KB chunks", "decode MB/s");
    for (int i = 0; i < 3; i++) {
        size_t nt = 0;
        double mbs = bench_encode(tok, texts[i].buf, texts[i].len, 1.0, &nt);
        /* holding the cache lock makes every encode take the uncached path */
        pthread_mutex_lock(&tok->cache_lock);
        double cold = bench_encode(tok, texts[i].buf, texts[i].len, 1.0, &nt);
        pthread_mutex_unlock(&tok->cache_lock);
        double chunk = bench_encode_chunks(tok, texts[i].buf, texts[i].len, 4096);
        double dmbs = bench_decode(tok, texts[i].buf, texts[i].len, 0.5);
        printf("%-15s %7.1f %8zu %8.2f %12.1f %12.1f %12.1f %12.1f\n", names[i],
               texts[i].len / 1000.0, nt, (double)texts[i].len / (double)nt, mbs, cold, chunk, dmbs);
        free(texts[i].buf);
    }
    printf("\n(one core; MB = 10^6 bytes of input text; \"no cache\" bypasses the word cache)\n");
    st_tok_free(tok);
    return 0;
}
