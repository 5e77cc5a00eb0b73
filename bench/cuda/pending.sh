#!/usr/bin/env bash
# One device call's measurements, side by side (a GPU machine's time is short and often none
# starts: build and pack here, run this there). Session 28's seventh call: the `bf16` MLP of
# 1,024 tokens or more with its intermediates in bf16 (gate and up on cuBLASLt with bf16
# outputs, SwiGLU into bf16 h, the down product on h as it is: cu_mlp_gate_up_bf16,
# cu_matmul_bf16_in) only where the model says the SwiGLU's outputs go to the down product
# alone (ST_SWIGLU_TO_NEXT: the op conformance test's plain SwiGLU read them in fp32 in the
# sixth call), besides the session's rule and attention changes:
#   new   this build
#   base  the library of 0a2d33a (before the session's prefill changes)
# On an H200 also the README's prefill rows (bf16 and the MLX 2,048-token prefill).
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
# 2. bf16 prefill: base and new, twice round
for r in 1; do
    for v in base new; do
        use $v
        tl 40 $B --precision bf16 --kv-dtype bf16 --prompts 512,2048,8192 --batches 1 --decode-s 0.2 >$O/p${r}_$v.txt 2>$O/p${r}_$v.err
        echo "prefill $v rc $? $(el): $(row prefill $O/p${r}_$v.txt)"
    done
done
use new
# 3. on an H200: the README's MLX prefill rows
if grep -q H200 $O/smi.txt; then
    for q in q8 q4; do
        tl 50 $S bench --device cuda --synth 27b --dtype $q --precision bf16 --kv-dtype bf16 --prompts 2048 --batches 1 --decode-s 0.3 >$O/m_$q.txt 2>$O/m_$q.err
        echo "MLX $q rc $? $(el): $(row prefill $O/m_$q.txt)"
    done
fi
# 4. where the new 8,192-token prefill goes
tl 45 $B --precision bf16 --kv-dtype bf16 --prompts 8192 --batches 1 --decode-s 0.2 --op-times >$O/ops.txt 2>$O/ops.err
echo "ops rc $? $(el)"; grep -A14 "device time of the" $O/ops.err | head -15
# 5. the GPU tests on new
tl 230 tests/gpu_test.sh > $O/test_gpu.txt 2>&1; echo "test-gpu rc $? $(el): $(grep -c '^ok' $O/test_gpu.txt) ok"
grep '^not ok' $O/test_gpu.txt | cut -c1-400; grep -i "perplexity" $O/test_gpu.txt | head -5 | cut -c1-300
echo "end $(el)"
