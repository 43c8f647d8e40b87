#!/usr/bin/env bash
# kiln vs llama.cpp on the same GGUF files: for each CONFIG x TYPE, bench/gguf_synth.py
# writes a random-weight GGUF of that shape, then `llama-bench` (pp P, tg N from an empty
# context and at depth P) and `kiln bench` (pp P, then tg N after it) run it in turn, R
# alternating rounds. Logs and a results table go to OUT_DIR.
#   bench/llamacpp_round.sh OUT_DIR CONFIG:TYPE|FILE.gguf...  (CONFIG: a bench/configs name, no .json;
#                                                          a .gguf path is run as it is and kept)
# TYPE: f16 bf16 q8_0 q4_0 q4_k (gguf_synth.py writes them), or one of llama-quantize's
# mixes in capitals (Q4_K_M, Q5_K_M, Q6_K, ...: llama.cpp's own quantizer turns a bf16
# synth into that file, with its own choice of type per tensor).
# Env: KILN=path/to/kiln, LLAMA_BENCH=path/to/llama-bench, LLAMA_QUANTIZE=path/to/llama-quantize
#      (default: beside llama-bench), BACKEND=cpu|cuda (default cuda),
#      THREADS (cpu), P=512 N=128 R=2, GGUF_DIR (default OUT_DIR; files are deleted after
#      their round unless KEEP=1), CFGS (default bench/configs), PYTHONPATH with gguf-py.
# llama-bench comes from the vendored llama.cpp of PyPI's llama-cpp-python sdist
# (bench/llamacpp_build.sh).
set -uo pipefail
out=$1; shift
kiln=${KILN:-build/tools/kiln/kiln}
lb=${LLAMA_BENCH:-.cache/llamacpp/llama-bench}
backend=${BACKEND:-cuda}
P=${P:-512}; N=${N:-128}; R=${R:-2}
cfgs=${CFGS:-bench/configs}
gdir=${GGUF_DIR:-$out}
threads=${THREADS:-$(nproc)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$gdir"
log=$out/llamacpp_round.log
if [ "$backend" = cuda ]; then
  lb_args=(-ngl 99 -fa on)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
else
  lb_args=(-ngl 0 -t "$threads")
  export KILN_NUM_THREADS=$threads
  lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$log"
fi
# (the help text is read whole first: grep -q closing the pipe early would fail it under pipefail)
help=$("$lb" --help 2>&1 || true)
case "$help" in *--n-depth*) depth=1 ;; *) depth=0 ;; esac
for spec in "$@"; do
  keep=${KEEP:-0}
  if [ "${spec%.gguf}" != "$spec" ]; then
    f=$spec; keep=1
    echo "== $spec ($(du -h "$f" | cut -f1))" | tee -a "$log"
  else
    cfg=${spec%%:*}; type=${spec#*:}
    f=$gdir/$cfg-$type.gguf
    t0=$(date +%s)
    case "$type" in
      [A-Z]*)  # a llama-quantize mix of a bf16 synth
        lq=${LLAMA_QUANTIZE:-$(dirname "$lb")/llama-quantize}
        python3 "$here/gguf_synth.py" "$cfgs/$cfg.json" bf16 "$f.bf16" >>"$log" 2>&1 \
          && "$lq" "$f.bf16" "$f" "$type" "$threads" >>"$log" 2>&1
        ok=$?; rm -f "$f.bf16"
        [ $ok = 0 ] || { echo "synth + llama-quantize $spec failed" | tee -a "$log"; continue; } ;;
      *) python3 "$here/gguf_synth.py" "$cfgs/$cfg.json" "$type" "$f" >>"$log" 2>&1 || { echo "synth $spec failed" | tee -a "$log"; continue; } ;;
    esac
    echo "== $spec ($(du -h "$f" | cut -f1), written in $(( $(date +%s) - t0 )) s)" | tee -a "$log"
  fi
  for r in $(seq 1 "$R"); do
    echo "-- round $r llama.cpp" | tee -a "$log"
    timeout 400 "$lb" -m "$f" "${lb_args[@]}" -p "$P" -n "$N" -r 3 -o md 2>>"$log" | tee -a "$log"
    if [ "$depth" = 1 ]; then
      timeout 400 "$lb" -m "$f" "${lb_args[@]}" -p 0 -n "$N" -d "$P" -r 3 -o md 2>>"$log" | grep -E "tg" | tee -a "$log"
    fi
    echo "-- round $r kiln" | tee -a "$log"
    timeout 400 "$kiln" bench -m "$f" --backend "$backend" -p "$P" -n "$N" -r 3 2>&1 \
      | grep -E "^\||model:|rror" | tee -a "$log"
  done
  [ "$keep" = 1 ] || rm -f "$f"
done
