#!/usr/bin/env bash
# Short runs of every libFuzzer target (fuzz/fuzz_*.c, built with clang + ASan/UBSan by
# `make fuzz`) from its seed corpus in fuzz/corpus/<target>. A crash, leak or timeout fails.
# Longer runs by hand: build/fuzz/<target> -max_total_time=600 fuzz/corpus/<target>
set -u
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-8}
n=0
if ! command -v clang >/dev/null 2>&1; then
    echo "not ok 1 - clang is needed for the fuzz targets"
    exit 1
fi
if ! make -s -j"$(nproc)" fuzz >build/fuzz-build.log 2>&1; then
    echo "not ok 1 - fuzz targets build (build/fuzz-build.log)"
    tail -5 build/fuzz-build.log
    exit 1
fi
mkdir -p build/fuzz-artifacts
for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    work=$(mktemp -d)
    [ -d "fuzz/corpus/$name" ] && cp -r "fuzz/corpus/$name/." "$work/"
    log="build/fuzz-artifacts/$name.log"
    if "$f" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 \
        -artifact_prefix="build/fuzz-artifacts/$name-" "$work" >"$log" 2>&1; then
        n=$((n + 1))
        echo "ok $n - $name: ${secs}s of fuzzing, $(grep -o 'cov: [0-9]*' "$log" | tail -1), no crash"
    else
        n=$((n + 1))
        echo "not ok $n - $name: see $log"
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5
    fi
    rm -rf "$work"
done
