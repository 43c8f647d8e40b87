#!/usr/bin/env bash
# kiln's tokenizer vs HuggingFace `tokenizers` on the same multi-megabyte mixed text,
# same model, one run. Needs `pip install tokenizers transformers gguf` for the baseline.
#   bench/tokenizer_compare.sh [model] [megabytes]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-.cache/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
mb=${2:-4}
corpus=$(mktemp --suffix=.txt)
trap 'rm -f "$corpus"' EXIT
# A deterministic mix of the golden corpus's texts (English, CJK, emoji, code, numbers,
# whitespace runs), shuffled and repeated to the requested size.
python3 - "$corpus" "$mb" <<'PY'
import json, random, sys
texts = [t["text"] for t in json.load(open("tests/fixtures/tokenizer/smollm2_golden.json"))["cases"]]
rng = random.Random(0)
out, size = [], 0
while size < float(sys.argv[2]) * 1e6:
    line = " ".join(rng.choice(texts) for _ in range(4)).replace("\n", " ")
    out.append(line); size += len(line.encode()) + 1
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(out))
PY
echo "model $model, $(wc -c <"$corpus") bytes, $(date -u +%F), commit $(git rev-parse --short HEAD)"
./build/bench/tokenizer_bench "$model" "$corpus" 3
python3 bench/tokenizer_hf_baseline.py "$model" "$corpus" 3
