#!/usr/bin/env bash
# On a GPU machine, within one 10-minute device call: the dp4a q8/q4 GEMV's tests, the
# opt-in L2 prefetch (KILN_CUDA_QGEMV_L2_PREFETCH=1, session 57: built, not yet run) alone
# in the launch sweep and end to end (alternating, bench/ab.py), issue 7's ratio (8B bf16
# against q4 batch-1 decode, paired), and, with the time left, the 8B's decode attention at
# 4 splits against the plan's 8 (contexts 513-576).
#   bench/cuda_qgemv_round.sh BUILD_DIR OUT_DIR
# BUILD_DIR holds tools/kiln/kiln, tests/backends/cuda/cuda_device_test and
# bench/cuda_gemv_bench (a CUDA build). Each step has its own time limit; a step cut short
# leaves what it printed in OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
b=$1; out=$2
mkdir -p "$out"
kiln=$b/tools/kiln/kiln
timeout 120 "$b/tests/backends/cuda/cuda_device_test" --gtest_filter='CudaQuant.*:*Dp4a*' > "$out/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED" "$out/tests.txt"
timeout 90 "$b/bench/cuda_gemv_bench" qgemv 8B > "$out/sweep.txt" 2>&1
grep -E "q4 \| 1 \| 1 \| 4, outs 2, chunks 2|default:" "$out/sweep.txt" | grep "| q4 |"
ab() {  # file, B setting, config, weight dtype, prompt, rounds, time limit
  timeout "$7" python3 bench/ab.py --a "" --b "$2" --rounds "$6" -- "$kiln" bench --backend cuda \
    --weight-dtype "$4" --random-weights "bench/configs/$3.json" -p "$5" -n 64 -r 2 > "$out/$1.txt" 2>&1
  echo "$1: $(tail -1 "$out/$1.txt")"
}
ab l2_8b_q4 KILN_CUDA_QGEMV_L2_PREFETCH=1 llama-3.1-8b q4 512 2 110
ab l2_tiny_q4 KILN_CUDA_QGEMV_L2_PREFETCH=1 tinyllama-1.1b q4 128 3 70
ab l2_1b_q4 KILN_CUDA_QGEMV_L2_PREFETCH=1 llama-3.2-1b q4 128 3 60
timeout 130 python3 bench/ab.py --a "" --b "" --a-args="--weight-dtype bf16" --b-args="--weight-dtype q4" --rounds 2 -- \
  "$kiln" bench --backend cuda --random-weights bench/configs/llama-3.1-8b.json -p 512 -n 64 -r 2 > "$out/ratio.txt" 2>&1
echo "issue 7 ratio (A bf16, B q4): $(tail -1 "$out/ratio.txt")"
ab split4_8b_q4 KILN_CUDA_DECODE_SPLITS=4 llama-3.1-8b q4 512 2 100
