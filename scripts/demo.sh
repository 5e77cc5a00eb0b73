#!/usr/bin/env bash
# The README's main job on a machine with no model: synthesize a small Qwen3.5-architecture
# checkpoint (random weights, the real Qwen3 tokenizer and chat template), describe it, and
# chat with it through the whole pipeline (template, tokenizer, scheduler, sampler).
# With a real checkpoint: MODEL=/path/to/Qwen3.5-0.8B scripts/demo.sh
set -eu
cd "$(dirname "$0")/.."
S=build/strand
MODEL=${MODEL:-build/demo-tiny}
PROMPT=${PROMPT:-"Why is the sky blue?"}
if [ ! -f "$MODEL/config.json" ]; then
    echo "== synthesizing a tiny random-weight model in $MODEL"
    $S synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 -o "$MODEL"
fi
echo "== strand inspect -m $MODEL"
$S inspect -m "$MODEL"
echo
echo "== strand run -m $MODEL -p \"$PROMPT\" -n 48"
$S run -m "$MODEL" -p "$PROMPT" -n 48 --temp 0.7 --seed 1
echo "(random weights make noise; point MODEL at a real Qwen3.5 checkpoint for words)"
