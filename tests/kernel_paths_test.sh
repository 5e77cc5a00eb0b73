#!/usr/bin/env bash
# The fixture tests (tests/test_fixtures.c: logits within 1e-3 of the reference, greedy ids,
# ragged batches bit-identical to solo runs, chunked prefill = one-shot) on every kernel set
# this CPU runs, forced with STRAND_KERNELS (test_fixtures itself runs the default, the best
# set). The AMX tile logic also runs with emulated tile instructions on tiny-a, so machines
# without AMX check its numerics too. One TAP line per set, and one for the best set with
# STRAND_PACK=0 (matrices in the checkpoint's layout rather than packed at load).
set -u
cd "$(dirname "$0")/.."
n=0
fail=0
best=$(build/tests/test_kernels --best)
for k in $(build/tests/test_kernels --list) amx-emulated; do
    filter=
    [ "$k" = amx-emulated ] && filter=tiny-a
    if [ "$k" = amx-emulated ] && ! build/tests/test_kernels --list | grep -qx avx512; then continue; fi
    log=$(mktemp)
    STRAND_KERNELS=$k build/tests/test_fixtures $filter >"$log" 2>&1
    rc=$?
    summary=$(tail -1 "$log")
    n=$((n + 1))
    if [ $rc -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed' "$log"; then
        # the largest error against the reference among the "within 1e-3" checks
        worst=$(grep '^ok.*within 1e-3' "$log" | grep -o '[0-9.]*e[-+][0-9]*)' | tr -d ')' | sort -g | tail -1)
        echo "ok $n - fixtures with STRAND_KERNELS=$k${filter:+ ($filter)}: ${summary#\# } (largest logit error vs the reference $worst; default set here: $best)"
    else
        echo "not ok $n - fixtures with STRAND_KERNELS=$k: $summary"
        grep '^not ok' "$log" | head -5 | sed 's/^/#   /'
        fail=1
    fi
    rm -f "$log"
done
# the best set on the checkpoints' own layout (no packed copies)
log=$(mktemp)
STRAND_PACK=0 build/tests/test_fixtures >"$log" 2>&1
rc=$?
n=$((n + 1))
if [ $rc -eq 0 ] && grep -q '^# [0-9]* passed, 0 failed' "$log"; then
    echo "ok $n - fixtures with STRAND_PACK=0 (unpacked matrices, $best): $(tail -1 "$log" | sed 's/^# //')"
else
    echo "not ok $n - fixtures with STRAND_PACK=0: $(tail -1 "$log")"
    grep '^not ok' "$log" | head -5 | sed 's/^/#   /'
    fail=1
fi
rm -f "$log"
exit $fail
