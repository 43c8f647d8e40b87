#!/usr/bin/env python3
"""HuggingFace transformers baseline for `kiln bench --backend cuda`, on the same GPU.

Measures the run's ceilings first (device-to-device copy GB/s counting read + write, and
an 8192^3 bf16 GEMM in TFLOP/s on random data), then builds the architecture of a
config.json with random weights in bf16 and measures what kiln bench measures: prefill
of a random prompt (pp) and greedy decode steps with the KV cache (tg, eager mode),
median of N repeats after a warm-up, synchronizing before every host clock read.

Encoder configs (BERT family) measure one forward of `batch` sequences of prompt_len
random tokens instead, as `kiln bench` does for encoders: eager, torch.compile's default
mode and its "reduce-overhead" mode (CUDA graphs), each timed on the host with a
synchronize after the forward (the hidden states stay on the GPU; kiln copies its
output to the host, so this favours the baseline slightly).

--compiled measures HF's fastest decode mode instead: `generate` with the static KV
cache and the forward compiled by torch.compile (mode "reduce-overhead": CUDA graphs),
the recipe of HF's "static cache and torch.compile" guide. A decode step is then
(t(generate 1 + n tokens) - t(generate 1 token)) / n, after warm-up runs that compile.
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def ceilings():
    n = 1 << 30  # 1 GiB
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ts = []
    for _ in range(10):
        ev[0].record(); b.copy_(a); ev[1].record(); torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]) / 1e3)
    copy_gbs = 2 * n / statistics.median(ts) / 1e9
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        ev[0].record(); x @ y; ev[1].record(); torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]) / 1e3)
    tflops = 2 * m ** 3 / statistics.median(ts) / 1e12
    return copy_gbs, tflops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("-p", "--prompt-len", type=int, default=128)
    ap.add_argument("-n", "--gen-len", type=int, default=32)
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ceilings", action="store_true")
    ap.add_argument("--compiled", action="store_true", help="static cache + torch.compile (reduce-overhead)")
    ap.add_argument("-b", "--batch", type=int, default=1, help="sequences per forward (decoders: decoded together)")
    a = ap.parse_args()
    if a.ceilings:
        copy_gbs, tflops = ceilings()
        print(f"ceilings ({torch.cuda.get_device_name()}): d2d copy {copy_gbs:.0f} GB/s, "
              f"bf16 GEMM 8192^3 {tflops:.0f} TFLOP/s")
    dtype = getattr(torch, a.dtype)
    cfg = transformers.AutoConfig.for_model(**json.load(open(a.config)))
    torch.manual_seed(0)
    if not getattr(cfg, "is_decoder", False) and cfg.model_type in ("bert", "roberta", "distilbert", "xlm-roberta"):
        return encoder_forward(cfg, dtype, a)
    with torch.device("cuda"):  # random init on the GPU: seconds, not minutes, for 1B+ shapes
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype,
                                                              attn_implementation="sdpa").eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt_len), device="cuda")
    if a.compiled:
        return compiled_decode(model, ids, a, params)
    pp, tg = [], []
    with torch.inference_mode():
        for r in range(a.repeats + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(a.gen_len):
                s0 = time.perf_counter()
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                nxt.cpu()  # the sampled id reaches the host, as in kiln
                steps.append(time.perf_counter() - s0)
            if r == 0:
                continue
            pp.append(t1 - t0)
            tg.append(statistics.median(steps))
    pp_s, tg_s = statistics.median(pp), statistics.median(tg)
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, eager/sdpa "
          f"{a.dtype}, {params / 1e6:.1f} M params, {torch.cuda.get_device_name()}")
    print("| test | batch | tokens/s | ms | spread (min-max ms) |")
    print("|---|---|---|---|---|")
    print(f"| pp{a.prompt_len} | {a.batch} | {a.batch * a.prompt_len / pp_s:.1f} | {pp_s * 1e3:.2f} | "
          f"{min(pp) * 1e3:.2f}-{max(pp) * 1e3:.2f} |")
    print(f"| tg{a.gen_len} | {a.batch} | {a.batch / tg_s:.1f} | {tg_s * 1e3:.2f} /token | "
          f"{min(tg) * 1e3:.2f}-{max(tg) * 1e3:.2f} |")


def encoder_forward(cfg, dtype, a):
    with torch.device("cuda"):
        model = transformers.AutoModel.from_config(cfg, torch_dtype=dtype, attn_implementation="sdpa").eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(1000, cfg.vocab_size, (a.batch, a.prompt_len), device="cuda")
    mask = torch.ones_like(ids)
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, {a.dtype}, "
          f"{params / 1e6:.1f} M params, {torch.cuda.get_device_name()}")
    print("| mode | batch | seq len | ms per forward | spread (min-max ms) | sequences/s |")
    print("|---|---|---|---|---|---|")
    modes = [("eager", None), ("torch.compile default", "default"),
             ("torch.compile reduce-overhead", "reduce-overhead")]
    for name, mode in modes:
        fwd = model if mode is None else torch.compile(model, mode=mode)
        with torch.inference_mode():
            for _ in range(5):  # compiles (and captures) in the first calls
                fwd(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize()
            ts = []
            for _ in range(max(a.repeats, 20)):
                t0 = time.perf_counter()
                fwd(input_ids=ids, attention_mask=mask)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
        s = statistics.median(ts)
        print(f"| {name} | {a.batch} | {a.prompt_len} | {s * 1e3:.3f} | {min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f} | "
              f"{a.batch / s:.1f} |", flush=True)


def compiled_decode(model, ids, a, params):
    model.generation_config.cache_implementation = "static"
    # Recent transformers compile the forward themselves when generating with a static
    # cache (generation_config.compile_config, CUDA graphs included); older ones need
    # the manual torch.compile of HF's guide.
    auto = hasattr(model.generation_config, "compile_config")
    if not auto:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    mask = torch.ones_like(ids)

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.no_grad():
        t_c = time.perf_counter()
        for _ in range(3):  # compiles prefill and decode graphs
            gen(1 + a.gen_len)
            gen(1)
        compile_s = time.perf_counter() - t_c
        one = [gen(1) for _ in range(a.repeats)]
        full = [gen(1 + a.gen_len) for _ in range(a.repeats)]
    tg_s = (statistics.median(full) - statistics.median(one)) / a.gen_len
    print(f"baseline: torch {torch.__version__} + transformers {transformers.__version__}, static cache + "
          f"torch.compile ({'generate auto-compile' if auto else 'manual, reduce-overhead'}) {a.dtype}, {params / 1e6:.1f} M params, {torch.cuda.get_device_name()}, "
          f"warm-up/compile {compile_s:.1f} s")
    print("| test | batch | tokens/s | ms |")
    print("|---|---|---|---|")
    print(f"| tg{a.gen_len} (compiled) | {a.batch} | {a.batch / tg_s:.1f} | {tg_s * 1e3:.3f} /token |")


if __name__ == "__main__":
    main()
