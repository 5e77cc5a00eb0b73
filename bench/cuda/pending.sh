#!/usr/bin/env bash
# One device call's measurements, side by side (a GPU machine's time is short and often none
# starts: build and pack here, run this there). Session 28's eighth call: the session's
# four prefill changes (the chunked rule's two kernels, k_attn_fa's exp2, the bf16 MLP's
# intermediates in bf16) against the table's build, for the README: bf16 and MLX bf16
# prefill, twice round:
#   new   this build
#   base  the library of 0a2d33a (the README table's build)
# Prepare here:
#   make -j2 all mmv-bench
#   (base: git worktree add /tmp/b 0a2d33a && make -C /tmp/b -j2 build/libstrand-cuda.so;
#    mkdir -p .gpu/var; cp /tmp/b/build/libstrand-cuda.so .gpu/var/base.so)
#   bench/cuda/pack.sh /tmp/c.tar.xz; rm -rf /tmp/st; mkdir -p /tmp/st/var && tar -C /tmp/st -xJf /tmp/c.tar.xz
#   for f in .gpu/var/*.so; do strip -o /tmp/st/var/${f##*/} $f; done
#   tar -C /tmp/st -cf - build var | xz -9 -T2 > .gpu/s28.tar.xz
# Run there (device tool: carry .gpu/s28.tar.xz; CAP: seconds in all). At most 8 files come
# back from the device tool: the logs are kept as one tarball, $OUT/o.tar.xz, with the
# summary printed and in $OUT/summary.txt.
#   [CAP=540] bash bench/cuda/pending.sh [.gpu/s28.tar.xz]
set -u
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/pending}
O=/tmp/pending-o; rm -rf $O; mkdir -p $O $R
PACK=${1:-.gpu/s28.tar.xz}
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
S=build/strand
B="$S bench --device cuda --synth 27b --dtype bf16"
row() { grep -A8 "^$1" "$2" | awk 'NF >= 2 && $1 ~ /^[0-9]+$/' | tr -s ' ' | paste -sd'|' -; }
echo "start $(el) $(head -2 $O/smi.txt | tail -1)"
cp build/libstrand-cuda.so var/new.so
use() { cp var/$1.so build/libstrand-cuda.so; }
# 1. bf16 prefill (512 / 2,048 / 8,192 tokens) and the MLX 2,048-token prefill: base and new
for r in 1 2; do
    for v in base new; do
        use $v
        tl 40 $B --precision bf16 --kv-dtype bf16 --prompts 512,2048,8192 --batches 1 --decode-s 0.2 >$O/p${r}_$v.txt 2>$O/p${r}_$v.err
        echo "prefill $v rc $? $(el): $(row prefill $O/p${r}_$v.txt)"
        for q in q8 q4; do
            tl 40 $S bench --device cuda --synth 27b --dtype $q --precision bf16 --kv-dtype bf16 --prompts 2048 --batches 1 --decode-s 0.2 >$O/m${r}_${v}_$q.txt 2>$O/m${r}_${v}_$q.err
            echo "MLX $q $v rc $? $(el): $(row prefill $O/m${r}_${v}_$q.txt)"
        done
    done
done
echo "end $(el)"
