#!/usr/bin/env bash
# kiln bench on the CUDA backend next to HF transformers on the same GPU, in one run:
#   bench/cuda_compare.sh KILN_BINARY CONFIG [extra kiln bench args]
# The baseline (bench/cuda_hf_baseline.py) first prints the run's ceilings (d2d copy,
# bf16 GEMM). Both use random weights in bf16, prompt 128, 32 decode steps by default.
set -euo pipefail
kiln=$1; config=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
echo "== kiln ($config)"
"$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$config" "$@"
echo "== HF transformers ($config)"
python3 "$here/cuda_hf_baseline.py" --config "$config" --ceilings
