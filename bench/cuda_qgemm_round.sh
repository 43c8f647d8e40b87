#!/usr/bin/env bash
# On a GPU machine: the fused q8/q4 prompt GEMM (KILN_CUDA_QGEMM=fused) - its tests, the
# kernel alone against the dequantized tiles + cuBLASLt and bf16 cuBLASLt, then end to end
# against the tile path (KILN_CUDA_QGEMM=dequant; alternating, bench/ab.py) with bf16
# prefill beside it, and q4 batch decode of 16 and 64 sequences (more than 8 token rows:
# the prompt GEMM's path).
#   bench/cuda_qgemm_round.sh BUILD_DIR OUT_DIR
# BUILD_DIR holds tools/kiln/kiln, tests/backends/cuda/cuda_device_test and
# bench/cuda_qgemm_bench (a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
b=$1; out=$2
mkdir -p "$out"
"$b/tests/backends/cuda/cuda_device_test" --gtest_filter='CudaQuant.*' 2>&1 | tee "$out/tests.txt" |
  grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure" || true
"$b/bench/cuda_qgemm_bench" 2>&1 | tee "$out/qgemm_bench.txt"
for cfg in llama-3.1-8b tinyllama-1.1b; do
  for p in 128 512; do
    python3 bench/ab.py --a "KILN_CUDA_QGEMM=dequant" --b "KILN_CUDA_QGEMM=fused" --rounds 3 -- "$b/tools/kiln/kiln" bench --backend cuda \
      --weight-dtype q4 --random-weights "bench/configs/$cfg.json" -p $p -n 4 -r 3 | tee -a "$out/ab_q4.txt"
    "$b/tools/kiln/kiln" bench --backend cuda --weight-dtype bf16 --random-weights "bench/configs/$cfg.json" \
      -p $p -n 4 -r 3 | grep -E "^\| pp" | sed "s/^/$cfg bf16: /" | tee -a "$out/bf16.txt"
  done
  # Batch decode of 16 and 64 sequences: 9+ token rows take the prompt path in every step.
  for bs in 16 64; do
    python3 bench/ab.py --a "KILN_CUDA_QGEMM=dequant" --b "KILN_CUDA_QGEMM=fused" --rounds 3 -- "$b/tools/kiln/kiln" bench --backend cuda \
      --weight-dtype q4 --random-weights "bench/configs/$cfg.json" -p 128 -n 16 -r 3 -b $bs | tee -a "$out/ab_q4_batch.txt"
  done
done
