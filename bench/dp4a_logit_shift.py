#!/usr/bin/env python3
# How far the dp4a GEMV's int8 rounding of each Linear input moves a real decoder's logits,
# emulated in f32 with PyTorch: SmolLM2-135M-Instruct from its Q4_1 GGUF (optionally only its
# first N blocks, as the device tests run it: scripts/cuda_gguf_truncate.py), kiln's q4 grid
# on every Linear incl. the untied LM head, decoded greedily from the fixture prompts with
# exact inputs, then teacher-forced along those tokens with inputs rounded to int8 per group
# of 32 (d = max|x| / 127): per prompt the worst max|dlogit| / max|logit| over the steps,
# the argmax disagreements and their gaps (in max|logit|). The bounds of
# tests/backends/cuda/qgemv_dp4a_models_test.cpp come from these numbers.
#   python3 bench/dp4a_logit_shift.py [--model DIR] [--gguf FILE] [--blocks N] [--tokens N]
# Needs torch, transformers and gguf (PyPI).
import argparse, json, torch
from dp4a_emulation import q4, xint8
from transformers import AutoModelForCausalLM
ap = argparse.ArgumentParser()
ap.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
ap.add_argument("--gguf", default="SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--blocks", type=int, default=0)
ap.add_argument("--tokens", type=int, default=32)
args = ap.parse_args()
model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=args.gguf, torch_dtype=torch.float32).eval()
if args.blocks:
    model.model.layers = model.model.layers[:args.blocks]
    model.config.num_hidden_layers = args.blocks
model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.data.clone())  # untie, as kiln quantizes it
rounding = [False]
for mod in model.modules():
    if isinstance(mod, torch.nn.Linear):
        mod.weight.data = q4(mod.weight.data)
        mod.register_forward_pre_hook(lambda m, a: (xint8(a[0]),) if rounding[0] else None)
ref = json.load(open("tests/fixtures/models/smollm2/reference.json"))
for i, p in enumerate(ref["prompts"]):
    ids = list(p["input_ids"])
    with torch.no_grad():
        for _ in range(args.tokens):  # greedy with exact inputs
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        n0 = len(p["input_ids"])
        rounding[0] = False
        exact = model(torch.tensor([ids])).logits[0, n0 - 1:-1]
        rounding[0] = True
        rounded = model(torch.tensor([ids])).logits[0, n0 - 1:-1]
        rounding[0] = False
    rel = ((rounded - exact).abs().amax(-1) / exact.abs().amax(-1))
    ae, ar = exact.argmax(-1), rounded.argmax(-1)
    gaps = [float((exact[s, ae[s]] - exact[s, ar[s]]) / exact[s].abs().max()) for s in range(len(ae)) if ae[s] != ar[s]]
    print(f"prompt {i} blocks {args.blocks or 'all'}: worst max|dlogit|/max|logit| {float(rel.max()):.4f} "
          f"(median {float(rel.median()):.4f}), argmax differs at {len(gaps)} of {len(ae)} steps, gaps {[round(g, 4) for g in gaps]}")
