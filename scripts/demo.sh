#!/usr/bin/env bash
# The README's main job: chat with tiny-fortune (models/tiny-fortune: a 7.9M-parameter
# Qwen3.5-architecture model trained on Debian's fortune cookies, shipped with strand) through
# the whole pipeline (chat template, tokenizer, scheduler, sampler, reasoning split), then
# measure its perplexity on held-out text. Greedy, so the replies are always the same.
# With a real checkpoint: MODEL=/path/to/Qwen3.5-0.8B scripts/demo.sh
set -eu
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
MODEL=${MODEL:-models/tiny-fortune}
PROMPT=${PROMPT:-"Tell me something about computers."}
echo "== strand run -m $MODEL -p \"$PROMPT\""
"$S" run -m "$MODEL" -p "$PROMPT"
echo
echo "== the same without thinking (--no-think)"
"$S" run -m "$MODEL" -p "$PROMPT" --no-think
if [ -f "$MODEL/heldout.txt" ]; then
    echo
    echo "== strand perplexity -m $MODEL --text-file $MODEL/heldout.txt"
    "$S" perplexity -m "$MODEL" --text-file "$MODEL/heldout.txt"
fi
