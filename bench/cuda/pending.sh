#!/usr/bin/env bash
# One device call's measurements, side by side (a GPU machine's time is short and often none
# starts: build and pack here, run this there). Nothing on main waits for a GPU now (session
# 27, 2026-12-05): this is that session's third call, kept as the form of the next (a new
# change that waits for a GPU rewrites the variants and steps below). Its first call ran the
# README's table on an H200; the second, on an H100, found batch 64 does not fit its 80 GB
# and measured `exact`'s library threshold (now 256); this third, on an H200:
#   new   the default build (CU_BLAS_EXACT=1 from CU_BLAS_EXACT_MIN_T=256 tokens, GDN_NORM_WARPS=8)
#   base  the library of 19a4fbf (before session 26's kernels), old: new with
#         -DCU_BLAS_EXACT=0 -DGDN_NORM_WARPS=1, s128: new with k_split8 and k_silu_mul4 from
#         128 tokens (-DSPLIT8_MIN_T=128 -DSILU4_MIN_T=128): bf16 decode at 64 sequences ran
#         2,157 tok/s against the README's 2,384 before; which change made it slower? (an
#         H200: 64 sequences' KV and state do not fit beside the weights on an H100.)
#         Answer: s128 (2,343 against new's 2,143), now the default
# Prepare here:
#   make -j2 all mmv-bench
#   (base: git worktree add /tmp/b 19a4fbf && make -C /tmp/b -j2 build/libstrand-cuda.so;
#    mkdir -p .gpu/var; cp /tmp/b/build/libstrand-cuda.so .gpu/var/base.so)
#   bench/cuda/variants.sh .gpu/var old "-DCU_BLAS_EXACT=0 -DGDN_NORM_WARPS=1" matmul_bf16.cu.o \
#       cuda_backend.pic.o gdn.cu.o -- s128 "-DSPLIT8_MIN_T=128 -DSILU4_MIN_T=128" matmul_bf16.cu.o \
#       elementwise.cu.o
#   bench/cuda/pack.sh /tmp/c.tar.xz; rm -rf /tmp/st; mkdir -p /tmp/st/var && tar -C /tmp/st -xJf /tmp/c.tar.xz
#   for f in .gpu/var/*.so; do strip -o /tmp/st/var/${f##*/} $f; done
#   tar -C /tmp/st -cf - build var | xz -9 -T2 > .gpu/s27.tar.xz
# Run there (device tool: carry .gpu/s27.tar.xz; CAP: seconds in all). At most 8 files come
# back from the device tool: the logs are kept as one tarball, $OUT/o.tar.xz, with the
# summary printed and in $OUT/summary.txt.
#   [CAP=540] bash bench/cuda/pending.sh [.gpu/s27.tar.xz]
set -u
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/pending}
O=/tmp/pending-o; rm -rf $O; mkdir -p $O $R
PACK=${1:-.gpu/s27.tar.xz}
st=$(date +%s)
el() { echo "$(( $(date +%s) - st ))s"; }
tl() { local left=$((${CAP:-540} - 15 - ($(date +%s) - st))); [ $left -gt 8 ] && timeout $((left < $1 ? left : $1)) "${@:2}"; }
finish() { tar -C $O -cf - . | xz -6 > $R/o.tar.xz; }
trap finish EXIT
exec > >(tee $R/summary.txt) 2>&1
tar xJf "$PACK" && export LD_LIBRARY_PATH=$PWD/build/syslib
lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $O/smi.txt 2>&1
cp build/libstrand-cuda.so var/new.so
use() { cp var/$1.so build/libstrand-cuda.so; }
S=build/strand
B="$S bench --device cuda --synth 27b --dtype bf16"
row() { grep -A8 "^$1" "$2" | awk 'NF >= 2 && $1 ~ /^[0-9]+$/' | tr -s ' ' | paste -sd'|' -; }
echo "start $(el) $(head -2 $O/smi.txt | tail -1)"
# 1. bf16 decode at 32 and 64 sequences: base / old / s128 / new, twice round
for r in 1 2; do
    for v in base old s128 new; do
        use $v
        tl 30 $B --precision bf16 --kv-dtype bf16 --prompts 512 --batches 32,64 --decode-s 1 >$O/d${r}_$v.txt 2>$O/d${r}_$v.err
        echo "b32,b64 $v rc $? $(el): $(row decode $O/d${r}_$v.txt)"
    done
done
# 2. where b64's step goes: base, s128 and new
for v in base s128 new; do
    use $v
    tl 40 $B --precision bf16 --kv-dtype bf16 --prompts 512 --batches 64 --decode-s 1 --op-times >$O/ops_$v.txt 2>$O/ops_$v.err
    echo "ops $v rc $? $(el)"; grep -A13 "decode step at batch 64 " $O/ops_$v.err | head -14
done
# 3. `exact` prefill, the README's lengths, on the new default
use new
tl 40 $B --precision exact --prompts 512,2048,8192 --batches 1 --decode-s 0.3 >$O/pe_new.txt 2>$O/pe_new.err
echo "exact new rc $? $(el): $(row prefill $O/pe_new.txt)"
# 4. the GPU tests on the new default
use new
tl 200 tests/gpu_test.sh > $O/test_gpu.txt 2>&1; echo "test-gpu rc $? $(el): $(grep -c '^ok' $O/test_gpu.txt) ok"
grep '^not ok' $O/test_gpu.txt | cut -c1-400; grep 'step sizes' $O/test_gpu.txt | cut -c1-300
echo "end $(el)"
