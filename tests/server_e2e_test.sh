#!/usr/bin/env bash
# End-to-end tests of `strand serve` through the official OpenAI client (tests/e2e/e2e.mjs).
# Needs node and tests/e2e/node_modules (scripts/deps.sh installs them from package-lock.json).
# Starts three servers on free loopback ports with synthetic models; prints TAP lines.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
# a launcher in front of each server: STRAND_LAUNCH="mpirun -np 2" (tests/mpi_test.sh)
read -r -a L <<<"${STRAND_LAUNCH:-}"
if ! command -v node >/dev/null 2>&1 || [ ! -d tests/e2e/node_modules/openai ]; then
    echo "not ok 1 - node and tests/e2e/node_modules are needed (run scripts/deps.sh)"
    exit 1
fi
T=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
TOK=tests/data/tokenizers/qwen3
# scripted: "\n" (after <think>) -> reasoning "Let me think about it." </think> "The answer is four";
#           "\n\n" (thinking off) -> <tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>
SCRIPT="198,10061,752,1744,911,432,13,151668,785,4226,374,3040;271,151657,4913,606,3252,455,69364,2198,16370,22317,13778,788,18,3417,151658"
$S synth --preset tiny --tokenizer $TOK --script "$SCRIPT" -o "$T/scripted" >/dev/null || exit 1
$S synth --preset tiny --tokenizer $TOK --seed 5 -o "$T/random" >/dev/null || exit 1
$S synth --preset tiny --tokenizer $TOK --seed 7 --vision -o "$T/vision" >/dev/null || exit 1
for m in scripted random vision; do cp tests/data/templates/qwen3.5.jinja "$T/$m/chat_template.jinja"; done

"${L[@]}" "$S" serve --port 0 -m "$T/scripted" --model-name scripted --api-key test-key >"$T/a.log" 2>&1 &
pids+=($!)
"${L[@]}" "$S" serve --port 0 -m "$T/random" --model-name random --ctx 256 --max-seqs 16 --max-body-mb 1 >"$T/b.log" 2>&1 &
pids+=($!)
"${L[@]}" "$S" serve --port 0 -m "$T/random" --model-name random --max-seqs 1 --max-queue 1 --keepalive 0.2 >"$T/c.log" 2>&1 &
pids+=($!)
SMALL_PID=${pids[2]}
"${L[@]}" "$S" serve --port 0 -m "$T/vision" --model-name vision >"$T/d.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
    [ "$(grep -c '^strand: ready' "$T"/a.log "$T"/b.log "$T"/c.log "$T"/d.log | grep -c ':1$')" = 4 ] && break
    sleep 0.1
done
url() { sed -n 's/^strand: listening on \(http:[^ ]*\).*/\1/p' "$1"; }
SCRIPTED_URL=$(url "$T/a.log")
RANDOM_URL=$(url "$T/b.log")
SMALL_URL=$(url "$T/c.log")
VISION_URL=$(url "$T/d.log")
if [ -z "$SCRIPTED_URL" ] || [ -z "$RANDOM_URL" ] || [ -z "$SMALL_URL" ] || [ -z "$VISION_URL" ]; then
    echo "not ok 1 - servers start"
    tail -5 "$T"/*.log
    exit 1
fi
# the device the servers run on (a GPU run: STRAND_DEVICE=cuda)
grep -h '^strand: running on' "$T/a.log" | head -1 | sed 's/^/# /'
SCRIPTED_URL=$SCRIPTED_URL RANDOM_URL=$RANDOM_URL SMALL_URL=$SMALL_URL SMALL_PID=$SMALL_PID VISION_URL=$VISION_URL \
    IMAGES=tests/data/fixtures/tiny-vl/images \
    timeout 300 node tests/e2e/e2e.mjs
rc=$?
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${pids[@]}"; do wait "$p"; done
pids=()
for l in "$T"/*.log; do grep -iE "assert|panic|sanitizer|runtime error" "$l" && rc=1; done
exit $rc
