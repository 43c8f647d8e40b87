#!/usr/bin/env python3
"""HF transformers baseline for embedding serving: the same random token-id inputs that
`kiln serve bench --endpoint embeddings` sends (lengths uniform in [lo, hi]), embedded
offline in batches of B padded to the batch's longest input, with mean pooling over the
mask and L2 normalization, the embeddings copied to the host: what a sentence-transformers
style server does per batch, without its HTTP, queueing or tokenization, so an upper
bound for an HF-based server at that batch size.
  bench/embed_hf_baseline.py --config bench/configs/bert-base.json --lo 16 --hi 128 -b 1 16 64 256
"""
import argparse
import json
import random
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--lo", type=int, default=16)
    ap.add_argument("--hi", type=int, default=128)
    ap.add_argument("-n", "--sequences", type=int, default=2048)
    ap.add_argument("-b", "--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    cfg = transformers.AutoConfig.for_model(**json.load(open(a.config)))
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModel.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa").eval()
    rng = random.Random(0)
    seqs = [[rng.randrange(10, cfg.vocab_size) for _ in range(rng.randint(a.lo, a.hi))] for _ in range(a.sequences)]
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, eager/sdpa {a.dtype}, "
          f"{torch.cuda.get_device_name()}; {a.sequences} inputs of {a.lo}-{a.hi} tokens, batches padded to their longest")
    print("| batch | sequences/s | input tok/s (unpadded) | ms per batch | spread (sequences/s) |")
    print("|---|---|---|---|---|")
    tokens = sum(len(s) for s in seqs)

    def run(b):
        with torch.inference_mode():
            for i in range(0, len(seqs), b):
                chunk = seqs[i:i + b]
                n = max(len(s) for s in chunk)
                ids = torch.zeros((len(chunk), n), dtype=torch.long)
                mask = torch.zeros((len(chunk), n), dtype=torch.long)
                for r, s in enumerate(chunk):
                    ids[r, :len(s)] = torch.tensor(s)
                    mask[r, :len(s)] = 1
                ids, mask = ids.cuda(non_blocking=True), mask.cuda(non_blocking=True)
                h = model(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(h.dtype)
                e = (h * m).sum(1) / m.sum(1)
                e = torch.nn.functional.normalize(e.float(), dim=-1)
                e.cpu()

    for b in a.batch:
        run(b)  # warm-up
        rates = []
        for _ in range(a.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(b)
            torch.cuda.synchronize()
            rates.append(len(seqs) / (time.perf_counter() - t0))
        r = statistics.median(rates)
        print(f"| {b} | {r:.0f} | {r * tokens / len(seqs):.0f} | {b / r * 1e3:.2f} | {min(rates):.0f}-{max(rates):.0f} |")


if __name__ == "__main__":
    main()
