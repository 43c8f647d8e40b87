#!/usr/bin/env bash
# Encoder (embedding) throughput, kiln vs llama.cpp on the same BERT-family GGUF, on the CPU.
#   bench/llamacpp_embed_round.sh KILN GGUF [GGUF...]
# GGUFs as bench/gguf_bert.py writes them (llama.cpp's own conversion; f32, f16, q8_0).
# Per GGUF and round (ROUNDS alternating rounds, each engine R timed repeats after a warm-up):
#   llama.cpp, batch 1:  llama-bench -m GGUF -embd 1 -p T -n 0 -t THREADS -r R  (pp T: one sequence of
#                        T random tokens, no [CLS]/[SEP]); ms per forward = T / (tokens/s per repeat).
#   llama.cpp, batch B>1: llama-embedding (llama-bench runs one sequence) on a file of NF x B sentences
#                        of T-2 random whole-word vocabulary tokens (+ [CLS] [SEP] = T tokens), packed B
#                        to a batch (-c/-b/-ub B*T, unified KV: its default), --perf: its "prompt eval
#                        time" / NF = ms per forward (model load and tokenization excluded; the first
#                        of the NF forwards of each run is included). R runs.
#   kiln:                KILN bench -m GGUF -p T -b B -r R (random token ids), KILN_NUM_THREADS=THREADS.
# Prints one table: engine, file type, weights as run, batch, tokens per sequence, ms per forward
# (median of R repeats; one value per round), sequences/s (from the median over rounds).
# Env: BATCHES="1 32", T=128, R=5, ROUNDS=2, NF=3, THREADS=$(nproc), OUT (logs; default a temp dir),
#      LLAMA_BENCH, LLAMA_EMBEDDING (default: .cache/llamacpp/{cpu,build-cpu/bin}), KILN_ARGS (more
#      `kiln bench` flags, e.g. "--weight-dtype q8"), PYTHON (python3 with numpy + gguf).
# A failure is printed in the table (benchmarks never hide failures).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,3p "$0" >&2; exit 2; }
kiln=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
py=${PYTHON:-python3}
T=${T:-128}; R=${R:-5}; ROUNDS=${ROUNDS:-2}; NF=${NF:-3}
batches=(${BATCHES:-1 32})
threads=${THREADS:-$(nproc)}
pick() { for f in "$@"; do [ -x "$f" ] && { echo "$f"; return; }; done; echo "$1"; }
lb=${LLAMA_BENCH:-$(pick "$root/.cache/llamacpp/cpu/llama-bench" "$root/.cache/llamacpp/build-cpu/bin/llama-bench")}
le=${LLAMA_EMBEDDING:-$(pick "$root/.cache/llamacpp/build-cpu/bin/llama-embedding" "$root/.cache/llamacpp/cpu/llama-embedding")}
out=${OUT:-$(mktemp -d /tmp/llamacpp_embed_round.XXXXXX)}
mkdir -p "$out"
log=$out/round.log
res=$out/results.tsv   # engine  ftype  weights  batch  T  round  ms_median  ms_min  ms_max  note
: > "$res"
export KILN_NUM_THREADS=$threads
{
  date -u +"%Y-%m-%d %H:%M UTC"
  lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|L3"
  echo "threads: $threads; T=$T R=$R ROUNDS=$ROUNDS batches: ${batches[*]}"
  echo "kiln: $kiln ($(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo +dirty))"
  echo "llama-bench: $lb"; echo "llama-embedding: $le"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on these $(nproc) cores skews both engines,"
  echo "  llama.cpp's spinning OpenMP threads far more: compare only runs on an idle machine)"
} | tee "$log"
help=$("$lb" --help 2>&1 || true)
case "$help" in *--embeddings*) lb_embd=1 ;; *) lb_embd=0; echo "llama-bench has no -embd: batch 1 timed with llama-embedding" | tee -a "$log" ;; esac

# sentences of exactly T tokens ([CLS] + T-2 whole-word tokens + [SEP]) from the GGUF's vocabulary
mksent() {  # GGUF B FILE
  "$py" - "$1" "$2" "$3" "$T" "$NF" <<'EOF'
import random, sys
import gguf
f, B, path, T, NF = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
r = gguf.GGUFReader(f)
toks = r.fields["tokenizer.ggml.tokens"].contents()
types = r.fields["tokenizer.ggml.token_type"].contents()
# a NORMAL "▁word" of lowercase ASCII letters is one WordPiece token on its own
words = [t[1:] for t, y in zip(toks, types) if y == 1 and t.startswith("\u2581") and t[1:].isascii() and t[1:].isalpha() and t[1:].islower()]
rng = random.Random(B)
with open(path, "w") as fo:
    for _ in range(NF * B):
        fo.write(" ".join(rng.choice(words) for _ in range(T - 2)) + "\n")
EOF
}
ftype_of() {
  "$py" -c "import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); print(gguf.LlamaFileType(int(r.fields['general.file_type'].contents())).name.partition('_')[2])" "$1" 2>/dev/null || echo "?"
}
row() { printf '%s\t' "$@" | sed 's/\t$//' >> "$res"; echo >> "$res"; }

run_llama_bench() {  # GGUF FTYPE ROUND
  local j
  j=$(timeout 600 "$lb" -m "$1" -embd 1 -p "$T" -n 0 -t "$threads" -r "$R" -o json 2>>"$log")
  echo "$j" >> "$log"
  "$py" -c '
import json, sys, statistics as st
T = int(sys.argv[1]); d = json.loads(sys.stdin.read())[0]
ms = sorted(T / ts * 1e3 for ts in d["samples_ts"])
print("\t".join(f"{x:.2f}" for x in (st.median(ms), ms[0], ms[-1])) + "\t" + d["type_k"] + " KV, build " + d["build_commit"])
' "$T" <<<"$j" 2>>"$log" | { IFS=$'\t' read -r med lo hi note && row "llama.cpp (llama-bench)" "$2" "as stored" 1 "$T" "$3" "$med" "$lo" "$hi" "$note" \
      || row "llama.cpp (llama-bench)" "$2" "-" 1 "$T" "$3" "" "" "" "error: see $log"; }
}

run_llama_embedding() {  # GGUF FTYPE ROUND B
  local f=$1 B=$4 n=$(( $4 * T )) s=$out/sent_$(basename "$1" .gguf)_b$4.txt ms=() i a t
  [ -f "$s" ] || mksent "$f" "$B" "$s"
  for i in $(seq 1 "$R"); do
    for a in 1 2 3; do  # its log output is now and then cut short at exit: retry
      t=$(timeout 600 "$le" -m "$f" -f "$s" -t "$threads" -c "$n" -b "$n" -ub "$n" --perf -lv 4 2>&1 >/dev/null \
          | tee -a "$log.embedding" | grep -E "prompt eval time" | sed -E 's/.*= *([0-9.]+) ms \/ *([0-9]+) tokens.*/\1 \2/')
      [ -n "$t" ] && break
    done
    [ -n "$t" ] || { row "llama.cpp (llama-embedding)" "$2" "as stored" "$B" "$T" "$3" "" "" "" "error: see $log.embedding"; return; }
    [ "${t#* }" = $(( NF * n )) ] || echo "llama-embedding: ${t#* } tokens, expected $(( NF * n ))" | tee -a "$log"
    ms+=("$(awk -v x="${t% *}" -v k="$NF" 'BEGIN { printf "%.2f", x / k }')")
  done
  read -r med lo hi < <(printf '%s\n' "${ms[@]}" | sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f %s %s\n", m, v[1], v[NR] }')
  row "llama.cpp (llama-embedding)" "$2" "as stored" "$B" "$T" "$3" "$med" "$lo" "$hi" "$NF forwards a run, unified KV"
}

run_kiln() {  # GGUF FTYPE ROUND B
  local o w line
  o=$(timeout 600 "$kiln" bench -m "$1" -p "$T" -b "$4" -r "$R" ${KILN_ARGS:-} 2>&1)
  echo "$o" >> "$log"
  w=$(sed -nE 's/^model: .*, weights (.*[^ ]) [0-9.]+ [KMG]iB as stored.*/\1/p' <<<"$o" | head -1)
  line=$(grep -E "^\| forward \| $4 \| $T \|" <<<"$o" | head -1)
  if [ -n "$line" ]; then
    IFS='|' read -r _ _ _ _ med spread _ <<<"$line"
    row "kiln" "$2" "${w:-?}" "$4" "$T" "$3" "$(echo $med)" "$(echo ${spread%-*})" "$(echo ${spread#*-})" ""
  else
    row "kiln" "$2" "${w:--}" "$4" "$T" "$3" "" "" "" "$(grep -m1 -iE "error|what\(\)" <<<"$o" | cut -c1-200 || echo "no result: see $log")"
  fi
}

for f in "$@"; do
  ft=$(ftype_of "$f")
  echo "== $f ($ft, $(du -h "$f" | cut -f1))" | tee -a "$log"
  for r in $(seq 1 "$ROUNDS"); do
    # alternate which engine goes first
    for who in $( [ $((r % 2)) = 1 ] && echo "llama kiln" || echo "kiln llama"); do
      for B in "${batches[@]}"; do
        if [ "$who" = kiln ]; then run_kiln "$f" "$ft" "$r" "$B"
        elif [ "$B" = 1 ] && [ "$lb_embd" = 1 ]; then run_llama_bench "$f" "$ft" "$r"
        else run_llama_embedding "$f" "$ft" "$r" "$B"; fi
        tail -1 "$res" | tee -a "$log" >&2
      done
    done
  done
done

"$py" - "$res" <<'EOF' | tee -a "$log"
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
groups = {}
for eng, ft, w, b, t, rnd, med, lo, hi, note in rows:
    g = groups.setdefault((ft, int(b), eng), {"w": w, "t": t, "med": [], "lo": [], "hi": [], "notes": set()})
    if med:
        g["med"].append(float(med)); g["lo"].append(float(lo)); g["hi"].append(float(hi))
    if note:
        g["notes"].add(note)
    if w not in ("-", "?"):
        g["w"] = w
print()
print("| engine | file type | weights as run | batch | tokens/seq | ms per forward (median, each round) | spread min-max ms | sequences/s | notes |")
print("|---|---|---|---|---|---|---|---|---|")
for (ft, b, eng), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
    if g["med"]:
        m = st.median(g["med"])
        rounds = " / ".join(f"{x:.2f}" for x in g["med"])
        print(f"| {eng} | {ft} | {g['w']} | {b} | {g['t']} | {m:.2f} ({rounds}) | {min(g['lo']):.2f}-{max(g['hi']):.2f} | {b * 1e3 / m:.1f} | {'; '.join(sorted(g['notes']))} |")
    else:
        print(f"| {eng} | {ft} | {g['w']} | {b} | {g['t']} | failed | | | {'; '.join(sorted(g['notes']))} |")
print()
print(f"logs: {sys.argv[1].rsplit('/', 1)[0]}")
EOF
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
