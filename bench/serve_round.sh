#!/usr/bin/env bash
# One GPU round for serving: `kiln serve` (CUDA, bf16 weights, random weights of a real
# shape) loaded by `kiln serve bench` at several concurrencies with fixed 128/128
# lengths, then HF transformers' batched generate at the same batch sizes, in one run.
#   bench/serve_round.sh KILN CONFIG OUT_DIR [concurrencies...]
# KILN_SERVE_ARGS: more `kiln serve` flags (e.g. "--decode-padding off"); HF=0: kiln only.
set -uo pipefail
kiln=$1 cfg=$2 out=$3; shift 3
conc=("$@"); [ ${#conc[@]} -gt 0 ] || conc=(1 16 64 256)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
# HF's batched generate is bound by the host's Python: its CPU goes into the record too.
{ grep -m1 "model name" /proc/cpuinfo; echo "host cores: $(nproc)"; } | tee -a "$out/gpu.txt"
port=18777
"$kiln" serve --backend cuda --weight-dtype bf16 -m model=random:"$cfg" --port $port \
  --kv-tokens 131072 --max-running 256 --max-step-tokens 4096 --http-threads 512 ${KILN_SERVE_ARGS:-} 2>"$out/server.log" &
srv=$!
get() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1" 2>/dev/null; }
for i in $(seq 600); do get http://127.0.0.1:$port/health/ready >/dev/null && break; sleep 0.5; done
vocab=$(python3 -c "import json; print(json.load(open('$cfg'))['vocab_size'])")
"$kiln" serve bench --port $port --model model -c 1 --requests 2 --input-min 16 --input-max 16 \
  --output-min 8 --output-max 8 --vocab "$vocab" >/dev/null 2>&1  # warm-up
for c in "${conc[@]}"; do
  n=$(( c < 8 ? 8 : 2 * c ))
  echo "== kiln serve bench -c $c --requests $n (128 in / 128 out)" | tee -a "$out/kiln.log"
  timeout 240 "$kiln" serve bench --port $port --model model -c "$c" --requests $n --input-min 128 --input-max 128 \
    --output-min 128 --output-max 128 --vocab "$vocab" --json "$out/kiln_c$c.json" 2>&1 | tee -a "$out/kiln.log"
  # Cumulative executor counters after each concurrency: the differences give engine time
  # per step and the schedule/sample/emit phases of each run.
  get http://127.0.0.1:$port/metrics | grep -E "^kiln_(executor_seconds|engine_steps|engine_step_tokens)_total" \
    | sed "s/^/after c=$c: /" >> "$out/kiln_phases.log"
done
get http://127.0.0.1:$port/metrics | grep -E "^kiln_(preemptions|engine_steps|engine_step_tokens)_total" | tee -a "$out/kiln.log"
kill -TERM $srv; wait $srv
[ "${HF:-1}" = 0 ] && exit 0  # HF=0: the kiln side only
echo "== HF transformers generate" | tee "$out/hf.log"
PYTHONUNBUFFERED=1 timeout 400 python3 "$here/serve_hf_baseline.py" --config "$cfg" -b "${conc[@]}" 2>&1 \
  | grep -vE "Warning|warn|deprecated" | tee -a "$out/hf.log"
