#!/usr/bin/env bash
# One device call's measurements (a GPU machine's time is short and often none starts: build
# and pack here, run this there). Session 36 (on H100s; README has each): attention's bf16
# K and V as stored, kept, and the rule's norms inside k_gdn_decs, not kept (PARTS=8do4
# TV=dnn OB=64 OPV=dnn DB=16,64); the next unit's K and V prefetched into L2 by k_attn_split,
# not kept (PARTS=8d, then L VS="prev new" LP=4096 LB=1,8, then 4). Session 37 (H100s):
# k_attn_ring and the scanning merge, kept (PARTS=A, then 4, then d VS="prev r0 m0 new"
# DB=16,64, L VS="prev r0 new" LP=4096 LB=1,8 and LP=32768 LB=1). Session 43 (H100): two
# blocks an SM for the 64-token stream kernel, not kept (PARTS=dk VS="prev r2 r2f" DB=40,64);
# the prefill's products on k_wgmma against the library (PARTS=0635, then 2 VS="new pp nb0
# nbp"). VS: the libraries to run (default prev, every other var/NAME.so, new); RT:
# seconds a bench run may take. Letter parts: k (a batch-64 step's products and delta rule,
# each kernel alone under Nsight Compute, summed by shape, for each library of VS), s
# (k_wgmma_stream under Nsight Compute in a decode step), a (decode attention's kernels under
# Nsight Compute), r (the rule's decode kernel so), t (the README table's rows),
# w (mmv_bench ws), d (decode side by side at batches $DB), L (the same after long prompts), o (a
# decode step by operation, prev and var/$OPV), g (k_wgmma under Nsight Compute, from
# var/nb.so), b (the library's kernel for the same product), m (MLX batch-1 decode), A
# (mmv_bench ad: a decode step's split attention, k_attn_ring against k_attn_split), q (MLX
# products of few tokens on k_wgmma_qstream, and MLX decode with them). Earlier
# parts, kept for the next changes to their kernels:
#   1. mmv_bench fa: k_attn_fw against k_attn_fa and `exact`, times (the build before:
#      8,192 tokens fa 4.47 ms, fw 3.67)
#   2. the `bf16` prefill side by side: prev (var/prev.so), the pack's other var/NAME.so (builds
#      between them, or variants: bench/cuda/variants.sh) and new
#   3. where an 8,192-token `bf16` prefill's time goes now (`strand bench --op-times`)
#   4. make test-gpu (tests/gpu_test.sh) on new
#   5. Nsight Compute's per-instruction stall samples (the SASS source page) and details of
#      k_attn_fw in that prefill, for the next changes to it (kept as fw_*.csv / .txt)
#   6. `mmv_bench blas` at 8,192 tokens: the library's products alone, with the copy out of
#      the tiled layout, and the copy's own rate (untile GB/s)
#   7. `mmv_bench blastune` at 2,048 and 8,192 tokens: each algorithm the library offers for
#      the 27B's prefill products, timed against its first
# Prepare here:
#   make -j2 all mmv-bench && bench/cuda/pack.sh /tmp/c.tar.xz; rm -rf /tmp/st; mkdir -p /tmp/st/var
#   tar -C /tmp/st -xJf /tmp/c.tar.xz; cp PREV/build/libstrand-cuda.so /tmp/st/var/prev.so (stripped)
#   tar -C /tmp/st -cf - build var | xz -9 -T2 > .gpu/s32y.tar.xz
# Run there (device tool: carry .gpu/s32y.tar.xz; CAP: seconds in all). At most 8 files come
# back from the device tool: the logs are kept as one tarball, $OUT/o.tar.xz, with the
# summary printed and in $OUT/summary.txt.
#   [CAP=500] [PARTS=123456789] bash bench/cuda/pending.sh [.gpu/s32y.tar.xz]
set -u
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/pending}
O=/tmp/pending-o; rm -rf $O; mkdir -p $O $R
PACK=${1:-.gpu/s32y.tar.xz}
st=$(date +%s)
el() { echo "$(( $(date +%s) - st ))s"; }
tl() { local left=$((${CAP:-500} - 15 - ($(date +%s) - st))); [ $left -gt 8 ] && timeout $((left < $1 ? left : $1)) "${@:2}"; }
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
cp build/libstrand-cuda.so var/new.so
use() { cp var/$1.so build/libstrand-cuda.so; }
part() { case ${PARTS:-1234567} in *$1*) return 0 ;; esac; return 1; }
# 0. k_wgmma's forms against k_gemm (mmv_bench wg $WG_ARGS, at most WG_CAP seconds)
if part 0; then
    tl ${WG_CAP:-90} build/mmv_bench wg ${WG_ARGS:-5 1024,2048,8192} > $O/wg.txt 2>&1; echo "mmv_bench wg rc $? $(el)"
    grep -vE "^ *$" $O/wg.txt | cut -c1-200 | tail -22
fi
# 8. the delta rule's kernels alone: per step against chunked (agreement, times)
if part 8; then
    tl 90 build/mmv_bench gdn 10 > $O/gdn.txt 2>&1; echo "mmv_bench gdn rc $? $(el)"
    grep -E "^gdn|alone" $O/gdn.txt | cut -c1-200
fi
# 1. the prompt's attention
if part 1; then
    tl 60 build/mmv_bench fa 10 > $O/fa.txt 2>&1; echo "mmv_bench fa rc $? $(el)"
    grep -E "^fa" $O/fa.txt | cut -c1-400
fi
# A. a decode step's split attention alone: k_attn_ring against k_attn_split (bits, ms, GB/s)
if part A; then
    tl 90 build/mmv_bench ad 10 > $O/ad.txt 2>&1; echo "mmv_bench ad rc $? $(el)"
    grep -E "^ad" $O/ad.txt | cut -c1-220
fi
# 2. bf16 prefill, prev and new, twice round
vs=${VS:-"prev $(cd var && ls *.so | sed 's/\.so$//' | grep -vx 'prev\|new' | tr '\n' ' ')new"} # VS: these alone
# on an H100, the libraries named in H100_SKIP stay out (measured there before)
case "$(cat $O/smi.txt)" in *H100*) for v in ${H100_SKIP:-}; do vs=$(echo " $vs " | sed "s/ $v / /; s/^ //; s/ $//"); done ;; esac
# every library of $vs twice round, in that order: F (the logs' prefix), WHAT, the table to
# show, then the bench's arguments
rounds() {
    local f=$1 what=$2 tab=$3
    shift 3
    for r in 1 2; do
        for v in $vs; do
            use $v
            tl ${RT:-60} $B "$@" >$O/$f${r}_$v.txt 2>$O/$f${r}_$v.err
            echo "$what $v rc $? $(el): $(row $tab $O/$f${r}_$v.txt | cut -d'|' -f1-4)"
        done
    done
    use new
}
part 2 && rounds p prefill prefill --prompts 512,2048,8192 --batches 1 --decode-s 0.2
# w. k_wgmma_stream on clusters of 2 and 4 (the plain remote arrive) against the backend's path
if part w; then
    tl 90 build/mmv_bench ws 10 ${WS_T:-9,16,32,64,96,127} > $O/ws.txt 2>&1; echo "mmv_bench ws rc $? $(el)"
    grep -vE "^ *$" $O/ws.txt | cut -c1-120 | tail -60
fi
# o. a decode step by operation at batch ${OB:-16} (prompts of ${OPP:-128}), for prev and for var/$OPV.so (if named)
if part o; then
    for v in prev ${OPV:-}; do
        use $v
        tl 90 $B --prompts 128 --prompt-len ${OPP:-128} --batches ${OB:-16} --op-times >$O/ops_$v.txt 2>$O/ops_$v.err
        echo "decode (op times) $v rc $? $(el)"
        grep -A14 "device time of a decode step" $O/ops_$v.err | cut -c1-110
    done
    use new
fi
# d. decode side by side (batches $DB, after a 128-token prompt): prev, the other var/NAME.so, new
part d && rounds d decode decode --prompts 128 --batches ${DB:-16,64}
# L. decode after long prompts (${LP:-4096} tokens a sequence, batches ${LB:-1,8}) side by side:
# attention reads every position's K and V each step
part L && rounds l "decode (long)" decode --prompts 512 --prompt-len ${LP:-4096} --batches ${LB:-1,8}
# t. the README table's 27B bf16 rows for new: `exact` and `bf16` (TPREC), prefill 512 / 2,048 / 8,192 and
# decode at batches ${TB:-1,4,16,32,64}
if part t; then
    use new
    for p in ${TPREC:-exact bf16}; do
        kv=; [ $p = bf16 ] && kv="--kv-dtype bf16"
        tl 150 $S bench --device cuda --synth 27b --dtype bf16 --precision $p $kv --prompts ${TP:-512,2048,8192} \
            --batches ${TB:-1,4,16,32,64} >$O/t_$p.txt 2>$O/t_$p.err
        echo "table $p rc $? $(el)"
        grep -E "^(prefill|decode)|floor|^ *[0-9]+ " $O/t_$p.txt | cut -c1-140
    done
fi
# 3. the prefill by operation
if part 3; then
    for v in new ${OPV:-}; do
        use $v
        for p in ${OP_P:-8192}; do
            tl 60 $B --prompts $p --batches 1 --decode-s 0.2 --op-times >$O/ops_${v}_$p.txt 2>$O/ops_${v}_$p.err
            echo "prefill (op times) $v rc $? $(el): $(row prefill $O/ops_${v}_$p.txt)"
            grep -A14 "device time of the $p-token prefill" $O/ops_${v}_$p.err | cut -c1-110
        done
    done
    use new
fi
# m. MLX 8- and 4-bit decode at batch 1 (the kernels' fraction of this device's floor)
if part m; then
    for d in q8 q4; do
        for p in exact bf16; do
            tl 60 $S bench --device cuda --synth 27b --dtype $d --precision $p --prompts 128 --batches ${MB:-1} \
                >$O/m_${d}_$p.txt 2>$O/m_${d}_$p.err
            echo "mlx $d $p rc $? $(el): $(row decode $O/m_${d}_$p.txt)"
        done
    done
fi
# q. MLX products of few tokens in `bf16` on k_wgmma_qstream (mmv_bench qs: against a fp64
# reference, GB/s beside k_qmvp / k_qmv), then MLX ${QD:-q8} decode at batches ${QB:-16,32,64}
# side by side, twice round: new against var/${QV:-qs}.so (e.g. a build with -DCU_QS=0 on
# matmul_q.cu.o: k_qmvp / k_qmv; session 48, H100: b16 875 / 1,016, b64 841 / 2,557 tok/s)
if part q; then
    if [ -z "${QS_SKIP:-}" ]; then # (QS_SKIP: the decode alone)
        tl ${QS_CAP:-150} build/mmv_bench qs ${QS_REPS:-10} ${QS_T:-1,8,16,17,32,64,96,127} > $O/qs.txt 2>&1
        echo "mmv_bench qs rc $? $(el)"
        grep -vE "^ *$" $O/qs.txt | cut -c1-120 | tail -${QS_TAIL:-40}
    fi
    for r in 1 2; do
        for v in new ${QV:-qs}; do
            use $v
            tl 90 $S bench --device cuda --synth 27b --dtype ${QD:-q8} --precision bf16 --kv-dtype bf16 --prompts 128 \
                --batches ${QB:-16,32,64} >$O/q${r}_$v.txt 2>$O/q${r}_$v.err
            echo "mlx ${QD:-q8} decode $v rc $? $(el): $(row decode $O/q${r}_$v.txt)"
        done
    done
    use new
fi
# 4. the GPU tests
if part 4; then
    use ${TV:-new} # (TV: a var/NAME.so to test in place of new)
    tl 150 tests/gpu_test.sh > $O/test_gpu.txt 2>&1; echo "test-gpu ${TV:-new} rc $? $(el): $(grep -c '^ok' $O/test_gpu.txt) ok"
    grep '^not ok' $O/test_gpu.txt | cut -c1-400
    use new
fi
# 5. k_attn_fw under Nsight Compute
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() { # name, kernel regex, skip, command...
    local n=$1 k=$2 sk=$3; shift 3
    tl 120 $NCU --set full -f -o /tmp/$n --kernel-name regex:"$k" --launch-skip $sk --launch-count 1 "$@" > $O/${n}_run.txt 2>&1
    echo "ncu $n rc $? $(el)"
    tl 40 $NCU --import /tmp/$n.ncu-rep --page source --csv --print-source sass > $O/${n}_sass.csv 2>/dev/null
    tl 30 $NCU --import /tmp/$n.ncu-rep --page details > $O/${n}_details.txt 2>&1
    grep -E "^  [a-z_]+|Duration|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occ" $O/${n}_details.txt | cut -c1-140 | head -10
}
part 5 && prof fw k_attn_fw 3 $B --prompts 8192 --batches 1 --decode-s 0.1
# g. k_wgmma (var/nb.so: at every prefill size) under Nsight Compute, a 2,048-token prefill;
# WG_SKIP launches skipped (5: layer 0's gate, after its GDN in-projections' four and out_proj;
# 3 took the 48-row one)
if part g; then
    use nb
    prof wg 'k_wgmma$' ${WG_SKIP:-5} $B --prompts 2048 --batches 1 --decode-s 0.1
    use new
fi
# b. the library's kernel for the same product (new: cuBLASLt from 1,024 tokens; BL_SKIP
# library kernels (sm90, gemm, xmma, nvjet, cutlass in the name) skipped: 5, layer 0's gate as in g)
if part b; then
    prof blas 'sm90|gemm|xmma|nvjet|cutlass' ${BL_SKIP:-5} $B --prompts 2048 --batches 1 --decode-s 0.1
fi
# s. k_wgmma_stream under Nsight Compute in a batch-${OB:-64} decode (SS_SKIP stream launches skipped:
# 2, layer 0's gate/up after its GDN in-projections and out_proj)
if part s; then
    prof ws 'k_wgmma_stream' ${SS_SKIP:-2} $B --prompts 128 --batches ${OB:-64} --decode-s 0.1
    grep -E "Stall|stall|Throughput|Hit Rate|Busy|Bandwidth|Elapsed Cycles|SM Frequency|DRAM Frequency|Theoretical Occ|Waves" \
        $O/ws_details.txt | cut -c1-140 | head -40
fi
# a. a decode step's attention kernels under Nsight Compute (batch ${OB:-64}, prompts of ${OPP:-128}, AT_SKIP launches
# of each skipped: 40, past the warm-up step's 16 (batch 1) and a batch-64 step's; AK: the split kernel's regex,
# k_attn_ring or k_attn_split, whichever runs)
if part a; then
    use ${AV:-new} # (AV: a var/NAME.so in place of new)
    prof atts "${AK:-k_attn_(ring|split)}" ${AT_SKIP:-40} $B --prompts 128 --prompt-len ${OPP:-128} --batches ${OB:-64} --decode-s 0.1
    grep -E "Stall|stall|Throughput|Hit Rate|Busy|Bandwidth|Elapsed Cycles|Theoretical Occ|Achieved Occ|Block Limit" \
        $O/atts_details.txt | cut -c1-140 | head -30
    prof attm k_attn_merge ${AT_SKIP:-40} $B --prompts 128 --prompt-len ${OPP:-128} --batches ${OB:-64} --decode-s 0.1
    use new
fi
# r. the delta rule's decode kernel under Nsight Compute in a batch-${OB:-64} step (RS_SKIP
# launches skipped: the warm-up step's 48 (batch 1, fused), two batch-64 steps' 96, then 5)
if part r; then
    prof gdnd 'k_gdn_dec' ${RS_SKIP:-149} $B --prompts 128 --batches ${OB:-64} --decode-s 0.1
    grep -E "Stall|stall|Throughput|Hit Rate|Busy|Bandwidth|Elapsed Cycles|SM Frequency|DRAM Frequency|Theoretical Occ|Achieved Occ|Waves|Block Limit" \
        $O/gdnd_details.txt | cut -c1-140 | head -40
fi
# 9. the chunked rule's kernels under Nsight Compute (the same prefill as 5)
if part 9; then
    prof cprep k_gdn_cprep 3 $B --prompts 8192 --batches 1 --decode-s 0.1
    prof cscan k_gdn_cscan 3 $B --prompts 8192 --batches 1 --decode-s 0.1
fi
# k. a batch-${OB:-64} decode step's products and delta rule, each kernel alone under Nsight
# Compute (its duration and DRAM bytes; KSKIP launches skipped: the prompts' step and the first
# decode steps), summed by kernel and size for each library of $vs: how far each launch is from
# its bytes at the copy rate (session 42, H100: every k_wgmma_stream launch about 12 us plus its
# bytes at 2.89 TB/s)
if part k; then
    for v in $vs; do
        use $v
        tl 120 $NCU --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
            --kernel-name regex:"${KREGEX:-k_wgmma_stream|k_gdn_dec}" --launch-skip ${KSKIP:-330} --launch-count ${KCOUNT:-330} \
            $B --prompts 128 --batches ${OB:-64} --decode-s 0.2 > $O/k_$v.csv 2>&1
        echo "ncu step $v rc $? $(el)"
        awk -F'","' 'NF > 14 && $1 ~ /^"[0-9]/ { k = $1; n[k] = $5; sub(/\(.*/, "", n[k]); sub(/^void /, "", n[k])
                v = $15; gsub(/[",]/, "", v)
                if ($13 ~ /duration/) t[k] = v / 1e3; else if ($13 ~ /read/) r[k] = v / 1e6; else if ($13 ~ /write/) w[k] = v / 1e6 }
            END { for (k in t) { g = n[k] SUBSEP int(r[k] + 0.5); c[g]++; ts[g] += t[k]; by[g] += r[k] + w[k]; all += t[k] }
                  for (g in c) { split(g, f, SUBSEP)
                      printf "%9.1f us  %-34s %5d MB read x%-3d %8.1f us each %5.0f GB/s\n", ts[g], substr(f[1], 1, 34), f[2], c[g],
                          ts[g] / c[g], by[g] / ts[g] * 1e3 }
                  printf "%9.1f us  all\n", all }' $O/k_$v.csv | sort -n -r | head -12
    done
    use new
fi
# 6. the library's products and the copy out of the tiled layout
if part 6; then
    tl 90 build/mmv_bench blas 5 8192 > $O/blas.txt 2>&1; echo "mmv_bench blas rc $? $(el)"
    grep -E "^(gate|down|gdn|out|attn)" $O/blas.txt | grep bf16 | cut -c1-120
fi
# 7. the library's other algorithms
if part 7; then
    tl 150 build/mmv_bench blastune 5 > $O/blastune.txt 2>&1; echo "mmv_bench blastune rc $? $(el)"
    grep -E "^[a-z]|#0" $O/blastune.txt | cut -c1-140
fi
echo "end $(el)"
