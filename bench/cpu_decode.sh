#!/usr/bin/env bash
# One run, both sides: kiln bench and the PyTorch/transformers baseline on the same
# CPU, same shapes (random weights), same thread count. Needs torch + transformers
# (pip install torch transformers) for the baseline half.
#   bench/cpu_decode.sh [config.json] [prompt_len] [gen_len]
set -euo pipefail
cd "$(dirname "$0")/.."
cfg=${1:-bench/configs/gpt2-small.json}
p=${2:-128}
n=${3:-32}
threads=$(nproc)
echo "## $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, commit $(git rev-parse --short HEAD)"
echo
echo "### kiln (f32 weights)"
./build/tools/kiln/kiln --threads "$threads" bench --random-weights "$cfg" -p "$p" -n "$n" 2>/dev/null
echo
echo "### kiln (bf16 weights)"
./build/tools/kiln/kiln --threads "$threads" bench --random-weights "$cfg" -p "$p" -n "$n" --weight-dtype bf16 2>/dev/null | tail -n +5
echo
echo "### PyTorch"
python3 bench/torch_cpu_baseline.py --config "$cfg" -p "$p" -n "$n" --threads "$threads"
