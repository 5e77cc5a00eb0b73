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
# each target on one core, as many at once as there are cores; results in target order
jobs_max=$(nproc)
run_target() { # target name
    local f=$1 name=$2 work rc
    work=$(mktemp -d)
    [ -d "fuzz/corpus/$name" ] && cp -r "fuzz/corpus/$name/." "$work/"
    "$f" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 \
        -artifact_prefix="build/fuzz-artifacts/$name-" "$work" >"build/fuzz-artifacts/$name.log" 2>&1
    rc=$?
    echo $rc >"build/fuzz-artifacts/$name.rc"
    rm -rf "$work"
}
names=()
for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    case "$f" in *.d) continue;; esac
    name=$(basename "$f")
    names+=("$name")
    rm -f "build/fuzz-artifacts/$name.rc"
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    run_target "$f" "$name" &
done
wait
for name in "${names[@]}"; do
    log="build/fuzz-artifacts/$name.log"
    n=$((n + 1))
    if [ "$(cat "build/fuzz-artifacts/$name.rc" 2>/dev/null)" = 0 ]; then
        echo "ok $n - $name: ${secs}s of fuzzing, $(grep -o 'cov: [0-9]*' "$log" | tail -1), no crash"
    else
        echo "not ok $n - $name: see $log"
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5
    fi
done
