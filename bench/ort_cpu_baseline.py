#!/usr/bin/env python3
"""ONNX Runtime baseline for `kiln bench` on the CPU, encoders (BERT family).

Builds the architecture of a config.json (bench/configs/bert-base.json) with random weights
in float32 (HuggingFace transformers, seed 0), exports it to ONNX (torch.onnx.export,
opset 17, dynamic batch and sequence), and times what `kiln bench` times for an encoder:
one forward of `batch` random sequences of `seq` tokens (all attended), median of N
repeats after a warm-up, on the same number of threads. Two ONNX Runtime sessions, as a
user would run them: the exported graph at ORT_ENABLE_ALL, and the graph after
onnxruntime.transformers' BERT optimizer (fused Attention, SkipLayerNorm, BiasGelu).
With --int8, also that graph after onnxruntime.quantization.quantize_dynamic (int8 weights
per channel, activations per tensor at run time), next to `kiln bench --quant w8a8`.
Prints a markdown table; `kiln bench` prints the same ms column.

  python3 bench/ort_cpu_baseline.py --config bench/configs/bert-base.json -b 1 -p 128 --threads 2
  kiln --threads 2 bench --random-weights bench/configs/bert-base.json -b 1 -p 128 -r 20

Needs torch, transformers, onnx and onnxruntime (pip); not run by the tests.
"""
import argparse
import json
import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402


def export(cfg, path):
    torch.manual_seed(0)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()

    class Wrap(torch.nn.Module):  # keyword arguments: forward's positional order changes
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    ids = torch.zeros(1, 8, dtype=torch.long)
    with torch.inference_mode():
        torch.onnx.export(
            Wrap(model), (ids, torch.ones_like(ids), torch.zeros_like(ids)), path,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in ["input_ids", "attention_mask", "token_type_ids",
                                                             "last_hidden_state"]},
            opset_version=17, dynamo=False)
    return sum(p.numel() for p in model.parameters())


def session(path, threads):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def time_forward(sess, feeds, repeats):
    sess.run(None, feeds)  # warm-up
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), min(ms), max(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("-b", "--batch", type=int, default=1)
    ap.add_argument("-p", "--seq", type=int, default=128)
    ap.add_argument("-r", "--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--int8", action="store_true",
                    help="also time the graph after onnxruntime.quantization.quantize_dynamic (int8)")
    a = ap.parse_args()
    cfg = transformers.BertConfig(**{k: v for k, v in json.load(open(a.config)).items() if k != "model_type"})
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (a.batch, a.seq), dtype=np.int64),
             "attention_mask": np.ones((a.batch, a.seq), dtype=np.int64),
             "token_type_ids": np.zeros((a.batch, a.seq), dtype=np.int64)}
    with tempfile.TemporaryDirectory() as d:
        plain = os.path.join(d, "model.onnx")
        params = export(cfg, plain)
        rows = [("ORT_ENABLE_ALL", time_forward(session(plain, a.threads), feeds, a.repeats))]
        try:
            from onnxruntime.transformers import optimizer
            fused = os.path.join(d, "model_fused.onnx")
            opt = optimizer.optimize_model(plain, model_type="bert", num_heads=cfg.num_attention_heads,
                                           hidden_size=cfg.hidden_size)
            opt.save_model_to_file(fused)
            rows.append(("transformers optimizer (fused)", time_forward(session(fused, a.threads), feeds, a.repeats)))
        except Exception as e:  # an optimizer that does not run is reported, not fatal
            print(f"onnxruntime.transformers optimizer failed: {e}")
            fused = plain
        if a.int8:
            # ORT's int8 path for BERT on a CPU: the (optimized) graph through quantize_dynamic -
            # int8 weights per channel, activations quantized per tensor at run time.
            from onnxruntime.quantization import QuantType, quantize_dynamic
            q8 = os.path.join(d, "model_int8.onnx")
            import onnx
            quantize_dynamic(fused, q8, weight_type=QuantType.QInt8, per_channel=True,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
            rows.append(("quantize_dynamic int8 (per-channel weights)",
                         time_forward(session(q8, a.threads), feeds, a.repeats)))
    print(f"baseline: onnxruntime {ort.__version__}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {params / 1e6:.1f} M parameters, f32, threads "
          f"{a.threads or 'default'}")
    print("| session | batch x seq | ms per forward | range | seq/s |")
    print("|---|---|---|---|---|")
    for name, (med, lo, hi) in rows:
        print(f"| {name} | {a.batch} x {a.seq} | {med:.2f} | {lo:.2f}-{hi:.2f} | {a.batch / med * 1e3:.1f} |")


if __name__ == "__main__":
    main()
