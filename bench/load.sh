#!/usr/bin/env bash
# Load benchmark of the server on loopback: starts `strand serve` on a model (default: a
# synthesized tiny model with the Qwen3 tokenizer), runs build/bench/bench_load for each
# client count, prints one table row each, stops the server.
#   bench/load.sh [-m DIR] [--clients "1 4 8 16"] [--requests 4] [--max-tokens 64]
set -eu
cd "$(dirname "$0")/.."
MODEL="" CLIENTS="1 4 8 16" REQUESTS=4 MAXTOK=64
while [ $# -gt 0 ]; do
    case $1 in
    -m) MODEL=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --max-tokens) MAXTOK=$2; shift 2 ;;
    *) echo "usage: bench/load.sh [-m DIR] [--clients LIST] [--requests R] [--max-tokens K]" >&2; exit 2 ;;
    esac
done
make -s build/strand build/bench/bench_load
T=$(mktemp -d)
trap 'kill $SRV 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
if [ -z "$MODEL" ]; then
    MODEL=$T/model
    build/strand synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 -o "$MODEL" >/dev/null
    cp tests/data/templates/qwen3.5.jinja "$MODEL/chat_template.jinja"
fi
MAXC=$(echo $CLIENTS | tr ' ' '\n' | sort -n | tail -1)
build/strand serve -m "$MODEL" --port 0 --max-seqs "$MAXC" --max-queue 1024 >"$T/log" 2>&1 &
SRV=$!
for _ in $(seq 300); do grep -q "^strand: ready" "$T/log" && break; sleep 0.1; done
PORT=$(sed -n 's/^strand: listening on http:[^ ]*:\([0-9]*\) .*/\1/p' "$T/log")
echo "server: $(grep 'serving' "$T/log" | sed 's/^strand: //')"
echo "machine: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
first=1
for c in $CLIENTS; do
    if [ $first = 1 ]; then build/bench/bench_load --port "$PORT" --clients "$c" --requests "$REQUESTS" --max-tokens "$MAXTOK"
    else build/bench/bench_load --port "$PORT" --clients "$c" --requests "$REQUESTS" --max-tokens "$MAXTOK" | tail -1; fi
    first=0
done
