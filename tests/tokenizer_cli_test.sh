#!/usr/bin/env bash
# CLI tests for `strand tokenize` / `strand detokenize` (run from the repository root by
# tests/run.sh; needs build/strand). Prints TAP lines "ok N - ..." / "not ok N - ...".
set -u
BIN=${STRAND_BIN:-build/strand}
DATA=${STRAND_TEST_DATA:-tests/data}
TOK=$DATA/tokenizers/qwen3/tokenizer.json
DIR=$DATA/tokenizers/qwen3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
check() { # check "description" command...
    local what=$1
    shift
    if "$@"; then ok "$what"; else notok "$what"; fi
}

if [ ! -x "$BIN" ]; then
    notok "build/strand exists (run make first)"
    exit 1
fi

# 1. a known text gives the reference ids (tokenizer-A case 0)
printf 'Hello, world!' >"$tmp/hello.txt"
out=$("$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/hello.txt")
check "tokenize prints the reference ids on one line" [ "$out" = "9707 11 1879 0" ]

# 2. -m DIR finds tokenizer.json and gives the same ids
out2=$("$BIN" tokenize -m "$DIR" --text-file "$tmp/hello.txt")
check "tokenize -m DIR gives the same ids" [ "$out2" = "$out" ]

# 3. round trip on a multi-line UTF-8 file (emoji, CJK, tabs, special tokens, final newline)
printf '<|im_start|>user\nDas ist schön! 😀👍🏽 你好，世界。\n\tindent  two  spaces\r\n<|im_end|>\n' >"$tmp/text.txt"
"$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/text.txt" >"$tmp/ids.txt"
"$BIN" detokenize --tokenizer "$TOK" --ids-file "$tmp/ids.txt" >"$tmp/back.txt"
check "tokenize -> detokenize round-trips the file byte for byte" cmp -s "$tmp/text.txt" "$tmp/back.txt"

# 4. the special tokens in the text were matched as single ids
check "special-token text is matched as added tokens" grep -q '^151644 .* 151645 198$' "$tmp/ids.txt"

# 5. --ids list and --skip-special
out=$("$BIN" detokenize --tokenizer "$TOK" --ids 151644,9707,11,1879,0,151645)
check "detokenize --ids prints the text exactly" [ "$out" = "<|im_start|>Hello, world!<|im_end|>" ]
out=$("$BIN" detokenize --tokenizer "$TOK" --ids "151644 9707 11 1879 0 151645" --skip-special)
check "detokenize --skip-special drops special tokens" [ "$out" = "Hello, world!" ]

# 6. no newline is added by detokenize
"$BIN" detokenize --tokenizer "$TOK" --ids 9707 >"$tmp/one.txt"
check "detokenize adds no trailing newline" [ "$(wc -c <"$tmp/one.txt")" -eq 5 ]

# 7. standard input with '-'
out=$(printf 'Hello, world!' | "$BIN" tokenize --tokenizer "$TOK" --text-file -)
check "tokenize reads standard input with --text-file -" [ "$out" = "9707 11 1879 0" ]

# 8. empty text: an empty line
: >"$tmp/empty.txt"
out=$("$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/empty.txt")
check "empty text gives an empty line" [ -z "$out" ]

# 9. a missing text file: exit 1 and a message naming it
"$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/nope.txt" >/dev/null 2>"$tmp/err"
rc=$?
check "missing text file: exit 1, message names the file" \
    bash -c "[ $rc -eq 1 ] && grep -q 'nope.txt' '$tmp/err'"

# 10. a missing tokenizer / model directory
"$BIN" tokenize -m "$tmp" --text x >/dev/null 2>"$tmp/err"
rc=$?
check "model directory without tokenizer.json: exit 1 with a clear message" \
    bash -c "[ $rc -eq 1 ] && grep -q 'no tokenizer.json' '$tmp/err'"

# 11. bad options: exit 2 with usage
"$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/hello.txt" --frobnicate >/dev/null 2>"$tmp/err"
rc=$?
check "unknown option: exit 2 and usage" bash -c "[ $rc -eq 2 ] && grep -q 'usage:' '$tmp/err'"
"$BIN" tokenize --tokenizer "$TOK" >/dev/null 2>&1
check "tokenize without text: exit 2" [ $? -eq 2 ]
"$BIN" detokenize --tokenizer "$TOK" --ids 1,2 --ids-file "$tmp/ids.txt" >/dev/null 2>&1
check "detokenize with both --ids and --ids-file: exit 2" [ $? -eq 2 ]
"$BIN" detokenize --tokenizer "$TOK" --ids "1,x,3" >/dev/null 2>"$tmp/err"
rc=$?
check "detokenize with a bad id list: exit 2 and a message" \
    bash -c "[ $rc -eq 2 ] && grep -q 'bad token id' '$tmp/err'"
"$BIN" tokenize --tokenizer >/dev/null 2>&1
check "option missing its value: exit 2" [ $? -eq 2 ]

# 12. invalid UTF-8 text: exit 1, message says so
printf 'ok \xff\xfe bad' >"$tmp/bad.txt"
"$BIN" tokenize --tokenizer "$TOK" --text-file "$tmp/bad.txt" >/dev/null 2>"$tmp/err"
rc=$?
check "invalid UTF-8 text: exit 1, message names UTF-8 and the offset" \
    bash -c "[ $rc -eq 1 ] && grep -q 'not valid UTF-8 (byte 3)' '$tmp/err'"

# 13. a malformed tokenizer.json: exit 1, message names the file
printf '{"model": {"type": "BPE", "vocab": {"a": 0}' >"$tmp/broken.json"
"$BIN" tokenize --tokenizer "$tmp/broken.json" --text x >/dev/null 2>"$tmp/err"
rc=$?
check "truncated tokenizer.json: exit 1, message names the file" \
    bash -c "[ $rc -eq 1 ] && grep -q 'broken.json: invalid JSON' '$tmp/err'"

# 14. unknown ids are skipped with a warning
out=$("$BIN" detokenize --tokenizer "$TOK" --ids 9707,999999 2>"$tmp/err")
check "detokenize skips an unknown id and warns" \
    bash -c "[ '$out' = 'Hello' ] && grep -q 'id 999999' '$tmp/err'"

# 15. --help exits 0
"$BIN" tokenize --help >/dev/null && "$BIN" detokenize --help >/dev/null
check "--help exits 0" [ $? -eq 0 ]

echo "# $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
