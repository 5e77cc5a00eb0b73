#!/usr/bin/env bash
# The demo and the quality tools from the command line, on tiny-fortune (models/): make
# demo's script speaks (the reference's greedy reply), `strand perplexity` prints the
# reference's value (text and --json), `strand quantize` writes checkpoints that `run` and
# `perplexity` use, KL divergence against a saved run, and clear errors for bad input.
# STRAND_TEST_SCALE=N (the sanitizer's run): the perplexity runs on the first 1/N of the
# held-out text, their values not compared with the reference's (the plain run does that),
# and the demo without its perplexity; the same code paths, N times fewer tokens.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
F=models/tiny-fortune
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
SCALE=${STRAND_TEST_SCALE:-1}
TEXT=$F/heldout.txt
if [ "$SCALE" -gt 1 ]; then
    head -c $(($(wc -c <$F/heldout.txt) / SCALE)) $F/heldout.txt >"$T/heldout.txt"
    TEXT=$T/heldout.txt
fi
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; }
fails_with() {
    local what=$1 pattern=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q -- "$pattern" "$T/err"; then ok "$what ($(head -c 120 "$T/err" | tr '\n' ' '))"
    else nok "$what (exit $rc: $(head -c 300 "$T/err" | tr '\n' ' '))"; fi
}

if [ "$SCALE" -gt 1 ]; then
    mkdir -p "$T/fortune" && cp $F/* "$T/fortune/" && rm "$T/fortune/heldout.txt" # the demo measures no perplexity then
    STRAND=$S MODEL="$T/fortune" bash scripts/demo.sh >"$T/demo" 2>"$T/demo.err"
    ppl_ok=1
else
    STRAND=$S bash scripts/demo.sh >"$T/demo" 2>"$T/demo.err"
    grep -q '^perplexity 151.82' "$T/demo"
    ppl_ok=$((1 - $?))
fi
if grep -q 'My brain is paged out to my liver.' "$T/demo" && grep -q '^\[thinking\]' "$T/demo" && [ $ppl_ok = 1 ]; then
    ok "scripts/demo.sh: a reply with its thought apart, the reference's greedy reply without thinking, the perplexity"
else nok "demo: $(head -c 400 "$T/demo")"; fi
if grep -qE '^\[[0-9]+ prompt tokens, .* tokens at [0-9.]+ tok/s, finish: stop\]$' "$T/demo.err"; then ok "demo: the timing line"
else nok "demo timing: $(cat "$T/demo.err")"; fi

# (one run gives the JSON and the log-probabilities the KL check below reads)
$S perplexity -m $F --text-file $TEXT --json --batch 3 --save-logprobs "$T/base.lp" >"$T/ppl.json" 2>/dev/null
if [ "$SCALE" -gt 1 ]; then
    if node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));process.exit(j.perplexity>1&&j.scored>0&&j.windows>0&&j.stderr>0?0:1)' "$T/ppl.json"; then
        ok "perplexity --json of 1/$SCALE of the text: a value, its tokens and windows ($(head -c 120 "$T/ppl.json"))"
    else nok "perplexity --json: $(cat "$T/ppl.json")"; fi
elif node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));process.exit(Math.abs(j.perplexity-151.82440585905297)/151.8244<1e-4&&j.scored===26572&&j.windows===52&&j.stderr>0?0:1)' "$T/ppl.json"; then
    ok "perplexity --json: 151.8244 within 1e-4, 26,572 tokens in 52 windows, a standard error ($(head -c 120 "$T/ppl.json"))"
else nok "perplexity --json: $(cat "$T/ppl.json")"; fi

$S quantize -m $F --bits 4 -o "$T/q4" >/dev/null 2>"$T/q.err"
if grep -q "matrices at 4 bits (group 64)" "$T/q.err" && [ -f "$T/q4/model.safetensors.index.json" ] && [ -f "$T/q4/tokenizer.json" ]; then
    ok "quantize --bits 4: a summary line, the index, the tokenizer files ($(tail -1 "$T/q.err"))"
else nok "quantize: $(cat "$T/q.err")"; fi
out=$($S run -m "$T/q4" -p "Tell me something about computers." --no-think 2>/dev/null)
if [ -n "$out" ]; then ok "run on the 4-bit checkpoint speaks ($(echo "$out" | head -1))"; else nok "run on q4: nothing"; fi
$S perplexity -m "$T/q4" --text-file $TEXT --kl-divergence "$T/base.lp" >"$T/kl" 2>/dev/null
if grep -qE '^KL divergence from .*: 0\.[0-9]+ \+/- .*same top token [0-9.]+%$' "$T/kl" &&
   { [ "$SCALE" -gt 1 ] || grep -qE '^perplexity 15[0-9]\.' "$T/kl"; }; then
    ok "the 4-bit model's perplexity and its KL divergence from the bf16 run ($(tail -1 "$T/kl"))"
else nok "kl: $(cat "$T/kl")"; fi

fails_with "perplexity without --text-file" "required" $S perplexity -m $F
fails_with "perplexity of a missing file" "cannot open" $S perplexity -m $F --text-file "$T/none.txt"
printf 'just a few words' >"$T/short.txt"
fails_with "perplexity of a text shorter than a window" "fewer than one window" $S perplexity -m $F --text-file "$T/short.txt"
fails_with "--kl-divergence with a file that is not one" "not a file of --save-logprobs" $S perplexity -m $F --text-file $TEXT --kl-divergence $F/config.json
fails_with "--kl-divergence saved with another window" "saved for" $S perplexity -m $F --text-file $TEXT --window 256 --kl-divergence "$T/base.lp"
fails_with "quantize --bits 7" "not an MLX affine width" $S quantize -m $F --bits 7 -o "$T/q7"
fails_with "quantize --group 48" "32, 64 or 128" $S quantize -m $F --bits 4 --group 48 -o "$T/q48"
fails_with "quantize an MLX checkpoint" "quantized already" $S quantize -m "$T/q4" --bits 4 -o "$T/qq"
fails_with "quantize without --bits" "required" $S quantize -m $F -o "$T/qx"
fails_with "quantize -o -" "cannot hold a checkpoint" $S quantize -m $F --bits 4 -o -
echo "# $n checks"
