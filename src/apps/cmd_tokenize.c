/* ==== CLI: `strand tokenize` and `strand detokenize` ====
 *
 *   strand tokenize   (-m DIR | --tokenizer FILE) (--text-file F | --text STR) [--no-parse-special]
 *       prints the ids, space-separated, on one line. No special tokens are added; the text of
 *       special tokens in the input ("<|im_start|>") is matched as those tokens, like HF's
 *       default encode, unless --no-parse-special.
 *   strand detokenize (-m DIR | --tokenizer FILE) (--ids 1,2,3 | --ids-file F) [--skip-special]
 *       prints the decoded text exactly (no newline added).
 * `-` as a file name reads standard input. Exit status: 0 ok, 1 failure (missing file, bad
 * tokenizer, bad text), 2 bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cli.h"
#include "core/fileio.h"
#include "tokenizer/tokenizer.h"

static const char TOK_USAGE[] =
    "usage: strand tokenize (-m DIR | --tokenizer FILE) (--text-file F | --text STR)\n"
    "                       [--no-parse-special]\n"
    "  Prints the token ids of the text, space-separated, on one line. No special tokens are\n"
    "  added; special-token text in the input is matched unless --no-parse-special.\n"
    "  -m DIR               model directory holding tokenizer.json\n"
    "  --tokenizer FILE     a tokenizer.json file\n"
    "  --text-file F        the text (UTF-8; '-' reads standard input)\n"
    "  --text STR           the text, given inline\n";

static const char DETOK_USAGE[] =
    "usage: strand detokenize (-m DIR | --tokenizer FILE) (--ids 1,2,3 | --ids-file F)\n"
    "                         [--skip-special]\n"
    "  Prints the text of the ids exactly (no newline added).\n"
    "  -m DIR               model directory holding tokenizer.json\n"
    "  --tokenizer FILE     a tokenizer.json file\n"
    "  --ids LIST           ids separated by commas and/or spaces\n"
    "  --ids-file F         a file of ids ('-' reads standard input)\n"
    "  --skip-special       leave out special tokens\n";

/* Report a usage problem ("what" and an optional argument) and return exit status 2. */
static int usage_error(const char *usage, const char *what, const char *arg) {
    if (arg) fprintf(stderr, "strand: %s '%s'\n", what, arg);
    else fprintf(stderr, "strand: %s\n", what);
    fputs(usage, stderr);
    return 2;
}

/* Read a whole file, or standard input for "-". */
static st_status read_input(const char *path, size_t max, char **out, size_t *len,
                            st_error *err) {
    if (strcmp(path, "-") != 0) return st_file_read(path, max, out, len, err);
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return st_error_set(err, ST_ERR_NOMEM, "out of memory");
    for (;;) {
        if (n == cap) {
            if (cap >= max) {
                free(buf);
                return st_error_set(err, ST_ERR_LIMIT, "standard input is larger than %zu bytes",
                                    max);
            }
            cap = cap * 2 > max ? max : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return st_error_set(err, ST_ERR_NOMEM, "out of memory");
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return st_error_set(err, ST_ERR_IO, "error reading standard input");
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return ST_OK;
}

static st_status load_tokenizer(const char *dir, const char *file, st_tokenizer **tok,
                                st_error *err) {
    return file ? st_tok_load(file, tok, err) : st_tok_load_dir(dir, tok, err);
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *text_file = NULL, *text = NULL;
    int parse_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(TOK_USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--text-file")) {
            if (!(text_file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--text")) {
            if (!(text = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = 0;
        } else {
            return usage_error(TOK_USAGE, "tokenize: unknown option", a);
        }
    }
    if (!dir == !file)
        return usage_error(TOK_USAGE, "tokenize: give exactly one of -m DIR or --tokenizer FILE",
                           NULL);
    if (!text_file == !text)
        return usage_error(TOK_USAGE, "tokenize: give exactly one of --text-file F or --text STR",
                           NULL);

    st_error err;
    st_error_clear(&err);
    char *buf = NULL;
    size_t len = 0;
    if (text_file) {
        if (read_input(text_file, ST_TOK_MAX_TEXT_BYTES, &buf, &len, &err) != ST_OK)
            return cli_fail(&err);
    } else {
        len = strlen(text);
    }
    st_tokenizer *tok = NULL;
    if (load_tokenizer(dir, file, &tok, &err) != ST_OK) {
        free(buf);
        return cli_fail(&err);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    st_status st = st_tok_encode(tok, buf ? buf : text, len, parse_special, &ids, &n, &err);
    if (st != ST_OK) {
        if (text_file) st_error_prefix(&err, "%s: ", text_file);
        free(buf);
        st_tok_free(tok);
        return cli_fail(&err);
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    free(buf);
    st_tok_free(tok);
    return fflush(stdout) == 0 ? 0 : cli_failf("tokenize: cannot write the output");
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *ids_arg = NULL, *ids_file = NULL;
    int skip_special = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(DETOK_USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids")) {
            if (!(ids_arg = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ids-file")) {
            if (!(ids_file = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--skip-special")) {
            skip_special = 1;
        } else {
            return usage_error(DETOK_USAGE, "detokenize: unknown option", a);
        }
    }
    if (!dir == !file)
        return usage_error(DETOK_USAGE,
                           "detokenize: give exactly one of -m DIR or --tokenizer FILE", NULL);
    if (!ids_arg == !ids_file)
        return usage_error(DETOK_USAGE,
                           "detokenize: give exactly one of --ids LIST or --ids-file F", NULL);

    st_error err;
    st_error_clear(&err);
    char *buf = NULL;
    size_t blen = 0;
    if (ids_file && read_input(ids_file, (size_t)1 << 30, &buf, &blen, &err) != ST_OK)
        return cli_fail(&err);
    int32_t *ids = NULL;
    int n = 0;
    if (cli_parse_ids(buf ? buf : ids_arg, &ids, &n, &err) != ST_OK) {
        if (ids_file) st_error_prefix(&err, "%s: ", ids_file);
        free(buf);
        return ids_file ? cli_fail(&err) : (cli_fail(&err), 2);
    }
    free(buf);
    st_tokenizer *tok = NULL;
    if (load_tokenizer(dir, file, &tok, &err) != ST_OK) {
        free(ids);
        return cli_fail(&err);
    }
    int64_t vs = st_tok_vocab_size(tok);
    for (int i = 0; i < n; i++)
        if (ids[i] >= vs || !st_tok_id_to_token(tok, ids[i], NULL))
            fprintf(stderr,
                    "strand: detokenize: warning: id %d is not in the vocabulary (skipped)\n",
                    ids[i]);
    char *text = NULL;
    size_t len = 0;
    st_status st = st_tok_decode(tok, ids, (size_t)n, skip_special, &text, &len, &err);
    free(ids);
    st_tok_free(tok);
    if (st != ST_OK) return cli_fail(&err);
    size_t w = len ? fwrite(text, 1, len, stdout) : 0;
    free(text);
    if (w != len || fflush(stdout) != 0) return cli_failf("detokenize: cannot write the output");
    return 0;
}
