#!/usr/bin/env python3
"""PyTorch + HuggingFace transformers baseline for `kiln bench` on the CPU.

Builds the same architecture from the same config.json with random weights (float32),
and measures what kiln bench measures: prefill of a random prompt (pp) and greedy
decode steps with the KV cache (tg), median of N repeats after a warm-up, on the same
number of threads. Prints a markdown table with the same columns.
"""
import argparse
import os
import warnings
import json
import statistics
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("-p", "--prompt-len", type=int, default=128)
    ap.add_argument("-n", "--gen-len", type=int, default=32)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg_dict = json.load(open(a.config))
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                          attn_implementation="sdpa").eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size, (1, a.prompt_len))
    pp, tg = [], []
    with torch.inference_mode():
        for r in range(a.repeats + 1):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(a.gen_len):
                s0 = time.perf_counter()
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                steps.append(time.perf_counter() - s0)
            if r == 0:
                continue
            pp.append(t1 - t0)
            tg.append(statistics.median(steps))
    pp_s, tg_s = statistics.median(pp), statistics.median(tg)
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, "
          f"eager/sdpa f32, {params / 1e6:.1f} M params, {torch.get_num_threads()} threads")
    print("| test | batch | tokens/s | ms | spread (min-max ms) |")
    print("|---|---|---|---|---|")
    print(f"| pp{a.prompt_len} | 1 | {a.prompt_len / pp_s:.1f} | {pp_s * 1e3:.1f} | "
          f"{min(pp) * 1e3:.1f}-{max(pp) * 1e3:.1f} |")
    print(f"| tg{a.gen_len} | 1 | {1 / tg_s:.1f} | {tg_s * 1e3:.2f} /token | "
          f"{min(tg) * 1e3:.2f}-{max(tg) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
