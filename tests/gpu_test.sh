#!/usr/bin/env bash
# The GPU tests (`make test-gpu`): on a machine with an NVIDIA GPU and build/libstrand-cuda.so,
# the CUDA backend must pass the op conformance test, every fixture (STRAND_DEVICE=cuda:
# logits, greedy, ragged batches bit-identical to solo runs, chunked prefill, 600-step
# decode, MLX widths, MoE), allocate no device memory while decoding, give the CLI the
# CPU's greedy tokens and perplexity, and give `exact` the same greedy tokens (logits within
# 1e-4) in one 2,048-token step as in steps of 128. Without a GPU it says so and skips. TAP
# lines.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
D=tests/data
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); echo "not ok $n - $1"; fail=1; }
why=$(build/tests/test_backend_ops --cuda-available 2>&1)
if [ $? -ne 0 ]; then
    ok "GPU tests skipped: no CUDA backend here ($why)"
    echo "# 1 checks"
    exit 0
fi
summary() { grep '^# [0-9]* passed' "$1" | tail -1 | sed 's/^# //'; }
# two [T][V] float32 logit files (V given): "FLIPS REL", the positions whose largest logit is
# at another id (the first of equals) and the largest |a - b| over the largest |a|; "none"
# where they hold no whole rows, differ in length or are all zeros
logit_cmp() { # A B V
    [ "$(stat -c %s "$1" 2>/dev/null)" = "$(stat -c %s "$2" 2>/dev/null)" ] || { echo none; return; }
    paste <(od -An -v -f -w4 "$1") <(od -An -v -f -w4 "$2") |
        awk -v V="$3" 'function row() { if (ia != ib) fl++ }
            { i = (NR - 1) % V
              if (i == 0) { if (NR > 1) row(); ma = $1; ia = 0; mb = $2; ib = 0 }
              else { if ($1 > ma) { ma = $1; ia = i } if ($2 > mb) { mb = $2; ib = i } }
              d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $1 < 0 ? -$1 : $1; if (a > s) s = a; k++ }
            END { if (k == 0 || k % V || s == 0) print "none"; else { row(); printf "%d %.3g\n", fl, m / s } }'
}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

build/tests/test_backend_ops >"$T/ops" 2>&1
c=$(grep -c '^ok.*cuda device 0' "$T/ops")
cb=$(grep -c '^ok.*cuda bf16 device 0' "$T/ops")
if grep -q '^# [0-9]* passed, 0 failed' "$T/ops" && [ "$c" -gt 0 ] && [ "$cb" -gt 0 ]; then
    w=$(grep '^ok.*cuda device 0.*within' "$T/ops" | grep -o 'worst [0-9.e+-]*' | awk '{print $2}' | sort -g | tail -1)
    wb=$(grep '^ok.*cuda bf16 device 0.*within' "$T/ops" | grep -o 'worst [0-9.e+-]*' | awk '{print $2}' | sort -g | tail -1)
    ok "op conformance, CUDA backend: $c checks pass (largest error vs the scalar reference $w); --precision bf16: $cb (largest $wb, bound 2e-2)"
else
    nok "op conformance: $(summary "$T/ops")"
    grep '^not ok' "$T/ops" | head -8 | sed 's/^/#   /'
fi

STRAND_DEVICE=cuda build/tests/test_fixtures >"$T/fx" 2>&1
if [ $? -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed' "$T/fx" && grep -q 'CUDA backend prepares' "$T/fx"; then
    w=$(grep '^ok.*within 1e-3' "$T/fx" | grep -o '[0-9.]*e[-+][0-9]*)' | tr -d ')' | sort -g | tail -1)
    ok "fixtures on the CUDA backend: $(summary "$T/fx") (largest logit error vs the reference $w)"
else
    nok "fixtures on the CUDA backend: $(summary "$T/fx")"
    grep '^not ok' "$T/fx" | head -8 | sed 's/^/#   /'
fi

build/tests/test_alloc >"$T/alloc" 2>&1
if grep -q '^# [0-9]* passed, 0 failed' "$T/alloc" && grep -q '^ok.*on CUDA: .*decode steps' "$T/alloc"; then
    ok "$(grep '^ok.*on CUDA: .*decode steps' "$T/alloc" | head -1 | sed 's/^ok [0-9]* - //')"
else
    nok "device allocations: $(grep 'on CUDA' "$T/alloc" | head -3 | tr '\n' ' ')"
fi

if grep -q '^ok.*captured once as a graph' "$T/alloc" && grep -q '^ok.*MoE decode steps run eagerly' "$T/alloc"; then
    ok "$(grep '^ok.*captured once as a graph' "$T/alloc" | head -1 | sed 's/^ok [0-9]* - //')"
else
    nok "CUDA graphs: $(grep 'graph\|eagerly' "$T/alloc" | head -3 | tr '\n' ' ')"
fi

if "$S" bench --device cuda --synth tiny --prompts 16 --batches 1,2 --decode-s 0.5 >"$T/bench" 2>&1 &&
    grep -q 'synthetic tiny' "$T/bench"; then
    ok "strand bench --synth tiny: weights made in device memory, $(grep -A3 '^decode  *batch' "$T/bench" | awk '$1 == 1 { print $3; exit }') tok/s at batch 1"
else
    nok "bench --synth: $(tail -3 "$T/bench" | tr '\n' ' ')"
fi

# the prefix cache on the GPU: snapshots and forks copied in device memory, cached runs equal
# to cold ones bit for bit (the same test program as on the CPU)
STRAND_DEVICE=cuda build/tests/test_prefix >"$T/prefix" 2>&1
if [ $? = 0 ] && ! grep -q '^not ok' "$T/prefix"; then ok "prefix cache on the GPU: $(summary "$T/prefix")"
else nok "prefix cache on the GPU: $(grep '^not ok' "$T/prefix" | head -3 | tr '\n' ' ')"; fi

a=$("$S" generate --device cpu -m $D/fixtures/tiny-b --ids 1,2,3,4,5 -n 16 2>/dev/null)
b=$("$S" generate --device cuda -m $D/fixtures/tiny-b --ids 1,2,3,4,5 -n 16 2>"$T/gerr")
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "strand generate --device cuda: the CPU's 16 greedy tokens ($b)"
else nok "generate --device cuda gave '$b', the CPU '$a' ($(head -c 300 "$T/gerr"))"; fi

# images: the tower on the CPU, the language model with M-RoPE on the GPU (tiny-vl's two-image prompt)
VL=$D/fixtures/tiny-vl
VL_GREEDY="441 276 108 559 521 463 387 697 64 1008 695 207" # golden.safetensors mm.greedy
v=$("$S" generate --device cuda -m $VL --ids 5,6,7,1002,1000,1000,1000,1000,1003,8,9,1002,1000,1000,1000,1000,1000,1003,10,11,12 \
    --image $VL/images/img0.png --image $VL/images/img2.png -n 12 2>"$T/verr")
if [ "$v" = "$VL_GREEDY" ]; then ok "images on the GPU (M-RoPE): tiny-vl's two-image prompt gives the reference's 12 greedy tokens"
else nok "images on the GPU: '$v', the reference '$VL_GREEDY' ($(head -c 300 "$T/verr"))"; fi

# tiny-fortune's held-out perplexity (ppl ERRFILE ARGS...: strand perplexity's number, empty on
# failure) and whether two of them are within a relative bound (near A B BOUND)
ppl() { local e=$1; shift; "$S" perplexity "$@" --text-file models/tiny-fortune/heldout.txt --json 2>>"$e" |
    grep -o '"perplexity": *[0-9.]*' | grep -o '[0-9.]*$'; }
near() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d / a < r) }'; }

p1=$(ppl /dev/null --device cpu -m models/tiny-fortune)
p2=$(ppl "$T/perr" --device cuda -m models/tiny-fortune)
if near "$p1" "$p2" 1e-4; then
    ok "tiny-fortune held-out perplexity on the GPU $p2, on the CPU $p1 (within 1e-4)"
else
    nok "perplexity: GPU '$p2', CPU '$p1' ($(head -c 300 "$T/perr"))"
fi

p3=$(ppl "$T/perr3" --device cuda --precision bf16 -m models/tiny-fortune)
if near "$p2" "$p3" 1e-3; then
    ok "tiny-fortune held-out perplexity with --precision bf16 $p3, exact $p2 (within 0.1%)"
else
    nok "perplexity in bf16: '$p3', exact '$p2' ($(head -c 300 "$T/perr3"))"
fi

# the chunked delta rule over slabs: windows of 4,096 tokens, one a step, are 64 chunks, which
# the rule takes in two slabs of 32 (its workspace's two halves: the second slab's chunk part
# runs beside the first's scan; `bf16` only: `exact` keeps the per-step rule); `bf16` within
# 0.1% of `exact` with the same windows (H100, 2026-12-07: 173.0590 against 173.0460; the CPU
# gives 173.0461)
p4=$(ppl "$T/perr4" --device cuda --precision exact -m models/tiny-fortune --window 4096 --batch 1)
p5=$(ppl "$T/perr4" --device cuda --precision bf16 -m models/tiny-fortune --window 4096 --batch 1)
if near "$p4" "$p5" 1e-3; then
    ok "tiny-fortune in windows of 4,096 tokens (the chunked rule in two slabs a step): perplexity with --precision bf16 $p5, exact $p4 (within 0.1%)"
else
    nok "perplexity in windows of 4,096 tokens, bf16: '$p5', exact '$p4' ($(head -c 300 "$T/perr4"))"
fi

# the MLX products' `bf16` form on a trained model: tiny-fortune at 8 bits (strand quantize,
# groups of 64) in windows of 8 tokens, so that every step's products are those of up to 8
# tokens (k_qmvp), `bf16` within 0.1% of `exact`
p6=; p7=
if "$S" quantize -m models/tiny-fortune --bits 8 -o "$T/tf8" >"$T/q8" 2>&1; then
    p6=$(ppl "$T/perr8" --device cuda --precision exact -m "$T/tf8" --window 8 --batch 1)
    p7=$(ppl "$T/perr8" --device cuda --precision bf16 -m "$T/tf8" --window 8 --batch 1)
fi
if near "$p6" "$p7" 1e-3; then
    ok "tiny-fortune at 8 bits, windows of 8 tokens: perplexity with --precision bf16 $p7, exact $p6 (within 0.1%)"
else
    nok "8-bit perplexity in bf16: '$p7', exact '$p6' ($(tail -c 300 "$T/q8" "$T/perr8" 2>/dev/null | tr '\n' ' '))"
fi
# and in windows of 16 and 64 tokens (in `bf16` their products take k_wgmma_qstream where the
# device runs it, else k_qmvp / k_qmv) and of 128 (cuBLASLt on the values dequantized:
# CU_BLAS_Q_MIN_T); at 4 bits in windows of 64 (k_wgmma_qstream from CU_QS_MIN_T4 = 17)
"$S" quantize -m models/tiny-fortune --bits 4 -o "$T/tf4" >"$T/q4" 2>&1 || rm -rf "$T/tf4"
for bw in 8:16 8:64 8:128 4:64; do
    b=${bw%:*} w=${bw#*:}
    p8=; p9=
    if [ -d "$T/tf$b" ]; then
        p8=$(ppl "$T/perr$b$w" --device cuda --precision exact -m "$T/tf$b" --window $w --batch 1)
        p9=$(ppl "$T/perr$b$w" --device cuda --precision bf16 -m "$T/tf$b" --window $w --batch 1)
    fi
    if near "$p8" "$p9" 1e-3; then
        ok "tiny-fortune at $b bits, windows of $w tokens: perplexity with --precision bf16 $p9, exact $p8 (within 0.1%)"
    else
        nok "$b-bit perplexity in bf16, windows of $w: '$p9', exact '$p8' ($(tail -c 300 "$T/q$b" "$T/perr$b$w" 2>/dev/null | tr '\n' ' '))"
    fi
done

# `exact` over step sizes: tiny-fortune's first 2,048 held-out tokens in one step (its
# products on cuBLASLt as three bf16 parts, from CU_BLAS_EXACT_MIN_T tokens; only the
# library's summation order differs) and in steps of 128 (k_gemm): the same greedy token at
# every position, the logits within 1e-4 of the largest (the same bits in a build with
# -DCU_BLAS_EXACT=0)
FT=models/tiny-fortune
xids=$("$S" tokenize -m $FT --text-file $FT/heldout.txt 2>/dev/null | tr ' ' '\n' | head -2048 | paste -sd, -)
xn=$(echo "$xids" | tr ',' '\n' | grep -c .)
"$S" logits --device cuda --precision exact -m $FT --ids "$xids" --all --chunk 2048 -o "$T/x2048.bin" 2>"$T/xerr" &&
    "$S" logits --device cuda --precision exact -m $FT --ids "$xids" --all --chunk 128 -o "$T/x128.bin" 2>>"$T/xerr"
xrc=$?
xr=$(logit_cmp "$T/x2048.bin" "$T/x128.bin" 4160)
xpath=$(grep -o 'products of [0-9]* tokens or more on [^;]*' "$T/xerr" | head -1)
if [ $xrc -eq 0 ] && [ "$xn" = 2048 ] && [ "$xr" != none ] && [ "${xr% *}" = 0 ] && awk -v r="${xr#* }" 'BEGIN { exit !(r <= 1e-4) }'; then
    ok "exact over step sizes: tiny-fortune's 2,048 tokens in one step and in steps of 128 give the same greedy token at every position, logits within ${xr#* } of the largest (bound 1e-4; ${xpath:-no cuBLASLt})"
else
    nok "exact over step sizes: rc $xrc, $xn tokens, flips and difference '$xr' ($(head -c 300 "$T/xerr"))"
fi

# compact logit rows made on the device (the top tokens and log-sum-exp, a kilobyte a token):
# the same draws as from whole rows of the same GPU, log-probabilities within rounding
gen() { "$S" generate --device cuda -m models/tiny-fortune --ids 1,2,3,4,5,6 -n 40 --temp 0.8 --top-k 20 --top-p 0.95 \
    --seed 11 --logprobs 3 "$@"; }
gen >"$T/top" 2>"$T/toperr"
gen --full-logits >"$T/full" 2>>"$T/toperr"
if [ -s "$T/top" ] && [ "$(head -1 "$T/top")" = "$(head -1 "$T/full")" ] &&
    paste -d' ' "$T/top" "$T/full" | awk 'NR > 1 { h = NF / 2; for (i = 1; i <= h; i++) { split($i, a, ":"); split($(i + h), b, ":");
        x = (a[2] == "" ? a[1] : a[2]) - (b[2] == "" ? b[1] : b[2]); if (x < 0) x = -x; if (x > 2e-6) bad = 1 } } END { exit bad }'; then
    ok "sampling from compact rows on the GPU: the whole rows' $(head -1 "$T/top" | wc -w) tokens (temperature 0.8, top-k 20, top-p 0.95), log-probabilities within 2e-6"
else
    nok "compact rows on the GPU: '$(head -1 "$T/top")' against whole rows '$(head -1 "$T/full")' ($(head -c 300 "$T/toperr"))"
fi

# tensor parallelism on the GPU: shards of every fixture as ranks of one process on this GPU
# (host all-reduces through the relay), and the NCCL communicator of one GPU
timeout 300 build/tests/test_cuda_tp >"$T/tp" 2>&1
if [ $? -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed' "$T/tp" && grep -q 'CUDA shards' "$T/tp"; then
    w=$(grep '^ok.*CUDA shards' "$T/tp" | grep -o 'worst [0-9.e+-]*' | awk '{print $2}' | sort -g | tail -1)
    nc=$(grep -c '^ok.*through NCCL on one GPU' "$T/tp")
    ok "tensor parallelism on CUDA: $(grep -c '^ok.*CUDA shards' "$T/tp") sharded runs match the whole model (worst $w); $nc models through NCCL of one GPU the same bits"
else
    nok "tensor parallelism on CUDA: $(summary "$T/tp")"
    grep '^not ok' "$T/tp" | head -8 | sed 's/^/#   /'
fi
a=$("$S" generate --device cuda -m $D/fixtures/tiny-b --ids 1,2,3,4,5 -n 16 2>/dev/null)
b=$(STRAND_NCCL=1 timeout 120 "$S" generate --device cuda -m $D/fixtures/tiny-b --ids 1,2,3,4,5 -n 16 2>"$T/nerr")
if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q 'NCCL' "$T/nerr"; then ok "STRAND_NCCL=1 strand generate --device cuda: the engine through NCCL's communicator of one GPU, the same 16 tokens ($(grep -o 'NCCL [0-9.]*, 1 rank' "$T/nerr" | head -1))"
else nok "generate through NCCL gave '$b', without '$a' ($(head -c 300 "$T/nerr"))"; fi

# the vision tower on the GPU: tiny-vl's embeddings against the reference's
build/tests/test_vision >"$T/vis" 2>&1
if [ $? -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed' "$T/vis" && grep -q '^ok.*(cuda kernels): embeddings within' "$T/vis"; then
    ok "$(grep '^ok.*(cuda kernels): embeddings within' "$T/vis" | sed 's/^ok [0-9]* - //')"
else
    nok "the vision tower on the GPU: $(grep '^not ok' "$T/vis" | head -3 | tr '\n' ' ')"
fi

if command -v node >/dev/null 2>&1 && [ -d tests/e2e/node_modules/openai ]; then
    STRAND_DEVICE=cuda bash tests/server_e2e_test.sh >"$T/e2e" 2>&1
    if [ $? -eq 0 ] && ! grep -q '^not ok' "$T/e2e"; then
        ok "strand serve on the GPU (STRAND_DEVICE=cuda): the end-to-end server tests pass ($(grep -c '^ok' "$T/e2e") checks)"
    else
        nok "server end-to-end on the GPU: $(grep '^not ok' "$T/e2e" | head -3 | tr '\n' ' ')"
    fi
else
    ok "server end-to-end on the GPU skipped: node and tests/e2e/node_modules are not here"
fi

echo "# $n checks"
exit $fail
