#!/usr/bin/env bash
# On a GPU machine: q4 prefill with device-wide dequantization tiles against L2-sized ones
# (KILN_CUDA_DEQUANT_WIDE=0), alternating (bench/ab.py), bf16 prefill beside it, and the
# load time and host memory of a CUDA model (random weights; a bf16 checkpoint on CUDA
# and on the CPU).
#   bench/cuda_q4_prefill_round.sh KILN OUT_DIR [CONFIG=bench/configs/llama-3.1-8b.json]
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=$1; out=$2; cfg=${3:-bench/configs/llama-3.1-8b.json}
mkdir -p "$out"
python3 bench/ab.py --a "KILN_CUDA_DEQUANT_WIDE=0" --b "" --rounds 2 -- \
  "$kiln" bench --backend cuda --weight-dtype q4 --random-weights "$cfg" -p 512 -n 4 -r 3 | tee "$out/q4_pp512.txt"
python3 bench/ab.py --a "KILN_CUDA_DEQUANT_WIDE=0" --b "" --rounds 1 -- \
  "$kiln" bench --backend cuda --weight-dtype q4 --random-weights "$cfg" -p 2048 -n 4 -r 3 | tee "$out/q4_pp2048.txt"
for p in 512 2048; do
  "$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$cfg" -p $p -n 4 -r 3 | tee -a "$out/bf16.txt"
done
# Load time and host memory once loaded (kiln bench prints both): random weights, and a
# real bf16 checkpoint of the 1B shape written by transformers (read as the file's own
# bytes: ModelOptions::keep_16bit_weights).
"$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$cfg" -p 128 -n 16 -r 1 2>&1 | tee "$out/load_random.txt"
ckpt="$out/llama-1b-bf16"
python3 - "$ckpt" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig.from_json_file("bench/configs/llama-3.2-1b.json")
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
PY
for backend in cuda cpu; do
  "$kiln" bench -m "$ckpt" --backend $backend -p 16 -n 4 -r 1 2>&1 |
    tr '\r' '\n' | grep -v "^loading weights: [0-9]" | tee -a "$out/load_checkpoint.txt"
done
rm -rf "$ckpt"
