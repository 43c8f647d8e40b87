#!/usr/bin/env bash
# Decode attention on the CUDA backend, today's kernels against the grouped-query decode
# kernel and its fused form, in one device round:
#   bench/cuda_attn_round.sh BUILD_DIR ["config batch" ...]
# First the attention conformance tests (CPU reference), then for each shape and batch
# the per-op device profile (KILN_CUDA_PROFILE=1: the Attention line, and qkv_prep's
# time inside it for the unfused settings) and the plain step time, under
# KILN_CUDA_ATTN=old (decode / tile kernels + combine), =unfused (grouped kernel,
# qkv_prep and combine as separate launches) and unset (one fused kernel).
# The plain step time runs for old and fused only. Default runs: GPT-2 small and
# TinyLlama at batch 1, Llama-3.2-1B at batch 64 and 256. The KV bytes a step reads:
# 2 * batch * context * kv_heads * head_dim * 2 bytes * layers.
set -euo pipefail
build=$1
shift
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=("gpt2-small.json 1" "tinyllama-1.1b.json 1" "llama-3.2-1b.json 64" "llama-3.2-1b.json 256")
kiln=$build/tools/kiln/kiln
here=$(cd "$(dirname "$0")" && pwd)
"$build/tests/backends/cuda/cuda_ops_test" --gtest_filter='CudaAttention.*' | grep -E '^\[|FAIL' || true
for run in "${runs[@]}"; do
  set -- $run
  for attn in old unfused fused; do
    if [ "$attn" = fused ]; then unset KILN_CUDA_ATTN; else export KILN_CUDA_ATTN=$attn; fi
    echo "== $1 batch $2 KILN_CUDA_ATTN=$attn"
    KILN_LOG=info KILN_CUDA_PROFILE=1 "$kiln" bench --backend cuda --weight-dtype bf16 --random-weights \
      "$here/configs/$1" -r 1 -b "$2" 2>&1
    [ "$attn" = unfused ] || "$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$here/configs/$1" -r 3 -b "$2"
  done
done
unset KILN_CUDA_ATTN
