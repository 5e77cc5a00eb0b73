#!/usr/bin/env bash
# `strand run` end to end on a scripted model (deterministic reasoning and answer):
# the chat template, tokenizer, reasoning display, --no-think, sampling flags, timing line.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
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
$S run -m "$T/m" -p "What is 2+2?" -n 1 >/dev/null 2>"$T/err7"
if grep -q "1 token, finish: length" "$T/err7"; then ok "run -n 1: '1 token', no rate of one token"; else nok "run -n 1: $(cat "$T/err7")"; fi
$S run -m "$T/m" -p "What is 2+2?" --logprobs 2 >"$T/out8" 2>/dev/null
if grep -q "^\[logprobs" "$T/out8" && [ "$(grep -cE '^ +[0-9]+ .* \| ' "$T/out8")" = 12 ]; then ok "run --logprobs 2 prints each token's logprob and 2 alternatives"
else nok "run --logprobs: $(tail -3 "$T/out8")"; fi
$S run -m "$T/m" -p "$(printf 'caf\xe9')" >/dev/null 2>"$T/err9"
if [ $? = 1 ] && grep -q -- "-p is not valid UTF-8" "$T/err9"; then ok "run -p with Latin-1 bytes: 'not valid UTF-8'"; else nok "run non-UTF-8 -p: $(cat "$T/err9")"; fi
$S run -m "$T/m" -p "hi" --system "$(printf '\xff')" >/dev/null 2>"$T/err10"
if [ $? = 1 ] && grep -q -- "--system is not valid UTF-8" "$T/err10"; then ok "run --system non-UTF-8: named"; else nok "run non-UTF-8 --system: $(cat "$T/err10")"; fi
$S synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 --poison-token 9707 -o "$T/nan" >/dev/null
cp tests/data/templates/qwen3.5.jinja "$T/nan/chat_template.jinja"
$S run -m "$T/nan" -p "Hello" --raw >/dev/null 2>"$T/err11"
if [ $? = 1 ] && grep -q "non-finite logits" "$T/err11"; then ok "run on a model that gives NaN logits: exit 1 naming them"; else nok "run NaN: $(cat "$T/err11")"; fi
$S generate -m "$T/nan" --ids 9707,11 -n 3 >/dev/null 2>"$T/err12"
if [ $? = 1 ] && grep -q "non-finite logits" "$T/err12"; then ok "generate likewise"; else nok "generate NaN: $(cat "$T/err12")"; fi
$S run -m "$T/m" -p "hi" --device cpu --precision bf16 >/dev/null 2>"$T/err6"
rc=$?
if [ $rc = 1 ] && grep -q "precision bf16 needs a GPU" "$T/err6"; then ok "--precision bf16 on the CPU: a clear error"; else nok "precision bf16 on cpu: rc $rc $(cat "$T/err6")"; fi
$S run -m "$T/m" -p "What is 2+2?" --temp 0 --device=cpu --precision=exact >"$T/out7" 2>/dev/null
if [ "$(cat "$T/out7")" = "$want" ]; then ok "--device=cpu --precision=exact: the same reply"; else nok "precision exact: $(head -c 200 "$T/out7")"; fi
$S run -m "$T/m" -p "hi" --precision fp8 >/dev/null 2>"$T/err8"
rc=$?
if [ $rc = 2 ] && grep -q "precision fp8: expected exact or bf16" "$T/err8"; then ok "--precision fp8: refused by name"; else nok "precision fp8: rc $rc $(cat "$T/err8")"; fi
$S bench --synth 27b --device cpu >/dev/null 2>"$T/err9"
rc=$?
if [ $rc = 1 ] && grep -q "synthesized in device memory" "$T/err9"; then ok "bench --synth on the CPU: a clear error"; else nok "bench --synth cpu: rc $rc $(cat "$T/err9")"; fi
# images: a synthetic model with a vision tower; img0 (64x48) takes 4 image tokens, img2 5
$S synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 --vision -o "$T/vl" >/dev/null
cp tests/data/templates/qwen3.5.jinja "$T/vl/chat_template.jinja"
IMG=tests/data/fixtures/tiny-vl/images
$S run -m "$T/vl" -p "Describe" -n 3 --no-think >/dev/null 2>"$T/e1"
$S run -m "$T/vl" -p "Describe" -n 3 --no-think --image $IMG/img0.png --image $IMG/img2.png >/dev/null 2>"$T/e2"
p1=$(sed -n 's/^\[\([0-9]*\) prompt tokens.*/\1/p' "$T/e1"); p2=$(sed -n 's/^\[\([0-9]*\) prompt tokens.*/\1/p' "$T/e2")
if [ -n "$p1" ] && [ -n "$p2" ] && [ $((p2 - p1)) = 13 ] && grep -q "finish: length" "$T/e2"; then
    ok "run --image (two PNGs): answered, the prompt longer by their 9 image tokens and 4 marks ($p1 -> $p2)"
else nok "run --image: $(cat "$T/e2") (text only: $(cat "$T/e1"))"; fi
$S run -m "$T/vl" -p "x" --raw --image $IMG/img0.png >/dev/null 2>"$T/e3"
if [ $? = 1 ] && grep -q "needs the chat template" "$T/e3"; then ok "run --raw --image: refused"; else nok "run --raw --image: $(cat "$T/e3")"; fi
$S run -m "$T/m" -p "x" --image $IMG/img0.png >/dev/null 2>"$T/e4"
if [ $? = 1 ] && grep -q "takes no images" "$T/e4"; then ok "run --image on a model without a tower: refused"; else nok "run --image text model: $(cat "$T/e4")"; fi
echo "# $n checks"
