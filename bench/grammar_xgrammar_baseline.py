#!/usr/bin/env python3
"""xgrammar (vLLM's default structured-output backend) on the same schema, vocabulary and
document tokens as bench/grammar_mask_bench (run it with --dump DIR first): the schema's
compile time, then one document's tokens replayed - before each token
fill_next_token_bitmask over the whole vocabulary and apply_token_bitmask_inplace on a CPU
logits row (what kiln's timed mask does: -inf on the refused tokens), then accept_token -
with a first and a second matcher of the same compiled grammar.
Usage: grammar_xgrammar_baseline.py DIR"""
import json
import statistics
import sys
import time

import torch
import xgrammar as xgr
from importlib.metadata import version

d = sys.argv[1]
vocab = json.load(open(f"{d}/vocab.json"))
ids = json.load(open(f"{d}/ids.json"))
schema = open(f"{d}/schema.json").read()
# Special tokens: a byte string no text contains, so they never match.
encoded = [bytes.fromhex(v) if v is not None else b"\xff\xfe<special %d>" % i for i, v in enumerate(vocab)]
info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=len(encoded))


def replay(compiled):
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    logits = torch.zeros(1, info.vocab_size)
    ms = []
    for t in ids:
        logits.zero_()
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        ms.append((time.perf_counter() - t0) * 1e3)
        assert matcher.accept_token(t), f"xgrammar refuses token {t}"
    return sum(ms), statistics.median(ms), max(ms)


t0 = time.perf_counter()
compiler = xgr.GrammarCompiler(info, max_threads=1)
init_ms = (time.perf_counter() - t0) * 1e3
t0 = time.perf_counter()
# llama.cpp-like bounded whitespace, as kiln's schema grammars allow.
compiled = compiler.compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=20)
compile_ms = (time.perf_counter() - t0) * 1e3
cold = replay(compiled)
warm = replay(compiled)
print(f"xgrammar {version('xgrammar')}: vocabulary {len(encoded)} tokens; document {len(ids)} tokens; "
      f"compiler set-up {init_ms:.1f} ms; schema compiled in {compile_ms:.1f} ms (1 thread)\n")
print("| pass | masks total ms | median ms | max ms |\n|---|---|---|---|")
print(f"| first matcher | {cold[0]:.2f} | {cold[1]:.3f} | {cold[2]:.2f} |")
print(f"| second matcher | {warm[0]:.2f} | {warm[1]:.3f} | {warm[2]:.2f} |")
