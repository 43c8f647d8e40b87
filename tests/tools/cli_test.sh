#!/usr/bin/env bash
# End-to-end checks of the `kiln` binary: it runs the tiny fixture models, and bad
# input gives exit code 1 with a message naming the problem (never a crash).
set -uo pipefail
kiln=$1
fixtures=$2
plugin=${3:-}  # the example plugin library (examples/plugins)
fail=0
check() {  # name expected-exit expected-substring -- command...
  local name=$1 want_rc=$2 want=$3
  shift 4
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: exit $rc (want $want_rc), output:"
    echo "$out" | head -20
    fail=1
  else
    echo "ok   $name"
  fi
}
check help 0 "generate" -- "$kiln" --help
check generate-ids 0 "" -- "$kiln" generate -m "$fixtures/models/gpt2" --ids 5,6,7 -n 4 -q
check classify-ids 0 "LABEL_" -- "$kiln" classify -m "$fixtures/models/bert" --ids 5,6,7,8
check embed-ids 0 "[" -- "$kiln" embed -m "$fixtures/models/bert" --ids 5,6,7
check embed-pooler 0 "[" -- "$kiln" embed -m "$fixtures/models/bert" --ids 5,6,7 --pooling pooler --no-normalize
check embed-pooling-bad 105 "--pooling: max not in" -- "$kiln" embed -m "$fixtures/models/bert" --ids 5,6,7 --pooling max
check embed-decoder 0 "[" -- "$kiln" embed -m "$fixtures/models/qwen3" --ids 5,6,7 --ids 9,10
check embed-decoder-tp 0 "[" -- "$kiln" embed -m "$fixtures/models/qwen3" --ids 5,6,7 --tp 2
check embed-decoder-pooler 1 "no pooler" -- "$kiln" embed -m "$fixtures/models/qwen3" --ids 5,6,7 --pooling pooler
check rerank-classifier 1 "classifier with 3 labels" -- "$kiln" rerank -m "$fixtures/models/bert" -q a -d b
check rerank-decoder 1 "is a decoder" -- "$kiln" rerank -m "$fixtures/models/gpt2" -q a -d b
check rerank-no-documents 106 "--document is required" -- "$kiln" rerank -m "$fixtures/models/bert" -q a
check inspect-pooling 0 "pooling     mean" -- "$kiln" inspect -m "$fixtures/models/bert"
check inspect 0 "decoder" -- "$kiln" inspect -m "$fixtures/models/llama" --graph
check inspect-load 0 "load        read " -- "$kiln" inspect -m "$fixtures/models/llama"
check missing-model 1 "does not exist" -- "$kiln" generate -m /nonexistent --ids 1
check max-context-long 0 "" -- "$kiln" generate -m "$fixtures/models/phi3_longrope" --max-context 200 --ids "$(seq -s, 3 72)" -n 4 -q
check max-context-short 1 "beyond the model's 64 positions" -- "$kiln" generate -m "$fixtures/models/phi3_longrope" --ids "$(seq -s, 3 72)" -n 4 -q
check max-context-over 1 "--max-context 300 exceeds the model's 256 positions" -- "$kiln" generate -m "$fixtures/models/phi3_longrope" --max-context 300 --ids 5 -n 1
check bad-ids 1 "not a token id" -- "$kiln" generate -m "$fixtures/models/gpt2" --ids 1,x
check oov-id 1 "outside the vocabulary" -- "$kiln" generate -m "$fixtures/models/gpt2" --ids 999999
check no-tokenizer 1 "has no tokenizer" -- "$kiln" generate -m "$fixtures/models/gpt2" -p hello
check encoder-generate 1 "encoder" -- "$kiln" generate -m "$fixtures/models/bert" --ids 1,2
# --lookup: the same greedy ids as without (CPU), the counts on stderr; refused beside a grammar.
ids=$(seq -s, 5 20),$(seq -s, 5 20)
plain=$("$kiln" generate -m "$fixtures/models/llama" --ids "$ids" -n 24 --print-ids --ignore-eos -q 2>/dev/null)
drafted=$("$kiln" generate -m "$fixtures/models/llama" --ids "$ids" -n 24 --print-ids --ignore-eos -q --lookup 4 2>/dev/null)
if [ -n "$plain" ] && [ "$plain" = "$drafted" ]; then echo "ok   lookup-same-ids"; else echo "FAIL lookup-same-ids: '$plain' vs '$drafted'"; fail=1; fi
check lookup-counts 0 "drafted" -- "$kiln" generate -m "$fixtures/models/llama" --ids "$ids" -n 24 --print-ids --ignore-eos --lookup 4
check lookup-range 1 "takes 0 (off) to 64 draft tokens" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1 --lookup 65
check bench-serve-repeats 105 "--prompt-repeats" -- "$kiln" bench serve --model m --prompt-repeats 0
check grammar-no-tokenizer 1 "need a model with a tokenizer" -- "$kiln" generate -m "$fixtures/models/gpt2" --ids 5 --grammar 'root ::= "a"'
smollm2="$fixtures/../../.cache/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$smollm2" ]; then  # constrained generation with a real tokenizer (scripts/fetch_models.sh)
  check grammar-bad 1 "undefined" -- "$kiln" generate -m "$smollm2" -p hi --grammar 'root ::= nothing'
  check json-schema-bad 1 "not valid JSON" -- "$kiln" generate -m "$smollm2" -p hi --json-schema '{'
  check grammar 0 " Paris." -- "$kiln" generate -m "$smollm2" -p "The capital of France is" -q -n 20 \
    --grammar 'root ::= " " [A-Z] [a-z]+ "."'
  check regex-bad 1 "regex: '(' is not closed" -- "$kiln" generate -m "$smollm2" -p hi --regex 'a(b'
  out=$("$kiln" generate -m "$smollm2" -p "The year the Berlin Wall fell:" -q -n 8 --regex ' ?(19|20)[0-9]{2}\.' 2>&1)
  if grep -qE '^ ?(19|20)[0-9]{2}\.$' <<<"$out"; then echo "ok   regex"; else echo "FAIL regex: $out"; fail=1; fi
  doc=$("$kiln" generate -m "$smollm2" --chat -p "Give me a person as JSON." -q -n 100 \
    --json-schema '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}' 2>&1)
  if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert set(d)=={"name","age"} and isinstance(d["age"],int)' "$doc"; then
    echo "ok   json-schema"
  else
    echo "FAIL json-schema: $doc"
    fail=1
  fi
fi
check no-classifier 1 "no classification head" -- "$kiln" classify -m "$fixtures/models/gpt2" --ids 1
check serve-help-tuning 0 "--tune-batch-sizes" -- "$kiln" serve --help
check serve-help-padding 0 "--decode-padding" -- "$kiln" serve --help
check serve-bad-padding 105 "--decode-padding: sometimes not in" -- "$kiln" serve --decode-padding sometimes -m x
check serve-help-encoder-batching 0 "--encoder-max-batch-tokens" -- "$kiln" serve --help
check serve-bad-encoder-batch 105 "--encoder-max-batch: Value 0 not in range" -- "$kiln" serve --encoder-max-batch 0 -m x
check serve-bench-bad-endpoint 105 "--endpoint: chat not in" -- "$kiln" serve bench --model m --endpoint chat
check bench-serve-help 0 "TTFT" -- "$kiln" bench serve --help
check serve-bench-help 0 "TTFT" -- "$kiln" serve bench --help
check bench-serve-no-server 1 "" -- "$kiln" bench serve --port 1 --model m --requests 1
# --pin-precision on a direct load runs the precision pass as kiln build does.
check pin-direct 0 "q8        layers.0.qkv_proj" -- "$kiln" inspect -m "$fixtures/models/llama" --weight-dtype q4 --pin-precision 'layers.0.*=q8'
check pin-auto 1 "needs --weight-dtype" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1,2 -n 1 --pin-precision 'layers.0.*=q8'
check pin-bad 1 "NODE_GLOB=PRECISION" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1,2 -n 1 --weight-dtype q4 --pin-precision 'layers.0'
check effective-bits-mode 1 "--effective-bits mixes q4 and q8" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1,2 -n 1 --quant w8a8 --effective-bits 6
check effective-bits-no-mode 1 "no --quant given" -- "$kiln" build -m "$fixtures/models/llama" -o /tmp/kiln_cli_eb_$$.kiln --effective-bits 6
check bench-tiny 0 "tg" -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1
check bench-encoder 0 "| forward | 2 | 16 |" -- "$kiln" bench -m "$fixtures/models/bert" -p 16 -b 2 -r 1
check bench-ceiling 0 "% of triad" -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1
check bench-step-bytes 0 "MiB read per decode step" -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1
# Tensor parallelism: --tp 2 and 4 (in-process ranks) print --tp 1's tokens; bad splits are named.
tp1=$("$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos 2>/dev/null)
[ -n "$tp1" ] || { echo "FAIL generate-tp1: no tokens"; fail=1; }
check generate-tp2 0 "$tp1" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos --tp 2
check generate-tp4 0 "$tp1" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos --tp 4
check tp-heads 1 "4 attention heads do not split over 3 ranks" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1 --tp 3
check tp-zero 105 "--tp: Value 0 not in range" -- "$kiln" generate -m "$fixtures/models/llama" --ids 1 --tp 0
check tp-encoder 1 "decoders only" -- "$kiln" embed -m "$fixtures/models/bert" --ids 5,6,7 --tp 2
# bench/ab.py: alternating A/B runs of kiln bench, the time column of every table row.
check bench-ab 0 "| tg4 1 |" -- python3 "$fixtures/../../bench/ab.py" --a "KILN_THREADS=1" --b "KILN_THREADS=2" --rounds 2 -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1
check bench-ab-args 0 "B: -r 2" -- python3 "$fixtures/../../bench/ab.py" --a "" --b "" --a-args="-r 1" --b-args="-r 2" --rounds 1 -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4
check bench-ab-bad-setting 1 "is not NAME=VALUE" -- python3 "$fixtures/../../bench/ab.py" --a "X" --b "" -- "$kiln" bench
check bench-ab-failing-run 1 "round 1 exited with 1" -- python3 "$fixtures/../../bench/ab.py" --a "" --b "" -- "$kiln" bench -m /nonexistent
check bench-tp2 0 "tg" -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1 --tp 2
# --kv-cache-fraction sizes the pool from free memory (MemAvailable on the CPU).
check generate-kv-fraction 0 "$tp1" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos --kv-cache-fraction 0.5
check kv-fraction-too-small 1 "KV cache too small for one max-length request" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7 --kv-cache-fraction 1e-12
check kv-fraction-range 105 "--kv-cache-fraction" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7 --kv-cache-fraction 1.5
check kv-fraction-zero 105 "--kv-cache-fraction" -- "$kiln" generate -m "$fixtures/models/llama" --ids 5,6,7 --kv-cache-fraction 0
check bench-kv-fraction 0 "KV pool:" -- "$kiln" bench --random-weights "$fixtures/../../bench/configs/tiny-llama-test.json" -p 8 -n 4 -r 1 --kv-cache-fraction 0.5
check serve-bad-preemption 105 "--preemption" -- "$kiln" serve -m "$fixtures/models/llama" --preemption evict
# With the real model (fetched by scripts/fetch_models.sh): text in, text out, chat.
smol=${KILN_MODELS_DIR:-$fixtures/../../.cache/models}/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$smol" ]; then
  check generate-text 0 "Paris" -- "$kiln" generate -m "$smol" -p "The capital of France is" -n 3
  check generate-chat 0 "Paris" -- "$kiln" generate -m "$smol" --chat -p "What is the capital of France?" -n 12
  check tokenize 0 "capital" -- "$kiln" tokenize -m "$smol" -t "The capital"
  check chat-two-turns 0 "> " -- bash -c "printf 'Hi\\nThanks\\n' | '$kiln' chat -m '$smol' -n 4"
  check bad-utf8 1 "UTF-8" -- "$kiln" generate -m "$smol" -p $'\xff\xfe' -n 2
  check bad-cpu-qgemv 1 "KILN_CPU_QGEMV" -- env KILN_CPU_QGEMV=fast "$kiln" generate -m "$smol" -p "Hi" -n 2
else
  echo "skip real-model CLI checks: $smol not found"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `kiln build --tp 2` writes one engine holding both ranks' graphs: it runs sharded with
# no --tp and no checkpoint, and prints --tp 1's tokens; another --tp is refused.
check build-tp2 0 "tensor par  2 ranks, one graph each" -- \
  "$kiln" build --tp 2 -m "$fixtures/models/llama" -o "$tmp/llama-tp2.kiln" --no-tune
check generate-engine-tp2 0 "$tp1" -- "$kiln" generate -m "$tmp/llama-tp2.kiln" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos
check generate-engine-tp2-given 0 "$tp1" -- \
  "$kiln" generate -m "$tmp/llama-tp2.kiln" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos --tp 2
check engine-tp-mismatch 1 "built for tensor parallelism over 2 ranks (\`kiln build --tp 2\`), but --tp 4 was asked" -- \
  "$kiln" generate -m "$tmp/llama-tp2.kiln" --ids 5 --tp 4
check pin-engine 1 "keeps the precisions it was built with" -- \
  "$kiln" generate -m "$tmp/llama-tp2.kiln" --ids 5 --weight-dtype q4 --pin-precision 'layers.0.*=q8'
check inspect-engine-tp2 0 "tensor par  2 ranks (recorded in the engine): 2 of 4 attention heads, 1 of 2 K/V heads each" -- \
  "$kiln" inspect -m "$tmp/llama-tp2.kiln"
check inspect-engine-tp2-ranks 0 "  rank 1    " -- "$kiln" inspect -m "$tmp/llama-tp2.kiln"
# `kiln build --max-context` stores a LongRoPE model's long factors: the engine generates what
# the checkpoint loaded with the same --max-context generates, and caps further contexts.
lr=$("$kiln" generate -m "$fixtures/models/phi3_longrope" --max-context 256 --ids "$(seq -s, 3 72)" -n 4 -q --print-ids)
[ -n "$lr" ] || { echo "FAIL max-context reference: no ids"; fail=1; }
check build-max-context 0 "" -- "$kiln" build -m "$fixtures/models/phi3_longrope" --max-context 256 -o "$tmp/lr.kiln" --no-tune
check generate-engine-max-context 0 "$lr" -- "$kiln" generate -m "$tmp/lr.kiln" --ids "$(seq -s, 3 72)" -n 4 -q --print-ids
check engine-max-context-over 1 "exceeds the engine's 256 positions" -- "$kiln" generate -m "$tmp/lr.kiln" --max-context 300 --ids 5 -n 1
# `kiln build` measures an int8/fp8 cache's key shift on a decoder with a tokenizer and stores
# it; a load with --kv-cache-dtype fp8 takes it from the engine (the llama fixture with the
# trained 500-token SentencePiece BPE, inside its 512-token vocabulary).
cp -r "$fixtures/models/llama" "$tmp/llama-tok"
cp "$fixtures/tokenizer/trained/spm_bpe.tokenizer.json" "$tmp/llama-tok/tokenizer.json"
check build-kv-shift 0 "kv shift    measured on 640 tokens of the built-in calibration set" -- \
  "$kiln" build -m "$tmp/llama-tok" -o "$tmp/llama-tok.kiln" --no-tune
check inspect-kv-shift 0 "kv shift    measured at build on 640 tokens" -- "$kiln" inspect -m "$tmp/llama-tok.kiln"
check generate-kv-shift 0 "keys stored less the engine's key shift" -- \
  env KILN_LOG=info "$kiln" generate -m "$tmp/llama-tok.kiln" --kv-cache-dtype fp8 -p "hello world" -n 4
check hadamard-not-w8a8 1 "--hadamard applies to --quant w8a8 only" -- \
  "$kiln" generate -m "$tmp/llama-tok" --quant fp8 --hadamard down_proj -p "hello" -n 1
check hadamard-no-quant 1 "--hadamard applies to --quant w8a8 only (got no --quant)" -- \
  "$kiln" generate -m "$tmp/llama-tok" --hadamard down_proj -p "hello" -n 1
check build-hadamard-no-quant 1 "--hadamard applies to --quant w8a8 only (got no --quant)" -- \
  "$kiln" build -m "$tmp/llama-tok" -o "$tmp/unused.kiln" --no-tune --hadamard down_proj
# --kv-rotate: keys through a Walsh-Hadamard transform (the default) or as they are.
check generate-kv-rotate-off 0 "4 generated" -- \
  "$kiln" generate -m "$tmp/llama-tok.kiln" --kv-cache-dtype int8 --kv-rotate off -p "hello world" -n 4
check generate-kv-rotate-bad 105 "--kv-rotate: maybe not in {on,off}" -- \
  "$kiln" generate -m "$tmp/llama-tok.kiln" --kv-cache-dtype int8 --kv-rotate maybe -p "hello world" -n 4
check build-kv-shift-none 0 "kv shift    none (--kv-calib none)" -- \
  "$kiln" build -m "$tmp/llama-tok" -o "$tmp/llama-none.kiln" --no-tune --kv-calib none
check build-kv-shift-missing 1 "--kv-calib: no text file" -- \
  "$kiln" build -m "$tmp/llama-tok" -o "$tmp/x.kiln" --no-tune --kv-calib "$tmp/nope.txt"
# --tp with --quant: calibrated and quantized unsharded, then sharded. `generate --tp 2` and a
# `build --tp 2` engine print the unsharded quantized model's tokens; what would round
# differently per rank is refused, naming the Linear.
for q in w8a8 fp8; do
  want=$("$kiln" generate -m "$tmp/llama-tok" --quant $q --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos 2>/dev/null)
  check generate-tp2-$q 0 "$want" -- \
    "$kiln" generate -m "$tmp/llama-tok" --quant $q --tp 2 --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos
  check build-tp2-$q 0 "ranks" -- "$kiln" build -m "$tmp/llama-tok" --quant $q --tp 2 -o "$tmp/llama-$q-tp2.kiln" --no-tune
  check engine-tp2-$q 0 "$want" -- \
    "$kiln" generate -m "$tmp/llama-$q-tp2.kiln" --ids 5,6,7,300 -n 8 -q --print-ids --ignore-eos
  [ -n "$want" ] || { echo "FAIL generate-$q: no tokens"; fail=1; }
done
check tp-quant-per-token 1 "row-parallel W8A8 Linear 'layers.0.o_proj' uses per-token activation scales" -- \
  "$kiln" generate -m "$tmp/llama-tok" --quant w8a8 --act-scale per-token --tp 2 --ids 5 -n 1
check tp-quant-hadamard 1 "would cut; drop it from --hadamard" -- \
  "$kiln" build -m "$tmp/llama-tok" --quant w8a8 --hadamard down_proj --tp 2 -o "$tmp/x.kiln" --no-tune
check tp-quant-q4-groups 1 "has input width 64 in groups of 32; over 4 ranks (--tp 4)" -- \
  "$kiln" generate -m "$tmp/llama-tok" --quant awq --tp 4 --ids 5 -n 1
# `kiln serve --chat-template` replaces a model's template (a file or its text); the tool-call
# format is then read from it (--tool-call-parser auto).
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}<tool_call>' > "$tmp/tools.jinja"
timeout 60 "$kiln" serve -m "$tmp/llama-tok" --port 0 --chat-template "$tmp/tools.jinja" >"$tmp/serve.log" 2>&1 &
srv=$!
for _ in $(seq 200); do grep -q "listening" "$tmp/serve.log" 2>/dev/null && break; sleep 0.1; done
kill $srv 2>/dev/null; wait $srv 2>/dev/null
if grep -qF "tool calls read as hermes" "$tmp/serve.log"; then echo "ok   serve-chat-template"
else echo "FAIL serve-chat-template: $(head -5 "$tmp/serve.log")"; fail=1; fi
check serve-chat-template-bad 1 "--chat-template: chat template line 1" -- \
  "$kiln" serve -m "$tmp/llama-tok" --port 0 --chat-template '{% for %}'
check serve-chat-template-missing 1 "--chat-template: no file 'none.jinja'" -- \
  "$kiln" serve -m "$tmp/llama-tok" --port 0 --chat-template none.jinja
check build-tp-heads 1 "4 attention heads do not split over 3 ranks" -- \
  "$kiln" build --tp 3 -m "$fixtures/models/llama" -o "$tmp/x.kiln" --no-tune
check build-tp-encoder 1 "decoders only" -- "$kiln" build --tp 2 -m "$fixtures/models/bert" -o "$tmp/x.kiln" --no-tune
# eval of an engine compares it with the model it was built from, never with itself.
"$kiln" build -m "$fixtures/models/bert" -o "$tmp/bert-q8.kiln" --precision q8 --no-tune >/dev/null 2>&1
printf 'a b c\n' > "$tmp/sentences.txt"
check eval-engine-missing-reference 1 "pass the float model it was built from" -- \
  "$kiln" eval embeddings -m "$tmp/bert-q8.kiln" --text "$tmp/sentences.txt" --reference "$tmp/nonexistent"
check eval-engine-reference-engine 1 "is an engine; pass the float model" -- \
  "$kiln" eval embeddings -m "$tmp/bert-q8.kiln" --text "$tmp/sentences.txt" --reference "$tmp/bert-q8.kiln"
# `kiln serve --tp 2` answers a completion with --tp 1's tokens (port 0: the server picks one),
# with the pool sized from free memory (capped) and preemption by swap; the TP=2 engine
# served beside it (its --tp 2 agrees with the engine's) gives the same tokens.
"$kiln" serve -m llama="$fixtures/models/llama" -m llama-engine="$tmp/llama-tp2.kiln" --tp 2 --port 0 \
  --kv-cache-fraction 0.001 --kv-tokens 2048 --preemption swap --swap-space-mib 8 2>"$tmp/serve-tp.log" &
serve_pid=$!
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/serve-tp.log" 2>/dev/null)
  [ -n "$port" ] && break
  sleep 0.1
done
check serve-tp2 0 "\"token_ids\":[$(tr ' ' ',' <<<"$tp1")]" -- curl -sS "http://127.0.0.1:${port:-1}/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"llama","prompt":[5,6,7,300],"max_tokens":8,"temperature":0,"ignore_eos":true,"return_token_ids":true}'
check serve-engine-tp2 0 "\"token_ids\":[$(tr ' ' ',' <<<"$tp1")]" -- curl -sS "http://127.0.0.1:${port:-1}/v1/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"llama-engine","prompt":[5,6,7,300],"max_tokens":8,"temperature":0,"ignore_eos":true,"return_token_ids":true}'
check serve-swap-log 0 "preemption by swap (1024 host blocks)" -- cat "$tmp/serve-tp.log"
kill "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null
check build 0 "fuse_add_norm" -- "$kiln" build -m "$fixtures/models/gpt2" -o "$tmp/gpt2.kiln" --profile T:1,8,16
check generate-engine 0 "" -- "$kiln" generate -m "$tmp/gpt2.kiln" --ids 5,6,7 -n 4 -q
check tp-engine-unsharded 1 "holds one unsharded graph (built without --tp), but --tp 2 was asked" -- \
  "$kiln" generate -m "$tmp/gpt2.kiln" --ids 5,6,7 --tp 2
check inspect-engine 0 "Attention(packed qkv) x2" -- "$kiln" inspect -m "$tmp/gpt2.kiln"
check inspect-unfused 0 "Attention x2" -- "$kiln" inspect -m "$fixtures/models/gpt2" --opt-level 0
check build-bert-bf16 0 "bf16" -- "$kiln" build -m "$fixtures/models/bert" -o "$tmp/bert.kiln" --dtype bf16 --no-tune
check classify-engine 0 "LABEL_" -- "$kiln" classify -m "$tmp/bert.kiln" --ids 5,6,7,8
check bad-pass 1 "no pass named 'fuse_all'" -- "$kiln" build -m "$fixtures/models/gpt2" -o "$tmp/x.kiln" --disable-pass fuse_all
check bad-profile 1 "DIM:min,opt,max" -- "$kiln" build -m "$fixtures/models/gpt2" -o "$tmp/x.kiln" --profile T:9,2
check inspect-onnx 0 "input       token_type_ids i64[batch, sequence]" -- "$kiln" inspect -m "$fixtures/onnx/bert/model.onnx" --onnx-import graph
check build-onnx 0 "constant_folding" -- "$kiln" build -m "$fixtures/onnx/bert/model.onnx" -o "$tmp/onnx-bert.kiln" --onnx-import graph --profile sequence:1,8,64
check inspect-onnx-engine 0 "sequence in [1, 64]" -- "$kiln" inspect -m "$tmp/onnx-bert.kiln"
check embed-onnx-graph 1 "imported op by op" -- "$kiln" embed -m "$fixtures/onnx/bert/model.onnx" --ids 5,6,7 --onnx-import graph
check embed-onnx 0 "[" -- "$kiln" embed -m "$fixtures/onnx/bert/model.onnx" --ids 5,6,7
check inspect-onnx-family 0 "Attention x2" -- "$kiln" inspect -m "$fixtures/onnx/bert/model.onnx" --opt-level 0
check generate-onnx 0 "" -- "$kiln" generate -m "$fixtures/onnx/gpt2/model.onnx" --ids 5,6,7 -n 4 -q
check build-onnx-family 0 "fuse_qkv_attention" -- "$kiln" build -m "$fixtures/onnx/gpt2/model.onnx" -o "$tmp/onnx-gpt2.kiln" --profile T:1,8,16
# GPT-2 exported with past_key_values: its KV cache becomes kiln's paged one, and the
# greedy tokens are HF generate()'s (recorded in the fixture's reference.json).
past="$fixtures/onnx/gpt2_past"
json_ids() { tr -d ' \n' < "${2:-$past}/reference.json" | grep -o "\"$1\":\\[[0-9,]*\\]" | grep -o '[0-9][0-9,]*'; }
past_prompt=$(json_ids prompt_ids)
past_want=$(json_ids greedy_ids | tr ',' ' ')
[ -n "$past_prompt" ] && [ -n "$past_want" ] || { echo "FAIL onnx-past: no prompt_ids/greedy_ids in $past/reference.json"; fail=1; }
check generate-onnx-past 0 "$past_want" -- "$kiln" generate -m "$past/model.onnx" --ids $past_prompt -n 12 -q --print-ids
check build-onnx-past 0 "fuse_qkv_attention" -- "$kiln" build -m "$past/model.onnx" -o "$tmp/onnx-gpt2-past.kiln" --profile T:1,8,16
check generate-onnx-past-engine 0 "$past_want" -- "$kiln" generate -m "$tmp/onnx-gpt2-past.kiln" --ids $past_prompt -n 12 -q --print-ids
check generate-onnx-past-graph 1 "imported op by op (inputs input_ids, attention_mask, position_ids, past_key_values.0.key" -- "$kiln" generate -m "$past/model.onnx" --onnx-import graph --ids 1,2
# Llama exported with past_key_values (GQA: 2 KV heads for 4 query heads): kiln's llama
# graph, theta and eps read off the graph, against HF generate()'s tokens.
lpast="$fixtures/onnx/llama_past"
lpast_prompt=$(json_ids prompt_ids "$lpast")
lpast_want=$(json_ids greedy_ids "$lpast" | tr ',' ' ')
[ -n "$lpast_prompt" ] && [ -n "$lpast_want" ] || { echo "FAIL onnx-llama-past: no prompt_ids/greedy_ids in $lpast/reference.json"; fail=1; }
check generate-onnx-llama-past 0 "$lpast_want" -- "$kiln" generate -m "$lpast/model.onnx" --ids $lpast_prompt -n 12 -q --print-ids
check inspect-onnx-llama-past 0 "heads 4 (kv 2) x 16" -- "$kiln" inspect -m "$lpast/model.onnx"
check build-onnx-llama-past 0 "fuse_qkv_attention" -- "$kiln" build -m "$lpast/model.onnx" -o "$tmp/onnx-llama-past.kiln" --profile T:1,8,16
check generate-onnx-llama-past-engine 0 "$lpast_want" -- "$kiln" generate -m "$tmp/onnx-llama-past.kiln" --ids $lpast_prompt -n 12 -q --print-ids
check generate-onnx-llama 0 "" -- "$kiln" generate -m "$fixtures/onnx/llama/model.onnx" --ids 5,6,7 -n 4 -q
# Qwen2 exported with past_key_values: kiln's llama graph with its q/k/v biases (qwen2).
qpast="$fixtures/onnx/qwen2_past"
qpast_prompt=$(json_ids prompt_ids "$qpast")
qpast_want=$(json_ids greedy_ids "$qpast" | tr ',' ' ')
[ -n "$qpast_prompt" ] && [ -n "$qpast_want" ] || { echo "FAIL onnx-qwen2-past: no prompt_ids/greedy_ids in $qpast/reference.json"; fail=1; }
check generate-onnx-qwen2-past 0 "$qpast_want" -- "$kiln" generate -m "$qpast/model.onnx" --ids $qpast_prompt -n 12 -q --print-ids
check build-onnx-qwen2-past 0 "fuse_qkv_attention" -- "$kiln" build -m "$qpast/model.onnx" -o "$tmp/onnx-qwen2-past.kiln" --profile T:1,8,16
check generate-onnx-qwen2-past-engine 0 "$qpast_want" -- "$kiln" generate -m "$tmp/onnx-qwen2-past.kiln" --ids $qpast_prompt -n 12 -q --print-ids
head -c 3000 "$fixtures/onnx/bert/model.onnx" > "$tmp/cut.onnx"
check truncated-onnx 1 "runs past the end" -- "$kiln" inspect -m "$tmp/cut.onnx"
head -c 5000 "$tmp/gpt2.kiln" > "$tmp/cut.kiln"
check truncated-engine 1 "truncated" -- "$kiln" generate -m "$tmp/cut.kiln" --ids 1
check out-of-profile 1 "outside the engine profile" -- "$kiln" generate -m "$tmp/gpt2.kiln" --ids "$(seq -s, 1 20)" -n 1
check build-pinned 0 "4 pinned" -- "$kiln" build -m "$fixtures/models/llama" -o "$tmp/mixed.kiln" --no-tune \
  --precision bf16 --pin-precision 'layers.0.*=f32' --profile 'small:T=1,8,64' --profile 'large:T=80,256,1024'
check inspect-precision 0 "bf16      layers.1.qkv_proj" -- "$kiln" inspect -m "$tmp/mixed.kiln"
check inspect-pins 0 "pinned    layers.0.*=f32" -- "$kiln" inspect -m "$tmp/mixed.kiln"
check inspect-memory 0 "activation arena" -- "$kiln" inspect -m "$tmp/mixed.kiln"
check inspect-profiles 0 "profile     large: T in [80, 1024], opt 256" -- "$kiln" inspect -m "$tmp/mixed.kiln"
check generate-large-profile 0 "" -- "$kiln" generate -m "$tmp/mixed.kiln" --ids "$(seq -s, 1 100)" -n 3 -q
check between-profiles 1 "outside every engine profile" -- "$kiln" generate -m "$tmp/mixed.kiln" --ids "$(seq -s, 1 70)" -n 1
check engine-profile 1 "outside the selected engine profile 'small'" -- "$kiln" generate -m "$tmp/mixed.kiln" \
  --engine-profile small --ids "$(seq -s, 1 70)" -n 1
check profile-without-engine 1 "only engine files have profiles" -- "$kiln" generate -m "$fixtures/models/llama" \
  --engine-profile small --ids 1,2 -n 1
check bad-pin 1 "matches no GEMM" -- "$kiln" build -m "$fixtures/models/llama" -o "$tmp/x.kiln" --pin-precision 'decoder.*=f32'
check workspace 1 "more than --workspace 1.0 KiB" -- "$kiln" build -m "$fixtures/models/llama" -o "$tmp/x.kiln" --workspace 1KiB
check build-packed 0 "9 GEMMs stored packed for the cpu backend" -- "$kiln" build -m "$fixtures/models/llama" \
  -o "$tmp/packed.kiln" --no-tune --pack-weights --precision bf16
check generate-packed 0 "" -- "$kiln" generate -m "$tmp/packed.kiln" --ids 5,6,7 -n 4 -q
# Plugins: an ONNX model with com.example::ScaledSoftplus imports, builds and loads with
# --plugin (or KILN_PLUGINS); without it, the errors say to pass --plugin.
if [ -n "$plugin" ]; then
  sp="$fixtures/onnx/scaled_softplus/model.onnx"
  check inspect-plugin 0 "Plugin(com.example::ScaledSoftplus) x1" -- "$kiln" inspect -m "$sp" --plugin "$plugin"
  check inspect-plugin-lib 0 "plugin      'example-ops' 1.0.0 (libexample_ops.so): com.example::ScaledSoftplus" -- \
    "$kiln" inspect -m "$sp" --plugin "$plugin"
  check inspect-no-plugin 1 "--plugin FILE" -- "$kiln" inspect -m "$sp"
  check plugin-missing-file 1 "plugin '/nonexistent/libx.so': no such file" -- "$kiln" inspect -m "$sp" --plugin /nonexistent/libx.so
  check build-plugin 0 "engine" -- "$kiln" build -m "$sp" -o "$tmp/softplus.kiln" --plugin "$plugin" --no-tune
  check inspect-plugin-engine 0 "plugin      'example-ops' 1.0.0 (libexample_ops.so): com.example::ScaledSoftplus; loaded 1.0.0" -- \
    "$kiln" inspect -m "$tmp/softplus.kiln" --plugin "$plugin" --graph
  check inspect-plugin-env 0 "Plugin(com.example::ScaledSoftplus) x1" -- env KILN_PLUGINS="$plugin" "$kiln" inspect -m "$tmp/softplus.kiln"
  check engine-no-plugin 1 "built with plugin 'example-ops' 1.0.0 (libexample_ops.so)" -- "$kiln" inspect -m "$tmp/softplus.kiln"
else
  echo "skip plugin CLI checks: no plugin library given"
fi
[ $fail = 0 ] && echo "cli: all passed"
exit $fail
