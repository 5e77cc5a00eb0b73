#!/usr/bin/env bash
# The GPU measurements that code on main waits for, in one device call (a GPU machine's time
# is short and often none starts: build and pack here, run this there). What is pending now
# (session 26, 2026-12-05; none of it has run on a GPU yet):
#   x1  -DCU_BLAS_EXACT=1: `exact` products of 1,024 tokens or more on cuBLASLt as three bf16
#       parts (correct? tiny-fortune's step-size check; faster? the 8,192-token prefill)
#   n8  -DGDN_NORM_WARPS=8: the GDN norms 8 warps a block around the chunked rule
#   u4  -DMMV16_U=4: k_mmv's steps in flight at 9-16 tokens (batch-16 decode)
#   new the default build (k_split8, k_silu_mul4, k_attn_fa's conditional rescale, cprep's
#       beta e^g: the same bits, speed unmeasured) against base, the library of 19a4fbf
# Prepare here:
#   make -j2 all mmv-bench
#   bench/cuda/variants.sh .gpu/var x1 "-DCU_BLAS_EXACT=1" matmul_bf16.cu.o cuda_backend.pic.o \
#       -- n8 "-DGDN_NORM_WARPS=8" gdn.cu.o -- u4 "-DMMV16_U=4" matmul_bf16.cu.o
#   (base: git worktree add /tmp/b 19a4fbf && make -C /tmp/b -j2 build/libstrand-cuda.so;
#    cp /tmp/b/build/libstrand-cuda.so .gpu/var/base.so)
#   bench/cuda/pack.sh /tmp/c.tar.xz; mkdir -p /tmp/st/var && tar -C /tmp/st -xJf /tmp/c.tar.xz
#   for f in .gpu/var/*.so; do strip -o /tmp/st/var/${f##*/} $f; done
#   tar -C /tmp/st -cf - build var | xz -9 -T2 > .gpu/s26.tar.xz
# Run there (device tool: carry .gpu/s26.tar.xz; logs under $OUT/o; CAP: seconds in all):
#   [CAP=570] bash bench/cuda/pending.sh [.gpu/s26.tar.xz]
set -u
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/pending}/o; mkdir -p $O
PACK=${1:-.gpu/s26.tar.xz}
st=$(date +%s)
el() { echo "$(( $(date +%s) - st ))s"; }
tl() { local left=$((${CAP:-570} - ($(date +%s) - st))); [ $left -gt 8 ] && timeout $((left < $1 ? left : $1)) "${@:2}"; }
tar xJf "$PACK" && export LD_LIBRARY_PATH=$PWD/build/syslib
lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $O/smi.txt 2>&1
cp build/libstrand-cuda.so var/new.so
use() { cp var/$1.so build/libstrand-cuda.so; }
S=build/strand
B="$S bench --device cuda --synth 27b --dtype bf16"
echo "start $(el) $(head -2 $O/smi.txt | tail -1)"
# 1. x1: exact over step sizes on cuBLASLt (tiny-fortune 2,048 tokens: one step against 256s)
use x1
FT=models/tiny-fortune
xids=$($S tokenize -m $FT --text-file $FT/heldout.txt 2>/dev/null | tr ' ' '\n' | head -2048 | paste -sd, -)
tl 60 $S logits --device cuda --precision exact -m $FT --ids "$xids" --all --chunk 2048 -o $O/x2048.bin 2>$O/x1err.txt
tl 60 $S logits --device cuda --precision exact -m $FT --ids "$xids" --all --chunk 256 -o $O/x256.bin 2>>$O/x1err.txt
cmp -s $O/x2048.bin $O/x256.bin && echo "x1 step sizes: SAME BITS" || echo "x1 step sizes: differ (compare offline)"
grep -o 'products of [0-9]* tokens or more on [^;]*' $O/x1err.txt | head -1
paste <(od -An -v -f -w4 $O/x2048.bin) <(od -An -v -f -w4 $O/x256.bin) |
    awk -v V=4160 'function row() { if (ia != ib) fl++ }
        { i = (NR - 1) % V
          if (i == 0) { if (NR > 1) row(); ma = $1; ia = 0; mb = $2; ib = 0 }
          else { if ($1 > ma) { ma = $1; ia = i } if ($2 > mb) { mb = $2; ib = i } }
          d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $1 < 0 ? -$1 : $1; if (a > s) s = a; k++ }
        END { row(); printf "x1 step sizes: %d rows, %d flips, max diff / max %.3g\n", k / V, fl, s ? m / s : -1 }'
rm -f $O/x2048.bin $O/x256.bin
# 3. exact: 8,192-token prefill, new / x1
for v in new x1; do
    use $v
    tl 90 $B --precision exact --prompts 8192 --batches 1 --decode-s 0.5 >$O/exact_$v.txt 2>$O/exact_$v.err
    echo "exact $v rc $? $(el): $(grep -A1 '^prefill' $O/exact_$v.txt | tail -1 | tr -s ' ')"
done
# 2. bf16: 8,192-token prefill and 16 sequences' decode, base / new / n8 / u4
for v in base new n8 u4; do
    use $v
    tl 80 $B --precision bf16 --kv-dtype bf16 --prompts 8192 --batches 16 --decode-s 1 >$O/bf16_$v.txt 2>$O/bf16_$v.err
    echo "bf16 $v rc $? $(el): $(grep -A1 '^prefill' $O/bf16_$v.txt | tail -1 | tr -s ' ') | $(grep -A1 '^decode' $O/bf16_$v.txt | tail -1 | tr -s ' ')"
done
# 3b. the library's three-part products against k_gemm's
tl 90 build/mmv_bench blas 3 2048 > $O/blas.txt 2>&1; echo "mmv_bench blas rc $? $(el)"; grep -i "exact\|FAIL\|differ" $O/blas.txt | head -20
# 4. the GPU tests on the new default
use new
tl 220 tests/gpu_test.sh > $O/test_gpu.txt 2>&1; echo "test-gpu rc $? $(el)"; grep -c '^ok' $O/test_gpu.txt; grep '^not ok' $O/test_gpu.txt | cut -c1-400
# 5. where the time goes now (bf16 8,192, b16)
tl 80 $B --precision bf16 --kv-dtype bf16 --prompts 8192 --batches 1,16,64 --decode-s 1 --op-times >$O/ops_new.txt 2>$O/ops_new.err; echo "ops rc $? $(el)"
grep -A16 'device time of the 8192' $O/ops_new.err | head -18
tl 60 $S bench --device cuda --synth 27b --dtype q4 --precision bf16 --kv-dtype bf16 --prompts 512 --batches 1 --decode-s 1 --op-times >$O/ops_q4.txt 2>$O/ops_q4.err; echo "ops q4 rc $? $(el)"
grep -A16 'decode step at batch 1 ' $O/ops_q4.err | head -18
# 6a. k_gemm's shapes and class splits at 9 and 16 tokens beside the backend's (k_mmv / k_mmvp)
tl 60 build/mmv_bench sweep 5 9,16 > $O/sweep16.txt 2>&1; echo "sweep rc $? $(el)"; cat $O/sweep16.txt | head -30
# 6. the product kernels at 1-16 tokens (mmvp 4 22/22 beside the backend's)
tl 200 build/mmv_bench 5 > $O/mmv.txt 2>&1; echo "mmv rc $? $(el)"; grep -A12 "^T=\|summed\|ms" $O/mmv.txt | tail -20
cat $O/bf16_new.txt | head -30
# 7. Nsight Compute on the decode kernels (what remains of the time)
tl 200 bench/cuda/gpu_session.sh $O/prof prof > $O/prof.txt 2>&1; echo "prof rc $? $(el)"; cat $O/prof.txt | head -20
