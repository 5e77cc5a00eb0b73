#!/usr/bin/env bash
# One device call's measurements, side by side (a GPU machine's time is short and often none
# starts: build and pack here, run this there). Waiting for the next session (written in
# sessions 28 and 29, not yet run: session 29 was lent no device):
#   new   the default build
#   c64   -DGC_COLS=64 (gdn_chunk.cu.o): the chunked rule's scan on 64 state columns a block
#         (96 blocks of one an SM for an 8,192-token prompt, each chunk's W, q, k and P read by
#         half as many blocks, the next chunk's W, q and g copied in during this one's phases B
#         and C into a second X and Y) against 32 (192 blocks, two an SM);
#         build/mmv_bench_c64 the same for mmv_bench gdn, whose check against the per-step rule
#         must pass
#   fw    -DCU_ATTN_FW=1 (attention.cu.o): `bf16` prompts' attention on wgmma (k_attn_fw,
#         attention_wgmma.cu) instead of mma.sync (k_attn_fa); mmv_bench fa checks it against
#         k_attn_fa and `exact` and times both; build/mmv_bench_vswap has V's descriptor offsets
#         swapped (-DFW_V_LBO=512 -DFW_V_SBO=4096), run where the first disagrees
#   both  the two options together: make test-gpu runs on it
# Prepare here:
#   make -j2 all mmv-bench; the Makefile's mmv_bench line with -DGC_COLS=64 -o build/mmv_bench_c64
#   and with -DFW_V_LBO=512 -DFW_V_SBO=4096 -o build/mmv_bench_vswap
#   rm -rf .gpu/var; bench/cuda/variants.sh .gpu/var c64 "-DGC_COLS=64" gdn_chunk.cu.o \
#       -- fw "-DCU_ATTN_FW=1" attention.cu.o -- both "-DGC_COLS=64 -DCU_ATTN_FW=1" gdn_chunk.cu.o attention.cu.o
#   bench/cuda/pack.sh /tmp/c.tar.xz; rm -rf /tmp/st; mkdir -p /tmp/st/var && tar -C /tmp/st -xJf /tmp/c.tar.xz
#   strip -o /tmp/st/build/mmv_bench_c64 build/mmv_bench_c64; the same for mmv_bench_vswap
#   for f in .gpu/var/*.so; do strip -o /tmp/st/var/${f##*/} $f; done
#   tar -C /tmp/st -cf - build var | xz -9 -T2 > .gpu/s30.tar.xz
# Run there (device tool: carry .gpu/s30.tar.xz; CAP: seconds in all). At most 8 files come
# back from the device tool: the logs are kept as one tarball, $OUT/o.tar.xz, with the
# summary printed and in $OUT/summary.txt.
#   [CAP=560] [PARTS=1234] bash bench/cuda/pending.sh [.gpu/s30.tar.xz]
# PARTS: which of the numbered steps below run (all four take about 650 s: two calls, e.g.
# PARTS=123 then PARTS=4)
set -u
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/pending}
O=/tmp/pending-o; rm -rf $O; mkdir -p $O $R
PACK=${1:-.gpu/s30.tar.xz}
st=$(date +%s)
el() { echo "$(( $(date +%s) - st ))s"; }
tl() { local left=$((${CAP:-560} - 15 - ($(date +%s) - st))); [ $left -gt 8 ] && timeout $((left < $1 ? left : $1)) "${@:2}"; }
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
part() { case ${PARTS:-1234} in *$1*) return 0 ;; esac; return 1; }
# 1. the rule's kernels: agreement with the per-step rule, and times, on 32 and 64 columns
part 1 && for v in mmv_bench mmv_bench_c64; do
    tl 60 build/$v gdn 10 > $O/gdn_$v.txt 2>&1; echo "$v gdn rc $? $(el)"
    grep -E "^gdn|alone:" $O/gdn_$v.txt | head -8 | cut -c1-250; tail -1 $O/gdn_$v.txt
done
# 2. the prompt's attention: k_attn_fw against k_attn_fa (and `exact`)
if part 2; then
    tl 60 build/mmv_bench fa 10 > $O/fa.txt 2>&1; echo "mmv_bench fa rc $? $(el)"
    grep -E "^fa" $O/fa.txt | cut -c1-400
    if ! grep -q "^fa: k_attn_fw agrees" $O/fa.txt; then
        tl 60 build/mmv_bench_vswap fa 3 > $O/fa_vswap.txt 2>&1; echo "mmv_bench_vswap fa rc $? $(el)"
        grep -E "^fa" $O/fa_vswap.txt | cut -c1-400
    fi
fi
# 3. bf16 prefill, new, c64 and fw, twice round
part 3 && for r in 1 2; do
    for v in new c64 fw; do
        use $v
        tl 40 $B --precision bf16 --kv-dtype bf16 --prompts 512,2048,8192 --batches 1 --decode-s 0.2 >$O/p${r}_$v.txt 2>$O/p${r}_$v.err
        echo "prefill $v rc $? $(el): $(row prefill $O/p${r}_$v.txt)"
    done
done
# 4. the GPU tests on both options together (their bf16 checks take the chunked rule and k_attn_fw)
if part 4; then
    use both
    tl 230 tests/gpu_test.sh > $O/test_gpu.txt 2>&1; echo "test-gpu (both) rc $? $(el): $(grep -c '^ok' $O/test_gpu.txt) ok"
    grep '^not ok' $O/test_gpu.txt | cut -c1-400
fi
echo "end $(el)"
