#!/usr/bin/env bash
# Installs the Debian 12 packages strand needs to build and test, if any are missing.
set -eu
pkgs="build-essential pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev clang"
missing=""
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq $missing
