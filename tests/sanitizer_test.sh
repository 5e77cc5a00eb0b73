#!/usr/bin/env bash
# The suite under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer: the
# library, the CLI and every test program are built with clang into build/asan, then every
# unit test program, the CLI tests and the server tests (the OpenAI-client end-to-end test,
# the robustness test and the request property test) run on that build. One TAP line per
# program; a sanitizer report anywhere fails it.
set -u
cd "$(dirname "$0")/.."
B=build/asan
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; }
if ! command -v clang >/dev/null 2>&1; then
    nok "clang is needed for the sanitizer build"
    exit 1
fi
SAN="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
mkdir -p $B
# (NVCC= : no CUDA library here; the main build compiles it, and nothing here runs it)
if ! make -s -j2 BUILD=$B CC=clang KCC=clang CFLAGS="$SAN" NVCC= all >$B/build.log 2>&1; then
    nok "the sanitizer build ($B/build.log): $(grep -m3 error $B/build.log)"
    exit 1
fi
ok "library, CLI and tests build with -fsanitize=address,undefined"
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:print_summary=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
logs=$B/logs
mkdir -p $logs
summarize() { # name log rc seconds
    local name=$1 log=$2 rc=$3 secs=$4 p f
    p=$(grep -c '^ok ' "$log")
    f=$(grep -c '^not ok ' "$log")
    if grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log"; then f=$((f + 1)); fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ "$f" -eq 0 ] && [ "$p" -gt 0 ]; then ok "$name under ASan+UBSan: $p checks pass (${secs}s)"
    else
        nok "$name under ASan+UBSan: $p pass, $f fail ($log, ${secs}s)"
        grep -E '^not ok|ERROR: |runtime error:|SUMMARY' "$log" | head -5 | sed 's/^/#   /'
        # the server's side of a failed storm (server_chaos prints its log's tail)
        sed -n "/^# the server's log/,\$p" "$log" | head -42
    fi
}
for t in $B/tests/test_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case "$t" in *.d) continue;; esac
    name=$(basename "$t")
    t0=$(date +%s)
    STRAND_TEST_SCALE=10 "$t" >"$logs/$name.log" 2>&1 # the long-context scenario at 1/10 the lengths
    summarize "$name" "$logs/$name.log" $? $(($(date +%s) - t0))
done
# the shell tests on the sanitizer build (they check their servers' logs and exit status)
for t in run_cli model_cli fortune_cli server_e2e server_robust server_chaos; do
    t0=$(date +%s)
    STRAND=$B/strand CHAOS_SECONDS=12 STRAND_TEST_SCALE=10 bash tests/${t}_test.sh >"$logs/$t.log" 2>&1
    summarize "$t" "$logs/$t.log" $? $(($(date +%s) - t0))
done
echo "# $n checks"
