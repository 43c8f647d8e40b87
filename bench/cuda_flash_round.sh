#!/usr/bin/env bash
# Prefill attention on the CUDA backend, the tensor-core (flash) kernel against the tile
# kernel (KILN_CUDA_FLASH=0), in one device round:
#   bench/cuda_flash_round.sh BUILD_DIR [prompt_len ...]   (default 2048)
# First the attention conformance tests (CPU reference; the tensor-core ones force the
# flash kernel) and the plan test, then cuda_attention_bench (attention alone, both
# kernels, outputs compared), then for Llama-3.1-8B (random bf16 weights) at each prompt
# length the per-op device profile (KILN_CUDA_PROFILE=1: the Attention line) and the plain
# prefill / decode times (kiln bench, 3 repeats) with the flash kernel (automatic) and
# without it.
set -euo pipefail
build=$1
shift
lens=("$@")
[ ${#lens[@]} -gt 0 ] || lens=(2048)
kiln=$build/tools/kiln/kiln
here=$(cd "$(dirname "$0")" && pwd)
"$build/tests/backends/cuda/cuda_ops_test" --gtest_filter='CudaAttention*' | grep -E '^\[|FAIL' || true
"$build/bench/cuda_attention_bench"
for p in "${lens[@]}"; do
  for flash in "" 0; do
    export KILN_CUDA_FLASH=$flash
    echo "== llama-3.1-8b -p $p KILN_CUDA_FLASH=${flash:-auto}"
    KILN_LOG=info KILN_CUDA_PROFILE=1 "$kiln" bench --backend cuda --weight-dtype bf16 --random-weights \
      "$here/configs/llama-3.1-8b.json" -p "$p" -n 4 -r 1 2>&1
    "$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$here/configs/llama-3.1-8b.json" -p "$p" -n 4 -r 3
  done
done
unset KILN_CUDA_FLASH
