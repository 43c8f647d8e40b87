#!/usr/bin/env bash
# kiln bench on the CUDA backend next to HF transformers on the same GPU, in one run:
#   bench/cuda_compare.sh KILN_BINARY CONFIG [extra kiln bench args]
# The baseline (bench/cuda_hf_baseline.py) first prints the run's ceilings (d2d copy,
# bf16 GEMM). Both use random weights in bf16, prompt 128, 32 decode steps by default;
# -p / -n / -r / -b given here set both.
set -euo pipefail
kiln=$1; config=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
echo "== kiln ($config)"
"$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$config" "$@"
# The shape flags (-p, -n, -r, -b and their long forms) go to the baseline too, so both
# measure the same prompt, decode length, repeats and batch.
base=()
while (($#)); do
  case $1 in
    -p|--prompt-len|-n|--gen-len|-r|--repeats|-b|--batch) base+=("$1" "$2"); shift 2 ;;
    *) shift ;;
  esac
done
echo "== HF transformers ($config)"
python3 "$here/cuda_hf_baseline.py" --config "$config" --ceilings "${base[@]}"
