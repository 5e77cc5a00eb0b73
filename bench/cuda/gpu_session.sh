#!/usr/bin/env bash
# One GPU machine's measurements in one go (a machine's time is short: build elsewhere, run
# this there): the GPU tests, the wgmma products against k_gemm, and `strand bench` on the
# 27B shape in both precisions with each prefill's device time by operation. Logs go to
# OUTDIR (default bench/out/gpu); a summary is printed last.
#   bench/cuda/gpu_session.sh [OUTDIR] [tests|wg|bench|mlx|blas|tp|vision|long|bw|prof ...]   (default: the first four)
# blas: `mmv_bench blas`, the prefill products on cuBLASLt against the backend's own path;
# tp: tests/test_cuda_tp.c with timestamps, and (with build/mpi from pack.sh --mpi) 2 ranks of
# mpirun on this GPU against one process; vision: the tower's images/s; long: the 0.8B shape's
# 210,668 -> 243,192-token prefix scenario; bw: `mmv_bench bw` (the read ceiling by way of
# reading) and `mmv_bench ws` at 16-64 tokens; prof: Nsight Compute (ncu --set full) on one launch
# of each decode kernel that sets a 27B step's time (the MLX products at one token, the bf16
# one at one and 64 tokens, the decode attention and delta rule at 64 sequences, the logits'
# top of one row), each as
# OUTDIR/ncu_NAME.txt with its instructions' counts and stall samples in ncu_NAME_src.csv.
# Many files: where few come back (the device tool), give an OUTDIR outside the returned
# folder and tar it into that folder.
set -u
cd "$(dirname "$0")/../.."
O=${1:-bench/out/gpu}
shift || true
parts=${*:-tests wg bench mlx}
mkdir -p "$O"
S=build/strand
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >"$O/smi.txt" 2>&1
# cuBLASLt (the prefill products' library, opened at run time): where the loader does not
# find it, the CUDA toolkit's or a Python wheel's copy
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.1[23]'; then
    lt=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1)
    [ -n "$lt" ] && export LD_LIBRARY_PATH=$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if has blas; then
    timeout 300 build/mmv_bench blas 10 >"$O/blas.txt" 2>&1
    cat "$O/blas.txt"
fi
if has wg; then
    timeout 120 build/mmv_bench wg 10 >"$O/wg.txt" 2>&1
    cat "$O/wg.txt"
fi
if has bench; then
    # bf16 as the peers compute (a bf16 KV cache too); exact as the fixtures hold it
    for prec in bf16 exact; do
        kv=f32
        [ $prec = bf16 ] && kv=bf16
        timeout 200 $S bench --device cuda --synth 27b --dtype bf16 --precision $prec --kv-dtype $kv \
            --prompts 512,2048,8192 --batches 1,4,16,32,64 --decode-s 1 --op-times >"$O/bench_$prec.txt" 2>"$O/bench_$prec.err"
        echo "bench 27B bf16 weights, --precision $prec, KV $kv (rc $?):"
        grep -A20 '^prefill' "$O/bench_$prec.txt" | head -24
        grep -A16 'device time of the 8192' "$O/bench_$prec.err"
        grep -A16 'decode step at batch 16 ' "$O/bench_$prec.err"
        grep -A16 'decode step at batch 64' "$O/bench_$prec.err"
    done
fi
if has mlx; then
    timeout 120 build/mmv_bench q 20 >"$O/q.txt" 2>&1
    cat "$O/q.txt"
    for dt in q8 q4; do
        for prec in exact bf16; do
            timeout 150 $S bench --device cuda --synth 27b --dtype $dt --precision $prec --prompts 2048 --batches 1,4,16,64 \
                --decode-s 1 --op-times >"$O/bench_${dt}_$prec.txt" 2>"$O/bench_${dt}_$prec.err"
            echo "bench 27B $dt --precision $prec (rc $?):"
            grep -A12 '^prefill' "$O/bench_${dt}_$prec.txt" | head -14
            grep -A16 'decode step at batch 1 ' "$O/bench_${dt}_$prec.err"
        done
    done
fi
if has tp; then
    NCCL_DEBUG=WARN timeout 240 build/tests/test_cuda_tp 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done >"$O/tp.txt"
    cat "$O/tp.txt"
    if [ -f build/mpi/env.sh ]; then
        a=$($S generate --device cuda -m tests/data/fixtures/tiny-b --ids 1,2,3,4,5 -n 16 2>/dev/null)
        b=$(. build/mpi/env.sh && timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x STRAND_CUDA_DEVICE=0 \
            -x STRAND_NCCL=0 -x LD_LIBRARY_PATH $S generate --device cuda -m tests/data/fixtures/tiny-b --ids 1,2,3,4,5 \
            -n 16 2>"$O/mpirun_tp.err")
        echo "mpirun -np 2, CUDA shards on one GPU: '$b' (one process: '$a')"
        tail -5 "$O/mpirun_tp.err"
    fi
fi
if has vision; then
    timeout 100 $S synth --preset tiny --vision-full --tokenizer tests/data/tokenizers/qwen3 -o /tmp/tvf >/dev/null 2>&1
    timeout 100 $S bench --device cuda -m /tmp/tvf --image 1024x768,448x448 --decode-s 3 >"$O/vision.txt" 2>&1
    cat "$O/vision.txt"
fi
if has long; then
    timeout 300 $S bench --device cuda --synth 0.8b --dtype bf16 --precision bf16 --kv-dtype bf16 --prefix --prefix-turns 2 \
        --prefix-long 210668,243192 >"$O/prefix_long.txt" 2>&1
    tail -8 "$O/prefix_long.txt"
fi
if has prof; then
    # name, kernel, launches to skip, command (mmv_bench qprof/prof: one shape as the backend runs it)
    while read -r name kern skip cmd; do
        [ -n "$name" ] || continue
        timeout 120 ncu --clock-control none --set full --import-source no --kernel-name "regex:$kern" \
            --launch-skip "$skip" --launch-count 1 -o "$O/ncu_$name" $cmd >"$O/ncu_$name.log" 2>&1
        ncu -i "$O/ncu_$name.ncu-rep" >"$O/ncu_$name.txt" 2>&1
        ncu -i "$O/ncu_$name.ncu-rep" --page source --csv --print-source sass >"$O/ncu_${name}_src.csv" 2>&1
        rm -f "$O/ncu_$name.ncu-rep"
        echo "ncu $name: $(grep -m1 -E 'Duration' "$O/ncu_$name.txt" | tr -s ' ')," \
            "$(grep -m1 -E 'DRAM Throughput' "$O/ncu_$name.txt" | tr -s ' ')"
    done <<LIST
q4 k_qmvp 20 build/mmv_bench qprof 34816 5120 1 1 4
q8 k_qmvp 10 build/mmv_bench qprof 34816 5120 1 1 8
bf16_t1 k_mmvp 2 build/mmv_bench prof 34816 5120 1 1
bf16_t64 k_wgmma 2 build/mmv_bench prof 34816 5120 64 1
attn_b64 k_attn_split 40 $S bench --device cuda --synth 27b --dtype bf16 --precision bf16 --kv-dtype bf16 --prompts 128 --batches 64 --decode-s 0.3
gdn_b64 k_gdn_dec 40 $S bench --device cuda --synth 27b --dtype bf16 --precision bf16 --kv-dtype bf16 --prompts 128 --batches 64 --decode-s 0.3
top_seg k_top_seg 0 build/mmv_bench top 3
top_merge k_top_merge 0 build/mmv_bench top 3
LIST
fi
if has bw; then
    # the read ceiling by way of reading, and k_wgmma_stream at each unit shape's token counts,
    # full and partial (clusters of two take 65-127)
    timeout 120 build/mmv_bench bw 10 >"$O/bw.txt" 2>&1
    cat "$O/bw.txt"
    timeout 200 build/mmv_bench ws 20 1,8,9,16,17,32,64,65,96,127 >"$O/ws.txt" 2>&1
    tail -30 "$O/ws.txt"
fi
if has tests; then
    timeout 300 tests/gpu_test.sh >"$O/test_gpu.txt" 2>&1
    echo "make test-gpu (rc $?):"
    cat "$O/test_gpu.txt"
fi
