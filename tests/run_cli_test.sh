#!/usr/bin/env bash
# `strand run` end to end on a scripted model (deterministic reasoning and answer):
# the chat template, tokenizer, reasoning display, --no-think, sampling flags, timing line.
set -u
cd "$(dirname "$0")/.."
S=build/strand
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; }
SCRIPT="198,10061,752,1744,911,432,13,151668,785,4226,374,3040;271,151657,4913,606,3252,455,69364,2198,16370,22317,13778,788,18,3417,151658"
$S synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 --script "$SCRIPT" -o "$T/m" >/dev/null
cp tests/data/templates/qwen3.5.jinja "$T/m/chat_template.jinja"
$S run -m "$T/m" -p "What is 2+2?" --temp 0 >"$T/out" 2>"$T/err"
want=$(printf '[thinking]\nLet me think about it.\n[/thinking]\n\nThe answer is four')
if [ "$(cat "$T/out")" = "$want" ]; then ok "run: reasoning set apart, then the answer"; else nok "run output: $(head -c 300 "$T/out")"; fi
if grep -qE '^\[[0-9]+ prompt tokens, first token after [0-9.]+ ms \(prefill [0-9.]+ tok/s\), 12 tokens at [0-9.]+ tok/s, finish: stop\]$' "$T/err"; then
    ok "run: timing line ($(cat "$T/err"))"
else nok "run timing line: $(cat "$T/err")"; fi
$S run -m "$T/m" -p "hi" --no-think --temp 0.7 --top-p 0.9 --seed 3 >"$T/out2" 2>/dev/null
if [ "$(cat "$T/out2")" = '<tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>' ]; then ok "run --no-think: no reasoning block"
else nok "run --no-think: $(head -c 300 "$T/out2")"; fi
$S run -m "$T/m" -p "What is 2+2?" --stop " answer" >"$T/out3" 2>"$T/err3"
if [ "$(tail -1 "$T/out3")" = "The" ] && grep -q "finish: stop" "$T/err3"; then ok "run --stop ends before the stop string"; else nok "run --stop: $(cat "$T/out3")"; fi
$S run -m "$T/m" -p "What is 2+2?" -n 3 >"$T/out4" 2>"$T/err4"
if grep -q "3 tokens" "$T/err4" && grep -q "finish: length" "$T/err4"; then ok "run -n 3 stops with finish length"; else nok "run -n: $(cat "$T/err4")"; fi
$S run -m tests/data/fixtures/tiny-a -p "hi" >/dev/null 2>"$T/err5"
rc=$?
if [ $rc = 1 ] && grep -q "tokenizer" "$T/err5"; then ok "run without a tokenizer: clear error"; else nok "run without tokenizer: rc $rc $(cat "$T/err5")"; fi
$S run -m "$T/m" >/dev/null 2>"$T/err6"
if [ $? = 1 ] && grep -q -- "-p PROMPT are required" "$T/err6"; then ok "run without -p: usage"; else nok "run without -p"; fi
echo "# $n checks"
