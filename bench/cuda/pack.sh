#!/usr/bin/env bash
# Packs what a GPU machine needs to run the GPU tests and benches from a build made here:
# stripped binaries (build/strand, the test programs tests/gpu_test.sh runs, mmv_bench when
# built, the CUDA library) and the Debian shared libraries they link that a bare CUDA image
# lacks (into build/syslib), as one xz tarball to carry (the device tool's transfer is
# small). There: tar xJf FILE && export LD_LIBRARY_PATH=$PWD/build/syslib
# With --mpi it also carries Open MPI's runtime (Debian's openmpi-bin, libopenmpi3, PMIx and
# their libraries, as installed here) under build/mpi, and build/mpi/env.sh, which points Open
# MPI and PMIx at that tree (OPAL_PREFIX and friends), puts its mpirun first on the PATH and
# keeps to shared memory between the ranks: there, `. build/mpi/env.sh && mpirun
# --allow-run-as-root -np 2 build/strand ...` (not yet tried on a GPU machine).
#   bench/cuda/pack.sh [--mpi] [FILE]   (default .gpu/carry.tar.xz; `make all mmv-bench` first)
set -eu
cd "$(dirname "$0")/../.."
mpi=0
if [ "${1:-}" = --mpi ]; then mpi=1; shift; fi
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
[ -f build/libstrand-mpi.so ] && strip -o "$tmp/build/libstrand-mpi.so" build/libstrand-mpi.so
if [ $mpi = 1 ]; then
    r="$tmp/build/mpi"
    for p in openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7; do
        dpkg -L "$p" | while read -r f; do
            case "$f" in /usr/share/man/* | /usr/share/doc/* | /usr/include/*) continue ;; esac
            if [ -f "$f" ] || [ -L "$f" ]; then mkdir -p "$r$(dirname "$f")" && cp -a "$f" "$r$f"; fi
        done
    done
    cp -L /usr/lib/x86_64-linux-gnu/libmpi.so.40 "$tmp/build/syslib/" 2>/dev/null || true
    cat >"$r/env.sh" <<'ENV'
# source this: Open MPI and PMIx from this tree (bench/cuda/pack.sh --mpi)
M=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$M/usr OPAL_LIBDIR=$M/usr/lib/x86_64-linux-gnu/openmpi/lib OPAL_SYSCONFDIR=$M/etc/openmpi
export OPAL_PKGDATADIR=$M/usr/share/openmpi PMIX_INSTALL_PREFIX=$M/usr/lib/x86_64-linux-gnu/pmix2
export PMIX_MCA_mca_base_component_path=$M/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export LD_LIBRARY_PATH=$M/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=$M/bin:$PATH OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2
ENV
    mkdir -p "$r/bin" && ln -s ../usr/bin/orterun "$r/bin/mpirun"
fi
tar -C "$tmp" -cJf "$out" build
echo "$out: $(du -h "$out" | cut -f1) ($(ls "$tmp/build/syslib" | wc -l) shared libraries)"
