#!/usr/bin/env python3
"""HuggingFace transformers' batched `generate` on the GPU: the baseline for
`kiln serve bench` at a given concurrency. A config.json's architecture with random bf16
weights; B prompts of random ids, all of the same length, greedy, exactly N new tokens
(min_new_tokens = max_new_tokens, like ignore_eos); reports output tokens/s =
B * N / wall time (median of R runs after a warm-up). Static batching: every sequence
waits for the batch, which is what in-flight batching is measured against.
  serve_hf_baseline.py --config CONFIG -b 1 16 64 256 -p 128 -n 128
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("-b", "--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("-p", "--prompt-len", type=int, default=128)
    ap.add_argument("-n", "--gen-len", type=int, default=128)
    ap.add_argument("-r", "--repeats", type=int, default=2)
    a = ap.parse_args()
    cfg = transformers.AutoConfig.for_model(**json.load(open(a.config)))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16,
                                                              attn_implementation="sdpa").eval()
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, generate "
          f"(eager, sdpa, bf16, greedy), {torch.cuda.get_device_name()}, prompt {a.prompt_len}, "
          f"{a.gen_len} new tokens")
    print("| batch | output tok/s | s per batch | spread (s) |")
    print("|---|---|---|---|")
    for b in a.batch:
        ids = torch.randint(10, cfg.vocab_size, (b, a.prompt_len), device="cuda")
        mask = torch.ones_like(ids)
        times = []
        with torch.inference_mode():
            for r in range(a.repeats + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(ids, attention_mask=mask, max_new_tokens=a.gen_len,
                                     min_new_tokens=a.gen_len, do_sample=False, pad_token_id=0)
                torch.cuda.synchronize()
                if r:
                    times.append(time.perf_counter() - t0)
        assert out.shape[1] == a.prompt_len + a.gen_len
        t = statistics.median(times)
        print(f"| {b} | {b * a.gen_len / t:.1f} | {t:.2f} | {min(times):.2f}-{max(times):.2f} |", flush=True)


if __name__ == "__main__":
    main()
