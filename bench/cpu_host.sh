#!/usr/bin/env bash
# CPU numbers on another x86 host (e.g. one with AMX): builds strand, runs the kernel tests and
# the fixtures on the best set, synthesizes the 0.8B shape and runs `strand bench` for each
# kernel set with 2 threads (the dev machine's count) and with all cores.
# usage: bench/cpu_host.sh [OUTDIR]
set -u
cd "$(dirname "$0")/.."
out=${1:-/tmp/cpu_host}
mkdir -p "$out"
lscpu | grep -E 'Model name|^CPU\(s\)' ; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
nproc=$(nproc)
if ! make -j"$nproc" build/strand build/tests/test_kernels build/tests/test_fixtures >"$out/build.log" 2>&1; then
    tail -20 "$out/build.log"; exit 1
fi
build/tests/test_kernels >"$out/test_kernels.txt" 2>&1; tail -1 "$out/test_kernels.txt"; grep '^not ok' "$out/test_kernels.txt"
grep -E '^ok.* amx ' "$out/test_kernels.txt" | head -3
build/tests/test_fixtures >"$out/fixtures.txt" 2>&1; echo "fixtures (best set): $(tail -1 "$out/fixtures.txt")"
m=/tmp/strand-0.8b
[ -d $m ] || build/strand synth --preset 0.8b -o $m >/dev/null
for k in $(build/tests/test_kernels --list | grep -v ref); do
    echo "== $k, 2 threads"; build/strand bench -m $m -k "$k" -t 2 --prompts 512,2048 --batches 1,16 --decode-s 4 2>/dev/null | sed -n '/^prefill/,$p'
done
best=$(build/tests/test_kernels --best)
echo "== $best, $nproc threads"; build/strand bench -m $m -k "$best" -t "$nproc" --prompts 2048 --batches 1,16 --decode-s 4 2>/dev/null | sed -n '/^bandwidth/,$p'
