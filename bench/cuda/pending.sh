#!/usr/bin/env bash
# One device call's measurements (a GPU machine's time is short and often none starts: build
# and pack here, run this there). Session 30's third call, on the build that makes k_attn_fw
# the `bf16` prompts' attention (session 29's GC_COLS=64 scan measured slower and is gone):
#   1. where an 8,192-token `bf16` prefill's time goes now (`strand bench --op-times`)
#   2. Nsight Compute's per-instruction stall samples (the SASS source page) and details of
#      k_attn_fw in that prefill, for the next changes to it (kept as fw_*.csv / .txt)
#   3. `mmv_bench blas` at 8,192 tokens: the library's products alone, with the copy out of
#      the tiled layout, and the copy's own rate (untile GB/s)
# Prepare here:
#   make -j2 all mmv-bench && bench/cuda/pack.sh .gpu/s30c.tar.xz
# Run there (device tool: carry .gpu/s30c.tar.xz; CAP: seconds in all). At most 8 files come
# back from the device tool: the logs are kept as one tarball, $OUT/o.tar.xz, with the
# summary printed and in $OUT/summary.txt.
#   [CAP=400] bash bench/cuda/pending.sh [.gpu/s30c.tar.xz]
set -u
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/pending}
O=/tmp/pending-o; rm -rf $O; mkdir -p $O $R
PACK=${1:-.gpu/s30c.tar.xz}
st=$(date +%s)
el() { echo "$(( $(date +%s) - st ))s"; }
tl() { local left=$((${CAP:-400} - 15 - ($(date +%s) - st))); [ $left -gt 8 ] && timeout $((left < $1 ? left : $1)) "${@:2}"; }
finish() { tar -C $O -cf - . | xz -6 > $R/o.tar.xz; }
trap finish EXIT
exec > >(tee $R/summary.txt) 2>&1
tar xJf "$PACK" && export LD_LIBRARY_PATH=$PWD/build/syslib
lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $O/smi.txt 2>&1
S=build/strand
B="$S bench --device cuda --synth 27b --dtype bf16 --precision bf16 --kv-dtype bf16"
row() { grep -A8 "^$1" "$2" | awk 'NF >= 2 && $1 ~ /^[0-9]+$/' | tr -s ' ' | paste -sd'|' -; }
echo "start $(el) $(head -2 $O/smi.txt | tail -1)"
# 1. the prefill by operation
tl 60 $B --prompts 512,2048,8192 --batches 1 --decode-s 0.2 --op-times >$O/ops.txt 2>$O/ops.err
echo "prefill (op times) rc $? $(el): $(row prefill $O/ops.txt)"
grep -A14 "device time of the 8192-token prefill" $O/ops.err | cut -c1-160
# 2. k_attn_fw under Nsight Compute
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() { # name, kernel regex, skip, command...
    local n=$1 k=$2 sk=$3; shift 3
    tl 120 $NCU --set full -f -o /tmp/$n --kernel-name regex:"$k" --launch-skip $sk --launch-count 1 "$@" > $O/${n}_run.txt 2>&1
    echo "ncu $n rc $? $(el)"
    tl 40 $NCU --import /tmp/$n.ncu-rep --page source --csv --print-source sass > $O/${n}_sass.csv 2>/dev/null
    tl 30 $NCU --import /tmp/$n.ncu-rep --page details > $O/${n}_details.txt 2>&1
    grep -E "^  [a-z_]+|Duration|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Shared Memory Config|Achieved Occ" $O/${n}_details.txt | cut -c1-140 | head -10
}
prof fw k_attn_fw 3 $B --prompts 8192 --batches 1 --decode-s 0.1
# 3. the library's products and the copy out of the tiled layout
tl 90 build/mmv_bench blas 5 8192 > $O/blas.txt 2>&1; echo "mmv_bench blas rc $? $(el)"
grep -E "^(gate|down|gdn|out|attn)" $O/blas.txt | grep bf16 | cut -c1-120
echo "end $(el)"
