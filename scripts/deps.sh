#!/usr/bin/env bash
# Installs the Debian 12 packages strand needs to build and test, if any are missing.
set -eu
pkgs="build-essential pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev openmpi-bin libopenmpi-dev clang libclang-rt-14-dev"
missing=""
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    echo "installing:$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq || true
    $SUDO apt-get install -y -qq $missing
fi
# the end-to-end tests' OpenAI client (versions pinned by tests/e2e/package-lock.json)
cd "$(dirname "$0")/.."
if [ ! -d tests/e2e/node_modules/openai ]; then
    echo "installing the test client: npm ci in tests/e2e"
    (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
