#!/usr/bin/env bash
# The request-level property test (tests/e2e/chaos.mjs) against a running server: random
# requests, disconnects and bad input from several clients; then the server must answer with
# nothing running and no KV block in use. STRAND=path runs another build; CHAOS_SECONDS and
# CHAOS_SEED vary the run. TAP lines.
set -u
cd "$(dirname "$0")/.."
S=${STRAND:-build/strand}
if ! command -v node >/dev/null 2>&1 || [ ! -d tests/e2e/node_modules/openai ]; then
    echo "not ok 1 - node and tests/e2e/node_modules are needed (run scripts/deps.sh)"
    exit 1
fi
T=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
build/strand synth --preset tiny --tokenizer tests/data/tokenizers/qwen3 --seed 11 -o "$T/m" >/dev/null || exit 1
cp tests/data/templates/qwen3.5.jinja "$T/m/chat_template.jinja"
# --idle-timeout 5 (the default), not less: a connection that never carried a response never
# got the server's Keep-Alive hint, and Node's fetch keeps such a one up to 4 s. It opens them:
# a fetch aborted after its request went out reconnects for it and leaves the new connection
# unused. Under a shorter idle timeout, a request sent on one just as the server closed it for
# idleness failed with "other side closed" (HTTP/1.1's keep-alive race, not a dropped request).
"$S" serve --port 0 -m "$T/m" --model-name random --max-seqs 4 --kv-blocks 96 --max-queue 4 --ctx 512 \
    --stall-timeout 2 --idle-timeout 5 --max-body-mb 2 >"$T/log" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '^strand: ready' "$T/log" && break; sleep 0.1; done
url=$(sed -n 's/^strand: listening on \(http:[^ ]*\).*/\1/p' "$T/log")
if [ -z "$url" ] || ! grep -q '^strand: ready' "$T/log"; then
    echo "not ok 1 - the server starts: $(tail -3 "$T/log")"
    exit 1
fi
URL=$url SEED=${CHAOS_SEED:-20261201} SECONDS=${CHAOS_SECONDS:-20} timeout 120 node tests/e2e/chaos.mjs | tee "$T/tap"
rc=${PIPESTATUS[0]}
if [ $rc = 124 ]; then
    echo "not ok - the storm did not end within 120 s: a request hung; the server's state: $(curl -s -m 5 "$url/metrics" | grep -E '^strand_(running|queue|paused|preparing|kv_blocks_used)' | tr '\n' ' ')"
elif [ $rc != 0 ] && [ $rc != 1 ]; then
    echo "not ok - the storm's client exited with status $rc"
fi
# a failed check keeps the server's side of it: the log's last lines, as TAP comments (an
# intermittent failure can then be read from the run that had it; chaos.mjs exits 0 after a
# failed check, so its TAP lines say whether one failed)
if [ $rc != 0 ] || grep -q '^not ok' "$T/tap"; then
    echo "# the server's log, its last 40 of $(wc -l <"$T/log") lines:"
    tail -40 "$T/log" | cut -c1-300 | sed 's/^/#   /'
fi
kill -TERM "$pid"
if wait "$pid"; then echo "ok - the server exits 0 on SIGTERM after the storm"; else echo "not ok - the server's exit after the storm: $(tail -5 "$T/log")"; fi
pid=
# the server speaks for itself: libmicrohttpd's own messages ("Connection was closed by
# remote side ...") stay out of its log, and so would any sanitizer report
if grep -v '^strand: ' "$T/log" | grep -q .; then
    echo "not ok - the server's log holds lines that are not its own:"
    grep -v '^strand: ' "$T/log" | sort | uniq -c | sort -rn | head -5 | sed 's/^/#   /'
else echo "ok - the server's log holds only its own lines: no libmicrohttpd message, no sanitizer report"; fi
