#!/usr/bin/env bash
# `strand serve` against the requests that used to crash it, hang it or leak its slots
# (tests/e2e/robust.mjs), and start-up refusals: an empty API key, a memory plan beyond the
# machine. STRAND=path runs another build (the sanitizer test passes its own). TAP lines.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { n=$((n + 1)); echo "not ok $n - $*"; }
if ! command -v node >/dev/null 2>&1 || [ ! -d tests/e2e/node_modules/openai ]; then
    echo "not ok 1 - node and tests/e2e/node_modules are needed (run scripts/deps.sh)"
    exit 1
fi
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null
T=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
TOK=tests/data/tokenizers/qwen3
SCRIPT="198,10061,752,1744,911,432,13,151668,785,4226,374,3040"
build/strand synth --preset tiny --tokenizer $TOK --script "$SCRIPT" --poison-token 99 -o "$T/poison" >/dev/null || exit 1
build/strand synth --preset tiny --tokenizer $TOK --seed 5 -o "$T/random" >/dev/null || exit 1
for m in poison random; do cp tests/data/templates/qwen3.5.jinja "$T/$m/chat_template.jinja"; done

# start-up refusals
"$S" serve -m "$T/random" --api-key "" >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 1 ] && grep -q "empty" "$T/e"; then ok "--api-key '' is refused at start"; else nok "--api-key '': rc $rc $(cat "$T/e")"; fi
STRAND_API_KEY= "$S" serve -m "$T/random" >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 1 ] && grep -q "STRAND_API_KEY" "$T/e"; then ok "an empty \$STRAND_API_KEY is refused"; else nok "empty env key: rc $rc $(cat "$T/e")"; fi
: >"$T/emptykey"
"$S" serve -m "$T/random" --api-key-file "$T/emptykey" >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 1 ] && grep -q "empty" "$T/e"; then ok "an empty --api-key-file is refused"; else nok "empty key file: rc $rc $(cat "$T/e")"; fi
"$S" serve -m "$T/random" --prefix-cache maybe >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 2 ] || [ $rc = 1 ] && grep -q "prefix-cache must be on or off" "$T/e"; then ok "--prefix-cache maybe is refused, naming the choices"
else nok "--prefix-cache maybe: rc $rc $(cat "$T/e")"; fi
start=$(date +%s%N)
timeout 20 "$S" serve -m "$T/random" --port 0 --ctx 1073741824 >"$T/o" 2>"$T/e"; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ $rc = 1 ] && grep -q "memory plan needs" "$T/e" && grep -q -- "--ctx [0-9]" "$T/e" && [ $ms -lt 5000 ]; then
    ok "--ctx 2^30 is refused before anything is allocated (${ms} ms), naming what would fit"
else nok "--ctx 2^30: rc $rc ${ms} ms $(head -c 400 "$T/e")"; fi

start_server() { # name args...
    local name=$1
    shift
    "$S" serve --port 0 "$@" >"$T/$name.log" 2>&1 &
    pids+=($!)
}
start_server poison -m "$T/poison" --model-name random
start_server pool -m "$T/random" --model-name random --kv-blocks 64 --max-seqs 2 --max-queue 0
start_server conn -m "$T/random" --model-name random --max-connections 20 --idle-timeout 2
printf 'main-key\n' >"$T/key"
STRAND_API_KEY=main-key start_server main -m "$T/random" --model-name random --stall-timeout 3
start_server host -m "$T/random" --model-name random --host localhost --api-key-file "$T/key"
for _ in $(seq 300); do
    [ "$(cat "$T"/{poison,pool,conn,main,host}.log | grep -c '^strand: ready')" = 5 ] && break
    sleep 0.1
done
url() { sed -n 's/^strand: listening on \(http:[^ ]*\).*/\1/p' "$T/$1.log"; }
for s in poison pool conn main host; do
    if [ -z "$(url $s)" ] || ! grep -q '^strand: ready' "$T/$s.log"; then
        nok "server $s starts: $(tail -3 "$T/$s.log")"
        exit 1
    fi
done
case "$(url host)" in http://127.0.0.1:*|http://\[::1\]:*) ok "--host localhost resolves ($(url host))";; *) nok "--host localhost: $(url host)";; esac
if grep -q "memory plan" "$T/main.log"; then ok "the start-up line states the memory plan"; else nok "no plan line: $(head -3 "$T/main.log")"; fi
POISON_URL=$(url poison) POOL_URL=$(url pool) CONN_URL=$(url conn) MAIN_URL=$(url main) HOST_URL=$(url host) \
    timeout 300 node tests/e2e/robust.mjs || nok "tests/e2e/robust.mjs ran to its end"
# shutdown: every server ends cleanly on SIGTERM (a leak report would make it exit non-zero)
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
clean=1
for p in "${pids[@]}"; do wait "$p" || clean=0; done
pids=()
if [ $clean = 1 ]; then ok "every server exits 0 on SIGTERM"; else nok "a server did not exit cleanly on SIGTERM"; fi
logs_clean=1
for s in poison pool conn main host; do
    if grep -iE "assert|panic|sanitizer|runtime error|ERROR: " "$T/$s.log"; then logs_clean=0; fi
    if grep -iE "^(Failed|Error|Server reached|Application reported)" "$T/$s.log"; then logs_clean=0; fi
done
if [ $logs_clean = 1 ]; then ok "the servers' logs hold no sanitizer report, assertion or libmicrohttpd line"
else nok "a server's log is not clean"; fi
