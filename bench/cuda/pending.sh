#!/usr/bin/env bash
# One device call's measurements, side by side (a GPU machine's time is short and often none
# starts: build and pack here, run this there). Session 28's ninth call, for the next
# session's work: Nsight Compute's per-instruction stall samples (the SASS source page) of
# k_attn_fa in an 8,192-token bf16 prefill, k_gdn_cscan (mmv_bench gdn's 8,192 tokens) and
# k_wgmma_stream in a 64-sequence bf16 decode step, on this build; the pages are kept
# (gc_*.csv), with each kernel's details.
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
use new
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() { # name, kernel regex, skip, command...
    local n=$1 k=$2 sk=$3; shift 3
    tl 100 $NCU --set full -f -o /tmp/$n --kernel-name regex:"$k" --launch-skip $sk --launch-count 1 "$@" > $O/${n}_run.txt 2>&1
    echo "ncu $n rc $? $(el)"
    tl 40 $NCU --import /tmp/$n.ncu-rep --page source --csv --print-source sass > $O/${n}_sass.csv 2>/dev/null
    tl 30 $NCU --import /tmp/$n.ncu-rep --page details > $O/${n}_details.txt 2>&1
    grep -E "^  [a-z_]+|Duration|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|L2 Cache Throughput" $O/${n}_details.txt | cut -c1-140 | head -8
}
prof fa k_attn_fa 3 $B --precision bf16 --kv-dtype bf16 --prompts 8192 --batches 1 --decode-s 0.1
prof cscan k_gdn_cscan 0 build/mmv_bench gdn 1
prof ws k_wgmma_stream 200 $B --precision bf16 --kv-dtype bf16 --prompts 128 --batches 64 --decode-s 0.3
echo "end $(el)"
