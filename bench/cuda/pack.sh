#!/usr/bin/env bash
# Packs what a GPU machine needs to run the GPU tests and benches from a build made here:
# stripped binaries (build/strand, the test programs tests/gpu_test.sh runs, mmv_bench when
# built, the CUDA library) and the Debian shared libraries they link that a bare CUDA image
# lacks (into build/syslib), as one xz tarball to carry (the device tool's transfer is
# small). There: tar xJf FILE && export LD_LIBRARY_PATH=$PWD/build/syslib
#   bench/cuda/pack.sh [FILE]   (default .gpu/carry.tar.xz; `make all mmv-bench` first)
set -eu
cd "$(dirname "$0")/../.."
out=${1:-.gpu/carry.tar.xz}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build/tests" "$tmp/build/syslib"
bins="strand libstrand-cuda.so tests/test_alloc tests/test_backend_ops tests/test_fixtures tests/test_prefix tests/test_cuda_tp tests/test_vision"
[ -x build/mmv_bench ] && bins="$bins mmv_bench"
for f in $bins; do
    strip -o "$tmp/build/$f" "build/$f"
done
# every shared library they link but the C library's own (those must be the machine's)
for f in $bins; do ldd "build/$f"; done | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" "$tmp/build/syslib/"; done
tar -C "$tmp" -cJf "$out" build
echo "$out: $(du -h "$out" | cut -f1) ($(ls "$tmp/build/syslib" | wc -l) shared libraries)"
