#!/usr/bin/env bash
# The README's main job on a machine with no model: synthesize a small Qwen3.5-architecture
# checkpoint (random weights, the real Qwen3 tokenizer), describe it, and generate from it.
# With a real checkpoint: MODEL=/path/to/Qwen3.5-0.8B scripts/demo.sh
set -eu
cd "$(dirname "$0")/.."
S=build/strand
MODEL=${MODEL:-build/demo-tiny}
PROMPT=${PROMPT:-"The capital of France is"}
if [ ! -f "$MODEL/config.json" ]; then
    echo "== synthesizing a tiny random-weight model in $MODEL"
    $S synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 -o "$MODEL"
fi
echo "== strand inspect -m $MODEL"
$S inspect -m "$MODEL"
if $S tokenize --help >/dev/null 2>&1 && [ -f "$MODEL/tokenizer.json" ]; then
    printf '%s' "$PROMPT" >build/demo-prompt.txt
    ids=$($S tokenize -m "$MODEL" --text-file build/demo-prompt.txt)
    echo "== prompt: \"$PROMPT\" -> ids $ids"
    out=$($S generate -m "$MODEL" --ids "$(echo "$ids" | tr ' ' ',')" -n 16 --temp 0 --print-ids)
    echo "== generated ids: $out"
    echo -n "== generated text: "
    $S detokenize -m "$MODEL" --ids "$(echo "$out" | tr ' ' ',')"
    echo
else
    echo "== strand generate -m $MODEL --ids 9707,11,1879 -n 16"
    $S generate -m "$MODEL" --ids 9707,11,1879 -n 16 --temp 0 --print-ids
fi
echo "(random weights: the text is noise; point MODEL at a real Qwen3.5 checkpoint for words)"
