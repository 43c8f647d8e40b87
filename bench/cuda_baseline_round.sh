#!/usr/bin/env bash
# kiln vs HF transformers (eager and static cache + torch.compile) decode on one GPU, for
# the configs given, from carried binaries. Logs to $1.
#   bench/cuda_baseline_round.sh OUT_DIR CONFIG... (names under .devcarry/bench, no .json)
# Env: KILN=0 skips kiln, HF_EAGER=0 / HF_COMPILED=0 skip the baselines.
set -uo pipefail
out=$1; shift
bin=.devcarry/bin; cfgs=.devcarry/bench
for c in "$@"; do
  if [ "${KILN:-1}" = 1 ]; then
    echo "== kiln $c" | tee -a "$out/bench.log"
    KILN_LOG=info KILN_CUDA_STEP_TIMES=1 timeout 300 "$bin/kiln" bench --backend cuda --weight-dtype bf16 \
      --random-weights "$cfgs/$c.json" -r 3 2>&1 | grep -E "^\||model:|decode steps|rror" | tee -a "$out/bench.log"
  fi
  if [ "${HF_EAGER:-1}" = 1 ]; then
    echo "== HF eager $c" | tee -a "$out/bench.log"
    PYTHONUNBUFFERED=1 timeout 300 python3 "$cfgs/cuda_hf_baseline.py" --config "$cfgs/$c.json" -r 3 2>&1 \
      | grep -E "^\||baseline|rror" | tee -a "$out/bench.log"
  fi
  if [ "${HF_COMPILED:-1}" = 1 ]; then
    echo "== HF compiled $c" | tee -a "$out/bench.log"
    PYTHONUNBUFFERED=1 timeout 400 python3 "$cfgs/cuda_hf_baseline.py" --config "$cfgs/$c.json" -r 3 --compiled 2>&1 \
      | grep -E "^\||baseline|rror" | tail -8 | tee -a "$out/bench.log"
  fi
done
