#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` (the baseline of bench/llamacpp_round.sh) and its tools from the
# llama.cpp sources that PyPI's llama-cpp-python sdist vendors (pinned below; PyPI is the
# only registry kiln's machines reach). CPU: native SIMD, static. CUDA (`cuda` argument):
# sm_90a only, flash attention on, statically linked ggml, dynamic CUDA libraries.
#   bench/llamacpp_build.sh [cpu|cuda] [SDIST | LLAMA_CPP_DIR]  -> .cache/llamacpp/<kind>/llama-bench
# (a GPU machine without PyPI access takes the llama.cpp tree as a directory.)
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-cpu}
version=0.3.36
src=.cache/llamacpp/src-$version
llama=$src/vendor/llama.cpp
if [ -d "${2:-}" ]; then
  llama=$2
elif [ ! -f "$llama/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  sdist=${2:-}
  if [ -z "$sdist" ]; then
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp"
    sdist=$(ls "$tmp"/llama_cpp_python-"$version".tar.gz)
  fi
  mkdir -p "$src"
  tar xzf "$sdist" -C "$src" --strip-components=1
fi
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
      -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF)
case "$kind" in
  cpu) args+=(-DGGML_NATIVE=ON) ;;
  cuda) args+=(-DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DGGML_CUDA_NCCL=OFF) ;;
  *) echo "llamacpp_build.sh: '$kind': expected cpu or cuda" >&2; exit 2 ;;
esac
build=.cache/llamacpp/build-$kind
cmake -S "$llama" -B "$build" "${args[@]}" >/dev/null
# llama-quantize writes the K-quant mixes (Q4_K_M, ...) bench/llamacpp_round.sh compares on,
# llama-perplexity measures what running a file costs llama.cpp (its --kl-divergence);
# llama-embedding runs BERT-family GGUFs in batches (bench/llamacpp_embed_round.sh).
cmake --build "$build" -j "$(nproc)" --target llama-bench llama-quantize llama-perplexity llama-embedding
mkdir -p ".cache/llamacpp/$kind"
cp "$build/bin/llama-bench" "$build/bin/llama-quantize" "$build/bin/llama-perplexity" "$build/bin/llama-embedding" ".cache/llamacpp/$kind/"
echo "llama-bench, llama-quantize, llama-perplexity, llama-embedding ($kind, llama-cpp-python $version's llama.cpp) in .cache/llamacpp/$kind" >&2
