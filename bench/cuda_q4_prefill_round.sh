#!/usr/bin/env bash
# On a GPU machine: q4 prefill with device-wide dequantization tiles against L2-sized ones
# (KILN_CUDA_DEQUANT_WIDE=0), alternating (bench/ab.py), bf16 prefill beside it, and the
# host memory a CUDA model keeps once loaded (lean_host_weights: sampled from
# /proc/PID/status while it decodes).
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
# Host memory: the largest and the last VmRSS seen while the process runs (the last: decoding).
"$kiln" bench --backend cuda --weight-dtype bf16 --random-weights "$cfg" -p 128 -n 2000 -r 1 > "$out/rss_run.txt" 2>&1 &
pid=$!; peak=0; last=0
while kill -0 $pid 2>/dev/null; do
  rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)
  [ -n "$rss" ] && [ "$rss" -gt 0 ] && last=$rss && [ "$rss" -gt "$peak" ] && peak=$rss
  sleep 0.5
done
wait $pid || true
echo "host VmRSS of kiln bench ($cfg, bf16, cuda): peak $((peak / 1024)) MiB, last $((last / 1024)) MiB" | tee "$out/rss.txt"
