#!/usr/bin/env bash
# `strand template` end to end: render request files with the Qwen3.5 template file, the Qwen3
# model directory (tokenizer_config.json) and that config given as --template FILE.json, and
# compare the output byte for byte with the reference renders (tests/data/template-cases/cli,
# written by gen.py from the fixtures). Bad requests and template errors must fail with a
# clear message and exit status 1. Prints TAP lines; run from the repository root.
set -u
BIN=${STRAND_BIN:-build/strand}
DATA=${STRAND_TEST_DATA:-tests/data}
CLI=$DATA/template-cases/cli
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
n=0
fails=0

ok() {
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $n - $2"
    else
        echo "not ok $n - $2"
        fails=$((fails + 1))
    fi
}

# render_cmp NAME EXPECTED ARGS...: stdout must equal EXPECTED exactly, exit status 0
render_cmp() {
    local name=$1 expected=$2
    shift 2
    "$BIN" template "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 0 ] && cmp -s "$TMP/out" "$expected"; then
        ok 0 "$name"
    else
        ok 1 "$name"
        echo "# exit $rc; stderr: $(head -c 300 "$TMP/err")"
        cmp "$TMP/out" "$expected" | sed 's/^/# /'
    fi
}

# render_fail NAME PATTERN ARGS...: exit status 1, nothing on stdout, PATTERN in stderr
render_fail() {
    local name=$1 pattern=$2
    shift 2
    "$BIN" template "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 1 ] && [ ! -s "$TMP/out" ] && grep -q -- "$pattern" "$TMP/err"; then
        ok 0 "$name"
    else
        ok 1 "$name"
        echo "# exit $rc; stderr: $(head -c 300 "$TMP/err")"
    fi
}

if [ ! -x "$BIN" ]; then
    echo "not ok 1 - $BIN is not built"
    exit 1
fi

Q35=$DATA/templates/qwen3.5.jinja
for c in tool_call plain nothink no_gen_prompt; do
    render_cmp "qwen3.5 template: $c renders byte-identical" "$CLI/qwen35-$c.expected" \
        --template "$Q35" --request-file "$CLI/qwen35-$c.request.json"
done
for c in tools system; do
    render_cmp "qwen3 model dir: $c renders byte-identical" "$CLI/qwen3-$c.expected" \
        -m "$DATA/tokenizers/qwen3" --request-file "$CLI/qwen3-$c.request.json"
done
render_cmp "qwen3 tokenizer_config.json as --template FILE" "$CLI/qwen3-tools.expected" \
    --template "$DATA/tokenizers/qwen3/tokenizer_config.json" --request-file "$CLI/qwen3-tools.request.json"

render_fail "invalid JSON request file: clear error" "invalid JSON" \
    --template "$Q35" --request-file "$CLI/bad-json.request.json"
render_fail "request without messages: clear error" '"messages"' \
    --template "$Q35" --request-file "$CLI/no-messages.request.json"
render_fail "missing request file: clear error" "cannot open" \
    --template "$Q35" --request-file "$TMP/does-not-exist.json"
render_fail "raise_exception: message and template line on stderr" "line 43: No messages provided." \
    --template "$Q35" --request-file "$CLI/empty-messages.request.json"
render_fail "missing template file: clear error" "cannot open" \
    --template "$TMP/none.jinja" --request-file "$CLI/qwen35-plain.request.json"
printf '{%% if x %%}' >"$TMP/bad.jinja"
render_fail "template syntax error: names the line" "line 1:" \
    --template "$TMP/bad.jinja" --request-file "$CLI/qwen35-plain.request.json"

"$BIN" template >/dev/null 2>"$TMP/err"
rc=$?
[ $rc -eq 2 ] && grep -q "usage" "$TMP/err"
ok $? "no arguments: usage, exit status 2"

echo "# $((n - fails)) passed, $fails failed"
[ $fails -eq 0 ]
