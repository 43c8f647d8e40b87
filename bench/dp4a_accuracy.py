#!/usr/bin/env python3
# What the CUDA dp4a q4 GEMV's activation rounding (the default q4/q8 decode GEMV: each Linear
# input rounded to int8 per group of 32 with d = max|x| / 127) costs in accuracy, emulated in f32
# with PyTorch on the project's real decoder (SmolLM2-135M-Instruct, its Q4_1 GGUF as
# transformers dequantizes it): perplexity, mean KL and top-1 agreement against f32 for kiln's
# q4 grid on every Linear (groups of 32, f16 scale and min, the LM head untied from the
# embedding as kiln quantizes it) with exact inputs and with int8-rounded inputs.
#   python3 bench/dp4a_accuracy.py [--model DIR] [--gguf FILE] [--text FILE] [--max-tokens N]
# Needs torch, transformers and gguf (PyPI).
import argparse, torch
from dp4a_emulation import q4, xint8
from transformers import AutoModelForCausalLM, AutoTokenizer
ap = argparse.ArgumentParser()
ap.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
ap.add_argument("--gguf", default="SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
ap.add_argument("--max-tokens", type=int, default=1500)
args = ap.parse_args()
d, f = args.model, args.gguf
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
ids = tok(open(args.text).read(), return_tensors="pt").input_ids[:, :args.max_tokens]
out = {}
for mode in ("f32", "q4", "q4+int8x"):
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    if mode != "f32":
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.data.clone())  # untie from the embedding
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.data = q4(mod.weight.data)
                if mode == "q4+int8x":
                    mod.register_forward_pre_hook(lambda m, a: (xint8(a[0]),))
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    lp = torch.log_softmax(logits.double(), -1)
    nll = -lp.gather(1, ids[0, 1:, None]).mean()
    out[mode] = (float(torch.exp(nll)), lp)
    print(mode, "ppl", round(out[mode][0], 4), flush=True)
for mode in ("q4", "q4+int8x"):
    p, lq = out[mode]; lf = out["f32"][1]
    kl = (lf.exp() * (lf - lq)).sum(-1).mean()
    top1 = (lf.argmax(-1) == lq.argmax(-1)).double().mean()
    print(f"{mode}: ppl {p:.4f} ({100*(p/out['f32'][0]-1):+.2f}% vs f32), mean KL {float(kl):.4f}, top-1 agree {100*float(top1):.1f}%")
