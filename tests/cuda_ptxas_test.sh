#!/usr/bin/env bash
# The wgmma kernels as ptxas builds them (no GPU needed, only nvcc): no register spills, and no
# wgmma serialized (ptxas's C7518: the products then run one at a time, as where a warp may
# branch away with products in flight; C7513: a product's input registers defined while
# products run, as k_wgmma_qstream's removed form defined the next stage's A registers).
# Without nvcc it says so and skips. TAP lines.
set -u
cd "$(dirname "$0")/.."
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $1"; }
NVCC=$(command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
if [ -z "$NVCC" ]; then
    ok "ptxas checks skipped: nvcc is not installed"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in src/backend/cuda/attention_wgmma.cu src/backend/cuda/matmul_wgmma.cu; do
    log=$tmp/$(basename "$f").log
    if ! "$NVCC" -std=c++17 -O3 -Isrc -gencode arch=compute_90a,code=sm_90a -Xptxas -v -c "$f" -o "$tmp/x.o" \
        >"$log" 2>&1; then
        not_ok "$f builds for sm_90a"
        tail -5 "$log"
        continue
    fi
    kernels=$(grep -c 'Compiling entry function' "$log")
    spills=$(grep -E 'bytes spill (stores|loads)' "$log" | grep -cv ' 0 bytes spill stores, 0 bytes spill loads')
    if [ "$kernels" -gt 0 ] && [ "$spills" -eq 0 ]; then
        ok "$f: $kernels kernels, none spills registers"
    else
        not_ok "$f: $kernels kernels, $spills spill registers"
    fi
    if grep -qE 'C751[38]' "$log"; then
        not_ok "$f: ptxas serializes wgmma"
        grep -E 'C751[38]' "$log" | head -3
    else
        ok "$f: no wgmma serialized"
    fi
done
