#!/usr/bin/env bash
# Builds of the CUDA library with other compile-time switches, from this build's objects (only
# the files named are compiled again), for measuring side by side in one GPU run (ab.sh,
# pending.sh): each NAME gets DIR/NAME.so.
#   bench/cuda/variants.sh DIR NAME "DEFINES" FILE.o [FILE.o ...] [-- NAME "DEFINES" FILE.o ...]
# e.g. bench/cuda/variants.sh .gpu/var x1 "-DCU_BLAS_EXACT=1" matmul_bf16.cu.o cuda_backend.pic.o \
#        -- n8 "-DGDN_NORM_WARPS=8" gdn.cu.o -- u4 "-DMMV16_U=4" matmul_bf16.cu.o
# (`make all` first; FILE.o as under build/obj/src/backend/cuda; a define read by the host
# code needs its .pic.o too)
set -eu
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { sed -n '2,9p' "$0"; exit 2; }
out=$1
shift
mkdir -p "$out"
while [ $# -ge 2 ]; do
    name=$1 defs=$2
    shift 2
    B=$(mktemp -d)
    cp -a build/obj "$B/obj"
    while [ $# -gt 0 ] && [ "$1" != -- ]; do rm -f "$B/obj/src/backend/cuda/$1"; shift; done
    [ "${1:-}" = -- ] && shift
    make -s BUILD="$B" CUDA_DEFS="$defs" CUDA_CFLAGS="-O2 -g $defs" "$B/libstrand-cuda.so" >"$B/log" 2>&1 ||
        { tail -20 "$B/log"; exit 1; }
    cp "$B/libstrand-cuda.so" "$out/$name.so"
    rm -rf "$B"
    echo "$out/$name.so ($defs)"
done
