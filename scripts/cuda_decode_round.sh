#!/usr/bin/env bash
# One device round for the CUDA decode work, from carried binaries (no build on the GPU
# machine): GPU tests, then kiln bench per config (CUDA graphs + GEMV on; for the 1B
# shapes also graphs off), per-step device vs host time, the run's ceilings, and with
# HF=1 the HF eager baseline. Logs go to $1.
#   scripts/cuda_decode_round.sh OUT_DIR [BIN_DIR=.devcarry/bin]
set -uo pipefail
out=$1; bin=${2:-.devcarry/bin}
cfgs=.devcarry/bench
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
echo "== tests" | tee "$out/tests.log"
timeout 150 "$bin/cuda_ops_test" --gtest_brief=1 2>&1 | tail -15 | tee -a "$out/tests.log"
timeout 150 "$bin/cuda_models_test" --gtest_brief=1 2>&1 | grep -E "graphs and eager|FAIL|PASS|OK|tests ran" | tee -a "$out/tests.log"
bench() {  # name config [env...] [-- kiln args...]
  local name=$1 cfg=$2; shift 2
  local envs=() args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift && args=("$@")
  echo "== kiln $name" | tee -a "$out/bench.log"
  env "${envs[@]}" timeout 100 "$bin/kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$cfg" -r 3 "${args[@]}" 2>&1 \
    | grep -E "^\||model:|error|Error" | tee -a "$out/bench.log"
}
for c in gpt2-small tinyllama-1.1b llama-3.2-1b; do bench "$c" "$cfgs/$c.json"; done
# Device time of a decode step (kernels only) vs host time in the backend's run().
for c in gpt2-small tinyllama-1.1b; do
  echo "== kiln $c step times" | tee -a "$out/bench.log"
  KILN_LOG=info KILN_CUDA_STEP_TIMES=1 timeout 100 "$bin/kiln" bench --backend cuda --weight-dtype bf16 \
    --random-weights "$cfgs/$c.json" -r 1 2>&1 | grep -E "decode steps|tg32" | tee -a "$out/bench.log"
done
# Per-op device time of a decode step (KILN_CUDA_PROFILE: eager launches queued behind a
# spin kernel, CUDA events between nodes).
for c in gpt2-small tinyllama-1.1b; do
  echo "== kiln $c profile" | tee -a "$out/bench.log"
  KILN_LOG=info KILN_CUDA_PROFILE=1 timeout 100 "$bin/kiln" bench --backend cuda --weight-dtype bf16 \
    --random-weights "$cfgs/$c.json" -r 1 2>&1 | grep -A40 "profile of .* decode" | grep -E "^ |profile" \
    | tee -a "$out/bench.log"
done
bench "tinyllama-1.1b batch 4" "$cfgs/tinyllama-1.1b.json" -- -b 4
bench "tinyllama-1.1b graphs=0" "$cfgs/tinyllama-1.1b.json" KILN_CUDA_GRAPHS=0
echo "== ceilings" | tee -a "$out/bench.log"
PYTHONUNBUFFERED=1 timeout 60 python3 -c "import sys; sys.path.insert(0, '$cfgs'); import cuda_hf_baseline as b; \
print('d2d copy GB/s, bf16 GEMM TFLOP/s:', b.ceilings())" 2>&1 | tail -1 | tee -a "$out/bench.log"
if [ "${HF:-0}" = 1 ]; then
  for c in gpt2-small tinyllama-1.1b; do
    echo "== HF $c" | tee -a "$out/bench.log"
    PYTHONUNBUFFERED=1 timeout 120 python3 "$cfgs/cuda_hf_baseline.py" --config "$cfgs/$c.json" --ceilings -r 3 2>&1 \
      | grep -vE "Warning|warn|deprecated" | tail -6 | tee -a "$out/bench.log"
  done
fi
