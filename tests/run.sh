#!/usr/bin/env bash
# Runs every test program (build/tests/test_*) and every shell test (tests/*_test.sh) from
# the repository root, counts their "ok"/"not ok" lines, and ends with "N passed, N failed".
# A program that exits non-zero without reporting a failure counts as one failure.
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
logdir=build/test-logs
mkdir -p "$logdir"
run_one() {
    local name=$1
    shift
    local log="$logdir/$name.log"
    local start=$(date +%s)
    "$@" >"$log" 2>&1
    local rc=$?
    local p f
    p=$(grep -c '^ok ' "$log")
    f=$(grep -c '^not ok ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
        echo "not ok - $name exited with status $rc" >>"$log"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    local secs=$(( $(date +%s) - start ))
    if [ "$f" -ne 0 ]; then
        echo "FAIL $name: $p passed, $f failed (${secs}s)"
        grep -E '^not ok' "$log" | head -20 | sed 's/^/    /'
        tail -5 "$log" | sed 's/^/    | /'
    else
        echo "pass $name: $p passed (${secs}s)"
    fi
}
filter=${1:-}
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
    run_one "$name" "$t"
done
for t in tests/*_test.sh; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .sh)
    [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
    run_one "$name" bash "$t"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
