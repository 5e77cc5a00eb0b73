#!/usr/bin/env bash
# CLI checks for the model commands: generate (single and --batch-file) against the
# reference's greedy ids, logits file layout, synth + inspect, and clear errors (non-zero
# exit, a message naming the problem, never a crash) for bad input.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
D=tests/data
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; }
check() { local what=$1; shift; if "$@" >/dev/null; then ok "$what"; else nok "$what"; fi; }
# fails cleanly: exit status 1 or 2 (not a signal) and stderr containing $2
fails_with() {
    local what=$1 pattern=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q -- "$pattern" "$T/err"; then ok "$what (exit $rc: $(head -c 150 "$T/err" | tr '\n' ' '))"
    else nok "$what (exit $rc, stderr: $(head -c 300 "$T/err" | tr '\n' ' '))"; fi
}

for fx in tiny-a tiny-b; do
    out=$($S generate -m $D/fixtures/$fx --ids "$(cat $D/cli/$fx-p1.ids)" -n 24 --temp 0 --print-ids)
    check "$fx: generate --ids gives the reference's 24 greedy ids" [ "$out" = "$(cat $D/cli/$fx-p1.expected)" ]
    $S generate -m $D/fixtures/$fx --batch-file $D/cli/$fx-batch.txt -n 16 --temp 0 --print-ids >"$T/batch.out"
    check "$fx: generate --batch-file prints each prompt's reference greedy ids, in order" cmp -s "$T/batch.out" $D/cli/$fx-batch.expected
done

$S logits -m $D/fixtures/tiny-a --ids 5,6,7,8 --all -o "$T/all.bin" && $S logits -m $D/fixtures/tiny-a --ids 5,6,7,8 -o "$T/last.bin"
check "logits --all writes [T][V] float32 (4 x 1024 x 4 bytes)" [ "$(stat -c %s "$T/all.bin")" = 16384 ]
check "logits without --all writes the last row of --all" cmp -s "$T/last.bin" <(tail -c 4096 "$T/all.bin")
$S logits -m $D/fixtures/tiny-a --ids 5,6,7,8 --all --chunk 3 -o "$T/chunked.bin"
check "logits --chunk 3 writes the same bytes as one chunk" cmp -s "$T/all.bin" "$T/chunked.bin"

$S synth --preset tiny -o "$T/tiny" >/dev/null && $S inspect -m "$T/tiny" >"$T/inspect"
check "synth tiny + inspect: vocabulary 151936, tied" grep -q "vocab 151936, tied" "$T/inspect"
check "inspect reports bytes read per token" grep -q "read per token" "$T/inspect"
check "inspect reports cache bytes per token and sequence" grep -q "per sequence:" "$T/inspect"
$S synth --preset tiny --dtype q4 -o "$T/tiny-q4" >/dev/null && $S inspect -m "$T/tiny-q4" >"$T/inspect4"
check "synth --dtype q4 is an MLX checkpoint with 4-bit weights" grep -q "affine 4-bit" "$T/inspect4"
check "generate runs on the q4 synth model" $S generate -m "$T/tiny-q4" --ids 1,2,3 -n 4

fails_with "no arguments prints usage" "usage" $S
fails_with "unknown command" "unknown command" $S frobnicate
fails_with "missing model directory" "/nonexistent/config.json" $S generate -m /nonexistent --ids 1 -n 1
fails_with "bad --ids" "bad token id" $S generate -m $D/fixtures/tiny-a --ids 1,x -n 1
fails_with "token id outside the vocabulary" "outside the vocabulary" $S generate -m $D/fixtures/tiny-a --ids 1,5000 -n 1
fails_with "missing -n" "required" $S generate -m $D/fixtures/tiny-a --ids 1
fails_with "bad -n" "-n" $S generate -m $D/fixtures/tiny-a --ids 1 -n abc
fails_with "unknown option" "unknown option" $S logits -m $D/fixtures/tiny-a --ids 1 -o "$T/x" --bogus
fails_with "unknown synth preset" "unknown preset" $S synth --preset 99b -o "$T/x99"
fails_with "synth --group 48 (MLX groups are 32, 64 or 128)" "32, 64 or 128" $S synth --preset tiny --dtype q4 --group 48 -o "$T/g48"
fails_with "synth -o - (a checkpoint is a directory)" "cannot hold a checkpoint" $S synth --preset tiny -o -
check "logits -o - writes the float32 row to standard output" cmp -s "$T/last.bin" <($S logits -m $D/fixtures/tiny-a --ids 5,6,7,8 -o -)
# images (tiny-vl): IDS holds each image's run of image tokens (1000); tests/test_vision.c
# checks these logits against the reference
VL=$D/fixtures/tiny-vl
VIDS=5,6,7,1002,1000,1000,1000,1000,1003,8,9,1002,1000,1000,1000,1000,1000,1003,10,11,12
VL_GREEDY="441 276 108 559 521 463 387 697 64 1008 695 207" # golden.safetensors mm.greedy
$S logits -m $VL --ids $VIDS --image $VL/images/img0.png --image $VL/images/img2.png --all -o "$T/vl.bin"
$S logits -m $VL --ids $VIDS --image $VL/images/img0.png --image $VL/images/img2.png --all --chunk 5 -o "$T/vl5.bin"
check "logits --image (two PNGs): [21][1024] float32, the same bytes in chunks of 5" cmp -s "$T/vl.bin" "$T/vl5.bin"
check "  and of the right size" [ "$(stat -c %s "$T/vl.bin")" = 86016 ]
fails_with "an image-token run shorter than its image" "image 1: a run of 2 image tokens" $S logits -m $VL --ids 5,1000,1000,6 --image $VL/images/img0.png -o "$T/x"
fails_with "--image on a text-only model" "takes no images" $S logits -m $D/fixtures/tiny-a --ids 5,6 --image $VL/images/img0.png -o "$T/x"
printf 'not a picture' >"$T/bad.png"
fails_with "a file that is no image" "image 1: not an image" $S logits -m $VL --ids 5,1000,1000,1000,1000 --image "$T/bad.png" -o "$T/x"
out=$($S generate -m $VL --ids $VIDS --image $VL/images/img0.png --image $VL/images/img2.png -n 12 2>"$T/err")
check "generate --image: the reference's 12 greedy tokens after the two-image prompt" [ "$out" = "$(printf '%s' "$VL_GREEDY")" ]
$S synth --preset tiny --dtype q4 --vision --tokenizer $D/tokenizers/qwen3 -o "$T/sv" >/dev/null
out=$($S generate -m "$T/sv" --ids 9707,11,151652,151655,151655,151655,151655,151653,13 --image $VL/images/img0.png -n 6 2>"$T/err")
check "synth --vision (a q4 model with a bf16 tower): generate --image gives 6 tokens ($out)" [ "$(echo "$out" | wc -w)" = 6 ]
out=$($S bench -m "$T/sv" --image 96x64,64x64 --decode-s 0 2>"$T/err")
check "bench --image: a row per size with images/s ($(echo "$out" | grep -c '^[0-9]*x[0-9]* ') rows)" [ "$(echo "$out" | grep -c '^[0-9]*x[0-9]* ')" = 2 ]
fails_with "bench --image with a malformed size" "WIDTHxHEIGHT" $S bench -m "$T/sv" --image 96by64
fails_with "bench --image on a text-only model" "vision" $S bench -m $D/fixtures/tiny-a --image 64x64
out=$($S bench --grammar --tokenizer $D/tokenizers/tiny/tokenizer.json --vocab 2048 2>"$T/err")
check "bench --grammar: mask and apply times for JSON objects and a nested schema ($(echo "$out" | grep -c 'p50') rows)" \
    [ "$(echo "$out" | grep -c '^  mask .*p50 .*p99')" = 2 ]
fails_with "bench --grammar without a tokenizer" "tokenizer" $S bench --grammar
fails_with "a missing image file" "nope.png" $S logits -m $VL --ids 5,1000 --image "$T/nope.png" -o "$T/x"
check "no file named '-' was made" [ ! -e ./- ]
fails_with "a directory where a file is expected: named as such" "is a directory" $S tokenize -m $D/fixtures/tiny-a --text-file $D
STRAND_KERNELS=bogus $S generate -m $D/fixtures/tiny-a --ids 1,2 -n 1 >/dev/null 2>"$T/kerr"
check "an unknown STRAND_KERNELS is called unknown, with the known sets" grep -q "not a kernel set (known: auto, ref" "$T/kerr"
mkdir -p "$T/trunc" && cp $D/fixtures/tiny-a/config.json "$T/trunc/" && head -c 300000 $D/fixtures/tiny-a/model.safetensors >"$T/trunc/model.safetensors"
fails_with "truncated checkpoint" "model.safetensors" $S inspect -m "$T/trunc"
printf '1,2\nnot,ids\n' >"$T/badbatch"
fails_with "bad line in a batch file" "line 2" $S generate -m $D/fixtures/tiny-a --batch-file "$T/badbatch" -n 2
check "-n past the context stops at the context (--ctx 10, 3-token prompt: 7 tokens)" [ "$($S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 50 --ctx 10 | wc -w)" = 7 ]
fails_with "prompt longer than --ctx is refused" "context length is 2" $S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 1 --ctx 2
a=$($S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 8 --temp 0.8 --top-p 0.9 --seed 7)
b=$($S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 8 --temp 0.8 --top-p 0.9 --seed 7)
c=$($S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 8 --temp 0.8 --top-p 0.9 --seed 8)
check "generate --seed: same seed same ids, another seed other ids" [ "$a" = "$b" -a "$a" != "$c" ]
printf '1,2,3\n1,2,3\n' >"$T/twice"
check "seeded sampling: the same prompt twice in one batch gives identical lines" [ "$($S generate -m $D/fixtures/tiny-a --batch-file "$T/twice" -n 8 --temp 0.8 --seed 7 | sort -u | wc -l)" = 1 ]
$S generate -m $D/fixtures/tiny-a --ids 1,2,3 -n 3 --logprobs 4 >"$T/lp"
check "--logprobs 4: one line per token with 4 alternatives" [ "$(grep -c '|' "$T/lp")" = 3 -a "$(sed -n 2p "$T/lp" | tr ' ' '\n' | grep -c ':')" = 4 ]
fails_with "bad sampling value" "top_p" $S generate -m $D/fixtures/tiny-a --ids 1 -n 1 --top-p 0
fails_with "--stop without a tokenizer" "tokenizer" $S generate -m $D/fixtures/tiny-a --ids 1 -n 1 --stop x
echo "# $n checks"
