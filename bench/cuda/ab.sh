#!/usr/bin/env bash
# Builds of the CUDA library side by side in one run (the run-to-run spread of a GPU machine
# is as large as many changes, so a change is measured against its base in the same run):
# each NAME=LIB gets a copy of build/strand beside it (strand opens the libstrand-cuda.so
# next to itself), and the same strand command runs for each in turn, ROUNDS times (default
# 2), alternating. Each run's output goes to OUTDIR/NAME.rR.txt (stderr .err); its table
# (prefill and decode rows) is printed under its build's name.
#   [ROUNDS=N] bench/cuda/ab.sh OUTDIR NAME=LIB [NAME=LIB ...] -- STRAND-ARGUMENTS...
# e.g. bench/cuda/ab.sh /tmp/ab base=/tmp/v/base.so new=build/libstrand-cuda.so -- \
#        bench --device cuda --synth 27b --precision bf16 --kv-dtype bf16 --prompts 8192 --batches 1
set -u
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
O=$1
shift
names=()
libs=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    names+=("${1%%=*}")
    libs+=("${1#*=}")
    shift
done
[ "${1:-}" = -- ] && shift
mkdir -p "$O"
for i in "${!names[@]}"; do
    d="$O/${names[$i]}.bin"
    mkdir -p "$d"
    cp build/strand "$d/strand"
    cp "${libs[$i]}" "$d/libstrand-cuda.so" || exit 1
done
for r in $(seq 1 "${ROUNDS:-2}"); do
    for n in "${names[@]}"; do
        "$O/$n.bin/strand" "$@" >"$O/$n.r$r.txt" 2>"$O/$n.r$r.err"
        echo "== $n, round $r (rc $?)"
        sed -n '/^prefill/,$p' "$O/$n.r$r.txt" | grep -Ev "^\(|^ [a-z]|^$" | head -24
    done
done
