#!/usr/bin/env bash
# The main job on a fresh Debian machine: install dependencies, build kiln, fetch a
# real model (SmolLM2-135M-Instruct) and generate text with it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/fetch_models.sh
prompt=${1:-"The capital of France is"}
./build/tools/kiln/kiln generate \
  -m .cache/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
  -p "$prompt" -n 48
