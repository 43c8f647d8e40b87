#!/usr/bin/env bash
# One GPU round for embedding serving: `kiln serve` (CUDA, random weights of an encoder
# shape) loaded by `kiln serve bench --endpoint embeddings` at several concurrencies,
# with the encoder batcher's defaults and with --encoder-max-batch 1 (one sequence per
# forward: requests take turns), then HF transformers' offline batched forward of the
# same input mix, in one run.
#   bench/embed_round.sh KILN CONFIG OUT_DIR [concurrencies...]
# LO/HI: input lengths (default 16-128); DTYPE: bf16 (default) or f16; HF=0: kiln only;
# BACKEND=cpu (with a small config) checks the script itself; KILN_SERVE_ARGS: more
# `kiln serve` flags (e.g. "--encoder-batch-delay-us 500").
set -uo pipefail
kiln=$1 cfg=$2 out=$3; shift 3
conc=("$@"); [ ${#conc[@]} -gt 0 ] || conc=(1 16 64 256)
lo=${LO:-16} hi=${HI:-128} dtype=${DTYPE:-bf16}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
{ grep -m1 "model name" /proc/cpuinfo; echo "host cores: $(nproc)"; } | tee -a "$out/gpu.txt"
port=18778
get() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1" 2>/dev/null; }
vocab=$(python3 -c "import json; print(json.load(open('$cfg'))['vocab_size'])")
for mode in batched one; do
  args=""; [ $mode = one ] && args="--encoder-max-batch 1"
  "$kiln" serve --backend ${BACKEND:-cuda} --weight-dtype $dtype -m model=random:"$cfg" --port $port --http-threads 512 $args \
    ${KILN_SERVE_ARGS:-} 2>"$out/server_$mode.log" &
  srv=$!
  for i in $(seq 600); do get http://127.0.0.1:$port/health/ready >/dev/null && break; sleep 0.5; done
  "$kiln" serve bench --endpoint embeddings --port $port --model model -c 8 --requests 64 --input-min $lo \
    --input-max $hi --vocab "$vocab" >/dev/null 2>&1  # warm-up
  for c in "${conc[@]}"; do
    n=$(( c < 32 ? 1024 : 32 * c ))
    [ $mode = one ] && [ $n -gt 2048 ] && n=2048
    echo "== $mode: kiln serve bench --endpoint embeddings -c $c --requests $n ($lo-$hi tokens)" | tee -a "$out/kiln.log"
    timeout 240 "$kiln" serve bench --endpoint embeddings --port $port --model model -c "$c" --requests $n \
      --input-min $lo --input-max $hi --vocab "$vocab" --json "$out/kiln_${mode}_c$c.json" 2>&1 | tee -a "$out/kiln.log"
    get http://127.0.0.1:$port/metrics | grep -E "^kiln_encoder_((forwards|sequences|tokens|busy_seconds)_total|largest_batch)" \
      | sed "s/^/$mode after c=$c: /" >> "$out/kiln_counters.log"
  done
  kill -TERM $srv; wait $srv
done
[ "${HF:-1}" = 0 ] && exit 0
echo "== HF transformers offline batches" | tee "$out/hf.log"
hf_dtype=bfloat16; [ $dtype = f16 ] && hf_dtype=float16
PYTHONUNBUFFERED=1 timeout 300 python3 "$here/embed_hf_baseline.py" --config "$cfg" --lo $lo --hi $hi \
  --dtype $hf_dtype -b "${conc[@]}" 2>&1 | grep -vE "Warning|warn|deprecated" | tee -a "$out/hf.log"
